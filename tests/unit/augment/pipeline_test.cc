// Pipeline parsing, geometry composition and the geometry oracle: coloured rectangles at known boxes must end up
// where the transformed boxes say, for every geometric transform.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>

#include "augment/geometry.h"
#include "osprey/augment.h"
#include "osprey/error.h"

namespace osprey::augment {
namespace {

constexpr uint8_t kColors[3][3] = {{230, 20, 20}, {20, 230, 20}, {20, 20, 230}};

// 160x120 grey image with three solid rectangles (category = colour index).
Sample SyntheticSample() {
  Sample s;
  s.image = Tensor(DType::kU8, {120, 160, 3});
  uint8_t* p = s.image.data<uint8_t>();
  for (int64_t i = 0; i < 120 * 160 * 3; ++i) p[i] = 100;
  const int boxes[3][4] = {{10, 12, 60, 52}, {80, 20, 150, 70}, {30, 70, 100, 112}};  // x0, y0, x1, y1
  for (int b = 0; b < 3; ++b) {
    for (int y = boxes[b][1]; y < boxes[b][3]; ++y)
      for (int x = boxes[b][0]; x < boxes[b][2]; ++x)
        for (int c = 0; c < 3; ++c) p[(y * 160 + x) * 3 + c] = kColors[b][c];
    Object o;
    o.x0 = boxes[b][0], o.y0 = boxes[b][1], o.x1 = boxes[b][2], o.y1 = boxes[b][3];
    o.category = b;
    o.polygons = {{double(boxes[b][0]), double(boxes[b][1]), double(boxes[b][2]), double(boxes[b][1]),
                   double(boxes[b][2]), double(boxes[b][3]), double(boxes[b][0]), double(boxes[b][3])}};
    o.keypoints = {(boxes[b][0] + boxes[b][2]) / 2.0, (boxes[b][1] + boxes[b][3]) / 2.0, 2};
    s.objects.push_back(o);
  }
  return s;
}

// Bounding box (x0, y0, x1, y1, count) of the pixels close to colour `c`.
std::array<double, 5> ColorRegion(const Tensor& img, int c) {
  const int64_t h = img.dim(0), w = img.dim(1);
  const uint8_t* p = img.data<uint8_t>();
  double x0 = 1e9, y0 = 1e9, x1 = -1, y1 = -1, n = 0;
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x) {
      int d = 0;
      for (int k = 0; k < 3; ++k) d += std::abs(int(p[(y * w + x) * 3 + k]) - int(kColors[c][k]));
      if (d < 90) {
        x0 = std::min<double>(x0, x), y0 = std::min<double>(y0, y);
        x1 = std::max<double>(x1, x + 1), y1 = std::max<double>(y1, y + 1), ++n;
      }
    }
  return {x0, y0, x1, y1, n};
}

double IoU(const std::array<double, 5>& a, const Object& b) {
  const double ix = std::max(0.0, std::min(a[2], b.x1) - std::max(a[0], b.x0));
  const double iy = std::max(0.0, std::min(a[3], b.y1) - std::max(a[1], b.y0));
  const double inter = ix * iy;
  const double uni = (a[2] - a[0]) * (a[3] - a[1]) + (b.x1 - b.x0) * (b.y1 - b.y0) - inter;
  return uni > 0 ? inter / uni : 0;
}

Pipeline One(const std::string& transform_json) {
  return Pipeline::FromJson(R"({"type": "Compose", "transforms": [)" + transform_json + "]}");
}

void CheckOracle(const Pipeline& p, const std::string& what) {
  const Sample in = SyntheticSample();
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    SCOPED_TRACE(what + " seed " + std::to_string(seed));
    ApplyReport report;
    const Sample out = p.Apply(in, seed, {}, &report);
    ASSERT_EQ(out.image.rank(), 3);
    ASSERT_EQ(out.image.dim(2), 3);
    EXPECT_LE(report.warps, 1) << "consecutive geometric steps must compose into one warp";
    for (int c = 0; c < 3; ++c) {
      const auto region = ColorRegion(out.image, c);
      const Object* obj = nullptr;
      for (const Object& o : out.objects)
        if (o.category == c) obj = &o;
      if (region[4] < 30) {  // the rectangle (nearly) left the image: its box must be gone or tiny
        if (obj) {
          EXPECT_LT((obj->x1 - obj->x0) * (obj->y1 - obj->y0), 60.0) << "colour " << c;
        }
        continue;
      }
      ASSERT_NE(obj, nullptr) << "colour " << c << " visible (" << region[4] << " px) but its box was dropped";
      EXPECT_GE(IoU(region, *obj), 0.9) << "colour " << c << " pixels [" << region[0] << ", " << region[1] << ", "
                                        << region[2] << ", " << region[3] << "] box [" << obj->x0 << ", " << obj->y0
                                        << ", " << obj->x1 << ", " << obj->y1 << "]";
      EXPECT_GE(obj->x0, 0);
      EXPECT_GE(obj->y0, 0);
      EXPECT_LE(obj->x1, out.image.dim(1));
      EXPECT_LE(obj->y1, out.image.dim(0));
      // The keypoint (rectangle centre) lands on the rectangle's colour when it is kept.
      if (obj->keypoints.size() == 3 && obj->keypoints[2] > 0) {
        const int64_t kx = static_cast<int64_t>(obj->keypoints[0]), ky = static_cast<int64_t>(obj->keypoints[1]);
        const uint8_t* px = out.image.data<uint8_t>() + (ky * out.image.dim(1) + kx) * 3;
        int d = 0;
        for (int k = 0; k < 3; ++k) d += std::abs(int(px[k]) - int(kColors[c][k]));
        EXPECT_LT(d, 90) << "keypoint of colour " << c << " at " << kx << "," << ky;
      }
    }
  }
}

