// Data movement: strided copies (Transpose, Slice, Concat, Split, Expand, Tile), Pad, Gather, Resize. Elements are
// moved as 1/2/4/8-byte words, so every dtype goes through the same kernels.
#include "kernels/cuda/cuda_device.cuh"

namespace osprey::cuda {
namespace {

template <class T>
OSPREY_HD void StridedCopyElement(int64_t i, const StridedCopyGeometry& g, const T* src, T* dst) {
  int64_t rem = i, s = 0, d = 0;
  for (int k = g.rank - 1; k >= 0; --k) {
    const int64_t c = rem % g.dims[k];
    rem /= g.dims[k];
    s += c * g.src_strides[k];
    d += c * g.dst_strides[k];
  }
  dst[d] = src[s];
}

template <class T>
__global__ void StridedCopyKernel(const __grid_constant__ StridedCopyGeometry g, const T* src, T* dst) {
  OSPREY_GRID_STRIDE(i, g.total) StridedCopyElement(i, g, src, dst);
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
  StridedCopyKernel<T><<<GridFor(g.total), kBlock, 0, stream>>>(g, static_cast<const T*>(src), static_cast<T*>(dst));
  return LaunchResult();
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
