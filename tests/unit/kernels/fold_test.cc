// Col2Im (F.fold) of plain float32 data (src/kernels/cpu/fold_kernel.cc: Col2ImF32): strides, dilations and pads,
// overlapping and not. Oracle: the reference Col2Im on the same node and inputs, run twice on other buffers.
#include "kernel_test_util.h"

namespace osprey::testing {
namespace {

Attribute Ints(std::vector<int64_t> v) { return Attribute::Ints(std::move(v)); }

void ExpectCol2Im(int64_t channels, std::vector<int64_t> image, std::vector<int64_t> block, std::vector<int64_t> stride,
                  std::vector<int64_t> dilation, std::vector<int64_t> pads) {
  SCOPED_TRACE("image " + ShapeToString(image) + " block " + ShapeToString(block) + " stride " + ShapeToString(stride) +
               " dilation " + ShapeToString(dilation) + " pads " + ShapeToString(pads));
  int64_t blocks = 1;
  for (int d = 0; d < 2; ++d)
    blocks *= (image[d] + pads[d] + pads[2 + d] - dilation[d] * (block[d] - 1) - 1) / stride[d] + 1;
  Node node =
      MakeNode("Col2Im", 3, 1, {{"strides", Ints(stride)}, {"dilations", Ints(dilation)}, {"pads", Ints(pads)}});
  ExpectFastMatchesReference(node,
                             {RandomTensor({2, channels * block[0] * block[1], blocks}, 3),
                              Tensor::FromVector<int64_t>({2}, image), Tensor::FromVector<int64_t>({2}, block)},
                             {false, true, true}, "Col2ImF32");
}

TEST(Col2Im, MatchesReference) {
  ExpectCol2Im(128, {32, 32}, {2, 2}, {2, 2}, {1, 1}, {0, 0, 0, 0});  // MobileViTV2's patches back to the image
  ExpectCol2Im(3, {9, 7}, {3, 2}, {2, 1}, {1, 2}, {1, 0, 1, 0});      // overlapping, dilated, padded
  ExpectCol2Im(4, {8, 8}, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1});      // unfold(3, padding=1)'s inverse, summing
  ExpectCol2Im(2, {5, 11}, {3, 3}, {1, 3}, {2, 1}, {2, 1, 2, 1});     // a stride wider than the block, pads both sides
}

TEST(Col2Im, DeclinesOtherForms) {
  // Three spatial dims, and image sizes that are not constants: the reference kernel runs them.
  Node node = MakeNode("Col2Im", 3, 1);
  EXPECT_TRUE(FastKernelDeclines(node,
                                 {RandomTensor({1, 8, 1}, 1), Tensor::FromVector<int64_t>({3}, {2, 2, 2}),
                                  Tensor::FromVector<int64_t>({3}, {2, 2, 2})},
                                 {false, true, true}));
  EXPECT_TRUE(FastKernelDeclines(
      node,
      {RandomTensor({1, 8, 9}, 1), Tensor::FromVector<int64_t>({2}, {4, 4}), Tensor::FromVector<int64_t>({2}, {2, 2})},
      {false, false, true}));
}

}  // namespace
}  // namespace osprey::testing
