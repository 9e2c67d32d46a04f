// The rotated KV pages (ops/kv_codes.h) on the CUDA backend against the CPU backend, for every bit
// width and mixed key and value widths: KvWrite's and RopeKv's codes, steps and mins, and the
// attention over the same codes (decoding rows, prompt runs, windows, soft-capped scores, long
// contexts read by many splits, the head shapes of the supported models), in exact mode (the
// float32 split kernel for every row; head_dim 96: the per-row kernel) and in the fast mode
// (prompt runs through the tensor-core tiles).
//
// Codes: both backends rotate and code in float32 with the same arithmetic in the same order (the
// device without fused multiply-adds, -fmad=false), so they agree bit for bit
// (WriteEqualsTheCodingFunctionsByteForByte holds the write to that); the steps below allow what
// float32 rounding in another order would give (a code off by one where a rotated element lies
// at a midpoint between two steps, the step and min within 1e-5 of the group's largest
// magnitude, now and then; 4 bits, a fit from several starts: each group's squared error within
// 0.1% of the CPU's, ExpectSameFits). Attention: the same codes on both sides, float32 sums
// in different orders, within 1e-5 relative (the exact kernels' float32 pages are held to 1e-4
// against a double reference); in the fast mode, where prompt runs multiply fp16 queries, keys,
// values and probabilities, within 1e-2, the bound of the fast mode over float pages
// (cuda_attention_test.cc).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>
#include <string>
#include <tuple>

#include "backend/cpu/cpu_backend.h"
#include "core/thread_pool.h"
#include "cuda_test_util.h"
#include "ops/kv_codes.h"

