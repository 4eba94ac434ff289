/* test_schedule.c: the pipeline schedules as data (src/parallel/schedule.c) with V model chunks per
 * rank: interleaved 1F1B's order written out by hand from Megatron-LM's rule for P 2, V 2, M 4 on both
 * ranks; for many (P, V, M) every schedule's invariants (each pair's forward before its backward, one
 * forward order shared by the ranks, backwards in it with the chunks reversed, so each link's messages
 * arrive in the order they are sent), its arenas, and deadlock freedom under the executor's rule by
 * simulation with unequal stage times; the simulated bubble of equal stages against
 * loom__pp_bubble_theory_v (exact to 1e-12), interleaved's below 1F1B's; the checks' messages. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/error.h"
#include "parallel/pp.h"
#include "test.h"

/* The plan as text: "F0c1" per action, space-separated. */
static void plan_text(const loom__pp_action_t *a, int n, char *out, size_t cap)
{
	size_t len = 0;
	out[0] = 0;
	for (int i = 0; i < n && len < cap; i++)
		len += (size_t)snprintf(out + len, cap - len, "%s%c%dc%d", i ? " " : "", a[i].op, a[i].mb, a[i].chunk);
}

/* Megatron's interleaved schedule for P 2, V 2, M 4: the forwards go through the micro-batches in
 * groups of P = 2, each group through chunk 0 then chunk 1: (0,c0) (1,c0) (0,c1) (1,c1) (2,c0) (3,c0)
 * (2,c1) (3,c1); the backwards take the same pairs with the chunk reversed. Rank 0 runs
 * 2 (P - 0 - 1) + (V - 1) P = 4 warm-up forwards, rank 1 2; then forward and backward in turn. */
TEST(schedule_interleaved_order)
{
	loom__pp_action_t a[16];
	char got[256];
	CHECK_EQ(loom__pp_plan_v(LOOM_PP_INTERLEAVED, 2, 2, 0, 4, a), 5);
	plan_text(a, 16, got, sizeof got);
	CHECK_STREQ(got, "F0c0 F1c0 F0c1 F1c1 F2c0 B0c1 F3c0 B1c1 F2c1 B0c0 F3c1 B1c0 B2c1 B3c1 B2c0 B3c0");
	CHECK_EQ(loom__pp_plan_v(LOOM_PP_INTERLEAVED, 2, 2, 1, 4, a), 3);
	plan_text(a, 16, got, sizeof got);
	CHECK_STREQ(got, "F0c0 F1c0 F0c1 B0c1 F1c1 B1c1 F2c0 B0c0 F3c0 B1c0 F2c1 B2c1 F3c1 B3c1 B2c0 B3c0");
	/* a stage model per chunk: rank 0 holds up to 4 micro-batches of chunk 0 and 2 of chunk 1 (6, where
	 * arenas shared by the chunks would need 5), rank 1 3 and 1 */
	int per[2];
	CHECK_EQ(loom__pp_chunk_arenas(LOOM_PP_INTERLEAVED, 2, 2, 0, 4, per), 6);
	CHECK(per[0] == 4 && per[1] == 2);
	CHECK_EQ(loom__pp_chunk_arenas(LOOM_PP_INTERLEAVED, 2, 2, 1, 4, per), 4);
	CHECK(per[0] == 3 && per[1] == 1);
	/* M = P: rank 0's warm-up (4) covers all M V = 4 forwards */
	CHECK_EQ(loom__pp_plan_v(LOOM_PP_INTERLEAVED, 2, 2, 0, 2, a), 4);
	plan_text(a, 8, got, sizeof got);
	CHECK_STREQ(got, "F0c0 F1c0 F0c1 F1c1 B0c1 B1c1 B0c0 B1c0");
	/* GPipe and 1F1B through the V-aware plan: chunk 0, the V = 1 plan's order */
	CHECK_EQ(loom__pp_plan_v(LOOM_PP_1F1B, 4, 1, 0, 6, a), 4);
	plan_text(a, 12, got, sizeof got);
	CHECK_STREQ(got, "F0c0 F1c0 F2c0 F3c0 B0c0 F4c0 B1c0 F5c0 B2c0 B3c0 B4c0 B5c0");
	CHECK_EQ(loom__pp_plan(LOOM_PP_GPIPE, 2, 1, 3, a), 3);
	plan_text(a, 6, got, sizeof got);
	CHECK_STREQ(got, "F0c0 F1c0 F2c0 B0c0 B1c0 B2c0");
	return 0;
}

