// BERT-style encoders: bert (BertModel, BertForSequenceClassification, BertForMaskedLM's
// encoder), roberta and xlm-roberta (the same computation with positions after the padding row
// and no token types). The recipe of model/encoder_arch.h.
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/mapped_file.h"
#include "model/encoder_arch.h"
#include "model/families/family.h"

namespace gizllm {

using nlohmann::json;

bool IsEncoderModelType(const std::string& model_type) {
  return model_type == "bert" || model_type == "roberta" || model_type == "xlm-roberta";
}

bool IsEncoderFolder(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  if (!FileExists(path)) return false;
  auto text = ReadFile(path);
  if (!text.ok()) return false;
  json config = json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!config.is_object()) return false;
  auto it = config.find("model_type");
  return it != config.end() && it->is_string() && IsEncoderModelType(it->get<std::string>());
}

Expected<EncoderArch> ParseEncoderArch(const json& config, const std::string& file) {
  if (!config.is_object()) return InvalidArgument(file + ": expected a JSON object");
  ConfigReader reader(config, file);
  EncoderArch arch;
  GZ_ASSIGN_OR_RETURN(arch.family, reader.String("model_type", ""));
  if (!IsEncoderModelType(arch.family)) {
    return reader.Error(
        StatusCode::kUnimplemented, "model_type",
        "\"" + arch.family + "\" is not an encoder (expected bert, roberta or " + "xlm-roberta)");
  }
  if (const json* a = reader.Get("architectures")) {
    if (!a->is_array() || a->empty() || !(*a)[0].is_string()) {
      return reader.Error(StatusCode::kInvalidArgument, "architectures",
                          "expected a list of class names");
    }
    arch.architecture = (*a)[0].get<std::string>();
  }
  const bool bert = arch.family == "bert";
  // BertConfig's and RobertaConfig's defaults; RoBERTa's padding row is pad_token_id (1).
  GZ_ASSIGN_OR_RETURN(arch.vocab, reader.Int("vocab_size", bert ? 30522 : 50265));
  GZ_ASSIGN_OR_RETURN(arch.dim, reader.Int("hidden_size", 768));
  GZ_ASSIGN_OR_RETURN(int64_t layers, reader.Int("num_hidden_layers", 12));
  GZ_ASSIGN_OR_RETURN(int64_t heads, reader.Int("num_attention_heads", 12));
  GZ_ASSIGN_OR_RETURN(arch.ffn, reader.Int("intermediate_size", 3072));
  GZ_ASSIGN_OR_RETURN(arch.positions, reader.Int("max_position_embeddings", 512));
  GZ_ASSIGN_OR_RETURN(arch.type_vocab, reader.Int("type_vocab_size", 2));
  GZ_ASSIGN_OR_RETURN(arch.norm_eps, reader.Double("layer_norm_eps", 1e-12));
  auto positive = [&](int64_t v, const char* field, int64_t most) -> Status {
    if (v <= 0 || v > most) {
      return reader.Error(
          StatusCode::kInvalidArgument, field,
          "expected an integer in [1, " + std::to_string(most) + "], got " + std::to_string(v));
    }
    return Status::Ok();
  };
  GZ_RETURN_IF_ERROR(positive(arch.vocab, "vocab_size", int64_t{1} << 31));
  GZ_RETURN_IF_ERROR(positive(arch.dim, "hidden_size", 1 << 16));
  GZ_RETURN_IF_ERROR(positive(layers, "num_hidden_layers", 1024));
  GZ_RETURN_IF_ERROR(positive(heads, "num_attention_heads", 1024));
  GZ_RETURN_IF_ERROR(positive(arch.ffn, "intermediate_size", 1 << 20));
  GZ_RETURN_IF_ERROR(positive(arch.positions, "max_position_embeddings", kMaxContext));
  GZ_RETURN_IF_ERROR(positive(arch.type_vocab, "type_vocab_size", 1 << 16));
  if (!(arch.norm_eps > 0)) {
    return reader.Error(StatusCode::kInvalidArgument, "layer_norm_eps", "must be positive");
  }
  if (arch.dim % heads != 0) {
    return reader.Error(
        StatusCode::kInvalidArgument, "num_attention_heads",
        std::to_string(heads) + " does not divide hidden_size " + std::to_string(arch.dim));
  }
  arch.layers = static_cast<int>(layers);
  arch.heads = static_cast<int>(heads);
  arch.head_dim = static_cast<int>(arch.dim / heads);
  arch.token_types = bert;
  if (!bert) {
    GZ_ASSIGN_OR_RETURN(int64_t padding, reader.Int("pad_token_id", 1));
    if (padding < 0 || padding + 1 >= arch.positions) {
      return reader.Error(StatusCode::kInvalidArgument, "pad_token_id",
                          "the padding row " + std::to_string(padding) +
                              " leaves no position below max_position_embeddings");
    }
    arch.position_offset = padding + 1;
  }

  GZ_ASSIGN_OR_RETURN(std::string act, reader.String("hidden_act", "gelu"));
  if (act != "gelu") {
    return reader.Error(StatusCode::kUnimplemented, "hidden_act",
                        "\"" + act + "\" is not implemented (expected gelu, of erf)");
  }
  GZ_ASSIGN_OR_RETURN(std::string position_type,
                      reader.String("position_embedding_type", "absolute"));
  if (position_type != "absolute") {
    return reader.Error(StatusCode::kUnimplemented, "position_embedding_type",
                        "\"" + position_type + "\" is not implemented (expected absolute)");
  }
  GZ_ASSIGN_OR_RETURN(bool decoder, reader.Bool("is_decoder", false));
  if (decoder) {
    return reader.Error(StatusCode::kUnimplemented, "is_decoder",
                        "a causal encoder is not implemented (expected false)");
  }
  GZ_ASSIGN_OR_RETURN(bool cross, reader.Bool("add_cross_attention", false));
  if (cross) {
    return reader.Error(StatusCode::kUnimplemented, "add_cross_attention",
                        "cross-attention is not implemented (expected false)");
  }

  const std::string& a = arch.architecture;
  if (a.size() > 26 && a.ends_with("ForSequenceClassification")) {
    arch.head = bert ? EncoderHead::kPooled : EncoderHead::kDense;
    // transformers writes id2label; num_labels where it is given instead; 2 by default.
    int64_t labels = 2;
    if (const json* ids = reader.Get("id2label")) {
      if (!ids->is_object() || ids->empty()) {
        return reader.Error(StatusCode::kInvalidArgument, "id2label",
                            "expected an object of labels");
      }
      labels = static_cast<int64_t>(ids->size());
    }
    GZ_ASSIGN_OR_RETURN(labels, reader.Int("num_labels", labels));
    GZ_RETURN_IF_ERROR(positive(labels, "num_labels", 1 << 16));
    arch.labels = static_cast<int>(labels);
  } else if (a.ends_with("ForTokenClassification") || a.ends_with("ForQuestionAnswering") ||
             a.ends_with("ForMultipleChoice")) {
    return reader.Error(StatusCode::kUnimplemented, "architectures",
                        "\"" + a + "\": its head is not implemented (the encoder alone, " +
                            "*Model, *ForMaskedLM, or *ForSequenceClassification)");
  }
  return arch;
}

