// CHECK for broken invariants (bugs), never for input a user can give.
#pragma once

#include <cstdio>
#include <cstdlib>

namespace gizllm::internal {
[[noreturn]] inline void CheckFailed(const char* file, int line, const char* expr) {
  std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", file, line, expr);
  std::abort();
}
}  // namespace gizllm::internal

#define CHECK(cond) \
  ((cond) ? (void)0 : ::gizllm::internal::CheckFailed(__FILE__, __LINE__, #cond))

#ifdef NDEBUG
#define DCHECK(cond) ((void)0)
#else
#define DCHECK(cond) CHECK(cond)
#endif
