#include "osprey/npy.h"

#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>

namespace osprey {

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicSize = 6;
constexpr size_t kMaxRank = 64;  // numpy's own limit (NPY_MAXDIMS)

[[noreturn]] void Bad(const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, ".npy data is malformed: " + what);
}

// One value of the header dict: a string, a bool or a tuple of ints.
struct HeaderValue {
  enum class Kind { kString, kBool, kTuple } kind = Kind::kString;
  std::string s;
  bool b = false;
  std::vector<int64_t> ints;
};

// Parses the subset of Python literal syntax numpy writes: {'key': value, ...} with string, bool and int-tuple values.
class HeaderParser {
 public:
  explicit HeaderParser(std::string_view text) : text_(text) {}

  std::map<std::string, HeaderValue> ParseDict() {
    std::map<std::string, HeaderValue> dict;
    SkipSpace();
    Expect('{');
    for (;;) {
      SkipSpace();
      if (Peek() == '}') {
        ++pos_;
        break;
      }
      std::string key = ParseString();
      SkipSpace();
      Expect(':');
      SkipSpace();
      HeaderValue value = ParseValue();
      if (!dict.emplace(key, std::move(value)).second) Bad("header repeats key '" + key + "'");
      SkipSpace();
      if (Peek() == ',') {
        ++pos_;
        continue;
      }
      SkipSpace();
      if (Peek() != '}') Bad("header dict: expected ',' or '}' at offset " + std::to_string(pos_));
    }
    SkipSpace();
    if (pos_ != text_.size()) Bad("header has trailing characters after the dict");
    return dict;
  }

 private:
  char Peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  void SkipSpace() {
    while (pos_ < text_.size() &&
           (text_[pos_] == ' ' || text_[pos_] == '\n' || text_[pos_] == '\t' || text_[pos_] == '\r'))
      ++pos_;
  }
  void Expect(char c) {
    if (Peek() != c) Bad(std::string("header: expected '") + c + "' at offset " + std::to_string(pos_));
    ++pos_;
  }
  bool Consume(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }
  std::string ParseString() {
    char quote = Peek();
    if (quote != '\'' && quote != '"') Bad("header: expected a quoted string at offset " + std::to_string(pos_));
    ++pos_;
    size_t end = text_.find(quote, pos_);
    if (end == std::string_view::npos) Bad("header: unterminated string");
    std::string s(text_.substr(pos_, end - pos_));
    if (s.find('\\') != std::string::npos) Bad("header: escapes in strings are not expected");
    pos_ = end + 1;
    return s;
  }
  int64_t ParseInt() {
    if (Peek() < '0' || Peek() > '9') Bad("header: expected a non-negative integer at offset " + std::to_string(pos_));
    int64_t v = 0;
    while (Peek() >= '0' && Peek() <= '9') {
      if (v > ((int64_t{1} << 62) - 9) / 10) Bad("header: shape dim is too large");
      v = v * 10 + (Peek() - '0');
      ++pos_;
    }
    if (Peek() == 'L') ++pos_;  // Python 2 longs
    return v;
  }
  HeaderValue ParseValue() {
    HeaderValue v;
    char c = Peek();
    if (c == '\'' || c == '"') {
      v.kind = HeaderValue::Kind::kString;
      v.s = ParseString();
    } else if (Consume("True")) {
      v.kind = HeaderValue::Kind::kBool;
      v.b = true;
    } else if (Consume("False")) {
      v.kind = HeaderValue::Kind::kBool;
      v.b = false;
    } else if (c == '(') {
      ++pos_;
      v.kind = HeaderValue::Kind::kTuple;
      bool trailing_comma = false;
      for (;;) {
        SkipSpace();
        if (Peek() == ')') {
          ++pos_;
          break;
        }
        if (v.ints.size() >= kMaxRank) Bad("header: shape has more than 64 dims");
        v.ints.push_back(ParseInt());
        trailing_comma = false;
        SkipSpace();
        if (Peek() == ',') {
          ++pos_;
          trailing_comma = true;
        } else if (Peek() != ')') {
          Bad("header: expected ',' or ')' in shape at offset " + std::to_string(pos_));
        }
      }
      // "(3)" is an int in Python, not a tuple; numpy always writes "(3,)".
      if (v.ints.size() == 1 && !trailing_comma) Bad("header: shape '(n)' is not a tuple; expected '(n,)'");
    } else {
      Bad("header: unexpected value at offset " + std::to_string(pos_));
    }
    return v;
  }

