// Chats with pictures (and videos) through the whole server on a small random Qwen3-VL with its
// tower (tests/unit/model/tiny_vl.h; CPU, float32 activations): the greedy answer to an image_url
// part equals a direct Engine run on the same picture read by PictureReader, from a data: URL or
// a file under the allowed folder; and every bad picture (truncated, huge, a bomb, the wrong
// type, a network URL, a file outside the folder, over the per-request limit) gets a 400 that
// names the part while the server goes on answering.
#include <gtest/gtest.h>
#include <unistd.h>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <filesystem>
#include <fstream>

#include "../model/tiny_vl.h"
#include "../vision/picture_encoders.h"
#include "engine/engine.h"
#include "model/model.h"
#include "model/picture_prompt.h"
#include "ops/device.h"
#include "server/engine_loop.h"
#include "server/http_server.h"
#include "server/real_generator.h"
#include "tokenizer/tokenizer.h"
#include "vision/video.h"

namespace gizllm::server {
namespace {

namespace fs = std::filesystem;
namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using nlohmann::json;
using vision::testing::Bytes;

constexpr int kTokens = 8;

Bytes Png(int width, int height, int seed) {
  return vision::testing::EncodePng(width, height, vision::testing::Pattern(width, height, 3, seed),
                                    {});
}

std::string Base64(const Bytes& bytes) {
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const uint32_t v = bytes[i] << 16 | bytes[i + 1] << 8 | bytes[i + 2];
    for (int s : {18, 12, 6, 0}) out += kAlphabet[(v >> s) & 63];
  }
  if (i + 1 == bytes.size()) {
    const uint32_t v = bytes[i] << 16;
    out += std::string{kAlphabet[v >> 18], kAlphabet[(v >> 12) & 63], '=', '='};
  } else if (i + 2 == bytes.size()) {
    const uint32_t v = bytes[i] << 16 | bytes[i + 1] << 8;
    out +=
        std::string{kAlphabet[v >> 18], kAlphabet[(v >> 12) & 63], kAlphabet[(v >> 6) & 63], '='};
  }
  return out;
}

std::string DataUrl(const Bytes& bytes, const std::string& type = "image/png") {
  return "data:" + type + ";base64," + Base64(bytes);
}

void WriteFile(const fs::path& path, const Bytes& bytes) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
}

json ImagePart(const std::string& url) {
  return {{"type", "image_url"}, {"image_url", {{"url", url}}}};
}

class ServerVisionTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = new fs::path(fs::path(::testing::TempDir()) /
                         ("server_vision_" + std::to_string(::getpid())));
    fs::remove_all(*root_);
    fs::create_directories(*root_ / "media" / "clip");
    fs::create_directories(*root_ / "outside");
    tiny_vl::Write((*root_ / "model").string(), /*tower=*/true);
    tiny_vl::WriteTokenizer((*root_ / "model").string());
    auto backend = OpenBackend(DeviceOptions{.device = "cpu", .threads = 2, .exact = true});
    ASSERT_TRUE(backend.ok()) << backend.status().message();
    backend_ = new std::shared_ptr<Backend>(std::move(*backend));
    auto model = Model::Load((*root_ / "model").string(), *backend_);
    ASSERT_TRUE(model.ok()) << model.status().message();
    model_ = model->release();
  }
  static void TearDownTestSuite() {
    delete model_;
    delete backend_;
    fs::remove_all(*root_);
    delete root_;
  }

  void SetUp() override { ASSERT_NE(model_, nullptr); }

  // The server on the model; `options` as given (port 0, the media folder allowed unless
  // `allow_files` is false).
  void Start(ServerOptions options = {}, bool allow_files = true) {
    const std::string dir = (*root_ / "model").string();
    EngineOptions e;
    e.slots = 2;
    e.context = 160;
    e.rows = 64;
    e.kv_budget_bytes = (2 * e.context / kPage + 4) * model_->PageBytes();
    auto engine = Engine::Create(model_, e);
    ASSERT_TRUE(engine.ok()) << engine.status().message();
    auto text = ChatTextModel::Load(dir, "tiny-vl", static_cast<int32_t>(e.context),
                                    static_cast<int32_t>(model_->arch().vocab));
    ASSERT_TRUE(text.ok()) << text.status().message();
    text_ = std::move(*text);
    auto reader = PictureReader::Load(dir, *backend_, options.media.picture);
    ASSERT_TRUE(reader.ok()) << reader.status().message();
    pictures_ = std::move(*reader);
    text_->SetPictures(pictures_);
    generator_ = std::make_unique<EngineGenerator>(std::move(*engine), text_->tokenizer());
    generator_->SetPictures(pictures_);
    loop_ = std::make_unique<EngineLoop>(*generator_, metrics_, /*max_pending=*/16);
    options.port = 0;
    if (allow_files) options.media.allowed_path = (*root_ / "media").string();
    server_ = std::make_unique<HttpServer>(*text_, *loop_, metrics_, options);
    loop_->Start();
    ASSERT_TRUE(server_->Start().ok());
  }
  void TearDown() override {
    if (server_) server_->Stop();
    server_.reset();
    if (loop_) loop_->Stop();
  }

  std::pair<int, json> Chat(const json& content, int max_tokens = kTokens) {
    json body = {{"messages", {{{"role", "user"}, {"content", content}}}},
                 {"max_tokens", max_tokens},
                 {"temperature", 0}};
    net::io_context io;
    tcp::socket socket(io);
    socket.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), server_->port()));
    http::request<http::string_body> req{http::verb::post, "/v1/chat/completions", 11};
    req.set(http::field::host, "localhost");
    req.set(http::field::content_type, "application/json");
    req.body() = body.dump();
    req.prepare_payload();
    http::write(socket, req);
    beast::flat_buffer buffer;
    http::response<http::string_body> res;
    beast::error_code ec;
    http::read(socket, buffer, res, ec);
    json j = json::parse(res.body(), nullptr, false);
    return {static_cast<int>(res.result_int()), j};
  }

  // The answer of a direct Engine run (its own engine, before the server starts) on the prompt
  // the template writes for one user message of `media` placeholders (image or video tokens)
  // and `prompt`, the placeholders placed from `inputs`.
  static std::pair<std::string, size_t> Direct(const std::vector<int32_t>& placeholders,
                                               std::vector<VisionInput> inputs,
                                               const std::string& prompt) {
    const std::string dir = (*root_ / "model").string();
    ChatPrompt chat;
    chat.text = "<|im_start|>user\n";
    for (int32_t p : placeholders) {
      chat.text += p == tiny_vl::kVideo ? "<|vision_start|><|video_pad|><|vision_end|>"
                                        : "<|vision_start|><|image_pad|><|vision_end|>";
    }
    chat.text += prompt + "<|im_end|>\n<|im_start|>assistant\n";
    auto reader = PictureReader::Load(dir, *backend_);
    EXPECT_TRUE(reader.ok()) << reader.status().message();
    auto tokenizer = Tokenizer::Load(dir);
    EXPECT_TRUE(tokenizer.ok());
    chat.tokens = tokenizer->Encode(chat.text).value();
    auto written = (*reader)->WriteVideos(*tokenizer, chat, inputs);
    EXPECT_TRUE(written.ok()) << written.status().message();
    auto placed = (*reader)->Place(written->tokens, std::move(inputs));
    EXPECT_TRUE(placed.ok()) << placed.status().message();
    auto read = (*reader)->Read(std::move(*placed));
    EXPECT_TRUE(read.ok()) << read.status().message();
    EngineOptions e;
    e.slots = 1;
    e.context = static_cast<int64_t>(read->tokens.size()) + kTokens;
    e.kv_budget_bytes = (e.context / kPage + 2) * model_->PageBytes();
    auto engine = Engine::Create(model_, e);
    EXPECT_TRUE(engine.ok()) << engine.status().message();
    Request request;
    request.prompt = read->tokens;
    request.limit = kTokens;
    request.sampling.temperature = 0.0f;
    request.pictures = std::make_shared<const PromptPictures>(std::move(read->pictures));
    auto out = (*engine)->Generate({request});
    EXPECT_TRUE(out.ok()) << out.status().message();
    StreamDecoder decoder(*tokenizer);
    std::string text;
    for (int32_t t : (*out)[0]) text += decoder.Push(t);
    text += decoder.Flush();
    return {text, request.prompt.size()};
  }

  static std::pair<std::string, size_t> DirectPictures(const std::vector<Bytes>& pictures,
                                                       const std::string& prompt) {
    auto reader = PictureReader::Load((*root_ / "model").string(), *backend_);
    EXPECT_TRUE(reader.ok());
    std::vector<VisionInput> inputs;
    for (const Bytes& p : pictures) inputs.push_back((*reader)->PreparePicture(p).value());
    return Direct(std::vector<int32_t>(pictures.size(), tiny_vl::kImage), std::move(inputs),
                  prompt);
  }

  static void ExpectBadRequest(const std::pair<int, json>& reply, const std::string& param,
                               const std::string& words) {
    EXPECT_EQ(reply.first, 400) << reply.second.dump();
    EXPECT_EQ(reply.second["error"]["param"], param) << reply.second.dump();
    const std::string message = reply.second["error"]["message"].get<std::string>();
    EXPECT_NE(message.find(words), std::string::npos) << message;
    EXPECT_NE(message.find(param), std::string::npos) << message;
  }

  static fs::path* root_;
  static std::shared_ptr<Backend>* backend_;
  static Model* model_;
  Metrics metrics_;
  std::unique_ptr<ChatTextModel> text_;
  std::shared_ptr<PictureReader> pictures_;
  std::unique_ptr<EngineGenerator> generator_;
  std::unique_ptr<EngineLoop> loop_;
  std::unique_ptr<HttpServer> server_;
};

