/* test_flash.c: the fused attention kernel (src/model/flash.c) against a plain double-precision
 * attention written here and against the T x T kernels loom had before it (tests/attention_tt.c).
 *
 * Shapes cover what the kernel's blocks could get wrong: T = 1, T around and not a multiple of the
 * 128-row query blocks (and around 64), T longer than one key block (300 > 256), windows of 0, 1,
 * inside a block, at and beyond T, and none; as many kv heads as query heads, grouped (4 on 2) and
 * multi-query (4 on 1); query and key rows at other positions (a KV cache's single row, another
 * rank's chunk of keys). Every case runs with 1 and 2 threads and must match to 2e-5 relative to the
 * reference's largest magnitude (float sums in another order, the polynomial exp). Two runs at one
 * thread count must give the same bits, and the model's activation memory must not grow with T at a
 * fixed B x T. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attention_tt.h"
#include "loom/cpu.h"
#include "loom/loom.h"
#include "core/util.h"
#include "model/kernels.h"
#include "model/nanochat/nanochat_model.h"
#include "test.h"

static float urnd(uint32_t *s) /* uniform in [-1, 1) */
{
	*s = *s * 1664525u + 1013904223u;
	return (float)(*s >> 8) / 8388608.0f - 1.0f;
}

static float *filled(size_t n, float scale, uint32_t *s)
{
	float *p = malloc(sizeof(float) * (n ? n : 1));
	for (size_t i = 0; i < n; i++)
		p[i] = scale * urnd(s);
	return p;
}

/* The attention of a (loom__flash_t) in double: out (B,Tq,NH D), lse (B,NH,Tq), and with dout the
 * gradients dq (B,Tq,NH D), dk, dv (B,Tk,NKV D) (=, not +=). Contiguous rows: ldq = NH D, ldk = NKV D. */
static void naive(const loom__flash_t *a, double *out, double *lse, const float *dout, double *dq, double *dk,
                  double *dv)
{
	int B = a->B, Tq = a->Tq, Tk = a->Tk, NH = a->NH, D = a->D, G = NH / a->NKV, lq = NH * D, lk = a->NKV * D;
	double *p = malloc(sizeof(double) * Tk), *dp = malloc(sizeof(double) * Tk);
	if (dout) {
		memset(dq, 0, sizeof(double) * (size_t)B * Tq * lq);
		memset(dk, 0, sizeof(double) * (size_t)B * Tk * lk);
		memset(dv, 0, sizeof(double) * (size_t)B * Tk * lk);
	}
	for (int b = 0; b < B; b++)
		for (int h = 0; h < NH; h++)
			for (int i = 0; i < Tq; i++) {
				long t = (long)a->qpos + i;
				const float *q = a->q + ((size_t)b * Tq + i) * lq + (size_t)h * D;
				const float *k = a->k + (size_t)b * Tk * lk + (size_t)(h / G) * D;
				const float *v = a->v + (size_t)b * Tk * lk + (size_t)(h / G) * D;
				double mx = -INFINITY, sum = 0;
				int any = 0;
				for (int j = 0; j < Tk; j++) {
					long s = (long)a->kpos + j;
					p[j] = NAN;
					if (s > t || (a->W >= 0 && t - s > a->W))
						continue;
					double d = 0;
					for (int c = 0; c < D; c++)
						d += (double)q[c] * k[(size_t)j * lk + c];
					p[j] = d * a->scale, mx = fmax(mx, p[j]), any = 1;
				}
				for (int j = 0; j < Tk; j++)
					sum += (p[j] = isnan(p[j]) ? 0 : exp(p[j] - mx));
				double *o = out + ((size_t)b * Tq + i) * lq + (size_t)h * D;
				for (int c = 0; c < D; c++) {
					o[c] = 0;
					for (int j = 0; j < Tk; j++)
						o[c] += any ? p[j] / sum * v[(size_t)j * lk + c] : 0;
				}
				lse[((size_t)b * NH + h) * Tq + i] = any ? mx + log(sum) : -INFINITY;
				if (!dout || !any)
					continue;
				const float *dy = dout + ((size_t)b * Tq + i) * lq + (size_t)h * D;
				double dot = 0;
				for (int j = 0; j < Tk; j++) {
					p[j] /= sum, dp[j] = 0;
					for (int c = 0; c < D; c++)
						dp[j] += (double)dy[c] * v[(size_t)j * lk + c];
					dot += p[j] * dp[j];
				}
				for (int j = 0; j < Tk; j++) {
					double ds = p[j] * (dp[j] - dot) * a->scale;
					for (int c = 0; c < D; c++) {
						dq[((size_t)b * Tq + i) * lq + (size_t)h * D + c] += ds * k[(size_t)j * lk + c];
						dk[((size_t)b * Tk + j) * lk + (size_t)(h / G) * D + c] += ds * q[c];
						dv[((size_t)b * Tk + j) * lk + (size_t)(h / G) * D + c] += p[j] * dy[c];
					}
				}
			}
	free(p), free(dp);
}

