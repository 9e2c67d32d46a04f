// Jinja chat templates: the input is "template source\0JSON input" (without the NUL, a fixed
// chat with tools and a few variables of each type). The template is parsed and rendered as
// ChatTemplate renders a chat; errors must come back as a Status.
//
// The renderer's work is bounded by the renderer itself (a loop over range(10**9) is the
// template's right); a hang or an out-of-memory the fuzzer finds is a bug of that bound.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "core/check.h"
#include "fuzz_input.h"
#include "template/chat_template.h"

namespace {

using nlohmann::ordered_json;

constexpr std::string_view kDefaultInput = R"~({
  "messages": [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the weather in Paris? Réponds en français 🙂"},
    {"role": "assistant", "content": "", "reasoning_content": "A tool knows.",
     "tool_calls": [{"type": "function", "id": "call_1",
                     "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "{\"celsius\": 21.5}"},
    {"role": "assistant", "content": "It is 21.5 °C."},
    {"role": "user", "content": [{"type": "text", "text": "Thanks!"}]}
  ],
  "tools": [{"type": "function", "function": {"name": "get_weather",
             "description": "Weather of a city", "parameters": {"type": "object",
             "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],
  "add_generation_prompt": true, "enable_thinking": false,
  "s": "Hello World", "n": 7, "f": 2.5, "l": [3, 1, 2], "d": {"b": 1, "a": [1, 2.0, null, true, "x"]},
  "none": null, "t": true
})~";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const gizllm::fuzz::Parts parts = gizllm::fuzz::SplitAtNul(gizllm::fuzz::AsText(data, size));
  static const ordered_json kDefault = ordered_json::parse(kDefaultInput);
  ordered_json input;
  if (parts.split) {
    input = ordered_json::parse(parts.second, nullptr, /*allow_exceptions=*/false);
    if (input.is_discarded() || !input.is_object()) return 0;
  }
  gizllm::Expected<gizllm::ChatTemplate> chat_template =
      gizllm::ChatTemplate::FromString(std::string(parts.first), "<s>", "</s>");
  if (!chat_template.ok()) {
    CHECK(!chat_template.status().message().empty());
    return 0;
  }
  gizllm::Expected<std::string> text = chat_template->Render(parts.split ? input : kDefault);
  if (!text.ok()) CHECK(!text.status().message().empty());
  return 0;
}
