// Conv through cuDNN's convolution API (cudnnConvolutionForward): 1-D (as 2-D with a height of 1), 2-D and 3-D,
// groups, strides, dilations, explicit pads and auto_pad. Asymmetric padding (SAME_* with an odd total, or explicit
// unequal pads), which cuDNN cannot express, pads the input into the workspace first. Bias, the fused residual and the
// fused activation run as one elementwise epilogue after the convolution (the reference's order:
// act(conv + bias + residual)).
//
// float32 computes with CUDNN_FMA_MATH (no TF32, so results agree with the CPU to float32 rounding); fp16 mode
// (KernelBuildContext::fp16) allows Tensor Core down-conversion (CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION): fp32 in and
// out, half-precision products. The algorithm is chosen at build time with cuDNN's heuristics (no trial runs).
#include <algorithm>
#include <climits>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_internal.h"
#include "kernels/cuda/cuda_libs.h"
#include "kernels/reference/reference.h"
#include "ops/conv_window.h"

#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

namespace osprey::cuda {
namespace {

constexpr size_t kMaxConvWorkspace = size_t{256} << 20;
constexpr size_t kAlign = 256;

size_t AlignUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

bool FitsInt(int64_t v) { return v >= 0 && v <= INT_MAX; }

std::vector<int> ContiguousStridesInt(const std::vector<int>& dims) {
  std::vector<int> st(dims.size(), 1);
  for (int i = static_cast<int>(dims.size()) - 2; i >= 0; --i) st[i] = st[i + 1] * dims[i + 1];
  return st;
}

class ConvKernel final : public CudaKernel {
 public:
  ConvKernel(const KernelBuildContext& bc, const CudnnApi* api)
      : CudaKernel(bc.fp16 ? "ConvF32CudnnFp16" : "ConvF32Cudnn", bc.device.ordinal), api_(api) {}

  ~ConvKernel() override {
    if (x_desc_) api_->DestroyTensorDescriptor(x_desc_);
    if (y_desc_) api_->DestroyTensorDescriptor(y_desc_);
    if (w_desc_) api_->DestroyFilterDescriptor(w_desc_);
    if (conv_desc_) api_->DestroyConvolutionDescriptor(conv_desc_);
  }