  std::string_view text_;
  size_t pos_ = 0;
};

struct DescrInfo {
  DType dtype;
  size_t item_size;
  bool is_f64 = false;
};

DescrInfo ParseDescr(const std::string& descr) {
  if (descr.size() < 2) throw Error(ErrorCode::kUnsupported, ".npy dtype '" + descr + "' is not supported");
  char order = descr[0];
  std::string code = descr.substr(1);
  if (order == '>' && code != "i1" && code != "u1" && code != "b1")
    throw Error(ErrorCode::kUnsupported, ".npy dtype '" + descr + "' is big-endian; only little-endian is supported");
  bool little_ok = order == '<' || order == '=' || order == '|';
  bool one_byte_ok = little_ok || order == '>';
  if (code == "f4" && little_ok) return {DType::kF32, 4};
  if (code == "f2" && little_ok) return {DType::kF16, 2};
  if (code == "i4" && little_ok) return {DType::kI32, 4};
  if (code == "i8" && little_ok) return {DType::kI64, 8};
  if (code == "f8" && little_ok) return {DType::kF32, 8, true};
  if (code == "i1" && one_byte_ok) return {DType::kI8, 1};
  if (code == "u1" && one_byte_ok) return {DType::kU8, 1};
  if (code == "b1" && one_byte_ok) return {DType::kBool, 1};
  throw Error(ErrorCode::kUnsupported,
              ".npy dtype '" + descr + "' is not supported (supported: <f4 <f2 <f8 |i1 |u1 <i4 <i8 |b1)");
}

const char* DescrOf(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "<f4";
    case DType::kF16:
      return "<f2";
    case DType::kI8:
      return "|i1";
    case DType::kU8:
      return "|u1";
    case DType::kI32:
      return "<i4";
    case DType::kI64:
      return "<i8";
    case DType::kBool:
      return "|b1";
    case DType::kBF16:
      break;
  }
  throw Error(ErrorCode::kUnsupported,
              std::string(".npy has no ") + DTypeName(dtype) + " dtype; convert the tensor to float32 first");
}

uint32_t ReadLE(const unsigned char* p, int bytes) {
  uint32_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// A tensor whose elements were read in Fortran order (first index fastest, as np.save writes a transposed view or an
// np.asfortranarray) -> the same array in C order.
Tensor FromFortranOrder(const Tensor& stored) {
  const Shape& shape = stored.shape();
  const int rank = static_cast<int>(shape.size());
  const size_t item = DTypeSize(stored.dtype());
  std::vector<int64_t> stride(rank, 1);  // of each index in the stored (Fortran) layout
  for (int k = 1; k < rank; ++k) stride[k] = stride[k - 1] * shape[k - 1];
  Tensor out(stored.dtype(), shape);
  const char* from = static_cast<const char*>(stored.raw());
  char* to = static_cast<char*>(out.raw());
  std::vector<int64_t> index(rank, 0);
  int64_t offset = 0;
  for (int64_t i = 0; i < stored.numel(); ++i) {
    std::memcpy(to + i * item, from + offset * item, item);
    for (int k = rank - 1; k >= 0; --k) {  // next C-order index, the stored offset kept alongside
      if (++index[k] < shape[k]) {
        offset += stride[k];
        break;
      }
      offset -= (shape[k] - 1) * stride[k];
      index[k] = 0;
    }
  }
  return out;
}

}  // namespace

