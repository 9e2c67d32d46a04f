// Writes a small random Qwen3-VL folder with its tower (tests/unit/model/tiny_vl.h), a
// character tokenizer (ids 0..39 the characters below, 40.. Qwen's special tokens at tiny_vl's
// ids) and the Qwen2-VL chat template (image parts as <|vision_start|><|image_pad|><|vision_end|>),
// a picture, a truncated copy of it, another picture of its size, and the answer the engine gives
// for the prompt with that picture: the prompt's ids are built here by hand (not by the template or
// the tokenizer), the picture read by PictureReader, greedy tokens from Engine::Generate, decoded
// as `run` streams them and ended with the newline `run` adds.
//
//   tiny_vl_folder DIR PROMPT TOKENS
//   -> DIR/model/, DIR/picture.png, DIR/cut.png, DIR/other.png, DIR/expected.txt
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/check.h"
#include "engine/engine.h"
#include "model/model.h"
#include "model/picture_prompt.h"
#include "ops/device.h"
#include "tests/unit/model/tiny_vl.h"
#include "tests/unit/vision/picture_encoders.h"
#include "tokenizer/tokenizer.h"

namespace gizllm {
namespace {

const std::string kChars = "abcdefghijklmnopqrstuvwxyz \n.,!?:'012345";  // ids 0..39
constexpr int32_t kImStart = 44, kImEnd = 45;

const char* kTemplate =
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n{% else %}"
    "{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

void WriteTokenizer(const std::string& dir) {
  static_assert(tiny_vl::kImage == 40 && tiny_vl::kStart == 41 && tiny_vl::kVideo == 42 &&
                tiny_vl::kEnd == 43);
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  for (size_t i = 0; i < kChars.size(); ++i) vocab[std::string(1, kChars[i])] = i;
  nlohmann::ordered_json added = nlohmann::ordered_json::array();
  const char* specials[] = {"<|image_pad|>", "<|vision_start|>", "<|video_pad|>", "<|vision_end|>",
                            "<|im_start|>",  "<|im_end|>",       "<|endoftext|>", "<|box_start|>"};
  for (int i = 0; i < 8; ++i) {
    vocab[specials[i]] = 40 + i;
    added.push_back({{"id", 40 + i},
                     {"content", specials[i]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  nlohmann::ordered_json tokenizer = {{"version", "1.0"},
                                      {"truncation", nullptr},
                                      {"padding", nullptr},
                                      {"added_tokens", added},
                                      {"normalizer", nullptr},
                                      {"pre_tokenizer", nullptr},
                                      {"post_processor", nullptr},
                                      {"decoder", {{"type", "Fuse"}}},
                                      {"model",
                                       {{"type", "BPE"},
                                        {"dropout", nullptr},
                                        {"unk_token", nullptr},
                                        {"continuing_subword_prefix", nullptr},
                                        {"end_of_word_suffix", nullptr},
                                        {"fuse_unk", false},
                                        {"byte_fallback", false},
                                        {"vocab", vocab},
                                        {"merges", nlohmann::ordered_json::array()}}}};
  std::ofstream(dir + "/tokenizer.json") << tokenizer.dump();
  nlohmann::ordered_json config = {{"chat_template", kTemplate}, {"eos_token", "<|im_end|>"}};
  std::ofstream(dir + "/tokenizer_config.json") << config.dump();
}

void Append(std::vector<int32_t>* ids, const std::string& text) {
  for (char c : text) {
    const size_t id = kChars.find(c);
    CHECK(id != std::string::npos);
    ids->push_back(static_cast<int32_t>(id));
  }
}

int Main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: tiny_vl_folder DIR PROMPT TOKENS\n");
    return 2;
  }
  const std::string dir = argv[1], prompt = argv[2], model_dir = dir + "/model";
  const int64_t limit = std::stoll(argv[3]);
  tiny_vl::Write(model_dir, /*tower=*/true);
  WriteTokenizer(model_dir);
  const vision::testing::Bytes png =
      vision::testing::EncodePng(12, 8, vision::testing::Pattern(12, 8, 3, 7), {});
  std::ofstream(dir + "/picture.png", std::ios::binary)
      .write(reinterpret_cast<const char*>(png.data()), png.size());
  std::ofstream(dir + "/cut.png", std::ios::binary)
      .write(reinterpret_cast<const char*>(png.data()), png.size() / 2);
  const vision::testing::Bytes other =
      vision::testing::EncodePng(12, 8, vision::testing::Pattern(12, 8, 3, 8), {});
  std::ofstream(dir + "/other.png", std::ios::binary)
      .write(reinterpret_cast<const char*>(other.data()), other.size());

  // <|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>PROMPT<|im_end|>\n
  // <|im_start|>assistant\n
  std::vector<int32_t> ids = {kImStart};
  Append(&ids, "user\n");
  ids.insert(ids.end(), {tiny_vl::kStart, tiny_vl::kImage, tiny_vl::kEnd});
  Append(&ids, prompt);
  ids.push_back(kImEnd);
  Append(&ids, "\n");
  ids.push_back(kImStart);
  Append(&ids, "assistant\n");

  auto backend = OpenBackend(DeviceOptions{.device = "cpu", .threads = 2, .exact = true});
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "tiny_vl_folder: %s\n", s.message().c_str());
    return 1;
  };
  if (!backend.ok()) return fail(backend.status());
  auto model = Model::Load(model_dir, *backend);
  if (!model.ok()) return fail(model.status());
  auto reader = PictureReader::Load(model_dir, *backend);
  if (!reader.ok()) return fail(reader.status());
  auto expanded = (*reader)->Expand(ids, std::vector<std::vector<uint8_t>>{png});
  if (!expanded.ok()) return fail(expanded.status());
  EngineOptions options;
  options.slots = 1;
  options.context = static_cast<int64_t>(expanded->tokens.size()) + limit;
  options.kv_budget_bytes = (options.context / kPage + 2) * (*model)->PageBytes();
  auto engine = Engine::Create(model->get(), options);
  if (!engine.ok()) return fail(engine.status());
  Request request;
  request.prompt = expanded->tokens;
  request.limit = limit;
  request.sampling.temperature = 0.0f;
  request.pictures = std::make_shared<const PromptPictures>(std::move(expanded->pictures));
  auto out = (*engine)->Generate({request});
  if (!out.ok()) return fail(out.status());
  auto tokenizer = Tokenizer::Load(model_dir);
  if (!tokenizer.ok()) return fail(tokenizer.status());
  StreamDecoder decoder(*tokenizer);
  std::string text;
  for (int32_t t : (*out)[0]) text += decoder.Push(t);
  text += decoder.Flush();
  if (text.empty() || text.back() != '\n') text += '\n';
  std::ofstream(dir + "/expected.txt", std::ios::binary) << text;
  std::fprintf(stderr, "tiny_vl_folder: %zu prompt tokens, %zu answer tokens\n",
               expanded->tokens.size(), (*out)[0].size());
  return 0;
}

}  // namespace
}  // namespace gizllm

int main(int argc, char** argv) { return gizllm::Main(argc, argv); }
