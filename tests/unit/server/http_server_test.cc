// The server end to end on loopback with the scripted fake model.
#include "server/http_server.h"

#include <gtest/gtest.h>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <thread>

#include "server/fake_generator.h"

namespace gizllm::server {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using nlohmann::json;

struct Reply {
  int status = 0;
  std::string body;
  // The body as JSON; an object with "unparsed" when it is not JSON.
  json Json() const {
    json j = json::parse(body, nullptr, false);
    if (j.is_discarded()) return {{"unparsed", body}, {"status", status}};
    return j;
  }
};

class ServerTest : public ::testing::Test {
 protected:
  void Start(ServerOptions options = {}, int32_t context = 4096, int64_t max_pending = 64,
             std::chrono::microseconds step_time = std::chrono::microseconds(0),
             int32_t tokens_per_step = 1, ToolCallSyntax syntax = ToolCallSyntax::kJson) {
    text_ = std::make_unique<FakeTextModel>(context, syntax);
    generator_ = std::make_unique<FakeGenerator>(/*slots=*/4, step_time);
    generator_->tokens_per_step = tokens_per_step;
    loop_ = std::make_unique<EngineLoop>(*generator_, metrics_, max_pending);
    options.port = 0;
    server_ = std::make_unique<HttpServer>(*text_, *loop_, metrics_, options);
    loop_->Start();
    ASSERT_TRUE(server_->Start().ok());
  }
  void TearDown() override {
    if (server_) server_->Stop();
    server_.reset();
    if (loop_) loop_->Stop();
  }

  tcp::socket Connect() {
    tcp::socket socket(io_);
    socket.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), server_->port()));
    return socket;
  }

  Reply Send(http::verb method, const std::string& target, const std::string& body,
             const std::string& key = "") {
    tcp::socket socket = Connect();
    http::request<http::string_body> req{method, target, 11};
    req.set(http::field::host, "localhost");
    req.set(http::field::content_type, "application/json");
    if (!key.empty()) req.set(http::field::authorization, "Bearer " + key);
    req.body() = body;
    req.prepare_payload();
    http::write(socket, req);
    beast::flat_buffer buffer;
    http::response<http::string_body> res;
    beast::error_code ec;
    http::read(socket, buffer, res, ec);
    return {static_cast<int>(res.result_int()), res.body()};
  }
  Reply Post(const std::string& target, const json& body, const std::string& key = "") {
    return Send(http::verb::post, target, body.dump(), key);
  }

  // The JSON of each "data:" event of a stream, without [DONE].
  static std::vector<json> Events(const std::string& body, bool* done) {
    std::vector<json> events;
    *done = false;
    size_t at = 0;
    while ((at = body.find("data: ", at)) != std::string::npos) {
      size_t end = body.find("\n\n", at);
      std::string data = body.substr(at + 6, end - at - 6);
      if (data == "[DONE]") {
        *done = true;
      } else {
        events.push_back(json::parse(data));
      }
      at = end;
    }
    return events;
  }

  static json UserChat(const std::string& content) {
    return {{"model", "fake"},
            {"messages", {{{"role", "user"}, {"content", content}}}},
            {"temperature", 0}};
  }

  net::io_context io_;
  Metrics metrics_;
  std::unique_ptr<FakeTextModel> text_;
  std::unique_ptr<FakeGenerator> generator_;
  std::unique_ptr<EngineLoop> loop_;
  std::unique_ptr<HttpServer> server_;
};

TEST_F(ServerTest, HealthModelsAndUnknownPaths) {
  Start();
  EXPECT_EQ(Send(http::verb::get, "/health", "").status, 200);
  Reply models = Send(http::verb::get, "/v1/models", "");
  ASSERT_EQ(models.status, 200);
  EXPECT_EQ(models.Json()["data"][0]["id"], "fake");
  Reply missing = Send(http::verb::get, "/v1/nothing", "");
  EXPECT_EQ(missing.status, 404);
  EXPECT_EQ(missing.Json()["error"]["code"], "not_found");
  EXPECT_EQ(Send(http::verb::get, "/v1/chat/completions", "").status, 405);
  EXPECT_EQ(Send(http::verb::get, "/v1/models/other", "").status, 404);
}

