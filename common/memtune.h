/* memtune.h - process-wide allocator settings for the programs (sepal, sepal-server, the benchmarks). */
#ifndef SEPAL_MEMTUNE_H
#define SEPAL_MEMTUNE_H

#include <stddef.h>

/* Training and inference allocate and free buffers of a few MB to tens of MB at every step (decoded tensors,
 * activations kept for a backward, chain boundaries). glibc hands blocks of that size back to the kernel on
 * free and the next step faults them in again page by page: a quarter of a training step, measured. This
 * keeps them in the process (up to the 32 MiB glibc allows below mmap). Programs call it first thing;
 * the libraries never do. */
void sp_memtune(void);

/* Gives the pages wholly inside [p, p + n) back to the kernel (madvise MADV_DONTNEED): memory a reader has done
 * with (a tensor copied out of a mapped checkpoint, f32 weights once encoded). Their contents are lost: the file's
 * again for a file mapping, zeros for anonymous memory, on the next touch. */
void sp_mem_release(const void *p, size_t n);

/* Hands the allocator's free memory back to the kernel (glibc's malloc_trim: the heap's top and the free pages
 * inside it): after freeing buffers whose sizes vary from one use to the next (a merged training pass's, sized by
 * how many requests it merged), which sp_memtune's thresholds would otherwise keep as holes that other sizes
 * fragment. A no-op elsewhere. */
void sp_mem_trim(void);

/* n bytes for weights that every token streams through (free() frees them), 64-byte aligned; from 2 MiB on,
 * aligned to 2 MiB and its whole 2 MiB asked to be backed by transparent huge pages (madvise MADV_HUGEPAGE: where
 * THP is "madvise" nothing else gets them; under "always" the alignment lets the kernel back them so; the tail
 * past the last whole 2 MiB stays in 4 KiB pages, so no memory is spent on padding): a TLB entry for every 2 MiB
 * instead of 512 4 KiB pages, which the kernels' reads and prefetches ahead cross all the time (bench_kern's 7B
 * block, 1 thread, at rest: f32 0.83-0.86x the time a token, bf16 0.88-0.92x, int8 0.92-0.95x, nf4 0.91-0.93x).
 * NULL when out of memory. */
void *sp_mem_alloc_weights(size_t n);

#endif