namespace gizllm::testing {
namespace {

const KvFormat kFormats[] = {RotatedKv(8, 8), RotatedKv(4, 4), RotatedKv(2, 2),
                             RotatedKv(8, 4), RotatedKv(4, 2), RotatedKv(2, 8)};

// Rotated pages of `pages` pages on the host: codes and {step, min} of keys and values.
struct HostPages {
  std::vector<uint8_t> keys, values;
  std::vector<float> key_scales, value_scales;
  HostPages(KvFormat f, int32_t pages, int kv_heads, int head_dim) {
    const int64_t vectors = int64_t{pages} * kPage * kv_heads;
    keys.assign(vectors * KvKeyBytes(f, head_dim), 0);
    values.assign(vectors * KvValueBytes(f, head_dim), 0);
    key_scales.assign(2 * vectors * kv::Groups(head_dim), 0.0f);
    value_scales.assign(2 * vectors * kv::Groups(head_dim), 0.0f);
  }
};

// The vectors of `got` and `want` (codes of `bits`, {step, min} a code group) agree as the
// header says.
void ExpectSameCodes(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want,
                     const std::vector<float>& got_scales, const std::vector<float>& want_scales,
                     int bits, int head_dim, const char* what) {
  const int64_t bytes = kv::CodeBytes(bits, head_dim);
  const int part = kv::GroupSize(head_dim), parts = kv::Groups(head_dim);
  int differ = 0;
  for (size_t j = 0; j < want_scales.size() / 2; ++j) {
    const size_t v = j / parts;
    const float step = want_scales[2 * j], min = want_scales[2 * j + 1];
    const float top = std::max(std::fabs(min), std::fabs(min + step * ((1 << bits) - 1)));
    ASSERT_NEAR(got_scales[2 * j], step, 1e-5f * top) << what << " group " << j;
    ASSERT_NEAR(got_scales[2 * j + 1], min, 1e-5f * top) << what << " group " << j;
    for (int e = static_cast<int>(j % parts) * part; e < static_cast<int>(j % parts + 1) * part;
         ++e) {
      const int d =
          kv::Code(got.data() + v * bytes, e, bits) - kv::Code(want.data() + v * bytes, e, bits);
      ASSERT_LE(std::abs(d), 1) << what << " vector " << v << " element " << e;
      differ += d != 0;
    }
  }
  // Off by one only now and then.
  EXPECT_LE(differ, static_cast<int>(want.size() / 1000) + 2) << what;
}

// 4-bit codes (a least-squares fit from several starts, ops/kv_codes.h Quantize4): the vectors not
// in `written` the same bit for bit; each group of a written vector (vector index -> its input
// x [head_dim]) read back within 0.1% of the squared error of the CPU's fit against the input
// rotated (the same fit but where float32 rounding in another order moves an element across a
// boundary between two levels: then the fits may settle apart, with about the same error).
void ExpectSameFits(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want,
                    const std::vector<float>& got_scales, const std::vector<float>& want_scales,
                    const std::map<int64_t, const float*>& written, int head_dim,
                    const char* what) {
  const int64_t bytes = kv::CodeBytes(4, head_dim);
  const int part = kv::GroupSize(head_dim), parts = kv::Groups(head_dim);
  for (size_t v = 0; v < want_scales.size() / (2 * parts); ++v) {
    auto it = written.find(static_cast<int64_t>(v));
    if (it == written.end()) {
      for (int j = 0; j < 2 * parts; ++j)
        ASSERT_EQ(got_scales[2 * parts * v + j], want_scales[2 * parts * v + j]) << what << v;
      for (int64_t b = 0; b < bytes; ++b)
        ASSERT_EQ(got[v * bytes + b], want[v * bytes + b]) << what << " vector " << v;
      continue;
    }
    std::vector<float> y(it->second, it->second + head_dim);
    kv::Rotate(y.data(), head_dim);
    for (int g = 0; g < parts; ++g) {
      const float* gp = &got_scales[2 * (v * parts + g)];
      const float* wp = &want_scales[2 * (v * parts + g)];
      double got_error = 0.0, want_error = 0.0;
      for (int e = g * part; e < (g + 1) * part; ++e) {
        const double gy = gp[1] + double{gp[0]} * kv::Level4(kv::Code(&got[v * bytes], e, 4));
        const double wy = wp[1] + double{wp[0]} * kv::Level4(kv::Code(&want[v * bytes], e, 4));
        got_error += (gy - y[e]) * (gy - y[e]);
        want_error += (wy - y[e]) * (wy - y[e]);
      }
      ASSERT_LE(got_error, 1.001 * want_error) << what << " vector " << v << " group " << g;
    }
  }
}

// One step of rows (pieces of slots) written by KvWrite (or RopeKv without rotary) on both
// backends into pages that already hold other codes, compared; then the attention of those rows
// over the pages on both backends.
struct Piece {
  int32_t slot, first, count;
};

// fast: the backend in the fast mode (otherwise exact).
void CheckRotated(KvFormat f, int heads, int kv_heads, int head_dim, int32_t window, float softcap,
                  const std::vector<Piece>& pieces, bool rope_kv, uint32_t seed,
                  bool fast = false) {
  SCOPED_TRACE("kv " + KvFormatName(f) + " heads " + std::to_string(heads) + "/" +
               std::to_string(kv_heads) + " dim " + std::to_string(head_dim) + " window " +
               std::to_string(window) + " softcap " + std::to_string(softcap) +
               (rope_kv ? " rope-kv" : " kv-write") + (fast ? " fast" : " exact"));
  auto cuda = MakeBackend(/*exact=*/!fast);
  ASSERT_NE(cuda, nullptr);
  ASSERT_TRUE(cuda->SupportsKvFormat(f));
  ThreadPool pool(2);
  auto cpu = MakeCpuBackend(&pool);
  std::mt19937 rng(seed);
  int32_t slots = 0, longest = 0;
  std::vector<int32_t> row_slots, row_positions;
  for (const Piece& piece : pieces) {
    slots = std::max(slots, piece.slot + 1);
    longest = std::max(longest, piece.first + piece.count);
    for (int32_t i = 0; i < piece.count; ++i) {
      row_slots.push_back(piece.slot);
      row_positions.push_back(piece.first + i);
    }
  }
  const int64_t rows = static_cast<int64_t>(row_slots.size());
  const int32_t max_pages = (longest + kPage - 1) / kPage + 1;
  const int32_t pages = slots * max_pages;
  std::vector<int32_t> table(pages);
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);
  // Every position of every slot first holds codes of random keys (with channel offsets, as a
  // model's keys have) and values, written by the CPU backend; then the step's rows overwrite
  // theirs on both.
  HostPages host(f, pages, kv_heads, head_dim);
  {
    std::vector<int32_t> all_slots, all_positions;
    for (int32_t s = 0; s < slots; ++s) {
      for (int32_t pos = 0; pos < max_pages * kPage; ++pos) {
        all_slots.push_back(s);
        all_positions.push_back(pos);
      }
    }
    const int64_t n = static_cast<int64_t>(all_slots.size()) * kv_heads * head_dim;
    std::vector<float> k = RandomFloats(rng, n), v = RandomFloats(rng, n);
    for (int64_t i = 0; i < n; ++i) k[i] += (i % head_dim) % 5 == 0 ? 2.0f : 0.0f;
    KvWriteParams fill{.cache = {host.keys.data(), host.values.data(), f, host.key_scales.data(),
                                 host.value_scales.data()},
                       .table = {table.data(), max_pages},
                       .k = k.data(),
                       .v = v.data(),
                       .slots = all_slots.data(),
                       .positions = all_positions.data(),
                       .rows = static_cast<int64_t>(all_slots.size()),
                       .kv_heads = kv_heads,
                       .head_dim = head_dim};
    ASSERT_TRUE(fill.Check().ok());
    cpu->KvWrite(fill);
  }
  DeviceArray<uint8_t> keys(cuda.get(), host.keys), values(cuda.get(), host.values);
  DeviceArray<float> key_scales(cuda.get(), host.key_scales),
      value_scales(cuda.get(), host.value_scales);
  DeviceArray<int32_t> d_table(cuda.get(), table), d_slots(cuda.get(), row_slots),
      d_positions(cuda.get(), row_positions);
  const int64_t n = rows * kv_heads * head_dim;
  DeviceArray<float> k(cuda.get(), RandomFloats(rng, n, 1.5f)), v(cuda.get(), RandomFloats(rng, n));
  DeviceArray<float> q(cuda.get(), RandomFloats(rng, rows * heads * head_dim, 2.0f));
  KvWriteParams write{
      .cache = {keys.device(), values.device(), f, key_scales.device(), value_scales.device()},
      .table = {d_table.device(), max_pages},
      .k = k.device(),
      .v = v.device(),
      .slots = d_slots.device(),
      .positions = d_positions.device(),
      .rows = rows,
      .kv_heads = kv_heads,
      .head_dim = head_dim};
  ASSERT_TRUE(write.Check().ok());
  if (rope_kv) {
    RopeKvParams rk;
    rk.q = RopeParams{.x = q.device(), .rows = rows, .heads = heads, .head_dim = head_dim};
    rk.k = RopeParams{.x = k.device(), .rows = rows, .heads = kv_heads, .head_dim = head_dim};
    rk.kv = write;
    ASSERT_TRUE(rk.Check().ok()) << rk.Check().message();
    cuda->RopeKv(rk);
  } else {
    cuda->KvWrite(write);
  }
  KvWriteParams host_write = write;
  host_write.cache = {host.keys.data(), host.values.data(), f, host.key_scales.data(),
                      host.value_scales.data()};
  host_write.table = {table.data(), max_pages};
  host_write.k = k.host().data();
  host_write.v = v.host().data();
  host_write.slots = row_slots.data();
  host_write.positions = row_positions.data();
  cpu->KvWrite(host_write);
  std::map<int64_t, const float*> written_keys, written_values;  // vector -> its input
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t page = table[int64_t{row_slots[r]} * max_pages + row_positions[r] / kPage];
    for (int h = 0; h < kv_heads; ++h) {
      const int64_t vector = (page * kPage + row_positions[r] % kPage) * kv_heads + h;
      written_keys[vector] = k.host().data() + (r * kv_heads + h) * head_dim;
      written_values[vector] = v.host().data() + (r * kv_heads + h) * head_dim;
    }
  }
  if (KvKeyBits(f) == 4) {
    ExpectSameFits(keys.Read(), host.keys, key_scales.Read(), host.key_scales, written_keys,
                   head_dim, "keys");
  } else {
    ExpectSameCodes(keys.Read(), host.keys, key_scales.Read(), host.key_scales, KvKeyBits(f),
                    head_dim, "keys");
  }
  if (KvValueBits(f) == 4) {
    ExpectSameFits(values.Read(), host.values, value_scales.Read(), host.value_scales,
                   written_values, head_dim, "values");
  } else {
    ExpectSameCodes(values.Read(), host.values, value_scales.Read(), host.value_scales,
                    KvValueBits(f), head_dim, "values");
  }

