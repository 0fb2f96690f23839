/* memtune.c - see memtune.h. */
#include "memtune.h"

#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

void sp_memtune(void)
{
#if defined(__GLIBC__)
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
}

void sp_mem_trim(void)
{
#if defined(__GLIBC__)
    malloc_trim(0);
#endif
}

#define HUGE_PAGE ((size_t)2 << 20)

void *sp_mem_alloc_weights(size_t n)
{
    void *p = NULL;
    n = (n + 63) & ~(size_t)63;
    if (posix_memalign(&p, n < HUGE_PAGE ? 64 : HUGE_PAGE, n))
        return NULL;
#ifdef MADV_HUGEPAGE
    if (n >= HUGE_PAGE) /* whole huge pages only: the tail stays in 4 KiB pages, so no page is padding */
        madvise(p, n & ~(HUGE_PAGE - 1), MADV_HUGEPAGE); /* (a kernel without THP refuses: 4 KiB pages) */
#endif
    return p;
}

void sp_mem_release(const void *p, size_t n)
{
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), a = (uintptr_t)p, b = a + n;
    a = (a + page - 1) / page * page;
    b = b / page * page;
    if (b > a)
        madvise((void *)a, b - a, MADV_DONTNEED);
}