TEST_F(ServerTest, ChatAnswersAndCountsUsage) {
  Start();
  Reply r = Post("/v1/chat/completions", UserChat("hi there"));
  ASSERT_EQ(r.status, 200) << r.body;
  json j = r.Json();
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  std::string prompt = "<|user|>hi there\n<|assistant|>";
  EXPECT_EQ(j["choices"][0]["message"]["content"], FakeGenerator::Answer(prompt));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["usage"]["prompt_tokens"], prompt.size());
  EXPECT_EQ(j["usage"]["completion_tokens"], FakeGenerator::Answer(prompt).size());
}

// Steps that bring several tokens (an engine's kept drafts): a stop string or the limit inside
// them ends the answer where one token a step would, with the same text, usage and logprobs.
TEST_F(ServerTest, StopInsideAStepsTokensAsOneAStep) {
  std::vector<json> replies[2];
  for (int32_t tokens_per_step : {1, 4}) {
    Start({}, 4096, 64, std::chrono::microseconds(0), tokens_per_step);
    std::vector<json>& got = replies[tokens_per_step == 1 ? 0 : 1];
    json body = UserChat("abc");
    body["stop"] = "said";
    got.push_back(Post("/v1/chat/completions", body).Json());
    body = UserChat("abc");
    body["max_tokens"] = 3;
    got.push_back(Post("/v1/chat/completions", body).Json());
    got.push_back(Post("/v1/completions", {{"model", "fake"},
                                           {"prompt", "abc"},
                                           {"stop", "said"},
                                           {"max_tokens", 40},
                                           {"temperature", 0},
                                           {"logprobs", 1}})
                      .Json());
    TearDown();
  }
  EXPECT_EQ(replies[1][0]["choices"][0]["message"]["content"], "Hello! You ");
  EXPECT_EQ(replies[1][0]["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(replies[1][1]["choices"][0]["message"]["content"], "Hel");
  EXPECT_EQ(replies[1][2]["choices"][0]["text"], "Hello! You ");
  for (size_t i = 0; i < replies[0].size(); ++i) {
    for (const char* part : {"choices", "usage"}) {
      EXPECT_EQ(replies[1][i][part], replies[0][i][part]) << "reply " << i << " " << part;
    }
  }
}

// A model whose template writes tool calls in the XML form: a forced call's grammar is the XML
// one (the fake model's answer passes it byte by byte), and the answer comes back as
// tool_calls, typed by the parameters' schema, whole and streamed. A parameter the tool does not
// list is refused by the grammar: the answer stops there and no call comes back.
TEST_F(ServerTest, ForcedXmlToolCallsComeBackAsToolCalls) {
  Start({}, 4096, 64, std::chrono::microseconds(0), 1, ToolCallSyntax::kXml);
  json body = UserChat("weather?");
  body["tools"] = {
      {{"type", "function"},
       {"function",
        {{"name", "get_weather"},
         {"parameters",
          {{"type", "object"},
           {"properties", {{"city", {{"type", "string"}}}, {"days", {{"type", "integer"}}}}},
           {"required", {"city"}}}}}}},
      {{"type", "function"}, {"function", {{"name", "now"}}}}};
  for (json choice :
       {json("required"), json{{"type", "function"}, {"function", {{"name", "get_weather"}}}}}) {
    SCOPED_TRACE(choice.dump());
    body["tool_choice"] = choice;
    body["stream"] = false;
    json j = Post("/v1/chat/completions", body).Json();
    ASSERT_TRUE(j["choices"][0]["message"].contains("tool_calls")) << j.dump();
    EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls");
    EXPECT_EQ(j["choices"][0]["message"]["content"], nullptr);
    const json& call = j["choices"][0]["message"]["tool_calls"][0];
    EXPECT_EQ(call["function"]["name"], "get_weather");
    EXPECT_EQ(call["function"]["arguments"], "{\"city\":\"Paris\",\"days\":3}");

    body["stream"] = true;
    Reply r = Post("/v1/chat/completions", body);
    ASSERT_EQ(r.status, 200);
    bool done = false;
    std::vector<json> events = Events(r.body, &done);
    EXPECT_TRUE(done);
    json calls = json::array();
    std::string content;
    for (const json& e : events) {
      if (e["choices"].empty()) continue;
      const json& delta = e["choices"][0]["delta"];
      content += delta.value("content", "");
      if (delta.contains("tool_calls")) {
        for (const json& c : delta["tool_calls"]) calls.push_back(c);
      }
    }
    EXPECT_EQ(content, "");
    ASSERT_EQ(calls.size(), 1u) << r.body;
    EXPECT_EQ(calls[0]["function"]["name"], "get_weather");
    EXPECT_EQ(calls[0]["function"]["arguments"], "{\"city\":\"Paris\",\"days\":3}");
    EXPECT_EQ(events[events.size() - 1]["choices"][0]["finish_reason"], "tool_calls");
  }
  // Unforced, the XML call the model writes is read too.
  body["tool_choice"] = "auto";
  body["stream"] = false;
  body["messages"][0]["content"] = "CALL please";
  json j = Post("/v1/chat/completions", body).Json();
  ASSERT_TRUE(j["choices"][0]["message"].contains("tool_calls")) << j.dump();
  EXPECT_EQ(j["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"],
            "{\"city\":\"Paris\",\"days\":3}");
  // "days" is no parameter of this tool: after city only "</function>" may come, so the grammar
  // stops the answer at the 'p' of "<parameter=days>".
  body["messages"][0]["content"] = "weather?";
  body["tool_choice"] = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  body["tools"][0]["function"]["parameters"]["properties"].erase("days");
  body["tools"][0]["function"]["parameters"]["additionalProperties"] = false;
  j = Post("/v1/chat/completions", body).Json();
  EXPECT_FALSE(j["choices"][0]["message"].contains("tool_calls")) << j.dump();
  EXPECT_EQ(j["choices"][0]["message"]["content"],
            std::string("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
                        "</parameter>\n<"))
      << j.dump();
}

TEST_F(ServerTest, StreamMatchesTheWholeAnswer) {
  Start();
  json body = UserChat("stream me");
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  Reply r = Post("/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200);
  bool done = false;
  std::vector<json> events = Events(r.body, &done);
  EXPECT_TRUE(done);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events[0]["choices"][0]["delta"]["role"], "assistant");
  std::string text;
  for (const json& e : events) {
    if (e["choices"].empty()) continue;
    EXPECT_EQ(e["object"], "chat.completion.chunk");
    text += e["choices"][0]["delta"].value("content", "");
  }
  EXPECT_EQ(text, FakeGenerator::Answer("<|user|>stream me\n<|assistant|>"));
  EXPECT_EQ(events[events.size() - 2]["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(events.back()["choices"].empty());
  EXPECT_EQ(events.back()["usage"]["completion_tokens"], text.size());
}

TEST_F(ServerTest, ToolCallsReasoningStopsAndLimits) {
  Start();
  json body = UserChat("CALL please");
  body["tools"] = {{{"type", "function"},
                    {"function", {{"name", "get_weather"}, {"parameters", json::object()}}}}};
  json j = Post("/v1/chat/completions", body).Json();
  EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(j["choices"][0]["message"]["content"], nullptr);
  EXPECT_EQ(j["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(j["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"],
            "{\"city\":\"Paris\"}");

  // A named tool_choice forces the call's start.
  body["messages"][0]["content"] = "weather?";
  body["tool_choice"] = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  j = Post("/v1/chat/completions", body).Json();
  ASSERT_TRUE(j["choices"][0]["message"].contains("tool_calls")) << j.dump();
  EXPECT_EQ(j["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"],
            "{\"city\":\"Paris\"}");

  j = Post("/v1/chat/completions", UserChat("THINK")).Json();
  EXPECT_EQ(j["choices"][0]["message"]["reasoning_content"], "Let me see.");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "It is 42.");

  body = UserChat("abc");
  body["stop"] = "said";
  j = Post("/v1/chat/completions", body).Json();
  EXPECT_EQ(j["choices"][0]["message"]["content"], "Hello! You ");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");

  body = UserChat("abc");
  body["max_tokens"] = 3;
  j = Post("/v1/chat/completions", body).Json();
  EXPECT_EQ(j["choices"][0]["message"]["content"], "Hel");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
}

TEST_F(ServerTest, CompletionsWithLogprobsAndEcho) {
  Start();
  json j = Post("/v1/completions", {{"model", "fake"},
                                    {"prompt", "xyz"},
                                    {"max_tokens", 4},
                                    {"temperature", 0},
                                    {"logprobs", 2},
                                    {"echo", true}})
               .Json();
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["text"], "xyzHell");
  EXPECT_EQ(j["choices"][0]["logprobs"]["tokens"], json({"H", "e", "l", "l"}));
  EXPECT_EQ(j["choices"][0]["logprobs"]["text_offset"], json({3, 4, 5, 6}));
  EXPECT_EQ(j["choices"][0]["logprobs"]["top_logprobs"][0].size(), 2u);
}

TEST_F(ServerTest, SeededSamplingRepeats) {
  Start();
  json body = UserChat("x");
  body["temperature"] = 1.0;
  body["seed"] = 42;
  std::string a = Post("/v1/chat/completions", body).Json()["choices"][0]["message"]["content"];
  std::string b = Post("/v1/chat/completions", body).Json()["choices"][0]["message"]["content"];
  EXPECT_EQ(a, b);
  body["seed"] = 43;
  std::string c = Post("/v1/chat/completions", body).Json()["choices"][0]["message"]["content"];
  EXPECT_NE(a, c);
}

TEST_F(ServerTest, NextTurnReadsOnlyTheNewPart) {
  Start();
  json first = UserChat("turn one");
  json j = Post("/v1/chat/completions", first).Json();
  std::string answer = j["choices"][0]["message"]["content"];
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  json second = first;
  second["messages"].push_back({{"role", "assistant"}, {"content", answer}});
  second["messages"].push_back({{"role", "user"}, {"content", "turn two"}});
  j = Post("/v1/chat/completions", second).Json();
  std::string held = "<|user|>turn one\n<|assistant|>" + answer;
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], held.size());
}

TEST_F(ServerTest, AModelWithoutATowerRefusesPictures) {
  Start();
  json body = UserChat("x");
  body["messages"][0]["content"] = {
      {{"type", "text"}, {"text", "what is it?"}},
      {{"type", "image_url"}, {"image_url", {{"url", "data:image/png;base64,AAAA"}}}}};
  Reply r = Post("/v1/chat/completions", body);
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.Json()["error"]["param"], "messages[0].content[1].image_url");
  EXPECT_NE(r.Json()["error"]["message"].get<std::string>().find("reads no pictures"),
            std::string::npos)
      << r.body;
  body["messages"][0]["content"][1] = {{"type", "video_url"}, {"video_url", {{"url", "clip"}}}};
  r = Post("/v1/chat/completions", body);
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.Json()["error"]["param"], "messages[0].content[1].video_url");
  EXPECT_EQ(Post("/v1/chat/completions", UserChat("x")).status, 200);
}

