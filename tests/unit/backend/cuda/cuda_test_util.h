// Helpers of the CUDA op tests: random host data, device copies, poisoned outputs, and the
// relative error of a result against the CPU reference.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "core/dtype.h"
#include "ops/backend.h"

namespace gizllm::testing {

// Skips the test (with the reason) where no CUDA device is found.
#define GZ_SKIP_WITHOUT_CUDA()                                           \
  do {                                                                   \
    if (::gizllm::CudaDeviceCount() == 0)                                \
      GTEST_SKIP() << "no CUDA device was found: CUDA op tests skipped"; \
  } while (0)

inline std::unique_ptr<Backend> MakeBackend(bool exact, int gemv_max_rows = 8) {
  CudaOptions options;
  options.exact = exact;
  options.gemv_max_rows = gemv_max_rows;
  auto backend = MakeCudaBackend(options);
  EXPECT_TRUE(backend.ok()) << backend.status().message();
  return backend.ok() ? std::move(backend).value() : nullptr;
}

inline std::vector<float> RandomFloats(std::mt19937& rng, size_t n, float scale = 1.0f) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Values that are exact in bf16, so host and device read the same numbers.
inline std::vector<uint16_t> ToBf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = F32ToBf16(v[i]);
  return out;
}

// A random [n, cols] weight of a plain format (bf16, f16 or f32) on the host (`host` points into
// `values` or `halves`) and as the backend placed it (`device`).
struct PlainWeight {
  std::vector<float> values;
  std::vector<uint16_t> halves;
  Weight host, device;
  std::unique_ptr<Buffer> storage;
};

inline void MakePlainWeight(Backend* backend, std::mt19937& rng, Format format, int64_t n,
                            int64_t cols, PlainWeight* w) {
  w->values = RandomFloats(rng, n * cols, 0.05f);
  if (format == Format::kBf16) w->halves = ToBf16(w->values);
  if (format == Format::kF16) {
    w->halves.resize(w->values.size());
    for (size_t j = 0; j < w->values.size(); ++j) w->halves[j] = F32ToF16(w->values[j]);
  }
  w->host = Weight{format, n, cols};
  w->host.data = format == Format::kF32 ? static_cast<const void*>(w->values.data())
                                        : static_cast<const void*>(w->halves.data());
  auto prepared = backend->PrepareWeight(w->host, &w->storage);
  ASSERT_TRUE(prepared.ok()) << prepared.status().message();
  w->device = *prepared;
}

// A device array with a host mirror.
template <typename T>
class DeviceArray {
 public:
  DeviceArray(Backend* backend, std::vector<T> host) : backend_(backend), host_(std::move(host)) {
    auto buffer = backend->Allocate(host_.size() * sizeof(T) + 16);
    EXPECT_TRUE(buffer.ok());
    buffer_ = std::move(buffer).value();
    backend_->CopyToDevice(buffer_->data(), host_.data(), host_.size() * sizeof(T));
  }
  // NaN bytes on the device (outputs), the host mirror left as it is.
  void Poison() {
    std::vector<uint8_t> junk(host_.size() * sizeof(T), 0xff);
    backend_->CopyToDevice(buffer_->data(), junk.data(), junk.size());
  }
  std::vector<T> Read() {
    std::vector<T> out(host_.size());
    backend_->CopyToHost(out.data(), buffer_->data(), out.size() * sizeof(T));
    return out;
  }
  T* device() { return static_cast<T*>(buffer_->data()); }
  std::vector<T>& host() { return host_; }
  size_t size() const { return host_.size(); }

 private:
  Backend* backend_;
  std::vector<T> host_;
  std::unique_ptr<Buffer> buffer_;
};

// ||got - want|| / ||want||; infinity when any value is not finite.
inline double RelativeError(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    double d = static_cast<double>(got[i]) - want[i];
    diff += d * d;
    norm += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
}

}  // namespace gizllm::testing
