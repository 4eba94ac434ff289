/* test_launcher.c: `loom run` end to end: the environment contract, output prefixes and --ranks,
 * failures (exit code, signal, SIGTERM-resistant ranks, grandchildren, stopped and wedged ranks, rank
 * 0 gone at rendezvous), signal forwarding, flag errors and shared-memory cleanup (exactly this job's). Ranks are tests/progs/launch_rank.c (and launch_allreduce_die.c
 * for the death test with real collectives); every command runs under test_run_cmd's timeout. */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "test.h"

#define OUT_CAP 65536

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Run `loom run <args>` with `env` prefixed (e.g. "X=1 "), capture stdout+stderr into out (or only
 * one of them with redirections in `args`); returns the exit status, *secs the wall time. */
static int run_loom(const char *env, const char *args, char *out, double timeout_s, double *secs)
{
	char cmd[2048];
	double t0 = now_s();
	int rc;
	snprintf(cmd, sizeof cmd, "%s%s run %s", env ? env : "", test_loom_bin(), args);
	rc = test_run_cmd(cmd, out, OUT_CAP, timeout_s);
	if (secs)
		*secs = now_s() - t0;
	return rc;
}

/* run_loom into `out` and check the exit status, printing the output when it differs. */
#define CHECK_RUN(env, args, want, secs)                                                          \
	do {                                                                                         \
		int rc_ = run_loom(env, args, out, 60, secs);                                            \
		CHECK_MSG(rc_ == (want), "loom run %s: exit %d, expected %d; output:\n%s", args, rc_, want, out); \
	} while (0)

static const char *prog(const char *name)
{
	static char buf[4][512];
	static int k;
	k = (k + 1) % 4;
	snprintf(buf[k], sizeof buf[k], "%s/%s", test_prog_dir(), name);
	return buf[k];
}

static int count(const char *hay, const char *needle)
{
	int n = 0;
	for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle))
		n++;
	return n;
}

TEST(launcher_env_contract)
{
	char out[OUT_CAP], args[1024], line[512];
	snprintf(args, sizeof args, "--nproc-per-node 3 %s env 2>/dev/null", prog("launch_rank"));
	CHECK_RUN("unset OMP_NUM_THREADS; LOOM_JOB_ID=jobenv1 ", args, 0, NULL);
	for (int r = 0; r < 3; r++) {
		snprintf(line, sizeof line,
		         "[rank %d] RANK=%d LOCAL_RANK=%d WORLD_SIZE=3 LOCAL_WORLD_SIZE=3 GROUP_RANK=0 MASTER_ADDR=127.0.0.1 "
		         "MASTER_PORT=29500 OMP_NUM_THREADS=1 LOOM_JOB_ID=jobenv1\n", r, r, r);
		CHECK_CONTAINS(out, line);
	}
	CHECK_EQ(count(out, "\n"), 3);

	/* torchrun's spellings; a preset OMP_NUM_THREADS is kept; a fresh job id when none is set. */
	snprintf(args, sizeof args,
	         "--nproc_per_node=2 --master_addr 10.1.2.3 --master_port=4242 --nnodes 1 --node_rank 0 %s env 2>&1",
	         prog("launch_rank"));
	CHECK_RUN("unset LOOM_JOB_ID; OMP_NUM_THREADS=3 ", args, 0, NULL);
	CHECK_CONTAINS(out, "[rank 1] RANK=1 LOCAL_RANK=1 WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 GROUP_RANK=0 "
	                    "MASTER_ADDR=10.1.2.3 MASTER_PORT=4242 OMP_NUM_THREADS=3 LOOM_JOB_ID=");
	CHECK(!strstr(out, "OMP_NUM_THREADS=1 for each rank")); /* no note: it was set */
	{
		const char *a = strstr(out, "[rank 0] RANK=0"), *b = strstr(out, "[rank 1] RANK=1");
		CHECK(a && b);
		a = strstr(a, "LOOM_JOB_ID="), b = strstr(b, "LOOM_JOB_ID=");
		CHECK(a && b && a[12] != '\n' && strncmp(a, "LOOM_JOB_ID=(unset)", 19) != 0);
		CHECK_EQ(strcspn(a, "\n"), strcspn(b, "\n"));
		CHECK(strncmp(a, b, strcspn(a, "\n")) == 0); /* one id for the whole job */
	}
	/* The note about OMP_NUM_THREADS appears once, when loom run sets it. */
	snprintf(args, sizeof args, "--nproc-per-node 2 --standalone %s env", prog("launch_rank"));
	CHECK_RUN("OMP_NUM_THREADS= ", args, 0, NULL);
	CHECK_EQ(count(out, "loom run: setting OMP_NUM_THREADS=1"), 1);
	CHECK(strstr(out, "MASTER_PORT=") && !strstr(out, "MASTER_PORT=29500")); /* --standalone: a free port */
	return 0;
}

