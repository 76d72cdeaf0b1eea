// A MaxPool or AveragePool of a channel Concat, the Concat read by the pool alone, becomes a Concat of the pooled
// parts where the pool shrinks its input (runtime/fusion_patterns.cc PoolConcatParts; SqueezeNet's and GoogLeNet's
// Fire/Inception outputs before a strided MaxPool). Oracle: the same graph compiled without fusion and with reference
// kernels only (whose pools and Concat are checked against ONNX Runtime elsewhere).
#include <gtest/gtest.h>

#include <string>

#include "fusion_test_util.h"
#include "osprey/runtime.h"
#include "test_util.h"

namespace osprey {
namespace {

using testing::RandomTensor;
using testing::ScopedEnv;

struct PoolSpec {
  std::string op = "MaxPool";
  AttributeMap attrs{{"kernel_shape", Attribute::Ints({3, 3})}, {"strides", Attribute::Ints({2, 2})}};
  std::vector<int64_t> parts{24, 40, 13};  // channels of the concatenated maps
  int64_t axis = 1;
  bool escape = false;   // the Concat is a graph output too
  bool indices = false;  // MaxPool's second output (Indices) is asked for
  bool conv = true;      // a 1x1 Conv reads the pool (else the pool is the graph's output)
};

// Convolutions of one input (so channels-last maps), concatenated, pooled, then a 1x1 Conv.
Graph PoolGraph(const PoolSpec& spec, int64_t batch, int64_t size) {
  GraphBuilder b("pool_concat", 13);
  auto x = b.Input("x", DType::kF32, {batch, 16, size, size});
  std::vector<ValueRef> maps;
  int64_t channels = 0;
  int seed = 1;
  for (int64_t c : spec.parts) {
    maps.push_back(b.Op("Relu", {b.Op("Conv",
                                      {x, b.Constant(RandomTensor({c, 16, 3, 3}, seed++, -0.3f, 0.3f)),
                                       b.Constant(RandomTensor({c}, seed++))},
                                      {{"pads", Attribute::Ints({1, 1, 1, 1})}})}));
    channels += c;
  }
  const ValueRef joined = b.Op("Concat", maps, {{"axis", Attribute::Int(spec.axis)}});
  ValueRef pooled;
  if (spec.indices) {
    const std::vector<ValueRef> outs = b.OpMulti(spec.op, {joined}, 2, spec.attrs);
    pooled = outs[0];
    b.Output(outs[1], "indices");
  } else {
    pooled = b.Op(spec.op, {joined}, spec.attrs);
  }
  if (spec.conv && spec.axis == 1)
    pooled = b.Op("Conv", {pooled, b.Constant(RandomTensor({8, channels, 1, 1}, 40, -0.3f, 0.3f))});
  b.Output(pooled, "y");
  if (spec.escape) b.Output(joined, "joined");
  return b.Finish();
}

struct Steps {
  size_t pools = 0, concats = 0;
};

Steps RunAgainstOracle(const PoolSpec& spec, int64_t batch = 2, int64_t size = 40) {
  Steps s;
  for (const OpProfile& p : testing::RunFastAgainstOracle(PoolGraph(spec, batch, size), {batch, 16, size, size})) {
    s.pools += p.op_type == spec.op;
    s.concats += p.op_type == "Concat";
  }
  return s;
}

TEST(PoolConcatParts, StridedPoolsOfAConcatPoolTheParts) {
  const AttributeMap ceil_padded{{"kernel_shape", Attribute::Ints({3, 3})},
                                 {"strides", Attribute::Ints({2, 2})},
                                 {"pads", Attribute::Ints({1, 0, 0, 1})},
                                 {"ceil_mode", Attribute::Int(1)}};
  const AttributeMap two_by_two{{"kernel_shape", Attribute::Ints({2, 2})}, {"strides", Attribute::Ints({2, 2})}};
  AttributeMap averaged_pads = ceil_padded;
  averaged_pads["count_include_pad"] = Attribute::Int(1);
  for (const PoolSpec& spec : {
           PoolSpec{},                                           // SqueezeNet: 3x3 stride 2
           PoolSpec{.attrs = ceil_padded},                       // ceil mode, uneven pads
           PoolSpec{.attrs = two_by_two, .parts = {32, 32}},     // GoogLeNet's last
           PoolSpec{.op = "AveragePool", .attrs = ceil_padded},  // padding left out of the average
           PoolSpec{.op = "AveragePool", .attrs = averaged_pads},
           PoolSpec{.conv = false},  // the pooled Concat is the graph's output
           PoolSpec{.axis = -3},
       }) {
    SCOPED_TRACE(spec.op + ", " + std::to_string(spec.parts.size()) + " parts, axis " + std::to_string(spec.axis));
    const Steps s = RunAgainstOracle(spec);
    EXPECT_EQ(s.pools, spec.parts.size());
    ScopedEnv off("OSPREY_FUSE_POOLS", "0");
    const Steps plain = RunAgainstOracle(spec);
    EXPECT_EQ(plain.pools, 1u);
    EXPECT_EQ(plain.concats, 1u);
  }
}

TEST(PoolConcatParts, StaysWhereThePartsWouldNotPay) {
  const AttributeMap same_size{{"kernel_shape", Attribute::Ints({3, 3})},
                               {"strides", Attribute::Ints({1, 1})},
                               {"pads", Attribute::Ints({1, 1, 1, 1})}};
  // A pool keeping the size (the Concat would copy as much); the Concat read elsewhere too; MaxPool's indices (their
  // values count channels of the whole input); a Concat along the height.
  for (const PoolSpec& spec : {PoolSpec{.attrs = same_size}, PoolSpec{.escape = true}, PoolSpec{.indices = true},
                               PoolSpec{.parts = {24, 24}, .axis = 2}}) {
    SCOPED_TRACE(std::to_string(spec.axis));
    const Steps s = RunAgainstOracle(spec);
    EXPECT_EQ(s.pools, 1u);
    EXPECT_EQ(s.concats, 1u);
  }
}

}  // namespace
}  // namespace osprey
