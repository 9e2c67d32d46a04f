#include "server/http_server.h"

#include <array>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <ctime>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "server/api_error.h"
#include "server/embedding_request.h"
#include "server/encoder_batcher.h"
#include "server/openai_request.h"
#include "server/openai_response.h"
#include "server/output_stream.h"

namespace gizllm::server {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using boost::system::error_code;
using nlohmann::json;

Status ServerOptions::Check() const {
  if (port < 0 || port > 65535) return InvalidArgument("--port must be in [0, 65535]");
  if (threads < 1) return InvalidArgument("--http-threads must be at least 1");
  if (max_body_bytes < 1024) return InvalidArgument("--max-body must be at least 1024 bytes");
  if (!(read_timeout_s > 0) || !(write_timeout_s > 0) || !(max_generation_s > 0)) {
    return InvalidArgument("timeouts must be positive");
  }
  if (batch_tokens < 1) return InvalidArgument("--max-batch-tokens must be at least 1");
  return media.Check();
}

namespace {

bool ConstantTimeEquals(std::string_view given, std::string_view expected) {
  // Every byte of the expected key is compared whatever the given one holds.
  unsigned char diff = given.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < expected.size(); ++i) {
    unsigned char g = i < given.size() ? static_cast<unsigned char>(given[i]) : 0;
    diff |= g ^ static_cast<unsigned char>(expected[i]);
  }
  return diff == 0;
}

constexpr std::array<const char*, 10> kPaths = {
    "/v1/chat/completions", "/v1/completions", "/v1/models", "/tokenize",
    "/detokenize",          "/health",         "/metrics",   "/v1/embeddings",
    "/v1/rerank",           "/v1/score"};

// (Literals passed straight to a coroutine trip GCC 12; these are not arrays.)
constexpr std::string_view kJsonType = "application/json";
constexpr std::string_view kPrometheusType = "text/plain; version=0.0.4";
constexpr std::string_view kHealthy = "{\"status\":\"ok\"}";

ApiError TimeoutError() {
  return ApiError{408, "The request did not arrive within the read timeout.",
                  "invalid_request_error", "", "request_timeout"};
}
ApiError TooLargeError(int64_t limit) {
  return ApiError{
      413, "The request body is larger than the limit of " + std::to_string(limit) + " bytes.",
      "invalid_request_error", "", "request_too_large"};
}
ApiError HeaderTooLargeError() {
  return ApiError{431, "The request's header is too large.", "invalid_request_error", "",
                  "header_too_large"};
}
ApiError MalformedError(const std::string& why) {
  return BadRequest("Malformed HTTP request: " + why, "", "bad_http_request");
}

// The most bytes a connection's read buffer holds; Monitor stops reading ahead at half of it.
constexpr size_t kMaxReadBuffer = size_t{2} << 20;

// The status /metrics counts for a request its client closed before the answer (as nginx does).
constexpr int kClientClosed = 499;

int64_t UnixTime() { return static_cast<int64_t>(std::time(nullptr)); }

// A request's generation as it reaches the session: progress items from the engine thread.
struct Pipe {
  explicit Pipe(net::any_io_executor executor)
      : wake(executor, net::steady_timer::time_point::max()) {}
  std::mutex mutex;
  std::vector<std::pair<GenerateProgress, Status>> items;  // guarded by mutex
  net::steady_timer wake;                                  // cancelled to wake the session
  // On the session's strand only:
  bool disconnected = false;
  bool monitoring = false;
  bool finished = false;
};

// What one generation request asks, ready for the engine.
struct Job {
  bool chat = true;
  std::string id;
  int64_t created = 0;
  GenerationParams params;
  GenerateRequest request;
  std::optional<OutputParserOptions> parser;  // chats: how to read the answer
  std::string echo;                           // completions with echo: the prompt's text
  std::string answer_start;                   // a forced tool call's opening, in the prompt
  int max_tool_calls = -1;                    // parallel_tool_calls false: 1; -1: no limit
};

// The outcome of routing a request: a response to write, or a generation to run.
struct Routed {
  http::status status = http::status::ok;
  std::string body;
  std::string_view content_type = kJsonType;
  std::optional<Job> job;
  std::optional<EncoderJob> encoder_job;  // the embed and rerank tasks' requests

  static Routed Ok(std::string body, std::string_view content_type = kJsonType) {
    Routed r;
    r.body = std::move(body);
    r.content_type = content_type;
    return r;
  }
  static Routed Error(const ApiError& error) {
    Routed r;
    r.status = static_cast<http::status>(error.status);
    r.body = Dump(error.ToJson());
    return r;
  }
};

}  // namespace

struct HttpServer::Impl {
  Impl(const TextModel* text, EngineLoop* loop, EncoderModel* encoder, Metrics& metrics,
       ServerOptions options)
      : text(text),
        loop(loop),
        encoder(encoder),
        metrics(metrics),
        options(std::move(options)),
        acceptor(io),
        signals(io, SIGINT, SIGTERM) {
    if (encoder) {
      batcher = std::make_unique<EncoderBatcher>(*encoder, metrics, this->options.batch_tokens);
    }
  }

  net::awaitable<void> Accept();
  Task task() const { return encoder ? encoder->task() : Task::kGenerate; }

