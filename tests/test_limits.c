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

/* 1 when this process may make a mount namespace with its own /dev/shm (root, unshare(1) present). */
static int can_unshare(void)
{
	char out[256];
	return test_run_cmd("unshare -m sh -c 'mount -t tmpfs -o size=1m tmpfs /dev/shm' 2>&1", out, sizeof out, 20) == 0;
}

/* Case 2: /dev/shm has no room for a job's segment (a private 1 MiB tmpfs, filled, in a mount
 * namespace; or LOOM_TEST_SHM_FULL=1 where no namespace can be made): `loom train`, alone or as 2 ranks
 * of `loom run`, fails within seconds with a message naming /dev/shm, its free space and LOOM_SHM_MB,
 * not a SIGBUS, and leaves no segment behind. */
static int full_shm(int nranks)
{
	char dir[512], cmd[4096], train[1024], *out = malloc(OUT_CAP), job[64];
	double secs;
	int rc = 1, st, ns = can_unshare();
	CHECK(out);
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(test_make_token_data(dir, 64, 3001));
	snprintf(job, sizeof job, "limits%d", (int)getpid());
	if (nranks == 1)
		snprintf(train, sizeof train, "LOOM_JOB_ID=%s %s train", job, test_loom_bin());
	else
		snprintf(train, sizeof train, "%s run --nproc-per-node %d %s train", test_loom_bin(), nranks, test_loom_bin());
	snprintf(train + strlen(train), sizeof train - strlen(train),
	         " --model tiny --train-data '%s/train_*.bin' --batch-size 2 --seq-len 16 --steps 2", dir);
	if (ns)
		snprintf(cmd, sizeof cmd, "unshare -m sh -c \"mount -t tmpfs -o size=1m tmpfs /dev/shm && "
		         "dd if=/dev/zero of=/dev/shm/fill bs=64k count=15 2>/dev/null; %s; echo exit=\\$?; "
		         "echo left: /dev/shm/*\"", train);
	else
		snprintf(cmd, sizeof cmd, "LOOM_TEST_SHM_FULL=1 %s; echo exit=$?", train);
	st = run_timed(cmd, out, 60, &secs);
	if (st != 0) {
		fprintf(stderr, "  `%s` exited %d after %.1f s:\n%s\n", cmd, st, secs, out);
		goto done;
	}
	if (!strstr(out, "exit=1") && !strstr(out, "exit=2")) {
		fprintf(stderr, "  expected exit status 1 or 2 (an error, not a signal):\n%s\n", out);
		goto done;
	}
	if (!strstr(out, "in /dev/shm") || !strstr(out, "MiB free of") || !strstr(out, "LOOM_SHM_MB=") ||
	    strstr(out, "SIGBUS")) {
		fprintf(stderr, "  the error should name /dev/shm, its free space and LOOM_SHM_MB:\n%s\n", out);
		goto done;
	}
	if (ns && (!strstr(out, "left: /dev/shm/fill\n"))) {
		fprintf(stderr, "  a segment was left in /dev/shm:\n%s\n", out);
		goto done;
	}
	if (!ns) {
		char path[128];
		snprintf(path, sizeof path, "/dev/shm/loom-%s@w", job);
		if (access(path, F_OK) == 0) {
			fprintf(stderr, "  %s was left behind\n", path);
			unlink(path);
			goto done;
		}
	}
	printf("  %s, %d rank%s: refused in %.2f s\n", ns ? "private 1 MiB /dev/shm" : "LOOM_TEST_SHM_FULL=1", nranks,
	       nranks > 1 ? "s" : "", secs);
	rc = 0;
done:
	test_rmdir(dir);
	free(out);
	return rc;
}

TEST(limits_full_shm_solo)
{
	return full_shm(1);
}

TEST(limits_full_shm_2ranks)
{
	return full_shm(2);
}

#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif
#ifndef UNDER_ASAN
#define UNDER_ASAN 0
#endif

/* Run `loom <args>` under an address-space limit of `as_mb` MB (sh's ulimit -v, so no prlimit(1) is
 * needed) with `env` before it, under test_run_cmd's timeout (60 s, scaled by the machine's load):
 * expiry is a hang and fails the test; the time is printed.
 * Returns the exit status, the output in out. */
static int run_limited(const char *env, long as_mb, const char *args, char *out, double *secs)
{
	char cmd[4096];
	snprintf(cmd, sizeof cmd, "ulimit -v %ld && %s %s %s", as_mb * 1000000 / 1024, env, test_loom_bin(), args);
	int st = run_timed(cmd, out, 60, secs);
	printf("  %s, address space %ld MB: exit %d in %.2f s\n", args, as_mb, st, *secs);
	return st;
}

#define TRAIN_ARGS " --model tiny --train-data '%s/train_*.bin' --batch-size 2 --seq-len 16 --steps 2 --threads 1"

/* Case 3: an address-space limit on `loom train` and on `loom run ... loom train` ends within seconds,
 * in training or in a message naming the resource, never a hang in OpenBLAS (its threads, started at
 * load, retried their refused buffer forever, and exit() or the launcher's fork() joined them). */
static int as_limited(int launcher)
{
	char dir[512], args[2048], *out = malloc(OUT_CAP);
	double secs;
	int rc = 1, st;
	static const struct {
		const char *env;
		long mb;
	} cases[] = {{"LOOM_SHM_MB=16", 300}, {"", 200}};
	if (UNDER_ASAN)
		return free(out), TEST_SKIP("AddressSanitizer reserves terabytes of address space: no address-space limit");
	CHECK(out);
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(test_make_token_data(dir, 64, 3001));
	for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
		if (launcher)
			snprintf(args, sizeof args, "run --nproc-per-node 2 %s train" TRAIN_ARGS, test_loom_bin(), dir);
		else
			snprintf(args, sizeof args, "train" TRAIN_ARGS, dir);
		st = run_limited(cases[k].env, cases[k].mb, args, out, &secs);
		if (st < 0 || st >= 128) {
			fprintf(stderr, "  `%s loom %s` under %ld MB: exit %d after %.1f s (a hang or a signal):\n%s\n",
			        cases[k].env, args, cases[k].mb, st, secs, out);
			goto done;
		}
		if (st != 0 && !strstr(out, "LOOM_SHM_MB") && !strstr(out, "address space")) {
			fprintf(stderr, "  the error should name the limit or LOOM_SHM_MB:\n%s\n", out);
			goto done;
		}
	}
	rc = 0;
done:
	test_rmdir(dir);
	free(out);
	return rc;
}

TEST(limits_as_train)
{
	return as_limited(0);
}

TEST(limits_as_run)
{
	return as_limited(1);
}

/* Case 4: a single process needs no 1 GiB shared heap: the tiny model trains in under 1 GB of address
 * space with nothing set. */
TEST(limits_solo_under_1gb)
{
	char dir[512], args[2048], *out = malloc(OUT_CAP);
	double secs;
	int st;
	if (UNDER_ASAN)
		return free(out), TEST_SKIP("AddressSanitizer reserves terabytes of address space: no address-space limit");
	CHECK(out);
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(test_make_token_data(dir, 64, 3001));
	snprintf(args, sizeof args, "train" TRAIN_ARGS, dir);
	st = run_limited("env -u LOOM_SHM_MB", 1000, args, out, &secs);
	test_rmdir(dir);
	if (st != 0 || !strstr(out, "final loss")) {
		fprintf(stderr, "  exit %d after %.1f s:\n%s\n", st, secs, out);
		free(out);
		return 1;
	}
	free(out);
	return 0;
}
