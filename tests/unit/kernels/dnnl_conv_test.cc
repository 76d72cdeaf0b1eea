// oneDNN Conv kernel. Oracle: the reference Conv kernel (kernels/reference), run on the same node and inputs.
#include "kernels/cpu/dnnl_conv.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "kernel_test_util.h"
#include "kernels/cpu/dnnl_common.h"
#include "kernels/cpu/own_conv.h"
#include "osprey/runtime.h"

namespace osprey::testing {
namespace {

Attribute Ints(std::vector<int64_t> v) { return Attribute::Ints(std::move(v)); }

Node ConvNode(AttributeMap attrs, int num_inputs = 3) { return MakeNode("Conv", num_inputs, 1, std::move(attrs)); }

// Sums of C x k x k products of values in [-1, 1] (std ~ sqrt(C k k) / 3): two fp32 summation orders differ by up
// to ~1e-4 at C k k = 576 (oneDNN 3's brgconv against the reference GEMM), so deep layers get a wider atol.
float DepthAtol(const Shape& w) {
  const int64_t depth = w[1] * (w.size() > 2 ? w[2] : 1) * (w.size() > 3 ? w[3] : 1);
  return depth >= 512 ? 4e-4f : kFastAtol;
}

void ExpectConv(const Node& node, const Shape& x, const Shape& w, bool bias, uint32_t seed = 1,
                const std::string& name = "ConvF32Dnnl") {
  std::vector<Tensor> in{RandomTensor(x, seed), RandomTensor(w, seed + 1),
                         bias ? RandomTensor({w[0]}, seed + 2) : Tensor()};
  ExpectFastMatchesReference(node, in, {false, true, true}, name, 17, nullptr, DepthAtol(w));
}

TEST(DnnlConv, Basic3x3Pad1ThreeToFiveChannels) {
  ExpectConv(ConvNode({{"kernel_shape", Ints({3, 3})}, {"pads", Ints({1, 1, 1, 1})}}), {1, 3, 7, 9}, {5, 3, 3, 3},
             true);
}

TEST(DnnlConv, NoBiasNoAttributes) { ExpectConv(ConvNode({}, 2), {2, 5, 7, 9}, {3, 5, 3, 3}, false); }

TEST(DnnlConv, StrideTwoAsymmetricPadsRectangularKernel) {
  ExpectConv(ConvNode({{"strides", Ints({2, 2})}, {"pads", Ints({0, 1, 2, 1})}}), {2, 13, 7, 9}, {5, 13, 3, 2}, true);
}

TEST(DnnlConv, TwoGroups) {
  ExpectConv(ConvNode({{"group", Attribute::Int(2)}, {"pads", Ints({1, 1, 1, 1})}}), {2, 6, 7, 9}, {4, 3, 3, 3}, true);
}

TEST(DnnlConv, DepthwiseThirteenChannelsWithRelu) {
  ExpectConv(
      ConvNode(
          {{"group", Attribute::Int(13)}, {"pads", Ints({1, 1, 1, 1})}, {"_activation", Attribute::String("Relu")}}),
      {1, 13, 7, 9}, {13, 1, 3, 3}, true);
}

TEST(DnnlConv, DepthwiseWithChannelMultiplierStrideTwo) {
  ExpectConv(ConvNode({{"group", Attribute::Int(13)}, {"strides", Ints({2, 2})}, {"pads", Ints({1, 0, 1, 2})}}),
             {1, 13, 7, 9}, {26, 1, 3, 3}, true);
}

TEST(DnnlConv, DilationTwo) {
  ExpectConv(ConvNode({{"dilations", Ints({2, 2})}, {"pads", Ints({2, 1, 2, 1})}}), {1, 5, 9, 11}, {3, 5, 3, 3}, true);
}

TEST(DnnlConv, SameUpperStrideTwo) {
  ExpectConv(ConvNode({{"auto_pad", Attribute::String("SAME_UPPER")}, {"strides", Ints({2, 2})}}), {1, 3, 7, 9},
             {5, 3, 3, 3}, true);
}

TEST(DnnlConv, SameUpperEvenKernelPadsMoreAtTheEnd) {
  ExpectConv(ConvNode({{"auto_pad", Attribute::String("SAME_UPPER")}}), {1, 3, 7, 9}, {5, 3, 2, 4}, true);
}

TEST(DnnlConv, SameLowerEvenKernelPadsMoreAtTheStart) {
  ExpectConv(ConvNode({{"auto_pad", Attribute::String("SAME_LOWER")}}), {1, 3, 7, 9}, {5, 3, 2, 4}, true);
}

TEST(DnnlConv, ValidPadding) {
  ExpectConv(ConvNode({{"auto_pad", Attribute::String("VALID")}, {"strides", Ints({1, 2})}}), {1, 5, 7, 9},
             {3, 5, 3, 3}, true);
}

TEST(DnnlConv, PointwiseOneByOne) { ExpectConv(ConvNode({}), {2, 13, 7, 9}, {5, 13, 1, 1}, true); }

TEST(DnnlConv, OneDimensional) {
  ExpectConv(ConvNode({{"strides", Ints({2})}, {"pads", Ints({1, 2})}}), {2, 5, 11}, {3, 5, 3}, true);
}

TEST(DnnlConv, ThreeDimensional) {
  ExpectConv(ConvNode({{"pads", Ints({1, 0, 1, 1, 2, 1})}, {"strides", Ints({1, 2, 1})}}), {1, 3, 5, 6, 7},
             {4, 3, 3, 3, 3}, true);
}

TEST(DnnlConv, PlainPointwiseAppliesItsOwnActivation) {
  // A 1x1 convolution on plain tensors runs as oneDNN's GEMM convolution and applies its activation itself, after the
  // primitive (OwnActivation): rank 3 as PyTorch's Conv1d, rank 4, activations with parameters, over several of the
  // kernel's blocks of 16384 values.
  for (const char* act : {"Relu", "LeakyRelu", "Clip", "HardSigmoid", "Sigmoid", "Silu"}) {
    SCOPED_TRACE(act);
    AttributeMap attrs{
        {"_activation", Attribute::String(act)}, {"_alpha", Attribute::Float(0.2f)}, {"_beta", Attribute::Float(0.5f)}};
    if (std::string(act) == "Clip") attrs["_alpha"] = Attribute::Float(-0.3f);
    ExpectConv(ConvNode(attrs), {2, 24, 1000}, {20, 24, 1}, true);
    ExpectConv(ConvNode(attrs), {1, 8, 5, 7}, {3, 8, 1, 1}, false);
  }
}

// Residual add then Relu: result = relu(conv(x) + r). Covers the reordered (3x3) and plain (1x1) paths.
void ExpectResidual(const Shape& x, const Shape& w, const std::string& activation, AttributeMap extra = {}) {
  AttributeMap attrs = std::move(extra);
  attrs["_residual"] = Attribute::Int(1);
  if (!activation.empty()) attrs["_activation"] = Attribute::String(activation);
  Node node = ConvNode(attrs, 4);
  Shape y{x[0], w[0], x[2], x[3]};
  std::vector<Tensor> in{RandomTensor(x, 11), RandomTensor(w, 12), RandomTensor({w[0]}, 13), RandomTensor(y, 14)};
  ExpectFastMatchesReference(node, in, {false, true, true, false}, "ConvF32Dnnl");
}

TEST(DnnlConv, FusedResidualAndRelu3x3) {
  ExpectResidual({1, 5, 7, 9}, {13, 5, 3, 3}, "Relu", {{"pads", Ints({1, 1, 1, 1})}});
}

TEST(DnnlConv, FusedResidualAndRelu1x1) { ExpectResidual({2, 13, 7, 9}, {5, 13, 1, 1}, "Relu"); }

TEST(DnnlConv, FusedResidualWithoutActivation1x1) { ExpectResidual({2, 13, 7, 9}, {5, 13, 1, 1}, ""); }

// The runtime may run the residual add in place: output and residual share one buffer.
TEST(DnnlConv, FusedResidualInPlace) {
  for (const Shape& w : {Shape{5, 13, 1, 1}, Shape{5, 13, 3, 3}}) {
    for (bool relu : {false, true}) {
      SCOPED_TRACE(ShapeToString(w) + (relu ? " relu" : ""));
      AttributeMap attrs{{"_residual", Attribute::Int(1)}, {"pads", Ints({1, 1, 1, 1})}};
      if (w[2] == 1) attrs["pads"] = Ints({0, 0, 0, 0});
      if (relu) attrs["_activation"] = Attribute::String("Relu");
      Node node = ConvNode(attrs, 4);
      Tensor residual = RandomTensor({1, 5, 7, 9}, 24);
      std::vector<Tensor> in{RandomTensor({1, 13, 7, 9}, 21), RandomTensor(w, 22), RandomTensor({5}, 23),
                             residual.Clone()};
      std::vector<Tensor> expected = RunReferenceNode(node, in);
      std::vector<Tensor> outputs;
      KernelBuildContext bc = MakeBuildContext(node, in, {false, true, true, false}, outputs);
      std::unique_ptr<Kernel> kernel = CreateCpuKernel(bc);
      ASSERT_NE(kernel, nullptr);
      KernelContext kc{node};
      for (const Tensor& t : in) kc.inputs.push_back(&t);
      kc.outputs.push_back(&in[3]);  // write over the residual itself
      kernel->Run(kc);
      ExpectTensorNear(in[3], expected[0], kFastRtol, kFastAtol);
    }
  }
}

// Every fused activation, with pre-activation values spread over [-6, 6] so clip bounds and saturation are hit.
TEST(DnnlConv, EveryFusedActivation) {
  struct Case {
    std::string name;
    float alpha, beta;
  };
  const std::vector<Case> cases = {
      {"Relu", 0, 0}, {"LeakyRelu", 0.1f, 0},      {"Clip", 0, 6},      {"Clip", -1.5f, 2.5f}, {"Sigmoid", 0, 0},
      {"Tanh", 0, 0}, {"HardSigmoid", 0.2f, 0.5f}, {"HardSwish", 0, 0}, {"Silu", 0, 0},        {"Gelu", 0, 0}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name + " alpha " + std::to_string(c.alpha) + " beta " + std::to_string(c.beta));
    Node node = ConvNode({{"pads", Ints({1, 1, 1, 1})},
                          {"_activation", Attribute::String(c.name)},
                          {"_alpha", Attribute::Float(c.alpha)},
                          {"_beta", Attribute::Float(c.beta)}});
    std::vector<Tensor> in{Scaled(RandomTensor({1, 5, 7, 9}, 31), 2.f), RandomTensor({3, 5, 3, 3}, 32),
                           RandomTensor({3}, 33)};
    ExpectFastMatchesReference(node, in, {false, true, true}, "ConvF32Dnnl");
  }
}

TEST(DnnlConv, ClipZeroSixWithResidual) {
  ExpectResidual({1, 5, 7, 9}, {13, 5, 3, 3}, "Clip",
                 {{"pads", Ints({1, 1, 1, 1})}, {"_alpha", Attribute::Float(0)}, {"_beta", Attribute::Float(6)}});
}

// Each internal layout choice must give the same result, whatever CreateDnnlConv picks for the shape.
TEST(DnnlConv, EveryLayoutMatchesReference) {
  using cpu::ConvLayout;
  for (ConvLayout layout : {ConvLayout::kPlain, ConvLayout::kChannelsLast, ConvLayout::kPreferred}) {
    SCOPED_TRACE("layout " + std::to_string(static_cast<int>(layout)));
    static ConvLayout current;
    current = layout;
    auto factory = [](const KernelBuildContext& bc) { return cpu::CreateDnnlConv(bc, current); };
    Node node = ConvNode({{"pads", Ints({1, 0, 1, 2})},
                          {"group", Attribute::Int(1)},
                          {"_residual", Attribute::Int(1)},
                          {"_activation", Attribute::String("HardSwish")}},
                         4);
    std::vector<Tensor> in{Scaled(RandomTensor({2, 13, 7, 9}, 41), 2.f), RandomTensor({5, 13, 3, 3}, 42),
                           RandomTensor({5}, 43), RandomTensor({2, 5, 7, 9}, 44)};
    ExpectFastMatchesReference(node, in, {false, true, true, false}, "ConvF32Dnnl", 17, +factory);
    Node pointwise = ConvNode({{"_activation", Attribute::String("Relu")}});
    std::vector<Tensor> in2{RandomTensor({1, 13, 7, 9}, 45), RandomTensor({5, 13, 1, 1}, 46), RandomTensor({5}, 47)};
    ExpectFastMatchesReference(pointwise, in2, {false, true, true}, "ConvF32Dnnl", 17, +factory);
  }
}

TEST(DnnlConv, ResNetSizedLayersMatchReference) {
  ExpectConv(ConvNode({{"pads", Ints({1, 1, 1, 1})}, {"_activation", Attribute::String("Relu")}}), {1, 64, 28, 28},
             {64, 64, 3, 3}, true, 1);
  ExpectConv(ConvNode({{"strides", Ints({2, 2})}, {"pads", Ints({3, 3, 3, 3})}}), {1, 3, 32, 32}, {64, 3, 7, 7}, true);
  ExpectConv(ConvNode({}), {1, 256, 14, 14}, {64, 256, 1, 1}, true);
}

// The kernel times oneDNN's implementations once per distinct convolution and keeps the fastest (dnnl_common.cc); the
// choice goes to the cache file ($OSPREY_TUNE_CACHE), which a later build reads back. The tuner reloads its choices
// when the path changes, so each test's file is what it sees, in its own process (ctest) or one after another.
TEST(DnnlTuning, RecordsTheChosenImplementation) {
  const std::string path = TempCachePath("osprey-tune");
  setenv("OSPREY_TUNE_CACHE", path.c_str(), 1);
  // Channels-last tensors, as the runtime's layout pass gives convolutions: every candidate reads and writes NHWC.
  // (40 channels: osprey's Winograd, chosen by a timing of its own, takes only multiples of 16.)
  Node node = ConvNode({{"pads", Ints({1, 1, 1, 1})}, {"_activation", Attribute::String("Relu")}});
  std::vector<Tensor> in{RandomTensor({1, 40, 14, 14}, 1), RandomTensor({40, 40, 3, 3}, 2), RandomTensor({40}, 3)};
  std::vector<Tensor> outputs;
  KernelBuildContext bc = MakeBuildContext(node, in, {false, true, true}, outputs);
  bc.input_layouts = {Layout::kNhwc, Layout::kPlain, Layout::kPlain};
  bc.output_layouts = {Layout::kNhwc};
  ASSERT_NE(CreateCpuKernel(bc), nullptr);
  std::unique_ptr<Kernel> kernel = CreateCpuKernel(bc);
  ASSERT_NE(kernel, nullptr);
  const std::vector<std::string> lines = Lines(path);
  ASSERT_EQ(lines.size(), 1u) << "one line per distinct convolution: the second kernel reused the first choice";
  std::istringstream fields(lines[0]);
  std::string hash, name;
  int position = -1, candidates = 0;
  ASSERT_TRUE(fields >> hash >> position >> name >> candidates) << lines[0];
  EXPECT_EQ(hash.size(), 32u);
  EXPECT_GE(position, 0);
  EXPECT_LT(position, 1000);
  EXPECT_EQ(name, cpu::DnnlConvImplementation(*kernel));
  // A dense 3x3 convolution has more than one JIT implementation on every x86 ISA oneDNN 3 supports (brgconv and
  // jit on AVX2 and AVX-512): fewer timed means the tuner did not step through oneDNN's list.
  EXPECT_GE(candidates, 2) << lines[0];
  std::filesystem::remove(path);
}

TEST(DnnlTuning, LeavesAnOversizedCacheFileAlone) {
  const std::string path = TempCachePath("osprey-tune-large");
  {
    std::ofstream out(path);
    out << std::string((1 << 20) + 1, '#');  // over the 1 MiB limit, as one unreadable line
  }
  setenv("OSPREY_TUNE_CACHE", path.c_str(), 1);
  ExpectConv(ConvNode({{"pads", Ints({1, 1, 1, 1})}}), {1, 32, 9, 11}, {48, 32, 3, 3}, true, 6);
  EXPECT_EQ(std::filesystem::file_size(path), static_cast<std::uintmax_t>((1 << 20) + 1));  // not extended
  std::filesystem::remove(path);
}

// A file that filled up is still read, up to the limit: the choices in it are used, not timed again.
TEST(DnnlTuning, ReadsTheChoicesOfAFullCacheFile) {
  const std::string first = TempCachePath("osprey-tune-choice"), full = TempCachePath("osprey-tune-full");
  setenv("OSPREY_TUNE_CACHE", first.c_str(), 1);
  const Node node = ConvNode({{"pads", Ints({1, 1, 1, 1})}});
  ExpectConv(node, {1, 24, 11, 9}, {40, 24, 3, 3}, true, 4);
  const std::vector<std::string> lines = Lines(first);
  ASSERT_EQ(lines.size(), 1u);
  std::string choice = lines[0];
  // Timed under load (as under ctest -j), the choice is provisional and a later read times it again: made final here.
  if (const size_t at = choice.find(" provisional"); at != std::string::npos) choice.erase(at);
  {
    std::ofstream out(full);
    out << choice << "\n";
    for (int i = 0; i < 30000; ++i) out << "00000000000000000000000000000000 0 filler:line 1\n";  // ~1.5 MB
  }
  setenv("OSPREY_TUNE_CACHE", full.c_str(), 1);
  const osprey::TuningCounts before = osprey::KernelTuningCounts();
  ExpectConv(node, {1, 24, 11, 9}, {40, 24, 3, 3}, true, 4);
  const osprey::TuningCounts after = osprey::KernelTuningCounts();
  EXPECT_EQ(after.timed + after.provisional, before.timed + before.provisional) << "timed again";
  EXPECT_GT(after.cached, before.cached);
  std::filesystem::remove(first);
  std::filesystem::remove(full);
}

TEST(DnnlTuning, IgnoresAHostileCacheFile) {
  const std::string path = TempCachePath("osprey-tune-hostile");
  {
    std::ofstream out(path);
    out << "garbage\n0000000000000000 99999999 x\n\n" << std::string(5000, 'z') << " -1 y\n";
  }
  setenv("OSPREY_TUNE_CACHE", path.c_str(), 1);
  ExpectConv(ConvNode({{"pads", Ints({1, 1, 1, 1})}}), {1, 32, 9, 11}, {48, 32, 3, 3}, true, 5);
  EXPECT_EQ(Lines(path).size(), 5u);  // the four lines written above and the new choice
  std::filesystem::remove(path);
}

TEST(DnnlTuning, FollowsAChangedCacheFile) {
  const std::string first = TempCachePath("osprey-tune-first"), second = TempCachePath("osprey-tune-second");
  setenv("OSPREY_TUNE_CACHE", first.c_str(), 1);
  ExpectConv(ConvNode({{"pads", Ints({1, 1, 1, 1})}}), {1, 24, 7, 9}, {40, 24, 3, 3}, true, 4);
  EXPECT_EQ(Lines(first).size(), 1u);
  setenv("OSPREY_TUNE_CACHE", second.c_str(), 1);
  ExpectConv(ConvNode({{"pads", Ints({1, 1, 1, 1})}}), {1, 24, 7, 9}, {40, 24, 3, 3}, true, 4);
  EXPECT_EQ(Lines(second).size(), 1u) << "the choice is timed again for the new file, not taken from the old one";
  EXPECT_EQ(Lines(first).size(), 1u);
  std::filesystem::remove(first);
  std::filesystem::remove(second);
}

// The own-kernel timing evicts the weights before each run (as a model meets them); the bytes must survive it, at any
// alignment and length, and the bytes around the range must not move.
TEST(DnnlTuning, EvictingFromTheCachesKeepsTheBytes) {
  std::vector<uint8_t> bytes(3 * 4096 + 100);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 7 + 3);
  const std::vector<uint8_t> want = bytes;
  cpu::EvictFromCaches(bytes.data() + 13, 2 * 4096 + 37);  // starts and ends inside cache lines
  cpu::EvictFromCaches(bytes.data(), bytes.size());
  cpu::EvictFromCaches(nullptr, 64);
  cpu::EvictFromCaches(bytes.data(), 0);
  EXPECT_EQ(bytes, want);
}

