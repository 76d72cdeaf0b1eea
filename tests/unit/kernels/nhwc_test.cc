// Channels-last (NHWC) support of the fast CPU kernels: Conv, ConvTranspose, pools, BatchNormalization, group norms,
// Resize and the layout reorder.
// Oracle: the reference kernel on plain tensors. The test converts plain inputs to NHWC with its own index loop,
// runs the fast kernel with the layouts the runtime's layout pass would ask for, converts the output back with the
// inverse loop and compares. A kNhwc tensor is handed over as the runtime does: with its physical shape [N, H, W, C]
// ([N, D, H, W, C] at rank 5).
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <sstream>
#include <thread>

#include "kernel_test_util.h"
#include "kernels/cpu/dnnl_conv.h"

namespace osprey::testing {
namespace {

Attribute Ints(std::vector<int64_t> v) { return Attribute::Ints(std::move(v)); }

const char* LayoutName(Layout layout) { return layout == Layout::kNhwc ? "nhwc" : "plain"; }

// Plain [N, C, spatial...] -> a tensor of physical shape [N, spatial..., C] (rank 4: [N, H, W, C]; rank 5:
// [N, D, H, W, C]).
Tensor ToNhwc(const Tensor& plain) {
  const Shape& s = plain.shape();
  const int64_t n = s[0], c = s[1], pixels = plain.numel() / (n * c);
  Shape physical{n};
  physical.insert(physical.end(), s.begin() + 2, s.end());
  physical.push_back(c);
  Tensor out(DType::kF32, physical);
  const float* src = plain.data<float>();
  float* dst = out.data<float>();
  for (int64_t in = 0; in < n; ++in)
    for (int64_t ic = 0; ic < c; ++ic)
      for (int64_t p = 0; p < pixels; ++p) dst[(in * pixels + p) * c + ic] = src[(in * c + ic) * pixels + p];
  return out;
}

// Physical [N, spatial..., C] -> plain [N, C, spatial...].
Tensor FromNhwc(const Tensor& nhwc) {
  const Shape& s = nhwc.shape();
  const int64_t n = s[0], c = s.back(), pixels = nhwc.numel() / (n * c);
  Shape logical{n, c};
  logical.insert(logical.end(), s.begin() + 1, s.end() - 1);
  Tensor out(DType::kF32, logical);
  const float* src = nhwc.data<float>();
  float* dst = out.data<float>();
  for (int64_t in = 0; in < n; ++in)
    for (int64_t ic = 0; ic < c; ++ic)
      for (int64_t p = 0; p < pixels; ++p) dst[(in * c + ic) * pixels + p] = src[(in * pixels + p) * c + ic];
  return out;
}

Tensor NanTensor(const Shape& shape) {
  Tensor t(DType::kF32, shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = std::numeric_limits<float>::quiet_NaN();
  return t;
}

// A NaN-filled output at the front of a buffer whose last kGuardFloats floats hold kGuardValue: a kernel writing past
// its output changes them (ExpectGuardIntact).
constexpr int64_t kGuardFloats = 64;
constexpr float kGuardValue = 12345.f;

Tensor GuardedNanTensor(const Shape& shape) {
  Tensor whole = NanTensor({NumElements(shape) + kGuardFloats});
  for (int64_t i = 0; i < kGuardFloats; ++i) whole.data<float>()[NumElements(shape) + i] = kGuardValue;
  return Tensor::View(DType::kF32, shape, whole.buffer(), 0);
}

void ExpectGuardIntact(const Tensor& t) {
  const float* past = t.data<float>() + t.numel();
  for (int64_t i = 0; i < kGuardFloats; ++i) ASSERT_EQ(past[i], kGuardValue) << "written past the output, float " << i;
}

Shape Physical(const Shape& s, Layout layout) {
  if (layout == Layout::kPlain) return s;
  Shape r{s[0]};
  r.insert(r.end(), s.begin() + 2, s.end());
  r.push_back(s[1]);
  return r;
}

// Builds the fast kernel for input 0 / residual (input 3) / output 0 in the given layouts, runs it twice on
// converted tensors and compares with the reference kernel on the plain ones.
void ExpectLayoutsMatchReference(const Node& node, const std::vector<Tensor>& inputs, const std::vector<bool>& constant,
                                 const std::string& expected_name, Layout in0, Layout out0,
                                 Layout in3 = Layout::kPlain, float atol = kFastAtol) {
  SCOPED_TRACE(std::string("input ") + LayoutName(in0) + ", output " + LayoutName(out0) +
               (node.op_type == "Conv" && inputs.size() > 3 ? std::string(", residual ") + LayoutName(in3) : ""));
  std::vector<Tensor> expected = RunReferenceNode(node, inputs);
  std::vector<Tensor> outputs;
  KernelBuildContext bc = MakeBuildContext(node, inputs, constant, outputs);
  bc.input_layouts.assign(inputs.size(), Layout::kPlain);
  bc.input_layouts[0] = in0;
  if (node.op_type == "Conv" && inputs.size() > 3) bc.input_layouts[3] = in3;
  bc.output_layouts.assign(outputs.size(), Layout::kPlain);
  bc.output_layouts[0] = out0;
  EXPECT_TRUE(CpuKernelSupportsNhwc(bc));
  std::unique_ptr<Kernel> kernel = CreateCpuKernel(bc);
  ASSERT_NE(kernel, nullptr);
  EXPECT_EQ(std::string(kernel->Name()), expected_name);

  // Run 1 reads other buffers holding other values (the run-time float inputs scaled by -0.5) and writes a fresh
  // output: a kernel keeping a buffer of its first run fails.
  const Shape logical = expected[0].shape();
  for (int run = 0; run < 2; ++run) {
    SCOPED_TRACE("run " + std::to_string(run));
    const std::vector<Tensor> logical_inputs = run == 0 ? inputs : OtherRuntimeInputs(inputs, constant);
    const std::vector<Tensor> want = run == 0 ? expected : RunReferenceNode(node, logical_inputs);
    std::vector<Tensor> run_inputs = logical_inputs;
    if (in0 == Layout::kNhwc) run_inputs[0] = ToNhwc(logical_inputs[0]);
    if (node.op_type == "Conv" && inputs.size() > 3 && in3 == Layout::kNhwc)
      run_inputs[3] = ToNhwc(logical_inputs[3]);
    std::vector<Tensor> run_outputs{GuardedNanTensor(Physical(logical, out0))};
    RunKernel(*kernel, node, run_inputs, run_outputs);
    ExpectGuardIntact(run_outputs[0]);
    Tensor got = out0 == Layout::kNhwc ? FromNhwc(run_outputs[0]) : run_outputs[0];
    ExpectTensorNear(got, want[0], kFastRtol, atol);
  }
}

constexpr Layout kBoth[] = {Layout::kPlain, Layout::kNhwc};

// Every combination of layouts on input 0 and output 0 (all plain included: the unchanged path).
void ExpectEveryLayout(const Node& node, const std::vector<Tensor>& inputs, const std::vector<bool>& constant,
                       const std::string& expected_name) {
  for (Layout in0 : kBoth)
    for (Layout out0 : kBoth) ExpectLayoutsMatchReference(node, inputs, constant, expected_name, in0, out0);
}

// ---- ConvTranspose on oneDNN's deconvolution: every layout combination, as for Conv.
void ExpectConvTransposeEveryLayout(AttributeMap attrs, const Shape& x, const Shape& w, bool bias, uint32_t seed) {
  Node node = MakeNode("ConvTranspose", bias ? 3 : 2, 1, std::move(attrs));
  std::vector<Tensor> in{RandomTensor(x, seed), RandomTensor(w, seed + 1)};
  if (bias) in.push_back(RandomTensor({w[1] * node.GetInt("group", 1)}, seed + 2));
  ExpectEveryLayout(node, in, {false, true, true}, "ConvTransposeF32Dnnl");
}

TEST(NhwcConvTranspose, TwoByTwoStrideTwoAsPaddleOcrUpsamples) {
  ExpectConvTransposeEveryLayout({{"strides", Ints({2, 2})}}, {1, 8, 5, 6}, {8, 6, 2, 2}, true, 11);
}

TEST(NhwcConvTranspose, ThreeByThreeStrideTwoPadsOutputPaddingTwoGroups) {
  ExpectConvTransposeEveryLayout({{"strides", Ints({2, 2})}, {"pads", Ints({1, 1, 1, 1})},
                                  {"output_padding", Ints({1, 1})}, {"group", Attribute::Int(2)}},
                                 {2, 4, 5, 5}, {4, 3, 3, 3}, true, 12);
}

TEST(NhwcConvTranspose, DilatedAsymmetricPadsNoBias) {
  ExpectConvTransposeEveryLayout({{"dilations", Ints({2, 2})}, {"pads", Ints({0, 1, 1, 0})}}, {1, 5, 6, 7},
                                 {5, 7, 3, 3}, false, 13);
}

// 3-D U-Nets upsample with ConvTranspose3d (nnU-Net, Keras Conv3DTranspose): NDHWC in and out.
TEST(NhwcConvTranspose, ThreeDimensionalStrideTwo) {
  ExpectConvTransposeEveryLayout({{"strides", Ints({2, 2, 2})}}, {1, 8, 3, 5, 4}, {8, 6, 2, 2, 2}, true, 14);
  ExpectConvTransposeEveryLayout({{"strides", Ints({1, 2, 2})}, {"pads", Ints({1, 1, 1, 1, 1, 1})}}, {2, 4, 3, 4, 5},
                                 {4, 5, 3, 3, 3}, false, 15);
}

TEST(NhwcConvTranspose, OneDimensionalPlainAndDeclinedCases) {
  Node node = MakeNode("ConvTranspose", 3, 1, {{"strides", Ints({3})}, {"pads", Ints({1, 2})}});
  ExpectFastMatchesReference(node, {RandomTensor({2, 4, 9}, 21), RandomTensor({4, 5, 4}, 22), RandomTensor({5}, 23)},
                             {false, true, true}, "ConvTransposeF32Dnnl");
  // Weights computed at run time, or output_shape growing the result past the full extent (a negative crop).
  Node plain = MakeNode("ConvTranspose", 2, 1, {{"strides", Ints({2, 2})}});
  EXPECT_TRUE(
      FastKernelDeclines(plain, {RandomTensor({1, 3, 4, 4}, 1), RandomTensor({3, 2, 2, 2}, 2)}, {false, false}));
  Node grown = MakeNode("ConvTranspose", 2, 1, {{"strides", Ints({2, 2})}, {"output_shape", Ints({10, 10})}});
  EXPECT_TRUE(FastKernelDeclines(grown, {RandomTensor({1, 3, 4, 4}, 1), RandomTensor({3, 2, 2, 2}, 2)}, {false, true}));
}

// ---- Resize / Upsample: they follow their input's layout (plain -> plain, channels-last -> channels-last).
Tensor Floats(std::vector<float> v) { return Tensor::FromVector<float>({static_cast<int64_t>(v.size())}, v); }
Tensor Int64s(std::vector<int64_t> v) { return Tensor::FromVector<int64_t>({static_cast<int64_t>(v.size())}, v); }

// The fast kernel of a node whose kernel follows its input's layout, in both layouts (channels-last only when
// `follows`), against the reference kernel: input 0 is data, the rest constants; the output starts as NaN (float32)
// or 0xA5 bytes, so an element the kernel forgets shows. `tolerance` < 0: bit for bit.
void ExpectFollowingKernelMatchesReference(const Node& node, const std::vector<Tensor>& inputs, int opset, bool follows,
                                           const std::string& name, float tolerance) {
  std::vector<bool> constant(inputs.size(), true);
  constant[0] = false;
  std::vector<Tensor> expected = RunReferenceNode(node, inputs, opset);
  for (Layout layout : kBoth) {
    SCOPED_TRACE(LayoutName(layout));
    std::vector<Tensor> outputs;
    KernelBuildContext bc = MakeBuildContext(node, inputs, constant, outputs, opset);
    EXPECT_EQ(CpuKernelFollowsNhwc(bc), follows);
    if (layout == Layout::kNhwc && !follows) continue;
    bc.input_layouts.assign(inputs.size(), Layout::kPlain);
    bc.input_layouts[0] = layout;
    bc.output_layouts = {layout};
    std::unique_ptr<Kernel> kernel = CreateCpuKernel(bc);
    ASSERT_NE(kernel, nullptr);
    EXPECT_EQ(std::string(kernel->Name()), layout == Layout::kNhwc ? name + "Nhwc" : name);
    std::vector<Tensor> run_inputs = inputs;
    if (layout == Layout::kNhwc) run_inputs[0] = ToNhwc(inputs[0]);
    const Shape physical = Physical(expected[0].shape(), layout);
    Tensor out = expected[0].dtype() == DType::kF32 ? NanTensor(physical) : Tensor(expected[0].dtype(), physical);
    if (expected[0].dtype() != DType::kF32) std::memset(out.raw(), 0xA5, out.nbytes());
    std::vector<Tensor> run_outputs{out};
    RunKernel(*kernel, node, run_inputs, run_outputs, opset);
    const Tensor got = layout == Layout::kNhwc ? FromNhwc(run_outputs[0]) : run_outputs[0];
    ASSERT_EQ(got.shape(), expected[0].shape());
    if (tolerance < 0)
      EXPECT_EQ(std::memcmp(got.raw(), expected[0].raw(), got.nbytes()), 0);
    else
      ExpectTensorNear(got, expected[0], tolerance, tolerance);
  }
}

// `rest`: the node's inputs after X (roi, scales, sizes; a default Tensor where omitted), all constant.
void ExpectResizeMatchesReference(const Node& node, const Shape& x, std::vector<Tensor> rest, int opset = 17) {
  std::vector<Tensor> inputs{RandomTensor(x, 7)};
  for (Tensor& t : rest) inputs.push_back(std::move(t));
  ExpectFollowingKernelMatchesReference(node, inputs, opset, true, "ResizeF32", 1e-5f);
}

Node ResizeNode(AttributeMap attrs) { return MakeNode("Resize", 4, 1, std::move(attrs)); }
Attribute Str(const char* s) { return Attribute::String(s); }

TEST(Resize, NearestAsymmetricFloorTwiceAsPaddleFpnExports) {
  ExpectResizeMatchesReference(
      ResizeNode({{"mode", Str("nearest")}, {"coordinate_transformation_mode", Str("asymmetric")},
                  {"nearest_mode", Str("floor")}}),
      {1, 5, 7, 9}, {Tensor(), Floats({1, 1, 2, 2}), Tensor()});
}

TEST(Resize, NearestHalfPixelToSizesShrinkingHGrowingW) {
  ExpectResizeMatchesReference(ResizeNode({{"mode", Str("nearest")}}), {2, 3, 11, 5},
                               {Tensor(), Tensor(), Int64s({2, 3, 4, 13})});
}

TEST(Resize, LinearHalfPixelTwice) {
  ExpectResizeMatchesReference(ResizeNode({{"mode", Str("linear")}}), {2, 3, 6, 5},
                               {Tensor(), Floats({1, 1, 2, 2}), Tensor()});
}

TEST(Resize, LinearAlignCornersAndPytorchHalfPixelDownscale) {
  ExpectResizeMatchesReference(
      ResizeNode({{"mode", Str("linear")}, {"coordinate_transformation_mode", Str("align_corners")}}), {1, 4, 5, 6},
      {Tensor(), Tensor(), Int64s({1, 4, 11, 3})});
  ExpectResizeMatchesReference(
      ResizeNode({{"mode", Str("linear")}, {"coordinate_transformation_mode", Str("pytorch_half_pixel")}}),
      {1, 4, 9, 7}, {Tensor(), Tensor(), Int64s({1, 4, 3, 1})});
}

TEST(Resize, CubicExcludeOutside) {
  ExpectResizeMatchesReference(
      ResizeNode({{"mode", Str("cubic")}, {"cubic_coeff_a", Attribute::Float(-0.5f)},
                  {"exclude_outside", Attribute::Int(1)}}),
      {1, 3, 5, 4}, {Tensor(), Tensor(), Int64s({1, 3, 9, 7})});
}

TEST(Resize, UpsampleOpset9Nearest) {
  ExpectResizeMatchesReference(MakeNode("Upsample", 2, 1, {{"mode", Str("nearest")}}), {1, 2, 3, 4},
                               {Floats({1, 1, 2, 3})}, 9);
}

TEST(Resize, RandomConfigurationsMatchTheReference) {
  // 300 random modes, coordinate transformations, rounding modes, cubic coefficients and sizes (up, down, 1), in both
  // layouts: whatever the fast kernel takes must equal the reference.
  const char* modes[] = {"nearest", "linear", "cubic"};
  const char* coords[] = {"half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel", "tf_half_pixel_for_nn",
                          "half_pixel_symmetric"};
  const char* rounding[] = {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"};
  uint32_t s = 12345;
  auto next = [&s](uint32_t n) {
    s ^= s << 13;
    s ^= s >> 17;
    s ^= s << 5;
    return s % n;
  };
  int taken = 0;
  for (int i = 0; i < 300; ++i) {
    const std::string mode = modes[next(3)], coord = coords[next(6)];
    if (coord == "tf_half_pixel_for_nn" && mode != "nearest") continue;  // defined for nearest only
    AttributeMap attrs{{"mode", Str(mode.c_str())},
                       {"coordinate_transformation_mode", Str(coord.c_str())},
                       {"nearest_mode", Str(rounding[next(4)])},
                       {"cubic_coeff_a", Attribute::Float(next(2) ? -0.75f : -0.5f)},
                       {"exclude_outside", Attribute::Int(next(2))}};
    const Shape x{1 + next(2), 1 + next(4), 1 + next(9), 1 + next(9)};
    std::vector<Tensor> rest;
    if (next(2)) {
      rest = {Tensor(), Tensor(), Int64s({x[0], x[1], 1 + next(13), 1 + next(13)})};
    } else {
      const float scales[] = {0.5f, 0.75f, 1.f, 1.5f, 2.f, 3.f, 0.34f};
      rest = {Tensor(), Floats({1, 1, scales[next(7)], scales[next(7)]}), Tensor()};
    }
    Node node = ResizeNode(attrs);
    SCOPED_TRACE("case " + std::to_string(i) + ": " + mode + " " + coord + " x " + ShapeToString(x));
    std::vector<Tensor> probe_in{RandomTensor(x, 1)};
    for (const Tensor& t : rest) probe_in.push_back(t);
    if (FastKernelDeclines(node, probe_in, {false, true, true, true})) continue;
    ExpectResizeMatchesReference(node, x, rest);
    ++taken;
  }
  EXPECT_GT(taken, 200) << "the fast kernel should take most of these";
}

// Rank 5 (3-D U-Nets' trilinear upsampling, video models' temporal resizes), plain and NDHWC.
TEST(Resize, ThreeDimensionalMatchesTheReference) {
  const auto expect = [](const Node& node, const Shape& x, std::vector<Tensor> rest) {
    std::vector<Tensor> inputs{RandomTensor(x, 7)};
    for (Tensor& t : rest) inputs.push_back(std::move(t));
    ExpectFollowingKernelMatchesReference(node, inputs, 17, /*follows=*/true, "ResizeF32", 1e-5f);
  };
  expect(ResizeNode({{"mode", Str("linear")}}), {1, 3, 4, 5, 6}, {Tensor(), Floats({1, 1, 2, 2, 2}), Tensor()});
  expect(ResizeNode({{"mode", Str("nearest")},
                     {"coordinate_transformation_mode", Str("asymmetric")},
                     {"nearest_mode", Str("floor")}}),
         {2, 2, 3, 4, 5}, {Tensor(), Floats({1, 1, 2, 2, 2}), Tensor()});
  expect(ResizeNode({{"mode", Str("linear")}, {"coordinate_transformation_mode", Str("align_corners")}}),
         {1, 2, 7, 3, 4}, {Tensor(), Tensor(), Int64s({1, 2, 3, 8, 4})});  // D shrinks, W kept
  expect(ResizeNode({{"mode", Str("cubic")}, {"exclude_outside", Attribute::Int(1)}}), {1, 2, 5, 4, 6},
         {Tensor(), Tensor(), Int64s({1, 2, 9, 7, 3})});  // 4 x 4 taps per output row
  // Rows shared by the threads: a U-Net-sized upsampling.
  expect(ResizeNode({{"mode", Str("linear")}}), {1, 8, 6, 12, 12}, {Tensor(), Floats({1, 1, 2, 2, 2}), Tensor()});
}

TEST(Resize, DeclinedWhereTheReferenceRuns) {
  // Batch or channels resized, tf_crop_and_resize, or scales computed at run time: the reference kernel.
  const Shape x{2, 3, 4, 4};
  EXPECT_TRUE(FastKernelDeclines(ResizeNode({}), {RandomTensor(x, 1), Tensor(), Floats({1, 2, 2, 2}), Tensor()},
                                 {false, true, true, true}));
  EXPECT_TRUE(FastKernelDeclines(
      ResizeNode({{"coordinate_transformation_mode", Str("tf_crop_and_resize")}}),
      {RandomTensor(x, 1), Floats({0, 0, 0, 0, 1, 1, 1, 1}), Floats({1, 1, 2, 2}), Tensor()},
      {false, true, true, true}));
  EXPECT_TRUE(FastKernelDeclines(ResizeNode({}), {RandomTensor(x, 1), Tensor(), Floats({1, 1, 2, 2}), Tensor()},
                                 {false, true, false, true}));
}

// ---- Pad (constant, compile-time pads): plain for any dtype and rank; rank-4 float32 padded along H and W only also
// follows channels-last. Exact copies, so compared bit for bit with the reference kernel.
void ExpectPadMatchesReference(const Node& node, const Tensor& x, std::vector<Tensor> rest, int opset, bool follows) {
  std::vector<Tensor> inputs{x};
  for (Tensor& t : rest) inputs.push_back(std::move(t));
  ExpectFollowingKernelMatchesReference(node, inputs, opset, follows, "PadConstant", -1.f);
}

Node PadNode(int inputs, AttributeMap attrs = {}) { return MakeNode("Pad", inputs, 1, std::move(attrs)); }

TEST(Pad, SpatialPadsFollowChannelsLast) {
  // TF "same" padding before a stride-2 MaxPool (bottom/right only) and ResNetV2's stem (1 on every side), zero and
  // non-zero fill, axes given negative (opset 18).
  ExpectPadMatchesReference(PadNode(2), RandomTensor({2, 5, 7, 6}, 1), {Int64s({0, 0, 0, 0, 0, 0, 1, 1})}, 17, true);
  ExpectPadMatchesReference(PadNode(3), RandomTensor({1, 3, 4, 9}, 2),
                            {Int64s({0, 0, 1, 2, 0, 0, 3, 0}), Floats({1.5f})}, 17, true);
  ExpectPadMatchesReference(PadNode(4), RandomTensor({1, 4, 5, 5}, 3), {Int64s({2, 1, 0, 2}), Floats({-2.f}),
                            Int64s({-1, -2})}, 18, true);
}

TEST(Pad, PlainAnyRankDtypeAndAxis) {
  // Batch and channels padded (plain only), rank 3 and 1, int64 and uint8, the opset 2 attribute form.
  ExpectPadMatchesReference(PadNode(2), RandomTensor({2, 3, 4, 5}, 4), {Int64s({1, 2, 0, 1, 0, 1, 2, 0})}, 17, false);
  ExpectPadMatchesReference(PadNode(3), Tensor::FromVector<int64_t>({2, 3, 2}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}),
                            {Int64s({1, 0, 2, 0, 3, 1}), Int64s({-7})}, 13, false);
  ExpectPadMatchesReference(PadNode(2), Tensor::FromVector<uint8_t>({5}, {1, 2, 3, 4, 5}), {Int64s({3, 2})}, 13, false);
  ExpectPadMatchesReference(PadNode(1, {{"pads", Attribute::Ints({0, 1, 1, 0})}, {"value", Attribute::Float(0.25f)}}),
                            RandomTensor({3, 4}, 5), {}, 2, false);
  ExpectPadMatchesReference(PadNode(2), RandomTensor({1, 2, 3, 3}, 6), {Int64s({0, 0, 0, 0, 0, 0, 0, 0})}, 17, true);
}

TEST(Pad, EdgeReflectAndWrapCopyRowsThroughIndexTables) {
  // PadIndexed: every mode on every axis, pads longer than the axis (reflect and wrap repeat, as numpy.pad does), an
  // axis of one element, int64 and uint8, and Whisper's front end (a long row reflected 200 at each end: parallel rows
  // are one, the middle one memcpy).
  for (const char* mode : {"edge", "reflect", "wrap"}) {
    SCOPED_TRACE(mode);
    const Node node = PadNode(2, {{"mode", Str(mode)}});
    ExpectFastMatchesReference(node, {RandomTensor({2, 3, 4, 5}, 10), Int64s({1, 0, 2, 3, 0, 2, 1, 7})}, {false, true},
                               "PadIndexed");
    ExpectFastMatchesReference(node, {RandomTensor({3, 1, 2}, 11), Int64s({0, 2, 3, 1, 1, 4})}, {false, true},
                               "PadIndexed");
    ExpectFastMatchesReference(node, {RandomTensor({1, 480000}, 12), Int64s({0, 200, 0, 200})}, {false, true},
                               "PadIndexed");
    ExpectFastMatchesReference(node, {RandomTensor({300, 400}, 13), Int64s({2, 1, 3, 4})}, {false, true},
                               "PadIndexed");  // many rows: in parallel
    ExpectFastMatchesReference(node, {Tensor::FromVector<int64_t>({2, 3}, {1, 2, 3, 4, 5, 6}), Int64s({1, 2, 0, 4})},
                               {false, true}, "PadIndexed");
    ExpectFastMatchesReference(node, {Tensor::FromVector<uint8_t>({4}, {7, 8, 9, 10}), Int64s({6, 5})}, {false, true},
                               "PadIndexed");
  }
  // Negative pads crop first, then the rest pads the cropped region: crops on either side and on outer axes in
  // every mode (constant with a fill value too), and onnx-asr's Kaldi front end (a row shifted by one sample, pads
  // [0, 1, 0, -1], edge).
  for (const char* mode : {"constant", "edge", "reflect", "wrap"}) {
    SCOPED_TRACE(mode);
    const Node node = PadNode(3, {{"mode", Str(mode)}});
    ExpectFastMatchesReference(node, {RandomTensor({3, 4, 6}, 14), Int64s({-1, 2, -2, 1, -1, 3}), Floats({0.5f})},
                               {false, true, true}, "PadIndexed");
    ExpectFastMatchesReference(node, {RandomTensor({1, 16000}, 15), Int64s({0, 1, 0, -1}), Floats({0.f})},
                               {false, true, true}, "PadIndexed");
    ExpectFastMatchesReference(node, {RandomTensor({400, 300}, 16), Int64s({-3, -2, 5, 1}), Floats({-1.f})},
                               {false, true, true}, "PadIndexed");  // many rows: in parallel
  }
  // The values, each checked against numpy.pad or ONNX Runtime 1.32's Pad: reflect [1 2 3] by 4 and 3 -> [1 2 3 2 |
  // 1 2 3 | 2 1 2] (mirrored, repeated); with crops, on [1 2 3 4]: wrap (1, -1) -> [3 1 2 3] (the cropped [1 2 3]
  // wrapped), edge (1, -1) -> [1 1 2 3], reflect (-1, 2) -> [2 3 4 3 2], reflect (2, -1) -> [3 2 1 2 3], constant
  // (-2, 3) -> [3 4 0 0 0], wrap (-1, 5) -> [2 3 4 2 3 4 2 3].
  auto padded = [](const char* mode, std::vector<float> x, std::vector<int64_t> pads) {
    std::vector<Tensor> outputs;
    const Node node = PadNode(2, {{"mode", Str(mode)}});
    const int64_t n = static_cast<int64_t>(x.size());
    const std::vector<Tensor> inputs{Tensor::FromVector<float>({n}, x), Int64s(pads)};
    KernelBuildContext bc = MakeBuildContext(node, inputs, {false, true}, outputs);
    std::unique_ptr<Kernel> kernel = CreateCpuKernel(bc);
    if (kernel == nullptr || std::string(kernel->Name()) != "PadIndexed") return std::vector<float>{};
    RunKernel(*kernel, node, inputs, outputs);
    return std::vector<float>(outputs[0].data<float>(), outputs[0].data<float>() + outputs[0].numel());
  };
  EXPECT_EQ(padded("reflect", {1, 2, 3}, {4, 3}), (std::vector<float>{1, 2, 3, 2, 1, 2, 3, 2, 1, 2}));
  EXPECT_EQ(padded("wrap", {1, 2, 3, 4}, {1, -1}), (std::vector<float>{3, 1, 2, 3}));
  EXPECT_EQ(padded("edge", {1, 2, 3, 4}, {1, -1}), (std::vector<float>{1, 1, 2, 3}));
  EXPECT_EQ(padded("reflect", {1, 2, 3, 4}, {-1, 2}), (std::vector<float>{2, 3, 4, 3, 2}));
  EXPECT_EQ(padded("reflect", {1, 2, 3, 4}, {2, -1}), (std::vector<float>{3, 2, 1, 2, 3}));
  EXPECT_EQ(padded("constant", {1, 2, 3, 4}, {-2, 3}), (std::vector<float>{3, 4, 0, 0, 0}));
  EXPECT_EQ(padded("wrap", {1, 2, 3, 4}, {-1, 5}), (std::vector<float>{2, 3, 4, 2, 3, 4, 2, 3}));
}

TEST(Pad, DeclinedWhereTheReferenceRuns) {
  // Pads known only at run time, an empty output.
  const Tensor x = RandomTensor({1, 2, 4, 4}, 7);
  EXPECT_TRUE(FastKernelDeclines(PadNode(2), {x, Int64s({0, 0, 1, 1, 0, 0, 1, 1})}, {false, false}));
  EXPECT_TRUE(
      FastKernelDeclines(PadNode(2, {{"mode", Str("edge")}}), {x, Int64s({0, 0, 1, 1, 0, 0, 1, 1})}, {false, false}));
  // A hostile model: 2^40 elements of padding beside an empty axis. The output is empty; no kernel may build a table
  // of 2^40 source indices (8 TB) for it.
  const Tensor empty = RandomTensor({0, 5}, 8);
  const Tensor huge = Int64s({0, 0, 0, int64_t{1} << 40});
  EXPECT_TRUE(FastKernelDeclines(PadNode(2, {{"mode", Str("reflect")}}), {empty, huge}, {false, true}));
  EXPECT_TRUE(FastKernelDeclines(PadNode(2, {{"mode", Str("reflect")}}),
                                 {RandomTensor({5, 0}, 8), Int64s({0, 0, int64_t{1} << 40, 0})},
                                 {false, true}));  // the huge axis first
  const std::vector<Tensor> out = RunReferenceNode(PadNode(2, {{"mode", Str("reflect")}}), {empty, huge});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].shape(), (Shape{0, (int64_t{1} << 40) + 5}));
}

// ---- Slice boxes other than channel ranges (steps 1): channels-last here; plain data takes SlicePlain (below).
// `args`: starts, ends, axes[, steps] (constants unless `constant` says otherwise).
void ExpectSliceBoxNhwc(const Shape& x, std::vector<Tensor> args, bool follows, std::vector<bool> constant = {}) {
  const Node node = MakeNode("Slice", static_cast<int>(args.size()) + 1, 1);
  std::vector<Tensor> inputs{RandomTensor(x, 9)};
  for (Tensor& t : args) inputs.push_back(std::move(t));
  if (constant.empty()) constant.assign(inputs.size(), true);
  constant[0] = false;
  std::vector<Tensor> outputs;
  KernelBuildContext bc = MakeBuildContext(node, inputs, constant, outputs);
  EXPECT_EQ(CpuKernelFollowsNhwc(bc), follows);
  if (!follows) return;
  const Tensor expected = RunReferenceNode(node, inputs)[0];
  bc.input_layouts.assign(inputs.size(), Layout::kPlain);
  bc.input_layouts[0] = Layout::kNhwc;
  bc.output_layouts = {Layout::kNhwc};
  std::unique_ptr<Kernel> kernel = CreateCpuKernel(bc);
  ASSERT_NE(kernel, nullptr);
  EXPECT_EQ(std::string(kernel->Name()), "SliceF32Nhwc");
  std::vector<Tensor> run_inputs = inputs;
  run_inputs[0] = ToNhwc(inputs[0]);
  std::vector<Tensor> run_outputs{NanTensor(Physical(expected.shape(), Layout::kNhwc))};
  RunKernel(*kernel, node, run_inputs, run_outputs);
  const Tensor got = FromNhwc(run_outputs[0]);
  ASSERT_EQ(got.shape(), expected.shape());
  EXPECT_EQ(std::memcmp(got.raw(), expected.raw(), got.nbytes()), 0);
}

TEST(SliceBox, SpatialAndMixedBoxesFollowChannelsLast) {
  // NASNet's Cropping2D (drop the first row and column), a centre crop with negative ends and INT64_MAX, a box in
  // every axis (batch, channels, H, W), explicit unit steps.
  const int64_t big = std::numeric_limits<int64_t>::max();
  ExpectSliceBoxNhwc({1, 6, 9, 8}, {Int64s({1, 1}), Int64s({big, big}), Int64s({2, 3})}, true);
  ExpectSliceBoxNhwc({2, 5, 10, 7}, {Int64s({2, 1}), Int64s({-2, -1}), Int64s({-2, -1})}, true);
  ExpectSliceBoxNhwc({3, 6, 5, 7}, {Int64s({1, 2, 1, 0}), Int64s({3, 5, 4, 6}), Int64s({0, 1, 2, 3}),
                                    Int64s({1, 1, 1, 1})}, true);
}

TEST(SliceBox, DeclinedWhereTheReferenceRuns) {
  // A step of 2 (YOLOv5's Focus), starts known only at run time, an empty box.
  ExpectSliceBoxNhwc({1, 4, 8, 8}, {Int64s({0}), Int64s({8}), Int64s({2}), Int64s({2})}, false);
  ExpectSliceBoxNhwc({1, 4, 8, 8}, {Int64s({1}), Int64s({8}), Int64s({2})}, false, {false, false, true, true});
  ExpectSliceBoxNhwc({1, 4, 8, 8}, {Int64s({5}), Int64s({3}), Int64s({2})}, false);
}

// ---- SlicePlain: any Slice of plain data with arguments known when compiled, every dtype, rank and step, against
// the reference kernel (exact copies). `args`: starts, ends, axes[, steps].
void ExpectSlicePlain(const Tensor& x, std::vector<Tensor> args) {
  const Node node = MakeNode("Slice", static_cast<int>(args.size()) + 1, 1);
  std::vector<Tensor> inputs{x};
  for (Tensor& t : args) inputs.push_back(std::move(t));
  std::vector<bool> constant(inputs.size(), true);
  constant[0] = false;
  ExpectFastMatchesReference(node, inputs, constant, "SlicePlain", 17, nullptr, 0.f);
}

TEST(SlicePlain, RunsOfEveryLengthStepAndDtype) {
  const int64_t big = std::numeric_limits<int64_t>::max();
  // An SSD's prior boxes [1, anchors, 4] cut into xy and wh (8-byte runs), 3 of 5 columns (12 bytes), 4 of 9.
  ExpectSlicePlain(RandomTensor({1, 3000, 4}, 20), {Int64s({0}), Int64s({2}), Int64s({2})});
  ExpectSlicePlain(RandomTensor({1, 3000, 4}, 21), {Int64s({2}), Int64s({big}), Int64s({-1})});
  ExpectSlicePlain(RandomTensor({700, 5}, 22), {Int64s({1}), Int64s({4}), Int64s({1})});
  ExpectSlicePlain(RandomTensor({70, 9}, 23), {Int64s({0, 5}), Int64s({60, 9}), Int64s({0, 1})});
  // YOLOv5's Focus (steps of 2 along H and W), a reversal (step -1), steps of 3 from the end.
  ExpectSlicePlain(RandomTensor({1, 3, 64, 64}, 24),
                   {Int64s({1, 0}), Int64s({big, big}), Int64s({2, 3}), Int64s({2, 2})});
  ExpectSlicePlain(RandomTensor({5, 7}, 25), {Int64s({-1}), Int64s({-big}), Int64s({1}), Int64s({-1})});
  ExpectSlicePlain(RandomTensor({2, 50}, 26), {Int64s({-2}), Int64s({0}), Int64s({1}), Int64s({-3})});
  // Whole rows (merged into one run), rank 5, a large copy in threads, int64 and uint8, one element, empty.
  ExpectSlicePlain(RandomTensor({4, 6, 10}, 27), {Int64s({1}), Int64s({3}), Int64s({0})});
  ExpectSlicePlain(RandomTensor({2, 3, 4, 5, 6}, 28), {Int64s({1, 0, 2}), Int64s({3, 2, 5}), Int64s({1, 2, 4})});
  ExpectSlicePlain(RandomTensor({64, 300, 300}, 29), {Int64s({10}), Int64s({290}), Int64s({1})});
  ExpectSlicePlain(Tensor::FromVector<int64_t>({6}, {1, 2, 3, 4, 5, 6}), {Int64s({1}), Int64s({5}), Int64s({0})});
  ExpectSlicePlain(Tensor::FromVector<uint8_t>({2, 4}, {1, 2, 3, 4, 5, 6, 7, 8}),
                   {Int64s({1}), Int64s({3}), Int64s({1})});
  ExpectSlicePlain(RandomTensor({3, 3}, 30), {Int64s({1, 2}), Int64s({2, 3}), Int64s({0, 1})});
  ExpectSlicePlain(RandomTensor({3, 3}, 31), {Int64s({2}), Int64s({2}), Int64s({0})});
  // Arguments known only at run time: the reference kernel.
  EXPECT_TRUE(FastKernelDeclines(MakeNode("Slice", 4, 1),
                                 {RandomTensor({4, 4}, 32), Int64s({1}), Int64s({3}), Int64s({0})},
                                 {false, false, true, true}));
}

KernelBuildContext AllNhwcContext(const Node& node, const std::vector<Tensor>& inputs,
                                  const std::vector<bool>& constant) {
  std::vector<Tensor> outputs;
  KernelBuildContext bc = MakeBuildContext(node, inputs, constant, outputs);
  bc.input_layouts.assign(inputs.size(), Layout::kPlain);
  bc.input_layouts[0] = Layout::kNhwc;
  if (node.op_type == "Conv" && node.GetInt("_residual", 0) != 0) bc.input_layouts[3] = Layout::kNhwc;
  bc.output_layouts.assign(outputs.size(), Layout::kPlain);
  bc.output_layouts[0] = Layout::kNhwc;
  return bc;
}

// ------------------------------------------------------------------------------------------------------------ Conv

Node ConvNode(AttributeMap attrs, int num_inputs = 3) { return MakeNode("Conv", num_inputs, 1, std::move(attrs)); }

std::vector<Tensor> ConvInputs(const Shape& x, const Shape& w, uint32_t seed) {
  return {RandomTensor(x, seed), RandomTensor(w, seed + 1), RandomTensor({w[0]}, seed + 2)};
}

// All four layout combinations, and with every tensor NHWC a fast oneDNN implementation without reorders.
void ExpectConvEveryLayout(const Node& node, const Shape& x, const Shape& w, uint32_t seed) {
  std::vector<Tensor> in = ConvInputs(x, w, seed);
  ExpectEveryLayout(node, in, {false, true, true}, "ConvF32Dnnl");
  std::unique_ptr<Kernel> kernel = CreateCpuKernel(AllNhwcContext(node, in, {false, true, true}));
  ASSERT_NE(kernel, nullptr);
  const std::string impl = cpu::DnnlConvImplementation(*kernel);
  SCOPED_TRACE("oneDNN implementation " + impl);
  EXPECT_NE(impl.rfind("ref", 0), 0u);
  EXPECT_EQ(impl.find("gemm"), std::string::npos);  // im2col + GEMM is the slow general path
  // (Not necessarily an avx512 kernel on an AVX-512 machine: the tuner keeps whichever is fastest, and for 13 channels
  // that can be jit:avx2.)
}

// A 1x1 Conv on a 1x1 image (Keras MobileNet heads) runs GemvF32 in every layout: NHWC and NCHW are the same bytes.
TEST(NhwcConv, ClassifierHeadOnOnePixel) {
  if (!__builtin_cpu_supports("avx512f")) GTEST_SKIP() << "GemvF32 needs AVX-512";
  Node node = ConvNode({});
  std::vector<Tensor> in{RandomTensor({1, 40, 1, 1}, 3), RandomTensor({70, 40, 1, 1}, 4), RandomTensor({70}, 5)};
  ExpectEveryLayout(node, in, {false, true, true}, "GemvF32");
}

// A convolution along H only (W = 1 throughout, as JAX/TF export a 1-D convolution) runs as the same convolution
// along W (same memory, swapped dims): strides, dilation and asymmetric pads along H, every layout, and a fused
// residual in NHWC.
TEST(NhwcConv, AlongHeightOnlyRunsAlongWidth) {
  ExpectConvEveryLayout(ConvNode({{"pads", Ints({2, 0, 1, 0})}, {"strides", Ints({2, 1})}, {"dilations", Ints({2, 1})}}),
                        {2, 6, 23, 1}, {8, 6, 5, 1}, 7);
  Node residual = ConvNode({{"pads", Ints({2, 0, 2, 0})}, {"_residual", Attribute::Int(1)},
                            {"_activation", Attribute::String("Relu")}}, 4);
  std::vector<Tensor> in{RandomTensor({1, 6, 19, 1}, 8), RandomTensor({9, 6, 5, 1}, 9), RandomTensor({9}, 10),
                         RandomTensor({1, 9, 19, 1}, 11)};
  ExpectLayoutsMatchReference(residual, in, {false, true, true, false}, "ConvF32Dnnl", Layout::kNhwc, Layout::kNhwc,
                              Layout::kNhwc);
  ExpectLayoutsMatchReference(residual, in, {false, true, true, false}, "ConvF32Dnnl", Layout::kPlain, Layout::kPlain,
                              Layout::kPlain);
}

TEST(NhwcConv, PointwiseOneByOne) { ExpectConvEveryLayout(ConvNode({}), {2, 13, 7, 9}, {5, 13, 1, 1}, 1); }

TEST(NhwcConv, ThreeByThreePadOne) {
  ExpectConvEveryLayout(ConvNode({{"pads", Ints({1, 1, 1, 1})}}), {1, 5, 7, 9}, {13, 5, 3, 3}, 2);
}

TEST(NhwcConv, DepthwiseThirteenChannelsStrideTwoWithRelu) {
  ExpectConvEveryLayout(ConvNode({{"group", Attribute::Int(13)},
                                  {"strides", Ints({2, 2})},
                                  {"pads", Ints({1, 1, 1, 1})},
                                  {"_activation", Attribute::String("Relu")}}),
                        {1, 13, 7, 9}, {13, 1, 3, 3}, 3);
}

TEST(NhwcConv, DepthwiseFiveByFiveStrideOneAndTwo) {
  for (int64_t stride : {1, 2}) {
    SCOPED_TRACE("stride " + std::to_string(stride));
    ExpectConvEveryLayout(
        ConvNode({{"group", Attribute::Int(13)}, {"strides", Ints({stride, stride})}, {"pads", Ints({2, 2, 2, 2})}}),
        {2, 13, 9, 11}, {13, 1, 5, 5}, 4);
  }
}

TEST(NhwcConv, TwoGroups) {
  ExpectConvEveryLayout(ConvNode({{"group", Attribute::Int(2)}, {"pads", Ints({1, 1, 1, 1})}}), {2, 6, 7, 9},
                        {4, 3, 3, 3}, 5);
}

TEST(NhwcConv, StemSevenBySevenStrideTwoThreeChannels) {
  ExpectConvEveryLayout(ConvNode({{"strides", Ints({2, 2})}, {"pads", Ints({3, 3, 3, 3})}}), {1, 3, 16, 16},
                        {8, 3, 7, 7}, 6);
}

TEST(NhwcConv, AsymmetricPadsHardSwish) {
  ExpectConvEveryLayout(ConvNode({{"pads", Ints({0, 1, 2, 1})}, {"_activation", Attribute::String("HardSwish")}}),
                        {1, 5, 7, 9}, {3, 5, 3, 2}, 7);
}

// 3-D convolutions (video and volume networks) channels-last as NDHWC: a full 3 x 3 x 3 window, a (2+1)-D pair's
// spatial 1 x 3 x 3 (strided) and temporal 3 x 1 x 1 (strided in depth) windows, a strided 1 x 1 x 1 projection.
TEST(NhwcConv, ThreeDimensionalWindows) {
  ExpectConvEveryLayout(ConvNode({{"pads", Ints({1, 1, 1, 1, 1, 1})}}), {2, 5, 4, 7, 9}, {6, 5, 3, 3, 3}, 11);
  ExpectConvEveryLayout(ConvNode({{"pads", Ints({0, 1, 1, 0, 1, 1})}, {"strides", Ints({1, 2, 2})}}), {1, 8, 5, 9, 8},
                        {16, 8, 1, 3, 3}, 12);
  ExpectConvEveryLayout(ConvNode({{"pads", Ints({1, 0, 0, 1, 0, 0})}, {"strides", Ints({2, 1, 1})}}), {1, 16, 6, 5, 7},
                        {16, 16, 3, 1, 1}, 13);
  ExpectConvEveryLayout(ConvNode({{"strides", Ints({2, 2, 2})}}), {2, 8, 6, 6, 5}, {16, 8, 1, 1, 1}, 14);
}

// relu(conv(x) + r) with x, r and the output each plain or NHWC: all eight combinations, for the 3x3 and the 1x1
// (Clip 0..6) case. A residual in another layout than the output is reordered into the destination first.
void ExpectResidualEveryLayout(const Shape& x, const Shape& w, AttributeMap attrs) {
  attrs["_residual"] = Attribute::Int(1);
  Node node = ConvNode(attrs, 4);
  std::vector<Tensor> in = ConvInputs(x, w, 11);
  in.push_back(RandomTensor({x[0], w[0], x[2], x[3]}, 14));
  for (Layout in0 : kBoth)
    for (Layout in3 : kBoth)
      for (Layout out0 : kBoth)
        ExpectLayoutsMatchReference(node, in, {false, true, true, false}, "ConvF32Dnnl", in0, out0, in3);
}

// ---- osprey's Winograd F(4x4, 3x3) (winograd_conv.cc): channels-last 3x3 stride-1 convolutions with channel counts
// multiples of 16. OSPREY_WINOGRAD=1 takes it wherever it applies (unset: by timing), so these tests see it on every
// AVX-512 or AVX2 machine (each runs its own transforms: winograd_tiles.inc); the plain layouts stay on oneDNN.
bool WinogradHere() {  // also the first-layer convolution's condition (ExpectStem)
  return __builtin_cpu_supports("avx512f") || (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"));
}

// Winograd's sums differ from the reference's by ~1e-5 of their size (sqrt(C * 9) / 3 for values in [-1, 1]).
float WinogradAtol(const Shape& w) { return 2e-5f * std::sqrt(static_cast<float>(w[1] * 9)) + kFastAtol; }

// The Conv node (pads, activation, residual as given) on x and w, every tensor NHWC: osprey's Winograd, matching the
// reference; with plain tensors oneDNN's direct convolution.
void ExpectWinograd(AttributeMap attrs, const Shape& x, const Shape& w, bool bias, bool residual, uint32_t seed) {
  if (!WinogradHere()) GTEST_SKIP() << "osprey's Winograd needs AVX-512 or AVX2 with FMA";
  ScopedEnv always("OSPREY_WINOGRAD", "1");
  if (residual) attrs["_residual"] = Attribute::Int(1);
  Node node = ConvNode(attrs, residual ? 4 : bias ? 3 : 2);
  std::vector<Tensor> in{RandomTensor(x, seed), RandomTensor(w, seed + 1)};
  std::vector<bool> constant{false, true};
  if (bias || residual) in.push_back(bias ? RandomTensor({w[0]}, seed + 2) : Tensor()), constant.push_back(true);
  // (With a residual the convolutions here keep the image size.)
  if (residual) in.push_back(RandomTensor({x[0], w[0], x[2], x[3]}, seed + 3)), constant.push_back(false);
  ExpectLayoutsMatchReference(node, in, constant, "ConvF32Winograd", Layout::kNhwc, Layout::kNhwc,
                              residual ? Layout::kNhwc : Layout::kPlain, WinogradAtol(w));
  ExpectLayoutsMatchReference(node, in, constant, "ConvF32Dnnl", Layout::kPlain, Layout::kPlain, Layout::kPlain,
                              WinogradAtol(w));
}

TEST(NhwcWinograd, PartialTilesBothWays) {
  ExpectWinograd({{"pads", Ints({1, 1, 1, 1})}}, {1, 16, 9, 11}, {32, 16, 3, 3}, true, false, 81);
}

TEST(NhwcWinograd, NoPaddingReluNoBias) {
  ExpectWinograd({{"_activation", Attribute::String("Relu")}}, {2, 32, 8, 13}, {16, 32, 3, 3}, false, false, 82);
}

TEST(NhwcWinograd, AsymmetricPadsClip) {
  ExpectWinograd({{"pads", Ints({0, 1, 2, 2})},
                  {"_activation", Attribute::String("Clip")},
                  {"_alpha", Attribute::Float(-0.5f)},
                  {"_beta", Attribute::Float(0.5f)}},
                 {1, 16, 6, 7}, {16, 16, 3, 3}, true, false, 83);
}

TEST(NhwcWinograd, OneTileSmallerThanATile) {
  ExpectWinograd({{"pads", Ints({1, 1, 1, 1})}}, {1, 32, 2, 3}, {16, 32, 3, 3}, true, false, 84);
}

// 225 tiles of 128 + 128 channels: two chunks, the second one tile short (zero rows in the multiplication).
TEST(NhwcWinograd, SeveralChunksWithAShortLastOne) {
  ExpectWinograd({{"pads", Ints({1, 1, 1, 1})}, {"_activation", Attribute::String("LeakyRelu")},
                  {"_alpha", Attribute::Float(0.1f)}},
                 {1, 128, 60, 60}, {128, 128, 3, 3}, true, false, 85);
}

TEST(NhwcWinograd, ResidualThenRelu) {
  ExpectWinograd({{"pads", Ints({1, 1, 1, 1})}, {"_activation", Attribute::String("Relu")}}, {2, 64, 10, 10},
                 {64, 64, 3, 3}, true, true, 86);
}

// Activations applied after the transform, on each tile's rows: SiLU (fast pass) and the reference formulas.
TEST(NhwcWinograd, SiluSigmoidHardSwish) {
  for (const char* act : {"Silu", "Sigmoid", "HardSwish"}) {
    SCOPED_TRACE(act);
    ExpectWinograd({{"pads", Ints({1, 1, 1, 1})}, {"_activation", Attribute::String(act)}}, {1, 16, 13, 10},
                   {48, 16, 3, 3}, true, false, 87);
  }
}

// The runtime may run the residual add in place: output and residual share one buffer.
TEST(NhwcWinograd, ResidualInPlace) {
  if (!WinogradHere()) GTEST_SKIP() << "osprey's Winograd needs AVX-512 or AVX2 with FMA";
  ScopedEnv always("OSPREY_WINOGRAD", "1");
  Node node = ConvNode({{"pads", Ints({1, 1, 1, 1})}, {"_residual", Attribute::Int(1)}}, 4);
  std::vector<Tensor> in{RandomTensor({1, 16, 9, 9}, 91), RandomTensor({16, 16, 3, 3}, 92), RandomTensor({16}, 93),
                         RandomTensor({1, 16, 9, 9}, 94)};
  const std::vector<Tensor> want = RunReferenceNode(node, in);
  KernelBuildContext bc = AllNhwcContext(node, in, {false, true, true, false});
  std::unique_ptr<Kernel> kernel = CreateCpuKernel(bc);
  ASSERT_NE(kernel, nullptr);
  ASSERT_EQ(std::string(kernel->Name()), "ConvF32Winograd");
  std::vector<Tensor> run_inputs{ToNhwc(in[0]), in[1], in[2], ToNhwc(in[3])};
  std::vector<Tensor> run_outputs{run_inputs[3]};  // the same buffer
  RunKernel(*kernel, node, run_inputs, run_outputs);
  ExpectTensorNear(FromNhwc(run_outputs[0]), want[0], kFastRtol, WinogradAtol({16, 16, 3, 3}));
}

// One kernel run by several threads at once (one plan serving concurrent requests): each caller has its own
// transform buffers (per-thread scratch) and matmul arguments (PerCaller); two chunks per run.
TEST(NhwcWinograd, ConcurrentRunsFromSeveralThreads) {
  if (!WinogradHere()) GTEST_SKIP() << "osprey's Winograd needs AVX-512 or AVX2 with FMA";
  ScopedEnv always("OSPREY_WINOGRAD", "1");
  Node node = ConvNode(
      {{"pads", Ints({1, 1, 1, 1})}, {"_residual", Attribute::Int(1)}, {"_activation", Attribute::String("Relu")}}, 4);
  const Tensor weight = RandomTensor({128, 128, 3, 3}, 97), bias = RandomTensor({128}, 98);
  constexpr int kThreads = 3;
  std::vector<std::vector<Tensor>> logical, nhwc;
  std::vector<Tensor> expected;
  for (int t = 0; t < kThreads; ++t) {
    logical.push_back({RandomTensor({1, 128, 44, 44}, 100 + t), weight, bias, RandomTensor({1, 128, 44, 44}, 110 + t)});
    nhwc.push_back({ToNhwc(logical[t][0]), weight, bias, ToNhwc(logical[t][3])});
    expected.push_back(RunReferenceNode(node, logical[t])[0]);
  }
  std::unique_ptr<Kernel> kernel = CreateCpuKernel(AllNhwcContext(node, logical[0], {false, true, true, false}));
  ASSERT_NE(kernel, nullptr);
  ASSERT_EQ(std::string(kernel->Name()), "ConvF32Winograd");
  const float atol = WinogradAtol({128, 128, 3, 3});
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Tensor out(DType::kF32, {1, 44, 44, 128});
      for (int iter = 0; iter < 5; ++iter) {
        KernelContext kc{node};
        for (const Tensor& in : nhwc[t]) kc.inputs.push_back(&in);
        kc.outputs.push_back(&out);
        kernel->Run(kc);
        const Tensor got = FromNhwc(out);
        for (int64_t i = 0; i < got.numel(); ++i) {
          const float e = expected[t].data<float>()[i];
          if (std::fabs(got.data<float>()[i] - e) > atol + kFastRtol * std::fabs(e)) ++mismatches;
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

// Output over its own input (a planner bug) is refused with an error naming the kernel, not computed from a tile
// already overwritten.
TEST(NhwcWinograd, RefusesToWriteOverItsInput) {
  if (!WinogradHere()) GTEST_SKIP() << "osprey's Winograd needs AVX-512 or AVX2 with FMA";
  ScopedEnv always("OSPREY_WINOGRAD", "1");
  Node node = ConvNode({{"pads", Ints({1, 1, 1, 1})}});
  std::vector<Tensor> in = ConvInputs({1, 16, 9, 9}, {16, 16, 3, 3}, 99);
  std::unique_ptr<Kernel> kernel = CreateCpuKernel(AllNhwcContext(node, in, {false, true, true}));
  ASSERT_NE(kernel, nullptr);
  ASSERT_EQ(std::string(kernel->Name()), "ConvF32Winograd");
  std::vector<Tensor> run_inputs{ToNhwc(in[0]), in[1], in[2]};
  std::vector<Tensor> run_outputs{run_inputs[0]};  // the same buffer
  try {
    RunKernel(*kernel, node, run_inputs, run_outputs);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInternal);
    EXPECT_NE(std::string(e.what()).find("cannot write over its input"), std::string::npos) << e.what();
  }
}

// Where it does not apply, oneDNN keeps the convolution: stride 2, dilation, groups, 24 channels.
TEST(NhwcWinograd, DeclinedShapesStayOnOneDnn) {
  ScopedEnv always("OSPREY_WINOGRAD", "1");
  const std::vector<std::pair<AttributeMap, std::pair<Shape, Shape>>> cases{
      {{{"strides", Ints({2, 2})}, {"pads", Ints({1, 1, 1, 1})}}, {{1, 16, 9, 9}, {16, 16, 3, 3}}},
      {{{"dilations", Ints({2, 2})}, {"pads", Ints({2, 2, 2, 2})}}, {{1, 16, 9, 9}, {16, 16, 3, 3}}},
      {{{"group", Attribute::Int(2)}, {"pads", Ints({1, 1, 1, 1})}}, {{1, 32, 9, 9}, {32, 16, 3, 3}}},
      {{{"pads", Ints({1, 1, 1, 1})}}, {{1, 24, 9, 9}, {16, 24, 3, 3}}},
  };
  for (const auto& [attrs, shapes] : cases) {
    Node node = ConvNode(attrs);
    std::vector<Tensor> in = ConvInputs(shapes.first, shapes.second, 95);
    std::unique_ptr<Kernel> kernel = CreateCpuKernel(AllNhwcContext(node, in, {false, true, true}));
    ASSERT_NE(kernel, nullptr);
    EXPECT_EQ(std::string(kernel->Name()), "ConvF32Dnnl") << node.Describe();
  }
}

// Unset, the kernel is chosen by timing both on this machine; the verdict goes to the tuning cache, named, and a
// second build reads it back (no second line) and makes the same kernel.
TEST(NhwcWinograd, ChosenByTimingAndRemembered) {
  ScopedEnv by_timing("OSPREY_WINOGRAD", nullptr);
  const std::string path = TempCachePath("osprey-tune-winograd");
  setenv("OSPREY_TUNE_CACHE", path.c_str(), 1);
  Node node = ConvNode({{"pads", Ints({1, 1, 1, 1})}, {"_activation", Attribute::String("Relu")}});
  std::vector<Tensor> in = ConvInputs({2, 64, 14, 14}, {64, 64, 3, 3}, 96);
  std::unique_ptr<Kernel> first = CreateCpuKernel(AllNhwcContext(node, in, {false, true, true}));
  ASSERT_NE(first, nullptr);
  std::string verdict;
  for (const std::string& line : Lines(path)) {
    std::istringstream fields(line);
    std::string hash, name;
    int position = -1;
    if (fields >> hash >> position >> name && (name == "own" || name == "onednn")) verdict = name;
  }
  if (!WinogradHere()) {
    EXPECT_EQ(verdict, "") << "nothing to choose without AVX-512 or AVX2";
  } else {
    ASSERT_NE(verdict, "") << "no Winograd verdict in " << path;
    EXPECT_EQ(std::string(first->Name()), verdict == "own" ? "ConvF32Winograd" : "ConvF32Dnnl");
  }
  const size_t lines = Lines(path).size();
  std::unique_ptr<Kernel> second = CreateCpuKernel(AllNhwcContext(node, in, {false, true, true}));
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(std::string(second->Name()), std::string(first->Name()));
  EXPECT_EQ(Lines(path).size(), lines);
  std::filesystem::remove(path);
  unsetenv("OSPREY_TUNE_CACHE");
}

TEST(NhwcConv, FusedResidualAndReluEveryLayout) {
  ExpectResidualEveryLayout({1, 5, 7, 9}, {13, 5, 3, 3},
                            {{"pads", Ints({1, 1, 1, 1})}, {"_activation", Attribute::String("Relu")}});
}

TEST(NhwcConv, FusedResidualAndClipPointwiseEveryLayout) {
  ExpectResidualEveryLayout({2, 13, 7, 9}, {5, 13, 1, 1},
                            {{"_activation", Attribute::String("Clip")},
                             {"_alpha", Attribute::Float(0.f)},
                             {"_beta", Attribute::Float(0.5f)}});
}

// The runtime may run the residual add in place: an NHWC output written over the NHWC residual itself.
TEST(NhwcConv, FusedResidualInPlaceNhwc) {
  Node node = ConvNode(
      {{"pads", Ints({1, 1, 1, 1})}, {"_residual", Attribute::Int(1)}, {"_activation", Attribute::String("Relu")}}, 4);
  std::vector<Tensor> in = ConvInputs({1, 13, 7, 9}, {5, 13, 3, 3}, 21);
  in.push_back(RandomTensor({1, 5, 7, 9}, 24));
  std::vector<Tensor> expected = RunReferenceNode(node, in);
  std::unique_ptr<Kernel> kernel = CreateCpuKernel(AllNhwcContext(node, in, {false, true, true, false}));
  ASSERT_NE(kernel, nullptr);
  std::vector<Tensor> run_inputs{ToNhwc(in[0]), in[1], in[2], ToNhwc(in[3])};
  KernelContext kc{node};
  for (const Tensor& t : run_inputs) kc.inputs.push_back(&t);
  kc.outputs.push_back(&run_inputs[3]);
  kernel->Run(kc);
  ExpectTensorNear(FromNhwc(run_inputs[3]), expected[0], kFastRtol, kFastAtol);
}

// Every fused activation through the NHWC primitive.
TEST(NhwcConv, EveryFusedActivation) {
  const std::vector<std::tuple<std::string, float, float>> cases = {
      {"Relu", 0, 0},      {"LeakyRelu", 0.1f, 0}, {"Clip", -1.5f, 2.5f},
      {"Sigmoid", 0, 0},   {"Tanh", 0, 0},         {"HardSigmoid", 0.2f, 0.5f},
      {"HardSwish", 0, 0}, {"Silu", 0, 0},         {"Gelu", 0, 0}};
  for (const auto& [name, alpha, beta] : cases) {
    SCOPED_TRACE(name);
    Node node = ConvNode({{"pads", Ints({1, 1, 1, 1})},
                          {"_activation", Attribute::String(name)},
                          {"_alpha", Attribute::Float(alpha)},
                          {"_beta", Attribute::Float(beta)}});
    std::vector<Tensor> in{Scaled(RandomTensor({1, 5, 7, 9}, 31), 2.f), RandomTensor({3, 5, 3, 3}, 32),
                           RandomTensor({3}, 33)};
    ExpectLayoutsMatchReference(node, in, {false, true, true}, "ConvF32Dnnl", Layout::kNhwc, Layout::kNhwc);
  }
}

TEST(NhwcConv, ConcurrentRunsFromSeveralThreads) {
  Node node = ConvNode({{"group", Attribute::Int(13)}, {"pads", Ints({1, 1, 1, 1})}});
  const Tensor weight = RandomTensor({13, 1, 3, 3}, 51), bias = RandomTensor({13}, 52);
  constexpr int kThreads = 3;
  std::vector<std::vector<Tensor>> inputs, expected;
  for (int t = 0; t < kThreads; ++t) {
    inputs.push_back({RandomTensor({1, 13, 7, 9}, 60 + t), weight, bias});
    expected.push_back(RunReferenceNode(node, inputs.back()));
  }
  std::unique_ptr<Kernel> kernel = CreateCpuKernel(AllNhwcContext(node, inputs[0], {false, true, true}));
  ASSERT_NE(kernel, nullptr);
  for (std::vector<Tensor>& in : inputs) in[0] = ToNhwc(in[0]);
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Tensor out(DType::kF32, {1, 7, 9, 13});
      for (int iter = 0; iter < 20; ++iter) {
        KernelContext kc{node};
        for (const Tensor& in : inputs[t]) kc.inputs.push_back(&in);
        kc.outputs.push_back(&out);
        kernel->Run(kc);
        Tensor got = FromNhwc(out);
        for (int64_t i = 0; i < got.numel(); ++i) {
          float e = expected[t][0].data<float>()[i];
          if (std::fabs(got.data<float>()[i] - e) > kFastAtol + kFastRtol * std::fabs(e)) ++mismatches;
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST(NhwcConv, SupportReportedOnlyForFastTwoDimensionalFloatConvWithConstantWeight) {
  Node node = ConvNode({{"pads", Ints({1, 1, 1, 1})}});
  std::vector<Tensor> in = ConvInputs({1, 3, 7, 9}, {5, 3, 3, 3}, 1);
  std::vector<Tensor> outputs;
  EXPECT_TRUE(CpuKernelSupportsNhwc(MakeBuildContext(node, in, {false, true, true}, outputs)));
  // A run-time weight cannot be prepacked: no fast kernel, and asking for NHWC anyway is a runtime bug.
  EXPECT_FALSE(CpuKernelSupportsNhwc(MakeBuildContext(node, in, {false, false, true}, outputs)));
  EXPECT_THROW(CreateCpuKernel(AllNhwcContext(node, in, {false, false, true})), Error);
  // Not float32.
  KernelBuildContext f16 = MakeBuildContext(node, in, {false, true, true}, outputs);
  for (DType& d : f16.input_dtypes) d = DType::kF16;
  f16.output_dtypes[0] = DType::kF16;
  EXPECT_FALSE(CpuKernelSupportsNhwc(f16));
  // Not 2-D.
  std::vector<Tensor> in1d = ConvInputs({1, 3, 9}, {5, 3, 3}, 2);
  EXPECT_FALSE(CpuKernelSupportsNhwc(MakeBuildContext(ConvNode({}), in1d, {false, true, true}, outputs)));
}

// ----------------------------------------------------------------------------------------------------------- Pools

// Plain to plain runs along the rows (plain_pool.cc), any channels-last side on oneDNN (`name`).
void ExpectPoolEveryLayout(const std::string& op, const Shape& x, AttributeMap attrs, const std::string& name) {
  Node node = MakeNode(op, 1, 1, std::move(attrs));
  for (Layout in0 : kBoth)
    for (Layout out0 : kBoth)
      ExpectLayoutsMatchReference(node, {RandomTensor(x, 7)}, {false},
                                  in0 == Layout::kPlain && out0 == Layout::kPlain ? op + "F32Rows" : name, in0, out0);
}

TEST(NhwcPool, MaxPoolStemStyleAndCeilMode) {
  for (int64_t ceil : {0, 1}) {
    SCOPED_TRACE("ceil_mode " + std::to_string(ceil));
    ExpectPoolEveryLayout("MaxPool", {2, 5, 7, 9},
                          {{"kernel_shape", Ints({3, 3})},
                           {"strides", Ints({2, 2})},
                           {"pads", Ints({1, 1, 1, 1})},
                           {"ceil_mode", Attribute::Int(ceil)}},
                          "MaxPoolF32Dnnl");
  }
}

TEST(NhwcPool, AveragePoolPaddingCountedOrNot) {
  for (int64_t include : {0, 1}) {
    SCOPED_TRACE("count_include_pad " + std::to_string(include));
    ExpectPoolEveryLayout("AveragePool", {1, 13, 7, 9},
                          {{"kernel_shape", Ints({3, 3})},
                           {"strides", Ints({2, 2})},
                           {"pads", Ints({1, 0, 0, 1})},
                           {"count_include_pad", Attribute::Int(include)}},
                          "AveragePoolF32Dnnl");
  }
}

TEST(NhwcPool, GlobalPools) {
  // Plain input: one row reduction per channel (reduce_kernel.cc). Channels-last input: GlobalAveragePool sums
  // [N, H * W, C] over its middle on AVX-512 (reduce_kernel.cc; with one image and few channels each thread a share
  // of the rows: [1, 32, 112, 112]); GlobalMaxPool and other CPUs: oneDNN's pooling.
  const struct {
    const char* op;
    Shape x;
  } cases[] = {{"GlobalAveragePool", {2, 13, 7, 9}},   {"GlobalMaxPool", {1, 5, 3, 4}},
               {"GlobalAveragePool", {1, 1280, 7, 7}}, {"GlobalAveragePool", {1, 32, 112, 112}},
               {"GlobalAveragePool", {3, 200, 5, 6}},  {"GlobalMaxPool", {1, 24, 40, 40}}};
  for (const auto& c : cases) {
    SCOPED_TRACE(std::string(c.op) + " " + ShapeToString(c.x));
    Node node = MakeNode(c.op, 1, 1);
    for (Layout in0 : kBoth)
      for (Layout out0 : kBoth)
        ExpectLayoutsMatchReference(node, {RandomTensor(c.x, 7)}, {false},
                                    in0 == Layout::kPlain ? "GlobalPoolF32Rows"
                                    : std::string(c.op) == "GlobalAveragePool" && __builtin_cpu_supports("avx512f")
                                        ? "GlobalPoolF32Nhwc"
                                        : std::string(c.op) + "F32Dnnl",
                                    in0, out0);
  }
}

TEST(NhwcPool, SupportReported) {
  std::vector<Tensor> outputs;
  Node max = MakeNode("MaxPool", 1, 1, {{"kernel_shape", Ints({2, 2})}});
  EXPECT_TRUE(CpuKernelSupportsNhwc(MakeBuildContext(max, {RandomTensor({1, 3, 7, 9}, 1)}, {false}, outputs)));
  Node with_indices = MakeNode("MaxPool", 1, 2, {{"kernel_shape", Ints({2, 2})}});
  EXPECT_FALSE(
      CpuKernelSupportsNhwc(MakeBuildContext(with_indices, {RandomTensor({1, 3, 7, 9}, 1)}, {false}, outputs)));
  Node three_d = MakeNode("MaxPool", 1, 1, {{"kernel_shape", Ints({2, 2, 2})}});
  EXPECT_TRUE(CpuKernelSupportsNhwc(MakeBuildContext(three_d, {RandomTensor({1, 3, 4, 5, 6}, 1)}, {false}, outputs)));
  Node one_d = MakeNode("MaxPool", 1, 1, {{"kernel_shape", Ints({2})}});
  EXPECT_FALSE(CpuKernelSupportsNhwc(MakeBuildContext(one_d, {RandomTensor({1, 3, 6}, 1)}, {false}, outputs)));
}

// 3-D pools over NDHWC tensors (video networks' (1, 3, 3) and (2, 2, 2) windows, ceil mode, padding counted or not)
// and the global average over D x H x W.
TEST(NhwcPool, ThreeDimensional) {
  ExpectPoolEveryLayout("MaxPool", {2, 5, 4, 9, 8},
                        {{"kernel_shape", Ints({1, 3, 3})},
                         {"strides", Ints({1, 2, 2})},
                         {"pads", Ints({0, 1, 1, 0, 1, 1})},
                         {"ceil_mode", Attribute::Int(1)}},
                        "MaxPoolF32Dnnl");
  for (int64_t counted : {0, 1})
    ExpectPoolEveryLayout("AveragePool", {1, 6, 5, 6, 7},
                          {{"kernel_shape", Ints({2, 2, 2})},
                           {"pads", Ints({1, 0, 1, 0, 1, 0})},
                           {"count_include_pad", Attribute::Int(counted)}},
                          "AveragePoolF32Dnnl");
  Node global = MakeNode("GlobalAveragePool", 1, 1);
  for (Layout in0 : kBoth)
    ExpectLayoutsMatchReference(global, {RandomTensor({2, 7, 3, 5, 4}, 7)}, {false},
                                in0 == Layout::kPlain               ? "GlobalPoolF32Rows"
                                : __builtin_cpu_supports("avx512f") ? "GlobalPoolF32Nhwc"
                                                                    : "GlobalAveragePoolF32Dnnl",
                                in0, in0);
}

// ------------------------------------------------------------------------- GroupNorm / InstanceNormalization

// PoolFormer's GroupNorm(1) between channels-last 1x1 convolutions and pools, groups of several channels, one channel
// a group (InstanceNormalization); a mean far from zero; sizes below and above the parallel threshold, pixel chunks
// with a short last one (3136 pixels in chunks of 256), channel counts leaving vector tails.
TEST(NhwcGroupNorm, EveryLayoutAndGroupCount) {
  struct Case {
    std::string op;
    int64_t groups;
    Shape x;
    float offset;
  };
  for (const Case& c : {Case{kGroupNormOp, 1, {2, 5, 3, 3}, 0.f}, Case{kGroupNormOp, 1, {1, 64, 56, 56}, 0.f},
                        Case{kGroupNormOp, 4, {2, 12, 17, 19}, 0.f}, Case{kGroupNormOp, 3, {1, 21, 40, 40}, 300.f},
                        Case{"InstanceNormalization", 0, {2, 7, 30, 31}, -50.f},
                        Case{"InstanceNormalization", 0, {2, 6, 5, 9, 8}, 20.f},  // 3-D U-Nets (nnU-Net)
                        Case{kGroupNormOp, 2, {1, 8, 16, 24, 20}, 0.f}}) {
    SCOPED_TRACE(c.op + " groups " + std::to_string(c.groups) + " " + ShapeToString(c.x));
    AttributeMap attrs{{"epsilon", Attribute::Float(1e-5f)}};
    if (c.groups > 0) attrs["num_groups"] = Attribute::Int(c.groups);
    const int64_t params = c.x[1];
    ExpectEveryLayout(MakeNode(c.op, 3, 1, attrs),
                      {RandomTensor(c.x, 1, -1.f + c.offset, 1.f + c.offset), RandomTensor({params}, 2, 0.5f, 1.5f),
                       RandomTensor({params}, 3)},
                      {false, true, true}, "GroupNormF32");
  }
  // With a fused activation, as FuseActivation leaves BiT's GroupNorm + ReLU.
  Node relu =
      MakeNode(kGroupNormOp, 3, 1, {{"num_groups", Attribute::Int(8)}, {"_activation", Attribute::String("Relu")}});
  ExpectEveryLayout(relu, {RandomTensor({2, 32, 20, 21}, 4), RandomTensor({32}, 5, 0.5f, 1.5f), RandomTensor({32}, 6)},
                    {false, true, true}, "GroupNormF32");
  // Rank 3 stays plain.
  std::vector<Tensor> outputs;
  Node node = MakeNode(kGroupNormOp, 3, 1, {{"num_groups", Attribute::Int(1)}});
  EXPECT_FALSE(CpuKernelSupportsNhwc(MakeBuildContext(
      node, {RandomTensor({1, 4, 9}, 1), RandomTensor({4}, 2), RandomTensor({4}, 3)}, {false, true, true}, outputs)));
}

// ---------------------------------------------------------------------------------------------- BatchNormalization

std::vector<Tensor> BatchNormInputs(const Shape& x, uint32_t seed, float x_scale = 1.f) {
  const int64_t c = x[1];
  return {Scaled(RandomTensor(x, seed), x_scale), RandomTensor({c}, seed + 1, 0.5f, 1.5f), RandomTensor({c}, seed + 2),
          RandomTensor({c}, seed + 3), RandomTensor({c}, seed + 4, 0.1f, 2.f)};
}

const std::vector<bool> kBatchNormConstant{false, true, true, true, true};

TEST(NhwcBatchNorm, EveryLayoutPlainAndRelu) {
  for (const std::string& act : {std::string(), std::string("Relu")}) {
    SCOPED_TRACE("activation '" + act + "'");
    AttributeMap attrs{{"epsilon", Attribute::Float(1e-3f)}};
    if (!act.empty()) attrs["_activation"] = Attribute::String(act);
    Node node = MakeNode("BatchNormalization", 5, 1, attrs);
    ExpectEveryLayout(node, BatchNormInputs({2, 13, 7, 9}, 1), kBatchNormConstant, "BatchNormF32");
    // Large enough for the parallel path, with a channel count that leaves vector-loop tails.
    ExpectEveryLayout(node, BatchNormInputs({1, 37, 29, 31}, 2), kBatchNormConstant, "BatchNormF32");
  }
}

TEST(NhwcBatchNorm, ThreeDimensionalEveryLayout) {
  Node node = MakeNode("BatchNormalization", 5, 1, {{"_activation", Attribute::String("Relu")}});
  ExpectEveryLayout(node, BatchNormInputs({2, 13, 3, 7, 9}, 7), kBatchNormConstant, "BatchNormF32");
}

TEST(NhwcBatchNorm, EveryFusedActivation) {
  const std::vector<std::tuple<std::string, float, float>> cases = {
      {"Relu", 0, 0}, {"LeakyRelu", 0.1f, 0},      {"Clip", 0, 6},      {"Clip", -1.5f, 2.5f}, {"Sigmoid", 0, 0},
      {"Tanh", 0, 0}, {"HardSigmoid", 0.2f, 0.5f}, {"HardSwish", 0, 0}, {"Silu", 0, 0},        {"Gelu", 0, 0}};
  for (const auto& [name, alpha, beta] : cases) {
    SCOPED_TRACE(name + " alpha " + std::to_string(alpha) + " beta " + std::to_string(beta));
    Node node = MakeNode("BatchNormalization", 5, 1,
                         {{"_activation", Attribute::String(name)},
                          {"_alpha", Attribute::Float(alpha)},
                          {"_beta", Attribute::Float(beta)}});
    // Values spread over about [-8, 8] so clip bounds and saturation are hit; the big ones reach exp's clamping.
    std::vector<Tensor> in = BatchNormInputs({2, 5, 7, 9}, 3, 4.f);
    in[0].data<float>()[0] = 100.f;
    in[0].data<float>()[1] = -100.f;
    for (Layout layout : kBoth)
      ExpectLayoutsMatchReference(node, in, kBatchNormConstant, "BatchNormF32", layout, layout);
  }
}

TEST(NhwcBatchNorm, PlainRankTwoThreeAndFive) {
  Node node = MakeNode("BatchNormalization", 5, 1, {{"_activation", Attribute::String("Relu")}});
  for (const Shape& x : {Shape{3, 13}, Shape{2, 5, 11}, Shape{1, 3, 4, 5, 6}, Shape{2, 40, 1000}}) {
    SCOPED_TRACE(ShapeToString(x));
    ExpectFastMatchesReference(node, BatchNormInputs(x, 5), kBatchNormConstant, "BatchNormF32");
  }
}

TEST(NhwcBatchNorm, InPlace) {
  Node node = MakeNode("BatchNormalization", 5, 1, {{"_activation", Attribute::String("Silu")}});
  std::vector<Tensor> in = BatchNormInputs({1, 13, 7, 9}, 6, 3.f);
  std::vector<Tensor> expected = RunReferenceNode(node, in);
  std::unique_ptr<Kernel> kernel = CreateCpuKernel(AllNhwcContext(node, in, kBatchNormConstant));
  ASSERT_NE(kernel, nullptr);
  std::vector<Tensor> run_inputs = in;
  run_inputs[0] = ToNhwc(in[0]);
  KernelContext kc{node};
  for (const Tensor& t : run_inputs) kc.inputs.push_back(&t);
  kc.outputs.push_back(&run_inputs[0]);
  kernel->Run(kc);
  ExpectTensorNear(FromNhwc(run_inputs[0]), expected[0], kFastRtol, kFastAtol);
}

TEST(NhwcBatchNorm, SupportAndDeclines) {
  Node node = MakeNode("BatchNormalization", 5, 1, {});
  std::vector<Tensor> outputs;
  EXPECT_TRUE(
      CpuKernelSupportsNhwc(MakeBuildContext(node, BatchNormInputs({1, 3, 4, 5}, 1), kBatchNormConstant, outputs)));
  EXPECT_TRUE(
      CpuKernelSupportsNhwc(MakeBuildContext(node, BatchNormInputs({1, 3, 2, 4, 5}, 1), kBatchNormConstant, outputs)));
  EXPECT_FALSE(
      CpuKernelSupportsNhwc(MakeBuildContext(node, BatchNormInputs({1, 3, 4}, 1), kBatchNormConstant, outputs)));
  // Statistics computed at run time: the reference kernel runs it.
  std::vector<Tensor> in = BatchNormInputs({1, 3, 4, 5}, 1);
  EXPECT_FALSE(CpuKernelSupportsNhwc(MakeBuildContext(node, in, {false, true, true, false, true}, outputs)));
  EXPECT_TRUE(FastKernelDeclines(node, in, {false, true, true, false, true}));
  EXPECT_THROW(CreateCpuKernel(AllNhwcContext(node, in, {false, true, true, false, true})), Error);
}

// ----------------------------------------------------------------------------------------------- Layout reorder

// Plain -> channels-last -> plain, bit for bit, twice on other buffers.
void ExpectReorderRoundTrip(const Shape& shape) {
  const Tensor plain = RandomTensor(shape, 9);
  std::unique_ptr<Kernel> to_nhwc = CreateLayoutReorderKernel(shape, Layout::kPlain, Layout::kNhwc, 2);
  std::unique_ptr<Kernel> to_plain = CreateLayoutReorderKernel(shape, Layout::kNhwc, Layout::kPlain, 2);
  ASSERT_NE(to_nhwc, nullptr);
  ASSERT_NE(to_plain, nullptr);
  EXPECT_EQ(std::string(to_nhwc->Name()), "LayoutReorderF32");
  Node node = MakeNode("LayoutReorder", 1, 1, {});
  std::vector<Tensor> nhwc{NanTensor(Physical(shape, Layout::kNhwc))};
  RunKernel(*to_nhwc, node, {plain}, nhwc);
  const Tensor expected_nhwc = ToNhwc(plain);
  EXPECT_EQ(std::memcmp(nhwc[0].raw(), expected_nhwc.raw(), plain.nbytes()), 0);
  std::vector<Tensor> back{NanTensor(shape)};
  RunKernel(*to_plain, node, nhwc, back);
  EXPECT_EQ(std::memcmp(back[0].raw(), plain.raw(), plain.nbytes()), 0);
  // Again on other buffers with other values: nothing of the first run is kept.
  const Tensor other = RandomTensor(shape, 19);
  std::vector<Tensor> other_nhwc{NanTensor(Physical(shape, Layout::kNhwc))};
  RunKernel(*to_nhwc, node, {other}, other_nhwc);
  EXPECT_EQ(std::memcmp(other_nhwc[0].raw(), ToNhwc(other).raw(), other.nbytes()), 0);
}

TEST(LayoutReorder, RoundTripIsExact) {
  for (const Shape& shape : {Shape{2, 13, 7, 9}, Shape{2, 5, 3, 7, 6}}) {
    SCOPED_TRACE(ShapeToString(shape));
    ExpectReorderRoundTrip(shape);
  }
}

TEST(LayoutReorder, LargeTensorAndBadShapes) {
  const Shape shape{1, 96, 56, 56};
  const Tensor plain = RandomTensor(shape, 10);
  std::unique_ptr<Kernel> to_nhwc = CreateLayoutReorderKernel(shape, Layout::kPlain, Layout::kNhwc, 2);
  Node node = MakeNode("LayoutReorder", 1, 1, {});
  std::vector<Tensor> nhwc{NanTensor({1, 56, 56, 96})};
  RunKernel(*to_nhwc, node, {plain}, nhwc);
  const Tensor expected_nhwc = ToNhwc(plain);
  EXPECT_EQ(std::memcmp(nhwc[0].raw(), expected_nhwc.raw(), plain.nbytes()), 0);
  // A tensor of the wrong size is refused rather than overrun.
  std::vector<Tensor> small{Tensor(DType::kF32, {1, 56, 56, 95})};
  EXPECT_THROW(RunKernel(*to_nhwc, node, {plain}, small), Error);
  EXPECT_THROW(CreateLayoutReorderKernel({2, 3, 4}, Layout::kPlain, Layout::kNhwc, 2), Error);
}

// ----------------------------------------------------------------------------------------------------- Measurement

// Not a test: times a MobileNetV2 inverted-residual block (1x1 expand 32->192 + Clip(0, 6), depthwise 3x3 + Clip,
// 1x1 project 192->32 + residual) on 56x56, 2 threads, all-NHWC against the plain path; and BatchNormalization + Relu.
// Run with --gtest_also_run_disabled_tests --gtest_filter='*Measure*'.
double MillisecondsPerRun(const std::function<void()>& fn) {
  for (int i = 0; i < 5; ++i) fn();
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    constexpr int kIters = 40;
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kIters; ++i) fn();
    best = std::min(
        best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() / kIters);
  }
  return best;
}

TEST(NhwcMeasure, DISABLED_MobileNetV2Block) {
  const Shape x_shape{1, 32, 56, 56}, wide{1, 192, 56, 56};
  AttributeMap clip{
      {"_activation", Attribute::String("Clip")}, {"_alpha", Attribute::Float(0)}, {"_beta", Attribute::Float(6)}};
  AttributeMap dw = clip;
  dw["group"] = Attribute::Int(192);
  dw["pads"] = Ints({1, 1, 1, 1});
  struct Layer {
    std::string label;
    Node node;
    std::vector<Tensor> in;
    std::vector<bool> constant;
    Shape out;
  };
  const Tensor x = RandomTensor(x_shape, 1);
  std::vector<Layer> layers;
  layers.push_back(
      {"expand 1x1 32->192", ConvNode(clip), ConvInputs(x_shape, {192, 32, 1, 1}, 2), {false, true, true}, wide});
  layers.push_back({"depthwise 3x3 192", ConvNode(dw), ConvInputs(wide, {192, 1, 3, 3}, 5), {false, true, true}, wide});
  layers.push_back({"project 1x1 192->32 + residual",
                    ConvNode({{"_residual", Attribute::Int(1)}}, 4),
                    ConvInputs(wide, {32, 192, 1, 1}, 8),
                    {false, true, true, false},
                    x_shape});
  layers.back().in.push_back(x);
  std::printf("MobileNetV2 block on 56x56, 2 threads (ms per run)\n");
  double total[2] = {0, 0};
  for (Layer& layer : layers) {
    double ms[2];
    std::string impl[2];
    for (int nhwc = 0; nhwc < 2; ++nhwc) {
      std::vector<Tensor> outputs;
      KernelBuildContext bc = nhwc ? AllNhwcContext(layer.node, layer.in, layer.constant)
                                   : MakeBuildContext(layer.node, layer.in, layer.constant, outputs);
      std::unique_ptr<Kernel> kernel = CreateCpuKernel(bc);
      ASSERT_NE(kernel, nullptr);
      impl[nhwc] = cpu::DnnlConvImplementation(*kernel);
      std::vector<Tensor> out{Tensor(DType::kF32, Physical(layer.out, nhwc ? Layout::kNhwc : Layout::kPlain))};
      std::vector<Tensor> in = layer.in;
      if (nhwc) {
        in[0] = ToNhwc(in[0]);
        if (in.size() > 3) in[3] = ToNhwc(in[3]);
      }
      ms[nhwc] = MillisecondsPerRun([&] { RunKernel(*kernel, layer.node, in, out); });
      total[nhwc] += ms[nhwc];
    }
    std::printf("  %-32s plain %7.3f (%s)   nhwc %7.3f (%s)\n", layer.label.c_str(), ms[0], impl[0].c_str(), ms[1],
                impl[1].c_str());
    // Each internal layout of the plain path, for the record.
    for (cpu::ConvLayout layout :
         {cpu::ConvLayout::kPlain, cpu::ConvLayout::kChannelsLast, cpu::ConvLayout::kPreferred}) {
      std::vector<Tensor> outputs;
      KernelBuildContext bc = MakeBuildContext(layer.node, layer.in, layer.constant, outputs);
      std::unique_ptr<Kernel> kernel = cpu::CreateDnnlConv(bc, layout);
      if (!kernel) continue;
      std::vector<Tensor> in = layer.in;
      const double layout_ms = MillisecondsPerRun([&] { RunKernel(*kernel, layer.node, in, outputs); });
      std::printf("      plain tensors, primitive layout %d: %7.3f (%s)\n", static_cast<int>(layout), layout_ms,
                  cpu::DnnlConvImplementation(*kernel));
    }
  }
  std::printf("  %-32s plain %7.3f   nhwc %7.3f   speed-up %.2fx\n", "block", total[0], total[1], total[0] / total[1]);

  // Plain tensors, 1x1 convolutions with and without an activation: oneDNN's GEMM convolution (kPlain) against
  // reorders around brgconv (kPreferred).
  std::printf("1x1 convolutions on plain tensors, 2 threads (ms per run)\n");
  const std::vector<std::pair<Shape, Shape>> pointwise = {{{1, 256, 56, 56}, {64, 256, 1, 1}},
                                                          {{1, 64, 56, 56}, {256, 64, 1, 1}},
                                                          {{1, 1024, 14, 14}, {256, 1024, 1, 1}},
                                                          {{1, 32, 112, 112}, {16, 32, 1, 1}},
                                                          {{1, 96, 28, 28}, {576, 96, 1, 1}}};
  for (const auto& [xs, ws] : pointwise) {
    for (const std::string& act : {std::string(), std::string("Relu")}) {
      AttributeMap attrs;
      if (!act.empty()) attrs["_activation"] = Attribute::String(act);
      Node node = ConvNode(attrs);
      std::vector<Tensor> in = ConvInputs(xs, ws, 3);
      double ms[2];
      int i = 0;
      for (cpu::ConvLayout layout : {cpu::ConvLayout::kPlain, cpu::ConvLayout::kPreferred}) {
        std::vector<Tensor> outputs;
        std::unique_ptr<Kernel> kernel =
            cpu::CreateDnnlConv(MakeBuildContext(node, in, {false, true, true}, outputs), layout);
        ms[i++] = MillisecondsPerRun([&] { RunKernel(*kernel, node, in, outputs); });
      }
      std::printf("  x %-18s w %-18s %-5s GEMM (plain) %7.3f   reorders + brgconv %7.3f\n", ShapeToString(xs).c_str(),
                  ShapeToString(ws).c_str(), act.c_str(), ms[0], ms[1]);
    }
  }

  Node bn = MakeNode("BatchNormalization", 5, 1, {{"_activation", Attribute::String("Relu")}});
  std::vector<Tensor> bn_in = BatchNormInputs(wide, 3);
  std::vector<Tensor> bn_out{Tensor(DType::kF32, wide)};
  ReferenceKernel reference = FindReferenceKernel("BatchNormalization");
  const double ref_ms = MillisecondsPerRun([&] {
    KernelContext kc{bn};
    for (const Tensor& t : bn_in) kc.inputs.push_back(&t);
    kc.outputs.push_back(&bn_out[0]);
    reference(kc);
  });
  std::vector<Tensor> outputs;
  std::unique_ptr<Kernel> plain_bn = CreateCpuKernel(MakeBuildContext(bn, bn_in, kBatchNormConstant, outputs));
  std::unique_ptr<Kernel> nhwc_bn = CreateCpuKernel(AllNhwcContext(bn, bn_in, kBatchNormConstant));
  const double plain_ms = MillisecondsPerRun([&] { RunKernel(*plain_bn, bn, bn_in, bn_out); });
  const double nhwc_ms = MillisecondsPerRun([&] { RunKernel(*nhwc_bn, bn, bn_in, bn_out); });
  std::printf("BatchNormalization + Relu [1, 192, 56, 56]: reference %.3f  fast plain %.3f  fast nhwc %.3f ms\n",
              ref_ms, plain_ms, nhwc_ms);
}

// ---- osprey's first-layer convolution (stem_conv.cc): 1-4 input channels read from the plain input, 8-128 output
// channels written channels-last. OSPREY_STEM=1 takes it wherever it applies, on AVX-512 or AVX2 + FMA (each its own
// loops, stem_conv_rows.inc: 16- or 8-lane vectors, so channel counts that are whole vectors on one are not on the
// other).
void ExpectStem(AttributeMap attrs, const Shape& x, const Shape& w, bool bias, uint32_t seed) {
  if (!WinogradHere()) GTEST_SKIP() << "osprey's first-layer convolution needs AVX-512 or AVX2 with FMA";
  ScopedEnv always("OSPREY_STEM", "1");
  Node node = ConvNode(attrs, bias ? 3 : 2);
  std::vector<Tensor> in{RandomTensor(x, seed), RandomTensor(w, seed + 1)};
  std::vector<bool> constant{false, true};
  if (bias) in.push_back(RandomTensor({w[0]}, seed + 2)), constant.push_back(true);
  ExpectLayoutsMatchReference(node, in, constant, "ConvF32Stem", Layout::kPlain, Layout::kNhwc);
  // A TensorFlow export's image: its NHWC input transposed, which the layout pass makes a channels-last copy.
  ExpectLayoutsMatchReference(node, in, constant, "ConvF32Stem", Layout::kNhwc, Layout::kNhwc);
}

// MobileNetV2's and EfficientNet's stem: 3 -> 32, 3x3, stride 2, pads 1 (odd sizes: a partial last block per row,
// border pixels on both sides).
TEST(NhwcStem, ThreeChannelsStrideTwoClipAndSilu) {
  for (const char* act : {"Clip", "Silu"}) {
    SCOPED_TRACE(act);
    ExpectStem({{"strides", Ints({2, 2})},
                {"pads", Ints({1, 1, 1, 1})},
                {"_activation", Attribute::String(act)},
                {"_alpha", Attribute::Float(0.f)},
                {"_beta", Attribute::Float(6.f)}},
               {2, 3, 35, 43}, {32, 3, 3, 3}, true, 101);
  }
}

// ResNet's stem: 3 -> 64, 7x7, stride 2, pads 3; six pixels per block (four vectors of channels).
TEST(NhwcStem, SevenBySevenSixtyFourChannelsRelu) {
  ExpectStem({{"strides", Ints({2, 2})}, {"pads", Ints({3, 3, 3, 3})}, {"_activation", Attribute::String("Relu")}},
             {1, 3, 41, 37}, {64, 3, 7, 7}, true, 102);
}

// One channel (a grey image), 16 and 48 output channels, asymmetric pads, no bias, strides 1 and 3 along the two
// axes, and activations Sigmoid, LeakyRelu or none.
TEST(NhwcStem, OneChannelAsymmetricPadsAndStrides) {
  ExpectStem({{"strides", Ints({1, 3})}, {"pads", Ints({0, 2, 1, 1})}, {"_activation", Attribute::String("Sigmoid")}},
             {1, 1, 19, 50}, {16, 1, 5, 5}, false, 103);
  ExpectStem({{"strides", Ints({3, 1})},
              {"pads", Ints({2, 0, 0, 1})},
              {"_activation", Attribute::String("LeakyRelu")},
              {"_alpha", Attribute::Float(0.1f)}},
             {2, 4, 17, 30}, {48, 4, 3, 4}, true, 104);
  ExpectStem({{"pads", Ints({1, 1, 1, 1})}}, {1, 2, 5, 3}, {16, 2, 3, 3}, true, 105);
}

// More than 64 output channels, run as blocks of up to 64 per row: SqueezeNet 1.0's 3 -> 96 7x7 stride 2 (64 + 32),
// 128 (64 + 64) with SiLU, and 72 (64 + 8, the last vector masked) with Tanh, applied once over the row.
TEST(NhwcStem, MoreThanSixtyFourOutputChannelsInBlocks) {
  ExpectStem({{"strides", Ints({2, 2})}, {"_activation", Attribute::String("Relu")}}, {2, 3, 29, 31}, {96, 3, 7, 7},
             true, 111);
  ExpectStem({{"strides", Ints({2, 2})}, {"pads", Ints({1, 1, 1, 1})}, {"_activation", Attribute::String("Silu")}},
             {1, 3, 25, 33}, {128, 3, 3, 3}, true, 112);
  ExpectStem({{"pads", Ints({1, 1, 1, 1})}, {"_activation", Attribute::String("Tanh")}}, {1, 2, 9, 27}, {72, 2, 3, 3},
             false, 113);
}

// Output channel counts that are not whole vectors: 24 (YOLOv8's stem), 8 and 40 (the last vector masked).
TEST(NhwcStem, OutputChannelsNotMultiplesOfSixteen) {
  ExpectStem({{"strides", Ints({2, 2})}, {"pads", Ints({1, 1, 1, 1})}, {"_activation", Attribute::String("Silu")}},
             {1, 3, 33, 29}, {24, 3, 3, 3}, true, 108);
  ExpectStem({{"pads", Ints({1, 1, 1, 1})}}, {2, 3, 7, 31}, {8, 3, 3, 3}, true, 109);
  ExpectStem({{"strides", Ints({2, 2})}, {"_activation", Attribute::String("Relu")}}, {1, 4, 21, 40}, {40, 4, 5, 5},
             false, 110);
}

// A raw audio signal's first layer, a window of one row: a keyword spotter's 1 -> 64, 80 taps, stride 4, pads 38
// with ReLU (the border pixels: 10 at each end), and wav2vec 2.0's 1 -> 12 (of its 512), 10 taps, stride 5, no pads.
TEST(NhwcStem, OneRowWindowsOfAudio) {
  ExpectStem({{"strides", Ints({1, 4})}, {"pads", Ints({0, 38, 0, 38})}, {"_activation", Attribute::String("Relu")}},
             {2, 1, 1, 400}, {64, 1, 1, 80}, true, 114);
  ExpectStem({{"strides", Ints({1, 5})}}, {1, 1, 1, 333}, {12, 1, 1, 10}, false, 115);
}

// ---- osprey's depthwise convolution (depthwise_conv.cc): channels-last, one filter per channel, any window, stride
// and dilation. OSPREY_DEPTHWISE=1 takes it wherever it applies (unset: where oneDNN's kernel is a generic one).
void ExpectDepthwise(AttributeMap attrs, const Shape& x, int64_t kh, int64_t kw, bool bias, uint32_t seed) {
  if (!WinogradHere()) GTEST_SKIP() << "osprey's depthwise convolution needs AVX-512 or AVX2 with FMA";
  ScopedEnv always("OSPREY_DEPTHWISE", "1");
  attrs["group"] = Attribute::Int(x[1]);
  Node node = ConvNode(attrs, bias ? 3 : 2);
  std::vector<Tensor> in{RandomTensor(x, seed), RandomTensor({x[1], 1, kh, kw}, seed + 1)};
  std::vector<bool> constant{false, true};
  if (bias) in.push_back(RandomTensor({x[1]}, seed + 2)), constant.push_back(true);
  ExpectLayoutsMatchReference(node, in, constant, "ConvF32Depthwise", Layout::kNhwc, Layout::kNhwc);
}

// A Keras SeparableConv1D's depthwise part at dilation 8, "same" pads (8 each side), as tf2onnx writes it ([N, C, 1,
// W]); and at dilation 3 with 13 channels (the last vector and its bias partial on either instruction set) and SiLU.
TEST(NhwcDepthwise, OneRowDilated) {
  ExpectDepthwise({{"dilations", Ints({1, 8})}, {"pads", Ints({0, 8, 0, 8})}}, {2, 32, 1, 70}, 1, 3, true, 121);
  ExpectDepthwise(
      {{"dilations", Ints({1, 3})}, {"pads", Ints({0, 2, 0, 4})}, {"_activation", Attribute::String("Silu")}},
      {1, 13, 1, 40}, 1, 3, true, 122);
}

// MobileNet's 3x3 stride 2 with ReLU6 (odd sizes: border pixels on both sides), a 5x5 at dilation 2 with asymmetric
// pads and strides, and Tanh applied over the piece after it is written.
TEST(NhwcDepthwise, TwoDimensionalWindowsStridesAndActivations) {
  ExpectDepthwise({{"strides", Ints({2, 2})},
                   {"pads", Ints({1, 1, 1, 1})},
                   {"_activation", Attribute::String("Clip")},
                   {"_alpha", Attribute::Float(0.f)},
                   {"_beta", Attribute::Float(6.f)}},
                  {2, 24, 15, 17}, 3, 3, true, 123);
  ExpectDepthwise({{"strides", Ints({1, 2})}, {"dilations", Ints({2, 2})}, {"pads", Ints({3, 1, 2, 4})}},
                  {1, 40, 11, 13}, 5, 5, true, 124);
  ExpectDepthwise({{"pads", Ints({1, 1, 1, 1})}, {"_activation", Attribute::String("Tanh")}}, {1, 8, 6, 150}, 3, 3,
                  false, 125);
}

// The other activations: in registers (activation_avx512.h: HardSigmoid with its alpha and beta, HardSwish) or over
// the row after it is written (Tanh, GELU).
TEST(NhwcStem, ActivationsInRegistersAndOverTheRow) {
  for (const char* act : {"HardSigmoid", "HardSwish", "Tanh", "Gelu"}) {
    SCOPED_TRACE(act);
    ExpectStem({{"strides", Ints({2, 2})},
                {"pads", Ints({1, 1, 1, 1})},
                {"_activation", Attribute::String(act)},
                {"_alpha", Attribute::Float(0.3f)},
                {"_beta", Attribute::Float(0.4f)}},
               {1, 3, 15, 21}, {32, 3, 3, 3}, true, 111);
  }
}

// A window larger than the image along W (every pixel a border pixel) and an image of one column.
TEST(NhwcStem, WindowsWiderThanTheImage) {
  ExpectStem({{"pads", Ints({3, 3, 3, 3})}}, {1, 3, 9, 4}, {32, 3, 7, 7}, true, 106);
  ExpectStem({{"pads", Ints({1, 1, 1, 1})}}, {1, 3, 6, 1}, {16, 3, 3, 3}, false, 107);
}

// ---- osprey's 1x1 convolution (pointwise_conv.cc): channels-last input and output, the activation in registers.
// OSPREY_POINTWISE=1 takes it wherever it applies (without: SiLU layers and input scales, and weight-heavy layers where
// they time faster when tuning).
void ExpectPointwise(AttributeMap attrs, const Shape& x, const Shape& w, bool bias, uint32_t seed,
                     const char* expected = "ConvF32Pointwise") {
  if (!__builtin_cpu_supports("avx512f")) GTEST_SKIP() << "osprey's 1x1 convolution needs AVX-512";
  ScopedEnv always("OSPREY_POINTWISE", "1");
  Node node = ConvNode(attrs, bias ? 3 : 2);
  std::vector<Tensor> in{RandomTensor(x, seed), RandomTensor(w, seed + 1)};
  std::vector<bool> constant{false, true};
  if (bias) in.push_back(RandomTensor({w[0]}, seed + 2)), constant.push_back(true);
  ExpectLayoutsMatchReference(node, in, constant, expected, Layout::kNhwc, Layout::kNhwc);
}

// EfficientNet's first expansion (16 -> 96, SiLU): two groups of 3 vectors; 126 pixels over two images, so the last
// chunk of 24 pixels has 6, fewer than a block of 8.
TEST(NhwcPointwise, ExpansionWithSilu) {
  ExpectPointwise({{"_activation", Attribute::String("Silu")}}, {2, 16, 7, 9}, {96, 16, 1, 1}, true, 201);
}

// 24 output channels (the last vector masked) without bias; 200 (13 vectors: groups of 4, 4, 4 and 1).
TEST(NhwcPointwise, OutputChannelsNotMultiplesOfSixteen) {
  ExpectPointwise({{"_activation", Attribute::String("Relu")}}, {1, 40, 5, 5}, {24, 40, 1, 1}, false, 202);
  ExpectPointwise({{"_activation", Attribute::String("LeakyRelu")}, {"_alpha", Attribute::Float(0.1f)}}, {1, 8, 3, 7},
                  {200, 8, 1, 1}, true, 203);
}

// 1100 input channels: weights of 1.1 MB (group by group) in several tiles of input channels (partial sums kept in the
// output between them); 15 pixels, the last block of 6 holding 3.
TEST(NhwcPointwise, ManyInputChannelsInTiles) {
  ExpectPointwise({{"_activation", Attribute::String("HardSwish")}}, {1, 1100, 3, 5}, {256, 1100, 1, 1}, true, 204);
}

TEST(NhwcPointwise, ActivationsInRegisters) {
  for (const char* act : {"Sigmoid", "Clip", "HardSigmoid"}) {
    SCOPED_TRACE(act);
    ExpectPointwise({{"_activation", Attribute::String(act)},
                     {"_alpha", Attribute::Float(0.3f)},
                     {"_beta", Attribute::Float(0.9f)}},
                    {1, 24, 4, 6}, {48, 24, 1, 1}, true, 205);
  }
}

// What it does not take stays with oneDNN: an activation it does not compute; a stride or pads where the layer has
// more output pixels than output channels (36 > 32).
TEST(NhwcPointwise, OtherConvolutionsStayWithOnednn) {
  ExpectPointwise({{"_activation", Attribute::String("Tanh")}}, {1, 16, 4, 4}, {32, 16, 1, 1}, true, 206,
                  "ConvF32Dnnl");
  ExpectPointwise({{"_activation", Attribute::String("Silu")}, {"strides", Ints({2, 2})}}, {1, 16, 12, 12},
                  {32, 16, 1, 1}, true, 207, "ConvF32Dnnl");
  ExpectPointwise({{"_activation", Attribute::String("Silu")}, {"pads", Ints({1, 1, 1, 1})}}, {1, 16, 4, 4},
                  {32, 16, 1, 1}, true, 208, "ConvF32Dnnl");
}

// Weight-heavy layers of other windows (no more output pixels, over all images, than output channels): each output
// pixel's window is gathered into a row first. A 3x3 layer on 7x7 (49 pixels, 64 channels: all in one chunk, blocks
// of 7); a stride-2 3x3 with pads on the bottom and right only; a stride-2 1x1 (ResNet's downsample); a 3x5 window
// with pads over two images (SiLU); weights of 1.2 MB (group by group) with 1152 rows in tiles. (A 3x3 stride-1 window
// Winograd takes stays its: ResNet-50's 14x14 layers run faster there.)
TEST(NhwcPointwise, GatheredWindows) {
  struct Case {
    const char* name;
    AttributeMap attrs;
    Shape x, w;
    bool bias;
  };
  const Case cases[] = {
      {"3x3 on 7x7",
       {{"pads", Ints({1, 1, 1, 1})}, {"_activation", Attribute::String("Relu")}},
       {1, 40, 7, 7},
       {64, 40, 3, 3},
       true},
      {"3x3 stride 2, pads bottom and right",
       {{"strides", Ints({2, 2})}, {"pads", Ints({0, 0, 1, 1})}},
       {1, 24, 8, 7},
       {48, 24, 3, 3},
       false},
      {"1x1 stride 2", {{"strides", Ints({2, 2})}}, {1, 16, 6, 6}, {32, 16, 1, 1}, true},
      {"3x5 over two images",
       {{"pads", Ints({1, 2, 1, 2})}, {"_activation", Attribute::String("Silu")}},
       {2, 8, 4, 5},
       {80, 8, 3, 5},
       true},
      {"weights group by group",
       {{"strides", Ints({2, 2})}, {"pads", Ints({1, 1, 1, 1})}},
       {1, 128, 9, 9},
       {256, 128, 3, 3},
       true},
  };
  uint32_t seed = 209;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    ExpectPointwise(c.attrs, c.x, c.w, c.bias, seed++);
  }
}

// A gathered window with a residual, written over the residual itself (the runtime may run it in place) and into
// another buffer; 20 output channels (the second vector masked).
TEST(NhwcPointwise, GatheredWindowWithResidual) {
  if (!__builtin_cpu_supports("avx512f")) GTEST_SKIP() << "osprey's 1x1 convolution needs AVX-512";
  ScopedEnv always("OSPREY_POINTWISE", "1");
  Node node = ConvNode(
      {{"pads", Ints({1, 1, 1, 1})}, {"_residual", Attribute::Int(1)}, {"_activation", Attribute::String("Relu")}}, 4);
  std::vector<Tensor> in = ConvInputs({1, 13, 4, 4}, {20, 13, 3, 3}, 214);
  in.push_back(RandomTensor({1, 20, 4, 4}, 215));
  std::vector<Tensor> expected = RunReferenceNode(node, in);
  std::unique_ptr<Kernel> kernel = CreateCpuKernel(AllNhwcContext(node, in, {false, true, true, false}));
  ASSERT_NE(kernel, nullptr);
  EXPECT_STREQ(kernel->Name(), "ConvF32Pointwise");
  for (bool in_place : {false, true}) {
    SCOPED_TRACE(in_place ? "in place" : "own output");
    std::vector<Tensor> run_inputs{ToNhwc(in[0]), in[1], in[2], ToNhwc(in[3])};
    Tensor out = ToNhwc(in[3]);
    KernelContext kc{node};
    for (const Tensor& t : run_inputs) kc.inputs.push_back(&t);
    kc.outputs.push_back(in_place ? &run_inputs[3] : &out);
    kernel->Run(kc);
    ExpectTensorNear(FromNhwc(in_place ? run_inputs[3] : out), expected[0], kFastRtol, kFastAtol);
  }
}

}  // namespace
}  // namespace osprey::testing
