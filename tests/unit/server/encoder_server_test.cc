// The embed and rerank tasks' routes end to end on loopback, over a fake encoder whose vectors
// and scores are simple functions of the tokens: shapes, usage, base64, ranking, the wrong task,
// and hostile inputs answered 400 naming the field.
#include <gtest/gtest.h>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "server/embedding_request.h"
#include "server/http_server.h"

namespace gizllm::server {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using nlohmann::json;

// Tokens: one per byte of the text, plus 100 and 101 around it (a pair: 100 a 101 b 101, b's
// tokens type 1). An embedding is [tokens, sum of ids, 1, 0]; a pair's score its tokens of b.
// Hold() makes the next Embed or Score wait inside until Release(); every call's count of
// sequences is kept.
class FakeEncoder : public EncoderModel {
 public:
  // With prompts: "query" ("q:", the default) and "none" (""); with Matryoshka sizes: 2 and 3
  // of 4, vectors normalized again once cut.
  bool prompts = false;
  bool matryoshka = false;
  bool Normalizes() const override { return matryoshka; }
  Status CheckDimensions(int64_t dimensions) const override {
    if (dimensions == 4 || (matryoshka && (dimensions == 2 || dimensions == 3))) {
      return Status::Ok();
    }
    return EncoderModel::CheckDimensions(dimensions);
  }
  Expected<std::string> Prompt(const std::optional<std::string>& name) const override {
    if (!prompts) return EncoderModel::Prompt(name);
    if (!name || *name == "query") return std::string("q:");
    if (*name == "none") return std::string();
    return InvalidArgument("no prompt named \"" + *name + "\"");
  }
  void Hold() {
    std::lock_guard lock(mutex_);
    hold_ = true;
  }
  // Waits until a call waits inside.
  void WaitInside() {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return inside_; });
  }
  void Release() {
    std::lock_guard lock(mutex_);
    hold_ = false;
    changed_.notify_all();
  }
  std::vector<size_t> calls() {
    std::lock_guard lock(mutex_);
    return calls_;
  }
  explicit FakeEncoder(Task task) : task_(task) {}
  std::string Name() const override { return "fake-encoder"; }
  Task task() const override { return task_; }
  int32_t MaxTokens() const override { return 12; }
  int32_t Vocab() const override { return 256 + 2; }
  int64_t Dim() const override { return 4; }
  Expected<Encoding> Tokenize(std::string_view text, int64_t limit) const override {
    Encoding e;
    e.ids.push_back(100);
    for (unsigned char c : text) e.ids.push_back(c);
    e.ids.push_back(101);
    if (static_cast<int64_t>(e.ids.size()) > limit) e.ids.resize(limit);
    e.types.assign(e.ids.size(), 0);
    return e;
  }
  Expected<Encoding> TokenizePair(std::string_view a, std::string_view b) const override {
    Encoding e = *Tokenize(a, 1000);
    for (unsigned char c : b) {
      e.ids.push_back(c);
      e.types.push_back(1);
    }
    e.ids.push_back(101);
    e.types.push_back(1);
    return e;
  }
  Expected<std::vector<std::vector<float>>> Embed(std::span<const Encoding> s) override {
    Enter(s.size());
    for (const Encoding& e : s) {
      if (e.ids[0] == 255) return InvalidArgument("the fake refuses token 255 first");
    }
    std::vector<std::vector<float>> out;
    for (const Encoding& e : s) {
      float sum = 0;
      for (int32_t id : e.ids) sum += id;
      out.push_back({static_cast<float>(e.ids.size()), sum, 1.0f, 0.0f});
    }
    return out;
  }
  Expected<std::vector<float>> Score(std::span<const Encoding> pairs) override {
    Enter(pairs.size());
    std::vector<float> out;
    for (const Encoding& e : pairs) {
      float second = 0;
      for (int32_t t : e.types) second += t;
      out.push_back(second);
    }
    return out;
  }

 private:
  void Enter(size_t sequences) {
    std::unique_lock lock(mutex_);
    calls_.push_back(sequences);
    inside_ = true;
    changed_.notify_all();
    changed_.wait(lock, [&] { return !hold_; });
    inside_ = false;
  }

  Task task_;
  std::mutex mutex_;
  std::condition_variable changed_;
  bool hold_ = false;
  bool inside_ = false;
  std::vector<size_t> calls_;
};

