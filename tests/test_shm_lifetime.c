/* test_shm_lifetime.c: no shared memory of a job outlives it, whatever ends the job and whoever
 * launched it (issue 34). Jobs of 3 ranks of tests/progs/comm_prog, 10 per case: rank 2 exits with
 * an error (3) before joining, rank 2 exits with an error after joining, rank 1 is killed by SIGKILL
 * inside an all-reduce; under mpirun, `loom run`, an srun-style launcher (a shell starting the ranks
 * with Slurm's variables, as slurmstepd does) and a harsher srun-style one that SIGKILLs the rest of
 * the step as soon as the failing task ends (the others may still be at the rendezvous: nothing of
 * theirs gets to clean up).
 * Each case runs in a private /dev/shm (a mount namespace with a tmpfs of its own: root and
 * unshare(1)); after every job it must hold no file and no used block (the job's memory has no
 * name, so memory still held would show only as used blocks). Where no namespace can be made, the
 * jobs get a unique LOOM_JOB_ID and only /dev/shm/loom-<that id>* is looked at. Every job must
 * really have failed: no rank printed "ok", the launcher's status is non-zero (mpirun, loom run), and
 * `loom run` found nothing to remove. Names are reused as restarts reuse them: under `loom run`
 * (--max-restarts 1: every job fails twice) and srun-style, all 10 jobs of a case have the same job
 * id, and none may find anything of an earlier one in its way. shm_lifetime_unnamed checks the mechanism from inside a job. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/util.h"
#include "loom/comm.h"
#include "test.h"

#define RUNS 10

enum { L_MPIRUN, L_LOOM_RUN, L_SRUN, L_SRUN_KILL };
static const char *const launcher_name[] = {"mpirun", "loom run", "srun-style",
                                            "srun-style, SIGKILL to the step on failure"};

static const struct {
	const char *mode; /* COMM_PROG_EXIT */
	int victim;
	const char *what;
} cases[] = {
	{"2:fail", 2, "rank 2 exits 3 before joining"},
	{"2:fail-after", 2, "rank 2 exits 3 after joining"},
	{"1:kill", 1, "rank 1 killed by SIGKILL inside an all-reduce"},
};

/* 1 when this process may give a command a /dev/shm of its own (root, unshare(1) present). */
static int private_shm_possible(void)
{
	char out[512];
	return test_run_cmd("unshare -m sh -c 'mount -t tmpfs -o size=1m tmpfs /dev/shm' 2>&1", out, sizeof out, 20) == 0;
}

/* The shell script of one case: RUNS jobs, one line "run I rc=.. ok=.. cleaned=.. left=[..] blocks=B-F"
 * each (ok: ranks that printed ok; cleaned: loom run's removal notes; left: what /dev/shm holds of
 * the job; blocks: the tmpfs's total and free blocks, "-" without a private one). */
