// Host-side image work of MotionBlur, CLAHE, RandomShadow and Normalize's per-image modes (filters.h): OpenCV's and
// Albumentations' arithmetic, written for uint8 HWC images.
#include "augment/filters.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <utility>

#include "osprey/error.h"

namespace osprey::augment {
namespace {

void RequireU8Image(const Tensor& img, const char* what, bool rgb_or_gray) {
  if (img.dtype() != DType::kU8 || img.rank() != 3 || (rgb_or_gray && img.dim(2) != 1 && img.dim(2) != 3))
    throw Error(ErrorCode::kInvalidArgument, std::string(what) + ": expected a uint8 [H, W, " +
                                                 (rgb_or_gray ? "1 or 3" : "C") + "] image, found " +
                                                 DTypeName(img.dtype()) + " " + ShapeToString(img.shape()));
}

// BORDER_REFLECT_101 index (gfedcb|abcdefgh|gfedcba), for any offset.
int64_t Reflect101(int64_t i, int64_t n) {
  if (n == 1) return 0;
  const int64_t period = 2 * (n - 1);
  i %= period;
  if (i < 0) i += period;
  return i < n ? i : period - i;
}

// Source index along one axis under an OpenCV border code (0 constant, 1 replicate, 2 reflect, 4 reflect_101) for
// any offset; -1: the constant fill.
int64_t BorderIndex(int64_t i, int64_t n, int border) {
  if (i >= 0 && i < n) return i;
  switch (border) {
    case 1:
      return std::clamp<int64_t>(i, 0, n - 1);
    case 2: {  // fedcba|abcdef|fedcba
      const int64_t period = 2 * n;
      int64_t k = i % period;
      if (k < 0) k += period;
      return k < n ? k : period - 1 - k;
    }
    case 4:
      return Reflect101(i, n);
    default:
      return -1;
  }
}


uint8_t SaturateRound(float v) {
  const float r = std::nearbyint(v);  // ties to even, as cvRound
  return static_cast<uint8_t>(std::clamp(r, 0.0f, 255.0f));
}

// ---------------------------------------------------------------- sRGB <-> CIE L*a*b* (D65), OpenCV's formulas
constexpr double kXn = 0.950456, kZn = 1.088754;

double SrgbToLinear(double v) { return v <= 0.04045 ? v / 12.92 : std::pow((v + 0.055) / 1.055, 2.4); }
double LinearToSrgb(double v) { return v <= 0.0031308 ? 12.92 * v : 1.055 * std::pow(v, 1 / 2.4) - 0.055; }

// uint8 RGB -> uint8 L, a, b (L scaled by 255/100, a and b offset by 128), as cv2.COLOR_RGB2LAB on uint8: OpenCV's
// fixed-point path (gamma table with 3 fractional bits, XYZ coefficients with 12, a cube-root table with 15), so L is
// bit-exact — CLAHE's steep tables would turn a 1-level difference in L into several.
struct LabTables {
  std::array<int64_t, 256> gamma;
  std::vector<int64_t> cbrt;
  std::array<int64_t, 9> coeffs;
  LabTables() : cbrt(256 * 3 / 2 * 8) {
    for (int i = 0; i < 256; ++i) {
      const float x = static_cast<float>(i) / 255.0f;
      const float g = static_cast<float>(SrgbToLinear(x));
      gamma[i] = std::clamp<int64_t>(static_cast<int64_t>(std::nearbyint(255.0f * 8.0f * g)), 0, 65535);
    }
    for (size_t i = 0; i < cbrt.size(); ++i) {
      const double x = static_cast<double>(i) * (1.0 / (255.0 * 8));
      cbrt[i] = static_cast<int64_t>(
          std::nearbyint(32768.0 * (x < 0.008856 ? x * 7.787 + 0.13793103448275862 : std::cbrt(x))));
    }
    const double m[9] = {0.412453, 0.357580, 0.180423, 0.212671, 0.715160, 0.072169, 0.019334, 0.119193, 0.950227};
    const double white[3] = {kXn, 1.0, kZn};
    for (int k = 0; k < 9; ++k) coeffs[k] = static_cast<int64_t>(std::nearbyint(4096.0 * m[k] / white[k / 3]));
  }
};

void RgbToLab8(const uint8_t* rgb, uint8_t* lab) {
  static const LabTables t;
  auto descale = [](int64_t x, int n) { return (x + (int64_t{1} << (n - 1))) >> n; };
  const int64_t r = t.gamma[rgb[0]], g = t.gamma[rgb[1]], b = t.gamma[rgb[2]];
  const int64_t fx = t.cbrt[descale(r * t.coeffs[0] + g * t.coeffs[1] + b * t.coeffs[2], 12)];
  const int64_t fy = t.cbrt[descale(r * t.coeffs[3] + g * t.coeffs[4] + b * t.coeffs[5], 12)];
  const int64_t fz = t.cbrt[descale(r * t.coeffs[6] + g * t.coeffs[7] + b * t.coeffs[8], 12)];
  constexpr int64_t kLScale = (116 * 255 + 50) / 100, kLShift = -((16 * 255 * (int64_t{1} << 15) + 50) / 100);
  lab[0] = static_cast<uint8_t>(std::clamp<int64_t>(descale(kLScale * fy + kLShift, 15), 0, 255));
  lab[1] = static_cast<uint8_t>(std::clamp<int64_t>(descale(500 * (fx - fy) + 128 * (int64_t{1} << 15), 15), 0, 255));
  lab[2] = static_cast<uint8_t>(std::clamp<int64_t>(descale(200 * (fy - fz) + 128 * (int64_t{1} << 15), 15), 0, 255));
}

void LabToRgb8(const uint8_t* lab, uint8_t* rgb) {
  const double l = lab[0] * 100.0 / 255.0, a = lab[1] - 128.0, b = lab[2] - 128.0;
  double y, fy;
  if (l <= 8.0) {
    y = l / 903.3;
    fy = 7.787 * y + 16.0 / 116.0;
  } else {
    fy = (l + 16.0) / 116.0;
    y = fy * fy * fy;
  }
  auto inv = [](double f) { return f > 0.206893 ? f * f * f : (f - 16.0 / 116.0) / 7.787; };
  const double x = inv(a / 500.0 + fy) * kXn, z = inv(fy - b / 200.0) * kZn;
  const double lin[3] = {3.240479 * x - 1.53715 * y - 0.498535 * z, -0.969256 * x + 1.875991 * y + 0.041556 * z,
                         0.055648 * x - 0.204043 * y + 1.057311 * z};
  for (int c = 0; c < 3; ++c)
    rgb[c] = SaturateRound(static_cast<float>(LinearToSrgb(std::clamp(lin[c], 0.0, 1.0)) * 255.0));
}

// cv::CLAHE_Impl::apply for one uint8 plane (stride 1).
void ClahePlane(const uint8_t* src, uint8_t* dst, int64_t h, int64_t w, double clip_limit, int64_t tiles_x,
                int64_t tiles_y) {
  // OpenCV pads the image (BORDER_REFLECT_101) to build the histograms when either side is not a multiple of the grid,
  // then by tiles - side % tiles on both axes (a whole extra tile on an axis that was a multiple), and interpolates
  // over the unpadded image with the padded tile size.
  const bool pad = w % tiles_x != 0 || h % tiles_y != 0;
  const int64_t tile_w = pad ? (w + tiles_x - w % tiles_x) / tiles_x : w / tiles_x;
  const int64_t tile_h = pad ? (h + tiles_y - h % tiles_y) / tiles_y : h / tiles_y;
  const int64_t tile_area = tile_w * tile_h;
  const float lut_scale = 255.0f / static_cast<float>(tile_area);
  int64_t limit = 0;
  if (clip_limit > 0) limit = std::max<int64_t>(1, static_cast<int64_t>(clip_limit * tile_area / 256));
  std::vector<uint8_t> luts(static_cast<size_t>(tiles_x * tiles_y * 256));
  std::vector<int64_t> hist(256);
  for (int64_t ty = 0; ty < tiles_y; ++ty)
    for (int64_t tx = 0; tx < tiles_x; ++tx) {
      std::fill(hist.begin(), hist.end(), 0);
      for (int64_t y = ty * tile_h; y < (ty + 1) * tile_h; ++y) {
        const uint8_t* row = src + Reflect101(y, h) * w;
        for (int64_t x = tx * tile_w; x < (tx + 1) * tile_w; ++x) ++hist[row[x < w ? x : Reflect101(x, w)]];
      }
      if (limit > 0) {
        int64_t clipped = 0;
        for (int64_t& v : hist)
          if (v > limit) clipped += v - limit, v = limit;
        const int64_t batch = clipped / 256;
        int64_t residual = clipped - batch * 256;
        for (int64_t& v : hist) v += batch;
        if (residual != 0) {
          const int64_t step = std::max<int64_t>(256 / residual, 1);
          for (int64_t i = 0; i < 256 && residual > 0; i += step, --residual) ++hist[i];
        }
      }
      uint8_t* lut = &luts[static_cast<size_t>((ty * tiles_x + tx) * 256)];
      int64_t sum = 0;
      for (int i = 0; i < 256; ++i) {
        sum += hist[i];
        lut[i] = SaturateRound(static_cast<float>(sum) * lut_scale);
      }
    }
  const float inv_tw = 1.0f / static_cast<float>(tile_w), inv_th = 1.0f / static_cast<float>(tile_h);
  std::vector<int64_t> x1(w), x2(w);
  std::vector<float> xa(w);
  for (int64_t x = 0; x < w; ++x) {
    const float txf = static_cast<float>(x) * inv_tw - 0.5f;
    const int64_t t1 = static_cast<int64_t>(std::floor(txf));
    xa[x] = txf - static_cast<float>(t1);
    x1[x] = std::max<int64_t>(t1, 0) * 256;
    x2[x] = std::min<int64_t>(t1 + 1, tiles_x - 1) * 256;
  }
  for (int64_t y = 0; y < h; ++y) {
    const float tyf = static_cast<float>(y) * inv_th - 0.5f;
    const int64_t t1 = static_cast<int64_t>(std::floor(tyf));
    const float ya = tyf - static_cast<float>(t1), ya1 = 1.0f - ya;
    const uint8_t* lut1 = &luts[static_cast<size_t>(std::max<int64_t>(t1, 0) * tiles_x * 256)];
    const uint8_t* lut2 = &luts[static_cast<size_t>(std::min<int64_t>(t1 + 1, tiles_y - 1) * tiles_x * 256)];
    for (int64_t x = 0; x < w; ++x) {
      const int v = src[y * w + x];
      const float xa1 = 1.0f - xa[x];
      const float res = (lut1[x1[x] + v] * xa1 + lut1[x2[x] + v] * xa[x]) * ya1 +
                        (lut2[x1[x] + v] * xa1 + lut2[x2[x] + v] * xa[x]) * ya;
      dst[y * w + x] = SaturateRound(res);
    }
  }
}

}  // namespace

Tensor CorrelateSparse(const Tensor& img, const std::vector<Tap>& taps) {
  RequireU8Image(img, "MotionBlur", false);
  const int64_t h = img.dim(0), w = img.dim(1), c = img.dim(2);
  Tensor out(DType::kU8, img.shape());
  const uint8_t* src = img.data<uint8_t>();
  uint8_t* dst = out.data<uint8_t>();
  std::vector<float> acc(static_cast<size_t>(w * c));
  for (int64_t y = 0; y < h; ++y) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (const Tap& t : taps) {
      const uint8_t* row = src + Reflect101(y + t.dy, h) * w * c;
      // Columns whose source x + dx is inside the image read directly; only the edges reflect.
      const int64_t x0 = std::clamp<int64_t>(-t.dx, 0, w), x1 = std::clamp<int64_t>(w - t.dx, x0, w);
      for (int64_t x = 0; x < w; ++x) {
        if (x == x0 && x1 > x0) {
          const uint8_t* p = row + (x0 + t.dx) * c;
          float* a = &acc[x0 * c];
          for (int64_t i = 0; i < (x1 - x0) * c; ++i) a[i] += t.weight * p[i];
          x = x1 - 1;
          continue;
        }
        const uint8_t* p = row + Reflect101(x + t.dx, w) * c;
        for (int64_t k = 0; k < c; ++k) acc[x * c + k] += t.weight * p[k];
      }
    }
    for (int64_t i = 0; i < w * c; ++i) dst[y * w * c + i] = SaturateRound(acc[i]);
  }
  return out;
}

