// Shared model options (not a command itself; named *_command.cc so the CLI target picks it up).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <sstream>

#include "cli/model_options.h"
#include "core/mapped_file.h"
#include "engine/kv_sizing.h"

namespace gizllm::cli {

void ModelOptions::Add(CLI::App* app) {
  app->add_option("--model,-m", model, "Model folder (Hugging Face or converted) or GGUF file")
      ->default_val(kDefaultModel);
  app->add_option("--device", device.device, "auto (a CUDA GPU if found, else CPU), cpu or cuda")
      ->default_val("auto");
  app->add_option("--threads,-t", device.threads, "CPU threads (0: one per core)")->default_val(0);
  app->add_flag("--exact", device.exact,
                "Float32 activations everywhere, on every device: the reference mode that golden "
                "tests and \"equal\" claims use (logits within 1e-4 of transformers' float32 on "
                "the CPU, 1e-3 on CUDA). Without it CUDA rounds the linears' inputs to bf16 for "
                "steps of more than one row (fast mode), and so does the CPU where it has AVX-512 "
                "BF16 (--bf16, below)");
  app->add_flag("--bf16", device.bf16,
                "CPU (the default where the CPU has AVX-512 BF16, unless --exact): round the "
                "activations into bf16 linears to bf16 and multiply with "
                "AVX-512 BF16 over a copy of the weights repacked at load (their size again in "
                "memory; faster decode, prompts and batches; logits within about 1% of the "
                "largest instead of 1e-4); a converted model's quantized linears do the same "
                "for steps of 48 rows and more (prompts). CUDA's fast mode does this for steps "
                "of more than one row by default");
  app->add_flag_callback(
      "--no-bf16-copies", [this] { device.bf16_copies = false; },
      "CUDA: keep no bf16 copies of quantized and GGUF linears. By default, in fast "
      "mode, each such linear (and each quantized expert placed on the device) gets a "
      "bf16 copy of its values at load while the device keeps half its memory free, "
      "which steps of many rows (prompts, batches) multiply through cuBLASLt (experts: "
      "the bf16 grouped kernels) instead of decoding the weight each time; batch-1 "
      "steps read the quantized blocks");
  app->add_flag("--int8", device.int8,
                "CPU: a converted model's 8- and 4-bit linears quantize their (rotated) "
                "activations to int8, a scale per 128 inputs, and multiply with AVX-512 VNNI "
                "integer dot products over a copy of the codes repacked at load (faster decode, "
                "prompts and batches of converted models; needs avx512_vnni)");
  app->add_option("--kv", kv,
                  "KV cache: bits of each stored key and value, 32, 16, 8, 4 or 2, or "
                  "KEYS/VALUES bits (8/4); f32 and f16 are 32 and 16, q8 is 8. auto: the "
                  "device's (16 on CUDA, 32 there with --exact, 32 on the CPU), or narrower "
                  "where the sequences a command runs (bench: all of them; run and chat: one; "
                  "serve: the --slots asked) do not each fit a whole context in the KV memory: "
                  "the first of more than 4 bits in which they all fit, else the first of 4 bits "
                  "or fewer in which one fits, else the smallest. 16 halves the "
                  "memory and the bytes read per token (keys and values rounded to float16). "
                  "8, 4 and 2 bits: each key and value vector rotated by blocks of a "
                  "Hadamard transform and stored as codes of 2^bits levels (even steps at 8 and "
                  "2 bits, a Gaussian's Lloyd-Max levels at 4), with a step and an offset per 32 "
                  "channels; keys and values each their own bits (8/4: 8-bit "
                  "keys, 4-bit values). A format a device has no kernels for is refused at load")
      ->default_val("auto");
  app->add_option("--expert-cache", expert_cache,
                  "Mixture-of-experts models on CUDA: device slots for the whole model's experts "
                  "(one slot holds one expert's gate, up and down). The attention, router, shared "
                  "expert and head stay on the device; an expert a step picks that no slot holds "
                  "is read from the memory-mapped file (the host page cache) into the least "
                  "recently used slot, and each mixture layer waits for its routing on the host "
                  "(steps are then not recorded as CUDA graphs). At least a layer's top k. 0: "
                  "every expert on the device where they all fit, else as many slots as fit "
                  "beside a reserve for the KV pages (a fifth of the device, at least 4 GiB). "
                  "The CPU reads every expert from the mapping and ignores it")
      ->default_val(0)
      ->check(CLI::NonNegativeNumber);
}

void ModelOptions::AddPipeline(CLI::App* app) {
  app->add_option("--pipeline", pipeline,
                  "Pipeline stages: the model's layers cut into N consecutive stages, one a "
                  "device (--gpus), each holding its layers' weights, KV pages and recurrent "
                  "states; a step runs the stages one after another, each handing its rows' "
                  "residual stream to the next. On the CPU (--device cpu), N stages over one "
                  "thread pool. 0: one device holds the whole model")
      ->default_val(0)
      ->check(CLI::NonNegativeNumber);
  app->add_option("--gpus", gpus,
                  "GPU indices of the stages, comma-separated, one a stage (a GPU may come "
                  "twice); without --pipeline, as many stages as GPUs listed. Default with "
                  "--pipeline N: GPUs 0 to N - 1");
}

Expected<std::vector<int>> ModelOptions::StageDevices(int gpu_count) const {
  std::vector<int> list;
  if (!gpus.empty()) {
    std::stringstream in(gpus);
    std::string item;
    while (std::getline(in, item, ',')) {
      size_t used = 0;
      int gpu = -1;
      try {
        gpu = std::stoi(item, &used);
      } catch (...) {
        used = 0;
      }
      if (item.empty() || used != item.size() || gpu < 0) {
        return InvalidArgument("--gpus \"" + gpus +
                               "\": expected GPU indices separated by commas, such as 0,1");
      }
      list.push_back(gpu);
    }
    if (list.empty() || gpus.back() == ',')
      return InvalidArgument("--gpus \"" + gpus + "\": expected GPU indices such as 0,1");
  }
  if (pipeline < 0) return InvalidArgument("--pipeline: expected 0 or more stages");
  if (pipeline == 0 && list.empty()) return std::vector<int>{};
  const bool cuda = device.device == "cuda" || (device.device == "auto" && gpu_count > 0);
  if (!cuda) {
    if (!list.empty()) {
      return InvalidArgument("--gpus: there is no GPU to place stages on (--device " +
                             device.device + "); --pipeline N alone runs N stages on the CPU");
    }
    return std::vector<int>(pipeline, 0);
  }
  if (list.empty()) {
    if (pipeline > gpu_count) {
      return InvalidArgument("--pipeline " + std::to_string(pipeline) + ": " +
                             std::to_string(gpu_count) + " GPU" + (gpu_count == 1 ? "" : "s") +
                             " found; name each stage's GPU with --gpus (one may come twice)");
    }
    for (int s = 0; s < pipeline; ++s) list.push_back(s);
  }
  if (pipeline > 0 && static_cast<int>(list.size()) != pipeline) {
    return InvalidArgument("--pipeline " + std::to_string(pipeline) + " with --gpus " + gpus +
                           ": expected one GPU a stage (" + std::to_string(pipeline) + "), got " +
                           std::to_string(list.size()));
  }
  for (int gpu : list) {
    if (gpu >= gpu_count) {
      return InvalidArgument("--gpus " + gpus + ": no GPU " + std::to_string(gpu) + " (" +
                             std::to_string(gpu_count) + " found)");
    }
  }
  return list;
}

std::span<const CacheSpec> LoadedModel::caches() const {
  return pipeline_ ? pipeline_->caches() : model_->caches();
}

int64_t LoadedModel::PageBytes() const {
  return pipeline_ ? pipeline_->PageBytes() : model_->PageBytes();
}

std::span<const CacheSpec> LoadedModel::BudgetCaches() const {
  return pipeline_ ? std::span<const CacheSpec>() : model_->caches();
}

int64_t LoadedModel::PositionBytes(KvFormat format) const {
  return pipeline_ ? pipeline_->PositionBytes(format) : model_->PositionBytes(format);
}

Status LoadedModel::SetKvFormat(KvFormat format) {
  return pipeline_ ? pipeline_->SetKvFormat(format) : model_->SetKvFormat(format);
}

bool LoadedModel::HasMtp() const { return pipeline_ ? pipeline_->HasMtp() : model_->HasMtp(); }

Status LoadedModel::SetDraftVocab(int64_t tokens) {
  return pipeline_ ? pipeline_->SetDraftVocab(tokens) : model_->SetDraftVocab(tokens);
}

ExpertCacheStats LoadedModel::ExpertCache() const {
  return pipeline_ ? pipeline_->ExpertCache() : model_->ExpertCache();
}

int64_t LoadedModel::Parameters() const {
  if (!pipeline_) return model_->Parameters();
  int64_t n = 0;
  for (int s = 0; s < pipeline_->stages(); ++s) n += pipeline_->stage(s).Parameters();
  return n;
}

DeviceMemory LoadedModel::Memory() {
  if (!pipeline_) return model_->backend().Memory();
  // Each device's stages' share of a page; the device with the least memory for its share.
  std::map<int, double> share;
  std::map<int, DeviceMemory> memory;
  const double page = static_cast<double>(std::max<int64_t>(1, pipeline_->PageBytes()));
  for (int s = 0; s < pipeline_->stages(); ++s) {
    Model& stage = pipeline_->stage(s);
    share[devices_[s]] += stage.PageBytes() / page;
    stage.backend().MakeCurrent();
    memory[devices_[s]] = stage.backend().Memory();
  }
  DeviceMemory least = memory.begin()->second;
  double least_free = -1;
  for (const auto& [device, part] : share) {
    const DeviceMemory m = memory[device];
    const double scale = part > 0 ? 1.0 / part : 1e6;
    const double free = m.free * scale;
    if (least_free < 0 || free < least_free) {
      least_free = free;
      least = {static_cast<int64_t>(m.free * scale), static_cast<int64_t>(m.total * scale)};
    }
  }
  return least;
}

int64_t LoadedModel::DefaultKvBudget() {
  return gizllm::DefaultKvBudget(backend().kind(), Memory());
}

std::string LoadedModel::Describe() {
  if (!pipeline_) return model_->backend().Describe();
  const int n = pipeline_->stages();
  std::string text = std::to_string(n) + (n == 1 ? " stage:" : " stages:");
  for (int s = 0; s < pipeline_->stages(); ++s) {
    Model& stage = pipeline_->stage(s);
    text += (s ? "; " : " ") + std::string("layers ") + std::to_string(stage.first_layer()) + "-" +
            std::to_string(stage.end_layer() - 1) + " on " + stage.backend().Describe();
    if (stage.backend().kind() == DeviceKind::kCuda) text += " " + std::to_string(devices_[s]);
  }
  return text;
}

std::string ResolveModelDir(const std::string& model) {
  if (FileExists(model) || model != kDefaultModel) return model;
  // Running from elsewhere: look beside the executable (build/gizllm -> ../models/tiny-chat).
  char self[4096];
  ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n > 0) {
    std::string exe(self, n);
    std::string dir = exe.substr(0, exe.rfind('/'));
    for (std::string up : {"/", "/../", "/../../"}) {
      std::string candidate = dir + up + model;
      if (FileExists(candidate + "/config.json")) return candidate;
    }
  }
  return model;
}

