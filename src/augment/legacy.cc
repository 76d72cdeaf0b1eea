// Albumentations' other spellings: 1.3.x's older parameter names and units, the values 2.x always writes and
// AlbumentationsX's new names, rewritten to the 1.4.24 names transforms.cc reads (docs/augment.md, "Pipeline JSON").
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

namespace {

// AlbumentationsX (`pip install albumentationsx`, 2.0.9 on: the maintained successor of albumentations, whose last
// release is 2.0.8) renamed the sampling ranges from *_limit to *_range, and a few more. Read under 2.0.8's names.
struct Renamed {
  const char* type;
  const char* name;  // AlbumentationsX's
  const char* was;   // albumentations 2.0.8's
};
constexpr Renamed kAlbumentationsXNames[] = {
    {"Rotate", "angle_range", "limit"},
    {"SafeRotate", "angle_range", "limit"},
    {"ColorJitter", "brightness_range", "brightness"},
    {"ColorJitter", "contrast_range", "contrast"},
    {"ColorJitter", "saturation_range", "saturation"},
    {"ColorJitter", "hue_range", "hue"},
    {"RandomBrightnessContrast", "brightness_range", "brightness_limit"},
    {"RandomBrightnessContrast", "contrast_range", "contrast_limit"},
    {"RandomBrightnessContrast", "ensure_safe_output", "ensure_safe_range"},
    {"HueSaturationValue", "hue_shift_range", "hue_shift_limit"},
    {"HueSaturationValue", "sat_shift_range", "sat_shift_limit"},
    {"HueSaturationValue", "val_shift_range", "val_shift_limit"},
    {"RandomGamma", "gamma_range", "gamma_limit"},
    {"GaussianBlur", "blur_range", "blur_limit"},
    {"GaussianBlur", "sigma_range", "sigma_limit"},
    {"Blur", "blur_range", "blur_limit"},
    {"MedianBlur", "blur_range", "blur_limit"},
    {"MotionBlur", "blur_range", "blur_limit"},
    {"RandomScale", "scale_range", "scale_limit"},
    {"ShiftScaleRotate", "rotate_range", "rotate_limit"},
    {"ShiftScaleRotate", "scale_range", "scale_limit"},
    {"ShiftScaleRotate", "shift_range_x", "shift_limit_x"},
    {"ShiftScaleRotate", "shift_range_y", "shift_limit_y"},
    {"CLAHE", "clip_range", "clip_limit"},
    {"RandomShadow", "num_shadows_range", "num_shadows_limit"},
    {"GridDistortion", "distort_range", "distort_limit"},
};

// AlbumentationsX's new parameters, at the values that leave 2.0.8's behaviour.
struct Neutral {
  const char* type;
  const char* name;
  const char* value;  // JSON text
  const char* why;    // what osprey does instead, for the refusal of another value
};
constexpr Neutral kAlbumentationsXNeutral[] = {
    {"RandomRotate90", "group_element", "null", "osprey draws one of the four rotations"},
    {"RandomRotate90", "group_elements", "null", "osprey draws one of the four rotations"},
    {"RandomResizedCrop", "sampling_method", "\"standard\"", "osprey samples the crop as torchvision does"},
    {"GaussianBlur", "blur_z_range", "null", "osprey blurs 2-D images"},
    {"GaussianBlur", "sigma_z_range", "null", "osprey blurs 2-D images"},
    {"GaussianBlur", "volume_mode", "\"slice\"", "osprey blurs 2-D images"},
    {"GridDistortion", "map_resolution_range", "[1.0, 1.0]", "osprey computes the map at full resolution"},
    {"Normalize", "clip_range", "null", "osprey leaves the normalised values unclipped"},
};

}  // namespace

json FromAlbumentationsX(const std::string& type, const json& j, const std::string& path) {
  if (!j.is_object()) return j;
  json out = j;
  for (const Renamed& r : kAlbumentationsXNames) {
    if (type != r.type || !out.contains(r.name)) continue;
    if (out.contains(r.was) && out[r.was] != out[r.name])
      Bad(path + "." + r.name, std::string("also given as '") + r.was + "' (its name before AlbumentationsX) with " +
                                   "another value: keep one");
    out[r.was] = out[r.name];
    out.erase(r.name);
  }
  for (const Neutral& n : kAlbumentationsXNeutral) {
    if (type != n.type || !out.contains(n.name)) continue;
    const json neutral = json::parse(n.value);
    const json& v = out[n.name];
    if (v != neutral && !(v.is_number() && neutral.is_number() && v.get<double>() == neutral.get<double>()))
      throw Error(ErrorCode::kUnsupported, "pipeline: " + path + "." + n.name + " = " + v.dump() +
                                               " is not supported (" + n.why + "; only " + neutral.dump() + ")");
    out.erase(n.name);
  }
  // AlbumentationsX's ElasticTransform is another transform under the old name: a cubic B-spline control grid.
  if (type == "ElasticTransform" && (out.contains("control_grid_shape") || out.contains("displacement_range")))
    out["_field"] = "bspline";
  return out;
}

// Albumentations 2.x writes every parameter, including new ones at values that change nothing. Those are dropped;
// the same parameters at values that would change the result are refused by name. With `major` >= 2 the parameters
// whose meaning changed get an internal marker (GaussianBlur: "_kernel_rule": "sigma", 2.x's size-from-sigma rule;
// MotionBlur: "_kernel_rule": "v2", 2.x's line).
json FromAlbumentations2(const std::string& type, const json& j, const std::string& path, int major) {
  if (!j.is_object()) return j;
  json out = FromAlbumentationsX(type, j, path);
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
