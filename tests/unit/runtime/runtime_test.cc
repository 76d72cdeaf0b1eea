#include "osprey/runtime.h"

#include <gtest/gtest.h>
#include <malloc.h>
#include <omp.h>

#include <atomic>
#include <functional>
#include <map>
#include <thread>

#include "kernels/cpu/bf16_support.h"
#include "runtime/plan_impl.h"
#include "test_util.h"

namespace osprey {
namespace {

using testing::ExpectTensorNear;
using testing::RandomTensor;
using testing::ScopedEnv;

Tensor F32(Shape shape, std::vector<float> v) { return Tensor::FromVector<float>(std::move(shape), v); }
Tensor I64(Shape shape, std::vector<int64_t> v) { return Tensor::FromVector<int64_t>(std::move(shape), v); }

TEST(Runtime, BuildRunDrop) {
  // y = relu(x * 2 - 1), oracle computed by hand.
  GraphBuilder b("tiny");
  auto x = b.Input("x", DType::kF32, {-1});
  auto two = b.Constant(Tensor::Scalar<float>(2.f));
  auto one = b.Constant(Tensor::Scalar<float>(1.f));
  auto y = b.Op("Relu", {b.Op("Sub", {b.Op("Mul", {x, two}), one})});
  b.Output(y, "y");
  Model model(b.Finish());
  auto out = model.Run({{"x", F32({4}, {-1.f, 0.f, 0.5f, 3.f})}});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].first, "y");
  ExpectTensorNear(out[0].second, F32({4}, {0.f, 0.f, 0.f, 5.f}));
}

TEST(Runtime, ShapeArithmeticFoldsAtCompileTime) {
  // Reshape x[N, C, H, W] to [N, C*H*W / 2, 2] via Shape -> Gather -> Mul -> Div -> Concat (as exporters write it).
  GraphBuilder b("shape_chain", 13);
  auto x = b.InputDims("x", DType::kF32, std::vector<Dim>{{-1, "N"}, {-1, "C"}, {-1, "H"}, {-1, "W"}});
  auto shape = b.Op("Shape", {x});
  auto n = b.Op("Gather", {shape, b.Constant(I64({1}, {0}))}, {{"axis", Attribute::Int(0)}});
  auto c = b.Op("Gather", {shape, b.Constant(Tensor::Scalar<int64_t>(1))}, {{"axis", Attribute::Int(0)}});
  auto h = b.Op("Gather", {shape, b.Constant(Tensor::Scalar<int64_t>(2))}, {{"axis", Attribute::Int(0)}});
  auto w = b.Op("Gather", {shape, b.Constant(Tensor::Scalar<int64_t>(3))}, {{"axis", Attribute::Int(0)}});
  auto chw = b.Op("Mul", {b.Op("Mul", {c, h}), w});
  auto half = b.Op("Div", {chw, b.Constant(Tensor::Scalar<int64_t>(2))});
  auto new_shape = b.Op("Concat", {n, b.Op("Unsqueeze", {half, b.Constant(I64({1}, {0}))}), b.Constant(I64({1}, {2}))},
                        {{"axis", Attribute::Int(0)}});
  b.Output(b.Op("Reshape", {x, new_shape}), "y");
  Graph g = b.Finish();
  auto plan = Compile(g, {{DType::kF32, {2, 3, 4, 5}}});
  EXPECT_EQ(plan->num_steps(), 1u) << "everything but the Reshape should fold";
  EXPECT_EQ(ShapeToString(plan->output_specs()[0].shape), "[2, 30, 2]");
  Tensor in = RandomTensor({2, 3, 4, 5}, 1);
  auto out = plan->Run({in});
  ExpectTensorNear(out[0], in.Reshaped({2, 30, 2}));
}

// Reshape, Flatten, Squeeze, Unsqueeze and Identity (OpTraits::same_bytes) pass their input's bytes on: the memory
// plan gives input and output one buffer, so a = Relu(x), its reshapes and y = Add(a, reshaped a) hold one buffer in
// the arena (y is a graph output) where copies would hold three. Graph inputs and outputs are copied as before.
// (The Identity is removed by the fusion passes.)
TEST(Runtime, ShapeOnlyOpsShareTheirInputsBuffer) {
  GraphBuilder b("aliases", 13);
  auto x = b.Input("x", DType::kF32, {4, 16});  // 256 bytes: a multiple of the arena alignment
  auto a = b.Op("Relu", {x});
  auto r = b.Op("Reshape", {a, b.Constant(I64({3}, {2, 2, 16}))});
  auto c = b.Op("Flatten", {b.Op("Identity", {b.Op("Unsqueeze", {r, b.Constant(I64({1}, {0}))})})},
                {{"axis", Attribute::Int(2)}});
  auto back = b.Op("Squeeze", {b.Op("Reshape", {c, b.Constant(I64({2}, {4, 16}))})});
  b.Output(b.Op("Add", {a, back}), "y");
  b.Output(b.Op("Reshape", {x, b.Constant(I64({1}, {64}))}), "x_flat");  // a graph input into a graph output
  auto plan = Compile(b.Finish(), {{DType::kF32, {4, 16}}});
  EXPECT_EQ(plan->KernelCounts()["SameBytesCopy"], 6);
  EXPECT_EQ(plan->arena_bytes(), 256u) << "the reshaped values share Relu's buffer";
  Tensor in = RandomTensor({4, 16}, 7);
  const Tensor kept = in.Clone();
  auto out = plan->Run({in});
  std::vector<float> want(64);
  for (int i = 0; i < 64; ++i) want[i] = 2.f * std::max(0.f, in.data<float>()[i]);
  ExpectTensorNear(out[0], F32({4, 16}, want));
  ExpectTensorNear(out[1], kept.Reshaped({64}));
  ExpectTensorNear(in, kept);
  EXPECT_NE(out[1].raw(), in.raw()) << "a graph output owns its memory";
}

// A Cast (or CastLike) to the dtype its input already has passes the bytes on; one that converts runs its kernel.
TEST(Runtime, CastToItsOwnTypeSharesItsInputsBuffer) {
  GraphBuilder b("casts", 13);
  auto x = b.Input("x", DType::kF32, {4, 16});
  auto a = b.Op("Relu", {x});
  auto same = b.Op("Cast", {a}, {{"to", Attribute::Int(1)}});  // FLOAT
  auto like = b.Op("CastLike", {same, b.Constant(F32({1}, {0.f}))});
  auto halved = b.Op("Cast", {b.Op("Cast", {like}, {{"to", Attribute::Int(10)}})}, {{"to", Attribute::Int(1)}});
  b.Output(b.Op("Add", {a, like}), "y");
  b.Output(halved, "h");  // through float16 and back
  auto plan = Compile(b.Finish(), {{DType::kF32, {4, 16}}});
  EXPECT_EQ(plan->KernelCounts()["SameBytesCopy"], 2) << "the float Cast and the CastLike";
  Tensor in = RandomTensor({4, 16}, 7);
  auto out = plan->Run({in});
  std::vector<float> want(64), want_h(64);
  for (int i = 0; i < 64; ++i) {
    const float r = std::max(0.f, in.data<float>()[i]);
    want[i] = 2.f * r;
    want_h[i] = r;
  }
  ExpectTensorNear(out[0], F32({4, 16}, want));
  ExpectTensorNear(out[1], F32({4, 16}, want_h), 1e-3f, 1e-3f);
}

