// EncoderModel over an EmbeddingModel (model/embedding_model.h). The server calls it from its
// batcher's thread (server/encoder_batcher.h), with the sequences of many requests at once; the
// mutex keeps any other caller to one run at a time.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "model/embedding_model.h"
#include "server/encoder_model.h"

namespace gizllm::server {

class RealEncoderModel final : public EncoderModel {
 public:
  RealEncoderModel(std::unique_ptr<EmbeddingModel> model, std::string name, Task task);

  std::string Name() const override { return name_; }
  Task task() const override { return task_; }
  int32_t MaxTokens() const override;
  int32_t Vocab() const override;
  int64_t Dim() const override { return model_->dim(); }
  bool Normalizes() const override { return model_->config().normalize; }
  Status CheckDimensions(int64_t dimensions) const override {
    return gizllm::CheckDimensions(model_->config(), model_->dim(), dimensions);
  }
  Expected<std::string> Prompt(const std::optional<std::string>& name) const override {
    return PromptText(model_->config(), name);
  }
  Expected<Encoding> Tokenize(std::string_view text, int64_t limit) const override;
  Expected<Encoding> TokenizePair(std::string_view first, std::string_view second) const override;
  Expected<std::vector<std::vector<float>>> Embed(std::span<const Encoding> sequences) override;
  Expected<std::vector<float>> Score(std::span<const Encoding> pairs) override;

 private:
  std::unique_ptr<EmbeddingModel> model_;
  std::string name_;
  Task task_;
  std::mutex mutex_;  // one encoder run at a time
};

}  // namespace gizllm::server
