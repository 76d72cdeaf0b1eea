// Datasets on disk (src/augment/dataset.cc, dataset_writer.cc), image encoding (encode.cc) and preview drawing
// (draw.cc). Oracles: file contents and numbers computed by hand in each test (the COCO / YOLO layouts of
// docs/augment.md), osprey::DecodeImage for encoder round trips (exact for PNG and lossless WebP, PSNR for JPEG), the
// JPEG SOF0 header bytes for chroma subsampling, and pixel sets derived from the documented outline rule.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "osprey/dataset.h"
#include "osprey/image.h"

namespace osprey::augment {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// Folders made by FreshDir, removed when the test program ends.
class TempFolders : public ::testing::Environment {
 public:
  static std::vector<fs::path>& List() {
    static std::vector<fs::path> list;
    return list;
  }
  void TearDown() override {
    if (std::getenv("OSPREY_KEEP_TEST_DIRS")) return;  // for looking at what was written
    std::error_code ec;
    for (const fs::path& dir : List()) fs::remove_all(dir, ec);
  }
};
const auto* const kTempFolders = ::testing::AddGlobalTestEnvironment(new TempFolders);

// A fresh folder per test and name under the gtest temp dir.
fs::path FreshDir(const std::string& name) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  fs::path dir = fs::path(::testing::TempDir()) / ("osprey-dataset-" + std::to_string(::getpid()) + "-" +
                                                  info->test_suite_name() + "." + info->name() + "-" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  TempFolders::List().push_back(dir);
  return dir;
}

void WriteText(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary);
  out << text;
}

std::string ReadText(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Every file under `dir` (relative path -> bytes).
// Every file under `dir` but the writer's bookkeeping (.osprey-augment: record logs named by process and time).
std::map<std::string, std::string> Snapshot(const fs::path& dir) {
  std::map<std::string, std::string> files;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    const std::string name = entry.path().lexically_relative(dir).generic_string();
    if (entry.is_regular_file() && name.rfind(".osprey-augment/", 0) != 0) files[name] = ReadText(entry.path());
  }
  return files;
}

// The record log lines under OUT/.osprey-augment/records (all logs).
std::vector<std::string> RecordLines(const fs::path& out) {
  std::vector<std::string> lines;
  for (const auto& entry : fs::directory_iterator(out / ".osprey-augment" / "records")) {
    std::istringstream text(ReadText(entry.path()));
    for (std::string line; std::getline(text, line);) lines.push_back(line);
  }
  return lines;
}

Tensor Image(int64_t h, int64_t w, int64_t c, const std::function<uint8_t(int64_t, int64_t, int64_t)>& f) {
  Tensor t(DType::kU8, {h, w, c});
  uint8_t* p = t.data<uint8_t>();
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x)
      for (int64_t k = 0; k < c; ++k) p[(y * w + x) * c + k] = f(y, x, k);
  return t;
}

Tensor NoiseImage(int64_t h, int64_t w, int64_t c, uint32_t seed) {
  uint32_t state = seed;
  return Image(h, w, c, [&](int64_t, int64_t, int64_t) {
    state = state * 1664525u + 1013904223u;
    return static_cast<uint8_t>(state >> 24);
  });
}

Tensor SmoothImage(int64_t h, int64_t w) {
  return Image(h, w, 3, [&](int64_t y, int64_t x, int64_t k) {
    const double v = 128 + 100 * std::sin(0.11 * x + 0.07 * y + 1.3 * k) * std::cos(0.05 * y - 0.4 * k);
    return static_cast<uint8_t>(std::lround(v));
  });
}

std::vector<uint8_t> Bytes(const Tensor& t) {
  return std::vector<uint8_t>(t.data<uint8_t>(), t.data<uint8_t>() + t.numel());
}

Tensor Decode(const std::string& bytes, int channels) {
  DecodeOptions options;
  options.channels = channels;
  return DecodeImage(bytes.data(), bytes.size(), options);
}

double Psnr(const Tensor& a, const Tensor& b) {
  double se = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double d = double(a.data<uint8_t>()[i]) - double(b.data<uint8_t>()[i]);
    se += d * d;
  }
  const double mse = se / static_cast<double>(a.numel());
  return mse == 0 ? 99.0 : 10 * std::log10(255.0 * 255.0 / mse);
}

template <class F>
std::string ErrorOf(F&& f, ErrorCode expected_code) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(static_cast<int>(e.code()), static_cast<int>(expected_code)) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected an osprey::Error";
  return "";
}

bool Contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

bool AnyContains(const std::vector<std::string>& lines, const std::string& part) {
  return std::any_of(lines.begin(), lines.end(), [&](const std::string& l) { return Contains(l, part); });
}

Object Box(double x0, double y0, double x1, double y1, int64_t category) {
  Object o;
  o.x0 = x0;
  o.y0 = y0;
  o.x1 = x1;
  o.y1 = y1;
  o.category = category;
  return o;
}

const std::string& PngBytes() {
  static const std::string bytes = EncodeImage(NoiseImage(4, 5, 3, 7), "png");
  return bytes;
}

// ---------------------------------------------------------------------------------------------------------------------
// COCO

