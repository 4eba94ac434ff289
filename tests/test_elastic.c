/* test_elastic.c: `loom run --nnodes MIN:MAX --hostfile` (cli/run_elastic.c) on the three-host cluster
 * of scripts/netns-cluster.sh (LOOM_NETNS_HOSTS=3), with `loom train` on a tiny model: a host lost
 * (its processes stopped and its link down) shrinks the job to the other two, its return grows it
 * back at the next checkpoint, and the run ends as an uninterrupted one over the same global batches
 * (parameters within 1e-5 relative, each step's loss logged once, the same tokens read at every step);
 * MIN not met ends the job with a message and a resumable checkpoint; a world that cannot keep the
 * global batch runs on fewer hosts by the batch rule.
 *
 * The steps are slowed to 60-100 ms (LOOM_STEP_SLEEP_MS, no CPU) so that the faults land mid-run;
 * the faults are keyed to checkpoints and to the launcher's notes, never to the clock. Each test makes
 * its own cluster (namespaces named after the test process) and removes it from a shell trap. Without
 * root, namespaces, mpirun or MPI each test is skipped with the reason. */
#include <glob.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loom/ckpt.h"
#include "test.h"

#define OUT_CAP (1 << 20)
#define MAXSTEPS 128

#define MODEL_FLAGS                                                                                  \
	"--n-layer 2 --n-head 2 --n-embd 32 --vocab-size 64 --n-positions 16 --batch-size 2 --seq-len 16 "   \
	"--lr 1e-3 --warmup 2 --min-lr-frac 0.1 --shuffle 1 --seed 7 --peak-flops 1e10 --threads 1"

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
		snprintf(why, sizeof why, "cluster unavailable: %.200s", out[0] ? out : "scripts/netns-cluster.sh check failed");
		return why;
	}
	return NULL;
}

static int prefix(void)
{
	return (int)getpid() % 100000;
}

static int no_namespaces_left(void)
{
	char cmd[256], out[4096] = "";
	snprintf(cmd, sizeof cmd, "ip netns list 2>/dev/null | grep '^le%d' || true", prefix());
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 10), 0);
	CHECK_MSG(out[0] == '\0', "namespaces left behind: %s", out);
	return 0;
}

/* The train command for `steps` steps at `total` tokens per step, checkpoints every 5 into dir/ck, log
 * dir/<log>.jsonl; extra flags appended. */
static void train_cmd(char *buf, size_t cap, const char *dir, int steps, int total, const char *log, const char *extra)
{
	char *loom = realpath(test_loom_bin(), NULL);
	snprintf(buf, cap, "%s train --train-data '%s/train_*.bin' " MODEL_FLAGS " --steps %d --total-batch-size %d "
	         "--save-every 5 --keep-checkpoints 2 --resume --save-dir %s/%s --log %s/%s.jsonl %s", loom ? loom : "loom",
	         dir, steps, total, dir, log, dir, log, extra);
	free(loom);
}

/* Run `inner` (a shell script, cwd dir) after bringing a three-host cluster up, with the cluster's
 * teardown in a trap and `fault` in the background; loom run's output goes to dir/out.txt (the fault
 * watches it) and then to out. Returns loom run's exit status. */
static int on_cluster_hosts(const char *dir, int nhosts, const char *fault, const char *inner, char *out,
                            double timeout_s)
{
	static char cmd[16384];
	char *script = realpath("scripts/netns-cluster.sh", NULL);
	int rc;
	CHECK(script != NULL);
	snprintf(cmd, sizeof cmd,
	         "cd %s && export LOOM_NETNS_PREFIX=le%d LOOM_NETNS_HOSTS=3; "
	         "trap '%s down; rm -f /dev/shm/vader_segment.le%d*' EXIT; %s up || exit 99; "
	         "seq 1 %d | sed 's/^/10.231.7./' > hosts; : > out.txt; mkdir -p dt; "
	         "( %s ) > fault.txt 2>&1 & fp=$!; "
	         "LOOM_MPIRUN='%s mpirun' LOOM_TIMEOUT_S=5 LOOM_ELASTIC_PROBE_S=1 LOOM_ELASTIC_PROBE_TIMEOUT_S=10 "
	         "ASAN_OPTIONS=detect_leaks=0 OMP_NUM_THREADS=1 %s > out.txt 2>&1; rc=$?; "
	         "sleep 0.5; kill $fp 2>/dev/null; wait; cat out.txt fault.txt; "
	         "for h in 0 1 2; do ip netns pids le%d$h | xargs -r kill -CONT 2>/dev/null; done; exit $rc",
	         dir, prefix(), script, prefix(), script, nhosts, fault, script, inner, prefix());
	free(script);
	rc = test_run_cmd(cmd, out, OUT_CAP, timeout_s);
	return rc;
}

static int on_cluster(const char *dir, const char *fault, const char *inner, char *out, double timeout_s)
{
	return on_cluster_hosts(dir, 3, fault, inner, out, timeout_s);
}

