// EncoderArch: what a BERT-style encoder computes (bert, roberta, xlm-roberta), as
// model/families/bert.cc reads config.json; and the names of its tensors.
//
// Every layer is post-norm: x = LayerNorm(x + attention(x)), x = LayerNorm(x + ffn(x)), with
// bidirectional multi-head attention (q, k, v and o with biases), LayerNorm with bias, and a
// feed-forward down(gelu(up(x))) with biases (GELU of erf). The input is the sum of the word, the
// absolute position and the token-type embeddings, layer-normalized.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "core/status.h"

namespace gizllm {

// The sequence-classification head a checkpoint carries (config.json "architectures").
enum class EncoderHead : uint8_t {
  kNone,
  // BertForSequenceClassification: classifier(tanh(pooler(h[0]))), pooler [dim, dim],
  // classifier [labels, dim].
  kPooled,
  // (XLM)RobertaForSequenceClassification: out_proj(tanh(dense(h[0]))), dense [dim, dim],
  // out_proj [labels, dim].
  kDense,
};

struct EncoderArch {
  std::string family;        // "bert", "roberta", "xlm-roberta"
  std::string architecture;  // config.json "architectures"[0] ("" when absent)
  int64_t vocab = 0;
  int64_t dim = 0;  // hidden_size
  int layers = 0;
  int heads = 0;
  int head_dim = 0;
  int64_t ffn = 0;        // intermediate_size
  int64_t positions = 0;  // max_position_embeddings: rows of the position table
  // Position of a sequence's first token in the position table: 0 (BERT); RoBERTa's
  // padding_idx + 1 (positions count from after the padding row).
  int64_t position_offset = 0;
  int64_t type_vocab = 0;  // type_vocab_size: rows of the token-type table
  // Whether the token types of a pair reach the model (BERT); RoBERTa's tokenizers give none and
  // every token is type 0.
  bool token_types = false;
  double norm_eps = 1e-12;  // layer_norm_eps
  EncoderHead head = EncoderHead::kNone;
  int labels = 0;  // the head's outputs (num_labels / id2label)
  // Where the encoder's tensors are named: "" ("embeddings.word_embeddings.weight"), "bert.",
  // "roberta." (the first under which the checkpoint holds the word embeddings; set at load).
  std::string prefix;

  // The longest sequence the position table allows.
  int64_t MaxTokens() const { return positions - position_offset; }
};

// Whether config.json's model_type names an encoder family.
bool IsEncoderModelType(const std::string& model_type);
// Whether dir/config.json is an encoder's (false where it is missing or unreadable).
bool IsEncoderFolder(const std::string& dir);

// dir/config.json read by the encoder recipe; errors name the file and the field. Fields that
// change the computation and are not implemented (another hidden_act, relative position
// embeddings, a decoder configuration) are refused, naming them.
Expected<EncoderArch> ReadEncoderArch(const std::string& dir);
Expected<EncoderArch> ParseEncoderArch(const nlohmann::json& config, const std::string& file);

// The tensors of an encoder, by what they do.
enum class EncoderTensor {
  kWordEmbed,
  kPositionEmbed,
  kTypeEmbed,
  kEmbedNormWeight,
  kEmbedNormBias,
  kQ,
  kQBias,
  kK,
  kKBias,
  kV,
  kVBias,
  kO,
  kOBias,
  kAttnNormWeight,
  kAttnNormBias,
  kUp,  // intermediate.dense
  kUpBias,
  kDown,  // output.dense
  kDownBias,
  kFfnNormWeight,
  kFfnNormBias,
  // The classification head (EncoderHead): kPooled's pooler and classifier, kDense's dense and
  // out_proj, both named here as the first and the second linear.
  kHeadDense,
  kHeadDenseBias,
  kHeadOut,
  kHeadOutBias,
};

// The checkpoint's name of a tensor ("bert.encoder.layer.3.attention.self.query.weight");
// `layer` is ignored outside the layers.
std::string EncoderTensorName(const EncoderArch& arch, EncoderTensor tensor, int layer);

}  // namespace gizllm
