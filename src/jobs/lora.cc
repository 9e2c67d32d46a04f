#include "jobs/lora.h"

#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/mapped_file.h"
#include "core/thread_pool.h"
#include "formats/ggml_blocks.h"

namespace gizllm::quant {

namespace {

// Elements [begin, end) of a float tensor as float32.
void FloatsOf(const TensorInfo& t, int64_t begin, int64_t end, float* out) {
  switch (t.dtype) {
    case DType::kF32:
      std::memcpy(out + begin, t.data + 4 * begin, (end - begin) * sizeof(float));
      break;
    case DType::kBF16:
      // A bf16 value is the top half of the float: a shift, in a loop that vectorizes.
      for (int64_t i = begin; i < end; ++i) {
        uint16_t h;
        std::memcpy(&h, t.data + 2 * i, 2);
        const uint32_t bits = static_cast<uint32_t>(h) << 16;
        std::memcpy(&out[i], &bits, 4);
      }
      break;
    case DType::kF16:
      for (int64_t i = begin; i < end; ++i) {
        uint16_t h;
        std::memcpy(&h, t.data + 2 * i, 2);
        out[i] = F16ToF32(h);
      }
      break;
    default:
      break;
  }
}

}  // namespace

Status ReadFloatsInto(const TensorInfo& t, float* out, ThreadPool* pool) {
  const int64_t n = t.Elements();
  const bool split = pool && pool->threads() > 1 && n >= (int64_t{1} << 20);
  if (t.ggml_type >= 0) {
    const GgmlType type = static_cast<GgmlType>(t.ggml_type);
    const std::string what = t.file + ": tensor " + t.name;
    GgmlBlock block;
    if (!split || !CanDequantize(type) || !GgmlBlockOf(type, &block) || n % block.elements != 0 ||
        t.bytes != static_cast<size_t>(n / block.elements) * block.bytes) {
      return DequantizeBlocks(type, t.data, t.bytes, n, out, what);  // or its error
    }
    // Whole blocks, checked above: each range of blocks is read as a tensor of its own.
    Status first = Status::Ok();
    std::mutex failed;
    pool->ParallelFor(n / block.elements, 4096, [&](int64_t begin, int64_t end, int) {
      Status s = DequantizeBlocks(
          type, t.data + begin * block.bytes, static_cast<size_t>(end - begin) * block.bytes,
          (end - begin) * block.elements, out + begin * block.elements, what);
      std::lock_guard<std::mutex> lock(failed);
      if (first.ok() && !s.ok()) first = std::move(s);
    });
    return first;
  }
  if (t.dtype != DType::kF32 && t.dtype != DType::kBF16 && t.dtype != DType::kF16) {
    return InvalidArgument(t.file + ": tensor " + t.name + " has dtype " +
                           std::string(DTypeName(t.dtype)) + ", expected F32, BF16 or F16");
  }
  if (!split) {
    FloatsOf(t, 0, n, out);
  } else {
    pool->ParallelFor(n, int64_t{1} << 16,
                      [&](int64_t begin, int64_t end, int) { FloatsOf(t, begin, end, out); });
  }
  return Status::Ok();
}

Expected<std::vector<float>> ReadFloats(const TensorInfo& t) {
  std::vector<float> out(t.Elements());
  GZ_RETURN_IF_ERROR(ReadFloatsInto(t, out.data()));
  return out;
}

Expected<LoraAdapter> LoraAdapter::Open(const std::string& dir) {
  const std::string config_path = dir + "/adapter_config.json";
  GZ_ASSIGN_OR_RETURN(std::string text, ReadFile(config_path));
  nlohmann::json config = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!config.is_object()) return InvalidArgument(config_path + ": not a JSON object");
  LoraAdapter adapter;
  adapter.dir_ = dir;
  auto r = config.find("r");
  auto alpha = config.find("lora_alpha");
  if (r == config.end() || !r->is_number_integer() || r->get<int64_t>() <= 0) {
    return InvalidArgument(config_path + ": field r must be a positive integer");
  }
  if (alpha == config.end() || !alpha->is_number()) {
    return InvalidArgument(config_path + ": field lora_alpha must be a number");
  }
  adapter.rank_ = static_cast<int>(r->get<int64_t>());
  bool rslora = false;
  if (auto f = config.find("use_rslora"); f != config.end() && !f->is_null()) {
    if (!f->is_boolean())
      return InvalidArgument(config_path + ": field use_rslora must be a boolean");
    rslora = f->get<bool>();
  }
  if (auto f = config.find("fan_in_fan_out");
      f != config.end() && f->is_boolean() && f->get<bool>()) {
    return Unimplemented(config_path + ": fan_in_fan_out adapters are not supported");
  }
  if (auto f = config.find("use_dora"); f != config.end() && f->is_boolean() && f->get<bool>()) {
    return Unimplemented(config_path + ": DoRA adapters (use_dora) are not supported");
  }
  const double a = alpha->get<double>();
  adapter.scale_ = rslora ? a / std::sqrt(static_cast<double>(adapter.rank_)) : a / adapter.rank_;
  std::set<std::string> modules;
  if (auto f = config.find("target_modules"); f != config.end()) {
    if (f->is_array()) {
      for (const auto& m : *f) {
        if (m.is_string()) modules.insert(m.get<std::string>());
      }
    }
  }

