// SplitPlain (src/kernels/cpu/channel_kernels.cc): Split along any axis of plain data, any rank and dtype. Oracle: the
// reference Split kernel on the same node and inputs.
#include "kernel_test_util.h"

namespace osprey::testing {
namespace {

void ExpectSplit(const Tensor& x, int64_t axis, const std::vector<int64_t>& sizes, const char* kernel = "SplitPlain") {
  SCOPED_TRACE(ShapeToString(x.shape()) + " axis " + std::to_string(axis));
  Node node = MakeNode("Split", 2, static_cast<int>(sizes.size()), {{"axis", Attribute::Int(axis)}});
  ExpectFastMatchesReference(node, {x, Tensor::FromVector<int64_t>({static_cast<int64_t>(sizes.size())}, sizes)},
                             {false, true}, kernel);
}

TEST(SplitPlain, LastAxisAsLeViTSplitsQkv) {
  ExpectSplit(RandomTensor({1, 196, 4, 64}, 1), 3, {16, 16, 32});
  ExpectSplit(RandomTensor({1, 196, 4, 64}, 1), -1, {16, 16, 32});
}

TEST(SplitPlain, OtherAxesRanksAndDtypes) {
  ExpectSplit(RandomTensor({6, 5}, 2), 0, {1, 2, 3});
  ExpectSplit(RandomTensor({2, 7, 3}, 3), 1, {3, 0, 4});    // an empty part
  ExpectSplit(RandomTensor({256, 512}, 4), 1, {128, 384});  // large enough to run in parallel
  Tensor ids(DType::kI64, {3, 8});
  for (int64_t i = 0; i < ids.numel(); ++i) ids.data<int64_t>()[i] = i * 7 - 11;
  ExpectSplit(ids, 1, {5, 3});
}

TEST(SplitPlain, ChannelsOfRank4Float32StayOnTheChannelKernel) {
  ExpectSplit(RandomTensor({2, 6, 3, 3}, 5), 1, {2, 4}, "SplitChannelsF32");
  ExpectSplit(RandomTensor({1, 64, 40, 40}, 6), 1, {40, 24}, "SplitChannelsF32");  // one image: outputs in parallel
}

}  // namespace
}  // namespace osprey::testing
