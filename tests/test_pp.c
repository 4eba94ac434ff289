/* test_pp.c: pipeline parallel training (src/parallel/pp.c, schedule.c) against one process at the
 * same total batch: pp 2 and 4, GPipe and 1F1B, M = 1, 4, 8 (per-step losses within 1e-5 relative
 * over 10 steps, final parameters within 1e-5); dp 2 x pp 2; composed with tensor parallel: tp 2 x
 * pp 2 (both schedules) and dp 2 x tp 2 x pp 2 on 8 processes (parameters as tests/test_tp.c
 * compares them); a last stage running the head alone; a checkpoint written by pp 2 resumes on one
 * process, one written by tp 2 x pp 2 on one process and on dp 2; 1F1B holds at most P
 * micro-batches (counted by the executor, exactly min(M, P - s) on stage s); interleaved 1F1B with 2
 * chunks per rank on pp 2 and 4, composed with dp 2 (DDP, ZeRO 1-3) and tp 2, through the CLI too, and
 * its checkpoint resumed on one process; bad meshes, composed
 * ones too, are clear errors on every rank; a rank killed in the middle of a pipeline is
 * reported as dead by its neighbours; the Chrome trace parses and has one track per rank with every
 * kind of event; the schedules and the partition as data.
 *
 * The model is the `tiny` preset trained on sequences of 32 tokens, B = 1, so a step of 8
 * micro-batches is a few milliseconds. The reference runs in the test process (one thread); the
 * pipeline ranks are forked by test_spawn and inherit the reference in memory. */
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ckpt/json.h"
#include "loom/comm.h"
#include "loom/data.h"
#include "loom/gpt2.h"
#include "loom/limits.h"
#include "loom/mesh.h"
#include "loom/train.h"
#include "loom/util.h"
#include "parallel/pp.h"
#include "test.h"

enum { STEPS = 10, TT = 32 };

static char g_dir[512];
static double g_ref[STEPS + 1], g_ref_norm[STEPS + 1];
static float g_ref_val;
static float *g_ref_params;
static loom_gpt2_config_t g_mc;
static int g_heavy; /* the reference's model is `tiny` cut to C 32 with a 4096-row lm head: 1: 2 layers,
                       2: 4 layers; 3: `tiny` with 8 layers (pp 4 x 2 chunks) */

static int make_data(const char *dir)
{
	enum { N = 20001 };
	char path[700];
	uint16_t *t = malloc(N * sizeof *t);
	uint32_t x = 4242;
	int rc;
	if (!t)
		return LOOM_ENOMEM;
	for (int i = 0; i < N; i++) {
		x = x * 1664525u + 1013904223u;
		t[i] = (uint16_t)((x >> 24) % 3 == 0 ? (x >> 8) % 257 : (uint32_t)(i * 7 + i / 5) % 257);
	}
	snprintf(path, sizeof path, "%s/train_000000.bin", dir);
	rc = loom_shard_write(path, t, N);
	free(t);
	return rc;
}

static loom_train_config_t config(const char *glob, int accum)
{
	loom_train_config_t c = loom_train_defaults();
	c.train_data = glob;
	c.B = 1, c.T = TT, c.accum = accum, c.shuffle = 1, c.seed = 5;
	c.lr = (loom_lr_schedule_t){.peak_lr = 3e-3, .warmup = 2, .total_steps = STEPS, .kind = LOOM_SCHED_COSINE,
	                            .min_lr_frac = 0.1};
	c.grad_clip = 1.0;
	c.val_data = glob, c.eval_batches = 3;
	return c;
}

/* One process with accumulation `accum`: losses into g_ref[1..STEPS], final parameters into
 * g_ref_params. */
static int reference(int accum)
{
	char glob[600];
	loom_gpt2_t *m;
	loom_trainer_t *tr;
	loom_step_metrics_t sm;
	snprintf(glob, sizeof glob, "%s/train_*.bin", g_dir);
	loom_train_config_t c = config(glob, accum);
	CHECK_OK(loom_gpt2_preset("tiny", &g_mc));
	if (g_heavy == 3)
		g_mc.n_layer = 8;
	else if (g_heavy) /* the head outweighs the blocks: a pp 2 partition gives it a stage of its own */
		g_mc.n_layer = g_heavy == 2 ? 4 : 2, g_mc.n_embd = 32, g_mc.vocab_size = 4096;
	CHECK_OK(loom_gpt2_create(&m, &g_mc, 1, TT));
	loom_gpt2_init(m, 11);
	CHECK_OK(loom_trainer_create(&tr, &c, loom_gpt2_model(m)));
	for (int s = 1; s <= STEPS; s++) {
		CHECK_OK(loom_trainer_step(tr, &sm));
		g_ref[s] = sm.loss, g_ref_norm[s] = sm.grad_norm;
		CHECK_EQ(sm.max_inflight, 1);
		CHECK(sm.bubble == 0.0);
	}
	/* the losses move (AdamW moves every parameter by about lr per step): not a comparison of constants */
	CHECK_MSG(fabs(g_ref[STEPS] - g_ref[1]) > 1e-3, "losses %g .. %g", g_ref[1], g_ref[STEPS]);
	CHECK_OK(loom_trainer_eval(tr, &g_ref_val));
	size_t n = loom_gpt2_num_params(&g_mc);
	free(g_ref_params);
	CHECK((g_ref_params = malloc(n * sizeof(float))) != NULL);
	memcpy(g_ref_params, loom_gpt2_params(m), n * sizeof(float));
	loom_trainer_destroy(tr);
	loom_gpt2_destroy(m);
	return 0;
}

typedef struct {
	int dp, pp, M;
	const char *schedule;
	int save_at;   /* save a checkpoint after this step (0: none) */
	const char *trace;
	int tp;        /* tensor-parallel size (0: 1); each stage is then a tp shard of its layers */
	const char *resume; /* resume from this checkpoint first (its steps are not run again) */
	double tol;    /* max_diff_ok's tolerance for the final parameters (0: 1e-5, or -1e-5 with tp > 1) */
	double head_split; /* loom_train_config_t pp_head_split (0: balanced by FLOPs) */
	int head_rows; /* the positions of a micro-batch whose head stage pp-2 must compute (checked) */
	int zero;      /* the ZeRO stage on the dp axis (0: none) */
	int sp;        /* sequence parallelism (with tp > 1) */
	int V;         /* model chunks per rank (interleaved; 0: one) */
} run_t;

/* The largest difference of two parameter sets must be within tol (tol < 0: their relative L2
 * distance within -tol and the largest difference within -10 tol, for tensor parallel, whose
 * reductions sum in another order: a unit whose gradient is at rounding level, e.g. a GELU that no
 * token activates, moves by AdamW's normalized step whatever the size of that rounding; see
 * tests/test_tp.c), except in the k section of each
 * attn.c_attn.bias: softmax is invariant to it, so its exact gradient is zero and what backward
 * produces is rounding noise, which AdamW scales up to steps of about lr whatever its size (any two
 * computations that round differently, e.g. summing wte's two shares in another order, differ there
 * by up to lr per step). */
static int max_diff_ok(const float *a, const float *b, size_t n, double tol)
{
	double worst = 0.0;
	size_t at = 0, C = (size_t)g_mc.n_embd;
	unsigned char *skip = calloc(n, 1);
	CHECK(skip != NULL);
	for (int l = 0; l < g_mc.n_layer; l++) {
		char name[64];
		loom_tensor_info_t ti;
		snprintf(name, sizeof name, "h.%d.attn.c_attn.bias", l);
		CHECK_OK(loom_gpt2_tensor_info(&g_mc, loom_gpt2_tensor_index(&g_mc, name), &ti));
		memset(skip + ti.offset + C, 1, C);
	}
	double dd = 0.0, bb = 0.0;
	for (size_t i = 0; i < n; i++) {
		double d = fabs((double)a[i] - b[i]);
		if (skip[i])
			continue;
		dd += d * d, bb += (double)b[i] * b[i];
		if (d > worst)
			worst = d, at = i;
	}
	free(skip);
	if (tol < 0) { /* tensor parallel: as tests/test_tp.c's compare_params */
		CHECK_MSG(sqrt(dd / bb) <= -tol, "relative L2 distance %g to the reference's parameters", sqrt(dd / bb));
		CHECK_MSG(worst <= -10 * tol, "parameter %zu differs by %g (%g vs %g)", at, worst, a[at], b[at]);
		return 0;
	}
	if (worst > tol) { /* name the tensor */
		char name[LOOM_TENSOR_NAME_MAX + 24] = "?";
		for (int t = 0; t < loom_gpt2_num_tensors(&g_mc); t++) {
			loom_tensor_info_t ti;
			if (loom_gpt2_tensor_info(&g_mc, t, &ti) == LOOM_OK && at >= ti.offset && at < ti.offset + ti.numel)
				snprintf(name, sizeof name, "%s[%zu]", ti.name, at - ti.offset);
		}
		CHECK_MSG(0, "parameter %zu (%s) differs by %g (%g vs %g)", at, name, worst, a[at], b[at]);
	}
	return 0;
}

/* The whole model on every rank of a tp group from its shards (m's parameters when tp is 1). */
static int whole_params(loom_mesh_t *mesh, loom_gpt2_t *m, float *full)
{
	int tp = loom_mesh_size(mesh, LOOM_MESH_TP);
	size_t n = loom_gpt2_param_count(m);
	if (tp == 1) {
		memcpy(full, loom_gpt2_params(m), n * sizeof(float));
		return 0;
	}
	float *all = malloc((size_t)tp * n * sizeof(float));
	CHECK(all != NULL);
	CHECK_OK(loom_allgather(loom_mesh_comm(mesh, LOOM_MESH_TP), loom_gpt2_params(m), all, n, LOOM_FLOAT32));
	for (int q = 0; q < tp; q++)
		loom_gpt2_tp_unshard(&g_mc, tp, q, all + (size_t)q * n, full);
	free(all);
	return 0;
}

