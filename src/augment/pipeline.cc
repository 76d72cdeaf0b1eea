// Pipeline::Apply: walks the parsed tree with the item's random source, composes consecutive geometric steps into one
// warp, and runs the image work as small engine graphs built for this image (docs/augment.md).
#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "augment/filters.h"
#include "augment/transforms.h"
#include "osprey/dataset.h"
#include "osprey/error.h"
#include "osprey/image.h"
#include "osprey/runtime.h"

namespace osprey::augment {

const char* BoxFormatName(BoxFormat f) {
  switch (f) {
    case BoxFormat::kCoco: return "coco";
    case BoxFormat::kPascalVoc: return "pascal_voc";
    case BoxFormat::kYolo: return "yolo";
    case BoxFormat::kAlbumentations: return "albumentations";
  }
  return "?";
}

BoxFormat ParseBoxFormat(const std::string& name) {
  for (BoxFormat f : {BoxFormat::kCoco, BoxFormat::kPascalVoc, BoxFormat::kYolo, BoxFormat::kAlbumentations})
    if (name == BoxFormatName(f)) return f;
  throw Error(ErrorCode::kInvalidArgument,
              "box format \"" + name + "\" is unknown; expected coco, pascal_voc, yolo or albumentations");
}

std::array<double, 4> BoxToXyxy(BoxFormat format, const std::array<double, 4>& b, int64_t width, int64_t height) {
  const double W = static_cast<double>(width), H = static_cast<double>(height);
  switch (format) {
    case BoxFormat::kCoco: return {b[0], b[1], b[0] + b[2], b[1] + b[3]};
    case BoxFormat::kPascalVoc: return b;
    case BoxFormat::kYolo:
      return {(b[0] - b[2] / 2) * W, (b[1] - b[3] / 2) * H, (b[0] + b[2] / 2) * W, (b[1] + b[3] / 2) * H};
    case BoxFormat::kAlbumentations: return {b[0] * W, b[1] * H, b[2] * W, b[3] * H};
  }
  return b;
}

std::array<double, 4> BoxFromXyxy(BoxFormat format, const std::array<double, 4>& b, int64_t width, int64_t height) {
  const double W = static_cast<double>(width), H = static_cast<double>(height);
  switch (format) {
    case BoxFormat::kCoco: return {b[0], b[1], b[2] - b[0], b[3] - b[1]};
    case BoxFormat::kPascalVoc: return b;
    case BoxFormat::kYolo:
      return {(b[0] + b[2]) / 2 / W, (b[1] + b[3]) / 2 / H, (b[2] - b[0]) / W, (b[3] - b[1]) / H};
    case BoxFormat::kAlbumentations: return {b[0] / W, b[1] / H, b[2] / W, b[3] / H};
  }
  return b;
}

struct Pipeline::Impl {
  ParsedPipeline parsed;
  // Mask settings the pipeline asks for that osprey does not apply (masks move nearest-neighbour, 0 outside, untouched
  // by photometric steps): Apply refuses masks when there are any, instead of doing something else silently.
  std::vector<std::string> mask_problems;
  bool returns_float = false;  // ends in Normalize
};

namespace {

const char* BorderName(int code) {
  switch (code) {
    case 1: return "replicate";
    case 2: return "reflect";
    case 4: return "reflect101";
    default: return "constant";
  }
}

std::vector<float> MatrixAttr(const Mat3& m) {
  std::vector<float> v(9);
  for (int i = 0; i < 9; ++i) v[i] = static_cast<float>(m.m[i]);
  return v;
}

// Thrown by a dry run (Executor::StartDry) at the first step that is not part of the leading geometric run.
struct DryRunEnd {};

// The image work of one application: a chain of graphs (split only by encode/decode round trips) plus the pending
// geometric run and the objects.
class Executor {
 public:
  Executor(const BoxFilter& filter, ApplyReport* report) : filter_(filter), report_(report) {}

