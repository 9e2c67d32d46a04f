// WeightLoader: a model's tensors read by role from its checkpoint and placed on a backend.
// Blocks load their own weights through it; it checks each tensor's name, shape and dtype and
// keeps what it placed (device copies, the summary `info` shows, the counts).
#pragma once

#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "formats/safetensors.h"
#include "model/arch.h"
#include "model/config.h"
#include "ops/backend.h"

namespace gizllm {

// What loading read, for `gizllm info`.
struct WeightSummary {
  std::string name;
  std::string format;  // "bf16", "q4", ...
  std::vector<int64_t> shape;
  int64_t bytes = 0;
};

// Everything a loader placed; lives as long as the model.
struct PlacedWeights {
  std::vector<std::unique_ptr<Buffer>> storage;  // device copies of weights and vectors
  // Host matrices made at load (rows gathered from a checkpoint tensor: MatrixRows), which the
  // prepared weights may use in place.
  std::vector<std::unique_ptr<uint8_t[]>> host;
  std::vector<WeightSummary> summary;
  int64_t parameters = 0;
  int64_t bytes = 0;  // of the matrices
};

// A tensor (F32, F16 or BF16) of the expected shape as float32 on the host, every value checked
// finite: small tensors (norm weights, biases, convolution taps) and weights a host computation
// reads. Errors name `dir`'s file and the tensor.
Expected<std::vector<float>> ReadVector(const Checkpoint& ckpt, const std::string& dir,
                                        const std::string& name,
                                        std::span<const int64_t> expected);

class WeightLoader {
 public:
  WeightLoader(const Checkpoint& checkpoint, const Arch& arch, Backend& backend, std::string dir,
               PlacedWeights* placed);

  bool Has(TensorRole role, int layer) const;
  // A norm weight or a bias, float32 on the device. Norms come back as weight + arch.norm_offset
  // (Gemma's (1 + w)), so that every op multiplies by the vector alone.
  Expected<const float*> Vector(TensorRole role, int layer);
  // A matrix (the embedding, the head, a linear) in the format it is stored in.
  Expected<Weight> Matrix(TensorRole role, int layer);
  // Expert `expert`'s kExpertGate, kExpertUp or kExpertDown matrix of a mixture-of-experts
  // layer: its own tensor (in a converted folder, quantized or plain as its metadata says), or
  // its part of the layer's kExpertsGateUp or kExpertsDown tensor (transformers 5's layout, plain
  // formats) where the checkpoint holds those.
  Expected<Weight> ExpertMatrix(TensorRole role, int layer, int expert);
  // With `on`, ExpertMatrix counts what it reads but leaves it on the host (a pointer into the
  // memory-mapped file, or a host copy the loader keeps): the model then places its experts, or
  // has the backend's expert cache read them as steps pick them.
  void KeepExpertsOnHost(bool on) { experts_on_host_ = on; }
  // A host weight ExpertMatrix kept on the host, placed on the backend now (counted already);
  // a quantized one may get the backend's bf16 copy (Backend::AddBf16Copy), which the grouped
  // path of many rows reads.
  Expected<Weight> PlaceExpert(const Weight& host);
  // Host floats copied to the device.
  Expected<const float*> Upload(const std::vector<float>& host);
  // A small tensor of any shape (a convolution's taps, per-head constants) as float32 on the
  // device, flattened; never offset as norms are.
  Expected<const float*> Floats(TensorRole role, int layer);
  // The rows [first, first + count) of each block of a matrix, in that order, as one matrix
  // (a fused projection split into its parts, or reordered): plain formats, and in a converted
  // folder quantized linears too (their rows gathered with their scales and zeros). `part` names
  // it in the summary.
  struct Rows {
    int64_t first = 0;
    int64_t count = 0;
  };
  Expected<Weight> MatrixRows(TensorRole role, int layer, std::span<const Rows> blocks,
                              const std::string& part);
  // Any tensor by name, as a matrix [product of all dims but the last, last dim] (a vector:
  // [1, n]) in its stored format. Plain formats only.
  Expected<Weight> Named(const std::string& name);
  // Tensors by name with the shape they must have (families whose tensors have no TensorRole:
  // the encoders): a matrix [rows, cols] in a plain format, or a vector [n] as float32.
  Expected<Weight> NamedMatrix(const std::string& name, int64_t rows, int64_t cols);
  Expected<const float*> NamedVector(const std::string& name, int64_t n);
  // A tensor of `shape` as float32 on the host (a table the host reads: the vision tower's
  // position table), counted as loaded.
  Expected<std::vector<float>> NamedHost(const std::string& name, std::span<const int64_t> shape);
  // MatrixRows by name: the tensor of `shape` read as a matrix [shape[0], the product of the
  // other dims] (a convolution whose kernel equals its stride is a linear over its window).
  Expected<Weight> NamedMatrixRows(const std::string& name, std::span<const int64_t> shape,
                                   std::span<const Rows> blocks, const std::string& part);

 private:
  const Checkpoint& checkpoint_;
  const Arch& arch_;
  Expected<Weight> GatherRows(const std::string& name, std::span<const int64_t> shape,
                              std::span<const Rows> blocks, const std::string& part);
  // GatherRows of a converted folder's linear (quant::ReadLinear: quantized or plain).
  Expected<Weight> GatherLinearRows(const std::string& name, std::span<const int64_t> shape,
                                    std::span<const Rows> blocks, const std::string& part);
  // host placed on the backend and counted; `shown` names it in the summary. ggml blocks the
  // backend does not read (ReadsGgml) are converted to float32 first.
  // With on_host, counted but left on the host (ggml blocks converted all the same). A linear
  // (not an expert's: the expert kernels read their blocks) may get the backend's bf16 copy
  // (Backend::AddBf16Copy).
  Expected<Weight> Place(const Weight& host, const std::string& shown, bool on_host = false,
                         bool expert = false);

  Backend& backend_;
  std::string dir_;
  PlacedWeights* placed_;
  bool converted_;
  bool experts_on_host_ = false;
  std::set<uint32_t> noticed_;  // ggml block types converted to float32 (one notice each)
};

}  // namespace gizllm
