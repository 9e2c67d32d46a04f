// gizllm chat: an interactive chat in the terminal. Each line is a user turn; the reply streams
// as it is generated, reasoning dimmed and apart from the answer. The conversation stays in one
// engine slot, so each turn reads only what is new; statistics go to stderr. `/image FILE`
// attaches a picture and `/video FOLDER [FPS]` a video (a folder of frames) to the next user
// message (a model with a vision tower reads them).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/draft_options.h"
#include "cli/model_options.h"
#include "cli/pictures.h"
#include "core/mapped_file.h"
#include "engine/engine.h"
#include "engine/kv_sizing.h"
#include "template/chat_prompt.h"
#include "template/chat_template.h"
#include "template/output_parser.h"
#include "tokenizer/tokenizer.h"

namespace gizllm::cli {
namespace {

using nlohmann::ordered_json;

struct ChatOptions {
  ModelOptions model;
  DraftOptions draft;
  std::string system;
  int64_t max_tokens = 512;
  float temperature = 0.7f;
  bool temperature_given = false;
  uint64_t seed = 0;
  bool seed_given = false;
  bool no_think = false;
  int64_t context = 4096;
};

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Set by Ctrl-C while a reply streams: the reply stops, the chat goes on.
volatile std::sig_atomic_t interrupted = 0;
void OnInterrupt(int) { interrupted = 1; }

// Catches Ctrl-C for the scope's lifetime; outside it Ctrl-C ends the program as usual.
class InterruptScope {
 public:
  InterruptScope() {
    interrupted = 0;
    struct sigaction action = {};
    action.sa_handler = OnInterrupt;
    sigemptyset(&action.sa_mask);
    sigaction(SIGINT, &action, &previous_);
  }
  ~InterruptScope() { sigaction(SIGINT, &previous_, nullptr); }

 private:
  struct sigaction previous_ = {};
};

// The sampling a model suggests in generation_config.json (temperature, top_p, top_k; do_sample
// false means greedy); temperature 0.7 when it says nothing.
Expected<Sampling> DefaultSampling(const std::string& dir) {
  Sampling sampling;
  sampling.temperature = 0.7f;
  const std::string path = dir + "/generation_config.json";
  if (!FileExists(path)) return sampling;
  GZ_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  nlohmann::json config = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!config.is_object()) return InvalidArgument(path + ": not a JSON object");
  auto number = [&](const char* field) -> const nlohmann::json* {
    auto it = config.find(field);
    return it != config.end() && it->is_number() ? &*it : nullptr;
  };
  if (const nlohmann::json* t = number("temperature")) sampling.temperature = t->get<float>();
  if (const nlohmann::json* p = number("top_p")) sampling.top_p = p->get<float>();
  if (const nlohmann::json* k = number("top_k")) sampling.top_k = k->get<int32_t>();
  if (const nlohmann::json* m = number("min_p")) sampling.min_p = m->get<float>();
  if (config.contains("do_sample") && config["do_sample"].is_boolean() &&
      !config["do_sample"].get<bool>()) {
    sampling.temperature = 0.0f;
  }
  if (Status s = sampling.Check(); !s.ok()) return InvalidArgument(path + ": " + s.message());
  return sampling;
}

// Writes the parts of a reply as they arrive: reasoning dimmed (or inside <think> tags when the
// output is not a terminal) and apart from the answer; tool calls as plain lines.
class ReplyPrinter {
 public:
  explicit ReplyPrinter(bool ansi) : ansi_(ansi) {}

  void Print(const OutputEvent& e) {
    switch (e.kind) {
      case OutputEvent::Kind::kReasoning:
        if (!in_reasoning_) {
          Write(ansi_ ? "\x1b[2m" : "<think>\n");
          in_reasoning_ = true;
        }
        Write(e.text);
        reasoning_ += e.text;
        break;
      case OutputEvent::Kind::kContent:
        EndReasoning();
        Write(e.text);
        content_ += e.text;
        break;
      case OutputEvent::Kind::kToolCall: {
        EndReasoning();
        if (!content_.empty() && content_.back() != '\n') Write("\n");
        Write("[tool call] " + e.name + " " + e.arguments + "\n");
        ordered_json arguments = ordered_json::parse(e.arguments, nullptr, false);
        if (arguments.is_discarded()) arguments = e.arguments;
        tool_calls_.push_back(
            {{"type", "function"}, {"function", {{"name", e.name}, {"arguments", arguments}}}});
        break;
      }
    }
    std::fflush(stdout);
  }

