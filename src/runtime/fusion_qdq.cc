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
// the reference kernels of the pair. In a CPU plan the four are one node, a Round carrying `_quant_scale`,
// `_quant_lo` and `_quant_hi` (one pass over the tensor instead of four; GPU plans keep the four ops, which have CUDA
// kernels). Before that, FuseInt8 (below) turns each DQ -> Conv -> Q -> DQ chain with
// int8 weights into one Conv on oneDNN's int8 convolution (src/kernels/cpu/dnnl_conv_int8.cc), so the pairs left are
// those around the residual Adds, pooling and the stem.
#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
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

// Node k replaced by replace[k] where that is not empty (in place, order kept).
void Splice(CompileState& st, std::vector<std::vector<Node>>& replace) {
  std::vector<Node> nodes;
  for (size_t k = 0; k < st.nodes.size(); ++k) {
    if (replace[k].empty())
      nodes.push_back(std::move(st.nodes[k]));
    else
      for (Node& r : replace[k]) nodes.push_back(std::move(r));
  }
  st.nodes = std::move(nodes);
}

// Element j of an int8 or uint8 tensor.
int32_t IntAt(const Tensor& t, int64_t j) {
  return t.dtype() == DType::kI8 ? t.data<int8_t>()[j] : t.data<uint8_t>()[j];
}

// Constant quantised weights `q` (int8 or uint8) dequantised: (q - zp[c]) * scale[c], c the index along `axis` (one
// scale / zero point, or one per index). `symmetric_int8` says whether they were int8 with every zero point 0 (what
// the int8 kernels take). Empty when the scale or zero point has another length.
Tensor DequantizedWeights(const Tensor& q, const Tensor& scale, const Tensor* zp, int64_t axis, bool* symmetric_int8) {
  const int64_t channels = q.dim(axis);
  if ((scale.numel() != 1 && scale.numel() != channels) || (zp && zp->numel() != 1 && zp->numel() != channels))
    return Tensor();
  int64_t inner = 1;
  for (int64_t d = axis + 1; d < q.rank(); ++d) inner *= q.dim(d);
  Tensor w(DType::kF32, q.shape());
  *symmetric_int8 = q.dtype() == DType::kI8;
  for (int64_t i = 0; i < q.numel(); ++i) {
    const int64_t c = (i / inner) % channels;
    const int32_t z = zp ? IntAt(*zp, zp->numel() == 1 ? 0 : c) : 0;
    *symmetric_int8 = *symmetric_int8 && z == 0;
    w.data<float>()[i] = static_cast<float>(IntAt(q, i) - z) * scale.data<float>()[scale.numel() == 1 ? 0 : c];
  }
  return w;
}

// A 2-D float32 matrix transposed.
Tensor TransposedMatrix(const Tensor& m) {
  Tensor t(DType::kF32, {m.dim(1), m.dim(0)});
  for (int64_t r = 0; r < m.dim(0); ++r)
    for (int64_t k = 0; k < m.dim(1); ++k) t.data<float>()[k * m.dim(0) + r] = m.data<float>()[r * m.dim(1) + k];
  return t;
}

// Gemm node `g` (A, B, C?; alpha 1, A not transposed) made the MatMul the int8 kernel runs: [K, N] weights `w`
// (transposed here where transB), C an [N] fused bias (`_bias`) from `bias` (no elements: none).
void GemmAsMatMul(CompileState& st, Node& g, Tensor w, const Tensor& bias) {
  if (g.GetInt("transB", 0) != 0) w = TransposedMatrix(w);
  g.op_type = "MatMul";
  for (const char* a : {"transA", "transB", "alpha", "beta"}) g.attrs.erase(a);
  g.inputs.resize(2);
  g.inputs[1] = st.AddConstant(std::move(w));
  if (bias.numel() > 0) {
    g.inputs.push_back(st.AddConstant(bias.Reshaped({bias.numel()})));
    g.attrs["_bias"] = Attribute::Int(1);
  }
}

// Whether the int8 convolution takes a Conv of input shape `x` and `group` (FuseInt8's terms): 2-D or 1-D, one group,
// and few input channels (an image's 3) only where the int8 products are exact: where the kernel pairs channels it was
// slower than fp32 there (ResNet-50's 7x7 3->64 stem: 5.5 ms vs 3.1 ms, one thread); with exact products the int8
// stem is faster (0.85 ms vs 1.45 ms, two threads, AVX-512 VNNI).
bool Int8ConvTakes(const Shape& x, int64_t group) {
  return group == 1 && (x.size() == 4 || x.size() == 3) && (x[1] >= 16 || Int8ProductsExact());
}

