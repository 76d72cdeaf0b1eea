// bf16 fast mode (KernelBuildContext::bf16) of the oneDNN Conv, MatMul and Gemm kernels. Two oracles, both the
// reference kernel:
//  - on the original fp32 inputs, within the bf16 tolerance: |got - want| <= 1e-2 * (|want| + rms(want)). Rounding
//    the input and the weight to bf16 (8 significant bits) perturbs each product by up to 2^-8 relative, so an output
//    (a sum of K products of random sign) moves by about 2^-8 * rms(output); the rms term covers outputs near zero.
//  - on the inputs rounded to bf16 by this test (round to nearest even), within the fp32 fast-kernel tolerance: bf16
//    products are exact in fp32 and oneDNN accumulates in fp32, so this checks the kernel rounds and accumulates as
//    documented rather than merely "close".
#include <omp.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "core/hash.h"
#include "kernel_test_util.h"
#include "kernels/cpu/bf16_support.h"
#include "kernels/cpu/dnnl_common.h"

namespace osprey::testing {
namespace {

float RoundToBf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  u &= 0xffff0000u;
  float r;
  std::memcpy(&r, &u, 4);
  return r;
}

Tensor Bf16Rounded(const Tensor& t) {
  if (t.buffer() == nullptr) return t;
  Tensor out = t.Clone();
  float* p = out.data<float>();
  for (int64_t i = 0; i < out.numel(); ++i) p[i] = RoundToBf16(p[i]);
  return out;
}

void ExpectNearBf16(const Tensor& got, const Tensor& want) {
  ASSERT_EQ(ShapeToString(got.shape()), ShapeToString(want.shape()));
  double sq = 0;
  for (int64_t i = 0; i < want.numel(); ++i) sq += want.GetAsDouble(i) * want.GetAsDouble(i);
  const double rms = want.numel() > 0 ? std::sqrt(sq / want.numel()) : 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double g = got.GetAsDouble(i), w = want.GetAsDouble(i);
    ASSERT_LE(std::fabs(g - w), 1e-2 * (std::fabs(w) + rms))
        << "at flat index " << i << ": got " << g << ", want " << w;
  }
}

// Builds the bf16 kernel for `node` (inputs flagged `constant` are weights; `rounded` says which inputs the kernel
// reads as bf16), checks its name, runs it twice and compares with both oracles.
void ExpectBf16(const Node& node, const std::vector<Tensor>& inputs, const std::vector<bool>& constant,
                const std::vector<bool>& rounded, const std::string& expected_name) {
  if (!cpu::CpuSupportsBf16()) GTEST_SKIP() << "this CPU has no AVX512_BF16";
  std::vector<Tensor> want = RunReferenceNode(node, inputs);
  std::vector<Tensor> rounded_inputs;
  for (size_t i = 0; i < inputs.size(); ++i)
    rounded_inputs.push_back(i < rounded.size() && rounded[i] ? Bf16Rounded(inputs[i]) : inputs[i]);
  std::vector<Tensor> want_rounded = RunReferenceNode(node, rounded_inputs);
  std::vector<Tensor> outputs;
  KernelBuildContext bc = MakeBuildContext(node, inputs, constant, outputs);
  bc.bf16 = Bf16Use::kYes;
  std::unique_ptr<Kernel> kernel = CreateCpuKernel(bc);
  ASSERT_NE(kernel, nullptr);
  EXPECT_EQ(std::string(kernel->Name()), expected_name);
  for (int run = 0; run < 2; ++run) {
    SCOPED_TRACE("run " + std::to_string(run));
    RunKernel(*kernel, node, inputs, outputs);
    ExpectNearBf16(outputs[0], want[0]);
    ExpectTensorNear(outputs[0], want_rounded[0], kFastRtol, kFastAtol);
  }
  // The inputs are read, never written (the bf16 copy is the kernel's scratch).
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].buffer() != nullptr) ExpectTensorNear(inputs[i], inputs[i].Clone(), 0, 0);
}

Attribute Ints(std::vector<int64_t> v) { return Attribute::Ints(std::move(v)); }

