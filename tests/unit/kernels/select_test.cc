// Where and the comparisons (kernels/cpu/select_kernels.cc) against the reference kernels, byte for byte: the
// broadcasts attention masks, audio length masks and detectors use, every operand stride pattern, threaded long and
// short rows, each dtype, and the values comparisons must get right (NaN, -0, infinities, int64 beyond 2^53).
#include <cstring>
#include <limits>

#include "kernel_test_util.h"

namespace osprey::testing {
namespace {

Tensor Mask(const Shape& shape, uint32_t seed) {
  Tensor t(DType::kBool, shape);
  uint32_t s = seed * 2654435761u + 1u;
  for (int64_t i = 0; i < t.numel(); ++i) {
    s ^= s << 13;
    s ^= s >> 17;
    s ^= s << 5;
    t.data<bool>()[i] = (s >> 7) & 1;
  }
  return t;
}

template <class T>
Tensor Ints(const Shape& shape, uint32_t seed, int64_t lo, int64_t hi) {
  Tensor t(std::is_same_v<T, int64_t> ? DType::kI64 : DType::kI32, shape);
  uint32_t s = seed * 2654435761u + 3u;
  for (int64_t i = 0; i < t.numel(); ++i) {
    s ^= s << 13;
    s ^= s >> 17;
    s ^= s << 5;
    t.data<T>()[i] = static_cast<T>(lo + static_cast<int64_t>(s % static_cast<uint32_t>(hi - lo + 1)));
  }
  return t;
}

// The fast kernel built with no constant inputs, run twice, against the reference kernel's bytes.
void ExpectSameAsReference(const Node& node, const std::vector<Tensor>& inputs, const std::string& name) {
  const std::vector<Tensor> expected = RunReferenceNode(node, inputs);
  std::vector<Tensor> outputs;
  KernelBuildContext bc = MakeBuildContext(node, inputs, std::vector<bool>(inputs.size(), false), outputs);
  std::unique_ptr<Kernel> kernel = CreateCpuKernel(bc);
  ASSERT_NE(kernel, nullptr) << "no fast kernel";
  EXPECT_EQ(std::string(kernel->Name()), name);
  for (int run = 0; run < 2; ++run) {
    RunKernel(*kernel, node, inputs, outputs);
    ASSERT_EQ(outputs[0].shape(), expected[0].shape());
    ASSERT_EQ(outputs[0].dtype(), expected[0].dtype());
    EXPECT_EQ(std::memcmp(outputs[0].raw(), expected[0].raw(), expected[0].nbytes()), 0) << "run " << run;
  }
}

struct Case {
  Shape c, x, y;
};

TEST(Select, WhereBroadcastsLikeTheReference) {
  const Case cases[] = {
      {{1, 1, 197, 197}, {1, 12, 197, 197}, {}},  // an attention mask: long rows, threaded in pieces
      {{1, 16000}, {1, 16000}, {}},               // an audio length mask against zero
      {{4, 1}, {4, 3000}, {1, 3000}},             // a per-row condition
      {{2, 3, 5}, {2, 3, 5}, {2, 3, 5}},          // same shapes
      {{}, {2, 3}, {3}},                          // a scalar condition
      {{7}, {}, {}},                              // two scalars
      {{3, 1, 5}, {1, 4, 1}, {3, 4, 5}},          // every operand broadcast somewhere
      {{300, 40}, {40}, {300, 1}},                // short rows, threaded in blocks
      {{0, 5}, {5}, {}},                          // empty
  };
  const Node node = MakeNode("Where", 3, 1);
  for (const Case& k : cases) {
    SCOPED_TRACE(ShapeToString(k.c) + " " + ShapeToString(k.x) + " " + ShapeToString(k.y));
    ExpectSameAsReference(node, {Mask(k.c, 1), RandomTensor(k.x, 2), RandomTensor(k.y, 3)}, "WhereFast");
  }
  // Other element sizes: int64 indices, uint8, float16 (as bits), bool.
  ExpectSameAsReference(node, {Mask({50, 7}, 4), Ints<int64_t>({50, 7}, 5, -9, 9), Ints<int64_t>({7}, 6, 0, 3)},
                        "WhereFast");
  Tensor u8a(DType::kU8, {3, 9}), u8b(DType::kU8, {9}), f16a(DType::kF16, {2, 10}), f16b(DType::kF16, {});
  for (int64_t i = 0; i < u8a.numel(); ++i) u8a.data<uint8_t>()[i] = static_cast<uint8_t>(i * 7);
  for (int64_t i = 0; i < u8b.numel(); ++i) u8b.data<uint8_t>()[i] = static_cast<uint8_t>(200 + i);
  for (int64_t i = 0; i < f16a.numel(); ++i) f16a.data<uint16_t>()[i] = static_cast<uint16_t>(0x3c00 + i);
  f16b.data<uint16_t>()[0] = 0xbc00;
  ExpectSameAsReference(node, {Mask({3, 9}, 7), u8a, u8b}, "WhereFast");
  ExpectSameAsReference(node, {Mask({2, 10}, 8), f16a, f16b}, "WhereFast");
  ExpectSameAsReference(node, {Mask({4, 4}, 9), Mask({4, 4}, 10), Mask({4}, 11)}, "WhereFast");
}

TEST(Select, ComparisonsOfEveryKindAndType) {
  Tensor a = RandomTensor({6, 500}, 12, -3.f, 3.f), b = RandomTensor({500}, 13, -3.f, 3.f);
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(), -0.f, 0.f, std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(), 1.f};
  for (int i = 0; i < 6; ++i) {
    for (int j = 0; j < 6; ++j) a.data<float>()[i * 6 + j] = specials[i], b.data<float>()[i * 6 + j] = specials[j];
  }
  Tensor big = Ints<int64_t>({70000}, 14, -5, 5), lens = Ints<int64_t>({3, 1}, 15, 0, 70000);
  big.data<int64_t>()[0] = (int64_t{1} << 53) + 1;  // equal as doubles to 2^53, not as integers
  lens.data<int64_t>()[0] = int64_t{1} << 53;
  for (const char* op : {"Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Equal"}) {
    SCOPED_TRACE(op);
    const Node node = MakeNode(op, 2, 1);
    const std::string name = std::string(op) + "Fast";
    ExpectSameAsReference(node, {a, b}, name);
    ExpectSameAsReference(node, {b, a}, name);
    ExpectSameAsReference(node, {a, Tensor::Scalar<float>(0.5f)}, name);
    ExpectSameAsReference(node, {Tensor::Scalar<float>(0.5f), a}, name);
    ExpectSameAsReference(node, {big, lens}, name);  // a range against per-item lengths, threaded
    ExpectSameAsReference(node, {Ints<int32_t>({40, 3}, 16, -2, 2), Ints<int32_t>({3}, 17, -2, 2)}, name);
    ExpectSameAsReference(node, {RandomTensor({1, 12, 197, 197}, 18), RandomTensor({1, 1, 1, 197}, 19)}, name);
  }
}

TEST(Select, DeclinedWhereTheReferenceRuns) {
  // Comparisons of bool or uint8 tensors; a Where whose values differ in type (the schema refuses it).
  EXPECT_TRUE(FastKernelDeclines(MakeNode("Equal", 2, 1), {Mask({4}, 20), Mask({4}, 21)}, {false, false}));
  Tensor u8(DType::kU8, {4});
  std::memset(u8.raw(), 3, 4);
  EXPECT_TRUE(FastKernelDeclines(MakeNode("Less", 2, 1), {u8, u8}, {false, false}));
}

}  // namespace
}  // namespace osprey::testing
