// Pictures and videos of a chat request (content parts of type image_url and video_url): where
// their bytes come from and what they may cost.
//
// A picture's url is a data: URL with base64 data (image/png, image/jpeg or image/webp), or,
// only when the server was started with an allowed folder (serve --allowed-media-path DIR), a
// local file: a file:// URL or a path (relative paths are read from the folder), which must lie
// in the folder once symlinks and ".." are resolved. http(s) URLs are refused: the server
// fetches nothing from the network. A video is a folder of frame pictures (read in name order)
// under the allowed folder, or a list of frame URLs (data: URLs, or files under the folder),
// with the rate the frames were taken at (`fps`; unknown: transformers' 24).
//
// Every error is a 400 that names the request part ("messages[1].content[0].image_url").
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "model/picture_prompt.h"
#include "server/api_error.h"
#include "vision/picture.h"

namespace gizllm::server {

struct MediaOptions {
  // Local files are read from under this folder only; empty: no local files.
  std::string allowed_path;
  int max_pictures = 16;     // picture parts in one request
  int64_t max_frames = 256;  // video frames in one request, all its videos together
  int64_t max_file_bytes = int64_t{64} << 20;  // a local picture file
  vision::PictureLimits picture;               // each picture and frame: pixels, decoded bytes

  Status Check() const;
};

enum class MediaKind : uint8_t { kPicture, kVideo };

// One image_url or video_url content part, as the request gives it.
struct MediaPart {
  MediaKind kind = MediaKind::kPicture;
  std::string param;                // "messages[1].content[0].image_url"
  std::string url;                  // a picture, or a video's folder
  std::vector<std::string> frames;  // a video given as its frames' URLs
  std::optional<double> fps;        // a video's frame rate
};

// Decodes base64 (the standard alphabet, '=' padding optional); nullopt when it is not base64.
std::optional<std::vector<uint8_t>> DecodeBase64(std::string_view text);

// The path of a local file URL (file://... or a path) inside options.allowed_path, resolved
// (symlinks, ".."); an error when local files are off, the file does not exist, or it lies
// outside the folder.
Expected<std::string> AllowedLocalPath(const std::string& url, const MediaOptions& options);

// A picture URL's bytes: a data: URL decoded, or an allowed local file read.
Expected<std::vector<uint8_t>> ReadPictureUrl(const std::string& url, const MediaOptions& options);

// The parts' pictures and videos read, decoded and preprocessed by `reader`, in order; an error
// names the part and says what is wrong (limits included: pictures and frames per request).
std::optional<ApiError> PrepareMedia(const std::vector<MediaPart>& parts,
                                     const MediaOptions& options, const PictureReader& reader,
                                     std::vector<VisionInput>* out);

}  // namespace gizllm::server