// The `_int8*` attributes FuseInt8 gives a fused chain (input and output quantisation, per tensor).
void SetInt8(Node& n, float x_scale, int32_t x_zp, DType x_type, float y_scale, int32_t y_zp, DType y_type) {
  n.attrs["_int8"] = Attribute::Int(1);
  n.attrs["_activation"] = Attribute::String("");  // no later activation or residual fusion
  n.attrs["_int8_x_scale"] = Attribute::Float(x_scale);
  n.attrs["_int8_x_zero_point"] = Attribute::Int(x_zp);
  n.attrs["_int8_x_signed"] = Attribute::Int(x_type == DType::kI8);
  n.attrs["_int8_y_scale"] = Attribute::Float(y_scale);
  n.attrs["_int8_y_zero_point"] = Attribute::Int(y_zp);
  n.attrs["_int8_y_signed"] = Attribute::Int(y_type == DType::kI8);
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
    const Tensor wt = st.values[w].value;  // handles, not references: AddValue / AddConstant below grow st.values
    const Tensor ws = st.values[n.inputs[4]].value;
    if (wt.dtype() != DType::kI8 && wt.dtype() != DType::kU8) continue;
    if (ws.dtype() != DType::kF32 || st.values[n.inputs[1]].value.dtype() != DType::kF32) continue;
    const float x_scale = st.values[n.inputs[1]].value.data<float>()[0];
    const int64_t out_channels = wt.dim(0);
    const Tensor wzp = n.inputs[5] >= 0 ? st.values[n.inputs[5]].value : Tensor();
    bool symmetric = false;
    Tensor wf = DequantizedWeights(wt, ws, n.inputs[5] >= 0 ? &wzp : nullptr, 0, &symmetric);
    if (!wf.defined() || wf.numel() != wt.numel()) continue;
    std::vector<float> bias(out_channels, 0.f);
    const bool has_bias = n.inputs.size() > 8 && n.inputs[8] >= 0;
    if (has_bias && st.values[n.inputs[8]].value.dtype() != DType::kI32) continue;
    for (int64_t m = 0; has_bias && m < out_channels; ++m)
      bias[m] = static_cast<float>(st.values[n.inputs[8]].value.data<int32_t>()[m]) *
                (x_scale * ws.data<float>()[ws.numel() == 1 ? 0 : m]);
    const Shape x_shape = st.values[n.inputs[0]].shape, y_shape = st.values[out].shape;  // copies: values grow
    const DType x_type = st.values[n.inputs[0]].dtype, y_type = st.values[out].dtype;
    const int32_t x_zp = n.inputs[2] >= 0 ? IntAt(st.values[n.inputs[2]].value, 0) : 0;
    const int32_t y_zp = n.inputs[7] >= 0 ? IntAt(st.values[n.inputs[7]].value, 0) : 0;
    const float y_scale = st.values[n.inputs[6]].value.data<float>()[0];
    const int x_float = st.AddValue(DType::kF32, x_shape);
    const int y_float = st.AddValue(DType::kF32, y_shape);
    Node conv = MakeNode(
        "Conv", n.name,
        {x_float, st.AddConstant(std::move(wf)), st.AddConstant(Tensor::FromVector<float>({out_channels}, bias))},
        {y_float});
    conv.attrs = n.attrs;
    // Symmetric int8 weights in a host plan: the Conv FuseInt8 would make (oneDNN's int8 convolution).
    if (st.options.device.kind == Device::kHost && symmetric && n.inputs[7] >= 0 &&
        Int8ConvTakes(x_shape, n.GetInt("group", 1))) {
      SetInt8(conv, x_scale, x_zp, x_type, y_scale, y_zp, y_type);
      conv.attrs["_int8_w_scale"] =
          Attribute::Floats(std::vector<float>(ws.data<float>(), ws.data<float>() + ws.numel()));
    }
    replace[i] = {
        MakeNode("DequantizeLinear", n.name + "/dequantize", {n.inputs[0], n.inputs[1], n.inputs[2]}, {x_float}),
        std::move(conv), MakeNode("QuantizeLinear", n.name + "/quantize", {y_float, n.inputs[6], n.inputs[7]}, {out})};
  }
  Splice(st, replace);
}

// QLinearMatMul, and the com.microsoft QLinearAdd and QGemm (the QOperator format's transformer ops) as
// DequantizeLinear -> the float op -> QuantizeLinear, their constant weights (and QGemm's int32 bias) dequantised
// here: the reference kernels ran them one integer at a time (QOperator ViT-B/16: QLinearMatMul 8.2 s of 8.7). A
// QLinearMatMul whose weights are symmetric int8 (or whose B is an activation, where Int8MatMulOfActivationsFast)
// becomes the MatMul FuseInt8 would make in a host plan (`_int8*`: oneDNN's int8 matmul), the others float ones
// between pairs that then fuse like a QDQ model's. ORT dequantises, computes and requantises QLinearAdd in float as
// well; for the matmuls the result differs from the integer kernels only where a rounding boundary falls between
// (one step).

