/* test_limits.c: loom under resource limits (issue 25): ZeRO on a shared heap that fits some of its
 * buffers, a full /dev/shm (a private tmpfs in a mount namespace, or the fault-injection point when
 * namespaces are unavailable), address-space limits on `loom train` and `loom run` (each must end
 * within seconds: every command runs under test_run_cmd's timeout, and expiry fails the test), a solo
 * run under 1 GB of address space, and the memory check against fake /proc and /sys/fs/cgroup trees.
 * Nothing here depends on the machine's own limits. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "loom/gpt2.h"
#include "loom/limits.h"
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
	if (TEST_UNDER_ASAN)
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
	if (TEST_UNDER_ASAN)
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

/* ---- the memory check (case 5) ------------------------------------------------------------------ */

/* Write root/rel (directories made as needed) with the text. */
static int put(const char *root, const char *rel, const char *text)
{
	char path[1024];
	snprintf(path, sizeof path, "%s/%s", root, rel);
	for (char *p = path + strlen(root) + 1; *p; p++)
		if (*p == '/') {
			*p = '\0';
			mkdir(path, 0755);
			*p = '/';
		}
	return test_write_file(path, text, strlen(text));
}

#define LIMITS_HDR "Limit                     Soft Limit           Hard Limit           Units\n"

/* A fake /proc and /sys/fs/cgroup: cgroup v2 "/job/rank" under a parent "/job" limited to cg bytes
 * with used bytes in use (the limit is the ancestor's), MemAvailable avail_kb, an address-space
 * limit as (0: unlimited) with VmSize 200000 kB. */
static int fake_root(char *root, size_t cap, unsigned long long cg, unsigned long long used, long avail_kb,
                     unsigned long long as)
{
	char buf[512];
	if (test_mkdtemp(root, cap) != 0)
		return 1;
	snprintf(buf, sizeof buf, LIMITS_HDR "Max data size             unlimited            unlimited            bytes\n"
	         "Max address space         %s            %s            bytes\n", as ? "" : "unlimited",
	         as ? "" : "unlimited");
	if (as)
		snprintf(buf, sizeof buf, LIMITS_HDR "Max data size             unlimited            unlimited            "
		         "bytes\nMax address space         %llu           %llu           bytes\n", as, as);
	if (put(root, "proc/self/limits", buf) || put(root, "proc/self/status", "VmPeak:\t 300000 kB\nVmSize:\t  200000 kB\n"
	    "VmData:\t  100000 kB\n") || put(root, "proc/self/cgroup", "0::/job/rank\n"))
		return 1;
	snprintf(buf, sizeof buf, "MemTotal:       32000000 kB\nMemFree:        1000 kB\nMemAvailable:   %ld kB\n", avail_kb);
	if (put(root, "proc/meminfo", buf) || put(root, "sys/fs/cgroup/job/rank/memory.max", "max\n") ||
	    put(root, "sys/fs/cgroup/job/rank/memory.current", "1000\n") ||
	    put(root, "sys/fs/cgroup/job/rank/memory.events", "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n"))
		return 1;
	snprintf(buf, sizeof buf, "%llu\n", cg);
	if (put(root, "sys/fs/cgroup/job/memory.max", buf))
		return 1;
	snprintf(buf, sizeof buf, "%llu\n", used);
	return put(root, "sys/fs/cgroup/job/memory.current", buf);
}

/* The reader on fake trees: v2 with the limit on an ancestor, v1, RLIMIT_AS, MemAvailable, oom_kill;
 * and the time of reading the real limits and checking a plan (under 50 ms: it runs at every start). */
