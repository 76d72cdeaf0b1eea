// Reading detection datasets: COCO (one JSON file) and YOLO (images/ + labels/ + class names). Whole-file problems
// throw; problems with one annotation are recorded on its item (or on the dataset when no listed image owns it) so a
// run can report them all and still process the rest. The layouts are described in docs/augment.md.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "osprey/dataset.h"

namespace osprey::augment {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string ReadTextFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorCode::kNotFound, "cannot open " + path.string());
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw Error(ErrorCode::kInvalidArgument, "cannot read " + path.string());
  return text.str();
}

bool IsDirectory(const fs::path& path) {
  std::error_code ec;
  return fs::is_directory(path, ec);
}
bool IsFile(const fs::path& path) {
  std::error_code ec;
  return fs::is_regular_file(path, ec);
}

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// JSON numbers that are integers (COCO ids are sometimes written as 7.0).
bool GetInt(const json& value, int64_t* out) {
  if (value.is_number_integer()) {
    if (value.is_number_unsigned() && value.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) return false;
    *out = value.get<int64_t>();
    return true;
  }
  if (value.is_number_float()) {
    const double d = value.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) {
      *out = static_cast<int64_t>(d);
      return true;
    }
  }
  return false;
}

bool GetFiniteNumber(const json& value, double* out) {
  if (!value.is_number()) return false;
  *out = value.get<double>();
  return std::isfinite(*out);
}

std::string Brief(const json& value) {
  std::string text = value.dump();
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return text;
}