std::vector<Tap> MotionKernel(int64_t size, double angle_deg, double direction, double shift_x, double shift_y,
                              bool rule_v2) {
  direction = std::clamp(direction, -1.0, 1.0);
  const int64_t center = size / 2, half = size / 2;
  const double rad = angle_deg * M_PI / 180.0, dx = std::cos(rad), dy = std::sin(rad);
  double t0 = -double(half), t1 = double(half);
  int64_t points = size;
  if (rule_v2) {
    if (direction < 0) t1 = half * (1 + direction);
    if (direction > 0) t0 = -half * (1 - direction);
  } else {
    points = 2 * size;
  }
  std::set<std::pair<int64_t, int64_t>> cells;  // (row, col), unique as np.unique
  for (int64_t i = 0; i < points; ++i) {
    // np.linspace(t0, t1, points)
    double t = points == 1 ? t0 : (i == points - 1 ? t1 : t0 + (t1 - t0) * double(i) / double(points - 1));
    if (!rule_v2 && direction != 0) t = t * (1 + std::fabs(direction)) * (direction < 0 ? -1 : 1);
    const double x = double(center) + dx * t + shift_x, y = double(center) + dy * t + shift_y;
    // np.round: ties to even.
    const int64_t col = std::clamp<int64_t>(static_cast<int64_t>(std::nearbyint(x)), 0, size - 1);
    const int64_t row = std::clamp<int64_t>(static_cast<int64_t>(std::nearbyint(y)), 0, size - 1);
    cells.insert({row, col});
  }
  std::vector<Tap> taps;
  const float weight = 1.0f / static_cast<float>(cells.size());
  for (const auto& [row, col] : cells)
    taps.push_back(Tap{static_cast<int>(row - center), static_cast<int>(col - center), weight});
  return taps;
}