/* max |x - r| over n, against rel * max |r| + 1e-6 (a gradient that is exactly 0, as a single key's dq,
 * comes out as rounding of order 1e-8); prints the worst. */
static int close_d(const char *what, const char *shape, const float *x, const double *r, size_t n, double rel)
{
	double big = 0, worst = 0;
	size_t wi = 0;
	for (size_t i = 0; i < n; i++)
		big = fmax(big, fabs(r[i]));
	for (size_t i = 0; i < n; i++) {
		double e = isinf(r[i]) && x[i] == r[i] ? 0 : fabs(x[i] - r[i]);
		if (!(e <= worst))
			worst = e, wi = i;
	}
	if (worst <= rel * big + 1e-6)
		return 0;
	fprintf(stderr, "  %s: %s differs at %zu: %.9g vs %.9g (max |ref| %.3g)\n", shape, what, wi, x[wi], r[wi], big);
	return 1;
}

/* One shape at 1 and 2 threads: forward and backward against naive(), the backward twice for its bits. */
static int flash_case(int B, int Tq, int Tk, int NH, int NKV, int D, int W, int qpos, int kpos)
{
	uint32_t s = 1234u + (uint32_t)(Tq * 31 + Tk * 7 + W * 3 + NKV);
	size_t nq = (size_t)B * Tq * NH * D, nk = (size_t)B * Tk * NKV * D, nl = (size_t)B * NH * Tq;
	float *q = filled(nq, 2.0f, &s), *k = filled(nk, 2.0f, &s), *v = filled(nk, 1.0f, &s), *dy = filled(nq, 1.0f, &s);
	float *out = malloc(nq * 4), *lse = malloc(nl * 4), *dq = malloc(nq * 4), *dk = malloc(nk * 4), *dv = malloc(nk * 4);
	float *dq2 = malloc(nq * 4), *dk2 = malloc(nk * 4), *dv2 = malloc(nk * 4);
	float *scr = calloc(loom__flash_scratch_floats(B, Tk, NKV, D, 2) + 1, 4);
	double *ro = malloc(nq * 8), *rl = malloc(nl * 8), *rdq = malloc(nq * 8), *rdk = malloc(nk * 8), *rdv = malloc(nk * 8);
	loom__flash_t a = {.q = q, .k = k, .v = v, .ldq = NH * D, .ldk = NKV * D, .B = B, .Tq = Tq, .Tk = Tk, .NH = NH,
	                   .NKV = NKV, .D = D, .W = W, .qpos = qpos, .kpos = kpos, .scale = 1.0f / sqrtf((float)D)};
	char shape[160];
	int bad = 0, saved = loom_num_threads();
	snprintf(shape, sizeof shape, "B%d Tq%d Tk%d NH%d NKV%d D%d W%d qpos%d kpos%d", B, Tq, Tk, NH, NKV, D, W, qpos, kpos);
	naive(&a, ro, rl, dy, rdq, rdk, rdv);
	for (int nt = 1; nt <= 2 && !bad; nt++) {
		loom_set_num_threads(nt);
		memset(out, 0xff, nq * 4); /* the forward overwrites everything */
		loom__flash_forward(&a, out, NH * D, lse);
		bad |= close_d("out", shape, out, ro, nq, 2e-5);
		bad |= close_d("lse", shape, lse, rl, nl, 2e-6);
		for (int rep = 0; rep < 2; rep++) {
			float *x = rep ? dq2 : dq, *y = rep ? dk2 : dk, *z = rep ? dv2 : dv;
			memset(x, 0, nq * 4), memset(y, 0, nk * 4), memset(z, 0, nk * 4);
			loom__flash_backward(&a, x, NH * D, y, z, NKV * D, dy, NH * D, out, NH * D, lse, scr, 2);
		}
		bad |= close_d("dq", shape, dq, rdq, nq, 2e-5);
		bad |= close_d("dk", shape, dk, rdk, nk, 2e-5);
		bad |= close_d("dv", shape, dv, rdv, nk, 2e-5);
		if (memcmp(dq, dq2, nq * 4) || memcmp(dk, dk2, nk * 4) || memcmp(dv, dv2, nk * 4))
			fprintf(stderr, "  %s: two backward runs at %d threads differ\n", shape, nt), bad = 1;
		if (bad)
			fprintf(stderr, "  (with %d thread(s))\n", nt);
	}
	loom_set_num_threads(saved);
	free(q), free(k), free(v), free(dy), free(out), free(lse), free(dq), free(dk), free(dv), free(dq2), free(dk2);
	free(dv2), free(scr), free(ro), free(rl), free(rdq), free(rdk), free(rdv);
	return bad;
}