static void write_script(char *s, size_t cap, int launcher, int c, int private_shm, const char *dir)
{
	size_t n = 0;
#define ADD(...) (n += (size_t)snprintf(s + n, n < cap ? cap - n : 0, __VA_ARGS__))
	ADD("P=%s/comm_prog\nL=%s\nD=%s\n", test_prog_dir(), test_loom_bin(), dir);
	ADD("unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE LOOM_JOB_ID LOOM_RANK0_PID OMPI_COMM_WORLD_RANK "
	    "OMPI_COMM_WORLD_SIZE OMPI_COMM_WORLD_LOCAL_RANK OMPI_COMM_WORLD_LOCAL_SIZE SLURM_PROCID SLURM_NTASKS "
	    "SLURM_LOCALID SLURM_NNODES SLURM_STEP_NUM_NODES SLURM_JOB_ID SLURM_STEP_ID\n");
	ADD("export COMM_PROG_EXIT=%s LOOM_TIMEOUT_S=20 OMP_NUM_THREADS=1\n", cases[c].mode);
	if (private_shm)
		ADD("mount -t tmpfs -o size=256m tmpfs /dev/shm || { echo 'cannot mount a tmpfs on /dev/shm'; exit 97; }\n");
	ADD("i=1\nwhile [ $i -le %d ]; do\n", RUNS);
	if (!private_shm)
		ADD("  export LOOM_JOB_ID=shmlt%d-%d-%d-$i\n", (int)getpid(), launcher, c);
	switch (launcher) {
	case L_MPIRUN:
		ADD("  mpirun --allow-run-as-root --oversubscribe -np 3 -x COMM_PROG_EXIT -x LOOM_TIMEOUT_S -x OMP_NUM_THREADS "
		    "%s $P >$D/run$i.log 2>&1\n", private_shm ? "" : "-x LOOM_JOB_ID");
		break;
	case L_LOOM_RUN:
		if (private_shm) /* one id for every job: each starts where the last one's names were */
			ADD("  export LOOM_JOB_ID=lt$$\n");
		ADD("  $L run --max-restarts 1 --nproc-per-node 3 $P >$D/run$i.log 2>&1\n");
		break;
	default:
		ADD("  export SLURM_NTASKS=3 SLURM_NNODES=1 SLURM_JOB_ID=lt$$ SLURM_STEP_ID=0\n"); /* one name for all */
		ADD("  pids=\n  for r in 0 1 2; do SLURM_PROCID=$r SLURM_LOCALID=$r $P >$D/out.$r 2>&1 & "
		    "pids=\"$pids $!\"; [ $r = %d ] && victim=$!; done\n", cases[c].victim);
		if (launcher == L_SRUN_KILL)
			ADD("  wait $victim; kill -9 $pids 2>/dev/null\n");
		ADD("  wait\n  cat $D/out.0 $D/out.1 $D/out.2 >$D/run$i.log\n");
	}
	ADD("  rc=$?\n");
	if (private_shm)
		ADD("  left=$(ls -A /dev/shm | tr '\\n' ' '); blocks=$(stat -f -c '%%b-%%f' /dev/shm)\n");
	else
		ADD("  left=$(ls -A /dev/shm | grep \"^loom-$LOOM_JOB_ID\" | tr '\\n' ' '); blocks=-\n");
	ADD("  echo \"run $i rc=$rc ok=$(grep -c ': ok$' $D/run$i.log) cleaned=$(grep -c 'shared-memory segment' "
	    "$D/run$i.log) reused=$(grep -c 'in use on this host\\|already taken\\|joined already' $D/run$i.log) "
	    "restarted=$(grep -c 'restarting all 3 ranks' $D/run$i.log) "
	    "left=[$left] blocks=$blocks\"\n");
	ADD("  [ -z \"$left\" ] || rm -f /dev/shm/$left\n"); /* (only where the check fails) */
	ADD("  i=$((i + 1))\ndone\n");
#undef ADD
}

/* What job i of a case printed (its ranks' and its launcher's output), for messages. */
static const char *job_log(const char *dir, int i)
{
	static char log[4096];
	char path[600];
	FILE *f;
	size_t k = 0;
	snprintf(path, sizeof path, "%s/run%d.log", dir, i);
	if ((f = fopen(path, "r")) != NULL) {
		k = fread(log, 1, sizeof log - 1, f);
		fclose(f);
	}
	log[k] = '\0';
	return log;
}

/* One line of the script's output: the run's figures. 0 when it shows a failed job that left nothing. */
static int check_run(const char *line, int launcher, const char *label, const char *dir)
{
	int i, rc, ok, cleaned, reused, restarted;
	char left[512] = "", blocks[64] = "";
	const char *l = strstr(line, "left=["), *b = strstr(line, "] blocks=");
	CHECK_MSG(sscanf(line, "run %d rc=%d ok=%d cleaned=%d reused=%d restarted=%d", &i, &rc, &ok, &cleaned, &reused,
	                 &restarted) == 6 && l && b,
	          "%s: unexpected line \"%.200s\"", label, line);
	snprintf(left, sizeof left, "%.*s", (int)(b - l - 6), l + 6);
	sscanf(b + 9, "%63s", blocks);
	CHECK_MSG(left[0] == '\0', "%s, run %d: /dev/shm holds %s after the job:\n%s", label, i, left, job_log(dir, i));
	if (strcmp(blocks, "-") != 0) {
		long total = -1, avail = -2;
		CHECK_MSG(sscanf(blocks, "%ld-%ld", &total, &avail) == 2, "%s: blocks \"%s\"", label, blocks);
		CHECK_MSG(total == avail, "%s, run %d: the job's memory is still held after it ended (%ld of %ld blocks of "
		          "/dev/shm used, no file)", label, i, total - avail, total);
	}
	CHECK_MSG(ok == 0, "%s, run %d: %d rank(s) finished normally; the job should have failed:\n%s", label, i, ok,
	          job_log(dir, i));
	CHECK_MSG(cleaned == 0, "%s, run %d: loom run had to remove what the job left:\n%s", label, i, job_log(dir, i));
	CHECK_MSG(reused == 0, "%s, run %d: a name of an earlier job was in the way:\n%s", label, i, job_log(dir, i));
	if (launcher == L_LOOM_RUN)
		CHECK_MSG(restarted == 1, "%s, run %d: loom run did not restart the job once:\n%s", label, i, job_log(dir, i));
	if (launcher == L_MPIRUN || launcher == L_LOOM_RUN)
		CHECK_MSG(rc != 0, "%s, run %d: the launcher exited 0:\n%s", label, i, job_log(dir, i));
	return 0;
}

