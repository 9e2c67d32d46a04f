#include "formats/ggml_blocks.h"

#include <cstring>

#include "core/dtype.h"

namespace gizllm {
namespace {

float Half(const uint8_t* p) { return F16ToF32(static_cast<uint16_t>(p[0] | (p[1] << 8))); }

// K-quants hold 256 elements a block.
constexpr int kK = 256;

// Each function reads one block at `b` and writes its elements to `y`.

void Q4_0(const uint8_t* b, float* y) {
  const float d = Half(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>((qs[j] & 0xF) - 8) * d;
    y[j + 16] = static_cast<float>((qs[j] >> 4) - 8) * d;
  }
}

void Q4_1(const uint8_t* b, float* y) {
  const float d = Half(b), m = Half(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>(qs[j] & 0xF) * d + m;
    y[j + 16] = static_cast<float>(qs[j] >> 4) * d + m;
  }
}

uint32_t Le32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}

// Bit j of qh is element j's fifth bit, bit j + 16 element j + 16's.
void Q5_0(const uint8_t* b, float* y) {
  const float d = Half(b);
  const uint32_t qh = Le32(b + 2);
  const uint8_t* qs = b + 6;
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0xF) | ((qh >> j) & 1) << 4;
    const int hi = (qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4;
    y[j] = static_cast<float>(lo - 16) * d;
    y[j + 16] = static_cast<float>(hi - 16) * d;
  }
}

void Q5_1(const uint8_t* b, float* y) {
  const float d = Half(b), m = Half(b + 2);
  const uint32_t qh = Le32(b + 4);
  const uint8_t* qs = b + 8;
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0xF) | ((qh >> j) & 1) << 4;
    const int hi = (qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4;
    y[j] = static_cast<float>(lo) * d + m;
    y[j + 16] = static_cast<float>(hi) * d + m;
  }
}

void Q8_0(const uint8_t* b, float* y) {
  const float d = Half(b);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
}

// Element e = 128 h + 32 s + l (h: half, s: shift index, l < 32) is bits 2s of qs[32 h + l];
// its group of 16 is e / 16, whose scale byte holds the scale (low nibble) and min (high).
void Q2_K(const uint8_t* b, float* y) {
  const uint8_t* scales = b;
  const uint8_t* qs = b + 16;
  const float d = Half(b + 80), dmin = Half(b + 82);
  for (int e = 0; e < kK; ++e) {
    const int h = e / 128, s = (e / 32) % 4, l = e % 32;
    const uint8_t sc = scales[e / 16];
    const float dl = d * static_cast<float>(sc & 0xF);
    const float ml = dmin * static_cast<float>(sc >> 4);
    y[e] = dl * static_cast<float>((qs[32 * h + l] >> (2 * s)) & 3) - ml;
  }
}

// Element e = 128 h + 32 s + l: two low bits at bits 2s of qs[32 h + l], and 4 is subtracted
// unless bit 4 h + s of hmask[l] is set. Group g's 6-bit scale: its low 4 bits are the low
// (g < 8) or high nibble of scales[g % 8], its high 2 bits bits 2 (g / 4) of scales[8 + g % 4].
void Q3_K(const uint8_t* b, float* y) {
  const uint8_t* hmask = b;
  const uint8_t* qs = b + 32;
  const uint8_t* scales = b + 96;
  const float d = Half(b + 108);
  for (int e = 0; e < kK; ++e) {
    const int h = e / 128, s = (e / 32) % 4, l = e % 32, g = e / 16;
    const int low = (scales[g % 8] >> (g < 8 ? 0 : 4)) & 0xF;
    const int high = (scales[8 + g % 4] >> (2 * (g / 4))) & 3;
    const float dl = d * static_cast<float>((low | high << 4) - 32);
    const int q = ((qs[32 * h + l] >> (2 * s)) & 3) - ((hmask[l] >> (4 * h + s)) & 1 ? 0 : 4);
    y[e] = dl * static_cast<float>(q);
  }
}

// The 6-bit scale and min of group j (of 8) in Q4_K's and Q5_K's 12 scale bytes.
void ScaleMin(const uint8_t* s, int j, int* scale, int* min) {
  if (j < 4) {
    *scale = s[j] & 63;
    *min = s[j + 4] & 63;
  } else {
    *scale = (s[j + 4] & 0xF) | (s[j - 4] >> 6) << 4;
    *min = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
  }
}