TEST(flash_causal_and_windows_match_plain_attention)
{
	static const int T[] = {1, 63, 64, 65, 128, 129, 300};
	for (size_t ti = 0; ti < sizeof T / sizeof T[0]; ti++) {
		int t = T[ti], windows[] = {-1, 0, 1, 37, t - 1, t, t + 10};
		for (size_t wi = 0; wi < sizeof windows / sizeof windows[0]; wi++)
			CHECK(!flash_case(2, t, t, 2, 2, 8, windows[wi], 0, 0));
	}
	return 0;
}

TEST(flash_grouped_and_multi_query_heads)
{
	CHECK(!flash_case(2, 150, 150, 4, 2, 8, -1, 0, 0));
	CHECK(!flash_case(1, 150, 150, 4, 2, 16, 37, 0, 0));
	CHECK(!flash_case(2, 97, 97, 4, 1, 8, -1, 0, 0));
	CHECK(!flash_case(1, 97, 97, 6, 1, 8, 20, 0, 0));
	CHECK(!flash_case(1, 70, 70, 3, 3, 64, -1, 0, 0)); /* a head of 64, GPT-2's */
	return 0;
}

/* Query and key rows at other positions: a KV cache's single query row over the rows before it, and
 * the chunks a context-parallel rank pairs (keys wholly before the queries, partly after, wholly after:
 * a query that sees no key has output 0 and lse -inf, its keys get no gradient). */
TEST(flash_position_offsets)
{
	CHECK(!flash_case(1, 1, 100, 4, 2, 8, -1, 99, 0));
	CHECK(!flash_case(1, 1, 100, 4, 2, 8, 30, 99, 0));
	CHECK(!flash_case(1, 1, 1, 2, 2, 8, -1, 0, 0));
	CHECK(!flash_case(2, 64, 64, 2, 1, 8, -1, 192, 0));  /* keys before: no mask */
	CHECK(!flash_case(2, 70, 64, 2, 1, 8, 80, 100, 40)); /* partly visible, windowed */
	CHECK(!flash_case(2, 64, 64, 2, 2, 8, -1, 0, 64));   /* keys after: nothing visible */
	return 0;
}

/* The KV cache's single row at position p is the full forward's row p (the same arithmetic per row, to
 * rounding: the blocks' sgemm shapes differ). */