// A Split or a Slice whose outputs are each one run of the input's bytes makes them views of it (SameBytesCopy with
// offsets): a = Relu(x) [3, 2, 16], Split on axis 0 into three [1, 2, 16] (offsets 0, 128, 256 bytes), Slice a[1:3]
// (offset 128), Gather a[-1] (offset 256). A Slice of columns (not one run) is copied by its own kernel.
TEST(Runtime, ContiguousSlicesAndSplitsAreViews) {
  GraphBuilder b("views", 13);
  auto x = b.Input("x", DType::kF32, {3, 2, 16});
  auto a = b.Op("Relu", {x});
  auto parts = b.OpMulti("Split", {a}, 3, {{"axis", Attribute::Int(0)}});
  auto t = b.Op("Add", {parts[0], parts[1]});
  b.Output(b.Op("Add", {t, parts[2]}), "y");
  auto tail = b.Op("Slice", {a, b.Constant(I64({1}, {1})), b.Constant(I64({1}, {3})), b.Constant(I64({1}, {0}))});
  b.Output(b.Op("Neg", {tail}), "z");
  b.Output(b.Op("Slice", {a, b.Constant(I64({1}, {0})), b.Constant(I64({1}, {8})), b.Constant(I64({1}, {2}))}), "w");
  auto last = b.Op("Gather", {a, b.Constant(Tensor::Scalar<int64_t>(-1))}, {{"axis", Attribute::Int(0)}});
  b.Output(b.Op("Neg", {last}), "g");
  auto plan = Compile(b.Finish(), {{DType::kF32, {3, 2, 16}}});
  EXPECT_EQ(plan->KernelCounts()["SameBytesCopy"], 3) << "the Split, the row Slice and the Gather, not the columns";
  EXPECT_EQ(plan->arena_bytes(), 384u + 128u) << "a and the sum of two parts; the parts are views of a";
  Tensor in = RandomTensor({3, 2, 16}, 11);
  auto out = plan->Run({in});
  const float* v = in.data<float>();
  auto relu = [&](int i) { return std::max(0.f, v[i]); };
  std::vector<float> y(32), z(64), w(48);
  for (int i = 0; i < 32; ++i) y[i] = relu(i) + relu(32 + i) + relu(64 + i);
  for (int i = 0; i < 64; ++i) z[i] = -relu(32 + i);
  for (int r = 0; r < 6; ++r)
    for (int c = 0; c < 8; ++c) w[r * 8 + c] = relu(r * 16 + c);
  ExpectTensorNear(out[0], F32({1, 2, 16}, y));
  ExpectTensorNear(out[1], F32({2, 2, 16}, z));
  ExpectTensorNear(out[2], F32({3, 2, 8}, w));
  std::vector<float> g(32);
  for (int i = 0; i < 32; ++i) g[i] = -relu(64 + i);
  ExpectTensorNear(out[3], F32({2, 16}, g));
}

// A Transpose that moves only axes of extent 1 keeps every element where it was: a view of its input (ViT's
// [197, 1, 768] -> [1, 197, 768] around its attention). One that moves two longer axes is copied by its own kernel.
TEST(Runtime, TransposesOfUnitAxesAreViews) {
  GraphBuilder b("transpose_views", 13);
  auto x = b.Input("x", DType::kF32, {4, 1, 16});
  auto a = b.Op("Relu", {x});
  auto moved = b.Op("Transpose", {a}, {{"perm", Attribute::Ints({1, 0, 2})}});  // [1, 4, 16]
  b.Output(b.Op("Neg", {moved}), "y");
  auto swapped = b.Op("Transpose", {a}, {{"perm", Attribute::Ints({2, 1, 0})}});  // [16, 1, 4]: a real transpose
  b.Output(b.Op("Neg", {swapped}), "z");
  auto plan = Compile(b.Finish(), {{DType::kF32, {4, 1, 16}}});
  EXPECT_EQ(plan->KernelCounts()["SameBytesCopy"], 1);
  EXPECT_EQ(plan->KernelCounts()["TransposeCpu"], 1);
  Tensor in = RandomTensor({4, 1, 16}, 13);
  auto out = plan->Run({in});
  const float* v = in.data<float>();
  std::vector<float> y(64), z(64);
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 16; ++c) {
      y[r * 16 + c] = -std::max(0.f, v[r * 16 + c]);
      z[c * 4 + r] = -std::max(0.f, v[r * 16 + c]);
    }
  ExpectTensorNear(out[0], F32({1, 4, 16}, y));
  ExpectTensorNear(out[1], F32({16, 1, 4}, z));
}

// A Reshape or contiguous Split of a graph input reads the caller's tensor in place (Slot::Kind::kView): with the
// sum a graph output, the plan needs no arena at all, and the input is left as it was.
TEST(Runtime, ReshapesOfGraphInputsAreViewsOfThem) {
  GraphBuilder b("input_views", 13);
  auto x = b.Input("x", DType::kF32, {2, 4, 16});
  auto flat = b.Op("Reshape", {x, b.Constant(I64({2}, {2, 64}))});
  auto halves = b.OpMulti("Split", {flat}, 2, {{"axis", Attribute::Int(0)}});
  b.Output(b.Op("Add", {halves[0], halves[1]}), "y");
  auto plan = Compile(b.Finish(), {{DType::kF32, {2, 4, 16}}});
  EXPECT_EQ(plan->KernelCounts()["SameBytesCopy"], 2);
  EXPECT_EQ(plan->arena_bytes(), 0u) << "the reshaped and split values are views of x";
  Tensor in = RandomTensor({2, 4, 16}, 5);
  const Tensor kept = in.Clone();
  auto out = plan->Run({in});
  std::vector<float> want(64);
  for (int i = 0; i < 64; ++i) want[i] = kept.data<float>()[i] + kept.data<float>()[64 + i];
  ExpectTensorNear(out[0], F32({1, 64}, want));
  ExpectTensorNear(in, kept);
  // Again with another input: nothing of the first run's input is kept.
  Tensor again = RandomTensor({2, 4, 16}, 6);
  for (int i = 0; i < 64; ++i) want[i] = again.data<float>()[i] + again.data<float>()[64 + i];
  ExpectTensorNear(plan->Run({again})[0], F32({1, 64}, want));
}

// A convolution that adds a residual (fused Conv + Add) writes its output over the residual's buffer when the residual
// dies there (Kernel::MayOverwriteInput): a = Relu(Conv(x)), b = Conv(a), r = Conv(b) + a holds a and b in the arena
// at r's step, not a, b and r (3 x 4 KiB). Where the residual is also the convolution's input (Conv(a) + a) the output
// must not take its buffer: the convolution still reads it. Oracle: the reference kernels, unfused.
TEST(Runtime, ResidualConvolutionWritesOverItsResidual) {
  auto conv = [](GraphBuilder& b, ValueRef in, uint64_t seed) {
    return b.Op("Conv", {in, b.Constant(RandomTensor({16, 16, 3, 3}, seed)), b.Constant(RandomTensor({16}, seed + 1))},
                {{"pads", Attribute::Ints({1, 1, 1, 1})}});
  };
  for (bool chain : {true, false}) {
    GraphBuilder b("residual", 13);
    auto x = b.Input("x", DType::kF32, {1, 16, 8, 8});
    auto a = b.Op("Relu", {conv(b, x, 1)});
    auto r = b.Op("Add", {conv(b, chain ? conv(b, a, 3) : a, 5), a});
    b.Output(b.Op("GlobalAveragePool", {b.Op("Relu", {r})}), "y");
    const Graph g = b.Finish();
    auto plan = Compile(g, {{DType::kF32, {1, 16, 8, 8}}});
    CompileOptions reference;
    reference.fast_kernels = false;
    reference.fuse = false;
    auto oracle = Compile(g, {{DType::kF32, {1, 16, 8, 8}}}, reference);
    if (chain) {
      EXPECT_EQ(plan->arena_bytes(), 2u * 4096u) << "r takes a's buffer";
    }
    Tensor in = RandomTensor({1, 16, 8, 8}, 9);
    ExpectTensorNear(plan->Run({in})[0], oracle->Run({in})[0], 1e-4f);
  }
}

