// Device placement on a fake device (tests/fake_device.h): which steps run where, the copies between, device weights
// shared through the WeightStore, arenas and streams returned, and the context released only with nothing live.
#include <gtest/gtest.h>

#include <thread>

#include "fake_device.h"
#include "osprey/runtime.h"
#include "test_util.h"

namespace osprey {
namespace {

using testing::ExpectTensorNear;
using testing::FakeDevice;
using testing::RandomTensor;
using testing::ScopedFakeDevice;

// x[N, 3, 8, 8] -> Conv -> Relu -> Softmax(axis 1) -> Add(conv) -> MaxPool -> Flatten -> Gemm -> y; the Relu output is
// a second graph output (read by later steps too).
Graph SmallNet(uint32_t seed = 1) {
  GraphBuilder b("small");
  auto x = b.Input("x", DType::kF32, {-1, 3, 8, 8});
  auto w = b.Constant(RandomTensor({4, 3, 3, 3}, seed));
  auto bias = b.Constant(RandomTensor({4}, seed + 1));
  auto conv = b.Op("Conv", {x, w, bias}, {{"pads", Attribute::Ints({1, 1, 1, 1})}});
  auto relu = b.Op("Relu", {conv});
  auto soft = b.Op("Softmax", {relu}, {{"axis", Attribute::Int(1)}});
  auto sum = b.Op("Add", {soft, conv});
  auto pool = b.Op("MaxPool", {sum}, {{"kernel_shape", Attribute::Ints({2, 2})}, {"strides", Attribute::Ints({2, 2})}});
  auto flat = b.Op("Flatten", {pool});
  auto gw = b.Constant(RandomTensor({64, 5}, seed + 2));
  auto gb = b.Constant(RandomTensor({5}, seed + 3));
  b.Output(b.Op("Gemm", {flat, gw, gb}), "y");
  b.Output(relu, "relu");
  return b.Finish();
}

CompileOptions OnDevice() {
  CompileOptions o;
  o.device = {Device::kCuda, 0};
  o.fuse = false;  // keep Relu a node of its own, so placement splits the graph where the test says
  return o;
}

std::vector<Tensor> RunHost(const Graph& g, const Tensor& x) {
  CompileOptions o;
  o.fast_kernels = false;
  o.fuse = false;
  return Compile(g, {{DType::kF32, x.shape()}}, o)->Run({x});
}

TEST(DevicePlan, MixedPlacementMatchesTheHostAndCopiesOnlyAtBoundaries) {
  ScopedFakeDevice device({"Conv", "Relu", "Add", "Gemm", "Flatten"});
  const Graph g = SmallNet();
  const Tensor x = RandomTensor({2, 3, 8, 8}, 7);
  const auto want = RunHost(g, x);
  {
    auto plan = Compile(g, {{DType::kF32, {2, 3, 8, 8}}}, OnDevice());
    // Device: Conv, Relu, Add, Gemm and the copies to the device: x, Softmax's output, Flatten's output (Flatten
    // follows its input, MaxPool's, on the host). Host: Softmax, MaxPool, Flatten and the copies back: Relu's (a graph
    // output, which Softmax reads too: one copy serves both), Add's for MaxPool, Gemm's (the graph output y). Add
    // reads Conv's output where it is, on the device.
    EXPECT_EQ(plan->num_device_steps(), 4u + 3u);
    EXPECT_EQ(plan->num_copy_steps(), 3u + 3u);
    EXPECT_GT(plan->device_arena_bytes(), 0u);
    EXPECT_EQ(plan->HostFallbackOps(), (std::map<std::string, int>{{"MaxPool", 1}, {"Softmax", 1}}));
    std::vector<OpProfile> profile;
    auto got = plan->Run({x}, &profile);
    ASSERT_EQ(got.size(), 2u);
    ExpectTensorNear(got[0], want[0], 1e-5f, 1e-5f);
    ExpectTensorNear(got[1], want[1], 1e-6f, 1e-6f);
    int copies = 0, fake = 0;
    for (const OpProfile& p : profile) {
      copies += p.kernel == "CopyToDevice" || p.kernel == "CopyToHost";
      fake += p.kernel == "FakeDevice";
    }
    EXPECT_EQ(copies, 6);
    EXPECT_EQ(fake, 4);
    EXPECT_EQ(device->streams_out(), 0);
    EXPECT_GT(device->bytes_used(), 0);  // the weights' device copies and the pooled device arena
  }
  EXPECT_EQ(device->bytes_used(), 0) << "dropping the plan frees its device memory";
}

TEST(DevicePlan, EverythingOnTheDeviceCopiesOnlyInputsAndOutputs) {
  ScopedFakeDevice device({"Conv", "Relu", "Softmax", "Add", "MaxPool", "Flatten", "Gemm"});
  const Graph g = SmallNet(3);
  const Tensor x = RandomTensor({1, 3, 8, 8}, 9);
  auto plan = Compile(g, {{DType::kF32, {1, 3, 8, 8}}}, OnDevice());
  EXPECT_EQ(plan->num_copy_steps(), 3u);  // x up; y and relu down
  EXPECT_TRUE(plan->HostFallbackOps().empty());
  auto got = plan->Run({x});
  const auto want = RunHost(g, x);
  ExpectTensorNear(got[0], want[0], 1e-5f, 1e-5f);
  ExpectTensorNear(got[1], want[1], 1e-6f, 1e-6f);
}

// Reshape, Flatten, a one-run Slice or Gather of a value made on the device are views of it in the device arena: no
// kernel, no copy (the fake device inverts every byte it moves between host and device, so a view at a wrong place or
// a missing copy gives garbage).
TEST(DevicePlan, SameBytesStepsOnTheDeviceAreViews) {
  ScopedFakeDevice device({"Conv", "Relu"});
  GraphBuilder b("views");
  auto x = b.Input("x", DType::kF32, {1, 3, 8, 8});
  auto conv = b.Op("Conv", {x, b.Constant(RandomTensor({4, 3, 3, 3}, 2))}, {{"pads", Attribute::Ints({1, 1, 1, 1})}});
  auto reshaped = b.Op("Reshape", {conv, b.Constant(Tensor::FromVector<int64_t>({4}, {1, 4, 64, 1}))});
  auto relu = b.Op("Relu", {reshaped});
  auto sliced = b.Op(
      "Slice", {relu, b.Constant(Tensor::FromVector<int64_t>({1}, {1})),
                b.Constant(Tensor::FromVector<int64_t>({1}, {3})), b.Constant(Tensor::FromVector<int64_t>({1}, {1}))});
  auto picked =
      b.Op("Gather", {sliced, b.Constant(Tensor::FromVector<int64_t>({}, {1}))}, {{"axis", Attribute::Int(1)}});
  b.Output(b.Op("Relu", {b.Op("Flatten", {picked})}), "y");
  const Graph g = b.Finish();
  const Tensor in = RandomTensor({1, 3, 8, 8}, 21);
  auto plan = Compile(g, {{DType::kF32, {1, 3, 8, 8}}}, OnDevice());
  EXPECT_EQ(plan->num_copy_steps(), 2u);  // x up, y down
  EXPECT_TRUE(plan->HostFallbackOps().empty());
  std::vector<OpProfile> profile;
  ExpectTensorNear(plan->Run({in}, &profile)[0], RunHost(g, in)[0], 1e-5f, 1e-5f);
  int views = 0;
  for (const OpProfile& p : profile) views += p.kernel == "SameBytesOnDevice";
  EXPECT_EQ(views, 4);
  EXPECT_EQ(device->copies_on_device(), 0) << "every same-bytes step became a view";
  ExpectTensorNear(plan->Run({in})[0], RunHost(g, in)[0], 1e-5f, 1e-5f);
}

TEST(DevicePlan, NothingOnTheDeviceIsAHostPlan) {
  ScopedFakeDevice device({});
  const Graph g = SmallNet(5);
  const Tensor x = RandomTensor({1, 3, 8, 8}, 11);
  auto plan = Compile(g, {{DType::kF32, {1, 3, 8, 8}}}, OnDevice());
  EXPECT_EQ(plan->num_device_steps(), 0u);
  EXPECT_EQ(plan->num_copy_steps(), 0u);
  ExpectTensorNear(plan->Run({x})[0], RunHost(g, x)[0], 1e-5f, 1e-5f);
}

TEST(DevicePlan, ConcurrentRunsEachGetTheirOwnArenaAndStream) {
  ScopedFakeDevice device({"Conv", "Relu", "Add", "Gemm", "Flatten"});
  const Graph g = SmallNet(2);
  auto plan = Compile(g, {{DType::kF32, {1, 3, 8, 8}}}, OnDevice());
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20; ++i) {
        const Tensor x = RandomTensor({1, 3, 8, 8}, 100 + t * 20 + i);
        auto got = plan->Run({x});
        auto want = RunHost(g, x);
        bool same = got[0].numel() == want[0].numel();
        for (int64_t k = 0; same && k < got[0].numel(); ++k)
          same = std::fabs(got[0].data<float>()[k] - want[0].data<float>()[k]) <= 1e-4f;
        ok[t] += same;
      }
    });
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(ok[t], 20) << "thread " << t;
  EXPECT_EQ(device->streams_out(), 0);
}