void ExpectConv(AttributeMap attrs, const Shape& x, const Shape& w, bool bias) {
  SCOPED_TRACE("Conv " + ShapeToString(x) + " * " + ShapeToString(w));
  Node node = MakeNode("Conv", 3, 1, std::move(attrs));
  ExpectBf16(node, {RandomTensor(x, 1), RandomTensor(w, 2), bias ? RandomTensor({w[0]}, 3) : Tensor()},
             {false, true, true}, {true, true, false}, "ConvBf16Dnnl");
}

TEST(Bf16Conv, ThreeByThreePadOne) {
  ExpectConv({{"pads", Ints({1, 1, 1, 1})}}, {1, 16, 13, 11}, {32, 16, 3, 3}, true);
  ExpectConv({{"pads", Ints({1, 1, 1, 1})}}, {2, 5, 7, 9}, {13, 5, 3, 3}, true);  // odd channels
}

TEST(Bf16Conv, PointwiseAndStrideTwoWithRelu) {
  ExpectConv({}, {1, 64, 14, 14}, {96, 64, 1, 1}, false);
  ExpectConv({{"strides", Ints({2, 2})}, {"pads", Ints({3, 3, 3, 3})}, {"_activation", Attribute::String("Relu")}},
             {1, 3, 29, 31}, {16, 3, 7, 7}, true);
}

TEST(Bf16Conv, DepthwiseWithClip) {
  ExpectConv({{"group", Attribute::Int(32)},
              {"pads", Ints({1, 1, 1, 1})},
              {"_activation", Attribute::String("Clip")},
              {"_alpha", Attribute::Float(0.f)},
              {"_beta", Attribute::Float(6.f)}},
             {1, 32, 15, 13}, {32, 1, 3, 3}, true);
}

TEST(Bf16Conv, ResidualAddThenRelu) {
  // Input 3 is the residual (fp32, added before the activation, never rounded).
  Node node = MakeNode(
      "Conv", 4, 1,
      {{"pads", Ints({1, 1, 1, 1})}, {"_residual", Attribute::Int(1)}, {"_activation", Attribute::String("Relu")}});
  ExpectBf16(node,
             {RandomTensor({1, 16, 9, 7}, 1), RandomTensor({32, 16, 3, 3}, 2), RandomTensor({32}, 3),
              RandomTensor({1, 32, 9, 7}, 4)},
             {false, true, true, false}, {true, true, false, false}, "ConvBf16Dnnl");
}

TEST(Bf16MatMul, ConstantBIsBf16) {
  for (const auto& [a, b] : std::vector<std::pair<Shape, Shape>>{
           {{5, 13}, {13, 7}}, {{2, 3, 5, 64}, {64, 33}}, {{1, 2048}, {2048, 1000}}, {{13}, {13, 7}}}) {
    SCOPED_TRACE("MatMul " + ShapeToString(a) + " x " + ShapeToString(b));
    ExpectBf16(MakeNode("MatMul", 2, 1), {RandomTensor(a, 1), RandomTensor(b, 2)}, {false, true}, {true, true},
               "MatMulBf16Dnnl");
  }
}

TEST(Bf16MatMul, FusedBiasAndGelu) {
  Node node = MakeNode("MatMul", 3, 1, {{"_bias", Attribute::Int(1)}, {"_activation", Attribute::String("Gelu")}});
  ExpectBf16(node, {RandomTensor({3, 5, 48}, 1), RandomTensor({48, 17}, 2), RandomTensor({17}, 3)}, {false, true, true},
             {true, true, false}, "MatMulBf16Dnnl");
}