  void Start(const Sample& s) {
    inputs_ = {s.image};
    objects_ = s.objects;
    masks_ = s.masks;
    keypoints_ = s.keypoints;
    StartGraph();
    if (s.source_width > 0 || s.source_height > 0) {  // a window of the source: the geometry sees the whole source
      if (!s.masks.empty())
        throw Error(ErrorCode::kInvalidArgument, "augment: a sample that is a window of its source cannot have masks");
      if (s.window_x < 0 || s.window_y < 0 || s.window_x + w_ > s.source_width || s.window_y + h_ > s.source_height)
        throw Error(ErrorCode::kInvalidArgument, "augment: the " + std::to_string(w_) + "x" + std::to_string(h_) +
                                                     " window at (" + std::to_string(s.window_x) + ", " +
                                                     std::to_string(s.window_y) + ") is not inside the " +
                                                     std::to_string(s.source_width) + "x" +
                                                     std::to_string(s.source_height) + " source");
      w_ = gw_ = s.source_width, h_ = gh_ = s.source_height;
      window_x_ = s.window_x, window_y_ = s.window_y;
      window_pending_ = true;
    }
  }

  // Geometry only, no pixels: the walk runs until the first step that is not part of the leading geometric run
  // (DryRunEnd), so Window() sees the composed warp Apply will run first.
  void StartDry(int64_t width, int64_t height, int channels, const std::vector<Object>& objects) {
    dry_ = true;
    objects_ = objects;
    w_ = gw_ = width, h_ = gh_ = height, c_ = channels;
  }

  // The source pixels the pending warp reads (Pipeline::SourceWindow); false when that is all of them or cannot be
  // bounded exactly (perspective warps).
  bool Window(std::array<int64_t, 4>* window) const {
    if (!geo_pending_ || (m_.IsIdentity() && w_ == gw_ && h_ == gh_)) return false;
    const std::vector<float> a = MatrixAttr(PixelInverseMap(m_));
    if (a[6] != 0.f || a[7] != 0.f || a[8] != 1.f) return false;
    // The kernels read the taps at floor(p) and floor(p) + 1 of each output pixel's source position p, which is
    // affine in the output pixel: its extremes are at the corners. Two pixels of margin on each side.
    const double xs[2] = {0.0, double(w_ - 1)}, ys[2] = {0.0, double(h_ - 1)};
    double lo[2] = {INFINITY, INFINITY}, hi[2] = {-INFINITY, -INFINITY};
    for (double x : xs)
      for (double y : ys)
        for (int k = 0; k < 2; ++k) {
          const double p = double(a[3 * k]) * x + double(a[3 * k + 1]) * y + double(a[3 * k + 2]);
          lo[k] = std::min(lo[k], p), hi[k] = std::max(hi[k], p);
        }
    const int64_t size[2] = {gw_, gh_};
    int64_t begin[2], end[2];
    for (int k = 0; k < 2; ++k) {
      if (!(lo[k] > -1e9 && hi[k] < 1e9)) return false;
      const int64_t b = static_cast<int64_t>(std::floor(lo[k])) - 2, e = static_cast<int64_t>(std::floor(hi[k])) + 4;
      begin[k] = std::clamp<int64_t>(b, 0, size[k]), end[k] = std::clamp<int64_t>(e, 0, size[k]);
      // Reads beyond an edge take border pixels: constant and replicate borders see the same edge in the window
      // (the window reaches that edge); reflecting ones mirror back inside, which the window must then cover.
      if (border_ == 2 || border_ == 4) {
        if (b < 0) end[k] = std::max(end[k], std::min(size[k], -b + 2));
        if (e > size[k]) begin[k] = std::min(begin[k], std::max<int64_t>(0, 2 * size[k] - e - 2));
      }
      if (begin[k] >= end[k]) return false;
      // The window's matrix is the source's with the offset taken from its translation, which must stay exact.
      const float t = a[3 * k + 2];
      if (double(t - float(begin[k])) != double(t) - double(begin[k])) return false;
    }
    if (begin[0] == 0 && begin[1] == 0 && end[0] == gw_ && end[1] == gh_) return false;
    *window = {begin[0], begin[1], end[0], end[1]};
    return true;
  }

