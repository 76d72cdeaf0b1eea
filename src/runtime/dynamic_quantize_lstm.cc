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

// (q - zero_point) * scale for q [D, K, G] (int8 or uint8), scale/zero point [D] or [D, G]; returned as [D, G, K].
Tensor DequantizeTransposed(const Node& node, const Tensor& q, const Tensor& scale, const Tensor& zero_point,
                            const char* what) {
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
  Tensor out(DType::kF32, {d, g, k});
  float* dst = out.data<float>();
  const float* s = scale.data<float>();
  auto value = [&](int64_t i) {
    return q.dtype() == DType::kI8 ? static_cast<float>(q.data<int8_t>()[i]) : static_cast<float>(q.data<uint8_t>()[i]);
  };
  auto zero = [&](int64_t i) {
    return q.dtype() == DType::kI8 ? static_cast<float>(zero_point.data<int8_t>()[i])
                                   : static_cast<float>(zero_point.data<uint8_t>()[i]);
  };
  for (int64_t dir = 0; dir < d; ++dir)
    for (int64_t row = 0; row < k; ++row)
      for (int64_t col = 0; col < g; ++col) {
        const int64_t p = per_column ? dir * g + col : dir;
        dst[(dir * g + col) * k + row] = (value((dir * k + row) * g + col) - zero(p)) * s[p];
      }
  return out;
}

}  // namespace

// q - zero_point as int8 [D, G, K] (the transposed layout of the LSTM's W / R) and the scales as [D, G]; false when a
// difference does not fit int8.
bool Int8Weights(const Tensor& q, const Tensor& scale, const Tensor& zero_point, Tensor* r8, Tensor* scales) {
  const int64_t d = q.dim(0), k = q.dim(1), g = q.dim(2);
  const bool per_column = scale.numel() == d * g;
  Tensor out(DType::kI8, {d, g, k});
  Tensor sc(DType::kF32, {d, g});
  for (int64_t dir = 0; dir < d; ++dir)
    for (int64_t col = 0; col < g; ++col) {
      const int64_t p = per_column ? dir * g + col : dir;
      sc.data<float>()[dir * g + col] = scale.data<float>()[p];
      const int zp = q.dtype() == DType::kI8 ? zero_point.data<int8_t>()[p] : zero_point.data<uint8_t>()[p];
      for (int64_t row = 0; row < k; ++row) {
        const int64_t i = (dir * k + row) * g + col;
        const int v = (q.dtype() == DType::kI8 ? q.data<int8_t>()[i] : q.data<uint8_t>()[i]) - zp;
        if (v < -128 || v > 127) return false;
        out.data<int8_t>()[(dir * g + col) * k + row] = static_cast<int8_t>(v);
      }
    }
  *r8 = std::move(out);
  *scales = std::move(sc);
  return true;
}

Node DequantizedLstm(CompileState& st, const Node& node) {
  const Tensor w = DequantizeTransposed(node, KnownInput(st, node, 1, "W"), KnownInput(st, node, 8, "W_scale"),
                                        KnownInput(st, node, 9, "W_zero_point"), "W");
  const Tensor r = DequantizeTransposed(node, KnownInput(st, node, 2, "R"), KnownInput(st, node, 10, "R_scale"),
                                        KnownInput(st, node, 11, "R_zero_point"), "R");
  Node lstm = node;
  lstm.op_type = "LSTM";
  lstm.domain.clear();
  lstm.inputs.resize(8, -1);
  lstm.inputs[1] = st.AddConstant(w);
  lstm.inputs[2] = st.AddConstant(r);
  Tensor r8, r_scales, w8, w_scales;
  if (st.options.device.kind == Device::kHost &&
      Int8Weights(KnownInput(st, node, 2, "R"), KnownInput(st, node, 10, "R_scale"),
                  KnownInput(st, node, 11, "R_zero_point"), &r8, &r_scales) &&
      Int8Weights(KnownInput(st, node, 1, "W"), KnownInput(st, node, 8, "W_scale"),
                  KnownInput(st, node, 9, "W_zero_point"), &w8, &w_scales)) {
    lstm.attrs["_int8_weights"] = Attribute::Int(1);
    for (Tensor* t : {&r8, &r_scales, &w8, &w_scales}) lstm.inputs.push_back(st.AddConstant(*t));
  }
  return lstm;
}

}  // namespace osprey
