/* test_multinode.c: jobs spanning hosts, on the two-host cluster of scripts/netns-cluster.sh
 * (2 network namespaces x 2 ranks, a rate-limited link, mpirun over an rsh agent): the collective
 * matrix over the MPI transport and the hierarchical collectives (tests/progs/mn_prog.c), DDP
 * training across hosts equal to one process with the same total batch, and a rank killed on the
 * second host ending the job quickly with its rank and host named, and pipeline stages on different
 * hosts equal to one process.
 *
 * Each test creates its own cluster (namespaces named after the test process, so parallel runs do
 * not collide) and removes it on the way out, from a shell trap. Without root, network namespaces,
 * mpirun or an MPI build, each test is skipped with the reason (counted as skipped). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "loom/data.h"
#include "test.h"

#define OUT_CAP 65536

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* NULL when the cluster can run here, else why not. */
static const char *cluster_unavailable(void)
{
	static char why[256];
	char out[512] = "";
	if (test_cluster_off())
		return test_cluster_off();
#ifndef LOOM_HAVE_MPI
	return "built without MPI (make MPI=0, or pkg-config ompi-c not found)";
#endif
	if (test_run_cmd("scripts/netns-cluster.sh check", out, sizeof out, 30) != 0) {
		out[strcspn(out, "\n")] = '\0';
		snprintf(why, sizeof why, "two-host cluster unavailable: %.200s", out[0] ? out : "scripts/netns-cluster.sh check failed");
		return why;
	}
	return NULL;
}

/* Bring the cluster up, run `scripts/netns-cluster.sh mpirun -np 4 <args>`, tear it down (always, by
 * a trap); the output goes to out. Returns mpirun's exit status; *secs its wall time. */
static int cluster_mpirun_pre(const char *pre, const char *args, char *out, double timeout_s, double *secs)
{
	char cmd[4096];
	double t0;
	int rc;
	snprintf(cmd, sizeof cmd,
	         "export LOOM_NETNS_PREFIX=lt%d; trap 'scripts/netns-cluster.sh down; rm -f /dev/shm/vader_segment.lt%d[01].*' "
	         "EXIT; scripts/netns-cluster.sh up && "
	         "{ %.500s timeout %.0f scripts/netns-cluster.sh mpirun -np 4 -x ASAN_OPTIONS=detect_leaks=0 -x LOOM_TIMEOUT_S=60 "
	         "-x OMP_NUM_THREADS=1 %.3000s; }",
	         (int)getpid() % 100000, (int)getpid() % 100000, pre, timeout_s, args);
	t0 = now_s();
	rc = test_run_cmd(cmd, out, OUT_CAP, timeout_s + 30);
	if (secs)
		*secs = now_s() - t0;
	return rc;
}

static int cluster_mpirun(const char *args, char *out, double timeout_s, double *secs)
{
	return cluster_mpirun_pre("", args, out, timeout_s, secs);
}

static int no_namespaces_left(void)
{
	char cmd[256], out[4096] = "";
	/* stderr dropped: `ip netns list` warns about other jobs' namespaces being torn down meanwhile */
	snprintf(cmd, sizeof cmd, "ip netns list 2>/dev/null | grep '^lt%d' || true", (int)getpid() % 100000);
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 10), 0);
	CHECK_MSG(out[0] == '\0', "namespaces left behind: %s", out);
	return 0;
}

/* Run `mpirun [opts] mn_prog coll` on the cluster (2 hosts x 2 ranks) and check that every rank
 * says its collective matrix was exact. */
static int coll_matrix_on_cluster(const char *opts, int timeout_s)
{
	static char out[OUT_CAP], args[1024];
	char *dir = realpath(test_prog_dir(), NULL);
	CHECK(dir != NULL);
	snprintf(args, sizeof args, "%s%s/mn_prog coll", opts, dir);
	free(dir);
	CHECK_MSG(cluster_mpirun(args, out, timeout_s, NULL) == 0, "mpirun %s failed:\n%s", args, out);
	for (int r = 0; r < 4; r++) {
		char want[64];
		snprintf(want, sizeof want, "rank %d of 4: ok", r);
		CHECK_CONTAINS(out, want);
	}
	return no_namespaces_left();
}

