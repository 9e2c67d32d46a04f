#include "jobs/calibrate.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <unordered_map>

#include "core/counter_random.h"
#include "jobs/perplexity.h"
#include "model/config.h"
#include "quant/layout.h"
#include "tokenizer/tokenizer.h"

namespace gizllm::quant {
namespace {

// Starts of the self-written calibration text: short and general, so that the continuations
// follow whatever the model learned rather than the prompts.
constexpr const char* kPrompts[] = {"The",  "In the", "Once upon a time", "import",
                                    "Q:",   "It is",  "#",                "A",
                                    "When", "def ",   "Hello",            "1."};

// Keeps tokens of probability at least this share of the most likely one: sampling at
// temperature 1 without the far tail, which a small model's continuations lose their way in.
constexpr double kMinP = 0.05;

// Token of one row of logits, sampled at temperature 1 among the tokens min-p keeps, with the
// uniform number u in [0, 1).
int32_t SampleToken(const float* logits, int64_t vocab, double u) {
  const float max = *std::max_element(logits, logits + vocab);
  const double cut = std::log(kMinP);
  double total = 0.0;
  for (int64_t i = 0; i < vocab; ++i) {
    if (logits[i] - max >= cut) total += std::exp(logits[i] - max);
  }
  double target = u * total, sum = 0.0;
  int32_t last = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    if (logits[i] - max < cut) continue;
    last = static_cast<int32_t>(i);
    sum += std::exp(logits[i] - max);
    if (sum > target) return last;
  }
  return last;
}

// Page tables where block p of slot s is page s * max_pages + p.
struct Slots {
  std::vector<int32_t> pages;
  PageTables tables;
  Slots(int32_t slots, int64_t tokens) {
    int32_t max_pages = static_cast<int32_t>(std::max<int64_t>(1, (tokens + kPage - 1) / kPage));
    pages.resize(static_cast<size_t>(slots) * max_pages);
    for (size_t i = 0; i < pages.size(); ++i) pages[i] = static_cast<int32_t>(i);
    tables = {pages.data(), slots, max_pages};
  }
};

}  // namespace

// Forwards every op to the inner backend. It names each weight it prepares; while a pass is on,
// Matmul quantizes the planned linears it meets on their inputs and reads them quantized.
class Calibrator::Recorder : public Backend {
 public:
  Recorder(std::shared_ptr<Backend> inner, ThreadPool* pool)
      : inner_(std::move(inner)), pool_(pool) {}

  DeviceKind kind() const override { return inner_->kind(); }
  std::string Describe() const override { return inner_->Describe(); }
  Expected<std::unique_ptr<Buffer>> Allocate(size_t bytes) override {
    return inner_->Allocate(bytes);
  }
  void CopyToDevice(void* dst, const void* src, size_t bytes) override {
    inner_->CopyToDevice(dst, src, bytes);
  }
  void CopyToHost(void* dst, const void* src, size_t bytes) override {
    inner_->CopyToHost(dst, src, bytes);
  }
  void CopyOnDevice(void* dst, const void* src, size_t bytes) override {
    inner_->CopyOnDevice(dst, src, bytes);
  }
  Expected<Weight> PrepareWeight(const Weight& host, std::unique_ptr<Buffer>* storage) override {
    GZ_ASSIGN_OR_RETURN(Weight w, inner_->PrepareWeight(host, storage));
    prepared_.push_back(w.data);
    return w;
  }
  Status CheckAttentionShape(int heads, int kv_heads, int head_dim) const override {
    return inner_->CheckAttentionShape(heads, kv_heads, head_dim);
  }
  void Embed(const EmbedParams& p) override { inner_->Embed(p); }
  void RmsNorm(const RmsNormParams& p) override { inner_->RmsNorm(p); }
  void Rope(const RopeParams& p) override { inner_->Rope(p); }
  void KvWrite(const KvWriteParams& p) override { inner_->KvWrite(p); }
  void Attention(const AttentionParams& p) override { inner_->Attention(p); }
  void Glu(const GluParams& p) override { inner_->Glu(p); }
  void Softcap(const SoftcapParams& p) override { inner_->Softcap(p); }
  void Add(const AddParams& p) override { inner_->Add(p); }
  void GatherRows(const GatherRowsParams& p) override { inner_->GatherRows(p); }
  void Synchronize() override { inner_->Synchronize(); }

