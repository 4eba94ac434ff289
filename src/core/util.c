/* util.c: clock, allocation (with fault injection) and environment parsing shared by every subsystem;
 * loom_now and the aligned allocation are public (loom/util.h).
 *
 * Fault injection: `fault_countdown` > 0 counts allocations down; the one that brings it to zero
 * fails. It is atomic because the progress thread allocates too. */
#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/util.h"

double loom_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static atomic_long fault_countdown;
static atomic_int fault_hit;

void loom__fault_alloc_set(long n)
{
	atomic_store(&fault_hit, 0);
	atomic_store(&fault_countdown, n > 0 ? n : 0);
}

int loom__fault_alloc_hit(void)
{
	return atomic_load(&fault_hit);
}

/* The largest single allocation since the last loom__alloc_largest(1), for tests of what grows with what. */
static atomic_size_t largest_alloc;

static void note_size(size_t bytes)
{
	size_t m = atomic_load_explicit(&largest_alloc, memory_order_relaxed);
	while (bytes > m && !atomic_compare_exchange_weak(&largest_alloc, &m, bytes))
		;
}

size_t loom__alloc_largest(int reset)
{
	return reset ? atomic_exchange(&largest_alloc, 0) : atomic_load(&largest_alloc);
}

/* 1 when this allocation must fail (injected). */
static int inject_failure(void)
{
	long n = atomic_load_explicit(&fault_countdown, memory_order_relaxed);
	while (n > 0) {
		if (atomic_compare_exchange_weak(&fault_countdown, &n, n - 1)) {
			if (n == 1) {
				atomic_store(&fault_hit, 1);
				return 1;
			}
			return 0;
		}
	}
	return 0;
}

void *loom__malloc(size_t bytes)
{
	note_size(bytes);
	return inject_failure() ? NULL : malloc(bytes);
}

void *loom__calloc(size_t n, size_t size)
{
	note_size(size && n > SIZE_MAX / size ? SIZE_MAX : n * size);
	return inject_failure() ? NULL : calloc(n, size);
}

void *loom__realloc(void *p, size_t bytes)
{
	note_size(bytes);
	return inject_failure() ? NULL : realloc(p, bytes);
}

char *loom__strdup(const char *s)
{
	return inject_failure() ? NULL : strdup(s);
}

void *loom_alloc_uninit(size_t bytes)
{
	void *p = NULL;
	note_size(bytes);
	if (inject_failure())
		return NULL;
	if (posix_memalign(&p, 64, bytes ? bytes : 1) != 0)
		return NULL;
	return p;
}

void *loom_alloc_aligned(size_t bytes)
{
	void *p = loom_alloc_uninit(bytes);
	if (p)
		memset(p, 0, bytes);
	return p;
}

void loom_free_aligned(void *p)
{
	free(p);
}

long loom_env_long(const char *name, long def, int *ok)
{
	const char *s = getenv(name);
	char *end;
	long v;
	if (ok)
		*ok = 1;
	if (!s || !*s)
		return def;
	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || *end) {
		if (ok)
			*ok = 0;
		return def;
	}
	return v;
}

int loom__thread_start(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *), void *arg, const char *name)
{
	const char *f = getenv("LOOM_TEST_FAIL_THREAD");
	if (f && name && strcmp(f, name) == 0)
		return EAGAIN;
	return pthread_create(t, attr, fn, arg);
}