/* Every step 1..n has exactly one line in the log; returns the count of event rows, *rows their text. */
static int check_log(const char *path, int n, char rows[][1024], int max_rows)
{
	FILE *f = fopen(path, "r");
	static char line[8192];
	int seen[MAXSTEPS] = {0}, events = 0;
	CHECK_MSG(f != NULL, "no log %s", path);
	while (fgets(line, sizeof line, f)) {
		long long s;
		if (sscanf(line, "{\"step\":%lld,", &s) == 1) {
			CHECK_MSG(s >= 1 && s <= n, "%s: a line of step %lld", path, s);
			seen[s]++;
		} else if (strncmp(line, "{\"event\":\"elastic\"", 18) == 0) {
			if (events < max_rows)
				snprintf(rows[events], 1024, "%.1000s", line);
			events++;
		}
	}
	fclose(f);
	for (int s = 1; s <= n; s++)
		CHECK_MSG(seen[s] == 1, "%s: step %d has %d lines (expected exactly 1)", path, s, seen[s]);
	return events;
}

/* The final parameters of two checkpoints within 1e-5 relative: max |a - b| <= 1e-5 max |b| over the
 * whole model (an elementwise ratio is meaningless at the zero crossings). The reduction order differs
 * between world sizes, and training amplifies that: at --lr 1e-2 an uninterrupted dp 3 run and one
 * process differ by 1e-3 after 60 steps, at 1e-3 (these tests) by 5e-6, so the tests train at 1e-3. */
/* The key bias (the middle third of GPT-2's c_attn.bias) has a gradient of exactly zero: it adds
 * q . b_k to every score of a query's row, which the softmax cancels. Its computed gradient is rounding
 * noise (1e-10), which an Adam whose eps is as small (MuonAdamW's groups: 1e-10, as nanochat) turns
 * into steps of the learning rate's size: it walks at random, a walk that changes with the reduction
 * order (dp 3 and one process end 8e-4 apart after 40 steps at lr 1e-3, every other parameter within
 * 1e-6) and with nothing the model computes. Such elements are left out when skip_key_bias is set. */
static int key_bias_element(const loom_model_config_t *cfg, size_t i)
{
	char name[64];
	loom_tensor_info_t t;
	for (int l = 0; l < cfg->n_layer; l++) {
		snprintf(name, sizeof name, "h.%d.attn.c_attn.bias", l);
		int k = loom_model_tensor_index(cfg, name);
		if (k >= 0 && loom_model_tensor_info(cfg, k, &t) == 0 && i >= t.offset + t.numel / 3 &&
		    i < t.offset + 2 * t.numel / 3)
			return 1;
	}
	return 0;
}

static int params_close_but(const char *a, const char *b, double *worst, int skip_key_bias)
{
	loom_model_config_t ca, cb;
	float *pa = NULL, *pb = NULL;
	double maxabs = 0, maxdiff = 0;
	size_t skipped = 0;
	CHECK_OK(loom_model_load_alloc(a, 2, &ca, &pa));
	CHECK_OK(loom_model_load_alloc(b, 2, &cb, &pb));
	size_t n = loom_model_num_params(&ca);
	CHECK_EQ(n, loom_model_num_params(&cb));
	for (size_t i = 0; i < n; i++) {
		if (skip_key_bias && key_bias_element(&ca, i)) {
			skipped++;
			continue;
		}
		double d = fabs((double)pa[i] - (double)pb[i]), m = fabs((double)pb[i]);
		maxdiff = d > maxdiff ? d : maxdiff;
		maxabs = m > maxabs ? m : maxabs;
	}
	free(pa), free(pb);
	CHECK_EQ(skipped, skip_key_bias ? (size_t)ca.n_layer * ca.n_embd : 0);
	*worst = maxdiff / maxabs;
	CHECK_MSG(*worst <= 1e-5, "%s vs %s: max |diff| %.3g, max |param| %.3g: %.3g relative (expected <= 1e-5)", a, b,
	          maxdiff, maxabs, *worst);
	return 0;
}

static int params_close(const char *a, const char *b, double *worst)
{
	return params_close_but(a, b, worst, 0);
}

/* Every step's loss in log `got` within 1e-5 relative of the reference log's. */
static int losses_close(const char *got, const char *ref, int n)
{
	static double g[MAXSTEPS], r[MAXSTEPS];
	CHECK_EQ(test_read_losses(ref, r, MAXSTEPS, NULL, NULL), n);
	CHECK_EQ(test_read_losses(got, g, MAXSTEPS, NULL, NULL), n);
	for (int s = 1; s <= n; s++)
		CHECK_NEAR(g[s], r[s], 1e-5 * r[s]);
	return 0;
}

