/* test_act_ckpt.c: activation checkpointing (loom_gpt2_opts_t act_ckpt, `loom train
 * --activation-checkpointing`): `blocks` and `selective` give losses and gradients bit-identical to
 * `none` in fp32 (by unit on several arenas, through the trainer, and under 2-rank DDP, ZeRO 1 and 3,
 * a 2-stage pipeline and 2-way tensor parallel through the CLI), recompute once per block backward,
 * and keep what their layout says: for the `small` preset `blocks` needs less than 1/L of none's
 * activations plus one block (byte counts of the layout, and of a model really created).
 *
 * The tiny preset (L4 H4 C128 V257) at T = 72 crosses the attention's 64-row blocks. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/gpt2.h"
#include "loom/train.h"
#include "model/kernels.h"
#include "test.h"

static const loom_act_ckpt_t modes[3] = {LOOM_ACT_CKPT_NONE, LOOM_ACT_CKPT_BLOCKS, LOOM_ACT_CKPT_SELECTIVE};

static void tokens(int *t, int n, int vocab, uint32_t seed)
{
	uint32_t x = seed;
	for (int i = 0; i < n; i++) {
		x = x * 1664525u + 1013904223u;
		t[i] = (int)((x >> 8) % (uint32_t)vocab);
	}
}

TEST(act_ckpt_parse_and_errors)
{
	loom_act_ckpt_t m = LOOM_ACT_CKPT_NONE;
	loom_gpt2_config_t cfg;
	loom_gpt2_t *model = NULL;
	CHECK_OK(loom_act_ckpt_parse("blocks", &m));
	CHECK_EQ(m, LOOM_ACT_CKPT_BLOCKS);
	CHECK_OK(loom_act_ckpt_parse("selective", &m));
	CHECK_EQ(m, LOOM_ACT_CKPT_SELECTIVE);
	CHECK_OK(loom_act_ckpt_parse("none", &m));
	CHECK_EQ(m, LOOM_ACT_CKPT_NONE);
	CHECK_ERR(loom_act_ckpt_parse("full", &m), LOOM_EINVAL);
	CHECK_STREQ(loom_errmsg(), "activation checkpointing 'full' is not one of none, blocks, selective");
	CHECK_STREQ(loom_act_ckpt_name(LOOM_ACT_CKPT_SELECTIVE), "selective");
	CHECK_STREQ(loom_act_ckpt_name((loom_act_ckpt_t)7), "?");
	CHECK_OK(loom_gpt2_preset("tiny", &cfg));
	loom_gpt2_opts_t o = {.B = 1, .T = 8, .act_ckpt = (loom_act_ckpt_t)3};
	CHECK_ERR(loom_gpt2_create_opts(&model, &cfg, &o), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "activation checkpointing mode 3 (expected 0 none, 1 blocks, 2 selective)");
	CHECK(model == NULL);
	return 0;
}

/* What selective recomputation refills (the attention's output and lse) is the forward's, bit for bit,
 * whatever the thread count (several query blocks, odd sizes). */
TEST(act_ckpt_attention_recompute_bit_identical)
{
	int B = 2, T = 70, C = 24, NH = 3, saved = loom_num_threads();
	size_t nqkv = (size_t)B * T * 3 * C, ny = (size_t)B * T * C, nl = (size_t)B * NH * T;
	float *qkv = malloc(nqkv * sizeof(float)), *out = malloc(ny * sizeof(float)), *out2 = malloc(ny * sizeof(float));
	float *lse = malloc(nl * sizeof(float)), *lse2 = malloc(nl * sizeof(float));
	CHECK(qkv && out && out2 && lse && lse2);
	uint32_t x = 7;
	for (size_t i = 0; i < nqkv; i++) {
		x = x * 1664525u + 1013904223u;
		qkv[i] = (float)((double)(x >> 8) / (1 << 24) * 4.0 - 2.0);
	}
	loom_set_num_threads(1);
	loom__attention_forward(out, lse, qkv, B, T, C, NH);
	loom_set_num_threads(2);
	memset(out2, 0xff, ny * sizeof(float)); /* NaNs: every entry must be written */
	memset(lse2, 0xff, nl * sizeof(float));
	loom__attention_forward(out2, lse2, qkv, B, T, C, NH);
	loom_set_num_threads(saved);
	CHECK(memcmp(out, out2, ny * sizeof(float)) == 0);
	CHECK(memcmp(lse, lse2, nl * sizeof(float)) == 0);
	free(qkv), free(out), free(out2), free(lse), free(lse2);
	return 0;
}

