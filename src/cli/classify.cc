// osprey classify MODEL_DIR IMAGE... [--top-k K] [--json] [--threads T] [--batch-size B]
#include "cli/classify.h"

#include <algorithm>
#include <cstdio>
#include <iomanip>
#include <nlohmann/json.hpp>

#include "osprey/classify.h"
#include "osprey/model_dir.h"

namespace osprey::cli {

int RunClassify(const ClassifyOptions& options, std::ostream& out, std::ostream& err) {
  if (options.images.empty()) throw Error(ErrorCode::kInvalidArgument, "classify: no images given");
  ModelDirectory directory = OpenModelDirectory(options.model_dir, options.version);
  const int top_k = options.top_k > 0 ? options.top_k : directory.postprocess.top_k;
  ClassifierOptions classifier_options;
  classifier_options.num_threads = options.threads;
  classifier_options.device = ParseDevice(options.device, "--device");
  classifier_options.batch_size = options.batch_size;
  Classifier classifier(std::move(directory), classifier_options);
  std::vector<ImageClassification> results = classifier.ClassifyFiles(options.images, top_k);
  const size_t failed = std::count_if(results.begin(), results.end(), [](const auto& r) { return !r.ok(); });

  if (options.json) {
    nlohmann::json j;
    j["model"] = classifier.directory().name;
    j["version"] = classifier.directory().version;
    j["results"] = nlohmann::json::array();
    for (const ImageClassification& r : results) {
      nlohmann::json item;
      item["image"] = r.image;
      if (r.ok()) {
        item["top_k"] = nlohmann::json::array();
        for (const ClassScore& c : r.top_k)
          item["top_k"].push_back({{"label", c.label}, {"index", c.index}, {"probability", c.probability}});
      } else {
        item["error"] = r.error;
      }
      j["results"].push_back(item);
    }
    out << j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  } else {
    size_t label_width = 5;
    for (const ImageClassification& r : results)
      for (const ClassScore& c : r.top_k) label_width = std::max(label_width, c.label.size());
    const char* value_name = classifier.directory().postprocess.softmax ? "probability" : "score";
    for (const ImageClassification& r : results) {
      if (!r.ok()) {
        out << r.image << ": error: " << r.error << "\n";
        continue;
      }
      out << r.image << "\n";
      out << "  rank  " << std::left << std::setw(static_cast<int>(label_width)) << "label"
          << "  index  " << value_name << "\n";
      int rank = 1;
      for (const ClassScore& c : r.top_k) {
        char value[32];
        std::snprintf(value, sizeof(value), "%.6f", c.probability);
        out << "  " << std::right << std::setw(4) << rank++ << "  " << std::left
            << std::setw(static_cast<int>(label_width)) << c.label << "  " << std::right << std::setw(5) << c.index
            << "  " << value << "\n";
      }
    }
  }
  if (failed > 0) {
    out.flush();
    err << "osprey: error: " << failed << " of " << results.size() << " image(s) could not be classified\n";
    return 1;
  }
  return 0;
}

}  // namespace osprey::cli
