// Transformer pattern fusion (src/runtime/fusion_patterns.cc): decomposed LayerNorm / GELU chains and MatMul + bias
// become single nodes. Oracle: the same graph compiled without fusion and with reference kernels only, whose nodes
// each compute one ONNX op exactly as written; the step count of the fused plan shows what was fused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "fusion_test_util.h"
#include "osprey/runtime.h"
#include "test_util.h"
#include "unit/kernels/kernel_test_util.h"

namespace osprey {
namespace {

using testing::ExpectTensorNear;
using testing::RandomTensor;

using testing::kOracle;

Tensor F32(Shape shape, std::vector<float> v) { return Tensor::FromVector<float>(std::move(shape), v); }
Tensor Scalar(float v) { return Tensor::Scalar<float>(v); }

// Compiles `graph` fused (with fast kernels, and again with reference kernels) and unfused (the oracle); checks the
// fused step count and that every output agrees within 1e-4. Inputs are random in [-2, 2) plus `offset`.
void ExpectFused(const Graph& graph, const std::vector<Shape>& input_shapes, size_t fused_steps, float offset = 0.f) {
  std::vector<TensorSpec> specs;
  std::vector<Tensor> inputs;
  for (size_t i = 0; i < input_shapes.size(); ++i) {
    specs.push_back({DType::kF32, input_shapes[i]});
    Tensor t = RandomTensor(input_shapes[i], 11 + static_cast<uint32_t>(i), -2.f + offset, 2.f + offset);
    inputs.push_back(t);
  }
  auto oracle = Compile(graph, specs, kOracle);
  const std::vector<Tensor> expected = oracle->Run(inputs);
  for (bool fast : {false, true}) {
    SCOPED_TRACE(fast ? "fused, fast kernels" : "fused, reference kernels");
    auto fused = Compile(graph, specs, CompileOptions{.num_threads = 2, .fast_kernels = fast, .fuse = true});
    EXPECT_EQ(fused->num_steps(), fused_steps) << "unfused plan has " << oracle->num_steps() << " steps";
    const std::vector<Tensor> got = fused->Run(inputs);
    ASSERT_EQ(got.size(), expected.size());
    for (size_t i = 0; i < got.size(); ++i) ExpectTensorNear(got[i], expected[i], 1e-4f, 1e-4f);
  }
}

size_t UnfusedSteps(const Graph& graph, const std::vector<Shape>& input_shapes) {
  std::vector<TensorSpec> specs;
  for (const Shape& s : input_shapes) specs.push_back({DType::kF32, s});
  return Compile(graph, specs, kOracle)->num_steps();
}

// Runs `g` fused with fast kernels against the unfused oracle; returns the op types the fused plan ran.
std::vector<std::string> RunAgainstOracle(const Graph& g, const Shape& input) {
  std::vector<OpProfile> profile;
  const Tensor x = RandomTensor(input, 1);
  const std::vector<Tensor> got = Compile(g, {{DType::kF32, input}}, {.num_threads = 2})->Run({x}, &profile);
  const std::vector<Tensor> want = Compile(g, {{DType::kF32, input}}, kOracle)->Run({x});
  for (size_t i = 0; i < want.size(); ++i) ExpectTensorNear(got[i], want[i], 1e-4f, 1e-4f);
  std::vector<std::string> ops;
  for (const OpProfile& p : profile) ops.push_back(p.op_type);
  return ops;
}

bool Ran(const std::vector<std::string>& ops, const char* op) { return std::count(ops.begin(), ops.end(), op) > 0; }

// ---------------------------------------------------------------- GroupNorm

// nn.GroupNorm(groups, C) as PyTorch's dynamo exporter writes it: Reshape [N, G, -1] -> InstanceNormalization with
// unit scale and zero bias of G values -> Reshape back -> Mul(weight [C, 1, 1]) -> Add(bias [C, 1, 1]).
// `activation`: a unary op after it ("Relu"; "Silu": PyTorch's Mul(y, Sigmoid(y))).
Graph GroupNormGraph(const Shape& shape, int64_t groups, bool affine, bool escape = false,
                     const std::string& activation = "") {
  GraphBuilder b("groupnorm", 20);
  auto x = b.Input("x", DType::kF32, shape);
  auto grouped = b.Op("Reshape", {x, b.Constant(Tensor::FromVector<int64_t>({3}, {shape[0], groups, -1}))});
  auto norm = b.Op("InstanceNormalization",
                   {grouped, b.Constant(RandomTensor({groups}, 5, 0.5f, 1.5f)), b.Constant(RandomTensor({groups}, 6))},
                   {{"epsilon", Attribute::Float(1e-5f)}});
  Shape back = shape;
  auto y = b.Op("Reshape", {norm, b.Constant(Tensor::FromVector<int64_t>({static_cast<int64_t>(back.size())}, back))});
  if (affine) {
    y = b.Op("Mul", {y, b.Constant(RandomTensor({shape[1], 1, 1}, 7, 0.5f, 1.5f))});
    y = b.Op("Add", {y, b.Constant(RandomTensor({shape[1], 1, 1}, 8))});
  }
  if (activation == "Silu")
    y = b.Op("Mul", {y, b.Op("Sigmoid", {y})});
  else if (!activation.empty())
    y = b.Op(activation, {y});
  b.Output(y, "y");
  if (escape) b.Output(grouped, "grouped");
  return b.Finish();
}

TEST(FusionPatterns, GroupNormAsPyTorchExportsIt) {
  ExpectFused(GroupNormGraph({1, 64, 14, 14}, 1, true), {{1, 64, 14, 14}}, 1);  // PoolFormer's GroupNorm(1)
  ExpectFused(GroupNormGraph({2, 32, 9, 9}, 8, true), {{2, 32, 9, 9}}, 1);
  ExpectFused(GroupNormGraph({2, 32, 9, 9}, 4, false), {{2, 32, 9, 9}}, 1);  // no affine: the group scale and bias
  ExpectFused(GroupNormGraph({1, 16, 20, 20}, 2, true), {{1, 16, 20, 20}}, 1, 200.f);  // mean far from zero
}

TEST(FusionPatterns, GroupNormTakesTheActivationAfterIt) {
  // BiT's GroupNorm + ReLU, a diffusion model's GroupNorm + SiLU: one step each, on every layout the fast plan picks.
  for (const char* act : {"Relu", "Silu", "Tanh"}) {
    SCOPED_TRACE(act);
    ExpectFused(GroupNormGraph({2, 32, 9, 9}, 8, true, false, act), {{2, 32, 9, 9}}, 1);
    ExpectFused(GroupNormGraph({1, 64, 56, 56}, 32, true, false, act), {{1, 64, 56, 56}}, 1, 3.f);
  }
}

TEST(FusionPatterns, GroupNormNotFusedWhenAnIntermediateEscapes) {
  // The grouped view is also a graph output: the InstanceNormalization stays (its affine tail fuses on its own).
  EXPECT_TRUE(Ran(RunAgainstOracle(GroupNormGraph({1, 8, 5, 5}, 2, true, /*escape=*/true), {1, 8, 5, 5}),
                  "InstanceNormalization"));
}

// ---------------------------------------------------------------- BatchNorm after MatMul

// LeViT's Linear + BatchNorm1d as PyTorch exports it: MatMul [1, T, K] x [K, N] [-> Add(bias)] -> Reshape [T, N]
// -> BatchNormalization. The BatchNormalization is folded into the MatMul's weight and bias.
Graph LinearBatchNormGraph(bool bias, bool reshape, bool escape = false, bool flatten = false) {
  GraphBuilder b("linear_bn", 20);
  auto x = b.Input("x", DType::kF32, reshape ? Shape{1, 49, 32} : Shape{49, 32});
  auto y = b.Op("MatMul", {x, b.Constant(RandomTensor({32, 24}, 3))});
  if (bias) y = b.Op("Add", {y, b.Constant(RandomTensor({24}, 4))});
  if (reshape && flatten) y = b.Op("Flatten", {y}, {{"axis", Attribute::Int(2)}});  // the TorchScript exporter's form
  if (reshape && !flatten) y = b.Op("Reshape", {y, b.Constant(Tensor::FromVector<int64_t>({2}, {49, 24}))});
  auto bn =
      b.Op("BatchNormalization", {y, b.Constant(RandomTensor({24}, 5, 0.5f, 1.5f)), b.Constant(RandomTensor({24}, 6)),
                                  b.Constant(RandomTensor({24}, 7)), b.Constant(RandomTensor({24}, 8, 0.5f, 2.f))});
  b.Output(bn, "y");
  if (escape) b.Output(y, "pre");
  return b.Finish();
}

TEST(FusionPatterns, BatchNormAfterMatMulFoldsIntoItsWeights) {
  for (bool bias : {false, true})
    for (bool reshape : {false, true}) {
      SCOPED_TRACE(std::string(bias ? "bias" : "no bias") + (reshape ? ", through a Reshape" : ""));
      const std::vector<std::string> ops =
          RunAgainstOracle(LinearBatchNormGraph(bias, reshape), reshape ? Shape{1, 49, 32} : Shape{49, 32});
      EXPECT_FALSE(Ran(ops, "BatchNormalization"));
      EXPECT_TRUE(Ran(ops, "MatMul"));
    }
  EXPECT_FALSE(Ran(RunAgainstOracle(LinearBatchNormGraph(true, true, false, /*flatten=*/true), {1, 49, 32}),
                   "BatchNormalization"));
  // The MatMul's output is also a graph output: the BatchNormalization stays.
  EXPECT_TRUE(
      Ran(RunAgainstOracle(LinearBatchNormGraph(true, true, /*escape=*/true), {1, 49, 32}), "BatchNormalization"));
}

// ---------------------------------------------------------------- Scale after MatMul

struct LinearScaleSpec {
  bool bias = true;
  bool transpose = true;     // back to NCHW between the two, as ConvNeXt's block does
  Shape scale{24, 1, 1};     // ConvNeXt's layer scale; [24] without the Transpose; [1]: one value
  bool scale_first = false;  // Mul(s, y)
  bool escape = false;       // the MatMul's output is a graph output too
};

// x [2, 5, 7, 32] -> MatMul [32, 24] [-> Add(bias)] [-> Transpose to [2, 24, 5, 7]] -> Mul(s).
Graph LinearScaleGraph(const LinearScaleSpec& spec) {
  GraphBuilder b("linear_scale", 13);
  auto x = b.Input("x", DType::kF32, {2, 5, 7, 32});
  auto y = b.Op("MatMul", {x, b.Constant(RandomTensor({32, 24}, 3))});
  if (spec.bias) y = b.Op("Add", {b.Constant(RandomTensor({24}, 4)), y});
  auto t = spec.transpose ? b.Op("Transpose", {y}, {{"perm", Attribute::Ints({0, 3, 1, 2})}}) : y;
  auto s = b.Constant(RandomTensor(spec.scale, 5, 0.5f, 1.5f));
  b.Output(spec.scale_first ? b.Op("Mul", {s, t}) : b.Op("Mul", {t, s}), "y");
  if (spec.escape) b.Output(y, "pre");
  return b.Finish();
}

TEST(FusionPatterns, ScaleAfterMatMulFoldsIntoItsWeights) {
  for (bool bias : {false, true})
    for (bool transpose : {false, true}) {
      SCOPED_TRACE(std::string(bias ? "bias" : "no bias") + (transpose ? ", through a Transpose" : ""));
      EXPECT_FALSE(Ran(RunAgainstOracle(LinearScaleGraph({.bias = bias,
                                                          .transpose = transpose,
                                                          .scale = transpose ? Shape{24, 1, 1} : Shape{24}}),
                                        {2, 5, 7, 32}),
                       "Mul"));
    }
  EXPECT_FALSE(Ran(RunAgainstOracle(LinearScaleGraph({.scale = {1}, .scale_first = true}), {2, 5, 7, 32}), "Mul"));
}

TEST(FusionPatterns, ScaleAfterMatMulStaysWhereItIsNotPerColumn) {
  // Along another axis than the MatMul's columns (here its rows, moved to axis 3 by the Transpose) and with the
  // MatMul's output escaping: the Mul stays, and the results still match.
  EXPECT_TRUE(Ran(RunAgainstOracle(LinearScaleGraph({.scale = {7}}), {2, 5, 7, 32}), "Mul"));
  EXPECT_TRUE(Ran(RunAgainstOracle(LinearScaleGraph({.escape = true}), {2, 5, 7, 32}), "Mul"));
}

// ---------------------------------------------------------------- Residual after MatMul

struct LinearResidualSpec {
  bool bias = true;
  bool transpose = false;            // ConvNeXt's block: NCHW input permuted to channels-last, Linear, permuted back
  bool residual_first = false;       // Add(r, y)
  bool relu = false;                 // an activation after the Add (fused after the residual)
  bool escape = false;               // the MatMul's output is a graph output too
  bool residual_read_later = false;  // the residual is read after the Add (not overwritten in place)
};

// ViT's x + Linear(x) on x [2, 9, 32], or ConvNeXt's x + Transpose(Linear(Transpose(x))) on x [2, 32, 5, 7].
Graph LinearResidualGraph(const LinearResidualSpec& spec) {
  GraphBuilder b("linear_residual", 13);
  auto x = b.Input("x", DType::kF32, spec.transpose ? Shape{2, 32, 5, 7} : Shape{2, 9, 32});
  auto h = spec.transpose ? b.Op("Transpose", {x}, {{"perm", Attribute::Ints({0, 2, 3, 1})}}) : x;
  auto y = b.Op("MatMul", {h, b.Constant(RandomTensor({32, 32}, 3, -0.3f, 0.3f))});
  if (spec.bias) y = b.Op("Add", {y, b.Constant(RandomTensor({32}, 4))});
  auto t = spec.transpose ? b.Op("Transpose", {y}, {{"perm", Attribute::Ints({0, 3, 1, 2})}}) : y;
  auto sum = spec.residual_first ? b.Op("Add", {x, t}) : b.Op("Add", {t, x});
  if (spec.relu) sum = b.Op("Relu", {sum});
  if (spec.residual_read_later) sum = b.Op("Mul", {sum, x});
  b.Output(sum, "y");
  if (spec.escape) b.Output(y, "pre");
  return b.Finish();
}

TEST(FusionPatterns, ResidualAfterMatMulFusesIntoIt) {
  // Unfused: [Transpose,] MatMul, [Add bias,] [Transpose,] Add [, Relu] [, Mul]. Fused: the MatMul with its bias,
  // residual and activation, behind a Transpose of the residual and before the one of the result when transposed.
  for (bool transpose : {false, true})
    for (bool bias : {false, true})
      for (bool relu : {false, true}) {
        const LinearResidualSpec spec{.bias = bias, .transpose = transpose, .residual_first = bias, .relu = relu};
        SCOPED_TRACE(std::string(transpose ? "through Transposes" : "rows") + (bias ? ", bias" : "") +
                     (relu ? ", Relu" : ""));
        ExpectFused(LinearResidualGraph(spec), {transpose ? Shape{2, 32, 5, 7} : Shape{2, 9, 32}}, transpose ? 4 : 1);
      }
  // The residual still read after the Add: the kernel copies it into its output instead of summing onto it in place.
  ExpectFused(LinearResidualGraph({.residual_read_later = true}), {{2, 9, 32}}, 2);
  EXPECT_FALSE(Ran(
      RunAgainstOracle(LinearResidualGraph({.transpose = true, .residual_read_later = true}), {2, 32, 5, 7}), "Add"));
}

TEST(FusionPatterns, ResidualAfterOneRowMatMulStaysOnTheGemvKernel) {
  // [1, 32] x [32, 32] + bias + x: the one-row kernel (GemvF32, AVX-512) adds the residual where its sums start.
  GraphBuilder b("row_residual", 13);
  auto x = b.Input("x", DType::kF32, {1, 32});
  auto y = b.Op("Add", {b.Op("MatMul", {x, b.Constant(RandomTensor({32, 32}, 3, -0.3f, 0.3f))}),
                        b.Constant(RandomTensor({32}, 4))});
  b.Output(b.Op("Relu", {b.Op("Add", {y, x})}), "y");
  const Graph g = b.Finish();
  ExpectFused(g, {{1, 32}}, 1);
  std::vector<OpProfile> profile;
  Compile(g, {{DType::kF32, {1, 32}}}, {.num_threads = 2})->Run({RandomTensor({1, 32}, 1)}, &profile);
  ASSERT_EQ(profile.size(), 1u);
  if (__builtin_cpu_supports("avx512f")) {
    EXPECT_EQ(profile[0].kernel, "GemvF32");
  }
}

TEST(FusionPatterns, MatMulResidualShapeRuleRejectsMalformedNodes) {
  // The fused node as the pass writes it, on reference kernels: input 3 must have the product's shape and needs
  // `_residual` = 1; `_residual` needs input 3.
  auto graph = [](const Shape& residual, bool attribute, bool input = true) {
    GraphBuilder b("fused", 13);
    auto x = b.Input("x", DType::kF32, {2, 9, 32});
    AttributeMap attrs;
    if (attribute) attrs["_residual"] = Attribute::Int(1);
    b.Output(b.Op("MatMul",
                  {x, b.Constant(RandomTensor({32, 24}, 1)), ValueRef{},
                   input ? b.Constant(RandomTensor(residual, 2)) : ValueRef{}},
                  attrs),
             "y");
    return b.Finish();
  };
  const std::vector<TensorSpec> specs{{DType::kF32, {2, 9, 32}}};
  testing::ExpectCompileError(graph({2, 9, 32}, true), specs, "residual input 3 should have the output's shape [2, 9, 24]");
  testing::ExpectCompileError(graph({24}, true), specs, "residual input 3 should have the output's shape");
  testing::ExpectCompileError(graph({2, 9, 24}, false), specs, "input 3 is only allowed on a fused node with _residual");
  testing::ExpectCompileError(graph({2, 9, 24}, true, false), specs, "input 3 (the residual) is missing");
  // Well formed, it adds the residual (reference kernel against MatMul then Add).
  const Tensor x = RandomTensor({2, 9, 32}, 9);
  GraphBuilder b("separate", 13);
  auto in = b.Input("x", DType::kF32, {2, 9, 32});
  b.Output(b.Op("Add", {b.Op("MatMul", {in, b.Constant(RandomTensor({32, 24}, 1))}), b.Constant(RandomTensor({2, 9, 24}, 2))}),
           "y");
  ExpectTensorNear(Compile(graph({2, 9, 24}, true), specs, kOracle)->Run({x})[0],
                   Compile(b.Finish(), specs, kOracle)->Run({x})[0], 1e-6f, 1e-6f);
}

TEST(FusionPatterns, ResidualAfterMatMulStaysWhereTheProductEscapes) {
  EXPECT_TRUE(Ran(RunAgainstOracle(LinearResidualGraph({.escape = true}), {2, 9, 32}), "Add"));
  EXPECT_TRUE(Ran(RunAgainstOracle(LinearResidualGraph({.transpose = true, .escape = true}), {2, 32, 5, 7}), "Add"));
}

// ---------------------------------------------------------------- LayerNorm

struct LayerNormSpec {
  bool square_with_mul = false;  // Mul(d, d) instead of Pow(d, 2)
  bool affine_scale = true, affine_bias = true;
  bool constants_first = false;  // Mul(gamma, n) / Add(beta, .) / Add(eps, .)
  bool scalar_scale = false;     // gamma of shape [1] broadcast over the channels
  float epsilon = 1e-5f;
};

// The chain PyTorch 1.13 exports for nn.LayerNorm at opset 13, over the last axis of `x`.
ValueRef DecomposedLayerNorm(GraphBuilder& b, ValueRef x, int64_t channels, const LayerNormSpec& s,
                             ValueRef* d_out = nullptr) {
  const AttributeMap last_axis{{"axes", Attribute::Ints({-1})}};
  auto mean = b.Op("ReduceMean", {x}, last_axis, "ln/ReduceMean");
  auto d = b.Op("Sub", {x, mean}, {}, "ln/Sub");
  if (d_out) *d_out = d;
  auto sq = s.square_with_mul ? b.Op("Mul", {d, d}) : b.Op("Pow", {d, b.Constant(Scalar(2.f))});
  auto var = b.Op("ReduceMean", {sq}, last_axis);
  auto eps = b.Constant(Scalar(s.epsilon));
  auto ve = s.constants_first ? b.Op("Add", {eps, var}) : b.Op("Add", {var, eps});
  auto y = b.Op("Div", {d, b.Op("Sqrt", {ve})});
  if (s.affine_scale) {
    Tensor gamma = s.scalar_scale ? F32({1}, {1.5f}) : RandomTensor({channels}, 3, 0.5f, 1.5f);
    auto g = b.Constant(gamma);
    y = s.constants_first ? b.Op("Mul", {g, y}) : b.Op("Mul", {y, g});
  }
  if (s.affine_bias) {
    auto beta = b.Constant(RandomTensor({channels}, 4));
    y = s.constants_first ? b.Op("Add", {beta, y}) : b.Op("Add", {y, beta});
  }
  return y;
}

Graph LayerNormGraph(const Shape& shape, const LayerNormSpec& s) {
  GraphBuilder b("layernorm", 13);
  auto x = b.Input("x", DType::kF32, shape);
  b.Output(DecomposedLayerNorm(b, x, shape.back(), s), "y");
  return b.Finish();
}

TEST(FusionPatterns, LayerNormAsPyTorchExportsIt) {
  ExpectFused(LayerNormGraph({2, 5, 13}, {}), {{2, 5, 13}}, 1);
  ExpectFused(LayerNormGraph({3, 768}, {.epsilon = 1e-6f}), {{3, 768}}, 1);
}

TEST(FusionPatterns, LayerNormVariants) {
  const std::pair<const char*, LayerNormSpec> variants[] = {
      {"square as Mul(d, d)", {.square_with_mul = true}},
      {"constants first", {.constants_first = true}},
      {"no affine", {.affine_scale = false, .affine_bias = false}},
      {"scale only", {.affine_bias = false}},
      {"bias only", {.affine_scale = false}},
      {"scalar scale", {.scalar_scale = true}},
  };
  for (const auto& [name, spec] : variants) {
    SCOPED_TRACE(name);
    ExpectFused(LayerNormGraph({3, 13}, spec), {{3, 13}}, 1);
  }
  ExpectFused(LayerNormGraph({13}, {}), {{13}}, 1);                  // rank 1
  ExpectFused(LayerNormGraph({1, 4, 4, 5}, {}), {{1, 4, 4, 5}}, 1);  // ConvNeXt: channels last after a Transpose
}

TEST(FusionPatterns, LayerNormFarFromZero) {
  // Activations whose mean is large relative to their spread: the fused kernel's statistics must not cancel.
  ExpectFused(LayerNormGraph({3, 768}, {}), {{3, 768}}, 1, 300.f);
}

TEST(FusionPatterns, LayerNormNotFusedWhenAnIntermediateEscapes) {
  // The centred value d is also a graph output, so the chain must stay as written.
  GraphBuilder b("layernorm_escape", 13);
  auto x = b.Input("x", DType::kF32, {3, 13});
  ValueRef d;
  b.Output(DecomposedLayerNorm(b, x, 13, {}, &d), "y");
  b.Output(d, "d");
  Graph g = b.Finish();
  ExpectFused(g, {{3, 13}}, UnfusedSteps(g, {{3, 13}}));
}

TEST(FusionPatterns, LayerNormNotFusedOverOtherAxes) {
  // Mean over axis 0: not a last-axis LayerNorm.
  GraphBuilder b("mean_axis0", 13);
  auto x = b.Input("x", DType::kF32, {3, 13});
  const AttributeMap axis0{{"axes", Attribute::Ints({0})}};
  auto d = b.Op("Sub", {x, b.Op("ReduceMean", {x}, axis0)});
  auto var = b.Op("ReduceMean", {b.Op("Pow", {d, b.Constant(Scalar(2.f))})}, axis0);
  b.Output(b.Op("Div", {d, b.Op("Sqrt", {b.Op("Add", {var, b.Constant(Scalar(1e-5f))})})}), "y");
  Graph g = b.Finish();
  ExpectFused(g, {{3, 13}}, UnfusedSteps(g, {{3, 13}}));
}

// ONNX Runtime's transpose optimiser moves ConvNeXt's Permute between the Sub and the rest of the LayerNorm (then
// writes the rest as SimplifiedLayerNormalization, lowered back to this chain): ReduceMean(axis 1) -> Sub ->
// Transpose(0, 2, 3, 1) -> Pow -> ReduceMean(last) -> Add -> Sqrt -> Div -> Mul -> Add. The Transpose is hoisted to
// read x and the rest fuses; a Transpose that does not move the mean's axis last leaves the chain as written.
Graph LayerNormAcrossTransposeGraph(const std::vector<int64_t>& perm) {
  GraphBuilder b("layernorm_transposed", 13);
  auto x = b.Input("x", DType::kF32, {1, 5, 4, 3});
  auto d = b.Op("Sub", {x, b.Op("ReduceMean", {x}, {{"axes", Attribute::Ints({1})}})});
  auto t = b.Op("Transpose", {d}, {{"perm", Attribute::Ints(perm)}});
  const AttributeMap last_axis{{"axes", Attribute::Ints({-1})}};
  auto var = b.Op("ReduceMean", {b.Op("Pow", {t, b.Constant(Scalar(2.f))})}, last_axis);
  auto y = b.Op("Div", {t, b.Op("Sqrt", {b.Op("Add", {var, b.Constant(Scalar(1e-6f))})})});
  const int64_t channels = perm.back() == 1 ? 5 : (perm.back() == 2 ? 4 : 3);
  y = b.Op("Mul", {y, b.Constant(RandomTensor({channels}, 3, 0.5f, 1.5f))});
  b.Output(b.Op("Add", {y, b.Constant(RandomTensor({channels}, 4))}), "y");
  return b.Finish();
}

TEST(FusionPatterns, LayerNormAcrossOrtsTransposeIsHoisted) {
  const std::vector<std::string> ops = RunAgainstOracle(LayerNormAcrossTransposeGraph({0, 2, 3, 1}), {1, 5, 4, 3});
  EXPECT_TRUE(Ran(ops, "LayerNormalization"));
  EXPECT_FALSE(Ran(ops, "Sub"));
  const std::vector<std::string> kept = RunAgainstOracle(LayerNormAcrossTransposeGraph({0, 1, 3, 2}), {1, 5, 4, 3});
  EXPECT_FALSE(Ran(kept, "LayerNormalization"));
  EXPECT_TRUE(Ran(kept, "Sub"));
}

// Flax's LayerNorm (use_fast_variance) as jax2onnx writes it: var = max(E[x^2] - E[x]^2, 0).
Graph FlaxLayerNormGraph(bool with_max, bool mean_escapes) {
  GraphBuilder b("flax_layernorm", 23);
  auto x = b.Input("x", DType::kF32, {2, 7, 16});
  auto axes = b.Constant(Tensor::FromVector<int64_t>({1}, {-1}));
  auto mean = b.Op("ReduceMean", {x, axes});
  auto centered = b.Op("Sub", {x, mean});
  auto second = b.Op("ReduceMean", {b.Op("Mul", {x, x}), axes});
  auto var = b.Op("Sub", {second, b.Op("Mul", {mean, mean})});
  if (with_max) var = b.Op("Max", {var, b.Constant(Scalar(0.f))});
  auto std_dev = b.Op("Sqrt", {b.Op("Add", {var, b.Constant(Scalar(1e-6f))})});
  auto y = b.Op("Mul", {b.Op("Div", {centered, std_dev}), b.Constant(RandomTensor({16}, 3, 0.5f, 1.5f))});
  b.Output(b.Op("Add", {y, b.Constant(RandomTensor({16}, 4))}), "y");
  if (mean_escapes) b.Output(mean, "mean");
  return b.Finish();
}

TEST(FusionPatterns, FlaxLayerNormFuses) {
  for (bool with_max : {true, false}) {
    SCOPED_TRACE(with_max ? "with Max(0)" : "without Max");
    const std::vector<std::string> ops = RunAgainstOracle(FlaxLayerNormGraph(with_max, false), {2, 7, 16});
    EXPECT_TRUE(Ran(ops, "LayerNormalization"));
    EXPECT_FALSE(Ran(ops, "Sqrt"));
  }
  // The mean is also a graph output: the chain stays as written.
  Graph g = FlaxLayerNormGraph(true, true);
  ExpectFused(g, {{2, 7, 16}}, UnfusedSteps(g, {{2, 7, 16}}));
}

// Keras 3's LayerNormalization through tf2onnx: the mean over the last axis as GlobalAveragePool (rank 3) or
// ReduceMean, var = mean((x - mean)^2), inv = 1 / sqrt(var + eps) [* gamma], x * inv + (-mean * inv [+ beta]).
Graph KerasLayerNormGraph(const Shape& shape, bool affine, bool mean_escapes = false) {
  GraphBuilder b("keras_layernorm", 18);
  auto x = b.Input("x", DType::kF32, shape);
  const int64_t c = shape.back();
  auto axes = b.Constant(Tensor::FromVector<int64_t>({1}, {-1}));
  auto last_mean = [&](ValueRef v) {
    return shape.size() == 3 ? b.Op("GlobalAveragePool", {v}) : b.Op("ReduceMean", {v, axes});
  };
  auto mean = last_mean(x);
  auto d = b.Op("Sub", {x, mean});
  auto var = last_mean(b.Op("Mul", {d, d}));
  auto inv = b.Op("Reciprocal", {b.Op("Sqrt", {b.Op("Add", {var, b.Constant(Scalar(1e-3f))})})});
  if (affine) inv = b.Op("Mul", {inv, b.Constant(RandomTensor({c}, 3, 0.5f, 1.5f))});
  auto shift = b.Op("Mul", {b.Op("Neg", {mean}), inv});
  if (affine) shift = b.Op("Add", {shift, b.Constant(RandomTensor({c}, 4))});
  b.Output(b.Op("Add", {b.Op("Mul", {x, inv}), shift}), "y");
  if (mean_escapes) b.Output(mean, "mean");
  return b.Finish();
}

TEST(FusionPatterns, KerasLayerNormFuses) {
  for (const Shape& shape : {Shape{2, 7, 16}, Shape{2, 3, 5, 16}})
    for (bool affine : {true, false}) {
      SCOPED_TRACE(std::to_string(shape.size()) + (affine ? "-D, affine" : "-D"));
      const std::vector<std::string> ops = RunAgainstOracle(KerasLayerNormGraph(shape, affine), shape);
      EXPECT_TRUE(Ran(ops, "LayerNormalization"));
      EXPECT_FALSE(Ran(ops, "Sqrt"));
      EXPECT_FALSE(Ran(ops, "Reciprocal"));
    }
  // The mean is also a graph output: no LayerNormalization (it would have to compute the mean twice).
  EXPECT_FALSE(Ran(RunAgainstOracle(KerasLayerNormGraph({2, 7, 16}, true, true), {2, 7, 16}), "LayerNormalization"));
  // GlobalAveragePool on rank 4 averages H and W, not the last axis: not a LayerNorm.
  GraphBuilder b("spatial_moments", 17);
  auto x = b.Input("x", DType::kF32, {1, 4, 3, 3});
  auto mean = b.Op("GlobalAveragePool", {x});
  auto d = b.Op("Sub", {x, mean});
  auto inv = b.Op(
      "Reciprocal",
      {b.Op("Sqrt", {b.Op("Add", {b.Op("GlobalAveragePool", {b.Op("Mul", {d, d})}), b.Constant(Scalar(1e-3f))})})});
  b.Output(b.Op("Add", {b.Op("Mul", {x, inv}), b.Op("Mul", {b.Op("Neg", {mean}), inv})}), "y");
  EXPECT_FALSE(Ran(RunAgainstOracle(b.Finish(), {1, 4, 3, 3}), "LayerNormalization"));
}

// ---------------------------------------------------------------- GELU

enum class GeluForm { kPyTorch, kHalfFirst, kHalfOnSum, kMulByInverseSqrt2, kDivByTwo };

ValueRef DecomposedGelu(GraphBuilder& b, ValueRef x, GeluForm form, float sqrt2 = 1.4142135f) {
  auto t = form == GeluForm::kMulByInverseSqrt2 ? b.Op("Mul", {b.Constant(Scalar(0.70710678f)), x})
                                                : b.Op("Div", {x, b.Constant(Scalar(sqrt2))});
  auto a = b.Op("Add", {b.Op("Erf", {t}, {}, "mlp/Erf"), b.Constant(Scalar(1.f))});
  auto half = b.Constant(Scalar(0.5f));
  switch (form) {
    case GeluForm::kHalfFirst:  // (x * 0.5) * a
      return b.Op("Mul", {b.Op("Mul", {half, x}), a});
    case GeluForm::kHalfOnSum:  // x * (a * 0.5)
      return b.Op("Mul", {x, b.Op("Mul", {a, half})});
    case GeluForm::kDivByTwo:  // (a * x) / 2
      return b.Op("Div", {b.Op("Mul", {a, x}), b.Constant(Scalar(2.f))});
    default:  // (x * a) * 0.5
      return b.Op("Mul", {b.Op("Mul", {x, a}), half});
  }
}

Graph GeluGraph(GeluForm form, float sqrt2 = 1.4142135f) {
  GraphBuilder b("gelu", 13);
  auto x = b.Input("x", DType::kF32, {3, 5, 13});
  b.Output(DecomposedGelu(b, x, form, sqrt2), "y");
  return b.Finish();
}

TEST(FusionPatterns, GeluForms) {
  for (GeluForm form : {GeluForm::kPyTorch, GeluForm::kHalfFirst, GeluForm::kHalfOnSum, GeluForm::kMulByInverseSqrt2,
                        GeluForm::kDivByTwo}) {
    SCOPED_TRACE(static_cast<int>(form));
    ExpectFused(GeluGraph(form), {{3, 5, 13}}, 1);
  }
}

TEST(FusionPatterns, GeluNeedsTheRightConstants) {
  Graph g = GeluGraph(GeluForm::kPyTorch, 1.5f);  // x / 1.5 is not GELU's scaling
  ExpectFused(g, {{3, 5, 13}}, UnfusedSteps(g, {{3, 5, 13}}));
}

TEST(FusionPatterns, GeluValuesByHand) {
  // gelu(x) = 0.5 x (1 + erf(x / sqrt 2)), at a few points computed here in double.
  Graph g = GeluGraph(GeluForm::kPyTorch);
  auto plan = Compile(g, {{DType::kF32, {3, 5, 13}}});
  EXPECT_EQ(plan->num_steps(), 1u);
  Tensor x = RandomTensor({3, 5, 13}, 5, -4.f, 4.f);
  Tensor y = plan->Run({x})[0];
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double v = x.data<float>()[i];
    EXPECT_NEAR(y.data<float>()[i], 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))), 1e-5) << "x = " << v;
  }
}

