#pragma once
// Image work of the transforms that osprey's op set has no op for (internal to src/augment): run on the host between
// two engine graphs, like ImageCompression's encode/decode round trip. Each function takes a uint8 [H, W, C] image
// (C = 1 or 3 unless stated) and returns a new tensor; none keeps a reference to its input; all are thread-safe.
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "augment/transforms.h"
#include "osprey/tensor.h"

namespace osprey::augment {

/// One non-zero tap of a correlation kernel: the source pixel at (y + dy, x + dx) times `weight`.
struct Tap {
  int dy = 0, dx = 0;
  float weight = 0;
};

/// cv2.filter2D(img, -1, kernel) for a sparse kernel given by its non-zero taps (offsets from the anchor, the kernel's
/// centre): BORDER_REFLECT_101, float accumulation, rounded to nearest (ties to even) and saturated. Cost is
/// O(H * W * C * taps). |dy|, |dx| must be below the image side or reflection is applied repeatedly.
Tensor CorrelateSparse(const Tensor& img, const std::vector<Tap>& taps);

/// Albumentations' MotionBlur kernel (blur/functional.py create_motion_kernel) as taps, each 1 / count: a line of
/// `size` (odd) through the kernel centre at `angle_deg`, biased by `direction` in [-1, 1], moved by (shift_x,
/// shift_y) kernel pixels. `rule_v2`: Albumentations 2.x's line (size points between biased ends); otherwise 1.4's
/// (2 * size points, stretched by 1 + |direction| and reversed for a negative direction).
std::vector<Tap> MotionKernel(int64_t size, double angle_deg, double direction, double shift_x, double shift_y,
                              bool rule_v2);

/// cv2.createCLAHE(clip_limit, (tiles_x, tiles_y)).apply on a gray image, or on the L channel of
/// cv2.cvtColor(RGB2LAB) for RGB, converted back with LAB2RGB (Albumentations' CLAHE). OpenCV's 8-bit LAB uses fixed
/// point tables; osprey computes the same formulas in floating point, so a channel may differ by 1.
Tensor Clahe(const Tensor& img, double clip_limit, int64_t tiles_x, int64_t tiles_y);

/// Albumentations' add_shadow: each polygon (x, y integer pixel vertices) is filled as cv2.fillPoly would fill it
/// (even-odd at pixel centres) and the pixels inside become trunc(value * (1 - intensity)), one polygon after another.
Tensor AddShadows(const Tensor& img, const std::vector<std::vector<std::array<int64_t, 2>>>& polygons,
                  const std::vector<double>& intensities);

/// AlbumentationsX's RandomBrightnessContrast with brightness_by_max false (its default; torchvision's model) on a
/// uint8 image: contrast about the image's mean grey level mu (cv2 RGB2GRAY for RGB, the mean of every value
/// otherwise), floor(clip(x * contrast + mu * (1 - contrast))), then brightness trunc(clip(y * brightness)), as its
/// 256-entry table; contrast 1 is brightness alone, brightness 1 contrast alone (contrast 0: round(mu) everywhere).
Tensor BrightnessContrastAboutMean(const Tensor& img, double brightness, double contrast);

/// Albumentations' per-image Normalize modes ("image", "image_per_channel", "min_max", "min_max_per_channel") on a
/// uint8 image: float32 [H, W, C], statistics of this image, eps 1e-4, clipped to [-20, 20].
Tensor NormalizePerImage(const Tensor& img, const std::string& mode);

/// cv2.remap(img, map_x (one row, repeated), map_y (one column, repeated), INTER_NEAREST or INTER_LINEAR, border,
/// fill) for a separable field: the bilinear source position is rounded to 1/32 pixel as OpenCV's, the weights are
/// computed in floating point (within 1 of OpenCV). uint8, any C.
Tensor RemapSeparable(const Tensor& img, const SeparableRemap& remap, int interpolation);

/// cv2.remap(img, map_x, map_y, INTER_NEAREST or INTER_LINEAR, border, fill) for a dense field (DenseRemap), with the
/// same arithmetic as RemapSeparable. uint8, any C.
Tensor RemapDense(const Tensor& img, const DenseRemap& remap, int interpolation);

/// OpenCV's getGaussianKernel(size, sigma) (sigma > 0), in double.
std::vector<double> GaussianKernel(int64_t size, double sigma);

/// cv2.GaussianBlur of a float32 plane (`rows` x `cols`, row-major, in place) with a square `kernel` (odd size), border
/// 1 (BORDER_REPLICATE) or 4 (BORDER_REFLECT_101): separable, rows first, float accumulation (symmetric taps paired). Cost O(rows * cols *
/// kernel size).
void BlurPlane(std::vector<float>& plane, int64_t rows, int64_t cols, const std::vector<double>& kernel, int border);

}  // namespace osprey::augment