void LowerQOperatorOps(CompileState& st) {
  const bool host = st.options.device.kind == Device::kHost;
  std::vector<std::vector<Node>> replace(st.nodes.size());
  auto known = [&](int v) { return v >= 0 && st.values[v].known; };
  for (size_t i = 0; i < st.nodes.size(); ++i) {
    const Node& n = st.nodes[i];
    const bool matmul = n.op_type == "QLinearMatMul" && n.domain.empty();
    const bool add = n.op_type == "QLinearAdd" && n.domain == kMicrosoftDomain;
    const bool gemm = n.op_type == "QGemm" && n.domain == kMicrosoftDomain;
    if ((!matmul && !add && !gemm) || n.outputs.size() != 1 || n.outputs[0] < 0 || n.inputs.size() < 6) continue;
    auto input = [&](size_t k) { return k < n.inputs.size() ? n.inputs[k] : -1; };
    // Scales and zero points must be constants (the quantiser writes initializers).
    bool ok =
        known(input(1)) && known(input(4)) && (input(2) < 0 || known(input(2))) && (input(5) < 0 || known(input(5)));
    const size_t y_scale = matmul ? 6 : gemm ? 7 : 6;
    if (input(y_scale) >= 0) ok = ok && known(input(y_scale)) && (input(y_scale + 1) < 0 || known(input(y_scale + 1)));
    if (gemm && input(6) >= 0) ok = ok && known(input(6)) && known(input(3));
    if (!ok || st.values[input(1)].dtype != DType::kF32 || st.values[input(4)].dtype != DType::kF32) continue;
    if (gemm && n.GetInt("transA", 0) != 0) continue;
    std::vector<Node> nodes;
    auto dequantize = [&](size_t k, const char* suffix) {
      const int out = st.AddValue(DType::kF32, st.values[input(k)].shape);
      std::vector<int> in = {input(k), input(k + 1)};
      if (input(k + 2) >= 0) in.push_back(input(k + 2));
      Node dq = MakeNode("DequantizeLinear", n.name + suffix, in, {out});
      if (st.values[input(k + 1)].value.numel() > 1) dq.attrs["axis"] = Attribute::Int(1);  // b per column
      nodes.push_back(std::move(dq));
      return out;
    };
    const int out = n.outputs[0];
    const bool quantized_out = input(y_scale) >= 0;
    const int yf = quantized_out ? st.AddValue(DType::kF32, st.values[out].shape) : out;
    auto zero_point = [&](size_t k) { return input(k) < 0 ? 0 : IntAt(st.values[input(k)].value, 0); };
    if (add) {
      const int a = dequantize(0, "/dequantize_a"), b = dequantize(3, "/dequantize_b");
      nodes.push_back(MakeNode("Add", n.name, {a, b}, {yf}));
    } else {
      const int a = dequantize(0, "/dequantize_a");
      const Tensor bs = st.values[input(4)].value;  // handles, not references: st.values grows below
      const float a_scale = st.values[input(1)].value.data<float>()[0];
      Tensor w;  // constant weights, dequantised here (none where B is an activation)
      const bool activations = !known(input(3));
      bool int8_weights = false;
      if (!activations) {
        const Tensor bq = st.values[input(3)].value, bz = input(5) >= 0 ? st.values[input(5)].value : Tensor();
        if (bq.rank() != 2 || (bq.dtype() != DType::kI8 && bq.dtype() != DType::kU8)) continue;
        const int64_t axis = gemm && n.GetInt("transB", 0) != 0 ? 0 : 1;  // the output columns' axis
        w = DequantizedWeights(bq, bs, input(5) >= 0 ? &bz : nullptr, axis, &int8_weights);
        if (!w.defined() || w.numel() != bq.numel()) continue;
      } else if (!matmul || bs.numel() != 1) {
        continue;
      }
      const DType at = st.values[input(0)].dtype, yt = st.values[out].dtype;
      if (gemm) {
        Tensor bias;  // C (int32) at scale alpha * a_scale * b_scale[col]; none without C
        const bool has_bias = input(6) >= 0;
        const float alpha = n.GetFloat("alpha", 1.f);
        if (has_bias) {
          const Tensor c = st.values[input(6)].value;
          const int64_t cols = st.values[out].shape.back();
          bias = Tensor(DType::kF32, c.shape());
          for (int64_t e = 0; e < c.numel(); ++e)
            bias.data<float>()[e] = static_cast<float>(c.data<int32_t>()[e]) * alpha * a_scale *
                                    bs.data<float>()[bs.numel() == 1 ? 0 : e % cols];
        }
        Node g = MakeNode("Gemm", n.name, {a, -1}, {yf});
        g.attrs["transB"] = Attribute::Int(n.GetInt("transB", 0));
        if (host && int8_weights && quantized_out && alpha == 1.f && yt != DType::kF32 &&
            (!has_bias || bias.numel() == st.values[out].shape.back())) {
          // As FuseInt8 makes a QDQ Gemm: a MatMul on [K, N] weights with its bias fused, in int8.
          GemmAsMatMul(st, g, std::move(w), bias);
          SetInt8(g, a_scale, zero_point(2), at, st.values[input(y_scale)].value.data<float>()[0],
                  zero_point(y_scale + 1), yt);
          g.attrs["_int8_w_scale"] =
              Attribute::Floats(std::vector<float>(bs.data<float>(), bs.data<float>() + bs.numel()));
        } else {
          g.attrs["alpha"] = Attribute::Float(alpha);
          g.inputs[1] = st.AddConstant(std::move(w));
          if (has_bias) g.inputs.push_back(st.AddConstant(std::move(bias)));
        }
        nodes.push_back(std::move(g));
      } else {
        const int b = activations ? dequantize(3, "/dequantize_b") : st.AddConstant(std::move(w));
        Node mm = MakeNode("MatMul", n.name, {a, b}, {yf});
        if (host && (activations ? Int8MatMulOfActivationsFast() : int8_weights) && yt != DType::kF32) {
          SetInt8(mm, a_scale, zero_point(2), at, st.values[input(6)].value.data<float>()[0], zero_point(7), yt);
          if (activations) {
            mm.attrs["_int8_b_scale"] = Attribute::Float(bs.data<float>()[0]);
            mm.attrs["_int8_b_zero_point"] = Attribute::Int(zero_point(5));
            mm.attrs["_int8_b_signed"] = Attribute::Int(st.values[input(3)].dtype == DType::kI8);
          } else {
            mm.attrs["_int8_w_scale"] =
                Attribute::Floats(std::vector<float>(bs.data<float>(), bs.data<float>() + bs.numel()));
          }
        }
        nodes.push_back(std::move(mm));
      }
    }
    if (quantized_out) {
      std::vector<int> q_in = {yf, input(y_scale)};
      if (input(y_scale + 1) >= 0) {
        q_in.push_back(input(y_scale + 1));
      } else {  // an absent zero point: zero of the output's type
        q_in.push_back(st.AddConstant(st.values[out].dtype == DType::kI8 ? Tensor::Scalar<int8_t>(0)
                                                                         : Tensor::Scalar<uint8_t>(0)));
      }
      nodes.push_back(MakeNode("QuantizeLinear", n.name + "/quantize", q_in, {out}));
    }
    replace[i] = std::move(nodes);
  }
  Splice(st, replace);
}

// DequantizeLinear(x_q) -> Conv(W = DequantizeLinear(int8 constant), B) [-> Relu] -> QuantizeLinear -> y_q, each
// y_q read only by DequantizeLinears, as ONNX Runtime's QDQ quantiser writes it (and the same around a MatMul whose B
// is such a constant, 2-D, its scales per column: transformers' projections, below): one Conv with `_int8` attributes
// (scales, zero points, signedness of x and y, the weight scales) that computes the whole chain, DequantizeLinear of
// y_q included, on oneDNN's int8 convolution (src/kernels/cpu/dnnl_conv_int8.cc). Its input is the float value the
// QuantizeLinear that wrote x_q reads (quantising it again gives x_q) or x_q's dequantised value; its output replaces
// every DequantizeLinear of y_q. Activations stay float32 between the convolutions (the residual Adds and pooling
// and the channels-last layout pass are unchanged) but the convolutions run on 8-bit data. Conditions: 2-D, group 1,
// per-tensor activation scales and zero points (known), symmetric int8 weights (per-tensor or per-output-channel
// scale, axis 0), a bias that is an int32 multiple of x_scale * w_scale[m] (ORT quantises it so), and a Relu only
// where the output's zero point is its type's minimum (the saturation is the Relu). Infer-and-fold has already folded
// the weight's DequantizeLinear into a float constant (w_q * w_scale, exact); its scales come from the graph's node.
// A MatMul (or a Gemm, made one) runs on oneDNN's int8 matmul (src/kernels/cpu/dnnl_matmul_int8.cc), in host plans
// only (the CUDA kernels have no int8 MatMul). One whose B is itself an activation between quantisation pairs
// (attention's Q K^T and P V) takes B's quantisation too (`_int8_b_*`, per tensor: both operands quantised per run),
// only where oneDNN has a fast kernel for that (Int8MatMulOfActivationsFast: exact products, VNNI or AMX; elsewhere
// only constant weights can be placed in safe pairs), else it stays float32 between its quantisation pairs.
struct Int8Chain {
  int conv = -1, relu = -1, q = -1, dq = -1, b_dq = -1;
  float x_scale = 0, y_scale = 0, b_scale = 0;
  int32_t x_zp = 0, y_zp = 0, b_zp = 0;
  bool x_signed = false, y_signed = false, b_signed = false;
  std::vector<float> w_scale;
  std::vector<int> y_dqs;  // node indices of the DequantizeLinears of y_q
};