  // Mosaic: four images, each warped into its cell of the canvas by `forward[i]`, cells concatenated.
  void StartMosaic(const std::vector<const Sample*>& tiles, const std::array<Mat3, 4>& forward,
                   const std::array<std::array<int64_t, 4>, 4>& cells, int64_t width, int64_t height, double fill) {
    inputs_.clear();
    objects_.clear();
    b_ = std::make_unique<GraphBuilder>("augment");
    int channels = 3;
    for (const Sample* t : tiles) channels = std::min<int>(channels, static_cast<int>(t->image.dim(2)));
    std::vector<ValueRef> parts;
    for (int i = 0; i < 4; ++i) {
      const Sample& t = *tiles[i];
      Tensor img = t.image;
      if (img.dim(2) != channels) img = ToChannels(img, channels);
      inputs_.push_back(img);
      ValueRef x = b_->Input("image" + std::to_string(i), DType::kU8, {img.dim(0), img.dim(1), img.dim(2)});
      const auto& c = cells[i];
      const Mat3 local = Mat3::Translate(-double(c[0]), -double(c[1])) * forward[i];
      parts.push_back(b_->Op("WarpPerspective", {x},
                             {{"matrix", Attribute::Floats(MatrixAttr(PixelInverseMap(local)))},
                              {"height", Attribute::Int(c[3] - c[1])},
                              {"width", Attribute::Int(c[2] - c[0])},
                              {"mode", Attribute::String("bilinear")},
                              {"border_mode", Attribute::String("constant")},
                              {"border_value", Attribute::Float(static_cast<float>(fill))}}));
      std::vector<Object> objs = t.objects;
      const int64_t dropped = MoveObjects(
          objs, forward[i], {double(c[0]), double(c[1]), double(c[2]), double(c[3])}, filter_);
      if (report_) report_->objects_dropped += dropped;
      objects_.insert(objects_.end(), objs.begin(), objs.end());
    }
    ValueRef top = b_->Op("Concat", {parts[0], parts[1]}, {{"axis", Attribute::Int(1)}});
    ValueRef bottom = b_->Op("Concat", {parts[2], parts[3]}, {{"axis", Attribute::Int(1)}});
    x_ = b_->Op("Concat", {top, bottom}, {{"axis", Attribute::Int(0)}});
    has_ops_ = true;
    w_ = gw_ = width, h_ = gh_ = height, c_ = channels;
    if (report_) report_->warps += 4;
  }

  View CurrentView() const {
    View v;
    v.width = w_, v.height = h_, v.channels = c_;
    for (const Object& o : objects_) {
      const double cx[4] = {o.x0, o.x1, o.x1, o.x0}, cy[4] = {o.y0, o.y0, o.y1, o.y1};
      std::array<double, 4> b = {INFINITY, INFINITY, -INFINITY, -INFINITY};
      bool ok = true;
      for (int i = 0; i < 4 && ok; ++i) {
        double x, y;
        ok = m_.Map(cx[i], cy[i], &x, &y);
        b = {std::min(b[0], x), std::min(b[1], y), std::max(b[2], x), std::max(b[3], y)};
      }
      if (!ok) continue;
      b = {std::max(b[0], 0.0), std::max(b[1], 0.0), std::min(b[2], double(w_)), std::min(b[3], double(h_))};
      if (b[2] > b[0] && b[3] > b[1]) v.boxes.push_back(b);
    }
    return v;
  }

  void AddGeo(const GeoStep& s) {
    if (dry_ && (s.remap || s.dense)) throw DryRunEnd{};
    if (s.remap) {
      // A displacement field is no matrix: the pending warp runs first, then the field on the host (filters.h).
      FlushGeo();
      RunGraph();
      inputs_ = {RemapSeparable(inputs_[0], *s.remap, s.remap->interpolation)};
      SeparableRemap mask_remap = *s.remap;
      mask_remap.fill = 0;  // masks: 0 outside, nearest-neighbour
      for (Tensor& mask : masks_) mask = RemapSeparable(mask, mask_remap, 0);
      const int64_t dropped = RemapObjects(objects_, keypoints_, *s.remap, w_, h_, filter_);
      if (report_) report_->objects_dropped += dropped, ++report_->warps;
      StartGraph();
      return;
    }
    if (s.dense) {
      FlushGeo();
      RunGraph();
      inputs_ = {RemapDense(inputs_[0], *s.dense, s.dense->interpolation)};
      if (!masks_.empty()) {
        DenseRemap mask_remap = *s.dense;
        mask_remap.fill = 0;  // masks: 0 outside, nearest-neighbour
        for (Tensor& mask : masks_) mask = RemapDense(mask, mask_remap, 0);
      }
      const int64_t dropped = RemapObjectsDense(objects_, keypoints_, *s.dense, filter_);
      if (report_) report_->objects_dropped += dropped, ++report_->warps;
      StartGraph();
      return;
    }
    // Parameters are checked against the image before anything allocates: a resize or pad to an absurd size is a
    // clear error, not a multi-gigabyte buffer.
    constexpr int64_t kMaxPixels = int64_t{1} << 28;
    if (s.width < 1 || s.height < 1 || s.width > kMaxPixels / s.height)
      throw Error(ErrorCode::kInvalidArgument,
                  "a geometric step would turn the " + std::to_string(w_) + "x" + std::to_string(h_) + " image into " +
                      std::to_string(s.width) + "x" + std::to_string(s.height) +
                      "; osprey augment's limit is 2^28 pixels (268 megapixels) per image: check the pipeline's sizes");
    m_ = s.forward * m_;
    w_ = s.width, h_ = s.height;
    if (s.interpolation >= 0 && interp_ < 0) interp_ = s.interpolation;
    if (s.border >= 0) border_ = s.border, fill_ = s.fill;
    geo_pending_ = true;
  }

