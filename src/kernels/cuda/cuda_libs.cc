#include "kernels/cuda/cuda_libs.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

namespace osprey::cuda {
namespace {

// Directories to try before (and after) the dynamic linker's own search.
std::vector<std::string> SearchDirs() {
  std::vector<std::string> dirs;
  if (const char* env = std::getenv("OSPREY_CUDA_LIBRARY_PATH")) {
    std::string s = env;
    size_t start = 0;
    while (start <= s.size()) {
      size_t end = s.find(':', start);
      if (end == std::string::npos) end = s.size();
      if (end > start) dirs.push_back(s.substr(start, end - start));
      start = end + 1;
    }
  }
  return dirs;
}

struct Loaded {
  void* handle = nullptr;
  std::string path;   // what was opened
  std::string tried;  // what failed, for the message
};

// Opens the first of `names` found: in $OSPREY_CUDA_LIBRARY_PATH, by the linker's search, in /usr/local/cuda/lib64.
// RTLD_GLOBAL so that a library loaded here satisfies another's DT_NEEDED (libcublasLt for libcublas).
Loaded OpenFirst(const std::vector<std::string>& names, const std::string& prefer_dir = "") {
  Loaded r;
  std::vector<std::string> candidates;
  if (!prefer_dir.empty())
    for (const std::string& n : names) candidates.push_back(prefer_dir + "/" + n);
  for (const std::string& d : SearchDirs())
    for (const std::string& n : names) candidates.push_back(d + "/" + n);
  for (const std::string& n : names) candidates.push_back(n);
  for (const std::string& n : names) candidates.push_back("/usr/local/cuda/lib64/" + n);
  for (const std::string& c : candidates) {
    dlerror();
    if (void* h = dlopen(c.c_str(), RTLD_NOW | RTLD_GLOBAL)) {
      r.handle = h;
      r.path = c;
      return r;
    }
    const char* e = dlerror();
    if (r.tried.empty()) r.tried = e ? e : c;  // the first failure explains best (usually "cannot open ...")
  }
  return r;
}

// The directory of a loaded library (from dlinfo-free dladdr on one of its symbols).
std::string DirOf(void* handle, const char* symbol) {
  void* sym = dlsym(handle, symbol);
  Dl_info info{};
  if (sym && dladdr(sym, &info) && info.dli_fname) {
    std::string f = info.dli_fname;
    size_t slash = f.rfind('/');
    if (slash != std::string::npos) return f.substr(0, slash);
  }
  return "";
}

template <class F>
bool Bind(void* handle, const char* name, F& fn, std::string& missing) {
  fn = reinterpret_cast<F>(dlsym(handle, name));
  if (fn == nullptr) {
    if (!missing.empty()) missing += ", ";
    missing += name;
  }
  return fn != nullptr;
}

struct CudnnState {
  CudnnApi api{};
  bool ok = false;
  std::string status;
};

struct CublasState {
  CublasApi api{};
  bool ok = false;
  std::string status;
};

const CudnnState& LoadCudnn() {
  static const CudnnState state = [] {
    CudnnState s;
    Loaded lib = OpenFirst({"libcudnn.so.9", "libcudnn.so"});
    if (!lib.handle) {
      s.status = "cuDNN not found (" + lib.tried + "; set OSPREY_CUDA_LIBRARY_PATH to its directory)";
      return s;
    }
    std::string missing;
    void* h = lib.handle;
    CudnnApi& a = s.api;
    Bind(h, "cudnnGetVersion", a.GetVersion, missing);
    Bind(h, "cudnnGetErrorString", a.GetErrorString, missing);
    Bind(h, "cudnnCreate", a.Create, missing);
    Bind(h, "cudnnDestroy", a.Destroy, missing);
    Bind(h, "cudnnSetStream", a.SetStream, missing);
    Bind(h, "cudnnCreateTensorDescriptor", a.CreateTensorDescriptor, missing);
    Bind(h, "cudnnDestroyTensorDescriptor", a.DestroyTensorDescriptor, missing);
    Bind(h, "cudnnSetTensorNdDescriptor", a.SetTensorNdDescriptor, missing);
    Bind(h, "cudnnCreateFilterDescriptor", a.CreateFilterDescriptor, missing);
    Bind(h, "cudnnDestroyFilterDescriptor", a.DestroyFilterDescriptor, missing);
    Bind(h, "cudnnSetFilterNdDescriptor", a.SetFilterNdDescriptor, missing);
    Bind(h, "cudnnCreateConvolutionDescriptor", a.CreateConvolutionDescriptor, missing);
    Bind(h, "cudnnDestroyConvolutionDescriptor", a.DestroyConvolutionDescriptor, missing);
    Bind(h, "cudnnSetConvolutionNdDescriptor", a.SetConvolutionNdDescriptor, missing);
    Bind(h, "cudnnSetConvolutionGroupCount", a.SetConvolutionGroupCount, missing);
    Bind(h, "cudnnSetConvolutionMathType", a.SetConvolutionMathType, missing);
    Bind(h, "cudnnGetConvolutionNdForwardOutputDim", a.GetConvolutionNdForwardOutputDim, missing);
    Bind(h, "cudnnGetConvolutionForwardAlgorithm_v7", a.GetConvolutionForwardAlgorithm_v7, missing);
    Bind(h, "cudnnGetConvolutionForwardWorkspaceSize", a.GetConvolutionForwardWorkspaceSize, missing);
    Bind(h, "cudnnConvolutionForward", a.ConvolutionForward, missing);
    Bind(h, "cudnnGetConvolutionBackwardDataAlgorithm_v7", a.GetConvolutionBackwardDataAlgorithm_v7, missing);
    Bind(h, "cudnnGetConvolutionBackwardDataWorkspaceSize", a.GetConvolutionBackwardDataWorkspaceSize, missing);
    Bind(h, "cudnnConvolutionBackwardData", a.ConvolutionBackwardData, missing);
    if (!missing.empty()) {
      s.status = "cuDNN at " + lib.path + " lacks " + missing;
      return s;
    }
    const size_t v = a.GetVersion();  // major * 10000 + minor * 100 + patch since cuDNN 9
    if (v / 10000 < 9) {
      s.status = "cuDNN at " + lib.path + " is version " + std::to_string(v) + " (9 or later needed)";
      return s;
    }
    s.ok = true;
    s.status = "cuDNN " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
               std::to_string(v % 100) + " (" + lib.path + ")";
    return s;
  }();
  return state;
}

const CublasState& LoadCublas() {
  static const CublasState state = [] {
    CublasState s;
    // libcublasLt first (libcublas needs it), then libcublas from the same directory when possible.
    Loaded lt = OpenFirst({"libcublasLt.so.13", "libcublasLt.so"});
    std::string dir = lt.handle ? DirOf(lt.handle, "cublasLtCreate") : "";
    Loaded lib = OpenFirst({"libcublas.so.13", "libcublas.so"}, dir);
    if (!lib.handle) lib = OpenFirst({"libcublas.so.12"});
    if (!lib.handle) {
      s.status = "cuBLAS not found (" + lib.tried + "; set OSPREY_CUDA_LIBRARY_PATH to its directory)";
      return s;
    }
    std::string missing;
    void* h = lib.handle;
    CublasApi& a = s.api;
    Bind(h, "cublasCreate_v2", a.Create, missing);
    Bind(h, "cublasDestroy_v2", a.Destroy, missing);
    Bind(h, "cublasSetStream_v2", a.SetStream, missing);
    Bind(h, "cublasSetMathMode", a.SetMathMode, missing);
    Bind(h, "cublasSetWorkspace_v2", a.SetWorkspace, missing);
    Bind(h, "cublasSgemmStridedBatched", a.SgemmStridedBatched, missing);
    Bind(h, "cublasGemmStridedBatchedEx", a.GemmStridedBatchedEx, missing);
    Bind(h, "cublasGetStatusString", a.GetStatusString, missing);
    if (!missing.empty()) {
      s.status = "cuBLAS at " + lib.path + " lacks " + missing;
      return s;
    }
    s.ok = true;
    s.status = "cuBLAS (" + lib.path + ")";
    return s;
  }();
  return state;
}

}  // namespace

const CudnnApi* Cudnn() {
  const CudnnState& s = LoadCudnn();
  return s.ok ? &s.api : nullptr;
}

const CublasApi* Cublas() {
  const CublasState& s = LoadCublas();
  return s.ok ? &s.api : nullptr;
}

std::string CudnnStatus() { return LoadCudnn().status; }
std::string CublasStatus() { return LoadCublas().status; }

}  // namespace osprey::cuda