  // The attention over the same codes: the host's pages to the device first.
  DeviceArray<uint8_t> same_keys(cuda.get(), host.keys), same_values(cuda.get(), host.values);
  DeviceArray<float> same_key_scales(cuda.get(), host.key_scales),
      same_value_scales(cuda.get(), host.value_scales);
  DeviceArray<float> out(cuda.get(), std::vector<float>(rows * heads * head_dim, 0.0f));
  out.Poison();
  AttentionParams p{.out = out.device(),
                    .q = q.device(),
                    .cache = {same_keys.device(), same_values.device(), f, same_key_scales.device(),
                              same_value_scales.device()},
                    .table = {d_table.device(), max_pages},
                    .slots = d_slots.device(),
                    .positions = d_positions.device(),
                    .rows = rows,
                    .heads = heads,
                    .kv_heads = kv_heads,
                    .head_dim = head_dim,
                    .scale = 1.0f / std::sqrt(static_cast<float>(head_dim)),
                    .window = window,
                    .softcap = softcap};
  ASSERT_TRUE(p.Check().ok());
  cuda->Attention(p);
  AttentionParams h = p;
  h.out = out.host().data();
  h.q = q.host().data();
  h.cache = host_write.cache;
  h.table = host_write.table;
  h.slots = row_slots.data();
  h.positions = row_positions.data();
  cpu->Attention(h);
  EXPECT_LT(RelativeError(out.Read(), out.host()), fast ? 1e-2 : 1e-5);
}

