// Fast float32 elementwise kernels (src/kernels/cpu/elementwise_kernels.cc) against the reference kernels, over
// shapes that take the serial and threaded paths and the broadcasts tf2onnx and PyTorch exports contain.
//
// Tolerance: Add/Sub/Mul/Div and the piecewise-linear activations compute the reference's expression and must match
// bit for bit (NaN for NaN). The transcendental ones use vector_math.h polynomials against libm: relative error
// <= 2e-6 plus absolute 1e-6 (erf's Abramowitz-Stegun branch is within 1.5e-7 absolute; exp ~2 ulp).
#include <cmath>
#include <limits>

#include "kernel_test_util.h"

namespace osprey::testing {
namespace {

constexpr float kApproxRtol = 2e-6f;
constexpr float kApproxAtol = 1e-6f;

void ExpectBitwise(const Tensor& actual, const Tensor& expected) {
  ASSERT_EQ(ShapeToString(actual.shape()), ShapeToString(expected.shape()));
  const float* a = actual.data<float>();
  const float* e = expected.data<float>();
  for (int64_t i = 0; i < actual.numel(); ++i) {
    if (std::isnan(e[i])) {
      ASSERT_TRUE(std::isnan(a[i])) << "at " << i;
      continue;
    }
    ASSERT_EQ(a[i], e[i]) << "at flat index " << i;
  }
}

// Runs the fast kernel (built through CreateCpuKernel from the compile-time view, `constant` inputs known) twice and
// the reference once on the same inputs; compares exactly or within the approximation tolerance.
void ExpectMatches(const Node& node, const std::vector<Tensor>& inputs, const std::vector<bool>& constant,
                   const std::string& name, bool exact, int opset = 17, int threads = 2) {
  std::vector<Tensor> expected = RunReferenceNode(node, inputs, opset);
  std::vector<Tensor> outputs;
  KernelBuildContext bc = MakeBuildContext(node, inputs, constant, outputs, opset, threads);
  std::unique_ptr<Kernel> kernel = CreateCpuKernel(bc);
  ASSERT_NE(kernel, nullptr) << "no fast kernel for " << node.op_type;
  EXPECT_EQ(std::string(kernel->Name()), name);
  for (int run = 0; run < 2; ++run) {
    RunKernel(*kernel, node, inputs, outputs, opset);
    if (exact)
      ExpectBitwise(outputs[0], expected[0]);
    else
      ExpectTensorNear(outputs[0], expected[0], kApproxRtol, kApproxAtol);
  }
}

// Random values in [lo, hi) followed by the special values.
Tensor UnaryInput(const Shape& shape, uint32_t seed, float lo, float hi) {
  Tensor t = RandomTensor(shape, seed, lo, hi);
  const float specials[] = {0.f,   -0.f,  1e-30f, -1e-30f, 1e-4f,   -1e-4f, 0.25f, -0.25f, 0.5f,
                            -0.5f, 3.f,   -3.f,   6.f,     -6.f,    20.f,   -20.f, 100.f,  -100.f,
                            1e30f, -1e30f, std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()};
  float* p = t.data<float>();
  for (size_t i = 0; i < std::size(specials) && static_cast<int64_t>(i) < t.numel(); ++i) p[i] = specials[i];
  return t;
}

struct UnaryCase {
  const char* op;
  AttributeMap attrs;
  bool exact;
};

const std::vector<UnaryCase>& UnaryCases() {
  static const std::vector<UnaryCase> cases = {
      {"Relu", {}, true},
      {"LeakyRelu", {{"alpha", Attribute::Float(0.2f)}}, true},
      // alpha * x + beta: the AVX-512 build of the fast kernel fuses it into one FMA (one rounding, not two), which
      // differs from the reference by an ulp on some inputs.
      {"HardSigmoid", {}, false},
      {"HardSigmoid", {{"alpha", Attribute::Float(1.f / 6)}, {"beta", Attribute::Float(0.5f)}}, false},
      {"HardSwish", {}, true},
      {"Elu", {}, false},
      {"Elu", {{"alpha", Attribute::Float(0.3f)}}, false},
      {"Selu", {}, false},
      {"Celu", {}, false},
      {"Celu", {{"alpha", Attribute::Float(2.5f)}}, false},
      {"Neg", {}, true},
      {"Abs", {}, true},
      {"Sqrt", {}, true},
      {"Reciprocal", {}, true},
      {"Round", {}, true},
      {"Sigmoid", {}, false},
      {"Tanh", {}, false},
      {"Erf", {}, false},
      {"Exp", {}, false},
      {"Log", {}, false},
      {"Gelu", {}, false},
      {"Gelu", {{"approximate", Attribute::String("tanh")}}, false},
  };
  return cases;
}

TEST(ElementwiseF32, UnaryOpsMatchReference) {
  // 37 elements: serial, odd length; 70000: threaded, with a partial last block.
  for (const Shape& shape : {Shape{37}, Shape{1, 16, 112, 112}, Shape{70000}}) {
    for (const UnaryCase& c : UnaryCases()) {
      SCOPED_TRACE(std::string(c.op) + " " + ShapeToString(shape));
      const int opset = std::string(c.op) == "Gelu" ? 20 : 17;
      ExpectMatches(MakeNode(c.op, 1, 1, c.attrs), {UnaryInput(shape, 1, -8.f, 8.f)}, {false},
                    std::string(c.op) + "F32Fast", c.exact, opset);
      // The small-argument branches of tanh and erf, densely.
      ExpectMatches(MakeNode(c.op, 1, 1, c.attrs), {RandomTensor(shape, 2, -0.7f, 0.7f)}, {false},
                    std::string(c.op) + "F32Fast", c.exact, opset);
    }
  }
}

TEST(ElementwiseF32, RoundTakesHalvesToEven) {
  // Oracle: the reference kernel (std::nearbyint) and ONNX's rule, by hand: 0.5 -> 0, 1.5 -> 2, 2.5 -> 2, -2.5 -> -2.
  std::vector<float> halves;
  for (int i = -300; i <= 300; ++i) halves.push_back(i + 0.5f);
  ExpectMatches(MakeNode("Round", 1, 1), {Tensor::FromVector<float>({601}, halves)}, {false}, "RoundF32Fast", true);
  std::vector<Tensor> out =
      RunReferenceNode(MakeNode("Round", 1, 1), {Tensor::FromVector<float>({4}, {0.5f, 1.5f, 2.5f, -2.5f})}, 17);
  EXPECT_EQ(out[0].data<float>()[0], 0.f);
  EXPECT_EQ(out[0].data<float>()[1], 2.f);
  EXPECT_EQ(out[0].data<float>()[2], 2.f);
  EXPECT_EQ(out[0].data<float>()[3], -2.f);
}

TEST(ElementwiseF32, ClipBoundsConstantOrAttributes) {
  Tensor x = UnaryInput({3, 1000}, 3, -10.f, 10.f);
  Tensor lo = Tensor::FromVector<float>({}, {0.f}), hi = Tensor::FromVector<float>({}, {6.f});
  ExpectMatches(MakeNode("Clip", 3, 1), {x, lo, hi}, {false, true, true}, "ClipF32Fast", true);
  ExpectMatches(MakeNode("Clip", 2, 1), {x, lo}, {false, true}, "ClipF32Fast", true);
  ExpectMatches(MakeNode("Clip", 3, 1), {x, Tensor(), hi}, {false, false, true}, "ClipF32Fast", true);
  ExpectMatches(MakeNode("Clip", 1, 1), {x}, {false}, "ClipF32Fast", true);
  // min > max: every element is max, as in the reference (and ONNX Runtime).
  ExpectMatches(MakeNode("Clip", 3, 1), {x, hi, lo}, {false, true, true}, "ClipF32Fast", true);
  ExpectMatches(MakeNode("Clip", 1, 1, {{"min", Attribute::Float(-1.f)}, {"max", Attribute::Float(1.f)}}), {x},
                {false}, "ClipF32Fast", true, /*opset=*/6);
  // Bounds known only at run time: the reference kernel runs.
  EXPECT_TRUE(FastKernelDeclines(MakeNode("Clip", 3, 1), {x, lo, hi}, {false, false, false}));
}

TEST(ElementwiseF32, BinaryBroadcastsMatchReference) {
  struct Case {
    Shape a, b;
  };
  const Case cases[] = {
      {{2, 3, 5, 7}, {2, 3, 5, 7}},            // same shape
      {{1, 32, 112, 112}, {1, 32, 112, 112}},  // same shape, threaded
      {{2, 3, 5, 7}, {}},                      // scalar
      {{}, {2, 3, 5, 7}},                      // scalar first
      {{1, 16, 56, 56}, {1}},                  // one-element tensor
      {{1, 32, 56, 56}, {1, 32, 1, 1}},        // per channel, NCHW (Keras BN as Mul/Add)
      {{8, 32, 28, 28}, {32, 1, 1}},           // per channel, NCHW, batch 8, threaded
      {{1, 56, 56, 24}, {24}},                 // per channel, NHWC (tf2onnx's [C] constants)
      {{8, 28, 28, 96}, {1, 1, 1, 96}},        // per channel, NHWC, threaded
      {{24}, {1, 56, 56, 24}},                 // per channel first
      {{1, 96, 14, 14}, {1, 96, 1, 1}},        // squeeze-excite gate, NCHW
      {{1, 14, 14, 96}, {1, 1, 1, 96}},        // squeeze-excite gate, NHWC view
      {{2, 1, 5, 1}, {1, 3, 1, 7}},            // both broadcast (outer product)
      {{4, 1, 100000}, {4, 3, 1}},             // long runs against a per-row value, threaded in pieces
      {{3, 197, 768}, {768}},                  // transformer bias
      {{1, 224, 224, 3}, {3}},                 // NHWC image and per-channel mean (Keras Normalization): widened runs
      {{3}, {8, 224, 224, 3}},                 // the same, pattern first, threaded
      {{1, 7, 11, 5}, {1, 1, 1, 5}},           // 77 pixels (prime factors only 7 and 11) of 5 channels
      {{2, 30, 3}, {2, 1, 3}},                 // a pattern per batch index: not widened
      {{320, 1, 1, 2}, {1, 7, 7, 2}},          // RAFT's sampling grids: runs of 2, a block of rows per call
      {{1000, 1, 1, 3}, {1, 7, 9, 3}},         // the same, threaded, units ending inside a block of 63 rows
      {{5, 4, 1, 6}, {5, 1, 3, 1}},            // short runs of one value against contiguous runs
      {{1, 1, 1, 1}, {1, 1, 1, 1}},            // one element
      {{0, 3}, {3}},                           // empty
  };
  for (const char* op : {"Add", "Sub", "Mul", "Div", "PRelu", "Max", "Min"}) {
    for (const Case& c : cases) {
      // PRelu's slope broadcasts to X, never the other way (MediaPipe's and MTCNN's per-channel slopes).
      bool slope_fits = c.b.size() <= c.a.size();
      for (size_t j = 0; slope_fits && j < c.b.size(); ++j) {
        const int64_t d = c.b[c.b.size() - 1 - j];
        slope_fits = d == 1 || d == c.a[c.a.size() - 1 - j];
      }
      if (std::string(op) == "PRelu" && !slope_fits) continue;
      SCOPED_TRACE(std::string(op) + " " + ShapeToString(c.a) + " and " + ShapeToString(c.b));
      Tensor a = RandomTensor(c.a, 4, -2.f, 2.f), b = RandomTensor(c.b, 5, 0.5f, 2.f);
      for (bool constant_b : {false, true})
        ExpectMatches(MakeNode(op, 2, 1), {a, b}, {false, constant_b}, std::string(op) + "F32Fast", true);
      ExpectMatches(MakeNode(op, 2, 1), {a, b}, {false, false}, std::string(op) + "F32Fast", true, 17, 1);
    }
  }
}

TEST(ElementwiseF32, DivisionByZeroAndSpecialValues) {
  Tensor a = UnaryInput({64}, 6, -2.f, 2.f);
  Tensor b = UnaryInput({64}, 7, -2.f, 2.f);
  for (const char* op : {"Add", "Sub", "Mul", "Div", "PRelu", "Max", "Min"})
    ExpectMatches(MakeNode(op, 2, 1), {a, b}, {false, false}, std::string(op) + "F32Fast", true);
  // Max and Min of three inputs: the reference kernel's fold.
  EXPECT_TRUE(FastKernelDeclines(MakeNode("Max", 3, 1), {a, b, a}, {false, false, false}));
}

// Log over its whole range (log-mel front ends take the log of powers from 1e-10 up): e^[-87, 88], the subnormals
// (scaled first), and the powers of two on both sides of the reduction's sqrt(1/2) split.
TEST(ElementwiseF32, LogOverTheWholeRange) {
  Tensor x = RandomTensor({20000}, 8, -87.f, 88.f);
  float* p = x.data<float>();
  for (int64_t i = 0; i < x.numel(); ++i) p[i] = std::exp(p[i]);
  const float specials[] = {
      1e-40f, 1.4e-45f, 1.17549435e-38f, 0.70710677f, 0.70710683f, 1.f, 2.f, 0.5f, std::numeric_limits<float>::max()};
  for (size_t i = 0; i < std::size(specials); ++i) p[i] = specials[i];
  ExpectMatches(MakeNode("Log", 1, 1), {x}, {false}, "LogF32Fast", false);
}

TEST(ElementwiseF32, DeclinesOtherDtypes) {
  Tensor i64 = Tensor::FromVector<int64_t>({3}, {1, 2, 3});
  EXPECT_TRUE(FastKernelDeclines(MakeNode("Add", 2, 1), {i64, i64}, {false, false}));
  Tensor i32 = Tensor::FromVector<int32_t>({3}, {-1, 2, 3});
  EXPECT_TRUE(FastKernelDeclines(MakeNode("Relu", 1, 1), {i32}, {false}));
  EXPECT_TRUE(FastKernelDeclines(MakeNode("Abs", 1, 1), {i32}, {false}));
}

// SiluInPlace (the convolution kernel's own SiLU pass, rcp14 or AVX2's rcp + one Newton step) against x / (1 + e^-x)
// in double (ctest's silu_avx2_pass runs it on the AVX2 pass): lengths 1..40 (masked tails), large arguments of both
// signs, zeros, and on two threads a long run.
TEST(SiluInPlace, MatchesTheFormulaWithTailsAndLargeArguments) {
  auto check = [](std::vector<float> x, int threads) {
    const std::vector<float> in = x;
    SiluInPlace(x.data(), static_cast<int64_t>(x.size()), threads);
    for (size_t i = 0; i < x.size(); ++i) {
      const double v = in[i], want = v / (1.0 + std::exp(-v));
      // The exponent is clamped as in vmath::Exp (e^88.3 at most), so below x = -88.3 the result is x * ~4.5e-39
      // instead of underflowing to 0 (the other fast kernels' SiLU does the same).
      EXPECT_NEAR(x[i], want, 4e-7 * std::fabs(want) + 1e-38 * std::fabs(v) + 1e-37)
          << "x = " << v << " at " << i << " of " << x.size();
    }
  };
  for (int n = 1; n <= 40; ++n) {
    std::vector<float> x(n);
    for (int i = 0; i < n; ++i) x[i] = (i % 2 ? -1.f : 1.f) * 0.37f * static_cast<float>(i * i % 23);
    check(x, 1);
  }
  check({0.f, -0.f, 1e-20f, -1e-20f, 80.f, -80.f, 87.f, -87.f, 100.f, -100.f, 1e30f, -1e30f, 5.5f, -5.5f, 17.f, -17.f,
         0.25f},
        1);
  std::vector<float> big(100003);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(static_cast<int64_t>(i % 4001) - 2000) / 97.f;
  check(big, 2);
}

}  // namespace
}  // namespace osprey::testing
