#include "model/mrope.h"

#include <algorithm>

#include "model/vision_tower.h"

namespace gizllm {

Expected<MropePositions> ComputeMropePositions(const VisionArch& arch,
                                               std::span<const int32_t> tokens,
                                               std::span<const VisionGrid> grids) {
  MropePositions p;
  const int64_t n = static_cast<int64_t>(tokens.size());
  p.t.resize(n);
  p.h.resize(n);
  p.w.resize(n);
  int64_t next = 0;    // the position of the next text row
  size_t picture = 0;  // index into grids
  int64_t frame = 0;   // the video's temporal patches placed so far
  for (int64_t i = 0; i < n;) {
    const bool image = tokens[i] == arch.image_token, video = tokens[i] == arch.video_token;
    if (!image && !video) {
      p.t[i] = p.h[i] = p.w[i] = static_cast<int32_t>(next++);
      ++i;
      continue;
    }
    const char* kind = image ? "image" : "video";
    if (picture == grids.size()) {
      return InvalidArgument("prompt token " + std::to_string(i) + " is an " + kind +
                             " placeholder beyond the " + std::to_string(grids.size()) +
                             " pictures and videos given");
    }
    const VisionGrid& g = grids[picture];
    if (g.video != video) {
      return InvalidArgument("prompt token " + std::to_string(i) + " is " +
                             (video ? "a video" : "an image") + " placeholder where " +
                             (g.video ? "video " : "picture ") + std::to_string(picture + 1) +
                             " is due");
    }
    GZ_RETURN_IF_ERROR(CheckVisionGrid(arch, g, static_cast<int>(picture)));
    const int64_t gh = g.h / arch.merge, gw = g.w / arch.merge;
    const int64_t frames = video ? 1 : g.t;  // in this run of placeholders
    const int64_t count = frames * gh * gw;
    const int32_t token = tokens[i];
    if (i + count > n || std::any_of(tokens.begin() + i, tokens.begin() + i + count,
                                     [&](int32_t t) { return t != token; })) {
      return InvalidArgument((video ? "video " : "picture ") + std::to_string(picture + 1) +
                             " at prompt token " + std::to_string(i) + " needs " +
                             std::to_string(count) + " " + kind + " placeholders in a row");
    }
    p.picture_rows.push_back(i);
    for (int64_t f = 0; f < frames; ++f) {
      for (int64_t y = 0; y < gh; ++y) {
        for (int64_t x = 0; x < gw; ++x, ++i) {
          p.t[i] = static_cast<int32_t>(next + f);
          p.h[i] = static_cast<int32_t>(next + y);
          p.w[i] = static_cast<int32_t>(next + x);
        }
      }
    }
    next += std::max({frames, gh, gw});
    if (!video || ++frame == g.t) {
      ++picture;
      frame = 0;
    }
  }
  if (picture != grids.size()) {
    return InvalidArgument("the prompt holds placeholders for " + std::to_string(picture) +
                           " pictures and videos, " + std::to_string(grids.size()) + " given");
  }
  if (next > INT32_MAX) return InvalidArgument("prompt positions overflow");
  p.next = static_cast<int32_t>(next);
  return p;
}

}  // namespace gizllm
