// Tensor-core tile attention for prompt pieces in the fast mode (fp16 operands, float32
// softmax and accumulators): the work of attention.cu's tile kernel with S = Q K^T and O += P V
// on mma.sync m16n8k16. Exact mode keeps the float32 tile kernel. Both kernels here (the tile
// kernel and the decode kernel below) also read rotated pages of codes (kCodes,
// attention_codes.cu), read back into their fp16 tiles.
//
// A block holds kTileQ query vectors (rows of the step x the query heads of one kv head, as the
// float32 tile kernel groups them) in kWarps warps of 16 vectors. It walks the keys of each run
// of rows of one sequence kTileK at a time: the block reads the tile's float32 keys and values
// from the KV pages, rounds them to fp16 into shared memory (fp16 pages, KvFormat::kF16: copies
// them there as they are, cp.async straight into the fp16 tiles), and each warp multiplies its 16
// query vectors against them and updates its online softmax (flash-attention 2 style: scores
// and probabilities stay in registers, the probabilities are the A operand of P V as they are).
// A warp skips a key tile that none of its vectors can see (causal mask, window), so a causal
// prompt costs half of the full product.
//
// Above head_dim 128 the O fragments alone take HD / 2 registers of a lane (128 at 256), so the
// kernel trades registers for shared memory there: key tiles of 32 (S takes 16 registers, not 32)
// and Q's fragments in shared memory, read by one ldmatrix per k16 step of S, instead of in
// HD / 4 registers. The mma per key and vector are those of the smaller head_dims; the price is
// one more ldmatrix per four mma in S and a rescale of O per 32 keys instead of 64.
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "backend/cuda/kernels.cuh"
#include "backend/cuda/kv_codes.cuh"
#include "backend/cuda/mma.cuh"

