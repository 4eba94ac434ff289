/* tp_model.c: the model's side of Megatron tensor parallelism: how each tensor splits into shards (and back
 * into the full HF layout), the vocabulary-parallel embedding and the vocabulary-parallel fused
 * classifier (lm head, softmax, cross-entropy). The blocks' column/row-parallel passes are gpt2.c's
 * own passes run on local sizes, with a reduction at the f and g points.
 *
 * Why shards have this shape: a shard is what its kernels want contiguous. attn.c_attn's local
 * output columns are q | k | v of the local heads (three sections of C/tp), which is exactly the
 * (N, 3 C/tp) layout the attention kernel reads for NH/tp heads; attn.c_proj and mlp.c_proj keep
 * the matching rows, so each rank's matmuls are the ordinary kernels on smaller shapes. wte keeps
 * whole rows of a vocabulary padded to a multiple of tp; the padding rows are zero and masked out of
 * every softmax (a rank computes logits of its valid rows only), so they never get a gradient.
 *
 * Invariants: every rank of the group calls loom__tp_reduce the same number of times, in the same
 * order, with the same sizes (the sizes depend only on B, T, the config and the chunk); replicated
 * values (the residual stream, LayerNorm gradients, the loss) come out of the reductions with the
 * same bits on every rank, so the replicated parameters stay identical without being compared. */
#include <math.h>
#include <string.h>

#include "core/util.h"
#include "model/fastmath.h"
#include "model/kernels.h"
#include "model/gpt2/model.h"

int loom__tp_geom(const loom_tensor_info_t *full, int tp, loom__tp_geom_t *g)
{
	int d = full->tp_dim;
	if (tp <= 1 || d < 0)
		return 0;
	g->D = full->shape[d];
	g->outer = d == 0 ? 1 : full->shape[0];
	g->inner = full->ndim == 2 && d == 0 ? full->shape[1] : 1;
	g->S = strstr(full->name, "c_attn") ? 3 : 1;
	g->part = (g->D / g->S + (size_t)tp - 1) / (size_t)tp;
	return 1;
}

long loom__tp_local_index(const loom__tp_geom_t *g, int r, size_t k)
{
	size_t in = k % g->inner, t = k / g->inner, dd = t % g->D, o = t / g->D, sec_len = g->D / g->S;
	size_t sec = dd / sec_len, w = dd % sec_len;
	if (w / g->part != (size_t)r)
		return -1;
	return (long)((((o * g->S + sec) * g->part) + w % g->part) * g->inner + in);
}

/* Copy rank r's runs between the full tensor and its shard (to_shard: full -> shard). */
static void walk(const loom__tp_geom_t *g, int r, float *full, float *shard, int to_shard)
{
	size_t sec_len = g->D / g->S, first = (size_t)r * g->part;
	size_t rows = first >= sec_len ? 0 : LOOM_MIN(g->part, sec_len - first);
	for (size_t o = 0; o < g->outer; o++)
		for (size_t s = 0; s < g->S; s++) {
			float *f = full + ((o * g->D) + s * sec_len + first) * g->inner;
			float *l = shard + ((o * g->S + s) * g->part) * g->inner;
			if (to_shard) {
				memcpy(l, f, rows * g->inner * sizeof(float));
				memset(l + rows * g->inner, 0, (g->part - rows) * g->inner * sizeof(float));
			} else {
				memcpy(f, l, rows * g->inner * sizeof(float));
			}
		}
}

void loom__gpt2_tp_copy_tensor(const loom_model_config_t *cfg, int tp, int r, int i, float *full, float *shard,
                               int to_shard)
{
	loom_tensor_info_t fi;
	loom__tp_geom_t g;
	loom_gpt2_tensor_info(cfg, i, &fi);
	if (!loom__tp_geom(&fi, tp, &g)) {
		if (to_shard)
			memcpy(shard, full, fi.numel * sizeof(float));
		else
			memcpy(full, shard, fi.numel * sizeof(float));
		return;
	}
	walk(&g, r, full, shard, to_shard);
}

static void convert(const loom_gpt2_config_t *cfg, int tp, int r, float *full, float *shard, int to_shard)
{
	int n = loom_gpt2_num_tensors(cfg);
	for (int i = 0; i < n; i++) {
		loom_tensor_info_t fi, li;
		loom_gpt2_tensor_info(cfg, i, &fi);
		loom_gpt2_shard_info(cfg, tp, i, &li);
		loom__gpt2_tp_copy_tensor(cfg, tp, r, i, full + fi.offset, shard + li.offset, to_shard);
	}
}

