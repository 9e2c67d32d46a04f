#include "model/weights.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "core/dtype.h"
#include "formats/ggml_blocks.h"
#include "formats/gguf.h"
#include "quant/layout.h"
#include "quant/linear_io.h"

namespace gizllm {
namespace {

bool IsNorm(TensorRole role) {
  switch (role) {
    case TensorRole::kFinalNorm:
    case TensorRole::kAttnNorm:
    case TensorRole::kAttnPostNorm:
    case TensorRole::kFfnNorm:
    case TensorRole::kFfnPostNorm:
    case TensorRole::kQNorm:
    case TensorRole::kKNorm:
      return true;
    default:
      return false;
  }
}

}  // namespace

Expected<std::vector<float>> ReadVector(const Checkpoint& ckpt, const std::string& dir,
                                        const std::string& name,
                                        std::span<const int64_t> expected) {
  const TensorInfo* t = ckpt.Find(name);
  if (!t) return NotFound(dir + ": tensor " + name + " is missing");
  GZ_RETURN_IF_ERROR(CheckTensorShape(t->file, name, t->shape, expected));
  int64_t n = 1;
  for (int64_t d : expected) n *= d;
  if (t->dtype != DType::kF32 && t->dtype != DType::kBF16 && t->dtype != DType::kF16) {
    return InvalidArgument(t->file + ": tensor " + name + " has dtype " +
                           std::string(DTypeName(t->dtype)) + ", expected F32, F16 or BF16");
  }
  GZ_RETURN_IF_ERROR(CheckFinite(*t));
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    switch (t->dtype) {
      case DType::kF32:
        std::memcpy(&v[i], t->data + 4 * i, 4);
        break;
      case DType::kBF16:
        std::memcpy(&h, t->data + 2 * i, 2);
        v[i] = Bf16ToF32(h);
        break;
      default:
        std::memcpy(&h, t->data + 2 * i, 2);
        v[i] = F16ToF32(h);
        break;
    }
  }
  return v;
}

WeightLoader::WeightLoader(const Checkpoint& checkpoint, const Arch& arch, Backend& backend,
                           std::string dir, PlacedWeights* placed)
    : checkpoint_(checkpoint),
      arch_(arch),
      backend_(backend),
      dir_(std::move(dir)),
      placed_(placed),
      converted_(checkpoint.metadata().count("gizllm.format_version") > 0) {}

bool WeightLoader::Has(TensorRole role, int layer) const {
  return checkpoint_.Find(TensorName(arch_, role, layer)) != nullptr;
}

Expected<const float*> WeightLoader::Upload(const std::vector<float>& host) {
  GZ_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> buf, backend_.Allocate(host.size() * sizeof(float)));
  backend_.CopyToDevice(buf->data(), host.data(), host.size() * sizeof(float));
  const float* p = buf->as<float>();
  placed_->storage.push_back(std::move(buf));
  return p;
}

Expected<const float*> WeightLoader::Vector(TensorRole role, int layer) {
  const std::string name = TensorName(arch_, role, layer);
  const int64_t n = TensorShape(arch_, role, layer)[0];
  const int64_t shape[] = {n};
  GZ_ASSIGN_OR_RETURN(std::vector<float> host, ReadVector(checkpoint_, dir_, name, shape));
  // In float32, as transformers' (1.0 + weight.float()).
  if (IsNorm(role) && arch_.norm_offset != 0.0f) {
    for (float& v : host) v = arch_.norm_offset + v;
  }
  placed_->parameters += n;
  placed_->summary.push_back({name, "f32", {n}, n * 4});
  return Upload(host);
}

Expected<const float*> WeightLoader::Floats(TensorRole role, int layer) {
  const std::string name = TensorName(arch_, role, layer);
  const std::vector<int64_t> shape = TensorShape(arch_, role, layer);
  GZ_ASSIGN_OR_RETURN(std::vector<float> host, ReadVector(checkpoint_, dir_, name, shape));
  const int64_t n = static_cast<int64_t>(host.size());
  placed_->parameters += n;
  placed_->summary.push_back({name, "f32", shape, n * 4});
  return Upload(host);
}

Expected<Weight> WeightLoader::MatrixRows(TensorRole role, int layer, std::span<const Rows> blocks,
                                          const std::string& part) {
  return GatherRows(TensorName(arch_, role, layer), TensorShape(arch_, role, layer), blocks, part);
}

