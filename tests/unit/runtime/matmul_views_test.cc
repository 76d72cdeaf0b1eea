// The attention products read their operands through the Slices, Reshapes and Transposes that made them and write
// through the Transpose after them: one _MatMulViews node each (ops/matmul_views.h, runtime/fusion.cc
// FuseMatMulViews), the scale 1 / sqrt(d) folded in. Oracle: the same graph compiled without fusion and with
// reference kernels only; the fused node's shape rule, reference kernel and oneDNN kernel are checked on their own
// too, and the view arithmetic against hand-computed strides.
#include "ops/matmul_views.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "fusion_test_util.h"
#include "ops/op_cost.h"
#include "osprey/runtime.h"
#include "test_util.h"

namespace osprey {
namespace {

using testing::ExpectTensorNear;
using testing::kFast;
using testing::kOracle;
using testing::RandomTensor;

Tensor I64s(const std::vector<int64_t>& v) { return Tensor::FromVector<int64_t>({static_cast<int64_t>(v.size())}, v); }

// torchvision's multi-head attention at batch 1 as it exports it (ViT-B/16 with T tokens, H heads of D): qkv =
// MatMul(x, W) + b [T, 3HD]; q, k, v = Slices of its last axis, each Reshaped [T, H, D]; q and v Transposed (1, 0, 2),
// q divided by sqrt(D), k Transposed (1, 2, 0); Softmax(q k) v [H, T, D] Transposed (1, 0, 2) and Reshaped [T, HD].
// `escape`: q's slice is a graph output too (its chain then stays).
Graph AttentionGraph(int64_t t, int64_t h, int64_t d, bool escape = false) {
  GraphBuilder b("attention", 13);
  const int64_t e = h * d;
  auto x = b.Input("x", DType::kF32, {t, e});
  auto qkv = b.Op("Add", {b.Op("MatMul", {x, b.Constant(RandomTensor({e, 3 * e}, 2, -0.3f, 0.3f))}),
                          b.Constant(RandomTensor({3 * e}, 3))});
  auto part = [&](int64_t i) {
    auto s = b.Op("Slice", {qkv, b.Constant(I64s({i * e})), b.Constant(I64s({(i + 1) * e})), b.Constant(I64s({1}))});
    return std::make_pair(s, b.Op("Reshape", {s, b.Constant(I64s({t, h, d}))}));
  };
  auto [q_slice, q] = part(0);
  auto [k_slice, k] = part(1);
  auto [v_slice, v] = part(2);
  if (escape) b.Output(q_slice, "q");
  auto qt = b.Op("Div", {b.Op("Transpose", {q}, {{"perm", Attribute::Ints({1, 0, 2})}}),
                         b.Constant(Tensor::Scalar<float>(std::sqrt(static_cast<float>(d))))});
  auto kt = b.Op("Transpose", {k}, {{"perm", Attribute::Ints({1, 2, 0})}});
  auto vt = b.Op("Transpose", {v}, {{"perm", Attribute::Ints({1, 0, 2})}});
  auto probs = b.Op("Softmax", {b.Op("MatMul", {qt, kt})}, {{"axis", Attribute::Int(-1)}});
  auto context = b.Op("Transpose", {b.Op("MatMul", {probs, vt})}, {{"perm", Attribute::Ints({1, 0, 2})}});
  b.Output(b.Op("Reshape", {context, b.Constant(I64s({t, e}))}), "y");
  return b.Finish();
}

std::vector<std::string> OpsRun(const Graph& g, const Shape& input, const CompileOptions& options,
                                std::vector<Tensor>* out) {
  std::vector<OpProfile> profile;
  *out = Compile(g, {{DType::kF32, input}}, options)->Run({RandomTensor(input, 1)}, &profile);
  std::vector<std::string> ops;
  for (const OpProfile& p : profile) ops.push_back(p.op_type);
  return ops;
}

// Whether this CPU's fast kernels take an _AttentionViews node (attention_kernel.cc: AVX-512, or AVX2 with FMA): where
// they do, the two products and the Softmax become one node; elsewhere the products stay _MatMulViews.
bool AttentionKernelHere() {
  return __builtin_cpu_supports("avx512f") || (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"));
}

// The attention kernel's instruction sets to test on this CPU: its own choice, and AVX2 where it chose AVX-512.
std::vector<std::string> AttentionIsas() {
  if (__builtin_cpu_supports("avx512f")) return {"", "avx2"};
  return {""};
}

// Sets OSPREY_ATTENTION_ISA (attention_kernel.cc) for its lifetime; "" leaves the kernel its own choice.
class AttentionIsa {
 public:
  explicit AttentionIsa(const std::string& isa) {
    if (!isa.empty()) setenv("OSPREY_ATTENTION_ISA", isa.c_str(), 1);
  }
  ~AttentionIsa() { unsetenv("OSPREY_ATTENTION_ISA"); }
};

TEST(MatMulViews, AttentionProductsReadTheirOperandsInPlace) {
  for (const char* fuse_attention : {"1", "0"})
    for (bool fast : {true, false}) {
      SCOPED_TRACE(std::string(fast ? "fast kernels" : "reference kernels") +
                   ", OSPREY_FUSE_ATTENTION=" + fuse_attention);
      setenv("OSPREY_FUSE_ATTENTION", fuse_attention, 1);
      const Graph g = AttentionGraph(13, 3, 8);
      std::vector<Tensor> want, got;
      OpsRun(g, {13, 24}, kOracle, &want);
      const std::vector<std::string> ops =
          OpsRun(g, {13, 24}, CompileOptions{.num_threads = 2, .fast_kernels = fast, .fuse = true}, &got);
      unsetenv("OSPREY_FUSE_ATTENTION");
      ExpectTensorNear(got[0], want[0], 1e-5f, 1e-5f);
      if (!fast) continue;  // the passes run for the CPU's fast kernels only
      const bool fused = AttentionKernelHere() && std::string(fuse_attention) == "1";
      EXPECT_EQ(std::count(ops.begin(), ops.end(), "_MatMulViews"), fused ? 0 : 2);
      EXPECT_EQ(std::count(ops.begin(), ops.end(), "_AttentionViews"), fused ? 1 : 0);
      EXPECT_EQ(std::count(ops.begin(), ops.end(), "Softmax"), fused ? 0 : 1);
      for (const char* gone : {"Slice", "Transpose", "Div"})
        EXPECT_EQ(std::count(ops.begin(), ops.end(), gone), 0) << gone;
    }
}

// The attention kernel's edges: keys not a multiple of 16 (a masked tail), context rows of 24 and 80 floats (a masked
// last vector; two groups of vectors), query rows not a multiple of its 6-row blocks over several 48-row tasks, heads
// of ViT-B/16's size; against the unfused graph on reference kernels.
TEST(AttentionViews, MatchesTheUnfusedGraph) {
  struct Case {
    int64_t t, h, d;
  };
  for (const std::string& isa : AttentionIsas())
    for (const Case& c : {Case{13, 3, 8}, Case{40, 2, 24}, Case{101, 1, 80}, Case{197, 2, 64}, Case{9, 1, 4},
                          Case{50, 9, 8}}) {  // (9 heads: whole heads per task on 2 threads)
      SCOPED_TRACE("T " + std::to_string(c.t) + ", H " + std::to_string(c.h) + ", D " + std::to_string(c.d) + " " +
                   isa);
      const AttentionIsa use(isa);
      const Graph g = AttentionGraph(c.t, c.h, c.d);
      std::vector<Tensor> want, got;
      OpsRun(g, {c.t, c.h * c.d}, kOracle, &want);
      const std::vector<std::string> ops = OpsRun(g, {c.t, c.h * c.d}, kFast, &got);
      ExpectTensorNear(got[0], want[0], 1e-5f, 1e-5f);
      EXPECT_EQ(std::count(ops.begin(), ops.end(), "_AttentionViews"), AttentionKernelHere() ? 1 : 0);
    }
}

// softmax(scale q k) v of whole operands, q and v with two batch entries and k^T broadcast over them (or only v with
// three), the output transposed: as plain ops, and as the one _AttentionViews node such a graph may carry, on both
// kernels.
void ExpectAttentionMatchesPlainOps(const Shape& qs, const Shape& ks, const Shape& vs, const std::string& out_shape) {
  const Tensor q = RandomTensor(qs, 7), k = RandomTensor(ks, 8), v = RandomTensor(vs, 9);
  GraphBuilder p("plain", 13);
  auto scores = p.Op("Mul", {p.Op("MatMul", {p.Input("q", DType::kF32, qs), p.Input("k", DType::kF32, ks)}),
                             p.Constant(Tensor::Scalar<float>(0.7f))});
  auto context =
      p.Op("MatMul", {p.Op("Softmax", {scores}, {{"axis", Attribute::Int(2)}}), p.Input("v", DType::kF32, vs)});
  p.Output(p.Op("Transpose", {context}, {{"perm", Attribute::Ints({1, 0, 2})}}), "y");
  const Graph plain = p.Finish();
  const std::vector<TensorSpec> specs{{DType::kF32, qs}, {DType::kF32, ks}, {DType::kF32, vs}};
  const Tensor want = Compile(plain, specs, kOracle)->Run({q, k, v})[0];
  ASSERT_EQ(ShapeToString(want.shape()), out_shape);

  GraphBuilder b("fused", 13);
  Node attrs;
  WriteView(attrs, "q", DenseView(qs));
  WriteView(attrs, "k", DenseView(ks));
  WriteView(attrs, "v", DenseView(vs));
  attrs.attrs["scale"] = Attribute::Float(0.7f);
  attrs.attrs["out_perm"] = Attribute::Ints({1, 0, 2});
  b.Output(
      b.Op(kAttentionViewsOp,
           {b.Input("q", DType::kF32, qs), b.Input("k", DType::kF32, ks), b.Input("v", DType::kF32, vs)}, attrs.attrs),
      "y");
  const Graph fused = b.Finish();
  for (const std::string& isa : AttentionIsas())
    for (bool fast : {false, true}) {
      SCOPED_TRACE(std::string(fast ? "fast kernels " : "reference kernel ") + isa);
      const AttentionIsa use(isa);
      std::vector<OpProfile> profile;
      const Tensor got = Compile(fused, specs, CompileOptions{.num_threads = 2, .fast_kernels = fast, .fuse = false})
                             ->Run({q, k, v}, &profile)[0];
      ExpectTensorNear(got, want, 1e-5f, 1e-5f);
      ASSERT_EQ(profile.size(), 1u);
      if (fast && AttentionKernelHere()) {
        EXPECT_EQ(profile[0].kernel, "AttentionF32");
      }
    }
  // The plain graph fuses (plain MatMuls, the Mul of the scores folded in) where the kernel takes it.
  std::vector<OpProfile> profile;
  const Tensor got = Compile(plain, specs, kFast)->Run({q, k, v}, &profile)[0];
  ExpectTensorNear(got, want, 1e-5f, 1e-5f);
  int fused_steps = 0;
  for (const OpProfile& step : profile) fused_steps += step.op_type == "_AttentionViews";
  EXPECT_EQ(fused_steps, AttentionKernelHere() ? 1 : 0);
}

TEST(AttentionViews, BroadcastScaleAndOutputPermutation) {
  ExpectAttentionMatchesPlainOps({2, 9, 5}, {1, 5, 21}, {2, 21, 18}, "[9, 2, 18]");
  ExpectAttentionMatchesPlainOps({1, 9, 5}, {1, 5, 21}, {3, 21, 18}, "[9, 3, 18]");
}

// Terms added to the scores before the softmax become the node's bias: a constant relative-position bias [H, M, T],
// a key mask computed at run time [B, 1, 1, T], and Swin's shifted windows (the scores Reshaped [B, W, H, M, T], a
// constant [1, W, 1, M, T] mask added, Reshaped back) summed with its bias into one constant. Against the unfused
// graph on reference kernels.
TEST(AttentionViews, AddedTermsBecomeTheBias) {
  // kFullShape: a term as large as the scores, added straight to the product (no scale): the residual fusion takes it
  // into the MatMul first (Swin's last stage, one window), and the attention from there.
  enum Kind { kConstant, kRuntimeMask, kShiftedWindows, kFullShape };
  for (const std::string& isa : AttentionIsas())
    for (Kind kind : {kConstant, kRuntimeMask, kShiftedWindows, kFullShape}) {
      SCOPED_TRACE("kind " + std::to_string(kind) + " " + isa);
      const AttentionIsa use(isa);
      const int64_t b = 4, h = 3, m = 10, t = 10, d = 8, windows = 2;
      const Shape qs{b, h, m, d}, ks{b, h, d, t}, vs{b, h, t, d};
      GraphBuilder g("terms", 13);
      auto q = g.Input("q", DType::kF32, qs), k = g.Input("k", DType::kF32, ks), v = g.Input("v", DType::kF32, vs);
      auto scores = kind == kFullShape
                        ? g.Op("MatMul", {q, k})
                        : g.Op("Mul", {g.Op("MatMul", {q, k}), g.Constant(Tensor::Scalar<float>(0.35f))});
      std::vector<TensorSpec> specs{{DType::kF32, qs}, {DType::kF32, ks}, {DType::kF32, vs}};
      std::vector<Tensor> inputs{RandomTensor(qs, 1), RandomTensor(ks, 2), RandomTensor(vs, 3)};
      if (kind == kRuntimeMask) {
        const Shape mask{b, 1, 1, t};
        scores = g.Op("Add", {scores, g.Input("mask", DType::kF32, mask)});
        specs.push_back({DType::kF32, mask});
        inputs.push_back(RandomTensor(mask, 4, -3.f, 0.f));
      } else {
        scores =
            g.Op("Add", {scores, g.Constant(RandomTensor(kind == kFullShape ? Shape{b, h, m, t} : Shape{h, m, t}, 5))});
      }
      if (kind == kShiftedWindows) {
        auto split = g.Op("Reshape", {scores, g.Constant(I64s({b / windows, windows, h, m, t}))});
        auto masked = g.Op("Add", {split, g.Constant(RandomTensor({1, windows, 1, m, t}, 6, -100.f, 0.f))});
        scores = g.Op("Reshape", {masked, g.Constant(I64s({b, h, m, t}))});
      }
      auto probs = g.Op("Softmax", {scores}, {{"axis", Attribute::Int(-1)}});
      g.Output(g.Op("MatMul", {probs, v}), "y");
      const Graph graph = g.Finish();
      const Tensor want = Compile(graph, specs, kOracle)->Run(inputs)[0];
      std::vector<OpProfile> profile;
      const Tensor got = Compile(graph, specs, kFast)->Run(inputs, &profile)[0];
      ExpectTensorNear(got, want, 1e-5f, 1e-5f);
      std::vector<std::string> ops;
      for (const OpProfile& step : profile) ops.push_back(step.op_type);
      EXPECT_EQ(std::count(ops.begin(), ops.end(), "_AttentionViews"), AttentionKernelHere() ? 1 : 0);
      if (AttentionKernelHere()) {
        for (const char* gone : {"Add", "Reshape", "Softmax", "Mul"})
          EXPECT_EQ(std::count(ops.begin(), ops.end(), gone), 0) << gone;
      }
    }
}

// A Softmax over another axis, or whose probabilities are read elsewhere too, is not an attention: nothing fuses.
TEST(AttentionViews, OtherSoftmaxesStay) {
  for (bool escape : {false, true}) {
    SCOPED_TRACE(escape ? "probabilities read elsewhere" : "softmax over axis 1");
    const Shape qs{2, 6, 4}, ks{2, 4, 6}, vs{2, 6, 3};
    GraphBuilder p("plain", 13);
    auto probs = p.Op("Softmax", {p.Op("MatMul", {p.Input("q", DType::kF32, qs), p.Input("k", DType::kF32, ks)})},
                      {{"axis", Attribute::Int(escape ? -1 : 1)}});
    p.Output(p.Op("MatMul", {probs, p.Input("v", DType::kF32, vs)}), "y");
    if (escape) p.Output(probs, "probs");
    const Graph g = p.Finish();
    const std::vector<TensorSpec> specs{{DType::kF32, qs}, {DType::kF32, ks}, {DType::kF32, vs}};
    const std::vector<Tensor> inputs{RandomTensor(qs, 1), RandomTensor(ks, 2), RandomTensor(vs, 3)};
    const std::vector<Tensor> want = Compile(g, specs, kOracle)->Run(inputs);
    std::vector<OpProfile> profile;
    const std::vector<Tensor> got = Compile(g, specs, kFast)->Run(inputs, &profile);
    for (size_t i = 0; i < want.size(); ++i) ExpectTensorNear(got[i], want[i], 1e-5f, 1e-5f);
    for (const OpProfile& step : profile) EXPECT_NE(step.op_type, "_AttentionViews");
  }
}

TEST(AttentionViews, ShapeRuleRejectsMalformedNodes) {
  auto graph = [](const StridedView& q, const StridedView& k, const StridedView& v,
                  const std::vector<int64_t>& perm = {}) {
    GraphBuilder b("fused", 13);
    Node attrs;
    WriteView(attrs, "q", q);
    WriteView(attrs, "k", k);
    WriteView(attrs, "v", v);
    if (!perm.empty()) attrs.attrs["out_perm"] = Attribute::Ints(perm);
    b.Output(b.Op(kAttentionViewsOp,
                  {b.Input("x", DType::kF32, {8, 24}), b.Input("x2", DType::kF32, {8, 24}),
                   b.Input("x3", DType::kF32, {8, 24})},
                  attrs.attrs),
             "y");
    return b.Finish();
  };
  const std::vector<TensorSpec> specs(3, TensorSpec{DType::kF32, {8, 24}});
  // Two heads of 4 over 8 tokens of a [8, 24] qkv: q at column 0, k at 8, v at 16.
  const StridedView q{0, {2, 8, 4}, {4, 24, 1}}, k{8, {2, 4, 8}, {4, 1, 24}}, v{16, {2, 8, 4}, {4, 24, 1}};
  EXPECT_NO_THROW(Compile(graph(q, k, v), specs, kOracle));
  testing::ExpectCompileError(graph(q, {8, {2, 3, 8}, {4, 1, 24}}, v), specs, "inner dimensions do not match: q_dims");
  testing::ExpectCompileError(graph(q, k, {16, {2, 7, 4}, {4, 24, 1}}), specs,
                              "inner dimensions do not match: scores (q k)");
  testing::ExpectCompileError(graph(q, k, {16, {8, 4}, {24, 1}}), specs, "as many as the other operand's");
  testing::ExpectCompileError(graph(q, k, {20, {2, 8, 4}, {4, 24, 1}}), specs, "stay inside input 2");
  testing::ExpectCompileError(graph(q, k, v, {0, 0, 1}), specs, "out_perm should be a permutation");
  {  // a bias that does not broadcast to the [2, 8, 8] scores
    GraphBuilder b("bias", 13);
    Node attrs;
    WriteView(attrs, "q", q);
    WriteView(attrs, "k", k);
    WriteView(attrs, "v", v);
    b.Output(b.Op(kAttentionViewsOp,
                  {b.Input("x", DType::kF32, {8, 24}), b.Input("x2", DType::kF32, {8, 24}),
                   b.Input("x3", DType::kF32, {8, 24}), b.Input("bias", DType::kF32, {3, 8})},
                  attrs.attrs),
             "y");
    std::vector<TensorSpec> with_bias = specs;
    with_bias.push_back({DType::kF32, {3, 8}});
    testing::ExpectCompileError(b.Finish(), with_bias, "input 3 (bias) should be float32 and broadcast");
  }
  testing::ExpectCompileError(graph(q, {8, {2, 4, 8}, {0, 1, 24}}, v), specs, "repeat elements");
  // Work its output does not bound: 2^21 query rows of depth 1 over 2^21 keys, one context element each, from
  // 2^21-element inputs: 2^43 multiply-adds for an 8 MiB output.
  {
    const int64_t n = int64_t{1} << 21;
    GraphBuilder b("huge", 13);
    Node attrs;
    WriteView(attrs, "q", {0, {n, 1}, {1, 1}});
    WriteView(attrs, "k", {0, {1, n}, {1, 1}});
    WriteView(attrs, "v", {0, {n, 1}, {1, 1}});
    b.Output(b.Op(kAttentionViewsOp,
                  {b.Input("q", DType::kF32, {n}), b.Input("k", DType::kF32, {n}), b.Input("v", DType::kF32, {n})},
                  attrs.attrs),
             "y");
    testing::ExpectCompileError(b.Finish(), std::vector<TensorSpec>(3, TensorSpec{DType::kF32, {n}}),
                                "multiply-adds, the limit of one node");
  }
}

// Its work is both products: ViT-B/16's 12 heads of 197 x 197 scores over 64, then 197 x 64 outputs over 197.
TEST(AttentionViews, WorkCountsBothProducts) {
  Node node;
  node.op_type = kAttentionViewsOp;
  WriteView(node, "q", {0, {12, 197, 64}, {64, 2304, 1}});
  WriteView(node, "k", {768, {12, 64, 197}, {64, 1, 2304}});
  WriteView(node, "v", {1536, {12, 197, 64}, {64, 2304, 1}});
  EXPECT_EQ(EstimatedWork(node, {{197, 2304}, {197, 2304}, {197, 2304}}, {{197, 12, 64}}),
            int64_t{2} * 12 * 197 * 197 * (64 + 64));
}

// Small fused products are candidates for one thread like small MatMuls (step_threads.cc): OSPREY_STEP_THREADS=1 puts
// every candidate on one thread untimed, the QKV projection and both attention products (the graph's three products),
// or the one attention node that takes them.
TEST(MatMulViews, SmallProductsMayRunOnOneThread) {
  setenv("OSPREY_STEP_THREADS", "1", 1);
  auto plan = Compile(AttentionGraph(13, 3, 8), {{DType::kF32, {13, 24}}}, kFast);
  unsetenv("OSPREY_STEP_THREADS");
  if (plan->num_single_thread_steps() == 0) GTEST_SKIP() << "OSPREY_TUNE=0: no per-step thread choice";
  EXPECT_EQ(plan->num_single_thread_steps(), AttentionKernelHere() ? 2u : 3u);  // the two products fused, or not
}

// Its work is its products (2 x output elements x K), not its operands' sizes: ViT's q k^T is 12 x 197 x 197 outputs
// of 64 products each, from views of the [197, 2304] qkv (what decides the one-thread candidates above).
TEST(MatMulViews, WorkCountsEveryProduct) {
  Node node;
  node.op_type = kMatMulViewsOp;
  WriteView(node, "a", {0, {12, 197, 64}, {64, 2304, 1}});
  WriteView(node, "b", {768, {12, 64, 197}, {64, 1, 2304}});
  EXPECT_EQ(EstimatedWork(node, {{197, 2304}, {197, 2304}}, {{12, 197, 197}}), int64_t{2} * 12 * 197 * 197 * 64);
}

TEST(MatMulViews, AValueReadElsewhereKeepsItsChain) {
  const Graph g = AttentionGraph(9, 2, 16, /*escape=*/true);
  std::vector<Tensor> want, got;
  OpsRun(g, {9, 32}, kOracle, &want);
  const std::vector<std::string> ops = OpsRun(g, {9, 32}, kFast, &got);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) ExpectTensorNear(got[i], want[i], 1e-5f, 1e-5f);
  // q's Reshape, Transpose and Div are read by the product alone and go into it; its Slice stays (a graph output).
  EXPECT_EQ(std::count(ops.begin(), ops.end(), "Slice"), 1);
  EXPECT_EQ(std::count(ops.begin(), ops.end(), "_MatMulViews"), AttentionKernelHere() ? 0 : 2);
  EXPECT_EQ(std::count(ops.begin(), ops.end(), "_AttentionViews"), AttentionKernelHere() ? 1 : 0);
}

// The fused node as a graph may carry it: operands viewed with a broadcast batch axis, a transposed B, the output
// permuted and scaled; the oneDNN kernel against the reference kernel and against the plain ops it stands for.
TEST(MatMulViews, FusedNodeMatchesThePlainOps) {
  const Tensor a_src = RandomTensor({4, 30}, 5), b_src = RandomTensor({2, 7, 10}, 6);
  // a: [1, 4, 10] = a_src[:, 10:20] (offset 10, strides 0, 30, 1); b: [2, 10, 7] = b_src transposed (0, 2, 1).
  GraphBuilder b("views", 13);
  auto a_in = b.Input("a", DType::kF32, {4, 30});
  auto b_in = b.Input("b", DType::kF32, {2, 7, 10});
  Node dummy;
  WriteView(dummy, "a", {10, {1, 4, 10}, {0, 30, 1}});
  WriteView(dummy, "b", {0, {2, 10, 7}, {70, 1, 10}});
  AttributeMap attrs = dummy.attrs;
  attrs["scale"] = Attribute::Float(0.5f);
  attrs["out_perm"] = Attribute::Ints({1, 0, 2});  // product [2, 4, 7] -> [4, 2, 7]
  b.Output(b.Op(kMatMulViewsOp, {a_in, b_in}, attrs), "y");
  const Graph fused = b.Finish();

  GraphBuilder p("plain", 13);
  auto pa = p.Input("a", DType::kF32, {4, 30});
  auto pb = p.Input("b", DType::kF32, {2, 7, 10});
  auto a_view =
      p.Op("Unsqueeze", {p.Op("Slice", {pa, p.Constant(I64s({10})), p.Constant(I64s({20})), p.Constant(I64s({1}))}),
                         p.Constant(I64s({0}))});
  auto b_view = p.Op("Transpose", {pb}, {{"perm", Attribute::Ints({0, 2, 1})}});
  auto prod = p.Op("Mul", {p.Op("MatMul", {a_view, b_view}), p.Constant(Tensor::Scalar<float>(0.5f))});
  p.Output(p.Op("Transpose", {prod}, {{"perm", Attribute::Ints({1, 0, 2})}}), "y");

  const std::vector<TensorSpec> specs{{DType::kF32, {4, 30}}, {DType::kF32, {2, 7, 10}}};
  const Tensor want = Compile(p.Finish(), specs, kOracle)->Run({a_src, b_src})[0];
  EXPECT_EQ(ShapeToString(want.shape()), "[4, 2, 7]");
  for (bool fast : {false, true}) {
    SCOPED_TRACE(fast ? "oneDNN kernel" : "reference kernel");
    std::vector<OpProfile> profile;
    const Tensor got = Compile(fused, specs, CompileOptions{.num_threads = 2, .fast_kernels = fast, .fuse = false})
                           ->Run({a_src, b_src}, &profile)[0];
    ExpectTensorNear(got, want, 1e-5f, 1e-5f);
    ASSERT_EQ(profile.size(), 1u);
    if (fast) {
      EXPECT_EQ(profile[0].kernel, "MatMulF32Dnnl");
    }
  }
}

TEST(MatMulViews, ShapeRuleRejectsMalformedNodes) {
  auto graph = [](const StridedView& a, const StridedView& bv, const std::vector<int64_t>& perm = {}) {
    GraphBuilder b("fused", 13);
    Node dummy;
    WriteView(dummy, "a", a);
    WriteView(dummy, "b", bv);
    if (!perm.empty()) dummy.attrs["out_perm"] = Attribute::Ints(perm);
    b.Output(b.Op(kMatMulViewsOp, {b.Input("a", DType::kF32, {4, 6}), b.Input("b", DType::kF32, {6, 5})}, dummy.attrs),
             "y");
    return b.Finish();
  };
  const std::vector<TensorSpec> specs{{DType::kF32, {4, 6}}, {DType::kF32, {6, 5}}};
  const StridedView a{0, {4, 6}, {6, 1}}, b{0, {6, 5}, {5, 1}};
  EXPECT_NO_THROW(Compile(graph(a, b), specs, kOracle));
  testing::ExpectCompileError(graph({1, {4, 6}, {6, 1}}, b), specs, "stay inside input 0 of shape [4, 6]");
  testing::ExpectCompileError(graph(a, {0, {6, 5}, {6, 1}}), specs, "stay inside input 1");
  testing::ExpectCompileError(graph(a, {0, {6, 5}, {-1, 1}}), specs, "strides >= 0");
  testing::ExpectCompileError(graph(a, {0, {6, 5}, {int64_t{1} << 62, 1}}), specs, "stay inside input 1");
  testing::ExpectCompileError(graph({0, {4, 6}, {6}}, b), specs, "one entry per axis");
  testing::ExpectCompileError(graph({0, {24}, {1}}, b), specs, "one entry per axis");
  testing::ExpectCompileError(graph(a, {0, {5, 5}, {5, 1}}), specs, "inner dimensions do not match");
  testing::ExpectCompileError(graph(a, b, {0, 0}), specs, "out_perm should be a permutation");
  // Views that repeat elements would let a small input stand for a huge product: K = 2^40 from one element, and a
  // [5, 6] view (30 elements) of 10 overlapping ones of a 24-element input.
  testing::ExpectCompileError(graph({0, {1, int64_t{1} << 40}, {0, 0}}, {0, {int64_t{1} << 40, 1}, {0, 0}}), specs,
                              "repeat elements");
  testing::ExpectCompileError(graph({0, {5, 6}, {1, 1}}, b), specs, "at most the 24 elements of input 0");
  testing::ExpectCompileError(graph({0, {4, 6}, {0, 1}}, b), specs, "a stride of 0 only on axes of extent 1");
}

TEST(MatMulViews, ViewArithmetic) {
  // [4, 6] -> Slice rows 1:3, columns 2:5 -> [2, 3] at offset 8, strides 6, 1.
  StridedView v = SlicedView(DenseView({4, 6}), {1, 2}, {2, 3});
  EXPECT_EQ(v.offset, 8);
  EXPECT_EQ(v.strides, (std::vector<int64_t>{6, 1}));
  // Splitting an axis gives strides inside its run: [2, 3] -> [2, 3, 1] and [2, 1, 3].
  StridedView r;
  ASSERT_TRUE(ReshapeView(v, {2, 3, 1}, &r));
  EXPECT_EQ(r.strides[0], 6);
  EXPECT_EQ(r.strides[1], 1);
  // Merging the two axes of a strided (non-contiguous) view is not a view.
  EXPECT_FALSE(ReshapeView(v, {6}, &r));
  // A dense [12, 4] reshaped [3, 4, 4], transposed (1, 0, 2), merged back: not a view; split again: strides.
  StridedView t = TransposedView(DenseView({3, 4, 4}), {1, 0, 2});
  EXPECT_EQ(t.strides, (std::vector<int64_t>{4, 16, 1}));
  EXPECT_FALSE(ReshapeView(t, {4, 12}, &r));
  ASSERT_TRUE(ReshapeView(t, {2, 2, 3, 2, 2}, &r));
  EXPECT_EQ(r.strides, (std::vector<int64_t>{8, 4, 16, 2, 1}));
}

}  // namespace
}  // namespace osprey
