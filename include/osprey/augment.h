#pragma once
/// Detection-dataset augmentation (docs/augment.md): a pipeline of random transforms applied to an image and the
/// objects annotated on it. Every random choice comes from a seed, so the same (pipeline, sample, seed) always gives
/// the same bytes. Consecutive geometric steps are composed into one warp (one resampling); the image work of one
/// application runs as a small engine graph built for that image (osprey-domain ops, docs/image-ops.md).
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "osprey/tensor.h"

namespace osprey::augment {

/// One annotated object. Coordinates are absolute pixels in continuous image coordinates: the image covers
/// [0, width] x [0, height], pixel (col, row) covers [col, col + 1] x [row, row + 1].
struct Object {
  double x0 = 0, y0 = 0, x1 = 0, y1 = 0;  // box corners, x0 <= x1, y0 <= y1
  int64_t category = 0;
  /// COCO polygon segmentation: each polygon is x, y, x, y, ... (absolute pixels). May be empty.
  std::vector<std::vector<double>> polygons;
  /// COCO keypoints: x, y, v triples (v = 0 not labelled, 1 labelled but hidden, 2 visible). A keypoint that leaves
  /// the image becomes 0, 0, 0. May be empty.
  std::vector<double> keypoints;
  /// Passed through untouched (e.g. the source annotation id); -1 when unknown.
  int64_t source_id = -1;
  /// Extra COCO fields (e.g. "iscrowd"), a JSON object text passed through untouched; empty when none.
  std::string extra_json;
};

/// An image (uint8 [H, W, C], C = 1 or 3) with its objects.
struct Sample {
  Tensor image;
  std::vector<Object> objects;
  /// Segmentation masks (uint8 [H, W, C], the image's H and W; any C): geometric steps move them with the image's warp,
  /// sampled nearest-neighbour, with the image's border mode and 0 for constant borders; photometric steps leave
  /// them alone (as Albumentations does with its default mask settings); Apply refuses masks (kUnsupported, naming
  /// the setting) when the pipeline sets a non-zero mask fill, a mask interpolation other than nearest, or CoarseDropout
  /// holes in masks. Not with Mosaic.
  std::vector<Tensor> masks;
  /// Keypoints of the image not tied to an object (x, y, v triples, absolute pixels; Albumentations' `keypoints`):
  /// moved by geometric steps, never dropped by the box filter; one that leaves the image becomes 0, 0, 0. Not with
  /// Mosaic.
  std::vector<double> keypoints;
  /// When `image` is only a window of the source image (Pipeline::SourceWindow): the source's size and the window's
  /// top-left pixel; objects and keypoints stay in source coordinates. 0 x 0 (the default): `image` is the whole
  /// source. Not with masks or Mosaic.
  int64_t source_width = 0, source_height = 0, window_x = 0, window_y = 0;
};

/// Box conventions seen at the edges (files, the library API). Internally boxes are always absolute x0, y0, x1, y1.
enum class BoxFormat {
  kCoco,            // x_min, y_min, width, height (pixels)
  kPascalVoc,       // x_min, y_min, x_max, y_max (pixels)
  kYolo,            // x_center, y_center, width, height (fractions of the image size)
  kAlbumentations,  // x_min, y_min, x_max, y_max (fractions of the image size)
};
/// "coco", "pascal_voc", "yolo", "albumentations"; Parse throws kInvalidArgument on anything else.
const char* BoxFormatName(BoxFormat f);
BoxFormat ParseBoxFormat(const std::string& name);
/// Box in `format` -> absolute x0, y0, x1, y1 for an image of the given size, and back.
std::array<double, 4> BoxToXyxy(BoxFormat format, const std::array<double, 4>& box, int64_t width, int64_t height);
std::array<double, 4> BoxFromXyxy(BoxFormat format, const std::array<double, 4>& xyxy, int64_t width, int64_t height);

/// Rules for dropping boxes after geometric steps (Albumentations' BboxParams).
struct BoxFilter {
  double min_area = 0;        // pixels, of the clipped box in the output image
  double min_visibility = 0;  // clipped area / unclipped area of the transformed box
  double min_width = 0;       // pixels, of the clipped box
  double min_height = 0;
};

/// What one application did (for the CLI's summary and for tests).
struct ApplyReport {
  int64_t objects_in = 0;
  int64_t objects_dropped = 0;
  std::vector<std::string> applied;  // names of the transforms that fired, in order, e.g. "HorizontalFlip"
  int64_t warps = 0;                 // resamplings done (composed geometric runs)
  int64_t graphs = 0;                // engine graphs built and run
};

/// One step of a pipeline built in C++: a transform (parameters as a JSON object text, Albumentations names, e.g.
/// R"({"limit": 30})") or a container ("Compose", "Sequential", "OneOf", "SomeOf") with `children`.
struct Step {
  std::string type;
  double p = 1.0;
  std::string params = "{}";
  std::vector<Step> children;
  int64_t n = 1;  // SomeOf: how many children
};

/// A parsed pipeline. Immutable and thread-safe: Apply may run from several threads at once.
class Pipeline {
 public:
  /// Builds Compose(steps) with the given box filter; validated exactly as FromJson (same errors).
  static Pipeline FromSteps(const std::vector<Step>& steps, const BoxFilter& filter = {});
  /// Parses a pipeline: osprey's JSON or the JSON Albumentations writes (A.save(..., data_format="json")); the
  /// format is detected. Throws kInvalidArgument naming the path in the JSON (e.g. "transforms[3].limit") for
  /// malformed specs, and kUnsupported naming the transform for transforms or settings osprey does not support.
  static Pipeline FromJson(const std::string& json_text);
  static Pipeline FromFile(const std::string& path);

