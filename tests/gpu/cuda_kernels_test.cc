// The CUDA backend against the reference kernels (ctest label "gpu"; the first thing a session with a GPU runs).
//
// Each case builds the node's KernelBuildContext from its schema (constant inputs flagged, as the planner does),
// creates the CUDA kernel through the backend, uploads the inputs, runs the kernel twice on a pooled stream with its
// workspace, downloads every output and compares it with the reference kernel's. Outputs start as NaN on the device, so
// an element a kernel forgets to write fails the comparison.
//
// Without a device every test skips ("no CUDA device: ..."). With OSPREY_CUDA_TEST_DRY_RUN=1 and no device, the
// kernels that need no library (everything but cuDNN/cuBLAS) run with their launches emulated on the host
// (cuda::SetHostEmulation: the device kernels' own per-element code in a host loop) and are compared with the reference
// the same way: that checks the factories' geometry and the kernels' index arithmetic on a machine without a GPU,
// leaving launch configurations, block reductions and the library calls to the device run.
//
// Tolerances: elementwise, movement and pooling kernels use 1e-4 relative + 1e-5 absolute. Convolutions, GEMMs and
// reductions sum in another order than the reference (cuDNN/cuBLAS tiling, tree reductions): with inputs in [-1, 1)
// and up to a few hundred terms that is a few float32 ulps of the terms' magnitude, so they get 1e-4 + 1e-4 absolute
// (as the oneDNN kernel tests). fp16 modes: 2e-2 relative + 2e-2 absolute (half-precision products).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_internal.h"
#include "kernels/cuda/cuda_libs.h"
#include "osprey/device.h"
#include "test_util.h"

namespace osprey {
namespace {

using testing::MakeNode;
using testing::RandomTensor;
using testing::RunReferenceNode;
using A = Attribute;

DeviceBackend* Cuda() { return cuda::Backend(); }

bool HaveDevice() { return Cuda()->DeviceCount() > 0; }

bool DryRun() {
  const char* v = std::getenv("OSPREY_CUDA_TEST_DRY_RUN");
  return v != nullptr && std::string(v) == "1";
}

std::string NoDeviceMessage() { return "no CUDA device: " + Cuda()->Describe(0); }

struct Tolerance {
  float rtol = 1e-4f;
  float atol = 1e-5f;
};
constexpr Tolerance kExact{1e-4f, 1e-5f};
constexpr Tolerance kSums{1e-4f, 1e-4f};
constexpr Tolerance kFp16{2e-2f, 2e-2f};

struct Options {
  int opset = 17;
  Tolerance tol = kExact;
  bool fp16 = false;
  std::string name;           // expected Kernel::Name() when not empty
  bool needs_device = false;  // the factory itself needs the device (cuDNN, cuBLAS): skipped in a dry run
};

Tensor Uniform(Shape shape, uint32_t seed, float lo, float hi) { return RandomTensor(std::move(shape), seed, lo, hi); }

Tensor I64(Shape shape, std::vector<int64_t> v) { return Tensor::FromVector<int64_t>(std::move(shape), v); }
Tensor I64s(std::vector<int64_t> v) {
  const int64_t n = static_cast<int64_t>(v.size());
  return Tensor::FromVector<int64_t>({n}, v);
}
Tensor F32s(std::vector<float> v) {
  const int64_t n = static_cast<int64_t>(v.size());
  return Tensor::FromVector<float>({n}, v);
}

// The compile-time view of `node` on `inputs` (constant[i]: input i is a constant whose host value the factory sees).
KernelBuildContext BuildContext(const Node& node, const std::vector<Tensor>& inputs, const std::vector<bool>& constant,
                                const Options& o) {
  const OpSchema* schema = OpRegistry::Get().Find(node.op_type);
  if (!schema) throw Error(ErrorCode::kUnsupported, "no schema for " + node.op_type);
  InferContext ic{node, o.opset};
  for (const Tensor& t : inputs) {
    const bool present = t.buffer() != nullptr;
    ic.present.push_back(present);
    ic.input_dtypes.push_back(t.dtype());
    ic.input_shapes.push_back(t.shape());
    ic.input_values.push_back(present ? &t : nullptr);
  }
  schema->infer(ic);
  KernelBuildContext bc{node, o.opset};
  bc.present = ic.present;
  bc.input_dtypes = ic.input_dtypes;
  bc.input_shapes = ic.input_shapes;
  for (size_t i = 0; i < inputs.size(); ++i)
    bc.input_values.push_back(ic.present[i] && i < constant.size() && constant[i] ? &inputs[i] : nullptr);
  bc.output_dtypes = ic.output_dtypes;
  bc.output_shapes = ic.output_shapes;
  bc.device = DeviceSpec{Device::kCuda, 0};
  bc.fp16 = o.fp16;
  return bc;
}

std::shared_ptr<Buffer> Upload(const Tensor& t, void* stream) {
  auto buffer = Allocator::Host().AllocateOn(Device::kCuda, 0, std::max<size_t>(t.nbytes(), 1));
  if (t.nbytes() > 0) Cuda()->CopyToDevice(0, buffer->data(), t.raw(), t.nbytes(), stream);
  return buffer;
}

Tensor Download(const Tensor& device, void* stream) {
  Tensor host(device.dtype(), device.shape());
  if (host.nbytes() > 0) Cuda()->CopyToHost(0, host.raw(), device.raw(), host.nbytes(), stream);
  return host;
}

// Creates the CUDA kernel for node/inputs and checks it against the reference (see the file comment). Returns false
// (and records a failure) when the backend declines the node.
void ExpectCuda(const Node& node, const std::vector<Tensor>& inputs, const std::vector<bool>& constant,
                const Options& o = {}) {
  SCOPED_TRACE(node.op_type);
  const std::vector<Tensor> expected = RunReferenceNode(node, inputs, o.opset);
  KernelBuildContext bc = BuildContext(node, inputs, constant, o);
  if (!HaveDevice()) {
    // Dry run: the kernels that need no library, with their launches emulated on the host (cuda_launch.h).
    if (o.needs_device) return;
    std::unique_ptr<Kernel> k = cuda::CreateCudaKernel(bc);
    ASSERT_NE(k, nullptr) << "the CUDA factory declined " << node.op_type;
    if (!o.name.empty()) {
      EXPECT_EQ(std::string(k->Name()), o.name);
    }
    struct Emulation {
      Emulation() { cuda::SetHostEmulation(true); }
      ~Emulation() { cuda::SetHostEmulation(false); }
    } emulation;
    std::vector<Tensor> outs;
    for (size_t i = 0; i < bc.output_shapes.size(); ++i) {
      outs.emplace_back(bc.output_dtypes[i], bc.output_shapes[i]);
      if (outs.back().nbytes()) std::memset(outs.back().raw(), 0xff, outs.back().nbytes());
    }
    std::vector<char> workspace(k->WorkspaceBytes());
    KernelContext kc{node, o.opset};
    for (const Tensor& t : inputs) kc.inputs.push_back(t.buffer() ? &t : nullptr);
    for (Tensor& t : outs) kc.outputs.push_back(&t);
    kc.workspace = workspace.empty() ? nullptr : workspace.data();
    for (int run = 0; run < 2; ++run) {
      SCOPED_TRACE("emulated run " + std::to_string(run));
      k->Run(kc);
      for (size_t i = 0; i < outs.size(); ++i) {
        if (i < node.outputs.size() && node.outputs[i] < 0) continue;
        SCOPED_TRACE("output " + std::to_string(i));
        testing::ExpectTensorNear(outs[i], expected[i], o.tol.rtol, o.tol.atol);
      }
    }
    return;
  }
  std::unique_ptr<Kernel> kernel = Cuda()->CreateKernel(bc);
  ASSERT_NE(kernel, nullptr) << "the CUDA backend declined " << node.op_type << " (" << Cuda()->Describe(0) << ")";
  if (!o.name.empty()) {
    EXPECT_EQ(std::string(kernel->Name()), o.name);
  }
  void* stream = Cuda()->AcquireStream(0);
  std::vector<std::shared_ptr<Buffer>> keep;
  std::vector<Tensor> dev_in(inputs.size()), dev_out;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].buffer()) continue;
    keep.push_back(Upload(inputs[i], stream));
    dev_in[i] = Tensor::View(inputs[i].dtype(), inputs[i].shape(), keep.back(), 0);
  }
  for (size_t i = 0; i < bc.output_shapes.size(); ++i) {
    Tensor nan(bc.output_dtypes[i], bc.output_shapes[i]);
    if (nan.nbytes()) std::memset(nan.raw(), 0xff, nan.nbytes());  // float NaN; all-ones for other dtypes
    keep.push_back(Upload(nan, stream));
    dev_out.push_back(Tensor::View(nan.dtype(), nan.shape(), keep.back(), 0));
  }
  std::shared_ptr<Buffer> workspace;
  if (kernel->WorkspaceBytes() > 0)
    workspace = Allocator::Host().AllocateOn(Device::kCuda, 0, kernel->WorkspaceBytes());
  KernelContext kc{node, o.opset};
  for (size_t i = 0; i < inputs.size(); ++i) kc.inputs.push_back(inputs[i].buffer() ? &dev_in[i] : nullptr);
  for (Tensor& t : dev_out) kc.outputs.push_back(&t);
  kc.stream = stream;
  kc.workspace = workspace ? workspace->data() : nullptr;
  for (int run = 0; run < 2; ++run) {
    SCOPED_TRACE("run " + std::to_string(run));
    kernel->Run(kc);
    Cuda()->Synchronize(0, stream);
    for (size_t i = 0; i < dev_out.size(); ++i) {
      if (i < node.outputs.size() && node.outputs[i] < 0) continue;
      SCOPED_TRACE("output " + std::to_string(i));
      testing::ExpectTensorNear(Download(dev_out[i], stream), expected[i], o.tol.rtol, o.tol.atol);
    }
  }
  Cuda()->ReleaseStream(0, stream);
}

