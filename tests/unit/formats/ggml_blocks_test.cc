// ggml's block types against llama.cpp's gguf-py (tests/golden/ggml_blocks.bin, written by
// tools/make_ggml_block_refs.py from random blocks), bit for bit; Q1_0 and Q2_0, which gguf-py
// does not dequantize, against values worked out by hand from their layout; and the sizes refused.
#include "formats/ggml_blocks.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace gizllm {
namespace {

struct Reference {
  GgmlType type;
  uint32_t blocks = 0, block_bytes = 0, block_elements = 0;
  std::vector<uint8_t> bytes;
  std::vector<float> values;
};

uint32_t U32(const std::string& s, size_t at) {
  uint32_t v;
  std::memcpy(&v, s.data() + at, 4);
  return v;
}

std::vector<Reference> ReadReferences(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<Reference> out;
  if (s.size() < 12 || s.compare(0, 8, "GGMLREF1") != 0) {
    ADD_FAILURE() << path << " is missing or not a reference file";
    return out;
  }
  const uint32_t records = U32(s, 8);
  size_t at = 12;
  for (uint32_t r = 0; r < records; ++r) {
    Reference ref;
    if (at + 16 > s.size()) break;
    ref.type = static_cast<GgmlType>(U32(s, at));
    ref.blocks = U32(s, at + 4);
    ref.block_bytes = U32(s, at + 8);
    ref.block_elements = U32(s, at + 12);
    at += 16;
    const size_t bytes = size_t{ref.blocks} * ref.block_bytes;
    const size_t values = size_t{ref.blocks} * ref.block_elements;
    if (at + bytes + 4 * values > s.size()) break;
    ref.bytes.assign(s.begin() + at, s.begin() + at + bytes);
    at += bytes;
    ref.values.resize(values);
    std::memcpy(ref.values.data(), s.data() + at, 4 * values);
    at += 4 * values;
    out.push_back(std::move(ref));
  }
  EXPECT_EQ(out.size(), records) << path << " ends early";
  return out;
}

TEST(GgmlBlocksTest, EqualsGgufPyBitForBit) {
  const std::vector<Reference> refs = ReadReferences("tests/golden/ggml_blocks.bin");
  std::set<GgmlType> seen;
  for (const Reference& ref : refs) {
    SCOPED_TRACE(GgmlTypeName(ref.type));
    seen.insert(ref.type);
    GgmlBlock block;
    ASSERT_TRUE(GgmlBlockOf(ref.type, &block));
    EXPECT_EQ(block.bytes, ref.block_bytes);
    EXPECT_EQ(block.elements, ref.block_elements);
    std::vector<float> got(ref.values.size(), std::nanf(""));
    ASSERT_TRUE(DequantizeBlocks(ref.type, ref.bytes.data(), ref.bytes.size(),
                                 static_cast<int64_t>(got.size()), got.data(), "t")
                    .ok());
    size_t differ = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      if (std::memcmp(&got[i], &ref.values[i], 4) != 0 && differ++ < 5) {
        ADD_FAILURE() << "element " << i << ": " << got[i] << " != " << ref.values[i];
      }
    }
    EXPECT_EQ(differ, 0u) << "of " << got.size();
  }
  const std::set<GgmlType> want = {
      GgmlType::kQ4_0,  GgmlType::kQ4_1,  GgmlType::kQ5_0,   GgmlType::kQ5_1,  GgmlType::kQ8_0,
      GgmlType::kQ2_K,  GgmlType::kQ3_K,  GgmlType::kQ4_K,   GgmlType::kQ5_K,  GgmlType::kQ6_K,
      GgmlType::kTQ1_0, GgmlType::kTQ2_0, GgmlType::kIQ4_NL, GgmlType::kIQ4_XS};
  EXPECT_EQ(seen, want);
}

std::string Half(float d) {
  const uint16_t h = F32ToF16(d);
  return std::string{static_cast<char>(h & 0xff), static_cast<char>(h >> 8)};
}