std::vector<Category> CocoCategories() {
  Category person{1, "person", {"nose", "left_eye"}, {{1, 2}}};
  Category car{3, "car", {}, {}};
  return {person, car};
}

std::vector<OutputItem> CocoItems() {
  OutputItem a;
  a.image_id = 7;
  a.file_name = "sub/b_0001.png";
  a.width = 64;
  a.height = 48;
  Object person = Box(10.126, 5, 40.5, 30.25, 1);
  person.polygons = {{10.126, 5, 40.5, 5, 40.5, 30.25}};
  person.keypoints = {12.5, 6.25, 2, 0, 0, 0};
  person.source_id = 17;
  person.extra_json = R"({"iscrowd":0,"note":"kept"})";
  a.objects = {person, Box(0, 0, 8, 8, 3)};
  OutputItem b;
  b.image_id = 2;
  b.file_name = "a.png";
  b.width = 32;
  b.height = 32;
  b.objects = {Box(1, 2, 4, 6, 3)};
  return {a, b};
}

TEST(DatasetCoco, WriteThenReadRoundTrip) {
  const fs::path out = FreshDir("out");
  DatasetWriter writer(out.string(), "coco", CocoCategories());
  for (const OutputItem& item : CocoItems()) writer.Write(item, PngBytes());
  writer.Finish();

  // The file as written: images by id, annotations numbered in that order, boxes rounded to 2 decimals.
  const std::string text = ReadText(out / "annotations.json");
  EXPECT_TRUE(Contains(text, R"("bbox":[10.13,5.0,30.37,25.25],"area":766.84)")) << text;
  EXPECT_TRUE(Contains(text, R"("segmentation":[[10.13,5.0,40.5,5.0,40.5,30.25]])")) << text;
  EXPECT_TRUE(Contains(text, R"("keypoints":[12.5,6.25,2,0.0,0.0,0],"num_keypoints":1)")) << text;
  const json doc = json::parse(text);
  ASSERT_EQ(doc["images"].size(), 2u);
  EXPECT_EQ(doc["images"][0]["id"], 2);
  EXPECT_EQ(doc["images"][1]["file_name"], "sub/b_0001.png");
  ASSERT_EQ(doc["annotations"].size(), 3u);
  EXPECT_EQ(doc["annotations"][0]["id"], 1);
  EXPECT_EQ(doc["annotations"][0]["image_id"], 2);
  EXPECT_EQ(doc["annotations"][0]["bbox"], json::parse("[1.0, 2.0, 3.0, 4.0]"));
  EXPECT_EQ(doc["annotations"][0]["area"], 12.0);
  EXPECT_EQ(doc["annotations"][0]["iscrowd"], 0);
  EXPECT_EQ(doc["annotations"][1]["id"], 2);
  EXPECT_EQ(doc["annotations"][1]["note"], "kept");
  EXPECT_EQ(doc["categories"][0]["keypoints"], json::parse(R"(["nose", "left_eye"])"));
  EXPECT_EQ(doc["categories"][0]["skeleton"], json::parse("[[1, 2]]"));

  const Dataset read = ReadDataset(out.string());
  EXPECT_EQ(read.format, "coco");
  EXPECT_TRUE(read.errors.empty());
  ASSERT_EQ(read.categories.size(), 2u);
  EXPECT_EQ(read.categories[0].id, 1);
  EXPECT_EQ(read.categories[0].keypoint_names, (std::vector<std::string>{"nose", "left_eye"}));
  EXPECT_EQ(read.categories[0].skeleton, (std::vector<std::vector<int64_t>>{{1, 2}}));
  EXPECT_EQ(read.categories[1].name, "car");
  ASSERT_EQ(read.items.size(), 2u);
  EXPECT_EQ(read.items[0].image_id, 2);
  const DatasetItem& item = read.items[1];
  EXPECT_TRUE(item.errors.empty());
  EXPECT_FALSE(item.normalized);
  EXPECT_EQ(item.image_id, 7);
  EXPECT_EQ(item.file_name, "sub/b_0001.png");
  EXPECT_EQ(fs::path(item.image_path), out / "images" / "sub" / "b_0001.png");
  EXPECT_EQ(item.width, 64);
  EXPECT_EQ(item.height, 48);
  ASSERT_EQ(item.objects.size(), 2u);
  const Object& person = item.objects[0];
  EXPECT_NEAR(person.x0, 10.13, 1e-9);
  EXPECT_NEAR(person.y0, 5, 1e-9);
  EXPECT_NEAR(person.x1, 40.5, 1e-9);
  EXPECT_NEAR(person.y1, 30.25, 1e-9);
  EXPECT_EQ(person.category, 1);
  EXPECT_EQ(person.source_id, 2);  // the written annotation id
  ASSERT_EQ(person.polygons.size(), 1u);
  EXPECT_EQ(person.polygons[0], (std::vector<double>{10.13, 5, 40.5, 5, 40.5, 30.25}));
  EXPECT_EQ(person.keypoints, (std::vector<double>{12.5, 6.25, 2, 0, 0, 0}));
  EXPECT_EQ(person.extra_json, R"({"iscrowd":0,"note":"kept"})");
  EXPECT_EQ(item.objects[1].category, 3);
  EXPECT_EQ(item.objects[1].x1, 8);
  EXPECT_EQ(item.objects[1].extra_json, R"({"iscrowd":0})");
}

