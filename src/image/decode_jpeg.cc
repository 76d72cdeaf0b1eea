// JPEG through libjpeg-turbo's TurboJPEG API: header first (limits before allocation), optional DCT-domain
// downscaling, grayscale and CMYK/YCCK sources, EXIF orientation applied after decoding.
#include <turbojpeg.h>

#include <cstring>
#include <memory>
#include <string>

#include "image/decode_internal.h"

namespace osprey::image_internal {

namespace {

struct TjHandleCloser {
  void operator()(void* handle) const { tjDestroy(handle); }
};
using TjHandle = std::unique_ptr<void, TjHandleCloser>;

[[noreturn]] void ThrowJpegError(tjhandle handle, const char* stage, bool ran_out = false) {
  std::string message = tjGetErrorStr2(handle);
  if (ran_out || message.find("Premature end") != std::string::npos)
    throw Error(ErrorCode::kInvalidArgument, "truncated JPEG (" + message + ")");
  throw Error(ErrorCode::kInvalidArgument, std::string("corrupt JPEG: ") + stage + ": " + message);
}

const char* ColorspaceName(int colorspace) {
  switch (colorspace) {
    case TJCS_RGB:
      return "rgb";
    case TJCS_YCbCr:
      return "ycbcr";
    case TJCS_GRAY:
      return "gray";
    case TJCS_CMYK:
      return "cmyk";
    case TJCS_YCCK:
      return "ycck";
    default:
      return "unknown";
  }
}

// Pillow reads every CMYK JPEG with Adobe polarity (stored values are inverted) and converts with
// R = (255 - K) - round(C * (255 - K) / 255), C and K being the un-inverted values.
void CmykToRgb(const uint8_t* cmyk, int64_t pixels, uint8_t* rgb) {
  for (int64_t i = 0; i < pixels; ++i, cmyk += 4, rgb += 3) {
    const int nk = cmyk[3];  // stored (inverted) K is 255 - K
    for (int ch = 0; ch < 3; ++ch) {
      const int c = 255 - cmyk[ch];
      int t = c * nk + 128;
      t = ((t >> 8) + t) >> 8;
      int v = nk - t;
      rgb[ch] = static_cast<uint8_t>(v < 0 ? 0 : v > 255 ? 255 : v);
    }
  }
}

}  // namespace

Tensor DecodeJpeg(const uint8_t* data, size_t size, const DecodeOptions& options, DecodeInfo* info) {
  TjHandle handle(tjInitDecompress());
  if (!handle) throw Error(ErrorCode::kInternal, "TurboJPEG: cannot create a decompressor");
  if (size > static_cast<size_t>(~0ul)) throw Error(ErrorCode::kInvalidArgument, "JPEG too large");
  const JpegMarkers markers = ScanJpegMarkers(data, size);
  int width = 0, height = 0, subsampling = 0, colorspace = 0;
  if (tjDecompressHeader3(handle.get(), data, static_cast<unsigned long>(size), &width, &height, &subsampling,
                          &colorspace) != 0)
    ThrowJpegError(handle.get(), "header", markers.ran_out);
  CheckDimensions(width, height, options, "JPEG");
  info->stored_width = width;
  info->stored_height = height;
  info->color = ColorspaceName(colorspace);
  info->stored_channels = colorspace == TJCS_GRAY ? 1 : (colorspace == TJCS_CMYK || colorspace == TJCS_YCCK) ? 4 : 3;

  info->exif_orientation = markers.exif_orientation;
  const int orientation = options.apply_exif_orientation ? markers.exif_orientation : 1;
  const bool swap_axes = orientation >= 5;

  // Smallest of 1/2, 1/4, 1/8 that keeps the oriented output at least min_width x min_height.
  tjscalingfactor scale = {1, 1};
  if (options.min_width > 0 || options.min_height > 0) {
    int num_factors = 0;
    tjscalingfactor* factors = tjGetScalingFactors(&num_factors);
    for (int i = 0; factors != nullptr && i < num_factors; ++i) {
      const tjscalingfactor f = factors[i];
      if (f.num != 1 || (f.denom != 2 && f.denom != 4 && f.denom != 8)) continue;
      const int64_t w = TJSCALED(width, f), h = TJSCALED(height, f);
      const int64_t out_w = swap_axes ? h : w, out_h = swap_axes ? w : h;
      if (out_w >= options.min_width && out_h >= options.min_height && f.denom > scale.denom) scale = f;
    }
  }
  info->scale_num = scale.num;
  info->scale_denom = scale.denom;
  const int64_t out_w = TJSCALED(width, scale), out_h = TJSCALED(height, scale);

  const bool cmyk = colorspace == TJCS_CMYK || colorspace == TJCS_YCCK;
  int pixel_format;
  int64_t decoded_channels;
  if (cmyk) {
    pixel_format = TJPF_CMYK;
    decoded_channels = 4;
  } else if (options.channels == 1) {
    pixel_format = TJPF_GRAY;  // the luma channel as coded (for colour JPEGs, Y of YCbCr)
    decoded_channels = 1;
  } else if (options.channels == 4) {
    pixel_format = TJPF_RGBA;
    decoded_channels = 4;
  } else {
    pixel_format = TJPF_RGB;
    decoded_channels = 3;
  }
  Tensor decoded(DType::kU8, {out_h, out_w, decoded_channels});
  if (tjDecompress2(handle.get(), data, static_cast<unsigned long>(size), decoded.data<uint8_t>(),
                    static_cast<int>(out_w), 0, static_cast<int>(out_h), pixel_format, 0) != 0) {
    // Warnings (e.g. extraneous bytes) still produce a complete image; only truncation and errors are refused.
    if (tjGetErrorCode(handle.get()) != TJERR_WARNING ||
        std::string(tjGetErrorStr2(handle.get())).find("Premature end") != std::string::npos)
      ThrowJpegError(handle.get(), "decode");
  }
  if (cmyk) {
    Tensor rgb(DType::kU8, {out_h, out_w, 3});
    CmykToRgb(decoded.data<uint8_t>(), out_h * out_w, rgb.data<uint8_t>());
    decoded = rgb;
    info->color = colorspace == TJCS_CMYK ? "cmyk" : "ycck";
  }
  if (orientation != 1) {
    decoded = ApplyOrientation(decoded, orientation);
    info->orientation_applied = true;
  }
  return ConvertChannels(decoded, options.channels);
}

}  // namespace osprey::image_internal
