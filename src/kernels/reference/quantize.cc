// Reference kernels of the quantisation op family (schemas: src/ops/quantize.cc). Integer products accumulate in
// int32 after the zero points are subtracted, as ONNX Runtime does; requantisation is float(acc) * (scale_a *
// scale_b / scale_y), rounded half to even, plus the output zero point, saturated. Convolution padding holds the
// input's zero point (real 0).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "kernels/reference/reference.h"
#include "ops/integer_dequantize.h"
#include "ops/op_registry.h"
#include "ops/quantize_params.h"

namespace osprey {
namespace {

constexpr int64_t kMinParallelWork = int64_t{1} << 15;

float ScaleAt(const Tensor& t, int64_t i) {
  if (t.dtype() == DType::kF16) return HalfToFloat(t.data<uint16_t>()[i]);
  return t.data<float>()[i];
}

int32_t IntAt(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::kI8:
      return t.data<int8_t>()[i];
    case DType::kU8:
      return t.data<uint8_t>()[i];
    case DType::kI32:
      return t.data<int32_t>()[i];
    default:
      throw Error(ErrorCode::kInternal, std::string("integer value of dtype ") + DTypeName(t.dtype()));
  }
}

// Zero point i of an optional input (0 when omitted); a 1-element tensor serves every index.
int32_t ZeroPoint(const KernelContext& ctx, int input, int64_t i) {
  if (!ctx.HasIn(input)) return 0;
  const Tensor& t = ctx.In(input);
  return IntAt(t, t.numel() == 1 ? 0 : i);
}

float Scale(const KernelContext& ctx, int input, int64_t i) {
  const Tensor& t = ctx.In(input);
  return ScaleAt(t, t.numel() == 1 ? 0 : i);
}

// round-half-to-even(v) + zero_point, saturated to T (v is not NaN for finite inputs and non-zero scales).
template <class T>
T Saturate(float rounded_plus_zp) {
  const float lo = static_cast<float>(std::numeric_limits<T>::min());
  const float hi = static_cast<float>(std::numeric_limits<T>::max());
  return static_cast<T>(std::min(std::max(rounded_plus_zp, lo), hi));
}

template <class T>
T Quantize(float v, int32_t zero_point) {
  if (std::isnan(v)) return static_cast<T>(zero_point);
  return Saturate<T>(std::nearbyint(v) + static_cast<float>(zero_point));
}

float ValueAsFloat(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::kF32:
      return t.data<float>()[i];
    case DType::kF16:
      return HalfToFloat(t.data<uint16_t>()[i]);
    case DType::kI32:
      return static_cast<float>(t.data<int32_t>()[i]);
    default:
      throw Error(ErrorCode::kInternal, std::string("float value of dtype ") + DTypeName(t.dtype()));
  }
}

// ---------------------------------------------------------------- QuantizeLinear / DequantizeLinear

void QuantizeLinearRef(KernelContext& ctx) {
  const Tensor& x = ctx.In(0);
  const Tensor& scale = ctx.In(1);
  Tensor& y = ctx.Out(0);
  const QuantParams p = ResolveQuantParams(ctx.node, ctx.opset, x.shape(), scale.shape());
  auto run = [&](auto tag) {
    using T = decltype(tag);
    T* yd = y.data<T>();
    if (p.kind == QuantParams::Kind::kPerTensor && x.dtype() == DType::kF32) {  // the common case, without lookups
      const float* xd = x.data<float>();
      const float s = ScaleAt(scale, 0);
      const int32_t zp = ctx.HasIn(2) ? IntAt(ctx.In(2), 0) : 0;
      for (int64_t i = 0; i < x.numel(); ++i) yd[i] = Quantize<T>(xd[i] / s, zp);
      return;
    }
    for (int64_t i = 0; i < x.numel(); ++i) {
      const int64_t q = p.Index(i);
      yd[i] = Quantize<T>(ValueAsFloat(x, i) / ScaleAt(scale, q), ctx.HasIn(2) ? IntAt(ctx.In(2), q) : 0);
    }
  };
  if (y.dtype() == DType::kI8)
    run(int8_t{});
  else
    run(uint8_t{});
}