  void AddPhoto(const PhotoStep& s) {
    if (dry_) throw DryRunEnd{};
    FlushGeo();
    if (s.host) {
      RunGraph();
      inputs_ = {s.host(inputs_[0])};
      StartGraph();
      return;
    }
    if (s.op.empty()) {
      RunGraph();
      Tensor img = inputs_[0];
      const std::string bytes = EncodeImage(img, s.codec, s.quality);
      DecodeOptions opts;
      opts.channels = static_cast<int>(img.dim(2));
      inputs_ = {DecodeImage(bytes.data(), bytes.size(), opts)};
      StartGraph();
      return;
    }
    x_ = b_->Op(s.op, {x_}, s.attrs);
    has_ops_ = true;
    if (s.op == "ColorConvert") c_ = s.attrs.at("to").s == "GRAY" ? 1 : 3;
  }

  Sample Finish() {
    FlushGeo();
    RunGraph();
    Sample out;
    out.image = inputs_[0];
    out.objects = std::move(objects_);
    out.masks = std::move(masks_);
    out.keypoints = std::move(keypoints_);
    return out;
  }

 private:
  static Tensor ToChannels(const Tensor& img, int channels) {
    // Mosaic tiles of mixed gray/RGB: keep the first `channels` (gray images are already 1 channel).
    const int64_t h = img.dim(0), w = img.dim(1), c = img.dim(2);
    Tensor out(DType::kU8, {h, w, channels});
    const uint8_t* s = img.data<uint8_t>();
    uint8_t* d = out.data<uint8_t>();
    for (int64_t i = 0; i < h * w; ++i) {
      if (channels == 1) d[i] = static_cast<uint8_t>((299 * s[i * c] + 587 * s[i * c + 1] + 114 * s[i * c + 2] + 500) / 1000);
      else for (int k = 0; k < channels; ++k) d[i * channels + k] = s[i * c + std::min<int64_t>(k, c - 1)];
    }
    return out;
  }

  void StartGraph() {
    const Tensor& img = inputs_[0];
    b_ = std::make_unique<GraphBuilder>("augment");
    x_ = b_->Input("image", img.dtype(), {img.dim(0), img.dim(1), img.dim(2)});
    has_ops_ = false;
    w_ = gw_ = img.dim(1), h_ = gh_ = img.dim(0), c_ = static_cast<int>(img.dim(2));
  }

  void FlushGeo() {
    if (!geo_pending_ && !window_pending_) return;
    geo_pending_ = false;
    if (!(m_.IsIdentity() && w_ == gw_ && h_ == gh_) || window_pending_) {
      std::vector<float> matrix = MatrixAttr(PixelInverseMap(m_));
      if (window_pending_) {  // the image is a window of the source: source pixel (x, y) is its (x - wx, y - wy)
        if (matrix[6] != 0.f || matrix[7] != 0.f || matrix[8] != 1.f)
          throw Error(ErrorCode::kInvalidArgument, "augment: a window of the source needs an affine first warp "
                                                   "(use Pipeline::SourceWindow to choose windows)");
        matrix[2] -= static_cast<float>(window_x_), matrix[5] -= static_cast<float>(window_y_);
        window_pending_ = false;
      }
      x_ = b_->Op("WarpPerspective", {x_},
                  {{"matrix", Attribute::Floats(matrix)},
                   {"height", Attribute::Int(h_)},
                   {"width", Attribute::Int(w_)},
                   {"mode", Attribute::String(interp_ == 1 ? "bilinear" : "nearest")},
                   {"border_mode", Attribute::String(BorderName(border_))},
                   {"border_value", Attribute::Float(border_ >= 0 ? static_cast<float>(fill_) : 0.0f)}});
      has_ops_ = true;
      // A reflecting border shows mirrored objects too: Albumentations labels them, and so does osprey.
      std::vector<Object> copies;
      if (border_ == 2 || border_ == 4)
        copies = ReflectedCopies(objects_, m_, double(gw_), double(gh_), double(w_), double(h_));
      const int64_t dropped = MoveObjects(objects_, m_, {0, 0, double(w_), double(h_)}, filter_);
      MoveObjects(copies, m_, {0, 0, double(w_), double(h_)}, filter_);
      objects_.insert(objects_.end(), std::make_move_iterator(copies.begin()), std::make_move_iterator(copies.end()));
      if (report_) report_->objects_dropped += dropped, ++report_->warps;
      for (Tensor& mask : masks_) mask = WarpMask(mask);
      MoveKeypoints(keypoints_, m_, {0, 0, double(w_), double(h_)});
    }
    m_ = Mat3{};
    gw_ = w_, gh_ = h_;
    interp_ = border_ = -1;
    fill_ = 0;
  }

