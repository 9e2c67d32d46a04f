#include "quant/linear_io.h"

#include <charconv>
#include <cstdint>
#include <nlohmann/json.hpp>

#include "formats/ggml_blocks.h"
#include "formats/gguf.h"
#include "quant/layout.h"

namespace gizllm::quant {
namespace {

std::string Shape(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// A float tensor [rows, groups] of a quantized linear, 4-byte aligned.
Expected<const void*> GroupTensor(const Checkpoint& ckpt, const std::string& name, int64_t rows,
                                  int64_t groups, const std::string& file) {
  const TensorInfo* t = ckpt.Find(name);
  if (!t) return NotFound(file + ": tensor " + name + " is missing");
  if (t->dtype != DType::kF32 || t->shape != std::vector<int64_t>{rows, groups}) {
    return InvalidArgument(t->file + ": tensor " + name + " is " +
                           std::string(DTypeName(t->dtype)) + " " + Shape(t->shape) +
                           ", expected F32 " + Shape({rows, groups}));
  }
  if (reinterpret_cast<uintptr_t>(t->data) % alignof(float) != 0) {
    return DataLoss(t->file + ": tensor " + name + " is not 4-byte aligned");
  }
  return static_cast<const void*>(t->data);
}

// A matrix kept in ggml's blocks: {"format": "ggml", "type": ..., "rows": R, "cols": C} over a
// U8 tensor [R, C / block elements * block bytes].
Expected<Weight> ReadGgmlLinear(const TensorInfo& t, const nlohmann::json& desc,
                                const std::string& where, const nlohmann::json* rows,
                                const nlohmann::json* cols) {
  auto type_field = desc.find("type");
  if (!rows || !cols || type_field == desc.end() || !type_field->is_string()) {
    return DataLoss(where + " needs \"type\" (string), \"rows\" and \"cols\" (integers)");
  }
  const std::string type_name = type_field->get<std::string>();
  GgmlType type;
  if (!GgmlTypeFromName(type_name, &type) || !CanDequantize(type)) {
    return DataLoss(where + ": \"type\" \"" + type_name.substr(0, 40) +
                    "\" is not a ggml block type that is read here");
  }
  GgmlBlock block;
  GgmlBlockOf(type, &block);
  Weight w;
  w.format = Format::kGgml;
  w.ggml_type = static_cast<uint32_t>(type);
  w.rows = rows->get<int64_t>();
  w.cols = cols->get<int64_t>();
  constexpr int64_t kMaxDim = int64_t{1} << 31;
  if (w.rows <= 0 || w.cols <= 0 || w.rows > kMaxDim || w.cols > kMaxDim ||
      w.cols % block.elements != 0) {
    return DataLoss(where + " describes " + type_name + " " + std::to_string(w.rows) + " x " +
                    std::to_string(w.cols) + ", expected rows of whole blocks of " +
                    std::to_string(block.elements));
  }
  const std::vector<int64_t> shape = {w.rows, w.cols / block.elements * block.bytes};
  if (t.dtype != DType::kU8 || t.shape != shape) {
    return InvalidArgument(t.file + ": tensor " + t.name + " is " +
                           std::string(DTypeName(t.dtype)) + " " + Shape(t.shape) +
                           ", expected U8 " + Shape(shape) + " for " + type_name + " blocks");
  }
  w.data = t.data;
  return w;
}

}  // namespace

std::string GgmlLinearDescription(uint32_t ggml_type, int64_t rows, int64_t cols) {
  return nlohmann::json{{"format", FormatName(Format::kGgml)},
                        {"type", GgmlTypeName(static_cast<GgmlType>(ggml_type))},
                        {"rows", rows},
                        {"cols", cols}}
      .dump();
}

Expected<Format> ParseFormat(const std::string& name) {
  for (Format f : {Format::kF32, Format::kF16, Format::kBf16, Format::kQ8, Format::kQ4, Format::kQ2,
                   Format::kQ1}) {
    if (FormatName(f) == name) return f;
  }
  return InvalidArgument("format \"" + name + "\" (expected bf16, f16, f32, q8, q4, q2 or q1)");
}

Expected<Weight> ReadLinear(const Checkpoint& ckpt, const std::string& weight_name) {
  const TensorInfo* t = ckpt.Find(weight_name);
  if (!t) return NotFound("checkpoint: tensor " + weight_name + " is missing");
  const std::string& file = t->file;
  Weight w;
  auto it = ckpt.metadata().find(kLinearKeyPrefix + weight_name);
  if (it == ckpt.metadata().end()) {
    if (t->dtype != DType::kBF16 && t->dtype != DType::kF16 && t->dtype != DType::kF32) {
      return InvalidArgument(file + ": tensor " + weight_name + " has dtype " +
                             std::string(DTypeName(t->dtype)) + ", expected BF16, F16 or F32");
    }
    if (t->shape.size() != 2) {
      return InvalidArgument(file + ": tensor " + weight_name + " has shape " + Shape(t->shape) +
                             ", expected a matrix");
    }
    w.format = FormatOf(t->dtype);
    w.rows = t->shape[0];
    w.cols = t->shape[1];
    w.data = t->data;
    return w;
  }

  const std::string where = file + ": metadata " + it->first;
  nlohmann::json desc = nlohmann::json::parse(it->second, nullptr, /*allow_exceptions=*/false);
  if (!desc.is_object()) return DataLoss(where + " is not a JSON object");
  auto field = [&](const char* key, nlohmann::json::value_t type) -> const nlohmann::json* {
    auto f = desc.find(key);
    if (f == desc.end()) return nullptr;
    if (f->type() != type &&
        !(type == nlohmann::json::value_t::number_integer && f->is_number_unsigned())) {
      return nullptr;
    }
    return &*f;
  };
  const auto* format = field("format", nlohmann::json::value_t::string);
  const auto* rows = field("rows", nlohmann::json::value_t::number_integer);
  const auto* cols = field("cols", nlohmann::json::value_t::number_integer);
  if (format && format->get<std::string>() == FormatName(Format::kGgml)) {
    return ReadGgmlLinear(*t, desc, where, rows, cols);
  }
  const auto* group = field("group", nlohmann::json::value_t::number_integer);
  const auto* rotated = field("rotated", nlohmann::json::value_t::boolean);
  if (!format || !rows || !cols || !group || !rotated) {
    return DataLoss(where +
                    " needs \"format\" (string), \"rows\", \"cols\", \"group\" (integers) "
                    "and \"rotated\" (boolean)");
  }
  auto parsed = ParseFormat(format->get<std::string>());
  if (!parsed.ok()) return parsed.status().Annotate(where);
  w.format = *parsed;
  w.rows = rows->get<int64_t>();
  w.cols = cols->get<int64_t>();
  w.group = static_cast<int32_t>(group->get<int64_t>());
  w.rotated = rotated->get<bool>();
  if (!IsQuantized(w.format) || w.group != kGroup || w.rows <= 0 || w.cols <= 0 ||
      w.cols % kGroup != 0) {
    return DataLoss(where + " describes " + FormatName(w.format) + " " + std::to_string(w.rows) +
                    " x " + std::to_string(w.cols) + " in groups of " + std::to_string(w.group) +
                    ", expected q8/q4/q2/q1 with columns a multiple of 128 in groups of 128");
  }
  if (w.rotated) {
    auto seed = ckpt.metadata().find(kRotationSeedKey);
    if (seed == ckpt.metadata().end()) {
      return DataLoss(file + ": metadata " + kRotationSeedKey + " is missing");
    }
    const std::string& text = seed->second;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), w.rotation_seed);
    if (ec != std::errc() || end != text.data() + text.size()) {
      return DataLoss(file + ": metadata " + kRotationSeedKey + " \"" + text +
                      "\" is not a decimal integer");
    }
  }
  const int64_t groups = w.cols / kGroup;
  const std::vector<int64_t> code_shape = {w.rows, groups * GroupBytes(w.format)};
  if (t->dtype != DType::kU8 || t->shape != code_shape) {
    return InvalidArgument(file + ": tensor " + weight_name + " is " +
                           std::string(DTypeName(t->dtype)) + " " + Shape(t->shape) +
                           ", expected U8 " + Shape(code_shape) + " for " + FormatName(w.format));
  }
  w.data = t->data;
  GZ_ASSIGN_OR_RETURN(w.scales,
                      GroupTensor(ckpt, weight_name + kScalesSuffix, w.rows, groups, file));
  if (ckpt.Find(weight_name + kZerosSuffix)) {
    if (!AllowsZeros(w.format)) {
      return DataLoss(file + ": tensor " + weight_name + kZerosSuffix + " for format " +
                      FormatName(w.format) + ", which has no zeros");
    }
    GZ_ASSIGN_OR_RETURN(w.zeros,
                        GroupTensor(ckpt, weight_name + kZerosSuffix, w.rows, groups, file));
  }
  return w;
}

}  // namespace gizllm::quant
