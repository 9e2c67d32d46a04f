// Which SIMD instruction set the CPU kernels use, detected once at run time. The project is
// compiled for baseline x86-64; AVX2 and AVX-512 kernels are functions with target attributes,
// picked by what the running CPU supports.
#pragma once

namespace gizllm {

enum class CpuIsa {
  kScalar,  // any CPU
  kAvx2,    // AVX2 + FMA + F16C
  kAvx512,  // AVX-512 F/BW/VL/DQ + FMA + F16C
};

// The best instruction set this CPU supports (computed once).
CpuIsa DetectCpuIsa();
// Whether the CPU has AVX-512 BF16 dot products (vdpbf16ps).
bool CpuHasAvx512Bf16();
// Whether the CPU has AVX-512 VNNI integer dot products (vpdpbusd).
bool CpuHasAvx512Vnni();
const char* CpuIsaName(CpuIsa isa);  // "scalar", "avx2", "avx512"

}  // namespace gizllm

// Attributes of the functions compiled for each instruction set.
#if defined(__x86_64__)
#define GZ_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define GZ_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define GZ_TARGET_AVX512BF16 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")))
#define GZ_TARGET_AVX512VNNI \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))
#endif
