#include "server/real_encoder_model.h"

namespace gizllm::server {

RealEncoderModel::RealEncoderModel(std::unique_ptr<EmbeddingModel> model, std::string name,
                                   Task task)
    : model_(std::move(model)), name_(std::move(name)), task_(task) {}

int32_t RealEncoderModel::MaxTokens() const { return static_cast<int32_t>(model_->max_tokens()); }

int32_t RealEncoderModel::Vocab() const { return static_cast<int32_t>(model_->vocab()); }

Expected<Encoding> RealEncoderModel::Tokenize(std::string_view text, int64_t limit) const {
  return model_->Tokenize(text, limit);
}

Expected<Encoding> RealEncoderModel::TokenizePair(std::string_view first,
                                                  std::string_view second) const {
  return model_->TokenizePair(first, second);
}

Expected<std::vector<std::vector<float>>> RealEncoderModel::Embed(
    std::span<const Encoding> sequences) {
  std::lock_guard<std::mutex> lock(mutex_);
  return model_->Embed(sequences);
}

Expected<std::vector<float>> RealEncoderModel::Score(std::span<const Encoding> pairs) {
  std::lock_guard<std::mutex> lock(mutex_);
  return model_->Score(pairs);
}

}  // namespace gizllm::server
