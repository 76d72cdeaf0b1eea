// libFuzzer target: the server's real KServe v2 infer request decoder (src/serve/kserve.h, DecodeInferRequest — the
// function server.cc's Infer calls) and response encoder on arbitrary bytes must either produce tensors or throw
// osprey::Error. The input is a request body; its first byte chooses the framing: bit 0 clear = JSON only, set = the
// binary tensor extension with the next two bytes as Inference-Header-Content-Length (0 = a raw single-input body);
// bit 1 picks the model: four inputs (x FP32 [N, 3], mask BOOL [N], ids INT64 (no declared shape), h FP16 [2, 2], and
// img UINT8 [N, 2, 2, 3] taking BYTES), or one input (x FP32 [N, 3]) for raw bodies; bit 2 turns on system shared
// memory, with one registered region "r" of 4096 bytes (inputs read from it, outputs written to it). BYTES images
// become zeros here (the server decodes them with the image decoders, which image_fuzz covers).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "osprey/error.h"
#include "serve/kserve.h"
#include "serve/tensor_json.h"

namespace {

using osprey::DType;
using osprey::Tensor;
using osprey::ValueInfo;

std::vector<ValueInfo> MakeInputs() {
  std::vector<ValueInfo> v(5);
  v[0].name = "x", v[0].dtype = DType::kF32, v[0].has_shape = true, v[0].dims = {{-1, "N"}, {3, ""}};
  v[1].name = "mask", v[1].dtype = DType::kBool, v[1].has_shape = true, v[1].dims = {{-1, "N"}};
  v[2].name = "ids", v[2].dtype = DType::kI64, v[2].has_shape = false;
  v[3].name = "h", v[3].dtype = DType::kF16, v[3].has_shape = true, v[3].dims = {{2, ""}, {2, ""}};
  v[4].name = "img", v[4].dtype = DType::kU8, v[4].has_shape = true,
  v[4].dims = {{-1, "N"}, {2, ""}, {2, ""}, {3, ""}};
  return v;
}

// Region "r": a 4096-byte object holding 0, 1, 2, ... (unlinked at once: the registration's descriptor keeps it).
const osprey::serve::SharedMemoryRegions* Regions() {
  static const osprey::serve::SharedMemoryRegions* regions = [] {
    auto* r = new osprey::serve::SharedMemoryRegions(4, 1 << 16);
    const std::string key = "/osprey_request_fuzz_" + std::to_string(::getpid());
    const int fd = ::shm_open(key.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    std::string bytes(4096, '\0');
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i);
    if (fd < 0 || ::pwrite(fd, bytes.data(), bytes.size(), 0) != static_cast<ssize_t>(bytes.size())) __builtin_trap();
    ::close(fd);
    r->Register("r", key, 0, 4096);
    ::shm_unlink(key.c_str());
    return r;
  }();
  return regions;
}

Tensor ZeroImages(const ValueInfo&, const std::vector<std::string_view>& images, const std::string&) {
  return Tensor::Zeros(DType::kU8, {static_cast<int64_t>(images.size()), 2, 2, 3});
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<ValueInfo> kInputs = MakeInputs();
  static const std::vector<ValueInfo> kOneInput(kInputs.begin(), kInputs.begin() + 1);
  if (size == 0) return 0;
  std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::string header_length;
  if (data[0] & 1) {
    if (body.size() < 2) return 0;
    header_length = std::to_string(static_cast<uint8_t>(body[0]) | (static_cast<unsigned>(static_cast<uint8_t>(body[1])) << 8));
    body.remove_prefix(2);
  }
  osprey::serve::RequestLimits limits;  // the server's defaults
  const osprey::serve::SharedMemoryRegions* regions = (data[0] & 4) ? Regions() : nullptr;
  try {
    osprey::serve::InferRequest request = osprey::serve::DecodeInferRequest(
        (data[0] & 2) ? kOneInput : kInputs, "fuzz", body, header_length, limits, ZeroImages, regions);
    std::vector<std::pair<std::string, Tensor>> results(request.inputs.begin(), request.inputs.end());
    (void)osprey::serve::EncodeInferResponse(
        request.header, "fuzz", "1",
        osprey::serve::SelectOutputs(request.header, "fuzz", results, {"a", "b"}, regions));
  } catch (const osprey::Error&) {
  }
  try {
    (void)osprey::serve::ParseQuery(std::string(body.substr(0, 256)));
  } catch (const osprey::Error&) {
  }
  return 0;
}
