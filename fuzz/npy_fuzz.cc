// libFuzzer target: ParseNpy on arbitrary bytes must either return a tensor or throw osprey::Error.
#include <cstddef>
#include <cstdint>

#include "osprey/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    osprey::Tensor t = osprey::ParseNpy(data, size);
    // Touch the data so ASan sees any short buffer, and re-serialise what was read.
    volatile double sink = 0;
    for (int64_t i = 0; i < t.numel(); ++i) sink = sink + t.GetAsDouble(i);
    if (t.dtype() != osprey::DType::kBF16) (void)osprey::SerializeNpy(t);
  } catch (const osprey::Error&) {
  }
  return 0;
}
