/* memtune.c - see memtune.h. */
#include "memtune.h"

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