// Groups of 32: group 2c is the low nibbles of qs[32 c ...], group 2c + 1 their high nibbles.
void Q4_K(const uint8_t* b, float* y) {
  const float d = Half(b), dmin = Half(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qs = b + 16;
  for (int g = 0; g < 8; ++g) {
    int sc, m;
    ScaleMin(scales, g, &sc, &m);
    const float dl = d * static_cast<float>(sc), ml = dmin * static_cast<float>(m);
    const uint8_t* q = qs + 32 * (g / 2);
    const int shift = 4 * (g % 2);
    for (int l = 0; l < 32; ++l) {
      y[32 * g + l] = dl * static_cast<float>((q[l] >> shift) & 0xF) - ml;
    }
  }
}

// As Q4_K, with group g's fifth bits in bit g of qh[l].
void Q5_K(const uint8_t* b, float* y) {
  const float d = Half(b), dmin = Half(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + 48;
  for (int g = 0; g < 8; ++g) {
    int sc, m;
    ScaleMin(scales, g, &sc, &m);
    const float dl = d * static_cast<float>(sc), ml = dmin * static_cast<float>(m);
    const uint8_t* q = qs + 32 * (g / 2);
    const int shift = 4 * (g % 2);
    for (int l = 0; l < 32; ++l) {
      const int v = ((q[l] >> shift) & 0xF) | ((qh[l] >> g) & 1) << 4;
      y[32 * g + l] = dl * static_cast<float>(v) - ml;
    }
  }
}

// Element e = 128 h + 32 k + l (k < 4, l < 32): low 4 bits are the low (k even) or high (k odd)
// nibble of ql[64 h + 32 (k % 2) + l], high 2 bits bits 2k of qh[32 h + l]; minus 32. Its
// group of 16 is e / 16, each with an int8 scale; x = (d * scale) * q.
void Q6_K(const uint8_t* b, float* y) {
  const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192);
  const float d = Half(b + 208);
  for (int h = 0; h < 2; ++h) {
    const uint8_t* ql = b + 64 * h;
    const uint8_t* qh = b + 128 + 32 * h;
    for (int k = 0; k < 4; ++k) {
      const uint8_t* q = ql + 32 * (k % 2);
      const int shift = 4 * (k / 2);
      float* out = y + 128 * h + 32 * k;
      const float dl0 = d * static_cast<float>(scales[8 * h + 2 * k]);
      const float dl1 = d * static_cast<float>(scales[8 * h + 2 * k + 1]);
      for (int l = 0; l < 32; ++l) {
        const int v = (((q[l] >> shift) & 0xF) | ((qh[l] >> (2 * k)) & 3) << 4) - 32;
        out[l] = (l < 16 ? dl0 : dl1) * static_cast<float>(v);
      }
    }
  }
}

void Iq4Nl(const uint8_t* b, float* y) {
  const float d = Half(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>(kIq4NlValues[qs[j] & 0xF]);
    y[j + 16] = d * static_cast<float>(kIq4NlValues[qs[j] >> 4]);
  }
}

// Group g (of 32): scale bits 0-3 are nibble g % 2 of scales_l[g / 2], bits 4-5 bits 2g of
// scales_h; its codes are qs[16 g ...], low nibbles first, as IQ4_NL's.
void Iq4Xs(const uint8_t* b, float* y) {
  const float d = Half(b);
  const int scales_h = b[2] | b[3] << 8;
  const uint8_t* scales_l = b + 4;
  const uint8_t* qs = b + 8;
  for (int g = 0; g < 8; ++g) {
    const int ls = ((scales_l[g / 2] >> (4 * (g % 2))) & 0xF) | ((scales_h >> (2 * g)) & 3) << 4;
    const float dl = d * static_cast<float>(ls - 32);
    for (int j = 0; j < 16; ++j) {
      y[32 * g + j] = dl * static_cast<float>(kIq4NlValues[qs[16 * g + j] & 0xF]);
      y[32 * g + j + 16] = dl * static_cast<float>(kIq4NlValues[qs[16 * g + j] >> 4]);
    }
  }
}

// A byte holds ternary digits as a fixed-point fraction: digit n is the top "trit" of
// (byte * 3^n mod 256) * 3 / 256, minus 1.
float Trit(uint8_t byte, int n, float d) {
  static constexpr uint8_t kPow3[5] = {1, 3, 9, 27, 81};
  const uint8_t q = static_cast<uint8_t>(byte * kPow3[n]);
  return static_cast<float>(((q * 3) >> 8) - 1) * d;
}

// Elements in order: qs[0..32) for digits 0..4 (32 per digit), qs[32..48) likewise (16 per
// digit), then qh[0..4) for digits 0..3.
void Tq1_0(const uint8_t* b, float* y) {
  const uint8_t* qs = b;
  const uint8_t* qh = b + 48;
  const float d = Half(b + 52);
  for (int n = 0; n < 5; ++n)
    for (int m = 0; m < 32; ++m) *y++ = Trit(qs[m], n, d);
  for (int n = 0; n < 5; ++n)
    for (int m = 0; m < 16; ++m) *y++ = Trit(qs[32 + m], n, d);
  for (int n = 0; n < 4; ++n)
    for (int m = 0; m < 4; ++m) *y++ = Trit(qh[m], n, d);
}

// Element 128 h + 32 s + m is bits 2s of qs[32 h + m], minus 1.
void Tq2_0(const uint8_t* b, float* y) {
  const float d = Half(b + 64);
  for (int e = 0; e < kK; ++e) {
    const int q = (b[32 * (e / 128) + e % 32] >> (2 * ((e / 32) % 4))) & 3;
    y[e] = static_cast<float>(q - 1) * d;
  }
}

// Element j is bit j % 8 of qs[j / 8].
void Q1_0(const uint8_t* b, float* y) {
  const float d = Half(b);
  for (int j = 0; j < 128; ++j) y[j] = (b[2 + j / 8] >> (j % 8)) & 1 ? d : -d;
}

// Element j is bits 2 (j % 4) of qs[j / 4], minus 1.
void Q2_0(const uint8_t* b, float* y) {
  const float d = Half(b);
  for (int j = 0; j < 64; ++j) {
    y[j] = static_cast<float>(((b[2 + j / 4] >> (2 * (j % 4))) & 3) - 1) * d;
  }
}

// Group g's scale d * kGzScales[s[g]] (one rounding), then each code times it.
void Gz8(const uint8_t* b, float* y) {
  const float d = Half(b);
  for (int g = 0; g < 4; ++g) {
    const float scale = d * kGzScales[b[2 + g]];
    for (int i = 0; i < 32; ++i) {
      y[32 * g + i] = scale * static_cast<float>(static_cast<int8_t>(b[6 + 32 * g + i]));
    }
  }
}

void Gz4(const uint8_t* b, float* y) {
  const float d = Half(b);
  for (int g = 0; g < 4; ++g) {
    const float scale = d * kGzScales[b[2 + g]];
    for (int i = 0; i < 16; ++i) {
      const uint8_t q = b[6 + 16 * g + i];
      y[32 * g + i] = scale * static_cast<float>(kGz4Levels[q & 0xF]);
      y[32 * g + 16 + i] = scale * static_cast<float>(kGz4Levels[q >> 4]);
    }
  }
}

void Gz4S(const uint8_t* b, float* y) {
  const float d = Half(b);
  for (int i = 0; i < 16; ++i) {
    y[i] = d * static_cast<float>(kGz4Levels[b[2 + i] & 0xF]);
    y[16 + i] = d * static_cast<float>(kGz4Levels[b[2 + i] >> 4]);
  }
}

void F32(const uint8_t* b, float* y) { std::memcpy(y, b, 4); }
void F16(const uint8_t* b, float* y) { *y = Half(b); }
void Bf16(const uint8_t* b, float* y) { *y = Bf16ToF32(static_cast<uint16_t>(b[0] | b[1] << 8)); }

}  // namespace