static int lifetime(int launcher)
{
	static char script[8192], out[16384];
	char dir[512], path[600], cmd[1400];
	int private_shm = private_shm_possible();
	if (launcher == L_MPIRUN && system("command -v mpirun >/dev/null 2>&1") != 0)
		return TEST_SKIP("mpirun is not installed");
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	snprintf(path, sizeof path, "%s/case.sh", dir);
	for (int c = 0; c < (int)LOOM_ARRAY_LEN(cases); c++) {
		char label[160];
		double t = loom_now();
		int rc, runs = 0;
		write_script(script, sizeof script, launcher, c, private_shm, dir);
		CHECK_EQ(test_write_file(path, script, strlen(script)), 0);
		snprintf(cmd, sizeof cmd, "%s sh %s 2>&1", private_shm ? "unshare --mount" : "", path);
		rc = test_run_cmd(cmd, out, sizeof out, 240);
		snprintf(label, sizeof label, "%s, %s", launcher_name[launcher], cases[c].what);
		CHECK_MSG(rc == 0, "%s: the script exited %d:\n%s\n%s", label, rc, out, script);
		for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
			if (strncmp(line, "run ", 4) != 0)
				continue;
			if (check_run(line, launcher, label, dir))
				return 1;
			runs++;
		}
		CHECK_MSG(runs == RUNS, "%s: %d of %d runs reported:\n%s", label, runs, RUNS, out);
		printf("  %s: %d jobs, nothing left in %s /dev/shm (%.1f s)\n", label, runs,
		       private_shm ? "a private" : "the shared (job-id prefix)", loom_now() - t);
	}
	test_rmdir(dir);
	return 0;
}

/* The mpirun and srun-style variants spend their time waiting for launchers (14 and 8 s of wall time
 * for 4 and 2 s of CPU under the sanitizer): like the cluster tests, CI runs them in its plain pass
 * only (LOOM_TEST_CLUSTER=0 in the sanitizer pass); `loom run`'s variant runs in both. */
TEST(shm_lifetime_mpirun)
{
	if (test_cluster_off())
		return TEST_SKIP("LOOM_TEST_CLUSTER=0: CI's plain pass runs the mpirun variant");
	return lifetime(L_MPIRUN);
}

TEST(shm_lifetime_loom_run)
{
	return lifetime(L_LOOM_RUN);
}

TEST(shm_lifetime_srun)
{
	if (test_cluster_off())
		return TEST_SKIP("LOOM_TEST_CLUSTER=0: CI's plain pass runs the srun-style variant");
	return lifetime(L_SRUN);
}

TEST(shm_lifetime_srun_sigkill)
{
	return lifetime(L_SRUN_KILL);
}

/* From inside a job: the world segment's mapping (found by a loom_comm_alloc buffer in
 * /proc/self/maps) is a file of /dev/shm without a name ("/dev/shm/#<inode> (deleted)"); with
 * LOOM_TEST_SHM_NO_TMPFILE=1 (the fallback where /dev/shm has no O_TMPFILE) a named one, already
 * unlinked once the job runs. Collectives on the world and on a sub-group work either way, and the
 * harness finds no /dev/shm/loom-<job>@* afterwards. */
static int rank_unnamed(int rank, int n, void *arg)
{
	int fallback = *(const int *)arg, found = 0;
	loom_comm_t *c, *sub;
	int64_t *x, y = 1;
	char line[1024], want[160];
	FILE *f;
	CHECK_OK(loom_comm_init(&c));
	CHECK((x = loom_comm_alloc(c, 1 << 16)) != NULL);
	CHECK((f = fopen("/proc/self/maps", "r")) != NULL);
	while (!found && fgets(line, sizeof line, f)) {
		unsigned long lo, hi;
		found = sscanf(line, "%lx-%lx", &lo, &hi) == 2 && (uintptr_t)x >= lo && (uintptr_t)x < hi;
	}
	fclose(f);
	CHECK_MSG(found, "no mapping holds the heap buffer %p", (void *)x);
	CHECK_CONTAINS(line, " (deleted)\n");
	if (fallback)
		snprintf(want, sizeof want, " /dev/shm/loom-%s@w.", getenv("LOOM_JOB_ID"));
	else
		snprintf(want, sizeof want, " /dev/shm/#");
	CHECK_CONTAINS(line, want);
	x[0] = rank + 1;
	CHECK_OK(loom_allreduce(c, x, x, 1, LOOM_INT64, LOOM_SUM));
	CHECK_EQ(x[0], n * (n + 1) / 2);
	CHECK_OK(loom_comm_split(c, rank % 2, rank, &sub));
	CHECK_OK(loom_allreduce(sub, &y, &y, 1, LOOM_INT64, LOOM_SUM));
	CHECK_EQ(y, rank % 2 ? n / 2 : (n + 1) / 2);
	CHECK_OK(loom_comm_destroy(sub));
	loom_comm_free(c, x);
	CHECK_OK(loom_comm_destroy(c));
	return 0;
}

