// tokenizer.json: the input is "tokenizer.json text\0text to encode" (without the NUL, a fixed
// text). Loads the tokenizer, encodes the text (alone, with special tokens, as a pair), decodes
// the ids at once and one by one, and decodes ids taken from the text's bytes.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/check.h"
#include "fuzz_input.h"
#include "tokenizer/tokenizer.h"

namespace {

constexpr std::string_view kDefaultText =
    "Hello, world! It's 2024: naïve café — 東京 🙂 <s> [CLS] \t\n  x1 = f(y);";

void Decode(const gizllm::Tokenizer& tokenizer, const std::vector<int32_t>& ids) {
  for (bool skip_special : {false, true}) {
    const std::string text = tokenizer.Decode(ids, skip_special);
    gizllm::StreamDecoder stream(tokenizer, skip_special);
    std::string streamed;
    for (int32_t id : ids) streamed += stream.Push(id);
    streamed += stream.Flush();
    gizllm::fuzz::Use(text.size() + streamed.size());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const gizllm::fuzz::Parts parts = gizllm::fuzz::SplitAtNul(gizllm::fuzz::AsText(data, size));
  gizllm::Expected<gizllm::Tokenizer> tokenizer =
      gizllm::Tokenizer::FromJson(parts.first, "tokenizer.json");
  if (!tokenizer.ok()) return 0;
  const std::string_view text = parts.split ? parts.second : kDefaultText;
  const int64_t vocab = tokenizer->vocab_size();
  CHECK(vocab >= 0);

  for (bool add_special : {false, true}) {
    gizllm::Expected<std::vector<int32_t>> ids = tokenizer->Encode(text, add_special);
    if (!ids.ok()) continue;
    for (int32_t id : *ids) {
      CHECK(id >= 0 && id < vocab);
      tokenizer->IsSpecial(id);
      const std::string token = tokenizer->TokenText(id);
      if (!token.empty()) tokenizer->TokenId(token);
    }
    Decode(*tokenizer, *ids);
  }
  const size_t half = text.size() / 2;
  gizllm::Expected<std::vector<int32_t>> pair =
      tokenizer->EncodePair(text.substr(0, half), text.substr(half), /*add_special=*/true);
  if (pair.ok()) Decode(*tokenizer, *pair);

  // Ids a client may send (/detokenize): any value, also outside the vocabulary.
  std::vector<int32_t> ids;
  for (size_t i = 0; i + 1 < text.size() && ids.size() < 64; i += 2) {
    const int64_t raw = static_cast<uint8_t>(text[i]) << 8 | static_cast<uint8_t>(text[i + 1]);
    ids.push_back(static_cast<int32_t>(raw % 7 != 0 ? raw % (vocab + 2) : raw - 40000));
  }
  Decode(*tokenizer, ids);
  return 0;
}