TEST(Bf16MatMul, RunTimeBStaysFp32) {
  // Both operands are activations (e.g. attention scores): nothing to prepack, so the kernel stays fp32 and exact.
  if (!cpu::CpuSupportsBf16()) GTEST_SKIP() << "this CPU has no AVX512_BF16";
  Node node = MakeNode("MatMul", 2, 1);
  std::vector<Tensor> in{RandomTensor({2, 5, 13}, 1), RandomTensor({2, 13, 7}, 2)};
  std::vector<Tensor> want = RunReferenceNode(node, in);
  std::vector<Tensor> outputs;
  KernelBuildContext bc = MakeBuildContext(node, in, {false, false}, outputs);
  bc.bf16 = Bf16Use::kYes;
  std::unique_ptr<Kernel> kernel = CreateCpuKernel(bc);
  ASSERT_NE(kernel, nullptr);
  EXPECT_EQ(std::string(kernel->Name()), "MatMulF32Dnnl");
  RunKernel(*kernel, node, in, outputs);
  ExpectTensorNear(outputs[0], want[0], kFastRtol, kFastAtol);
}

TEST(Bf16Gemm, TransposesBiasAndFullC) {
  // Classifier head: [N, 2048] x B^T [1000, 2048] + row-vector C.
  ExpectBf16(MakeNode("Gemm", 3, 1, {{"transB", Attribute::Int(1)}}),
             {RandomTensor({2, 256}, 1), RandomTensor({100, 256}, 2), RandomTensor({100}, 3)}, {false, true, true},
             {true, true, false}, "GemmBf16Dnnl");
  // transA, alpha and beta, full [M, N] C.
  ExpectBf16(
      MakeNode("Gemm", 3, 1,
               {{"transA", Attribute::Int(1)}, {"alpha", Attribute::Float(0.5f)}, {"beta", Attribute::Float(2.f)}}),
      {RandomTensor({13, 5}, 1), RandomTensor({13, 7}, 2), RandomTensor({5, 7}, 3)}, {false, true, true},
      {true, true, false}, "GemmBf16Dnnl");
}

TEST(Bf16, Fp32WhenNotAsked) {
  // Bf16Use::kNo (the default) keeps the exact fp32 kernels.
  std::vector<Tensor> outputs;
  Node node = MakeNode("MatMul", 2, 1);
  std::vector<Tensor> in{RandomTensor({5, 13}, 1), RandomTensor({13, 7}, 2)};
  KernelBuildContext bc = MakeBuildContext(node, in, {false, true}, outputs);
  std::unique_ptr<Kernel> kernel = CreateCpuKernel(bc);
  ASSERT_NE(kernel, nullptr);
  EXPECT_EQ(std::string(kernel->Name()), "MatMulF32Dnnl");
}

// ------------------------------------------------------------------------ Bf16Use::kIfFaster (precision bf16 / auto)

// The bf16-or-fp32 lines of a tuning cache file: their name field ("bf16" / "fp32").
std::vector<std::string> PrecisionChoices(const std::string& path) {
  std::vector<std::string> names;
  for (const std::string& line : Lines(path)) {
    std::istringstream fields(line);
    std::string hash, name;
    int position = -1;
    if (fields >> hash >> position >> name && (name == "bf16" || name == "fp32")) names.push_back(name);
  }
  return names;
}

// Builds `node` with kIfFaster twice: the first build times both forms and records the choice in the cache file, the
// second reuses it; the kernel is the recorded form and its output is right for that form.
void ExpectTimedChoice(const Node& node, const std::vector<Tensor>& inputs, const std::vector<bool>& constant,
                       bool nhwc, const std::string& bf16_name, const std::string& f32_name) {
  if (!cpu::CpuSupportsBf16()) GTEST_SKIP() << "this CPU has no AVX512_BF16";
  ScopedEnv oneDNN_only("OSPREY_POINTWISE", "0");  // osprey's 1x1 kernel competes too where fp32 wins (below)
  const std::string path = TempCachePath("osprey-tune-bf16");
  setenv("OSPREY_TUNE_CACHE", path.c_str(), 1);
  std::vector<Tensor> want = RunReferenceNode(node, inputs), outputs;
  for (int build = 0; build < 2; ++build) {
    KernelBuildContext bc = MakeBuildContext(node, inputs, constant, outputs);
    if (nhwc) {
      bc.input_layouts = {Layout::kNhwc, Layout::kPlain, Layout::kPlain};
      bc.output_layouts = {Layout::kNhwc};
    }
    bc.bf16 = Bf16Use::kIfFaster;
    std::unique_ptr<Kernel> kernel = CreateCpuKernel(bc);
    ASSERT_NE(kernel, nullptr);
    const std::vector<std::string> choices = PrecisionChoices(path);
    ASSERT_EQ(choices.size(), 1u) << "one timed choice, reused by the second build";
    const std::string name = kernel->Name();
    EXPECT_EQ(name, choices[0] == "bf16" ? bf16_name : f32_name) << "recorded " << choices[0];
    if (nhwc) continue;  // (RunKernel feeds plain tensors)
    RunKernel(*kernel, node, inputs, outputs);
    if (name == bf16_name)
      ExpectNearBf16(outputs[0], want[0]);
    else
      ExpectTensorNear(outputs[0], want[0], kFastRtol, kFastAtol);
  }
  std::filesystem::remove(path);
}

