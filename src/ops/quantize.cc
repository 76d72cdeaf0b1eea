// Schemas of the quantisation op family (issue 11): QuantizeLinear, DequantizeLinear (opsets 10, 13, 19, 21:
// per-tensor, per-axis and blocked scales), DynamicQuantizeLinear, QLinearConv, QLinearMatMul, ConvInteger and
// MatMulInteger, and the com.microsoft ops ONNX Runtime's quantiser writes in its QOperator format (QLinearAdd,
// QLinearGlobalAveragePool, QGemm; same semantics as ORT's contrib kernels). Quantised values are int8 or uint8
// (DequantizeLinear also reads int32, as ONNX Runtime's quantiser writes biases); scales are float32 or float16. The
// convolution and matrix-product shape rules are the float ops' (src/ops/nn.cc), reached through the Conv and MatMul
// schemas so that the two can never drift apart.
#include <string>

#include "ops/integer_dequantize.h"
#include "ops/op_registry.h"
#include "ops/quantize_params.h"

namespace osprey {
namespace {

std::string Str(int64_t v) { return std::to_string(v); }

bool IsQuantized(DType t) { return t == DType::kI8 || t == DType::kU8; }
bool IsScale(DType t) { return t == DType::kF32 || t == DType::kF16; }

void RequireInput(const InferContext& c, int i, const char* what) {
  if (!c.Has(i)) c.Fail(std::string("input ") + Str(i) + " (" + what + ") is required");
}

[[noreturn]] void FailDType(const InferContext& c, int i, const char* what, const char* expected) {
  throw Error(ErrorCode::kUnsupported, c.node.Describe() + ": input " + Str(i) + " (" + what + ") has dtype " +
                                           DTypeName(c.input_dtypes[i]) + "; expected " + expected);
}

void RequireQuantized(const InferContext& c, int i, const char* what) {
  RequireInput(c, i, what);
  if (!IsQuantized(c.input_dtypes[i])) FailDType(c, i, what, "int8 or uint8");
}

void RequireScale(const InferContext& c, int i, const char* what) {
  RequireInput(c, i, what);
  if (!IsScale(c.input_dtypes[i])) FailDType(c, i, what, "float32 or float16");
}

// A zero point, when given, has the dtype of the quantised tensor it belongs to.
void RequireZeroPointDType(const InferContext& c, int zp, const char* what, DType quantized) {
  if (!c.Has(zp)) return;
  if (c.input_dtypes[zp] != quantized)
    c.Fail(std::string("input ") + Str(zp) + " (" + what + ") has dtype " + DTypeName(c.input_dtypes[zp]) +
           ", expected " + DTypeName(quantized) + " (the dtype of the tensor it quantises)");
}

// A scale or zero point that must be one value (per-tensor): a scalar or a 1-element 1-D tensor.
void RequirePerTensor(const InferContext& c, int i, const char* what) {
  if (!c.Has(i)) return;
  const Shape& s = c.input_shapes[i];
  if (s.size() > 1 || NumElements(s) != 1)
    c.Fail(std::string("input ") + Str(i) + " (" + what + ") must be a scalar or a 1-element vector, got shape " +
           ShapeToString(s));
}

// A scale or zero point that is per-tensor or one value per output channel (`channels`).
void RequirePerTensorOrChannel(const InferContext& c, int i, const char* what, int64_t channels) {
  if (!c.Has(i)) return;
  const Shape& s = c.input_shapes[i];
  if (s.size() <= 1 && (NumElements(s) == 1 || s == Shape{channels})) return;
  c.Fail(std::string("input ") + Str(i) + " (" + what + ") must be a scalar or a vector of " + Str(channels) +
         " values (one per output channel), got shape " + ShapeToString(s));
}

// Scale (input 1) and zero point (input 2) of QuantizeLinear / DequantizeLinear against x's shape.
void CheckQuantParams(const InferContext& c, const Shape& x) {
  RequireScale(c, 1, "scale");
  QuantParams p = ResolveQuantParams(c.node, c.opset, x, c.input_shapes[1]);
  const auto one_value = [](const Shape& s) { return s.size() <= 1 && NumElements(s) == 1; };
  if (c.Has(2) && c.input_shapes[2] != c.input_shapes[1] &&
      !(one_value(c.input_shapes[1]) && one_value(c.input_shapes[2])))
    c.Fail("zero point shape " + ShapeToString(c.input_shapes[2]) + " differs from the scale's " +
           ShapeToString(c.input_shapes[1]));
  (void)p;
}

void InferQuantizeLinear(InferContext& c) {
  RequireInput(c, 0, "x");
  const DType xt = c.input_dtypes[0];
  if (xt != DType::kF32 && xt != DType::kF16 && xt != DType::kI32) FailDType(c, 0, "x", "float32, float16 or int32");
  CheckQuantParams(c, c.input_shapes[0]);
  if (xt != DType::kI32 && c.input_dtypes[1] != xt)
    c.Fail("scale has dtype " + std::string(DTypeName(c.input_dtypes[1])) + ", expected " + DTypeName(xt) + " like x");
  DType out = DType::kU8;
  const int64_t output_dtype = c.node.GetInt("output_dtype", 0);
  if (c.Has(2)) {
    if (!IsQuantized(c.input_dtypes[2])) FailDType(c, 2, "zero point", "int8 or uint8");
    out = c.input_dtypes[2];
  }
  if (output_dtype != 0) {
    // ONNX TensorProto codes: 2 = UINT8, 3 = INT8.
    const DType attr = output_dtype == 2 ? DType::kU8 : output_dtype == 3 ? DType::kI8 : DType::kBool;
    if (attr == DType::kBool)
      throw Error(ErrorCode::kUnsupported, c.node.Describe() + ": attribute 'output_dtype' " + Str(output_dtype) +
                                               " is not supported (uint8 = 2 and int8 = 3 are)");
    if (c.Has(2) && attr != out)
      c.Fail("attribute 'output_dtype' (" + std::string(DTypeName(attr)) + ") differs from the zero point's dtype " +
             DTypeName(out));
    out = attr;
  }
  c.SetOutput(0, out, c.input_shapes[0]);
}

void InferDequantizeLinear(InferContext& c) {
  RequireInput(c, 0, "x");
  const DType xt = c.input_dtypes[0];
  if (!IsQuantized(xt) && xt != DType::kI32) FailDType(c, 0, "x", "int8, uint8 or int32");
  CheckQuantParams(c, c.input_shapes[0]);
  RequireZeroPointDType(c, 2, "zero point", xt);
  // ONNX: an int32 input has no zero point other than 0. Checked here when the value is known.
  if (xt == DType::kI32 && c.Has(2) && c.input_values[2] != nullptr) {
    const Tensor& zp = *c.input_values[2];
    for (int64_t i = 0; i < zp.numel(); ++i)
      if (zp.data<int32_t>()[i] != 0) c.Fail("an int32 input needs a zero point of 0");
  }
  c.SetOutput(0, c.input_dtypes[1], c.input_shapes[0]);
}

void InferDynamicQuantizeLinear(InferContext& c) {
  RequireInput(c, 0, "x");
  if (c.input_dtypes[0] != DType::kF32) FailDType(c, 0, "x", "float32");
  c.SetOutput(0, DType::kU8, c.input_shapes[0]);
  c.SetOutput(1, DType::kF32, {});
  c.SetOutput(2, DType::kU8, {});
}

// Output shape of a convolution of x by w with the node's attributes: the Conv schema's rules.
Shape ConvShape(const InferContext& c, int x, int w) {
  InferContext conv{c.node, c.opset};
  conv.present = {true, true};
  conv.input_dtypes = {DType::kF32, DType::kF32};
  conv.input_shapes = {c.input_shapes[x], c.input_shapes[w]};
  conv.input_values = {nullptr, nullptr};
  OpRegistry::Get().Find("Conv")->infer(conv);
  return conv.output_shapes.at(0);
}

Shape MatMulShape(const InferContext& c, int a, int b) {
  InferContext mm{c.node, c.opset};
  mm.present = {true, true};
  mm.input_dtypes = {DType::kF32, DType::kF32};
  mm.input_shapes = {c.input_shapes[a], c.input_shapes[b]};
  mm.input_values = {nullptr, nullptr};
  OpRegistry::Get().Find("MatMul")->infer(mm);
  return mm.output_shapes.at(0);
}

// The quantisation inputs QLinearConv and QLinearMatMul share (a, a_scale, a_zero_point, b, b_scale, b_zero_point,
// y_scale, y_zero_point): per-tensor for a and y, per tensor or per one of `b_channels` for b. Returns y's type.
DType RequireQLinearParams(const InferContext& c, const std::string& a, const std::string& b, int64_t b_channels) {
  const std::string a_scale = a + "_scale", a_zp = a + "_zero_point", b_scale = b + "_scale", b_zp = b + "_zero_point";
  RequireScale(c, 1, a_scale.c_str());
  RequireScale(c, 4, b_scale.c_str());
  RequireScale(c, 6, "y_scale");
  RequirePerTensor(c, 1, a_scale.c_str());
  RequirePerTensor(c, 2, a_zp.c_str());
  RequirePerTensorOrChannel(c, 4, b_scale.c_str(), b_channels);
  RequirePerTensorOrChannel(c, 5, b_zp.c_str(), b_channels);
  RequirePerTensor(c, 6, "y_scale");
  RequirePerTensor(c, 7, "y_zero_point");
  RequireZeroPointDType(c, 2, a_zp.c_str(), c.input_dtypes[0]);
  RequireZeroPointDType(c, 5, b_zp.c_str(), c.input_dtypes[3]);
  if (!c.Has(7)) return c.input_dtypes[0];
  if (!IsQuantized(c.input_dtypes[7])) FailDType(c, 7, "y_zero_point", "int8 or uint8");
  return c.input_dtypes[7];
}

// QLinearConv(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, B?)
void InferQLinearConv(InferContext& c) {
  RequireQuantized(c, 0, "x");
  RequireQuantized(c, 3, "w");
  Shape y = ConvShape(c, 0, 3);
  const int64_t out_channels = c.input_shapes[3][0];
  const DType out = RequireQLinearParams(c, "x", "w", out_channels);
  if (c.Has(8)) {
    if (c.input_dtypes[8] != DType::kI32) FailDType(c, 8, "B", "int32");
    if (c.input_shapes[8] != Shape{out_channels})
      c.Fail("bias B should have shape [" + Str(out_channels) + "], got " + ShapeToString(c.input_shapes[8]));
  }
  c.SetOutput(0, out, y);
}

// The `_dequantize` epilogue a fusion pass gives ConvInteger / MatMulInteger (ops/integer_dequantize.h): an int32
// bias (input 4, optional) and a float32 scale (input 5), each one value or one per channel; the result is float32.
// Without the attribute inputs 4 and 5 must be absent. Returns the output type.
DType CheckDequantizeEpilogue(const InferContext& c, int64_t channels) {
  const bool fused = c.node.GetInt("_dequantize", 0) != 0;
  if (!fused) {
    if (c.Has(kDequantizeBiasInput) || c.Has(kDequantizeScaleInput))
      c.Fail("inputs 4 and 5 (a fused bias and scale) need _dequantize = 1");
    return DType::kI32;
  }
  if (!c.Has(kDequantizeScaleInput)) c.Fail("_dequantize needs a float32 scale as input 5");
  const std::pair<int, DType> parts[] = {{kDequantizeBiasInput, DType::kI32}, {kDequantizeScaleInput, DType::kF32}};
  for (const auto& [i, type] : parts) {
    if (!c.Has(i)) continue;
    const int64_t n = NumElements(c.input_shapes[i]);
    if (c.input_dtypes[i] != type || (n != 1 && n != channels))
      c.Fail(std::string("_dequantize's input ") + Str(i) + " must be " + DTypeName(type) + " with 1 or " +
             Str(channels) + " values (one per channel), got " + DTypeName(c.input_dtypes[i]) + " " +
             ShapeToString(c.input_shapes[i]));
  }
  return DType::kF32;
}

// ConvInteger(x, w, x_zero_point?, w_zero_point?) -> int32
void InferConvInteger(InferContext& c) {
  RequireQuantized(c, 0, "x");
  RequireQuantized(c, 1, "w");
  Shape y = ConvShape(c, 0, 1);
  RequirePerTensor(c, 2, "x_zero_point");
  RequirePerTensorOrChannel(c, 3, "w_zero_point", c.input_shapes[1][0]);
  RequireZeroPointDType(c, 2, "x_zero_point", c.input_dtypes[0]);
  RequireZeroPointDType(c, 3, "w_zero_point", c.input_dtypes[1]);
  c.SetOutput(0, CheckDequantizeEpilogue(c, c.input_shapes[1][0]), y);
}

// Columns of B in a MatMul (1 when B is a vector).
int64_t MatMulColumns(const Shape& b) { return b.size() == 1 ? 1 : b.back(); }

// MatMulInteger(A, B, a_zero_point?, b_zero_point?) -> int32. a_zero_point: per tensor or per row of A
// ([M]); b_zero_point: per tensor or per column of B ([N]).
void InferMatMulInteger(InferContext& c) {
  RequireQuantized(c, 0, "A");
  RequireQuantized(c, 1, "B");
  Shape y = MatMulShape(c, 0, 1);
  const Shape& a = c.input_shapes[0];
  const int64_t rows = a.size() == 1 ? 1 : a[a.size() - 2];
  RequirePerTensorOrChannel(c, 2, "a_zero_point", rows);
  RequirePerTensorOrChannel(c, 3, "b_zero_point", MatMulColumns(c.input_shapes[1]));
  RequireZeroPointDType(c, 2, "a_zero_point", c.input_dtypes[0]);
  RequireZeroPointDType(c, 3, "b_zero_point", c.input_dtypes[1]);
  c.SetOutput(0, CheckDequantizeEpilogue(c, MatMulColumns(c.input_shapes[1])), y);
}

// QLinearMatMul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point)
void InferQLinearMatMul(InferContext& c) {
  RequireQuantized(c, 0, "a");
  RequireQuantized(c, 3, "b");
  Shape y = MatMulShape(c, 0, 3);
  c.SetOutput(0, RequireQLinearParams(c, "a", "b", MatMulColumns(c.input_shapes[3])), y);
}

// ---------------------------------------------------------------- com.microsoft ops ONNX Runtime's quantiser writes

// QLinearAdd(A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale, C_zero_point?): numpy broadcasting.
void InferQLinearAdd(InferContext& c) {
  RequireQuantized(c, 0, "A");
  RequireQuantized(c, 3, "B");
  if (c.input_dtypes[3] != c.input_dtypes[0])
    c.Fail("B has dtype " + std::string(DTypeName(c.input_dtypes[3])) + ", expected " + DTypeName(c.input_dtypes[0]) +
           " like A");
  const char* names[] = {"A", "A_scale", "A_zero_point", "B", "B_scale", "B_zero_point", "C_scale", "C_zero_point"};
  for (int i : {1, 4, 6}) {
    RequireScale(c, i, names[i]);
    RequirePerTensor(c, i, names[i]);
  }
  for (int i : {2, 5, 7}) {
    RequirePerTensor(c, i, names[i]);
    RequireZeroPointDType(c, i, names[i], c.input_dtypes[0]);
  }
  c.SetOutput(0, c.input_dtypes[0], BroadcastShapes(c.input_shapes[0], c.input_shapes[3], c.node));
}

// QLinearGlobalAveragePool(X, x_scale, x_zero_point, y_scale, y_zero_point), attribute channels_last (0 or 1).
void InferQLinearGlobalAveragePool(InferContext& c) {
  RequireQuantized(c, 0, "X");
  const Shape& x = c.input_shapes[0];
  if (x.size() < 3) c.Fail("X must have rank >= 3, got shape " + ShapeToString(x));
  const int64_t channels_last = c.node.GetInt("channels_last", 0);
  if (channels_last != 0 && channels_last != 1)
    c.Fail("attribute 'channels_last' must be 0 or 1, got " + Str(channels_last));
  for (int i : {1, 3}) {
    RequireScale(c, i, i == 1 ? "x_scale" : "y_scale");
    RequirePerTensor(c, i, i == 1 ? "x_scale" : "y_scale");
  }
  for (int i : {2, 4}) {
    RequirePerTensor(c, i, i == 2 ? "x_zero_point" : "y_zero_point");
    RequireZeroPointDType(c, i, i == 2 ? "x_zero_point" : "y_zero_point", c.input_dtypes[0]);
  }
  Shape y(x.size(), 1);
  y[0] = x[0];
  if (channels_last)
    y.back() = x.back();
  else
    y[1] = x[1];
  c.SetOutput(0, c.input_dtypes[0], y);
}

// QGemm(A, a_scale, a_zero_point, B, b_scale, b_zero_point, C?, y_scale?, y_zero_point?), attributes alpha, transA,
// transB. C is int32 (scale alpha * a_scale * b_scale); without y_scale the output is float32.
void InferQGemm(InferContext& c) {
  RequireQuantized(c, 0, "A");
  RequireQuantized(c, 3, "B");
  const Shape& a = c.input_shapes[0];
  const Shape& b = c.input_shapes[3];
  if (a.size() != 2 || b.size() != 2)
    c.Fail("A and B should be 2-D, got " + ShapeToString(a) + " and " + ShapeToString(b));
  const bool trans_a = c.node.GetInt("transA", 0) != 0, trans_b = c.node.GetInt("transB", 0) != 0;
  const int64_t m = trans_a ? a[1] : a[0], k = trans_a ? a[0] : a[1];
  const int64_t kb = trans_b ? b[1] : b[0], n = trans_b ? b[0] : b[1];
  if (k != kb)
    c.Fail("inner dimensions do not match: A " + ShapeToString(a) + (trans_a ? " (transposed)" : "") + " x B " +
           ShapeToString(b) + (trans_b ? " (transposed)" : ""));
  RequireScale(c, 1, "a_scale");
  RequirePerTensor(c, 1, "a_scale");
  RequirePerTensor(c, 2, "a_zero_point");
  RequireZeroPointDType(c, 2, "a_zero_point", c.input_dtypes[0]);
  RequireScale(c, 4, "b_scale");
  RequirePerTensorOrChannel(c, 4, "b_scale", n);
  RequirePerTensorOrChannel(c, 5, "b_zero_point", n);
  RequireZeroPointDType(c, 5, "b_zero_point", c.input_dtypes[3]);
  if (c.Has(6)) {
    if (c.input_dtypes[6] != DType::kI32) FailDType(c, 6, "C", "int32");
    const Shape& cs = c.input_shapes[6];
    if (cs.size() > 2) c.Fail("C should have rank <= 2, got " + ShapeToString(cs));
    if (BroadcastShapes(cs, Shape{m, n}, c.node) != Shape{m, n})
      c.Fail("C " + ShapeToString(cs) + " does not broadcast to the output [" + Str(m) + ", " + Str(n) + "]");
  }
  DType out = DType::kF32;
  if (c.Has(7)) {
    RequireScale(c, 7, "y_scale");
    RequirePerTensor(c, 7, "y_scale");
    RequirePerTensor(c, 8, "y_zero_point");
    out = c.input_dtypes[0];
    if (c.Has(8)) {
      if (!IsQuantized(c.input_dtypes[8])) FailDType(c, 8, "y_zero_point", "int8 or uint8");
      out = c.input_dtypes[8];
    }
  } else if (c.Has(8)) {
    c.Fail("y_zero_point is given without y_scale");
  }
  c.node.GetFloat("alpha", 1.f);
  c.SetOutput(0, out, Shape{m, n});
}

OpSchema Schema(const char* op_type, int min_in, int max_in, int min_out, int max_out, InferFn infer) {
  return OpSchema{op_type, min_in, max_in, min_out, max_out, std::move(infer)};
}

}  // namespace

QuantParams ResolveQuantParams(const Node& node, int opset, const Shape& x, const Shape& scale) {
  auto fail = [&](const std::string& m) { throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": " + m); };
  QuantParams p;
  const int64_t rank = static_cast<int64_t>(x.size());
  const int64_t block_size = node.GetInt("block_size", 0);
  if (block_size < 0) fail("attribute 'block_size' must be >= 0, got " + Str(block_size));
  const bool per_tensor = scale.size() <= 1 && NumElements(scale) == 1 && block_size == 0;
  if (per_tensor) return p;
  if (opset < 13) fail("scale must be a scalar before opset 13, got shape " + ShapeToString(scale));
  if (rank == 0) fail("a scalar x needs a scalar scale, got shape " + ShapeToString(scale));
  p.axis = NormalizeAxis(node.GetInt("axis", 1), rank, node);
  p.axis_dim = x[p.axis];
  for (int64_t d = p.axis + 1; d < rank; ++d) p.inner *= x[d];
  if (block_size == 0) {
    if (scale != Shape{p.axis_dim})
      fail("per-axis scale should have shape [" + Str(p.axis_dim) + "] (x " + ShapeToString(x) + ", axis " +
           Str(p.axis) + "), got " + ShapeToString(scale));
    p.kind = QuantParams::Kind::kPerAxis;
    return p;
  }
  // Blocked (opset 21): scale has x's shape with the axis dim divided by block_size, rounded up.
  Shape expected = x;
  expected[p.axis] = x[p.axis] == 0 ? 0 : (x[p.axis] - 1) / block_size + 1;  // no overflow for a huge block_size
  if (scale != expected)
    fail("blocked scale (block_size " + Str(block_size) + ", axis " + Str(p.axis) + ") should have shape " +
         ShapeToString(expected) + " for x " + ShapeToString(x) + ", got " + ShapeToString(scale));
  p.kind = QuantParams::Kind::kBlocked;
  p.block_size = block_size;
  return p;
}

