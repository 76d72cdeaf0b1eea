// Reference kernels for the neural-network op family (float32). Conv and MatMul run as im2col + a blocked GEMM so
// that constant folding and oracle runs on real-size layers stay well under a second. Shapes and attributes were
// validated by the op schemas (src/ops/nn.cc); the kernels trust them.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/reference/dispatch.h"
#include "kernels/reference/reference.h"
#include "ops/activation.h"
#include "ops/batch_norm.h"
#include "ops/conv_input_scale.h"
#include "ops/conv_window.h"
#include "ops/einsum.h"
#include "ops/fused_depthwise.h"
#include "ops/fused_pool.h"
#include "ops/grid_sample.h"
#include "ops/matmul_views.h"
#include "ops/op_registry.h"

namespace osprey {
namespace {

// Below this many multiply-adds a region runs on one thread: thread start-up would cost more than it saves.
constexpr int64_t kMinParallelWork = int64_t{1} << 15;

int64_t Product(const Shape& s, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t i = begin; i < end; ++i) p *= s[i];
  return p;
}

bool HasOut(const KernelContext& ctx, int i, int64_t numel) {
  return i < static_cast<int>(ctx.outputs.size()) && ctx.outputs[i] != nullptr && ctx.outputs[i]->numel() == numel;
}

// Numpy unidirectional broadcast of `param` to `target`, materialised (used for small per-row parameters).
std::vector<float> ExpandTo(const Tensor& param, const Shape& target) {
  int64_t n = NumElements(target);
  std::vector<float> out(n);
  const float* p = param.data<float>();
  int64_t rank = static_cast<int64_t>(target.size()), prank = param.rank();
  for (int64_t i = 0; i < n; ++i) {
    int64_t rem = i, src = 0, stride = 1;
    for (int64_t d = rank - 1; d >= 0; --d) {
      int64_t coord = rem % target[d];
      rem /= target[d];
      int64_t pd = d - (rank - prank);
      if (pd >= 0) {
        int64_t pdim = param.dim(pd);
        if (pdim != 1) src += coord * stride;
        stride *= pdim;
      }
    }
    out[i] = p[src];
  }
  return out;
}

// ---------------------------------------------------------------- GEMM

constexpr int64_t kTileRows = 32;
constexpr int64_t kTileCols = 256;
constexpr int64_t kTileDepth = 256;

// C[i0:i1, j0:j1] = A[i0:i1, 0:K] * B[0:K, j0:j1]; row-major with leading dims. Four C rows share each B load;
// a 256-deep slab of B (256 KiB at most) stays in L2 while all rows of the tile use it.
void GemmTile(const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc, int64_t depth,
              int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  const int64_t nj = j1 - j0;
  for (int64_t i = i0; i < i1; ++i) std::fill(c + i * ldc + j0, c + i * ldc + j1, 0.f);
  for (int64_t k0 = 0; k0 < depth; k0 += kTileDepth) {
    const int64_t k1 = std::min(depth, k0 + kTileDepth);
    int64_t i = i0;
    for (; i + 4 <= i1; i += 4) {
      float* c0 = c + i * ldc + j0;
      float* c1 = c0 + ldc;
      float* c2 = c1 + ldc;
      float* c3 = c2 + ldc;
      const float* a0 = a + i * lda;
      for (int64_t k = k0; k < k1; ++k) {
        const float v0 = a0[k], v1 = a0[lda + k], v2 = a0[2 * lda + k], v3 = a0[3 * lda + k];
        const float* bk = b + k * ldb + j0;
#pragma omp simd
        for (int64_t j = 0; j < nj; ++j) {
          const float bj = bk[j];
          c0[j] += v0 * bj;
          c1[j] += v1 * bj;
          c2[j] += v2 * bj;
          c3[j] += v3 * bj;
        }
      }
    }
    for (; i < i1; ++i) {
      float* ci = c + i * ldc + j0;
      const float* ai = a + i * lda;
      for (int64_t k = k0; k < k1; ++k) {
        const float v = ai[k];
        const float* bk = b + k * ldb + j0;
#pragma omp simd
        for (int64_t j = 0; j < nj; ++j) ci[j] += v * bk[j];
      }
    }
  }
}

struct GemmOperands {
  const float* a;
  const float* b;
  float* c;
};

// For every entry: c[M, N] = a[M, K] * b[K, N] (leading dims lda/ldb/ldc). One parallel loop over all tiles of all
// entries, so a batch of small products (attention heads, depthwise groups) is as parallel as one large product.
void RunGemms(const std::vector<GemmOperands>& ops, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb,
              int64_t ldc) {
  const int64_t row_tiles = (m + kTileRows - 1) / kTileRows;
  const int64_t col_tiles = (n + kTileCols - 1) / kTileCols;
  const int64_t tiles_per_op = row_tiles * col_tiles;
  const int64_t total = static_cast<int64_t>(ops.size()) * tiles_per_op;
  const bool parallel =
      total > 1 && static_cast<int64_t>(ops.size()) * m * n * std::max<int64_t>(k, 1) >= kMinParallelWork;
#pragma omp parallel for schedule(dynamic) if (parallel)
  for (int64_t t = 0; t < total; ++t) {
    const GemmOperands& op = ops[t / tiles_per_op];
    const int64_t tile = t % tiles_per_op;
    const int64_t i0 = (tile / col_tiles) * kTileRows, j0 = (tile % col_tiles) * kTileCols;
    GemmTile(op.a, lda, op.b, ldb, op.c, ldc, k, i0, std::min(m, i0 + kTileRows), j0, std::min(n, j0 + kTileCols));
  }
}

// ---------------------------------------------------------------- window geometry

}  // namespace

Window3 ToWindow3(const ConvWindow& w, const Shape& y) {
  const int n = static_cast<int>(w.in.size());
  const int off = 3 - n;
  Window3 g;
  for (int i = 0; i < n; ++i) {
    const int j = off + i;
    g.in[j] = w.in[i];
    g.out[j] = y[2 + i];
    g.k[j] = w.kernel[i];
    g.s[j] = w.strides[i];
    g.d[j] = w.dilations[i];
    g.pb[j] = w.pad_begin[i];
    g.pe[j] = w.pad_end[i];
  }
  return g;
}

Window3 MakeWindow(const Node& node, const Shape& x, const Shape& y, const std::vector<int64_t>& kernel) {
  // ceil_mode changes only the output sizes, which come from y (but a window longer than the input fits only with it).
  return ToWindow3(ResolveConvWindow(node, x, kernel, node.GetInt("ceil_mode", 0) != 0), y);
}

MatMulBatches BatchedMatMul(const Shape& a, const Shape& b) {
  Shape as = a, bs = b;
  if (as.size() == 1) as.insert(as.begin(), 1);
  if (bs.size() == 1) bs.push_back(1);
  MatMulBatches mm;
  mm.m = as[as.size() - 2];
  mm.k = as.back();
  mm.n = bs.back();
  const size_t batch_rank = std::max(as.size(), bs.size()) - 2;
  // Batch dims right-aligned and padded with 1 on the left.
  Shape a_batch(batch_rank, 1), b_batch(batch_rank, 1), batch(batch_rank);
  std::copy(as.begin(), as.end() - 2, a_batch.end() - (as.size() - 2));
  std::copy(bs.begin(), bs.end() - 2, b_batch.end() - (bs.size() - 2));
  // Broadcasting takes the dim that is not 1 (0 against 1 is 0: no batches, not one).
  for (size_t d = 0; d < batch_rank; ++d) batch[d] = a_batch[d] == 1 ? b_batch[d] : a_batch[d];
  const int64_t count = NumElements(batch);
  mm.offsets.resize(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    int64_t rem = i, a_off = 0, b_off = 0, a_stride = mm.m * mm.k, b_stride = mm.k * mm.n;
    for (int64_t d = static_cast<int64_t>(batch_rank) - 1; d >= 0; --d) {
      const int64_t coord = rem % batch[d];
      rem /= batch[d];
      if (a_batch[d] != 1) a_off += coord * a_stride;
      if (b_batch[d] != 1) b_off += coord * b_stride;
      a_stride *= a_batch[d];
      b_stride *= b_batch[d];
    }
    mm.offsets[i] = {a_off, b_off};
  }
  return mm;
}