TEST(launcher_prefix_and_streams)
{
	char out[OUT_CAP], args[1024], line[64];
	/* stdout and stderr stay apart, each line prefixed with its rank. */
	snprintf(args, sizeof args, "--nproc-per-node 3 %s lines 2>/dev/null", prog("launch_rank"));
	CHECK_RUN("OMP_NUM_THREADS=1 ", args, 0, NULL);
	CHECK_EQ(strlen(out), 3 * strlen("[rank 0] out 0\n"));
	for (int r = 0; r < 3; r++) {
		snprintf(line, sizeof line, "[rank %d] out %d\n", r, r);
		CHECK_CONTAINS(out, line);
	}
	snprintf(args, sizeof args, "--nproc-per-node 3 %s lines 2>&1 >/dev/null", prog("launch_rank"));
	CHECK_RUN("OMP_NUM_THREADS=1 ", args, 0, NULL);
	CHECK_EQ(strlen(out), 3 * strlen("[rank 0] err 0\n"));
	for (int r = 0; r < 3; r++) {
		snprintf(line, sizeof line, "[rank %d] err %d\n", r, r);
		CHECK_CONTAINS(out, line);
	}

	/* --ranks shows only the listed ranks, on both streams. */
	snprintf(args, sizeof args, "--nproc-per-node 3 --ranks 0,2 %s lines 2>&1", prog("launch_rank"));
	CHECK_RUN("OMP_NUM_THREADS=1 ", args, 0, NULL);
	CHECK_CONTAINS(out, "[rank 0] out 0\n");
	CHECK_CONTAINS(out, "[rank 2] err 2\n");
	CHECK(!strstr(out, "rank 1"));
	snprintf(args, sizeof args, "--nproc-per-node 3 --ranks 1 %s lines 2>&1", prog("launch_rank"));
	CHECK_RUN("OMP_NUM_THREADS=1 ", args, 0, NULL);
	CHECK_STREQ(out, strstr(out, "[rank 1] out 1\n") == out ? "[rank 1] out 1\n[rank 1] err 1\n"
	                                                          : "[rank 1] err 1\n[rank 1] out 1\n");

	/* A partial line waits for its end; '\r' progress lines keep their '\r'; a last line without
	 * '\n' gets one. */
	snprintf(args, sizeof args, "%s streams 2>/dev/null", prog("launch_rank"));
	CHECK_RUN(NULL, args, 0, NULL);
	CHECK_STREQ(out, "[rank 0] out\n[rank 0] partial\n[rank 0] 10%\r[rank 0] 20%\r[rank 0] done\n"
	                 "[rank 0] crlf\r\n[rank 0] no newline at end\n");
	return 0;
}

