// Reference kernels of the data-movement and shape ops. Everything except the interpolating Resize/Upsample modes is
// dtype-agnostic: elements are moved as DTypeSize() bytes. Output shapes were computed (and validated) by the op
// schemas in src/ops/shape.cc; kernels re-derive only what they need to index.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "kernels/reference/dispatch.h"
#include "kernels/reference/reference.h"
#include "ops/onnx_resize.h"
#include "ops/op_registry.h"
#include "ops/pad.h"
#include "ops/slice.h"

namespace osprey {
namespace {

void CopyBytes(void* dst, const void* src, size_t n) {
  if (n) std::memcpy(dst, src, n);
}

const char* Bytes(const Tensor& t) { return static_cast<const char*>(t.raw()); }
char* Bytes(Tensor& t) { return static_cast<char*>(t.raw()); }

int64_t Product(const Shape& s, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t i = begin; i < end; ++i) p *= s[i];
  return p;
}

// Row-major element strides.
std::vector<int64_t> Strides(const Shape& s) {
  std::vector<int64_t> st(s.size(), 1);
  for (int64_t i = static_cast<int64_t>(s.size()) - 2; i >= 0; --i) st[i] = st[i + 1] * s[i + 1];
  return st;
}

[[noreturn]] void Internal(const Node& node, const std::string& what) {
  throw Error(ErrorCode::kInternal, node.Describe() + ": " + what);
}

void CheckOutput(const KernelContext& ctx, int i, const Shape& expected) {
  if (ctx.Out(i).shape() != expected)
    Internal(ctx.node, "output " + std::to_string(i) + " was allocated as " + ShapeToString(ctx.Out(i).shape()) +
                           ", the kernel computes " + ShapeToString(expected));
}

template <size_t kSize>
void CopyRowFixed(const char* src, int64_t stride, int64_t n, char* dst) {
  const int64_t step = stride * static_cast<int64_t>(kSize);
  for (int64_t i = 0; i < n; ++i) std::memcpy(dst + i * kSize, src + i * step, kSize);
}

// Copies n elements of `es` bytes from src (element stride `stride`, possibly 0 or negative) to contiguous dst.
void CopyRow(size_t es, const char* src, int64_t stride, int64_t n, char* dst) {
  if (n <= 0) return;
  if (stride == 1) {
    std::memcpy(dst, src, static_cast<size_t>(n) * es);
    return;
  }
  switch (es) {
    case 1:
      CopyRowFixed<1>(src, stride, n, dst);
      break;
    case 2:
      CopyRowFixed<2>(src, stride, n, dst);
      break;
    case 4:
      CopyRowFixed<4>(src, stride, n, dst);
      break;
    case 8:
      CopyRowFixed<8>(src, stride, n, dst);
      break;
    default:
      for (int64_t i = 0; i < n; ++i) std::memcpy(dst + i * es, src + i * stride * static_cast<int64_t>(es), es);
  }
}

// Gathers a tensor of `out_shape` into contiguous dst, reading element (i0, i1, ...) at src + sum(ik * strides[k]).
// Covers transpose, slice (negative strides), broadcast (stride 0), tile and depth/space rearrangements.
void CopyStrided(size_t es, const Shape& out_shape, const char* src, const std::vector<int64_t>& strides, char* dst) {
  int64_t total = Product(out_shape, 0, out_shape.size());
  if (total == 0) return;
  size_t rank = out_shape.size();
  if (rank == 0) {
    std::memcpy(dst, src, es);
    return;
  }
  int64_t inner = out_shape[rank - 1];
  int64_t rows = total / inner;
  std::vector<int64_t> idx(rank - 1, 0);
  int64_t offset = 0;
  const int64_t ies = static_cast<int64_t>(es);
  for (int64_t row = 0; row < rows; ++row) {
    CopyRow(es, src + offset * ies, strides[rank - 1], inner, dst);
    dst += inner * ies;
    for (int64_t d = static_cast<int64_t>(rank) - 2; d >= 0; --d) {
      offset += strides[d];
      if (++idx[d] < out_shape[d]) break;
      offset -= strides[d] * out_shape[d];
      idx[d] = 0;
    }
  }
}

// One element of `dtype` holding `value` (converted as a C cast would).
std::array<char, 8> ValuePattern(DType dtype, double value) {
  std::array<char, 8> p{};
  Tensor t = CastTensor(Tensor::Scalar<float>(static_cast<float>(value)), dtype);
  std::memcpy(p.data(), t.raw(), DTypeSize(dtype));
  return p;
}

void FillPattern(char* dst, int64_t count, const char* pattern, size_t es) {
  for (int64_t i = 0; i < count; ++i) std::memcpy(dst + i * es, pattern, es);
}

// ---------------------------------------------------------------------------------------------------------------
// Reshape, Flatten, Squeeze, Unsqueeze, Identity: same bytes, new shape.
void CopyKernel(KernelContext& ctx) {
  const Tensor& in = ctx.In(0);
  Tensor& out = ctx.Out(0);
  if (out.nbytes() != in.nbytes() || out.dtype() != in.dtype())
    Internal(ctx.node,
             "output " + ShapeToString(out.shape()) + " does not hold the input " + ShapeToString(in.shape()));
  if (out.raw() != in.raw()) CopyBytes(out.raw(), in.raw(), in.nbytes());
}

void DropoutKernel(KernelContext& ctx) {
  if (ctx.opset >= 12 && ctx.HasIn(2) && ctx.In(2).numel() > 0 && ctx.In(2).GetAsInt(0) != 0) {
    double ratio = ctx.HasIn(1) && ctx.In(1).numel() > 0 ? ctx.In(1).GetAsDouble(0) : 0.5;
    if (ratio != 0)
      throw Error(ErrorCode::kUnsupported,
                  ctx.node.Describe() + ": training_mode=true (random dropout) is not supported");
  }
  CopyKernel(ctx);
  if (ctx.outputs.size() > 1 && ctx.outputs[1] != nullptr) {
    Tensor& mask = *ctx.outputs[1];
    std::array<char, 8> one = ValuePattern(mask.dtype(), 1.0);
    FillPattern(Bytes(mask), mask.numel(), one.data(), DTypeSize(mask.dtype()));
  }
}

// ---------------------------------------------------------------------------------------------------------------
void ConcatKernel(KernelContext& ctx) {
  Tensor& out = ctx.Out(0);
  size_t es = DTypeSize(out.dtype());
  int64_t axis = NormalizeAxis(ctx.node.GetInt("axis", 0), out.rank(), ctx.node);
  int64_t outer = Product(out.shape(), 0, axis);
  std::vector<size_t> part_bytes;
  int64_t axis_total = 0;
  for (size_t i = 0; i < ctx.inputs.size(); ++i) {
    const Tensor& in = ctx.In(static_cast<int>(i));
    if (in.rank() != out.rank()) Internal(ctx.node, "input rank differs from the output rank");
    axis_total += in.dim(axis);
    part_bytes.push_back(static_cast<size_t>(Product(in.shape(), axis, in.shape().size())) * es);
  }
  if (axis_total != out.dim(axis)) Internal(ctx.node, "inputs do not add up to the output");
  char* dst = Bytes(out);
  for (int64_t o = 0; o < outer; ++o) {
    for (size_t i = 0; i < ctx.inputs.size(); ++i) {
      CopyBytes(dst, Bytes(ctx.In(static_cast<int>(i))) + o * part_bytes[i], part_bytes[i]);
      dst += part_bytes[i];
    }
  }
}

std::vector<int64_t> SplitSizes(const KernelContext& ctx, int64_t dim) {
  int64_t n = static_cast<int64_t>(ctx.outputs.size());
  std::vector<int64_t> split;
  if (ctx.opset < 13) {
    split = ctx.node.GetInts("split");
  } else if (ctx.HasIn(1) && ctx.In(1).numel() > 0) {
    split = ctx.In(1).ToInt64Vector();
  }
  if (split.empty()) {
    if (ctx.opset >= 18 && ctx.node.Has("num_outputs")) {
      int64_t chunk = (dim + n - 1) / n;
      split.assign(n, chunk);
      split.back() = dim - chunk * (n - 1);
    } else {
      split.assign(n, dim / n);
    }
  }
  int64_t sum = 0;
  for (int64_t s : split) sum += s;
  if (static_cast<int64_t>(split.size()) != n || sum != dim)
    throw Error(ErrorCode::kInvalidArgument, ctx.node.Describe() + ": split " + ShapeToString(split) +
                                                 " does not cut an axis of size " + std::to_string(dim) + " into " +
                                                 std::to_string(n) + " outputs");
  return split;
}

void SplitKernel(KernelContext& ctx) {
  const Tensor& in = ctx.In(0);
  size_t es = DTypeSize(in.dtype());
  int64_t axis = NormalizeAxis(ctx.node.GetInt("axis", 0), in.rank(), ctx.node);
  std::vector<int64_t> split = SplitSizes(ctx, in.dim(axis));
  int64_t outer = Product(in.shape(), 0, axis);
  size_t unit = static_cast<size_t>(Product(in.shape(), axis + 1, in.shape().size())) * es;
  size_t row_bytes = static_cast<size_t>(in.dim(axis)) * unit;
  size_t offset = 0;
  for (size_t i = 0; i < split.size(); ++i) {
    size_t part = static_cast<size_t>(split[i]) * unit;
    if (ctx.outputs[i] != nullptr) {
      Shape expected = in.shape();
      expected[axis] = split[i];
      CheckOutput(ctx, static_cast<int>(i), expected);
      char* dst = Bytes(*ctx.outputs[i]);
      for (int64_t o = 0; o < outer; ++o) CopyBytes(dst + o * part, Bytes(in) + o * row_bytes + offset, part);
    }
    offset += part;
  }
}

// ---------------------------------------------------------------------------------------------------------------
void SliceKernel(KernelContext& ctx) {
  const Tensor& in = ctx.In(0);
  Tensor& out = ctx.Out(0);
  const int64_t rank = in.rank();
  SliceArgs args;
  if (!ReadSliceArgs(ctx.node, ctx.opset, [&](int i) { return ctx.HasIn(i) ? &ctx.In(i) : nullptr; }, &args))
    Internal(ctx.node, "starts/ends missing");
  const SliceRange range = ResolveSlice(in.shape(), args, ctx.node);
  const std::vector<int64_t>& first = range.first;
  const std::vector<int64_t>& step = range.step;
  const Shape& expected = range.out;
  CheckOutput(ctx, 0, expected);
  if (out.numel() == 0) return;
  std::vector<int64_t> strides = Strides(in.shape());
  int64_t base = 0;
  for (int64_t d = 0; d < rank; ++d) {
    base += first[d] * strides[d];
    strides[d] *= step[d];
  }
  size_t es = DTypeSize(in.dtype());
  CopyStrided(es, out.shape(), Bytes(in) + base * static_cast<int64_t>(es), strides, Bytes(out));
}

// ---------------------------------------------------------------------------------------------------------------
int64_t CheckedIndex(const KernelContext& ctx, int64_t v, int64_t dim) { return GatherIndex(ctx.node, v, dim, 0); }

std::vector<int64_t> IndexValues(const Tensor& t) {
  std::vector<int64_t> v(t.numel());
  if (t.dtype() == DType::kI64) {
    CopyBytes(v.data(), t.raw(), v.size() * sizeof(int64_t));
  } else if (t.dtype() == DType::kI32) {
    const int32_t* p = t.data<int32_t>();
    for (size_t i = 0; i < v.size(); ++i) v[i] = p[i];
  } else {
    v = t.ToInt64Vector();
  }
  return v;
}

void GatherKernel(KernelContext& ctx) {
  const Tensor& data = ctx.In(0);
  Tensor& out = ctx.Out(0);
  int64_t rank = data.rank();
  int64_t axis = NormalizeAxis(ctx.node.GetInt("axis", 0), rank, ctx.node);
  int64_t dim = data.dim(axis);
  std::vector<int64_t> indices = IndexValues(ctx.In(1));
  const int64_t zero_outside = ctx.node.GetInt(kGatherZeroOutside, 0);  // -1 below: a zero slice
  for (int64_t& v : indices) v = GatherIndex(ctx.node, v, dim, zero_outside);
  size_t es = DTypeSize(data.dtype());
  int64_t outer = Product(data.shape(), 0, axis);
  size_t inner = static_cast<size_t>(Product(data.shape(), axis + 1, rank)) * es;
  if (out.nbytes() != static_cast<size_t>(outer) * indices.size() * inner) Internal(ctx.node, "output size mismatch");
  char* dst = Bytes(out);
  const char* src = Bytes(data);
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t v : indices) {
      if (v < 0)
        std::memset(dst, 0, inner);
      else
        CopyBytes(dst, src + (o * dim + v) * inner, inner);
      dst += inner;
    }
  }
}