/* For every rank of (kind, P, V, M): the invariants the executor relies on, and the arenas. Returns 0
 * or fails the test. */
static int check_plans(loom_pp_schedule_t kind, int P, int V, int M, loom__pp_action_t *all)
{
	int n = 2 * M * V, G = P * V;
	for (int s = 0; s < P; s++) {
		loom__pp_action_t *a = all + (size_t)s * n;
		int arenas = loom__pp_plan_v(kind, P, V, s, M, a), want;
		if (kind == LOOM_PP_GPIPE)
			want = M;
		else if (kind == LOOM_PP_1F1B)
			want = P - s < M ? P - s : M;
		else
			want = 2 * (P - s - 1) + (V - 1) * P + 1 < M * V ? 2 * (P - s - 1) + (V - 1) * P + 1 : M * V;
		CHECK_MSG(arenas == want, "%s P %d V %d M %d rank %d: %d arenas, expected %d",
		          loom__pp_schedule_name(kind), P, V, M, s, arenas, want);
		/* each pair once forward and once backward, forward first; with V = 1, in flight consecutive */
		int seen[128][2] = {{0}}, held = 0, first = 0;
		for (int i = 0; i < n; i++) {
			CHECK(a[i].chunk >= 0 && a[i].chunk < V && a[i].mb >= 0 && a[i].mb < M);
			int *st = seen[a[i].chunk * M + a[i].mb];
			if (a[i].op == 'F') {
				CHECK_MSG(!st[0], "P %d V %d M %d rank %d: F%dc%d twice", P, V, M, s, a[i].mb, a[i].chunk);
				st[0] = 1, held++;
				if (V == 1)
					CHECK_EQ(a[i].mb, first + held - 1);
			} else {
				CHECK_MSG(st[0] && !st[1], "P %d V %d M %d rank %d: B%dc%d before its forward or twice", P, V, M,
				          s, a[i].mb, a[i].chunk);
				st[1] = 1, held--;
				if (V == 1)
					CHECK_EQ(a[i].mb, first++);
			}
		}
		CHECK_EQ(held, 0);
		CHECK(a[n - 1].op == 'B' && a[n - 1].mb == M - 1 && a[n - 1].chunk == 0);
		/* per chunk, forwards and backwards each in micro-batch order; the chunks' arenas */
		int nf[8] = {0}, nb[8] = {0}, per[8], most[8] = {0}, sum = 0;
		for (int i = 0; i < n; i++) {
			int *k = a[i].op == 'F' ? &nf[a[i].chunk] : &nb[a[i].chunk];
			CHECK_MSG(a[i].mb == (*k)++, "P %d V %d M %d rank %d: %c%dc%d out of micro-batch order", P, V, M, s,
			          a[i].op, a[i].mb, a[i].chunk);
			int c = a[i].chunk, in = nf[c] - nb[c];
			most[c] = in > most[c] ? in : most[c];
		}
		CHECK_EQ(loom__pp_chunk_arenas(kind, P, V, s, M, per), most[0] + most[1] + most[2] + most[3]);
		for (int c = 0; c < V; c++) {
			CHECK_EQ(per[c], most[c]);
			sum += per[c];
		}
		CHECK(sum >= arenas);
	}
	/* Each link's messages in order: rank s sends its forwards' outputs of global stage g < G-1 to
	 * g + 1 (rank (s+1) % P) in the order that rank runs the forwards of g + 1 > 0, and its backwards'
	 * input gradients of g > 0 to g - 1 (rank (s-1) % P) in the order that rank runs them. */
	for (int s = 0; s < P; s++)
		for (int op = 0; op < 2; op++) {
			int to = op == 0 ? (s + 1) % P : (s + P - 1) % P, i = 0, j = 0, dg = op == 0 ? 1 : -1;
			const loom__pp_action_t *a = all + (size_t)s * n, *b = all + (size_t)to * n;
			char want = op == 0 ? 'F' : 'B';
			for (;;) {
				while (i < n && !(a[i].op == want && a[i].chunk * P + s + dg >= 0 && a[i].chunk * P + s + dg < G))
					i++;
				while (j < n && !(b[j].op == want && b[j].chunk * P + to - dg >= 0 && b[j].chunk * P + to - dg < G))
					j++;
				if (i == n || j == n)
					break;
				CHECK_MSG(a[i].chunk * P + s + dg == b[j].chunk * P + to && a[i].mb == b[j].mb,
				          "P %d V %d M %d: rank %d sends %c%dc%d, rank %d runs %c%dc%d next", P, V, M, s, want,
				          a[i].mb, a[i].chunk, to, want, b[j].mb, b[j].chunk);
				i++, j++;
			}
			CHECK_MSG(i == n && j == n, "P %d V %d M %d: link %d -> %d: messages left over", P, V, M, s, to);
		}
	return 0;
}

