// Elementwise family: schemas (shapes, dtypes, attribute checks) and reference kernels. Oracles are values computed
// by hand in the test, or the same formula evaluated with explicit index arithmetic in the test.
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
Tensor I32(Shape shape, std::vector<int32_t> v) { return Tensor::FromVector<int32_t>(std::move(shape), v); }
Tensor Bool(Shape shape, std::vector<bool> v) {
  Tensor t(DType::kBool, std::move(shape));
  for (size_t i = 0; i < v.size(); ++i) t.data<bool>()[i] = v[i];
  return t;
}

Tensor Run1(const std::string& op, const std::vector<Tensor>& inputs, AttributeMap attrs = {}, int opset = 17) {
  return RunReferenceNode(MakeNode(op, static_cast<int>(inputs.size()), 1, std::move(attrs)), inputs, opset)[0];
}

// Runs `fn`, expecting an osprey::Error with `code` whose message contains `substring`.
void ExpectError(const std::function<void()>& fn, ErrorCode code, const std::string& substring) {
  try {
    fn();
    ADD_FAILURE() << "expected an Error containing '" << substring << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(substring), std::string::npos) << e.what();
  }
}

// Element at multi-index `idx` of a row-major tensor of shape `shape`, broadcast: dims of size 1 read index 0.
float BroadcastAt(const Tensor& t, const std::vector<int64_t>& out_idx) {
  const Shape& s = t.shape();
  const size_t lead = out_idx.size() - s.size();
  int64_t flat = 0;
  for (size_t j = 0; j < s.size(); ++j) flat = flat * s[j] + (s[j] == 1 ? 0 : out_idx[lead + j]);
  return static_cast<float>(t.GetAsDouble(flat));
}

// Expected out = f(a, b) broadcast to `out_shape`, by explicit index arithmetic.
Tensor ExpectedBinary(const Tensor& a, const Tensor& b, const Shape& out_shape, float (*f)(float, float)) {
  Tensor e(DType::kF32, out_shape);
  std::vector<int64_t> idx(out_shape.size(), 0);
  for (int64_t i = 0; i < e.numel(); ++i) {
    int64_t rem = i;
    for (size_t j = out_shape.size(); j-- > 0;) {
      idx[j] = rem % out_shape[j];
      rem /= out_shape[j];
    }
    e.data<float>()[i] = f(BroadcastAt(a, idx), BroadcastAt(b, idx));
  }
  return e;
}

TEST(ElementwiseBroadcast, ThreeDimsWithVectorAndScalar) {
  Tensor a = F32({2, 3, 1}, {0, 1, 2, 3, 4, 5});
  Tensor b = F32({4}, {10, 20, 30, 40});
  Tensor y = Run1("Add", {a, b});
  std::vector<float> want;
  for (int i = 0; i < 6; ++i)
    for (int k = 0; k < 4; ++k) want.push_back(static_cast<float>(i) + 10.f * (k + 1));
  ExpectTensorNear(y, F32({2, 3, 4}, want));

  Tensor s = Tensor::Scalar<float>(0.5f);
  ExpectTensorNear(Run1("Mul", {a, s}), F32({2, 3, 1}, {0, 0.5f, 1, 1.5f, 2, 2.5f}));
  ExpectTensorNear(Run1("Sub", {s, a}), F32({2, 3, 1}, {0.5f, -0.5f, -1.5f, -2.5f, -3.5f, -4.5f}));
  // Scalar with scalar stays rank 0.
  EXPECT_EQ(Run1("Add", {s, s}).rank(), 0);
}