TEST(limits_reader_fake_root)
{
	char root[512];
	loom_mem_limits_t l;
	CHECK_EQ(fake_root(root, sizeof root, 3ull << 30, 100ull << 20, 12000000, 0), 0);
	CHECK_OK(loom_mem_limits_read(root, &l));
	CHECK_EQ(l.cg_limit, 3ull << 30);
	CHECK_EQ(l.cg_room, (3ull << 30) - (100ull << 20));
	CHECK_CONTAINS(l.cg_file, "/sys/fs/cgroup/job/memory.max");
	CHECK_EQ(l.mem_available, 12000000ull * 1024);
	CHECK_EQ(l.as_limit, (long long)SIZE_MAX);
	CHECK_EQ(loom_mem_oom_kills(root), 1);
	test_rmdir(root);
	CHECK_EQ(fake_root(root, sizeof root, 3ull << 30, 0, 12000000, 1000000000ull), 0);
	CHECK_OK(loom_mem_limits_read(root, &l));
	CHECK_EQ(l.as_limit, 1000000000ll);
	CHECK_EQ(l.as_room, 1000000000ll - 200000ll * 1024);
	/* cgroup v1: the memory controller's line names the directory */
	CHECK_EQ(put(root, "proc/self/cgroup", "12:pids:/x\n4:memory:/slurm/job7\n0::/\n"), 0);
	CHECK_EQ(put(root, "sys/fs/cgroup/memory/slurm/job7/memory.limit_in_bytes", "2147483648\n"), 0);
	CHECK_EQ(put(root, "sys/fs/cgroup/memory/slurm/job7/memory.usage_in_bytes", "1073741824\n"), 0);
	CHECK_EQ(put(root, "sys/fs/cgroup/memory/slurm/job7/memory.oom_control", "oom_kill_disable 0\nunder_oom 0\n"
	             "oom_kill 4\n"), 0);
	CHECK_EQ(put(root, "sys/fs/cgroup/memory/slurm/memory.limit_in_bytes", "9223372036854771712\n"), 0);
	CHECK_OK(loom_mem_limits_read(root, &l));
	CHECK_EQ(l.cg_limit, 2147483648ll);
	CHECK_EQ(l.cg_room, 1073741824ll);
	CHECK_CONTAINS(l.cg_file, "memory/slurm/job7/memory.limit_in_bytes");
	CHECK_EQ(loom_mem_oom_kills(root), 4);
	test_rmdir(root);
	/* the real limits, and a check, in well under 50 ms */
	double t0 = now_s();
	loom_mem_check_t chk;
	loom_mem_plan_t p = {.nparams = 124439808, .emb_params = 40000000, .block_params = 7000000, .B = 4, .T = 1024,
	                     .accum = 1, .dp = 2, .threads = 2, .local_ranks = 2, .heap_bytes = 1u << 30};
	CHECK_OK(loom_mem_limits_read(NULL, &l));
	CHECK_OK(loom_mem_check(&p, &l, &chk));
	double ms = (now_s() - t0) * 1e3;
	printf("  reading the limits and checking a plan: %.3f ms\n", ms);
	CHECK(ms < 50);
	return 0;
}

/* `loom train --batch-size 3000` on tiny (~15 GiB of activations) in a 3 GiB cgroup (fake tree): one
 * message before anything is allocated, naming the estimate, the limit and its file, and a batch size
 * with accumulation that fits; --memory-check warn on a run that fits badly says so and trains. */