enum class CubeForm { kPow, kSquareFirst, kSquareLast };

// The tanh approximation as exporters write it: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), the 0.5 first
// (Keras through tf2onnx) or last (PyTorch's gelu(approximate="tanh"), Hugging Face's gelu_new).
Graph TanhGeluGraph(CubeForm cube_form, bool half_first, float kappa = 0.044715f) {
  GraphBuilder b("gelu_tanh", 13);
  auto x = b.Input("x", DType::kF32, {3, 5, 13});
  ValueRef cube = cube_form == CubeForm::kPow           ? b.Op("Pow", {x, b.Constant(Scalar(3.f))})
                  : cube_form == CubeForm::kSquareFirst ? b.Op("Mul", {b.Op("Mul", {x, x}), x})
                                                        : b.Op("Mul", {x, b.Op("Mul", {x, x})});
  auto inner = b.Op("Add", {x, b.Op("Mul", {b.Constant(Scalar(kappa)), cube})});
  auto t = b.Op("Tanh", {b.Op("Mul", {b.Constant(Scalar(0.7978846f)), inner})});
  auto a = b.Op("Add", {b.Constant(Scalar(1.f)), t});
  auto half = b.Constant(Scalar(0.5f));
  b.Output(half_first ? b.Op("Mul", {b.Op("Mul", {half, x}), a}) : b.Op("Mul", {half, b.Op("Mul", {x, a})}), "y");
  return b.Finish();
}

