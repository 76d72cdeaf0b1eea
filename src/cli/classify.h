#pragma once
// osprey classify: declared here rather than in cli/common.h so the subcommand stays in its own files.
#include <ostream>
#include <string>
#include <vector>

namespace osprey::cli {

struct ClassifyOptions {
  std::string model_dir;
  std::vector<std::string> images;
  int top_k = 0;  // 0 = the model directory's postprocess.top_k
  bool json = false;
  int threads = 0;
  int64_t batch_size = 32;
  std::string version;  // "" = the highest numeric version
  std::string device = "cpu";
};
/// Classifies the images and prints top-k labels per image (a text table, or one JSON object with --json). Returns
/// 1 when any image failed (each failure is reported with its file), else 0.
int RunClassify(const ClassifyOptions& options, std::ostream& out, std::ostream& err);

}  // namespace osprey::cli