// The weight `wf` of a Conv (`rank` 4 or 3) or MatMul / Gemm (rank 2): a folded DequantizeLinear of a constant int8
// tensor, symmetric, its scales one or one per output channel (axis `out_axis`: Conv's first; a MatMul's columns, 1;
// a Gemm's 0 with transB) into `w_scale`.
bool ConstantInt8Weight(const CompileState& st, const std::vector<const Node*>& graph_producer, int wf, size_t rank,
                        int64_t out_axis, std::vector<float>* w_scale) {
  if (!st.values[wf].known || wf >= static_cast<int>(graph_producer.size()) || !graph_producer[wf]) return false;
  const Node& wdq = *graph_producer[wf];
  if (wdq.op_type != "DequantizeLinear" || !QdqDomain(wdq) || wdq.inputs.size() < 2 || wdq.inputs[0] < 0) return false;
  const CompileValue& wq = st.values[wdq.inputs[0]];
  if (!wq.known || wq.dtype != DType::kI8 || wq.value.shape().size() != rank) return false;
  const int64_t out_c = wq.value.dim(out_axis);
  const CompileValue& ws = st.values[wdq.inputs[1]];
  if (!ws.known || ws.dtype != DType::kF32) return false;
  int64_t scale_axis = wdq.GetInt("axis", 1);
  if (scale_axis < 0) scale_axis += static_cast<int64_t>(wq.value.shape().size());
  if (ws.value.numel() != 1 && !(ws.value.numel() == out_c && scale_axis == out_axis)) return false;
  if (wdq.Has("block_size") && wdq.GetInt("block_size", 0) != 0) return false;
  bool symmetric = true;
  if (wdq.inputs.size() > 2 && wdq.inputs[2] >= 0) {
    const CompileValue& wz = st.values[wdq.inputs[2]];
    symmetric = wz.known && wz.dtype == DType::kI8;
    for (int64_t k = 0; symmetric && k < wz.value.numel(); ++k) symmetric = wz.value.data<int8_t>()[k] == 0;
  }
  if (!symmetric) return false;
  w_scale->assign(ws.value.data<float>(), ws.value.data<float>() + ws.value.numel());
  return true;
}