TEST(multinode_collectives_2x2)
{
	const char *why = cluster_unavailable();
	if (why)
		return TEST_SKIP("%s", why);
	return coll_matrix_on_cluster("", 120);
}

/* The same matrix with the pipelined two-host all-reduce (src/comm/hier.c) cut into 4 KiB chunks:
 * every size above 4 KiB runs in many chunks, with odd last chunks and empty pieces (65537
 * elements), so each chunk boundary, the pipeline's fill and drain and its in-flight exchanges are
 * checked against the exact values. */
TEST(multinode_collectives_2x2_small_chunks)
{
	const char *why = cluster_unavailable();
	if (why)
		return TEST_SKIP("%s", why);
	return coll_matrix_on_cluster("-x LOOM_HIER_CHUNK=4096 ", 300);
}

/* mpirun mn_prog MODE on the cluster: it must exit 0 with every rank's "ok" (into out). */
static int mn_prog_ok(const char *mode, char *out)
{
	char args[1024], *dir = realpath(test_prog_dir(), NULL);
	CHECK(dir != NULL);
	snprintf(args, sizeof args, "%s/mn_prog %s", dir, mode);
	free(dir);
	CHECK_MSG(cluster_mpirun(args, out, 120, NULL) == 0, "mpirun mn_prog %s failed:\n%s", mode, out);
	for (int r = 0; r < 4; r++) {
		char want[64];
		snprintf(want, sizeof want, "rank %d of 4: ok", r);
		CHECK_CONTAINS(out, want);
	}
	return 0;
}

/* Host 0's ranks all-reduce float32, host 1's int32 with the same count (the same bytes): over the
 * MPI transport's sendrecv (a communicator across hosts, loom's algorithms forced between hosts) and
 * over the pipelined two-host exchange (the world), every rank fails with LOOM_EMISMATCH naming both
 * signatures, with no hang. */
TEST(multinode_mismatch_signature)
{
	static char out[OUT_CAP];
	const char *why = cluster_unavailable();
	if (why)
		return TEST_SKIP("%s", why);
	CHECK_EQ(mn_prog_ok("mismatch", out), 0);
	for (int r = 0; r < 4; r++) {
		char want[64];
		snprintf(want, sizeof want, "rank %d: cross (h-", r);
		CHECK_CONTAINS(out, want);
		snprintf(want, sizeof want, "rank %d: world (h-pipe): ", r);
		CHECK_CONTAINS(out, want);
	}
	CHECK_CONTAINS(out, "mismatched collective calls: this rank called allreduce #");
	CHECK_CONTAINS(out, "(count 1000, float32, op sum, root -1)");
	CHECK_CONTAINS(out, "(count 1000, int32, op sum, root -1)");
	return no_namespaces_left();
}

/* Broadcasts whose ranks disagree on the root, small enough to go out eagerly (issue 23): across
 * hosts (one rank per host, each the root; then destroy) and on the world (host 0 says root 0, host 1
 * root 2: the same-host groups agree, the exchange between hosts does not; then a barrier). Every
 * rank fails with LOOM_EMISMATCH naming the broadcast, with no hang. */
TEST(multinode_root_mismatch)
{
	static char out[OUT_CAP];
	const char *why = cluster_unavailable();
	if (why)
		return TEST_SKIP("%s", why);
	CHECK_EQ(mn_prog_ok("rootmismatch", out), 0);
	CHECK_CONTAINS(out, "mismatched collective calls: this rank called broadcast #");
	return no_namespaces_left();
}

