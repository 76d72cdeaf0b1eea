// Ops whose output shapes depend on their input values (OpTraits::data_dependent): NonZero, NonMaxSuppression,
// Compress, Unique and ImageDecoder. They run between the plans of a model cut at them (runtime/segments.cc), on host
// tensors, and allocate their outputs once they know the sizes.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/reference/dispatch.h"
#include "kernels/reference/reference.h"

namespace osprey {
namespace {

[[noreturn]] void Invalid(const Node& node, const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": " + what);
}

const Tensor& Required(const Node& node, const std::vector<const Tensor*>& inputs, size_t i, const char* name) {
  if (i >= inputs.size() || inputs[i] == nullptr) Invalid(node, std::string("input '") + name + "' is required");
  return *inputs[i];
}

bool Truthy(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::kF32:
      return t.data<float>()[i] != 0.f;
    case DType::kBool:
      return t.data<bool>()[i];
    default:
      return t.GetAsInt(i) != 0;
  }
}

// NonZero: [rank, count] int64, the coordinates of the non-zero elements in row-major order (a scalar counts as a
// one-element vector, as numpy.nonzero reads it).
std::vector<Tensor> NonZero(const Node& node, const std::vector<const Tensor*>& inputs) {
  const Tensor& x = Required(node, inputs, 0, "X");
  if (x.dtype() != DType::kF32 && x.dtype() != DType::kBool && x.dtype() != DType::kI64 && x.dtype() != DType::kI32 &&
      x.dtype() != DType::kI8 && x.dtype() != DType::kU8)
    UnsupportedDType(node, x.dtype());
  const Shape shape = x.rank() == 0 ? Shape{1} : x.shape();
  const int64_t rank = static_cast<int64_t>(shape.size()), n = x.numel();
  std::vector<int64_t> hits;
  for (int64_t i = 0; i < n; ++i)
    if (Truthy(x, i)) hits.push_back(i);
  const int64_t count = static_cast<int64_t>(hits.size());
  Tensor out(DType::kI64, {rank, count});
  int64_t* o = out.data<int64_t>();
  for (int64_t j = 0; j < count; ++j) {
    int64_t rem = hits[j];
    for (int64_t d = rank - 1; d >= 0; --d) {
      o[d * count + j] = rem % shape[d];
      rem /= shape[d];
    }
  }
  return {std::move(out)};
}

// Compress: the slices along `axis` (of the flattened input without one) whose condition is true; the condition may
// be shorter than the axis (the rest is dropped), not longer.
std::vector<Tensor> Compress(const Node& node, const std::vector<const Tensor*>& inputs) {
  const Tensor& x = Required(node, inputs, 0, "input");
  const Tensor& cond = Required(node, inputs, 1, "condition");
  if (cond.rank() != 1) Invalid(node, "condition must be 1-D, got shape " + ShapeToString(cond.shape()));
  const bool has_axis = node.Has("axis");
  const Shape shape = has_axis ? x.shape() : Shape{x.numel()};
  int64_t axis = has_axis ? node.GetInt("axis", 0) : 0;
  const int64_t rank = static_cast<int64_t>(shape.size());
  if (axis < -rank || axis >= rank)
    Invalid(node, "axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(rank));
  if (axis < 0) axis += rank;
  if (cond.numel() > shape[axis])
    Invalid(node, "condition has " + std::to_string(cond.numel()) + " entries, more than axis " + std::to_string(axis) +
                      " has (" + std::to_string(shape[axis]) + ")");
  std::vector<int64_t> kept;
  for (int64_t i = 0; i < cond.numel(); ++i)
    if (Truthy(cond, i)) kept.push_back(i);
  Shape out_shape = shape;
  out_shape[axis] = static_cast<int64_t>(kept.size());
  Tensor out(x.dtype(), out_shape);
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= shape[d];
  for (int64_t d = axis + 1; d < rank; ++d) inner *= shape[d];
  const size_t block = static_cast<size_t>(inner) * DTypeSize(x.dtype());
  const char* src = static_cast<const char*>(x.raw());
  char* dst = static_cast<char*>(out.raw());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t k : kept) {
      std::memcpy(dst, src + static_cast<size_t>(o * shape[axis] + k) * block, block);
      dst += block;
    }
  return {std::move(out)};
}

// NonMaxSuppression, as the ONNX reference computes it: per batch and class, candidates above score_threshold (when
// given) in descending score order (ties: the lower box index first); a candidate is kept unless its IoU with a kept
// box of the class exceeds iou_threshold; at most max_output_boxes_per_class per class (absent or 0: none).
// Boxes are [y1, x1, y2, x2] corners in any order (center_point_box 0) or [x, y, w, h] centres (1).
struct Box {
  float x0, y0, x1, y1;
};

