/* util.c: clock, aligned allocation and environment parsing shared by every subsystem. */
#include <errno.h>
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

void *loom_alloc_aligned(size_t bytes)
{
	void *p = NULL;
	if (bytes == 0)
		bytes = 1;
	if (posix_memalign(&p, 64, bytes) != 0)
		return NULL;
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
