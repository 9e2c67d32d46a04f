// gizllm serve: the OpenAI-compatible HTTP server on a model (src/server).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>

#include "cli/draft_options.h"
#include "cli/model_options.h"
#include "engine/engine.h"
#include "engine/kv_sizing.h"
#include "model/pooling.h"
#include "model/picture_prompt.h"
#include "model/vision_arch.h"
#include "server/engine_loop.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/real_encoder_model.h"
#include "server/real_generator.h"

namespace gizllm::cli {
namespace {

struct ServeOptions {
  ModelOptions model;
  DraftOptions draft;
  server::ServerOptions http;
  std::string served_name;
  int32_t slots = 0;    // 0: from the KV budget (SizeServe)
  int64_t context = 0;  // 0: the model's, within what the budget holds
  int64_t rows = 0;     // 0: StepRows' default
  int64_t kv_mib = 0;   // 0: from the device's memory (DefaultKvBudget)
  int64_t max_pending = 1024;
  std::string task;  // "": from the model's config
};

// The name clients use: --served-name, else the folder's last part.
std::string ServedName(const ServeOptions& o, const std::string& dir) {
  if (!o.served_name.empty()) return o.served_name;
  std::string trimmed = dir;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  return trimmed.substr(trimmed.rfind('/') + 1);
}

// The embed and rerank tasks: an encoder (or a decoder that embeds, or reranks with its yes/no
// logits) behind the HTTP layer, no engine.
int ServeEncoder(const ServeOptions& o, std::optional<server::Task> asked,
                 std::chrono::steady_clock::time_point start) {
  auto loaded = o.model.LoadEmbedding(/*verbose=*/true);
  if (!loaded.ok()) return Fail(loaded.status().message());
  if (asked == server::Task::kRerank && (*loaded)->is_decoder() && !(*loaded)->reranks()) {
    if (Status s = (*loaded)->RerankByYesNo(); !s.ok())
      return Fail("--task rerank: " + s.message());
  }
  const server::Task own = (*loaded)->reranks() ? server::Task::kRerank : server::Task::kEmbed;
  if (asked && *asked != own) {
    return Fail("--task " + server::TaskName(*asked) + ": this " +
                ((*loaded)->is_decoder()
                     ? std::string("decoder's config.json names its yes/no tokens "
                                   "(classifier_from_token): its task is rerank")
                     : std::string(own == server::Task::kRerank
                                       ? "encoder has a sequence-classification head: its task "
                                         "is rerank"
                                       : "encoder has no sequence-classification head: its task "
                                         "is embed")));
  }
  const std::string name = ServedName(o, ResolveModelDir(o.model.model));
  server::RealEncoderModel encoder(std::move(*loaded), name, own);
  server::Metrics metrics;
  server::HttpServer http(encoder, metrics, o.http);
  Status started = http.Start();
  if (!started.ok()) return Fail(started.message());
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fprintf(stderr, "serving %s (task %s, %d tokens a text) on http://%s:%d, ready in %.2f s\n",
               name.c_str(), server::TaskName(own).c_str(), encoder.MaxTokens(),
               o.http.host.c_str(), http.port(), s);
  std::fflush(stderr);
  http.Wait();
  std::fprintf(stderr, "stopped\n");
  return 0;
}

int Serve(const ServeOptions& o) {
  auto start = std::chrono::steady_clock::now();
  // The server's options are checked before the model loads, which may take long.
  if (Status s = o.http.Check(); !s.ok()) return Fail(s.message());
  std::optional<server::Task> asked;
  if (!o.task.empty()) {
    auto task = server::ParseTask(o.task);
    if (!task.ok()) return Fail(task.status().message());
    asked = *task;
  }
  // An encoder embeds or reranks (its config says which); a decoder generates.
  const bool encoder = IsEncoderFolder(ResolveModelDir(o.model.model));
  if (encoder && asked == server::Task::kGenerate) {
    return Fail("--task generate: " + o.model.model + " is an encoder; it embeds or reranks");
  }
  // A decoder reranks (Qwen3-Reranker) when asked, or when config.json names its yes/no
  // tokens (classifier_from_token).
  bool yes_no = false;
  if (!encoder && !asked) {
    auto config = ReadEmbeddingConfig(ResolveModelDir(o.model.model), 0);
    yes_no = config.ok() && !config->score_tokens.empty();
  }
  if (encoder || yes_no || asked == server::Task::kEmbed || asked == server::Task::kRerank) {
    if (o.model.pipeline > 0 || !o.model.gpus.empty())
      return Fail("--pipeline, --gpus: embedders and rerankers run on one device");
    return ServeEncoder(o, asked, start);
  }
  auto loaded = o.model.LoadRunner(/*verbose=*/true);
  if (!loaded.ok()) return Fail(loaded.status().message());
  std::unique_ptr<LoadedModel> model = std::move(*loaded);
  const Arch& arch = model->arch();
  if (o.slots < 0 || o.context < 0 || o.kv_mib < 0)
    return Fail("--slots, --context and --kv-mib: expected 0 (choose) or a positive number");
  if (arch.context > 0 && o.context > arch.context) {
    return Fail("--context " + std::to_string(o.context) + " exceeds the model's context of " +
                std::to_string(arch.context));
  }
  // Slots, context and KV budget: what was passed, the rest from the memory the weights left.
  const DeviceMemory memory = model->Memory();
  if (o.slots > 0) {
    // The slots asked for each hold a whole context: --kv auto picks the format they fit in.
    const bool gpu = model->backend().kind() == DeviceKind::kCuda;
    int64_t fit_context = gpu ? kMaxGpuContext : kMaxCpuContext;
    if (arch.context > 0) fit_context = std::min(fit_context, arch.context);
    if (o.context > 0) fit_context = o.context;
    const int64_t budget =
        o.kv_mib > 0 ? o.kv_mib << 20 : DefaultKvBudget(model->backend().kind(), memory);
    if (Status s = o.model.FitKv(model.get(), o.slots, fit_context, budget, true); !s.ok())
      return Fail(s.message());
  }
  auto size = SizeServe(model->backend().kind(), memory, model->PageBytes(), arch.context,
                        {o.slots, o.context, o.kv_mib << 20});
  if (!size.ok()) return Fail(size.status().message());
  const int64_t context = size->context;
  const bool gpu = model->backend().kind() == DeviceKind::kCuda;
  const std::string slots_why =
      o.slots > 0 ? ""
                  : " (one per " + std::to_string(kTypicalChat) + " positions, at most " +
                        std::to_string(gpu ? kMaxGpuSlots : kMaxCpuSlots) + ")";
  EngineOptions engine_options;
  engine_options.slots = size->slots;
  engine_options.context = context;
  engine_options.rows = StepRows(model->backend().kind(), size->slots, o.rows);
  engine_options.busy_rows = BusyStepRows(model->backend().kind(), size->slots, o.rows);
  engine_options.kv_budget_bytes = size->kv_budget_bytes;
  if (Status s = o.draft.Apply(*model, &engine_options, o.model.device.threads); !s.ok()) return Fail(s.message());
  std::fprintf(stderr,
               "KV cache: %s pages, %.2f GiB (%s; device %.2f GiB free of %.2f after the weights, "
               "reserve %.2f) = %lld positions; %d slots%s, context %lld%s, rows %lld\n",
               KvFormatName(model->kv_format()).c_str(), size->kv_budget_bytes / 1073741824.0,
               o.kv_mib > 0 ? "--kv-mib" : "default", memory.free / 1073741824.0,
               memory.total / 1073741824.0, KvReserveBytes(memory.total) / 1073741824.0,
               static_cast<long long>(size->positions), size->slots, slots_why.c_str(),
               static_cast<long long>(context), o.context > 0 ? "" : " (most a slot may hold)",
               static_cast<long long>(engine_options.rows));
  auto engine = Engine::Create(model->runner(), engine_options);
  if (!engine.ok()) return Fail(engine.status().message());

  std::string dir = ResolveModelDir(o.model.model);
  std::string name = o.served_name;
  if (name.empty()) {
    std::string trimmed = dir;
    while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
    name = trimmed.substr(trimmed.rfind('/') + 1);
  }
  auto text = server::ChatTextModel::Load(dir, name, static_cast<int32_t>(context),
                                          static_cast<int32_t>(arch.vocab));
  if (!text.ok()) return Fail(text.status().message());
  // A model with a vision tower reads chats' pictures and videos.
  std::shared_ptr<PictureReader> pictures;
  if (ReadVisionArch(dir).ok()) {
    auto reader = PictureReader::Load(dir, model->shared_backend(), o.http.media.picture);
    if (!reader.ok()) return Fail(reader.status().message());
    pictures = std::move(*reader);
    pictures->KeepRowsOnDevice(model->stages() == 1);  // a pipeline's stages read host rows
    (*text)->SetPictures(pictures);
    std::fprintf(stderr, "pictures%s: at most %d a request, %lld pixels each%s\n",
                 pictures->reads_videos() ? " and videos" : "", o.http.media.max_pictures,
                 static_cast<long long>(o.http.media.picture.max_pixels),
                 o.http.media.allowed_path.empty()
                     ? "; data: URLs only"
                     : ("; local files under " + o.http.media.allowed_path).c_str());
  }

  // Warm up: one step of each shape a server meets first (recorded steps on a GPU, first
  // kernel launches), then one short generation through the whole path.
  {
    Status warm = (*engine)->Warm();
    if (!warm.ok()) return Fail("warm-up: " + warm.message());
    auto prompt = (*text)->Tokenize("Hello");
    if (prompt.ok() && !prompt->empty()) {
      Request first;
      first.prompt = *prompt;
      first.limit = 2;
      first.sampling.temperature = 0;
      auto done = (*engine)->Generate({first});
      if (!done.ok()) return Fail("warm-up: " + done.status().message());
      (*engine)->DropCaches();
    }
  }

  server::EngineGenerator generator(std::move(*engine), (*text)->tokenizer());
  generator.SetPictures(pictures);
  server::Metrics metrics;
  server::EngineLoop loop(generator, metrics, o.max_pending);
  server::HttpServer http(**text, loop, metrics, o.http);
  loop.Start();
  Status started = http.Start();
  if (!started.ok()) {
    loop.Stop();
    return Fail(started.message());
  }
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fprintf(stderr, "serving %s (%d slots, context %lld) on http://%s:%d, ready in %.2f s\n",
               name.c_str(), size->slots, static_cast<long long>(context), o.http.host.c_str(),
               http.port(), s);
  std::fflush(stderr);
  http.Wait();
  loop.Stop();
  std::fprintf(stderr, "stopped\n");
  return 0;
}

}  // namespace

void AddServeCommand(CLI::App& app, CommandContext& ctx) {
  auto* cmd = app.add_subcommand("serve", "Serve a model over an OpenAI-compatible HTTP API");
  auto o = std::make_shared<ServeOptions>();
  o->model.Add(cmd);
  o->model.AddPipeline(cmd);
  o->draft.Add(cmd);
  cmd->add_option("--host", o->http.host, "Address to listen on")->default_val("127.0.0.1");
  cmd->add_option("--port", o->http.port, "Port to listen on (0: any free port)")
      ->default_val(8080);
  cmd->add_option("--slots", o->slots,
                  "Sequences the engine runs at once (0: the KV cache's positions over 2,048, "
                  "at most 512 on a GPU and 16 on the CPU)")
      ->default_val(0);
  cmd->add_option("--context", o->context,
                  "Positions of each sequence, prompt and answer (0: the model's, at most "
                  "32,768 on a GPU and 4,096 on the CPU, and at most what the KV cache holds)")
      ->default_val(0);
  cmd->add_option("--rows", o->rows,
                  "Most rows one engine step reads (at least the slots; default: on a GPU one for "
                  "each generating slot and 512 for prompt pieces beside them, and up to 2,048 "
                  "for prompts alone; on the CPU 256)");
  cmd->add_option("--kv-mib", o->kv_mib,
                  "KV cache budget in MiB (0: on a GPU the memory the weights leave, less "
                  "max(1 GiB, 5%); on the CPU a quarter of that in host memory, from 256 MiB "
                  "to 1 GiB)")
      ->default_val(0);
  cmd->add_option("--api-key", o->http.api_key, "Key clients must send as 'Bearer KEY'");
  cmd->add_option("--served-name", o->served_name, "Model name clients use (default: the folder)");
  cmd->add_option("--http-threads", o->http.threads, "Threads of the HTTP side")->default_val(2);
  cmd->add_option("--max-body", o->http.max_body_bytes, "Largest request body in bytes")
      ->default_val(8 << 20);
  cmd->add_option("--max-pending", o->max_pending,
                  "Requests queued or running beyond which the server answers 503")
      ->default_val(1024);
  cmd->add_option("--read-timeout", o->http.read_timeout_s,
                  "Seconds a request may take to arrive; idle connections close after it")
      ->default_val(30);
  cmd->add_option("--write-timeout", o->http.write_timeout_s,
                  "Seconds a client may take to accept each piece of a response")
      ->default_val(60);
  cmd->add_option("--max-generation-time", o->http.max_generation_s,
                  "Seconds a request may generate; then it ends with finish_reason 'length'")
      ->default_val(600);
  cmd->add_option("--max-batch-tokens", o->http.batch_tokens,
                  "The embed and rerank tasks: most tokens of one encoder batch. Requests that "
                  "wait while a batch runs share the next one, up to this many tokens (a longer "
                  "text runs alone)")
      ->default_val(16384);
  cmd->add_option("--allowed-media-path", o->http.media.allowed_path,
                  "Folder whose files chats may name as pictures and videos (image_url and "
                  "video_url parts with a file:// URL or a path); without it only data: URLs "
                  "are read. Paths are resolved (symlinks, '..') and must stay inside");
  cmd->add_option("--max-pictures", o->http.media.max_pictures,
                  "Most pictures (image_url parts) one chat request may hold")
      ->default_val(16);
  cmd->add_option("--max-video-frames", o->http.media.max_frames,
                  "Most video frames one chat request may hold, all its videos together")
      ->default_val(256);
  cmd->add_option("--max-picture-pixels", o->http.media.picture.max_pixels,
                  "Most pixels (width x height) of one picture or video frame as its file "
                  "declares it, checked before it is decoded")
      ->default_val(o->http.media.picture.max_pixels);
  cmd->add_option("--max-picture-bytes", o->http.media.picture.max_decoded_bytes,
                  "Most bytes one picture or frame may take while it is decoded")
      ->default_val(o->http.media.picture.max_decoded_bytes);
  cmd->add_option("--task", o->task,
                  "generate (chat and completions), embed (/v1/embeddings) or rerank "
                  "(/v1/rerank, /v1/score); default from the model: an encoder with a "
                  "sequence-classification head reranks, one without embeds, a decoder "
                  "generates (reranks where config.json's classifier_from_token names its "
                  "yes/no tokens). A decoder asked to rerank scores as Qwen3-Reranker: its "
                  "prompt, then softmax over the \"no\" and \"yes\" logits. Routes of another "
                  "task answer 400")
      ->check(CLI::IsMember({"generate", "embed", "rerank"}));
  cmd->callback([&ctx, o] { ctx.exit_code = Serve(*o); });
}

}  // namespace gizllm::cli
