// Pipeline JSON (osprey's and Albumentations' spelling) -> a tree of transforms, and each transform's sampling rule.
// Parameter names, defaults and random rules follow Albumentations 1.4.24 (docs/augment.md lists the deviations).
#include "augment/transforms.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "osprey/error.h"

namespace osprey::augment {

using nlohmann::json;

GeoStep Transform::Geometry(Rng&, const View&) const {
  throw Error(ErrorCode::kInternal, name + " is not geometric");
}
void Transform::Photometric(Rng&, const View&, std::vector<PhotoStep>&) const {
  throw Error(ErrorCode::kInternal, name + " is not photometric");
}

namespace {

using Range = std::pair<double, double>;
using GeoFn = std::function<GeoStep(Rng&, const View&)>;
using PhotoFn = std::function<void(Rng&, const View&, std::vector<PhotoStep>&)>;

class GeoTransform final : public Transform {
 public:
  GeoTransform(std::string n, GeoFn fn) : fn_(std::move(fn)) { name = std::move(n); }
  bool IsGeometric() const override { return true; }
  GeoStep Geometry(Rng& rng, const View& v) const override { return fn_(rng, v); }

 private:
  GeoFn fn_;
};

class PhotoTransform final : public Transform {
 public:
  PhotoTransform(std::string n, PhotoFn fn) : fn_(std::move(fn)) { name = std::move(n); }
  bool IsGeometric() const override { return false; }
  void Photometric(Rng& rng, const View& v, std::vector<PhotoStep>& s) const override { fn_(rng, v, s); }

 private:
  PhotoFn fn_;
};

[[noreturn]] void Bad(const std::string& path, const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, "pipeline: " + path + ": " + what);
}

// Reads one transform's parameters; every key must be consumed (read, ignored or checked), so a setting osprey does
// not implement is refused instead of silently ignored.
// The major version of the Albumentations that wrote the file being parsed ("__version__"; 1 when absent), set by
// ParsePipelineJson for the parse on this thread.
thread_local int t_albumentations_major = 1;

class Params {
 public:
  Params(const json& j, std::string path, std::string name) : j_(j), path_(std::move(path)), name_(std::move(name)) {
    for (const char* k : {"__class_fullname__", "type", "p", "always_apply", "mask_interpolation", "fill_mask", "id",
                          "strict", "seed", "transforms"})
      used_.insert(k);
  }
  bool Has(const std::string& k) const { return j_.contains(k) && !j_.at(k).is_null(); }
  const json* Get(const std::string& k) {
    used_.insert(k);
    return Has(k) ? &j_.at(k) : nullptr;
  }
  std::string At(const std::string& k) const { return path_ + "." + k; }

