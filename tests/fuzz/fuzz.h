/* fuzz.h: what loom's libFuzzer harnesses share: each input is written to a file in a private
 * temporary directory (the readers under test take paths, and check that they are regular files),
 * and fuzz_dir() names that directory. Built by `make fuzz` into build/fuzz/, run by scripts/fuzz.sh. */
#ifndef LOOM_FUZZ_H
#define LOOM_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char fuzz_dir_[256];

static const char *fuzz_dir(void)
{
	if (!fuzz_dir_[0]) {
		const char *t = getenv("TMPDIR");
		snprintf(fuzz_dir_, sizeof fuzz_dir_, "%s/loomfuzz-XXXXXX", t && *t ? t : "/tmp");
		if (!mkdtemp(fuzz_dir_))
			abort();
	}
	return fuzz_dir_;
}

/* Write d[0..n) to DIR/name; the path goes to path[cap]. Aborts on failure (not the code under test). */
static void fuzz_write(const char *name, const void *d, size_t n, char *path, size_t cap)
{
	FILE *f;
	snprintf(path, cap, "%s/%s", fuzz_dir(), name);
	f = fopen(path, "wb");
	if (!f || (n && fwrite(d, 1, n, f) != n) || fclose(f) != 0)
		abort();
}

#endif