std::string FormatNumber(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

// ---------------------------------------------------------------------------------------------------------------------
// COCO

std::vector<Category> ParseCocoCategories(const json& doc, const std::string& where) {
  std::vector<Category> categories;
  if (!doc.contains("categories")) return categories;
  const json& list = doc["categories"];
  if (!list.is_array()) throw Error(ErrorCode::kInvalidArgument, where + ": 'categories' must be an array");
  std::set<int64_t> seen;
  for (size_t i = 0; i < list.size(); ++i) {
    const json& c = list[i];
    const std::string at = where + ": categories[" + std::to_string(i) + "]";
    if (!c.is_object()) throw Error(ErrorCode::kInvalidArgument, at + " must be an object");
    Category category;
    if (!c.contains("id") || !GetInt(c["id"], &category.id))
      throw Error(ErrorCode::kInvalidArgument, at + ": 'id' must be an integer");
    if (!seen.insert(category.id).second)
      throw Error(ErrorCode::kInvalidArgument, at + ": duplicate category id " + std::to_string(category.id));
    if (!c.contains("name") || !c["name"].is_string())
      throw Error(ErrorCode::kInvalidArgument, at + ": 'name' must be a string");
    category.name = c["name"].get<std::string>();
    if (c.contains("keypoints")) {
      const json& names = c["keypoints"];
      if (!names.is_array()) throw Error(ErrorCode::kInvalidArgument, at + ".keypoints must be an array of names");
      for (const json& name : names) {
        if (!name.is_string())
          throw Error(ErrorCode::kInvalidArgument, at + ".keypoints must be an array of names, found " + Brief(name));
        category.keypoint_names.push_back(name.get<std::string>());
      }
    }
    if (c.contains("skeleton")) {
      const json& skeleton = c["skeleton"];
      if (!skeleton.is_array()) throw Error(ErrorCode::kInvalidArgument, at + ".skeleton must be an array of pairs");
      for (const json& edge : skeleton) {
        std::vector<int64_t> pair;
        if (edge.is_array()) {
          for (const json& v : edge) {
            int64_t k = 0;
            if (!GetInt(v, &k)) break;
            pair.push_back(k);
          }
        }
        if (!edge.is_array() || pair.size() != edge.size() || pair.size() != 2)
          throw Error(ErrorCode::kInvalidArgument,
                      at + ".skeleton: expected pairs of keypoint numbers, found " + Brief(edge));
        category.skeleton.push_back(std::move(pair));
      }
    }
    categories.push_back(std::move(category));
  }
  return categories;
}

// Folders a COCO file_name is looked up in, in order (docs/augment.md).
std::vector<fs::path> CocoImageFolders(const fs::path& json_path) {
  const fs::path json_dir = json_path.parent_path().empty() ? fs::path(".") : json_path.parent_path();
  std::vector<fs::path> folders;
  const bool in_annotations = json_dir.filename() == "annotations";
  if (in_annotations) folders.push_back(json_dir.parent_path() / "images");
  folders.push_back(json_dir / "images");
  folders.push_back(json_dir);
  // The layout COCO itself ships: annotations/instances_val2017.json next to val2017/.
  const std::string stem = json_path.stem().string();
  const size_t underscore = stem.rfind('_');
  if (in_annotations && underscore != std::string::npos && underscore + 1 < stem.size())
    folders.push_back(json_dir.parent_path() / stem.substr(underscore + 1));
  return folders;
}

// Fields of an annotation that osprey recomputes on writing; every other field is passed through in extra_json.
bool IsRecomputedField(const std::string& key) {
  static const std::set<std::string> kFields = {"bbox",      "area",          "segmentation", "keypoints",
                                                "num_keypoints", "id", "image_id", "category_id"};
  return kFields.count(key) > 0;
}

// Parses one annotation into `object`; returns false (with `error` set) when the object cannot be kept. Problems that
// lose only part of the object (a bad polygon, bad keypoints) are appended to `soft_errors`; RLE masks (normal for
// COCO's crowd annotations) only to `warnings`.
bool ParseCocoAnnotation(const json& a, const std::string& label, const DatasetItem& item,
                         const std::map<int64_t, const Category*>& categories, Object* object, std::string* error,
                         std::vector<std::string>* soft_errors, std::vector<std::string>* warnings) {
  int64_t category_id = 0;
  if (!a.contains("category_id") || !GetInt(a["category_id"], &category_id)) {
    *error = label + ": 'category_id' must be an integer" +
             (a.contains("category_id") ? ", got " + Brief(a["category_id"]) : std::string(", missing"));
    return false;
  }
  const Category* category = nullptr;
  if (!categories.empty()) {
    auto it = categories.find(category_id);
    if (it == categories.end()) {
      *error = label + ": category_id " + std::to_string(category_id) + " is not in categories";
      return false;
    }
    category = it->second;
  }
  object->category = category_id;

  double box[4] = {0, 0, 0, 0};
  if (!a.contains("bbox")) {
    *error = label + ": no 'bbox'";
    return false;
  }
  const json& bbox = a["bbox"];
  bool box_ok = bbox.is_array() && bbox.size() == 4;
  for (size_t k = 0; box_ok && k < 4; ++k) box_ok = GetFiniteNumber(bbox[k], &box[k]);
  if (!box_ok) {
    *error = label + ": 'bbox' must be 4 finite numbers [x, y, width, height], got " + Brief(bbox);
    return false;
  }
  if (box[2] < 0 || box[3] < 0) {
    *error = label + ": negative box " + (box[2] < 0 ? "width " + FormatNumber(box[2]) : "height " + FormatNumber(box[3])) +
             " in bbox " + Brief(bbox);
    return false;
  }
  object->x0 = box[0];
  object->y0 = box[1];
  object->x1 = box[0] + box[2];
  object->y1 = box[1] + box[3];
  if (item.width > 0 && item.height > 0 &&
      (object->x1 <= 0 || object->y1 <= 0 || object->x0 >= item.width || object->y0 >= item.height)) {
    *error = label + ": box " + Brief(bbox) + " lies entirely outside the " + std::to_string(item.width) + " x " +
             std::to_string(item.height) + " image";
    return false;
  }

  if (a.contains("segmentation") && !a["segmentation"].is_null()) {
    const json& seg = a["segmentation"];
    if (seg.is_object()) {
      warnings->push_back(label + ": RLE segmentation is not supported (only polygons); the object keeps its box "
                                  "but loses its mask");
    } else if (!seg.is_array()) {
      soft_errors->push_back(label + ": 'segmentation' must be a list of polygons, got " + Brief(seg) +
                             "; the object keeps its box but loses its mask");
    } else {
      for (size_t p = 0; p < seg.size(); ++p) {
        const json& poly = seg[p];
        std::vector<double> points;
        bool ok = poly.is_array() && poly.size() >= 6 && poly.size() % 2 == 0;
        for (size_t k = 0; ok && k < poly.size(); ++k) {
          double v = 0;
          ok = GetFiniteNumber(poly[k], &v);
          points.push_back(v);
        }
        if (!ok) {
          soft_errors->push_back(label + ": segmentation[" + std::to_string(p) +
                                 "] must be an even count (>= 6) of finite numbers x, y, ..., got " + Brief(poly) +
                                 "; polygon dropped");
          continue;
        }
        object->polygons.push_back(std::move(points));
      }
    }
  }

  if (a.contains("keypoints") && !a["keypoints"].is_null()) {
    const json& kp = a["keypoints"];
    std::vector<double> values;
    bool ok = kp.is_array() && kp.size() % 3 == 0;
    for (size_t k = 0; ok && k < kp.size(); ++k) {
      double v = 0;
      ok = GetFiniteNumber(kp[k], &v);
      values.push_back(v);
    }
    if (!ok) {
      soft_errors->push_back(label + ": 'keypoints' must be x, y, v triples of finite numbers, got " + Brief(kp) +
                             "; keypoints dropped");
    } else if (category && !category->keypoint_names.empty() &&
               values.size() != 3 * category->keypoint_names.size()) {
      soft_errors->push_back(label + ": " + std::to_string(values.size() / 3) + " keypoints, but category " +
                             std::to_string(category_id) + " names " +
                             std::to_string(category->keypoint_names.size()) + "; keypoints dropped");
    } else {
      object->keypoints = std::move(values);
    }
  }

  json extra = json::object();
  for (auto it = a.begin(); it != a.end(); ++it)
    if (!IsRecomputedField(it.key())) extra[it.key()] = it.value();
  if (!extra.empty()) object->extra_json = extra.dump();
  return true;
}

Dataset ReadCoco(const fs::path& json_path, const std::string& root) {
  const std::string where = json_path.string();
  const std::string text = ReadTextFile(json_path);
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::exception& e) {
    throw Error(ErrorCode::kInvalidArgument, where + ": not valid JSON (" + e.what() + ")");
  }
  if (!doc.is_object()) throw Error(ErrorCode::kInvalidArgument, where + ": expected a COCO object {\"images\": ...}");
  if (!doc.contains("images") || !doc["images"].is_array())
    throw Error(ErrorCode::kInvalidArgument, where + ": no \"images\" array (is this a COCO annotation file?)");

  Dataset dataset;
  dataset.format = "coco";
  dataset.root = root;
  dataset.categories = ParseCocoCategories(doc, where);
  std::map<int64_t, const Category*> category_by_id;
  for (const Category& c : dataset.categories) category_by_id[c.id] = &c;

  const std::vector<fs::path> folders = CocoImageFolders(json_path);
  const json& images = doc["images"];
  std::unordered_map<int64_t, size_t> item_by_id;
  for (size_t i = 0; i < images.size(); ++i) {
    const json& im = images[i];
    const std::string at = where + ": images[" + std::to_string(i) + "]";
    if (!im.is_object()) throw Error(ErrorCode::kInvalidArgument, at + " must be an object");
    DatasetItem item;
    if (!im.contains("id") || !GetInt(im["id"], &item.image_id))
      throw Error(ErrorCode::kInvalidArgument, at + ": 'id' must be an integer");
    if (!im.contains("file_name") || !im["file_name"].is_string() || im["file_name"].get<std::string>().empty())
      throw Error(ErrorCode::kInvalidArgument, at + ": 'file_name' must be a non-empty string");
    auto [it, inserted] = item_by_id.emplace(item.image_id, dataset.items.size());
    if (!inserted)
      throw Error(ErrorCode::kInvalidArgument, at + ": duplicate image id " + std::to_string(item.image_id) +
                                                   " (also images[" + std::to_string(it->second) + "])");
    item.file_name = im["file_name"].get<std::string>();
    try {
      CheckOutputFileName(item.file_name);  // before anything reads it
    } catch (const Error& e) {
      throw Error(ErrorCode::kInvalidArgument, at + ": " + e.what());
    }
    for (const char* key : {"width", "height"}) {
      if (!im.contains(key) || im[key].is_null()) continue;
      int64_t v = 0;
      if (!GetInt(im[key], &v) || v <= 0) {
        item.errors.push_back("image " + std::to_string(item.image_id) + ": '" + key +
                              "' must be a positive integer, got " + Brief(im[key]));
        continue;
      }
      (std::string(key) == "width" ? item.width : item.height) = v;
    }
    item.image_path = (folders.front() / item.file_name).string();
    for (const fs::path& folder : folders) {
      if (IsFile(folder / item.file_name)) {
        item.image_path = (folder / item.file_name).string();
        break;
      }
    }
    dataset.items.push_back(std::move(item));
  }

  if (doc.contains("annotations")) {
    const json& annotations = doc["annotations"];
    if (!annotations.is_array()) throw Error(ErrorCode::kInvalidArgument, where + ": 'annotations' must be an array");
    for (size_t i = 0; i < annotations.size(); ++i) {
      const json& a = annotations[i];
      std::string label = "annotations[" + std::to_string(i) + "]";
      if (!a.is_object()) {
        dataset.errors.push_back(label + ": not an object, got " + Brief(a));
        continue;
      }
      int64_t annotation_id = -1;
      if (a.contains("id") && GetInt(a["id"], &annotation_id)) label = "annotation " + std::to_string(annotation_id);
      int64_t image_id = 0;
      if (!a.contains("image_id") || !GetInt(a["image_id"], &image_id)) {
        dataset.errors.push_back(label + ": 'image_id' must be an integer" +
                                 (a.contains("image_id") ? ", got " + Brief(a["image_id"]) : std::string(", missing")));
        continue;
      }
      auto it = item_by_id.find(image_id);
      if (it == item_by_id.end()) {
        dataset.errors.push_back(label + ": image_id " + std::to_string(image_id) + " is not in images");
        continue;
      }
      DatasetItem& item = dataset.items[it->second];
      Object object;
      object.source_id = annotation_id;
      std::string error;
      if (ParseCocoAnnotation(a, label, item, category_by_id, &object, &error, &item.errors, &item.warnings)) {
        item.objects.push_back(std::move(object));
      } else {
        item.errors.push_back(std::move(error));
      }
    }
  }
  return dataset;
}

