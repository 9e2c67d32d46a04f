#include <thread>

#include "backend/cpu/cpu_backend.h"
#include "core/thread_pool.h"
#include "ops/device.h"
#ifdef GIZLLM_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace gizllm {
namespace {

struct CpuDevice {
  explicit CpuDevice(int threads) : pool(threads) {}
  ThreadPool pool;
  std::unique_ptr<Backend> backend;
};

Expected<std::shared_ptr<Backend>> OpenCpu(int threads, bool bf16, bool int8) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  auto device = std::make_shared<CpuDevice>(threads);
  CpuOptions options;
  options.bf16_activations = bf16;
  options.int8_activations = int8;
  auto backend = MakeCpuBackend(&device->pool, options);
  if (!backend.ok()) {
    const bool int8_failed = int8 && !CpuHasAvx512Vnni();
    return InvalidArgument((int8_failed ? "--int8: " : "--bf16: ") + backend.status().message());
  }
  device->backend = std::move(*backend);
  return std::shared_ptr<Backend>(device, device->backend.get());
}

// `count` CPU backends over one pool: a pipeline's stages run one after another.
struct CpuDevices {
  explicit CpuDevices(int threads) : pool(threads) {}
  ThreadPool pool;
  std::vector<std::unique_ptr<Backend>> backends;
};

Expected<std::vector<std::shared_ptr<Backend>>> OpenCpus(int threads, bool bf16, bool int8,
                                                         size_t count) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  auto devices = std::make_shared<CpuDevices>(threads);
  CpuOptions options;
  options.bf16_activations = bf16;
  options.int8_activations = int8;
  std::vector<std::shared_ptr<Backend>> out;
  for (size_t s = 0; s < count; ++s) {
    auto backend = MakeCpuBackend(&devices->pool, options);
    if (!backend.ok()) {
      const bool int8_failed = int8 && !CpuHasAvx512Vnni();
      return InvalidArgument((int8_failed ? "--int8: " : "--bf16: ") + backend.status().message());
    }
    devices->backends.push_back(std::move(*backend));
    out.push_back(std::shared_ptr<Backend>(devices, devices->backends.back().get()));
  }
  return out;
}

}  // namespace

Status DeviceOptions::Check() const {
  if (device != "auto" && device != "cpu" && device != "cuda")
    return InvalidArgument("--device: expected auto, cpu or cuda, got '" + device + "'");
  if (threads < 0) return InvalidArgument("--threads: must not be negative");
  if (gpu < 0) return InvalidArgument("--gpus: a GPU index must not be negative");
  if (exact && (bf16 || int8)) {
    return InvalidArgument(std::string("--exact asks for float32 activations and ") +
                           (bf16 ? "--bf16" : "--int8") + " for rounded ones: pick one");
  }
  return Status::Ok();
}

Expected<std::shared_ptr<Backend>> OpenBackend(const DeviceOptions& options) {
  GZ_RETURN_IF_ERROR(options.Check());
#ifdef GIZLLM_HAVE_CUDA
  if (options.device == "cuda" || (options.device == "auto" && CudaDeviceCount() > 0)) {
    CudaOptions cuda;
    cuda.exact = options.exact;
    cuda.bf16_copies = options.bf16_copies;
    cuda.device = options.gpu;
    GZ_ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, MakeCudaBackend(cuda));
    return std::shared_ptr<Backend>(std::move(backend));
  }
#else
  if (options.device == "cuda")
    return Unimplemented("--device cuda: this build of gizllm has no CUDA backend");
#endif
  // The CPU's fast path is the default where it has one: bf16 activations into the linears on
  // AVX-512 BF16 (logits within about 1% of the largest against float32); --exact keeps float32.
  const bool bf16 = options.bf16 || (!options.exact && CpuHasAvx512Bf16());
  return OpenCpu(options.threads, bf16, options.int8);
}

Expected<std::vector<std::shared_ptr<Backend>>> OpenStageBackends(const DeviceOptions& options,
                                                                  std::span<const int> gpus) {
  GZ_RETURN_IF_ERROR(options.Check());
  if (gpus.empty()) return InvalidArgument("--pipeline: no stages");
#ifdef GIZLLM_HAVE_CUDA
  if (options.device == "cuda" || (options.device == "auto" && CudaDeviceCount() > 0)) {
    const int count = CudaDeviceCount();
    std::vector<std::shared_ptr<Backend>> out;
    for (int gpu : gpus) {
      if (gpu < 0 || gpu >= count) {
        return InvalidArgument("--gpus: no GPU " + std::to_string(gpu) + " (" +
                               std::to_string(count) + " found: 0 to " +
                               std::to_string(count - 1) + ")");
      }
      DeviceOptions one = options;
      one.gpu = gpu;
      GZ_ASSIGN_OR_RETURN(std::shared_ptr<Backend> backend, OpenBackend(one));
      out.push_back(std::move(backend));
    }
    return out;
  }
#else
  if (options.device == "cuda")
    return Unimplemented("--device cuda: this build of gizllm has no CUDA backend");
#endif
  const bool bf16 = options.bf16 || (!options.exact && CpuHasAvx512Bf16());
  return OpenCpus(options.threads, bf16, options.int8, gpus.size());
}

int GpuCount() {
#ifdef GIZLLM_HAVE_CUDA
  return CudaDeviceCount();
#else
  return 0;
#endif
}

std::vector<std::string> BuiltBackends() {
  std::vector<std::string> names = {"cpu"};
#ifdef GIZLLM_HAVE_CUDA
  names.push_back("cuda");
#endif
  return names;
}

}  // namespace gizllm