Expected<Weight> WeightLoader::NamedMatrixRows(const std::string& name,
                                               std::span<const int64_t> shape,
                                               std::span<const Rows> blocks,
                                               const std::string& part) {
  return GatherRows(name, shape, blocks, part);
}

Expected<std::vector<float>> WeightLoader::NamedHost(const std::string& name,
                                                     std::span<const int64_t> shape) {
  GZ_ASSIGN_OR_RETURN(std::vector<float> host, ReadVector(checkpoint_, dir_, name, shape));
  const int64_t n = static_cast<int64_t>(host.size());
  placed_->parameters += n;
  placed_->summary.push_back({name, "f32 (host)", {shape.begin(), shape.end()}, n * 4});
  return host;
}

Expected<Weight> WeightLoader::GatherRows(const std::string& name, std::span<const int64_t> shape,
                                          std::span<const Rows> blocks, const std::string& part) {
  const TensorInfo* t = checkpoint_.Find(name);
  if (!t) return NotFound(dir_ + ": tensor " + name + " is missing");
  if (converted_ && shape.size() == 2) return GatherLinearRows(name, shape, blocks, part);
  GZ_RETURN_IF_ERROR(CheckTensorShape(t->file, name, t->shape, shape));
  // A GGUF matrix kept in ggml's blocks (a gated attention's q) gathers whole rows of blocks.
  GgmlBlock block;
  const bool ggml = t->ggml_type >= 0 && shape.size() == 2 &&
                    GgmlBlockOf(static_cast<GgmlType>(t->ggml_type), &block);
  if (!ggml && t->dtype != DType::kBF16 && t->dtype != DType::kF16 && t->dtype != DType::kF32)
    return InvalidArgument(t->file + ": tensor " + name + " has dtype " +
                           std::string(DTypeName(t->dtype)) + ", expected BF16, F16 or F32");
  int64_t cols = 1;
  for (size_t i = 1; i < shape.size(); ++i) cols *= shape[i];
  const int64_t row_bytes = ggml ? cols / block.elements * block.bytes
                                 : cols * static_cast<int64_t>(DTypeSize(t->dtype));
  int64_t rows = 0;
  for (const Rows& b : blocks) {
    if (b.first < 0 || b.count < 0 || b.first + b.count > shape[0])
      return Internal(name + ": rows [" + std::to_string(b.first) + ", " +
                      std::to_string(b.first + b.count) + ") outside the tensor");
    rows += b.count;
  }
  auto copy = std::make_unique<uint8_t[]>(rows * row_bytes);
  uint8_t* at = copy.get();
  for (const Rows& b : blocks) {
    std::memcpy(at, t->data + b.first * row_bytes, b.count * row_bytes);
    at += b.count * row_bytes;
  }
  Weight host;
  host.format = ggml ? Format::kGgml : FormatOf(t->dtype);
  if (ggml) host.ggml_type = static_cast<uint32_t>(t->ggml_type);
  host.rows = rows;
  host.cols = cols;
  host.data = copy.get();
  placed_->host.push_back(std::move(copy));
  if (ggml) return Place(host, name + " (" + part + ")");
  std::unique_ptr<Buffer> storage;
  GZ_ASSIGN_OR_RETURN(Weight w, backend_.PrepareWeight(host, &storage));
  if (storage) placed_->storage.push_back(std::move(storage));
  placed_->parameters += rows * cols;
  placed_->bytes += host.Bytes();
  placed_->summary.push_back(
      {name + " (" + part + ")", FormatName(host.format), {rows, cols}, host.Bytes()});
  return w;
}