namespace {

// ---------------------------------------------------------------- Conv

// col[(c, kz, ky, kx), (oz, oy, ox)] = x[c, iz, iy, ix] or 0 in the padding.
void Im2Col(const float* x, int64_t channels, const Window3& g, float* col) {
  const int64_t kvol = g.KVol(), out_vol = g.OutVol(), in_vol = g.InVol();
  const int64_t rows = channels * kvol;
#pragma omp parallel for if (rows * out_vol >= kMinParallelWork)
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t ch = row / kvol, kidx = row % kvol;
    const int64_t kz = kidx / (g.k[1] * g.k[2]), ky = (kidx / g.k[2]) % g.k[1], kx = kidx % g.k[2];
    const float* xc = x + ch * in_vol;
    float* dst = col + row * out_vol;
    for (int64_t oz = 0; oz < g.out[0]; ++oz) {
      const int64_t iz = oz * g.s[0] - g.pb[0] + kz * g.d[0];
      if (iz < 0 || iz >= g.in[0]) {
        std::fill(dst, dst + g.out[1] * g.out[2], 0.f);
        dst += g.out[1] * g.out[2];
        continue;
      }
      for (int64_t oy = 0; oy < g.out[1]; ++oy, dst += g.out[2]) {
        const int64_t iy = oy * g.s[1] - g.pb[1] + ky * g.d[1];
        if (iy < 0 || iy >= g.in[1]) {
          std::fill(dst, dst + g.out[2], 0.f);
          continue;
        }
        const float* src = xc + (iz * g.in[1] + iy) * g.in[2];
        for (int64_t ox = 0; ox < g.out[2]; ++ox) {
          const int64_t ix = ox * g.s[2] - g.pb[2] + kx * g.d[2];
          dst[ox] = (ix >= 0 && ix < g.in[2]) ? src[ix] : 0.f;
        }
      }
    }
  }
}

// QuantizeLinear then DequantizeLinear of v (per tensor): round half to even, saturate to the 8-bit range.
float QuantizeDequantize(float v, float scale, int64_t zero_point, bool is_signed) {
  const float lo = is_signed ? -128.f : 0.f, hi = is_signed ? 127.f : 255.f;
  const float q = std::clamp(std::nearbyint(v / scale) + static_cast<float>(zero_point), lo, hi);
  return (q - static_cast<float>(zero_point)) * scale;
}

// A Conv or MatMul made by FuseInt8 (runtime/fusion_qdq.cc) stands for DQ(Q(x)) -> op -> Q -> DQ: the same arithmetic
// in float (weights are the dequantised int8 values already), so it agrees with the int8 kernels within a step. `which`
// is "x" or "y": the `_int8_<which>_*` grid applied to n values in place.
void Int8Grid(const Node& node, const char* which, float* v, int64_t n) {
  const std::string p = std::string("_int8_") + which;
  const float scale = node.GetFloat(p + "_scale", 1.f);
  const int64_t zero_point = node.GetInt(p + "_zero_point", 0);
  const bool is_signed = node.GetInt(p + "_signed", 0) != 0;
  for (int64_t i = 0; i < n; ++i) v[i] = QuantizeDequantize(v[i], scale, zero_point, is_signed);
}

void ConvRef(KernelContext& ctx);

// A Conv with a fused depthwise convolution (ops/fused_depthwise.h): its two parts, one after the other.
void FusedDepthwiseConvRef(KernelContext& ctx) {
  const Tensor& x = ctx.In(0);
  const Tensor& w = ctx.In(1);
  const Node pointwise = FusedPointwisePart(ctx.node);
  std::vector<int64_t> kernel(w.shape().begin() + 2, w.shape().end());
  Shape mid_shape = {x.dim(0), w.dim(0)};
  for (int64_t d : ResolveConvWindow(pointwise, x.shape(), kernel, /*ceil_mode=*/false).out) mid_shape.push_back(d);
  Tensor mid(DType::kF32, mid_shape);
  KernelContext first{pointwise, ctx.opset};
  first.inputs = {ctx.inputs[0], ctx.inputs[1], ctx.HasIn(2) ? ctx.inputs[2] : nullptr};
  first.outputs = {&mid};
  ConvRef(first);
  const Node depthwise = FusedDepthwisePart(ctx.node, w.dim(0));
  KernelContext second{depthwise, ctx.opset};
  second.inputs = {&mid, ctx.inputs[kDwWeightInput], ctx.HasIn(kDwBiasInput) ? ctx.inputs[kDwBiasInput] : nullptr};
  second.outputs = {ctx.outputs[0]};
  ConvRef(second);
}

// A Conv with a fused MaxPool (ops/fused_pool.h): the convolution, then the pool's reference kernel.
void FusedPoolConvRef(KernelContext& ctx) {
  const Node conv = FusedConvPart(ctx.node);
  Tensor mid(DType::kF32, FusedConvOutputShape(ctx.node, ctx.In(0).shape(), ctx.In(1).shape()));
  KernelContext first{conv, ctx.opset};
  first.inputs = ctx.inputs;
  first.outputs = {&mid};
  ConvRef(first);
  const Node pool = FusedPoolPart(ctx.node);
  KernelContext second{pool, ctx.opset};
  second.inputs = {&mid};
  second.outputs = {ctx.outputs[0]};
  FindReferenceKernel("MaxPool")(second);
}

void ConvRef(KernelContext& ctx) {
  if (HasFusedDepthwise(ctx.node)) return FusedDepthwiseConvRef(ctx);
  if (HasFusedPool(ctx.node)) return FusedPoolConvRef(ctx);
  const Node& node = ctx.node;
  Tensor x = ctx.In(0);
  const Tensor& w = ctx.In(1);
  Tensor& y = ctx.Out(0);
  const bool int8 = node.GetInt("_int8", 0) != 0;  // Int8Grid, above
  if (int8) {
    x = x.Clone();
    Int8Grid(node, "x", x.data<float>(), x.numel());
  }
  // ops/conv_input_scale.h: X is its parts concatenated along the channels (Concat's kernel).
  if (HasInputParts(node)) {
    Node concat;
    concat.op_type = "Concat";
    concat.name = node.name;
    concat.attrs["axis"] = Attribute::Int(1);
    Tensor joined(DType::kF32, JoinedInputShape(node, {x.shape()}));
    KernelContext join{concat, ctx.opset};
    for (size_t i = 0; i < node.GetInts("_input_parts").size(); ++i)
      join.inputs.push_back(ctx.inputs[InputPartIndex(static_cast<int>(i))]);
    join.outputs = {&joined};
    FindReferenceKernel("Concat")(join);
    x = joined;
  }
  if (HasInputAffine(node)) {  // ops/conv_input_scale.h: x * a + b per channel, then the ReLU
    const float* a = ctx.In(kInputAffineScale).data<float>();
    const float* b = ctx.In(kInputAffineShift).data<float>();
    const bool relu = node.GetInt("_input_relu", 0) != 0;
    Tensor t(DType::kF32, x.shape());
    const int64_t channels = x.dim(1), plane = x.numel() / std::max<int64_t>(1, x.dim(0) * channels);
    const float* xs = x.data<float>();
    float* ts = t.data<float>();
    for (int64_t i = 0; i < x.numel(); ++i) {
      const int64_t c = i / plane % channels;
      const float v = xs[i] * a[c] + b[c];
      ts[i] = relu ? std::max(v, 0.f) : v;
    }
    x = t;
  }
  if (HasInputScale(node) && ctx.HasIn(kInputScaleInput)) {  // ops/conv_input_scale.h: the input times its gate
    const Tensor& scale = ctx.In(kInputScaleInput);
    Tensor scaled(DType::kF32, x.shape());
    ScaleInputChannels(x.data<float>(), scale.data<float>(), scaled.data<float>(), x.dim(0), x.dim(1),
                       x.numel() / std::max<int64_t>(1, x.dim(0) * x.dim(1)), /*nhwc=*/false, scale.dim(0));
    x = scaled;
  }
  const int64_t batch = x.dim(0), channels = x.dim(1), out_channels = w.dim(0);
  const int64_t group = node.GetInt("group", 1);
  const int64_t group_out = out_channels / group;
  std::vector<int64_t> kernel(w.shape().begin() + 2, w.shape().end());
  const Window3 g = MakeWindow(node, x.shape(), y.shape(), kernel);
  const int64_t kvol = g.KVol(), depth = (channels / group) * kvol, out_vol = g.OutVol(), in_vol = g.InVol();
  // A 1x1 kernel with unit strides and no padding reads the input as it lies: skip im2col.
  bool pointwise = kvol == 1 && out_vol == in_vol;
  for (int i = 0; i < 3; ++i) pointwise = pointwise && g.s[i] == 1 && g.pb[i] == 0 && g.pe[i] == 0;
  std::vector<float> col(pointwise ? 0 : static_cast<size_t>(channels * kvol * out_vol));
  const float* xd = x.data<float>();
  const float* wd = w.data<float>();
  float* yd = y.data<float>();
  std::vector<GemmOperands> ops(group);
  for (int64_t n = 0; n < batch; ++n) {
    const float* xn = xd + n * channels * in_vol;
    const float* cols = xn;
    if (!pointwise) {
      Im2Col(xn, channels, g, col.data());
      cols = col.data();
    }
    for (int64_t gi = 0; gi < group; ++gi)
      ops[gi] = {wd + gi * group_out * depth, cols + gi * depth * out_vol,
                 yd + (n * out_channels + gi * group_out) * out_vol};
    RunGemms(ops, group_out, out_vol, depth, depth, out_vol, out_vol);
  }
  const float* bias = ctx.HasIn(2) ? ctx.In(2).data<float>() : nullptr;
  const bool residual = node.GetInt("_residual", 0) != 0 && ctx.HasIn(3);
  const float* res = residual ? ctx.In(3).data<float>() : nullptr;
  if (bias || res) {
    const int64_t planes = batch * out_channels;
#pragma omp parallel for if (planes * out_vol >= kMinParallelWork)
    for (int64_t p = 0; p < planes; ++p) {
      float* yp = yd + p * out_vol;
      const float b = bias ? bias[p % out_channels] : 0.f;
      if (res) {
        const float* rp = res + p * out_vol;
        for (int64_t i = 0; i < out_vol; ++i) yp[i] += b + rp[i];
      } else {
        for (int64_t i = 0; i < out_vol; ++i) yp[i] += b;
      }
    }
  }
  ApplyFusedActivation(node, yd, y.numel());
  if (HasFusedPRelu(node)) {
    const Tensor& slopes = ctx.In(kPReluSlopeInput);
    ApplyPReluPlanes(slopes.data<float>(), slopes.numel(), out_channels, yd, batch * out_channels, out_vol);
  }
  if (int8) Int8Grid(node, "y", yd, y.numel());
}