/* One rank of a dp x tp x pp mesh: the same losses as the reference after every step, the counted
 * activations, and after the last step the same parameters (the last step's checkpoint's with a
 * pipeline or ZeRO-3; without, the model's, its tp shards gathered here). */
static int pp_rank(int rank, int nranks, void *arg)
{
	const run_t *r = arg;
	char glob[600], save[600];
	loom_comm_t *comm;
	loom_mesh_t *mesh;
	loom_gpt2_t *m;
	loom_trainer_t *tr;
	loom_step_metrics_t sm;
	int tp = r->tp ? r->tp : 1, first = 1;
	(void)rank, (void)nranks;
	snprintf(glob, sizeof glob, "%s/train_*.bin", g_dir);
	snprintf(save, sizeof save, "%s/%s", g_dir, r->resume ? "ckpt_resumed" : "ckpt");
	loom_train_config_t c = config(glob, r->M);
	c.pp_schedule = r->schedule;
	c.pp_head_split = r->head_split;
	c.bucket_mb = 0.05; /* several buckets per stage */
	c.save_dir = save;
	c.trace_dir = r->trace;
	c.zero = r->zero;
	c.pp_virtual_stages = r->V;
	CHECK_OK(loom_comm_init(&comm));
	CHECK_OK(loom_mesh_create(&mesh, comm, r->dp, tp, r->pp));
	loom_gpt2_opts_t o = {.B = 1, .T = TT, .tp_size = tp, .tp_rank = loom_mesh_coord(mesh, LOOM_MESH_TP),
	                      .sequence_parallel = r->sp};
	CHECK_OK(loom_gpt2_create_opts(&m, &g_mc, &o));
	loom_gpt2_init(m, r->resume ? 99 : 11); /* a resumed run's parameters come from the checkpoint */
	c.mesh = mesh;
	CHECK_OK(loom_trainer_create(&tr, &c, loom_gpt2_model(m)));
	if (r->resume) {
		CHECK_OK(loom_trainer_resume(tr, r->resume));
		first = (int)loom_trainer_steps_done(tr) + 1;
		CHECK_EQ(first, 6);
	}
	/* model states as the composition's formula says, with P what this rank's model holds (its tp
	 * shard of its stage's tensors): ZeRO's shards are rounded to 16 floats, so within 64 dp bytes
	 * per sharded buffer */
	loom_train_memory_t mem;
	CHECK_OK(loom_trainer_memory(tr, &mem));
	CHECK_EQ(mem.theory, loom_mem_zero_states(r->dp > 1 ? r->zero : 0, mem.nparams, r->dp, NULL));
	CHECK_MSG(mem.model_states <= mem.theory + 4 * 64 * (size_t)r->dp && mem.theory <= mem.model_states + 4 * 64 *
	          (size_t)r->dp, "model states %zu, formula %zu (P %zu, zero %d, dp %d)", mem.model_states, mem.theory,
	          mem.nparams, r->zero, r->dp);
	if (tp > 1) /* a shard (a pipeline stage may hold every tensor: a head-alone last stage's partner) */
		CHECK(mem.nparams < loom_gpt2_num_params(&g_mc));
	int stage = loom_mesh_coord(mesh, LOOM_MESH_PP), lo[17], rows, V = r->V > 1 ? r->V : 1;
	CHECK(r->pp * V <= 16);
	CHECK_OK(loom_pp_stages(&g_mc, 1, TT, r->pp * V, r->head_split, lo, &rows)); /* the global stages */
	CHECK_EQ(rows, r->head_rows);
	int want_inflight = !strcmp(r->schedule, "gpipe") ? r->M : (r->M < r->pp - stage ? r->M : r->pp - stage);
	if (V > 1) { /* interleaved: min(M V, 2 (P - s - 1) + (V - 1) P + 1) (schedule.c) */
		want_inflight = 2 * (r->pp - stage - 1) + (V - 1) * r->pp + 1;
		want_inflight = want_inflight < r->M * V ? want_inflight : r->M * V;
	}
	/* The bytes a step sends to the neighbouring stages: per micro-batch and boundary, the activation
	 * forward and its gradient back, of the positions that pass (all B T; from a shared head's stage
	 * G-2 those it does not compute itself), with sequence parallelism only this tp rank's rows of them */
	int G = r->pp * V, N = TT, hr[r->M];
	long long r0 = r->sp ? (long long)loom_mesh_coord(mesh, LOOM_MESH_TP) * (N / tp) : 0, r1 = r->sp ? r0 + N / tp : N;
	unsigned long long want_bytes = 0;
	if (r->pp > 1)
		CHECK_OK(loom_pp_head_rows(&g_mc, r->schedule, 1, TT, r->pp, V, r->M, r->head_split, hr));
	for (int c = 0; c < V && r->pp > 1; c++)
		for (int mb = 0; mb < r->M; mb++)
			for (int g = c * r->pp + stage - 1; g <= c * r->pp + stage; g++) { /* its input's; its output's */
				long long lo = rows && g == G - 2 ? hr[mb] : 0, hi = r1;
				lo = lo > r0 ? lo : r0, lo = lo < hi ? lo : hi;
				if (g >= 0 && g < G - 1)
					want_bytes += (unsigned long long)(hi - lo) * (unsigned long long)g_mc.n_embd * sizeof(float);
			}
	if (r->trace) {
		CHECK_OK(loom_trainer_run(tr, NULL, NULL)); /* saves at the last step; writes the trace */
	} else {
		for (int s = first; s <= STEPS; s++) {
			CHECK_OK(loom_trainer_step(tr, &sm));
			CHECK_NEAR(sm.loss, g_ref[s], 1e-5 * g_ref[s]);
			/* each tensor counted once: the first step's norm (same parameters) differs only in the order
			 * of sums, later ones as far as the parameters have drifted (1e-7 and 4e-5 measured) */
			CHECK_NEAR(sm.grad_norm, g_ref_norm[s], (s == 1 ? 1e-6 : 1e-4) * g_ref_norm[s]);
			if (r->pp == 1) { /* the local executor */
				CHECK_EQ(sm.max_inflight, 1);
			} else {
				CHECK_EQ(sm.max_inflight, want_inflight); /* 1F1B: at most P, exactly min(M, P - stage) */
				CHECK(sm.max_inflight <= (!strcmp(r->schedule, "gpipe") ? r->M : V > 1 ? r->M * V : r->pp));
				CHECK(sm.bubble >= 0.0 && sm.bubble < 1.0);
				CHECK(sm.bubble_expected >= 0.0 && sm.bubble_expected < 1.0);
				CHECK_NEAR(sm.bubble_theory, (double)(r->pp - 1) / (V * r->M + r->pp - 1), 1e-12);
				CHECK_EQ(sm.p2p_bytes, want_bytes);
			}
			if (r->dp > 1 || tp > 1)
				CHECK_OK(loom_trainer_check_replicas(tr));
			if (s == r->save_at || s == STEPS)
				CHECK_OK(loom_trainer_save(tr));
		}
	}
	float *full = malloc(loom_gpt2_num_params(&g_mc) * sizeof(float));
	CHECK(full != NULL);
	if (r->zero == 3 || r->pp > 1) { /* no whole parameter buffer is kept (ZeRO-3, a pipeline's stages):
	                                   * the last step's checkpoint has them */
		char file[700];
		CHECK_OK(loom_barrier(comm)); /* rank 0 has committed it */
		snprintf(file, sizeof file, "%s/step_%08d/model.safetensors", save, STEPS);
		CHECK_OK(loom_model_load(file, &g_mc, full));
	} else {
		CHECK_OK(whole_params(mesh, m, full));
	}
	double tol = r->tol != 0.0 ? r->tol : tp > 1 ? -1e-5 : 1e-5;
	CHECK_OK(max_diff_ok(full, g_ref_params, loom_gpt2_num_params(&g_mc), tol));
	free(full);
	if (!r->save_at) { /* evaluation runs through the stages and agrees on every rank */
		float val;
		CHECK_OK(loom_trainer_eval(tr, &val));
		CHECK_NEAR(val, g_ref_val, 1e-5 * g_ref_val);
	}
	loom_trainer_destroy(tr);
	loom_gpt2_destroy(m);
	loom_mesh_destroy(mesh);
	loom_comm_destroy(comm);
	return 0;
}

static int setup(int accum)
{
	/* the reference runs in this process, which then forks the ranks: an OpenMP pool started here
	 * would not survive the fork (libgomp), so kernels run on this thread only */
	loom_set_num_threads(1);
	CHECK_OK(test_mkdtemp(g_dir, sizeof g_dir));
	CHECK_OK(make_data(g_dir));
	return reference(accum);
}

/* setup with the reference's model cut to a heavy head (g_heavy = kind; 0: as setup) */
static int setup_heavy(int kind, int accum)
{
	g_heavy = kind;
	int rc = setup(accum);
	g_heavy = 0;
	return rc;
}

static void teardown(void)
{
	test_rmdir(g_dir);
	free(g_ref_params);
	g_ref_params = NULL;
}

