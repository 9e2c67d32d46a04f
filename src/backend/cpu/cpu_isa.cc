#include "backend/cpu/cpu_isa.h"

namespace gizllm {
namespace {

CpuIsa Detect() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("fma") && __builtin_cpu_supports("avx2")) {
    return CpuIsa::kAvx512;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return CpuIsa::kAvx2;
#endif
  return CpuIsa::kScalar;
}

}  // namespace

CpuIsa DetectCpuIsa() {
  static const CpuIsa isa = Detect();
  return isa;
}

bool CpuHasAvx512Bf16() {
#if defined(__x86_64__)
  static const bool has = [] {
    __builtin_cpu_init();
    return DetectCpuIsa() == CpuIsa::kAvx512 && __builtin_cpu_supports("avx512bf16");
  }();
  return has;
#else
  return false;
#endif
}

bool CpuHasAvx512Vnni() {
#if defined(__x86_64__)
  static const bool has = [] {
    __builtin_cpu_init();
    return DetectCpuIsa() == CpuIsa::kAvx512 && __builtin_cpu_supports("avx512vnni");
  }();
  return has;
#else
  return false;
#endif
}

const char* CpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar:
      return "scalar";
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kAvx512:
      return "avx512";
  }
  return "?";
}

}  // namespace gizllm