TEST_F(ServerTest, ErrorsKeepTheServerUp) {
  ServerOptions options;
  options.api_key = "sekret";
  options.max_body_bytes = 4096;
  Start(options, /*context=*/64);
  Reply r = Post("/v1/chat/completions", UserChat("x"));
  EXPECT_EQ(r.status, 401);
  EXPECT_EQ(r.Json()["error"]["code"], "invalid_api_key");
  EXPECT_EQ(Post("/v1/chat/completions", UserChat("x"), "sekreT").status, 401);
  EXPECT_EQ(Post("/v1/chat/completions", UserChat("x"), "sekret-longer").status, 401);
  EXPECT_EQ(Send(http::verb::post, "/v1/chat/completions", "{oops", "sekret").status, 400);
  EXPECT_EQ(Send(http::verb::post, "/v1/chat/completions", "\"\xff\"", "sekret").status, 400);
  r = Post("/v1/chat/completions", UserChat(std::string(100, 'a')), "sekret");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.Json()["error"]["code"], "context_length_exceeded");
  json big = UserChat("x");
  big["max_tokens"] = 60;
  EXPECT_EQ(Post("/v1/chat/completions", big, "sekret").Json()["error"]["param"], "max_tokens");
  r = Post("/v1/chat/completions", UserChat(std::string(5000, 'a')), "sekret");
  EXPECT_EQ(r.status, 413);
  EXPECT_EQ(r.Json()["error"]["code"], "request_too_large");
  json other = UserChat("x");
  other["model"] = "gpt-9";
  EXPECT_EQ(Post("/v1/chat/completions", other, "sekret").status, 404);
  EXPECT_EQ(Send(http::verb::get, "/health", "").status, 200);  // no key needed
  r = Post("/v1/chat/completions", UserChat("x"), "sekret");
  EXPECT_EQ(r.status, 200) << r.body;
  std::string metrics = Send(http::verb::get, "/metrics", "").body;
  EXPECT_NE(metrics.find("status=\"401\"} 3"), std::string::npos) << metrics;
}