Box BoxAt(const float* b, bool center) {
  if (center) return {b[0] - b[2] / 2, b[1] - b[3] / 2, b[0] + b[2] / 2, b[1] + b[3] / 2};
  return {std::min(b[1], b[3]), std::min(b[0], b[2]), std::max(b[1], b[3]), std::max(b[0], b[2])};
}

bool Suppresses(const Box& a, const Box& b, float iou_threshold) {
  const float ix0 = std::max(a.x0, b.x0), ix1 = std::min(a.x1, b.x1);
  if (ix1 <= ix0) return false;
  const float iy0 = std::max(a.y0, b.y0), iy1 = std::min(a.y1, b.y1);
  if (iy1 <= iy0) return false;
  const float inter = (ix1 - ix0) * (iy1 - iy0);
  const float area_a = (a.x1 - a.x0) * (a.y1 - a.y0), area_b = (b.x1 - b.x0) * (b.y1 - b.y0);
  const float uni = area_a + area_b - inter;
  if (inter <= 0 || area_a <= 0 || area_b <= 0 || uni <= 0) return false;
  return inter / uni > iou_threshold;
}

std::vector<Tensor> NonMaxSuppression(const Node& node, const std::vector<const Tensor*>& inputs) {
  const Tensor& boxes = Required(node, inputs, 0, "boxes");
  const Tensor& scores = Required(node, inputs, 1, "scores");
  if (boxes.dtype() != DType::kF32 || scores.dtype() != DType::kF32) Invalid(node, "boxes and scores must be float32");
  if (boxes.rank() != 3 || boxes.dim(2) != 4 || scores.rank() != 3 || scores.dim(0) != boxes.dim(0) ||
      scores.dim(2) != boxes.dim(1))
    Invalid(node, "boxes must be [batches, boxes, 4] and scores [batches, classes, boxes], got " +
                      ShapeToString(boxes.shape()) + " and " + ShapeToString(scores.shape()));
  auto scalar = [&](size_t i) -> const Tensor* {
    return i < inputs.size() && inputs[i] != nullptr && inputs[i]->numel() > 0 ? inputs[i] : nullptr;
  };
  const int64_t max_per_class = scalar(2) ? std::max<int64_t>(0, scalar(2)->GetAsInt(0)) : 0;
  const float iou_threshold = scalar(3) ? static_cast<float>(scalar(3)->GetAsDouble(0)) : 0.f;
  const bool by_score = scalar(4) != nullptr;
  const float score_threshold = by_score ? static_cast<float>(scalar(4)->GetAsDouble(0)) : 0.f;
  const int64_t center = node.GetInt("center_point_box", 0);
  if (center != 0 && center != 1) Invalid(node, "center_point_box must be 0 or 1, got " + std::to_string(center));
  const int64_t batches = boxes.dim(0), count = boxes.dim(1), classes = scores.dim(1);
  // The IoU tests of one class grow with candidates x kept boxes: refuse inputs that could ask for more than ~2^36.
  const int64_t kept_max = std::min(max_per_class, count);
  if (batches * classes > 0 && count > 0 && kept_max > 0 &&
      static_cast<double>(batches) * classes * count * kept_max > static_cast<double>(int64_t{1} << 36))
    Invalid(node, "too much work: " + std::to_string(batches) + " batches x " + std::to_string(classes) +
                      " classes x " + std::to_string(count) + " boxes x up to " + std::to_string(kept_max) +
                      " kept per class is over osprey's limit of 2^36 IoU tests (lower max_output_boxes_per_class)");
  std::vector<int64_t> selected;  // triples
  std::vector<std::pair<float, int64_t>> candidates;
  std::vector<Box> kept;
  const float* bd = boxes.data<float>();
  const float* sd = scores.data<float>();
  for (int64_t b = 0; b < batches && max_per_class > 0; ++b)
    for (int64_t c = 0; c < classes; ++c) {
      const float* s = sd + (b * classes + c) * count;
      candidates.clear();
      for (int64_t i = 0; i < count; ++i)
        if (!by_score || s[i] > score_threshold) candidates.emplace_back(s[i], i);
      std::stable_sort(candidates.begin(), candidates.end(),
                       [](const auto& l, const auto& r) { return l.first > r.first; });
      kept.clear();
      for (const auto& [score, i] : candidates) {
        if (static_cast<int64_t>(kept.size()) >= max_per_class) break;
        const Box box = BoxAt(bd + (b * count + i) * 4, center == 1);
        bool keep = true;
        for (const Box& k : kept)
          if (Suppresses(box, k, iou_threshold)) {
            keep = false;
            break;
          }
        if (!keep) continue;
        kept.push_back(box);
        selected.insert(selected.end(), {b, c, i});
      }
    }
  Tensor out(DType::kI64, {static_cast<int64_t>(selected.size() / 3), 3});
  if (!selected.empty()) std::memcpy(out.raw(), selected.data(), selected.size() * sizeof(int64_t));
  return {std::move(out)};
}

