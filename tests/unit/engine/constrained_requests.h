// Requests that mix grammars and free answers over tiny-chat's tokens, for the tests that the
// engine picks the same tokens where the runner picks them under the grammars' masks as where
// the host does (engine_model_test on the CPU backend, cuda_engine_test on the CUDA backend): a
// JSON schema's and a GBNF grammar's answers beside free ones, greedy and seeded sampled.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "grammar/json_schema.h"
#include "grammar/token_mask.h"
#include "tokenizer/tokenizer.h"

namespace gizllm {

// An object of a bounded string, an integer and a short list of bounded strings.
inline constexpr const char* kConstrainedSchema = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 12},
    "age": {"type": "integer"},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3}
  },
  "required": ["name", "age"]
})";
// A line of words after a fixed start, ended by a full stop.
inline constexpr const char* kConstrainedGbnf =
    "root ::= \"answer: \" (\"yes\" | \"no\") \" because\" word{1,8} \".\"\n"
    "word ::= \" \" [a-z]{1,10}\n";

// The schema's grammar (json_schema) or the GBNF's over the tokens of the model in `dir`, vocab
// rows.
inline std::shared_ptr<const TokenGrammar> ConstrainedGrammar(const std::string& dir, int64_t vocab,
                                                              bool json_schema) {
  Expected<Tokenizer> tokenizer = Tokenizer::Load(dir);
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status().message();
  if (!tokenizer.ok()) return nullptr;
  Expected<Grammar> g =
      json_schema ? JsonSchemaGrammar(kConstrainedSchema) : ParseGbnf(kConstrainedGbnf);
  EXPECT_TRUE(g.ok()) << g.status().message();
  if (!g.ok()) return nullptr;
  return std::make_shared<const TokenGrammar>(TokenGrammar{
      std::make_shared<const Grammar>(std::move(*g)),
      std::make_shared<const TokenVocabulary>(TokenVocabulary::FromTokenizer(*tokenizer, vocab))});
}

// 12 requests of random prompts: every third under the schema, every third under the GBNF, the
// rest free; sampled: most of them at temperatures 0.7-1.0 under top-k, top-p and min-p with a
// seed each, else all greedy. The model's stop tokens end them (a constrained one only where its
// text is complete).
inline std::vector<Request> ConstrainedMix(std::shared_ptr<const TokenGrammar> schema,
                                           std::shared_ptr<const TokenGrammar> gbnf, bool sampled) {
  std::mt19937 rng(23);
  std::uniform_int_distribution<int32_t> token(10, 8000);
  std::vector<Request> out;
  for (int i = 0; i < 12; ++i) {
    Request r;
    r.prompt.resize(3 + rng() % 40);
    for (int32_t& t : r.prompt) t = token(rng);
    r.limit = 40 + i;
    r.sampling.temperature = 0.0f;
    if (sampled && i % 4 != 3) {
      r.sampling.temperature = 0.7f + 0.1f * (i % 4);
      r.sampling.top_k = i % 2 ? 40 : 0;
      r.sampling.top_p = i % 5 == 1 ? 0.9f : 1.0f;
      r.sampling.min_p = i % 5 == 2 ? 0.05f : 0.0f;
      r.sampling.seed = 2000 + i;
    }
    if (i % 3 == 0) r.sampling.grammar = schema;
    if (i % 3 == 1) r.sampling.grammar = gbnf;
    out.push_back(r);
  }
  return out;
}

// Whether `tokens` are text the grammar allows (a start of it).
inline bool Allowed(const TokenGrammar& grammar, const std::vector<int32_t>& tokens) {
  TokenMatcher matcher(grammar);
  for (int32_t t : tokens) {
    if (!matcher.Accept(t)) return false;
  }
  return true;
}

}  // namespace gizllm