void GatherElementsKernel(KernelContext& ctx) {
  const Tensor& data = ctx.In(0);
  const Tensor& idx_t = ctx.In(1);
  Tensor& out = ctx.Out(0);
  int64_t rank = data.rank();
  int64_t axis = NormalizeAxis(ctx.node.GetInt("axis", 0), rank, ctx.node);
  CheckOutput(ctx, 0, idx_t.shape());
  if (idx_t.rank() != rank) Internal(ctx.node, "indices rank differs from data rank");
  for (int64_t d = 0; d < rank; ++d)
    if (d != axis && idx_t.dim(d) > data.dim(d)) Internal(ctx.node, "indices exceed data");
  std::vector<int64_t> indices = IndexValues(idx_t);
  std::vector<int64_t> strides = Strides(data.shape());
  size_t es = DTypeSize(data.dtype());
  std::vector<int64_t> pos(rank, 0);
  const char* src = Bytes(data);
  char* dst = Bytes(out);
  for (int64_t k = 0; k < out.numel(); ++k) {
    int64_t off = 0;
    for (int64_t d = 0; d < rank; ++d)
      off += (d == axis ? CheckedIndex(ctx, indices[k], data.dim(axis)) : pos[d]) * strides[d];
    std::memcpy(dst + k * es, src + off * static_cast<int64_t>(es), es);
    for (int64_t d = rank - 1; d >= 0; --d) {
      if (++pos[d] < idx_t.dim(d)) break;
      pos[d] = 0;
    }
  }
}

