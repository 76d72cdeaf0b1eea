#include "osprey/tensor.h"

#include <cmath>
#include <sstream>

namespace osprey {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kI8: return 1;
    case DType::kU8: return 1;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
    case DType::kBool: return 1;
  }
  return 1;
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "float32";
    case DType::kF16: return "float16";
    case DType::kBF16: return "bfloat16";
    case DType::kI8: return "int8";
    case DType::kU8: return "uint8";
    case DType::kI32: return "int32";
    case DType::kI64: return "int64";
    case DType::kBool: return "bool";
  }
  return "?";
}

float HalfToFloat(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ff;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t FloatToHalf(float value) {
  uint32_t x;
  std::memcpy(&x, &value, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0));
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow to inf
  if (absx < 0x38800000u) {  // subnormal or zero in half
    float f;
    std::memcpy(&f, &absx, 4);
    // Scale so the half subnormal unit (2^-24) becomes 1, then round to nearest even.
    float scaled = f * 16777216.0f;
    uint32_t m = static_cast<uint32_t>(std::nearbyint(scaled));
    return static_cast<uint16_t>(sign | m);
  }
  uint32_t exp = ((absx >> 23) - 127 + 15);
  uint32_t mant = absx & 0x7fffff;
  uint32_t half = (exp << 10) | (mant >> 13);
  uint32_t rest = mant & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (half & 1))) ++half;
  return static_cast<uint16_t>(sign | half);
}

uint16_t FloatToBFloat16(float value) {
  uint32_t x;
  std::memcpy(&x, &value, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40);  // quiet NaN
  uint32_t rounding = 0x7fff + ((x >> 16) & 1);
  return static_cast<uint16_t>((x + rounding) >> 16);
}

namespace {
[[noreturn]] void TooLarge(std::string_view what, const std::string& detail) {
  throw Error(ErrorCode::kInvalidArgument, std::string(what) + " " + detail + " is larger than osprey's limit of 2^48 (" +
                                               std::to_string(kMaxBytes) + ")");
}
}  // namespace

int64_t CheckedMul(int64_t a, int64_t b, std::string_view what) {
  if (a < 0 || b < 0)
    throw Error(ErrorCode::kInvalidArgument,
                std::string(what) + ": negative size (" + std::to_string(a) + " x " + std::to_string(b) + ")");
  if (a != 0 && b > kMaxBytes / a) TooLarge(what, std::to_string(a) + " x " + std::to_string(b));
  return a * b;
}

int64_t CheckedAdd(int64_t a, int64_t b, std::string_view what) {
  if (a < 0 || b < 0)
    throw Error(ErrorCode::kInvalidArgument,
                std::string(what) + ": negative size (" + std::to_string(a) + " + " + std::to_string(b) + ")");
  if (a > kMaxBytes - b) TooLarge(what, std::to_string(a) + " + " + std::to_string(b));
  return a + b;
}

int64_t NumElements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) throw Error(ErrorCode::kInvalidArgument, "shape " + ShapeToString(shape) + " has a negative dim");
    if (d != 0 && n > kMaxBytes / d)
      throw Error(ErrorCode::kInvalidArgument, "shape " + ShapeToString(shape) +
                                                   " has too many elements (osprey's limit is 2^48 bytes per tensor)");
    n *= d;
  }
  return n;
}

int64_t NumBytes(DType dtype, const Shape& shape) {
  const int64_t n = NumElements(shape);
  if (n > kMaxBytes / static_cast<int64_t>(DTypeSize(dtype)))
    throw Error(ErrorCode::kInvalidArgument, "shape " + ShapeToString(shape) + " of " + DTypeName(dtype) +
                                                 " is larger than osprey's limit of 2^48 bytes per tensor");
  return n * static_cast<int64_t>(DTypeSize(dtype));
}

std::string ShapeToString(const Shape& shape) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << ']';
  return os.str();
}

Tensor::Tensor(DType dtype, Shape shape, std::shared_ptr<MemoryAccount> account)
    : dtype_(dtype), shape_(std::move(shape)) {
  numel_ = NumBytes(dtype_, shape_) / static_cast<int64_t>(DTypeSize(dtype_));
  buffer_ = Allocator::Host().Allocate(nbytes(), std::move(account));
}

Tensor Tensor::Zeros(DType dtype, Shape shape, std::shared_ptr<MemoryAccount> account) {
  Tensor t(dtype, std::move(shape), std::move(account));
  if (t.nbytes()) std::memset(t.raw(), 0, t.nbytes());
  return t;
}

Tensor Tensor::View(DType dtype, Shape shape, std::shared_ptr<Buffer> buffer, size_t offset) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.numel_ = NumBytes(dtype, t.shape_) / static_cast<int64_t>(DTypeSize(dtype));
  OSPREY_CHECK(buffer != nullptr && offset <= buffer->size() && t.nbytes() <= buffer->size() - offset);
  t.buffer_ = std::move(buffer);
  t.offset_ = offset;
  return t;
}