// ---------------------------------------------------------------- ConvTranspose

void ConvTransposeRef(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& x = ctx.In(0);
  const Tensor& w = ctx.In(1);
  Tensor& y = ctx.Out(0);
  const int64_t batch = x.dim(0), channels = x.dim(1), group = node.GetInt("group", 1);
  const int64_t group_in = channels / group, group_out = w.dim(1), out_channels = group_out * group;
  std::vector<int64_t> kernel(w.shape().begin() + 2, w.shape().end());
  const Window3 g = ToWindow3(ResolveConvTransposeWindow(node, x.shape(), kernel), y.shape());
  const int64_t kvol = g.KVol(), rows = group_out * kvol, in_vol = g.InVol(), out_vol = g.OutVol();
  // W is [C, M/group, k...]; per group the GEMM needs its transpose [M/group * k, C/group].
  const float* wd = w.data<float>();
  std::vector<float> wt(static_cast<size_t>(w.numel()));
  for (int64_t gi = 0; gi < group; ++gi)
    for (int64_t c = 0; c < group_in; ++c)
      for (int64_t r = 0; r < rows; ++r) wt[(gi * rows + r) * group_in + c] = wd[(gi * group_in + c) * rows + r];
  std::vector<float> col(static_cast<size_t>(group * rows * in_vol));
  const float* xd = x.data<float>();
  const float* bias = ctx.HasIn(2) ? ctx.In(2).data<float>() : nullptr;
  float* yd = y.data<float>();
  std::vector<GemmOperands> ops(group);
  for (int64_t n = 0; n < batch; ++n) {
    for (int64_t gi = 0; gi < group; ++gi)
      ops[gi] = {wt.data() + gi * rows * group_in, xd + (n * channels + gi * group_in) * in_vol,
                 col.data() + gi * rows * in_vol};
    RunGemms(ops, rows, in_vol, group_in, group_in, in_vol, in_vol);
    // col2im: scatter-add each column back to the output positions it contributes to; one thread per channel.
#pragma omp parallel for if (out_channels * kvol * in_vol >= kMinParallelWork)
    for (int64_t oc = 0; oc < out_channels; ++oc) {
      const int64_t gi = oc / group_out, m = oc % group_out;
      float* yp = yd + (n * out_channels + oc) * out_vol;
      std::fill(yp, yp + out_vol, bias ? bias[oc] : 0.f);
      for (int64_t kidx = 0; kidx < kvol; ++kidx) {
        const int64_t kz = kidx / (g.k[1] * g.k[2]), ky = (kidx / g.k[2]) % g.k[1], kx = kidx % g.k[2];
        const float* cr = col.data() + (gi * rows + m * kvol + kidx) * in_vol;
        for (int64_t iz = 0; iz < g.in[0]; ++iz) {
          const int64_t oz = iz * g.s[0] - g.pb[0] + kz * g.d[0];
          if (oz < 0 || oz >= g.out[0]) continue;
          for (int64_t iy = 0; iy < g.in[1]; ++iy) {
            const int64_t oy = iy * g.s[1] - g.pb[1] + ky * g.d[1];
            if (oy < 0 || oy >= g.out[1]) continue;
            const float* src = cr + (iz * g.in[1] + iy) * g.in[2];
            float* dst = yp + (oz * g.out[1] + oy) * g.out[2];
            for (int64_t ix = 0; ix < g.in[2]; ++ix) {
              const int64_t ox = ix * g.s[2] - g.pb[2] + kx * g.d[2];
              if (ox >= 0 && ox < g.out[2]) dst[ox] += src[ix];
            }
          }
        }
      }
    }
  }
}

// ---------------------------------------------------------------- pools

enum class PoolKind { kMax, kAverage, kLp };

// (A window's taps inside the input: WindowTapsWithin, ops/conv_window.h; walking all of a 2^30 kernel took seconds
// per output.)
// AveragePool's divisor with count_include_pad: the window's taps in the input or its declared padding. ceil_mode's
// overhang past the padding is not counted (ONNX >= 1.18, ONNX Runtime, PyTorch; ONNX Runtime before 1.16 divided by
// the whole kernel). A double: three dims of 2^31 taps overflow an int64.
double PaddedTaps(const Window3& g, const int64_t start[3]) {
  double taps = 1;
  for (int i = 0; i < 3; ++i) {  // start >= -pb: every tap before the end of the padding counts
    int64_t lo = 0, hi = 0;
    WindowTapsWithin(start[i], g.k[i], g.d[i], g.in[i] + g.pe[i], &lo, &hi);
    taps *= static_cast<double>(hi);
  }
  return taps;
}