Expected<Weight> WeightLoader::GatherLinearRows(const std::string& name,
                                                std::span<const int64_t> shape,
                                                std::span<const Rows> blocks,
                                                const std::string& part) {
  const TensorInfo* t = checkpoint_.Find(name);
  GZ_ASSIGN_OR_RETURN(Weight whole, quant::ReadLinear(checkpoint_, name));
  const int64_t stored[] = {whole.rows, whole.cols};
  GZ_RETURN_IF_ERROR(CheckTensorShape(t->file, name, stored, shape));
  // Bytes a row takes in each array: codes (or plain values), scales, zeros. A quantized row is
  // its own groups, so rows gather as the plain ones do.
  const bool quantized = quant::IsQuantized(whole.format);
  const int64_t groups = whole.cols / quant::kGroup;
  GgmlBlock block;
  const bool ggml =
      whole.format == Format::kGgml && GgmlBlockOf(static_cast<GgmlType>(whole.ggml_type), &block);
  const int64_t row_bytes[3] = {quantized ? groups * quant::GroupBytes(whole.format)
                                : ggml    ? whole.cols / block.elements * block.bytes
                                          : whole.cols * static_cast<int64_t>(DTypeSize(t->dtype)),
                                quantized ? groups * static_cast<int64_t>(sizeof(float)) : 0,
                                whole.zeros ? groups * static_cast<int64_t>(sizeof(float)) : 0};
  const void* from[3] = {whole.data, whole.scales, whole.zeros};
  int64_t rows = 0;
  for (const Rows& b : blocks) {
    if (b.first < 0 || b.count < 0 || b.first + b.count > whole.rows)
      return Internal(name + ": rows [" + std::to_string(b.first) + ", " +
                      std::to_string(b.first + b.count) + ") outside the tensor");
    rows += b.count;
  }
  Weight host = whole;
  host.rows = rows;
  const void** to[3] = {&host.data, &host.scales, &host.zeros};
  for (int a = 0; a < 3; ++a) {
    if (row_bytes[a] == 0) continue;
    auto copy = std::make_unique<uint8_t[]>(rows * row_bytes[a]);
    uint8_t* at = copy.get();
    for (const Rows& b : blocks) {
      std::memcpy(at, static_cast<const uint8_t*>(from[a]) + b.first * row_bytes[a],
                  b.count * row_bytes[a]);
      at += b.count * row_bytes[a];
    }
    *to[a] = copy.get();
    placed_->host.push_back(std::move(copy));
  }
  return Place(host, name + " (" + part + ")");
}

Expected<Weight> WeightLoader::Named(const std::string& name) {
  const TensorInfo* t = checkpoint_.Find(name);
  if (!t) return NotFound(dir_ + ": tensor " + name + " is missing");
  if (t->dtype != DType::kBF16 && t->dtype != DType::kF16 && t->dtype != DType::kF32)
    return InvalidArgument(t->file + ": tensor " + name + " has dtype " +
                           std::string(DTypeName(t->dtype)) + ", expected BF16, F16 or F32");
  if (t->shape.empty()) return InvalidArgument(t->file + ": tensor " + name + " is a scalar");
  Weight host;
  host.format = FormatOf(t->dtype);
  host.cols = t->shape.back();
  host.rows = t->Elements() / std::max<int64_t>(1, host.cols);
  host.data = t->data;
  std::unique_ptr<Buffer> storage;
  GZ_ASSIGN_OR_RETURN(Weight w, backend_.PrepareWeight(host, &storage));
  if (storage) placed_->storage.push_back(std::move(storage));
  placed_->parameters += t->Elements();
  placed_->bytes += host.Bytes();
  placed_->summary.push_back({name, FormatName(host.format), t->shape, host.Bytes()});
  return w;
}

Expected<Weight> WeightLoader::NamedMatrix(const std::string& name, int64_t rows, int64_t cols) {
  const TensorInfo* t = checkpoint_.Find(name);
  if (!t) return NotFound(dir_ + ": tensor " + name + " is missing");
  const int64_t shape[] = {rows, cols};
  GZ_RETURN_IF_ERROR(CheckTensorShape(t->file, name, t->shape, shape));
  return Named(name);
}

Expected<const float*> WeightLoader::NamedVector(const std::string& name, int64_t n) {
  const int64_t shape[] = {n};
  GZ_ASSIGN_OR_RETURN(std::vector<float> host, ReadVector(checkpoint_, dir_, name, shape));
  placed_->parameters += n;
  placed_->summary.push_back({name, "f32", {n}, n * 4});
  return Upload(host);
}