// Inputs that make ties: vector kind `kind` (of 8) of head_dim, random from rng. 0 Gaussian; 1 with
// channel offsets, as keys have; 2 small integers (rotated: many equal elements, extremes tied
// at several places, elements on the steps' midpoints); 3 one channel set (rotated: every
// element +-c, groups of two values); 4 zeros (groups of one value); 5 tiny and 6 huge
// magnitudes; 7 a NaN (even rows) or an infinity (odd rows) in one channel.
std::vector<float> TieInput(std::mt19937& rng, int kind, int64_t row, int head_dim) {
  std::vector<float> x = RandomFloats(rng, head_dim);
  std::uniform_int_distribution<int> small(-3, 3), channel(0, head_dim - 1);
  switch (kind) {
    case 1:
      for (int d = 0; d < head_dim; ++d) x[d] += d % 5 == 0 ? 2.0f : 0.0f;
      break;
    case 2:
      for (float& e : x) e = static_cast<float>(small(rng));
      break;
    case 3:
      std::fill(x.begin(), x.end(), 0.0f);
      x[channel(rng)] = row % 2 == 0 ? 1.5f : -1.5f;
      break;
    case 4:
      std::fill(x.begin(), x.end(), 0.0f);
      break;
    case 5:
      for (float& e : x) e *= 1e-20f;
      break;
    case 6:
      for (float& e : x) e *= 1e17f;
      break;
    case 7:
      x[channel(rng)] = row % 2 == 0 ? std::nanf("") : INFINITY;
      break;
    default:
      break;
  }
  return x;
}