TEST(Bf16IfFaster, ConvKeepsTheFasterForm) {
  Node node = MakeNode("Conv", 3, 1, {{"pads", Ints({1, 1, 1, 1})}, {"_activation", Attribute::String("Relu")}});
  ExpectTimedChoice(node, {RandomTensor({1, 64, 14, 14}, 1), RandomTensor({64, 64, 3, 3}, 2), RandomTensor({64}, 3)},
                    {false, true, true}, false, "ConvBf16Dnnl", "ConvF32Dnnl");
}

TEST(Bf16IfFaster, ChannelsLastConvKeepsTheFasterForm) {
  Node node = MakeNode("Conv", 3, 1, {});
  ExpectTimedChoice(node, {RandomTensor({1, 128, 14, 14}, 1), RandomTensor({256, 128, 1, 1}, 2), RandomTensor({256}, 3)},
                    {false, true, true}, true, "ConvBf16Dnnl", "ConvF32Dnnl");
}

TEST(Bf16IfFaster, MatMulKeepsTheFasterForm) {
  ExpectTimedChoice(MakeNode("MatMul", 2, 1), {RandomTensor({8, 512}, 1), RandomTensor({512, 256}, 2)},
                    {false, true}, false, "MatMulBf16Dnnl", "MatMulF32Dnnl");
}

// With bf16 allowed where faster, osprey's own fp32 convolution kernels stay candidates (--precision auto must not
// run slower than fp32 on a CPU whose bf16 is slow); asked for bf16 without timing (kYes), oneDNN's bf16 kernel runs.
// OSPREY_WINOGRAD=1 takes Winograd wherever it is a candidate, so the kernel says which.
TEST(Bf16IfFaster, OwnKernelsStayCandidates) {
  if (!cpu::CpuSupportsBf16() || !__builtin_cpu_supports("avx512f")) GTEST_SKIP() << "this CPU has no AVX512_BF16";
  ScopedEnv always("OSPREY_WINOGRAD", "1");
  Node node = MakeNode("Conv", 3, 1, {{"pads", Ints({1, 1, 1, 1})}});
  const std::vector<Tensor> in{RandomTensor({1, 32, 10, 10}, 1), RandomTensor({32, 32, 3, 3}, 2),
                               RandomTensor({32}, 3)};
  std::vector<Tensor> outputs;
  for (Bf16Use use : {Bf16Use::kIfFaster, Bf16Use::kYes}) {
    KernelBuildContext bc = MakeBuildContext(node, in, {false, true, true}, outputs);
    bc.input_layouts = {Layout::kNhwc, Layout::kPlain, Layout::kPlain};
    bc.output_layouts = {Layout::kNhwc};
    bc.bf16 = use;
    std::unique_ptr<Kernel> kernel = CreateCpuKernel(bc);
    ASSERT_NE(kernel, nullptr);
    EXPECT_STREQ(kernel->Name(), use == Bf16Use::kYes ? "ConvBf16Dnnl" : "ConvF32Winograd");
  }
}