// A known Gather index out of range is not made a view: the Gather still reports it.
TEST(Runtime, OutOfRangeGatherIndexIsStillAnError) {
  GraphBuilder b("bad_index", 13);
  auto x = b.Input("x", DType::kF32, {3, 2, 16});
  auto picked =
      b.Op("Gather", {b.Op("Relu", {x}), b.Constant(Tensor::Scalar<int64_t>(3))}, {{"axis", Attribute::Int(0)}});
  b.Output(b.Op("Neg", {picked}), "y");
  try {
    auto plan = Compile(b.Finish(), {{DType::kF32, {3, 2, 16}}});
    plan->Run({RandomTensor({3, 2, 16}, 3)});
    FAIL() << "an index of 3 into 3 rows was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("out of range"), std::string::npos) << e.what();
  }
}

TEST(Runtime, PlanCacheIsBoundedLru) {
  GraphBuilder b("neg");
  auto x = b.Input("x", DType::kF32, {-1, -1});
  b.Output(b.Op("Neg", {x}), "y");
  ModelOptions opts;
  opts.plan_cache_capacity = 2;
  Model model(b.Finish(), opts);
  for (int64_t n : {1, 2, 1, 3, 1, 2}) model.Run({{"x", Tensor::Zeros(DType::kF32, {n, 4})}});
  auto s = model.plan_cache().stats();
  // 1 miss, 2 miss, 1 hit, 3 miss (evicts 2), 1 hit, 2 miss (evicts 3).
  EXPECT_EQ(s.misses, 4u);
  EXPECT_EQ(s.hits, 2u);
  EXPECT_EQ(s.evictions, 2u);
  EXPECT_EQ(s.size, 2u);
}

// Host execution arenas are shared by every plan of the process (runtime/arena_pool.h): a run's arena goes back to
// the shared pool when it ends (charged to the pool, not the model), a later run of any plan takes the smallest idle
// one that fits (at most ArenaPool::kMaxWaste times its need), and TrimSharedArenas frees the idle ones.
TEST(Runtime, ArenasAreSharedAndTrimmed) {
  TrimSharedArenas(0);  // what earlier tests left idle
  GraphBuilder b("chain");
  auto x = b.Input("x", DType::kF32, {-1, 1024});
  b.Output(b.Op("Neg", {b.Op("Relu", {b.Op("Neg", {x})})}), "y");
  Model model(b.Finish());
  model.Run({{"x", Tensor::Zeros(DType::kF32, {512, 1024})}});
  const int64_t one = SharedArenaBytes();
  EXPECT_GE(one, 512 * 1024 * 4) << "the run's arena waits in the shared pool (charged to it, not the model)";
  model.Run({{"x", Tensor::Zeros(DType::kF32, {256, 1024})}});
  EXPECT_EQ(SharedArenaBytes(), one) << "the smaller plan ran in the larger plan's arena";

  // Another model runs in the same arena, and the values left in it by the first do not leak into its results
  // (nor back): y = relu(x) + 1 and y = min(x, 0), checked element by element, in turn.
  GraphBuilder c("other");
  auto cx = c.Input("x", DType::kF32, {256, 1024});
  c.Output(c.Op("Add", {c.Op("Relu", {cx}), c.Constant(Tensor::Scalar<float>(1.f))}), "y");
  Model other(c.Finish());
  const Tensor in = RandomTensor({256, 1024}, 9, -2.f, 2.f);
  for (int round = 0; round < 3; ++round) {
    const Tensor ya = other.Run({{"x", in}})[0].second, yb = model.Run({{"x", in}})[0].second;
    for (int64_t i = 0; i < in.numel(); ++i) {
      const float v = in.data<float>()[i];
      ASSERT_EQ(ya.data<float>()[i], std::max(v, 0.f) + 1.f) << i;
      ASSERT_EQ(yb.data<float>()[i], std::min(v, 0.f)) << i;
    }
  }
  EXPECT_EQ(SharedArenaBytes(), one) << "two models running in turn hold one arena";

  EXPECT_EQ(TrimSharedArenas(3600), 0u) << "nothing has been idle for an hour";
  EXPECT_EQ(TrimSharedArenas(0), static_cast<size_t>(one));
  EXPECT_EQ(SharedArenaBytes(), 0);
  auto out = model.Run({{"x", Tensor::Zeros(DType::kF32, {256, 1024})}});  // runs again in a new arena
  EXPECT_EQ(out[0].second.dim(0), 256);

  // A plan with an empty arena (no intermediate values) reuses one too: it does not fill the pool, pushing out the
  // large ones.
  TrimSharedArenas(0);
  GraphBuilder t("tiny");
  auto tx = t.Input("x", DType::kF32, {1, 4});
  t.Output(t.Op("Neg", {tx}), "y");
  Model tiny(t.Finish());
  tiny.Run({{"x", Tensor::Zeros(DType::kF32, {1, 4})}});
  const int64_t tiny_one = SharedArenaBytes();
  for (int i = 0; i < 20; ++i) tiny.Run({{"x", Tensor::Zeros(DType::kF32, {1, 4})}});
  EXPECT_EQ(SharedArenaBytes(), tiny_one);
}

// Shapes that would wrap the byte arithmetic are refused at compile time, whichever op computes them.
TEST(Runtime, OverflowingShapesAreCompileErrors) {
  GraphBuilder b("bomb");
  auto x = b.Input("x", DType::kF32, {1});
  auto shape = b.Constant(I64({2}, {int64_t{1} << 31, int64_t{1} << 31}));
  b.Output(b.Op("Expand", {x, shape}), "y");
  Model model(b.Finish());
  try {
    model.Run({{"x", F32({1}, {1.f})}});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
  }
  GraphBuilder r("range", 17);
  auto start = r.Constant(Tensor::Scalar<int64_t>(0));
  auto limit = r.Constant(Tensor::Scalar<int64_t>(int64_t{1} << 61));
  auto delta = r.Constant(Tensor::Scalar<int64_t>(1));
  auto xi = r.Input("x", DType::kI64, {1});
  r.Output(r.Op("Add", {r.Op("Range", {start, limit, delta}), xi}), "y");
  Model range(r.Finish());
  EXPECT_THROW(range.Run({{"x", I64({1}, {1})}}), Error);
}