TEST(flash_one_row_equals_full_forward_row)
{
	enum { T = 130, NH = 4, NKV = 2, D = 16 };
	uint32_t s = 7;
	float *q = filled((size_t)T * NH * D, 2, &s), *k = filled((size_t)T * NKV * D, 2, &s);
	float *v = filled((size_t)T * NKV * D, 1, &s), *full = malloc(sizeof(float) * T * NH * D), one[NH * D];
	loom__flash_t a = {.q = q, .k = k, .v = v, .ldq = NH * D, .ldk = NKV * D, .B = 1, .Tq = T, .Tk = T, .NH = NH,
	                   .NKV = NKV, .D = D, .W = 50, .scale = 0.25f};
	loom__flash_forward(&a, full, NH * D, NULL);
	for (int p = 0; p < T; p += 43) {
		loom__flash_t r = a;
		r.q = q + (size_t)p * NH * D, r.Tq = 1, r.Tk = p + 1, r.qpos = p;
		loom__flash_forward(&r, one, NH * D, NULL);
		for (int c = 0; c < NH * D; c++)
			CHECK_MSG(fabsf(one[c] - full[(size_t)p * NH * D + c]) <= 1e-6f, "row %d col %d: %.9g vs %.9g", p, c, one[c],
			          full[(size_t)p * NH * D + c]);
	}
	free(q), free(k), free(v), free(full);
	return 0;
}

/* The kernels loom had before (tests/attention_tt.c: (T,T) probabilities) give the same outputs and
 * gradients: GPT-2's layout (q, k, v side by side in qkv) and nanochat's (windows, grouped heads). */
TEST(flash_matches_the_former_tt_kernels)
{
	for (int nt = 1; nt <= 2; nt++) {
		loom_set_num_threads(nt);
		{
			enum { B = 2, T = 150, C = 48, NH = 3 };
			uint32_t s = 5;
			size_t nq = (size_t)B * T * 3 * C, ny = (size_t)B * T * C;
			float *qkv = filled(nq, 2, &s), *dy = filled(ny, 1, &s), *o1 = malloc(ny * 4), *o2 = malloc(ny * 4);
			float *att = malloc(sizeof(float) * B * NH * T * T), *lse = malloc(sizeof(float) * B * NH * T);
			float *g1 = calloc(nq, 4), *g2 = calloc(nq, 4), *s1 = malloc(sizeof(float) * T * T * 2);
			float *s2 = calloc(loom__attention_scratch_floats(B, T, C, 2) + 1, 4);
			double *ref = malloc(nq * 8);
			tt_attention_forward(o1, att, qkv, B, T, C, NH);
			loom__attention_forward(o2, lse, qkv, B, T, C, NH);
			tt_attention_backward(g1, s1, 2, dy, qkv, att, B, T, C, NH);
			loom__attention_backward(g2, s2, 2, dy, qkv, o2, lse, B, T, C, NH);
			for (size_t i = 0; i < ny; i++)
				ref[i] = o1[i];
			CHECK(!close_d("gpt2 out", "tt", o2, ref, ny, 2e-5));
			for (size_t i = 0; i < nq; i++)
				ref[i] = g1[i];
			CHECK(!close_d("gpt2 dqkv", "tt", g2, ref, nq, 2e-5));
			free(qkv), free(dy), free(o1), free(o2), free(att), free(lse), free(g1), free(g2), free(s1), free(s2);
			free(ref);
		}
		{
			enum { B = 2, T = 150, NH = 4, NKV = 2, D = 8, W = 37 };
			uint32_t s = 6;
			size_t nq = (size_t)B * T * NH * D, nk = (size_t)B * T * NKV * D;
			float *q = filled(nq, 2, &s), *k = filled(nk, 2, &s), *v = filled(nk, 1, &s), *dy = filled(nq, 1, &s);
			float *o1 = malloc(nq * 4), *o2 = malloc(nq * 4), *att = malloc(sizeof(float) * B * NH * T * T);
			float *lse = malloc(sizeof(float) * B * NH * T), *dq1 = calloc(nq, 4), *dq2 = calloc(nq, 4);
			float *dk1 = calloc(nk, 4), *dk2 = calloc(nk, 4), *dv1 = calloc(nk, 4), *dv2 = calloc(nk, 4);
			float *dkh = malloc(nq * 4), *dvh = malloc(nq * 4), *s1 = malloc(sizeof(float) * T * T * 2);
			float *s2 = calloc(loom__flash_scratch_floats(B, T, NKV, D, 2) + 1, 4);
			double *ref = malloc(nq * 8);
			tt_nc_attention_forward(o1, att, q, k, v, B, T, NH, NKV, D, W);
			loom__nc_attention_forward(o2, lse, q, k, v, B, T, NH, NKV, D, W);
			tt_nc_attention_backward(dq1, dk1, dv1, dkh, dvh, s1, 2, dy, q, k, v, att, B, T, NH, NKV, D, W);
			loom__nc_attention_backward(dq2, dk2, dv2, s2, 2, dy, q, k, v, o2, lse, B, T, NH, NKV, D, W);
			const float *mine[4] = {o2, dq2, dk2, dv2}, *theirs[4] = {o1, dq1, dk1, dv1};
			const char *what[4] = {"nanochat out", "nanochat dq", "nanochat dk", "nanochat dv"};
			for (int t = 0; t < 4; t++) {
				size_t n = t < 2 ? nq : nk;
				for (size_t i = 0; i < n; i++)
					ref[i] = theirs[t][i];
				CHECK(!close_d(what[t], "tt", mine[t], ref, n, 2e-5));
			}
			free(q), free(k), free(v), free(dy), free(o1), free(o2), free(att), free(lse), free(dq1), free(dq2);
			free(dk1), free(dk2), free(dv1), free(dv2), free(dkh), free(dvh), free(s1), free(s2), free(ref);
		}
	}
	loom_set_num_threads(1);
	return 0;
}

