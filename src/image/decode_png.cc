// PNG through libspng: dimensions and chunk sizes limited before anything is allocated; 16-bit samples become 8-bit
// by keeping the high byte (as Pillow); tRNS becomes alpha for RGBA output; alpha is dropped for RGB and gray.
#include <spng.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <string>

#include "image/decode_internal.h"

namespace osprey::image_internal {

namespace {

struct SpngCloser {
  void operator()(spng_ctx* ctx) const { spng_ctx_free(ctx); }
};

// Chunk data (and the cache of ancillary chunks) larger than this is refused: real images never need it.
constexpr size_t kMaxChunkBytes = size_t{64} << 20;

[[noreturn]] void ThrowPngError(int code, const char* stage) {
  if (code == SPNG_EOF || code == SPNG_IO_EOF || code == SPNG_IO_ERROR)
    throw Error(ErrorCode::kInvalidArgument, std::string("truncated PNG (") + stage + ": " + spng_strerror(code) + ")");
  throw Error(ErrorCode::kInvalidArgument, std::string("corrupt PNG: ") + stage + ": " + spng_strerror(code));
}

const char* ColorTypeName(int color_type) {
  switch (color_type) {
    case SPNG_COLOR_TYPE_GRAYSCALE:
      return "gray";
    case SPNG_COLOR_TYPE_TRUECOLOR:
      return "rgb";
    case SPNG_COLOR_TYPE_INDEXED:
      return "palette";
    case SPNG_COLOR_TYPE_GRAYSCALE_ALPHA:
      return "gray+alpha";
    case SPNG_COLOR_TYPE_TRUECOLOR_ALPHA:
      return "rgba";
    default:
      return "unknown";
  }
}

}  // namespace

Tensor DecodePng(const uint8_t* data, size_t size, const DecodeOptions& options, DecodeInfo* info) {
  std::unique_ptr<spng_ctx, SpngCloser> ctx(spng_ctx_new(0));
  if (!ctx) throw Error(ErrorCode::kInternal, "libspng: cannot create a decoder");
  // Per-dimension limit: a side longer than max_pixels cannot fit in max_pixels anyway (capped at PNG's 2^31 - 1).
  const int64_t side_limit = std::min<int64_t>(options.max_pixels, std::numeric_limits<int32_t>::max());
  spng_set_image_limits(ctx.get(), static_cast<uint32_t>(side_limit), static_cast<uint32_t>(side_limit));
  spng_set_chunk_limits(ctx.get(), kMaxChunkBytes, kMaxChunkBytes);
  int rc = spng_set_png_buffer(ctx.get(), data, size);
  if (rc != 0) ThrowPngError(rc, "buffer");
  spng_ihdr ihdr{};
  rc = spng_get_ihdr(ctx.get(), &ihdr);
  if ((rc == SPNG_EUSER_WIDTH || rc == SPNG_EUSER_HEIGHT) && size >= 24) {
    // Over our limit: report the declared size (signature, chunk length, "IHDR", then big-endian width and height).
    auto be32 = [&](size_t at) {
      return (int64_t{data[at]} << 24) | (int64_t{data[at + 1]} << 16) | (int64_t{data[at + 2]} << 8) | data[at + 3];
    };
    CheckDimensions(be32(16), be32(20), options, "PNG");
  }
  if (rc != 0) ThrowPngError(rc, "header");
  CheckDimensions(ihdr.width, ihdr.height, options, "PNG");
  info->stored_width = ihdr.width;
  info->stored_height = ihdr.height;
  info->color = std::string(ColorTypeName(ihdr.color_type)) + " " + std::to_string(ihdr.bit_depth) + "-bit";
  switch (ihdr.color_type) {
    case SPNG_COLOR_TYPE_GRAYSCALE:
      info->stored_channels = 1;
      break;
    case SPNG_COLOR_TYPE_GRAYSCALE_ALPHA:
      info->stored_channels = 2;
      break;
    case SPNG_COLOR_TYPE_TRUECOLOR_ALPHA:
      info->stored_channels = 4;
      break;
    default:
      info->stored_channels = 3;
      break;
  }

  int format;
  int64_t decoded_channels;
  int flags = 0;
  if (options.channels == 4) {
    format = SPNG_FMT_RGBA8;
    decoded_channels = 4;
    flags = SPNG_DECODE_TRNS;
  } else if (options.channels == 1 && ihdr.color_type == SPNG_COLOR_TYPE_GRAYSCALE && ihdr.bit_depth <= 8) {
    format = SPNG_FMT_G8;
    decoded_channels = 1;
  } else {
    // Gray output from other sources goes through RGB: for gray sources that is exact (R = G = B).
    format = SPNG_FMT_RGB8;
    decoded_channels = 3;
  }
  size_t decoded_size = 0;
  rc = spng_decoded_image_size(ctx.get(), format, &decoded_size);
  if (rc != 0) ThrowPngError(rc, "size");
  const int64_t h = ihdr.height, w = ihdr.width;
  if (decoded_size != static_cast<size_t>(h * w * decoded_channels))
    throw Error(ErrorCode::kInternal, "libspng: unexpected decoded size " + std::to_string(decoded_size));
  Tensor decoded(DType::kU8, {h, w, decoded_channels});
  rc = spng_decode_image(ctx.get(), decoded.data<uint8_t>(), decoded_size, format, flags);
  if (rc != 0) ThrowPngError(rc, "decode");
  return ConvertChannels(decoded, options.channels);
}

}  // namespace osprey::image_internal