TEST(Runtime, ModelChecksInputs) {
  GraphBuilder b("checked");
  auto x = b.InputDims("x", DType::kF32, std::vector<Dim>{{-1, "N"}, {3, ""}});
  auto z = b.InputDims("z", DType::kF32, std::vector<Dim>{{-1, "N"}, {3, ""}});
  b.Output(b.Op("Add", {x, z}), "y");
  Model model(b.Finish());
  auto expect_error = [&](std::map<std::string, Tensor> in, const std::string& words) {
    try {
      model.Run(in);
      FAIL() << "expected an error mentioning " << words;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  Tensor ok = Tensor::Zeros(DType::kF32, {2, 3});
  expect_error({{"x", ok}}, "missing input 'z'");
  expect_error({{"x", ok}, {"z", ok}, {"w", ok}}, "unknown input 'w'");
  expect_error({{"x", Tensor::Zeros(DType::kI32, {2, 3})}, {"z", ok}}, "expected dtype float32, got int32");
  expect_error({{"x", Tensor::Zeros(DType::kF32, {6})}, {"z", ok}}, "expected rank 2");
  expect_error({{"x", Tensor::Zeros(DType::kF32, {2, 4})}, {"z", ok}}, "dim 1 must be 3");
  EXPECT_NO_THROW(model.Run({{"x", ok}, {"z", ok}}));
  // Symbolic dim names are hints, as ONNX Runtime reads them: two inputs may differ in a dim both call N.
  auto out = model.Run({{"x", Tensor::Zeros(DType::kF32, {1, 3})}, {"z", ok}});
  EXPECT_EQ(out[0].second.shape(), (Shape{2, 3}));
  expect_error({{"x", Tensor::Zeros(DType::kF32, {4, 3})}, {"z", ok}}, "cannot be broadcast");
}

TEST(Runtime, UnknownOpsAreListedTogether) {
  Graph g;
  g.name = "bad";
  int x = g.AddValue("x");
  g.inputs.push_back(x);
  g.input_infos.push_back(ValueInfo{"x", DType::kF32, true, {Dim{2, ""}}});
  int a = g.AddValue("a"), c = g.AddValue("c");
  g.nodes.push_back(Node{"FooOp", "", "first", {x}, {a}, {}});
  g.nodes.push_back(Node{"BarOp", "", "second", {a}, {c}, {}});
  g.outputs.push_back(c);
  g.output_infos.push_back(ValueInfo{"c"});
  try {
    Model m(std::move(g));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    std::string msg = e.what();
    EXPECT_NE(msg.find("FooOp (node 'first')"), std::string::npos) << msg;
    EXPECT_NE(msg.find("BarOp (node 'second')"), std::string::npos) << msg;
  }
}

Graph ConvBnAddRelu(uint32_t seed, const Tensor* shared_weight = nullptr) {
  GraphBuilder b("block", 13);
  auto x = b.Input("x", DType::kF32, {1, 5, 9, 7});
  Tensor w = shared_weight ? *shared_weight : RandomTensor({5, 5, 3, 3}, seed);
  auto conv = b.Op("Conv", {x, b.Constant(w), b.Constant(RandomTensor({5}, seed + 1))},
                   {{"pads", Attribute::Ints({1, 1, 1, 1})}});
  auto bn = b.Op("BatchNormalization",
                 {conv, b.Constant(RandomTensor({5}, seed + 2, 0.5f, 1.5f)), b.Constant(RandomTensor({5}, seed + 3)),
                  b.Constant(RandomTensor({5}, seed + 4)), b.Constant(RandomTensor({5}, seed + 5, 0.5f, 2.f))});
  auto y = b.Op("Relu", {b.Op("Add", {bn, x})});
  b.Output(y, "y");
  return b.Finish();
}

TEST(Runtime, FusionMatchesUnfusedReference) {
  Graph g = ConvBnAddRelu(7);
  Tensor x = RandomTensor({1, 5, 9, 7}, 99);
  CompileOptions fused;  // fast kernels + fusion
  CompileOptions reference;
  reference.fast_kernels = false;
  reference.fuse = false;
  CompileOptions fused_reference;  // fused nodes through the reference kernels
  fused_reference.fast_kernels = false;
  auto p_fused = Compile(g, {{DType::kF32, x.shape()}}, fused);
  auto p_ref = Compile(g, {{DType::kF32, x.shape()}}, reference);
  auto p_fref = Compile(g, {{DType::kF32, x.shape()}}, fused_reference);
  EXPECT_EQ(p_fused->num_steps(), 1u) << "Conv+BN+Add+Relu should become one fused Conv";
  EXPECT_EQ(p_ref->num_steps(), 4u);
  Tensor want = p_ref->Run({x})[0];
  ExpectTensorNear(p_fref->Run({x})[0], want, 1e-4f, 1e-4f);
  ExpectTensorNear(p_fused->Run({x})[0], want, 1e-4f, 1e-4f);
}

TEST(Runtime, ConcurrentRunsOfOnePlan) {
  Graph g = ConvBnAddRelu(3);
  auto plan = Compile(g, {{DType::kF32, {1, 5, 9, 7}}});
  std::vector<Tensor> inputs, expected;
  for (int i = 0; i < 4; ++i) {
    inputs.push_back(RandomTensor({1, 5, 9, 7}, 100 + i));
    expected.push_back(plan->Run({inputs.back()})[0]);
  }
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      bool good = true;
      for (int r = 0; r < 20; ++r) {
        Tensor got = plan->Run({inputs[t]})[0];
        good = good && std::memcmp(got.raw(), expected[t].raw(), got.nbytes()) == 0;
      }
      ok[t] = good;
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_TRUE(ok[t]) << "thread " << t;
}

TEST(Runtime, SharedWeightsCountedOnceAndFreedOnDrop) {
  auto store = std::make_shared<WeightStore>();
  Tensor backbone = RandomTensor({5, 5, 3, 3}, 42);
  ModelOptions opts;
  opts.weight_store = store;
  TrimSharedArenas(0);
  const int64_t before = Allocator::Host().BytesLive();
  {
    auto a = std::make_unique<Model>(ConvBnAddRelu(1, &backbone), opts);
    int64_t one = store->BytesLive();
    EXPECT_GT(one, 0);
    EXPECT_EQ(a->SharedWeightBytes(), 0);
    // Same backbone weight, different BN/bias "heads".
    auto b = std::make_unique<Model>(ConvBnAddRelu(50, &backbone), opts);
    int64_t w_bytes = static_cast<int64_t>(Allocator::kAlignment) * ((backbone.nbytes() + 63) / 64);
    EXPECT_EQ(store->BytesLive(), 2 * one - w_bytes) << "the shared conv weight is stored once";
    EXPECT_EQ(a->SharedWeightBytes(), w_bytes);
    EXPECT_EQ(b->SharedWeightBytes(), w_bytes);
    a->Run({{"x", RandomTensor({1, 5, 9, 7}, 5)}});
    EXPECT_GT(SharedArenaBytes(), 0) << "the run's arena waits in the shared pool";
    a.reset();
    EXPECT_EQ(b->SharedWeightBytes(), 0);
    b.reset();
    EXPECT_EQ(store->BytesLive(), 0);
  }
  TrimSharedArenas(0);
  EXPECT_EQ(Allocator::Host().BytesLive(), before) << "dropping the models (and the idle arena) returns every byte";
}

// Oracle: the store's byte count and its live derived entries. Two models built by `make` (bit-identical weights),
// each run once on `x`, hold one packed form of each weight (the second model's kernels reuse the first's), and their
// outputs equal what a private store gives. Returns the first model's kernels (Plan::KernelCounts) and output.
std::pair<std::map<std::string, int>, Tensor> ExpectPacksShared(const std::function<Graph()>& make, const Tensor& x) {
  auto store = std::make_shared<WeightStore>();
  ModelOptions opts;
  opts.weight_store = store;
  Model a(make(), opts), b(make(), opts);
  const int64_t weights_only = store->BytesLive();
  const Tensor ya = a.Run({{"x", x}})[0].second;
  const int64_t after_a = store->BytesLive();
  const size_t packs = store->NumDerivedLive();
  EXPECT_GE(packs, 1u) << "a weight is packed through the store";
  EXPECT_GT(after_a, weights_only) << "packed weights are charged to the store";
  const Tensor yb = b.Run({{"x", x}})[0].second;
  EXPECT_EQ(store->NumDerivedLive(), packs) << "the second model reuses the first's packs";
  EXPECT_EQ(store->BytesLive(), after_a) << "and adds no bytes";
  EXPECT_EQ(ya.nbytes(), yb.nbytes());
  if (ya.nbytes() == yb.nbytes()) {
    EXPECT_EQ(std::memcmp(ya.raw(), yb.raw(), ya.nbytes()), 0);
  }
  Model alone(make());
  ExpectTensorNear(alone.Run({{"x", x}})[0].second, ya);
  return {a.PlanFor({{"x", x}})->KernelCounts(), ya};
}

// A conv and a matmul weight, on oneDNN's kernels.
TEST(Runtime, PackedWeightsSharedAcrossModelsAndCounted) {
  ExpectPacksShared(
      [] {
        GraphBuilder b("packed", 13);
        auto x = b.Input("x", DType::kF32, {2, 16, 12, 12});
        auto conv =
            b.Op("Conv", {x, b.Constant(RandomTensor({32, 16, 3, 3}, 11))}, {{"pads", Attribute::Ints({1, 1, 1, 1})}});
        auto pooled = b.Op("Flatten", {b.Op("GlobalAveragePool", {conv})});
        b.Output(b.Op("MatMul", {pooled, b.Constant(RandomTensor({32, 24}, 12))}), "y");
        return b.Finish();
      },
      RandomTensor({2, 16, 12, 12}, 5));
}

// osprey's own 1x1 SiLU convolution (kernels/cpu/pointwise_conv.cc) packs its weights through the store too. The
// input is channels-last behind a Transpose, so the convolution gets channels-last tensors; OSPREY_POINTWISE=1 takes
// the kernel without timing.
TEST(Runtime, PointwisePacksSharedAcrossModels) {
  if (!__builtin_cpu_supports("avx512f")) GTEST_SKIP() << "osprey's 1x1 convolution needs AVX-512";
  auto make = [] {
    GraphBuilder b("pointwise", 13);
    auto x = b.Input("x", DType::kF32, {1, 9, 9, 24});
    auto xt = b.Op("Transpose", {x}, {{"perm", Attribute::Ints({0, 3, 1, 2})}});
    auto conv = b.Op("Conv", {xt, b.Constant(RandomTensor({40, 24, 1, 1}, 21)), b.Constant(RandomTensor({40}, 22))});
    auto silu = b.Op("Mul", {conv, b.Op("Sigmoid", {conv})});
    b.Output(b.Op("Transpose", {silu}, {{"perm", Attribute::Ints({0, 2, 3, 1})}}), "y");
    return b.Finish();
  };
  const Tensor x = RandomTensor({1, 9, 9, 24}, 6);
  Tensor y;
  {
    ScopedEnv always("OSPREY_POINTWISE", "1");
    const auto [kernels, out] = ExpectPacksShared(make, x);
    EXPECT_EQ(kernels.count("ConvF32Pointwise"), 1u);
    y = out;
  }
  ScopedEnv never("OSPREY_POINTWISE", "0");  // oneDNN's convolution and SiLU pass: the oracle
  ExpectTensorNear(Model(make()).Run({{"x", x}})[0].second, y);
}

// Subnormal floats are flushed to zero while a plan runs (core/float_env.h: arithmetic on them can run 100x slower),
// on the calling thread and on the OpenMP workers of oneDNN's convolution and of osprey's own kernels alike; the
// caller's floating-point mode is as it was afterwards. The oracle: IEEE arithmetic here, where every product below
// (1e-20 x 1e-20, 1e-30 x 1e-10) is a subnormal greater than zero.
volatile float g_tiny = 1e-30f, g_scale = 1e-10f;  // read at run time: the product is computed, not folded
// Each of `threads` OpenMP threads' product of the two (a barrier first, so that every part runs on its own thread).
std::vector<float> ThreadProducts(int threads) {
  std::vector<float> got(threads, -1.f);
#pragma omp parallel num_threads(threads)
  {
#pragma omp barrier
    got[omp_get_thread_num()] = g_tiny * g_scale;
  }
  return got;
}

TEST(Runtime, PlansFlushSubnormalsToZeroAndLeaveTheCallersModeAsItWas) {
  // The workers exist before any plan runs, created in IEEE mode (PyTorch's, started before osprey's first call; run
  // under OSPREY_OMP_RUNTIME=libgomp too: tests/e2e/test_omp_default.py).
  for (float v : ThreadProducts(2)) ASSERT_GT(v, 0.f);
  GraphBuilder b("subnormal", 13);
  auto x = b.Input("x", DType::kF32, {4, 8, 64, 64});
  b.Output(b.Op("Mul", {x, b.Constant(Tensor::Scalar<float>(1e-10f))}), "product");
  b.Output(b.Op("Conv", {x, b.Constant(F32({16, 8, 1, 1}, std::vector<float>(128, 1e-20f)))}), "conv");
  ModelOptions opts;
  opts.compile.num_threads = 2;
  Model model(b.Finish(), opts);
  Tensor in = Tensor::Zeros(DType::kF32, {4, 8, 64, 64});
  for (int64_t i = 0; i < in.numel(); ++i) in.data<float>()[i] = i % 2 ? 1e-30f : 1e-20f;
  ASSERT_GT(g_tiny * g_scale, 0.f) << "this thread flushes subnormals already";
  const auto out = model.Run({{"x", in}});
  for (const auto& [name, t] : out) {
    for (int64_t i = 0; i < t.numel(); ++i) {
      if (t.data<float>()[i] != 0.f && !(name == "product" && i % 2 == 0)) {  // 1e-20 x 1e-10 is a normal float
        ADD_FAILURE() << name << "[" << i << "] = " << t.data<float>()[i] << ", not flushed to zero";
        break;
      }
    }
  }
  EXPECT_GT(g_tiny * g_scale, 0.f) << "the caller's floating-point mode was not restored";
  for (float v : ThreadProducts(2)) EXPECT_GT(v, 0.f) << "a worker's floating-point mode was not restored";
}

// The heap a plan's objects keep (kernels, oneDNN primitives, what its first run caches), measured around its compile
// and its first run, is charged to its model until the plan goes, so that a server's memory budget sees it; models
// run as parts (a data-dependent op) too. The oracle: the C library's own count of heap in use, read around them here.
TEST(Runtime, PlanObjectsHeapIsChargedToTheModelUntilThePlanGoes) {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
  if (Allocator::Host().UntrackedHeapBytes() < 0) GTEST_SKIP() << "malloc is not glibc's here (a sanitizer's)";
  GraphBuilder b("conv", 13);
  auto x = b.Input("x", DType::kF32, {-1, 8, 10, 10});
  b.Output(b.Op("Relu", {b.Op("Conv", {x, b.Constant(RandomTensor({16, 8, 3, 3}, 3))},
                              {{"pads", Attribute::Ints({1, 1, 1, 1})}})}),
           "y");
  ModelOptions opts;
  opts.plan_cache_capacity = 1;
  opts.compile.num_threads = 1;
  Model model(b.Finish(), opts);
  auto heap_in_use = [] {
    const struct mallinfo2 info = mallinfo2();
    return static_cast<int64_t>(info.uordblks + info.hblkhd);
  };
  const Tensor x1 = RandomTensor({1, 8, 10, 10}, 4), x2 = RandomTensor({2, 8, 10, 10}, 5);
  const int64_t before = heap_in_use();
  const int64_t compiled = model.PlanFor({{"x", x1}})->heap_bytes();  // compiled, not run yet
  EXPECT_GT(compiled, 0);
  EXPECT_EQ(model.RuntimeBytes(), compiled);
  const Tensor y1 = model.Run({{"x", x1}})[0].second;
  const int64_t grown = heap_in_use() - before;  // the plan's objects, plus the output's buffer and handles
  const int64_t first = model.PlanFor({{"x", x1}})->heap_bytes();
  EXPECT_GE(first, compiled);
  EXPECT_LE(first, grown);
  EXPECT_EQ(model.RuntimeBytes(), first) << "charged to the model (its arena went back to the shared pool)";
  model.Run({{"x", x1}});
  EXPECT_EQ(model.RuntimeBytes(), first) << "measured at the first run only";
  model.Run({{"x", x2}});  // a second plan pushes the first out of the cache (capacity 1)
  const int64_t second = model.PlanFor({{"x", x2}})->heap_bytes();
  EXPECT_GT(second, 0);
  EXPECT_EQ(model.RuntimeBytes(), second) << "the first plan's charge went with it";

  GraphBuilder n("nonzero");
  auto nx = n.Input("x", DType::kF32, {4, 4});
  auto nz = n.Op("NonZero", {n.Op("Relu", {nx})});  // a part before the cut, one after
  n.Output(n.Op("Neg", {n.Op("Cast", {nz}, {{"to", Attribute::Int(1)}})}), "y");
  Model parts(n.Finish());
  EXPECT_EQ(parts.RuntimeBytes(), 0);
  parts.Run({{"x", RandomTensor({4, 4}, 6)}});
  EXPECT_GT(parts.RuntimeBytes(), 0) << "a model run as parts is charged for its parts' plans";
  EXPECT_LT(parts.RuntimeBytes(), 1 << 20);
#else
  GTEST_SKIP() << "the C library cannot count its heap (glibc >= 2.33: mallinfo2)";
#endif
}

// glibc's count of its heap walks every free chunk (3 ms per reading in a process that had compiled ~100 shapes), so a
// model's first HeapMeasure::kSampled compiles and first runs are measured, then one in kEstimatesPerMeasure + 1, and
// the others charged the mean of the last measures.
TEST(Runtime, PlanHeapIsMeasuredForAModelsFirstShapesThenEstimated) {
  if (Allocator::Host().UntrackedHeapBytes() < 0) GTEST_SKIP() << "malloc is not glibc's here (a sanitizer's)";
  auto graph = [] {
    GraphBuilder b("conv");
    auto x = b.Input("x", DType::kF32, {1, 8, -1, -1});
    b.Output(b.Op("Relu", {b.Op("Conv", {x, b.Constant(RandomTensor({16, 8, 3, 3}, 3))},
                                {{"pads", Attribute::Ints({1, 1, 1, 1})}})}),
             "y");
    return b.Finish();
  };
  ModelOptions opts;
  opts.plan_cache_capacity = 16;
  opts.compile.num_threads = 1;
  Model model(graph(), opts);
  constexpr int kSampled = 4;  // HeapMeasure::kSampled (runtime/plan_impl.h)
  auto run = [&](int64_t side) { model.Run({{"x", RandomTensor({1, 8, side, side}, 4)}}); };
  const int64_t start = HeapMeasure::Readings();
  for (int i = 0; i < kSampled; ++i) run(10 + i);
  EXPECT_EQ(HeapMeasure::Readings() - start, 4 * kSampled) << "two readings around each compile and first run";
  const int64_t measured = model.RuntimeBytes();
  EXPECT_GT(measured, 0);
  const int64_t before = HeapMeasure::Readings();
  for (int i = 0; i < 3; ++i) run(20 + i);
  EXPECT_EQ(HeapMeasure::Readings(), before) << "later shapes read nothing";
  // Each later plan is charged the mean (per phase, each rounded down) of the measured ones.
  EXPECT_NEAR(static_cast<double>(model.RuntimeBytes() - measured), 3.0 * measured / kSampled, 3 * 2);
  for (int i = 3; i < HeapMeasure::kEstimatesPerMeasure; ++i) run(30 + i);
  EXPECT_EQ(HeapMeasure::Readings(), before);
  run(60);  // then one in kEstimatesPerMeasure + 1 is measured again: the estimate follows the process's state
  EXPECT_EQ(HeapMeasure::Readings() - before, 4);
  Model other(graph(), opts);  // another model is measured from its first shape
  other.Run({{"x", RandomTensor({1, 8, 30, 30}, 5)}});
  EXPECT_EQ(HeapMeasure::Readings() - before, 8);
}

TEST(Runtime, LargeOutputBuffersAreReusedOnceDroppedAndTrimmedWhenIdle) {
  // A 1 MiB output (above the mmap threshold) comes from the plan's output pool: the block a dropped result held is
  // the next run's, a result still held keeps its own, and TrimArenas frees idle blocks.
  GraphBuilder b("big_output");
  auto x = b.Input("x", DType::kF32, {256, 1024});
  b.Output(b.Op("Relu", {x}), "y");
  Graph g = b.Finish();
  auto plan = Compile(g, {{DType::kF32, {256, 1024}}});
  const Tensor in = RandomTensor({256, 1024}, 3);
  const void* first_data = nullptr;
  {
    std::vector<Tensor> first = plan->Run({in});
    first_data = first[0].raw();
    EXPECT_EQ(first[0].data<float>()[5], std::max(0.f, in.data<float>()[5]));
  }
  std::vector<Tensor> second = plan->Run({in});
  EXPECT_EQ(second[0].raw(), first_data) << "the dropped result's block is reused";
  std::vector<Tensor> third = plan->Run({in});
  EXPECT_NE(third[0].raw(), second[0].raw()) << "a result still held is never handed out again";
  for (int64_t i = 0; i < in.numel(); ++i) ASSERT_EQ(third[0].data<float>()[i], std::max(0.f, in.data<float>()[i]));
  second.clear();
  third.clear();
  EXPECT_GE(plan->TrimArenas(0), size_t{2} << 20) << "both idle output blocks are freed";
  EXPECT_EQ(plan->TrimArenas(0), 0u);
}

TEST(Runtime, SingleThreadStepsRunOnOneThreadAndLeaveTheCallersCount) {
  // OSPREY_STEP_THREADS=1 (read at each compile) puts the small Gemm on one thread untimed. The plan switches the OpenMP count around it and hands the caller back the plan's count.
  setenv("OSPREY_STEP_THREADS", "1", 1);
  GraphBuilder b("small_gemm");
  auto x = b.Input("x", DType::kF32, {2, 16});
  b.Output(b.Op("Gemm", {x, b.Constant(RandomTensor({16, 8}, 4))}), "y");  // the last step
  Graph g = b.Finish();
  CompileOptions options;
  options.num_threads = 2;
  auto plan = Compile(g, {{DType::kF32, {2, 16}}}, options);
  unsetenv("OSPREY_STEP_THREADS");  // later compiles in this process (one binary run) time their steps again
  if (!cpu::TuningEnabled()) GTEST_SKIP() << "OSPREY_TUNE=0: no per-step thread choice";
  EXPECT_EQ(plan->num_single_thread_steps(), 1u);
  omp_set_num_threads(2);
  const Tensor in = RandomTensor({2, 16}, 5);
  const Tensor y = plan->Run({in})[0];
  EXPECT_EQ(omp_get_max_threads(), 2) << "the last step ran on one thread; the caller's count comes back";
  Model reference(std::move(g), ModelOptions{});
  ExpectTensorNear(y, reference.Run({{"x", in}})[0].second);
}

TEST(Runtime, FreshGraphPerItemDoesNotAccumulate) {
  // The TF1 failure: a new small graph per item. Here each graph is a value; memory returns to the baseline (the
  // idle arenas of the shared pool freed).
  TrimSharedArenas(0);
  const int64_t before = Allocator::Host().BytesLive();
  PlanCache cache(4);
  for (int i = 0; i < 200; ++i) {
    int64_t h = 8 + (i * 37) % 50, w = 8 + (i * 91) % 60;
    GraphBuilder b("item");
    auto x = b.Input("x", DType::kF32, {1, 3, h, w});
    auto y = b.Op("Slice", {x, b.Constant(I64({2}, {1, 1})), b.Constant(I64({2}, {h - 1, w - 1})),
                            b.Constant(I64({2}, {2, 3}))});
    auto z = b.Op("Div", {b.Op("Sub", {y, b.Constant(Tensor::Scalar<float>(0.5f))}), b.Constant(Tensor::Scalar<float>(0.25f))});
    b.Output(z, "z");
    Graph g = b.Finish();
    Tensor in = RandomTensor({1, 3, h, w}, i);
    auto plan = cache.GetOrCompile(g.Fingerprint(), {{DType::kF32, in.shape()}}, {}, [&] {
      return Compile(g, {{DType::kF32, in.shape()}});
    });
    Tensor out = plan->Run({in})[0];
    ASSERT_EQ(out.dim(2), h - 2);
    EXPECT_FLOAT_EQ(out.data<float>()[0], (in.data<float>()[1 * w + 1] - 0.5f) / 0.25f);
  }
  EXPECT_LE(cache.stats().size, 4u);
  cache.Clear();
  TrimSharedArenas(0);
  EXPECT_EQ(Allocator::Host().BytesLive(), before);
}

}  // namespace
}  // namespace osprey