/* No activation buffer is sized by T x T: at a fixed B x T tokens, every role of the activation
 * memory of both families (and every checkpointing mode, tp 2 with sequence parallelism) is the same
 * at T = 256 and T = 4096 (the head's last-position logits are per sequence); with the former
 * (B,NH,T,T) probabilities it grew 16-fold. */
TEST(flash_activation_memory_does_not_grow_with_t)
{
	loom_model_config_t g = {.arch = LOOM_ARCH_GPT2, .n_layer = 2, .n_head = 4, .n_embd = 64, .seq_len = 4096,
	                         .vocab_size = 128};
	loom_model_config_t n = {.arch = LOOM_ARCH_NANOCHAT, .n_layer = 3, .n_head = 4, .n_kv_head = 2, .n_embd = 64,
	                         .seq_len = 4096, .vocab_size = 61};
	snprintf(n.window_pattern, sizeof n.window_pattern, "SSL");
	const loom_model_config_t *cfgs[2] = {&g, &n};
	for (int f = 0; f < 2; f++)
		for (int mode = LOOM_ACT_CKPT_NONE; mode <= LOOM_ACT_CKPT_SELECTIVE; mode++)
			for (int tp = 1; tp <= 2; tp++) {
				loom_model_opts_t a = {.B = 16, .T = 256, .arenas = 2, .act_ckpt = mode, .tp_size = tp,
				                       .sequence_parallel = tp > 1};
				loom_model_opts_t b = a;
				b.B = 1, b.T = 4096;
				loom_model_act_bytes_t x, y;
				CHECK_EQ(loom_model_act_bytes(cfgs[f], &a, &x), LOOM_OK);
				CHECK_EQ(loom_model_act_bytes(cfgs[f], &b, &y), LOOM_OK);
				/* the head's (B,V) last-position logits shrink with B; nothing grows */
				CHECK_MSG(x.kept == y.kept && x.recompute == y.recompute && x.backward == y.backward &&
				              y.head <= x.head && y.total <= x.total,
				          "family %d mode %d tp %d: B16 T256 %zu (kept %zu, recompute %zu, backward %zu) vs B1 T4096 "
				          "%zu (kept %zu, recompute %zu, backward %zu)",
				          f, mode, tp, x.total, x.kept, x.recompute, x.backward, y.total, y.kept, y.recompute,
				          y.backward);
			}
	return 0;
}

/* ---- bf16 ------------------------------------------------------------------------------------------------ */

/* max |x - r| / max |r| */
static double rel_err(const float *x, const float *r, size_t n)
{
	double big = 0, e = 0;
	for (size_t i = 0; i < n; i++)
		big = fmax(big, fabs(r[i])), e = fmax(e, fabs((double)x[i] - r[i]));
	return e / (big + 1e-30);
}

