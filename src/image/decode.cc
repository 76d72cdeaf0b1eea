// Format detection, limits, channel conversion and orientation shared by every decoder, and the public entry points.
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "image/decode_internal.h"
#include "kernels/reference/reference.h"
#include "osprey/image.h"

namespace osprey {

const char* ImageFormatName(ImageFormat format) {
  switch (format) {
    case ImageFormat::kJpeg:
      return "jpeg";
    case ImageFormat::kPng:
      return "png";
    case ImageFormat::kWebp:
      return "webp";
    case ImageFormat::kBmp:
      return "bmp";
    default:
      return "unknown";
  }
}

ImageFormat DetectImageFormat(const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  if (p == nullptr) return ImageFormat::kUnknown;
  if (size >= 3 && p[0] == 0xFF && p[1] == 0xD8 && p[2] == 0xFF) return ImageFormat::kJpeg;
  static const uint8_t kPngSignature[8] = {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A};
  if (size >= 8 && std::memcmp(p, kPngSignature, 8) == 0) return ImageFormat::kPng;
  if (size >= 12 && std::memcmp(p, "RIFF", 4) == 0 && std::memcmp(p + 8, "WEBP", 4) == 0) return ImageFormat::kWebp;
  if (size >= 2 && p[0] == 'B' && p[1] == 'M') return ImageFormat::kBmp;
  return ImageFormat::kUnknown;
}

namespace image_internal {

namespace {

std::string Megapixels(double pixels) {
  std::ostringstream s;
  s.precision(4);
  s << pixels / 1e6;
  return s.str();
}

}  // namespace

void CheckDimensions(int64_t width, int64_t height, const DecodeOptions& options, const char* format) {
  if (width <= 0 || height <= 0)
    throw Error(ErrorCode::kInvalidArgument, std::string(format) + " header declares an empty image (" +
                                                 std::to_string(width) + "x" + std::to_string(height) + ")");
  // Both are below 2^32 for every format, so the product fits in int64.
  int64_t pixels = width * height;
  if (pixels > options.max_pixels)
    throw Error(ErrorCode::kInvalidArgument,
                "image is " + std::to_string(width) + "x" + std::to_string(height) + " = " +
                    Megapixels(static_cast<double>(pixels)) + " megapixels, over the limit of " +
                    Megapixels(static_cast<double>(options.max_pixels)) + " megapixels (" +
                    (options.limit_name.empty() ? std::string("DecodeOptions::max_pixels") : options.limit_name) + ")");
}

void CheckChannels(const DecodeOptions& options) {
  if (options.channels != 1 && options.channels != 3 && options.channels != 4)
    throw Error(ErrorCode::kInvalidArgument,
                "DecodeOptions::channels must be 1, 3 or 4, got " + std::to_string(options.channels));
}

Tensor ConvertChannels(const Tensor& image, int channels) {
  const int64_t src_c = image.dim(2);
  if (src_c == channels) return image;
  const int64_t pixels = image.dim(0) * image.dim(1);
  Tensor out(DType::kU8, {image.dim(0), image.dim(1), channels});
  const uint8_t* s = image.data<uint8_t>();
  uint8_t* d = out.data<uint8_t>();
  if (channels == 1) {
    OSPREY_CHECK(src_c >= 3);
    // Pillow's L24: (R*19595 + G*38470 + B*7471 + 0x8000) >> 16, i.e. ITU-R 601-2 (0.299, 0.587, 0.114) rounded.
    for (int64_t i = 0; i < pixels; ++i, s += src_c)
      d[i] = static_cast<uint8_t>((s[0] * 19595u + s[1] * 38470u + s[2] * 7471u + 0x8000u) >> 16);
  } else if (src_c == 1) {
    for (int64_t i = 0; i < pixels; ++i, d += channels) {
      d[0] = d[1] = d[2] = s[i];
      if (channels == 4) d[3] = 255;
    }
  } else if (src_c == 3 && channels == 4) {
    for (int64_t i = 0; i < pixels; ++i, s += 3, d += 4) {
      d[0] = s[0];
      d[1] = s[1];
      d[2] = s[2];
      d[3] = 255;
    }
  } else {
    OSPREY_CHECK(src_c == 4 && channels == 3);
    for (int64_t i = 0; i < pixels; ++i, s += 4, d += 3) {
      d[0] = s[0];
      d[1] = s[1];
      d[2] = s[2];
    }
  }
  return out;
}

Tensor ApplyOrientation(const Tensor& image, int orientation) {
  if (orientation < 2 || orientation > 8) return image;
  const int64_t h = image.dim(0), w = image.dim(1), c = image.dim(2);
  const bool swap = orientation >= 5;
  const int64_t out_h = swap ? w : h, out_w = swap ? h : w;
  // Output pixel (r, col) reads input pixel start + r * step_row + col * step_col (in pixels).
  int64_t start = 0, step_row = w, step_col = 1;
  switch (orientation) {
    case 2:
      start = w - 1;
      step_row = w;
      step_col = -1;
      break;  // FLIP_LEFT_RIGHT
    case 3:
      start = (h - 1) * w + w - 1;
      step_row = -w;
      step_col = -1;
      break;  // ROTATE_180
    case 4:
      start = (h - 1) * w;
      step_row = -w;
      step_col = 1;
      break;  // FLIP_TOP_BOTTOM
    case 5:
      start = 0;
      step_row = 1;
      step_col = w;
      break;  // TRANSPOSE
    case 6:
      start = (h - 1) * w;
      step_row = 1;
      step_col = -w;
      break;  // ROTATE_270 (clockwise)
    case 7:
      start = (h - 1) * w + w - 1;
      step_row = -1;
      step_col = -w;
      break;  // TRANSVERSE
    case 8:
      start = w - 1;
      step_row = -1;
      step_col = w;
      break;  // ROTATE_90 (counter-clockwise)
  }
  Tensor out(DType::kU8, {out_h, out_w, c});
  const uint8_t* s = image.data<uint8_t>();
  uint8_t* d = out.data<uint8_t>();
  for (int64_t r = 0; r < out_h; ++r) {
    int64_t src = start + r * step_row;
    if (c == 3) {
      for (int64_t col = 0; col < out_w; ++col, src += step_col, d += 3) {
        const uint8_t* p = s + src * 3;
        d[0] = p[0];
        d[1] = p[1];
        d[2] = p[2];
      }
    } else {
      for (int64_t col = 0; col < out_w; ++col, src += step_col, d += c) std::memcpy(d, s + src * c, c);
    }
  }
  return out;
}

bool CheckRegion(const DecodeOptions& o, int64_t width, int64_t height) {
  if (o.region_width == 0 && o.region_height == 0 && o.region_x == 0 && o.region_y == 0) return false;
  if (o.min_width > 0 || o.min_height > 0)
    throw Error(ErrorCode::kInvalidArgument, "DecodeOptions: a region cannot be combined with min_width/min_height");
  if (o.region_x < 0 || o.region_y < 0 || o.region_width < 1 || o.region_height < 1 ||
      o.region_width > width - o.region_x || o.region_height > height - o.region_y)
    throw Error(ErrorCode::kInvalidArgument,
                "DecodeOptions: region " + std::to_string(o.region_width) + "x" + std::to_string(o.region_height) +
                    " at (" + std::to_string(o.region_x) + ", " + std::to_string(o.region_y) + ") is not inside the " +
                    std::to_string(width) + "x" + std::to_string(height) + " image");
  return true;
}

Tensor CropToRegion(const Tensor& image, const DecodeOptions& o) {
  const int64_t h = image.dim(0), w = image.dim(1), c = image.dim(2);
  if (!CheckRegion(o, w, h)) return image;
  Tensor out(DType::kU8, {o.region_height, o.region_width, c});
  for (int64_t r = 0; r < o.region_height; ++r)
    std::memcpy(out.data<uint8_t>() + r * o.region_width * c,
                image.data<uint8_t>() + ((o.region_y + r) * w + o.region_x) * c, o.region_width * c);
  return out;
}

}  // namespace image_internal

bool PeekImageSize(const void* data, size_t size, const DecodeOptions& options, int64_t* width, int64_t* height) {
  if (data == nullptr || DetectImageFormat(data, size) != ImageFormat::kJpeg) return false;
  return image_internal::PeekJpegSize(static_cast<const uint8_t*>(data), size, options, width, height);
}

namespace {
// ImageDecoder's decoder (kernels/reference/reference.h), installed when this library is linked in: the pixels as
// stored (no EXIF rotation); gray as the luma of the decoded RGB (a colour JPEG's coded Y differs from it), as the
// ONNX reference (Pillow's convert('L')) computes it.
// An image over the pixel limit is this program's limit, not a broken stream: kResourceExhausted naming it (the op's
// kernel turns only kInvalidArgument into the spec's empty output).
Tensor DecodeForImageDecoder(const void* data, size_t size, int channels) {
  DecodeOptions options;
  options.apply_exif_orientation = false;
  options.limit_name = "ImageDecoder's pixel limit";  // named only by the size error
  Tensor rgb;
  try {
    rgb = DecodeImage(data, size, options);
  } catch (const Error& e) {
    if (std::strstr(e.what(), options.limit_name.c_str()) != nullptr)
      throw Error(ErrorCode::kResourceExhausted, e.what());
    throw;
  }
  return channels == 3 ? rgb : image_internal::ConvertChannels(rgb, channels);
}
}  // namespace

// A weak reference: programs that link the decoders without the kernels (the image fuzz target) install nothing.
void SetImageDecoder(ImageDecodeFn decode) __attribute__((weak));
namespace {
const bool g_image_decoder_installed = SetImageDecoder != nullptr && (SetImageDecoder(DecodeForImageDecoder), true);
}  // namespace

Tensor DecodeImage(const void* data, size_t size, const DecodeOptions& options, DecodeInfo* info) {
  image_internal::CheckChannels(options);
  if (options.max_pixels <= 0)
    throw Error(ErrorCode::kInvalidArgument,
                "DecodeOptions::max_pixels must be positive, got " + std::to_string(options.max_pixels));
  if (data == nullptr || size == 0) throw Error(ErrorCode::kInvalidArgument, "not an image: empty input (0 bytes)");
  DecodeInfo local_info;
  DecodeInfo* out_info = info != nullptr ? info : &local_info;
  *out_info = DecodeInfo();
  const auto* bytes = static_cast<const uint8_t*>(data);
  ImageFormat format = DetectImageFormat(data, size);
  out_info->format = format;
  switch (format) {
    case ImageFormat::kJpeg:
      return image_internal::DecodeJpeg(bytes, size, options, out_info);
    case ImageFormat::kPng:
      out_info->region_x = options.region_x, out_info->region_y = options.region_y;
      return image_internal::CropToRegion(image_internal::DecodePng(bytes, size, options, out_info), options);
    case ImageFormat::kWebp:
      out_info->region_x = options.region_x, out_info->region_y = options.region_y;
      return image_internal::CropToRegion(image_internal::DecodeWebp(bytes, size, options, out_info), options);
    case ImageFormat::kBmp:
      out_info->region_x = options.region_x, out_info->region_y = options.region_y;
      return image_internal::CropToRegion(image_internal::DecodeBmp(bytes, size, options, out_info), options);
    default:
      break;
  }
  std::string first;
  for (size_t i = 0; i < size && i < 4; ++i) {
    char hex[4];
    std::snprintf(hex, sizeof(hex), "%s%02x", i == 0 ? "" : " ", bytes[i]);
    first += hex;
  }
  throw Error(ErrorCode::kInvalidArgument,
              "not an image: unknown format (first bytes " + first + "); expected JPEG, PNG, WebP or BMP");
}

std::vector<char> ReadImageBytes(const std::string& path) {
  std::ifstream file(path, std::ios::binary | std::ios::ate);
  if (!file) throw Error(ErrorCode::kNotFound, path + ": cannot open image file");
  std::streamoff length = file.tellg();
  if (length < 0) throw Error(ErrorCode::kUnavailable, path + ": cannot read image file");
  std::vector<char> bytes(static_cast<size_t>(length));
  file.seekg(0);
  if (length > 0 && !file.read(bytes.data(), length))
    throw Error(ErrorCode::kUnavailable, path + ": cannot read image file");
  return bytes;
}

Tensor ReadImageFile(const std::string& path, const DecodeOptions& options, DecodeInfo* info) {
  const std::vector<char> bytes = ReadImageBytes(path);
  try {
    return DecodeImage(bytes.data(), bytes.size(), options, info);
  } catch (const Error& e) {
    throw Error(e.code(), path + ": " + e.what());
  }
}

}  // namespace osprey