/* pp 2 and 4, both schedules, M = 1, 4, 8, against one process with accumulation M. */
TEST(pp_matches_one_process)
{
	static const int Ms[] = {1, 4, 8}, Ps[] = {2, 4};
	static const char *const scheds[] = {"gpipe", "1f1b"};
	int rc = 0;
	for (int i = 0; i < 3 && !rc; i++) {
		CHECK_EQ(setup(Ms[i]), 0);
		for (int p = 0; p < 2 && !rc; p++)
			for (int k = 0; k < 2 && !rc; k++) {
				run_t r = {.dp = 1, .pp = Ps[p], .M = Ms[i], .schedule = scheds[k]};
				rc = test_spawn(Ps[p], pp_rank, &r, 60, NULL);
				if (rc)
					fprintf(stderr, "pp %d, %s, M = %d failed\n", Ps[p], scheds[k], Ms[i]);
			}
		teardown();
	}
	return rc;
}

/* dp 2 x pp 2 (4 ranks, M = 4 each) against one process with accumulation 8: DDP on the dp axis
 * covers each stage's tensors only, and the replicas of each stage stay identical. */
TEST(pp_dp2_x_pp2)
{
	CHECK_EQ(setup(8), 0);
	run_t r = {.dp = 2, .pp = 2, .M = 4, .schedule = "1f1b"};
	int rc = test_spawn(4, pp_rank, &r, 60, NULL);
	teardown();
	return rc;
}

/* A checkpoint written by pp 2 (after step 5) resumes on one process and continues as the reference
 * (steps 6..10 and the final parameters within 1e-5). */
/* One process with accumulation `accum` resumes from g_dir/ckpt/step_00000005 and continues as the
 * reference (steps 6..10 and the final parameters within tol, as max_diff_ok). */
static int resume_one_process(int accum, double tol)
{
	char glob[600], save[600];
	loom_gpt2_t *m;
	loom_trainer_t *tr;
	loom_step_metrics_t sm;
	snprintf(glob, sizeof glob, "%s/train_*.bin", g_dir);
	snprintf(save, sizeof save, "%s/ckpt/step_00000005", g_dir);
	loom_train_config_t c = config(glob, accum);
	CHECK_OK(loom_gpt2_create(&m, &g_mc, 1, TT));
	loom_gpt2_init(m, 99); /* overwritten by the checkpoint */
	CHECK_OK(loom_trainer_create(&tr, &c, loom_gpt2_model(m)));
	CHECK_OK(loom_trainer_resume(tr, save));
	CHECK_EQ(loom_trainer_steps_done(tr), 5);
	for (int s = 6; s <= STEPS; s++) {
		CHECK_OK(loom_trainer_step(tr, &sm));
		CHECK_NEAR(sm.loss, g_ref[s], 1e-5 * g_ref[s]);
	}
	CHECK_OK(max_diff_ok(loom_gpt2_params(m), g_ref_params, loom_gpt2_num_params(&g_mc), tol));
	loom_trainer_destroy(tr);
	loom_gpt2_destroy(m);
	return 0;
}

TEST(pp_checkpoint_resumes_on_one_process)
{
	CHECK_EQ(setup(4), 0);
	run_t r = {.dp = 1, .pp = 2, .M = 4, .schedule = "1f1b", .save_at = 5};
	CHECK_EQ(test_spawn(2, pp_rank, &r, 60, NULL), 0);
	int rc = resume_one_process(4, 1e-5);
	teardown();
	return rc;
}

/* Interleaved 1F1B with V = 2 chunks per rank against one process: pp 2 (4 global stages of tiny's 4
 * layers) at M = 4 and 8, pp 4 (8 global stages of an 8-layer tiny) at M = 4 and 8; a checkpoint
 * written interleaved (after step 5) resumes on one process. Losses and gradient norms every step,
 * the final parameters and the evaluation as pp_matches_one_process; max_inflight exactly the
 * schedule's count of the rank. */
TEST(pp_interleaved_matches_one_process)
{
	/* pp 2; pp 4 on an 8-layer tiny; and a head-alone last global stage sharing its positions with
	 * global stage G-2 (rank 0's second chunk at pp 2 x V 2): blocks 0 | 1-2 | 3 + the head of 14 of
	 * 32 positions | the rest of the head, as pp 4's partition in pp_head_split_with_a_middle_stage;
	 * rank 0 then holds the embedding and the head's tensors in one chunk each (wte's two shares
	 * summed in its one gradient) */
	static const struct {
		int heavy, pp, head_rows;
		const char *what;
	} cases[] = {{0, 2, 0, "pp 2 x V 2"}, {3, 4, 0, "pp 4 x V 2"}, {2, 2, 14, "pp 2 x V 2 with the head split"}};
	static const int Ms[] = {4, 8};
	int rc = 0;
	for (size_t c = 0; c < sizeof cases / sizeof *cases && !rc; c++)
		for (int i = 0; i < 2 && !rc; i++) {
			CHECK_EQ(setup_heavy(cases[c].heavy, Ms[i]), 0);
			run_t r = {.dp = 1, .pp = cases[c].pp, .M = Ms[i], .schedule = "interleaved", .V = 2,
			           .head_rows = cases[c].head_rows};
			rc = test_spawn(cases[c].pp, pp_rank, &r, 60 * cases[c].pp / 2, NULL);
			if (rc)
				fprintf(stderr, "%s interleaved, M = %d failed\n", cases[c].what, Ms[i]);
			teardown();
		}
	CHECK_EQ(rc, 0);
	CHECK_EQ(setup(4), 0);
	run_t r = {.dp = 1, .pp = 2, .M = 4, .schedule = "interleaved", .V = 2, .save_at = 5};
	CHECK_EQ(test_spawn(2, pp_rank, &r, 60, NULL), 0);
	rc = resume_one_process(4, 1e-5);
	teardown();
	return rc;
}

/* Interleaved (V = 2) composed: dp 2 x pp 2 with DDP and with ZeRO 1, 2 and 3 (4 ranks, M = 4 each,
 * against one process with accumulation 8: the strategy attaches to the join of a rank's chunks),
 * and tp 2 x pp 2 (M = 4, against accumulation 4), with and without sequence parallelism. */
TEST(pp_interleaved_composed)
{
	static const int zs[] = {0, 1, 2, 3};
	int rc = 0;
	CHECK_EQ(setup(8), 0);
	for (int z = 0; z < 4 && !rc; z++) {
		run_t r = {.dp = 2, .pp = 2, .M = 4, .schedule = "interleaved", .V = 2, .zero = zs[z]};
		rc = test_spawn(4, pp_rank, &r, 120, NULL);
		if (rc)
			fprintf(stderr, "zero %d x dp 2 x pp 2 x V 2 failed\n", zs[z]);
	}
	teardown();
	CHECK_EQ(rc, 0);
	CHECK_EQ(setup(4), 0);
	for (int sp = 0; sp < 2 && !rc; sp++) {
		run_t r = {.dp = 1, .tp = 2, .pp = 2, .M = 4, .schedule = "interleaved", .V = 2, .sp = sp};
		rc = test_spawn(4, pp_rank, &r, 120, NULL);
		if (rc)
			fprintf(stderr, "tp 2 x pp 2 x V 2%s failed\n", sp ? " sequence parallel" : "");
	}
	teardown();
	return rc;
}

/* tp 2 x pp 2 (4 ranks: each stage a tensor-parallel shard of its layers; M = 4) against one process
 * with accumulation 4, with GPipe and with 1F1B. */
TEST(pp_tp2_x_pp2)
{
	static const char *const scheds[] = {"gpipe", "1f1b"};
	int rc = 0;
	CHECK_EQ(setup(4), 0);
	for (int k = 0; k < 2 && !rc; k++) {
		run_t r = {.dp = 1, .tp = 2, .pp = 2, .M = 4, .schedule = scheds[k]};
		rc = test_spawn(4, pp_rank, &r, 120, NULL);
		if (rc)
			fprintf(stderr, "tp 2 x pp 2, %s failed\n", scheds[k]);
	}
	teardown();
	return rc;
}

/* A caller's model without a parameter buffer (loom train's under a pipeline, which keeps no whole
 * copy): each stage initializes the tensors it holds from cfg.seed. The checkpoint saved before any
 * step (gathered from the stages, over dp under ZeRO-3, unsharded over tp) must be bit for bit the
 * whole model loom_gpt2_init gives with that seed. */
static int self_init_rank(int rank, int nranks, void *arg)
{
	const run_t *r = arg;
	char glob[600], save[600];
	loom_comm_t *comm;
	loom_mesh_t *mesh;
	loom_gpt2_t *m;
	loom_trainer_t *tr;
	int tp = r->tp ? r->tp : 1;
	(void)nranks;
	snprintf(glob, sizeof glob, "%s/train_*.bin", g_dir);
	snprintf(save, sizeof save, "%s/self_init", g_dir);
	loom_train_config_t c = config(glob, r->M);
	c.pp_schedule = r->schedule, c.pp_virtual_stages = r->V, c.zero = r->zero, c.save_dir = save, c.seed = 23;
	CHECK_OK(loom_comm_init(&comm));
	CHECK_OK(loom_mesh_create(&mesh, comm, r->dp, tp, r->pp));
	loom_gpt2_opts_t o = {.B = 1, .T = TT, .tp_size = tp, .tp_rank = loom_mesh_coord(mesh, LOOM_MESH_TP),
	                      .no_own_params = 1};
	CHECK_OK(loom_gpt2_create_opts(&m, &g_mc, &o));
	CHECK(loom_gpt2_params(m) == NULL);
	c.mesh = mesh;
	CHECK_OK(loom_trainer_create(&tr, &c, loom_gpt2_model(m)));
	CHECK_OK(loom_trainer_sync_params(tr, NULL));
	CHECK_OK(loom_trainer_save(tr));
	CHECK_OK(loom_barrier(comm)); /* rank 0 has committed it */
	if (rank == 0) {
		char file[700];
		size_t n = loom_gpt2_num_params(&g_mc);
		float *got = malloc(n * sizeof(float));
		loom_gpt2_t *w;
		CHECK(got != NULL);
		snprintf(file, sizeof file, "%s/step_00000000/model.safetensors", save);
		CHECK_OK(loom_model_load(file, &g_mc, got));
		CHECK_OK(loom_gpt2_create(&w, &g_mc, 1, TT));
		loom_gpt2_init(w, 23);
		CHECK_MSG(memcmp(got, loom_gpt2_params(w), n * sizeof(float)) == 0,
		          "the stages' own initialization differs from the whole model's");
		free(got);
		loom_gpt2_destroy(w);
	}
	loom_trainer_destroy(tr);
	loom_gpt2_destroy(m);
	loom_mesh_destroy(mesh);
	loom_comm_destroy(comm);
	return 0;
}

