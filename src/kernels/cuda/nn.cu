// Pools, BatchNormalization, Softmax, LayerNormalization and reductions (float32), matching the reference kernels in
// kernels/reference/nn.cc and reduction.cc.
#include "kernels/cuda/cuda_device.cuh"

namespace osprey::cuda {
namespace {

// One output element of one plane.
OSPREY_HD void PoolElement(int64_t i, const PoolGeometry& g, const float* x, float* y) {
  const int64_t out_vol = g.out[0] * g.out[1] * g.out[2];
  const int64_t in_vol = g.in[0] * g.in[1] * g.in[2];
  {
    const int64_t plane = i / out_vol;
    int64_t r = i % out_vol;
    const int64_t ox = r % g.out[2];
    r /= g.out[2];
    const int64_t oy = r % g.out[1];
    const int64_t oz = r / g.out[1];
    const float* xp = x + plane * in_vol;
    const int64_t z0 = oz * g.s[0] - g.pb[0], y0 = oy * g.s[1] - g.pb[1], x0 = ox * g.s[2] - g.pb[2];
    double acc = 0;
    float best = -3.402823466e+38f;  // lowest float, as the reference starts
    bool found = false;
    int64_t valid = 0;
    // Only the taps that land in the input (the reference's TapsWithin): a window may be far longer than it.
    const int64_t start[3] = {z0, y0, x0};
    int64_t lo[3], hi[3];
    for (int d = 0; d < 3; ++d) {
      lo[d] = start[d] >= 0 ? 0 : min(g.k[d], (-start[d] + g.d[d] - 1) / g.d[d]);
      hi[d] = g.in[d] - start[d] <= 0 ? 0 : min(g.k[d], (g.in[d] - start[d] + g.d[d] - 1) / g.d[d]);
    }
    for (int64_t kz = lo[0]; kz < hi[0]; ++kz) {
      const int64_t iz = z0 + kz * g.d[0];
      for (int64_t ky = lo[1]; ky < hi[1]; ++ky) {
        const int64_t iy = y0 + ky * g.d[1];
        const float* row = xp + (iz * g.in[1] + iy) * g.in[2];
        for (int64_t kx = lo[2]; kx < hi[2]; ++kx) {
          const int64_t ix = x0 + kx * g.d[2];
          ++valid;
          const float v = row[ix];
          if (g.kind == kPoolMax) {
            if (v > best || !found) {
              best = v;
              found = true;
            }
          } else if (g.kind == kPoolAverage) {
            acc += v;
          } else {
            acc += g.p == 2 ? static_cast<double>(v) * v : pow(fabs(static_cast<double>(v)), static_cast<double>(g.p));
          }
        }
      }
    }
    if (g.kind == kPoolMax) {
      y[i] = best;
    } else if (g.kind == kPoolAverage) {
      // count_include_pad: the taps in the input or its declared padding, as the reference's PaddedTaps.
      double divisor = static_cast<double>(valid);
      if (g.count_include_pad) {
        divisor = 1;
        for (int d = 0; d < 3; ++d) {
          const int64_t room = g.in[d] + g.pe[d] - start[d];
          divisor *= room <= 0 ? 0. : static_cast<double>(min(g.k[d], (room + g.d[d] - 1) / g.d[d]));
        }
      }
      y[i] = divisor > 0 ? static_cast<float>(acc / static_cast<double>(divisor)) : 0.f;
    } else {
      y[i] = static_cast<float>(g.p == 2 ? sqrt(acc) : pow(acc, 1.0 / static_cast<double>(g.p)));
    }
  }
}

__global__ void PoolKernel(const __grid_constant__ PoolGeometry g, const float* __restrict__ x, float* __restrict__ y) {
  const int64_t total = g.planes * g.out[0] * g.out[1] * g.out[2];
  OSPREY_GRID_STRIDE(i, total) PoolElement(i, g, x, y);
}

// One block per plane.
__global__ void GlobalPoolKernel(const float* __restrict__ x, float* __restrict__ y, int64_t size, bool is_max) {
  __shared__ float shared[32];
  const float* xp = x + blockIdx.x * size;
  float v = is_max ? -INFINITY : 0.f;
  for (int64_t i = threadIdx.x; i < size; i += blockDim.x) v = is_max ? fmaxf(v, xp[i]) : v + xp[i];
  v = BlockReduce(v, is_max ? 1 : 0, shared);
  if (threadIdx.x == 0) {
    if (size == 0)
      y[blockIdx.x] = 0.f;
    else
      y[blockIdx.x] = is_max ? v : v / static_cast<float>(size);
  }
}

OSPREY_HD void BatchNormElement(int64_t i, const float* x, float* y, const float* scale, const float* shift,
                                const float* mean, const float* var, float epsilon, int64_t channels, int64_t spatial,
                                const Activation& act) {
  const int64_t c = (i / spatial) % channels;
  const float a = scale[c] / sqrtf(var[c] + epsilon);
  const float b = shift[c] - mean[c] * a;
  y[i] = ApplyUnary(x[i] * a + b, act);
}

__global__ void BatchNormKernel(const float* __restrict__ x, float* __restrict__ y, const float* scale,
                                const float* shift, const float* mean, const float* var, float epsilon, int64_t total,
                                int64_t channels, int64_t spatial, Activation act) {
  OSPREY_GRID_STRIDE(i, total) BatchNormElement(i, x, y, scale, shift, mean, var, epsilon, channels, spatial, act);
}

// inner == 1: one block per row.
__global__ void SoftmaxRowKernel(const float* __restrict__ x, float* __restrict__ y, int64_t len, int kind) {
  __shared__ float shared[32];
  const float* xr = x + blockIdx.x * len;
  float* yr = y + blockIdx.x * len;
  float m = -INFINITY;
  for (int64_t i = threadIdx.x; i < len; i += blockDim.x) m = fmaxf(m, xr[i]);
  m = BlockReduce(m, 1, shared);
  float s = 0.f;
  for (int64_t i = threadIdx.x; i < len; i += blockDim.x) s += expf(xr[i] - m);
  s = BlockReduce(s, 0, shared);
  if (kind == kSoftmax) {
    const float inv = 1.f / s;
    for (int64_t i = threadIdx.x; i < len; i += blockDim.x) yr[i] = expf(xr[i] - m) * inv;
  } else {
    const float log_sum = logf(s);
    for (int64_t i = threadIdx.x; i < len; i += blockDim.x) yr[i] = xr[i] - m - log_sum;
  }
}

// One (outer, inner) column: inner > 1 on the device, every row under the host emulation.
OSPREY_HD void SoftmaxColumn(int64_t t, const float* x, float* y, int64_t len, int64_t inner, int kind) {
  {
    const int64_t base = (t / inner) * len * inner + t % inner;
    const float* xp = x + base;
    float* yp = y + base;
    float m = xp[0];
    for (int64_t i = 1; i < len; ++i) m = fmaxf(m, xp[i * inner]);
    float s = 0.f;
    for (int64_t i = 0; i < len; ++i) s += expf(xp[i * inner] - m);
    if (kind == kSoftmax) {
      const float inv = 1.f / s;
      for (int64_t i = 0; i < len; ++i) yp[i * inner] = expf(xp[i * inner] - m) * inv;
    } else {
      const float log_sum = logf(s);
      for (int64_t i = 0; i < len; ++i) yp[i * inner] = xp[i * inner] - m - log_sum;
    }
  }
}

__global__ void SoftmaxColumnKernel(const float* __restrict__ x, float* __restrict__ y, int64_t outer, int64_t len,
                                    int64_t inner, int kind) {
  OSPREY_GRID_STRIDE(t, outer * inner) SoftmaxColumn(t, x, y, len, inner, kind);
}

// LayerNorm of one row, sequentially (the host emulation's version of LayerNormKernel).
void LayerNormRowHost(int64_t r, const float* x, float* y, const float* scale, int64_t scale_stride, const float* shift,
                      int64_t shift_stride, int64_t size, float epsilon) {
  const float* xr = x + r * size;
  float* yr = y + r * size;
  float s = 0.f;
  for (int64_t i = 0; i < size; ++i) s += xr[i];
  const float mean = size > 0 ? s / static_cast<float>(size) : 0.f;
  float q = 0.f;
  for (int64_t i = 0; i < size; ++i) q += (xr[i] - mean) * (xr[i] - mean);
  const float var = size > 0 ? q / static_cast<float>(size) : 0.f;
  const float inv_std = 1.f / sqrtf(var + epsilon);
  for (int64_t i = 0; i < size; ++i)
    yr[i] = (xr[i] - mean) * inv_std * scale[i * scale_stride] + (shift ? shift[i * shift_stride] : 0.f);
}

// One block per row; two passes (mean, then the centred sum of squares) as the reference.
__global__ void LayerNormKernel(const float* __restrict__ x, float* __restrict__ y, const float* scale,
                                int64_t scale_stride, const float* shift, int64_t shift_stride, int64_t size,
                                float epsilon) {
  __shared__ float shared[32];
  const float* xr = x + blockIdx.x * size;
  float* yr = y + blockIdx.x * size;
  float s = 0.f;
  for (int64_t i = threadIdx.x; i < size; i += blockDim.x) s += xr[i];
  const float mean = size > 0 ? BlockReduce(s, 0, shared) / static_cast<float>(size) : 0.f;
  float q = 0.f;
  for (int64_t i = threadIdx.x; i < size; i += blockDim.x) {
    const float d = xr[i] - mean;
    q += d * d;
  }
  const float var = size > 0 ? BlockReduce(q, 0, shared) / static_cast<float>(size) : 0.f;
  const float inv_std = 1.f / sqrtf(var + epsilon);
  for (int64_t i = threadIdx.x; i < size; i += blockDim.x) {
    const float b = shift ? shift[i * shift_stride] : 0.f;
    yr[i] = (xr[i] - mean) * inv_std * scale[i * scale_stride] + b;
  }
}

OSPREY_HD float ReduceInit(int kind) { return kind == kReduceMax ? -INFINITY : kind == kReduceMin ? INFINITY : 0.f; }
OSPREY_HD float ReduceStep(int kind, float a, float v) {
  return kind == kReduceMax ? fmaxf(a, v) : kind == kReduceMin ? fminf(a, v) : a + v;
}
OSPREY_HD float ReduceFinish(int kind, float a, int64_t count) {
  return kind == kReduceMean ? a / static_cast<float>(count) : a;
}

// inner == 1: one block per output.
__global__ void ReduceRowKernel(const float* __restrict__ x, float* __restrict__ y, int64_t reduce, int kind) {
  __shared__ float shared[32];
  const float* xr = x + blockIdx.x * reduce;
  float a = ReduceInit(kind);
  for (int64_t i = threadIdx.x; i < reduce; i += blockDim.x) a = ReduceStep(kind, a, xr[i]);
  a = BlockReduce(a, kind == kReduceMax ? 1 : kind == kReduceMin ? 2 : 0, shared);
  if (threadIdx.x == 0) y[blockIdx.x] = ReduceFinish(kind, a, reduce);
}

// One output: inner > 1 on the device, every output under the host emulation.
OSPREY_HD void ReduceColumn(int64_t t, const float* x, float* y, int64_t reduce, int64_t inner, int kind) {
  const float* xp = x + (t / inner) * reduce * inner + t % inner;
  float a = ReduceInit(kind);
  for (int64_t r = 0; r < reduce; ++r) a = ReduceStep(kind, a, xp[r * inner]);
  y[t] = ReduceFinish(kind, a, reduce);
}

__global__ void ReduceColumnKernel(const float* __restrict__ x, float* __restrict__ y, int64_t outer, int64_t reduce,
                                   int64_t inner, int kind) {
  OSPREY_GRID_STRIDE(t, outer * inner) ReduceColumn(t, x, y, reduce, inner, kind);
}

constexpr int64_t kMaxBlocks = 2147483647;

}  // namespace

cudaError_t LaunchPool(cudaStream_t stream, const PoolGeometry& g, const float* x, float* y) {
  const int64_t total = g.planes * g.out[0] * g.out[1] * g.out[2];
  if (total <= 0) return cudaSuccess;
  if (HostEmulation()) {
    for (int64_t i = 0; i < total; ++i) PoolElement(i, g, x, y);
    return cudaSuccess;
  }
  PoolKernel<<<GridFor(total), kBlock, 0, stream>>>(g, x, y);
  return LaunchResult();
}

cudaError_t LaunchGlobalPool(cudaStream_t stream, const float* x, float* y, int64_t planes, int64_t size, bool is_max) {
  if (planes <= 0) return cudaSuccess;
  if (HostEmulation()) {  // sums in order (the device sums as a tree)
    for (int64_t p = 0; p < planes; ++p) {
      float v = is_max ? -INFINITY : 0.f;
      for (int64_t i = 0; i < size; ++i) v = is_max ? fmaxf(v, x[p * size + i]) : v + x[p * size + i];
      y[p] = size == 0 ? 0.f : (is_max ? v : v / static_cast<float>(size));
    }
    return cudaSuccess;
  }
  if (planes > kMaxBlocks) return cudaErrorInvalidConfiguration;
  const int block = size >= 1024 ? 256 : size >= 128 ? 128 : 32;
  GlobalPoolKernel<<<static_cast<unsigned>(planes), block, 0, stream>>>(x, y, size, is_max);
  return LaunchResult();
}

cudaError_t LaunchBatchNorm(cudaStream_t stream, const float* x, float* y, const float* scale, const float* shift,
                            const float* mean, const float* var, float epsilon, int64_t batch, int64_t channels,
                            int64_t spatial, Activation act) {
  const int64_t total = batch * channels * spatial;
  if (total <= 0) return cudaSuccess;
  if (HostEmulation()) {
    for (int64_t i = 0; i < total; ++i)
      BatchNormElement(i, x, y, scale, shift, mean, var, epsilon, channels, spatial, act);
    return cudaSuccess;
  }
  BatchNormKernel<<<GridFor(total), kBlock, 0, stream>>>(x, y, scale, shift, mean, var, epsilon, total, channels,
                                                         spatial, act);
  return LaunchResult();
}

cudaError_t LaunchSoftmax(cudaStream_t stream, const float* x, float* y, int64_t outer, int64_t len, int64_t inner,
                          int kind) {
  if (outer <= 0 || len <= 0 || inner <= 0) return cudaSuccess;
  if (HostEmulation()) {
    for (int64_t t = 0; t < outer * inner; ++t) SoftmaxColumn(t, x, y, len, inner, kind);
    return cudaSuccess;
  }
  if (inner == 1) {
    if (outer > kMaxBlocks) return cudaErrorInvalidConfiguration;
    const int block = len >= 1024 ? 256 : len >= 128 ? 128 : 32;
    SoftmaxRowKernel<<<static_cast<unsigned>(outer), block, 0, stream>>>(x, y, len, kind);
  } else {
    SoftmaxColumnKernel<<<GridFor(outer * inner), kBlock, 0, stream>>>(x, y, outer, len, inner, kind);
  }
  return LaunchResult();
}

cudaError_t LaunchLayerNorm(cudaStream_t stream, const float* x, float* y, const float* scale, int64_t scale_stride,
                            const float* shift, int64_t shift_stride, int64_t rows, int64_t size, float epsilon) {
  if (rows <= 0) return cudaSuccess;
  if (HostEmulation()) {
    for (int64_t r = 0; r < rows; ++r)
      LayerNormRowHost(r, x, y, scale, scale_stride, shift, shift_stride, size, epsilon);
    return cudaSuccess;
  }
  if (rows > kMaxBlocks) return cudaErrorInvalidConfiguration;
  const int block = size >= 1024 ? 256 : size >= 128 ? 128 : 32;
  LayerNormKernel<<<static_cast<unsigned>(rows), block, 0, stream>>>(x, y, scale, scale_stride, shift, shift_stride,
                                                                     size, epsilon);
  return LaunchResult();
}

cudaError_t LaunchReduce(cudaStream_t stream, const float* x, float* y, int64_t outer, int64_t reduce, int64_t inner,
                         int kind) {
  if (outer <= 0 || inner <= 0) return cudaSuccess;
  if (HostEmulation()) {
    for (int64_t t = 0; t < outer * inner; ++t) ReduceColumn(t, x, y, reduce, inner, kind);
    return cudaSuccess;
  }
  if (inner == 1) {
    if (outer > kMaxBlocks) return cudaErrorInvalidConfiguration;
    const int block = reduce >= 1024 ? 256 : reduce >= 128 ? 128 : 32;
    ReduceRowKernel<<<static_cast<unsigned>(outer), block, 0, stream>>>(x, y, reduce, kind);
  } else {
    ReduceColumnKernel<<<GridFor(outer * inner), kBlock, 0, stream>>>(x, y, outer, reduce, inner, kind);
  }
  return LaunchResult();
}

}  // namespace osprey::cuda