// GatherND / ScatterND: the element offset (within one batch block of data) of each index tuple, each tuple's k
// values checked against their axes (negative values count from the end).
std::vector<int64_t> NdOffsets(const KernelContext& ctx, const Shape& data, const Tensor& idx_t, int64_t batch_dims) {
  const int64_t k = idx_t.dim(idx_t.rank() - 1);
  if (k < 1 || batch_dims + k > static_cast<int64_t>(data.size())) Internal(ctx.node, "bad index depth");
  const std::vector<int64_t> values = IndexValues(idx_t);
  std::vector<int64_t> offsets(values.size() / static_cast<size_t>(k));
  for (size_t t = 0; t < offsets.size(); ++t) {
    int64_t off = 0;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t dim = data[batch_dims + j];
      off = off * dim + CheckedIndex(ctx, values[t * k + j], dim);
    }
    offsets[t] = off;
  }
  return offsets;
}

void GatherNDKernel(KernelContext& ctx) {
  const Tensor& data = ctx.In(0);
  const Tensor& idx_t = ctx.In(1);
  const int64_t b = ctx.node.GetInt("batch_dims", 0);
  const int64_t r = data.rank(), q = idx_t.rank(), k = idx_t.dim(q - 1);
  Shape expected(idx_t.shape().begin(), idx_t.shape().end() - 1);
  expected.insert(expected.end(), data.shape().begin() + b + k, data.shape().end());
  CheckOutput(ctx, 0, expected);
  const std::vector<int64_t> offsets = NdOffsets(ctx, data.shape(), idx_t, b);
  const size_t es = DTypeSize(data.dtype());
  const size_t slice = static_cast<size_t>(Product(data.shape(), b + k, r)) * es;
  const int64_t batches = Product(data.shape(), 0, b);
  const size_t block = static_cast<size_t>(Product(data.shape(), b, r)) * es;  // one batch of data
  const size_t tuples = offsets.size() / static_cast<size_t>(std::max<int64_t>(batches, 1));
  const char* src = Bytes(data);
  char* dst = Bytes(ctx.Out(0));
  for (size_t t = 0; t < offsets.size(); ++t, dst += slice)
    CopyBytes(dst, src + (tuples ? t / tuples : 0) * block + static_cast<size_t>(offsets[t]) * slice, slice);
}

template <class T>
void ScatterReduce(const std::string& reduction, const T* from, T* to, size_t n) {
  if (reduction == "add") {
    for (size_t i = 0; i < n; ++i) to[i] = static_cast<T>(to[i] + from[i]);
  } else if (reduction == "mul") {
    for (size_t i = 0; i < n; ++i) to[i] = static_cast<T>(to[i] * from[i]);
  } else if (reduction == "max") {
    for (size_t i = 0; i < n; ++i) to[i] = std::max(to[i], from[i]);
  } else {  // min (the schema allows nothing else)
    for (size_t i = 0; i < n; ++i) to[i] = std::min(to[i], from[i]);
  }
}

// ScatterND / ScatterElements: update t (`slice_elems` elements) written over (reduction "none") or folded into
// (add, mul, max, min) `out` at slice offsets[t], in order, so with "none" a repeated index keeps the last update
// (ONNX leaves that order undefined; ONNX Runtime does the same).
void ApplyUpdates(const KernelContext& ctx, const std::vector<int64_t>& offsets, int64_t slice_elems,
                  const Tensor& updates, Tensor& out) {
  const std::string reduction = ctx.node.GetString("reduction", "none");
  const size_t slice = static_cast<size_t>(slice_elems) * DTypeSize(out.dtype());
  const char* from = Bytes(updates);
  char* base = Bytes(out);
  if (reduction == "none") {
    for (size_t t = 0; t < offsets.size(); ++t) CopyBytes(base + offsets[t] * slice, from + t * slice, slice);
    return;
  }
  DispatchNumeric(ctx.node, out.dtype(), [&](auto zero) {
    using T = decltype(zero);
    for (size_t t = 0; t < offsets.size(); ++t)
      ScatterReduce(reduction, reinterpret_cast<const T*>(from + t * slice),
                    reinterpret_cast<T*>(base + offsets[t] * slice), static_cast<size_t>(slice_elems));
  });
}