  // A mask through the pending warp: nearest-neighbour, the image's border mode, 0 outside for constant borders.
  Tensor WarpMask(const Tensor& mask) const {
    GraphBuilder b("augment_mask");
    ValueRef x = b.Input("mask", DType::kU8, mask.shape());
    b.Output(b.Op("WarpPerspective", {x},
                  {{"matrix", Attribute::Floats(MatrixAttr(PixelInverseMap(m_)))},
                   {"height", Attribute::Int(h_)},
                   {"width", Attribute::Int(w_)},
                   {"mode", Attribute::String("nearest")},
                   {"border_mode", Attribute::String(BorderName(border_))},
                   {"border_value", Attribute::Float(0.0f)}}),
             "out");
    Graph g = b.Finish();
    for (osprey::Node& n : g.nodes) n.domain = "osprey";
    CompileOptions opts;
    opts.num_threads = 1;
    return Compile(g, {TensorSpec{DType::kU8, mask.shape()}}, opts)->Run({mask})[0];
  }

  void RunGraph() {
    if (!has_ops_) return;
    b_->Output(x_, "out");
    Graph g = b_->Finish();
    for (osprey::Node& n : g.nodes)
      if (n.op_type != "Concat") n.domain = "osprey";
    std::vector<TensorSpec> specs;
    for (const Tensor& t : inputs_) specs.push_back(TensorSpec{t.dtype(), t.shape()});
    CompileOptions opts;
    opts.num_threads = 1;
    std::shared_ptr<const Plan> plan = Compile(g, specs, opts);
    std::vector<Tensor> out = plan->Run(inputs_);
    inputs_ = {out[0]};
    if (report_) ++report_->graphs;
    StartGraph();
  }