// The backend (or the dry-run factory) declines the node.
void ExpectDeclined(const Node& node, const std::vector<Tensor>& inputs, const std::vector<bool>& constant,
                    const Options& o = {}) {
  KernelBuildContext bc = BuildContext(node, inputs, constant, o);
  if (!HaveDevice()) {
    if (!o.needs_device) {
      EXPECT_EQ(cuda::CreateCudaKernel(bc), nullptr) << node.op_type;
    }
    return;
  }
  EXPECT_EQ(Cuda()->CreateKernel(bc), nullptr) << node.op_type;
}

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveDevice() && !DryRun()) GTEST_SKIP() << NoDeviceMessage();
    if (HaveDevice()) InstallDeviceBackend(Device::kCuda, Cuda());
  }
  void TearDown() override {
    if (HaveDevice()) InstallDeviceBackend(Device::kCuda, nullptr);
  }
};

// ---------------------------------------------------------------------------------------------------------------
// The backend itself.

TEST(CudaBackend, DescribesDevicesAndLibraries) {
  std::cout << "cuda backend: " << Cuda()->DeviceCount() << " device(s); " << Cuda()->Describe(0) << "\n";
  if (!HaveDevice()) GTEST_SKIP() << NoDeviceMessage();
  EXPECT_EQ(std::string(Cuda()->name()), "cuda");
  const std::string d = Cuda()->Describe(0);
  EXPECT_NE(d.find("MiB"), std::string::npos) << d;
  // The convolution and GEMM kernels need these; without them every Conv/Gemm/MatMul test below fails too.
  EXPECT_NE(cuda::Cudnn(), nullptr) << cuda::CudnnStatus();
  EXPECT_NE(cuda::Cublas(), nullptr) << cuda::CublasStatus();
  EXPECT_EQ(Cuda()->Describe(Cuda()->DeviceCount()).rfind("no CUDA device", 0), 0u);
}

TEST(CudaBackend, MemoryCopiesAndStreams) {
  if (!HaveDevice()) GTEST_SKIP() << NoDeviceMessage();
  DeviceBackend* b = Cuda();
  const Tensor host = Uniform({1000}, 7, -1.f, 1.f);
  const size_t bytes = host.nbytes();
  void* s1 = b->AcquireStream(0);
  void* s2 = b->AcquireStream(0);
  EXPECT_NE(s1, s2);
  void* d1 = b->Malloc(0, bytes);
  void* d2 = b->Malloc(0, bytes);
  b->CopyToDevice(0, d1, host.raw(), bytes, s1);
  b->CopyOnDevice(0, d2, d1, bytes, s1);
  std::vector<float> back(1000, 0.f);
  b->CopyToHost(0, back.data(), d2, bytes, s1);
  EXPECT_EQ(std::memcmp(back.data(), host.raw(), bytes), 0);
  // Null stream: synchronous copies.
  std::vector<float> back2(1000, 0.f);
  b->CopyToDevice(0, d1, host.raw(), bytes, nullptr);
  b->CopyToHost(0, back2.data(), d1, bytes, nullptr);
  EXPECT_EQ(std::memcmp(back2.data(), host.raw(), bytes), 0);
  b->Synchronize(0, s1);
  b->Synchronize(0, nullptr);
  b->Free(0, d1);
  b->Free(0, d2);
  // Streams are pooled.
  b->ReleaseStream(0, s2);
  EXPECT_EQ(b->AcquireStream(0), s2);
  b->ReleaseStream(0, s2);
  b->ReleaseStream(0, s1);
  // Far more than any device holds: kResourceExhausted naming what is free.
  try {
    b->Malloc(0, size_t{1} << 50);
    FAIL() << "a 1 PiB allocation succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kResourceExhausted) << e.what();
    EXPECT_NE(std::string(e.what()).find("free"), std::string::npos) << e.what();
  }
  // The device still works after the failed allocation.
  void* d3 = b->Malloc(0, 256);
  b->Free(0, d3);
}

// Large uploads queued back to back on one stream (sizes not multiples of any chunk or page), then checked.
TEST(CudaBackend, LargeUploadsQueuedBackToBack) {
  if (!HaveDevice()) GTEST_SKIP() << NoDeviceMessage();
  DeviceBackend* b = Cuda();
  void* s = b->AcquireStream(0);
  const std::vector<int64_t> sizes = {(int64_t{9} << 20) / 4 + 3, (int64_t{1} << 20) / 4, (int64_t{4} << 20) / 4 + 1,
                                      (int64_t{13} << 20) / 4 - 5};
  std::vector<Tensor> hosts;
  std::vector<void*> devs;
  for (size_t i = 0; i < sizes.size(); ++i) {
    hosts.push_back(Uniform({sizes[i]}, static_cast<uint32_t>(20 + i), -1.f, 1.f));
    devs.push_back(b->Malloc(0, hosts.back().nbytes()));
    b->CopyToDevice(0, devs.back(), hosts.back().raw(), hosts.back().nbytes(), s);
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    std::vector<float> back(static_cast<size_t>(sizes[i]), 0.f);
    b->CopyToHost(0, back.data(), devs[i], hosts[i].nbytes(), s);
    EXPECT_EQ(std::memcmp(back.data(), hosts[i].raw(), hosts[i].nbytes()), 0) << "upload " << i;
    b->Free(0, devs[i]);
  }
  b->ReleaseStream(0, s);
}

TEST(CudaBackend, ReleaseContextAndRecreate) {
  if (!HaveDevice()) GTEST_SKIP() << NoDeviceMessage();
  DeviceBackend* b = Cuda();
  void* p = b->Malloc(0, 1 << 20);
  EXPECT_TRUE(b->ContextActive(0));
  // A live buffer: refused.
  EXPECT_THROW(b->ReleaseContext(0), Error);
  EXPECT_TRUE(b->ContextActive(0));
  b->Free(0, p);
  // Streams and library handles go with the context.
  void* s = b->AcquireStream(0);
  ASSERT_NE(cuda::BlasHandle(0, s), nullptr) << cuda::CublasStatus();
  ASSERT_NE(cuda::DnnHandle(0, s), nullptr) << cuda::CudnnStatus();
  b->ReleaseStream(0, s);
  const int64_t created = b->ContextsCreated();
  b->ReleaseContext(0);
  EXPECT_FALSE(b->ContextActive(0));
  b->ReleaseContext(0);  // idempotent
  // The next use re-creates it, and everything works again (streams, handles, a kernel).
  void* s2 = b->AcquireStream(0);
  EXPECT_TRUE(b->ContextActive(0));
  EXPECT_EQ(b->ContextsCreated(), created + 1);
  EXPECT_NE(cuda::BlasHandle(0, s2), nullptr);
  b->ReleaseStream(0, s2);
  InstallDeviceBackend(Device::kCuda, b);
  ExpectCuda(MakeNode("Relu", 1, 1), {Uniform({3, 5}, 1, -1.f, 1.f)}, {false});
  // cuDNN and cuBLAS in the new context (their handles were destroyed with the old one).
  ExpectCuda(MakeNode("Conv", 3, 1, {{"pads", A::Ints({1, 1, 1, 1})}}),
             {Uniform({1, 4, 6, 6}, 2, -1.f, 1.f), Uniform({8, 4, 3, 3}, 3, -1.f, 1.f), Uniform({8}, 4, -1.f, 1.f)},
             {false, true, true}, Options{.tol = kSums});
  ExpectCuda(MakeNode("MatMul", 2, 1), {Uniform({2, 4, 5}, 5, -1.f, 1.f), Uniform({5, 3}, 6, -1.f, 1.f)}, {false, true},
             Options{.tol = kSums});
  // And once more: release after kernels ran, then use again.
  b->ReleaseContext(0);
  EXPECT_FALSE(b->ContextActive(0));
  ExpectCuda(MakeNode("MatMul", 2, 1), {Uniform({3, 7}, 7, -1.f, 1.f), Uniform({7, 2}, 8, -1.f, 1.f)}, {false, true},
             Options{.tol = kSums});
  EXPECT_EQ(b->ContextsCreated(), created + 2);
  InstallDeviceBackend(Device::kCuda, nullptr);
}

