// Loading a model reads each weight once: Graph::ContentDigest keys it in the WeightStore and stands for its bytes
// in the fingerprint, and the store keeps an imported buffer nobody else holds instead of copying it. Oracles: the
// plain Intern / Fingerprint() paths, buffer addresses and the store's and allocator's byte counts.
#include <gtest/gtest.h>

#include <cstring>

#include "core/hash.h"
#include "osprey/runtime.h"
#include "test_util.h"

namespace osprey {
namespace {

using testing::RandomTensor;

Graph Affine(const Tensor& w, const Tensor& b) {
  GraphBuilder g("affine", 13);
  auto x = g.Input("x", DType::kF32, {2, w.shape()[0]});
  g.Output(g.Op("Add", {g.Op("MatMul", {x, g.Constant(w)}), g.Constant(b)}), "y");
  return g.Finish();
}

TEST(WeightIntern, OwnedTensorIsKeptNotCopied) {
  const int64_t before = Allocator::Host().BytesLive();
  {
    WeightStore store;
    Tensor t = RandomTensor({300, 300}, 1);
    const void* data = t.raw();
    const size_t bytes = t.buffer()->size();
    const Graph::Digest digest = Graph::ContentDigest(t);
    Tensor stored = store.InternOwned(std::move(t), digest);
    EXPECT_EQ(stored.raw(), data) << "the sole holder's buffer is kept";
    EXPECT_EQ(store.BytesLive(), static_cast<int64_t>(bytes)) << "and charged to the store";
    EXPECT_EQ(Allocator::Host().BytesLive() - before, static_cast<int64_t>(bytes)) << "once";
    // An equal tensor interned later (either way) is the stored one.
    Tensor again = RandomTensor({300, 300}, 1);
    EXPECT_EQ(store.Intern(again).raw(), data);
    Tensor owned_again = RandomTensor({300, 300}, 1);
    EXPECT_EQ(store.InternOwned(std::move(owned_again), digest).raw(), data);
    stored = Tensor();
    EXPECT_EQ(store.BytesLive(), 0) << "the charge ends with the last holder";
  }
  EXPECT_EQ(Allocator::Host().BytesLive(), before);
}

TEST(WeightIntern, SharedTensorIsCopied) {
  WeightStore store;
  Tensor t = RandomTensor({64, 64}, 2);
  Tensor caller_copy = t;  // someone else holds the buffer: the store must not alias it
  Tensor stored = store.InternOwned(std::move(t), Graph::ContentDigest(caller_copy));
  EXPECT_NE(stored.raw(), caller_copy.raw());
  EXPECT_EQ(std::memcmp(stored.raw(), caller_copy.raw(), caller_copy.nbytes()), 0);
  caller_copy.data<float>()[0] = 1000.f;
  EXPECT_NE(stored.data<float>()[0], 1000.f);
  // A view that does not start its buffer is copied too.
  Tensor big = RandomTensor({2, 64}, 3);
  Tensor second_row = Tensor::View(DType::kF32, {64}, big.buffer(), 64 * sizeof(float));
  big = Tensor();
  Tensor row_stored = store.InternOwned(second_row, Graph::ContentDigest(second_row));
  EXPECT_NE(row_stored.raw(), second_row.raw());
}

TEST(WeightIntern, FingerprintFromDigestsEqualsFingerprint) {
  const Tensor w = RandomTensor({8, 4}, 4), b = RandomTensor({4}, 5);
  Graph g = Affine(w, b);
  std::unordered_map<int, Graph::Digest> digests;
  for (const auto& [id, t] : g.constants) digests.emplace(id, Graph::ContentDigest(t));
  EXPECT_EQ(g.Fingerprint(digests), g.Fingerprint());
  // The Model's fingerprint is that one, and one changed weight value changes it.
  Model model(Affine(w, b));
  EXPECT_EQ(model.fingerprint(), g.Fingerprint());
  Tensor w2 = w.Clone();
  w2.data<float>()[31] += 1e-6f;
  EXPECT_NE(Model(Affine(w2, b)).fingerprint(), model.fingerprint());
}

TEST(WeightIntern, ModelsShareAndFreeAdoptedWeights) {
  auto store = std::make_shared<WeightStore>();
  ModelOptions options;
  options.weight_store = store;
  const Tensor x = RandomTensor({2, 8}, 6);
  TrimSharedArenas(0);
  const int64_t before = Allocator::Host().BytesLive();
  {
    Model a(Affine(RandomTensor({8, 4}, 7), RandomTensor({4}, 8)), options);
    const int64_t one = store->BytesLive();
    Model b(Affine(RandomTensor({8, 4}, 7), RandomTensor({4}, 8)), options);
    EXPECT_EQ(store->BytesLive(), one) << "the second model's equal weights are the first's";
    EXPECT_EQ(a.SharedWeightBytes(), b.SharedWeightBytes());
    EXPECT_GT(a.SharedWeightBytes(), 0);
    const Tensor ya = a.Run({{"x", x}})[0].second, yb = b.Run({{"x", x}})[0].second;
    EXPECT_EQ(std::memcmp(ya.raw(), yb.raw(), ya.nbytes()), 0);
  }
  EXPECT_EQ(store->BytesLive(), 0);
  TrimSharedArenas(0);  // the runs' idle arena
  EXPECT_EQ(Allocator::Host().BytesLive(), before);
}

TEST(WeightIntern, HashBytesCoversEveryByteAndLength) {
  std::vector<unsigned char> data(200);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<unsigned char>(i * 7 + 1);
  std::vector<Hash128> seen;
  for (size_t n = 0; n <= 100; ++n) {
    const Hash128 h = HashBytes(data.data(), n);
    EXPECT_EQ(h, HashBytes(data.data(), n));
    for (const Hash128& other : seen) EXPECT_FALSE(h == other) << "length " << n;
    seen.push_back(h);
  }
  const Hash128 full = HashBytes(data.data(), 100);
  for (size_t i = 0; i < 100; ++i) {
    data[i] ^= 1;
    EXPECT_FALSE(HashBytes(data.data(), 100) == full) << "byte " << i;
    data[i] ^= 1;
  }
}

// A batch normalisation folded into the Conv before it scales the Conv's weight; with a store, the scaled weight is
// derived from the stored one once (runtime/fusion.cc ScaledWeight) and every later compile of the model (a new input
// shape) gets that buffer instead of copying, scaling and interning the weight again. Oracle: the unfused plan.
Graph ConvBatchNorm(const Tensor& w, float gamma) {
  GraphBuilder g("conv_bn", 13);
  auto x = g.Input("x", DType::kF32, {-1, 3, -1, -1});
  const Tensor c = Tensor::FromVector<float>({4}, {gamma, 0.5f, 2.f, -1.f});
  const Tensor d = Tensor::FromVector<float>({4}, {0.1f, -0.2f, 0.3f, 0.f});
  const Tensor v = Tensor::FromVector<float>({4}, {1.f, 0.25f, 4.f, 0.5f});
  auto y = g.Op("Conv", {x, g.Constant(w)}, {{"pads", Attribute::Ints({1, 1, 1, 1})}});
  g.Output(g.Op("BatchNormalization", {y, g.Constant(c), g.Constant(d), g.Constant(d), g.Constant(v)}), "y");
  return g.Finish();
}

TEST(WeightIntern, FoldedWeightsAreDerivedOncePerModel) {
  const Tensor w = RandomTensor({4, 3, 3, 3}, 4);
  const CompileOptions folded{.num_threads = 1, .fast_kernels = false, .fuse = true};
  const CompileOptions oracle{.num_threads = 1, .fast_kernels = false, .fuse = false};
  WeightStore store;
  std::vector<std::shared_ptr<const Plan>> plans;
  for (const Shape& shape : {Shape{1, 3, 8, 8}, Shape{2, 3, 5, 9}, Shape{1, 3, 7, 4}}) {
    SCOPED_TRACE(ShapeToString(shape));
    plans.push_back(Compile(ConvBatchNorm(w, 1.5f), {{DType::kF32, shape}}, folded, &store));
    EXPECT_EQ(store.NumDerivedLive(), 1u) << "one scaled weight for every shape";
    const Tensor x = RandomTensor(shape, 5);
    testing::ExpectTensorNear(plans.back()->Run({x})[0],
                              Compile(ConvBatchNorm(w, 1.5f), {{DType::kF32, shape}}, oracle)->Run({x})[0], 1e-5f,
                              1e-5f);
  }
  // Other scales, another derived weight; without a store the fold still works.
  plans.push_back(Compile(ConvBatchNorm(w, -3.f), {{DType::kF32, {1, 3, 8, 8}}}, folded, &store));
  EXPECT_EQ(store.NumDerivedLive(), 2u);
  const Tensor x = RandomTensor({1, 3, 8, 8}, 6);
  testing::ExpectTensorNear(Compile(ConvBatchNorm(w, -3.f), {{DType::kF32, {1, 3, 8, 8}}}, folded)->Run({x})[0],
                            plans.back()->Run({x})[0], 1e-6f, 1e-6f);
  plans.clear();
  EXPECT_EQ(store.NumDerivedLive(), 0u) << "the derived weights live with the plans";
}

}  // namespace
}  // namespace osprey
