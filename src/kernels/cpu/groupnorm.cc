// GroupNormF32: InstanceNormalization, GroupNormalization and _GroupNorm (the group-norm fusion's op) on plain float32
// [N, C, spatial...] data. The reference kernel runs one (sample, group) per thread in double, so a model with one
// group (PoolFormer's GroupNorm(1), exported as Reshape -> InstanceNormalization -> Reshape) ran on one thread at
// ~1.5 ns an element. Here both passes are cut into chunks across the threads whatever the group count:
//   1. statistics: each chunk of a group sums x - pivot and its square (float SIMD partial sums, the pivot being the
//      group's first element so the sums stay of the order of the spread, not of the mean), combined per group in
//      double;
//   2. normalisation: per channel, y = (x - mean) * a + bias with a = scale * inv_std, over contiguous spatial runs
//      (x - mean first: folding the mean into the bias, x * a + (bias - mean * a), cancels in float when |mean| >>
//      std), then a fused activation (the runtime's FuseActivation) on each piece while it is in the cache.
// Rank-4 tensors may be channels-last on either side (the layout pass keeps a network channels-last through it:
// PoolFormer's norms between 1x1 convolutions and pools cost two reorders a block when they ran plain only). There
// the statistics are per (sample, chunk of pixels) sums per channel, vectorised along the channels and added up per
// group, and the normalisation runs along each pixel's channels; a plain side is read or written through a transposing
// loop.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/kernel.h"
#include "ops/activation.h"
#include "ops/op_registry.h"

namespace osprey {

std::unique_ptr<Kernel> CreateCpuGroupNorm(const KernelBuildContext& ctx);

namespace {

constexpr int64_t kChunk = int64_t{1} << 14;  // elements per work item (64 KiB)
constexpr int64_t kMinParallelElements = int64_t{1} << 14;

class GroupNormF32Kernel final : public Kernel {
 public:
  GroupNormF32Kernel(Shape shape, int64_t groups, float epsilon, bool in_nhwc, bool out_nhwc, Activation act)
      : shape_(std::move(shape)),
        groups_(groups),
        epsilon_(epsilon),
        in_nhwc_(in_nhwc),
        out_nhwc_(out_nhwc),
        act_(act) {
    batch_ = shape_[0];
    channels_ = shape_[1];
    spatial_ = 1;
    for (size_t d = 2; d < shape_.size(); ++d) spatial_ *= shape_[d];
    group_size_ = channels_ / groups_ * spatial_;
  }
  const char* Name() const override { return "GroupNormF32"; }

  void Run(KernelContext& ctx) override {
    const Tensor& x = ctx.In(0);
    Tensor& y = ctx.Out(0);
    if (x.shape() != Physical(in_nhwc_) || y.shape() != Physical(out_nhwc_) || x.dtype() != DType::kF32 ||
        y.dtype() != DType::kF32)
      throw Error(ErrorCode::kInternal, ctx.node.Describe() + ": GroupNormF32 was built for float32 " +
                                            ShapeToString(shape_) + ", got " + ShapeToString(x.shape()));
    const Tensor& scale = ctx.In(1);
    const Tensor& bias = ctx.In(2);
    const bool per_channel = scale.numel() == channels_;
    if (scale.dtype() != DType::kF32 || bias.dtype() != DType::kF32 || bias.numel() != scale.numel() ||
        (!per_channel && scale.numel() != groups_))
      throw Error(ErrorCode::kInternal, ctx.node.Describe() + ": GroupNormF32: scale/bias of " +
                                            ShapeToString(scale.shape()) + " for " + std::to_string(channels_) +
                                            " channels in " + std::to_string(groups_) + " groups");
    const int64_t segments = batch_ * groups_;
    if (segments == 0 || group_size_ == 0) return;
    const float* xd = x.data<float>();
    float* yd = y.data<float>();
    const int64_t size = group_size_;
    const bool parallel = x.numel() >= kMinParallelElements;

    // 1. Per (sample, group): sums of x - pivot and of its square, the pivot being the group's first element.
    std::vector<double> sum(static_cast<size_t>(segments)), sum_sq(sum.size());
    std::vector<float> pivot(sum.size());
    if (in_nhwc_)
      ChannelsLastSums(xd, parallel, sum, sum_sq, pivot);
    else
      PlainSums(xd, parallel, sum, sum_sq, pivot);
    // Per channel: y = (x - mean) * mul + add.
    std::vector<float> centre(static_cast<size_t>(batch_ * channels_)), mul(centre.size()), add(centre.size());
    const float* sc = scale.data<float>();
    const float* bi = bias.data<float>();
    const int64_t per_group = channels_ / groups_;
    for (int64_t s = 0; s < segments; ++s) {
      const double shifted_mean = sum[s] / static_cast<double>(size);
      const double variance = std::max(0.0, sum_sq[s] / static_cast<double>(size) - shifted_mean * shifted_mean);
      const double mean = pivot[s] + shifted_mean;
      const double inv_std = 1.0 / std::sqrt(variance + epsilon_);
      const int64_t n = s / groups_, g = s % groups_;
      for (int64_t j = 0; j < per_group; ++j) {
        const int64_t c = g * per_group + j, p = per_channel ? c : g;
        centre[n * channels_ + c] = static_cast<float>(mean);
        mul[n * channels_ + c] = static_cast<float>(sc[p] * inv_std);
        add[n * channels_ + c] = bi[p];
      }
    }
    // 2. y = (x - centre) * mul + add, per channel.
    if (in_nhwc_ || out_nhwc_)
      ChannelsLastNormalise(xd, yd, parallel, centre, mul, add);
    else
      PlainNormalise(xd, yd, parallel, centre, mul, add);
  }

