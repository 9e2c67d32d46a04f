// A Hugging Face folder written as a GGUF file the way llama.cpp's converter writes it (the
// writers the GGUF tests use: tests/gguf_from_hf.h for llama, qwen2, qwen3, qwen3_moe and
// gemma3_text, tests/gguf_qwen35_from_hf.h for Qwen3.5 and Qwen3.5-MoE with their MTP layer),
// so that llama.cpp's own tools (llama-quantize, llama-perplexity, llama-bench) can run a model
// here without its Python converter (which needs torch).
//
//   hf_gguf --from DIR --out FILE.gguf [--linears stored|f32|q8_0] [--pre NAME]
//
// --pre: the tokenizer.ggml.pre the converter would name (default qwen2).
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>

#include "gguf_from_hf.h"
#include "gguf_qwen35_from_hf.h"

int main(int argc, char** argv) {
  using namespace gizllm;
  using testing::GgufLinears;
  std::string from, out, linears = "stored", pre = "qwen2";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf(
          "hf_gguf --from DIR --out FILE.gguf [--linears stored|f32|q8_0] [--pre NAME]\n"
          "Writes a Hugging Face folder as llama.cpp's converter would (llama, qwen2, qwen3,\n"
          "qwen3_moe, gemma3_text, qwen3_5_text, qwen3_5_moe_text).\n");
      return 0;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "hf_gguf: %s needs a value\n", a.c_str());
      return 1;
    }
    const std::string v = argv[++i];
    if (a == "--from") {
      from = v;
    } else if (a == "--out") {
      out = v;
    } else if (a == "--linears") {
      linears = v;
    } else if (a == "--pre") {
      pre = v;
    } else {
      std::fprintf(stderr, "hf_gguf: unknown option %s (see --help)\n", a.c_str());
      return 1;
    }
  }
  if (from.empty() || out.empty()) {
    std::fprintf(stderr, "hf_gguf: --from and --out are required (see --help)\n");
    return 1;
  }
  GgufLinears kind;
  if (linears == "stored") {
    kind = GgufLinears::kAsStored;
  } else if (linears == "f32") {
    kind = GgufLinears::kF32;
  } else if (linears == "q8_0") {
    kind = GgufLinears::kQ8_0;
  } else {
    std::fprintf(stderr, "hf_gguf: --linears %s: expected stored, f32 or q8_0\n", linears.c_str());
    return 1;
  }
  nlohmann::json config;
  try {
    config = testing::ReadJsonFile(from + "/config.json");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hf_gguf: %s/config.json: %s\n", from.c_str(), e.what());
    return 1;
  }
  const nlohmann::json& text = config.contains("text_config") ? config["text_config"] : config;
  const std::string type = text.value("model_type", "");
  const Status s = type == "qwen3_5_text" || type == "qwen3_5_moe_text"
                       ? testing::WriteQwen35GgufFromHf(from, out, kind, "", pre)
                       : testing::WriteGgufFromHf(from, out, kind, pre);
  if (!s.ok()) {
    std::fprintf(stderr, "hf_gguf: %s\n", s.message().c_str());
    return 1;
  }
  std::fprintf(stderr, "wrote %s\n", out.c_str());
  return 0;
}