  const BoxFilter& filter_;
  ApplyReport* report_;
  std::vector<Tensor> inputs_;
  std::vector<Object> objects_;
  std::vector<Tensor> masks_;
  std::vector<double> keypoints_;
  std::unique_ptr<GraphBuilder> b_;
  ValueRef x_;
  bool has_ops_ = false;
  int64_t w_ = 0, h_ = 0, gw_ = 0, gh_ = 0;
  int c_ = 3;
  Mat3 m_;
  bool geo_pending_ = false;
  bool dry_ = false;             // StartDry: geometry only
  bool window_pending_ = false;  // Start with a window: the first warp reads it at (window_x_, window_y_)
  int64_t window_x_ = 0, window_y_ = 0;
  int interp_ = -1, border_ = -1;
  double fill_ = 0;
};

// Indices `n` drawn from weights `w` (with or without replacement), sorted, as Albumentations' SomeOf.
std::vector<size_t> WeightedPick(Rng& rng, const std::vector<double>& w, int64_t n, bool replace) {
  std::vector<double> weights = w;
  std::vector<size_t> out;
  for (int64_t k = 0; k < n; ++k) {
    double total = 0;
    for (double x : weights) total += x;
    if (!(total > 0)) break;
    double r = rng.Unit() * total;
    size_t i = 0;
    while (i + 1 < weights.size() && (r -= weights[i]) >= 0) ++i;
    if (weights[i] <= 0)  // landed on a zero weight through rounding: take the last positive one
      for (size_t j = weights.size(); j-- > 0;)
        if (weights[j] > 0) {
          i = j;
          break;
        }
    out.push_back(i);
    if (!replace) weights[i] = 0;
  }
  std::sort(out.begin(), out.end());
  return out;
}

void Walk(const PipelineNode& n, Rng& rng, Executor& ex, bool force, ApplyReport* report) {
  if (!force && !rng.Chance(n.p)) return;
  switch (n.kind) {
    case PipelineNode::kLeaf: {
      if (report) report->applied.push_back(n.name);
      if (n.leaf->IsGeometric()) {
        ex.AddGeo(n.leaf->Geometry(rng, ex.CurrentView()));
      } else {
        std::vector<PhotoStep> steps;
        n.leaf->Photometric(rng, ex.CurrentView(), steps);
        for (const PhotoStep& s : steps) ex.AddPhoto(s);
      }
      return;
    }
    case PipelineNode::kCompose:
    case PipelineNode::kSequential:
      for (const PipelineNode& c : n.children) Walk(c, rng, ex, false, report);
      return;
    case PipelineNode::kOneOf:
    case PipelineNode::kSomeOf: {
      std::vector<double> w;
      for (const PipelineNode& c : n.children) w.push_back(c.p);
      for (size_t i : WeightedPick(rng, w, n.kind == PipelineNode::kOneOf ? 1 : n.n, n.kind == PipelineNode::kOneOf || n.replace))
        Walk(n.children[i], rng, ex, true, report);
      return;
    }
  }
}

void DescribeNode(const PipelineNode& n, int depth, std::ostringstream& os) {
  os << std::string(depth * 2, ' ') << n.name << " (p=" << n.p;
  if (n.kind == PipelineNode::kSomeOf) os << ", n=" << n.n;
  os << ")\n";
  for (const PipelineNode& c : n.children) DescribeNode(c, depth + 1, os);
}

}  // namespace

Pipeline::Pipeline(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Pipeline::Pipeline(Pipeline&&) noexcept = default;
Pipeline& Pipeline::operator=(Pipeline&&) noexcept = default;
Pipeline::~Pipeline() = default;

namespace {

// Non-zero mask fills (any fill_mask for CoarseDropout, which would cut the holes into the mask too) and mask
// interpolations other than nearest, by path. Albumentations 1.3/1.4 and 2.x names.
void FindMaskSettings(const nlohmann::json& node, const std::string& path, std::vector<std::string>* out) {
  if (!node.is_object()) return;
  std::string kind;
  for (const char* key : {"__class_fullname__", "type"})
    if (node.contains(key) && node[key].is_string()) kind = node[key].get<std::string>();
  kind = kind.substr(kind.rfind('.') == std::string::npos ? 0 : kind.rfind('.') + 1);
  auto is_zero = [](const nlohmann::json& v) {
    if (v.is_number()) return v.get<double>() == 0;
    if (!v.is_array()) return false;
    for (const auto& e : v)
      if (!e.is_number() || e.get<double>() != 0) return false;
    return true;
  };
  for (const char* key : {"fill_mask", "mask_value", "cval_mask", "mask_pad_val", "mask_fill_value"}) {
    auto it = node.find(key);
    if (it == node.end() || it->is_null()) continue;
    if (kind == "CoarseDropout" || !is_zero(*it)) out->push_back(path + "." + key + " = " + it->dump());
  }
  if (auto it = node.find("mask_interpolation"); it != node.end() && !it->is_null() && !is_zero(*it))
    out->push_back(path + ".mask_interpolation = " + it->dump());
  if (auto it = node.find("transforms"); it != node.end() && it->is_array())
    for (size_t i = 0; i < it->size(); ++i)
      FindMaskSettings((*it)[i], path + ".transforms[" + std::to_string(i) + "]", out);
}

}  // namespace

namespace {

// Normalize makes the image float32, which the steps after it (uint8 lookup tables, colour ops, encoders) do not take:
// it may only be the last step of the top-level Compose. Returns whether the pipeline has it there.
bool CheckNormalizeLast(const PipelineNode& node, const std::string& path, bool is_root, bool last_top_level) {
  if (node.kind == PipelineNode::kLeaf) {
    if (node.name != "Normalize") return false;
    if (!last_top_level)
      throw Error(ErrorCode::kUnsupported,
                  "pipeline: " + path +
                      ": Normalize must be the last step of the top-level "
                      "Compose (it makes the image float32, which the other steps do not take)");
    return true;
  }
  bool found = false;
  for (size_t i = 0; i < node.children.size(); ++i)
    found |= CheckNormalizeLast(node.children[i], path + ".transforms[" + std::to_string(i) + "]", false,
                                is_root && node.kind == PipelineNode::kCompose && i + 1 == node.children.size());
  return found;
}

}  // namespace

Pipeline Pipeline::FromJson(const std::string& json_text) {
  auto impl = std::make_unique<Impl>();
  impl->parsed = ParsePipelineJson(json_text);  // validates the text first
  impl->returns_float = CheckNormalizeLast(impl->parsed.root, "transform", true, false);
  const nlohmann::json doc = nlohmann::json::parse(json_text);
  FindMaskSettings(doc.contains("transform") ? doc["transform"] : doc, "transform", &impl->mask_problems);
  return Pipeline(std::move(impl));
}

namespace {

nlohmann::json StepJson(const Step& step, const std::string& path) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(step.params.empty() ? "{}" : step.params);
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::kInvalidArgument, "pipeline: " + path + " (" + step.type + "): params are not valid JSON: " +
                                                 e.what());
  }
  if (!j.is_object())
    throw Error(ErrorCode::kInvalidArgument, "pipeline: " + path + " (" + step.type + "): params must be a JSON object");
  j["type"] = step.type;
  j["p"] = step.p;
  if (!step.children.empty() || step.type == "Compose" || step.type == "Sequential" || step.type == "OneOf" ||
      step.type == "SomeOf") {
    nlohmann::json children = nlohmann::json::array();
    for (size_t i = 0; i < step.children.size(); ++i)
      children.push_back(StepJson(step.children[i], path + ".transforms[" + std::to_string(i) + "]"));
    j["transforms"] = children;
    if (step.type == "SomeOf") j["n"] = step.n;
  }
  return j;
}

}  // namespace

