// Resizing 8-bit pictures the way torchvision's resize does on a uint8 tensor on the CPU
// (bicubic, antialias=True), which is what the Hugging Face "fast" image processors call:
// torch's separable antialiased filter (aten/src/ATen/native/cpu/UpSampleKernel.cpp) with
// Pillow's support and centering and Keys' cubic at a = -0.5, its weights normalized in
// double and rounded to int16 at a precision chosen per axis, each output an integer dot
// product plus half a unit, shifted down and clamped to 0..255; the width first, its result
// kept as uint8, then the height. The same values bit for bit, so PNG pixels come out as the
// processor's.
#pragma once

#include <cstdint>
#include <vector>

#include "vision/picture.h"

namespace gizllm::vision {

// A picture as planes: channel after channel, rows top to bottom (torch's CHW).
struct Planes {
  int channels = 0;
  int height = 0;
  int width = 0;
  std::vector<uint8_t> data;  // [channels, height, width]

  uint8_t at(int c, int y, int x) const { return data[(size_t(c) * height + y) * width + x]; }
};

// RGB rows to 3 planes.
Planes ToPlanes(const Picture& picture);

// One axis of the resample: for each output index the first input index, how many inputs it
// reads, and their int16 weights, scaled by 2^precision.
struct ResampleAxis {
  int taps = 0;                  // weights per output (the widest any output needs)
  int precision = 0;             // bits of the fixed-point weights
  std::vector<int> first;        // [outputs]
  std::vector<int> count;        // [outputs], each <= taps
  std::vector<int16_t> weights;  // [outputs, taps]
};

// torch's _compute_index_ranges_int16_weights for bicubic, antialias=True, align_corners=False
// and no scale factor given (the scale is input / output).
ResampleAxis BicubicAntialiasAxis(int input_size, int output_size);

// `in` resized to height x width. Sizes equal to the input's are copied.
Planes ResizeBicubicAntialias(const Planes& in, int height, int width);

}  // namespace gizllm::vision