void loom_gpt2_tp_shard(const loom_gpt2_config_t *cfg, int tp, int r, const float *full, float *shard)
{
	convert(cfg, tp, r, (float *)full, shard, 1); /* full is only read */
}

void loom_gpt2_tp_unshard(const loom_gpt2_config_t *cfg, int tp, int r, const float *shard, float *full)
{
	convert(cfg, tp, r, full, (float *)shard, 0); /* shard is only read */
}

void loom__tp_reduce(loom_gpt2_t *m, float *buf, size_t n, loom_tp_op_t op)
{
	double t0 = m->prof_on ? loom_now() : 0.0;
	if (m->f.tp_err)
		return;
	int rc = m->f.tp_reduce(m->f.tp_ctx, buf, n, op);
	if (rc != LOOM_OK)
		m->f.tp_err = rc;
	if (m->prof_on)
		loom__gpt2_prof_add(m, PROF_TP_REDUCE, t0, 0.0);
}

void loom__tp_embed_forward(loom_gpt2_t *m, float *out, const int *inp, int B, int T)
{
	/* out (B*T,C); wte local (Vl,C) for ids [v0, v0 + Vv); wpe (T,C) */
	int C = m->f.cfg.n_embd, v0 = m->v0, Vv = m->Vv, first = m->f.tp_rank == 0;
	int K = m->f.cp > 1 ? loom__fam_cp_chunks(&m->f, T) : 1;
	const float *wte = m->f.pview[0], *wpe = m->f.pview[1];
	double t0 = m->prof_on ? loom_now() : 0.0;
#pragma omp parallel for schedule(static)
	for (int n = 0; n < B * T; n++) {
		float *o = out + (size_t)n * C;
		int id = inp[n] - v0;
		const float *w = id >= 0 && id < Vv ? wte + (size_t)id * C : NULL,
		            *p = wpe + (size_t)loom__cp_pos(n % T, T, m->f.cp, m->f.cp_rank, K) * C; /* the row's position */
		for (int c = 0; c < C; c++)
			o[c] = (w ? w[c] : 0.0f) + (first ? p[c] : 0.0f);
	}
	if (m->prof_on)
		loom__gpt2_prof_add(m, PROF_ENCODER, t0, 0.0);
	loom__tp_reduce(m, out, (size_t)B * T * C, LOOM_TP_SUM);
}

void loom__tp_embed_backward(loom_gpt2_t *m, const float *dout, const int *inp, int B, int T)
{
	int C = m->f.cfg.n_embd, v0 = m->v0, Vv = m->Vv;
	int K = m->f.cp > 1 ? loom__fam_cp_chunks(&m->f, T) : 1;
	float *dwte = m->f.gview[0], *dwpe = m->f.gview[1];
	double t0 = m->prof_on ? loom_now() : 0.0;
	/* channels split over threads: every thread walks all positions, so no two write one float */
#pragma omp parallel for schedule(static)
	for (int c0 = 0; c0 < C; c0 += 16) {
		int c1 = LOOM_MIN(c0 + 16, C);
		for (int n = 0; n < B * T; n++) {
			const float *d = dout + (size_t)n * C;
			float *p = dwpe + (size_t)loom__cp_pos(n % T, T, m->f.cp, m->f.cp_rank, K) * C;
			int id = inp[n] - v0;
			for (int c = c0; c < c1; c++)
				p[c] += d[c];
			if (id >= 0 && id < Vv) {
				float *w = dwte + (size_t)id * C;
				for (int c = c0; c < c1; c++)
					w[c] += d[c];
			}
		}
	}
	if (m->prof_on)
		loom__gpt2_prof_add(m, PROF_ENCODER_BWD, t0, 0.0);
}