Tensor Clahe(const Tensor& img, double clip_limit, int64_t tiles_x, int64_t tiles_y) {
  RequireU8Image(img, "CLAHE", true);
  const int64_t h = img.dim(0), w = img.dim(1), c = img.dim(2);
  Tensor out(DType::kU8, img.shape());
  if (c == 1) {
    ClahePlane(img.data<uint8_t>(), out.data<uint8_t>(), h, w, clip_limit, tiles_x, tiles_y);
    return out;
  }
  const uint8_t* src = img.data<uint8_t>();
  std::vector<uint8_t> lab(static_cast<size_t>(h * w * 3)), l(static_cast<size_t>(h * w)), l2(l.size());
  for (int64_t i = 0; i < h * w; ++i) {
    RgbToLab8(src + 3 * i, &lab[3 * i]);
    l[i] = lab[3 * i];
  }
  ClahePlane(l.data(), l2.data(), h, w, clip_limit, tiles_x, tiles_y);
  uint8_t* dst = out.data<uint8_t>();
  for (int64_t i = 0; i < h * w; ++i) {
    lab[3 * i] = l2[i];
    LabToRgb8(&lab[3 * i], dst + 3 * i);
  }
  return out;
}

Tensor BrightnessContrastAboutMean(const Tensor& img, double brightness, double contrast) {
  RequireU8Image(img, "RandomBrightnessContrast", false);
  const int64_t pixels = img.dim(0) * img.dim(1), c = img.dim(2);
  const uint8_t* src = img.data<uint8_t>();
  double mu = 0;  // grey levels
  if (contrast != 1 && pixels > 0) {
    int64_t sum = 0;
    if (c == 3) {
      for (int64_t i = 0; i < pixels; ++i)  // cv2.cvtColor(RGB2GRAY)'s fixed point
        sum += (src[3 * i] * 4899 + src[3 * i + 1] * 9617 + src[3 * i + 2] * 1868 + 8192) >> 14;
      mu = static_cast<double>(sum) / static_cast<double>(pixels);
    } else {
      for (int64_t i = 0; i < pixels * c; ++i) sum += src[i];
      mu = static_cast<double>(sum) / static_cast<double>(pixels * c);
    }
  }
  // In float32, as NumPy builds AlbumentationsX's table (float32 range times a Python float stays float32), and
  // without a fused multiply-add (volatile): 90 * 1.3f is 116.99999, kept as 116 there.
  auto clip = [](float v) { return std::clamp(v, 0.f, 255.f); };
  const float cf = static_cast<float>(contrast), bf = static_cast<float>(brightness);
  const float offset = static_cast<float>(mu * (1 - contrast));
  std::array<uint8_t, 256> lut{};
  for (int x = 0; x < 256; ++x) {
    float y = static_cast<float>(x);
    if (contrast == 0 && brightness == 1) {
      y = std::floor(static_cast<float>(mu) + 0.5f);
    } else if (contrast != 1) {
      volatile float scaled = y * cf;
      y = std::floor(clip(scaled + offset));
    }
    volatile float brightened = y * bf;
    lut[static_cast<size_t>(x)] = static_cast<uint8_t>(clip(brightened));
  }
  Tensor out(DType::kU8, img.shape());
  uint8_t* dst = out.data<uint8_t>();
  for (int64_t i = 0; i < pixels * c; ++i) dst[i] = lut[src[i]];
  return out;
}