TEST(AugmentGeometry, EveryGeometricTransformMovesBoxesWithPixels) {
  const std::vector<std::string> transforms = {
      R"({"type": "HorizontalFlip", "p": 1})",
      R"({"type": "VerticalFlip", "p": 1})",
      R"({"type": "Transpose", "p": 1})",
      R"({"type": "RandomRotate90", "p": 1})",
      R"({"type": "Rotate", "limit": 30, "border_mode": 0, "p": 1})",
      R"({"type": "Rotate", "limit": [-40, 40], "border_mode": 0, "p": 1})",  // reflected borders mirror objects without boxes
      R"({"type": "Affine", "scale": [0.8, 1.2], "translate_percent": [-0.1, 0.1], "rotate": [-20, 20], "shear": [-10, 10], "p": 1})",
      R"({"type": "Perspective", "scale": [0.05, 0.1], "p": 1})",
      R"({"type": "RandomResizedCrop", "size": [96, 128], "scale": [0.6, 1.0], "p": 1})",
      R"({"type": "RandomCrop", "height": 100, "width": 140, "p": 1})",
      R"({"type": "CenterCrop", "height": 100, "width": 100, "p": 1})",
      R"({"type": "BBoxSafeRandomCrop", "p": 1})",
      R"({"type": "RandomSizedBBoxSafeCrop", "height": 128, "width": 128, "p": 1})",
      R"({"type": "Resize", "height": 60, "width": 200, "p": 1})",
      R"({"type": "LongestMaxSize", "max_size": 200, "p": 1})",
      R"({"type": "SmallestMaxSize", "max_size": 90, "p": 1})",
      R"({"type": "PadIfNeeded", "min_height": 200, "min_width": 180, "border_mode": 0, "p": 1})",
      R"({"type": "GridDistortion", "distort_limit": 0.3, "p": 1})",
      R"({"type": "GridDistortion", "num_steps": 3, "distort_limit": [0.4, 0.4], "normalized": false, "p": 1})",
  };
  for (const std::string& t : transforms) CheckOracle(One(t), t);
}

