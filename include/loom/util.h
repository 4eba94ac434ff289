/* loom/util.h: the small helpers a program built on loom (and loom's own CLI) needs besides the
 * modules: a monotonic clock and 64-byte aligned buffers. Thread-safe. */
#ifndef LOOM_UTIL_H
#define LOOM_UTIL_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Monotonic clock in seconds (CLOCK_MONOTONIC; only differences are meaningful). */
double loom_now(void);

/* 64-byte aligned, zero-filled allocation of `bytes` (at least 1); NULL when out of memory. The
 * caller owns it; free it with loom_free_aligned (or free()). */
void *loom_alloc_aligned(size_t bytes);
void loom_free_aligned(void *p);

/* The library's version, and `git describe --always --dirty` of the tree it was built from
 * ("unknown" outside a git checkout). Static strings. */
#define LOOM_VERSION "0.4.0"
const char *loom_version(void);
const char *loom_git_describe(void);

#ifdef __cplusplus
}
#endif
#endif