TEST(shm_lifetime_unnamed)
{
	int normal = 0, fallback = 1;
	const char *env[] = {"LOOM_TEST_SHM_NO_TMPFILE=1", NULL};
	CHECK_EQ(test_spawn(3, rank_unnamed, &normal, 20, NULL), 0);
	CHECK_EQ(test_spawn(3, rank_unnamed, &fallback, 20, env), 0);
	return 0;
}

/* Jobs meet only where they share a /dev/shm: two jobs of one LOOM_JOB_ID (loom run, 2 ranks; the
 * first holds its ranks 1 s after joining, the second starts 0.3 s later) both finish when each has
 * a /dev/shm of its own (two containers on the host's network), and the second is refused, naming
 * the first's rank 0, when they share one. */
TEST(shm_lifetime_same_id_apart)
{
	static char cmd[8192], out[16384];
	char job[1024], dir[512], want[96];
	int rc;
	if (!private_shm_possible())
		return TEST_SKIP("no private /dev/shm can be mounted here (not root, or no unshare)");
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	snprintf(job, sizeof job, "LOOM_TIMEOUT_S=20 LOOM_JOB_ID=apart%d %s run --nproc-per-node 2 %s/comm_prog",
	         (int)getpid(), test_loom_bin(), test_prog_dir());
	for (int shared = 0; shared < 2; shared++) {
		const char *own = shared ? "" : "unshare --mount sh -c 'mount -t tmpfs -o size=256m tmpfs /dev/shm && ";
		const char *end = shared ? "" : "'";
		snprintf(cmd, sizeof cmd,
		         "%sCOMM_PROG_HOLD=1 %s >%s/a 2>&1%s & sleep 0.3; %s%s >%s/b 2>&1%s; echo b=$?; wait $!; echo a=$?; "
		         "cat %s/a %s/b",
		         own, job, dir, end, own, job, dir, end, dir, dir);
		rc = test_run_cmd(cmd, out, sizeof out, 60);
		CHECK_MSG(rc == 0, "exit %d:\n%s", rc, out);
		CHECK_MSG(strstr(out, "a=0\n"), "the first job failed (%s /dev/shm):\n%s", shared ? "one" : "two", out);
		if (!shared) {
			CHECK_MSG(strstr(out, "b=0\n"), "the second job failed beside the first, in another /dev/shm:\n%s", out);
		} else {
			CHECK_CONTAINS(out, "b=1\n");
			snprintf(want, sizeof want, "/loom-apart%d@w is in use on this host: process ", (int)getpid());
			CHECK_CONTAINS(out, want);
		}
	}
	test_rmdir(dir);
	return 0;
}

/* Offers of names longer than an abstract socket address holds (an 80-character job id and six
 * levels of splits: "loom-<id>@w-1.0-1.0-1.0-1.0-1.0-1.0", 111 characters) end in a hash of the whole
 * name; the sub-groups of every level still meet, and each level's two groups apart. */
static int rank_long_names(int rank, int n, void *arg)
{
	char id[81];
	loom_comm_t *c, *g[7];
	(void)arg;
	memset(id, 'x', 80), id[80] = '\0';
	memcpy(id, getenv("LOOM_JOB_ID"), strlen(getenv("LOOM_JOB_ID")));
	setenv("LOOM_JOB_ID", id, 1);
	CHECK_OK(loom_comm_init(&c));
	g[0] = c;
	for (int k = 1; k < 7; k++) {
		int64_t x = 1;
		CHECK_OK(loom_comm_split(g[k - 1], rank % 2, rank, &g[k]));
		CHECK_OK(loom_allreduce(g[k], &x, &x, 1, LOOM_INT64, LOOM_SUM));
		CHECK_EQ(x, rank % 2 ? n / 2 : (n + 1) / 2);
	}
	for (int k = 6; k >= 0; k--)
		CHECK_OK(loom_comm_destroy(g[k]));
	return 0;
}

TEST(shm_lifetime_long_names)
{
	CHECK_EQ(test_spawn(4, rank_long_names, NULL, 20, NULL), 0);
	return 0;
}
