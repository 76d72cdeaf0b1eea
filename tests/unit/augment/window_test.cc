// Pipeline::SourceWindow: applying a pipeline to the window it names (a sample that is part of its source) must give
// the very bytes and objects that applying it to the whole source gives, for every seed; windows only where they are
// exact (affine leading warps) and only when smaller than the image.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "osprey/augment.h"
#include "osprey/error.h"

namespace osprey::augment {
namespace {

// A textured 331 x 247 image (odd sizes) with four boxes, one touching the left edge.
Sample Source() {
  Sample s;
  const int64_t h = 247, w = 331;
  s.image = Tensor(DType::kU8, {h, w, 3});
  uint32_t r = 7;
  uint8_t* p = s.image.data<uint8_t>();
  for (int64_t i = 0; i < h * w * 3; ++i) {
    r = r * 1664525u + 1013904223u;
    p[i] = static_cast<uint8_t>((i / 3 % w) + (i / (3 * w)) * 2 + (r >> 28));
  }
  const double boxes[4][4] = {{0, 10, 60, 80}, {100, 40, 200, 150}, {250, 180, 330, 246}, {150, 5, 170, 30}};
  for (int b = 0; b < 4; ++b) {
    Object o;
    o.x0 = boxes[b][0], o.y0 = boxes[b][1], o.x1 = boxes[b][2], o.y1 = boxes[b][3];
    o.category = b;
    s.objects.push_back(o);
  }
  return s;
}

Sample Window(const Sample& source, const std::array<int64_t, 4>& win) {
  const int64_t w = source.image.dim(1), c = source.image.dim(2);
  Sample s;
  s.image = Tensor(DType::kU8, {win[3] - win[1], win[2] - win[0], c});
  for (int64_t y = win[1]; y < win[3]; ++y)
    std::memcpy(s.image.data<uint8_t>() + (y - win[1]) * (win[2] - win[0]) * c,
                source.image.data<uint8_t>() + (y * w + win[0]) * c, (win[2] - win[0]) * c);
  s.objects = source.objects;
  s.source_width = w, s.source_height = source.image.dim(0), s.window_x = win[0], s.window_y = win[1];
  return s;
}

// Over `seeds` seeds: every window must reproduce the whole-image result; returns how many seeds had a window and
// the mean share of the image they cover.
std::pair<int, double> CheckWindows(const Pipeline& p, int seeds) {
  const Sample source = Source();
  int windows = 0;
  double area = 0;
  for (uint64_t seed = 1; seed <= static_cast<uint64_t>(seeds); ++seed) {
    std::array<int64_t, 4> win{};
    if (!p.SourceWindow(source.image.dim(1), source.image.dim(0), 3, source.objects, seed, &win)) continue;
    SCOPED_TRACE("seed " + std::to_string(seed) + " window " + std::to_string(win[0]) + "," + std::to_string(win[1]) +
                 "-" + std::to_string(win[2]) + "," + std::to_string(win[3]));
    ++windows;
    area += double(win[2] - win[0]) * double(win[3] - win[1]) / (331.0 * 247.0);
    EXPECT_TRUE(win[0] >= 0 && win[1] >= 0 && win[2] <= 331 && win[3] <= 247 && win[0] < win[2] && win[1] < win[3]);
    const Sample whole = p.Apply(source, seed);
    // The window itself, or any larger one (a decoder may return whole columns around it), gives the same bytes.
    const std::array<int64_t, 4> wider = {std::max<int64_t>(0, win[0] - 21), win[1], std::min<int64_t>(331, win[2] + 9),
                                          win[3]};
    const Sample part = p.Apply(Window(source, seed % 2 ? win : wider), seed);
    EXPECT_EQ(whole.image.shape(), part.image.shape());
    if (whole.image.shape() != part.image.shape()) continue;
    EXPECT_EQ(std::memcmp(whole.image.data<uint8_t>(), part.image.data<uint8_t>(), whole.image.numel()), 0);
    EXPECT_EQ(whole.objects.size(), part.objects.size());
    for (size_t i = 0; i < std::min(whole.objects.size(), part.objects.size()); ++i) {
      EXPECT_EQ(whole.objects[i].x0, part.objects[i].x0);
      EXPECT_EQ(whole.objects[i].y1, part.objects[i].y1);
    }
  }
  return {windows, windows ? area / windows : 0.0};
}

TEST(SourceWindow, CropsThenWarpsGiveTheSameBytes) {
  // bench/augment's detection pipeline (Albumentations 2.x names): the crop, flip and affine compose into one warp.
  const Pipeline p = Pipeline::FromSteps(
      {{"RandomResizedCrop", 1.0, R"({"size": [200, 200], "scale": [0.1, 0.6]})"},
       {"HorizontalFlip", 0.5},
       {"Affine", 0.7, R"({"scale": [0.9, 1.1], "translate_percent": [-0.05, 0.05], "rotate": [-10, 10]})"},
       {"ColorJitter", 0.8},
       {"Resize", 1.0, R"({"height": 96, "width": 96})"}});
  const auto [windows, area] = CheckWindows(p, 60);
  EXPECT_GT(windows, 50);  // nearly every seed reads less than the image
  EXPECT_LT(area, 0.8);
}

TEST(SourceWindow, ReflectingAndReplicatingBorders) {
  for (int border : {1, 2, 4}) {
    SCOPED_TRACE("border_mode " + std::to_string(border));
    const Pipeline p = Pipeline::FromSteps(
        {{"RandomCrop", 1.0, R"({"height": 90, "width": 120})"},
         {"Affine", 1.0,
          R"({"rotate": [-30, 30], "scale": [0.6, 1.4], "border_mode": )" + std::to_string(border) + "}"},
         {"GaussianBlur", 1.0, R"({"blur_limit": [3, 3]})"}});
    EXPECT_GT(CheckWindows(p, 40).first, 20);
  }
}

TEST(SourceWindow, NoWindowWhenTheWholeImageIsRead) {
  const Sample s = Source();
  std::array<int64_t, 4> win{};
  auto window = [&](const Pipeline& p) { return p.SourceWindow(331, 247, 3, s.objects, 3, &win); };
  EXPECT_FALSE(
      window(Pipeline::FromSteps({{"ColorJitter", 1.0}, {"RandomCrop", 1.0, R"({"height": 50, "width": 50})"}})));
  EXPECT_FALSE(
      window(Pipeline::FromSteps({{"HorizontalFlip", 1.0}, {"Resize", 1.0, R"({"height": 50, "width": 50})"}})));
  EXPECT_FALSE(window(Pipeline::FromSteps({{"Perspective", 1.0, R"({"scale": [0.05, 0.1]})"}})));  // not affine
  EXPECT_TRUE(window(Pipeline::FromSteps({{"CenterCrop", 1.0, R"({"height": 50, "width": 60})"}})));
  EXPECT_EQ(win[2] - win[0],
            60 + 5);  // the crop, two columns of margin left, three right ([floor(lo) - 2, floor(hi) + 4))
}

TEST(SourceWindow, BadWindowsAreRefused) {
  const Pipeline p = Pipeline::FromSteps({{"CenterCrop", 1.0, R"({"height": 50, "width": 60})"}});
  Sample s = Window(Source(), {10, 10, 100, 100});
  s.window_x = 300;  // 90 wide at 300: past the 331-pixel source
  EXPECT_THROW(p.Apply(s, 1), Error);
  s = Window(Source(), {10, 10, 100, 100});
  s.masks = {Tensor(DType::kU8, {90, 90, 1})};
  EXPECT_THROW(p.Apply(s, 1), Error);
}

}  // namespace
}  // namespace osprey::augment
