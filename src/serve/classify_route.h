#pragma once
// POST /v2/models/{m}/classify: raw image bytes or a multipart upload in, top-k labels out (internal to the server).
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "serve/http_server.h"
#include "serve/kserve.h"
#include "serve/model_manager.h"

namespace osprey::serve {

/// Decodes and preprocesses one encoded image for `loaded`, taking from `budget` (Error kInvalidArgument when it cannot).
using ImagePixelsFn = std::function<Tensor(const LoadedModel& loaded, std::string_view encoded, ImageBudget* budget)>;

/// Answers one classify request. The body is checked (type, parts, --max-images) before `acquire` loads the model.
HttpResponse ClassifyRequest(const HttpRequest& request, const std::function<std::shared_ptr<LoadedModel>()>& acquire,
                             const std::map<std::string, std::string>& query, const RequestLimits& limits,
                             const ImagePixelsFn& pixels);

}  // namespace osprey::serve