namespace gizllm::cuda {
namespace {

constexpr int kMaxGroup = 64;  // query heads per kv head: the float32 tile kernel's limit
constexpr int kPadHalf = 8;    // a shared key row is HD + 8 fp16: conflict-free reads

// Keys per step: eight n8 tiles of S up to head_dim 128, four above it (see the top).
template <int HD>
constexpr int TileK() {
  return HD > 128 ? 32 : 64;
}
// Whether the warps keep Q's fragments in shared memory rather than registers (see the top).
template <int HD>
constexpr bool QInShared() {
  return HD > 128;
}

// Dynamic shared memory of a block: float32 staging and fp16 tiles of keys and values (98 KB
// at head_dim 128), and above 128 the warps' fp16 queries (at 256: 130 KB with 4 warps, 163 KB
// with 8).
template <int HD, int kWarps>
constexpr size_t MmaSharedBytes() {
  constexpr size_t tile = TileK<HD>();
  constexpr size_t row = HD + kPadHalf;
  return 2 * tile * HD * sizeof(float) + 2 * tile * row * 2 +
         (QInShared<HD>() ? static_cast<size_t>(kWarps) * 16 * row * 2 : 0);
}

__device__ __forceinline__ bool Alone(const AttentionParams& p, int64_t r) {
  int32_t slot = p.slots[r];
  return !(r > 0 && p.slots[r - 1] == slot) && !(r + 1 < p.rows && p.slots[r + 1] == slot);
}

// Block (tile of rows, kv head) of kWarps warps, 16 query vectors each; tiles are numbered
// backwards so that the causal prompt's last rows, which see the most keys, start first.
// Registers (about 230 at head_dim 128: O, Q and S fragments) allow 8 warps per multiprocessor
// without spilling: 2 blocks of 4 warps or 1 of 8 (above head_dim 128, shared memory holds one
// block of 4 warps from 224 on).
//
// kHalfPages: the pages hold fp16 keys and values (KvFormat::kF16); every run copies its tiles
// from them straight into the fp16 tiles, two of them in turn (the float32 staging area holds
// the second), with no conversion.
// Float32 pages: k16, v16 (or null): the step's keys and values as fp16, [rows, kv_heads, HD] in
// row order (LaunchRopeKv). A run whose keys [kbegin, kend) were all written in this step (a
// prompt read whole, or the first piece of one) copies its tiles from there in the same way.
// That a run's keys are all in the step is checked at both ends (the rows holding positions
// kbegin and kend - 1 are this slot's); in between it rests on how steps are made: a sequence's
// rows in a step are consecutive rows with consecutive positions.
// kCodes: rotated pages (ops/kv_codes.h; p.q holds the rotated queries, the output stays
// rotated): each tile's codes and {step, min} pairs are copied as they lie (cp.async) into the
// float32 staging area, then read back (kv_codes.cuh) and rounded to fp16 into ks, vs; the copy
// of the next tile runs while the warps multiply this one.
template <int HD, int kWarps, bool kHalfPages, bool kCodes = false>
__global__ void __launch_bounds__(32 * kWarps, 8 / kWarps)
    MmaTileKernel(AttentionParams p, ScoreCap score_cap, int tile_rows, const __half* k16,
                  const __half* v16) {
  static_assert(HD % 32 == 0 && HD <= 256, "head_dim: a multiple of 32 up to 256");
  constexpr int kTileK = TileK<HD>();
  constexpr bool kQShared = QInShared<HD>();
  constexpr int kThreads = 32 * kWarps;
  constexpr int kTileQ = 16 * kWarps;  // query vectors per block: one m16 tile per warp
  constexpr int kSteps = HD / 16;      // k16 steps of S = Q K^T; also n16 pairs of O
  constexpr int kOutTiles = HD / 8;    // n8 tiles of O
  constexpr int kRow = HD + kPadHalf;
  constexpr int kVecs4 = HD / 4;                      // float4 pieces of a key
  constexpr int kLoads = kTileK * kVecs4 / kThreads;  // float4 of K (and of V) per thread
  static_assert(kTileK * kVecs4 % kThreads == 0, "whole float4 pieces per thread");
  extern __shared__ __align__(16) float shared[];
  float* kf = shared;            // [kTileK, HD] the next tile's float32 keys, in flight
  float* vf = kf + kTileK * HD;  // [kTileK, HD] and values
  __half* ks = reinterpret_cast<__half*>(vf + kTileK * HD);  // [kTileK, kRow]
  __half* vs = ks + kTileK * kRow;                           // [kTileK, kRow]
  __half* qs = vs + kTileK * kRow;  // [kWarps, 16, kRow] the warps' queries where kQShared
  __shared__ int32_t s_slot[kTileQ], s_pos[kTileQ], s_first[kTileQ];
  __shared__ bool s_mine[kTileQ];
  __shared__ int64_t s_key_row;    // the step row of a run's key kbegin; -1: not in the step
  __shared__ float s_levels4[16];  // kv::kLevels4 (kCodes)

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int group_heads = p.heads / p.kv_heads;
  const int kv_head = blockIdx.y;
  const int64_t r0 = static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * tile_rows;
  const int rows_here = static_cast<int>(p.rows - r0 < tile_rows ? p.rows - r0 : tile_rows);
  const int vectors = rows_here * group_heads;
  for (int i = threadIdx.x; i < rows_here; i += kThreads) {
    s_slot[i] = p.slots[r0 + i];
    s_pos[i] = p.positions[r0 + i];
    s_first[i] = p.window > 0 ? max(0, s_pos[i] - p.window + 1) : 0;
    s_mine[i] = !Alone(p, r0 + i);
  }
  // A tile of decoding rows only (a batch of decodes) has nothing to do here.
  if (!__syncthreads_or(threadIdx.x < rows_here && s_mine[threadIdx.x])) return;

  // This lane's two query vectors: fragment rows g (half 0) and g + 8 (half 1) of the warp's.
  int vec[2], row[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    vec[h] = warp * 16 + g + 8 * h;
    row[h] = vec[h] < vectors ? vec[h] / group_heads : -1;
  }
  // Q as A fragments, scaled for exp2 and rounded to fp16 once: qf[kk] covers dimensions
  // 16 kk .. 16 kk + 15, register h + 2c holds half h, dimensions 16 kk + 8c + 2t, +1. Where
  // kQShared, the same values go to the warp's rows of qs instead (row = fragment row).
  uint32_t qf[kQShared ? 1 : kSteps][4];
  __half* const q_warp = qs + warp * 16 * kRow;
  const float qscale = p.scale * kLog2e;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float* src = nullptr;
    if (row[h] >= 0) {
      int head = kv_head * group_heads + vec[h] % group_heads;
      src = p.q + ((r0 + row[h]) * p.heads + head) * HD;
    }
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        float2 x = src ? *reinterpret_cast<const float2*>(src + 16 * kk + 8 * c + 2 * t)
                       : make_float2(0.0f, 0.0f);
        const uint32_t packed = PackHalf(x.x * qscale, x.y * qscale);
        if constexpr (kQShared) {
          *reinterpret_cast<uint32_t*>(q_warp + (g + 8 * h) * kRow + 16 * kk + 8 * c + 2 * t) =
              packed;
        } else {
          qf[kk][h + 2 * c] = packed;
        }
      }
    }
  }
  if constexpr (kQShared) __syncwarp();  // the warp's rows of qs are read by all its lanes

  OnlineSoftmax<kOutTiles> softmax;
  softmax.Start();
  // ldmatrix row addresses of K's and V's 16 x 16 blocks (rows = keys), and of Q's in qs
  // (kQShared; rows = query vectors): register i of its ldmatrix is the A fragment's register i.
  const LdMatrixLane k_lane = LdMatrixLaneColumnsFirst(lane);
  const LdMatrixLane v_lane = LdMatrixLaneRowsFirst(lane);
  const LdMatrixLane q_at = LdMatrixLaneRowsFirst(lane);
  const __half* const q_lane = q_warp + q_at.row * kRow + q_at.column;

  // The block's threads copy a key tile's float32 keys and values into kf, vf (cp.async: no
  // registers, the copy of tile i + 1 runs while the warps multiply tile i), and each thread
  // later rounds the very pieces it copied to fp16 into ks, vs. Piece c of a thread is float4
  // i % (HD / 4) of key i / (HD / 4), i = threadIdx.x + c * kThreads: a warp reads whole keys.
  auto fetch = [&](int32_t k0, int32_t kend, const int32_t* pages) {
#pragma unroll
    for (int c = 0; c < kLoads; ++c) {
      int i = threadIdx.x + c * kThreads;
      int32_t j = k0 + i / kVecs4;
      if (j < kend) {
        int64_t page = pages[j / kPage];
        int64_t at = ((page * kPage + j % kPage) * p.kv_heads + kv_head) * HD + i % kVecs4 * 4;
        CpAsync16(kf + 4 * i, static_cast<const float*>(p.cache.keys) + at);
        CpAsync16(vf + 4 * i, static_cast<const float*>(p.cache.values) + at);
      }
    }
    CpAsyncCommit();
  };

  // Runs of rows of one sequence, one after the other.
  int next = 0;
  while (true) {
    int seg = next;
    while (seg < rows_here && !s_mine[seg]) ++seg;
    if (seg >= rows_here) break;
    const int32_t slot = s_slot[seg];
    int seg_end = seg;
    int32_t kbegin = INT32_MAX, kend = 0;
    while (seg_end < rows_here && s_mine[seg_end] && s_slot[seg_end] == slot) {
      kbegin = min(kbegin, s_first[seg_end]);
      kend = max(kend, s_pos[seg_end] + 1);
      ++seg_end;
    }
    next = seg_end;
    // The keys each half of this lane sees in this run ([first, pos]; none: first > pos), and
    // the range any vector of the warp sees.
    int32_t first[2], pos[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      bool in_run = row[h] >= seg && row[h] < seg_end;
      first[h] = in_run ? s_first[row[h]] : INT32_MAX;
      pos[h] = in_run ? s_pos[row[h]] : -1;
    }
    const int32_t warp_first =
        static_cast<int32_t>(__reduce_min_sync(0xffffffffu, min(first[0], first[1])));
    const int32_t warp_last =
        static_cast<int32_t>(__reduce_max_sync(0xffffffffu, max(pos[0], pos[1])));
    // Keys [seen_by_all_from, seen_by_all_to] are visible to every vector of the warp (an empty
    // range where one is not in the run): tiles inside it need no mask.
    const int32_t seen_by_all_from =
        static_cast<int32_t>(__reduce_max_sync(0xffffffffu, max(first[0], first[1])));
    const int32_t seen_by_all_to =
        static_cast<int32_t>(__reduce_min_sync(0xffffffffu, min(pos[0], pos[1])));
    const int32_t* pages = p.table.pages + static_cast<int64_t>(slot) * p.table.max_pages;

    // One tile of keys k0 .. k0 + kTileK - 1, as fp16 in kt_s and vt_s, into the warp's state.
    auto tile = [&](int32_t k0, const __half* kt_s, const __half* vt_s) {
      // Warp-uniform: skip a tile none of the warp's vectors sees.
      if (k0 <= warp_last && k0 + kTileK > warp_first) {
        // S = Q K^T over the tile: s[n] is the C fragment of keys k0 + 8n .. k0 + 8n + 7,
        // B[k][n] = K[key 8n + g][dim k], by one ldmatrix per 16 keys and 16 dimensions.
        float s[kTileK / 8][4];
#pragma unroll
        for (int n = 0; n < kTileK / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < kSteps; ++kk) {
          uint32_t q[4];
          if constexpr (kQShared) {
            LdMatrixX4(q, q_lane + 16 * kk);
          } else {
            q[0] = qf[kk][0], q[1] = qf[kk][1], q[2] = qf[kk][2], q[3] = qf[kk][3];
          }
          AddScores(s, q, kt_s + 16 * kk, kRow, k_lane);
        }
        // Soft-capping (the same for every thread) before the mask, which leaves -inf alone.
        if (score_cap.cap > 0.0f) {
#pragma unroll
          for (int n = 0; n < kTileK / 8; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) s[n][e] = SoftcapScore(s[n][e], score_cap);
          }
        }
        // Mask (warp-uniform: only tiles on the edge of a vector's range), then the online
        // softmax of each half, and O += P V.
        if (k0 < seen_by_all_from || k0 + kTileK - 1 > seen_by_all_to) {
#pragma unroll
          for (int n = 0; n < kTileK / 8; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              int32_t j = k0 + 8 * n + 2 * t + e % 2;
              if (j < first[e / 2] || j > pos[e / 2]) s[n][e] = -INFINITY;
            }
          }
        }
        softmax.Update(s);
        softmax.AddPv(s, vt_s, kRow, v_lane);
      }
    };

    if constexpr (kCodes) {
      // A tile in the staging area: key codes [kTileK, key_bytes], value codes
      // [kTileK, value_bytes], the keys' and values' pairs [kTileK, kGroups * 8] each.
      constexpr int kGroups = HD / 32;
      constexpr int kPairBytes = kGroups * 8;
      const int key_bits = KvKeyBits(p.cache.format), value_bits = KvValueBits(p.cache.format);
      const int key_bytes = HD * key_bits / 8, value_bytes = HD * value_bits / 8;
      auto* const raw = reinterpret_cast<uint8_t*>(kf);
      const int values_at = kTileK * key_bytes;
      const int key_pairs_at = values_at + kTileK * value_bytes;
      const int value_pairs_at = key_pairs_at + kTileK * kPairBytes;
      const auto* keys = static_cast<const uint8_t*>(p.cache.keys);
      const auto* values = static_cast<const uint8_t*>(p.cache.values);
      const auto* key_pairs = reinterpret_cast<const uint8_t*>(p.cache.key_scales);
      const auto* value_pairs = reinterpret_cast<const uint8_t*>(p.cache.value_scales);
      if (threadIdx.x < 16) s_levels4[threadIdx.x] = kv::Level4(static_cast<int>(threadIdx.x));
      // Each part of the tile in 16-byte pieces, a power of two of them per vector (head_dim
      // 64, 128 or 256): key and piece are a shift and a mask of the piece's index. Positions
      // past the run's end are not copied: the read-back writes zeros for them.
      auto fetch_codes = [&](int32_t k0) {
        auto part = [&](const uint8_t* src, int bytes, int at) {
          const int shift = __ffs(bytes / 16) - 1;
          for (int c = threadIdx.x; c < kTileK * bytes / 16; c += kThreads) {
            const int key = c >> shift, piece = c & ((1 << shift) - 1);
            const int32_t j = k0 + key;
            if (j >= kend) continue;
            const int64_t v =
                (static_cast<int64_t>(pages[j / kPage]) * kPage + j % kPage) * p.kv_heads + kv_head;
            CpAsync16(raw + at + key * bytes + piece * 16, src + v * bytes + piece * 16);
          }
        };
        part(keys, key_bytes, 0);
        part(values, value_bytes, values_at);
        part(key_pairs, kPairBytes, key_pairs_at);
        part(value_pairs, kPairBytes, value_pairs_at);
        CpAsyncCommit();
      };
      fetch_codes(kbegin);
      for (int32_t k0 = kbegin; k0 < kend; k0 += kTileK) {
        // Every thread's pieces of tile k0 have landed, and every warp is done with ks, vs.
        CpAsyncWait();
        __syncthreads();
        for (int i = threadIdx.x; i < kTileK * (HD / 8); i += kThreads) {
          const int key = i / (HD / 8), piece = i % (HD / 8);
          uint4 kx = make_uint4(0, 0, 0, 0), vx = kx;
          if (k0 + key < kend) {
            float x[8];
            ReadBack<8>(raw + key * key_bytes,
                        reinterpret_cast<const float*>(raw + key_pairs_at + key * kPairBytes),
                        key_bits, piece, s_levels4, x);
            kx = make_uint4(PackHalf(x[0], x[1]), PackHalf(x[2], x[3]), PackHalf(x[4], x[5]),
                            PackHalf(x[6], x[7]));
            ReadBack<8>(raw + values_at + key * value_bytes,
                        reinterpret_cast<const float*>(raw + value_pairs_at + key * kPairBytes),
                        value_bits, piece, s_levels4, x);
            vx = make_uint4(PackHalf(x[0], x[1]), PackHalf(x[2], x[3]), PackHalf(x[4], x[5]),
                            PackHalf(x[6], x[7]));
          }
          *reinterpret_cast<uint4*>(ks + key * kRow + piece * 8) = kx;
          *reinterpret_cast<uint4*>(vs + key * kRow + piece * 8) = vx;
        }
        __syncthreads();  // ks, vs hold the tile; the staging area is free
        if (k0 + kTileK < kend) fetch_codes(k0 + kTileK);
        tile(k0, ks, vs);
      }
      __syncthreads();  // the tiles are free for the next run
      continue;
    }
    if (!kHalfPages && k16) {
      if (threadIdx.x == 0) {
        const int64_t base = r0 + seg;  // the row of position s_pos[seg]
        const int64_t lo = base - (s_pos[seg] - kbegin), hi = base + (kend - 1 - s_pos[seg]);
        const bool in_step = lo >= 0 && hi < p.rows && p.slots[lo] == slot &&
                             p.positions[lo] == kbegin && p.slots[hi] == slot &&
                             p.positions[hi] == kend - 1;
        s_key_row = in_step ? lo : -1;
      }
      __syncthreads();
    }
    if (kHalfPages || (k16 && s_key_row >= 0)) {
      const int64_t key_row = kHalfPages ? 0 : s_key_row;
      const __half* const k_pages = static_cast<const __half*>(p.cache.keys);
      const __half* const v_pages = static_cast<const __half*>(p.cache.values);
      // Buffer 0: ks, vs; buffer 1: in the float32 staging area (picked by selects, not an
      // indexed array, which would live in local memory).
      __half* const k_alt = reinterpret_cast<__half*>(kf);
      __half* const v_alt = k_alt + kTileK * kRow;
      constexpr int kPieces = HD / 8;  // 16-byte pieces of an fp16 key
      // Pieces per thread, the last round partial where they do not divide (head_dim 160 and
      // 224 over 8 warps).
      constexpr int kTilePieces = kTileK * kPieces;
      constexpr bool kWhole = kTilePieces % kThreads == 0;
      auto fetch16 = [&](int32_t k0, int b) {
#pragma unroll
        for (int c = 0; c < (kTilePieces + kThreads - 1) / kThreads; ++c) {
          int i = threadIdx.x + c * kThreads;
          if (!kWhole && i >= kTilePieces) break;
          int key = i / kPieces, piece = i % kPieces;
          int32_t j = k0 + key;
          bool in = j < kend;
          // Where the key is read: its page, or its row of the step's copy (past the run's end:
          // nothing is read, the 16 bytes are zeroed).
          const __half *k_src, *v_src;
          if constexpr (kHalfPages) {
            int64_t page = in ? pages[j / kPage] : 0;
            int64_t at = ((page * kPage + j % kPage) * p.kv_heads + kv_head) * HD + piece * 8;
            k_src = k_pages + at, v_src = v_pages + at;
          } else {
            int64_t at = ((key_row + (j - kbegin)) * p.kv_heads + kv_head) * HD + piece * 8;
            k_src = in ? k16 + at : k16, v_src = in ? v16 + at : v16;
          }
          CpAsync16Fill((b ? k_alt : ks) + key * kRow + piece * 8, k_src, in ? 16 : 0);
          CpAsync16Fill((b ? v_alt : vs) + key * kRow + piece * 8, v_src, in ? 16 : 0);
        }
        CpAsyncCommit();
      };
      fetch16(kbegin, 0);
      int b = 0;
      for (int32_t k0 = kbegin; k0 < kend; k0 += kTileK, b ^= 1) {
        // Tile k0 has landed for every thread, and every warp is done with the tile before it,
        // whose buffer the next copy fills.
        CpAsyncWait();
        __syncthreads();
        if (k0 + kTileK < kend) fetch16(k0 + kTileK, b ^ 1);
        tile(k0, b ? k_alt : ks, b ? v_alt : vs);
      }
      __syncthreads();  // the buffers are free for the next run
      continue;
    }

    if constexpr (kHalfPages) continue;  // (every run took the fp16 copy above)
    fetch(kbegin, kend, pages);
    for (int32_t k0 = kbegin; k0 < kend; k0 += kTileK) {
      // Keys and values k0 .. k0 + kTileK - 1 as fp16; those past the run's end as 0. Then the
      // copy of the next tile starts: kf, vf are free again (each thread reads only its own).
      CpAsyncWait();
      // Above head_dim 128 a few pieces at a time: all of them in flight at once would take
      // registers the O fragments hold.
      constexpr int kUnroll = kQShared ? 2 : kLoads;
#pragma unroll kUnroll
      for (int c = 0; c < kLoads; ++c) {
        int i = threadIdx.x + c * kThreads;
        float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f), b = a;
        if (k0 + i / kVecs4 < kend) {
          a = *reinterpret_cast<const float4*>(kf + 4 * i);
          b = *reinterpret_cast<const float4*>(vf + 4 * i);
        }
        int at = i / kVecs4 * kRow + i % kVecs4 * 4;
        *reinterpret_cast<uint2*>(ks + at) = make_uint2(PackHalf(a.x, a.y), PackHalf(a.z, a.w));
        *reinterpret_cast<uint2*>(vs + at) = make_uint2(PackHalf(b.x, b.y), PackHalf(b.z, b.w));
      }
      __syncthreads();
      if (k0 + kTileK < kend) fetch(k0 + kTileK, kend, pages);
      tile(k0, ks, vs);
      __syncthreads();
    }
  }

  // out = O / l for the vectors of this block's prompt rows.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float sum = softmax.RowSum(h);
    if (row[h] < 0 || !s_mine[row[h]]) continue;
    int head = kv_head * group_heads + vec[h] % group_heads;
    float* dst = p.out + ((r0 + row[h]) * p.heads + head) * HD;
    float inv = 1.0f / sum;
