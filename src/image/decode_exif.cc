// JPEG marker walk and a small EXIF (TIFF) reader for the orientation tag. Every read is bounds-checked against the
// segment it belongs to; anything malformed means "no orientation", never an error.
#include <cstring>

#include "image/decode_internal.h"

namespace osprey::image_internal {

namespace {

uint16_t Read16(const uint8_t* p, bool little_endian) {
  return little_endian ? static_cast<uint16_t>(p[0] | (p[1] << 8)) : static_cast<uint16_t>((p[0] << 8) | p[1]);
}

uint32_t Read32(const uint8_t* p, bool little_endian) {
  return little_endian ? (uint32_t{p[0]} | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) | (uint32_t{p[3]} << 24))
                       : ((uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]});
}

}  // namespace

int ParseExifOrientation(const uint8_t* tiff, size_t size) {
  if (size < 8) return 1;
  bool little_endian;
  if (tiff[0] == 'I' && tiff[1] == 'I')
    little_endian = true;
  else if (tiff[0] == 'M' && tiff[1] == 'M')
    little_endian = false;
  else
    return 1;
  if (Read16(tiff + 2, little_endian) != 42) return 1;
  const size_t ifd = Read32(tiff + 4, little_endian);
  if (ifd > size || size - ifd < 2) return 1;
  const size_t count = Read16(tiff + ifd, little_endian);
  for (size_t i = 0; i < count; ++i) {
    const size_t entry = ifd + 2 + 12 * i;
    if (entry > size || size - entry < 12) return 1;
    if (Read16(tiff + entry, little_endian) != 0x0112) continue;
    const uint16_t type = Read16(tiff + entry + 2, little_endian);
    const uint32_t values = Read32(tiff + entry + 4, little_endian);
    if (values < 1) return 1;
    uint32_t value = 0;
    if (type == 3)  // SHORT: the value sits in the first two bytes of the value field
      value = Read16(tiff + entry + 8, little_endian);
    else if (type == 4)  // LONG
      value = Read32(tiff + entry + 8, little_endian);
    else
      return 1;
    return value >= 1 && value <= 8 ? static_cast<int>(value) : 1;
  }
  return 1;
}

JpegMarkers ScanJpegMarkers(const uint8_t* data, size_t size) {
  JpegMarkers markers;
  bool found_exif = false;
  size_t pos = 2;  // after SOI
  while (true) {
    if (pos + 4 > size) {
      markers.ran_out = true;
      break;
    }
    if (data[pos] != 0xFF) break;
    uint8_t marker = data[pos + 1];
    if (marker == 0xFF) {  // fill byte
      ++pos;
      continue;
    }
    if (marker == 0x01 || (marker >= 0xD0 && marker <= 0xD8)) {  // no length field
      pos += 2;
      continue;
    }
    if (marker == 0xDA || marker == 0xD9) break;  // start of scan / end of image: no more metadata
    const size_t length = (size_t{data[pos + 2]} << 8) | data[pos + 3];
    if (length < 2) break;
    if (length > size - pos - 2) {
      markers.ran_out = true;
      break;
    }
    const uint8_t* segment = data + pos + 4;
    const size_t segment_size = length - 2;
    if (marker == 0xE1 && !found_exif && segment_size >= 6 && std::memcmp(segment, "Exif\0\0", 6) == 0) {
      found_exif = true;
      markers.exif_orientation = ParseExifOrientation(segment + 6, segment_size - 6);
    }
    pos += 2 + length;
  }
  return markers;
}

}  // namespace osprey::image_internal
