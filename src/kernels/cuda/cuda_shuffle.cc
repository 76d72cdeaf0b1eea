// _ChannelShuffle (ShuffleNet's concat + shuffle + split as one node; src/ops/internal_ops.cc) as strided copies.
// Shuffled channel k reads concatenated channel (k % g) * (C / g) + k / g. For one output and one residue r = k % g the
// output channels k = r, r + g, ... read consecutive source channels, so each (output, residue, input) run is one
// strided copy [batch, channels, inner]: a handful of copies per node (ShuffleNet: g = 2, two inputs, two outputs),
// computed here at build time.
#include <algorithm>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_internal.h"
#include "ops/op_registry.h"

namespace osprey::cuda {
namespace {

struct ShuffleCopy {
  int input = 0, output = 0;
  int64_t src_offset = 0, dst_offset = 0;  // elements
  StridedCopyGeometry g;
};

class ChannelShuffleKernel final : public CudaKernel {
 public:
  ChannelShuffleKernel(int ordinal, std::vector<ShuffleCopy> copies, size_t es)
      : CudaKernel("ChannelShuffleCuda", ordinal), copies_(std::move(copies)), es_(es) {}

 protected:
  void RunOn(KernelContext& ctx, cudaStream_t stream) override {
    for (const ShuffleCopy& c : copies_) {
      Tensor* out = c.output < static_cast<int>(ctx.outputs.size()) ? ctx.outputs[c.output] : nullptr;
      if (out == nullptr) continue;
      const char* src = static_cast<const char*>(ctx.In(c.input).raw()) + c.src_offset * static_cast<int64_t>(es_);
      char* dst = static_cast<char*>(out->raw()) + c.dst_offset * static_cast<int64_t>(es_);
      Check(LaunchStridedCopy(stream, c.g, src, dst, static_cast<int>(es_)));
    }
  }

 private:
  std::vector<ShuffleCopy> copies_;
  size_t es_;
};

}  // namespace

std::unique_ptr<Kernel> CreateChannelShuffleKernel(const KernelBuildContext& bc) {
  const Node& node = bc.node;
  const int num_inputs = static_cast<int>(bc.present.size());
  if (num_inputs == 0 || bc.output_shapes.empty()) return nullptr;
  const DType dtype = bc.input_dtypes[0];
  const size_t es = DTypeSize(dtype);
  if (es != 1 && es != 2 && es != 4 && es != 8) return nullptr;
  const Shape& first = bc.input_shapes[0];
  if (first.size() < 2) return nullptr;
  const int64_t batch = first[0];
  int64_t inner = 1;
  for (size_t d = 2; d < first.size(); ++d) inner *= first[d];
  // Channel ranges of the inputs in the concatenation.
  std::vector<int64_t> in_begin, in_channels;
  int64_t channels = 0;
  for (int i = 0; i < num_inputs; ++i) {
    if (!bc.present[i] || bc.input_dtypes[i] != dtype || bc.input_shapes[i].size() != first.size()) return nullptr;
    for (size_t d = 0; d < first.size(); ++d)
      if (d != 1 && bc.input_shapes[i][d] != first[d]) return nullptr;
    in_begin.push_back(channels);
    in_channels.push_back(bc.input_shapes[i][1]);
    channels += bc.input_shapes[i][1];
  }
  const int64_t groups = node.GetInt("groups", 1);
  if (groups < 1 || channels % groups != 0) return nullptr;
  const int64_t per_group = channels / groups;
  std::vector<ShuffleCopy> copies;
  int64_t k0 = 0;  // first shuffled channel of the output
  for (size_t j = 0; j < bc.output_shapes.size(); ++j) {
    const Shape& out = bc.output_shapes[j];
    if (out.size() != first.size() || bc.output_dtypes[j] != dtype) return nullptr;
    const int64_t out_channels = out[1];
    if (NumElements(out) != batch * out_channels * inner) return nullptr;
    const int64_t k1 = k0 + out_channels;
    for (int64_t r = 0; r < groups; ++r) {
      const int64_t kf = k0 + ((r - k0 % groups) + groups) % groups;  // first k >= k0 with k % groups == r
      if (kf >= k1) continue;
      const int64_t count = (k1 - 1 - kf) / groups + 1;
      const int64_t s0 = r * per_group + kf / groups;  // its source channel; the next ones follow consecutively
      for (int i = 0; i < num_inputs; ++i) {
        const int64_t lo = std::max(s0, in_begin[i]), hi = std::min(s0 + count, in_begin[i] + in_channels[i]);
        if (lo >= hi) continue;
        const int64_t k_start = kf + (lo - s0) * groups;
        ShuffleCopy c;
        c.input = i;
        c.output = static_cast<int>(j);
        c.src_offset = (lo - in_begin[i]) * inner;
        c.dst_offset = (k_start - k0) * inner;
        c.g.rank = 3;
        c.g.total = batch * (hi - lo) * inner;
        c.g.dims[0] = batch;
        c.g.dims[1] = hi - lo;
        c.g.dims[2] = inner;
        c.g.src_strides[0] = in_channels[i] * inner;
        c.g.src_strides[1] = inner;
        c.g.src_strides[2] = 1;
        c.g.dst_strides[0] = out_channels * inner;
        c.g.dst_strides[1] = groups * inner;
        c.g.dst_strides[2] = 1;
        if (j < node.outputs.size() && node.outputs[j] >= 0) copies.push_back(c);
      }
    }
    k0 = k1;
  }
  if (k0 != channels) return nullptr;
  return std::make_unique<ChannelShuffleKernel>(bc.device.ordinal, std::move(copies), es);
}

}  // namespace osprey::cuda
