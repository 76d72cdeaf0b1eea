// Data movement: strided copies (Transpose, Slice, Concat, Split, Expand, Tile), Pad, Gather, Resize. Elements are
// moved as 1/2/4/8-byte words, so every dtype goes through the same kernels.
#include "kernels/cuda/cuda_device.cuh"

namespace osprey::cuda {
namespace {

// I: the type of the index arithmetic (uint32_t when the index space fits: 64-bit division is many times slower on a
// GPU, and it is most of a strided copy's work).
template <class T, class I = int64_t>
OSPREY_HD void StridedCopyElement(int64_t i, const StridedCopyGeometry& g, const T* src, T* dst) {
  I rem = static_cast<I>(i);
  int64_t s = 0, d = 0;
  for (int k = g.rank - 1; k >= 0; --k) {
    const I dim = static_cast<I>(g.dims[k]);
    const I c = rem % dim;
    rem /= dim;
    s += static_cast<int64_t>(c) * g.src_strides[k];
    d += static_cast<int64_t>(c) * g.dst_strides[k];
  }
  dst[d] = src[s];
}

template <class T, class I>
__global__ void StridedCopyKernel(const __grid_constant__ StridedCopyGeometry g, const T* src, T* dst) {
  OSPREY_GRID_STRIDE(i, g.total) StridedCopyElement<T, I>(i, g, src, dst);
}

// A transpose that moves the source's contiguous dim `a` (source stride 1) away from the end: 32x32 tiles through
// shared memory, read along a and written along the output's last dim b (destination stride 1), so both sides are
// coalesced. Each block does tiles (block index over [other dims][tiles of a][tiles of b]).
constexpr int kTile = 32;
constexpr int kTileRows = 8;

template <class T>
__global__ void TiledTransposeKernel(const __grid_constant__ StridedCopyGeometry g, int a, int64_t tiles_a,
                                     int64_t tiles_b, int64_t blocks, const T* src, T* dst) {
  __shared__ T tile[kTile][kTile + 1];
  const int b = g.rank - 1;
  const int64_t na = g.dims[a], nb = g.dims[b], sb = g.src_strides[b], da = g.dst_strides[a];
  for (int64_t blk = blockIdx.x; blk < blocks; blk += gridDim.x) {
    int64_t rem = blk;
    const int64_t tb = rem % tiles_b;
    rem /= tiles_b;
    const int64_t ta = rem % tiles_a;
    rem /= tiles_a;
    int64_t s = 0, d = 0;
    for (int k = b - 1; k >= 0; --k) {
      if (k == a) continue;
      const int64_t c = rem % g.dims[k];
      rem /= g.dims[k];
      s += c * g.src_strides[k];
      d += c * g.dst_strides[k];
    }
    const int64_t a0 = ta * kTile, b0 = tb * kTile;
    for (int y = threadIdx.y; y < kTile; y += kTileRows) {
      const int64_t ia = a0 + threadIdx.x, ib = b0 + y;
      if (ia < na && ib < nb) tile[y][threadIdx.x] = src[s + ia + ib * sb];
    }
    __syncthreads();
    for (int y = threadIdx.y; y < kTile; y += kTileRows) {
      const int64_t ia = a0 + y, ib = b0 + threadIdx.x;
      if (ia < na && ib < nb) dst[d + ia * da + ib] = tile[threadIdx.x][y];
    }
    __syncthreads();
  }
}

// The dim to tile with the output's last one, or -1: a dim of source stride 1 while the last one's is not, both at
// least half a tile long.
int TiledTransposeDim(const StridedCopyGeometry& g) {
  const int b = g.rank - 1;
  if (g.rank < 2 || g.dst_strides[b] != 1 || g.src_strides[b] == 1 || g.dims[b] < kTile / 2) return -1;
  for (int a = 0; a < b; ++a)
    if (g.src_strides[a] == 1 && g.dims[a] >= kTile / 2) return a;
  return -1;
}

// The same copy in 16-byte words when the last dim is contiguous on both sides and everything is 16-byte aligned.
bool WidenTo16Bytes(const StridedCopyGeometry& g, int element_size, const void* src, const void* dst,
                    StridedCopyGeometry* wide) {
  const int b = g.rank - 1;
  const int64_t per = 16 / element_size;
  if (g.rank < 1 || element_size > 8 || g.src_strides[b] != 1 || g.dst_strides[b] != 1 || g.dims[b] % per != 0 ||
      reinterpret_cast<uintptr_t>(src) % 16 != 0 || reinterpret_cast<uintptr_t>(dst) % 16 != 0)
    return false;
  for (int k = 0; k < b; ++k)
    if (g.src_strides[k] % per != 0 || g.dst_strides[k] % per != 0) return false;
  *wide = g;
  wide->dims[b] /= per;
  wide->total /= per;
  for (int k = 0; k < b; ++k) {
    wide->src_strides[k] /= per;
    wide->dst_strides[k] /= per;
  }
  return true;
}

template <class T>
cudaError_t StridedCopyOnDevice(cudaStream_t stream, const StridedCopyGeometry& g, const void* src, void* dst) {
  if (g.total < (int64_t{1} << 32))
    StridedCopyKernel<T, uint32_t>
        <<<GridFor(g.total), kBlock, 0, stream>>>(g, static_cast<const T*>(src), static_cast<T*>(dst));
  else
    StridedCopyKernel<T, int64_t>
        <<<GridFor(g.total), kBlock, 0, stream>>>(g, static_cast<const T*>(src), static_cast<T*>(dst));
  return LaunchResult();
}

template <class T>
OSPREY_HD void PadElement(int64_t i, const PadGeometry& g, const T* src, T* dst) {
  int64_t rem = i, offset = 0;
  bool use_fill = false;
  for (int k = g.rank - 1; k >= 0; --k) {
    const int64_t o = rem % g.out_dims[k];
    rem /= g.out_dims[k];
    const int64_t kept = g.kept[k];
    int64_t c = o - g.pad_begin[k];
    if (c < 0 || c >= kept) {
      if (g.mode == kPadConstant || kept == 0) {
        use_fill = true;
        break;
      } else if (g.mode == kPadEdge) {
        c = c < 0 ? 0 : kept - 1;
      } else if (g.mode == kPadWrap) {
        c = ((c % kept) + kept) % kept;
      } else {  // reflect, repeated when the pad exceeds the axis
        const int64_t period = 2 * (kept - 1);
        if (period == 0) {
          c = 0;
        } else {
          c = ((c % period) + period) % period;
          if (c >= kept) c = period - c;
        }
      }
    }
    offset += (c + g.crop_begin[k]) * g.in_strides[k];
  }
  if (use_fill) {
    T fill;
    memcpy(&fill, &g.fill, sizeof(T));
    dst[i] = fill;
  } else {
    dst[i] = src[offset];
  }
}

template <class T>
__global__ void PadKernel(const __grid_constant__ PadGeometry g, const T* src, T* dst) {
  OSPREY_GRID_STRIDE(i, g.total) PadElement(i, g, src, dst);
}

template <class T, class I>
OSPREY_HD void GatherElement(int64_t i, const T* data, const I* indices, T* out, int64_t axis_dim, int64_t num_indices,
                             int64_t inner) {
  const int64_t in = i % inner;
  const int64_t j = (i / inner) % num_indices;
  const int64_t o = i / (inner * num_indices);
  int64_t v = static_cast<int64_t>(indices[j]);
  if (v < 0) v += axis_dim;
  out[i] = data[(o * axis_dim + v) * inner + in];
}

template <class T, class I>
__global__ void GatherKernel(const T* data, const I* indices, T* out, int64_t outer, int64_t axis_dim,
                             int64_t num_indices, int64_t inner) {
  const int64_t total = outer * num_indices * inner;
  OSPREY_GRID_STRIDE(i, total) GatherElement(i, data, indices, out, axis_dim, num_indices, inner);
}

template <class T>
cudaError_t StridedCopyTyped(cudaStream_t stream, const StridedCopyGeometry& g, const void* src, void* dst) {
  if (HostEmulation()) {
    for (int64_t i = 0; i < g.total; ++i) StridedCopyElement(i, g, static_cast<const T*>(src), static_cast<T*>(dst));
    return cudaSuccess;
  }
  if (const int a = TiledTransposeDim(g); a >= 0) {
    const int64_t tiles_a = (g.dims[a] + kTile - 1) / kTile, tiles_b = (g.dims[g.rank - 1] + kTile - 1) / kTile;
    const int64_t blocks = g.total / (g.dims[a] * g.dims[g.rank - 1]) * tiles_a * tiles_b;
    const unsigned grid = static_cast<unsigned>(blocks < (int64_t{1} << 20) ? blocks : (int64_t{1} << 20));
    TiledTransposeKernel<T><<<grid, dim3(kTile, kTileRows), 0, stream>>>(
        g, a, tiles_a, tiles_b, blocks, static_cast<const T*>(src), static_cast<T*>(dst));
    return LaunchResult();
  }
  StridedCopyGeometry wide;
  if (WidenTo16Bytes(g, sizeof(T), src, dst, &wide)) return StridedCopyOnDevice<uint4>(stream, wide, src, dst);
  return StridedCopyOnDevice<T>(stream, g, src, dst);
}

template <class T>
cudaError_t PadTyped(cudaStream_t stream, const PadGeometry& g, const void* src, void* dst) {
  if (HostEmulation()) {
    for (int64_t i = 0; i < g.total; ++i) PadElement(i, g, static_cast<const T*>(src), static_cast<T*>(dst));
    return cudaSuccess;
  }
  PadKernel<T><<<GridFor(g.total), kBlock, 0, stream>>>(g, static_cast<const T*>(src), static_cast<T*>(dst));
  return LaunchResult();
}

template <class T>
cudaError_t GatherTyped(cudaStream_t stream, const void* data, const void* indices, bool indices64, void* out,
                        int64_t outer, int64_t axis_dim, int64_t num_indices, int64_t inner) {
  const int64_t total = outer * num_indices * inner;
  if (HostEmulation()) {
    for (int64_t i = 0; i < total; ++i) {
      if (indices64)
        GatherElement(i, static_cast<const T*>(data), static_cast<const int64_t*>(indices), static_cast<T*>(out),
                      axis_dim, num_indices, inner);
      else
        GatherElement(i, static_cast<const T*>(data), static_cast<const int32_t*>(indices), static_cast<T*>(out),
                      axis_dim, num_indices, inner);
    }
    return cudaSuccess;
  }
  if (indices64)
    GatherKernel<T, int64_t>
        <<<GridFor(total), kBlock, 0, stream>>>(static_cast<const T*>(data), static_cast<const int64_t*>(indices),
                                                static_cast<T*>(out), outer, axis_dim, num_indices, inner);
  else
    GatherKernel<T, int32_t>
        <<<GridFor(total), kBlock, 0, stream>>>(static_cast<const T*>(data), static_cast<const int32_t*>(indices),
                                                static_cast<T*>(out), outer, axis_dim, num_indices, inner);
  return LaunchResult();
}

// ---------------------------------------------------------------- Resize

// The reference's OriginalCoordinate (without tf_crop_and_resize, which the host declines).
OSPREY_HD double OriginalCoordinate(int coord, double x, double scale, int64_t in, int64_t out_int) {
  const double in_f = static_cast<double>(in);
  const double out_f = scale * in_f;
  switch (coord) {
    case kCoordHalfPixel:
      return (x + 0.5) / scale - 0.5;
    case kCoordAsymmetric:
      return x / scale;
    case kCoordAlignCorners:
      return out_f == 1 ? 0.0 : x * (in_f - 1) / (out_f - 1);
    case kCoordPytorchHalfPixel:
      return out_f == 1 ? -0.5 : (x + 0.5) / scale - 0.5;
    case kCoordTfHalfPixelForNn:
      return (x + 0.5) / scale;
    default: {  // half_pixel_symmetric
      const double adjustment = static_cast<double>(out_int) / out_f;
      const double center = in_f / 2;
      return center * (1 - adjustment) + (x + 0.5) / scale - 0.5;
    }
  }
}

OSPREY_HD int64_t ClampIndex(int64_t i, int64_t n) { return i < 0 ? 0 : (i >= n ? n - 1 : i); }

OSPREY_HD void ResizeElement(int64_t i, const ResizeGeometry& g, const float* x, float* y) {
  {
    // Per axis: up to two taps (element offset, weight).
    int64_t off0[kMaxRank], off1[kMaxRank];
    double w0[kMaxRank], w1[kMaxRank];
    int two = 0;  // bit d: axis d has a second tap
    int64_t rem = i;
    for (int d = g.rank - 1; d >= 0; --d) {
      const int64_t o = rem % g.out_dims[d];
      rem /= g.out_dims[d];
      const int64_t in = g.in_dims[d];
      const double xo = g.legacy ? static_cast<double>(o) / g.scales[d]
                                 : OriginalCoordinate(g.coord, static_cast<double>(o), g.scales[d], in, g.out_dims[d]);
      const double fl = floor(xo);
      const double ratio = xo - fl;
      const int64_t base = static_cast<int64_t>(fl);
      if (!g.linear) {
        int64_t idx;
        if (g.legacy) {
          idx = g.scales[d] < 1 ? static_cast<int64_t>(ceil(xo)) : base;
        } else if (ratio == 0) {
          idx = base;
        } else if (g.nearest_mode == kNearestRoundPreferFloor) {
          idx = ratio <= 0.5 ? base : base + 1;
        } else if (g.nearest_mode == kNearestRoundPreferCeil) {
          idx = ratio < 0.5 ? base : base + 1;
        } else if (g.nearest_mode == kNearestFloor) {
          idx = base;
        } else {
          idx = base + 1;
        }
        off0[d] = ClampIndex(idx, in) * g.in_strides[d];
        w0[d] = 1;
      } else {
        // Taps base (1 - ratio) and base + 1 (ratio); a zero-weight tap is dropped as in the reference.
        const double wa = 1 - ratio, wb = ratio;
        if (wa == 0) {
          off0[d] = ClampIndex(base + 1, in) * g.in_strides[d];
          w0[d] = wb;
        } else {
          off0[d] = ClampIndex(base, in) * g.in_strides[d];
          w0[d] = wa;
          if (wb != 0) {
            off1[d] = ClampIndex(base + 1, in) * g.in_strides[d];
            w1[d] = wb;
            two |= 1 << d;
          }
        }
      }
    }
    if (!g.linear) {
      int64_t off = 0;
      for (int d = 0; d < g.rank; ++d) off += off0[d];
      y[i] = x[off];
      return;
    }
    // Tensor product over the axes with two taps (usually H and W).
    double sum = 0;
    for (int mask = two;; mask = (mask - 1) & two) {
      int64_t off = 0;
      double w = 1;
      for (int d = 0; d < g.rank; ++d) {
        if (mask & (1 << d)) {
          off += off1[d];
          w *= w1[d];
        } else {
          off += off0[d];
          w *= w0[d];
        }
      }
      sum += w * static_cast<double>(x[off]);
      if (mask == 0) break;
    }
    y[i] = static_cast<float>(sum);
  }
}

__global__ void ResizeKernel(const __grid_constant__ ResizeGeometry g, const float* x, float* y) {
  OSPREY_GRID_STRIDE(i, g.total) ResizeElement(i, g, x, y);
}

}  // namespace

cudaError_t LaunchStridedCopy(cudaStream_t stream, const StridedCopyGeometry& g, const void* src, void* dst,
                              int element_size) {
  if (g.total <= 0) return cudaSuccess;
  switch (element_size) {
    case 1:
      return StridedCopyTyped<uint8_t>(stream, g, src, dst);
    case 2:
      return StridedCopyTyped<uint16_t>(stream, g, src, dst);
    case 4:
      return StridedCopyTyped<uint32_t>(stream, g, src, dst);
    case 8:
      return StridedCopyTyped<uint64_t>(stream, g, src, dst);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t LaunchPad(cudaStream_t stream, const PadGeometry& g, const void* src, void* dst, int element_size) {
  if (g.total <= 0) return cudaSuccess;
  switch (element_size) {
    case 1:
      return PadTyped<uint8_t>(stream, g, src, dst);
    case 2:
      return PadTyped<uint16_t>(stream, g, src, dst);
    case 4:
      return PadTyped<uint32_t>(stream, g, src, dst);
    case 8:
      return PadTyped<uint64_t>(stream, g, src, dst);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t LaunchGather(cudaStream_t stream, const void* data, const void* indices, bool indices64, void* out,
                         int64_t outer, int64_t axis_dim, int64_t num_indices, int64_t inner, int element_size) {
  if (outer <= 0 || num_indices <= 0 || inner <= 0) return cudaSuccess;
  switch (element_size) {
    case 1:
      return GatherTyped<uint8_t>(stream, data, indices, indices64, out, outer, axis_dim, num_indices, inner);
    case 2:
      return GatherTyped<uint16_t>(stream, data, indices, indices64, out, outer, axis_dim, num_indices, inner);
    case 4:
      return GatherTyped<uint32_t>(stream, data, indices, indices64, out, outer, axis_dim, num_indices, inner);
    case 8:
      return GatherTyped<uint64_t>(stream, data, indices, indices64, out, outer, axis_dim, num_indices, inner);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t LaunchResize(cudaStream_t stream, const ResizeGeometry& g, const float* x, float* y) {
  if (g.total <= 0) return cudaSuccess;
  if (HostEmulation()) {
    for (int64_t i = 0; i < g.total; ++i) ResizeElement(i, g, x, y);
    return cudaSuccess;
  }
  ResizeKernel<<<GridFor(g.total), kBlock, 0, stream>>>(g, x, y);
  return LaunchResult();
}

}  // namespace osprey::cuda
