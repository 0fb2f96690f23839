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
    if (n < HUGE_PAGE)
        return aligned_alloc(64, (n + 63) & ~(size_t)63);
    size_t whole = (n + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
    void *p = aligned_alloc(HUGE_PAGE, whole);
#ifdef MADV_HUGEPAGE
    if (p)
        madvise(p, whole, MADV_HUGEPAGE); /* (a kernel without THP refuses: 4 KiB pages, as before) */
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