// A folder holding annotations.json, or annotations/ with exactly one .json file.
fs::path FindCocoJson(const fs::path& folder) {
  if (IsFile(folder / "annotations.json")) return folder / "annotations.json";
  std::vector<fs::path> found;
  if (IsDirectory(folder / "annotations")) {
    std::error_code ec;
    for (fs::directory_iterator it(folder / "annotations", ec), end; !ec && it != end; it.increment(ec)) {
      std::error_code type_ec;
      if (it->is_regular_file(type_ec) && Lower(it->path().extension().string()) == ".json")
        found.push_back(it->path());
    }
  }
  std::sort(found.begin(), found.end());
  if (found.size() == 1) return found.front();
  if (found.empty()) return {};
  std::string names;
  for (const fs::path& p : found) names += (names.empty() ? "" : ", ") + p.filename().string();
  throw Error(ErrorCode::kInvalidArgument, "COCO dataset " + folder.string() + ": several annotation files in " +
                                               (folder / "annotations").string() + " (" + names +
                                               "); pass the one to use as the path");
}

// ---------------------------------------------------------------------------------------------------------------------
// YOLO

std::string Unquote(std::string_view s) {
  s = Trim(s);
  if (s.size() >= 2 && (s.front() == '\'' || s.front() == '"') && s.back() == s.front()) {
    return std::string(s.substr(1, s.size() - 2));
  }
  return std::string(s);
}

