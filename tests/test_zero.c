/* test_zero.c: the ZeRO strategies (src/parallel/zero.c). Through the CLI (`loom train --nproc N
 * --zero S`) on the `tiny` preset and a small generated dataset: each stage against DDP at 2, 3 and 4
 * ranks, with and without accumulation (per-step losses within 1e-5 relative over 20 steps, the
 * parameters of all ranks compared bit for bit after every step by --check-replicas 1), resume
 * bit-identical per stage, and checkpoints that load at another world size and stage. Through the
 * strategy interface in-process: the owned-range rule, the communication a step issues (counted),
 * the invariant against DDP's strategy on the same ranks, and the errors. */
#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "loom/ckpt.h"
#include "loom/comm.h"
#include "loom/data.h"
#include "loom/ddp.h"
#include "loom/gpt2.h"
#include "loom/train.h"
#include "parallel/strategy.h"
#include "test.h"

enum { VOCAB = 64, STEPS = 20, MAXSTEPS = 64 };

#define FLAGS                                                                                                    \
	"--model tiny --batch-size 2 --seq-len 16 --lr 2e-3 --warmup 2 --min-lr-frac 0.1 --shuffle 1 --seed 7 "      \
	"--peak-flops 1e10"

static int make_data(const char *dir)
{
	return test_make_token_data(dir, VOCAB, 6001);
}

static int read_losses(const char *path, double *loss, char lines[][160], double *val)
{
	return test_read_losses(path, loss, MAXSTEPS, lines, val);
}

#define RUN_OK(cmd, out, timeout)                                                                                \
	do {                                                                                                         \
		int st_ = test_run_cmd(cmd, out, sizeof out, timeout);                                                   \
		CHECK_MSG(st_ == 0, "`%s` exited %d:\n%s", cmd, st_, out);                                               \
	} while (0)

/* DDP and ZeRO stages 1-3 at `world` ranks with accumulation `accum`: the same training losses within
 * 1e-5 relative, and the same validation losses (5 windows, uneven over 3 or 4 ranks: at stage 3 the
 * ranks with fewer run a discarded forward, since every forward gathers); at stages 1 and 2 the
 * parameters of all ranks are compared after every step (--check-replicas 1). */
static int against_ddp(int world, int accum)
{
	char dir[512], cmd[4096], out[16384], want[200];
	double ref[MAXSTEPS] = {0}, got[MAXSTEPS] = {0}, vref[MAXSTEPS] = {0}, vgot[MAXSTEPS] = {0};
	const char *loom = test_loom_bin();
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(make_data(dir));
	for (int stage = 0; stage <= 3; stage++) {
		snprintf(cmd, sizeof cmd, "%s train --nproc %d --train-data '%s/train_*.bin' " FLAGS " --steps %d "
		         "--grad-accum %d --zero %d --check-replicas 1 --log %s/z%d.jsonl --val-data '%s/train_*.bin' "
		         "--eval-every 10 --eval-batches 5", loom, world, dir, STEPS, accum, stage, dir, stage, dir);
		RUN_OK(cmd, out, 120);
		if (stage > 0) {
			snprintf(want, sizeof want, "[rank 0] data parallel: %d ranks x 1 thread; ZeRO stage %d: ", world, stage);
			CHECK_CONTAINS(out, want);
		}
		/* rank 0's figures: P = 842624 (tiny); rank 0 owns [0, floor(P/N) rounded down to 16) */
		double P = 842624, N = world, mib = 1048576.0;
		double own = (double)loom__zero_shard_offset(842624, 1, world), theory[4] = {16 * P, 8 * P + 8 * P / N,
		                                                                            4 * P + 12 * P / N, 16 * P / N};
		snprintf(want, sizeof want, "[rank 0] memory per rank: parameters %.1f MiB, gradients %.1f MiB, optimizer "
		         "%.1f MiB", 4 * (stage == 3 ? own : P) / mib, 4 * (stage >= 2 ? own : P) / mib,
		         8 * (stage >= 1 ? own : P) / mib);
		CHECK_CONTAINS(out, want);
		snprintf(want, sizeof want, "%s = %.1f MiB with P = 842624, N = %d), activations ", stage == 0 ? "16P" :
		         stage == 1 ? "8P + 8P/N" : stage == 2 ? "4P + 12P/N" : "16P/N + the largest gathered unit",
		         theory[stage] / mib, world);
		CHECK_CONTAINS(out, want);
		snprintf(cmd, sizeof cmd, "grep -c '\"mem_model_states_bytes\":[0-9]*,\"peak_rss_bytes\":[1-9]' %s/z%d.jsonl",
		         dir, stage);
		RUN_OK(cmd, out, 10);
		CHECK_EQ(atoi(out), STEPS);
		snprintf(cmd, sizeof cmd, "%s/z%d.jsonl", dir, stage);
		CHECK_EQ(read_losses(cmd, stage ? got : ref, NULL, stage ? vgot : vref), STEPS);
		if (stage > 0) {
			for (int s = 1; s <= STEPS; s++)
				CHECK_NEAR(got[s], ref[s], 1e-5 * ref[s]);
			for (int s = 10; s <= STEPS; s += 10) {
				CHECK(vref[s] > 0);
				CHECK_NEAR(vgot[s], vref[s], 1e-5 * vref[s]);
			}
		}
	}
	CHECK(ref[STEPS] < ref[1] - 0.1); /* it learned: the comparison is not of constants */
	test_rmdir(dir);
	return 0;
}

