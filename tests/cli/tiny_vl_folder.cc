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

using tiny_vl::Append;
using tiny_vl::kImEnd;
using tiny_vl::kImStart;
using tiny_vl::WriteTokenizer;

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
