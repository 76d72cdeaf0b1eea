#include "ops/conv_window.h"

#include <algorithm>

namespace osprey {

namespace {

[[noreturn]] void Fail(const Node& node, const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": " + what);
}

int64_t FloorDiv(int64_t a, int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); }

// The input sizes, the kernel, strides and dilations (read in that order, before auto_pad and pads, so a node with
// several bad attributes reports the same one as always).
ConvWindow ReadCommon(const Node& node, const Shape& x, const std::vector<int64_t>& kernel) {
  const size_t n = kernel.size();
  ConvWindow w;
  w.in.assign(x.begin() + 2, x.end());
  w.kernel = kernel;
  w.strides = ReadWindowInts(node, "strides", n, 1, 1);
  w.dilations = ReadWindowInts(node, "dilations", n, 1, 1);
  return w;
}

std::vector<int64_t> ReadPads(const Node& node, AutoPad auto_pad, size_t n) {
  if (auto_pad == AutoPad::kNotSet) return ReadWindowInts(node, "pads", 2 * n, 0, 0);
  return std::vector<int64_t>(2 * n, 0);
}

}  // namespace

AutoPad ReadAutoPad(const Node& node) {
  const std::string s = node.GetString("auto_pad", "NOTSET");
  if (s == "NOTSET") return AutoPad::kNotSet;
  if (s == "SAME_UPPER") return AutoPad::kSameUpper;
  if (s == "SAME_LOWER") return AutoPad::kSameLower;
  if (s == "VALID") return AutoPad::kValid;
  Fail(node, "attribute 'auto_pad' should be NOTSET, SAME_UPPER, SAME_LOWER or VALID, got '" + s + "'");
}

std::vector<int64_t> ReadWindowInts(const Node& node, const std::string& name, size_t n, int64_t fallback,
                                    int64_t lo) {
  std::vector<int64_t> v = node.GetInts(name, std::vector<int64_t>(n, fallback));
  if (v.size() != n)
    Fail(node, "attribute '" + name + "' should have " + std::to_string(n) + " values, got " + ShapeToString(v));
  for (int64_t e : v)
    if (e < lo || e > kMaxWindowAttr)
      Fail(node, "attribute '" + name + "' values should be in [" + std::to_string(lo) + ", 2^31], got " +
                     ShapeToString(v));
  return v;
}

ConvWindow ResolveConvWindow(const Node& node, const Shape& x, const std::vector<int64_t>& kernel, bool ceil_mode) {
  const size_t n = kernel.size();
  ConvWindow w = ReadCommon(node, x, kernel);
  w.auto_pad = ReadAutoPad(node);
  const std::vector<int64_t> pads = ReadPads(node, w.auto_pad, n);
  const bool same = w.auto_pad == AutoPad::kSameUpper || w.auto_pad == AutoPad::kSameLower;
  w.pad_begin.assign(pads.begin(), pads.begin() + n);
  w.pad_end.assign(pads.begin() + n, pads.end());
  w.out.assign(n, 0);
  for (size_t i = 0; i < n; ++i) {
    const int64_t in = w.in[i], dk = w.EffectiveKernel(i), s = w.strides[i];
    int64_t& out = w.out[i];
    if (same) {
      out = (in + s - 1) / s;
    } else if (w.auto_pad == AutoPad::kValid) {
      out = in >= dk ? (in - dk) / s + 1 : 0;
    } else {
      // ONNX: floor (or ceil) of span / s, plus 1; with ceil_mode a window longer than the padded input still gives
      // one output (Hugging Face's EfficientNet pools 7x7 with AvgPool2d(2560, ceil_mode=True)).
      const int64_t span = in + pads[i] + pads[n + i] - dk;
      out = (ceil_mode ? -FloorDiv(-span, s) : FloorDiv(span, s)) + 1;
      // A window that would start inside the end padding is dropped (PyTorch and ONNX Runtime agree).
      if (ceil_mode && out > 1 && (out - 1) * s >= in + pads[i]) --out;
    }
    if (out < 1)
      Fail(node, "window of size " + std::to_string(dk) + " (kernel " + ShapeToString(kernel) + ", dilations " +
                     ShapeToString(w.dilations) + ") does not fit input " + ShapeToString(x) + " with pads " +
                     ShapeToString(pads));
    if (same) {
      const int64_t total = std::max<int64_t>(0, (out - 1) * s + dk - in);
      w.pad_begin[i] = w.auto_pad == AutoPad::kSameUpper ? total / 2 : total - total / 2;
      w.pad_end[i] = total - w.pad_begin[i];
    }
  }
  return w;
}

ConvWindow ResolveConvTransposeWindow(const Node& node, const Shape& x, const std::vector<int64_t>& kernel) {
  const size_t n = kernel.size();
  ConvWindow w = ReadCommon(node, x, kernel);
  const std::vector<int64_t> output_padding = ReadWindowInts(node, "output_padding", n, 0, 0);
  w.auto_pad = ReadAutoPad(node);
  const std::vector<int64_t> pads = ReadPads(node, w.auto_pad, n);
  const bool same = w.auto_pad == AutoPad::kSameUpper || w.auto_pad == AutoPad::kSameLower;
  w.out.assign(n, 0);
  if (node.Has("output_shape")) {
    std::vector<int64_t> os = node.GetInts("output_shape");
    if (os.size() == n + 2) os.erase(os.begin(), os.begin() + 2);
    if (os.size() != n)
      Fail(node, "attribute 'output_shape' should have " + std::to_string(n) + " values, got " + ShapeToString(os));
    for (int64_t v : os)
      if (v < 1 || v > kMaxWindowAttr) Fail(node, "attribute 'output_shape' has a bad value: " + ShapeToString(os));
    w.out = os;
  } else {
    for (size_t i = 0; i < n; ++i) {
      if (same)
        w.out[i] = w.in[i] * w.strides[i];
      else
        w.out[i] = w.strides[i] * (w.in[i] - 1) + output_padding[i] + w.EffectiveKernel(i) - pads[i] - pads[n + i];
      if (w.out[i] < 1)
        Fail(node, "output spatial dim " + std::to_string(i) + " would be " + std::to_string(w.out[i]) +
                       " for input " + ShapeToString(x) + ", pads " + ShapeToString(pads));
    }
  }
  // Explicit pads (zeros with VALID) crop at the start; SAME_* splits the total crop the output size implies. The end
  // crop is whatever remains of the full result (output_padding included).
  w.pad_begin.assign(n, 0);
  w.pad_end.assign(n, 0);
  for (size_t i = 0; i < n; ++i) {
    const int64_t total = w.strides[i] * (w.in[i] - 1) + output_padding[i] + w.EffectiveKernel(i) - w.out[i];
    if (same)
      w.pad_begin[i] = w.auto_pad == AutoPad::kSameUpper ? FloorDiv(total, 2) : total - FloorDiv(total, 2);
    else
      w.pad_begin[i] = pads[i];
    w.pad_end[i] = total - w.pad_begin[i];
  }
  return w;
}

}  // namespace osprey