 private:
  Shape Physical(bool nhwc) const { return nhwc ? ChannelsLastShape(shape_) : shape_; }

  // Plain [N, C, spatial]: a group's elements are contiguous; per (group, chunk) float SIMD sums, added in double.
  void PlainSums(const float* xd, bool parallel, std::vector<double>& sum, std::vector<double>& sum_sq,
                 std::vector<float>& pivot) const {
    const int64_t segments = batch_ * groups_, size = group_size_;
    const int64_t chunks = (size + kChunk - 1) / kChunk;
    std::vector<double> part(static_cast<size_t>(segments * chunks)), part_sq(part.size());
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t item = 0; item < segments * chunks; ++item) {
      const int64_t s = item / chunks, k = item % chunks;
      const float* xs = xd + s * size;
      const float p = xs[0];
      const int64_t begin = k * kChunk, end = std::min(size, begin + kChunk);
      float a = 0.f, b = 0.f;
#pragma omp simd reduction(+ : a, b)
      for (int64_t i = begin; i < end; ++i) {
        const float d = xs[i] - p;
        a += d;
        b += d * d;
      }
      part[item] = a;
      part_sq[item] = b;
    }
    for (int64_t s = 0; s < segments; ++s) {
      pivot[s] = xd[s * size];
      for (int64_t k = 0; k < chunks; ++k) sum[s] += part[s * chunks + k], sum_sq[s] += part_sq[s * chunks + k];
    }
  }

  // Pixels per work item of a channels-last pass: about kChunk elements, and at most 64 items a sample (the
  // statistics keep C sums per item).
  int64_t PixelsPerItem() const { return std::max({int64_t{1}, kChunk / channels_, (spatial_ + 63) / 64}); }

  // Channels-last [N, spatial, C]: per (sample, chunk of pixels) float sums per channel (vectorised along C), added
  // per group in double.
  void ChannelsLastSums(const float* xd, bool parallel, std::vector<double>& sum, std::vector<double>& sum_sq,
                        std::vector<float>& pivot) const {
    const int64_t c_all = channels_, per_group = channels_ / groups_;
    const int64_t pixels = PixelsPerItem(), chunks = (spatial_ + pixels - 1) / pixels;
    for (int64_t s = 0; s < batch_ * groups_; ++s)
      pivot[s] = xd[(s / groups_) * spatial_ * c_all + (s % groups_) * per_group];
    std::vector<float> channel_pivot(static_cast<size_t>(batch_ * c_all));  // each channel's group's pivot
    for (int64_t i = 0; i < batch_ * c_all; ++i)
      channel_pivot[i] = pivot[(i / c_all) * groups_ + i % c_all / per_group];
    std::vector<float> part(static_cast<size_t>(batch_ * chunks * c_all)), part_sq(part.size());
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t item = 0; item < batch_ * chunks; ++item) {
      const int64_t n = item / chunks, k = item % chunks;
      const int64_t begin = k * pixels, end = std::min(spatial_, begin + pixels);
      float* a = part.data() + item * c_all;
      float* b = part_sq.data() + item * c_all;
      const float* pv = channel_pivot.data() + n * c_all;
      for (int64_t i = begin; i < end; ++i) {
        const float* row = xd + (n * spatial_ + i) * c_all;
#pragma omp simd
        for (int64_t c = 0; c < c_all; ++c) {
          const float d = row[c] - pv[c];
          a[c] += d;
          b[c] += d * d;
        }
      }
    }
    for (int64_t item = 0; item < batch_ * chunks; ++item) {
      const int64_t n = item / chunks;
      for (int64_t c = 0; c < c_all; ++c) {
        sum[n * groups_ + c / per_group] += part[item * c_all + c];
        sum_sq[n * groups_ + c / per_group] += part_sq[item * c_all + c];
      }
    }
  }