void loom__tp_classifier(loom_gpt2_t *m, float *losses, float *dx, float *dwte, const float *x, const float *wte,
                         const int *targets, float dloss, int N)
{
	/* losses (N), dx (N,C), dwte (Vl,C) local, x (N,C), wte (Vl,C) local, targets (N) global ids */
	int C = m->f.cfg.n_embd, V = m->Vv, v0 = m->v0, chunk = m->f.chunk;
	float *logits = m->f.logits, *mx = m->f.tp_stats, *st = m->f.tp_stats + chunk; /* st: (sum, target logit) pairs */
	/* bf16 (as loom__classifier_forward_backward): the local wte converted once for every chunk */
	loom__gemm_ctx_t *bf = loom__gemm_current();
	const void *wte16 = bf && V > 0 ? loom__bf16_hold(bf, LOOM_BF16_SLOT_HOLD0, wte, (size_t)V * C) : NULL;
	if (bf && V > 0 && !wte16)
		return; /* out of memory: the error is in the ctx */
	for (int n0 = 0; n0 < N; n0 += chunk) {
		int nc = N - n0 < chunk ? N - n0 : chunk;
		const float *xc = x + (size_t)n0 * C;
		double t0 = m->prof_on ? loom_now() : 0.0;
		if (V > 0 && bf)
			loom__gemm_bf16x(bf, 0, 1, nc, V, C, 1.0f, xc, NULL, C, wte, wte16, C, 0.0f, logits, V);
		else if (V > 0)
			loom__gemm(0, 1, nc, V, C, 1.0f, xc, C, wte, C, 0.0f, logits, V);
#pragma omp parallel for schedule(static) if ((long)nc * V >= 32768)
		for (int i = 0; i < nc; i++) {
			const float *z = logits + (size_t)i * V;
			float mi = -INFINITY;
#pragma omp simd reduction(max : mi)
			for (int j = 0; j < V; j++)
				mi = z[j] > mi ? z[j] : mi;
			mx[i] = mi;
		}
		if (m->prof_on)
			loom__gpt2_prof_add(m, PROF_CLASSIFIER, t0, 2.0 * nc * C * V);
		loom__tp_reduce(m, mx, (size_t)nc, LOOM_TP_MAX);
		t0 = m->prof_on ? loom_now() : 0.0;
#pragma omp parallel for schedule(static) if ((long)nc * V >= 32768)
		for (int i = 0; i < nc; i++) {
			float *z = logits + (size_t)i * V, sum = 0.0f, mi = mx[i];
			int tgt = targets[n0 + i] - v0;
			st[2 * i + 1] = tgt >= 0 && tgt < V ? z[tgt] : 0.0f;
#pragma omp simd reduction(+ : sum)
			for (int j = 0; j < V; j++) {
				z[j] = fast_expf(z[j] - mi);
				sum += z[j];
			}
			st[2 * i] = sum;
		}
		if (m->prof_on)
			loom__gpt2_prof_add(m, PROF_CLASSIFIER, t0, 0.0);
		loom__tp_reduce(m, st, 2 * (size_t)nc, LOOM_TP_SUM);
		t0 = m->prof_on ? loom_now() : 0.0;
#pragma omp parallel for schedule(static) if ((long)nc * V >= 32768)
		for (int i = 0; i < nc; i++) {
			float *z = logits + (size_t)i * V, sum = st[2 * i];
			int tgt = targets[n0 + i] - v0;
			losses[n0 + i] = logf(sum) + mx[i] - st[2 * i + 1];
			if (dx) {
				float g = dloss / sum;
#pragma omp simd
				for (int j = 0; j < V; j++)
					z[j] *= g;
				if (tgt >= 0 && tgt < V)
					z[tgt] -= dloss;
			}
		}
		const void *g16 = dx && V > 0 && bf ? loom__bf16_hold(bf, LOOM_BF16_SLOT_HOLD1, logits, (size_t)nc * V) : NULL;
		if (g16) { /* the chunk's gradient logits converted once for both products */
			loom__gemm_bf16x(bf, 0, 0, nc, C, V, 1.0f, logits, g16, V, wte, wte16, C, 1.0f, dx + (size_t)n0 * C, C);
			loom__gemm_bf16x(bf, 1, 0, V, C, nc, 1.0f, logits, g16, V, xc, NULL, C, 1.0f, dwte, C);
		} else if (dx && V > 0) {
			loom__gemm(0, 0, nc, C, V, 1.0f, logits, V, wte, C, 1.0f, dx + (size_t)n0 * C, C);
			loom__gemm(1, 0, V, C, nc, 1.0f, logits, V, xc, C, 1.0f, dwte, C);
		}
		if (m->prof_on)
			loom__gpt2_prof_add(m, PROF_CLASSIFIER, t0, dx ? 4.0 * nc * C * V : 0.0);
	}
	if (dx) /* the lm head is column-parallel: its input's gradient is the sum of the ranks' parts */
		loom__tp_reduce(m, dx, (size_t)N * C, LOOM_TP_SUM);
}