TEST(limits_memcheck_refuses)
{
	char root[512], dir[512], cmd[4096], *out = malloc(OUT_CAP);
	double secs;
	int st;
	CHECK(out);
	CHECK_EQ(fake_root(root, sizeof root, 3ull << 30, 100ull << 20, 30000000, 0), 0);
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(test_make_token_data(dir, 64, 3001));
	snprintf(cmd, sizeof cmd, "LOOM_MEMCHECK_ROOT=%s %s train --model tiny --train-data '%s/train_*.bin' "
	         "--batch-size 3000 --seq-len 128 --steps 2 --threads 1", root, test_loom_bin(), dir);
	st = run_timed(cmd, out, 60, &secs);
	printf("  --batch-size 3000 in a 3 GiB cgroup: exit %d in %.2f s\n", st, secs);
	CHECK_MSG(st == 1, "exit %d:\n%s", st, out);
	CHECK_CONTAINS(out, "activations 14.9 GiB");
	CHECK_CONTAINS(out, "the memory cgroup's limit of 3.0 GiB");
	CHECK_CONTAINS(out, "/sys/fs/cgroup/job/memory.max");
	CHECK_CONTAINS(out, "What would fit: --batch-size 375 --grad-accum 8");
	CHECK_CONTAINS(out, "--memory-check warn");
	CHECK(!strstr(out, "step 1"));
	/* the same cgroup nearly full: a tiny run does not fit; warned, it runs */
	test_rmdir(root);
	CHECK_EQ(fake_root(root, sizeof root, 110ull << 20, 100ull << 20, 30000000, 0), 0);
	snprintf(cmd, sizeof cmd, "LOOM_MEMCHECK_ROOT=%s %s train --model tiny --train-data '%s/train_*.bin' "
	         "--batch-size 2 --seq-len 16 --steps 2 --threads 1 --memory-check warn", root, test_loom_bin(), dir);
	st = run_timed(cmd, out, 60, &secs);
	CHECK_MSG(st == 0, "exit %d:\n%s", st, out);
	CHECK_CONTAINS(out, "loom train: warning: this run needs about");
	CHECK_CONTAINS(out, "running anyway");
	CHECK_CONTAINS(out, "final loss");
	/* and under an address-space limit with 2 ranks of DDP: --zero is what fits */
	test_rmdir(root);
	CHECK_EQ(fake_root(root, sizeof root, 1ull << 40, 0, 30000000, 330000000ull), 0);
	snprintf(cmd, sizeof cmd, "LOOM_MEMCHECK_ROOT=%s %s run --nproc-per-node 2 %s train --model tiny "
	         "--vocab-size 50257 --train-data '%s/train_*.bin' --batch-size 2 --seq-len 16 --steps 2 --threads 1",
	         root, test_loom_bin(), test_loom_bin(), dir);
	st = run_timed(cmd, out, 60, &secs);
	printf("  2 ranks of DDP in 330 MB of address space (fake): exit %d in %.2f s\n", st, secs);
	CHECK_MSG(st == 1, "exit %d:\n%s", st, out);
	CHECK_CONTAINS(out, "the address-space limit (RLIMIT_AS");
	CHECK_CONTAINS(out, "What would fit: --zero 1 (model states 82.9 MiB)");
	test_rmdir(root);
	test_rmdir(dir);
	free(out);
	return 0;
}

/* ---- messages (case 6) ------------------------------------------------------------------------------ */

/* A thread that cannot start (a pids limit; here LOOM_TEST_FAIL_THREAD, the fault-injection point, as
 * making a pids cgroup is not always possible) is named, with errno: the keeper of a rank's liveness
 * mutex (a single process) and the progress engine (2 ranks of DDP). */
TEST(limits_thread_start_named)
{
	char dir[512], cmd[4096], *out = malloc(OUT_CAP), job[64], path[128];
	double secs;
	int st;
	CHECK(out);
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(test_make_token_data(dir, 64, 3001));
	snprintf(job, sizeof job, "limthr%d", (int)getpid());
	snprintf(cmd, sizeof cmd, "LOOM_TEST_FAIL_THREAD=keeper LOOM_JOB_ID=%s %s train" TRAIN_ARGS, job, test_loom_bin(),
	         dir);
	st = run_timed(cmd, out, 60, &secs);
	CHECK_MSG(st != 0 && st < 128, "exit %d:\n%s", st, out);
	CHECK_CONTAINS(out, "cannot start its keeper thread");
	CHECK_CONTAINS(out, "pthread_create: Resource temporarily unavailable");
	CHECK_CONTAINS(out, "pids.max");
	snprintf(path, sizeof path, "/dev/shm/loom-%s@w", job);
	CHECK_MSG(access(path, F_OK) != 0, "%s was left behind", path);
	snprintf(cmd, sizeof cmd, "LOOM_TEST_FAIL_THREAD=progress %s run --nproc-per-node 2 %s train" TRAIN_ARGS,
	         test_loom_bin(), test_loom_bin(), dir);
	st = run_timed(cmd, out, 60, &secs);
	CHECK_MSG(st == 1, "exit %d:\n%s", st, out);
	CHECK_CONTAINS(out, "cannot start the progress thread");
	CHECK_CONTAINS(out, "Resource temporarily unavailable");
	test_rmdir(dir);
	free(out);
	return 0;
}