class EncoderServerTest : public ::testing::Test {
 protected:
  void Start(Task task, int64_t batch_tokens = 16384) {
    encoder_ = std::make_unique<FakeEncoder>(task);
    ServerOptions options;
    options.port = 0;
    options.batch_tokens = batch_tokens;
    server_ = std::make_unique<HttpServer>(*encoder_, metrics_, options);
    ASSERT_TRUE(server_->Start().ok());
  }
  void TearDown() override {
    if (server_) server_->Stop();
  }
  std::pair<int, json> Send(http::verb method, const std::string& target, const std::string& body) {
    auto [status, text] = SendText(method, target, body);
    return {status, json::parse(text, nullptr, false)};
  }
  std::pair<int, std::string> SendText(http::verb method, const std::string& target,
                                       const std::string& body) {
    tcp::socket socket(io_);
    socket.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), server_->port()));
    http::request<http::string_body> req{method, target, 11};
    req.set(http::field::host, "localhost");
    req.body() = body;
    req.prepare_payload();
    http::write(socket, req);
    beast::flat_buffer buffer;
    http::response<http::string_body> res;
    beast::error_code ec;
    http::read(socket, buffer, res, ec);
    return {static_cast<int>(res.result_int()), res.body()};
  }
  // A figure of /metrics (-1 where absent).
  double Metric(const std::string& name) {
    const std::string text = SendText(http::verb::get, "/metrics", "").second;
    const std::string line = "\n" + name + " ";
    const size_t at = text.find(line);
    return at == std::string::npos ? -1 : std::stod(text.substr(at + line.size()));
  }
  // Waits (at most 10 s) until /metrics shows `requests` encoder requests waiting.
  void WaitQueued(int requests) {
    for (int i = 0; i < 1000 && Metric("gizllm_encoder_queue_length") != requests; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_EQ(Metric("gizllm_encoder_queue_length"), requests);
  }
  // The answer without its fields that change from call to call.
  static json Stable(json answer) {
    answer.erase("id");
    answer.erase("created");
    return answer;
  }
  std::pair<int, json> Post(const std::string& target, const json& body) {
    return Send(http::verb::post, target, body.dump());
  }
  // A 400 whose error names `param`.
  void ExpectBad(const std::string& target, const json& body, const std::string& param) {
    auto [status, reply] = Post(target, body);
    EXPECT_EQ(status, 400) << body.dump() << " " << reply.dump();
    EXPECT_EQ(reply["error"]["param"], param) << body.dump() << " " << reply.dump();
  }

  net::io_context io_;
  Metrics metrics_;
  std::unique_ptr<FakeEncoder> encoder_;
  std::unique_ptr<HttpServer> server_;
};

TEST_F(EncoderServerTest, EmbeddingsInEveryInputShape) {
  Start(Task::kEmbed);
  auto [status, one] = Post("/v1/embeddings", {{"input", "ab"}, {"model", "fake-encoder"}});
  ASSERT_EQ(status, 200) << one.dump();
  EXPECT_EQ(one["object"], "list");
  EXPECT_EQ(one["model"], "fake-encoder");
  ASSERT_EQ(one["data"].size(), 1u);
  EXPECT_EQ(one["data"][0]["object"], "embedding");
  EXPECT_EQ(one["data"][0]["embedding"], json({4.0, 100 + 97 + 98 + 101, 1.0, 0.0}));
  EXPECT_EQ(one["usage"]["prompt_tokens"], 4);
  EXPECT_EQ(one["usage"]["total_tokens"], 4);

  auto [s2, many] = Post("/v1/embeddings", {{"input", {"a", "abc"}}});
  ASSERT_EQ(s2, 200);
  ASSERT_EQ(many["data"].size(), 2u);
  EXPECT_EQ(many["data"][1]["index"], 1);
  EXPECT_EQ(many["data"][1]["embedding"][0], 5.0);
  EXPECT_EQ(many["usage"]["total_tokens"], 8);

  // Token arrays are read as given.
  auto [s3, ids] = Post("/v1/embeddings", {{"input", {7, 8, 9}}});
  ASSERT_EQ(s3, 200);
  EXPECT_EQ(ids["data"][0]["embedding"], json({3.0, 24.0, 1.0, 0.0}));
  auto [s4, id_lists] = Post("/v1/embeddings", {{"input", {{1}, {2, 3}}}});
  ASSERT_EQ(s4, 200);
  EXPECT_EQ(id_lists["data"].size(), 2u);

  // base64: the float32 bytes, little-endian.
  auto [s5, b64] = Post("/v1/embeddings", {{"input", {7, 8, 9}}, {"encoding_format", "base64"}});
  ASSERT_EQ(s5, 200);
  const std::string text = b64["data"][0]["embedding"];
  EXPECT_EQ(text, "AABAQAAAwEEAAIA/AAAAAA==");  // 3, 24, 1, 0

  // Longer than the model's 12 tokens: refused, or cut where asked.
  const std::string long_text(20, 'x');
  ExpectBad("/v1/embeddings", {{"input", {"ok", long_text}}}, "input[1]");
  auto [s6, cut] = Post("/v1/embeddings", {{"input", long_text}, {"truncate_prompt_tokens", -1}});
  ASSERT_EQ(s6, 200) << cut.dump();
  EXPECT_EQ(cut["data"][0]["embedding"][0], 12.0);
  EXPECT_EQ(Post("/v1/embeddings", {{"input", "ab"}, {"dimensions", 4}}).first, 200);
}