TEST(FusionPatterns, TanhGeluForms) {
  for (CubeForm cube : {CubeForm::kPow, CubeForm::kSquareFirst, CubeForm::kSquareLast})
    for (bool half_first : {false, true}) {
      SCOPED_TRACE(std::to_string(static_cast<int>(cube)) + (half_first ? " half first" : " half last"));
      ExpectFused(TanhGeluGraph(cube, half_first), {{3, 5, 13}}, 1);
    }
  EXPECT_TRUE(Ran(RunAgainstOracle(TanhGeluGraph(CubeForm::kPow, true), {3, 5, 13}), "Gelu"));
  // Not GELU's constant: no Gelu (the chain may still fuse into other elementwise nodes).
  const std::vector<std::string> ops = RunAgainstOracle(TanhGeluGraph(CubeForm::kPow, true, 0.05f), {3, 5, 13});
  EXPECT_FALSE(Ran(ops, "Gelu"));
}

// After an elementwise op, the fused tanh GELU becomes one of its steps (fast kernels: StepRow's kGeluTanh).
TEST(FusionPatterns, TanhGeluAsAStepOfAnElementwiseChain) {
  GraphBuilder b("add_gelu_tanh", 13);
  auto x = b.Input("x", DType::kF32, {4, 9, 40});
  auto y = b.Op("Add", {x, b.Constant(RandomTensor({40}, 8))});
  auto cube = b.Op("Pow", {y, b.Constant(Scalar(3.f))});
  auto inner = b.Op("Add", {y, b.Op("Mul", {b.Constant(Scalar(0.044715f)), cube})});
  auto a = b.Op("Add", {b.Constant(Scalar(1.f)), b.Op("Tanh", {b.Op("Mul", {b.Constant(Scalar(0.7978846f)), inner})})});
  b.Output(b.Op("Mul", {b.Op("Mul", {b.Constant(Scalar(0.5f)), y}), a}), "z");
  const std::vector<std::string> ops = RunAgainstOracle(b.Finish(), {4, 9, 40});
  EXPECT_EQ(ops, std::vector<std::string>{"Add"});
}

