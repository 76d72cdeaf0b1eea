// Projective matrices, target movement and the seeded random source of src/augment.
#include "augment/geometry.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "augment/transforms.h"
#include "osprey/error.h"

namespace osprey::augment {

Mat3 Mat3::operator*(const Mat3& o) const {
  Mat3 r;
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) {
      double s = 0;
      for (int k = 0; k < 3; ++k) s += m[i * 3 + k] * o.m[k * 3 + j];
      r.m[i * 3 + j] = s;
    }
  return r;
}

Mat3 Mat3::Inverse() const {
  const auto& a = m;
  const double c00 = a[4] * a[8] - a[5] * a[7], c01 = a[5] * a[6] - a[3] * a[8], c02 = a[3] * a[7] - a[4] * a[6];
  const double det = a[0] * c00 + a[1] * c01 + a[2] * c02;
  if (!std::isfinite(det) || std::fabs(det) < 1e-12)
    throw Error(ErrorCode::kInvalidArgument, "augment: a geometric transform collapsed the image (singular matrix)");
  const double k = 1.0 / det;
  Mat3 r;
  r.m = {c00 * k, (a[2] * a[7] - a[1] * a[8]) * k, (a[1] * a[5] - a[2] * a[4]) * k,
         c01 * k, (a[0] * a[8] - a[2] * a[6]) * k, (a[2] * a[3] - a[0] * a[5]) * k,
         c02 * k, (a[1] * a[6] - a[0] * a[7]) * k, (a[0] * a[4] - a[1] * a[3]) * k};
  if (IsAffine()) {  // keep affine maps exactly affine so kernels take their affine path
    r.m[6] = r.m[7] = 0;
    r.m[8] = 1;
  }
  return r;
}

bool Mat3::IsIdentity(double tol) const {
  static const std::array<double, 9> id = {1, 0, 0, 0, 1, 0, 0, 0, 1};
  for (int i = 0; i < 9; ++i)
    if (std::fabs(m[i] - id[i]) > tol) return false;
  return true;
}

bool Mat3::Map(double x, double y, double* ox, double* oy) const {
  const double w = m[6] * x + m[7] * y + m[8];
  if (!(w > 1e-12)) return false;
  *ox = (m[0] * x + m[1] * y + m[2]) / w;
  *oy = (m[3] * x + m[4] * y + m[5]) / w;
  return true;
}

Mat3 HomographyFromQuad(const std::array<std::array<double, 2>, 4>& src,
                        const std::array<std::array<double, 2>, 4>& dst) {
  // Solve the 8x8 system for h0..h7 (h8 = 1) by Gaussian elimination with partial pivoting.
  double a[8][9];
  for (int i = 0; i < 4; ++i) {
    const double x = src[i][0], y = src[i][1], u = dst[i][0], v = dst[i][1];
    const double r0[9] = {x, y, 1, 0, 0, 0, -u * x, -u * y, u};
    const double r1[9] = {0, 0, 0, x, y, 1, -v * x, -v * y, v};
    std::copy(r0, r0 + 9, a[2 * i]);
    std::copy(r1, r1 + 9, a[2 * i + 1]);
  }
  for (int col = 0; col < 8; ++col) {
    int piv = col;
    for (int r = col + 1; r < 8; ++r)
      if (std::fabs(a[r][col]) > std::fabs(a[piv][col])) piv = r;
    if (std::fabs(a[piv][col]) < 1e-12)
      throw Error(ErrorCode::kInvalidArgument, "augment: perspective corners are degenerate (three collinear points)");
    std::swap(a[piv], a[col]);
    for (int r = 0; r < 8; ++r) {
      if (r == col) continue;
      const double f = a[r][col] / a[col][col];
      for (int c = col; c < 9; ++c) a[r][c] -= f * a[col][c];
    }
  }
  Mat3 h;
  for (int i = 0; i < 8; ++i) h.m[i] = a[i][8] / a[i][i];
  h.m[8] = 1;
  return h;
}

Mat3 PixelInverseMap(const Mat3& forward) {
  // Continuous u = pixel x + 0.5. Output pixel -> continuous -> inverse map -> continuous input -> input pixel.
  return Mat3::Translate(-0.5, -0.5) * forward.Inverse() * Mat3::Translate(0.5, 0.5);
}