void PoolRef(KernelContext& ctx, PoolKind kind) {
  const Node& node = ctx.node;
  const Tensor& x = ctx.In(0);
  Tensor& y = ctx.Out(0);
  const Window3 g = MakeWindow(node, x.shape(), y.shape(), node.GetInts("kernel_shape"));
  const int64_t planes = x.dim(0) * x.dim(1), in_vol = g.InVol(), out_vol = g.OutVol();
  const bool count_include_pad = node.GetInt("count_include_pad", 0) != 0;
  const bool column_major = node.GetInt("storage_order", 0) != 0;
  const int64_t p = node.GetInt("p", 2);
  int64_t* indices = kind == PoolKind::kMax && HasOut(ctx, 1, y.numel()) ? ctx.Out(1).data<int64_t>() : nullptr;
  const float* xd = x.data<float>();
  float* yd = y.data<float>();
  // Work per output: at most the input's extent per dim (a window's KVol may overflow).
  const int64_t taps_bound = std::min(g.k[0], g.in[0]) * std::min(g.k[1], g.in[1]) * std::min(g.k[2], g.in[2]);
#pragma omp parallel for if (planes * out_vol * taps_bound >= kMinParallelWork)
  for (int64_t plane = 0; plane < planes; ++plane) {
    const float* xp = xd + plane * in_vol;
    float* yp = yd + plane * out_vol;
    int64_t out_index = 0;
    for (int64_t oz = 0; oz < g.out[0]; ++oz)
      for (int64_t oy = 0; oy < g.out[1]; ++oy)
        for (int64_t ox = 0; ox < g.out[2]; ++ox, ++out_index) {
          const int64_t z0 = oz * g.s[0] - g.pb[0], y0 = oy * g.s[1] - g.pb[1], x0 = ox * g.s[2] - g.pb[2];
          double acc = 0;
          float best = std::numeric_limits<float>::lowest();
          int64_t best_index = -1, valid = 0;
          const int64_t start[3] = {z0, y0, x0};
          int64_t lo[3], hi[3];
          for (int i = 0; i < 3; ++i) WindowTapsWithin(start[i], g.k[i], g.d[i], g.in[i], &lo[i], &hi[i]);
          for (int64_t kz = lo[0]; kz < hi[0]; ++kz) {
            const int64_t iz = z0 + kz * g.d[0];
            for (int64_t ky = lo[1]; ky < hi[1]; ++ky) {
              const int64_t iy = y0 + ky * g.d[1];
              for (int64_t kx = lo[2]; kx < hi[2]; ++kx) {
                const int64_t ix = x0 + kx * g.d[2];
                ++valid;
                const float v = xp[(iz * g.in[1] + iy) * g.in[2] + ix];
                if (kind == PoolKind::kMax) {
                  if (v > best || best_index < 0) {
                    best = v;
                    best_index = column_major ? iz + g.in[0] * (iy + g.in[1] * ix) : (iz * g.in[1] + iy) * g.in[2] + ix;
                  }
                } else if (kind == PoolKind::kAverage) {
                  acc += v;
                } else {
                  acc += p == 2 ? static_cast<double>(v) * v : std::pow(std::fabs(static_cast<double>(v)), p);
                }
              }
            }
          }
          if (kind == PoolKind::kMax) {
            yp[out_index] = best;
            if (indices) indices[plane * out_vol + out_index] = best_index < 0 ? -1 : plane * in_vol + best_index;
          } else if (kind == PoolKind::kAverage) {
            const double divisor = count_include_pad ? PaddedTaps(g, start) : static_cast<double>(valid);
            yp[out_index] = divisor > 0 ? static_cast<float>(acc / divisor) : 0.f;
          } else {
            yp[out_index] = static_cast<float>(p == 2 ? std::sqrt(acc) : std::pow(acc, 1.0 / p));
          }
        }
  }
}

// int8 / uint8 MaxPool: the float pool on an exact float copy (every 8-bit value is a float), converted back.
template <class T>
void MaxPool8BitRef(KernelContext& ctx) {
  const Tensor& x = ctx.In(0);
  Tensor& y = ctx.Out(0);
  Tensor xf(DType::kF32, x.shape()), yf(DType::kF32, y.shape());
  for (int64_t i = 0; i < x.numel(); ++i) xf.data<float>()[i] = x.data<T>()[i];
  KernelContext fctx{ctx.node, ctx.opset, {&xf}, {&yf}};
  if (ctx.outputs.size() > 1) fctx.outputs.push_back(ctx.outputs[1]);
  PoolRef(fctx, PoolKind::kMax);
  for (int64_t i = 0; i < y.numel(); ++i) y.data<T>()[i] = static_cast<T>(yf.data<float>()[i]);
}

void MaxPoolRef(KernelContext& ctx) {
  if (ctx.In(0).dtype() == DType::kI8)
    MaxPool8BitRef<int8_t>(ctx);
  else if (ctx.In(0).dtype() == DType::kU8)
    MaxPool8BitRef<uint8_t>(ctx);
  else
    PoolRef(ctx, PoolKind::kMax);
}
void AveragePoolRef(KernelContext& ctx) { PoolRef(ctx, PoolKind::kAverage); }
void LpPoolRef(KernelContext& ctx) { PoolRef(ctx, PoolKind::kLp); }

void GlobalPoolRef(KernelContext& ctx, bool is_max) {
  const Tensor& x = ctx.In(0);
  const int64_t planes = x.dim(0) * x.dim(1), size = Product(x.shape(), 2, x.shape().size());
  const float* xd = x.data<float>();
  float* yd = ctx.Out(0).data<float>();
#pragma omp parallel for if (planes * size >= kMinParallelWork)
  for (int64_t p = 0; p < planes; ++p) {
    const float* xp = xd + p * size;
    if (is_max) {
      float best = size > 0 ? xp[0] : 0.f;
      for (int64_t i = 1; i < size; ++i) best = std::max(best, xp[i]);
      yd[p] = best;
    } else {
      double sum = 0;
      for (int64_t i = 0; i < size; ++i) sum += xp[i];
      yd[p] = size > 0 ? static_cast<float>(sum / size) : 0.f;
    }
  }
}

void GlobalAveragePoolRef(KernelContext& ctx) { GlobalPoolRef(ctx, false); }
void GlobalMaxPoolRef(KernelContext& ctx) { GlobalPoolRef(ctx, true); }

// ---------------------------------------------------------------- normalisations

void BatchNormalizationRef(KernelContext& ctx) {
  const Tensor& x = ctx.In(0);
  const float epsilon = ctx.node.GetFloat("epsilon", 1e-5f);
  const int64_t batch = x.dim(0), channels = x.dim(1), size = Product(x.shape(), 2, x.shape().size());
  const float* scale = ctx.In(1).data<float>();
  const float* shift = ctx.In(2).data<float>();
  const float* mean = ctx.In(3).data<float>();
  const float* var = ctx.In(4).data<float>();
  const float* xd = x.data<float>();
  // Training mode (schema: opset 14+): X's own per-channel mean and (biased) variance over N and the spatial dims, in
  // double; outputs 1 and 2, when asked for, are the running statistics input * momentum + current * (1 - momentum).
  std::vector<float> batch_mean, batch_var;
  if (ctx.opset >= 14 && ctx.node.GetInt("training_mode", 0) != 0) {
    const double count = static_cast<double>(batch * size);
    const double momentum = ctx.node.GetFloat("momentum", 0.9f);
    batch_mean.resize(static_cast<size_t>(channels));
    batch_var.resize(static_cast<size_t>(channels));
    // No values (N or a spatial dim 0, maybe beside a huge one): the sums are empty, so no loops over the others.
    for (int64_t c = 0; c < channels && count > 0; ++c) {
      double sum = 0, sum_sq = 0;
      for (int64_t n = 0; n < batch; ++n)
        for (int64_t i = 0; i < size; ++i) sum += xd[(n * channels + c) * size + i];
      const double m = count > 0 ? sum / count : 0;
      for (int64_t n = 0; n < batch; ++n)
        for (int64_t i = 0; i < size; ++i) {
          const double d = xd[(n * channels + c) * size + i] - m;
          sum_sq += d * d;
        }
      batch_mean[c] = static_cast<float>(m);
      batch_var[c] = static_cast<float>(count > 0 ? sum_sq / count : 0);
    }
    for (int k = 1; k < 3; ++k)
      if (k < static_cast<int>(ctx.outputs.size()) && ctx.outputs[k] != nullptr) {
        const float* input = k == 1 ? mean : var;
        const std::vector<float>& current = k == 1 ? batch_mean : batch_var;
        float* out = ctx.Out(k).data<float>();
        for (int64_t c = 0; c < channels; ++c)
          out[c] = static_cast<float>(input[c] * momentum + current[c] * (1 - momentum));
      }
    mean = batch_mean.data();
    var = batch_var.data();
  }
  float* yd = ctx.Out(0).data<float>();
  if (x.numel() == 0) return;
#pragma omp parallel for if (x.numel() >= kMinParallelWork)
  for (int64_t p = 0; p < batch * channels; ++p) {
    const int64_t c = p % channels;
    float a, b;
    BatchNormFactors(scale[c], shift[c], mean[c], var[c], epsilon, &a, &b);
    const float* xp = xd + p * size;
    float* yp = yd + p * size;
    for (int64_t i = 0; i < size; ++i) yp[i] = xp[i] * a + b;
    ApplyFusedActivation(ctx.node, yp, size);  // BN + activation fused by the runtime (docs/architecture.md)
  }
}

