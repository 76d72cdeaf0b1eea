// WebP through libwebp's advanced decoding API, writing straight into the output tensor.
#include <webp/decode.h>

#include <string>

#include "image/decode_internal.h"

namespace osprey::image_internal {

namespace {

const char* StatusName(VP8StatusCode status) {
  switch (status) {
    case VP8_STATUS_OUT_OF_MEMORY:
      return "out of memory";
    case VP8_STATUS_INVALID_PARAM:
      return "invalid parameter";
    case VP8_STATUS_BITSTREAM_ERROR:
      return "bitstream error";
    case VP8_STATUS_UNSUPPORTED_FEATURE:
      return "unsupported feature";
    case VP8_STATUS_SUSPENDED:
      return "suspended";
    case VP8_STATUS_USER_ABORT:
      return "aborted";
    case VP8_STATUS_NOT_ENOUGH_DATA:
      return "not enough data";
    default:
      return "error";
  }
}

[[noreturn]] void ThrowWebpError(VP8StatusCode status, const char* stage) {
  if (status == VP8_STATUS_NOT_ENOUGH_DATA) throw Error(ErrorCode::kInvalidArgument, "truncated WebP");
  if (status == VP8_STATUS_UNSUPPORTED_FEATURE)
    throw Error(ErrorCode::kUnsupported, std::string("WebP ") + stage + ": unsupported feature");
  throw Error(ErrorCode::kInvalidArgument, std::string("corrupt WebP: ") + stage + ": " + StatusName(status));
}

}  // namespace

Tensor DecodeWebp(const uint8_t* data, size_t size, const DecodeOptions& options, DecodeInfo* info) {
  WebPDecoderConfig config;
  if (!WebPInitDecoderConfig(&config)) throw Error(ErrorCode::kInternal, "libwebp: version mismatch");
  VP8StatusCode status = WebPGetFeatures(data, size, &config.input);
  if (status != VP8_STATUS_OK) ThrowWebpError(status, "header");
  if (config.input.has_animation)
    throw Error(ErrorCode::kUnsupported, "animated WebP is not supported (decode one frame with another tool)");
  CheckDimensions(config.input.width, config.input.height, options, "WebP");
  info->stored_width = config.input.width;
  info->stored_height = config.input.height;
  info->stored_channels = config.input.has_alpha ? 4 : 3;
  info->color = std::string(config.input.has_alpha ? "rgba" : "rgb") + (config.input.format == 2   ? " lossless"
                                                                        : config.input.format == 1 ? " lossy"
                                                                                                   : "");

  const int64_t h = config.input.height, w = config.input.width;
  const int64_t decoded_channels = options.channels == 4 ? 4 : 3;
  Tensor decoded(DType::kU8, {h, w, decoded_channels});
  config.output.colorspace = decoded_channels == 4 ? MODE_RGBA : MODE_RGB;
  config.output.is_external_memory = 1;
  config.output.u.RGBA.rgba = decoded.data<uint8_t>();
  config.output.u.RGBA.stride = static_cast<int>(w * decoded_channels);
  config.output.u.RGBA.size = decoded.nbytes();
  status = WebPDecode(data, size, &config);
  WebPFreeDecBuffer(&config.output);  // external memory: frees only libwebp's bookkeeping
  if (status != VP8_STATUS_OK) ThrowWebpError(status, "decode");
  return ConvertChannels(decoded, options.channels);
}

}  // namespace osprey::image_internal
