#pragma once
// Internal to src/augment: 3x3 projective matrices on continuous image coordinates, moving targets through them, and
// the seeded random source every transform draws from.
#include <array>
#include <cstdint>
#include <vector>

#include "osprey/augment.h"

namespace osprey::augment {

/// Row-major 3x3 matrix acting on column vectors [x, y, 1].
struct Mat3 {
  std::array<double, 9> m = {1, 0, 0, 0, 1, 0, 0, 0, 1};
  static Mat3 Translate(double tx, double ty) { return {{1, 0, tx, 0, 1, ty, 0, 0, 1}}; }
  static Mat3 Scale(double sx, double sy) { return {{sx, 0, 0, 0, sy, 0, 0, 0, 1}}; }
  Mat3 operator*(const Mat3& o) const;
  /// Throws kInvalidArgument when singular.
  Mat3 Inverse() const;
  bool IsIdentity(double tol = 1e-9) const;
  bool IsAffine() const { return m[6] == 0 && m[7] == 0 && m[8] == 1; }
  /// Maps a point; returns false when it lands at or behind the horizon (w' <= 0).
  bool Map(double x, double y, double* ox, double* oy) const;
};

/// The homography taking src[i] to dst[i] (4 points each, no three collinear). Throws kInvalidArgument otherwise.
Mat3 HomographyFromQuad(const std::array<std::array<double, 2>, 4>& src, const std::array<std::array<double, 2>, 4>& dst);

/// The WarpPerspective matrix (output pixel -> input pixel, pixel centres at integers) for a forward map `forward`
/// of continuous coordinates (input -> output).
Mat3 PixelInverseMap(const Mat3& forward);

/// Moves objects through `forward` (continuous coordinates) into an image covering `clip` = [x0, y0, x1, y1]
/// (usually [0, 0, w, h]): boxes as their four corners then clipped, polygons clipped (Sutherland–Hodgman),
/// keypoints outside become 0, 0, 0. Objects whose boxes fail `filter` (or are empty) are removed. Returns the number
/// removed.
/// Keypoints (x, y, v triples) through `forward`: those that land outside `clip` become 0, 0, 0 (v <= 0 stay as
/// they are).
void MoveKeypoints(std::vector<double>& keypoints, const Mat3& forward, const std::array<double, 4>& clip);
int64_t MoveObjects(std::vector<Object>& objects, const Mat3& forward, const std::array<double, 4>& clip,
                    const BoxFilter& filter);

struct SeparableRemap;
/// Moves objects and free keypoints through a separable displacement field (GridDistortion) on a w x h image, as
/// Albumentations 2.x: a box becomes the bounds of its pixel mask (columns round(x0) .. round(x1), rows likewise)
/// remapped nearest-neighbour, in its pixel-index convention; points (polygons, keypoints) move through the field's
/// inverse (each map is non-decreasing), polygons clipped, keypoints outside become 0, 0, 0. Objects whose mask
/// vanishes or whose box fails `filter` are removed; returns how many.
int64_t RemapObjects(std::vector<Object>& objects, std::vector<double>& keypoints, const SeparableRemap& remap,
                     int64_t w, int64_t h, const BoxFilter& filter);

struct DenseRemap;
/// The same for a dense displacement field (ElasticTransform) on its image: a box becomes the bounds of the output
/// pixels whose nearest source pixel (cv2.remap INTER_NEAREST) lies in its pixel mask, as Albumentations 2.x; points
/// move through the field's numerical inverse (the output point whose bilinearly interpolated map reaches them within
/// 0.05 pixel; a point no output reaches is treated as outside).
int64_t RemapObjectsDense(std::vector<Object>& objects, std::vector<double>& keypoints, const DenseRemap& remap,
                          const BoxFilter& filter);

/// For a warp whose border reflects (border_mode 2 or 4), what Albumentations adds: each object mirrored into
/// every cell of the reflection grid around the w x h source image that the output [0, ow] x [0, oh] reaches through
/// `forward` (cells alternate flipped and unflipped, as the reflected pixels do). Copies keep the category and
/// mirrored polygons; they get no keypoints and source_id -1. Returned in source coordinates: MoveObjects then keeps
/// the visible ones.
std::vector<Object> ReflectedCopies(const std::vector<Object>& objects, const Mat3& forward, double w, double h,
                                    double ow, double oh);

/// Deterministic random source (splitmix64). Same seed, same sequence, on every platform.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next();
  /// Uniform in [0, 1).
  double Unit() { return static_cast<double>(Next() >> 11) * (1.0 / 9007199254740992.0); }
  /// Uniform in [lo, hi] (lo when hi <= lo).
  double Uniform(double lo, double hi) { return hi <= lo ? lo : lo + (hi - lo) * Unit(); }
  /// Integer uniform in [lo, hi] inclusive (lo when hi <= lo).
  int64_t Int(int64_t lo, int64_t hi);
  bool Chance(double p) { return p >= 1 || (p > 0 && Unit() < p); }
  /// Standard normal (Box–Muller).
  double Normal();

 private:
  uint64_t state_;
};

}  // namespace osprey::augment