  // The generate task's text model and loop, or the embed and rerank tasks' encoder; the
  // others are null.
  const TextModel* text;
  EngineLoop* loop;
  EncoderModel* encoder;
  Metrics& metrics;
  ServerOptions options;
  int64_t started = UnixTime();
  net::io_context io;
  tcp::acceptor acceptor;
  net::signal_set signals;
  std::vector<std::thread> threads;
  std::atomic<bool> stopped{false};
  // The encoder's requests run here, off the HTTP threads (null for the generate task).
  // Declared after io: it is stopped (and its last answers posted) before io goes.
  std::unique_ptr<EncoderBatcher> batcher;
};

namespace {

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(HttpServer::Impl& server, tcp::socket socket)
      : server_(server), socket_(std::move(socket)), watchdog_(socket_.get_executor()) {}

  net::awaitable<void> Run();
  net::any_io_executor socket_executor() { return socket_.get_executor(); }

 private:
  using Request = http::request<http::string_body>;

  // Cancels the socket's operations after `seconds` unless Disarm() comes first.
  void Arm(double seconds) {
    ++watchdog_generation_;
    watchdog_.expires_after(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(seconds)));
    watchdog_.async_wait([self = shared_from_this(), g = watchdog_generation_](error_code ec) {
      if (ec || g != self->watchdog_generation_) return;
      self->timed_out_ = true;
      error_code ignored;
      self->socket_.cancel(ignored);
    });
  }
  void Disarm() {
    ++watchdog_generation_;
    watchdog_.cancel();
  }

  net::awaitable<void> WriteResponse(http::status status, std::string body,
                                     std::string_view content_type, bool keep_alive,
                                     unsigned version);
  net::awaitable<void> WriteError(const ApiError& error, bool keep_alive, unsigned version,
                                  const std::string& endpoint);
  net::awaitable<bool> Handle(Request& request);
  // What a request asks for: an answer ready now, or a generation.
  Routed Route(const Request& request);
  Routed PrepareChat(const json& body);
  Routed PrepareCompletion(const json& body);
  net::awaitable<bool> Generate(Job job, unsigned version, bool keep_alive);
  // Runs an encoder job in the server's batches and writes its answer.
  net::awaitable<bool> Encode(EncoderJob job, unsigned version, bool keep_alive);
  void Monitor(std::shared_ptr<Pipe> pipe);

  HttpServer::Impl& server_;
  tcp::socket socket_;
  // Bytes read and not yet parsed: a header (64 KiB at most), a chunk's header line, a pipelined
  // request. Bounded, or a chunk extension that never ends would grow it without end.
  beast::flat_buffer buffer_{kMaxReadBuffer};
  net::steady_timer watchdog_;
  uint64_t watchdog_generation_ = 0;
  bool timed_out_ = false;
  std::string endpoint_;  // of the request being served, for the metrics
};

net::awaitable<void> Session::WriteResponse(http::status status, std::string body,
                                            std::string_view content_type, bool keep_alive,
                                            unsigned version) {
  http::response<http::string_body> res{status, version};
  res.set(http::field::server, "gizllm");
  res.set(http::field::content_type, std::string(content_type));
  if (status == http::status::service_unavailable) res.set(http::field::retry_after, "1");
  res.keep_alive(keep_alive);
  res.body() = std::move(body);
  res.prepare_payload();
  error_code ec;
  Arm(server_.options.write_timeout_s);
  co_await http::async_write(socket_, res, net::redirect_error(net::use_awaitable, ec));
  Disarm();
  server_.metrics.CountRequest(endpoint_, static_cast<int>(status));
}

net::awaitable<void> Session::WriteError(const ApiError& error, bool keep_alive, unsigned version,
                                         const std::string& endpoint) {
  co_await WriteResponse(static_cast<http::status>(error.status), Dump(error.ToJson()), kJsonType,
                         keep_alive, version);
}

void Session::Monitor(std::shared_ptr<Pipe> pipe) {
  // Reading while the answer is made tells when the client goes away: its request is then
  // cancelled. Bytes that arrive (a pipelined request) wait in the buffer.
  pipe->monitoring = true;
  socket_.async_read_some(buffer_.prepare(4096),
                          [self = shared_from_this(), pipe](error_code ec, size_t n) {
                            pipe->monitoring = false;
                            if (!ec) {
                              self->buffer_.commit(n);
                              if (!pipe->finished && self->buffer_.size() < kMaxReadBuffer / 2) {
                                self->Monitor(pipe);
                                return;
                              }
                            } else if (ec != net::error::operation_aborted) {
                              pipe->disconnected = true;
                            }
                            pipe->wake.cancel();
                          });
}