TEST(ElementwiseBroadcast, OddShapesAnyRankMatchIndexArithmetic) {
  struct Case {
    Shape a, b, out;
  };
  const std::vector<Case> cases = {
      {{1, 3, 1, 5, 1}, {2, 1, 4, 1, 3}, {2, 3, 4, 5, 3}},
      {{13}, {5, 1}, {5, 13}},
      {{2, 3, 5, 7}, {3, 1, 7}, {2, 3, 5, 7}},
      {{1, 13, 1}, {13, 1, 1}, {13, 13, 1}},
      {{6, 1, 1, 1, 1, 2}, {1, 1, 1, 1, 1, 1}, {6, 1, 1, 1, 1, 2}},
      {{0, 3}, {1, 3}, {0, 3}},
  };
  uint32_t seed = 1;
  for (const Case& c : cases) {
    Tensor a = RandomTensor(c.a, seed++), b = RandomTensor(c.b, seed++);
    SCOPED_TRACE(ShapeToString(c.a) + " with " + ShapeToString(c.b));
    ExpectTensorNear(Run1("Sub", {a, b}), ExpectedBinary(a, b, c.out, [](float x, float y) { return x - y; }));
    ExpectTensorNear(Run1("Mul", {b, a}), ExpectedBinary(b, a, c.out, [](float x, float y) { return x * y; }));
  }
}

TEST(ElementwiseBroadcast, LargeSameShapeFastPath) {
  Tensor a = RandomTensor({3, 5, 70, 71}, 7), b = RandomTensor({3, 5, 70, 71}, 8, 0.5f, 2.f);
  ExpectTensorNear(Run1("Div", {a, b}), ExpectedBinary(a, b, a.shape(), [](float x, float y) { return x / y; }));
}

TEST(ElementwiseBroadcast, MismatchIsAnError) {
  ExpectError(
      [] {
        Run1("Add", {F32({2, 3}, {1, 2, 3, 4, 5, 6}), F32({4}, {1, 2, 3, 4})});
      },
      ErrorCode::kInvalidArgument, "cannot be broadcast");
  ExpectError([] { Run1("Add", {F32({2}, {1, 2}), I64({2}, {1, 2})}); }, ErrorCode::kInvalidArgument, "same dtype");
  Tensor half(DType::kF16, {2});
  ExpectError([&] { Run1("Add", {half, half}); }, ErrorCode::kUnsupported, "float16");
}