TEST(launcher_rank_exit_code)
{
	char out[OUT_CAP], args[1024];
	double secs;
	snprintf(args, sizeof args, "--nproc-per-node 3 %s exit 1 3", prog("launch_rank"));
	CHECK_RUN("OMP_NUM_THREADS=1 ", args, 1, &secs);
	CHECK_CONTAINS(out, "[rank 1] rank 1: failing now\n");
	CHECK_CONTAINS(out, "loom run: rank 1 (pid ");
	CHECK_CONTAINS(out, ") exited with code 3; stopping the other ranks");
	CHECK_CONTAINS(out, "loom run: job failed; first failure: rank 1 (pid ");
	CHECK_MSG(secs < 10, "the sleeping ranks were not stopped: %.1f s", secs);
	/* Hidden by --ranks, the failed rank's last stderr lines still appear in the report. */
	snprintf(args, sizeof args, "--nproc-per-node 2 --ranks 0 %s exit 1 7", prog("launch_rank"));
	CHECK_RUN("OMP_NUM_THREADS=1 ", args, 1, NULL);
	CHECK_CONTAINS(out, "rank 1's last stderr lines (not shown above because of --ranks):\n"
	                    "[rank 1] rank 1: failing now\n");
	CHECK_CONTAINS(out, "exited with code 7");
	return 0;
}

TEST(launcher_rank_killed)
{
	char out[OUT_CAP], args[1024];
	double secs;
	snprintf(args, sizeof args, "--nproc-per-node 3 %s signal 1 9", prog("launch_rank"));
	CHECK_RUN("OMP_NUM_THREADS=1 ", args, 1, &secs);
	CHECK_CONTAINS(out, "loom run: rank 1 (pid ");
	CHECK_CONTAINS(out, ") was killed by signal 9 (SIGKILL); stopping the other ranks");
	CHECK_CONTAINS(out, "first failure: rank 1 (pid ");
	CHECK_MSG(secs < 5, "took %.1f s", secs);
	CHECK(!strstr(out, "sending SIGKILL")); /* the others stopped at SIGTERM */
	return 0;
}

TEST(launcher_sigkill_after_grace)
{
	char out[OUT_CAP], args[1024];
	double secs;
	/* Ranks 0 and 2 ignore SIGTERM: after LOOM_KILL_GRACE_S they get SIGKILL. */
	snprintf(args, sizeof args, "--nproc-per-node 3 %s stubborn 1 4", prog("launch_rank"));
	CHECK_RUN("OMP_NUM_THREADS=1 LOOM_KILL_GRACE_S=0.5 ", args, 1, &secs);
	CHECK_CONTAINS(out, ") exited with code 4; stopping the other ranks (SIGTERM, SIGKILL after 0.5 s)");
	CHECK_CONTAINS(out, "loom run: ranks 0, 2 still running 0.5 s after SIGTERM: sending SIGKILL");
	CHECK_CONTAINS(out, "first failure: rank 1 (pid ");
	CHECK_MSG(secs < 10, "took %.1f s", secs);
	return 0;
}

/* 1 when process `pid` is gone or a zombie. */
static int process_gone(long pid)
{
	char path[64], buf[256];
	FILE *f;
	size_t n;
	if (kill((pid_t)pid, 0) != 0)
		return errno == ESRCH;
	snprintf(path, sizeof path, "/proc/%ld/stat", pid);
	if (!(f = fopen(path, "r")))
		return 1;
	n = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	buf[n] = '\0';
	const char *p = strrchr(buf, ')');
	return p && p[1] == ' ' && p[2] == 'Z';
}

TEST(launcher_kills_grandchildren)
{
	char out[OUT_CAP], args[1024], dir[512], path[600];
	CHECK(test_mkdtemp(dir, sizeof dir) == 0);
	snprintf(args, sizeof args, "--nproc-per-node 2 %s grandchild %s", prog("launch_rank"), dir);
	CHECK_RUN("OMP_NUM_THREADS=1 ", args, 1, NULL);
	CHECK_CONTAINS(out, "exited with code 3");
	for (int r = 0; r < 2; r++) {
		long pid = 0;
		double t0 = now_s();
		FILE *f;
		snprintf(path, sizeof path, "%s/gc.%d", dir, r);
		f = fopen(path, "r");
		CHECK_MSG(f, "no %s", path);
		CHECK(fscanf(f, "%ld", &pid) == 1 && pid > 1);
		fclose(f);
		while (!process_gone(pid) && now_s() - t0 < 3)
			usleep(10000);
		CHECK_MSG(process_gone(pid), "rank %d's child %ld survived the job", r, pid);
	}
	test_rmdir(dir);
	return 0;
}