TEST(zero_vs_ddp_2ranks)
{
	return against_ddp(2, 1);
}

TEST(zero_vs_ddp_2ranks_accum2)
{
	return against_ddp(2, 2);
}

TEST(zero_vs_ddp_3ranks)
{
	return against_ddp(3, 1);
}

TEST(zero_vs_ddp_3ranks_accum2)
{
	return against_ddp(3, 2);
}

TEST(zero_vs_ddp_4ranks_accum2)
{
	return against_ddp(4, 2);
}

/* The owned-range rule: contiguous, in rank order, starting on multiples of 16 floats, covering
 * everything once, as even as that allows. */
TEST(zero_shard_rule)
{
	size_t sizes[] = {0, 5, 16, 100, 1000003, 30000000};
	for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
		for (int n = 1; n <= 8; n++) {
			size_t P = sizes[i];
			CHECK_EQ(loom__zero_shard_offset(P, 0, n), 0);
			CHECK_EQ(loom__zero_shard_offset(P, n, n), P);
			for (int q = 0; q < n; q++) {
				size_t a = loom__zero_shard_offset(P, q, n), b = loom__zero_shard_offset(P, q + 1, n);
				CHECK(a <= b);
				CHECK_EQ(a % 16, 0);
				CHECK(b - a <= P / n + 16);
			}
		}
	CHECK_EQ(loom__zero_shard_offset(100, 1, 3), 32); /* 33 rounded down */
	CHECK_EQ(loom__zero_shard_offset(100, 2, 3), 64); /* 66 rounded down */
	return 0;
}

static const loom_gpt2_config_t tiny = {.n_layer = 2, .n_head = 2, .n_embd = 32, .seq_len = 8, .vocab_size = 50};

static void batch(int rank, int k, int *inp, int *tgt, int n)
{
	for (int i = 0; i < n; i++) {
		inp[i] = (rank * 7 + k * 13 + i * 3) % tiny.vocab_size;
		tgt[i] = (rank * 5 + k * 11 + i * 7 + 1) % tiny.vocab_size;
	}
}

static unsigned long long collectives(loom_comm_t *c)
{
	loom_comm_stats_t st;
	loom_comm_stats(c, &st);
	return st.collectives;
}

/* The whole parameters gathered from the shards (NULL when the all-gather fails). */
static float *gathered(loom_comm_t *c, loom_strategy_t *s, float *full, const size_t *counts)
{
	return loom_allgatherv(c, s->own_params, s->own_count, full, counts, LOOM_FLOAT32) == LOOM_OK ? full : NULL;
}

/* ZeRO stage `stage` beside DDP on the same ranks, driven as the trainer drives them (accumulation 2):
 * the collectives of each phase counted (a unit is one bucket: L + 2 of them); the averaged gradient
 * of each owned slice is DDP's up to the rounding of another summation order; and zero.c's invariant
 * exactly: given that gradient, the gathered parameters after each step are bit-identical to those of
 * one optimizer over the whole buffer (the local strategy, fed the gathered gradient and the same
 * clipping scale), on every rank, and the owned moments are that optimizer's slice. */
