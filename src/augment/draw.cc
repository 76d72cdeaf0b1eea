// Preview drawing for `osprey augment --preview`: object outlines on a copy of the image and a contact sheet of
// several images. Plain loops, no engine graph: previews are small and their pixels are not part of any contract
// beyond the box outline rule in DrawObjects (tested).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "osprey/dataset.h"

namespace osprey::augment {

namespace {

struct Rgb {
  uint8_t r, g, b;
};

// Bright, mutually distinct colours (Tableau 10 plus lighter variants); every one is far from black so outlines show
// on dark images and a blank image changes on every drawn pixel.
constexpr Rgb kPalette[] = {
    {31, 119, 180},  {255, 127, 14},  {44, 160, 44},   {214, 39, 40},   {148, 103, 189},
    {140, 86, 75},   {227, 119, 194}, {127, 127, 127}, {188, 189, 34},  {23, 190, 207},
    {174, 199, 232}, {255, 187, 120}, {152, 223, 138}, {255, 152, 150}, {197, 176, 213},
    {196, 156, 148}, {247, 182, 210}, {199, 199, 199}, {219, 219, 141}, {158, 218, 229},
};
constexpr int64_t kPaletteSize = static_cast<int64_t>(sizeof(kPalette) / sizeof(kPalette[0]));

Rgb PaletteColor(int64_t index) {
  int64_t i = index % kPaletteSize;
  if (i < 0) i += kPaletteSize;
  return kPalette[i];
}

void CheckImage(const Tensor& image, const char* what) {
  if (image.dtype() != DType::kU8 || image.rank() != 3 || (image.dim(2) != 1 && image.dim(2) != 3))
    throw Error(ErrorCode::kInvalidArgument, std::string(what) + ": expected a uint8 image [H, W, C] with C = 1 or 3, got " +
                                                 DTypeName(image.dtype()) + " " + ShapeToString(image.shape()));
}

class Canvas {
 public:
  explicit Canvas(Tensor& image)
      : data_(image.data<uint8_t>()), height_(image.dim(0)), width_(image.dim(1)), channels_(image.dim(2)) {}
  int64_t width() const { return width_; }
  int64_t height() const { return height_; }

  void Set(int64_t x, int64_t y, Rgb color) {
    if (x < 0 || y < 0 || x >= width_ || y >= height_) return;
    uint8_t* p = data_ + (y * width_ + x) * channels_;
    if (channels_ == 1) {
      p[0] = static_cast<uint8_t>(std::lround(0.299 * color.r + 0.587 * color.g + 0.114 * color.b));
    } else {
      p[0] = color.r;
      p[1] = color.g;
      p[2] = color.b;
    }
  }

  // A segment between two points in continuous coordinates, one pixel wide. The segment is first clipped to a margin
  // around the image so a far-away vertex costs nothing.
  void Line(double x0, double y0, double x1, double y1, Rgb color) {
    double t0 = 0, t1 = 1;
    const double dx = x1 - x0, dy = y1 - y0;
    const double p[4] = {-dx, dx, -dy, dy};
    const double q[4] = {x0 + 1, static_cast<double>(width_) + 1 - x0, y0 + 1, static_cast<double>(height_) + 1 - y0};
    for (int i = 0; i < 4; ++i) {  // Liang-Barsky
      if (p[i] == 0) {
        if (q[i] < 0) return;
        continue;
      }
      const double t = q[i] / p[i];
      if (p[i] < 0) t0 = std::max(t0, t);
      else t1 = std::min(t1, t);
    }
    if (t0 > t1) return;
    const double ax = x0 + t0 * dx, ay = y0 + t0 * dy, bx = x0 + t1 * dx, by = y0 + t1 * dy;
    const int64_t steps = static_cast<int64_t>(std::ceil(std::max(std::fabs(bx - ax), std::fabs(by - ay)))) + 1;
    for (int64_t s = 0; s <= steps; ++s) {
      const double t = static_cast<double>(s) / static_cast<double>(steps);
      Set(static_cast<int64_t>(std::floor(ax + t * (bx - ax))), static_cast<int64_t>(std::floor(ay + t * (by - ay))),
          color);
    }
  }