fs::path* ServerVisionTest::root_ = nullptr;
std::shared_ptr<Backend>* ServerVisionTest::backend_ = nullptr;
Model* ServerVisionTest::model_ = nullptr;

TEST_F(ServerVisionTest, AnImageUrlAnswersAsTheEngineDoes) {
  const Bytes picture = Png(12, 8, 7), other = Png(12, 8, 8);
  const auto [expected, prompt_tokens] = DirectPictures({picture}, "what is this?");
  ASSERT_FALSE(expected.empty());
  const auto [expected_other, unused] = DirectPictures({other}, "what is this?");
  ASSERT_NE(expected, expected_other);
  const auto [expected_two, two_tokens] = DirectPictures({picture, other}, "and these?");
  WriteFile(*root_ / "media" / "picture.png", picture);
  Start();

  const json text = {{"type", "text"}, {"text", "what is this?"}};
  auto [status, reply] = Chat({ImagePart(DataUrl(picture)), text});
  ASSERT_EQ(status, 200) << reply.dump();
  EXPECT_EQ(reply["choices"][0]["message"]["content"], expected);
  // 35 tokens of the template, the placeholder repeated for the 12 x 8 picture's 2 x 3 rows.
  EXPECT_EQ(reply["usage"]["prompt_tokens"], prompt_tokens);
  EXPECT_EQ(prompt_tokens, 40u);
  // The same picture from a file under the allowed folder, by path and by file:// URL.
  for (const std::string& url :
       {std::string("picture.png"), "file://" + (*root_ / "media" / "picture.png").string()}) {
    auto [s, r] = Chat({ImagePart(url), text});
    ASSERT_EQ(s, 200) << r.dump();
    EXPECT_EQ(r["choices"][0]["message"]["content"], expected) << url;
  }
  // Another picture of the same size: its own answer, not the slot's or a prefix's.
  auto [s2, r2] = Chat({ImagePart(DataUrl(other)), text});
  ASSERT_EQ(s2, 200) << r2.dump();
  EXPECT_EQ(r2["choices"][0]["message"]["content"], expected_other);
  // Two pictures, JPEG-typed URL of PNG bytes (the bytes say what they are).
  auto [s3, r3] = Chat({ImagePart(DataUrl(picture, "image/jpeg")),
                        ImagePart(DataUrl(other)),
                        {{"type", "text"}, {"text", "and these?"}}});
  ASSERT_EQ(s3, 200) << r3.dump();
  EXPECT_EQ(r3["choices"][0]["message"]["content"], expected_two);
  EXPECT_EQ(r3["usage"]["prompt_tokens"], two_tokens);
}

