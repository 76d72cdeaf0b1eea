// JPEG through libjpeg-turbo's TurboJPEG API: header first (limits before allocation), optional DCT-domain
// downscaling, grayscale and CMYK/YCCK sources, EXIF orientation applied after decoding. A window of an upright image
// (DecodeOptions::region_*) goes through libjpeg-turbo's libjpeg API instead, which can skip rows and crop columns.
#include <turbojpeg.h>

#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include <jerror.h>
#include <jpeglib.h>

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

// libjpeg reports errors through a callback that must not return: it longjmps back to DecodeWindow, which keeps no
// C++ object alive across the jump (the output buffer belongs to the caller, the row buffer to libjpeg's pool).
struct WindowErrors {
  jpeg_error_mgr pub;
  std::jmp_buf jump;
  bool truncated;
  char message[JMSG_LENGTH_MAX];
};

void WindowErrorExit(j_common_ptr cinfo) {
  auto* e = reinterpret_cast<WindowErrors*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, e->message);
  std::longjmp(e->jump, 1);
}

// Warnings (level -1) are corrupt data libjpeg works around. As in DecodeJpeg (TurboJPEG keeps the first warning's
// text), the image is refused when the first warning is a premature end (the rest filled with grey).
void WindowMessage(j_common_ptr cinfo, int level) {
  auto* e = reinterpret_cast<WindowErrors*>(cinfo->err);
  if (level >= 0 || cinfo->err->num_warnings++ > 0) return;
  if (cinfo->err->msg_code == JWRN_JPEG_EOF) {
    e->truncated = true;
    (*cinfo->err->format_message)(cinfo, e->message);
  }
}

// Rows [y, y + h) and columns [x, x + w) of a JPEG as RGB (channels 3) or gray (1) into `out` (h * w * channels
// bytes): jpeg_skip_scanlines over the rows above and below, jpeg_crop_scanline to the iMCU columns around the window.
// With `wide` (room for h rows of `capacity` pixels at out), the decoded columns [*left, *left + *width) go to out
// as they are, without the copy into the exact window. Returns false with errors->message (and errors->truncated) on
// failure.
bool DecodeWindow(const uint8_t* data, size_t size, JDIMENSION x, JDIMENSION y, JDIMENSION w, JDIMENSION h,
                  int channels, uint8_t* out, bool wide, JDIMENSION capacity, JDIMENSION* left_out,
                  JDIMENSION* width_out, WindowErrors* errors) {
  jpeg_decompress_struct cinfo;
  cinfo.err = jpeg_std_error(&errors->pub);
  errors->pub.error_exit = WindowErrorExit;
  errors->pub.emit_message = WindowMessage;
  errors->truncated = false;
  errors->message[0] = '\0';
  jpeg_create_decompress(&cinfo);
  if (setjmp(errors->jump)) {
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  jpeg_mem_src(&cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&cinfo, TRUE);
  cinfo.out_color_space = channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_start_decompress(&cinfo);
  // Fancy (smooth) chroma upsampling reads the neighbouring chroma samples, which a crop edge replaces with copies of
  // its own: decoding one more iMCU column (at most 32 pixels) on each side keeps the window's pixels exact.
  const JDIMENSION margin = 32;
  JDIMENSION left = x > margin ? x - margin : 0;
  JDIMENSION width = std::min<JDIMENSION>(cinfo.output_width, x + w + margin) - left;
  jpeg_crop_scanline(&cinfo, &left, &width);
  *left_out = left, *width_out = width;
  bool ok = (!wide || width <= capacity) && (y == 0 || jpeg_skip_scanlines(&cinfo, y) == y);
  // Rows in groups of rec_outbuf_height: fewer make libjpeg upsample into a spare row and copy it.
  const JDIMENSION group = std::max(1, cinfo.rec_outbuf_height);
  JSAMPARRAY rows = (*cinfo.mem->alloc_sarray)(reinterpret_cast<j_common_ptr>(&cinfo), JPOOL_IMAGE,
                                               cinfo.output_width * cinfo.output_components, group);
  JSAMPARRAY direct = reinterpret_cast<JSAMPARRAY>(
      (*cinfo.mem->alloc_small)(reinterpret_cast<j_common_ptr>(&cinfo), JPOOL_IMAGE, group * sizeof(JSAMPROW)));
  for (JDIMENSION r = 0; ok && r < h;) {
    const JDIMENSION n = std::min(group, h - r);
    if (wide) {
      for (JDIMENSION k = 0; k < n; ++k) direct[k] = out + static_cast<size_t>(r + k) * width * channels;
      const JDIMENSION got = jpeg_read_scanlines(&cinfo, direct, n);
      ok = got > 0;
      r += got;
      continue;
    }
    const JDIMENSION got = jpeg_read_scanlines(&cinfo, rows, n);
    ok = got > 0;
    for (JDIMENSION k = 0; k < got; ++k, ++r)
      std::memcpy(out + static_cast<size_t>(r) * w * channels, rows[k] + (x - left) * channels, w * channels);
  }
  // The rows below are skipped too (entropy-decoded only), so a file that is truncated or corrupt anywhere is refused
  // as the full decode refuses it, whatever the window.
  // (Skipping to the very end would return at once without reading anything: the last row is read instead.)
  const JDIMENSION below = cinfo.output_height - cinfo.output_scanline;
  if (ok && below > 1) ok = jpeg_skip_scanlines(&cinfo, below - 1) == below - 1;
  if (ok && below > 0) ok = jpeg_read_scanlines(&cinfo, rows, group) == 1;
  if (!ok) std::snprintf(errors->message, sizeof errors->message, "the image data ended early");
  if (ok) jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return ok && !errors->truncated;
}

}  // namespace