  // Returns false when cuDNN cannot run this convolution (the step then runs on the host).
  bool Build(const KernelBuildContext& bc) {
    const Node& node = bc.node;
    const Shape& x = bc.input_shapes[0];
    const Shape& w = bc.input_shapes[1];
    const Shape& y = bc.output_shapes[0];
    const int rank = static_cast<int>(x.size());
    if (rank < 3 || rank > 5 || w.size() != x.size() || y.size() != x.size()) return false;
    const int64_t group = node.GetInt("group", 1);
    if (group < 1 || x[1] % group != 0 || w[0] % group != 0 || w[1] * group != x[1] || y[1] != w[0]) return false;
    for (int64_t d : x)
      if (!FitsInt(d) || d == 0) return false;
    for (int64_t d : y)
      if (!FitsInt(d) || d == 0) return false;
    if (!FitsInt(NumElements(x)) || !FitsInt(NumElements(y)) || !FitsInt(NumElements(w))) return false;
    const std::vector<int64_t> kernel(w.begin() + 2, w.end());
    const Window3 g = MakeWindow(node, x, y, kernel);
    // cuDNN needs at least two spatial dims: 1-D runs as [N, C, 1, W] (Window3's leading dims are 1 / 0).
    const int sp = std::max(rank - 2, 2);
    std::vector<int> in_sp, k_sp, pad, stride, dil;
    std::vector<int64_t> pb, pe;
    for (int j = 3 - sp; j < 3; ++j) {
      in_sp.push_back(static_cast<int>(g.in[j]));
      k_sp.push_back(static_cast<int>(g.k[j]));
      stride.push_back(static_cast<int>(g.s[j]));
      dil.push_back(static_cast<int>(g.d[j]));
      pb.push_back(g.pb[j]);
      pe.push_back(g.pe[j]);
      if (g.pb[j] < 0 || g.pe[j] < 0 || g.s[j] < 1 || g.d[j] < 1) return false;
    }
    asymmetric_ = false;
    for (int i = 0; i < sp; ++i) asymmetric_ = asymmetric_ || pb[i] != pe[i];
    // Asymmetric pads: the input padded into the workspace, then a convolution without padding.
    std::vector<int> x_dims = {static_cast<int>(x[0]), static_cast<int>(x[1])};
    for (int i = 0; i < sp; ++i) {
      const int64_t d = asymmetric_ ? in_sp[i] + pb[i] + pe[i] : in_sp[i];
      if (!FitsInt(d)) return false;
      x_dims.push_back(static_cast<int>(d));
      pad.push_back(asymmetric_ ? 0 : static_cast<int>(pb[i]));
    }
    std::vector<int> y_dims = {static_cast<int>(y[0]), static_cast<int>(y[1])};
    for (int j = 3 - sp; j < 3; ++j) y_dims.push_back(static_cast<int>(g.out[j]));
    std::vector<int> w_dims = {static_cast<int>(w[0]), static_cast<int>(w[1])};
    for (int k : k_sp) w_dims.push_back(k);
    const int nd = sp + 2;
    if (asymmetric_) {
      int64_t padded = 1;
      for (int d : x_dims) padded *= d;
      if (!FitsInt(padded)) return false;
      pad_geometry_.rank = nd;
      pad_geometry_.mode = kPadConstant;
      pad_geometry_.total = padded;
      const std::vector<int> in_dims = [&] {
        std::vector<int> v = {static_cast<int>(x[0]), static_cast<int>(x[1])};
        for (int d : in_sp) v.push_back(d);
        return v;
      }();
      const std::vector<int> in_strides = ContiguousStridesInt(in_dims);
      for (int d = 0; d < nd; ++d) {
        pad_geometry_.out_dims[d] = x_dims[d];
        pad_geometry_.in_strides[d] = in_strides[d];
        pad_geometry_.pad_begin[d] = d < 2 ? 0 : pb[d - 2];
        pad_geometry_.crop_begin[d] = 0;
        pad_geometry_.kept[d] = in_dims[d];
      }
      pad_bytes_ = AlignUp(static_cast<size_t>(padded) * sizeof(float));
    }

    auto ok = [](cudnnStatus_t s) { return s == CUDNN_STATUS_SUCCESS; };
    if (!ok(api_->CreateTensorDescriptor(&x_desc_)) || !ok(api_->CreateTensorDescriptor(&y_desc_)) ||
        !ok(api_->CreateFilterDescriptor(&w_desc_)) || !ok(api_->CreateConvolutionDescriptor(&conv_desc_)))
      return false;
    const std::vector<int> x_strides = ContiguousStridesInt(x_dims), y_strides = ContiguousStridesInt(y_dims);
    if (!ok(api_->SetTensorNdDescriptor(x_desc_, CUDNN_DATA_FLOAT, nd, x_dims.data(), x_strides.data())) ||
        !ok(api_->SetTensorNdDescriptor(y_desc_, CUDNN_DATA_FLOAT, nd, y_dims.data(), y_strides.data())) ||
        !ok(api_->SetFilterNdDescriptor(w_desc_, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, nd, w_dims.data())) ||
        !ok(api_->SetConvolutionNdDescriptor(conv_desc_, sp, pad.data(), stride.data(), dil.data(),
                                             CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT)) ||
        !ok(api_->SetConvolutionGroupCount(conv_desc_, static_cast<int>(group))))
      return false;
    const cudnnMathType_t math = bc.fp16 ? CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION : CUDNN_FMA_MATH;
    if (!ok(api_->SetConvolutionMathType(conv_desc_, math))) return false;
    // cuDNN must agree with the schema's output shape.
    std::vector<int> out(nd, 0);
    if (!ok(api_->GetConvolutionNdForwardOutputDim(conv_desc_, x_desc_, w_desc_, nd, out.data())) || out != y_dims)
      return false;

    cudnnHandle_t handle = DnnHandle(ordinal(), nullptr);
    if (handle == nullptr) return false;
    static std::mutex build_mu;  // the default stream's handle is shared by concurrent builds
    std::lock_guard<std::mutex> lock(build_mu);
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    int returned = 0;
    if (!ok(api_->GetConvolutionForwardAlgorithm_v7(handle, x_desc_, w_desc_, conv_desc_, y_desc_,
                                                    CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &returned, perf)))
      returned = 0;
    bool chosen = false;
    for (int i = 0; i < returned && !chosen; ++i) {
      const cudnnConvolutionFwdAlgoPerf_t& p = perf[i];
      if (p.status != CUDNN_STATUS_SUCCESS) continue;
      if (!bc.fp16) {
        // float32: no Tensor Core math (TF32), and not the FFT / non-fused Winograd algorithms, whose rounding
        // differs from a direct sum by more than float32's.
        if (p.mathType == CUDNN_TENSOR_OP_MATH || p.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) continue;
        if (p.algo == CUDNN_CONVOLUTION_FWD_ALGO_FFT || p.algo == CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING ||
            p.algo == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED)
          continue;
      }
      if (!ok(api_->SetConvolutionMathType(conv_desc_, bc.fp16 ? p.mathType : CUDNN_FMA_MATH))) continue;
      size_t bytes = 0;
      if (!ok(api_->GetConvolutionForwardWorkspaceSize(handle, x_desc_, w_desc_, conv_desc_, y_desc_, p.algo,
                                                       &bytes)) ||
          bytes > kMaxConvWorkspace)
        continue;
      algo_ = p.algo;
      cudnn_workspace_ = bytes;
      chosen = true;
    }
    if (!chosen) {
      // Implicit GEMM runs every configuration with no workspace.
      if (!ok(api_->SetConvolutionMathType(conv_desc_, bc.fp16 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH))) return false;
      size_t bytes = 0;
      algo_ = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
      if (!ok(api_->GetConvolutionForwardWorkspaceSize(handle, x_desc_, w_desc_, conv_desc_, y_desc_, algo_, &bytes)) ||
          bytes > kMaxConvWorkspace)
        return false;
      cudnn_workspace_ = bytes;
    }
    workspace_bytes_ = pad_bytes_ + AlignUp(cudnn_workspace_);

    // Epilogue: bias [M], residual (input 3, the output's shape), activation.
    has_bias_ = bc.present.size() > 2 && bc.present[2];
    if (has_bias_ && (bc.input_dtypes[2] != DType::kF32 || NumElements(bc.input_shapes[2]) != y[1])) return false;
    has_residual_ = node.GetInt("_residual", 0) != 0 && bc.present.size() > 3 && bc.present[3];
    if (has_residual_ && (bc.input_dtypes[3] != DType::kF32 || NumElements(bc.input_shapes[3]) != NumElements(y)))
      return false;
    if (!FusedActivation(node, &act_)) return false;
    channels_ = y[1];
    spatial_ = 1;
    for (size_t i = 2; i < y.size(); ++i) spatial_ *= y[i];
    total_ = NumElements(y);
    return true;
  }