// Cuts a YAML comment (" #" outside quotes).
std::string_view StripComment(std::string_view s) {
  char quote = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (quote) {
      if (s[i] == quote) quote = 0;
    } else if (s[i] == '\'' || s[i] == '"') {
      quote = s[i];
    } else if (s[i] == '#' && (i == 0 || std::isspace(static_cast<unsigned char>(s[i - 1])))) {
      return s.substr(0, i);
    }
  }
  return s;
}

std::vector<std::string> SplitFlow(std::string_view s) {
  std::vector<std::string> parts;
  std::string current;
  char quote = 0;
  for (char c : s) {
    if (quote) {
      if (c == quote) quote = 0;
    } else if (c == '\'' || c == '"') {
      quote = c;
    } else if (c == ',') {
      parts.push_back(current);
      current.clear();
      continue;
    }
    current += c;
  }
  if (!Trim(current).empty()) parts.push_back(current);
  return parts;
}

bool ParseInt(std::string_view s, int64_t* out) {
  s = Trim(s);
  if (s.empty()) return false;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && end == s.data() + s.size();
}

bool ParseDouble(std::string_view s, double* out) {
  if (s.empty()) return false;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && end == s.data() + s.size() && std::isfinite(*out);
}

// The `names:` entry of an Ultralytics data.yaml: `names: [a, b]`, `names: {0: a, 1: b}`, or a block of `- a` or
// `0: a` lines. Returns false when the file has no `names:` key.
bool ParseYamlNames(const std::string& text, const std::string& where, std::vector<Category>* categories) {
  std::vector<std::string> lines;
  std::istringstream stream(text);
  for (std::string line; std::getline(stream, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(line);
  }
  size_t at = 0;
  while (at < lines.size() && !(lines[at].rfind("names", 0) == 0 && Trim(lines[at].substr(5)).rfind(':', 0) == 0)) ++at;
  if (at == lines.size()) return false;
  std::vector<std::pair<std::string, std::string>> entries;  // (key or "" for list items, value)
  std::string rest(Trim(StripComment(Trim(lines[at].substr(lines[at].find(':') + 1)))));
  auto bad = [&](const std::string& what) {
    return Error(ErrorCode::kInvalidArgument, where + ": 'names' " + what +
                                                  " (expected names: [a, b], or one '- a' or '0: a' line per class)");
  };
  if (!rest.empty() && (rest.front() == '[' || rest.front() == '{')) {
    const char close = rest.front() == '[' ? ']' : '}';
    std::string flow = rest;
    while (flow.find(close) == std::string::npos && ++at < lines.size())
      flow += " " + std::string(StripComment(lines[at]));
    const size_t end = flow.find(close);
    if (end == std::string::npos) throw bad(std::string("has no closing '") + close + "'");
    for (const std::string& part : SplitFlow(std::string_view(flow).substr(1, end - 1))) {
      if (close == ']') {
        entries.emplace_back("", Unquote(part));
      } else {
        const size_t colon = part.find(':');
        if (colon == std::string::npos) throw bad("entry '" + std::string(Trim(part)) + "' is not 'id: name'");
        entries.emplace_back(Unquote(std::string_view(part).substr(0, colon)), Unquote(part.substr(colon + 1)));
      }
    }
  } else if (rest.empty()) {
    for (++at; at < lines.size(); ++at) {
      const std::string_view line = Trim(StripComment(lines[at]));
      if (line.empty()) continue;
      const bool indented = std::isspace(static_cast<unsigned char>(lines[at][0]));
      if (!indented && line.front() != '-') break;  // the next top-level key
      if (line.front() == '-') {
        entries.emplace_back("", Unquote(line.substr(1)));
      } else {
        const size_t colon = line.find(':');
        if (colon == std::string::npos) throw bad("line '" + std::string(line) + "' is not '- name' or 'id: name'");
        entries.emplace_back(Unquote(line.substr(0, colon)), Unquote(line.substr(colon + 1)));
      }
    }
  } else {
    throw bad("is '" + rest + "'");
  }
  std::set<int64_t> seen;
  for (size_t i = 0; i < entries.size(); ++i) {
    Category category;
    category.id = static_cast<int64_t>(i);
    if (!entries[i].first.empty() && (!ParseInt(entries[i].first, &category.id) || category.id < 0))
      throw bad("key '" + entries[i].first + "' is not a class index");
    if (!seen.insert(category.id).second) throw bad("lists class " + std::to_string(category.id) + " twice");
    category.name = entries[i].second;
    categories->push_back(std::move(category));
  }
  std::sort(categories->begin(), categories->end(), [](const Category& a, const Category& b) { return a.id < b.id; });
  return true;
}

std::vector<Category> ReadYoloClasses(const fs::path& root) {
  std::vector<Category> categories;
  for (const char* name : {"classes.txt", "obj.names"}) {
    const fs::path path = root / name;
    if (!IsFile(path)) continue;
    std::istringstream stream(ReadTextFile(path));
    for (std::string line; std::getline(stream, line);) {
      const std::string_view trimmed = Trim(line);
      if (trimmed.empty()) continue;
      Category category;
      category.id = static_cast<int64_t>(categories.size());
      category.name = std::string(trimmed);
      categories.push_back(std::move(category));
    }
    if (categories.empty())
      throw Error(ErrorCode::kInvalidArgument, path.string() + ": no class names (expected one name per line)");
    return categories;
  }
  for (const char* name : {"data.yaml", "data.yml"}) {
    const fs::path path = root / name;
    if (!IsFile(path)) continue;
    if (!ParseYamlNames(ReadTextFile(path), path.string(), &categories))
      throw Error(ErrorCode::kInvalidArgument, path.string() + ": no 'names:' entry listing the class names");
    if (categories.empty()) throw Error(ErrorCode::kInvalidArgument, path.string() + ": 'names' is empty");
    return categories;
  }
  throw Error(ErrorCode::kInvalidArgument,
              "YOLO dataset " + root.string() +
                  ": no class names found; add classes.txt (one name per line, line i = class i), obj.names, or "
                  "data.yaml with 'names:'");
}

bool IsYoloImage(const fs::path& path) {
  static const std::set<std::string> kExtensions = {".jpg", ".jpeg", ".png", ".webp", ".bmp"};
  return kExtensions.count(Lower(path.extension().string())) > 0;
}

// Parses one label file into normalized objects; malformed lines become item errors "file:line: ...".
void ReadYoloLabels(const fs::path& label_path, const std::set<int64_t>& class_ids, DatasetItem* item) {
  const std::string text = ReadTextFile(label_path);
  std::istringstream stream(text);
  int64_t line_number = 0;
  for (std::string line; std::getline(stream, line);) {
    ++line_number;
    std::vector<std::string_view> tokens;
    std::string_view rest = line;
    while (true) {
      rest = Trim(rest);
      if (rest.empty()) break;
      size_t end = 0;
      while (end < rest.size() && !std::isspace(static_cast<unsigned char>(rest[end]))) ++end;
      tokens.push_back(rest.substr(0, end));
      rest.remove_prefix(end);
    }
    if (tokens.empty()) continue;
    const std::string at = label_path.string() + ":" + std::to_string(line_number) + ": ";
    const size_t n = tokens.size();
    if (n != 5 && (n < 7 || n % 2 == 0)) {
      item->errors.push_back(at + "expected 'class cx cy w h' (5 values) or 'class x1 y1 x2 y2 x3 y3 ...' (a polygon "
                                  "of >= 3 points), got " + std::to_string(n) + " values");
      continue;
    }
    int64_t cls = 0;
    if (!ParseInt(tokens[0], &cls) || cls < 0) {
      item->errors.push_back(at + "class '" + std::string(tokens[0]) + "' is not a non-negative integer");
      continue;
    }
    if (!class_ids.count(cls)) {
      item->errors.push_back(at + "class " + std::to_string(cls) + " has no name in the class list");
      continue;
    }
    std::vector<double> values(n - 1);
    size_t bad = 0;
    while (bad < values.size() && ParseDouble(tokens[bad + 1], &values[bad])) ++bad;
    if (bad < values.size()) {
      item->errors.push_back(at + "value " + std::to_string(bad + 2) + " '" + std::string(tokens[bad + 1]) +
                             "' is not a finite number");
      continue;
    }
    Object object;
    object.category = cls;
    if (n == 5) {
      if (values[2] < 0 || values[3] < 0) {
        item->errors.push_back(at + "negative box " + (values[2] < 0 ? "width " : "height ") +
                               std::string(tokens[values[2] < 0 ? 3 : 4]));
        continue;
      }
      object.x0 = values[0] - values[2] / 2;
      object.x1 = values[0] + values[2] / 2;
      object.y0 = values[1] - values[3] / 2;
      object.y1 = values[1] + values[3] / 2;
    } else {
      object.x0 = object.x1 = values[0];
      object.y0 = object.y1 = values[1];
      for (size_t k = 0; k < values.size(); k += 2) {
        object.x0 = std::min(object.x0, values[k]);
        object.x1 = std::max(object.x1, values[k]);
        object.y0 = std::min(object.y0, values[k + 1]);
        object.y1 = std::max(object.y1, values[k + 1]);
      }
      object.polygons.push_back(std::move(values));
    }
    item->objects.push_back(std::move(object));
  }
}

Dataset ReadYolo(const fs::path& root) {
  const fs::path images = root / "images";
  if (!IsDirectory(images))
    throw Error(ErrorCode::kInvalidArgument, "YOLO dataset " + root.string() + ": no images/ folder");
  Dataset dataset;
  dataset.format = "yolo";
  dataset.root = root.string();
  dataset.categories = ReadYoloClasses(root);
  std::set<int64_t> class_ids;
  for (const Category& c : dataset.categories) class_ids.insert(c.id);

  // Linked subfolders are followed (datasets are often assembled from links); a depth limit stops link cycles.
  constexpr int kMaxDepth = 32;
  std::vector<std::string> relative;
  std::error_code ec;
  fs::recursive_directory_iterator it(images, fs::directory_options::follow_directory_symlink, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    if (it.depth() > kMaxDepth)
      throw Error(ErrorCode::kInvalidArgument, "YOLO dataset " + root.string() + ": folders nested deeper than " +
                                                   std::to_string(kMaxDepth) + " levels at " + it->path().string() +
                                                   " (a symbolic link loop?)");
    std::error_code type_ec;
    if (it->is_regular_file(type_ec) && IsYoloImage(it->path()))
      relative.push_back(it->path().lexically_relative(images).generic_string());
  }
  if (ec) throw Error(ErrorCode::kInvalidArgument, "YOLO dataset: cannot list " + images.string() + ": " + ec.message());
  std::sort(relative.begin(), relative.end());
  for (size_t i = 0; i < relative.size(); ++i) {
    DatasetItem item;
    item.image_id = static_cast<int64_t>(i);
    item.file_name = relative[i];
    item.image_path = (images / relative[i]).string();
    item.normalized = true;
    const fs::path label = (root / "labels" / relative[i]).replace_extension(".txt");
    if (IsFile(label)) ReadYoloLabels(label, class_ids, &item);
    dataset.items.push_back(std::move(item));
  }
  return dataset;
}

}  // namespace