Pipeline Pipeline::FromSteps(const std::vector<Step>& steps, const BoxFilter& filter) {
  nlohmann::json root = {{"type", "Compose"}, {"p", 1.0}, {"transforms", nlohmann::json::array()}};
  for (size_t i = 0; i < steps.size(); ++i)
    root["transforms"].push_back(StepJson(steps[i], "(top).transforms[" + std::to_string(i) + "]"));
  root["bbox_params"] = {{"min_area", filter.min_area},
                         {"min_visibility", filter.min_visibility},
                         {"min_width", filter.min_width},
                         {"min_height", filter.min_height}};
  return FromJson(root.dump());
}

Pipeline Pipeline::FromFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(ErrorCode::kNotFound, "pipeline: cannot open " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  try {
    return FromJson(ss.str());
  } catch (const Error& e) {
    throw Error(e.code(), path + ": " + e.what());
  }
}

int Pipeline::images_needed() const { return impl_->parsed.mosaic ? 4 : 1; }
bool Pipeline::returns_float() const { return impl_->returns_float; }
const BoxFilter& Pipeline::box_filter() const { return impl_->parsed.filter; }

std::string Pipeline::Describe() const {
  std::ostringstream os;
  if (const auto& m = impl_->parsed.mosaic)
    os << "Mosaic (p=" << m->p << ", " << m->height << "x" << m->width << ")\n";
  DescribeNode(impl_->parsed.root, 0, os);
  return os.str();
}

bool Pipeline::SourceWindow(int64_t width, int64_t height, int channels, const std::vector<Object>& objects,
                            uint64_t seed, std::array<int64_t, 4>* window) const {
  const ParsedPipeline& p = impl_->parsed;
  if (p.mosaic || width < 1 || height < 1) return false;
  Rng rng(seed);  // the same draws, in the same order, as Apply's walk up to the first non-geometric step
  Executor ex(p.filter, nullptr);
  ex.StartDry(width, height, channels, objects);
  try {
    Walk(p.root, rng, ex, false, nullptr);
  } catch (const DryRunEnd&) {
  }
  return ex.Window(window);
}

