// GroupNormF32 (src/kernels/cpu/groupnorm.cc): InstanceNormalization, GroupNormalization and _GroupNorm on plain
// float32 data. Oracle: the reference kernel (one group per thread, double statistics) on the same node and inputs.
#include "kernel_test_util.h"

namespace osprey::testing {
namespace {

Node Norm(const std::string& op, int64_t groups = 0, float epsilon = 1e-5f) {
  AttributeMap attrs{{"epsilon", Attribute::Float(epsilon)}};
  if (groups > 0) attrs["num_groups"] = Attribute::Int(groups);
  return MakeNode(op, 3, 1, attrs);
}

void Expect(const Node& node, const Shape& x, int64_t params, int opset = 17, float offset = 0.f) {
  SCOPED_TRACE(node.op_type + " " + ShapeToString(x) + " opset " + std::to_string(opset) + " offset " +
               std::to_string(offset));
  for (bool constant : {true, false})
    ExpectFastMatchesReference(node,
                               {RandomTensor(x, 1, -1.f + offset, 1.f + offset), RandomTensor({params}, 2, 0.5f, 1.5f),
                                RandomTensor({params}, 3)},
                               {false, constant, constant}, "GroupNormF32", opset);
}

TEST(GroupNormF32, InstanceNormalization) {
  Expect(Norm("InstanceNormalization"), {2, 3, 5, 7}, 3);
  Expect(Norm("InstanceNormalization"), {1, 4, 130, 130}, 4);      // 16,900 elements a channel: two chunks each
  Expect(Norm("InstanceNormalization", 0, 1e-3f), {3, 2, 11}, 2);  // rank 3
}

TEST(GroupNormF32, GroupNormalizationPerGroupAndPerChannel) {
  Expect(Norm("GroupNormalization", 2), {2, 6, 9, 9}, 2, 18);  // opset 18: scale and bias per group
  Expect(Norm("GroupNormalization", 3), {2, 6, 9, 9}, 6, 21);  // opset 21: per channel
  Expect(Norm(kGroupNormOp, 4), {1, 8, 40, 40}, 8);            // the fusion's op: per channel at any opset
}

TEST(GroupNormF32, OneGroupOverManyChunks) {
  // PoolFormer's GroupNorm(1): one group of 64 x 56 x 56 elements, cut into chunks across the threads.
  Expect(Norm(kGroupNormOp, 1), {1, 64, 56, 56}, 64);
  Expect(Norm(kGroupNormOp, 1), {2, 5, 3, 3}, 5);  // small: below the parallel threshold
}

TEST(GroupNormF32, FusedActivations) {
  // The runtime's FuseActivation hands a following activation to the norm (_activation); the reference kernel
  // applies it after normalising, the fast one to each piece it writes.
  for (const char* act : {"Relu", "Silu", "HardSwish", "Gelu"}) {
    SCOPED_TRACE(act);
    Node node = Norm(kGroupNormOp, 4);
    node.attrs["_activation"] = Attribute::String(act);
    Expect(node, {2, 8, 40, 41}, 8);
    Node instance = Norm("InstanceNormalization");
    instance.attrs["_activation"] = Attribute::String(act);
    Expect(instance, {1, 3, 130, 130}, 3);
  }
}

TEST(GroupNormF32, MeanFarFromZero) {
  Expect(Norm(kGroupNormOp, 1), {1, 16, 64, 64}, 16, 17, 300.f);
  Expect(Norm("InstanceNormalization"), {1, 3, 33, 33}, 3, 17, -1000.f);
}

}  // namespace
}  // namespace osprey::testing
