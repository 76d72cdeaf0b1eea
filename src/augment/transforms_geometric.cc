// The geometric transforms: each factory reads its parameters and returns the rule that draws one GeoStep (a
// projective map and an output size) per application.
#include <algorithm>

#include "augment/filters.h"
#include "augment/params.h"

namespace osprey::augment {

namespace {

// The step of a dense displacement field (ElasticTransform's): its map, resampled with these settings.
GeoStep DenseStep(std::shared_ptr<DenseRemap> d, int interpolation, int border, double fill) {
  d->interpolation = interpolation, d->border = border, d->fill = fill;
  GeoStep s;
  s.width = d->width, s.height = d->height;
  s.dense = std::move(d);
  return s;
}

// AlbumentationsX's ElasticTransform: a rows x columns grid of cubic B-spline coefficients, each a vector of length
// radius * sqrt(u) at angle 2 pi v (uniform in a disk), radius = magnitude * min(H - 1, W - 1), the magnitude drawn
// from displacement_range; the dense displacement is the tensor-product spline over the image (spans = rows - 3 across
// its height, columns - 3 across its width), added to the identity map.
std::shared_ptr<Transform> BsplineElastic(Params& ps) {
  const Range mag = ps.Rng2("displacement_range", {0.02, 0.05}, Params::kFixed);
  if (mag.first < 0) Bad(ps.At("displacement_range"), "must be >= 0");
  int64_t rows = 7, cols = 7;
  if (const json* g = ps.Get("control_grid_shape")) {
    if (!g->is_array() || g->size() != 2 || !(*g)[0].is_number_integer() || !(*g)[1].is_number_integer())
      Bad(ps.At("control_grid_shape"), "expected [rows, columns], found " + g->dump());
    rows = (*g)[0].get<int64_t>(), cols = (*g)[1].get<int64_t>();
  }
  // At least 4 coefficients per axis (one cubic span); 256 is far past any useful grid and bounds the work.
  if (rows < 4 || cols < 4 || rows > 256 || cols > 256)
    Bad(ps.At("control_grid_shape"), "expected two integers in 4..256");
  // AlbumentationsX's bound for a map that does not fold over itself.
  if (2 * mag.second * std::sqrt(double((rows - 3) * (rows - 3) + (cols - 3) * (cols - 3))) >= 0.75)
    Bad(ps.At("displacement_range"),
        "with this control_grid_shape the map may fold: 2 * high * sqrt((rows - 3)^2 + "
        "(columns - 3)^2) must be less than 0.75");
  const int interpolation = ps.Interpolation();
  const int border = ps.Border(0);
  const double fill = ps.Fill();
  return Geo("ElasticTransform", [=](Rng& rng, const View& v) {
    const int64_t w = v.width, h = v.height;
    const double magnitude = mag.first == mag.second ? mag.first : rng.Uniform(mag.first, mag.second);
    GeoStep identity = Resample(Mat3{}, w, h, interpolation);
    if (magnitude == 0 || std::min(h, w) <= 1) return identity;
    const double radius = magnitude * static_cast<double>(std::min(h - 1, w - 1));
    std::vector<double> coef(static_cast<size_t>(rows * cols * 2));
    for (int64_t k = 0; k < rows * cols; ++k) {
      const double r = radius * std::sqrt(rng.Uniform(0, 1)), a = 2 * M_PI * rng.Uniform(0, 1);
      coef[static_cast<size_t>(2 * k)] = r * std::cos(a), coef[static_cast<size_t>(2 * k + 1)] = r * std::sin(a);
    }
    // Per output index along an axis: the first of its 4 coefficients and their weights.
    auto axis = [](int64_t length, int64_t count, std::vector<int64_t>* base, std::vector<std::array<double, 4>>* wts) {
      const int64_t spans = count - 3;
      for (int64_t i = 0; i < length; ++i) {
        const double c = static_cast<double>(i) * static_cast<double>(spans) / static_cast<double>(length - 1);
        const int64_t b = std::clamp<int64_t>(static_cast<int64_t>(std::floor(c)), 0, spans - 1);
        const double t = c - static_cast<double>(b), u = 1 - t;
        base->push_back(b);
        wts->push_back({u * u * u / 6, (3 * t * t * t - 6 * t * t + 4) / 6,
                        (-3 * t * t * t + 3 * t * t + 3 * t + 1) / 6, t * t * t / 6});
      }
    };
    std::vector<int64_t> row_base, col_base;
    std::vector<std::array<double, 4>> row_w, col_w;
    axis(h, rows, &row_base, &row_w);
    axis(w, cols, &col_base, &col_w);
    auto d = std::make_shared<DenseRemap>();
    d->width = w, d->height = h;
    d->map_x.resize(static_cast<size_t>(w * h));
    d->map_y.resize(static_cast<size_t>(w * h));
    std::vector<double> line(static_cast<size_t>(cols * 2));  // the row's spline through the grid's columns
    double shift = 0;
    for (int64_t y = 0; y < h; ++y) {
      std::fill(line.begin(), line.end(), 0.0);
      for (int i = 0; i < 4; ++i)
        for (int64_t c = 0; c < cols * 2; ++c)
          line[static_cast<size_t>(c)] +=
              row_w[static_cast<size_t>(y)][i] *
              coef[static_cast<size_t>((row_base[static_cast<size_t>(y)] + i) * cols * 2 + c)];
      for (int64_t x = 0; x < w; ++x) {
        double dx = 0, dy = 0;
        for (int j = 0; j < 4; ++j) {
          const double wt = col_w[static_cast<size_t>(x)][j];
          const size_t at = static_cast<size_t>((col_base[static_cast<size_t>(x)] + j) * 2);
          dx += wt * line[at], dy += wt * line[at + 1];
        }
        const size_t at = static_cast<size_t>(y * w + x);
        d->map_x[at] = static_cast<float>(x + dx), d->map_y[at] = static_cast<float>(y + dy);
        shift = std::max({shift, std::fabs(dx), std::fabs(dy)});
      }
    }
    d->max_shift = shift;
    return DenseStep(std::move(d), interpolation, border, fill);
  });
}

}  // namespace

void AddGeometricTransforms(std::map<std::string, Factory>& f) {
  f["HorizontalFlip"] = [](Params&) {
    return Geo("HorizontalFlip", [](Rng&, const View& v) {
      return GeoStep{Mat3{{-1, 0, double(v.width), 0, 1, 0, 0, 0, 1}}, v.width, v.height};
    });
  };
  f["VerticalFlip"] = [](Params&) {
    return Geo("VerticalFlip", [](Rng&, const View& v) {
      return GeoStep{Mat3{{1, 0, 0, 0, -1, double(v.height), 0, 0, 1}}, v.width, v.height};
    });
  };
  f["Transpose"] = [](Params&) {
    return Geo("Transpose", [](Rng&, const View& v) { return GeoStep{Mat3{{0, 1, 0, 1, 0, 0, 0, 0, 1}}, v.height, v.width}; });
  };
  f["RandomRotate90"] = [](Params&) {
    return Geo("RandomRotate90", [](Rng& rng, const View& v) {
      const int64_t k = rng.Int(0, 3);
      GeoStep s{Mat3{}, v.width, v.height};
      for (int64_t i = 0; i < k; ++i) {  // one counter-clockwise quarter turn: (u, v) -> (v, W - u)
        s.forward = Mat3{{0, 1, 0, -1, 0, double(s.width), 0, 0, 1}} * s.forward;
        std::swap(s.width, s.height);
      }
      return s;
    });
  };
  f["Rotate"] = [](Params& ps) {
    const Range limit = ps.Rng2("limit", {-90, 90}, Params::kSymmetric);
    const int interp = ps.Interpolation(), border = ps.Border(4);
    const double fill = ps.Fill();
    ps.Require("rotate_method", "largest_box");
    ps.Require("crop_border", false);
    return Geo("Rotate", [=](Rng& rng, const View& v) {
      GeoStep s = Resample(RotateAbout(rng.Uniform(limit.first, limit.second), v.width / 2.0, v.height / 2.0),
                           v.width, v.height, interp);
      s.border = border, s.fill = fill;
      return s;
    });
  };
  f["SafeRotate"] = [](Params& ps) {
    // Rotation about the centre, then the rotated image's bounding box (int sizes, as Albumentations) scaled back into
    // the original frame: nothing is cut off.
    const Range limit = ps.Rng2("limit", {-90, 90}, Params::kSymmetric);
    const int interp = ps.Interpolation(), border = ps.Border(t_albumentations_major >= 2 ? 0 : 4);
    const double fill = ps.Fill();
    ps.Require("rotate_method", "largest_box");
    // 2.x writes its Affine base's settings too; SafeRotate fixes them, so they carry nothing.
    for (const char* k : {"rotate", "fit_output", "scale", "shear", "translate_percent", "translate_px", "keep_ratio",
                          "balanced_scale"})
      ps.Ignore(k);
    return Geo("SafeRotate", [=](Rng& rng, const View& v) {
      const double deg = rng.Uniform(limit.first, limit.second), a = deg * M_PI / 180.0;
      const double W = double(v.width), H = double(v.height), cx = W / 2, cy = H / 2;
      const double nw = std::max(1.0, std::trunc(H * std::fabs(std::sin(a)) + W * std::fabs(std::cos(a))));
      const double nh = std::max(1.0, std::trunc(H * std::fabs(std::cos(a)) + W * std::fabs(std::sin(a))));
      // Albumentations builds this in pixel-index coordinates (centre (W - 1) / 2) and scales after shifting by
      // new_size / 2; in continuous coordinates that is the map below plus half a pixel.
      const Mat3 m = Mat3::Translate(0.5, 0.5) * Mat3::Scale(W / nw, H / nh) *
                     Mat3::Translate(nw / 2 - cx, nh / 2 - cy) * RotateAbout(deg, cx, cy);
      GeoStep s = Resample(m, v.width, v.height, interp);
      s.border = border, s.fill = fill;
      return s;
    });
  };
  f["Affine"] = [](Params& ps) {
    const auto scale = ps.XY("scale", {1, 1}, Params::kFixed);
    const bool has_tp = ps.Has("translate_percent"), has_px = ps.Has("translate_px");
    const auto tp = ps.XY("translate_percent", {0, 0}, Params::kSymmetric);
    const auto tpx = ps.XY("translate_px", {0, 0}, Params::kSymmetric);
    if (has_tp && has_px) Bad(ps.path(), "Affine: give translate_percent or translate_px, not both");
    const Range rotate = ps.Rng2("rotate", {0, 0}, Params::kSymmetric);
    const auto shear = ps.XY("shear", {0, 0}, Params::kSymmetric);
    const int interp = ps.Interpolation(), border = ps.Border(0);
    const double fill = ps.Fill();
    const bool keep_ratio = ps.Bool("keep_ratio", false);
    ps.Require("fit_output", false);
    ps.Require("rotate_method", "largest_box");
    ps.Require("balanced_scale", false);
    return Geo("Affine", [=](Rng& rng, const View& v) {
      const double sx = rng.Uniform(scale.first.first, scale.first.second);
      const double sy = keep_ratio ? sx : rng.Uniform(scale.second.first, scale.second.second);
      double tx = 0, ty = 0;
      if (has_tp) {
        // Whole pixels, truncated toward zero, as Albumentations does (int(fraction * size)).
        tx = std::trunc(rng.Uniform(tp.first.first, tp.first.second) * v.width);
        ty = std::trunc(rng.Uniform(tp.second.first, tp.second.second) * v.height);
      } else if (has_px) {
        tx = static_cast<double>(rng.Int(std::llround(tpx.first.first), std::llround(tpx.first.second)));
        ty = static_cast<double>(rng.Int(std::llround(tpx.second.first), std::llround(tpx.second.second)));
      }
      const double rot = rng.Uniform(rotate.first, rotate.second) * M_PI / 180.0;
      // Albumentations negates the drawn shear angles before building its matrix (1.4 and 2.x alike).
      const double shx = -rng.Uniform(shear.first.first, shear.first.second) * M_PI / 180.0;
      const double shy = -rng.Uniform(shear.second.first, shear.second.second) * M_PI / 180.0;
      GeoStep s = Resample(AffineAbout(v.width / 2.0, v.height / 2.0, tx, ty, sx, sy, rot, shx, shy), v.width,
                           v.height, interp);
      s.border = border, s.fill = fill;
      return s;
    });
  };
  f["Perspective"] = [](Params& ps) {
    const Range scale = ps.Rng2("scale", {0.05, 0.1}, Params::kFixed);
    const int interp = ps.Interpolation(), border = ps.Border(0);
    const double fill = ps.Fill();
    ps.Require("keep_size", true);
    ps.Require("fit_output", false);
    return Geo("Perspective", [=](Rng& rng, const View& v) {
      const double s = rng.Uniform(scale.first, scale.second), W = double(v.width), H = double(v.height);
      auto j = [&] { return std::fmod(std::fabs(rng.Normal() * s), 1.0); };
      // Corners pulled inwards at random (tl, tr, br, bl); the quadrilateral is stretched onto the whole output.
      std::array<std::array<double, 2>, 4> src = {{{j() * W, j() * H},
                                                   {W - j() * W, j() * H},
                                                   {W - j() * W, H - j() * H},
                                                   {j() * W, H - j() * H}}};
      std::array<std::array<double, 2>, 4> dst = {{{0, 0}, {W, 0}, {W, H}, {0, H}}};
      GeoStep st = Resample(HomographyFromQuad(src, dst), v.width, v.height, interp);
      st.border = border, st.fill = fill;
      return st;
    });
  };
  auto size_of = [](Params& ps, int64_t* h, int64_t* w) {
    if (const json* size = ps.Get("size")) {
      if (!size->is_array() || size->size() != 2 || !(*size)[0].is_number_integer() || !(*size)[1].is_number_integer())
        Bad(ps.At("size"), "expected [height, width], found " + size->dump());
      *h = (*size)[0].get<int64_t>(), *w = (*size)[1].get<int64_t>();
      if (*h < 1 || *w < 1 || *h > (1 << 20) || *w > (1 << 20)) Bad(ps.At("size"), "sizes must be in [1, 1048576]");
    } else {
      *h = Positive(ps, "height"), *w = Positive(ps, "width");
    }
  };
  f["RandomResizedCrop"] = [size_of](Params& ps) {
    int64_t oh, ow;
    size_of(ps, &oh, &ow);
    const Range scale = ps.Rng2("scale", {0.08, 1.0}, Params::kFixed);
    const Range ratio = ps.Rng2("ratio", {0.75, 4.0 / 3.0}, Params::kFixed);
    if (ratio.first <= 0) Bad(ps.At("ratio"), "must be positive");
    const int interp = ps.Interpolation();
    return Geo("RandomResizedCrop", [=](Rng& rng, const View& v) {
      // torchvision's RandomResizedCrop.get_params: 10 tries, then a centre crop clamped to the ratio range.
      const double area = double(v.width) * v.height;
      int64_t cw = 0, ch = 0, x = 0, y = 0;
      bool found = false;
      for (int attempt = 0; attempt < 10 && !found; ++attempt) {
        const double target = area * rng.Uniform(scale.first, scale.second);
        const double aspect = std::exp(rng.Uniform(std::log(ratio.first), std::log(ratio.second)));
        cw = std::llround(std::sqrt(target * aspect));
        ch = std::llround(std::sqrt(target / aspect));
        if (cw > 0 && ch > 0 && cw <= v.width && ch <= v.height) {
          y = rng.Int(0, v.height - ch), x = rng.Int(0, v.width - cw);
          found = true;
        }
      }
      if (!found) {
        const double in_ratio = double(v.width) / v.height;
        if (in_ratio < ratio.first) {
          cw = v.width, ch = std::llround(cw / ratio.first);
        } else if (in_ratio > ratio.second) {
          ch = v.height, cw = std::llround(ch * ratio.second);
        } else {
          cw = v.width, ch = v.height;
        }
        cw = std::clamp<int64_t>(cw, 1, v.width), ch = std::clamp<int64_t>(ch, 1, v.height);
        y = (v.height - ch) / 2, x = (v.width - cw) / 2;
      }
      return Resample(Mat3::Scale(double(ow) / cw, double(oh) / ch) * Mat3::Translate(-x, -y), ow, oh, interp);
    });
  };
  f["RandomSizedCrop"] = [size_of](Params& ps) {
    int64_t oh, ow;
    size_of(ps, &oh, &ow);
    const Range mm = ps.Rng2("min_max_height", {0, 0}, Params::kFixed);
    if (mm.first < 1) Bad(ps.At("min_max_height"), "needs [min, max] crop heights >= 1");
    const double ratio = ps.Num("w2h_ratio", 1.0);
    if (ratio <= 0) Bad(ps.At("w2h_ratio"), "must be positive");
    const int interp = ps.Interpolation();
    return Geo("RandomSizedCrop", [=](Rng& rng, const View& v) {
      // Albumentations: crop height drawn, width = int(height * w2h_ratio), both clipped to the image; the corner at
      // int((size - crop + 1) * u) for u uniform in [0, 1).
      int64_t ch = rng.Int(std::llround(mm.first), std::llround(mm.second));
      int64_t cw = static_cast<int64_t>(ch * ratio);
      ch = std::clamp<int64_t>(ch, 1, v.height), cw = std::clamp<int64_t>(cw, 1, v.width);
      const int64_t y = static_cast<int64_t>((v.height - ch + 1) * rng.Uniform(0, 1));
      const int64_t x = static_cast<int64_t>((v.width - cw + 1) * rng.Uniform(0, 1));
      return Resample(Mat3::Scale(double(ow) / cw, double(oh) / ch) * Mat3::Translate(-double(x), -double(y)), ow,
                      oh, interp);
    });
  };
  f["RandomScale"] = [](Params& ps) {
    const Range lim = ps.Rng2("scale_limit", {-0.1, 0.1}, Params::kSymmetric);
    if (1 + lim.first <= 0) Bad(ps.At("scale_limit"), "1 + scale_limit must stay positive");
    const int interp = ps.Interpolation();
    return Geo("RandomScale", [=](Rng& rng, const View& v) {
      const double s = rng.Uniform(1 + lim.first, 1 + lim.second);
      const int64_t h = std::max<int64_t>(1, static_cast<int64_t>(v.height * s));
      const int64_t w = std::max<int64_t>(1, static_cast<int64_t>(v.width * s));
      return Resample(Mat3::Scale(double(w) / v.width, double(h) / v.height), w, h, interp);
    });
  };
  f["ShiftScaleRotate"] = [](Params& ps) {
    // Albumentations 2.x implements it as Affine(translate_percent = shift, scale = 1 + scale_limit, rotate); 1.4's
    // own implementation is the same map (its rotation centre half a pixel off) with one scale for both axes.
    const auto shift = ps.Rng2("shift_limit", {-0.0625, 0.0625}, Params::kSymmetric);
    const Range sx_lim = ps.Has("shift_limit_x") ? ps.Rng2("shift_limit_x", shift, Params::kSymmetric) : shift;
    const Range sy_lim = ps.Has("shift_limit_y") ? ps.Rng2("shift_limit_y", shift, Params::kSymmetric) : shift;
    const Range scale = ps.Rng2("scale_limit", {-0.1, 0.1}, Params::kSymmetric);
    const Range rotate = ps.Rng2("rotate_limit", {-45, 45}, Params::kSymmetric);
    if (1 + scale.first <= 0) Bad(ps.At("scale_limit"), "1 + scale_limit must stay positive");
    const bool v2 = t_albumentations_major >= 2;
    const int interp = ps.Interpolation(), border = ps.Border(v2 ? 0 : 4);
    const double fill = ps.Fill();
    ps.Require("rotate_method", "largest_box");
    return Geo("ShiftScaleRotate", [=](Rng& rng, const View& v) {
      const double rot = rng.Uniform(rotate.first, rotate.second) * M_PI / 180.0;
      const double sx = rng.Uniform(1 + scale.first, 1 + scale.second);
      const double sy = v2 ? rng.Uniform(1 + scale.first, 1 + scale.second) : sx;
      const double tx = std::trunc(rng.Uniform(sx_lim.first, sx_lim.second) * v.width);
      const double ty = std::trunc(rng.Uniform(sy_lim.first, sy_lim.second) * v.height);
      GeoStep s = Resample(AffineAbout(v.width / 2.0, v.height / 2.0, tx, ty, sx, sy, rot, 0, 0), v.width, v.height,
                           interp);
      s.border = border, s.fill = fill;
      return s;
    });
  };
  f["RandomCrop"] = [](Params& ps) {
    const int64_t h = Positive(ps, "height"), w = Positive(ps, "width");
    ps.Require("pad_if_needed", false);
    ps.Ignore("border_mode"), ps.Ignore("fill"), ps.Ignore("pad_position");
    return Geo("RandomCrop", [=](Rng& rng, const View& v) {
      if (v.height < h || v.width < w) throw Error(ErrorCode::kInvalidArgument, TooSmall("RandomCrop", h, w, v));
      const int64_t y = rng.Int(0, v.height - h), x = rng.Int(0, v.width - w);
      return CropTo(double(x), double(y), w, h);
    });
  };
  f["CenterCrop"] = [](Params& ps) {
    const int64_t h = Positive(ps, "height"), w = Positive(ps, "width");
    ps.Require("pad_if_needed", false);
    ps.Ignore("border_mode"), ps.Ignore("fill"), ps.Ignore("pad_position");
    return Geo("CenterCrop", [=](Rng&, const View& v) {
      if (v.height < h || v.width < w) throw Error(ErrorCode::kInvalidArgument, TooSmall("CenterCrop", h, w, v));
      return CropTo(double((v.width - w) / 2), double((v.height - h) / 2), w, h);
    });
  };
  f["BBoxSafeRandomCrop"] = [](Params& ps) {
    const double erosion = ps.Num("erosion_rate", 0.0);
    if (erosion < 0 || erosion > 1) Bad(ps.At("erosion_rate"), "must be in [0, 1]");
    return Geo("BBoxSafeRandomCrop", [=](Rng& rng, const View& v) {
      const auto c = BoxSafeWindow(rng, v, erosion);
      return CropTo(double(c[0]), double(c[1]), c[2] - c[0], c[3] - c[1]);
    });
  };
  f["RandomSizedBBoxSafeCrop"] = [](Params& ps) {
    const int64_t h = Positive(ps, "height"), w = Positive(ps, "width");
    const double erosion = ps.Num("erosion_rate", 0.0);
    if (erosion < 0 || erosion > 1) Bad(ps.At("erosion_rate"), "must be in [0, 1]");
    const int interp = ps.Interpolation();
    return Geo("RandomSizedBBoxSafeCrop", [=](Rng& rng, const View& v) {
      const auto c = BoxSafeWindow(rng, v, erosion);
      return Resample(Mat3::Scale(double(w) / (c[2] - c[0]), double(h) / (c[3] - c[1])) *
                          Mat3::Translate(-double(c[0]), -double(c[1])),
                      w, h, interp);
    });
  };
  f["Resize"] = [](Params& ps) {
    const int64_t h = Positive(ps, "height"), w = Positive(ps, "width");
    const int interp = ps.Interpolation();
    return Geo("Resize", [=](Rng&, const View& v) {
      return Resample(Mat3::Scale(double(w) / v.width, double(h) / v.height), w, h, interp);
    });
  };
  for (const bool longest : {true, false}) {
    const std::string n = longest ? "LongestMaxSize" : "SmallestMaxSize";
    f[n] = [n, longest](Params& ps) {
      const int64_t m = Positive(ps, "max_size", ps.Has("max_size") ? 1 : 1024);
      ps.Require("max_size_hw", nullptr);
      const int interp = ps.Interpolation();
      return Geo(n, [=](Rng&, const View& v) {
        const double side = longest ? std::max(v.width, v.height) : std::min(v.width, v.height);
        const double s = m / side;
        const int64_t w = std::max<int64_t>(1, std::llround(v.width * s));
        const int64_t h = std::max<int64_t>(1, std::llround(v.height * s));
        return Resample(Mat3::Scale(double(w) / v.width, double(h) / v.height), w, h, interp);
      });
    };
  }
  f["PadIfNeeded"] = [](Params& ps) {
    const int64_t mh = Positive(ps, "min_height", 1024), mw = Positive(ps, "min_width", 1024);
    ps.Require("pad_height_divisor", nullptr);
    ps.Require("pad_width_divisor", nullptr);
    ps.Require("position", "center");
    const int border = ps.Border(4);
    const double fill = ps.Fill();
    return Geo("PadIfNeeded", [=](Rng&, const View& v) {
      const int64_t ph = std::max<int64_t>(0, mh - v.height), pw = std::max<int64_t>(0, mw - v.width);
      GeoStep s = CropTo(-double(pw / 2), -double(ph / 2), v.width + pw, v.height + ph);
      if (ph || pw) s.border = border, s.fill = fill;
      return s;
    });
  };
  f["GridDistortion"] = [](Params& ps) {
    // Albumentations' grid: num_steps + 1 cells per axis, each stretched by 1 + U(distort_limit), optionally
    // normalised to span the image; a separable field (SeparableRemap). 1.4.24 always used a constant 0 border
    // (its border_mode had no effect) and does not write one; 2.x writes border_mode and fill.
    const int64_t steps = ps.Int("num_steps", 5);
    // The field is two maps of the image's width and height, whatever num_steps is; this bound only keeps the draw
    // loop finite and within the image (width // num_steps must be at least 1, checked per image).
    if (steps < 1 || steps > 4096) Bad(ps.At("num_steps"), "expected 1..4096, found " + std::to_string(steps));
    const Range dl = ps.Rng2("distort_limit", {-0.3, 0.3}, Params::kSymmetric);
    if (dl.first < -1 || dl.second > 1) Bad(ps.At("distort_limit"), "must lie in [-1, 1]");
    const bool normalized = ps.Bool("normalized", true);
    const int interpolation = ps.Interpolation();
    const int border = ps.Border(0);
    const double fill = ps.Fill();
    ps.Ignore("keypoint_remapping_method");  // osprey moves points through the field's exact inverse either way
    return Geo("GridDistortion", [=](Rng& rng, const View& v) {
      if (v.width < steps || v.height < steps)
        throw Error(ErrorCode::kInvalidArgument, "GridDistortion: num_steps " + std::to_string(steps) +
                                                     " is more than the " + std::to_string(v.width) + "x" +
                                                     std::to_string(v.height) + " image's side");
      std::vector<double> sx(steps + 1), sy(steps + 1);
      for (double& s : sx) s = 1 + rng.Uniform(dl.first, dl.second);
      for (double& s : sy) s = 1 + rng.Uniform(dl.first, dl.second);
      auto make = [&](std::vector<double>& st, int64_t size) {
        const int64_t step = size / steps;
        if (normalized) {
          const int64_t last = std::min(size, (steps + 1) * step) - steps * step;
          st.back() *= double(last) / double(step);
          double total = 0;
          for (double x : st) total += x;
          const double t = double(size) / double(size / steps);
          for (double& x : st) x *= t / total;
        }
        std::vector<float> map(static_cast<size_t>(size), 0.0f);
        double prev = 0;
        for (int64_t i = 0; i <= steps; ++i) {
          const int64_t start = i * step, end = std::min(start + step, size);
          const double cur = prev + double(step) * st[i];
          const int64_t n = end - start;
          for (int64_t k = 0; k < n; ++k)  // np.linspace(prev, cur, n)
            map[start + k] = static_cast<float>(
                k == n - 1 && n > 1 ? cur : prev + (cur - prev) * double(k) / double(std::max<int64_t>(n - 1, 1)));
          prev = cur;
        }
        return map;
      };
      auto field = std::make_shared<SeparableRemap>();
      field->map_x = make(sx, v.width);
      field->map_y = make(sy, v.height);
      field->interpolation = interpolation, field->border = border, field->fill = fill;
      GeoStep s;
      s.width = v.width, s.height = v.height;
      s.remap = std::move(field);
      return s;
    });
  };
  f["ElasticTransform"] = [](Params& ps) -> std::shared_ptr<Transform> {
    if (ps.Str("_field", "") == "bspline") return BsplineElastic(ps);
    // Albumentations' construction with osprey's random source: noise per pixel (one plane, or two without
    // same_dxdy), Gaussian-smoothed with sigma, scaled by alpha, added to the identity map (a dense field). Files from
    // 2.x: the noise is float32 N(0, 1) divided by its largest magnitude (or U(-1, 1)), the planes stacked vertically
    // and blurred as one image with BORDER_REPLICATE, a 17 x 17 kernel when approximate, else OpenCV's size from
    // sigma. 1.4.x (and osprey's spelling): each plane blurred on its own (BORDER_REFLECT_101), no division, and the
    // kernel sizes the other way round (17 x 17 unless approximate: 1.4.24's own inversion).
    const double alpha = ps.Num("alpha", 1);
    if (alpha < 0) Bad(ps.At("alpha"), "must be >= 0, found " + std::to_string(alpha));
    const double sigma = ps.Num("sigma", 50);
    // The kernel is 8 sigma + 1 taps (OpenCV's float rule) on every pixel: 512 is past any useful smoothing and keeps
    // the cost bounded.
    if (sigma < 1 || sigma > 512) Bad(ps.At("sigma"), "expected 1..512, found " + std::to_string(sigma));
    const int interpolation = ps.Interpolation();
    const int border = ps.Border(0);  // 1.4.24 always used a constant 0 border (its border_mode had no effect)
    const double fill = ps.Fill();
    const bool approximate = ps.Bool("approximate", false), same = ps.Bool("same_dxdy", false);
    const std::string noise = ps.Str("noise_distribution", "gaussian");
    if (noise != "gaussian" && noise != "uniform")
      Bad(ps.At("noise_distribution"), "expected \"gaussian\" or \"uniform\", found \"" + noise + "\"");
    ps.Require("alpha_affine", 0);  // Albumentations 1.3's affine part
    ps.Ignore("keypoint_remapping_method");  // osprey moves points through the field's inverse either way
    const bool v2 = t_albumentations_major >= 2;
    const bool full_kernel = v2 ? !approximate : approximate;
    const int64_t ksize = full_kernel ? (static_cast<int64_t>(std::nearbyint(sigma * 4 * 2 + 1)) | 1) : 17;
    const std::vector<double> kernel = GaussianKernel(ksize, sigma);
    return Geo("ElasticTransform", [=](Rng& rng, const View& v) {
      const int64_t w = v.width, h = v.height, n = w * h, planes = same ? 1 : 2;
      std::vector<float> field(static_cast<size_t>(planes * n));
      for (float& x : field)
        x = noise == "gaussian" ? static_cast<float>(rng.Normal()) : static_cast<float>(rng.Uniform(-1, 1));
      if (v2) {
        if (noise == "gaussian") {
          float top = 0;
          for (float x : field) top = std::max(top, std::fabs(x));
          if (top > 1e-6f)
            for (float& x : field) x /= top;
        }
        BlurPlane(field, planes * h, w, kernel, 1);
      } else {
        std::vector<float> plane(static_cast<size_t>(n));
        for (int64_t k = 0; k < planes; ++k) {
          std::copy(field.begin() + k * n, field.begin() + (k + 1) * n, plane.begin());
          BlurPlane(plane, h, w, kernel, 4);
          std::copy(plane.begin(), plane.end(), field.begin() + k * n);
        }
      }
      auto d = std::make_shared<DenseRemap>();
      d->width = w, d->height = h;
      d->map_x.resize(static_cast<size_t>(n));
      d->map_y.resize(static_cast<size_t>(n));
      const float* dy = field.data() + (planes - 1) * n;
      double shift = 0;
      for (int64_t y = 0; y < h; ++y)
        for (int64_t x = 0; x < w; ++x) {
          const size_t at = static_cast<size_t>(y * w + x);
          const float ddx = static_cast<float>(field[at] * alpha), ddy = static_cast<float>(dy[at] * alpha);
          d->map_x[at] = static_cast<float>(x) + ddx, d->map_y[at] = static_cast<float>(y) + ddy;
          shift = std::max({shift, double(std::fabs(ddx)), double(std::fabs(ddy))});
        }
      d->max_shift = shift;
      return DenseStep(std::move(d), interpolation, border, fill);
    });
  };
}

}  // namespace osprey::augment