Dataset ReadDataset(const std::string& path, const std::string& format) {
  if (format != "auto" && format != "coco" && format != "yolo")
    throw Error(ErrorCode::kInvalidArgument, "dataset format must be coco, yolo or auto, got '" + format + "'");
  const fs::path p(path);
  std::error_code ec;
  if (!fs::exists(p, ec)) throw Error(ErrorCode::kNotFound, "dataset " + path + " does not exist");
  if (IsFile(p)) {
    if (format == "yolo")
      throw Error(ErrorCode::kInvalidArgument,
                  "YOLO dataset " + path + ": expected a folder with images/ and labels/, got a file");
    if (format == "auto" && Lower(p.extension().string()) != ".json")
      throw Error(ErrorCode::kInvalidArgument,
                  "dataset " + path + ": expected a COCO .json file or a dataset folder (pass --format to say which)");
    return ReadCoco(p, path);
  }
  if (!IsDirectory(p)) throw Error(ErrorCode::kInvalidArgument, "dataset " + path + " is not a file or folder");
  if (format == "yolo") return ReadYolo(p);
  const fs::path json_path = FindCocoJson(p);
  if (!json_path.empty()) return ReadCoco(json_path, path);
  if (format == "coco")
    throw Error(ErrorCode::kInvalidArgument,
                "COCO dataset " + path + ": no annotations.json and no annotations/*.json in the folder");
  if (IsDirectory(p / "images") && IsDirectory(p / "labels")) return ReadYolo(p);
  throw Error(ErrorCode::kInvalidArgument,
              "dataset " + path +
                  ": cannot tell the format: expected annotations.json or annotations/*.json (COCO), or images/ and "
                  "labels/ folders (YOLO)");
}

void ResolveYolo(DatasetItem& item, int64_t width, int64_t height) {
  if (width <= 0 || height <= 0)
    throw Error(ErrorCode::kInvalidArgument, "ResolveYolo(" + item.file_name + "): image size must be positive, got " +
                                                 std::to_string(width) + " x " + std::to_string(height));
  item.width = width;
  item.height = height;
  if (!item.normalized) return;
  const double w = static_cast<double>(width), h = static_cast<double>(height);
  for (Object& o : item.objects) {
    o.x0 *= w;
    o.x1 *= w;
    o.y0 *= h;
    o.y1 *= h;
    for (auto& polygon : o.polygons)
      for (size_t k = 0; k + 1 < polygon.size(); k += 2) {
        polygon[k] *= w;
        polygon[k + 1] *= h;
      }
    for (size_t k = 0; k + 2 < o.keypoints.size(); k += 3) {
      o.keypoints[k] *= w;
      o.keypoints[k + 1] *= h;
    }
  }
  item.normalized = false;
}

}  // namespace osprey::augment
