// GBNF text into a grammar (ParseGbnf), then a matcher over the text after the NUL, byte by
// byte, with its completion and a copy that takes the rest.
#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/check.h"
#include "fuzz_input.h"
#include "grammar/grammar.h"
#include "grammar/matcher.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const gizllm::fuzz::Parts parts = gizllm::fuzz::SplitAtNul(gizllm::fuzz::AsText(data, size));
  gizllm::Expected<gizllm::Grammar> g = gizllm::ParseGbnf(parts.first);
  if (!g.ok()) {
    CHECK(!g.status().message().empty());
    return 0;
  }
  CHECK(g->root >= 0 && g->root < static_cast<int32_t>(g->rules.size()));
  auto grammar = std::make_shared<const gizllm::Grammar>(std::move(*g));
  gizllm::Matcher m(grammar);
  size_t taken = 0;
  for (char c : parts.second) {
    if (!m.Accept(static_cast<uint8_t>(c))) break;
    ++taken;
  }
  gizllm::fuzz::Use(taken + m.Complete() + m.frames());
  gizllm::Matcher copy = m;
  gizllm::fuzz::Use(copy.Accept(parts.second.substr(taken)));
  return 0;
}
