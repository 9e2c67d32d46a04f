// A request that ends in an engine error (non-finite logits) through the real EngineGenerator over
// the engine's fake runner: the loop hands that request's callback the error, the requests beside
// it finish, and the HTTP layer answers it with a 500 (an error event when streaming).
#include <gtest/gtest.h>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <condition_variable>
#include <map>
#include <mutex>

#include "../engine/fake_runner.h"
#include "server/engine_loop.h"
#include "server/fake_generator.h"
#include "server/http_server.h"
#include "server/real_generator.h"

namespace gizllm::server {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using nlohmann::json;

constexpr int32_t kPoison = '~';  // a wanted row reading it gets a NaN logit

class EngineErrorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    runner_.poison_token = kPoison;
    EngineOptions options;
    options.slots = 4;
    options.context = 256;
    options.rows = 64;
    options.kv_budget_bytes = 64 * runner_.PageBytes();
    auto engine = Engine::Create(&runner_, options);
    ASSERT_TRUE(engine.ok()) << engine.status().message();
    generator_ = std::make_unique<EngineGenerator>(std::move(*engine), Tokenizer());
    loop_ = std::make_unique<EngineLoop>(*generator_, metrics_, /*max_pending=*/16);
  }
  void TearDown() override {
    if (server_) server_->Stop();
    loop_->Stop();
  }

  // Every call of one request's callback, until the status is not ok or the request ends.
  struct Calls {
    std::vector<GenerateProgress> progress;
    Status status;
    bool ended = false;
  };
  ProgressFn Record(int key) {
    return [this, key](const GenerateProgress& p, const Status& s) {
      std::lock_guard lock(mutex_);
      Calls& c = calls_[key];
      c.progress.push_back(p);
      if (!s.ok()) c.status = s;
      c.ended = c.ended || !s.ok() || !p.end.empty();
      done_.notify_all();
    };
  }

  FakeRunner runner_{/*vocab=*/257};
  Metrics metrics_;
  std::unique_ptr<EngineGenerator> generator_;
  std::unique_ptr<EngineLoop> loop_;
  std::unique_ptr<FakeTextModel> text_;
  std::unique_ptr<HttpServer> server_;
  std::mutex mutex_;
  std::condition_variable done_;
  std::map<int, Calls> calls_;
};

TEST_F(EngineErrorTest, LoopFailsOnlyTheRequestWithNonFiniteLogits) {
  // Queued before the loop starts, so that the three share their steps.
  for (int key = 0; key < 3; ++key) {
    GenerateRequest r;
    r.prompt = key == 1 ? std::vector<int32_t>{'a', 'b', kPoison} : std::vector<int32_t>{'a', 'b'};
    r.prompt.push_back('c' + key);
    if (key == 1) std::swap(r.prompt[2], r.prompt[3]);  // the poisoned token last
    r.limit = 6;
    r.sampling.temperature = 0.0f;
    r.ignore_eos = true;
    ASSERT_TRUE(loop_->Submit(r, Record(key)).ok());
  }
  loop_->Start();
  std::unique_lock lock(mutex_);
  ASSERT_TRUE(done_.wait_for(lock, std::chrono::seconds(30), [&] {
    return calls_[0].ended && calls_[1].ended && calls_[2].ended;
  }));
  EXPECT_EQ(calls_[1].status.code(), StatusCode::kInternal);
  EXPECT_NE(calls_[1].status.message().find("NaN or infinity"), std::string::npos)
      << calls_[1].status.message();
  EXPECT_EQ(calls_[1].progress.back().end, "error");
  for (int key : {0, 2}) {
    EXPECT_TRUE(calls_[key].status.ok()) << calls_[key].status.message();
    EXPECT_EQ(calls_[key].progress.back().end, "length");
    size_t tokens = 0;
    for (const GenerateProgress& p : calls_[key].progress) tokens += p.tokens.size();
    EXPECT_EQ(tokens, 6u);
  }
}

TEST_F(EngineErrorTest, HttpAnswersWithAServerError) {
  text_ = std::make_unique<FakeTextModel>(/*context=*/256);
  ServerOptions options;
  options.port = 0;
  server_ = std::make_unique<HttpServer>(*text_, *loop_, metrics_, options);
  loop_->Start();
  ASSERT_TRUE(server_->Start().ok());
  net::io_context io;
  auto post = [&](const json& body) {
    tcp::socket socket(io);
    socket.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), server_->port()));
    http::request<http::string_body> req{http::verb::post, "/v1/completions", 11};
    req.set(http::field::host, "localhost");
    req.set(http::field::content_type, "application/json");
    req.body() = body.dump();
    req.prepare_payload();
    http::write(socket, req);
    beast::flat_buffer buffer;
    http::response<http::string_body> res;
    beast::error_code ec;
    http::read(socket, buffer, res, ec);
    return std::pair{static_cast<int>(res.result_int()), res.body()};
  };
  json body = {{"model", "fake"}, {"prompt", "ab~"}, {"max_tokens", 4}, {"temperature", 0}};
  auto [status, text] = post(body);
  EXPECT_EQ(status, 500) << text;
  json error = json::parse(text, nullptr, false);
  ASSERT_TRUE(error.contains("error")) << text;
  EXPECT_NE(error["error"]["message"].get<std::string>().find("NaN or infinity"), std::string::npos)
      << text;
  body["stream"] = true;
  std::tie(status, text) = post(body);
  EXPECT_NE(text.find("\"error\""), std::string::npos) << text;
  EXPECT_NE(text.find("NaN or infinity"), std::string::npos) << text;
  EXPECT_NE(text.find("data: [DONE]"), std::string::npos) << text;
  // A clean prompt still works.
  body = {{"model", "fake"}, {"prompt", "abc"}, {"max_tokens", 4}, {"temperature", 0}};
  std::tie(status, text) = post(body);
  EXPECT_EQ(status, 200) << text;
}

}  // namespace
}  // namespace gizllm::server