TEST(AugmentGeometry, BoxesFollowPixelsInEveryBoxConvention) {
  // Boxes given in each convention (converted to absolute corners with the input size, as a dataset reader does) and
  // read back in that convention with the output size must still frame their rectangles.
  const Pipeline p = One(R"({"type": "Affine", "scale": [0.7, 1.3], "rotate": [-25, 25], "translate_percent": [-0.1, 0.1], "p": 1},
                            {"type": "Resize", "height": 90, "width": 210, "p": 1})");
  for (BoxFormat f : {BoxFormat::kCoco, BoxFormat::kPascalVoc, BoxFormat::kYolo, BoxFormat::kAlbumentations}) {
    SCOPED_TRACE(BoxFormatName(f));
    Sample in = SyntheticSample();
    for (Object& o : in.objects) {
      const auto given = BoxFromXyxy(f, {o.x0, o.y0, o.x1, o.y1}, 160, 120);  // as stored in a file
      const auto abs = BoxToXyxy(f, given, 160, 120);
      o.x0 = abs[0], o.y0 = abs[1], o.x1 = abs[2], o.y1 = abs[3];
    }
    for (uint64_t seed = 1; seed <= 4; ++seed) {
      const Sample out = p.Apply(in, seed);
      for (const Object& o : out.objects) {
        const auto stored = BoxFromXyxy(f, {o.x0, o.y0, o.x1, o.y1}, out.image.dim(1), out.image.dim(0));
        const auto back = BoxToXyxy(f, stored, out.image.dim(1), out.image.dim(0));
        Object b = o;
        b.x0 = back[0], b.y0 = back[1], b.x1 = back[2], b.y1 = back[3];
        const auto region = ColorRegion(out.image, static_cast<int>(o.category));
        if (region[4] < 30) continue;
        EXPECT_GE(IoU(region, b), 0.9) << "seed " << seed << " colour " << o.category;
      }
    }
  }
}

TEST(AugmentGeometry, AChainOfGeometricStepsIsOneWarp) {
  const Pipeline p = One(R"({"type": "HorizontalFlip", "p": 1}, {"type": "Rotate", "limit": 15, "border_mode": 0, "p": 1},
      {"type": "RandomCrop", "height": 100, "width": 120, "p": 1}, {"type": "Resize", "height": 150, "width": 180, "p": 1})");
  CheckOracle(p, "chain");
  ApplyReport r;
  const Sample out = p.Apply(SyntheticSample(), 3, {}, &r);
  EXPECT_EQ(r.warps, 1);
  EXPECT_EQ(r.graphs, 1);
  EXPECT_EQ(out.image.dim(0), 150);
  EXPECT_EQ(out.image.dim(1), 180);
}

TEST(AugmentGeometry, FlipsAreExactPixelPermutations) {
  const Sample in = SyntheticSample();
  const Sample out = One(R"({"type": "HorizontalFlip", "p": 1})").Apply(in, 1);
  const int64_t h = 120, w = 160;
  for (int64_t y = 0; y < h; y += 7)
    for (int64_t x = 0; x < w; x += 5)
      for (int c = 0; c < 3; ++c)
        ASSERT_EQ(out.image.data<uint8_t>()[(y * w + x) * 3 + c], in.image.data<uint8_t>()[(y * w + (w - 1 - x)) * 3 + c]);
  // Box of colour 0: x in [10, 60) -> [100, 150).
  EXPECT_DOUBLE_EQ(out.objects[0].x0, 100);
  EXPECT_DOUBLE_EQ(out.objects[0].x1, 150);
}

TEST(AugmentGeometry, BoxFilterDropsObjectsWithTheirTargets) {
  const Pipeline p = Pipeline::FromJson(
      R"({"type": "Compose", "transforms": [{"type": "CenterCrop", "height": 120, "width": 40, "p": 1}], "bbox_params": {"min_visibility": 0.3}})");
  // CenterCrop 40 of 160: x in [60, 100). Box 1 (80..150): 20/70 = 0.29 -> dropped; box 2 (30..100): 40/70 -> kept.
  ApplyReport r;
  const Sample out = p.Apply(SyntheticSample(), 1, {}, &r);
  ASSERT_EQ(out.objects.size(), 1u);
  EXPECT_EQ(out.objects[0].category, 2);
  EXPECT_DOUBLE_EQ(out.objects[0].x0, 0);
  EXPECT_DOUBLE_EQ(out.objects[0].x1, 40);
  EXPECT_EQ(r.objects_dropped, 2);
  // The polygon was clipped to the crop as well.
  ASSERT_EQ(out.objects[0].polygons.size(), 1u);
  for (size_t i = 0; i < out.objects[0].polygons[0].size(); i += 2) {
    EXPECT_GE(out.objects[0].polygons[0][i], 0);
    EXPECT_LE(out.objects[0].polygons[0][i], 40);
  }
}