TEST(pp_stages_initialize_from_the_seed)
{
	static const run_t runs[] = {
		{.dp = 1, .pp = 2, .M = 4, .schedule = "1f1b"},
		{.dp = 1, .pp = 4, .M = 4, .schedule = "1f1b"},
		{.dp = 1, .pp = 2, .M = 4, .schedule = "interleaved", .V = 2},
		{.dp = 1, .tp = 2, .pp = 2, .M = 4, .schedule = "1f1b"},
		{.dp = 2, .pp = 2, .M = 2, .schedule = "1f1b", .zero = 3},
	};
	int rc = 0;
	CHECK_EQ(setup(4), 0);
	for (size_t i = 0; i < sizeof runs / sizeof runs[0] && !rc; i++) {
		const run_t *r = &runs[i];
		rc = test_spawn(r->dp * (r->tp ? r->tp : 1) * r->pp, self_init_rank, (void *)r, 120, NULL);
		if (rc)
			fprintf(stderr, "run %zu (dp %d tp %d pp %d %s zero %d) failed\n", i, r->dp, r->tp, r->pp, r->schedule,
			        r->zero);
		char dir[600];
		snprintf(dir, sizeof dir, "%s/self_init", g_dir);
		test_rmdir(dir);
	}
	teardown();
	return rc;
}

/* tp 2 x pp 2 with sequence parallelism: each tp rank sends the next stage only its rows of the
 * stream, and the previous stage its rows of the stream gradient (pp_rank checks the bytes); both
 * schedules, and a last stage of the head alone (which gathers its input) whose positions stage 0
 * shares. */
TEST(pp_tp2_x_pp2_sequence_parallel)
{
	static const char *const scheds[] = {"gpipe", "1f1b"};
	int rc = 0;
	CHECK_EQ(setup(4), 0);
	for (int k = 0; k < 2 && !rc; k++) {
		run_t r = {.dp = 1, .tp = 2, .pp = 2, .M = 4, .schedule = scheds[k], .sp = 1};
		rc = test_spawn(4, pp_rank, &r, 120, NULL);
		if (rc)
			fprintf(stderr, "tp 2 x pp 2 sequence parallel, %s failed\n", scheds[k]);
	}
	teardown();
	CHECK_EQ(rc, 0);
	/* the head's positions shared as the FLOPs balance them (13 of 32, 15 in the first micro-batch: tp
	 * rank 0 sends stage 1 rows [13, 16), or [15, 16), of its [0, 16)), at 16 of 32 (tp rank 0 sends
	 * nothing), and not at all (the last stage gathers the rows it receives before its head) */
	static const struct {
		double split;
		int rows;
	} heads[] = {{0.0, 13}, {0.5, 16}, {-1.0, 0}};
	CHECK_EQ(setup_heavy(1, 4), 0);
	for (int k = 0; k < 3 && !rc; k++) {
		run_t r = {.dp = 1, .tp = 2, .pp = 2, .M = 4, .schedule = "1f1b", .head_split = heads[k].split,
		           .head_rows = heads[k].rows, .sp = 1};
		rc = test_spawn(4, pp_rank, &r, 120, NULL);
		if (rc)
			fprintf(stderr, "tp 2 x pp 2 sequence parallel, head alone, split %g failed\n", heads[k].split);
	}
	teardown();
	return rc;
}

/* dp 2 x tp 2 x pp 2 on 8 processes (M = 4 each) against one process with accumulation 8: DDP on the
 * dp axis covers each stage's shard tensors, and tp, dp replicas stay identical (checked every step). */
TEST(pp_dp2_x_tp2_x_pp2)
{
	CHECK_EQ(setup(8), 0);
	run_t r = {.dp = 2, .tp = 2, .pp = 2, .M = 4, .schedule = "1f1b"};
	int rc = test_spawn(8, pp_rank, &r, 300, NULL);
	teardown();
	return rc;
}

/* A last stage that runs the head alone (blocks [L, L)): a model whose lm head outweighs its blocks,
 * against one process with accumulation 4. The FLOPs balance gives stage 0 the head of 13 of each
 * micro-batch's 32 positions (pp 2 with GPipe and 1F1B, tp 2 x pp 2 and dp 2 x pp 2); a given
 * fraction (8 of 32) and no split at all (the last stage runs every position) train the same. */
TEST(pp_head_alone_on_the_last_stage)
{
	static const struct {
		const char *sched;
		int tp, dp;
		double split;
		int rows;
	} runs[] = {{"gpipe", 1, 1, 0.0, 13}, {"1f1b", 1, 1, 0.0, 13}, {"1f1b", 2, 1, 0.0, 13}, {"1f1b", 1, 2, 0.0, 13},
	            {"1f1b", 1, 1, 0.25, 8}, {"1f1b", 1, 1, -1.0, 0}};
	int lo[3], rc = 0;
	double split;
	CHECK_EQ(setup_heavy(1, 4), 0);
	CHECK_OK(loom__pp_partition(&g_mc, TT, 2, lo, &split));
	CHECK(lo[0] == 0 && lo[1] == 2 && lo[2] == 2);
	/* head 6 V C = 786432 FLOPs per token, a block 72 C^2 + 12 C (T + 1) / 2 = 73728 + 6336 = 80064:
	 * (head - 2 blocks) / 2 head */
	CHECK_NEAR(split, (786432.0 - 2 * 80064.0) / (2 * 786432.0), 1e-12);
	int per[4], want[4] = {15, 13, 13, 13}; /* 1F1B: stage 0 takes more of the first micro-batch */
	CHECK_OK(loom__pp_head_rows(&g_mc, LOOM_PP_1F1B, TT, TT, 2, 1, 4, lo, 13, 1, per));
	CHECK(memcmp(per, want, sizeof per) == 0);
	for (int k = 0; k < (int)(sizeof runs / sizeof runs[0]) && !rc; k++) {
		/* dp 2: 2 micro-batches each, the same tokens per step; DDP averages each stage's tensors,
		 * wte and ln_f on both head stages, before the pipeline sums their shares */
		run_t r = {.dp = runs[k].dp, .tp = runs[k].tp, .pp = 2, .M = 4 / runs[k].dp, .schedule = runs[k].sched,
		           .head_split = runs[k].split, .head_rows = runs[k].rows};
		rc = test_spawn(2 * r.tp * r.dp, pp_rank, &r, 120, NULL);
		if (rc)
			fprintf(stderr, "head alone: dp %d x tp %d x pp 2, %s, split %g failed\n", r.dp, r.tp, r.schedule,
			        r.head_split);
	}
	teardown();
	return rc;
}

/* The head's positions shared with a middle stage (pp 3: blocks 0-2 | block 3 + head of 14 of 32
 * positions | the rest of the head; pp 4: 0 | 1-2 | 3 + 14 positions | the rest): that stage holds wte
 * and ln_f too, their gradients are summed over the three stages that hold them, and each is counted
 * once in the norm. Against one process with accumulation 4. */
TEST(pp_head_split_with_a_middle_stage)
{
	int lo[5], rc = 0;
	double split;
	CHECK_EQ(setup_heavy(2, 4), 0);
	CHECK_OK(loom__pp_partition(&g_mc, TT, 3, lo, &split));
	CHECK(lo[0] == 0 && lo[1] == 3 && lo[2] == 4 && lo[3] == 4);
	CHECK_NEAR(split, (786432.0 - 80064.0) / (2 * 786432.0), 1e-12);
	CHECK_OK(loom__pp_partition(&g_mc, TT, 4, lo, &split));
	CHECK(lo[0] == 0 && lo[1] == 1 && lo[2] == 3 && lo[3] == 4 && lo[4] == 4);
	for (int P = 3; P <= 4 && !rc; P++) {
		run_t r = {.dp = 1, .pp = P, .M = 4, .schedule = P == 3 ? "1f1b" : "gpipe", .head_rows = 14};
		rc = test_spawn(P, pp_rank, &r, 180, NULL);
		if (rc)
			fprintf(stderr, "head split with a middle stage: pp %d failed\n", P);
	}
	teardown();
	return rc;
}

/* A checkpoint written by tp 2 x pp 2 after step 5 (whole HF-layout tensors) resumes on one process
 * (accumulation 4) and on dp 2 (2 micro-batches each: the same tokens per step), both continuing as
 * the reference within 1e-5 (losses; the parameters as tensor parallel's, see max_diff_ok). */
