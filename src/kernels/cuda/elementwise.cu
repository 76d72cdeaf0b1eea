// Elementwise kernels: unary, binary with numpy broadcasting, comparisons, Where, and the bias/residual/activation
// epilogue of Conv, Gemm and MatMul. Grid-stride loops over int64 indices; operand offsets come from the collapsed
// broadcast geometry computed on the host at build time. Each kernel's per-element code is one OSPREY_HD function,
// which the host emulation (cuda_launch.h) runs in a plain loop.
#include "kernels/cuda/cuda_device.cuh"

namespace osprey::cuda {
namespace {

// Operand offsets of output element i. Every operand is at most the output's size, so when the output has fewer than
// 2^31 elements the index arithmetic runs in 32 bits (64-bit division costs several times more on the GPU).
template <int kOperands>
OSPREY_HD void BroadcastOffsets(const BroadcastGeometry& g, int64_t i, int64_t* off) {
  if (g.total <= 0x7fffffff) {
    uint32_t r = static_cast<uint32_t>(i), o[kOperands];
    for (int k = 0; k < kOperands; ++k) o[k] = 0;
    for (int d = g.rank - 1; d >= 0; --d) {
      const uint32_t dim = static_cast<uint32_t>(g.dims[d]);
      const uint32_t c = r % dim;
      r /= dim;
      for (int k = 0; k < kOperands; ++k) o[k] += c * static_cast<uint32_t>(g.strides[k][d]);
    }
    for (int k = 0; k < kOperands; ++k) off[k] = o[k];
    return;
  }
  for (int k = 0; k < kOperands; ++k) off[k] = 0;
  for (int d = g.rank - 1; d >= 0; --d) {
    const int64_t dim = g.dims[d];
    const int64_t c = i % dim;
    i /= dim;
    for (int k = 0; k < kOperands; ++k) off[k] += c * g.strides[k][d];
  }
}

OSPREY_HD float ApplyBinary(int op, float a, float b) {
  switch (op) {
    case kBinAdd:
      return a + b;
    case kBinSub:
      return a - b;
    case kBinMul:
      return a * b;
    case kBinDiv:
      return a / b;
    case kBinPow:
      return powf(a, b);
    case kBinMax:
      if (a != a || b != b) return QuietNaN();
      return a < b ? b : a;
    case kBinMin:
      if (a != a || b != b) return QuietNaN();
      return b < a ? b : a;
    case kBinPRelu:
      return a < 0.f ? a * b : a;
    case kBinMod:
      return fmodf(a, b);
    default:
      return a;
  }
}

OSPREY_HD bool ApplyCompare(int op, float a, float b) {
  switch (op) {
    case kCmpEqual:
      return a == b;
    case kCmpLess:
      return a < b;
    case kCmpGreater:
      return a > b;
    case kCmpLessOrEqual:
      return a <= b;
    default:
      return a >= b;
  }
}

// ---------------------------------------------------------------- per-element code

OSPREY_HD void UnaryElement(int64_t i, const float* x, float* y, const Activation& op) { y[i] = ApplyUnary(x[i], op); }

// Operands of the output's shape are read at the output index; others through the broadcast strides.
OSPREY_HD void BinaryElement(int64_t i, int op, const BroadcastGeometry& g, const float* a, const float* b,
                             float b_value, float* y, const Activation& act) {
  int64_t off[2] = {i, i};
  if (!g.contiguous[0] || !g.contiguous[1]) BroadcastOffsets<2>(g, i, off);
  const int64_t ia = g.contiguous[0] ? i : off[0];
  const int64_t ib = g.contiguous[1] ? i : off[1];
  const float vb = b ? b[ib] : b_value;
  y[i] = ApplyUnary(ApplyBinary(op, a[ia], vb), act);
}

OSPREY_HD void CompareElement(int64_t i, int op, const BroadcastGeometry& g, const float* a, const float* b,
                              uint8_t* y) {
  int64_t off[2];
  BroadcastOffsets<2>(g, i, off);
  y[i] = ApplyCompare(op, a[off[0]], b[off[1]]) ? 1 : 0;
}

OSPREY_HD void WhereElement(int64_t i, const BroadcastGeometry& g, const uint8_t* cond, const float* x, const float* y,
                            float* out) {
  int64_t off[3];
  BroadcastOffsets<3>(g, i, off);
  out[i] = cond[off[0]] ? x[off[1]] : y[off[2]];
}

OSPREY_HD void BiasResidualActElement(int64_t i, float* y, const float* bias, const float* residual, int64_t channels,
                                      int64_t spatial, const Activation& act) {
  float v = y[i];
  if (bias) v += bias[(i / spatial) % channels];
  if (residual) v += residual[i];
  y[i] = ApplyUnary(v, act);
}

// ---------------------------------------------------------------- kernels

__global__ void UnaryKernel(const float* __restrict__ x, float* __restrict__ y, int64_t n, Activation op) {
  OSPREY_GRID_STRIDE(i, n) UnaryElement(i, x, y, op);
}

__global__ void BinaryKernel(int op, const __grid_constant__ BroadcastGeometry g, const float* a, const float* b,
                             float b_value, float* y, Activation act) {
  OSPREY_GRID_STRIDE(i, g.total) BinaryElement(i, op, g, a, b, b_value, y, act);
}

__global__ void CompareKernel(int op, const __grid_constant__ BroadcastGeometry g, const float* a, const float* b,
                              uint8_t* y) {
  OSPREY_GRID_STRIDE(i, g.total) CompareElement(i, op, g, a, b, y);
}

__global__ void WhereKernel(const __grid_constant__ BroadcastGeometry g, const uint8_t* cond, const float* x,
                            const float* y, float* out) {
  OSPREY_GRID_STRIDE(i, g.total) WhereElement(i, g, cond, x, y, out);
}

__global__ void BiasResidualActKernel(float* y, const float* bias, const float* residual, int64_t total,
                                      int64_t channels, int64_t spatial, Activation act) {
  OSPREY_GRID_STRIDE(i, total) BiasResidualActElement(i, y, bias, residual, channels, spatial, act);
}

}  // namespace

cudaError_t LaunchUnary(cudaStream_t stream, const float* x, float* y, int64_t n, Activation op) {
  if (n <= 0) return cudaSuccess;
  if (HostEmulation()) {
    for (int64_t i = 0; i < n; ++i) UnaryElement(i, x, y, op);
    return cudaSuccess;
  }
  UnaryKernel<<<GridFor(n), kBlock, 0, stream>>>(x, y, n, op);
  return LaunchResult();
}

cudaError_t LaunchBinary(cudaStream_t stream, int op, const BroadcastGeometry& g, const float* a, const float* b,
                         float b_value, float* y, Activation act) {
  if (g.total <= 0) return cudaSuccess;
  if (HostEmulation()) {
    for (int64_t i = 0; i < g.total; ++i) BinaryElement(i, op, g, a, b, b_value, y, act);
    return cudaSuccess;
  }
  BinaryKernel<<<GridFor(g.total), kBlock, 0, stream>>>(op, g, a, b, b_value, y, act);
  return LaunchResult();
}

cudaError_t LaunchCompare(cudaStream_t stream, int op, const BroadcastGeometry& g, const float* a, const float* b,
                          uint8_t* y) {
  if (g.total <= 0) return cudaSuccess;
  if (HostEmulation()) {
    for (int64_t i = 0; i < g.total; ++i) CompareElement(i, op, g, a, b, y);
    return cudaSuccess;
  }
  CompareKernel<<<GridFor(g.total), kBlock, 0, stream>>>(op, g, a, b, y);
  return LaunchResult();
}

cudaError_t LaunchWhere(cudaStream_t stream, const BroadcastGeometry& g, const uint8_t* cond, const float* x,
                        const float* y, float* out) {
  if (g.total <= 0) return cudaSuccess;
  if (HostEmulation()) {
    for (int64_t i = 0; i < g.total; ++i) WhereElement(i, g, cond, x, y, out);
    return cudaSuccess;
  }
  WhereKernel<<<GridFor(g.total), kBlock, 0, stream>>>(g, cond, x, y, out);
  return LaunchResult();
}

cudaError_t LaunchBiasResidualAct(cudaStream_t stream, float* y, const float* bias, const float* residual,
                                  int64_t total, int64_t channels, int64_t spatial, Activation act) {
  if (total <= 0) return cudaSuccess;
  if (channels <= 0) channels = 1;
  if (spatial <= 0) spatial = 1;
  if (HostEmulation()) {
    for (int64_t i = 0; i < total; ++i) BiasResidualActElement(i, y, bias, residual, channels, spatial, act);
    return cudaSuccess;
  }
  BiasResidualActKernel<<<GridFor(total), kBlock, 0, stream>>>(y, bias, residual, total, channels, spatial, act);
  return LaunchResult();
}

}  // namespace osprey::cuda
