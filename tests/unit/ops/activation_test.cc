// The fused-activation type (ops/activation.h) and the op traits it goes with (OpTraits, ops/op_registry.h).
#include "ops/activation.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ops/op_registry.h"
#include "test_util.h"

namespace osprey {
namespace {

using testing::MakeNode;

constexpr ActivationKind kAllKinds[] = {
    ActivationKind::kNone,    ActivationKind::kRelu, ActivationKind::kLeakyRelu,   ActivationKind::kClip,
    ActivationKind::kSigmoid, ActivationKind::kTanh, ActivationKind::kHardSigmoid, ActivationKind::kHardSwish,
    ActivationKind::kSilu,    ActivationKind::kGelu, ActivationKind::kGeluTanh};

TEST(Activation, NamesRoundTrip) {
  for (ActivationKind kind : kAllKinds) {
    ActivationKind parsed = ActivationKind::kRelu;
    ASSERT_TRUE(ParseActivationName(ActivationName(kind), &parsed)) << ActivationName(kind);
    EXPECT_EQ(parsed, kind);
  }
  ActivationKind unused;
  EXPECT_FALSE(ParseActivationName("Softplus", &unused));
  EXPECT_STREQ(ActivationName(ActivationKind::kNone), "");
  EXPECT_STREQ(ActivationName(ActivationKind::kSilu), "Silu");
}

// Every op with the fusable_activation trait reads as the activation of its own name, and every activation but
// kNone, kSilu (no ONNX op: Mul(x, Sigmoid(x)) fused) and kGeluTanh (Gelu with approximate = "tanh") is such an op:
// the trait and the type agree.
TEST(Activation, FusableTraitMatchesKinds) {
  const OpRegistry& registry = OpRegistry::Get();
  int fusable = 0;
  for (const std::string& name : registry.Names()) {
    if (!OpRegistry::TraitsOf(name).fusable_activation) continue;
    ++fusable;
    EXPECT_TRUE(OpRegistry::TraitsOf(name).layout_transparent) << name;
    Activation act;
    ASSERT_TRUE(ActivationOfNode(MakeNode(name, 1, 1), 17, {}, &act)) << name;
    EXPECT_EQ(ActivationName(act.kind), name);
  }
  for (ActivationKind kind : kAllKinds) {
    if (kind == ActivationKind::kNone || kind == ActivationKind::kSilu || kind == ActivationKind::kGeluTanh) continue;
    EXPECT_TRUE(OpRegistry::TraitsOf(ActivationName(kind)).fusable_activation) << ActivationName(kind);
  }
  EXPECT_EQ(fusable, 8);
}

TEST(OpTraits, SetWhereRegistered) {
  EXPECT_TRUE(OpRegistry::TraitsOf("Shape").shape_only);
  EXPECT_TRUE(OpRegistry::TraitsOf("Size").shape_only);
  EXPECT_FALSE(OpRegistry::TraitsOf("Reshape").shape_only);
  EXPECT_TRUE(OpRegistry::TraitsOf("Identity").layout_transparent);
  EXPECT_TRUE(OpRegistry::TraitsOf("Exp").layout_transparent);
  EXPECT_FALSE(OpRegistry::TraitsOf("Exp").fusable_activation);
  EXPECT_FALSE(OpRegistry::TraitsOf("Sin").layout_transparent);
  EXPECT_TRUE(OpRegistry::TraitsOf("Add").layout_transparent_broadcast);
  EXPECT_FALSE(OpRegistry::TraitsOf("Add").layout_transparent);
  EXPECT_FALSE(OpRegistry::TraitsOf("Mod").layout_transparent_broadcast);
  const OpTraits& unknown = OpRegistry::TraitsOf("NoSuchOp");
  EXPECT_FALSE(unknown.layout_transparent || unknown.layout_transparent_broadcast || unknown.fusable_activation ||
               unknown.shape_only);
}

TEST(Activation, OfNodeReadsParametersAndDefaults) {
  Activation act;
  ASSERT_TRUE(ActivationOfNode(MakeNode("LeakyRelu", 1, 1), 17, {}, &act));
  EXPECT_EQ(act.kind, ActivationKind::kLeakyRelu);
  EXPECT_EQ(act.alpha, 0.01f);
  ASSERT_TRUE(ActivationOfNode(MakeNode("LeakyRelu", 1, 1, {{"alpha", Attribute::Float(0.3f)}}), 17, {}, &act));
  EXPECT_EQ(act.alpha, 0.3f);
  ASSERT_TRUE(ActivationOfNode(MakeNode("HardSigmoid", 1, 1), 17, {}, &act));
  EXPECT_EQ(act.alpha, 0.2f);
  EXPECT_EQ(act.beta, 0.5f);
  ASSERT_TRUE(ActivationOfNode(MakeNode("Relu", 1, 1), 17, {}, &act));
  EXPECT_EQ(act.alpha, 0.f);
  EXPECT_EQ(act.beta, 0.f);
  ASSERT_TRUE(ActivationOfNode(MakeNode("Gelu", 1, 1, {{"approximate", Attribute::String("tanh")}}), 20, {}, &act));
  EXPECT_EQ(act.kind, ActivationKind::kGeluTanh);
  EXPECT_FALSE(ActivationOfNode(MakeNode("Gelu", 1, 1, {{"approximate", Attribute::String("fast")}}), 20, {}, &act));
  EXPECT_FALSE(ActivationOfNode(MakeNode("GeluTanh", 1, 1), 20, {}, &act));  // a fused kind, not an op
  ASSERT_TRUE(ActivationOfNode(MakeNode("Gelu", 1, 1), 20, {}, &act));
  EXPECT_EQ(act.kind, ActivationKind::kGelu);
  EXPECT_FALSE(ActivationOfNode(MakeNode("Exp", 1, 1), 17, {}, &act));
}

TEST(Activation, OfClipNode) {
  Activation act;
  // Before opset 11: attributes; absent bounds are -inf / inf.
  ASSERT_TRUE(ActivationOfNode(MakeNode("Clip", 1, 1, {{"max", Attribute::Float(6.f)}}), 6, {}, &act));
  EXPECT_EQ(act.kind, ActivationKind::kClip);
  EXPECT_EQ(act.alpha, -INFINITY);
  EXPECT_EQ(act.beta, 6.f);
  // From opset 11: constant inputs; an omitted one is unbounded, a present one must be known.
  const Tensor lo = Tensor::FromVector<float>({}, {0.f}), hi = Tensor::FromVector<float>({}, {6.f});
  ASSERT_TRUE(ActivationOfNode(MakeNode("Clip", 3, 1), 13, {nullptr, &lo, &hi}, &act));
  EXPECT_EQ(act.alpha, 0.f);
  EXPECT_EQ(act.beta, 6.f);
  Node no_min = MakeNode("Clip", 3, 1);
  no_min.inputs[1] = -1;
  ASSERT_TRUE(ActivationOfNode(no_min, 13, {nullptr, nullptr, &hi}, &act));
  EXPECT_EQ(act.alpha, -INFINITY);
  EXPECT_EQ(act.beta, 6.f);
  EXPECT_FALSE(ActivationOfNode(MakeNode("Clip", 3, 1), 13, {nullptr, &lo}, &act));  // max not known
}

TEST(Activation, FusedNodeAttributesRoundTrip) {
  Node conv = MakeNode("Conv", 2, 1);
  Activation none;
  ASSERT_TRUE(Activation::FromFusedNode(conv, &none));
  EXPECT_EQ(none.kind, ActivationKind::kNone);
  Activation{ActivationKind::kHardSigmoid, 1.f / 6.f, 0.5f}.WriteTo(conv);
  EXPECT_EQ(conv.GetString("_activation", ""), "HardSigmoid");
  Activation back;
  ASSERT_TRUE(Activation::FromFusedNode(conv, &back));
  EXPECT_EQ(back.kind, ActivationKind::kHardSigmoid);
  EXPECT_EQ(back.alpha, 1.f / 6.f);
  EXPECT_EQ(back.beta, 0.5f);
  conv.attrs["_activation"] = Attribute::String("Swish");
  EXPECT_FALSE(Activation::FromFusedNode(conv, &back));
}

TEST(Activation, Formulas) {
  const float x = -1.5f;
  EXPECT_EQ((Activation{ActivationKind::kNone}.Apply(x)), x);
  EXPECT_EQ((Activation{ActivationKind::kRelu}.Apply(x)), 0.f);
  EXPECT_EQ((Activation{ActivationKind::kRelu}.Apply(2.f)), 2.f);
  EXPECT_EQ((Activation{ActivationKind::kLeakyRelu, 0.1f}.Apply(x)), x * 0.1f);
  EXPECT_EQ((Activation{ActivationKind::kClip, -1.f, 6.f}.Apply(x)), -1.f);
  EXPECT_EQ((Activation{ActivationKind::kClip, -1.f, 6.f}.Apply(7.f)), 6.f);
  EXPECT_EQ((Activation{ActivationKind::kSigmoid}.Apply(x)), 1.f / (1.f + std::exp(1.5f)));
  EXPECT_EQ((Activation{ActivationKind::kTanh}.Apply(x)), std::tanh(x));
  EXPECT_EQ((Activation{ActivationKind::kHardSigmoid, 0.2f, 0.5f}.Apply(x)), 0.2f * x + 0.5f);
  EXPECT_EQ((Activation{ActivationKind::kHardSwish}.Apply(x)), x * (x / 6.f + 0.5f));
  EXPECT_EQ((Activation{ActivationKind::kSilu}.Apply(x)), x / (1.f + std::exp(1.5f)));
  EXPECT_EQ((Activation{ActivationKind::kGelu}.Apply(x)), 0.5f * x * (1.f + std::erf(x * 0.70710678118654752f)));
  // 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) at x = -1.5, in double: -0.1004284...
  EXPECT_NEAR((Activation{ActivationKind::kGeluTanh}.Apply(x)),
              0.5 * -1.5 * (1 + std::tanh(std::sqrt(2 / M_PI) * (-1.5 + 0.044715 * -3.375))), 1e-6);
  // The in-place form is the scalar one, value for value (NaN and infinities included).
  std::vector<float> values = {-INFINITY, -8.f, -3.f, -0.5f, -0.f, 0.f, 0.25f, 3.f, 9.f, INFINITY, NAN};
  for (ActivationKind kind : kAllKinds) {
    const Activation act{kind, 0.3f, 2.f};
    std::vector<float> data = values;
    act.Apply(data.data(), static_cast<int64_t>(data.size()));
    for (size_t i = 0; i < values.size(); ++i) {
      const float want = act.Apply(values[i]);
      if (std::isnan(want))
        EXPECT_TRUE(std::isnan(data[i])) << ActivationName(kind) << " at " << values[i];
      else
        EXPECT_EQ(data[i], want) << ActivationName(kind) << " at " << values[i];
    }
  }
}

}  // namespace
}  // namespace osprey