TEST(pp_tp2_x_pp2_checkpoint_resumes)
{
	char path[700];
	CHECK_EQ(setup(4), 0);
	run_t r = {.dp = 1, .tp = 2, .pp = 2, .M = 4, .schedule = "1f1b", .save_at = 5};
	CHECK_EQ(test_spawn(4, pp_rank, &r, 120, NULL), 0);
	int rc = resume_one_process(4, -1e-5); /* the first 5 steps were tensor-parallel */
	snprintf(path, sizeof path, "%s/ckpt/step_00000005", g_dir);
	run_t d = {.dp = 2, .pp = 1, .M = 2, .schedule = "1f1b", .resume = path, .tol = -1e-5};
	if (!rc)
		rc = test_spawn(2, pp_rank, &d, 60, NULL);
	teardown();
	return rc;
}

/* ZeRO 1, 2, 3 on the data-parallel axis of a tensor-parallel mesh: dp 2 x tp 2 (4 ranks, M = 4
 * each) against one process with accumulation 8. Each tp rank's shard is sharded further over dp;
 * the losses and the gradient norm (split tensors summed over the group, whole ones once) within
 * 1e-5 every step, the replicas (dp of the shard at stages 1, 2; tp of the whole tensors) checked. */
TEST(zero_x_tp2)
{
	int rc = 0;
	CHECK_EQ(setup(8), 0);
	for (int z = 1; z <= 3 && !rc; z++) {
		run_t r = {.dp = 2, .tp = 2, .pp = 1, .M = 4, .schedule = "1f1b", .zero = z};
		rc = test_spawn(4, pp_rank, &r, 120, NULL);
		if (rc)
			fprintf(stderr, "zero %d x dp 2 x tp 2 failed\n", z);
	}
	run_t sp = {.dp = 2, .tp = 2, .pp = 1, .M = 4, .schedule = "1f1b", .zero = 3, .sp = 1}; /* and sequence parallel */
	if (!rc && (rc = test_spawn(4, pp_rank, &sp, 120, NULL)) != 0)
		fprintf(stderr, "zero 3 x dp 2 x tp 2 with sequence parallelism failed\n");
	teardown();
	return rc;
}

/* ZeRO 1, 2, 3 on the data-parallel axis of each pipeline stage: dp 2 x pp 2 (4 ranks, M = 4 each),
 * GPipe and 1F1B, against one process with accumulation 8. Each stage's tensors are sharded over its
 * dp ranks; the tied wte (held by both stages) is summed over the stages before ZeRO reduces it. */
TEST(zero_x_pp2)
{
	static const char *const scheds[] = {"gpipe", "1f1b"};
	int rc = 0;
	CHECK_EQ(setup(8), 0);
	for (int z = 1; z <= 3 && !rc; z++)
		for (int k = 0; k < 2 && !rc; k++) {
			run_t r = {.dp = 2, .pp = 2, .M = 4, .schedule = scheds[k], .zero = z};
			rc = test_spawn(4, pp_rank, &r, 120, NULL);
			if (rc)
				fprintf(stderr, "zero %d x dp 2 x pp 2 (%s) failed\n", z, scheds[k]);
		}
	teardown();
	return rc;
}

/* ZeRO on the full mesh: dp 2 x tp 2 x pp 2 on 8 processes (M = 4 each) at stages 1 and 3, and a
 * last stage that runs the head alone (its positions shared with stage 0: ln_f held by both) with
 * ZeRO-2 on dp 2 x pp 2. */
TEST(zero_x_dp2_tp2_pp2)
{
	int rc = 0;
	CHECK_EQ(setup(8), 0);
	for (int z = 1; z <= 3 && !rc; z += 2) {
		run_t r = {.dp = 2, .tp = 2, .pp = 2, .M = 4, .schedule = "1f1b", .zero = z};
		rc = test_spawn(8, pp_rank, &r, 300, NULL);
		if (rc)
			fprintf(stderr, "zero %d x dp 2 x tp 2 x pp 2 failed\n", z);
	}
	teardown();
	if (rc)
		return rc;
	CHECK_EQ(setup_heavy(1, 8), 0);
	run_t h = {.dp = 2, .pp = 2, .M = 4, .schedule = "1f1b", .zero = 2, .head_rows = 13};
	rc = test_spawn(4, pp_rank, &h, 120, NULL);
	teardown();
	return rc;
}

/* Any checkpoint onto any mesh: ZeRO-3 on dp 2 x tp 2 saves after step 5 (its moments gathered over
 * dp, the shards over tp, written whole), and one process continues from it as the reference does; a
 * ZeRO-1 checkpoint of dp 4 (moments in 4 shard files) continues on tp 2 x dp 2 without ZeRO and on
 * ZeRO-2 x tp 2. */
TEST(zero_x_tp2_checkpoints_reshard)
{
	char path[700];
	CHECK_EQ(setup(8), 0);
	run_t r = {.dp = 2, .tp = 2, .pp = 1, .M = 4, .schedule = "1f1b", .save_at = 5, .zero = 3};
	int rc = test_spawn(4, pp_rank, &r, 120, NULL);
	if (!rc)
		rc = resume_one_process(8, -1e-5);
	snprintf(path, sizeof path, "%s/ckpt/step_00000005", g_dir);
	test_rmdir(path);
	run_t z1 = {.dp = 4, .pp = 1, .M = 2, .schedule = "1f1b", .save_at = 5, .zero = 1};
	if (!rc)
		rc = test_spawn(4, pp_rank, &z1, 120, NULL);
	if (!rc) {
		char idx[800];
		snprintf(idx, sizeof idx, "%s/zero.json", path);
		CHECK_MSG(access(idx, F_OK) == 0, "%s: a ZeRO checkpoint of shards", idx);
	}
	for (int k = 0; k < 2 && !rc; k++) {
		char again[700];
		snprintf(again, sizeof again, "%s/ckpt_resumed", g_dir);
		test_rmdir(again);
		run_t d = {.dp = 2, .tp = 2, .pp = 1, .M = 4, .schedule = "1f1b", .resume = path, .tol = -1e-5, .zero = 2 * k};
		rc = test_spawn(4, pp_rank, &d, 120, NULL);
		if (rc)
			fprintf(stderr, "resuming the dp 4 zero 1 checkpoint on dp 2 x tp 2 with zero %d failed\n", 2 * k);
	}
	teardown();
	return rc;
}

/* Bad meshes, on every rank before any work: more stages than layers, a world not divisible by pp,
 * an unknown schedule; composed with tp: a world not divisible by tp x pp, more stages than layers,
 * heads not divisible by tp. */
static int bad_rank(int rank, int nranks, void *arg)
{
	char glob[600], want[200];
	loom_comm_t *comm;
	loom_mesh_t *mesh;
	loom_gpt2_t *m;
	loom_trainer_t *tr;
	loom_gpt2_config_t mc;
	(void)nranks, (void)arg;
	snprintf(glob, sizeof glob, "%s/train_*.bin", g_dir);
	loom_train_config_t c = config(glob, 2);
	CHECK_OK(loom_comm_init(&comm));
	CHECK_ERR(loom_mesh_create(&mesh, comm, 0, 1, 3), LOOM_EINVAL);
	CHECK(mesh == NULL);
	CHECK_CONTAINS(loom_errmsg(), "not divisible");
	CHECK_OK(loom_gpt2_preset("tiny", &mc));
	mc.n_layer = 2;
	CHECK_OK(loom_gpt2_create(&m, &mc, 1, TT));
	CHECK_OK(loom_mesh_create(&mesh, comm, 1, 1, 4));
	c.mesh = mesh;
	CHECK_ERR(loom_trainer_create(&tr, &c, loom_gpt2_model(m)), LOOM_EINVAL);
	CHECK(tr == NULL);
	snprintf(want, sizeof want, "trainer: rank %d: a pipeline of 4 stages for a model of 2 layers: every stage "
	         "needs at least one layer (pp <= 2)", rank);
	CHECK_CONTAINS(loom_errmsg(), want);
	c.pp_schedule = "zigzag";
	CHECK_ERR(loom_trainer_create(&tr, &c, loom_gpt2_model(m)), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "pipeline schedule 'zigzag' is not one of gpipe");
	loom_gpt2_destroy(m);
	loom_mesh_destroy(mesh);
	c.pp_schedule = NULL;
	/* composed meshes: tp 3 x pp 2 on 4 ranks; tp 2 x pp 2 of a model of one layer; and of a model
	 * whose 3 heads tp 2 cannot split (before any model exists) */
	CHECK_ERR(loom_mesh_create(&mesh, comm, 0, 3, 2), LOOM_EINVAL);
	snprintf(want, sizeof want, "mesh: rank %d of 4: the world of 4 ranks is not divisible by the other sizes (6) "
	         "to derive dp", rank);
	CHECK_CONTAINS(loom_errmsg(), want);
	CHECK_OK(loom_mesh_create(&mesh, comm, 0, 2, 2));
	CHECK_EQ(loom_mesh_size(mesh, LOOM_MESH_DP), 1);
	mc.n_layer = 1;
	loom_gpt2_opts_t o = {.B = 1, .T = TT, .tp_size = 2, .tp_rank = loom_mesh_coord(mesh, LOOM_MESH_TP)};
	CHECK_OK(loom_gpt2_create_opts(&m, &mc, &o));
	c.mesh = mesh;
	CHECK_ERR(loom_trainer_create(&tr, &c, loom_gpt2_model(m)), LOOM_EINVAL);
	snprintf(want, sizeof want, "trainer: rank %d: a pipeline of 2 stages for a model of 1 layers", rank);
	CHECK_CONTAINS(loom_errmsg(), want);
	loom_gpt2_destroy(m);
	mc.n_layer = 4, mc.n_head = 3, mc.n_embd = 96;
	CHECK_ERR(loom_gpt2_tp_check(&mc, loom_mesh_size(mesh, LOOM_MESH_TP)), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "3 attention heads are not divisible by tp = 2");
	CHECK_ERR(loom_gpt2_create_opts(&m, &mc, &o), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "3 attention heads are not divisible by tp = 2");
	loom_mesh_destroy(mesh);
	loom_comm_destroy(comm);
	return 0;
}