void DequantizeLinearRef(KernelContext& ctx) {
  const Tensor& x = ctx.In(0);
  const Tensor& scale = ctx.In(1);
  Tensor& y = ctx.Out(0);
  const QuantParams p = ResolveQuantParams(ctx.node, ctx.opset, x.shape(), scale.shape());
  const bool half = y.dtype() == DType::kF16;
  if (p.kind == QuantParams::Kind::kPerTensor && !half && x.dtype() != DType::kI32) {  // the common case
    const float s = ScaleAt(scale, 0);
    const int32_t zp = ctx.HasIn(2) ? IntAt(ctx.In(2), 0) : 0;
    float* yd = y.data<float>();
    if (x.dtype() == DType::kI8)
      for (int64_t i = 0; i < x.numel(); ++i) yd[i] = static_cast<float>(x.data<int8_t>()[i] - zp) * s;
    else
      for (int64_t i = 0; i < x.numel(); ++i) yd[i] = static_cast<float>(x.data<uint8_t>()[i] - zp) * s;
    return;
  }
  for (int64_t i = 0; i < x.numel(); ++i) {
    const int64_t q = p.Index(i);
    const int32_t zp = ctx.HasIn(2) ? IntAt(ctx.In(2), q) : 0;
    const float v = static_cast<float>(static_cast<int64_t>(IntAt(x, i)) - zp) * ScaleAt(scale, q);
    if (half)
      y.data<uint16_t>()[i] = FloatToHalf(v);
    else
      y.data<float>()[i] = v;
  }
}

// y = saturate(round(x / scale) + zp), scale = (max(0, max x) - min(0, min x)) / 255, zp = round(-min / scale).
void DynamicQuantizeLinearRef(KernelContext& ctx) {
  const Tensor& x = ctx.In(0);
  const float* xd = x.data<float>();
  float lo = 0.f, hi = 0.f;
  for (int64_t i = 0; i < x.numel(); ++i) {
    lo = std::min(lo, xd[i]);
    hi = std::max(hi, xd[i]);
  }
  const float scale = (hi - lo) / 255.f;
  uint8_t zp = 0;
  if (scale > 0.f) zp = Quantize<uint8_t>(-lo / scale, 0);
  uint8_t* yd = ctx.Out(0).data<uint8_t>();
  for (int64_t i = 0; i < x.numel(); ++i) yd[i] = scale > 0.f ? Quantize<uint8_t>(xd[i] / scale, zp) : zp;
  ctx.Out(1).data<float>()[0] = scale;
  ctx.Out(2).data<uint8_t>()[0] = zp;
}

// ---------------------------------------------------------------- integer convolution