// Tuning keys hold an activation's channels exactly and its images x pixels by size class (two leading bits), so a
// model with free image dims is not timed again at every size.
TEST(DnnlTuning, SizesOfOneClassShareAChoice) {
  EXPECT_EQ(cpu::TuningActivationKey({1, 32, 4, 4}), "c32x16;");
  EXPECT_EQ(cpu::TuningActivationKey({1, 32, 17, 1}), "c32x16;");
  EXPECT_EQ(cpu::TuningActivationKey({1, 32, 5, 5}), "c32x24;");
  EXPECT_EQ(cpu::TuningActivationKey({1, 32, 31, 1}), "c32x24;");
  EXPECT_EQ(cpu::TuningActivationKey({2, 32, 4, 4}), "c32x32;");
  EXPECT_EQ(cpu::TuningActivationKey({2, 33, 4, 4}), "c33x32;");
  EXPECT_EQ(cpu::TuningActivationKey({3, 7, 3}), "c7x9;");              // 1-D: images x length, exact up to 16
  EXPECT_EQ(cpu::TuningActivationKey({1, 8, 480, 640}), "c8x262144;");  // 307,200 -> 2^18
  EXPECT_EQ(cpu::TuningActivationKey({1, 8, 544, 704}), "c8x262144;");  // 382,976 -> 2^18
  EXPECT_EQ(cpu::TuningActivationKey({1, 8, 736, 736}), "c8x524288;");  // 541,696 -> 2^19
  const std::string path = TempCachePath("osprey-tune-class");
  setenv("OSPREY_TUNE_CACHE", path.c_str(), 1);
  const Node node = ConvNode({{"pads", Ints({1, 1, 1, 1})}});
  ExpectConv(node, {1, 32, 20, 24}, {40, 32, 3, 3}, true, 7);  // 480 pixels: class 384
  ExpectConv(node, {1, 32, 21, 24}, {40, 32, 3, 3}, true, 8);  // 504: class 384, the choice above
  EXPECT_EQ(Lines(path).size(), 1u);
  ExpectConv(node, {1, 32, 40, 24}, {40, 32, 3, 3}, true, 9);  // 960: class 768, timed
  EXPECT_EQ(Lines(path).size(), 2u);
  std::filesystem::remove(path);
}

