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
  int64_t next = 0;  // the position of the next text row
  size_t picture = 0;
  for (int64_t i = 0; i < n;) {
    if (tokens[i] == arch.video_token) {
      return Unimplemented("prompt token " + std::to_string(i) +
                           " is a video placeholder: videos are not read yet");
    }
    if (tokens[i] != arch.image_token) {
      p.t[i] = p.h[i] = p.w[i] = static_cast<int32_t>(next++);
      ++i;
      continue;
    }
    if (picture == grids.size()) {
      return InvalidArgument("prompt token " + std::to_string(i) +
                             " is an image placeholder beyond the " + std::to_string(grids.size()) +
                             " pictures given");
    }
    const VisionGrid& g = grids[picture];
    GZ_RETURN_IF_ERROR(CheckVisionGrid(arch, g, static_cast<int>(picture)));
    const int64_t gh = g.h / arch.merge, gw = g.w / arch.merge;
    const int64_t count = VisionTokens(arch, g);
    if (i + count > n || std::any_of(tokens.begin() + i, tokens.begin() + i + count,
                                     [&](int32_t t) { return t != arch.image_token; })) {
      return InvalidArgument("picture " + std::to_string(picture) + " at prompt token " +
                             std::to_string(i) + " needs " + std::to_string(count) +
                             " image placeholders in a row");
    }
    p.picture_rows.push_back(i);
    for (int64_t f = 0; f < g.t; ++f) {
      for (int64_t y = 0; y < gh; ++y) {
        for (int64_t x = 0; x < gw; ++x, ++i) {
          p.t[i] = static_cast<int32_t>(next + f);
          p.h[i] = static_cast<int32_t>(next + y);
          p.w[i] = static_cast<int32_t>(next + x);
        }
      }
    }
    next += std::max({g.t, gh, gw});
    ++picture;
  }
  if (picture != grids.size()) {
    return InvalidArgument("the prompt holds image placeholders for " + std::to_string(picture) +
                           " pictures, " + std::to_string(grids.size()) + " given");
  }
  if (next > INT32_MAX) return InvalidArgument("prompt positions overflow");
  p.next = static_cast<int32_t>(next);
  return p;
}

}  // namespace gizllm