TEST(DevicePlan, TenantsOnOneBackboneHoldOneDeviceCopyOfItsWeights) {
  ScopedFakeDevice device({"Conv", "Relu", "Softmax", "Add", "MaxPool", "Flatten", "Gemm"});
  auto store = std::make_shared<WeightStore>();
  ModelOptions mo;
  mo.compile = OnDevice();
  mo.weight_store = store;
  const Tensor x = RandomTensor({1, 3, 8, 8}, 4);
  auto first = std::make_unique<Model>(SmallNet(8), mo);
  first->Run({{"x", x}});
  const int64_t device_weights = store->DeviceBytesLive();
  EXPECT_GE(device_weights, (4 * 3 * 3 * 3 + 4 + 64 * 5 + 5) * 4);
  std::vector<std::unique_ptr<Model>> tenants;
  for (int i = 0; i < 4; ++i) {
    tenants.push_back(std::make_unique<Model>(SmallNet(8), mo));
    tenants.back()->Run({{"x", x}});
  }
  EXPECT_EQ(store->DeviceBytesLive(), device_weights) << "four more models on the same weights upload none";
  tenants.clear();
  first.reset();
  EXPECT_EQ(store->DeviceBytesLive(), 0);
  EXPECT_EQ(device->bytes_used(), 0);
}