TEST(ElementwiseBroadcast, OutputMayAliasFirstInput) {
  // The runtime may reuse an input's buffer for the output; same-shape reads happen before the write.
  Node node = MakeNode("Add", 2, 1);
  Tensor a = F32({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor b = F32({3}, {10, 20, 30});
  KernelContext kc{node, 17, {&a, &b}, {&a}};
  FindReferenceKernel("Add")(kc);
  ExpectTensorNear(a, F32({2, 3}, {11, 22, 33, 14, 25, 36}));
}

TEST(ElementwiseBinary, FloatArithmetic) {
  Tensor a = F32({4}, {1, -2, 3, 0.5f});
  Tensor b = F32({4}, {2, 4, -3, 2});
  ExpectTensorNear(Run1("Div", {a, b}), F32({4}, {0.5f, -0.5f, -1, 0.25f}));
  ExpectTensorNear(Run1("Pow", {a, b}), F32({4}, {1, 16, 1.f / 27.f, 0.25f}));
  ExpectTensorNear(Run1("Pow", {a, I64({}, {3})}), F32({4}, {1, -8, 27, 0.125f}));
  ExpectTensorNear(
      Run1("Mod", {F32({4}, {5.5f, -5.5f, 5.5f, -5.5f}), F32({4}, {2, 2, -2, -2})}, {{"fmod", Attribute::Int(1)}}),
      F32({4}, {1.5f, -1.5f, 1.5f, -1.5f}));
  ExpectError([] { Run1("Mod", {F32({1}, {1}), F32({1}, {1})}); }, ErrorCode::kInvalidArgument, "fmod");
  Tensor one_over_zero = Run1("Div", {F32({1}, {1}), F32({1}, {0})});
  EXPECT_TRUE(std::isinf(one_over_zero.data<float>()[0]));
}

TEST(ElementwiseBinary, Int64ShapeArithmetic) {
  // A typical exported reshape: Shape -> Gather -> Div/Mul -> Concat.
  Tensor shape = I64({4}, {1, 3, 224, 224});
  ExpectTensorNear(Run1("Mul", {shape, I64({}, {2})}), I64({4}, {2, 6, 448, 448}));
  ExpectTensorNear(Run1("Div", {shape, I64({1}, {2})}), I64({4}, {0, 1, 112, 112}));
  ExpectTensorNear(Run1("Sub", {I64({1}, {10}), shape}), I64({4}, {9, 7, -214, -214}));
  // Division truncates toward zero, like C.
  Tensor num = I64({4}, {7, -7, 7, -7});
  ExpectTensorNear(Run1("Div", {num, I64({4}, {2, 2, -2, -2})}), I64({4}, {3, -3, -3, 3}));
  // Mod: fmod=0 follows the divisor's sign (Python), fmod=1 the dividend's (C).
  Tensor den = I64({4}, {3, 3, -3, -3});
  ExpectTensorNear(Run1("Mod", {num, den}), I64({4}, {1, 2, -2, -1}));
  ExpectTensorNear(Run1("Mod", {num, den}, {{"fmod", Attribute::Int(1)}}), I64({4}, {1, -1, 1, -1}));
  ExpectTensorNear(Run1("Div", {I32({2}, {9, -9}), I32({}, {4})}), I32({2}, {2, -2}));
  // INT64_MIN / -1 wraps instead of trapping.
  const int64_t kMin = std::numeric_limits<int64_t>::min();
  EXPECT_EQ(Run1("Div", {I64({1}, {kMin}), I64({1}, {-1})}).data<int64_t>()[0], kMin);
  ExpectTensorNear(Run1("Pow", {I64({3}, {2, -3, 10}), I64({3}, {10, 3, 0})}), I64({3}, {1024, -27, 1}));
  ExpectTensorNear(Run1("Max", {shape, I64({}, {100})}), I64({4}, {100, 100, 224, 224}));
}

TEST(ElementwiseBinary, IntegerDivisionByZeroIsAnError) {
  ExpectError(
      [] {
        Run1("Div", {I64({2}, {4, 5}), I64({2}, {2, 0})});
      },
      ErrorCode::kInvalidArgument, "division by zero");
  ExpectError([] { Run1("Div", {I32({2}, {4, 5}), I32({}, {0})}); }, ErrorCode::kInvalidArgument, "division by zero");
  ExpectError([] { Run1("Mod", {I64({1}, {4}), I64({1}, {0})}); }, ErrorCode::kInvalidArgument, "division by zero");
}

TEST(ElementwiseBinary, ComparisonsAndLogic) {
  Tensor a = I64({2, 1}, {1, 3});
  Tensor b = I64({3}, {0, 1, 3});
  ExpectTensorNear(Run1("Less", {a, b}), Bool({2, 3}, {false, false, true, false, false, false}));
  ExpectTensorNear(Run1("GreaterOrEqual", {a, b}), Bool({2, 3}, {true, true, false, true, true, true}));
  ExpectTensorNear(Run1("Equal", {a, b}), Bool({2, 3}, {false, true, false, false, false, true}));
  ExpectTensorNear(Run1("Greater", {F32({2}, {1, 2}), F32({}, {1.5f})}), Bool({2}, {false, true}));
  ExpectTensorNear(Run1("LessOrEqual", {F32({2}, {1, 2}), F32({}, {1})}), Bool({2}, {true, false}));
  Tensor p = Bool({4}, {false, false, true, true}), q = Bool({4}, {false, true, false, true});
  ExpectTensorNear(Run1("And", {p, q}), Bool({4}, {false, false, false, true}));
  ExpectTensorNear(Run1("Or", {p, q}), Bool({4}, {false, true, true, true}));
  ExpectTensorNear(Run1("Xor", {p, q}), Bool({4}, {false, true, true, false}));
  ExpectTensorNear(Run1("Equal", {p, q}), Bool({4}, {true, false, false, true}));
  ExpectTensorNear(Run1("Not", {p}), Bool({4}, {true, true, false, false}));
  ExpectError([] { Run1("And", {F32({1}, {1}), F32({1}, {1})}); }, ErrorCode::kInvalidArgument, "bool");
}

TEST(ElementwiseBinary, PReluAndBitShift) {
  Tensor x = F32({1, 3, 2, 2}, {-1, 1, -2, 2, -1, 1, -2, 2, -1, 1, -2, 2});
  Tensor slope = F32({3, 1, 1}, {0.1f, 0.2f, 0.3f});
  ExpectTensorNear(Run1("PRelu", {x, slope}),
                   F32({1, 3, 2, 2}, {-0.1f, 1, -0.2f, 2, -0.2f, 1, -0.4f, 2, -0.3f, 1, -0.6f, 2}));
  ExpectError(
      [&] {
        Run1("PRelu", {F32({3}, {1, 2, 3}), F32({2, 3}, {1, 2, 3, 4, 5, 6})});
      },
      ErrorCode::kInvalidArgument, "does not broadcast to X");
  Tensor u = Tensor::FromVector<uint8_t>({3}, {1, 16, 255});
  Tensor s = Tensor::FromVector<uint8_t>({3}, {3, 2, 9});
  ExpectTensorNear(Run1("BitShift", {u, s}, {{"direction", Attribute::String("LEFT")}}),
                   Tensor::FromVector<uint8_t>({3}, {8, 64, 0}));
  ExpectTensorNear(Run1("BitShift", {u, s}, {{"direction", Attribute::String("RIGHT")}}),
                   Tensor::FromVector<uint8_t>({3}, {0, 4, 0}));
  ExpectError([&] { Run1("BitShift", {u, s}); }, ErrorCode::kInvalidArgument, "direction");
}

TEST(ElementwiseVariadic, MinMaxSumMeanBroadcast) {
  Tensor a = F32({3}, {1, 5, 3});
  Tensor b = F32({2, 1}, {2, 4});
  Tensor c = Tensor::Scalar<float>(3.f);
  ExpectTensorNear(Run1("Max", {a, b, c}), F32({2, 3}, {3, 5, 3, 4, 5, 4}));
  ExpectTensorNear(Run1("Min", {a, b, c}), F32({2, 3}, {1, 2, 2, 1, 3, 3}));
  ExpectTensorNear(Run1("Sum", {a, b, c}), F32({2, 3}, {6, 10, 8, 8, 12, 10}));
  ExpectTensorNear(Run1("Mean", {a, b, c}), F32({2, 3}, {2, 10.f / 3, 8.f / 3, 8.f / 3, 4, 10.f / 3}));
  // Shapes grow only with the third input.
  ExpectTensorNear(Run1("Sum", {c, a, b}), F32({2, 3}, {6, 10, 8, 8, 12, 10}));
  ExpectTensorNear(Run1("Max", {a}), a);
  ExpectTensorNear(Run1("Sum", {I64({2}, {1, 2}), I64({2}, {3, 4}), I64({2}, {5, 6}), I64({}, {7})}),
                   I64({2}, {16, 19}));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(Run1("Max", {F32({1}, {nan}), F32({1}, {1})}).data<float>()[0]));
  EXPECT_TRUE(std::isnan(Run1("Min", {F32({1}, {1}), F32({1}, {nan})}).data<float>()[0]));
}

TEST(ElementwiseUnary, MathFunctionsMatchLibm) {
  const std::vector<float> any = {-2.5f, -1.f, -0.3f, 0.f, 0.4f, 1.f, 2.5f, 7.f};
  const std::vector<float> unit = {-1.f, -0.6f, 0.f, 0.3f, 1.f};
  const std::vector<float> positive = {0.01f, 0.5f, 1.f, 3.f, 100.f};
  struct Case {
    const char* op;
    const std::vector<float>* inputs;
    double (*f)(double);
  };
  const std::vector<Case> cases = {
      {"Sqrt", &positive, [](double x) { return std::sqrt(x); }},
      {"Exp", &any, [](double x) { return std::exp(x); }},
      {"Log", &positive, [](double x) { return std::log(x); }},
      {"Neg", &any, [](double x) { return -x; }},
      {"Abs", &any, [](double x) { return std::fabs(x); }},
      {"Erf", &any, [](double x) { return std::erf(x); }},
      {"Tanh", &any, [](double x) { return std::tanh(x); }},
      {"Sigmoid", &any, [](double x) { return 1 / (1 + std::exp(-x)); }},
      {"Relu", &any, [](double x) { return x > 0 ? x : 0; }},
      {"Reciprocal", &positive, [](double x) { return 1 / x; }},
      {"Floor", &any, [](double x) { return std::floor(x); }},
      {"Ceil", &any, [](double x) { return std::ceil(x); }},
      {"Sign", &any, [](double x) { return x > 0 ? 1.0 : (x < 0 ? -1.0 : 0.0); }},
      {"Sin", &any, [](double x) { return std::sin(x); }},
      {"Cos", &any, [](double x) { return std::cos(x); }},
      {"Tan", &unit, [](double x) { return std::tan(x); }},
      {"Asin", &unit, [](double x) { return std::asin(x); }},
      {"Acos", &unit, [](double x) { return std::acos(x); }},
      {"Atan", &any, [](double x) { return std::atan(x); }},
      {"Sinh", &any, [](double x) { return std::sinh(x); }},
      {"Cosh", &any, [](double x) { return std::cosh(x); }},
      {"Softplus", &any, [](double x) { return std::log(1 + std::exp(x)); }},
      {"Softsign", &any, [](double x) { return x / (1 + std::fabs(x)); }},
      {"HardSwish", &any, [](double x) { return x * std::min(1.0, std::max(0.0, x / 6 + 0.5)); }},
      {"Mish", &any, [](double x) { return x * std::tanh(std::log(1 + std::exp(x))); }},
      {"Gelu", &any, [](double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }},
      {"LeakyRelu", &any, [](double x) { return x >= 0 ? x : 0.01 * x; }},
      {"HardSigmoid", &any, [](double x) { return std::min(1.0, std::max(0.0, 0.2 * x + 0.5)); }},
      {"Elu", &any, [](double x) { return x >= 0 ? x : std::exp(x) - 1; }},
      {"Selu", &any,
       [](double x) { return 1.0507009873554805 * (x > 0 ? x : 1.6732632423543772 * (std::exp(x) - 1)); }},
      {"Celu", &any, [](double x) { return std::max(0.0, x) + std::min(0.0, std::exp(x) - 1); }},
      {"ThresholdedRelu", &any, [](double x) { return x > 1 ? x : 0; }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.op);
    const std::vector<float>& in = *c.inputs;
    std::vector<float> want;
    for (float v : in) want.push_back(static_cast<float>(c.f(v)));
    const int64_t n = static_cast<int64_t>(in.size());
    ExpectTensorNear(Run1(c.op, {F32({n}, in)}), F32({n}, want), 1e-5f, 1e-6f);
  }
}

TEST(ElementwiseUnary, AttributesAndSpecialValues) {
  Tensor x = F32({5}, {-3, -1, 0, 0.5f, 2});
  ExpectTensorNear(Run1("LeakyRelu", {x}, {{"alpha", Attribute::Float(0.5f)}}), F32({5}, {-1.5f, -0.5f, 0, 0.5f, 2}));
  ExpectTensorNear(Run1("HardSigmoid", {x}, {{"alpha", Attribute::Float(0.5f)}, {"beta", Attribute::Float(0.25f)}}),
                   F32({5}, {0, 0, 0.25f, 0.5f, 1}));
  ExpectTensorNear(Run1("ThresholdedRelu", {x}, {{"alpha", Attribute::Float(0.25f)}}), F32({5}, {0, 0, 0, 0.5f, 2}));
  ExpectTensorNear(Run1("Celu", {x}, {{"alpha", Attribute::Float(2.f)}}),
                   F32({5}, {2 * std::expm1(-1.5f), 2 * std::expm1(-0.5f), 0, 0.5f, 2}));
  std::vector<float> gelu_tanh;
  for (float v : {-3.f, -1.f, 0.f, 0.5f, 2.f})
    gelu_tanh.push_back(0.5f * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))));
  ExpectTensorNear(Run1("Gelu", {x}, {{"approximate", Attribute::String("tanh")}}, 20), F32({5}, gelu_tanh));
  ExpectError(
      [&] {
        Run1("Gelu", {x}, {{"approximate", Attribute::String("fast")}}, 20);
      },
      ErrorCode::kInvalidArgument, "approximate");
  ExpectError([&] { Run1("Celu", {x}, {{"alpha", Attribute::Float(0.f)}}); }, ErrorCode::kInvalidArgument, "alpha");
  ExpectError(
      [&] {
        Run1("LeakyRelu", {x}, {{"alpha", Attribute::String("x")}});
      },
      ErrorCode::kInvalidArgument, "alpha");
  // Round: halves go to the even neighbour.
  ExpectTensorNear(Run1("Round", {F32({7}, {0.5f, 1.5f, 2.5f, -0.5f, -2.5f, 2.6f, -1.4f})}),
                   F32({7}, {0, 2, 2, -0.f, -2, 3, -1}));
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  Tensor special = F32({4}, {inf, -inf, nan, 1});
  ExpectTensorNear(Run1("IsNaN", {special}), Bool({4}, {false, false, true, false}));
  ExpectTensorNear(Run1("IsInf", {special}), Bool({4}, {true, true, false, false}));
  ExpectTensorNear(Run1("IsInf", {special}, {{"detect_negative", Attribute::Int(0)}}),
                   Bool({4}, {true, false, false, false}));
  ExpectTensorNear(Run1("IsInf", {special}, {{"detect_positive", Attribute::Int(0)}}),
                   Bool({4}, {false, true, false, false}));
  // Integer unary ops used in shape arithmetic.
  Tensor ints = I64({3}, {-5, 0, 7});
  ExpectTensorNear(Run1("Neg", {ints}), I64({3}, {5, 0, -7}));
  ExpectTensorNear(Run1("Abs", {ints}), I64({3}, {5, 0, 7}));
  ExpectTensorNear(Run1("Sign", {ints}), I64({3}, {-1, 0, 1}));
  ExpectTensorNear(Run1("Relu", {I32({3}, {-5, 0, 7})}), I32({3}, {0, 0, 7}));
  ExpectError([&] { Run1("Sqrt", {ints}); }, ErrorCode::kInvalidArgument, "int64");
}

