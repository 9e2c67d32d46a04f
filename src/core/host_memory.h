// How the process's allocator treats large blocks. glibc's malloc maps each block above its
// threshold (128 KiB at first, rising with the blocks freed, at most 32 MiB) with mmap and
// unmaps it when freed, so every large vector a request makes (a picture's pixels, its patches,
// a step's rows) faults its pages in afresh, and walks them through 4 KiB pages. On the GPU
// machine (a virtual machine: a page fault and a TLB miss cost more there) a chat with one
// 1,024 x 1,024 picture took 156 ms to its first token with the defaults, 134 ms with large
// blocks kept in the heap and 120 ms with the heap on transparent huge pages as well.
#pragma once

namespace gizllm {

// Once, first in main (before threads start). Keeps blocks up to 32 MiB in the heap and the
// heap's free top up to 1 GiB, so the next request's vectors reuse pages already mapped. With
// huge_pages, where the environment does not say otherwise, the process runs itself again
// (argv, from /proc/self/exe) with glibc.malloc.hugetlb=1 added to GLIBC_TUNABLES: glibc reads
// its tunables only at start, and that one has malloc ask for transparent huge pages. No effect
// with another C library; a failed exec goes on as before.
void KeepLargeBlocks(char** argv, bool huge_pages);

}  // namespace gizllm