net::awaitable<bool> Session::Generate(Job job, unsigned version, bool keep_alive) {
  const TextModel& text = *server_.text;
  const GenerationParams& params = job.params;
  auto pipe = std::make_shared<Pipe>(socket_.get_executor());
  auto executor = socket_.get_executor();
  int64_t prompt_tokens = static_cast<int64_t>(job.request.prompt.size());
  Expected<int64_t> ticket = server_.loop->Submit(
      std::move(job.request), [pipe, executor](const GenerateProgress& p, const Status& s) {
        {
          std::lock_guard lock(pipe->mutex);
          pipe->items.emplace_back(p, s);
        }
        net::post(executor, [pipe] { pipe->wake.cancel(); });
      });
  if (!ticket.ok()) {
    co_await WriteError(FromStatus(ticket.status()), keep_alive, version, endpoint_);
    co_return keep_alive;
  }
  Monitor(pipe);
  // The session wakes at the generation's deadline if nothing comes before it.
  pipe->wake.expires_after(std::chrono::duration_cast<net::steady_timer::duration>(
      std::chrono::duration<double>(server_.options.max_generation_s)));

  OutputStream output(text, params.stop, std::move(job.parser));
  // The parser reads the forced start of the call as if the model had written it.
  output.Assume(job.answer_start);
  if (job.max_tool_calls >= 0) output.LimitToolCalls(job.max_tool_calls);
  const std::string model = text.Name();
  const bool stream = params.stream;
  Usage usage{.prompt = prompt_tokens};
  OutputDelta answer;  // the whole answer (non-streamed)
  std::vector<TokenLogprob> logprobs;
  std::string finish;
  std::optional<ApiError> failure;
  int tool_calls_sent = 0;
  bool ok = true;            // the client still takes what we write
  bool timed_limit = false;  // ended by --max-generation-time

  bool warnings_sent = params.warnings.empty();
  auto chunk = [&](json choice) {
    json c = {{"id", job.id},
              {"object", job.chat ? "chat.completion.chunk" : "text_completion"},
              {"created", job.created},
              {"model", model},
              {"choices", json::array({std::move(choice)})}};
    if (params.include_usage) c["usage"] = nullptr;
    // The request's warnings ride on the first chunk.
    if (!warnings_sent) c["warnings"] = params.warnings;
    warnings_sent = true;
    return "data: " + Dump(c) + "\n\n";
  };
  // The stream chunk for a delta; empty when there is nothing to say.
  auto delta_event = [&](OutputDelta& d, std::span<const TokenLogprob> lps,
                         const std::string& reason, bool first) -> std::string {
    if (d.empty() && reason.empty() && lps.empty() && !first) return "";
    json choice = {{"index", 0}, {"logprobs", nullptr}};
    choice["finish_reason"] = reason.empty() ? json(nullptr) : json(reason);
    if (job.chat) {
      json delta = json::object();
      if (first) delta["role"] = "assistant";
      if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
      if (!d.content.empty() || (first && d.reasoning.empty() && d.tool_calls.empty())) {
        delta["content"] = d.content;
      }
      if (!d.tool_calls.empty()) {
        delta["tool_calls"] = ToolCallsJson(d.tool_calls, tool_calls_sent, /*streamed=*/true);
        tool_calls_sent += static_cast<int>(d.tool_calls.size());
      }
      choice["delta"] = std::move(delta);
      if (params.logprobs && !lps.empty()) {
        choice["logprobs"] = {{"content", ChatLogprobs(text, lps)}};
      }
    } else {
      choice["text"] = (first ? job.echo : std::string()) + d.content;
      if (params.logprobs && !lps.empty()) {
        choice["logprobs"] = CompletionLogprobs(text, lps, 0);
      }
    }
    return chunk(std::move(choice));
  };

  // HTTP/1.1 streams in chunks; HTTP/1.0 knows no chunks: the events go as they are and the
  // connection's close ends the body.
  const bool chunked = version >= 11;
  if (stream && !chunked) keep_alive = false;
  auto write_events = [&](const std::string& events) -> net::awaitable<error_code> {
    error_code ec;
    Arm(server_.options.write_timeout_s);
    if (chunked) {
      co_await net::async_write(socket_, http::make_chunk(net::buffer(events)),
                                net::redirect_error(net::use_awaitable, ec));
    } else {
      co_await net::async_write(socket_, net::buffer(events),
                                net::redirect_error(net::use_awaitable, ec));
    }
    Disarm();
    co_return ec;
  };

  if (stream) {
    http::response<http::empty_body> res{http::status::ok, version};
    res.set(http::field::server, "gizllm");
    res.set(http::field::content_type, "text/event-stream");
    res.set(http::field::cache_control, "no-cache");
    res.keep_alive(keep_alive);
    res.chunked(chunked);
    http::response_serializer<http::empty_body> serializer{res};
    error_code ec;
    Arm(server_.options.write_timeout_s);
    co_await http::async_write_header(socket_, serializer,
                                      net::redirect_error(net::use_awaitable, ec));
    Disarm();
    ok = !ec;
    if (ok && (job.chat || !job.echo.empty())) {
      OutputDelta none;
      std::string first = delta_event(none, {}, "", /*first=*/true);
      error_code wec = co_await write_events(first);
      ok = !wec;
    }
  }
  bool first_sent = job.chat || !job.echo.empty();

  while (ok && finish.empty() && !failure) {
    if (pipe->wake.expiry() <= net::steady_timer::clock_type::now()) {
      // Past --max-generation-time: the answer ends here, as at max_tokens.
      Expected<OutputDelta> rest = output.Finish();
      if (!rest.ok()) {
        failure = FromStatus(rest.status());
        break;
      }
      finish = "length";
      if (stream) {
        std::string events = delta_event(*rest, {}, "", !first_sent);
        first_sent = true;
        if (!events.empty()) ok = !(co_await write_events(events));
      } else {
        answer.Append(std::move(*rest));
      }
      timed_limit = true;
      break;
    }
    std::vector<std::pair<GenerateProgress, Status>> items;
    {
      std::lock_guard lock(pipe->mutex);
      items.swap(pipe->items);
    }
    if (items.empty()) {
      if (pipe->disconnected) {
        ok = false;
        break;
      }
      error_code ec;
      co_await pipe->wake.async_wait(net::redirect_error(net::use_awaitable, ec));
      continue;
    }
    std::string events;
    for (auto& [progress, status] : items) {
      if (!status.ok()) {
        failure = FromStatus(status);
        break;
      }
      if (progress.cached >= 0) usage.cached = progress.cached;
      // Token by token: a step may bring several (kept drafts), and those after a stop string
      // count as they would one step at a time: not at all.
      Expected<OutputDelta> delta = OutputDelta{};
      size_t used = 0;
      for (; used < progress.tokens.size() && !output.stopped(); ++used) {
        Expected<OutputDelta> piece =
            output.Push(std::span<const int32_t>(&progress.tokens[used], 1));
        if (!piece.ok()) {
          delta = piece.status();
          break;
        }
        delta->Append(std::move(*piece));
      }
      if (!delta.ok()) {
        failure = FromStatus(delta.status());
        break;
      }
      usage.completion += static_cast<int64_t>(used);
      if (output.stopped()) {
        finish = "stop";
      } else if (!progress.end.empty()) {
        Expected<OutputDelta> rest = output.Finish();
        if (!rest.ok()) {
          failure = FromStatus(rest.status());
          break;
        }
        delta->Append(std::move(*rest));
        finish = progress.end;
      }
      std::span<const TokenLogprob> lps = std::span<const TokenLogprob>(progress.logprobs)
                                              .first(std::min(used, progress.logprobs.size()));
      if (stream) {
        events += delta_event(*delta, lps, "", !first_sent);
        first_sent = true;
      } else {
        answer.Append(std::move(*delta));
        logprobs.insert(logprobs.end(), lps.begin(), lps.end());
      }
      if (!finish.empty()) break;
    }
    if (stream && !events.empty()) {
      error_code ec = co_await write_events(events);
      ok = !ec;
    }
  }
  // The request ended here (a stop string, an error, a client gone, the time limit) or in the
  // engine.
  if ((finish != "length" || timed_limit) && !(finish == "stop" && !output.stopped())) {
    server_.loop->Cancel(*ticket);
  }
  pipe->finished = true;
  pipe->wake.expires_at(net::steady_timer::time_point::max());
  if (pipe->monitoring) {
    error_code ignored;
    socket_.cancel(ignored);
    while (pipe->monitoring) {
      error_code ec;
      co_await pipe->wake.async_wait(net::redirect_error(net::use_awaitable, ec));
    }
  }
  if (!ok || pipe->disconnected || timed_out_) {
    server_.metrics.CountRequest(endpoint_, kClientClosed);
    co_return false;
  }
  if (finish == "stop" && (answer.tool_calls.size() > 0 || tool_calls_sent > 0)) {
    finish = "tool_calls";
  }

  if (stream) {
    std::string events;
    if (failure) {
      events = "data: " + Dump(failure->ToJson()) + "\n\n";
    } else {
      OutputDelta none;
      events += delta_event(none, {}, finish, false);
      if (params.include_usage) {
        json c = {{"id", job.id},
                  {"object", job.chat ? "chat.completion.chunk" : "text_completion"},
                  {"created", job.created},
                  {"model", model},
                  {"choices", json::array()},
                  {"usage", usage.ToJson()}};
        events += "data: " + Dump(c) + "\n\n";
      }
    }
    events += "data: [DONE]\n\n";
    error_code ec = co_await write_events(events);
    if (!ec && chunked) {
      Arm(server_.options.write_timeout_s);
      co_await net::async_write(socket_, http::make_chunk_last(),
                                net::redirect_error(net::use_awaitable, ec));
      Disarm();
    }
    server_.metrics.CountRequest(endpoint_, failure ? failure->status : 200);
    co_return !ec && keep_alive && !failure;
  }

  if (failure) {
    co_await WriteError(*failure, keep_alive, version, endpoint_);
    co_return keep_alive;
  }
  json choice = {{"index", 0}, {"finish_reason", finish}, {"logprobs", nullptr}};
  json response = {{"id", job.id}, {"created", job.created}, {"model", model}};
  if (job.chat) {
    response["object"] = "chat.completion";
    json message = {{"role", "assistant"}};
    bool calls = !answer.tool_calls.empty();
    message["content"] = calls && answer.content.empty() ? json(nullptr) : json(answer.content);
    if (!answer.reasoning.empty()) message["reasoning_content"] = answer.reasoning;
    if (calls) message["tool_calls"] = ToolCallsJson(answer.tool_calls, 0, /*streamed=*/false);
    choice["message"] = std::move(message);
    if (params.logprobs) choice["logprobs"] = {{"content", ChatLogprobs(text, logprobs)}};
  } else {
    response["object"] = "text_completion";
    choice["text"] = job.echo + answer.content;
    if (params.logprobs) {
      choice["logprobs"] =
          CompletionLogprobs(text, logprobs, static_cast<int64_t>(job.echo.size()));
    }
  }
  response["choices"] = json::array({std::move(choice)});
  response["usage"] = usage.ToJson();
  if (!params.warnings.empty()) response["warnings"] = params.warnings;
  co_await WriteResponse(http::status::ok, Dump(response), kJsonType, keep_alive, version);
  co_return keep_alive;
}

