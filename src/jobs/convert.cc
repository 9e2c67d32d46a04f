#include "jobs/convert.h"

#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include "core/dtype.h"
#include "core/mapped_file.h"
#include "formats/ggml_blocks.h"
#include "formats/gguf.h"
#include "formats/safetensors.h"
#include "jobs/lora.h"
#include "model/bitgpu_model.h"
#include "model/config.h"
#include "model/gguf_model.h"
#include "model/vision_arch.h"
#include "quant/blocks.h"
#include "quant/layout.h"
#include "quant/linear_io.h"
#include "quant/quantize.h"
#include "tokenizer/tokenizer.h"

namespace gizllm::quant {
namespace {

namespace fs = std::filesystem;

// Files of a model folder, other than weights, that a converted folder keeps.
constexpr const char* kSideFiles[] = {"config.json",
                                      "generation_config.json",
                                      "tokenizer.json",
                                      "tokenizer_config.json",
                                      "special_tokens_map.json",
                                      "added_tokens.json",
                                      "chat_template.jinja",
                                      "chat_template.json",
                                      "tokenizer.model",
                                      "vocab.json",
                                      "merges.txt",
                                      "preprocessor_config.json",
                                      "video_preprocessor_config.json"};

// What convert does with one source tensor: kTower copies it as it is into the tower's file.
// kExperts: a layer's experts stacked in one tensor (transformers 5's gate_up_proj or down_proj),
// written as one linear per expert under the per-expert names (ExpertTensorName), which is how a
// loader reads a converted folder's experts. kBlocks: a GGUF matrix kept in its ggml blocks,
// written with its description (quant/linear_io.h).
enum class Action { kDrop, kCopy, kFloat32, kLinear, kExperts, kTower, kBlocks };

struct Plan {
  Action action = Action::kCopy;
  Format format = Format::kBf16;  // kLinear
};

// The layer a tensor belongs to, or -1: its name starts with the layer's prefix, e.g.
// "model.layers.3." (taken from the family's name of the layer's q projection).
int LayerOf(const std::string& name, const std::vector<std::string>& prefixes) {
  for (size_t l = 0; l < prefixes.size(); ++l) {
    if (!prefixes[l].empty() && name.rfind(prefixes[l], 0) == 0) return static_cast<int>(l);
  }
  return -1;
}

std::string LayerPrefix(const Arch& arch, int layer) {
  std::string q = TensorName(arch, TensorRole::kQ, layer);
  const std::string mark = "." + std::to_string(layer) + ".";
  size_t pos = q.find(mark);
  return pos == std::string::npos ? "" : q.substr(0, pos + mark.size());
}

// The tensors convert writes. With a writer each goes to the file as it comes, on a thread of
// its own, so that the next tensor is read and quantized while one is written (the copy into the
// page cache, and the disk where it holds the writes back); at most kMaxQueued bytes wait, so
// convert holds a few tensors at a time. Without, they are kept (their bytes owned here, or in
// place in the source) and written at the end (the vision tower's file).
class Output {
 public:
  explicit Output(SafetensorsWriter* writer = nullptr) : writer_(writer) {
    if (writer_) thread_ = std::thread([this] { Write(); });
  }
  Output(const Output&) = delete;
  Output& operator=(const Output&) = delete;
  // An error on the way out leaves the tensors not written yet unwritten.
  ~Output() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = abandon_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  // In place in the source's mapping, which outlives the writes; `written` runs once it is
  // written (the mapped pages released there).
  Status AddInPlace(const TensorInfo& t, std::function<void()> written = {}) {
    return Push({t.name, t.dtype, t.shape, t.data, t.bytes}, nullptr, std::move(written));
  }
  // A matrix in ggml's blocks, in place as AddInPlace's: U8 [rows, bytes of a row's blocks].
  Status AddBlocks(const TensorInfo& t, std::function<void()> written = {}) {
    const int64_t rows = t.shape[0];
    return Push({t.name, DType::kU8, {rows, static_cast<int64_t>(t.bytes) / rows}, t.data, t.bytes},
                nullptr, std::move(written));
  }
  // Owned from here on.
  template <typename T>
  Status AddVector(std::string name, DType dtype, std::vector<int64_t> shape, std::vector<T>&& v) {
    auto kept = std::make_shared<std::vector<T>>(std::move(v));
    return Push({std::move(name), dtype, std::move(shape), kept->data(), kept->size() * sizeof(T)},
                kept);
  }
  // Borrowed: `v` stays as it is until WaitWritten(ticket()) returns (without a writer it is
  // copied).
  template <typename T>
  Status AddBorrowed(std::string name, DType dtype, std::vector<int64_t> shape,
                     const std::vector<T>& v) {
    if (!writer_) {
      auto copy = std::make_shared<std::vector<T>>(v);
      return Push(
          {std::move(name), dtype, std::move(shape), copy->data(), copy->size() * sizeof(T)}, copy);
    }
    return Push({std::move(name), dtype, std::move(shape), v.data(), v.size() * sizeof(T)},
                nullptr);
  }
  // Tensors added so far; WaitWritten(n): until the first n are written (or failed).
  int64_t ticket() const { return added_; }
  void WaitWritten(int64_t n) {
    if (!writer_) return;
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return written_ >= n; });
  }
  // Every tensor written; the first error of a write.
  Status Finish() {
    if (thread_.joinable()) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
      }
      cv_.notify_all();
      thread_.join();
    }
    return error_;
  }
  int64_t count() const { return writer_ ? added_ : static_cast<int64_t>(kept_.size()); }
  const std::vector<TensorToWrite>& kept() const { return kept_; }

 private:
  static constexpr size_t kMaxQueued = size_t{1} << 30;
  struct Job {
    TensorToWrite t;
    std::shared_ptr<const void> keep;
    std::function<void()> written;
  };

  Status Push(TensorToWrite t, std::shared_ptr<const void> keep,
              std::function<void()> written = {}) {
    if (!writer_) {
      if (keep) owned_.push_back(std::move(keep));
      kept_.push_back(std::move(t));
      return Status::Ok();
    }
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock,
             [&] { return !error_.ok() || jobs_.empty() || queued_ + t.bytes <= kMaxQueued; });
    if (!error_.ok()) return error_;
    queued_ += t.bytes;
    jobs_.push_back({std::move(t), std::move(keep), std::move(written)});
    ++added_;
    cv_.notify_all();
    return Status::Ok();
  }

  void Write() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty() || abandon_) return;
      Job& job = jobs_.front();  // a deque's elements stay where they are as others are added
      Status s = Status::Ok();
      if (error_.ok()) {
        lock.unlock();
        s = writer_->Add(job.t);
        if (job.written) job.written();
        lock.lock();
      }
      if (!s.ok() && error_.ok()) error_ = std::move(s);
      queued_ -= job.t.bytes;
      jobs_.pop_front();
      ++written_;
      cv_.notify_all();
    }
  }

  SafetensorsWriter* writer_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  size_t queued_ = 0;
  int64_t added_ = 0, written_ = 0;
  bool stop_ = false, abandon_ = false;
  Status error_ = Status::Ok();
  std::vector<std::shared_ptr<const void>> owned_;
  std::vector<TensorToWrite> kept_;
};

