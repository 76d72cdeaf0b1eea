// The dataset runner behind `osprey augment` (augment::RunDataset): a detection dataset through a pipeline, K copies
// per image, on T threads, resumable and shardable, with byte-identical output for a given seed whatever the thread
// count (docs/augment.md).
#include <fcntl.h>
#include <malloc.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iomanip>
#include <map>
#include <mutex>
#include <optional>
#include <ostream>
#include <sstream>
#include <thread>

#include "osprey/augment.h"
#include "osprey/dataset.h"
#include "osprey/error.h"
#include "osprey/image.h"

namespace osprey::augment {

namespace fs = std::filesystem;

namespace {

struct Shard {
  int64_t index = 0, count = 1;
};

Shard ParseShard(const std::string& text) {
  Shard s;
  if (text.empty()) return s;
  const size_t slash = text.find('/');
  try {
    if (slash == std::string::npos) throw std::invalid_argument("no slash");
    size_t p1 = 0, p2 = 0;
    s.index = std::stoll(text.substr(0, slash), &p1);
    s.count = std::stoll(text.substr(slash + 1), &p2);
    if (p1 != slash || p2 != text.size() - slash - 1) throw std::invalid_argument("junk");
  } catch (const std::exception&) {
    throw Error(ErrorCode::kInvalidArgument, "--shard: expected I/N (e.g. 0/4), found \"" + text + "\"");
  }
  if (s.count < 1 || s.index < 0 || s.index >= s.count)
    throw Error(ErrorCode::kInvalidArgument, "--shard " + text + ": need 0 <= I < N (shards are numbered from 0, as "
                                             "a Kubernetes Indexed Job's JOB_COMPLETION_INDEX)");
  return s;
}

std::string OutputExtension(const std::string& image_format, const std::string& source_name) {
  std::string f = image_format;
  if (f == "same") {
    f = ImageFormatFromExtension(source_name);
    if (f.empty()) f = "png";  // BMP and unknown sources become PNG (lossless)
  }
  if (f == "jpeg" || f == "jpg") return "jpg";
  if (f == "png") return "png";
  if (f == "webp") return "webp";
  throw Error(ErrorCode::kInvalidArgument, "--image-format: expected same, jpeg, png or webp, found \"" + f + "\"");
}

// "a/b.jpg", copy 3 -> "a/b_3.png"
std::string OutputName(const std::string& file_name, int64_t copy, const std::string& ext) {
  fs::path p(file_name);
  fs::path out = p.parent_path() / (p.stem().string() + "_" + std::to_string(copy) + "." + ext);
  return out.generic_string();
}

std::string FormatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "--:--";
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", (long long)(s / 3600), (long long)(s / 60 % 60), (long long)(s % 60));
  else
    std::snprintf(buf, sizeof buf, "%02lld:%02lld", (long long)(s / 60), (long long)(s % 60));
  return buf;
}

// Progress on stderr: a redrawn bar on a terminal, a plain line every few seconds otherwise.
class Progress {
 public:
  Progress(std::ostream& err, int64_t total, const std::string& mode) : err_(err), total_(total) {
    bar_ = mode == "bar" || (mode == "auto" && isatty(STDERR_FILENO));
    quiet_ = mode == "none";
    start_ = last_ = std::chrono::steady_clock::now();
  }
  void Tick(int64_t done, bool final = false) {
    if (quiet_) return;
    std::lock_guard<std::mutex> lock(mu_);
    const auto now = std::chrono::steady_clock::now();
    const double since = std::chrono::duration<double>(now - last_).count();
    if (!final && since < (bar_ ? 0.2 : 5.0)) return;
    last_ = now;
    const double elapsed = std::chrono::duration<double>(now - start_).count();
    const double rate = elapsed > 0 ? done / elapsed : 0;
    const double eta = rate > 0 ? (total_ - done) / rate : NAN;
    std::ostringstream line;
    line << std::fixed << std::setprecision(1);
    if (bar_) {
      const int width = 30;
      const int filled = total_ > 0 ? static_cast<int>(width * done / total_) : width;
      line << "\r[" << std::string(filled, '=') << (filled < width ? ">" : "")
           << std::string(std::max(0, width - filled - 1), ' ') << "] ";
    } else {
      line << "augment: ";
    }
    line << done << "/" << total_ << " (" << (total_ ? 100.0 * done / total_ : 100.0) << "%) " << rate
         << " images/s, ETA " << FormatDuration(eta) << ", elapsed " << FormatDuration(elapsed);
    err_ << line.str() << (bar_ ? (final ? "\n" : "") : "\n") << std::flush;
  }