Tensor Tensor::Reshaped(Shape shape) const {
  Tensor t = *this;
  int64_t n = NumElements(shape);
  if (n != numel_)
    throw Error(ErrorCode::kInvalidArgument,
                "cannot reshape " + ShapeToString(shape_) + " to " + ShapeToString(shape) + ": element counts differ");
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::Clone(std::shared_ptr<MemoryAccount> account) const {
  OSPREY_CHECK(!buffer_ || buffer_->device() == Device::kHost);  // device tensors are copied by their backend
  Tensor t(dtype_, shape_, std::move(account));
  if (nbytes()) std::memcpy(t.raw(), raw(), nbytes());
  return t;
}

double Tensor::GetAsDouble(int64_t i) const {
  OSPREY_CHECK(i >= 0 && i < numel_);
  switch (dtype_) {
    case DType::kF32: return data<float>()[i];
    case DType::kF16: return HalfToFloat(data<uint16_t>()[i]);
    case DType::kBF16: return BFloat16ToFloat(data<uint16_t>()[i]);
    case DType::kI8: return data<int8_t>()[i];
    case DType::kU8: return data<uint8_t>()[i];
    case DType::kI32: return data<int32_t>()[i];
    case DType::kI64: return static_cast<double>(data<int64_t>()[i]);
    case DType::kBool: return data<bool>()[i] ? 1.0 : 0.0;
  }
  return 0;
}

int64_t Tensor::GetAsInt(int64_t i) const {
  OSPREY_CHECK(i >= 0 && i < numel_);
  switch (dtype_) {
    case DType::kI64: return data<int64_t>()[i];
    case DType::kI32: return data<int32_t>()[i];
    case DType::kI8: return data<int8_t>()[i];
    case DType::kU8: return data<uint8_t>()[i];
    case DType::kBool: return data<bool>()[i] ? 1 : 0;
    default: return static_cast<int64_t>(GetAsDouble(i));
  }
}

std::vector<int64_t> Tensor::ToInt64Vector() const {
  std::vector<int64_t> v(numel_);
  for (int64_t i = 0; i < numel_; ++i) v[i] = GetAsInt(i);
  return v;
}

std::vector<float> Tensor::ToFloatVector() const {
  std::vector<float> v(numel_);
  for (int64_t i = 0; i < numel_; ++i) v[i] = static_cast<float>(GetAsDouble(i));
  return v;
}

namespace {
template <class Src, class Dst>
void CastLoop(const Src* s, Dst* d, int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i] = static_cast<Dst>(s[i]);
}

template <class Dst>
void CastFrom(const Tensor& src, Dst* d) {
  int64_t n = src.numel();
  switch (src.dtype()) {
    case DType::kF32: CastLoop(src.data<float>(), d, n); break;
    case DType::kI8: CastLoop(src.data<int8_t>(), d, n); break;
    case DType::kU8: CastLoop(src.data<uint8_t>(), d, n); break;
    case DType::kI32: CastLoop(src.data<int32_t>(), d, n); break;
    case DType::kI64: CastLoop(src.data<int64_t>(), d, n); break;
    case DType::kBool: CastLoop(src.data<bool>(), d, n); break;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) d[i] = static_cast<Dst>(HalfToFloat(src.data<uint16_t>()[i]));
      break;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) d[i] = static_cast<Dst>(BFloat16ToFloat(src.data<uint16_t>()[i]));
      break;
  }
}
}  // namespace

Tensor CastTensor(const Tensor& src, DType dtype) {
  Tensor out(dtype, src.shape());
  int64_t n = src.numel();
  switch (dtype) {
    case DType::kF32: CastFrom(src, out.data<float>()); break;
    case DType::kI8: CastFrom(src, out.data<int8_t>()); break;
    case DType::kU8: CastFrom(src, out.data<uint8_t>()); break;
    case DType::kI32: CastFrom(src, out.data<int32_t>()); break;
    case DType::kI64: CastFrom(src, out.data<int64_t>()); break;
    case DType::kBool:
      for (int64_t i = 0; i < n; ++i) out.data<bool>()[i] = src.GetAsDouble(i) != 0.0;
      break;
    case DType::kF16: {
      std::vector<float> f(n);
      CastFrom(src, f.data());
      for (int64_t i = 0; i < n; ++i) out.data<uint16_t>()[i] = FloatToHalf(f[i]);
      break;
    }
    case DType::kBF16: {
      std::vector<float> f(n);
      CastFrom(src, f.data());
      for (int64_t i = 0; i < n; ++i) out.data<uint16_t>()[i] = FloatToBFloat16(f[i]);
      break;
    }
  }
  return out;
}

}  // namespace osprey
