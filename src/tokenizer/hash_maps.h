// Open-addressing hash maps for the tokenizer's hot lookups: token text to id, and a pair of
// token ids to its merge. Built once at load, read concurrently afterwards (no mutation).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace gizllm::tok {

inline uint64_t HashBytes(std::string_view s) {
  // FNV-1a over 8-byte words, then a final mix: fast for short tokens, good enough spread.
  uint64_t h = 0xcbf29ce484222325ull ^ s.size();
  const char* p = s.data();
  size_t n = s.size();
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h = (h ^ w) * 0x100000001b3ull;
    h ^= h >> 29;
    p += 8;
    n -= 8;
  }
  uint64_t w = 0;
  std::memcpy(&w, p, n);
  h = (h ^ w) * 0x100000001b3ull;
  h ^= h >> 32;
  h *= 0xd6e8feb86659fd93ull;
  h ^= h >> 32;
  return h;
}

inline uint64_t HashU64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb3f99ca2ac97ull;
  x ^= x >> 33;
  return x;
}

// Number of `c` in `text`, eight bytes at a time.
inline size_t CountByte(std::string_view text, char c) {
  const uint64_t ones = 0x0101010101010101ull, pattern = ones * static_cast<unsigned char>(c);
  size_t n = 0, i = 0;
  for (; i + 8 <= text.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, text.data() + i, 8);
    uint64_t x = w ^ pattern;  // zero bytes where c is
    // High bit of each zero byte, exactly (no borrow across bytes).
    uint64_t t = ((x & 0x7F7F7F7F7F7F7F7Full) + 0x7F7F7F7F7F7F7F7Full) | x;
    n += __builtin_popcountll(~t & 0x8080808080808080ull);
  }
  for (; i < text.size(); ++i) n += text[i] == c;
  return n;
}

// Token text -> id. Texts live in one arena; each slot holds the hash, id and place of its text,
// so a lookup touches one slot and one arena line.
class StringIdMap {
 public:
  // Reserve before inserting `n` entries of `bytes` bytes in all (optional).
  void Reserve(size_t n, size_t bytes = 0) {
    size_t cap = 16;
    while (cap < n * 2) cap *= 2;
    if (cap > slots_.size()) Rehash(cap);
    arena_.reserve(bytes);
  }

  // Inserts or replaces.
  void Set(std::string_view key, int32_t id) {
    if ((count_ + 1) * 2 > slots_.size()) Rehash(slots_.empty() ? 16 : slots_.size() * 2);
    uint64_t h = HashBytes(key);
    size_t mask = slots_.size() - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
      Slot& s = slots_[i];
      if (s.id < 0) {
        s = {static_cast<uint32_t>(h), id, static_cast<uint32_t>(arena_.size()),
             static_cast<uint32_t>(key.size())};
        arena_.append(key);
        ++count_;
        return;
      }
      if (s.hash32 == static_cast<uint32_t>(h) && KeyOf(s) == key) {
        s.id = id;
        return;
      }
    }
  }

  // -1 if absent.
  int32_t Get(std::string_view key) const { return Get(key, HashBytes(key)); }

  // For batches of lookups: hash all, prefetch all, then Get with the hash.
  void Prefetch(uint64_t h) const {
    if (!slots_.empty()) __builtin_prefetch(&slots_[h & (slots_.size() - 1)]);
  }
  int32_t Get(std::string_view key, uint64_t h) const {
    if (slots_.empty()) return -1;
    size_t mask = slots_.size() - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
      const Slot& s = slots_[i];
      if (s.id < 0) return -1;
      if (s.hash32 == static_cast<uint32_t>(h) && s.size == key.size() &&
          std::memcmp(arena_.data() + s.offset, key.data(), key.size()) == 0) {
        return s.id;
      }
    }
  }

  size_t size() const { return count_; }

  // f(text, id) for every entry, in no particular order.
  template <typename F>
  void ForEach(F&& f) const {
    for (const Slot& s : slots_) {
      if (s.id >= 0) f(KeyOf(s), s.id);
    }
  }

 private:
  struct Slot {
    uint32_t hash32 = 0;
    int32_t id = -1;  // -1: empty
    uint32_t offset = 0, size = 0;
  };

  std::string_view KeyOf(const Slot& s) const {
    return std::string_view(arena_).substr(s.offset, s.size);
  }

  void Rehash(size_t cap) {
    std::vector<Slot> slots(cap);
    size_t mask = cap - 1;
    for (const Slot& s : slots_) {
      if (s.id < 0) continue;
      size_t i = HashBytes(KeyOf(s)) & mask;
      while (slots[i].id >= 0) i = (i + 1) & mask;
      slots[i] = s;
    }
    slots_ = std::move(slots);
  }

  std::string arena_;
  std::vector<Slot> slots_;
  size_t count_ = 0;
};

// (left id, right id) -> (rank, merged id) for BPE merges.
class PairMap {
 public:
  struct Value {
    int32_t rank;
    int32_t id;
  };

  void Reserve(size_t n) {
    size_t cap = 16;
    while (cap < n * 2) cap *= 2;
    Rehash(cap);
  }

  void Set(int32_t left, int32_t right, Value v) {
    if ((count_ + 1) * 2 > slots_.size()) Rehash(slots_.empty() ? 16 : slots_.size() * 2);
    uint64_t key = Key(left, right);
    size_t mask = slots_.size() - 1;
    for (size_t i = HashU64(key) & mask;; i = (i + 1) & mask) {
      Slot& s = slots_[i];
      if (s.key == kEmpty) {
        s.key = key;
        s.value = v;
        ++count_;
        return;
      }
      if (s.key == key) {
        s.value = v;
        return;
      }
    }
  }

  // nullptr if the pair does not merge.
  const Value* Get(int32_t left, int32_t right) const {
    if (slots_.empty()) return nullptr;
    uint64_t key = Key(left, right);
    size_t mask = slots_.size() - 1;
    for (size_t i = HashU64(key) & mask;; i = (i + 1) & mask) {
      const Slot& s = slots_[i];
      if (s.key == key) return &s.value;
      if (s.key == kEmpty) return nullptr;
    }
  }

  size_t size() const { return count_; }

 private:
  static constexpr uint64_t kEmpty = ~0ull;
  struct Slot {
    uint64_t key = kEmpty;
    Value value{};
  };
  static uint64_t Key(int32_t l, int32_t r) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(l)) << 32) | static_cast<uint32_t>(r);
  }
  void Rehash(size_t cap) {
    std::vector<Slot> slots(cap);
    size_t mask = cap - 1;
    for (const Slot& s : slots_) {
      if (s.key == kEmpty) continue;
      size_t i = HashU64(s.key) & mask;
      while (slots[i].key != kEmpty) i = (i + 1) & mask;
      slots[i] = s;
    }
    slots_ = std::move(slots);
  }

  std::vector<Slot> slots_;
  size_t count_ = 0;
};

}  // namespace gizllm::tok