TEST(DatasetCoco, WholeFileProblemsThrowWithThePath) {
  const fs::path dir = FreshDir("bad");
  WriteText(dir / "truncated.json", R"({"images": [{"id": 1, "file_name": "a.jpg",)");
  std::string message = ErrorOf([&] { ReadDataset((dir / "truncated.json").string()); }, ErrorCode::kInvalidArgument);
  EXPECT_TRUE(Contains(message, "truncated.json")) << message;
  EXPECT_TRUE(Contains(message, "not valid JSON")) << message;

  WriteText(dir / "noimages.json", R"({"annotations": []})");
  message = ErrorOf([&] { ReadDataset((dir / "noimages.json").string()); }, ErrorCode::kInvalidArgument);
  EXPECT_TRUE(Contains(message, "noimages.json")) << message;
  EXPECT_TRUE(Contains(message, "no \"images\" array")) << message;

  WriteText(dir / "dupe.json", R"({"images": [{"id": 1, "file_name": "a.jpg"}, {"id": 1, "file_name": "b.jpg"}]})");
  message = ErrorOf([&] { ReadDataset((dir / "dupe.json").string()); }, ErrorCode::kInvalidArgument);
  EXPECT_TRUE(Contains(message, "images[1]: duplicate image id 1")) << message;

  message = ErrorOf([&] { ReadDataset((dir / "missing.json").string()); }, ErrorCode::kNotFound);
  EXPECT_TRUE(Contains(message, "missing.json")) << message;
  fs::create_directories(dir / "empty");
  message = ErrorOf([&] { ReadDataset((dir / "empty").string()); }, ErrorCode::kInvalidArgument);
  EXPECT_TRUE(Contains(message, "cannot tell the format")) << message;
}

TEST(DatasetCoco, BadAnnotationsBecomeErrorsAndTheItemStays) {
  const fs::path dir = FreshDir("bad");
  WriteText(dir / "annotations.json", R"({
    "images": [{"id": 1, "file_name": "a.jpg", "width": 100, "height": 50}],
    "categories": [{"id": 1, "name": "thing"}],
    "annotations": [
      {"id": 5, "image_id": 1, "category_id": 1, "bbox": [10, 10, -3, 5]},
      {"id": 6, "image_id": 99, "category_id": 1, "bbox": [1, 1, 2, 2]},
      {"id": 7, "image_id": 1, "category_id": 1, "bbox": [1, 2, 3]},
      {"id": 8, "image_id": 1, "category_id": 1, "bbox": [200, 10, 5, 5]},
      {"id": 9, "image_id": 1, "category_id": 1, "bbox": [1, 1, 5, 5], "iscrowd": 1,
       "segmentation": {"counts": "abc", "size": [50, 100]}},
      {"id": 10, "image_id": 1, "category_id": 42, "bbox": [1, 1, 5, 5]},
      {"id": 11, "image_id": 1, "category_id": 1, "bbox": [0, 0, 10, 10], "segmentation": [[0, 0, 10, 0, 10]]}
    ]})");
  const Dataset d = ReadDataset(dir.string());
  ASSERT_EQ(d.items.size(), 1u);
  const DatasetItem& item = d.items[0];
  EXPECT_EQ(fs::path(item.image_path), dir / "images" / "a.jpg");  // not found anywhere: the first place looked
  const auto& e = item.errors;
  ASSERT_EQ(e.size(), 5u) << ::testing::PrintToString(e);
  EXPECT_TRUE(AnyContains(e, "annotation 5: negative box width -3")) << ::testing::PrintToString(e);
  EXPECT_TRUE(AnyContains(e, "annotation 7: 'bbox' must be 4 finite numbers")) << ::testing::PrintToString(e);
  EXPECT_TRUE(AnyContains(e, "annotation 8: box [200,10,5,5] lies entirely outside the 100 x 50 image"))
      << ::testing::PrintToString(e);
  ASSERT_EQ(item.warnings.size(), 1u) << ::testing::PrintToString(item.warnings);
  EXPECT_TRUE(AnyContains(item.warnings, "annotation 9: RLE segmentation is not supported"));
  EXPECT_TRUE(AnyContains(e, "annotation 10: category_id 42 is not in categories")) << ::testing::PrintToString(e);
  EXPECT_TRUE(AnyContains(e, "annotation 11: segmentation[0] must be an even count")) << ::testing::PrintToString(e);
  ASSERT_EQ(d.errors.size(), 1u);
  EXPECT_TRUE(Contains(d.errors[0], "annotation 6: image_id 99 is not in images")) << d.errors[0];
  // RLE: the object keeps its box and its extra fields; a bad polygon is dropped, its object kept.
  ASSERT_EQ(item.objects.size(), 2u);
  EXPECT_EQ(item.objects[0].source_id, 9);
  EXPECT_EQ(item.objects[0].x1, 6);
  EXPECT_TRUE(item.objects[0].polygons.empty());
  EXPECT_EQ(item.objects[0].extra_json, R"({"iscrowd":1})");
  EXPECT_EQ(item.objects[1].source_id, 11);
  EXPECT_TRUE(item.objects[1].polygons.empty());
}