 private:
  std::ostream& err_;
  int64_t total_;
  bool bar_ = false, quiet_ = false;
  std::chrono::steady_clock::time_point start_, last_;
  std::mutex mu_;
};

// Holds an exclusive flock on a file for its lifetime (serialises Finish across shard processes).
class FileLock {
 public:
  explicit FileLock(const std::string& path) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT, 0644);
    if (fd_ >= 0) ::flock(fd_, LOCK_EX);
  }
  ~FileLock() {
    if (fd_ >= 0) ::close(fd_);
  }

 private:
  int fd_ = -1;
};

// Windowed decoding (Pipeline::SourceWindow) is on unless OSPREY_AUGMENT_WINDOWS=0 (for measurements; the output is
// the same either way).
bool WindowsEnabled() {
  static const bool on = [] {
    const char* v = std::getenv("OSPREY_AUGMENT_WINDOWS");
    return v == nullptr || std::string(v) != "0";
  }();
  return on;
}

// The source image of an item with its objects. When `pipeline` is given and every application in `seeds` starts with
// a warp that reads only part of a JPEG, only the union of those parts is decoded (a window: the same output bytes,
// less decoding); otherwise the whole image.
Sample LoadSample(const DatasetItem& item, const Pipeline* pipeline = nullptr,
                  const std::vector<uint64_t>& seeds = {}) {
  DecodeOptions opts;
  opts.channels = 3;
  Sample s;
  DatasetItem copy = item;
  const std::vector<char> bytes = ReadImageBytes(item.image_path);
  int64_t width = 0, height = 0;
  bool windowed = pipeline != nullptr && !seeds.empty() && WindowsEnabled() &&
                  PeekImageSize(bytes.data(), bytes.size(), opts, &width, &height) &&
                  width * height <= opts.max_pixels;
  if (windowed) {
    if (copy.normalized) ResolveYolo(copy, width, height);
    std::array<int64_t, 4> all = {width, height, 0, 0}, one{};
    for (uint64_t seed : seeds) {
      windowed = pipeline->SourceWindow(width, height, 3, copy.objects, seed, &one);
      if (!windowed) break;
      all = {std::min(all[0], one[0]), std::min(all[1], one[1]), std::max(all[2], one[2]), std::max(all[3], one[3])};
    }
    if (windowed) {  // the decoder may hand back whole columns around the window (no copy): info says where
      opts.region_x = all[0], opts.region_y = all[1];
      opts.region_width = all[2] - all[0], opts.region_height = all[3] - all[1];
      opts.region_may_widen = true;
    }
  }
  DecodeInfo info;
  try {
    s.image = DecodeImage(bytes.data(), bytes.size(), opts, &info);
  } catch (const Error& e) {
    throw Error(e.code(), item.image_path + ": " + e.what());
  }
  if (windowed) {
    s.source_width = width, s.source_height = height;
    s.window_x = info.region_x, s.window_y = info.region_y;
  }
  if (copy.normalized) ResolveYolo(copy, s.image.dim(1), s.image.dim(0));
  s.objects = std::move(copy.objects);
  return s;
}

}  // namespace

void UseHeapForImageBuffers() {
  // Every item allocates and frees image-sized buffers: take them from malloc's heap, reused from item to item, rather
  // than fresh mappings that are page-faulted in and unmapped per item (~10% of the run). The heap stays bounded by the
  // largest images in flight (bench/augment_flat: RSS growth over 60,000 images).
  // glibc's own threshold is fixed at its maximum (32 MiB; larger values are refused), so images of varying size
  // (malloc'd by the decoders and encoders) reuse heap memory too: bench/augment_flat 1.78 instead of 2.57 ms per
  // image, for 6.6 MiB of RSS growth over 60,000 images (2.4 MiB with the dynamic threshold).
  Allocator::SetMmapThreshold(size_t{1} << 30);
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1024 << 20);
}

