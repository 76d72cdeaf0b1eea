#pragma once
/// Model directories: `<root>/<name>/<version>/model.onnx` + optional `config.json` + optional `labels.txt` (in the
/// version directory or in `<name>/`). The format is described in docs/model-directory.md. The same layout is what
/// the server loads.
#include <cstdint>
#include <string>
#include <vector>

#include "osprey/graph.h"

namespace osprey {

/// How one decoded uint8 RGB image becomes the model's input. Sizes in pixels.
struct PreprocessSpec {
  /// Name of the graph input that takes the image.
  std::string input;
  /// ResizeImage mode: "nearest", "bilinear", "bicubic" or "area".
  std::string resize_mode = "bilinear";
  /// "shorter": shorter side to `resize_size` (the other side scaled and truncated, as torchvision), then a centre
  ///            crop of crop_height x crop_width.
  /// "exact":   resize to crop_height x crop_width (aspect ratio not kept).
  /// "longer":  longer side to `resize_size`, then zero padding (centred) to crop_height x crop_width.
  std::string resize = "shorter";
  int64_t resize_size = 256;
  /// Size of the image fed to the model (the crop, the exact size, or the padded canvas).
  int64_t crop_height = 224;
  int64_t crop_width = 224;
  /// Channel order the model expects: "RGB", "BGR" or "GRAY" (one channel).
  std::string color = "RGB";
  /// y[c] = (x[c] * scale - mean[c]) / std[c]; mean and std have one value per channel.
  float scale = 1.0f / 255.0f;
  std::vector<float> mean;
  std::vector<float> std;
  /// "NCHW" or "NHWC" (the model input's layout; the batch is always the first dim).
  std::string layout = "NCHW";
  /// Pillow-style antialiasing when the resize shrinks (bilinear/bicubic), as torchvision and Pillow do; false gives
  /// OpenCV's plain cv2.resize taps (what OpenCV-trained models saw).
  bool antialias = true;
  /// JPEG only: decode at 1/2, 1/4 or 1/8 scale in the DCT domain when the image stays at least as large as the resize
  /// needs (much faster on photos; values differ slightly from a full decode). false decodes every JPEG at full size,
  /// as Pillow, OpenCV and torchvision do.
  bool jpeg_dct_scaling = true;
  /// Element type of the preprocessed image: the model input's (float32, float16 or bfloat16; set by
  /// LoadModelDirectory from the graph, not read from config.json). The image is computed in float32, then converted.
  DType dtype = DType::kF32;

  /// 1 for GRAY, else 3.
  int channels() const { return color == "GRAY" ? 1 : 3; }
  /// One line per field, for `osprey inspect`.
  std::string Describe(const std::string& indent = "  ") const;
  /// The spec as a JSON object in the config.json "preprocess" format (plus "input"), serialised.
  std::string ToJson() const;
};

/// What happens to the model's first output.
struct PostprocessSpec {
  /// Apply softmax over the class axis (off when the graph already ends in Softmax and config.json says nothing).
  bool softmax = true;
  /// Default number of classes reported per image.
  int top_k = 5;
};

/// Dynamic batching in the server (config.json "batching" object, or the same fields at the top level).
struct BatchingSpec {
  /// Most rows (sum of the requests' dim-0 sizes) run together; 0 = no batching (each request runs alone).
  int64_t max_batch_size = 0;
  /// How long the first queued request waits for others before its batch runs, microseconds.
  int64_t max_queue_delay_us = 0;
  /// config.json "warmup": batch sizes the server runs once with zero inputs when it loads the model, so that the
  /// first real request finds its plan compiled (docs/model-directory.md).
  std::vector<int64_t> warmup;
};

/// An opened model directory. The graph is imported (ops not yet validated: compiling it does that).
struct ModelDirectory {
  std::string name;
  std::string version;              // "" for a bare .onnx file
  std::string model_path;           // the .onnx file
  std::string config_path;          // "" when there is no config.json
  std::string labels_path;          // "" when there is no labels.txt
  std::vector<std::string> labels;  // one per class, in index order; empty without labels.txt
  PreprocessSpec preprocess;
  PostprocessSpec postprocess;
  BatchingSpec batching;
  /// config.json "precision": "fp32", "bf16", "auto" or "fp16" (CompileOptions::precision); empty when the file does
  /// not say (the caller's default: fp32, or the server's --precision).
  std::string precision;
  /// config.json "device": "cpu", "cuda" or "cuda:N"; empty = the server's --device (CompileOptions::device).
  std::string device;
  /// True when there is no config.json and the preprocessing was derived from the model's input shape.
  bool derived = false;
  Graph graph;

  /// Label of class `index`: labels[index], or the index as text when there are no labels.
  std::string Label(int64_t index) const;
};

/// Opens `path`, which is one of: a model directory `<name>` (the highest numeric version, or `version` when given),
/// a version directory `<name>/<version>` holding model.onnx, or a direct `.onnx` file (config.json and labels.txt
/// beside it are used when present). config.json is validated field by field (unknown fields are errors); without it
/// the preprocessing is derived from the model's input shape. Throws kNotFound / kInvalidArgument naming the file and
/// field.
ModelDirectory OpenModelDirectory(const std::string& path, const std::string& version = "");

/// Sets md.labels / md.labels_path from labels.txt beside the model (`version_dir`), else in `name_dir` (either may be
/// empty): one label per line, CR stripped, trailing empty lines dropped. Leaves them empty when there is none.
void FindLabels(ModelDirectory& md, const std::string& version_dir, const std::string& name_dir);

/// Defaults derived from the image input's declared shape (rank 4; NCHW when dim 1 is 1 or 3, NHWC when the last dim
/// is; crop = the fixed H, W or 224; shorter side resized to round(crop / 0.875); ImageNet mean/std).
PreprocessSpec DerivePreprocessSpec(const Graph& graph);

/// Checks `spec` against the graph: the input exists, is float32 of rank 4, and its fixed dims fit the layout,
/// channel count and crop size. Throws kInvalidArgument naming the field.
void CheckPreprocessSpec(const PreprocessSpec& spec, const Graph& graph);

/// Parses config.json text (`source` names it in messages) over the values already in `preprocess`/`postprocess`
/// (the derived defaults): fields present replace them, absent ones keep them. Batching fields go to `batching`
/// (checked and dropped when it is null); "precision" ("fp32" | "bf16" | "auto" | "fp16") to `precision` and "device" to
/// `device` when they are non-null.
void ParseModelConfig(const std::string& text, const std::string& source, PreprocessSpec* preprocess,
                      PostprocessSpec* postprocess, BatchingSpec* batching = nullptr,
                      std::string* precision = nullptr, std::string* device = nullptr);

}  // namespace osprey