 protected:
  void RunOn(KernelContext& ctx, cudaStream_t stream) override {
    cudnnHandle_t handle = DnnHandle(ordinal(), stream);
    if (handle == nullptr) throw Error(ErrorCode::kInternal, std::string(Name()) + ": cuDNN is not available");
    const void* x = ctx.In(0).raw();
    char* workspace = static_cast<char*>(ctx.workspace);
    if (asymmetric_) {
      Check(LaunchPad(stream, pad_geometry_, x, workspace, sizeof(float)));
      x = workspace;
    }
    void* cudnn_workspace = cudnn_workspace_ > 0 ? workspace + pad_bytes_ : nullptr;
    const float one = 1.f, zero = 0.f;
    float* y = static_cast<float*>(ctx.Out(0).raw());
    const cudnnStatus_t s = api_->ConvolutionForward(handle, &one, x_desc_, x, w_desc_, ctx.In(1).raw(), conv_desc_,
                                                     algo_, cudnn_workspace, cudnn_workspace_, &zero, y_desc_, y);
    if (s != CUDNN_STATUS_SUCCESS)
      throw Error(ErrorCode::kInternal, std::string(Name()) + ": cudnnConvolutionForward: " + api_->GetErrorString(s));
    if (has_bias_ || has_residual_ || act_.op != kUnaryIdentity) {
      const float* bias = has_bias_ ? static_cast<const float*>(ctx.In(2).raw()) : nullptr;
      const float* residual = has_residual_ ? static_cast<const float*>(ctx.In(3).raw()) : nullptr;
      Check(LaunchBiasResidualAct(stream, y, bias, residual, total_, channels_, spatial_, act_));
    }
  }

