// libFuzzer target: DecodeImage on arbitrary bytes must either return an image or throw osprey::Error.
#include <cstddef>
#include <cstdint>

#include "osprey/image.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Vary the options with the first byte so gray/RGBA conversions, DCT scaling and orientation are all reached.
  osprey::DecodeOptions options;
  options.max_pixels = 16'000'000;
  if (size > 0) {
    const uint8_t knobs = data[size - 1];
    options.channels = knobs % 3 == 0 ? 1 : knobs % 3 == 1 ? 3 : 4;
    if (knobs & 4) options.min_width = options.min_height = 8;
    options.apply_exif_orientation = (knobs & 8) == 0;
  }
  try {
    osprey::Tensor image = osprey::DecodeImage(data, size, options);
    // Touch every byte so ASan sees a short buffer.
    volatile uint8_t sink = 0;
    const uint8_t* p = image.data<uint8_t>();
    for (int64_t i = 0; i < image.numel(); ++i) sink = sink ^ p[i];
  } catch (const osprey::Error&) {
  }
  return 0;
}