TEST(ElementwiseClip, AttributeFormBeforeOpset11) {
  Tensor x = F32({5}, {-3, -1, 0, 0.5f, 2});
  ExpectTensorNear(Run1("Clip", {x}, {{"min", Attribute::Float(-1.5f)}, {"max", Attribute::Float(1.f)}}, 6),
                   F32({5}, {-1.5f, -1, 0, 0.5f, 1}));
  ExpectTensorNear(Run1("Clip", {x}, {{"max", Attribute::Float(0.f)}}, 6), F32({5}, {-3, -1, 0, 0, 0}));
  ExpectError([&] { Run1("Clip", {x, F32({}, {0})}, {}, 6); }, ErrorCode::kInvalidArgument, "attributes");
}

TEST(ElementwiseClip, InputFormFromOpset11) {
  Tensor x = F32({5}, {-3, -1, 0, 0.5f, 2});
  ExpectTensorNear(Run1("Clip", {x, F32({}, {-1.5f}), F32({}, {1.f})}, {}, 13), F32({5}, {-1.5f, -1, 0, 0.5f, 1}));
  // Omitted min: only the upper bound applies.
  ExpectTensorNear(Run1("Clip", {x, Tensor(), F32({}, {0.f})}, {}, 13), F32({5}, {-3, -1, 0, 0, 0}));
  ExpectTensorNear(Run1("Clip", {x}, {}, 11), x);
  // Integer Clip (opset 12+): the shape arithmetic form.
  ExpectTensorNear(Run1("Clip", {I64({4}, {-9, 1, 5, 100}), I64({}, {0}), I64({}, {10})}, {}, 13),
                   I64({4}, {0, 1, 5, 10}));
  ExpectError([&] { Run1("Clip", {x, F32({2}, {0, 1})}, {}, 13); }, ErrorCode::kInvalidArgument, "scalar");
  ExpectError(
      [&] {
        Run1("Clip", {x}, {{"min", Attribute::Float(0.f)}}, 13);
      },
      ErrorCode::kInvalidArgument, "inputs 1 and 2");
}