// Matrices are not scanned for NaN at load (a full read of every weight); a non-finite logit
// stops the request that meets one instead.
Expected<Weight> WeightLoader::Matrix(TensorRole role, int layer) {
  const std::string name = TensorName(arch_, role, layer);
  const std::vector<int64_t> shape = TensorShape(arch_, role, layer);
  const int64_t rows = shape[0], cols = shape[1];
  const TensorInfo* t = checkpoint_.Find(name);
  if (!t) return NotFound(dir_ + ": tensor " + name + " is missing");
  Weight host;
  if (converted_) {
    // A converted folder: the matrix's format is in the header's metadata (the embedding's too
    // where it keeps a GGUF file's blocks; else it is plain).
    GZ_ASSIGN_OR_RETURN(host, quant::ReadLinear(checkpoint_, name));
    const int64_t stored[] = {host.rows, host.cols};
    GZ_RETURN_IF_ERROR(CheckTensorShape(t->file, name, stored, shape));
  } else if (t->ggml_type >= 0) {
    // A GGUF matrix kept in ggml's blocks, which the backend reads as they are.
    GZ_RETURN_IF_ERROR(CheckTensorShape(t->file, name, t->shape, shape));
    host.format = Format::kGgml;
    host.ggml_type = static_cast<uint32_t>(t->ggml_type);
    host.rows = rows;
    host.cols = cols;
    host.data = t->data;
  } else {
    GZ_RETURN_IF_ERROR(CheckTensorShape(t->file, name, t->shape, shape));
    if (t->dtype != DType::kBF16 && t->dtype != DType::kF16 && t->dtype != DType::kF32)
      return InvalidArgument(t->file + ": tensor " + name + " has dtype " +
                             std::string(DTypeName(t->dtype)) + ", expected BF16, F16 or F32");
    host.format = FormatOf(t->dtype);
    host.rows = rows;
    host.cols = cols;
    host.data = t->data;
  }
  return Place(host, name);
}

Expected<Weight> WeightLoader::Place(const Weight& given, const std::string& shown, bool on_host,
                                     bool expert) {
  Weight host = given;
  if (host.format == Format::kGgml && !backend_.ReadsGgml(host.ggml_type)) {
    // A converted folder keeps a GGUF file's block types; those this backend does not read as
    // they are become float32 here, as a GGUF file's do (OpenGgufModel).
    const GgmlType type = static_cast<GgmlType>(host.ggml_type);
    auto copy = std::make_unique<uint8_t[]>(host.rows * host.cols * sizeof(float));
    GZ_RETURN_IF_ERROR(DequantizeBlocks(type, static_cast<const uint8_t*>(host.data), host.Bytes(),
                                        host.rows * host.cols, reinterpret_cast<float*>(copy.get()),
                                        dir_ + ": tensor " + shown));
    if (noticed_.insert(host.ggml_type).second) {
      std::fprintf(stderr, "%s: %s tensors are converted to F32 at load (exactly)\n", dir_.c_str(),
                   GgmlTypeName(type).c_str());
    }
    host.format = Format::kF32;
    host.data = copy.get();
    placed_->host.push_back(std::move(copy));
  }
  Weight w = host;
  if (!on_host) {
    std::unique_ptr<Buffer> storage;
    GZ_ASSIGN_OR_RETURN(w, backend_.PrepareWeight(host, &storage));
    if (storage && !expert) backend_.AddBf16Copy(&w, &storage);
    if (storage) placed_->storage.push_back(std::move(storage));
  }
  placed_->parameters += host.rows * host.cols;
  placed_->bytes += host.Bytes();
  const std::string format = host.format == Format::kGgml
                                 ? GgmlTypeName(static_cast<GgmlType>(host.ggml_type))
                                 : FormatName(host.format);
  placed_->summary.push_back({shown, format, {host.rows, host.cols}, host.Bytes()});
  return w;
}

Expected<Weight> WeightLoader::PlaceExpert(const Weight& host) {
  std::unique_ptr<Buffer> storage;
  GZ_ASSIGN_OR_RETURN(Weight w, backend_.PrepareWeight(host, &storage));
  // A quantized expert may get its bf16 copy, which the grouped path of many rows multiplies.
  if (storage && quant::IsQuantized(w.format)) backend_.AddBf16Copy(&w, &storage);
  if (storage) placed_->storage.push_back(std::move(storage));
  return w;
}

