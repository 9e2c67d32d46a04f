#include "model/embedding_model.h"

#include <algorithm>
#include <cmath>

#include "model/evaluate.h"

namespace gizllm {

Expected<std::unique_ptr<EmbeddingModel>> EmbeddingModel::Load(const std::string& dir,
                                                               std::shared_ptr<Backend> backend) {
  std::unique_ptr<EmbeddingModel> m(new EmbeddingModel());
  if (IsEncoderFolder(dir)) {
    GZ_ASSIGN_OR_RETURN(m->encoder_, Encoder::Load(dir, std::move(backend)));
  } else {
    GZ_ASSIGN_OR_RETURN(m->decoder_, Model::Load(dir, std::move(backend)));
  }
  GZ_ASSIGN_OR_RETURN(m->tokenizer_, Tokenizer::Load(dir));
  GZ_ASSIGN_OR_RETURN(m->config_,
                      ReadEmbeddingConfig(dir, m->encoder_ ? m->encoder_->arch().labels : 0));
  if (m->decoder_ && !m->config_.score_tokens.empty()) GZ_RETURN_IF_ERROR(m->RerankByYesNo());
  return m;
}

Status EmbeddingModel::RerankByYesNo(std::string instruction) {
  if (!decoder_) {
    return InvalidArgument(encoder_->dir() +
                           ": an encoder; only a decoder reranks with its yes/no logits");
  }
  YesNo y;
  const std::vector<std::string>& named = config_.score_tokens;
  const std::string no = named.empty() ? "no" : named[0];
  const std::string yes = named.empty() ? "yes" : named[1];
  y.no = tokenizer_.TokenId(no);
  y.yes = tokenizer_.TokenId(yes);
  for (const auto& [token, id] : {std::pair{no, y.no}, std::pair{yes, y.yes}}) {
    if (id < 0 || id >= decoder_->arch().vocab) {
      return InvalidArgument(decoder_->dir() + ": the tokenizer has no token \"" + token +
                             "\" to score pairs with (a reranker answers \"" + yes + "\" or \"" +
                             no +
                             "\"; config.json's classifier_from_token names "
                             "others)");
    }
  }
  GZ_ASSIGN_OR_RETURN(y.prefix,
                      tokenizer_.Encode("<|im_start|>system\nJudge whether the Document meets the "
                                        "requirements based on the Query and the Instruct "
                                        "provided. Note that the answer can only be \"yes\" or "
                                        "\"no\".<|im_end|>\n<|im_start|>user\n",
                                        /*add_special=*/false));
  GZ_ASSIGN_OR_RETURN(
      y.suffix, tokenizer_.Encode("<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
                                  /*add_special=*/false));
  if (static_cast<int64_t>(y.prefix.size() + y.suffix.size()) >= max_tokens()) {
    return InvalidArgument(decoder_->dir() + ": the reranker's prompt takes " +
                           std::to_string(y.prefix.size() + y.suffix.size()) +
                           " tokens, leaving none of the model's " + std::to_string(max_tokens()) +
                           " for the pair");
  }
  y.instruction = std::move(instruction);
  yes_no_ = std::move(y);
  return Status::Ok();
}

const std::string& EmbeddingModel::family() const {
  return encoder_ ? encoder_->arch().family : decoder_->arch().family;
}

std::string EmbeddingModel::device() const {
  return encoder_ ? encoder_->backend().Describe() : decoder_->backend().Describe();
}

int64_t EmbeddingModel::vocab() const {
  return encoder_ ? encoder_->arch().vocab : decoder_->arch().vocab;
}

int64_t EmbeddingModel::dim() const {
  return encoder_ ? encoder_->arch().dim : decoder_->arch().dim;
}

int64_t EmbeddingModel::max_tokens() const {
  const int64_t positions =
      encoder_ ? encoder_->arch().MaxTokens()
               : (decoder_->arch().context > 0 ? decoder_->arch().context : kMaxContext);
  return config_.max_tokens > 0 ? std::min(config_.max_tokens, positions) : positions;
}

Expected<Encoding> EmbeddingModel::Tokenize(std::string_view text, int64_t limit) const {
  const int64_t most = limit > 0 ? limit : max_tokens();
  GZ_ASSIGN_OR_RETURN(Encoding e, tokenizer_.EncodeTyped(text, std::nullopt,
                                                         /*add_special=*/true, most));
  if (e.ids.empty()) return InvalidArgument("a text of no tokens");
  return e;
}

Expected<Encoding> EmbeddingModel::TokenizePair(std::string_view query,
                                                std::string_view document) const {
  if (!yes_no_) return tokenizer_.EncodeTyped(query, document, /*add_special=*/true, max_tokens());
  // Qwen3-Reranker's model card: the pair's text tokenized alone (with the tokenizer's special
  // tokens, none for Qwen) and cut to leave room for the prompt around it.
  const std::string text = "<Instruct>: " + yes_no_->instruction +
                           "\n<Query>: " + std::string(query) +
                           "\n<Document>: " + std::string(document);
  const int64_t room =
      max_tokens() - static_cast<int64_t>(yes_no_->prefix.size() + yes_no_->suffix.size());
  GZ_ASSIGN_OR_RETURN(Encoding body,
                      tokenizer_.EncodeTyped(text, std::nullopt, /*add_special=*/true, room));
  Encoding e;
  e.ids = yes_no_->prefix;
  e.ids.insert(e.ids.end(), body.ids.begin(), body.ids.end());
  e.ids.insert(e.ids.end(), yes_no_->suffix.begin(), yes_no_->suffix.end());
  e.types.assign(e.ids.size(), 0);
  return e;
}

std::vector<std::pair<size_t, size_t>> EmbeddingModel::Runs(std::span<const Encoding> sequences) {
  std::vector<std::pair<size_t, size_t>> runs;
  size_t first = 0;
  int64_t tokens = 0;
  for (size_t i = 0; i < sequences.size(); ++i) {
    const int64_t n = static_cast<int64_t>(sequences[i].ids.size());
    if (i > first && tokens + n > kRunTokens) {
      runs.emplace_back(first, i);
      first = i;
      tokens = 0;
    }
    tokens += n;
  }
  if (first < sequences.size()) runs.emplace_back(first, sequences.size());
  return runs;
}

Expected<std::vector<std::vector<float>>> EmbeddingModel::Embed(
    std::span<const Encoding> sequences) {
  std::vector<std::vector<float>> out;
  out.reserve(sequences.size());
  std::vector<EncoderInput> batch;
  std::vector<float> hidden, pooled;
  std::vector<int32_t> starts;
  const int64_t d = dim();
  for (const auto& [first, end] : Runs(sequences)) {
    batch.clear();
    starts.assign(1, 0);
    for (size_t i = first; i < end; ++i) {
      batch.push_back({sequences[i].ids, sequences[i].types});
      starts.push_back(starts.back() + static_cast<int32_t>(sequences[i].ids.size()));
    }
    pooled.resize((end - first) * d);
    if (encoder_) {
      // Pooled on the device; normalized here as Pool does.
      GZ_RETURN_IF_ERROR(encoder_->Pool(batch, config_.pooling, &pooled));
      if (config_.normalize) {
        for (size_t i = 0; i < end - first; ++i) Normalize(pooled.data() + i * d, d);
      }
    } else {
      // A decoder reads one sequence at a time (SequenceHidden takes the runner's KV pool), to
      // its final-normed hidden states.
      hidden.clear();
      const int final_normed[] = {decoder_->arch().layers + 1};
      for (const EncoderInput& in : batch) {
        GZ_ASSIGN_OR_RETURN(std::vector<float> h,
                            SequenceHidden(*decoder_, in.tokens, final_normed));
        hidden.insert(hidden.end(), h.begin(), h.end());
      }
      Pool(hidden, d, starts, config_.pooling, config_.normalize, pooled.data());
    }
    for (size_t i = 0; i < end - first; ++i) {
      out.emplace_back(pooled.begin() + i * d, pooled.begin() + (i + 1) * d);
    }
  }
  return out;
}

Expected<std::vector<float>> EmbeddingModel::ScoreByYesNo(std::span<const Encoding> pairs) {
  // One pair at a time: LastLogits takes the runner's KV pool, as SequenceHidden does.
  std::vector<float> out;
  out.reserve(pairs.size());
  for (const Encoding& pair : pairs) {
    GZ_ASSIGN_OR_RETURN(std::vector<float> logits, LastLogits(*decoder_, pair.ids));
    // softmax([no, yes])[yes] = sigmoid(yes - no).
    const double margin = static_cast<double>(logits[yes_no_->yes]) - logits[yes_no_->no];
    out.push_back(static_cast<float>(1.0 / (1.0 + std::exp(-margin))));
  }
  return out;
}

Expected<std::vector<float>> EmbeddingModel::Score(std::span<const Encoding> pairs) {
  if (yes_no_) return ScoreByYesNo(pairs);
  if (!reranks()) {
    return InvalidArgument((encoder_ ? encoder_->dir() : decoder_->dir()) +
                           ": no sequence-classification head to score with");
  }
  if (encoder_->arch().labels != 1) {
    return Unimplemented(encoder_->dir() + ": a head of " +
                         std::to_string(encoder_->arch().labels) +
                         " labels; scores come from a head of one label");
  }
  std::vector<float> out;
  out.reserve(pairs.size());
  std::vector<EncoderInput> batch;
  std::vector<float> logits;
  for (const auto& [first, end] : Runs(pairs)) {
    batch.clear();
    for (size_t i = first; i < end; ++i) batch.push_back({pairs[i].ids, pairs[i].types});
    GZ_RETURN_IF_ERROR(encoder_->Classify(batch, &logits));
    for (float logit : logits) out.push_back(Activate(config_.activation, logit));
  }
  return out;
}

}  // namespace gizllm