TEST(ElementwiseWhere, ThreeWayBroadcast) {
  Tensor cond = Bool({2, 1}, {true, false});
  Tensor x = F32({1, 3}, {1, 2, 3});
  Tensor y = Tensor::Scalar<float>(-1.f);
  ExpectTensorNear(Run1("Where", {cond, x, y}), F32({2, 3}, {1, 2, 3, -1, -1, -1}));
  Tensor cond3 = Bool({3}, {false, true, false});
  ExpectTensorNear(Run1("Where", {cond3, I64({2, 1}, {7, 8}), I64({3}, {0, 1, 2})}), I64({2, 3}, {0, 7, 2, 0, 8, 2}));
  ExpectError([&] { Run1("Where", {x, x, x}); }, ErrorCode::kInvalidArgument, "bool");
  ExpectError(
      [&] {
        Run1("Where", {Bool({4}, {true, false, true, false}), x, y});
      },
      ErrorCode::kInvalidArgument, "broadcast");
}

TEST(ElementwiseCast, ToAndFromHalfAndBFloat16) {
  Tensor x = F32({5}, {1.f, -2.f, 65504.f, 0.1f, 1e6f});
  Tensor h = Run1("Cast", {x}, {{"to", Attribute::Int(10)}});
  ASSERT_EQ(h.dtype(), DType::kF16);
  const uint16_t* hb = h.data<uint16_t>();
  EXPECT_EQ(hb[0], 0x3C00);
  EXPECT_EQ(hb[1], 0xC000);
  EXPECT_EQ(hb[2], 0x7BFF);
  EXPECT_EQ(hb[3], 0x2E66);  // 0.1 rounds to 0.0999755859375
  EXPECT_EQ(hb[4], 0x7C00);  // overflow -> +inf
  Tensor back = Run1("Cast", {h}, {{"to", Attribute::Int(1)}});
  // (ExpectTensorNear cannot compare infinities: inf - inf is NaN.)
  const std::vector<float> want_back = {1, -2, 65504, 0.0999755859375f, std::numeric_limits<float>::infinity()};
  for (int i = 0; i < 5; ++i) EXPECT_EQ(back.data<float>()[i], want_back[i]) << i;

  Tensor b = Run1("Cast", {F32({3}, {1.f, -3.5f, 1.00390625f})}, {{"to", Attribute::Int(16)}});
  ASSERT_EQ(b.dtype(), DType::kBF16);
  EXPECT_EQ(b.data<uint16_t>()[0], 0x3F80);
  EXPECT_EQ(b.data<uint16_t>()[1], 0xC060);
  EXPECT_EQ(b.data<uint16_t>()[2], 0x3F80);  // 1 + 2^-8 ties to even -> 1.0
  ExpectTensorNear(Run1("Cast", {b}, {{"to", Attribute::Int(6)}}), I32({3}, {1, -3, 1}));
  Tensor hb16 = Run1("Cast", {h}, {{"to", Attribute::Int(16)}});
  ASSERT_EQ(hb16.dtype(), DType::kBF16);
  EXPECT_EQ(hb16.data<uint16_t>()[0], 0x3F80);
  EXPECT_EQ(hb16.data<uint16_t>()[1], 0xC000);
  // int64 -> float16 and bool -> float16.
  Tensor ih = Run1("Cast", {I64({2}, {3, -1})}, {{"to", Attribute::Int(10)}});
  EXPECT_EQ(ih.data<uint16_t>()[0], 0x4200);
  EXPECT_EQ(ih.data<uint16_t>()[1], 0xBC00);
}

