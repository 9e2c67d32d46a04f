// torch's uint8 antialiased bicubic resample: the weights per axis, then the two passes.
#include "vision/resize.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"

namespace gizllm::vision {
namespace {

// Keys' cubic convolution with a = -0.5 (Pillow's and torch's antialiasing filter), in
// torch's order of operations (cubic_convolution1 / cubic_convolution2 of UpSample.h).
double Cubic(double x) {
  constexpr double a = -0.5;
  x = std::abs(x);
  if (x < 1.0) return ((a + 2) * x - (a + 3)) * x * x + 1;
  if (x < 2.0) return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a;
  return 0.0;
}

// One output: the int16 weights over `count` inputs `stride` apart, plus half a unit, shifted
// down and clamped (basic_loop_aa_horizontal / vertical of uint8).
uint8_t Dot(const uint8_t* in, int64_t stride, const int16_t* w, int count, int precision) {
  int32_t sum = int32_t{1} << (precision - 1);
  for (int j = 0; j < count; ++j) sum += int32_t{in[j * stride]} * w[j];
  return static_cast<uint8_t>(std::clamp(sum >> precision, 0, 255));
}

}  // namespace

Planes ToPlanes(const Picture& picture) {
  Planes p{3, picture.height, picture.width, {}};
  const size_t n = size_t(picture.width) * picture.height;
  p.data.resize(3 * n);
  for (size_t i = 0; i < n; ++i) {
    for (int c = 0; c < 3; ++c) p.data[c * n + i] = picture.rgb[3 * i + c];
  }
  return p;
}

ResampleAxis BicubicAntialiasAxis(int input_size, int output_size) {
  CHECK(input_size > 0 && output_size > 0);
  const double scale = static_cast<double>(input_size) / output_size;
  // The filter widens with the scale when shrinking (antialiasing): support 2 * scale.
  constexpr int kInterpSize = 4;
  const double support = scale >= 1.0 ? (kInterpSize * 0.5) * scale : kInterpSize * 0.5;
  const double invscale = scale >= 1.0 ? 1.0 / scale : 1.0;
  ResampleAxis axis;
  axis.taps = static_cast<int>(std::ceil(support)) * 2 + 1;
  axis.first.resize(output_size);
  axis.count.resize(output_size);
  std::vector<double> weights(size_t(output_size) * axis.taps, 0.0);
  double max_weight = 0.0;
  for (int i = 0; i < output_size; ++i) {
    const double center = scale * (i + 0.5);
    // The window's ends truncated toward zero, as torch's static_cast<int64_t> does.
    const int64_t first = std::max<int64_t>(static_cast<int64_t>(center - support + 0.5), 0);
    int64_t count =
        std::min<int64_t>(static_cast<int64_t>(center + support + 0.5), input_size) - first;
    count = std::clamp<int64_t>(count, 0, axis.taps);
    double* w = weights.data() + size_t(i) * axis.taps;
    double total = 0.0;
    for (int64_t j = 0; j < count; ++j) {
      w[j] = Cubic((j + first - center + 0.5) * invscale);
      total += w[j];
    }
    if (total != 0.0) {
      for (int64_t j = 0; j < count; ++j) {
        w[j] /= total;
        max_weight = std::max(max_weight, w[j]);
      }
    }
    axis.first[i] = static_cast<int>(first);
    axis.count[i] = static_cast<int>(count);
  }
  // The most bits under which the largest weight, doubled, still fits in int16.
  int precision = 0;
  for (; precision < 22; ++precision) {
    const int next = static_cast<int>(0.5 + max_weight * (1 << (precision + 1)));
    if (next >= (1 << 15)) break;
  }
  CHECK(precision > 0);
  axis.precision = precision;
  axis.weights.resize(weights.size());
  for (size_t k = 0; k < weights.size(); ++k) {
    const double v = weights[k] * (1 << precision);
    axis.weights[k] =
        static_cast<int16_t>(v < 0 ? static_cast<int>(-0.5 + v) : static_cast<int>(0.5 + v));
  }
  return axis;
}

Planes ResizeBicubicAntialias(const Planes& in, int height, int width) {
  CHECK(height > 0 && width > 0);
  if (height == in.height && width == in.width) return in;
  Planes mid = in;
  // Rows first (the contiguous axis), each output rounded to uint8 before the columns.
  if (width != in.width) {
    const ResampleAxis axis = BicubicAntialiasAxis(in.width, width);
    mid.width = width;
    mid.data.assign(size_t(in.channels) * in.height * width, 0);
    for (int c = 0; c < in.channels; ++c) {
      for (int y = 0; y < in.height; ++y) {
        const uint8_t* row = in.data.data() + (size_t(c) * in.height + y) * in.width;
        uint8_t* out = mid.data.data() + (size_t(c) * in.height + y) * width;
        for (int x = 0; x < width; ++x) {
          out[x] = Dot(row + axis.first[x], 1, axis.weights.data() + size_t(x) * axis.taps,
                       axis.count[x], axis.precision);
        }
      }
    }
  }
  if (height == in.height) return mid;
  const ResampleAxis axis = BicubicAntialiasAxis(in.height, height);
  Planes out{in.channels, height, width, {}};
  out.data.assign(size_t(in.channels) * height * width, 0);
  for (int c = 0; c < in.channels; ++c) {
    const uint8_t* plane = mid.data.data() + size_t(c) * mid.height * width;
    for (int y = 0; y < height; ++y) {
      uint8_t* row = out.data.data() + (size_t(c) * height + y) * width;
      const uint8_t* column = plane + size_t(axis.first[y]) * width;
      const int16_t* w = axis.weights.data() + size_t(y) * axis.taps;
      for (int x = 0; x < width; ++x) {
        row[x] = Dot(column + x, width, w, axis.count[y], axis.precision);
      }
    }
  }
  return out;
}

}  // namespace gizllm::vision
