// Shape and data-movement ops: schema (shape/dtype inference) plus reference kernel, checked against values computed
// by hand in each test (or by explicit index loops written independently of the kernels).
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "test_util.h"

namespace osprey {
namespace {

using testing::ExpectTensorNear;
using testing::MakeNode;
using testing::RunReferenceNode;

Tensor F32(Shape shape, std::vector<float> v) { return Tensor::FromVector<float>(std::move(shape), v); }
Tensor I64(Shape shape, std::vector<int64_t> v) { return Tensor::FromVector<int64_t>(std::move(shape), v); }
Tensor I32(Shape shape, std::vector<int32_t> v) { return Tensor::FromVector<int32_t>(std::move(shape), v); }
Tensor Ints(std::vector<int64_t> v) {
  Shape s = {static_cast<int64_t>(v.size())};
  return I64(s, v);
}
Tensor Floats(std::vector<float> v) {
  Shape s = {static_cast<int64_t>(v.size())};
  return F32(s, v);
}
Tensor BoolScalar(bool v) {
  Tensor t(DType::kBool, {});
  t.data<bool>()[0] = v;
  return t;
}
// 0, 1, 2, ... as float32.
Tensor Iota(Shape shape) {
  Tensor t(DType::kF32, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = static_cast<float>(i);
  return t;
}

Tensor Run1(const Node& node, const std::vector<Tensor>& inputs, int opset = 17) {
  std::vector<Tensor> outs = RunReferenceNode(node, inputs, opset);
  EXPECT_EQ(outs.size(), 1u);
  return outs.at(0);
}

void ExpectError(const std::function<void()>& fn, ErrorCode code, const std::string& message = "") {
  try {
    fn();
    ADD_FAILURE() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
  }
}

// Shape inference alone, with the listed inputs known only by shape (value null).
InferContext InferOnly(const Node& node, const std::vector<Tensor>& inputs, const std::vector<bool>& known, int opset) {
  InferContext ic{node, opset, {}, {}, {}, {}, {}, {}};
  for (size_t i = 0; i < inputs.size(); ++i) {
    ic.present.push_back(true);
    ic.input_dtypes.push_back(inputs[i].dtype());
    ic.input_shapes.push_back(inputs[i].shape());
    ic.input_values.push_back(known[i] ? &inputs[i] : nullptr);
  }
  OpRegistry::Get().Find(node.op_type)->infer(ic);
  return ic;
}

// ---------------------------------------------------------------------------------------------------------------
TEST(ShapeOpsConcat, Int64ShapeVectors) {
  Node n = MakeNode("Concat", 3, 1, {{"axis", Attribute::Int(0)}});
  Tensor out = Run1(n, {Ints({1, 3}), Ints({-1}), Ints({4, 5, 6})});
  ExpectTensorNear(out, Ints({1, 3, -1, 4, 5, 6}));
}

TEST(ShapeOpsConcat, NegativeAxisWithEmptyInput) {
  Node n = MakeNode("Concat", 3, 1, {{"axis", Attribute::Int(-1)}});
  Tensor a = F32({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor b(DType::kF32, {2, 0});
  Tensor c = F32({2, 1}, {7, 8});
  ExpectTensorNear(Run1(n, {a, b, c}), F32({2, 4}, {1, 2, 3, 7, 4, 5, 6, 8}));
}

TEST(ShapeOpsConcat, MismatchesFail) {
  Node n = MakeNode("Concat", 2, 1, {{"axis", Attribute::Int(0)}});
  ExpectError(
      [&] {
        RunReferenceNode(n, {F32({2, 3}, {1, 2, 3, 4, 5, 6}), Floats({1, 2, 3})});
      },
      ErrorCode::kInvalidArgument);
  ExpectError([&] { RunReferenceNode(n, {F32({1, 3}, {1, 2, 3}), F32({1, 2}, {1, 2})}); }, ErrorCode::kInvalidArgument);
  ExpectError([&] { RunReferenceNode(n, {Floats({1}), Ints({1})}); }, ErrorCode::kInvalidArgument);
  Node no_axis = MakeNode("Concat", 2, 1);
  ExpectError([&] { RunReferenceNode(no_axis, {Floats({1}), Floats({2})}); }, ErrorCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------------------------------------------
TEST(ShapeOpsSplit, Opset11Attribute) {
  Node n = MakeNode("Split", 1, 2, {{"axis", Attribute::Int(1)}, {"split", Attribute::Ints({2, 1})}});
  std::vector<Tensor> outs = RunReferenceNode(n, {F32({2, 3}, {1, 2, 3, 4, 5, 6})}, 11);
  ASSERT_EQ(outs.size(), 2u);
  ExpectTensorNear(outs[0], F32({2, 2}, {1, 2, 4, 5}));
  ExpectTensorNear(outs[1], F32({2, 1}, {3, 6}));
}

TEST(ShapeOpsSplit, Opset13Input) {
  Node n = MakeNode("Split", 2, 2);
  std::vector<Tensor> outs = RunReferenceNode(n, {Ints({1, 2, 3, 4, 5}), Ints({1, 4})}, 13);
  ExpectTensorNear(outs[0], Ints({1}));
  ExpectTensorNear(outs[1], Ints({2, 3, 4, 5}));
}

TEST(ShapeOpsSplit, EqualSplitWithoutSizes) {
  Node n = MakeNode("Split", 1, 3);
  for (int opset : {11, 13, 18}) {
    std::vector<Tensor> outs = RunReferenceNode(n, {Floats({1, 2, 3, 4, 5, 6})}, opset);
    ExpectTensorNear(outs[0], Floats({1, 2}));
    ExpectTensorNear(outs[1], Floats({3, 4}));
    ExpectTensorNear(outs[2], Floats({5, 6}));
  }
}

TEST(ShapeOpsSplit, Opset18NumOutputsUneven) {
  Node n = MakeNode("Split", 1, 3, {{"num_outputs", Attribute::Int(3)}});
  std::vector<Tensor> outs = RunReferenceNode(n, {Floats({1, 2, 3, 4, 5, 6, 7})}, 18);
  ExpectTensorNear(outs[0], Floats({1, 2, 3}));
  ExpectTensorNear(outs[1], Floats({4, 5, 6}));
  ExpectTensorNear(outs[2], Floats({7}));
}

TEST(ShapeOpsSplit, BadSplitsFail) {
  Node n = MakeNode("Split", 2, 2);
  ExpectError([&] { RunReferenceNode(n, {Floats({1, 2, 3}), Ints({1, 1})}, 13); }, ErrorCode::kInvalidArgument);
  Node even = MakeNode("Split", 1, 2);
  ExpectError([&] { RunReferenceNode(even, {Floats({1, 2, 3})}, 13); }, ErrorCode::kInvalidArgument);
  Node both = MakeNode("Split", 2, 2, {{"num_outputs", Attribute::Int(2)}});
  ExpectError([&] { RunReferenceNode(both, {Floats({1, 2, 3}), Ints({1, 2})}, 18); }, ErrorCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------------------------------------------
TEST(ShapeOpsSlice, Opset9Attributes) {
  Node n = MakeNode("Slice", 1, 1, {{"starts", Attribute::Ints({1, 0})}, {"ends", Attribute::Ints({3, -1})}});
  ExpectTensorNear(Run1(n, {Iota({3, 4})}, 9), F32({2, 3}, {4, 5, 6, 8, 9, 10}));
}

TEST(ShapeOpsSlice, NegativeStepsAndClamping) {
  Tensor x = Iota({10});
  Node n5 = MakeNode("Slice", 5, 1);
  auto slice_steps = [&](int64_t start, int64_t end, int64_t step) {
    return Run1(n5, {x, Ints({start}), Ints({end}), Ints({0}), Ints({step})}, 13);
  };
  ExpectTensorNear(slice_steps(-1, -100, -2), Floats({9, 7, 5, 3, 1}));  // end clamps to -1: runs through 0
  ExpectTensorNear(slice_steps(100, -100, -3), Floats({9, 6, 3, 0}));    // start clamps to dim - 1
  ExpectTensorNear(slice_steps(2, 1000, 3), Floats({2, 5, 8}));          // end clamps to dim
  ExpectTensorNear(slice_steps(-100, 3, 1), Floats({0, 1, 2}));          // start clamps to 0
  ExpectTensorNear(slice_steps(INT64_MAX, INT64_MIN, -4), Floats({9, 5, 1}));
  ExpectTensorNear(slice_steps(5, 2, 1), Tensor(DType::kF32, {0}));  // empty
  ExpectTensorNear(slice_steps(2, 5, -1), Tensor(DType::kF32, {0}));
  // Omitted axes (input 3) default to 0..n-1.
  Node n = MakeNode("Slice", 5, 1);
  ExpectTensorNear(Run1(n, {x, Ints({8}), Ints({0}), Tensor(), Ints({-3})}, 13), Floats({8, 5, 2}));
}

TEST(ShapeOpsSlice, NegativeAxesInt32Indices) {
  Node n = MakeNode("Slice", 5, 1);
  Tensor out = Run1(n, {Iota({3, 4}), I32({2}, {10, 0}), I32({2}, {-10, 2}), I32({2}, {-1, 0}), I32({2}, {-1, 2})}, 13);
  ExpectTensorNear(out, F32({1, 4}, {3, 2, 1, 0}));
}

TEST(ShapeOpsSlice, BadArgumentsFail) {
  Node n = MakeNode("Slice", 5, 1);
  Tensor x = Iota({4});
  ExpectError(
      [&] {
        RunReferenceNode(n, {x, Ints({0}), Ints({2}), Ints({0}), Ints({0})}, 13);
      },
      ErrorCode::kInvalidArgument);
  ExpectError(
      [&] {
        RunReferenceNode(n, {x, Ints({0}), Ints({2}), Ints({1}), Ints({1})}, 13);
      },
      ErrorCode::kInvalidArgument);
  ExpectError(
      [&] {
        RunReferenceNode(n, {x, Ints({0, 0}), Ints({2}), Ints({0}), Ints({1})}, 13);
      },
      ErrorCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------------------------------------------
TEST(ShapeOpsGather, NegativeIndicesOnAxis1) {
  Node n = MakeNode("Gather", 2, 1, {{"axis", Attribute::Int(1)}});
  Tensor data = F32({2, 3}, {0, 1, 2, 10, 11, 12});
  Tensor out = Run1(n, {data, I64({2, 2}, {-1, 0, 1, -3})});
  // out[i][j][k] = data[i][indices[j][k]]
  ExpectTensorNear(out, F32({2, 2, 2}, {2, 0, 1, 0, 12, 10, 11, 10}));
}

TEST(ShapeOpsGather, ScalarIndexAndInt32) {
  Node n = MakeNode("Gather", 2, 1);
  ExpectTensorNear(Run1(n, {I64({3, 2}, {1, 2, 3, 4, 5, 6}), Tensor::Scalar<int64_t>(-1)}), Ints({5, 6}));
  ExpectTensorNear(Run1(n, {I64({3, 2}, {1, 2, 3, 4, 5, 6}), I32({2}, {2, 0})}), I64({2, 2}, {5, 6, 1, 2}));
  Tensor empty_indices(DType::kI64, {0});
  ExpectTensorNear(Run1(n, {Iota({3, 2}), empty_indices}), Tensor(DType::kF32, {0, 2}));
}

TEST(ShapeOpsGather, IndexOutOfRangeFails) {
  Node n = MakeNode("Gather", 2, 1, {{"axis", Attribute::Int(1)}});
  Tensor data = Iota({2, 3});
  ExpectError([&] { RunReferenceNode(n, {data, Ints({3})}); }, ErrorCode::kInvalidArgument);
  ExpectError([&] { RunReferenceNode(n, {data, Ints({-4})}); }, ErrorCode::kInvalidArgument);
  ExpectError([&] { RunReferenceNode(n, {data, Floats({0})}); }, ErrorCode::kInvalidArgument);
}

TEST(ShapeOpsGatherElements, Axis1AndAxis0) {
  Node n1 = MakeNode("GatherElements", 2, 1, {{"axis", Attribute::Int(1)}});
  ExpectTensorNear(Run1(n1, {F32({2, 2}, {1, 2, 3, 4}), I64({2, 2}, {0, 0, 1, 0})}), F32({2, 2}, {1, 1, 4, 3}));
  Node n0 = MakeNode("GatherElements", 2, 1, {{"axis", Attribute::Int(0)}});
  Tensor data = F32({3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9});
  ExpectTensorNear(Run1(n0, {data, I64({2, 3}, {1, 2, 0, 2, 0, -3})}), F32({2, 3}, {4, 8, 3, 7, 2, 3}));
  ExpectError([&] { RunReferenceNode(n0, {data, I64({1, 1}, {3})}); }, ErrorCode::kInvalidArgument);
}

// data [2, 2, 3] = 0..11: GatherND picks rows (k = 2) or single elements (k = 3); negative values count from the end.
TEST(ShapeOpsGatherND, RowsElementsAndBatchDims) {
  Node n = MakeNode("GatherND", 2, 1);
  Tensor data = Iota({2, 2, 3});
  ExpectTensorNear(Run1(n, {data, I64({2, 2}, {1, 0, 0, -1})}, 13), F32({2, 3}, {6, 7, 8, 3, 4, 5}));
  ExpectTensorNear(Run1(n, {data, I64({2, 3}, {1, 1, 2, 0, 1, -3})}, 13), F32({2}, {11, 3}));
  ExpectTensorNear(Run1(n, {data, I64({1, 1, 1}, {1})}, 13), F32({1, 1, 2, 3}, {6, 7, 8, 9, 10, 11}));
  // batch_dims 1: each batch b of data is indexed by indices[b]: [0] -> data[0][0], [1] -> data[1][1].
  Node b1 = MakeNode("GatherND", 2, 1, {{"batch_dims", Attribute::Int(1)}});
  ExpectTensorNear(Run1(b1, {data, I64({2, 1}, {0, 1})}, 13), F32({2, 3}, {0, 1, 2, 9, 10, 11}));
  ExpectError([&] { RunReferenceNode(n, {data, I64({1, 2}, {2, 0})}, 13); }, ErrorCode::kInvalidArgument);
  ExpectError([&] { RunReferenceNode(n, {data, I64({1, 4}, {0, 0, 0, 0})}, 13); }, ErrorCode::kInvalidArgument);
  ExpectError([&] { RunReferenceNode(b1, {data, I64({3, 1}, {0, 0, 0})}, 13); }, ErrorCode::kInvalidArgument);
}

TEST(ShapeOpsScatterND, RowsElementsReductionsAndBadIndices) {
  Tensor data = Iota({2, 3});
  Node n = MakeNode("ScatterND", 3, 1);
  ExpectTensorNear(Run1(n, {data, I64({1, 1}, {-1}), F32({1, 3}, {7, 8, 9})}, 13), F32({2, 3}, {0, 1, 2, 7, 8, 9}));
  ExpectTensorNear(Run1(n, {data, I64({2, 2}, {0, 2, 1, 0}), Floats({-1, -2})}, 13), F32({2, 3}, {0, 1, -1, -2, 4, 5}));
  Node add = MakeNode("ScatterND", 3, 1, {{"reduction", Attribute::String("add")}});
  // The same element twice: both updates add up.
  ExpectTensorNear(Run1(add, {data, I64({2, 2}, {1, 1, 1, 1}), Floats({10, 20})}, 16),
                   F32({2, 3}, {0, 1, 2, 3, 34, 5}));
  Node mx = MakeNode("ScatterND", 3, 1, {{"reduction", Attribute::String("max")}});
  ExpectTensorNear(Run1(mx, {data, I64({1, 1}, {0}), F32({1, 3}, {-1, 5, 1})}, 18), F32({2, 3}, {0, 5, 2, 3, 4, 5}));
  ExpectError([&] { RunReferenceNode(n, {data, I64({1, 1}, {2}), F32({1, 3}, {0, 0, 0})}, 13); },
              ErrorCode::kInvalidArgument);
  ExpectError([&] { RunReferenceNode(n, {data, I64({1, 1}, {0}), F32({1, 2}, {0, 0})}, 13); },
              ErrorCode::kInvalidArgument);
  Node bad = MakeNode("ScatterND", 3, 1, {{"reduction", Attribute::String("sub")}});
  ExpectError([&] { RunReferenceNode(bad, {data, I64({1, 1}, {0}), F32({1, 3}, {0, 0, 0})}, 18); },
              ErrorCode::kInvalidArgument);
}

TEST(ShapeOpsScatterElements, AxesNegativeIndicesAndReductions) {
  Tensor data = Iota({2, 3});
  Node n1 = MakeNode("ScatterElements", 3, 1, {{"axis", Attribute::Int(1)}});
  ExpectTensorNear(Run1(n1, {data, I64({2, 1}, {2, -3}), F32({2, 1}, {9, 8})}, 13), F32({2, 3}, {0, 1, 9, 8, 4, 5}));
  Node n0 = MakeNode("ScatterElements", 3, 1);
  ExpectTensorNear(Run1(n0, {data, I64({1, 3}, {1, 0, 1}), F32({1, 3}, {7, 8, 9})}, 13),
                   F32({2, 3}, {0, 8, 2, 7, 4, 9}));
  Node mul = MakeNode("ScatterElements", 3, 1, {{"axis", Attribute::Int(1)}, {"reduction", Attribute::String("mul")}});
  ExpectTensorNear(Run1(mul, {data, I64({1, 2}, {1, 1}), F32({1, 2}, {3, 4})}, 16), F32({2, 3}, {0, 12, 2, 3, 4, 5}));
  ExpectError([&] { RunReferenceNode(n0, {data, I64({1, 1}, {2}), F32({1, 1}, {0})}, 13); },
              ErrorCode::kInvalidArgument);
  ExpectError([&] { RunReferenceNode(n0, {data, I64({1, 4}, {0, 0, 0, 0}), F32({1, 4}, {0, 0, 0, 0})}, 13); },
              ErrorCode::kInvalidArgument);
}

// Trilu on [2, 3, 3] = 0..17 (the ONNX node tests are named triu/tril): upper keeps j - i >= k, lower j - i <= k.
TEST(ShapeOpsTrilu, UpperLowerAndDiagonalOffsets) {
  Tensor x = Iota({2, 3, 3});
  Node upper = MakeNode("Trilu", 1, 1);
  ExpectTensorNear(Run1(upper, {x}, 14), F32({2, 3, 3}, {0, 1, 2, 0, 4, 5, 0, 0, 8, 9, 10, 11, 0, 13, 14, 0, 0, 17}));
  Node upper_k = MakeNode("Trilu", 2, 1);
  ExpectTensorNear(Run1(upper_k, {Iota({2, 3}), Ints({1})}, 14), F32({2, 3}, {0, 1, 2, 0, 0, 5}));
  Node lower = MakeNode("Trilu", 2, 1, {{"upper", Attribute::Int(0)}});
  ExpectTensorNear(Run1(lower, {Iota({2, 3}), Ints({-1})}, 14), F32({2, 3}, {0, 0, 0, 3, 0, 0}));
  ExpectTensorNear(Run1(lower, {Iota({2, 3}), Ints({5})}, 14), Iota({2, 3}));
  ExpectError([&] { RunReferenceNode(upper, {Floats({1, 2})}, 14); }, ErrorCode::kInvalidArgument);
}

// CenterCropPad on [3, 4] = 0..11: crop both axes (the odd extra element leaves at the end), pad both (zeros, the odd
// extra one at the end), one axis only, and sizes that cannot be.
TEST(ShapeOpsCenterCropPad, CropPadOneAxisAndBadSizes) {
  Node n = MakeNode("CenterCropPad", 2, 1);
  Tensor x = Iota({3, 4});
  ExpectTensorNear(Run1(n, {x, Ints({2, 3})}, 18), F32({2, 3}, {0, 1, 2, 4, 5, 6}));
  ExpectTensorNear(Run1(n, {x, Ints({4, 5})}, 18),
                   F32({4, 5}, {0, 1, 2, 3, 0, 4, 5, 6, 7, 0, 8, 9, 10, 11, 0, 0, 0, 0, 0, 0}));
  Node last = MakeNode("CenterCropPad", 2, 1, {{"axes", Attribute::Ints({-1})}});
  ExpectTensorNear(Run1(last, {x, Ints({2})}, 18), F32({3, 2}, {1, 2, 5, 6, 9, 10}));
  ExpectError([&] { RunReferenceNode(n, {x, Ints({2})}, 18); }, ErrorCode::kInvalidArgument, "one size per axis");
  ExpectError([&] { RunReferenceNode(n, {x, Ints({2, -1})}, 18); }, ErrorCode::kInvalidArgument, "negative");
  ExpectError([&] { RunReferenceNode(n, {x, Ints({int64_t{1} << 40, int64_t{1} << 40})}, 18); },
              ErrorCode::kInvalidArgument);
}

// EyeLike on [3, 4] with k = 1 and k = -2; ReverseSequence of [4, 2] (time, batch) with lengths 3 and 1
// (hand-computed), and lengths outside [0, steps]; the windows' known values (Hann periodic of 4: 0, 0.5, 1, 0.5).
TEST(ShapeOpsGenerators, EyeLikeReverseSequenceAndWindows) {
  ExpectTensorNear(Run1(MakeNode("EyeLike", 1, 1, {{"k", Attribute::Int(1)}}), {Iota({3, 4})}, 9),
                   F32({3, 4}, {0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1}));
  ExpectTensorNear(Run1(MakeNode("EyeLike", 1, 1, {{"k", Attribute::Int(-2)}}), {Iota({3, 4})}, 9),
                   F32({3, 4}, {0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0}));
  Node rev = MakeNode("ReverseSequence", 2, 1);
  ExpectTensorNear(Run1(rev, {Iota({4, 2}), Ints({3, 1})}, 10), F32({4, 2}, {4, 1, 2, 3, 0, 5, 6, 7}));
  ExpectError(
      [&] {
        RunReferenceNode(rev, {Iota({4, 2}), Ints({5, 1})}, 10);
      },
      ErrorCode::kInvalidArgument, "outside [0, 4]");
  ExpectError([&] { RunReferenceNode(rev, {Iota({4, 2}), Ints({-1, 1})}, 10); }, ErrorCode::kInvalidArgument);
  ExpectError(
      [&] {
        RunReferenceNode(rev, {Iota({4, 2}), Ints({1, 1, 1})}, 10);
      },
      ErrorCode::kInvalidArgument, "sequence_lens");
  ExpectTensorNear(Run1(MakeNode("HannWindow", 1, 1), {Ints({4})}, 17), F32({4}, {0, 0.5f, 1, 0.5f}), 1e-6f);
  ExpectTensorNear(Run1(MakeNode("BlackmanWindow", 1, 1, {{"periodic", Attribute::Int(0)}}), {Ints({3})}, 17),
                   F32({3}, {0, 1, 0}), 1e-6f);
  ExpectError([&] { RunReferenceNode(MakeNode("HannWindow", 1, 1), {Ints({-3})}, 17); }, ErrorCode::kInvalidArgument);
}

// The data-dependent ops run on host tensors and size their outputs themselves (runtime/segments.h runs them between
// plans): hand-computed results, a scalar NonZero (numpy's reading), Compress with a short condition, without axis and
// with bad ones; their infer refuses them where no cut is made (inside a subgraph).
TEST(ShapeOpsDataDependent, NonZeroAndCompress) {
  Node nz = MakeNode("NonZero", 1, 1);
  const Tensor x = F32({2, 3}, {0, 1, 0, 2, 0, 3});
  const Tensor got = RunDataDependentOp(nz, 13, {&x})[0];
  ExpectTensorNear(got, Tensor::FromVector<int64_t>({2, 3}, {0, 1, 1, 1, 0, 2}));
  const Tensor scalar = F32({}, {5});
  EXPECT_EQ(RunDataDependentOp(nz, 13, {&scalar})[0].shape(), (Shape{1, 1}));
  const Tensor zeros = F32({4}, {0, 0, 0, 0});
  EXPECT_EQ(RunDataDependentOp(nz, 13, {&zeros})[0].shape(), (Shape{1, 0}));
  Node along1 = MakeNode("Compress", 2, 1, {{"axis", Attribute::Int(1)}});
  const Tensor cond = Tensor::FromVector<bool>({2}, {false, true});  // shorter than the axis: the rest dropped
  ExpectTensorNear(RunDataDependentOp(along1, 11, {&x, &cond})[0], F32({2, 1}, {1, 0}));
  Node flat = MakeNode("Compress", 2, 1);
  const Tensor every_other = Tensor::FromVector<bool>({6}, {true, false, true, false, true, false});
  ExpectTensorNear(RunDataDependentOp(flat, 11, {&x, &every_other})[0], F32({3}, {0, 0, 0}));
  const Tensor too_long = Tensor::FromVector<bool>({4}, {true, true, true, true});
  ExpectError([&] { RunDataDependentOp(along1, 11, {&x, &too_long}); }, ErrorCode::kInvalidArgument, "more than axis");
  Node bad_axis = MakeNode("Compress", 2, 1, {{"axis", Attribute::Int(2)}});
  ExpectError([&] { RunDataDependentOp(bad_axis, 11, {&x, &cond}); }, ErrorCode::kInvalidArgument, "out of range");
  ExpectError([&] { RunReferenceNode(nz, {x}, 13); }, ErrorCode::kUnsupported, "top level");
  const Tensor matrix_cond = Tensor::FromVector<bool>({1, 2}, {true, true});
  ExpectError([&] { RunDataDependentOp(along1, 11, {&x, &matrix_cond}); }, ErrorCode::kInvalidArgument, "1-D");
  // NonMaxSuppression: center_point_box must be 0 or 1, boxes float32.
  Node nms = MakeNode("NonMaxSuppression", 2, 1, {{"center_point_box", Attribute::Int(2)}});
  const Tensor boxes = F32({1, 1, 4}, {0, 0, 1, 1}), scores = F32({1, 1, 1}, {0.5f});
  ExpectError([&] { RunDataDependentOp(nms, 11, {&boxes, &scores}); }, ErrorCode::kInvalidArgument, "center_point_box");
  const Tensor int_boxes = Tensor::FromVector<int64_t>({1, 1, 4}, {0, 0, 1, 1});
  ExpectError(
      [&] {
        RunDataDependentOp(MakeNode("NonMaxSuppression", 2, 1), 11, {&int_boxes, &scores});
      },
      ErrorCode::kInvalidArgument, "float32");
}

// Shrink refuses a negative lambd, EyeLike a non-matrix.
TEST(ShapeOpsGenerators, ShrinkAndEyeLikeRefuseBadInputs) {
  ExpectError(
      [&] {
        RunReferenceNode(MakeNode("Shrink", 1, 1, {{"lambd", Attribute::Float(-1.f)}}), {Iota({3})}, 9);
      },
      ErrorCode::kInvalidArgument, "lambd");
  ExpectError(
      [&] {
        RunReferenceNode(MakeNode("EyeLike", 1, 1), {Iota({2, 2, 2})}, 9);
      },
      ErrorCode::kInvalidArgument, "2-D");
}

// ---------------------------------------------------------------------------------------------------------------
TEST(ShapeOpsReshape, ZeroCopiesAndMinusOneInfers) {
  Node n = MakeNode("Reshape", 2, 1);
  Tensor x = Iota({2, 3, 4});
  ExpectTensorNear(Run1(n, {x, Ints({0, -1})}), Iota({2, 12}));
  ExpectTensorNear(Run1(n, {x, Ints({-1, 4})}), Iota({6, 4}));
  ExpectTensorNear(Run1(n, {x, Ints({0, 0, 2, 2})}), Iota({2, 3, 2, 2}));
  ExpectTensorNear(Run1(n, {x, Ints({24})}), Iota({24}));
}

TEST(ShapeOpsReshape, AllowZeroAndEmpty) {
  Node allow = MakeNode("Reshape", 2, 1, {{"allowzero", Attribute::Int(1)}});
  Tensor empty(DType::kF32, {0, 3});
  ExpectTensorNear(Run1(allow, {empty, Ints({3, 0})}, 14), Tensor(DType::kF32, {3, 0}));
  Node n = MakeNode("Reshape", 2, 1);
  // Without allowzero the 0 copies dim 1 (3), giving 9 elements for an empty input.
  ExpectError([&] { RunReferenceNode(n, {empty, Ints({3, 0})}, 14); }, ErrorCode::kInvalidArgument);
  ExpectError([&] { RunReferenceNode(allow, {empty, Ints({0, -1})}, 14); }, ErrorCode::kInvalidArgument);
}

TEST(ShapeOpsReshape, ElementCountMismatchFails) {
  Node n = MakeNode("Reshape", 2, 1);
  Tensor x = Iota({2, 3, 4});
  ExpectError([&] { RunReferenceNode(n, {x, Ints({7, 4})}); }, ErrorCode::kInvalidArgument);
  ExpectError([&] { RunReferenceNode(n, {x, Ints({5, -1})}); }, ErrorCode::kInvalidArgument);
  ExpectError([&] { RunReferenceNode(n, {x, Ints({-1, -1})}); }, ErrorCode::kInvalidArgument);
  ExpectError([&] { RunReferenceNode(n, {x, Ints({0, 0, 0, 0})}); }, ErrorCode::kInvalidArgument);
}

TEST(ShapeOpsReshape, InferenceNeedsOnlyTheShapeValue) {
  Node n = MakeNode("Reshape", 2, 1);
  Tensor x = Iota({2, 3, 4});
  Tensor shape = Ints({-1, 3});
  InferContext ic = InferOnly(n, {x, shape}, {false, true}, 17);
  EXPECT_EQ(ShapeToString(ic.output_shapes[0]), "[8, 3]");
  ExpectError([&] { InferOnly(n, {x, shape}, {true, false}, 17); }, ErrorCode::kUnsupported);
  Node slice = MakeNode("Slice", 3, 1);
  InferContext sc = InferOnly(slice, {x, Ints({1}), Ints({INT64_MAX})}, {false, true, true}, 13);
  EXPECT_EQ(ShapeToString(sc.output_shapes[0]), "[1, 3, 4]");
  Node gather = MakeNode("Gather", 2, 1, {{"axis", Attribute::Int(2)}});
  InferContext gc = InferOnly(gather, {x, I64({5, 1}, {0, 1, 2, 3, 0})}, {false, false}, 13);
  EXPECT_EQ(ShapeToString(gc.output_shapes[0]), "[2, 3, 5, 1]");
}

TEST(ShapeOpsFlatten, Axes) {
  Tensor x = Iota({2, 3, 4});
  ExpectTensorNear(Run1(MakeNode("Flatten", 1, 1, {{"axis", Attribute::Int(2)}}), {x}), Iota({6, 4}));
  ExpectTensorNear(Run1(MakeNode("Flatten", 1, 1, {{"axis", Attribute::Int(0)}}), {x}), Iota({1, 24}));
  ExpectTensorNear(Run1(MakeNode("Flatten", 1, 1, {{"axis", Attribute::Int(-1)}}), {x}), Iota({6, 4}));
  ExpectTensorNear(Run1(MakeNode("Flatten", 1, 1), {x}), Iota({2, 12}));
  ExpectError(
      [&] {
        RunReferenceNode(MakeNode("Flatten", 1, 1, {{"axis", Attribute::Int(4)}}), {x});
      },
      ErrorCode::kInvalidArgument);
}

TEST(ShapeOpsSqueeze, Opset11VersusOpset13) {
  Tensor x = Iota({1, 3, 1});
  ExpectTensorNear(Run1(MakeNode("Squeeze", 1, 1, {{"axes", Attribute::Ints({0})}}), {x}, 11), Iota({3, 1}));
  ExpectTensorNear(Run1(MakeNode("Squeeze", 2, 1), {x, Ints({-1})}, 13), Iota({1, 3}));
  ExpectTensorNear(Run1(MakeNode("Squeeze", 1, 1), {x}, 13), Iota({3}));
  ExpectTensorNear(Run1(MakeNode("Squeeze", 2, 1), {x, Tensor(DType::kI64, {0})}, 13), Iota({3}));
  ExpectError([&] { RunReferenceNode(MakeNode("Squeeze", 2, 1), {x, Ints({1})}, 13); }, ErrorCode::kInvalidArgument);
}

TEST(ShapeOpsUnsqueeze, Opset11VersusOpset13) {
  Tensor x = Iota({2, 3});
  ExpectTensorNear(Run1(MakeNode("Unsqueeze", 1, 1, {{"axes", Attribute::Ints({0, 3})}}), {x}, 11), Iota({1, 2, 3, 1}));
  ExpectTensorNear(Run1(MakeNode("Unsqueeze", 2, 1), {x, Ints({-1, 0})}, 13), Iota({1, 2, 3, 1}));
  ExpectTensorNear(Run1(MakeNode("Unsqueeze", 2, 1), {Tensor::Scalar<float>(5), Ints({0})}, 13), Floats({5}));
  // Opset 13 moved axes from the attribute to input 1.
  ExpectError(
      [&] {
        RunReferenceNode(MakeNode("Unsqueeze", 1, 1, {{"axes", Attribute::Ints({0})}}), {x}, 13);
      },
      ErrorCode::kInvalidArgument);
  ExpectError([&] { RunReferenceNode(MakeNode("Unsqueeze", 2, 1), {x, Ints({0})}, 11); }, ErrorCode::kInvalidArgument);
  ExpectError(
      [&] {
        RunReferenceNode(MakeNode("Unsqueeze", 2, 1), {x, Ints({1, -3})}, 13);
      },
      ErrorCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------------------------------------------
TEST(ShapeOpsTranspose, DefaultReversesAnyDType) {
  Tensor x = Tensor::FromVector<int8_t>({2, 3}, {1, 2, 3, 4, 5, 6});
  ExpectTensorNear(Run1(MakeNode("Transpose", 1, 1), {x}), Tensor::FromVector<int8_t>({3, 2}, {1, 4, 2, 5, 3, 6}));
}

TEST(ShapeOpsTranspose, PermOddShape) {
  Tensor x = Iota({3, 5, 13});
  Tensor out = Run1(MakeNode("Transpose", 1, 1, {{"perm", Attribute::Ints({1, 2, 0})}}), {x});
  Tensor expected(DType::kF32, {5, 13, 3});
  for (int64_t a = 0; a < 3; ++a)
    for (int64_t b = 0; b < 5; ++b)
      for (int64_t c = 0; c < 13; ++c)
        expected.data<float>()[(b * 13 + c) * 3 + a] = static_cast<float>((a * 5 + b) * 13 + c);
  ExpectTensorNear(out, expected);
  ExpectTensorNear(Run1(MakeNode("Transpose", 1, 1), {Tensor(DType::kF32, {0, 3})}), Tensor(DType::kF32, {3, 0}));
  ExpectError(
      [&] {
        RunReferenceNode(MakeNode("Transpose", 1, 1, {{"perm", Attribute::Ints({0, 0, 1})}}), {x});
      },
      ErrorCode::kInvalidArgument);
}

TEST(ShapeOpsExpand, Bidirectional) {
  Tensor x = F32({3, 1}, {1, 2, 3});
  Tensor out = Run1(MakeNode("Expand", 2, 1), {x, Ints({2, 1, 4})});
  Tensor expected(DType::kF32, {2, 3, 4});
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 3; ++j)
      for (int64_t k = 0; k < 4; ++k) expected.data<float>()[(i * 3 + j) * 4 + k] = static_cast<float>(j + 1);
  ExpectTensorNear(out, expected);
  // Shape smaller than the input: the input's dims win.
  ExpectTensorNear(Run1(MakeNode("Expand", 2, 1), {x, Ints({1})}), x);
  ExpectTensorNear(Run1(MakeNode("Expand", 2, 1), {x, Ints({0, 1, 1})}), Tensor(DType::kF32, {0, 3, 1}));
  ExpectError([&] { RunReferenceNode(MakeNode("Expand", 2, 1), {x, Ints({2, 2})}); }, ErrorCode::kInvalidArgument);
}

TEST(ShapeOpsTile, Repeats) {
  Tensor x = I32({2, 2}, {1, 2, 3, 4});
  Tensor out = Run1(MakeNode("Tile", 2, 1), {x, Ints({2, 3})});
  std::vector<int32_t> expected;
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 6; ++j) expected.push_back(x.data<int32_t>()[(i % 2) * 2 + j % 2]);
  ExpectTensorNear(out, I32({4, 6}, expected));
  ExpectTensorNear(Run1(MakeNode("Tile", 2, 1), {x, Ints({0, 1})}), Tensor(DType::kI32, {0, 2}));
  ExpectError([&] { RunReferenceNode(MakeNode("Tile", 2, 1), {x, Ints({2})}); }, ErrorCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------------------------------------------
TEST(ShapeOpsPad, ConstantWithValue) {
  Node n = MakeNode("Pad", 3, 1);
  Tensor out = Run1(n, {F32({2, 2}, {1, 2, 3, 4}), Ints({1, 0, 0, 2}), Tensor::Scalar<float>(9)}, 13);
  ExpectTensorNear(out, F32({3, 4}, {9, 9, 9, 9, 1, 2, 9, 9, 3, 4, 9, 9}));
  // int64 data moves as bytes; the default constant is 0.
  Tensor ints = Run1(MakeNode("Pad", 2, 1), {Ints({5, 6}), Ints({1, 1})}, 13);
  ExpectTensorNear(ints, Ints({0, 5, 6, 0}));
}

TEST(ShapeOpsPad, ReflectAndEdge) {
  // ONNX's documented examples.
  Tensor x = F32({3, 2}, {1.0f, 1.2f, 2.3f, 3.4f, 4.5f, 5.7f});
  Tensor reflect = Run1(MakeNode("Pad", 2, 1, {{"mode", Attribute::String("reflect")}}), {x, Ints({0, 2, 0, 0})}, 13);
  ExpectTensorNear(reflect, F32({3, 4}, {1.0f, 1.2f, 1.0f, 1.2f, 2.3f, 3.4f, 2.3f, 3.4f, 4.5f, 5.7f, 4.5f, 5.7f}));
  Tensor edge = Run1(MakeNode("Pad", 2, 1, {{"mode", Attribute::String("edge")}}), {x, Ints({0, 2, 0, 0})}, 13);
  ExpectTensorNear(edge, F32({3, 4}, {1.0f, 1.0f, 1.0f, 1.2f, 2.3f, 2.3f, 2.3f, 3.4f, 4.5f, 4.5f, 4.5f, 5.7f}));
  Tensor row = F32({1, 3}, {1, 2, 3});
  auto pad = [&](const char* mode, std::vector<int64_t> pads) {
    return Run1(MakeNode("Pad", 2, 1, {{"mode", Attribute::String(mode)}}), {row, Ints(pads)}, 19);
  };
  ExpectTensorNear(pad("reflect", {0, 2, 0, 2}), F32({1, 7}, {3, 2, 1, 2, 3, 2, 1}));
  ExpectTensorNear(pad("edge", {0, 2, 0, 2}), F32({1, 7}, {1, 1, 1, 2, 3, 3, 3}));
  ExpectTensorNear(pad("wrap", {0, 2, 0, 2}), F32({1, 7}, {2, 3, 1, 2, 3, 1, 2}));
  // Pads beyond the axis reflect again, as numpy does.
  ExpectTensorNear(pad("reflect", {0, 4, 0, 0}), F32({1, 7}, {1, 2, 3, 2, 1, 2, 3}));
}

TEST(ShapeOpsPad, NegativePadsCrop) {
  Tensor x = F32({1, 5}, {1, 2, 3, 4, 5});
  ExpectTensorNear(Run1(MakeNode("Pad", 2, 1), {x, Ints({0, -1, 0, 2})}, 13), F32({1, 6}, {2, 3, 4, 5, 0, 0}));
  // Crop first, then reflect within what is left: [1, 2, 3] padded by one on the left.
  Node reflect = MakeNode("Pad", 2, 1, {{"mode", Attribute::String("reflect")}});
  ExpectTensorNear(Run1(reflect, {x, Ints({0, 1, 0, -2})}, 13), F32({1, 4}, {2, 1, 2, 3}));
  ExpectError(
      [&] {
        RunReferenceNode(MakeNode("Pad", 2, 1), {x, Ints({0, -3, 0, -3})}, 13);
      },
      ErrorCode::kInvalidArgument);
  // Pads near the int64 limits: refused by name before any sum could overflow (UBSan checks the arithmetic).
  const int64_t big = std::numeric_limits<int64_t>::max(), small = std::numeric_limits<int64_t>::min();
  for (const std::vector<int64_t>& pads : std::vector<std::vector<int64_t>>{{0, 0, 0, big}, {0, small + 1, 0, -5},
                                                                           {0, big, 0, big}})
    ExpectError([&] { RunReferenceNode(MakeNode("Pad", 2, 1), {x, Ints(pads)}, 13); }, ErrorCode::kInvalidArgument,
                "exceed +/-2^48");
}

TEST(ShapeOpsPad, Opset2AttributesAndOpset18Axes) {
  Node old = MakeNode("Pad", 1, 1, {{"pads", Attribute::Ints({1, 1})}, {"value", Attribute::Float(7)}});
  ExpectTensorNear(Run1(old, {Floats({1, 2})}, 2), Floats({7, 1, 2, 7}));
  Tensor out = Run1(MakeNode("Pad", 4, 1), {Iota({2, 2}), Ints({1, 1}), Tensor(), Ints({-1})}, 18);
  ExpectTensorNear(out, F32({2, 4}, {0, 0, 1, 0, 0, 2, 3, 0}));
  Tensor empty = Run1(MakeNode("Pad", 2, 1), {Tensor(DType::kF32, {0, 2}), Ints({1, 0, 1, 0})}, 13);
  ExpectTensorNear(empty, F32({2, 2}, {0, 0, 0, 0}));
  ExpectError(
      [&] {
        RunReferenceNode(MakeNode("Pad", 2, 1, {{"mode", Attribute::String("edge")}}),
                         {Tensor(DType::kF32, {0, 2}), Ints({1, 0, 1, 0})}, 13);
      },
      ErrorCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------------------------------------------
// The tiny case: 1x1x2x2 [[1, 2], [3, 4]] -> 1x1x4x4. Input value = 1 + col + 2 * row is affine, and every mode's
// weights sum to 1, so output[i][j] = 1 + u[j] + 2 * u[i] where u[k] is the interpolated input coordinate (the
// 1-D weights applied to [0, 1]). u is computed by hand below for each mode from ONNX's reference formulas.
Tensor Tiny() { return F32({1, 1, 2, 2}, {1, 2, 3, 4}); }

Tensor FromU(const std::vector<double>& u) {
  Tensor t(DType::kF32, {1, 1, 4, 4});
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) t.data<float>()[i * 4 + j] = static_cast<float>(1 + u[j] + 2 * u[i]);
  return t;
}

Tensor ResizeTiny(AttributeMap attrs) {
  Node n = MakeNode("Resize", 3, 1, std::move(attrs));
  return Run1(n, {Tiny(), Tensor(), Floats({1, 1, 2, 2})}, 13);
}

TEST(ShapeOpsResize, NearestHalfPixel) {
  // x_original = (x + 0.5) / 2 - 0.5 = -0.25, 0.25, 0.75, 1.25 -> round_prefer_floor -> 0, 0, 1, 1.
  ExpectTensorNear(ResizeTiny({}), F32({1, 1, 4, 4}, {1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4}));
  // The same through sizes (opset 11: roi and an empty scales are given).
  Node n = MakeNode("Resize", 4, 1);
  Tensor out = Run1(n, {Tiny(), Tensor(DType::kF32, {0}), Tensor(DType::kF32, {0}), Ints({1, 1, 4, 4})}, 11);
  ExpectTensorNear(out, F32({1, 1, 4, 4}, {1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4}));
}

TEST(ShapeOpsResize, LinearHalfPixel) {
  // x_original -0.25 and 1.25 clamp to the edges; 0.25 -> 0.75*a + 0.25*b; 0.75 -> 0.25*a + 0.75*b.
  ExpectTensorNear(ResizeTiny({{"mode", Attribute::String("linear")}}), FromU({0, 0.25, 0.75, 1}));
}

TEST(ShapeOpsResize, LinearAlignCorners) {
  // x_original = x * (2 - 1) / (4 - 1) = 0, 1/3, 2/3, 1.
  Tensor out = ResizeTiny(
      {{"mode", Attribute::String("linear")}, {"coordinate_transformation_mode", Attribute::String("align_corners")}});
  ExpectTensorNear(out, FromU({0, 1.0 / 3, 2.0 / 3, 1}));
}

TEST(ShapeOpsResize, CubicHalfPixel) {
  // A = -0.75. W(t) = 1.25|t|^3 - 2.25|t|^2 + 1 for |t| <= 1, -0.75|t|^3 + 3.75|t|^2 - 6|t| + 3 for 1 < |t| < 2.
  // x = 0.25: taps -1, 0, 1, 2 at distances 1.25, 0.25, 0.75, 1.75 -> weights -0.10546875, 0.87890625, 0.26171875,
  // -0.03515625; taps 1 and 2 read b, so u = 0.26171875 - 0.03515625 = 0.2265625. x = -0.25: only tap 1 reads b with
  // weight W(1.25) = -0.10546875. x = 0.75 and 1.25 mirror these.
  ExpectTensorNear(ResizeTiny({{"mode", Attribute::String("cubic")}}),
                   FromU({-0.10546875, 0.2265625, 0.7734375, 1.10546875}));
}

TEST(ShapeOpsResize, CubicAlignCorners) {
  // x = 1/3: u = W(2/3) + W(5/3) = 10/27 - 1/18 = 17/54; x = 2/3: u = W(1/3) + W(4/3) = 43/54 - 1/9 = 37/54.
  Tensor out = ResizeTiny(
      {{"mode", Attribute::String("cubic")}, {"coordinate_transformation_mode", Attribute::String("align_corners")}});
  ExpectTensorNear(out, FromU({0, 17.0 / 54, 37.0 / 54, 1}));
}

TEST(ShapeOpsResize, NearestModes) {
  // 1x3 -> 1x6 with half_pixel: x_original = -0.25, 0.25, 0.75, 1.25, 1.75, 2.25.
  Tensor x = F32({1, 3}, {10, 20, 30});
  auto run = [&](const char* mode) {
    Node n = MakeNode("Resize", 3, 1, {{"nearest_mode", Attribute::String(mode)}});
    return Run1(n, {x, Tensor(), Floats({1, 2})}, 13);
  };
  ExpectTensorNear(run("round_prefer_floor"), F32({1, 6}, {10, 10, 20, 20, 30, 30}));
  ExpectTensorNear(run("round_prefer_ceil"), F32({1, 6}, {10, 10, 20, 20, 30, 30}));
  ExpectTensorNear(run("floor"), F32({1, 6}, {10, 10, 10, 20, 20, 30}));
  ExpectTensorNear(run("ceil"), F32({1, 6}, {10, 20, 20, 30, 30, 30}));
  // asymmetric: x_original = 0, 0.5, 1, 1.5, 2, 2.5 separates the two rounding preferences.
  auto asym = [&](const char* mode) {
    Node n = MakeNode("Resize", 3, 1,
                      {{"nearest_mode", Attribute::String(mode)},
                       {"coordinate_transformation_mode", Attribute::String("asymmetric")}});
    return Run1(n, {x, Tensor(), Floats({1, 2})}, 13);
  };
  ExpectTensorNear(asym("round_prefer_floor"), F32({1, 6}, {10, 10, 20, 20, 30, 30}));
  ExpectTensorNear(asym("round_prefer_ceil"), F32({1, 6}, {10, 20, 20, 30, 30, 30}));
  // Nearest moves bytes, so it works for any dtype.
  Node n = MakeNode("Resize", 3, 1);
  ExpectTensorNear(Run1(n, {Tensor::FromVector<uint8_t>({1, 3}, {1, 2, 3}), Tensor(), Floats({1, 2})}, 13),
                   Tensor::FromVector<uint8_t>({1, 6}, {1, 1, 2, 2, 3, 3}));
}

TEST(ShapeOpsResize, TfCropAndResizeExtrapolates) {
  // Width 4 -> 3 with roi [0.5, 1.5]: x_original = 1.5 + 1.5 * x = 1.5, 3, 4.5 (outside -> extrapolation_value).
  Node n = MakeNode("Resize", 4, 1,
                    {{"mode", Attribute::String("linear")},
                     {"coordinate_transformation_mode", Attribute::String("tf_crop_and_resize")},
                     {"extrapolation_value", Attribute::Float(10)}});
  Tensor roi = Floats({0, 0, 0, 0.5f, 1, 1, 1, 1.5f});
  Tensor out = Run1(n, {F32({1, 1, 1, 4}, {1, 2, 3, 4}), roi, Tensor(), Ints({1, 1, 1, 3})}, 13);
  ExpectTensorNear(out, F32({1, 1, 1, 3}, {2.5f, 4, 10}));
}

TEST(ShapeOpsResize, AxesAndAspectRatio) {
  Node n = MakeNode("Resize", 3, 1, {{"mode", Attribute::String("linear")}, {"axes", Attribute::Ints({2, 3})}});
  ExpectTensorNear(Run1(n, {Tiny(), Tensor(), Floats({2, 2})}, 18), FromU({0, 0.25, 0.75, 1}));
  // not_larger: scale = min(4/2, 3/2) = 1.5 for both axes -> round(2 * 1.5) = 3 on each.
  Node keep =
      MakeNode("Resize", 4, 1,
               {{"keep_aspect_ratio_policy", Attribute::String("not_larger")}, {"axes", Attribute::Ints({2, 3})}});
  Tensor out = Run1(keep, {Tiny(), Tensor(), Tensor(), Ints({4, 3})}, 18);
  EXPECT_EQ(ShapeToString(out.shape()), "[1, 1, 3, 3]");
  ExpectError(
      [&] {
        RunReferenceNode(MakeNode("Resize", 3, 1, {{"antialias", Attribute::Int(1)}}),
                         {Tiny(), Tensor(), Floats({1, 1, 2, 2})}, 18);
      },
      ErrorCode::kUnsupported);
  ExpectError(
      [&] {
        RunReferenceNode(MakeNode("Resize", 4, 1), {Tiny(), Tensor(), Floats({1, 1, 2, 2}), Ints({1, 1, 4, 4})}, 13);
      },
      ErrorCode::kInvalidArgument);
}

TEST(ShapeOpsResize, Opset10AndUpsample) {
  // Opset 10 downsampling (ONNX's test_resize_downsample_nearest): floor(2*0.6)=1 x floor(4*0.6)=2 -> [[1, 3]].
  Tensor x = F32({1, 1, 2, 4}, {1, 2, 3, 4, 5, 6, 7, 8});
  ExpectTensorNear(Run1(MakeNode("Resize", 2, 1), {x, Floats({1, 1, 0.6f, 0.6f})}, 10), F32({1, 1, 1, 2}, {1, 3}));
  // Upsample (opset 9 input, opset 7 attribute) by (2, 3) repeats each element.
  std::vector<float> rep = {1, 1, 1, 2, 2, 2, 1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4, 3, 3, 3, 4, 4, 4};
  ExpectTensorNear(Run1(MakeNode("Upsample", 2, 1), {Tiny(), Floats({1, 1, 2, 3})}, 9), F32({1, 1, 4, 6}, rep));
  Node up7 = MakeNode("Upsample", 1, 1, {{"scales", Attribute::Floats({1, 1, 2, 3})}});
  ExpectTensorNear(Run1(up7, {Tiny()}, 7), F32({1, 1, 4, 6}, rep));
  // Linear upsampling uses asymmetric coordinates x / 2 = 0, 0.5, 1, 1.5 (clamped at the end).
  Node lin = MakeNode("Upsample", 2, 1, {{"mode", Attribute::String("linear")}});
  ExpectTensorNear(Run1(lin, {Tiny(), Floats({1, 1, 2, 2})}, 9), FromU({0, 0.5, 1, 1}));
}

// ---------------------------------------------------------------------------------------------------------------
TEST(ShapeOpsShape, StartEndAndSize) {
  Tensor x(DType::kF32, {2, 3, 4, 5});
  ExpectTensorNear(Run1(MakeNode("Shape", 1, 1), {x}, 13), Ints({2, 3, 4, 5}));
  Node se = MakeNode("Shape", 1, 1, {{"start", Attribute::Int(1)}, {"end", Attribute::Int(-1)}});
  ExpectTensorNear(Run1(se, {x}, 15), Ints({3, 4}));
  Node clamp = MakeNode("Shape", 1, 1, {{"start", Attribute::Int(-10)}, {"end", Attribute::Int(10)}});
  ExpectTensorNear(Run1(clamp, {x}, 15), Ints({2, 3, 4, 5}));
  Node none = MakeNode("Shape", 1, 1, {{"start", Attribute::Int(3)}, {"end", Attribute::Int(1)}});
  ExpectTensorNear(Run1(none, {x}, 15), Tensor(DType::kI64, {0}));
  ExpectTensorNear(Run1(MakeNode("Size", 1, 1), {x}), Tensor::Scalar<int64_t>(120));
  ExpectTensorNear(Run1(MakeNode("Size", 1, 1), {Tensor(DType::kF32, {3, 0})}), Tensor::Scalar<int64_t>(0));
}

TEST(ShapeOpsConstant, ValueForms) {
  Tensor v = I32({2}, {7, -7});
  ExpectTensorNear(Run1(MakeNode("Constant", 0, 1, {{"value", Attribute::TensorValue(v)}}), {}), v);
  ExpectTensorNear(Run1(MakeNode("Constant", 0, 1, {{"value_float", Attribute::Float(1.5f)}}), {}),
                   Tensor::Scalar<float>(1.5f));
  ExpectTensorNear(Run1(MakeNode("Constant", 0, 1, {{"value_floats", Attribute::Floats({1, 2})}}), {}), Floats({1, 2}));
  ExpectTensorNear(Run1(MakeNode("Constant", 0, 1, {{"value_int", Attribute::Int(3)}}), {}),
                   Tensor::Scalar<int64_t>(3));
  ExpectTensorNear(Run1(MakeNode("Constant", 0, 1, {{"value_ints", Attribute::Ints({4, 5})}}), {}), Ints({4, 5}));
  ExpectError(
      [&] {
        RunReferenceNode(MakeNode("Constant", 0, 1, {{"sparse_value", Attribute::Int(0)}}), {});
      },
      ErrorCode::kUnsupported);
  ExpectError([&] { RunReferenceNode(MakeNode("Constant", 0, 1), {}); }, ErrorCode::kInvalidArgument);
}

TEST(ShapeOpsConstantOfShape, ValueAndDefault) {
  Node n = MakeNode("ConstantOfShape", 1, 1, {{"value", Attribute::TensorValue(Ints({7}))}});
  ExpectTensorNear(Run1(n, {Ints({2, 3})}), I64({2, 3}, {7, 7, 7, 7, 7, 7}));
  ExpectTensorNear(Run1(MakeNode("ConstantOfShape", 1, 1), {Ints({3})}), Floats({0, 0, 0}));
  ExpectTensorNear(Run1(n, {Tensor(DType::kI64, {0})}), Tensor::Scalar<int64_t>(7));
  ExpectTensorNear(Run1(n, {Ints({2, 0})}), Tensor(DType::kI64, {2, 0}));
  ExpectError([&] { RunReferenceNode(n, {Ints({-1})}); }, ErrorCode::kInvalidArgument);
}

TEST(ShapeOpsRange, IntAndFloat) {
  Node n = MakeNode("Range", 3, 1);
  auto i64 = [](int64_t v) { return Tensor::Scalar<int64_t>(v); };
  ExpectTensorNear(Run1(n, {i64(3), i64(10), i64(3)}), Ints({3, 6, 9}));
  ExpectTensorNear(Run1(n, {i64(5), i64(-1), i64(-2)}), Ints({5, 3, 1}));
  auto f = [](float v) { return Tensor::Scalar<float>(v); };
  ExpectTensorNear(Run1(n, {f(10), f(6), f(-3)}), Floats({10, 7}));
  ExpectTensorNear(Run1(n, {f(0), f(1), f(0.25f)}), Floats({0, 0.25f, 0.5f, 0.75f}));
  auto i32 = [](int32_t v) { return Tensor::Scalar<int32_t>(v); };
  ExpectTensorNear(Run1(n, {i32(5), i32(1), i32(1)}), Tensor(DType::kI32, {0}));
  ExpectError([&] { RunReferenceNode(n, {i64(0), i64(3), i64(0)}); }, ErrorCode::kInvalidArgument);
  ExpectError([&] { RunReferenceNode(n, {i64(0), f(3), i64(1)}); }, ErrorCode::kInvalidArgument);
}

// OneHot against hand-written outputs (the ONNX backend tests check it against ONNX's too): the class axis inserted
// innermost by default, or at `axis`; a negative index wraps once; outside [-depth, depth) the row stays off; float
// indices are truncated; the values' dtype is the output's. Bad depth, values and axis are errors, as is a depth
// whose output would exceed the size limit.
TEST(ShapeOpsOneHot, ClassesIndicesAndErrors) {
  const Tensor idx = Tensor::FromVector<int64_t>({2, 2}, {1, -1, 3, -4});
  const Tensor depth = Tensor::Scalar<int64_t>(3);
  const Tensor values = Floats({0.5f, 2.f});  // off, on
  Tensor want =
      Tensor::FromVector<float>({2, 2, 3}, {0.5f, 2, 0.5f, 0.5f, 0.5f, 2, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f});
  ExpectTensorNear(Run1(MakeNode("OneHot", 3, 1), {idx, depth, values}), want);
  // axis 0: output[class, i, j]
  Tensor axis0 =
      Tensor::FromVector<float>({3, 2, 2}, {0.5f, 0.5f, 0.5f, 0.5f, 2, 0.5f, 0.5f, 0.5f, 0.5f, 2, 0.5f, 0.5f});
  ExpectTensorNear(Run1(MakeNode("OneHot", 3, 1, {{"axis", Attribute::Int(0)}}), {idx, depth, values}), axis0);
  ExpectTensorNear(Run1(MakeNode("OneHot", 3, 1, {{"axis", Attribute::Int(-3)}}), {idx, depth, values}), axis0);
  // float indices truncated toward zero; int32 values
  ExpectTensorNear(Run1(MakeNode("OneHot", 3, 1),
                        {Floats({1.7f, -0.5f}), Tensor::Scalar<float>(2.f), Tensor::FromVector<int32_t>({2}, {0, 7})}),
                   Tensor::FromVector<int32_t>({2, 2}, {0, 7, 7, 0}));
  auto fails = [&](const std::vector<Tensor>& in, AttributeMap attrs) {
    ExpectError([&] { RunReferenceNode(MakeNode("OneHot", 3, 1, std::move(attrs)), in); }, ErrorCode::kInvalidArgument);
  };
  fails({idx, Tensor::Scalar<int64_t>(0), values}, {});                 // no classes
  fails({idx, Tensor::Scalar<float>(std::nanf("")), values}, {});       // not a number of classes
  fails({idx, Tensor::FromVector<int64_t>({2}, {3, 3}), values}, {});   // depth not a scalar
  fails({idx, depth, Floats({0, 1, 2})}, {});                           // values not [off, on]
  fails({idx, depth, values}, {{"axis", Attribute::Int(3)}});           // output rank is 3
  fails({idx, Tensor::Scalar<int64_t>(int64_t{1} << 47), values}, {});  // 4 x 2^47 elements: over the limit
}

TEST(ShapeOpsIdentity, IdentityAndDropout) {
  Tensor x = Tensor::FromVector<int8_t>({3}, {1, -2, 3});
  ExpectTensorNear(Run1(MakeNode("Identity", 1, 1), {x}), x);
  std::vector<Tensor> outs =
      RunReferenceNode(MakeNode("Dropout", 2, 2), {Floats({1, 2, 3}), Tensor::Scalar<float>(0.3f)}, 13);
  ExpectTensorNear(outs[0], Floats({1, 2, 3}));
  Tensor all_true(DType::kBool, {3});
  for (int i = 0; i < 3; ++i) all_true.data<bool>()[i] = true;
  ExpectTensorNear(outs[1], all_true);
  std::vector<Tensor> old =
      RunReferenceNode(MakeNode("Dropout", 1, 2, {{"ratio", Attribute::Float(0.5f)}}), {Floats({4, 5})}, 7);
  ExpectTensorNear(old[1], Floats({1, 1}));
  ExpectError(
      [&] {
        RunReferenceNode(MakeNode("Dropout", 3, 1), {Floats({1}), Tensor::Scalar<float>(0.5f), BoolScalar(true)}, 13);
      },
      ErrorCode::kUnsupported);
}

// ---------------------------------------------------------------------------------------------------------------
// ONNX's documented DepthToSpace example: x[c][h][w] = 9c + 3h + w, shape [1, 8, 2, 3], blocksize 2.
Tensor DepthInput() {
  Tensor x(DType::kF32, {1, 8, 2, 3});
  for (int c = 0; c < 8; ++c)
    for (int h = 0; h < 2; ++h)
      for (int w = 0; w < 3; ++w) x.data<float>()[(c * 2 + h) * 3 + w] = static_cast<float>(9 * c + 3 * h + w);
  return x;
}

const std::vector<float> kDcr = {0,  18, 1,  19, 2,  20, 36, 54, 37, 55, 38, 56, 3,  21, 4,  22,
                                 5,  23, 39, 57, 40, 58, 41, 59, 9,  27, 10, 28, 11, 29, 45, 63,
                                 46, 64, 47, 65, 12, 30, 13, 31, 14, 32, 48, 66, 49, 67, 50, 68};
const std::vector<float> kCrd = {0,  9,  1,  10, 2,  11, 18, 27, 19, 28, 20, 29, 3,  12, 4,  13,
                                 5,  14, 21, 30, 22, 31, 23, 32, 36, 45, 37, 46, 38, 47, 54, 63,
                                 55, 64, 56, 65, 39, 48, 40, 49, 41, 50, 57, 66, 58, 67, 59, 68};

TEST(ShapeOpsDepthToSpace, DcrAndCrd) {
  Node dcr = MakeNode("DepthToSpace", 1, 1, {{"blocksize", Attribute::Int(2)}});
  ExpectTensorNear(Run1(dcr, {DepthInput()}), F32({1, 2, 4, 6}, kDcr));
  Node crd = MakeNode("DepthToSpace", 1, 1, {{"blocksize", Attribute::Int(2)}, {"mode", Attribute::String("CRD")}});
  ExpectTensorNear(Run1(crd, {DepthInput()}), F32({1, 2, 4, 6}, kCrd));
  ExpectError([&] { RunReferenceNode(dcr, {Iota({1, 6, 2, 2})}); }, ErrorCode::kInvalidArgument);
}

TEST(ShapeOpsSpaceToDepth, InvertsDcr) {
  Node n = MakeNode("SpaceToDepth", 1, 1, {{"blocksize", Attribute::Int(2)}});
  ExpectTensorNear(Run1(n, {F32({1, 2, 4, 6}, kDcr)}), DepthInput());
  ExpectError([&] { RunReferenceNode(n, {Iota({1, 1, 3, 4})}); }, ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace osprey
