#pragma once
// What the transform factories are made of (internal to src/augment): Params, the reader of one transform's parameters
// (every key must be consumed: read, ignored or checked, so a setting osprey does not implement is refused instead of
// silently ignored), the sampling helpers (resample, crop, affine map, lookup tables), and the two registration
// functions (transforms_geometric.cc, transforms_photometric.cc) that transforms.cc's factory table is built from.
#include <array>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "augment/transforms.h"
#include "osprey/error.h"

namespace osprey::augment {

using nlohmann::json;
using Range = std::pair<double, double>;
using GeoFn = std::function<GeoStep(Rng&, const View&)>;
using PhotoFn = std::function<void(Rng&, const View&, std::vector<PhotoStep>&)>;

[[noreturn]] void Bad(const std::string& path, const std::string& what);

// The major version of the Albumentations that wrote the file being parsed ("__version__"; 1 when absent), set by
// ParsePipelineJson for the parse on this thread.
extern thread_local int t_albumentations_major;

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

int64_t Positive(Params& ps, const std::string& k, int64_t def = -1);
std::string TooSmall(const std::string& name, int64_t h, int64_t w, const View& v);
GeoStep Resample(const Mat3& forward, int64_t w, int64_t h, int interpolation);
// Albumentations' affine map about the image centre: shift_center @ translate @ shear @ rotate @ scale @ shift_topleft
// (angles in radians, already signed as Albumentations uses them).
Mat3 AffineAbout(double cx, double cy, double tx, double ty, double sx, double sy, double rot, double shx, double shy);
GeoStep CropTo(double x0, double y0, int64_t w, int64_t h);
// Rotation by `deg` counter-clockwise (as seen) about the image centre, as cv2.getRotationMatrix2D.
Mat3 RotateAbout(double deg, double cx, double cy);
// Albumentations' BBoxSafeRandomCrop window (pixels): a random window holding the union of the boxes.
std::array<int64_t, 4> BoxSafeWindow(Rng& rng, const View& v, double erosion);
// A uint8 lookup table of f(x), clipped then truncated as Albumentations' uint8 LUTs.
std::vector<int64_t> LutFrom(const std::function<double(int)>& f);
PhotoStep Op(std::string op, AttributeMap attrs);
PhotoStep Lut(std::vector<int64_t> table);

using Factory = std::function<std::shared_ptr<Transform>(Params&)>;
std::shared_ptr<Transform> Geo(const std::string& n, GeoFn fn);
std::shared_ptr<Transform> Photo(const std::string& n, PhotoFn fn);

/// The factory tables: transforms_geometric.cc and transforms_photometric.cc.
void AddGeometricTransforms(std::map<std::string, Factory>& f);
void AddPhotometricTransforms(std::map<std::string, Factory>& f);

}  // namespace osprey::augment
