// Fast ONNX Resize / Upsample for float32 rank-4 tensors resized along H and W, and rank-5 ones along D, H and W
// (N and C kept): nearest, linear and cubic, every coordinate transformation but tf_crop_and_resize, with constant
// scales/sizes. Separable: per output row, the source rows its D x H taps name are blended into one row (or used as
// they are when there is a single weight-1 tap), then each output element blends that row at its W taps (a 3-D U-Net's
// trilinear upsampling ran 6.6x ORT's time on the reference kernel). The taps come from ops/onnx_resize.h,
// the rules the reference kernel uses. Plain and channels-last data alike (a channels-last row is W pixels of C
// floats, blended as vectors; NDHWC rows are numbered d * H + h as plain ones are), so the layout pass keeps the
// detectors' FPN upsamples and 3-D U-Nets' trilinear ones channels-last (CpuKernelFollowsNhwc). Sums are float, not the
// reference's double: results agree within float rounding.
#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/dnnl_common.h"
#include "ops/onnx_resize.h"

namespace osprey {
namespace {

struct Taps1d {
  std::vector<int> count;
  std::vector<std::array<int64_t, 4>> index;
  std::vector<std::array<float, 4>> weight;
};

struct ResizePlan {
  int64_t n = 0, c = 0, id = 1, ih = 0, iw = 0, od = 1, oh = 0, ow = 0;  // rank 4: id = od = 1
  bool nearest = false;
  Taps1d d, h, w;  // rank 4: d is one weight-1 tap
};

// The source rows an output row (od, oh) blends and their weights: D taps x H taps (at most 16, cubic).
struct RowTaps {
  int count = 0;
  std::array<int64_t, 16> row;  // index of the source row within its plane: d * ih + h
  std::array<float, 16> weight;
};

// Whether every output index reads only its own source index with weights summing to 1 (pytorch_half_pixel on a
// length-1 axis gives two half-weight taps, both clamped to index 0).
bool Identity(const AxisTaps& t) {
  for (size_t o = 0; o < t.count.size(); ++o) {
    if (t.outside[o] || t.count[o] < 1) return false;
    double sum = 0;
    for (int k = 0; k < t.count[o]; ++k) {
      if (t.offset[o][k] != static_cast<int64_t>(o)) return false;
      sum += t.weight[o][k];
    }
    if (std::abs(sum - 1.0) > 1e-12) return false;
  }
  return true;
}

bool ToTaps1d(const AxisTaps& t, Taps1d* out) {
  out->count = t.count;
  out->index = t.offset;  // stride 1: offsets are indices
  out->weight.resize(t.weight.size());
  for (size_t o = 0; o < t.count.size(); ++o) {
    if (t.outside[o] || t.count[o] < 1) return false;
    for (int k = 0; k < 4; ++k) out->weight[o][k] = static_cast<float>(t.weight[o][k]);
  }
  return true;
}

// Whether this kernel handles the node; fills `plan`. Needs the roi/scales/sizes inputs known when compiling.
bool PrepareResize(const KernelBuildContext& ctx, ResizePlan* plan) {
  const Node& node = ctx.node;
  if (!node.domain.empty() || (node.op_type != "Resize" && node.op_type != "Upsample")) return false;
  if (ctx.input_dtypes.empty() || !ctx.present[0] || ctx.input_dtypes[0] != DType::kF32) return false;
  if (ctx.output_shapes.size() != 1 || node.GetInt("antialias", 0) != 0) return false;
  const Shape& x = ctx.input_shapes[0];
  const Shape& y = ctx.output_shapes[0];
  const size_t rank = x.size();
  if ((rank != 4 && rank != 5) || y.size() != rank || NumElements(y) == 0 || NumElements(x) == 0) return false;
  const Tensor* inputs[3] = {nullptr, nullptr, nullptr};
  for (size_t k = 1; k < ctx.present.size() && k <= 3; ++k) {
    if (!ctx.present[k]) continue;
    if (!ctx.input_values[k]) return false;  // computed at run time
    inputs[k - 1] = ctx.input_values[k];
  }
  if (node.op_type == "Upsample" && ctx.opset < 9 && !node.Has("scales")) return false;
  const ResizeParams params = GetResizeParams(node, ctx.opset, x, inputs[0], inputs[1], inputs[2]);
  if (params.coord == "tf_crop_and_resize") return false;
  if (params.mode != "nearest" && params.mode != "linear" && params.mode != "cubic") return false;
  for (int64_t d = 0; d < 2; ++d)
    if (x[d] != y[d] || !Identity(BuildTaps(params, d, x[d], y[d], 1))) return false;
  const int64_t h = static_cast<int64_t>(rank) - 2, w = h + 1;  // the axes of H and W
  plan->n = x[0];
  plan->c = x[1];
  plan->ih = x[h];
  plan->iw = x[w];
  plan->oh = y[h];
  plan->ow = y[w];
  plan->nearest = params.mode == "nearest";
  if (rank == 5) {
    plan->id = x[2];
    plan->od = y[2];
    if (!ToTaps1d(BuildTaps(params, 2, x[2], y[2], 1), &plan->d)) return false;
  } else {
    plan->d.count = {1};
    plan->d.index = {{0, 0, 0, 0}};
    plan->d.weight = {{1.f, 0.f, 0.f, 0.f}};
  }
  return ToTaps1d(BuildTaps(params, h, x[h], y[h], 1), &plan->h) &&
         ToTaps1d(BuildTaps(params, w, x[w], y[w], 1), &plan->w);
}

RowTaps TapsOfRow(const ResizePlan& p, int64_t od, int64_t oh) {
  RowTaps t;
  for (int kd = 0; kd < p.d.count[od]; ++kd)
    for (int kh = 0; kh < p.h.count[oh]; ++kh) {
      t.row[t.count] = p.d.index[od][kd] * p.ih + p.h.index[oh][kh];
      t.weight[t.count++] = p.d.weight[od][kd] * p.h.weight[oh][kh];
    }
  return t;
}

// One output row: the source rows its D x H taps name blended into `blend` (unless a single weight-1 tap, used as it
// is), then each output element (a pixel of `ch` floats) the blend of that row at its W taps. Compiled for AVX-512,
// AVX2 and the baseline (the element loops vectorise, across channels or across a row); one call per row, so the
// clone is chosen once per row, not per pixel.
__attribute__((target_clones("avx512f", "avx2", "default"))) void ResizeRow(const ResizePlan& p, const float* src,
                                                                            const RowTaps& taps, int64_t ch,
                                                                            float* blend, float* __restrict dst) {
  const int64_t in_row = p.iw * ch;
  const int hn = taps.count;
  const float* row = src + taps.row[0] * in_row;
  if (!(hn == 1 && taps.weight[0] == 1.f)) {
    float* __restrict b = blend;
    const float* __restrict r0 = row;
    const float w0 = taps.weight[0];
    if (hn >= 2) {
      const float* __restrict r1 = src + taps.row[1] * in_row;
      const float w1 = taps.weight[1];
      for (int64_t i = 0; i < in_row; ++i) b[i] = w0 * r0[i] + w1 * r1[i];
    } else {
      for (int64_t i = 0; i < in_row; ++i) b[i] = w0 * r0[i];
    }
    for (int k = 2; k < hn; ++k) {
      const float* __restrict other = src + taps.row[k] * in_row;
      const float wk = taps.weight[k];
      for (int64_t i = 0; i < in_row; ++i) b[i] += wk * other[i];
    }
    row = blend;
  }
  if (ch == 1) {
    if (p.nearest) {
      for (int64_t ox = 0; ox < p.ow; ++ox) dst[ox] = row[p.w.index[ox][0]];
    } else {
      for (int64_t ox = 0; ox < p.ow; ++ox) {
        const auto& idx = p.w.index[ox];
        const auto& wt = p.w.weight[ox];
        float v = wt[0] * row[idx[0]];
        for (int k = 1; k < p.w.count[ox]; ++k) v += wt[k] * row[idx[k]];
        dst[ox] = v;
      }
    }
    return;
  }
  for (int64_t ox = 0; ox < p.ow; ++ox) {
    float* __restrict out = dst + ox * ch;
    const auto& idx = p.w.index[ox];
    const auto& wt = p.w.weight[ox];
    const float* __restrict a = row + idx[0] * ch;
    if (p.nearest) {
      for (int64_t i = 0; i < ch; ++i) out[i] = a[i];
      continue;
    }
    const int n = p.w.count[ox];
    const float w0 = wt[0];
    if (n >= 2) {
      const float* __restrict b = row + idx[1] * ch;
      const float w1 = wt[1];
      for (int64_t i = 0; i < ch; ++i) out[i] = w0 * a[i] + w1 * b[i];
    } else {
      for (int64_t i = 0; i < ch; ++i) out[i] = w0 * a[i];
    }
    for (int k = 2; k < n; ++k) {
      const float* __restrict b = row + idx[k] * ch;
      const float wk = wt[k];
      for (int64_t i = 0; i < ch; ++i) out[i] += wk * b[i];
    }
  }
}

class ResizeF32Kernel final : public Kernel {
 public:
  ResizeF32Kernel(ResizePlan plan, bool nhwc, int num_threads)
      : p_(std::move(plan)), nhwc_(nhwc), num_threads_(num_threads) {}
  const char* Name() const override { return nhwc_ ? "ResizeF32Nhwc" : "ResizeF32"; }

