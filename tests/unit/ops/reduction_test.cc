// Reduction family: Reduce* (axes as attribute or input, keepdims, noop_with_empty_axes), ArgMax/ArgMin, TopK.
// Oracles are hand-computed values, or a naive triple loop over a 3-D input written in this file.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "test_util.h"

namespace osprey {
namespace {

using testing::ExpectTensorNear;
using testing::MakeNode;
using testing::RandomTensor;
using testing::RunReferenceNode;

Tensor F32(Shape shape, std::vector<float> v) { return Tensor::FromVector<float>(std::move(shape), v); }
Tensor I64(Shape shape, std::vector<int64_t> v) { return Tensor::FromVector<int64_t>(std::move(shape), v); }

void ExpectError(const std::function<void()>& fn, ErrorCode code, const std::string& substring) {
  try {
    fn();
    ADD_FAILURE() << "expected an Error containing '" << substring << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(substring), std::string::npos) << e.what();
  }
}

// Runs a Reduce op in its opset-18 form (axes as input 1), or the attribute form when opset is older.
Tensor Reduce(const std::string& op, const Tensor& x, std::vector<int64_t> axes, int64_t keepdims, int opset = 18,
              int64_t noop = 0) {
  AttributeMap attrs = {{"keepdims", Attribute::Int(keepdims)}, {"noop_with_empty_axes", Attribute::Int(noop)}};
  const bool axes_input = opset >= (op == "ReduceSum" ? 13 : 18);
  if (!axes_input) {
    if (!axes.empty()) attrs["axes"] = Attribute::Ints(axes);
    return RunReferenceNode(MakeNode(op, 1, 1, attrs), {x}, opset)[0];
  }
  Tensor axes_tensor = I64({static_cast<int64_t>(axes.size())}, axes);
  return RunReferenceNode(MakeNode(op, 2, 1, attrs), {x, axes_tensor}, opset)[0];
}

// Naive reduction of a 3-D float tensor over the axes flagged in `mask`, in double; keepdims=1 layout.
Tensor NaiveReduce3D(const Tensor& x, std::vector<bool> mask, double init,
                     const std::function<double(double, double)>& step,
                     const std::function<double(double, int64_t)>& finish) {
  const Shape& s = x.shape();
  Shape out_shape = {mask[0] ? 1 : s[0], mask[1] ? 1 : s[1], mask[2] ? 1 : s[2]};
  std::vector<double> acc(NumElements(out_shape), init);
  int64_t count = 1;
  for (int a = 0; a < 3; ++a)
    if (mask[a]) count *= s[a];
  for (int64_t i = 0; i < s[0]; ++i)
    for (int64_t j = 0; j < s[1]; ++j)
      for (int64_t k = 0; k < s[2]; ++k) {
        int64_t o = ((mask[0] ? 0 : i) * out_shape[1] + (mask[1] ? 0 : j)) * out_shape[2] + (mask[2] ? 0 : k);
        acc[o] = step(acc[o], x.data<float>()[(i * s[1] + j) * s[2] + k]);
      }
  Tensor out(DType::kF32, out_shape);
  for (size_t o = 0; o < acc.size(); ++o) out.data<float>()[o] = static_cast<float>(finish(acc[o], count));
  return out;
}

TEST(ReductionReduce, EveryOpMatchesNaiveLoopOnOddShapes) {
  struct Case {
    const char* op;
    double init;
    std::function<double(double, double)> step;
    std::function<double(double, int64_t)> finish;
    float lo, hi;
  };
  auto id = [](double a, int64_t) { return a; };
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<Case> cases = {
      {"ReduceSum", 0, [](double a, double v) { return a + v; }, id, -1, 1},
      {"ReduceMean", 0, [](double a, double v) { return a + v; }, [](double a, int64_t n) { return a / n; }, -1, 1},
      {"ReduceMax", -inf, [](double a, double v) { return std::max(a, v); }, id, -1, 1},
      {"ReduceMin", inf, [](double a, double v) { return std::min(a, v); }, id, -1, 1},
      {"ReduceProd", 1, [](double a, double v) { return a * v; }, id, 0.5f, 1.5f},
      {"ReduceL1", 0, [](double a, double v) { return a + std::fabs(v); }, id, -1, 1},
      {"ReduceL2", 0, [](double a, double v) { return a + v * v; }, [](double a, int64_t) { return std::sqrt(a); }, -1,
       1},
      {"ReduceSumSquare", 0, [](double a, double v) { return a + v * v; }, id, -1, 1},
      {"ReduceLogSum", 0, [](double a, double v) { return a + v; }, [](double a, int64_t) { return std::log(a); }, 0.1f,
       2},
      {"ReduceLogSumExp", 0, [](double a, double v) { return a + std::exp(v); },
       [](double a, int64_t) { return std::log(a); }, -3, 3},
  };
  const std::vector<std::vector<bool>> masks = {{true, false, false}, {false, true, false}, {false, false, true},
                                                {true, false, true},  {false, true, true},  {true, true, true}};
  uint32_t seed = 11;
  for (const Case& c : cases) {
    Tensor x = RandomTensor({3, 5, 13}, seed++, c.lo, c.hi);
    for (const auto& mask : masks) {
      std::vector<int64_t> axes;
      for (int a = 0; a < 3; ++a)
        if (mask[a]) axes.push_back(a);
      SCOPED_TRACE(std::string(c.op) + " axes " + ShapeToString(axes));
      Tensor want = NaiveReduce3D(x, mask, c.init, c.step, c.finish);
      ExpectTensorNear(Reduce(c.op, x, axes, 1), want, 1e-5f, 1e-5f);
      // keepdims=0 drops the reduced dims; values are the same in the same order.
      Shape dropped;
      for (int a = 0; a < 3; ++a)
        if (!mask[a]) dropped.push_back(x.dim(a));
      ExpectTensorNear(Reduce(c.op, x, axes, 0), want.Reshaped(dropped), 1e-5f, 1e-5f);
    }
  }
}

TEST(ReductionReduce, KeepdimsAndNegativeAxesByHand) {
  Tensor x = F32({2, 3}, {1, 2, 3, 4, 5, 6});
  ExpectTensorNear(Reduce("ReduceSum", x, {-1}, 1, 13), F32({2, 1}, {6, 15}));
  ExpectTensorNear(Reduce("ReduceSum", x, {-2}, 0, 13), F32({3}, {5, 7, 9}));
  ExpectTensorNear(Reduce("ReduceMean", x, {1}, 0, 11), F32({2}, {2, 5}));
  ExpectTensorNear(Reduce("ReduceMax", x, {0, -1}, 1, 18), F32({1, 1}, {6}));
  ExpectTensorNear(Reduce("ReduceMin", x, {0, 1}, 0, 13), F32({}, {1}));
  ExpectTensorNear(Reduce("ReduceProd", x, {0}, 1, 18), F32({1, 3}, {4, 10, 18}));
  // Attribute form of ReduceSum before opset 13.
  ExpectTensorNear(Reduce("ReduceSum", x, {0}, 1, 11), F32({1, 3}, {5, 7, 9}));
  // LogSumExp stays finite for large inputs.
  ExpectTensorNear(Reduce("ReduceLogSumExp", F32({2}, {1000, 1000}), {0}, 0, 18), F32({}, {1000 + std::log(2.f)}));
}

TEST(ReductionReduce, EmptyAxes) {
  Tensor x = F32({2, 3}, {1, 2, 3, 4, 5, 6});
  // No axes: reduce everything, unless noop_with_empty_axes.
  ExpectTensorNear(Reduce("ReduceSum", x, {}, 1, 13), F32({1, 1}, {21}));
  ExpectTensorNear(Reduce("ReduceSum", x, {}, 0, 11), F32({}, {21}));
  ExpectTensorNear(Reduce("ReduceSum", x, {}, 1, 13, /*noop=*/1), x);
  ExpectTensorNear(Reduce("ReduceSumSquare", x, {}, 1, 18, /*noop=*/1), F32({2, 3}, {1, 4, 9, 16, 25, 36}));
  // An omitted axes input is the same as an empty one.
  Node node = MakeNode("ReduceMax", 2, 1, {{"keepdims", Attribute::Int(0)}});
  ExpectTensorNear(RunReferenceNode(node, {x, Tensor()}, 18)[0], F32({}, {6}));
}

TEST(ReductionReduce, EmptyReducedSetGivesIdentity) {
  Tensor x(DType::kF32, {2, 0, 3});
  ExpectTensorNear(Reduce("ReduceSum", x, {1}, 1), F32({2, 1, 3}, {0, 0, 0, 0, 0, 0}));
  ExpectTensorNear(Reduce("ReduceProd", x, {1}, 0), F32({2, 3}, {1, 1, 1, 1, 1, 1}));
  const float inf = std::numeric_limits<float>::infinity();
  // (ExpectTensorNear cannot compare infinities: inf - inf is NaN.)
  Tensor max = Reduce("ReduceMax", x, {1}, 0);
  ASSERT_EQ(ShapeToString(max.shape()), "[2, 3]");
  for (int i = 0; i < 6; ++i) EXPECT_EQ(max.data<float>()[i], -inf);
  Tensor min = Reduce("ReduceMin", x, {1}, 1);
  ASSERT_EQ(ShapeToString(min.shape()), "[2, 1, 3]");
  for (int i = 0; i < 6; ++i) EXPECT_EQ(min.data<float>()[i], inf);
  Tensor mean = Reduce("ReduceMean", x, {1}, 0);
  for (int i = 0; i < 6; ++i) EXPECT_TRUE(std::isnan(mean.data<float>()[i]));
  EXPECT_EQ(Reduce("ReduceSum", x, {0}, 1).numel(), 0);
}

TEST(ReductionReduce, IntegerShapeArithmetic) {
  Tensor x = I64({2, 3}, {1, 2, 3, 4, 5, 7});
  ExpectTensorNear(Reduce("ReduceSum", x, {1}, 0, 13), I64({2}, {6, 16}));
  ExpectTensorNear(Reduce("ReduceProd", x, {}, 0, 13), I64({}, {840}));
  ExpectTensorNear(Reduce("ReduceMax", x, {0}, 0, 18), I64({3}, {4, 5, 7}));
  ExpectTensorNear(Reduce("ReduceMin", x, {1}, 1, 11), I64({2, 1}, {1, 4}));
  // Integer mean truncates: 16 / 3 = 5.
  ExpectTensorNear(Reduce("ReduceMean", x, {1}, 0, 18), I64({2}, {2, 5}));
  Tensor y = Tensor::FromVector<int32_t>({3}, {-3, 4, 0});
  ExpectTensorNear(Reduce("ReduceL1", y, {0}, 0, 18), Tensor::FromVector<int32_t>({}, {7}));
  ExpectTensorNear(Reduce("ReduceL2", y, {0}, 0, 18), Tensor::FromVector<int32_t>({}, {5}));
}

TEST(ReductionReduce, AxesErrors) {
  Tensor x = F32({2, 3}, {1, 2, 3, 4, 5, 6});
  ExpectError([&] { Reduce("ReduceSum", x, {2}, 1, 13); }, ErrorCode::kInvalidArgument, "out of range");
  ExpectError([&] { Reduce("ReduceMean", x, {1, -1}, 1, 18); }, ErrorCode::kInvalidArgument, "repeated");
  // Attribute axes at opset 18 and input axes at opset 11 are both malformed.
  ExpectError(
      [&] {
        RunReferenceNode(MakeNode("ReduceMean", 1, 1, {{"axes", Attribute::Ints({0})}}), {x}, 18);
      },
      ErrorCode::kInvalidArgument, "not an attribute");
  ExpectError(
      [&] {
        RunReferenceNode(MakeNode("ReduceMean", 2, 1), {x, I64({1}, {0})}, 11);
      },
      ErrorCode::kInvalidArgument, "not an input");
  // Axes only known at run time.
  Node node = MakeNode("ReduceSum", 2, 1);
  InferContext ic{node, 13, {true, true}, {DType::kF32, DType::kI64}, {{2, 3}, {1}}, {&x, nullptr}, {}, {}};
  ExpectError([&] { OpRegistry::Get().Find("ReduceSum")->infer(ic); }, ErrorCode::kUnsupported, "compiled");
}

TEST(ReductionArg, ArgMaxArgMinWithTies) {
  Tensor x = F32({2, 3}, {1, 3, 3, 2, 2, 1});
  auto arg = [&](const char* op, int64_t axis, int64_t keepdims, int64_t last) {
    return RunReferenceNode(MakeNode(op, 1, 1,
                                     {{"axis", Attribute::Int(axis)},
                                      {"keepdims", Attribute::Int(keepdims)},
                                      {"select_last_index", Attribute::Int(last)}}),
                            {x}, 13)[0];
  };
  ExpectTensorNear(arg("ArgMax", 1, 1, 0), I64({2, 1}, {1, 0}));
  ExpectTensorNear(arg("ArgMax", -1, 1, 1), I64({2, 1}, {2, 1}));
  ExpectTensorNear(arg("ArgMin", 1, 0, 0), I64({2}, {0, 2}));
  ExpectTensorNear(arg("ArgMin", 0, 0, 0), I64({3}, {0, 1, 1}));
  ExpectTensorNear(arg("ArgMax", 0, 1, 0), I64({1, 3}, {1, 0, 0}));
  // Odd shape along the middle axis, against a plain search.
  Tensor r = RandomTensor({3, 13, 5}, 3);
  Tensor got = RunReferenceNode(MakeNode("ArgMin", 1, 1, {{"axis", Attribute::Int(1)}}), {r}, 13)[0];
  ASSERT_EQ(ShapeToString(got.shape()), "[3, 1, 5]");
  for (int64_t o = 0; o < 3; ++o)
    for (int64_t i = 0; i < 5; ++i) {
      int64_t best = 0;
      for (int64_t j = 1; j < 13; ++j)
        if (r.data<float>()[(o * 13 + j) * 5 + i] < r.data<float>()[(o * 13 + best) * 5 + i]) best = j;
      EXPECT_EQ(got.data<int64_t>()[o * 5 + i], best);
    }
  ExpectError([&] { arg("ArgMax", 2, 1, 0); }, ErrorCode::kInvalidArgument, "out of range");
}

TEST(ReductionTopK, TiesKeepLowerIndexFirst) {
  Tensor x = F32({5}, {3, 1, 3, 2, 3});
  auto topk = [&](const Tensor& in, int64_t k, AttributeMap attrs, int opset = 11) {
    if (opset < 10) {
      attrs["k"] = Attribute::Int(k);
      return RunReferenceNode(MakeNode("TopK", 1, 2, attrs), {in}, opset);
    }
    return RunReferenceNode(MakeNode("TopK", 2, 2, attrs), {in, I64({1}, {k})}, opset);
  };
  auto largest = topk(x, 2, {});
  ExpectTensorNear(largest[0], F32({2}, {3, 3}));
  ExpectTensorNear(largest[1], I64({2}, {0, 2}));
  auto smallest = topk(x, 3, {{"largest", Attribute::Int(0)}});
  ExpectTensorNear(smallest[0], F32({3}, {1, 2, 3}));
  ExpectTensorNear(smallest[1], I64({3}, {1, 3, 0}));
  auto all = topk(x, 5, {});
  ExpectTensorNear(all[1], I64({5}, {0, 2, 4, 3, 1}));
  // Opset 1..9: K is an attribute.
  ExpectTensorNear(topk(x, 1, {}, 9)[1], I64({1}, {0}));
  // Along axis 0 of a 2-D input with an inner dim.
  Tensor m = I64({3, 2}, {5, 1, 7, 1, 6, 0});
  auto col = topk(m, 2, {{"axis", Attribute::Int(0)}});
  ExpectTensorNear(col[0], I64({2, 2}, {7, 1, 6, 1}));
  ExpectTensorNear(col[1], I64({2, 2}, {1, 0, 2, 1}));
  EXPECT_EQ(topk(x, 0, {})[0].numel(), 0);
  ExpectError([&] { topk(x, 6, {}); }, ErrorCode::kInvalidArgument, "out of range");
  ExpectError([&] { topk(x, -1, {}); }, ErrorCode::kInvalidArgument, "out of range");
}

}  // namespace
}  // namespace osprey

