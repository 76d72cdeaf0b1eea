// Schemas of the recurrent ops RNN, GRU and LSTM (ONNX opsets 7..28; `layout` from opset 14). float32 only.
//
// Inputs: X, W, R, B?, sequence_lens?, initial_h?, and for LSTM initial_c?, P?. Outputs (each optional): Y, Y_h, and
// for LSTM Y_c. With G gates per direction (RNN 1, GRU 3, LSTM 4), D directions and hidden size H:
//   X [S, N, I] (layout 0) or [N, S, I] (layout 1); W [D, G*H, I]; R [D, G*H, H]; B [D, 2*G*H];
//   sequence_lens [N] (int32 or int64, each in [0, S]); initial_h / initial_c [D, N, H] or [N, D, H]; P [D, 3*H];
//   Y [S, D, N, H] or [N, S, D, H]; Y_h / Y_c [D, N, H] or [N, D, H].
#include "ops/recurrent.h"

#include <algorithm>
#include <cctype>
#include <string>

#include "ops/activation.h"
#include "ops/op_registry.h"

namespace osprey {
namespace {

std::string Str(int64_t v) { return std::to_string(v); }

[[noreturn]] void Bad(const Node& node, const std::string& message) {
  throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": " + message);
}

struct ActivationInfo {
  const char* name;
  RecurrentActivation::Kind kind;
  bool takes_alpha, takes_beta;
  float default_alpha, default_beta;
};

// Defaults are those of the ONNX ops of the same name (ScaledTanh, which has no op, takes 1 and 1 as ONNX Runtime).
constexpr ActivationInfo kActivations[] = {
    {"relu", RecurrentActivation::Kind::kRelu, false, false, 0.f, 0.f},
    {"tanh", RecurrentActivation::Kind::kTanh, false, false, 0.f, 0.f},
    {"sigmoid", RecurrentActivation::Kind::kSigmoid, false, false, 0.f, 0.f},
    {"affine", RecurrentActivation::Kind::kAffine, true, true, 1.f, 0.f},
    {"leakyrelu", RecurrentActivation::Kind::kLeakyRelu, true, false, kLeakyReluAlpha, 0.f},
    {"thresholdedrelu", RecurrentActivation::Kind::kThresholdedRelu, true, false, 1.f, 0.f},
    {"scaledtanh", RecurrentActivation::Kind::kScaledTanh, true, true, 1.f, 1.f},
    {"hardsigmoid", RecurrentActivation::Kind::kHardSigmoid, true, true, kHardSigmoidAlpha, kHardSigmoidBeta},
    {"elu", RecurrentActivation::Kind::kElu, true, false, 1.f, 0.f},
    {"softsign", RecurrentActivation::Kind::kSoftsign, false, false, 0.f, 0.f},
    {"softplus", RecurrentActivation::Kind::kSoftplus, false, false, 0.f, 0.f},
};

// One recurrent op's gate count, activation count and default activations.
struct RecurrentOp {
  int gates;
  std::vector<std::string> default_activations;
};

RecurrentOp OpInfo(const Node& node) {
  if (node.op_type == "RNN") return {1, {"Tanh"}};
  if (node.op_type == "GRU") return {3, {"Sigmoid", "Tanh"}};
  if (node.op_type == "LSTM") return {4, {"Sigmoid", "Tanh", "Tanh"}};
  throw Error(ErrorCode::kInternal, node.Describe() + " is not a recurrent op");
}

void InferRecurrent(InferContext& ctx) {
  const Node& node = ctx.node;
  const RecurrentSpec spec = ParseRecurrentSpec(node);
  const bool lstm = node.op_type == "LSTM";
  // An LSTM lowered from DynamicQuantizeLSTM may carry its int8 weights (kernels/recurrent_cell.h).
  const bool int8_weights = lstm && node.GetInt("_int8_weights", 0) != 0;
  for (int i = 8; i < 12; ++i) {
    if (!int8_weights && ctx.Has(i))
      ctx.Fail("inputs 8 to 11 (int8 weights and their scales) need _int8_weights = 1 on an LSTM");
    if (int8_weights && !ctx.Has(i))
      ctx.Fail("_int8_weights needs R, R's scales, W and W's scales as inputs 8 to 11; input " + Str(i) +
               " is missing");
  }
  for (int i = 0; i < ctx.num_inputs(); ++i) {
    if (!ctx.Has(i)) continue;
    const bool lengths = i == 4;
    if (i == 8 || i == 10) {
      if (ctx.input_dtypes[i] != DType::kI8)
        ctx.Fail("input " + Str(i) + " (int8 weights) must be int8, got " + std::string(DTypeName(ctx.input_dtypes[i])));
    } else if (lengths) {
      if (ctx.input_dtypes[i] != DType::kI32 && ctx.input_dtypes[i] != DType::kI64)
        ctx.Fail("input 4 (sequence_lens) must be int32 or int64, got " + std::string(DTypeName(ctx.input_dtypes[i])));
    } else if (ctx.input_dtypes[i] != DType::kF32) {
      ctx.Fail("input " + Str(i) + " must be float32 (osprey runs recurrent ops in float32), got " +
               DTypeName(ctx.input_dtypes[i]));
    }
  }
  for (int i = 0; i < 3; ++i)
    if (!ctx.Has(i)) ctx.Fail("input " + Str(i) + " (X, W, R) is required");
  const Shape& x = ctx.input_shapes[0];
  const Shape& w = ctx.input_shapes[1];
  const Shape& r = ctx.input_shapes[2];
  if (x.size() != 3) ctx.Fail("input X must have rank 3, got shape " + ShapeToString(x));
  if (w.size() != 3) ctx.Fail("input W must have rank 3 [directions, gates * hidden, input], got " + ShapeToString(w));
  const int64_t seq = spec.layout == 0 ? x[0] : x[1];
  const int64_t batch = spec.layout == 0 ? x[1] : x[0];
  const int64_t input_size = x[2];
  const int64_t dirs = spec.num_directions;
  if (w[0] != dirs || w[1] % spec.gates != 0 || w[1] == 0 || w[2] != input_size)
    ctx.Fail("input W must have shape [" + Str(dirs) + ", " + Str(spec.gates) + " * hidden_size, " + Str(input_size) +
             "], got " + ShapeToString(w));
  const int64_t hidden = w[1] / spec.gates;
  if (node.Has("hidden_size") && node.GetInt("hidden_size", 0) != hidden)
    ctx.Fail("attribute 'hidden_size' is " + Str(node.GetInt("hidden_size", 0)) + " but W " + ShapeToString(w) +
             " gives " + Str(hidden));
  const int64_t gh = w[1];
  if (r != Shape{dirs, gh, hidden})
    ctx.Fail("input R must have shape " + ShapeToString(Shape{dirs, gh, hidden}) + ", got " + ShapeToString(r));
  if (ctx.Has(3) && ctx.input_shapes[3] != Shape{dirs, 2 * gh})
    ctx.Fail("input B must have shape " + ShapeToString(Shape{dirs, 2 * gh}) + ", got " +
             ShapeToString(ctx.input_shapes[3]));
  if (ctx.Has(4) && ctx.input_shapes[4] != Shape{batch})
    ctx.Fail("input sequence_lens must have shape [" + Str(batch) + "], got " + ShapeToString(ctx.input_shapes[4]));
  const Shape state = spec.layout == 0 ? Shape{dirs, batch, hidden} : Shape{batch, dirs, hidden};
  for (int i : {5, 6}) {
    if (i == 6 && !lstm) continue;
    if (ctx.Has(i) && ctx.input_shapes[i] != state)
      ctx.Fail(std::string("input ") + (i == 5 ? "initial_h" : "initial_c") + " must have shape " +
               ShapeToString(state) + ", got " + ShapeToString(ctx.input_shapes[i]));
  }
  if (lstm && ctx.Has(7) && ctx.input_shapes[7] != Shape{dirs, 3 * hidden})
    ctx.Fail("input P must have shape " + ShapeToString(Shape{dirs, 3 * hidden}) + ", got " +
             ShapeToString(ctx.input_shapes[7]));
  if (int8_weights && (ctx.input_shapes[8] != r || ctx.input_shapes[9] != Shape{dirs, gh} ||
                       ctx.input_shapes[10] != w || ctx.input_shapes[11] != Shape{dirs, gh}))
    ctx.Fail("_int8_weights' inputs 8 to 11 must have shapes " + ShapeToString(r) + ", " +
             ShapeToString(Shape{dirs, gh}) + ", " + ShapeToString(w) + " and " + ShapeToString(Shape{dirs, gh}) +
             ", got " + ShapeToString(ctx.input_shapes[8]) + ", " + ShapeToString(ctx.input_shapes[9]) + ", " +
             ShapeToString(ctx.input_shapes[10]) + " and " + ShapeToString(ctx.input_shapes[11]));
  // The kernel's work space holds X·W^T for every step: [S, N, G * H] per direction; it must pass the size rule too.
  try {
    (void)NumBytes(DType::kF32, Shape{seq, batch, gh, dirs});
  } catch (const Error& e) {
    ctx.Fail(std::string("the input projection of every step, [") + Str(seq) + " * " + Str(batch) + ", " + Str(gh) +
             "] per direction: " + e.what());
  }
  const Shape y = spec.layout == 0 ? Shape{seq, dirs, batch, hidden} : Shape{batch, seq, dirs, hidden};
  const int num_outputs = static_cast<int>(node.outputs.size());
  for (int o = 0; o < num_outputs; ++o) ctx.SetOutput(o, DType::kF32, o == 0 ? y : state);
}

OpSchema Schema(const char* op_type, int max_inputs, int max_outputs) {
  return OpSchema{op_type, 3, max_inputs, 0, max_outputs, InferRecurrent};
}

}  // namespace

