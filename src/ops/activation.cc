#include "ops/activation.h"

#include <algorithm>
#include <cmath>

#include "osprey/error.h"
#include "osprey/graph.h"

namespace osprey {
namespace {

struct NamedKind {
  const char* name;
  ActivationKind kind;
};
constexpr NamedKind kNames[] = {
    {"", ActivationKind::kNone},
    {"Relu", ActivationKind::kRelu},
    {"LeakyRelu", ActivationKind::kLeakyRelu},
    {"Clip", ActivationKind::kClip},
    {"Sigmoid", ActivationKind::kSigmoid},
    {"Tanh", ActivationKind::kTanh},
    {"HardSigmoid", ActivationKind::kHardSigmoid},
    {"HardSwish", ActivationKind::kHardSwish},
    {"Silu", ActivationKind::kSilu},
    {"Gelu", ActivationKind::kGelu},
    {"GeluTanh", ActivationKind::kGeluTanh},  // Gelu with approximate = "tanh": no op of that name
};

// Runs `f` on every value of data[0, n): one loop per kind, the kind chosen once.
template <class F>
void ForEach(float* data, int64_t n, F f) {
  for (int64_t i = 0; i < n; ++i) data[i] = f(data[i]);
}

// Calls `visit` with the formula of `a` as a callable float -> float (identity for kNone).
template <class Visit>
void WithFormula(const Activation& a, Visit visit) {
  const float alpha = a.alpha, beta = a.beta;
  switch (a.kind) {
    case ActivationKind::kNone:
      return visit([](float x) { return x; });
    case ActivationKind::kRelu:
      return visit([](float x) { return std::max(x, 0.f); });
    case ActivationKind::kLeakyRelu:
      return visit([alpha](float x) { return x >= 0 ? x : x * alpha; });
    case ActivationKind::kClip:
      return visit([alpha, beta](float x) { return std::min(std::max(x, alpha), beta); });
    case ActivationKind::kSigmoid:
      return visit([](float x) { return 1.f / (1.f + std::exp(-x)); });
    case ActivationKind::kTanh:
      return visit([](float x) { return std::tanh(x); });
    case ActivationKind::kHardSigmoid:
      return visit([alpha, beta](float x) { return std::min(std::max(alpha * x + beta, 0.f), 1.f); });
    case ActivationKind::kHardSwish:
      return visit([](float x) { return x * std::min(std::max(x / 6.f + 0.5f, 0.f), 1.f); });
    case ActivationKind::kSilu:
      return visit([](float x) { return x / (1.f + std::exp(-x)); });
    case ActivationKind::kGelu:
      return visit([](float x) { return 0.5f * x * (1.f + std::erf(x * 0.70710678118654752f)); });
    case ActivationKind::kGeluTanh:
      return visit([](float x) { return 0.5f * x * (1.f + std::tanh(0.7978845608f * (x + 0.044715f * x * x * x))); });
  }
}

}  // namespace

const char* ActivationName(ActivationKind kind) {
  for (const NamedKind& e : kNames)
    if (e.kind == kind) return e.name;
  return "";
}

bool ParseActivationName(const std::string& name, ActivationKind* kind) {
  for (const NamedKind& e : kNames) {
    if (name == e.name) {
      *kind = e.kind;
      return true;
    }
  }
  return false;
}

bool Activation::FromFusedNode(const Node& node, Activation* out) {
  Activation a;
  if (!ParseActivationName(node.GetString("_activation", ""), &a.kind)) return false;
  a.alpha = node.GetFloat("_alpha", 0.f);
  a.beta = node.GetFloat("_beta", 0.f);
  *out = a;
  return true;
}

void Activation::WriteTo(Node& node) const {
  node.attrs["_activation"] = Attribute::String(ActivationName(kind));
  node.attrs["_alpha"] = Attribute::Float(alpha);
  node.attrs["_beta"] = Attribute::Float(beta);
}

float Activation::Apply(float x) const {
  float y = x;
  WithFormula(*this, [&](auto f) { y = f(x); });
  return y;
}

void Activation::Apply(float* data, int64_t n) const {
  if (kind == ActivationKind::kNone) return;
  WithFormula(*this, [&](auto f) { ForEach(data, n, f); });
}

float FakeQuantizeValue(float x, float scale, float lo, float hi) {
  const float r = std::nearbyint(x / scale);
  const float v = r < lo ? lo : r;
  return (hi < v ? hi : v) * scale;
}

bool CarriesFusedSteps(const std::string& op_type) {
  static const char* const kCarriers[] = {"Add",  "Sub",     "Mul",  "Div",   "Relu",        "LeakyRelu",
                                          "Clip", "Sigmoid", "Tanh", "Round", "HardSigmoid", "HardSwish"};
  for (const char* c : kCarriers)
    if (op_type == c) return true;
  return false;
}

std::vector<UnaryStep> FusedSteps(const Node& node) {
  if (!node.Has("_then")) return {};
  auto fail = [&](const std::string& what) {
    throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": fused steps (_then): " + what);
  };
  if (!node.domain.empty() || !CarriesFusedSteps(node.op_type)) fail("op " + node.op_type + " cannot carry them");
  const std::vector<int64_t> codes = node.GetInts("_then");
  const std::vector<float> params = node.GetFloats("_then_params", {});
  if (codes.empty() || codes.size() > UnaryStep::kMaxSteps)
    fail("1 to " + std::to_string(UnaryStep::kMaxSteps) + " steps, got " + std::to_string(codes.size()));
  if (params.size() != 3 * codes.size())
    fail("_then_params needs 3 values per step, got " + std::to_string(params.size()) + " for " +
         std::to_string(codes.size()) + " steps");
  std::vector<UnaryStep> steps(codes.size());
  for (size_t i = 0; i < codes.size(); ++i) {
    UnaryStep& s = steps[i];
    const float* p = params.data() + 3 * i;
    if (codes[i] == UnaryStep::kFakeQuantizeStep) {
      s.fake_quantize = true;
      s.scale = p[0];
      s.lo = p[1];
      s.hi = p[2];
      if (!(s.scale > 0.f) || !std::isfinite(s.scale) || !(s.lo <= s.hi) || !std::isfinite(s.lo) ||
          !std::isfinite(s.hi))
        fail("a fake quantisation needs a finite scale > 0 and finite lo <= hi");
      continue;
    }
    bool known = false;
    for (const NamedKind& e : kNames)
      known = known || (static_cast<int64_t>(e.kind) == codes[i] && e.kind != ActivationKind::kNone);
    if (!known) fail("unknown step code " + std::to_string(codes[i]));
    s.act = Activation{static_cast<ActivationKind>(codes[i]), p[0], p[1]};
  }
  return steps;
}