// Sets the request's limit from max_tokens and the context; an error when they do not fit.
std::optional<ApiError> FitContext(const TextModel& text, const GenerationParams& params,
                                   const char* prompt_param, GenerateRequest* request) {
  int64_t prompt = static_cast<int64_t>(request->prompt.size());
  int64_t context = text.Context();
  if (prompt >= context) {
    return ApiError{400,
                    "This model's maximum context length is " + std::to_string(context) +
                        " tokens. However, your prompt has " + std::to_string(prompt) +
                        " tokens, leaving no room for an answer.",
                    "invalid_request_error", prompt_param, "context_length_exceeded"};
  }
  if (params.max_tokens && prompt + *params.max_tokens > context) {
    return ApiError{400,
                    "This model's maximum context length is " + std::to_string(context) +
                        " tokens. However, you requested " +
                        std::to_string(prompt + *params.max_tokens) + " tokens (" +
                        std::to_string(prompt) + " in the prompt, " +
                        std::to_string(*params.max_tokens) +
                        " for the answer). Reduce the prompt or max_tokens.",
                    "invalid_request_error", "max_tokens", "context_length_exceeded"};
  }
  request->limit = static_cast<int32_t>(params.max_tokens ? *params.max_tokens : context - prompt);
  return std::nullopt;
}