void FuseInt8(CompileState& st) {
  const auto consumers = ConsumersOf(st);
  std::vector<int> producer(st.values.size(), -1);
  for (size_t i = 0; i < st.nodes.size(); ++i)
    for (int v : st.nodes[i].outputs)
      if (v >= 0) producer[v] = static_cast<int>(i);
  std::vector<const Node*> graph_producer(st.values.size(), nullptr);
  for (const Node& n : st.graph->nodes)
    for (int v : n.outputs)
      if (v >= 0 && v < static_cast<int>(graph_producer.size())) graph_producer[v] = &n;
  auto per_tensor = [&](const Node& n, bool* is_signed, float* scale, int32_t* zp, int value) {
    const DType t = st.values[value].dtype;
    if (t != DType::kI8 && t != DType::kU8) return false;
    *is_signed = t == DType::kI8;
    *scale = KnownScale(st, n, 1);
    return *scale > 0.f && std::isfinite(*scale) && KnownZeroPoint(st, n, zp);
  };

  const bool matmul_int8 = st.options.device.kind == Device::kHost;
  std::vector<Int8Chain> found;
  for (size_t i = 0; i < st.nodes.size(); ++i) {
    const Node& c = st.nodes[i];
    // A Gemm (alpha and beta 1, A not transposed, a constant B and C) becomes a MatMul with a fused bias: [K, N]
    // weights (transposed here where transB), C its `_bias` input.
    const bool gemm = c.op_type == "Gemm", matmul = gemm || c.op_type == "MatMul";
    if ((!matmul && c.op_type != "Conv") || !c.domain.empty() || c.outputs.size() != 1 || c.inputs.size() < 2) continue;
    if (c.GetInt("group", 1) != 1 || c.Has("_activation") || c.Has("_residual") || c.Has("_bias")) continue;
    if (matmul && (!matmul_int8 || c.inputs.size() > (gemm ? 3u : 2u))) continue;
    if (gemm && (c.GetInt("transA", 0) != 0 || c.GetFloat("alpha", 1.f) != 1.f || c.GetFloat("beta", 1.f) != 1.f ||
                 c.inputs[1] < 0 || !st.values[c.inputs[1]].known))
      continue;
    const int xf = c.inputs[0], wf = c.inputs[1], yf = c.outputs[0];
    if (xf < 0 || wf < 0 || yf < 0 || producer[xf] < 0) continue;
    const size_t rank = st.values[xf].shape.size();
    if (matmul ? rank < 2 || st.values[xf].dtype != DType::kF32 : !Int8ConvTakes(st.values[xf].shape, 1)) continue;
    Int8Chain f;
    f.conv = static_cast<int>(i);
    f.dq = producer[xf];
    const Node& dq = st.nodes[f.dq];
    if (dq.op_type != "DequantizeLinear" || !QdqDomain(dq) || dq.inputs.empty() || dq.inputs[0] < 0) continue;
    if (st.values[dq.inputs[0]].known || !per_tensor(dq, &f.x_signed, &f.x_scale, &f.x_zp, dq.inputs[0])) continue;
    if (matmul && !st.values[wf].known) {  // B an activation: DequantizeLinear per tensor, the same rank as A
      if (!Int8MatMulOfActivationsFast()) continue;
      f.b_dq = producer[wf];
      if (f.b_dq < 0 || st.values[wf].shape.size() != st.values[xf].shape.size()) continue;
      const Node& bdq = st.nodes[f.b_dq];
      if (bdq.op_type != "DequantizeLinear" || !QdqDomain(bdq) || bdq.inputs.empty() || bdq.inputs[0] < 0 ||
          st.values[bdq.inputs[0]].known || !per_tensor(bdq, &f.b_signed, &f.b_scale, &f.b_zp, bdq.inputs[0]))
        continue;
    } else if (!ConstantInt8Weight(st, graph_producer, wf, matmul ? 2 : rank,
                                   gemm     ? (c.GetInt("transB", 0) != 0 ? 0 : 1)
                                   : matmul ? 1
                                            : 0,
                                   &f.w_scale)) {
      continue;
    }
    const int64_t out_c =
        st.values[yf].shape.empty() ? 0 : st.values[yf].shape[matmul ? st.values[yf].shape.size() - 1 : 1];
    // Bias: an int32 multiple of x_scale * w_scale[m] (the kernel's own test, so that it never declines a node fused
    // here: the reference Conv would ignore the quantisation).
    bool bias_ok = true;
    if (c.inputs.size() > 2 && c.inputs[2] >= 0) {
      const CompileValue& b = st.values[c.inputs[2]];
      bias_ok = b.known && b.dtype == DType::kF32 && b.value.numel() == out_c;
      for (int64_t m = 0; bias_ok && m < out_c; ++m) {
        const double step = static_cast<double>(f.x_scale) * f.w_scale[f.w_scale.size() == 1 ? 0 : m];
        const double v = b.value.data<float>()[m], q = std::nearbyint(v / step);
        bias_ok = std::fabs(q) <= 2e9 && std::fabs(q * step - v) <= 1e-3 * step + 1e-6 * std::fabs(v);
      }
    }
    if (!bias_ok) continue;
    // Output: [Relu ->] QuantizeLinear, per-tensor, the only consumer; y_q read only by matching DequantizeLinears.
    if (st.is_graph_output[yf] || consumers[yf].size() != 1) continue;
    f.q = consumers[yf][0];
    if (st.nodes[f.q].op_type == "Relu") {
      f.relu = f.q;
      const int r = st.nodes[f.relu].outputs[0];
      if (r < 0 || st.is_graph_output[r] || consumers[r].size() != 1) continue;
      f.q = consumers[r][0];
    }
    const Node& q = st.nodes[f.q];
    if (q.op_type != "QuantizeLinear" || !QdqDomain(q) || q.outputs.size() != 1 || q.outputs[0] < 0) continue;
    const int yq = q.outputs[0];
    if (!per_tensor(q, &f.y_signed, &f.y_scale, &f.y_zp, yq) || st.is_graph_output[yq]) continue;
    if (f.relu >= 0 && f.y_zp != (f.y_signed ? -128 : 0)) continue;
    bool ok = !consumers[yq].empty();
    for (int k : consumers[yq]) {
      const Node& d = st.nodes[k];
      float s = 0;
      int32_t z = 0;
      bool sg = false;
      // A graph output only as the sole DequantizeLinear (the fused node writes it; the others are renamed to it).
      ok = ok && d.op_type == "DequantizeLinear" && QdqDomain(d) && d.inputs[0] == yq && d.outputs.size() == 1 &&
           d.outputs[0] >= 0 && (consumers[yq].size() == 1 || !st.is_graph_output[d.outputs[0]]) &&
           per_tensor(d, &sg, &s, &z, yq) && s == f.y_scale && z == f.y_zp;
      f.y_dqs.push_back(k);
    }
    if (!ok) continue;
    found.push_back(std::move(f));
  }
  if (found.empty()) return;

  std::vector<char> fused_q(st.nodes.size(), 0), drop(st.nodes.size(), 0);
  for (const Int8Chain& f : found) fused_q[f.q] = 1;
  std::vector<int> rename(st.values.size(), -1);
  std::vector<Node> replaced(st.nodes.size());
  std::vector<char> has_replaced(st.nodes.size(), 0);
  for (const Int8Chain& f : found) {
    const Node& c = st.nodes[f.conv];
    Node n = c;
    // An input: the float the QuantizeLinear of x_q reads, unless that QuantizeLinear is itself fused (then x_q's
    // DequantizeLinear output, renamed below to the fused convolution's output).
    auto float_input = [&](int input, int dq_index, float scale, int32_t zp) {
      const Node& dq = st.nodes[dq_index];
      const int xp = producer[dq.inputs[0]];
      if (xp < 0 || fused_q[xp]) return input;
      const Node& qx = st.nodes[xp];
      float s = 0;
      int32_t z = 0;
      bool sg = false;
      if (qx.op_type == "QuantizeLinear" && QdqDomain(qx) && !qx.inputs.empty() && qx.inputs[0] >= 0 &&
          st.values[qx.inputs[0]].dtype == DType::kF32 && per_tensor(qx, &sg, &s, &z, dq.inputs[0]) && s == scale &&
          z == zp)
        return qx.inputs[0];
      return input;
    };
    n.inputs[0] = float_input(c.inputs[0], f.dq, f.x_scale, f.x_zp);
    if (n.op_type == "Gemm")  // copies: AddConstant grows st.values
      GemmAsMatMul(st, n, st.values[c.inputs[1]].value,
                   n.inputs.size() > 2 && n.inputs[2] >= 0 ? st.values[n.inputs[2]].value : Tensor());
    if (f.b_dq >= 0) {
      n.inputs[1] = float_input(c.inputs[1], f.b_dq, f.b_scale, f.b_zp);
      n.attrs["_int8_b_scale"] = Attribute::Float(f.b_scale);
      n.attrs["_int8_b_zero_point"] = Attribute::Int(f.b_zp);
      n.attrs["_int8_b_signed"] = Attribute::Int(f.b_signed);
    }
    SetInt8(n, f.x_scale, f.x_zp, f.x_signed ? DType::kI8 : DType::kU8, f.y_scale, f.y_zp,
            f.y_signed ? DType::kI8 : DType::kU8);
    if (f.b_dq < 0) n.attrs["_int8_w_scale"] = Attribute::Floats(f.w_scale);
    const int out = st.nodes[f.y_dqs[0]].outputs[0];
    n.outputs = {out};
    for (int k : f.y_dqs) {
      rename[st.nodes[k].outputs[0]] = out;
      drop[k] = 1;
    }
    drop[f.q] = 1;
    if (f.relu >= 0) drop[f.relu] = 1;
    replaced[f.conv] = std::move(n);
    has_replaced[f.conv] = 1;
  }
  std::vector<Node> nodes;
  for (size_t k = 0; k < st.nodes.size(); ++k) {
    if (has_replaced[k])
      nodes.push_back(std::move(replaced[k]));
    else if (!drop[k])
      nodes.push_back(std::move(st.nodes[k]));
  }
  for (Node& n : nodes)
    for (int& v : n.inputs)
      if (v >= 0 && v < static_cast<int>(rename.size()) && rename[v] >= 0) v = rename[v];
  st.nodes = std::move(nodes);
  // QuantizeLinear / DequantizeLinear nodes left without consumers (x_q read only by fused convolutions).
  for (bool changed = true; changed;) {
    changed = false;
    const auto uses = ConsumersOf(st);
    std::vector<Node> live;
    for (Node& n : st.nodes) {
      const bool dead = (n.op_type == "DequantizeLinear" || n.op_type == "QuantizeLinear") && n.outputs.size() == 1 &&
                        n.outputs[0] >= 0 && uses[n.outputs[0]].empty() && !st.is_graph_output[n.outputs[0]];
      changed = changed || dead;
      if (!dead) live.push_back(std::move(n));
    }
    st.nodes = std::move(live);
  }
}

