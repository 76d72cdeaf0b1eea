// heads: finding the classifier, truncating the graph, and the logistic-regression fit against a hand-derived optimum.
#include <gtest/gtest.h>

#include <cmath>

#include "osprey/error.h"
#include "osprey/graph.h"
#include "osprey/heads.h"

namespace osprey::heads {
namespace {

Tensor Filled(Shape shape, float v) {
  Tensor t(DType::kF32, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = v;
  return t;
}

// x [N, 8] -> Relu -> "features" -> classifier (kind) -> Softmax -> output.
Graph Classifier(const std::string& kind, bool bias = true) {
  GraphBuilder b("g");
  ValueRef x = b.Input("x", DType::kF32, {-1, 8});
  ValueRef f = b.Op("Relu", {x}, {}, "relu");
  ValueRef logits;
  if (kind == "Gemm") {
    std::vector<ValueRef> in = {f, b.Constant(Filled({5, 8}, 0.1f), "W")};
    if (bias) in.push_back(b.Constant(Filled({5}, 0.f), "B"));
    logits = b.Op("Gemm", in, {{"transB", Attribute::Int(1)}});
  } else if (kind == "MatMul+Add") {
    logits = b.Op("Add", {b.Op("MatMul", {f, b.Constant(Filled({8, 5}, 0.1f), "W")}), b.Constant(Filled({5}, 0), "B")});
  } else {  // Conv 1x1 on [N, 8, 1, 1]
    ValueRef f4 = b.Op("Reshape", {f, b.Constant(Tensor::FromVector<int64_t>({4}, {-1, 8, 1, 1}))});
    logits = b.Op("Conv", {f4, b.Constant(Filled({5, 8, 1, 1}, 0.1f), "W"), b.Constant(Filled({5}, 0), "B")});
    logits = b.Op("Flatten", {logits});
  }
  b.Output(b.Op("Softmax", {logits}), "probs");
  return b.Finish();
}

TEST(FindHead, EachClassifierKind) {
  for (const std::string kind : {"Gemm", "MatMul+Add", "Conv"}) {
    Graph g = Classifier(kind);
    HeadInfo h = FindHead(g);
    EXPECT_EQ(h.kind, kind);
    EXPECT_EQ(h.weight, "W");
    EXPECT_EQ(h.bias, "B");
    EXPECT_EQ(h.classes, 5);
    EXPECT_EQ(h.feature_dim, 8);
    EXPECT_EQ(h.output, "probs");
    if (kind != "Conv") {
      EXPECT_EQ(h.feature, g.value_names[g.nodes[0].outputs[0]]);  // the Relu's output
    }
  }
  EXPECT_TRUE(FindHead(Classifier("Gemm")).transposed);
  EXPECT_FALSE(FindHead(Classifier("MatMul+Add")).transposed);
}

TEST(FindHead, RefusalsSayWhy) {
  try {
    FindHead(Classifier("Gemm", /*bias=*/false));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("no bias"), std::string::npos);
  }
  GraphBuilder b("relu_only");
  b.Output(b.Op("Relu", {b.Input("x", DType::kF32, {1, 4})}), "y");
  EXPECT_THROW(FindHead(b.Finish()), Error);
  EXPECT_THROW(FindHead(Classifier("Gemm"), "not_the_features"), Error);
}

TEST(TruncateAt, KeepsOnlyWhatTheValueNeeds) {
  Graph g = Classifier("Gemm");
  const HeadInfo h = FindHead(g);
  Graph t = TruncateAt(g, h.feature);
  ASSERT_EQ(t.nodes.size(), 1u);
  EXPECT_EQ(t.nodes[0].op_type, "Relu");
  EXPECT_TRUE(t.constants.empty());  // W and B are not needed for the features
  ASSERT_EQ(t.outputs.size(), 1u);
  EXPECT_EQ(t.value_names[t.outputs[0]], h.feature);
  EXPECT_THROW(TruncateAt(g, "nope"), Error);
}

// Two points, x = +1 (class 1) and x = -1 (class 0), C = 1. By symmetry the optimum is w1 = -w0 = a, b1 = b0, and
// d/da [2 log(1 + e^(-2a)) + a^2] = 0 gives a = 2 sigmoid(-2a): found here by bisection, independently of the fit.
TEST(FitSoftmax, ReachesTheHandDerivedOptimum) {
  double lo = 0, hi = 2;
  for (int i = 0; i < 200; ++i) {
    const double mid = 0.5 * (lo + hi);
    (mid - 2.0 / (1.0 + std::exp(2 * mid)) > 0 ? hi : lo) = mid;
  }
  const SoftmaxFit fit = FitSoftmax({1.f, -1.f}, 2, 1, {1, 0}, 2, 1.0);
  EXPECT_TRUE(fit.converged);
  EXPECT_NEAR(fit.weight[1], lo, 1e-4);
  EXPECT_NEAR(fit.weight[0], -lo, 1e-4);
  EXPECT_NEAR(fit.bias[1] - fit.bias[0], 0, 1e-4);
}

// On a random 3-class problem the returned point has a vanishing gradient of the objective (computed here).
TEST(FitSoftmax, GradientVanishesAndRunsRepeat) {
  const int64_t n = 60, d = 4, k = 3;
  std::vector<float> x(n * d);
  std::vector<int> y(n);
  uint64_t s = 7;
  auto next = [&] { return static_cast<float>(((s = s * 6364136223846793005ull + 1442695040888963407ull) >> 40) /
                                              16777216.0) - 0.5f; };
  for (int64_t i = 0; i < n; ++i) {
    y[i] = static_cast<int>(i % k);
    for (int64_t j = 0; j < d; ++j) x[i * d + j] = next() + (j == y[i] ? 1.f : 0.f);
  }
  const double c = 0.5;
  const SoftmaxFit fit = FitSoftmax(x, n, d, y, k, c, 2000, 1e-8);
  std::vector<double> gw(k * d, 0), gb(k, 0);
  for (int64_t i = 0; i < n; ++i) {
    std::vector<double> z(k);
    double m = -1e300, sum = 0;
    for (int64_t a = 0; a < k; ++a) {
      z[a] = fit.bias[a];
      for (int64_t j = 0; j < d; ++j) z[a] += double(fit.weight[a * d + j]) * x[i * d + j];
      m = std::max(m, z[a]);
    }
    for (double& v : z) sum += std::exp(v - m);
    for (int64_t a = 0; a < k; ++a) {
      const double r = std::exp(z[a] - m) / sum - (a == y[i] ? 1 : 0);
      gb[a] += r;
      for (int64_t j = 0; j < d; ++j) gw[a * d + j] += r * x[i * d + j];
    }
  }
  for (int64_t a = 0; a < k * d; ++a) EXPECT_NEAR(gw[a] + fit.weight[a] / c, 0, 1e-3) << a;
  for (int64_t a = 0; a < k; ++a) EXPECT_NEAR(gb[a], 0, 1e-3);
  const SoftmaxFit again = FitSoftmax(x, n, d, y, k, c, 2000, 1e-8);
  EXPECT_EQ(again.weight, fit.weight);
  EXPECT_EQ(again.bias, fit.bias);
}

TEST(FitSoftmax, BadInputs) {
  EXPECT_THROW(FitSoftmax({1.f}, 1, 1, {0}, 1), Error);          // one class
  EXPECT_THROW(FitSoftmax({1.f, 2.f}, 1, 1, {0}, 2), Error);     // x size
  EXPECT_THROW(FitSoftmax({1.f}, 1, 1, {3}, 2), Error);          // label out of range
  EXPECT_THROW(FitSoftmax({1.f}, 1, 1, {0}, 2, -1.0), Error);    // C <= 0
}

}  // namespace
}  // namespace osprey::heads