TEST(pp_bad_meshes)
{
	CHECK_OK(test_mkdtemp(g_dir, sizeof g_dir));
	CHECK_OK(make_data(g_dir));
	int rc = test_spawn(4, bad_rank, NULL, 60, NULL);
	test_rmdir(g_dir);
	return rc;
}

/* pp 3: stage 1 (rank 1) dies by SIGKILL after two steps; stages 0 and 2, waiting on it in the
 * pipeline, report it as dead (LOOM_EPEERLOST naming the rank) within seconds, not a hang. */
static int death_rank(int rank, int nranks, void *arg)
{
	char glob[600];
	loom_comm_t *comm;
	loom_mesh_t *mesh;
	loom_gpt2_t *m;
	loom_trainer_t *tr;
	loom_step_metrics_t sm;
	(void)nranks, (void)arg;
	if (rank == 1) { /* the victim runs in a child, so that this rank's process exits 0 */
		int st;
		pid_t p = fork();
		if (p < 0)
			return 1;
		if (p > 0) {
			waitpid(p, &st, 0);
			CHECK_MSG(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "victim status %d", st);
			return 0;
		}
	}
	snprintf(glob, sizeof glob, "%s/train_*.bin", g_dir);
	loom_train_config_t c = config(glob, 4);
	CHECK_OK(loom_comm_init(&comm));
	CHECK_OK(loom_mesh_create(&mesh, comm, 1, 1, 3));
	CHECK_OK(loom_gpt2_create(&m, &g_mc, 1, TT));
	loom_gpt2_init(m, 11);
	c.mesh = mesh;
	CHECK_OK(loom_trainer_create(&tr, &c, loom_gpt2_model(m)));
	CHECK_OK(loom_trainer_step(tr, &sm));
	CHECK_OK(loom_trainer_step(tr, &sm));
	if (rank == 1)
		raise(SIGKILL);
	double t0 = loom_now();
	int rc = LOOM_OK;
	for (int s = 0; s < 3 && rc == LOOM_OK; s++)
		rc = loom_trainer_step(tr, &sm);
	CHECK_ERR(rc, LOOM_EPEERLOST);
	CHECK_MSG(loom_now() - t0 < 10.0, "the dead rank was noticed after %.1f s", loom_now() - t0);
	CHECK_CONTAINS(loom_errmsg(), "rank 1");
	CHECK_CONTAINS(loom_errmsg(), "pipeline stage");
	loom_trainer_destroy(tr);
	loom_gpt2_destroy(m);
	loom_mesh_destroy(mesh);
	loom_comm_destroy(comm);
	return 0;
}

TEST(pp_dead_rank_is_reported)
{
	const char *env[] = {"LOOM_TIMEOUT_S=30", NULL};
	CHECK_OK(loom_gpt2_preset("tiny", &g_mc));
	CHECK_OK(test_mkdtemp(g_dir, sizeof g_dir));
	CHECK_OK(make_data(g_dir));
	int rc = test_spawn(3, death_rank, NULL, 60, env);
	test_rmdir(g_dir);
	return rc;
}

/* Each stage holds only its own tensors: its blocks', the embedding on the first, ln_f and the tied
 * wte (a copy, its gradient summed with the first stage's) on the last. The model states the trainer
 * reports are 16 bytes per held parameter, each parameter of the model is owned by exactly one stage,
 * and a pp 4 stage holds far less than the whole model (the same run as pp_matches_one_process, M = 4,
 * trains equal to one process). */
static int stage_memory_rank(int rank, int nranks, void *arg)
{
	char glob[600];
	loom_comm_t *comm;
	loom_mesh_t *mesh;
	loom_gpt2_t *m;
	loom_trainer_t *tr;
	loom_train_memory_t mem;
	int lo[8], rows, P = nranks;
	(void)arg;
	snprintf(glob, sizeof glob, "%s/train_*.bin", g_dir);
	loom_train_config_t c = config(glob, 4);
	CHECK_OK(loom_comm_init(&comm));
	CHECK_OK(loom_mesh_create(&mesh, comm, 1, 1, P));
	CHECK_OK(loom_gpt2_create(&m, &g_mc, 1, TT));
	loom_gpt2_init(m, 11);
	c.mesh = mesh;
	CHECK_OK(loom_trainer_create(&tr, &c, loom_gpt2_model(m)));
	CHECK_OK(loom_pp_stages(&g_mc, 1, TT, P, 0.0, lo, &rows));
	CHECK_EQ(rows, 0);
	size_t held = 0, owned = 0, all = 0;
	int n = loom_gpt2_num_tensors(&g_mc), L = g_mc.n_layer;
	for (int t = 0; t < n; t++) {
		loom_tensor_info_t ti;
		CHECK_OK(loom_gpt2_tensor_info(&g_mc, t, &ti));
		int own = ti.layer < 0 ? rank == 0 : ti.layer >= L ? rank == P - 1 : ti.layer >= lo[rank] && ti.layer < lo[rank + 1];
		held += own || (ti.head_reads && rank == P - 1) ? ti.numel : 0;
		owned += own ? ti.numel : 0;
		all += ti.numel;
	}
	CHECK_OK(loom_trainer_memory(tr, &mem));
	CHECK_EQ(mem.nparams, held);
	CHECK_EQ(mem.model_states, 16 * held);
	CHECK(held < all);
	size_t sum = 0;
	CHECK_OK(loom_allreduce(comm, &owned, &sum, 1, LOOM_INT64, LOOM_SUM));
	CHECK_EQ(sum, all);
	loom_step_metrics_t sm;
	for (int s = 1; s <= 3; s++) {
		CHECK_OK(loom_trainer_step(tr, &sm));
		CHECK_NEAR(sm.loss, g_ref[s], 1e-5 * g_ref[s]);
	}
	loom_trainer_destroy(tr);
	loom_gpt2_destroy(m);
	loom_mesh_destroy(mesh);
	loom_comm_destroy(comm);
	return 0;
}

TEST(pp_stage_holds_its_own_tensors)
{
	CHECK_EQ(setup(4), 0);
	int rc = test_spawn(2, stage_memory_rank, NULL, 60, NULL);
	if (!rc)
		rc = test_spawn(4, stage_memory_rank, NULL, 60, NULL);
	teardown();
	return rc;
}

/* A ZeRO-1 checkpoint of dp 4 (its moments in 4 shard files) continues on pp 2 x dp 2 (each stage
 * reads its tensors of the whole state) as the reference does. */
TEST(pp_resumes_a_zero_checkpoint)
{
	char path[700];
	CHECK_EQ(setup(8), 0);
	run_t z1 = {.dp = 4, .pp = 1, .M = 2, .schedule = "1f1b", .save_at = 5, .zero = 1};
	int rc = test_spawn(4, pp_rank, &z1, 120, NULL);
	snprintf(path, sizeof path, "%s/ckpt/step_00000005", g_dir);
	run_t d = {.dp = 2, .pp = 2, .M = 4, .schedule = "1f1b", .resume = path};
	if (!rc)
		rc = test_spawn(4, pp_rank, &d, 120, NULL);
	teardown();
	return rc;
}

/* --trace: trace.json parses (the checkpoint reader's JSON parser), holds one track per rank (a
 * process_name record for pids 0 and 1) and every kind of event on each; with 1F1B and with the
 * interleaved schedule (2 chunks per rank: each rank runs the forwards of two blocks, one per chunk,
 * tiny's 4 layers over 4 global stages). */
TEST(pp_trace_one_track_per_rank)
{
	char dir[600], path[700], err[200];
	CHECK_EQ(setup(4), 0);
	for (int il = 0; il < 2; il++) {
		snprintf(dir, sizeof dir, "%s/trace%d", g_dir, il);
		run_t r = {.dp = 1, .pp = 2, .M = 4, .schedule = il ? "interleaved" : "1f1b", .V = il ? 2 : 0, .trace = dir};
		CHECK_EQ(test_spawn(2, pp_rank, &r, 60, NULL), 0);
		snprintf(path, sizeof path, "%s/trace.json", dir);
		FILE *f = fopen(path, "rb");
		CHECK_MSG(f != NULL, "no %s", path);
		fseek(f, 0, SEEK_END);
		long n = ftell(f);
		fseek(f, 0, SEEK_SET);
		char *text = malloc((size_t)n + 1);
		CHECK(text && fread(text, 1, (size_t)n, f) == (size_t)n);
		fclose(f);
		json_t root;
		CHECK_MSG(loom__json_parse(text, (size_t)n, &root, err, sizeof err) == 0, "%s", err);
		const json_t *evs = loom__json_get(&root, "traceEvents");
		CHECK(evs && evs->type == JSON_ARRAY);
		/* seen[pid][kind]: forward, backward, send, recv, allreduce, optimizer, step, idle, track name */
		static const char *const cats[] = {"forward", "backward", "send", "recv", "allreduce", "optimizer", "step",
		                                   "idle"};
		int seen[2][9] = {{0}};
		for (int i = 0; i < evs->n; i++) {
			const json_t *e = &evs->kids[i], *pid = loom__json_get(e, "pid"), *cat = loom__json_get(e, "cat");
			int64_t p;
			CHECK(pid && loom__json_to_i64(pid, &p) == 0 && p >= 0 && p < 2);
			if (!cat) {
				CHECK_EQ(strcmp(loom__json_get(e, "ph")->s, "M"), 0);
				seen[p][8]++;
				continue;
			}
			for (int k = 0; k < 8; k++)
				if (!strcmp(cat->s, cats[k]))
					seen[p][k]++;
		}
		for (int p = 0; p < 2; p++) {
			CHECK_EQ(seen[p][8], 1);
			CHECK_EQ(seen[p][6], STEPS);
			CHECK_EQ(seen[p][5], STEPS);
			for (int k = 0; k < 8; k++)
				CHECK_MSG(seen[p][k] > 0, "rank %d has no '%s' event", p, cats[k]);
		}
		loom__json_free(&root);
		free(text);
	}
	teardown();
	return 0;
}