  void Run(KernelContext& ctx) override {
    const float* x = ctx.In(0).data<float>();
    float* y = ctx.Out(0).data<float>();
    // A plane is one image channel (plain) or one image of C-float pixels (channels-last).
    const int64_t planes = nhwc_ ? p_.n : p_.n * p_.c, ch = nhwc_ ? p_.c : 1;
    const int64_t in_row = p_.iw * ch, out_row = p_.ow * ch, rows = planes * p_.od * p_.oh;
    const int64_t work = rows * out_row;
    const bool parallel = num_threads_ > 1 && work >= (int64_t{1} << 15);
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t plane = r / (p_.od * p_.oh), od = r / p_.oh % p_.od, oh = r % p_.oh;
      float* blend = reinterpret_cast<float*>(cpu::ThreadScratch::Reserve(sizeof(float) * in_row));
      ResizeRow(p_, x + plane * p_.id * p_.ih * in_row, TapsOfRow(p_, od, oh), ch, blend, y + r * out_row);
    }
  }

 private:
  ResizePlan p_;
  bool nhwc_;
  int num_threads_;
};

}  // namespace

namespace cpu {

bool ResizeFollowsNhwc(const KernelBuildContext& ctx) {
  ResizePlan plan;
  return ctx.input_shapes.size() > 0 && ChannelsLastRank(ctx.input_shapes[0].size()) && PrepareResize(ctx, &plan);
}

std::unique_ptr<Kernel> CreateResize(const KernelBuildContext& ctx) {
  ResizePlan plan;
  if (!PrepareResize(ctx, &plan)) return nullptr;
  const bool in_nhwc = !ctx.input_layouts.empty() && ctx.input_layouts[0] == Layout::kNhwc;
  const bool out_nhwc = !ctx.output_layouts.empty() && ctx.output_layouts[0] == Layout::kNhwc;
  if (in_nhwc != out_nhwc) return nullptr;  // the layout pass gives a following kernel one layout for both
  return std::make_unique<ResizeF32Kernel>(std::move(plan), in_nhwc, ctx.num_threads);
}

}  // namespace cpu
}  // namespace osprey