/* The simulated bubble with every global stage's forward f / V and backward b / V in each micro-batch;
 * -1 when the plan cannot run. */
static double bubble_equal(loom_pp_schedule_t kind, int P, int V, int M, double f, double b)
{
	size_t GM = (size_t)P * V * M;
	double *c = malloc(sizeof(double) * 2 * GM), span, bubble = -1.0;
	if (!c)
		return -1.0;
	for (size_t i = 0; i < GM; i++)
		c[i] = f / V, c[GM + i] = b / V;
	if (loom__pp_simulate_v(kind, P, V, M, c, NULL, c + GM, &span, &bubble) != LOOM_OK)
		bubble = -1.0;
	free(c);
	return bubble;
}

/* Every schedule for P 1..6, V 1..4 (V 1: GPipe and 1F1B, M 1..12; V >= 2: interleaved, M = P, 2P,
 * 3P): the invariants, deadlock freedom with unequal stage times (and a split head's own part h on
 * global stage G-2), the bubble of equal stages against the theory, interleaved's below 1F1B's. */
TEST(schedule_sweep)
{
	loom__pp_action_t *all = malloc(sizeof *all * 6 * 2 * 18 * 4);
	double *c = malloc(sizeof(double) * 3 * 6 * 4 * 18);
	unsigned rng = 12345;
	int cases = 0;
	CHECK(all && c);
	for (int P = 1; P <= 6; P++)
		for (int V = 1; V <= 4; V++)
			for (int M = 1; M <= 18; M++)
				for (int kind = 0; kind < LOOM_PP_SCHEDULES; kind++) {
					if ((V == 1) == (kind == LOOM_PP_INTERLEAVED) || (V == 1 && M > 12) ||
					    (V > 1 && (M % P || M > 3 * P)))
						continue;
					CHECK_OK(loom__pp_check(kind, P, V, M));
					if (check_plans(kind, P, V, M, all))
						goto fail;
					size_t GM = (size_t)P * V * M;
					for (size_t i = 0; i < 3 * GM; i++) /* times in (0.1, 1.1), the own part h half of them 0 */
						c[i] = 0.1 + (rng = rng * 1103515245u + 12345u, (rng >> 8) % 1000) / 1000.0;
					for (size_t i = 0; i < GM; i++)
						c[GM + i] = i / M == (size_t)P * V - 2 && i % 2 ? c[GM + i] : 0.0;
					double span, bubble;
					CHECK_MSG(loom__pp_simulate_v(kind, P, V, M, c, c + GM, c + 2 * GM, &span, &bubble) == LOOM_OK,
					          "%s P %d V %d M %d: %s", loom__pp_schedule_name(kind), P, V, M, loom_errmsg());
					CHECK(span > 0.0 && bubble >= 0.0 && bubble < 1.0);
					double th = loom__pp_bubble_theory_v(kind, P, V, M);
					CHECK_NEAR(th, (P - 1.0) / (V * M + P - 1.0), 1e-15);
					for (int r = 1; r <= 3; r++)
						CHECK_NEAR(bubble_equal(kind, P, V, M, 1.0, r), th, 1e-12);
					if (kind == LOOM_PP_INTERLEAVED && P > 1)
						CHECK(bubble_equal(kind, P, V, M, 1.0, 2.0) < bubble_equal(LOOM_PP_1F1B, P, 1, M, 1.0, 2.0));
					cases++;
				}
	CHECK_EQ(cases, 6 * 12 * 2 + 6 * 3 * 3);
	/* Megatron's numbers: P 4, M 8: 1F1B idles 3/11, interleaved V 2 3/19, V 4 3/35 */
	CHECK_NEAR(bubble_equal(LOOM_PP_1F1B, 4, 1, 8, 1.0, 2.0), 3.0 / 11.0, 1e-12);
	CHECK_NEAR(bubble_equal(LOOM_PP_INTERLEAVED, 4, 2, 8, 1.0, 2.0), 3.0 / 19.0, 1e-12);
	CHECK_NEAR(bubble_equal(LOOM_PP_INTERLEAVED, 4, 4, 8, 1.0, 2.0), 3.0 / 35.0, 1e-12);
	free(all), free(c);
	return 0;
fail:
	free(all), free(c);
	return 1;
}