// Q1_0: 128 signs, bit j of byte j / 8: set is +d, clear -d.
TEST(GgmlBlocksTest, Q1_0ByHand) {
  const float d = 0.375f;  // exact in f16
  std::string block = Half(d);
  const uint8_t qs[16] = {0x01, 0x80, 0xFF, 0x00, 0x5A, 0xA5, 0x0F, 0xF0,
                          0x33, 0xCC, 0x01, 0x02, 0x04, 0x08, 0x10, 0x20};
  block.append(reinterpret_cast<const char*>(qs), 16);
  std::vector<float> got(128, std::nanf(""));
  ASSERT_TRUE(DequantizeBlocks(GgmlType::kQ1_0, reinterpret_cast<const uint8_t*>(block.data()),
                               block.size(), 128, got.data(), "t")
                  .ok());
  // Byte 0 = 0x01: element 0 is +d, 1..7 are -d; byte 1 = 0x80: element 15 alone is +d.
  EXPECT_EQ(got[0], d);
  for (int j = 1; j < 15; ++j) EXPECT_EQ(got[j], -d) << j;
  EXPECT_EQ(got[15], d);
  for (int j = 16; j < 24; ++j) EXPECT_EQ(got[j], d) << j;   // 0xFF
  for (int j = 24; j < 32; ++j) EXPECT_EQ(got[j], -d) << j;  // 0x00
  // 0x5A = 0101 1010: elements 33, 35, 36, 38 set.
  const float want_5a[8] = {-d, d, -d, d, d, -d, d, -d};
  for (int j = 0; j < 8; ++j) EXPECT_EQ(got[32 + j], want_5a[j]) << j;
  EXPECT_EQ(got[127], -d);  // 0x20: bit 7 clear
  EXPECT_EQ(got[125], d);   // 0x20: bit 5 set
}

// Q2_0: 64 codes of 2 bits, bits 2 (j % 4) of byte j / 4: 0, 1, 2, 3 are -d, 0, d, 2d.
TEST(GgmlBlocksTest, Q2_0ByHand) {
  const float d = -1.5f;
  std::string block = Half(d);
  // 0xE4 = 11 10 01 00: codes 0, 1, 2, 3 for elements 0..3; 0x1B the reverse.
  for (int i = 0; i < 16; ++i) block.push_back(static_cast<char>(i % 2 == 0 ? 0xE4 : 0x1B));
  std::vector<float> got(64, std::nanf(""));
  ASSERT_TRUE(DequantizeBlocks(GgmlType::kQ2_0, reinterpret_cast<const uint8_t*>(block.data()),
                               block.size(), 64, got.data(), "t")
                  .ok());
  const float up[4] = {1.5f, 0.0f, -1.5f, -3.0f};  // -d, 0, d, 2d with d = -1.5
  for (int j = 0; j < 64; ++j) {
    const int code = (j / 4) % 2 == 0 ? j % 4 : 3 - j % 4;
    EXPECT_EQ(got[j], up[code]) << j;
  }
}