/* Embedding and blocks forward in arena mb. */
static int fwd(loom_gpt2_t *m, int mb, const int *in, int B, int T)
{
	int rc = loom_gpt2_embed_forward(m, mb, in, B, T);
	for (int l = 0; rc == LOOM_OK && l < loom_gpt2_config(m)->n_layer; l++)
		rc = loom_gpt2_block_forward(m, mb, l, B, T);
	return rc;
}

/* Head forward+backward, blocks backward, embedding backward in arena mb. */
static int bwd(loom_gpt2_t *m, int mb, const int *in, const int *tg, int B, int T, float *loss)
{
	int rc = loom_gpt2_head_forward_backward(m, mb, tg, B, T, 0.5f, loss);
	for (int l = loom_gpt2_config(m)->n_layer - 1; rc == LOOM_OK && l >= 0; l--)
		rc = loom_gpt2_block_backward(m, mb, l, B, T);
	return rc == LOOM_OK ? loom_gpt2_embed_backward(m, mb, in, B, T) : rc;
}

/* Fused micro-steps, then two arenas interleaved (F0 F1 B0 B1: the second forward overwrites the
 * shared recompute scratch between the first's forward and backward), then a forward without targets:
 * every loss, gradient and logit equals the none model's bit for bit; one recompute per block
 * backward. */
TEST(act_ckpt_units_bit_identical)
{
	enum { B = 2, T = 72 };
	loom_gpt2_config_t cfg;
	loom_gpt2_t *m[3] = {NULL, NULL, NULL};
	static int in[2 * B * T], tg[2 * B * T];
	float loss[3][4];
	CHECK_OK(loom_gpt2_preset("tiny", &cfg));
	int L = cfg.n_layer;
	size_t n = loom_gpt2_num_params(&cfg);
	tokens(in, 2 * B * T, cfg.vocab_size, 1);
	tokens(tg, 2 * B * T, cfg.vocab_size, 2);
	for (int k = 0; k < 3; k++) {
		loom_gpt2_opts_t o = {.B = B, .T = T, .arenas = 2, .act_ckpt = modes[k]};
		CHECK_OK(loom_gpt2_create_opts(&m[k], &cfg, &o));
		CHECK_EQ(loom_gpt2_act_ckpt(m[k]), modes[k]);
		loom_gpt2_init(m[k], 3);
		loom_gpt2_zero_grad(m[k]);
		CHECK_OK(loom_gpt2_forward_backward(m[k], in, tg, B, T, 0.5f, &loss[k][0]));
		CHECK_OK(loom_gpt2_forward_backward(m[k], in + B * T, tg + B * T, B, T - 5, 0.5f, &loss[k][1]));
		CHECK_EQ(loom_gpt2_recomputes(m[k]), k == 0 ? 0 : 2 * L);
		if (k > 0) {
			CHECK_FEQ(loss[k][0], loss[0][0]);
			CHECK_FEQ(loss[k][1], loss[0][1]);
			CHECK_MSG(memcmp(loom_gpt2_grads(m[k]), loom_gpt2_grads(m[0]), n * sizeof(float)) == 0,
			          "%s: gradients differ from none's after two fused micro-steps", loom_act_ckpt_name(modes[k]));
		}
	}
	CHECK(loss[0][0] != loss[0][1]); /* two different micro-batches */
	for (int k = 0; k < 3; k++) {
		loom_gpt2_zero_grad(m[k]);
		CHECK_OK(fwd(m[k], 0, in, B, T));
		CHECK_OK(fwd(m[k], 1, in + B * T, B, T));
		CHECK_OK(bwd(m[k], 0, in, tg, B, T, &loss[k][2]));
		CHECK_OK(bwd(m[k], 1, in + B * T, tg + B * T, B, T, &loss[k][3]));
		CHECK_EQ(loom_gpt2_recomputes(m[k]), k == 0 ? 0 : 4 * L);
		if (k > 0) {
			CHECK_FEQ(loss[k][2], loss[0][2]);
			CHECK_FEQ(loss[k][3], loss[0][3]);
			CHECK_MSG(memcmp(loom_gpt2_grads(m[k]), loom_gpt2_grads(m[0]), n * sizeof(float)) == 0,
			          "%s: gradients differ from none's with two arenas interleaved", loom_act_ckpt_name(modes[k]));
		}
	}
	CHECK_FEQ(loss[0][2], loss[0][0]); /* the interleaved micro-batch is the fused one */
	for (int k = 0; k < 3; k++) {
		CHECK_OK(loom_gpt2_forward(m[k], in, NULL, B, T, NULL));
		CHECK(memcmp(loom_gpt2_logits(m[k]), loom_gpt2_logits(m[0]), B * (size_t)cfg.vocab_size * sizeof(float)) == 0);
		CHECK_EQ(loom_gpt2_recomputes(m[k]), k == 0 ? 0 : 4 * L); /* a forward recomputes nothing */
	}
	for (int k = 0; k < 3; k++)
		loom_gpt2_destroy(m[k]);
	return 0;
}

