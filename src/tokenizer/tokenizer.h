// Tokenizer: reads a Hugging Face tokenizer.json and turns text into token ids and back, with the
// same ids as Hugging Face tokenizers (normalizer, added and special tokens, pre-tokenizer, model,
// post-processor, decoder).
//
//   GZ_ASSIGN_OR_RETURN(Tokenizer tokenizer, Tokenizer::Load("models/tiny-chat"));
//   GZ_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tokenizer.Encode("Hello", /*add_special=*/true));
//   std::string text = tokenizer.Decode(ids);
//
// All const methods are thread-safe; a Tokenizer is cheap to copy or move (it shares its tables).
// A default-constructed Tokenizer is empty: Encode fails, Decode gives "", vocab_size() is 0.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace gizllm {

class GgufFile;

namespace tok {
struct TokenizerData;
class Model;
}  // namespace tok

// A model's inputs for one text or a pair: the ids and each id's token type (BERT's segment).
struct Encoding {
  std::vector<int32_t> ids;
  std::vector<int32_t> types;  // [ids.size()]
};

class Tokenizer {
 public:
  // path: a tokenizer.json, a folder that holds one, or a .gguf file (FromGguf); a bitgpu folder
  // without tokenizer.json reads its GGUF data file (formats/bitgpu_files.h). Errors name the
  // file and the field.
  static Expected<Tokenizer> Load(const std::string& path);
  // From a GGUF file's tokenizer.ggml.* metadata: tokenizer.ggml.model gpt2 (byte-level BPE)
  // with the pre-tokenizer tokenizer.ggml.pre names (qwen2, llama-bpe, default), or llama
  // (SentencePiece-style BPE with byte fallback, merged in the order of tokenizer.ggml.scores
  // as llama.cpp does; a space prefix where add_space_prefix says); control, unknown and
  // user-defined tokens as added tokens; BOS/EOS added where add_bos_token/add_eos_token say.
  static Expected<Tokenizer> FromGguf(const GgufFile& file);
  // The tokenizer.json text FromGguf reads (convert writes it beside a GGUF's converted weights,
  // so the folder's tokenizer gives the GGUF's ids). For llama vocabularies it is the tokenizer
  // Hugging Face's converter writes (BPE, merges ranked by score); its ids differ from the GGUF's
  // only where tokens share a score (SentencePiece-style ties go to the leftmost pair).
  static Expected<std::string> JsonFromGguf(const GgufFile& file);
  // The same from the text of a tokenizer.json; `name` stands for the file in messages.
  static Expected<Tokenizer> FromJson(std::string_view json, const std::string& name);

  // Token ids of `text`; add_special adds what the post-processor adds (e.g. Llama's BOS).
  // Invalid UTF-8 input is an error, not a crash.
  Expected<std::vector<int32_t>> Encode(std::string_view text, bool add_special = false) const;
  // A pair of texts (sentence-pair models: BERT, RoBERTa), joined as the post-processor says.
  Expected<std::vector<int32_t>> EncodePair(std::string_view a, std::string_view b,
                                            bool add_special = false) const;
  // One text, or a pair where `second` is set, with each id's token type: 0 for the first text's
  // ids, 1 for the second's, and what the post-processor's template gives its special tokens
  // (BERT: [CLS] A [SEP] are 0, B [SEP] 1; RoBERTa: all 0). With max_tokens > 0 the texts are cut
  // first so that at most max_tokens ids come out, special tokens included: one text at its end,
  // a pair as Hugging Face's longest_first truncation; a limit below the special tokens alone is
  // an error.
  Expected<Encoding> EncodeTyped(std::string_view first, std::optional<std::string_view> second,
                                 bool add_special, int64_t max_tokens = 0) const;
  // Text of `ids`; ids that are not in the vocabulary are left out. Invalid UTF-8 that byte
  // tokens produce becomes U+FFFD, as Hugging Face does.
  std::string Decode(std::span<const int32_t> ids, bool skip_special = false) const;

  int32_t TokenId(std::string_view token) const;  // -1 if absent
  // The token's string in the vocabulary (e.g. "Ġhello" in byte-level BPE); empty if absent.
  std::string TokenText(int32_t id) const;
  // The bytes token `id` adds to a text it does not start (a leading space that decoding drops
  // at the start of a text is kept; partial UTF-8 stays as it is): what a grammar reads. An
  // added token's content; empty if absent.
  std::string TokenBytes(int32_t id) const;
  // Highest id + 1 over the model's vocabulary and the added tokens (the embedding rows needed).
  int64_t vocab_size() const;
  bool IsSpecial(int32_t id) const;  // an added token marked special (skipped by skip_special)

 private:
  friend class StreamDecoder;
  // FromJson with `model` in place of the one the JSON describes (when not null).
  static Expected<Tokenizer> FromJsonWithModel(std::string_view json, const std::string& name,
                                               std::unique_ptr<tok::Model> model);
  std::shared_ptr<const tok::TokenizerData> data_;
};

// Decodes one sequence as it is generated: feed ids one by one, get the text they complete. The
// text returned never ends inside a UTF-8 sequence (nor in a U+FFFD that more bytes could still
// turn into a character); Flush returns what is held back at the end.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& t, bool skip_special = false);
  std::string Push(int32_t id);
  std::string Flush();

 private:
  Tokenizer tokenizer_;
  bool skip_special_;
  std::vector<int32_t> ids_;  // ids whose text is not final yet, after `prefix_ids_` context
  size_t prefix_ids_ = 0;     // leading ids of ids_ already emitted (context for the decoder)
  std::string prefix_;        // Decode of the first prefix_ids_ ids of ids_
};

}  // namespace gizllm