// Float bits equal, or both NaN.
bool SameFloat(float a, float b) {
  if (std::isnan(a) && std::isnan(b)) return true;
  uint32_t ua, ub;
  std::memcpy(&ua, &a, 4);
  std::memcpy(&ub, &b, 4);
  return ua == ub;
}

// The write's codes, steps and mins byte for byte against kv::Rotate and kv::QuantizeVector on
// the host, for every format and head dims 64, 96, 128, 256 (groups of 32) and 72 (one group
// of the whole vector), in both of the write's shapes (attention_codes.cu: a warp per group
// for up to 2,048 vectors, a thread per group above), over inputs that make ties (TieInput).
// Output pages are poisoned first.
TEST(CudaKvCodesTest, WriteEqualsTheCodingFunctionsByteForByte) {
  GZ_SKIP_WITHOUT_CUDA();
  auto cuda = MakeBackend(/*exact=*/true);
  ASSERT_NE(cuda, nullptr);
  std::mt19937 rng(77);
  for (KvFormat f : kFormats) {
    for (int head_dim : {64, 96, 128, 256, 72}) {
      for (auto [rows, kv_heads] : {std::pair<int64_t, int>{1, 8}, std::pair<int64_t, int>{5, 8},
                                    std::pair<int64_t, int>{1100, 2}}) {
        SCOPED_TRACE("kv " + KvFormatName(f) + " dim " + std::to_string(head_dim) + " rows " +
                     std::to_string(rows) + " kv_heads " + std::to_string(kv_heads));
        const int32_t max_pages = static_cast<int32_t>((rows + kPage - 1) / kPage);
        std::vector<int32_t> table(max_pages), slots(rows, 0), positions(rows);
        std::iota(table.begin(), table.end(), 0);
        std::iota(positions.begin(), positions.end(), 0);
        const int64_t vectors = int64_t{max_pages} * kPage * kv_heads;
        const int parts = kv::Groups(head_dim);
        const int key_bits = KvKeyBits(f), value_bits = KvValueBits(f);
        const int64_t key_bytes = kv::CodeBytes(key_bits, head_dim);
        const int64_t value_bytes = kv::CodeBytes(value_bits, head_dim);
        std::vector<float> k, v;
        for (int64_t r = 0; r < rows; ++r) {
          for (int h = 0; h < kv_heads; ++h) {
            const int kind = static_cast<int>((r * kv_heads + h) % 8);
            const std::vector<float> kx = TieInput(rng, kind, r, head_dim);
            const std::vector<float> vx = TieInput(rng, (kind + 3) % 8, r + 1, head_dim);
            k.insert(k.end(), kx.begin(), kx.end());
            v.insert(v.end(), vx.begin(), vx.end());
          }
        }
        // Want: the host's functions, vector (position, kv head) = row * kv_heads + head.
        std::vector<uint8_t> want_keys(vectors * key_bytes, 0x5a),
            want_values(vectors * value_bytes, 0x5a);
        std::vector<float> want_key_scales(2 * vectors * parts, -123.0f),
            want_value_scales(2 * vectors * parts, -123.0f);
        for (int64_t i = 0; i < rows * kv_heads; ++i) {
          std::vector<float> y(k.begin() + i * head_dim, k.begin() + (i + 1) * head_dim);
          kv::Rotate(y.data(), head_dim);
          kv::QuantizeVector(y.data(), head_dim, key_bits, &want_keys[i * key_bytes],
                             &want_key_scales[2 * parts * i]);
          y.assign(v.begin() + i * head_dim, v.begin() + (i + 1) * head_dim);
          kv::Rotate(y.data(), head_dim);
          kv::QuantizeVector(y.data(), head_dim, value_bits, &want_values[i * value_bytes],
                             &want_value_scales[2 * parts * i]);
        }
        DeviceArray<uint8_t> keys(cuda.get(), std::vector<uint8_t>(want_keys.size(), 0x5a)),
            values(cuda.get(), std::vector<uint8_t>(want_values.size(), 0x5a));
        DeviceArray<float> key_scales(cuda.get(),
                                      std::vector<float>(want_key_scales.size(), -123.0f)),
            value_scales(cuda.get(), std::vector<float>(want_value_scales.size(), -123.0f));
        DeviceArray<int32_t> d_table(cuda.get(), table), d_slots(cuda.get(), slots),
            d_positions(cuda.get(), positions);
        DeviceArray<float> d_k(cuda.get(), k), d_v(cuda.get(), v);
        KvWriteParams write{.cache = {keys.device(), values.device(), f, key_scales.device(),
                                      value_scales.device()},
                            .table = {d_table.device(), max_pages},
                            .k = d_k.device(),
                            .v = d_v.device(),
                            .slots = d_slots.device(),
                            .positions = d_positions.device(),
                            .rows = rows,
                            .kv_heads = kv_heads,
                            .head_dim = head_dim};
        ASSERT_TRUE(write.Check().ok());
        cuda->KvWrite(write);
        const std::vector<uint8_t> got_keys = keys.Read(), got_values = values.Read();
        const std::vector<float> got_key_scales = key_scales.Read(),
                                 got_value_scales = value_scales.Read();
        for (int64_t i = 0; i < vectors; ++i) {
          for (int j = 0; j < 2 * parts; ++j) {
            const int64_t at = 2 * parts * i + j;
            ASSERT_TRUE(SameFloat(got_key_scales[at], want_key_scales[at]))
                << "key vector " << i << " scale " << j << ": " << got_key_scales[at] << " want "
                << want_key_scales[at];
            ASSERT_TRUE(SameFloat(got_value_scales[at], want_value_scales[at]))
                << "value vector " << i << " scale " << j << ": " << got_value_scales[at]
                << " want " << want_value_scales[at];
          }
          for (int64_t b = 0; b < key_bytes; ++b)
            ASSERT_EQ(got_keys[i * key_bytes + b], want_keys[i * key_bytes + b])
                << "key vector " << i << " byte " << b;
          for (int64_t b = 0; b < value_bytes; ++b)
            ASSERT_EQ(got_values[i * value_bytes + b], want_values[i * value_bytes + b])
                << "value vector " << i << " byte " << b;
        }
      }
    }
  }
}

