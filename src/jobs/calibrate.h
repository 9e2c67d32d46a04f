// Calibration for GPTQ (quant/gptq.h): token sequences to run a model on, and one pass of the
// model over them in which every linear is quantized on the inputs it receives.
//
// The pass is sequential in the sense of GPTQ's "true sequential": all calibration sequences go
// through the model in one step (each in its own slot), and a linear is quantized when the step
// first reaches it, on its inputs of that step; its outputs are then computed by the quantized
// linear. So the inputs of every linear are those of the quantized model before it, and the
// quantization of each layer makes up for the errors of the layers before it.
//
// Calibration text must not be the text a quantized model is evaluated on. Without a file, the
// model writes its own: continuations sampled at temperature 1 from a few short prompts (the
// data-free approach of LLM-QAT, Liu et al., 2023).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "model/model.h"
#include "ops/backend.h"
#include "quant/gptq.h"
#include "quant/quantize.h"

namespace gizllm::quant {

struct CalibrationOptions {
  // JSON lines {"text": ...}, read in windows of `window` tokens; empty: text the model writes.
  std::string file;
  int64_t rows = 4096;  // tokens the pass reads, in sequences of at most `window`
  int window = 256;
  uint64_t seed = 1;  // of the sampled continuations
  // Token sequences to read as they are, instead of the file's or the model's text (a benchmark
  // that converts many times calibrates each on the same text).
  std::vector<std::vector<int32_t>> tokens;
  Status Check() const;
};

// Which linears the pass quantizes: a linear the model holds under `name` (its tensor name; a
// tied head under the embedding's name) is quantized into `format` and returned as `stored`.
struct CalibrationTarget {
  Format format = Format::kQ4;
  std::string stored;
};

class Calibrator {
 public:
  // Loads the model in `dir` (a Hugging Face folder) on `backend`, whose memory must be host
  // memory (the CPU backend): the pass reads each linear's inputs in place. GPTQ runs on `pool`.
  static Expected<std::unique_ptr<Calibrator>> Open(const std::string& dir,
                                                    std::shared_ptr<Backend> backend,
                                                    const LoadOptions& load, ThreadPool* pool);
  ~Calibrator();

  Runner& model();

  // Token sequences of the calibration text: options.tokens, options.file's texts cut into
  // windows, or the model's own continuations; options.rows tokens in all (fewer when the file
  // has fewer).
  Expected<std::vector<std::vector<int32_t>>> Sequences(const CalibrationOptions& options);

  using Plan = std::function<std::optional<CalibrationTarget>(const std::string& name)>;
  // The float weights [rows, cols] of a linear to quantize, by its stored name.
  using Source = std::function<Expected<std::vector<float>>(const std::string& stored)>;

  // The pass: runs `sequences` through the model once, quantizing each linear `plan` names with
  // GPTQ (options.format is replaced by the target's format). Returns the quantized linears by
  // stored name; a planned linear the step never reached is absent.
  Expected<std::map<std::string, QuantizedLinear>> Quantize(
      const std::vector<std::vector<int32_t>>& sequences, const Plan& plan, const Source& source,
      const QuantizeOptions& options, const GptqOptions& gptq);

 private:
  class Recorder;
  Calibrator() = default;
  std::string dir_;
  std::shared_ptr<Recorder> recorder_;
  std::unique_ptr<Model> model_;
};

}  // namespace gizllm::quant