#pragma unroll
    for (int n = 0; n < kOutTiles; ++n) {
      *reinterpret_cast<float2*>(dst + 8 * n + 2 * t) =
          make_float2(softmax.o[n][2 * h] * inv, softmax.o[n][2 * h + 1] * inv);
    }
  }
}

// Bytes per FLOP: a block reads each float32 key and value of its rows' range once for all its
// query vectors, 4 FLOP per vector, key and dimension against 8 bytes: 64 vectors (4 warps) need
// 2 bytes from L2 per 64 FLOP, more than L2 gives at the tensor-core rate; 128 vectors (8
// warps) halve it. 8 warps where that still leaves a block per multiprocessor.
template <int HD, bool kHalfPages, bool kCodes = false>
void Launch(const AttentionParams& p, int sm_count, int warps, cudaStream_t stream, const void* k16,
            const void* v16) {
  int group_heads = p.heads / p.kv_heads;
  static bool raised = [] {
    return cudaFuncSetAttribute(MmaTileKernel<HD, 4, kHalfPages, kCodes>,
                                cudaFuncAttributeMaxDynamicSharedMemorySize,
                                static_cast<int>(MmaSharedBytes<HD, 4>())) == cudaSuccess &&
           cudaFuncSetAttribute(MmaTileKernel<HD, 8, kHalfPages, kCodes>,
                                cudaFuncAttributeMaxDynamicSharedMemorySize,
                                static_cast<int>(MmaSharedBytes<HD, 8>())) == cudaSuccess;
  }();
  (void)raised;
  auto launch = [&](auto kernel, int warps, size_t shared) {
    int tile_rows = 16 * warps / group_heads;
    dim3 grid(static_cast<unsigned>((p.rows + tile_rows - 1) / tile_rows),
              static_cast<unsigned>(p.kv_heads));
    kernel<<<grid, 32 * warps, shared, stream>>>(p, ScoreCapOf(p), tile_rows,
                                                 static_cast<const __half*>(k16),
                                                 static_cast<const __half*>(v16));
    GZ_CUDA_LAUNCHED();
  };
  int64_t big_tiles = (p.rows + 128 / group_heads - 1) / (128 / group_heads) * p.kv_heads;
  // Where a multiprocessor holds only one block of 4 warps (shared memory, head_dim 224 and 256;
  // 228 KB a multiprocessor, 1 KB of it reserved per block, beside 2 KB of static arrays), 4-warp
  // blocks only while they all run at once: past that, 8-warp blocks do the same work in half as
  // many waves.
  constexpr bool kTwoSmallBlocks = 2 * (MmaSharedBytes<HD, 4>() + 3 * 1024) <= 228 * 1024;
  int64_t small_tiles = (p.rows + 64 / group_heads - 1) / (64 / group_heads) * p.kv_heads;
  if (warps == 8 ||
      (warps == 0 && (big_tiles >= sm_count || (!kTwoSmallBlocks && small_tiles > sm_count)))) {
    launch(MmaTileKernel<HD, 8, kHalfPages, kCodes>, 8, MmaSharedBytes<HD, 8>());
  } else {
    launch(MmaTileKernel<HD, 4, kHalfPages, kCodes>, 4, MmaSharedBytes<HD, 4>());
  }
}