static int invariant_rank(int rank, int nranks, void *arg)
{
	enum { NSTEPS = 3, ACCUM = 2 };
	int stage = *(int *)arg, nunits = tiny.n_layer + 2;
	loom_comm_t *comm, *comm2;
	loom_gpt2_t *m, *ref, *one;
	loom_strategy_t *s, *d, *l;
	loom_strategy_stats_t st;
	int inp[16], tgt[16];
	float loss;
	size_t n = loom_gpt2_num_params(&tiny), counts[8];
	float *g = malloc(n * sizeof *g), *full = malloc(n * sizeof *full), *p;
	CHECK(g != NULL && full != NULL);
	CHECK_OK(loom_comm_init(&comm));
	CHECK_OK(loom_comm_split(comm, 0, rank, &comm2)); /* DDP's own communicator: separate counters */
	loom_gpt2_opts_t mo = {.B = 2, .T = 8, .no_own_grads = stage >= 2};
	CHECK_OK(loom_gpt2_create_opts(&m, &tiny, &mo));
	CHECK_OK(loom_gpt2_create(&ref, &tiny, 2, 8));
	CHECK_OK(loom_gpt2_create(&one, &tiny, 2, 8));
	loom_gpt2_init(m, 21 + (uint64_t)rank); /* different on every rank: sync_params makes them rank 0's */
	loom_gpt2_init(ref, 21), loom_gpt2_init(one, 21);
	loom_strategy_config_t c = {.name = "ddp", .zero = stage, .model = loom_gpt2_model(m), .dp = comm, .writer = rank == 0,
	                            .adamw = loom_adamw_defaults(), .bucket_mb = 0.002};
	CHECK_OK(loom__strategy_create(&s, &c));
	CHECK_STREQ(s->ops->name, stage == 1 ? "zero1" : stage == 2 ? "zero2" : "zero3");
	CHECK(stage == 3 ? s->params == NULL : s->params == loom_gpt2_params(m));
	CHECK_EQ(s->mem.params, 4 * (stage == 3 ? s->own_count : n));
	CHECK_EQ(s->own_offset, loom__zero_shard_offset(n, rank, nranks));
	CHECK_EQ(s->own_offset + s->own_count, loom__zero_shard_offset(n, rank + 1, nranks));
	CHECK_EQ(s->opt.n, s->own_count);
	CHECK_EQ(s->mem.optim, 8 * s->own_count);
	CHECK_EQ(s->mem.grads, 4 * (stage == 1 ? n : s->own_count));
	CHECK(stage == 1 ? s->grads == loom_gpt2_grads(m) : s->grads == NULL);
	for (int q = 0; q < nranks; q++)
		counts[q] = loom__zero_shard_offset(n, q + 1, nranks) - loom__zero_shard_offset(n, q, nranks);
	c.zero = 0, c.model = loom_gpt2_model(ref), c.dp = comm2;
	CHECK_OK(loom__strategy_create(&d, &c));
	CHECK_STREQ(d->ops->name, "ddp");
	c.model = loom_gpt2_model(one), c.dp = NULL;
	CHECK_OK(loom__strategy_create(&l, &c));
	CHECK_STREQ(l->ops->name, "local");
	CHECK_OK(s->ops->sync_params(s));
	/* the whole parameters: replicated, or at stage 3 gathered from the shards */
#define PARAMS() (stage < 3 ? s->params : gathered(comm2, s, full, counts))
	p = PARAMS();
	CHECK(p != NULL);
	CHECK_EQ(memcmp(p, l->params, n * sizeof(float)), 0);
	for (int step = 0; step < NSTEPS; step++) {
		loom_gpt2_zero_grad(m);
		loom_gpt2_zero_grad(ref);
		CHECK((p = PARAMS()) != NULL);
		memcpy(d->params, p, n * sizeof(float)); /* DDP's gradient at ZeRO's point */
		for (int j = 0; j < ACCUM; j++) {
			batch(rank, step * ACCUM + j, inp, tgt, 16);
			unsigned long long c0 = collectives(comm), g0 = 0, g1 = 0;
			if (stage == 3)
				loom__zero_gathered_peak(s, &g0);
			s->ops->set_sync(s, j == ACCUM - 1);
			CHECK_OK(loom_gpt2_forward_backward(m, inp, tgt, 2, 8, 1.0f / ACCUM, &loss));
			CHECK_OK(s->ops->finish_grads(s, &st));
			if (stage == 3) {
				/* after the step the embedding, each block and the head are gathered once for the
				 * forward and the blocks the two buffers no longer hold again for backward; the
				 * next micro-step reuses the embedding and the two blocks still held */
				int L = tiny.n_layer;
				loom__zero_gathered_peak(s, &g1);
				CHECK_EQ(g1 - g0, (unsigned long long)(j == 0 ? 2 * L + 1 : 2 * L - 2));
			}
			/* ZeRO-1: one reduce-scatter per unit on the last micro-step, none before; ZeRO-2, 3: every one */
			CHECK_EQ(collectives(comm) - c0 - (g1 - g0), stage == 1 && j < ACCUM - 1 ? 0u : (unsigned)nunits);
			d->ops->set_sync(d, j == ACCUM - 1);
			CHECK_OK(loom_gpt2_forward_backward(ref, inp, tgt, 2, 8, 1.0f / ACCUM, &loss));
			CHECK_OK(d->ops->finish_grads(d, &st));
		}
		for (size_t i = 0; i < s->own_count; i++) /* an average, as DDP's */
			CHECK_NEAR(s->own_grads[i], d->grads[s->own_offset + i], 1e-7 + 1e-5 * fabsf(d->grads[s->own_offset + i]));
		double ns, nl;
		unsigned long long c0 = collectives(comm);
		CHECK_OK(s->ops->grad_norm(s, &ns));
		float scale = loom_clip_scale(ns, 0.5);
		/* the reference: one optimizer over everything, fed the gathered averaged gradient */
		CHECK_OK(loom_allgatherv(comm2, s->own_grads, s->own_count, g, counts, LOOM_FLOAT32));
		CHECK_OK(s->ops->optim_step(s, 1e-2f, scale));
		/* the replica check waits for the step's all-gathers, which the next forward would wait for
		 * unit by unit, and adds one all-gather of checksums */
		CHECK_OK(s->ops->check_replicas(s)); /* the gathered parameters: the same bits on every rank */
		/* the norm's all-reduce, and one all-gather per unit (none at stage 3: gathers come with use) */
		CHECK_EQ(collectives(comm) - c0, 1u + (stage < 3 ? (unsigned)nunits + 1 : 0u));
		memcpy(l->grads, g, n * sizeof(float));
		CHECK_OK(l->ops->grad_norm(l, &nl));
		CHECK_NEAR(ns, nl, 1e-12 + 1e-9 * nl);
		CHECK_OK(l->ops->optim_step(l, 1e-2f, scale));
		p = PARAMS();
		CHECK(p != NULL);
		CHECK_EQ(memcmp(p, l->params, n * sizeof(float)), 0);
		CHECK_EQ(memcmp(s->opt.m, l->opt.m + s->own_offset, s->own_count * sizeof(float)), 0);
		CHECK_EQ(memcmp(s->opt.v, l->opt.v + s->own_offset, s->own_count * sizeof(float)), 0);
		CHECK_EQ(s->opt.step, step + 1);
		uint64_t mine = loom_checksum_f32(p, n), all[8];
		CHECK_OK(loom_allgather(comm2, &mine, all, 1, LOOM_INT64));
		for (int r = 0; r < nranks; r++)
			CHECK_EQ(all[r], mine);
	}
	if (stage == 3) { /* a block's gather prefetched while the one before runs: two at once, never more */
		CHECK_EQ(loom__zero_gathered_peak(s, NULL), 2);
	} else {
		if (rank == 1)
			s->params[5] += 1.0f;
		CHECK_ERR(s->ops->check_replicas(s), LOOM_EMISMATCH);
		CHECK_CONTAINS(loom_errmsg(), "zero: replica check: parameters of rank(s) 1 differ from rank 0's");
	}
	loom__strategy_destroy(l);
	loom__strategy_destroy(d);
	loom__strategy_destroy(s);
	loom_gpt2_destroy(one);
	loom_gpt2_destroy(ref);
	loom_gpt2_destroy(m);
	loom_comm_destroy(comm2);
	loom_comm_destroy(comm);
	free(g), free(full);
	return 0;
#undef PARAMS
}

