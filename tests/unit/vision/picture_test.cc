// Decoding PNG, JPEG and WebP to RGB as Pillow's convert("RGB") does, and refusing hostile
// files with a Status that names the fault.
#include "vision/picture.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>

#include "picture_encoders.h"

namespace gizllm::vision {
namespace {

using testing::Bytes;

Picture Decode(const Bytes& bytes, const PictureLimits& limits = {}) {
  Expected<Picture> p = DecodePicture(bytes, limits);
  EXPECT_TRUE(p.ok()) << p.status().message();
  return p.ok() ? std::move(p).value() : Picture{};
}

std::string DecodeError(const Bytes& bytes, const PictureLimits& limits = {}) {
  Expected<Picture> p = DecodePicture(bytes, limits);
  EXPECT_FALSE(p.ok());
  return p.ok() ? "" : p.status().message();
}

// Gray samples repeated in R, G and B.
Bytes GrayToRgb(const Bytes& gray) {
  Bytes rgb;
  for (uint8_t v : gray) rgb.insert(rgb.end(), {v, v, v});
  return rgb;
}

int MaxDifference(const Bytes& a, const Bytes& b) {
  EXPECT_EQ(a.size(), b.size());
  int d = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d;
}

TEST(Picture, SniffsTheTypeFromTheMagicBytes) {
  const Bytes rgb = testing::Pattern(5, 3, 3);
  EXPECT_EQ(SniffPictureType(testing::EncodePng(5, 3, rgb, {})), PictureType::kPng);
  EXPECT_EQ(SniffPictureType(testing::EncodeJpeg(5, 3, rgb, {})), PictureType::kJpeg);
  EXPECT_EQ(SniffPictureType(testing::EncodeWebpLossless(5, 3, rgb)), PictureType::kWebp);
  const Bytes gif = {'G', 'I', 'F', '8', '9', 'a', 1, 0, 1, 0};
  EXPECT_EQ(SniffPictureType(gif), std::nullopt);
  EXPECT_EQ(DecodeError(gif), "not a PNG, JPEG or WebP picture (it starts with bytes 47 49 46 38)");
  EXPECT_EQ(DecodeError({}), "picture is empty (0 bytes)");
  EXPECT_EQ(SniffPictureType(Bytes{0xff, 0xd8}), std::nullopt);
}

TEST(Picture, PngRgbIsExact) {
  for (bool interlaced : {false, true}) {
    const Bytes rgb = testing::Pattern(37, 23, 3);
    const Picture p = Decode(testing::EncodePng(37, 23, rgb, {.interlaced = interlaced}));
    EXPECT_EQ(p.width, 37);
    EXPECT_EQ(p.height, 23);
    EXPECT_EQ(p.rgb, rgb) << "interlaced " << interlaced;
  }
}

TEST(Picture, PngAlphaIsDroppedNotComposited) {
  Bytes rgba = testing::Pattern(19, 11, 4);
  for (size_t i = 3; i < rgba.size(); i += 16) rgba[i] = 0;  // some fully transparent pixels
  Bytes rgb;
  for (size_t i = 0; i < rgba.size(); i += 4)
    rgb.insert(rgb.end(), {rgba[i], rgba[i + 1], rgba[i + 2]});
  const Picture p =
      Decode(testing::EncodePng(19, 11, rgba, {.color_type = PNG_COLOR_TYPE_RGB_ALPHA}));
  EXPECT_EQ(p.rgb, rgb);
}

TEST(Picture, PngGrayIsRepeatedAndLowBitDepthsScaled) {
  const Bytes gray = testing::Pattern(13, 7, 1);
  EXPECT_EQ(Decode(testing::EncodePng(13, 7, gray, {.color_type = PNG_COLOR_TYPE_GRAY})).rgb,
            GrayToRgb(gray));

  Bytes gray_alpha = testing::Pattern(13, 7, 2);
  Bytes gray_only;
  for (size_t i = 0; i < gray_alpha.size(); i += 2) gray_only.push_back(gray_alpha[i]);
  EXPECT_EQ(
      Decode(testing::EncodePng(13, 7, gray_alpha, {.color_type = PNG_COLOR_TYPE_GRAY_ALPHA})).rgb,
      GrayToRgb(gray_only));

  // 2-bit gray, 4 pixels a byte from the high bits: 0, 1, 2, 3 read as 0, 85, 170, 255.
  const Bytes packed = {0b00011011, 0b11100100};  // one row of 8 pixels
  const Picture p =
      Decode(testing::EncodePng(8, 1, packed, {.color_type = PNG_COLOR_TYPE_GRAY, .bit_depth = 2}));
  EXPECT_EQ(p.rgb, GrayToRgb({0, 85, 170, 255, 255, 170, 85, 0}));
}

TEST(Picture, PngPaletteIsLookedUpAndItsTransparencyIgnored) {
  const std::vector<png_color> palette = {{10, 20, 30}, {200, 100, 50}, {0, 255, 7}};
  const Bytes indices = {0, 1, 2, 2, 1, 0};  // 3 x 2
  const Picture p = Decode(testing::EncodePng(
      3, 2, indices,
      {.color_type = PNG_COLOR_TYPE_PALETTE, .palette = palette, .transparency = {0, 128}}));
  EXPECT_EQ(p.rgb,
            (Bytes{10, 20, 30, 200, 100, 50, 0, 255, 7, 0, 255, 7, 200, 100, 50, 10, 20, 30}));
}

TEST(Picture, Png16BitKeepsTheHighByteAndGrayIsClipped) {
  // RGB: big-endian samples, the high byte kept.
  const Bytes rgb16 = testing::Pattern(6, 4, 6);
  Bytes high;
  for (size_t i = 0; i < rgb16.size(); i += 2) high.push_back(rgb16[i]);
  EXPECT_EQ(Decode(testing::EncodePng(6, 4, rgb16, {.bit_depth = 16})).rgb, high);
  // Gray: Pillow's I;16 to RGB clips to 255.
  const Bytes gray16 = {0x00, 0x07, 0x00, 0xff, 0x01, 0x00, 0xff, 0xff};  // 7, 255, 256, 65535
  EXPECT_EQ(
      Decode(testing::EncodePng(4, 1, gray16, {.color_type = PNG_COLOR_TYPE_GRAY, .bit_depth = 16}))
          .rgb,
      GrayToRgb({7, 255, 255, 255}));
}

TEST(Picture, JpegFlatColorsComeBackClose) {
  // A flat picture at quality 100 holds only DC terms: a round trip within the color
  // conversion's rounding.
  Bytes rgb;
  for (int i = 0; i < 16 * 16; ++i) rgb.insert(rgb.end(), {200, 60, 20});
  const Picture p = Decode(testing::EncodeJpeg(16, 16, rgb, {.quality = 100, .full_chroma = true}));
  EXPECT_LE(MaxDifference(p.rgb, rgb), 2);
  // Gray JPEG: R = G = B.
  const Bytes gray = testing::Pattern(24, 9, 1);
  const Picture g = Decode(testing::EncodeJpeg(24, 9, gray, {.color_space = JCS_GRAYSCALE}));
  ASSERT_EQ(g.rgb.size(), size_t(24 * 9 * 3));
  for (size_t i = 0; i < g.rgb.size(); i += 3) {
    ASSERT_EQ(g.rgb[i], g.rgb[i + 1]);
    ASSERT_EQ(g.rgb[i], g.rgb[i + 2]);
  }
  // Textured: decodes to the size given, near the original (JPEG loses detail).
  const Bytes pattern = testing::Pattern(33, 17, 3);
  const Picture t = Decode(testing::EncodeJpeg(33, 17, pattern, {.quality = 95}));
  EXPECT_EQ(t.width, 33);
  EXPECT_EQ(t.height, 17);
  const Picture progressive =
      Decode(testing::EncodeJpeg(33, 17, pattern, {.quality = 95, .progressive = true}));
  EXPECT_EQ(progressive.rgb, t.rgb);
}

TEST(Picture, JpegCmykConvertsAsPillowDoes) {
  // libjpeg writes CMYK with Adobe's marker, stored inverted; Pillow reads it as "CMYK;I" and
  // converts (255 - k) - c * (255 - k) / 255 of the inverted samples, i.e. with stored s, k:
  // k - (255 - s) * k / 255, rounded.
  Bytes cmyk;
  for (int i = 0; i < 16 * 16; ++i) cmyk.insert(cmyk.end(), {255, 128, 0, 200});
  const Picture p = Decode(testing::EncodeJpeg(
      16, 16, cmyk, {.quality = 100, .color_space = JCS_CMYK, .full_chroma = true}));
  auto expected = [](int s, int k) {
    const int t = (255 - s) * k + 128;
    return k - (((t >> 8) + t) >> 8);
  };
  ASSERT_EQ(p.rgb.size(), size_t(16 * 16 * 3));
  EXPECT_NEAR(p.rgb[0], expected(255, 200), 1);
  EXPECT_NEAR(p.rgb[1], expected(128, 200), 1);
  EXPECT_NEAR(p.rgb[2], expected(0, 200), 1);
}

TEST(Picture, WebpLosslessIsExactAndAlphaDropped) {
  const Bytes rgb = testing::Pattern(29, 31, 3);
  EXPECT_EQ(Decode(testing::EncodeWebpLossless(29, 31, rgb)).rgb, rgb);
  Bytes rgba = testing::Pattern(29, 31, 4);
  Bytes expected;
  for (size_t i = 0; i < rgba.size(); i += 4) {
    rgba[i + 3] = std::max<uint8_t>(rgba[i + 3], 1);  // the encoder may change fully clear colors
    expected.insert(expected.end(), {rgba[i], rgba[i + 1], rgba[i + 2]});
  }
  EXPECT_EQ(Decode(testing::EncodeWebpLosslessRgba(29, 31, rgba)).rgb, expected);
  Bytes flat;
  for (int i = 0; i < 32 * 16; ++i) flat.insert(flat.end(), {40, 90, 200});
  const Picture lossy = Decode(testing::EncodeWebpLossy(32, 16, flat, 95));
  EXPECT_EQ(lossy.width, 32);
  EXPECT_LE(MaxDifference(lossy.rgb, flat), 8);
}

// The start of a JPEG's baseline frame header (FF C0).
Bytes::iterator FindSof(Bytes& jpeg) {
  const uint8_t sof[2] = {0xff, 0xc0};
  const auto at = std::search(jpeg.begin(), jpeg.end(), sof, sof + 2);
  EXPECT_NE(at, jpeg.end());
  return at;
}

// Every prefix of a file is refused with an error, never a crash, but for those that lack
// only the last `tail` bytes (a PNG's last CRC and IEND, which Pillow does not need either);
// a cut inside the pixels says "truncated".
void ExpectPrefixesRefused(const Bytes& file, const std::string& truncated, size_t tail = 0) {
  for (size_t n = 0; n + tail < file.size(); ++n) {
    const Bytes prefix(file.begin(), file.begin() + n);
    Expected<Picture> p = DecodePicture(prefix);
    ASSERT_FALSE(p.ok()) << "prefix of " << n << " of " << file.size() << " bytes decoded";
    ASSERT_FALSE(p.status().message().empty());
  }
  const Bytes half(file.begin(), file.begin() + file.size() * 2 / 3);
  EXPECT_EQ(DecodeError(half), truncated);
}

TEST(PictureHostile, TruncatedFilesAreRefused) {
  const Bytes rgb = testing::Pattern(40, 30, 3);
  ExpectPrefixesRefused(testing::EncodePng(40, 30, rgb, {}), "PNG truncated", 16);
  ExpectPrefixesRefused(testing::EncodePng(40, 30, rgb, {.interlaced = true}), "PNG truncated", 16);
  ExpectPrefixesRefused(testing::EncodeJpeg(40, 30, rgb, {}), "JPEG truncated");
  ExpectPrefixesRefused(testing::EncodeJpeg(40, 30, rgb, {.progressive = true}), "JPEG truncated");
  ExpectPrefixesRefused(testing::EncodeWebpLossless(40, 30, rgb), "WebP truncated");
  ExpectPrefixesRefused(testing::EncodeWebpLossy(40, 30, rgb, 80), "WebP truncated");
}

TEST(PictureHostile, CorruptHeadersAreRefused) {
  Bytes png = testing::EncodePng(8, 8, testing::Pattern(8, 8, 3), {});
  png[20] ^= 0x40;  // IHDR's data: its CRC no longer matches
  EXPECT_EQ(DecodeError(png).rfind("PNG corrupt: ", 0), 0u) << DecodeError(png);
  Bytes jpeg = testing::EncodeJpeg(8, 8, testing::Pattern(8, 8, 3), {});
  FindSof(jpeg)[4] = 7;  // the frame's sample precision
  EXPECT_EQ(DecodeError(jpeg).rfind("JPEG corrupt: ", 0), 0u) << DecodeError(jpeg);
  Bytes webp = testing::EncodeWebpLossless(8, 8, testing::Pattern(8, 8, 3));
  for (size_t i = 20; i < webp.size(); ++i) webp[i] = uint8_t(i * 37);
  EXPECT_FALSE(DecodePicture(webp).ok());
  // The right magic, then nothing of the format.
  EXPECT_EQ(DecodeError({0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n', 'x', 'y'}).rfind("PNG ", 0),
            0u);
  EXPECT_FALSE(DecodePicture(Bytes{'R', 'I', 'F', 'F', 4, 0, 0, 0, 'W', 'E', 'B', 'P'}).ok());
}

TEST(PictureHostile, HugeDeclaredSizesAreRefusedBeforeAllocating) {
  // A PNG of 40000 x 40000 whose data is a few bytes.
  const Bytes png = testing::HandMadePng(40000, 40000, testing::Deflate(Bytes(100, 0)));
  EXPECT_EQ(DecodeError(png), "PNG: picture is 40000x40000, over the limit of 67108864 pixels");
  // libpng's own width limit (a million) does not speak first.
  EXPECT_EQ(DecodeError(testing::HandMadePng(3000000, 30, {})),
            "PNG: picture is 3000000x30, over the limit of 67108864 pixels");
  // JPEG: the frame header's height and width set to 60000.
  Bytes jpeg = testing::EncodeJpeg(16, 16, testing::Pattern(16, 16, 3), {});
  const auto sof = FindSof(jpeg);
  sof[5] = sof[7] = 0xea;
  sof[6] = sof[8] = 0x60;
  EXPECT_EQ(DecodeError(jpeg), "JPEG: picture is 60000x60000, over the limit of 67108864 pixels");
  // Lossless WebP: 14 bits each of width - 1 and height - 1 after the 0x2f signature.
  Bytes webp = testing::EncodeWebpLossless(16, 16, testing::Pattern(16, 16, 3));
  ASSERT_EQ(std::string(webp.begin() + 12, webp.begin() + 16), "VP8L");
  const uint32_t bits = 16383u | (16383u << 14) | (uint32_t(webp[24]) & 0xf0u) << 24;
  for (int i = 0; i < 4; ++i) webp[21 + i] = uint8_t(bits >> (8 * i));
  EXPECT_EQ(DecodeError(webp), "WebP: picture is 16384x16384, over the limit of 67108864 pixels");
}

TEST(PictureHostile, DecompressionBombsAreRefused) {
  // 4000 x 4000 of zeros is 48 MB decoded from 47 KB: over a limit of 4 megapixels.
  const int side = 4000;
  const Bytes zeros(size_t(side) * (side * 3 + 1), 0);
  const Bytes bomb = testing::HandMadePng(side, side, testing::Deflate(zeros));
  ASSERT_LT(bomb.size(), 100000u);
  PictureLimits limits;
  limits.max_pixels = 4000000;
  EXPECT_EQ(DecodeError(bomb, limits),
            "PNG: picture is 4000x4000, over the limit of 4000000 pixels");
  limits.max_pixels = 16000000;
  limits.max_decoded_bytes = 64 << 20;
  EXPECT_EQ(DecodeError(bomb, limits),
            "PNG: picture is 4000x4000 and needs 112000000 bytes to decode, over the limit of "
            "67108864");
  // A text chunk that inflates to 64 MB is not inflated.
  Bytes ztxt = {'C', 'o', 'm', 'm', 'e', 'n', 't', 0, 0};
  const Bytes text = testing::Deflate(Bytes(64 << 20, 'a'));
  ztxt.insert(ztxt.end(), text.begin(), text.end());
  const Bytes row = Bytes(3 * 2 + 1, 0);
  const Bytes small = testing::HandMadePng(2, 1, testing::Deflate(row), {{"zTXt", ztxt}});
  const Picture p = Decode(small);
  EXPECT_EQ(p.rgb, Bytes(6, 0));
}

TEST(PictureHostile, AnimatedWebpIsRefused) {
  // RIFF, WEBP, then a VP8X header whose flags say "animation", of 16 x 16.
  Bytes webp = {'R', 'I', 'F', 'F', 22, 0,    0, 0, 'W', 'E', 'B', 'P', 'V', 'P', '8',
                'X', 10,  0,   0,   0,  0x02, 0, 0, 0,   15,  0,   0,   15,  0,   0};
  EXPECT_EQ(DecodeError(webp), "animated WebP is not supported (give its frames as pictures)");
}

TEST(PictureHostile, ProgressiveScansAreBounded) {
  const Bytes rgb = testing::Pattern(16, 16, 3);
  const Bytes jpeg = testing::EncodeJpeg(16, 16, rgb, {.progressive = true});
  PictureLimits limits;
  limits.max_jpeg_scans = 2;
  EXPECT_EQ(DecodeError(jpeg, limits), "JPEG has more than 2 progressive scans");
  EXPECT_TRUE(DecodePicture(jpeg).ok());
}

TEST(PictureHostile, LimitsAreChecked) {
  PictureLimits limits;
  limits.max_pixels = 0;
  EXPECT_EQ(DecodeError(testing::EncodePng(2, 2, testing::Pattern(2, 2, 3), {}), limits),
            "picture limits: max_pixels must be in 1..1099511627776");
}

}  // namespace
}  // namespace gizllm::vision