// The kernel of the pages' element type (fp16 pages need no step copy: k16, v16 unused).
template <int HD>
void LaunchForPages(const AttentionParams& p, int sm_count, int warps, cudaStream_t stream,
                    const void* k16, const void* v16) {
  if (p.cache.format == KvFormat::kF16) {
    Launch<HD, true>(p, sm_count, warps, stream, nullptr, nullptr);
  } else {
    Launch<HD, false>(p, sm_count, warps, stream, k16, v16);
  }
}

// ---------------------------------------------------------------------------------------------
// Tensor-core decode kernel (fast mode, fp16 pages; kCodes: rotated pages): rows alone in their
// sequence, one block per (row, kv head, split of its keys) as the float32 decode kernel, whose
// parts it writes in the same layout for the same combine kernel.
//
// The products are transposed so that the page fills the tensor core's M side: S^T = K Q^T
// (m16n8k16: the page's 16 keys x 8 query heads, k over head_dim) and O^T += V^T P^T (head_dim
// in m16 tiles x 8 heads, k over the page's 16 keys). The query heads of one kv head (up to 8
// per n8 tile, two tiles up to 16) take the N side; a lane holds HD/16 x 2 registers of Q^T and
// HD/4 floats of O^T per n8 tile, half of what the m16 layout of the tile kernel would take for
// a group of 8 heads or fewer. P^T leaves S^T's C fragments packed to fp16, transposed by
// movmatrix into the B fragments of the second product.
//
// Each warp streams its own pages (page w, w + kWarps, ... of the split) through its own ring
// of kStages padded page stages (cp.async, zero-filled outside the row's range so that a masked
// probability never multiplies a stale value), with its own online softmax; the warps' states
// are merged in shared memory at the end. Per page a warp issues HD/8 mma and HD/8 ldmatrix
// against the float32 kernel's 64 FMA, 32 shuffles and 8 exponentials per lane for 2 keys.