TEST(zero1_invariant_3ranks)
{
	int stage = 1;
	return test_spawn(3, invariant_rank, &stage, 60, NULL);
}

TEST(zero2_invariant_3ranks)
{
	int stage = 2;
	return test_spawn(3, invariant_rank, &stage, 60, NULL);
}

TEST(zero3_invariant_3ranks)
{
	int stage = 3;
	return test_spawn(3, invariant_rank, &stage, 60, NULL);
}

TEST(zero3_invariant_2ranks)
{
	int stage = 3;
	return test_spawn(2, invariant_rank, &stage, 60, NULL);
}

TEST(zero2_invariant_2ranks)
{
	int stage = 2;
	return test_spawn(2, invariant_rank, &stage, 60, NULL);
}

/* Without a communicator of several ranks a ZeRO stage is a clear error; the table lists the stages. */
TEST(zero_selection)
{
	loom_gpt2_t *m;
	loom_strategy_t *s;
	char text[2048];
	CHECK_OK(loom_gpt2_create(&m, &tiny, 1, 8));
	loom_strategy_config_t c = {.name = "ddp", .zero = 1, .model = loom_gpt2_model(m), .dp = NULL, .writer = 1,
	                            .adamw = loom_adamw_defaults(), .bucket_mb = 25};
	CHECK_ERR(loom__strategy_create(&s, &c), LOOM_ENOTSUP);
	CHECK(s == NULL);
	CHECK_CONTAINS(loom_errmsg(), "ZeRO stage 1 shards the training state over the data-parallel ranks and needs "
	               "more than one");
	c.zero = 9;
	CHECK_ERR(loom__strategy_create(&s, &c), LOOM_ENOTSUP);
	loom__strategy_describe(text, sizeof text);
	CHECK_CONTAINS(text, "ddp zero=1 ranks>1 tp>=1: zero1: ZeRO-1: ");
	CHECK_CONTAINS(text, "ddp zero=2 ranks>1 tp>=1: zero2: ZeRO-2: ");
	/* MuonAdamW over a pipeline stage's ZeRO shards: not yet, said at once */
	unsigned char deferred[1] = {1};
	c.zero = 2, c.deferred = deferred, c.optimizer = LOOM_OPTIMIZER_MUON;
	CHECK_ERR(loom__strategy_create(&s, &c), LOOM_ENOTSUP);
	CHECK_CONTAINS(loom_errmsg(), "trainer: --optimizer muon with --zero 2 and --pp: MuonAdamW's matrices are not "
	               "sharded over a pipeline stage's data-parallel ranks yet (use --zero 0 with --pp)");
	loom_gpt2_destroy(m);
	return 0;
}

