// GroupNormF32: InstanceNormalization, GroupNormalization and _GroupNorm (the group-norm fusion's op) on plain float32
// [N, C, spatial...] data. The reference kernel runs one (sample, group) per thread in double, so a model with one
// group (PoolFormer's GroupNorm(1), exported as Reshape -> InstanceNormalization -> Reshape) ran on one thread at
// ~1.5 ns an element. Here both passes are cut into chunks across the threads whatever the group count:
//   1. statistics: each chunk of a group sums x - pivot and its square (float SIMD partial sums, the pivot being the
//      group's first element so the sums stay of the order of the spread, not of the mean), combined per group in
//      double;
//   2. normalisation: per channel, y = (x - mean) * a + bias with a = scale * inv_std, over contiguous spatial runs
//      (x - mean first: folding the mean into the bias, x * a + (bias - mean * a), cancels in float when |mean| >>
//      std).
#include <cmath>
#include <vector>

#include "kernels/kernel.h"
#include "ops/op_registry.h"

namespace osprey {

std::unique_ptr<Kernel> CreateCpuGroupNorm(const KernelBuildContext& ctx);

namespace {

constexpr int64_t kChunk = int64_t{1} << 14;  // elements per work item (64 KiB)
constexpr int64_t kMinParallelElements = int64_t{1} << 14;

class GroupNormF32Kernel final : public Kernel {
 public:
  GroupNormF32Kernel(Shape shape, int64_t groups, float epsilon)
      : shape_(std::move(shape)), groups_(groups), epsilon_(epsilon) {
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
    if (x.shape() != shape_ || y.shape() != shape_ || x.dtype() != DType::kF32 || y.dtype() != DType::kF32)
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
    const int64_t chunks = (size + kChunk - 1) / kChunk;
    const bool parallel = x.numel() >= kMinParallelElements;

    // 1. Per (group, chunk): sums of x - pivot and of its square.
    std::vector<double> sum(static_cast<size_t>(segments * chunks)), sum_sq(sum.size());
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t item = 0; item < segments * chunks; ++item) {
      const int64_t s = item / chunks, k = item % chunks;
      const float* xs = xd + s * size;
      const float pivot = xs[0];
      const int64_t begin = k * kChunk, end = std::min(size, begin + kChunk);
      float a = 0.f, b = 0.f;
#pragma omp simd reduction(+ : a, b)
      for (int64_t i = begin; i < end; ++i) {
        const float d = xs[i] - pivot;
        a += d;
        b += d * d;
      }
      sum[item] = a;
      sum_sq[item] = b;
    }
    // Per channel: y = (x - mean) * mul + add.
    std::vector<float> centre(static_cast<size_t>(batch_ * channels_)), mul(centre.size()), add(centre.size());
    const float* sc = scale.data<float>();
    const float* bi = bias.data<float>();
    const int64_t per_group = channels_ / groups_;
    for (int64_t s = 0; s < segments; ++s) {
      double sd = 0, sq = 0;
      for (int64_t k = 0; k < chunks; ++k) sd += sum[s * chunks + k], sq += sum_sq[s * chunks + k];
      const double shifted_mean = sd / static_cast<double>(size);
      const double variance = std::max(0.0, sq / static_cast<double>(size) - shifted_mean * shifted_mean);
      const double mean = xd[s * size] + shifted_mean;
      const double inv_std = 1.0 / std::sqrt(variance + epsilon_);
      const int64_t n = s / groups_, g = s % groups_;
      for (int64_t j = 0; j < per_group; ++j) {
        const int64_t c = g * per_group + j, p = per_channel ? c : g;
        centre[n * channels_ + c] = static_cast<float>(mean);
        mul[n * channels_ + c] = static_cast<float>(sc[p] * inv_std);
        add[n * channels_ + c] = bi[p];
      }
    }
    // 2. Per (channel, chunk of its spatial run).
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
    }
  }

 private:
  Shape shape_;
  int64_t groups_;
  float epsilon_;
  int64_t batch_ = 0, channels_ = 0, spatial_ = 1, group_size_ = 0;
};

}  // namespace

/// GroupNormF32 for a float32 InstanceNormalization / GroupNormalization / _GroupNorm on plain data, or nullptr.
std::unique_ptr<Kernel> CreateCpuGroupNorm(const KernelBuildContext& ctx) {
  const Node& node = ctx.node;
  if (ctx.present.size() != 3 || !ctx.present[0] || !ctx.present[1] || !ctx.present[2]) return nullptr;
  for (int i = 0; i < 3; ++i)
    if (ctx.input_dtypes[i] != DType::kF32 || ctx.InLayout(i) != Layout::kPlain) return nullptr;
  if (ctx.output_shapes.size() != 1 || ctx.output_dtypes[0] != DType::kF32 || ctx.OutLayout(0) != Layout::kPlain)
    return nullptr;
  const Shape& x = ctx.input_shapes[0];
  if (x.size() < 2 || ctx.output_shapes[0] != x || x[1] <= 0) return nullptr;
  const int64_t groups = node.op_type == "InstanceNormalization" ? x[1] : node.GetInt("num_groups", 0);
  if (groups < 1 || x[1] % groups != 0) return nullptr;
  return std::make_unique<GroupNormF32Kernel>(x, groups, node.GetFloat("epsilon", 1e-5f));
}

}  // namespace osprey