// ScatterElements: as ScatterND with one element per update.
void ScatterElementsKernel(KernelContext& ctx) {
  const Tensor& data = ctx.In(0);
  const Tensor& idx_t = ctx.In(1);
  const Tensor& updates = ctx.In(2);
  Tensor& out = ctx.Out(0);
  CheckOutput(ctx, 0, data.shape());
  const int64_t rank = data.rank();
  const int64_t axis = NormalizeAxis(ctx.node.GetInt("axis", 0), rank, ctx.node);
  if (idx_t.rank() != rank || updates.shape() != idx_t.shape()) Internal(ctx.node, "indices/updates shape mismatch");
  for (int64_t d = 0; d < rank; ++d)
    if (d != axis && idx_t.dim(d) > data.dim(d)) Internal(ctx.node, "indices exceed data");
  if (out.raw() != data.raw()) CopyBytes(out.raw(), data.raw(), data.nbytes());
  const std::vector<int64_t> indices = IndexValues(idx_t);
  const std::vector<int64_t> strides = Strides(data.shape());
  std::vector<int64_t> offsets(indices.size());
  std::vector<int64_t> pos(rank, 0);
  for (size_t e = 0; e < indices.size(); ++e) {
    int64_t off = 0;
    for (int64_t d = 0; d < rank; ++d)
      off += (d == axis ? CheckedIndex(ctx, indices[e], data.dim(axis)) : pos[d]) * strides[d];
    offsets[e] = off;
    for (int64_t d = rank - 1; d >= 0; --d) {
      if (++pos[d] < idx_t.dim(d)) break;
      pos[d] = 0;
    }
  }
  ApplyUpdates(ctx, offsets, 1, updates, out);
}

void ScatterNDKernel(KernelContext& ctx) {
  const Tensor& data = ctx.In(0);
  const Tensor& idx_t = ctx.In(1);
  const Tensor& updates = ctx.In(2);
  Tensor& out = ctx.Out(0);
  CheckOutput(ctx, 0, data.shape());
  const int64_t k = idx_t.dim(idx_t.rank() - 1);
  const std::vector<int64_t> offsets = NdOffsets(ctx, data.shape(), idx_t, 0);
  const size_t es = DTypeSize(data.dtype());
  const int64_t slice_elems = Product(data.shape(), k, data.rank());
  const size_t slice = static_cast<size_t>(slice_elems) * es;
  if (updates.nbytes() != offsets.size() * slice) Internal(ctx.node, "updates size mismatch");
  if (out.raw() != data.raw()) CopyBytes(out.raw(), data.raw(), data.nbytes());
  ApplyUpdates(ctx, offsets, slice_elems, updates, out);
}

// TensorScatter: the cache, with update's rows written from write_indices[b] on along the axis (modulo its length in
// "circular" mode; in "linear" mode a row past its end is an error).
void TensorScatterKernel(KernelContext& ctx) {
  const Tensor& cache = ctx.In(0);
  const Tensor& update = ctx.In(1);
  Tensor& out = ctx.Out(0);
  CheckOutput(ctx, 0, cache.shape());
  const int64_t rank = cache.rank();
  int64_t axis = ctx.node.GetInt("axis", -2);
  if (axis < 0) axis += rank;
  const bool circular = ctx.node.GetString("mode", "linear") == "circular";
  const int64_t batch = cache.dim(0), max_seq = cache.dim(axis), seq = update.dim(axis);
  const int64_t inner = Product(cache.shape(), axis + 1, rank), per_batch = Product(cache.shape(), 1, axis);
  const size_t es = DTypeSize(cache.dtype()), row = static_cast<size_t>(inner) * es;
  if (out.raw() != cache.raw()) CopyBytes(out.raw(), cache.raw(), cache.nbytes());
  const char* src = Bytes(update);
  char* dst = Bytes(out);
  for (int64_t b = 0; b < batch; ++b) {
    if (seq == 0) break;  // nothing to write (and max_seq may be 0)
    int64_t start = ctx.inputs.size() > 2 && ctx.inputs[2] ? ctx.In(2).data<int64_t>()[b] : 0;
    if (circular)
      start = ((start % max_seq) + max_seq) % max_seq;
    else if (start < 0 || start > max_seq - seq)
      throw Error(ErrorCode::kInvalidArgument, ctx.node.Describe() + ": write index " + std::to_string(start) +
                                                   " of batch " + std::to_string(b) + " and " + std::to_string(seq) +
                                                   " entries do not fit the cache's " + std::to_string(max_seq) +
                                                   " (mode linear)");
    for (int64_t p = 0; p < per_batch; ++p)
      for (int64_t s = 0; s < seq; ++s) {
        const int64_t at = circular ? (start + s) % max_seq : start + s;
        const int64_t outer = b * per_batch + p;
        std::memcpy(dst + ((outer * max_seq + at) * inner) * es, src + ((outer * seq + s) * inner) * es, row);
      }
  }
}

// Trilu: keeps element (i, j) of each trailing matrix where j - i >= k (upper) or j - i <= k (lower).
void TriluKernel(KernelContext& ctx) {
  const Tensor& x = ctx.In(0);
  Tensor& y = ctx.Out(0);
  CheckOutput(ctx, 0, x.shape());
  const int64_t k = ctx.inputs.size() > 1 && ctx.inputs[1] ? ctx.In(1).GetAsInt(0) : 0;
  const bool upper = ctx.node.GetInt("upper", 1) != 0;
  const int64_t rows = x.dim(x.rank() - 2), cols = x.dim(x.rank() - 1);
  const int64_t matrices = rows * cols > 0 ? x.numel() / (rows * cols) : 0;
  const size_t es = DTypeSize(x.dtype());
  const char* src = Bytes(x);
  char* dst = Bytes(y);
  for (int64_t m = 0; m < matrices; ++m)
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) {
        const size_t at = static_cast<size_t>((m * rows + i) * cols + j) * es;
        const bool keep = upper ? j - i >= k : j - i <= k;
        if (keep)
          std::memmove(dst + at, src + at, es);
        else
          std::memset(dst + at, 0, es);
      }
}