// acc[n, m, spatial] = sum (x - x_zp) * (w - w_zp[m]) over the window, in int32.
std::vector<int32_t> ConvAccumulate(const KernelContext& ctx, int x_in, int w_in, int x_zp_in, int w_zp_in,
                                    const Shape& y_shape) {
  const Tensor& x = ctx.In(x_in);
  const Tensor& w = ctx.In(w_in);
  const int64_t batch = x.dim(0), channels = x.dim(1), out_channels = w.dim(0);
  const int64_t group = ctx.node.GetInt("group", 1);
  const int64_t group_in = channels / group, group_out = out_channels / group;
  std::vector<int64_t> kernel(w.shape().begin() + 2, w.shape().end());
  const Window3 g = MakeWindow(ctx.node, x.shape(), y_shape, kernel);
  const int64_t kvol = g.KVol(), depth = group_in * kvol, out_vol = g.OutVol(), in_vol = g.InVol();

  const int32_t x_zp = ZeroPoint(ctx, x_zp_in, 0);
  std::vector<int32_t> wq(static_cast<size_t>(w.numel()));
  for (int64_t m = 0; m < out_channels; ++m) {
    const int32_t zp = ZeroPoint(ctx, w_zp_in, m);
    for (int64_t k = 0; k < depth; ++k) wq[m * depth + k] = IntAt(w, m * depth + k) - zp;
  }
  std::vector<int32_t> acc(static_cast<size_t>(batch * out_channels * out_vol), 0);
  std::vector<int32_t> col(static_cast<size_t>(channels * kvol * out_vol));
  for (int64_t n = 0; n < batch; ++n) {
    // col[(c, kz, ky, kx), (oz, oy, ox)] = x[n, c, iz, iy, ix] - x_zp, or 0 in the padding.
#pragma omp parallel for if (channels * kvol * out_vol >= kMinParallelWork)
    for (int64_t row = 0; row < channels * kvol; ++row) {
      const int64_t ch = row / kvol, kidx = row % kvol;
      const int64_t kz = kidx / (g.k[1] * g.k[2]), ky = (kidx / g.k[2]) % g.k[1], kx = kidx % g.k[2];
      const int64_t base = (n * channels + ch) * in_vol;
      int32_t* dst = col.data() + row * out_vol;
      for (int64_t oz = 0; oz < g.out[0]; ++oz) {
        const int64_t iz = oz * g.s[0] - g.pb[0] + kz * g.d[0];
        for (int64_t oy = 0; oy < g.out[1]; ++oy) {
          const int64_t iy = oy * g.s[1] - g.pb[1] + ky * g.d[1];
          for (int64_t ox = 0; ox < g.out[2]; ++ox, ++dst) {
            const int64_t ix = ox * g.s[2] - g.pb[2] + kx * g.d[2];
            const bool inside = iz >= 0 && iz < g.in[0] && iy >= 0 && iy < g.in[1] && ix >= 0 && ix < g.in[2];
            *dst = inside ? IntAt(x, base + (iz * g.in[1] + iy) * g.in[2] + ix) - x_zp : 0;
          }
        }
      }
    }
#pragma omp parallel for if (out_channels * depth * out_vol >= kMinParallelWork)
    for (int64_t m = 0; m < out_channels; ++m) {
      const int64_t gi = m / group_out;
      int32_t* out = acc.data() + (n * out_channels + m) * out_vol;
      for (int64_t k = 0; k < depth; ++k) {
        const int32_t wv = wq[m * depth + k];
        if (wv == 0) continue;
        const int32_t* src = col.data() + (gi * depth + k) * out_vol;
        for (int64_t p = 0; p < out_vol; ++p) out[p] += wv * src[p];
      }
    }
  }
  return acc;
}

// The int32 result, or with `_dequantize` (ops/integer_dequantize.h) float(acc + bias[c]) * scale[c] for channel c of
// axis `channel_axis`.
void WriteIntegerResult(KernelContext& ctx, const std::vector<int32_t>& acc, size_t channel_axis) {
  Tensor& y = ctx.Out(0);
  if (ctx.node.GetInt("_dequantize", 0) == 0) {
    std::copy(acc.begin(), acc.end(), y.data<int32_t>());
    return;
  }
  const Shape& s = y.shape();
  int64_t outer = 1, inner = 1;
  for (size_t d = 0; d < s.size(); ++d) (d < channel_axis ? outer : inner) *= d == channel_axis ? 1 : s[d];
  const int64_t channels = s.empty() ? 1 : s[channel_axis];
  const Tensor* bias = ctx.HasIn(kDequantizeBiasInput) ? &ctx.In(kDequantizeBiasInput) : nullptr;
  const Tensor& scale = ctx.In(kDequantizeScaleInput);
  CheckDequantizeOperands(ctx.node, bias, scale, channels);
  DequantizeRows(acc.data(), outer, channels, inner, bias ? bias->data<int32_t>() : nullptr,
                 bias ? bias->numel() : 0, scale.data<float>(), scale.numel(), y.data<float>());
}

void ConvIntegerRef(KernelContext& ctx) {
  WriteIntegerResult(ctx, ConvAccumulate(ctx, 0, 1, 2, 3, ctx.Out(0).shape()), 1);
}