// The quantisation grid a float value lies on: every element is k * scale (that float product) for an integer k in
// [lo, hi]. DequantizeLinear(QuantizeLinear(.)) with the same grid leaves such a value unchanged, bit for bit: k * s
// divided by s rounds back to k (the quotient is within half an ulp of k for |k| <= 2^24), so Round and Clip keep it
// and the product is the same.
struct Grid {
  float scale = 0, lo = 0, hi = 0;
  bool known() const { return scale > 0; }
  bool operator==(const Grid& o) const { return scale == o.scale && lo == o.lo && hi == o.hi; }
};

// Ops whose outputs hold only elements of their data input (input 0; Concat: all its inputs), so they keep its grid.
// Relu adds 0 = (zp - zp) * scale, on every grid (a zero point lies in its type's range).
bool KeepsGrid(const Node& n) {
  static const std::set<std::string> ops = {"Reshape", "Flatten",  "Squeeze",      "Unsqueeze",    "Identity",
                                            "Transpose", "Slice",  "Split",        "MaxPool",      "Concat",
                                            "Relu",      "Gather", "DepthToSpace", "SpaceToDepth", "Tile", "Expand"};
  return n.domain.empty() && ops.count(n.op_type) > 0;
}

// ConvInteger / MatMulInteger -> [Add(int32 bias)] -> Cast(to float) -> Mul(float scale), as ONNX Runtime's
// quantize_dynamic writes them (the bias and the scale are computed at run time from DynamicQuantizeLinear's scale), ->
// one node carrying `_dequantize` (ops/integer_dequantize.h): one pass over the result instead of three reference
// passes on int32 data. Conditions: each intermediate read only by the next op and no graph output, the bias and the
// scale one value or one per channel of the result (ConvInteger: axis 1; MatMulInteger: the last), the Mul's result
// shaped like the integer op's. The fused node takes the Mul's place in the order (its bias and scale may be computed
// after the integer op; its own inputs all come before it).
void FuseIntegerDequantize(CompileState& st) {
  const auto consumers = ConsumersOf(st);
  auto only_reader = [&](int v) -> int {
    if (v < 0 || st.is_graph_output[v] || consumers[v].size() != 1) return -1;
    return consumers[v][0];
  };
  // `k` holds one value, or one per element of axis `axis` of a result of shape y (numpy broadcasting from the right).
  auto per_channel = [&](int k, const Shape& y, size_t axis) {
    const Shape& ks = st.values[k].shape;
    if (ks.size() > y.size()) return false;
    for (size_t d = 0; d < ks.size(); ++d) {
      const size_t yd = y.size() - ks.size() + d;
      if (ks[d] != 1 && !(yd == axis && ks[d] == y[yd])) return false;
    }
    return true;
  };
  std::vector<char> drop(st.nodes.size(), 0);
  std::vector<Node> fused(st.nodes.size());  // at the Mul's index
  for (size_t i = 0; i < st.nodes.size(); ++i) {
    const Node& p = st.nodes[i];
    const bool conv = p.op_type == "ConvInteger";
    if ((!conv && p.op_type != "MatMulInteger") || !p.domain.empty() || p.outputs.size() != 1 || p.Has("_dequantize"))
      continue;
    const int acc = p.outputs[0];
    if (acc < 0 || st.values[acc].dtype != DType::kI32) continue;
    const Shape y = st.values[acc].shape;
    if (y.empty()) continue;
    const size_t axis = conv ? 1 : y.size() - 1;
    int bias = -1, cur = acc;
    int j = only_reader(cur);
    std::vector<int> chain;
    if (j >= 0 && st.nodes[j].op_type == "Add" && st.nodes[j].domain.empty() && st.nodes[j].inputs.size() == 2 &&
        st.nodes[j].outputs.size() == 1) {
      const Node& add = st.nodes[j];
      const int other = add.inputs[0] == cur ? add.inputs[1] : add.inputs[0];
      if (other == cur || other < 0 || st.values[other].dtype != DType::kI32 || !per_channel(other, y, axis) ||
          st.values[add.outputs[0]].shape != y)
        continue;
      bias = other;
      chain.push_back(j);
      cur = add.outputs[0];
      j = only_reader(cur);
    }
    if (j < 0 || st.nodes[j].op_type != "Cast" || !st.nodes[j].domain.empty() || st.nodes[j].outputs.size() != 1 ||
        st.values[st.nodes[j].outputs[0]].dtype != DType::kF32)
      continue;
    chain.push_back(j);
    cur = st.nodes[j].outputs[0];
    j = only_reader(cur);
    if (j < 0 || st.nodes[j].op_type != "Mul" || !st.nodes[j].domain.empty() || st.nodes[j].inputs.size() != 2 ||
        st.nodes[j].outputs.size() != 1)
      continue;
    const Node& mul = st.nodes[j];
    const int scale = mul.inputs[0] == cur ? mul.inputs[1] : mul.inputs[0];
    const int out = mul.outputs[0];
    if (scale == cur || scale < 0 || st.values[scale].dtype != DType::kF32 || !per_channel(scale, y, axis) ||
        st.values[out].dtype != DType::kF32 || st.values[out].shape != y)
      continue;
    chain.push_back(j);
    bool free = true;
    for (int k : chain) free = free && !drop[k] && fused[k].op_type.empty();
    if (!free) continue;
    Node f = p;
    f.inputs.resize(4, -1);
    f.inputs.push_back(bias);
    f.inputs.push_back(scale);
    f.outputs = {out};
    f.attrs["_dequantize"] = Attribute::Int(1);
    drop[i] = 1;
    for (int k : chain) drop[k] = 1;
    fused[j] = std::move(f);
  }
  std::vector<Node> kept;
  for (size_t k = 0; k < st.nodes.size(); ++k) {
    if (!fused[k].op_type.empty())
      kept.push_back(std::move(fused[k]));
    else if (!drop[k])
      kept.push_back(std::move(st.nodes[k]));
  }
  st.nodes = std::move(kept);
}