TEST(multinode_rank_killed)
{
	static char out[OUT_CAP], args[1024];
	const char *why = cluster_unavailable();
	double secs;
	char *dir;
	int rc;
	if (why)
		return TEST_SKIP("%s", why);
	dir = realpath(test_prog_dir(), NULL);
	CHECK(dir != NULL);
	snprintf(args, sizeof args, "%s/mn_prog die", dir);
	free(dir);
	rc = cluster_mpirun(args, out, 60, &secs);
	CHECK_MSG(rc != 0 && rc != -1, "mpirun mn_prog die: exit %d (expected a failure):\n%s", rc, out);
	/* setting up the cluster and starting 4 ranks takes ~1-2 s; the death comes 0.3 s after init */
	CHECK_MSG(secs < 15, "the job took %.1f s to end after a rank died:\n%s", secs, out);
	/* mpirun: "process rank 3 with PID ... on node 10.231.7.2 exited on signal 9" */
	CHECK_CONTAINS(out, "rank 3");
	CHECK_CONTAINS(out, "on node 10.231.7.2");
	return no_namespaces_left();
}

/* The second host disappears (every process in its namespace killed, its daemon included) 3 s
 * into a job that all-reduces every 0.1 s: mpirun ends the job, non-zero, within 10 s. */
TEST(multinode_host_lost)
{
	static char out[OUT_CAP], args[1024], pre[256];
	const char *why = cluster_unavailable();
	double secs;
	char *dir;
	int rc;
	if (why)
		return TEST_SKIP("%s", why);
	dir = realpath(test_prog_dir(), NULL);
	CHECK(dir != NULL);
	snprintf(args, sizeof args, "%s/mn_prog loop", dir);
	free(dir);
	snprintf(pre, sizeof pre, "(sleep 3; ip netns pids lt%d1 | xargs -r kill -9) &", (int)getpid() % 100000);
	rc = cluster_mpirun_pre(pre, args, out, 60, &secs);
	CHECK_MSG(rc != 0 && rc != -1 && rc != 124, "mpirun mn_prog loop: exit %d (expected a failure):\n%s", rc, out);
	CHECK_MSG(secs < 3 + 10 + 3, "the job took %.1f s to end after its second host was lost:\n%s", secs, out);
	CHECK_CONTAINS(out, "10.231.7.2"); /* "ORTE has lost communication with ... daemon ... on node 10.231.7.2" */
	return no_namespaces_left();
}

/* Run mpirun with `pre` (a fault started in the background) and args, which must fail at the ranks'
 * deadline (LOOM_TIMEOUT_S=5 in args): a timeout naming host 1 (lt<p>1) as the host waited on,
 * detected 4-10 s after the step that waited began by the ranks 0..waiters-1 ("rank r: step s failed
 * after x s"; a stopped host's ranks, continued, may report their own step's length too, which is
 * the stop's); *worst gets that time, *secs mpirun's. */
static int fails_at_deadline(const char *what, const char *pre, const char *args, int p, int waiters, double *worst,
                             double *secs)
{
	static char out[OUT_CAP];
	char want[128];
	double v;
	int r, step;
	int rc = cluster_mpirun_pre(pre, args, out, 120, secs);
	CHECK_MSG(rc != 0 && rc != -1 && rc != 124, "%s: exit %d (expected a failure):\n%s", what, rc, out);
	CHECK_CONTAINS(out, "timed out after 5 s");
	snprintf(want, sizeof want, "on host lt%d1)", p); /* a host-0 rank names the host it waited on */
	CHECK_CONTAINS(out, want);
	*worst = -1;
	for (const char *q = out; (q = strstr(q, "rank ")) != NULL; q++)
		if (sscanf(q, "rank %d: step %d failed after %lf", &r, &step, &v) == 3 && r < waiters && v > *worst)
			*worst = v;
	CHECK_MSG(*worst > 4 && *worst < 10, "%s: detection took %.1f s (LOOM_TIMEOUT_S=5):\n%s", what, *worst, out);
	return 0;
}

/* The link between the hosts taken down (issue 23) while 4 ranks all-reduce every 0.1 s (mn_prog
 * steps): for 1 s, TCP retransmits and the job rides through, every rank ending "ok"; for 15 s with
 * LOOM_TIMEOUT_S=5, the ranks fail at their deadline (no hang: about 5 s after the step that
 * waited began), naming the rank and host they waited on. mpirun itself ends only once the link is
 * back (it reaches the other host's daemon over it). */
