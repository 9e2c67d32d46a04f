// gizllm convert: a Hugging Face folder or a GGUF file into this project's format
// (jobs/convert.h).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <thread>

#include "backend/cpu/cpu_backend.h"
#include "cli/command.h"
#include "core/progress.h"
#include "jobs/convert.h"
#include "model/gguf_model.h"
#include "model/vision_arch.h"

namespace gizllm::cli {
namespace {

// "[#####.....]  12/57  model.layers.1.mlp.up_proj.weight" on stderr.
std::function<void(int64_t, int64_t, const std::string&)> ConvertProgress() {
  auto line = std::make_shared<ProgressLine>(stderr);
  return [line](int64_t done, int64_t total, const std::string& tensor) {
    std::string name = tensor.size() > 50 ? "..." + tensor.substr(tensor.size() - 47) : tensor;
    char count[48];
    std::snprintf(count, sizeof(count), "%4lld/%-4lld ", static_cast<long long>(done),
                  static_cast<long long>(total));
    line->Update(done, total, count + name);
  };
}

}  // namespace

void AddConvertCommand(CLI::App& app, CommandContext& ctx) {
  auto* cmd = app.add_subcommand(
      "convert",
      "Convert a Hugging Face model folder or a GGUF file into gizllm's format (quantized "
      "linears; a GGUF file's block types kept without --bits)");
  struct Options {
    std::string from, to, bits = "4/8", lora;
    bool no_rotate = false;
    bool no_zeros = false;
    bool manifest = false;
    int layers = -1;
    int threads = 0;
    std::string calibration = "off";
    int64_t calibration_rows = 4096;
  };
  auto o = std::make_shared<Options>();
  cmd->add_option("--from", o->from, "Hugging Face model folder or GGUF file (llama, qwen2, qwen3)")
      ->required();
  cmd->add_option("--to", o->to, "Output folder (must not exist)")->required();
  CLI::Option* bits_option =
      cmd->add_option("--bits", o->bits,
                      "Bits of the layers' linears and of the head, LAYERS[/HEAD]: 16, 8, 4, 2, 1 "
                      "(default 4/8; a GGUF file without --bits keeps its block types), or b8, b4: "
                      "gizllm's blocks (an 8-bit scale a group of 32; b4's levels a Gaussian's, "
                      "v_proj at 8 bits; not rotated; read as they are on the CPU, F32 at load "
                      "on CUDA yet), e.g. b4/b8");
  cmd->add_flag("--no-rotate", o->no_rotate,
                "Quantize without the Hadamard rotation of each block of 128 inputs");
  cmd->add_flag("--no-zeros", o->no_zeros, "4 and 2 bits: symmetric groups, without zero points");
  cmd->add_flag("--manifest", o->manifest,
                "Write a bitgpu folder of a Q1_0 GGUF file (manifest.json, the aux file with the "
                "lookup tables, the file itself as the data file)");
  cmd->add_option("--layers", o->layers,
                  "Keep only the first N layers, without the final norm and head");
  cmd->add_option("--lora", o->lora, "PEFT LoRA adapter folder to merge before quantizing");
  cmd->add_option("--threads", o->threads, "Threads that quantize (default: all cores)");
  cmd->add_option("--calibration", o->calibration,
                  "GPTQ on calibration text: a JSON-lines file of {\"text\": ...}, \"self\" "
                  "(text the model writes itself) or \"off\" (round to nearest, the default)");
  cmd->add_option("--calibration-rows", o->calibration_rows,
                  "Tokens of calibration text (default 4096)");
  cmd->callback([&ctx, o, bits_option] {
    auto bits = quant::ParseBits(o->bits);
    if (!bits.ok()) return void(ctx.exit_code = Fail(bits.status().message()));
    int threads = o->threads > 0
                      ? o->threads
                      : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    ThreadPool pool(threads);
    quant::ConvertOptions options;
    options.from = o->from;
    options.to = o->to;
    options.bits = *bits;
    options.keep_types = IsGgufPath(o->from) && bits_option->count() == 0;
    options.manifest = o->manifest;
    options.rotate = !o->no_rotate;
    options.zeros = !o->no_zeros;
    options.layers = o->layers;
    options.lora = o->lora;
    options.pool = &pool;
    options.progress = ConvertProgress();
    if (o->calibration != "off") {
      options.calibrate = true;
      options.calibration.file = o->calibration == "self" ? "" : o->calibration;
      options.calibration.rows = o->calibration_rows;
      options.backend = MakeCpuBackend(&pool);
      options.stage = [](const std::string& stage) {
        std::fprintf(stderr, "calibration: %s\n", stage.c_str());
      };
    }
    auto start = std::chrono::steady_clock::now();
    auto summary = quant::Convert(options);
    if (!summary.ok()) return void(ctx.exit_code = Fail(summary.status().message()));
    double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::string lora = summary->lora_merged
                           ? ", " + std::to_string(summary->lora_merged) + " with LoRA merged"
                           : "";
    std::string gptq =
        summary->calibrated ? ", " + std::to_string(summary->calibrated) + " by GPTQ" : "";
    if (options.manifest) {
      std::fprintf(stderr, "wrote %s: a bitgpu folder, %lld bytes, %lld tensors in %.1f s\n",
                   o->to.c_str(), static_cast<long long>(summary->bytes),
                   static_cast<long long>(summary->tensors), seconds);
    } else if (options.keep_types) {
      std::fprintf(stderr, "wrote %s: %lld bytes, %lld tensors, the block types kept in %.1f s\n",
                   o->to.c_str(), static_cast<long long>(summary->bytes),
                   static_cast<long long>(summary->tensors), seconds);
    } else {
      std::fprintf(stderr,
                   "wrote %s: %lld bytes, %lld tensors, %lld linears quantized (%s bits%s%s%s)"
                   " in %.1f s\n",
                   o->to.c_str(), static_cast<long long>(summary->bytes),
                   static_cast<long long>(summary->tensors),
                   static_cast<long long>(summary->quantized), quant::BitsString(*bits).c_str(),
                   options.rotate && !bits->blocks ? ", rotated" : "", gptq.c_str(),
                   lora.c_str(), seconds);
    }
    if (!summary->block_types.empty()) {
      std::string types;
      for (const auto& [type, count] : summary->block_types) {
        types += (types.empty() ? "" : ", ") + type + " " + std::to_string(count);
      }
      std::fprintf(stderr, "ggml blocks as the GGUF file holds them: %s\n", types.c_str());
    }
    if (!summary->tokenizer) {
      std::fprintf(stderr, "note: %s has no tokenizer.ggml.* metadata; %s has no tokenizer\n",
                   o->from.c_str(), o->to.c_str());
    }
    if (summary->tower_tensors) {
      std::fprintf(stderr, "vision tower: %lld tensors as the source holds them, in %s\n",
                   static_cast<long long>(summary->tower_tensors), kVisionTowerFile);
    }
    if (summary->kept_bf16) {
      std::fprintf(stderr, "note: %lld linears kept bf16 (columns not a multiple of 128)\n",
                   static_cast<long long>(summary->kept_bf16));
    }
    if (summary->narrow_blocks) {
      std::fprintf(stderr,
                   "note: %lld linears in blocks of 32 (GZ4S or Q8_0: columns a multiple of 32, "
                   "not of 128)\n",
                   static_cast<long long>(summary->narrow_blocks));
    }
  });
}

}  // namespace gizllm::cli
