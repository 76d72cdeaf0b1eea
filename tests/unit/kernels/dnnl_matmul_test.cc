// oneDNN MatMul and Gemm kernels. Oracle: the reference MatMul / Gemm kernels, run on the same node and inputs.
#include "kernel_test_util.h"
#include "kernels/cpu/dnnl_common.h"

namespace osprey::testing {
namespace {

void ExpectMatMul(const Shape& a, const Shape& b, bool constant_b, AttributeMap attrs = {},
                  const std::string& name = "MatMulF32Dnnl") {
  SCOPED_TRACE(ShapeToString(a) + " x " + ShapeToString(b) + (constant_b ? " (constant B)" : ""));
  Node node = MakeNode("MatMul", 2, 1, std::move(attrs));
  ExpectFastMatchesReference(node, {RandomTensor(a, 1), RandomTensor(b, 2)}, {false, constant_b}, name);
}

// One row times a constant matrix runs GemvF32 where the CPU has AVX-512 (gemv_kernel.cc), oneDNN elsewhere.
std::string OneRowKernel(const std::string& otherwise) {
  return __builtin_cpu_supports("avx512f") ? "GemvF32" : otherwise;
}

// A MatMul's tuning key holds the operands' sizes by class where they vary with the input (tokens, widths), exactly
// where they are a constant weight's, and their layouts exactly.
TEST(DnnlMatMul, TuningKeysHoldSizesByClass) {
  using cpu::TuningDims;
  using cpu::TuningOperandKey;
  using dnnl::memory;
  const auto plain = [](memory::dims dims) {
    return memory::desc(dims, memory::data_type::f32,
                        dims.size() == 3 ? memory::format_tag::abc : memory::format_tag::ab);
  };
  // 197 and 230 tokens: class 192; 260: class 256. K exact.
  EXPECT_EQ(TuningOperandKey(plain({197, 768}), TuningDims::kRowsByClass),
            TuningOperandKey(plain({230, 768}), TuningDims::kRowsByClass));
  EXPECT_NE(TuningOperandKey(plain({197, 768}), TuningDims::kRowsByClass),
            TuningOperandKey(plain({260, 768}), TuningDims::kRowsByClass));
  EXPECT_NE(TuningOperandKey(plain({197, 768}), TuningDims::kRowsByClass),
            TuningOperandKey(plain({197, 769}), TuningDims::kRowsByClass));
  EXPECT_EQ(TuningOperandKey(plain({2, 100, 64}), TuningDims::kRowsByClass),
            TuningOperandKey(plain({1, 200, 64}), TuningDims::kRowsByClass));  // rows are batch x tokens
  // Attention's operands: every dim by class; a constant weight's exactly.
  EXPECT_EQ(TuningOperandKey(plain({12, 64, 197}), TuningDims::kAllByClass),
            TuningOperandKey(plain({12, 64, 220}), TuningDims::kAllByClass));
  EXPECT_NE(TuningOperandKey(plain({768, 2304}), TuningDims::kExact),
            TuningOperandKey(plain({768, 2305}), TuningDims::kExact));
  // Layouts: a transposed operand, padded rows and oneDNN's choice ("any") are not the same key.
  const memory::desc rows(memory::dims{64, 256}, memory::data_type::f32, memory::format_tag::ab);
  const memory::desc columns(memory::dims{64, 256}, memory::data_type::f32, memory::format_tag::ba);
  const memory::desc padded(memory::dims{64, 256}, memory::data_type::f32, memory::dims{272, 1});
  const memory::desc any(memory::dims{64, 256}, memory::data_type::f32, memory::format_tag::any);
  const std::vector<std::string> keys = {
      TuningOperandKey(rows, TuningDims::kExact), TuningOperandKey(columns, TuningDims::kExact),
      TuningOperandKey(padded, TuningDims::kExact), TuningOperandKey(any, TuningDims::kExact),
      TuningOperandKey(memory::desc(), TuningDims::kExact)};
  for (size_t i = 0; i < keys.size(); ++i)
    for (size_t j = i + 1; j < keys.size(); ++j) EXPECT_NE(keys[i], keys[j]) << i << " " << j;
}

TEST(DnnlMatMul, TwoDimensional) {
  ExpectMatMul({5, 13}, {13, 7}, true);
  ExpectMatMul({5, 13}, {13, 7}, false);
}

TEST(DnnlMatMul, BatchedWithBroadcastBatchDims) {
  ExpectMatMul({2, 1, 5, 13}, {3, 13, 7}, false);
  ExpectMatMul({2, 1, 5, 13}, {3, 13, 7}, true);
  ExpectMatMul({3, 5, 13}, {3, 13, 7}, false);
  ExpectMatMul({1, 5, 13}, {2, 3, 13, 7}, true);
}

TEST(DnnlMatMul, BatchedTimesOneMatrix) {
  ExpectMatMul({2, 3, 5, 13}, {13, 7}, true);
  ExpectMatMul({3, 5, 13}, {13, 7}, false);
}

TEST(DnnlMatMul, OneDimensionalOperands) {
  ExpectMatMul({13}, {3, 13, 7}, true);
  ExpectMatMul({2, 5, 13}, {13}, false);
  ExpectMatMul({13}, {13, 7}, true);
}

// A constant B with rows a multiple of 256 long is packed with padded rows (PaddedRows): the same values, in 2-D,
// batched, Gemm transB (B arrives as [N, K]) and with a fused bias.
TEST(DnnlMatMul, ConstantBWithRowsMultipleOf256) {
  ExpectMatMul({5, 33}, {33, 256}, true);
  ExpectMatMul({3, 7, 17}, {17, 512}, true);
  ExpectMatMul({2, 5, 9}, {2, 9, 256}, true);
  ExpectMatMul({1, 768}, {768, 768}, true, {}, OneRowKernel("MatMulF32Dnnl"));
  Node node = MakeNode("Gemm", 3, 1, {{"transB", Attribute::Int(1)}});
  ExpectFastMatchesReference(node, {RandomTensor({4, 40}, 3), RandomTensor({768, 40}, 4), RandomTensor({768}, 5)},
                             {false, true, true}, "GemmF32Dnnl");
  // The packed sizes the kernel asks for, with oneDNN's first choices (no timing: a choice timed under load may be
  // another implementation with another packing): 16 spare floats per row at 256 and 768, none at 255 or 1000, where
  // that implementation packs B row-major and oneDNN runs the matmul on the padded stride (as on AVX2); oneDNN's own
  // size elsewhere (blocked B on AVX-512).
  for (const auto& [n, row] :
       std::vector<std::pair<int64_t, int64_t>>{{256, 272}, {768, 784}, {255, 255}, {1000, 1000}}) {
    using dnnl::memory;
    auto make = [n = n](const memory::desc& weights) {
      return dnnl::matmul::primitive_desc(
          cpu::CpuEngine(), memory::desc({3, 9}, memory::data_type::f32, memory::format_tag::ab), weights,
          memory::desc({3, n}, memory::data_type::f32, memory::format_tag::ab), cpu::BaseAttr(), /*allow_empty=*/true);
    };
    const memory::desc first = make(memory::desc({9, n}, memory::data_type::f32, memory::format_tag::any)).weights_desc();
    const bool row_major = first.get_inner_nblks() == 0 && first.get_strides()[0] == n && first.get_strides()[1] == 1;
    const auto strided = make(memory::desc({9, n}, memory::data_type::f32, memory::dims{row, 1}));
    const bool padded = row != n && row_major && strided && !cpu::IsReferenceImpl(strided);
    const size_t want = padded ? static_cast<size_t>(9 * row * 4) : first.get_size();
    const Node mm = MakeNode("MatMul", 2, 1, {});
    const std::vector<Tensor> in{RandomTensor({3, 9}, 1), RandomTensor({9, n}, 2)};
    std::vector<Tensor> outputs;
    KernelBuildContext bc = MakeBuildContext(mm, in, {false, true}, outputs);
    bc.tune = false;
    size_t asked = 0;
    bc.derive_weight = [&](const Tensor&, const std::string&, size_t bytes, const std::function<void(void*)>& fill) {
      asked = bytes;
      std::shared_ptr<Buffer> b = Allocator::Host().Allocate(bytes);
      fill(b->data());
      return b;
    };
    ASSERT_NE(CreateCpuKernel(bc), nullptr);
    EXPECT_EQ(asked, want) << "N = " << n << (row_major ? ", B row-major" : ", B blocked");
  }
}

TEST(DnnlMatMul, FusedActivation) {
  ExpectMatMul({3, 5, 13}, {13, 7}, true, {{"_activation", Attribute::String("Gelu")}});
  ExpectMatMul({5, 13}, {13, 7}, false, {{"_activation", Attribute::String("Relu")}});
  // SiLU runs as a pass over the output after the primitive (OwnSiluActivation), after its bias / C post-op.
  ExpectMatMul({4, 6, 21}, {21, 37}, true, {{"_activation", Attribute::String("Silu")}});
  ExpectMatMul({70, 33}, {33, 40}, false, {{"_activation", Attribute::String("Silu")}});
  // GELU's tanh form too (OwnGeluActivation); large enough for the pass to split over the threads.
  ExpectMatMul({4, 6, 21}, {21, 37}, true, {{"_activation", Attribute::String("GeluTanh")}});
  ExpectMatMul({700, 33}, {33, 64}, false, {{"_activation", Attribute::String("GeluTanh")}});
}

struct GemmCase {
  Shape a, b, c;  // c empty: no C input
  bool trans_a = false, trans_b = false;
  float alpha = 1.f, beta = 1.f;
  bool constant_b = true, constant_c = true;
  std::string activation;
  std::string name = "GemmF32Dnnl";
};

void ExpectGemm(const GemmCase& g) {
  SCOPED_TRACE(ShapeToString(g.a) + " x " + ShapeToString(g.b) + " + " + ShapeToString(g.c) +
               " transA=" + std::to_string(g.trans_a) + " transB=" + std::to_string(g.trans_b) + " alpha=" +
               std::to_string(g.alpha) + " beta=" + std::to_string(g.beta) + " constB=" + std::to_string(g.constant_b) +
               " constC=" + std::to_string(g.constant_c) + " " + g.activation);
  AttributeMap attrs{{"transA", Attribute::Int(g.trans_a)},
                     {"transB", Attribute::Int(g.trans_b)},
                     {"alpha", Attribute::Float(g.alpha)},
                     {"beta", Attribute::Float(g.beta)}};
  if (!g.activation.empty()) attrs["_activation"] = Attribute::String(g.activation);
  const bool has_c = !g.c.empty();
  Node node = MakeNode("Gemm", has_c ? 3 : 2, 1, attrs);
  std::vector<Tensor> in{RandomTensor(g.a, 3), RandomTensor(g.b, 4)};
  if (has_c) in.push_back(RandomTensor(g.c, 5));
  ExpectFastMatchesReference(node, in, {false, g.constant_b, g.constant_c}, g.name);
}

// SiLU after the primitive's C post-op (a full C: binary add).
TEST(DnnlGemm, SiluAfterTheAddedC) {
  ExpectGemm({.a = {9, 13}, .b = {7, 13}, .c = {9, 7}, .trans_b = true, .beta = 0.5f, .activation = "Silu"});
}

TEST(DnnlGemm, TransBWithBiasAlphaBeta) {
  ExpectGemm({.a = {3, 13}, .b = {7, 13}, .c = {7}, .trans_b = true});
  ExpectGemm({.a = {3, 13}, .b = {7, 13}, .c = {7}, .trans_b = true, .alpha = 0.5f, .beta = 2.f});
  ExpectGemm({.a = {3, 13}, .b = {7, 13}, .c = {1, 7}, .trans_b = true, .constant_c = false});
}

// The tuner times every candidate with all of its arguments, a binary post-op's second source included (a full C is
// added as one). Oracle: the tuning cache's lines, whose fourth field counts the candidates actually timed (a
// candidate oneDNN cannot run is skipped, and a choice with none timed is not written).
TEST(DnnlGemm, TunerTimesCandidatesWithABinaryPostOp) {
  const std::string cache = ::testing::TempDir() + "/osprey_tuning_binary_post_op.tsv";
  std::filesystem::remove(cache);
  setenv("OSPREY_TUNE_CACHE", cache.c_str(), 1);  // this test is its own process: read before any tuning
  ExpectGemm({.a = {3, 13}, .b = {13, 7}, .c = {3, 7}, .activation = "Relu"});
  ExpectGemm({.a = {3, 13}, .b = {13, 7}, .c = {3, 7}, .constant_c = false});
  std::ifstream in(cache);
  std::string hash, name;
  int position = -1, candidates = 0, lines = 0;
  while (in >> hash >> position >> name >> candidates) {
    std::string rest;
    std::getline(in, rest);
    ++lines;
    EXPECT_GE(candidates, 1) << name;
  }
  EXPECT_GE(lines, 2);
}

TEST(DnnlGemm, ClassifierHead) {
  ExpectGemm({.a = {1, 2048}, .b = {1000, 2048}, .c = {1000}, .trans_b = true, .name = OneRowKernel("GemmF32Dnnl")});
  ExpectGemm({.a = {2, 512}, .b = {1000, 512}, .c = {1000}, .trans_b = true, .activation = "Relu"});
}

TEST(DnnlGemm, TransposedAAndColumnOrScalarOrFullC) {
  ExpectGemm({.a = {13, 3}, .b = {13, 7}, .c = {3, 1}, .trans_a = true});
  ExpectGemm({.a = {13, 3}, .b = {7, 13}, .c = {}, .trans_a = true, .trans_b = true, .constant_c = true});
  ExpectGemm({.a = {3, 13}, .b = {13, 7}, .c = {1}, .beta = 0.25f});
  ExpectGemm({.a = {3, 13}, .b = {13, 7}, .c = {3, 7}, .beta = -1.f, .activation = "Tanh"});
  ExpectGemm({.a = {3, 13}, .b = {13, 7}, .c = {3, 7}, .constant_c = false});
}

TEST(DnnlGemm, RuntimeBWithAlpha) {
  ExpectGemm({.a = {3, 13}, .b = {7, 13}, .c = {7}, .trans_b = true, .alpha = 1.5f, .constant_b = false});
  ExpectGemm({.a = {13, 3},
              .b = {13, 7},
              .c = {3, 1},
              .trans_a = true,
              .alpha = -0.5f,
              .beta = 3.f,
              .constant_b = false,
              .activation = "Clip"});
}

TEST(DnnlGemm, DeclinesRuntimeCWithBeta) {
  Node node = MakeNode("Gemm", 3, 1, {{"beta", Attribute::Float(2.f)}});
  std::vector<Tensor> in{RandomTensor({3, 13}, 1), RandomTensor({13, 7}, 2), RandomTensor({7}, 3)};
  EXPECT_TRUE(FastKernelDeclines(node, in, {false, true, false}));
  EXPECT_FALSE(FastKernelDeclines(node, in, {false, true, true}));
}

// The batch-1 classifier shapes on GemvF32: odd K (the k loop's tail), N not a multiple of the 64-column panel, each
// way of giving the bias, a 1x1 Conv on a 1x1 image with and without bias. Oracle: the reference kernels.
TEST(Gemv, OneRowTimesAConstantMatrix) {
  if (!__builtin_cpu_supports("avx512f")) GTEST_SKIP() << "GemvF32 needs AVX-512; oneDNN runs these shapes elsewhere";
  ExpectMatMul({1, 1280}, {1280, 1000}, true, {}, "GemvF32");
  ExpectMatMul({1, 37}, {37, 70}, true, {}, "GemvF32");
  Node biased = MakeNode("MatMul", 3, 1, {{"_bias", Attribute::Int(1)}});
  ExpectFastMatchesReference(biased, {RandomTensor({1, 37}, 1), RandomTensor({37, 130}, 2), RandomTensor({130}, 3)},
                             {false, true, true}, "GemvF32");
  ExpectFastMatchesReference(biased, {RandomTensor({1, 37}, 1), RandomTensor({37, 130}, 2), RandomTensor({130}, 3)},
                             {false, true, false}, "GemvF32");  // a bias computed at run time
  ExpectGemm({.a = {1, 64}, .b = {64, 129}, .c = {1, 129}, .name = "GemvF32"});
  ExpectGemm({.a = {1, 65}, .b = {129, 65}, .c = {129}, .trans_b = true, .name = "GemvF32"});
  ExpectGemm({.a = {1, 65}, .b = {129, 65}, .trans_b = true, .name = "GemvF32"});
  // With a fused activation (openWakeWord's heads: Gemm + Relu), applied to the row after.
  ExpectGemm({.a = {1, 64}, .b = {64, 129}, .c = {129}, .activation = "Relu", .name = "GemvF32"});
  ExpectGemm({.a = {1, 65}, .b = {129, 65}, .c = {129}, .trans_b = true, .activation = "Sigmoid", .name = "GemvF32"});
  for (bool bias : {true, false}) {
    Node conv = MakeNode("Conv", bias ? 3 : 2, 1, {});
    std::vector<Tensor> in{RandomTensor({1, 48, 1, 1}, 4), RandomTensor({100, 48, 1, 1}, 5)};
    if (bias) in.push_back(RandomTensor({100}, 6));
    ExpectFastMatchesReference(conv, in, {false, true, true}, "GemvF32");
  }
}

TEST(Gemv, LeavesOtherCasesToOneDnn) {
  // Two rows, alpha, a run-time B, a padded Conv (3x3 output): not one row times a constant matrix.
  ExpectGemm({.a = {2, 64}, .b = {64, 129}, .c = {129}});
  ExpectGemm({.a = {1, 64}, .b = {64, 129}, .c = {129}, .alpha = 0.5f});
  ExpectMatMul({1, 37}, {37, 70}, false);
  Node padded = MakeNode("Conv", 2, 1, {{"pads", Attribute::Ints({1, 1, 1, 1})}});
  std::vector<Tensor> outputs;
  std::vector<Tensor> in{RandomTensor({1, 8, 1, 1}, 7), RandomTensor({16, 8, 1, 1}, 8)};
  KernelBuildContext bc = MakeBuildContext(padded, in, {false, true}, outputs);
  EXPECT_EQ(cpu::CreateGemv(bc), nullptr);
}

// Tensors of another size than the kernel was built for are refused with an error, not read or written past.
TEST(Gemv, RefusesTensorsOfAnotherSize) {
  if (!__builtin_cpu_supports("avx512f")) GTEST_SKIP() << "GemvF32 needs AVX-512";
  Node node = MakeNode("MatMul", 2, 1, {});
  const std::vector<Tensor> in{RandomTensor({1, 37}, 1), RandomTensor({37, 70}, 2)};
  std::vector<Tensor> outputs;
  KernelBuildContext bc = MakeBuildContext(node, in, {false, true}, outputs);
  std::unique_ptr<Kernel> kernel = CreateCpuKernel(bc);
  ASSERT_NE(kernel, nullptr);
  ASSERT_EQ(std::string(kernel->Name()), "GemvF32");
  std::vector<Tensor> small_out{Tensor(DType::kF32, {1, 69})};
  EXPECT_THROW(RunKernel(*kernel, node, in, small_out), Error);
  std::vector<Tensor> fine_out{Tensor(DType::kF32, {1, 70})};
  EXPECT_THROW(RunKernel(*kernel, node, {RandomTensor({1, 36}, 1), in[1]}, fine_out), Error);
}

}  // namespace
}  // namespace osprey::testing
