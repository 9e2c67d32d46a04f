// Writes a small random Qwen3-VL folder with its tower (tests/unit/model/tiny_vl.h), its
// character tokenizer and the Qwen2-VL chat template (tiny_vl::WriteTokenizer), a picture, a
// truncated copy of it, another picture of its size, a video (a folder of five frames, taken at
// 1 frame a second), a folder of frames of two sizes, and the answers the engine gives for the
// prompt with that picture and with that video: the prompt's ids are built here by hand (not by
// the template or the tokenizer), the picture and video read by PictureReader, greedy tokens
// from Engine::Generate, decoded as `run` streams them and ended with the newline `run` adds.
//
//   tiny_vl_folder DIR PROMPT TOKENS
//   -> DIR/model/, DIR/picture.png, DIR/cut.png, DIR/other.png, DIR/video/, DIR/mixed/,
//      DIR/expected.txt, DIR/expected_video.txt
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
#include "vision/video.h"

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

  // Five 8 x 8 frames of a video (the pictures' files in name order), taken at 1 frame a
  // second, and a frame of another size.
  std::filesystem::create_directories(dir + "/video");
  std::vector<vision::Picture> frames;
  for (int i = 0; i < 5; ++i) {
    const vision::testing::Bytes pattern = vision::testing::Pattern(8, 8, 3, 20 + i);
    const vision::testing::Bytes frame = vision::testing::EncodePng(8, 8, pattern, {});
    std::ofstream(dir + "/video/frame_" + std::to_string(i) + ".png", std::ios::binary)
        .write(reinterpret_cast<const char*>(frame.data()), frame.size());
    frames.push_back(vision::Picture{8, 8, pattern});
  }
  std::filesystem::create_directories(dir + "/mixed");
  std::filesystem::copy(dir + "/video", dir + "/mixed", std::filesystem::copy_options::recursive);
  std::ofstream(dir + "/mixed/frame_9.png", std::ios::binary)
      .write(reinterpret_cast<const char*>(png.data()), png.size());

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
  auto tokenizer = Tokenizer::Load(model_dir);
  if (!tokenizer.ok()) return fail(tokenizer.status());

  // The greedy answer to <|im_start|>user\n<|vision_start|>PLACEHOLDER<|vision_end|>PROMPT
  // <|im_end|>\n<|im_start|>assistant\n with `input` placed (a video's timestamps' characters
  // by hand), written to `file` as `run` prints it.
  auto answer = [&](int32_t placeholder, VisionInput input, const std::string& file) -> Status {
    std::vector<int32_t> ids = {kImStart};
    Append(&ids, "user\n");
    if (placeholder == tiny_vl::kImage) {
      ids.insert(ids.end(), {tiny_vl::kStart, placeholder, tiny_vl::kEnd});
    } else {
      // As Qwen3VLProcessor writes a video: inside the template's vision start and end, per
      // pair of frames its timestamp, then its placeholder (repeated by Place to the frame's
      // rows).
      ids.push_back(tiny_vl::kStart);
      for (double seconds : input.times) {
        Append(&ids, vision::TimestampText(seconds));
        ids.insert(ids.end(), {tiny_vl::kStart, placeholder, tiny_vl::kEnd});
      }
      ids.push_back(tiny_vl::kEnd);
    }
    Append(&ids, prompt);
    ids.push_back(kImEnd);
    Append(&ids, "\n");
    ids.push_back(kImStart);
    Append(&ids, "assistant\n");
    std::vector<VisionInput> inputs;
    inputs.push_back(std::move(input));
    GZ_ASSIGN_OR_RETURN(PlacedPrompt placed, (*reader)->Place(ids, std::move(inputs)));
    GZ_ASSIGN_OR_RETURN(PicturePrompt expanded, (*reader)->Read(std::move(placed)));
    EngineOptions options;
    options.slots = 1;
    options.context = static_cast<int64_t>(expanded.tokens.size()) + limit;
    options.kv_budget_bytes = (options.context / kPage + 2) * (*model)->PageBytes();
    GZ_ASSIGN_OR_RETURN(auto engine, Engine::Create(model->get(), options));
    Request request;
    request.prompt = expanded.tokens;
    request.limit = limit;
    request.sampling.temperature = 0.0f;
    request.pictures = std::make_shared<const PromptPictures>(std::move(expanded.pictures));
    GZ_ASSIGN_OR_RETURN(auto out, engine->Generate({request}));
    StreamDecoder decoder(*tokenizer);
    std::string text;
    for (int32_t t : out[0]) text += decoder.Push(t);
    text += decoder.Flush();
    if (text.empty() || text.back() != '\n') text += '\n';
    std::ofstream(dir + "/" + file, std::ios::binary) << text;
    std::fprintf(stderr, "tiny_vl_folder: %s: %zu prompt tokens, %zu answer tokens\n", file.c_str(),
                 request.prompt.size(), out[0].size());
    return Status::Ok();
  };
  auto picture = (*reader)->PreparePicture(png);
  if (!picture.ok()) return fail(picture.status());
  if (Status s = answer(tiny_vl::kImage, std::move(*picture), "expected.txt"); !s.ok()) {
    return fail(s);
  }
  auto video = (*reader)->PrepareVideo(frames, /*fps=*/1.0);
  if (!video.ok()) return fail(video.status());
  if (Status s = answer(tiny_vl::kVideo, std::move(*video), "expected_video.txt"); !s.ok()) {
    return fail(s);
  }
  return 0;
}

}  // namespace
}  // namespace gizllm

int main(int argc, char** argv) { return gizllm::Main(argc, argv); }
