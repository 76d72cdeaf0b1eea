// Schemas of the elementwise family: unary math and activations, numpy-broadcasting binary ops, the variadic
// Min/Max/Sum/Mean, comparisons and logic, Where, Clip, Cast and CastLike.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "ops/op_registry.h"
#include "ops/schema_util.h"

namespace osprey {
namespace {

constexpr uint32_t Bit(DType d) { return 1u << static_cast<int>(d); }
constexpr uint32_t kFloat = Bit(DType::kF32);
constexpr uint32_t kInts = Bit(DType::kI32) | Bit(DType::kI64) | Bit(DType::kI8) | Bit(DType::kU8);
constexpr uint32_t kSignedInts = Bit(DType::kI32) | Bit(DType::kI64) | Bit(DType::kI8);
constexpr uint32_t kNumeric = kFloat | kInts;
constexpr uint32_t kBool = Bit(DType::kBool);
constexpr uint32_t kAny = (1u << kNumDTypes) - 1;
constexpr int kUnboundedInputs = std::numeric_limits<int>::max();

std::string AllowedNames(uint32_t allowed) {
  std::string s;
  for (int d = 0; d < kNumDTypes; ++d)
    if (allowed & (1u << d)) s += (s.empty() ? "" : ", ") + std::string(DTypeName(static_cast<DType>(d)));
  return s;
}

void RequireInput(const InferContext& ctx, int i) {
  if (!ctx.Has(i)) ctx.Fail("input " + std::to_string(i) + " is required");
}

// float16/bfloat16 are valid ONNX but not computed by these kernels (kUnsupported); any other dtype outside `allowed`
// is outside the op's ONNX type constraints (kInvalidArgument).
void CheckDType(const InferContext& ctx, int i, uint32_t allowed) {
  RequireInput(ctx, i);
  DType d = ctx.input_dtypes[i];
  if (allowed & Bit(d)) return;
  std::string msg =
      "input " + std::to_string(i) + " has dtype " + DTypeName(d) + "; this op supports " + AllowedNames(allowed);
  if (d == DType::kF16 || d == DType::kBF16)
    throw Error(ErrorCode::kUnsupported, ctx.node.Describe() + ": " + msg + " (cast to float32 first)");
  ctx.Fail(msg);
}

void CheckSameDType(const InferContext& ctx, int i, int j) {
  if (ctx.input_dtypes[i] != ctx.input_dtypes[j])
    ctx.Fail("inputs " + std::to_string(i) + " and " + std::to_string(j) + " must have the same dtype, got " +
             DTypeName(ctx.input_dtypes[i]) + " and " + DTypeName(ctx.input_dtypes[j]));
}

void AddSchema(OpRegistry& r, const char* op_type, int min_inputs, int max_inputs, InferFn infer,
               OpTraits traits = {}) {
  r.Add(op_type, min_inputs, max_inputs, 1, 1, std::move(infer), traits);
}

// Traits (op_registry.h) of the elementwise families.
constexpr OpTraits kTransparent{.layout_transparent = true};
constexpr OpTraits kFusableActivation{.layout_transparent = true, .fusable_activation = true};
constexpr OpTraits kBroadcastTransparent{.layout_transparent_broadcast = true};

// Output has the input's dtype and shape. `check_attrs` reads attributes so a wrong kind fails at compile time.
InferFn UnaryInfer(uint32_t allowed, std::function<void(const InferContext&)> check_attrs = nullptr) {
  return [allowed, check_attrs](InferContext& ctx) {
    CheckDType(ctx, 0, allowed);
    if (check_attrs) check_attrs(ctx);
    ctx.SetOutput(0, ctx.input_dtypes[0], ctx.input_shapes[0]);
  };
}

InferFn PredicateInfer(uint32_t allowed) {
  return [allowed](InferContext& ctx) {
    CheckDType(ctx, 0, allowed);
    ctx.node.GetInt("detect_positive", 1);
    ctx.node.GetInt("detect_negative", 1);
    ctx.SetOutput(0, DType::kBool, ctx.input_shapes[0]);
  };
}

// Two same-dtype inputs broadcast together; output dtype is the input's, or bool for comparisons and logic.
InferFn BinaryInfer(uint32_t allowed, bool bool_output,
                    std::function<void(const InferContext&)> check_attrs = nullptr) {
  return [allowed, bool_output, check_attrs](InferContext& ctx) {
    CheckDType(ctx, 0, allowed);
    CheckDType(ctx, 1, allowed);
    CheckSameDType(ctx, 0, 1);
    if (check_attrs) check_attrs(ctx);
    ctx.SetOutput(0, bool_output ? DType::kBool : ctx.input_dtypes[0],
                  BroadcastShapes(ctx.input_shapes[0], ctx.input_shapes[1], ctx.node));
  };
}

InferFn VariadicInfer(uint32_t allowed) {
  return [allowed](InferContext& ctx) {
    if (ctx.num_inputs() < 1) ctx.Fail("expected at least one input");
    Shape shape = {};
    for (int i = 0; i < ctx.num_inputs(); ++i) {
      CheckDType(ctx, i, allowed);
      CheckSameDType(ctx, 0, i);
      shape = i == 0 ? ctx.input_shapes[0] : BroadcastShapes(shape, ctx.input_shapes[i], ctx.node);
    }
    ctx.SetOutput(0, ctx.input_dtypes[0], shape);
  };
}

void InferPow(InferContext& ctx) {
  CheckDType(ctx, 0, kNumeric);
  CheckDType(ctx, 1, kNumeric);  // the exponent may have another numeric dtype (opset 12+)
  ctx.SetOutput(0, ctx.input_dtypes[0], BroadcastShapes(ctx.input_shapes[0], ctx.input_shapes[1], ctx.node));
}

void InferPRelu(InferContext& ctx) {
  CheckDType(ctx, 0, kFloat | kSignedInts);
  CheckDType(ctx, 1, kFloat | kSignedInts);
  CheckSameDType(ctx, 0, 1);
  // The slope broadcasts to X (unidirectionally): the output keeps X's shape.
  Shape out = BroadcastShapes(ctx.input_shapes[0], ctx.input_shapes[1], ctx.node);
  if (out != ctx.input_shapes[0])
    ctx.Fail("slope of shape " + ShapeToString(ctx.input_shapes[1]) + " does not broadcast to X of shape " +
             ShapeToString(ctx.input_shapes[0]));
  ctx.SetOutput(0, ctx.input_dtypes[0], out);
}

void CheckModAttrs(const InferContext& ctx) {
  int64_t fmod = ctx.node.GetInt("fmod", 0);
  if (fmod != 0 && fmod != 1) ctx.Fail("attribute 'fmod' must be 0 or 1, got " + std::to_string(fmod));
  // Opset 28 defined fmod = 0 for floating point (a floor remainder, the sign of the divisor); before it the spec
  // required fmod = 1 there.
  if (fmod == 0 && ctx.input_dtypes[0] == DType::kF32 && ctx.opset < 28)
    ctx.Fail("attribute 'fmod' must be 1 for floating-point inputs before opset 28, got 0");
}

void CheckBitShiftAttrs(const InferContext& ctx) {
  std::string direction = ctx.node.GetString("direction", "");
  if (direction != "LEFT" && direction != "RIGHT")
    ctx.Fail("attribute 'direction' must be \"LEFT\" or \"RIGHT\", got \"" + direction + "\"");
}

void InferWhere(InferContext& ctx) {
  CheckDType(ctx, 0, kBool);
  CheckDType(ctx, 1, kAny);
  CheckDType(ctx, 2, kAny);
  CheckSameDType(ctx, 1, 2);
  Shape shape = BroadcastShapes(ctx.input_shapes[0], ctx.input_shapes[1], ctx.node);
  ctx.SetOutput(0, ctx.input_dtypes[1], BroadcastShapes(shape, ctx.input_shapes[2], ctx.node));
}

void InferClip(InferContext& ctx) {
  if (ctx.opset < 11) {
    CheckDType(ctx, 0, kFloat);
    if (ctx.Has(1) || ctx.Has(2)) ctx.Fail("min and max are attributes before opset 11, not inputs");
    ctx.node.GetFloat("min", 0.f);
    ctx.node.GetFloat("max", 0.f);
  } else {
    CheckDType(ctx, 0, kNumeric);
    if (ctx.node.Has("min") || ctx.node.Has("max"))
      ctx.Fail("min and max are inputs 1 and 2 from opset 11 on, not attributes");
    for (int i = 1; i <= 2; ++i) {
      if (!ctx.Has(i)) continue;
      CheckSameDType(ctx, 0, i);
      if (NumElements(ctx.input_shapes[i]) != 1)
        ctx.Fail(std::string(i == 1 ? "min" : "max") + " must be a scalar, got shape " +
                 ShapeToString(ctx.input_shapes[i]));
    }
  }
  ctx.SetOutput(0, ctx.input_dtypes[0], ctx.input_shapes[0]);
}


void InferCast(InferContext& ctx) {
  RequireInput(ctx, 0);
  if (!ctx.node.Has("to")) ctx.Fail("attribute 'to' is required");
  ctx.SetOutput(0, schema::DTypeFromOnnxCode(ctx, ctx.node.GetInt("to", 0)), ctx.input_shapes[0]);
}

// BitCast (opset 26): the same bytes read as type `to`, which must be as wide. Not to double (osprey holds float64 as
// float32) and not to bool from another type (a byte other than 0 or 1 is no bool).
void InferBitCast(InferContext& ctx) {
  RequireInput(ctx, 0);
  if (!ctx.node.Has("to")) ctx.Fail("attribute 'to' is required");
  const int64_t to = ctx.node.GetInt("to", 0);
  if (to == 11) throw Error(ErrorCode::kUnsupported, ctx.node.Describe() + ": BitCast to double is not supported");
  const DType in = ctx.input_dtypes[0], out = schema::DTypeFromOnnxCode(ctx, to);
  if (out == DType::kBool && in != DType::kBool)
    throw Error(ErrorCode::kUnsupported, ctx.node.Describe() + ": BitCast to bool from " + DTypeName(in) +
                                             " is not supported (a byte other than 0 or 1 is not a bool)");
  if (DTypeSize(in) != DTypeSize(out))
    ctx.Fail(std::string("BitCast needs types of one width, got ") + DTypeName(in) + " to " + DTypeName(out));
  ctx.SetOutput(0, out, ctx.input_shapes[0]);
}

void InferCastLike(InferContext& ctx) {
  RequireInput(ctx, 0);
  RequireInput(ctx, 1);
  ctx.SetOutput(0, ctx.input_dtypes[1], ctx.input_shapes[0]);
}

void CheckAlphaNonZero(const InferContext& ctx) {
  if (ctx.node.GetFloat("alpha", 1.f) == 0.f) ctx.Fail("attribute 'alpha' must not be 0");
}

void CheckGelu(const InferContext& ctx) {
  std::string approximate = ctx.node.GetString("approximate", "none");
  if (approximate != "none" && approximate != "tanh")
    ctx.Fail("attribute 'approximate' must be \"none\" or \"tanh\", got \"" + approximate + "\"");
}

// A Round carrying a QuantizeLinear -> DequantizeLinear pair (runtime/fusion_qdq.cc), or a model claiming one.
void CheckFakeQuantize(const InferContext& ctx) {
  const bool any = ctx.node.Has("_quant_scale") || ctx.node.Has("_quant_lo") || ctx.node.Has("_quant_hi");
  if (!any) return;
  if (!ctx.node.Has("_quant_scale") || !ctx.node.Has("_quant_lo") || !ctx.node.Has("_quant_hi"))
    ctx.Fail("a fused quantisation needs _quant_scale, _quant_lo and _quant_hi together");
  const float s = ctx.node.GetFloat("_quant_scale", 0.f), lo = ctx.node.GetFloat("_quant_lo", 0.f),
              hi = ctx.node.GetFloat("_quant_hi", 0.f);
  if (!(s > 0.f) || !std::isfinite(s))
    ctx.Fail("_quant_scale must be a finite value > 0, got " + std::to_string(s));
  if (!(lo <= hi) || !std::isfinite(lo) || !std::isfinite(hi))
    ctx.Fail("_quant_lo must be <= _quant_hi, both finite, got " + std::to_string(lo) + " and " + std::to_string(hi));
}

// Shrink: bias and lambd (the kernel reads them again); lambd must not be negative (the two bands would overlap).
void ReadShrink(const InferContext& ctx) {
  ctx.node.GetFloat("bias", 0.f);
  const float lambd = ctx.node.GetFloat("lambd", 0.5f);
  if (!(lambd >= 0.f)) ctx.Fail("attribute 'lambd' must be >= 0, got " + std::to_string(lambd));
}

void ReadAlphaBeta(const InferContext& ctx) {
  ctx.node.GetFloat("alpha", 0.f);
  ctx.node.GetFloat("beta", 0.f);
  ctx.node.GetFloat("gamma", 0.f);
}

}  // namespace

void RegisterElementwiseOps(OpRegistry& r) {
  // Float-only unary math.
  for (const char* op :
       {"Sqrt", "Exp", "Log", "Erf", "Reciprocal", "Floor", "Ceil", "Softplus", "Softsign", "Mish"})
    AddSchema(r, op, 1, 1, UnaryInfer(kFloat), kTransparent);
  AddSchema(r, "Round", 1, 1, UnaryInfer(kFloat, CheckFakeQuantize), kTransparent);
  for (const char* op : {"Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh"})
    AddSchema(r, op, 1, 1, UnaryInfer(kFloat));
  for (const char* op : {"Tanh", "Sigmoid", "HardSwish"})
    AddSchema(r, op, 1, 1, UnaryInfer(kFloat), kFusableActivation);
  for (const char* op : {"Elu", "Selu"}) AddSchema(r, op, 1, 1, UnaryInfer(kFloat, ReadAlphaBeta), kTransparent);
  AddSchema(r, "ThresholdedRelu", 1, 1, UnaryInfer(kFloat, ReadAlphaBeta));
  for (const char* op : {"LeakyRelu", "HardSigmoid"})
    AddSchema(r, op, 1, 1, UnaryInfer(kFloat, ReadAlphaBeta), kFusableActivation);
  AddSchema(r, "Celu", 1, 1, UnaryInfer(kFloat, CheckAlphaNonZero), kTransparent);
  AddSchema(r, "Gelu", 1, 1, UnaryInfer(kFloat, CheckGelu), kFusableActivation);  // kGelu or kGeluTanh
  // Unary ops that are also defined on signed integers.
  for (const char* op : {"Neg", "Abs", "Sign"}) AddSchema(r, op, 1, 1, UnaryInfer(kFloat | kSignedInts), kTransparent);
  AddSchema(r, "Relu", 1, 1, UnaryInfer(kFloat | kSignedInts), kFusableActivation);
  AddSchema(r, "Not", 1, 1, UnaryInfer(kBool));
  AddSchema(r, "IsNaN", 1, 1, PredicateInfer(kFloat));
  AddSchema(r, "IsInf", 1, 1, PredicateInfer(kFloat));

  for (const char* op : {"Add", "Sub", "Mul", "Div"})
    AddSchema(r, op, 2, 2, BinaryInfer(kNumeric, false), kBroadcastTransparent);
  AddSchema(r, "Mod", 2, 2, BinaryInfer(kNumeric, false, CheckModAttrs));
  AddSchema(r, "Pow", 2, 2, InferPow, kBroadcastTransparent);
  AddSchema(r, "PRelu", 2, 2, InferPRelu, kBroadcastTransparent);
  // Signed types from opset 28 (an arithmetic right shift); accepted at every opset, the unsigned results being
  // the same.
  AddSchema(r, "BitShift", 2, 2, BinaryInfer(kInts, false, CheckBitShiftAttrs));
  AddSchema(r, "Equal", 2, 2, BinaryInfer(kNumeric | kBool, true));
  for (const char* op : {"Less", "Greater", "LessOrEqual", "GreaterOrEqual"})
    AddSchema(r, op, 2, 2, BinaryInfer(kNumeric, true));
  for (const char* op : {"And", "Or", "Xor"}) AddSchema(r, op, 2, 2, BinaryInfer(kBool, true));
  for (const char* op : {"BitwiseAnd", "BitwiseOr", "BitwiseXor"}) AddSchema(r, op, 2, 2, BinaryInfer(kInts, false));
  AddSchema(r, "BitwiseNot", 1, 1, UnaryInfer(kInts));
  AddSchema(r, "Shrink", 1, 1, UnaryInfer(kNumeric, ReadShrink));

  AddSchema(r, "Min", 1, kUnboundedInputs, VariadicInfer(kNumeric), kBroadcastTransparent);
  AddSchema(r, "Max", 1, kUnboundedInputs, VariadicInfer(kNumeric), kBroadcastTransparent);
  AddSchema(r, "Sum", 1, kUnboundedInputs, VariadicInfer(kFloat | Bit(DType::kI32) | Bit(DType::kI64)),
            kBroadcastTransparent);
  AddSchema(r, "Mean", 1, kUnboundedInputs, VariadicInfer(kFloat), kBroadcastTransparent);

  AddSchema(r, "Where", 3, 3, InferWhere);
  AddSchema(r, "Clip", 1, 3, InferClip, kFusableActivation);  // min and max: scalars
  AddSchema(r, "Cast", 1, 1, InferCast);
  AddSchema(r, "CastLike", 2, 2, InferCastLike);
  AddSchema(r, "BitCast", 1, 1, InferBitCast);
}

namespace schema {

DType DTypeFromOnnxCode(const InferContext& ctx, int64_t code, const char* attr) {
  switch (code) {
    case 1:
    case 11:  // double: computed as float32 (onnx_tensor.cc DTypeFromOnnx)
      return DType::kF32;
    case 2:
      return DType::kU8;
    case 3:
      return DType::kI8;
    case 6:
      return DType::kI32;
    case 7:
      return DType::kI64;
    case 9:
      return DType::kBool;
    case 10:
      return DType::kF16;
    case 16:
      return DType::kBF16;
    default:
      break;
  }
  static const char* const kNames[] = {"undefined",      "float",    "uint8",        "int8",           "uint16",
                                       "int16",          "int32",    "int64",        "string",         "bool",
                                       "float16",        "double",   "uint32",       "uint64",         "complex64",
                                       "complex128",     "bfloat16", "float8e4m3fn", "float8e4m3fnuz", "float8e5m2",
                                       "float8e5m2fnuz", "uint4",    "int4",         "float4e2m1"};
  constexpr int64_t kNumNames = sizeof(kNames) / sizeof(kNames[0]);
  if (code <= 0 || code >= kNumNames)
    ctx.Fail(std::string("attribute '") + attr + "' = " + std::to_string(code) + " is not an ONNX dtype");
  const std::string what = std::string(attr) == "to" ? "cast to " : std::string(attr) + " ";
  throw Error(ErrorCode::kUnsupported, ctx.node.Describe() + ": " + what + kNames[code] + " (dtype code " +
                                           std::to_string(code) +
                                           ") is not supported; osprey supports float, "
                                           "float16, bfloat16, int8, uint8, int32, int64 and bool");
}

}  // namespace schema
}  // namespace osprey
