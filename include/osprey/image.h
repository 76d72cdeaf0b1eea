#pragma once
/// Image decoding: JPEG (TurboJPEG), PNG (libspng), WebP (libwebp) and BMP (own parser) into uint8 HWC tensors.
/// The format is detected from the bytes, never from a file name. Image dimensions are checked against
/// DecodeOptions::max_pixels before any pixel buffer is allocated, so decompression bombs are refused cheaply.
/// All functions are thread-safe (no shared state).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "osprey/tensor.h"

namespace osprey {

enum class ImageFormat { kUnknown, kJpeg, kPng, kWebp, kBmp };

/// "jpeg", "png", "webp", "bmp" or "unknown".
const char* ImageFormatName(ImageFormat format);

/// Format from the leading magic bytes; kUnknown when none matches (or `size` is too small).
ImageFormat DetectImageFormat(const void* data, size_t size);

struct DecodeOptions {
  /// Refuse images whose width * height (as stored in the file) exceeds this, before allocating.
  int64_t max_pixels = 100'000'000;
  /// How the size error names max_pixels (a server names its per-request budget); empty = "DecodeOptions::max_pixels".
  std::string limit_name;
  /// Output channels: 3 = RGB, 1 = gray (ITU-R 601-2 luma, as Pillow's convert('L')), 4 = RGBA (alpha 255 when the
  /// image has none). Alpha is dropped, not composited, for 1 and 3.
  int channels = 3;
  /// A hint: JPEG may decode at 1/2, 1/4 or 1/8 scale in the DCT domain as long as the (oriented) output stays at
  /// least this large. 0 and 0 (the default) mean full size. Other formats always decode at full size.
  int64_t min_width = 0;
  int64_t min_height = 0;
  /// Apply the JPEG EXIF orientation tag (1..8) as Pillow's ImageOps.exif_transpose does.
  bool apply_exif_orientation = true;
  /// Decode only this window of the image: columns [region_x, region_x + region_width) and rows [region_y, region_y +
  /// region_height) of what a full decode gives (orientation applied). Width and height 0 (the default) mean the whole
  /// image. The pixels equal the full decode's; JPEGs stored upright (no EXIF rotation) decode only the rows and the
  /// (iMCU-aligned) columns the window needs, other images decode whole and are cropped. A window outside the image,
  /// or one combined with min_width / min_height, is refused (kInvalidArgument).
  int64_t region_x = 0, region_y = 0, region_width = 0, region_height = 0;
  /// With a region: the decoder may return a wider window (JPEG: the whole columns it decoded around the region, saving
  /// a copy), whose top-left DecodeInfo::region_x / region_y give. The region's pixels are exact; the extra columns
  /// (up to about 100 pixels) may differ from a full decode.
  bool region_may_widen = false;
};

/// What a decode did; filled on request.
struct DecodeInfo {
  ImageFormat format = ImageFormat::kUnknown;
  int64_t stored_width = 0;  // dimensions as stored in the file
  int64_t stored_height = 0;
  int stored_channels = 0;  // colour components in the file (1 gray, 2 gray+alpha, 3, 4 with alpha or CMYK)
  std::string color;        // e.g. "ycbcr", "gray", "cmyk", "rgba", "palette", "gray+alpha"
  int scale_num = 1;        // DCT scaling applied (JPEG): scale_num / scale_denom
  int scale_denom = 1;
  int exif_orientation = 1;  // orientation tag found (1 when none); applied only if orientation_applied
  bool orientation_applied = false;
  int64_t region_x = 0, region_y = 0;  // with DecodeOptions::region_*: where the returned pixels start in the image
};

/// Decodes an encoded image held in memory into a new uint8 tensor [H, W, channels]. `data` is not retained.
/// Throws Error kInvalidArgument for unknown, malformed, truncated or too-large images (the message says which),
/// kUnsupported for valid files using features not handled (e.g. RLE BMP, animated WebP).
Tensor DecodeImage(const void* data, size_t size, const DecodeOptions& options = {}, DecodeInfo* info = nullptr);

/// The width and height a full decode of `data` with `options` gives (EXIF orientation applied as the options say),
/// from the header alone. JPEG only: returns false for other formats and for headers it cannot read (decode those to
/// learn their size; the decoder reports what is wrong).
bool PeekImageSize(const void* data, size_t size, const DecodeOptions& options, int64_t* width, int64_t* height);

/// Reads and decodes an image file. Errors as DecodeImage with the path prefixed; kNotFound when it cannot be opened.
Tensor ReadImageFile(const std::string& path, const DecodeOptions& options = {}, DecodeInfo* info = nullptr);
/// The bytes of an image file, for a caller that looks at them first (PeekImageSize) and then decodes. Throws as
/// ReadImageFile for a file that cannot be opened or read.
std::vector<char> ReadImageBytes(const std::string& path);

}  // namespace osprey
