#pragma once
// The device kernels of the CUDA backend as plain launch functions (src/kernels/cuda/*.cu, compiled by nvcc as C++17).
// This header is the only one the .cu files and the host code (*.cc, C++20, osprey types) share: PODs and cudaStream_t,
// no osprey headers. Every Launch* queues work on `stream` and returns cudaGetLastError() (cudaSuccess for empty work);
// none allocates, synchronises or copies between host and device (plans are captured into CUDA Graphs).
// Sizes and offsets are int64 throughout.
#include <cuda_runtime_api.h>

#include <cstdint>

namespace osprey::cuda {

constexpr int kMaxRank = 8;

/// Host emulation (tests on machines without a GPU: tests/gpu with OSPREY_CUDA_TEST_DRY_RUN=1): when on, every Launch*
/// and MemcpyAsync below runs synchronously on the host, on host pointers, through the same per-element code as the
/// device kernels (__host__ __device__), so the kernels' geometry and arithmetic are checked without a device. Off by
/// default; process-wide; never turn it on in a process that uses a real device.
void SetHostEmulation(bool on);
bool HostEmulation();
/// cudaMemcpyAsync device to device on `stream` (a host memmove under emulation).
cudaError_t MemcpyAsync(void* dst, const void* src, size_t bytes, cudaStream_t stream);

// Unary functions: the elementwise unary ops and the fused activations (_activation) are the same table, applied by
// one device function (ApplyUnary in cuda_device.cuh). Formulas are the reference kernels' (kernels/reference).
enum UnaryOp : int {
  kUnaryIdentity = 0,
  kUnaryRelu,
  kUnaryLeakyRelu,  // alpha
  kUnaryClip,       // alpha = min, beta = max
  kUnarySigmoid,
  kUnaryTanh,
  kUnaryHardSigmoid,  // alpha, beta
  kUnaryHardSwish,
  kUnarySilu,
  kUnaryGelu,      // erf form
  kUnaryGeluTanh,  // approximate = "tanh"
  kUnaryExp,
  kUnaryLog,
  kUnarySqrt,
  kUnaryReciprocal,
  kUnaryNeg,
  kUnaryAbs,
  kUnaryErf,
  kUnaryFloor,
  kUnaryCeil,
  kUnaryRound,
  kUnarySin,
  kUnaryCos,
  kUnarySoftplus,
  kUnarySoftsign,
  kUnaryElu,  // alpha
  kUnaryMish,
  kUnarySign,
  kUnarySquare,     // Pow(x, 2)
  kUnaryPowScalar,  // powf(x, alpha)
};

/// A unary function with its parameters (also: a node's fused activation; op kUnaryIdentity = none).
struct Activation {
  int op = kUnaryIdentity;
  float alpha = 0.f;
  float beta = 0.f;
};

enum BinaryOp : int { kBinAdd, kBinSub, kBinMul, kBinDiv, kBinPow, kBinMax, kBinMin, kBinPRelu, kBinMod };
enum CompareOp : int { kCmpEqual, kCmpLess, kCmpGreater, kCmpLessOrEqual, kCmpGreaterOrEqual };

/// Numpy broadcast of up to three operands to the output, dims of size 1 dropped and mergeable dims merged.
/// strides[k][d]: element stride of operand k along output dim d (0 where broadcast).
struct BroadcastGeometry {
  int rank = 0;
  int64_t total = 0;
  int64_t dims[kMaxRank] = {};
  int64_t strides[3][kMaxRank] = {};
  bool contiguous[3] = {false, false, false};  // operand k has the output's shape (its offset is the output index)
};

/// y = act(x) elementwise (op = the unary function). n elements.
cudaError_t LaunchUnary(cudaStream_t stream, const float* x, float* y, int64_t n, Activation op);
/// y = act(op(a, b)) with broadcasting. b == nullptr: b is the immediate `b_value` (a constant scalar).
cudaError_t LaunchBinary(cudaStream_t stream, int op, const BroadcastGeometry& g, const float* a, const float* b,
                         float b_value, float* y, Activation act);
/// y = a <op> b (bool as one byte 0/1), broadcasting.
cudaError_t LaunchCompare(cudaStream_t stream, int op, const BroadcastGeometry& g, const float* a, const float* b,
                          uint8_t* y);
/// out = cond ? x : y (cond one byte per element), broadcasting; operands 0, 1, 2 of g are cond, x, y.
cudaError_t LaunchWhere(cudaStream_t stream, const BroadcastGeometry& g, const uint8_t* cond, const float* x,
                        const float* y, float* out);
/// y[i] = act(y[i] + bias[(i / spatial) % channels] + residual[i]); bias and residual may be null.
/// Conv epilogue (spatial = H*W) and MatMul/Gemm bias (spatial = 1, channels = N).
cudaError_t LaunchBiasResidualAct(cudaStream_t stream, float* y, const float* bias, const float* residual,
                                  int64_t total, int64_t channels, int64_t spatial, Activation act);

// ---------------------------------------------------------------- data movement (any dtype: element_size 1/2/4/8)

/// dst[sum(i_d * dst_strides[d])] = src[sum(i_d * src_strides[d])] over the index space `dims` (src already offset;
/// strides in elements, may be negative or 0).
struct StridedCopyGeometry {
  int rank = 0;
  int64_t total = 0;
  int64_t dims[kMaxRank] = {};
  int64_t src_strides[kMaxRank] = {};
  int64_t dst_strides[kMaxRank] = {};
};
cudaError_t LaunchStridedCopy(cudaStream_t stream, const StridedCopyGeometry& g, const void* src, void* dst,
                              int element_size);

enum PadMode : int { kPadConstant, kPadEdge, kPadReflect, kPadWrap };
/// Pad (the reference's rule): per output dim d and coordinate o, i = o - pad_begin[d]; inside when 0 <= i < kept[d]
/// (source coordinate i + crop_begin[d]), else the fill pattern (constant) or the mode's mirrored/clamped coordinate.
struct PadGeometry {
  int rank = 0;
  int mode = kPadConstant;
  int64_t total = 0;
  int64_t out_dims[kMaxRank] = {};
  int64_t in_strides[kMaxRank] = {};
  int64_t pad_begin[kMaxRank] = {};
  int64_t crop_begin[kMaxRank] = {};
  int64_t kept[kMaxRank] = {};
  uint64_t fill = 0;  // the constant's bytes (element_size of them)
};
cudaError_t LaunchPad(cudaStream_t stream, const PadGeometry& g, const void* src, void* dst, int element_size);

/// out[o, j, i] = data[o, indices[j], i] for o < outer, j < num_indices, i < inner (elements of element_size);
/// indices int64 (or int32 when !indices64), negative ones count from the end (validated at build time).
cudaError_t LaunchGather(cudaStream_t stream, const void* data, const void* indices, bool indices64, void* out,
                         int64_t outer, int64_t axis_dim, int64_t num_indices, int64_t inner, int element_size);

enum ResizeCoord : int {
  kCoordHalfPixel,
  kCoordAsymmetric,
  kCoordAlignCorners,
  kCoordPytorchHalfPixel,
  kCoordTfHalfPixelForNn,
  kCoordHalfPixelSymmetric,
};
enum ResizeNearest : int { kNearestRoundPreferFloor, kNearestRoundPreferCeil, kNearestFloor, kNearestCeil };
/// Resize (nearest or linear, float32) as the reference computes it: per axis the original coordinate (double), its
/// taps, their tensor product.
struct ResizeGeometry {
  int rank = 0;
  bool linear = false;
  bool legacy = false;  // Upsample / Resize-10: asymmetric; nearest rounds up when downscaling, else down
  int coord = kCoordHalfPixel;
  int nearest_mode = kNearestRoundPreferFloor;
  int64_t total = 0;
  int64_t in_dims[kMaxRank] = {};
  int64_t out_dims[kMaxRank] = {};
  int64_t in_strides[kMaxRank] = {};
  double scales[kMaxRank] = {};
};
cudaError_t LaunchResize(cudaStream_t stream, const ResizeGeometry& g, const float* x, float* y);

// ---------------------------------------------------------------- pools, normalisations, reductions (float32)

enum PoolKind : int { kPoolMax, kPoolAverage, kPoolLp };
/// Window ops on planes (N*C) of up to 3 spatial dims (leading dims of size 1), the reference's Window3.
struct PoolGeometry {
  int kind = kPoolMax;
  bool count_include_pad = false;
  int64_t p = 2;  // LpPool
  int64_t planes = 0;
  int64_t in[3] = {1, 1, 1}, out[3] = {1, 1, 1}, k[3] = {1, 1, 1}, s[3] = {1, 1, 1}, d[3] = {1, 1, 1};
  int64_t pb[3] = {0, 0, 0}, pe[3] = {0, 0, 0};
};
cudaError_t LaunchPool(cudaStream_t stream, const PoolGeometry& g, const float* x, float* y);
/// y[p] = mean (or max) of x[p * size .. (p + 1) * size).
cudaError_t LaunchGlobalPool(cudaStream_t stream, const float* x, float* y, int64_t planes, int64_t size, bool is_max);

/// Inference BatchNormalization on [batch, channels, spatial], then the fused activation.
cudaError_t LaunchBatchNorm(cudaStream_t stream, const float* x, float* y, const float* scale, const float* shift,
                            const float* mean, const float* var, float epsilon, int64_t batch, int64_t channels,
                            int64_t spatial, Activation act);

enum SoftmaxKind : int { kSoftmax, kLogSoftmax };
/// Softmax along the middle dim of [outer, len, inner].
cudaError_t LaunchSoftmax(cudaStream_t stream, const float* x, float* y, int64_t outer, int64_t len, int64_t inner,
                          int kind);

/// LayerNormalization of each of `rows` rows of `size`: (x - mean) / sqrt(var + eps) * scale[i] + shift[i]; a stride of
/// 0 broadcasts one value; shift may be null.
cudaError_t LaunchLayerNorm(cudaStream_t stream, const float* x, float* y, const float* scale, int64_t scale_stride,
                            const float* shift, int64_t shift_stride, int64_t rows, int64_t size, float epsilon);

enum ReduceKind : int { kReduceSum, kReduceMean, kReduceMax, kReduceMin };
/// y[o, i] = reduce over r of x[o, r, i] for [outer, reduce, inner].
cudaError_t LaunchReduce(cudaStream_t stream, const float* x, float* y, int64_t outer, int64_t reduce, int64_t inner,
                         int kind);

}  // namespace osprey::cuda