namespace {

using Poly = std::vector<std::array<double, 2>>;

// One Sutherland–Hodgman pass against the half-plane inside(p) with edge crossing computed by `cross`.
template <typename Inside, typename Cross>
Poly ClipEdge(const Poly& in, Inside inside, Cross cross) {
  Poly out;
  for (size_t i = 0; i < in.size(); ++i) {
    const auto& a = in[i];
    const auto& b = in[(i + 1) % in.size()];
    const bool ia = inside(a), ib = inside(b);
    if (ia) out.push_back(a);
    if (ia != ib) out.push_back(cross(a, b));
  }
  return out;
}

Poly ClipToRect(Poly p, const std::array<double, 4>& r) {
  auto lerp_x = [](const std::array<double, 2>& a, const std::array<double, 2>& b, double x) {
    const double t = (x - a[0]) / (b[0] - a[0]);
    return std::array<double, 2>{x, a[1] + t * (b[1] - a[1])};
  };
  auto lerp_y = [](const std::array<double, 2>& a, const std::array<double, 2>& b, double y) {
    const double t = (y - a[1]) / (b[1] - a[1]);
    return std::array<double, 2>{a[0] + t * (b[0] - a[0]), y};
  };
  p = ClipEdge(p, [&](const auto& q) { return q[0] >= r[0]; }, [&](const auto& a, const auto& b) { return lerp_x(a, b, r[0]); });
  if (p.empty()) return p;
  p = ClipEdge(p, [&](const auto& q) { return q[0] <= r[2]; }, [&](const auto& a, const auto& b) { return lerp_x(a, b, r[2]); });
  if (p.empty()) return p;
  p = ClipEdge(p, [&](const auto& q) { return q[1] >= r[1]; }, [&](const auto& a, const auto& b) { return lerp_y(a, b, r[1]); });
  if (p.empty()) return p;
  return ClipEdge(p, [&](const auto& q) { return q[1] <= r[3]; }, [&](const auto& a, const auto& b) { return lerp_y(a, b, r[3]); });
}

}  // namespace

void MoveKeypoints(std::vector<double>& keypoints, const Mat3& forward, const std::array<double, 4>& clip) {
  for (size_t i = 0; i + 2 < keypoints.size(); i += 3) {
    double& kx = keypoints[i];
    double& ky = keypoints[i + 1];
    double& kv = keypoints[i + 2];
    if (kv <= 0) continue;
    double x, y;
    if (forward.Map(kx, ky, &x, &y) && x >= clip[0] && x < clip[2] && y >= clip[1] && y < clip[3]) {
      kx = x, ky = y;
    } else {
      kx = ky = kv = 0;
    }
  }
}

int64_t MoveObjects(std::vector<Object>& objects, const Mat3& forward, const std::array<double, 4>& clip,
                    const BoxFilter& filter) {
  std::vector<Object> kept;
  kept.reserve(objects.size());
  for (Object& o : objects) {
    const double cx[4] = {o.x0, o.x1, o.x1, o.x0}, cy[4] = {o.y0, o.y0, o.y1, o.y1};
    double bx0 = INFINITY, by0 = INFINITY, bx1 = -INFINITY, by1 = -INFINITY;
    bool ok = true;
    for (int i = 0; i < 4; ++i) {
      double x, y;
      if (!forward.Map(cx[i], cy[i], &x, &y)) {
        ok = false;
        break;
      }
      bx0 = std::min(bx0, x), by0 = std::min(by0, y), bx1 = std::max(bx1, x), by1 = std::max(by1, y);
    }
    if (!ok) continue;
    const double area = (bx1 - bx0) * (by1 - by0);
    const double x0 = std::max(bx0, clip[0]), y0 = std::max(by0, clip[1]);
    const double x1 = std::min(bx1, clip[2]), y1 = std::min(by1, clip[3]);
    const double w = x1 - x0, h = y1 - y0;
    if (!(w > 0 && h > 0) || !(area > 0)) continue;
    const double clipped = w * h;
    if (clipped < filter.min_area || clipped / area < filter.min_visibility || w < filter.min_width ||
        h < filter.min_height)
      continue;
    o.x0 = x0, o.y0 = y0, o.x1 = x1, o.y1 = y1;
    std::vector<std::vector<double>> polys;
    for (const std::vector<double>& flat : o.polygons) {
      Poly p;
      bool mapped = true;
      for (size_t i = 0; i + 1 < flat.size(); i += 2) {
        double x, y;
        if (!forward.Map(flat[i], flat[i + 1], &x, &y)) {
          mapped = false;
          break;
        }
        p.push_back({x, y});
      }
      if (!mapped || p.size() < 3) continue;
      p = ClipToRect(std::move(p), clip);
      if (p.size() < 3) continue;
      std::vector<double> out;
      out.reserve(p.size() * 2);
      for (const auto& q : p) out.push_back(q[0]), out.push_back(q[1]);
      polys.push_back(std::move(out));
    }
    o.polygons = std::move(polys);
    MoveKeypoints(o.keypoints, forward, clip);
    kept.push_back(std::move(o));
  }
  const int64_t removed = static_cast<int64_t>(objects.size() - kept.size());
  objects = std::move(kept);
  return removed;
}

