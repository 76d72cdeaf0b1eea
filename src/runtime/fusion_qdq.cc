// Fusion pass for models quantised in the QDQ format (ONNX Runtime's quantize_static; issue 11).
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

}  // namespace

void FuseQuantizeDequantizePairs(CompileState& st) {
  if (st.opset < 11) return;  // Round and Clip's bound inputs are opset 11
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