TEST(DatasetCoco, FindsTheJsonAndTheImagesInCommonLayouts) {
  const fs::path root = FreshDir("coco");
  WriteText(root / "annotations" / "instances_val2017.json",
            R"({"images": [{"id": 3, "file_name": "a.jpg"}, {"id": 4, "file_name": "b.jpg"}]})");
  WriteText(root / "val2017" / "a.jpg", "x");  // COCO's own layout
  WriteText(root / "images" / "b.jpg", "x");   // the documented one, looked at first
  WriteText(root / "val2017" / "b.jpg", "x");
  const Dataset d = ReadDataset(root.string());  // a folder with annotations/ holding one .json
  EXPECT_EQ(d.format, "coco");
  ASSERT_EQ(d.items.size(), 2u);
  EXPECT_EQ(fs::path(d.items[0].image_path), root / "val2017" / "a.jpg");
  EXPECT_EQ(fs::path(d.items[1].image_path), root / "images" / "b.jpg");
  EXPECT_EQ(d.items[0].width, 0);  // not given: known after decoding
  WriteText(root / "annotations" / "instances_train2017.json", R"({"images": []})");
  const std::string message = ErrorOf([&] { ReadDataset(root.string()); }, ErrorCode::kInvalidArgument);
  EXPECT_TRUE(Contains(message, "several annotation files")) << message;
  EXPECT_TRUE(Contains(message, "instances_train2017.json, instances_val2017.json")) << message;
}

// ---------------------------------------------------------------------------------------------------------------------
// YOLO

TEST(DatasetYolo, WriteThenReadRoundTrip) {
  const fs::path out = FreshDir("out");
  DatasetWriter writer(out.string(), "yolo", {{0, "cat", {}, {}}, {1, "dog", {}, {}}});
  OutputItem a;
  a.image_id = 0;
  a.file_name = "x/a.png";
  a.width = 200;
  a.height = 100;
  Object dog = Box(50, 25, 150, 75, 1);
  dog.polygons = {{50, 25, 150, 25, 100, 75}};
  a.objects = {Box(20, 10, 60, 50, 0), dog};
  OutputItem b;
  b.image_id = 1;
  b.file_name = "b.png";
  b.width = 10;
  b.height = 10;
  writer.Write(a, PngBytes());
  writer.Write(b, PngBytes());
  writer.Finish();
  // Hand-computed: cx = 40 / 200, cy = 30 / 100, w = 40 / 200, h = 40 / 100; the polygon divided by (200, 100).
  EXPECT_EQ(ReadText(out / "labels" / "x" / "a.txt"),
            "0 0.200000 0.300000 0.200000 0.400000\n1 0.250000 0.250000 0.750000 0.250000 0.500000 0.750000\n");
  EXPECT_EQ(ReadText(out / "labels" / "b.txt"), "");
  EXPECT_EQ(ReadText(out / "classes.txt"), "cat\ndog\n");

  Dataset read = ReadDataset(out.string());
  EXPECT_EQ(read.format, "yolo");
  ASSERT_EQ(read.categories.size(), 2u);
  EXPECT_EQ(read.categories[1].id, 1);
  EXPECT_EQ(read.categories[1].name, "dog");
  ASSERT_EQ(read.items.size(), 2u);
  EXPECT_EQ(read.items[0].file_name, "b.png");  // sorted by file name
  EXPECT_TRUE(read.items[0].objects.empty());
  DatasetItem& item = read.items[1];
  EXPECT_EQ(item.image_id, 1);
  EXPECT_EQ(item.file_name, "x/a.png");
  EXPECT_EQ(fs::path(item.image_path), out / "images" / "x" / "a.png");
  EXPECT_TRUE(item.normalized);
  EXPECT_TRUE(item.errors.empty());
  ASSERT_EQ(item.objects.size(), 2u);
  EXPECT_NEAR(item.objects[0].x0, 0.1, 1e-9);
  EXPECT_NEAR(item.objects[0].y1, 0.5, 1e-9);
  ResolveYolo(item, 200, 100);
  EXPECT_FALSE(item.normalized);
  EXPECT_EQ(item.width, 200);
  EXPECT_EQ(item.height, 100);
  const Object& box = item.objects[0];
  EXPECT_EQ(box.category, 0);
  EXPECT_NEAR(box.x0, 20, 1e-9);
  EXPECT_NEAR(box.y0, 10, 1e-9);
  EXPECT_NEAR(box.x1, 60, 1e-9);
  EXPECT_NEAR(box.y1, 50, 1e-9);
  const Object& poly = item.objects[1];
  EXPECT_EQ(poly.category, 1);
  ASSERT_EQ(poly.polygons.size(), 1u);
  const std::vector<double> expected = {50, 25, 150, 25, 100, 75};
  for (size_t k = 0; k < expected.size(); ++k) EXPECT_NEAR(poly.polygons[0][k], expected[k], 1e-9) << k;
  EXPECT_NEAR(poly.x0, 50, 1e-9);  // box = the polygon's bounds
  EXPECT_NEAR(poly.y0, 25, 1e-9);
  EXPECT_NEAR(poly.x1, 150, 1e-9);
  EXPECT_NEAR(poly.y1, 75, 1e-9);
}

