// Fusion pass for models quantised by ONNX Runtime's quantize_static (issue 11): QDQ pairs, and QLinearConv
// lowered to a float Conv between DequantizeLinear and QuantizeLinear (LowerQLinearConv, below).
//
// A QDQ model keeps float ops and wraps their inputs in QuantizeLinear -> DequantizeLinear pairs. Constant weights
// need nothing here: DequantizeLinear of an int8 initializer is known at compile time, so infer-and-fold already
// turns it into a float32 constant and the Conv runs on oneDNN's fp32 kernel. What is left per activation is the pair
// itself, which the reference kernels run one scalar element at a time and which is not channels-last capable (a
// reorder on each side). With a per-tensor scale s and zero point z of a type [lo, hi], DQ(Q(x)) is exactly
//     Clip(Round(x / s), lo - z, hi - z) * s
// (Round is half to even as QuantizeLinear's; the integers involved are exact in float32), and each of these four
// ops has a vectorised kernel and runs on channels-last data in place of a reorder. The result is bit-identical to
// the reference kernels of the pair. The Conv itself stays fp32: an int8 oneDNN convolution would be about 2x faster
// on this project's AVX2 machines (bench/int8_conv_dnnl.cc, docs/performance.md) but is not implemented yet.
#include <cmath>
#include <limits>
#include <vector>

#include "ops/op_registry.h"
#include "runtime/plan_impl.h"