TEST(AugmentPipeline, SameSeedSameBytesOtherSeedOtherBytes) {
  const Pipeline p = Pipeline::FromJson(R"({"type": "Compose", "transforms": [
      {"type": "Affine", "rotate": [-30, 30], "p": 0.7},
      {"type": "OneOf", "p": 1, "transforms": [{"type": "ColorJitter", "p": 1}, {"type": "GaussNoise", "p": 1}]},
      {"type": "CoarseDropout", "num_holes_range": [1, 3], "p": 0.5}]})");
  const Sample in = SyntheticSample();
  const Sample a = p.Apply(in, 42), b = p.Apply(in, 42), c = p.Apply(in, 43);
  ASSERT_EQ(a.image.nbytes(), b.image.nbytes());
  EXPECT_EQ(0, std::memcmp(a.image.raw(), b.image.raw(), a.image.nbytes()));
  EXPECT_TRUE(a.image.nbytes() != c.image.nbytes() || std::memcmp(a.image.raw(), c.image.raw(), a.image.nbytes()) != 0);
  EXPECT_NE(ItemSeed(1, 2, 3), ItemSeed(1, 3, 2));
  EXPECT_EQ(ItemSeed(1, 2, 3), ItemSeed(1, 2, 3));
}

TEST(AugmentPipeline, ReadsAlbumentationsJson) {
  // As written by albumentations 1.4.24 A.save(..., data_format="json") (trimmed).
  const std::string alb = R"({"__version__": "1.4.24", "transform": {"__class_fullname__": "Compose", "p": 1.0,
    "transforms": [{"__class_fullname__": "HorizontalFlip", "p": 0.5},
      {"__class_fullname__": "Rotate", "p": 0.5, "limit": [-30, 30], "interpolation": 1, "border_mode": 4, "fill": 0.0,
       "fill_mask": 0.0, "rotate_method": "largest_box", "crop_border": false, "mask_interpolation": 0},
      {"__class_fullname__": "RandomBrightnessContrast", "p": 0.5, "brightness_limit": [-0.2, 0.2],
       "contrast_limit": [-0.2, 0.2], "brightness_by_max": true, "ensure_safe_range": false},
      {"__class_fullname__": "SomeOf", "p": 1, "transforms": [{"__class_fullname__": "ToGray", "p": 0.5,
       "num_output_channels": 3, "method": "weighted_average"}], "n": 1, "replace": false}],
    "bbox_params": {"format": "coco", "label_fields": ["labels"], "min_area": 16, "min_visibility": 0.1,
      "min_width": 0.0, "min_height": 0.0, "check_each_transform": true, "clip": false},
    "keypoint_params": null, "additional_targets": {}, "is_check_shapes": true}})";
  const Pipeline p = Pipeline::FromJson(alb);
  EXPECT_DOUBLE_EQ(p.box_filter().min_area, 16);
  EXPECT_DOUBLE_EQ(p.box_filter().min_visibility, 0.1);
  const std::string d = p.Describe();
  EXPECT_NE(d.find("Rotate"), std::string::npos) << d;
  EXPECT_NE(d.find("SomeOf"), std::string::npos) << d;
  const Sample out = p.Apply(SyntheticSample(), 7);
  EXPECT_EQ(out.image.dim(0), 120);
}

