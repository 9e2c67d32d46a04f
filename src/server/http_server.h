// The OpenAI-compatible HTTP server: Boost.Beast on a few threads (an io_context; each connection
// a coroutine on its own strand), so that a thousand open streams need no thousand threads.
// Requests go to the EngineLoop; their progress streams back as server-sent events.
//
// Endpoints: POST /v1/chat/completions, POST /v1/completions, GET /v1/models, POST /tokenize,
// POST /detokenize, GET /health, GET /metrics; with an encoder (the embed and rerank tasks,
// server/embedding_request.h) POST /v1/embeddings, POST /v1/rerank (also /rerank) and
// POST /v1/score (also /score) instead of the generation routes. A route of another task than
// the server's answers 400 naming the server's task.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"
#include "server/encoder_model.h"
#include "server/engine_loop.h"
#include "server/generator.h"
#include "server/media.h"
#include "server/metrics.h"

namespace gizllm::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                   // 0: any free port (port() tells which)
  int threads = 2;                   // threads that run the HTTP side
  std::string api_key;               // empty: no key needed
  int64_t max_body_bytes = 8 << 20;  // larger bodies get 413
  double read_timeout_s = 30;        // a request must arrive within; idle connections close
  double write_timeout_s = 60;       // a client must take each piece of a response within
  double max_generation_s = 600;     // a generation running longer ends, finish_reason "length"
  // The embed and rerank tasks: most tokens of one encoder batch, which gathers the sequences
  // of every waiting request (server/encoder_batcher.h).
  int64_t batch_tokens = 16384;
  MediaOptions media;                // chats' pictures and videos: local files, limits

  Status Check() const;
};

class HttpServer {
 public:
  // `text`, `loop` and `metrics` must outlive the server.
  HttpServer(const TextModel& text, EngineLoop& loop, Metrics& metrics, ServerOptions options);
  // The embed or rerank task (encoder.task()) over an encoder, which must outlive the server.
  HttpServer(EncoderModel& encoder, Metrics& metrics, ServerOptions options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds, listens and starts the threads.
  Status Start();
  // The port it listens on (after Start).
  int port() const;
  // Blocks until Stop(), SIGINT or SIGTERM; the threads have ended when it returns.
  void Wait();
  void Stop();

  struct Impl;  // defined in http_server.cc

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace gizllm::server