/* Resume at the same world size and stage continues bit-identically (the log lines and the final
 * checkpoint's files are the same bytes); the checkpoint holds one moment shard per rank, the index
 * and the whole model, which `loom info` reads. */
static int resume_same(int world, int stage)
{
	char dir[512], cmd[4096], out[16384], path[1024];
	static char full[MAXSTEPS][160], resumed[MAXSTEPS][160];
	double loss[MAXSTEPS];
	const char *loom = test_loom_bin();
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(make_data(dir));
	snprintf(cmd, sizeof cmd, "%s train --nproc %d --zero %d --train-data '%s/train_*.bin' " FLAGS " --steps %d "
	         "--grad-accum 2 --save-dir %s/ck --save-every 10 --log %s/full.jsonl", loom, world, stage, dir, STEPS, dir,
	         dir);
	RUN_OK(cmd, out, 120);
	snprintf(cmd, sizeof cmd, "mv %s/ck/step_00000020 %s/full_final && cp %s/full.jsonl %s/r.jsonl", dir, dir, dir,
	         dir);
	RUN_OK(cmd, out, 10);
	snprintf(path, sizeof path, "%s/full.jsonl", dir);
	CHECK_EQ(read_losses(path, loss, full, NULL), STEPS);
	for (int r = 0; r < world; r++) {
		snprintf(cmd, sizeof cmd, "test -s %s/ck/step_00000010/optim.rank%d-of-%d.safetensors && grep -q 'optim.rank%d-of"
		         "-%d.safetensors' %s/ck/step_00000010/MANIFEST", dir, r, world, r, world, dir);
		RUN_OK(cmd, out, 10);
	}
	snprintf(cmd, sizeof cmd, "test ! -e %s/ck/step_00000010/optim.safetensors && %s info %s/ck/step_00000010/model."
	         "safetensors && cat %s/ck/step_00000010/zero.json", dir, loom, dir, dir);
	RUN_OK(cmd, out, 10);
	CHECK_CONTAINS(out, "\"format\": \"loom-zero\"");
	snprintf(cmd, sizeof cmd, "%s train --nproc %d --zero %d --train-data '%s/train_*.bin' " FLAGS " --steps %d "
	         "--grad-accum 2 --save-dir %s/ck --save-every 10 --log %s/r.jsonl --resume", loom, world, stage, dir, STEPS,
	         dir, dir);
	RUN_OK(cmd, out, 120);
	CHECK_CONTAINS(out, "at step 10");
	CHECK_MSG(!strstr(out, "step 10/20"), "resumed run redid step 10:\n%s", out);
	snprintf(path, sizeof path, "%s/r.jsonl", dir);
	CHECK_EQ(read_losses(path, loss, resumed, NULL), STEPS);
	for (int s = 1; s <= STEPS; s++)
		CHECK_STREQ(resumed[s], full[s]);
	snprintf(cmd, sizeof cmd, "cd %s && for f in full_final/*; do cmp $f ck/step_00000020/${f#full_final/} || exit 1; "
	         "done", dir);
	RUN_OK(cmd, out, 10);
	test_rmdir(dir);
	return 0;
}

