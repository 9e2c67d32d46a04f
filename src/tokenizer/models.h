// The models of tokenizer.json: BPE (byte-level and SentencePiece-style), WordPiece, WordLevel,
// Unigram.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tokenizer/components.h"
#include "tokenizer/hash_maps.h"

namespace gizllm::tok {

Expected<std::unique_ptr<Model>> MakeBpeModel(const Json& j, const ModelText& text,
                                              const std::string& where);
Expected<std::unique_ptr<Model>> MakeWordPieceModel(const Json& j, const ModelText& text,
                                                    const std::string& where);
Expected<std::unique_ptr<Model>> MakeWordLevelModel(const Json& j, const ModelText& text,
                                                    const std::string& where);
Expected<std::unique_ptr<Model>> MakeUnigramModel(const Json& j, const ModelText& text,
                                                  const std::string& where);

// llama.cpp's SentencePiece-style BPE over a GGUF vocabulary (spm.cc): `tokens` and `scores` by
// id; `known[id]` says whether TokenText and TokenId give the id (merges may form any token);
// unk_id (or -1) stands for bytes the vocabulary has no <0xNN> token for.
std::unique_ptr<Model> MakeSpmModel(std::vector<std::string> tokens, std::vector<float> scores,
                                    std::vector<bool> known, int32_t unk_id);

// {"token": id, ...} -> vocab; *max_id the highest id (-1 when empty). Fails on an id at or past
// IdLimit(entries, added_tokens), so that tables of *max_id + 1 entries stay small.
Status ReadIdObject(std::string_view text, int64_t added_tokens, const std::string& where,
                    StringIdMap* vocab, int32_t* max_id);

}  // namespace gizllm::tok
