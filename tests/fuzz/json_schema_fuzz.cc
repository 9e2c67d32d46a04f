// A JSON Schema compiled to GBNF (JsonSchemaToGbnf), whose output must be GBNF that parses, or a
// message; then a matcher over the text after the NUL.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/check.h"
#include "fuzz_input.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const gizllm::fuzz::Parts parts = gizllm::fuzz::SplitAtNul(gizllm::fuzz::AsText(data, size));
  gizllm::Expected<std::string> gbnf = gizllm::JsonSchemaToGbnf(parts.first);
  if (!gbnf.ok()) {
    CHECK(!gbnf.status().message().empty());
    return 0;
  }
  gizllm::Expected<gizllm::Grammar> g = gizllm::ParseGbnf(*gbnf, "json schema grammar");
  if (!g.ok()) {
    // What the compiler writes always parses; only a schema that refers to itself before any
    // text ($ref cycles) is refused, as left recursion, and one whose bounds together pass the
    // grammar's size.
    CHECK(g.status().message().find("left recursion") != std::string::npos ||
          g.status().message().find("expands to more than") != std::string::npos);
    return 0;
  }
  gizllm::Matcher m(std::make_shared<const gizllm::Grammar>(std::move(*g)));
  gizllm::fuzz::Use(m.Accept(parts.second) + m.Complete());
  return 0;
}
