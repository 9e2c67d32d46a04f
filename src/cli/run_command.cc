// gizllm run: generate from a prompt and stream the text to stdout; timings on stderr. With
// --image, the prompt and the pictures are a user message of the model's chat template and
// the pictures go through its vision tower (model/picture_prompt.h).
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>

#include "cli/draft_options.h"
#include "cli/grammar_file.h"
#include "cli/model_options.h"
#include "cli/pictures.h"
#include "engine/engine.h"
#include "engine/kv_sizing.h"
#include "tokenizer/tokenizer.h"

namespace gizllm::cli {
namespace {

struct RunOptions {
  ModelOptions model;
  DraftOptions draft;
  std::string prompt;
  bool prompt_given = false;
  int64_t max_tokens = 256;
  Sampling sampling;
  uint64_t seed = 0;
  bool seed_given = false;
  bool greedy = false;
  bool special = false;
  std::string json_schema;          // a JSON Schema file the answer follows
  std::string grammar;              // a GBNF file the answer follows
  std::string regex;                // a regular expression the whole answer matches
  std::vector<std::string> images;  // picture files, in the order the prompt shows them
  std::vector<std::string> videos;  // folders of video frames, shown after the pictures
  double video_fps = 0;             // the rate the videos' frames were taken at; 0: unknown
};

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

int Run(const RunOptions& o) {
  std::string prompt = o.prompt;
  if (!o.prompt_given) {
    prompt.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  }
  if (prompt.empty()) return Fail("run: empty prompt (give --prompt TEXT or text on stdin)");
  Sampling sampling = o.sampling;
  if (o.greedy) sampling.temperature = 0.0f;
  if (o.seed_given) sampling.seed = o.seed;
  if (Status s = sampling.Check(); !s.ok()) return Fail(s.message());
  if (o.max_tokens <= 0) return Fail("--max-tokens: must be positive");
  const bool media = !o.images.empty() || !o.videos.empty();
  if (o.special && media)
    return Fail("--special: not with --image or --video (the chat template writes the prompt)");
  if (o.video_fps < 0) return Fail("--video-fps: must be positive");
  if (o.video_fps > 0 && o.videos.empty()) return Fail("--video-fps: give --video too");

  auto model = o.model.LoadRunner(/*verbose=*/true);
  if (!model.ok()) return Fail(model.status().message());
  auto tokenizer = Tokenizer::Load((*model)->dir());
  if (!tokenizer.ok()) return Fail(tokenizer.status().message());
  auto grammar = LoadGrammarFile("run", o.json_schema, o.grammar, *tokenizer, (*model)->arch().vocab, o.regex);
  if (!grammar.ok()) return Fail(grammar.status().message());
  sampling.grammar = *grammar;
  std::vector<int32_t> ids;
  std::shared_ptr<const PromptPictures> pictures;
  if (!media) {
    auto encoded = tokenizer->Encode(prompt, o.special);
    if (!encoded.ok()) return Fail("prompt: " + encoded.status().message());
    ids = std::move(*encoded);
  } else {
    std::vector<VideoFolder> videos;
    for (const std::string& folder : o.videos) {
      videos.push_back(
          {folder, o.video_fps > 0 ? std::optional<double>(o.video_fps) : std::nullopt});
    }
    auto read = PicturePromptTokens((*model)->first(), *tokenizer, prompt, o.images, videos);
    if (!read.ok()) return Fail("run: " + read.status().message());
    ids = std::move(read->tokens);
    pictures = std::make_shared<const PromptPictures>(std::move(read->pictures));
  }
  if (ids.empty()) return Fail("prompt: no tokens");

  EngineOptions options;
  options.slots = 1;
  options.rows = StepRows((*model)->backend().kind(), 1, 0);
  options.busy_rows = BusyStepRows((*model)->backend().kind(), 1, 0);
  options.context = static_cast<int64_t>(ids.size()) + o.max_tokens;
  if ((*model)->arch().context > 0 && options.context > (*model)->arch().context)
    options.context = (*model)->arch().context;
  if (static_cast<int64_t>(ids.size()) >= options.context)
    return Fail("prompt: " + std::to_string(ids.size()) + " tokens leave no room in the " +
                std::to_string(options.context) + "-token context");
  const int64_t budget = (*model)->DefaultKvBudget();
  if (Status s = o.model.FitKv(model->get(), 1, options.context, budget, /*verbose=*/true); !s.ok())
    return Fail(s.message());
  options.kv_budget_bytes = KvBudgetFor((*model)->BudgetCaches(), (*model)->PageBytes(), 1,
                                        PagesFor(options.context) + 1, options.rows);
  if (Status s = o.draft.Apply(**model, &options, o.model.device.threads); !s.ok()) return Fail(s.message());
  // Recurrent layers' states come out of the budget before the pages.
  options.kv_budget_bytes += Engine::StateBytes((*model)->caches(), options);
  auto engine = Engine::Create((*model)->runner(), options);
  if (!engine.ok()) return Fail(engine.status().message());

  Request request;
  request.prompt = ids;
  request.limit = o.max_tokens;
  request.sampling = sampling;
  request.pictures = std::move(pictures);
  auto id = (*engine)->Add(std::move(request));
  if (!id.ok()) return Fail(id.status().message());

  StreamDecoder decoder(*tokenizer);
  auto start = Clock::now();
  Clock::time_point first;
  int64_t generated = 0;
  bool line_open = false;  // the text written so far does not end in a newline
  std::string end;
  while ((*engine)->Busy()) {
    auto progress = (*engine)->Advance();
    if (!progress.ok()) return Fail(progress.status().message());
    for (const Progress& p : *progress) {
      if (!p.status.ok()) {
        std::printf("\n");
        return Fail("run: " + p.status.message());
      }
      for (int32_t t : p.tokens) {
        if (generated++ == 0) first = Clock::now();
        std::string piece = decoder.Push(t);
        std::fwrite(piece.data(), 1, piece.size(), stdout);
        if (!piece.empty()) line_open = piece.back() != '\n';
      }
      std::fflush(stdout);
      if (!p.end.empty()) end = p.end;
    }
  }
  std::string rest = decoder.Flush();
  std::fwrite(rest.data(), 1, rest.size(), stdout);
  if (!rest.empty()) line_open = rest.back() != '\n';
  // The text's last line ends before the figures go to stderr, and reaches the terminal first
  // even when stdout is a pipe.
  if (line_open) std::printf("\n");
  std::fflush(stdout);
  auto done = Clock::now();
  if (generated == 0) first = done;
  double prompt_s = Seconds(start, first), decode_s = Seconds(first, done);
  std::fprintf(stderr, "prompt: %zu tokens, %.1f tokens/s\n", ids.size(),
               prompt_s > 0 ? ids.size() / prompt_s : 0.0);
  std::fprintf(stderr, "decode: %lld tokens, %.1f tokens/s (ended: %s)\n",
               static_cast<long long>(generated),
               decode_s > 0 && generated > 1 ? (generated - 1) / decode_s : 0.0,
               end.empty() ? "?" : end.c_str());
  return 0;
}

}  // namespace

void AddRunCommand(CLI::App& app, CommandContext& ctx) {
  auto* cmd = app.add_subcommand(
      "run",
      "Generate text from a prompt, streamed to stdout. With --image or --video, the prompt, "
      "the pictures and the videos are one user message of the model's chat template (the "
      "pictures first, then the videos) and the answer is the assistant's");
  auto o = std::make_shared<RunOptions>();
  o->model.Add(cmd);
  o->model.AddPipeline(cmd);
  o->draft.Add(cmd);
  cmd->add_option("--prompt,-p", o->prompt, "Prompt text (default: read stdin)")
      ->each([o](const std::string&) { o->prompt_given = true; });
  cmd->add_option("--max-tokens,-n", o->max_tokens, "Most tokens to generate")->default_val(256);
  cmd->add_option("--temperature", o->sampling.temperature, "0 for greedy")->default_val(0.7);
  cmd->add_option("--top-k", o->sampling.top_k, "Keep the k most likely (0: all)")->default_val(0);
  cmd->add_option("--top-p", o->sampling.top_p, "Nucleus mass to keep")->default_val(0.95);
  cmd->add_option("--min-p", o->sampling.min_p, "Drop tokens under min-p x the top probability")
      ->default_val(0.0);
  cmd->add_option("--repetition-penalty", o->sampling.repetition, "1: none")->default_val(1.0);
  cmd->add_option("--seed", o->seed, "Seed that makes a sampled run repeatable")
      ->each([o](const std::string&) { o->seed_given = true; });
  cmd->add_flag("--greedy", o->greedy, "Always pick the most likely token");
  cmd->add_flag("--special", o->special, "Add the tokenizer's special tokens (e.g. BOS)");
  cmd->add_option("--json-schema", o->json_schema,
                  "Answer with JSON that this JSON Schema file accepts (what is not supported "
                  "is refused, naming the schema path)");
  cmd->add_option("--grammar", o->grammar, "Answer with text of this GBNF grammar file");
  cmd->add_option("--regex", o->regex,
                  "Answer with text this regular expression matches in full (lookaround and "
                  "backreferences are refused, naming the position)");
  cmd->add_option("--image", o->images,
                  "A picture (PNG, JPEG or WebP) the model sees before the prompt; repeat for "
                  "more. Needs a model with a vision tower (Qwen3-VL, Qwen3.5) and its "
                  "preprocessor_config.json; the prompt goes through the chat template")
      ->expected(1)
      ->take_all();
  cmd->add_option("--video", o->videos,
                  "A video the model sees before the prompt (after the pictures), given as a "
                  "folder of its frames (PNG, JPEG or WebP files, in name order); repeat for "
                  "more. Frames are sampled as the model's video_preprocessor_config.json says "
                  "(its fps, min and max frames) and each pair's time is written before it")
      ->expected(1)
      ->take_all();
  cmd->add_option("--video-fps", o->video_fps,
                  "The rate the --video frames were taken at, in frames a second (default: "
                  "unknown, 24 assumed as transformers does)");
  cmd->callback([&ctx, o] { ctx.exit_code = Run(*o); });
}

}  // namespace gizllm::cli
