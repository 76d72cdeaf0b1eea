#pragma once
// Col2Im and MaxUnpool (fold.cc): ops that scatter values back onto an image. What a node asks for, resolved from its
// attributes, input shapes and size inputs; shared by the schemas and the kernels (kernels/reference/fold.cc). Each
// throws kInvalidArgument naming the node for a request that makes no sense.
#include <vector>

#include "osprey/graph.h"
#include "osprey/tensor.h"

namespace osprey {

// Col2Im (PyTorch's F.fold): input [N, C x prod(block), L], L the blocks a window of `block` sliding over the padded
// image takes; output [N, C, image...], overlapping values summed.
struct Col2ImParams {
  std::vector<int64_t> image, block, dilations, strides, pads_begin, pads_end, blocks;  // blocks: per spatial dim
  int64_t channels = 0;
};
Col2ImParams ResolveCol2Im(const Node& node, const Shape& x, const Tensor& image_shape, const Tensor& block_shape);

// MaxUnpool: X [N, C, spatial...] and MaxPool's indices (flat into the output, per the whole tensor) -> the output,
// zeros but where an index puts an X value. The output's spatial size is output_shape's when given, else what the
// pooling window (kernel_shape, strides, pads) inverts to.
Shape ResolveMaxUnpool(const Node& node, const Shape& x, const Tensor* output_shape);

}  // namespace osprey