TEST(FusionPatterns, TanhGeluValuesByHand) {
  auto plan = Compile(TanhGeluGraph(CubeForm::kPow, true), {{DType::kF32, {3, 5, 13}}});
  EXPECT_EQ(plan->num_steps(), 1u);
  Tensor x = RandomTensor({3, 5, 13}, 5, -4.f, 4.f);
  Tensor y = plan->Run({x})[0];
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double v = x.data<float>()[i];
    const double want = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
    EXPECT_NEAR(y.data<float>()[i], want, 1e-5) << "x = " << v;
  }
}

// ---------------------------------------------------------------- MatMul + bias

TEST(FusionPatterns, MatMulBias) {
  for (bool bias_first : {false, true}) {
    GraphBuilder b("linear", 13);
    auto x = b.Input("x", DType::kF32, {2, 3, 13});
    auto y = b.Op("MatMul", {x, b.Constant(RandomTensor({13, 7}, 6))});
    auto bias = b.Constant(RandomTensor({7}, 7));
    b.Output(bias_first ? b.Op("Add", {bias, y}) : b.Op("Add", {y, bias}), "y");
    ExpectFused(b.Finish(), {{2, 3, 13}}, 1);
  }
}

TEST(FusionPatterns, MatMulBiasByHand) {
  // [1 2; 3 4] x [1 0 1; 0 1 1] + [10 20 30] = [11 22 33; 13 24 37].
  GraphBuilder b("linear_by_hand", 13);
  auto x = b.Input("x", DType::kF32, {2, 2});
  auto y = b.Op("MatMul", {x, b.Constant(F32({2, 3}, {1, 0, 1, 0, 1, 1}))});
  b.Output(b.Op("Add", {y, b.Constant(F32({3}, {10, 20, 30}))}), "y");
  auto plan = Compile(b.Finish(), {{DType::kF32, {2, 2}}});
  EXPECT_EQ(plan->num_steps(), 1u);
  ExpectTensorNear(plan->Run({F32({2, 2}, {1, 2, 3, 4})})[0], F32({2, 3}, {11, 22, 33, 13, 24, 37}));
}