namespace osprey {
namespace {

TEST(Runtime, ChannelsLastPlanMatchesReference) {
  // conv -> (Mul by per-channel const, Add scalar, Sigmoid) -> concat with a second conv -> maxpool -> conv with a
  // residual from the concat -> BN + Relu -> Transpose (needs plain data) and a second output through Flatten.
  GraphBuilder b("layouts", 13);
  auto x = b.Input("x", DType::kF32, {2, 3, 11, 9});
  auto c1 = b.Op("Conv", {x, b.Constant(RandomTensor({5, 3, 3, 3}, 1))}, {{"pads", Attribute::Ints({1, 1, 1, 1})}});
  auto e = b.Op("Sigmoid", {b.Op("Add", {b.Op("Mul", {c1, b.Constant(RandomTensor({1, 5, 1, 1}, 2))}),
                                         b.Constant(Tensor::Scalar<float>(0.25f))})});
  auto c2 = b.Op("Conv", {x, b.Constant(RandomTensor({3, 3, 1, 1}, 3))});
  auto cat = b.Op("Concat", {e, c2}, {{"axis", Attribute::Int(1)}});
  auto pool = b.Op("MaxPool", {cat}, {{"kernel_shape", Attribute::Ints({2, 2})}, {"strides", Attribute::Ints({2, 2})}});
  auto c3 = b.Op("Conv", {pool, b.Constant(RandomTensor({8, 8, 3, 3}, 4))}, {{"pads", Attribute::Ints({1, 1, 1, 1})}});
  auto sum = b.Op("Add", {c3, pool});
  auto bn = b.Op("Relu", {b.Op("BatchNormalization", {sum, b.Constant(RandomTensor({8}, 5, 0.5f, 1.5f)),
                                                       b.Constant(RandomTensor({8}, 6)), b.Constant(RandomTensor({8}, 7)),
                                                       b.Constant(RandomTensor({8}, 8, 0.5f, 2.f))})});
  b.Output(b.Op("Transpose", {bn}, {{"perm", Attribute::Ints({0, 2, 3, 1})}}), "nhwc_out");
  b.Output(b.Op("Flatten", {cat}), "flat");
  Graph g = b.Finish();
  Tensor in = RandomTensor({2, 3, 11, 9}, 11);
  CompileOptions reference;
  reference.fast_kernels = false;
  reference.fuse = false;
  auto want = Compile(g, {{DType::kF32, in.shape()}}, reference)->Run({in});
  auto got = Compile(g, {{DType::kF32, in.shape()}})->Run({in});
  ASSERT_EQ(got.size(), 2u);
  ExpectTensorNear(got[0], want[0], 1e-4f, 1e-4f);
  ExpectTensorNear(got[1], want[1], 1e-4f, 1e-4f);
}

}  // namespace
}  // namespace osprey