/* The layout of the `small` preset at the benchmark's B=4, T=256 (every buffer a multiple of 64 bytes,
 * so the byte counts are exact): a none layer is 16 BTC + 4 BT + B NH T floats (the last: the attention
 * rows' lse); blocks keeps BTC per layer and one block's scratch, below 1/L of none's activations plus
 * one block; selective keeps all but the attention's output and lse, whose one layer's worth is the
 * scratch. A blocks model of `small` (B=1, without
 * parameter buffers) really allocates what the layout says. */
TEST(act_ckpt_memory_small)
{
	loom_gpt2_config_t cfg;
	loom_gpt2_act_bytes_t a[3];
	CHECK_OK(loom_gpt2_preset("small", &cfg));
	size_t B = 4, T = 256, C = (size_t)cfg.n_embd, NH = (size_t)cfg.n_head, L = (size_t)cfg.n_layer;
	/* bytes: A the attention rows' lse (B,NH,T), S what selective recomputes (lse and the attention's output) */
	size_t BTC = 4 * B * T * C, BT = 4 * B * T, A = 4 * B * NH * T, F = 16 * BTC + 4 * BT + A, S = A + BTC;
	size_t head = BTC + 3 * BT; /* ln_f's output and statistics, the losses */
	for (int k = 0; k < 3; k++) {
		loom_gpt2_opts_t o = {.B = (int)B, .T = (int)T, .act_ckpt = modes[k]};
		CHECK_OK(loom_gpt2_act_bytes(&cfg, &o, &a[k]));
		CHECK_EQ(a[k].total, a[k].kept + a[k].recompute + a[k].head + a[k].backward);
		CHECK_EQ(a[k].head, a[0].head);
		CHECK_EQ(a[k].backward, a[0].backward);
	}
	CHECK_EQ(a[0].per_layer, F);
	CHECK_EQ(a[0].kept, L * F + BTC + head);
	CHECK_EQ(a[0].recompute, 0);
	CHECK_EQ(a[1].per_layer, BTC);
	CHECK_EQ(a[1].kept, L * BTC + BTC + head);
	CHECK_EQ(a[1].recompute, F - BTC);
	CHECK_EQ(a[2].per_layer, F - S);
	CHECK_EQ(a[2].kept, L * (F - S) + BTC + head);
	CHECK_EQ(a[2].recompute, S);
	size_t none = a[0].kept + a[0].recompute, blocks = a[1].kept + a[1].recompute;
	size_t sel = a[2].kept + a[2].recompute;
	CHECK_MSG(blocks < none / L + a[0].per_layer, "blocks %zu bytes, none %zu / L %zu + one block %zu", blocks, none,
	          L, a[0].per_layer);
	CHECK_EQ(none - sel, (L - 1) * S);
	printf("  small, B=4 T=256: activations none %.1f MiB, blocks %.1f MiB (%.1f%%), selective %.1f MiB; "
	       "shared head scratch %.1f MiB, backward scratch %.1f MiB\n", none / 1048576.0, blocks / 1048576.0,
	       100.0 * blocks / none, sel / 1048576.0, a[0].head / 1048576.0, a[0].backward / 1048576.0);
	/* a pipeline stage of blocks [2, 4) with 3 arenas: per arena its layers and block 2's input */
	loom_gpt2_act_bytes_t st;
	loom_gpt2_opts_t so = {.B = (int)B, .T = (int)T, .arenas = 3, .layer_lo = 2, .layer_hi = 4,
	                       .act_ckpt = LOOM_ACT_CKPT_BLOCKS};
	CHECK_OK(loom_gpt2_act_bytes(&cfg, &so, &st));
	CHECK_EQ(st.kept, 3 * (2 * BTC + BTC));
	CHECK_EQ(st.recompute, F - BTC);
	CHECK_EQ(st.head, 0);
	/* measured: a model created with blocks allocates that */
	loom_gpt2_t *m = NULL;
	loom_gpt2_act_bytes_t want, got;
	loom_gpt2_opts_t mo = {.B = 1, .T = (int)T, .no_own_params = 1, .no_own_grads = 1,
	                       .act_ckpt = LOOM_ACT_CKPT_BLOCKS};
	CHECK_OK(loom_gpt2_act_bytes(&cfg, &mo, &want));
	CHECK_OK(loom_gpt2_create_opts(&m, &cfg, &mo));
	loom_gpt2_model_act_bytes(m, &got);
	CHECK(memcmp(&want, &got, sizeof want) == 0);
	CHECK_EQ(got.kept, (L + 1) * (BTC / 4) + head / 4);
	loom_gpt2_destroy(m);
	return 0;
}