TEST(zero1_resume_bit_identical_3ranks)
{
	return resume_same(3, 1);
}

TEST(zero2_resume_bit_identical_2ranks)
{
	return resume_same(2, 2);
}

TEST(zero3_resume_bit_identical_3ranks)
{
	return resume_same(3, 3);
}

/* Resharding: checkpoints of step 10 written at one world size and stage continue at others, at the
 * same tokens per step (--total-batch-size 384 = 2 x 16 x 12), within 1e-5 of the uninterrupted run:
 * ZeRO-3 on 2 ranks to ZeRO-1 on 4 ranks, to one process, and to ZeRO-2 on 3; DDP on 2 ranks to
 * ZeRO-3 on 4. A shard missing from a checkpoint (without its MANIFEST check) is named. */
TEST(zero_resharding)
{
	char dir[512], cmd[8192], out[16384], path[1024];
	double ref[MAXSTEPS] = {0}, got[MAXSTEPS] = {0};
	const char *loom = test_loom_bin();
	static const struct {
		const char *from;
		int world, stage;
	} to[] = {{"z3", 4, 1}, {"z3", 1, 0}, {"z3", 3, 2}, {"ddp", 4, 3}};
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(make_data(dir));
	snprintf(cmd, sizeof cmd, "%s train --nproc 2 --zero 3 --train-data '%s/train_*.bin' " FLAGS " --steps %d "
	         "--total-batch-size 384 --save-dir %s/z3 --save-every 10 --log %s/z3.jsonl && %s train --nproc 2 "
	         "--train-data '%s/train_*.bin' " FLAGS " --steps %d --total-batch-size 384 --save-dir %s/ddp --save-every "
	         "10", loom, dir, STEPS, dir, dir, loom, dir, STEPS, dir);
	RUN_OK(cmd, out, 120);
	snprintf(path, sizeof path, "%s/z3.jsonl", dir);
	CHECK_EQ(read_losses(path, ref, NULL, NULL), STEPS);
	for (size_t k = 0; k < sizeof to / sizeof to[0]; k++) {
		snprintf(cmd, sizeof cmd, "rm -rf %s/t && mkdir %s/t && cp -r %s/%s/step_00000010 %s/t/ && head -11 %s/z3.jsonl "
		         "> %s/t.jsonl && %s train --nproc %d --zero %d --train-data '%s/train_*.bin' " FLAGS " --steps %d "
		         "--total-batch-size 384 --save-dir %s/t --log %s/t.jsonl --resume", dir, dir, dir, to[k].from, dir, dir,
		         dir, loom, to[k].world, to[k].stage, dir, STEPS, dir, dir);
		RUN_OK(cmd, out, 120);
		CHECK_CONTAINS(out, "at step 10");
		snprintf(path, sizeof path, "%s/t.jsonl", dir);
		CHECK_EQ(read_losses(path, got, NULL, NULL), STEPS);
		for (int s = 11; s <= STEPS; s++)
			CHECK_NEAR(got[s], ref[s], 1e-5 * ref[s]);
	}
	/* a missing shard: the load names it */
	loom_gpt2_config_t mc;
	loom_gpt2_t *m;
	loom_strategy_t *s;
	CHECK_OK(loom_gpt2_preset("tiny", &mc));
	CHECK_OK(loom_gpt2_create(&m, &mc, 1, 8));
	loom_strategy_config_t c = {.name = "ddp", .model = loom_gpt2_model(m), .writer = 1, .adamw = loom_adamw_defaults(), .bucket_mb = 1};
	CHECK_OK(loom__strategy_create(&s, &c));
	snprintf(path, sizeof path, "%s/z3/step_00000010", dir);
	CHECK_OK(s->ops->load(s, path, 10)); /* one process reads the two shards */
	snprintf(cmd, sizeof cmd, "rm %s/optim.rank1-of-2.safetensors", path);
	RUN_OK(cmd, out, 10);
	CHECK_ERR(s->ops->load(s, path, 10), LOOM_ENOENT);
	CHECK_CONTAINS(loom_errmsg(), "1 of the 2 optimizer shard files listed in zero.json are missing: "
	               "optim.rank1-of-2.safetensors");
	loom__strategy_destroy(s);
	loom_gpt2_destroy(m);
	test_rmdir(dir);
	return 0;
}

