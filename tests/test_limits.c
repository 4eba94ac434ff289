/* test_limits.c: loom under resource limits (issue 25): ZeRO on a shared heap that fits some of its
 * buffers, a full /dev/shm (a private tmpfs in a mount namespace, or the fault-injection point when
 * namespaces are unavailable), address-space limits on `loom train` and `loom run` (each must end
 * within seconds: every command runs under test_run_cmd's timeout, and expiry fails the test), a solo
 * run under 1 GB of address space, and the memory check against fake /proc and /sys/fs/cgroup trees.
 * Nothing here depends on the machine's own limits. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "test.h"

enum { MAXSTEPS = 16 };

#define OUT_CAP 65536

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Run cmd into out under a timeout; *secs the wall time. Returns the exit status (-1: timed out). */
static int run_timed(const char *cmd, char *out, double timeout_s, double *secs)
{
	double t0 = now_s();
	int rc = test_run_cmd(cmd, out, OUT_CAP, timeout_s);
	if (secs)
		*secs = now_s() - t0;
	return rc;
}

/* Case 1: the shared heap (LOOM_SHM_MB=8) fits the small buffers of ZeRO-2/3 (the blocks') but not the
 * embedding's of a 50257-token vocabulary; the run falls back to private memory for what does not fit,
 * says so once, and trains to the same losses as with a heap that fits everything. */
static int zero_partial_heap(int stage)
{
	char dir[512], cmd[2048], *out = malloc(OUT_CAP), path[600];
	double ref[MAXSTEPS] = {0}, got[MAXSTEPS] = {0}, secs;
	int rc = 1, n_ref, n_got;
	CHECK(out);
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(test_make_token_data(dir, 64, 3001));
	for (int small = 0; small <= 1; small++) {
		snprintf(cmd, sizeof cmd, "LOOM_SHM_MB=%d %s run --nproc-per-node 2 %s train --model tiny --vocab-size 50257 "
		         "--train-data '%s/train_*.bin' --batch-size 2 --seq-len 16 --steps 3 --seed 7 --zero %d "
		         "--log %s/z%d.jsonl", small ? 8 : 256, test_loom_bin(), test_loom_bin(), dir, stage, dir, small);
		int st = run_timed(cmd, out, 120, &secs);
		if (st != 0) {
			fprintf(stderr, "  `%s` exited %d after %.1f s:\n%s\n", cmd, st, secs, out);
			goto done;
		}
		if (small && !strstr(out, "use private memory")) {
			fprintf(stderr, "  no fallback note with LOOM_SHM_MB=8:\n%s\n", out);
			goto done;
		}
	}
	snprintf(path, sizeof path, "%s/z0.jsonl", dir);
	n_ref = test_read_losses(path, ref, MAXSTEPS, NULL, NULL);
	snprintf(path, sizeof path, "%s/z1.jsonl", dir);
	n_got = test_read_losses(path, got, MAXSTEPS, NULL, NULL);
	if (n_ref != 3 || n_got != 3) {
		fprintf(stderr, "  steps logged: %d with enough heap, %d with 8 MiB\n", n_ref, n_got);
		goto done;
	}
	for (int s = 1; s <= 3; s++)
		if (ref[s] != got[s]) {
			fprintf(stderr, "  step %d: loss %.9g with enough heap, %.9g with 8 MiB\n", s, ref[s], got[s]);
			goto done;
		}
	rc = 0;
done:
	test_rmdir(dir);
	free(out);
	return rc;
}

TEST(limits_zero2_partial_heap)
{
	return zero_partial_heap(2);
}

TEST(limits_zero3_partial_heap)
{
	return zero_partial_heap(3);
}