bool PeekJpegSize(const uint8_t* data, size_t size, const DecodeOptions& options, int64_t* width, int64_t* height) {
  TjHandle handle(tjInitDecompress());
  int w = 0, h = 0, subsampling = 0, colorspace = 0;
  if (!handle || size > static_cast<size_t>(~0ul) ||
      tjDecompressHeader3(handle.get(), data, static_cast<unsigned long>(size), &w, &h, &subsampling, &colorspace) != 0)
    return false;
  const bool swap = options.apply_exif_orientation && ScanJpegMarkers(data, size).exif_orientation >= 5;
  *width = swap ? h : w;
  *height = swap ? w : h;
  return true;
}

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
  const int64_t oriented_w = swap_axes ? out_h : out_w, oriented_h = swap_axes ? out_w : out_h;
  info->region_x = options.region_x, info->region_y = options.region_y;
  if (CheckRegion(options, oriented_w, oriented_h) && orientation == 1 && !cmyk && options.channels != 4) {
    // Wide: room for the iMCU-aligned columns around the window (32 pixels of margin each side, plus alignment).
    const int64_t capacity = options.region_may_widen ? std::min(oriented_w, options.region_width + 96)
                                                      : options.region_width;
    Tensor window(DType::kU8, {options.region_height, capacity, options.channels});
    WindowErrors errors;
    JDIMENSION left = 0, width = 0;
    // A damaged file goes on to the full decode below, which accepts or refuses it exactly as without a window.
    if (DecodeWindow(data, size, static_cast<JDIMENSION>(options.region_x), static_cast<JDIMENSION>(options.region_y),
                     static_cast<JDIMENSION>(options.region_width), static_cast<JDIMENSION>(options.region_height),
                     options.channels, window.data<uint8_t>(), options.region_may_widen,
                     static_cast<JDIMENSION>(capacity), &left, &width, &errors)) {
      if (!options.region_may_widen) return window;
      info->region_x = left;
      return Tensor::View(DType::kU8, {options.region_height, static_cast<int64_t>(width), options.channels},
                          window.buffer(), 0);
    }
  }
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
  return CropToRegion(ConvertChannels(decoded, options.channels), options);
}

}  // namespace osprey::image_internal
