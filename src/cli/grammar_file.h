// The grammar of a --json-schema or --grammar file, or of a --regex, over a model's tokens (run,
// bench).
#pragma once

#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "core/status.h"
#include "grammar/json_schema.h"
#include "grammar/regex.h"
#include "grammar/token_mask.h"
#include "tokenizer/tokenizer.h"

namespace gizllm::cli {

// None when no file and no regex is given; an error naming the command when more than one is, or
// naming the file (and for a schema, the schema path) or the regex's position when it cannot be
// read or compiled. `regex`: the text of a regular expression the whole answer matches.
inline Expected<std::shared_ptr<const TokenGrammar>> LoadGrammarFile(
    const std::string& command, const std::string& json_schema, const std::string& gbnf,
    const Tokenizer& tokenizer, int64_t vocab, const std::string& regex = "") {
  const int given = !json_schema.empty() + !gbnf.empty() + !regex.empty();
  if (given == 0) return std::shared_ptr<const TokenGrammar>();
  if (given > 1) {
    return InvalidArgument(command + ": give one of --json-schema, --grammar and --regex");
  }
  Expected<Grammar> g = Grammar();
  if (!regex.empty()) {
    g = RegexGrammar(regex);
    if (!g.ok()) return g.status().Annotate("--regex");
  } else {
    const std::string& path = json_schema.empty() ? gbnf : json_schema;
    std::ifstream in(path, std::ios::binary);
    if (!in) return NotFound(path + ": cannot read");
    std::stringstream text;
    text << in.rdbuf();
    g = json_schema.empty() ? ParseGbnf(text.str(), path) : JsonSchemaGrammar(text.str());
    if (!g.ok()) return json_schema.empty() ? g.status() : g.status().Annotate(path);
  }
  auto vocabulary =
      std::make_shared<const TokenVocabulary>(TokenVocabulary::FromTokenizer(tokenizer, vocab));
  return std::make_shared<const TokenGrammar>(
      TokenGrammar{std::make_shared<const Grammar>(std::move(*g)), std::move(vocabulary)});
}

}  // namespace gizllm::cli