/* The token offsets each step read, from LOOM_DATA_TRACE files matching glob pat: offs[s] is a sorted
 * list of the offsets of step s in one process's file; every process (every rank of every attempt) that
 * ran step s must have read the offsets the reference read at s, the ranks of one attempt together all
 * of them, each once. Returns 0 when so. ref[s][k], nref windows per step. */
typedef struct {
	unsigned long long tok[MAXSTEPS][16];
	int n[MAXSTEPS];
} trace_t;

static int read_trace(const char *path, trace_t *t)
{
	FILE *f = fopen(path, "r");
	long long s;
	unsigned long long w, tok;
	CHECK_MSG(f != NULL, "no data trace %s", path);
	while (fscanf(f, "step %lld window %llu token %llu\n", &s, &w, &tok) == 3) {
		CHECK(s >= 1 && s < MAXSTEPS);
		CHECK_MSG(t->n[s] < 16, "%s: step %lld read more than 16 windows", path, s);
		t->tok[s][t->n[s]++] = tok;
	}
	fclose(f);
	return 0;
}

static int in_list(const unsigned long long *v, int n, unsigned long long x)
{
	for (int i = 0; i < n; i++)
		if (v[i] == x)
			return 1;
	return 0;
}

/* The elastic run's traces (dir/dt/data.r*.p*) against the reference's (dir/dtref/data.r0.p*): each
 * process's windows of a step are among the reference's of that step, no window twice; and the
 * processes of one attempt (pids grouped by the attempt's... we cannot tell attempts apart by name, so:)
 * for every step, the union over all processes is exactly the reference's set. */
static int check_traces(const char *dir, int steps, int per_step)
{
	static trace_t ref, one, all;
	char pat[600];
	glob_t g;
	memset(&ref, 0, sizeof ref), memset(&all, 0, sizeof all);
	snprintf(pat, sizeof pat, "%s/dtref/data.r0.p*", dir);
	CHECK_EQ(glob(pat, 0, NULL, &g), 0);
	CHECK_EQ((int)g.gl_pathc, 1);
	CHECK_OK(read_trace(g.gl_pathv[0], &ref));
	globfree(&g);
	for (int s = 1; s <= steps; s++)
		CHECK_MSG(ref.n[s] == per_step, "reference step %d read %d windows (expected %d)", s, ref.n[s], per_step);
	snprintf(pat, sizeof pat, "%s/dt/data.r*.p*", dir);
	CHECK_EQ(glob(pat, 0, NULL, &g), 0);
	CHECK(g.gl_pathc >= 3);
	for (size_t i = 0; i < g.gl_pathc; i++) {
		memset(&one, 0, sizeof one);
		CHECK_OK(read_trace(g.gl_pathv[i], &one));
		for (int s = 1; s < MAXSTEPS; s++)
			for (int k = 0; k < one.n[s]; k++) {
				CHECK_MSG(s <= steps && in_list(ref.tok[s], ref.n[s], one.tok[s][k]),
				          "%s: step %d read the window at token %llu, which the uninterrupted run did not read at that "
				          "step", g.gl_pathv[i], s, one.tok[s][k]);
				CHECK_MSG(!in_list(one.tok[s], k, one.tok[s][k]), "%s: step %d read token %llu twice", g.gl_pathv[i], s,
				          one.tok[s][k]);
				if (!in_list(all.tok[s], all.n[s], one.tok[s][k]))
					all.tok[s][all.n[s]++] = one.tok[s][k];
			}
	}
	globfree(&g);
	for (int s = 1; s <= steps; s++)
		CHECK_MSG(all.n[s] == per_step, "step %d: the elastic run read %d of the uninterrupted run's %d windows", s,
		          all.n[s], per_step);
	return 0;
}

/* The uninterrupted reference: one process, the same global batch (accumulation total/32). */
static int reference(const char *dir, int steps, int total, const char *extra, char *out)
{
	static char cmd[4096], full[4600];
	train_cmd(cmd, sizeof cmd, dir, steps, total, "ref", extra);
	snprintf(full, sizeof full, "mkdir -p %s/dtref && LOOM_DATA_TRACE=%s/dtref OMP_NUM_THREADS=1 %s", dir, dir, cmd);
	int rc = test_run_cmd(full, out, OUT_CAP, 120);
	CHECK_MSG(rc == 0, "the uninterrupted run: exit %d:\n%s", rc, out);
	return 0;
}

/* Host 2 (10.231.7.3) is lost (every process in it stopped, its link down) once step 20 is committed,
 * or with `memory` mid-interval, once step 22 is logged; it returns once the launcher runs on two
 * hosts. The job shrinks to 2 hosts, grows back to 3 and ends like the uninterrupted run. With
 * `memory` (pure data parallel: every rank a whole replica) the shrink resumes from the state the
 * survivors kept in RAM, losing no step; otherwise from the checkpoint, with the reason in the event
 * row (`why`). Either way nothing is left in /dev/shm. */
