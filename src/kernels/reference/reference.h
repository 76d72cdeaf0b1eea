#pragma once
// Reference kernels, one per op. Looked up by op type.
#include "kernels/kernel.h"
#include "ops/conv_window.h"

namespace osprey {

/// The reference kernel for `op_type`, or nullptr.
ReferenceKernel FindReferenceKernel(const std::string& op_type);

/// An op whose output shapes depend on its input values (OpTraits::data_dependent: NonZero, NonMaxSuppression,
/// Compress, ImageDecoder), run on host tensors between plans (runtime/segments.cc); its outputs are allocated here.
/// inputs[i] is null for an omitted optional input. kUnsupported for any other op; kInvalidArgument for inputs the op
/// refuses.
std::vector<Tensor> RunDataDependentOp(const Node& node, int opset, const std::vector<const Tensor*>& inputs);

/// ImageDecoder's decoder (encoded bytes -> uint8 [H, W, channels], channels 3 or 1; throws kInvalidArgument for a
/// malformed stream, kUnsupported for a format it does not read). Installed by osprey's image library (src/image,
/// which sits above the kernels) when it is linked in; without it ImageDecoder is refused as unsupported.
using ImageDecodeFn = Tensor (*)(const void* data, size_t size, int channels);
void SetImageDecoder(ImageDecodeFn decode);

/// Registration table filled by the per-family Add*ReferenceKernels functions.
struct ReferenceKernelTable {
  std::vector<std::pair<std::string, ReferenceKernel>> entries;
  void Add(const std::string& op_type, ReferenceKernel fn) { entries.emplace_back(op_type, fn); }
};
void AddElementwiseReferenceKernels(ReferenceKernelTable& t);
void AddNnReferenceKernels(ReferenceKernelTable& t);
void AddReductionReferenceKernels(ReferenceKernelTable& t);
void AddShapeReferenceKernels(ReferenceKernelTable& t);
void AddImageReferenceKernels(ReferenceKernelTable& t);
void AddAugmentReferenceKernels(ReferenceKernelTable& t);
void AddInternalReferenceKernels(ReferenceKernelTable& t);  // internal.cc: ops made by fusion (_ChannelShuffle)
void AddRecurrentReferenceKernels(ReferenceKernelTable& t);  // recurrent.cc: RNN, GRU, LSTM
void AddQuantizeReferenceKernels(ReferenceKernelTable& t);  // quantize.cc: QuantizeLinear, QLinearConv, ...
void AddSignalReferenceKernels(ReferenceKernelTable& t);    // signal.cc: DFT, STFT, MelWeightMatrix
void AddFoldReferenceKernels(ReferenceKernelTable& t);      // fold.cc: Col2Im, MaxUnpool
void AddLinalgReferenceKernels(ReferenceKernelTable& t);    // linalg.cc: Det
void AddDeformConvReferenceKernels(ReferenceKernelTable& t);  // deform_conv.cc: DeformConv

/// Spatial geometry of a window op normalised to three dims (leading dims of size 1) so one loop nest serves
/// 1-D, 2-D and 3-D. Pads may be negative only for ConvTranspose (an output larger than the input covers).
/// The matrices of a numpy-style batched MatMul A [..., M, K] x B [..., K, N] (1-D operands promoted as ONNX says):
/// M, K, N, and for each output batch item (row-major over the broadcast batch dims) the element offsets of its A and
/// B matrices.
struct MatMulBatches {
  int64_t m = 0, k = 0, n = 0;
  std::vector<std::pair<int64_t, int64_t>> offsets;  // (A offset, B offset) per output matrix
};
MatMulBatches BatchedMatMul(const Shape& a, const Shape& b);

struct Window3 {
  int64_t in[3] = {1, 1, 1}, out[3] = {1, 1, 1}, k[3] = {1, 1, 1}, s[3] = {1, 1, 1}, d[3] = {1, 1, 1};
  int64_t pb[3] = {0, 0, 0}, pe[3] = {0, 0, 0};
  int64_t InVol() const { return in[0] * in[1] * in[2]; }
  int64_t OutVol() const { return out[0] * out[1] * out[2]; }
  int64_t KVol() const { return k[0] * k[1] * k[2]; }
};

/// Geometry of Conv and the pools (nn.cc): the pads of ResolveConvWindow (ops/conv_window.h), the output sizes of y.
/// x and y are [N, C, D1, ...]; `kernel` is D1...
Window3 MakeWindow(const Node& node, const Shape& x, const Shape& y, const std::vector<int64_t>& kernel);

/// A resolved window (ops/conv_window.h) laid out as a Window3, with the output sizes of y ([N, C, D1, ...]).
Window3 ToWindow3(const ConvWindow& w, const Shape& y);

/// Applies the fused activation described by a node's internal attributes (_activation, _alpha, _beta) in place.
/// Used by the reference Conv/Gemm/MatMul when the fusion pass has folded an activation into them.
void ApplyFusedActivation(const Node& node, float* data, int64_t n);

}  // namespace osprey