TEST_F(EncoderServerTest, HostileEmbeddingsRequestsNameTheField) {
  Start(Task::kEmbed);
  ExpectBad("/v1/embeddings", json::object(), "input");
  ExpectBad("/v1/embeddings", {{"input", 5}}, "input");
  ExpectBad("/v1/embeddings", {{"input", json::array()}}, "input");
  ExpectBad("/v1/embeddings", {{"input", ""}}, "input");
  ExpectBad("/v1/embeddings", {{"input", {"a", 3.5}}}, "input[1]");
  ExpectBad("/v1/embeddings", {{"input", {"a", ""}}}, "input[1]");
  ExpectBad("/v1/embeddings", {{"input", {1, -2}}}, "input[1]");
  ExpectBad("/v1/embeddings", {{"input", {1, 258}}}, "input[1]");
  ExpectBad("/v1/embeddings", {{"input", {{1}, json::array()}}}, "input[1]");
  ExpectBad("/v1/embeddings", {{"input", "a"}, {"encoding_format", "int8"}}, "encoding_format");
  ExpectBad("/v1/embeddings", {{"input", "a"}, {"dimensions", 2}}, "dimensions");
  ExpectBad("/v1/embeddings", {{"input", "a"}, {"truncate_prompt_tokens", 0}},
            "truncate_prompt_tokens");
  ExpectBad("/v1/embeddings", {{"input", "a"}, {"color", "red"}}, "color");
  ExpectBad("/v1/embeddings", {{"input", "a"}, {"model", 3}}, "model");
  EXPECT_EQ(Post("/v1/embeddings", {{"input", "a"}, {"model", "other"}}).first, 404);
  json too_many = json::array();
  for (size_t i = 0; i <= kMaxEncoderInputs; ++i) too_many.push_back("a");
  ExpectBad("/v1/embeddings", {{"input", too_many}}, "input");
  EXPECT_EQ(Send(http::verb::post, "/v1/embeddings", "{not json").first, 400);
}

TEST_F(EncoderServerTest, RoutesOfAnotherTaskAnswer400NamingTheTask) {
  Start(Task::kEmbed);
  for (const char* route : {"/v1/rerank", "/v1/score", "/rerank", "/v1/chat/completions",
                            "/v1/completions", "/tokenize"}) {
    auto [status, reply] = Post(route, {{"query", "q"}});
    EXPECT_EQ(status, 400) << route;
    EXPECT_EQ(reply["error"]["code"], "wrong_task") << route;
    EXPECT_NE(reply["error"]["message"].get<std::string>().find("task is embed"), std::string::npos)
        << route;
  }
  auto [status, models] = Send(http::verb::get, "/v1/models", "");
  ASSERT_EQ(status, 200);
  EXPECT_EQ(models["data"][0]["id"], "fake-encoder");
  EXPECT_EQ(models["data"][0]["task"], "embed");
  EXPECT_EQ(models["data"][0]["max_model_len"], 12);
  EXPECT_EQ(Send(http::verb::get, "/metrics", "").first, 200);
}

