#pragma once
// The server's log (spdlog underneath, kept out of this header): one line per event on stderr, as text or JSON, with a
// level. Events: every failed request (4xx/5xx) by default, every request with the access log, model lifecycle (load,
// evict with its reason, idle unload, failure with the error), repository problems and the start-up settings.
// Thread-safe; before Configure() events go out as text at level info.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace osprey::serve::log {

enum class Level { kDebug, kInfo, kWarning, kError, kOff };

struct Options {
  Level level = Level::kInfo;
  bool json = false;    // one JSON object per line instead of text
  bool access = false;  // every request at level info (failed ones are logged at warning whatever this says)
};

/// Parses "debug", "info", "warning" (or "warn"), "error", "off"; throws Error kInvalidArgument otherwise.
Level ParseLevel(const std::string& text);
void Configure(const Options& options);
const Options& Current();

/// Named fields of an event, in order: strings, numbers, booleans.
using Fields = std::vector<std::pair<std::string, nlohmann::json>>;

/// One event: `event` is a short machine name ("model_loaded"), `message` the sentence a person reads.
void Event(Level level, std::string_view event, const std::string& message, const Fields& fields = {});

/// One answered HTTP request: a warning when status >= 400 (with the reason from the answer's {"error": ...}), an
/// info line with the access log, nothing otherwise.
void Request(const std::string& method, const std::string& target, int status, size_t bytes_in, size_t bytes_out,
             double micros, std::string_view response_body);

}  // namespace osprey::serve::log