namespace {

// Inverse of a non-decreasing pixel map at a continuous coordinate: the continuous output coordinate whose pixel
// samples it (linear between neighbouring pixels); false when it lies outside what the map reaches.
bool InverseMap(const std::vector<float>& map, double coord, double* out) {
  const double u = coord - 0.5;  // pixel-index position
  const size_t n = map.size();
  if (n == 0 || u < map[0] || u > map[n - 1]) return false;
  const size_t hi = static_cast<size_t>(std::lower_bound(map.begin(), map.end(), u) - map.begin());
  if (hi == 0) {
    *out = 0.5;
    return true;
  }
  const double a = map[hi - 1], b = map[hi];
  *out = double(hi - 1) + (b > a ? (u - a) / (b - a) : 0.0) + 0.5;
  return true;
}

bool InverseRemap(const SeparableRemap& r, double x, double y, double* ox, double* oy) {
  return InverseMap(r.map_x, x, ox) && InverseMap(r.map_y, y, oy);
}

// Output pixel range [first, last] whose nearest source index (cv2.remap INTER_NEAREST rounds) lies in [lo, hi]; false
// when none does.
bool MaskSpan(const std::vector<float>& map, int64_t lo, int64_t hi, int64_t* first, int64_t* last) {
  *first = -1;
  for (size_t i = 0; i < map.size(); ++i) {
    const int64_t src = static_cast<int64_t>(std::nearbyint(map[i]));
    if (src < lo || src > hi) continue;
    if (*first < 0) *first = static_cast<int64_t>(i);
    *last = static_cast<int64_t>(i);
  }
  return *first >= 0;
}

// Moves points through `inverse` (source continuous coordinates -> output ones; false: not reached); keypoints whose
// image falls outside the w x h output become 0, 0, 0.
template <typename Inverse>
void RemapKeypointsWith(std::vector<double>& keypoints, const Inverse& inverse, double w, double h) {
  for (size_t i = 0; i + 2 < keypoints.size(); i += 3) {
    if (keypoints[i + 2] <= 0) continue;
    double x, y;
    if (inverse(keypoints[i], keypoints[i + 1], &x, &y) && x >= 0 && x < w && y >= 0 && y < h) {
      keypoints[i] = x, keypoints[i + 1] = y;
    } else {
      keypoints[i] = keypoints[i + 1] = keypoints[i + 2] = 0;
    }
  }
}

// The object loop shared by the displacement fields: `span(c0, c1, r0, r1, out)` gives the output pixel bounds
// (x0, y0, x1, y1, pixel indices) of the box's source pixel mask, false when nothing of it remains; `inverse` moves
// points (RemapKeypointsWith).
template <typename Span, typename Inverse>
int64_t RemapObjectsWith(std::vector<Object>& objects, std::vector<double>& keypoints, int64_t w, int64_t h,
                         const BoxFilter& filter, const Span& span, const Inverse& inverse) {
  RemapKeypointsWith(keypoints, inverse, double(w), double(h));
  std::vector<Object> kept;
  kept.reserve(objects.size());
  for (Object& o : objects) {
    auto index = [](double v, int64_t n) {
      return std::clamp<int64_t>(static_cast<int64_t>(std::nearbyint(v)), 0, n - 1);
    };
    std::array<int64_t, 4> b;
    if (!span(index(o.x0, w), index(o.x1, w), index(o.y0, h), index(o.y1, h), &b)) continue;
    const double bw = double(b[2] - b[0]), bh = double(b[3] - b[1]);
    if (!(bw > 0 && bh > 0) || bw * bh < filter.min_area || bw < filter.min_width || bh < filter.min_height) continue;
    o.x0 = double(b[0]), o.y0 = double(b[1]), o.x1 = double(b[2]), o.y1 = double(b[3]);
    std::vector<std::vector<double>> polys;
    for (const std::vector<double>& flat : o.polygons) {
      Poly p;
      for (size_t i = 0; i + 1 < flat.size(); i += 2) {
        double x, y;
        // A vertex beyond the field's reach (the map does not cover the whole image) stays at the nearest edge.
        if (!inverse(flat[i], flat[i + 1], &x, &y)) {
          x = std::clamp(flat[i], 0.0, double(w)), y = std::clamp(flat[i + 1], 0.0, double(h));
        }
        p.push_back({x, y});
      }
      p = ClipToRect(std::move(p), {0, 0, double(w), double(h)});
      if (p.size() < 3) continue;
      std::vector<double> out;
      for (const auto& q : p) out.push_back(q[0]), out.push_back(q[1]);
      polys.push_back(std::move(out));
    }
    o.polygons = std::move(polys);
    RemapKeypointsWith(o.keypoints, inverse, double(w), double(h));
    kept.push_back(std::move(o));
  }
  const int64_t removed = static_cast<int64_t>(objects.size() - kept.size());
  objects = std::move(kept);
  return removed;
}

// Bilinear value of a dense map at pixel-index position (u, v), clamped to the grid.
double SampleMap(const std::vector<float>& map, int64_t w, int64_t h, double u, double v) {
  u = std::clamp(u, 0.0, double(w - 1)), v = std::clamp(v, 0.0, double(h - 1));
  const int64_t x0 = std::min<int64_t>(static_cast<int64_t>(u), w - 1), y0 = std::min<int64_t>(static_cast<int64_t>(v), h - 1);
  const int64_t x1 = std::min(x0 + 1, w - 1), y1 = std::min(y0 + 1, h - 1);
  const double a = u - double(x0), b = v - double(y0);
  auto at = [&](int64_t y, int64_t x) { return double(map[static_cast<size_t>(y * w + x)]); };
  return (at(y0, x0) * (1 - a) + at(y0, x1) * a) * (1 - b) + (at(y1, x0) * (1 - a) + at(y1, x1) * a) * b;
}

// Inverse of a dense field at a continuous source point: the continuous output point whose bilinearly interpolated
// map reaches it (within 0.05 pixel). Starts at the nearest output pixel centre (searched within max_shift), then
// moves by the residual (halving the step when it does not shrink); false when no output point reaches it.
bool InverseDense(const DenseRemap& r, double x, double y, double* ox, double* oy) {
  const double u = x - 0.5, v = y - 0.5;  // pixel-index position
  const int64_t w = r.width, h = r.height, reach = static_cast<int64_t>(std::ceil(r.max_shift)) + 1;
  // Starting points: the output pixels whose map lands within 3 pixels of the point, nearest first (where the field
  // folds, Newton from the nearest may stall; the next start usually converges).
  std::vector<std::array<double, 3>> starts;
  const int64_t cu = static_cast<int64_t>(std::floor(u)), cv = static_cast<int64_t>(std::floor(v));
  for (int64_t j = std::max<int64_t>(0, cv - reach); j <= std::min(h - 1, cv + reach + 1); ++j)
    for (int64_t i = std::max<int64_t>(0, cu - reach); i <= std::min(w - 1, cu + reach + 1); ++i) {
      const size_t at = static_cast<size_t>(j * w + i);
      const double du = r.map_x[at] - u, dv = r.map_y[at] - v, d = du * du + dv * dv;
      if (d < 9) starts.push_back({d, double(i), double(j)});
    }
  std::sort(starts.begin(), starts.end());
  auto residual = [&](double a, double b, double* ru, double* rv) {
    *ru = u - SampleMap(r.map_x, w, h, a, b), *rv = v - SampleMap(r.map_y, w, h, a, b);
    return *ru * *ru + *rv * *rv;
  };
  for (size_t s = 0; s < std::min<size_t>(starts.size(), 8); ++s) {
    double best = starts[s][0], qu = starts[s][1], qv = starts[s][2];
    // Newton steps with the map's Jacobian (finite differences of the bilinear map), halved until the residual
    // shrinks.
    for (int it = 0; it < 40 && best > 1e-8; ++it) {
      double ru, rv;
      residual(qu, qv, &ru, &rv);
      constexpr double e = 1e-3;
      const double jxx = (SampleMap(r.map_x, w, h, qu + e, qv) - SampleMap(r.map_x, w, h, qu - e, qv)) / (2 * e);
      const double jxy = (SampleMap(r.map_x, w, h, qu, qv + e) - SampleMap(r.map_x, w, h, qu, qv - e)) / (2 * e);
      const double jyx = (SampleMap(r.map_y, w, h, qu + e, qv) - SampleMap(r.map_y, w, h, qu - e, qv)) / (2 * e);
      const double jyy = (SampleMap(r.map_y, w, h, qu, qv + e) - SampleMap(r.map_y, w, h, qu, qv - e)) / (2 * e);
      const double det = jxx * jyy - jxy * jyx;
      double du = ru, dv = rv;  // a flat spot: move by the residual instead
      if (std::fabs(det) > 1e-6) du = (jyy * ru - jxy * rv) / det, dv = (jxx * rv - jyx * ru) / det;
      bool moved = false;
      for (double step = 1; step > 1e-3 && !moved; step *= 0.5) {
        const double nu = std::clamp(qu + step * du, -0.5, double(w) - 0.5);
        const double nv = std::clamp(qv + step * dv, -0.5, double(h) - 0.5);
        double eu, ev;
        const double err = residual(nu, nv, &eu, &ev);
        if (err < best) best = err, qu = nu, qv = nv, moved = true;
      }
      if (!moved) break;
    }
    if (best <= 0.05 * 0.05) {
      *ox = qu + 0.5, *oy = qv + 0.5;
      return true;
    }
  }
  return false;
}

}  // namespace