TEST_F(EncoderServerTest, RerankRanksAndCuts) {
  Start(Task::kRerank);
  // Scores are the documents' lengths + 1: "ccc" first, then "bb", then "a".
  auto [status, r] = Post(
      "/v1/rerank", {{"query", "q"}, {"documents", {"a", "ccc", {{"text", "bb"}}}}, {"top_n", 2}});
  ASSERT_EQ(status, 200) << r.dump();
  ASSERT_EQ(r["results"].size(), 2u);
  EXPECT_EQ(r["results"][0]["index"], 1);
  EXPECT_EQ(r["results"][0]["relevance_score"], 4.0);
  EXPECT_EQ(r["results"][0]["document"]["text"], "ccc");
  EXPECT_EQ(r["results"][1]["index"], 2);
  EXPECT_EQ(r["usage"]["total_tokens"], 5 + 7 + 6);  // every pair read, not only the top_n
  auto [s2, bare] =
      Post("/rerank", {{"query", "q"}, {"documents", {"a"}}, {"return_documents", false}});
  ASSERT_EQ(s2, 200);
  EXPECT_FALSE(bare["results"][0].contains("document"));
  ExpectBad("/v1/rerank", {{"documents", {"a"}}}, "query");
  ExpectBad("/v1/rerank", {{"query", "q"}}, "documents");
  ExpectBad("/v1/rerank", {{"query", "q"}, {"documents", json::array()}}, "documents");
  ExpectBad("/v1/rerank", {{"query", "q"}, {"documents", {"a", 1}}}, "documents[1]");
  ExpectBad("/v1/rerank", {{"query", "q"}, {"documents", {"a"}}, {"top_n", -1}}, "top_n");
  EXPECT_EQ(Post("/v1/embeddings", {{"input", "a"}}).second["error"]["code"], "wrong_task");
}

TEST_F(EncoderServerTest, ScorePairsAsVllm) {
  Start(Task::kRerank);
  auto [status, one] = Post("/v1/score", {{"text_1", "q"}, {"text_2", {"a", "bbb"}}});
  ASSERT_EQ(status, 200) << one.dump();
  EXPECT_EQ(one["object"], "list");
  ASSERT_EQ(one["data"].size(), 2u);
  EXPECT_EQ(one["data"][1]["object"], "score");
  EXPECT_EQ(one["data"][1]["index"], 1);
  EXPECT_EQ(one["data"][1]["score"], 4.0);
  auto [s2, pairs] = Post("/score", {{"text_1", {"x", "y"}}, {"text_2", {"a", "bb"}}});
  ASSERT_EQ(s2, 200);
  EXPECT_EQ(pairs["data"][0]["score"], 2.0);
  auto [s3, single] = Post("/v1/score", {{"text_1", "x"}, {"text_2", "y"}});
  ASSERT_EQ(s3, 200);
  EXPECT_EQ(single["data"].size(), 1u);
  ExpectBad("/v1/score", {{"text_1", {"x", "y"}}, {"text_2", {"a"}}}, "text_2");
  ExpectBad("/v1/score", {{"text_2", {"a"}}}, "text_1");
  ExpectBad("/v1/score", {{"text_1", "x"}, {"text_2", {"a", 2}}}, "text_2[1]");
}

TEST_F(EncoderServerTest, PromptNamePutsThePromptBeforeTexts) {
  Start(Task::kEmbed);
  // A model without prompts: none is put, and naming one is refused.
  EXPECT_EQ(Post("/v1/embeddings", {{"input", "ab"}}).second["data"][0]["embedding"][0], 4.0);
  ExpectBad("/v1/embeddings", {{"input", "ab"}, {"prompt_name", "query"}}, "prompt_name");
  encoder_->prompts = true;
  // The default prompt "q:" before the text: 100 q : a b 101.
  auto [s1, with] = Post("/v1/embeddings", {{"input", {"ab", "c"}}});
  ASSERT_EQ(s1, 200) << with.dump();
  EXPECT_EQ(with["data"][0]["embedding"], json({6.0, 100 + 'q' + ':' + 'a' + 'b' + 101, 1.0, 0.0}));
  EXPECT_EQ(with["usage"]["prompt_tokens"], 6 + 5);
  auto [s2, named] = Post("/v1/embeddings", {{"input", "ab"}, {"prompt_name", "query"}});
  ASSERT_EQ(s2, 200);
  EXPECT_EQ(named["data"][0]["embedding"], with["data"][0]["embedding"]);
  auto [s3, none] = Post("/v1/embeddings", {{"input", "ab"}, {"prompt_name", "none"}});
  ASSERT_EQ(s3, 200);
  EXPECT_EQ(none["data"][0]["embedding"][0], 4.0);
  // Token arrays get no prompt.
  EXPECT_EQ(Post("/v1/embeddings", {{"input", {7, 8}}}).second["data"][0]["embedding"][0], 2.0);
  ExpectBad("/v1/embeddings", {{"input", "ab"}, {"prompt_name", "passage"}}, "prompt_name");
  ExpectBad("/v1/embeddings", {{"input", "ab"}, {"prompt_name", 3}}, "prompt_name");
}

