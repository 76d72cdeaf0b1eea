// libFuzzer target: DecodeImage on arbitrary bytes must either return an image or throw osprey::Error; with a window
// (DecodeOptions::region_*, chosen from the bytes' size as PeekImageSize reports it) too.
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
  int64_t width = 0, height = 0;
  if (size > 1 && (data[size - 2] & 1) && (data[size - 1] & 4) == 0 &&
      osprey::PeekImageSize(data, size, options, &width, &height) && width > 0 && height > 0) {
    const uint8_t k = data[size - 2];
    options.region_x = (k >> 1) % width, options.region_y = (k >> 4) % height;
    options.region_width = 1 + (width - options.region_x - 1) * (k & 6) / 6;
    options.region_height = 1 + (height - options.region_y - 1) * (k & 96) / 96;
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