TEST(FusionPatterns, MatMulBiasNotFused) {
  // A run-time addend and a product that is also a graph output stay separate; a full-matrix addend becomes the
  // MatMul's residual (a constant: copied into the output before the product is summed onto it).
  {
    GraphBuilder b("runtime_bias", 13);
    auto x = b.Input("x", DType::kF32, {3, 13});
    auto c = b.Input("c", DType::kF32, {7});
    b.Output(b.Op("Add", {b.Op("MatMul", {x, b.Constant(RandomTensor({13, 7}, 6))}), c}), "y");
    ExpectFused(b.Finish(), {{3, 13}, {7}}, 2);
  }
  {
    GraphBuilder b("matrix_addend", 13);
    auto x = b.Input("x", DType::kF32, {3, 13});
    auto y = b.Op("MatMul", {x, b.Constant(RandomTensor({13, 7}, 6))});
    b.Output(b.Op("Add", {y, b.Constant(RandomTensor({3, 7}, 8))}), "y");
    ExpectFused(b.Finish(), {{3, 13}}, 1);
  }
  {
    GraphBuilder b("escaping_product", 13);
    auto x = b.Input("x", DType::kF32, {3, 13});
    auto y = b.Op("MatMul", {x, b.Constant(RandomTensor({13, 7}, 6))});
    b.Output(b.Op("Add", {y, b.Constant(RandomTensor({7}, 8))}), "y");
    b.Output(y, "product");
    ExpectFused(b.Finish(), {{3, 13}}, 2);
  }
}