Tensor AddShadows(const Tensor& img, const std::vector<std::vector<std::array<int64_t, 2>>>& polygons,
                  const std::vector<double>& intensities) {
  RequireU8Image(img, "RandomShadow", false);
  const int64_t h = img.dim(0), w = img.dim(1), c = img.dim(2);
  Tensor out(DType::kU8, img.shape());
  std::memcpy(out.data<uint8_t>(), img.data<uint8_t>(), static_cast<size_t>(h * w * c));
  uint8_t* px = out.data<uint8_t>();
  std::vector<double> xs;
  for (size_t p = 0; p < polygons.size(); ++p) {
    const auto& poly = polygons[p];
    const double darkness = 1 - intensities[p];
    int64_t ymin = h, ymax = -1;
    for (const auto& v : poly) ymin = std::min(ymin, v[1]), ymax = std::max(ymax, v[1]);
    ymin = std::max<int64_t>(ymin, 0), ymax = std::min(ymax, h - 1);
    // Scanline fill at pixel centres (OpenCV's coordinates: pixel (x, y) is at integer x, y), even-odd between edge
    // crossings, both ends inclusive; horizontal edges fill their own row.
    for (int64_t y = ymin; y <= ymax; ++y) {
      xs.clear();
      std::vector<std::pair<int64_t, int64_t>> spans;
      for (size_t i = 0; i < poly.size(); ++i) {
        const auto& a = poly[i];
        const auto& b = poly[(i + 1) % poly.size()];
        if (a[1] == b[1]) {
          if (a[1] == y) spans.push_back({std::min(a[0], b[0]), std::max(a[0], b[0])});
          continue;
        }
        const auto& lo = a[1] < b[1] ? a : b;
        const auto& hi = a[1] < b[1] ? b : a;
        if (y < lo[1] || y >= hi[1]) {
          if (y == hi[1] && y == ymax) spans.push_back({hi[0], hi[0]});  // the bottom vertex itself
          continue;
        }
        xs.push_back(double(lo[0]) + double(hi[0] - lo[0]) * double(y - lo[1]) / double(hi[1] - lo[1]));
      }
      std::sort(xs.begin(), xs.end());
      for (size_t i = 0; i + 1 < xs.size(); i += 2)
        spans.push_back(
            {static_cast<int64_t>(std::ceil(xs[i] - 1e-9)), static_cast<int64_t>(std::floor(xs[i + 1] + 1e-9))});
      std::vector<bool> done;
      for (const auto& [x0, x1] : spans) {
        for (int64_t x = std::max<int64_t>(x0, 0); x <= std::min(x1, w - 1); ++x) {
          uint8_t* q = px + (y * w + x) * c;
          if (done.empty()) done.assign(static_cast<size_t>(w), false);
          if (done[x]) continue;
          done[x] = true;
          for (int64_t k = 0; k < c; ++k) q[k] = static_cast<uint8_t>(std::min(255.0, q[k] * darkness));
        }
      }
    }
  }
  return out;
}

