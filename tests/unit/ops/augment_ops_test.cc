// Augmentation image ops: src/ops/augment_ops.cc, src/kernels/reference/augment.cc, src/kernels/cpu/augment_kernels.cc.
// src/kernels/cpu/augment_kernels.cc). Oracles: values computed by hand in each test from the rules in docs/augment.md
// (OpenCV / Albumentations arithmetic), and the reference kernel for every fast kernel. Comparisons with OpenCV and
// Albumentations themselves live in tests/image_ops/test_augment_ops.py.
//
// Fast-vs-reference tolerance: WarpPerspective's uint8 paths (general, and separable for axis-aligned matrices) are
// exact (same 1/32-pixel positions, integer weights), so uint8 must be bit-identical; float32 differs by
// float-vs-double weights (rtol 1e-5). GaussianBlur uint8 with OpenCV's fixed taps (multiples of 1/256) is integer
// arithmetic and bit-identical; with other taps it accumulates in float where the reference uses double and may round
// the other way at a .5 boundary (max diff 1, rare). The uint8
// colour kernels (ShiftHSV, AdjustSaturation, AdjustContrast) and LookupTable are bit-identical.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "osprey/graph.h"
#include "unit/kernels/kernel_test_util.h"

namespace osprey::testing {
namespace {

Node AugNode(const std::string& op, AttributeMap attrs = {}) {
  Node n = MakeNode(op, 1, 1, std::move(attrs));
  n.domain = kOspreyDomain;
  return n;
}

Tensor RandomU8(Shape shape, uint32_t seed) {
  std::mt19937 rng(seed);
  Tensor t(DType::kU8, shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<uint8_t>()[i] = static_cast<uint8_t>(rng() & 255);
  return t;
}

Tensor U8(Shape shape, const std::vector<uint8_t>& v) { return Tensor::FromVector<uint8_t>(std::move(shape), v); }
Tensor F32(Shape shape, const std::vector<float>& v) { return Tensor::FromVector<float>(std::move(shape), v); }

std::vector<uint8_t> Bytes(const Tensor& t) {
  return std::vector<uint8_t>(t.data<uint8_t>(), t.data<uint8_t>() + t.numel());
}

Tensor RunRef(const Node& node, const Tensor& x) { return RunReferenceNode(node, {x})[0]; }

// Runs the fast kernel (through CreateCpuKernel) twice against the reference kernel. uint8: at most `max_u8_diff`
// per element; float32: rtol/atol 1e-5.
void ExpectFastMatches(const Node& node, const Tensor& input, const std::string& expected_name, int max_u8_diff) {
  SCOPED_TRACE(node.op_type + " " + ShapeToString(input.shape()) + " " + DTypeName(input.dtype()));
  const Tensor expected = RunRef(node, input);
  std::vector<Tensor> outputs;
  KernelBuildContext bc = MakeBuildContext(node, {input}, {false}, outputs);
  std::unique_ptr<Kernel> kernel = CreateCpuKernel(bc);
  ASSERT_NE(kernel, nullptr);
  EXPECT_EQ(std::string(kernel->Name()), expected_name);
  for (int run = 0; run < 2; ++run) {
    RunKernel(*kernel, node, {input}, outputs);
    if (outputs[0].dtype() == DType::kU8)
      ExpectTensorNear(outputs[0], expected, 0.f, static_cast<float>(max_u8_diff));
    else
      ExpectTensorNear(outputs[0], expected, 1e-5f, 1e-5f);
  }
}

// Caps the SIMD level of the augmentation kernels built while it lives (OSPREY_AUGMENT_SIMD, read when a kernel is
// built), so each path is checked on a CPU that has the wider ones too. "" keeps the CPU's own level.
class ScopedSimdCap {
 public:
  explicit ScopedSimdCap(const std::string& level) {
    if (const char* old = std::getenv("OSPREY_AUGMENT_SIMD")) old_ = old, had_old_ = true;
    if (level.empty())
      unsetenv("OSPREY_AUGMENT_SIMD");
    else
      setenv("OSPREY_AUGMENT_SIMD", level.c_str(), 1);
  }
  ~ScopedSimdCap() {
    if (had_old_)
      setenv("OSPREY_AUGMENT_SIMD", old_.c_str(), 1);
    else
      unsetenv("OSPREY_AUGMENT_SIMD");
  }

 private:
  std::string old_;
  bool had_old_ = false;
};

const std::vector<std::string> kSimdLevels = {"", "avx2", "sse4"};

Node Warp(const std::vector<float>& m, int64_t h, int64_t w, const std::string& mode = "bilinear",
          const std::string& border = "constant", float border_value = 0.f) {
  return AugNode("WarpPerspective", {{"matrix", Attribute::Floats(m)},
                                     {"height", Attribute::Int(h)},
                                     {"width", Attribute::Int(w)},
                                     {"mode", Attribute::String(mode)},
                                     {"border_mode", Attribute::String(border)},
                                     {"border_value", Attribute::Float(border_value)}});
}

const std::vector<float> kIdentity = {1, 0, 0, 0, 1, 0, 0, 0, 1};

// The fast kernel CreateCpuKernel picks: uint8 with C = 1, 3, 4 and an axis-aligned matrix (m1 = m3 = 0, last row
// 0, 0, 1) -> the separable kernel; otherwise the general one (affine: no division).
std::string WarpKernelName(const std::vector<float>& m, DType dtype, int64_t c, const std::string& mode) {
  const bool affine = m[6] == 0 && m[7] == 0 && m[8] == 1;
  const bool axis_aligned = affine && m[1] == 0 && m[3] == 0;
  const std::string name = std::string("WarpPerspective") + (dtype == DType::kU8 ? "U8" : "F32") +
                           (mode == "nearest" ? "Nearest" : "Bilinear");
  if (dtype == DType::kU8 && axis_aligned && (c == 1 || c == 3 || c == 4)) return name + "AxisAligned";
  return name + (affine ? "Affine" : "");
}

TEST(AugmentOps, WarpPerspectiveHandComputed) {
  const Tensor img = U8({3, 3, 1}, {10, 20, 30, 40, 50, 60, 70, 80, 90});
  // Half-pixel shift right: each output averages a pixel and its right neighbour; the last column's neighbour is
  // the border: constant 0 -> 15, replicate 30 -> 30, reflect (index 3 -> 2) -> 30, reflect101 (3 -> 1) -> 25.
  const std::vector<float> shift = {1, 0, 0.5f, 0, 1, 0, 0, 0, 1};
  EXPECT_EQ(Bytes(RunRef(Warp(shift, 1, 3), img)), (std::vector<uint8_t>{15, 25, 15}));
  EXPECT_EQ(Bytes(RunRef(Warp(shift, 1, 3, "bilinear", "constant", 100.f), img)), (std::vector<uint8_t>{15, 25, 65}));
  EXPECT_EQ(Bytes(RunRef(Warp(shift, 1, 3, "bilinear", "replicate"), img)), (std::vector<uint8_t>{15, 25, 30}));
  EXPECT_EQ(Bytes(RunRef(Warp(shift, 1, 3, "bilinear", "reflect"), img)), (std::vector<uint8_t>{15, 25, 30}));
  EXPECT_EQ(Bytes(RunRef(Warp(shift, 1, 3, "bilinear", "reflect101"), img)), (std::vector<uint8_t>{15, 25, 25}));
  // Nearest rounds the position with ties to even (OpenCV): 0.5 -> 0, 1.5 -> 2, 2.5 -> 2.
  EXPECT_EQ(Bytes(RunRef(Warp(shift, 1, 3, "nearest"), img)), (std::vector<uint8_t>{10, 30, 30}));
  // A homogeneous scale is the identity.
  EXPECT_EQ(Bytes(RunRef(Warp({2, 0, 0, 0, 2, 0, 0, 0, 2}, 3, 3), img)), Bytes(img));
  // Perspective: w = 1 + 0.5 x. x = 1 maps to 1 / 1.5, rounded to 21/32: 10 * 11/32 + 20 * 21/32 = 16.5625 -> 17;
  // x = 2 maps to 1 exactly.
  EXPECT_EQ(Bytes(RunRef(Warp({1, 0, 0, 0, 1, 0, 0.5f, 0, 1}, 1, 3), img)), (std::vector<uint8_t>{10, 17, 20}));
  // Quarter turn (output (x, y) reads input column 2 - y, row x) to a 3x2 output: output row y is input column 2 - y.
  EXPECT_EQ(Bytes(RunRef(Warp({0, -1, 2, 1, 0, 0, 0, 0, 1}, 3, 2), img)),
            (std::vector<uint8_t>{30, 60, 20, 50, 10, 40}));
  // float32 keeps the exact value.
  const Tensor f = F32({1, 2, 1}, {0.f, 1.f});
  ExpectTensorNear(RunRef(Warp({1, 0, 0.25f, 0, 1, 0, 0, 0, 1}, 1, 1), f), F32({1, 1, 1}, {0.25f}));
}

TEST(AugmentOps, WarpPerspectiveFastMatchesReference) {
  const std::vector<std::vector<float>> matrices = {
      kIdentity,
      {0.9f, 0.2f, -3.7f, -0.15f, 1.1f, 2.3f, 0, 0, 1},                 // affine, partly outside
      {1.7f, 0.3f, -5.f, 0.1f, 1.4f, -4.f, 0, 0, 1},                    // affine zoom-out, much border
      {1.02f, 0.05f, -1.f, -0.03f, 0.97f, 0.5f, 0.004f, -0.003f, 1.f},  // perspective
      {0.8f, -0.1f, 3.f, 0.2f, 0.9f, -2.f, -0.01f, 0.02f, 0.9f},        // perspective, w crosses 0 far away
      {1e6f, 0, 0, 0, 1e6f, 0, 0, 0, 1},                                // positions far outside the int range
  };
  const std::vector<std::pair<int64_t, int64_t>> sizes = {{1, 1}, {3, 1}, {17, 23}, {40, 31}};
  int case_id = 0;
  for (const auto& m : matrices)
    for (const auto& [h, w] : sizes)
      for (int64_t c : {1, 3, 4, 5})
        for (const std::string mode : {"bilinear", "nearest"})
          for (const std::string border : {"constant", "replicate", "reflect", "reflect101"}) {
            SCOPED_TRACE(mode + " " + border + " case " + std::to_string(case_id));
            const Node node = Warp(m, h + 2, w + 3, mode, border, 77.f);
            ExpectFastMatches(node, RandomU8({h, w, c}, ++case_id), WarpKernelName(m, DType::kU8, c, mode), 0);
            if (c == 3 || c == 1)
              ExpectFastMatches(node, RandomTensor({h, w, c}, ++case_id, 0.f, 1.f),
                                WarpKernelName(m, DType::kF32, c, mode), 0);
          }
  // A batch.
  ExpectFastMatches(Warp(matrices[3], 9, 8), RandomU8({2, 7, 6, 3}, 5), "WarpPerspectiveU8Bilinear", 0);
  // RGB images wide enough for the SIMD groups of 4 pixels: sub-pixel shifts that reach the last row and column
  // (whose 2x2 taps end at the image's last byte), rotations with border pixels inside a group, a batch (the second
  // image's reads).
  const std::vector<std::vector<float>> rgb_matrices = {
      {1, 0, 0.5f, 0, 1, 0.5f, 0, 0, 1},
      {1, 0, 0.97f, 0, 1, 0.03f, 0, 0, 1},
      {0.98f, 0.21f, -6.f, -0.2f, 0.99f, 7.f, 0, 0, 1},
      {0.5f, 0, 0.25f, 0, 0.5f, 0.75f, 0, 0, 1},
      {1.02f, 0.05f, -1.f, -0.03f, 0.97f, 0.5f, 0.004f, -0.003f, 1.f}};
  for (const auto& m : rgb_matrices)
    for (const std::string border : {"constant", "replicate", "reflect101"}) {
      SCOPED_TRACE("rgb " + border + " case " + std::to_string(++case_id));
      const std::string name = WarpKernelName(m, DType::kU8, 3, "bilinear");
      ExpectFastMatches(Warp(m, 33, 45, "bilinear", border, 9.f), RandomU8({33, 45, 3}, case_id), name, 0);
      ExpectFastMatches(Warp(m, 20, 67, "bilinear", border, 9.f), RandomU8({2, 21, 66, 3}, case_id), name, 0);
    }
}

// The general uint8 RGB bilinear kernel at every SIMD level (16, 8 or 4 pixels per step) against the reference, zero
// tolerance, on outputs wide enough for several SIMD groups per row plus a tail: rotations about the centre (groups
// that straddle the image edge: some lanes inside, some on the border, some outside), a zoom-out whose rows start and
// end with whole groups outside the image (constant border: the border value; other borders: the scalar path), a
// rotation whose taps reach the last row and column (the 8-byte loads must stay inside the image), positions beyond
// the int range in part of a row (clamped), perspective, a batch.
TEST(AugmentOps, WarpPerspectiveRgbSimdMatchesReference) {
  const double pi = 3.14159265358979323846;
  auto rotation = [&](double degrees, double scale, double h, double w, double oh, double ow) {
    const double c = std::cos(degrees * pi / 180) * scale, s = std::sin(degrees * pi / 180) * scale;
    // output (x, y) -> source: centre of the output to centre of the source.
    const double cx = (w - 1) / 2, cy = (h - 1) / 2, ocx = (ow - 1) / 2, ocy = (oh - 1) / 2;
    return std::vector<float>{static_cast<float>(c),
                              static_cast<float>(-s),
                              static_cast<float>(cx - c * ocx + s * ocy),
                              static_cast<float>(s),
                              static_cast<float>(c),
                              static_cast<float>(cy - s * ocx - c * ocy),
                              0,
                              0,
                              1};
  };
  struct Case {
    std::vector<float> m;
    int64_t h, w, oh, ow;
  };
  const std::vector<Case> cases = {
      {rotation(10, 1, 61, 97, 61, 150), 61, 97, 61, 150},
      {rotation(-7.5, 1.1, 40, 90, 45, 133), 40, 90, 45, 133},
      {rotation(23, 2.5, 37, 41, 50, 171), 37, 41, 50, 171},                 // zoom-out: much border
      {rotation(90, 1, 48, 48, 48, 48), 48, 48, 48, 48},                     // quarter turn: whole pixels
      {{0.999f, 0.01f, 0.f, -0.01f, 0.999f, 0.f, 0, 0, 1}, 30, 70, 32, 80},  // reaches the last row and column
      {{0.98f, 0.02f, 1.4f, -0.02f, 0.97f, 0.3f, 0, 0, 1}, 30, 70, 30, 70},
      {{2e7f, 0.1f, -1e9f, 0.2f, 1.f, 0.f, 0, 0, 1}, 20, 40, 12, 200},  // x positions clamped in part of each row
      {{1.02f, 0.05f, -1.f, -0.03f, 0.97f, 0.5f, 0.004f, -0.003f, 1.f}, 35, 66, 35, 66},  // perspective
      // The AVX-512 path's block reads (16 pixels spanning at most 40 columns and 4 rows, 128 bytes per row): a
      // mirrored rotation (columns falling along the row, rows rising), 2.6x (39 columns per block: blocks) and
      // 2.85x zoom-outs (43: per-pixel loads), a steep rotation (5 rows: per-pixel loads), taps in the last rows
      // (128-byte reads would leave the image: per-pixel loads).
      {{-0.97f, 0.12f, 118.f, 0.12f, 0.97f, 2.f, 0, 0, 1}, 64, 120, 60, 140},
      {rotation(-2, 2.6, 90, 300, 36, 120), 90, 300, 36, 120},
      {rotation(3, 2.85, 90, 300, 36, 120), 90, 300, 36, 120},
      {rotation(17, 1, 61, 97, 61, 150), 61, 97, 61, 150},
      {{0.9f, 0.03f, 2.2f, -0.02f, 0.5f, 28.4f, 0, 0, 1}, 40, 130, 22, 140},
  };
  int id = 0;
  for (const std::string& level : kSimdLevels) {
    const ScopedSimdCap cap(level);
    for (const Case& c : cases)
      for (const std::string border : {"constant", "replicate", "reflect101"}) {
        SCOPED_TRACE("simd '" + level + "' " + border + " case " + std::to_string(++id));
        const std::string name = WarpKernelName(c.m, DType::kU8, 3, "bilinear");
        const float value = border == "constant" && id % 2 ? 0.f : 201.f;
        ExpectFastMatches(Warp(c.m, c.oh, c.ow, "bilinear", border, value), RandomU8({c.h, c.w, 3}, id), name, 0);
      }
    ExpectFastMatches(Warp(cases[0].m, 61, 150, "bilinear", "constant", 5.f), RandomU8({2, 61, 97, 3}, 99),
                      "WarpPerspectiveU8BilinearAffine", 0);
  }
}

// The separable uint8 kernel for axis-aligned matrices (scale + translate) against the reference, zero tolerance:
// resizes up and down (cv2.resize's half-pixel mapping), crops with scale, flips, fractional and whole-pixel
// translations, outputs larger than the input (border rows and columns on every side), positions exactly on the last
// column / row (fraction 0), every border mode, C = 1, 3, 4, widths that leave SIMD tails, a batch.
TEST(AugmentOps, WarpPerspectiveAxisAlignedMatchesReference) {
  struct Case {
    const char* what;
    // Matrix for an h x w input; output size.
    std::vector<float> (*matrix)(float h, float w);
    int64_t (*out_h)(int64_t h);
    int64_t (*out_w)(int64_t w);
  };
  const std::vector<Case> cases = {
      {"upscale x2.3",
       [](float, float) {
         return std::vector<float>{1 / 2.3f, 0, 0.5f / 2.3f - 0.5f, 0, 1 / 2.3f, 0.5f / 2.3f - 0.5f, 0, 0, 1};
       },
       [](int64_t h) { return h * 23 / 10; }, [](int64_t w) { return w * 23 / 10; }},
      {"downscale x2.7", [](float, float) { return std::vector<float>{2.7f, 0, 0.85f, 0, 2.7f, 0.85f, 0, 0, 1}; },
       [](int64_t h) { return std::max<int64_t>(1, h * 10 / 27); },
       [](int64_t w) { return std::max<int64_t>(1, w * 10 / 27); }},
      {"crop + scale", [](float, float) { return std::vector<float>{0.61f, 0, 2.2f, 0, 0.83f, 1.37f, 0, 0, 1}; },
       [](int64_t h) { return h; }, [](int64_t w) { return w + 5; }},
      {"horizontal flip", [](float, float w) { return std::vector<float>{-1, 0, w - 1, 0, 1, 0, 0, 0, 1}; },
       [](int64_t h) { return h; }, [](int64_t w) { return w; }},
      {"horizontal flip, padded (border, then a mirrored run)",
       [](float, float w) { return std::vector<float>{-1, 0, w + 2, 0, 1, 0, 0, 0, 1}; }, [](int64_t h) { return h; },
       [](int64_t w) { return w + 5; }},
      {"vertical flip", [](float h, float) { return std::vector<float>{1, 0, 0, 0, -1, h - 1, 0, 0, 1}; },
       [](int64_t h) { return h; }, [](int64_t w) { return w; }},
      {"both flips + scale, off the image",
       [](float h, float w) { return std::vector<float>{-0.9f, 0, w + 0.3f, 0, -1.1f, h + 0.7f, 0, 0, 1}; },
       [](int64_t h) { return h + 3; }, [](int64_t w) { return w + 4; }},
      {"fractional translation", [](float, float) { return std::vector<float>{1, 0, 3.4f, 0, 1, -2.71875f, 0, 0, 1}; },
       [](int64_t h) { return h; }, [](int64_t w) { return w; }},
      {"negative fractional translation",
       [](float, float) { return std::vector<float>{1, 0, -5.6f, 0, 1, 7.03f, 0, 0, 1}; },
       [](int64_t h) { return h + 2; }, [](int64_t w) { return w + 1; }},
      {"whole-pixel crop to the last column and row",
       [](float, float) { return std::vector<float>{1, 0, 2, 0, 1, 1, 0, 0, 1}; },
       [](int64_t h) { return std::max<int64_t>(1, h - 1); }, [](int64_t w) { return std::max<int64_t>(1, w - 2); }},
      {"identity into a larger output", [](float, float) { return kIdentity; }, [](int64_t h) { return h + 5; },
       [](int64_t w) { return w + 7; }},
      {"zoom out, border on every side",
       [](float, float) { return std::vector<float>{2.5f, 0, -30.25f, 0, 1.9f, -20.5f, 0, 0, 1}; },
       [](int64_t h) { return h + 11; }, [](int64_t w) { return w + 37; }},
      {"pad (PadIfNeeded)", [](float, float) { return std::vector<float>{1, 0, -6, 0, 1, -3, 0, 0, 1}; },
       [](int64_t h) { return h + 7; }, [](int64_t w) { return w + 13; }},
      {"far outside (reflect periods)",
       [](float, float) { return std::vector<float>{0.7f, 0, -300.2f, 0, 1.3f, 250.6f, 0, 0, 1}; },
       [](int64_t h) { return h; }, [](int64_t w) { return w + 2; }},
  };
  const std::vector<std::pair<int64_t, int64_t>> sizes = {{1, 1}, {2, 3}, {17, 23}, {29, 70}};
  int case_id = 1000;
  for (const Case& tc : cases)
    for (const auto& [h, w] : sizes)
      for (int64_t c : {1, 3, 4})
        for (const std::string mode : {"bilinear", "nearest"})
          for (const std::string border : {"constant", "replicate", "reflect", "reflect101"}) {
            ++case_id;
            SCOPED_TRACE(std::string(tc.what) + " " + mode + " " + border + " C=" + std::to_string(c) + " " +
                         std::to_string(h) + "x" + std::to_string(w));
            const std::vector<float> m = tc.matrix(static_cast<float>(h), static_cast<float>(w));
            const Node node = Warp(m, tc.out_h(h), tc.out_w(w), mode, border, 77.f);
            ExpectFastMatches(
                node, RandomU8({h, w, c}, case_id),
                "WarpPerspectiveU8" + std::string(mode == "nearest" ? "Nearest" : "Bilinear") + "AxisAligned", 0);
          }
  // Bench-sized resize (long SIMD runs and row reuse), a batch (the second image's last row), a wide C = 1 image.
  const float s = 1.25f;
  const std::vector<float> resize = {s, 0, 0.5f * s - 0.5f, 0, s, 0.5f * s - 0.5f, 0, 0, 1};
  ExpectFastMatches(Warp(resize, 160, 160), RandomU8({200, 200, 3}, 7), "WarpPerspectiveU8BilinearAxisAligned", 0);
  ExpectFastMatches(Warp(resize, 30, 45, "bilinear", "reflect101"), RandomU8({3, 38, 57, 4}, 8),
                    "WarpPerspectiveU8BilinearAxisAligned", 0);
  ExpectFastMatches(Warp({0.8f, 0, 0.1f, 0, 0.8f, 0.1f, 0, 0, 1}, 9, 301, "bilinear", "replicate"),
                    RandomU8({2, 7, 240, 1}, 9), "WarpPerspectiveU8BilinearAxisAligned", 0);
  ExpectFastMatches(Warp({-1, 0, 239, 0, 1, 0, 0, 0, 1}, 5, 240, "nearest"), RandomU8({2, 5, 240, 3}, 10),
                    "WarpPerspectiveU8NearestAxisAligned", 0);
  // Wide RGB rows at every SIMD level (VBMI: groups of 8 columns from one 64-byte window; AVX2: 4 columns; scalar):
  // rising and falling offsets (a flip), a downscale whose groups span more than 64 bytes (2.7: AVX2 instead), an
  // upscale, a window that reaches the border.
  for (const std::string& level : kSimdLevels) {
    const ScopedSimdCap cap(level);
    SCOPED_TRACE("simd '" + level + "'");
    for (const auto& [sx, bx] : std::vector<std::pair<float, float>>{{1.25f, 0.1f}, {-1.25f, 229.3f}, {2.7f, 0.85f},
                                                                     {0.43f, 3.2f}, {1.01f, 90.6f}})
      ExpectFastMatches(Warp({sx, 0, bx, 0, 1.1f, 0.2f, 0, 0, 1}, 90, 150, "bilinear", "reflect101"),
                        RandomU8({100, 230, 3}, 11), "WarpPerspectiveU8BilinearAxisAligned", 0);
  }
}

// Hand-computed values through the separable kernel: a 2x horizontal upscale of one row (cv2.resize mapping
// x_in = (x + 0.5) / 2 - 0.5, i.e. fractions 24/32 and 8/32 between neighbours) and a horizontal flip.
TEST(AugmentOps, WarpPerspectiveAxisAlignedHandComputed) {
  const Tensor row = U8({1, 3, 1}, {0, 64, 200});
  auto run_fast = [&](const Node& node) {
    std::vector<Tensor> outputs;
    KernelBuildContext bc = MakeBuildContext(node, {row}, {false}, outputs);
    std::unique_ptr<Kernel> kernel = CreateCpuKernel(bc);
    if (!kernel) return std::vector<uint8_t>{};
    EXPECT_EQ(std::string(kernel->Name()), "WarpPerspectiveU8BilinearAxisAligned");
    RunKernel(*kernel, node, {row}, outputs);
    return Bytes(outputs[0]);
  };
  // x = 0: -0.25 -> taps (-1 -> 0, 0), 0; x = 1: 0.25 -> 0 * 24/32 + 64 * 8/32 = 16; x = 2: 0.75 -> 48;
  // x = 3: 1.25 -> 64 * 24/32 + 200 * 8/32 = 98; x = 4: 1.75 -> 64 * 8/32 + 200 * 24/32 = 166; x = 5: 2.25 -> 200.
  EXPECT_EQ(run_fast(Warp({0.5f, 0, -0.25f, 0, 1, 0, 0, 0, 1}, 1, 6, "bilinear", "replicate")),
            (std::vector<uint8_t>{0, 16, 48, 98, 166, 200}));
  EXPECT_EQ(run_fast(Warp({-1, 0, 2, 0, 1, 0, 0, 0, 1}, 1, 3)), (std::vector<uint8_t>{200, 64, 0}));
  // Shifted by +0.5 with a constant border 100: the last column blends 200 with the border value: 150.
  EXPECT_EQ(run_fast(Warp({1, 0, 0.5f, 0, 1, 0, 0, 0, 1}, 1, 3, "bilinear", "constant", 100.f)),
            (std::vector<uint8_t>{32, 132, 150}));
}

Node Blur(int64_t kx, int64_t ky, float sx, float sy) {
  return AugNode("GaussianBlur", {{"ksize_x", Attribute::Int(kx)},
                                  {"ksize_y", Attribute::Int(ky)},
                                  {"sigma_x", Attribute::Float(sx)},
                                  {"sigma_y", Attribute::Float(sy)}});
}

TEST(AugmentOps, GaussianBlurKernelRules) {
  // OpenCV: ksize = cvRound(sigma * (uint8 ? 3 : 4) * 2 + 1) | 1 (ties to even), when ksize is 0.
  EXPECT_EQ(GaussianBlurKernelSize(0, 1.0, true), 7);
  EXPECT_EQ(GaussianBlurKernelSize(0, 1.0, false), 9);
  EXPECT_EQ(GaussianBlurKernelSize(0, 0.75, true), 7);  // 5.5 -> 6 -> 7
  EXPECT_EQ(GaussianBlurKernelSize(0, 0.25, true), 3);  // 2.5 -> 2 -> 3
  EXPECT_EQ(GaussianBlurKernelSize(5, 3.0, true), 5);
  // Fixed tables for size <= 9 with sigma 0 (OpenCV 4.x; cv2.getGaussianKernel(k, 0) * 256).
  const std::vector<double> k5 = GaussianKernel1D(5, 0);
  const double t5[5] = {16, 64, 96, 64, 16};
  for (int i = 0; i < 5; ++i) EXPECT_DOUBLE_EQ(k5[i] * 256, t5[i]);
  const std::vector<double> k9 = GaussianKernel1D(9, 0);
  const double t9[9] = {4, 13, 30, 51, 60, 51, 30, 13, 4};
  for (int i = 0; i < 9; ++i) EXPECT_DOUBLE_EQ(k9[i] * 256, t9[i]);
  // Size 11, sigma 0: the formula with sigma = ((11 - 1) / 2 - 1) * 0.3 + 0.8 = 2.0.
  const std::vector<double> k11 = GaussianKernel1D(11, 0);
  EXPECT_NEAR(k11[4] / k11[5], std::exp(-0.5 / 4.0), 1e-12);
  EXPECT_NEAR(k11[0] / k11[5], std::exp(-0.5 * 25 / 4.0), 1e-12);
  EXPECT_NEAR(k11[5], 51.34474604513814 / 256, 1e-12);  // cv2.getGaussianKernel(11, 0)[5]
  double sum = 0;
  for (double v : k11) sum += v;
  EXPECT_NEAR(sum, 1.0, 1e-12);
  // uint8 taps in 1/256 (OpenCV's fixed point), size 5, sigma 1.3: x 256 = 25.286, 61.427, 82.575, ...; error
  // diffusion gives 25 (carry +0.286), 62 (61.713), centre 256 - 2 * 87 = 82 (plain rounding: 25, 61, 84). cv2 agrees:
  // GaussianBlur of a 255 impulse with ksize (5, 1), sigma 1.3 gives 25 62 82 62 25.
  const std::vector<double> q = FixedPointTaps256(GaussianKernel1D(5, 1.3));
  const double tq[5] = {25, 62, 82, 62, 25};
  for (int i = 0; i < 5; ++i) EXPECT_DOUBLE_EQ(q[i] * 256, tq[i]);
  std::vector<uint8_t> impulse(9, 0);
  impulse[4] = 255;
  EXPECT_EQ(Bytes(RunRef(Blur(5, 1, 1.3f, 1.3f), U8({1, 9, 1}, impulse))),
            (std::vector<uint8_t>{0, 0, 25, 62, 82, 62, 25, 0, 0}));
}

TEST(AugmentOps, GaussianBlurHandComputed) {
  // Taps (0.25, 0.5, 0.25) along x only, BORDER_REFLECT_101: [0, 100, 200] -> [50, 100, 150].
  EXPECT_EQ(Bytes(RunRef(Blur(3, 1, 0, 0), U8({1, 3, 1}, {0, 100, 200}))), (std::vector<uint8_t>{50, 100, 150}));
  // Along y only (ksize_x 1), on a column.
  EXPECT_EQ(Bytes(RunRef(Blur(1, 3, 0, 0), U8({3, 1, 1}, {0, 100, 200}))), (std::vector<uint8_t>{50, 100, 150}));
  // 5x5 impulse: the outer product of the taps, 255/16 = 15.9 -> 16 at corners, 31.9 -> 32 at edges, 63.75 -> 64.
  std::vector<uint8_t> impulse(25, 0), expected(25, 0);
  impulse[12] = 255;
  const uint8_t inner[9] = {16, 32, 16, 32, 64, 32, 16, 32, 16};
  for (int y = 0; y < 3; ++y)
    for (int x = 0; x < 3; ++x) expected[(y + 1) * 5 + x + 1] = inner[y * 3 + x];
  EXPECT_EQ(Bytes(RunRef(Blur(3, 3, 0, 0), U8({5, 5, 1}, impulse))), expected);
  // On a 3x3 image the reflected border (index -1 -> 1) folds the impulse back onto itself: 63.75 -> 64 everywhere.
  EXPECT_EQ(Bytes(RunRef(Blur(3, 3, 0, 0), U8({3, 3, 1}, {0, 0, 0, 0, 255, 0, 0, 0, 0}))), std::vector<uint8_t>(9, 64));
  // ksize 1 both ways is the identity; a flat image stays flat.
  const Tensor img = RandomU8({5, 6, 3}, 3);
  EXPECT_EQ(Bytes(RunRef(Blur(1, 1, 0, 0), img)), Bytes(img));
  std::vector<uint8_t> flat(7 * 9 * 3, 77);
  EXPECT_EQ(Bytes(RunRef(Blur(0, 0, 2.5f, 0), U8({7, 9, 3}, flat))), flat);
}

TEST(AugmentOps, GaussianBlurFastMatchesReference) {
  const std::vector<std::tuple<int64_t, int64_t, float, float>> params = {
      {3, 3, 0, 0}, {5, 5, 0, 0},    {7, 7, 0, 0},      {9, 9, 0, 0},      {3, 7, 0, 0},    {1, 5, 0, 0},
      {9, 1, 0, 0}, {0, 0, 1.3f, 0}, {0, 0, 0.6f, 2.f}, {15, 5, 3.f, 1.f}, {31, 31, 5.f, 0}};
  const std::vector<std::pair<int64_t, int64_t>> sizes = {{1, 1}, {2, 3}, {5, 40}, {37, 29}};
  uint32_t seed = 0;
  for (const auto& [kx, ky, sx, sy] : params)
    for (const auto& [h, w] : sizes)
      for (int64_t c : {1, 3, 4}) {
        SCOPED_TRACE("ksize " + std::to_string(kx) + "x" + std::to_string(ky) + " sigma " + std::to_string(sx) + "," +
                     std::to_string(sy));
        const Node node = Blur(kx, ky, sx, sy);
        // uint8 taps are multiples of 1/256 (OpenCV's fixed point): the integer kernel is exact, unrolled up to 9
        // taps, a run-time count beyond; at every SIMD level (rows of 87 and 116 bytes: 32-, 16- and 1-element steps).
        const Tensor img = RandomU8({h, w, c}, ++seed);
        for (const std::string& level : kSimdLevels) {
          const ScopedSimdCap cap(level);
          SCOPED_TRACE("simd '" + level + "'");
          ExpectFastMatches(node, img, "GaussianBlurU8FixedPoint", 0);
        }
        ExpectFastMatches(node, RandomTensor({h, w, c}, ++seed, 0.f, 1.f), "GaussianBlurF32Separable", 1);
      }
  // Extremes of the 16-bit horizontal sums: all 255 stays 255, a checkerboard of 0 / 255.
  std::vector<uint8_t> white(20 * 37 * 3, 255), checker(20 * 37 * 3);
  for (size_t i = 0; i < checker.size(); ++i) checker[i] = (i / 3 + i / (37 * 3)) % 2 ? 255 : 0;
  for (const std::string& level : kSimdLevels) {
    const ScopedSimdCap cap(level);
    SCOPED_TRACE("simd '" + level + "'");
    ExpectFastMatches(Blur(5, 5, 0, 0), RandomU8({3, 9, 11, 3}, 99), "GaussianBlurU8FixedPoint", 0);
    ExpectFastMatches(Blur(0, 0, 1.f, 0), RandomU8({3, 9, 11, 3}, 98), "GaussianBlurU8FixedPoint", 0);
    for (int64_t k : {1, 3, 5, 7, 9, 13, 21}) {
      ExpectFastMatches(Blur(k, k, 0, 0), U8({20, 37, 3}, white), "GaussianBlurU8FixedPoint", 0);
      ExpectFastMatches(Blur(k, std::max<int64_t>(1, 9 - k + 1), 0, 0), U8({20, 37, 3}, checker),
                        "GaussianBlurU8FixedPoint", 0);
    }
    ExpectFastMatches(Blur(0, 0, 6.f, 0), U8({20, 37, 3}, white), "GaussianBlurU8FixedPoint", 0);
  }
}

TEST(AugmentOps, LookupTable) {
  std::vector<int64_t> invert(256), per_channel(512);
  for (int v = 0; v < 256; ++v) invert[v] = 255 - v, per_channel[v] = v / 2, per_channel[256 + v] = 255;
  invert[128] = 7;  // not affine, so the lookup kernels run (LookupTableAffine tests the affine path)
  const Tensor img = U8({1, 2, 2}, {0, 10, 200, 255});
  const Node shared = AugNode("LookupTable", {{"table", Attribute::Ints(invert)}});
  EXPECT_EQ(Bytes(RunRef(shared, img)), (std::vector<uint8_t>{255, 245, 55, 0}));
  const Node split = AugNode("LookupTable", {{"table", Attribute::Ints(per_channel)}});
  EXPECT_EQ(Bytes(RunRef(split, img)), (std::vector<uint8_t>{0, 255, 100, 255}));
  // The fast kernel at every SIMD level (AVX512-VBMI: 64 bytes per step, one table per channel picked by lane masks
  // that depend on the step's channel phase): the same hand-computed values, then against the reference on random
  // images (shared table, one table per channel for C = 2..5), sizes that leave loop tails and several 64-byte steps.
  for (const std::string& level : kSimdLevels) {
    const ScopedSimdCap cap(level);
    SCOPED_TRACE("simd '" + level + "'");
    ExpectFastMatches(shared, img, "LookupTableU8", 0);
    ExpectFastMatches(split, img, "LookupTableU8PerChannel", 0);
    std::mt19937 rng(3);
    for (int64_t c : {1, 2, 3, 4, 5}) {
      std::vector<int64_t> table(256), tables(256 * c);
      for (int64_t& v : table) v = static_cast<int64_t>(rng() & 255);
      for (int64_t& v : tables) v = static_cast<int64_t>(rng() & 255);
      const Node one = AugNode("LookupTable", {{"table", Attribute::Ints(table)}});
      const Node many = AugNode("LookupTable", {{"table", Attribute::Ints(tables)}});
      for (const Shape& shape : {Shape{1, 1, c}, Shape{5, 7, c}, Shape{2, 9, 13, c}, Shape{33, 67, c}}) {
        ExpectFastMatches(one, RandomU8(shape, static_cast<uint32_t>(c)), "LookupTableU8", 0);
        ExpectFastMatches(many, RandomU8(shape, static_cast<uint32_t>(c + 10)),
                          c == 1 ? "LookupTableU8" : "LookupTableU8PerChannel", 0);
      }
    }
  }
}

// Tables that are affine maps (clamped, truncated) run as their formula with AVX2 (LookupTableU8Affine), bit-identical
// to the table: ColorJitter's brightness x * f, RandomBrightnessContrast's x * a + b, HueSaturationValue's gray value
// shift x + v, and an inversion (tables as augment's LutFrom builds them: double arithmetic, clamp, truncate). A table
// that is not affine (gamma, random) keeps the lookup.
TEST(AugmentOps, LookupTableAffine) {
  const ScopedSimdCap cap("avx2");
  auto table_of = [](const std::function<double(int)>& f) {
    std::vector<int64_t> t(256);
    for (int x = 0; x < 256; ++x) t[x] = static_cast<int64_t>(std::clamp(f(x), 0.0, 255.0));
    return t;
  };
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<std::vector<int64_t>> affine = {table_of([](int x) { return 255.0 - x; }),
                                              table_of([](int x) { return x + 17.0; }),
                                              table_of([](int x) { return x - 40.0; }),
                                              table_of([](int x) { return x * 1.2; }),
                                              table_of([](int) { return 99.0; })};
  for (int k = 0; k < 300; ++k) {
    const double f = 0.5 + unit(rng), a = 0.6 + 0.8 * unit(rng), b = (unit(rng) - 0.5) * 102;
    affine.push_back(table_of([&](int x) { return x * f; }));
    affine.push_back(table_of([&](int x) { return x * a + b; }));
  }
  int fitted = 0;
  for (const std::vector<int64_t>& table : affine) {
    const Node node = AugNode("LookupTable", {{"table", Attribute::Ints(table)}});
    std::vector<Tensor> outputs;
    const Tensor img = RandomU8({19, 23, 3}, static_cast<uint32_t>(fitted));
    KernelBuildContext bc = MakeBuildContext(node, {img}, {false}, outputs);
    std::unique_ptr<Kernel> kernel = CreateCpuKernel(bc);
    ASSERT_NE(kernel, nullptr);
    if (std::string(kernel->Name()) != "LookupTableU8Affine") continue;  // counted below
    ++fitted;
    // Every byte value, then a random image with a loop tail (19 * 23 * 3 = 1311 bytes).
    std::vector<uint8_t> all(256);
    for (int v = 0; v < 256; ++v) all[v] = static_cast<uint8_t>(v);
    ExpectFastMatches(node, U8({1, 256, 1}, all), "LookupTableU8Affine", 0);
    ExpectFastMatches(node, img, "LookupTableU8Affine", 0);
  }
  // The AVX2 path exists only where the CPU has AVX2; where it does, every one of these tables fits.
  if (__builtin_cpu_supports("avx2")) {
    EXPECT_EQ(fitted, static_cast<int>(affine.size()));
  }
  const std::vector<int64_t> gamma = table_of([](int x) { return std::pow(x / 255.0, 0.7) * 255.0; });
  const Node node = AugNode("LookupTable", {{"table", Attribute::Ints(gamma)}});
  ExpectFastMatches(node, RandomU8({7, 9, 3}, 1), "LookupTableU8", 0);
}

TEST(AugmentOps, FillRects) {
  const Tensor img = U8({3, 4, 2}, std::vector<uint8_t>(24, 1));
  // Rect rows [1, 9) x cols [-2, 2) clipped to rows 1..2, cols 0..1; an empty rect (left == right) changes nothing.
  const Node node = AugNode(
      "FillRects", {{"rects", Attribute::Ints({1, -2, 9, 2, 0, 3, 2, 3})}, {"fill", Attribute::Ints({7, 200})}});
  std::vector<uint8_t> expected(24, 1);
  for (int y = 1; y < 3; ++y)
    for (int x = 0; x < 2; ++x) expected[(y * 4 + x) * 2] = 7, expected[(y * 4 + x) * 2 + 1] = 200;
  EXPECT_EQ(Bytes(RunRef(node, img)), expected);
  // One fill value for all channels, float image, float fill; no rects: a copy.
  const Node one =
      AugNode("FillRects", {{"rects", Attribute::Ints({0, 0, 1, 1})}, {"fill", Attribute::Floats({0.5f})}});
  ExpectTensorNear(RunRef(one, F32({1, 2, 1}, {0.f, 1.f})), F32({1, 2, 1}, {0.5f, 1.f}));
  const Node none = AugNode("FillRects", {{"fill", Attribute::Floats({0.f})}});
  EXPECT_EQ(Bytes(RunRef(none, img)), Bytes(img));
}

int GrayOf(int r, int g, int b) { return (r * 9798 + g * 19235 + b * 3735 + (1 << 14)) >> 15; }

TEST(AugmentOps, AdjustContrastAndSaturation) {
  // Gray image [0, 100]: mean 50. Factor 2: albucore's table v * 2 - 50, clipped: 0 -> 0, 100 -> 150.
  const Tensor g = U8({1, 2, 1}, {0, 100});
  EXPECT_EQ(Bytes(RunRef(AugNode("AdjustContrast", {{"factor", Attribute::Float(2.f)}}), g)),
            (std::vector<uint8_t>{0, 150}));
  // Factor 0.5: v * 0.5 + 25 -> 25, 75. Factor 0: round(mean) everywhere.
  EXPECT_EQ(Bytes(RunRef(AugNode("AdjustContrast", {{"factor", Attribute::Float(0.5f)}}), g)),
            (std::vector<uint8_t>{25, 75}));
  EXPECT_EQ(Bytes(RunRef(AugNode("AdjustContrast", {{"factor", Attribute::Float(0.f)}}), U8({1, 2, 1}, {0, 101}))),
            (std::vector<uint8_t>{51, 51}));
  // RGB: the mean is over the uint8 gray image; 0.5 * v + 0.5 * m truncates.
  const Tensor rgb = U8({1, 2, 3}, {200, 100, 50, 10, 20, 30});
  const double m = (GrayOf(200, 100, 50) + GrayOf(10, 20, 30)) / 2.0;
  std::vector<uint8_t> expected;
  for (int v : {200, 100, 50, 10, 20, 30})
    expected.push_back(static_cast<uint8_t>(v * 0.5f + static_cast<float>(m * 0.5)));
  EXPECT_EQ(Bytes(RunRef(AugNode("AdjustContrast", {{"factor", Attribute::Float(0.5f)}}), rgb)), expected);

  // Saturation: gray of (200, 100, 50) is 124; factor 0 -> gray, factor 2 -> 2x - gray clipped, 0.5 -> rounded mean.
  const int gray = GrayOf(200, 100, 50);
  ASSERT_EQ(gray, 124);
  const Tensor px = U8({1, 1, 3}, {200, 100, 50});
  auto sat = [&](float f) { return Bytes(RunRef(AugNode("AdjustSaturation", {{"factor", Attribute::Float(f)}}), px)); };
  EXPECT_EQ(sat(0.f), (std::vector<uint8_t>{124, 124, 124}));
  EXPECT_EQ(sat(2.f), (std::vector<uint8_t>{255, 76, 0}));
  EXPECT_EQ(sat(0.5f), (std::vector<uint8_t>{162, 112, 87}));  // 162, 112, 87
  // C = 1: identity.
  EXPECT_EQ(Bytes(RunRef(AugNode("AdjustSaturation", {{"factor", Attribute::Float(3.f)}}), g)), Bytes(g));
}

TEST(AugmentOps, ShiftHsv) {
  auto shift = [](const Tensor& x, float h, float s, float v) {
    return Bytes(RunRef(
        AugNode("ShiftHSV",
                {{"hue", Attribute::Float(h)}, {"saturation", Attribute::Float(s)}, {"value", Attribute::Float(v)}}),
        x));
  };
  const Tensor red = U8({1, 1, 3}, {255, 0, 0});
  EXPECT_EQ(shift(red, 0, 0, 0), (std::vector<uint8_t>{255, 0, 0}));
  EXPECT_EQ(shift(red, 60, 0, 0), (std::vector<uint8_t>{0, 255, 0}));      // +120 degrees
  EXPECT_EQ(shift(red, -60, 0, 0), (std::vector<uint8_t>{0, 0, 255}));     // -120 degrees (mod 180)
  EXPECT_EQ(shift(red, 0, 0, -55.7f), (std::vector<uint8_t>{200, 0, 0}));  // value shift truncates to -55
  EXPECT_EQ(shift(red, 0, -255, 0), (std::vector<uint8_t>{255, 255, 255}));
  EXPECT_EQ(shift(red, 0, 0, -300), (std::vector<uint8_t>{0, 0, 0}));
  // Round trip without shifts of a random image stays within OpenCV's HSV quantisation (checked against cv2 in the
  // pytest); gray pixels are exact.
  // All shifts 0: Albumentations returns the image itself (no HSV round trip).
  const Tensor img = RandomU8({6, 7, 3}, 11);
  EXPECT_EQ(shift(img, 0, 0, 0), Bytes(img));
  const Tensor gray = U8({1, 2, 3}, {9, 9, 9, 180, 180, 180});
  EXPECT_EQ(shift(gray, 33, 0, 0), Bytes(gray));
}

// The AVX2 ShiftHSV computes the reference's t = float(1 - double(s) * frac) as one fused multiply-add (1 - s * frac
// rounded once): equal for every saturation s = k / 255 and every frac the kernel meets (hh and 1 - hh of the 180
// hues' sectors), so the kernel stays bit-identical.
TEST(AugmentOps, ShiftHsvFusedStepIsTheDoubleStep) {
  int differ = 0;
  for (int hs = 0; hs < 180; ++hs) {
    float hh = static_cast<float>(hs) * (6.f / 180.f);
    hh -= std::floor(hh);
    for (float frac : {hh, 1.f - hh})
      for (int k = 0; k < 256; ++k) {
        const float s = static_cast<float>(k) * (1.f / 255.f);
        differ += static_cast<float>(1.0 - static_cast<double>(s) * frac) != std::fmaf(-s, frac, 1.f);
      }
  }
  EXPECT_EQ(differ, 0);
}

// Every RGB colour (4096 x 4096 pixels, so every SIMD block and no tail), then odd-sized images (loop tails), a batch.
Tensor AllColours() {
  Tensor t(DType::kU8, {4096, 4096, 3});
  uint8_t* p = t.data<uint8_t>();
  for (int64_t i = 0; i < 4096 * 4096; ++i)
    p[i * 3] = i >> 16 & 255, p[i * 3 + 1] = i >> 8 & 255, p[i * 3 + 2] = i & 255;
  return t;
}

// At every SIMD level (ShiftHSV and AdjustSaturation: 16, 8 or 1 pixels per step; AdjustContrast: VBMI table, AVX2
// formula or scalar); every colour at the CPU's own level.
TEST(AugmentOps, ColourFastMatchesReference) {
  const Tensor all = AllColours();
  const std::vector<Tensor> images = {RandomU8({1, 1, 3}, 1), RandomU8({7, 13, 3}, 2), RandomU8({33, 31, 3}, 3),
                                      RandomU8({2, 5, 9, 3}, 4)};
  const std::vector<std::tuple<float, float, float>> shifts = {{12.6f, 0, 0},  {-17.3f, 25.9f, -30.2f}, {180, 0, 0},
                                                               {0, -40.5f, 0}, {-359.5f, 300, 1},       {0.25f, 0, 0},
                                                               {-1e-30f, 0, 0}};  // not a rotation: gathers
  for (const std::string& level : kSimdLevels) {
    const ScopedSimdCap cap(level);
    SCOPED_TRACE("simd '" + level + "'");
    const bool every_colour = level.empty();
    for (size_t k = 0; k < shifts.size(); ++k) {
      const auto [h, s, v] = shifts[k];
      const Node node =
          AugNode("ShiftHSV",
                  {{"hue", Attribute::Float(h)}, {"saturation", Attribute::Float(s)}, {"value", Attribute::Float(v)}});
      if (k < 2 && every_colour) ExpectFastMatches(node, all, "ShiftHsvU8", 0);
      for (const Tensor& img : images) ExpectFastMatches(node, img, "ShiftHsvU8", 0);
    }
    ExpectFastMatches(AugNode("ShiftHSV", {}), images[2], "ShiftHsvU8", 0);  // no shift: a copy
    for (float factor : {0.f, 0.4f, 1.f, 1.5f, 3.f, 1000.f}) {
      SCOPED_TRACE("factor " + std::to_string(factor));
      const Node sat = AugNode("AdjustSaturation", {{"factor", Attribute::Float(factor)}});
      const Node con = AugNode("AdjustContrast", {{"factor", Attribute::Float(factor)}});
      if ((factor == 1.5f || factor == 0.4f) && every_colour) {
        ExpectFastMatches(sat, all, "AdjustSaturationU8", 0);
        ExpectFastMatches(con, all, "AdjustContrastU8", 0);
      }
      for (const Tensor& img : images) {
        ExpectFastMatches(sat, img, "AdjustSaturationU8", 0);
        ExpectFastMatches(con, img, "AdjustContrastU8", 0);
      }
      ExpectFastMatches(sat, RandomU8({9, 11, 1}, 5), "AdjustSaturationU8", 0);
      ExpectFastMatches(con, RandomU8({9, 11, 1}, 6), "AdjustContrastU8", 0);
      ExpectFastMatches(con, RandomU8({3, 9, 37, 1}, 7), "AdjustContrastU8", 0);
    }
  }
}

TEST(AugmentOps, AddGaussianNoise) {
  auto noise = [](const Tensor& x, float mean, float std, int64_t per_channel, int64_t seed) {
    return RunRef(AugNode("AddGaussianNoise", {{"mean", Attribute::Float(mean)},
                                               {"std", Attribute::Float(std)},
                                               {"per_channel", Attribute::Int(per_channel)},
                                               {"seed", Attribute::Int(seed)}}),
                  x);
  };
  const Tensor grey = U8({256, 256, 3}, std::vector<uint8_t>(256 * 256 * 3, 128));
  const Tensor a = noise(grey, 0, 10, 1, 42);
  EXPECT_EQ(Bytes(a), Bytes(noise(grey, 0, 10, 1, 42)));  // deterministic
  EXPECT_NE(Bytes(a), Bytes(noise(grey, 0, 10, 1, 43)));  // the seed matters
  double sum = 0, sum2 = 0;
  const int64_t n = a.numel();
  for (int64_t i = 0; i < n; ++i) {
    const double d = a.data<uint8_t>()[i] - 128.0;
    sum += d, sum2 += d * d;
  }
  const double mean = sum / n, std = std::sqrt(sum2 / n - mean * mean);
  // 196608 samples: the standard error of the mean is 0.023, of the std 0.016; rounding adds 1/12 to the variance.
  EXPECT_NEAR(mean, 0.0, 0.1);
  EXPECT_NEAR(std, std::sqrt(100.0 + 1.0 / 12), 0.08);
  // Mean shift, and one draw per pixel when per_channel = 0.
  const Tensor b = noise(grey, 5, 0, 1, 1);
  EXPECT_EQ(Bytes(b), std::vector<uint8_t>(n, 133));
  const Tensor c = noise(grey, 0, 20, 0, 7);
  int64_t differing = 0;
  for (int64_t p = 0; p < n / 3; ++p) {
    const uint8_t* px = c.data<uint8_t>() + p * 3;
    EXPECT_TRUE(px[0] == px[1] && px[1] == px[2]) << p;
    differing += px[0] != 128;
  }
  EXPECT_GT(differing, n / 3 / 2);
}

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

TEST(AugmentOps, Errors) {
  const Tensor img = RandomU8({4, 5, 3}, 16);
  ExpectInvalid(AugNode("WarpPerspective", {{"matrix", Attribute::Floats({1, 0, 0, 0, 1, 0, 0, 0})},
                                            {"height", Attribute::Int(2)},
                                            {"width", Attribute::Int(2)}}),
                img, "9 floats");
  ExpectInvalid(AugNode("WarpPerspective", {{"height", Attribute::Int(2)}, {"width", Attribute::Int(2)}}), img,
                "'matrix' is required");
  ExpectInvalid(Warp(kIdentity, 2, 2, "bilinear", "wrap"), img, "got \"wrap\"");
  ExpectInvalid(Warp(kIdentity, 2, 2, "bicubic"), img, "got \"bicubic\"");
  ExpectInvalid(Warp(kIdentity, 0, 2), img, "'height' must be in");
  ExpectInvalid(Warp(kIdentity, 2, 2), RandomU8({0, 5, 3}, 1), "at least one row");
  ExpectInvalid(Warp(kIdentity, 2, 2), Tensor::FromVector<int64_t>({1, 1, 1}, {1}), "uint8 or float32");
  ExpectInvalid(Blur(4, 3, 0, 0), img, "'ksize_x' must be odd");
  ExpectInvalid(Blur(0, 0, 0, 0), img, "positive sigma");
  ExpectInvalid(Blur(3, 3, -1, 0), img, ">= 0");
  ExpectInvalid(Blur(0, 0, 500, 0), img, "exceeds the limit");
  ExpectInvalid(AugNode("LookupTable", {{"table", Attribute::Ints(std::vector<int64_t>(255, 0))}}), img, "256 values");
  std::vector<int64_t> bad(256, 0);
  bad[7] = 300;
  ExpectInvalid(AugNode("LookupTable", {{"table", Attribute::Ints(bad)}}), img, "300 at index 7");
  ExpectInvalid(AugNode("LookupTable", {{"table", Attribute::Ints(std::vector<int64_t>(256, 0))}}),
                RandomTensor({2, 2, 3}, 1), "must be uint8");
  ExpectInvalid(AugNode("AdjustContrast", {{"factor", Attribute::Float(1.f)}}), RandomU8({2, 2, 4}, 1), "RGB (C = 3)");
  ExpectInvalid(AugNode("AdjustContrast"), img, "'factor' is required");
  ExpectInvalid(AugNode("AdjustSaturation", {{"factor", Attribute::Float(-1.f)}}), img, ">= 0");
  ExpectInvalid(AugNode("ShiftHSV", {{"hue", Attribute::Float(10.f)}}), RandomU8({2, 2, 1}, 1), "RGB image");
  ExpectInvalid(AugNode("AddGaussianNoise", {{"std", Attribute::Float(1.f)}, {"per_channel", Attribute::Int(2)}}), img,
                "'per_channel'");
  ExpectInvalid(AugNode("AddGaussianNoise"), img, "'std' is required");
  ExpectInvalid(AugNode("FillRects", {{"rects", Attribute::Ints({0, 0, 1})}, {"fill", Attribute::Floats({0})}}), img,
                "4 ints per rectangle");
  ExpectInvalid(AugNode("FillRects", {{"rects", Attribute::Ints({2, 0, 1, 1})}, {"fill", Attribute::Floats({0})}}), img,
                "bottom < top");
  ExpectInvalid(AugNode("FillRects", {{"fill", Attribute::Floats({0, 1})}}), img, "one per channel (3)");
}

}  // namespace
}  // namespace osprey::testing

