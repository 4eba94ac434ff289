/* util.h: small internal helpers shared by every subsystem (not part of the public API). */
#ifndef LOOM_CORE_UTIL_H
#define LOOM_CORE_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "loom/error.h"

#define LOOM_MIN(a, b) ((a) < (b) ? (a) : (b))
#define LOOM_MAX(a, b) ((a) > (b) ? (a) : (b))
#define LOOM_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* Record the detail of a failure on this thread (printf-style) and return `code`, so that error
 * paths read `return loom_seterr(LOOM_EFORMAT, "%s: bad magic %d (expected %d)", path, m, M);`. */
int loom_seterr(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Monotonic clock in seconds. */
double loom_now(void);

/* 64-byte aligned allocation, zero-filled; NULL on failure. Free with loom_free_aligned. */
void *loom_alloc_aligned(size_t bytes);
void loom_free_aligned(void *p);

/* Integer environment variable, or `def` when unset/empty; *ok = 0 when set but not an integer. */
long loom_env_long(const char *name, long def, int *ok);

#endif
