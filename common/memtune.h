/* memtune.h - process-wide allocator settings for the programs (sepal, sepal-server, the benchmarks). */
#ifndef SEPAL_MEMTUNE_H
#define SEPAL_MEMTUNE_H

/* Training and inference allocate and free buffers of a few MB to tens of MB at every step (decoded tensors,
 * activations kept for a backward, chain boundaries). glibc hands blocks of that size back to the kernel on
 * free and the next step faults them in again page by page: a quarter of a training step, measured. This
 * keeps them in the process (up to the 32 MiB glibc allows below mmap). Programs call it first thing;
 * the libraries never do. */
void sp_memtune(void);

#endif