// Unique (opset 11): the distinct elements (no axis: of the flattened input) or distinct slices along `axis`, sorted
// (ascending, slices lexicographically; NaNs after numbers, all NaNs one value, as numpy.unique) or in order of first
// appearance (sorted = 0); outputs Y, the first index of each, each input element's (slice's) index into Y, and the
// counts, as the ONNX reference computes them.
template <class T>
int Compare(const T* a, const T* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if constexpr (std::is_floating_point_v<T>) {
      const bool na = a[i] != a[i], nb = b[i] != b[i];
      if (na || nb) {
        if (na && nb) continue;
        return na ? 1 : -1;
      }
    }
    if (a[i] < b[i]) return -1;
    if (b[i] < a[i]) return 1;
  }
  return 0;
}

std::vector<Tensor> Unique(const Node& node, const std::vector<const Tensor*>& inputs) {
  const Tensor& x = Required(node, inputs, 0, "X");
  const bool has_axis = node.Has("axis");
  const Shape shape = has_axis ? x.shape() : Shape{x.numel()};
  const int64_t rank = static_cast<int64_t>(shape.size());
  int64_t axis = has_axis ? node.GetInt("axis", 0) : 0;
  if (axis < -rank || axis >= rank)
    Invalid(node, "axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(rank));
  if (axis < 0) axis += rank;
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= shape[d];
  for (int64_t d = axis + 1; d < rank; ++d) inner *= shape[d];
  const int64_t count = shape[axis], slice = outer * inner;
  const bool sorted = node.GetInt("sorted", 1) != 0;
  if (x.numel() == 0) {
    // No values: no slices along an empty axis, else `count` empty slices, all equal (one group). Without looping
    // over the other dims (a [2^40, 0] input along axis 1 would spin through 2^40 empty rows).
    const int64_t groups = count == 0 ? 0 : 1;
    Shape out_shape = shape;
    out_shape[axis] = groups;
    Tensor first_t(DType::kI64, {groups}), counts_t(DType::kI64, {groups}), inverse_t(DType::kI64, {count});
    if (groups) {
      first_t.data<int64_t>()[0] = 0;
      counts_t.data<int64_t>()[0] = count;
    }
    std::fill_n(inverse_t.data<int64_t>(), count, int64_t{0});
    return {Tensor(x.dtype(), out_shape), std::move(first_t), std::move(inverse_t), std::move(counts_t)};
  }
  std::vector<int64_t> order(static_cast<size_t>(count));  // slice indices, sorted by value then first index
  std::vector<int64_t> first, inverse(static_cast<size_t>(count)), counts;
  Tensor y;
  DispatchNumeric(node, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    // Slice k gathered contiguously (outer x inner values) so slices compare as runs.
    std::vector<T> rows(static_cast<size_t>(count * slice));
    const T* src = x.data<T>();
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t k = 0; k < count; ++k)
        std::copy(src + (o * count + k) * inner, src + (o * count + k + 1) * inner,
                  rows.data() + (k * slice + o * inner));
    auto row = [&](int64_t k) { return rows.data() + k * slice; };
    for (int64_t k = 0; k < count; ++k) order[k] = k;
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return Compare(row(a), row(b), slice) < 0; });
    std::vector<int64_t> group(static_cast<size_t>(count));  // sorted group of each slice
    for (int64_t j = 0; j < count; ++j) {
      const int64_t k = order[j];
      if (j == 0 || Compare(row(order[j - 1]), row(k), slice) != 0) {
        first.push_back(k);
        counts.push_back(0);
      }
      group[k] = static_cast<int64_t>(first.size()) - 1;
      ++counts.back();
    }
    std::vector<int64_t> rank_of(first.size());  // output position of each sorted group
    for (size_t g = 0; g < first.size(); ++g) rank_of[g] = static_cast<int64_t>(g);
    if (!sorted) {  // groups in order of first appearance
      std::vector<int64_t> by_first(first.size());
      for (size_t g = 0; g < first.size(); ++g) by_first[g] = static_cast<int64_t>(g);
      std::sort(by_first.begin(), by_first.end(), [&](int64_t a, int64_t b) { return first[a] < first[b]; });
      std::vector<int64_t> f2(first.size()), c2(first.size());
      for (size_t p = 0; p < by_first.size(); ++p) {
        rank_of[by_first[p]] = static_cast<int64_t>(p);
        f2[p] = first[by_first[p]];
        c2[p] = counts[by_first[p]];
      }
      first.swap(f2);
      counts.swap(c2);
    }
    for (int64_t k = 0; k < count; ++k) inverse[k] = rank_of[group[k]];
    Shape out_shape = shape;
    out_shape[axis] = static_cast<int64_t>(first.size());
    y = Tensor(x.dtype(), out_shape);
    T* dst = y.data<T>();
    const int64_t u = static_cast<int64_t>(first.size());
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t p = 0; p < u; ++p)
        std::copy(src + (o * count + first[p]) * inner, src + (o * count + first[p] + 1) * inner,
                  dst + (o * u + p) * inner);
  });
  auto vec = [](const std::vector<int64_t>& v) {
    Tensor t(DType::kI64, {static_cast<int64_t>(v.size())});
    if (!v.empty()) std::memcpy(t.raw(), v.data(), v.size() * sizeof(int64_t));
    return t;
  };
  return {std::move(y), vec(first), vec(inverse), vec(counts)};
}

