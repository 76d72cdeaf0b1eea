#include "cli/common.h"

#include <charconv>
#include <cstdio>

#include "ops/op_registry.h"
#include "osprey/npy.h"

namespace osprey::cli {

std::pair<std::string, std::string> SplitAssignment(const std::string& text, const std::string& flag) {
  size_t eq = text.find('=');
  if (eq == std::string::npos || eq == 0)
    throw Error(ErrorCode::kInvalidArgument, flag + " expects NAME=VALUE, got '" + text + "'");
  return {text.substr(0, eq), text.substr(eq + 1)};
}

std::map<std::string, int64_t> ParseDimOverrides(const std::vector<std::string>& entries) {
  std::map<std::string, int64_t> dims;
  for (const std::string& e : entries) {
    auto [symbol, value] = SplitAssignment(e, "--dims");
    int64_t v = -1;
    auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
    if (ec != std::errc() || end != value.data() + value.size() || v < 0)
      throw Error(ErrorCode::kInvalidArgument,
                  "--dims " + symbol + ": expected a non-negative integer, got '" + value + "'");
    dims[symbol] = v;
  }
  return dims;
}

Shape ConcreteInputShape(const ValueInfo& info, const std::map<std::string, int64_t>& dims) {
  if (!info.has_shape)
    throw Error(ErrorCode::kInvalidArgument, "input '" + info.name +
                                                 "' declares no shape, so random values cannot be made for it; "
                                                 "give it with --input " +
                                                 info.name + "=FILE.npy");
  Shape shape;
  for (const Dim& d : info.dims) {
    if (d.value >= 0) {
      shape.push_back(d.value);
    } else {
      auto it = dims.find(d.symbol);
      shape.push_back(it != dims.end() ? it->second : 1);
    }
  }
  return shape;
}

Tensor RandomInput(DType dtype, const Shape& shape, uint64_t* state) {
  Tensor t = Tensor::Zeros(dtype, shape);
  if (dtype != DType::kF32 && dtype != DType::kF16 && dtype != DType::kBF16) return t;
  for (int64_t i = 0; i < t.numel(); ++i) {
    // splitmix64: cheap, deterministic for a seed, good enough for benchmark inputs.
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    float v = static_cast<float>(z >> 40) / 16777216.f;
    if (dtype == DType::kF32)
      t.data<float>()[i] = v;
    else if (dtype == DType::kF16)
      t.data<uint16_t>()[i] = FloatToHalf(v);
    else
      t.data<uint16_t>()[i] = FloatToBFloat16(v);
  }
  return t;
}

std::string SanitizeFileName(const std::string& name) {
  std::string out;
  for (char c : name) {
    bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    out += ok ? c : '_';
  }
  if (out.empty() || out == "." || out == "..") out = "_" + out;
  if (out.size() > 200) out = out.substr(0, 200);
  return out;
}

std::vector<std::string> UnsupportedOps(const Graph& graph) {
  std::vector<std::string> unsupported;
  const OpRegistry& registry = OpRegistry::Get();
  for (const Node& n : graph.nodes) {
    bool known = (n.domain.empty() || n.domain == "ai.onnx") && registry.Find(n.op_type) != nullptr;
    if (!known)
      unsupported.push_back((n.domain.empty() ? "" : n.domain + ".") + n.op_type + " (node '" + n.name + "')");
  }
  return unsupported;
}

std::string FormatBytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

int EffectiveThreads(int requested) { return requested > 0 ? requested : DefaultNumThreads(); }

std::string DescribeInputs(const Graph& graph) {
  std::string s;
  for (const ValueInfo& info : graph.input_infos) {
    if (!s.empty()) s += ", ";
    s += "'" + info.name + "' (" + DTypeName(info.dtype) + " " + info.ShapeString() + ")";
  }
  return s.empty() ? "(none)" : s;
}

std::map<std::string, Tensor> ReadInputFiles(const Graph& graph, const std::vector<std::string>& entries) {
  std::map<std::string, Tensor> inputs;
  for (const std::string& entry : entries) {
    auto [name, file] = SplitAssignment(entry, "--input");
    bool declared = false;
    for (const ValueInfo& info : graph.input_infos) declared = declared || info.name == name;
    if (!declared)
      throw Error(ErrorCode::kInvalidArgument,
                  "--input '" + name + "': the model has no such input; its inputs are " + DescribeInputs(graph));
    if (inputs.count(name)) throw Error(ErrorCode::kInvalidArgument, "--input '" + name + "' is given twice");
    try {
      inputs[name] = ReadNpy(file);
    } catch (const Error& e) {
      throw Error(e.code(), "--input '" + name + "': " + e.what());
    }
  }
  return inputs;
}

}  // namespace osprey::cli