TEST(AugmentPipeline, ReadsAlbumentations13Json) {
  // Albumentations 1.3.x spelling (value / mode / cval, var_limit, quality_lower, max_holes, height + width).
  const std::string alb13 = R"({"__version__": "1.3.1", "transform": {"__class_fullname__": "Compose", "p": 1.0,
    "transforms": [
      {"__class_fullname__": "RandomResizedCrop", "always_apply": false, "p": 1.0, "height": 96, "width": 128,
       "scale": [0.5, 1.0], "ratio": [0.75, 1.3333333333333333], "interpolation": 1},
      {"__class_fullname__": "Rotate", "always_apply": false, "p": 0.5, "limit": [-20, 20], "interpolation": 1,
       "border_mode": 0, "value": null, "mask_value": null, "rotate_method": "largest_box", "crop_border": false},
      {"__class_fullname__": "Affine", "always_apply": false, "p": 0.5, "interpolation": 1, "mask_interpolation": 0,
       "cval": 0, "mode": 0, "scale": {"x": [0.9, 1.1], "y": [0.9, 1.1]}, "translate_percent": null,
       "translate_px": null, "rotate": [-10, 10], "fit_output": false, "shear": {"x": [0.0, 0.0], "y": [0.0, 0.0]},
       "cval_mask": 0, "keep_ratio": false, "rotate_method": "largest_box"},
      {"__class_fullname__": "PadIfNeeded", "always_apply": false, "p": 1.0, "min_height": 128, "min_width": 160,
       "pad_height_divisor": null, "pad_width_divisor": null, "border_mode": 0, "value": 114, "mask_value": null,
       "position": "center"},
      {"__class_fullname__": "RandomGamma", "always_apply": false, "p": 0.5, "gamma_limit": [80, 120], "eps": null},
      {"__class_fullname__": "GaussNoise", "always_apply": false, "p": 0.5, "var_limit": [10.0, 50.0],
       "per_channel": true, "mean": 0},
      {"__class_fullname__": "ImageCompression", "always_apply": false, "p": 0.5, "quality_lower": 70,
       "quality_upper": 90, "compression_type": 0},
      {"__class_fullname__": "CoarseDropout", "always_apply": false, "p": 0.5, "max_holes": 4, "max_height": 12,
       "max_width": 12, "min_holes": 1, "min_height": 4, "min_width": 4, "fill_value": 0, "mask_fill_value": null}],
    "bbox_params": {"format": "pascal_voc", "label_fields": ["labels"], "min_area": 0.0, "min_visibility": 0.0,
      "min_width": 0.0, "min_height": 0.0, "check_each_transform": true},
    "keypoint_params": null, "additional_targets": {}, "is_check_shapes": true}})";
  const Pipeline p = Pipeline::FromJson(alb13);
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    const Sample out = p.Apply(SyntheticSample(), seed);
    EXPECT_EQ(out.image.dim(0), 128);
    EXPECT_EQ(out.image.dim(1), 160);
  }
  // The padding fill came through "value": the border rows are 114 (the crop output is 96 x 128, padded to 128 x 160).
  const Pipeline pad = Pipeline::FromJson(R"({"type": "Compose", "transforms": [{"type": "PadIfNeeded", "p": 1,
      "min_height": 130, "min_width": 170, "border_mode": 0, "value": 114, "mask_value": null}]})");
  const Sample padded = pad.Apply(SyntheticSample(), 1);
  EXPECT_EQ(padded.image.data<uint8_t>()[0], 114);
}