// RoiAlign, as the ONNX reference computes it: each output cell averages (or takes the largest weighted tap of) a grid
// of bilinear samples, sampling_ratio per side or ceil(roi size / output size) when 0; half_pixel shifts the roi by
// -0.5 (opset 16's default; before it the op had no shift and forced malformed rois to 1x1). Samples off the map by
// more than one pixel count zero. A roi whose sampling grid would exceed 2^24 taps, or with a non-finite coordinate,
// is refused (a hostile box must not buy unbounded work).
void RoiAlignRef(KernelContext& ctx) {
  const Tensor& x = ctx.In(0);
  const Tensor& rois = ctx.In(1);
  const Tensor& batch_indices = ctx.In(2);
  Tensor& y = ctx.Out(0);
  const int64_t n = x.dim(0), channels = x.dim(1), height = x.dim(2), width = x.dim(3);
  const int64_t oh = y.dim(2), ow = y.dim(3);
  const bool avg = ctx.node.GetString("mode", "avg") == "avg";
  const bool half_pixel =
      ctx.opset >= 16 && ctx.node.GetString("coordinate_transformation_mode", "half_pixel") == "half_pixel";
  const int64_t ratio = ctx.node.GetInt("sampling_ratio", 0);
  const double scale = ctx.node.GetFloat("spatial_scale", 1.f);
  const float* xd = x.data<float>();
  const float* rd = rois.data<float>();
  float* yd = y.data<float>();
  struct Tap {
    int64_t pos[4];
    double w[4];
  };
  std::vector<Tap> taps;
  for (int64_t r = 0; r < rois.dim(0); ++r) {
    const int64_t b = batch_indices.GetAsInt(r);
    if (b < 0 || b >= n)
      throw Error(ErrorCode::kInvalidArgument, ctx.node.Describe() + ": batch_indices[" + std::to_string(r) + "] = " +
                                                   std::to_string(b) + " is outside [0, " + std::to_string(n) + ")");
    const double offset = half_pixel ? 0.5 : 0.0;
    const double x0 = rd[r * 4] * scale - offset, y0 = rd[r * 4 + 1] * scale - offset;
    const double x1 = rd[r * 4 + 2] * scale - offset, y1 = rd[r * 4 + 3] * scale - offset;
    if (!std::isfinite(x0) || !std::isfinite(y0) || !std::isfinite(x1) || !std::isfinite(y1))
      throw Error(ErrorCode::kInvalidArgument, ctx.node.Describe() + ": roi " + std::to_string(r) + " is not finite");
    double roi_w = x1 - x0, roi_h = y1 - y0;
    if (!half_pixel) roi_w = std::max(roi_w, 1.0), roi_h = std::max(roi_h, 1.0);
    const double bin_h = roi_h / oh, bin_w = roi_w / ow;
    const double grid_h_d = ratio > 0 ? ratio : std::ceil(roi_h / oh),
                 grid_w_d = ratio > 0 ? ratio : std::ceil(roi_w / ow);
    if (grid_h_d * grid_w_d * oh * ow > static_cast<double>(int64_t{1} << 24))
      throw Error(ErrorCode::kInvalidArgument,
                  ctx.node.Describe() + ": roi " + std::to_string(r) +
                      " needs more than 2^24 samples, osprey's limit (a box far larger than the feature map?)");
    const int64_t grid_h = static_cast<int64_t>(std::max(grid_h_d, 0.0)),
                  grid_w = static_cast<int64_t>(std::max(grid_w_d, 0.0));
    const double count = std::max<double>(static_cast<double>(grid_h * grid_w), 1.0);
    taps.assign(static_cast<size_t>(oh * ow * grid_h * grid_w), Tap{});
    size_t t = 0;
    for (int64_t ph = 0; ph < oh; ++ph)
      for (int64_t pw = 0; pw < ow; ++pw)
        for (int64_t iy = 0; iy < grid_h; ++iy) {
          const double yy = y0 + ph * bin_h + (iy + 0.5) * bin_h / grid_h;
          for (int64_t ix = 0; ix < grid_w; ++ix, ++t) {
            double xx = x0 + pw * bin_w + (ix + 0.5) * bin_w / grid_w, yv = yy;
            if (yv < -1.0 || yv > height || xx < -1.0 || xx > width) continue;  // all weights 0
            yv = std::max(yv, 0.0);
            xx = std::max(xx, 0.0);
            int64_t y_low = static_cast<int64_t>(yv), x_low = static_cast<int64_t>(xx), y_high, x_high;
            if (y_low >= height - 1) {
              y_high = y_low = height - 1;
              yv = static_cast<double>(y_low);
            } else {
              y_high = y_low + 1;
            }
            if (x_low >= width - 1) {
              x_high = x_low = width - 1;
              xx = static_cast<double>(x_low);
            } else {
              x_high = x_low + 1;
            }
            const double ly = yv - y_low, lx = xx - x_low, hy = 1 - ly, hx = 1 - lx;
            taps[t] =
                Tap{{y_low * width + x_low, y_low * width + x_high, y_high * width + x_low, y_high * width + x_high},
                    {hy * hx, hy * lx, ly * hx, ly * lx}};
          }
        }
    for (int64_t c = 0; c < channels; ++c) {
      const float* plane = xd + (b * channels + c) * height * width;
      float* out = yd + ((r * channels + c) * oh) * ow;
      size_t k = 0;
      for (int64_t cell = 0; cell < oh * ow; ++cell) {
        double value = 0;
        for (int64_t s = 0; s < grid_h * grid_w; ++s, ++k) {
          const Tap& tap = taps[k];
          if (avg) {
            for (int q = 0; q < 4; ++q) value += tap.w[q] * plane[tap.pos[q]];
          } else {
            double m = tap.w[0] * plane[tap.pos[0]];
            for (int q = 1; q < 4; ++q) m = std::max(m, tap.w[q] * plane[tap.pos[q]]);
            value = s == 0 ? m : std::max(value, m);
          }
        }
        out[cell] = static_cast<float>(avg ? value / count : value);
      }
    }
  }
}

// Normalisation over groups of channels: per (sample, group), mean and variance over the group's channels and spatial
// dims (double); scale and bias per group or per channel, by their length; then a fused `_activation`, if any.
// GroupNormalization; InstanceNormalization is the case of one channel per group.
void NormalizeChannelGroups(KernelContext& ctx, int64_t groups) {
  const Tensor& x = ctx.In(0);
  const float epsilon = ctx.node.GetFloat("epsilon", 1e-5f);
  const int64_t batch = x.dim(0), channels = x.dim(1), spatial = Product(x.shape(), 2, x.shape().size());
  const int64_t per_group = channels / groups, size = per_group * spatial;
  const bool per_channel = ctx.In(1).numel() == channels;
  const float* scale = ctx.In(1).data<float>();
  const float* shift = ctx.In(2).data<float>();
  const float* xd = x.data<float>();
  float* yd = ctx.Out(0).data<float>();
#pragma omp parallel for if (x.numel() >= kMinParallelWork)
  for (int64_t p = 0; p < batch * groups; ++p) {
    const int64_t g = p % groups;
    const float* xp = xd + p * size;
    float* yp = yd + p * size;
    double sum = 0, sum_sq = 0;
    for (int64_t i = 0; i < size; ++i) sum += xp[i];
    const double mean = size > 0 ? sum / size : 0;
    for (int64_t i = 0; i < size; ++i) sum_sq += (xp[i] - mean) * (xp[i] - mean);
    const double inv_std = 1.0 / std::sqrt((size > 0 ? sum_sq / size : 0) + epsilon);
    for (int64_t i = 0; i < size; ++i) {
      const int64_t k = per_channel ? g * per_group + i / spatial : g;
      yp[i] = static_cast<float>((xp[i] - mean) * inv_std * scale[k] + shift[k]);
    }
    ApplyFusedActivation(ctx.node, yp, size);  // GroupNorm + activation fused by the runtime
  }
}
void GroupNormalizationRef(KernelContext& ctx) { NormalizeChannelGroups(ctx, ctx.node.GetInt("num_groups", 1)); }
void InstanceNormalizationRef(KernelContext& ctx) { NormalizeChannelGroups(ctx, ctx.In(0).dim(1)); }

