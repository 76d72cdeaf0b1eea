// DecodeOptions::region_*: a window of a JPEG decoded through libjpeg's row skipping and column cropping must equal
// the full decode cropped, byte for byte, for every chroma subsampling, baseline and progressive, gray and RGB, at
// windows on and off the iMCU grid; other formats crop after decoding; bad windows and damaged files are refused.
#include <gtest/gtest.h>
#include <turbojpeg.h>

#include <string>
#include <vector>

#include "osprey/error.h"
#include "osprey/image.h"

namespace osprey {
namespace {

// A photo-like test image: gradients plus pseudo-random texture, so every block has detail.
std::vector<uint8_t> Pattern(int w, int h, int c) {
  std::vector<uint8_t> px(static_cast<size_t>(w) * h * c);
  uint32_t s = 12345;
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int ch = 0; ch < c; ++ch) {
        s = s * 1664525u + 1013904223u;
        px[(static_cast<size_t>(y) * w + x) * c + ch] =
            static_cast<uint8_t>((x * (3 + ch) + y * (5 - ch) + (s >> 27)) & 255);
      }
  return px;
}

std::string Jpeg(int w, int h, int subsampling, bool progressive) {
  const int c = subsampling == TJSAMP_GRAY ? 1 : 3;
  std::vector<uint8_t> px = Pattern(w, h, c);
  tjhandle t = tjInitCompress();
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  const int rc = tjCompress2(t, px.data(), w, w * c, h, c == 1 ? TJPF_GRAY : TJPF_RGB, &buf, &size, subsampling, 90,
                             progressive ? TJFLAG_PROGRESSIVE : 0);
  EXPECT_EQ(rc, 0) << tjGetErrorStr2(t);
  std::string out(reinterpret_cast<char*>(buf), size);
  tjFree(buf);
  tjDestroy(t);
  return out;
}

Tensor Crop(const Tensor& img, int64_t x, int64_t y, int64_t w, int64_t h) {
  const int64_t c = img.dim(2), W = img.dim(1);
  Tensor out(DType::kU8, {h, w, c});
  for (int64_t r = 0; r < h; ++r)
    for (int64_t i = 0; i < w * c; ++i)
      out.data<uint8_t>()[r * w * c + i] = img.data<uint8_t>()[((y + r) * W + x) * c + i];
  return out;
}

bool Same(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::equal(a.data<uint8_t>(), a.data<uint8_t>() + a.numel(), b.data<uint8_t>());
}

TEST(DecodeWindow, EqualsTheFullDecodeCropped) {
  const int subsamplings[] = {TJSAMP_444, TJSAMP_422, TJSAMP_420, TJSAMP_440, TJSAMP_411, TJSAMP_GRAY};
  const int64_t W = 203, H = 157;
  // x, y, w, h: the whole image, corners, single pixels, odd offsets off the 8/16-pixel grid, full rows and columns.
  const std::vector<std::array<int64_t, 4>> windows = {{0, 0, W, H},       {0, 0, 1, 1},    {W - 1, H - 1, 1, 1},
                                                       {17, 9, 100, 61},   {33, 0, 7, H},   {0, 77, W, 3},
                                                       {150, 100, 53, 57}, {8, 16, 16, 16}, {1, 1, W - 2, H - 2}};
  for (int sub : subsamplings)
    for (bool progressive : {false, true}) {
      const std::string jpeg = Jpeg(static_cast<int>(W), static_cast<int>(H), sub, progressive);
      for (int channels : {3, 1}) {
        DecodeOptions full;
        full.channels = channels;
        const Tensor whole = DecodeImage(jpeg.data(), jpeg.size(), full);
        for (const auto& [x, y, w, h] : windows) {
          SCOPED_TRACE("subsampling " + std::to_string(sub) + (progressive ? " progressive" : " baseline") +
                       " channels " + std::to_string(channels) + " window " + std::to_string(w) + "x" +
                       std::to_string(h) + "+" + std::to_string(x) + "+" + std::to_string(y));
          DecodeOptions o = full;
          o.region_x = x, o.region_y = y, o.region_width = w, o.region_height = h;
          EXPECT_TRUE(Same(DecodeImage(jpeg.data(), jpeg.size(), o), Crop(whole, x, y, w, h)));
          // Allowed to widen: whole decoded columns around the window come back; the window inside them is exact.
          o.region_may_widen = true;
          DecodeInfo info;
          const Tensor wide = DecodeImage(jpeg.data(), jpeg.size(), o, &info);
          EXPECT_EQ(info.region_y, y);
          EXPECT_EQ(wide.dim(0), h);
          ASSERT_TRUE(info.region_x <= x && info.region_x + wide.dim(1) >= x + w && info.region_x + wide.dim(1) <= W);
          EXPECT_TRUE(Same(Crop(wide, x - info.region_x, 0, w, h), Crop(whole, x, y, w, h)));
        }
      }
    }
}

TEST(DecodeWindow, PeekSizeAndOtherFormats) {
  const std::string jpeg = Jpeg(64, 40, TJSAMP_420, false);
  int64_t w = 0, h = 0;
  ASSERT_TRUE(PeekImageSize(jpeg.data(), jpeg.size(), {}, &w, &h));
  EXPECT_EQ(w, 64);
  EXPECT_EQ(h, 40);
  const std::string junk = "not an image";
  EXPECT_FALSE(PeekImageSize(junk.data(), junk.size(), {}, &w, &h));
}

Error ErrorOf(const std::string& bytes, const DecodeOptions& o) {
  try {
    DecodeImage(bytes.data(), bytes.size(), o);
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "no error";
  return Error(ErrorCode::kInternal, "none");
}

TEST(DecodeWindow, RefusesBadWindowsAndDamagedFiles) {
  const std::string jpeg = Jpeg(64, 40, TJSAMP_420, false);
  DecodeOptions o;
  o.region_x = 60, o.region_y = 0, o.region_width = 5, o.region_height = 5;  // one column past the right edge
  Error e = ErrorOf(jpeg, o);
  EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(std::string(e.what()).find("not inside the 64x40 image"), std::string::npos) << e.what();
  o.region_x = 0, o.region_width = 0;  // empty
  EXPECT_EQ(ErrorOf(jpeg, o).code(), ErrorCode::kInvalidArgument);
  o.region_width = 8, o.min_width = 16;  // with DCT scaling
  EXPECT_EQ(ErrorOf(jpeg, o).code(), ErrorCode::kInvalidArgument);
  // Truncated: refused even when the window lies in the intact top rows, as the full decode refuses it.
  const std::string cut = jpeg.substr(0, jpeg.size() * 2 / 3);
  DecodeOptions top;
  top.region_x = 0, top.region_y = 0, top.region_width = 64, top.region_height = 4;
  e = ErrorOf(cut, top);
  EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(std::string(e.what()).find("truncated JPEG"), std::string::npos) << e.what();
  EXPECT_EQ(ErrorOf(cut, {}).code(), ErrorCode::kInvalidArgument);
  // Garbage in the entropy-coded data: no crash, and the same answer as the full decode (a window that libjpeg cannot
  // decode falls back to the full decode).
  std::string bad = jpeg;
  for (size_t i = bad.size() / 2; i < bad.size() / 2 + 40; ++i) bad[i] = static_cast<char>(0xff);
  bool full_ok = true, window_ok = true;
  try {
    DecodeImage(bad.data(), bad.size(), {});
  } catch (const Error&) {
    full_ok = false;
  }
  try {
    DecodeImage(bad.data(), bad.size(), top);
  } catch (const Error&) {
    window_ok = false;
  }
  EXPECT_EQ(full_ok, window_ok);
}

TEST(DecodeWindow, OtherFormatsAreCroppedAfterDecoding) {
  // A BMP (uncompressed, written here): the window equals the crop.
  const int W = 9, H = 5;
  std::vector<uint8_t> px = Pattern(W, H, 3);
  const int row = (W * 3 + 3) & ~3, data_size = row * H;
  std::string bmp(54 + data_size, '\0');
  auto put32 = [&](size_t at, uint32_t v) {
    for (int i = 0; i < 4; ++i) bmp[at + i] = static_cast<char>(v >> (8 * i));
  };
  bmp[0] = 'B', bmp[1] = 'M';
  put32(2, 54 + data_size), put32(10, 54), put32(14, 40), put32(18, W), put32(22, H);
  bmp[26] = 1, bmp[28] = 24;
  put32(34, data_size);
  for (int y = 0; y < H; ++y)
    for (int x = 0; x < W; ++x)
      for (int ch = 0; ch < 3; ++ch)  // bottom-up rows, BGR
        bmp[54 + (H - 1 - y) * row + x * 3 + (2 - ch)] = static_cast<char>(px[(y * W + x) * 3 + ch]);
  const Tensor whole = DecodeImage(bmp.data(), bmp.size(), {});
  DecodeOptions o;
  o.region_x = 2, o.region_y = 1, o.region_width = 5, o.region_height = 3;
  EXPECT_TRUE(Same(DecodeImage(bmp.data(), bmp.size(), o), Crop(whole, 2, 1, 5, 3)));
  int64_t w = 0, h = 0;
  EXPECT_FALSE(PeekImageSize(bmp.data(), bmp.size(), {}, &w, &h));  // JPEG only
}

}  // namespace
}  // namespace osprey