// Decoding rows of several slots, and a step that mixes them with prompt runs (one mid-page, one
// from 0, one long), over every rotated format and the supported models' head shapes.
TEST(CudaKvCodesTest, WriteAndAttentionMatchTheCpu) {
  GZ_SKIP_WITHOUT_CUDA();
  const std::vector<Piece> decode = {{0, 37, 1}, {1, 200, 1}, {2, 0, 1}, {3, 16, 1}};
  const std::vector<Piece> mixed = {{0, 37, 1}, {1, 5, 7}, {2, 0, 45}, {3, 100, 60}};
  uint32_t seed = 1;
  for (KvFormat f : kFormats) {
    for (auto [heads, kv_heads, head_dim] :
         {std::tuple{32, 8, 128}, std::tuple{6, 2, 64}, std::tuple{16, 4, 96},
          std::tuple{8, 8, 256}, std::tuple{16, 2, 128}}) {
      CheckRotated(f, heads, kv_heads, head_dim, 0, 0.0f, decode, false, seed++);
      CheckRotated(f, heads, kv_heads, head_dim, 0, 0.0f, mixed, true, seed++);
    }
  }
}

// The same steps in the fast mode: the prompt runs through the tensor-core tiles over the codes.
TEST(CudaKvCodesTest, FastModeMatchesTheCpu) {
  GZ_SKIP_WITHOUT_CUDA();
  const std::vector<Piece> decode = {{0, 37, 1}, {1, 200, 1}, {2, 0, 1}, {3, 16, 1}};
  const std::vector<Piece> mixed = {{0, 37, 1}, {1, 5, 7}, {2, 0, 45}, {3, 100, 60}};
  uint32_t seed = 500;
  for (KvFormat f : kFormats) {
    for (auto [heads, kv_heads, head_dim] :
         {std::tuple{32, 8, 128}, std::tuple{6, 2, 64}, std::tuple{16, 4, 96},
          std::tuple{8, 8, 256}, std::tuple{16, 2, 128}}) {
      CheckRotated(f, heads, kv_heads, head_dim, 0, 0.0f, decode, false, seed++, /*fast=*/true);
      CheckRotated(f, heads, kv_heads, head_dim, 0, 0.0f, mixed, true, seed++, /*fast=*/true);
    }
  }
}