TEST(multinode_link_down)
{
	static char out[OUT_CAP], args[1024], pre[512], want[128];
	const char *why = cluster_unavailable();
	int p = (int)getpid() % 100000, rc;
	double secs, worst = -1;
	char *dir;
	if (why)
		return TEST_SKIP("%s", why);
	dir = realpath(test_prog_dir(), NULL);
	CHECK(dir != NULL);
	snprintf(args, sizeof args, "%s/mn_prog steps", dir);
	snprintf(pre, sizeof pre, "(sleep 3; ip -n lt%d1 link set lt%de1 down; sleep 1; ip -n lt%d1 link set lt%de1 up) &",
	         p, p, p, p);
	rc = cluster_mpirun_pre(pre, args, out, 90, &secs);
	CHECK_MSG(rc == 0, "a 1 s link outage: exit %d:\n%s", rc, out);
	for (int r = 0; r < 4; r++) {
		snprintf(want, sizeof want, "rank %d of 4: ok", r);
		CHECK_CONTAINS(out, want);
	}
	snprintf(args, sizeof args, "-x LOOM_TIMEOUT_S=5 %s/mn_prog steps", dir);
	free(dir);
	snprintf(pre, sizeof pre, "(sleep 3; ip -n lt%d1 link set lt%de1 down; sleep 15; ip -n lt%d1 link set lt%de1 up) &",
	         p, p, p, p);
	CHECK_EQ(fails_at_deadline("a 15 s link outage", pre, args, p, 4, &worst, &secs), 0);
	printf("  link down 15 s: ranks failed %.1f s after their step began (LOOM_TIMEOUT_S=5); mpirun ended after %.0f s\n",
	       worst, secs);
	return no_namespaces_left();
}

/* Every rank of host 1 stopped (SIGSTOP) for 12 s while 4 ranks all-reduce every 0.1 s, with
 * LOOM_TIMEOUT_S=5 (issue 23): host 0's ranks fail at their deadline naming the rank and host they
 * waited on, no hang; host 1's ranks, continued, fail at once with that failure. */
TEST(multinode_host_stopped)
{
	static char args[1024], pre[512];
	const char *why = cluster_unavailable();
	int p = (int)getpid() % 100000;
	double secs, worst = -1;
	char *dir;
	if (why)
		return TEST_SKIP("%s", why);
	dir = realpath(test_prog_dir(), NULL);
	CHECK(dir != NULL);
	snprintf(args, sizeof args, "-x LOOM_TIMEOUT_S=5 %s/mn_prog steps", dir);
	free(dir);
	snprintf(pre, sizeof pre,
	         "(sleep 3; ip netns pids lt%d1 | xargs -r kill -STOP; sleep 12; ip netns pids lt%d1 | xargs -r kill -CONT) &",
	         p, p);
	CHECK_EQ(fails_at_deadline("host 1 stopped", pre, args, p, 2, &worst, &secs), 0); /* host 0's ranks */
	printf("  host 1 stopped: host 0's ranks failed %.1f s after their step began (LOOM_TIMEOUT_S=5)\n", worst);
	return no_namespaces_left();
}

/* A rank that exits (status 0) before loom_comm_init, on either host (issue 23): MPI_Init would wait
 * for it forever; the other ranks of its host see it gone in their pre-init rendezvous and fail
 * within 2 s naming it, and mpirun ends the job. */
TEST(multinode_early_exit)
{
	static char out[OUT_CAP], args[1024];
	static const char *const modes[] = {"1:before", "3:before", "0:before"};
	const char *why = cluster_unavailable();
	char *dir;
	if (why)
		return TEST_SKIP("%s", why);
	dir = realpath(test_prog_dir(), NULL);
	CHECK(dir != NULL);
	for (int m = 0; m < 3; m++) {
		double secs, worst = -1, v;
		int rc;
		snprintf(args, sizeof args, "-x COMM_PROG_EXIT=%s %s/comm_prog", modes[m], dir);
		rc = cluster_mpirun(args, out, 90, &secs);
		CHECK_MSG(rc != 0 && rc != -1 && rc != 124, "%s: exit %d (expected a failure):\n%s", modes[m], rc, out);
		CHECK_CONTAINS(out, "loom_comm_init: before MPI_Init: local rank ");
		for (const char *q = out; (q = strstr(q, " failed after ")) != NULL; q++)
			if (sscanf(q, " failed after %lf", &v) == 1 && v > worst)
				worst = v;
		CHECK_MSG(worst >= 0 && worst < 2, "%s: the others failed after %.2f s:\n%s", modes[m], worst, out);
		CHECK_MSG(secs < 30, "%s: the job took %.1f s:\n%s", modes[m], secs, out);
		printf("  %s: detected after %.2f s, mpirun ended after %.1f s\n", modes[m], worst, secs);
	}
	free(dir);
	return no_namespaces_left();
}