namespace osprey {
namespace {

std::vector<std::vector<int>> ConsumersOf(const CompileState& st) {
  std::vector<std::vector<int>> c(st.values.size());
  for (size_t i = 0; i < st.nodes.size(); ++i)
    for (int v : st.nodes[i].inputs)
      if (v >= 0) c[v].push_back(static_cast<int>(i));
  return c;
}

bool QdqDomain(const Node& n) { return n.domain.empty() || n.domain == kMicrosoftDomain; }

// The one float32 value of known input `k` of n, or NaN.
float KnownScale(const CompileState& st, const Node& n, size_t k) {
  if (k >= n.inputs.size() || n.inputs[k] < 0) return NAN;
  const CompileValue& v = st.values[n.inputs[k]];
  if (!v.known || v.dtype != DType::kF32 || v.value.numel() != 1) return NAN;
  return v.value.data<float>()[0];
}

// The zero point of n (input 2): true with its value when absent (0) or a known 1-element int8/uint8.
bool KnownZeroPoint(const CompileState& st, const Node& n, int32_t* zp) {
  *zp = 0;
  if (n.inputs.size() < 3 || n.inputs[2] < 0) return true;
  const CompileValue& v = st.values[n.inputs[2]];
  if (!v.known || v.value.numel() != 1) return false;
  if (v.dtype == DType::kI8)
    *zp = v.value.data<int8_t>()[0];
  else if (v.dtype == DType::kU8)
    *zp = v.value.data<uint8_t>()[0];
  else
    return false;
  return true;
}

// QLinearConv with constant weights (QOperator models) becomes DequantizeLinear -> fp32 Conv -> QuantizeLinear, so it
// runs on oneDNN's fp32 kernel instead of the integer reference kernel. W' = (w - w_zp[m]) * w_scale[m] and
// B' = B[m] * x_scale * w_scale[m] (the bias's own scale) are exact in float32; the result differs from the integer
// kernel only where float rounding moves a value across the output's rounding boundary (one step, rarely).
void LowerQLinearConv(CompileState& st) {
  std::vector<std::vector<Node>> replace(st.nodes.size());
  for (size_t i = 0; i < st.nodes.size(); ++i) {
    const Node& n = st.nodes[i];
    if (n.op_type != "QLinearConv" || !n.domain.empty() || n.outputs.size() != 1 || n.inputs.size() < 8) continue;
    bool known = true;
    for (size_t k = 1; k < n.inputs.size(); ++k)
      known = known && (k == 3 || n.inputs[k] < 0 || st.values[n.inputs[k]].known);
    const int w = n.inputs[3], out = n.outputs[0];
    if (!known || w < 0 || out < 0 || !st.values[w].known || n.inputs[1] < 0 || n.inputs[6] < 0) continue;
    const Tensor& wt = st.values[w].value;
    const Tensor& ws = st.values[n.inputs[4]].value;
    if (wt.dtype() != DType::kI8 && wt.dtype() != DType::kU8) continue;
    if (ws.dtype() != DType::kF32 || st.values[n.inputs[1]].value.dtype() != DType::kF32) continue;
    const float x_scale = st.values[n.inputs[1]].value.data<float>()[0];
    const int64_t out_channels = wt.dim(0), per_channel = out_channels > 0 ? wt.numel() / out_channels : 0;
    const Tensor* wzp = n.inputs[5] >= 0 ? &st.values[n.inputs[5]].value : nullptr;
    auto int_at = [](const Tensor& t, int64_t j) -> int32_t {
      return t.dtype() == DType::kI8 ? t.data<int8_t>()[j] : t.data<uint8_t>()[j];
    };
    Tensor wf(DType::kF32, wt.shape());
    std::vector<float> bias(out_channels, 0.f);
    const bool has_bias = n.inputs.size() > 8 && n.inputs[8] >= 0;
    if (has_bias && st.values[n.inputs[8]].value.dtype() != DType::kI32) continue;
    for (int64_t m = 0; m < out_channels; ++m) {
      const float scale = ws.data<float>()[ws.numel() == 1 ? 0 : m];
      const int32_t zp = wzp == nullptr ? 0 : int_at(*wzp, wzp->numel() == 1 ? 0 : m);
      for (int64_t j = 0; j < per_channel; ++j)
        wf.data<float>()[m * per_channel + j] = static_cast<float>(int_at(wt, m * per_channel + j) - zp) * scale;
      if (has_bias) bias[m] = static_cast<float>(st.values[n.inputs[8]].value.data<int32_t>()[m]) * (x_scale * scale);
    }
    const Shape x_shape = st.values[n.inputs[0]].shape, y_shape = st.values[out].shape;  // copies: values grow
    const int x_float = st.AddValue(DType::kF32, x_shape);
    const int y_float = st.AddValue(DType::kF32, y_shape);
    const int w_value = st.AddConstant(std::move(wf));
    const int b_value = st.AddConstant(Tensor::FromVector<float>({out_channels}, bias));
    Node dq, conv, q;
    dq.op_type = "DequantizeLinear";
    dq.name = n.name + "/dequantize";
    dq.inputs = {n.inputs[0], n.inputs[1], n.inputs[2]};
    dq.outputs = {x_float};
    conv.op_type = "Conv";
    conv.name = n.name;
    conv.attrs = n.attrs;
    conv.inputs = {x_float, w_value, b_value};
    conv.outputs = {y_float};
    q.op_type = "QuantizeLinear";
    q.name = n.name + "/quantize";
    q.inputs = {y_float, n.inputs[6], n.inputs[7]};
    q.outputs = {out};
    replace[i] = {std::move(dq), std::move(conv), std::move(q)};
  }
  std::vector<Node> nodes;
  for (size_t k = 0; k < st.nodes.size(); ++k) {
    if (replace[k].empty())
      nodes.push_back(std::move(st.nodes[k]));
    else
      for (Node& r : replace[k]) nodes.push_back(std::move(r));
  }
  st.nodes = std::move(nodes);
}

}  // namespace

void FuseQuantizeDequantizePairs(CompileState& st) {
  if (st.opset < 11) return;  // Round and Clip's bound inputs are opset 11
  LowerQLinearConv(st);
  const auto consumers = ConsumersOf(st);
  std::vector<char> drop(st.nodes.size(), 0);
  std::vector<std::vector<Node>> replace(st.nodes.size());
  for (size_t i = 0; i < st.nodes.size(); ++i) {
    const Node& q = st.nodes[i];
    if (q.op_type != "QuantizeLinear" || !QdqDomain(q) || q.outputs.size() != 1 || q.inputs.empty()) continue;
    const int x = q.inputs[0], qv = q.outputs[0];
    if (x < 0 || qv < 0 || st.values[x].dtype != DType::kF32 || st.is_graph_output[qv]) continue;
    if (consumers[qv].size() != 1) continue;
    const size_t j = consumers[qv][0];
    const Node& dq = st.nodes[j];
    if (dq.op_type != "DequantizeLinear" || !QdqDomain(dq) || dq.inputs[0] != qv || dq.outputs.size() != 1) continue;
    const int out = dq.outputs[0];
    if (out < 0 || st.values[out].dtype != DType::kF32) continue;
    const float q_scale = KnownScale(st, q, 1), dq_scale = KnownScale(st, dq, 1);
    int32_t q_zp = 0, dq_zp = 0;
    if (!(q_scale > 0.f) || !std::isfinite(q_scale) || q_scale != dq_scale) continue;
    if (!KnownZeroPoint(st, q, &q_zp) || !KnownZeroPoint(st, dq, &dq_zp) || q_zp != dq_zp) continue;
    const bool is_i8 = st.values[qv].dtype == DType::kI8;
    if (!is_i8 && st.values[qv].dtype != DType::kU8) continue;
    const float lo = static_cast<float>((is_i8 ? -128 : 0) - q_zp), hi = static_cast<float>((is_i8 ? 127 : 255) - q_zp);

    const Shape shape = st.values[x].shape;  // a copy: AddValue grows st.values
    const int scale = st.AddConstant(Tensor::Scalar<float>(q_scale));
    const int lo_v = st.AddConstant(Tensor::Scalar<float>(lo));
    const int hi_v = st.AddConstant(Tensor::Scalar<float>(hi));
    const int divided = st.AddValue(DType::kF32, shape);
    const int rounded = st.AddValue(DType::kF32, shape);
    const int clipped = st.AddValue(DType::kF32, shape);
    auto make = [&](const char* op, std::vector<int> inputs, int output, const char* suffix) {
      Node n;
      n.op_type = op;
      n.name = q.name + suffix;
      n.inputs = std::move(inputs);
      n.outputs = {output};
      return n;
    };
    replace[j] = {make("Div", {x, scale}, divided, "/div"), make("Round", {divided}, rounded, "/round"),
                  make("Clip", {rounded, lo_v, hi_v}, clipped, "/clip"), make("Mul", {clipped, scale}, out, "/mul")};
    drop[i] = 1;
    drop[j] = 1;
  }
  std::vector<Node> kept;
  for (size_t k = 0; k < st.nodes.size(); ++k) {
    if (!replace[k].empty())
      for (Node& n : replace[k]) kept.push_back(std::move(n));
    else if (!drop[k])
      kept.push_back(std::move(st.nodes[k]));
  }
  st.nodes = std::move(kept);
}

}  // namespace osprey