std::optional<ApiError> CheckModel(const TextModel& text, const std::string& model) {
  if (model.empty() || model == text.Name()) return std::nullopt;
  return ApiError{404, "The model '" + model + "' does not exist.", "invalid_request_error",
                  "model", "model_not_found"};
}

Routed Session::PrepareChat(const json& body) {
  const TextModel& text = *server_.text;
  ChatRequest chat;
  std::optional<ApiError> error = ParseChatRequest(body, text.Vocab(), &chat, text.ToolSyntax());
  if (!error) error = CheckModel(text, chat.params.model);
  if (error) return Routed::Error(*error);
  Job job;
  if (chat.tool_choice == "function" || chat.tool_choice == "required") {
    // A forced call: the answer starts with the tag, and the request's grammar (ToolCallGbnf,
    // or ToolCallXmlGbnf for a model of the XML form) holds the call that follows to the tools'
    // names and parameters.
    chat.input.answer_prefix = "<tool_call>\n";
    job.answer_start = chat.input.answer_prefix;
  }
  // Pictures and videos are read and preprocessed here, on the request's thread; the tower runs
  // on the engine's (EngineGenerator::Add).
  std::vector<VisionInput> media;
  if (!chat.media.empty()) {
    const PictureReader* pictures = text.Pictures();
    if (!pictures) {
      const std::string& param = chat.media[0].param;
      return Routed::Error(BadRequest("'" + param + "': the model " + text.Name() +
                                          " reads no pictures or videos (it has no vision tower)",
                                      param, "unsupported_content"));
    }
    error = PrepareMedia(chat.media, server_.options.media, *pictures, &media);
    if (error) return Routed::Error(*error);
  }
  Expected<ChatPrompt> prompt = text.RenderChat(chat.input);
  // A video's timestamps are text: written into the prompt's text, which is tokenized again.
  if (prompt.ok() && !media.empty()) prompt = text.WriteVideos(*prompt, media);
  if (!prompt.ok()) return Routed::Error(FromStatus(prompt.status(), "messages"));
  job.request.prompt = std::move(prompt->tokens);
  job.request.mark = prompt->mark;
  job.request.shared = prompt->system_end;
  if (!chat.media.empty()) {
    Expected<PlacedPrompt> placed = text.Pictures()->Place(job.request.prompt, std::move(media));
    if (!placed.ok()) return Routed::Error(FromStatus(placed.status(), "messages"));
    job.request.mark = placed->ExpandedPosition(job.request.mark);
    job.request.shared = placed->ExpandedPosition(job.request.shared);
    job.request.prompt = placed->tokens;
    job.request.media = std::make_shared<const PlacedPrompt>(std::move(placed).value());
  }
  error = FitContext(text, chat.params, "messages", &job.request);
  if (error) return Routed::Error(*error);
  job.chat = true;
  job.id = NewId("chatcmpl-");
  job.created = UnixTime();
  job.request.sampling = chat.params.sampling;
  job.request.ignore_eos = chat.params.ignore_eos;
  job.parser = ChatParserOptions(chat.input.tools, *prompt);
  if (!chat.parallel_tool_calls) job.max_tool_calls = 1;
  // A reasoning model (its template writes <think>) may think before its answer; the grammar
  // holds the answer (a forced tool call starts in the prompt, with no thinking).
  if (job.request.sampling.grammar && chat.input.answer_prefix.empty() && text.Reasons()) {
    job.request.sampling.grammar_after_thinking = true;
    job.request.sampling.thinking = job.parser->starts_in_reasoning;
  }
  job.params = std::move(chat.params);
  Routed r;
  r.job = std::move(job);
  return r;
}

