// com.microsoft.DynamicQuantizeLSTM (what ONNX Runtime's quantize_dynamic writes for an LSTM; seen in ddddocr's
// bundled captcha model): an LSTM whose W [D, I, 4H] and R [D, H, 4H] are int8/uint8 with per-direction (or
// per-direction-and-column) scales and zero points, and whose activations ONNX Runtime quantises to uint8 on the fly.
// Osprey runs it as the float LSTM it approximates: the weights are dequantized and transposed into ONNX LSTM's
// [D, 4H, I] / [D, 4H, H] when the model is compiled. In CPU plans, where W - W_zero_point and R - R_zero_point fit
// int8 (symmetric weights, what quantize_dynamic writes by default), the LSTM also gets those int8 weights and their
// scales (`_int8_weights`, inputs 8 to 11: kernels/recurrent_cell.h) and computes its products as ONNX Runtime does,
// the activations quantised to uint8 on the fly (tests/e2e/test_recurrent.py compares both with the float model and
// with each other); elsewhere it is the float LSTM on the dequantised weights.
#include <string>

#include "ops/op_registry.h"
#include "runtime/plan_impl.h"

namespace osprey {
namespace {

const Tensor& KnownInput(const CompileState& st, const Node& node, size_t i, const char* what) {
  if (i >= node.inputs.size() || node.inputs[i] < 0 || !st.values[node.inputs[i]].typed)
    throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": input " + std::to_string(i) + " (" + what +
                                                 ") is required");
  const CompileValue& v = st.values[node.inputs[i]];
  if (!v.known)
    throw Error(ErrorCode::kUnsupported, node.Describe() + ": " + what + " must be a constant (osprey runs "
                                                                         "DynamicQuantizeLSTM as an LSTM on its "
                                                                         "dequantized weights)");
  return v.value;
}

// A weight q [D, K, G] (int8 or uint8) with its scale / zero point ([D] or [D, G]) in the LSTM's [D, G, K] layout:
// (q - zero_point) * scale as float32, and, when asked, q - zero_point as int8 with the scales as [D, G] (`has_int8`
// false when a difference does not fit int8).
struct TransposedWeight {
  Tensor dequantized, int8, scales;
  bool has_int8 = false;
};

TransposedWeight Transposed(const Node& node, const Tensor& q, const Tensor& scale, const Tensor& zero_point,
                            const char* what, bool want_int8) {
  if (q.rank() != 3 || (q.dtype() != DType::kI8 && q.dtype() != DType::kU8))
    throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": " + what + " must be int8 or uint8 of rank 3, got " +
                                                 DTypeName(q.dtype()) + " " + ShapeToString(q.shape()));
  const int64_t d = q.dim(0), k = q.dim(1), g = q.dim(2);
  const bool per_column = scale.numel() == d * g;
  if (scale.dtype() != DType::kF32 || (scale.numel() != d && !per_column) || zero_point.dtype() != q.dtype() ||
      zero_point.numel() != scale.numel())
    throw Error(ErrorCode::kInvalidArgument,
                node.Describe() + ": " + what + "'s scale must be float32 and its zero point " + DTypeName(q.dtype()) +
                    ", both with " + std::to_string(d) + " or " + std::to_string(d * g) + " values, got " +
                    ShapeToString(scale.shape()) + " and " + ShapeToString(zero_point.shape()));
  TransposedWeight out{Tensor(DType::kF32, {d, g, k}), Tensor(), Tensor(), false};
  if (want_int8) {
    out.int8 = Tensor(DType::kI8, {d, g, k});
    out.scales = Tensor(DType::kF32, {d, g});
  }
  bool fits = want_int8;
  const float* s = scale.data<float>();
  auto value = [&](const Tensor& t, int64_t i) {
    return q.dtype() == DType::kI8 ? static_cast<int>(t.data<int8_t>()[i]) : static_cast<int>(t.data<uint8_t>()[i]);
  };
  for (int64_t dir = 0; dir < d; ++dir)
    for (int64_t col = 0; col < g; ++col) {
      const int64_t p = per_column ? dir * g + col : dir;
      const int zp = value(zero_point, p);
      if (want_int8) out.scales.data<float>()[dir * g + col] = s[p];
      for (int64_t row = 0; row < k; ++row) {
        const int v = value(q, (dir * k + row) * g + col) - zp;
        const int64_t at = (dir * g + col) * k + row;
        out.dequantized.data<float>()[at] = static_cast<float>(v) * s[p];
        if (!fits) continue;
        if (v < -128 || v > 127) fits = false;
        out.int8.data<int8_t>()[at] = static_cast<int8_t>(v);
      }
    }
  out.has_int8 = fits;
  return out;
}

}  // namespace

Node DequantizedLstm(CompileState& st, const Node& node) {
  // int8 weights for CPU plans only (the CUDA backend runs the float LSTM).
  const bool int8 = st.options.device.kind == Device::kHost;
  const TransposedWeight w = Transposed(node, KnownInput(st, node, 1, "W"), KnownInput(st, node, 8, "W_scale"),
                                        KnownInput(st, node, 9, "W_zero_point"), "W", int8);
  const TransposedWeight r = Transposed(node, KnownInput(st, node, 2, "R"), KnownInput(st, node, 10, "R_scale"),
                                        KnownInput(st, node, 11, "R_zero_point"), "R", int8);
  Node lstm = node;
  lstm.op_type = "LSTM";
  lstm.domain.clear();
  lstm.inputs.resize(8, -1);
  lstm.inputs[1] = st.AddConstant(w.dequantized);
  lstm.inputs[2] = st.AddConstant(r.dequantized);
  if (w.has_int8 && r.has_int8) {
    lstm.attrs["_int8_weights"] = Attribute::Int(1);
    for (const Tensor* t : {&r.int8, &r.scales, &w.int8, &w.scales}) lstm.inputs.push_back(st.AddConstant(*t));
  }
  return lstm;
}

}  // namespace osprey