TEST(DatasetYolo, MalformedLinesNameFileAndLine) {
  const fs::path root = FreshDir("yolo");
  WriteText(root / "images" / "a.png", PngBytes());
  WriteText(root / "images" / "nolabel.jpg", PngBytes());
  WriteText(root / "images" / "notes.txt", "not an image");
  WriteText(root / "classes.txt", "a\nb\n");
  WriteText(root / "labels" / "a.txt",
            "0 0.5 0.5 0.2 0.2\n"
            "1 0.5 0.5 0.2\n"
            "x 0.5 0.5 0.2 0.2\n"
            "0 0.5 abc 0.2 0.2\n"
            "5 0.5 0.5 0.2 0.2\n"
            "\n"
            "0 0.1 0.1 -0.2 0.2\n");
  const Dataset d = ReadDataset(root.string(), "yolo");
  ASSERT_EQ(d.items.size(), 2u);
  const auto& e = d.items[0].errors;
  EXPECT_EQ(d.items[0].objects.size(), 1u);
  ASSERT_EQ(e.size(), 5u) << ::testing::PrintToString(e);
  EXPECT_TRUE(AnyContains(e, "a.txt:2: expected 'class cx cy w h'")) << ::testing::PrintToString(e);
  EXPECT_TRUE(AnyContains(e, "got 4 values")) << ::testing::PrintToString(e);
  EXPECT_TRUE(AnyContains(e, "a.txt:3: class 'x' is not a non-negative integer")) << ::testing::PrintToString(e);
  EXPECT_TRUE(AnyContains(e, "a.txt:4: value 3 'abc' is not a finite number")) << ::testing::PrintToString(e);
  EXPECT_TRUE(AnyContains(e, "a.txt:5: class 5 has no name")) << ::testing::PrintToString(e);
  EXPECT_TRUE(AnyContains(e, "a.txt:7: negative box width -0.2")) << ::testing::PrintToString(e);
  EXPECT_EQ(d.items[1].file_name, "nolabel.jpg");
  EXPECT_TRUE(d.items[1].objects.empty());
  EXPECT_TRUE(d.items[1].errors.empty());

  fs::remove(root / "classes.txt");
  const std::string message = ErrorOf([&] { ReadDataset(root.string()); }, ErrorCode::kInvalidArgument);
  EXPECT_TRUE(Contains(message, "no class names found")) << message;
  EXPECT_TRUE(Contains(message, "classes.txt")) << message;
}

TEST(DatasetYolo, ClassNamesFromDataYamlAndObjNames) {
  const fs::path root = FreshDir("yolo");
  fs::create_directories(root / "images");
  fs::create_directories(root / "labels");
  auto names = [&] {
    std::vector<std::pair<int64_t, std::string>> out;
    for (const Category& c : ReadDataset(root.string()).categories) out.emplace_back(c.id, c.name);
    return out;
  };
  using Names = std::vector<std::pair<int64_t, std::string>>;
  WriteText(root / "data.yaml", "path: .\nnames: [cat, 'dog', \"big bird\"]  # three\nnc: 3\n");
  EXPECT_EQ(names(), (Names{{0, "cat"}, {1, "dog"}, {2, "big bird"}}));
  WriteText(root / "data.yaml", "train: images\nnames:\n  0: cat\n  1: 'dog'  # comment\n\n  2: bird\nnc: 3\n");
  EXPECT_EQ(names(), (Names{{0, "cat"}, {1, "dog"}, {2, "bird"}}));
  WriteText(root / "data.yaml", "names:\n- cat\n- dog\nval: images\n");
  EXPECT_EQ(names(), (Names{{0, "cat"}, {1, "dog"}}));
  WriteText(root / "data.yaml", "names: {0: cat, 2: dog}\n");
  EXPECT_EQ(names(), (Names{{0, "cat"}, {2, "dog"}}));
  WriteText(root / "data.yaml", "nc: 2\n");
  const std::string message = ErrorOf([&] { names(); }, ErrorCode::kInvalidArgument);
  EXPECT_TRUE(Contains(message, "data.yaml: no 'names:'")) << message;
  WriteText(root / "obj.names", "person\r\ncar\r\n\r\n");  // takes precedence over data.yaml
  EXPECT_EQ(names(), (Names{{0, "person"}, {1, "car"}}));
}

// ---------------------------------------------------------------------------------------------------------------------
// Writer: determinism and resume

void WriteAll(const fs::path& out, const std::string& format, const std::vector<OutputItem>& items, bool threaded) {
  std::vector<Category> categories = format == "coco" ? CocoCategories() : std::vector<Category>{{0, "a"}, {3, "d"}};
  DatasetWriter writer(out.string(), format, categories);
  if (threaded) {
    std::vector<std::thread> threads;
    for (const OutputItem& item : items) threads.emplace_back([&writer, &item] { writer.Write(item, PngBytes()); });
    for (auto& t : threads) t.join();
  } else {
    for (const OutputItem& item : items) writer.Write(item, PngBytes());
  }
  writer.Finish();
}