void ExpectError(const std::string& json, ErrorCode code, const std::string& needle) {
  try {
    Pipeline::FromJson(json);
    ADD_FAILURE() << "no error for " << json;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(AugmentPipeline, BadSpecsAreRefusedWithTheirPath) {
  ExpectError("{not json", ErrorCode::kInvalidArgument, "not valid JSON");
  ExpectError(R"({"type": "Compose", "transforms": [{"type": "Emboss", "p": 1}]})", ErrorCode::kUnsupported, "Emboss");
  ExpectError(R"({"type": "Compose", "transforms": [{"type": "Rotate", "limit": "big"}]})",
              ErrorCode::kInvalidArgument, "transforms[0].limit");
  ExpectError(R"({"type": "Compose", "transforms": [{"type": "Rotate", "crop_border": true}]})", ErrorCode::kUnsupported,
              "crop_border");
  ExpectError(R"({"type": "Compose", "transforms": [{"type": "Resize", "height": 10, "wdth": 5}]})",
              ErrorCode::kInvalidArgument, "width");
  ExpectError(R"({"type": "Compose", "transforms": [{"type": "HorizontalFlip", "colour": 1}]})", ErrorCode::kUnsupported,
              "colour");
  ExpectError(R"({"type": "Compose", "transforms": [{"type": "HorizontalFlip", "p": 2}]})", ErrorCode::kInvalidArgument,
              "transforms[0].p");
  ExpectError(R"({"type": "Compose", "transforms": [{"type": "Rotate", "border_mode": 3}]})", ErrorCode::kUnsupported,
              "BORDER_WRAP");
  ExpectError(R"({"type": "Compose", "transforms": [{"type": "HorizontalFlip"}, {"type": "Mosaic", "height": 64, "width": 64}]})",
              ErrorCode::kUnsupported, "first step");
}

TEST(AugmentPipeline, ACropLargerThanTheImageNamesTheTransform) {
  const Pipeline p = One(R"({"type": "RandomCrop", "height": 500, "width": 500, "p": 1})");
  try {
    p.Apply(SyntheticSample(), 1);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("RandomCrop"), std::string::npos) << e.what();
  }
}

TEST(AugmentPipeline, MosaicPlacesFourTilesAndTheirBoxes) {
  const Pipeline p = Pipeline::FromJson(
      R"({"type": "Compose", "transforms": [{"type": "Mosaic", "height": 240, "width": 320, "center_range": [0.5, 0.5], "p": 1}]})");
  EXPECT_EQ(p.images_needed(), 4);
  ApplyReport r;
  const Sample out = p.Apply(SyntheticSample(), 5, [](int) { return SyntheticSample(); }, &r);
  ASSERT_EQ(out.image.dim(0), 240);
  ASSERT_EQ(out.image.dim(1), 320);
  // Tiles are scaled to fit the canvas (factor 2) and cut at the centre: every object kept lies in one quadrant.
  EXPECT_GT(out.objects.size(), 3u);
  for (const Object& o : out.objects) {
    const bool left = o.x1 <= 160 + 1e-9, right = o.x0 >= 160 - 1e-9, top = o.y1 <= 120 + 1e-9,
               bottom = o.y0 >= 120 - 1e-9;
    EXPECT_TRUE((left || right) && (top || bottom)) << o.x0 << "," << o.y0 << "," << o.x1 << "," << o.y1;
    // The box's colour fills its centre.
    const int64_t cx = static_cast<int64_t>((o.x0 + o.x1) / 2), cy = static_cast<int64_t>((o.y0 + o.y1) / 2);
    const uint8_t* px = out.image.data<uint8_t>() + (cy * 320 + cx) * 3;
    int d = 0;
    for (int k = 0; k < 3; ++k) d += std::abs(int(px[k]) - int(kColors[o.category][k]));
    EXPECT_LT(d, 90);
  }
  EXPECT_THROW(p.Apply(SyntheticSample(), 5), Error);  // no source of other tiles
}

TEST(AugmentPipeline, BuiltInCppLikeTheJson) {
  BoxFilter filter;
  filter.min_visibility = 0.3;
  const Pipeline built = Pipeline::FromSteps({{"CenterCrop", 1.0, R"({"height": 120, "width": 40})"},
                                              {"OneOf", 1.0, "{}", {{"HorizontalFlip", 1.0}, {"VerticalFlip", 1.0}}}},
                                             filter);
  const Pipeline parsed = Pipeline::FromJson(R"({"type": "Compose", "transforms": [
      {"type": "CenterCrop", "height": 120, "width": 40, "p": 1},
      {"type": "OneOf", "p": 1, "transforms": [{"type": "HorizontalFlip", "p": 1}, {"type": "VerticalFlip", "p": 1}]}],
      "bbox_params": {"min_visibility": 0.3}})");
  const Sample in = SyntheticSample();
  for (uint64_t seed = 1; seed < 5; ++seed) {
    const Sample a = built.Apply(in, seed), b = parsed.Apply(in, seed);
    ASSERT_EQ(a.image.nbytes(), b.image.nbytes());
    EXPECT_EQ(0, std::memcmp(a.image.raw(), b.image.raw(), a.image.nbytes()));
    ASSERT_EQ(a.objects.size(), 1u);  // the filter came along (see BoxFilterDropsObjectsWithTheirTargets)
    EXPECT_EQ(b.objects.size(), 1u);
  }
  EXPECT_THROW(Pipeline::FromSteps({{"Rotate", 1.0, "[1, 2]"}}), Error);
  EXPECT_THROW(Pipeline::FromSteps({{"Emboss", 1.0}}), Error);  // not (yet) supported
}