/* `loom run --hostfile` prints the mpirun command and runs it (LOOM_MPIRUN: the cluster's mpirun). */
TEST(multinode_loom_run_hostfile)
{
	static char out[OUT_CAP], args[2048];
	const char *why = cluster_unavailable();
	char *dir, *loom, *script, hf[600], tmp[512];
	if (why)
		return TEST_SKIP("%s", why);
	dir = realpath(test_prog_dir(), NULL), loom = realpath(test_loom_bin(), NULL);
	script = realpath("scripts/netns-cluster.sh", NULL);
	CHECK(dir && loom && script);
	CHECK_OK(test_mkdtemp(tmp, sizeof tmp));
	snprintf(hf, sizeof hf, "%s/hosts", tmp);
	CHECK_OK(test_write_file(hf, "10.231.7.1 slots=2\n# the second host\n10.231.7.2\n", 48));
	snprintf(args, sizeof args,
	         "export LOOM_NETNS_PREFIX=lt%d; trap '%s down' EXIT; %s up && LOOM_MPIRUN='%s mpirun' "
	         "ASAN_OPTIONS=detect_leaks=0 "
	         "timeout 60 %s run --hostfile %s --nproc-per-node 2 %s/comm_prog",
	         (int)getpid() % 100000, script, script, script, loom, hf, dir);
	free(dir), free(loom), free(script);
	CHECK_MSG(test_run_cmd(args, out, OUT_CAP, 90) == 0, "loom run --hostfile failed:\n%s", out);
	CHECK_CONTAINS(out, "loom run: running: ");
	CHECK_CONTAINS(out, " -np 4 --host 10.231.7.1:2,10.231.7.2:2 ");
	for (int r = 0; r < 4; r++) {
		char want[64];
		snprintf(want, sizeof want, "rank %d of 4: ok", r);
		CHECK_CONTAINS(out, want);
	}
	test_rmdir(tmp);
	return no_namespaces_left();
}

/* ---- DDP training across hosts ---- */

enum { VOCAB = 64, STEPS = 10, MAXSTEPS = 64 };

#define MODEL_FLAGS                                                                                  \
	"--n-layer 2 --n-head 2 --n-embd 32 --vocab-size 64 --n-positions 16 --batch-size 2 --seq-len 16 "   \
	"--lr 1e-2 --warmup 2 --min-lr-frac 0.1 --shuffle 1 --seed 7 --peak-flops 1e10"

static int make_data(const char *dir)
{
	return test_make_token_data(dir, VOCAB, 6001);
}

static int read_losses(const char *path, double *loss)
{
	return test_read_losses(path, loss, MAXSTEPS, NULL, NULL);
}

/* Train the tiny model as one process (total batch 128, so accumulation 4) and on the cluster with
 * `cluster_flags` added (log many.jsonl); both outputs must contain their `want_*` line, and every
 * step's loss on the cluster must be within 1e-5 relative of the one process's. */
