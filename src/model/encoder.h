// Encoder: a BERT-style encoder (model/encoder_arch.h) with its weights on a backend; runs
// packed batches of whole sequences to their last hidden states, or to a classification head's
// logits.
//
// Batches are packed without padding: the sequences' rows follow each other and the attention op
// reads each sequence's own rows (EncoderAttentionParams::starts). Every matmul then sees all
// rows of all sequences at once, as a padded batch would, but computes no padding rows and needs
// no mask; sequences of any lengths share a batch, so no grouping by length is needed.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/encoder_arch.h"
#include "model/pooling.h"
#include "model/weights.h"
#include "ops/backend.h"

namespace gizllm {

// One sequence: its tokens and their token types (empty: all 0; ignored where the family takes
// none).
struct EncoderInput {
  std::span<const int32_t> tokens;
  std::span<const int32_t> types;
};

class Encoder {
 public:
  // Reads dir (config.json, safetensors) and places the weights on `backend`; refuses a backend
  // without the encoder ops (SupportsEncoder) with a status naming it.
  static Expected<std::unique_ptr<Encoder>> Load(const std::string& dir,
                                                 std::shared_ptr<Backend> backend);
  ~Encoder();

  const EncoderArch& arch() const { return arch_; }
  const std::string& dir() const { return dir_; }
  Backend& backend() { return *backend_; }
  const std::vector<WeightSummary>& weights() const;

  // The last layer's hidden states, [rows, dim] on the host, rows = the sequences' tokens one
  // after another. A sequence must hold 1 to arch().MaxTokens() tokens, each below vocab, each
  // type below type_vocab; errors name the sequence.
  Status Forward(std::span<const EncoderInput> batch, std::vector<float>* hidden);
  // Each sequence's pooled hidden state, [sequences, dim] on the host, not normalized: the mean
  // of its rows (MeanRows), its first or its last row (GatherRows), taken on the device so that
  // only these rows come back (a BERT-base batch of 8,192 tokens: 25 MB of hidden states
  // otherwise). The same checks as Forward.
  Status Pool(std::span<const EncoderInput> batch, Pooling pooling, std::vector<float>* pooled);
  // The classification head's logits, [sequences, labels] on the host (arch().head set).
  Status Classify(std::span<const EncoderInput> batch, std::vector<float>* logits);

 private:
  Encoder() = default;
  // Uploads the batch and runs the embeddings and the layers; the hidden states stay in x.
  Status Run(std::span<const EncoderInput> batch);

  std::string dir_;
  EncoderArch arch_;
  std::shared_ptr<Backend> backend_;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gizllm
