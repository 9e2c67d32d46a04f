// SentencePiece's precompiled normalizer: a character map (a double-array trie over UTF-8 strings
// and their replacements) stored base64-encoded in tokenizer.json.
#pragma once

#include <memory>
#include <string>

#include "tokenizer/components.h"

namespace gizllm::tok {

Expected<std::unique_ptr<Normalizer>> MakePrecompiledNormalizer(const Json& j,
                                                                const std::string& where);

}  // namespace gizllm::tok
