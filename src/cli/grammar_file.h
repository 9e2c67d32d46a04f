// The grammar of a --json-schema or --grammar file over a model's tokens (run, bench).
#pragma once

#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "core/status.h"
#include "grammar/json_schema.h"
#include "grammar/token_mask.h"
#include "tokenizer/tokenizer.h"

namespace gizllm::cli {

// None when neither file is given; an error naming the command when both are, or naming the file
// (and for a schema, the schema path) when it cannot be read or compiled.
inline Expected<std::shared_ptr<const TokenGrammar>> LoadGrammarFile(
    const std::string& command, const std::string& json_schema, const std::string& gbnf,
    const Tokenizer& tokenizer, int64_t vocab) {
  if (json_schema.empty() && gbnf.empty()) return std::shared_ptr<const TokenGrammar>();
  if (!json_schema.empty() && !gbnf.empty()) {
    return InvalidArgument(command + ": give --json-schema or --grammar, not both");
  }
  const std::string& path = json_schema.empty() ? gbnf : json_schema;
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound(path + ": cannot read");
  std::stringstream text;
  text << in.rdbuf();
  Expected<Grammar> g =
      json_schema.empty() ? ParseGbnf(text.str(), path) : JsonSchemaGrammar(text.str());
  if (!g.ok()) return json_schema.empty() ? g.status() : g.status().Annotate(path);
  auto vocabulary =
      std::make_shared<const TokenVocabulary>(TokenVocabulary::FromTokenizer(tokenizer, vocab));
  return std::make_shared<const TokenGrammar>(
      TokenGrammar{std::make_shared<const Grammar>(std::move(*g)), std::move(vocabulary)});
}

}  // namespace gizllm::cli
