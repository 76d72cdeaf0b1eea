// Schemas and reference kernels of RNN, GRU and LSTM. Oracles: values computed by hand from ONNX's equations (one
// hidden unit, so each step is a line of arithmetic), and the rules of the schema (errors name the node and input).
// The full operators are checked against ONNX's backend node tests (tests/conformance) and ONNX Runtime on PyTorch
// exports (tests/e2e/test_recurrent.py).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "test_util.h"

namespace osprey {
namespace {

using testing::ExpectTensorNear;
using testing::MakeNode;
using testing::RunReferenceNode;

Tensor F32(Shape shape, std::vector<float> values) { return Tensor::FromVector<float>(std::move(shape), values); }

float Sigmoid(float x) { return 1.f / (1.f + std::exp(-x)); }

// RNN, one unit, W = 1, R = 0.5, Relu: h_t = relu(x_t + 0.5 h_{t-1}).
AttributeMap ReluRnn(const std::string& direction) {
  return {{"activations", Attribute::Strings({"Relu"})},
          {"direction", Attribute::String(direction)},
          {"hidden_size", Attribute::Int(1)}};
}

TEST(Recurrent, RnnForwardAndReverseByHand) {
  const Tensor x = F32({3, 1, 1}, {1, 2, 3});
  const Tensor w = F32({1, 1, 1}, {1}), r = F32({1, 1, 1}, {0.5f});
  auto fwd = RunReferenceNode(MakeNode("RNN", 3, 2, ReluRnn("forward")), {x, w, r});
  ExpectTensorNear(fwd[0], F32({3, 1, 1, 1}, {1, 2.5f, 4.25f}));
  ExpectTensorNear(fwd[1], F32({1, 1, 1}, {4.25f}));
  auto rev = RunReferenceNode(MakeNode("RNN", 3, 2, ReluRnn("reverse")), {x, w, r});
  ExpectTensorNear(rev[0], F32({3, 1, 1, 1}, {2.75f, 3.5f, 3}));
  ExpectTensorNear(rev[1], F32({1, 1, 1}, {2.75f}));
}

TEST(Recurrent, BidirectionalLayoutOneAndSequenceLengths) {
  // Two items, layout 1 (X [batch, seq, input]); item 1 has length 2, so its step 2 is zeros in Y and the reverse
  // direction starts at its step 1.
  AttributeMap attrs = ReluRnn("bidirectional");
  attrs["layout"] = Attribute::Int(1);
  const Tensor x = F32({2, 3, 1}, {1, 2, 3, 10, 20, 30});
  const Tensor w = F32({2, 1, 1}, {1, 1}), r = F32({2, 1, 1}, {0.5f, 0.5f});
  const Tensor b = F32({2, 2}, {0, 0, 0, 0});
  const Tensor lens = Tensor::FromVector<int32_t>({2}, {3, 2});
  Node node = MakeNode("RNN", 5, 2, attrs);
  auto out = RunReferenceNode(node, {x, w, r, b, lens});
  // Y [batch, seq, dirs, hidden].
  ExpectTensorNear(out[0], F32({2, 3, 2, 1}, {1, 2.75f, 2.5f, 3.5f, 4.25f, 3,  //
                                              10, 20, 25, 20, 0, 0}));
  ExpectTensorNear(out[1], F32({2, 2, 1}, {4.25f, 2.75f, 25, 20}));
}

TEST(Recurrent, GruOneStepByHand) {
  // z = sigmoid(x*wz + h*rz), r = sigmoid(x*wr + h*rr), h~ = tanh(x*wh + (r*h)*rh), h' = (1-z)*h~ + z*h.
  const float x0 = 0.5f, h0 = 0.25f, wz = 0.1f, wr = 0.2f, wh = 0.3f, rz = 0.4f, rr = 0.5f, rh = 0.6f;
  const Tensor x = F32({1, 1, 1}, {x0});
  const Tensor w = F32({1, 3, 1}, {wz, wr, wh}), r = F32({1, 3, 1}, {rz, rr, rh});
  const Tensor h = F32({1, 1, 1}, {h0});
  const float z = Sigmoid(x0 * wz + h0 * rz), reset = Sigmoid(x0 * wr + h0 * rr);
  for (int lbr : {0, 1}) {
    // With linear_before_reset the reset gate scales h*rh instead of h (the same product here, so add a bias).
    const float rbh = 0.7f;
    const Tensor b = F32({1, 6}, {0, 0, 0, 0, 0, rbh});
    const float cand = lbr ? std::tanh(x0 * wh + reset * (h0 * rh + rbh)) : std::tanh(x0 * wh + reset * h0 * rh + rbh);
    Node node = MakeNode("GRU", 6, 2, {{"linear_before_reset", Attribute::Int(lbr)}});
    auto out = RunReferenceNode(node, {x, w, r, b, Tensor(), h});
    ExpectTensorNear(out[1], F32({1, 1, 1}, {(1 - z) * cand + z * h0}));
  }
}

TEST(Recurrent, LstmOneStepWithPeepholesByHand) {
  // Gate order i, o, f, c in W/R/B; peepholes P in order i, o, f.
  const float x0 = 0.5f, h0 = 0.25f, c0 = -0.5f;
  const float wi = 0.1f, wo = 0.2f, wf = 0.3f, wc = 0.4f, ri = -0.1f, ro = -0.2f, rf = -0.3f, rc = -0.4f;
  const float pi = 0.05f, po = 0.06f, pf = 0.07f;
  const Tensor x = F32({1, 1, 1}, {x0});
  const Tensor w = F32({1, 4, 1}, {wi, wo, wf, wc}), r = F32({1, 4, 1}, {ri, ro, rf, rc});
  const Tensor state_h = F32({1, 1, 1}, {h0}), state_c = F32({1, 1, 1}, {c0});
  const Tensor p = F32({1, 3}, {pi, po, pf});
  const float i = Sigmoid(x0 * wi + h0 * ri + pi * c0), f = Sigmoid(x0 * wf + h0 * rf + pf * c0);
  const float c1 = f * c0 + i * std::tanh(x0 * wc + h0 * rc);
  const float o = Sigmoid(x0 * wo + h0 * ro + po * c1);
  Node node = MakeNode("LSTM", 8, 3);
  auto out = RunReferenceNode(node, {x, w, r, Tensor(), Tensor(), state_h, state_c, p});
  ExpectTensorNear(out[0], F32({1, 1, 1, 1}, {o * std::tanh(c1)}));
  ExpectTensorNear(out[1], F32({1, 1, 1}, {o * std::tanh(c1)}));
  ExpectTensorNear(out[2], F32({1, 1, 1}, {c1}));
}

TEST(Recurrent, ActivationAlphasAreConsumedByTheActivationsThatTakeThem) {
  // Affine takes alpha and beta; Relu takes none, so Affine gets the first alpha/beta whichever order they come in.
  AttributeMap attrs = {{"activations", Attribute::Strings({"Affine"})},
                        {"activation_alpha", Attribute::Floats({2.f})},
                        {"activation_beta", Attribute::Floats({1.f})}};
  const Tensor x = F32({1, 1, 1}, {3}), w = F32({1, 1, 1}, {1}), r = F32({1, 1, 1}, {0});
  auto out = RunReferenceNode(MakeNode("RNN", 3, 1, attrs), {x, w, r});
  ExpectTensorNear(out[0], F32({1, 1, 1, 1}, {7}));
}

void ExpectInvalid(const Node& node, const std::vector<Tensor>& inputs, const std::string& needle) {
  try {
    RunReferenceNode(node, inputs);
    FAIL() << "expected an error containing \"" << needle << "\"";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("test_"), std::string::npos) << "names the node: " << e.what();
  }
}

TEST(Recurrent, BadShapesAndAttributesAreErrorsNamingTheNode) {
  const Tensor x = F32({2, 1, 3}, {1, 2, 3, 4, 5, 6});
  const Tensor w = F32({1, 4, 3}, std::vector<float>(12, 0.1f)), r = F32({1, 4, 4}, std::vector<float>(16, 0.1f));
  // W's gate dim is 4 = 1 gate * 4 hidden for RNN, 3 gates does not divide it for GRU.
  ExpectInvalid(MakeNode("GRU", 3, 2), {x, w, r}, "input W must have shape");
  ExpectInvalid(MakeNode("RNN", 3, 2, {{"hidden_size", Attribute::Int(3)}}), {x, w, r}, "hidden_size");
  ExpectInvalid(MakeNode("RNN", 3, 2, {{"direction", Attribute::String("sideways")}}), {x, w, r}, "direction");
  ExpectInvalid(MakeNode("RNN", 3, 2, {{"direction", Attribute::String("bidirectional")}}), {x, w, r},
                "input W must have shape");
  ExpectInvalid(MakeNode("RNN", 3, 2, {{"activations", Attribute::Strings({"Swish"})}}), {x, w, r}, "Swish");
  ExpectInvalid(MakeNode("RNN", 3, 2, {{"activations", Attribute::Strings({"Tanh", "Tanh", "Tanh"})}}), {x, w, r},
                "activations");
  ExpectInvalid(MakeNode("RNN", 3, 2, {{"layout", Attribute::Int(2)}}), {x, w, r}, "layout");
  ExpectInvalid(MakeNode("RNN", 3, 2, {{"clip", Attribute::Float(-1.f)}}), {x, w, r}, "clip");
  ExpectInvalid(MakeNode("RNN", 3, 2), {x, w, F32({1, 4, 3}, std::vector<float>(12, 0.f))}, "input R");
  const Tensor long_lens = Tensor::FromVector<int32_t>({1}, {3});
  ExpectInvalid(MakeNode("RNN", 5, 2), {x, w, r, Tensor(), long_lens}, "sequence_lens[0] is 3");
}

TEST(Recurrent, OutputsPastTheSizeRuleAreRefusedBeforeAnythingIsAllocated) {
  // Shapes only (no values): a sequence of 2^40 steps with 2^10 hidden units would need 2^52 floats for Y.
  Node node = MakeNode("LSTM", 3, 1);
  InferContext ic{node, 17};
  const int64_t seq = int64_t{1} << 40, hidden = 1024;
  ic.present = {true, true, true};
  ic.input_dtypes = {DType::kF32, DType::kF32, DType::kF32};
  ic.input_shapes = {{seq, 1, 1}, {1, 4 * hidden, 1}, {1, 4 * hidden, hidden}};
  ic.input_values = {nullptr, nullptr, nullptr};
  try {
    OpRegistry::Get().Find("LSTM")->infer(ic);
    FAIL() << "expected the size rule to refuse the output";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find("LSTM 'test_LSTM'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace osprey