  void Matmul(const MatmulParams& p) override {
    if (!pass_ || !status_.ok()) return inner_->Matmul(p);
    MatmulParams run = p;
    std::vector<float> gram;  // [cols, cols], shared by the outputs that read the same x
    for (int i = 0; i < p.outputs; ++i) {
      auto name = names_.find(p.w[i]->data);
      if (name == names_.end()) continue;
      std::optional<CalibrationTarget> target = pass_->plan(name->second);
      if (!target) continue;
      if (gram.empty()) gram = Gram(p.x, p.rows, p.w[i]->cols);
      Status s = QuantizeOne(*p.w[i], *target, gram);
      if (!s.ok()) {
        status_ = s;
        break;
      }
      run.w[i] = &pass_->device.at(target->stored);
    }
    inner_->Matmul(run);
  }

  // Names the weights prepared so far from the model's summary: the i-th matrix it lists is the
  // i-th weight it prepared.
  Status NameWeights(const Model& model) {
    size_t i = 0;
    for (const WeightSummary& w : model.weights()) {
      if (w.shape.size() != 2) continue;
      if (i >= prepared_.size()) break;
      names_[prepared_[i++]] = w.name;
    }
    if (i != prepared_.size() || names_.size() != prepared_.size()) {
      return Internal("calibration: the model lists " + std::to_string(i) + " matrices for " +
                      std::to_string(prepared_.size()) + " prepared weights");
    }
    return Status::Ok();
  }

  struct Pass {
    Plan plan;
    Source source;
    QuantizeOptions options;
    GptqOptions gptq;
    std::map<std::string, QuantizedLinear> quantized;
    std::map<std::string, Weight> device;  // the quantized linears as the inner backend reads them
    std::vector<std::unique_ptr<Buffer>> storage;
  };
  void Begin(Pass* pass) {
    pass_ = pass;
    status_ = Status::Ok();
  }
  Status End() {
    pass_ = nullptr;
    return status_;
  }

 private:
  // X^T X of x [rows, cols] (host memory), as the inner backend's float32 matmul of X^T by X^T.
  std::vector<float> Gram(const float* x, int64_t rows, int64_t cols) {
    inner_->Synchronize();
    std::vector<float> xt(cols * rows), gram(cols * cols);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) xt[c * rows + r] = x[r * cols + c];
    }
    Weight w;
    w.format = Format::kF32;
    w.rows = cols;
    w.cols = rows;
    w.data = xt.data();
    MatmulParams m;
    m.x = xt.data();
    m.rows = cols;
    m.w[0] = &w;
    m.out[0] = gram.data();
    inner_->Matmul(m);
    inner_->Synchronize();
    return gram;
  }

  Status QuantizeOne(const Weight& w, const CalibrationTarget& target,
                     const std::vector<float>& gram) {
    if (pass_->device.count(target.stored)) return Status::Ok();  // read a second time
    GZ_ASSIGN_OR_RETURN(std::vector<float> floats, pass_->source(target.stored));
    if (static_cast<int64_t>(floats.size()) != w.rows * w.cols) {
      return InvalidArgument("calibration: " + target.stored + " has " +
                             std::to_string(floats.size()) + " weights, expected " +
                             std::to_string(w.rows * w.cols));
    }
    QuantizeOptions o = pass_->options;
    o.format = target.format;
    GZ_ASSIGN_OR_RETURN(QuantizedLinear q, GptqQuantizeLinear(floats.data(), w.rows, w.cols,
                                                              gram.data(), o, pass_->gptq, pool_));
    auto& stored = pass_->quantized[target.stored] = std::move(q);
    std::unique_ptr<Buffer> storage;
    GZ_ASSIGN_OR_RETURN(Weight device, inner_->PrepareWeight(stored.View(), &storage));
    if (storage) pass_->storage.push_back(std::move(storage));
    pass_->device[target.stored] = device;
    return Status::Ok();
  }

  std::shared_ptr<Backend> inner_;
  ThreadPool* pool_;
  std::vector<const void*> prepared_;                   // data of each prepared weight, in order
  std::unordered_map<const void*, std::string> names_;  // prepared data -> tensor name
  Pass* pass_ = nullptr;
  Status status_;
};