/* The simulated bubble of stages whose times are the same in every micro-batch (f, h, b per stage). */
static double bubble_sim(loom_pp_schedule_t kind, int P, int M, const double *f, const double *h, const double *b)
{
	size_t PM = (size_t)P * M;
	double *all = malloc(sizeof(double) * 3 * PM), span, bubble = -1.0;
	if (!all)
		return -1.0;
	for (int s = 0; s < P; s++)
		for (int m = 0; m < M; m++) {
			size_t k = (size_t)s * M + (size_t)m;
			all[k] = f[s], all[PM + k] = h ? h[s] : 0.0, all[2 * PM + k] = b[s];
		}
	if (loom__pp_simulate(kind, P, M, all, all + PM, all + 2 * PM, &span, &bubble) != LOOM_OK)
		bubble = -1.0;
	free(all);
	return bubble;
}

/* The schedules as data: 1F1B's order on each stage, GPipe's, and the partition balanced by FLOPs. */
TEST(pp_schedules_and_partition)
{
	loom__pp_action_t a[16];
	char got[64];
	int lo[5], rows;
	double split;
	loom_gpt2_config_t mc;
	CHECK_EQ(loom__pp_plan(LOOM_PP_1F1B, 4, 0, 6, a), 4);
	for (int i = 0; i < 12; i++)
		got[i] = (char)(a[i].op == 'F' ? '0' + a[i].mb : 'a' + a[i].mb);
	got[12] = 0;
	CHECK_EQ(strcmp(got, "0123a4b5cdef"), 0); /* 3 warm-up forwards, then 1F1B, then the backwards */
	CHECK_EQ(loom__pp_plan(LOOM_PP_1F1B, 4, 3, 6, a), 1);
	for (int i = 0; i < 12; i++)
		got[i] = (char)(a[i].op == 'F' ? '0' + a[i].mb : 'a' + a[i].mb);
	CHECK_EQ(strcmp(got, "0a1b2c3d4e5f"), 0);
	CHECK_EQ(loom__pp_plan(LOOM_PP_GPIPE, 2, 1, 3, a), 3);
	for (int i = 0; i < 6; i++)
		got[i] = (char)(a[i].op == 'F' ? '0' + a[i].mb : 'a' + a[i].mb);
	got[6] = 0;
	CHECK_EQ(strcmp(got, "012abc"), 0);
	CHECK_NEAR(loom__pp_bubble_theory(LOOM_PP_1F1B, 2, 8), 1.0 / 9.0, 1e-15);
	/* the simulated schedule: equal stages idle the theory's (P-1)/(M+P-1) in both schedules */
	double f4[4] = {1, 1, 1, 1}, b4[4] = {2, 2, 2, 2}, h4[4] = {0, 0, 0, 0};
	CHECK_NEAR(bubble_sim(LOOM_PP_1F1B, 4, 6, f4, NULL, b4), 3.0 / 9.0, 1e-12);
	CHECK_NEAR(bubble_sim(LOOM_PP_GPIPE, 4, 6, f4, h4, b4), 3.0 / 9.0, 1e-12);
	/* a slow last stage paces the others: P 2, M 4, stage 0 3 per micro-batch, stage 1 6: the span is
	 * 1 + 4 x 6 + 2 = 27 (stage 0's first forward, stage 1's four, stage 0's last backward) */
	double f2[2] = {1, 2}, b2[2] = {2, 4};
	CHECK_NEAR(bubble_sim(LOOM_PP_1F1B, 2, 4, f2, NULL, b2), 1.0 - (12.0 + 24.0) / (2 * 27.0), 1e-12);
	/* the head alone on stage 1 (no forward, 5 per backward) and 1 of stage 0's 4 per backward that
	 * needs nothing from it (its share of the head): 1F1B M 2 runs stage 0 F0 0-1, F1 1-2, own part of
	 * B0 2-3, waits for stage 1's B0 (1-6), B0 6-9, own part of B1 9-10, stage 1's B1 (6-11), B1
	 * 11-14; stage 1 idles 0-1 and 11-14: span 14 */
	double fh[2] = {1, 0}, hh[2] = {1, 0}, bh[2] = {3, 5};
	CHECK_NEAR(bubble_sim(LOOM_PP_1F1B, 2, 2, fh, hh, bh), 1.0 - (10.0 + 10.0) / (2 * 14.0), 1e-12);
	CHECK_OK(loom_gpt2_preset("tiny", &mc)); /* the head is cheap: 2 + 2 */
	CHECK_OK(loom__pp_partition(&mc, 32, 2, lo, &split));
	CHECK(split == 0.0);
	CHECK_EQ(lo[0], 0);
	CHECK_EQ(lo[1], 2);
	CHECK_EQ(lo[2], 4);
	/* `small`: the 50257-row lm head (6 V C = 115792128 FLOPs per token) outweighs the six blocks (72 C^2 +
	 * 12 C (T + 1) / 2 = 10616832 + 592128 = 11208960 each at T 256: attention's causal triangle): a stage
	 * alone, sharing (head - c) / (2 head) of the positions with the stage before, whose blocks cost c */
	CHECK_OK(loom_gpt2_preset("small", &mc));
	CHECK_OK(loom__pp_partition(&mc, 256, 2, lo, &split));
	CHECK(lo[0] == 0 && lo[1] == 6 && lo[2] == 6);
	CHECK_NEAR(split, (115792128.0 - 6 * 11208960.0) / (2 * 115792128.0), 1e-12);
	CHECK_OK(loom_pp_stages(&mc, 1, 256, 2, 0.0, lo, &rows));
	CHECK_EQ(rows, 54); /* 0.20959 x 256 = 53.66 */
	/* the first and last micro-batch's shares, from a simulation of the schedule: in 1F1B stage 0
	 * takes more of the first (it would wait for the last stage's first head otherwise), in GPipe more
	 * of the first and the last; a given fraction is kept in every micro-batch */
	int per[8], want1[8] = {125, 54, 54, 54, 54, 54, 54, 54}, want2[8] = {253, 54, 54, 54, 54, 54, 54, 77};
	CHECK_OK(loom__pp_head_rows(&mc, LOOM_PP_1F1B, 256, 256, 2, 1, 8, lo, rows, 1, per));
	CHECK(memcmp(per, want1, sizeof per) == 0);
	CHECK_OK(loom__pp_head_rows(&mc, LOOM_PP_GPIPE, 256, 256, 2, 1, 8, lo, rows, 1, per));
	CHECK(memcmp(per, want2, sizeof per) == 0);
	CHECK_OK(loom__pp_head_rows(&mc, LOOM_PP_1F1B, 256, 256, 2, 1, 8, lo, rows, 0, per));
	for (int m = 0; m < 8; m++)
		CHECK_EQ(per[m], 54);
	CHECK_OK(loom_pp_stages(&mc, 2, 256, 2, 0.5, lo, &rows));
	CHECK_EQ(rows, 256);
	CHECK_OK(loom_pp_stages(&mc, 1, 256, 2, -1.0, lo, &rows));
	CHECK(rows == 0 && lo[1] == 6 && lo[2] == 6);
	CHECK_ERR(loom_pp_stages(&mc, 1, 256, 2, 1.0, lo, &rows), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "must be < 1");
	/* pp 3: blocks 0-4 | block 5 + 45% of the head | the rest, each 5.4 blocks' worth */
	CHECK_OK(loom__pp_partition(&mc, 256, 3, lo, &split));
	CHECK(lo[0] == 0 && lo[1] == 5 && lo[2] == 6 && lo[3] == 6);
	CHECK_NEAR(split, (115792128.0 - 11208960.0) / (2 * 115792128.0), 1e-12);
	CHECK_ERR(loom__pp_partition(&mc, 256, 7, lo, NULL), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "7 stages for a model of 6 layers");
	CHECK_OK(loom_gpt2_preset("gpt2", &mc)); /* 12 blocks of C 768: the head is 4.5 blocks' worth */
	CHECK_OK(loom__pp_partition(&mc, 1024, 2, lo, &split));
	CHECK_EQ(lo[1], 8);
	CHECK(split == 0.0);
	CHECK_OK(loom_pp_stages(&mc, 1, 1024, 2, 0.3, lo, &rows));
	CHECK_EQ(rows, 0); /* no head-alone stage to share with: a given fraction does not apply */
	CHECK_OK(loom__pp_partition(&mc, 1024, 1, lo, NULL));
	CHECK(lo[0] == 0 && lo[1] == 12);
	return 0;
}

/* The CLI: `--nproc 2 --pp 2` trains, says so and logs the bubble; so does `--nproc 4 --tp 2 --pp 2`;
 * a world not divisible by --pp is a
 * clear error (on every rank: the mesh's check runs before any work). */
