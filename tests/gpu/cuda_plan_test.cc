// Whole plans on the GPU (issue 16): placement, uploads/downloads, CUDA Graph capture and replay, context release —
// against the same graph on the CPU reference kernels. Skipped without a CUDA device.
#include <gtest/gtest.h>

#include "kernels/cuda/cuda_backend.h"
#include "osprey/runtime.h"
#include "test_util.h"

namespace osprey {
namespace {

using testing::ExpectTensorNear;
using testing::RandomTensor;

bool HaveGpu() {
  InitDevices();
  DeviceBackend* b = GetDeviceBackend(Device::kCuda);
  return b && b->DeviceCount() > 0;
}

// A small CNN with the ops the zoo uses most: Conv (+BN folded, +Relu fused, + residual), pools, Gemm, Softmax.
Graph SmallCnn() {
  GraphBuilder b("cnn");
  auto x = b.Input("x", DType::kF32, {-1, 3, 32, 32});
  auto conv1 = b.Op("Conv", {x, b.Constant(RandomTensor({16, 3, 3, 3}, 1, -0.3f, 0.3f)), b.Constant(RandomTensor({16}, 2))},
                    {{"pads", Attribute::Ints({1, 1, 1, 1})}});
  auto bn = b.Op("BatchNormalization",
                 {conv1, b.Constant(RandomTensor({16}, 3, 0.5f, 1.5f)), b.Constant(RandomTensor({16}, 4)),
                  b.Constant(RandomTensor({16}, 5)), b.Constant(RandomTensor({16}, 6, 0.5f, 1.5f))});
  auto r1 = b.Op("Relu", {bn});
  auto conv2 = b.Op("Conv", {r1, b.Constant(RandomTensor({16, 1, 3, 3}, 7, -0.3f, 0.3f))},
                    {{"pads", Attribute::Ints({1, 1, 1, 1})}, {"group", Attribute::Int(16)}});
  auto sum = b.Op("Relu", {b.Op("Add", {conv2, r1})});
  auto pool = b.Op("MaxPool", {sum}, {{"kernel_shape", Attribute::Ints({2, 2})}, {"strides", Attribute::Ints({2, 2})}});
  auto gap = b.Op("GlobalAveragePool", {pool});
  auto flat = b.Op("Flatten", {gap});
  auto fc = b.Op("Gemm", {flat, b.Constant(RandomTensor({10, 16}, 8)), b.Constant(RandomTensor({10}, 9))},
                 {{"transB", Attribute::Int(1)}});
  b.Output(b.Op("Softmax", {fc}, {{"axis", Attribute::Int(1)}}), "probs");
  b.Output(fc, "logits");
  return b.Finish();
}

TEST(CudaPlan, WholePlanOnTheGpuAgreesAcrossGraphReplaysAndContextReleases) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device: these tests run where a GPU is (scripts/gpu-check)";
  DeviceBackend* gpu = GetDeviceBackend(Device::kCuda);
  const Graph g = SmallCnn();
  CompileOptions host;
  host.fast_kernels = false;
  CompileOptions dev;
  dev.device = {Device::kCuda, 0};
  for (int round = 0; round < 2; ++round) {
    {
      for (int64_t batch : {1, 4}) {
        auto plan = Compile(g, {{DType::kF32, {batch, 3, 32, 32}}}, dev);
        auto ref = Compile(g, {{DType::kF32, {batch, 3, 32, 32}}}, host);
        EXPECT_EQ(plan->num_copy_steps(), 3u) << "everything on the GPU: x up, two outputs down";
        // Runs 1 (warm-up), 2 (capture) and 3.. (replays), each with new input values.
        for (int i = 0; i < 6; ++i) {
          const Tensor x = RandomTensor({batch, 3, 32, 32}, 100 * round + 10 * i + static_cast<uint32_t>(batch));
          auto got = plan->Run({x});
          auto want = ref->Run({x});
          ExpectTensorNear(got[0], want[0], 1e-4f, 1e-5f);
          ExpectTensorNear(got[1], want[1], 1e-4f, 1e-4f);
        }
        std::vector<OpProfile> profile;
        const Tensor x = RandomTensor({batch, 3, 32, 32}, 7);
        ExpectTensorNear(plan->Run({x}, &profile)[1], ref->Run({x})[1], 1e-4f, 1e-4f);
        for (const OpProfile& p : profile) std::cout << "  " << p.op_type << " " << p.kernel << " " << p.ms << " ms\n";
      }
    }
    EXPECT_EQ(Allocator::Host().BytesLive(Device::kCuda), 0) << "dropping the plans frees every device byte";
    gpu->ReleaseContext(0);
    EXPECT_FALSE(gpu->ContextActive(0));
  }
  EXPECT_GE(gpu->ContextsCreated(), 2);
}

}  // namespace
}  // namespace osprey