Routed Session::PrepareCompletion(const json& body) {
  const TextModel& text = *server_.text;
  CompletionRequest completion;
  std::optional<ApiError> error = ParseCompletionRequest(body, text.Vocab(), &completion);
  if (!error) error = CheckModel(text, completion.params.model);
  if (error) return Routed::Error(*error);
  Job job;
  if (completion.prompt_is_tokens) {
    job.request.prompt = std::move(completion.prompt_tokens);
    if (completion.echo) {
      Expected<std::string> t = text.Detokenize(job.request.prompt);
      if (t.ok()) job.echo = *t;
    }
  } else {
    Expected<std::vector<int32_t>> tokens = text.Tokenize(completion.prompt_text);
    if (!tokens.ok()) return Routed::Error(FromStatus(tokens.status(), "prompt"));
    job.request.prompt = std::move(*tokens);
    if (completion.echo) job.echo = completion.prompt_text;
  }
  error = FitContext(text, completion.params, "prompt", &job.request);
  if (error) return Routed::Error(*error);
  job.chat = false;
  job.id = NewId("cmpl-");
  job.created = UnixTime();
  job.request.sampling = completion.params.sampling;
  job.request.ignore_eos = completion.params.ignore_eos;
  job.params = std::move(completion.params);
  Routed r;
  r.job = std::move(job);
  return r;
}

Routed Session::Route(const Request& request) {
  std::string_view target(request.target().data(), request.target().size());
  std::string path(target.substr(0, target.find('?')));
  // vLLM's and Jina's spellings of the encoder routes.
  if (path == "/rerank" || path == "/v2/rerank") path = "/v1/rerank";
  if (path == "/score") path = "/v1/score";
  const bool get = request.method() == http::verb::get;
  const bool post = request.method() == http::verb::post;

  endpoint_ = "other";
  for (const char* p : kPaths) {
    if (path == p) endpoint_ = p;
  }
  if (path.rfind("/v1/models/", 0) == 0) endpoint_ = "/v1/models";
  if (endpoint_ == "other") {
    return Routed::Error(
        ApiError{404, "Invalid URL (" + std::string(request.method_string()) + " " + path + ")",
                 "invalid_request_error", "", "not_found"});
  }
  const bool wants_get =
      endpoint_ == "/v1/models" || endpoint_ == "/health" || endpoint_ == "/metrics";
  if ((wants_get && !get) || (!wants_get && !post)) {
    return Routed::Error(ApiError{405,
                                  "Method " + std::string(request.method_string()) +
                                      " is not allowed on " + path + "; use " +
                                      (wants_get ? "GET" : "POST"),
                                  "invalid_request_error", "", "method_not_allowed"});
  }
  if (endpoint_ == "/health") return Routed::Ok(std::string(kHealthy));
  if (endpoint_ == "/metrics") {
    return Routed::Ok(server_.metrics.Render(server_.loop ? server_.loop->Stats() : LoopStats{}),
                      kPrometheusType);
  }
  if (!server_.options.api_key.empty()) {
    auto auth = request.find(http::field::authorization);
    std::string_view given;
    if (auth != request.end()) {
      given = std::string_view(auth->value().data(), auth->value().size());
    }
    // The scheme's name is case-insensitive (RFC 7235); one or more spaces follow it.
    constexpr std::string_view kBearer = "bearer";
    bool bearer = given.size() > kBearer.size() && given[kBearer.size()] == ' ';
    for (size_t i = 0; bearer && i < kBearer.size(); ++i) {
      bearer = (given[i] | 0x20) == kBearer[i];
    }
    std::string_view key = bearer ? given.substr(kBearer.size()) : std::string_view();
    while (!key.empty() && key.front() == ' ') key.remove_prefix(1);
    if (!bearer || !ConstantTimeEquals(key, server_.options.api_key)) {
      std::string message = auth == request.end()
                                ? "You didn't provide an API key. Send it as 'Authorization: "
                                  "Bearer KEY'."
                                : "Incorrect API key provided.";
      return Routed::Error(ApiError{401, message, "invalid_request_error", "", "invalid_api_key"});
    }
  }
  const std::string served = server_.encoder ? server_.encoder->Name() : server_.text->Name();
  if (endpoint_ == "/v1/models") {
    json model = {
        {"id", served},
        {"object", "model"},
        {"created", server_.started},
        {"owned_by", "gizllm"},
        {"max_model_len", server_.encoder ? server_.encoder->MaxTokens() : server_.text->Context()},
        {"task", TaskName(server_.task())}};
    if (path == "/v1/models") {
      return Routed::Ok(Dump(json{{"object", "list"}, {"data", json::array({model})}}));
    }
    std::string name = path.substr(std::string_view("/v1/models/").size());
    if (name != served) {
      return Routed::Error(ApiError{404, "The model '" + name + "' does not exist.",
                                    "invalid_request_error", "model", "model_not_found"});
    }
    return Routed::Ok(Dump(model));
  }

  json body;
  if (std::optional<ApiError> error = ParseBody(request.body(), &body)) {
    return Routed::Error(*error);
  }
  // Each route belongs to one task; another answers 400 naming the server's.
  const Task wanted = endpoint_ == "/v1/embeddings"                           ? Task::kEmbed
                      : endpoint_ == "/v1/rerank" || endpoint_ == "/v1/score" ? Task::kRerank
                                                                              : Task::kGenerate;
  if (wanted != server_.task()) {
    return Routed::Error(BadRequest(path + " is for the " + TaskName(wanted) +
                                        " task; this server's task is " + TaskName(server_.task()) +
                                        " (serve --task)",
                                    "", "wrong_task"));
  }
  if (server_.encoder) {
    PreparedEncoderRequest prepared =
        endpoint_ == "/v1/embeddings" ? PrepareEmbeddings(*server_.encoder, body)
        : endpoint_ == "/v1/rerank"   ? PrepareRerank(*server_.encoder, body)
                                      : PrepareScore(*server_.encoder, body);
    if (prepared.error) return Routed::Error(*prepared.error);
    Routed r;
    r.encoder_job = std::move(prepared.job);
    return r;
  }
  const TextModel& text = *server_.text;
  if (endpoint_ == "/v1/chat/completions") return PrepareChat(body);
  if (endpoint_ == "/v1/completions") return PrepareCompletion(body);
  if (endpoint_ == "/tokenize") {
    TokenizeRequest tokenize;
    std::optional<ApiError> error = ParseTokenizeRequest(body, &tokenize);
    if (!error) error = CheckModel(text, tokenize.model);
    if (error) return Routed::Error(*error);
    std::vector<int32_t> tokens;
    if (tokenize.chat) {
      tokenize.chat->add_generation_prompt = tokenize.add_generation_prompt;
      Expected<ChatPrompt> prompt = text.RenderChat(*tokenize.chat);
      if (!prompt.ok()) return Routed::Error(FromStatus(prompt.status(), "messages"));
      tokens = std::move(prompt->tokens);
    } else {
      Expected<std::vector<int32_t>> t = text.Tokenize(tokenize.prompt);
      if (!t.ok()) return Routed::Error(FromStatus(t.status(), "prompt"));
      tokens = std::move(*t);
    }
    return Routed::Ok(Dump(
        json{{"tokens", tokens}, {"count", tokens.size()}, {"max_model_len", text.Context()}}));
  }
  // /detokenize
  DetokenizeRequest detokenize;
  std::optional<ApiError> error = ParseDetokenizeRequest(body, text.Vocab(), &detokenize);
  if (!error) error = CheckModel(text, detokenize.model);
  if (error) return Routed::Error(*error);
  Expected<std::string> prompt = text.Detokenize(detokenize.tokens);
  if (!prompt.ok()) return Routed::Error(FromStatus(prompt.status(), "tokens"));
  return Routed::Ok(Dump(json{{"prompt", *prompt}}));
}

