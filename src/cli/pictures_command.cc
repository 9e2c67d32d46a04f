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
  GZ_ASSIGN_OR_RETURN(std::vector<std::vector<uint8_t>> bytes, ReadPictureFiles(files));
  std::vector<VisionInput> inputs;
  for (size_t i = 0; i < bytes.size(); ++i) {
    auto in = (*reader)->PreparePicture(bytes[i]);
    if (!in.ok()) return in.status().Annotate("picture " + std::to_string(i + 1));
    inputs.push_back(std::move(in).value());
  }
  for (size_t i = 0; i < videos.size(); ++i) {
    const std::string which = "video " + std::to_string(i + 1);
    auto frames =
        vision::ReadFrameFolder(videos[i].folder, kMaxVideoFolderFrames, (*reader)->limits());
    if (!frames.ok()) return frames.status().Annotate(which);
    auto in = (*reader)->PrepareVideo(*frames, videos[i].fps);
    if (!in.ok()) return in.status().Annotate(which);
    inputs.push_back(std::move(in).value());
  }
  GZ_ASSIGN_OR_RETURN(ChatTemplate chat_template, ChatTemplate::Load(model.dir()));
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  messages.push_back(
      {{"role", "user"}, {"content", PictureContent(files.size(), prompt, videos.size())}});
  const nlohmann::ordered_json input = {{"messages", messages}, {"add_generation_prompt", true}};
  GZ_ASSIGN_OR_RETURN(ChatPrompt chat, ChatPrompt::Render(chat_template, tokenizer, input, 0));
  GZ_ASSIGN_OR_RETURN(PlacedPrompt placed,
                      (*reader)->Place(chat.tokens, std::move(inputs), [&](const std::string& t) {
                        return tokenizer.Encode(t, /*add_special=*/false);
                      }));
  return (*reader)->Read(std::move(placed));
}

Status AttachPicture(const Model& model, const std::string& file,
                     std::unique_ptr<PictureReader>* reader,
                     std::vector<std::vector<uint8_t>>* attached) {
  if (file.empty()) return InvalidArgument("/image: give a picture file");
  if (!*reader) {
    auto loaded = PictureReader::Load(model.dir(), model.shared_backend());
    if (!loaded.ok()) return loaded.status().Annotate("pictures need a vision tower");
    *reader = std::move(*loaded);
  }
  GZ_ASSIGN_OR_RETURN(std::vector<std::vector<uint8_t>> bytes, ReadPictureFiles({file}));
  auto picture = vision::DecodePicture(bytes[0]);
  if (!picture.ok()) return picture.status().Annotate(file);
  attached->push_back(std::move(bytes[0]));
  return Status::Ok();
}

int32_t ExpandedPosition(const std::vector<int32_t>& tokens, const std::vector<int32_t>& expanded,
                         int32_t image_token, int32_t position) {
  if (position < 0) return position;
  size_t j = 0;
  for (size_t i = 0; i < tokens.size() && i < static_cast<size_t>(position); ++i) {
    if (tokens[i] != image_token) {
      ++j;
      continue;
    }
    while (j < expanded.size() && expanded[j] == image_token) ++j;
  }
  return static_cast<int32_t>(j);
}

}  // namespace gizllm::cli