int64_t QuantParams::Index(int64_t i) const {
  switch (kind) {
    case Kind::kPerTensor:
      return 0;
    case Kind::kPerAxis:
      return (i / inner) % axis_dim;
    case Kind::kBlocked: {
      const int64_t outer = i / (inner * axis_dim), a = (i / inner) % axis_dim, in = i % inner;
      const int64_t blocks = (axis_dim - 1) / block_size + 1;  // axis_dim >= 1: x has element i
      return (outer * blocks + a / block_size) * inner + in;
    }
  }
  return 0;
}

void RegisterQuantizeOps(OpRegistry& r) {
  r.Add(Schema("QuantizeLinear", 2, 3, 1, 1, InferQuantizeLinear));
  r.Add(Schema("DequantizeLinear", 2, 3, 1, 1, InferDequantizeLinear));
  r.Add(Schema("DynamicQuantizeLinear", 1, 1, 3, 3, InferDynamicQuantizeLinear));
  // com.microsoft.DynamicQuantizeLSTM(X, W, R, B?, sequence_lens?, initial_h?, initial_c?, P?, W_scale,
  // W_zero_point, R_scale, R_zero_point) -> (Y?, Y_h?, Y_c?): replaced by an LSTM on dequantized weights before
  // inference (runtime/dynamic_quantize_lstm.cc).
  r.Add(Schema("DynamicQuantizeLSTM", 12, 12, 0, 3, [](InferContext& c) {
    c.Fail("internal: DynamicQuantizeLSTM reached inference without being replaced by an LSTM");
  }));
  r.Add(Schema("QLinearConv", 8, 9, 1, 1, InferQLinearConv));
  r.Add(Schema("ConvInteger", 2, 6, 1, 1, InferConvInteger));  // 4, 5: fused bias and scale (internal)
  r.Add(Schema("QLinearMatMul", 8, 8, 1, 1, InferQLinearMatMul));
  r.Add(Schema("MatMulInteger", 2, 6, 1, 1, InferMatMulInteger));  // 4, 5: fused bias and scale (internal)
  r.Add(Schema("QLinearAdd", 7, 8, 1, 1, InferQLinearAdd));
  r.Add(Schema("QLinearGlobalAveragePool", 5, 5, 1, 1, InferQLinearGlobalAveragePool));
  r.Add(Schema("QGemm", 6, 9, 1, 1, InferQGemm));
}

}  // namespace osprey