// EyeLike: zeros, then one at (i, i + k).
void EyeLikeKernel(KernelContext& ctx) {
  Tensor& out = ctx.Out(0);
  std::memset(out.raw(), 0, out.nbytes());
  const int64_t rows = out.dim(0), cols = out.dim(1), k = ctx.node.GetInt("k", 0);
  DispatchNumeric(ctx.node, out.dtype() == DType::kBool ? DType::kU8 : out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* o = static_cast<T*>(out.raw());
    for (int64_t i = std::max<int64_t>(0, -k); i < rows && i + k < cols; ++i) o[i * cols + i + k] = T{1};
  });
}

// The window functions, in double: N = size (periodic) or size - 1 (symmetric), w[n] = sum_j a_j cos(2 pi j n / N).
void WindowKernel(KernelContext& ctx, std::initializer_list<double> a) {
  Tensor& out = ctx.Out(0);
  const int64_t size = out.numel();
  const double n_1 = static_cast<double>(ctx.node.GetInt("periodic", 1) != 0 ? size : size - 1);
  DispatchNumeric(ctx.node, out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* o = out.data<T>();
    for (int64_t n = 0; n < size; ++n) {
      double w = 0, j = 0;
      for (double coefficient : a) w += coefficient * std::cos(2 * M_PI * j++ * static_cast<double>(n) / n_1);
      o[n] = static_cast<T>(w);
    }
  });
}
void HannWindowKernel(KernelContext& ctx) { WindowKernel(ctx, {0.5, -0.5}); }
void HammingWindowKernel(KernelContext& ctx) { WindowKernel(ctx, {25.0 / 46.0, -(1 - 25.0 / 46.0)}); }
void BlackmanWindowKernel(KernelContext& ctx) { WindowKernel(ctx, {0.42, -0.5, 0.08}); }

// ReverseSequence: element by element, the source along time_axis mirrored inside the entry's length.
void ReverseSequenceKernel(KernelContext& ctx) {
  const Tensor& in = ctx.In(0);
  const Tensor& lens = ctx.In(1);
  Tensor& out = ctx.Out(0);
  const int64_t batch_axis = ctx.node.GetInt("batch_axis", 1), time_axis = ctx.node.GetInt("time_axis", 0);
  const int64_t steps = in.dim(time_axis), inner = Product(in.shape(), 2, in.rank());
  const size_t es = DTypeSize(in.dtype());
  std::vector<int64_t> len(static_cast<size_t>(in.dim(batch_axis)));
  for (size_t b = 0; b < len.size(); ++b) {
    len[b] = lens.GetAsInt(static_cast<int64_t>(b));
    if (len[b] < 0 || len[b] > steps)
      throw Error(ErrorCode::kInvalidArgument, ctx.node.Describe() + ": sequence_lens[" + std::to_string(b) +
                                                   "] = " + std::to_string(len[b]) + " is outside [0, " +
                                                   std::to_string(steps) + "]");
  }
  const char* src = Bytes(in);
  char* dst = Bytes(out);
  for (int64_t i0 = 0; i0 < in.dim(0); ++i0)
    for (int64_t i1 = 0; i1 < in.dim(1); ++i1) {
      const int64_t b = batch_axis == 0 ? i0 : i1, t = time_axis == 0 ? i0 : i1;
      const int64_t from_t = t < len[b] ? len[b] - 1 - t : t;
      const int64_t f0 = time_axis == 0 ? from_t : i0, f1 = time_axis == 0 ? i1 : from_t;
      std::memcpy(dst + (i0 * in.dim(1) + i1) * inner * es, src + (f0 * in.dim(1) + f1) * inner * es, inner * es);
    }
}