/* The activations' size is computed without wrapping: a batch whose byte count overflows size_t is
 * refused as larger than the address space, before anything is allocated, not shown as a wrapped
 * count. */
TEST(limits_activation_size_overflow)
{
	loom_gpt2_config_t cfg = {.n_layer = 2, .n_head = 4, .n_embd = 128, .vocab_size = 64, .seq_len = 1 << 20};
	loom_gpt2_opts_t o = {.B = 1 << 30, .T = 1 << 20};
	loom_gpt2_act_bytes_t a;
	char dir[512], cmd[4096], *out = malloc(OUT_CAP);
	double secs;
	CHECK(out);
	CHECK_ERR(loom_gpt2_act_bytes(&cfg, &o, &a), LOOM_ENOMEM);
	CHECK_CONTAINS(loom_errmsg(), "larger than the address space");
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(test_make_token_data(dir, 64, 3001));
	/* the CLI's largest batch and context (2^40 positions) and width, 64 layers: 2^68 bytes */
	snprintf(cmd, sizeof cmd, "%s train --model tiny --n-layer 64 --n-embd 65536 --n-positions 1048576 --seq-len 1048576 "
	         "--batch-size 1048576 --train-data '%s/train_*.bin' --steps 1 --threads 1", test_loom_bin(), dir);
	int st = run_timed(cmd, out, 60, &secs);
	CHECK_MSG(st == 1, "exit %d:\n%s", st, out);
	CHECK_CONTAINS(out, "larger than the address space");
	test_rmdir(dir);
	free(out);
	return 0;
}

/* A save directory removed during the run is a warning naming the checkpoints lost, not a silent
 * re-creation. */
TEST(limits_save_dir_vanished)
{
	char dir[512], cmd[4096], *out = malloc(OUT_CAP);
	double secs;
	CHECK(out);
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(test_make_token_data(dir, 64, 3001));
	snprintf(cmd, sizeof cmd, "%s train --model tiny --train-data '%s/train_*.bin' --batch-size 2 --seq-len 16 "
	         "--steps 400 --threads 1 --print-every 1000 --save-dir %s/ck --save-every 10 --keep-checkpoints 2 & "
	         "while [ ! -d %s/ck/step_00000010 ]; do sleep 0.01; done; mv %s/ck %s/ck.gone; wait $!; echo exit=$?",
	         test_loom_bin(), dir, dir, dir, dir, dir);
	int st = run_timed(cmd, out, 120, &secs);
	CHECK_MSG(st == 0 && strstr(out, "exit=0"), "exit %d:\n%s", st, out);
	CHECK_CONTAINS(out, "loom: warning: the checkpoint directory");
	CHECK_CONTAINS(out, "was removed during the run: the checkpoints written to it are lost (the newest was");
	test_rmdir(dir);
	free(out);
	return 0;
}

/* The same signal twice within a moment (coreutils' timeout sends SIGTERM to loom run and to its
 * group) is one request: the ranks get the grace period to clean up, not SIGKILL at once. */