TEST(ElementwiseCast, NumericConversions) {
  Tensor x = F32({6}, {2.7f, -2.7f, 0.f, 300.f, -1.f, std::numeric_limits<float>::quiet_NaN()});
  ExpectTensorNear(Run1("Cast", {x}, {{"to", Attribute::Int(6)}}), I32({6}, {2, -2, 0, 300, -1, 0}));
  ExpectTensorNear(Run1("Cast", {x}, {{"to", Attribute::Int(9)}}), Bool({6}, {true, true, false, true, true, true}));
  // Out-of-range floats saturate.
  ExpectTensorNear(Run1("Cast", {x}, {{"to", Attribute::Int(2)}}),
                   Tensor::FromVector<uint8_t>({6}, {2, 0, 0, 255, 0, 0}));
  // Integer narrowing wraps, as a C cast does.
  ExpectTensorNear(Run1("Cast", {I64({3}, {300, -129, 5})}, {{"to", Attribute::Int(3)}}),
                   Tensor::FromVector<int8_t>({3}, {44, 127, 5}));
  ExpectTensorNear(Run1("Cast", {Bool({2}, {true, false})}, {{"to", Attribute::Int(7)}}), I64({2}, {1, 0}));
  ExpectTensorNear(Run1("CastLike", {I64({2}, {4, -4}), F32({1}, {0})}), F32({2}, {4, -4}));
  ExpectTensorNear(Run1("Cast", {x}, {{"to", Attribute::Int(1)}}), x);
}