TEST(launcher_forwards_sigterm)
{
	char out[OUT_CAP], cmd[2048], dir[512];
	CHECK(test_mkdtemp(dir, sizeof dir) == 0);
	/* Wait until both ranks have their handler, then SIGTERM loom run: each rank gets it. */
	snprintf(cmd, sizeof cmd,
	         "OMP_NUM_THREADS=1 %s run --nproc-per-node 2 %s trap %s & pid=$!; "
	         "while [ ! -s %s/ready.0 ] || [ ! -s %s/ready.1 ]; do kill -0 $pid || break; sleep 0.02; done; "
	         "kill -TERM $pid; wait $pid; echo \"rc=$?\"",
	         test_loom_bin(), prog("launch_rank"), dir, dir, dir);
	CHECK_MSG(test_run_cmd(cmd, out, sizeof out, 30) == 0, "output:\n%s", out);
	CHECK_CONTAINS(out, "loom run: got SIGTERM: forwarding it to the ranks");
	CHECK_CONTAINS(out, "[rank 0] got signal 15\n");
	CHECK_CONTAINS(out, "[rank 1] got signal 15\n");
	CHECK_CONTAINS(out, "rc=143\n"); /* loom run dies of the signal it was sent */
	CHECK(!strstr(out, "first failure"));
	test_rmdir(dir);
	return 0;
}

TEST(launcher_bad_usage)
{
	static const struct {
		const char *env, *args, *msg;
		int rc;
	} cases[] = {
		{NULL, "--nnodes 2 true", "loom run: --nnodes 2: loom does not rendezvous across hosts", 2},
		{NULL, "--nnodes=1:4 true", "loom run --hostfile FILE --nproc-per-node N", 2},
		{NULL, "--nproc-per-node 0 true", "--nproc-per-node: 0 is out of range (expected 1..1024)", 2},
		{NULL, "--nproc-per-node two true", "--nproc-per-node: 'two' is not an integer", 2},
		{NULL, "--nproc-per-node", "--nproc-per-node needs a value", 2},
		{NULL, "--master-port 70000 true", "--master-port: 70000 is out of range", 2},
		{NULL, "--node-rank 1 true", "--node-rank: 1 is out of range (expected 0..0)", 2},
		{NULL, "--nproc-per-node 2 --ranks 2 true", "--ranks: rank 2 does not exist (the job has ranks 0..1)", 2},
		{NULL, "--ranks 0,x true", "--ranks: '0,x' is not a list of ranks", 2},
		{NULL, "--bogus true", "loom run: unknown flag '--bogus'", 2},
		{NULL, "--nproc-per-node 2", "loom run: missing PROGRAM to run", 2},
		{"LOOM_KILL_GRACE_S=soon ", "true", "LOOM_KILL_GRACE_S='soon' is not a number of seconds", 2},
		{"LOOM_JOB_ID=a/b ", "true", "LOOM_JOB_ID='a/b' must be 1 to 48 characters from [A-Za-z0-9_.-]", 2},
		{NULL, "--nproc-per-node 2 ./no-such-program-xyz", "loom run: cannot execute './no-such-program-xyz': No such file or directory", 127},
		{NULL, "/dev/null", "loom run: cannot execute '/dev/null': Permission denied", 126},
	};
	char out[OUT_CAP];
	for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
		int rc = run_loom(cases[k].env, cases[k].args, out, 30, NULL);
		CHECK_MSG(rc == cases[k].rc, "loom run %s: exit %d, expected %d; output: %s", cases[k].args, rc, cases[k].rc, out);
		CHECK_CONTAINS(out, cases[k].msg);
	}
	CHECK_RUN(NULL, "--help", 0, NULL);
	CHECK_CONTAINS(out, "usage: loom run [--nproc-per-node N]");
	CHECK_CONTAINS(out, "LOOM_KILL_GRACE_S");
	return 0;
}