Status CalibrationOptions::Check() const {
  if (rows < 2) return InvalidArgument("calibration: rows " + std::to_string(rows) + " (expected >= 2)");
  if (window < 2) {
    return InvalidArgument("calibration: window " + std::to_string(window) + " (expected >= 2)");
  }
  return Status::Ok();
}

Expected<std::unique_ptr<Calibrator>> Calibrator::Open(const std::string& dir,
                                                       std::shared_ptr<Backend> backend,
                                                       const LoadOptions& load, ThreadPool* pool) {
  if (!backend || backend->kind() != DeviceKind::kCpu) {
    return InvalidArgument("calibration runs on the CPU backend (it reads activations in place)");
  }
  std::unique_ptr<Calibrator> c(new Calibrator());
  c->dir_ = dir;
  c->recorder_ = std::make_shared<Recorder>(std::move(backend), pool);
  GZ_ASSIGN_OR_RETURN(c->model_, Model::Load(dir, c->recorder_, load));
  GZ_RETURN_IF_ERROR(c->recorder_->NameWeights(*c->model_));
  return c;
}

Calibrator::~Calibrator() = default;

Runner& Calibrator::model() { return *model_; }

Expected<std::vector<std::vector<int32_t>>> Calibrator::Sequences(
    const CalibrationOptions& options) {
  GZ_RETURN_IF_ERROR(options.Check());
  if (!options.tokens.empty()) return options.tokens;
  GZ_ASSIGN_OR_RETURN(Tokenizer tokenizer, Tokenizer::Load(dir_));
  std::vector<std::vector<int32_t>> sequences;
  int64_t total = 0;
  if (!options.file.empty()) {
    GZ_ASSIGN_OR_RETURN(std::vector<std::string> texts, ReadTexts(options.file));
    for (const std::string& text : texts) {
      GZ_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tokenizer.Encode(text));
      for (size_t begin = 0; begin + 1 < ids.size() && total < options.rows;
           begin += options.window) {
        size_t end = std::min(ids.size(), begin + options.window);
        end = std::min<size_t>(end, begin + (options.rows - total));
        if (end - begin < 2) break;
        sequences.emplace_back(ids.begin() + begin, ids.begin() + end);
        total += static_cast<int64_t>(end - begin);
      }
      if (total >= options.rows) break;
    }
    if (sequences.empty()) return InvalidArgument(options.file + ": no text of two tokens");
    return sequences;
  }

  // The model's own text: every sequence grows by one sampled token per step, all in one batch.
  const int64_t count = (options.rows + options.window - 1) / options.window;
  std::vector<int64_t> length(count, options.window);
  length.back() = std::max<int64_t>(2, options.rows - (count - 1) * options.window);
  sequences.resize(count);
  int64_t prompt_rows = 0;
  for (int64_t s = 0; s < count; ++s) {
    const char* prompt = kPrompts[s % std::size(kPrompts)];
    GZ_ASSIGN_OR_RETURN(sequences[s], tokenizer.Encode(prompt));
    if (sequences[s].empty()) sequences[s].push_back(0);
    if (static_cast<int64_t>(sequences[s].size()) > length[s] - 1) sequences[s].resize(1);
    prompt_rows += static_cast<int64_t>(sequences[s].size());
  }
  Runner& runner = *model_;
  const int64_t vocab = runner.arch().vocab;
  Slots slots(static_cast<int32_t>(count), options.window);
  GZ_RETURN_IF_ERROR(runner.AllocatePages(slots.tables.slots * slots.tables.max_pages));
  GZ_RETURN_IF_ERROR(runner.Reserve(std::max(prompt_rows, count), slots.tables.slots,
                                    slots.tables.max_pages));
  std::vector<float> logits(count * vocab);
  Rows rows;
  std::vector<int64_t> growing;  // sequences still short of their length, in the step's order
  for (int64_t s = 0; s < count; ++s) {
    const auto& seq = sequences[s];
    for (size_t p = 0; p < seq.size(); ++p) {
      rows.Push(seq[p], static_cast<int32_t>(s), static_cast<int32_t>(p), p + 1 == seq.size());
    }
    growing.push_back(s);
  }
  for (uint64_t step = 0; !growing.empty(); ++step) {
    GZ_RETURN_IF_ERROR(runner.Step(rows, slots.tables, logits.data()));
    rows.Clear();
    std::vector<int64_t> next;
    for (size_t i = 0; i < growing.size(); ++i) {
      const int64_t s = growing[i];
      const double u = CounterUniform(options.seed + static_cast<uint64_t>(s), step);
      sequences[s].push_back(SampleToken(logits.data() + i * vocab, vocab, u));
      const int64_t n = static_cast<int64_t>(sequences[s].size());
      if (n >= length[s]) continue;
      rows.Push(sequences[s].back(), static_cast<int32_t>(s), static_cast<int32_t>(n - 1), true);
      next.push_back(s);
    }
    growing = std::move(next);
  }
  return sequences;
}