// A kernel timing itself runs once more than it times (the first run untimed), except that a run of
// kLongTimedRunMs or more is the last and its time the result: a huge layer is run once, not 4 times per round.
TEST(DnnlTuning, RunsALongLayerOnce) {
  int runs = 0;
  const double short_ms = cpu::BestRunMs(3, [&] { ++runs; });
  EXPECT_EQ(runs, 4);
  EXPECT_LT(short_ms, cpu::kLongTimedRunMs);
  runs = 0;
  const auto long_run = std::chrono::milliseconds(static_cast<int>(cpu::kLongTimedRunMs) + 5);
  const double long_ms = cpu::BestRunMs(3, [&] {
    ++runs;
    std::this_thread::sleep_for(long_run);
  });
  EXPECT_EQ(runs, 1);
  EXPECT_GE(long_ms, cpu::kLongTimedRunMs);
  EXPECT_LT(long_ms, 1e30);
}

TEST(DnnlConv, DeclinesRuntimeWeights) {
  Node node = ConvNode({});
  std::vector<Tensor> in{RandomTensor({1, 3, 7, 9}, 1), RandomTensor({5, 3, 3, 3}, 2), RandomTensor({5}, 3)};
  EXPECT_TRUE(FastKernelDeclines(node, in, {false, false, false}));
  EXPECT_FALSE(FastKernelDeclines(node, in, {false, true, false}));  // a run-time bias is fine
}