// Writes round(float(acc + bias[c]) * multiplier[c]) + y_zp, saturated, for channel c = (i / inner) % channels.
void Requantize(const std::vector<int32_t>& acc, const std::vector<int32_t>& bias, const std::vector<float>& multiplier,
                int64_t channels, int64_t inner, int32_t y_zp, Tensor& y) {
  auto run = [&](auto tag) {
    using T = decltype(tag);
    T* yd = y.data<T>();
    for (int64_t i = 0; i < y.numel(); ++i) {
      const int64_t c = (i / inner) % channels;
      const int32_t b = bias.empty() ? 0 : bias[c];
      yd[i] = Quantize<T>(static_cast<float>(acc[i] + b) * multiplier[c], y_zp);
    }
  };
  if (y.dtype() == DType::kI8)
    run(int8_t{});
  else
    run(uint8_t{});
}

// QLinearConv(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, B?)
void QLinearConvRef(KernelContext& ctx) {
  Tensor& y = ctx.Out(0);
  std::vector<int32_t> acc = ConvAccumulate(ctx, 0, 3, 2, 5, y.shape());
  const int64_t out_channels = y.dim(1);
  std::vector<float> multiplier(out_channels);
  std::vector<int32_t> bias;
  for (int64_t m = 0; m < out_channels; ++m) multiplier[m] = Scale(ctx, 1, 0) * Scale(ctx, 4, m) / Scale(ctx, 6, 0);
  if (ctx.HasIn(8)) bias.assign(ctx.In(8).data<int32_t>(), ctx.In(8).data<int32_t>() + out_channels);
  if (y.numel() == 0) return;
  Requantize(acc, bias, multiplier, out_channels, y.numel() / (y.dim(0) * out_channels), ZeroPoint(ctx, 7, 0), y);
}

// ---------------------------------------------------------------- integer matrix product

// acc = (A - a_zp[row]) x (B - b_zp[col]) with numpy batch broadcasting, int32. Returns N (columns).
int64_t MatMulAccumulate(const KernelContext& ctx, int a_in, int b_in, int a_zp_in, int b_zp_in, const Tensor& y,
                         std::vector<int32_t>& acc) {
  const Tensor& a = ctx.In(a_in);
  const Tensor& b = ctx.In(b_in);
  const MatMulBatches mm = BatchedMatMul(a.shape(), b.shape());
  const int64_t m = mm.m, k = mm.k, n = mm.n;

  std::vector<int32_t> aq(static_cast<size_t>(a.numel())), bq(static_cast<size_t>(b.numel()));
  for (int64_t i = 0; i < a.numel(); ++i) aq[i] = IntAt(a, i) - ZeroPoint(ctx, a_zp_in, (i / k) % m);
  for (int64_t i = 0; i < b.numel(); ++i) bq[i] = IntAt(b, i) - ZeroPoint(ctx, b_zp_in, i % n);
  acc.assign(static_cast<size_t>(y.numel()), 0);
  for (size_t i = 0; i < mm.offsets.size(); ++i) {
    const auto [a_off, b_off] = mm.offsets[i];
    int32_t* out = acc.data() + static_cast<int64_t>(i) * m * n;
    for (int64_t r = 0; r < m; ++r)
      for (int64_t kk = 0; kk < k; ++kk) {
        const int32_t av = aq[a_off + r * k + kk];
        const int32_t* brow = bq.data() + b_off + kk * n;
        for (int64_t c = 0; c < n; ++c) out[r * n + c] += av * brow[c];
      }
  }
  return n;
}

void MatMulIntegerRef(KernelContext& ctx) {
  Tensor& y = ctx.Out(0);
  std::vector<int32_t> acc;
  MatMulAccumulate(ctx, 0, 1, 2, 3, y, acc);
  WriteIntegerResult(ctx, acc, y.shape().empty() ? 0 : y.shape().size() - 1);
}

// QLinearMatMul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point)
void QLinearMatMulRef(KernelContext& ctx) {
  Tensor& y = ctx.Out(0);
  std::vector<int32_t> acc;
  const int64_t n = MatMulAccumulate(ctx, 0, 3, 2, 5, y, acc);
  std::vector<float> multiplier(n);
  for (int64_t c = 0; c < n; ++c) multiplier[c] = Scale(ctx, 1, 0) * Scale(ctx, 4, c) / Scale(ctx, 6, 0);
  Requantize(acc, {}, multiplier, n, 1, ZeroPoint(ctx, 7, 0), y);
}