  Pipeline(Pipeline&&) noexcept;
  Pipeline& operator=(Pipeline&&) noexcept;
  ~Pipeline();

  /// Images one application needs: 4 when the pipeline starts with Mosaic, else 1.
  int images_needed() const;
  /// True when the pipeline ends in Normalize: Apply then returns a float32 [H, W, C] image whenever that step fires
  /// (uint8 when it does not, as in Albumentations). Normalize anywhere else is refused when the pipeline is parsed.
  bool returns_float() const;
  /// Box filtering rules from the spec's bbox_params (defaults: keep everything with positive area).
  const BoxFilter& box_filter() const;
  /// One line per transform, indented by nesting (for --help-style output and logs).
  std::string Describe() const;

  /// The part of a `width` x `height` source image (with `channels` and `objects`) that Apply with `seed` reads: when
  /// the pipeline starts with geometric steps whose composed warp is affine and reads less than the whole image, sets
  /// `window` to {x0, y0, x1, y1} (pixel columns [x0, x1), rows [y0, y1)) and returns true; else returns false (read
  /// the whole image). Applying the pipeline to that window (Sample::source_width etc.) gives the very same bytes as
  /// applying it to the whole image, so a decoder can skip the rest (osprey augment decodes JPEG windows this way).
  bool SourceWindow(int64_t width, int64_t height, int channels, const std::vector<Object>& objects, uint64_t seed,
                    std::array<int64_t, 4>* window) const;

  /// Applies the pipeline to `sample` with every random choice drawn from `seed`. `others` supplies extra samples
  /// for Mosaic (called with 0, 1, 2 for the three other tiles, after the random choice of whether Mosaic fires);
  /// when the pipeline needs them and `others` is empty, Apply throws kInvalidArgument. Objects whose boxes fall
  /// below the BoxFilter are dropped with their polygons and keypoints. Throws kInvalidArgument for inputs it cannot
  /// process (e.g. a crop larger than the image), naming the transform.
  Sample Apply(const Sample& sample, uint64_t seed, const std::function<Sample(int)>& others = {},
               ApplyReport* report = nullptr) const;

  struct Impl;

 private:
  explicit Pipeline(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// Deterministic seed of one work item: mixes the run seed, the item's index and the copy number.
uint64_t ItemSeed(uint64_t run_seed, uint64_t item_index, uint64_t copy);

}  // namespace osprey::augment
