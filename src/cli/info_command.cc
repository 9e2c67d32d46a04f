// gizllm info: what a model folder holds: its Arch, parameters, and each tensor's format.
#include <cstdio>
#include <map>

#include "cli/model_options.h"

namespace gizllm::cli {

void AddInfoCommand(CLI::App& app, CommandContext& ctx) {
  auto* cmd = app.add_subcommand("info", "Show a model's architecture, parameters and tensors");
  struct Options {
    ModelOptions model;
    bool tensors = false;
  };
  auto o = std::make_shared<Options>();
  o->model.Add(cmd);
  cmd->add_flag("--tensors", o->tensors, "List every tensor with its format and bytes");
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
      const Rope& local = a.ropes[a.layer[0].attention.window > 0 ? a.layer[0].attention.rope
                                                                   : a.ropes.size() - 1];
      std::printf("\nsliding      %d of %d layers see the last %d positions, rope theta %g",
                  sliding, a.layers, window, local.theta);
    }
    if (a.logit_softcap > 0) std::printf("\nsoftcap      logits %g", a.logit_softcap);
    if (!a.layer.empty() && a.layer[0].attention.softcap > 0)
      std::printf("\nsoftcap      attention scores %g", a.layer[0].attention.softcap);
    std::printf("\ncontext      %lld\nhead         %s\neos          ",
                static_cast<long long>(a.context), a.tied_head ? "tied to the embedding" : "own");
    for (size_t i = 0; i < a.eos.size(); ++i) std::printf("%s%d", i ? ", " : "", a.eos[i]);
    std::printf("\nparameters   %.2f M\n", m.Parameters() / 1e6);
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