static int shrink_grow(const char *extra, const char *ref_extra, int memory, const char *why_not)
{
	enum { N = 60 };
	static char out[OUT_CAP], train[4096], inner[8192], fault[4096], rows[4][1024], a[700], b[700];
	const char *why = cluster_unavailable();
	char dir[512], *loom;
	int p = prefix(), rc;
	double worst, t_fault = 0, t_first = 0;
	if (why)
		return TEST_SKIP("%s", why);
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(test_make_token_data(dir, 64, 6001));
	CHECK_OK(reference(dir, N, 192, ref_extra, out));
	loom = realpath(test_loom_bin(), NULL);
	CHECK(loom != NULL);
	train_cmd(train, sizeof train, dir, N, 192, "ck", extra);
	char shm[128];
	snprintf(shm, sizeof shm, "/dev/shm/loom-rescue-le%d", p);
	snprintf(inner, sizeof inner,
	         "LOOM_JOB_ID=le%d LOOM_DATA_TRACE=%s/dt LOOM_STEP_SLEEP_MS=100 timeout 200 %s run --nnodes 2:3 --hostfile "
	         "hosts --nproc-per-node 1 --elastic-dir %s/ed %s",
	         p, dir, loom, dir, train);
	free(loom);
	snprintf(fault, sizeof fault,
	         "for i in $(seq 6000); do %s && break; sleep 0.01; done; "
	         "ip netns pids le%d2 | xargs -r kill -STOP; ip -n le%d2 link set le%de2 down; echo \"FAULT $(date +%%s.%%N)\"; "
	         "for i in $(seq 6000); do grep -q 'attempt 1 on 2 hosts' out.txt && break; sleep 0.05; done; "
	         "for i in $(seq 6000); do awk '/\"event\"/{e=1} e && /^[{]\"step\":/{f=1} END{exit !f}' ck.jsonl && break; "
	         "sleep 0.01; done; echo \"FIRST2 $(date +%%s.%%N)\"; "
	         "ip -n le%d2 link set le%de2 up; ip netns pids le%d2 | xargs -r kill -CONT; echo \"RETURN $(date +%%s.%%N)\"",
	         memory ? "grep -q '^{\"step\":22,' ck.jsonl" : "[ -d ck/step_00000020 ]", p, p, p, p, p, p);
	rc = on_cluster(dir, fault, inner, out, 240);
	CHECK_MSG(rc == 0, "the elastic run in %s: exit %d:\n%s", dir, rc, out);
	CHECK_MSG(access(shm, F_OK) != 0, "%s is left behind after the job:\n%s", shm, out);
	CHECK_CONTAINS(out, "loom run: elastic: attempt 0 on 3 hosts");
	CHECK_CONTAINS(out, "loom run: elastic: host lost: 10.231.7.3");
	CHECK_CONTAINS(out, "loom run: elastic: attempt 1 on 2 hosts (10.231.7.1, 10.231.7.2), 2 ranks");
	CHECK_CONTAINS(out, "loom run: elastic: host 10.231.7.3 answers: asking the ranks to save and stop");
	CHECK_CONTAINS(out, "loom run: elastic: attempt 2 on 3 hosts");
	CHECK_CONTAINS(out, "elastic summary: 2 membership changes, 0 failures");
	long long resumed = 20;
	if (memory) { /* resumed from the survivors' state of the last step they completed: 22 or 23 */
		const char *at = strstr(out, "accumulation 3, resumed from step ");
		CHECK_CONTAINS(out, "loom run: elastic: recovery in memory: every host of the attempt keeps step ");
		CHECK_CONTAINS(out, "'s training state in memory (/dev/shm/loom-rescue-");
		CHECK_MSG(at != NULL, "no resume line:\n%s", out);
		resumed = atoll(at + strlen("accumulation 3, resumed from step "));
		CHECK_MSG(resumed > 20 && resumed < 25, "resumed from step %lld (expected the step before the loss, 21-24)",
		          resumed);
		CHECK_CONTAINS(out, "'s state kept in memory by the survivors (recovery in memory), 0 steps lost");
	} else {
		CHECK_CONTAINS(out, "accumulation 3, resumed from step 20's checkpoint (recovery from the checkpoint on disk: ");
		CHECK_CONTAINS(out, why_not);
	}
	/* the log: each step once, and the two changes */
	snprintf(a, sizeof a, "%s/ck.jsonl", dir);
	CHECK_EQ(check_log(a, N, rows, 4), 2);
	CHECK_CONTAINS(rows[0], "\"cause\":\"host lost: 10.231.7.3");
	CHECK_CONTAINS(rows[0], "\"old_mesh\":{\"world\":3,\"dp\":3,");
	CHECK_CONTAINS(rows[0], "\"new_mesh\":{\"world\":2,\"dp\":2,");
	snprintf(a, sizeof a, "\"step\":%lld,", resumed);
	CHECK_CONTAINS(rows[0], a);
	snprintf(a, sizeof a, "\"resumed_from\":%lld,\"steps_lost\":0,\"accum\":3,\"total_batch\":192,\"recovery\":\"%s\"",
	         resumed, memory ? "memory" : "checkpoint");
	CHECK_CONTAINS(rows[0], a);
	if (!memory) {
		snprintf(a, sizeof a, "\"recovery_why\":\"%s", why_not);
		CHECK_CONTAINS(rows[0], a);
	}
	CHECK_CONTAINS(rows[1], "\"cause\":\"grow: host 10.231.7.3 answers\"");
	CHECK_CONTAINS(rows[1], "\"old_mesh\":{\"world\":2,\"dp\":2,");
	CHECK_CONTAINS(rows[1], "\"new_mesh\":{\"world\":3,\"dp\":3,");
	CHECK_CONTAINS(rows[1], "\"steps_lost\":0,\"accum\":2,\"total_batch\":192,\"recovery\":\"checkpoint\"");
	/* the parameters and the data */
	snprintf(a, sizeof a, "%s/ck/step_%08d/model.safetensors", dir, N);
	snprintf(b, sizeof b, "%s/ref/step_%08d/model.safetensors", dir, N);
	CHECK_OK(params_close_but(a, b, &worst, strstr(extra, "muon") != NULL));
	snprintf(a, sizeof a, "%s/ck.jsonl", dir), snprintf(b, sizeof b, "%s/ref.jsonl", dir);
	CHECK_OK(losses_close(a, b, N));
	CHECK_OK(check_traces(dir, N, 6));
	{
		const char *f = strstr(out, "FAULT "), *g = strstr(out, "FIRST2 ");
		if (f && g)
			t_fault = atof(f + 6), t_first = atof(g + 7);
	}
	printf("  %s: host lost after step %s: the first step on two hosts %.1f s after the loss (LOOM_TIMEOUT_S=5, "
	       "probe timeout 10 s; recovery %s, from step %lld); final parameters within %.2g relative of the "
	       "uninterrupted run\n", extra[0] ? extra : "dp", memory ? "22" : "20's checkpoint", t_first - t_fault,
	       memory ? "in memory" : "from the checkpoint", resumed, worst);
	test_rmdir(dir);
	return no_namespaces_left();
}