// DequantizeLinear(D(x_q)) -> D(DequantizeLinear(x_q)) for a data-movement op D (one data input, one output, read
// only by that DequantizeLinear) and a per-tensor DequantizeLinear: the two commute (an elementwise affine map and a
// rearrangement), and the QOperator format leaves Q -> Reshape / Transpose / Gather (on int8 data) -> DQ chains that
// otherwise run both quantisation steps on the reference kernels (QOperator ViT-B/16: 40 ms of 115). After the move,
// the QuantizeLinear meets its DequantizeLinear and the pair fuses (below). Runs after FuseInt8, which wants the
// DequantizeLinear right before its Conv / MatMul.
void SinkDequantizeThroughDataMovement(CompileState& st) {
  static const std::set<std::string> moves = {"Reshape",  "Flatten",   "Squeeze",      "Unsqueeze",
                                              "Identity", "Transpose", "Slice",        "Gather",
                                              "Tile",     "Expand",    "DepthToSpace", "SpaceToDepth"};
  // One pass, the tables kept up to date (a pass per move would be quadratic in a model of many such chains). A move
  // swaps the two nodes' places, so a data value's only reader keeps its index.
  const auto consumers = ConsumersOf(st);
  std::vector<int> producer(st.values.size(), -1);
  for (size_t i = 0; i < st.nodes.size(); ++i)
    for (int v : st.nodes[i].outputs)
      if (v >= 0) producer[v] = static_cast<int>(i);
  auto sole_reader = [&](int v) {
    return v >= 0 && v < static_cast<int>(consumers.size()) && consumers[v].size() == 1;
  };
  for (size_t j = 0; j < st.nodes.size(); ++j) {
    if (st.nodes[j].op_type != "DequantizeLinear" || !QdqDomain(st.nodes[j]) || st.nodes[j].inputs.size() < 2 ||
        st.nodes[j].inputs[0] < 0 || st.nodes[j].outputs.size() != 1 || st.nodes[j].outputs[0] < 0 ||
        st.nodes[j].Has("block_size") || !std::isfinite(KnownScale(st, st.nodes[j], 1)))  // per tensor, known
      continue;
    int32_t zp = 0;
    if (!KnownZeroPoint(st, st.nodes[j], &zp)) continue;
    for (size_t at = j;;) {  // the DequantizeLinear's place, moving up a chain of data movement
      Node& dq = st.nodes[at];
      const int xq = dq.inputs[0];
      const int p = xq < static_cast<int>(producer.size()) ? producer[xq] : -1;
      if (p < 0 || !sole_reader(xq) || st.is_graph_output[xq]) break;
      Node& d = st.nodes[p];
      if (!d.domain.empty() || !moves.count(d.op_type) || d.outputs.size() != 1 || d.inputs.empty() || d.inputs[0] < 0)
        break;
      // D after the DequantizeLinear: DQ reads D's data input, D writes the DequantizeLinear's output.
      const int source = d.inputs[0], out = dq.outputs[0];
      const int moved = st.AddValue(DType::kF32, st.values[source].shape);
      dq.inputs[0] = source;
      dq.outputs = {moved};
      d.inputs[0] = moved;
      d.outputs = {out};
      st.values[out].dtype = DType::kF32;
      std::swap(st.nodes[p], st.nodes[at]);  // the DequantizeLinear now runs first (p < at)
      producer.resize(st.values.size(), -1);
      producer[moved] = p;
      producer[out] = static_cast<int>(at);
      at = static_cast<size_t>(p);  // `source`'s sole reader is still node p: now the DequantizeLinear
    }
  }
}

}  // namespace

