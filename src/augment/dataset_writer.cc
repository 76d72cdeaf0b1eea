// DatasetWriter: augmented datasets on disk, crash-safe and resumable. Every image (and YOLO label) is written to a
// temporary name and renamed into place; then the item's record is appended, as one line, to this writer's own log
// (OUT/.osprey-augment/records/<pid>-<time>-<n>.jsonl, opened O_APPEND by this writer alone), so a record exists only
// for items whose image is complete. A crash can only tear the last line of a log, which has no newline and is
// ignored. Finish() builds the dataset-level files from the records alone, sorted by image id, which makes the output
// independent of the order (and the number of processes) in which items were written. One append instead of a second
// file per item: creating files (inodes) was ~5% of `osprey augment`'s time (perf, docs/performance.md).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <unordered_set>
#include <vector>

#include "osprey/dataset.h"

namespace osprey::augment {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

namespace {

constexpr const char* kRecordsDir = ".osprey-augment/records";

void MakeDirectories(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  // Another thread or process may have created it in between; only a folder that still is not there is an error.
  if (!fs::is_directory(dir))
    throw Error(ErrorCode::kInvalidArgument, "cannot create folder " + dir.string() + ": " + ec.message());
}

constexpr const char* kTempDir = ".osprey-augment/tmp";

// Writes `bytes` to a unique temporary file in OUT/.osprey-augment/tmp (made by the DatasetWriter) and renames it over
// `path` (atomic on POSIX: same file system). A process killed mid-write leaves only that temporary, outside the
// dataset's folders.
void WriteFileAtomic(const fs::path& out, const fs::path& path, const std::string& bytes) {
  static std::atomic<uint64_t> counter{0};
  if (std::error_code ec; !fs::is_directory(path.parent_path(), ec)) MakeDirectories(path.parent_path());
  const fs::path temp = out / kTempDir /
                        (path.filename().string() + ".tmp." + std::to_string(::getpid()) + "." +
                         std::to_string(counter.fetch_add(1)));
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    if (!out) throw Error(ErrorCode::kInvalidArgument, "cannot write " + temp.string());
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.close();
    if (!out) {
      std::error_code ec;
      fs::remove(temp, ec);
      throw Error(ErrorCode::kResourceExhausted, "writing " + path.string() + " failed (disk full?)");
    }
  }
  std::error_code ec;
  fs::rename(temp, path, ec);
  if (ec) {
    std::error_code ignored;
    fs::remove(temp, ignored);
    throw Error(ErrorCode::kInvalidArgument, "cannot rename " + temp.string() + " to " + path.string() + ": " +
                                                 ec.message());
  }
}

std::string ReadTextFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorCode::kNotFound, "cannot open " + path.string());
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

double Round2(double v) { return std::round(v * 100.0) / 100.0 + 0.0; }  // + 0.0 turns -0 into 0

// %.6f, with -0.000000 written as 0.000000 so tiny negative noise does not change the bytes.
std::string Fixed6(double v) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%.6f", v);
  if (std::string_view(buffer) == "-0.000000") return "0.000000";
  return buffer;
}

void CheckObject(const Object& o, const std::string& file_name) {
  bool finite = std::isfinite(o.x0) && std::isfinite(o.y0) && std::isfinite(o.x1) && std::isfinite(o.y1);
  for (const auto& polygon : o.polygons)
    for (double v : polygon) finite = finite && std::isfinite(v);
  for (double v : o.keypoints) finite = finite && std::isfinite(v);
  if (!finite)
    throw Error(ErrorCode::kInvalidArgument, "DatasetWriter: " + file_name + ": object with a non-finite coordinate");
  for (const auto& polygon : o.polygons)
    if (polygon.size() % 2 != 0)
      throw Error(ErrorCode::kInvalidArgument, "DatasetWriter: " + file_name + ": polygon with an odd value count");
  if (o.keypoints.size() % 3 != 0)
    throw Error(ErrorCode::kInvalidArgument,
                "DatasetWriter: " + file_name + ": keypoints must be x, y, v triples, got " +
                    std::to_string(o.keypoints.size()) + " values");
}

json ParseExtra(const std::string& extra_json, const std::string& file_name) {
  if (extra_json.empty()) return json::object();
  json extra = json::parse(extra_json, nullptr, /*allow_exceptions=*/false);
  if (!extra.is_object())
    throw Error(ErrorCode::kInvalidArgument,
                "DatasetWriter: " + file_name + ": object extra_json is not a JSON object: " + extra_json);
  return extra;
}