// ---------------------------------------------------------------- com.microsoft ops (ONNX Runtime's contrib kernels)

// C = round(A_scale / C_scale * (A - A_zp) + B_scale / C_scale * (B - B_zp)) + C_zp, numpy broadcasting.
void QLinearAddRef(KernelContext& ctx) {
  const Tensor& a = ctx.In(0);
  const Tensor& b = ctx.In(3);
  Tensor& y = ctx.Out(0);
  const float ratio_a = Scale(ctx, 1, 0) / Scale(ctx, 6, 0), ratio_b = Scale(ctx, 4, 0) / Scale(ctx, 6, 0);
  const int32_t a_zp = ZeroPoint(ctx, 2, 0), b_zp = ZeroPoint(ctx, 5, 0), y_zp = ZeroPoint(ctx, 7, 0);
  const Shape& ys = y.shape();
  const size_t rank = ys.size();
  // Element strides of a and b over y's dims (0 where broadcast).
  auto strides_of = [&](const Shape& s) {
    std::vector<int64_t> st(rank, 0);
    int64_t stride = 1;
    for (size_t i = 0; i < s.size(); ++i) {
      const size_t d = s.size() - 1 - i;
      st[rank - 1 - i] = s[d] == 1 ? 0 : stride;
      stride *= s[d];
    }
    return st;
  };
  const std::vector<int64_t> sa = strides_of(a.shape()), sb = strides_of(b.shape());
  auto run = [&](auto tag) {
    using T = decltype(tag);
    const T* ad = a.data<T>();
    const T* bd = b.data<T>();
    T* yd = y.data<T>();
    if (a.shape() == ys && b.shape() == ys) {  // no broadcasting (residual adds): no index arithmetic
      for (int64_t i = 0; i < y.numel(); ++i)
        yd[i] =
            Quantize<T>(ratio_a * static_cast<float>(ad[i] - a_zp) + ratio_b * static_cast<float>(bd[i] - b_zp), y_zp);
      return;
    }
    for (int64_t i = 0; i < y.numel(); ++i) {
      int64_t rem = i, ia = 0, ib = 0;
      for (size_t d = rank; d-- > 0;) {
        const int64_t coord = rem % ys[d];
        rem /= ys[d];
        ia += coord * sa[d];
        ib += coord * sb[d];
      }
      const float v = ratio_a * static_cast<float>(ad[ia] - a_zp) + ratio_b * static_cast<float>(bd[ib] - b_zp);
      yd[i] = Quantize<T>(v, y_zp);
    }
  };
  if (y.dtype() == DType::kI8)
    run(int8_t{});
  else
    run(uint8_t{});
}

// y = round(float(sum(x) - x_zp * size) * x_scale / (y_scale * size)) + y_zp per (image, channel).
void QLinearGlobalAveragePoolRef(KernelContext& ctx) {
  const Tensor& x = ctx.In(0);
  Tensor& y = ctx.Out(0);
  const bool channels_last = ctx.node.GetInt("channels_last", 0) != 0;
  const int64_t batch = x.dim(0), channels = channels_last ? x.dim(x.rank() - 1) : x.dim(1);
  const int64_t size = batch * channels > 0 ? x.numel() / (batch * channels) : 0;
  const int32_t x_zp = ZeroPoint(ctx, 2, 0), y_zp = ZeroPoint(ctx, 4, 0);
  const float multiplier = Scale(ctx, 1, 0) / (Scale(ctx, 3, 0) * static_cast<float>(size));
  auto run = [&](auto tag) {
    using T = decltype(tag);
    const T* xd = x.data<T>();
    T* yd = y.data<T>();
    for (int64_t n = 0; n < batch; ++n)
      for (int64_t c = 0; c < channels; ++c) {
        int64_t sum = 0;
        for (int64_t i = 0; i < size; ++i)
          sum += channels_last ? xd[(n * size + i) * channels + c] : xd[(n * channels + c) * size + i];
        const int64_t centred = sum - static_cast<int64_t>(x_zp) * size;
        yd[n * channels + c] = Quantize<T>(static_cast<float>(centred) * multiplier, y_zp);
      }
  };
  if (y.dtype() == DType::kI8)
    run(int8_t{});
  else
    run(uint8_t{});
}