TEST(limits_double_sigterm_once)
{
	char cmd[4096], *out = malloc(OUT_CAP);
	double secs;
	CHECK(out);
	snprintf(cmd, sizeof cmd, "%s run --nproc-per-node 2 sh -c 'trap \"sleep 0.3; echo cleaned-up; exit 0\" TERM; "
	         "echo up; while :; do sleep 0.05; done' & p=$!; sleep 1; kill -TERM $p; kill -TERM $p; wait $p; "
	         "echo exit=$?", test_loom_bin());
	int st = run_timed(cmd, out, 60, &secs);
	CHECK_MSG(st == 0, "exit %d:\n%s", st, out);
	CHECK_MSG(!strstr(out, "again: killing"), "the second SIGTERM counted as a second request:\n%s", out);
	CHECK_CONTAINS(out, "[rank 0] cleaned-up");
	CHECK_CONTAINS(out, "[rank 1] cleaned-up");
	free(out);
	return 0;
}

/* LOOM_GEMM=openblas under an address-space limit: OpenBLAS's buffer per calling thread (128 MiB of
 * address space) is in the estimate, so a run whose buffers cannot be had is refused at once (even
 * with --memory-check warn: OpenBLAS would retry the refused buffer forever), saying what fits; with
 * one thread the same run trains. */
TEST(limits_openblas_buffers_checked)
{
	char dir[512], args[2048], *out = malloc(OUT_CAP);
	double secs;
	int st;
	if (TEST_UNDER_ASAN)
		return free(out), TEST_SKIP("AddressSanitizer reserves terabytes of address space: no address-space limit");
	CHECK(out);
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(test_make_token_data(dir, 64, 3001));
	snprintf(args, sizeof args, "train --model tiny --train-data '%s/train_*.bin' --batch-size 2 --seq-len 16 "
	         "--steps 2 --threads 2 --memory-check warn", dir);
	st = run_limited("LOOM_GEMM=openblas", 300, args, out, &secs);
	CHECK_MSG(st == 1, "exit %d:\n%s", st, out);
	CHECK_CONTAINS(out, "LOOM_GEMM=onednn");
	CHECK_CONTAINS(out, "--threads 1");
	CHECK_CONTAINS(out, "--memory-check warn does not apply");
	snprintf(args, sizeof args, "train" TRAIN_ARGS, dir);
	st = run_limited("LOOM_GEMM=openblas", 300, args, out, &secs);
	CHECK_MSG(st == 0 && strstr(out, "final loss"), "exit %d:\n%s", st, out);
	test_rmdir(dir);
	free(out);
	return 0;
}

/* A rank killed by SIGKILL while its memory cgroup's oom_kill count rose (a fake cgroup tree, whose
 * count the rank raises before it kills itself) is "probably out of memory" in loom run's report,
 * with the estimate the rank sent on the report pipe. */
TEST(limits_oom_kill_reported)
{
	char root[512], cmd[4096], *out = malloc(OUT_CAP);
	double secs;
	CHECK(out);
	CHECK_EQ(fake_root(root, sizeof root, 1ull << 40, 0, 30000000, 0), 0);
	snprintf(cmd, sizeof cmd, "LOOM_MEMCHECK_ROOT=%s %s run --nproc-per-node 1 sh -c 'sleep 0.2; "
	         "echo \"estimate 0: 3221225472 bytes\" > /proc/self/fd/${LOOM_RUN_REPORT_FD%%%%:*}; "
	         "printf \"oom 2\\noom_kill 2\\n\" > %s/sys/fs/cgroup/job/rank/memory.events; kill -9 $$'",
	         root, test_loom_bin(), root);
	int st = run_timed(cmd, out, 60, &secs);
	CHECK_MSG(st == 1, "exit %d:\n%s", st, out);
	CHECK_CONTAINS(out, "was killed by signal 9 (SIGKILL), probably out of memory (the memory cgroup's oom_kill "
	               "count rose from 1 to 2); the rank estimated it needs 3072.0 MiB");
	test_rmdir(root);
	free(out);
	return 0;
}