TEST(CudaBackend, BadOrdinalAndOtherDevicesDecline) {
  if (!HaveDevice()) GTEST_SKIP() << NoDeviceMessage();
  EXPECT_THROW(Cuda()->Malloc(Cuda()->DeviceCount(), 16), Error);
  const Node node = MakeNode("Relu", 1, 1);
  const Tensor x = Uniform({4}, 1, -1.f, 1.f);
  KernelBuildContext bc = BuildContext(node, {x}, {false}, Options{});
  bc.device = DeviceSpec{};  // host
  EXPECT_EQ(Cuda()->CreateKernel(bc), nullptr);
}

// ---------------------------------------------------------------------------------------------------------------
// Elementwise.

TEST_F(CudaTest, UnaryOps) {
  const Tensor x = Uniform({2, 3, 17, 19}, 3, -4.f, 4.f);
  const Tensor pos = Uniform({2, 3, 17, 19}, 4, 0.05f, 5.f);
  for (const char* op : {"Relu", "Sigmoid", "Tanh", "Exp", "Neg", "Abs", "Erf", "HardSwish", "Floor", "Ceil", "Round",
                         "Sin", "Cos", "Softplus", "Softsign", "Mish", "Sign"})
    ExpectCuda(MakeNode(op, 1, 1), {x}, {false}, Options{.name = std::string(op) + "F32Cuda"});
  for (const char* op : {"Log", "Sqrt", "Reciprocal"}) ExpectCuda(MakeNode(op, 1, 1), {pos}, {false});
  ExpectCuda(MakeNode("LeakyRelu", 1, 1), {x}, {false});
  ExpectCuda(MakeNode("LeakyRelu", 1, 1, {{"alpha", A::Float(0.2f)}}), {x}, {false});
  ExpectCuda(MakeNode("Elu", 1, 1, {{"alpha", A::Float(0.7f)}}), {x}, {false});
  ExpectCuda(MakeNode("HardSigmoid", 1, 1), {x}, {false});
  ExpectCuda(MakeNode("HardSigmoid", 1, 1, {{"alpha", A::Float(1.f / 6)}, {"beta", A::Float(0.5f)}}), {x}, {false});
  Options gelu{.opset = 20};
  ExpectCuda(MakeNode("Gelu", 1, 1), {x}, {false}, gelu);
  ExpectCuda(MakeNode("Gelu", 1, 1, {{"approximate", A::String("tanh")}}), {x}, {false}, gelu);
  // Empty tensors launch nothing.
  ExpectCuda(MakeNode("Relu", 1, 1), {Tensor(DType::kF32, {0, 3})}, {false});
}

TEST_F(CudaTest, Clip) {
  const Tensor x = Uniform({3, 40}, 5, -8.f, 8.f);
  // opset >= 11: bounds as constant inputs (ReLU6), one bound only, no bounds.
  ExpectCuda(MakeNode("Clip", 3, 1), {x, Tensor::Scalar(0.f), Tensor::Scalar(6.f)}, {false, true, true});
  ExpectCuda(MakeNode("Clip", 3, 1), {x, Tensor(), Tensor::Scalar(1.5f)}, {false, true, true});
  ExpectCuda(MakeNode("Clip", 2, 1), {x, Tensor::Scalar(-1.f)}, {false, true});
  ExpectCuda(MakeNode("Clip", 1, 1), {x}, {false});
  // opset 6: attributes.
  ExpectCuda(MakeNode("Clip", 1, 1, {{"min", A::Float(-2.f)}, {"max", A::Float(3.f)}}), {x}, {false},
             Options{.opset = 6});
  // A bound computed at run time: declined (the host runs it).
  ExpectDeclined(MakeNode("Clip", 3, 1), {x, Tensor::Scalar(0.f), Tensor::Scalar(6.f)}, {false, false, true});
}

struct BroadcastCase {
  Shape a, b;
};

const std::vector<BroadcastCase> kBroadcasts = {
    {{2, 3, 4, 5}, {2, 3, 4, 5}},                    // same shape
    {{2, 3, 4, 5}, {5}},                             // row
    {{2, 3, 4, 5}, {3, 1, 1}},                       // per channel
    {{1, 3, 1, 5}, {2, 1, 4, 1}},                    // both ways
    {{4, 1}, {1, 6}},                                // outer product
    {{2, 3, 4, 5}, {}},                              // scalar
    {{}, {2, 3}},                                    // scalar first
    {{2, 1, 3, 1, 2, 1, 2}, {1, 2, 1, 2, 1, 3, 1}},  // rank 7, alternating
    {{1, 197, 768}, {768}},                          // ViT bias
    {{8, 1, 1}, {8, 16, 16}},                        // SE scale
};

// Whether `from` broadcasts to `to` unidirectionally.
bool BroadcastsTo(const Shape& from, const Shape& to) {
  if (from.size() > to.size()) return false;
  for (size_t i = 0; i < from.size(); ++i) {
    const int64_t f = from[from.size() - 1 - i], t = to[to.size() - 1 - i];
    if (f != 1 && f != t) return false;
  }
  return true;
}

TEST_F(CudaTest, BinaryOpsBroadcast) {
  uint32_t seed = 10;
  for (const BroadcastCase& c : kBroadcasts) {
    SCOPED_TRACE(ShapeToString(c.a) + " op " + ShapeToString(c.b));
    const Tensor a = Uniform(c.a, ++seed, -2.f, 2.f);
    const Tensor b = Uniform(c.b, ++seed, -2.f, 2.f);
    for (const char* op : {"Add", "Sub", "Mul", "Max", "Min", "PRelu"}) {
      if (std::string(op) == "PRelu" && !BroadcastsTo(c.b, c.a)) continue;  // the slope broadcasts to X only
      ExpectCuda(MakeNode(op, 2, 1), {a, b}, {false, false});
    }
    const Tensor denom = Uniform(c.b, ++seed, 0.5f, 2.f);
    ExpectCuda(MakeNode("Div", 2, 1), {a, denom}, {false, false});
    const Tensor base = Uniform(c.a, ++seed, 0.1f, 3.f);
    ExpectCuda(MakeNode("Pow", 2, 1), {base, b}, {false, false});
    // The same with the second operand a constant.
    ExpectCuda(MakeNode("Mul", 2, 1), {a, b}, {false, true});
  }
}