// Q1_0 and Q2_0 with several blocks: each block reads its own scale.
// gizllm's own blocks, by hand: group g's value is (d * 2^((s[g] - 255) / 32)) * code (GZ8) or
// times kGz4Levels[nibble] (GZ4, group g's element i < 16 in the low nibble of byte 16 g + i,
// i >= 16 in the high nibble of byte 16 g + i - 16); s[g] = 0 is a group of zeros.
TEST(GgmlBlocksTest, OwnBlocksByHand) {
  GgmlBlock block;
  ASSERT_TRUE(GgmlBlockOf(GgmlType::kGZ8, &block));
  EXPECT_EQ(block.elements, 128);
  EXPECT_EQ(block.bytes, 134);
  ASSERT_TRUE(GgmlBlockOf(GgmlType::kGZ4, &block));
  EXPECT_EQ(block.elements, 128);
  EXPECT_EQ(block.bytes, 70);
  const uint16_t d = F32ToF16(0.25f);
  const uint8_t s[4] = {223, 191, 0, 255};  // factors 1/2, 1/4, 0, 1
  const float factor[4] = {0.5f, 0.25f, 0.0f, 1.0f};
  {
    std::vector<uint8_t> b(134);
    b[0] = d & 0xFF, b[1] = d >> 8;
    std::memcpy(&b[2], s, 4);
    for (int e = 0; e < 128; ++e) b[6 + e] = static_cast<uint8_t>(static_cast<int8_t>(e - 64));
    std::vector<float> y(128);
    ASSERT_TRUE(DequantizeBlocks(GgmlType::kGZ8, b.data(), b.size(), 128, y.data(), "t").ok());
    for (int e = 0; e < 128; ++e) {
      EXPECT_EQ(y[e], 0.25f * factor[e / 32] * static_cast<float>(e - 64)) << e;
    }
  }
  {
    std::vector<uint8_t> b(70);
    b[0] = d & 0xFF, b[1] = d >> 8;
    std::memcpy(&b[2], s, 4);
    for (int i = 0; i < 64; ++i) b[6 + i] = static_cast<uint8_t>((i % 16) | ((15 - i % 16) << 4));
    std::vector<float> y(128);
    ASSERT_TRUE(DequantizeBlocks(GgmlType::kGZ4, b.data(), b.size(), 128, y.data(), "t").ok());
    for (int e = 0; e < 128; ++e) {
      const int i = e % 32;
      const int code = i < 16 ? i : 15 - (i - 16);
      EXPECT_EQ(y[e], 0.25f * factor[e / 32] * static_cast<float>(kGz4Levels[code])) << e;
    }
  }
  // Levels: symmetric, increasing, a Gaussian's Lloyd-Max levels times 127 / 2.733.
  const double lloyd_max[8] = {0.1284, 0.3881, 0.6568, 0.9424, 1.256, 1.618, 2.069, 2.733};
  for (int j = 0; j < 8; ++j) {
    EXPECT_EQ(kGz4Levels[8 + j], -kGz4Levels[7 - j]);
    EXPECT_EQ(kGz4Levels[8 + j], std::lround(lloyd_max[j] * 127 / 2.733)) << j;
  }
  // The scale factors: 2^((s - 255) / 32), each the float32 nearest.
  EXPECT_EQ(kGzScales[0], 0.0f);
  for (int i = 1; i < 256; ++i) {
    const double want = std::exp2((i - 255) / 32.0);
    EXPECT_LE(std::fabs(kGzScales[i] - want), want * std::ldexp(1.0, -24)) << i;
  }
  EXPECT_EQ(GgmlTypeName(GgmlType::kGZ8), "GZ8");
  GgmlType t;
  ASSERT_TRUE(GgmlTypeFromName("GZ4", &t));
  EXPECT_EQ(t, GgmlType::kGZ4);
}

// GZ4S: 32 elements, an f16 d, element i < 16 in the low nibble of byte 2 + i, i >= 16 in the
// high nibble of byte 2 + i - 16; each value d * kGz4Levels[nibble]. Two blocks, each its own d.
TEST(GgmlBlocksTest, Gz4SByHand) {
  GgmlBlock block;
  ASSERT_TRUE(GgmlBlockOf(GgmlType::kGZ4S, &block));
  EXPECT_EQ(block.elements, 32);
  EXPECT_EQ(block.bytes, 18);
  std::vector<uint8_t> b(36);
  const float d[2] = {0.25f, -2.0f};
  for (int k = 0; k < 2; ++k) {
    const uint16_t h = F32ToF16(d[k]);
    b[18 * k] = h & 0xFF, b[18 * k + 1] = h >> 8;
    for (int i = 0; i < 16; ++i) b[18 * k + 2 + i] = static_cast<uint8_t>(i | (15 - i) << 4);
  }
  std::vector<float> y(64);
  ASSERT_TRUE(DequantizeBlocks(GgmlType::kGZ4S, b.data(), b.size(), 64, y.data(), "t").ok());
  for (int e = 0; e < 64; ++e) {
    const int i = e % 32;
    const int code = i < 16 ? i : 15 - (i - 16);
    EXPECT_EQ(y[e], d[e / 32] * static_cast<float>(kGz4Levels[code])) << e;
  }
  GgmlType t;
  ASSERT_TRUE(GgmlTypeFromName("GZ4S", &t));
  EXPECT_EQ(t, GgmlType::kGZ4S);
  EXPECT_TRUE(IsOwnBlockType(GgmlType::kGZ4S));
}

