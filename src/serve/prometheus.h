#pragma once
// Prometheus text format: the one metrics writer, shared by the server's request metrics and the batcher's queue and
// compute metrics (label escaping and histograms).
#include <cstdint>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

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

/// Bucket bounds of the latency histograms, microseconds.
inline const std::vector<double>& DurationBucketsUs() {
  static const std::vector<double> kBuckets = {50,    100,    250,    500,    1000,    2500,    5000,    10000,
                                               25000, 50000,  100000, 250000, 500000, 1000000, 2500000, 10000000};
  return kBuckets;
}

/// A histogram with fixed bounds; not synchronised (callers hold their own lock).
struct Histogram {
  const std::vector<double>* bounds;
  std::vector<uint64_t> buckets;  // not cumulative; summed when written
  uint64_t count = 0;
  double sum = 0;

  explicit Histogram(const std::vector<double>* b = &DurationBucketsUs()) : bounds(b), buckets(b->size(), 0) {}
  void Add(double v) {
    ++count;
    sum += v;
    for (size_t i = 0; i < bounds->size(); ++i)
      if (v <= (*bounds)[i]) {
        ++buckets[i];
        break;
      }
  }
  /// Writes `name`_bucket/_sum/_count lines with the label model="`label`" (already escaped).
  void Write(std::ostringstream& out, const char* name, const std::string& label) const {
    uint64_t cumulative = 0;
    for (size_t i = 0; i < bounds->size(); ++i) {
      cumulative += buckets[i];
      out << name << "_bucket{model=\"" << label << "\",le=\"" << (*bounds)[i] << "\"} " << cumulative << "\n";
    }
    out << name << "_bucket{model=\"" << label << "\",le=\"+Inf\"} " << count << "\n";
    char sum_text[64];
    std::snprintf(sum_text, sizeof(sum_text), "%.3f", sum);
    out << name << "_sum{model=\"" << label << "\"} " << sum_text << "\n";
    out << name << "_count{model=\"" << label << "\"} " << count << "\n";
  }
};

}  // namespace osprey::serve