// Whether convert quantizes a layer's tensor of `role` (the expert roles aside). The router, the
// shared expert's gate and the recurrent layers' b and a projections (one row per expert or
// head, each a gate) keep their precision, as do convolutions and vectors.
bool QuantizedRole(TensorRole role) {
  switch (role) {
    case TensorRole::kQ:
    case TensorRole::kK:
    case TensorRole::kV:
    case TensorRole::kO:
    case TensorRole::kGate:
    case TensorRole::kUp:
    case TensorRole::kDown:
    case TensorRole::kSharedGate:
    case TensorRole::kSharedUp:
    case TensorRole::kSharedDown:
    case TensorRole::kRecurrentQkv:
    case TensorRole::kRecurrentZ:
    case TensorRole::kRecurrentQkvz:
    case TensorRole::kRecurrentOut:
      return true;
    default:
      return false;
  }
}

bool IsExpertRole(TensorRole role) {
  return role == TensorRole::kExpertGate || role == TensorRole::kExpertUp ||
         role == TensorRole::kExpertDown;
}

Status WriteText(const std::string& path, const std::string& text) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return InvalidArgument("convert: cannot write " + path);
  bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  ok = std::fclose(f) == 0 && ok;
  if (!ok) return InvalidArgument("convert: cannot write " + path);
  return Status::Ok();
}

// The side files of Hugging Face folder `from` copied into `dir` (kSideFiles; `untie`: the
// folder stores its own head, which config.json then says).
Status CopySideFiles(const std::string& from, bool untie, const std::string& dir) {
  for (const char* file : kSideFiles) {
    const std::string src = from + "/" + file;
    if (!FileExists(src)) continue;
    if (untie && std::string(file) == "config.json") {
      // Without it a loader would read the embedding as the head.
      GZ_ASSIGN_OR_RETURN(std::string text, ReadFile(src));
      nlohmann::json config = nlohmann::json::parse(text, nullptr, false);
      if (!config.is_object()) return InvalidArgument(src + ": not a JSON object");
      config["tie_word_embeddings"] = false;
      GZ_RETURN_IF_ERROR(WriteText(dir + "/config.json", config.dump(2) + "\n"));
      continue;
    }
    std::error_code ec;
    fs::copy_file(src, dir + "/" + file, ec);
    if (ec) return InvalidArgument("convert: cannot copy " + src + ": " + ec.message());
  }
  return Status::Ok();
}

// What a Hugging Face folder holds beside its weights, from a GGUF file's metadata: config.json
// (the fields ReadGgufConfig gives; `untie`: the folder stores its own head), tokenizer.json
// (Tokenizer::JsonFromGguf, where the file has tokenizer.ggml.model) and tokenizer_config.json
// (the bos and eos tokens' texts, the chat template and its tool_use variant). Sets
// summary->tokenizer. A bitgpu folder takes no config.json (its manifest holds the arch).
Status WriteGgufSideFiles(const std::string& from, bool untie, const std::string& dir,
                          ConvertSummary* summary, bool with_config = true) {
  GZ_ASSIGN_OR_RETURN(GgufFile f, GgufFile::Open(from));
  if (with_config) {
    GZ_ASSIGN_OR_RETURN(nlohmann::json config, ReadGgufConfig(f));
    if (untie) config["tie_word_embeddings"] = false;
    GZ_RETURN_IF_ERROR(WriteText(dir + "/config.json", config.dump(2) + "\n"));
  }
  summary->tokenizer = f.Find("tokenizer.ggml.model") != nullptr;
  if (summary->tokenizer) {
    GZ_ASSIGN_OR_RETURN(std::string tokenizer, Tokenizer::JsonFromGguf(f));
    GZ_RETURN_IF_ERROR(WriteText(dir + "/tokenizer.json", tokenizer));
  }
  nlohmann::ordered_json tc = nlohmann::ordered_json::object();
  const GgufValue* tokens = f.Find("tokenizer.ggml.tokens");
  for (const char* name : {"bos", "eos"}) {
    const std::string key = std::string("tokenizer.ggml.") + name + "_token_id";
    if (!f.Find(key)) continue;
    GZ_ASSIGN_OR_RETURN(uint64_t id, f.GetUint(key));
    if (!tokens || tokens->type != GgufType::kArray || id >= tokens->strings.size()) {
      return InvalidArgument(from + ": metadata \"" + key + "\" = " + std::to_string(id) +
                             " is not an id of tokenizer.ggml.tokens");
    }
    tc[std::string(name) + "_token"] = tokens->strings[id];
  }
  if (f.Find("tokenizer.chat_template")) {
    GZ_ASSIGN_OR_RETURN(std::string source, f.GetString("tokenizer.chat_template"));
    if (f.Find("tokenizer.chat_template.tool_use")) {
      GZ_ASSIGN_OR_RETURN(std::string tool_use, f.GetString("tokenizer.chat_template.tool_use"));
      tc["chat_template"] =
          nlohmann::ordered_json::array({{{"name", "default"}, {"template", source}},
                                         {{"name", "tool_use"}, {"template", tool_use}}});
    } else {
      tc["chat_template"] = source;
    }
  }
  if (!tc.empty()) {
    GZ_RETURN_IF_ERROR(WriteText(dir + "/tokenizer_config.json", tc.dump(2) + "\n"));
  }
  return Status::Ok();
}