 private:
  uint8_t* data_;
  int64_t height_, width_, channels_;
};

bool Finite(const Object& o) {
  return std::isfinite(o.x0) && std::isfinite(o.y0) && std::isfinite(o.x1) && std::isfinite(o.y1);
}

// Pixel index of a box edge: the box [x0, x1] covers pixels round(x0) .. round(x1) - 1. Clamped first so that huge
// coordinates cannot overflow; a clamped edge lies outside the image and is not drawn.
int64_t EdgePixel(double v, int64_t size) {
  return static_cast<int64_t>(std::floor(std::clamp(v, -8.0, static_cast<double>(size) + 8.0) + 0.5));
}

}  // namespace

Tensor DrawObjects(const Tensor& image, const std::vector<Object>& objects) {
  CheckImage(image, "DrawObjects");
  Tensor out = image.Clone();
  Canvas canvas(out);
  for (const Object& o : objects) {
    if (!Finite(o)) continue;
    const Rgb color = PaletteColor(o.category);
    // Box: a 2-pixel ring lying inside the box's pixels.
    const int64_t left = EdgePixel(std::min(o.x0, o.x1), canvas.width());
    const int64_t top = EdgePixel(std::min(o.y0, o.y1), canvas.height());
    const int64_t right = std::max(left, EdgePixel(std::max(o.x0, o.x1), canvas.width()) - 1);
    const int64_t bottom = std::max(top, EdgePixel(std::max(o.y0, o.y1), canvas.height()) - 1);
    for (int64_t y = std::max<int64_t>(top, 0); y <= std::min(bottom, canvas.height() - 1); ++y) {
      const bool edge_row = y < top + 2 || y > bottom - 2;
      for (int64_t x = std::max<int64_t>(left, 0); x <= std::min(right, canvas.width() - 1); ++x) {
        if (edge_row || x < left + 2 || x > right - 2) canvas.Set(x, y, color);
      }
    }
    for (const auto& polygon : o.polygons) {
      const size_t n = polygon.size() / 2;
      if (n < 2) continue;
      for (size_t i = 0; i < n; ++i) {
        const size_t j = (i + 1) % n;
        if (!std::isfinite(polygon[2 * i]) || !std::isfinite(polygon[2 * i + 1]) || !std::isfinite(polygon[2 * j]) ||
            !std::isfinite(polygon[2 * j + 1]))
          continue;
        canvas.Line(polygon[2 * i], polygon[2 * i + 1], polygon[2 * j], polygon[2 * j + 1], color);
      }
    }
    // Keypoints: 3x3 dots, coloured by keypoint index so left / right parts can be told apart.
    for (size_t k = 0; k + 2 < o.keypoints.size(); k += 3) {
      const double x = o.keypoints[k], y = o.keypoints[k + 1], v = o.keypoints[k + 2];
      if (!(v > 0) || !std::isfinite(x) || !std::isfinite(y)) continue;
      const int64_t cx = EdgePixel(x - 0.5, canvas.width()), cy = EdgePixel(y - 0.5, canvas.height());
      for (int64_t dy = -1; dy <= 1; ++dy)
        for (int64_t dx = -1; dx <= 1; ++dx) canvas.Set(cx + dx, cy + dy, PaletteColor(static_cast<int64_t>(k / 3)));
    }
  }
  return out;
}

Tensor ContactSheet(const std::vector<Tensor>& images, int64_t cell) {
  if (images.empty()) throw Error(ErrorCode::kInvalidArgument, "ContactSheet: no images given");
  if (cell <= 0 || cell > 16384)
    throw Error(ErrorCode::kInvalidArgument, "ContactSheet: cell size must be 1..16384, got " + std::to_string(cell));
  for (const Tensor& image : images) {
    CheckImage(image, "ContactSheet");
    if (image.dim(0) == 0 || image.dim(1) == 0)
      throw Error(ErrorCode::kInvalidArgument, "ContactSheet: empty image " + ShapeToString(image.shape()));
  }
  const int64_t n = static_cast<int64_t>(images.size());
  int64_t cols = static_cast<int64_t>(std::ceil(std::sqrt(static_cast<double>(n))));
  while (cols * cols < n) ++cols;  // guard against sqrt rounding down
  while (cols > 1 && (cols - 1) * (cols - 1) >= n) --cols;
  const int64_t rows = (n + cols - 1) / cols;
  // Dark gray background so cell borders and letterboxing are visible.
  constexpr uint8_t kBackground = 32;
  Tensor sheet(DType::kU8, {rows * cell, cols * cell, 3});
  std::fill_n(sheet.data<uint8_t>(), sheet.numel(), kBackground);
  uint8_t* dst = sheet.data<uint8_t>();
  const int64_t sheet_width = cols * cell;
  for (int64_t i = 0; i < n; ++i) {
    const Tensor& image = images[i];
    const int64_t h = image.dim(0), w = image.dim(1), c = image.dim(2);
    const double scale = std::min(static_cast<double>(cell) / w, static_cast<double>(cell) / h);
    const int64_t out_w = std::clamp<int64_t>(std::llround(w * scale), 1, cell);
    const int64_t out_h = std::clamp<int64_t>(std::llround(h * scale), 1, cell);
    const int64_t origin_x = (i % cols) * cell + (cell - out_w) / 2;
    const int64_t origin_y = (i / cols) * cell + (cell - out_h) / 2;
    const uint8_t* src = image.data<uint8_t>();
    // Bilinear sampling with pixel centres aligned (cv2.resize INTER_LINEAR's mapping).
    for (int64_t y = 0; y < out_h; ++y) {
      const double sy = std::clamp((y + 0.5) * h / out_h - 0.5, 0.0, static_cast<double>(h - 1));
      const int64_t y0 = static_cast<int64_t>(sy), y1 = std::min(y0 + 1, h - 1);
      const double fy = sy - y0;
      for (int64_t x = 0; x < out_w; ++x) {
        const double sx = std::clamp((x + 0.5) * w / out_w - 0.5, 0.0, static_cast<double>(w - 1));
        const int64_t x0 = static_cast<int64_t>(sx), x1 = std::min(x0 + 1, w - 1);
        const double fx = sx - x0;
        uint8_t* p = dst + ((origin_y + y) * sheet_width + origin_x + x) * 3;
        for (int64_t ch = 0; ch < 3; ++ch) {
          const int64_t sc = c == 1 ? 0 : ch;
          const double top = src[(y0 * w + x0) * c + sc] * (1 - fx) + src[(y0 * w + x1) * c + sc] * fx;
          const double bottom = src[(y1 * w + x0) * c + sc] * (1 - fx) + src[(y1 * w + x1) * c + sc] * fx;
          p[ch] = static_cast<uint8_t>(std::clamp(std::lround(top * (1 - fy) + bottom * fy), 0L, 255L));
        }
      }
    }
  }
  return sheet;
}

}  // namespace osprey::augment