Expected<std::unique_ptr<Model>> ModelOptions::Load(bool verbose) const {
  auto start = std::chrono::steady_clock::now();
  GZ_ASSIGN_OR_RETURN(std::shared_ptr<Backend> backend, OpenBackend(device));
  LoadOptions options;
  options.layers = layers;
  options.expert_cache = expert_cache;
  GZ_ASSIGN_OR_RETURN(options.kv, ChooseKvFormat(kv, *backend));
  GZ_ASSIGN_OR_RETURN(std::unique_ptr<Model> m,
                      Model::Load(ResolveModelDir(model), backend, options));
  if (verbose) {
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(stderr, "loaded %s (%s, %.1f M parameters) on %s in %.2f s, %s KV pages\n",
                 model.c_str(), m->arch().family.c_str(), m->Parameters() / 1e6,
                 m->backend().Describe().c_str(), s, KvFormatName(m->kv_format()).c_str());
    if (const ExpertCacheStats cache = m->ExpertCache(); cache.slots > 0) {
      std::fprintf(stderr,
                   "expert cache: %lld slots on the device; the other experts are read "
                   "from the file as steps pick them\n",
                   static_cast<long long>(cache.slots));
    }
  }
  return m;
}

Expected<std::unique_ptr<LoadedModel>> ModelOptions::LoadRunner(bool verbose) const {
  GZ_ASSIGN_OR_RETURN(std::vector<int> devices, StageDevices(GpuCount()));
  if (devices.empty() || (devices.size() == 1 && devices[0] == 0)) {
    // One device, the default: a Model. (On another GPU, a pipeline of one stage, which makes
    // its device current before each call, from whichever thread runs the engine.)
    GZ_ASSIGN_OR_RETURN(std::unique_ptr<Model> m, Load(verbose));
    return std::make_unique<LoadedModel>(std::move(m));
  }
  auto start = std::chrono::steady_clock::now();
  GZ_ASSIGN_OR_RETURN(std::vector<std::shared_ptr<Backend>> backends,
                      OpenStageBackends(device, devices));
  LoadOptions options;
  options.layers = layers;
  options.expert_cache = expert_cache;
  GZ_ASSIGN_OR_RETURN(options.kv, ChooseKvFormat(kv, *backends[0]));
  GZ_ASSIGN_OR_RETURN(std::unique_ptr<PipelineRunner> stages,
                      LoadPipeline(ResolveModelDir(model), backends, options));
  auto loaded = std::make_unique<LoadedModel>(std::move(stages), std::move(devices));
  if (verbose) {
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(stderr, "loaded %s (%s, %.1f M parameters placed) in %s in %.2f s, %s KV pages\n",
                 model.c_str(), loaded->arch().family.c_str(), loaded->Parameters() / 1e6,
                 loaded->Describe().c_str(), s, KvFormatName(loaded->kv_format()).c_str());
  }
  return loaded;
}