Sample Pipeline::Apply(const Sample& sample, uint64_t seed, const std::function<Sample(int)>& others,
                       ApplyReport* report) const {
  const Tensor& img = sample.image;
  if (img.dtype() != DType::kU8 || img.rank() != 3 || (img.dim(2) != 1 && img.dim(2) != 3) || img.dim(0) < 1 ||
      img.dim(1) < 1)
    throw Error(ErrorCode::kInvalidArgument, "augment: expected a uint8 [H, W, 1] or [H, W, 3] image, found " +
                                                 std::string(DTypeName(img.dtype())) + " " + ShapeToString(img.shape()));
  if (report) report->objects_in += static_cast<int64_t>(sample.objects.size());
  if (!sample.masks.empty() && !impl_->mask_problems.empty()) {
    std::string list;
    for (const std::string& p : impl_->mask_problems) list += (list.empty() ? "" : "; ") + p;
    throw Error(ErrorCode::kUnsupported, "augment: osprey moves masks nearest-neighbour with 0 outside the image and "
                                         "leaves them out of photometric steps; this pipeline asks otherwise: " + list);
  }
  for (size_t i = 0; i < sample.masks.size(); ++i) {
    const Tensor& m = sample.masks[i];
    if (m.dtype() != DType::kU8 || m.rank() != 3 || m.dim(0) != img.dim(0) || m.dim(1) != img.dim(1) || m.dim(2) < 1)
      throw Error(ErrorCode::kInvalidArgument, "augment: mask " + std::to_string(i) + " must be uint8 [" +
                                                   std::to_string(img.dim(0)) + ", " + std::to_string(img.dim(1)) +
                                                   ", C] like the image, found " + DTypeName(m.dtype()) + " " +
                                                   ShapeToString(m.shape()));
  }
  const ParsedPipeline& p = impl_->parsed;
  Rng rng(seed);
  Executor ex(p.filter, report);
  if (p.mosaic && rng.Chance(p.mosaic->p)) {
    if (!sample.masks.empty() || !sample.keypoints.empty() || sample.source_width > 0)
      throw Error(ErrorCode::kUnsupported, "augment: Mosaic with masks, free keypoints or a window of the source is "
                                           "not supported; drop them or the Mosaic");
    if (!others)
      throw Error(ErrorCode::kInvalidArgument, "augment: the pipeline starts with Mosaic, which needs 3 more images");
    const MosaicSpec& m = *p.mosaic;
    const int64_t pos = rng.Int(0, 3);
    std::vector<Sample> extra;
    for (int i = 0; i < 3; ++i) {
      extra.push_back(others(i));
      const Tensor& t = extra.back().image;
      if (t.dtype() != DType::kU8 || t.rank() != 3 || (t.dim(2) != 1 && t.dim(2) != 3))
        throw Error(ErrorCode::kInvalidArgument, "augment: Mosaic tile " + std::to_string(i + 1) +
                                                     " is not a uint8 [H, W, 1|3] image");
      if (report) report->objects_in += static_cast<int64_t>(extra.back().objects.size());
    }
    std::vector<const Sample*> tiles(4);
    for (int i = 0, e = 0; i < 4; ++i) tiles[i] = i == pos ? &sample : &extra[e++];
    const double W = double(m.width), H = double(m.height);
    const int64_t xc = std::clamp<int64_t>(std::llround(rng.Uniform(m.center_lo, m.center_hi) * W), 1, m.width - 1);
    const int64_t yc = std::clamp<int64_t>(std::llround(rng.Uniform(m.center_lo, m.center_hi) * H), 1, m.height - 1);
    std::array<Mat3, 4> fwd;
    std::array<std::array<int64_t, 4>, 4> cells = {{{0, 0, xc, yc}, {xc, 0, m.width, yc}, {0, yc, xc, m.height},
                                                    {xc, yc, m.width, m.height}}};
    for (int i = 0; i < 4; ++i) {
      // Each tile scaled to fit the canvas, placed with the corner facing the centre at the centre.
      const double tw = double(tiles[i]->image.dim(1)), th = double(tiles[i]->image.dim(0));
      const double r = std::min(W / tw, H / th);
      const double ox = (i % 2 == 0) ? xc - r * tw : double(xc);
      const double oy = (i < 2) ? yc - r * th : double(yc);
      fwd[i] = Mat3::Translate(ox, oy) * Mat3::Scale(r, r);
    }
    ex.StartMosaic(tiles, fwd, cells, m.width, m.height, m.fill);
    if (report) report->applied.push_back("Mosaic");
  } else {
    ex.Start(sample);
  }
  Walk(p.root, rng, ex, false, report);
  Sample out = ex.Finish();
  return out;
}

}  // namespace osprey::augment
