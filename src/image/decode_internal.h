#pragma once
// Shared pieces of the image decoders (src/image/decode*.cc). Only core headers: the fuzz build links these files
// without the runtime.
#include <cstddef>
#include <cstdint>

#include "osprey/image.h"
#include "osprey/tensor.h"

namespace osprey::image_internal {

/// Throws kInvalidArgument when width or height is not positive or width * height exceeds options.max_pixels.
void CheckDimensions(int64_t width, int64_t height, const DecodeOptions& options, const char* format);

/// Validates options.channels (1, 3 or 4).
void CheckChannels(const DecodeOptions& options);

/// Converts an [H, W, C] uint8 image with C in {1, 3, 4} (gray, RGB, RGBA) to `channels`; returns `image` itself when
/// C == channels. Gray is Pillow's convert('L') luma; alpha is dropped (not composited); added alpha is 255.
Tensor ConvertChannels(const Tensor& image, int channels);

/// Applies an EXIF orientation (1..8) as Pillow's ImageOps.exif_transpose; returns `image` itself for 1.
Tensor ApplyOrientation(const Tensor& image, int orientation);

/// What the JPEG marker segments before the first scan say.
struct JpegMarkers {
  int exif_orientation = 1;  // 1..8 (1 when absent or invalid)
  bool ran_out = false;      // the data ended inside the marker segments (before the first scan)
};
/// Walks the markers of a JPEG stream (bounds-checked; stops at SOS, EOI or anything malformed).
JpegMarkers ScanJpegMarkers(const uint8_t* data, size_t size);

/// Orientation tag (0x0112) of IFD0 in a TIFF-structured EXIF block; 1 when absent, out of range or malformed.
int ParseExifOrientation(const uint8_t* tiff, size_t size);

/// Validates the options' region (DecodeOptions::region_*) against a width x height decode; true when one is set.
bool CheckRegion(const DecodeOptions& options, int64_t width, int64_t height);
/// The options' region of a fully decoded image (the image itself when no region is set).
Tensor CropToRegion(const Tensor& image, const DecodeOptions& options);

/// Width and height of a JPEG as DecodeJpeg would return them (orientation per the options); false when the header
/// cannot be read.
bool PeekJpegSize(const uint8_t* data, size_t size, const DecodeOptions& options, int64_t* width, int64_t* height);

Tensor DecodeJpeg(const uint8_t* data, size_t size, const DecodeOptions& options, DecodeInfo* info);
Tensor DecodePng(const uint8_t* data, size_t size, const DecodeOptions& options, DecodeInfo* info);
Tensor DecodeWebp(const uint8_t* data, size_t size, const DecodeOptions& options, DecodeInfo* info);
Tensor DecodeBmp(const uint8_t* data, size_t size, const DecodeOptions& options, DecodeInfo* info);

}  // namespace osprey::image_internal