// Oracle: the formula computed by hand, (x / max_pixel_value - mean) / std, for the grey 100 background.
TEST(AugmentPipeline, NormalizeReturnsFloat32AndOnlyAsTheLastStep) {
  const Pipeline p = Pipeline::FromJson(R"({"type": "Compose", "transforms": [{"type": "HorizontalFlip", "p": 1},
      {"type": "Normalize", "mean": 0.5, "std": 0.25, "max_pixel_value": 200, "p": 1}]})");
  EXPECT_TRUE(p.returns_float());
  const Sample out = p.Apply(SyntheticSample(), 1);
  ASSERT_EQ(out.image.dtype(), DType::kF32);
  EXPECT_NEAR(out.image.data<float>()[0], (100.0 / 200 - 0.5) / 0.25, 1e-6);
  EXPECT_EQ(out.objects.size(), 3u);
  EXPECT_FALSE(One(R"({"type": "HorizontalFlip", "p": 1})").returns_float());
  ExpectError(R"({"type": "Compose", "transforms": [{"type": "Normalize", "p": 1}, {"type": "HorizontalFlip"}]})",
              ErrorCode::kUnsupported, "Normalize must be the last step");
}

TEST(AugmentBoxes, ConventionsConvertBothWays) {
  const std::array<double, 4> xyxy = {10, 20, 50, 100};
  const std::array<double, 4> coco = BoxFromXyxy(BoxFormat::kCoco, xyxy, 200, 400);
  EXPECT_EQ(coco, (std::array<double, 4>{10, 20, 40, 80}));
  const std::array<double, 4> yolo = BoxFromXyxy(BoxFormat::kYolo, xyxy, 200, 400);
  EXPECT_DOUBLE_EQ(yolo[0], 0.15);
  EXPECT_DOUBLE_EQ(yolo[1], 0.15);
  EXPECT_DOUBLE_EQ(yolo[2], 0.2);
  EXPECT_DOUBLE_EQ(yolo[3], 0.2);
  const std::array<double, 4> alb = BoxFromXyxy(BoxFormat::kAlbumentations, xyxy, 200, 400);
  EXPECT_DOUBLE_EQ(alb[2], 0.25);
  for (BoxFormat f : {BoxFormat::kCoco, BoxFormat::kPascalVoc, BoxFormat::kYolo, BoxFormat::kAlbumentations}) {
    const auto back = BoxToXyxy(f, BoxFromXyxy(f, xyxy, 200, 400), 200, 400);
    for (int i = 0; i < 4; ++i) EXPECT_NEAR(back[i], xyxy[i], 1e-9) << BoxFormatName(f);
    EXPECT_EQ(ParseBoxFormat(BoxFormatName(f)), f);
  }
  EXPECT_THROW(ParseBoxFormat("xywh"), Error);
}

TEST(AugmentMath, HomographyMapsTheQuad) {
  const std::array<std::array<double, 2>, 4> src = {{{3, 4}, {90, 10}, {80, 70}, {5, 60}}};
  const std::array<std::array<double, 2>, 4> dst = {{{0, 0}, {100, 0}, {100, 80}, {0, 80}}};
  const Mat3 h = HomographyFromQuad(src, dst);
  for (int i = 0; i < 4; ++i) {
    double x, y;
    ASSERT_TRUE(h.Map(src[i][0], src[i][1], &x, &y));
    EXPECT_NEAR(x, dst[i][0], 1e-6);
    EXPECT_NEAR(y, dst[i][1], 1e-6);
  }
  const Mat3 id = h * h.Inverse();
  EXPECT_TRUE(id.IsIdentity(1e-9));
}