TEST(Bf16IfFaster, RelativeRmsDifference) {
  EXPECT_EQ(cpu::RelativeRmsDifference({3, 4}, {3, 4}), 0);
  EXPECT_NEAR(cpu::RelativeRmsDifference({3, 4}, {3, 5}), 0.2, 1e-12);  // |(0, 1)| / |(3, 4)|
  EXPECT_NEAR(cpu::RelativeRmsDifference({3, 4}, {0, 0}), 1.0, 1e-12);
  EXPECT_GT(cpu::RelativeRmsDifference({3, 4}, {3}), 1e20);
  EXPECT_GT(cpu::RelativeRmsDifference({0, 0}, {0, 1}), 1e20);
  EXPECT_EQ(cpu::RelativeRmsDifference({0, 0}, {0, 0}), 0);
}

// The agreement gate, with the timing verdict fixed by a cache file that says bf16 is faster: a bf16 primitive
// computing the same convolution is taken, one computing something else (a Relu the float32 one does not apply) is
// refused, and a recorded "fp32" is obeyed without running anything.
TEST(Bf16IfFaster, RefusesABf16PrimitiveThatDisagrees) {
  if (!cpu::CpuSupportsBf16()) GTEST_SKIP() << "this CPU has no AVX512_BF16";
  using dnnl::memory;
  const std::string path = TempCachePath("osprey-tune-gate");
  auto hash = [](const std::string& key) {
    Hasher hasher;
    hasher.Update("bf16?" + key + "@" + std::to_string(omp_get_max_threads()));
    return hasher.Finish().ToHex();
  };
  {
    std::ofstream out(path);
    out << hash("gate-bf16") << " 1 bf16 2\n"
        << hash("gate-bf16-relu") << " 1 bf16 2\n"
        << hash("gate-fp32") << " 0 fp32 2\n";
  }
  setenv("OSPREY_TUNE_CACHE", path.c_str(), 1);
  const memory::dims x{1, 16, 8, 8}, w{16, 16, 3, 3}, y{1, 16, 8, 8};
  const memory::desc user_src(x, memory::data_type::f32, memory::format_tag::nchw);
  const memory::desc user_dst(y, memory::data_type::f32, memory::format_tag::nchw);
  const memory::desc weights_plain(w, memory::data_type::f32, memory::format_tag::oihw);
  const Tensor weights = RandomTensor({16, 16, 3, 3}, 7);
  auto conv = [&](memory::data_type type, bool relu) {
    dnnl::primitive_attr attr = cpu::BaseAttr();
    dnnl::post_ops ops;
    if (relu) ops.append_eltwise(dnnl::algorithm::eltwise_relu, 0.f, 0.f);
    attr.set_post_ops(ops);
    return dnnl::convolution_forward::primitive_desc(
        cpu::CpuEngine(), dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
        memory::desc(x, type, memory::format_tag::any), memory::desc(w, type, memory::format_tag::any), memory::desc(),
        memory::desc(y, memory::data_type::f32, memory::format_tag::any), {1, 1}, {0, 0}, {1, 1}, {1, 1}, attr);
  };
  const auto f32 = conv(memory::data_type::f32, false);
  const auto bf16 = conv(memory::data_type::bf16, false);
  const auto bf16_relu = conv(memory::data_type::bf16, true);
  for (int pass = 0; pass < 2; ++pass) {  // the second pass reads the remembered agreement verdicts
    SCOPED_TRACE("pass " + std::to_string(pass));
    EXPECT_TRUE(cpu::PreferBf16("gate-bf16", f32, bf16, user_src, user_dst, weights_plain, weights.raw()));
    EXPECT_FALSE(cpu::PreferBf16("gate-bf16-relu", f32, bf16_relu, user_src, user_dst, weights_plain, weights.raw()));
    EXPECT_FALSE(cpu::PreferBf16("gate-fp32", f32, bf16, user_src, user_dst, weights_plain, weights.raw()));
    const std::vector<std::string> lines = Lines(path);
    ASSERT_EQ(lines.size(), 5u) << "three timing verdicts, never timed again, and two agreement verdicts";
    EXPECT_NE(lines[3].find(" 1 agrees "), std::string::npos) << lines[3];
    EXPECT_NE(lines[4].find(" 0 differs "), std::string::npos) << lines[4];
  }
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace osprey::testing
