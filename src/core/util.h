/* util.h: small internal helpers shared by every subsystem (not part of the public API). */
#ifndef LOOM_CORE_UTIL_H
#define LOOM_CORE_UTIL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "loom/error.h"
#include "loom/util.h" /* loom_now, loom_alloc_aligned, loom_free_aligned */

#define LOOM_MIN(a, b) ((a) < (b) ? (a) : (b))
#define LOOM_MAX(a, b) ((a) > (b) ? (a) : (b))
#define LOOM_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* Record the detail of a failure on this thread (printf-style) and return `code`, so that error
 * paths read `return loom_seterr(LOOM_EFORMAT, "%s: bad magic %d (expected %d)", path, m, M);`. */
int loom_seterr(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The library's allocation functions: malloc, calloc, realloc and strdup with an allocation-failure
 * injection point, so that tests can make the n-th allocation along an API's path fail (SQLite's
 * approach) and check that every error path is clean. Free with free(). */
void *loom__malloc(size_t bytes);
void *loom__calloc(size_t n, size_t size);
void *loom__realloc(void *p, size_t bytes);
char *loom__strdup(const char *s);
/* Fault injection, for tests: with n >= 1 the n-th allocation from now (counting loom__malloc,
 * loom__calloc, loom__realloc, loom__strdup and loom_alloc_aligned, on any thread) fails and every
 * later one succeeds; n = 0 disables. loom__fault_alloc_hit() is 1 once the failure happened. */
void loom__fault_alloc_set(long n);
int loom__fault_alloc_hit(void);
/* The largest single allocation of those functions (on any thread) since the last call with reset 1
 * (which also starts the count again), for tests of how memory grows with a size. */
size_t loom__alloc_largest(int reset);
/* pthread_create, with a fault-injection point for tests where no pids limit can be set:
 * LOOM_TEST_FAIL_THREAD=name makes the thread of that name fail to start with EAGAIN. Returns
 * pthread_create's result. */
int loom__thread_start(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *), void *arg, const char *name);

/* Integer environment variable, or `def` when unset/empty; *ok = 0 when set but not an integer. */
long loom_env_long(const char *name, long def, int *ok);

#endif
