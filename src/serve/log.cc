#include "serve/log.h"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <memory>
#include <mutex>

#include "osprey/error.h"
#include "serve/tensor_json.h"

namespace osprey::serve::log {
namespace {

using json = nlohmann::json;

std::mutex g_mu;
Options g_options;

spdlog::level::level_enum ToSpd(Level level) {
  switch (level) {
    case Level::kDebug: return spdlog::level::debug;
    case Level::kInfo: return spdlog::level::info;
    case Level::kWarning: return spdlog::level::warn;
    case Level::kError: return spdlog::level::err;
    case Level::kOff: return spdlog::level::off;
  }
  return spdlog::level::info;
}

std::shared_ptr<spdlog::logger> MakeLogger(const Options& options) {
  auto logger = std::make_shared<spdlog::logger>("osprey", std::make_shared<spdlog::sinks::stderr_sink_mt>());
  // Text: "2026-12-01T15:30:00.123Z warning request_failed: POST /v2/... -> 400 ...". JSON: the fields object, with
  // the time and level first (the message body is written by Event, already JSON-escaped).
  logger->set_pattern(options.json ? R"({"time":"%Y-%m-%dT%H:%M:%S.%eZ","level":"%l",%v})"
                                   : "%Y-%m-%dT%H:%M:%S.%eZ %l %v",
                      spdlog::pattern_time_type::utc);
  logger->set_level(ToSpd(options.level));
  logger->flush_on(spdlog::level::debug);  // every line at once: logs are read while the server runs
  return logger;
}

std::atomic<std::shared_ptr<spdlog::logger>>& Logger() {
  static std::atomic<std::shared_ptr<spdlog::logger>> logger{MakeLogger(Options{})};
  return logger;
}

// The model name of a /v2/models/{name}/... target, percent-decoded as the router reads it, or "".
std::string ModelOf(const std::string& target) {
  static const std::string prefix = "/v2/models/";
  if (target.rfind(prefix, 0) != 0) return "";
  const size_t end = target.find_first_of("/?", prefix.size());
  const std::string raw =
      target.substr(prefix.size(), end == std::string::npos ? std::string::npos : end - prefix.size());
  try {
    return PercentDecode(raw, "model");
  } catch (const Error&) {
    return raw;  // the request was answered 400; its log line keeps what was sent
  }
}

}  // namespace

Level ParseLevel(const std::string& text) {
  if (text == "debug") return Level::kDebug;
  if (text == "info") return Level::kInfo;
  if (text == "warning" || text == "warn") return Level::kWarning;
  if (text == "error") return Level::kError;
  if (text == "off") return Level::kOff;
  throw Error(ErrorCode::kInvalidArgument,
              "--log-level: expected debug, info, warning, error or off, got '" + text + "'");
}

void Configure(const Options& options) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_options = options;
  Logger().store(MakeLogger(options));
}

const Options& Current() { return g_options; }

void Event(Level level, std::string_view event, const std::string& message, const Fields& fields) {
  std::shared_ptr<spdlog::logger> logger = Logger().load();
  if (!logger->should_log(ToSpd(level))) return;
  if (g_options.json) {
    json body = json::object();
    body["event"] = event;
    body["message"] = message;
    for (const auto& [key, value] : fields) body[key] = value;
    std::string text = body.dump(-1, ' ', false, json::error_handler_t::replace);
    logger->log(ToSpd(level), "{}", std::string_view(text).substr(1, text.size() - 2));  // fields without braces
    return;
  }
  std::string line = std::string(event) + ": " + message;
  for (const auto& [key, value] : fields)
    line += " " + key + "=" + (value.is_string() ? value.get<std::string>() : value.dump());
  logger->log(ToSpd(level), "{}", line);
}

void Request(const std::string& method, const std::string& target, int status, size_t bytes_in, size_t bytes_out,
             double micros, std::string_view response_body) {
  const bool failed = status >= 400;
  if (!failed && !g_options.access) return;
  Fields fields;
  if (g_options.json) fields = {{"method", method}, {"path", target}, {"status", status}};  // text: in the message
  const std::string model = ModelOf(target);
  if (!model.empty()) fields.emplace_back("model", model);
  fields.emplace_back("bytes_in", bytes_in);
  fields.emplace_back("bytes_out", bytes_out);
  fields.emplace_back("us", static_cast<int64_t>(micros));
  std::string reason;
  if (failed) {
    const json body = json::parse(response_body, nullptr, false);
    if (body.is_object() && body.contains("error") && body["error"].is_string()) reason = body["error"];
    fields.emplace_back("reason", reason);
  }
  const std::string message = method + " " + target + " -> " + std::to_string(status);
  if (failed)
    Event(status >= 500 ? Level::kError : Level::kWarning, "request_failed", message, fields);
  else
    Event(Level::kInfo, "request", message, fields);
}

}  // namespace osprey::serve::log