Expected<EncoderArch> ReadEncoderArch(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  if (!FileExists(path)) return NotFound(path + ": missing (expected a Hugging Face model folder)");
  GZ_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  json config = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded()) return DataLoss(path + ": not valid JSON");
  return ParseEncoderArch(config, path);
}

std::string EncoderTensorName(const EncoderArch& arch, EncoderTensor tensor, int layer) {
  const std::string& p = arch.prefix;
  const std::string l = p + "encoder.layer." + std::to_string(layer) + ".";
  const bool pooled = arch.head == EncoderHead::kPooled;
  switch (tensor) {
    case EncoderTensor::kWordEmbed:
      return p + "embeddings.word_embeddings.weight";
    case EncoderTensor::kPositionEmbed:
      return p + "embeddings.position_embeddings.weight";
    case EncoderTensor::kTypeEmbed:
      return p + "embeddings.token_type_embeddings.weight";
    case EncoderTensor::kEmbedNormWeight:
      return p + "embeddings.LayerNorm.weight";
    case EncoderTensor::kEmbedNormBias:
      return p + "embeddings.LayerNorm.bias";
    case EncoderTensor::kQ:
      return l + "attention.self.query.weight";
    case EncoderTensor::kQBias:
      return l + "attention.self.query.bias";
    case EncoderTensor::kK:
      return l + "attention.self.key.weight";
    case EncoderTensor::kKBias:
      return l + "attention.self.key.bias";
    case EncoderTensor::kV:
      return l + "attention.self.value.weight";
    case EncoderTensor::kVBias:
      return l + "attention.self.value.bias";
    case EncoderTensor::kO:
      return l + "attention.output.dense.weight";
    case EncoderTensor::kOBias:
      return l + "attention.output.dense.bias";
    case EncoderTensor::kAttnNormWeight:
      return l + "attention.output.LayerNorm.weight";
    case EncoderTensor::kAttnNormBias:
      return l + "attention.output.LayerNorm.bias";
    case EncoderTensor::kUp:
      return l + "intermediate.dense.weight";
    case EncoderTensor::kUpBias:
      return l + "intermediate.dense.bias";
    case EncoderTensor::kDown:
      return l + "output.dense.weight";
    case EncoderTensor::kDownBias:
      return l + "output.dense.bias";
    case EncoderTensor::kFfnNormWeight:
      return l + "output.LayerNorm.weight";
    case EncoderTensor::kFfnNormBias:
      return l + "output.LayerNorm.bias";
    case EncoderTensor::kHeadDense:
      return pooled ? p + "pooler.dense.weight" : "classifier.dense.weight";
    case EncoderTensor::kHeadDenseBias:
      return pooled ? p + "pooler.dense.bias" : "classifier.dense.bias";
    case EncoderTensor::kHeadOut:
      return pooled ? "classifier.weight" : "classifier.out_proj.weight";
    case EncoderTensor::kHeadOutBias:
      return pooled ? "classifier.bias" : "classifier.out_proj.bias";
  }
  return "";
}

}  // namespace gizllm
