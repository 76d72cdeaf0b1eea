#pragma once
/// Image classification over a model directory: preprocessing as an engine graph per decoded image size (plans cached
/// by size), batching, the model run, softmax and top-k.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "osprey/graph.h"
#include "osprey/image.h"
#include "osprey/model_dir.h"
#include "osprey/runtime.h"
#include "osprey/tensor.h"

namespace osprey {

/// The preprocessing graph for one decoded uint8 [h, w, channels] image (graph input "image"): ResizeImage ->
/// CropImage (shorter) or PadImage (longer) -> ColorConvert (when the model wants BGR or GRAY) -> NormalizeImage.
/// Output "pixels": float32 [C, crop_height, crop_width] (layout NCHW) or [crop_height, crop_width, C] (NHWC).
/// Steps that would do nothing (resize to the same size) are left out. `channels` is 3 (RGB) or 1 (gray).
Graph BuildPreprocessGraph(const PreprocessSpec& spec, int64_t h, int64_t w, int channels);

/// Resized size before the crop/pad for a `h` x `w` image (torchvision's rule for "shorter": the other side is
/// truncated). Exposed for tests and for the decoder's DCT-scaling hint.
void PreprocessResizeTarget(const PreprocessSpec& spec, int64_t h, int64_t w, int64_t* out_h, int64_t* out_w);

/// Runs preprocessing graphs. Plans are compiled once per decoded image size and kept in an LRU PlanCache, so a
/// stream of same-size images compiles once. Thread-safe.
class ImagePreprocessor {
 public:
  explicit ImagePreprocessor(PreprocessSpec spec, CompileOptions options = {}, size_t cache_capacity = 32);
  /// uint8 [H, W, C] (C = 3 or 1) -> float32 per-image tensor (see BuildPreprocessGraph).
  Tensor Run(const Tensor& image) const;
  /// Shape Run returns: [C, h, w] or [h, w, C].
  Shape OutputShape() const;
  const PreprocessSpec& spec() const { return spec_; }
  PlanCache& plan_cache() const { return *plan_cache_; }

 private:
  PreprocessSpec spec_;
  std::string spec_key_;
  CompileOptions options_;
  std::unique_ptr<PlanCache> plan_cache_;
};

/// How images for a model with `spec` are decoded: its channels, and the JPEG DCT-scaling hint (the decoded image stays
/// at least as large as the resize needs) unless spec.jpeg_dct_scaling is false. The CLI and the server both use it.
DecodeOptions DecodeOptionsFor(const PreprocessSpec& spec);

/// Stacks same-shape tensors into one [N, ...] tensor (copy). Throws kInvalidArgument when shapes or dtypes differ.
Tensor StackTensors(const std::vector<Tensor>& items);

/// One class in a result.
struct ClassScore {
  int64_t index = 0;
  std::string label;
  float probability = 0;  // softmax output, or the raw score when softmax is off
};

/// Top `k` classes of each row of `scores` ([N, ...] with N rows of K classes), softmax applied first when asked.
/// Ties keep the lower index first.
std::vector<std::vector<ClassScore>> TopKClasses(const Tensor& scores, bool softmax, int k,
                                                 const ModelDirectory& directory);

struct ClassifierOptions {
  int num_threads = 0;  // 0 = all cores
  /// Images per model run (the model's fixed batch dim, when it has one, wins).
  int64_t batch_size = 32;
  size_t plan_cache_capacity = 32;
  /// Where the model runs (preprocessing stays on the CPU).
  DeviceSpec device;
};

/// Result for one image: classes, or the error that stopped it.
struct ImageClassification {
  std::string image;
  std::vector<ClassScore> top_k;
  std::string error;  // empty on success
  bool ok() const { return error.empty(); }
};

/// A model directory ready to classify files.
class Classifier {
 public:
  explicit Classifier(ModelDirectory directory, ClassifierOptions options = {});
  ~Classifier();
  /// Decodes (with a DCT-scaling hint of the resize target), preprocesses, batches and classifies the files. A file
  /// that cannot be read, decoded or preprocessed gets an error entry; the others still get answers. Errors of the
  /// model itself are thrown.
  std::vector<ImageClassification> ClassifyFiles(const std::vector<std::string>& paths, int top_k);
  /// Classifies preprocessed per-image tensors (ImagePreprocessor output) in batches.
  std::vector<std::vector<ClassScore>> ClassifyTensors(const std::vector<Tensor>& pixels, int top_k);
  const ModelDirectory& directory() const { return directory_; }
  const ImagePreprocessor& preprocessor() const { return *preprocessor_; }

 private:
  ModelDirectory directory_;
  ClassifierOptions options_;
  std::unique_ptr<ImagePreprocessor> preprocessor_;
  std::unique_ptr<Model> model_;
  int64_t fixed_batch_ = -1;  // the model's fixed batch dim, -1 when symbolic
};

}  // namespace osprey
