// The blocks of an encoder (model/encoder_arch.h): each loads its weights by name through a
// WeightLoader and issues ops over a packed batch (the rows of every sequence, one after
// another, no padding).
#pragma once

#include <cstdint>

#include "core/status.h"
#include "model/encoder_arch.h"
#include "model/weights.h"
#include "ops/backend.h"

namespace gizllm {

// The step's device buffers, sized for `rows` rows of a batch of `sequences`.
struct EncoderBuffers {
  float* x = nullptr;            // [rows, dim] the residual stream
  float* t = nullptr;            // [rows, max(dim, ffn)] a block's output before its norm
  float* q = nullptr;            // [rows, dim]
  float* k = nullptr;            // [rows, dim]
  float* v = nullptr;            // [rows, dim]
  float* a = nullptr;            // [rows, dim] attention output
  float* f = nullptr;            // [rows, ffn] feed-forward hidden units
  int32_t* tokens = nullptr;     // [rows]
  int32_t* positions = nullptr;  // [rows] rows of the position table
  int32_t* types = nullptr;      // [rows]
  int32_t* starts = nullptr;     // [sequences + 1]
  int64_t rows = 0;
  int sequences = 0;
};

// x = LayerNorm(word[token] + position[p] + type[t]).
class EncoderEmbeddings {
 public:
  Status Load(WeightLoader& loader, const EncoderArch& arch);
  void Run(Backend& be, const EncoderBuffers& b) const;

 private:
  const EncoderArch* arch_ = nullptr;
  Weight word_, position_, type_;
  const float* norm_weight_ = nullptr;
  const float* norm_bias_ = nullptr;
};

// x = LayerNorm(x + o(attention(q(x), k(x), v(x)))), attention within each sequence.
class EncoderAttentionBlock {
 public:
  Status Load(WeightLoader& loader, const EncoderArch& arch, int layer);
  void Run(Backend& be, const EncoderBuffers& b) const;

 private:
  const EncoderArch* arch_ = nullptr;
  Weight q_, k_, v_, o_;
  const float *q_bias_ = nullptr, *k_bias_ = nullptr, *v_bias_ = nullptr, *o_bias_ = nullptr;
  const float *norm_weight_ = nullptr, *norm_bias_ = nullptr;
};

// x = LayerNorm(x + down(gelu(up(x)))).
class EncoderFeedForwardBlock {
 public:
  Status Load(WeightLoader& loader, const EncoderArch& arch, int layer);
  void Run(Backend& be, const EncoderBuffers& b) const;

 private:
  const EncoderArch* arch_ = nullptr;
  Weight up_, down_;
  const float *up_bias_ = nullptr, *down_bias_ = nullptr;
  const float *norm_weight_ = nullptr, *norm_bias_ = nullptr;
};

// A sequence-classification head over each sequence's first row: out(tanh(dense(h[0]))).
class ClassifierHead {
 public:
  Status Load(WeightLoader& loader, const EncoderArch& arch);
  // first: [sequences, dim] each sequence's first row; hidden: [sequences, dim] scratch;
  // logits: [sequences, labels].
  void Run(Backend& be, const float* first, float* hidden, float* logits, int sequences) const;

 private:
  const EncoderArch* arch_ = nullptr;
  Weight dense_, out_;
  const float *dense_bias_ = nullptr, *out_bias_ = nullptr;
};

}  // namespace gizllm