namespace osprey {
namespace {

TEST(Runtime, IdentityLikeNodesAreRemoved) {
  GraphBuilder b("ids", 13);
  auto x = b.Input("x", DType::kF32, {1, 2, 3, 3});
  auto i = b.Op("Identity", {x});
  auto d = b.Op("Dropout", {i});
  auto p = b.Op("Pad", {d, b.Constant(Tensor::FromVector<int64_t>({8}, {0, 0, 0, 0, 0, 0, 0, 0}))});
  auto real_pad = b.Op("Pad", {p, b.Constant(Tensor::FromVector<int64_t>({8}, {0, 0, 1, 0, 0, 0, 0, 0}))});
  b.Output(b.Op("Neg", {real_pad}), "y");
  Graph g = b.Finish();
  auto plan = Compile(g, {{DType::kF32, {1, 2, 3, 3}}});
  EXPECT_EQ(plan->num_steps(), 2u) << "only the non-zero Pad and Neg remain";
  Tensor in = RandomTensor({1, 2, 3, 3}, 3);
  Tensor out = plan->Run({in})[0];
  ASSERT_EQ(ShapeToString(out.shape()), "[1, 2, 4, 3]");
  EXPECT_EQ(out.data<float>()[0], 0.f);  // the padded row, negated zero
  EXPECT_EQ(out.data<float>()[3], -in.data<float>()[0]);
}

// An Identity naming a graph output (how PaddleOCR's exports end): the node writing its input writes the output
// itself when nothing else reads that input; a value also read elsewhere, and a graph input, keep their copy.
TEST(Runtime, IdentityNamingAGraphOutputIsWrittenByItsProducer) {
  Tensor in = RandomTensor({2, 5}, 4);
  std::vector<float> want(10);
  for (int r = 0; r < 2; ++r) {
    const float* x = in.data<float>() + r * 5;
    double sum = 0;
    for (int j = 0; j < 5; ++j) sum += std::exp(double(x[j]));
    for (int j = 0; j < 5; ++j) want[r * 5 + j] = static_cast<float>(std::exp(double(x[j])) / sum);
  }
  for (int variant = 0; variant < 3; ++variant) {
    SCOPED_TRACE("variant " + std::to_string(variant));
    GraphBuilder b("out_identity", 13);
    auto x = b.Input("x", DType::kF32, {2, 5});
    if (variant == 2) {
      b.Output(b.Op("Identity", {x}), "y");
    } else {
      auto soft = b.Op("Softmax", {x});
      b.Output(b.Op("Identity", {soft}), "y");
      if (variant == 1) b.Output(b.Op("Neg", {soft}), "neg");
    }
    Graph g = b.Finish();
    auto plan = Compile(g, {{DType::kF32, {2, 5}}});
    EXPECT_EQ(plan->num_steps(), variant == 0 ? 1u : (variant == 1 ? 3u : 1u));
    std::vector<Tensor> out = plan->Run({in});
    ASSERT_EQ(ShapeToString(out[0].shape()), "[2, 5]");
    for (int k = 0; k < 10; ++k) {
      const float expected = variant == 2 ? in.data<float>()[k] : want[k];
      EXPECT_NEAR(out[0].data<float>()[k], expected, 1e-6f) << k;
      if (variant == 1) {
        EXPECT_NEAR(out[1].data<float>()[k], -want[k], 1e-6f) << k;
      }
    }
  }
}

}  // namespace
}  // namespace osprey

