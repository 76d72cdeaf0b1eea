#pragma once
/// Tenants as heads: a new classifier head (multinomial logistic regression) trained on a shared backbone's features
/// from an image-folder dataset, written as a model directory whose backbone weights are bit-identical to the
/// backbone's (so a server holding several tenants stores them once). The CLI (`osprey heads train`) and the server
/// share this implementation.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "osprey/graph.h"
#include "osprey/tensor.h"

namespace osprey::heads {

/// The classifier at the end of a backbone: the node computing the logits from the feature tensor.
struct HeadInfo {
  std::string feature;   // value name of the features (the classifier's data input)
  int64_t feature_dim = 0;
  std::string kind;      // "Gemm", "MatMul+Add" or "Conv" (1x1)
  std::string weight;    // initializer names of the classifier's weight and bias ("" when it has no bias)
  std::string bias;
  bool transposed = false;  // Gemm transB = 1 (weight [K, F]) or MatMul (weight [F, K])
  std::string logits;    // value the classifier produces
  std::string output;    // graph output reached from the logits through value-keeping ops (Softmax, Identity, ...)
  int64_t classes = 0;
};

/// Finds the classifier: walks back from graph output 0 through Softmax/Identity/Flatten/Reshape/Squeeze to a Gemm,
/// MatMul (+ Add) or 1x1 Conv whose weight is a constant. With `feature` given, the classifier must be the node that
/// consumes that value. Throws kInvalidArgument explaining what was found when there is none.
HeadInfo FindHead(const Graph& graph, const std::string& feature = "");

/// The graph truncated at `value`: same inputs, `value` as the only output, nodes not needed for it removed.
Graph TruncateAt(const Graph& graph, const std::string& value);

/// An image-folder dataset: one sub-folder per class (sorted by name), images by extension (jpg, jpeg, png, webp, bmp).
struct ImageFolder {
  std::vector<std::string> classes;
  std::vector<std::string> files;
  std::vector<int> labels;
};
ImageFolder ReadImageFolder(const std::string& dir);

/// Multinomial logistic regression, sklearn's LogisticRegression objective: sum of cross-entropy + 0.5 / C * |W|^2
/// (the intercept not penalised), minimised by L-BFGS in double precision until max |gradient| <= tol * n (sklearn's
/// default tolerance on its mean-scaled loss). Deterministic.
struct SoftmaxFit {
  int64_t classes = 0, dim = 0;
  std::vector<float> weight;  // [classes, dim]
  std::vector<float> bias;    // [classes]
  int iterations = 0;
  double loss = 0;
  bool converged = false;
};
SoftmaxFit FitSoftmax(const std::vector<float>& x, int64_t n, int64_t dim, const std::vector<int>& y, int64_t classes,
                      double c = 1.0, int max_iter = 2000, double tol = 1e-4);

struct TrainOptions {
  std::string features;     // feature value name ("" = found automatically)
  double val_split = 0.2;   // fraction held out per class (stratified)
  uint64_t seed = 0;
  double c = 1.0;           // inverse L2 strength, as sklearn's C
  int max_iter = 2000;
  int threads = 0;          // 0 = all cores
  int64_t batch_size = 32;
  std::string features_out;  // when set: features.npy, labels.npy, validation.npy written there
  std::string augment;       // an `osprey augment` pipeline file: `copies` augmented versions of each training image
  int64_t copies = 0;        // are added to the training features (held-out images are never augmented)
};

struct TrainResult {
  std::string model_dir;  // REPO/NAME/<version>
  std::string report_json;
};

/// Trains a head for the dataset in `data_dir` on the backbone model directory `backbone` and writes the new version
/// of `output` (a REPO/NAME folder): model.onnx, labels.txt, config.json (the backbone's), train_report.json. Files
/// that cannot be decoded are reported in the report and skipped. `progress` (may be empty) gets one line per stage.
TrainResult Train(const std::string& backbone, const std::string& data_dir, const std::string& output,
                  const TrainOptions& options, const std::function<void(const std::string&)>& progress = {});

}  // namespace osprey::heads