TEST_F(ServerVisionTest, BadPicturesAre400sNamingThePart) {
  ServerOptions options;
  options.media.max_pictures = 2;
  options.media.picture.max_pixels = 4000000;
  Start(options);
  const Bytes picture = Png(12, 8, 7);
  WriteFile(*root_ / "outside" / "secret.png", picture);
  const json text = {{"type", "text"}, {"text", "what?"}};
  const std::string p0 = "messages[0].content[0].image_url";
  const std::string p1 = "messages[0].content[1].image_url";

  Bytes cut = picture;
  cut.resize(cut.size() / 2);
  ExpectBadRequest(Chat({ImagePart(DataUrl(cut)), text}), p0, "PNG truncated");
  ExpectBadRequest(Chat({ImagePart(DataUrl(picture)), ImagePart(DataUrl(cut)), text}), p1,
                   "PNG truncated");
  // Huge declared sizes and a decompression bomb: refused before anything is allocated.
  const Bytes huge =
      vision::testing::HandMadePng(40000, 40000, vision::testing::Deflate(Bytes(100, 0)));
  ExpectBadRequest(Chat({ImagePart(DataUrl(huge)), text}), p0,
                   "picture is 40000x40000, over the limit of 4000000 pixels");
  const int side = 3000;
  const Bytes bomb = vision::testing::HandMadePng(
      side, side, vision::testing::Deflate(Bytes(size_t(side) * (side * 3 + 1), 0)));
  ASSERT_LT(bomb.size(), 100000u);
  ExpectBadRequest(Chat({ImagePart(DataUrl(bomb)), text}), p0,
                   "picture is 3000x3000, over the limit of 4000000 pixels");
  // Wrong types: a GIF's bytes, text, a data: URL of another type.
  const Bytes gif = {'G', 'I', 'F', '8', '9', 'a', 1, 0, 1, 0, 0, 0, 0};
  auto [sg, rg] = Chat({ImagePart(DataUrl(gif)), text});
  EXPECT_EQ(sg, 400);
  EXPECT_EQ(rg["error"]["param"], p0) << rg.dump();
  ExpectBadRequest(Chat({ImagePart(DataUrl(gif, "image/gif")), text}), p0, "of type 'image/gif'");
  ExpectBadRequest(Chat({ImagePart("data:image/png;base64,not base64!"), text}), p0,
                   "not valid base64");
  // No network; no file outside the folder.
  ExpectBadRequest(Chat({ImagePart("https://example.com/cat.png"), text}), p0,
                   "fetches nothing from the network");
  ExpectBadRequest(Chat({ImagePart("../outside/secret.png"), text}), p0,
                   "not a file or folder under the allowed media path");
  ExpectBadRequest(Chat({ImagePart((*root_ / "outside" / "secret.png").string()), text}), p0,
                   "not a file or folder under the allowed media path");
  // More pictures than a request may hold: the first one over is named.
  ExpectBadRequest(Chat({ImagePart(DataUrl(picture)), ImagePart(DataUrl(picture)),
                         ImagePart(DataUrl(picture)), text}),
                   "messages[0].content[2].image_url", "at most 2 pictures");
  // The server still answers.
  auto [status, reply] = Chat({ImagePart(DataUrl(picture)), text});
  EXPECT_EQ(status, 200) << reply.dump();
  EXPECT_FALSE(reply["choices"][0]["message"]["content"].get<std::string>().empty());
}

// A second turn reads the first turn's rows again from the cache, picture rows included (the
// chat's marks moved by the rows the picture added); another picture at the same place is not
// taken for it.
TEST_F(ServerVisionTest, TheNextTurnReusesThePictureRows) {
  Start();
  const Bytes picture = Png(12, 8, 7), other = Png(12, 8, 8);
  const json first = {ImagePart(DataUrl(picture)), {{"type", "text"}, {"text", "what is this?"}}};
  auto [status, reply] = Chat(first);
  ASSERT_EQ(status, 200) << reply.dump();
  const std::string answer = reply["choices"][0]["message"]["content"];
  auto turn = [&](const json& content) {
    json body = {{"messages",
                  {{{"role", "user"}, {"content", content}},
                   {{"role", "assistant"}, {"content", answer}},
                   {{"role", "user"}, {"content", "and now?"}}}},
                 {"max_tokens", kTokens},
                 {"temperature", 0}};
    net::io_context io;
    tcp::socket socket(io);
    socket.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), server_->port()));
    http::request<http::string_body> req{http::verb::post, "/v1/chat/completions", 11};
    req.set(http::field::host, "localhost");
    req.set(http::field::content_type, "application/json");
    req.body() = body.dump();
    req.prepare_payload();
    http::write(socket, req);
    beast::flat_buffer buffer;
    http::response<http::string_body> res;
    http::read(socket, buffer, res);
    EXPECT_EQ(res.result_int(), 200u) << res.body();
    return json::parse(res.body())["usage"];
  };
  // The first turn's prompt (40 tokens: the picture's 6 rows at 7..12) is held whole.
  json usage = turn(first);
  EXPECT_GE(usage["prompt_tokens_details"]["cached_tokens"].get<int>(), 40) << usage.dump();
  // Another picture of the same size: its placeholders look alike, the rows differ; the cache
  // gives back no more than the text before it (7 tokens).
  const json changed = {ImagePart(DataUrl(other)), {{"type", "text"}, {"text", "what is this?"}}};
  usage = turn(changed);
  EXPECT_LE(usage["prompt_tokens_details"]["cached_tokens"].get<int>(), 7) << usage.dump();
}

