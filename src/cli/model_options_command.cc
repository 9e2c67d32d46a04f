// Shared model options (not a command itself; named *_command.cc so the CLI target picks it up).
#include <unistd.h>

#include <chrono>
#include <cstdio>

#include "cli/model_options.h"
#include "core/mapped_file.h"

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

Status ModelOptions::FitKv(Model* model, int32_t slots, int64_t context, int64_t budget,
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
