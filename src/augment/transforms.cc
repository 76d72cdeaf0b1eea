// Pipeline JSON (osprey's and Albumentations' spelling) -> a tree of transforms. Parameter names, defaults and random
// rules follow Albumentations 1.4.24 (2.x files read too; docs/augment.md lists the deviations); the transforms
// themselves are in transforms_geometric.cc and transforms_photometric.cc.
#include "augment/transforms.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <set>

#include "augment/params.h"

namespace osprey::augment {

GeoStep Transform::Geometry(Rng&, const View&) const {
  throw Error(ErrorCode::kInternal, name + " is not geometric");
}
void Transform::Photometric(Rng&, const View&, std::vector<PhotoStep>&) const {
  throw Error(ErrorCode::kInternal, name + " is not photometric");
}

namespace {

const std::map<std::string, Factory>& Factories() {
  static const std::map<std::string, Factory> table = [] {
    std::map<std::string, Factory> f;
    AddGeometricTransforms(f);
    AddPhotometricTransforms(f);
    return f;
  }();
  return table;
}


const std::set<std::string>& Containers() {
  static const std::set<std::string> c = {"Compose", "Sequential", "OneOf", "SomeOf"};
  return c;
}

std::string TypeOf(const json& j, const std::string& path) {
  if (!j.is_object()) Bad(path, "expected a transform object, found " + j.dump());
  for (const char* k : {"__class_fullname__", "type"})
    if (j.contains(k)) {
      if (!j.at(k).is_string()) Bad(path + "." + k, "expected a string");
      std::string t = j.at(k).get<std::string>();
      const size_t dot = t.rfind('.');  // old Albumentations wrote full module paths
      return dot == std::string::npos ? t : t.substr(dot + 1);
    }
  Bad(path, "has no \"type\" (or \"__class_fullname__\")");
}

double ReadP(const json& j, const std::string& path, double def) {
  if (!j.contains("p")) return def;
  if (!j.at("p").is_number()) Bad(path + ".p", "expected a number in [0, 1]");
  const double p = j.at("p").get<double>();
  if (!(p >= 0 && p <= 1)) Bad(path + ".p", "expected a number in [0, 1], found " + j.at("p").dump());
  return p;
}

// Albumentations 2.x's Mosaic is a different transform from osprey's: a grid_yx grid of cell_shape cells, each image
// scaled to cover (or contain) its cell and cut to the part the output window shows, the window (target_size) centred
// at a point drawn within the grid, the primary image in the largest visible cell, and the partner images taken from
// the call's `metadata_key` entry (which a saved pipeline does not carry; missing partners are copies of the primary).
// The refusal says so and writes out the nearest osprey Mosaic for the file's values.
std::string Albumentations2MosaicMessage(const json& m, const std::string& path) {
  auto pair = [&](const char* k, const std::string& def) -> std::string {
    if (!m.contains(k) || !m.at(k).is_array() || m.at(k).size() != 2) return def;
    return m.at(k)[0].dump() + ", " + m.at(k)[1].dump();
  };
  const std::string size = pair("target_size", "512, 512");
  const std::string hw = size.substr(0, size.find(',')), w = size.substr(size.find(',') + 2);
  std::string fill = "0";
  if (m.contains("fill") && m.at("fill").is_number()) fill = m.at("fill").dump();
  std::string key = "mosaic_metadata";
  if (m.contains("metadata_key") && m.at("metadata_key").is_string()) key = m.at("metadata_key").get<std::string>();
  const std::string grid = pair("grid_yx", "2, 2");
  std::string msg =
      "pipeline: " + path + ": Albumentations 2.x's Mosaic is not supported: it takes its partner images from the "
      "\"" + key + "\" entry (metadata_key) that the caller passes with each image, which a saved pipeline does not "
      "carry, and lays them out differently from osprey's Mosaic (a " + grid + " grid of cell_shape [" +
      pair("cell_shape", "512, 512") + "] cells, each image scaled to " +
      (m.contains("fit_mode") && m.at("fit_mode").is_string() ? m.at("fit_mode").get<std::string>() : "cover") +
      " its cell, the primary image in the largest visible cell). osprey's own Mosaic always combines 4 images (the "
      "item at a random quadrant and 3 others that osprey augment picks from the dataset with the item's seed), each "
      "scaled to fit the whole canvas and placed with its corner at a random centre; it must be the first step. The "
      "nearest osprey step for this file: {\"type\": \"Mosaic\", \"height\": " + hw + ", \"width\": " + w +
      ", \"center_range\": [" + pair("center_range", "0.3, 0.7") + "], \"fill\": " + fill + ", \"p\": " +
      (m.contains("p") && m.at("p").is_number() ? m.at("p").dump() : "0.5") + "} (docs/augment.md, Mosaic)";
  if (grid != "2, 2") msg += "; grid_yx [" + grid + "] has no osprey equivalent (always 2 x 2)";
  return msg;
}

PipelineNode ParseNode(const json& j, const std::string& path, std::optional<MosaicSpec>* mosaic, bool top_first);

std::vector<PipelineNode> ParseChildren(const json& j, const std::string& path, std::optional<MosaicSpec>* mosaic, bool top) {
  if (!j.contains("transforms") || !j.at("transforms").is_array()) Bad(path, "expected a \"transforms\" array");
  std::vector<PipelineNode> out;
  const json& ts = j.at("transforms");
  for (size_t i = 0; i < ts.size(); ++i) {
    const std::string p = path + ".transforms[" + std::to_string(i) + "]";
    if (TypeOf(ts[i], p) == "Mosaic" && ts[i].is_object() &&
        (ts[i].contains("grid_yx") || ts[i].contains("cell_shape") || ts[i].contains("target_size") ||
         ts[i].contains("metadata_key") || ts[i].contains("fit_mode")))
      throw Error(ErrorCode::kUnsupported, Albumentations2MosaicMessage(ts[i], p));
    if (top && i == 0 && TypeOf(ts[i], p) == "Mosaic") {
      Params ps(ts[i], p, "Mosaic");
      MosaicSpec m;
      m.height = Positive(ps, "height"), m.width = Positive(ps, "width");
      const Range c = ps.Rng2("center_range", {0.25, 0.75}, Params::kFixed);
      if (c.first < 0 || c.second > 1) Bad(ps.At("center_range"), "must lie in [0, 1]");
      m.center_lo = c.first, m.center_hi = c.second;
      m.fill = ps.Num("fill", 114);
      m.p = ReadP(ts[i], p, 1.0);
      ps.Done();
      *mosaic = m;
      continue;
    }
    out.push_back(ParseNode(ts[i], p, mosaic, false));
  }
  return out;
}

PipelineNode ParseNode(const json& j, const std::string& path, std::optional<MosaicSpec>* mosaic, bool top) {
  PipelineNode n;
  n.name = TypeOf(j, path);
  if (n.name == "Mosaic")
    throw Error(ErrorCode::kUnsupported, "pipeline: " + path + ": Mosaic must be the first step of the top-level Compose");
  if (Containers().count(n.name)) {
    n.kind = n.name == "Compose" ? PipelineNode::kCompose
             : n.name == "Sequential" ? PipelineNode::kSequential
             : n.name == "OneOf"      ? PipelineNode::kOneOf
                                      : PipelineNode::kSomeOf;
    n.p = ReadP(j, path, n.kind == PipelineNode::kOneOf ? 0.5 : 1.0);
    n.children = ParseChildren(j, path, mosaic, top);
    if (n.kind == PipelineNode::kSomeOf) {
      if (!j.contains("n") || !j.at("n").is_number_integer() || j.at("n").get<int64_t>() < 0)
        Bad(path + ".n", "SomeOf needs \"n\", a non-negative integer");
      n.n = j.at("n").get<int64_t>();
      if (j.contains("replace")) {
        if (!j.at("replace").is_boolean()) Bad(path + ".replace", "expected true or false");
        n.replace = j.at("replace").get<bool>();
      }
      if (!n.replace && n.n > static_cast<int64_t>(n.children.size()))
        Bad(path + ".n", "SomeOf picks " + std::to_string(n.n) + " of only " + std::to_string(n.children.size()) +
                             " transforms without replacement");
    }
    if (j.contains("additional_targets") && !j.at("additional_targets").empty())
      throw Error(ErrorCode::kUnsupported, "pipeline: " + path + ".additional_targets is not supported");
    return n;
  }
  const auto& fs = Factories();
  auto it = fs.find(n.name);
  if (it == fs.end())
    throw Error(ErrorCode::kUnsupported, "pipeline: " + path + ": transform \"" + n.name +
                                             "\" is not supported by osprey; supported: " + SupportedTransforms());
  const json spec = FromAlbumentations2(n.name, FromAlbumentations13(n.name, j, path), path, t_albumentations_major);
  Params ps(spec, path, n.name);
  n.kind = PipelineNode::kLeaf;
  // Without "p" (osprey's own files; Albumentations always writes it), Albumentations' default: 1 for the transforms
  // that size, crop or normalise an image, 0.5 for the rest.
  static const std::set<std::string> kAlwaysByDefault = {
      "Normalize", "Resize", "LongestMaxSize", "SmallestMaxSize", "PadIfNeeded", "CenterCrop", "Crop",
      "RandomCrop", "RandomResizedCrop", "RandomSizedCrop", "RandomSizedBBoxSafeCrop"};
  n.p = ReadP(j, path, kAlwaysByDefault.count(n.name) ? 1.0 : 0.5);
  n.leaf = it->second(ps);
  ps.Done();
  return n;
}

BoxFilter ParseBoxFilter(const json& bp, const std::string& path) {
  BoxFilter f;
  if (bp.is_null()) return f;
  if (!bp.is_object()) Bad(path, "expected an object");
  Params ps(bp, path, "bbox_params");
  ps.Ignore("format"), ps.Ignore("label_fields"), ps.Ignore("check_each_transform"), ps.Ignore("clip");
  ps.Ignore("filter_invalid_bboxes"), ps.Ignore("max_accept_ratio");
  // AlbumentationsX: format -> coord_format, clip -> clip_bboxes_on_input; boxes clipped after each transform (as
  // 2.0.8 always did) unless clip_after_transform is false; oriented boxes ("obb") are its own.
  ps.Ignore("coord_format"), ps.Ignore("clip_bboxes_on_input");
  ps.Require("clip_after_transform", true);
  ps.Require("bbox_type", "hbb");
  f.min_area = ps.Num("min_area", 0);
  f.min_visibility = ps.Num("min_visibility", 0);
  f.min_width = ps.Num("min_width", 0);
  f.min_height = ps.Num("min_height", 0);
  if (f.min_area < 0 || f.min_visibility < 0 || f.min_visibility > 1 || f.min_width < 0 || f.min_height < 0)
    Bad(path, "min_area, min_width, min_height must be >= 0 and min_visibility in [0, 1]");
  ps.Done();
  return f;
}

}  // namespace

std::string SupportedTransforms() {
  std::string s;
  for (const auto& [name, f] : Factories()) s += (s.empty() ? "" : ", ") + name;
  return s + ", Mosaic, Compose, Sequential, OneOf, SomeOf";
}

ParsedPipeline ParsePipelineJson(const std::string& text) {
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::exception& e) {
    throw Error(ErrorCode::kInvalidArgument, std::string("pipeline: not valid JSON: ") + e.what());
  }
  if (!doc.is_object()) Bad("(top)", "expected a JSON object");
  const json& root = doc.contains("transform") ? doc.at("transform") : doc;
  const std::string path = doc.contains("transform") ? "transform" : "(top)";
  t_albumentations_major = 1;
  if (doc.contains("__version__") && doc.at("__version__").is_string()) {
    const std::string v = doc.at("__version__").get<std::string>();
    if (!v.empty() && std::isdigit(static_cast<unsigned char>(v[0]))) t_albumentations_major = std::stoi(v);
  }
  ParsedPipeline out;
  const std::string type = TypeOf(root, path);
  if (!Containers().count(type)) {
    // A bare transform: treat as Compose([it]).
    json wrapped = {{"type", "Compose"}, {"transforms", json::array({root})}};
    out.root = ParseNode(wrapped, path, &out.mosaic, true);
  } else {
    out.root = ParseNode(root, path, &out.mosaic, true);
  }
  for (const json* j : {&root, static_cast<const json*>(&doc)})
    if (j->contains("bbox_params")) {
      out.filter = ParseBoxFilter(j->at("bbox_params"), path + ".bbox_params");
      break;
    }
  return out;
}

}  // namespace osprey::augment