TEST_F(EncoderServerTest, DimensionsCutAndNormalizeOnlyForMatryoshkaModels) {
  Start(Task::kEmbed);
  ExpectBad("/v1/embeddings", {{"input", "ab"}, {"dimensions", 2}}, "dimensions");
  auto [s0, refused] = Post("/v1/embeddings", {{"input", "ab"}, {"dimensions", 2}});
  EXPECT_NE(refused["error"]["message"].get<std::string>().find("dimensions"), std::string::npos);
  encoder_->matryoshka = true;
  // [4, 396, 1, 0] cut to [4, 396] and normalized again (truncate, then L2-normalize).
  auto [s1, two] = Post("/v1/embeddings", {{"input", "ab"}, {"dimensions", 2}});
  ASSERT_EQ(s1, 200) << two.dump();
  const double norm = std::sqrt(4.0 * 4.0 + 396.0 * 396.0);
  ASSERT_EQ(two["data"][0]["embedding"].size(), 2u);
  EXPECT_FLOAT_EQ(two["data"][0]["embedding"][0].get<float>(), static_cast<float>(4.0 / norm));
  EXPECT_FLOAT_EQ(two["data"][0]["embedding"][1].get<float>(), static_cast<float>(396.0 / norm));
  auto [s2, b64] =
      Post("/v1/embeddings", {{"input", "ab"}, {"dimensions", 3}, {"encoding_format", "base64"}});
  ASSERT_EQ(s2, 200);
  EXPECT_EQ(b64["data"][0]["embedding"].get<std::string>().size(), 16u);  // 12 bytes
  EXPECT_EQ(Post("/v1/embeddings", {{"input", "ab"}, {"dimensions", 4}}).first, 200);
  ExpectBad("/v1/embeddings", {{"input", "ab"}, {"dimensions", 1}}, "dimensions");
  ExpectBad("/v1/embeddings", {{"input", "ab"}, {"dimensions", "2"}}, "dimensions");
}

// Requests that arrive while a batch runs share the next batch; each answer is the one the
// request gets alone.
TEST_F(EncoderServerTest, ConcurrentRequestsShareABatchWithAnswersAsAlone) {
  Start(Task::kEmbed);
  const std::vector<json> bodies = {{{"input", {"a", "bb"}}},
                                    {{"input", "ccc"}},
                                    {{"input", {{1, 2, 3}}}, {"encoding_format", "base64"}},
                                    {{"input", {"dddd", "e"}}}};
  std::vector<json> alone;
  for (const json& body : bodies) {
    auto [status, answer] = Post("/v1/embeddings", body);
    ASSERT_EQ(status, 200) << answer.dump();
    alone.push_back(Stable(answer));
  }
  const double batches = Metric("gizllm_encoder_batches_total");
  const double requests = Metric("gizllm_encoder_batch_requests_total");
  EXPECT_EQ(batches, 4);  // one a request sent alone

  encoder_->Hold();
  std::vector<json> together(bodies.size());
  std::vector<std::thread> clients;
  clients.emplace_back([&] { together[0] = Post("/v1/embeddings", bodies[0]).second; });
  encoder_->WaitInside();  // the first request's batch runs
  for (size_t i = 1; i < bodies.size(); ++i) {
    clients.emplace_back([&, i] { together[i] = Post("/v1/embeddings", bodies[i]).second; });
  }
  WaitQueued(3);
  encoder_->Release();
  for (std::thread& t : clients) t.join();
  for (size_t i = 0; i < bodies.size(); ++i) {
    EXPECT_EQ(Stable(together[i]), alone[i]) << i;
  }
  // Two batches: the first request's, then the other three's together (1 + 2 + 1 + 2 texts).
  EXPECT_EQ(Metric("gizllm_encoder_batches_total") - batches, 2);
  EXPECT_EQ(Metric("gizllm_encoder_batch_requests_total") - requests, 4);
  const std::vector<size_t> calls = encoder_->calls();
  ASSERT_GE(calls.size(), 2u);
  EXPECT_EQ(calls[calls.size() - 2], 2u);
  EXPECT_EQ(calls.back(), 4u);
}