TEST(FusionPatterns, TransformerMlpBlock) {
  // LayerNorm -> Linear -> GELU -> Linear -> + x, as in a ViT encoder layer: one LayerNormalization and two MatMuls
  // (the first with bias and GELU folded in, the second with bias and the residual).
  GraphBuilder b("mlp", 13);
  auto x = b.Input("x", DType::kF32, {1, 5, 13});
  auto h = DecomposedLayerNorm(b, x, 13, {});
  h = b.Op("Add", {b.Constant(RandomTensor({24}, 9)), b.Op("MatMul", {h, b.Constant(RandomTensor({13, 24}, 10))})});
  h = DecomposedGelu(b, h, GeluForm::kPyTorch);
  h = b.Op("Add", {b.Constant(RandomTensor({13}, 11)), b.Op("MatMul", {h, b.Constant(RandomTensor({24, 13}, 12))})});
  b.Output(b.Op("Add", {x, h}), "y");
  ExpectFused(b.Finish(), {{1, 5, 13}}, 3);  // LayerNorm, MatMul+bias+Gelu, MatMul+bias+residual
}

// ---------------------------------------------------------------- what stays unfused: large elementwise ops

TEST(FusionPatterns, LargeElementwiseParallelPaths) {
  // Tensors past the reference kernels' parallel threshold (64 Ki elements), so the parallel scalar, broadcast-row
  // and Pow(x, 2) / Pow(x, 0.5) paths run. Oracle: the same formulas evaluated here element by element.
  const Shape shape{2, 13, 51, 53};  // 70278 elements, odd inner sizes
  GraphBuilder b("elementwise", 13);
  auto x = b.Input("x", DType::kF32, shape);
  Tensor channel = RandomTensor({13, 1, 1}, 21);
  Tensor column = RandomTensor({51, 1}, 22);
  auto squared = b.Op("Pow", {x, b.Constant(Scalar(2.f))});
  auto root = b.Op("Pow", {x, b.Constant(Scalar(0.5f))});
  auto scaled = b.Op("Mul", {b.Constant(channel), x});      // broadcast along channels
  auto shifted = b.Op("Add", {x, b.Constant(column)});      // broadcast along rows
  auto halved = b.Op("Div", {x, b.Constant(Scalar(2.f))});  // scalar operand
  for (auto [value, name] :
       {std::pair{squared, "squared"}, {root, "root"}, {scaled, "scaled"}, {shifted, "shifted"}, {halved, "halved"}})
    b.Output(value, name);
  auto plan = Compile(b.Finish(), {{DType::kF32, shape}}, kOracle);
  Tensor in = RandomTensor(shape, 23, -2.f, 2.f);
  const std::vector<Tensor> out = plan->Run({in});
  ASSERT_EQ(out.size(), 5u);
  std::vector<Tensor> expected;
  for (int i = 0; i < 5; ++i) expected.emplace_back(DType::kF32, shape);
  const float* xp = in.data<float>();
  for (int64_t i = 0; i < in.numel(); ++i) {
    const int64_t c = i / (51 * 53) % 13, h = i / 53 % 51;
    expected[0].data<float>()[i] = xp[i] * xp[i];
    expected[1].data<float>()[i] = std::sqrt(xp[i]);  // NaN below zero, as pow(x, 0.5)
    expected[2].data<float>()[i] = channel.data<float>()[c] * xp[i];
    expected[3].data<float>()[i] = xp[i] + column.data<float>()[h];
    expected[4].data<float>()[i] = xp[i] / 2.f;
  }
  for (int i = 0; i < 5; ++i) ExpectTensorNear(out[i], expected[i]);
  // pow(x, 0.5) is +0 at -0 and +inf at -inf, where sqrt gives -0 and NaN.
  GraphBuilder edge("pow_edges", 13);
  auto e = edge.Input("x", DType::kF32, {2});
  edge.Output(edge.Op("Pow", {e, edge.Constant(Scalar(0.5f))}), "y");
  Tensor r = Compile(edge.Finish(), {{DType::kF32, {2}}}, kOracle)->Run({F32({2}, {-0.f, -INFINITY})})[0];
  EXPECT_FALSE(std::signbit(r.data<float>()[0]));
  EXPECT_EQ(r.data<float>()[1], INFINITY);
}