// A bitgpu folder (model/bitgpu_model.h) of a Q1_0 GGUF file: manifest.json (version 2, every
// quantized tensor a q1_0 container over its blocks in the file, the norms F32 ranges), the aux
// file with the tgt2 and tgt4 tables, the file itself copied unchanged as the data file (a hard
// link where the file system allows one), and the tokenizer's files.
Expected<ConvertSummary> ConvertToBitgpu(const ConvertOptions& options) {
  GZ_ASSIGN_OR_RETURN(GgufFile f, GgufFile::Open(options.from));
  GZ_ASSIGN_OR_RETURN(Arch arch, ReadGgufArch(f));
  GZ_ASSIGN_OR_RETURN(nlohmann::json config, ReadGgufConfig(f));
  const std::string& from = options.from;
  if (arch.family != "qwen3") {
    return Unimplemented(from + ": general.architecture \"" + arch.family +
                         "\" has no bitgpu folder (bitgpu's kernels run qwen3)");
  }
  if (arch.rope.type != "default") {
    return Unimplemented(from + ": rope scaling " + arch.rope.type +
                         " has no place in a bitgpu manifest (plain rope only here)");
  }
  if (!f.Find("tokenizer.ggml.eos_token_id")) {
    return NotFound(from +
                    ": metadata \"tokenizer.ggml.eos_token_id\" is missing (the "
                    "manifest's arch.eos)");
  }
  GZ_ASSIGN_OR_RETURN(uint64_t eos, f.GetUint("tokenizer.ggml.eos_token_id"));
  const uint64_t data_offset = f.data_offset();
  auto region = [&](const std::string& name, int64_t rows,
                    int64_t cols) -> Expected<nlohmann::json> {
    const GgufTensor* t = f.FindTensor(name);
    if (!t) return NotFound(from + ": tensor \"" + name + "\" is missing");
    if (t->type != GgmlType::kQ1_0 || t->shape != std::vector<int64_t>{rows, cols}) {
      return InvalidArgument(from + ": tensor \"" + name + "\" is " + GgmlTypeName(t->type) + " " +
                             ShapeString(t->shape) + "; a bitgpu folder needs Q1_0 " +
                             ShapeString(std::vector<int64_t>{rows, cols}));
    }
    return nlohmann::json{{"dtype", "UINT8"},
                          {"shape", {rows, cols / 128 * 18}},
                          {"src", "data"},
                          {"off", data_offset + t->offset},
                          {"len", t->bytes}};
  };
  auto norm = [&](const std::string& name, int64_t n) -> Expected<nlohmann::json> {
    const GgufTensor* t = f.FindTensor(name);
    if (!t) return NotFound(from + ": tensor \"" + name + "\" is missing");
    if (t->type != GgmlType::kF32 || t->shape != std::vector<int64_t>{n}) {
      return InvalidArgument(from + ": tensor \"" + name + "\" is " + GgmlTypeName(t->type) + " " +
                             ShapeString(t->shape) + "; a bitgpu folder needs F32 [" +
                             std::to_string(n) + "]");
    }
    return nlohmann::json{{"dtype", "FLOAT"},
                          {"shape", {n}},
                          {"src", "data"},
                          {"off", data_offset + t->offset},
                          {"len", t->bytes}};
  };
  const int64_t hidden = arch.dim, ffn = arch.ffn, head_dim = arch.head_dim;
  const int64_t q_rows = arch.heads * head_dim, kv_rows = arch.kv_heads * head_dim;
  struct Linear {
    const char* gguf;
    const char* logical;
    int64_t rows, cols;
  };
  const Linear linears[] = {
      {"attn_q", "attn.q_proj", q_rows, hidden},  {"attn_k", "attn.k_proj", kv_rows, hidden},
      {"attn_v", "attn.v_proj", kv_rows, hidden}, {"attn_output", "attn.o_proj", hidden, q_rows},
      {"ffn_gate", "mlp.gate_proj", ffn, hidden}, {"ffn_up", "mlp.up_proj", ffn, hidden},
      {"ffn_down", "mlp.down_proj", hidden, ffn}};
  const std::pair<const char*, const char*> norms[] = {{"attn_norm", "input_layernorm"},
                                                       {"ffn_norm", "post_attention_layernorm"},
                                                       {"attn_q_norm", "attn.q_norm"},
                                                       {"attn_k_norm", "attn.k_norm"}};
  const int64_t total = arch.layers * 11 + 3 + 1;  // the tensors, then the data file's copy
  int64_t done = 0;
  auto step = [&](const std::string& name) {
    ++done;
    if (options.progress) options.progress(done, total, name);
  };
  nlohmann::json tensors = nlohmann::json::object();
  for (int l = 0; l < arch.layers; ++l) {
    const std::string blk = "blk." + std::to_string(l) + ".";
    const std::string layer = "layers." + std::to_string(l) + ".";
    for (const Linear& lin : linears) {
      GZ_ASSIGN_OR_RETURN(nlohmann::json weight,
                          region(blk + lin.gguf + ".weight", lin.rows, lin.cols));
      tensors[layer + lin.logical] = {{"kind", "binary"},    {"N", lin.rows},   {"K", lin.cols},
                                      {"block", 128},        {"bits", 2},       {"lut", "tgt2"},
                                      {"container", "q1_0"}, {"weight", weight}};
      step(layer + lin.logical);
    }
    for (const auto& [gguf_name, logical] : norms) {
      const bool head_norm = std::string(logical).find("_norm") != std::string::npos &&
                             std::string(logical).rfind("attn.", 0) == 0;
      GZ_ASSIGN_OR_RETURN(nlohmann::json weight,
                          norm(blk + gguf_name + ".weight", head_norm ? head_dim : hidden));
      tensors[layer + logical] = {{"kind", "f32"}, {"weight", weight}};
      step(layer + logical);
    }
  }
  const std::string final_norm = "layers." + std::to_string(arch.layers) + ".final_norm_layernorm";
  GZ_ASSIGN_OR_RETURN(nlohmann::json final_weight, norm("output_norm.weight", hidden));
  tensors[final_norm] = {{"kind", "f32"}, {"weight", final_weight}};
  step(final_norm);
  GZ_ASSIGN_OR_RETURN(nlohmann::json embed, region("token_embd.weight", arch.vocab, hidden));
  tensors["embed_tokens"] = {{"kind", "q4"},        {"rows", arch.vocab}, {"cols", hidden},
                             {"block", 128},        {"bits", 4},          {"lut", "tgt4"},
                             {"container", "q1_0"}, {"weight", embed}};
  step("embed_tokens");
  nlohmann::json head = embed;
  if (!arch.tied_head) {
    GZ_ASSIGN_OR_RETURN(head, region("output.weight", arch.vocab, hidden));
  }
  tensors["lm_head"] = {{"kind", "q2"}, {"N", arch.vocab}, {"K", hidden},         {"block", 128},
                        {"bits", 2},    {"lut", "tgt2"},   {"container", "q1_0"}, {"weight", head}};
  step("lm_head");

  const std::string data_name = fs::path(from).filename().string();
  const std::string aux_name = fs::path(from).stem().string() + ".aux.bin";
  nlohmann::json manifest = {
      {"version", 2},
      {"data_file", data_name},
      {"aux_file", aux_name},
      {"arch",
       {{"model_type", "qwen3"},
        {"layers", arch.layers},
        {"hidden", hidden},
        {"intermediate", ffn},
        {"heads", arch.heads},
        {"kv_heads", arch.kv_heads},
        {"head_dim", head_dim},
        {"rms_eps", config["rms_norm_eps"]},
        {"rope", {{"rope_theta", config.value("rope_theta", 10000.0)}}},
        {"max_positions", config["max_position_embeddings"]},
        {"vocab", arch.vocab},
        {"eos", eos},
        {"tie_word_embeddings", arch.tied_head},
        {"act", "silu"}}},
      {"luts",
       {{"tgt2",
         {{"dtype", "UINT8"}, {"shape", {256, 2}}, {"src", "aux"}, {"off", 0}, {"len", 512}}},
        {"tgt4",
         {{"dtype", "UINT8"}, {"shape", {256, 4}}, {"src", "aux"}, {"off", 512}, {"len", 1024}}}}},
      {"tensors", tensors}};
  const auto tgt2 = BitgpuTgt2();
  const auto tgt4 = BitgpuTgt4();
  std::string aux(reinterpret_cast<const char*>(tgt2.data()), tgt2.size());
  aux.append(reinterpret_cast<const char*>(tgt4.data()), tgt4.size());

  const std::string partial = options.to + ".partial";
  std::error_code ec;
  fs::remove_all(partial, ec);
  fs::create_directories(partial, ec);
  if (ec) return InvalidArgument("convert: cannot create " + partial + ": " + ec.message());
  ConvertSummary summary;
  GZ_RETURN_IF_ERROR(WriteText(partial + "/" + kBitgpuManifest, manifest.dump(1) + "\n"));
  GZ_RETURN_IF_ERROR(WriteText(partial + "/" + aux_name, aux));
  GZ_RETURN_IF_ERROR(WriteGgufSideFiles(from, /*untie=*/false, partial, &summary,
                                        /*with_config=*/false));
  fs::create_hard_link(from, partial + "/" + data_name, ec);
  if (ec) {
    ec.clear();
    fs::copy_file(from, partial + "/" + data_name, ec);
    if (ec) return InvalidArgument("convert: cannot copy " + from + ": " + ec.message());
  }
  step(data_name);
  summary.tensors = static_cast<int64_t>(tensors.size());
  summary.block_types["Q1_0"] = arch.layers * 7 + 1 + (arch.tied_head ? 0 : 1);
  for (const auto& entry : fs::directory_iterator(partial)) summary.bytes += entry.file_size();
  fs::rename(partial, options.to, ec);
  if (ec) {
    return InvalidArgument("convert: cannot rename " + partial + " to " + options.to + ": " +
                           ec.message());
  }
  return summary;
}