Expected<Weight> WeightLoader::ExpertMatrix(TensorRole role, int layer, int expert) {
  if (role != TensorRole::kExpertGate && role != TensorRole::kExpertUp &&
      role != TensorRole::kExpertDown)
    return Internal("ExpertMatrix: not an expert role");
  const MoeSpec& moe = arch_.layer[layer].moe;
  const std::vector<int64_t> shape = TensorShape(arch_, role, layer);
  const int64_t rows = shape[0], cols = shape[1];
  const TensorRole stacked_role =
      role == TensorRole::kExpertDown ? TensorRole::kExpertsDown : TensorRole::kExpertsGateUp;
  const std::string stacked_name = TensorName(arch_, stacked_role, layer);
  const TensorInfo* stacked = checkpoint_.Find(stacked_name);
  const std::string name = stacked ? stacked_name : ExpertTensorName(arch_, role, layer, expert);
  const TensorInfo* t = stacked ? stacked : checkpoint_.Find(name);
  if (!t) return NotFound(dir_ + ": tensor " + name + " is missing");
  // Experts in ggml's blocks that the backend reads in matmuls but not in its expert kernels
  // (the others become float32 in Place).
  auto refuse_blocks = [&](uint32_t ggml_type) -> Status {
    if (!backend_.ReadsGgml(ggml_type) || backend_.ReadsGgmlExperts(ggml_type)) return Status::Ok();
    return Unimplemented(t->file + ": the experts are in " +
                         GgmlTypeName(static_cast<GgmlType>(ggml_type)) +
                         ", which this device's mixture-of-experts kernels do not read (tensor " +
                         name + "); run on the CPU (--device cpu), or convert the weights once "
                         "into the own formats (gizllm convert --from MODEL --to DIR --bits 4 or 8)");
  };
  if (converted_ && !stacked) {
    // A converted folder holds every expert's linear under its own name (convert splits stacked
    // ones), quantized or plain as its metadata says.
    GZ_ASSIGN_OR_RETURN(Weight host, quant::ReadLinear(checkpoint_, name));
    const int64_t stored[] = {host.rows, host.cols};
    GZ_RETURN_IF_ERROR(CheckTensorShape(t->file, name, stored, shape));
    if (host.format == Format::kGgml) GZ_RETURN_IF_ERROR(refuse_blocks(host.ggml_type));
    return Place(host, name, experts_on_host_, /*expert=*/true);
  }
  if (t->ggml_type >= 0 && !stacked) {
    // A GGUF file's expert in ggml's blocks (its stack split by OpenGgufModel).
    GZ_RETURN_IF_ERROR(CheckTensorShape(t->file, name, t->shape, shape));
    GZ_RETURN_IF_ERROR(refuse_blocks(static_cast<uint32_t>(t->ggml_type)));
    Weight host;
    host.format = Format::kGgml;
    host.ggml_type = static_cast<uint32_t>(t->ggml_type);
    host.rows = rows;
    host.cols = cols;
    host.data = t->data;
    return Place(host, name, experts_on_host_, /*expert=*/true);
  }
  if (t->dtype != DType::kBF16 && t->dtype != DType::kF16 && t->dtype != DType::kF32)
    return InvalidArgument(t->file + ": tensor " + name + " has dtype " +
                           std::string(DTypeName(t->dtype)) + ", expected BF16, F16 or F32");
  Weight host;
  host.format = FormatOf(t->dtype);
  host.rows = rows;
  host.cols = cols;
  host.data = t->data;
  const std::vector<int64_t> stacked_shape = TensorShape(arch_, stacked_role, layer);
  // Gate and up take their rows of the block [2 * ffn, dim]: gate's first.
  const int64_t first = role == TensorRole::kExpertUp ? moe.ffn : 0;
  if (stacked && moe.transposed_stacks && t->shape != stacked_shape &&
      t->shape == std::vector<int64_t>{stacked_shape[0], stacked_shape[2], stacked_shape[1]}) {
    // Expert e's block transposed ([dim, 2 * ffn] or [ffn, dim]): a host copy of its matrix.
    const size_t size = DTypeSize(t->dtype);
    const int64_t block_cols = stacked_shape[1];  // the stored block's row length
    const uint8_t* block = t->data + static_cast<int64_t>(expert) * block_cols * cols * size;
    auto copy = std::make_unique<uint8_t[]>(rows * cols * size);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        std::memcpy(copy.get() + (r * cols + c) * size, block + (c * block_cols + first + r) * size,
                    size);
      }
    }
    host.data = copy.get();
    placed_->host.push_back(std::move(copy));
  } else if (stacked) {
    GZ_RETURN_IF_ERROR(CheckTensorShape(t->file, name, t->shape, stacked_shape));
    // Expert e's [rows, cols] block; gate is the first moe.ffn rows of its gate_up block.
    const int64_t block_rows = stacked_shape[1];
    const int64_t first_row = static_cast<int64_t>(expert) * block_rows + first;
    host.data = t->data + first_row * cols * DTypeSize(t->dtype);
  } else {
    GZ_RETURN_IF_ERROR(CheckTensorShape(t->file, name, t->shape, shape));
  }
  std::string shown = stacked ? stacked_name + "[" + std::to_string(expert) + "]" +
                                    (role == TensorRole::kExpertGate ? " gate"
                                     : role == TensorRole::kExpertUp ? " up"
                                                                     : "")
                              : name;
  return Place(host, shown, experts_on_host_, /*expert=*/true);
}

}  // namespace gizllm