GgmlBlockFn GgmlBlockDecoder(GgmlType type) {
  switch (type) {
    case GgmlType::kF32:
      return F32;
    case GgmlType::kF16:
      return F16;
    case GgmlType::kBF16:
      return Bf16;
    case GgmlType::kQ4_0:
      return Q4_0;
    case GgmlType::kQ4_1:
      return Q4_1;
    case GgmlType::kQ5_0:
      return Q5_0;
    case GgmlType::kQ5_1:
      return Q5_1;
    case GgmlType::kQ8_0:
      return Q8_0;
    case GgmlType::kQ2_K:
      return Q2_K;
    case GgmlType::kQ3_K:
      return Q3_K;
    case GgmlType::kQ4_K:
      return Q4_K;
    case GgmlType::kQ5_K:
      return Q5_K;
    case GgmlType::kQ6_K:
      return Q6_K;
    case GgmlType::kIQ4_NL:
      return Iq4Nl;
    case GgmlType::kIQ4_XS:
      return Iq4Xs;
    case GgmlType::kTQ1_0:
      return Tq1_0;
    case GgmlType::kTQ2_0:
      return Tq2_0;
    case GgmlType::kQ1_0:
      return Q1_0;
    case GgmlType::kQ2_0:
      return Q2_0;
    case GgmlType::kGZ4:
      return Gz4;
    case GgmlType::kGZ8:
      return Gz8;
    case GgmlType::kGZ4S:
      return Gz4S;
    default:
      return nullptr;
  }
}

bool CanDequantize(GgmlType type) { return GgmlBlockDecoder(type) != nullptr; }

Status DequantizeBlocks(GgmlType type, const uint8_t* blocks, size_t bytes, int64_t elements,
                        float* out, const std::string& what) {
  const GgmlBlockFn fn = GgmlBlockDecoder(type);
  GgmlBlock block;
  if (fn == nullptr || !GgmlBlockOf(type, &block)) {
    return Unimplemented(what + " has block type " + GgmlTypeName(type) +
                         ", which is not read here");
  }
  if (elements < 0 || elements % block.elements != 0) {
    return DataLoss(what + ": " + std::to_string(elements) + " elements are not whole " +
                    GgmlTypeName(type) + " blocks of " + std::to_string(block.elements));
  }
  const uint64_t count = static_cast<uint64_t>(elements / block.elements);
  if (bytes / static_cast<uint64_t>(block.bytes) != count ||
      bytes % static_cast<uint64_t>(block.bytes) != 0) {
    return DataLoss(what + ": " + std::to_string(bytes) + " bytes are not the " +
                    std::to_string(count) + " " + GgmlTypeName(type) + " blocks of " +
                    std::to_string(block.bytes) + " bytes that " + std::to_string(elements) +
                    " elements take");
  }
  for (uint64_t i = 0; i < count; ++i) fn(blocks + i * block.bytes, out + i * block.elements);
  return Status::Ok();
}

}  // namespace gizllm