RecurrentSpec ParseRecurrentSpec(const Node& node) {
  const RecurrentOp op = OpInfo(node);
  RecurrentSpec spec;
  spec.gates = op.gates;
  spec.activations_per_direction = static_cast<int>(op.default_activations.size());
  const std::string direction = node.GetString("direction", "forward");
  if (direction == "forward" || direction == "reverse") {
    spec.num_directions = 1;
    spec.reverse = direction == "reverse";
  } else if (direction == "bidirectional") {
    spec.num_directions = 2;
  } else {
    Bad(node, "attribute 'direction' must be \"forward\", \"reverse\" or \"bidirectional\", got \"" + direction + "\"");
  }
  spec.layout = node.GetInt("layout", 0);
  if (spec.layout != 0 && spec.layout != 1) Bad(node, "attribute 'layout' must be 0 or 1, got " + Str(spec.layout));
  if (node.Has("clip")) {
    spec.clip = node.GetFloat("clip", 0.f);
    if (!(spec.clip > 0.f)) Bad(node, "attribute 'clip' must be > 0, got " + std::to_string(spec.clip));
  }
  if (node.Has("hidden_size") && node.GetInt("hidden_size", 0) < 1)
    Bad(node, "attribute 'hidden_size' must be >= 1, got " + Str(node.GetInt("hidden_size", 0)));
  if (node.op_type == "GRU") spec.linear_before_reset = node.GetInt("linear_before_reset", 0) != 0;
  if (node.op_type == "LSTM") spec.input_forget = node.GetInt("input_forget", 0) != 0;

  // Activations: one list for all directions (forward first), or one direction's list used for both.
  std::vector<std::string> names = op.default_activations;
  if (node.Has("activations")) {
    const Attribute& a = node.attrs.at("activations");
    if (a.kind != Attribute::Kind::kStrings) Bad(node, "attribute 'activations' must be a list of strings");
    names = a.strings;
  }
  const size_t per_direction = op.default_activations.size();
  const size_t wanted = per_direction * static_cast<size_t>(spec.num_directions);
  if (names.size() == per_direction && spec.num_directions == 2) {
    std::vector<std::string> both = names;
    both.insert(both.end(), names.begin(), names.end());
    names = both;
  }
  if (names.size() != wanted)
    Bad(node, "attribute 'activations' must list " + Str(static_cast<int64_t>(wanted)) + " activations (" +
                  Str(static_cast<int64_t>(per_direction)) + " per direction), got " +
                  Str(static_cast<int64_t>(names.size())));
  const std::vector<float> alphas = node.GetFloats("activation_alpha");
  const std::vector<float> betas = node.GetFloats("activation_beta");
  size_t next_alpha = 0, next_beta = 0;
  for (const std::string& name : names) {
    std::string lower = name;
    std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
    const ActivationInfo* info = nullptr;
    for (const ActivationInfo& candidate : kActivations)
      if (lower == candidate.name) info = &candidate;
    if (!info)
      Bad(node, "activation \"" + name +
                    "\" is not one of Relu, Tanh, Sigmoid, Affine, LeakyRelu, ThresholdedRelu, ScaledTanh, "
                    "HardSigmoid, Elu, Softsign, Softplus");
    RecurrentActivation act;
    act.kind = info->kind;
    act.alpha = info->default_alpha;
    act.beta = info->default_beta;
    // alpha/beta values are consumed in order by the activations that take them (as ONNX Runtime reads them).
    if (info->takes_alpha && next_alpha < alphas.size()) act.alpha = alphas[next_alpha++];
    if (info->takes_beta && next_beta < betas.size()) act.beta = betas[next_beta++];
    spec.activations.push_back(act);
  }
  return spec;
}

void RegisterRecurrentOps(OpRegistry& r) {
  r.Add(Schema("RNN", 6, 2));
  r.Add(Schema("GRU", 6, 2));
  r.Add(Schema("LSTM", 12, 3));  // 8-11: int8 R, its scales, int8 W, its scales (internal, `_int8_weights`)
}

}  // namespace osprey