/* Resume on the same mesh is bit-identical to the uninterrupted run (the log's lines and every file
 * of the final checkpoint the same bytes), for ZeRO on the data-parallel axis of a pipeline (dp 2 x
 * pp 2, ZeRO-2) and of a tensor-parallel mesh (dp 2 x tp 2, ZeRO-3). */
static int resume_bit_identical(const char *mesh)
{
	char cmd[4096], out[16384];
	static char full[16][160], resumed[16][160];
	double loss[16];
	const char *loom = test_loom_bin();
#define RFLAGS "--model tiny --batch-size 1 --seq-len 32 --micro-batches 2 --steps 6 --save-every 3 --peak-flops 1e10"
	snprintf(cmd, sizeof cmd, "%s train %s --train-data '%s/train_*.bin' " RFLAGS " --save-dir %s/ck --log "
	         "%s/full.jsonl", loom, mesh, g_dir, g_dir, g_dir);
	int st = test_run_cmd(cmd, out, sizeof out, 120);
	CHECK_MSG(st == 0, "`%s` exited %d:\n%s", cmd, st, out);
	snprintf(cmd, sizeof cmd, "rm -rf %s/final && mv %s/ck/step_00000006 %s/final && cp %s/full.jsonl %s/r.jsonl",
	         g_dir, g_dir, g_dir, g_dir, g_dir);
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 10), 0);
	snprintf(cmd, sizeof cmd, "%s train %s --train-data '%s/train_*.bin' " RFLAGS " --save-dir %s/ck --log %s/r.jsonl "
	         "--resume", loom, mesh, g_dir, g_dir, g_dir);
	st = test_run_cmd(cmd, out, sizeof out, 120);
	CHECK_MSG(st == 0, "`%s` exited %d:\n%s", cmd, st, out);
	CHECK_CONTAINS(out, "resumed from ");
	CHECK_CONTAINS(out, " at step 3");
	snprintf(cmd, sizeof cmd, "%s/full.jsonl", g_dir);
	CHECK_EQ(test_read_losses(cmd, loss, 16, full, NULL), 6);
	snprintf(cmd, sizeof cmd, "%s/r.jsonl", g_dir);
	CHECK_EQ(test_read_losses(cmd, loss, 16, resumed, NULL), 6);
	for (int k = 1; k <= 6; k++)
		CHECK_STREQ(resumed[k], full[k]);
	snprintf(cmd, sizeof cmd, "cd %s && for f in final/*.safetensors; do cmp $f ck/step_00000006/${f#final/} || exit 1; "
	         "done && rm -rf ck final", g_dir);
	st = test_run_cmd(cmd, out, sizeof out, 10);
	CHECK_MSG(st == 0, "%s: the resumed run's final checkpoint differs: %s", mesh, out);
#undef RFLAGS
	return 0;
}

TEST(zero_mesh_resume_bit_identical)
{
	CHECK_OK(test_mkdtemp(g_dir, sizeof g_dir));
	CHECK_OK(make_data(g_dir));
	int rc = resume_bit_identical("--nproc 4 --pp 2 --zero 2");
	if (!rc)
		rc = resume_bit_identical("--nproc 4 --tp 2 --zero 3");
	test_rmdir(g_dir);
	return rc;
}

/* Resharding from the full mesh: ZeRO-3 on dp 2 x tp 2 x pp 2 (8 ranks) saves after step 5; one
 * process, ZeRO-1 on dp 4 (4 ranks, the same tokens per step) and tp 2 x pp 2 interleaved (V = 2)
 * continue from it as the reference does. */
TEST(zero_3d_checkpoint_reshards)
{
	char path[700];
	CHECK_EQ(setup(8), 0);
	run_t r = {.dp = 2, .tp = 2, .pp = 2, .M = 4, .schedule = "1f1b", .save_at = 5, .zero = 3};
	int rc = test_spawn(8, pp_rank, &r, 300, NULL);
	if (!rc)
		rc = resume_one_process(8, -1e-5);
	snprintf(path, sizeof path, "%s/ckpt/step_00000005", g_dir);
	run_t d = {.dp = 4, .pp = 1, .M = 2, .schedule = "1f1b", .resume = path, .tol = -1e-5, .zero = 1};
	if (!rc)
		rc = test_spawn(4, pp_rank, &d, 120, NULL);
	run_t il = {.dp = 1, .tp = 2, .pp = 2, .M = 8, .schedule = "interleaved", .V = 2, .resume = path, .tol = -1e-5};
	if (!rc && (rc = test_spawn(4, pp_rank, &il, 120, NULL)) != 0)
		fprintf(stderr, "resuming the 3D ZeRO-3 checkpoint on tp 2 x pp 2 interleaved failed\n");
	teardown();
	return rc;
}

TEST(pp_cli)
{
	char cmd[2048], out[16384];
	CHECK_OK(test_mkdtemp(g_dir, sizeof g_dir));
	CHECK_OK(make_data(g_dir));
	snprintf(cmd, sizeof cmd, "%s train --nproc 2 --pp 2 --micro-batches 4 --schedule gpipe --train-data "
	         "'%s/train_*.bin' --model tiny --batch-size 1 --seq-len 32 --steps 3 --schedule constant "
	         "--peak-flops 1e10 --log %s/log.jsonl", test_loom_bin(), g_dir, g_dir);
	int st = test_run_cmd(cmd, out, sizeof out, 60);
	CHECK_MSG(st == 0, "`%s` exited %d:\n%s", cmd, st, out);
	CHECK_CONTAINS(out, "[rank 0] batch: B=1 T=32 micro-batches=4 dp=1 -> 128 tokens per step");
	CHECK_CONTAINS(out, "[rank 0] pipeline parallel: 2 stages x dp 1, schedule gpipe, 4 micro-batches per step "
	               "(ideal bubble (P-1)/(M+P-1) = 20.0%)");
	CHECK_CONTAINS(out, "(ideal 20.0%, for these stages ");
	CHECK_CONTAINS(out, "[rank 0] step 3/3 | loss ");
	snprintf(cmd, sizeof cmd, "%s/log.jsonl", g_dir);
	FILE *f = fopen(cmd, "r");
	char line[8192];
	CHECK(f != NULL);
	while (fgets(line, sizeof line, f) && strncmp(line, "{\"step\":", 8) != 0) /* after the config record */
		;
	fclose(f);
	CHECK_CONTAINS(line, "{\"step\":1,");
	CHECK_CONTAINS(line, ",\"bubble\":");
	CHECK_CONTAINS(line, ",\"bubble_theory\":0.2000,\"bubble_expected\":");
	/* interleaved: 2 model chunks per stage, the trace and the log's bubble as with 1F1B */
	snprintf(cmd, sizeof cmd, "%s train --nproc 2 --pp 2 --micro-batches 4 --pp-schedule interleaved "
	         "--virtual-stages 2 --train-data '%s/train_*.bin' --model tiny --batch-size 1 --seq-len 32 --steps 3 "
	         "--schedule constant --peak-flops 1e10 --log %s/log_il.jsonl --trace %s/trace_il", test_loom_bin(), g_dir,
	         g_dir, g_dir);
	st = test_run_cmd(cmd, out, sizeof out, 60);
	CHECK_MSG(st == 0, "`%s` exited %d:\n%s", cmd, st, out);
	CHECK_CONTAINS(out, "[rank 0] pipeline parallel: 2 stages x dp 1, schedule interleaved, 2 model chunks per stage, "
	               "4 micro-batches per step (ideal bubble (P-1)/(V M+P-1) = 11.1%)");
	CHECK_CONTAINS(out, "[rank 0] step 3/3 | loss ");
	snprintf(cmd, sizeof cmd, "%s/log_il.jsonl", g_dir);
	CHECK((f = fopen(cmd, "r")) != NULL);
	while (fgets(line, sizeof line, f) && strncmp(line, "{\"step\":", 8) != 0)
		;
	fclose(f);
	CHECK_CONTAINS(line, ",\"bubble_theory\":0.1111,\"bubble_expected\":");
	/* tp and pp together: 4 ranks as tp 2 x pp 2 */
	snprintf(cmd, sizeof cmd, "%s train --nproc 4 --tp 2 --pp 2 --micro-batches 2 --train-data '%s/train_*.bin' "
	         "--model tiny --batch-size 1 --seq-len 32 --steps 2 --print-every 1", test_loom_bin(), g_dir);
	st = test_run_cmd(cmd, out, sizeof out, 120);
	CHECK_MSG(st == 0, "`%s` exited %d:\n%s", cmd, st, out);
	CHECK_CONTAINS(out, "[rank 0] pipeline parallel: 2 stages x dp 1, schedule 1f1b, 2 micro-batches per step");
	CHECK_CONTAINS(out, "[rank 0] tensor parallel: tp 2 x dp 1 x pp 2 = 4 ranks");
	CHECK_CONTAINS(out, "[rank 0] step 2/2 | loss ");
	snprintf(cmd, sizeof cmd, "%s train --nproc 2 --pp 3 --train-data '%s/train_*.bin' --model tiny --steps 1",
	         test_loom_bin(), g_dir);
	st = test_run_cmd(cmd, out, sizeof out, 60);
	CHECK(st != 0);
	/* refused once, by the --nproc launcher, before any rank starts */
	CHECK_STREQ(out, "loom train: --tp 1 --pp 3 on 2 ranks: the world of 2 ranks is not divisible by tp x pp = 3 "
	            "(dp = ranks / (tp x pp)); use --nproc a multiple of 3, or smaller --tp / --pp\n");
	test_rmdir(g_dir);
	return 0;
}