Status ModelOptions::FitKv(LoadedModel* model, int32_t slots, int64_t context, int64_t budget,
                           bool verbose) const {
  if (kv != "auto") return Status::Ok();
  KvFit fit;
  fit.budget_bytes = budget;
  fit.slots = slots;
  fit.context = context;
  fit.position_bytes = [model](KvFormat f) { return model->PositionBytes(f); };
  GZ_ASSIGN_OR_RETURN(KvFormat format, ChooseKvFormat(kv, model->backend(), &fit));
  const int64_t one_context = model->PositionBytes(format) * context;
  if (one_context > budget) {
    return ResourceExhausted(
        "KV pages for a context of " + std::to_string(context) + " positions take " +
        std::to_string(one_context >> 20) + " MiB even as " + KvFormatName(format) +
        " pages, more than the " + std::to_string(budget >> 20) +
        " MiB of KV memory (a shorter context, or --kv BITS to allocate them regardless)");
  }
  if (format == model->kv_format()) return Status::Ok();
  GZ_RETURN_IF_ERROR(model->SetKvFormat(format));
  if (verbose) {
    const int64_t context_bytes = model->PositionBytes(format) * context;
    const char* why = context_bytes * slots <= budget
                          ? "fit at these bits, not at more"
                          : "do not fit at more than 4 bits; one context fits at these";
    std::fprintf(stderr, "KV pages: %s (--kv auto: %d context%s of %lld positions in %.1f MiB %s)\n",
                 KvFormatName(format).c_str(), slots, slots == 1 ? "" : "s",
                 static_cast<long long>(context), budget / 1048576.0, why);
  }
  return Status::Ok();
}

Expected<std::unique_ptr<EmbeddingModel>> ModelOptions::LoadEmbedding(bool verbose) const {
  auto start = std::chrono::steady_clock::now();
  GZ_ASSIGN_OR_RETURN(std::shared_ptr<Backend> backend, OpenBackend(device));
  const std::string dir = ResolveModelDir(model);
  GZ_ASSIGN_OR_RETURN(std::unique_ptr<EmbeddingModel> m, EmbeddingModel::Load(dir, backend));
  if (verbose) {
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(stderr, "loaded %s (%s, %s pooling%s, %s) on %s in %.2f s\n", model.c_str(),
                 m->family().c_str(), PoolingName(m->config().pooling).c_str(),
                 m->config().normalize ? ", normalized" : "",
                 m->reranks() ? "scores pairs" : "embeds", backend->Describe().c_str(), s);
  }
  return m;
}

}  // namespace gizllm::cli