Tensor RemapSeparable(const Tensor& img, const SeparableRemap& remap, int interpolation) {
  RequireU8Image(img, "GridDistortion", false);
  const int64_t h = img.dim(0), w = img.dim(1), c = img.dim(2);
  if (static_cast<int64_t>(remap.map_x.size()) != w || static_cast<int64_t>(remap.map_y.size()) != h)
    throw Error(ErrorCode::kInvalidArgument, "GridDistortion: the field is " + std::to_string(remap.map_x.size()) +
                                                 "x" + std::to_string(remap.map_y.size()) + ", the image " +
                                                 std::to_string(w) + "x" + std::to_string(h));
  Tensor out(DType::kU8, img.shape());
  const uint8_t* src = img.data<uint8_t>();
  uint8_t* dst = out.data<uint8_t>();
  const uint8_t fill = static_cast<uint8_t>(std::clamp(std::nearbyint(remap.fill), 0.0, 255.0));
  // Source index along one axis under the border mode; -1: the constant fill.
  auto border = [&](int64_t i, int64_t n) { return BorderIndex(i, n, remap.border); };
  // Per axis: the two source indices and the weight of the second, on OpenCV's 1/32 pixel grid.
  struct Axis {
    int64_t i0, i1;
    float frac;
  };
  auto axis = [&](const std::vector<float>& map, int64_t n) {
    std::vector<Axis> a(map.size());
    for (size_t k = 0; k < map.size(); ++k) {
      if (interpolation == 0) {
        const int64_t i = border(static_cast<int64_t>(std::nearbyint(map[k])), n);
        a[k] = {i, i, 0.0f};
        continue;
      }
      const int64_t fixed = static_cast<int64_t>(std::nearbyint(double(map[k]) * 32));
      const int64_t i = fixed >> 5;  // floor for negatives too
      a[k] = {border(i, n), border(i + 1, n), static_cast<float>(fixed & 31) / 32.0f};
    }
    return a;
  };
  const std::vector<Axis> ax = axis(remap.map_x, w), ay = axis(remap.map_y, h);
  for (int64_t y = 0; y < h; ++y) {
    const Axis& r = ay[y];
    for (int64_t x = 0; x < w; ++x) {
      const Axis& q = ax[x];
      for (int64_t k = 0; k < c; ++k) {
        auto at = [&](int64_t yy, int64_t xx) -> float {
          return yy < 0 || xx < 0 ? float(fill) : float(src[(yy * w + xx) * c + k]);
        };
        const float top = at(r.i0, q.i0) * (1 - q.frac) + at(r.i0, q.i1) * q.frac;
        const float bottom = at(r.i1, q.i0) * (1 - q.frac) + at(r.i1, q.i1) * q.frac;
        dst[(y * w + x) * c + k] = SaturateRound(top * (1 - r.frac) + bottom * r.frac);
      }
    }
  }
  return out;
}

