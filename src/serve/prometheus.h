#pragma once
// Prometheus text-format helpers shared by the server's and the batcher's metrics.
#include <string>

namespace osprey::serve {

/// Escapes a label value (backslash, double quote, newline) for the Prometheus text format.
inline std::string PrometheusLabel(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

}  // namespace osprey::serve