// ---------------------------------------------------------------- the fused MatMul's kernels

TEST(FusionPatterns, FusedMatMulBiasKernelMatchesReference) {
  // MatMulF32Dnnl with `_bias` (oneDNN bias, broadcast over every row of every batch) against the reference MatMul,
  // whose fused bias is checked by hand in MatMulBiasByHand.
  struct Case {
    Shape a, b;
    bool constant_b, constant_bias;
    const char* activation;
  };
  const Case cases[] = {
      {{5, 13}, {13, 7}, true, true, ""},        {{2, 3, 13}, {13, 7}, true, true, "Gelu"},
      {{2, 3, 13}, {13, 7}, false, false, ""},   {{13}, {13, 7}, true, true, "Relu"},
      {{2, 5, 13}, {2, 13, 7}, false, true, ""}, {{1, 197, 64}, {64, 96}, true, false, "Gelu"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(ShapeToString(c.a) + " x " + ShapeToString(c.b) + " " + c.activation);
    AttributeMap attrs{{"_bias", Attribute::Int(1)}};
    if (*c.activation) attrs["_activation"] = Attribute::String(c.activation);
    Node node = testing::MakeNode("MatMul", 3, 1, attrs);
    testing::ExpectFastMatchesReference(
        node, {RandomTensor(c.a, 1), RandomTensor(c.b, 2), RandomTensor({c.b.back()}, 3, -2.f, 2.f)},
        {false, c.constant_b, c.constant_bias}, "MatMulF32Dnnl");
  }
}

// ---------------------------------------------------------------- the fused MatMul's schema

TEST(FusionPatterns, MatMulThirdInputNeedsBiasAttribute) {
  auto compile = [](bool with_attr, const Shape& bias_shape) {
    GraphBuilder b("matmul3", 13);
    auto x = b.Input("x", DType::kF32, {3, 13});
    AttributeMap attrs;
    if (with_attr) attrs["_bias"] = Attribute::Int(1);
    auto y = b.Op("MatMul", {x, b.Constant(RandomTensor({13, 7}, 1)), b.Constant(RandomTensor(bias_shape, 2))}, attrs);
    b.Output(y, "y");
    return Compile(b.Finish(), {{DType::kF32, {3, 13}}});
  };
  EXPECT_NO_THROW(compile(true, {7}));
  for (auto [attr, shape] : {std::pair<bool, Shape>{false, {7}}, {true, {3, 7}}, {true, {5}}}) {
    try {
      compile(attr, shape);
      ADD_FAILURE() << "expected kInvalidArgument for bias " << ShapeToString(shape) << (attr ? " with" : " without")
                    << " _bias";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
      EXPECT_NE(std::string(e.what()).find("bias"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace osprey

namespace osprey {
namespace {

// ReduceMean over every spatial axis keeping dims => GlobalAveragePool (attribute or opset-18 input axes, negative or
// unordered); other axes, dropped dims and an empty reduction stay ReduceMean. Values against the unfused oracle.
TEST(FusionPatterns, SpatialMeanBecomesGlobalAveragePool) {
  struct Case {
    int opset;
    std::vector<int64_t> axes;
    int64_t keepdims;
    Shape x;
    bool rewritten;
  };
  const Case cases[] = {{13, {2, 3}, 1, {2, 6, 5, 7}, true},     {13, {-1, -2}, 1, {2, 6, 5, 7}, true},
                        {18, {3, 2}, 1, {2, 6, 5, 7}, true},     {13, {2}, 1, {3, 4, 9}, true},
                        {13, {2, 3}, 0, {2, 6, 5, 7}, false},    {13, {1, 2, 3}, 1, {2, 6, 5, 7}, false},
                        {13, {3}, 1, {2, 6, 5, 7}, false},       {18, {2, 3, 4}, 1, {1, 3, 4, 5, 6}, true}};
  for (const Case& c : cases) {
    SCOPED_TRACE("opset " + std::to_string(c.opset) + ", axes of " + std::to_string(c.axes.size()) + ", keepdims " +
                 std::to_string(c.keepdims) + ", rank " + std::to_string(c.x.size()));
    GraphBuilder b("mean", c.opset);
    auto x = b.Input("x", DType::kF32, c.x);
    AttributeMap attrs{{"keepdims", Attribute::Int(c.keepdims)}};
    std::vector<ValueRef> in{x};
    if (c.opset >= 18)
      in.push_back(b.Constant(Tensor::FromVector<int64_t>({static_cast<int64_t>(c.axes.size())}, c.axes)));
    else
      attrs["axes"] = Attribute::Ints(c.axes);
    b.Output(b.Op("ReduceMean", in, attrs), "y");
    const Graph g = b.Finish();
    const Tensor input = RandomTensor(c.x, 5, -3.f, 4.f);
    const Tensor expected = Compile(g, {{DType::kF32, c.x}}, kOracle)->Run({input})[0];
    for (bool fast : {false, true}) {
      std::vector<OpProfile> profile;
      const Tensor got = Compile(g, {{DType::kF32, c.x}}, CompileOptions{.num_threads = 2, .fast_kernels = fast,
                                                                          .fuse = true})
                             ->Run({input}, &profile)[0];
      ASSERT_EQ(profile.size(), 1u);
      EXPECT_EQ(profile[0].op_type, c.rewritten ? "GlobalAveragePool" : "ReduceMean");
      ASSERT_EQ(got.shape(), expected.shape());
      ExpectTensorNear(got, expected, 1e-5f, 1e-6f);
    }
  }
}

}  // namespace
}  // namespace osprey