// Transposes an 8 x 8 fp16 matrix across the warp: lane l gives row l / 4, columns 2 (l % 4)
// and + 1, and receives row l / 4 of the transpose (column l / 4 of the original, rows 2 (l % 4)
// and + 1).
__device__ __forceinline__ uint32_t MovMatrixTrans(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

constexpr int kDecodeWarps = 4;

template <int HD>
constexpr int DecodeMmaStages() {
  return HD > 128 ? 2 : 3;
}

// kCodes: a warp's ring holds the pages' codes and {step, min} pairs as they lie (at most
// kPage * 2.5 * HD bytes a page, at 8/8 bits), beside one fp16 page they are read back into.
template <int HD>
constexpr size_t DecodeCodesPageBytes() {
  return static_cast<size_t>(kPage) * (2 * HD + 2 * (HD / 32) * 8);
}
template <int HD, int GN, bool kCodes = false>
constexpr size_t DecodeMmaSharedBytes() {
  constexpr size_t page16 = 2 * kPage * (HD + kPadHalf) * sizeof(__half);
  constexpr size_t ring =
      kDecodeWarps * (kCodes ? DecodeMmaStages<HD>() * DecodeCodesPageBytes<HD>() + page16
                             : DecodeMmaStages<HD>() * page16);
  constexpr size_t merge = static_cast<size_t>(kDecodeWarps) * 8 * GN * (HD + 2) * sizeof(float);
  return ring > merge ? ring : merge;
}

// kCodes: rotated pages (ops/kv_codes.h; p.q holds the rotated queries, the output stays
// rotated). The warp's ring takes its pages' codes and pairs (cp.async, zero-filled outside the
// row's range, so that those positions read back as 0); each page is read back (kv_codes.cuh) into
// the warp's one fp16 page, which the products then read as they read an fp16 page.
template <int HD, int GN, bool kCodes = false>
__global__ void __launch_bounds__(32 * kDecodeWarps)
    MmaDecodeKernel(AttentionParams p, ScoreCap score_cap, int splits,
                    float* part_acc,   // [rows, heads, splits, HD] when splits > 1
                    float* part_ml) {  // [rows, heads, splits, 2] (max, sum) when splits > 1
  constexpr int kStages = DecodeMmaStages<HD>();
  constexpr int kRow = HD + kPadHalf;
  constexpr int kSteps = HD / 16;               // k16 steps of S^T; m16 tiles of O^T
  constexpr int kPieces = HD / 8;               // 16-byte pieces of a key
  constexpr int kPagePieces = kPage * kPieces;  // of a page's keys (and of its values)
  static_assert(kPagePieces % 32 == 0, "whole rounds of a warp's copy");
  constexpr int kStageHalves = 2 * kPage * kRow;  // keys, then values
  constexpr int kCodesPage = static_cast<int>(DecodeCodesPageBytes<HD>());
  constexpr int kPairBytes = HD / 32 * 8;  // a vector's {step, min} pairs
  extern __shared__ __align__(16) float shared[];
  __shared__ float s_levels4[16];  // kv::kLevels4 (kCodes)

  AllowDependentLaunch();
  WaitForPriorGrid();
  const int64_t r = blockIdx.x;
  if (!Alone(p, r)) return;
  if constexpr (kCodes) {
    if (threadIdx.x < 16) s_levels4[threadIdx.x] = kv::Level4(static_cast<int>(threadIdx.x));
    __syncthreads();
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int group_heads = p.heads / p.kv_heads;
  const int kv_head = blockIdx.y;
  const int head0 = kv_head * group_heads;
  const int split = blockIdx.z;
  const int32_t slot = p.slots[r];
  const int32_t position = p.positions[r];
  const int32_t first = p.window > 0 ? max(0, position - p.window + 1) : 0;
  const int32_t first_page = first / kPage;
  const int32_t row_pages = position / kPage - first_page + 1;
  const int32_t split_pages = (row_pages + splits - 1) / splits;
  const int32_t page0 = first_page + split * split_pages;
  const int32_t stages = max(0, min(split_pages, row_pages - split * split_pages));
  const int32_t begin = max(first, page0 * kPage);
  const int32_t end = min(position + 1, (page0 + stages) * kPage);
  const int32_t* pages = p.table.pages + static_cast<int64_t>(slot) * p.table.max_pages;
  // This warp's pages of the split: u = warp, warp + kDecodeWarps, ...
  const int32_t mine = stages > warp ? (stages - warp + kDecodeWarps - 1) / kDecodeWarps : 0;

  __half* const ring = reinterpret_cast<__half*>(shared) + warp * kStages * kStageHalves;
  const __half* const k_pages = static_cast<const __half*>(p.cache.keys);
  const __half* const v_pages = static_cast<const __half*>(p.cache.values);
  // kCodes: the warp's ring of code pages [kStages, kCodesPage] (key codes [kPage, key_bytes],
  // value codes [kPage, value_bytes], the keys' and values' pairs [kPage, kPairBytes] each),
  // then its fp16 page [2, kPage, kRow].
  uint8_t* const codes_ring = reinterpret_cast<uint8_t*>(shared) +
                              warp * (kStages * kCodesPage + kStageHalves * sizeof(__half));
  __half* const page16 = reinterpret_cast<__half*>(codes_ring + kStages * kCodesPage);
  const int key_bits = KvKeyBits(p.cache.format), value_bits = KvValueBits(p.cache.format);
  const int key_bytes = HD * key_bits / 8, value_bytes = HD * value_bits / 8;
  const int values_at = kPage * key_bytes;
  const int key_pairs_at = values_at + kPage * value_bytes;
  const int value_pairs_at = key_pairs_at + kPage * kPairBytes;
  // The warp's i-th page into stage i % kStages; keys outside [begin, end) zero-filled.
  auto issue = [&](int32_t i) {
    if (kCodes && i < mine) {
      const int32_t pn = page0 + warp + i * kDecodeWarps;
      const int64_t v0 = static_cast<int64_t>(__ldg(pages + pn)) * kPage * p.kv_heads + kv_head;
      uint8_t* dst = codes_ring + (i % kStages) * kCodesPage;
      // A part of each vector in 16-byte pieces, a power of two of them (head_dim 64, 128 or
      // 256): position and piece are a shift and a mask of the piece's index.
      auto part = [&](const void* src, int bytes, int at) {
        const int shift = __ffs(bytes / 16) - 1;
        for (int c = lane; c < kPage * bytes / 16; c += 32) {
          const int o = c >> shift, piece = c & ((1 << shift) - 1);
          const int32_t j = pn * kPage + o;
          const bool in = j >= begin && j < end;
          const uint8_t* from = static_cast<const uint8_t*>(src) +
                                (in ? (v0 + static_cast<int64_t>(o) * p.kv_heads) * bytes : 0) +
                                piece * 16;
          CpAsync16Fill(dst + at + o * bytes + piece * 16, from, in ? 16 : 0);
        }
      };
      part(p.cache.keys, key_bytes, 0);
      part(p.cache.values, value_bytes, values_at);
      part(p.cache.key_scales, kPairBytes, key_pairs_at);
      part(p.cache.value_scales, kPairBytes, value_pairs_at);
    } else if (!kCodes && i < mine) {
      const int32_t pn = page0 + warp + i * kDecodeWarps;
      const int64_t page = __ldg(pages + pn);
      __half* dst = ring + (i % kStages) * kStageHalves;
#pragma unroll
      for (int c = 0; c < kPagePieces / 32; ++c) {
        const int piece = lane + 32 * c;
        const int o = piece / kPieces, d = piece % kPieces * 8;
        const int32_t j = pn * kPage + o;
        const bool in = j >= begin && j < end;
        const int64_t at = in ? ((page * kPage + o) * p.kv_heads + kv_head) * HD + d : 0;
        CpAsync16Fill(dst + o * kRow + d, k_pages + at, in ? 16 : 0);
        CpAsync16Fill(dst + kPage * kRow + o * kRow + d, v_pages + at, in ? 16 : 0);
      }
    }
    CpAsyncCommit();  // every lane, every call: the group count stays uniform
  };
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) issue(i);

  // Q^T as B fragments (scaled for exp2, rounded to fp16): qb[n][kk][0] = Q[head 8n + g][16 kk
  // + 2t, + 1], qb[n][kk][1] = the same 8 dimensions on.
  uint32_t qb[GN][kSteps][2];
  const float qscale = p.scale * kLog2e;
#pragma unroll
  for (int n = 0; n < GN; ++n) {
    const int h = 8 * n + g;
    const float* src = h < group_heads ? p.q + (r * p.heads + head0 + h) * HD : nullptr;
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        float2 x = src ? *reinterpret_cast<const float2*>(src + 16 * kk + 8 * c + 2 * t)
                       : make_float2(0.0f, 0.0f);
        qb[n][kk][c] = PackHalf(x.x * qscale, x.y * qscale);
      }
    }
  }
  // O^T fragments: o[n][d][0..1] = O[heads 8n + 2t, + 1][dim 16 d + g], [2..3] dim + 8.
  float o[GN][kSteps][4];
