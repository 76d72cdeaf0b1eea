// libFuzzer target: ParseOnnxModel on arbitrary bytes must either return a valid graph or throw osprey::Error.
// External data resolves against a private temporary directory holding one small file, "w.bin".
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "osprey/onnx.h"

namespace {
std::string& ModelDir() {
  static std::string dir;
  return dir;
}
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  char tmpl[] = "/tmp/osprey_onnx_fuzz_XXXXXX";
  const char* dir = mkdtemp(tmpl);
  if (!dir) std::abort();
  ModelDir() = dir;
  std::atexit([] {
    std::error_code ec;
    std::filesystem::remove_all(ModelDir(), ec);
  });
  std::ofstream out(ModelDir() + "/w.bin", std::ios::binary);
  std::string bytes(256, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  for (bool validate : {false, true}) {
    try {
      osprey::OnnxImportOptions options;
      options.validate_ops = validate;
      osprey::Graph g = osprey::ParseOnnxModel(data, size, ModelDir(), options);
      g.Validate();
    } catch (const osprey::Error&) {
    }
  }
  try {
    (void)osprey::TensorFromOnnxBytes(data, size);
  } catch (const osprey::Error&) {
  }
  return 0;
}