/* The attention's bf16 products (a bf16 GEMM context on the calling thread): every product's operands
 * rounded to bf16, fp32 accumulation, on the portable path everywhere, natively with AVX512-BF16
 * (LOOM_ATTN_BF16=avx512) where the CPU has it and with AMX where it has that (the default there; elsewhere
 * the default keeps fp32, LOOM_ATTN_BF16=1 asks for the portable path's bf16).
 * Outputs and gradients against the fp32 kernel within bf16's tolerance (operands rounded to 8
 * significant bits: 2^-8 relative each; measured 2.2e-3 to 5.3e-3 of the largest value, allowed 2e-2),
 * yet not equal to fp32's (the rounding happened: above 1e-4), and each native path against the
 * portable one within 1e-3 (the same rounded operands summed in another order, measured 5e-8 to 2e-5:
 * a P or dS on a rounding boundary may round one bf16 step apart; a wrong packing is O(1)). Head sizes
 * 64, 128 (the bf16 path's largest), 32 and 16; odd T and T over two key blocks, windowed and grouped;
 * queries and keys at other positions (keys from an odd position, one query row over a cache).
 * LOOM_ATTN_BF16=0 keeps a bf16 context's attention fp32's, bit for bit, as does the default on the
 * portable path; a value other than 1, 0 and avx512 is refused at create. */