/* Memory accounting on the `small` preset at 2 ranks: each stage's model states against its formula
 * (within the 16-float rounding of the shards: 64 N bytes), the communication buffers, and the JSONL
 * fields. */
static int memory_rank(int rank, int nranks, void *arg)
{
	const char *dir = arg;
	(void)rank;
	char glob[600];
	loom_comm_t *comm;
	loom_gpt2_config_t mc;
	CHECK_OK(loom_comm_init(&comm));
	CHECK_OK(loom_gpt2_preset("small", &mc));
	double P = (double)loom_gpt2_num_params(&mc), N = nranks;
	const double want[4] = {16 * P, 8 * P + 8 * P / N, 4 * P + 12 * P / N, 16 * P / N};
	snprintf(glob, sizeof glob, "%s/train_*.bin", dir);
	for (int stage = 0; stage <= 3; stage++) {
		loom_gpt2_t *m;
		loom_trainer_t *tr;
		loom_train_memory_t mem;
		loom_step_metrics_t sm;
		loom_train_config_t c = loom_train_defaults();
		c.train_data = glob, c.B = 1, c.T = 8, c.comm = comm, c.zero = stage;
		c.lr = (loom_lr_schedule_t){.peak_lr = 1e-3, .total_steps = 1, .kind = LOOM_SCHED_CONSTANT};
		loom_gpt2_opts_t mo = {.B = 1, .T = 8, .no_own_grads = stage >= 2};
		CHECK_OK(loom_gpt2_create_opts(&m, &mc, &mo));
		loom_gpt2_init(m, 5);
		CHECK_OK(loom_trainer_create(&tr, &c, loom_gpt2_model(m)));
		CHECK_OK(loom_trainer_memory(tr, &mem));
		CHECK_EQ(mem.zero, stage);
		CHECK_EQ(mem.dp, nranks);
		CHECK_EQ(mem.model_states, mem.params + mem.grads + mem.optim);
		CHECK_NEAR((double)mem.theory, want[stage], 1.0);
		CHECK_NEAR((double)mem.model_states, want[stage], 64.0 * N);
		CHECK(mem.activations > 0);
		if (stage == 3) { /* the embedding (wte + wpe) is small's largest unit */
			CHECK_EQ(mem.largest_unit, 4u * (size_t)(mc.vocab_size + mc.seq_len) * (size_t)mc.n_embd);
			CHECK(mem.comm >= 2 * mem.largest_unit); /* its gathered parameters and its gradient staging */
		} else {
			CHECK_EQ(mem.largest_unit, 0);
			CHECK_EQ(mem.comm == 0, stage <= 1);
		}
		CHECK_OK(loom_trainer_step(tr, &sm));
		CHECK(loom_peak_rss_bytes() > mem.model_states);
		loom_trainer_destroy(tr);
		loom_gpt2_destroy(m);
	}
	loom_comm_destroy(comm);
	return 0;
}

TEST(zero_memory_small_2ranks)
{
	char dir[512];
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(make_data(dir));
	int rc = test_spawn(2, memory_rank, dir, 120, NULL);
	test_rmdir(dir);
	return rc;
}

