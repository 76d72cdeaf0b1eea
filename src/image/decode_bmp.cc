// BMP: an own parser for uncompressed 24/32-bit and 8-bit palette images (BI_RGB, or BI_BITFIELDS with the usual
// byte-aligned masks), bottom-up or top-down. Every header field is validated against the file before use.
#include <cstring>
#include <string>

#include "image/decode_internal.h"

namespace osprey::image_internal {

namespace {

uint32_t Le32(const uint8_t* p) {
  return uint32_t{p[0]} | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) | (uint32_t{p[3]} << 24);
}
uint16_t Le16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

[[noreturn]] void Invalid(const std::string& what) { throw Error(ErrorCode::kInvalidArgument, "corrupt BMP: " + what); }

constexpr uint32_t kBiRgb = 0, kBiRle8 = 1, kBiRle4 = 2, kBiBitfields = 3;
constexpr size_t kFileHeaderBytes = 14;

}  // namespace

Tensor DecodeBmp(const uint8_t* data, size_t size, const DecodeOptions& options, DecodeInfo* info) {
  if (size < kFileHeaderBytes + 4) throw Error(ErrorCode::kInvalidArgument, "truncated BMP (file header)");
  const uint32_t pixel_offset = Le32(data + 10);
  const uint32_t header_size = Le32(data + 14);
  if (header_size == 12)
    throw Error(ErrorCode::kUnsupported, "BMP with an OS/2 (BITMAPCOREHEADER) header is not supported");
  if (header_size != 40 && header_size != 52 && header_size != 56 && header_size != 108 && header_size != 124)
    Invalid("unknown info header size " + std::to_string(header_size) + " (expected 40, 52, 56, 108 or 124)");
  if (size - kFileHeaderBytes < header_size) throw Error(ErrorCode::kInvalidArgument, "truncated BMP (info header)");
  const uint8_t* h = data + kFileHeaderBytes;
  const int32_t width = static_cast<int32_t>(Le32(h + 4));
  const int32_t raw_height = static_cast<int32_t>(Le32(h + 8));
  const uint16_t planes = Le16(h + 12);
  const uint16_t bits = Le16(h + 14);
  const uint32_t compression = Le32(h + 16);
  const uint32_t colors_used = Le32(h + 32);
  if (planes != 1) Invalid("planes is " + std::to_string(planes) + ", expected 1");
  if (width <= 0) Invalid("width is " + std::to_string(width) + ", expected > 0");
  if (raw_height == 0 || raw_height == INT32_MIN) Invalid("height is " + std::to_string(raw_height));
  const bool top_down = raw_height < 0;
  const int64_t height = top_down ? -int64_t{raw_height} : raw_height;
  if (compression == kBiRle8 || compression == kBiRle4)
    throw Error(ErrorCode::kUnsupported, "RLE-compressed BMP is not supported");
  if (compression != kBiRgb && compression != kBiBitfields)
    throw Error(ErrorCode::kUnsupported, "BMP compression " + std::to_string(compression) + " is not supported");
  if (bits != 8 && bits != 24 && bits != 32)
    throw Error(ErrorCode::kUnsupported,
                "BMP with " + std::to_string(bits) + " bits per pixel is not supported (8, 24 and 32 are)");
  CheckDimensions(width, height, options, "BMP");

  // Bit fields: the masks follow a 40-byte header or sit inside a longer one; both start at file offset 54.
  bool has_alpha = false;
  if (compression == kBiBitfields) {
    if (bits != 32) throw Error(ErrorCode::kUnsupported, "BI_BITFIELDS BMP is supported for 32 bits per pixel only");
    const size_t masks_end = kFileHeaderBytes + 40 + (header_size >= 56 ? 16 : 12);
    if (size < masks_end) throw Error(ErrorCode::kInvalidArgument, "truncated BMP (bit field masks)");
    const uint8_t* m = data + kFileHeaderBytes + 40;
    if (Le32(m) != 0xFF0000 || Le32(m + 4) != 0xFF00 || Le32(m + 8) != 0xFF)
      throw Error(ErrorCode::kUnsupported, "BI_BITFIELDS BMP with masks other than BGRA order is not supported");
    if (header_size >= 56) {
      const uint32_t alpha_mask = Le32(m + 12);
      if (alpha_mask != 0 && alpha_mask != 0xFF000000u)
        throw Error(ErrorCode::kUnsupported, "BI_BITFIELDS BMP with an unusual alpha mask is not supported");
      has_alpha = alpha_mask == 0xFF000000u;
    }
  }

  uint8_t palette[256][3] = {};  // RGB; indices past the palette read black
  if (bits == 8) {
    const uint32_t colors = colors_used == 0 ? 256 : colors_used;
    if (colors > 256) Invalid("palette of " + std::to_string(colors) + " colours for 8 bits per pixel");
    const size_t palette_at = kFileHeaderBytes + header_size;
    if ((size - palette_at) / 4 < colors) throw Error(ErrorCode::kInvalidArgument, "truncated BMP (palette)");
    for (uint32_t i = 0; i < colors; ++i) {
      const uint8_t* e = data + palette_at + 4 * i;  // B, G, R, reserved
      palette[i][0] = e[2];
      palette[i][1] = e[1];
      palette[i][2] = e[0];
    }
  }

  const uint64_t stride = (static_cast<uint64_t>(width) * bits + 31) / 32 * 4;
  if (pixel_offset < kFileHeaderBytes + header_size || pixel_offset > size)
    Invalid("pixel data offset " + std::to_string(pixel_offset) + " outside the file");
  // The last row needs only its pixels, not its padding (some writers omit the final padding).
  const uint64_t last_row = (static_cast<uint64_t>(width) * bits + 7) / 8;
  const uint64_t available = size - pixel_offset;
  if (available < last_row || (available - last_row) / stride < static_cast<uint64_t>(height - 1))
    throw Error(ErrorCode::kInvalidArgument, "truncated BMP (pixel data: need " + std::to_string(height) + " rows of " +
                                                 std::to_string(stride) + " bytes)");

  info->stored_width = width;
  info->stored_height = height;
  info->stored_channels = has_alpha ? 4 : 3;
  info->color = std::to_string(bits) + "-bit" +
                (bits == 8   ? " palette"
                 : has_alpha ? " bgra"
                             : " bgr") +
                (top_down ? " top-down" : "");

  const int64_t decoded_channels = has_alpha && options.channels == 4 ? 4 : 3;
  Tensor decoded(DType::kU8, {height, int64_t{width}, decoded_channels});
  uint8_t* out = decoded.data<uint8_t>();
  for (int64_t r = 0; r < height; ++r) {
    const int64_t stored_row = top_down ? r : height - 1 - r;
    const uint8_t* src = data + pixel_offset + static_cast<uint64_t>(stored_row) * stride;
    uint8_t* dst = out + r * width * decoded_channels;
    if (bits == 8) {
      for (int32_t x = 0; x < width; ++x, dst += 3) std::memcpy(dst, palette[src[x]], 3);
    } else {
      const int step = bits / 8;
      for (int32_t x = 0; x < width; ++x, src += step, dst += decoded_channels) {
        dst[0] = src[2];
        dst[1] = src[1];
        dst[2] = src[0];
        if (decoded_channels == 4) dst[3] = src[3];
      }
    }
  }
  return ConvertChannels(decoded, options.channels);
}

}  // namespace osprey::image_internal