void FuseQuantizeDequantizePairs(CompileState& st) {
  FuseIntegerDequantize(st);
  if (st.opset < 11) return;  // Round and Clip's bound inputs are opset 11
  LowerQLinearConv(st);
  LowerQOperatorOps(st);
  if (st.opset >= 10) FuseInt8(st);
  SinkDequantizeThroughDataMovement(st);
  const auto consumers = ConsumersOf(st);
  std::vector<char> drop(st.nodes.size(), 0);
  std::vector<std::vector<Node>> replace(st.nodes.size());
  // A pair whose input already lies on its grid is dropped (its output renamed to its input): after a pair, the
  // data-movement ops of a channel shuffle or a flatten often meet another pair with the same grid, which would cost
  // a pass and hide the pattern from the later fusions.
  std::vector<Grid> grid(st.values.size());
  std::vector<int> rename(st.values.size(), -1);
  auto renamed = [&](int v) {  // chains: a fan-out DequantizeLinear renamed to a pair that is itself dropped
    while (v >= 0 && rename[v] >= 0) v = rename[v];
    return v;
  };
  auto params = [&](const Node& n, int quantised, Grid* g) {  // a Q or DQ node's per-tensor grid
    const float scale = KnownScale(st, n, 1);
    int32_t zp = 0;
    const DType t = st.values[quantised].dtype;
    if (!(scale > 0.f) || !std::isfinite(scale) || !KnownZeroPoint(st, n, &zp) || (t != DType::kI8 && t != DType::kU8))
      return false;
    *g = {scale, static_cast<float>((t == DType::kI8 ? -128 : 0) - zp), static_cast<float>((t == DType::kI8 ? 127 : 255) - zp)};
    return true;
  };
  for (size_t i = 0; i < st.nodes.size(); ++i) {
    const Node& n = st.nodes[i];
    // Grids of this node's outputs (the pairs below set their own).
    if (n.op_type == "DequantizeLinear" && QdqDomain(n) && !n.inputs.empty() && n.inputs[0] >= 0 &&
        n.outputs.size() == 1 && n.outputs[0] >= 0) {
      params(n, n.inputs[0], &grid[n.outputs[0]]);
    } else if ((n.op_type == "Conv" || n.op_type == "MatMul") && n.Has("_int8") && n.outputs.size() == 1 &&
               n.outputs[0] >= 0) {
      const bool sg = n.GetInt("_int8_y_signed", 0) != 0;
      const float zp = static_cast<float>(n.GetInt("_int8_y_zero_point", 0));
      grid[n.outputs[0]] = {n.GetFloat("_int8_y_scale", 0.f), (sg ? -128.f : 0.f) - zp, (sg ? 127.f : 255.f) - zp};
    } else if (KeepsGrid(n) && !n.inputs.empty()) {
      Grid g = n.inputs[0] >= 0 ? grid[renamed(n.inputs[0])] : Grid{};
      if (n.op_type == "Concat")
        for (int v : n.inputs)
          if (v < 0 || !(grid[renamed(v)] == g)) g = Grid{};
      const size_t outs = n.op_type == "MaxPool" ? 1 : n.outputs.size();  // not MaxPool's indices
      for (size_t k = 0; k < outs && g.known(); ++k)
        if (n.outputs[k] >= 0) grid[n.outputs[k]] = g;
    }
    const Node& q = n;
    if (q.op_type != "QuantizeLinear" || !QdqDomain(q) || q.outputs.size() != 1 || q.inputs.empty()) continue;
    const int x = q.inputs[0], qv = q.outputs[0];
    if (x < 0 || qv < 0 || st.values[x].dtype != DType::kF32 || st.is_graph_output[qv]) continue;
    // Every reader a DequantizeLinear with the pair's scale and zero point (x_q fans out in QOperator graphs): the
    // first becomes the pair, the others are renamed to its output.
    if (consumers[qv].empty()) continue;
    const size_t j = consumers[qv][0];
    const float q_scale = KnownScale(st, q, 1);
    int32_t q_zp = 0;
    if (!(q_scale > 0.f) || !std::isfinite(q_scale) || !KnownZeroPoint(st, q, &q_zp)) continue;
    bool all_pairs = true;
    for (size_t c = 0; all_pairs && c < consumers[qv].size(); ++c) {
      const Node& d = st.nodes[consumers[qv][c]];
      int32_t d_zp = 0;
      all_pairs = d.op_type == "DequantizeLinear" && QdqDomain(d) && d.inputs[0] == qv && d.outputs.size() == 1 &&
                  d.outputs[0] >= 0 && st.values[d.outputs[0]].dtype == DType::kF32 &&
                  KnownScale(st, d, 1) == q_scale && KnownZeroPoint(st, d, &d_zp) && d_zp == q_zp &&
                  (c == 0 || !st.is_graph_output[d.outputs[0]]);
    }
    if (!all_pairs) continue;
    const int out = st.nodes[j].outputs[0];
    for (size_t c = 1; c < consumers[qv].size(); ++c) {
      rename[st.nodes[consumers[qv][c]].outputs[0]] = out;
      drop[consumers[qv][c]] = 1;
    }
    const bool is_i8 = st.values[qv].dtype == DType::kI8;
    if (!is_i8 && st.values[qv].dtype != DType::kU8) continue;
    const float lo = static_cast<float>((is_i8 ? -128 : 0) - q_zp), hi = static_cast<float>((is_i8 ? 127 : 255) - q_zp);
    const Grid pair{q_scale, lo, hi};
    const int source = renamed(x);
    if (grid[source] == pair && !st.is_graph_output[out]) {  // already on the grid: the pair changes nothing
      rename[out] = source;
      grid[out] = pair;
      drop[i] = drop[j] = 1;
      continue;
    }
    grid[out] = pair;

    if (st.options.device.kind == Device::kHost) {
      // On the CPU one pass: a Round carrying the pair (its reference and fast kernels compute the four steps).
      Node fq;
      fq.op_type = "Round";
      fq.name = q.name + "/fake_quantize";
      fq.inputs = {x};
      fq.outputs = {out};
      fq.attrs["_quant_scale"] = Attribute::Float(q_scale);
      fq.attrs["_quant_lo"] = Attribute::Float(lo);
      fq.attrs["_quant_hi"] = Attribute::Float(hi);
      replace[j] = {std::move(fq)};
      drop[i] = drop[j] = 1;
      continue;
    }
    const Shape shape = st.values[x].shape;  // a copy: AddValue grows st.values
    const int scale = st.AddConstant(Tensor::Scalar<float>(q_scale));
    const int lo_v = st.AddConstant(Tensor::Scalar<float>(lo));
    const int hi_v = st.AddConstant(Tensor::Scalar<float>(hi));
    const int divided = st.AddValue(DType::kF32, shape);
    const int rounded = st.AddValue(DType::kF32, shape);
    const int clipped = st.AddValue(DType::kF32, shape);
    auto make = [&](const char* op, std::vector<int> inputs, int output, const char* suffix) {
      return MakeNode(op, q.name + suffix, std::move(inputs), {output});
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
  for (Node& n : kept)
    for (int& v : n.inputs) v = renamed(v);
  st.nodes = std::move(kept);
}

}  // namespace osprey