/* The process of `parent` whose environment holds `var` (e.g. "RANK=1"), or -1. */
static pid_t child_with_env(pid_t parent, const char *var)
{
	DIR *d = opendir("/proc");
	struct dirent *e;
	pid_t found = -1;
	if (!d)
		return -1;
	while (found < 0 && (e = readdir(d))) {
		char path[300], buf[8192];
		int ppid = -1;
		pid_t pid = (pid_t)atoi(e->d_name);
		FILE *f;
		size_t n;
		if (pid <= 0)
			continue;
		snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
		if (!(f = fopen(path, "r")))
			continue;
		n = fread(buf, 1, sizeof buf - 1, f);
		fclose(f);
		buf[n] = 0;
		char *rp = strrchr(buf, ')');
		if (!rp || sscanf(rp + 1, " %*c %d", &ppid) != 1 || ppid != parent)
			continue;
		snprintf(path, sizeof path, "/proc/%d/environ", (int)pid);
		if (!(f = fopen(path, "r")))
			continue;
		n = fread(buf, 1, sizeof buf - 1, f);
		fclose(f);
		for (size_t i = 0; i < n; i += strlen(buf + i) + 1)
			if (strcmp(buf + i, var) == 0)
				found = pid;
	}
	closedir(d);
	return found;
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* kill -9 of one rank (victim, e.g. "RANK=1") of a job of nproc ranks with `mesh` flags that saves a
 * checkpoint every step (so the kill often lands in a save, and otherwise in a step): `loom run`
 * exits within 5 s naming the dead rank, and the newest complete checkpoint loads and training
 * resumes from it. */
static int killed_during_saves(int nproc, const char *mesh, const char *victim_env)
{
	char dir[512], cmd[4096], out[16384], ck[700], latest[1200];
	const char *loom = test_loom_bin();
	struct stat sb;
	int status = 0;
	int64_t last;
	pid_t job, victim = -1;
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(make_data(dir));
	snprintf(cmd, sizeof cmd, "exec %s train --nproc %d %s --train-data '%s/train_*.bin' " FLAGS
	         " --steps 100000 --schedule constant --save-dir %s/ck --save-every 1 --keep-checkpoints 3 > %s/out.txt "
	         "2>&1", loom, nproc, mesh, dir, dir, dir);
	fflush(NULL);
	job = fork();
	CHECK(job >= 0);
	if (job == 0) {
		execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
		_exit(127);
	}
	snprintf(ck, sizeof ck, "%s/ck/step_00000005", dir);
	double t0 = now_s();
	while (now_s() - t0 < 60 && (stat(ck, &sb) != 0 || (victim = child_with_env(job, victim_env)) < 0) &&
	       waitpid(job, &status, WNOHANG) == 0)
		usleep(2000);
	if (victim < 0) {
		kill(job, SIGKILL);
		waitpid(job, &status, 0);
		TEST_FAIL_("no checkpoint of step 5 or no %s within 60 s (status %d)", victim_env, status);
	}
	usleep(3000); /* into the next step or save */
	CHECK_EQ(kill(victim, SIGKILL), 0);
	double tk = now_s();
	while (waitpid(job, &status, WNOHANG) == 0 && now_s() - tk < 30)
		usleep(2000);
	double waited = now_s() - tk;
	if (waited >= 30) {
		kill(job, SIGKILL);
		waitpid(job, &status, 0);
	}
	snprintf(cmd, sizeof cmd, "cat %s/out.txt", dir);
	RUN_OK(cmd, out, 10);
	CHECK_MSG(waited < 5.0, "loom run took %.2f s to exit after %s was killed:\n%s", waited, victim_env, out);
	CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) != 0, "status %d:\n%s", status, out);
	CHECK_CONTAINS(out, ") was killed by signal 9 (SIGKILL)");
	snprintf(ck, sizeof ck, "%s/ck", dir);
	CHECK_OK(loom_ckpt_latest(ck, latest, sizeof latest, &last));
	CHECK(last >= 5);
	snprintf(cmd, sizeof cmd, "%s train --nproc %d %s --train-data '%s/train_*.bin' " FLAGS
	         " --steps %lld --schedule constant --save-dir %s/ck --resume", loom, nproc, mesh, dir, (long long)last + 2,
	         dir);
	RUN_OK(cmd, out, 60);
	char want[96];
	snprintf(want, sizeof want, "at step %lld", (long long)last);
	CHECK_CONTAINS(out, want);
	snprintf(want, sizeof want, "[rank 0] step %lld/%lld | loss ", (long long)last + 2, (long long)last + 2);
	CHECK_CONTAINS(out, want);
	test_rmdir(dir);
	return 0;
}

TEST(zero3_rank_killed_during_saves)
{
	return killed_during_saves(2, "--zero 3", "RANK=1");
}

/* The streamed checkpoints of a pipeline (stage 1 sends its tensors to stage 0's writer) and of
 * tp 2 x pp 2 (the last stage's tp rank 1 sends through the first stage's tp rank 1 to the writer). */
TEST(pp_rank_killed_during_saves)
{
	int rc = killed_during_saves(2, "--pp 2 --micro-batches 2", "RANK=1");
	return rc ? rc : killed_during_saves(4, "--tp 2 --pp 2 --micro-batches 2", "RANK=3");
}