  void Finish() {
    EndReasoning();
    Write("\n");
    std::fflush(stdout);
  }

  // The reply as the next turn's assistant message.
  ordered_json Message() const {
    ordered_json m = {{"role", "assistant"}, {"content", content_}};
    if (!reasoning_.empty()) m["reasoning_content"] = reasoning_;
    if (!tool_calls_.empty()) m["tool_calls"] = tool_calls_;
    return m;
  }

 private:
  void Write(const std::string& s) { std::fwrite(s.data(), 1, s.size(), stdout); }
  void EndReasoning() {
    if (!in_reasoning_) return;
    Write(ansi_ ? "\x1b[0m\n\n" : "\n</think>\n\n");
    in_reasoning_ = false;
  }

  bool ansi_;
  bool in_reasoning_ = false;
  std::string reasoning_;
  std::string content_;
  ordered_json tool_calls_ = ordered_json::array();
};

std::string Trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\r\n");
  if (a == std::string::npos) return "";
  return s.substr(a, s.find_last_not_of(" \t\r\n") - a + 1);
}

int Chat(const ChatOptions& o) {
  if (o.max_tokens <= 0) return Fail("--max-tokens: must be positive");
  if (o.context <= 1) return Fail("--context: must be at least 2");
  auto loaded = o.model.LoadRunner(/*verbose=*/true);
  if (!loaded.ok()) return Fail(loaded.status().message());
  std::unique_ptr<LoadedModel> model = std::move(*loaded);
  const std::string dir = model->dir();
  auto tokenizer = Tokenizer::Load(dir);
  if (!tokenizer.ok()) return Fail(tokenizer.status().message());
  auto chat_template = ChatTemplate::Load(dir);
  if (!chat_template.ok()) return Fail(chat_template.status().message());

  auto defaults = DefaultSampling(dir);
  if (!defaults.ok()) return Fail(defaults.status().message());
  Sampling sampling = *defaults;
  if (o.temperature_given) sampling.temperature = o.temperature;
  if (o.seed_given) sampling.seed = o.seed;
  if (Status s = sampling.Check(); !s.ok()) return Fail(s.message());

  EngineOptions options;
  options.slots = 1;
  options.rows = StepRows((*model).backend().kind(), 1, 0);
  options.busy_rows = BusyStepRows((*model).backend().kind(), 1, 0);
  options.context = o.context;
  if (model->arch().context > 0) options.context = std::min(options.context, model->arch().context);
  const int64_t budget = model->DefaultKvBudget();
  if (Status s = o.model.FitKv(model.get(), 1, options.context, budget, /*verbose=*/true); !s.ok())
    return Fail(s.message());
  options.kv_budget_bytes = KvBudgetFor(model->BudgetCaches(), model->PageBytes(), 1,
                                        PagesFor(options.context) + 1, options.rows);
  if (Status s = o.draft.Apply(*model, &options, o.model.device.threads); !s.ok()) return Fail(s.message());
  // Recurrent layers' states come out of the budget before the pages.
  options.kv_budget_bytes += Engine::StateBytes(model->caches(), options);
  auto created = Engine::Create(model->runner(), options);
  if (!created.ok()) return Fail(created.status().message());
  Engine& engine = **created;

  const bool interactive = isatty(STDIN_FILENO);
  const bool ansi = interactive && isatty(STDOUT_FILENO);
  if (interactive) {
    std::fprintf(stderr,
                 "chat with %s (context %lld, temperature %g); /image FILE attaches a picture and "
                 "/video FOLDER [FPS] a video to the next message, /reset clears, /exit quits\n",
                 dir.c_str(), static_cast<long long>(options.context), sampling.temperature);
  }

  ordered_json messages = ordered_json::array();
  // The pictures and videos of the conversation's messages in prompt order (preprocessed), and
  // those for the next message (its pictures come first, as PictureContent puts them).
  std::vector<VisionInput> media, attached_pictures, attached_videos;
  std::unique_ptr<PictureReader> reader;  // loaded at the first /image or /video
  auto reset = [&] {
    messages = ordered_json::array();
    media.clear();
    attached_pictures.clear();
    attached_videos.clear();
    if (!o.system.empty()) messages.push_back({{"role", "system"}, {"content", o.system}});
  };
  reset();

  std::string line;
  int64_t turn = 0;
  while (true) {
    if (interactive) {
      std::fputs(ansi ? "\x1b[1m> \x1b[0m" : "> ", stdout);
      std::fflush(stdout);
    }
    if (!std::getline(std::cin, line)) {
      if (interactive) std::fputs("\n", stdout);
      break;
    }
    const std::string text = Trim(line);
    if (text.empty()) continue;
    if (text == "/exit" || text == "/quit") break;
    if (text == "/reset") {
      reset();
      std::fprintf(stderr, "(conversation cleared)\n");
      continue;
    }

    auto command = [&](const char* name) {
      const size_t n = std::strlen(name);
      return text.rfind(name, 0) == 0 && (text.size() == n || text[n] == ' ');
    };
    if (command("/image") || command("/video")) {
      const bool video = command("/video");
      const std::string words = Trim(text.substr(6));
      Status s = video ? AttachVideo(model->first(), words, &reader, &attached_videos)
                       : AttachPicture(model->first(), words, &reader, &attached_pictures);
      if (!s.ok()) {
        std::fprintf(stderr, "%s\n", s.message().c_str());
      } else {
        std::fprintf(stderr, "(%s attached to the next message)\n", words.c_str());
      }
      continue;
    }

    const size_t media_before = media.size();
    if (attached_pictures.empty() && attached_videos.empty()) {
      messages.push_back({{"role", "user"}, {"content", text}});
    } else {
      messages.push_back(
          {{"role", "user"},
           {"content", PictureContent(attached_pictures.size(), text, attached_videos.size())}});
      for (auto* attached : {&attached_pictures, &attached_videos}) {
        for (VisionInput& in : *attached) media.push_back(std::move(in));
        attached->clear();
      }
    }
    auto drop_message = [&] {
      messages.erase(messages.size() - 1);
      media.resize(media_before);
    };
    ordered_json input = {{"messages", messages}, {"add_generation_prompt", true}};
    if (o.no_think) input["enable_thinking"] = false;
    auto prompt = ChatPrompt::Render(*chat_template, *tokenizer, input, /*last_messages=*/1);
    if (!prompt.ok()) return Fail(prompt.status().message());
    std::shared_ptr<const PromptPictures> prompt_pictures;
    if (!media.empty()) {
      // The videos' timestamps written into the text, the placeholders expanded to the rows of
      // the pictures and frames (the tower reads them again each turn): the marks move with
      // them.
      auto expanded = [&]() -> Expected<PicturePrompt> {
        GZ_ASSIGN_OR_RETURN(*prompt, reader->WriteVideos(*tokenizer, *prompt, media));
        GZ_ASSIGN_OR_RETURN(PlacedPrompt placed, reader->Place(prompt->tokens, media));
        prompt->mark = placed.ExpandedPosition(prompt->mark);
        prompt->system_end = placed.ExpandedPosition(prompt->system_end);
        return reader->Read(std::move(placed));
      }();
      if (!expanded.ok()) {
        std::fprintf(stderr, "%s\n", expanded.status().message().c_str());
        drop_message();
        continue;
      }
      prompt->tokens = std::move(expanded->tokens);
      prompt_pictures = std::make_shared<const PromptPictures>(std::move(expanded->pictures));
    }
    const int64_t size = static_cast<int64_t>(prompt->tokens.size());
    if (size >= options.context) {
      std::fprintf(stderr,
                   "the conversation (%lld tokens) fills the %lld-token context; /reset to start "
                   "over\n",
                   static_cast<long long>(size), static_cast<long long>(options.context));
      drop_message();
      continue;
    }

    Request request;
    request.prompt = prompt->tokens;
    request.pictures = std::move(prompt_pictures);
    request.limit = std::min(o.max_tokens, options.context - size);
    request.sampling = sampling;
    // Each turn draws fresh numbers unless a seed repeats the whole chat.
    if (sampling.seed) request.sampling.seed = *sampling.seed + static_cast<uint64_t>(turn);
    const EngineStats before = engine.stats();
    auto id =
        engine.Add(std::move(request), prompt->mark, std::max<int32_t>(prompt->system_end, 0));
    if (!id.ok()) return Fail(id.status().message());
    ++turn;

    OutputParserOptions parser_options;
    parser_options.starts_in_reasoning = PromptOpensReasoning(prompt->text);
    OutputParser parser(parser_options);
    StreamDecoder decoder(*tokenizer);
    ReplyPrinter printer(ansi);
    auto start = Clock::now();
    Clock::time_point first;
    int64_t generated = 0;
    std::string end;
    {
      InterruptScope catch_interrupt;
      while (engine.Busy()) {
        if (interrupted) {
          engine.Cancel(*id);
          end = "interrupted";
          break;
        }
        auto progress = engine.Advance();
        if (!progress.ok()) return Fail(progress.status().message());
        for (const Progress& p : *progress) {
          if (!p.status.ok()) return Fail("chat: " + p.status.message());
          for (int32_t t : p.tokens) {
            if (generated++ == 0) first = Clock::now();
            for (const OutputEvent& e : parser.Feed(decoder.Push(t))) printer.Print(e);
          }
          if (!p.end.empty()) end = p.end;
        }
      }
    }
    for (const OutputEvent& e : parser.Feed(decoder.Flush())) printer.Print(e);
    for (const OutputEvent& e : parser.Finish()) printer.Print(e);
    printer.Finish();
    messages.push_back(printer.Message());

    auto done = Clock::now();
    if (generated == 0) first = done;
    const int64_t prompt_tokens = engine.stats().prompt_tokens - before.prompt_tokens;
    const int64_t cached = engine.stats().cached_tokens - before.cached_tokens;
    const double prompt_s = Seconds(start, first), decode_s = Seconds(first, done);
    std::fprintf(stderr,
                 "[prompt: %lld tokens, %lld read, %lld reused, %.1f tokens/s | answer: %lld "
                 "tokens, %.1f tokens/s, %s]\n",
                 static_cast<long long>(prompt_tokens),
                 static_cast<long long>(prompt_tokens - cached), static_cast<long long>(cached),
                 prompt_s > 0 ? (prompt_tokens - cached) / prompt_s : 0.0,
                 static_cast<long long>(generated),
                 decode_s > 0 && generated > 1 ? (generated - 1) / decode_s : 0.0,
                 end.empty() ? "?" : end.c_str());
    std::fflush(stderr);
  }
  return 0;
}

}  // namespace