// MeanVarianceNormalization: each element's group is its position on the axes not normalised over.
void MeanVarianceNormalizationRef(KernelContext& ctx) {
  const Tensor& x = ctx.In(0);
  const int64_t rank = x.rank();
  std::vector<bool> reduced(static_cast<size_t>(rank), false);
  for (int64_t a : ctx.node.GetInts("axes", {0, 2, 3})) reduced[static_cast<size_t>(a < 0 ? a + rank : a)] = true;
  const int64_t n = x.numel();
  std::vector<int64_t> group(static_cast<size_t>(n));
  int64_t groups = 1;
  for (int64_t d = 0; d < rank; ++d)
    if (!reduced[d]) groups *= x.dim(d);
  for (int64_t i = 0; i < n; ++i) {
    int64_t rem = i, id = 0, stride = 1;
    for (int64_t d = rank - 1; d >= 0; --d) {
      const int64_t c = rem % x.dim(d);
      rem /= x.dim(d);
      if (!reduced[d]) {
        id += c * stride;
        stride *= x.dim(d);
      }
    }
    group[i] = id;
  }
  const float* xd = x.data<float>();
  float* yd = ctx.Out(0).data<float>();
  std::vector<double> sum(static_cast<size_t>(groups), 0.0), sum_sq(static_cast<size_t>(groups), 0.0);
  std::vector<int64_t> count(static_cast<size_t>(groups), 0);
  for (int64_t i = 0; i < n; ++i) {
    sum[group[i]] += xd[i];
    ++count[group[i]];
  }
  for (int64_t g = 0; g < groups; ++g) sum[g] = count[g] ? sum[g] / count[g] : 0;  // the means
  for (int64_t i = 0; i < n; ++i) sum_sq[group[i]] += (xd[i] - sum[group[i]]) * (xd[i] - sum[group[i]]);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t g = group[i];
    const double stddev = std::sqrt(count[g] ? sum_sq[g] / count[g] : 0);
    yd[i] = static_cast<float>((xd[i] - sum[g]) / (stddev + 1e-9));
  }
}

void LayerNormalizationRef(KernelContext& ctx) {
  const Tensor& x = ctx.In(0);
  const int64_t rank = x.rank();
  const int64_t axis = NormalizeAxis(ctx.node.GetInt("axis", -1), rank, ctx.node);
  const float epsilon = ctx.node.GetFloat("epsilon", 1e-5f);
  const Shape normalized(x.shape().begin() + axis, x.shape().end());
  const int64_t rows = Product(x.shape(), 0, axis), size = NumElements(normalized);
  const std::vector<float> scale = ExpandTo(ctx.In(1), normalized);
  const std::vector<float> shift = ctx.HasIn(2) ? ExpandTo(ctx.In(2), normalized) : std::vector<float>(size, 0.f);
  float* mean_out = HasOut(ctx, 1, rows) ? ctx.Out(1).data<float>() : nullptr;
  float* inv_std_out = HasOut(ctx, 2, rows) ? ctx.Out(2).data<float>() : nullptr;
  const float* xd = x.data<float>();
  float* yd = ctx.Out(0).data<float>();
#pragma omp parallel for if (x.numel() >= kMinParallelWork)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = xd + r * size;
    float* yr = yd + r * size;
    double sum = 0, sum_sq = 0;
    for (int64_t i = 0; i < size; ++i) sum += xr[i];
    const double mean = size > 0 ? sum / size : 0;
    for (int64_t i = 0; i < size; ++i) sum_sq += (xr[i] - mean) * (xr[i] - mean);
    const double inv_std = 1.0 / std::sqrt((size > 0 ? sum_sq / size : 0) + epsilon);
    for (int64_t i = 0; i < size; ++i) yr[i] = static_cast<float>((xr[i] - mean) * inv_std * scale[i] + shift[i]);
    if (mean_out) mean_out[r] = static_cast<float>(mean);
    if (inv_std_out) inv_std_out[r] = static_cast<float>(inv_std);
  }
}

void LRNRef(KernelContext& ctx) {
  const Tensor& x = ctx.In(0);
  const float alpha = ctx.node.GetFloat("alpha", 1e-4f), beta = ctx.node.GetFloat("beta", 0.75f);
  const float bias = ctx.node.GetFloat("bias", 1.f);
  const int64_t size = ctx.node.GetInt("size", 1);
  const int64_t before = (size - 1) / 2, after = size - 1 - before;  // floor and ceil of (size - 1) / 2
  const int64_t batch = x.dim(0), channels = x.dim(1), spatial = Product(x.shape(), 2, x.shape().size());
  const float* xd = x.data<float>();
  float* yd = ctx.Out(0).data<float>();
#pragma omp parallel for if (x.numel() * size >= kMinParallelWork)
  for (int64_t p = 0; p < batch * channels; ++p) {
    const int64_t n = p / channels, c = p % channels;
    std::vector<double> square_sum(spatial, 0.0);
    for (int64_t j = std::max<int64_t>(0, c - before); j <= std::min(channels - 1, c + after); ++j) {
      const float* xj = xd + (n * channels + j) * spatial;
      for (int64_t i = 0; i < spatial; ++i) square_sum[i] += static_cast<double>(xj[i]) * xj[i];
    }
    const float* xp = xd + p * spatial;
    float* yp = yd + p * spatial;
    for (int64_t i = 0; i < spatial; ++i)
      yp[i] = static_cast<float>(xp[i] / std::pow(bias + alpha / size * square_sum[i], static_cast<double>(beta)));
  }
}

// ---------------------------------------------------------------- MatMul / Gemm

void MatMulRef(KernelContext& ctx) {
  Tensor a = ctx.In(0);
  Tensor b = ctx.In(1);
  Tensor& y = ctx.Out(0);
  const bool int8 = ctx.node.GetInt("_int8", 0) != 0;  // Int8Grid, above
  if (int8) {
    a = a.Clone();
    Int8Grid(ctx.node, "x", a.data<float>(), a.numel());
    if (ctx.node.Has("_int8_b_scale")) {  // B an activation quantised too
      b = b.Clone();
      Int8Grid(ctx.node, "b", b.data<float>(), b.numel());
    }
  }
  const MatMulBatches mm = BatchedMatMul(a.shape(), b.shape());
  const int64_t m = mm.m, k = mm.k, n = mm.n;
  const float* ad = a.data<float>();
  const float* bd = b.data<float>();
  float* yd = y.data<float>();
  std::vector<GemmOperands> ops(mm.offsets.size());
  for (size_t i = 0; i < ops.size(); ++i)
    ops[i] = {ad + mm.offsets[i].first, bd + mm.offsets[i].second, yd + static_cast<int64_t>(i) * m * n};
  RunGemms(ops, m, n, k, k, n, n);
  if (ctx.node.GetInt("_bias", 0) != 0 && ctx.HasIn(2)) {
    // Fused bias (see the MatMul schema): a [N] row added to every row, before the fused activation.
    const float* bias = ctx.In(2).data<float>();
    const int64_t rows = n > 0 ? y.numel() / n : 0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < n; ++j) yd[r * n + j] += bias[j];
  }
  if (ctx.node.GetInt("_residual", 0) != 0 && ctx.HasIn(3)) {
    // Fused residual (see the MatMul schema): input 3, of the output's shape, added before the fused activation.
    const float* residual = ctx.In(3).data<float>();
    for (int64_t i = 0; i < y.numel(); ++i) yd[i] += residual[i];
  }
  ApplyFusedActivation(ctx.node, yd, y.numel());
  if (int8) Int8Grid(ctx.node, "y", yd, y.numel());
}

// The product of the views a (of ad) and b (of bd) as ProductOf gives it, each output element summed in double, times
// `scale`, stored at its position in y (product.output_strides).
void ViewsProductRef(const float* ad, const StridedView& a, const float* bd, const StridedView& b, float scale,
                     const ViewProduct& product, float* yd) {
  const size_t rank = a.dims.size();
  const Shape& p = product.dims;
  const std::vector<int64_t>& y_stride = product.output_strides;
  const int64_t k_extent = a.dims[rank - 1];
  std::vector<int64_t> index(rank, 0);
  for (int64_t flat = 0, total = NumElements(p); flat < total; ++flat) {
    int64_t rest = flat, ao = a.offset, bo = b.offset, yo = 0;
    for (size_t d = rank; d-- > 0;) {
      index[d] = rest % p[d];
      rest /= p[d];
      yo += index[d] * y_stride[d];
      if (d + 2 < rank) {
        ao += (a.dims[d] == 1 ? 0 : index[d]) * a.strides[d];
        bo += (b.dims[d] == 1 ? 0 : index[d]) * b.strides[d];
      }
    }
    ao += index[rank - 2] * a.strides[rank - 2];
    bo += index[rank - 1] * b.strides[rank - 1];
    double sum = 0;
    for (int64_t k = 0; k < k_extent; ++k)
      sum += static_cast<double>(ad[ao + k * a.strides[rank - 1]]) * bd[bo + k * b.strides[rank - 2]];
    yd[yo] = static_cast<float>(sum * scale);
  }
}

// _MatMulViews (ops/matmul_views.h): each operand read through its strides, the product summed in double per output
// element, times `scale`, stored at the output's position (permuted by `out_perm`).
void MatMulViewsRef(KernelContext& ctx) {
  const StridedView a = ReadView(ctx.node, "a"), b = ReadView(ctx.node, "b");
  ViewsProductRef(ctx.In(0).data<float>(), a, ctx.In(1).data<float>(), b, ctx.node.GetFloat("scale", 1.f),
                  ProductOf(ctx.node, a, b), ctx.Out(0).data<float>());
}

