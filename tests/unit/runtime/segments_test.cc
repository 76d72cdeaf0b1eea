// Models cut at data-dependent ops (runtime/segments.h): the parts after a cut are compiled per distinct set of the
// shape values they read, and the model bounds how many such specialised runners stay alive, however the counts vary.
#include "runtime/segments.h"

#include <gtest/gtest.h>

#include <random>

#include "test_util.h"

namespace osprey {
namespace {

// Five stages: stage i keeps the non-zeros of (x_i ++ the previous stage's output) -> NonZero (k_i kept, so each cut
// nests in the previous one), and its output, after the cut, subtracts the previous stage's count (a Shape computed
// before the cut): the part after each cut is specialised per count, the specialisations nested five deep.
constexpr int kStages = 5;

Graph Chain() {
  GraphBuilder b("chain", 13);
  auto one = b.Constant(Tensor::FromVector<int64_t>({1}, {1}));
  auto flat_shape = b.Constant(Tensor::FromVector<int64_t>({1}, {-1}));
  ValueRef v, count;
  for (int i = 0; i < kStages; ++i) {
    auto x = b.Input("x" + std::to_string(i), DType::kF32, {16});
    auto in = v.id >= 0 ? b.Op("Concat", {x, v}, {{"axis", Attribute::Int(0)}}) : x;
    auto nz = b.Op("NonZero", {in});
    auto flat = b.Op("Cast", {b.Op("Reshape", {nz, flat_shape})}, {{"to", Attribute::Int(1)}});
    v = count.id >= 0 ? b.Op("Sub", {flat, b.Op("Cast", {count}, {{"to", Attribute::Int(1)}})}) : flat;
    count = b.Op("Gather", {b.Op("Shape", {nz}), one});
  }
  b.Output(v, "y");
  return b.Finish();
}

TEST(Segments, SpecialisedRunnersStayBoundedAsCountsVary) {
  const Graph g = Chain();
  ASSERT_TRUE(HasDataDependentOps(g));
  auto runner = MakeSegmentedRunner(g, 8, nullptr, nullptr);
  std::mt19937 rng(3);
  CompileOptions options;
  options.num_threads = 1;
  size_t most = 0;
  for (int run = 0; run < 600; ++run) {
    std::vector<Tensor> xs;
    for (int s = 0; s < kStages; ++s) {
      Tensor x(DType::kF32, {16});
      for (int i = 0; i < 16; ++i) x.data<float>()[i] = static_cast<float>(rng() % 2);  // counts vary run to run
      xs.push_back(x);
    }
    const std::vector<Tensor> out = runner->Run(xs, options, nullptr);
    ASSERT_EQ(out.size(), 1u);
    size_t caches = 0;
    runner->ForEachCache([&](PlanCache&) { ++caches; });
    most = std::max(most, caches);
  }
  // At most kMaxSpecialized (256) specialised runners alive, plus the parts that are not specialised; without the
  // model-wide bound these 600 runs kept 1,009 plan caches (16 per level, nested five deep).
  EXPECT_LE(most, 300u);
  EXPECT_GT(most, 100u) << "the chain should specialise its parts";
}

}  // namespace
}  // namespace osprey