void AddChatCommand(CLI::App& app, CommandContext& ctx) {
  auto* cmd = app.add_subcommand(
      "chat",
      "Chat with a model in the terminal; /image FILE attaches a picture (PNG, JPEG, WebP) and "
      "/video FOLDER [FPS] a video (a folder of its frames, in name order, taken at FPS frames a "
      "second; default 24) to the next message for a model with a vision tower, /reset clears, "
      "/exit quits");
  auto o = std::make_shared<ChatOptions>();
  o->model.Add(cmd);
  o->model.AddPipeline(cmd);
  o->draft.Add(cmd);
  cmd->add_option("--system", o->system, "System message that starts the conversation");
  cmd->add_option("--max-tokens,-n", o->max_tokens, "Most tokens of one reply")->default_val(512);
  cmd->add_option("--temperature", o->temperature,
                  "0 for greedy (default: generation_config.json, else 0.7)")
      ->each([o](const std::string&) { o->temperature_given = true; });
  cmd->add_option("--seed", o->seed, "Seed that makes a sampled chat repeatable")
      ->each([o](const std::string&) { o->seed_given = true; });
  cmd->add_flag("--no-think", o->no_think, "Ask the template to skip reasoning (enable_thinking)");
  cmd->add_option("--context", o->context, "Positions of the conversation (at most the model's)")
      ->default_val(4096);
  cmd->callback([&ctx, o] { ctx.exit_code = Chat(*o); });
}

}  // namespace gizllm::cli