Tensor ParseNpy(const void* data, size_t size) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  if (size < kMagicSize + 2 || std::memcmp(bytes, kMagic, kMagicSize) != 0)
    Bad("missing the \\x93NUMPY magic (not a .npy file)");
  int major = bytes[6], minor = bytes[7];
  if (minor != 0 || major < 1 || major > 3)
    throw Error(ErrorCode::kUnsupported, ".npy format version " + std::to_string(major) + "." + std::to_string(minor) +
                                             " is not supported (1.0, 2.0, 3.0 are)");
  size_t len_bytes = major == 1 ? 2 : 4;
  size_t prefix = kMagicSize + 2 + len_bytes;
  if (size < prefix) Bad("truncated before the header length");
  size_t header_len = ReadLE(bytes + kMagicSize + 2, static_cast<int>(len_bytes));
  if (header_len > size - prefix)
    Bad("header length " + std::to_string(header_len) + " exceeds the " + std::to_string(size - prefix) +
        " bytes that follow");
  std::string_view header(reinterpret_cast<const char*>(bytes + prefix), header_len);
  auto dict = HeaderParser(header).ParseDict();
  if (dict.size() != 3 || !dict.count("descr") || !dict.count("fortran_order") || !dict.count("shape"))
    Bad("header must have exactly the keys 'descr', 'fortran_order' and 'shape'");
  const HeaderValue& descr = dict["descr"];
  const HeaderValue& fortran = dict["fortran_order"];
  const HeaderValue& shape_value = dict["shape"];
  if (descr.kind != HeaderValue::Kind::kString) Bad("header 'descr' must be a string (structured dtypes unsupported)");
  if (fortran.kind != HeaderValue::Kind::kBool) Bad("header 'fortran_order' must be True or False");
  if (shape_value.kind != HeaderValue::Kind::kTuple) Bad("header 'shape' must be a tuple of ints");
  DescrInfo info = ParseDescr(descr.s);
  Shape shape(shape_value.ints.begin(), shape_value.ints.end());
  int64_t numel = NumElements(shape);
  size_t offset = prefix + header_len;
  size_t available = size - offset;
  const int64_t needed = CheckedMul(numel, static_cast<int64_t>(info.item_size), ".npy data bytes");
  if (static_cast<uint64_t>(needed) != available)
    Bad("shape " + ShapeToString(shape) + " of '" + descr.s + "' needs " + std::to_string(needed) +
        " data bytes, found " + std::to_string(available));
  Tensor t(info.dtype, shape);
  const unsigned char* src = bytes + offset;
  if (info.is_f64) {
    float* dst = t.data<float>();
    for (int64_t i = 0; i < numel; ++i) {
      double d;
      std::memcpy(&d, src + i * 8, 8);
      dst[i] = static_cast<float>(d);
    }
  } else if (info.dtype == DType::kBool) {
    bool* dst = t.data<bool>();
    for (int64_t i = 0; i < numel; ++i) dst[i] = src[i] != 0;
  } else if (numel > 0) {
    std::memcpy(t.raw(), src, t.nbytes());
  }
  if (fortran.b && shape.size() > 1 && numel > 1) return FromFortranOrder(t);
  return t;
}

Tensor ReadNpy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorCode::kNotFound, "cannot open .npy file '" + path + "'");
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw Error(ErrorCode::kUnavailable, "error reading .npy file '" + path + "'");
  try {
    return ParseNpy(bytes.data(), bytes.size());
  } catch (const Error& e) {
    throw Error(e.code(), "'" + path + "': " + e.what());
  }
}

std::string SerializeNpy(const Tensor& tensor) {
  const char* descr = DescrOf(tensor.dtype());
  std::string dict = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < tensor.shape().size(); ++i) {
    dict += std::to_string(tensor.shape()[i]);
    dict += tensor.shape().size() == 1 ? "," : (i + 1 < tensor.shape().size() ? ", " : "");
  }
  dict += "), }";
  // numpy pads the header with spaces and a final newline so the data starts on a 64-byte boundary.
  auto padded_header_len = [&](size_t prefix) { return (prefix + dict.size() + 1 + 63) / 64 * 64 - prefix; };
  int major = 1;
  size_t prefix = kMagicSize + 2 + 2;
  if (padded_header_len(prefix) > 65535) {
    major = 2;
    prefix = kMagicSize + 2 + 4;
  }
  dict.append(padded_header_len(prefix) - dict.size() - 1, ' ');
  dict += '\n';
  size_t header_len = dict.size();
  std::string out(kMagic, kMagicSize);
  out += static_cast<char>(major);
  out += '\0';
  for (size_t i = 0; i < prefix - kMagicSize - 2; ++i) out += static_cast<char>((header_len >> (8 * i)) & 0xff);
  out += dict;
  if (tensor.dtype() == DType::kBool) {
    const bool* p = tensor.data<bool>();
    for (int64_t i = 0; i < tensor.numel(); ++i) out += static_cast<char>(p[i] ? 1 : 0);
  } else if (tensor.nbytes()) {
    out.append(static_cast<const char*>(tensor.raw()), tensor.nbytes());
  }
  return out;
}

void WriteNpy(const std::string& path, const Tensor& tensor) {
  std::string bytes = SerializeNpy(tensor);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw Error(ErrorCode::kUnavailable, "cannot open '" + path + "' for writing");
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) throw Error(ErrorCode::kUnavailable, "error writing '" + path + "'");
}

}  // namespace osprey