// _AttentionViews (ops/matmul_views.h): for each batch index and query row, its scores scale x q k summed in double
// (plus the bias), a softmax in double, then the context row, summed in double: the three ops it stands for, one row at a time (memory
// for one row of scores, however many rows there are).
void AttentionViewsRef(KernelContext& ctx) {
  const StridedView q = ReadView(ctx.node, "q"), k = ReadView(ctx.node, "k"), v = ReadView(ctx.node, "v");
  const AttentionProducts p = AttentionOf(ctx.node, q, k, v);
  const float* qd = ctx.In(0).data<float>();
  const float* kd = ctx.In(1).data<float>();
  const float* vd = ctx.In(2).data<float>();
  float* yd = ctx.Out(0).data<float>();
  const double scale = ctx.node.GetFloat("scale", 1.f);
  const size_t rank = q.dims.size();
  const int64_t rows = p.scores[rank - 2], keys = p.scores[rank - 1], depth = q.dims[rank - 1];
  const int64_t width = v.dims[rank - 1];
  const std::vector<int64_t>& y_stride = p.context.output_strides;
  std::vector<double> s(static_cast<size_t>(keys));
  const bool has_bias = ctx.HasIn(3);
  const StridedView bias = has_bias ? BroadcastView(ctx.In(3).shape(), p.scores) : StridedView{};
  const float* bd = has_bias ? ctx.In(3).data<float>() : nullptr;
  const Shape& c = p.context.dims;  // batch axes: q's, k's and v's broadcast
  for (int64_t b = 0, batches = NumElements(c) / (c[rank - 2] * c[rank - 1]); b < batches; ++b) {
    int64_t qo = q.offset, ko = k.offset, vo = v.offset, yo = 0, bo = 0;
    for (int64_t d = static_cast<int64_t>(rank) - 3, rest = b; d >= 0; --d) {
      const int64_t i = rest % c[d];
      rest /= c[d];
      if (has_bias && p.scores[d] != 1) bo += i * bias.strides[d];
      qo += (q.dims[d] == 1 ? 0 : i) * q.strides[d];
      ko += (k.dims[d] == 1 ? 0 : i) * k.strides[d];
      vo += (v.dims[d] == 1 ? 0 : i) * v.strides[d];
      yo += i * y_stride[d];
    }
    for (int64_t i = 0; i < rows; ++i) {
      double top = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < keys; ++j) {
        double sum = 0;
        for (int64_t d = 0; d < depth; ++d)
          sum += static_cast<double>(qd[qo + i * q.strides[rank - 2] + d * q.strides[rank - 1]]) *
                 kd[ko + d * k.strides[rank - 2] + j * k.strides[rank - 1]];
        float score = static_cast<float>(sum * scale);  // the scores as the unfused graph holds them
        if (has_bias) score += bd[bo + i * bias.strides[rank - 2] + j * bias.strides[rank - 1]];
        s[j] = score;
        top = std::max(top, s[j]);
      }
      double total = 0;
      for (double& x : s) total += (x = std::exp(x - top));
      for (int64_t e = 0; e < width; ++e) {
        double sum = 0;
        for (int64_t j = 0; j < keys; ++j)
          sum += static_cast<double>(static_cast<float>(s[j] / total)) *
                 vd[vo + j * v.strides[rank - 2] + e * v.strides[rank - 1]];
        yd[yo + i * y_stride[rank - 2] + e * y_stride[rank - 1]] = static_cast<float>(sum);
      }
    }
  }
}