TEST(GgmlBlocksTest, Q1_0AndQ2_0ReadEachBlocksScale) {
  std::string q1 = Half(1.0f) + std::string(16, '\xff') + Half(-0.5f) + std::string(16, '\0');
  std::vector<float> got(256);
  ASSERT_TRUE(DequantizeBlocks(GgmlType::kQ1_0, reinterpret_cast<const uint8_t*>(q1.data()),
                               q1.size(), 256, got.data(), "t")
                  .ok());
  EXPECT_EQ(got[0], 1.0f);
  EXPECT_EQ(got[127], 1.0f);
  EXPECT_EQ(got[128], 0.5f);  // clear bit, d = -0.5: -d
  std::string q2 = Half(2.0f) + std::string(16, '\xaa') + Half(0.25f) + std::string(16, '\x55');
  got.assign(128, 0.0f);
  ASSERT_TRUE(DequantizeBlocks(GgmlType::kQ2_0, reinterpret_cast<const uint8_t*>(q2.data()),
                               q2.size(), 128, got.data(), "t")
                  .ok());
  EXPECT_EQ(got[0], 2.0f);   // code 2: d
  EXPECT_EQ(got[64], 0.0f);  // code 1: 0
  EXPECT_EQ(got[127], 0.0f);
}

TEST(GgmlBlocksTest, RefusesSizesThatAreNotItsBlocks) {
  std::vector<uint8_t> bytes(2 * 144, 0);
  std::vector<float> out(512);
  // One byte short, one byte over, elements not whole blocks: nothing is read.
  for (size_t n : {bytes.size() - 1, bytes.size() + 1}) {
    const Status s = DequantizeBlocks(GgmlType::kQ4_K, bytes.data(), n, 512, out.data(),
                                      "f.gguf: tensor \"blk.0.attn_q.weight\"");
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.code(), StatusCode::kDataLoss);
    EXPECT_NE(s.message().find("blk.0.attn_q.weight"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("Q4_K"), std::string::npos) << s.message();
  }
  EXPECT_FALSE(
      DequantizeBlocks(GgmlType::kQ4_K, bytes.data(), bytes.size(), 500, out.data(), "t").ok());
  EXPECT_FALSE(
      DequantizeBlocks(GgmlType::kQ4_K, bytes.data(), bytes.size(), -256, out.data(), "t").ok());
  const Status s =
      DequantizeBlocks(GgmlType::kIQ2_XXS, bytes.data(), 66, 256, out.data(), "tensor \"x\"");
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  EXPECT_NE(s.message().find("IQ2_XXS"), std::string::npos) << s.message();
  EXPECT_FALSE(CanDequantize(GgmlType::kIQ2_XXS));
  for (GgmlType t : {GgmlType::kQ1_0, GgmlType::kQ2_0, GgmlType::kQ6_K, GgmlType::kBF16}) {
    EXPECT_TRUE(CanDequantize(t)) << GgmlTypeName(t);
  }
}

// F32, F16 and BF16 read as one-element blocks.
TEST(GgmlBlocksTest, ReadsFloatTypes) {
  const float f = 0.1f;
  const uint16_t h = F32ToF16(-2.5f), b = 0x3F80;  // bf16 1.0
  float out = 0.0f;
  ASSERT_TRUE(
      DequantizeBlocks(GgmlType::kF32, reinterpret_cast<const uint8_t*>(&f), 4, 1, &out, "t").ok());
  EXPECT_EQ(out, f);
  ASSERT_TRUE(
      DequantizeBlocks(GgmlType::kF16, reinterpret_cast<const uint8_t*>(&h), 2, 1, &out, "t").ok());
  EXPECT_EQ(out, -2.5f);
  ASSERT_TRUE(
      DequantizeBlocks(GgmlType::kBF16, reinterpret_cast<const uint8_t*>(&b), 2, 1, &out, "t")
          .ok());
  EXPECT_EQ(out, 1.0f);
}

}  // namespace
}  // namespace gizllm