#pragma unroll
  for (int n = 0; n < GN; ++n)
#pragma unroll
    for (int d = 0; d < kSteps; ++d) o[n][d][0] = o[n][d][1] = o[n][d][2] = o[n][d][3] = 0.0f;
  float m[GN][2], l[GN][2];  // per head 8n + 2t + e: running max (log2 units), lane's sum
#pragma unroll
  for (int n = 0; n < GN; ++n) m[n][0] = m[n][1] = -INFINITY, l[n][0] = l[n][1] = 0.0f;

  // ldmatrix addresses (rows = keys): K as the A fragment of S^T (not transposed), V as the A
  // fragment of O^T = V^T (transposed).
  const LdMatrixLane k_lane = LdMatrixLaneRowsFirst(lane);
  const LdMatrixLane v_lane = LdMatrixLaneColumnsFirst(lane);

  for (int32_t i = 0; i < mine; ++i) {
    CpAsyncWait<kStages - 2>();
    __syncwarp();  // every lane's copies of page i are visible; page i - 1's stage is free
    issue(i + kStages - 1);
    const __half* ks = ring + (i % kStages) * kStageHalves;
    const __half* vs = ks + kPage * kRow;
    if constexpr (kCodes) {
      // Page i read back into the fp16 page (free: every lane is past page i - 1's products).
      const uint8_t* raw = codes_ring + (i % kStages) * kCodesPage;
      for (int x = lane; x < kPage * (HD / 8); x += 32) {
        const int key = x / (HD / 8), piece = x % (HD / 8);
        float e[8];
        ReadBack<8>(raw + key * key_bytes,
                    reinterpret_cast<const float*>(raw + key_pairs_at + key * kPairBytes), key_bits,
                    piece, s_levels4, e);
        *reinterpret_cast<uint4*>(page16 + key * kRow + piece * 8) = make_uint4(
            PackHalf(e[0], e[1]), PackHalf(e[2], e[3]), PackHalf(e[4], e[5]), PackHalf(e[6], e[7]));
        ReadBack<8>(raw + values_at + key * value_bytes,
                    reinterpret_cast<const float*>(raw + value_pairs_at + key * kPairBytes),
                    value_bits, piece, s_levels4, e);
        *reinterpret_cast<uint4*>(page16 + (kPage + key) * kRow + piece * 8) = make_uint4(
            PackHalf(e[0], e[1]), PackHalf(e[2], e[3]), PackHalf(e[4], e[5]), PackHalf(e[6], e[7]));
      }
      __syncwarp();
      ks = page16;
      vs = page16 + kPage * kRow;
    }
    const int32_t pos0 = (page0 + warp + i * kDecodeWarps) * kPage;
    // S^T = K Q^T: s[n][0..1] = S[heads 8n + 2t, + 1][key g], s[n][2..3] the same for key g + 8.
    float s[GN][4];
#pragma unroll
    for (int n = 0; n < GN; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk) {
      uint32_t a[4];
      LdMatrixX4(a, ks + k_lane.row * kRow + 16 * kk + k_lane.column);
#pragma unroll
      for (int n = 0; n < GN; ++n) Mma(s[n], a, qb[n][kk][0], qb[n][kk][1]);
    }
    const bool in0 = pos0 + g >= begin && pos0 + g < end;
    const bool in1 = pos0 + g + 8 >= begin && pos0 + g + 8 < end;
    uint32_t pb[GN][2];  // P^T as B fragments of O^T's product
#pragma unroll
    for (int n = 0; n < GN; ++n) {
      float pr[4];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float x0 = s[n][e], x1 = s[n][2 + e];
        if (score_cap.cap > 0.0f)
          x0 = SoftcapScore(x0, score_cap), x1 = SoftcapScore(x1, score_cap);
        x0 = in0 ? x0 : -INFINITY;
        x1 = in1 ? x1 : -INFINITY;
        float mx = fmaxf(x0, x1);
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
        const float m_new = fmaxf(m[n][e], mx);
        // A head that has seen nothing visible yet keeps m = -inf, l = 0, o = 0.
        const float corr = m_new == -INFINITY ? 1.0f : exp2f(m[n][e] - m_new);
        const float p0 = m_new == -INFINITY ? 0.0f : exp2f(x0 - m_new);
        const float p1 = m_new == -INFINITY ? 0.0f : exp2f(x1 - m_new);
        l[n][e] = l[n][e] * corr + p0 + p1;
        m[n][e] = m_new;
        pr[e] = p0, pr[2 + e] = p1;
#pragma unroll
        for (int d = 0; d < kSteps; ++d) o[n][d][e] *= corr, o[n][d][2 + e] *= corr;
      }
      pb[n][0] = MovMatrixTrans(PackHalfInRange(pr[0], pr[1]));  // keys 0..7
      pb[n][1] = MovMatrixTrans(PackHalfInRange(pr[2], pr[3]));  // keys 8..15
    }
    // O^T += V^T P^T over the page's 16 keys.