std::vector<float> Transposed(const float* src, int64_t rows, int64_t cols) {
  std::vector<float> t(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[c * rows + r] = src[r * cols + c];
  return t;
}

void GemmRef(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& a = ctx.In(0);
  const Tensor& b = ctx.In(1);
  Tensor& y = ctx.Out(0);
  const bool trans_a = node.GetInt("transA", 0) != 0, trans_b = node.GetInt("transB", 0) != 0;
  const float alpha = node.GetFloat("alpha", 1.f), beta = node.GetFloat("beta", 1.f);
  const int64_t m = y.dim(0), n = y.dim(1), k = trans_a ? a.dim(0) : a.dim(1);
  std::vector<float> at, bt;
  const float* ad = a.data<float>();
  const float* bd = b.data<float>();
  if (trans_a) {
    at = Transposed(ad, k, m);
    ad = at.data();
  }
  if (trans_b) {
    bt = Transposed(bd, n, k);
    bd = bt.data();
  }
  float* yd = y.data<float>();
  RunGemms({{ad, bd, yd}}, m, n, k, k, n, n);
  if (alpha != 1.f)
    for (int64_t i = 0; i < m * n; ++i) yd[i] *= alpha;
  if (ctx.HasIn(2) && beta != 0.f) {
    const std::vector<float> c = ExpandTo(ctx.In(2), Shape{m, n});
    for (int64_t i = 0; i < m * n; ++i) yd[i] += beta * c[i];
  }
  ApplyFusedActivation(node, yd, y.numel());
}

// ---------------------------------------------------------------- softmax family

enum class SoftmaxKind { kSoftmax, kLogSoftmax, kHardmax };

// Opset < 13 coerces the input to 2-D [prod(dims[:axis]), prod(dims[axis:])] and normalises each row; opset >= 13
// normalises along the one axis.
void SoftmaxFamilyRef(KernelContext& ctx, SoftmaxKind kind) {
  const Tensor& x = ctx.In(0);
  const Shape& s = x.shape();
  const bool legacy = ctx.opset < 13;
  const int64_t axis = NormalizeAxis(ctx.node.GetInt("axis", legacy ? 1 : -1), x.rank(), ctx.node);
  const int64_t outer = Product(s, 0, axis);
  const int64_t len = legacy ? Product(s, axis, s.size()) : s[axis];
  const int64_t inner = legacy ? 1 : Product(s, axis + 1, s.size());
  const float* xd = x.data<float>();
  float* yd = ctx.Out(0).data<float>();
  if (len == 0) return;
#pragma omp parallel for if (x.numel() >= kMinParallelWork)
  for (int64_t t = 0; t < outer * inner; ++t) {
    const int64_t base = (t / inner) * len * inner + t % inner;
    const float* xp = xd + base;
    float* yp = yd + base;
    float max_value = xp[0];
    int64_t max_index = 0;
    for (int64_t i = 1; i < len; ++i)
      if (xp[i * inner] > max_value) {
        max_value = xp[i * inner];
        max_index = i;
      }
    if (kind == SoftmaxKind::kHardmax) {
      for (int64_t i = 0; i < len; ++i) yp[i * inner] = i == max_index ? 1.f : 0.f;
      continue;
    }
    double sum = 0;
    for (int64_t i = 0; i < len; ++i) sum += std::exp(static_cast<double>(xp[i * inner]) - max_value);
    if (kind == SoftmaxKind::kSoftmax) {
      for (int64_t i = 0; i < len; ++i)
        yp[i * inner] = static_cast<float>(std::exp(static_cast<double>(xp[i * inner]) - max_value) / sum);
    } else {
      const double log_sum = std::log(sum);
      for (int64_t i = 0; i < len; ++i)
        yp[i * inner] = static_cast<float>(static_cast<double>(xp[i * inner]) - max_value - log_sum);
    }
  }
}

void SoftmaxRef(KernelContext& ctx) { SoftmaxFamilyRef(ctx, SoftmaxKind::kSoftmax); }
void LogSoftmaxRef(KernelContext& ctx) { SoftmaxFamilyRef(ctx, SoftmaxKind::kLogSoftmax); }
void HardmaxRef(KernelContext& ctx) { SoftmaxFamilyRef(ctx, SoftmaxKind::kHardmax); }

// AffineGrid: each output point is theta times its base coordinates (x, y[, z], 1), in double; a base coordinate along
// an axis of length L is -1 + 2i / (L - 1) with align_corners (-1 for L = 1), else -1 + (2i + 1) / L.
void AffineGridRef(KernelContext& ctx) {
  const Tensor& theta = ctx.In(0);
  Tensor& grid = ctx.Out(0);
  const int64_t dims = theta.dim(1);  // 2 or 3
  const bool align = ctx.node.GetInt("align_corners", 0) != 0;
  const int64_t batch = grid.dim(0);
  std::vector<int64_t> extent(static_cast<size_t>(dims));  // W, H[, D]: the point's x, y, z axes
  for (int64_t k = 0; k < dims; ++k) extent[k] = grid.dim(dims - k);
  auto base = [align](int64_t i, int64_t length) {
    if (align) return length == 1 ? -1.0 : -1.0 + 2.0 * static_cast<double>(i) / static_cast<double>(length - 1);
    return -1.0 + (2.0 * static_cast<double>(i) + 1.0) / static_cast<double>(length);
  };
  const int64_t points = grid.numel() / (batch * dims);
  const float* t = theta.data<float>();
  float* out = grid.data<float>();
  for (int64_t n = 0; n < batch; ++n)
    for (int64_t p = 0; p < points; ++p) {
      double coord[4] = {0, 0, 0, 1};
      int64_t rem = p;
      for (int64_t k = 0; k < dims; ++k) {
        coord[k] = base(rem % extent[k], extent[k]);
        rem /= extent[k];
      }
      coord[dims] = 1;
      for (int64_t r = 0; r < dims; ++r) {
        const float* row = t + (n * dims + r) * (dims + 1);
        double v = 0;
        for (int64_t c = 0; c <= dims; ++c) v += static_cast<double>(row[c]) * coord[c];
        out[(n * points + p) * dims + r] = static_cast<float>(v);
      }
    }
}

// GridSample: each output point is the weighted sum of its taps (ops/grid_sample.h), in double, channel by channel.
void GridSampleRef(KernelContext& ctx) {
  const Tensor& x = ctx.In(0);
  const Tensor& grid = ctx.In(1);
  Tensor& y = ctx.Out(0);
  const int64_t batch = x.dim(0), channels = x.dim(1), h = x.dim(2), w = x.dim(3);
  const int64_t points = grid.dim(1) * grid.dim(2);
  if (y.shape() != Shape{batch, channels, grid.dim(1), grid.dim(2)})
    throw Error(ErrorCode::kInternal, ctx.node.Describe() + ": output allocated as " + ShapeToString(y.shape()));
  const GridSampleParams p = ReadGridSample(ctx.node, h, w);
  int64_t offset[kMaxGridTaps];
  float weight[kMaxGridTaps];
  for (int64_t n = 0; n < batch; ++n)
    for (int64_t c = 0; c < channels; ++c) {
      const float* plane = x.data<float>() + (n * channels + c) * h * w;
      for (int64_t i = 0; i < points; ++i) {
        const float* g = grid.data<float>() + (n * points + i) * 2;
        const int taps = GridTaps(p, g[0], g[1], offset, weight);
        double sum = taps < 0 ? std::numeric_limits<double>::quiet_NaN() : 0.0;
        for (int t = 0; t < taps; ++t) sum += static_cast<double>(weight[t]) * plane[offset[t]];
        y.data<float>()[(n * channels + c) * points + i] = static_cast<float>(sum);
      }
    }
}

// Einsum by its definition: every combination of the labels (output labels outer, summed ones inner), each term the
// product of the inputs' elements there; sums in double (float) or int64. Two-input contractions without diagonals
// never get here in a compiled model (runtime lowers them to MatMul); this is their oracle and everything else's
// kernel, so it refuses work above kMaxEinsumWork instead of holding a CPU for minutes.
template <class T>
void EinsumLoop(const EinsumSpec& spec, const std::vector<const T*>& in, T* out) {
  using Acc = std::conditional_t<std::is_floating_point_v<T>, double, int64_t>;
  std::vector<int> order = spec.output;
  const size_t n_out = order.size();
  for (int l = 0; l < static_cast<int>(spec.sizes.size()); ++l)
    if (std::find(spec.output.begin(), spec.output.end(), l) == spec.output.end()) order.push_back(l);
  const size_t labels = order.size(), inputs = in.size();
  std::vector<int64_t> pos(labels, 0), off(inputs, 0);
  int64_t out_elems = 1, inner = 1;
  for (size_t k = 0; k < labels; ++k) (k < n_out ? out_elems : inner) *= spec.sizes[order[k]];
  // Steps the odometer over labels [first, last); returns false when it wrapped all of them.
  auto step = [&](size_t first, size_t last) {
    for (size_t k = last; k-- > first;) {
      const int l = order[k];
      if (++pos[k] < spec.sizes[l]) {
        for (size_t i = 0; i < inputs; ++i) off[i] += spec.strides[i][l];
        return true;
      }
      for (size_t i = 0; i < inputs; ++i) off[i] -= spec.strides[i][l] * (spec.sizes[l] - 1);
      pos[k] = 0;
    }
    return false;
  };
  for (int64_t o = 0; o < out_elems; ++o) {
    Acc acc = 0;
    for (int64_t r = 0; r < inner; ++r) {
      Acc term = 1;
      for (size_t i = 0; i < inputs; ++i) term *= static_cast<Acc>(in[i][off[i]]);
      acc += term;
      if (r + 1 < inner) step(n_out, labels);
    }
    if (inner > 0 && labels > n_out) step(n_out, labels);  // wraps the summed labels back to 0
    out[o] = static_cast<T>(acc);
    if (o + 1 < out_elems) step(0, n_out);
  }
}

void EinsumRef(KernelContext& ctx) {
  std::vector<Shape> shapes;
  for (size_t i = 0; i < ctx.inputs.size(); ++i) shapes.push_back(ctx.In(static_cast<int>(i)).shape());
  const EinsumSpec spec = ParseEinsum(ctx.node.GetString("equation", ""), shapes, ctx.node.Describe());
  if (ctx.Out(0).shape() != spec.OutputShape())
    throw Error(ErrorCode::kInternal, ctx.node.Describe() + ": output allocated as " +
                                          ShapeToString(ctx.Out(0).shape()) + ", Einsum computes " +
                                          ShapeToString(spec.OutputShape()));
  const int64_t operands = static_cast<int64_t>(ctx.inputs.size());  // each step multiplies one element of each
  if (spec.Work() > kMaxEinsumWork / std::max<int64_t>(operands, 1))
    throw Error(ErrorCode::kResourceExhausted,
                ctx.node.Describe() + ": this Einsum takes " + std::to_string(spec.Work()) + " steps over " +
                    std::to_string(operands) + " inputs on the general Einsum kernel, more than its limit of " +
                    std::to_string(kMaxEinsumWork) + " (two-input contractions without repeated labels run as MatMul)");
  auto run = [&](auto zero) {
    using T = decltype(zero);
    std::vector<const T*> in;
    for (size_t i = 0; i < ctx.inputs.size(); ++i) in.push_back(ctx.In(static_cast<int>(i)).data<T>());
    if (ctx.Out(0).numel() > 0) EinsumLoop<T>(spec, in, ctx.Out(0).data<T>());
  };
  DispatchArithmetic(ctx.node, ctx.In(0).dtype(), run);
}

}  // namespace

void AddNnReferenceKernels(ReferenceKernelTable& t) {
  t.Add("Conv", ConvRef);
  t.Add("ConvTranspose", ConvTransposeRef);
  t.Add("BatchNormalization", BatchNormalizationRef);
  t.Add("InstanceNormalization", InstanceNormalizationRef);
  t.Add("GroupNormalization", GroupNormalizationRef);
  t.Add(kGroupNormOp, GroupNormalizationRef);  // scale and bias per channel: NormalizeChannelGroups reads their length
  t.Add("RoiAlign", RoiAlignRef);
  t.Add("MeanVarianceNormalization", MeanVarianceNormalizationRef);
  t.Add("LayerNormalization", LayerNormalizationRef);
  t.Add("MatMul", MatMulRef);
  t.Add(kMatMulViewsOp, MatMulViewsRef);
  t.Add(kAttentionViewsOp, AttentionViewsRef);
  t.Add("Gemm", GemmRef);
  t.Add("Einsum", EinsumRef);
  t.Add("MaxPool", MaxPoolRef);
  t.Add("AveragePool", AveragePoolRef);
  t.Add("LpPool", LpPoolRef);
  t.Add("GlobalAveragePool", GlobalAveragePoolRef);
  t.Add("GlobalMaxPool", GlobalMaxPoolRef);
  t.Add("Softmax", SoftmaxRef);
  t.Add("LogSoftmax", LogSoftmaxRef);
  t.Add("Hardmax", HardmaxRef);
  t.Add("LRN", LRNRef);
  t.Add("GridSample", GridSampleRef);
  t.Add("AffineGrid", AffineGridRef);
}

}  // namespace osprey
