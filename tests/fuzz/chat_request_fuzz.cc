// OpenAI chat requests: the input is a POST body, read as the server reads one
// (Session::PrepareChat in server/http_server.cc): JSON, ParseChatRequest, then the chat rendered
// with models/tiny-chat's template and tokenized. The same body also goes through the completion,
// tokenize and detokenize parsers, which share the field readers.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "core/check.h"
#include "fuzz_input.h"
#include "server/openai_request.h"
#include "template/chat_prompt.h"
#include "template/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace {

using nlohmann::json;
using nlohmann::ordered_json;
namespace server = gizllm::server;

struct TinyChat {
  gizllm::Tokenizer tokenizer;
  gizllm::ChatTemplate chat_template;
};

const TinyChat& Model() {
  static const TinyChat* model = [] {
    gizllm::Expected<gizllm::Tokenizer> tokenizer = gizllm::Tokenizer::Load(GIZLLM_TINY_CHAT);
    gizllm::Expected<gizllm::ChatTemplate> chat_template =
        gizllm::ChatTemplate::Load(GIZLLM_TINY_CHAT);
    CHECK(tokenizer.ok() && chat_template.ok());
    return new TinyChat{std::move(*tokenizer), std::move(*chat_template)};
  }();
  return *model;
}

// ChatTextModel::RenderChat (server/real_generator.cc), which lives beside the engine.
gizllm::Expected<gizllm::ChatPrompt> RenderChat(const TinyChat& model,
                                                const server::ChatInput& input) {
  ordered_json request;
  request["messages"] = ordered_json::parse(input.messages.dump());
  if (input.tools.is_array() && !input.tools.empty()) {
    request["tools"] = ordered_json::parse(input.tools.dump());
  }
  request["add_generation_prompt"] = input.add_generation_prompt;
  if (input.enable_thinking) request["enable_thinking"] = *input.enable_thinking;
  return gizllm::ChatPrompt::Render(model.chat_template, model.tokenizer, request,
                                    /*last_messages=*/1, input.answer_prefix);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  Model();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const TinyChat& model = Model();
  json body;
  if (server::ParseBody(gizllm::fuzz::AsText(data, size), &body)) return 0;
  const int32_t vocab = static_cast<int32_t>(model.tokenizer.vocab_size());

  server::ChatRequest chat;
  if (!server::ParseChatRequest(body, vocab, &chat)) {
    if (chat.tool_choice == "function") {
      chat.input.answer_prefix =
          "<tool_call>\n{\"name\": " + json(chat.forced_tool).dump() + ", \"arguments\": ";
    }
    gizllm::Expected<gizllm::ChatPrompt> prompt = RenderChat(model, chat.input);
    if (prompt.ok()) {
      CHECK(prompt->mark <= static_cast<int32_t>(prompt->tokens.size()));
      CHECK(prompt->system_end <= static_cast<int32_t>(prompt->tokens.size()));
    }
  }

  // The same request for a model of the XML tool-call form: its forced call's grammar
  // (ToolCallXmlGbnf) is built from the same hostile tools.
  server::ChatRequest xml_chat;
  (void)server::ParseChatRequest(body, vocab, &xml_chat, gizllm::ToolCallSyntax::kXml);

  server::CompletionRequest completion;
  if (!server::ParseCompletionRequest(body, vocab, &completion) && !completion.prompt_is_tokens) {
    (void)model.tokenizer.Encode(completion.prompt_text);
  }
  server::TokenizeRequest tokenize;
  if (!server::ParseTokenizeRequest(body, &tokenize) && tokenize.chat) {
    (void)RenderChat(model, *tokenize.chat);
  }
  server::DetokenizeRequest detokenize;
  if (!server::ParseDetokenizeRequest(body, vocab, &detokenize)) {
    for (int32_t id : detokenize.tokens) CHECK(id >= 0 && id < vocab);
    (void)model.tokenizer.Decode(detokenize.tokens);
  }
  return 0;
}