/* What loom__pp_check refuses, in messages naming the flags. */
TEST(schedule_check)
{
	loom_pp_schedule_t kind;
	loom__pp_action_t a[8];
	CHECK_OK(loom__pp_schedule_parse("interleaved", &kind));
	CHECK_EQ(kind, LOOM_PP_INTERLEAVED);
	CHECK_STREQ(loom__pp_schedule_name(kind), "interleaved");
	CHECK_ERR(loom__pp_schedule_parse("zigzag", &kind), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "pipeline schedule 'zigzag' is not one of gpipe (");
	CHECK_CONTAINS(loom_errmsg(), "interleaved (1f1b over V model chunks per rank (--virtual-stages V >= 2)");
	CHECK_ERR(loom__pp_check(LOOM_PP_1F1B, 2, 2, 4), LOOM_EINVAL);
	CHECK_STREQ(loom_errmsg(), "pipeline: --virtual-stages 2 needs --pp-schedule interleaved (schedule 1f1b runs "
	            "one model chunk per rank)");
	CHECK_ERR(loom__pp_check(LOOM_PP_INTERLEAVED, 2, 1, 4), LOOM_EINVAL);
	CHECK_STREQ(loom_errmsg(), "pipeline: --pp-schedule interleaved needs --virtual-stages V >= 2 model chunks per "
	            "rank (got 1; with one chunk use --pp-schedule 1f1b)");
	CHECK_ERR(loom__pp_check(LOOM_PP_INTERLEAVED, 4, 2, 6), LOOM_EINVAL);
	CHECK_STREQ(loom_errmsg(), "pipeline: --pp-schedule interleaved runs the micro-batches in groups of --pp 4, so "
	            "--micro-batches 6 must be a multiple of 4 (e.g. 8)");
	CHECK_ERR(loom__pp_check(LOOM_PP_GPIPE, 2, 1, 0), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "0 micro-batches (--micro-batches) must all be >= 1");
	CHECK_ERR(loom__pp_plan_v(LOOM_PP_INTERLEAVED, 2, 2, 0, 3, a), LOOM_EINVAL);
	CHECK_ERR(loom__pp_plan_v(LOOM_PP_INTERLEAVED, 2, 2, 2, 2, a), LOOM_EINVAL);
	CHECK(isnan(loom__pp_bubble_theory_v(LOOM_PP_INTERLEAVED, 2, 2, 3)));
	double f[8] = {1, 1, 1, 1, 1, 1, 1, 1}, span, bubble;
	CHECK_ERR(loom__pp_simulate_v(LOOM_PP_GPIPE, 2, 2, 2, f, NULL, f, &span, &bubble), LOOM_EINVAL);
	return 0;
}

/* `loom train`'s pipeline schedule flags, checked before any work (under --nproc by the launcher,
 * before any rank starts): the interleaved schedule's conditions in messages naming the flags, the
 * older --schedule spelling, and a valid interleaved configuration passing the checks (it fails at
 * the data, as none exists: the glob matches nothing; tests/test_pp.c trains it). With two ranks the
 * launcher stops the other at the first failure, perhaps mid-message, so that message is looked for
 * from any rank. */