/* Pure data parallel: host 2 is lost between checkpoints (after step 22; the checkpoints are every 5)
 * and the survivors restart from the state they kept in RAM: no step lost. */
TEST(elastic_shrink_grow)
{
	return shrink_grow("", "", 1, NULL);
}

/* --nnodes 3:3: losing a host leaves two, fewer than MIN: the job ends (exit 1) saying so, with its
 * checkpoints in place; `loom train --resume` on one process continues from the newest to the end. */
TEST(elastic_min_not_met)
{
	enum { N = 40 };
	static char out[OUT_CAP], train[4096], inner[8192], fault[2048], cmd[4600];
	const char *why = cluster_unavailable();
	char dir[512], *loom;
	int p = prefix(), rc;
	if (why)
		return TEST_SKIP("%s", why);
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(test_make_token_data(dir, 64, 6001));
	loom = realpath(test_loom_bin(), NULL);
	CHECK(loom != NULL);
	train_cmd(train, sizeof train, dir, N, 192, "ck", "");
	snprintf(inner, sizeof inner,
	         "LOOM_STEP_SLEEP_MS=60 timeout 120 %s run --nnodes 3:3 --hostfile hosts --nproc-per-node 1 --elastic-dir "
	         "%s/ed %s", loom, dir, train);
	free(loom);
	snprintf(fault, sizeof fault,
	         "for i in $(seq 6000); do [ -d ck/step_00000010 ] && break; sleep 0.01; done; "
	         "ip netns pids le%d2 | xargs -r kill -STOP; ip -n le%d2 link set le%de2 down", p, p, p);
	rc = on_cluster(dir, fault, inner, out, 180);
	CHECK_MSG(rc == 1, "the elastic run: exit %d (expected 1):\n%s", rc, out);
	CHECK_CONTAINS(out, "loom run: elastic: host lost: 10.231.7.3");
	CHECK_CONTAINS(out, "loom run: elastic: 2 hosts can run the job (the others do not answer), fewer than --nnodes' "
	                    "MIN 3; not answering: 10.231.7.3: ending it");
	CHECK_CONTAINS(out, "elastic summary: 1 membership change, 0 failures");
	/* resumable: one process continues from the newest checkpoint (step >= 10) to the end */
	train_cmd(train, sizeof train, dir, N, 192, "ck", "");
	snprintf(cmd, sizeof cmd, "OMP_NUM_THREADS=1 %s", train);
	rc = test_run_cmd(cmd, out, OUT_CAP, 120);
	CHECK_MSG(rc == 0, "resuming on one process: exit %d:\n%s", rc, out);
	CHECK_CONTAINS(out, "resumed from ");
	CHECK(strstr(out, "at step 0\n") == NULL);
	snprintf(cmd, sizeof cmd, "%s/ck/step_%08d/model.safetensors", dir, N);
	CHECK_MSG(access(cmd, R_OK) == 0, "no final checkpoint %s:\n%s", cmd, out);
	test_rmdir(dir);
	return no_namespaces_left();
}

