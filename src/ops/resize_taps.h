#pragma once
// The one-dimensional taps of the osprey-domain image resize (ResizeImage, and the crops and letterboxes built on it),
// in one place: the reference kernels (src/kernels/reference/image.cc) and the fast ones (src/kernels/cpu/
// image_kernels.cc) both take their source indices and weights from here, so the rules cannot drift. The oracles are
// Pillow and OpenCV themselves (tests/image_ops).
//
// Rules, per output index o of an axis resized from `in` to `out` (scale = in / out):
// - nearest: source index floor((o + 0.5) * scale) (half-pixel centres, as Pillow NEAREST and OpenCV
//   INTER_NEAREST_EXACT).
// - bilinear / bicubic with antialias: Pillow's resampling. The filter (triangle, or Keys cubic with a = -0.5) is
//   stretched by the downscale factor, taps outside the image are dropped and the weights renormalised.
// - bilinear / bicubic without antialias: OpenCV's INTER_LINEAR / INTER_CUBIC (cubic a = -0.75); source coordinate
//   (o + 0.5) * scale - 0.5, taps outside the image clamped to the edge.
// - area: OpenCV's INTER_AREA. When no axis grows (`area_shrinks`), each output pixel averages the source area it
//   covers (fractional overlaps weighted); otherwise OpenCV's area-upscaling linear weights.
#include <cstdint>
#include <string>
#include <vector>

namespace osprey {

struct ResizeTap {
  int64_t index;  // source index along the axis, in [0, in)
  double weight;
};

/// Keys' cubic convolution weight at distance x with parameter a.
double CubicWeight(double x, double a);

/// Replaces `taps` with the source taps of output index `o` (the rules above). `mode`: nearest, bilinear, bicubic or
/// area. Taps may repeat an index (clamped edges) and may have zero weight.
void ResizeTaps(const std::string& mode, bool antialias, bool area_shrinks, int64_t in, int64_t out, int64_t o,
                std::vector<ResizeTap>& taps);

}  // namespace osprey