Expected<std::map<std::string, QuantizedLinear>> Calibrator::Quantize(
    const std::vector<std::vector<int32_t>>& sequences, const Plan& plan, const Source& source,
    const QuantizeOptions& options, const GptqOptions& gptq) {
  GZ_RETURN_IF_ERROR(gptq.Check());
  if (sequences.empty()) return InvalidArgument("calibration: no sequences");
  int64_t total = 0, longest = 0;
  for (const auto& s : sequences) {
    if (s.empty()) return InvalidArgument("calibration: an empty sequence");
    total += static_cast<int64_t>(s.size());
    longest = std::max<int64_t>(longest, static_cast<int64_t>(s.size()));
  }
  // The head reads only the wanted rows: want every row when the head is to be quantized.
  const Arch& arch = model_->arch();
  const bool head = plan(TensorName(arch, TensorRole::kEmbed, -1)).has_value() ||
                    plan(TensorName(arch, TensorRole::kHead, -1)).has_value();
  Runner& runner = *model_;
  Slots slots(static_cast<int32_t>(sequences.size()), longest);
  GZ_RETURN_IF_ERROR(runner.AllocatePages(slots.tables.slots * slots.tables.max_pages));
  GZ_RETURN_IF_ERROR(runner.Reserve(total, slots.tables.slots, slots.tables.max_pages));
  Rows rows;
  for (size_t s = 0; s < sequences.size(); ++s) {
    for (size_t p = 0; p < sequences[s].size(); ++p) {
      rows.Push(sequences[s][p], static_cast<int32_t>(s), static_cast<int32_t>(p), head);
    }
  }
  std::vector<float> logits(head ? total * arch.vocab : arch.vocab);
  Recorder::Pass pass{plan, source, options, gptq, {}, {}, {}};
  recorder_->Begin(&pass);
  Status step = runner.Step(rows, slots.tables, logits.data());
  Status quantized = recorder_->End();
  GZ_RETURN_IF_ERROR(step);
  GZ_RETURN_IF_ERROR(quantized);
  return std::move(pass.quantized);
}

}  // namespace gizllm::quant
