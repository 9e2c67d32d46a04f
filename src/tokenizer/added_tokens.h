// Added tokens (special tokens and the like) are found in the text before the model sees it:
// leftmost-longest matches, with Hugging Face's single_word, lstrip and rstrip rules.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/components.h"
#include "tokenizer/hash_maps.h"

namespace gizllm::tok {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool single_word = false, lstrip = false, rstrip = false, normalized = false, special = false;
};

// A set of token strings matched leftmost-longest (a byte trie).
class TokenMatcher {
 public:
  void Add(std::string_view text, int32_t token);  // token: index into the added tokens
  bool empty() const { return nodes_ == 1; }
  // The longest token that starts at text[pos], or -1; its length in *length.
  int32_t LongestAt(std::string_view text, size_t pos, size_t* length) const;
  // Whether some token starts with byte b.
  bool MayStart(unsigned char b) const { return (first_[b >> 6] >> (b & 63)) & 1; }

 private:
  PairMap edges_;                      // (node, byte) -> child node (in Value::id)
  std::vector<int32_t> terminal_{-1};  // [nodes_] token ending at a node, or -1
  int32_t nodes_ = 1;
  uint64_t first_[4] = {0, 0, 0, 0};
};

// Splits the pieces with id < 0 at the tokens of `matcher`: matched tokens get their id.
void SplitAddedTokens(const TokenMatcher& matcher, const std::vector<AddedToken>& tokens,
                      std::vector<Piece>* pieces);

}  // namespace gizllm::tok
