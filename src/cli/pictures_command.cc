#include "cli/pictures.h"
#include "core/mapped_file.h"
#include "template/chat_prompt.h"

namespace gizllm::cli {

nlohmann::ordered_json PictureContent(size_t pictures, const std::string& text) {
  nlohmann::ordered_json content = nlohmann::ordered_json::array();
  for (size_t i = 0; i < pictures; ++i) content.push_back({{"type", "image"}});
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
                                            const std::vector<std::string>& files) {
  auto reader = PictureReader::Load(model.dir(), model.shared_backend());
  if (!reader.ok()) return reader.status().Annotate("pictures need a vision tower");
  GZ_ASSIGN_OR_RETURN(std::vector<std::vector<uint8_t>> bytes, ReadPictureFiles(files));
  GZ_ASSIGN_OR_RETURN(ChatTemplate chat_template, ChatTemplate::Load(model.dir()));
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  messages.push_back({{"role", "user"}, {"content", PictureContent(files.size(), prompt)}});
  const nlohmann::ordered_json input = {{"messages", messages}, {"add_generation_prompt", true}};
  GZ_ASSIGN_OR_RETURN(ChatPrompt chat, ChatPrompt::Render(chat_template, tokenizer, input, 0));
  return (*reader)->Expand(chat.tokens, bytes);
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