net::awaitable<bool> Session::Handle(Request& request) {
  const bool keep_alive = request.keep_alive();
  const unsigned version = request.version();
  // A request must never take the process down: an exception (memory exhausted, a bug) fails
  // this request alone, with a 500 while nothing has been written, else by closing the
  // connection.
  Routed routed;
  try {
    routed = Route(request);
  } catch (const std::exception& e) {
    routed = Routed::Error(ApiError{500, std::string("The server failed: ") + e.what(),
                                    "server_error", "", "internal_error"});
  }
  if (routed.job) {
    bool go_on = false;
    try {
      go_on = co_await Generate(std::move(*routed.job), version, keep_alive);
    } catch (const std::exception&) {
      server_.metrics.CountRequest(endpoint_, 500);
      go_on = false;
    }
    co_return go_on;
  }
  if (routed.encoder_job) {
    co_return co_await Encode(std::move(*routed.encoder_job), version, keep_alive);
  }
  co_await WriteResponse(routed.status, std::move(routed.body), routed.content_type, keep_alive,
                         version);
  co_return keep_alive;
}

net::awaitable<bool> Session::Encode(EncoderJob job, unsigned version, bool keep_alive) {
  // The batcher's thread hands the results to this session's strand, where the coroutine
  // checks for them before each wait: no wake-up is lost.
  struct Waiter {
    explicit Waiter(net::any_io_executor executor)
        : wake(executor, net::steady_timer::time_point::max()) {}
    net::steady_timer wake;
    std::optional<Expected<EncoderResults>> results;
  };
  auto waiter = std::make_shared<Waiter>(socket_.get_executor());
  server_.batcher->Submit(std::move(job.sequences), [waiter](Expected<EncoderResults> results) {
    net::post(waiter->wake.get_executor(), [waiter, results = std::move(results)]() mutable {
      waiter->results = std::move(results);
      waiter->wake.cancel();
    });
  });
  while (!waiter->results) {
    error_code ec;
    co_await waiter->wake.async_wait(net::redirect_error(net::use_awaitable, ec));
  }
  EncoderAnswer answer;
  if (!waiter->results->ok()) {
    answer.error = FromStatus(waiter->results->status());
  } else {
    try {
      answer = job.answer(std::move(*waiter->results).value());
    } catch (const std::exception& e) {
      answer.error = ApiError{500, std::string("The server failed: ") + e.what(), "server_error",
                              "", "internal_error"};
    }
  }
  if (answer.error) {
    co_await WriteError(*answer.error, keep_alive, version, endpoint_);
  } else {
    co_await WriteResponse(http::status::ok, Dump(answer.body), kJsonType, keep_alive, version);
  }
  co_return keep_alive;
}

