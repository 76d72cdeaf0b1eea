// Reference kernels of the signal family (ops/signal.h): DFT, STFT, MelWeightMatrix. Transforms run in double
// precision: a radix-2 FFT where the length is a power of two, else a direct sum over a table of the length's roots
// of unity (refused beyond kMaxDirectDftWork multiply-adds: a hostile dft_length must not buy hours of CPU).
#include "ops/signal.h"

#include <cmath>
#include <complex>
#include <vector>

#include "kernels/reference/reference.h"

namespace osprey {
namespace {

using Complex = std::complex<double>;

const Tensor* Optional(KernelContext& ctx, int i) {
  return i < static_cast<int>(ctx.inputs.size()) && ctx.inputs[i] != nullptr && ctx.inputs[i]->numel() > 0
             ? ctx.inputs[i]
             : nullptr;
}

int64_t Product(const Shape& s, int64_t begin, int64_t end) {
  int64_t n = 1;
  for (int64_t i = begin; i < end; ++i) n *= s[i];
  return n;
}

bool PowerOfTwo(int64_t n) { return n > 0 && (n & (n - 1)) == 0; }

// Transforms of one length: `in` holds `length` points (zero-padded or cut by the caller); the first `bins` outputs
// are written to `out` (forward: sum x[t] e^(-2 pi i k t / n); inverse: the same with +, divided by n).
class Transform {
 public:
  Transform(int64_t length, bool inverse) : n_(length), inverse_(inverse), fft_(PowerOfTwo(length)) {
    roots_.resize(static_cast<size_t>(n_));
    const double sign = inverse ? 1.0 : -1.0;
    for (int64_t m = 0; m < n_; ++m) roots_[m] = std::polar(1.0, sign * 2 * M_PI * static_cast<double>(m) / n_);
  }
  bool fft() const { return fft_; }

  void Run(std::vector<Complex>& in, int64_t bins, Complex* out) const {
    const double scale = inverse_ ? 1.0 / static_cast<double>(n_) : 1.0;
    if (fft_) {
      Fft(in);
      for (int64_t k = 0; k < bins; ++k) out[k] = in[k] * scale;
      return;
    }
    for (int64_t k = 0; k < bins; ++k) {
      Complex sum = 0;
      int64_t m = 0;  // k * t mod n, advanced by k each step
      for (int64_t t = 0; t < n_; ++t) {
        sum += in[t] * roots_[m];
        m += k;
        if (m >= n_) m -= n_;
      }
      out[k] = sum * scale;
    }
  }

 private:
  // In place, iterative radix-2 (bit-reversed order first).
  void Fft(std::vector<Complex>& a) const {
    const int64_t n = n_;
    for (int64_t i = 1, j = 0; i < n; ++i) {
      int64_t bit = n >> 1;
      for (; j & bit; bit >>= 1) j ^= bit;
      j ^= bit;
      if (i < j) std::swap(a[i], a[j]);
    }
    for (int64_t len = 2; len <= n; len <<= 1) {
      const int64_t stride = n / len;
      for (int64_t i = 0; i < n; i += len)
        for (int64_t j = 0; j < len / 2; ++j) {
          const Complex u = a[i + j], v = a[i + j + len / 2] * roots_[j * stride];
          a[i + j] = u + v;
          a[i + j + len / 2] = u - v;
        }
    }
  }