// Several threads run one kernel at once on different inputs (one compiled plan serving concurrent requests).
// Run state (memories, argument arrays) is lent to one caller at a time: two callers at once get two objects, and a
// returned one is lent again instead of a new one being made.
TEST(PerCaller, LendsOneObjectPerCallerAndReusesReturnedOnes) {
  cpu::PerCaller<int> pool;
  int made = 0;
  auto make = [&made] { return ++made; };
  {
    auto first = pool.Acquire(make);
    auto second = pool.Acquire(make);
    EXPECT_NE(&*first, &*second);
    EXPECT_EQ(made, 2);
  }
  auto again = pool.Acquire(make);
  auto and_again = pool.Acquire(make);
  EXPECT_EQ(made, 2) << "both returned objects are lent again";
  EXPECT_NE(&*again, &*and_again);
  auto third = pool.Acquire(make);
  EXPECT_EQ(*third, 3);
}

TEST(DnnlConv, ConcurrentRunsFromSeveralThreads) {
  Node node = ConvNode(
      {{"pads", Ints({1, 1, 1, 1})}, {"_residual", Attribute::Int(1)}, {"_activation", Attribute::String("Relu")}}, 4);
  const Tensor weight = RandomTensor({16, 13, 3, 3}, 51), bias = RandomTensor({16}, 52);
  constexpr int kThreads = 3;
  std::vector<std::vector<Tensor>> inputs, expected;
  for (int t = 0; t < kThreads; ++t) {
    inputs.push_back({RandomTensor({1, 13, 7, 9}, 60 + t), weight, bias, RandomTensor({1, 16, 7, 9}, 70 + t)});
    expected.push_back(RunReferenceNode(node, inputs.back()));
  }
  std::vector<Tensor> scratch_outputs;
  KernelBuildContext bc = MakeBuildContext(node, inputs[0], {false, true, true, false}, scratch_outputs);
  std::unique_ptr<Kernel> kernel = CreateCpuKernel(bc);
  ASSERT_NE(kernel, nullptr);
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Tensor out(DType::kF32, {1, 16, 7, 9});
      for (int iter = 0; iter < 20; ++iter) {
        KernelContext kc{node};
        for (const Tensor& in : inputs[t]) kc.inputs.push_back(&in);
        kc.outputs.push_back(&out);
        kernel->Run(kc);
        for (int64_t i = 0; i < out.numel(); ++i) {
          float e = expected[t][0].data<float>()[i];
          if (std::fabs(out.data<float>()[i] - e) > kFastAtol + kFastRtol * std::fabs(e)) ++mismatches;
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

}  // namespace
}  // namespace osprey::testing