// A batch that fails runs each of its requests alone: only the one at fault hears the error.
TEST_F(EncoderServerTest, OneRequestsErrorInASharedBatchStaysItsOwn) {
  Start(Task::kEmbed);
  auto [s0, good_alone] = Post("/v1/embeddings", {{"input", {{5, 6}}}});
  ASSERT_EQ(s0, 200);
  encoder_->Hold();
  json first, good, bad, other;
  int bad_status = 0;
  std::thread a([&] { first = Post("/v1/embeddings", {{"input", "x"}}).second; });
  encoder_->WaitInside();
  std::thread b([&] { good = Post("/v1/embeddings", {{"input", {{5, 6}}}}).second; });
  WaitQueued(1);
  std::thread c([&] {
    std::tie(bad_status, bad) = Post("/v1/embeddings", {{"input", {{255, 1}}}});
  });
  WaitQueued(2);
  std::thread d([&] { other = Post("/v1/embeddings", {{"input", "yz"}}).second; });
  WaitQueued(3);
  encoder_->Release();
  for (std::thread* t : {&a, &b, &c, &d}) t->join();
  EXPECT_EQ(Stable(good), Stable(good_alone));
  EXPECT_EQ(bad_status, 400) << bad.dump();
  EXPECT_NE(bad["error"]["message"].get<std::string>().find("token 255"), std::string::npos);
  EXPECT_EQ(other["data"][0]["embedding"][0], 4.0);
  // The held batch, the shared one that failed, then each of its three alone.
  EXPECT_EQ(encoder_->calls(), (std::vector<size_t>{1, 1, 3, 1, 1, 1}));
}

// Rerank and score requests share batches too, and a batch holds at most the token budget: a
// request's sequences spill into the next batch.
TEST_F(EncoderServerTest, BatchesStopAtTheTokenBudget) {
  Start(Task::kRerank, /*batch_tokens=*/14);
  // Pairs of 5 tokens: "q" with "a" is 100 q 101 a 101.
  const json rerank = {{"query", "q"}, {"documents", {"a", "b", "c"}}};
  const json score = {{"text_1", "q"}, {"text_2", {"dd", "e"}}};
  auto [s1, rerank_alone] = Post("/v1/rerank", rerank);
  auto [s2, score_alone] = Post("/v1/score", score);
  ASSERT_EQ(s1, 200);
  ASSERT_EQ(s2, 200);
  // Alone, the rerank runs in batches of 2 + 1 pairs (15 tokens pass 14), the score in one (6 + 5).
  EXPECT_EQ(encoder_->calls(), (std::vector<size_t>{2, 1, 2}));

  encoder_->Hold();
  json first, rerank_together, score_together;
  std::thread a([&] { first = Post("/v1/score", {{"text_1", "q"}, {"text_2", "z"}}).second; });
  encoder_->WaitInside();
  std::thread b([&] { rerank_together = Post("/v1/rerank", rerank).second; });
  WaitQueued(1);
  std::thread c([&] { score_together = Post("/v1/score", score).second; });
  WaitQueued(2);
  encoder_->Release();
  a.join();
  b.join();
  c.join();
  EXPECT_EQ(first["data"][0]["score"], 2.0);  // "z" and the closing 101
  EXPECT_EQ(Stable(rerank_together), Stable(rerank_alone));
  EXPECT_EQ(Stable(score_together), Stable(score_alone));
  // After the held batch: the rerank's first two pairs (10 tokens), then its third with the
  // score's first (5 + 6), then the score's second.
  const std::vector<size_t> calls = encoder_->calls();
  ASSERT_EQ(calls.size(), 3u + 4u);
  EXPECT_EQ(std::vector<size_t>(calls.begin() + 4, calls.end()), (std::vector<size_t>{2, 2, 1}));
}

}  // namespace
}  // namespace gizllm::server
