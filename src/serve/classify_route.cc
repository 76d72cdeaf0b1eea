#include "serve/classify_route.h"

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "osprey/classify.h"
#include "osprey/error.h"
#include "osprey/image.h"
#include "serve/multipart.h"
#include "serve/responses.h"

namespace osprey::serve {
namespace {

using json = nlohmann::json;

const ValueInfo* FindInput(const Graph& graph, const std::string& name) {
  for (const ValueInfo& info : graph.input_infos)
    if (info.name == name) return &info;
  return nullptr;
}

Error BadRequest(const std::string& message) { return Error(ErrorCode::kInvalidArgument, message); }

}  // namespace

HttpResponse ClassifyRequest(const HttpRequest& request, const std::function<std::shared_ptr<LoadedModel>()>& acquire,
                             const std::map<std::string, std::string>& query, const RequestLimits& limits,
                             const ImagePixelsFn& image_pixels) {
  ImageBudget budget(limits);
  const std::string content_type_header = request.Header("Content-Type");
  std::string content_type = content_type_header;
  for (char& c : content_type) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  // (name reported back, encoded bytes) per image, in request order; views into the body.
  std::vector<std::pair<std::string, std::string_view>> images;
  if (IsMultipart(content_type)) {
    const std::string boundary = MultipartBoundary(content_type_header);
    const size_t max_parts = limits.max_images > 0 ? static_cast<size_t>(limits.max_images) + 1 : 1'000'000;
    const std::vector<MultipartPart> parts = ParseMultipart(request.body, boundary, max_parts);
    budget.CheckCount(static_cast<int64_t>(parts.size()), "classify");
    images.reserve(parts.size());
    for (size_t i = 0; i < parts.size(); ++i) {
      const MultipartPart& part = parts[i];
      std::string name = !part.filename.empty() ? std::string(part.filename)
                         : !part.name.empty()   ? std::string(part.name)
                                                : "part " + std::to_string(i + 1);
      images.emplace_back(std::move(name), part.data);
    }
  } else {
    if (!content_type.empty() && content_type.rfind("image/", 0) != 0 &&
        content_type.rfind("application/octet-stream", 0) != 0)
      return ErrorResponse(415,
                           "classify: expected raw image bytes (Content-Type image/*) or multipart/form-data, "
                           "found '" +
                               content_type + "'");
    if (request.body.empty()) throw BadRequest("classify: the request body is empty (send the image bytes)");
    images.emplace_back("request body", request.body);
  }

  std::shared_ptr<LoadedModel> loaded = acquire();
  const std::string& model = loaded->name;
  const ModelDirectory& directory = loaded->directory;
  if (directory.preprocess.input.empty() || !FindInput(loaded->model->graph(), directory.preprocess.input))
    throw BadRequest("classify: model '" + model + "' has no image input (no preprocessing in config.json)");
  int top_k = directory.postprocess.top_k;
  if (auto it = query.find("top_k"); it != query.end()) {
    try {
      size_t pos = 0;
      top_k = std::stoi(it->second, &pos);
      if (pos != it->second.size()) top_k = -1;
    } catch (const std::exception&) {
      top_k = -1;
    }
    if (top_k < 1) throw BadRequest("classify: top_k must be a positive integer, found '" + it->second + "'");
  }

  // Decode and preprocess each image; one that fails gets an error entry and the others still get answers.
  std::vector<std::string> errors(images.size());
  std::vector<Tensor> pixels;
  std::vector<size_t> pixel_owner;  // image index of each pixels entry
  for (size_t i = 0; i < images.size(); ++i) {
    try {
      pixels.push_back(image_pixels(*loaded, images[i].second, &budget));
      pixel_owner.push_back(i);
    } catch (const Error& e) {
      errors[i] = e.what();
    }
  }
  if (pixels.empty()) {
    std::string message = images.size() == 1 ? errors[0]
                                             : "classify: none of the " + std::to_string(images.size()) +
                                                   " images could be read; the first: " + errors[0];
    json results = json::array();
    for (size_t i = 0; i < images.size(); ++i) results.push_back({{"image", images[i].first}, {"error", errors[i]}});
    return JsonResponse(400, {{"error", message}, {"results", results}});
  }

  // All images of the request in one run when the batch dim is symbolic; a fixed batch dim B runs chunks of B, the
  // last padded by repeating its final image (padding rows are not reported).
  const ValueInfo* info = FindInput(loaded->model->graph(), directory.preprocess.input);
  int64_t fixed_batch = -1;
  if (info->has_shape && !info->dims.empty() && info->dims[0].value > 0) fixed_batch = info->dims[0].value;
  const size_t chunk = fixed_batch > 0 ? static_cast<size_t>(fixed_batch) : pixels.size();
  std::vector<std::vector<ClassScore>> top(images.size());
  for (size_t begin = 0; begin < pixels.size(); begin += chunk) {
    const size_t count = std::min(chunk, pixels.size() - begin);
    std::vector<Tensor> rows(pixels.begin() + begin, pixels.begin() + begin + count);
    while (rows.size() < chunk) rows.push_back(rows.back());
    std::map<std::string, Tensor> inputs{{directory.preprocess.input, StackTensors(rows)}};
    std::vector<std::pair<std::string, Tensor>> outputs = loaded->model->Run(inputs);
    if (outputs.empty()) throw Error(ErrorCode::kInternal, "classify: model '" + model + "' has no outputs");
    std::vector<std::vector<ClassScore>> chunk_top =
        TopKClasses(outputs[0].second, directory.postprocess.softmax, top_k, directory);
    if (chunk_top.size() < count)
      throw Error(ErrorCode::kInternal, "classify: model '" + model + "' returned " + std::to_string(chunk_top.size()) +
                                            " rows for " + std::to_string(count) + " images");
    for (size_t r = 0; r < count; ++r) top[pixel_owner[begin + r]] = std::move(chunk_top[r]);
  }

  json results = json::array();
  for (size_t i = 0; i < images.size(); ++i) {
    json item = {{"image", images[i].first}};
    if (!errors[i].empty()) {
      item["error"] = errors[i];
    } else {
      item["top_k"] = json::array();
      for (const ClassScore& c : top[i])
        item["top_k"].push_back({{"label", c.label}, {"index", c.index}, {"probability", c.probability}});
    }
    results.push_back(std::move(item));
  }
  return JsonResponse(200, {{"model", loaded->name}, {"version", loaded->version}, {"results", results}});
}

}  // namespace osprey::serve