TEST_F(CudaTest, BinaryConstantScalarsAndPow) {
  const Tensor x = Uniform({3, 7, 11}, 21, 0.1f, 3.f);
  const Tensor signed_x = Uniform({3, 7, 11}, 22, -3.f, 3.f);
  ExpectCuda(MakeNode("Add", 2, 1), {x, Tensor::Scalar(0.5f)}, {false, true});
  ExpectCuda(MakeNode("Div", 2, 1), {signed_x, Tensor::Scalar(3.f)}, {false, true});
  ExpectCuda(MakeNode("Sub", 2, 1), {Tensor::Scalar(1.f), x}, {true, false});
  // Pow: x^2 (LayerNorm exports), x^0.5, integer exponents, x^1.
  ExpectCuda(MakeNode("Pow", 2, 1), {signed_x, Tensor::Scalar(2.f)}, {false, true});
  ExpectCuda(MakeNode("Pow", 2, 1), {x, Tensor::Scalar(0.5f)}, {false, true});
  ExpectCuda(MakeNode("Pow", 2, 1), {signed_x, Tensor::Scalar<int64_t>(3)}, {false, true});
  ExpectCuda(MakeNode("Pow", 2, 1), {signed_x, Tensor::Scalar<int64_t>(2)}, {false, true});
  ExpectCuda(MakeNode("Pow", 2, 1), {signed_x, Tensor::Scalar(1.f)}, {false, true});
  // Sum of two = Add; Mod (fmod).
  ExpectCuda(MakeNode("Sum", 2, 1), {x, signed_x}, {false, false});
  ExpectCuda(MakeNode("Mod", 2, 1, {{"fmod", A::Int(1)}}), {signed_x, Uniform({11}, 23, 0.5f, 2.f)}, {false, false});
  // Integer data and three-input Sum: declined.
  ExpectDeclined(MakeNode("Add", 2, 1),
                 {Tensor::FromVector<int32_t>({2}, {1, 2}), Tensor::FromVector<int32_t>({2}, {3, 4})}, {false, false});
  ExpectDeclined(MakeNode("Sum", 3, 1), {x, x, x}, {false, false, false});
}

TEST_F(CudaTest, CompareAndWhere) {
  Tensor a = Uniform({2, 3, 8}, 31, -2.f, 2.f);
  Tensor b = Uniform({3, 1}, 32, -2.f, 2.f);
  a.data<float>()[5] = b.data<float>()[0];  // one equal pair
  for (const char* op : {"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"})
    ExpectCuda(MakeNode(op, 2, 1), {a, b}, {false, false});
  Tensor cond(DType::kBool, {3, 8});
  for (int64_t i = 0; i < cond.numel(); ++i) cond.data<bool>()[i] = (i * 7) % 3 == 0;
  ExpectCuda(MakeNode("Where", 3, 1), {cond, a, b}, {false, false, false});
  ExpectCuda(MakeNode("Where", 3, 1), {cond, Tensor::Scalar(-1e4f), Uniform({2, 3, 8}, 33, -1.f, 1.f)},
             {true, true, false});
}

TEST_F(CudaTest, SameBytesOps) {
  const Tensor x = Uniform({2, 3, 4, 5}, 41, -1.f, 1.f);
  ExpectCuda(MakeNode("Reshape", 2, 1), {x, I64s({6, -1})}, {false, true});
  ExpectCuda(MakeNode("Flatten", 1, 1, {{"axis", A::Int(2)}}), {x}, {false});
  ExpectCuda(MakeNode("Unsqueeze", 2, 1), {x, I64s({0, 5})}, {false, true});
  ExpectCuda(MakeNode("Squeeze", 2, 1), {Uniform({2, 1, 5, 1}, 42, -1.f, 1.f), I64s({1, 3})}, {false, true});
  ExpectCuda(MakeNode("Identity", 1, 1), {x}, {false});
  ExpectCuda(MakeNode("Dropout", 1, 1), {x}, {false});
  ExpectCuda(MakeNode("Cast", 1, 1, {{"to", A::Int(1)}}), {x}, {false});  // float -> float
  ExpectCuda(MakeNode("Identity", 1, 1), {I64({3}, {1, -2, 3})}, {false});
  // Dropout's mask and training mode: declined.
  ExpectDeclined(MakeNode("Dropout", 1, 2), {x}, {false});
}

// ---------------------------------------------------------------------------------------------------------------
// Conv (cuDNN).

struct ConvCase {
  std::string what;
  Shape x, w;
  AttributeMap attrs;
  bool bias = true;
};

const std::vector<ConvCase> kConvs = {
    {"3x3 pad 1", {2, 8, 10, 10}, {16, 8, 3, 3}, {{"pads", A::Ints({1, 1, 1, 1})}}},
    {"stem 7x7 stride 2",
     {1, 3, 32, 32},
     {8, 3, 7, 7},
     {{"pads", A::Ints({3, 3, 3, 3})}, {"strides", A::Ints({2, 2})}}},
    {"1x1 no bias", {2, 16, 7, 9}, {12, 16, 1, 1}, {}, false},
    {"1x1 stride 2", {1, 16, 8, 8}, {32, 16, 1, 1}, {{"strides", A::Ints({2, 2})}}},
    {"grouped", {2, 8, 9, 9}, {12, 2, 3, 3}, {{"group", A::Int(4)}, {"pads", A::Ints({1, 1, 1, 1})}}},
    {"depthwise stride 2",
     {1, 16, 15, 15},
     {16, 1, 3, 3},
     {{"group", A::Int(16)}, {"pads", A::Ints({1, 1, 1, 1})}, {"strides", A::Ints({2, 2})}}},
    {"depthwise 5x5", {2, 8, 12, 12}, {8, 1, 5, 5}, {{"group", A::Int(8)}, {"pads", A::Ints({2, 2, 2, 2})}}},
    {"dilated", {1, 4, 16, 16}, {6, 4, 3, 3}, {{"dilations", A::Ints({2, 2})}, {"pads", A::Ints({2, 2, 2, 2})}}},
    {"asymmetric pads", {1, 4, 11, 13}, {6, 4, 3, 3}, {{"pads", A::Ints({0, 1, 2, 0})}}},
    {"SAME_UPPER stride 2 (TF)",
     {1, 4, 16, 16},
     {8, 4, 3, 3},
     {{"auto_pad", A::String("SAME_UPPER")}, {"strides", A::Ints({2, 2})}}},
    {"SAME_LOWER", {1, 4, 9, 10}, {8, 4, 4, 4}, {{"auto_pad", A::String("SAME_LOWER")}}},
    {"VALID rectangular kernel", {2, 3, 12, 10}, {5, 3, 3, 5}, {{"auto_pad", A::String("VALID")}}},
    {"1-D", {2, 4, 20}, {6, 4, 5}, {{"pads", A::Ints({2, 2})}, {"strides", A::Ints({2})}}},
    {"1-D grouped asymmetric", {1, 6, 17}, {6, 3, 3}, {{"pads", A::Ints({0, 1})}, {"group", A::Int(2)}}},
    {"3-D", {1, 2, 5, 6, 7}, {4, 2, 3, 3, 3}, {{"pads", A::Ints({1, 1, 1, 1, 1, 1})}}},
    {"1x1 input", {3, 32, 1, 1}, {16, 32, 1, 1}, {}},
};

TEST_F(CudaTest, Conv) {
  uint32_t seed = 100;
  for (const ConvCase& c : kConvs) {
    SCOPED_TRACE(c.what);
    std::vector<Tensor> in{Uniform(c.x, ++seed, -1.f, 1.f), Uniform(c.w, ++seed, -1.f, 1.f)};
    if (c.bias) in.push_back(Uniform({c.w[0]}, ++seed, -1.f, 1.f));
    ExpectCuda(MakeNode("Conv", static_cast<int>(in.size()), 1, c.attrs), in, {false, true, true},
               Options{.tol = kSums, .name = "ConvF32Cudnn", .needs_device = true});
  }
}

TEST_F(CudaTest, ConvFusedResidualAndActivations) {
  const Shape x = {2, 8, 10, 10}, w = {8, 8, 3, 3}, y = {2, 8, 10, 10};
  const std::vector<Tensor> base{Uniform(x, 1, -1.f, 1.f), Uniform(w, 2, -1.f, 1.f), Uniform({8}, 3, -1.f, 1.f),
                                 Uniform(y, 4, -1.f, 1.f)};
  struct Act {
    const char* name;
    float alpha, beta;
  };
  for (const Act& a : std::vector<Act>{{"", 0, 0},
                                       {"Relu", 0, 0},
                                       {"LeakyRelu", 0.1f, 0},
                                       {"Clip", 0.f, 6.f},
                                       {"Sigmoid", 0, 0},
                                       {"Tanh", 0, 0},
                                       {"HardSigmoid", 0.2f, 0.5f},
                                       {"HardSwish", 0, 0},
                                       {"Silu", 0, 0},
                                       {"Gelu", 0, 0}}) {
    SCOPED_TRACE(a.name);
    AttributeMap attrs{{"pads", A::Ints({1, 1, 1, 1})}};
    if (*a.name) {
      attrs["_activation"] = A::String(a.name);
      attrs["_alpha"] = A::Float(a.alpha);
      attrs["_beta"] = A::Float(a.beta);
    }
    const Options o{.tol = kSums, .needs_device = true};
    ExpectCuda(MakeNode("Conv", 3, 1, attrs), {base[0], base[1], base[2]}, {false, true, true}, o);
    AttributeMap res = attrs;
    res["_residual"] = A::Int(1);
    ExpectCuda(MakeNode("Conv", 4, 1, res), base, {false, true, true, false}, o);
  }
  // Residual without bias (input 2 omitted).
  AttributeMap res{{"pads", A::Ints({1, 1, 1, 1})}, {"_residual", A::Int(1)}, {"_activation", A::String("Relu")}};
  ExpectCuda(MakeNode("Conv", 4, 1, res), {base[0], base[1], Tensor(), base[3]}, {false, true, true, false},
             Options{.tol = kSums, .needs_device = true});
}