 private:
  const CudnnApi* api_;
  cudnnTensorDescriptor_t x_desc_ = nullptr, y_desc_ = nullptr;
  cudnnFilterDescriptor_t w_desc_ = nullptr;
  cudnnConvolutionDescriptor_t conv_desc_ = nullptr;
  cudnnConvolutionFwdAlgo_t algo_ = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
  size_t cudnn_workspace_ = 0;
  bool asymmetric_ = false;
  PadGeometry pad_geometry_;
  size_t pad_bytes_ = 0;
  bool has_bias_ = false, has_residual_ = false;
  Activation act_;
  int64_t channels_ = 1, spatial_ = 1, total_ = 0;
};

// ConvTranspose as cuDNN's backward-data convolution: the ONNX input is the forward convolution's output gradient
// ("dy"), the ONNX output its input gradient ("dx"), and ONNX's weight [C_in, C_out / group, k...] is exactly the
// forward filter [K = C_in, C = C_out / group, k...]. Output element o sums inputs i with o = i * s - pad_begin + k * d
// (the reference's rule); cuDNN accepts the shapes when the forward convolution of the output gives back the input's
// shape (checked here: explicit symmetric pads with output_padding < stride, the exports' case). Bias runs as the
// epilogue.
class ConvTransposeKernel final : public CudaKernel {
 public:
  ConvTransposeKernel(const KernelBuildContext& bc, const CudnnApi* api)
      : CudaKernel(bc.fp16 ? "ConvTransposeF32CudnnFp16" : "ConvTransposeF32Cudnn", bc.device.ordinal), api_(api) {}

  ~ConvTransposeKernel() override {
    if (x_desc_) api_->DestroyTensorDescriptor(x_desc_);
    if (y_desc_) api_->DestroyTensorDescriptor(y_desc_);
    if (w_desc_) api_->DestroyFilterDescriptor(w_desc_);
    if (conv_desc_) api_->DestroyConvolutionDescriptor(conv_desc_);
  }

