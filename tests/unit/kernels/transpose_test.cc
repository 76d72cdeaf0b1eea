// Transpose's fast kernel (kernels/cpu/transpose_kernel.cc). Oracle: the reference kernel, byte for byte, over every
// permutation of small shapes with size-1 dims (which the kernel drops and merges around), 1-, 2-, 4- and 8-byte
// dtypes, and shapes large enough for the tiled path with ragged tiles and threads.
#include <algorithm>
#include <cstring>
#include <numeric>

#include "kernel_test_util.h"

namespace osprey::testing {
namespace {

Tensor Counting(DType dtype, const Shape& shape) {
  Tensor t(dtype, shape);
  uint8_t* p = static_cast<uint8_t*>(t.raw());
  for (size_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<uint8_t>(i * 7 + i / 251);
  return t;
}

void ExpectTransposeExact(DType dtype, const Shape& shape, const std::vector<int64_t>& perm) {
  Node node = MakeNode("Transpose", 1, 1, {{"perm", Attribute::Ints(perm)}});
  const Tensor x = Counting(dtype, shape);
  const std::vector<Tensor> expected = RunReferenceNode(node, {x});
  std::vector<Tensor> outputs;
  KernelBuildContext bc = MakeBuildContext(node, {x}, {false}, outputs);
  std::unique_ptr<Kernel> kernel = CreateCpuKernel(bc);
  ASSERT_NE(kernel, nullptr);
  EXPECT_STREQ(kernel->Name(), "TransposeCpu");
  RunKernel(*kernel, node, {x}, outputs);
  ASSERT_EQ(outputs[0].shape(), expected[0].shape());
  EXPECT_EQ(std::memcmp(outputs[0].raw(), expected[0].raw(), expected[0].nbytes()), 0);
}

TEST(TransposeKernel, EveryPermutationOfSmallShapes) {
  for (const Shape& shape : {Shape{2, 3, 1, 5}, Shape{4, 1, 3, 2}, Shape{3, 4, 5}, Shape{1, 1, 6, 7}}) {
    std::vector<int64_t> perm(shape.size());
    std::iota(perm.begin(), perm.end(), 0);
    do {
      SCOPED_TRACE(ShapeToString(shape) + " perm " + ShapeToString(perm));
      ExpectTransposeExact(DType::kF32, shape, perm);
    } while (std::next_permutation(perm.begin(), perm.end()));
  }
}

TEST(TransposeKernel, DTypesAndLargeTiledShapes) {
  for (DType dtype : {DType::kU8, DType::kF16, DType::kF32, DType::kI64}) {
    SCOPED_TRACE(DTypeName(dtype));
    ExpectTransposeExact(dtype, {3, 70, 45}, {0, 2, 1});        // ragged 32 x 32 tiles
    ExpectTransposeExact(dtype, {1, 512, 256, 1}, {0, 2, 1, 3});  // magika's swap
    ExpectTransposeExact(dtype, {2, 33, 5, 40}, {3, 1, 0, 2});   // outer dims around the tiles
    ExpectTransposeExact(dtype, {6, 40, 50, 3}, {0, 2, 1, 3});   // rows of 3 moving whole
    ExpectTransposeExact(dtype, {2, 3, 4, 5, 6}, {4, 0, 3, 1, 2});
  }
  ExpectTransposeExact(DType::kF32, {4, 5, 6}, {0, 1, 2});  // identity: a copy
  ExpectTransposeExact(DType::kF32, {}, {});
}

}  // namespace
}  // namespace osprey::testing
