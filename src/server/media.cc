#include "server/media.h"

#include <array>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "vision/video.h"

namespace gizllm::server {
namespace {

namespace fs = std::filesystem;

bool StartsWith(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  return out;
}

// A file:// URL's path with its %XX escapes decoded; nullopt for a malformed escape.
std::optional<std::string> PercentDecode(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out += s[i];
      continue;
    }
    if (i + 2 >= s.size()) return std::nullopt;
    auto hex = [](char c) -> int {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      return -1;
    };
    const int hi = hex(s[i + 1]), lo = hex(s[i + 2]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out += static_cast<char>(hi * 16 + lo);
    i += 2;
  }
  return out;
}

// Whether `url` names a network resource (any scheme but data: and file:).
bool IsNetworkUrl(std::string_view url) {
  const std::string lower = Lower(url.substr(0, 16));
  return StartsWith(lower, "http://") || StartsWith(lower, "https://") ||
         StartsWith(lower, "ftp://") || StartsWith(lower, "//");
}

// A data: URL's bytes: data:image/png;base64,....
Expected<std::vector<uint8_t>> ReadDataUrl(std::string_view url) {
  const size_t comma = url.find(',');
  if (comma == std::string_view::npos) {
    return InvalidArgument("a data: URL needs a ',' before its data");
  }
  const std::string header = Lower(url.substr(5, comma - 5));
  std::vector<std::string> fields;
  for (size_t start = 0;;) {
    const size_t semi = header.find(';', start);
    fields.push_back(header.substr(start, semi - start));
    if (semi == std::string::npos) break;
    start = semi + 1;
  }
  const std::string& type = fields[0];
  if (type != "image/png" && type != "image/jpeg" && type != "image/jpg" && type != "image/webp") {
    return InvalidArgument("a data: URL of type '" + (type.empty() ? "text/plain" : type) +
                           "': pictures are read from image/png, image/jpeg and image/webp");
  }
  bool base64 = false;
  for (size_t i = 1; i < fields.size(); ++i) base64 = base64 || fields[i] == "base64";
  if (!base64) return InvalidArgument("a data: URL must hold base64 data (';base64,')");
  std::optional<std::vector<uint8_t>> bytes = DecodeBase64(url.substr(comma + 1));
  if (!bytes) return InvalidArgument("the data: URL's data is not valid base64");
  if (bytes->empty()) return InvalidArgument("the data: URL holds no data");
  return std::move(*bytes);
}

}  // namespace

Status MediaOptions::Check() const {
  if (max_pictures < 0) return InvalidArgument("--max-pictures: expected 0 or more");
  if (max_frames < 0) return InvalidArgument("--max-video-frames: expected 0 or more");
  if (max_file_bytes <= 0) return InvalidArgument("media file limit: expected a positive size");
  if (!allowed_path.empty()) {
    std::error_code error;
    if (!fs::is_directory(allowed_path, error)) {
      return InvalidArgument("--allowed-media-path " + allowed_path + ": not a folder");
    }
  }
  return picture.Check();
}

std::optional<std::vector<uint8_t>> DecodeBase64(std::string_view text) {
  static const std::array<int8_t, 256> kValue = [] {
    std::array<int8_t, 256> v;
    v.fill(-1);
    const char* alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (int i = 0; i < 64; ++i) v[static_cast<uint8_t>(alphabet[i])] = static_cast<int8_t>(i);
    return v;
  }();
  size_t n = text.size();
  if (n % 4 == 0 && n >= 2 && text[n - 1] == '=') n -= text[n - 2] == '=' ? 2 : 1;
  if (n % 4 == 1) return std::nullopt;
  std::vector<uint8_t> out;
  out.reserve(n / 4 * 3 + 2);
  uint32_t bits = 0;
  int have = 0;
  for (size_t i = 0; i < n; ++i) {
    const int8_t v = kValue[static_cast<uint8_t>(text[i])];
    if (v < 0) return std::nullopt;
    bits = (bits << 6) | static_cast<uint32_t>(v);
    have += 6;
    if (have >= 8) {
      have -= 8;
      out.push_back(static_cast<uint8_t>(bits >> have));
    }
  }
  // The unused low bits of a last partial group must be zero (canonical base64).
  if ((bits & ((1u << have) - 1)) != 0) return std::nullopt;
  return out;
}

Expected<std::string> AllowedLocalPath(const std::string& url, const MediaOptions& options) {
  if (options.allowed_path.empty()) {
    return InvalidArgument(
        "local files are not read: the server was started without --allowed-media-path; send "
        "the picture as a data: URL");
  }
  std::string path = url;
  if (StartsWith(Lower(url.substr(0, 7)), "file://")) {
    std::string_view rest = std::string_view(url).substr(7);
    if (StartsWith(rest, "localhost/")) rest.remove_prefix(9);
    if (!StartsWith(rest, "/")) return InvalidArgument("a file:// URL must name an absolute path");
    std::optional<std::string> decoded = PercentDecode(rest);
    if (!decoded) return InvalidArgument("the file:// URL holds a malformed %-escape");
    path = *decoded;
  }
  std::error_code error;
  const fs::path root = fs::canonical(options.allowed_path, error);
  if (error)
    return Internal("--allowed-media-path " + options.allowed_path + ": " + error.message());
  const fs::path given = fs::path(path).is_absolute() ? fs::path(path) : root / path;
  const fs::path resolved = fs::canonical(given, error);
  // The same answer for a missing file and one outside the folder, so that a client learns
  // nothing of what lies outside it.
  const std::string refused = "'" + url + "' is not a file or folder under the allowed media path";
  if (error) return InvalidArgument(refused);
  const std::string r = resolved.string(), base = root.string();
  if (r != base && !StartsWith(r, base == "/" ? base : base + "/")) {
    return InvalidArgument(refused);
  }
  return r;
}

