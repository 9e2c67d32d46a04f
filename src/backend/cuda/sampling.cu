// Token picking on the device: one block per row of logits, the same steps and order as the host
// Sampler (sampling/sampling.h steps 2b to 5), so that a row picks the same token on either side.
// A row with a grammar's mask reads the tokens it leaves out as -inf, each time it reads the row
// (the row itself stays as the model wrote it).
//
// The host sorts; a block of threads cannot afford to, so each cut is a threshold found by a
// bitwise search over an order-preserving integer key, with passes over the row:
//   - greedy: the largest logit, the lowest id among equals (one pass).
//   - d = logit / temperature - max (float, as the host computes it) and p = exp((double)d): p is
//     strictly increasing in d, so the host's order (p descending, id ascending) is the order of
//     key(d) descending, id ascending.
//   - min-p keeps p >= min_p; top-k keeps the k first in that order: the k-th largest key by a
//     32-step search on counts, and among the keys equal to it the lowest ids by a search on ids;
//     top-p keeps a token while the mass before it is below top_p times the kept mass: the
//     smallest key t whose strictly larger keys hold less than that limit (a search on masses),
//     every key above t, and as many ids at t, lowest first, as the running sum allows.
//   - the draw: u = CounterUniform(seed, index) times the kept mass; the first id, in id order,
//     where the running sum passes it (a block scan over contiguous chunks of ids).
// Sums are in double like the host's; they differ from its sequential sums only in rounding, so a
// token can differ only when a threshold lies within about 1e-16 of a partial sum.
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>

#include "backend/cuda/kernels.cuh"
#include "core/counter_random.h"

namespace gizllm::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;

// Order-preserving map of a float to an unsigned integer (larger float, larger key).
__device__ __forceinline__ uint32_t Key(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

template <typename T>
__device__ T BlockSum(T v, T* shared) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < kWarps ? shared[lane] : T(0);
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ float BlockMax(float v, float* shared) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < kWarps ? shared[lane] : -INFINITY;
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// The larger value, the lower id among equals.
__device__ void BlockArgmax(float& v, int32_t& id, float* sv, int32_t* si) {
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int32_t oi = __shfl_xor_sync(0xffffffffu, id, o);
    if (ov > v || (ov == v && oi < id)) v = ov, id = oi;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) sv[warp] = v, si[warp] = id;
  __syncthreads();
  v = lane < kWarps ? sv[lane] : -INFINITY;
  id = lane < kWarps ? si[lane] : INT32_MAX;
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int32_t oi = __shfl_xor_sync(0xffffffffu, id, o);
    if (ov > v || (ov == v && oi < id)) v = ov, id = oi;
  }
}

// One cut of the order: keys strictly above `above` are kept, and keys equal to it whose id is
// below `below` (top-k and top-p each make one).
struct Cut {
  bool on = false;
  uint32_t above = 0;
  int32_t below = 0;
};

__device__ __forceinline__ bool Passes(const Cut& c, uint32_t key, int32_t id) {
  return !c.on || key > c.above || (key == c.above && id < c.below);
}

// The float whose Key is k.
__device__ __forceinline__ float Unkey(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k);
}

struct Shared {
  float f[kWarps];
  int32_t i[kWarps];
  double d[kWarps];
  unsigned long long u[kWarps];
  unsigned long long count_bins[256];
  double mass_bins[256];
  double scan[kThreads];
};

