#include <chrono>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "cli/pictures.h"
#include "core/mapped_file.h"
#include "template/chat_prompt.h"
#include "vision/video.h"

namespace gizllm::cli {

nlohmann::ordered_json PictureContent(size_t pictures, const std::string& text, size_t videos) {
  nlohmann::ordered_json content = nlohmann::ordered_json::array();
  for (size_t i = 0; i < pictures; ++i) content.push_back({{"type", "image"}});
  for (size_t i = 0; i < videos; ++i) content.push_back({{"type", "video"}});
  content.push_back({{"type", "text"}, {"text", text}});
  return content;
}

Expected<std::vector<std::vector<uint8_t>>> ReadPictureFiles(
    const std::vector<std::string>& files) {
  std::vector<std::vector<uint8_t>> bytes;
  for (const std::string& file : files) {
    auto text = ReadFile(file);
    if (!text.ok()) return text.status();
    bytes.emplace_back(text->begin(), text->end());
  }
  return bytes;
}

Expected<PicturePrompt> PicturePromptTokens(const Model& model, const Tokenizer& tokenizer,
                                            const std::string& prompt,
                                            const std::vector<std::string>& files,
                                            const std::vector<VideoFolder>& videos) {
  auto reader = PictureReader::Load(model.dir(), model.shared_backend());
  if (!reader.ok()) return reader.status().Annotate("pictures need a vision tower");
  (*reader)->KeepRowsOnDevice(true);
  return PicturePromptTokens(**reader, model, tokenizer, prompt, files, videos);
}

Expected<PicturePrompt> PicturePromptTokens(PictureReader& reader, const Model& model,
                                            const Tokenizer& tokenizer, const std::string& prompt,
                                            const std::vector<std::string>& files,
                                            const std::vector<VideoFolder>& videos,
                                            PictureTimes* times) {
  const auto start = std::chrono::steady_clock::now();
  GZ_ASSIGN_OR_RETURN(std::vector<std::vector<uint8_t>> bytes, ReadPictureFiles(files));
  std::vector<VisionInput> inputs;
  for (size_t i = 0; i < bytes.size(); ++i) {
    auto in = reader.PreparePicture(bytes[i]);
    if (!in.ok()) return in.status().Annotate("picture " + std::to_string(i + 1));
    inputs.push_back(std::move(in).value());
  }
  for (size_t i = 0; i < videos.size(); ++i) {
    const std::string which = "video " + std::to_string(i + 1);
    auto frames =
        vision::ReadFrameFolder(videos[i].folder, kMaxVideoFolderFrames, reader.limits());
    if (!frames.ok()) return frames.status().Annotate(which);
    auto in = reader.PrepareVideo(*frames, videos[i].fps);
    if (!in.ok()) return in.status().Annotate(which);
    inputs.push_back(std::move(in).value());
  }
  const auto decoded_at = std::chrono::steady_clock::now();
  GZ_ASSIGN_OR_RETURN(ChatTemplate chat_template, ChatTemplate::Load(model.dir()));
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  messages.push_back(
      {{"role", "user"}, {"content", PictureContent(files.size(), prompt, videos.size())}});
  const nlohmann::ordered_json input = {{"messages", messages}, {"add_generation_prompt", true}};
  GZ_ASSIGN_OR_RETURN(ChatPrompt chat, ChatPrompt::Render(chat_template, tokenizer, input, 0));
  GZ_ASSIGN_OR_RETURN(chat, reader.WriteVideos(tokenizer, chat, inputs));
  GZ_ASSIGN_OR_RETURN(PlacedPrompt placed, reader.Place(chat.tokens, std::move(inputs)));
  const auto placed_at = std::chrono::steady_clock::now();
  auto read = reader.Read(std::move(placed));
  if (times) {
    const auto end = std::chrono::steady_clock::now();
    times->prepare = std::chrono::duration<double>(placed_at - start).count();
    times->decode = std::chrono::duration<double>(decoded_at - start).count();
    times->tower = std::chrono::duration<double>(end - placed_at).count();
  }
  return read;
}

namespace {

// The model's tower, loaded into `reader` the first time.
Status LoadReader(const Model& model, std::unique_ptr<PictureReader>* reader) {
  if (*reader) return Status::Ok();
  auto loaded = PictureReader::Load(model.dir(), model.shared_backend());
  if (!loaded.ok()) return loaded.status().Annotate("pictures need a vision tower");
  *reader = std::move(*loaded);
  (*reader)->KeepRowsOnDevice(true);
  return Status::Ok();
}

}  // namespace

Status AttachPicture(const Model& model, const std::string& file,
                     std::unique_ptr<PictureReader>* reader, std::vector<VisionInput>* attached) {
  if (file.empty()) return InvalidArgument("/image: give a picture file");
  GZ_RETURN_IF_ERROR(LoadReader(model, reader));
  GZ_ASSIGN_OR_RETURN(std::vector<std::vector<uint8_t>> bytes, ReadPictureFiles({file}));
  auto picture = (*reader)->PreparePicture(bytes[0]);
  if (!picture.ok()) return picture.status().Annotate(file);
  attached->push_back(std::move(picture).value());
  return Status::Ok();
}

Status AttachVideo(const Model& model, const std::string& words,
                   std::unique_ptr<PictureReader>* reader, std::vector<VisionInput>* attached) {
  std::istringstream in(words);
  std::string folder, rate, rest;
  in >> folder >> rate >> rest;
  if (folder.empty() || !rest.empty()) {
    return InvalidArgument("/video: give a folder of frames and, optionally, their rate");
  }
  std::optional<double> fps;
  if (!rate.empty()) {
    char* end = nullptr;
    const double value = std::strtod(rate.c_str(), &end);
    if (end != rate.c_str() + rate.size() || !(value > 0) || !std::isfinite(value)) {
      return InvalidArgument("/video: the rate " + rate +
                             " is not a positive number of frames a second");
    }
    fps = value;
  }
  GZ_RETURN_IF_ERROR(LoadReader(model, reader));
  auto frames = vision::ReadFrameFolder(folder, kMaxVideoFolderFrames, (*reader)->limits());
  if (!frames.ok()) return frames.status().Annotate(folder);
  auto video = (*reader)->PrepareVideo(*frames, fps);
  if (!video.ok()) return video.status().Annotate(folder);
  attached->push_back(std::move(video).value());
  return Status::Ok();
}

}  // namespace gizllm::cli
