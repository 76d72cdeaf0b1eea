#pragma once
/// Detection datasets on disk (COCO and YOLO) for `osprey augment`, image encoding, preview drawing, and the dataset
/// runner behind `osprey augment` (RunDataset). See docs/augment.md for the layouts read and written.
#include <cstdint>
#include <mutex>
#include <ostream>
#include <string>
#include <unordered_set>
#include <vector>

#include "osprey/augment.h"
#include "osprey/tensor.h"

namespace osprey::augment {

struct Category {
  int64_t id = 0;  // COCO category id; for YOLO the class index
  std::string name;
  std::vector<std::string> keypoint_names;  // COCO "keypoints" of the category; may be empty
  std::vector<std::vector<int64_t>> skeleton;
};

/// One image of a dataset and its objects (coordinates as in augment::Object: absolute pixels).
struct DatasetItem {
  int64_t image_id = 0;     // COCO image id; for YOLO the index in sorted file order
  std::string file_name;    // path relative to the image folder, as the annotation names it (e.g. "a/b.jpg")
  std::string image_path;   // full path to read
  int64_t width = 0;        // from the annotation when it gives one (COCO), else 0 (known after decoding)
  int64_t height = 0;
  std::vector<Object> objects;
  /// Problems found while reading this item's annotations (e.g. "annotation 17: negative box width -3"). The item is
  /// still listed; the CLI reports these and counts the item as failed.
  std::vector<std::string> errors;
  /// Losses that are expected with some datasets and do not fail the item (e.g. COCO crowd RLE masks, which are
  /// dropped: the object keeps its box).
  std::vector<std::string> warnings;
  /// YOLO only: object boxes are in fractions until the image size is known (ResolveYolo converts them).
  bool normalized = false;
};

struct Dataset {
  std::string format;  // "coco" or "yolo"
  std::string root;    // what was opened
  std::vector<Category> categories;
  std::vector<DatasetItem> items;  // in a stable order: COCO image order as listed, YOLO sorted by file name
  /// Problems not tied to one listed image (e.g. "annotation 17: image_id 99 is not in images"); the CLI reports them.
  std::vector<std::string> errors;
};

/// Opens a dataset. `format` is "coco", "yolo" or "auto" (a .json file or a folder with annotations/*.json -> COCO; a
/// folder with images/ and labels/ -> YOLO). COCO: `path` is the annotation JSON (images are looked up next to it
/// in images/, then in the JSON's folder) or a folder holding annotations.json / annotations/*.json and images/.
/// YOLO: `path` is a folder with images/ and labels/ (files matched by stem, nested folders kept) and class names in
/// classes.txt, obj.names or data.yaml "names". A malformed annotation file throws kInvalidArgument saying where;
/// problems with single annotations go into DatasetItem::errors.
Dataset ReadDataset(const std::string& path, const std::string& format = "auto");

/// Refuses (kInvalidArgument) an item file_name that would not stay inside OUT/images when written: absolute, with
/// '..', '.' or empty segments, backslashes or NUL. ReadDataset checks every COCO file_name with it before any image is
/// read; DatasetWriter again before writing.
void CheckOutputFileName(const std::string& file_name);

/// YOLO boxes/polygons are stored as fractions: converts item's objects to pixels for an image of this size.
void ResolveYolo(DatasetItem& item, int64_t width, int64_t height);

/// Encodes uint8 [H, W, C] (C = 1 or 3) as "jpeg" (quality 1..100), "png" or "webp" (quality 1..100; 101 = lossless).
/// Throws kInvalidArgument for bad arguments.
std::string EncodeImage(const Tensor& image, const std::string& format, int quality = 95);
/// Format name from a file extension: .jpg/.jpeg -> "jpeg", .png -> "png", .webp -> "webp"; "" otherwise.
std::string ImageFormatFromExtension(const std::string& path);

/// One augmented output image ready to be written.
struct OutputItem {
  int64_t image_id = 0;
  std::string file_name;  // relative to the output images/ folder, e.g. "a/b_0003.jpg"
  int64_t width = 0, height = 0;
  std::vector<Object> objects;
};

/// Writes an augmented dataset in COCO or YOLO layout (docs/augment.md):
///   COCO: OUT/images/<file_name>, OUT/annotations.json
///   YOLO: OUT/images/<file_name>, OUT/labels/<stem>.txt, OUT/classes.txt
/// Crash-safe and resumable: each finished item's record is appended to this writer's log in
/// OUT/.osprey-augment/records/ after its image is renamed into place, so a record exists only for complete items.
/// IsDone() answers from the records present when the writer was made plus those it wrote. Finish() writes the
/// dataset-level files from all records present (COCO annotations.json sorted by image id). Thread-safe.
class DatasetWriter {
 public:
  /// `format` "coco" or "yolo"; `categories` are written as given.
  DatasetWriter(std::string out_dir, std::string format, std::vector<Category> categories);
  ~DatasetWriter();
  DatasetWriter(const DatasetWriter&) = delete;
  DatasetWriter& operator=(const DatasetWriter&) = delete;
  bool IsDone(int64_t image_id) const;
  /// Writes the encoded image bytes and the item's record.
  void Write(const OutputItem& item, const std::string& encoded_image);
  /// Number of item records present (from any process writing to the same folder).
  int64_t CountDone() const;
  /// Writes annotations.json (COCO) or classes.txt (YOLO) from every record present. Idempotent; atomic (rename).
  void Finish() const;
  const std::string& out_dir() const { return out_dir_; }

