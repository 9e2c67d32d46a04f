// ChatPrompt: the model's prompt of a chat as tokens, with the token positions where its messages
// end (the engine's `mark`: the next turn of the chat starts with these tokens and can reuse the
// slot) and where the system turn with the tools ends (`system_end`: the engine's `shared`, a start
// many chats share).
//
//   GZ_ASSIGN_OR_RETURN(ChatPrompt prompt, ChatPrompt::Render(chat_template, tokenizer, input));
//   engine.Add({.prompt = prompt.tokens, ...}, prompt.mark, std::max(prompt.system_end, 0));
//
// The tokens are always Encode(Render(input)), exactly as the model reads the text. A position is
// given only where the tokens of the text before it are Encode of that text alone (a token
// boundary falls on the offset); elsewhere it is -1.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "template/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace gizllm {

// A piece of a text replaced: the `size` bytes from byte `at` become `text`.
struct TextEdit {
  long at = 0;
  long size = 0;
  std::string text;
};

struct ChatPrompt {
  std::string text;             // the rendered prompt
  std::vector<int32_t> tokens;  // Encode(text) without added special tokens
  // message_ends[i]: the token position where messages[0..i] end; -1 where the render of those
  // messages is not a prefix of `text`, was not asked for, or ends inside a token.
  std::vector<int32_t> message_ends;
  int32_t mark = -1;        // where the chat's messages end (message_ends.back()); -1: unknown
  int32_t system_end = -1;  // where the system turn with the tools ends; -1: unknown or no tools
  // The byte offsets in `text` that message_ends and system_end were looked for at (-1: none), so
  // that Edit can move them.
  std::vector<long> message_offsets;
  long system_offset = -1;

  // Renders `input` (as ChatTemplate::Render takes it) and tokenizes it. last_messages: as in
  // ChatTemplate::RenderWithOffsets, the message ends looked for (each costs a render).
  // answer_start: text the answer starts with, put after the render (the opening of a forced
  // tool call); it is part of `text` and `tokens`, and moves no position.
  static Expected<ChatPrompt> Render(const ChatTemplate& chat_template, const Tokenizer& tokenizer,
                                     const nlohmann::ordered_json& input,
                                     size_t last_messages = SIZE_MAX,
                                     std::string_view answer_start = {});

  // The prompt with `edits` (in order, apart, within `text`) made to its text, which is tokenized
  // whole again; the positions move with the text (one inside an edited piece becomes -1). The
  // model reads text put into a rendered chat this way (a video's timestamps) exactly as the
  // whole text would tokenize, where the piece before it ends included.
  Expected<ChatPrompt> Edit(const Tokenizer& tokenizer, std::span<const TextEdit> edits) const;

  // The tokens of `text` and the token position of each byte offset in `offsets` (-1 where no
  // token boundary falls there, or the offset is outside [0, text.size()]).
  static Expected<std::vector<int32_t>> Tokenize(const Tokenizer& tokenizer,
                                                 const std::string& text,
                                                 const std::vector<long>& offsets,
                                                 std::vector<int32_t>* positions);
};

}  // namespace gizllm