void WriteFusedSteps(Node& node, const std::vector<UnaryStep>& steps) {
  std::vector<int64_t> codes;
  std::vector<float> params;
  for (const UnaryStep& s : steps) {
    codes.push_back(s.fake_quantize ? UnaryStep::kFakeQuantizeStep : static_cast<int64_t>(s.act.kind));
    if (s.fake_quantize)
      params.insert(params.end(), {s.scale, s.lo, s.hi});
    else
      params.insert(params.end(), {s.act.alpha, s.act.beta, 0.f});
  }
  node.attrs["_then"] = Attribute::Ints(codes);
  node.attrs["_then_params"] = Attribute::Floats(params);
}

void ApplyFusedSteps(const Node& node, float* data, int64_t n) {
  for (const UnaryStep& s : FusedSteps(node))
    for (int64_t i = 0; i < n; ++i) data[i] = s.Apply(data[i]);
}

bool HasFusedPRelu(const Node& node) { return node.GetInt("_prelu", 0) != 0; }

void ApplyPReluPlanes(const float* slopes, int64_t num_slopes, int64_t channels, float* data, int64_t planes,
                      int64_t inner) {
  for (int64_t p = 0; p < planes; ++p) {
    const float slope = slopes[num_slopes == 1 ? 0 : p % channels];
    float* d = data + p * inner;
    for (int64_t i = 0; i < inner; ++i) d[i] = d[i] < 0 ? slope * d[i] : d[i];
  }
}

bool ActivationOfNode(const Node& n, int opset, const std::vector<const Tensor*>& values, Activation* out) {
  Activation a;
  if (!ParseActivationName(n.op_type, &a.kind) || a.kind == ActivationKind::kNone || a.kind == ActivationKind::kSilu ||
      a.kind == ActivationKind::kGeluTanh)
    return false;
  if (a.kind == ActivationKind::kGelu) {
    const std::string approximate = n.GetString("approximate", "none");
    if (approximate == "tanh")
      a.kind = ActivationKind::kGeluTanh;
    else if (approximate != "none")
      return false;
  }
  if (a.kind == ActivationKind::kLeakyRelu) {
    a.alpha = n.GetFloat("alpha", kLeakyReluAlpha);
  } else if (a.kind == ActivationKind::kHardSigmoid) {
    a.alpha = n.GetFloat("alpha", kHardSigmoidAlpha);
    a.beta = n.GetFloat("beta", kHardSigmoidBeta);
  } else if (a.kind == ActivationKind::kClip) {
    a.alpha = -INFINITY;
    a.beta = INFINITY;
    if (opset < 11) {
      a.alpha = n.GetFloat("min", a.alpha);
      a.beta = n.GetFloat("max", a.beta);
    } else {
      for (size_t k = 1; k <= 2; ++k) {
        if (n.inputs.size() <= k || n.inputs[k] < 0) continue;
        const Tensor* v = k < values.size() ? values[k] : nullptr;
        if (v == nullptr || v->dtype() != DType::kF32) return false;
        (k == 1 ? a.alpha : a.beta) = v->data<float>()[0];
      }
    }
  }
  *out = a;
  return true;
}

}  // namespace osprey