#pragma unroll
    for (int d = 0; d < kSteps; ++d) {
      uint32_t a[4];
      LdMatrixX4Trans(a, vs + v_lane.row * kRow + 16 * d + v_lane.column);
#pragma unroll
      for (int n = 0; n < GN; ++n) Mma(o[n][d], a, pb[n][0], pb[n][1]);
    }
  }
  // Merge the warps: the rings become [warp][head][HD + 2] (O, then max and sum).
  CpAsyncWait<0>();
  __syncthreads();
  float* merge = shared;
  constexpr int kHeads = 8 * GN;
#pragma unroll
  for (int n = 0; n < GN; ++n) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float sum = l[n][e];
      sum += __shfl_xor_sync(0xffffffffu, sum, 4);
      sum += __shfl_xor_sync(0xffffffffu, sum, 8);
      sum += __shfl_xor_sync(0xffffffffu, sum, 16);
      float* at = merge + (warp * kHeads + 8 * n + 2 * t + e) * (HD + 2);
#pragma unroll
      for (int d = 0; d < kSteps; ++d)
        at[16 * d + g] = o[n][d][e], at[16 * d + g + 8] = o[n][d][2 + e];
      if (g == 0) at[HD] = m[n][e], at[HD + 1] = sum;
    }
  }
  __syncthreads();
  for (int x = threadIdx.x; x < group_heads * HD; x += 32 * kDecodeWarps) {
    const int h = x / HD, d = x % HD;
    float mm = -INFINITY;
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) mm = fmaxf(mm, merge[(w * kHeads + h) * (HD + 2) + HD]);
    float ll = 0.0f, a = 0.0f;
    if (mm != -INFINITY) {
#pragma unroll
      for (int w = 0; w < kDecodeWarps; ++w) {
        const float* at = merge + (w * kHeads + h) * (HD + 2);
        const float wt = exp2f(at[HD] - mm);
        ll += wt * at[HD + 1];
        a += wt * at[d];
      }
    }
    const int64_t head = head0 + h;
    if (splits == 1) {
      p.out[(r * p.heads + head) * HD + d] = a / ll;
    } else {
      const int64_t at = (r * p.heads + head) * splits + split;
      part_acc[at * HD + d] = a;
      if (d == 0) part_ml[at * 2] = mm, part_ml[at * 2 + 1] = ll;
    }
  }
}