TEST_F(ServerTest, FullQueueIsA503AndDisconnectCancels) {
  // Steps of 1 ms: the request below runs for seconds unless cancelled.
  Start({}, 4096, /*max_pending=*/1, std::chrono::milliseconds(1));
  // A request that runs until cancelled, streamed on a socket of our own.
  tcp::socket socket = Connect();
  json body = UserChat("FOREVER");
  body["stream"] = true;
  http::request<http::string_body> req{http::verb::post, "/v1/chat/completions", 11};
  req.set(http::field::host, "localhost");
  req.body() = body.dump();
  req.prepare_payload();
  http::write(socket, req);
  char bytes[256];
  size_t got = socket.read_some(net::buffer(bytes));
  EXPECT_GT(got, 0u);
  Reply full = Post("/v1/chat/completions", UserChat("x"));
  EXPECT_EQ(full.status, 503);
  EXPECT_EQ(full.Json()["error"]["type"], "server_error");
  socket.close();
  // The request ends once the server sees the client gone. Its first bytes may come before the
  // loop gives it to the generator, so it can still be queued here: wait for both to empty.
  auto unfinished = [&] {
    LoopStats stats = loop_->Stats();
    return stats.queued + stats.active;
  };
  auto start = std::chrono::steady_clock::now();
  while (unfinished() > 0 && std::chrono::steady_clock::now() - start < std::chrono::seconds(5)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(unfinished(), 0);
  EXPECT_EQ(Post("/v1/chat/completions", UserChat("x")).status, 200);
}

TEST_F(ServerTest, GenerationTimeIsBounded) {
  // Steps of 1 ms and a limit of 0.2 s: "FOREVER" would run for seconds (4,000 tokens).
  ServerOptions options;
  options.max_generation_s = 0.2;
  Start(options, 4096, /*max_pending=*/4, std::chrono::milliseconds(1));
  for (bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "streamed" : "whole");
    json body = UserChat("FOREVER");
    body["stream"] = stream;
    auto start = std::chrono::steady_clock::now();
    Reply r = Post("/v1/chat/completions", body);
    double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_LT(seconds, 2.0);
    std::string finish;
    if (stream) {
      bool done = false;
      std::vector<json> events = Events(r.body, &done);
      EXPECT_TRUE(done);
      ASSERT_FALSE(events.empty());
      finish = events.back()["choices"][0]["finish_reason"];
    } else {
      finish = r.Json()["choices"][0]["finish_reason"];
      EXPECT_FALSE(r.Json()["choices"][0]["message"]["content"].get<std::string>().empty());
    }
    EXPECT_EQ(finish, "length");
  }
  // The engine stopped them: nothing is left running.
  auto start = std::chrono::steady_clock::now();
  while (loop_->Stats().active > 0 &&
         std::chrono::steady_clock::now() - start < std::chrono::seconds(5)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(loop_->Stats().active, 0);
}

TEST_F(ServerTest, SlowClientTimesOut) {
  ServerOptions options;
  options.read_timeout_s = 0.3;
  Start(options);
  tcp::socket socket = Connect();
  net::write(socket, net::buffer(std::string("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")));
  beast::flat_buffer buffer;
  http::response<http::string_body> res;
  beast::error_code ec;
  http::read(socket, buffer, res, ec);
  EXPECT_EQ(res.result_int(), 408u);
  EXPECT_EQ(Send(http::verb::get, "/health", "").status, 200);
}

// A step that fails is a 500 for the requests it held (an error event when streamed); the
// server goes on serving.
TEST_F(ServerTest, FailedStepIsA500AndTheServerGoesOn) {
  Start();
  Reply r = Post("/v1/chat/completions", UserChat("CRASH"));
  EXPECT_EQ(r.status, 500);
  EXPECT_EQ(r.Json()["error"]["type"], "server_error") << r.body;
  EXPECT_EQ(r.Json()["error"]["code"], "internal_error") << r.body;

  json body = UserChat("CRASH");
  body["stream"] = true;
  r = Post("/v1/chat/completions", body);
  EXPECT_EQ(r.status, 200);  // the stream had started
  bool done = false;
  std::vector<json> events = Events(r.body, &done);
  ASSERT_FALSE(events.empty()) << r.body;
  EXPECT_EQ(events.back()["error"]["type"], "server_error") << r.body;
  EXPECT_TRUE(done);

  r = Post("/v1/chat/completions", UserChat("abc"));
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.Json()["choices"][0]["message"]["content"],
            FakeGenerator::Answer("<|user|>abc\n<|assistant|>"));
  std::string metrics = Send(http::verb::get, "/metrics", "").body;
  EXPECT_NE(metrics.find("status=\"500\"} 2"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("reason=\"error\"} 2"), std::string::npos) << metrics;
}

TEST_F(ServerTest, TokenizeAndDetokenize) {
  Start();
  json j = Post("/tokenize", {{"prompt", "ab"}}).Json();
  EXPECT_EQ(j["tokens"], json({97, 98}));
  EXPECT_EQ(j["count"], 2);
  j = Post("/tokenize", {{"messages", {{{"role", "user"}, {"content", "a"}}}}}).Json();
  EXPECT_EQ(j["count"], std::string("<|user|>a\n<|assistant|>").size());
  // Without the generation prompt: the messages alone.
  j = Post("/tokenize",
           {{"messages", {{{"role", "user"}, {"content", "a"}}}}, {"add_generation_prompt", false}})
          .Json();
  EXPECT_EQ(j["count"], std::string("<|user|>a\n").size());
  j = Post("/detokenize", {{"tokens", {104, 105}}}).Json();
  EXPECT_EQ(j["prompt"], "hi");
  EXPECT_EQ(Post("/detokenize", {{"tokens", {9999}}}).status, 400);
}

}  // namespace
}  // namespace gizllm::server