/* Three hosts, --total-batch-size 128 (4 micro-batches of 32 tokens): dp 3 cannot keep it, so the job
 * runs on two hosts (the batch rule), the third a spare, and says so in its event row; the run equals
 * the uninterrupted one. */
TEST(elastic_batch_rule)
{
	enum { N = 10 };
	static char out[OUT_CAP], train[4096], inner[8192], rows[2][1024], a[700], b[700];
	const char *why = cluster_unavailable();
	char dir[512], *loom;
	double worst;
	int rc;
	if (why)
		return TEST_SKIP("%s", why);
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(test_make_token_data(dir, 64, 6001));
	CHECK_OK(reference(dir, N, 128, "", out));
	loom = realpath(test_loom_bin(), NULL);
	CHECK(loom != NULL);
	train_cmd(train, sizeof train, dir, N, 128, "ck", "");
	snprintf(inner, sizeof inner, "timeout 120 %s run --nnodes 1:3 --hostfile hosts --nproc-per-node 1 --elastic-dir %s/ed %s",
	         loom, dir, train);
	free(loom);
	rc = on_cluster(dir, "true", inner, out, 180);
	CHECK_MSG(rc == 0, "the elastic run: exit %d:\n%s", rc, out);
	CHECK_CONTAINS(out, "loom run: elastic: the global batch is kept: 3 hosts cannot keep it");
	CHECK_CONTAINS(out, "loom run: elastic: attempt 1 on 2 hosts (10.231.7.1, 10.231.7.2), 2 ranks");
	snprintf(a, sizeof a, "%s/ck.jsonl", dir);
	CHECK_EQ(check_log(a, N, rows, 2), 1);
	CHECK_CONTAINS(rows[0], "\"new_mesh\":{\"world\":2,\"dp\":2,");
	CHECK_CONTAINS(rows[0], "\"rule\":\"the global batch is kept: 3 hosts cannot keep it");
	CHECK_CONTAINS(rows[0], "\"accum\":2,\"total_batch\":128");
	snprintf(a, sizeof a, "%s/ck/step_%08d/model.safetensors", dir, N);
	snprintf(b, sizeof b, "%s/ref/step_%08d/model.safetensors", dir, N);
	CHECK_OK(params_close(a, b, &worst));
	snprintf(a, sizeof a, "%s/ck.jsonl", dir), snprintf(b, sizeof b, "%s/ref.jsonl", dir);
	CHECK_OK(losses_close(a, b, N));
	test_rmdir(dir);
	return no_namespaces_left();
}

/* The same with ZeRO-3: the parameters and AdamW's moments are sharded over dp, and each change
 * reshards them (dp 3 -> 2 -> 3) through the checkpoint; against one process without ZeRO (ZeRO's
 * steps equal DDP's). */
TEST(elastic_shrink_grow_zero3)
{
	return shrink_grow("--zero 3", "", 0, "ZeRO shards the optimizer state");
}

/* ZeRO-1 with MuonAdamW: DistMuon's owners of the matrices and ZeRO-1's shards of the AdamW groups'
 * moments change with dp at each change; against one process with MuonAdamW, without ZeRO (the key
 * bias left out of the comparison: key_bias_element). The matrices train at 2e-3: Muon's
 * orthogonalisation amplifies the reduction order's rounding as a higher rate does (at its default
 * 0.02 an uninterrupted dp 3 run ends 2e-5 from one process after 60 steps, at 2e-3 8e-7). */
TEST(elastic_shrink_grow_zero1_muon)
{
	return shrink_grow("--zero 1 --optimizer muon --matrix-lr 2e-3", "--optimizer muon --matrix-lr 2e-3", 0,
	                   "MuonAdamW's matrices are updated by their owner ranks");
}

/* dp 2 x tp 2 on two hosts (tp inside a host, dp across), --nnodes 1:2: host 1 (10.231.7.2) lost after
 * step 20 shrinks the job to one host, dp 1 x tp 2 (tp fixed, dp shrinks), and its return grows it back;
 * the end equals one process without tp. */