Tensor NormalizePerImage(const Tensor& img, const std::string& mode) {
  RequireU8Image(img, "Normalize", false);
  const int64_t h = img.dim(0), w = img.dim(1), c = img.dim(2), n = h * w;
  const bool per_channel = (mode == "image_per_channel" || mode == "min_max_per_channel") && c > 1;
  const bool min_max = mode == "min_max" || mode == "min_max_per_channel";
  if (!min_max && mode != "image" && mode != "image_per_channel")
    throw Error(ErrorCode::kInvalidArgument, "Normalize: unknown normalization \"" + mode + "\"");
  const uint8_t* src = img.data<uint8_t>();
  const int64_t groups = per_channel ? c : 1;
  std::vector<double> offset(static_cast<size_t>(groups)), scale(static_cast<size_t>(groups));
  constexpr double kEps = 1e-4;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t k0 = per_channel ? g : 0, k1 = per_channel ? g + 1 : c;
    double sum = 0, sum2 = 0, lo = 255, hi = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = k0; k < k1; ++k) {
        const double v = src[i * c + k];
        sum += v, sum2 += v * v, lo = std::min(lo, v), hi = std::max(hi, v);
      }
    const double count = double(n * (k1 - k0)), mean = sum / count;
    if (min_max) {
      offset[g] = lo, scale[g] = 1 / (hi - lo + kEps);
    } else {
      offset[g] = mean, scale[g] = 1 / (std::sqrt(std::max(0.0, sum2 / count - mean * mean)) + kEps);
    }
  }
  Tensor out(DType::kF32, img.shape());
  float* dst = out.data<float>();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < c; ++k) {
      const int64_t g = per_channel ? k : 0;
      dst[i * c + k] = static_cast<float>(std::clamp((src[i * c + k] - offset[g]) * scale[g], -20.0, 20.0));
    }
  return out;
}