std::vector<uint16_t> ToBf16(std::span<const float> v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = F32ToBf16(v[i]);
  return out;
}

// Quantizes the linears of `linears` (and the untied head) with GPTQ over one calibration pass
// of the model; returns them by tensor name.
Expected<std::map<std::string, QuantizedLinear>> Calibrate(
    const ConvertOptions& options, const Arch& arch, const Checkpoint& ckpt,
    const std::map<std::string, Format>& linears, LoraAdapter* lora, bool untie, int layers) {
  const std::string embed_name = TensorName(arch, TensorRole::kEmbed, -1);
  const std::string head_name = TensorName(arch, TensorRole::kHead, -1);
  auto plan = [&](const std::string& name) -> std::optional<CalibrationTarget> {
    std::string stored = name;
    Format format = Format::kBf16;
    if (name == embed_name) {
      if (!untie) return std::nullopt;
      stored = head_name;
      format = BitsFormat(options.bits.head);
    } else if (auto it = linears.find(name); it != linears.end()) {
      format = it->second;
    }
    const TensorInfo* t = ckpt.Find(name);
    if (format == Format::kBf16 || !t || t->shape.size() != 2 || t->shape[1] % kGroup != 0) {
      return std::nullopt;
    }
    return CalibrationTarget{format, stored};
  };
  bool any = untie;
  for (const auto& [name, format] : linears) any = any || plan(name).has_value();
  if (!any) return std::map<std::string, QuantizedLinear>{};
  if (!options.backend) return InvalidArgument("convert: calibration needs a backend to run on");
  auto source = [&](const std::string& stored) -> Expected<std::vector<float>> {
    const TensorInfo* t = ckpt.Find(stored == head_name && untie ? embed_name : stored);
    if (!t) return NotFound(options.from + ": tensor " + stored + " is missing");
    GZ_ASSIGN_OR_RETURN(std::vector<float> w, ReadFloats(*t));
    if (lora) GZ_RETURN_IF_ERROR(lora->Merge(stored, w.data(), t->shape[0], t->shape[1]).status());
    return w;
  };
  LoadOptions load;
  load.layers = layers;
  GZ_ASSIGN_OR_RETURN(std::unique_ptr<Calibrator> calibrator,
                      Calibrator::Open(options.from, options.backend, load, options.pool));
  if (options.stage) {
    options.stage(!options.calibration.tokens.empty() ? "reading the given calibration tokens"
                  : options.calibration.file.empty()
                      ? "writing " + std::to_string(options.calibration.rows) +
                            " tokens of calibration text"
                      : "reading calibration text from " + options.calibration.file);
  }
  GZ_ASSIGN_OR_RETURN(auto sequences, calibrator->Sequences(options.calibration));
  int64_t tokens = 0;
  for (const auto& s : sequences) tokens += static_cast<int64_t>(s.size());
  if (options.stage) {
    options.stage("quantizing with GPTQ on " + std::to_string(tokens) + " calibration tokens");
  }
  QuantizeOptions q{Format::kQ4, options.zeros, options.rotate, options.seed};
  return calibrator->Quantize(sequences, plan, source, q, options.gptq);
}