TEST(DatasetWriter, OutputBytesDoNotDependOnWriteOrder) {
  std::vector<OutputItem> items = CocoItems();
  OutputItem c = items[1];
  c.image_id = 4;
  c.file_name = "c.png";
  c.objects = {Box(0.333333333, 1.5, 2.25, 3.125, 3)};
  items.push_back(c);
  for (const std::string format : {"coco", "yolo"}) {
    const fs::path a = FreshDir(format + "-a"), b = FreshDir(format + "-b");
    std::vector<OutputItem> reversed(items.rbegin(), items.rend());
    WriteAll(a, format, items, false);
    WriteAll(b, format, reversed, true);
    const auto files_a = Snapshot(a), files_b = Snapshot(b);
    EXPECT_EQ(files_a, files_b) << format;
    EXPECT_EQ(files_a.count(format == "coco" ? "annotations.json" : "classes.txt"), 1u) << format;
    EXPECT_EQ(RecordLines(a).size(), 3u) << format;
    EXPECT_EQ(RecordLines(b).size(), 3u) << format;
    if (format == "yolo") {
      EXPECT_EQ(files_a.at("classes.txt"), "a\nclass1\nclass2\nd\n");  // missing ids get placeholders
    }
  }
}

TEST(DatasetWriter, ResumeSkipsRecordedItemsOnly) {
  const std::vector<OutputItem> items = CocoItems();  // ids 7 and 2
  OutputItem third = items[1];
  third.image_id = 9;
  third.file_name = "c.png";

  const fs::path out = FreshDir("resume");
  {
    DatasetWriter first(out.string(), "coco", CocoCategories());
    EXPECT_FALSE(first.IsDone(7));
    first.Write(items[0], PngBytes());
    first.Write(items[1], PngBytes());
  }
  ASSERT_EQ(RecordLines(out).size(), 2u);
  // A crash while writing item 9: its image exists, its record line was torn (no newline) in a log of its own.
  WriteText(out / "images" / "c.png", "partial");
  WriteText(out / ".osprey-augment" / "records" / "123-1-0.jsonl", "{\"image_id\": 9, \"file_na");
  DatasetWriter second(out.string(), "coco", CocoCategories());
  EXPECT_TRUE(second.IsDone(7));
  EXPECT_TRUE(second.IsDone(2));
  EXPECT_FALSE(second.IsDone(9));
  EXPECT_EQ(second.CountDone(), 2);
  second.Finish();  // from the records present: two images
  EXPECT_EQ(json::parse(ReadText(out / "annotations.json"))["images"].size(), 2u);
  second.Write(third, PngBytes());
  EXPECT_TRUE(second.IsDone(9));
  EXPECT_EQ(second.CountDone(), 3);
  EXPECT_EQ(ReadText(out / "images" / "c.png"), PngBytes());
  second.Finish();
  const std::string first_finish = ReadText(out / "annotations.json");
  second.Finish();
  EXPECT_EQ(ReadText(out / "annotations.json"), first_finish);  // idempotent

  const fs::path fresh = FreshDir("fresh");
  WriteAll(fresh, "coco", {items[0], items[1], third}, false);
  EXPECT_EQ(ReadText(fresh / "annotations.json"), first_finish);
}

// A complete record line that is not a record (edited by hand, a disk error) is an error naming the log and line;
// only a torn last line is skipped.
TEST(DatasetWriter, CorruptRecordLineIsAClearError) {
  const fs::path out = FreshDir("corrupt");
  {
    DatasetWriter writer(out.string(), "coco", CocoCategories());
    writer.Write(CocoItems()[0], PngBytes());
  }
  const fs::path log = out / ".osprey-augment" / "records" / "1-1-0.jsonl";
  WriteText(log, "{\"image_id\": 3}\n");
  try {
    DatasetWriter writer(out.string(), "coco", CocoCategories());
    FAIL() << "a corrupt record was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("1-1-0.jsonl line 1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("delete that line"), std::string::npos) << e.what();
  }
}

TEST(DatasetWriter, RefusesPathsOutsideTheOutputAndBadArguments) {
  const fs::path out = FreshDir("out");
  DatasetWriter writer(out.string(), "yolo", {{0, "a", {}, {}}});
  OutputItem item;
  item.width = item.height = 4;
  for (const std::string name : {"../evil.png", "/abs.png", "a/../../b.png", ""}) {
    item.file_name = name;
    const std::string message = ErrorOf([&] { writer.Write(item, "x"); }, ErrorCode::kInvalidArgument);
    EXPECT_TRUE(Contains(message, "relative path inside images/")) << message;
  }
  item.file_name = "ok.png";
  item.objects = {Box(0, 0, 1, 1, -1)};
  EXPECT_TRUE(Contains(ErrorOf([&] { writer.Write(item, "x"); }, ErrorCode::kInvalidArgument), "YOLO class"));
  item.objects = {Box(0, 0, NAN, 1, 0)};
  EXPECT_TRUE(Contains(ErrorOf([&] { writer.Write(item, "x"); }, ErrorCode::kInvalidArgument), "non-finite"));
  EXPECT_FALSE(fs::exists(out / "images" / "ok.png"));
  EXPECT_TRUE(Contains(ErrorOf([&] { DatasetWriter(out.string(), "voc", {}); }, ErrorCode::kInvalidArgument),
                       "coco or yolo"));
}

