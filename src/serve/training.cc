// Head training jobs for the server (see training.h).
#include "serve/training.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "osprey/error.h"
#include "osprey/heads.h"
#include "serve/multipart.h"
#include "serve/tensor_json.h"

namespace osprey::serve {
namespace fs = std::filesystem;
using json = nlohmann::json;

struct TrainingService::Job {
  int64_t id = 0;
  std::string name, backbone, data_dir;
  bool owns_data = false;  // uploaded: the folder is deleted when the job ends
  std::string state = "queued";
  std::vector<std::string> progress;
  json report;
  std::string error, version;
  bool finished = false;  // set last, under the lock: its thread has nothing left to do but return
};

namespace {

// A name that is one safe path component: repository model names and labels both become folder names.
void CheckName(const std::string& what, const std::string& s) {
  const bool ok = !s.empty() && s.size() <= 128 && s[0] != '.' &&
                  std::all_of(s.begin(), s.end(), [](unsigned char c) {
                    return std::isalnum(c) || c == '_' || c == '-' || c == '.' || c == ' ' || c >= 0x80;
                  });
  if (!ok)
    throw Error(ErrorCode::kInvalidArgument, what + " '" + s.substr(0, 64) + "' is not allowed: use 1-128 letters, " +
                                                 "digits, '_', '-', '.', spaces, not starting with '.'");
}

std::string Extension(std::string_view filename) {
  const size_t dot = filename.rfind('.');
  std::string ext = dot == std::string_view::npos ? "" : std::string(filename.substr(dot));
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  static const char* const kKnown[] = {".jpg", ".jpeg", ".png", ".webp", ".bmp"};
  return std::find(std::begin(kKnown), std::end(kKnown), ext) != std::end(kKnown) ? ext : ".jpg";
}

}  // namespace

TrainingService::TrainingService(TrainingOptions options, std::function<void(const std::string&)> on_done)
    : options_(std::move(options)), on_done_(std::move(on_done)) {}

TrainingService::~TrainingService() {
  for (auto& [thread, job] : threads_)
    if (thread.joinable()) thread.join();
}

json TrainingService::Start(const std::string& name, const HttpRequest& request,
                            const std::map<std::string, std::string>& query) {
  if (!options_.enabled)
    throw Error(ErrorCode::kUnsupported, "training is off on this server (start it with --allow-training)");
  CheckName("model name", name);
  auto job = std::make_shared<Job>();
  job->name = name;
  {
    std::lock_guard<std::mutex> lock(mu_);
    job->id = next_id_++;
  }
  struct Cleanup {  // an upload that does not become a job is deleted
    std::shared_ptr<Job> job;
    bool keep = false;
    ~Cleanup() {
      std::error_code ec;
      if (!keep && job->owns_data) fs::remove_all(job->data_dir, ec);
    }
  } cleanup{job};
  const std::string content_type = request.Header("Content-Type");
  if (IsMultipart(content_type)) {
    auto it = query.find("backbone");
    if (it == query.end())
      throw Error(ErrorCode::kInvalidArgument, "train: name the backbone model with ?backbone=NAME");
    job->backbone = it->second;
    const auto parts = ParseMultipart(request.body, MultipartBoundary(content_type),
                                      static_cast<size_t>(std::max<int64_t>(1, options_.max_images)));
    std::map<std::string, int> per_label;
    for (const MultipartPart& p : parts) CheckName("label (multipart field name)", std::string(p.name));
    job->data_dir = (fs::path(options_.repository) / ".training" / (name + "-" + std::to_string(job->id))).string();
    job->owns_data = true;
    std::error_code ec;
    fs::remove_all(job->data_dir, ec);
    for (const MultipartPart& p : parts) {
      const std::string label(p.name);
      const fs::path dir = fs::path(job->data_dir) / label;
      fs::create_directories(dir);
      const int n = per_label[label]++;
      std::ofstream out(dir / (std::to_string(n) + Extension(p.filename)), std::ios::binary);
      out.write(p.data.data(), static_cast<std::streamsize>(p.data.size()));
      if (!out) throw Error(ErrorCode::kUnavailable, "train: cannot store the uploaded images");
    }
  } else {
    const json body = ParseJsonBody(request.body, false);  // depth-checked, as the infer routes
    if (!body.is_object() || !body.contains("backbone") || !body["backbone"].is_string() ||
        !body.contains("dataset") || !body["dataset"].is_string())
      throw Error(ErrorCode::kInvalidArgument,
                  "train: send a multipart/form-data upload (field name = label, ?backbone=NAME) or a JSON object "
                  "{\"backbone\": NAME, \"dataset\": FOLDER under --training-data-root}");
    job->backbone = body["backbone"].get<std::string>();
    if (options_.data_root.empty())
      throw Error(ErrorCode::kInvalidArgument, "train: server-side datasets are off (start with --training-data-root)");
    const fs::path root = fs::weakly_canonical(options_.data_root);
    const fs::path data = fs::weakly_canonical(root / body["dataset"].get<std::string>());
    const std::string r = root.string() + "/";
    if (data.string().compare(0, r.size(), r) != 0)
      throw Error(ErrorCode::kInvalidArgument, "train: dataset must be a folder under --training-data-root");
    job->data_dir = data.string();
  }
  CheckName("backbone", job->backbone);
  if (job->backbone == name)
    throw Error(ErrorCode::kInvalidArgument, "train: the tenant '" + name + "' cannot be its own backbone: name the " +
                                                 "new model differently");
  const fs::path backbone = fs::path(options_.repository) / job->backbone;
  if (!fs::is_directory(backbone))
    throw Error(ErrorCode::kNotFound, "train: backbone '" + job->backbone + "' is not in the repository");
  const heads::ImageFolder folder = heads::ReadImageFolder(job->data_dir);  // classes and counts checked now
  if (static_cast<int64_t>(folder.files.size()) > options_.max_images)
    throw Error(ErrorCode::kInvalidArgument, "train: " + std::to_string(folder.files.size()) +
                                                 " images is more than --max-training-images " +
                                                 std::to_string(options_.max_images));
  std::vector<std::thread> done;  // threads of finished jobs, joined outside the lock (their last step takes it)
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (running_ >= options_.max_jobs)
      throw Error(ErrorCode::kUnavailable, "train: " + std::to_string(running_) +
                                               " training job(s) running (--max-training-jobs); retry later");
    ++running_;
    cleanup.keep = true;
    latest_[name] = job;
    for (auto it = threads_.begin(); it != threads_.end();) {
      if (it->second->finished) {
        done.push_back(std::move(it->first));
        it = threads_.erase(it);
      } else {
        ++it;
      }
    }
    threads_.emplace_back(std::thread([this, job] { Run(job); }), job);
  }
  for (std::thread& t : done) t.join();
  return {{"model", name}, {"job", job->id}, {"state", "queued"}, {"images", folder.files.size()},
          {"classes", folder.classes}};
}