// b4's linears kept at 8 bits (bench/RESULTS.md "gizllm's blocks against llama.cpp's files"):
// every v_proj (per weight the most sensitive linear of a dense model); in a model with routed
// experts, which hold most of its weights so that these cost a few hundredths of a bit, also
// k_proj, the attention's and the recurrent layers' output projections and the shared expert's
// down projection (as llama.cpp raises attention's types for models of eight experts).
bool EightBitsInB4(const Arch& arch, TensorRole role) {
  if (role == TensorRole::kV) return true;
  if (!HasMoe(arch)) return false;
  return role == TensorRole::kK || role == TensorRole::kO || role == TensorRole::kRecurrentOut ||
         role == TensorRole::kSharedDown;
}

}  // namespace

Expected<Bits> ParseBits(const std::string& text) {
  Bits bits;
  int blocks = 0, parts = 0;  // parts named bN, parts in all but 16
  auto one = [&](std::string s) -> Expected<int> {
    if (s.size() > 1 && s[0] == 'b') {
      s = s.substr(1);
      if (s != "8" && s != "4") {
        return InvalidArgument("--bits " + text + ": gizllm's blocks are b8 and b4, not b" + s);
      }
      ++blocks;
    }
    if (s != "16") ++parts;
    if (s == "16") return 16;
    if (s == "8") return 8;
    if (s == "4") return 4;
    if (s == "2") return 2;
    if (s == "1") return 1;
    return InvalidArgument("--bits " + text + ": \"" + s +
                           "\" is not 16, 8, 4, 2 or 1 (or b8, b4: gizllm's blocks)");
  };
  size_t slash = text.find('/');
  GZ_ASSIGN_OR_RETURN(bits.layers, one(text.substr(0, slash)));
  if (slash == std::string::npos) {
    bits.head = bits.layers;
  } else {
    GZ_ASSIGN_OR_RETURN(bits.head, one(text.substr(slash + 1)));
  }
  if (blocks > 0 && blocks != parts) {
    return InvalidArgument("--bits " + text +
                           ": gizllm's blocks (b8, b4) and the own formats (8, 4, 2, 1) do not mix "
                           "in one model; write both parts as bN (or 16)");
  }
  bits.blocks = blocks > 0;
  return bits;
}

std::string BitsString(const Bits& bits) {
  auto one = [&](int b) { return (bits.blocks && b != 16 ? "b" : "") + std::to_string(b); };
  return one(bits.layers) + "/" + one(bits.head);
}

Format BitsFormat(int bits) {
  switch (bits) {
    case 8:
      return Format::kQ8;
    case 4:
      return Format::kQ4;
    case 2:
      return Format::kQ2;
    case 1:
      return Format::kQ1;
    default:
      return Format::kBf16;
  }
}

Status ConvertOptions::Check() const {
  if (from.empty()) return InvalidArgument("convert: --from is required");
  if (to.empty()) return InvalidArgument("convert: --to is required");
  std::error_code ec;
  if (fs::is_regular_file(to, ec)) {
    return InvalidArgument("convert: --to " + to + " exists and is a file (expected a new folder)");
  }
  if (fs::exists(to, ec))
    return InvalidArgument("convert: --to " + to + " exists (expected a new folder)");
  const bool gguf = IsGgufPath(from);
  if (!gguf && fs::is_regular_file(from, ec)) {
    return InvalidArgument("convert: --from " + from +
                           " is a file whose name does not end in .gguf (expected a Hugging Face "
                           "model folder or a GGUF file)");
  }
  if (keep_types && !gguf) {
    return InvalidArgument("convert: --from " + from +
                           ": only a GGUF file keeps its block types; give --bits");
  }
  if (manifest && (!gguf || !keep_types || layers != -1)) {
    return InvalidArgument(
        "convert: --manifest writes a bitgpu folder of a whole Q1_0 GGUF file "
        "as it is (without --bits, --lora, --calibration or --layers); --from " +
        from + " " + (gguf ? "with those options" : "is not a GGUF file"));
  }
  if (keep_types && (calibrate || !lora.empty())) {
    return InvalidArgument(std::string("convert: ") + (calibrate ? "--calibration" : "--lora") +
                           " changes the weights of " + from + "; give --bits");
  }
  for (int b : {bits.layers, bits.head}) {
    if (b != 16 && b != 8 && b != 4 && b != 2 && b != 1) {
      return InvalidArgument("convert: bits " + std::to_string(b) + " (expected 16, 8, 4, 2 or 1)");
    }
  }
  if (calibrate) {
    if (!calibration.file.empty() && !fs::exists(calibration.file)) {
      return NotFound("convert: calibration file " + calibration.file + " does not exist");
    }
    GZ_RETURN_IF_ERROR(calibration.Check());
    GZ_RETURN_IF_ERROR(gptq.Check());
  }
  if (layers == 0 || layers < -1) {
    return InvalidArgument("convert: --layers " + std::to_string(layers) + " (expected >= 1)");
  }
  return Status::Ok();
}