template <int HD, int GN, bool kCodes = false>
int LaunchMmaDecodeFor(const AttentionParams& p, int splits, float* part_acc, float* part_ml,
                       cudaStream_t stream) {
  constexpr size_t shared = DecodeMmaSharedBytes<HD, GN, kCodes>();
  static int resident = [] {
    cudaFuncSetAttribute(MmaDecodeKernel<HD, GN, kCodes>,
                         cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared));
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, MmaDecodeKernel<HD, GN, kCodes>,
                                                      32 * kDecodeWarps, shared) != cudaSuccess ||
        n < 1) {
      n = 1;
    }
    return n;
  }();
  if (splits == 0) return resident;  // asked for the count only
  dim3 grid(static_cast<unsigned>(p.rows), static_cast<unsigned>(p.kv_heads),
            static_cast<unsigned>(splits));
  LaunchDependent(MmaDecodeKernel<HD, GN, kCodes>, grid, dim3(32 * kDecodeWarps), shared, stream, p,
                  ScoreCapOf(p), splits, part_acc, part_ml);
  return resident;
}

template <int HD, bool kCodes = false>
int LaunchMmaDecodeHd(const AttentionParams& p, int splits, float* part_acc, float* part_ml,
                      cudaStream_t stream) {
  // Two n8 tiles of heads only up to head_dim 128 (above it, their O^T would spill).
  if constexpr (HD <= 128) {
    if (p.heads / p.kv_heads > 8)
      return LaunchMmaDecodeFor<HD, 2, kCodes>(p, splits, part_acc, part_ml, stream);
  }
  return LaunchMmaDecodeFor<HD, 1, kCodes>(p, splits, part_acc, part_ml, stream);
}

}  // namespace

bool MmaTileSupported(int heads, int kv_heads, int head_dim) {
  return head_dim % 32 == 0 && head_dim >= 32 && head_dim <= 256 && kv_heads > 0 &&
         heads % kv_heads == 0 && heads / kv_heads <= kMaxGroup;
}

void LaunchMmaTile(const AttentionParams& p, int sm_count, cudaStream_t stream, int warps,
                   const void* k16, const void* v16) {
  switch (p.head_dim) {
    case 32:
      return LaunchForPages<32>(p, sm_count, warps, stream, k16, v16);
    case 64:
      return LaunchForPages<64>(p, sm_count, warps, stream, k16, v16);
    case 96:
      return LaunchForPages<96>(p, sm_count, warps, stream, k16, v16);
    case 128:
      return LaunchForPages<128>(p, sm_count, warps, stream, k16, v16);
    case 160:
      return LaunchForPages<160>(p, sm_count, warps, stream, k16, v16);
    case 192:
      return LaunchForPages<192>(p, sm_count, warps, stream, k16, v16);
    case 224:
      return LaunchForPages<224>(p, sm_count, warps, stream, k16, v16);
    default:
      return LaunchForPages<256>(p, sm_count, warps, stream, k16, v16);
  }
}

void LaunchMmaTileCodes(const AttentionParams& p, int sm_count, cudaStream_t stream, int warps) {
  switch (p.head_dim) {
    case 64:
      return Launch<64, false, true>(p, sm_count, warps, stream, nullptr, nullptr);
    case 128:
      return Launch<128, false, true>(p, sm_count, warps, stream, nullptr, nullptr);
    case 256:
      return Launch<256, false, true>(p, sm_count, warps, stream, nullptr, nullptr);
    default:
      std::fprintf(stderr, "cuda Attention: rotated pages of head_dim %d have no tile kernel\n",
                   p.head_dim);
      std::abort();
  }
}

bool MmaDecodeSupported(const AttentionParams& p) {
  return p.cache.format == KvFormat::kF16 && p.head_dim % 32 == 0 && p.head_dim >= 32 &&
         p.head_dim <= 256 && p.kv_heads > 0 && p.heads % p.kv_heads == 0 &&
         p.heads / p.kv_heads <= (p.head_dim <= 128 ? 16 : 8);
}

bool MmaDecodeCodesSupported(const AttentionParams& p) {
  return (p.head_dim == 64 || p.head_dim == 128 || p.head_dim == 256) && p.kv_heads > 0 &&
         p.heads % p.kv_heads == 0 && p.heads / p.kv_heads <= (p.head_dim <= 128 ? 16 : 8);
}

int LaunchMmaDecodeCodes(const AttentionParams& p, int splits, float* part_acc, float* part_ml,
                         cudaStream_t stream) {
  switch (p.head_dim) {
    case 64:
      return LaunchMmaDecodeHd<64, true>(p, splits, part_acc, part_ml, stream);
    case 128:
      return LaunchMmaDecodeHd<128, true>(p, splits, part_acc, part_ml, stream);
    default:
      return LaunchMmaDecodeHd<256, true>(p, splits, part_acc, part_ml, stream);
  }
}

int LaunchMmaDecode(const AttentionParams& p, int splits, float* part_acc, float* part_ml,
                    cudaStream_t stream) {
  switch (p.head_dim) {
    case 32:
      return LaunchMmaDecodeHd<32>(p, splits, part_acc, part_ml, stream);
    case 64:
      return LaunchMmaDecodeHd<64>(p, splits, part_acc, part_ml, stream);
    case 96:
      return LaunchMmaDecodeHd<96>(p, splits, part_acc, part_ml, stream);
    case 128:
      return LaunchMmaDecodeHd<128>(p, splits, part_acc, part_ml, stream);
    case 160:
      return LaunchMmaDecodeHd<160>(p, splits, part_acc, part_ml, stream);
    case 192:
      return LaunchMmaDecodeHd<192>(p, splits, part_acc, part_ml, stream);
    case 224:
      return LaunchMmaDecodeHd<224>(p, splits, part_acc, part_ml, stream);
    default:
      return LaunchMmaDecodeHd<256>(p, splits, part_acc, part_ml, stream);
  }
}

}  // namespace gizllm::cuda