void TrainingService::Run(std::shared_ptr<Job> job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    job->state = "running";
  }
  try {
    heads::TrainOptions options;
    options.threads = options_.threads;
    heads::TrainResult r = heads::Train(
        (fs::path(options_.repository) / job->backbone).string(), job->data_dir,
        (fs::path(options_.repository) / job->name).string(), options, [&](const std::string& line) {
          std::lock_guard<std::mutex> lock(mu_);
          job->progress.push_back(line);
        });
    {
      std::lock_guard<std::mutex> lock(mu_);
      job->report = json::parse(r.report_json);
      job->version = fs::path(r.model_dir).filename().string();
    }
    if (on_done_) on_done_(job->name);
    std::lock_guard<std::mutex> lock(mu_);
    job->state = "done";
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lock(mu_);
    job->state = "failed";
    job->error = e.what();
  }
  if (job->owns_data) {
    std::error_code ec;
    fs::remove_all(job->data_dir, ec);
  }
  std::lock_guard<std::mutex> lock(mu_);
  --running_;
  job->finished = true;
}

json TrainingService::Status(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = latest_.find(name);
  if (it == latest_.end()) throw Error(ErrorCode::kNotFound, "no training job for model '" + name + "'");
  const Job& j = *it->second;
  json out = {{"model", j.name}, {"job", j.id}, {"backbone", j.backbone}, {"state", j.state}, {"progress", j.progress}};
  if (!j.version.empty()) out["version"] = j.version;
  if (!j.report.is_null()) out["report"] = j.report;
  if (!j.error.empty()) out["error"] = j.error;
  return out;
}

}  // namespace osprey::serve