Expected<ConvertSummary> Convert(const ConvertOptions& options) {
  GZ_RETURN_IF_ERROR(options.Check());
  if (options.manifest) return ConvertToBitgpu(options);
  // The source: a Hugging Face folder, or a GGUF file read as the loader reads it, its matrices
  // in their blocks (ReadFloats dequantizes one where it is quantized again).
  const bool gguf = IsGgufPath(options.from);
  Arch arch;
  Checkpoint ckpt;
  if (gguf) {
    GZ_ASSIGN_OR_RETURN(GgufModel source,
                        OpenGgufModel(options.from, [](GgmlType) { return true; }));
    arch = std::move(source.arch);
    ckpt = std::move(source.checkpoint);
  } else {
    GZ_ASSIGN_OR_RETURN(arch, ReadArch(options.from));
    GZ_ASSIGN_OR_RETURN(ckpt, Checkpoint::Open(options.from));
  }
  // gizllm's blocks are not rotated (on the models measured the rotation neither helped nor
  // hurt them).
  const bool rotate = options.rotate && !options.bits.blocks;
  if (options.calibrate && options.bits.blocks) {
    return Unimplemented("convert: --bits " + BitsString(options.bits) +
                         ": GPTQ calibration (--calibration) writes the own formats only (8, 4, "
                         "2, 1); convert without it (round to nearest), or with --bits 4/8");
  }
  if (options.calibrate && (HasMoe(arch) || HasRecurrent(arch))) {
    return Unimplemented("convert: " + options.from + " (" + arch.family + ") has " +
                         (HasMoe(arch) ? "mixture-of-experts" : "recurrent") +
                         " layers; GPTQ calibration (--calibration) of those is not supported "
                         "yet (convert without it: round to nearest)");
  }
  GZ_RETURN_IF_ERROR(ResolveTensorPrefix(
      &arch, [&](const std::string& name) { return ckpt.Find(name) != nullptr; }, options.from));
  if (options.layers > arch.layers) {
    return InvalidArgument("convert: --layers " + std::to_string(options.layers) + ", but " +
                           options.from + " has " + std::to_string(arch.layers) + " layers");
  }
  std::optional<LoraAdapter> lora;
  if (!options.lora.empty()) {
    GZ_ASSIGN_OR_RETURN(LoraAdapter adapter, LoraAdapter::Open(options.lora));
    lora.emplace(std::move(adapter));
  }
  const bool cut = options.layers > 0 && options.layers < arch.layers;
  const int kept = cut ? options.layers : arch.layers;

  // What to do with each tensor.
  std::vector<std::string> prefixes(arch.layers);
  for (int l = 0; l < arch.layers; ++l) prefixes[l] = LayerPrefix(arch, l);
  // The linears to write by source tensor name, the stacked expert tensors (by name: their
  // layer) and the shape of every tensor the model reads (checked before anything is written).
  std::map<std::string, Format> linears;
  std::map<std::string, int> stacked;
  std::map<std::string, std::vector<int64_t>> shapes;
  for (TensorRole role : {TensorRole::kEmbed, TensorRole::kFinalNorm, TensorRole::kHead}) {
    shapes[TensorName(arch, role, -1)] = TensorShape(arch, role, -1);
  }
  for (int l = 0; l < kept; ++l) {
    for (TensorRole role : LayerRoles(arch, l)) {
      if (IsExpertRole(role)) {
        const TensorRole stacked_role =
            role == TensorRole::kExpertDown ? TensorRole::kExpertsDown : TensorRole::kExpertsGateUp;
        const std::string stacked_name = TensorName(arch, stacked_role, l);
        if (ckpt.Find(stacked_name)) {
          stacked[stacked_name] = l;
          shapes[stacked_name] = TensorShape(arch, stacked_role, l);
          continue;
        }
        for (int e = 0; e < arch.layer[l].moe.experts; ++e) {
          const std::string name = ExpertTensorName(arch, role, l, e);
          linears[name] = BitsFormat(options.bits.layers);
          shapes[name] = TensorShape(arch, role, l);
        }
        continue;
      }
      const std::string name = TensorName(arch, role, l);
      shapes[name] = TensorShape(arch, role, l);
      if (QuantizedRole(role)) {
        linears[name] = BitsFormat(
            options.bits.blocks && options.bits.layers == 4 && EightBitsInB4(arch, role)
                ? 8
                : options.bits.layers);
      }
    }
  }
  const std::string embed_name = TensorName(arch, TensorRole::kEmbed, -1);
  const std::string head_name = TensorName(arch, TensorRole::kHead, -1);
  const std::string final_norm_name = TensorName(arch, TensorRole::kFinalNorm, -1);
  const TensorInfo* embed = ckpt.Find(embed_name);
  if (!embed) return NotFound(options.from + ": tensor " + embed_name + " is missing");
  // A tied head read at fewer bits is written as its own tensor, so that the head matmul reads
  // the quantized copy and the embedding keeps its precision.
  const bool untie = !cut && arch.tied_head && options.bits.head != 16 && !options.keep_types;
  if (!cut && !arch.tied_head) linears[head_name] = BitsFormat(options.bits.head);

  auto plan = [&](const TensorInfo& t) -> Plan {
    // A vision tower's tensors (Arch::skipped_prefixes) go to kVisionTowerFile unchanged: the
    // tower runs in float32 on what the checkpoint holds.
    for (const std::string& prefix : arch.skipped_prefixes) {
      if (t.name.rfind(prefix, 0) == 0) return {Action::kTower};
    }
    int layer = LayerOf(t.name, prefixes);
    if (layer >= kept) return {Action::kDrop};
    if (cut && (t.name == final_norm_name || t.name == head_name)) return {Action::kDrop};
    if (arch.tied_head && t.name == head_name) return {Action::kDrop};  // a stored tied copy
    // A GGUF file's matrices keep their blocks (and their F32, F16 or BF16) without --bits; with
    // it, the embedding does.
    const bool matrix = t.name == embed_name || linears.count(t.name);
    if (options.keep_types && matrix) return {t.ggml_type >= 0 ? Action::kBlocks : Action::kCopy};
    // The embedding, and a matrix no linear stands for (a GGUF file's MTP layer), keep their
    // blocks.
    if (t.ggml_type >= 0 && !linears.count(t.name) && !stacked.count(t.name)) {
      return {Action::kBlocks};
    }
    if (auto it = linears.find(t.name); it != linears.end()) return {Action::kLinear, it->second};
    if (stacked.count(t.name)) return {Action::kExperts, BitsFormat(options.bits.layers)};
    if (t.name == embed_name) return {Action::kCopy};
    if (t.shape.size() <= 1) return {Action::kFloat32};
    return {Action::kCopy};
  };

  std::vector<const TensorInfo*> sources = ckpt.All();
  int64_t total = 0;
  for (const TensorInfo* t : sources) total += plan(*t).action != Action::kDrop;
  total += untie;
  for (const auto& [name, format] : linears) {
    if (!ckpt.Find(name)) return NotFound(options.from + ": tensor " + name + " is missing");
  }
  // Every tensor the model reads has the shape the loader expects, and every tensor written holds
  // finite values: what convert accepts, a load accepts too.
  for (const TensorInfo* t : sources) {
    if (plan(*t).action == Action::kDrop) continue;
    if (auto it = shapes.find(t->name); it != shapes.end()) {
      GZ_RETURN_IF_ERROR(CheckTensorShape(t->file, t->name, t->shape, it->second));
    }
    GZ_RETURN_IF_ERROR(CheckFinite(*t, options.pool));
    ckpt.Release(*t);
  }
  // Whether `name` is an expert's linear written from a stacked tensor (a LoRA target).
  auto split_expert = [&](const std::string& name) {
    for (const auto& [stacked_name, l] : stacked) {
      for (TensorRole role :
           {TensorRole::kExpertGate, TensorRole::kExpertUp, TensorRole::kExpertDown}) {
        for (int e = 0; e < arch.layer[l].moe.experts; ++e) {
          if (ExpertTensorName(arch, role, l, e) == name) return true;
        }
      }
    }
    return false;
  };
  if (lora) {
    for (const std::string& target : lora->Targets()) {
      if (!linears.count(target) && !split_expert(target)) {
        return InvalidArgument(options.lora + ": the adapter changes " + target +
                               ", which is not a linear of the converted layers");
      }
    }
  }

  ConvertSummary summary;
  // GPTQ on calibration: every linear to quantize, from one pass of the model (jobs/calibrate.h).
  std::map<std::string, QuantizedLinear> calibrated;
  if (options.calibrate) {
    GZ_ASSIGN_OR_RETURN(calibrated, Calibrate(options, arch, ckpt, linears, lora ? &*lora : nullptr,
                                              untie, cut ? kept : -1));
    summary.calibrated = static_cast<int64_t>(calibrated.size());
  }
  // The output is written into a partial folder, renamed when whole (removed on an error); the
  // model's tensors go to its file as they come, so convert holds one tensor at a time.
  const std::string partial = options.to + ".partial";
  std::error_code ec;
  fs::remove_all(partial, ec);
  fs::create_directories(partial, ec);
  if (ec) return InvalidArgument("convert: cannot create " + partial + ": " + ec.message());
  struct RemoveUnlessDone {
    const std::string& dir;
    bool done = false;
    ~RemoveUnlessDone() {
      std::error_code ignored;
      if (!done) fs::remove_all(dir, ignored);
    }
  } cleanup{partial};
  // The header's room: each tensor's entry and each linear's description, with their names.
  size_t reserve = size_t{64} << 10;
  auto room = [&](const std::string& name, bool linear) {
    reserve += linear ? 3 * (name.size() + 200) + 2 * name.size() + 400 : name.size() + 200;
  };
  for (const TensorInfo* t : sources) {
    Plan p = plan(*t);
    if (p.action == Action::kDrop || p.action == Action::kTower) continue;
    if (p.action != Action::kExperts) {
      room(t->name, p.action == Action::kLinear || p.action == Action::kBlocks);
      continue;
    }
    const int layer = stacked.at(t->name);
    for (int e = 0; e < arch.layer[layer].moe.experts; ++e) {
      for (TensorRole role :
           {TensorRole::kExpertGate, TensorRole::kExpertUp, TensorRole::kExpertDown}) {
        room(ExpertTensorName(arch, role, layer, e), true);
      }
    }
  }
  if (untie) room(head_name, true);
  GZ_ASSIGN_OR_RETURN(SafetensorsWriter writer,
                      SafetensorsWriter::Open(partial + "/model.safetensors", reserve));
  // Two sets of code arrays, each linear's written from one while the next linear is quantized
  // into the other (declared before the output, whose thread may read them until it stops).
  QuantizedLinear quantized[2];
  int64_t quantized_ticket[2] = {0, 0};
  int64_t quantized_turn = 0;
  Output out(&writer), tower;
  std::map<std::string, std::string> metadata = {{kFormatVersionKey, kFormatVersion}};
  if (!options.keep_types) {
    metadata[kBitsKey] = BitsString(options.bits);
    if (rotate) metadata[kRotationSeedKey] = std::to_string(options.seed);
  }
  if (cut) metadata[kLayersKey] = std::to_string(kept);

  std::unique_ptr<float[]> scratch;
  size_t scratch_size = 0;
  auto add_linear = [&](const TensorInfo& t, const std::string& name, Format format) -> Status {
    if (t.shape.size() != 2) {
      return InvalidArgument(t.file + ": tensor " + t.name + " is not a matrix");
    }
    const int64_t rows = t.shape[0], cols = t.shape[1];
    // One buffer for every linear, not zeroed (ReadFloatsInto writes it on the pool's threads,
    // which then share the kernel's zeroing of its pages): a fresh one for each would be zeroed
    // on one thread each time.
    const size_t n = static_cast<size_t>(rows * cols);
    if (scratch_size < n) {
      scratch.reset();
      scratch.reset(new float[n]);
      scratch_size = n;
    }
    std::span<float> w(scratch.get(), n);
    GZ_RETURN_IF_ERROR(ReadFloatsInto(t, w.data(), options.pool));
    if (lora) {
      GZ_ASSIGN_OR_RETURN(bool merged, lora->Merge(name, w.data(), rows, cols));
      summary.lora_merged += merged;
    }
    // gizllm's blocks: rows of whole groups of 32 but not of blocks of 128 (narrow experts) in
    // blocks of 32 instead: GZ4S for 4 bits, Q8_0 for 8.
    const bool narrow = options.bits.blocks && format != Format::kBf16 && cols % kGroup != 0 &&
                        cols % 32 == 0;
    if (format != Format::kBf16 && cols % kGroup != 0 && !narrow) {
      format = Format::kBf16;
      ++summary.kept_bf16;
    }
    if (format == Format::kBf16) {
      return out.AddVector(name, DType::kBF16, {rows, cols}, ToBf16(w));
    }
    if (options.bits.blocks) {
      // gizllm's blocks, stored and described as a GGUF file's kept blocks are.
      const bool eight = format == Format::kQ8;
      const GgmlType type = narrow ? (eight ? GgmlType::kQ8_0 : GgmlType::kGZ4S)
                                   : (eight ? GgmlType::kGZ8 : GgmlType::kGZ4);
      summary.narrow_blocks += narrow;
      GZ_ASSIGN_OR_RETURN(std::vector<uint8_t> blocks,
                          QuantizeOwnBlocks(type, w.data(), rows, cols, options.pool));
      GgmlBlock block;
      GgmlBlockOf(type, &block);
      GZ_RETURN_IF_ERROR(out.AddVector(
          name, DType::kU8, {rows, cols / block.elements * block.bytes}, std::move(blocks)));
      metadata[kLinearKeyPrefix + name] =
          GgmlLinearDescription(static_cast<uint32_t>(type), rows, cols);
      ++summary.quantized;
      return Status::Ok();
    }
    // Its memory kept from linear to linear, as scratch's; the linear that used it last written.
    const int64_t turn = quantized_turn++ % 2;
    out.WaitWritten(quantized_ticket[turn]);
    QuantizedLinear& ql = quantized[turn];
    if (auto c = calibrated.find(name); c != calibrated.end() && c->second.format == format) {
      ql = std::move(c->second);
    } else {
      QuantizeOptions q{format, options.zeros, rotate, options.seed};
      GZ_RETURN_IF_ERROR(QuantizeLinearInto(w.data(), rows, cols, q, options.pool, &ql));
    }
    const int64_t groups = cols / kGroup;
    GZ_RETURN_IF_ERROR(
        out.AddBorrowed(name, DType::kU8, {rows, groups * GroupBytes(format)}, ql.codes));
    GZ_RETURN_IF_ERROR(
        out.AddBorrowed(name + kScalesSuffix, DType::kF32, {rows, groups}, ql.scales));
    if (!ql.zeros.empty()) {
      GZ_RETURN_IF_ERROR(
          out.AddBorrowed(name + kZerosSuffix, DType::kF32, {rows, groups}, ql.zeros));
    }
    quantized_ticket[turn] = out.ticket();
    nlohmann::json desc = {{"format", FormatName(format)},
                           {"rows", rows},
                           {"cols", cols},
                           {"group", kGroup},
                           {"rotated", ql.rotated}};
    metadata[kLinearKeyPrefix + name] = desc.dump();
    ++summary.quantized;
    return Status::Ok();
  };

  int64_t done = 0;
  auto step = [&](const std::string& name) {
    ++done;
    if (options.progress) options.progress(done, total, name);
  };
  for (const TensorInfo* t : sources) {
    Plan p = plan(*t);
    switch (p.action) {
      case Action::kDrop:
        continue;
      case Action::kCopy:
        GZ_RETURN_IF_ERROR(out.AddInPlace(*t, [&ckpt, t] { ckpt.Release(*t); }));
        break;
      case Action::kTower:
        GZ_RETURN_IF_ERROR(tower.AddInPlace(*t));
        break;
      case Action::kBlocks:
        GZ_RETURN_IF_ERROR(out.AddBlocks(*t, [&ckpt, t] { ckpt.Release(*t); }));
        metadata[kLinearKeyPrefix + t->name] =
            GgmlLinearDescription(t->ggml_type, t->shape[0], t->shape[1]);
        ++summary.block_types[GgmlTypeName(static_cast<GgmlType>(t->ggml_type))];
        break;
      case Action::kFloat32: {
        GZ_ASSIGN_OR_RETURN(std::vector<float> v, ReadFloats(*t));
        GZ_RETURN_IF_ERROR(out.AddVector(t->name, DType::kF32, t->shape, std::move(v)));
        break;
      }
      case Action::kLinear:
        GZ_RETURN_IF_ERROR(add_linear(*t, t->name, p.format));
        break;
      case Action::kExperts: {
        // Expert e's block of rows (gate_up: its gate rows, then its up rows) as a linear of
        // its own, so that each expert's rows lie together as the kernels stream them.
        const int layer = stacked.at(t->name);
        const int64_t ffn = arch.layer[layer].moe.ffn;
        const bool gate_up = t->name == TensorName(arch, TensorRole::kExpertsGateUp, layer);
        const int64_t block_rows = t->shape[1], cols = t->shape[2];
        const size_t row_bytes = static_cast<size_t>(cols) * DTypeSize(t->dtype);
        for (int e = 0; e < arch.layer[layer].moe.experts; ++e) {
          struct Part {
            TensorRole role;
            int64_t first, rows;
          };
          std::vector<Part> parts;
          if (gate_up) {
            parts = {{TensorRole::kExpertGate, 0, ffn}, {TensorRole::kExpertUp, ffn, ffn}};
          } else {
            parts = {{TensorRole::kExpertDown, 0, block_rows}};
          }
          for (const Part& part : parts) {
            TensorInfo view = *t;
            view.name = t->name + "[" + std::to_string(e) + "]";
            view.shape = {part.rows, cols};
            view.data = t->data + (e * block_rows + part.first) * row_bytes;
            view.bytes = part.rows * row_bytes;
            GZ_RETURN_IF_ERROR(
                add_linear(view, ExpertTensorName(arch, part.role, layer, e), p.format));
          }
        }
        break;
      }
    }
    // Read once: out of memory again (in-place tensors' pages once written).
    if (p.action != Action::kTower && p.action != Action::kCopy && p.action != Action::kBlocks) {
      ckpt.Release(*t);
    }
    step(t->name);
  }
  if (untie) {
    GZ_RETURN_IF_ERROR(add_linear(*embed, head_name, BitsFormat(options.bits.head)));
    ckpt.Release(*embed);
    step(head_name);
  }
  GZ_RETURN_IF_ERROR(out.Finish());
  summary.tensors = out.count() + tower.count();
  summary.tower_tensors = tower.count();
  GZ_RETURN_IF_ERROR(writer.Finish(metadata));
  if (!tower.kept().empty()) {
    GZ_RETURN_IF_ERROR(
        WriteSafetensors(partial + "/" + kVisionTowerFile, tower.kept(), /*metadata=*/{}));
  }
  GZ_RETURN_IF_ERROR(gguf ? WriteGgufSideFiles(options.from, untie, partial, &summary)
                          : CopySideFiles(options.from, untie, partial));
  for (const auto& entry : fs::directory_iterator(partial)) summary.bytes += entry.file_size();
  fs::rename(partial, options.to, ec);
  if (ec) {
    return InvalidArgument("convert: cannot rename " + partial + " to " + options.to + ": " +
                           ec.message());
  }
  cleanup.done = true;
  return summary;
}

}  // namespace gizllm::quant