// The item record: everything Finish needs, with coordinates at full precision (shortest round-trip form).
std::string RecordJson(const OutputItem& item) {
  ordered_json objects = ordered_json::array();
  for (const Object& o : item.objects) {
    ordered_json object = {{"box", {o.x0, o.y0, o.x1, o.y1}}, {"category", o.category}, {"source_id", o.source_id}};
    if (!o.polygons.empty()) object["polygons"] = o.polygons;
    if (!o.keypoints.empty()) object["keypoints"] = o.keypoints;
    if (!o.extra_json.empty()) object["extra"] = ParseExtra(o.extra_json, item.file_name);
    objects.push_back(std::move(object));
  }
  ordered_json record = {{"image_id", item.image_id},
                         {"file_name", item.file_name},
                         {"width", item.width},
                         {"height", item.height},
                         {"objects", std::move(objects)}};
  return record.dump() + "\n";
}

OutputItem ParseRecord(const std::string& line, const std::string& where) {
  try {
    const json record = json::parse(line);
    OutputItem item;
    item.image_id = record.at("image_id").get<int64_t>();
    item.file_name = record.at("file_name").get<std::string>();
    item.width = record.at("width").get<int64_t>();
    item.height = record.at("height").get<int64_t>();
    for (const json& o : record.at("objects")) {
      Object object;
      const auto box = o.at("box").get<std::vector<double>>();
      if (box.size() != 4) throw Error(ErrorCode::kInvalidArgument, where + ": 'box' must have 4 numbers");
      object.x0 = box[0];
      object.y0 = box[1];
      object.x1 = box[2];
      object.y1 = box[3];
      object.category = o.at("category").get<int64_t>();
      object.source_id = o.value("source_id", int64_t{-1});
      if (o.contains("polygons")) object.polygons = o["polygons"].get<std::vector<std::vector<double>>>();
      if (o.contains("keypoints")) object.keypoints = o["keypoints"].get<std::vector<double>>();
      if (o.contains("extra")) object.extra_json = o["extra"].dump();
      item.objects.push_back(std::move(object));
    }
    return item;
  } catch (const json::exception& e) {
    throw Error(ErrorCode::kInvalidArgument, where + " is not a valid item record (" + e.what() +
                                                 "); delete that line to redo the item");
  }
}