  const std::string weights_path = dir + "/adapter_model.safetensors";
  GZ_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Open(weights_path));
  adapter.file_ = std::make_unique<SafetensorsFile>(std::move(file));
  for (const TensorInfo& t : adapter.file_->tensors()) {
    std::string name = t.name;
    const std::string prefix = "base_model.model.";
    if (name.rfind(prefix, 0) == 0) name = name.substr(prefix.size());
    size_t pos = name.find(".lora_A.");
    bool is_a = pos != std::string::npos;
    if (!is_a) pos = name.find(".lora_B.");
    if (pos == std::string::npos || name.substr(name.size() - 7) != ".weight") {
      return Unimplemented(weights_path + ": tensor " + t.name +
                           " is not a lora_A or lora_B weight (only LoRA on linears is supported)");
    }
    const std::string module = name.substr(0, pos);
    const std::string last = module.substr(module.rfind('.') + 1);
    if (!modules.empty() && !modules.count(last) && !modules.count(module)) {
      return InvalidArgument(weights_path + ": tensor " + t.name + " is for module " + last +
                             ", which adapter_config.json target_modules does not list");
    }
    if (t.shape.size() != 2) {
      return InvalidArgument(weights_path + ": tensor " + t.name + " is not a matrix");
    }
    Pair& p = adapter.pairs_[module + ".weight"];
    (is_a ? p.a : p.b) = &t;
  }
  for (const auto& [name, p] : adapter.pairs_) {
    if (!p.a || !p.b) {
      return InvalidArgument(weights_path + ": " + name + " has lora_" + (p.a ? "A" : "B") +
                             " but not lora_" + (p.a ? "B" : "A"));
    }
    if (p.a->shape[0] != adapter.rank_ || p.b->shape[1] != adapter.rank_) {
      return InvalidArgument(weights_path + ": " + name + " has lora_A " + p.a->name + " of " +
                             std::to_string(p.a->shape[0]) + " rows and lora_B of " +
                             std::to_string(p.b->shape[1]) +
                             " columns, expected r = " + std::to_string(adapter.rank_));
    }
  }
  if (adapter.pairs_.empty()) return InvalidArgument(weights_path + ": no lora_A/lora_B tensors");
  return adapter;
}

std::set<std::string> LoraAdapter::Targets() const {
  std::set<std::string> out;
  for (const auto& [name, p] : pairs_) out.insert(name);
  return out;
}

Expected<bool> LoraAdapter::Merge(const std::string& weight_name, float* w, int64_t rows,
                                  int64_t cols) const {
  auto it = pairs_.find(weight_name);
  if (it == pairs_.end()) return false;
  const Pair& p = it->second;
  if (p.a->shape[1] != cols || p.b->shape[0] != rows) {
    return InvalidArgument(dir_ + ": adapter for " + weight_name + " is [" +
                           std::to_string(p.b->shape[0]) + ", r] x [r, " +
                           std::to_string(p.a->shape[1]) + "], the weight is [" +
                           std::to_string(rows) + ", " + std::to_string(cols) + "]");
  }
  GZ_RETURN_IF_ERROR(CheckFinite(*p.a));
  GZ_RETURN_IF_ERROR(CheckFinite(*p.b));
  GZ_ASSIGN_OR_RETURN(std::vector<float> a, ReadFloats(*p.a));  // [r, cols]
  GZ_ASSIGN_OR_RETURN(std::vector<float> b, ReadFloats(*p.b));  // [rows, r]
  const float s = static_cast<float>(scale_);
  for (int64_t i = 0; i < rows; ++i) {
    float* row = w + i * cols;
    for (int k = 0; k < rank_; ++k) {
      const float bik = s * b[i * rank_ + k];
      const float* ak = a.data() + k * cols;
      for (int64_t j = 0; j < cols; ++j) row[j] += bik * ak[j];
    }
  }
  return true;
}

}  // namespace gizllm::quant