// Long contexts: decoding rows thousands of positions in (each read by many splits, a window's
// start mid-page among them) beside a prompt run of several hundred rows (many key tiles), in
// both modes, over 8, 4 and 2 bits and mixed widths at head_dim 64, 128 and 256.
TEST(CudaKvCodesTest, LongContextsAcrossSplits) {
  GZ_SKIP_WITHOUT_CUDA();
  const std::vector<Piece> decode = {{0, 5000, 1}, {1, 1234, 1}};
  const std::vector<Piece> mixed = {{0, 4100, 1}, {1, 700, 333}, {2, 2047, 1}};
  uint32_t seed = 900;
  for (KvFormat f : {RotatedKv(8, 8), RotatedKv(4, 2), RotatedKv(2, 8)}) {
    for (auto [heads, kv_heads, head_dim] :
         {std::tuple{8, 2, 128}, std::tuple{8, 4, 64}, std::tuple{4, 1, 256}}) {
      for (bool fast : {false, true}) {
        CheckRotated(f, heads, kv_heads, head_dim, 0, 0.0f, decode, false, seed++, fast);
        CheckRotated(f, heads, kv_heads, head_dim, 1000, 0.0f, decode, false, seed++, fast);
        CheckRotated(f, heads, kv_heads, head_dim, 0, 0.0f, mixed, true, seed++, fast);
      }
    }
  }
}

// Sliding windows (shorter than a run, across page edges) and soft-capped scores.
TEST(CudaKvCodesTest, WindowsAndSoftcap) {
  GZ_SKIP_WITHOUT_CUDA();
  const std::vector<Piece> mixed = {{0, 37, 1}, {1, 5, 30}, {2, 90, 1}};
  uint32_t seed = 100;
  for (KvFormat f : {RotatedKv(8, 8), RotatedKv(4, 2)}) {
    CheckRotated(f, 8, 4, 256, 9, 0.0f, mixed, false, seed++);
    CheckRotated(f, 4, 1, 64, 21, 0.5f, mixed, true, seed++);
    CheckRotated(f, 8, 2, 128, 0, 30.0f, mixed, false, seed++);
    CheckRotated(f, 8, 4, 256, 9, 0.0f, mixed, false, seed++, /*fast=*/true);
    CheckRotated(f, 4, 1, 64, 21, 0.5f, mixed, true, seed++, /*fast=*/true);
    CheckRotated(f, 8, 2, 128, 0, 30.0f, mixed, false, seed++, /*fast=*/true);
  }
}

// The CUDA backend takes the rotated formats and refuses q8's unrotated codes.
TEST(CudaKvCodesTest, PageFormats) {
  GZ_SKIP_WITHOUT_CUDA();
  auto backend = MakeBackend(false);
  for (KvFormat f : AllKvFormats()) {
    EXPECT_EQ(backend->SupportsKvFormat(f), f != KvFormat::kQ8) << KvFormatName(f);
  }
  EXPECT_EQ(*ChooseKvFormat("8/4", *backend), RotatedKv(8, 4));
  EXPECT_EQ(*ChooseKvFormat("q8", *backend), RotatedKv(8, 8));
}

}  // namespace
}  // namespace gizllm::testing