TEST(schedule_cli)
{
	static const struct {
		const char *args, *want;
	} cases[] = {
		{"--pp-schedule interleaved --virtual-stages 2",
		 "loom train: pipeline: --pp-schedule interleaved needs a pipeline: --pp >= 2 (got 1)"},
		{"--virtual-stages 2", "loom train: pipeline: --virtual-stages 2 needs --pp-schedule interleaved (schedule "
		                       "1f1b runs one model chunk per rank)"},
		{"--schedule gpipe --virtual-stages 3", "loom train: pipeline: --virtual-stages 3 needs --pp-schedule "
		                                        "interleaved (schedule gpipe runs one model chunk per rank)"},
		{"--pp-schedule zigzag", "loom train: --pp-schedule: pipeline schedule 'zigzag' is not one of gpipe ("},
		{"--pp-schedule gpipe --schedule 1f1b", "loom train: two pipeline schedules, gpipe and 1f1b: give one "
		                                        "--pp-schedule (the older --schedule gpipe|1f1b spelling sets the same)"},
		{"--virtual-stages 0", "loom train: --virtual-stages: 0 is out of range [1, 4096]"},
		{"--nproc 2 --pp 2 --pp-schedule interleaved --micro-batches 4",
		 "loom train: pipeline: --pp-schedule interleaved needs --virtual-stages V >= 2 model chunks per rank "
		 "(got 1; with one chunk use --pp-schedule 1f1b)"},
		{"--nproc 2 --pp 2 --pp-schedule interleaved --virtual-stages 2 --micro-batches 3",
		 "loom train: pipeline: --pp-schedule interleaved runs the micro-batches in groups of --pp 2, so "
		 "--micro-batches 3 must be a multiple of 2 (e.g. 4)"},
		{"--nproc 2 --pp 2 --pp-schedule interleaved --virtual-stages 3 --micro-batches 4",
		 "loom train: pipeline: --pp 2 x --virtual-stages 3 = 6 model chunks for a model of 4 layers: every "
		 "chunk needs at least one layer (--pp x --virtual-stages <= 4)"},
		{"--nproc 2 --pp 2 --pp-schedule interleaved --virtual-stages 2 --micro-batches 4",
		 "] loom train: loader: no files match '/nonexistent/loom_schedule_cli_*.bin'"},
	};
	char cmd[1024], out[8192];
	for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
		snprintf(cmd, sizeof cmd, "%s train --train-data '/nonexistent/loom_schedule_cli_*.bin' --model tiny "
		         "--batch-size 1 --seq-len 32 --steps 1 %s", test_loom_bin(), cases[k].args);
		int st = test_run_cmd(cmd, out, sizeof out, 60);
		CHECK_MSG(st != 0, "`%s` exited 0:\n%s", cmd, out);
		CHECK_MSG(strstr(out, cases[k].want) != NULL, "`%s`: \"%s\" not in:\n%s", cmd, cases[k].want, out);
		CHECK_MSG(!strstr(out, "step 1/1"), "`%s` trained:\n%s", cmd, out);
		/* refused by the launcher, before any rank starts: no rank's line (the last case's ranks run) */
		CHECK_MSG(k + 1 == sizeof cases / sizeof *cases || !strstr(out, "[rank "), "`%s`: a rank started:\n%s", cmd,
		          out);
	}
	return 0;
}

/* `loom plan` takes the same pipeline flags: the interleaved schedule's bubble from the simulation of
 * its P V global stages and the ideal (P-1)/(V M+P-1), and the same refusals. */
TEST(schedule_plan_cli)
{
	char cmd[1024], out[8192];
	const char *base = "plan --model tiny --nproc 2 --pp 2 --micro-batches 4 --cluster cpu-node --batch-size 1 "
	                   "--seq-len 32";
	snprintf(cmd, sizeof cmd, "%s %s --pp-schedule interleaved --virtual-stages 2", test_loom_bin(), base);
	int st = test_run_cmd(cmd, out, sizeof out, 60);
	CHECK_MSG(st == 0, "`%s` exited %d:\n%s", cmd, st, out);
	CHECK_CONTAINS(out, "; schedule interleaved\n");
	CHECK_CONTAINS(out, "pipeline: 2 model chunks per rank; bubble ");
	CHECK_CONTAINS(out, "(simulated schedule; ideal (P-1)/(V M+P-1) = 11.1%)");
	snprintf(cmd, sizeof cmd, "%s %s --pp-schedule interleaved --virtual-stages 2 --json", test_loom_bin(), base);
	st = test_run_cmd(cmd, out, sizeof out, 60);
	CHECK_MSG(st == 0, "`%s` exited %d:\n%s", cmd, st, out);
	CHECK_CONTAINS(out, "\"schedule\":\"interleaved\",\"virtual_stages\":2,");
	CHECK_CONTAINS(out, "\"bubble_theory\":0.111111,");
	snprintf(cmd, sizeof cmd, "%s %s --schedule interleaved", test_loom_bin(), base);
	st = test_run_cmd(cmd, out, sizeof out, 60);
	CHECK(st != 0);
	CHECK_CONTAINS(out, "loom plan: pipeline: --pp-schedule interleaved needs --virtual-stages V >= 2 model chunks "
	               "per rank (got 1; with one chunk use --pp-schedule 1f1b)");
	snprintf(cmd, sizeof cmd, "%s %s --virtual-stages 2", test_loom_bin(), base);
	st = test_run_cmd(cmd, out, sizeof out, 60);
	CHECK(st != 0);
	CHECK_CONTAINS(out, "loom plan: pipeline: --virtual-stages 2 needs --pp-schedule interleaved");
	return 0;
}