TEST(flash_bf16_paths)
{
	/* B, Tq, Tk, NH, NKV, D, W, qpos, kpos: the last two another rank's chunk of keys and a KV cache's row */
	static const int shapes[][9] = {{2, 150, 150, 4, 2, 64, 37, 0, 0}, {1, 97, 97, 3, 3, 128, -1, 0, 0},
	                                {1, 65, 65, 2, 1, 16, 20, 0, 0},   {1, 300, 300, 2, 1, 64, 200, 0, 0},
	                                {1, 70, 90, 2, 2, 64, 100, 113, 7}, {2, 1, 77, 4, 2, 32, -1, 76, 0}};
	enum { FP32, PORTABLE, AVX512, AMX, NP };
	static const char *names[NP] = {"fp32", "portable", "avx512-bf16", "amx"};
	int saved = loom_num_threads(), have[NP] = {1, 1, loom_cpu()->avx512_bf16, loom_cpu()->amx_bf16};
	for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
		int B = shapes[si][0], Tq = shapes[si][1], Tk = shapes[si][2], NH = shapes[si][3], NKV = shapes[si][4];
		int D = shapes[si][5];
		uint32_t s = 77u + (uint32_t)si;
		size_t nq = (size_t)B * Tq * NH * D, nk = (size_t)B * Tk * NKV * D, nl = (size_t)B * NH * Tq;
		float *q = filled(nq, 2, &s), *k = filled(nk, 2, &s), *v = filled(nk, 1, &s), *dy = filled(nq, 1, &s);
		float *res[NP][4] = {{0}}; /* out, dq, dk, dv */
		float *lse = malloc(nl * 4), *scr = calloc(loom__flash_scratch_floats(B, Tk, NKV, D, 2) + 1, 4);
		loom__flash_t a = {.q = q, .k = k, .v = v, .ldq = NH * D, .ldk = NKV * D, .B = B, .Tq = Tq, .Tk = Tk, .NH = NH,
		                   .NKV = NKV, .D = D, .W = shapes[si][6], .qpos = shapes[si][7], .kpos = shapes[si][8],
		                   .scale = 1.0f / sqrtf((float)D)};
		for (int p = 0; p < NP; p++) {
			if (!have[p])
				continue;
			loom__gemm_ctx_t ctx = {.dtype = LOOM_COMPUTE_BF16, .path = p >= AVX512 ? LOOM_BF16_NATIVE : LOOM_BF16_PORTABLE};
			res[p][0] = malloc(nq * 4), res[p][1] = calloc(nq, 4), res[p][2] = calloc(nk, 4), res[p][3] = calloc(nk, 4);
			if (p == AVX512)
				setenv("LOOM_ATTN_BF16", "avx512", 1);
			if (p == PORTABLE) /* the default keeps the portable path's attention fp32: ask for bf16 */
				setenv("LOOM_ATTN_BF16", "1", 1);
			loom_set_num_threads(2);
			loom__gemm_use(p != FP32 ? &ctx : NULL);
			loom__flash_forward(&a, res[p][0], NH * D, lse);
			loom__flash_backward(&a, res[p][1], NH * D, res[p][2], res[p][3], NKV * D, dy, NH * D, res[p][0], NH * D,
			                     lse, scr, 2);
			loom__gemm_use(NULL);
			CHECK_MSG(loom__gemm_status(&ctx) == LOOM_OK, "shape %zu %s: %s", si, names[p], loom_errmsg());
			loom__gemm_ctx_free(&ctx);
			unsetenv("LOOM_ATTN_BF16");
		}
		loom_set_num_threads(saved);
		static const char *what[4] = {"out", "dq", "dk", "dv"};
		for (int p = PORTABLE; p < NP; p++)
			for (int t = 0; t < 4 && have[p]; t++) {
				size_t n = t < 2 ? nq : nk;
				double e = rel_err(res[p][t], res[FP32][t], n);
				CHECK_MSG(e <= 2e-2 && e > 1e-4, "shape %zu %s path: %s %.3g of its max from fp32's", si, names[p],
				          what[t], e);
				if (p != PORTABLE) {
					double f = rel_err(res[p][t], res[PORTABLE][t], n);
					CHECK_MSG(f <= 1e-3, "shape %zu: %s %s %.3g of its max from the portable path's", si, names[p],
					          what[t], f);
				}
			}
		for (int p = 0; p < NP; p++)
			for (int t = 0; t < 4; t++)
				free(res[p][t]);
		free(q), free(k), free(v), free(dy), free(lse), free(scr);
	}
	/* LOOM_ATTN_BF16=0: a bf16 context's attention is fp32's, bit for bit */
	{
		enum { B = 1, T = 70, NH = 2, D = 32 };
		uint32_t s = 5;
		size_t nq = (size_t)B * T * NH * D;
		float *q = filled(nq, 2, &s), *k = filled(nq, 2, &s), *v = filled(nq, 1, &s), *o1 = malloc(nq * 4);
		float *o2 = malloc(nq * 4);
		loom__flash_t a = {.q = q, .k = k, .v = v, .ldq = NH * D, .ldk = NH * D, .B = B, .Tq = T, .Tk = T, .NH = NH,
		                   .NKV = NH, .D = D, .W = -1, .scale = 0.2f};
		loom__gemm_ctx_t ctx = {.dtype = LOOM_COMPUTE_BF16, .path = LOOM_BF16_PORTABLE};
		loom__flash_forward(&a, o1, NH * D, NULL);
		setenv("LOOM_ATTN_BF16", "0", 1);
		loom__gemm_use(&ctx);
		loom__flash_forward(&a, o2, NH * D, NULL);
		loom__gemm_use(NULL);
		unsetenv("LOOM_ATTN_BF16");
		CHECK(memcmp(o1, o2, nq * 4) == 0);
		/* unset, the portable path keeps fp32 too (bf16 attention pays only on AMX); 1 asks for bf16 */
		loom__gemm_use(&ctx);
		loom__flash_forward(&a, o2, NH * D, NULL);
		loom__gemm_use(NULL);
		CHECK(memcmp(o1, o2, nq * 4) == 0);
		setenv("LOOM_ATTN_BF16", "1", 1);
		loom__gemm_use(&ctx);
		loom__flash_forward(&a, o2, NH * D, NULL);
		loom__gemm_use(NULL);
		unsetenv("LOOM_ATTN_BF16");
		CHECK(memcmp(o1, o2, nq * 4) != 0);
		loom__gemm_ctx_free(&ctx);
		/* a native context: unset, bf16 on AMX where the CPU has it (outputs differ), fp32 elsewhere */
		loom__gemm_ctx_t nat = {.dtype = LOOM_COMPUTE_BF16, .path = LOOM_BF16_NATIVE};
		if (loom_cpu()->avx512_bf16) {
			loom__gemm_use(&nat);
			loom__flash_forward(&a, o2, NH * D, NULL);
			loom__gemm_use(NULL);
			CHECK_MSG((memcmp(o1, o2, nq * 4) != 0) == (loom_cpu()->amx_bf16 != 0), "amx %d",
			          loom_cpu()->amx_bf16);
			loom__gemm_ctx_free(&nat);
		}
		free(q), free(k), free(v), free(o1), free(o2);
	}
	/* a bad value stops the model's create, naming the variable and what it accepts */
	{
		loom_model_config_t n = {.arch = LOOM_ARCH_NANOCHAT, .n_layer = 1, .n_head = 2, .n_kv_head = 2, .n_embd = 32,
		                         .seq_len = 16, .vocab_size = 61};
		loom_model_opts_t o = {.B = 1, .T = 16};
		loom_model_t *m = NULL;
		setenv("LOOM_ATTN_BF16", "amx", 1);
		int rc = loom_model_create(&m, &n, &o);
		unsetenv("LOOM_ATTN_BF16");
		CHECK_EQ(rc, LOOM_EINVAL);
		CHECK_MSG(strstr(loom_errmsg(), "LOOM_ATTN_BF16='amx': expected 1") != NULL, "%s", loom_errmsg());
		if (rc == LOOM_OK)
			loom_model_destroy(m);
		CHECK_EQ(loom_model_create(&m, &n, &o), LOOM_OK);
		loom_model_destroy(m);
	}
	return 0;
}

