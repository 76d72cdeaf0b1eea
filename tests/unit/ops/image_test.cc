// osprey-domain image ops (src/ops/image.cc, src/kernels/reference/image.cc, src/kernels/cpu/image_kernels.cc).
// Oracles: values computed by hand in each test (numpy / OpenCV / Pillow rules as stated in docs/image-ops.md), and
// the reference kernel for every fast kernel. Comparisons with OpenCV and Pillow themselves on real photos live in
// tests/image_ops/test_image_ops.py.
//
// Fast-vs-reference tolerance: float32 images hold values in [0, 1) and the fast kernels accumulate in float where
// the reference uses double, a relative error of a few ulps per tap (<= ~500 taps here), far below 1e-4; uint8
// outputs may then round the other way at an exact .5 boundary, so they may differ by 1.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "osprey/graph.h"
#include "osprey/runtime.h"
#include "unit/kernels/kernel_test_util.h"

namespace osprey::testing {
namespace {

Node ImageNode(const std::string& op, AttributeMap attrs = {}) {
  Node n = MakeNode(op, 1, 1, std::move(attrs));
  n.domain = kOspreyDomain;
  return n;
}

Tensor RandomU8(Shape shape, uint32_t seed) {
  Tensor f = RandomTensor(shape, seed, 0.f, 256.f);
  Tensor t(DType::kU8, shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<uint8_t>()[i] = static_cast<uint8_t>(f.data<float>()[i]);
  return t;
}

Tensor U8(Shape shape, const std::vector<uint8_t>& v) { return Tensor::FromVector<uint8_t>(std::move(shape), v); }
Tensor F32(Shape shape, const std::vector<float>& v) { return Tensor::FromVector<float>(std::move(shape), v); }

// Runs the fast kernel (CreateImageKernel) twice and compares with the reference kernel.
void ExpectFastMatches(const Node& node, const Tensor& input, const std::string& expected_name) {
  SCOPED_TRACE(node.op_type + " " + ShapeToString(input.shape()) + " " + DTypeName(input.dtype()));
  std::vector<Tensor> expected = RunReferenceNode(node, {input});
  std::vector<Tensor> outputs;
  KernelBuildContext bc = MakeBuildContext(node, {input}, {false}, outputs);
  std::unique_ptr<Kernel> kernel = CreateImageKernel(bc);
  ASSERT_NE(kernel, nullptr);
  EXPECT_EQ(std::string(kernel->Name()), expected_name);
  for (int run = 0; run < 2; ++run) {
    RunKernel(*kernel, node, {input}, outputs);
    if (outputs[0].dtype() == DType::kU8)
      ExpectTensorNear(outputs[0], expected[0], 0.f, 1.f);
    else
      ExpectTensorNear(outputs[0], expected[0], kFastRtol, kFastAtol);
  }
}

// (input H, W) -> (output H, W) pairs covering 1x1, long thin images, loop tails, up and down scaling per axis.
struct SizePair {
  int64_t h, w, out_h, out_w;
};
const SizePair kResizeSizes[] = {{1, 1, 5, 5},   {3, 1000, 7, 11}, {4097, 3, 17, 2}, {13, 7, 29, 4},
                                 {13, 7, 13, 7}, {13, 7, 5, 3},    {2, 2, 1, 1},     {6, 9, 3, 3}};

TEST(ImageOps, ResizeFastMatchesReference) {
  for (const std::string mode : {"nearest", "bilinear", "bicubic", "area"})
    for (int antialias : {0, 1})
      for (const SizePair& s : kResizeSizes)
        for (int64_t c : {1, 3, 4, 5}) {
          if ((s.h == 4097 || s.w == 1000) && c != 3 && c != 1) continue;  // keep the run short
          Node node = ImageNode("ResizeImage", {{"height", Attribute::Int(s.out_h)},
                                                {"width", Attribute::Int(s.out_w)},
                                                {"mode", Attribute::String(mode)},
                                                {"antialias", Attribute::Int(antialias)}});
          SCOPED_TRACE(mode + " antialias " + std::to_string(antialias));
          const std::string u8_name = mode == "nearest" ? "ResizeImageNearest" : "ResizeImageU8Separable";
          const std::string f32_name = mode == "nearest" ? "ResizeImageNearest" : "ResizeImageF32Separable";
          ExpectFastMatches(node, RandomU8({s.h, s.w, c}, 1), u8_name);
          ExpectFastMatches(node, RandomTensor({s.h, s.w, c}, 2, 0.f, 1.f), f32_name);
        }
  // A batch.
  Node node = ImageNode("ResizeImage", {{"height", Attribute::Int(4)}, {"width", Attribute::Int(6)}});
  ExpectFastMatches(node, RandomU8({2, 13, 7, 3}, 3), "ResizeImageU8Separable");
}

TEST(ImageOps, ResizeHandComputed) {
  auto resize = [](const Tensor& x, int64_t h, int64_t w, const std::string& mode, int antialias) {
    return RunReferenceNode(ImageNode("ResizeImage", {{"height", Attribute::Int(h)},
                                                      {"width", Attribute::Int(w)},
                                                      {"mode", Attribute::String(mode)},
                                                      {"antialias", Attribute::Int(antialias)}}),
                            {x})[0];
  };
  // OpenCV INTER_LINEAR, half-pixel centres, clamped at the edges: source x = (o + 0.5) / 2 - 0.5.
  ExpectTensorNear(resize(F32({1, 2, 1}, {0, 100}), 1, 4, "bilinear", 0), F32({1, 4, 1}, {0, 25, 75, 100}));
  const Tensor row = F32({1, 4, 1}, {0, 10, 20, 30});
  // INTER_AREA: exact pixel-area averages (width 3: windows of 4/3 source pixels).
  ExpectTensorNear(resize(row, 1, 2, "area", 0), F32({1, 2, 1}, {5, 25}));
  ExpectTensorNear(resize(row, 1, 3, "area", 0), F32({1, 3, 1}, {2.5f, 15, 27.5f}));
  // Nearest with half-pixel centres: source floor((o + 0.5) * 2) = 1, 3.
  ExpectTensorNear(resize(row, 1, 2, "nearest", 1), F32({1, 2, 1}, {10, 30}));
  // Pillow antialiased bilinear, 2x down: triangle of half-width 2 centred at 1 and 3, taps (0.75, 0.75, 0.25) / 1.75.
  ExpectTensorNear(resize(row, 1, 2, "bilinear", 1), F32({1, 2, 1}, {12.5f / 1.75f, 40.f / 1.75f}));
  // Identity size: every mode returns the input.
  for (const std::string mode : {"nearest", "bilinear", "bicubic", "area"})
    ExpectTensorNear(resize(row, 1, 4, mode, 0), row);
  // uint8 output rounds: bilinear 0,255 -> width 4 gives 0, 63.75, 191.25, 255.
  ExpectTensorNear(resize(U8({1, 2, 1}, {0, 255}), 1, 4, "bilinear", 0), U8({1, 4, 1}, {0, 64, 191, 255}), 0.f, 0.f);
  // Bicubic rings past a step (float output goes below 0 and above 255); uint8 output is that value rounded and
  // saturated.
  const Tensor step_f = resize(F32({1, 4, 1}, {0, 0, 255, 255}), 1, 16, "bicubic", 0);
  const Tensor step_u = resize(U8({1, 4, 1}, {0, 0, 255, 255}), 1, 16, "bicubic", 0);
  float lowest = 0, highest = 0;
  for (int64_t i = 0; i < 16; ++i) {
    const float v = step_f.data<float>()[i];
    lowest = std::min(lowest, v), highest = std::max(highest, v);
    EXPECT_EQ(step_u.data<uint8_t>()[i], v <= 0 ? 0 : v >= 255 ? 255 : static_cast<int>(std::floor(v + 0.5f))) << i;
  }
  EXPECT_LT(lowest, -1.f);
  EXPECT_GT(highest, 256.f);
}

TEST(ImageOps, CropFlipRotate) {
  const Tensor x = F32({3, 4, 1}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
  Node crop = ImageNode("CropImage", {{"top", Attribute::Int(1)},
                                      {"left", Attribute::Int(1)},
                                      {"height", Attribute::Int(2)},
                                      {"width", Attribute::Int(2)}});
  ExpectTensorNear(RunReferenceNode(crop, {x})[0], F32({2, 2, 1}, {5, 6, 9, 10}));
  ExpectFastMatches(crop, RandomU8({2, 13, 7, 5}, 4), "CropImageCopy");

  const Tensor y = F32({2, 3, 1}, {0, 1, 2, 3, 4, 5});
  auto flip = [&](int h, int v) {
    Node node = ImageNode("FlipImage", {{"horizontal", Attribute::Int(h)}, {"vertical", Attribute::Int(v)}});
    return RunReferenceNode(node, {y})[0];
  };
  ExpectTensorNear(flip(1, 0), F32({2, 3, 1}, {2, 1, 0, 5, 4, 3}));
  ExpectTensorNear(flip(0, 1), F32({2, 3, 1}, {3, 4, 5, 0, 1, 2}));
  ExpectTensorNear(flip(1, 1), F32({2, 3, 1}, {5, 4, 3, 2, 1, 0}));
  ExpectTensorNear(flip(0, 0), y);

  auto rot = [&](int64_t k) { return RunReferenceNode(ImageNode("Rotate90", {{"k", Attribute::Int(k)}}), {y})[0]; };
  // numpy.rot90([[0, 1, 2], [3, 4, 5]], k).
  ExpectTensorNear(rot(1), F32({3, 2, 1}, {2, 5, 1, 4, 0, 3}));
  ExpectTensorNear(rot(2), F32({2, 3, 1}, {5, 4, 3, 2, 1, 0}));
  ExpectTensorNear(rot(3), F32({3, 2, 1}, {3, 0, 4, 1, 5, 2}));
  ExpectTensorNear(rot(4), y);
  ExpectTensorNear(rot(-1), rot(3));
  // Channels move with their pixel; batches rotate each image.
  Tensor rgb = RunReferenceNode(ImageNode("Rotate90", {{"k", Attribute::Int(1)}}),
                                {U8({1, 1, 2, 3}, {1, 2, 3, 4, 5, 6})})[0];
  ExpectTensorNear(rgb, U8({1, 2, 1, 3}, {4, 5, 6, 1, 2, 3}), 0.f, 0.f);
}

TEST(ImageOps, Pad) {
  const Tensor x = F32({1, 3, 1}, {1, 2, 3});
  auto pad = [&](const std::string& mode, int64_t t, int64_t b, int64_t l, int64_t r, float value = 0.f) {
    return RunReferenceNode(ImageNode("PadImage", {{"top", Attribute::Int(t)},
                                                   {"bottom", Attribute::Int(b)},
                                                   {"left", Attribute::Int(l)},
                                                   {"right", Attribute::Int(r)},
                                                   {"value", Attribute::Float(value)},
                                                   {"mode", Attribute::String(mode)}}),
                            {x})[0];
  };
  // numpy.pad([1, 2, 3], (2, 2), mode) for reflect / edge; longer than the row reflects back and forth.
  ExpectTensorNear(pad("reflect", 0, 0, 2, 2), F32({1, 7, 1}, {3, 2, 1, 2, 3, 2, 1}));
  ExpectTensorNear(pad("edge", 0, 0, 2, 2), F32({1, 7, 1}, {1, 1, 1, 2, 3, 3, 3}));
  ExpectTensorNear(pad("reflect", 0, 0, 5, 0), F32({1, 8, 1}, {2, 1, 2, 3, 2, 1, 2, 3}));
  ExpectTensorNear(pad("constant", 1, 0, 0, 1, 9.f), F32({2, 4, 1}, {9, 9, 9, 9, 1, 2, 3, 9}));
  ExpectTensorNear(pad("reflect", 2, 0, 0, 0), F32({3, 3, 1}, {1, 2, 3, 1, 2, 3, 1, 2, 3}));  // one row: edge
  // uint8 constant saturates.
  Tensor u = RunReferenceNode(ImageNode("PadImage", {{"top", Attribute::Int(0)},
                                                     {"bottom", Attribute::Int(0)},
                                                     {"left", Attribute::Int(1)},
                                                     {"right", Attribute::Int(0)},
                                                     {"value", Attribute::Float(300.f)}}),
                              {U8({1, 1, 1}, {7})})[0];
  ExpectTensorNear(u, U8({1, 2, 1}, {255, 7}), 0.f, 0.f);
}

TEST(ImageOps, NormalizeHandComputedAndFast) {
  Node node = ImageNode("NormalizeImage", {{"scale", Attribute::Float(0.5f)},
                                           {"mean", Attribute::Floats({1, 2, 3})},
                                           {"std", Attribute::Floats({2, 4, 8})}});
  // y[c] = (x * 0.5 - mean[c]) / std[c], transposed to CHW.
  Tensor y = RunReferenceNode(node, {U8({1, 2, 3}, {10, 20, 30, 40, 50, 60})})[0];
  ExpectTensorNear(y, F32({3, 1, 2}, {2, 9.5f, 2, 5.75f, 1.5f, 3.375f}));
  Node hwc = node;
  hwc.attrs["layout"] = Attribute::String("HWC");
  ExpectTensorNear(RunReferenceNode(hwc, {U8({1, 2, 3}, {10, 20, 30, 40, 50, 60})})[0],
                   F32({1, 2, 3}, {2, 2, 1.5f, 9.5f, 5.75f, 3.375f}));
  // Defaults: scale 1, mean 0, std 1 — a plain cast (and transpose).
  Tensor plain = RunReferenceNode(ImageNode("NormalizeImage"), {U8({1, 1, 2}, {3, 250})})[0];
  ExpectTensorNear(plain, F32({2, 1, 1}, {3, 250}));

  for (const Shape& s : std::vector<Shape>{{1, 1, 3}, {3, 1000, 3}, {4097, 3, 3}, {13, 7, 1}, {13, 7, 4}, {2, 5, 3, 3}})
    for (const Node& n : {node, hwc}) {
      if (s.back() != 3) continue;
      ExpectFastMatches(n, RandomU8(s, 5), "NormalizeImageU8Lut");
      ExpectFastMatches(n, RandomTensor(s, 6, 0.f, 255.f), "NormalizeImageF32");
    }
  for (int64_t c : {1, 4, 5}) {
    Node one = ImageNode("NormalizeImage", {{"scale", Attribute::Float(1.f / 255)},
                                            {"mean", Attribute::Floats({0.5f})},
                                            {"std", Attribute::Floats({0.25f})}});
    ExpectFastMatches(one, RandomU8({13, 7, c}, 7), "NormalizeImageU8Lut");
  }
}

TEST(ImageOps, ColorConvertValues) {
  auto convert = [](const Tensor& x, const std::string& from, const std::string& to) {
    Node node = ImageNode("ColorConvert", {{"from", Attribute::String(from)}, {"to", Attribute::String(to)}});
    return RunReferenceNode(node, {x})[0];
  };
  const Tensor rgb = U8({1, 4, 3}, {255, 0, 0, 0, 255, 0, 0, 0, 255, 100, 150, 200});
  // round(0.299 R + 0.587 G + 0.114 B): 76.2, 149.7, 29.1, 140.75.
  ExpectTensorNear(convert(rgb, "RGB", "GRAY"), U8({1, 4, 1}, {76, 150, 29, 141}), 0.f, 0.f);
  const Tensor bgr = convert(rgb, "RGB", "BGR");
  ExpectTensorNear(bgr, U8({1, 4, 3}, {0, 0, 255, 0, 255, 0, 255, 0, 0, 200, 150, 100}), 0.f, 0.f);
  ExpectTensorNear(convert(bgr, "BGR", "GRAY"), U8({1, 4, 1}, {76, 150, 29, 141}), 0.f, 0.f);
  ExpectTensorNear(convert(U8({1, 2, 1}, {7, 9}), "GRAY", "RGB"), U8({1, 2, 3}, {7, 7, 7, 9, 9, 9}), 0.f, 0.f);
  ExpectTensorNear(convert(U8({1, 1, 4}, {1, 2, 3, 4}), "RGBA", "BGR"), U8({1, 1, 3}, {3, 2, 1}), 0.f, 0.f);
  ExpectTensorNear(convert(U8({1, 1, 4}, {1, 2, 3, 4}), "BGRA", "RGB"), U8({1, 1, 3}, {3, 2, 1}), 0.f, 0.f);
  ExpectTensorNear(convert(F32({1, 1, 3}, {1, 2, 3}), "RGB", "GRAY"), F32({1, 1, 1}, {0.299f + 1.174f + 0.342f}));

  const std::pair<std::string, std::string> pairs[] = {{"RGB", "GRAY"}, {"BGR", "RGB"}, {"GRAY", "BGR"},
                                                       {"RGBA", "GRAY"}, {"BGRA", "BGR"}, {"GRAY", "GRAY"}};
  for (const auto& [from, to] : pairs) {
    const int64_t c = from == "GRAY" ? 1 : (from.size() == 4 ? 4 : 3);
    Node node = ImageNode("ColorConvert", {{"from", Attribute::String(from)}, {"to", Attribute::String(to)}});
    for (const Shape& s : std::vector<Shape>{{1, 1, c}, {3, 1000, c}, {2, 13, 7, c}}) {
      ExpectFastMatches(node, RandomU8(s, 8), "ColorConvertU8");
      ExpectFastMatches(node, RandomTensor(s, 9, 0.f, 1.f), "ColorConvertF32");
    }
  }
}

TEST(ImageOps, WarpAffine) {
  auto warp = [](const Tensor& x, std::vector<float> m, int64_t h, int64_t w, float border, const std::string& mode) {
    return RunReferenceNode(ImageNode("WarpAffine", {{"matrix", Attribute::Floats(std::move(m))},
                                                     {"height", Attribute::Int(h)},
                                                     {"width", Attribute::Int(w)},
                                                     {"border_value", Attribute::Float(border)},
                                                     {"mode", Attribute::String(mode)}}),
                            {x})[0];
  };
  const Tensor row = F32({1, 3, 1}, {0, 10, 20});
  ExpectTensorNear(warp(row, {1, 0, 0, 0, 1, 0}, 1, 3, 0, "bilinear"), row);
  // x_in = x + 0.5: halfway between neighbours; the last pixel mixes 20 with the border value 7.
  ExpectTensorNear(warp(row, {1, 0, 0.5f, 0, 1, 0}, 1, 3, 7, "bilinear"), F32({1, 3, 1}, {5, 15, 13.5f}));
  // Nearest rounds the source coordinate: x_in = x + 0.6 -> 1, 2, 3 (outside -> border).
  ExpectTensorNear(warp(row, {1, 0, 0.6f, 0, 1, 0}, 1, 3, 7, "nearest"), F32({1, 3, 1}, {10, 20, 7}));
  // Transpose-like map (x_in = y, y_in = x) on a 2x3 image.
  ExpectTensorNear(warp(F32({2, 3, 1}, {0, 1, 2, 3, 4, 5}), {0, 1, 0, 1, 0, 0}, 3, 2, -1, "bilinear"),
                   F32({3, 2, 1}, {0, 3, 1, 4, 2, 5}));

  const std::vector<std::vector<float>> matrices = {
      {0.9f, 0.2f, -3.3f, -0.15f, 1.1f, 2.7f}, {2.5f, 0, 0.25f, 0, 0.3f, -0.7f}, {1, 0, 0, 0, 1, 0}};
  for (const auto& m : matrices)
    for (const std::string mode : {"bilinear", "nearest"})
      for (const SizePair& s : kResizeSizes)
        for (int64_t c : {1, 3, 4, 5}) {
          Node node = ImageNode("WarpAffine", {{"matrix", Attribute::Floats(m)},
                                               {"height", Attribute::Int(s.out_h)},
                                               {"width", Attribute::Int(s.out_w)},
                                               {"border_value", Attribute::Float(17.f)},
                                               {"mode", Attribute::String(mode)}});
          ExpectFastMatches(node, RandomU8({s.h, s.w, c}, 10), "WarpAffineU8");
          ExpectFastMatches(node, RandomTensor({s.h, s.w, c}, 11, 0.f, 1.f), "WarpAffineF32");
        }
}

TEST(ImageOps, HwcChwTransposes) {
  const Tensor x = U8({2, 2, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});
  Tensor chw = RunReferenceNode(ImageNode("HwcToChw"), {x})[0];
  ExpectTensorNear(chw, U8({3, 2, 2}, {1, 4, 7, 10, 2, 5, 8, 11, 3, 6, 9, 12}), 0.f, 0.f);
  ExpectTensorNear(RunReferenceNode(ImageNode("ChwToHwc"), {chw})[0], x, 0.f, 0.f);
  for (const Shape& s : std::vector<Shape>{{1, 1, 3}, {3, 1000, 3}, {4097, 3, 1}, {13, 7, 4}, {2, 13, 7, 5}}) {
    ExpectFastMatches(ImageNode("HwcToChw"), RandomU8(s, 12), "HwcToChwU8");
    ExpectFastMatches(ImageNode("HwcToChw"), RandomTensor(s, 13), "HwcToChwF32");
    ExpectFastMatches(ImageNode("ChwToHwc"), RandomU8(s, 14), "ChwToHwcU8");
    ExpectFastMatches(ImageNode("ChwToHwc"), RandomTensor(s, 15), "ChwToHwcF32");
  }
}

// Every bad input is an Error with kInvalidArgument, never a crash.
void ExpectInvalid(const Node& node, const Tensor& x, const std::string& message_part) {
  SCOPED_TRACE(node.op_type + " expecting '" + message_part + "'");
  try {
    RunReferenceNode(node, {x});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find(message_part), std::string::npos) << e.what();
  }
}

TEST(ImageOps, Errors) {
  const Tensor img = RandomU8({4, 5, 3}, 16);
  ExpectInvalid(ImageNode("CropImage", {{"top", Attribute::Int(2)},
                                        {"left", Attribute::Int(0)},
                                        {"height", Attribute::Int(3)},
                                        {"width", Attribute::Int(2)}}),
                img, "inside the 4x5 image");
  ExpectInvalid(ImageNode("CropImage", {{"top", Attribute::Int(-1)},
                                        {"left", Attribute::Int(0)},
                                        {"height", Attribute::Int(1)},
                                        {"width", Attribute::Int(1)}}),
                img, "inside");
  ExpectInvalid(ImageNode("CropImage", {{"top", Attribute::Int(0)}, {"left", Attribute::Int(0)}}), img,
                "'height' is required");
  ExpectInvalid(ImageNode("ResizeImage", {{"height", Attribute::Int(2)},
                                          {"width", Attribute::Int(2)},
                                          {"mode", Attribute::String("lanczos")}}),
                img, "got \"lanczos\"");
  ExpectInvalid(ImageNode("ResizeImage", {{"height", Attribute::Int(0)}, {"width", Attribute::Int(2)}}), img,
                "'height' must be in");
  ExpectInvalid(ImageNode("ResizeImage", {{"height", Attribute::String("2")}, {"width", Attribute::Int(2)}}), img,
                "height");
  ExpectInvalid(ImageNode("ResizeImage", {{"height", Attribute::Int(2)}, {"width", Attribute::Int(2)}}),
                RandomU8({4, 5}, 1), "rank 3");
  ExpectInvalid(ImageNode("ResizeImage", {{"height", Attribute::Int(2)}, {"width", Attribute::Int(2)}}),
                Tensor::FromVector<int64_t>({1, 1, 1}, {1}), "uint8 or float32");
  ExpectInvalid(ImageNode("ResizeImage", {{"height", Attribute::Int(2)}, {"width", Attribute::Int(2)}}),
                RandomU8({0, 5, 3}, 1), "empty image");
  ExpectInvalid(ImageNode("PadImage", {{"top", Attribute::Int(-1)},
                                       {"bottom", Attribute::Int(0)},
                                       {"left", Attribute::Int(0)},
                                       {"right", Attribute::Int(0)}}),
                img, "'top' must be in");
  ExpectInvalid(ImageNode("PadImage", {{"top", Attribute::Int(1)},
                                       {"bottom", Attribute::Int(0)},
                                       {"left", Attribute::Int(0)},
                                       {"right", Attribute::Int(0)},
                                       {"mode", Attribute::String("wrap")}}),
                img, "\"wrap\"");
  ExpectInvalid(ImageNode("FlipImage", {{"horizontal", Attribute::Int(2)}}), img, "'horizontal'");
  ExpectInvalid(ImageNode("Rotate90"), img, "'k' is required");
  ExpectInvalid(ImageNode("WarpAffine", {{"matrix", Attribute::Floats({1, 0, 0, 0, 1})},
                                         {"height", Attribute::Int(2)},
                                         {"width", Attribute::Int(2)}}),
                img, "6 floats");
  ExpectInvalid(ImageNode("WarpAffine", {{"matrix", Attribute::Floats({1, 0, 0, 0, 1, 0})},
                                         {"height", Attribute::Int(2)},
                                         {"width", Attribute::Int(2)},
                                         {"mode", Attribute::String("bicubic")}}),
                img, "\"bicubic\"");
  ExpectInvalid(ImageNode("ColorConvert", {{"from", Attribute::String("RGBA")}, {"to", Attribute::String("RGB")}}),
                img, "4 channel(s)");
  ExpectInvalid(ImageNode("ColorConvert", {{"from", Attribute::String("RGB")}, {"to", Attribute::String("HSV")}}),
                img, "\"HSV\"");
  ExpectInvalid(ImageNode("ColorConvert", {{"from", Attribute::String("RGB")}}), img, "'to' is required");
  ExpectInvalid(ImageNode("NormalizeImage", {{"mean", Attribute::Floats({1, 2})}}), img, "one value per channel (3)");
  ExpectInvalid(ImageNode("NormalizeImage", {{"std", Attribute::Floats({1, 0, 1})}}), img, "non-zero");
  ExpectInvalid(ImageNode("NormalizeImage", {{"layout", Attribute::String("NCHW")}}), img, "\"NCHW\"");
}

// ---------------------------------------------------------------- resize with a region of interest

// x[top:top+h, left:left+w] of an HWC image, any dtype: the oracle for ResizeImage's roi_* attributes.
Tensor CropHwc(const Tensor& x, int64_t top, int64_t left, int64_t h, int64_t w) {
  const int64_t in_w = x.dim(1), c = x.dim(2);
  const size_t pixel = static_cast<size_t>(c) * DTypeSize(x.dtype());
  Tensor out(x.dtype(), {h, w, c});
  for (int64_t y = 0; y < h; ++y)
    std::memcpy(static_cast<char*>(out.raw()) + y * w * pixel,
                static_cast<const char*>(x.raw()) + ((top + y) * in_w + left) * pixel, w * pixel);
  return out;
}

Tensor RunFast(const Node& node, const Tensor& input) {
  std::vector<Tensor> outputs;
  KernelBuildContext bc = MakeBuildContext(node, {input}, {false}, outputs);
  std::unique_ptr<Kernel> kernel = CreateImageKernel(bc);
  if (!kernel) {
    ADD_FAILURE() << "no fast kernel";
    return Tensor();
  }
  RunKernel(*kernel, node, {input}, outputs);
  return outputs[0];
}

TEST(ImageOps, ResizeRoiEqualsResizeThenCrop) {
  // Windows along one axis of length n: all of it, an interior one, the last index.
  auto window = [](int64_t n, int i) -> std::pair<int64_t, int64_t> {
    if (i == 0) return {0, n};
    if (i == 1) return {n / 3, std::max<int64_t>(1, n / 2)};
    return {n - 1, 1};
  };
  const SizePair sizes[] = {{13, 7, 29, 4}, {13, 7, 5, 3}, {37, 23, 11, 17}, {3, 100, 7, 9}, {1, 1, 5, 5}};
  for (const std::string mode : {"nearest", "bilinear", "bicubic", "area"})
    for (int antialias : {0, 1})
      for (const SizePair& s : sizes)
        for (int64_t c : {1, 3, 5}) {
          AttributeMap attrs = {{"height", Attribute::Int(s.out_h)},
                                {"width", Attribute::Int(s.out_w)},
                                {"mode", Attribute::String(mode)},
                                {"antialias", Attribute::Int(antialias)}};
          const Node full = ImageNode("ResizeImage", attrs);
          const Tensor inputs[] = {RandomU8({s.h, s.w, c}, 21), RandomTensor({s.h, s.w, c}, 22, 0.f, 1.f)};
          for (const Tensor& x : inputs) {
            const Tensor ref_full = RunReferenceNode(full, {x})[0];
            const Tensor fast_full = RunFast(full, x);
            for (int i = 0; i < 3; ++i) {
              const auto [top, h] = window(s.out_h, i);
              const auto [left, w] = window(s.out_w, (i + 1) % 3);
              AttributeMap roi_attrs = attrs;
              roi_attrs["roi_top"] = Attribute::Int(top);
              roi_attrs["roi_left"] = Attribute::Int(left);
              roi_attrs["roi_height"] = Attribute::Int(h);
              roi_attrs["roi_width"] = Attribute::Int(w);
              const Node roi = ImageNode("ResizeImage", roi_attrs);
              SCOPED_TRACE(mode + " antialias " + std::to_string(antialias) + " " + ShapeToString(x.shape()) + " " +
                           DTypeName(x.dtype()) + " -> " + std::to_string(s.out_h) + "x" + std::to_string(s.out_w) +
                           " roi " + std::to_string(top) + "," + std::to_string(left) + " " + std::to_string(h) + "x" +
                           std::to_string(w));
              ExpectTensorNear(RunReferenceNode(roi, {x})[0], CropHwc(ref_full, top, left, h, w), 0.f, 0.f);
              ExpectTensorNear(RunFast(roi, x), CropHwc(fast_full, top, left, h, w), 0.f, 0.f);
            }
          }
        }
  // Only some of the attributes: the rest default to "to the end of the image".
  const Tensor x = RandomU8({2, 9, 11, 3}, 23);
  Node roi = ImageNode("ResizeImage", {{"height", Attribute::Int(7)},
                                       {"width", Attribute::Int(5)},
                                       {"roi_top", Attribute::Int(2)},
                                       {"roi_width", Attribute::Int(3)}});
  const Tensor got = RunFast(roi, x);
  EXPECT_EQ(ShapeToString(got.shape()), ShapeToString(Shape{2, 5, 3, 3}));
  ExpectTensorNear(RunReferenceNode(roi, {x})[0], got, 0.f, 1.f);
}

TEST(ImageOps, ResizeRoiOutOfBoundsIsError) {
  const Tensor img = RandomU8({4, 5, 3}, 24);
  auto roi = [](int64_t top, int64_t left, int64_t h, int64_t w) {
    return ImageNode("ResizeImage", {{"height", Attribute::Int(6)},
                                     {"width", Attribute::Int(8)},
                                     {"roi_top", Attribute::Int(top)},
                                     {"roi_left", Attribute::Int(left)},
                                     {"roi_height", Attribute::Int(h)},
                                     {"roi_width", Attribute::Int(w)}});
  };
  for (const Node& node : {roi(-1, 0, 2, 2), roi(0, -1, 2, 2), roi(5, 0, 2, 2), roi(0, 7, 2, 2), roi(0, 0, 0, 2),
                           roi(0, 0, 2, 0), roi(0, 0, 7, 8), roi(0, 0, 6, 9)}) {
    SCOPED_TRACE(node.attrs.at("roi_top").i);
    try {
      RunReferenceNode(node, {img});
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("roi rows"), std::string::npos) << e.what();
    }
  }
  // In bounds at the far corner.
  EXPECT_NO_THROW(RunReferenceNode(roi(5, 7, 1, 1), {img}));
}

// The compile-time pass FuseResizeCrop: ResizeImage -> CropImage becomes one ResizeImage with an roi.
TEST(ImageOps, ResizeCropFusesInThePlan) {
  for (DType dtype : {DType::kU8, DType::kF32})
    for (const std::string mode : {"nearest", "bilinear", "bicubic", "area"}) {
      SCOPED_TRACE(mode + " " + DTypeName(dtype));
      GraphBuilder b("prep");
      auto x = b.Input("image", dtype, {37, 53, 3});
      auto r = b.Op("ResizeImage", {x},
                    {{"height", Attribute::Int(29)}, {"width", Attribute::Int(41)}, {"mode", Attribute::String(mode)}});
      auto c = b.Op("CropImage", {r},
                    {{"top", Attribute::Int(3)},
                     {"left", Attribute::Int(5)},
                     {"height", Attribute::Int(17)},
                     {"width", Attribute::Int(19)}});
      b.Output(c, "y");
      Graph g = b.Finish();
      for (Node& n : g.nodes) n.domain = kOspreyDomain;
      const Tensor img = dtype == DType::kU8 ? RandomU8({37, 53, 3}, 25) : RandomTensor({37, 53, 3}, 26, 0.f, 1.f);
      CompileOptions fused, unfused, fused_reference, reference;
      unfused.fuse = false;
      fused_reference.fast_kernels = false;
      reference.fast_kernels = false;
      reference.fuse = false;
      auto p_fused = Compile(g, {{dtype, img.shape()}}, fused);
      auto p_unfused = Compile(g, {{dtype, img.shape()}}, unfused);
      auto p_fref = Compile(g, {{dtype, img.shape()}}, fused_reference);
      auto p_ref = Compile(g, {{dtype, img.shape()}}, reference);
      EXPECT_EQ(p_fused->num_steps(), 1u);
      EXPECT_EQ(p_unfused->num_steps(), 2u);
      EXPECT_EQ(p_fref->num_steps(), 1u);
      // Fusion is exact: fused == unfused through the same kernel library.
      ExpectTensorNear(p_fused->Run({img})[0], p_unfused->Run({img})[0], 0.f, 0.f);
      ExpectTensorNear(p_fref->Run({img})[0], p_ref->Run({img})[0], 0.f, 0.f);
    }
  // A crop of a resize that is also a graph output stays unfused.
  GraphBuilder b("prep");
  auto x = b.Input("image", DType::kU8, {9, 9, 3});
  auto r = b.Op("ResizeImage", {x}, {{"height", Attribute::Int(5)}, {"width", Attribute::Int(5)}});
  auto c = b.Op("CropImage", {r},
                {{"top", Attribute::Int(1)}, {"left", Attribute::Int(1)}, {"height", Attribute::Int(3)},
                 {"width", Attribute::Int(3)}});
  b.Output(c, "y");
  b.Output(r, "resized");
  Graph g = b.Finish();
  for (Node& n : g.nodes) n.domain = kOspreyDomain;
  EXPECT_EQ(Compile(g, {{DType::kU8, {9, 9, 3}}})->num_steps(), 2u);
}

}  // namespace
}  // namespace osprey::testing