// ---------------------------------------------------------------------------------------------------------------------
// Encoding

TEST(EncodeImage, PngAndLosslessWebpRoundTripExactly) {
  const Tensor rgb = NoiseImage(17, 23, 3, 1), gray = NoiseImage(9, 31, 1, 2);
  EXPECT_EQ(Bytes(Decode(EncodeImage(rgb, "png"), 3)), Bytes(rgb));
  EXPECT_EQ(Bytes(Decode(EncodeImage(gray, "png"), 1)), Bytes(gray));
  const std::string webp = EncodeImage(rgb, "webp", 101);
  EXPECT_EQ(DetectImageFormat(webp.data(), webp.size()), ImageFormat::kWebp);
  EXPECT_EQ(Bytes(Decode(webp, 3)), Bytes(rgb));
  EXPECT_EQ(Bytes(Decode(EncodeImage(gray, "webp", 101), 1)), Bytes(gray));
}

// Sampling factors of each component from the JPEG's SOF0 header: 0x22 = 2x2 (the luma of 4:2:0), 0x11 = 1x1.
std::vector<int> JpegSampling(const std::string& jpeg) {
  for (size_t i = 2; i + 10 < jpeg.size(); ++i) {
    if (static_cast<uint8_t>(jpeg[i]) == 0xFF && static_cast<uint8_t>(jpeg[i + 1]) == 0xC0) {
      const int components = static_cast<uint8_t>(jpeg[i + 9]);
      std::vector<int> sampling;
      for (int c = 0; c < components; ++c) sampling.push_back(static_cast<uint8_t>(jpeg[i + 11 + 3 * c]));
      return sampling;
    }
  }
  return {};
}

TEST(EncodeImage, JpegAndLossyWebpAreCloseWith420Chroma) {
  const Tensor smooth = SmoothImage(48, 64);
  const std::string jpeg = EncodeImage(smooth, "jpeg", 90);
  EXPECT_EQ(DetectImageFormat(jpeg.data(), jpeg.size()), ImageFormat::kJpeg);
  const Tensor decoded = Decode(jpeg, 3);
  ASSERT_EQ(decoded.shape(), smooth.shape());
  const double psnr = Psnr(decoded, smooth);
  EXPECT_GT(psnr, 30.0);
  EXPECT_EQ(JpegSampling(jpeg), (std::vector<int>{0x22, 0x11, 0x11}));
  EXPECT_LT(EncodeImage(smooth, "jpeg", 10).size(), jpeg.size());
  const Tensor gray = Image(20, 30, 1, [](int64_t y, int64_t x, int64_t) { return uint8_t(4 * x + 2 * y); });
  const std::string gray_jpeg = EncodeImage(gray, "jpeg", 95);
  EXPECT_EQ(JpegSampling(gray_jpeg), (std::vector<int>{0x11}));
  EXPECT_GT(Psnr(Decode(gray_jpeg, 1), gray), 30.0);
  EXPECT_GT(Psnr(Decode(EncodeImage(smooth, "webp", 90), 3), smooth), 30.0);
}

TEST(EncodeImage, BadArgumentsSayWhatIsWrong) {
  const Tensor rgb = NoiseImage(4, 4, 3, 3);
  EXPECT_TRUE(Contains(ErrorOf([&] { EncodeImage(rgb, "gif"); }, ErrorCode::kInvalidArgument), "unknown format 'gif'"));
  EXPECT_TRUE(Contains(ErrorOf([&] { EncodeImage(rgb, "jpeg", 0); }, ErrorCode::kInvalidArgument), "1..100, got 0"));
  EXPECT_TRUE(Contains(ErrorOf([&] { EncodeImage(rgb, "jpeg", 101); }, ErrorCode::kInvalidArgument), "got 101"));
  EXPECT_TRUE(Contains(ErrorOf([&] { EncodeImage(rgb, "webp", 102); }, ErrorCode::kInvalidArgument), "got 102"));
  EXPECT_TRUE(Contains(ErrorOf([&] { EncodeImage(Tensor::Zeros(DType::kF32, {4, 4, 3}), "png"); },
                               ErrorCode::kInvalidArgument),
                       "expected a uint8 image, got float32"));
  EXPECT_TRUE(Contains(ErrorOf([&] { EncodeImage(Tensor::Zeros(DType::kU8, {4, 4, 4}), "png"); },
                               ErrorCode::kInvalidArgument),
                       "C = 1 or 3, got [4, 4, 4]"));
}

TEST(EncodeImage, FormatFromExtension) {
  EXPECT_EQ(ImageFormatFromExtension("a/b.JPG"), "jpeg");
  EXPECT_EQ(ImageFormatFromExtension("b.jpeg"), "jpeg");
  EXPECT_EQ(ImageFormatFromExtension("x.y/b.png"), "png");
  EXPECT_EQ(ImageFormatFromExtension("b.webp"), "webp");
  EXPECT_EQ(ImageFormatFromExtension("b.bmp"), "");
  EXPECT_EQ(ImageFormatFromExtension("x.png/b"), "");
}

// ---------------------------------------------------------------------------------------------------------------------
// Drawing