static int cluster_train_equals_one_process(const char *cluster_flags, const char *want_one, const char *want_cluster)
{
	static char out[OUT_CAP], cmd[4096];
	char dir[512], *loom;
	double ref[MAXSTEPS] = {0}, got[MAXSTEPS] = {0};
	int rc;
	loom = realpath(test_loom_bin(), NULL);
	CHECK(loom != NULL);
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(make_data(dir));
	snprintf(cmd, sizeof cmd, "OMP_NUM_THREADS=1 %s train --train-data '%s/train_*.bin' " MODEL_FLAGS
	         " --steps %d --total-batch-size 128 --threads 1 --log %s/one.jsonl", loom, dir, STEPS, dir);
	rc = test_run_cmd(cmd, out, OUT_CAP, 60);
	CHECK_MSG(rc == 0, "one process: exit %d:\n%s", rc, out);
	CHECK_CONTAINS(out, want_one);
	snprintf(cmd, sizeof cmd, "%s train --train-data '%s/train_*.bin' " MODEL_FLAGS
	         " --steps %d --total-batch-size 128 --threads 1 %s --log %s/many.jsonl", loom, dir, STEPS, cluster_flags, dir);
	rc = cluster_mpirun(cmd, out, 120, NULL);
	free(loom);
	CHECK_MSG(rc == 0, "mpirun loom train %s: exit %d:\n%s", cluster_flags, rc, out);
	CHECK_CONTAINS(out, want_cluster);
	snprintf(cmd, sizeof cmd, "%s/one.jsonl", dir);
	CHECK_EQ(read_losses(cmd, ref), STEPS);
	snprintf(cmd, sizeof cmd, "%s/many.jsonl", dir);
	CHECK_EQ(read_losses(cmd, got), STEPS);
	for (int s = 1; s <= STEPS; s++)
		CHECK_NEAR(got[s], ref[s], 1e-5 * ref[s]);
	CHECK(ref[STEPS] < ref[1] - 0.1);
	test_rmdir(dir);
	return no_namespaces_left();
}

/* 2 hosts x 2 ranks, accumulation 1, against one process with accumulation 4 at the same total
 * batch: every step's loss within 1e-5 relative; --check-replicas 1 fails the run if replicas drift. */
TEST(multinode_ddp_train_equals_one_process)
{
	const char *why = cluster_unavailable();
	if (why)
		return TEST_SKIP("%s", why);
	return cluster_train_equals_one_process("--check-replicas 1 --bucket-mb 0.004", "accum=4 -> 128 tokens per step",
	                                        "accum=1 ranks=4 -> 128 tokens per step");
}

/* kill -9 of a rank on the second host in the middle of training across hosts with `flags` (issue
 * 23): mpirun ends the job within seconds naming the rank and its host, the last committed
 * checkpoint loads, and `--resume` continues to the end with a final checkpoint byte-identical to an
 * uninterrupted run's. */
