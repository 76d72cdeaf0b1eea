// Image encoding for augmented outputs: JPEG through TurboJPEG (4:2:0, the Pillow / OpenCV default), PNG through
// libspng, WebP through libwebp's simple API (quality 101 = lossless). Gray WebP is stored as RGB because the WebP
// container has no gray mode; decoding it with channels = 1 gives the original values back.
#include <spng.h>
#include <turbojpeg.h>
#include <webp/encode.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "osprey/dataset.h"

namespace osprey::augment {

namespace {

struct TjCloser {
  void operator()(void* handle) const { tjDestroy(handle); }
};
struct SpngCloser {
  void operator()(spng_ctx* ctx) const { spng_ctx_free(ctx); }
};

// WebP's format limit on each side.
constexpr int64_t kWebpMaxSide = 16383;

void CheckImage(const Tensor& image, const std::string& format) {
  const std::string what = "EncodeImage(" + format + "): ";
  if (image.dtype() != DType::kU8)
    throw Error(ErrorCode::kInvalidArgument,
                what + "expected a uint8 image, got " + DTypeName(image.dtype()) + " (convert it first)");
  if (image.rank() != 3 || (image.dim(2) != 1 && image.dim(2) != 3))
    throw Error(ErrorCode::kInvalidArgument,
                what + "expected shape [H, W, C] with C = 1 or 3, got " + ShapeToString(image.shape()));
  if (image.dim(0) <= 0 || image.dim(1) <= 0 || image.dim(0) > INT_MAX / 4 || image.dim(1) > INT_MAX / 4)
    throw Error(ErrorCode::kInvalidArgument, what + "image size " + ShapeToString(image.shape()) + " out of range");
}

std::string EncodeJpeg(const Tensor& image, int quality) {
  if (quality < 1 || quality > 100)
    throw Error(ErrorCode::kInvalidArgument,
                "EncodeImage(jpeg): quality must be 1..100, got " + std::to_string(quality));
  const int height = static_cast<int>(image.dim(0)), width = static_cast<int>(image.dim(1));
  const int channels = static_cast<int>(image.dim(2));
  std::unique_ptr<void, TjCloser> handle(tjInitCompress());
  if (!handle) throw Error(ErrorCode::kInternal, "TurboJPEG: cannot create a compressor");
  unsigned char* out = nullptr;
  unsigned long out_size = 0;
  const int rc = tjCompress2(handle.get(), image.data<uint8_t>(), width, width * channels, height,
                             channels == 1 ? TJPF_GRAY : TJPF_RGB, &out, &out_size,
                             channels == 1 ? TJSAMP_GRAY : TJSAMP_420, quality, 0);
  if (rc != 0) {
    std::string message = std::string("TurboJPEG: ") + tjGetErrorStr2(handle.get());
    if (out) tjFree(out);
    throw Error(ErrorCode::kInternal, "EncodeImage(jpeg): " + message);
  }
  std::string bytes(reinterpret_cast<const char*>(out), out_size);
  tjFree(out);
  return bytes;
}

std::string EncodePng(const Tensor& image) {
  std::unique_ptr<spng_ctx, SpngCloser> ctx(spng_ctx_new(SPNG_CTX_ENCODER));
  if (!ctx) throw Error(ErrorCode::kInternal, "libspng: cannot create an encoder");
  spng_set_option(ctx.get(), SPNG_ENCODE_TO_BUFFER, 1);
  spng_ihdr ihdr{};
  ihdr.width = static_cast<uint32_t>(image.dim(1));
  ihdr.height = static_cast<uint32_t>(image.dim(0));
  ihdr.bit_depth = 8;
  ihdr.color_type = image.dim(2) == 1 ? SPNG_COLOR_TYPE_GRAYSCALE : SPNG_COLOR_TYPE_TRUECOLOR;
  int rc = spng_set_ihdr(ctx.get(), &ihdr);
  if (rc == 0) rc = spng_encode_image(ctx.get(), image.data<uint8_t>(), image.nbytes(), SPNG_FMT_PNG,
                                      SPNG_ENCODE_FINALIZE);
  if (rc != 0) throw Error(ErrorCode::kInternal, std::string("EncodeImage(png): libspng: ") + spng_strerror(rc));
  size_t size = 0;
  void* buffer = spng_get_png_buffer(ctx.get(), &size, &rc);
  if (!buffer || rc != 0)
    throw Error(ErrorCode::kInternal, std::string("EncodeImage(png): libspng: ") + spng_strerror(rc));
  std::string bytes(static_cast<const char*>(buffer), size);
  std::free(buffer);  // spng_get_png_buffer hands ownership to the caller (allocated with malloc)
  return bytes;
}

std::string EncodeWebp(const Tensor& image, int quality) {
  if (quality < 1 || quality > 101)
    throw Error(ErrorCode::kInvalidArgument,
                "EncodeImage(webp): quality must be 1..100, or 101 for lossless, got " + std::to_string(quality));
  const int64_t height = image.dim(0), width = image.dim(1);
  if (width > kWebpMaxSide || height > kWebpMaxSide)
    throw Error(ErrorCode::kInvalidArgument, "EncodeImage(webp): WebP images are at most 16383 x 16383, got " +
                                                 std::to_string(width) + " x " + std::to_string(height) +
                                                 " (use jpeg or png)");
  const uint8_t* rgb = image.data<uint8_t>();
  std::vector<uint8_t> expanded;
  if (image.dim(2) == 1) {
    expanded.resize(static_cast<size_t>(width * height * 3));
    for (int64_t i = 0; i < width * height; ++i) expanded[3 * i] = expanded[3 * i + 1] = expanded[3 * i + 2] = rgb[i];
    rgb = expanded.data();
  }
  uint8_t* out = nullptr;
  const int stride = static_cast<int>(width * 3);
  const size_t size = quality == 101
                          ? WebPEncodeLosslessRGB(rgb, static_cast<int>(width), static_cast<int>(height), stride, &out)
                          : WebPEncodeRGB(rgb, static_cast<int>(width), static_cast<int>(height), stride,
                                          static_cast<float>(quality), &out);
  if (size == 0 || !out) {
    if (out) WebPFree(out);
    throw Error(ErrorCode::kInternal, "EncodeImage(webp): libwebp failed to encode a " + std::to_string(width) +
                                          " x " + std::to_string(height) + " image");
  }
  std::string bytes(reinterpret_cast<const char*>(out), size);
  WebPFree(out);
  return bytes;
}

}  // namespace

std::string EncodeImage(const Tensor& image, const std::string& format, int quality) {
  if (format != "jpeg" && format != "png" && format != "webp")
    throw Error(ErrorCode::kInvalidArgument,
                "EncodeImage: unknown format '" + format + "' (expected jpeg, png or webp)");
  CheckImage(image, format);
  if (format == "jpeg") return EncodeJpeg(image, quality);
  if (format == "png") return EncodePng(image);
  return EncodeWebp(image, quality);
}

std::string ImageFormatFromExtension(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  const size_t dot = path.find_last_of('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) return "";
  std::string ext = path.substr(dot + 1);
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  if (ext == "jpg" || ext == "jpeg") return "jpeg";
  if (ext == "png") return "png";
  if (ext == "webp") return "webp";
  return "";
}

}  // namespace osprey::augment