TEST_F(CudaTest, ConvFp16) {
  const std::vector<Tensor> in{Uniform({2, 16, 14, 14}, 5, -1.f, 1.f), Uniform({32, 16, 3, 3}, 6, -1.f, 1.f),
                               Uniform({32}, 7, -1.f, 1.f)};
  ExpectCuda(MakeNode("Conv", 3, 1, {{"pads", A::Ints({1, 1, 1, 1})}}), in, {false, true, true},
             Options{.tol = kFp16, .fp16 = true, .name = "ConvF32CudnnFp16", .needs_device = true});
}

TEST_F(CudaTest, ConvTranspose) {
  struct Case {
    std::string what;
    Shape x, w;
    AttributeMap attrs;
    bool bias;
  };
  const std::vector<Case> cases = {
      {"2x2 stride 2 (PaddleOCR DB head)", {1, 8, 6, 7}, {8, 4, 2, 2}, {{"strides", A::Ints({2, 2})}}, true},
      {"3x3 stride 2 pad 1 output_padding 1",
       {2, 4, 5, 5},
       {4, 6, 3, 3},
       {{"strides", A::Ints({2, 2})}, {"pads", A::Ints({1, 1, 1, 1})}, {"output_padding", A::Ints({1, 1})}},
       true},
      {"grouped", {1, 6, 4, 4}, {6, 2, 3, 3}, {{"group", A::Int(3)}, {"pads", A::Ints({1, 1, 1, 1})}}, false},
      {"dilated", {1, 3, 5, 6}, {3, 2, 3, 3}, {{"dilations", A::Ints({2, 2})}}, true},
      {"1-D", {2, 4, 9}, {4, 3, 4}, {{"strides", A::Ints({2})}, {"pads", A::Ints({1, 1})}}, true},
  };
  uint32_t seed = 150;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    std::vector<Tensor> in{Uniform(c.x, ++seed, -1.f, 1.f), Uniform(c.w, ++seed, -1.f, 1.f)};
    if (c.bias)
      in.push_back(Uniform({c.w[1] * (c.attrs.count("group") ? c.attrs.at("group").i : 1)}, ++seed, -1.f, 1.f));
    ExpectCuda(MakeNode("ConvTranspose", static_cast<int>(in.size()), 1, c.attrs), in, {false, true, true},
               Options{.tol = kSums, .name = "ConvTransposeF32Cudnn", .needs_device = true});
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Gemm and MatMul (cuBLAS).

TEST_F(CudaTest, Gemm) {
  const int64_t m = 5, k = 7, n = 9;
  const Options o{.tol = kSums, .name = "GemmF32Cublas", .needs_device = true};
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      SCOPED_TRACE("transA " + std::to_string(ta) + " transB " + std::to_string(tb));
      const Tensor a = Uniform(ta ? Shape{k, m} : Shape{m, k}, 50 + ta, -1.f, 1.f);
      const Tensor b = Uniform(tb ? Shape{n, k} : Shape{k, n}, 52 + tb, -1.f, 1.f);
      AttributeMap attrs{{"transA", A::Int(ta)}, {"transB", A::Int(tb)}};
      ExpectCuda(MakeNode("Gemm", 2, 1, attrs), {a, b}, {false, true}, o);
      for (const Shape& c : std::vector<Shape>{{n}, {m, n}, {m, 1}, {1, n}, {}, {1, 1}}) {
        SCOPED_TRACE("C " + ShapeToString(c));
        ExpectCuda(MakeNode("Gemm", 3, 1, attrs), {a, b, Uniform(c, 60, -1.f, 1.f)}, {false, true, true}, o);
      }
      AttributeMap scaled = attrs;
      scaled["alpha"] = A::Float(0.5f);
      scaled["beta"] = A::Float(-2.f);
      ExpectCuda(MakeNode("Gemm", 3, 1, scaled), {a, b, Uniform({n}, 61, -1.f, 1.f)}, {false, true, true}, o);
      scaled["beta"] = A::Float(0.f);
      ExpectCuda(MakeNode("Gemm", 3, 1, scaled), {a, b, Uniform({n}, 62, -1.f, 1.f)}, {false, true, true}, o);
    }
  // Classifier head with a fused activation; a wide K.
  AttributeMap head{{"transB", A::Int(1)}, {"_activation", A::String("Relu")}};
  ExpectCuda(MakeNode("Gemm", 3, 1, head),
             {Uniform({4, 512}, 70, -1.f, 1.f), Uniform({100, 512}, 71, -1.f, 1.f), Uniform({100}, 72, -1.f, 1.f)},
             {false, true, true}, o);
}

TEST_F(CudaTest, MatMul) {
  struct Case {
    Shape a, b;
  };
  const Options o{.tol = kSums, .name = "MatMulF32Cublas", .needs_device = true};
  uint32_t seed = 80;
  for (const Case& c : std::vector<Case>{{{4, 5}, {5, 6}},
                                         {{2, 3, 4, 5}, {2, 3, 5, 6}},  // batched
                                         {{2, 4, 5}, {5, 6}},           // weights shared: one product
                                         {{1, 197, 64}, {64, 197}},
                                         {{4, 5}, {2, 5, 6}},           // A broadcast
                                         {{2, 1, 4, 5}, {3, 5, 6}},     // broadcast batch dims
                                         {{2, 1, 4, 5}, {1, 3, 5, 6}},  // both broadcast
                                         {{3, 1, 4, 5}, {3, 2, 5, 6}},
                                         {{5}, {5, 6}},     // 1-D A
                                         {{2, 4, 5}, {5}},  // 1-D B
                                         {{5}, {5}},        // dot
                                         {{2, 12, 197, 64}, {2, 12, 64, 197}}}) {
    SCOPED_TRACE(ShapeToString(c.a) + " x " + ShapeToString(c.b));
    ExpectCuda(MakeNode("MatMul", 2, 1), {Uniform(c.a, ++seed, -1.f, 1.f), Uniform(c.b, ++seed, -1.f, 1.f)},
               {false, false}, o);
  }
  // Fused bias + activation (transformer MLP).
  ExpectCuda(MakeNode("MatMul", 3, 1, {{"_bias", A::Int(1)}, {"_activation", A::String("Gelu")}}),
             {Uniform({1, 10, 32}, 90, -1.f, 1.f), Uniform({32, 48}, 91, -1.f, 1.f), Uniform({48}, 92, -1.f, 1.f)},
             {false, true, true}, o);
  // Fused bias + residual + activation (a transformer's residual connection).
  ExpectCuda(
      MakeNode("MatMul", 4, 1, {{"_bias", A::Int(1)}, {"_residual", A::Int(1)}, {"_activation", A::String("Relu")}}),
      {Uniform({1, 10, 32}, 97, -1.f, 1.f), Uniform({32, 48}, 98, -1.f, 1.f), Uniform({48}, 99, -1.f, 1.f),
       Uniform({1, 10, 48}, 100, -1.f, 1.f)},
      {false, true, true, false}, o);
  // fp16 mode.
  ExpectCuda(MakeNode("MatMul", 2, 1), {Uniform({3, 64, 96}, 93, -1.f, 1.f), Uniform({96, 80}, 94, -1.f, 1.f)},
             {false, true}, Options{.tol = kFp16, .fp16 = true, .name = "MatMulF32CublasFp16", .needs_device = true});
  ExpectCuda(MakeNode("Gemm", 2, 1, {{"transB", A::Int(1)}}),
             {Uniform({8, 256}, 95, -1.f, 1.f), Uniform({64, 256}, 96, -1.f, 1.f)}, {false, true},
             Options{.tol = kFp16, .fp16 = true, .name = "GemmF32CublasFp16", .needs_device = true});
}

// ---------------------------------------------------------------------------------------------------------------
// Pools.

