#include "core/host_memory.h"

#include <cstdlib>
#include <cstring>
#include <string>

#if defined(__GLIBC__)
#include <malloc.h>
#include <unistd.h>
#endif

namespace gizllm {

void KeepLargeBlocks(char** argv, bool huge_pages) {
#if defined(__GLIBC__)
  if (huge_pages && argv != nullptr && argv[0] != nullptr) {
    const char* tunables = std::getenv("GLIBC_TUNABLES");
    if (tunables == nullptr || std::strstr(tunables, "glibc.malloc.hugetlb") == nullptr) {
      std::string value = "glibc.malloc.hugetlb=1";
      if (tunables != nullptr && *tunables != '\0') value = std::string(tunables) + ":" + value;
      if (setenv("GLIBC_TUNABLES", value.c_str(), 1) == 0) {
        execv("/proc/self/exe", argv);
        // Not run again: the environment keeps the value (children get huge pages too).
      }
    }
  }
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
#else
  (void)argv;
  (void)huge_pages;
#endif
}

}  // namespace gizllm
