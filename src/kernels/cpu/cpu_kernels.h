#pragma once
// Fast CPU kernels (oneDNN and hand-written). A factory returns nullptr when it does not handle the case, and the
// runtime falls back to the reference kernel.
#include <memory>

#include "kernels/kernel.h"

namespace osprey {

struct Activation;  // ops/activation.h

/// A prepared fast kernel for the node, or nullptr.
std::unique_ptr<Kernel> CreateCpuKernel(const KernelBuildContext& ctx);

/// Whether this CPU's int8 primitives (oneDNN) sum u8 x s8 products exactly in 32 bits (VNNI or AMX): QDQ convolutions
/// (dnnl_conv_int8.cc) then need no channel pairing against AVX2's 16-bit saturation, and ConvInteger/MatMulInteger
/// (integer_kernels.cc) run in int8 at all. OSPREY_INT8_PAIRING=1 answers false (tests of the other paths on such a
/// machine).
bool Int8ProductsExact();

/// Whether oneDNN has a fast (non-reference) int8 MatMul of two activations on this CPU: u8 x s8 with both zero
/// points at run time (dnnl_matmul_int8.cc). FuseInt8 fuses attention's Q K^T and P V only then, so the fused node
/// never falls to the reference kernel. Checked once per process.
bool Int8MatMulOfActivationsFast();

/// Fast kernels for osprey-domain image ops (image_kernels.cc), or nullptr.
std::unique_ptr<Kernel> CreateImageKernel(const KernelBuildContext& ctx);

/// True when CreateCpuKernel for this node (dtypes/shapes/values as in `ctx`; layouts ignored) will build a kernel
/// that accepts kNhwc on input 0 (and input 3, a fused residual), and produces kNhwc on output 0, in any combination
/// the runtime asks for. The runtime's layout pass keeps channels-last activations between such nodes.
bool CpuKernelSupportsNhwc(const KernelBuildContext& ctx);

/// True when `ctx.node`, a Conv carrying a fused depthwise convolution (ops/fused_depthwise.h), gets a fast fused
/// kernel (oneDNN's 1x1 + depthwise convolution, which exists for some shapes and ISAs only).
bool CpuKernelFusesDepthwise(const KernelBuildContext& ctx);
/// True when `ctx.node`, a Conv carrying a fused PRelu (ops/activation.h), gets oneDNN's kernel with the PRelu as a
/// post-op.
bool CpuKernelFusesPRelu(const KernelBuildContext& ctx);
/// True when `ctx.node`, a Conv whose input carries a fused affine (a BatchNormalization and its ReLU) or is a
/// concatenation of parts (ops/conv_input_scale.h), gets osprey's 1x1 kernel, which forms that input where it reads it;
/// the fusion making the node asks first (FuseConvInputs), so the node never falls to its reference kernel.
bool CpuKernelTakesFusedInput(const KernelBuildContext& ctx);
/// True when `ctx.node`, a Conv carrying a fused MaxPool (ops/fused_pool.h), gets osprey's first-layer kernel, which
/// pools the convolution's rows in the cache; the fusion asks first (FuseConvMaxPool).
bool CpuKernelFusesPool(const KernelBuildContext& ctx);

/// _AttentionViews (ops/matmul_views.h) on AVX-512 or AVX2 with FMA (attention_kernel.cc): nullptr on other CPUs, for
/// other layouts, or where the context rows are not contiguous in the output. The fusion making the node asks first
/// (CpuKernelTakesAttention), so the node never falls to its reference kernel.
namespace cpu {
std::unique_ptr<Kernel> CreateAttentionViews(const KernelBuildContext& ctx);
}
bool CpuKernelTakesAttention(const KernelBuildContext& ctx);

/// True when CreateCpuKernel builds a kernel for this node (dtypes/shapes/values as in `ctx`) that, asked for kNhwc
/// on every tensor input and every output, copies channels-last data without a reorder (channel_kernels.cc: Concat
/// on axis 1, Slice/Split of channels, a Slice box with unit steps, _ChannelShuffle; Resize/Upsample along H and W,
/// resize_kernel.cc; constant
/// Pad along H and W, pad_kernel.cc; rank-4 float32). Such kernels take one layout for all their
/// tensors, so the layout pass makes their outputs channels-last exactly when all their tensor inputs are.
bool CpuKernelFollowsNhwc(const KernelBuildContext& ctx);

/// Reads the kernel tuning cache file into this process's choices now, if it has not been (dnnl_common.cc). A compile
/// calls it before it measures the heap its plan keeps: a file of 10,000 choices takes ~1.5 MB of heap, which was
/// charged to the first plan a process compiled (and made the serve tests' budget arithmetic depend on the file).
namespace cpu {
void LoadKernelTuningChoices();
}

/// Float32 elementwise ops (elementwise_kernels.cc): unary activations and maths, Add/Sub/Mul/Div with any
/// broadcast, classified when the kernel runs from the tensors it gets, so it also serves layout-transparent steps
/// (physical channels-last shapes and [N, H, W, C] views of plain operands). nullptr for other ops or dtypes.
std::unique_ptr<Kernel> CreateElementwiseKernel(const KernelBuildContext& ctx);

/// Where (any dtype of 1, 2, 4 or 8 bytes) and Less/Greater/LessOrEqual/GreaterOrEqual/Equal (float32, int32,
/// int64) with numpy broadcasting, plain tensors (select_kernels.cc). nullptr otherwise.
std::unique_ptr<Kernel> CreateSelectKernel(const KernelBuildContext& ctx);

/// SiLU (x / (1 + e^-x)) on data[0, n) in place, on up to `threads` OpenMP threads, for kernels that apply it to their
/// own output instead of oneDNN's slower swish post-op (elementwise_kernels.cc). FastSiluAvailable(): whether the
/// fast pass (AVX-512, or AVX2 + FMA) exists on this CPU and OSPREY_OWN_SILU is not 0; elsewhere SiluInPlace is a
/// plain loop and oneDNN's post-op is the better choice.
bool FastSiluAvailable();
void SiluInPlace(float* data, int64_t n, int threads);
/// GELU's tanh approximation on data[0, n) in place, on up to `threads` OpenMP threads: the MatMul kernel's pass over
/// its own output instead of oneDNN's post-op (elementwise_kernels.cc).
void GeluTanhInPlace(float* data, int64_t n, int threads);
/// `act` on data[0, n) in place, on up to `threads` OpenMP threads, vectorised as the elementwise kernels' fused steps
/// (SiLU by SiluInPlace): for kernels that apply their activation after a oneDNN primitive (dnnl_conv.cc
/// OwnActivation), or, with `threads` 1 (no parallel region), to each piece of output they write (groupnorm.cc).
void ActivateInPlace(const Activation& act, float* data, int64_t n, int threads);

/// Softmax / LogSoftmax (opset >= 13) over a non-last axis with at least 8 positions after it (softmax_kernel.cc), for
/// when oneDNN has only its reference implementation; nullptr otherwise.
std::unique_ptr<Kernel> CreateStridedSoftmax(const KernelBuildContext& ctx, int64_t axis);

/// The widest SIMD the augmentation kernels (augment_*.cc) may use: 0 (SSE4.1 or scalar), kSimdAvx2, kSimdAvx512 (F
/// and BW with VBMI): what the CPU has, capped by the environment variable OSPREY_AUGMENT_SIMD ("sse4", "avx2"; for
/// tests and measurements of the narrower paths, which give the same results). Kernels read it when they are built.
constexpr int kSimdAvx2 = 1, kSimdAvx512 = 2;
int AugmentSimdLevel();

/// Concat, Slice/Split of channels, _ChannelShuffle and plain Gather (channel_kernels.cc), or nullptr.
std::unique_ptr<Kernel> CreateChannelKernel(const KernelBuildContext& ctx);

/// ReduceSum/Mean/SumSquare/L1/L2/Max/Min of a plain float32 tensor whose reduced axes form one block
/// (reduce_kernel.cc), or nullptr.
std::unique_ptr<Kernel> CreateReduceKernel(const KernelBuildContext& ctx);

/// GlobalMaxPool / GlobalAveragePool of a float32 [N, C, spatial...] tensor (reduce_kernel.cc), or nullptr: plain, a
/// row reduction per channel (oneDNN's pooling on plain data took 0.46 ms for magika's [1, 512, 508]); a channels-last
/// GlobalAveragePool on AVX-512 CPUs, [N, H * W, C] summed over its middle (else nullptr: oneDNN's pooling).
std::unique_ptr<Kernel> CreateGlobalPool(const KernelBuildContext& ctx);

/// Col2Im of plain float32 data with two spatial dims and constant image and block sizes (fold_kernel.cc), or nullptr.
std::unique_ptr<Kernel> CreateCol2ImKernel(const KernelBuildContext& ctx);

/// Transpose of a plain tensor of a 1-, 2-, 4- or 8-byte dtype (transpose_kernel.cc), or nullptr.
std::unique_ptr<Kernel> CreateTransposeKernel(const KernelBuildContext& ctx);
/// GridSample on plain float32 (grid_sample_kernel.cc).
std::unique_ptr<Kernel> CreateGridSampleKernel(const KernelBuildContext& ctx);

/// Pad in constant mode with compile-time pads, value and axes, none negative (pad_kernel.cc): any dtype and rank
/// plain, or rank-4 float32 padded along H and W on channels-last data (PadFollowsNhwc); nullptr otherwise.
std::unique_ptr<Kernel> CreatePadKernel(const KernelBuildContext& ctx);
bool PadFollowsNhwc(const KernelBuildContext& ctx);

/// A kernel converting a float32 rank-4 tensor of logical shape `shape` between kPlain and kNhwc (input 0 -> output
/// 0). Inserted by the runtime's layout pass where a channels-last value meets a node that needs plain input.
std::unique_ptr<Kernel> CreateLayoutReorderKernel(const Shape& shape, Layout from, Layout to, int num_threads);

}  // namespace osprey
