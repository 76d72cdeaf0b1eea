// Classifier: decode -> preprocessing graph -> batch -> model -> softmax -> top-k, with per-file errors.
#include "osprey/classify.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "osprey/image.h"

namespace osprey {

std::vector<std::vector<ClassScore>> TopKClasses(const Tensor& scores, bool softmax, int k,
                                                 const ModelDirectory& directory) {
  if (scores.rank() < 1 || scores.dim(0) < 1)
    throw Error(ErrorCode::kInvalidArgument,
                "model output: expected [N, classes], found " + ShapeToString(scores.shape()));
  const int64_t rows = scores.dim(0);
  const int64_t classes = scores.numel() / rows;
  if (classes < 1)
    throw Error(ErrorCode::kInvalidArgument, "model output " + ShapeToString(scores.shape()) + " has no classes");
  if (!directory.labels.empty() && static_cast<int64_t>(directory.labels.size()) != classes)
    throw Error(ErrorCode::kInvalidArgument, directory.labels_path + ": has " +
                                                 std::to_string(directory.labels.size()) +
                                                 " labels, the model outputs " + std::to_string(classes) + " classes " +
                                                 ShapeToString(scores.shape()));
  const std::vector<float> values = scores.ToFloatVector();
  const int64_t keep = std::min<int64_t>(std::max(k, 1), classes);
  std::vector<std::vector<ClassScore>> out(rows);
  std::vector<double> p(classes);
  std::vector<int64_t> order(classes);
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = values.data() + r * classes;
    for (int64_t c = 0; c < classes; ++c) p[c] = row[c];
    if (softmax) {
      const double max_value = *std::max_element(p.begin(), p.end());
      double sum = 0;
      for (double& v : p) sum += (v = std::exp(v - max_value));
      for (double& v : p) v /= sum;
    }
    std::iota(order.begin(), order.end(), 0);
    // NaN scores sort last so they never hide a real class.
    std::partial_sort(order.begin(), order.begin() + keep, order.end(), [&](int64_t a, int64_t b) {
      const bool na = std::isnan(p[a]), nb = std::isnan(p[b]);
      if (na != nb) return nb;
      if (p[a] != p[b]) return p[a] > p[b];
      return a < b;
    });
    for (int64_t i = 0; i < keep; ++i)
      out[r].push_back(ClassScore{order[i], directory.Label(order[i]), static_cast<float>(p[order[i]])});
  }
  return out;
}

Classifier::Classifier(ModelDirectory directory, ClassifierOptions options)
    : directory_(std::move(directory)), options_(options) {
  CheckPreprocessSpec(directory_.preprocess, directory_.graph);
  if (directory_.graph.outputs.empty())
    throw Error(ErrorCode::kInvalidArgument, directory_.model_path + ": the model has no outputs");
  for (const ValueInfo& info : directory_.graph.input_infos)
    if (info.name == directory_.preprocess.input && info.has_shape && info.dims[0].value >= 0)
      fixed_batch_ = info.dims[0].value;
  if (fixed_batch_ == 0)
    throw Error(ErrorCode::kInvalidArgument, directory_.model_path + ": the image input has a fixed batch size of 0");
  if (options_.batch_size < 1)
    throw Error(ErrorCode::kInvalidArgument, "batch size: expected >= 1, found " + std::to_string(options_.batch_size));
  CompileOptions compile;
  compile.num_threads = options_.num_threads;
  preprocessor_ = std::make_unique<ImagePreprocessor>(directory_.preprocess, compile, options_.plan_cache_capacity);
  ModelOptions model_options;
  model_options.compile = compile;
  model_options.compile.device = options_.device;
  model_ = std::make_unique<Model>(directory_.graph, model_options);
}

Classifier::~Classifier() = default;

std::vector<std::vector<ClassScore>> Classifier::ClassifyTensors(const std::vector<Tensor>& pixels, int top_k) {
  std::vector<std::vector<ClassScore>> results;
  const int64_t batch = fixed_batch_ > 0 ? fixed_batch_ : options_.batch_size;
  for (size_t start = 0; start < pixels.size(); start += batch) {
    const size_t count = std::min<size_t>(batch, pixels.size() - start);
    std::vector<Tensor> group(pixels.begin() + start, pixels.begin() + start + count);
    // A model with a fixed batch dim gets full batches: the last one is filled with copies of its first image.
    while (fixed_batch_ > 0 && static_cast<int64_t>(group.size()) < fixed_batch_) group.push_back(group.front());
    std::vector<std::pair<std::string, Tensor>> outputs =
        model_->Run({{directory_.preprocess.input, StackTensors(group)}});
    const Tensor& scores = outputs.at(0).second;
    if (scores.rank() < 1 || scores.dim(0) != static_cast<int64_t>(group.size()))
      throw Error(ErrorCode::kInvalidArgument, "model output '" + outputs[0].first + "' " +
                                                   ShapeToString(scores.shape()) +
                                                   ": expected a first (batch) dim of " + std::to_string(group.size()));
    std::vector<std::vector<ClassScore>> top = TopKClasses(scores, directory_.postprocess.softmax, top_k, directory_);
    for (size_t i = 0; i < count; ++i) results.push_back(std::move(top[i]));
  }
  return results;
}

DecodeOptions DecodeOptionsFor(const PreprocessSpec& spec) {
  DecodeOptions decode;
  // A gray model gets gray decodes (Pillow's convert("L") luma), so resizing touches one channel instead of three.
  decode.channels = spec.channels();
  if (spec.jpeg_dct_scaling) {
    // DCT-domain downscaling hint: the decoded image must stay at least as large as what the resize step needs.
    const int64_t hint = spec.resize == "exact" ? std::max(spec.crop_height, spec.crop_width) : spec.resize_size;
    decode.min_width = hint;
    decode.min_height = hint;
  }
  return decode;
}

std::vector<ImageClassification> Classifier::ClassifyFiles(const std::vector<std::string>& paths, int top_k) {
  const DecodeOptions decode = DecodeOptionsFor(directory_.preprocess);

  std::vector<ImageClassification> results(paths.size());
  const size_t chunk = static_cast<size_t>(fixed_batch_ > 0 ? std::max<int64_t>(fixed_batch_, options_.batch_size)
                                                            : options_.batch_size);
  // Chunks bound memory: at most one chunk of decoded images is alive at a time.
  for (size_t start = 0; start < paths.size(); start += chunk) {
    const size_t end = std::min(paths.size(), start + chunk);
    std::vector<Tensor> pixels;
    std::vector<size_t> which;
    for (size_t i = start; i < end; ++i) {
      results[i].image = paths[i];
      try {
        Tensor image = ReadImageFile(paths[i], decode);
        pixels.push_back(preprocessor_->Run(image));
        which.push_back(i);
      } catch (const Error& e) {
        results[i].error = e.what();
      } catch (const std::bad_alloc&) {
        results[i].error = "out of memory while decoding";
      }
    }
    if (pixels.empty()) continue;
    std::vector<std::vector<ClassScore>> top = ClassifyTensors(pixels, top_k);
    for (size_t j = 0; j < which.size(); ++j) results[which[j]].top_k = std::move(top[j]);
  }
  return results;
}

}  // namespace osprey