TEST(launcher_removes_leftover_segments)
{
	char out[OUT_CAP], args[1024], job[64], env[128], mine[160], other[160], longer[160], dashed[160];
	struct stat st;
	FILE *f;
	snprintf(job, sizeof job, "ltest%d", (int)getpid());
	snprintf(mine, sizeof mine, "/dev/shm/loom-%s@leftover", job);
	snprintf(other, sizeof other, "/dev/shm/loom-other%d", (int)getpid()); /* another job's: kept */
	/* jobs whose ids start with ours (issue 13, finding 9): kept too */
	snprintf(longer, sizeof longer, "/dev/shm/loom-%sb@w", job);
	snprintf(dashed, sizeof dashed, "/dev/shm/loom-%s-b@w", job);
	CHECK((f = fopen(other, "w")) != NULL);
	fclose(f);
	CHECK((f = fopen(longer, "w")) != NULL);
	fclose(f);
	CHECK((f = fopen(dashed, "w")) != NULL);
	fclose(f);
	snprintf(env, sizeof env, "OMP_NUM_THREADS=1 LOOM_JOB_ID=%s ", job);
	snprintf(args, sizeof args, "--nproc-per-node 2 %s shm", prog("launch_rank"));
	CHECK_RUN(env, args, 0, NULL);
	CHECK_CONTAINS(out, "loom run: removed 1 shared-memory segment left by the job (/dev/shm/loom-ltest");
	CHECK_MSG(stat(mine, &st) != 0, "%s was left behind", mine);
	CHECK_MSG(stat(other, &st) == 0, "%s (another job's) was removed", other);
	CHECK_MSG(stat(longer, &st) == 0, "%s (job %sb's) was removed", longer, job);
	CHECK_MSG(stat(dashed, &st) == 0, "%s (job %s-b's) was removed", dashed, job);
	unlink(other), unlink(longer), unlink(dashed);
	return 0;
}

/* The death test with real collectives: rank 1 raises SIGKILL during a loop of all-reduces; the
 * survivors get LOOM_EPEERLOST naming rank 1 in under 2 s, loom run names rank 1 and its signal,
 * exits 1, and no shared-memory segment of the job is left. */
TEST(launcher_death_during_allreduce)
{
	char out[OUT_CAP], args[1024], env[128], line[64];
	double secs;
	snprintf(env, sizeof env, "OMP_NUM_THREADS=1 LOOM_JOB_ID=ldeath%d ", (int)getpid());
	snprintf(args, sizeof args, "--nproc-per-node 3 %s 1 10 262147", prog("launch_allreduce_die"));
	CHECK_RUN(env, args, 1, &secs);
	CHECK_CONTAINS(out, "[rank 1] raising SIGKILL in iteration 10\n");
	CHECK_CONTAINS(out, "loom run: rank 1 (pid ");
	CHECK_CONTAINS(out, ") was killed by signal 9 (SIGKILL); stopping the other ranks");
	CHECK_CONTAINS(out, "first failure: rank 1 (pid ");
	for (int r = 0; r < 3; r += 2) {
		const char *p;
		double dt = -1;
		snprintf(line, sizeof line, "[rank %d] allreduce ", r);
		p = strstr(out, line);
		CHECK_MSG(p, "rank %d did not report its failed all-reduce:\n%s", r, out);
		p = strstr(p, "failed after ");
		CHECK(p && sscanf(p, "failed after %lf s", &dt) == 1);
		CHECK_MSG(dt >= 0 && dt < 2.0, "rank %d noticed the death after %.3f s", r, dt);
		CHECK(strncmp(strstr(p, " s: ") + 4, "LOOM_EPEERLOST (-6): ", 21) == 0);
		CHECK(strstr(p, "rank 1") && strstr(p, "rank 1") < strchr(p, '\n')); /* names the dead rank */
	}
	CHECK(!strstr(out, "sending SIGKILL")); /* the survivors ended by themselves */
	CHECK_MSG(secs < 10, "took %.1f s", secs);
	{
		char cmd[160], ls[256];
		snprintf(cmd, sizeof cmd, "ls /dev/shm | grep -c '^loom-ldeath%d' || true", (int)getpid());
		CHECK_EQ(test_run_cmd(cmd, ls, sizeof ls, 10), 0);
		CHECK_STREQ(ls, "0\n");
	}
	return 0;
}