  bool Build(const KernelBuildContext& bc) {
    const Node& node = bc.node;
    const Shape& x = bc.input_shapes[0];
    const Shape& w = bc.input_shapes[1];
    const Shape& y = bc.output_shapes[0];
    const int rank = static_cast<int>(x.size());
    if (rank < 3 || rank > 5 || w.size() != x.size() || y.size() != x.size()) return false;
    const int64_t group = node.GetInt("group", 1);
    if (group < 1 || x[1] % group != 0 || w[0] != x[1] || y[1] != w[1] * group) return false;
    for (const Shape* s : {&x, &y, &w}) {
      for (int64_t d : *s)
        if (!FitsInt(d) || d == 0) return false;
      if (!FitsInt(NumElements(*s))) return false;
    }
    const int n = rank - 2;
    // Only the pad at the start of each axis goes to cuDNN; the output size (y) crops the end.
    const ConvWindow win = ResolveConvTransposeWindow(node, x, std::vector<int64_t>(w.begin() + 2, w.end()));
    const std::vector<int64_t>& strides = win.strides;
    const std::vector<int64_t>& dilations = win.dilations;
    const std::vector<int64_t>& pb = win.pad_begin;
    for (int i = 0; i < n; ++i)
      if (pb[i] < 0 || !FitsInt(pb[i])) return false;
    // 1-D as 2-D with a leading spatial dim of 1.
    const int sp = std::max(n, 2);
    const int lead = sp - n;
    std::vector<int> x_dims = {static_cast<int>(x[0]), static_cast<int>(x[1])};
    std::vector<int> y_dims = {static_cast<int>(y[0]), static_cast<int>(y[1])};
    std::vector<int> w_dims = {static_cast<int>(w[0]), static_cast<int>(w[1])};
    std::vector<int> pad(sp, 0), stride(sp, 1), dil(sp, 1);
    for (int i = 0; i < lead; ++i) {
      x_dims.push_back(1);
      y_dims.push_back(1);
      w_dims.push_back(1);
    }
    for (int i = 0; i < n; ++i) {
      x_dims.push_back(static_cast<int>(x[2 + i]));
      y_dims.push_back(static_cast<int>(y[2 + i]));
      w_dims.push_back(static_cast<int>(w[2 + i]));
      pad[lead + i] = static_cast<int>(pb[i]);
      stride[lead + i] = static_cast<int>(strides[i]);
      dil[lead + i] = static_cast<int>(dilations[i]);
    }
    const int nd = sp + 2;
    auto ok = [](cudnnStatus_t s) { return s == CUDNN_STATUS_SUCCESS; };
    if (!ok(api_->CreateTensorDescriptor(&x_desc_)) || !ok(api_->CreateTensorDescriptor(&y_desc_)) ||
        !ok(api_->CreateFilterDescriptor(&w_desc_)) || !ok(api_->CreateConvolutionDescriptor(&conv_desc_)))
      return false;
    const std::vector<int> x_strides = ContiguousStridesInt(x_dims), y_strides = ContiguousStridesInt(y_dims);
    if (!ok(api_->SetTensorNdDescriptor(x_desc_, CUDNN_DATA_FLOAT, nd, x_dims.data(), x_strides.data())) ||
        !ok(api_->SetTensorNdDescriptor(y_desc_, CUDNN_DATA_FLOAT, nd, y_dims.data(), y_strides.data())) ||
        !ok(api_->SetFilterNdDescriptor(w_desc_, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, nd, w_dims.data())) ||
        !ok(api_->SetConvolutionNdDescriptor(conv_desc_, sp, pad.data(), stride.data(), dil.data(),
                                             CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT)) ||
        !ok(api_->SetConvolutionGroupCount(conv_desc_, static_cast<int>(group))) ||
        !ok(api_->SetConvolutionMathType(conv_desc_, bc.fp16 ? CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION : CUDNN_FMA_MATH)))
      return false;
    // The forward convolution of the output must give the input's shape back.
    std::vector<int> fwd(nd, 0);
    if (!ok(api_->GetConvolutionNdForwardOutputDim(conv_desc_, y_desc_, w_desc_, nd, fwd.data())) || fwd != x_dims)
      return false;

    cudnnHandle_t handle = DnnHandle(ordinal(), nullptr);
    if (handle == nullptr) return false;
    static std::mutex build_mu;
    std::lock_guard<std::mutex> lock(build_mu);
    cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    int returned = 0;
    if (!ok(api_->GetConvolutionBackwardDataAlgorithm_v7(handle, w_desc_, x_desc_, conv_desc_, y_desc_,
                                                         CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &returned, perf)))
      returned = 0;
    bool chosen = false;
    for (int i = 0; i < returned && !chosen; ++i) {
      const cudnnConvolutionBwdDataAlgoPerf_t& p = perf[i];
      if (p.status != CUDNN_STATUS_SUCCESS) continue;
      if (!bc.fp16) {
        if (p.mathType == CUDNN_TENSOR_OP_MATH || p.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) continue;
        if (p.algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT || p.algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING ||
            p.algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED)
          continue;
      }
      if (!ok(api_->SetConvolutionMathType(conv_desc_, bc.fp16 ? p.mathType : CUDNN_FMA_MATH))) continue;
      size_t bytes = 0;
      if (!ok(api_->GetConvolutionBackwardDataWorkspaceSize(handle, w_desc_, x_desc_, conv_desc_, y_desc_, p.algo,
                                                            &bytes)) ||
          bytes > kMaxConvWorkspace)
        continue;
      algo_ = p.algo;
      cudnn_workspace_ = bytes;
      chosen = true;
    }
    if (!chosen) {
      if (!ok(api_->SetConvolutionMathType(conv_desc_, bc.fp16 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH))) return false;
      size_t bytes = 0;
      algo_ = CUDNN_CONVOLUTION_BWD_DATA_ALGO_0;
      if (!ok(api_->GetConvolutionBackwardDataWorkspaceSize(handle, w_desc_, x_desc_, conv_desc_, y_desc_, algo_,
                                                            &bytes)) ||
          bytes > kMaxConvWorkspace)
        return false;
      cudnn_workspace_ = bytes;
    }
    workspace_bytes_ = AlignUp(cudnn_workspace_);
    has_bias_ = bc.present.size() > 2 && bc.present[2];
    if (has_bias_ && (bc.input_dtypes[2] != DType::kF32 || NumElements(bc.input_shapes[2]) != y[1])) return false;
    channels_ = y[1];
    spatial_ = 1;
    for (size_t i = 2; i < y.size(); ++i) spatial_ *= y[i];
    total_ = NumElements(y);
    return true;
  }