namespace osprey {
namespace {

// CumSum on [2, 3] = 1..6 by hand: along each axis, exclusive and reverse, an int64 input, and a bad axis.
TEST(ReductionCumSum, AxesExclusiveReverseAndBadAxis) {
  const Tensor x = F32({2, 3}, {1, 2, 3, 4, 5, 6});
  auto cumsum = [&](const Tensor& in, int64_t axis, int64_t exclusive, int64_t reverse) {
    Node n = MakeNode("CumSum", 2, 1, {{"exclusive", Attribute::Int(exclusive)}, {"reverse", Attribute::Int(reverse)}});
    return RunReferenceNode(n, {in, I64({}, {axis})}, 14)[0];
  };
  ExpectTensorNear(cumsum(x, 1, 0, 0), F32({2, 3}, {1, 3, 6, 4, 9, 15}));
  ExpectTensorNear(cumsum(x, -2, 0, 0), F32({2, 3}, {1, 2, 3, 5, 7, 9}));
  ExpectTensorNear(cumsum(x, 1, 1, 0), F32({2, 3}, {0, 1, 3, 0, 4, 9}));
  ExpectTensorNear(cumsum(x, 1, 0, 1), F32({2, 3}, {6, 5, 3, 15, 11, 6}));
  ExpectTensorNear(cumsum(x, 1, 1, 1), F32({2, 3}, {5, 3, 0, 11, 6, 0}));
  const Tensor ints = cumsum(I64({3}, {int64_t{1} << 40, 5, -7}), 0, 0, 0);
  EXPECT_EQ(ints.ToInt64Vector(), (std::vector<int64_t>{int64_t{1} << 40, (int64_t{1} << 40) + 5, (int64_t{1} << 40) - 2}));
  ExpectError([&] { cumsum(x, 2, 0, 0); }, ErrorCode::kInvalidArgument, "axis 2 is out of range");
  ExpectError([&] { cumsum(x, -3, 0, 0); }, ErrorCode::kInvalidArgument, "out of range");
}

}  // namespace
}  // namespace osprey