net::awaitable<void> Session::Run() {
  for (;;) {
    http::request_parser<http::string_body> parser;
    parser.header_limit(64 * 1024);
    parser.body_limit(static_cast<uint64_t>(server_.options.max_body_bytes));
    error_code ec;
    timed_out_ = false;
    Arm(server_.options.read_timeout_s);
    co_await http::async_read(socket_, buffer_, parser,
                              net::redirect_error(net::use_awaitable, ec));
    Disarm();
    endpoint_ = "other";
    if (ec == http::error::end_of_stream || ec == net::error::eof ||
        ec == net::error::connection_reset) {
      break;
    }
    if (timed_out_) {
      // A client that started a request and did not finish it in time hears why.
      if (parser.got_some()) {
        ApiError error = TimeoutError();
        co_await WriteError(error, /*keep_alive=*/false, 11, endpoint_);
      }
      break;
    }
    if (ec == http::error::partial_message) {
      // The client closed the connection half-way through its request: no one to answer, and
      // no malformed request either.
      server_.metrics.CountRequest(endpoint_, kClientClosed);
      break;
    }
    if (ec == http::error::body_limit) {
      ApiError error = TooLargeError(server_.options.max_body_bytes);
      co_await WriteError(error, /*keep_alive=*/false, 11, endpoint_);
      break;
    }
    if (ec == http::error::buffer_overflow) {
      // A line of the request (a chunk's header and its extensions) longer than the buffer.
      ApiError error =
          MalformedError("a line longer than " + std::to_string(kMaxReadBuffer) + " bytes");
      co_await WriteError(error, /*keep_alive=*/false, 11, endpoint_);
      break;
    }
    if (ec == http::error::header_limit) {
      ApiError error = HeaderTooLargeError();
      co_await WriteError(error, /*keep_alive=*/false, 11, endpoint_);
      break;
    }
    if (ec) {
      if (ec != net::error::operation_aborted && socket_.is_open()) {
        ApiError error = MalformedError(ec.message());
        co_await WriteError(error, /*keep_alive=*/false, 11, endpoint_);
      }
      break;
    }
    Request request = parser.release();
    bool keep_alive = co_await Handle(request);
    if (!keep_alive || !socket_.is_open() || timed_out_) break;
  }
  error_code ignored;
  socket_.shutdown(tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
  Disarm();
}

// The session lives as long as its coroutine: the frame holds `session`.
net::awaitable<void> RunSession(std::shared_ptr<Session> session) { co_await session->Run(); }

}  // namespace

net::awaitable<void> HttpServer::Impl::Accept() {
  for (;;) {
    error_code ec;
    tcp::socket socket = co_await acceptor.async_accept(
        net::make_strand(io), net::redirect_error(net::use_awaitable, ec));
    if (ec) {
      if (!acceptor.is_open()) co_return;
      // Out of descriptors and the like: wait a little rather than spin.
      net::steady_timer pause(io, std::chrono::milliseconds(50));
      co_await pause.async_wait(net::redirect_error(net::use_awaitable, ec));
      continue;
    }
    socket.set_option(tcp::no_delay(true), ec);
    auto session = std::make_shared<Session>(*this, std::move(socket));
    net::co_spawn(session->socket_executor(), RunSession(session), net::detached);
  }
}

HttpServer::HttpServer(const TextModel& text, EngineLoop& loop, Metrics& metrics,
                       ServerOptions options)
    : impl_(std::make_unique<Impl>(&text, &loop, nullptr, metrics, std::move(options))) {}

HttpServer::HttpServer(EncoderModel& encoder, Metrics& metrics, ServerOptions options)
    : impl_(std::make_unique<Impl>(nullptr, nullptr, &encoder, metrics, std::move(options))) {}

HttpServer::~HttpServer() {
  Stop();
  Wait();
}

Status HttpServer::Start() {
  GZ_RETURN_IF_ERROR(impl_->options.Check());
  error_code ec;
  net::ip::address address = net::ip::make_address(impl_->options.host, ec);
  if (ec) return InvalidArgument("--host '" + impl_->options.host + "' is not an IP address");
  tcp::endpoint endpoint(address, static_cast<uint16_t>(impl_->options.port));
  tcp::acceptor& acceptor = impl_->acceptor;
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) {
    return InvalidArgument("cannot listen on " + impl_->options.host + ":" +
                           std::to_string(impl_->options.port) + ": " + ec.message());
  }
  impl_->signals.async_wait([this](error_code ec, int) {
    if (!ec) Stop();
  });
  net::co_spawn(impl_->io, impl_->Accept(), net::detached);
  if (impl_->batcher) impl_->batcher->Start();
  for (int i = 0; i < impl_->options.threads; ++i) {
    impl_->threads.emplace_back([this] { impl_->io.run(); });
  }
  return Status::Ok();
}

int HttpServer::port() const {
  error_code ec;
  return impl_->acceptor.local_endpoint(ec).port();
}

void HttpServer::Wait() {
  for (std::thread& t : impl_->threads) {
    if (t.joinable()) t.join();
  }
  if (impl_->stopped && impl_->batcher) impl_->batcher->Stop();
}

void HttpServer::Stop() {
  if (impl_->stopped.exchange(true)) return;
  net::post(impl_->io, [this] {
    error_code ignored;
    impl_->acceptor.close(ignored);
    impl_->signals.cancel(ignored);
  });
  impl_->io.stop();
}

}  // namespace gizllm::server