  double Num(const std::string& k, double def) {
    const json* v = Get(k);
    if (!v) return def;
    if (!v->is_number()) Bad(At(k), "expected a number, found " + v->dump());
    const double d = v->get<double>();
    if (!std::isfinite(d)) Bad(At(k), "must be finite");
    return d;
  }
  int64_t Int(const std::string& k, int64_t def) {
    const double d = Num(k, static_cast<double>(def));
    if (d != std::floor(d)) Bad(At(k), "expected an integer, found " + std::to_string(d));
    return static_cast<int64_t>(d);
  }
  std::string Str(const std::string& k, const std::string& def) {
    const json* v = Get(k);
    if (!v) return def;
    if (!v->is_string()) Bad(At(k), "expected a string, found " + v->dump());
    return v->get<std::string>();
  }
  bool Bool(const std::string& k, bool def) {
    const json* v = Get(k);
    if (!v) return def;
    if (!v->is_boolean()) Bad(At(k), "expected true or false, found " + v->dump());
    return v->get<bool>();
  }
  // How a single number x expands to a range.
  enum Scalar { kSymmetric /* [-x, x] */, kAroundOne /* [max(0, 1 - x), 1 + x] */, kFixed /* [x, x] */ };
  static Range FromJson(const json& v, const std::string& path, Scalar scalar) {
    if (v.is_number()) {
      const double x = v.get<double>();
      if (scalar == kSymmetric) return {-std::fabs(x), std::fabs(x)};
      if (scalar == kAroundOne) return {std::max(0.0, 1 - x), 1 + x};
      return {x, x};
    }
    if (v.is_array() && v.size() == 2 && v[0].is_number() && v[1].is_number()) {
      Range r{v[0].get<double>(), v[1].get<double>()};
      if (!std::isfinite(r.first) || !std::isfinite(r.second)) Bad(path, "must be finite");
      if (r.first > r.second) Bad(path, "range [" + v[0].dump() + ", " + v[1].dump() + "] is reversed");
      return r;
    }
    Bad(path, "expected a number or a [min, max] pair, found " + v.dump());
  }
  Range Rng2(const std::string& k, Range def, Scalar scalar) {
    const json* v = Get(k);
    return v ? FromJson(*v, At(k), scalar) : def;
  }
  // A per-axis range: a number, a pair, or {"x": ..., "y": ...}.
  std::pair<Range, Range> XY(const std::string& k, Range def, Scalar scalar) {
    const json* v = Get(k);
    if (!v) return {def, def};
    if (v->is_object()) {
      auto axis = [&](const char* a) {
        return v->contains(a) && !v->at(a).is_null() ? FromJson(v->at(a), At(k) + "." + a, scalar) : def;
      };
      return {axis("x"), axis("y")};
    }
    const Range r = FromJson(*v, At(k), scalar);
    return {r, r};
  }
  // Keys whose only supported value is `expected` (absent is fine).
  void Require(const std::string& k, const json& expected) {
    const json* v = Get(k);
    if (v && *v != expected)
      throw Error(ErrorCode::kUnsupported, "pipeline: " + At(k) + ": " + name_ + " with " + k + " = " + v->dump() +
                                               " is not supported (only " + expected.dump() + ")");
  }
  void Ignore(const std::string& k) { used_.insert(k); }
  int Interpolation() {
    const int64_t i = Int("interpolation", 1);
    if (i < 0 || i > 4) Bad(At("interpolation"), "expected an OpenCV interpolation code 0..4, found " + std::to_string(i));
    if (i > 1) {
      static const char* const kNames[] = {"", "", "cv2.INTER_CUBIC", "cv2.INTER_AREA", "cv2.INTER_LANCZOS4"};
      throw Error(ErrorCode::kUnsupported, "pipeline: " + At("interpolation") + " = " + std::to_string(i) + " (" +
                                               kNames[i] + ") is not supported: osprey resamples with 0 "
                                               "(cv2.INTER_NEAREST) or 1 (cv2.INTER_LINEAR); set one of those");
    }
    return static_cast<int>(i);
  }
  int Border(int def) {
    const int64_t b = Int("border_mode", def);
    if (b == 3)
      throw Error(ErrorCode::kUnsupported, "pipeline: " + At("border_mode") + ": BORDER_WRAP (3) is not supported; use "
                                           "0 constant, 1 replicate, 2 reflect or 4 reflect_101");
    if (b != 0 && b != 1 && b != 2 && b != 4)
      Bad(At("border_mode"), "expected an OpenCV border code 0, 1, 2 or 4, found " + std::to_string(b));
    return static_cast<int>(b);
  }
  double Fill(const std::string& k = "fill") {
    const json* v = Get(k);
    if (!v) return 0;
    if (v->is_number()) return v->get<double>();
    if (v->is_array() && !v->empty() && v->at(0).is_number()) {
      for (const json& e : *v)
        if (e != v->at(0))
          throw Error(ErrorCode::kUnsupported, "pipeline: " + At(k) + ": a per-channel fill " + v->dump() +
                                                   " is not supported; give one number");
      return v->at(0).get<double>();
    }
    throw Error(ErrorCode::kUnsupported, "pipeline: " + At(k) + ": fill " + v->dump() + " is not supported; give a number");
  }
  void Done() const {
    for (auto it = j_.begin(); it != j_.end(); ++it)
      if (!used_.count(it.key()))
        throw Error(ErrorCode::kUnsupported, "pipeline: " + At(it.key()) + ": " + name_ + " parameter '" + it.key() +
                                                 "' is not supported by osprey (docs/augment.md lists the supported ones)");
  }
  const std::string& path() const { return path_; }

