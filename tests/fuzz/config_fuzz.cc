// config.json into an Arch: the input is the file's text, parsed as ReadArch parses it, then read
// by its family's recipe; on success, what the model's loader computes from the Arch.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "fuzz_input.h"
#include "model/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const nlohmann::json config =
      nlohmann::json::parse(gizllm::fuzz::AsText(data, size), nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded()) return 0;
  gizllm::Expected<gizllm::Arch> arch = gizllm::ParseArch(config, "config.json");
  if (!arch.ok()) {
    CHECK(!arch.status().message().empty());
    return 0;
  }
  CHECK(arch->layers > 0 && static_cast<int>(arch->layer.size()) == arch->layers);
  CHECK(arch->heads > 0 && arch->kv_heads > 0 && arch->head_dim > 0);
  CHECK(arch->rope.rotary_dims > 0 && arch->rope.rotary_dims <= arch->head_dim);
  const std::vector<float> inv_freq = arch->rope.InvFreq();
  CHECK(static_cast<int>(inv_freq.size()) == arch->rope.rotary_dims / 2);
  for (int role = 0; role <= static_cast<int>(gizllm::TensorRole::kDownBias); ++role) {
    CHECK(!gizllm::TensorName(*arch, static_cast<gizllm::TensorRole>(role), arch->layers - 1)
               .empty());
  }
  return 0;
}
