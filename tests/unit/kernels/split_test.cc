// Concat and Split of plain data (src/kernels/cpu/channel_kernels.cc: SplitPlain, ConcatPlain, SplitChannelsF32):
// any axis, rank and dtype; each thread copies an equal share of the bytes, across parts and rows. Oracle: the
// reference Concat and Split kernels on the same node and inputs, every output compared (Split's too), run twice on
// other buffers.
#include "kernel_test_util.h"

namespace osprey::testing {
namespace {

void ExpectAllOutputsMatch(const Node& node, const std::vector<Tensor>& inputs, const std::vector<bool>& constant,
                           const char* kernel_name) {
  std::vector<Tensor> outputs;
  KernelBuildContext bc = MakeBuildContext(node, inputs, constant, outputs);
  std::unique_ptr<Kernel> kernel = CreateCpuKernel(bc);
  ASSERT_NE(kernel, nullptr);
  EXPECT_EQ(std::string(kernel->Name()), kernel_name);
  for (int run = 0; run < 2; ++run) {
    SCOPED_TRACE("run " + std::to_string(run));
    const std::vector<Tensor> in = run == 0 ? inputs : OtherRuntimeInputs(inputs, constant);
    const std::vector<Tensor> expected = RunReferenceNode(node, in);
    if (run == 1) MakeBuildContext(node, in, constant, outputs);  // fresh NaN-filled outputs
    RunKernel(*kernel, node, in, outputs);
    ASSERT_EQ(outputs.size(), expected.size());
    for (size_t j = 0; j < outputs.size(); ++j) {
      SCOPED_TRACE("output " + std::to_string(j));
      ExpectTensorNear(outputs[j], expected[j], 0.0f, 0.0f);  // copies: exact
    }
  }
}

void ExpectSplit(const Tensor& x, int64_t axis, const std::vector<int64_t>& sizes, const char* kernel = "SplitPlain") {
  SCOPED_TRACE(ShapeToString(x.shape()) + " axis " + std::to_string(axis));
  Node node = MakeNode("Split", 2, static_cast<int>(sizes.size()), {{"axis", Attribute::Int(axis)}});
  ExpectAllOutputsMatch(node, {x, Tensor::FromVector<int64_t>({static_cast<int64_t>(sizes.size())}, sizes)},
                        {false, true}, kernel);
}

void ExpectConcat(const std::vector<Tensor>& parts, int64_t axis) {
  SCOPED_TRACE(ShapeToString(parts[0].shape()) + " axis " + std::to_string(axis));
  Node node = MakeNode("Concat", static_cast<int>(parts.size()), 1, {{"axis", Attribute::Int(axis)}});
  ExpectAllOutputsMatch(node, parts, std::vector<bool>(parts.size(), false), "ConcatPlain");
}

TEST(SplitPlain, LastAxisAsLeViTSplitsQkv) {
  ExpectSplit(RandomTensor({1, 196, 4, 64}, 1), 3, {16, 16, 32});
  ExpectSplit(RandomTensor({1, 196, 4, 64}, 1), -1, {16, 16, 32});
}

TEST(SplitPlain, OtherAxesRanksAndDtypes) {
  ExpectSplit(RandomTensor({6, 5}, 2), 0, {1, 2, 3});
  ExpectSplit(RandomTensor({2, 7, 3}, 3), 1, {3, 0, 4});    // an empty part
  ExpectSplit(RandomTensor({256, 512}, 4), 1, {128, 384});  // large enough to run in parallel
  ExpectSplit(RandomTensor({1, 3, 300, 300}, 7), 3, {7, 0, 293});  // parallel, shares crossing rows and parts
  Tensor ids(DType::kI64, {3, 8});
  for (int64_t i = 0; i < ids.numel(); ++i) ids.data<int64_t>()[i] = i * 7 - 11;
  ExpectSplit(ids, 1, {5, 3});
}

TEST(SplitPlain, ChannelsOfRank4Float32StayOnTheChannelKernel) {
  ExpectSplit(RandomTensor({2, 6, 3, 3}, 5), 1, {2, 4}, "SplitChannelsF32");
  ExpectSplit(RandomTensor({1, 64, 40, 40}, 6), 1, {40, 24}, "SplitChannelsF32");  // one image: outputs in parallel
}

TEST(ConcatPlain, UnequalPartsOfOneImageAreSharedAmongThreads) {
  // 64 + 32 + 32 channels of one 96x96 image: one row, parts of unequal sizes, large enough to run in parallel.
  ExpectConcat({RandomTensor({1, 64, 96, 96}, 8), RandomTensor({1, 32, 96, 96}, 9), RandomTensor({1, 32, 96, 96}, 10)},
               1);
}

TEST(ConcatPlain, ManyRowsSmallAndEmptyParts) {
  ExpectConcat({RandomTensor({300, 5, 7}, 11), RandomTensor({300, 0, 7}, 12), RandomTensor({300, 50, 7}, 13)}, 1);
  ExpectConcat({RandomTensor({4, 3}, 14), RandomTensor({4, 1}, 15)}, -1);  // small: one thread
  std::vector<Tensor> many;  // 150 parts of 1-3 floats over 400 rows: small parts, in parallel
  for (uint32_t i = 0; i < 150; ++i) many.push_back(RandomTensor({400, 1 + i % 3}, 100 + i));
  ExpectConcat(many, 1);
  Tensor a(DType::kI64, {2, 2}), b(DType::kI64, {1, 2});
  for (int64_t i = 0; i < 4; ++i) a.data<int64_t>()[i] = i - 2;
  b.data<int64_t>()[0] = 40;
  b.data<int64_t>()[1] = 41;
  ExpectConcat({a, b}, 0);
}

TEST(SplitPlain, CoordinatePairsAsRaftSplitsAndJoinsThem) {
  // Parts of one float per row (fixed-size copies, not a memcpy call each): RAFT's [.., 2] sampling grids taken
  // apart into x and y and put back together, one thread and in parallel (4 MiB).
  ExpectSplit(RandomTensor({320, 7, 7, 2}, 20), 3, {1, 1});
  ExpectConcat({RandomTensor({320, 7, 7, 1}, 21), RandomTensor({320, 7, 7, 1}, 22)}, 3);
  ExpectSplit(RandomTensor({4096, 128, 2}, 23), -1, {1, 1});
  ExpectConcat({RandomTensor({4096, 128, 1}, 24), RandomTensor({4096, 128, 3}, 25), RandomTensor({4096, 128, 0}, 26)},
               2);
  Tensor bytes(DType::kU8, {70000, 5});  // parts of 3 and 2 bytes: the copy of any other size
  for (int64_t i = 0; i < bytes.numel(); ++i) bytes.data<uint8_t>()[i] = static_cast<uint8_t>(i * 13);
  ExpectSplit(bytes, 1, {3, 2});
}

// Gather of plain data (GatherPlain): any axis, dtype and index shape, int32 or int64 indices, negative ones wrapped,
// constant or not. Oracle: the reference Gather, exact.
void ExpectGather(const Tensor& data, const Tensor& indices, int64_t axis, bool constant_indices = true) {
  SCOPED_TRACE(ShapeToString(data.shape()) + " axis " + std::to_string(axis) + " indices " +
               ShapeToString(indices.shape()));
  Node node = MakeNode("Gather", 2, 1, {{"axis", Attribute::Int(axis)}});
  ExpectAllOutputsMatch(node, {data, indices}, {false, constant_indices}, "GatherPlain");
}

TEST(GatherPlain, AnyAxisDtypeAndIndexShape) {
  // F.unfold as PyTorch's dynamo exporter writes it (MobileViTV2): the rows, then the columns, of 2x2 patches.
  std::vector<int64_t> halves;
  for (int64_t j = 0; j < 2; ++j)
    for (int64_t i = 0; i < 16; ++i) halves.push_back(2 * i + j);
  const Tensor patches = Tensor::FromVector<int64_t>({2, 16}, halves);
  ExpectGather(RandomTensor({1, 8, 32, 32}, 1), patches, 2);
  ExpectGather(RandomTensor({1, 8, 2, 16, 32}, 2), patches, 4);
  ExpectGather(RandomTensor({2, 5, 7}, 3), Tensor::FromVector<int32_t>({4}, {-1, 0, 3, -5}), 1);
  ExpectGather(RandomTensor({2, 10, 3}, 4), Tensor::FromVector<int64_t>({3}, {9, 0, 9}), 1);  // 12-byte runs
  ExpectGather(RandomTensor({3, 1000, 64}, 5), Tensor::FromVector<int64_t>({500}, std::vector<int64_t>(500, 7)), 1);
  ExpectGather(RandomTensor({6, 4}, 6), Tensor::FromVector<int64_t>({}, {-2}), 0);  // a scalar index
  ExpectGather(RandomTensor({4, 9}, 7), Tensor::FromVector<int64_t>({2, 2}, {8, 0, 1, 8}), 1, /*constant=*/false);
  ExpectGather(Tensor::FromVector<int64_t>({4, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}),
               Tensor::FromVector<int64_t>({2, 2}, {3, 0, 0, 2}), 0);  // an embedding's rows
  ExpectGather(Tensor::FromVector<uint8_t>({2, 3}, {1, 2, 3, 4, 5, 6}), Tensor::FromVector<int64_t>({2}, {2, 1}), 1);
}

TEST(GatherPlain, IndicesOutsideTheAxisAreErrorsOrZeroSlices) {
  const Tensor data = RandomTensor({2, 5, 3}, 8);
  Node node = MakeNode("Gather", 2, 1, {{"axis", Attribute::Int(1)}});
  const Tensor bad = Tensor::FromVector<int64_t>({2}, {1, 5});
  std::vector<Tensor> outputs;
  KernelBuildContext bc =
      MakeBuildContext(node, {data, Tensor::FromVector<int64_t>({2}, {1, 4})}, {false, false}, outputs);
  std::unique_ptr<Kernel> kernel = CreateCpuKernel(bc);
  ASSERT_NE(kernel, nullptr);
  try {
    RunKernel(*kernel, node, {data, bad}, outputs);
    ADD_FAILURE() << "index 5 of an axis of 5 was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("index 5 is out of range for an axis of size 5"), std::string::npos)
        << e.what();
  }
  // The one-hot fusion's Gather (kGatherZeroOutside): an index outside the axis gives a zero slice.
  node.attrs[kGatherZeroOutside] = Attribute::Int(1);
  ExpectAllOutputsMatch(node, {data, Tensor::FromVector<int64_t>({3}, {5, 0, -1})}, {false, true}, "GatherPlain");
}

}  // namespace
}  // namespace osprey::testing