 protected:
  void RunOn(KernelContext& ctx, cudaStream_t stream) override {
    cudnnHandle_t handle = DnnHandle(ordinal(), stream);
    if (handle == nullptr) throw Error(ErrorCode::kInternal, std::string(Name()) + ": cuDNN is not available");
    const float one = 1.f, zero = 0.f;
    float* y = static_cast<float*>(ctx.Out(0).raw());
    const cudnnStatus_t s = api_->ConvolutionBackwardData(
        handle, &one, w_desc_, ctx.In(1).raw(), x_desc_, ctx.In(0).raw(), conv_desc_, algo_,
        cudnn_workspace_ > 0 ? ctx.workspace : nullptr, cudnn_workspace_, &zero, y_desc_, y);
    if (s != CUDNN_STATUS_SUCCESS)
      throw Error(ErrorCode::kInternal,
                  std::string(Name()) + ": cudnnConvolutionBackwardData: " + api_->GetErrorString(s));
    if (has_bias_)
      Check(LaunchBiasResidualAct(stream, y, static_cast<const float*>(ctx.In(2).raw()), nullptr, total_, channels_,
                                  spatial_, Activation{}));
  }

 private:
  const CudnnApi* api_;
  cudnnTensorDescriptor_t x_desc_ = nullptr, y_desc_ = nullptr;
  cudnnFilterDescriptor_t w_desc_ = nullptr;
  cudnnConvolutionDescriptor_t conv_desc_ = nullptr;
  cudnnConvolutionBwdDataAlgo_t algo_ = CUDNN_CONVOLUTION_BWD_DATA_ALGO_0;
  size_t cudnn_workspace_ = 0;
  bool has_bias_ = false;
  int64_t channels_ = 1, spatial_ = 1, total_ = 0;
};

}  // namespace

std::unique_ptr<Kernel> CreateConvKernel(const KernelBuildContext& bc) {
  const Node& node = bc.node;
  if (node.GetInt("_int8", 0) != 0) return nullptr;  // the int8 chain's rounding steps: host only
  // Fused depthwise, PRelu, input scale or pool: CPU plans only.
  if (node.Has("_dw_strides") || node.Has("_prelu") || node.Has("_input_scale") || node.Has("_input_affine") ||
      node.Has("_input_parts") || node.Has("_pool_kernel"))
    return nullptr;
  if (bc.input_dtypes.size() < 2 || bc.input_dtypes[0] != DType::kF32 || bc.input_dtypes[1] != DType::kF32 ||
      bc.output_dtypes[0] != DType::kF32 || !bc.present[0] || !bc.present[1])
    return nullptr;
  const CudnnApi* api = Cudnn();
  if (api == nullptr) return nullptr;
  auto kernel = std::make_unique<ConvKernel>(bc, api);
  if (!kernel->Build(bc)) return nullptr;
  return kernel;
}

std::unique_ptr<Kernel> CreateConvTransposeKernel(const KernelBuildContext& bc) {
  const Node& node = bc.node;
  if (node.Has("_activation")) return nullptr;  // the reference ConvTranspose applies none
  if (bc.input_dtypes.size() < 2 || bc.input_dtypes[0] != DType::kF32 || bc.input_dtypes[1] != DType::kF32 ||
      bc.output_dtypes[0] != DType::kF32 || !bc.present[0] || !bc.present[1])
    return nullptr;
  const CudnnApi* api = Cudnn();
  if (api == nullptr) return nullptr;
  auto kernel = std::make_unique<ConvTransposeKernel>(bc, api);
  if (!kernel->Build(bc)) return nullptr;
  return kernel;
}

}  // namespace osprey::cuda