TEST_F(CudaTest, Pools) {
  const Tensor x = Uniform({2, 3, 17, 15}, 200, -1.f, 1.f);
  const Options o{.name = "MaxPoolF32Cuda"};
  AttributeMap k3s2p1{{"kernel_shape", A::Ints({3, 3})}, {"strides", A::Ints({2, 2})}, {"pads", A::Ints({1, 1, 1, 1})}};
  ExpectCuda(MakeNode("MaxPool", 1, 1, k3s2p1), {x}, {false}, o);
  AttributeMap ceil = k3s2p1;
  ceil["ceil_mode"] = A::Int(1);
  ceil["pads"] = A::Ints({0, 0, 0, 0});
  ExpectCuda(MakeNode("MaxPool", 1, 1, ceil), {x}, {false});
  ExpectCuda(MakeNode("MaxPool", 1, 1, {{"kernel_shape", A::Ints({3, 3})}, {"dilations", A::Ints({2, 2})}}), {x},
             {false});
  ExpectCuda(MakeNode("MaxPool", 1, 1, {{"kernel_shape", A::Ints({2, 3})}, {"pads", A::Ints({1, 0, 0, 2})}}), {x},
             {false});
  ExpectCuda(
      MakeNode(
          "MaxPool", 1, 1,
          {{"kernel_shape", A::Ints({3, 3})}, {"strides", A::Ints({2, 2})}, {"auto_pad", A::String("SAME_UPPER")}}),
      {x}, {false});
  ExpectCuda(MakeNode("MaxPool", 1, 1, {{"kernel_shape", A::Ints({3})}, {"strides", A::Ints({2})}}),
             {Uniform({2, 4, 21}, 201, -1.f, 1.f)}, {false});
  ExpectCuda(MakeNode("MaxPool", 1, 1, {{"kernel_shape", A::Ints({2, 2, 2})}, {"strides", A::Ints({2, 2, 2})}}),
             {Uniform({1, 2, 6, 7, 8}, 202, -1.f, 1.f)}, {false});
  for (int include = 0; include < 2; ++include) {
    SCOPED_TRACE("count_include_pad " + std::to_string(include));
    AttributeMap avg = k3s2p1;
    avg["count_include_pad"] = A::Int(include);
    ExpectCuda(MakeNode("AveragePool", 1, 1, avg), {x}, {false});
    avg["ceil_mode"] = A::Int(1);
    ExpectCuda(MakeNode("AveragePool", 1, 1, avg), {x}, {false});
    ExpectCuda(MakeNode("AveragePool", 1, 1,
                        {{"kernel_shape", A::Ints({3, 3})},
                         {"pads", A::Ints({0, 1, 2, 1})},
                         {"count_include_pad", A::Int(include)}}),
               {x}, {false});
  }
  // Inception's 3x3 stride-1 average pool, and a 2x2 stride-2 one (DenseNet transitions).
  ExpectCuda(
      MakeNode("AveragePool", 1, 1,
               {{"kernel_shape", A::Ints({3, 3})}, {"strides", A::Ints({1, 1})}, {"pads", A::Ints({1, 1, 1, 1})}}),
      {x}, {false});
  ExpectCuda(MakeNode("AveragePool", 1, 1, {{"kernel_shape", A::Ints({2, 2})}, {"strides", A::Ints({2, 2})}}), {x},
             {false});
  ExpectCuda(MakeNode("LpPool", 1, 1, {{"kernel_shape", A::Ints({2, 2})}, {"p", A::Int(2)}}), {x}, {false});
  // MaxPool's indices output: declined.
  ExpectDeclined(MakeNode("MaxPool", 1, 2, {{"kernel_shape", A::Ints({2, 2})}}), {x}, {false});
}