// Every record in the logs under `records_dir` (all writers, all processes), one per image id (an id written twice
// has the same content: items are deterministic), sorted by image id. A torn last line (no newline) is skipped.
std::map<int64_t, OutputItem> ReadRecords(const fs::path& records_dir) {
  std::map<int64_t, OutputItem> records;
  std::vector<fs::path> logs;
  std::error_code ec;
  for (fs::directory_iterator it(records_dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->is_regular_file() && it->path().extension() == ".jsonl") logs.push_back(it->path());
  std::sort(logs.begin(), logs.end());
  for (const fs::path& log : logs) {
    const std::string text = ReadTextFile(log);
    size_t begin = 0, line_number = 1;
    for (size_t end; (end = text.find('\n', begin)) != std::string::npos; begin = end + 1, ++line_number) {
      if (end == begin) continue;
      OutputItem item = ParseRecord(text.substr(begin, end - begin),
                                    "DatasetWriter: " + log.string() + " line " + std::to_string(line_number));
      const int64_t id = item.image_id;
      records[id] = std::move(item);
    }
  }
  return records;
}

// YOLO label text: one line per object, fractions with 6 decimals. An object with polygons is written as one polygon
// line (YOLO-seg allows one polygon per object; several parts are concatenated in order).
std::string YoloLabels(const OutputItem& item) {
  const double w = static_cast<double>(item.width), h = static_cast<double>(item.height);
  std::string text;
  for (const Object& o : item.objects) {
    text += std::to_string(o.category);
    if (!o.polygons.empty()) {
      for (const auto& polygon : o.polygons)
        for (size_t k = 0; k + 1 < polygon.size(); k += 2)
          text += " " + Fixed6(polygon[k] / w) + " " + Fixed6(polygon[k + 1] / h);
    } else {
      text += " " + Fixed6((o.x0 + o.x1) / 2 / w) + " " + Fixed6((o.y0 + o.y1) / 2 / h) + " " +
              Fixed6((o.x1 - o.x0) / w) + " " + Fixed6((o.y1 - o.y0) / h);
    }
    text += "\n";
  }
  return text;
}

std::string CocoAnnotations(std::vector<OutputItem> items, const std::vector<Category>& categories) {
  std::sort(items.begin(), items.end(),
            [](const OutputItem& a, const OutputItem& b) { return a.image_id < b.image_id; });
  // One JSON value per line: compact, yet diffable and greppable.
  std::string text = "{\"images\": [";
  for (size_t i = 0; i < items.size(); ++i) {
    const ordered_json image = {{"id", items[i].image_id},
                                {"file_name", items[i].file_name},
                                {"width", items[i].width},
                                {"height", items[i].height}};
    text += (i ? ",\n" : "\n") + image.dump();
  }
  text += "\n],\n\"annotations\": [";
  int64_t annotation_id = 0;
  for (const OutputItem& item : items) {
    for (const Object& o : item.objects) {
      const double bw = Round2(o.x1 - o.x0), bh = Round2(o.y1 - o.y0);
      ordered_json a = {{"id", ++annotation_id},
                        {"image_id", item.image_id},
                        {"category_id", o.category},
                        {"bbox", {Round2(o.x0), Round2(o.y0), bw, bh}},
                        {"area", Round2(bw * bh)}};
      ordered_json segmentation = ordered_json::array();
      for (const auto& polygon : o.polygons) {
        ordered_json points = ordered_json::array();
        for (double v : polygon) points.push_back(Round2(v));
        segmentation.push_back(std::move(points));
      }
      a["segmentation"] = std::move(segmentation);
      if (!o.keypoints.empty()) {
        ordered_json keypoints = ordered_json::array();
        int64_t labelled = 0;
        for (size_t k = 0; k + 2 < o.keypoints.size(); k += 3) {
          const auto v = static_cast<int64_t>(std::lround(o.keypoints[k + 2]));
          keypoints.push_back(Round2(o.keypoints[k]));
          keypoints.push_back(Round2(o.keypoints[k + 1]));
          keypoints.push_back(v);
          if (v > 0) ++labelled;
        }
        a["keypoints"] = std::move(keypoints);
        a["num_keypoints"] = labelled;
      }
      const json extra = ParseExtra(o.extra_json, item.file_name);
      for (auto it = extra.begin(); it != extra.end(); ++it)
        if (!a.contains(it.key())) a[it.key()] = it.value();
      if (!a.contains("iscrowd")) a["iscrowd"] = 0;  // pycocotools' evaluation requires it
      text += (annotation_id > 1 ? ",\n" : "\n") + a.dump();
    }
  }
  text += "\n],\n\"categories\": [";
  for (size_t i = 0; i < categories.size(); ++i) {
    ordered_json c = {{"id", categories[i].id}, {"name", categories[i].name}};
    if (!categories[i].keypoint_names.empty()) c["keypoints"] = categories[i].keypoint_names;
    if (!categories[i].skeleton.empty()) c["skeleton"] = categories[i].skeleton;
    text += (i ? ",\n" : "\n") + c.dump();
  }
  text += "\n]}\n";
  return text;
}

// classes.txt: line i is the name of class i; ids missing from the category list get the placeholder "class<i>".
std::string YoloClasses(const std::vector<Category>& categories) {
  std::map<int64_t, std::string> names;
  for (const Category& c : categories) names[c.id] = c.name;
  std::string text;
  const int64_t count = names.empty() ? 0 : names.rbegin()->first + 1;
  for (int64_t i = 0; i < count; ++i) {
    auto it = names.find(i);
    text += (it != names.end() ? it->second : "class" + std::to_string(i)) + "\n";
  }
  return text;
}

}  // namespace

// An output file_name must stay inside OUT/images: relative, no "..", no empty or "." segments.
void CheckOutputFileName(const std::string& file_name) {
  bool ok = !file_name.empty() && file_name.front() != '/' && file_name.find('\\') == std::string::npos &&
            file_name.find('\0') == std::string::npos;
  size_t start = 0;
  while (ok && start <= file_name.size()) {
    size_t end = file_name.find('/', start);
    if (end == std::string::npos) end = file_name.size();
    const std::string segment = file_name.substr(start, end - start);
    ok = !segment.empty() && segment != "." && segment != "..";
    start = end + 1;
  }
  if (!ok)
    throw Error(ErrorCode::kInvalidArgument, "output file name '" + file_name +
                                                 "' must be a relative path inside images/ (no '..', no leading '/')");
}

