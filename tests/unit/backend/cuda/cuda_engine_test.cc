// The Engine on the CUDA backend with tiny-chat: tokens picked on the device equal the host
// Sampler's picks from the same logits (seeded sampling under top-k, top-p, min-p and greedy),
// greedy tokens equal the CPU backend's, and Warm leaves the engine as it found it. Skipped
// without a CUDA device.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "engine/engine.h"
#include "model/model.h"
#include "ops/device.h"

namespace gizllm {
namespace {

#define GZ_SKIP_WITHOUT_CUDA()                                               \
  do {                                                                       \
    if (CudaDeviceCount() == 0)                                              \
      GTEST_SKIP() << "no CUDA device was found: CUDA engine tests skipped"; \
  } while (0)

std::unique_ptr<Model> Load(const std::string& device_name, bool exact) {
  DeviceOptions device;
  device.device = device_name;
  device.exact = exact;
  auto backend = OpenBackend(device);
  EXPECT_TRUE(backend.ok()) << backend.status().message();
  if (!backend.ok()) return nullptr;
  auto model = Model::Load("models/tiny-chat", *backend);
  EXPECT_TRUE(model.ok()) << model.status().message();
  return model.ok() ? std::move(*model) : nullptr;
}

std::vector<Request> Requests(bool sampled) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int32_t> token(10, 8000);
  std::vector<Request> out;
  for (int i = 0; i < 12; ++i) {
    Request r;
    r.prompt.resize(3 + rng() % 60);
    for (int32_t& t : r.prompt) t = token(rng);
    r.limit = 24 + i;
    r.stop = std::vector<int32_t>{};
    r.sampling.temperature = 0.0f;
    if (sampled && i % 3 != 0) {
      r.sampling.temperature = 0.7f + 0.1f * (i % 4);
      r.sampling.top_k = i % 2 ? 40 : 0;
      r.sampling.top_p = i % 4 == 1 ? 0.9f : 1.0f;
      r.sampling.min_p = i % 5 == 2 ? 0.05f : 0.0f;
      r.sampling.seed = 1000 + i;
    }
    out.push_back(r);
  }
  return out;
}

std::vector<std::vector<int32_t>> Generate(Model& model, const std::vector<Request>& requests,
                                           bool device_sampling, bool warm, int64_t* device_steps) {
  EngineOptions options;
  options.slots = 5;
  options.context = 256;
  options.rows = 64;
  options.device_sampling = device_sampling;
  auto engine = Engine::Create(&model, options);
  EXPECT_TRUE(engine.ok()) << engine.status().message();
  if (!engine.ok()) return {};
  if (warm) {
    Status st = (*engine)->Warm();
    EXPECT_TRUE(st.ok()) << st.message();
  }
  auto out = (*engine)->Generate(requests);
  EXPECT_TRUE(out.ok()) << out.status().message();
  if (device_steps) *device_steps = (*engine)->stats().device_sampled;
  return out.ok() ? *out : std::vector<std::vector<int32_t>>{};
}

TEST(CudaEngine, DevicePicksEqualHostPicks) {
  GZ_SKIP_WITHOUT_CUDA();
  auto model = Load("cuda", /*exact=*/false);
  ASSERT_TRUE(model);
  ASSERT_TRUE(model->CanSample());
  const auto requests = Requests(/*sampled=*/true);
  int64_t device_steps = 0, host_steps = 0;
  const auto device = Generate(*model, requests, true, false, &device_steps);
  const auto host = Generate(*model, requests, false, false, &host_steps);
  ASSERT_EQ(device.size(), requests.size());
  EXPECT_GT(device_steps, 20);
  EXPECT_EQ(host_steps, 0);
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(device[i], host[i]) << "request " << i;
    EXPECT_EQ(static_cast<int64_t>(device[i].size()), requests[i].limit);
  }
}

TEST(CudaEngine, GreedyEqualsCpuAndWarmChangesNothing) {
  GZ_SKIP_WITHOUT_CUDA();
  auto cpu = Load("cpu", true);
  auto cuda = Load("cuda", /*exact=*/true);
  ASSERT_TRUE(cpu && cuda);
  const auto requests = Requests(/*sampled=*/false);
  const auto want = Generate(*cpu, requests, true, false, nullptr);
  const auto cold = Generate(*cuda, requests, true, false, nullptr);
  const auto warmed = Generate(*cuda, requests, true, true, nullptr);
  ASSERT_EQ(want.size(), requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(cold[i], want[i]) << "request " << i;
    EXPECT_EQ(warmed[i], want[i]) << "request " << i;
  }
}

}  // namespace
}  // namespace gizllm
