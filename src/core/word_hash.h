// WordHash: a 64-bit hash of bytes at memory speed, for keys of large inputs (a picture's rows,
// its encoded bytes): four independent lanes, each taking an 8-byte word with a multiply and a
// rotation (FNV-1a's one dependent multiply a byte took ~80 ms for a 1,024-row picture's rows
// and deepstack features), the tail byte by byte, the lanes folded and mixed at the end. Not a
// cryptographic hash: keys from it stand for inputs a user gives, never for a secret.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace gizllm {

class WordHash {
 public:
  void Mix(const void* data, size_t bytes) {
    const auto* b = static_cast<const uint8_t*>(data);
    size_t i = 0;
    for (; i + 32 <= bytes; i += 32) {
      for (int k = 0; k < 4; ++k) {
        uint64_t w;
        std::memcpy(&w, b + i + 8 * k, 8);
        lane_[k] = std::rotl(lane_[k] + w * kPrime2, 31) * kPrime1;
      }
    }
    for (; i < bytes; ++i) lane_[0] = (lane_[0] ^ b[i]) * 0x100000001b3ull;
  }
  void Mix(uint64_t word) { Mix(&word, sizeof(word)); }
  uint64_t Final() const {
    uint64_t h = std::rotl(lane_[0], 1) + std::rotl(lane_[1], 7) + std::rotl(lane_[2], 12) +
                 std::rotl(lane_[3], 18);
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    return h ^ (h >> 33);
  }

 private:
  static constexpr uint64_t kPrime1 = 0x9e3779b185ebca87ull, kPrime2 = 0xc2b2ae3d27d4eb4full;
  uint64_t lane_[4] = {kPrime1 + kPrime2, kPrime2, 0, 0 - kPrime1};
};

}  // namespace gizllm