// acc = op(A - a_zp) x op(B - b_zp[col]) + C; y = round(float(acc) * alpha * a_scale * b_scale[col] / y_scale) + y_zp,
// or float(acc) * alpha * a_scale * b_scale[col] without y_scale.
void QGemmRef(KernelContext& ctx) {
  const Tensor& a = ctx.In(0);
  const Tensor& b = ctx.In(3);
  Tensor& y = ctx.Out(0);
  const bool trans_a = ctx.node.GetInt("transA", 0) != 0, trans_b = ctx.node.GetInt("transB", 0) != 0;
  const int64_t m = y.dim(0), n = y.dim(1), k = trans_a ? a.dim(0) : a.dim(1);
  const int32_t a_zp = ZeroPoint(ctx, 2, 0);
  std::vector<int32_t> acc(static_cast<size_t>(m * n), 0);
  if (ctx.HasIn(6)) {
    const Tensor& c = ctx.In(6);
    const int64_t cr = c.rank() == 2 ? c.dim(0) : 1, cc = c.rank() >= 1 ? c.dim(c.rank() - 1) : 1;
    for (int64_t r = 0; r < m; ++r)
      for (int64_t j = 0; j < n; ++j) acc[r * n + j] = c.data<int32_t>()[(cr == 1 ? 0 : r) * cc + (cc == 1 ? 0 : j)];
  }
  // Zero points subtracted once, into A' [m, k] and B'^T [n, k], so the products are contiguous dot products.
  std::vector<int32_t> aq(static_cast<size_t>(m * k)), bq(static_cast<size_t>(n * k));
  for (int64_t r = 0; r < m; ++r)
    for (int64_t kk = 0; kk < k; ++kk) aq[r * k + kk] = IntAt(a, trans_a ? kk * m + r : r * k + kk) - a_zp;
  for (int64_t j = 0; j < n; ++j) {
    const int32_t b_zp = ZeroPoint(ctx, 5, j);
    for (int64_t kk = 0; kk < k; ++kk) bq[j * k + kk] = IntAt(b, trans_b ? j * k + kk : kk * n + j) - b_zp;
  }
#pragma omp parallel for if (m * n * k >= kMinParallelWork)
  for (int64_t r = 0; r < m; ++r)
    for (int64_t j = 0; j < n; ++j) {
      int32_t sum = 0;
      for (int64_t kk = 0; kk < k; ++kk) sum += aq[r * k + kk] * bq[j * k + kk];
      acc[r * n + j] += sum;
    }
  const float alpha = ctx.node.GetFloat("alpha", 1.f);
  std::vector<float> multiplier(n);
  for (int64_t j = 0; j < n; ++j)
    multiplier[j] = alpha * Scale(ctx, 1, 0) * Scale(ctx, 4, j) / (ctx.HasIn(7) ? Scale(ctx, 7, 0) : 1.f);
  if (ctx.HasIn(7)) {
    Requantize(acc, {}, multiplier, n, 1, ZeroPoint(ctx, 8, 0), y);
  } else {
    float* yd = y.data<float>();
    for (int64_t i = 0; i < m * n; ++i) yd[i] = static_cast<float>(acc[i]) * multiplier[i % n];
  }
}

}  // namespace

void AddQuantizeReferenceKernels(ReferenceKernelTable& t) {
  t.Add("QuantizeLinear", QuantizeLinearRef);
  t.Add("DequantizeLinear", DequantizeLinearRef);
  t.Add("DynamicQuantizeLinear", DynamicQuantizeLinearRef);
  t.Add("ConvInteger", ConvIntegerRef);
  t.Add("QLinearConv", QLinearConvRef);
  t.Add("MatMulInteger", MatMulIntegerRef);
  t.Add("QLinearMatMul", QLinearMatMulRef);
  t.Add("QLinearAdd", QLinearAddRef);
  t.Add("QLinearGlobalAveragePool", QLinearGlobalAveragePoolRef);
  t.Add("QGemm", QGemmRef);
}

}  // namespace osprey