// Masks and free keypoints move with the image: a horizontal flip mirrors the mask's columns exactly (nearest
// sampling of an exact mirror), photometric steps leave the mask alone, and a keypoint at x maps to width - x.
TEST(PipelineMasks, FollowTheWarpAndSkipPhotometricSteps) {
  Pipeline p = Pipeline::FromSteps({{"HorizontalFlip", 1.0}, {"RandomGamma", 1.0, R"({"gamma_limit": [150, 150]})"}});
  Sample s = SyntheticSample();
  Tensor mask(DType::kU8, {120, 160, 1});
  for (int64_t y = 0; y < 120; ++y)
    for (int64_t x = 0; x < 160; ++x) mask.data<uint8_t>()[y * 160 + x] = static_cast<uint8_t>((x * 7 + y) % 251);
  s.masks = {mask};
  s.keypoints = {10.5, 20.5, 2, 159.75, 0.25, 2};
  Sample out = p.Apply(s, 5);
  ASSERT_EQ(out.masks.size(), 1u);
  ASSERT_EQ(out.masks[0].shape(), (Shape{120, 160, 1}));
  for (int64_t y = 0; y < 120; ++y)
    for (int64_t x = 0; x < 160; ++x)
      ASSERT_EQ(out.masks[0].data<uint8_t>()[y * 160 + x], mask.data<uint8_t>()[y * 160 + (159 - x)]) << x << "," << y;
  ASSERT_EQ(out.keypoints.size(), 6u);
  EXPECT_DOUBLE_EQ(out.keypoints[0], 160 - 10.5);
  EXPECT_DOUBLE_EQ(out.keypoints[1], 20.5);
  EXPECT_DOUBLE_EQ(out.keypoints[3], 160 - 159.75);
  EXPECT_EQ(out.objects.size(), 3u);
}

TEST(PipelineMasks, KeypointsLeavingTheImageBecomeZeroAndAreNeverFiltered) {
  // A centre crop to 80x60 (offset 40, 30): one point stays, one leaves; the box filter drops objects, not free keypoints.
  Pipeline p = Pipeline::FromSteps({{"CenterCrop", 1.0, R"({"height": 60, "width": 80})"}}, BoxFilter{1e9, 0, 0, 0});
  Sample s = SyntheticSample();
  s.keypoints = {80, 60, 2, 5, 5, 2};
  Sample out = p.Apply(s, 1);
  EXPECT_TRUE(out.objects.empty());
  ASSERT_EQ(out.keypoints.size(), 6u);
  EXPECT_DOUBLE_EQ(out.keypoints[0], 40);
  EXPECT_DOUBLE_EQ(out.keypoints[1], 30);
  EXPECT_EQ(out.keypoints[3], 0);
  EXPECT_EQ(out.keypoints[5], 0);  // left the image: 0, 0, 0
}

TEST(PipelineMasks, MaskSettingsOspreyDoesNotApplyAreRefusedByName) {
  Sample s = SyntheticSample();
  s.masks = {Tensor::Zeros(DType::kU8, {120, 160, 1})};
  for (const char* spec : {R"({"type": "Affine", "rotate": 10, "fill_mask": 3, "p": 1})",
                           R"({"type": "Affine", "rotate": 10, "mask_interpolation": 1, "p": 1})",
                           R"({"type": "CoarseDropout", "fill_mask": 0, "p": 1})"}) {
    Pipeline p = Pipeline::FromJson(std::string(R"({"type": "Compose", "transforms": [)") + spec + "]}");
    try {
      p.Apply(s, 1);
      FAIL() << spec;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
      EXPECT_NE(std::string(e.what()).find("transform.transforms[0]"), std::string::npos) << e.what();
    }
    Sample no_masks = SyntheticSample();
    EXPECT_NO_THROW(p.Apply(no_masks, 1));  // without masks the setting does not matter
  }
  Pipeline fine = Pipeline::FromJson(R"({"type": "Affine", "rotate": 10, "fill_mask": 0, "p": 1})");
  EXPECT_NO_THROW(fine.Apply(s, 1));
  s.masks = {Tensor::Zeros(DType::kU8, {60, 160, 1})};
  EXPECT_THROW(fine.Apply(s, 1), Error);  // a mask of another size
}

}  // namespace
}  // namespace osprey::augment