// A model's device bytes (its device arenas and its weights' device copies, shared ones counted for each model) are
// counted apart from its host bytes: a host memory budget never sees GPU memory.
TEST(DevicePlan, ModelsCountTheirDeviceBytesApartFromHostBytes) {
  ScopedFakeDevice device({"Conv", "Relu", "Softmax", "Add", "MaxPool", "Flatten", "Gemm"});
  {
    auto account = std::make_shared<MemoryAccount>("test");
    auto buffer = Allocator::Host().AllocateOn(Device::kCuda, 0, 1000, account);
    EXPECT_EQ(account->BytesLive(), 0);
    EXPECT_EQ(account->DeviceBytesLive(), 1024);  // rounded to 256 bytes
    buffer.reset();
    EXPECT_EQ(account->DeviceBytesLive(), 0);
  }
  ModelOptions mo;
  mo.compile = OnDevice();
  mo.weight_store = std::make_shared<WeightStore>();
  const Tensor x = RandomTensor({1, 3, 8, 8}, 4);
  Model first(SmallNet(8), mo);
  EXPECT_EQ(first.DeviceBytes(), 0) << "nothing compiled yet";
  first.Run({{"x", x}});
  const int64_t one = first.DeviceBytes();
  EXPECT_EQ(one, device->bytes_used()) << "all the device memory there is: its weights and its arena";
  EXPECT_GT(one, mo.weight_store->DeviceBytesLive());
  Model second(SmallNet(8), mo);
  second.Run({{"x", x}});
  EXPECT_EQ(second.DeviceBytes(), one) << "its own arena, the shared weights";
  EXPECT_EQ(device->bytes_used(), 2 * one - mo.weight_store->DeviceBytesLive()) << "the weights are on the device once";
  Model on_cpu(SmallNet(8), ModelOptions{.weight_store = mo.weight_store});
  on_cpu.Run({{"x", x}});
  EXPECT_EQ(on_cpu.DeviceBytes(), 0);
}

TEST(DevicePlan, TheContextIsReleasedOnlyWithNothingLiveAndComesBack) {
  ScopedFakeDevice device({"Conv", "Relu", "Gemm", "Flatten"});
  const Graph g = SmallNet(6);
  const Tensor x = RandomTensor({1, 3, 8, 8}, 5);
  auto plan = Compile(g, {{DType::kF32, {1, 3, 8, 8}}}, OnDevice());
  plan->Run({x});
  EXPECT_TRUE(device->ContextActive(0));
  EXPECT_EQ(device->ContextsCreated(), 1);
  try {
    device->ReleaseContext(0);
    FAIL() << "released a context with live device buffers";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnavailable);
  }
  plan.reset();
  device->ReleaseContext(0);
  EXPECT_FALSE(device->ContextActive(0));
  plan = Compile(g, {{DType::kF32, {1, 3, 8, 8}}}, OnDevice());
  ExpectTensorNear(plan->Run({x})[0], RunHost(g, x)[0], 1e-5f, 1e-5f);
  EXPECT_EQ(device->ContextsCreated(), 2);
}

TEST(DevicePlan, DeviceOutOfMemoryIsAClearErrorAndLeaksNothing) {
  ScopedFakeDevice device({"Conv", "Relu", "Gemm", "Flatten"}, /*capacity=*/4000);  // weights fit, arena does not
  const Graph g = SmallNet(6);
  try {
    auto plan = Compile(g, {{DType::kF32, {64, 3, 8, 8}}}, OnDevice());
    plan->Run({RandomTensor({64, 3, 8, 8}, 1)});
    FAIL() << "ran past the device's capacity";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kResourceExhausted) << e.what();
  }
  EXPECT_EQ(device->bytes_used(), 0);
  EXPECT_EQ(device->streams_out(), 0);
}

