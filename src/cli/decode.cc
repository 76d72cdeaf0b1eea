// osprey decode IMAGE [--channels 1|3|4] [--max-megapixels N] [--no-exif] [--min-size WxH] -o OUT.npy
#include "cli/decode.h"

#include <cmath>
#include <string>

#include "osprey/error.h"
#include "osprey/image.h"
#include "osprey/npy.h"

namespace osprey::cli {

namespace {

struct DecodeCommandOptions {
  std::string image;
  std::string output;
  int channels = 3;
  double max_megapixels = 100;
  bool no_exif = false;
  std::string min_size;  // "WxH"
};

DecodeCommandOptions& Options() {
  static DecodeCommandOptions options;
  return options;
}

// "WxH" with W, H >= 0.
std::pair<int64_t, int64_t> ParseMinSize(const std::string& text) {
  const size_t x = text.find_first_of("xX");
  auto bad = [&]() {
    return Error(ErrorCode::kInvalidArgument, "--min-size: expected WxH (e.g. 256x192), got '" + text + "'");
  };
  if (x == std::string::npos || x == 0 || x + 1 == text.size()) throw bad();
  const std::string w = text.substr(0, x), h = text.substr(x + 1);
  if (w.find_first_not_of("0123456789") != std::string::npos ||
      h.find_first_not_of("0123456789") != std::string::npos || w.size() > 9 || h.size() > 9)
    throw bad();
  return {std::stoll(w), std::stoll(h)};
}

}  // namespace

CLI::App* AddDecodeCommand(CLI::App& app) {
  DecodeCommandOptions& o = Options();
  CLI::App* decode = app.add_subcommand("decode", "Decode a JPEG, PNG, WebP or BMP image into a uint8 HxWxC .npy file");
  decode->add_option("image", o.image, "Image file (format detected from its bytes)")->required();
  decode->add_option("--output,-o", o.output, "Output .npy file")->required();
  decode->add_option("--channels", o.channels, "1 = gray, 3 = RGB, 4 = RGBA")
      ->check(CLI::IsMember({1, 3, 4}))
      ->capture_default_str();
  decode->add_option("--max-megapixels", o.max_megapixels, "Refuse larger images (checked before decoding)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  decode->add_flag("--no-exif", o.no_exif, "Ignore the JPEG EXIF orientation tag");
  decode->add_option("--min-size", o.min_size,
                     "WxH: JPEG may decode at 1/2, 1/4 or 1/8 scale while staying at least this large");
  return decode;
}

int RunDecodeCommand(std::ostream& out) {
  const DecodeCommandOptions& o = Options();
  DecodeOptions options;
  options.channels = o.channels;
  const double max_pixels = std::floor(o.max_megapixels * 1e6);
  if (!(max_pixels >= 1) || max_pixels > 9e18)
    throw Error(ErrorCode::kInvalidArgument, "--max-megapixels: out of range");
  options.max_pixels = static_cast<int64_t>(max_pixels);
  options.apply_exif_orientation = !o.no_exif;
  if (!o.min_size.empty()) std::tie(options.min_width, options.min_height) = ParseMinSize(o.min_size);

  DecodeInfo info;
  Tensor image = ReadImageFile(o.image, options, &info);
  WriteNpy(o.output, image);
  out << "format:      " << ImageFormatName(info.format) << " (" << info.color << ")\n";
  out << "stored size: " << info.stored_width << "x" << info.stored_height << "\n";
  out << "output:      " << image.dim(1) << "x" << image.dim(0) << "x" << image.dim(2) << " uint8 -> " << o.output
      << "\n";
  out << "dct scaling: ";
  if (info.scale_denom != 1)
    out << info.scale_num << "/" << info.scale_denom << "\n";
  else
    out << "none\n";
  out << "exif:        orientation " << info.exif_orientation
      << (info.orientation_applied     ? " (applied)"
          : info.exif_orientation != 1 ? " (not applied)"
                                       : "")
      << "\n";
  return 0;
}

}  // namespace osprey::cli