int RunDataset(const RunOptions& o, std::ostream& out, std::ostream& err) {
  // Everything that can be wrong with the request is checked before any work starts.
  const Shard shard = ParseShard(o.shard);
  const Pipeline pipeline = Pipeline::FromFile(o.pipeline);
  if (pipeline.returns_float())
    throw Error(ErrorCode::kUnsupported,
                "--pipeline " + o.pipeline +
                    ": the pipeline ends in Normalize, which makes "
                    "float32 images, and osprey augment writes jpeg, png or webp (uint8) files; "
                    "remove Normalize to write a dataset, or normalize when training (the Python "
                    "osprey.augment.Pipeline returns the float32 array)");
  Dataset ds = ReadDataset(o.input, o.format);
  const std::string out_format = o.output_format == "same" ? ds.format : o.output_format;
  if (fs::exists(o.output) && !fs::is_directory(o.output))
    throw Error(ErrorCode::kInvalidArgument, "--output " + o.output + " exists and is not a folder");
  if (fs::exists(o.output) && !fs::is_empty(o.output) && !o.resume)
    throw Error(ErrorCode::kInvalidArgument, "--output " + o.output + " is not empty; pass --resume to continue an "
                                             "interrupted run there, or choose a new folder");
  if (ds.items.empty()) throw Error(ErrorCode::kInvalidArgument, o.input + ": the dataset has no images");
  if (pipeline.images_needed() > 1 && ds.items.size() < 2)
    throw Error(ErrorCode::kInvalidArgument, "the pipeline starts with Mosaic, which needs at least 2 images");
  for (const DatasetItem& item : ds.items) OutputExtension(o.image_format, item.file_name);  // validates the format

  // Category ids: YOLO class indices are positions in the category list.
  std::vector<Category> categories = ds.categories;
  std::sort(categories.begin(), categories.end(), [](const Category& a, const Category& b) { return a.id < b.id; });
  std::map<int64_t, int64_t> id_map;  // source category id -> output category id
  for (size_t i = 0; i < categories.size(); ++i)
    id_map[categories[i].id] = (out_format == "yolo" && ds.format == "coco") ? static_cast<int64_t>(i) : categories[i].id;
  if (out_format == "yolo" && ds.format == "coco")
    for (size_t i = 0; i < categories.size(); ++i) categories[i].id = static_cast<int64_t>(i);

  DatasetWriter writer(o.output, out_format, categories);
  const int64_t n = static_cast<int64_t>(ds.items.size()), k = o.copies;
  std::vector<int64_t> work;  // work index w = item * copies + copy; image id = w + 1
  for (int64_t w = 0; w < n * k; ++w)
    if (w % shard.count == shard.index) work.push_back(w);
  int64_t already = 0;
  std::vector<int64_t> todo;
  for (int64_t w : work) {
    if (writer.IsDone(w + 1))
      ++already;
    else
      todo.push_back(w);
  }

  const int threads = o.threads > 0 ? o.threads : std::max(1u, std::thread::hardware_concurrency());
  UseHeapForImageBuffers();
  out << "augment: " << n << " images x " << k << " copies = " << n * k << " outputs";
  if (shard.count > 1) out << "; shard " << shard.index << "/" << shard.count << ": " << work.size();
  if (already) out << "; " << already << " already done, " << todo.size() << " to do";
  out << "; " << threads << " thread" << (threads == 1 ? "" : "s") << " -> " << o.output << " (" << out_format
      << ")\n"
      << std::flush;

  // Annotation problems found while reading are reported once per item.
  int64_t items_with_problems = 0, warnings = 0;
  for (const std::string& e : ds.errors) err << "augment: " << o.input << ": " << e << "\n";
  for (const DatasetItem& item : ds.items) {
    for (const std::string& w : item.warnings) err << "augment: warning: " << item.file_name << ": " << w << "\n";
    warnings += static_cast<int64_t>(item.warnings.size());
  }
  for (const DatasetItem& item : ds.items)
    if (!item.errors.empty()) {
      ++items_with_problems;
      for (const std::string& e : item.errors) err << "augment: " << item.file_name << ": " << e << "\n";
    }

  std::atomic<int64_t> next{0}, done{0}, written{0}, dropped{0}, objects_in{0};
  std::mutex fail_mu;
  std::map<int64_t, std::string> failures;  // work index -> message (sorted: deterministic report)
  std::map<int64_t, std::pair<Tensor, std::vector<Object>>> previews;
  const int64_t preview_count = std::min<int64_t>(o.preview, static_cast<int64_t>(todo.size()));
  Progress progress(err, static_cast<int64_t>(todo.size()), o.progress);

  // Work goes out by source image: a worker takes every pending copy of one image, so the source is read and decoded
  // once for all its copies.
  std::vector<std::pair<size_t, size_t>> groups;  // [begin, end) ranges of todo with the same source image
  for (size_t b = 0; b < todo.size();) {
    size_t e = b + 1;
    while (e < todo.size() && todo[e] / k == todo[b] / k) ++e;
    groups.emplace_back(b, e);
    b = e;
  }
  auto worker = [&] {
    for (;;) {
      const int64_t g = next.fetch_add(1);
      if (g >= static_cast<int64_t>(groups.size())) return;
      std::optional<Sample> source;
      std::string source_error;
      for (size_t t = groups[g].first; t < groups[g].second; ++t) {
        const int64_t w = todo[t], i = w / k, copy = w % k;
        const DatasetItem& item = ds.items[i];
        try {
          if (!source && source_error.empty()) {
            try {
              std::vector<uint64_t> seeds;  // every copy of this image still to do
              for (size_t u = t; u < groups[g].second; ++u)
                seeds.push_back(ItemSeed(o.seed, static_cast<uint64_t>(i), static_cast<uint64_t>(todo[u] % k)));
              source = LoadSample(item, &pipeline, seeds);
            } catch (const std::exception& e) {
              source_error = e.what();
            }
          }
          if (!source) throw Error(ErrorCode::kInvalidArgument, source_error);
          const Sample& in = *source;
          const uint64_t seed = ItemSeed(o.seed, static_cast<uint64_t>(i), static_cast<uint64_t>(copy));
          auto others = [&](int j) {
            const uint64_t s = ItemSeed(seed, 0x4d6f73616963ull /* "Mosaic" */, static_cast<uint64_t>(j));
            int64_t pick = static_cast<int64_t>(s % static_cast<uint64_t>(n - 1));
            if (pick >= i) ++pick;  // never the item itself
            try {
              return LoadSample(ds.items[pick]);
            } catch (const Error& e) {
              throw Error(e.code(), "Mosaic tile " + ds.items[pick].file_name + ": " + e.what());
            }
          };
          ApplyReport report;
          Sample res = pipeline.Apply(in, seed, others, &report);
          OutputItem oi;
          oi.image_id = w + 1;
          oi.file_name = OutputName(item.file_name, copy, OutputExtension(o.image_format, item.file_name));
          oi.width = res.image.dim(1), oi.height = res.image.dim(0);
          for (Object& obj : res.objects) {
            auto it = id_map.find(obj.category);
            if (it != id_map.end()) obj.category = it->second;
          }
          oi.objects = res.objects;
          const std::string ext = fs::path(oi.file_name).extension().string().substr(1);
          const std::string fmt = ext == "jpg" ? "jpeg" : ext;
          writer.Write(oi, EncodeImage(res.image, fmt, o.quality));
          ++written;
          dropped += report.objects_dropped;
          objects_in += report.objects_in;
          if (static_cast<int64_t>(t) < preview_count) {
            std::lock_guard<std::mutex> lock(fail_mu);
            previews[t] = {res.image, res.objects};
          }
        } catch (const std::exception& e) {
          std::lock_guard<std::mutex> lock(fail_mu);
          failures[w] = item.file_name + (k > 1 ? " (copy " + std::to_string(copy) + ")" : "") + ": " + e.what();
        }
        progress.Tick(++done);
      }
    }
  };
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(worker);
  for (std::thread& t : pool) t.join();
  progress.Tick(done.load(), true);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  {
    fs::create_directories(fs::path(o.output) / ".osprey-augment");
    FileLock lock((fs::path(o.output) / ".osprey-augment" / "finish.lock").string());
    writer.Finish();
  }
  const int64_t total_done = writer.CountDone();

  if (!previews.empty()) {
    std::vector<Tensor> tiles;
    for (auto& [t, p] : previews) tiles.push_back(DrawObjects(p.first, p.second));
    const Tensor sheet = ContactSheet(tiles);
    const std::string path = (fs::path(o.output) / "preview.png").string();
    const std::string png = EncodeImage(sheet, "png");
    FILE* f = std::fopen(path.c_str(), "wb");
    if (!f || std::fwrite(png.data(), 1, png.size(), f) != png.size()) {
      if (f) std::fclose(f);
      throw Error(ErrorCode::kUnavailable, "cannot write " + path);
    }
    std::fclose(f);
    out << "augment: preview of " << tiles.size() << " samples: " << path << "\n";
  }

  for (const auto& [w, msg] : failures) err << "augment: failed: " << msg << "\n";
  out << std::fixed << std::setprecision(1) << "augment: wrote " << written.load() << " images in " << secs << " s ("
      << (secs > 0 ? written.load() / secs : 0.0) << " images/s)";
  if (already) out << ", " << already << " were already done";
  out << "; objects " << objects_in.load() << " in, " << dropped.load() << " dropped by the pipeline";
  out << "; " << failures.size() << " failed";
  if (items_with_problems) out << "; " << items_with_problems << " images had annotation problems";
  if (!ds.errors.empty()) out << "; " << ds.errors.size() << " annotations belong to no image";
  if (warnings) out << "; " << warnings << " warnings";
  out << "\naugment: " << total_done << " of " << n * k << " outputs present in " << o.output;
  if (total_done < n * k && shard.count > 1) out << " (the other shards write the rest)";
  out << "\n";
  return failures.empty() && items_with_problems == 0 && ds.errors.empty() ? 0 : 1;
}

}  // namespace osprey::augment
