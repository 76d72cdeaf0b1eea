#pragma once
// KServe v2 / Open Inference Protocol infer coding (internal to the server): one request body (JSON, the binary tensor
// extension, or a raw single-input body) into checked input tensors, and outputs into a response body. Independent of
// models, HTTP and the runtime, so the request fuzzer (fuzz/request_fuzz.cc) drives exactly this code. Every function
// throws Error kInvalidArgument saying what is wrong (RequestTooLarge for the per-request limits).
#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "osprey/error.h"
#include "osprey/graph.h"
#include "osprey/tensor.h"
#include "serve/shared_memory.h"

namespace osprey::serve {

/// Per-request work limits (osprey serve flags of the same names; 0 = no limit). Documented in docs/serving.md.
struct RequestLimits {
  int64_t max_batch_size = 256;  // --max-batch-size: rows (dim 0) of a rank >= 2 input whose dim 0 is variable
  int64_t max_images = 128;      // --max-images: encoded images per request (BYTES elements, multipart parts)
  int64_t max_megapixels = 200;  // --max-request-megapixels: decoded pixels per request, summed over its images
  double max_seconds = 0;        // --max-request-seconds: from arrival to answer, the run included (0 = no limit)
};

/// A request over one of the RequestLimits: answered 413 with the message (which names the flag).
class RequestTooLarge : public Error {
 public:
  explicit RequestTooLarge(const std::string& message) : Error(ErrorCode::kInvalidArgument, message) {}
};

/// The decode budget of one request: images left and pixels left. Every path that decodes images takes from it.
class ImageBudget {
 public:
  explicit ImageBudget(const RequestLimits& limits) : limits_(limits) {}
  /// Refuses a request of `count` images over --max-images, before any is decoded or even split.
  void CheckCount(int64_t count, const std::string& what) const;
  /// Largest image (stored width x height) the next decode may accept: the pixels left, at most `per_image`.
  int64_t PixelsLeft(int64_t per_image) const;
  /// Records a decoded image of `pixels` (stored size).
  void Spend(int64_t pixels) { spent_ += pixels; }
  /// Text for the decoder's size message: which limit, and how much is left of it.
  std::string LimitName() const;

 private:
  RequestLimits limits_;
  int64_t spent_ = 0;
};

/// Decodes the encoded images of a BYTES input (already split, count checked) into the model input's tensor.
using ImageInputDecoder =
    std::function<Tensor(const ValueInfo& info, const std::vector<std::string_view>& images, const std::string& what)>;

struct InferRequest {
  nlohmann::json header = nlohmann::json::object();  // the JSON part ({} for a raw binary body)
  std::map<std::string, Tensor> inputs;              // every model input, checked against its declaration
  std::vector<std::string> ignored_parameters;       // parameters osprey does not act on ("sequence_id", ...)
  int64_t timeout_us = 0;  // parameters.timeout (Triton's: microseconds from arrival; 0 = none)
};

/// Decodes an infer body for a model with `model_inputs`. `header_length` is the Inference-Header-Content-Length header
/// ("" when absent; "0" = the whole body is the raw bytes of the model's only input). BYTES inputs go to `images`
/// (which may be empty: then BYTES are refused). Inputs naming a shared memory region are read from `shared_memory`
/// (null: the extension is off, and such inputs are refused).
InferRequest DecodeInferRequest(const std::vector<ValueInfo>& model_inputs, const std::string& model,
                                std::string_view body, const std::string& header_length, const RequestLimits& limits,
                                const ImageInputDecoder& images, const SharedMemoryRegions* shared_memory = nullptr);

/// One output of a response: a tensor, or (classification extension) BYTES strings "score:index[:label]".
struct ResponseOutput {
  std::string name;
  std::string datatype;  // KServe name: "FP32", ..., "BYTES"
  Shape shape;
  Tensor tensor;                     // when datatype != "BYTES"
  std::vector<std::string> strings;  // when datatype == "BYTES", row-major
  bool binary = false;               // REST: in the binary section (binary_data / binary_data_output)
  // Written to shared memory (the requested output's shared_memory_* parameters) by SelectOutputs: the answer carries
  // its name, datatype and shape only, as Triton's does (Triton's C++ client takes any output 'parameters' in a REST
  // answer for binary_data_size).
  std::optional<SharedMemoryRef> shared_memory;
};

/// The outputs `request_header` asks for, in its order ("outputs"; all outputs in graph order without it), each as a
/// tensor or, with parameters.classification = N (Triton's classification extension; tritonclient's class_count), as
/// the top N "score:index:label" strings per row (label from `labels` when there is one). Outputs that name a shared
/// memory region are written to it here (`shared_memory` null: refused).
std::vector<ResponseOutput> SelectOutputs(const nlohmann::json& request_header, const std::string& model,
                                          const std::vector<std::pair<std::string, Tensor>>& results,
                                          const std::vector<std::string>& labels,
                                          const SharedMemoryRegions* shared_memory = nullptr);

struct InferResponse {
  std::string body;
  int64_t header_length = -1;  // >= 0: binary outputs follow a JSON header of this many bytes
};
/// The REST response body for `outputs` (SelectOutputs), with the request's "id".
InferResponse EncodeInferResponse(const nlohmann::json& request_header, const std::string& model,
                                  const std::string& version, const std::vector<ResponseOutput>& outputs);

/// Appends one KServe binary BYTES element: its 4-byte little-endian length, then its bytes.
void AppendBinaryBytes(std::string* out, std::string_view element);
/// KServe binary BYTES: each element is a 4-byte little-endian length followed by that many bytes. Refuses more than
/// `max_elements` (the count the shape declared) before listing them, so tiny elements cannot amplify memory.
std::vector<std::string_view> SplitBinaryBytes(std::string_view data, const std::string& what, size_t max_elements);
/// Strict standard base64 (RFC 4648 alphabet, '=' padding optional at the end); throws when malformed.
std::string DecodeBase64(std::string_view text, const std::string& what);

}  // namespace osprey::serve