typedef struct {
	float loss[16];
	double norm[16];
	int n;
} rec_t;

static int rec(void *ctx, loom_trainer_t *tr, const loom_step_metrics_t *m)
{
	rec_t *r = ctx;
	(void)tr;
	if (m->step < 16)
		r->loss[m->step] = m->loss, r->norm[m->step] = m->grad_norm;
	r->n++;
	return 0;
}

/* The trainer (tiny preset, accumulation 2, 6 steps): per-step losses and gradient norms of blocks and
 * selective are bit-identical to none's, and so are the final parameters; L recomputes per micro-step.
 * The memory report gives the model's layout and its formula (equal here: no padding). */
TEST(act_ckpt_train_bit_identical)
{
	char dir[512], data[700];
	loom_gpt2_config_t cfg;
	loom_gpt2_t *m[3] = {NULL, NULL, NULL};
	loom_trainer_t *tr[3] = {NULL, NULL, NULL};
	rec_t r[3];
	memset(r, 0, sizeof r);
	CHECK_OK(loom_gpt2_preset("tiny", &cfg));
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(test_make_token_data(dir, cfg.vocab_size, 8000));
	snprintf(data, sizeof data, "%s/train_*.bin", dir);
	loom_train_config_t c = loom_train_defaults();
	c.train_data = data;
	c.B = 2, c.T = 64, c.accum = 2, c.shuffle = 1, c.seed = 5;
	c.lr = (loom_lr_schedule_t){.peak_lr = 3e-3, .warmup = 2, .total_steps = 6, .kind = LOOM_SCHED_COSINE};
	for (int k = 0; k < 3; k++) {
		loom_gpt2_opts_t o = {.B = c.B, .T = c.T, .act_ckpt = modes[k]};
		CHECK_OK(loom_gpt2_create_opts(&m[k], &cfg, &o));
		loom_gpt2_init(m[k], 11);
		CHECK_OK(loom_trainer_create(&tr[k], &c, loom_gpt2_model(m[k])));
		CHECK_OK(loom_trainer_run(tr[k], rec, &r[k]));
		CHECK_EQ(r[k].n, 6);
		CHECK_EQ(loom_gpt2_recomputes(m[k]), k == 0 ? 0 : 6 * 2 * cfg.n_layer);
		loom_train_memory_t mem;
		CHECK_OK(loom_trainer_memory(tr[k], &mem));
		loom_gpt2_act_bytes_t ab;
		loom_gpt2_model_act_bytes(m[k], &ab);
		CHECK_EQ(mem.act_ckpt, modes[k]);
		CHECK_EQ(mem.activations, ab.total);
		CHECK_EQ(mem.act_formula, ab.kept + ab.recompute);
		for (int s = 1; s <= 6 && k > 0; s++) {
			CHECK_MSG(r[k].loss[s] == r[0].loss[s], "%s, step %d: loss %.9g, none %.9g", loom_act_ckpt_name(modes[k]),
			          s, r[k].loss[s], r[0].loss[s]);
			CHECK_FEQ(r[k].norm[s], r[0].norm[s]);
		}
		if (k > 0)
			CHECK(memcmp(loom_gpt2_params(m[k]), loom_gpt2_params(m[0]), loom_gpt2_num_params(&cfg) * sizeof(float)) ==
			      0);
	}
	CHECK(r[0].loss[6] != r[0].loss[1] && r[0].loss[2] != r[0].loss[1]); /* the compared values move */
	for (int k = 0; k < 3; k++) {
		loom_trainer_destroy(tr[k]);
		loom_gpt2_destroy(m[k]);
	}
	test_rmdir(dir);
	return 0;
}

