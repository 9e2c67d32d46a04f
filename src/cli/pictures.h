// Pictures and videos given on the command line (run --image and --video, chat /image and /video):
// the files read and put before the text of a user message, as Qwen3-VL's and Qwen3.5's chat
// templates show image content parts, and the prompt's placeholders expanded by the model's vision
// tower.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/model.h"
#include "model/picture_prompt.h"
#include "template/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace gizllm::cli {

// A user message's content: one {"type": "image"} part per picture, one {"type": "video"} part
// per video, then the text.
nlohmann::ordered_json PictureContent(size_t pictures, const std::string& text, size_t videos = 0);

// A video given as a folder of its frames (pictures, in name order) taken at `fps` frames a
// second (nullopt: unknown, transformers' 24 assumed).
struct VideoFolder {
  std::string folder;
  std::optional<double> fps;
};

// The most frames a video folder may hold.
inline constexpr int64_t kMaxVideoFolderFrames = 4096;

// The files' bytes; an error names the file that cannot be read.
Expected<std::vector<std::vector<uint8_t>>> ReadPictureFiles(const std::vector<std::string>& files);

// `prompt` with the pictures in `files` as one user message of the model's chat template (with
// the generation prompt), tokenized, the placeholders expanded and the pictures read by the
// tower. Errors: a model without a vision tower, a file that cannot be read, a bad picture
// ("picture 2: PNG truncated"), a template that does not show every picture.
// With `videos`, each one's frames are sampled as the model's video_preprocessor_config.json
// says and its temporal patches placed after their timestamps ("video 1: ..." in errors).
Expected<PicturePrompt> PicturePromptTokens(const Model& model, const Tokenizer& tokenizer,
                                            const std::string& prompt,
                                            const std::vector<std::string>& files,
                                            const std::vector<VideoFolder>& videos = {});

// Where PicturePromptTokens' time went (seconds).
struct PictureTimes {
  double prepare = 0;  // files read, decoded and preprocessed; the template rendered, placed
  double decode = 0;   // of which: files read, decoded and preprocessed
  double tower = 0;    // the tower run and its rows placed
};

// The same with a tower already loaded (a benchmark reads many prompts with one); `times`, where
// given, gets the time of each part.
Expected<PicturePrompt> PicturePromptTokens(PictureReader& reader, const Model& model,
                                            const Tokenizer& tokenizer, const std::string& prompt,
                                            const std::vector<std::string>& files,
                                            const std::vector<VideoFolder>& videos = {},
                                            PictureTimes* times = nullptr);

// chat's /image FILE: reads the file, decodes and preprocesses it (so a bad picture is refused
// now, naming the file), loads the model's tower into `reader` the first time, and adds the
// picture to `attached`.
Status AttachPicture(const Model& model, const std::string& file,
                     std::unique_ptr<PictureReader>* reader, std::vector<VisionInput>* attached);

// chat's /video FOLDER [FPS]: the folder's frames (taken at FPS frames a second; without it,
// transformers' 24 assumed) read, sampled and preprocessed as the model's
// video_preprocessor_config.json says, added to `attached`; errors name the folder.
Status AttachVideo(const Model& model, const std::string& words,
                   std::unique_ptr<PictureReader>* reader, std::vector<VisionInput>* attached);

}  // namespace gizllm::cli
