// Reference kernels of osprey's internal ops (schemas and semantics: src/ops/internal_ops.cc). Plain layout only;
// they are the oracle of the fast kernels in src/kernels/cpu/channel_kernels.cc.
#include <cstring>

#include "kernels/reference/reference.h"
#include "ops/op_registry.h"

namespace osprey {
namespace {

// Concatenates the inputs along axis 1 into one plain tensor, then copies shuffled channel k of that tensor
// ((k % groups) * (C / groups) + k / groups) to the output holding k. Each channel is one contiguous inner block per
// batch item.
void ChannelShuffleKernel(KernelContext& ctx) {
  const Tensor& in0 = ctx.In(0);
  const size_t es = DTypeSize(in0.dtype());
  const int64_t batch = in0.dim(0);
  int64_t inner = 1;
  for (int64_t d = 2; d < in0.rank(); ++d) inner *= in0.dim(d);
  int64_t channels = 0;
  for (size_t i = 0; i < ctx.inputs.size(); ++i) channels += ctx.In(static_cast<int>(i)).dim(1);
  const int64_t groups = ctx.node.GetInt("groups", 1);
  if (groups < 1 || channels % groups != 0)
    throw Error(ErrorCode::kInternal, ctx.node.Describe() + ": groups " + std::to_string(groups) + " does not divide " +
                                          std::to_string(channels) + " channels");
  const size_t block = static_cast<size_t>(inner) * es;

  std::vector<char> concat(static_cast<size_t>(batch * channels) * block);
  int64_t first_channel = 0;
  for (size_t i = 0; i < ctx.inputs.size(); ++i) {
    const Tensor& in = ctx.In(static_cast<int>(i));
    const size_t part = static_cast<size_t>(in.dim(1)) * block;
    for (int64_t n = 0; n < batch; ++n)
      if (part)
        std::memcpy(concat.data() + (static_cast<size_t>(n * channels + first_channel)) * block,
                    static_cast<const char*>(in.raw()) + static_cast<size_t>(n) * part, part);
    first_channel += in.dim(1);
  }

  const int64_t per_group = channels / groups;
  int64_t k = 0;  // shuffled channel index across all outputs
  for (Tensor* out : ctx.outputs) {
    const int64_t out_channels = out->dim(1);
    if (out->nbytes() != static_cast<size_t>(batch * out_channels) * block)
      throw Error(ErrorCode::kInternal,
                  ctx.node.Describe() + ": output shape " + ShapeToString(out->shape()) + " does not fit the inputs");
    for (int64_t j = 0; j < out_channels; ++j, ++k) {
      const int64_t src = (k % groups) * per_group + k / groups;
      for (int64_t n = 0; n < batch; ++n)
        if (block)
          std::memcpy(static_cast<char*>(out->raw()) + static_cast<size_t>(n * out_channels + j) * block,
                      concat.data() + static_cast<size_t>(n * channels + src) * block, block);
    }
  }
  if (k != channels)
    throw Error(ErrorCode::kInternal, ctx.node.Describe() + ": outputs hold " + std::to_string(k) +
                                          " channels, the "
                                          "inputs " +
                                          std::to_string(channels));
}

}  // namespace

void AddInternalReferenceKernels(ReferenceKernelTable& t) { t.Add(kChannelShuffleOp, ChannelShuffleKernel); }

}  // namespace osprey