/* ---- the CLI under parallelism: 2 ranks ---------------------------------------------------------- */

#define FLAGS                                                                                                    \
	"--model tiny --batch-size 2 --seq-len 32 --lr 3e-3 --warmup 2 --shuffle 1 --seed 7 --peak-flops 1e10 "   \
	"--steps 8"

/* `loom train --nproc 2 PAR` with none, blocks and selective: the step lines of the three logs (step
 * and loss as written, up to "lr") are identical, and the header names the mode. */
static int cli_modes(const char *par, const char *what)
{
	enum { MAXSTEPS = 16 };
	char dir[512], cmd[4096], out[16384], path[700];
	static char lines[3][MAXSTEPS][160];
	double loss[MAXSTEPS];
	const char *names[3] = {"none", "blocks", "selective"};
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(test_make_token_data(dir, 257, 12000));
	for (int k = 0; k < 3; k++) {
		snprintf(cmd, sizeof cmd, "%s train %s%s --train-data '%s/train_*.bin' " FLAGS
		         " --activation-checkpointing %s --log %s/%s.jsonl", test_loom_bin(), strstr(par, "--nproc") ? "" :
		         "--nproc 2 ", par, dir, names[k], dir, names[k]);
		int st = test_run_cmd(cmd, out, sizeof out, 120);
		CHECK_MSG(st == 0, "`%s` exited %d:\n%s", cmd, st, out);
		char want[100];
		snprintf(want, sizeof want, "[rank 0] activations per rank (checkpointing %s): kept ", names[k]);
		CHECK_CONTAINS(out, want);
		snprintf(path, sizeof path, "%s/%s.jsonl", dir, names[k]);
		memset(lines[k], 0, sizeof lines[k]);
		CHECK_EQ(test_read_losses(path, loss, MAXSTEPS, lines[k], NULL), 8);
		if (k == 0)
			CHECK(loss[8] != loss[1] && loss[2] != loss[1]); /* the compared values move */
		for (int s = 1; s <= 8 && k > 0; s++)
			CHECK_MSG(strcmp(lines[k][s], lines[0][s]) == 0, "%s, %s: step %d\n  %s\nnone:\n  %s", what, names[k], s,
			          lines[k][s], lines[0][s]);
	}
	FILE *f = fopen(path, "r");
	char first[4096];
	CHECK(f && fgets(first, sizeof first, f));
	fclose(f);
	CHECK_CONTAINS(first, "\"activation_checkpointing\":\"selective\",\"activation_bytes\":{\"kept\":");
	test_rmdir(dir);
	return 0;
}

TEST(act_ckpt_ddp2_bit_identical)
{
	return cli_modes("--grad-accum 2 --check-replicas 1", "DDP");
}

TEST(act_ckpt_zero1_zero3_bit_identical)
{
	/* ZeRO-3 gathers each block before its backward (the param-use hook, once): the recompute uses it */
	int rc = cli_modes("--zero 1 --check-replicas 1", "ZeRO-1");
	return rc ? rc : cli_modes("--zero 3 --grad-accum 2", "ZeRO-3");
}

TEST(act_ckpt_pp2_bit_identical)
{
	/* each stage's arenas keep their blocks' inputs; 1F1B interleaves forwards with backwards */
	return cli_modes("--pp 2 --micro-batches 4", "pp 2 (1F1B)");
}

TEST(act_ckpt_tp2_bit_identical)
{
	/* the recomputed forward runs its tp all-reduce again, on both ranks */
	return cli_modes("--tp 2", "tp 2");
}

TEST(act_ckpt_sp_tp2_bit_identical)
{
	/* sequence parallel: the recompute gathers the LayerNorm outputs and reduce-scatters again */
	return cli_modes("--tp 2 --sequence-parallel", "tp 2, sequence parallel");
}

TEST(act_ckpt_sp_tp2_pp2_bit_identical)
{
	/* 4 ranks: each stage gathers its last block's output for the next one */
	return cli_modes("--nproc 4 --tp 2 --pp 2 --micro-batches 2 --sequence-parallel", "tp 2 x pp 2, sequence parallel");
}