// CenterCropPad: zeros, then the region both tensors share, each axis's start centred (floor) in the larger one.
void CenterCropPadKernel(KernelContext& ctx) {
  const Tensor& in = ctx.In(0);
  Tensor& out = ctx.Out(0);
  const int64_t rank = in.rank();
  if (out.rank() != rank) Internal(ctx.node, "rank mismatch");
  std::memset(out.raw(), 0, out.nbytes());
  if (in.numel() == 0 || out.numel() == 0) return;
  if (rank == 0) return CopyBytes(out.raw(), in.raw(), in.nbytes());
  Shape count(rank);
  std::vector<int64_t> src_start(rank), dst_start(rank);
  for (int64_t d = 0; d < rank; ++d) {
    const int64_t have = in.dim(d), want = out.dim(d);
    count[d] = std::min(have, want);
    src_start[d] = have > want ? (have - want) / 2 : 0;
    dst_start[d] = want > have ? (want - have) / 2 : 0;
  }
  const std::vector<int64_t> si = Strides(in.shape()), so = Strides(out.shape());
  const size_t es = DTypeSize(in.dtype());
  const int64_t rows = Product(count, 0, rank - 1);
  std::vector<int64_t> idx(rank, 0);
  for (int64_t r = 0; r < rows; ++r) {
    int64_t from = 0, to = 0;
    for (int64_t d = 0; d < rank; ++d) {
      from += (src_start[d] + idx[d]) * si[d];
      to += (dst_start[d] + idx[d]) * so[d];
    }
    std::memcpy(Bytes(out) + to * es, Bytes(in) + from * es, static_cast<size_t>(count[rank - 1]) * es);
    for (int64_t d = rank - 2; d >= 0; --d) {
      if (++idx[d] < count[d]) break;
      idx[d] = 0;
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
void TransposeKernel(KernelContext& ctx) {
  const Tensor& in = ctx.In(0);
  int64_t rank = in.rank();
  const std::vector<int64_t> perm = TransposePerm(ctx.node, static_cast<size_t>(rank));
  std::vector<int64_t> in_strides = Strides(in.shape());
  std::vector<int64_t> strides(rank);
  Shape expected(rank);
  for (int64_t i = 0; i < rank; ++i) {
    if (perm[i] < 0 || perm[i] >= rank) Internal(ctx.node, "bad perm");
    strides[i] = in_strides[perm[i]];
    expected[i] = in.dim(perm[i]);
  }
  CheckOutput(ctx, 0, expected);
  CopyStrided(DTypeSize(in.dtype()), expected, Bytes(in), strides, Bytes(ctx.Out(0)));
}

void ExpandKernel(KernelContext& ctx) {
  const Tensor& in = ctx.In(0);
  Tensor& out = ctx.Out(0);
  int64_t r_out = out.rank(), r_in = in.rank();
  if (r_in > r_out) Internal(ctx.node, "output rank below input rank");
  std::vector<int64_t> in_strides = Strides(in.shape());
  std::vector<int64_t> strides(r_out, 0);
  for (int64_t i = 0; i < r_out; ++i) {
    int64_t j = i - (r_out - r_in);
    if (j < 0 || in.dim(j) == 1) continue;
    if (in.dim(j) != out.dim(i)) Internal(ctx.node, "input does not broadcast to the output");
    strides[i] = in_strides[j];
  }
  CopyStrided(DTypeSize(in.dtype()), out.shape(), Bytes(in), strides, Bytes(out));
}

// Output dim d*r, seen as [r, d] blocks: the row-major layout of (r0, d0, r1, d1, ...) is the tiled tensor.
void TileKernel(KernelContext& ctx) {
  const Tensor& in = ctx.In(0);
  Tensor& out = ctx.Out(0);
  int64_t rank = in.rank();
  std::vector<int64_t> in_strides = Strides(in.shape());
  Shape view;
  std::vector<int64_t> strides;
  for (int64_t d = 0; d < rank; ++d) {
    int64_t reps = in.dim(d) == 0 ? 0 : out.dim(d) / in.dim(d);
    if (reps * in.dim(d) != out.dim(d)) Internal(ctx.node, "output is not a tiling of the input");
    view.push_back(reps);
    strides.push_back(0);
    view.push_back(in.dim(d));
    strides.push_back(in_strides[d]);
  }
  CopyStrided(DTypeSize(in.dtype()), view, Bytes(in), strides, Bytes(out));
}

// ---------------------------------------------------------------------------------------------------------------
void PadKernel(KernelContext& ctx) {
  const Tensor& in = ctx.In(0);
  Tensor& out = ctx.Out(0);
  int64_t rank = in.rank();
  size_t es = DTypeSize(in.dtype());
  std::string mode = ctx.node.GetString("mode", "constant");
  std::array<char, 8> fill{};
  if (ctx.opset < 11) {
    fill = ValuePattern(in.dtype(), ctx.node.GetFloat("value", 0.f));
  } else if (ctx.HasIn(2) && ctx.In(2).numel() > 0) {
    if (ctx.In(2).dtype() != in.dtype()) Internal(ctx.node, "constant_value dtype differs from data");
    std::memcpy(fill.data(), ctx.In(2).raw(), es);
  }
  PadAmounts pads;
  if (!ReadPadAmounts(ctx.node, ctx.opset, rank, [&](int i) { return ctx.HasIn(i) ? &ctx.In(i) : nullptr; }, &pads))
    Internal(ctx.node, "pads missing");
  const std::vector<int64_t>& begin = pads.begin;
  const std::vector<int64_t>& end = pads.end;
  // Per axis and output coordinate: the input coordinate it reads, or -1 for the fill value (ops/pad.h). An empty
  // output builds no tables (a huge pad of an axis beside an empty one must not buy a huge table).
  std::vector<std::vector<int64_t>> source(rank);
  Shape expected(rank);
  for (int64_t d = 0; d < rank; ++d) {
    expected[d] = in.dim(d) + begin[d] + end[d];
    if (in.dim(d) - std::max<int64_t>(0, -begin[d]) - std::max<int64_t>(0, -end[d]) < 0 || expected[d] < 0)
      Internal(ctx.node, "pads crop more than the axis");
  }
  if (std::find(expected.begin(), expected.end(), 0) != expected.end()) {
    CheckOutput(ctx, 0, expected);
    return;
  }
  for (int64_t d = 0; d < rank; ++d) {
    source[d] = PadSourceTable(mode, in.dim(d), begin[d], end[d]);
    if (source[d].empty()) Internal(ctx.node, "cannot pad an empty axis in mode " + mode);
  }
  CheckOutput(ctx, 0, expected);
  if (out.numel() == 0) return;
  const char* src = Bytes(in);
  char* dst = Bytes(out);
  const int64_t ies = static_cast<int64_t>(es);
  if (rank == 0) {
    std::memcpy(dst, src, es);
    return;
  }
  std::vector<int64_t> strides = Strides(in.shape());
  int64_t inner = expected[rank - 1];
  int64_t rows = out.numel() / inner;
  std::vector<int64_t> pos(rank - 1, 0);
  const std::vector<int64_t>& last = source[rank - 1];
  for (int64_t row = 0; row < rows; ++row) {
    bool row_fill = false;
    int64_t base = 0;
    for (int64_t d = 0; d < rank - 1; ++d) {
      int64_t s = source[d][pos[d]];
      if (s < 0) row_fill = true;
      base += s * strides[d];
    }
    for (int64_t x = 0; x < inner; ++x, dst += es) {
      if (row_fill || last[x] < 0)
        std::memcpy(dst, fill.data(), es);
      else
        std::memcpy(dst, src + (base + last[x]) * ies, es);
    }
    for (int64_t d = rank - 2; d >= 0; --d) {
      if (++pos[d] < expected[d]) break;
      pos[d] = 0;
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Resize / Upsample: the taps of each axis from ops/onnx_resize.h; the N-D result is their tensor product, as in
// onnx/reference/ops/op_resize.py.
void ResizeKernel(KernelContext& ctx) {
  const Tensor& x = ctx.In(0);
  Tensor& y = ctx.Out(0);
  int64_t rank = x.rank();
  if (y.rank() != rank) Internal(ctx.node, "output rank differs from input rank");
  if (y.numel() == 0) return;
  size_t es = DTypeSize(x.dtype());
  if (rank == 0) {
    std::memcpy(Bytes(y), Bytes(x), es);
    return;
  }
  ResizeParams p = GetResizeParams(ctx.node, ctx.opset, x.shape(), ctx.HasIn(1) ? &ctx.In(1) : nullptr,
                                   ctx.HasIn(2) ? &ctx.In(2) : nullptr, ctx.HasIn(3) ? &ctx.In(3) : nullptr);
  bool nearest = p.mode == "nearest";
  if (!nearest && x.dtype() != DType::kF32)
    throw Error(ErrorCode::kUnsupported, ctx.node.Describe() + ": mode '" + p.mode + "' supports float32 only");
  std::vector<int64_t> strides = Strides(x.shape());
  std::vector<AxisTaps> taps;
  for (int64_t d = 0; d < rank; ++d) {
    if (x.dim(d) == 0) Internal(ctx.node, "cannot resize an empty axis to a non-empty one");
    taps.push_back(BuildTaps(p, d, x.dim(d), y.dim(d), strides[d]));
  }
  std::array<char, 8> extrapolation = ValuePattern(x.dtype(), p.extrapolation);
  int64_t inner = y.dim(rank - 1);
  int64_t rows = y.numel() / inner;
  std::vector<int64_t> pos(rank - 1, 0);
  const AxisTaps& last = taps[rank - 1];
  std::vector<std::pair<int64_t, double>> partial, next;
  const char* src = Bytes(x);
  char* dst = Bytes(y);
  const int64_t ies = static_cast<int64_t>(es);
  for (int64_t row = 0; row < rows; ++row) {
    // Taps of the outer axes for this row: their tensor product.
    bool row_outside = false;
    partial.assign(1, {0, 1.0});
    for (int64_t d = 0; d < rank - 1; ++d) {
      const AxisTaps& t = taps[d];
      int64_t o = pos[d];
      if (t.outside[o]) row_outside = true;
      next.clear();
      for (const auto& [off, w] : partial)
        for (int k = 0; k < t.count[o]; ++k) next.emplace_back(off + t.offset[o][k], w * t.weight[o][k]);
      partial.swap(next);
    }
    for (int64_t o = 0; o < inner; ++o, dst += es) {
      if (row_outside || last.outside[o]) {
        std::memcpy(dst, extrapolation.data(), es);
      } else if (nearest) {
        std::memcpy(dst, src + (partial[0].first + last.offset[o][0]) * ies, es);
      } else {
        const float* xf = reinterpret_cast<const float*>(src);
        double sum = 0;
        for (const auto& [off, w] : partial)
          for (int k = 0; k < last.count[o]; ++k) sum += w * last.weight[o][k] * xf[off + last.offset[o][k]];
        float v = static_cast<float>(sum);
        std::memcpy(dst, &v, sizeof(float));
      }
    }
    for (int64_t d = rank - 2; d >= 0; --d) {
      if (++pos[d] < y.dim(d)) break;
      pos[d] = 0;
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
void ShapeKernel(KernelContext& ctx) {
  const Shape& s = ctx.In(0).shape();
  int64_t rank = static_cast<int64_t>(s.size());
  int64_t start = ctx.node.GetInt("start", 0), end = ctx.node.GetInt("end", rank);
  if (start < 0) start += rank;
  if (end < 0) end += rank;
  start = std::clamp<int64_t>(start, 0, rank);
  end = std::clamp<int64_t>(end, 0, rank);
  CheckOutput(ctx, 0, {std::max<int64_t>(0, end - start)});
  int64_t* out = ctx.Out(0).data<int64_t>();
  for (int64_t i = start; i < end; ++i) out[i - start] = s[i];
}

void SizeKernel(KernelContext& ctx) { ctx.Out(0).data<int64_t>()[0] = ctx.In(0).numel(); }

void ConstantKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  Tensor& out = ctx.Out(0);
  if (node.Has("value")) {
    const Tensor& v = node.attrs.at("value").t;
    if (v.nbytes() != out.nbytes() || v.dtype() != out.dtype()) Internal(node, "output does not fit the value");
    CopyBytes(out.raw(), v.raw(), v.nbytes());
  } else if (node.Has("value_float")) {
    out.data<float>()[0] = node.GetFloat("value_float", 0.f);
  } else if (node.Has("value_floats")) {
    std::vector<float> v = node.GetFloats("value_floats");
    CopyBytes(out.raw(), v.data(), v.size() * sizeof(float));
  } else if (node.Has("value_int")) {
    out.data<int64_t>()[0] = node.GetInt("value_int", 0);
  } else if (node.Has("value_ints")) {
    std::vector<int64_t> v = node.GetInts("value_ints");
    CopyBytes(out.raw(), v.data(), v.size() * sizeof(int64_t));
  } else {
    throw Error(ErrorCode::kUnsupported, node.Describe() + ": no supported value attribute");
  }
}

void ConstantOfShapeKernel(KernelContext& ctx) {
  Tensor& out = ctx.Out(0);
  std::array<char, 8> value{};
  if (ctx.node.Has("value")) {
    const Tensor& v = ctx.node.attrs.at("value").t;
    if (v.dtype() != out.dtype() || v.numel() != 1) Internal(ctx.node, "value attribute does not match the output");
    std::memcpy(value.data(), v.raw(), DTypeSize(v.dtype()));
  }
  FillPattern(Bytes(out), out.numel(), value.data(), DTypeSize(out.dtype()));
}

// OneHot: every position off_value, then on_value where the class is the (wrapped) index; an index outside
// [-depth, depth) leaves its row all off_value. Float indices are truncated toward zero, as ONNX Runtime does.
void OneHotKernel(KernelContext& ctx) {
  const Tensor& indices = ctx.In(0);
  const Tensor& values = ctx.In(2);
  Tensor& out = ctx.Out(0);
  const int64_t rank = indices.rank();
  int64_t axis = ctx.node.GetInt("axis", -1);
  if (axis < 0) axis += rank + 1;
  const int64_t depth = out.dim(axis);
  const int64_t outer = Product(indices.shape(), 0, axis), inner = Product(indices.shape(), axis, rank);
  if (out.numel() != outer * depth * inner) Internal(ctx.node, "output size mismatch");
  const size_t es = DTypeSize(out.dtype());
  const char* off = Bytes(values);
  const char* on = off + es;
  char* dst = Bytes(out);
  FillPattern(dst, out.numel(), off, es);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      const double raw = indices.GetAsDouble(o * inner + i);
      if (!(raw > -static_cast<double>(depth) - 1 && raw < static_cast<double>(depth))) continue;  // NaN too
      int64_t k = static_cast<int64_t>(raw);  // truncates toward zero
      if (k < 0) k += depth;
      if (k < 0 || k >= depth) continue;
      std::memcpy(dst + ((o * depth + k) * inner + i) * es, on, es);
    }
}

void RangeKernel(KernelContext& ctx) {
  Tensor& out = ctx.Out(0);
  int64_t n = out.numel();
  switch (out.dtype()) {
    case DType::kF32: {
      double start = ctx.In(0).GetAsDouble(0), delta = ctx.In(2).GetAsDouble(0);
      float* o = out.data<float>();
      for (int64_t i = 0; i < n; ++i) o[i] = static_cast<float>(start + static_cast<double>(i) * delta);
      break;
    }
    case DType::kI32: {
      int64_t start = ctx.In(0).GetAsInt(0), delta = ctx.In(2).GetAsInt(0);
      int32_t* o = out.data<int32_t>();
      for (int64_t i = 0; i < n; ++i) o[i] = static_cast<int32_t>(start + i * delta);
      break;
    }
    case DType::kI64: {
      int64_t start = ctx.In(0).GetAsInt(0), delta = ctx.In(2).GetAsInt(0);
      int64_t* o = out.data<int64_t>();
      for (int64_t i = 0; i < n; ++i) o[i] = start + i * delta;
      break;
    }
    default:
      throw Error(ErrorCode::kUnsupported, ctx.node.Describe() + ": Range does not support " + DTypeName(out.dtype()));
  }
}

// ---------------------------------------------------------------------------------------------------------------
// DepthToSpace writes (N, C', H, b, W, b) in output order, read from the input viewed as (N, b, b, C', H, W) for DCR or
// (N, C', b, b, H, W) for CRD.
void DepthToSpaceKernel(KernelContext& ctx) {
  const Tensor& in = ctx.In(0);
  int64_t b = ctx.node.GetInt("blocksize", 1);
  int64_t n = in.dim(0), c = in.dim(1), h = in.dim(2), w = in.dim(3), co = c / (b * b);
  CheckOutput(ctx, 0, {n, co, h * b, w * b});
  int64_t hw = h * w;
  std::vector<int64_t> strides;
  if (ctx.node.GetString("mode", "DCR") == "CRD")
    strides = {c * hw, b * b * hw, w, b * hw, 1, hw};
  else
    strides = {c * hw, hw, w, b * co * hw, 1, co * hw};
  CopyStrided(DTypeSize(in.dtype()), {n, co, h, b, w, b}, Bytes(in), strides, Bytes(ctx.Out(0)));
}

// SpaceToDepth writes (N, b, b, C, H', W') in output order (DCR; CRD, opset 28: (N, C, b, b, H', W')) from input
// element (n, c, h' * b + i, w' * b + j).
void SpaceToDepthKernel(KernelContext& ctx) {
  const Tensor& in = ctx.In(0);
  int64_t b = ctx.node.GetInt("blocksize", 1);
  int64_t n = in.dim(0), c = in.dim(1), h = in.dim(2), w = in.dim(3);
  CheckOutput(ctx, 0, {n, c * b * b, h / b, w / b});
  if (ctx.node.GetString("mode", "DCR") == "CRD")
    CopyStrided(DTypeSize(in.dtype()), {n, c, b, b, h / b, w / b}, Bytes(in), {c * h * w, h * w, w, 1, b * w, b},
                Bytes(ctx.Out(0)));
  else
    CopyStrided(DTypeSize(in.dtype()), {n, b, b, c, h / b, w / b}, Bytes(in), {c * h * w, w, 1, h * w, b * w, b},
                Bytes(ctx.Out(0)));
}

}  // namespace

void AddShapeReferenceKernels(ReferenceKernelTable& t) {
  t.Add("Concat", ConcatKernel);
  t.Add("Split", SplitKernel);
  t.Add("Slice", SliceKernel);
  t.Add("Gather", GatherKernel);
  t.Add("OneHot", OneHotKernel);
  t.Add("GatherElements", GatherElementsKernel);
  t.Add("GatherND", GatherNDKernel);
  t.Add("ScatterND", ScatterNDKernel);
  t.Add("ScatterElements", ScatterElementsKernel);
  t.Add("TensorScatter", TensorScatterKernel);
  t.Add("Scatter", ScatterElementsKernel);
  t.Add("Reshape", CopyKernel);
  t.Add("Flatten", CopyKernel);
  t.Add("Squeeze", CopyKernel);
  t.Add("Unsqueeze", CopyKernel);
  t.Add("Identity", CopyKernel);
  t.Add("Trilu", TriluKernel);
  t.Add("EyeLike", EyeLikeKernel);
  t.Add("HannWindow", HannWindowKernel);
  t.Add("HammingWindow", HammingWindowKernel);
  t.Add("BlackmanWindow", BlackmanWindowKernel);
  t.Add("ReverseSequence", ReverseSequenceKernel);
  t.Add("Transpose", TransposeKernel);
  t.Add("Expand", ExpandKernel);
  t.Add("Tile", TileKernel);
  t.Add("Pad", PadKernel);
  t.Add("Resize", ResizeKernel);
  t.Add("Upsample", ResizeKernel);
  t.Add("Shape", ShapeKernel);
  t.Add("Size", SizeKernel);
  t.Add("Constant", ConstantKernel);
  t.Add("ConstantOfShape", ConstantOfShapeKernel);
  t.Add("Range", RangeKernel);
  t.Add("Dropout", DropoutKernel);
  t.Add("DepthToSpace", DepthToSpaceKernel);
  t.Add("SpaceToDepth", SpaceToDepthKernel);
  t.Add("CenterCropPad", CenterCropPadKernel);
}

}  // namespace osprey
