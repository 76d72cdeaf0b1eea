#pragma once
// Internal to src/augment: the parsed pipeline tree and the transforms' sampling interface.
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "augment/geometry.h"
#include "osprey/augment.h"
#include "osprey/graph.h"

namespace osprey::augment {

/// What a transform sees of the image while the pipeline is being sampled.
struct View {
  int64_t width = 0, height = 0;
  int channels = 3;
  std::vector<std::array<double, 4>> boxes;  // current boxes (x0, y0, x1, y1), clipped to the image
};

/// A displacement field that is separable, as GridDistortion's: output pixel (col, row) samples the input at pixel
/// position (map_x[col], map_y[row]) (pixel indices, cv2.remap's maps); same size in and out.
struct SeparableRemap {
  std::vector<float> map_x, map_y;
  int interpolation = 1;  // 0 nearest, 1 bilinear
  int border = 0;         // OpenCV border code (0, 1, 2, 4)
  double fill = 0;
};

/// A dense displacement field, as ElasticTransform's: output pixel (col, row) samples the input at pixel position
/// (map_x[row * width + col], map_y[row * width + col]) (cv2.remap's maps); same size in and out. `max_shift` bounds
/// |map - identity| on either axis (pixels), so searches for where a source pixel went stay local.
struct DenseRemap {
  int64_t width = 0, height = 0;
  std::vector<float> map_x, map_y;
  double max_shift = 0;
  int interpolation = 1;  // 0 nearest, 1 bilinear
  int border = 0;         // OpenCV border code (0, 1, 2, 4)
  double fill = 0;
};

/// One geometric step: the forward map of continuous coordinates and the output size, or a displacement field.
struct GeoStep {
  Mat3 forward;
  int64_t width = 0, height = 0;
  int interpolation = -1;  // -1: no resampling of its own (flips, crops, pads); 0 nearest; 1 bilinear
  int border = -1;         // -1: introduces no border; else an OpenCV border code (0, 1, 2, 4)
  double fill = 0;
  std::shared_ptr<const SeparableRemap> remap;  // set: a displacement-field step (forward unused), run on its own
  std::shared_ptr<const DenseRemap> dense;      // set: a dense displacement-field step, likewise
};

/// One photometric step: an osprey op appended to the image graph, or a host step run between two graphs (an
/// encode/decode round trip, or a function of the image for work that has no op: filters.h).
struct PhotoStep {
  std::string op;  // empty for a host step
  AttributeMap attrs;
  std::string codec;  // host step: "jpeg" or "webp"
  int quality = 0;
  std::function<Tensor(const Tensor&)> host;  // host step: the image in, the new image out
};

class Transform {
 public:
  virtual ~Transform() = default;
  virtual bool IsGeometric() const = 0;
  /// Geometric transforms: draws parameters and returns the step. Throws kInvalidArgument (naming the transform)
  /// when the image cannot take it (e.g. a crop larger than the image).
  virtual GeoStep Geometry(Rng& rng, const View& view) const;
  /// Photometric transforms: draws parameters and appends steps.
  virtual void Photometric(Rng& rng, const View& view, std::vector<PhotoStep>& steps) const;
  std::string name;
};

struct MosaicSpec {
  int64_t height = 0, width = 0;
  double center_lo = 0.25, center_hi = 0.75;
  double fill = 114;
  double p = 1;
};

struct PipelineNode {
  enum Kind { kLeaf, kCompose, kSequential, kOneOf, kSomeOf } kind = kLeaf;
  std::string name;  // transform or container name
  double p = 1;
  std::shared_ptr<const Transform> leaf;
  std::vector<PipelineNode> children;
  int64_t n = 1;         // SomeOf
  bool replace = false;  // SomeOf
};

struct ParsedPipeline {
  PipelineNode root;
  BoxFilter filter;
  std::optional<MosaicSpec> mosaic;  // a leading Mosaic step, taken out of root
};

/// Albumentations 1.3.x spelling of one transform's parameters -> the 1.4.24 names and units (legacy.cc). `type` is
/// the transform name, `path` its JSON path for errors.
nlohmann::json FromAlbumentations13(const std::string& type, const nlohmann::json& spec, const std::string& path);

/// Albumentations 2.x spelling: AlbumentationsX's names (FromAlbumentationsX) read as 2.0.8's; no-op values 2.x always
/// writes (area_for_downscale null, PadIfNeeded padding 0, ...) dropped, other values of those parameters refused by
/// name; `major` is the writing version's major number (1 when unknown): with 2 or more, parameters whose meaning
/// changed are marked for their factory (legacy.cc).
nlohmann::json FromAlbumentations2(const std::string& type, const nlohmann::json& spec, const std::string& path,
                                   int major);
/// AlbumentationsX (2.0.9 on) names -> albumentations 2.0.8's (`*_range` -> `*_limit`, ...); its new parameters at
/// their neutral values dropped, other values refused by name; its new ElasticTransform (a B-spline control grid)
/// marked "_field": "bspline" for the factory (legacy.cc).
nlohmann::json FromAlbumentationsX(const std::string& type, const nlohmann::json& spec, const std::string& path);

/// Parses osprey or Albumentations pipeline JSON (docs/augment.md). Errors name the JSON path.
ParsedPipeline ParsePipelineJson(const std::string& text);

/// Names of the supported transforms, comma-separated (for error messages and --help).
std::string SupportedTransforms();

}  // namespace osprey::augment
