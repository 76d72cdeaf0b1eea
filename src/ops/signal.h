#pragma once
// DFT, STFT and MelWeightMatrix (signal.cc): what a node asks for, resolved from its attributes, input shapes and
// the values of its size inputs; shared by the schemas and the kernels (kernels/reference/signal.cc). Each throws
// kInvalidArgument naming the node for a request that makes no sense.
#include "osprey/graph.h"
#include "osprey/tensor.h"

namespace osprey {

struct DftParams {
  int64_t axis = 1;    // the signal's dim (never the last, real/imaginary, one)
  int64_t length = 1;  // points transformed: dft_length, else the signal's size (zero-padded or cut to it)
  int64_t bins = 1;    // output size along axis: length, or length / 2 + 1 when onesided
  bool inverse = false, onesided = false;
  // inverse and onesided: complex-to-real, as ONNX Runtime reads it (PyTorch exports torch.fft.irfft so): the input
  // holds bins 0 .. length / 2 of a spectrum with conjugate symmetry, the output is the length real points (a last
  // dim of 1). length is dft_length, else 2 x (bins - 1).
  bool complex_to_real = false;
};
/// `x`: input 0's shape; `dft_length`, `axis` (opset 20's input): null where omitted.
DftParams ResolveDft(const Node& node, int opset, const Shape& x, DType dtype, const Tensor* dft_length,
                     const Tensor* axis);

struct StftParams {
  int64_t step = 1, frame_length = 1, frames = 1, bins = 1;
  bool onesided = true;
};
/// `window_shape`: null without a window. The signal `x` is [batch, length, 1 or 2] or, real, [batch, length].
StftParams ResolveStft(const Node& node, const Shape& x, DType dtype, const Tensor& frame_step,
                       const Shape* window_shape, const Tensor* frame_length);

struct MelParams {
  int64_t mel_bins = 1, dft_length = 1, sample_rate = 1;
  double lower_hz = 0, upper_hz = 0;
};
MelParams ResolveMel(const Node& node, const Tensor& mel_bins, const Tensor& dft_length, const Tensor& sample_rate,
                     const Tensor& lower_hz, const Tensor& upper_hz);

/// Complex multiply-adds a DFT of `length` points giving `bins` outputs per signal may cost before osprey refuses
/// it, where `length` is not a power of two (those take the FFT): a direct transform costs signals x bins x length.
inline constexpr int64_t kMaxDirectDftWork = int64_t{1} << 32;

}  // namespace osprey