Expected<std::vector<uint8_t>> ReadPictureUrl(const std::string& url, const MediaOptions& options) {
  if (url.empty()) return InvalidArgument("the url is empty");
  if (StartsWith(Lower(url.substr(0, 5)), "data:")) return ReadDataUrl(url);
  if (IsNetworkUrl(url)) {
    return InvalidArgument(
        "the server fetches nothing from the network; send the picture as a data: URL "
        "(data:image/png;base64,...)");
  }
  GZ_ASSIGN_OR_RETURN(std::string path, AllowedLocalPath(url, options));
  std::error_code error;
  if (!fs::is_regular_file(path, error)) {
    return InvalidArgument("'" + url + "' is not a file");
  }
  const uintmax_t size = fs::file_size(path, error);
  if (error) return InvalidArgument("'" + url + "' cannot be read");
  if (size > static_cast<uintmax_t>(options.max_file_bytes)) {
    return InvalidArgument("'" + url + "' holds " + std::to_string(size) +
                           " bytes, over the limit of " + std::to_string(options.max_file_bytes));
  }
  std::ifstream in(path, std::ios::binary);
  std::vector<uint8_t> bytes(size);
  if (!in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(size))) {
    return InvalidArgument("'" + url + "' cannot be read");
  }
  return bytes;
}

std::optional<ApiError> PrepareMedia(const std::vector<MediaPart>& parts,
                                     const MediaOptions& options, const PictureReader& reader,
                                     std::vector<VisionInput>* out) {
  auto fail = [](const MediaPart& part, const std::string& why, const char* code) {
    return BadRequest("'" + part.param + "': " + why, part.param, code);
  };
  int pictures = 0;
  int64_t frames = 0;
  for (const MediaPart& part : parts) {
    if (part.kind == MediaKind::kPicture) {
      if (++pictures > options.max_pictures) {
        return fail(part,
                    "a request may hold at most " + std::to_string(options.max_pictures) +
                        " pictures (serve --max-pictures)",
                    "too_many_pictures");
      }
      Expected<std::vector<uint8_t>> bytes = ReadPictureUrl(part.url, options);
      if (!bytes.ok()) return fail(part, bytes.status().message(), "invalid_image_url");
      Expected<VisionInput> in = reader.PreparePicture(*bytes);
      if (!in.ok()) return fail(part, in.status().message(), "invalid_image");
      out->push_back(std::move(in).value());
      continue;
    }
    const int64_t left = options.max_frames - frames;
    const std::string over = "a request's videos may hold at most " +
                             std::to_string(options.max_frames) +
                             " frames together (serve --max-video-frames)";
    std::vector<vision::Picture> decoded;
    if (!part.frames.empty()) {
      if (static_cast<int64_t>(part.frames.size()) > left) {
        return fail(part, over, "too_many_frames");
      }
      for (size_t i = 0; i < part.frames.size(); ++i) {
        const MediaPart frame{MediaKind::kPicture,
                              part.param + ".frames[" + std::to_string(i) + "]"};
        Expected<std::vector<uint8_t>> bytes = ReadPictureUrl(part.frames[i], options);
        if (!bytes.ok()) return fail(frame, bytes.status().message(), "invalid_video_url");
        Expected<vision::Picture> picture = vision::DecodePicture(*bytes, reader.limits());
        if (!picture.ok()) return fail(frame, picture.status().message(), "invalid_video");
        decoded.push_back(std::move(picture).value());
      }
    } else {
      if (part.url.empty()) return fail(part, "the url is empty", "invalid_video_url");
      if (StartsWith(Lower(part.url.substr(0, 5)), "data:")) {
        return fail(part,
                    "a video is a folder of frame pictures under the allowed media path, or "
                    "'frames': a list of the frames' URLs",
                    "invalid_video_url");
      }
      if (IsNetworkUrl(part.url)) {
        return fail(part, "the server fetches nothing from the network", "invalid_video_url");
      }
      Expected<std::string> folder = AllowedLocalPath(part.url, options);
      if (!folder.ok()) return fail(part, folder.status().message(), "invalid_video_url");
      std::error_code error;
      if (!fs::is_directory(*folder, error)) {
        return fail(part, "'" + part.url + "' is not a folder of frames", "invalid_video_url");
      }
      // The frames too must lie in the allowed folder (a symlink among them may point out).
      for (const auto& entry : fs::directory_iterator(*folder, error)) {
        Expected<std::string> frame = AllowedLocalPath(entry.path().string(), options);
        if (!frame.ok()) {
          return fail(part,
                      "'" + part.url + "' holds " + entry.path().filename().string() +
                          ", which is not under the allowed media path",
                      "invalid_video_url");
        }
      }
      Expected<std::vector<vision::Picture>> read =
          vision::ReadFrameFolder(*folder, left, reader.limits());
      if (!read.ok()) {
        // The folder's own path is the server's business: name what the client gave.
        std::string why = read.status().message();
        if (StartsWith(why, *folder)) why = "'" + part.url + "'" + why.substr(folder->size());
        const bool too_many = why.find("over the limit of") != std::string::npos &&
                              why.find(" frames, ") != std::string::npos;
        return fail(part, too_many ? over : why, too_many ? "too_many_frames" : "invalid_video");
      }
      decoded = std::move(read).value();
    }
    frames += static_cast<int64_t>(decoded.size());
    Expected<VisionInput> in = reader.PrepareVideo(decoded, part.fps);
    if (!in.ok()) return fail(part, in.status().message(), "invalid_video");
    out->push_back(std::move(in).value());
  }
  return std::nullopt;
}

}  // namespace gizllm::server
