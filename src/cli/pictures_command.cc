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

}  // namespace gizllm::cli
