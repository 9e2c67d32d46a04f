#include "tokenizer/added_tokens.h"

#include <algorithm>

#include "tokenizer/unicode.h"

namespace gizllm::tok {

void TokenMatcher::Add(std::string_view text, int32_t token) {
  if (text.empty()) return;
  int32_t node = 0;
  for (unsigned char b : text) {
    const PairMap::Value* e = edges_.Get(node, b);
    if (e != nullptr) {
      node = e->id;
    } else {
      edges_.Set(node, b, {0, nodes_});
      terminal_.push_back(-1);
      node = nodes_++;
    }
  }
  if (terminal_[node] < 0) terminal_[node] = token;
  unsigned char b = static_cast<unsigned char>(text[0]);
  first_[b >> 6] |= 1ull << (b & 63);
}

int32_t TokenMatcher::LongestAt(std::string_view text, size_t pos, size_t* length) const {
  int32_t node = 0, best = -1;
  for (size_t i = pos; i < text.size(); ++i) {
    const PairMap::Value* e = edges_.Get(node, static_cast<unsigned char>(text[i]));
    if (e == nullptr) break;
    node = e->id;
    if (terminal_[node] >= 0) {
      best = terminal_[node];
      *length = i + 1 - pos;
    }
  }
  return best;
}

namespace {

bool EndsWithWord(std::string_view s) { return !s.empty() && IsWordChar(LastCodePoint(s)); }

bool StartsWithWord(std::string_view s) {
  if (s.empty()) return false;
  size_t i = 0;
  return IsWordChar(NextCodePoint(s, &i));
}

// Start of the whitespace run that ends `s`.
size_t WhitespaceRunStart(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t i = end - 1;
    while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
    size_t k = i;
    if (!IsWhitespace(NextCodePoint(s, &k))) break;
    end = i;
  }
  return end;
}

// Length of the whitespace run that starts `s`.
size_t WhitespaceRunLength(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t k = i;
    if (!IsWhitespace(NextCodePoint(s, &k))) break;
    i = k;
  }
  return i;
}

}  // namespace

void SplitAddedTokens(const TokenMatcher& matcher, const std::vector<AddedToken>& tokens,
                      std::vector<Piece>* pieces) {
  if (matcher.empty()) return;
  std::vector<Piece> out;
  out.reserve(pieces->size() + 4);
  for (Piece& piece : *pieces) {
    if (piece.id >= 0) {
      out.push_back(std::move(piece));
      continue;
    }
    std::string_view text = piece.text;
    size_t done = 0;  // text before this offset is already in `out`
    auto emit_text = [&](size_t s, size_t e) {
      if (e <= s) return;
      Piece p;
      p.text.assign(text.substr(s, e - s));
      p.at_start = piece.at_start && s == 0;
      out.push_back(std::move(p));
    };
    size_t pos = 0;
    while (pos < text.size()) {
      if (!matcher.MayStart(static_cast<unsigned char>(text[pos]))) {
        ++pos;
        continue;
      }
      size_t length = 0;
      int32_t k = matcher.LongestAt(text, pos, &length);
      if (k < 0) {
        ++pos;
        continue;
      }
      const AddedToken& t = tokens[k];
      size_t start = pos, stop = pos + length;
      pos = stop;  // matches do not overlap, even when this one is discarded
      if (t.single_word) {
        bool start_space = start == 0 || !EndsWithWord(text.substr(0, start));
        bool stop_space = stop == text.size() || !StartsWithWord(text.substr(stop));
        if (!start_space || !stop_space) continue;
      }
      if (t.lstrip) start = std::max(WhitespaceRunStart(text.substr(0, start)), done);
      if (t.rstrip) stop += WhitespaceRunLength(text.substr(stop));
      emit_text(done, start);
      Piece p;
      p.text.assign(text.substr(start, stop - start));
      p.id = t.id;
      out.push_back(std::move(p));
      // The search goes on after the match itself, even when rstrip took more (as Hugging Face).
      done = stop;
    }
    emit_text(done, text.size());
  }
  *pieces = std::move(out);
}

}  // namespace gizllm::tok