TEST(elastic_tp2_two_hosts_to_one)
{
	enum { N = 50 }; /* the divergence from one process grows with the steps: 8e-6 at 60 */
	static char out[OUT_CAP], train[4096], inner[8192], fault[4096], rows[4][1024], a[700], b[700];
	const char *why = cluster_unavailable();
	char dir[512], *loom;
	int p = prefix(), rc;
	double worst;
	if (why)
		return TEST_SKIP("%s", why);
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(test_make_token_data(dir, 64, 6001));
	CHECK_OK(reference(dir, N, 128, "", out));
	loom = realpath(test_loom_bin(), NULL);
	CHECK(loom != NULL);
	train_cmd(train, sizeof train, dir, N, 128, "ck", "--tp 2");
	snprintf(inner, sizeof inner,
	         "LOOM_DATA_TRACE=%s/dt LOOM_STEP_SLEEP_MS=100 timeout 200 %s run --nnodes 1:2 --hostfile hosts "
	         "--nproc-per-node 2 --elastic-dir %s/ed %s", dir, loom, dir, train);
	free(loom);
	snprintf(fault, sizeof fault,
	         "for i in $(seq 6000); do [ -d ck/step_00000020 ] && break; sleep 0.01; done; "
	         "ip netns pids le%d1 | xargs -r kill -STOP; ip -n le%d1 link set le%de1 down; "
	         "for i in $(seq 6000); do grep -q 'attempt 1 on 1 host' out.txt && break; sleep 0.05; done; "
	         "for i in $(seq 6000); do awk '/\"event\"/{e=1} e && /^[{]\"step\":/{f=1} END{exit !f}' ck.jsonl && break; "
	         "sleep 0.01; done; ip -n le%d1 link set le%de1 up; ip netns pids le%d1 | xargs -r kill -CONT",
	         p, p, p, p, p, p);
	rc = on_cluster_hosts(dir, 2, fault, inner, out, 240);
	CHECK_MSG(rc == 0, "the elastic run in %s: exit %d:\n%s", dir, rc, out);
	CHECK_CONTAINS(out, "loom run: elastic: attempt 0 on 2 hosts (10.231.7.1, 10.231.7.2), 4 ranks");
	CHECK_CONTAINS(out, "loom run: elastic: host lost: 10.231.7.2");
	CHECK_CONTAINS(out, "loom run: elastic: attempt 1 on 1 host (10.231.7.1), 2 ranks");
	CHECK_CONTAINS(out, "loom run: elastic: attempt 2 on 2 hosts");
	snprintf(a, sizeof a, "%s/ck.jsonl", dir);
	CHECK_EQ(check_log(a, N, rows, 4), 2);
	CHECK_CONTAINS(rows[0], "\"old_mesh\":{\"world\":4,\"dp\":2,\"cp\":1,\"tp\":2,");
	CHECK_CONTAINS(rows[0], "\"new_mesh\":{\"world\":2,\"dp\":1,\"cp\":1,\"tp\":2,");
	CHECK_CONTAINS(rows[0], "\"accum\":4,\"total_batch\":128");
	CHECK_CONTAINS(rows[1], "\"new_mesh\":{\"world\":4,\"dp\":2,\"cp\":1,\"tp\":2,");
	snprintf(a, sizeof a, "%s/ck/step_%08d/model.safetensors", dir, N);
	snprintf(b, sizeof b, "%s/ref/step_%08d/model.safetensors", dir, N);
	CHECK_OK(params_close(a, b, &worst));
	snprintf(a, sizeof a, "%s/ck.jsonl", dir), snprintf(b, sizeof b, "%s/ref.jsonl", dir);
	CHECK_OK(losses_close(a, b, N));
	CHECK_OK(check_traces(dir, N, 4));
	printf("  dp 2 x tp 2 -> dp 1 x tp 2 -> dp 2 x tp 2: final parameters within %.2g relative of one process\n", worst);
	test_rmdir(dir);
	return no_namespaces_left();
}

/* Elastic usage errors stop before anything starts, with exit 2 and a message naming the flag. */
TEST(elastic_bad_usage)
{
	static const struct {
		const char *args, *want;
	} cases[] = {
		{"--nnodes 2:3 true", "elastic MIN:MAX runs over a hostfile: loom run --nnodes 2:3 --hostfile FILE"},
		{"--elastic-dir /tmp/x true", "--elastic-dir is for an elastic job (--nnodes MIN:MAX --hostfile FILE)"},
		{"--elastic-rescue 1 true", "--elastic-rescue is for an elastic job (--nnodes MIN:MAX --hostfile FILE)"},
		{"--nnodes 2:3 --hostfile h --elastic-rescue yes true", "--elastic-rescue yes: expected 0 (recover from the "
		                                                         "checkpoint on disk) or 1"},
		{"--nnodes 3:2 --hostfile /nonexistent true", "--nnodes: 3 is out of range (expected 1..2)"},
#ifdef LOOM_HAVE_MPI
		{"--nnodes 1:2 --hostfile /nonexistent/hosts true", "--hostfile /nonexistent/hosts: No such file or directory"},
#else
		{"--nnodes 1:2 --hostfile /nonexistent/hosts true", "this loom was built without MPI"},
#endif
	};
	static char out[8192], cmd[1024];
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		snprintf(cmd, sizeof cmd, "%s run %s 2>&1", test_loom_bin(), cases[i].args);
		int rc = test_run_cmd(cmd, out, sizeof out, 30);
		CHECK_MSG(rc == 2, "loom run %s: exit %d (expected 2):\n%s", cases[i].args, rc, out);
		CHECK_CONTAINS(out, cases[i].want);
	}
	return 0;
}