TEST(DevicePlan, RefusedClearly) {
  {
    CompileOptions o;
    o.precision = Precision::kFp16;
    try {
      Compile(SmallNet(), {{DType::kF32, {1, 3, 8, 8}}}, o);
      FAIL();
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
      EXPECT_NE(std::string(e.what()).find("--device cuda"), std::string::npos) << e.what();
    }
  }
  InitDevices();
  DeviceBackend* builtin = GetDeviceBackend(Device::kCuda);
  if (builtin == nullptr || builtin->DeviceCount() == 0) {
    // This machine has no usable CUDA device (or osprey was built without CUDA): the error says so and what to do.
    try {
      Compile(SmallNet(), {{DType::kF32, {1, 3, 8, 8}}}, OnDevice());
      FAIL();
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
      EXPECT_NE(std::string(e.what()).find("--device cpu"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(DeviceSpecName(ParseDevice("cuda")), "cuda:0");
  EXPECT_EQ(DeviceSpecName(ParseDevice("cuda:3")), "cuda:3");
  EXPECT_EQ(ParseDevice("cpu").kind, Device::kHost);
  for (const char* bad : {"gpu", "cuda:", "cuda:x", "cuda:-1", "cuda:99999", "CUDA"})
    EXPECT_THROW(ParseDevice(bad), Error) << bad;
}

}  // namespace
}  // namespace osprey

namespace osprey {
namespace {

TEST(DevicePlan, AllDeviceRunsReplayOneGraphPerArena) {
  ScopedFakeDevice device({"Conv", "Relu", "Softmax", "Add", "MaxPool", "Flatten", "Gemm"});
  const Graph g = SmallNet(4);
  auto plan = Compile(g, {{DType::kF32, {1, 3, 8, 8}}}, OnDevice());
  // Run 1 warms up, run 2 captures (and replays what it recorded), runs 3.. replay: each with new input values, which
  // the uploads before the graph put at the addresses the graph reads.
  for (int i = 0; i < 5; ++i) {
    const Tensor x = RandomTensor({1, 3, 8, 8}, 40 + i);
    auto got = plan->Run({x});
    auto want = RunHost(g, x);
    ExpectTensorNear(got[0], want[0], 1e-5f, 1e-5f);
    ExpectTensorNear(got[1], want[1], 1e-6f, 1e-6f);
  }
  EXPECT_EQ(device->captures(), 1);
  EXPECT_EQ(device->replays(), 4);
  // Profiling runs step by step (per-kernel times), and still agrees.
  std::vector<OpProfile> profile;
  const Tensor x = RandomTensor({1, 3, 8, 8}, 99);
  ExpectTensorNear(plan->Run({x}, &profile)[0], RunHost(g, x)[0], 1e-5f, 1e-5f);
  EXPECT_EQ(device->replays(), 4);
  // Trimming the idle arena drops its graph: the next arena warms up and captures again.
  plan->TrimArenas(0);
  for (int i = 0; i < 3; ++i) ExpectTensorNear(plan->Run({x})[0], RunHost(g, x)[0], 1e-5f, 1e-5f);
  EXPECT_EQ(device->captures(), 2);
}

TEST(DevicePlan, MixedPlansAndBackendsWithoutGraphsRunStepByStep) {
  {
    ScopedFakeDevice device({"Conv", "Relu", "Add", "Gemm", "Flatten"});  // Softmax, MaxPool on the host
    const Graph g = SmallNet(4);
    auto plan = Compile(g, {{DType::kF32, {1, 3, 8, 8}}}, OnDevice());
    const Tensor x = RandomTensor({1, 3, 8, 8}, 3);
    for (int i = 0; i < 3; ++i) ExpectTensorNear(plan->Run({x})[0], RunHost(g, x)[0], 1e-5f, 1e-5f);
    EXPECT_EQ(device->captures(), 0);
  }
  {
    ScopedFakeDevice device({"Conv", "Relu", "Softmax", "Add", "MaxPool", "Flatten", "Gemm"});
    device->set_graphs(false);
    const Graph g = SmallNet(4);
    auto plan = Compile(g, {{DType::kF32, {1, 3, 8, 8}}}, OnDevice());
    const Tensor x = RandomTensor({1, 3, 8, 8}, 3);
    for (int i = 0; i < 3; ++i) ExpectTensorNear(plan->Run({x})[0], RunHost(g, x)[0], 1e-5f, 1e-5f);
    EXPECT_EQ(device->replays(), 0);
  }
}

}  // namespace
}  // namespace osprey
