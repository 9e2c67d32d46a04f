// The models of tokenizer.json: BPE (byte-level and SentencePiece-style), WordPiece, Unigram.
#pragma once

#include <memory>
#include <string>

#include "tokenizer/components.h"

namespace gizllm::tok {

Expected<std::unique_ptr<Model>> MakeBpeModel(const Json& j, const std::string& where);
Expected<std::unique_ptr<Model>> MakeWordPieceModel(const Json& j, const std::string& where);
Expected<std::unique_ptr<Model>> MakeUnigramModel(const Json& j, const std::string& where);

}  // namespace gizllm::tok