/* A flapping host: host 2 is lost after step 10, returns, and is lost again the moment the job starts
 * growing back onto it (the start of attempt 2: mpirun cannot reach its daemon, or its ranks hang in
 * their start, which LOOM_ELASTIC_START_TIMEOUT_S bounds, or they fail at their deadline), then returns
 * for good: four membership changes, none counted as a failure, and the run still ends like the
 * uninterrupted one. */
TEST(elastic_flapping_host)
{
	enum { N = 60 };
	static char out[OUT_CAP], train[4096], inner[8192], fault[8192], rows[8][1024], a[700], b[700];
	const char *why = cluster_unavailable();
	char dir[512], *loom;
	int p = prefix(), rc;
	double worst;
	if (why)
		return TEST_SKIP("%s", why);
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(test_make_token_data(dir, 64, 6001));
	CHECK_OK(reference(dir, N, 192, "", out));
	loom = realpath(test_loom_bin(), NULL);
	CHECK(loom != NULL);
	train_cmd(train, sizeof train, dir, N, 192, "ck", "");
	snprintf(inner, sizeof inner,
	         "LOOM_ELASTIC_START_TIMEOUT_S=15 LOOM_STEP_SLEEP_MS=100 timeout 300 %s run --nnodes 2:3 --hostfile hosts "
	         "--nproc-per-node 1 --elastic-dir %s/ed %s", loom, dir, train);
	free(loom);
	snprintf(fault, sizeof fault,
	         "down() { ip netns pids le%d2 | xargs -r kill -STOP; ip -n le%d2 link set le%de2 down; echo \"DOWN $1\"; }; "
	         "up() { ip -n le%d2 link set le%de2 up; ip netns pids le%d2 | xargs -r kill -CONT; echo \"UP $1\"; }; "
	         "stepped() { awk -v k=$1 '/\"event\"/{e++} e>=k && /^[{]\"step\":/{f=1} END{exit !f}' ck.jsonl; }; "
	         "for i in $(seq 6000); do [ -d ck/step_00000010 ] && break; sleep 0.01; done; down 1; "
	         "for i in $(seq 6000); do stepped 1 && break; sleep 0.02; done; up 1; "
	         "for i in $(seq 6000); do grep -q 'attempt 2 on 3 hosts' out.txt && break; sleep 0.01; done; down 2; "
	         "for i in $(seq 6000); do grep -q 'attempt 3 on 2 hosts' out.txt && break; sleep 0.02; done; "
	         "for i in $(seq 9000); do awk '/\"event\"/{n++; f=0; w=index($0, \"\\\"new_mesh\\\":{\\\"world\\\":2,\")>0} "
	         "/^[{]\"step\":/{f=1} END{exit !(n>=2 && f && w)}' ck.jsonl && break; sleep 0.02; done; up 2",
	         p, p, p, p, p, p);
	rc = on_cluster(dir, fault, inner, out, 280);
	CHECK_MSG(rc == 0, "the elastic run in %s: exit %d:\n%s", dir, rc, out);
	CHECK_CONTAINS(out, "UP 2");
	CHECK_CONTAINS(out, "loom run: elastic: attempt 3 on 2 hosts");
	CHECK_CONTAINS(out, "loom run: elastic: attempt 4 on 3 hosts");
	CHECK_CONTAINS(out, "elastic summary: 4 membership changes, 0 failures");
	/* the grow that failed to start left no row when no rank of it started (3 rows), else 4 */
	snprintf(a, sizeof a, "%s/ck.jsonl", dir);
	int events = check_log(a, N, rows, 8);
	CHECK_MSG(events == 3 || events == 4, "%d event rows (expected 3 or 4)", events);
	CHECK_CONTAINS(rows[events - 2], "\"cause\":\"host lost: 10.231.7.3");
	CHECK_CONTAINS(rows[events - 2], "\"new_mesh\":{\"world\":2,");
	CHECK_CONTAINS(rows[events - 1], "\"cause\":\"grow: host 10.231.7.3 answers\"");
	CHECK_CONTAINS(rows[events - 1], "\"new_mesh\":{\"world\":3,");
	snprintf(a, sizeof a, "%s/ck/step_%08d/model.safetensors", dir, N);
	snprintf(b, sizeof b, "%s/ref/step_%08d/model.safetensors", dir, N);
	CHECK_OK(params_close(a, b, &worst));
	snprintf(a, sizeof a, "%s/ck.jsonl", dir), snprintf(b, sizeof b, "%s/ref.jsonl", dir);
	CHECK_OK(losses_close(a, b, N));
	test_rmdir(dir);
	return no_namespaces_left();
}