__global__ void __launch_bounds__(kThreads)
    SampleKernel(int32_t* tokens, const float* logits, const SampleRow* params,
                 const uint64_t* masks, int64_t vocab) {
  __shared__ Shared sh;
  const int64_t r = blockIdx.x;
  const float* raw = logits + r * vocab;
  const SampleRow P = params[r];
  const int tid = threadIdx.x;
  const int32_t n = static_cast<int32_t>(vocab);
  // The row as the host Sampler shapes it after the mask (step 2b): tokens left out read -inf.
  const int64_t words = (vocab + 63) / 64;  // MaskWords(vocab)
  const uint64_t* allowed = P.mask >= 0 ? masks + P.mask * words : nullptr;
  auto x = [&](int32_t i) {
    const float v = raw[i];
    return allowed && !((allowed[i >> 6] >> (i & 63)) & 1) ? -INFINITY : v;
  };

  // A row with a NaN or +inf, or without a finite value, picks kNonFiniteToken as the host
  // Sampler (PickableRow, on the row before the mask); a row with no finite value the mask
  // allows kNoAllowedToken. The first pass over the row notes them (block votes, no extra pass).
  auto unpickable = [&](int bad, int finite, int allowed_finite) {
    if (__syncthreads_or(bad) || !__syncthreads_or(finite)) {
      if (tid == 0) tokens[r] = kNonFiniteToken;
      return true;
    }
    if (!__syncthreads_or(allowed_finite)) {
      if (tid == 0) tokens[r] = kNoAllowedToken;
      return true;
    }
    return false;
  };
  if (P.temperature == 0.0f) {
    float best = -INFINITY;
    int32_t id = INT32_MAX;
    int bad = 0, finite = 0, allowed_finite = 0;
    for (int32_t i = tid; i < n; i += kThreads) {
      const float v = raw[i], xi = x(i);
      bad |= isnan(v) || v == INFINITY;
      finite |= isfinite(v);
      allowed_finite |= isfinite(xi);
      if (id == INT32_MAX || xi > best) best = xi, id = i;  // ascending ids: first is lowest
    }
    if (unpickable(bad, finite, allowed_finite)) return;
    BlockArgmax(best, id, sh.f, sh.i);
    if (tid == 0) tokens[r] = id;
    return;
  }

  // d = x / T - max as the host computes it: the quotients first, then their maximum.
  const float t = P.temperature;
  float m = -INFINITY;
  int bad = 0, finite = 0, allowed_finite = 0;
  for (int32_t i = tid; i < n; i += kThreads) {
    const float v = raw[i], xi = x(i);
    bad |= isnan(v) || v == INFINITY;
    finite |= isfinite(v);
    allowed_finite |= isfinite(xi);
    m = fmaxf(m, __fdiv_rn(xi, t));
  }
  if (unpickable(bad, finite, allowed_finite)) return;
  m = BlockMax(m, sh.f);
  auto key_of = [&](int32_t i) { return Key(__fsub_rn(__fdiv_rn(x(i), t), m)); };
  auto prob_of = [](uint32_t key) { return exp(static_cast<double>(Unkey(key))); };

  // p > 0 and p >= min_p is a floor on the key (d <= 0, so keys lie between Key(-inf) and
  // Key(+0), where p rises with the key): the smallest key that passes, searched in one thread's
  // arithmetic, the same in every thread.
  const double floor = P.min_p > 0.0f ? static_cast<double>(P.min_p) : 0.0;
  uint32_t kmin;
  {
    uint32_t lo = Key(-INFINITY), hi = Key(0.0f);
    while (lo < hi) {
      const uint32_t mid = lo + (hi - lo) / 2;
      const double p = prob_of(mid);
      if (p > 0.0 && p >= floor) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    kmin = lo;
  }

  // Passes over the row; every thread gets each total, so each cut is the same in every thread.
  auto count = [&](auto pred) {
    unsigned long long c = 0;
    for (int32_t i = tid; i < n; i += kThreads) {
      const uint32_t key = key_of(i);
      if (key >= kmin && pred(key, i)) ++c;
    }
    return BlockSum(c, sh.u);
  };
  auto mass = [&](auto pred) {
    double s = 0.0;
    for (int32_t i = tid; i < n; i += kThreads) {
      const uint32_t key = key_of(i);
      if (key >= kmin && pred(key, i)) s += prob_of(key);
    }
    return BlockSum(s, sh.d);
  };
  // The smallest id bound b with `need` of the ids satisfying pred below it (pred picks ties,
  // rare beyond one, so this search seldom runs).
  auto id_bound = [&](unsigned long long need, auto pred) {
    int32_t lo = 1, hi = n;
    while (lo < hi) {
      const int32_t mid = lo + (hi - lo) / 2;
      if (count([&](uint32_t key, int32_t i) { return i < mid && pred(key, i); }) >= need) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    return lo;
  };

  // top-k: the k first in order (key descending, id ascending); the k-th largest key by a radix
  // select over 8-bit digits, high first.
  Cut topk;
  if (P.top_k > 0) {
    const unsigned long long k = static_cast<unsigned long long>(P.top_k);
    if (count([](uint32_t, int32_t) { return true; }) > k) {
      uint32_t prefix = 0;
      unsigned long long rest = k;  // keys still to pass, at and below the current prefix
      for (int shift = 24; shift >= 0; shift -= 8) {
        const uint32_t high = shift == 24 ? 0u : ~0u << (shift + 8);
        for (int b = tid; b < 256; b += kThreads) sh.count_bins[b] = 0;
        __syncthreads();
        // Runs of one bin are added at once: most keys share their high digits, and one
        // shared-memory atomic per key on one address would serialize the whole row.
        int run_bin = -1;
        unsigned long long run_count = 0;
        for (int32_t i = tid; i < n; i += kThreads) {
          const uint32_t key = key_of(i);
          if (key < kmin || (key & high) != prefix) continue;
          const int b = static_cast<int>((key >> shift) & 255);
          if (b != run_bin) {
            if (run_bin >= 0) atomicAdd(&sh.count_bins[run_bin], run_count);
            run_bin = b, run_count = 0;
          }
          ++run_count;
        }
        if (run_bin >= 0) atomicAdd(&sh.count_bins[run_bin], run_count);
        __syncthreads();
        // Every thread walks the 256 bins from the top (the same result everywhere).
        int b = 255;
        for (; b > 0; --b) {
          const unsigned long long c = sh.count_bins[b];
          if (c >= rest) break;
          rest -= c;
        }
        prefix |= static_cast<uint32_t>(b) << shift;
        __syncthreads();
      }
      // prefix is the k-th largest key; `rest` of its ties are kept, lowest ids first.
      const uint32_t kth = prefix;
      topk.on = true;
      topk.above = kth;
      auto tie = [&](uint32_t key, int32_t) { return key == kth; };
      topk.below = count(tie) == rest ? n : id_bound(rest, tie);
    }
  }

  // top-p over what min-p and top-k kept: a token stays while the kept mass before it in order
  // is below top_p times the kept mass. Walking keys down, u is the last key whose larger keys
  // hold less than the limit: a radix select on masses.
  Cut topp;
  if (P.top_p < 1.0f) {
    auto kept_k = [&](uint32_t key, int32_t i) { return Passes(topk, key, i); };
    const double limit = static_cast<double>(P.top_p) * mass(kept_k);
    uint32_t prefix = 0;
    double base = 0.0;  // kept mass of keys above the current prefix's range
    for (int shift = 24; shift >= 0; shift -= 8) {
      const uint32_t high = shift == 24 ? 0u : ~0u << (shift + 8);
      for (int b = tid; b < 256; b += kThreads) sh.count_bins[b] = 0, sh.mass_bins[b] = 0.0;
      __syncthreads();
      int run_bin = -1;  // runs of one bin added at once, as above
      unsigned long long run_count = 0;
      double run_mass = 0.0;
      for (int32_t i = tid; i < n; i += kThreads) {
        const uint32_t key = key_of(i);
        if (key < kmin || (key & high) != prefix || !kept_k(key, i)) continue;
        const int b = static_cast<int>((key >> shift) & 255);
        if (b != run_bin) {
          if (run_bin >= 0) {
            atomicAdd(&sh.mass_bins[run_bin], run_mass);
            atomicAdd(&sh.count_bins[run_bin], run_count);
          }
          run_bin = b, run_count = 0, run_mass = 0.0;
        }
        ++run_count;
        run_mass += prob_of(key);
      }
      if (run_bin >= 0) {
        atomicAdd(&sh.mass_bins[run_bin], run_mass);
        atomicAdd(&sh.count_bins[run_bin], run_count);
      }
      __syncthreads();
      // The last non-empty bin, walking down, whose larger bins hold less than the limit.
      int pick = -1;
      double pick_base = base, run = base;
      for (int b = 255; b >= 0; --b) {
        if (sh.count_bins[b] == 0) continue;
        if (run >= limit) break;
        pick = b, pick_base = run;
        run += sh.mass_bins[b];
      }
      prefix |= static_cast<uint32_t>(pick < 0 ? 0 : pick) << shift;
      base = pick_base;
      __syncthreads();
    }
    // Ties at u = prefix, lowest ids first, while the running mass stays below the limit.
    const uint32_t u = prefix;
    auto tie = [&](uint32_t key, int32_t i) { return key == u && kept_k(key, i); };
    const unsigned long long ties = count(tie);
    const double p_tie = prob_of(u);
    double run = base;
    unsigned long long keep = 0;
    while (keep < ties && run < limit) run += p_tie, ++keep;
    topp.on = true;
    topp.above = u;
    topp.below = keep == ties ? n : id_bound(keep, tie);
  }

  // The draw: the first id, in id order, where the running kept mass passes u * total; ids in
  // contiguous chunks per thread, the chunks' masses scanned.
  auto kept = [&](uint32_t key, int32_t i) { return Passes(topk, key, i) && Passes(topp, key, i); };
  const int32_t chunk = (n + kThreads - 1) / kThreads;
  const int32_t begin = min(n, tid * chunk), end = min(n, begin + chunk);
  double local = 0.0;
  int32_t last = -1;
  for (int32_t i = begin; i < end; ++i) {
    const uint32_t key = key_of(i);
    if (key >= kmin && kept(key, i)) local += prob_of(key), last = i;
  }
  sh.scan[tid] = local;
  __syncthreads();
  if (tid == 0) {
    double run = 0.0;
    for (int j = 0; j < kThreads; ++j) {
      const double v = sh.scan[j];
      sh.scan[j] = run;
      run += v;
    }
    sh.d[0] = run;
  }
  __syncthreads();
  const double target = CounterUniform(P.seed, P.index) * sh.d[0];
  int32_t pick = INT32_MAX;
  if (local > 0.0 && sh.scan[tid] + local > target) {
    double sum = sh.scan[tid];
    for (int32_t i = begin; i < end; ++i) {
      const uint32_t key = key_of(i);
      if (key >= kmin && kept(key, i)) {
        sum += prob_of(key);
        if (sum > target) {
          pick = i;
          break;
        }
      }
    }
  }
  // The lowest crossing; none (rounding at the very end): the last kept id, as the host.
  float neg_pick = pick == INT32_MAX ? -INFINITY : -static_cast<float>(pick);
  BlockArgmax(neg_pick, pick, sh.f, sh.i);
  float last_v = static_cast<float>(last);
  BlockArgmax(last_v, last, sh.f, sh.i);
  if (tid == 0) tokens[r] = pick != INT32_MAX ? pick : last;
}

}  // namespace

void LaunchSample(const SampleParams& p, cudaStream_t stream) {
  if (p.rows == 0) return;
  SampleKernel<<<static_cast<unsigned>(p.rows), kThreads, 0, stream>>>(p.tokens, p.logits, p.params,
                                                                       p.masks, p.vocab);
  GZ_CUDA_LAUNCHED();
}

}  // namespace gizllm::cuda