std::atomic<ImageDecodeFn> g_image_decoder{nullptr};

// The format an encoded stream's first bytes name, for the formats ImageDecoder lists that osprey does not read.
const char* UnreadFormat(const uint8_t* p, int64_t n) {
  if (n >= 4 && ((p[0] == 'I' && p[1] == 'I' && p[2] == 42 && p[3] == 0) ||
                 (p[0] == 'M' && p[1] == 'M' && p[2] == 0 && p[3] == 42)))
    return "TIFF";
  if ((n >= 12 && p[0] == 0 && p[1] == 0 && p[2] == 0 && p[3] == 12 && p[4] == 'j' && p[5] == 'P') ||
      (n >= 4 && p[0] == 0xFF && p[1] == 0x4F && p[2] == 0xFF && p[3] == 0x51))
    return "JPEG 2000";
  if (n >= 2 && p[0] == 'P' && p[1] >= '1' && p[1] <= '7') return "PNM";
  return nullptr;
}

// ImageDecoder (opset 20): a 1-D uint8 encoded image -> uint8 [H, W, 3] (RGB or BGR) or [H, W, 1] (Grayscale, ITU-R
// 601-2 luma as Pillow's convert('L')), the pixels as stored (no EXIF rotation, as the ONNX reference reads them).
// A stream that cannot be decoded gives an empty [0, 0, C] tensor, as the spec says; a format osprey does not read
// (TIFF, JPEG 2000, PNM) is refused by name instead, so a missing decoder never passes for a broken file, and so is
// an image over the decoders' 100-megapixel limit (kResourceExhausted from the decoder).
std::vector<Tensor> ImageDecoder(const Node& node, const std::vector<const Tensor*>& inputs) {
  const Tensor& encoded = Required(node, inputs, 0, "encoded_stream");
  if (encoded.dtype() != DType::kU8 || encoded.rank() != 1)
    Invalid(node, "encoded_stream must be a 1-D uint8 tensor, got " + std::string(DTypeName(encoded.dtype())) + " " +
                      ShapeToString(encoded.shape()));
  const std::string format = node.GetString("pixel_format", "RGB");
  if (format != "RGB" && format != "BGR" && format != "Grayscale")
    Invalid(node, "pixel_format must be \"RGB\", \"BGR\" or \"Grayscale\", got \"" + format + "\"");
  const int channels = format == "Grayscale" ? 1 : 3;
  const ImageDecodeFn decode = g_image_decoder.load();
  if (decode == nullptr)
    throw Error(ErrorCode::kUnsupported, node.Describe() + ": this program was built without osprey's image decoders");
  const auto* bytes = static_cast<const uint8_t*>(encoded.raw());
  if (const char* unread = UnreadFormat(bytes, encoded.numel()))
    throw Error(ErrorCode::kUnsupported,
                node.Describe() + ": a " + unread + " image; osprey decodes JPEG, PNG, WebP and BMP");
  Tensor image;
  try {
    image = decode(bytes, static_cast<size_t>(encoded.numel()), channels);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kInvalidArgument) throw;
    return {Tensor(DType::kU8, {0, 0, channels})};
  }
  if (format == "BGR") {
    uint8_t* px = image.data<uint8_t>();
    for (int64_t i = 0, n = image.numel(); i + 2 < n; i += 3) std::swap(px[i], px[i + 2]);
  }
  return {std::move(image)};
}

}  // namespace

void SetImageDecoder(ImageDecodeFn decode) { g_image_decoder.store(decode); }

std::vector<Tensor> RunDataDependentOp(const Node& node, int /*opset*/, const std::vector<const Tensor*>& inputs) {
  if (node.op_type == "NonZero") return NonZero(node, inputs);
  if (node.op_type == "Compress") return Compress(node, inputs);
  if (node.op_type == "NonMaxSuppression") return NonMaxSuppression(node, inputs);
  if (node.op_type == "ImageDecoder") return ImageDecoder(node, inputs);
  if (node.op_type == "Unique") return Unique(node, inputs);
  throw Error(ErrorCode::kUnsupported, node.Describe() + ": not an op with data-dependent output shapes");
}

}  // namespace osprey