TEST(launcher_second_signal_kills)
{
	char out[OUT_CAP], cmd[2048], dir[512];
	double t0 = now_s();
	CHECK(test_mkdtemp(dir, sizeof dir) == 0);
	/* The ranks ignore SIGTERM; a second SIGTERM to loom run kills them at once (no 5 s grace). */
	snprintf(cmd, sizeof cmd,
	         "OMP_NUM_THREADS=1 LOOM_KILL_GRACE_S=20 %s run --nproc-per-node 2 %s trap %s ignore & pid=$!; "
	         "while [ ! -s %s/ready.0 ] || [ ! -s %s/ready.1 ]; do kill -0 $pid || break; sleep 0.02; done; "
	         "kill -TERM $pid; sleep 0.2; kill -TERM $pid; wait $pid; echo \"rc=$?\"",
	         test_loom_bin(), prog("launch_rank"), dir, dir, dir);
	CHECK_MSG(test_run_cmd(cmd, out, sizeof out, 30) == 0, "output:\n%s", out);
	CHECK_CONTAINS(out, "loom run: got SIGTERM: forwarding it to the ranks (SIGKILL after 20 s)\n");
	CHECK_CONTAINS(out, "loom run: got SIGTERM again: killing the ranks\n");
	CHECK_CONTAINS(out, "rc=143\n");
	CHECK_MSG(now_s() - t0 < 10, "took %.1f s", now_s() - t0);
	test_rmdir(dir);
	return 0;
}

TEST(launcher_nested_job_gets_own_id)
{
	char out[OUT_CAP], args[1024];
	const char *a, *b;
	/* A loom run inside a rank: the inner job must not reuse the outer job's id (its segments). */
	snprintf(args, sizeof args, "sh -c 'echo outer=$LOOM_JOB_ID; %s run %s env'", test_loom_bin(),
	         prog("launch_rank"));
	CHECK_RUN("LOOM_JOB_ID=outerjob ", args, 0, NULL);
	CHECK_CONTAINS(out, "[rank 0] outer=outerjob\n");
	CHECK((a = strstr(out, "[rank 0] [rank 0] RANK=0")) != NULL);
	CHECK((b = strstr(a, "LOOM_JOB_ID=")) != NULL);
	CHECK_MSG(strncmp(b, "LOOM_JOB_ID=outerjob\n", 21) != 0 && b[12] != '\n', "inner id: %s", b);
	return 0;
}

/* Every line of out starts with "[rank r] " and the rest is only rank r's letter ('A' + r); returns
 * how many letters there were, or -1 on a malformed line. */
static int check_homogeneous_lines(const char *out)
{
	int letters = 0;
	for (const char *p = out; *p;) {
		const char *nl = strchr(p, '\n');
		int r = -1, k = 0;
		if (!nl || sscanf(p, "[rank %d] %n", &r, &k) != 1 || k == 0 || r < 0 || r > 25)
			return -1;
		for (const char *c = p + k; c < nl; c++, letters++)
			if (*c != 'A' + r)
				return -1;
		p = nl + 1;
	}
	return letters;
}

