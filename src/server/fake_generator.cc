#include "server/fake_generator.h"

#include <algorithm>
#include <cmath>
#include <thread>

#include "grammar/matcher.h"

namespace gizllm::server {

Expected<std::vector<int32_t>> FakeTextModel::Tokenize(std::string_view text) const {
  std::vector<int32_t> tokens;
  for (unsigned char c : text) tokens.push_back(c);
  return tokens;
}

Expected<std::string> FakeTextModel::Detokenize(std::span<const int32_t> tokens) const {
  std::string text;
  for (int32_t t : tokens) {
    if (t < 0 || t >= 257) return InvalidArgument("token " + std::to_string(t) + " out of range");
    if (t < 256) text += static_cast<char>(t);
  }
  return text;
}

Expected<ChatPrompt> FakeTextModel::RenderChat(const ChatInput& input) const {
  ChatPrompt out;
  std::string& text = out.text;
  if (input.tools.is_array() && !input.tools.empty()) {
    text += (syntax_ == ToolCallSyntax::kXml ? "<|tools:xml|>" : "<|tools|>") + input.tools.dump() +
            "\n";
    out.system_end = static_cast<int32_t>(text.size());
  }
  for (const nlohmann::json& m : input.messages) {
    text += "<|" + m["role"].get<std::string>() + "|>";
    if (m["content"].is_string()) text += m["content"].get<std::string>();
    if (m.contains("tool_calls")) text += m["tool_calls"].dump();
    text += "\n";
    out.message_ends.push_back(static_cast<int32_t>(text.size()));  // a byte is a token
  }
  out.mark = out.message_ends.empty() ? -1 : out.message_ends.back();
  if (input.add_generation_prompt) {
    text += "<|assistant|>";
    // With thinking asked for, the answer starts inside the reasoning, as Qwen3's template does.
    if (input.enable_thinking.value_or(false)) text += "<think>\n";
    text += input.answer_prefix;
  }
  GZ_ASSIGN_OR_RETURN(out.tokens, Tokenize(text));
  return out;
}

std::string FakeGenerator::Answer(std::string_view prompt) {
  if (prompt.find("FOREVER") != std::string_view::npos) return std::string(1 << 16, 'z');
  const bool xml = prompt.find("<|tools:xml|>") != std::string_view::npos;
  const std::string call =
      xml ? "<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
            "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
          : "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
  // A forced call: the prompt ends with the call's tag.
  if (prompt.size() >= 12 && prompt.substr(prompt.size() - 12) == "<tool_call>\n") return call;
  if (prompt.find("CALL") != std::string_view::npos) return "<tool_call>\n" + call;
  if (prompt.find("THINK") != std::string_view::npos) {
    return "<think>\nLet me see.\n</think>\n\nIt is 42.";
  }
  std::string tail(prompt.substr(prompt.size() - std::min<size_t>(8, prompt.size())));
  return "Hello! You said " + tail + ".";
}

Expected<int64_t> FakeGenerator::Add(GenerateRequest request) {
  if (request.prompt.empty()) return InvalidArgument("prompt: empty");
  if (request.limit < 1) return InvalidArgument("limit: must be at least 1");
  Sequence s;
  s.id = next_id_++;
  std::string prompt;
  for (int32_t t : request.prompt) prompt += static_cast<char>(t & 0xFF);
  s.answer = Answer(prompt);
  if (request.sampling.grammar) {
    Matcher matcher(request.sampling.grammar);
    size_t allowed = 0;
    while (allowed < s.answer.size() && matcher.Accept(static_cast<uint8_t>(s.answer[allowed]))) {
      ++allowed;
    }
    s.answer.resize(allowed);
  }
  s.crash = prompt.find("CRASH") != std::string::npos;
  s.random.seed(request.sampling.seed.value_or(std::random_device{}()));
  s.request = std::move(request);
  waiting_.push_back(std::move(s));
  return waiting_.back().id;
}

void FakeGenerator::Cancel(int64_t id) {
  running_.erase(id);
  std::erase_if(waiting_, [&](const Sequence& s) { return s.id == id; });
}

GeneratorStats FakeGenerator::Stats() const {
  GeneratorStats stats;
  stats.kv_pages_used = static_cast<int64_t>(running_.size());
  stats.kv_pages_total = slots_;
  stats.prompt_tokens_read = prompt_read_;
  stats.prompt_tokens_cached = prompt_cached_;
  stats.waiting = static_cast<int32_t>(waiting_.size());
  stats.running = static_cast<int32_t>(running_.size());
  stats.slots = slots_;
  return stats;
}

Expected<std::vector<GenerateProgress>> FakeGenerator::Advance() {
  ++steps_;
  if (step_time_.count() > 0) std::this_thread::sleep_for(step_time_);
  if (held_.empty()) held_.resize(slots_);
  // Free slots take waiting requests: the slot holding the longest start of the prompt first.
  std::vector<bool> used(slots_, false);
  for (auto& [id, s] : running_) used[s.slot] = true;
  while (!waiting_.empty() && static_cast<int32_t>(running_.size()) < slots_) {
    Sequence s = std::move(waiting_.front());
    waiting_.pop_front();
    int32_t best = -1;
    size_t best_common = 0;
    for (int32_t slot = 0; slot < slots_; ++slot) {
      if (used[slot]) continue;
      const std::vector<int32_t>& held = held_[slot];
      size_t common = 0;
      while (common < held.size() && common + 1 < s.request.prompt.size() &&
             held[common] == s.request.prompt[common]) {
        ++common;
      }
      if (best < 0 || common > best_common) {
        best = slot;
        best_common = common;
      }
    }
    s.slot = best;
    s.cached = static_cast<int32_t>(best_common);
    used[best] = true;
    held_[best] = s.request.prompt;
    prompt_cached_ += static_cast<int64_t>(best_common);
    prompt_read_ += static_cast<int64_t>(s.request.prompt.size() - best_common);
    int64_t id = s.id;
    running_.emplace(id, std::move(s));
  }
  for (auto& [id, s] : running_) {
    if (s.crash) return Internal("scripted failure of a step");
  }
  std::vector<GenerateProgress> out;
  std::vector<int64_t> done;
  for (auto& [id, s] : running_) {
    GenerateProgress p;
    p.id = id;
    p.cached = s.cached;
    s.cached = -1;
    bool greedy = s.request.sampling.temperature == 0;
    for (int32_t n = 0; n < tokens_per_step && p.end.empty(); ++n) {
      int32_t token;
      if (s.produced < s.answer.size()) {
        token = static_cast<unsigned char>(s.answer[s.produced]);
        if (!greedy) token = 'a' + static_cast<int32_t>(s.random() % 26);
      } else {
        token = FakeTextModel::kEnd;
      }
      ++s.produced;
      if (token == FakeTextModel::kEnd) {
        p.end = "stop";
      } else {
        p.tokens.push_back(token);
        held_[s.slot].push_back(token);
        if (s.request.sampling.logprobs >= 0) {
          TokenLogprob lp{token, -0.25f, {}};
          for (int32_t k = 0; k < s.request.sampling.logprobs; ++k) {
            lp.top.emplace_back(k == 0 ? token : 'A' + k, -0.25f - k);
          }
          p.logprobs.push_back(std::move(lp));
        }
        if (static_cast<int32_t>(s.produced) >= s.request.limit) p.end = "length";
      }
    }
    if (!p.end.empty()) done.push_back(id);
    out.push_back(std::move(p));
  }
  for (int64_t id : done) running_.erase(id);
  return out;
}

}  // namespace gizllm::server