 private:
  void AppendRecord(const std::string& line);

  std::string out_dir_, format_;
  std::vector<Category> categories_;
  mutable std::mutex mu_;           // guards log_fd_ and done_
  int log_fd_ = -1;                 // this writer's record log, opened at the first Write
  std::unordered_set<int64_t> done_;
};

/// Draws the objects onto a copy of `image` (boxes as 2-px rectangles in a colour per category, polygons as outlines,
/// keypoints as dots) and returns it; for previews.
Tensor DrawObjects(const Tensor& image, const std::vector<Object>& objects);
/// Tiles images into a grid (cols = ceil(sqrt(n))), each scaled to fit a `cell` x `cell` square, uint8 RGB.
Tensor ContactSheet(const std::vector<Tensor>& images, int64_t cell = 320);

/// What `osprey augment` does, as options (docs/augment.md, "The CLI": each field is the option of the same name).
struct RunOptions {
  std::string pipeline;
  std::string input;
  std::string format = "auto";         // input: auto | coco | yolo
  std::string output;
  std::string output_format = "same";  // same | coco | yolo
  std::string image_format = "same";   // same | jpeg | png | webp
  int quality = 95;
  int64_t copies = 1;
  uint64_t seed = 0;
  int threads = 0;  // 0 = all cores
  std::string shard;  // "I/N", 0 <= I < N
  bool resume = false;
  int64_t preview = 0;
  std::string progress = "auto";  // auto | bar | lines | none
};

/// Augments a dataset (docs/augment.md): every (image, copy) through the pipeline on `threads` threads, resumable and
/// shardable, byte-identical output for a given seed. Progress and per-item problems go to `err`, the summary to
/// `out`. Returns 0 when every item was written without problems, 1 when any item failed or had annotation problems.
/// Throws osprey::Error for problems found before work starts (bad pipeline, unreadable dataset, bad options).
/// Calls UseHeapForImageBuffers.
int RunDataset(const RunOptions& options, std::ostream& out, std::ostream& err);

/// Process policy for augmentation runs: image-sized buffers come from malloc's heap (reused per item) instead of
/// per-buffer mappings (page faults per item). Called by RunDataset; the augmentation benchmarks call it too.
void UseHeapForImageBuffers();

}  // namespace osprey::augment
