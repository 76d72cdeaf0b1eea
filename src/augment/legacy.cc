// Albumentations' other spellings: 1.3.x's older parameter names and units, and the values 2.x always writes, rewritten
// to the 1.4.24 names transforms.cc reads (docs/augment.md, "Pipeline JSON").
#include <cmath>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "augment/transforms.h"
#include "osprey/error.h"

namespace osprey::augment {

using nlohmann::json;

namespace {

[[noreturn]] void Bad(const std::string& path, const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, "pipeline: " + path + ": " + what);
}

}  // namespace

// Albumentations 1.3.x wrote some parameters under other names (and a few in other units). Rewrites them to the
// 1.4.24 names the factories read, so pipelines saved by either version load: value / cval / pad_val / fill_value ->
// fill, mode / pad_mode -> border_mode, mask-only values dropped; GaussNoise var_limit (variance, pixel units) ->
// std_range (fractions of 255); ImageCompression quality_lower/upper -> quality_range (compression_type 0/1 -> jpeg/
// webp); CoarseDropout max/min_holes/height/width -> the *_range pairs.
json FromAlbumentations13(const std::string& type, const json& j, const std::string& path) {
  if (!j.is_object()) return j;
  json out = j;
  auto rename = [&](const char* from, const char* to) {
    if (!out.contains(from)) return;
    if (!out.contains(to)) out[to] = out[from];
    out.erase(from);
  };
  for (const char* k : {"value", "cval", "pad_val", "fill_value"}) rename(k, "fill");
  for (const char* k : {"mode", "pad_mode"}) rename(k, "border_mode");
  for (const char* k : {"mask_value", "cval_mask", "mask_pad_val", "mask_fill_value"}) out.erase(k);
  if (type == "RandomGamma" && out.contains("eps") && out["eps"].is_null()) out.erase("eps");
  auto num = [&](const char* k, double def) {
    if (!out.contains(k) || out[k].is_null()) return def;
    if (!out[k].is_number()) Bad(path + "." + k, "expected a number, found " + out[k].dump());
    return out[k].get<double>();
  };
  if (type == "GaussNoise" && out.contains("var_limit")) {
    const json& v = out["var_limit"];  // a number x means (0, x) in 1.3
    std::pair<double, double> var;
    if (v.is_number()) {
      var = {0.0, v.get<double>()};
    } else if (v.is_array() && v.size() == 2 && v[0].is_number() && v[1].is_number()) {
      var = {v[0].get<double>(), v[1].get<double>()};
    } else {
      Bad(path + ".var_limit", "expected a number or a [min, max] pair, found " + v.dump());
    }
    if (var.first < 0 || var.second < var.first) Bad(path + ".var_limit", "variances must be 0 <= min <= max");
    // 1.3 draws the variance uniformly; osprey draws the std uniformly between the two stds (documented).
    out["std_range"] = {std::sqrt(var.first) / 255.0, std::sqrt(var.second) / 255.0};
    const double mean = num("mean", 0) / 255.0;
    out["mean_range"] = {mean, mean};
    out.erase("var_limit");
    out.erase("mean");
  }
  if (type == "ImageCompression" && (out.contains("quality_lower") || out.contains("quality_upper"))) {
    out["quality_range"] = {num("quality_lower", 99), num("quality_upper", 100)};
    out.erase("quality_lower");
    out.erase("quality_upper");
    if (out.contains("compression_type") && out["compression_type"].is_number_integer())
      out["compression_type"] = out["compression_type"].get<int>() == 1 ? "webp" : "jpeg";
  }
  if (type == "CoarseDropout" &&
      (out.contains("max_holes") || out.contains("max_height") || out.contains("max_width"))) {
    const double max_holes = num("max_holes", 8), max_h = num("max_height", 8), max_w = num("max_width", 8);
    out["num_holes_range"] = {num("min_holes", max_holes), max_holes};
    out["hole_height_range"] = {num("min_height", max_h), max_h};
    out["hole_width_range"] = {num("min_width", max_w), max_w};
    for (const char* k : {"max_holes", "max_height", "max_width", "min_holes", "min_height", "min_width"}) out.erase(k);
  }
  return out;
}

// Albumentations 2.x writes every parameter, including new ones at values that change nothing. Those are dropped;
// the same parameters at values that would change the result are refused by name. With `major` >= 2 the parameters
// whose meaning changed get an internal marker (GaussianBlur: "_kernel_rule": "sigma", 2.x's size-from-sigma rule;
// MotionBlur: "_kernel_rule": "v2", 2.x's line).
json FromAlbumentations2(const std::string& type, const json& j, const std::string& path, int major) {
  if (!j.is_object()) return j;
  json out = j;
  auto drop_if = [&](const char* key, const std::function<bool(const json&)>& no_op, const std::string& why) {
    auto it = out.find(key);
    if (it == out.end()) return;
    if (!no_op(*it))
      throw Error(ErrorCode::kUnsupported, "pipeline: " + path + "." + key + " = " + it->dump() + " is not supported (" +
                                               why + ")");
    out.erase(key);
  };
  auto is_null = [](const json& v) { return v.is_null(); };
  drop_if("area_for_downscale", is_null,
          "cv2.INTER_AREA for downscales; osprey resamples with the transform's interpolation: remove it or set null");
  drop_if("max_size_hw", is_null, "give max_size instead");
  drop_if("pad_height_divisor", is_null, "osprey pads to min_height/min_width");
  drop_if("pad_width_divisor", is_null, "osprey pads to min_height/min_width");
  if (type == "PadIfNeeded")
    drop_if("padding", [](const json& v) {
      if (v.is_null() || (v.is_number() && v.get<double>() == 0)) return true;
      if (!v.is_array()) return false;
      for (const json& e : v)
        if (!e.is_number() || e.get<double>() != 0) return false;
      return true;
    }, "explicit padding amounts; osprey pads to min_height/min_width");
  if (major >= 2 && type == "GaussianBlur") out["_kernel_rule"] = "sigma";
  if (major >= 2 && type == "MotionBlur") out["_kernel_rule"] = "v2";  // 2.x draws the kernel's line differently
  return out;
}

}  // namespace osprey::augment
