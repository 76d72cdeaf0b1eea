#pragma once
// JSON answers shared by the server's routes.
#include <nlohmann/json.hpp>
#include <string>

#include "serve/http_server.h"

namespace osprey::serve {

inline HttpResponse JsonResponse(int status, const nlohmann::json& body) {
  HttpResponse r;
  r.status = status;
  r.body = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return r;
}

inline HttpResponse ErrorResponse(int status, const std::string& message) {
  return JsonResponse(status, {{"error", message}});
}

}  // namespace osprey::serve
