#include "template/chat_prompt.h"

#include <algorithm>
#include <map>
#include <string_view>

namespace gizllm {

Expected<std::vector<int32_t>> ChatPrompt::Tokenize(const Tokenizer& tokenizer,
                                                    const std::string& text,
                                                    const std::vector<long>& offsets,
                                                    std::vector<int32_t>* positions) {
  GZ_ASSIGN_OR_RETURN(std::vector<int32_t> tokens, tokenizer.Encode(text, /*add_special=*/false));
  const long size = static_cast<long>(text.size());
  std::vector<long> cuts;  // offsets strictly inside the text, in order
  for (long o : offsets) {
    if (o > 0 && o < size) cuts.push_back(o);
  }
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());

  std::map<long, int32_t> at = {{0, 0}, {size, static_cast<int32_t>(tokens.size())}};
  // First the pieces between cuts, each encoded alone: when they add up to the tokens of the
  // whole, every cut is a token boundary. A piece that is not valid UTF-8 alone cannot be.
  std::vector<int32_t> joined;
  std::vector<int32_t> ends;  // [cuts.size()] tokens up to each cut
  bool pieces_agree = true;
  long begin = 0;
  for (size_t i = 0; i <= cuts.size() && pieces_agree; ++i) {
    const long end = i < cuts.size() ? cuts[i] : size;
    Expected<std::vector<int32_t>> piece =
        tokenizer.Encode(std::string_view(text).substr(begin, end - begin), /*add_special=*/false);
    if (!piece.ok()) {
      pieces_agree = false;
      break;
    }
    joined.insert(joined.end(), piece->begin(), piece->end());
    if (i < cuts.size()) ends.push_back(static_cast<int32_t>(joined.size()));
    begin = end;
  }
  if (pieces_agree && joined == tokens) {
    for (size_t i = 0; i < cuts.size(); ++i) at[cuts[i]] = ends[i];
  } else {
    // Some cut falls inside a token (or the tokenizer joins across it): judge each cut by
    // whether the text before it, encoded alone, starts the tokens.
    for (long cut : cuts) {
      Expected<std::vector<int32_t>> start =
          tokenizer.Encode(std::string_view(text).substr(0, cut), /*add_special=*/false);
      if (start.ok() && start->size() <= tokens.size() &&
          std::equal(start->begin(), start->end(), tokens.begin())) {
        at[cut] = static_cast<int32_t>(start->size());
      }
    }
  }
  if (positions != nullptr) {
    positions->clear();
    for (long o : offsets) {
      auto it = at.find(o);
      positions->push_back(it == at.end() ? -1 : it->second);
    }
  }
  return tokens;
}

Expected<ChatPrompt> ChatPrompt::Render(const ChatTemplate& chat_template,
                                        const Tokenizer& tokenizer,
                                        const nlohmann::ordered_json& input, size_t last_messages,
                                        std::string_view answer_start) {
  GZ_ASSIGN_OR_RETURN(RenderedChat rendered, chat_template.RenderWithOffsets(input, last_messages));
  rendered.prompt += answer_start;
  // Offsets -1 (not a prefix) stay -1: Tokenize gives -1 for offsets outside the text.
  std::vector<long> offsets = rendered.message_ends;
  offsets.push_back(rendered.shared_end);
  std::vector<int32_t> positions;
  ChatPrompt out;
  GZ_ASSIGN_OR_RETURN(out.tokens, Tokenize(tokenizer, rendered.prompt, offsets, &positions));
  out.text = std::move(rendered.prompt);
  out.message_offsets = rendered.message_ends;
  out.system_offset = rendered.shared_end;
  out.system_end = positions.back();
  positions.pop_back();
  out.message_ends = std::move(positions);
  if (!out.message_ends.empty()) out.mark = out.message_ends.back();
  return out;
}

Expected<ChatPrompt> ChatPrompt::Edit(const Tokenizer& tokenizer,
                                      std::span<const TextEdit> edits) const {
  const long size = static_cast<long>(text.size());
  long end = 0;  // of the edit before
  for (size_t i = 0; i < edits.size(); ++i) {
    const TextEdit& e = edits[i];
    if (e.at < end || e.size < 0 || e.at + e.size > size) {
      return InvalidArgument("prompt edit " + std::to_string(i) + ": bytes [" +
                             std::to_string(e.at) + ", " + std::to_string(e.at + e.size) +
                             ") are not after the edit before and within the " +
                             std::to_string(size) + " bytes of the prompt");
    }
    end = e.at + e.size;
  }
  ChatPrompt out;
  long from = 0;
  for (const TextEdit& e : edits) {
    out.text.append(text, from, e.at - from);
    out.text += e.text;
    from = e.at + e.size;
  }
  out.text.append(text, from, std::string::npos);
  // An offset at an edit's start stays before its text; one after it moves by what the edits
  // before it added.
  auto move = [&](long offset) -> long {
    if (offset < 0) return offset;
    long moved = offset;
    for (const TextEdit& e : edits) {
      if (offset <= e.at) break;
      if (offset < e.at + e.size) return -1;
      moved += static_cast<long>(e.text.size()) - e.size;
    }
    return moved;
  };
  for (long o : message_offsets) out.message_offsets.push_back(move(o));
  out.system_offset = move(system_offset);
  std::vector<long> offsets = out.message_offsets;
  offsets.push_back(out.system_offset);
  std::vector<int32_t> positions;
  GZ_ASSIGN_OR_RETURN(out.tokens, Tokenize(tokenizer, out.text, offsets, &positions));
  out.system_end = positions.back();
  positions.pop_back();
  out.message_ends = std::move(positions);
  if (!out.message_ends.empty()) out.mark = out.message_ends.back();
  return out;
}

}  // namespace gizllm
