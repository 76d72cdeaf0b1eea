// A model's image preprocessing as an engine graph of osprey-domain ops (docs/image-ops.md), compiled per decoded
// image size and cached; stacking preprocessed images into one batch tensor.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "osprey/classify.h"

namespace osprey {

namespace {

constexpr const char* kDomain = "osprey";

ValueRef ImageOp(GraphBuilder& b, const std::string& op, ValueRef x, AttributeMap attrs, const std::string& name) {
  return b.Op(op, {x}, std::move(attrs), name);
}

std::vector<float> PerChannel(const std::vector<float>& v, int channels, float fallback) {
  if (v.empty()) return std::vector<float>(channels, fallback);
  if (v.size() == 1) return std::vector<float>(channels, v[0]);
  return v;
}

}  // namespace

void PreprocessResizeTarget(const PreprocessSpec& spec, int64_t h, int64_t w, int64_t* out_h, int64_t* out_w) {
  if (h < 1 || w < 1)
    throw Error(ErrorCode::kInvalidArgument,
                "preprocessing: image size " + std::to_string(h) + "x" + std::to_string(w) + " is empty");
  if (spec.resize == "exact") {
    *out_h = spec.crop_height;
    *out_w = spec.crop_width;
  } else if (spec.resize == "shorter") {
    // torchvision.transforms.Resize(int): the shorter side becomes exactly `size`, the longer one is truncated.
    const int64_t s = spec.resize_size;
    if (h <= w) {
      *out_h = s;
      *out_w = std::max<int64_t>(s, static_cast<int64_t>(static_cast<double>(s) * w / h));
    } else {
      *out_w = s;
      *out_h = std::max<int64_t>(s, static_cast<int64_t>(static_cast<double>(s) * h / w));
    }
  } else if (spec.resize == "longer") {
    const int64_t s = spec.resize_size;
    if (h >= w) {
      *out_h = s;
      *out_w = std::clamp<int64_t>(std::llround(static_cast<double>(s) * w / h), 1, s);
    } else {
      *out_w = s;
      *out_h = std::clamp<int64_t>(std::llround(static_cast<double>(s) * h / w), 1, s);
    }
  } else {
    throw Error(ErrorCode::kInvalidArgument,
                "preprocess.resize: expected shorter, exact or longer, found \"" + spec.resize + "\"");
  }
}

Graph BuildPreprocessGraph(const PreprocessSpec& spec, int64_t h, int64_t w, int channels) {
  if (channels != 1 && channels != 3)
    throw Error(ErrorCode::kInvalidArgument,
                "preprocessing: expected a decoded image with 1 or 3 channels, found " + std::to_string(channels));
  int64_t rh = 0, rw = 0;
  PreprocessResizeTarget(spec, h, w, &rh, &rw);

  GraphBuilder b("preprocess");
  ValueRef x = b.Input("image", DType::kU8, {h, w, channels});
  if (rh != h || rw != w)
    x = ImageOp(b, "ResizeImage", x,
                {{"height", Attribute::Int(rh)},
                 {"width", Attribute::Int(rw)},
                 {"mode", Attribute::String(spec.resize_mode)},
                 {"antialias", Attribute::Int(spec.antialias ? 1 : 0)}},
                "resize");
  if (spec.resize == "shorter" && (rh != spec.crop_height || rw != spec.crop_width)) {
    // torchvision.transforms.CenterCrop: int(round((size - crop) / 2)), Python's round (ties to even).
    const int64_t top = static_cast<int64_t>(std::nearbyint((rh - spec.crop_height) / 2.0));
    const int64_t left = static_cast<int64_t>(std::nearbyint((rw - spec.crop_width) / 2.0));
    x = ImageOp(b, "CropImage", x,
                {{"top", Attribute::Int(top)},
                 {"left", Attribute::Int(left)},
                 {"height", Attribute::Int(spec.crop_height)},
                 {"width", Attribute::Int(spec.crop_width)}},
                "center_crop");
  } else if (spec.resize == "longer" && (rh != spec.crop_height || rw != spec.crop_width)) {
    const int64_t pad_h = spec.crop_height - rh, pad_w = spec.crop_width - rw;
    if (pad_h < 0 || pad_w < 0)
      throw Error(ErrorCode::kInvalidArgument, "preprocess.resize_size: resized image " + std::to_string(rh) + "x" +
                                                   std::to_string(rw) + " is larger than the padded size " +
                                                   std::to_string(spec.crop_height) + "x" +
                                                   std::to_string(spec.crop_width));
    x = ImageOp(b, "PadImage", x,
                {{"top", Attribute::Int(pad_h / 2)},
                 {"bottom", Attribute::Int(pad_h - pad_h / 2)},
                 {"left", Attribute::Int(pad_w / 2)},
                 {"right", Attribute::Int(pad_w - pad_w / 2)},
                 {"value", Attribute::Float(0.0f)},
                 {"mode", Attribute::String("constant")}},
                "pad");
  }
  const std::string from = channels == 1 ? "GRAY" : "RGB";
  if (spec.color != from)
    x = ImageOp(b, "ColorConvert", x, {{"from", Attribute::String(from)}, {"to", Attribute::String(spec.color)}},
                "color");
  const int c = spec.channels();
  x = ImageOp(b, "NormalizeImage", x,
              {{"scale", Attribute::Float(spec.scale)},
               {"mean", Attribute::Floats(PerChannel(spec.mean, c, 0.0f))},
               {"std", Attribute::Floats(PerChannel(spec.std, c, 1.0f))},
               {"layout", Attribute::String(spec.layout == "NHWC" ? "HWC" : "CHW")}},
              "normalize");
  b.Output(x, "pixels");
  Graph g = b.Finish();
  for (Node& n : g.nodes) n.domain = kDomain;
  return g;
}

ImagePreprocessor::ImagePreprocessor(PreprocessSpec spec, CompileOptions options, size_t cache_capacity)
    : spec_(std::move(spec)), options_(options), plan_cache_(std::make_unique<PlanCache>(cache_capacity)) {
  // The plan cache key is (this key, image shape, options): the graph depends only on the spec and the image size, so
  // a cache hit needs no graph to be built or fingerprinted.
  spec_key_ = "preprocess:" + spec_.ToJson();
}

Shape ImagePreprocessor::OutputShape() const {
  const int64_t c = spec_.channels();
  if (spec_.layout == "NHWC") return {spec_.crop_height, spec_.crop_width, c};
  return {c, spec_.crop_height, spec_.crop_width};
}

Tensor ImagePreprocessor::Run(const Tensor& image) const {
  if (image.dtype() != DType::kU8 || image.rank() != 3 || (image.dim(2) != 3 && image.dim(2) != 1))
    throw Error(ErrorCode::kInvalidArgument, "preprocessing: expected a uint8 [H, W, 3] or [H, W, 1] image, found " +
                                                 std::string(DTypeName(image.dtype())) + " " +
                                                 ShapeToString(image.shape()));
  const int64_t h = image.dim(0), w = image.dim(1);
  const int c = static_cast<int>(image.dim(2));
  std::vector<TensorSpec> inputs = {TensorSpec{DType::kU8, image.shape()}};
  std::shared_ptr<const Plan> plan = plan_cache_->GetOrCompile(
      spec_key_, inputs, options_, [&] { return Compile(BuildPreprocessGraph(spec_, h, w, c), inputs, options_); });
  std::vector<Tensor> out = plan->Run({image});
  OSPREY_CHECK(out.size() == 1 && out[0].shape() == OutputShape() && out[0].dtype() == DType::kF32);
  return spec_.dtype == DType::kF32 ? out[0] : CastTensor(out[0], spec_.dtype);
}

Tensor StackTensors(const std::vector<Tensor>& items) {
  if (items.empty()) throw Error(ErrorCode::kInvalidArgument, "StackTensors: no tensors");
  Shape shape = items[0].shape();
  for (size_t i = 1; i < items.size(); ++i)
    if (items[i].shape() != shape || items[i].dtype() != items[0].dtype())
      throw Error(ErrorCode::kInvalidArgument, "StackTensors: tensor " + std::to_string(i) + " is " +
                                                   DTypeName(items[i].dtype()) + " " + ShapeToString(items[i].shape()) +
                                                   ", expected " + DTypeName(items[0].dtype()) + " " +
                                                   ShapeToString(shape));
  shape.insert(shape.begin(), static_cast<int64_t>(items.size()));
  Tensor out(items[0].dtype(), shape);
  const size_t bytes = items[0].nbytes();
  for (size_t i = 0; i < items.size(); ++i)
    if (bytes) std::memcpy(static_cast<char*>(out.raw()) + i * bytes, items[i].raw(), bytes);
  return out;
}

}  // namespace osprey
