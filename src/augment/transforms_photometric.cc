// The photometric transforms: each factory reads its parameters and returns the rule that appends osprey-domain ops
// (or a host step) per application.
#include <algorithm>

#include "augment/filters.h"
#include "augment/params.h"

namespace osprey::augment {

void AddPhotometricTransforms(std::map<std::string, Factory>& f) {
  f["ColorJitter"] = [](Params& ps) {
    const Range b = ps.Rng2("brightness", {0.8, 1.2}, Params::kAroundOne);
    const Range c = ps.Rng2("contrast", {0.8, 1.2}, Params::kAroundOne);
    const Range s = ps.Rng2("saturation", {0.8, 1.2}, Params::kAroundOne);
    const Range h = ps.Rng2("hue", {-0.5, 0.5}, Params::kSymmetric);
    if (h.first < -0.5 || h.second > 0.5) Bad(ps.At("hue"), "must lie in [-0.5, 0.5]");
    return Photo("ColorJitter", [=](Rng& rng, const View& v, std::vector<PhotoStep>& out) {
      const double fb = rng.Uniform(b.first, b.second), fc = rng.Uniform(c.first, c.second);
      const double fs = rng.Uniform(s.first, s.second), fh = rng.Uniform(h.first, h.second);
      int order[4] = {0, 1, 2, 3};
      for (int i = 3; i > 0; --i) std::swap(order[i], order[rng.Int(0, i)]);
      for (int k : order) {
        if (k == 0 && fb != 1) out.push_back(Lut(LutFrom([&](int x) { return x * fb; })));
        if (k == 1 && fc != 1) out.push_back(Op("AdjustContrast", {{"factor", Attribute::Float(float(fc))}}));
        if (k == 2 && fs != 1 && v.channels == 3)
          out.push_back(Op("AdjustSaturation", {{"factor", Attribute::Float(float(fs))}}));
        if (k == 3 && fh != 0 && v.channels == 3)
          out.push_back(Op("ShiftHSV", {{"hue", Attribute::Float(float(fh * 180))},
                                        {"saturation", Attribute::Float(0)},
                                        {"value", Attribute::Float(0)}}));
      }
    });
  };
  f["RandomBrightnessContrast"] = [](Params& ps) {
    const Range bl = ps.Rng2("brightness_limit", {-0.2, 0.2}, Params::kSymmetric);
    const Range cl = ps.Rng2("contrast_limit", {-0.2, 0.2}, Params::kSymmetric);
    // true: albumentations' x * alpha + beta * 255; false (AlbumentationsX's default): torchvision's model, contrast
    // about the image's mean grey, then brightness as a factor 1 + beta (BrightnessContrastAboutMean).
    const bool by_max = ps.Bool("brightness_by_max", true);
    ps.Require("ensure_safe_range", false);
    if (!by_max && (bl.first < -1 || cl.first < -1))
      Bad(ps.At(bl.first < -1 ? "brightness_limit" : "contrast_limit"),
          "must be >= -1 with brightness_by_max false (factors 1 + x are not negative)");
    return Photo("RandomBrightnessContrast", [=](Rng& rng, const View&, std::vector<PhotoStep>& out) {
      const double alpha = 1 + rng.Uniform(cl.first, cl.second), beta = rng.Uniform(bl.first, bl.second);
      if (by_max) {
        out.push_back(Lut(LutFrom([&](int x) { return x * alpha + beta * 255; })));
        return;
      }
      PhotoStep s;
      s.host = [alpha, beta](const Tensor& img) { return BrightnessContrastAboutMean(img, 1 + beta, alpha); };
      out.push_back(s);
    });
  };
  f["HueSaturationValue"] = [](Params& ps) {
    const Range hl = ps.Rng2("hue_shift_limit", {-20, 20}, Params::kSymmetric);
    const Range sl = ps.Rng2("sat_shift_limit", {-30, 30}, Params::kSymmetric);
    const Range vl = ps.Rng2("val_shift_limit", {-20, 20}, Params::kSymmetric);
    return Photo("HueSaturationValue", [=](Rng& rng, const View& v, std::vector<PhotoStep>& out) {
      const double h = rng.Uniform(hl.first, hl.second), s = rng.Uniform(sl.first, sl.second);
      const double val = rng.Uniform(vl.first, vl.second);
      if (v.channels == 1) {
        out.push_back(Lut(LutFrom([&](int x) { return x + std::trunc(val); })));
        return;
      }
      out.push_back(Op("ShiftHSV", {{"hue", Attribute::Float(float(h))},
                                    {"saturation", Attribute::Float(float(s))},
                                    {"value", Attribute::Float(float(val))}}));
    });
  };
  f["RandomGamma"] = [](Params& ps) {
    const Range g = ps.Rng2("gamma_limit", {80, 120}, Params::kFixed);
    if (g.first <= 0) Bad(ps.At("gamma_limit"), "must be positive");
    return Photo("RandomGamma", [=](Rng& rng, const View&, std::vector<PhotoStep>& out) {
      const double gamma = rng.Uniform(g.first, g.second) / 100.0;
      out.push_back(Lut(LutFrom([&](int x) { return std::pow(x / 255.0, gamma) * 255.0; })));
    });
  };
  f["GaussianBlur"] = [](Params& ps) {
    // Albumentations 2.x: blur_limit default 0, any integer (even ones + 1), 0 = size int(sigma * 3.5) * 2 + 1;
    // sigma_limit default (0.5, 3). 1.4: odd sizes (default (3, 7)), 0 = OpenCV's size from sigma.
    const bool v2 = ps.Str("_kernel_rule", "") == "sigma";
    const Range k = ps.Rng2("blur_limit", v2 ? Range{0, 0} : Range{3, 7}, Params::kFixed);
    const Range sg = ps.Rng2("sigma_limit", v2 ? Range{0.5, 3} : Range{0, 0}, Params::kFixed);
    const int64_t k0 = static_cast<int64_t>(k.first), k1 = static_cast<int64_t>(k.second);
    if (k0 < 0 || k1 > 255 || (!v2 && ((k0 != 0 && k0 % 2 == 0) || (k1 != 0 && k1 % 2 == 0))))
      Bad(ps.At("blur_limit"), v2 ? "kernel sizes must lie in 0..255" : "kernel sizes must be 0 or odd, at most 255");
    if (k0 == 0 && sg.second <= 0) Bad(ps.At("sigma_limit"), "with blur_limit starting at 0 sigma_limit must be > 0");
    return Photo("GaussianBlur", [=](Rng& rng, const View&, std::vector<PhotoStep>& out) {
      int64_t ks;
      if (v2) {
        ks = rng.Int(k0, k1);
      } else if (k0 == 0 && k1 == 0) {
        ks = 0;  // size from sigma, as OpenCV
      } else {
        ks = k0 == 0 ? rng.Int(0, (k1 - 1) / 2) * 2 + 1 : k0 + 2 * rng.Int(0, (k1 - k0) / 2);
        if (k0 == 0 && rng.Chance(0.5)) ks = 0;  // 0: size from sigma, as OpenCV
      }
      const double sigma = rng.Uniform(sg.first, sg.second);
      if (v2) {
        if (ks == 0) ks = static_cast<int64_t>(sigma * 3.5) * 2 + 1;
        if (ks % 2 == 0) ++ks;
      }
      if (ks == 0 && sigma <= 0) return;
      out.push_back(Op("GaussianBlur", {{"ksize_x", Attribute::Int(ks)},
                                        {"ksize_y", Attribute::Int(ks)},
                                        {"sigma_x", Attribute::Float(float(sigma))},
                                        {"sigma_y", Attribute::Float(float(sigma))}}));
    });
  };
  // Blur (cv2.blur) and MedianBlur (cv2.medianBlur): an odd kernel size drawn from blur_limit (default (3, 7), the
  // smallest 3), the same rule in Albumentations 1.4 and 2.x.
  for (const char* name : {"Blur", "MedianBlur"}) {
    f[name] = [name = std::string(name)](Params& ps) {
      const Range k = ps.Rng2("blur_limit", {3, 7}, Params::kFixed);
      const int64_t k0 = std::llround(k.first), k1 = std::llround(k.second);
      if (k0 < 3 || k0 % 2 == 0 || k1 % 2 == 0 || k1 > 255)
        Bad(ps.At("blur_limit"), "kernel sizes must be odd, in 3..255");
      return Photo(name, [=](Rng& rng, const View&, std::vector<PhotoStep>& out) {
        const int64_t ks = k0 + 2 * rng.Int(0, (k1 - k0) / 2);
        if (name == "Blur")
          out.push_back(Op("BoxBlur", {{"ksize_x", Attribute::Int(ks)}, {"ksize_y", Attribute::Int(ks)}}));
        else
          out.push_back(Op("MedianBlur", {{"ksize", Attribute::Int(ks)}}));
      });
    };
  }
  f["GaussNoise"] = [](Params& ps) {
    const Range sr = ps.Rng2("std_range", {0.2, 0.44}, Params::kFixed);
    const Range mr = ps.Rng2("mean_range", {0, 0}, Params::kFixed);
    const bool per_channel = ps.Bool("per_channel", true);
    ps.Require("noise_scale_factor", 1.0);
    if (sr.first < 0 || sr.second > 1) Bad(ps.At("std_range"), "must lie in [0, 1] (fractions of 255)");
    return Photo("GaussNoise", [=](Rng& rng, const View&, std::vector<PhotoStep>& out) {
      const double sd = rng.Uniform(sr.first, sr.second) * 255, mean = rng.Uniform(mr.first, mr.second) * 255;
      out.push_back(Op("AddGaussianNoise", {{"mean", Attribute::Float(float(mean))},
                                            {"std", Attribute::Float(float(sd))},
                                            {"per_channel", Attribute::Int(per_channel ? 1 : 0)},
                                            {"seed", Attribute::Int(static_cast<int64_t>(rng.Next() >> 2))}}));
    });
  };
  f["ToGray"] = [](Params& ps) {
    ps.Require("num_output_channels", 3);
    ps.Require("method", "weighted_average");
    return Photo("ToGray", [](Rng&, const View& v, std::vector<PhotoStep>& out) {
      if (v.channels != 3) return;
      out.push_back(Op("ColorConvert", {{"from", Attribute::String("RGB")}, {"to", Attribute::String("GRAY")}}));
      out.push_back(Op("ColorConvert", {{"from", Attribute::String("GRAY")}, {"to", Attribute::String("RGB")}}));
    });
  };
  f["ImageCompression"] = [](Params& ps) {
    const Range q = ps.Rng2("quality_range", {99, 100}, Params::kFixed);
    const std::string type = ps.Str("compression_type", "jpeg");
    if (type != "jpeg" && type != "webp") Bad(ps.At("compression_type"), "expected \"jpeg\" or \"webp\"");
    if (q.first < 1 || q.second > 100) Bad(ps.At("quality_range"), "qualities must lie in [1, 100]");
    return Photo("ImageCompression", [=](Rng& rng, const View&, std::vector<PhotoStep>& out) {
      PhotoStep s;
      s.codec = type;
      s.quality = static_cast<int>(rng.Int(std::llround(q.first), std::llround(q.second)));
      out.push_back(s);
    });
  };
  f["CoarseDropout"] = [](Params& ps) {
    const Range n = ps.Rng2("num_holes_range", {1, 1}, Params::kFixed);
    const Range hh = ps.Rng2("hole_height_range", {8, 8}, Params::kFixed);
    const Range hw = ps.Rng2("hole_width_range", {8, 8}, Params::kFixed);
    const double fill = ps.Fill();
    if (n.first < 0) Bad(ps.At("num_holes_range"), "must be >= 0");
    // Each hole is a rectangle to fill: a count past this is a typo, not an augmentation, and would only burn memory.
    constexpr double kMaxHoles = 100000;
    if (n.second > kMaxHoles)
      Bad(ps.At("num_holes_range"), "at most " + std::to_string(static_cast<int>(kMaxHoles)) + " holes, got " +
                                        std::to_string(n.second));
    return Photo("CoarseDropout", [=](Rng& rng, const View& v, std::vector<PhotoStep>& out) {
      // More holes than pixels cannot add anything: cap at the image's pixel count.
      const int64_t holes =
          std::min<int64_t>(rng.Int(std::llround(n.first), std::llround(n.second)), v.height * v.width);
      auto side = [&](const Range& r, int64_t full) {
        // Integers are pixels; values in (0, 1) are fractions of the image side (Albumentations).
        const bool frac = r.second <= 1 && (r.first != std::floor(r.first) || r.second != std::floor(r.second));
        const int64_t s = frac ? static_cast<int64_t>(rng.Uniform(r.first, r.second) * full)
                               : rng.Int(std::llround(r.first), std::llround(r.second));
        return std::clamp<int64_t>(s, 1, full);
      };
      std::vector<int64_t> rects;
      for (int64_t i = 0; i < holes; ++i) {
        const int64_t h = side(hh, v.height), w = side(hw, v.width);
        const int64_t y = rng.Int(0, v.height - h), x = rng.Int(0, v.width - w);
        rects.insert(rects.end(), {y, x, y + h, x + w});
      }
      if (rects.empty()) return;
      out.push_back(Op("FillRects", {{"rects", Attribute::Ints(rects)}, {"fill", Attribute::Floats({float(fill)})}}));
    });
  };
  f["Normalize"] = [](Params& ps) {
    // "standard": (x - mean * max_pixel_value) / (std * max_pixel_value), the NormalizeImage op; the per-image modes
    // use this image's statistics (filters.cc). Either way the image becomes float32 (Pipeline::returns_float).
    const std::string mode = ps.Str("normalization", "standard");
    if (mode != "standard" && mode != "image" && mode != "image_per_channel" && mode != "min_max" &&
        mode != "min_max_per_channel")
      Bad(ps.At("normalization"),
          "expected \"standard\", \"image\", \"image_per_channel\", \"min_max\" or "
          "\"min_max_per_channel\", found \"" +
              mode + "\"");
    auto values = [&](const std::string& k, std::vector<float> def) {
      const json* v = ps.Get(k);
      if (!v) return def;
      std::vector<float> out;
      if (v->is_number()) out.push_back(v->get<float>());
      if (v->is_array())
        for (const json& e : *v) {
          if (!e.is_number()) Bad(ps.At(k), "expected numbers, found " + v->dump());
          out.push_back(e.get<float>());
        }
      if (out.empty() || out.size() > 4) Bad(ps.At(k), "expected a number or 1 to 4 numbers, found " + v->dump());
      for (float x : out)
        if (!std::isfinite(x)) Bad(ps.At(k), "must be finite");
      return out;
    };
    const std::vector<float> mean = values("mean", {0.485f, 0.456f, 0.406f});
    std::vector<float> sd = values("std", {0.229f, 0.224f, 0.225f});
    const double max_pixel = ps.Num("max_pixel_value", 255.0);
    if (mode == "standard") {
      if (!(max_pixel > 0)) Bad(ps.At("max_pixel_value"), "must be positive");
      for (float x : sd)
        if (x == 0) Bad(ps.At("std"), "must not contain 0");
    }
    return Photo("Normalize", [=](Rng&, const View& v, std::vector<PhotoStep>& out) {
      if (mode != "standard") {
        PhotoStep s;
        s.host = [mode](const Tensor& img) { return NormalizePerImage(img, mode); };
        out.push_back(s);
        return;
      }
      for (const auto* list : {&mean, &sd})
        if (list->size() != 1 && static_cast<int>(list->size()) != v.channels)
          throw Error(ErrorCode::kInvalidArgument, "Normalize: mean and std need one value per channel (" +
                                                       std::to_string(v.channels) + ") or one value, found " +
                                                       std::to_string(list->size()));
      out.push_back(Op("NormalizeImage", {{"scale", Attribute::Float(static_cast<float>(1.0 / max_pixel))},
                                          {"mean", Attribute::Floats(mean)},
                                          {"std", Attribute::Floats(sd)},
                                          {"layout", Attribute::String("HWC")}}));
    });
  };
  f["MotionBlur"] = [](Params& ps) {
    // Kernel sizes as Albumentations' sample_odd_from_range: odd, an even bound moved up by one, at least 3; a single
    // number x means (3, x). The kernel's line is 2.x's in files written by 2.x, 1.4's otherwise (filters.h).
    const bool v2 = ps.Str("_kernel_rule", "") == "v2";
    const json* bl = ps.Get("blur_limit");
    Range k{3, 7};
    if (bl)
      k = bl->is_number() ? Range{3, bl->get<double>()} : Params::FromJson(*bl, ps.At("blur_limit"), Params::kFixed);
    if (k.first != std::floor(k.first) || k.second != std::floor(k.second) || k.first < 3 || k.second > 255)
      Bad(ps.At("blur_limit"), "kernel sizes must be integers in 3..255");
    const int64_t k0 = std::llround(k.first) | 1, k1 = std::max<int64_t>(k0, std::llround(k.second) | 1);
    const Range angle = ps.Rng2("angle_range", {0, 360}, Params::kFixed);
    const Range dir = ps.Rng2("direction_range", {-1, 1}, Params::kFixed);
    const bool shifted = ps.Bool("allow_shifted", true);
    if (angle.first < 0 || angle.second > 360) Bad(ps.At("angle_range"), "must lie in [0, 360]");
    if (dir.first < -1 || dir.second > 1) Bad(ps.At("direction_range"), "must lie in [-1, 1]");
    return Photo("MotionBlur", [=](Rng& rng, const View&, std::vector<PhotoStep>& out) {
      const int64_t ks = k0 + 2 * rng.Int(0, (k1 - k0) / 2);
      const double a = rng.Uniform(angle.first, angle.second), d = rng.Uniform(dir.first, dir.second);
      const double half = static_cast<double>(ks / 2);
      double sx = 0, sy = 0;
      if (shifted) sx = rng.Uniform(-1, 1) * half / 2, sy = rng.Uniform(-1, 1) * half / 2;
      PhotoStep s;
      s.host = [taps = MotionKernel(ks, a, d, sx, sy, v2)](const Tensor& img) { return CorrelateSparse(img, taps); };
      out.push_back(s);
    });
  };
  f["CLAHE"] = [](Params& ps) {
    // clip_limit: a number x means (1, x), as Albumentations.
    const json* cl = ps.Get("clip_limit");
    Range clip{1, 4};
    if (cl)
      clip = cl->is_number() ? Range{1, cl->get<double>()} : Params::FromJson(*cl, ps.At("clip_limit"), Params::kFixed);
    if (clip.first < 0 || clip.first > clip.second) Bad(ps.At("clip_limit"), "expected a range of non-negative limits");
    Range tiles{8, 8};  // (across, down): a size, not a range
    if (const json* t = ps.Get("tile_grid_size")) {
      if (!t->is_array() || t->size() != 2 || !(*t)[0].is_number() || !(*t)[1].is_number())
        Bad(ps.At("tile_grid_size"), "expected [tiles across, tiles down], found " + t->dump());
      tiles = {(*t)[0].get<double>(), (*t)[1].get<double>()};
    }
    // Each tile keeps a 256-entry table: a 256 x 256 grid (16 MiB) is far past any useful setting.
    if (tiles.first != std::floor(tiles.first) || tiles.second != std::floor(tiles.second) || tiles.first < 1 ||
        tiles.second < 1 || tiles.first > 256 || tiles.second > 256)
      Bad(ps.At("tile_grid_size"), "expected two integers in 1..256 (tiles across, tiles down)");
    const int64_t tx = std::llround(tiles.first), ty = std::llround(tiles.second);
    return Photo("CLAHE", [=](Rng& rng, const View&, std::vector<PhotoStep>& out) {
      const double limit = rng.Uniform(clip.first, clip.second);
      PhotoStep s;
      s.host = [=](const Tensor& img) { return Clahe(img, limit, tx, ty); };
      out.push_back(s);
    });
  };
  f["RandomShadow"] = [](Params& ps) {
    std::array<double, 4> roi = {0, 0.5, 1, 1};
    if (const json* r = ps.Get("shadow_roi")) {
      if (!r->is_array() || r->size() != 4)
        Bad(ps.At("shadow_roi"), "expected [x_min, y_min, x_max, y_max], found " + r->dump());
      for (int i = 0; i < 4; ++i) {
        if (!(*r)[i].is_number()) Bad(ps.At("shadow_roi"), "expected numbers, found " + r->dump());
        roi[i] = (*r)[i].get<double>();
      }
    }
    if (!(0 <= roi[0] && roi[0] <= roi[2] && roi[2] <= 1 && 0 <= roi[1] && roi[1] <= roi[3] && roi[3] <= 1))
      Bad(ps.At("shadow_roi"), "expected 0 <= x_min <= x_max <= 1 and 0 <= y_min <= y_max <= 1");
    Range n = ps.Rng2("num_shadows_limit", {1, 2}, Params::kFixed);
    n.first = static_cast<double>(ps.Int("num_shadows_lower", std::llround(n.first)));  // 1.4's deprecated names
    n.second = static_cast<double>(ps.Int("num_shadows_upper", std::llround(n.second)));
    // Each shadow is a polygon scan-converted over the image: more than this is a typo, not an augmentation.
    constexpr double kMaxShadows = 100;
    if (n.first < 1 || n.first > n.second || n.second > kMaxShadows || n.first != std::floor(n.first) ||
        n.second != std::floor(n.second))
      Bad(ps.At("num_shadows_limit"), "expected integers 1 <= lower <= upper <= 100, found [" +
                                          std::to_string(n.first) + ", " + std::to_string(n.second) + "]");
    const int64_t dim = ps.Int("shadow_dimension", 5);
    // Every row of the image crosses every edge of every polygon: 100 vertices is already far past a shadow's shape.
    if (dim < 3 || dim > 100) Bad(ps.At("shadow_dimension"), "expected 3..100 vertices, found " + std::to_string(dim));
    const Range in = ps.Rng2("shadow_intensity_range", {0.5, 0.5}, Params::kFixed);
    if (in.first < 0 || in.second > 1) Bad(ps.At("shadow_intensity_range"), "must lie in [0, 1]");
    return Photo("RandomShadow", [=](Rng& rng, const View& v, std::vector<PhotoStep>& out) {
      const int64_t shadows = rng.Int(std::llround(n.first), std::llround(n.second));
      const int64_t x0 = static_cast<int64_t>(roi[0] * v.width), x1 = static_cast<int64_t>(roi[2] * v.width);
      const int64_t y0 = static_cast<int64_t>(roi[1] * v.height), y1 = static_cast<int64_t>(roi[3] * v.height);
      std::vector<std::vector<std::array<int64_t, 2>>> polygons(static_cast<size_t>(shadows));
      std::vector<double> intensities;
      // Vertices as numpy's integers(lo, hi): hi excluded.
      for (auto& poly : polygons)
        for (int64_t i = 0; i < dim; ++i)
          poly.push_back({rng.Int(x0, std::max(x0, x1 - 1)), rng.Int(y0, std::max(y0, y1 - 1))});
      for (int64_t i = 0; i < shadows; ++i) intensities.push_back(rng.Uniform(in.first, in.second));
      PhotoStep s;
      s.host = [polygons, intensities](const Tensor& img) { return AddShadows(img, polygons, intensities); };
      out.push_back(s);
    });
  };
}

}  // namespace osprey::augment