 private:
  const json& j_;
  std::string path_, name_;
  std::set<std::string> used_;
};

int64_t Positive(Params& ps, const std::string& k, int64_t def = -1) {
  if (def < 0 && !ps.Has(k)) Bad(ps.At(k), "is required");
  const int64_t v = ps.Int(k, def);
  if (v < 1 || v > (int64_t{1} << 20)) Bad(ps.At(k), "must be in [1, 1048576], found " + std::to_string(v));
  return v;
}

std::string TooSmall(const std::string& name, int64_t h, int64_t w, const View& v) {
  return name + ": the image is " + std::to_string(v.height) + "x" + std::to_string(v.width) + " (HxW), smaller than " +
         std::to_string(h) + "x" + std::to_string(w);
}

GeoStep Resample(const Mat3& forward, int64_t w, int64_t h, int interpolation) {
  GeoStep s;
  s.forward = forward;
  s.width = std::max<int64_t>(1, w);
  s.height = std::max<int64_t>(1, h);
  s.interpolation = interpolation;
  return s;
}

// Albumentations' affine map about the image centre: shift_center @ translate @ shear @ rotate @ scale @ shift_topleft
// (angles in radians, already signed as Albumentations uses them).
Mat3 AffineAbout(double cx, double cy, double tx, double ty, double sx, double sy, double rot, double shx, double shy) {
  const Mat3 r{{std::cos(rot), std::sin(rot), 0, -std::sin(rot), std::cos(rot), 0, 0, 0, 1}};
  const Mat3 sh{{1, std::tan(shx), 0, std::tan(shy), 1, 0, 0, 0, 1}};
  return Mat3::Translate(cx + tx, cy + ty) * sh * r * Mat3::Scale(sx, sy) * Mat3::Translate(-cx, -cy);
}

GeoStep CropTo(double x0, double y0, int64_t w, int64_t h) {
  GeoStep s;
  s.forward = Mat3::Translate(-x0, -y0);
  s.width = w, s.height = h;
  return s;
}

// Rotation by `deg` counter-clockwise (as seen) about the image centre, as cv2.getRotationMatrix2D.
Mat3 RotateAbout(double deg, double cx, double cy) {
  const double a = deg * M_PI / 180.0, c = std::cos(a), s = std::sin(a);
  return Mat3::Translate(cx, cy) * Mat3{{c, s, 0, -s, c, 0, 0, 0, 1}} * Mat3::Translate(-cx, -cy);
}

// Albumentations' BBoxSafeRandomCrop window (pixels): a random window holding the union of the boxes.
std::array<int64_t, 4> BoxSafeWindow(Rng& rng, const View& v, double erosion) {
  const double W = static_cast<double>(v.width), H = static_cast<double>(v.height);
  if (v.boxes.empty()) {
    // No boxes: a random window of random size (at least half of each side).
    const int64_t h = std::max<int64_t>(1, static_cast<int64_t>(H * rng.Uniform(0.5, 1.0)));
    const int64_t w = std::max<int64_t>(1, static_cast<int64_t>(W * rng.Uniform(0.5, 1.0)));
    const int64_t y = rng.Int(0, v.height - h), x = rng.Int(0, v.width - w);
    return {x, y, x + w, y + h};
  }
  double ux0 = W, uy0 = H, ux1 = 0, uy1 = 0;
  for (const auto& b : v.boxes) {
    const double ex = (b[2] - b[0]) * erosion / 2, ey = (b[3] - b[1]) * erosion / 2;
    ux0 = std::min(ux0, b[0] + ex), uy0 = std::min(uy0, b[1] + ey);
    ux1 = std::max(ux1, b[2] - ex), uy1 = std::max(uy1, b[3] - ey);
  }
  const int64_t x0 = static_cast<int64_t>(std::floor(rng.Uniform(0, std::max(0.0, ux0))));
  const int64_t y0 = static_cast<int64_t>(std::floor(rng.Uniform(0, std::max(0.0, uy0))));
  int64_t x1 = static_cast<int64_t>(std::ceil(rng.Uniform(std::min(W, ux1), W)));
  int64_t y1 = static_cast<int64_t>(std::ceil(rng.Uniform(std::min(H, uy1), H)));
  x1 = std::clamp<int64_t>(x1, x0 + 1, v.width);
  y1 = std::clamp<int64_t>(y1, y0 + 1, v.height);
  return {x0, y0, x1, y1};
}

std::vector<int64_t> LutFrom(const std::function<double(int)>& f) {
  std::vector<int64_t> t(256);
  for (int x = 0; x < 256; ++x) {
    const double y = f(x);  // Albumentations' uint8 LUTs clip then truncate (astype(uint8))
    t[x] = static_cast<int64_t>(std::clamp(std::isfinite(y) ? y : 0.0, 0.0, 255.0));
  }
  return t;
}

PhotoStep Op(std::string op, AttributeMap attrs) {
  PhotoStep s;
  s.op = std::move(op);
  s.attrs = std::move(attrs);
  return s;
}

PhotoStep Lut(std::vector<int64_t> table) { return Op("LookupTable", {{"table", Attribute::Ints(std::move(table))}}); }

using Factory = std::function<std::shared_ptr<Transform>(Params&)>;

std::shared_ptr<Transform> Geo(const std::string& n, GeoFn fn) { return std::make_shared<GeoTransform>(n, std::move(fn)); }
std::shared_ptr<Transform> Photo(const std::string& n, PhotoFn fn) {
  return std::make_shared<PhotoTransform>(n, std::move(fn));
}

const std::map<std::string, Factory>& Factories() {
  static const std::map<std::string, Factory> table = [] {
    std::map<std::string, Factory> f;
    // ---- geometric ----
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
    // ---- photometric ----
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
    return f;
  }();
  return table;
}


const std::set<std::string>& Containers() {
  static const std::set<std::string> c = {"Compose", "Sequential", "OneOf", "SomeOf"};
  return c;
}

std::string TypeOf(const json& j, const std::string& path) {
  if (!j.is_object()) Bad(path, "expected a transform object, found " + j.dump());
  for (const char* k : {"__class_fullname__", "type"})
    if (j.contains(k)) {
      if (!j.at(k).is_string()) Bad(path + "." + k, "expected a string");
      std::string t = j.at(k).get<std::string>();
      const size_t dot = t.rfind('.');  // old Albumentations wrote full module paths
      return dot == std::string::npos ? t : t.substr(dot + 1);
    }
  Bad(path, "has no \"type\" (or \"__class_fullname__\")");
}

double ReadP(const json& j, const std::string& path, double def) {
  if (!j.contains("p")) return def;
  if (!j.at("p").is_number()) Bad(path + ".p", "expected a number in [0, 1]");
  const double p = j.at("p").get<double>();
  if (!(p >= 0 && p <= 1)) Bad(path + ".p", "expected a number in [0, 1], found " + j.at("p").dump());
  return p;
}

PipelineNode ParseNode(const json& j, const std::string& path, std::optional<MosaicSpec>* mosaic, bool top_first);

std::vector<PipelineNode> ParseChildren(const json& j, const std::string& path, std::optional<MosaicSpec>* mosaic, bool top) {
  if (!j.contains("transforms") || !j.at("transforms").is_array()) Bad(path, "expected a \"transforms\" array");
  std::vector<PipelineNode> out;
  const json& ts = j.at("transforms");
  for (size_t i = 0; i < ts.size(); ++i) {
    const std::string p = path + ".transforms[" + std::to_string(i) + "]";
    if (TypeOf(ts[i], p) == "Mosaic" && ts[i].is_object() &&
        (ts[i].contains("grid_yx") || ts[i].contains("cell_shape") || ts[i].contains("target_size")))
      throw Error(ErrorCode::kUnsupported,
                  "pipeline: " + p + ": Albumentations 2.x's Mosaic (grid_yx, cell_shape, target_size, fit_mode) is not "
                  "supported; osprey's own Mosaic takes height, width, center_range and fill, as the first step "
                  "(docs/augment.md)");
    if (top && i == 0 && TypeOf(ts[i], p) == "Mosaic") {
      Params ps(ts[i], p, "Mosaic");
      MosaicSpec m;
      m.height = Positive(ps, "height"), m.width = Positive(ps, "width");
      const Range c = ps.Rng2("center_range", {0.25, 0.75}, Params::kFixed);
      if (c.first < 0 || c.second > 1) Bad(ps.At("center_range"), "must lie in [0, 1]");
      m.center_lo = c.first, m.center_hi = c.second;
      m.fill = ps.Num("fill", 114);
      m.p = ReadP(ts[i], p, 1.0);
      ps.Done();
      *mosaic = m;
      continue;
    }
    out.push_back(ParseNode(ts[i], p, mosaic, false));
  }
  return out;
}

PipelineNode ParseNode(const json& j, const std::string& path, std::optional<MosaicSpec>* mosaic, bool top) {
  PipelineNode n;
  n.name = TypeOf(j, path);
  if (n.name == "Mosaic")
    throw Error(ErrorCode::kUnsupported, "pipeline: " + path + ": Mosaic must be the first step of the top-level Compose");
  if (Containers().count(n.name)) {
    n.kind = n.name == "Compose" ? PipelineNode::kCompose
             : n.name == "Sequential" ? PipelineNode::kSequential
             : n.name == "OneOf"      ? PipelineNode::kOneOf
                                      : PipelineNode::kSomeOf;
    n.p = ReadP(j, path, n.kind == PipelineNode::kOneOf ? 0.5 : 1.0);
    n.children = ParseChildren(j, path, mosaic, top);
    if (n.kind == PipelineNode::kSomeOf) {
      if (!j.contains("n") || !j.at("n").is_number_integer() || j.at("n").get<int64_t>() < 0)
        Bad(path + ".n", "SomeOf needs \"n\", a non-negative integer");
      n.n = j.at("n").get<int64_t>();
      if (j.contains("replace")) {
        if (!j.at("replace").is_boolean()) Bad(path + ".replace", "expected true or false");
        n.replace = j.at("replace").get<bool>();
      }
      if (!n.replace && n.n > static_cast<int64_t>(n.children.size()))
        Bad(path + ".n", "SomeOf picks " + std::to_string(n.n) + " of only " + std::to_string(n.children.size()) +
                             " transforms without replacement");
    }
    if (j.contains("additional_targets") && !j.at("additional_targets").empty())
      throw Error(ErrorCode::kUnsupported, "pipeline: " + path + ".additional_targets is not supported");
    return n;
  }
  const auto& fs = Factories();
  auto it = fs.find(n.name);
  if (it == fs.end())
    throw Error(ErrorCode::kUnsupported, "pipeline: " + path + ": transform \"" + n.name +
                                             "\" is not supported by osprey; supported: " + SupportedTransforms());
  const json spec = FromAlbumentations2(n.name, FromAlbumentations13(n.name, j, path), path, t_albumentations_major);
  Params ps(spec, path, n.name);
  n.kind = PipelineNode::kLeaf;
  n.p = ReadP(j, path, 0.5);
  n.leaf = it->second(ps);
  ps.Done();
  return n;
}

BoxFilter ParseBoxFilter(const json& bp, const std::string& path) {
  BoxFilter f;
  if (bp.is_null()) return f;
  if (!bp.is_object()) Bad(path, "expected an object");
  Params ps(bp, path, "bbox_params");
  ps.Ignore("format"), ps.Ignore("label_fields"), ps.Ignore("check_each_transform"), ps.Ignore("clip");
  ps.Ignore("filter_invalid_bboxes"), ps.Ignore("max_accept_ratio");
  f.min_area = ps.Num("min_area", 0);
  f.min_visibility = ps.Num("min_visibility", 0);
  f.min_width = ps.Num("min_width", 0);
  f.min_height = ps.Num("min_height", 0);
  if (f.min_area < 0 || f.min_visibility < 0 || f.min_visibility > 1 || f.min_width < 0 || f.min_height < 0)
    Bad(path, "min_area, min_width, min_height must be >= 0 and min_visibility in [0, 1]");
  ps.Done();
  return f;
}

}  // namespace