TEST_F(CudaTest, GlobalPools) {
  for (const Shape& s : std::vector<Shape>{{2, 64, 7, 7}, {1, 8, 56, 56}, {3, 5, 1, 1}, {2, 6, 33}, {1, 3, 3, 4, 5}}) {
    SCOPED_TRACE(ShapeToString(s));
    const Tensor x = Uniform(s, 210, -1.f, 1.f);
    ExpectCuda(MakeNode("GlobalAveragePool", 1, 1), {x}, {false}, Options{.tol = kSums});
    ExpectCuda(MakeNode("GlobalMaxPool", 1, 1), {x}, {false});
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Normalisations, softmax, reductions.

TEST_F(CudaTest, BatchNormalization) {
  for (const Shape& s : std::vector<Shape>{{2, 8, 5, 7}, {4, 16}, {1, 3, 10}}) {
    SCOPED_TRACE(ShapeToString(s));
    const int64_t c = s[1];
    const std::vector<Tensor> in{Uniform(s, 220, -2.f, 2.f), Uniform({c}, 221, 0.5f, 1.5f),
                                 Uniform({c}, 222, -1.f, 1.f), Uniform({c}, 223, -0.5f, 0.5f),
                                 Uniform({c}, 224, 0.1f, 2.f)};
    const std::vector<bool> constant{false, true, true, true, true};
    ExpectCuda(MakeNode("BatchNormalization", 5, 1), in, constant, Options{.name = "BatchNormalizationF32Cuda"});
    ExpectCuda(MakeNode("BatchNormalization", 5, 1, {{"epsilon", A::Float(1e-3f)}, {"_activation", A::String("Relu")}}),
               in, constant);
  }
}

TEST_F(CudaTest, Softmax) {
  const Tensor x4 = Uniform({2, 3, 4, 5}, 230, -3.f, 3.f);
  for (int64_t axis : {-1, 1, 0, 2}) {
    SCOPED_TRACE("axis " + std::to_string(axis));
    ExpectCuda(MakeNode("Softmax", 1, 1, {{"axis", A::Int(axis)}}), {x4}, {false}, Options{.opset = 13});
    ExpectCuda(MakeNode("LogSoftmax", 1, 1, {{"axis", A::Int(axis)}}), {x4}, {false}, Options{.opset = 13});
    // opset < 13: the input coerced to 2-D at the axis.
    ExpectCuda(MakeNode("Softmax", 1, 1, {{"axis", A::Int(axis)}}), {x4}, {false}, Options{.opset = 11});
  }
  ExpectCuda(MakeNode("Softmax", 1, 1), {x4}, {false}, Options{.opset = 11});  // default axis 1
  // Classifier and attention rows.
  ExpectCuda(MakeNode("Softmax", 1, 1), {Uniform({4, 1000}, 231, -10.f, 10.f)}, {false}, Options{.opset = 13});
  ExpectCuda(MakeNode("Softmax", 1, 1), {Uniform({1, 12, 197, 197}, 232, -5.f, 5.f)}, {false}, Options{.opset = 13});
  ExpectCuda(MakeNode("Softmax", 1, 1), {Uniform({2, 5000}, 233, -5.f, 5.f)}, {false}, Options{.opset = 13});
}

TEST_F(CudaTest, LayerNormalization) {
  const Options o{.tol = kSums, .name = "LayerNormalizationF32Cuda"};
  ExpectCuda(MakeNode("LayerNormalization", 3, 1),
             {Uniform({2, 197, 768}, 240, -2.f, 2.f), Uniform({768}, 241, 0.5f, 1.5f), Uniform({768}, 242, -1.f, 1.f)},
             {false, true, true}, o);
  ExpectCuda(
      MakeNode("LayerNormalization", 3, 1, {{"axis", A::Int(1)}, {"epsilon", A::Float(1e-6f)}}),
      {Uniform({2, 3, 4, 5}, 243, -2.f, 2.f), Uniform({3, 4, 5}, 244, 0.5f, 1.5f), Uniform({3, 4, 5}, 245, -1.f, 1.f)},
      {false, true, true}, o);
  ExpectCuda(MakeNode("LayerNormalization", 2, 1), {Uniform({6, 10}, 246, -2.f, 2.f), Uniform({10}, 247, 0.5f, 1.5f)},
             {false, true}, o);
  // Mean / inverse std outputs used: declined.
  ExpectDeclined(MakeNode("LayerNormalization", 2, 3),
                 {Uniform({6, 10}, 246, -2.f, 2.f), Uniform({10}, 247, 0.5f, 1.5f)}, {false, true});
}

TEST_F(CudaTest, Reductions) {
  const Tensor x = Uniform({2, 3, 6, 7}, 250, -1.f, 1.f);
  const Options o{.opset = 13, .tol = kSums};
  ExpectCuda(MakeNode("ReduceMean", 1, 1, {{"axes", A::Ints({2, 3})}}), {x}, {false}, o);
  ExpectCuda(MakeNode("ReduceMean", 1, 1, {{"axes", A::Ints({-1})}, {"keepdims", A::Int(0)}}), {x}, {false}, o);
  ExpectCuda(MakeNode("ReduceMean", 1, 1, {{"axes", A::Ints({1})}}), {x}, {false}, o);
  ExpectCuda(MakeNode("ReduceMean", 1, 1), {x}, {false}, o);  // every axis
  ExpectCuda(MakeNode("ReduceMean", 2, 1), {x, I64s({2, 3})}, {false, true}, Options{.opset = 18, .tol = kSums});
  ExpectCuda(MakeNode("ReduceSum", 2, 1, {{"keepdims", A::Int(0)}}), {x, I64s({1})}, {false, true}, o);
  ExpectCuda(MakeNode("ReduceSum", 2, 1), {Uniform({1, 3, 1, 5}, 251, -1.f, 1.f), I64s({1, 2})}, {false, true}, o);
  // Axes that are not one block: declined.
  ExpectDeclined(MakeNode("ReduceMean", 1, 1, {{"axes", A::Ints({0, 2})}}), {x}, {false}, o);
}

// ---------------------------------------------------------------------------------------------------------------
// Data movement.

TEST_F(CudaTest, Transpose) {
  const Tensor x = Uniform({2, 3, 4, 5}, 300, -1.f, 1.f);
  for (const std::vector<int64_t>& perm :
       std::vector<std::vector<int64_t>>{{0, 2, 3, 1}, {0, 3, 1, 2}, {3, 1, 0, 2}, {0, 1, 3, 2}, {0, 1, 2, 3}})
    ExpectCuda(MakeNode("Transpose", 1, 1, {{"perm", A::Ints(perm)}}), {x}, {false}, Options{.name = "TransposeCuda"});
  ExpectCuda(MakeNode("Transpose", 1, 1), {x}, {false});  // reversed dims
  ExpectCuda(MakeNode("Transpose", 1, 1, {{"perm", A::Ints({1, 0})}}), {I64({2, 3}, {1, 2, 3, 4, 5, 6})}, {false});
  // ViT's head split: [1, 197, 12, 64] -> [1, 12, 197, 64] (on a device: 16-byte words).
  ExpectCuda(MakeNode("Transpose", 1, 1, {{"perm", A::Ints({0, 2, 1, 3})}}),
             {Uniform({1, 197, 12, 64}, 301, -1.f, 1.f)}, {false});
  // Transposes that move the contiguous dim (on a device: 32x32 tiles through shared memory), sizes not multiples
  // of the tile: NCHW -> NHWC and back, a matrix transpose per batch, 8-byte elements.
  ExpectCuda(MakeNode("Transpose", 1, 1, {{"perm", A::Ints({0, 2, 3, 1})}}), {Uniform({2, 33, 17, 19}, 302, -1.f, 1.f)},
             {false});
  ExpectCuda(MakeNode("Transpose", 1, 1, {{"perm", A::Ints({0, 3, 1, 2})}}), {Uniform({3, 7, 9, 40}, 303, -1.f, 1.f)},
             {false});
  ExpectCuda(MakeNode("Transpose", 1, 1, {{"perm", A::Ints({0, 1, 3, 2})}}), {Uniform({2, 3, 70, 45}, 304, -1.f, 1.f)},
             {false});
  std::vector<int64_t> ints(48 * 20);
  for (size_t i = 0; i < ints.size(); ++i) ints[i] = static_cast<int64_t>(i * 7919 % 1000003) - 500000;
  ExpectCuda(MakeNode("Transpose", 1, 1, {{"perm", A::Ints({1, 0})}}), {I64({48, 20}, ints)}, {false});
}

TEST_F(CudaTest, Slice) {
  const Tensor x = Uniform({4, 6, 8}, 310, -1.f, 1.f);
  auto slice = [&](std::vector<int64_t> starts, std::vector<int64_t> ends, std::vector<int64_t> axes,
                   std::vector<int64_t> steps) {
    SCOPED_TRACE("starts " + ShapeToString(starts) + " ends " + ShapeToString(ends) + " axes " + ShapeToString(axes) +
                 " steps " + ShapeToString(steps));
    ExpectCuda(MakeNode("Slice", 5, 1), {x, I64s(starts), I64s(ends), I64s(axes), I64s(steps)},
               {false, true, true, true, true}, Options{.opset = 13, .name = "SliceCuda"});
  };
  slice({1}, {3}, {0}, {1});
  slice({0, 2}, {6, 7}, {1, 2}, {2, 3});
  slice({-1}, {-1000}, {2}, {-1});              // reversed axis
  slice({5, 3}, {0, -100}, {1, -1}, {-2, -3});  // negative steps on two axes
  slice({0}, {std::numeric_limits<int64_t>::max()}, {-2}, {1});
  slice({2}, {2}, {0}, {1});  // empty
  ExpectCuda(MakeNode("Slice", 3, 1), {x, I64s({1, 1}), I64s({3, 5})}, {false, true, true}, Options{.opset = 13});
  // opset 9: attributes.
  ExpectCuda(MakeNode("Slice", 1, 1, {{"starts", A::Ints({1})}, {"ends", A::Ints({-1})}, {"axes", A::Ints({2})}}), {x},
             {false}, Options{.opset = 9});
  // Starts computed at run time: declined.
  ExpectDeclined(MakeNode("Slice", 3, 1), {x, I64s({1}), I64s({3})}, {false, false, true}, Options{.opset = 13});
}

TEST_F(CudaTest, ConcatAndSplit) {
  const Tensor a = Uniform({2, 3, 4}, 320, -1.f, 1.f), b = Uniform({2, 5, 4}, 321, -1.f, 1.f),
               c = Uniform({2, 1, 4}, 322, -1.f, 1.f);
  ExpectCuda(MakeNode("Concat", 3, 1, {{"axis", A::Int(1)}}), {a, b, c}, {false, false, false},
             Options{.name = "ConcatCuda"});
  ExpectCuda(MakeNode("Concat", 2, 1, {{"axis", A::Int(0)}}), {a, Uniform({3, 3, 4}, 323, -1.f, 1.f)}, {false, false});
  ExpectCuda(MakeNode("Concat", 2, 1, {{"axis", A::Int(-1)}}), {a, Uniform({2, 3, 2}, 324, -1.f, 1.f)}, {false, false});
  ExpectCuda(MakeNode("Concat", 2, 1, {{"axis", A::Int(0)}}), {I64s({1, 2}), I64s({3})}, {false, true});
  const Tensor x = Uniform({2, 12, 5}, 325, -1.f, 1.f);
  ExpectCuda(MakeNode("Split", 1, 3, {{"axis", A::Int(1)}}), {x}, {false}, Options{.opset = 13, .name = "SplitCuda"});
  ExpectCuda(MakeNode("Split", 2, 3, {{"axis", A::Int(1)}}), {x, I64s({2, 7, 3})}, {false, true}, Options{.opset = 13});
  ExpectCuda(MakeNode("Split", 1, 2, {{"axis", A::Int(-1)}, {"split", A::Ints({1, 4})}}), {x}, {false},
             Options{.opset = 11});
  ExpectCuda(MakeNode("Split", 1, 5, {{"axis", A::Int(1)}, {"num_outputs", A::Int(5)}}), {x}, {false},
             Options{.opset = 18});
}

TEST_F(CudaTest, Gather) {
  const Tensor x = Uniform({5, 4, 3}, 330, -1.f, 1.f);
  ExpectCuda(MakeNode("Gather", 2, 1), {x, I64({2, 2}, {0, -1, 3, 2})}, {false, true}, Options{.name = "GatherCuda"});
  ExpectCuda(MakeNode("Gather", 2, 1, {{"axis", A::Int(1)}}), {x, Tensor::Scalar<int64_t>(-2)}, {false, true});
  ExpectCuda(MakeNode("Gather", 2, 1, {{"axis", A::Int(2)}}), {x, Tensor::FromVector<int32_t>({2}, {2, 0})},
             {false, true});
  ExpectCuda(MakeNode("Gather", 2, 1), {I64({3, 2}, {1, 2, 3, 4, 5, 6}), I64s({2, 0})}, {false, true});
  // ViT's class token: x[:, 0].
  ExpectCuda(MakeNode("Gather", 2, 1, {{"axis", A::Int(1)}}),
             {Uniform({2, 197, 768}, 331, -1.f, 1.f), Tensor::Scalar<int64_t>(0)}, {false, true});
  // Out of range (the host reports the error) or run-time indices: declined.
  ExpectDeclined(MakeNode("Gather", 2, 1), {x, I64s({5})}, {false, true});
  ExpectDeclined(MakeNode("Gather", 2, 1), {x, I64s({1})}, {false, false});
}

TEST_F(CudaTest, Pad) {
  const Tensor x = Uniform({1, 3, 5, 6}, 340, -1.f, 1.f);
  const Options o{.opset = 13, .name = "PadCuda"};
  ExpectCuda(MakeNode("Pad", 2, 1), {x, I64s({0, 0, 1, 2, 0, 0, 3, 1})}, {false, true}, o);
  ExpectCuda(MakeNode("Pad", 3, 1), {x, I64s({0, 0, 1, 1, 0, 0, 1, 1}), Tensor::Scalar(-3.5f)}, {false, true, true}, o);
  ExpectCuda(MakeNode("Pad", 2, 1), {x, I64s({0, 0, -1, 2, 0, 0, 1, -2})}, {false, true}, o);  // crop + pad
  for (const char* mode : {"reflect", "edge", "wrap"}) {
    SCOPED_TRACE(mode);
    ExpectCuda(MakeNode("Pad", 2, 1, {{"mode", A::String(mode)}}), {x, I64s({0, 0, 2, 3, 0, 0, 4, 1})}, {false, true},
               Options{.opset = 19});
  }
  ExpectCuda(MakeNode("Pad", 2, 1, {{"mode", A::String("reflect")}}), {x, I64s({0, 0, 7, 0, 0, 0, 0, 9})},
             {false, true}, Options{.opset = 13});  // pads longer than the axis
  ExpectCuda(MakeNode("Pad", 4, 1), {x, I64s({1, 2, 3, 4}), Tensor(), I64s({2, -1})}, {false, true, true, true},
             Options{.opset = 18});
  ExpectCuda(MakeNode("Pad", 1, 1, {{"pads", A::Ints({0, 0, 1, 1, 0, 0, 1, 1})}, {"value", A::Float(2.f)}}), {x},
             {false}, Options{.opset = 2});
  ExpectCuda(MakeNode("Pad", 2, 1), {I64({2, 2}, {1, 2, 3, 4}), I64s({1, 0, 0, 1})}, {false, true}, o);
}

TEST_F(CudaTest, ExpandAndTile) {
  ExpectCuda(MakeNode("Expand", 2, 1), {Uniform({3, 1}, 350, -1.f, 1.f), I64s({2, 3, 4})}, {false, true},
             Options{.name = "ExpandCuda"});
  ExpectCuda(MakeNode("Expand", 2, 1), {Uniform({1, 4}, 351, -1.f, 1.f), I64s({3, 1})}, {false, true});
  ExpectCuda(MakeNode("Tile", 2, 1), {Uniform({2, 3}, 352, -1.f, 1.f), I64s({2, 3})}, {false, true},
             Options{.name = "TileCuda"});
}

TEST_F(CudaTest, ChannelShuffle) {
  // ShuffleNet: two branches of C/2 channels, groups 2, split into two halves (or one output).
  const Tensor a = Uniform({2, 6, 3, 4}, 370, -1.f, 1.f), b = Uniform({2, 6, 3, 4}, 371, -1.f, 1.f);
  ExpectCuda(MakeNode(kChannelShuffleOp, 2, 2, {{"groups", A::Int(2)}, {"split", A::Ints({6, 6})}}), {a, b},
             {false, false}, Options{.name = "ChannelShuffleCuda"});
  ExpectCuda(MakeNode(kChannelShuffleOp, 2, 1, {{"groups", A::Int(2)}}), {a, b}, {false, false});
  // Uneven inputs and outputs, three groups.
  ExpectCuda(
      MakeNode(kChannelShuffleOp, 3, 3, {{"groups", A::Int(3)}, {"split", A::Ints({5, 1, 6})}}),
      {Uniform({1, 4, 5}, 372, -1.f, 1.f), Uniform({1, 7, 5}, 373, -1.f, 1.f), Uniform({1, 1, 5}, 374, -1.f, 1.f)},
      {false, false, false});
}

TEST_F(CudaTest, Resize) {
  const Tensor x = Uniform({1, 2, 5, 7}, 360, -1.f, 1.f);
  const Options o{.opset = 13, .name = "ResizeF32Cuda"};
  auto with_scales = [&](AttributeMap attrs, std::vector<float> scales) {
    ExpectCuda(MakeNode("Resize", 3, 1, attrs), {x, Tensor(), F32s(scales)}, {false, true, true}, o);
  };
  auto with_sizes = [&](AttributeMap attrs, std::vector<int64_t> sizes) {
    ExpectCuda(MakeNode("Resize", 4, 1, attrs), {x, Tensor(), Tensor(), I64s(sizes)}, {false, true, true, true}, o);
  };
  // Nearest: the default (half_pixel, round_prefer_floor), PaddleOCR/torch's asymmetric + floor, round_prefer_ceil.
  with_scales({{"mode", A::String("nearest")}}, {1, 1, 2, 2});
  with_scales({{"mode", A::String("nearest")},
               {"coordinate_transformation_mode", A::String("asymmetric")},
               {"nearest_mode", A::String("floor")}},
              {1, 1, 2, 3});
  with_scales({{"mode", A::String("nearest")}, {"nearest_mode", A::String("round_prefer_ceil")}}, {1, 1, 0.5f, 0.6f});
  with_sizes({{"mode", A::String("nearest")}, {"nearest_mode", A::String("ceil")}}, {1, 2, 9, 4});
  // Linear: half_pixel up and down, align_corners, pytorch_half_pixel with sizes, asymmetric, half_pixel_symmetric.
  with_scales({{"mode", A::String("linear")}}, {1, 1, 2, 2});
  with_scales({{"mode", A::String("linear")}}, {1, 1, 0.5f, 0.5f});
  with_scales({{"mode", A::String("linear")}, {"coordinate_transformation_mode", A::String("align_corners")}},
              {1, 1, 1.8f, 2.5f});
  with_sizes({{"mode", A::String("linear")}, {"coordinate_transformation_mode", A::String("pytorch_half_pixel")}},
             {1, 2, 1, 11});
  with_scales({{"mode", A::String("linear")}, {"coordinate_transformation_mode", A::String("asymmetric")}},
              {1, 1, 3, 0.7f});
  ExpectCuda(
      MakeNode("Resize", 3, 1,
               {{"mode", A::String("linear")}, {"coordinate_transformation_mode", A::String("half_pixel_symmetric")}}),
      {x, Tensor(), F32s({1, 1, 1.5f, 2.2f})}, {false, true, true}, Options{.opset = 19});
  // Legacy: Upsample (opset 9) and Resize-10.
  ExpectCuda(MakeNode("Upsample", 2, 1, {{"mode", A::String("nearest")}}), {x, F32s({1, 1, 2, 2})}, {false, true},
             Options{.opset = 9});
  ExpectCuda(MakeNode("Resize", 2, 1, {{"mode", A::String("linear")}}), {x, F32s({1, 1, 2, 1.5f})}, {false, true},
             Options{.opset = 10});
  // Cubic: declined.
  ExpectDeclined(MakeNode("Resize", 3, 1, {{"mode", A::String("cubic")}}), {x, Tensor(), F32s({1, 1, 2, 2})},
                 {false, true, true}, o);
}

TEST_F(CudaTest, DeclinesWhatItDoesNotImplement) {
  const Tensor x = Uniform({1, 4, 8, 8}, 400, -1.f, 1.f);
  // The int8 convolution chain, integer data, unknown activations.
  ExpectDeclined(MakeNode("Conv", 2, 1, {{"_int8", A::Int(1)}}), {x, Uniform({4, 4, 1, 1}, 401, -1.f, 1.f)},
                 {false, true}, Options{.needs_device = true});
  ExpectDeclined(MakeNode("Relu", 1, 1), {Tensor::FromVector<int32_t>({2}, {-1, 2})}, {false});
  ExpectDeclined(MakeNode("InstanceNormalization", 3, 1),
                 {x, Uniform({4}, 402, -1.f, 1.f), Uniform({4}, 403, -1.f, 1.f)}, {false, true, true});
}

}  // namespace
}  // namespace osprey
