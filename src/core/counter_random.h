// Counter-based random numbers: a pure function of (seed, counter), the same on the host and on
// any device (constexpr, so CUDA code calls it too), so a seeded request draws the same numbers
// whichever backend samples it and whatever else runs in its batch.
#pragma once

#include <cstdint>

namespace gizllm {

// SplitMix64's finalizer over seed + (counter + 1) * golden ratio:
//   z = seed + (counter + 1) * 0x9E3779B97F4A7C15
//   z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
//   z = (z ^ (z >> 27)) * 0x94D049BB133111EB
//   return z ^ (z >> 31)
constexpr uint64_t CounterHash(uint64_t seed, uint64_t counter) {
  uint64_t z = seed + (counter + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// A double in [0, 1): the top 53 bits of CounterHash times 2^-53.
constexpr double CounterUniform(uint64_t seed, uint64_t counter) {
  return static_cast<double>(CounterHash(seed, counter) >> 11) * 0x1.0p-53;
}

}  // namespace gizllm