static int cluster_kill_resumes(const char *flags)
{
	enum { N = 60 };
	static char out[OUT_CAP], cmd[4096], pre[1024];
	const char *why = cluster_unavailable();
	char dir[512], *loom, train[2048];
	int p = (int)getpid() % 100000, rc;
	double secs, killed_at = 0;
	if (why)
		return TEST_SKIP("%s", why);
	loom = realpath(test_loom_bin(), NULL);
	CHECK(loom != NULL);
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(make_data(dir));
	snprintf(train, sizeof train, "%s train --train-data '%s/train_*.bin' " MODEL_FLAGS
	         " --steps %d --total-batch-size 128 --threads 1 %s --save-every 5 --keep-checkpoints 2 --resume",
	         loom, dir, N, flags);
	free(loom);
	snprintf(cmd, sizeof cmd, "%s --save-dir %s/ref --log %s/ref.jsonl", train, dir, dir);
	rc = cluster_mpirun(cmd, out, 120, NULL);
	CHECK_MSG(rc == 0, "the uninterrupted run: exit %d:\n%s", rc, out);
	/* Once step 10 is committed, SIGKILL the first `loom train` process on host 1. */
	snprintf(pre, sizeof pre,
	         "(for i in $(seq 2000); do [ -d %s/ck/step_00000010 ] && break; sleep 0.01; done; "
	         "for q in $(ip netns pids lt%d1); do if tr '\\0' ' ' < /proc/$q/cmdline 2>/dev/null | grep -q ' train '; "
	         "then kill -9 $q; echo \"killed pid $q on host 1 at $(date +%%s.%%N)\"; break; fi; done) &",
	         dir, p);
	snprintf(cmd, sizeof cmd, "%s --save-dir %s/ck --log %s/ck.jsonl", train, dir, dir);
	rc = cluster_mpirun_pre(pre, cmd, out, 120, &secs);
	CHECK_MSG(rc != 0 && rc != -1 && rc != 124, "the killed run: exit %d (expected a failure):\n%s", rc, out);
	{
		struct timespec now;
		const char *k = strstr(out, "on host 1 at ");
		clock_gettime(CLOCK_REALTIME, &now);
		CHECK_MSG(k && sscanf(k, "on host 1 at %lf", &killed_at) == 1, "no kill:\n%s", out);
		/* an upper bound: from the kill to the teardown of the cluster after mpirun */
		killed_at = (double)now.tv_sec + 1e-9 * (double)now.tv_nsec - killed_at;
	}
	CHECK_MSG(killed_at < 10, "the job ended %.1f s after the kill:\n%s", killed_at, out);
	CHECK_CONTAINS(out, "exited on signal 9");
	CHECK_CONTAINS(out, "10.231.7.2"); /* "... on node 10.231.7.2 exited on signal 9 (Killed)" */
	rc = cluster_mpirun(cmd, out, 120, NULL);
	CHECK_MSG(rc == 0, "the resumed run: exit %d:\n%s", rc, out);
	CHECK_CONTAINS(out, "resumed from ");
	snprintf(cmd, sizeof cmd, "cd %s && for f in ref/step_%08d/*.safetensors; do cmp \"$f\" \"ck/${f#ref/}\" || exit 1; done",
	         dir, N);
	rc = test_run_cmd(cmd, out, OUT_CAP, 30);
	CHECK_MSG(rc == 0, "the resumed run ended with other parameters than the uninterrupted one:\n%s", out);
	printf("  %s: the job (and the cluster's teardown) ended %.2f s after the kill (after step 10's checkpoint)\n",
	       flags, killed_at);
	test_rmdir(dir);
	return no_namespaces_left();
}

/* dp 2 x pp 2: activations and gradients cross the link every micro-batch, so the kill lands in a
 * pipeline exchange (or a save). */
TEST(multinode_pp_rank_killed_resumes)
{
	return cluster_kill_resumes("--pp 2");
}

/* ZeRO-3 over 4 ranks on 2 hosts: every unit's parameters are gathered across the link in forward
 * and backward, so the kill lands in a gather (or a sharded save). */
TEST(multinode_zero3_rank_killed_resumes)
{
	return cluster_kill_resumes("--zero 3");
}

/* Pipeline parallel across hosts: dp 2 x pp 2 (ranks ordered dp, then pp: stage 0 on the first host,
 * stage 1 on the second, activations and gradients between the stages over MPI), against one
 * process with the same total batch: every step's loss within 1e-5 relative. */
TEST(multinode_pp_across_hosts_equals_one_process)
{
	const char *why = cluster_unavailable();
	if (why)
		return TEST_SKIP("%s", why);
	return cluster_train_equals_one_process("--pp 2", "accum=4 -> 128 tokens per step",
	                                        "pipeline parallel: 2 stages x dp 2");
}

/* tp inside a host, pp across hosts (tp 2 x pp 2: each host's two ranks are one stage's tensor-
 * parallel group, the stages on the two hosts), and the mesh print says so; and ZeRO-1 on each
 * stage's data-parallel ranks (dp 2 x pp 2: dp within a host). Each against one process. */
TEST(multinode_tp_within_pp_across_hosts)
{
	const char *why = cluster_unavailable();
	if (why)
		return TEST_SKIP("%s", why);
	int rc = cluster_train_equals_one_process("--tp 2 --pp 2", "accum=4 -> 128 tokens per step",
	                                          "mesh: hosts: 2; tp within a host; pp across hosts");
	if (rc)
		return rc;
	return cluster_train_equals_one_process("--pp 2 --zero 1", "accum=4 -> 128 tokens per step",
	                                        "mesh: hosts: 2; dp within a host; pp across hosts");
}