Tensor RemapDense(const Tensor& img, const DenseRemap& remap, int interpolation) {
  RequireU8Image(img, "ElasticTransform", false);
  const int64_t h = img.dim(0), w = img.dim(1), c = img.dim(2);
  if (remap.width != w || remap.height != h || static_cast<int64_t>(remap.map_x.size()) != w * h ||
      static_cast<int64_t>(remap.map_y.size()) != w * h)
    throw Error(ErrorCode::kInvalidArgument, "ElasticTransform: the field is " + std::to_string(remap.width) + "x" +
                                                 std::to_string(remap.height) + ", the image " + std::to_string(w) +
                                                 "x" + std::to_string(h));
  Tensor out(DType::kU8, img.shape());
  const uint8_t* src = img.data<uint8_t>();
  uint8_t* dst = out.data<uint8_t>();
  const float fill = static_cast<float>(std::clamp(std::nearbyint(remap.fill), 0.0, 255.0));
  const int border = remap.border;
  for (int64_t y = 0; y < h; ++y) {
    for (int64_t x = 0; x < w; ++x) {
      const size_t at = static_cast<size_t>(y * w + x);
      uint8_t* q = dst + at * c;
      if (interpolation == 0) {
        const int64_t sx = BorderIndex(static_cast<int64_t>(std::nearbyint(remap.map_x[at])), w, border);
        const int64_t sy = BorderIndex(static_cast<int64_t>(std::nearbyint(remap.map_y[at])), h, border);
        for (int64_t k = 0; k < c; ++k)
          q[k] = sx < 0 || sy < 0 ? static_cast<uint8_t>(fill) : src[(sy * w + sx) * c + k];
        continue;
      }
      // OpenCV's 1/32 pixel grid for the source position; weights in floating point (within 1 of OpenCV).
      const int64_t fx = static_cast<int64_t>(std::nearbyint(double(remap.map_x[at]) * 32));
      const int64_t fy = static_cast<int64_t>(std::nearbyint(double(remap.map_y[at]) * 32));
      const int64_t ix = fx >> 5, iy = fy >> 5;  // floor for negatives too
      const float ax = static_cast<float>(fx & 31) / 32.0f, ay = static_cast<float>(fy & 31) / 32.0f;
      const int64_t x0 = BorderIndex(ix, w, border), x1 = BorderIndex(ix + 1, w, border);
      const int64_t y0 = BorderIndex(iy, h, border), y1 = BorderIndex(iy + 1, h, border);
      for (int64_t k = 0; k < c; ++k) {
        auto at_px = [&](int64_t yy, int64_t xx) -> float {
          return yy < 0 || xx < 0 ? fill : float(src[(yy * w + xx) * c + k]);
        };
        const float top = at_px(y0, x0) * (1 - ax) + at_px(y0, x1) * ax;
        const float bottom = at_px(y1, x0) * (1 - ax) + at_px(y1, x1) * ax;
        q[k] = SaturateRound(top * (1 - ay) + bottom * ay);
      }
    }
  }
  return out;
}

