// Params' helpers and the sampling helpers shared by the transform factories (params.h).
#include "augment/params.h"

#include <algorithm>

namespace osprey::augment {

thread_local int t_albumentations_major = 1;

namespace {


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
}  // namespace

[[noreturn]] void Bad(const std::string& path, const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, "pipeline: " + path + ": " + what);
}

int64_t Positive(Params& ps, const std::string& k, int64_t def) {
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

std::shared_ptr<Transform> Geo(const std::string& n, GeoFn fn) { return std::make_shared<GeoTransform>(n, std::move(fn)); }
std::shared_ptr<Transform> Photo(const std::string& n, PhotoFn fn) {
  return std::make_shared<PhotoTransform>(n, std::move(fn));
}

}  // namespace osprey::augment