/* The largest single allocation (loom__alloc_largest) of creating a model, a training pass (forward and
 * backward) and sampling with the KV cache over a long prompt, for both families: at B=1 T=2048 it is no
 * larger than at B=8 T=256, the same tokens (a (B,NH,T,T) buffer would make it 4 x 2048^2 x 4 bytes =
 * 64 MiB at T=2048 against 8 MiB at T=256). */
static size_t largest_of_a_pass(const loom_model_config_t *c, int B, int T)
{
	loom_model_t *m = NULL;
	int *tok = malloc(sizeof(int) * (size_t)B * T), out[4], n_out = 0;
	float loss = 0;
	for (int i = 0; i < B * T; i++)
		tok[i] = (i * 7 + 3) % c->vocab_size;
	loom__alloc_largest(1);
	loom_model_opts_t o = {.B = B, .T = T};
	if (loom_model_create(&m, c, &o) != LOOM_OK)
		return (size_t)-1;
	loom_model_init(m, 5);
	loom_model_zero_grad(m);
	int rc = loom_model_forward_backward(m, tok, tok, B, T, 1.0f, &loss);
	/* sampling: the prompt fills the cache to T - 4 positions (GPT-2's prompt pass is a forward over them) */
	if (rc == LOOM_OK)
		rc = loom_model_generate(m, tok, T - 4, 4, 0.0f, 0, 1, -1, out, &n_out, NULL, NULL);
	size_t big = loom__alloc_largest(0);
	loom_model_destroy(m);
	free(tok);
	return rc == LOOM_OK && isfinite(loss) && n_out == 4 ? big : (size_t)-1;
}

TEST(flash_no_allocation_grows_with_t_squared)
{
	loom_model_config_t g = {.arch = LOOM_ARCH_GPT2, .n_layer = 2, .n_head = 4, .n_embd = 64, .seq_len = 2048,
	                         .vocab_size = 128};
	loom_model_config_t n = {.arch = LOOM_ARCH_NANOCHAT, .n_layer = 2, .n_head = 4, .n_kv_head = 2, .n_embd = 64,
	                         .seq_len = 2048, .vocab_size = 61};
	snprintf(n.window_pattern, sizeof n.window_pattern, "SL");
	const loom_model_config_t *cfgs[2] = {&g, &n};
	for (int f = 0; f < 2; f++) {
		size_t short_seq = largest_of_a_pass(cfgs[f], 8, 256), long_seq = largest_of_a_pass(cfgs[f], 1, 2048);
		CHECK_MSG(short_seq != (size_t)-1 && long_seq != (size_t)-1, "family %d: a pass failed: %s", f, loom_errmsg());
		CHECK_MSG(long_seq <= short_seq, "family %d: the largest allocation at B=1 T=2048 is %zu bytes, at B=8 T=256 "
		          "%zu", f, long_seq, short_seq);
	}
	return 0;
}
