#pragma once
// Device-side helpers shared by the .cu files: launch sizes, the one unary/activation function, block reductions.
// Per-element code is OSPREY_HD (__host__ __device__) so the launchers' host emulation (cuda_launch.h) runs it too.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/cuda/cuda_launch.h"

#define OSPREY_HD __host__ __device__ __forceinline__

// for (i over n) distributed over the grid.
#define OSPREY_GRID_STRIDE(i, n)                                                         \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

namespace osprey::cuda {

constexpr int kBlock = 256;

// Blocks for a grid-stride loop over n items (n > 0).
inline unsigned GridFor(int64_t n, int block = kBlock) {
  int64_t blocks = (n + block - 1) / block;
  if (blocks > 65536) blocks = 65536;
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks);
}

inline cudaError_t LaunchResult() { return cudaGetLastError(); }

// std::max / std::min as the reference kernels use them (a NaN first operand passes through).
OSPREY_HD float StdMax(float a, float b) { return a < b ? b : a; }
OSPREY_HD float StdMin(float a, float b) { return b < a ? b : a; }

OSPREY_HD float QuietNaN() { return nanf(""); }

OSPREY_HD float SigmoidOf(float x) {
  if (x >= 0.f) return 1.f / (1.f + expf(-x));
  const float e = expf(x);
  return e / (1.f + e);
}

OSPREY_HD float SoftplusOf(float x) { return x > 0.f ? x + log1pf(expf(-x)) : log1pf(expf(x)); }

// The unary functions and fused activations (cuda_launch.h, UnaryOp), as the reference kernels write them.
OSPREY_HD float ApplyUnary(float x, const Activation& a) {
  switch (a.op) {
    case kUnaryIdentity:
      return x;
    case kUnaryRelu:
      return x > 0.f ? x : (x == x ? 0.f : x);
    case kUnaryLeakyRelu:
      return x >= 0.f ? x : x * a.alpha;
    case kUnaryClip: {
      const float v = x < a.alpha ? a.alpha : x;
      return a.beta < v ? a.beta : v;
    }
    case kUnarySigmoid:
      return SigmoidOf(x);
    case kUnaryTanh:
      return tanhf(x);
    case kUnaryHardSigmoid:
      return StdMin(StdMax(a.alpha * x + a.beta, 0.f), 1.f);
    case kUnaryHardSwish:
      return x * StdMin(StdMax(x / 6.f + 0.5f, 0.f), 1.f);
    case kUnarySilu:
      return x / (1.f + expf(-x));
    case kUnaryGelu:
      return 0.5f * x * (1.f + erff(x * 0.70710678118654752f));
    case kUnaryGeluTanh:
      return 0.5f * x * (1.f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
    case kUnaryExp:
      return expf(x);
    case kUnaryLog:
      return logf(x);
    case kUnarySqrt:
      return sqrtf(x);
    case kUnaryReciprocal:
      return 1.f / x;
    case kUnaryNeg:
      return -x;
    case kUnaryAbs:
      return fabsf(x);
    case kUnaryErf:
      return erff(x);
    case kUnaryFloor:
      return floorf(x);
    case kUnaryCeil:
      return ceilf(x);
    case kUnaryRound:
      return rintf(x);  // halves to even, as nearbyint
    case kUnarySin:
      return sinf(x);
    case kUnaryCos:
      return cosf(x);
    case kUnarySoftplus:
      return SoftplusOf(x);
    case kUnarySoftsign:
      return x / (1.f + fabsf(x));
    case kUnaryElu:
      return x >= 0.f ? x : a.alpha * expm1f(x);
    case kUnaryMish:
      return x * tanhf(SoftplusOf(x));
    case kUnarySign:
      if (x != x) return x;
      return static_cast<float>((x > 0.f) - (x < 0.f));
    case kUnarySquare:
      return x * x;
    case kUnaryPowScalar:
      return powf(x, a.alpha);
    default:
      return x;
  }
}

// Sum / max over a block (blockDim.x a multiple of 32, at most 1024). Every thread gets the result.
__device__ __forceinline__ float WarpSum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float WarpMax(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float WarpMin(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fminf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// kind 0: sum, 1: max, 2: min. `shared` holds 32 floats. Ends with a barrier, so it may be called repeatedly.
__device__ __forceinline__ float BlockReduce(float v, int kind, float* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  v = kind == 0 ? WarpSum(v) : kind == 1 ? WarpMax(v) : WarpMin(v);
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float w = lane < warps ? shared[lane] : (kind == 0 ? 0.f : kind == 1 ? -INFINITY : INFINITY);
    w = kind == 0 ? WarpSum(w) : kind == 1 ? WarpMax(w) : WarpMin(w);
    if (lane == 0) shared[0] = w;
  }
  __syncthreads();
  const float result = shared[0];
  __syncthreads();
  return result;
}

}  // namespace osprey::cuda