int64_t RemapObjects(std::vector<Object>& objects, std::vector<double>& keypoints, const SeparableRemap& remap,
                     int64_t w, int64_t h, const BoxFilter& filter) {
  auto span = [&](int64_t c0, int64_t c1, int64_t r0, int64_t r1, std::array<int64_t, 4>* b) {
    return MaskSpan(remap.map_x, c0, c1, &(*b)[0], &(*b)[2]) && MaskSpan(remap.map_y, r0, r1, &(*b)[1], &(*b)[3]);
  };
  auto inverse = [&](double x, double y, double* ox, double* oy) { return InverseRemap(remap, x, y, ox, oy); };
  return RemapObjectsWith(objects, keypoints, w, h, filter, span, inverse);
}

int64_t RemapObjectsDense(std::vector<Object>& objects, std::vector<double>& keypoints, const DenseRemap& remap,
                          const BoxFilter& filter) {
  const int64_t w = remap.width, h = remap.height, reach = static_cast<int64_t>(std::ceil(remap.max_shift)) + 1;
  // The output pixels whose nearest source pixel (cv2.remap INTER_NEAREST) lies in the box's mask, searched within
  // max_shift of the box.
  auto span = [&](int64_t c0, int64_t c1, int64_t r0, int64_t r1, std::array<int64_t, 4>* b) {
    *b = {w, h, -1, -1};
    for (int64_t y = std::max<int64_t>(0, r0 - reach); y <= std::min(h - 1, r1 + reach); ++y)
      for (int64_t x = std::max<int64_t>(0, c0 - reach); x <= std::min(w - 1, c1 + reach); ++x) {
        const size_t at = static_cast<size_t>(y * w + x);
        const int64_t sx = static_cast<int64_t>(std::nearbyint(remap.map_x[at]));
        const int64_t sy = static_cast<int64_t>(std::nearbyint(remap.map_y[at]));
        if (sx < c0 || sx > c1 || sy < r0 || sy > r1) continue;
        *b = {std::min((*b)[0], x), std::min((*b)[1], y), std::max((*b)[2], x), std::max((*b)[3], y)};
      }
    return (*b)[2] >= 0;
  };
  auto inverse = [&](double x, double y, double* ox, double* oy) { return InverseDense(remap, x, y, ox, oy); };
  return RemapObjectsWith(objects, keypoints, w, h, filter, span, inverse);
}