std::vector<double> GaussianKernel(int64_t size, double sigma) {
  std::vector<double> k(static_cast<size_t>(size));
  const double scale = -0.5 / (sigma * sigma);
  double sum = 0;
  for (int64_t i = 0; i < size; ++i) {
    const double x = double(i) - double(size - 1) * 0.5;
    k[i] = std::exp(scale * x * x);
    sum += k[i];
  }
  for (double& v : k) v /= sum;
  return k;
}

void BlurPlane(std::vector<float>& plane, int64_t rows, int64_t cols, const std::vector<double>& kernel, int border) {
  const int64_t size = static_cast<int64_t>(kernel.size()), r = size / 2;
  std::vector<float> k(kernel.begin(), kernel.end());
  // Rows: each row padded by r on both sides, then out[x] = sum_t k[t] * padded[x + t] (t outer: vectorises over x).
  std::vector<float> padded(static_cast<size_t>(cols + 2 * r)), acc(static_cast<size_t>(cols));
  for (int64_t y = 0; y < rows; ++y) {
    float* row = plane.data() + y * cols;
    for (int64_t i = 0; i < cols + 2 * r; ++i) padded[i] = row[BorderIndex(i - r, cols, border)];
    // The kernel is symmetric: taps t and size - 1 - t share a weight.
    {
      const float kc = k[r];
      const float* p = padded.data() + r;
      for (int64_t x = 0; x < cols; ++x) acc[x] = kc * p[x];
    }
    for (int64_t t = 0; t < r; ++t) {
      const float kt = k[t];
      const float *p = padded.data() + t, *q = padded.data() + size - 1 - t;
      float* a = acc.data();
      for (int64_t x = 0; x < cols; ++x) a[x] += kt * (p[x] + q[x]);
    }
    std::copy(acc.begin(), acc.end(), row);
  }
  // Columns: out row y = sum_t k[t] * row(border(y + t - r)).
  std::vector<float> out(plane.size());
  for (int64_t y = 0; y < rows; ++y) {
    float* a = out.data() + y * cols;
    {
      const float kc = k[r];
      const float* p = plane.data() + y * cols;
      for (int64_t x = 0; x < cols; ++x) a[x] = kc * p[x];
    }
    for (int64_t t = 0; t < r; ++t) {
      const float kt = k[t];
      const float* p = plane.data() + BorderIndex(y + t - r, rows, border) * cols;
      const float* q = plane.data() + BorderIndex(y + r - t, rows, border) * cols;
      for (int64_t x = 0; x < cols; ++x) a[x] += kt * (p[x] + q[x]);
    }
  }
  plane.swap(out);
}

}  // namespace osprey::augment