std::string SupportedTransforms() {
  std::string s;
  for (const auto& [name, f] : Factories()) s += (s.empty() ? "" : ", ") + name;
  return s + ", Mosaic, Compose, Sequential, OneOf, SomeOf";
}

ParsedPipeline ParsePipelineJson(const std::string& text) {
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::exception& e) {
    throw Error(ErrorCode::kInvalidArgument, std::string("pipeline: not valid JSON: ") + e.what());
  }
  if (!doc.is_object()) Bad("(top)", "expected a JSON object");
  const json& root = doc.contains("transform") ? doc.at("transform") : doc;
  const std::string path = doc.contains("transform") ? "transform" : "(top)";
  t_albumentations_major = 1;
  if (doc.contains("__version__") && doc.at("__version__").is_string()) {
    const std::string v = doc.at("__version__").get<std::string>();
    if (!v.empty() && std::isdigit(static_cast<unsigned char>(v[0]))) t_albumentations_major = std::stoi(v);
  }
  ParsedPipeline out;
  const std::string type = TypeOf(root, path);
  if (!Containers().count(type)) {
    // A bare transform: treat as Compose([it]).
    json wrapped = {{"type", "Compose"}, {"transforms", json::array({root})}};
    out.root = ParseNode(wrapped, path, &out.mosaic, true);
  } else {
    out.root = ParseNode(root, path, &out.mosaic, true);
  }
  for (const json* j : {&root, static_cast<const json*>(&doc)})
    if (j->contains("bbox_params")) {
      out.filter = ParseBoxFilter(j->at("bbox_params"), path + ".bbox_params");
      break;
    }
  return out;
}

}  // namespace osprey::augment
