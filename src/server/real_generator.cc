#include "server/real_generator.h"

#include <algorithm>

namespace gizllm::server {

Expected<int64_t> EngineGenerator::Add(GenerateRequest request) {
  Request r;
  r.prompt = std::move(request.prompt);
  if (request.media) {
    if (!pictures_) return InvalidArgument("this model reads no pictures or videos");
    GZ_ASSIGN_OR_RETURN(PicturePrompt read, pictures_->Read(*request.media));
    r.prompt = std::move(read.tokens);
    r.pictures = std::make_shared<const PromptPictures>(std::move(read.pictures));
  }
  r.limit = request.limit;
  const SamplingOptions& s = request.sampling;
  r.sampling.temperature = s.temperature;
  r.sampling.top_k = s.top_k;
  r.sampling.top_p = s.top_p;
  r.sampling.min_p = s.min_p;
  r.sampling.seed = s.seed;
  r.sampling.presence = s.presence;
  r.sampling.frequency = s.frequency;
  r.sampling.repetition = s.repetition;
  r.sampling.logprobs = s.logprobs;
  if (s.grammar) {
    if (!vocabulary_) {
      vocabulary_ = std::make_shared<const TokenVocabulary>(
          TokenVocabulary::FromTokenizer(tokenizer_, engine_->vocab()));
    }
    std::string text = s.grammar->ToString();
    auto it = std::find_if(grammars_.begin(), grammars_.end(),
                           [&](const auto& g) { return g.first == text; });
    if (it == grammars_.end()) {
      if (grammars_.size() >= kGrammars) {
        shared_masks_gone_ += grammars_.front().second->masks->hits();
        grammars_.pop_front();
      }
      grammars_.emplace_back(std::move(text), std::make_shared<const TokenGrammar>(
                                                  TokenGrammar{s.grammar, vocabulary_}));
    } else {
      grammars_.splice(grammars_.end(), grammars_, it);
    }
    r.sampling.grammar = grammars_.back().second;
    if (s.grammar_after_thinking) {
      const int32_t open = tokenizer_.TokenId("<think>"), close = tokenizer_.TokenId("</think>");
      if (open >= 0 && close >= 0) {
        r.sampling.think_open = open;
        r.sampling.think_close = close;
        r.sampling.thinking = s.thinking;
      }
    }
  }
  if (request.ignore_eos) r.stop = std::vector<int32_t>{};
  GZ_ASSIGN_OR_RETURN(
      int64_t id, engine_->Add(std::move(r), request.mark, std::max<int32_t>(request.shared, 0)));
  active_.insert(id);
  return id;
}

Expected<std::vector<GenerateProgress>> EngineGenerator::Advance() {
  GZ_ASSIGN_OR_RETURN(std::vector<Progress> step, engine_->Advance());
  std::vector<GenerateProgress> out;
  out.reserve(step.size());
  for (Progress& p : step) {
    GenerateProgress g;
    g.id = p.id;
    g.tokens = std::move(p.tokens);
    g.end = std::move(p.end);
    g.status = std::move(p.status);
    if (reported_.insert(p.id).second) g.cached = static_cast<int32_t>(p.cached);
    for (Logprobs& lp : p.logprobs) {
      TokenLogprob t{lp.token, lp.logprob, {}};
      for (const gizllm::TokenLogprob& top : lp.top) t.top.emplace_back(top.token, top.logprob);
      g.logprobs.push_back(std::move(t));
    }
    if (!g.end.empty()) {
      active_.erase(p.id);
      reported_.erase(p.id);
    }
    out.push_back(std::move(g));
  }
  return out;
}

void EngineGenerator::Cancel(int64_t id) {
  engine_->Cancel(id);
  active_.erase(id);
  reported_.erase(id);
}

GeneratorStats EngineGenerator::Stats() const {
  const EngineStats& e = engine_->stats();
  GeneratorStats s;
  s.kv_pages_total = engine_->pages();
  s.kv_pages_used = engine_->pages() - engine_->free_pages();
  s.prompt_tokens_cached = e.cached_tokens;
  s.prompt_tokens_read = e.prompt_tokens - e.cached_tokens;
  s.preemptions = e.preemptions;
  s.slots = engine_->options().slots;
  s.steps = e.steps;
  s.grammar_masks_shared = shared_masks_gone_;
  for (const auto& g : grammars_) s.grammar_masks_shared += g.second->masks->hits();
  s.drafters.push_back({"lookup", e.lookup.drafted, e.lookup.accepted, e.lookup.steps});
  s.drafters.push_back({"mtp", e.mtp.drafted, e.mtp.accepted, e.mtp.steps});
  s.drafters.push_back({"dflash", e.block.drafted, e.block.accepted, e.block.steps});
  s.expert_cache = engine_->runner().ExpertCache();
  int32_t active = static_cast<int32_t>(active_.size());
  s.running = std::min(active, s.slots);
  s.waiting = active - s.running;
  return s;
}

Expected<std::unique_ptr<ChatTextModel>> ChatTextModel::Load(const std::string& dir,
                                                             std::string name, int32_t context,
                                                             int32_t vocab) {
  GZ_ASSIGN_OR_RETURN(Tokenizer tokenizer, Tokenizer::Load(dir));
  GZ_ASSIGN_OR_RETURN(ChatTemplate chat, ChatTemplate::Load(dir));
  return std::make_unique<ChatTextModel>(std::move(name), context, std::move(tokenizer),
                                         std::move(chat), vocab);
}

Expected<std::vector<int32_t>> ChatTextModel::Tokenize(std::string_view text) const {
  return tokenizer_.Encode(text, /*add_special=*/false);
}

Expected<std::string> ChatTextModel::Detokenize(std::span<const int32_t> tokens) const {
  return tokenizer_.Decode(tokens, /*skip_special=*/false);
}

Expected<ChatPrompt> ChatTextModel::RenderChat(const ChatInput& input) const {
  nlohmann::ordered_json request;
  request["messages"] = nlohmann::ordered_json::parse(input.messages.dump());
  if (input.tools.is_array() && !input.tools.empty()) {
    request["tools"] = nlohmann::ordered_json::parse(input.tools.dump());
  }
  request["add_generation_prompt"] = input.add_generation_prompt;
  if (input.enable_thinking) request["enable_thinking"] = *input.enable_thinking;
  // Only where the messages end is wanted (the engine's mark): one render less per message.
  return ChatPrompt::Render(template_, tokenizer_, request, /*last_messages=*/1,
                            input.answer_prefix);
}

Expected<ChatPrompt> ChatTextModel::WriteVideos(const ChatPrompt& prompt,
                                                const std::vector<VisionInput>& media) const {
  if (!pictures_) return InvalidArgument("the model reads no pictures or videos");
  return pictures_->WriteVideos(tokenizer_, prompt, media);
}

}  // namespace gizllm::server