// Five 8 x 8 frames taken at 1 frame a second (three timestamped pairs in the prompt).
TEST_F(ServerVisionTest, AVideoUrlAnswersAsTheEngineDoes) {
  std::vector<vision::Picture> frames;
  std::vector<std::string> urls;
  for (int i = 0; i < 5; ++i) {
    const Bytes pattern = vision::testing::Pattern(8, 8, 3, 20 + i);
    const Bytes png = vision::testing::EncodePng(8, 8, pattern, {});
    WriteFile(*root_ / "media" / "clip" / ("frame_" + std::to_string(i) + ".png"), png);
    frames.push_back(vision::Picture{8, 8, pattern});
    urls.push_back(DataUrl(png));
  }
  auto reader = PictureReader::Load((*root_ / "model").string(), *backend_);
  ASSERT_TRUE(reader.ok());
  const auto [expected, prompt_tokens] =
      Direct({tiny_vl::kVideo}, {(*reader)->PrepareVideo(frames, 1.0).value()}, "what is this?");
  ASSERT_FALSE(expected.empty());
  EXPECT_EQ(prompt_tokens, 91u);  // 34 tokens of the template, 3 pairs of 19
  ServerOptions options;
  options.media.max_frames = 6;
  Start(options);
  const json text = {{"type", "text"}, {"text", "what is this?"}};
  const std::string param = "messages[0].content[0].video_url";
  for (const json& video :
       {json{{"url", "clip"}, {"fps", 1}},
        json{{"url", "file://" + (*root_ / "media" / "clip").string()}, {"fps", 1}},
        json{{"frames", urls}, {"fps", 1}}}) {
    auto [status, reply] = Chat({{{"type", "video_url"}, {"video_url", video}}, text});
    ASSERT_EQ(status, 200) << reply.dump();
    EXPECT_EQ(reply["choices"][0]["message"]["content"], expected) << video.dump().substr(0, 80);
    EXPECT_EQ(reply["usage"]["prompt_tokens"], prompt_tokens);
  }
  // Frames over the request's limit (6: the folder's 5 and 2 more), a frame that is not a
  // picture, a folder outside the allowed one, a data: URL as a video.
  ExpectBadRequest(Chat({{{"type", "video_url"}, {"video_url", {{"url", "clip"}}}},
                         {{"type", "video_url"}, {"video_url", {{"frames", {urls[0], urls[1]}}}}},
                         text}),
                   "messages[0].content[1].video_url", "at most 6 frames");
  ExpectBadRequest(Chat({{{"type", "video_url"},
                          {"video_url", {{"frames", {urls[0], "data:image/png;base64,AAAA"}}}}},
                         text}),
                   param + ".frames[1]", "");
  ExpectBadRequest(Chat({{{"type", "video_url"}, {"video_url", {{"url", "../outside"}}}}, text}),
                   param, "not a file or folder under the allowed media path");
  ExpectBadRequest(Chat({{{"type", "video_url"}, {"video_url", {{"url", urls[0]}}}}, text}), param,
                   "a folder of frame pictures");
  // A frame that links outside the allowed folder.
  WriteFile(*root_ / "outside" / "frame.png", Png(8, 8, 1));
  fs::create_symlink(*root_ / "outside" / "frame.png", *root_ / "media" / "clip" / "frame_8.png");
  ExpectBadRequest(Chat({{{"type", "video_url"}, {"video_url", {{"url", "clip"}}}}, text}), param,
                   "frame_8.png, which is not under the allowed media path");
  fs::remove(*root_ / "media" / "clip" / "frame_8.png");
  WriteFile(*root_ / "media" / "clip" / "frame_9.png", Png(12, 8, 1));
  ExpectBadRequest(Chat({{{"type", "video_url"}, {"video_url", {{"url", "clip"}}}}, text}), param,
                   "differ in size");
  fs::remove(*root_ / "media" / "clip" / "frame_9.png");
  auto [status, reply] =
      Chat({{{"type", "video_url"}, {"video_url", {{"url", "clip"}, {"fps", 1}}}}, text});
  EXPECT_EQ(status, 200) << reply.dump();
  EXPECT_EQ(reply["choices"][0]["message"]["content"], expected);
}

TEST_F(ServerVisionTest, LocalFilesNeedTheAllowedFolder) {
  Start(ServerOptions{}, /*allow_files=*/false);
  WriteFile(*root_ / "media" / "picture.png", Png(12, 8, 7));
  ExpectBadRequest(Chat({ImagePart((*root_ / "media" / "picture.png").string()),
                         {{"type", "text"}, {"text", "what?"}}}),
                   "messages[0].content[0].image_url", "--allowed-media-path");
}

}  // namespace
}  // namespace gizllm::server
