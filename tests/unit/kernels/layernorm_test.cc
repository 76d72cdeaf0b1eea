// LayerNormF32 (src/kernels/cpu/layernorm.cc). Oracle: the reference LayerNormalization kernel (double statistics),
// run on the same node and inputs.
#include "kernel_test_util.h"

namespace osprey::testing {
namespace {

Node LayerNormNode(int num_inputs, int64_t axis = -1, float epsilon = 1e-5f) {
  return MakeNode("LayerNormalization", num_inputs, 1,
                  {{"axis", Attribute::Int(axis)}, {"epsilon", Attribute::Float(epsilon)}});
}

void ExpectLayerNorm(const Shape& x, bool constant_params, float offset = 0.f) {
  SCOPED_TRACE(ShapeToString(x) + (constant_params ? " constant scale/bias" : " run-time scale/bias") + " offset " +
               std::to_string(offset));
  const int64_t width = x.back();
  Tensor input = RandomTensor(x, 1, -1.f + offset, 1.f + offset);
  ExpectFastMatchesReference(LayerNormNode(3), {input, RandomTensor({width}, 2, 0.5f, 1.5f), RandomTensor({width}, 3)},
                             {false, constant_params, constant_params}, "LayerNormF32");
}

TEST(LayerNormF32, OddWidths) {
  for (int64_t width : {13, 768, 1000}) {
    ExpectLayerNorm({3, width}, true);
    ExpectLayerNorm({3, width}, false);
  }
}

TEST(LayerNormF32, HigherRanksAndSingleRow) {
  ExpectLayerNorm({2, 3, 5, 13}, true);
  ExpectLayerNorm({1, 197, 768}, true);
  ExpectLayerNorm({13}, false);
  ExpectLayerNorm({5, 1}, true);  // width 1: every output is the bias
}

TEST(LayerNormF32, MeanFarFromZero) {
  ExpectLayerNorm({3, 768}, true, 500.f);
  ExpectLayerNorm({3, 13}, false, -1000.f);
}

TEST(LayerNormF32, OptionalBiasAndBroadcastParameters) {
  Tensor x = RandomTensor({3, 13}, 4);
  ExpectFastMatchesReference(LayerNormNode(2), {x, RandomTensor({13}, 5)}, {false, true}, "LayerNormF32");
  ExpectFastMatchesReference(LayerNormNode(2), {x, RandomTensor({13}, 5)}, {false, false}, "LayerNormF32");
  // A single-value scale and bias broadcast along the normalised axis.
  for (bool constant : {true, false}) {
    ExpectFastMatchesReference(LayerNormNode(3), {x, Tensor::FromVector<float>({1}, {2.f}), RandomTensor({13}, 6)},
                               {false, constant, constant}, "LayerNormF32");
    ExpectFastMatchesReference(LayerNormNode(3), {x, RandomTensor({13}, 6), Tensor::FromVector<float>({1}, {-.5f})},
                               {false, constant, constant}, "LayerNormF32");
  }
}

TEST(LayerNormF32, AxisGivenAsLastIndex) {
  Tensor x = RandomTensor({3, 5, 13}, 7);
  ExpectFastMatchesReference(LayerNormNode(3, 2, 1e-6f), {x, RandomTensor({13}, 8), RandomTensor({13}, 9)},
                             {false, true, true}, "LayerNormF32");
}

TEST(LayerNormF32, DeclinesOtherForms) {
  Tensor x = RandomTensor({3, 5, 13}, 7);
  // Normalising over the last two axes.
  EXPECT_TRUE(FastKernelDeclines(LayerNormNode(3, -2), {x, RandomTensor({5, 13}, 1), RandomTensor({5, 13}, 2)},
                                 {false, true, true}));
  // Mean / inverse-std outputs requested.
  Node with_stats = MakeNode("LayerNormalization", 3, 3, {{"axis", Attribute::Int(-1)}});
  EXPECT_TRUE(FastKernelDeclines(with_stats, {x, RandomTensor({13}, 1), RandomTensor({13}, 2)}, {false, true, true}));
}

}  // namespace
}  // namespace osprey::testing