DatasetWriter::DatasetWriter(std::string out_dir, std::string format, std::vector<Category> categories)
    : out_dir_(std::move(out_dir)), format_(std::move(format)), categories_(std::move(categories)) {
  if (format_ != "coco" && format_ != "yolo")
    throw Error(ErrorCode::kInvalidArgument, "DatasetWriter: output format must be coco or yolo, got '" + format_ + "'");
  if (out_dir_.empty()) throw Error(ErrorCode::kInvalidArgument, "DatasetWriter: empty output folder");
  for (const Category& c : categories_) {
    if (format_ == "yolo" && (c.id < 0 || c.id > 1'000'000))
      throw Error(ErrorCode::kInvalidArgument, "DatasetWriter: YOLO class ids must be 0..1000000, category '" +
                                                   c.name + "' has id " + std::to_string(c.id));
    if (format_ == "yolo" && c.name.find_first_of("\r\n") != std::string::npos)
      throw Error(ErrorCode::kInvalidArgument, "DatasetWriter: YOLO class name with a line break: '" + c.name + "'");
  }
  const fs::path out(out_dir_);
  MakeDirectories(out / "images");
  MakeDirectories(out / kRecordsDir);
  MakeDirectories(out / kTempDir);
  if (format_ == "yolo") MakeDirectories(out / "labels");
  for (const auto& [id, item] : ReadRecords(out / kRecordsDir)) done_.insert(id);
}

DatasetWriter::~DatasetWriter() {
  if (log_fd_ >= 0) ::close(log_fd_);
}

bool DatasetWriter::IsDone(int64_t image_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_.count(image_id) > 0;
}

void DatasetWriter::AppendRecord(const std::string& line) {
  std::lock_guard<std::mutex> lock(mu_);
  if (log_fd_ < 0) {
    static std::atomic<uint64_t> counter{0};
    const auto now = std::chrono::system_clock::now().time_since_epoch();
    const fs::path path = fs::path(out_dir_) / kRecordsDir /
                          (std::to_string(::getpid()) + "-" +
                           std::to_string(std::chrono::duration_cast<std::chrono::nanoseconds>(now).count()) + "-" +
                           std::to_string(counter.fetch_add(1)) + ".jsonl");
    log_fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd_ < 0)
      throw Error(ErrorCode::kInvalidArgument, "cannot create " + path.string() + ": " + std::strerror(errno));
  }
  for (size_t done = 0; done < line.size();) {
    const ssize_t n = ::write(log_fd_, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      throw Error(ErrorCode::kResourceExhausted, "writing the item record log in " + out_dir_ + " failed (" +
                                                     std::strerror(errno) + "; disk full?)");
    done += static_cast<size_t>(n);
  }
}

void DatasetWriter::Write(const OutputItem& item, const std::string& encoded_image) {
  CheckOutputFileName(item.file_name);
  if (item.width <= 0 || item.height <= 0)
    throw Error(ErrorCode::kInvalidArgument, "DatasetWriter: " + item.file_name + ": image size must be positive, got " +
                                                 std::to_string(item.width) + " x " + std::to_string(item.height));
  for (const Object& o : item.objects) {
    CheckObject(o, item.file_name);
    if (format_ == "yolo" && o.category < 0)
      throw Error(ErrorCode::kInvalidArgument, "DatasetWriter: " + item.file_name + ": YOLO class must be >= 0, got " +
                                                   std::to_string(o.category));
  }
  const std::string record = RecordJson(item);  // validates extra_json before anything is written
  const fs::path out(out_dir_);
  WriteFileAtomic(out, out / "images" / item.file_name, encoded_image);
  if (format_ == "yolo")
    WriteFileAtomic(out, (out / "labels" / item.file_name).replace_extension(".txt"), YoloLabels(item));
  AppendRecord(record);
  std::lock_guard<std::mutex> lock(mu_);
  done_.insert(item.image_id);
}

int64_t DatasetWriter::CountDone() const {
  return static_cast<int64_t>(ReadRecords(fs::path(out_dir_) / kRecordsDir).size());
}

void DatasetWriter::Finish() const {
  const fs::path out(out_dir_);
  if (format_ == "yolo") {
    WriteFileAtomic(out, out / "classes.txt", YoloClasses(categories_));
    return;
  }
  std::vector<OutputItem> items;
  for (auto& [id, item] : ReadRecords(out / kRecordsDir)) items.push_back(std::move(item));
  WriteFileAtomic(out, out / "annotations.json", CocoAnnotations(std::move(items), categories_));
}

}  // namespace osprey::augment