TEST(DrawObjects, ChangesExactlyTheBoxOutline) {
  for (int64_t channels : {3, 1}) {
    const Tensor blank = Tensor::Zeros(DType::kU8, {40, 50, channels});
    // Box (10, 5) - (20, 15) covers pixel columns 10..19 and rows 5..14; the outline is the 2-pixel ring inside it.
    const Tensor drawn = DrawObjects(blank, {Box(10, 5, 20, 15, 2)});
    ASSERT_EQ(drawn.shape(), blank.shape());
    int64_t changed = 0;
    for (int64_t y = 0; y < 40; ++y) {
      for (int64_t x = 0; x < 50; ++x) {
        const bool inside = x >= 10 && x <= 19 && y >= 5 && y <= 14;
        const bool ring = inside && (x < 12 || x > 17 || y < 7 || y > 12);
        bool differs = false;
        for (int64_t k = 0; k < channels; ++k) differs |= drawn.data<uint8_t>()[(y * 50 + x) * channels + k] != 0;
        EXPECT_EQ(differs, ring) << "pixel (" << x << ", " << y << ") channels " << channels;
        changed += differs;
      }
    }
    EXPECT_EQ(changed, 10 * 10 - 6 * 6);
    EXPECT_EQ(Bytes(blank), std::vector<uint8_t>(blank.numel(), 0));  // the input is not modified
  }
  // A box hanging over the left edge: its left side is outside the image and is not drawn.
  const Tensor drawn = DrawObjects(Tensor::Zeros(DType::kU8, {20, 20, 3}), {Box(-5, 5, 10, 15, 0)});
  EXPECT_EQ(drawn.data<uint8_t>()[(10 * 20 + 0) * 3], 0);
  EXPECT_NE(drawn.data<uint8_t>()[(10 * 20 + 9) * 3] | drawn.data<uint8_t>()[(10 * 20 + 9) * 3 + 2], 0);
}

TEST(DrawObjects, PolygonAndKeypointsDrawNearTheirPoints) {
  Object o = Box(2, 2, 3, 3, 1);
  o.polygons = {{10, 10, 30, 10, 30, 30}};
  o.keypoints = {20.5, 25.5, 2, 5.5, 35.5, 0};
  const Tensor drawn = DrawObjects(Tensor::Zeros(DType::kU8, {40, 40, 3}), {o});
  auto set = [&](int64_t x, int64_t y) {
    const uint8_t* p = drawn.data<uint8_t>() + (y * 40 + x) * 3;
    return (p[0] | p[1] | p[2]) != 0;
  };
  EXPECT_TRUE(set(20, 10));  // on the top edge of the polygon
  EXPECT_TRUE(set(30, 20));  // on its right edge
  EXPECT_TRUE(set(20, 20));  // on its diagonal
  EXPECT_FALSE(set(25, 15));  // inside: outlines only
  for (int64_t dy = -1; dy <= 1; ++dy)
    for (int64_t dx = -1; dx <= 1; ++dx) EXPECT_TRUE(set(20 + dx, 25 + dy));
  EXPECT_FALSE(set(5, 35));  // v = 0: not labelled, not drawn
}

TEST(ContactSheet, GridSizeAndLetterboxedPlacement) {
  const Tensor red = Image(50, 100, 3, [](int64_t, int64_t, int64_t k) { return uint8_t(k == 0 ? 255 : 0); });
  const Tensor gray = Image(10, 10, 1, [](int64_t, int64_t, int64_t) { return uint8_t(200); });
  const Tensor sheet = ContactSheet({red, gray, red, red, red}, 320);
  EXPECT_EQ(sheet.shape(), (Shape{640, 960, 3}));  // 5 images: 3 columns, 2 rows
  auto px = [&](int64_t x, int64_t y) {
    const uint8_t* p = sheet.data<uint8_t>() + (y * 960 + x) * 3;
    return std::vector<int>{p[0], p[1], p[2]};
  };
  // 100 x 50 scaled by 3.2 to 320 x 160, centred: rows 80..239 of the first cell.
  EXPECT_EQ(px(0, 80), (std::vector<int>{255, 0, 0}));
  EXPECT_EQ(px(319, 239), (std::vector<int>{255, 0, 0}));
  EXPECT_EQ(px(160, 79), (std::vector<int>{32, 32, 32}));
  EXPECT_EQ(px(160, 240), (std::vector<int>{32, 32, 32}));
  EXPECT_EQ(px(320, 0), (std::vector<int>{200, 200, 200}));  // gray upscaled to fill its whole cell
  EXPECT_EQ(px(639, 319), (std::vector<int>{200, 200, 200}));
  EXPECT_EQ(px(700, 400), (std::vector<int>{32, 32, 32}));  // the sixth cell is empty
  EXPECT_EQ(ContactSheet({gray}, 64).shape(), (Shape{64, 64, 3}));
  EXPECT_EQ(ContactSheet(std::vector<Tensor>(4, gray), 8).shape(), (Shape{16, 16, 3}));
  EXPECT_EQ(ContactSheet(std::vector<Tensor>(10, gray), 8).shape(), (Shape{24, 32, 3}));
  EXPECT_TRUE(Contains(ErrorOf([] { ContactSheet({}); }, ErrorCode::kInvalidArgument), "no images"));
}

}  // namespace
}  // namespace osprey::augment
