#pragma once
// cuDNN and cuBLAS, loaded with dlopen at first use (never linked: the binary, the installed package and the Python
// wheel stay free of them). Only the functions the kernels call are looked up. When a library or one of its functions
// is missing, Cudnn()/Cublas() return nullptr, the kernels that need it decline (the step runs on the CPU) and
// CudnnStatus()/CublasStatus() say why (DeviceBackend::Describe shows it).
//
// Search order per library: each directory of $OSPREY_CUDA_LIBRARY_PATH (colon-separated), then the dynamic linker's
// own search (LD_LIBRARY_PATH, ld.so.cache), then /usr/local/cuda/lib64. Names: libcudnn.so.9 then libcudnn.so;
// libcublas.so.13 then libcublas.so, then libcublas.so.12 (same ABI for the functions used). libcublasLt is loaded
// first from the same place, so libcublas finds it even when its directory is not on the linker's path.
#include <cublas_v2.h>
#include <cudnn.h>

#include <string>

namespace osprey::cuda {

// The legacy cuDNN convolution API is deprecated in cuDNN 9 but present and supported; silence its warnings here.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
struct CudnnApi {
  decltype(&cudnnGetVersion) GetVersion;
  decltype(&cudnnGetErrorString) GetErrorString;
  decltype(&cudnnCreate) Create;
  decltype(&cudnnDestroy) Destroy;
  decltype(&cudnnSetStream) SetStream;
  decltype(&cudnnCreateTensorDescriptor) CreateTensorDescriptor;
  decltype(&cudnnDestroyTensorDescriptor) DestroyTensorDescriptor;
  decltype(&cudnnSetTensorNdDescriptor) SetTensorNdDescriptor;
  decltype(&cudnnCreateFilterDescriptor) CreateFilterDescriptor;
  decltype(&cudnnDestroyFilterDescriptor) DestroyFilterDescriptor;
  decltype(&cudnnSetFilterNdDescriptor) SetFilterNdDescriptor;
  decltype(&cudnnCreateConvolutionDescriptor) CreateConvolutionDescriptor;
  decltype(&cudnnDestroyConvolutionDescriptor) DestroyConvolutionDescriptor;
  decltype(&cudnnSetConvolutionNdDescriptor) SetConvolutionNdDescriptor;
  decltype(&cudnnSetConvolutionGroupCount) SetConvolutionGroupCount;
  decltype(&cudnnSetConvolutionMathType) SetConvolutionMathType;
  decltype(&cudnnGetConvolutionNdForwardOutputDim) GetConvolutionNdForwardOutputDim;
  decltype(&cudnnGetConvolutionForwardAlgorithm_v7) GetConvolutionForwardAlgorithm_v7;
  decltype(&cudnnGetConvolutionForwardWorkspaceSize) GetConvolutionForwardWorkspaceSize;
  decltype(&cudnnConvolutionForward) ConvolutionForward;
  decltype(&cudnnGetConvolutionBackwardDataAlgorithm_v7) GetConvolutionBackwardDataAlgorithm_v7;
  decltype(&cudnnGetConvolutionBackwardDataWorkspaceSize) GetConvolutionBackwardDataWorkspaceSize;
  decltype(&cudnnConvolutionBackwardData) ConvolutionBackwardData;  // ConvTranspose
};
#pragma GCC diagnostic pop

struct CublasApi {
  decltype(&cublasCreate_v2) Create;
  decltype(&cublasDestroy_v2) Destroy;
  decltype(&cublasSetStream_v2) SetStream;
  decltype(&cublasSetMathMode) SetMathMode;
  decltype(&cublasSetWorkspace_v2) SetWorkspace;
  decltype(&cublasSgemmStridedBatched) SgemmStridedBatched;
  // Spelled out: C++ also sees an inline overload taking cudaDataType as the compute type.
  cublasStatus_t (*GemmStridedBatchedEx)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                         const void*, const void*, cudaDataType, int, long long, const void*,
                                         cudaDataType, int, long long, const void*, void*, cudaDataType, int, long long,
                                         int, cublasComputeType_t, cublasGemmAlgo_t);
  decltype(&cublasGetStatusString) GetStatusString;
};

/// The loaded API, or nullptr (first call loads; thread-safe; the libraries stay loaded for the process).
const CudnnApi* Cudnn();
const CublasApi* Cublas();
/// "cuDNN 9.19.0 (/usr/local/cuda/lib64/libcudnn.so.9)" or "cuDNN not found (tried ...: <dlerror>)".
std::string CudnnStatus();
std::string CublasStatus();

}  // namespace osprey::cuda