TEST(ElementwiseCast, UnsupportedTargetsNameTheDType) {
  Tensor x = F32({1}, {1});
  // double is computed as float32 (onnx_tensor.cc DTypeFromOnnx): a Cast to it is a float32 copy.
  ExpectTensorNear(Run1("Cast", {F32({2}, {1.5f, -3})}, {{"to", Attribute::Int(11)}}), F32({2}, {1.5f, -3}));
  ExpectError([&] { Run1("Cast", {x}, {{"to", Attribute::Int(12)}}); }, ErrorCode::kUnsupported, "uint32");
  ExpectError([&] { Run1("Cast", {x}, {{"to", Attribute::Int(8)}}); }, ErrorCode::kUnsupported, "string");
  ExpectError([&] { Run1("Cast", {x}, {{"to", Attribute::Int(4)}}); }, ErrorCode::kUnsupported, "uint16");
  ExpectError([&] { Run1("Cast", {x}, {{"to", Attribute::Int(99)}}); }, ErrorCode::kInvalidArgument, "99");
  ExpectError([&] { Run1("Cast", {x}); }, ErrorCode::kInvalidArgument, "'to'");
}

TEST(ElementwiseSchema, ArityIsRegistered) {
  const OpRegistry& r = OpRegistry::Get();
  for (const char* op : {"Add", "Where", "Clip", "Cast", "CastLike", "Sum", "Mean", "Min", "Max", "Gelu", "Mish"})
    ASSERT_NE(r.Find(op), nullptr) << op;
  EXPECT_EQ(r.Find("Add")->max_inputs, 2);
  EXPECT_EQ(r.Find("Where")->min_inputs, 3);
  EXPECT_EQ(r.Find("Clip")->max_inputs, 3);
  EXPECT_GT(r.Find("Sum")->max_inputs, 100);
  for (const char* op : {"Add",
                         "Sub",
                         "Mul",
                         "Div",
                         "Pow",
                         "Mod",
                         "Equal",
                         "Less",
                         "Greater",
                         "LessOrEqual",
                         "GreaterOrEqual",
                         "And",
                         "Or",
                         "Xor",
                         "PRelu",
                         "BitShift",
                         "Min",
                         "Max",
                         "Sum",
                         "Mean",
                         "Sqrt",
                         "Exp",
                         "Log",
                         "Neg",
                         "Abs",
                         "Erf",
                         "Tanh",
                         "Sigmoid",
                         "Relu",
                         "LeakyRelu",
                         "Elu",
                         "Selu",
                         "Celu",
                         "ThresholdedRelu",
                         "Softplus",
                         "Softsign",
                         "HardSigmoid",
                         "HardSwish",
                         "Gelu",
                         "Reciprocal",
                         "Floor",
                         "Ceil",
                         "Round",
                         "Sign",
                         "Sin",
                         "Cos",
                         "Tan",
                         "Asin",
                         "Acos",
                         "Atan",
                         "Sinh",
                         "Cosh",
                         "Not",
                         "IsNaN",
                         "IsInf",
                         "Mish",
                         "Clip",
                         "Where",
                         "Cast",
                         "CastLike"}) {
    EXPECT_NE(r.Find(op), nullptr) << op;
    EXPECT_NE(FindReferenceKernel(op), nullptr) << op;
  }
}

}  // namespace
}  // namespace osprey