  // Plain to plain: per (channel, chunk of its spatial run).
  void PlainNormalise(const float* xd, float* yd, bool parallel, const std::vector<float>& centre,
                      const std::vector<float>& mul, const std::vector<float>& add) const {
    const int64_t spatial = spatial_;
    const int64_t run_chunks = (spatial + kChunk - 1) / kChunk;
    const int64_t planes = batch_ * channels_;
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t item = 0; item < planes * run_chunks; ++item) {
      const int64_t plane = item / run_chunks, k = item % run_chunks;
      const int64_t begin = k * kChunk, end = std::min(spatial, begin + kChunk);
      const float mean = centre[plane], m = mul[plane], a = add[plane];
      const float* xp = xd + plane * spatial;
      float* yp = yd + plane * spatial;
#pragma omp simd
      for (int64_t i = begin; i < end; ++i) yp[i] = (xp[i] - mean) * m + a;
      ActivateInPlace(act_, yp + begin, end - begin, 1);
    }
  }

  // Either side channels-last: per (sample, chunk of pixels), along each pixel's channels; a plain side is read or
  // written at a stride of `spatial` floats per channel.
  void ChannelsLastNormalise(const float* xd, float* yd, bool parallel, const std::vector<float>& centre,
                             const std::vector<float>& mul, const std::vector<float>& add) const {
    const int64_t c_all = channels_, spatial = spatial_;
    const int64_t pixels = PixelsPerItem(), chunks = (spatial + pixels - 1) / pixels;
    const bool in_nhwc = in_nhwc_, out_nhwc = out_nhwc_;
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t item = 0; item < batch_ * chunks; ++item) {
      const int64_t n = item / chunks, k = item % chunks;
      const int64_t begin = k * pixels, end = std::min(spatial, begin + pixels);
      const float* ce = centre.data() + n * c_all;
      const float* m = mul.data() + n * c_all;
      const float* a = add.data() + n * c_all;
      const float* xs = xd + n * spatial * c_all;
      float* ys = yd + n * spatial * c_all;
      if (in_nhwc && out_nhwc) {
        for (int64_t i = begin; i < end; ++i) {
          const float* xr = xs + i * c_all;
          float* yr = ys + i * c_all;
#pragma omp simd
          for (int64_t c = 0; c < c_all; ++c) yr[c] = (xr[c] - ce[c]) * m[c] + a[c];
        }
        ActivateInPlace(act_, ys + begin * c_all, (end - begin) * c_all, 1);
      } else if (in_nhwc) {  // to plain: each channel's run of the chunk's pixels
        for (int64_t c = 0; c < c_all; ++c) {
          for (int64_t i = begin; i < end; ++i) ys[c * spatial + i] = (xs[i * c_all + c] - ce[c]) * m[c] + a[c];
          ActivateInPlace(act_, ys + c * spatial + begin, end - begin, 1);
        }
      } else {  // from plain
        for (int64_t c = 0; c < c_all; ++c)
          for (int64_t i = begin; i < end; ++i) ys[i * c_all + c] = (xs[c * spatial + i] - ce[c]) * m[c] + a[c];
        ActivateInPlace(act_, ys + begin * c_all, (end - begin) * c_all, 1);
      }
    }
  }

  Shape shape_;
  int64_t groups_;
  float epsilon_;
  bool in_nhwc_, out_nhwc_;  // input / output channels-last ([N, H, W, C] or [N, D, H, W, C])
  Activation act_;           // a fused activation (_activation), applied to each piece of output as it is written
  int64_t batch_ = 0, channels_ = 0, spatial_ = 1, group_size_ = 0;
};

}  // namespace

/// GroupNormF32 for a float32 InstanceNormalization / GroupNormalization / _GroupNorm, plain or (rank 4 or 5)
/// channels-last on either side, or nullptr.
std::unique_ptr<Kernel> CreateCpuGroupNorm(const KernelBuildContext& ctx) {
  const Node& node = ctx.node;
  if (ctx.present.size() != 3 || !ctx.present[0] || !ctx.present[1] || !ctx.present[2]) return nullptr;
  for (int i = 0; i < 3; ++i)
    if (ctx.input_dtypes[i] != DType::kF32 || (i > 0 && ctx.InLayout(i) != Layout::kPlain)) return nullptr;
  if (ctx.output_shapes.size() != 1 || ctx.output_dtypes[0] != DType::kF32) return nullptr;
  const Shape& x = ctx.input_shapes[0];
  if (x.size() < 2 || ctx.output_shapes[0] != x || x[1] <= 0) return nullptr;
  const bool in_nhwc = ctx.InLayout(0) == Layout::kNhwc, out_nhwc = ctx.OutLayout(0) == Layout::kNhwc;
  if ((in_nhwc || out_nhwc) && !ChannelsLastRank(x.size())) return nullptr;
  const int64_t groups = node.op_type == "InstanceNormalization" ? x[1] : node.GetInt("num_groups", 0);
  if (groups < 1 || x[1] % groups != 0) return nullptr;
  Activation act;
  if (!Activation::FromFusedNode(node, &act)) return nullptr;
  return std::make_unique<GroupNormF32Kernel>(x, groups, node.GetFloat("epsilon", 1e-5f), in_nhwc, out_nhwc, act);
}

/// Whether CreateCpuGroupNorm builds a kernel for this node on rank-4 or rank-5 tensors (it then takes every layout).
bool CpuGroupNormSupportsNhwc(const KernelBuildContext& ctx) {
  return ctx.input_shapes.size() == 3 && ChannelsLastRank(ctx.input_shapes[0].size()) &&
         CreateCpuGroupNorm(ctx) != nullptr;
}

}  // namespace osprey