  int64_t n_;
  bool inverse_, fft_;
  std::vector<Complex> roots_;
};

void CheckWork(const Node& node, const Transform& transform, int64_t signals, int64_t bins, int64_t length) {
  if (transform.fft()) return;
  const long double work = static_cast<long double>(signals) * bins * length;
  if (work > static_cast<long double>(kMaxDirectDftWork))
    throw Error(ErrorCode::kUnsupported,
                node.Describe() + ": a transform of " + std::to_string(length) + " points (not a power of two) over " +
                    std::to_string(signals) + " signals costs ~" + std::to_string(static_cast<double>(work)) +
                    " multiply-adds, more than osprey computes directly (2^32); a power-of-two length takes the FFT");
}

void DftKernel(KernelContext& ctx) {
  const Tensor& x = ctx.In(0);
  Tensor& out = ctx.Out(0);
  const DftParams p = ResolveDft(ctx.node, ctx.opset, x.shape(), x.dtype(), Optional(ctx, 1),
                                 ctx.opset >= 20 ? Optional(ctx, 2) : nullptr);
  const int64_t rank = x.rank(), parts = x.dim(rank - 1), size = x.dim(p.axis);
  const int64_t outer = Product(x.shape(), 0, p.axis), inner = Product(x.shape(), p.axis + 1, rank - 1);
  const Transform transform(p.length, p.inverse);
  CheckWork(ctx.node, transform, outer * inner, p.bins, p.length);
  const float* in = x.data<float>();
  float* o = out.data<float>();
  std::vector<Complex> signal(static_cast<size_t>(p.length)), result(static_cast<size_t>(p.bins));
  const int64_t taken = std::min(size, p.length), out_parts = p.complex_to_real ? 1 : 2;
  for (int64_t a = 0; a < outer; ++a)
    for (int64_t b = 0; b < inner; ++b) {
      auto at = [&](int64_t t) {
        const float* v = in + ((a * size + t) * inner + b) * parts;
        return Complex(v[0], parts == 2 ? v[1] : 0.0f);
      };
      for (int64_t t = 0; t < p.length; ++t) {
        if (p.complex_to_real)  // the spectrum's other half by conjugate symmetry
          signal[t] = t < size ? at(t) : std::conj(at(p.length - t));
        else
          signal[t] = t < taken ? at(t) : Complex(0);
      }
      transform.Run(signal, p.bins, result.data());
      for (int64_t k = 0; k < p.bins; ++k) {
        float* w = o + ((a * p.bins + k) * inner + b) * out_parts;
        w[0] = static_cast<float>(result[k].real());
        if (out_parts == 2) w[1] = static_cast<float>(result[k].imag());
      }
    }
}

void StftKernel(KernelContext& ctx) {
  const Tensor& x = ctx.In(0);
  const Tensor* window = Optional(ctx, 2);
  const Shape window_shape = window ? window->shape() : Shape{};
  const StftParams p =
      ResolveStft(ctx.node, x.shape(), x.dtype(), ctx.In(1), window ? &window_shape : nullptr, Optional(ctx, 3));
  if (window && window->dtype() != DType::kF32)
    throw Error(ErrorCode::kInvalidArgument, ctx.node.Describe() + ": window must be float32");
  Tensor& out = ctx.Out(0);
  const int64_t batch = x.dim(0), length = x.dim(1), parts = x.rank() == 3 ? x.dim(2) : 1;
  const Transform transform(p.frame_length, false);
  CheckWork(ctx.node, transform, batch * p.frames, p.bins, p.frame_length);
  const float* in = x.data<float>();
  const float* w = window ? window->data<float>() : nullptr;
  float* o = out.data<float>();
  std::vector<Complex> frame(static_cast<size_t>(p.frame_length)), result(static_cast<size_t>(p.bins));
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t f = 0; f < p.frames; ++f) {
      for (int64_t t = 0; t < p.frame_length; ++t) {
        const int64_t at = f * p.step + t;  // < length: frames are counted so that each fits
        const float* v = in + (b * length + at) * parts;
        const double weight = w ? w[t] : 1.0;
        frame[t] = Complex(v[0] * weight, parts == 2 ? v[1] * weight : 0.0);
      }
      transform.Run(frame, p.bins, result.data());
      for (int64_t k = 0; k < p.bins; ++k) {
        float* y = o + ((b * p.frames + f) * p.bins + k) * 2;
        y[0] = static_cast<float>(result[k].real());
        y[1] = static_cast<float>(result[k].imag());
      }
    }
}

// Triangular filters between mel points spaced evenly from the lower to the upper edge (HTK's mel scale), each
// point rounded down to a spectrogram bin, as the ONNX reference computes them (its spacing divides by the number of
// points, num_mel_bins + 2, and the edges' mel values are float32).
void MelWeightMatrixKernel(KernelContext& ctx) {
  const MelParams p = ResolveMel(ctx.node, ctx.In(0), ctx.In(1), ctx.In(2), ctx.In(3), ctx.In(4));
  Tensor& out = ctx.Out(0);
  const int64_t rows = p.dft_length / 2 + 1, cols = p.mel_bins, points = cols + 2;
  const float low_mel = 2595.0f * std::log10(1.0f + static_cast<float>(p.lower_hz) / 700.0f);
  const float high_mel = 2595.0f * std::log10(1.0f + static_cast<float>(p.upper_hz) / 700.0f);
  const float step = (high_mel - low_mel) / static_cast<float>(points);
  std::vector<int64_t> bin(static_cast<size_t>(points));
  for (int64_t i = 0; i < points; ++i) {
    const double mel = static_cast<double>(i) * static_cast<double>(step) + static_cast<double>(low_mel);
    const double hz = 700.0 * (std::pow(10.0, mel / 2595.0) - 1.0);
    bin[i] = static_cast<int64_t>(std::floor(static_cast<double>(p.dft_length + 1) * hz / p.sample_rate));
    if (bin[i] < 0 || bin[i] >= rows)
      throw Error(ErrorCode::kInvalidArgument, ctx.node.Describe() + ": mel point " + std::to_string(i) +
                                                   " falls in bin " + std::to_string(bin[i]) + ", outside the " +
                                                   std::to_string(rows) + " bins of the spectrogram");
  }
  float* o = out.data<float>();
  std::fill(o, o + rows * cols, 0.0f);
  for (int64_t i = 0; i < cols; ++i) {
    const int64_t left = bin[i], centre = bin[i + 1], right = bin[i + 2];
    if (centre == left) {
      o[centre * cols + i] = 1.0f;
    } else {
      for (int64_t j = left; j <= centre; ++j)
        o[j * cols + i] = static_cast<float>(static_cast<double>(j - left) / static_cast<double>(centre - left));
    }
    for (int64_t j = centre; j < right; ++j)
      o[j * cols + i] = static_cast<float>(static_cast<double>(right - j) / static_cast<double>(right - centre));
  }
}

}  // namespace

void AddSignalReferenceKernels(ReferenceKernelTable& t) {
  t.Add("DFT", DftKernel);
  t.Add("STFT", StftKernel);
  t.Add("MelWeightMatrix", MelWeightMatrixKernel);
}

}  // namespace osprey