TEST(launcher_lines_never_run_together)
{
	char out[OUT_CAP], args[1024];
	/* 3 ranks write half lines at the same moments: each half may be flushed on its own, but no
	 * output line mixes two ranks, and nothing is lost. */
	snprintf(args, sizeof args, "--nproc-per-node 3 %s interleave 2>/dev/null", prog("launch_rank"));
	CHECK_RUN("OMP_NUM_THREADS=1 ", args, 0, NULL);
	CHECK_MSG(check_homogeneous_lines(out) == 3 * 3 * 8, "output:\n%s", out);

	/* A line longer than the launcher's line buffer still gets exactly one prefix. */
	snprintf(args, sizeof args, "%s longline 40000", prog("launch_rank"));
	CHECK_RUN(NULL, args, 0, NULL);
	CHECK_EQ(strlen(out), strlen("[rank 0] ") + 40000 + 1 + strlen("[rank 0] end\n"));
	CHECK(strncmp(out, "[rank 0] xxx", 12) == 0);
	CHECK_EQ(strspn(out + 9, "x"), 40000);
	CHECK_STREQ(out + 9 + 40000, "\n[rank 0] end\n");
	return 0;
}

/* Liveness (issue 13, finding 10). A rank stopped by SIGSTOP holds every collective up: loom run
 * names it as the first failure within LOOM_STOP_GRACE_S (1 s) instead of after LOOM_TIMEOUT_S, and
 * the healthy ranks are not blamed. */
TEST(launcher_names_stopped_rank)
{
	char out[OUT_CAP], args[1024];
	double secs;
	snprintf(args, sizeof args, "--nproc-per-node 3 %s stop 1", prog("launch_rank"));
	CHECK_RUN("OMP_NUM_THREADS=1 LOOM_TIMEOUT_S=100 ", args, 1, &secs);
	CHECK_CONTAINS(out, "loom run: rank 1 (pid ");
	CHECK_CONTAINS(out, "was stopped by signal 19 (SIGSTOP) and did not continue within 1 s");
	CHECK_CONTAINS(out, "first failure: rank 1 (pid ");
	CHECK_MSG(count(out, "first failure: rank 1") == 1, "output:\n%s", out);
	CHECK_MSG(secs < 60, "loom run took %.1f s", secs); /* LOOM_TIMEOUT_S=100: not a timeout */
	return 0;
}

/* A wedged rank (alive, running, outside every collective): the others time out and report whom
 * they waited for; loom run follows the reports and names the wedged rank, not the first rank
 * that gave up. The others warn first (LOOM_STALL_S). */
TEST(launcher_names_wedged_rank)
{
	char out[OUT_CAP], args[1024];
	snprintf(args, sizeof args, "--nproc-per-node 3 %s wedge 2", prog("launch_rank"));
	CHECK_RUN("OMP_NUM_THREADS=1 LOOM_TIMEOUT_S=3 LOOM_STALL_S=1 ", args, 1, NULL);
	CHECK_CONTAINS(out, "has not progressed for 1 s (LOOM_STALL_S)");
	CHECK_CONTAINS(out, "first failure: rank 2 (pid ");
	CHECK_CONTAINS(out, "stopped making progress (rank ");
	CHECK_MSG(count(out, "first failure: rank 2") == 1, "output:\n%s", out);
	return 0;
}

/* Rank 0 gone before it created the job's shared memory: under loom run the others know its pid
 * and give up within a second (LOOM_TIMEOUT_S is 60 here). */
TEST(launcher_rank0_absent_at_rendezvous)
{
	char out[OUT_CAP], args[1024];
	snprintf(args, sizeof args, "--nproc-per-node 3 %s norank0", prog("launch_rank"));
	CHECK_RUN("OMP_NUM_THREADS=1 LOOM_TIMEOUT_S=60 ", args, 0, NULL);
	CHECK_EQ(count(out, "init failed after "), 2);
	CHECK_CONTAINS(out, "rank 0 (pid ");
	return 0;
}