uint64_t Rng::Next() {
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

int64_t Rng::Int(int64_t lo, int64_t hi) {
  if (hi <= lo) return lo;
  const uint64_t span = static_cast<uint64_t>(hi - lo) + 1;
  return lo + static_cast<int64_t>(Next() % span);
}

double Rng::Normal() {
  double u1 = Unit();
  while (u1 <= 0) u1 = Unit();
  const double u2 = Unit();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

uint64_t ItemSeed(uint64_t run_seed, uint64_t item_index, uint64_t copy) {
  Rng r(run_seed ^ 0x6F73707265790000ull);
  uint64_t s = r.Next();
  Rng r2(s ^ (item_index * 0x9E3779B97F4A7C15ull));
  s = r2.Next();
  Rng r3(s ^ (copy * 0xC2B2AE3D27D4EB4Full + 1));
  return r3.Next();
}

std::vector<Object> ReflectedCopies(const std::vector<Object>& objects, const Mat3& forward, double w, double h,
                                    double ow, double oh) {
  std::vector<Object> copies;
  if (objects.empty() || w <= 0 || h <= 0) return copies;
  // The source region the output sees: the preimage of its corners (cells far out are capped: a warp that needs more
  // than four reflections on a side shows them at a size where nothing is left to label).
  constexpr int kMaxCells = 4;
  int c0 = -kMaxCells, c1 = kMaxCells, r0 = -kMaxCells, r1 = kMaxCells;
  const Mat3 inverse = forward.Inverse();
  double x0 = INFINITY, y0 = INFINITY, x1 = -INFINITY, y1 = -INFINITY;
  bool all = true;
  for (const auto& [cx, cy] : {std::pair{0.0, 0.0}, std::pair{ow, 0.0}, std::pair{ow, oh}, std::pair{0.0, oh}}) {
    double x, y;
    if (!inverse.Map(cx, cy, &x, &y)) {
      all = false;
      break;
    }
    x0 = std::min(x0, x), y0 = std::min(y0, y), x1 = std::max(x1, x), y1 = std::max(y1, y);
  }
  if (all) {
    c0 = std::max(c0, static_cast<int>(std::floor(x0 / w))), c1 = std::min(c1, static_cast<int>(std::floor(x1 / w)));
    r0 = std::max(r0, static_cast<int>(std::floor(y0 / h))), r1 = std::min(r1, static_cast<int>(std::floor(y1 / h)));
  }
  // Cell k along an axis of size n: even cells are the image shifted by k * n, odd cells its mirror image.
  auto along = [](double v, int k, double n) { return k % 2 == 0 ? v + k * n : (k + 1) * n - v; };
  for (int r = r0; r <= r1; ++r)
    for (int c = c0; c <= c1; ++c) {
      if (r == 0 && c == 0) continue;
      for (const Object& o : objects) {
        Object copy;
        copy.category = o.category;
        const double ax = along(o.x0, c, w), bx = along(o.x1, c, w), ay = along(o.y0, r, h), by = along(o.y1, r, h);
        copy.x0 = std::min(ax, bx), copy.x1 = std::max(ax, bx), copy.y0 = std::min(ay, by), copy.y1 = std::max(ay, by);
        for (const std::vector<double>& poly : o.polygons) {
          std::vector<double> mirrored(poly.size());
          for (size_t k = 0; k + 1 < poly.size(); k += 2)
            mirrored[k] = along(poly[k], c, w), mirrored[k + 1] = along(poly[k + 1], r, h);
          copy.polygons.push_back(std::move(mirrored));
        }
        copy.extra_json = o.extra_json;
        copies.push_back(std::move(copy));
      }
    }
  return copies;
}

}  // namespace osprey::augment
