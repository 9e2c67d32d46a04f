// gizllm info: what a model folder (or GGUF file) holds: its Arch, parameters, and each
// tensor's format; for a GGUF file, its metadata too.
#include <cstdio>
#include <map>

#include "cli/model_options.h"
#include "formats/gguf.h"
#include "model/gguf_model.h"

namespace gizllm::cli {
namespace {

// A metadata value on one line: scalars as they are, strings cut at 60 bytes, arrays as their
// element type and count.
std::string ValueText(const GgufValue& v) {
  switch (v.type) {
    case GgufType::kString: {
      std::string s = v.string.substr(0, 60);
      for (char& c : s) {
        if (c == '\n' || c == '\r' || c == '\t') c = ' ';
      }
      return "\"" + s +
             (v.string.size() > 60 ? "\"... (" + std::to_string(v.string.size()) + " bytes)"
                                   : "\"");
    }
    case GgufType::kArray:
      return "[" + std::to_string(v.count) + " " + GgufTypeName(v.element_type) + "]";
    case GgufType::kBool:
      return v.unsigned_integer ? "true" : "false";
    case GgufType::kFloat32:
    case GgufType::kFloat64: {
      char buf[32];
      std::snprintf(buf, sizeof(buf), "%g", v.real);
      return buf;
    }
    default:
      return v.IsInteger() && (v.type == GgufType::kInt8 || v.type == GgufType::kInt16 ||
                               v.type == GgufType::kInt32 || v.type == GgufType::kInt64)
                 ? std::to_string(v.integer)
                 : std::to_string(v.unsigned_integer);
  }
}

// The file's version, block types, tokenizer and template; every key with `all`.
void PrintGguf(const GgufFile& f, bool all) {
  std::map<std::string, int> types;
  for (const GgufTensor& t : f.tensors()) types[GgmlTypeName(t.type)]++;
  std::printf("gguf         version %u, %zu tensors (", f.version(), f.tensors().size());
  bool first = true;
  for (const auto& [type, n] : types) {
    std::printf("%s%s %d", first ? "" : ", ", type.c_str(), n);
    first = false;
  }
  std::printf("), %zu metadata keys, alignment %llu\n", f.metadata().size(),
              static_cast<unsigned long long>(f.alignment()));
  for (const char* key : {"general.name", "general.file_type", "tokenizer.ggml.model",
                          "tokenizer.ggml.pre", "tokenizer.ggml.tokens"}) {
    if (const GgufValue* v = f.Find(key)) std::printf("  %-28s %s\n", key, ValueText(*v).c_str());
  }
  if (const GgufValue* v = f.Find("tokenizer.chat_template")) {
    std::printf("  %-28s %zu bytes\n", "tokenizer.chat_template", v->string.size());
  }
  if (!all) return;
  for (const auto& [key, v] : f.metadata()) {
    std::printf("  %-40s %s\n", key.c_str(), ValueText(v).c_str());
  }
}

}  // namespace

void AddInfoCommand(CLI::App& app, CommandContext& ctx) {
  auto* cmd = app.add_subcommand("info", "Show a model's architecture, parameters and tensors");
  struct Options {
    ModelOptions model;
    bool tensors = false;
    bool metadata = false;
  };
  auto o = std::make_shared<Options>();
  o->model.Add(cmd);
  cmd->add_flag("--tensors", o->tensors, "List every tensor with its format and bytes");
  cmd->add_flag("--metadata", o->metadata, "A GGUF file: list every metadata key and its value");
  cmd->callback([&ctx, o] {
    o->model.device.device = "cpu";
    auto loaded = o->model.Load(false);
    if (!loaded.ok()) return void(ctx.exit_code = Fail(loaded.status().message()));
    const Model& m = **loaded;
    const Arch& a = m.arch();
    std::printf("model        %s\n", m.dir().c_str());
    std::printf("family       %s (%s)\n", a.family.c_str(), a.architecture.c_str());
    std::printf("layers       %d, hidden %lld, ffn %lld, vocab %lld\n", a.layers,
                static_cast<long long>(a.dim), static_cast<long long>(a.ffn),
                static_cast<long long>(a.vocab));
    std::printf("attention    %d heads, %d kv heads, head dim %d%s%s\n", a.heads, a.kv_heads,
                a.head_dim, a.qk_norm ? ", q/k norms" : "", a.qkv_bias ? ", q/k/v biases" : "");
    std::printf("rope         %s, theta %g, %d rotary dims", a.rope.type.c_str(), a.rope.theta,
                a.rope.rotary_dims);
    if (a.rope.type == "llama3")
      std::printf(", factor %g, low %g, high %g, original context %lld", a.rope.factor,
                  a.rope.low_freq_factor, a.rope.high_freq_factor,
                  static_cast<long long>(a.rope.original_context));
    // Layers that differ from the fields above (Gemma's sliding-window layers).
    int sliding = 0;
    int32_t window = 0;
    for (const LayerSpec& spec : a.layer) {
      if (spec.attention.window > 0) ++sliding, window = spec.attention.window;
    }
    if (sliding > 0) {
      const Rope& local =
          a.ropes[a.layer[0].attention.window > 0 ? a.layer[0].attention.rope : a.ropes.size() - 1];
      std::printf("\nsliding      %d of %d layers see the last %d positions, rope theta %g",
                  sliding, a.layers, window, local.theta);
    }
    // Recurrent layers (Qwen3-Next, Qwen3.5) beside the attention ones.
    int recurrent = 0;
    const LayerSpec* first_recurrent = nullptr;
    for (const LayerSpec& spec : a.layer) {
      if (!spec.IsRecurrent()) continue;
      ++recurrent;
      if (!first_recurrent) first_recurrent = &spec;
    }
    if (first_recurrent) {
      const RecurrentSpec& r = first_recurrent->recurrent;
      std::printf(
          "\nrecurrent    %d of %d layers gated delta rule: %d key heads of %d, %d value heads of "
          "%d, convolution of %d, %.2f MB of state a sequence",
          recurrent, a.layers, r.k_heads, r.k_dim, r.v_heads, r.v_dim, r.kernel,
          recurrent * r.StateFloats() * 4 / 1e6);
    }
    for (const LayerSpec& spec : a.layer) {
      if (spec.IsRecurrent() || !spec.attention.output_gate) continue;
      std::printf("\ngate         attention output times sigmoid(q_proj's gate half)");
      break;
    }
    for (const LayerSpec& spec : a.layer) {
      if (!spec.IsMoe()) continue;
      std::printf("\nexperts      %d, %d a token, width %lld", spec.moe.experts,
                  spec.moe.experts_per_token, static_cast<long long>(spec.moe.ffn));
      if (spec.moe.shared_ffn > 0)
        std::printf(", a shared expert of %lld%s", static_cast<long long>(spec.moe.shared_ffn),
                    spec.moe.shared_gate ? " (gated)" : "");
      break;
    }
    if (m.MtpTensors() > 0)
      std::printf("\nmtp          %lld tensors, %.2f M parameters, %s",
                  static_cast<long long>(m.MtpTensors()), m.MtpParameters() / 1e6,
                  m.HasMtp() ? "one layer (logits --mtp)" : "not loaded (--layers)");
    if (m.SkippedTensors() > 0)
      std::printf("\nskipped      %lld vision tower tensors (%s*): text only",
                  static_cast<long long>(m.SkippedTensors()), a.skipped_prefixes[0].c_str());
    if (a.logit_softcap > 0) std::printf("\nsoftcap      logits %g", a.logit_softcap);
    if (!a.layer.empty() && a.layer[0].attention.softcap > 0)
      std::printf("\nsoftcap      attention scores %g", a.layer[0].attention.softcap);
    std::printf("\ncontext      %lld\nhead         %s\neos          ",
                static_cast<long long>(a.context), a.tied_head ? "tied to the embedding" : "own");
    for (size_t i = 0; i < a.eos.size(); ++i) std::printf("%s%d", i ? ", " : "", a.eos[i]);
    std::printf("\nparameters   %.2f M\n", m.Parameters() / 1e6);
    if (IsGgufPath(m.dir())) {
      auto gguf = GgufFile::Open(m.dir());
      if (!gguf.ok()) return void(ctx.exit_code = Fail(gguf.status().message()));
      PrintGguf(*gguf, o->metadata);
    }
    // info loads on the CPU; CUDA keeps f16 pages by default (f32 with --exact).
    std::printf(
        "kv pages     %s here, %lld bytes a position (by default f16 on CUDA, f32 on the "
        "CPU and with --exact)\n",
        KvFormatName(m.kv_format()).c_str(), static_cast<long long>(m.PageBytes() / kPage));
    std::map<std::string, std::pair<int64_t, int64_t>> by_format;  // tensors, bytes
    int64_t total = 0;
    for (const WeightSummary& w : m.weights()) {
      by_format[w.format].first++;
      by_format[w.format].second += w.bytes;
      total += w.bytes;
    }
    for (const auto& [format, count] : by_format)
      std::printf("format       %-5s %4lld tensors, %.2f MB\n", format.c_str(),
                  static_cast<long long>(count.first), count.second / 1e6);
    std::printf("bytes        %.2f MB\n", total / 1e6);
    if (o->tensors) {
      for (const WeightSummary& w : m.weights()) {
        std::string shape;
        for (size_t i = 0; i < w.shape.size(); ++i)
          shape += (i ? "x" : "") + std::to_string(w.shape[i]);
        std::printf("  %-50s %-5s %-12s %lld\n", w.name.c_str(), w.format.c_str(), shape.c_str(),
                    static_cast<long long>(w.bytes));
      }
    }
  });
}

}  // namespace gizllm::cli
