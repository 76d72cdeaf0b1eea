// The photometric transforms: each factory reads its parameters and returns the rule that appends osprey-domain ops
// (or a host step) per application.
#include <algorithm>

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
    ps.Require("brightness_by_max", true);
    ps.Require("ensure_safe_range", false);
    return Photo("RandomBrightnessContrast", [=](Rng& rng, const View&, std::vector<PhotoStep>& out) {
      const double alpha = 1 + rng.Uniform(cl.first, cl.second), beta = rng.Uniform(bl.first, bl.second) * 255;
      out.push_back(Lut(LutFrom([&](int x) { return x * alpha + beta; })));
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
}

}  // namespace osprey::augment