namespace osprey {
namespace {

TEST(Runtime, ZeroPadFoldsIntoAveragePoolAndConv) {
  // Pad(1, 2 on H; 0, 1 on W) -> AveragePool 3x3 (count_include_pad 0) and Pad -> Conv: the pads move into the consumer.
  GraphBuilder b("padfold", 13);
  auto x = b.Input("x", DType::kF32, {1, 5, 9, 7});
  auto pads = b.Constant(Tensor::FromVector<int64_t>({8}, {0, 0, 1, 0, 0, 0, 2, 1}));
  auto pool = b.Op("AveragePool", {b.Op("Pad", {x, pads})}, {{"kernel_shape", Attribute::Ints({3, 3})}});
  auto conv = b.Op("Conv", {b.Op("Pad", {x, pads}), b.Constant(RandomTensor({4, 5, 3, 3}, 9))});
  b.Output(pool, "pool");
  b.Output(conv, "conv");
  Graph g = b.Finish();
  Tensor in = RandomTensor({1, 5, 9, 7}, 10);
  CompileOptions reference;
  reference.fast_kernels = false;
  reference.fuse = false;
  auto want = Compile(g, {{DType::kF32, in.shape()}}, reference)->Run({in});
  auto plan = Compile(g, {{DType::kF32, in.shape()}});
  EXPECT_EQ(plan->num_steps(), 2u) << "both Pads fold into their consumers";
  auto got = plan->Run({in});
  ExpectTensorNear(got[0], want[0], 1e-5f, 1e-5f);
  ExpectTensorNear(got[1], want[1], 1e-4f, 1e-4f);
}

// Deadlines (RunDeadline): checked before every step, per thread, the earliest of nested ones applying; a stopped run
// leaves the model as it was. Oracles: the code and message of the error, and the same model's output without one.
TEST(RunDeadline, StopsRunsAtTheNextStepOfTheirThread) {
  using Clock = RunDeadline::Clock;
  GraphBuilder b("chain", 13);
  auto x = b.Input("x", DType::kF32, {256, 256});
  auto w = b.Constant(RandomTensor({256, 256}, 5));
  ValueRef v = x;
  for (int i = 0; i < 64; ++i) v = b.Op("Tanh", {b.Op("MatMul", {v, w})});  // 2.1 GFLOP: never done in 3 ms
  b.Output(v, "y");
  Model model(b.Finish());
  const Tensor in = RandomTensor({256, 256}, 1);
  const auto want = model.Run({{"x", in}});
  auto expect_stopped_as = [&](ErrorCode code) {
    try {
      model.Run({{"x", in}});
      ADD_FAILURE() << "the run was not stopped";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
    }
  };
  auto expect_stopped = [&](const std::string& reason) {
    try {
      model.Run({{"x", in}});
      ADD_FAILURE() << "the run outlived its deadline (" << reason << ")";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kDeadlineExceeded) << e.what();
      EXPECT_EQ(std::string(e.what()).rfind("deadline exceeded (" + reason + "): the run stopped after ", 0), 0u)
          << e.what();
    }
  };
  {
    const RunDeadline far(Clock::now() + std::chrono::hours(1), "far");
    ExpectTensorNear(model.Run({{"x", in}})[0].second, want[0].second, 0.f, 0.f);
  }
  {
    const RunDeadline passed(Clock::now() - std::chrono::milliseconds(1), "passed");
    EXPECT_TRUE(RunDeadline::Passed());
    expect_stopped("passed");
  }
  {
    const RunDeadline soon(Clock::now() + std::chrono::milliseconds(3), "soon");
    expect_stopped("soon");  // mid-run, or before it if this thread was descheduled for 3 ms
  }
  {
    const RunDeadline outer(Clock::now() - std::chrono::milliseconds(1), "outer");
    const RunDeadline inner(Clock::now() + std::chrono::hours(1), "inner");
    expect_stopped("outer");
    std::thread other([&] {  // another thread's runs have no deadline
      EXPECT_FALSE(RunDeadline::Passed());
      ExpectTensorNear(model.Run({{"x", in}})[0].second, want[0].second, 0.f, 0.f);
    });
    other.join();
  }
  {
    const RunDeadline outer(Clock::now() + std::chrono::hours(1), "outer");
    const RunDeadline inner(Clock::now() - std::chrono::milliseconds(1), "inner");
    expect_stopped("inner");
  }
  EXPECT_FALSE(RunDeadline::Passed());
  ExpectTensorNear(model.Run({{"x", in}})[0].second, want[0].second, 0.f, 0.f);  // stopped runs left nothing behind

  // Cancelled from another thread mid-run: kCancelled with the cancel reason (no deadline set).
  std::atomic<bool> gone{false};
  {
    const RunDeadline cancel(
        Clock::time_point::max(), "", [&gone] { return gone.load(); }, "caller left");
    EXPECT_FALSE(RunDeadline::Passed());
    std::thread leaver([&gone] {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      gone = true;
    });
    try {
      for (int i = 0; i < 1000; ++i) model.Run({{"x", in}});  // far longer than 2 ms
      ADD_FAILURE() << "the cancelled runs went on";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kCancelled) << e.what();
      EXPECT_EQ(std::string(e.what()).rfind("cancelled (caller left): the run stopped after ", 0), 0u) << e.what();
    }
    leaver.join();
    // An inner deadline far away does not hide the outer cancel check.
    const RunDeadline inner(Clock::now() + std::chrono::hours(1), "inner");
    expect_stopped_as(ErrorCode::kCancelled);
  }
}

}  // namespace
}  // namespace osprey
