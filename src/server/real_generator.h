// The server's interfaces on the real pieces: EngineGenerator drives an Engine; ChatTextModel
// is a Tokenizer and a ChatTemplate (prompts through gizllm::ChatPrompt).
#pragma once

#include <list>
#include <memory>
#include <set>
#include <string>

#include "engine/engine.h"
#include "grammar/token_mask.h"
#include "server/generator.h"
#include "template/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace gizllm::server {

class EngineGenerator : public Generator {
 public:
  // tokenizer: the model's, whose tokens' bytes requests with a grammar are matched on (read at
  // the first such request).
  EngineGenerator(std::unique_ptr<Engine> engine, Tokenizer tokenizer)
      : engine_(std::move(engine)), tokenizer_(std::move(tokenizer)) {}
  Expected<int64_t> Add(GenerateRequest request) override;
  Expected<std::vector<GenerateProgress>> Advance() override;
  void Cancel(int64_t id) override;
  bool Busy() const override { return engine_->Busy(); }
  // Where requests with pictures or videos have the tower run (the one the text side prepares
  // them with).
  void SetPictures(std::shared_ptr<PictureReader> pictures) { pictures_ = std::move(pictures); }
  GeneratorStats Stats() const override;
  Engine& engine() { return *engine_; }

 private:
  std::unique_ptr<Engine> engine_;
  Tokenizer tokenizer_;
  std::shared_ptr<const TokenVocabulary> vocabulary_;  // built at the first grammar
  // The grammars of recent requests by their text (Grammar::ToString), most recent last:
  // requests with the same schema or grammar share one TokenGrammar and so its masks.
  std::list<std::pair<std::string, std::shared_ptr<const TokenGrammar>>> grammars_;
  static constexpr size_t kGrammars = 32;
  int64_t shared_masks_gone_ = 0;  // SharedMasks::hits of the grammars dropped from grammars_
  std::shared_ptr<PictureReader> pictures_;            // null: the model has no tower
  std::set<int64_t> active_;                           // added, not ended
  std::set<int64_t> reported_;  // active requests whose first progress went out
};

class ChatTextModel : public TextModel {
 public:
  // name: what clients call the model (--served-name, else the folder's name).
  ChatTextModel(std::string name, int32_t context, Tokenizer tokenizer, ChatTemplate chat,
                int32_t vocab)
      : name_(std::move(name)),
        context_(context),
        tokenizer_(std::move(tokenizer)),
        template_(std::move(chat)),
        vocab_(vocab),
        syntax_(ToolCallSyntaxOf(template_.source())),
        reasons_(template_.source().find("<think>") != std::string::npos) {}
  // Reads the tokenizer and chat template of a model folder.
  static Expected<std::unique_ptr<ChatTextModel>> Load(const std::string& dir, std::string name,
                                                       int32_t context, int32_t vocab);

  std::string Name() const override { return name_; }
  int32_t Context() const override { return context_; }
  int32_t Vocab() const override { return vocab_; }
  Expected<std::vector<int32_t>> Tokenize(std::string_view text) const override;
  Expected<std::string> Detokenize(std::span<const int32_t> tokens) const override;
  Expected<ChatPrompt> RenderChat(const ChatInput& input) const override;
  ToolCallSyntax ToolSyntax() const override { return syntax_; }
  bool Reasons() const override { return reasons_; }
  const Tokenizer& tokenizer() const { return tokenizer_; }
  const PictureReader* Pictures() const override { return pictures_.get(); }
  Expected<ChatPrompt> WriteVideos(const ChatPrompt& prompt,
                                   const std::vector<VisionInput>& media) const override;
  void SetPictures(std::shared_ptr<PictureReader> pictures) { pictures_ = std::move(pictures); }

 private:
  std::string name_;
  int32_t context_;
  Tokenizer tokenizer_;
  ChatTemplate template_;
  int32_t vocab_;
  ToolCallSyntax syntax_;  // from the template's text
  bool reasons_;           // the template's text writes <think>
  std::shared_ptr<PictureReader> pictures_;
};

}  // namespace gizllm::server
