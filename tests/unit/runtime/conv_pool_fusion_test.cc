// A first-layer Conv (an image of 1-4 channels) whose output only a MaxPool reads becomes one Conv with the pool fused
// (ops/fused_pool.h, runtime/fusion.cc FuseConvMaxPool), run by osprey's first-layer kernel, which pools the
// convolution's rows in the cache (kernels/cpu/stem_conv.cc). Oracle: the same graph compiled without fusion and with
// reference kernels only (whose Conv and MaxPool are checked against ONNX Runtime elsewhere). The fused node's shape
// rule and reference kernel are checked against the two nodes it replaces.
#include <gtest/gtest.h>

#include <string>

#include "fusion_test_util.h"
#include "osprey/runtime.h"
#include "test_util.h"

namespace osprey {
namespace {

using testing::RandomTensor;
using testing::ScopedEnv;

struct StemSpec {
  int64_t in_c = 3, out_c = 24, kernel = 7, stride = 2, pad = 3;
  std::string activation = "Relu";  // "" for none
  AttributeMap pool{{"kernel_shape", Attribute::Ints({3, 3})},
                    {"strides", Attribute::Ints({2, 2})},
                    {"pads", Attribute::Ints({1, 1, 1, 1})}};
  bool escape = false;   // the convolution's output is a graph output too
  bool indices = false;  // MaxPool's Indices are asked for
  bool nhwc = false;     // the image comes as [N, H, W, C] and is transposed (a tf2onnx export)
};

// x -> Conv (-> activation) -> MaxPool -> 1x1 Conv (so channels-last maps throughout).
Graph StemGraph(const StemSpec& spec, int64_t batch, int64_t size) {
  GraphBuilder b("conv_pool", 13);
  ValueRef x = spec.nhwc ? b.Op("Transpose", {b.Input("x", DType::kF32, {batch, size, size, spec.in_c})},
                                {{"perm", Attribute::Ints({0, 3, 1, 2})}})
                         : b.Input("x", DType::kF32, {batch, spec.in_c, size, size});
  ValueRef y = b.Op("Conv",
                    {x, b.Constant(RandomTensor({spec.out_c, spec.in_c, spec.kernel, spec.kernel}, 1, -0.3f, 0.3f)),
                     b.Constant(RandomTensor({spec.out_c}, 2))},
                    {{"strides", Attribute::Ints({spec.stride, spec.stride})},
                     {"pads", Attribute::Ints({spec.pad, spec.pad, spec.pad, spec.pad})}});
  if (!spec.activation.empty()) y = b.Op(spec.activation, {y});
  ValueRef pooled;
  if (spec.indices) {
    const std::vector<ValueRef> outs = b.OpMulti("MaxPool", {y}, 2, spec.pool);
    pooled = outs[0];
    b.Output(outs[1], "indices");
  } else {
    pooled = b.Op("MaxPool", {y}, spec.pool);
  }
  pooled = b.Op("Conv", {pooled, b.Constant(RandomTensor({8, spec.out_c, 1, 1}, 3, -0.3f, 0.3f))});
  b.Output(pooled, "y");
  if (spec.escape) b.Output(y, "conv");
  return b.Finish();
}

// The fast plan's kernel for the first convolution, and how many MaxPool steps it kept.
struct Steps {
  std::string stem_kernel;
  size_t pools = 0;
};

Steps RunAgainstOracle(const StemSpec& spec, int64_t batch = 2, int64_t size = 37) {
  Steps s;
  const Shape x = spec.nhwc ? Shape{batch, size, size, spec.in_c} : Shape{batch, spec.in_c, size, size};
  for (const OpProfile& p : testing::RunFastAgainstOracle(StemGraph(spec, batch, size), x)) {
    if (p.op_type == "Conv" && s.stem_kernel.empty()) s.stem_kernel = p.kernel;
    s.pools += p.op_type == "MaxPool";
  }
  return s;
}

bool HasStemKernel() {
  return __builtin_cpu_supports("avx512f") || (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"));
}

TEST(FuseConvMaxPool, FirstLayersPoolTheirRowsInCache) {
  if (!HasStemKernel()) GTEST_SKIP() << "osprey's first-layer kernel needs AVX-512 or AVX2 with FMA";
  ScopedEnv always("OSPREY_STEM", "1");  // fused wherever the kernel applies (else timed against oneDNN: below)
  const AttributeMap ceil_uneven{{"kernel_shape", Attribute::Ints({3, 2})},
                                 {"strides", Attribute::Ints({2, 3})},
                                 {"pads", Attribute::Ints({0, 1, 1, 0})},
                                 {"ceil_mode", Attribute::Int(1)}};
  const AttributeMap same_upper{{"kernel_shape", Attribute::Ints({3, 3})},
                                {"strides", Attribute::Ints({2, 2})},
                                {"auto_pad", Attribute::String("SAME_UPPER")}};
  const AttributeMap overlapping{{"kernel_shape", Attribute::Ints({5, 5})}, {"strides", Attribute::Ints({1, 1})}};
  for (const StemSpec& spec : {
           StemSpec{},
           StemSpec{.nhwc = true},  // Keras' ResNet via tf2onnx // ResNet: 7x7/2, 3x3/2 pad 1
           StemSpec{.out_c = 96, .pad = 0, .pool = ceil_uneven},                       // SqueezeNet's 96: 64 + 32
           StemSpec{.in_c = 1, .out_c = 13, .kernel = 3, .pad = 1, .activation = ""},  // channels not a multiple of 16
           StemSpec{.in_c = 4, .out_c = 64, .kernel = 3, .stride = 1, .pad = 1, .pool = same_upper},
           StemSpec{.out_c = 32, .kernel = 3, .pad = 1, .activation = "Tanh", .pool = overlapping},
       }) {
    SCOPED_TRACE(std::to_string(spec.in_c) + " -> " + std::to_string(spec.out_c) + " " + spec.activation);
    for (int64_t batch : {1, 3}) {
      const Steps s = RunAgainstOracle(spec, batch);
      EXPECT_EQ(s.pools, 0u);
      EXPECT_EQ(s.stem_kernel, "ConvF32Stem");
    }
    ScopedEnv off("OSPREY_FUSE_CONV_POOL", "0");
    EXPECT_EQ(RunAgainstOracle(spec).pools, 1u);
  }
}

// When tuning, the fused kernel is timed against oneDNN's convolution and pool (CpuConvFusesPool): either plan agrees
// with the oracle; a fused plan runs it on the first-layer kernel, an unfused one keeps its pool.
TEST(FuseConvMaxPool, TimedAgainstOneDnnWhenTuning) {
  if (!HasStemKernel()) GTEST_SKIP() << "osprey's first-layer kernel needs AVX-512 or AVX2 with FMA";
  for (int64_t batch : {1, 4}) {
    const Steps s = RunAgainstOracle(StemSpec{.out_c = 64}, batch, 61);
    if (s.pools == 0)
      EXPECT_EQ(s.stem_kernel, "ConvF32Stem");
    else
      EXPECT_EQ(s.pools, 1u);
  }
}

TEST(FuseConvMaxPool, StaysWhereThePoolIsNotTheConvolutionsAlone) {
  if (!HasStemKernel()) GTEST_SKIP() << "osprey's first-layer kernel needs AVX-512 or AVX2 with FMA";
  const AttributeMap dilated{{"kernel_shape", Attribute::Ints({3, 3})},
                             {"strides", Attribute::Ints({2, 2})},
                             {"dilations", Attribute::Ints({2, 2})}};
  // The convolution's output read elsewhere too; Indices asked for; a dilated pool; a layer of 16 input channels
  // (not a first layer: oneDNN's kernel, its own pool).
  for (const StemSpec& spec :
       {StemSpec{.escape = true}, StemSpec{.indices = true}, StemSpec{.pool = dilated}, StemSpec{.in_c = 16}}) {
    SCOPED_TRACE(std::to_string(spec.in_c));
    EXPECT_EQ(RunAgainstOracle(spec).pools, 1u);
  }
}

// The fused node in a model file (as the fusion writes it) runs on the reference kernel with the shape rule's output:
// the same as its two parts.
TEST(FuseConvMaxPool, FusedNodeShapeAndReferenceMatchItsParts) {
  const Tensor w = RandomTensor({16, 3, 5, 5}, 4, -0.3f, 0.3f);
  GraphBuilder b("fused", 13);
  auto x = b.Input("x", DType::kF32, {2, 3, 29, 31});
  b.Output(b.Op("Conv", {x, b.Constant(w)},
                {{"strides", Attribute::Ints({2, 2})},
                 {"_activation", Attribute::String("Relu")},
                 {"_pool_kernel", Attribute::Ints({3, 3})},
                 {"_pool_strides", Attribute::Ints({2, 2})},
                 {"_pool_pads", Attribute::Ints({1, 0, 1, 1})},
                 {"_pool_ceil", Attribute::Int(1)}}),
           "y");
  GraphBuilder p("parts", 13);
  auto px = p.Input("x", DType::kF32, {2, 3, 29, 31});
  p.Output(p.Op("MaxPool", {p.Op("Relu", {p.Op("Conv", {px, p.Constant(w)}, {{"strides", Attribute::Ints({2, 2})}})})},
                {{"kernel_shape", Attribute::Ints({3, 3})},
                 {"strides", Attribute::Ints({2, 2})},
                 {"pads", Attribute::Ints({1, 0, 1, 1})},
                 {"ceil_mode", Attribute::Int(1)}}),
           "y");
  const Tensor in = RandomTensor({2, 3, 29, 31}, 5, -2.f, 2.f);
  const std::vector<TensorSpec> specs{{DType::kF32, {2, 3, 29, 31}}};
  const Tensor want = Compile(p.Finish(), specs, testing::kOracle)->Run({in})[0];
  const Tensor got = Compile(b.Finish(), specs, testing::kOracle)->Run({in})[0];
  EXPECT_EQ(got.shape(), want.shape());
  testing::ExpectTensorNear(got, want, 1e-5f, 1e-5f);
  // Written so in a model file and followed by a batch normalisation of negative scales, in a fast plan: the
  // normalisation is not folded into the convolution (through the pool a max would become a min), and no kernel
  // that does not pool takes the node.
  GraphBuilder bn("fused_bn", 13);
  auto bnx = bn.Input("x", DType::kF32, {2, 3, 29, 31});
  auto pooled = bn.Op("Conv", {bnx, bn.Constant(w)},
                      {{"strides", Attribute::Ints({2, 2})},
                       {"_pool_kernel", Attribute::Ints({3, 3})},
                       {"_pool_strides", Attribute::Ints({2, 2})}});
  const Tensor scale = RandomTensor({16}, 7, -2.f, -0.5f), shift = RandomTensor({16}, 8);
  const Tensor var = RandomTensor({16}, 9, 0.5f, 2.f);
  bn.Output(bn.Op("BatchNormalization",
                  {pooled, bn.Constant(scale), bn.Constant(shift), bn.Constant(shift), bn.Constant(var)}),
            "y");
  const Graph with_bn = bn.Finish();
  testing::ExpectTensorNear(Compile(with_bn, specs, testing::kFast)->Run({in})[0],
                            Compile(with_bn, specs, testing::kOracle)->Run({in})[0], 1e-4f, 1e-4f);
  // A fused pool needs a 2-D convolution.
  GraphBuilder bad("bad", 13);
  auto bx = bad.Input("x", DType::kF32, {2, 3, 29});
  bad.Output(
      bad.Op("Conv", {bx, bad.Constant(RandomTensor({16, 3, 5}, 4))}, {{"_pool_kernel", Attribute::Ints({3, 3})}}),
      "y");
  testing::ExpectCompileError(bad.Finish(), {{DType::kF32, {2, 3, 29}}}, "_pool_kernel");
}

}  // namespace
}  // namespace osprey
