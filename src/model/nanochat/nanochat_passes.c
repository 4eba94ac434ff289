/* nanochat_passes.c: nanochat's passes (nanochat_model.h): the checks of each call, the embedding's,
 * a block's and the head's forward and backward on an arena, the vocab-parallel head, and the
 * whole-model passes composed of them. The invariants are nanochat.c's: no allocation, kernels
 * reach tensors only through the views after the unit's param-use hook, grad-ready once per tensor
 * per micro-step in decreasing index order, one micro-batch's backward at a time. With context
 * parallelism (cp > 1) the T rows of a sequence are this rank's chunks of the layout (kernels.h,
 * loom__cp_chunk: head-tail pairs, K of them per rank): the rotary embeddings take their positions and
 * the attention runs over the group (cp_attention.c). */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "core/util.h"
#include "model/fastmath.h"
#include "model/nanochat/nanochat_model.h"

typedef loom_nanochat_t nc_t;

#define M(mm) ((nc_t *)(mm))

/* ---- the units' passes: the family's loom__fam_kind_t entries (family.c checks each call, sets the gemm
 * up and reports the pass's status) ---------------------------------------------------------------------- */

static float *stream(const nc_t *m, const nc_arena_t *ar, int l)
{
	return l == m->f.lo ? ar->in : ar->layers[l - 1 - m->f.lo].out;
}

/* Block l's input stream on this rank's rows, and its output. With sequence parallelism block lo's
 * input and block hi-1's output are whole-sized: the input whole after the embedding, this rank's rows
 * when a previous pipeline stage sent it; the output gathered whole only for a head on this stage (a
 * next stage takes this rank's rows: the pipeline passes each tp rank's rows to the same tp rank). */
static float *block_in(const nc_t *m, const nc_arena_t *ar, int l, int N)
{
	return l == m->f.lo ? ar->in + loom__fam_sp_row0(&m->f, N) * 2 * m->d.C : stream(m, ar, l);
}

static float *block_out(const nc_t *m, nc_layer_t *a, int l, int N)
{
	return l == m->f.hi - 1 ? a->out + loom__fam_sp_row0(&m->f, N) * 2 * m->d.C : a->out;
}

void loom__nc_embed_forward(loom__fam_t *f, int mb, const int *inputs, int B, int T)
{
	nc_t *m = M(f);
	nc_arena_t *ar = &m->arenas[mb];
	int C = m->d.C, N = B * T;
	loom__fam_param_use(&m->f, -1, 0);
	memcpy(ar->tok, inputs, sizeof(int) * (size_t)N);
	ar->has_tok = 1;
	/* x = wte[tok] (vocab-parallel: each rank's rows, summed over the group), both halves rmsnorm(x) */
	loom__rows_gather(m->f.ftmp, C, m->f.pview[NC_WTE], C, inputs, m->f.tp_rank * m->d.vl, m->d.vl, N, C);
	loom__fam_tp_reduce(&m->f, m->f.ftmp, (size_t)N * C, LOOM_TP_SUM);
	loom__nc_rmsnorm_forward(ar->in + C, 2 * C, ar->rstd0, m->f.ftmp, C, N, C);
#pragma omp parallel for schedule(static) if ((long)N * C >= 32768)
	for (int n = 0; n < N; n++)
		memcpy(ar->in + (size_t)n * 2 * C, ar->in + (size_t)n * 2 * C + C, sizeof(float) * (size_t)C);
}

/* y (N,out) = x (N,in; rows ldx apart) W^T, W [out, in] */
static void linear(float *y, int ldy, const float *x, int ldx, const float *w, int N, int in, int out)
{
	loom__gemm(0, 1, N, out, in, 1.0f, x, ldx, w, in, 0.0f, y, ldy);
}

/* dx (N,in) += dy W; dW [out, in] += dy^T x */
static void linear_backward(float *dx, int lddx, float *dw, const float *dy, int lddy, const float *x, int ldx,
                            const float *w, int N, int in, int out)
{
	if (dx)
		loom__gemm(0, 0, N, in, out, 1.0f, dy, lddy, w, in, 1.0f, dx, lddx);
	loom__gemm(1, 0, out, in, N, 1.0f, dy, lddy, x, ldx, 1.0f, dw, in);
}

/* Rotary embeddings of B x T rows of H heads, in place (backward: the transpose). */
static void rope(nc_t *m, float *x, int B, int T, int H, int D, int backward)
{
	loom__fam_rope(&m->f, backward ? loom__nc_rope_backward : loom__nc_rope_forward, x, B, T, H, D);
}

/* Block l's windowed attention from a's q, k, v, and its backward. */
static void attention_forward(nc_t *m, int l, nc_layer_t *a, int B, int T)
{
	const nc_dims_t *d = &m->d;
	loom__flash_t f = loom__nc_attention_shape(a->q, a->k, a->v, B, T, d->nh, d->nkv, d->D, m->window[l]);
	loom__fam_attention_forward(&m->f, &f, a->atty, d->nh * d->D, a->lse);
}

static void attention_backward(nc_t *m, int l, nc_layer_t *a, int B, int T)
{
	const nc_dims_t *d = &m->d;
	int Q = d->nh * d->D;
	loom__flash_t f = loom__nc_attention_shape(a->q, a->k, a->v, B, T, d->nh, d->nkv, d->D, m->window[l]);
	loom__fam_attention_backward(&m->f, &f, m->dq, Q, m->dk, m->dv, d->nkv * d->D, m->datty, a->atty, Q, a->lse);
}

#define LT(l, j) loom__nc_lt(&m->f.cfg, (l), (j))
#define W(j) m->f.pview[LT(l, j)]
#define G(j) m->f.gview[LT(l, j)]

/* Block l's forward from the stream `in` (N,2C) with tokens tok, into a; whole 0 stops after the MLP's
 * activation (a recomputation: the output is kept). */
static void block_forward_acts(nc_t *m, int l, nc_layer_t *a, const float *in, float *out, const int *tok, int B,
                               int T, int whole)
{
	const nc_dims_t *d = &m->d;
	int C = d->C, N = B * T, D = d->D, nh = d->nh, nkv = d->nkv, Q = nh * D, KV = nkv * D, Hd = d->hid;
	int ve = loom__nc_has_ve(l, d->L), Nl = loom__fam_sp_rows(&m->f, N);
	size_t o0 = loom__fam_sp_row0(&m->f, N) * C;
	float r = m->f.pview[NC_RESID][l], z = m->f.pview[NC_X0][l];
	const float *xn;
#pragma omp parallel for schedule(static) if ((long)Nl * C >= 32768)
	for (int n = 0; n < Nl; n++) {
		const float *x = in + (size_t)n * 2 * C, *x0 = x + C;
		float *o = a->xin + (size_t)n * C;
#pragma omp simd
		for (int c = 0; c < C; c++)
			o[c] = r * x[c] + z * x0[c];
	}
	loom__nc_rmsnorm_forward(a->xn1, C, a->rstd1, a->xin, C, Nl, C);
	xn = loom__fam_sp_gather(&m->f, a->xn1, N, C); /* sequence parallel: every row for the column-parallel projections */
	linear(a->q, Q, xn, C, W(NC_Q), N, C, Q);
	linear(a->k, KV, xn, C, W(NC_K), N, C, KV);
	linear(a->v, KV, xn, C, W(NC_V), N, C, KV);
	if (ve) {
		/* v += 2 sigmoid(xn[:32] Wg^T) ve[tok], per kv head */
		linear(a->gate, nkv, xn, C, W(NC_GATE), N, NC_GATE_CH, nkv);
		const float *tab = W(NC_VE);
#pragma omp parallel for schedule(static) if ((long)N * KV >= 32768)
		for (int n = 0; n < N; n++) {
			const float *e = tab + (size_t)tok[n] * KV;
			float *v = a->v + (size_t)n * KV;
			for (int h = 0; h < nkv; h++) {
				float s = 1.0f / (1.0f + expf(-a->gate[(size_t)n * nkv + h]));
				a->gate[(size_t)n * nkv + h] = s;
				float g = 2.0f * s;
#pragma omp simd
				for (int i = 0; i < D; i++)
					v[h * D + i] += g * e[h * D + i];
			}
		}
	}
	rope(m, a->q, B, T, nh, D, 0);
	rope(m, a->k, B, T, nkv, D, 0);
	loom__nc_rmsnorm_forward(a->q, D, a->qrstd, a->q, D, N * nh, D);
	loom__nc_rmsnorm_forward(a->k, D, a->krstd, a->k, D, N * nkv, D);
	attention_forward(m, l, a, B, T);
	if (m->f.sp) { /* the row-parallel product reduce-scattered onto this rank's rows */
		linear(m->f.ftmp, C, a->atty, Q, W(NC_O), N, Q, C);
		loom__fam_tp_reduce(&m->f, m->f.ftmp, (size_t)N * C, LOOM_TP_REDUCE_SCATTER);
		const float *p = m->f.ftmp + o0;
#pragma omp parallel for simd schedule(static) if ((long)Nl * C >= 32768)
		for (size_t i = 0; i < (size_t)Nl * C; i++)
			a->x2[i] = p[i] + a->xin[i];
	} else {
		linear(a->x2, C, a->atty, Q, W(NC_O), N, Q, C);
		loom__fam_tp_reduce(&m->f, a->x2, (size_t)N * C, LOOM_TP_SUM);
#pragma omp parallel for simd schedule(static) if ((long)N * C >= 32768)
		for (size_t i = 0; i < (size_t)N * C; i++)
			a->x2[i] += a->xin[i];
	}
	loom__nc_rmsnorm_forward(a->xn2, C, a->rstd2, a->x2, C, Nl, C);
	xn = loom__fam_sp_gather(&m->f, a->xn2, N, C);
	linear(a->fch, Hd, xn, C, W(NC_FC), N, C, Hd);
	loom__nc_relu2_forward(a->act, a->fch, (size_t)N * Hd);
	if (!whole)
		return;
	linear(m->f.ftmp, C, a->act, Hd, W(NC_P), N, Hd, C);
	loom__fam_tp_reduce(&m->f, m->f.ftmp, (size_t)N * C, m->f.sp ? LOOM_TP_REDUCE_SCATTER : LOOM_TP_SUM);
#pragma omp parallel for schedule(static) if ((long)Nl * C >= 32768)
	for (int n = 0; n < Nl; n++) {
		const float *x2 = a->x2 + (size_t)n * C, *p = m->f.ftmp + o0 + (size_t)n * C, *x0 = in + (size_t)n * 2 * C + C;
		float *o = out + (size_t)n * 2 * C;
#pragma omp simd
		for (int c = 0; c < C; c++) {
			o[c] = x2[c] + p[c];
			o[C + c] = x0[c];
		}
	}
}

void loom__nc_block_forward(loom__fam_t *f, int mb, int l, int B, int T)
{
	nc_t *m = M(f);
	nc_arena_t *ar = &m->arenas[mb];
	nc_layer_t *a = &ar->layers[l - m->f.lo];
	int N = B * T;
	loom__fam_param_use(&m->f, l, 0);
	block_forward_acts(m, l, a, block_in(m, ar, l, N), block_out(m, a, l, N), ar->tok, B, T, 1);
	if (m->f.sp && l == m->f.hi - 1 && m->f.has_head) /* the head's input is whole; a next stage's is not */
		loom__fam_tp_reduce(&m->f, a->out, (size_t)N * 2 * m->d.C, LOOM_TP_ALLGATHER);
}

/* The final rmsnorm of rows [r0, r0 + n) of N. A stage of the head alone (no block) under sequence
 * parallelism receives this rank's rows of its input (see block_in): they are gathered whole first, as
 * the head reads every row (rows a shared head leaves to the stage before may be stale: unread). */
static void head_norm(nc_t *m, nc_arena_t *ar, int N, int r0, int n)
{
	int C = m->d.C;
	if (m->f.sp && m->f.lo == m->f.hi && !m->f.has_embed)
		loom__fam_tp_reduce(&m->f, ar->in, (size_t)N * 2 * C, LOOM_TP_ALLGATHER);
	loom__nc_rmsnorm_forward(ar->xf + (size_t)r0 * C, C, ar->rstdf + r0, stream(m, ar, m->f.hi) + (size_t)r0 * 2 * C,
	                         2 * C, n, C);
}

/* The vocab-parallel head (tp > 1, family.c): this rank's lm_head rows hold ids [v0, v0 + vl), of which
 * Vv are real; softcapped logits. */
static void tp_classifier(nc_t *m, float *losses, float *dx, float *dw, const float *x, const float *w,
                          const int *targets, float dloss, int N)
{
	int v0 = m->f.tp_rank * m->d.vl, Vv = LOOM_MAX(0, LOOM_MIN(m->d.vl, m->d.V - v0));
	loom__fam_tp_classifier(&m->f, losses, dx, dw, x, w, targets, dloss, N, m->d.C, v0, Vv, loom__nc_logits,
	                        NC_SOFTCAP);
}

void loom__nc_head_forward(loom__fam_t *f, int mb, const int *targets, int B, int T, float *loss)
{
	nc_t *m = M(f);
	nc_arena_t *ar = &m->arenas[mb];
	int C = m->d.C, V = m->d.V, N = B * T;
	loom__fam_param_use(&m->f, m->d.L, 0);
	head_norm(m, ar, N, 0, N);
	const float *w = m->f.pview[m->f.ntensors - 1];
	if (targets && m->f.tp > 1) {
		tp_classifier(m, ar->losses, NULL, NULL, ar->xf, w, targets, 0.0f, N);
		if (loss)
			*loss = loom__fam_mean_loss(ar->losses, N, N);
	} else if (targets) {
		loom__nc_classifier(ar->losses, NULL, NULL, m->f.logits, m->f.chunk, ar->xf, w, targets, 0.0f, N, C, V);
		if (loss)
			*loss = loom__fam_mean_loss(ar->losses, N, N);
	} else {
		loom__nc_logits(m->f.last_logits, ar->xf + (size_t)(T - 1) * C, T * C, w, B, C, V);
	}
}

void loom__nc_head_forward_backward(loom__fam_t *f, int mb, const int *targets, int N, int r0, int n,
                                    float grad_scale, float *loss)
{
	nc_t *m = M(f);
	nc_arena_t *ar = &m->arenas[mb];
	int C = m->d.C, V = m->d.V, lm = m->f.ntensors - 1;
	size_t o = (size_t)r0 * C;
	loom__fam_param_use(&m->f, m->d.L, 0);
	loom__fam_param_use(&m->f, m->d.L, 1);
	head_norm(m, ar, N, r0, n);
	loom__fam_zero(m->dxn + o, (size_t)n * C);
	if (m->f.tp > 1)
		tp_classifier(m, ar->losses + r0, m->dxn + o, m->f.gview[lm], ar->xf + o, m->f.pview[lm], targets + r0,
		              grad_scale / (float)N, n);
	else
		loom__nc_classifier(ar->losses + r0, m->dxn + o, m->f.gview[lm], m->f.logits, m->f.chunk, ar->xf + o,
		                    m->f.pview[lm], targets + r0, grad_scale / (float)N, n, C, V);
	if (loss)
		*loss = loom__fam_mean_loss(ar->losses + r0, n, N);
	float *dr = m->f.dres + (size_t)r0 * 2 * C;
#pragma omp parallel for schedule(static) if ((long)n * C >= 32768)
	for (int i = 0; i < n; i++)
		memset(dr + (size_t)i * 2 * C, 0, sizeof(float) * 2 * (size_t)C);
	loom__nc_rmsnorm_backward(dr, 2 * C, m->dxn + o, C, ar->xf + o, C, ar->rstdf + r0, n, C);
	loom__fam_ready(&m->f, lm);
}

static void recompute(nc_t *m, int l, nc_layer_t *a, const float *in, const int *tok, int B, int T)
{
	if (m->f.act_ckpt == LOOM_ACT_CKPT_BLOCKS)
		block_forward_acts(m, l, a, in, NULL, tok, B, T, 0);
	else if (m->f.act_ckpt == LOOM_ACT_CKPT_SELECTIVE)
		attention_forward(m, l, a, B, T);
	else
		return;
	m->f.recomputes++;
}

void loom__nc_block_backward(loom__fam_t *f, int mb, int l, int B, int T)
{
	nc_t *m = M(f);
	nc_arena_t *ar = &m->arenas[mb];
	const nc_dims_t *d = &m->d;
	int C = d->C, N = B * T, D = d->D, nh = d->nh, nkv = d->nkv, Q = nh * D, KV = nkv * D, Hd = d->hid;
	int ve = loom__nc_has_ve(l, d->L), Nl = loom__fam_sp_rows(&m->f, N);
	size_t o0 = loom__fam_sp_row0(&m->f, N) * C;
	nc_layer_t *a = &ar->layers[l - m->f.lo];
	const float *in = block_in(m, ar, l, N), *xn;
	const int *tok = ar->tok;
	float *dres = m->f.dres + 2 * o0, *dx2 = m->dx2 + o0, *dxn = m->dxn + o0; /* this rank's rows */
	loom__fam_param_use(&m->f, l, 1);
	recompute(m, l, a, in, tok, B, T);
	/* MLP: out = x2 + relu(xn2 Wfc^T)^2 Wp^T. Sequence parallel: the stream gradient of every row for
	 * the row-parallel Wp, the column-parallel Wfc's input gradient reduce-scattered onto this rank's */
	if (m->f.sp)
		loom__fam_tp_reduce(&m->f, m->f.dres, (size_t)N * 2 * C, LOOM_TP_ALLGATHER);
	loom__fam_zero(m->dh1, (size_t)N * Hd);
	linear_backward(m->dh1, Hd, G(NC_P), m->f.dres, 2 * C, a->act, Hd, W(NC_P), N, Hd, C);
	loom__fam_ready(&m->f, LT(l, NC_P));
	loom__fam_zero(m->dh2, (size_t)N * Hd);
	loom__nc_relu2_backward(m->dh2, a->fch, m->dh1, (size_t)N * Hd);
	loom__fam_zero(m->dxn, (size_t)N * C);
	xn = loom__fam_sp_gather(&m->f, a->xn2, N, C);
	linear_backward(m->dxn, C, G(NC_FC), m->dh2, Hd, xn, C, W(NC_FC), N, C, Hd);
	loom__fam_tp_reduce(&m->f, m->dxn, (size_t)N * C, m->f.sp ? LOOM_TP_REDUCE_SCATTER : LOOM_TP_SUM);
	loom__fam_ready(&m->f, LT(l, NC_FC));
#pragma omp parallel for schedule(static) if ((long)Nl * C >= 32768)
	for (int n = 0; n < Nl; n++)
		memcpy(dx2 + (size_t)n * C, dres + (size_t)n * 2 * C, sizeof(float) * (size_t)C);
	loom__nc_rmsnorm_backward(dx2, C, dxn, C, a->xn2, C, a->rstd2, Nl, C);
	/* attention: x2 = xin + atty Wo^T (sequence parallel: dx2 of every row for the row-parallel Wo) */
	if (m->f.sp)
		loom__fam_tp_reduce(&m->f, m->dx2, (size_t)N * C, LOOM_TP_ALLGATHER);
	loom__fam_zero(m->datty, (size_t)N * Q);
	linear_backward(m->datty, Q, G(NC_O), m->dx2, C, a->atty, Q, W(NC_O), N, Q, C);
	loom__fam_ready(&m->f, LT(l, NC_O));
	loom__fam_zero(m->dq, (size_t)N * Q);
	loom__fam_zero(m->dk, (size_t)N * KV);
	loom__fam_zero(m->dv, (size_t)N * KV);
	attention_backward(m, l, a, B, T);
	/* QK-norm and rotary, backward, in place */
	loom__fam_zero(m->dkh, (size_t)N * Q);
	loom__nc_rmsnorm_backward(m->dkh, D, m->dq, D, a->q, D, a->qrstd, N * nh, D);
	memcpy(m->dq, m->dkh, sizeof(float) * (size_t)N * Q);
	loom__fam_zero(m->dkh, (size_t)N * KV);
	loom__nc_rmsnorm_backward(m->dkh, D, m->dk, D, a->k, D, a->krstd, N * nkv, D);
	memcpy(m->dk, m->dkh, sizeof(float) * (size_t)N * KV);
	rope(m, m->dq, B, T, nh, D, 1);
	rope(m, m->dk, B, T, nkv, D, 1);
	/* the projections' weight gradients, the input's gradient summed over q, k, v (and the gate) */
	loom__fam_zero(m->dxn, (size_t)N * C);
	xn = loom__fam_sp_gather(&m->f, a->xn1, N, C);
	linear_backward(m->dxn, C, G(NC_V), m->dv, KV, xn, C, W(NC_V), N, C, KV);
	loom__fam_ready(&m->f, LT(l, NC_V));
	linear_backward(m->dxn, C, G(NC_K), m->dk, KV, xn, C, W(NC_K), N, C, KV);
	loom__fam_ready(&m->f, LT(l, NC_K));
	linear_backward(m->dxn, C, G(NC_Q), m->dq, Q, xn, C, W(NC_Q), N, C, Q);
	loom__fam_ready(&m->f, LT(l, NC_Q));
	if (ve) {
		/* dgate_logit = sum_i dv e 2 s (1 - s); dve[tok] += 2 s dv */
		const float *tab = W(NC_VE);
#pragma omp parallel for schedule(static) if ((long)N * KV >= 32768)
		for (int n = 0; n < N; n++) {
			const float *e = tab + (size_t)tok[n] * KV;
			float *dvr = m->dv + (size_t)n * KV;
			for (int h = 0; h < nkv; h++) {
				float s = a->gate[(size_t)n * nkv + h], dot = 0.0f;
#pragma omp simd reduction(+ : dot)
				for (int i = 0; i < D; i++)
					dot += dvr[h * D + i] * e[h * D + i];
				m->dgate[(size_t)n * nkv + h] = 2.0f * dot * s * (1.0f - s);
				float g = 2.0f * s;
#pragma omp simd
				for (int i = 0; i < D; i++)
					dvr[h * D + i] *= g; /* dv becomes the value embedding's gradient (dv is done with) */
			}
		}
		linear_backward(m->dxn, C, G(NC_GATE), m->dgate, nkv, xn, C, W(NC_GATE), N, NC_GATE_CH, nkv);
		loom__fam_ready(&m->f, LT(l, NC_GATE));
		loom__rows_scatter_add(G(NC_VE), KV, m->dv, KV, tok, 0, d->Vp, N, KV);
		loom__fam_ready(&m->f, LT(l, NC_VE));
	}
	loom__fam_tp_reduce(&m->f, m->dxn, (size_t)N * C, m->f.sp ? LOOM_TP_REDUCE_SCATTER : LOOM_TP_SUM);
	/* dxin = dx2 + rmsnorm backward; then the mix xin = r x + z x0 */
	memcpy(m->dxin, dx2, sizeof(float) * (size_t)Nl * C);
	loom__nc_rmsnorm_backward(m->dxin, C, dxn, C, a->xn1, C, a->rstd1, Nl, C);
	float r = m->f.pview[NC_RESID][l], z = m->f.pview[NC_X0][l];
	float *sr = m->dscal, *sz = m->dscal + N;
#pragma omp parallel for schedule(static) if ((long)Nl * C >= 32768)
	for (int n = 0; n < Nl; n++) {
		const float *g = m->dxin + (size_t)n * C, *x = in + (size_t)n * 2 * C, *x0 = x + C;
		float *dx = dres + (size_t)n * 2 * C, *dx0 = dx + C, a1 = 0.0f, a2 = 0.0f;
#pragma omp simd reduction(+ : a1, a2)
		for (int c = 0; c < C; c++) {
			a1 += g[c] * x[c];
			a2 += g[c] * x0[c];
		}
#pragma omp simd
		for (int c = 0; c < C; c++) {
			dx[c] = r * g[c];
			dx0[c] += z * g[c];
		}
		sr[n] = a1, sz[n] = a2;
	}
	double s1 = 0.0, s2 = 0.0;
	for (int n = 0; n < Nl; n++)
		s1 += sr[n], s2 += sz[n];
	if (m->f.sp) { /* the scalars' gradients of this rank's rows, summed over the group */
		float s[2] = {(float)s1, (float)s2};
		loom__fam_tp_reduce(&m->f, s, 2, LOOM_TP_SUM);
		m->f.gview[NC_RESID][l] += s[0];
		m->f.gview[NC_X0][l] += s[1];
	} else {
		m->f.gview[NC_RESID][l] += (float)s1;
		m->f.gview[NC_X0][l] += (float)s2;
	}
	if (m->f.sp && l == m->f.lo && m->f.has_embed) /* the embedding's gradient is whole; a previous stage's is not */
		loom__fam_tp_reduce(&m->f, m->f.dres, (size_t)N * 2 * C, LOOM_TP_ALLGATHER);
	if (l == m->f.lo && !m->f.has_embed) {
		loom__fam_ready(&m->f, NC_X0);
		loom__fam_ready(&m->f, NC_RESID);
	}
}

void loom__nc_embed_backward(loom__fam_t *f, int mb, const int *inputs, int B, int T)
{
	nc_t *m = M(f);
	nc_arena_t *ar = &m->arenas[mb];
	int C = m->d.C, N = B * T;
	loom__fam_param_use(&m->f, -1, 1);
	/* both halves of the stream are x0 = rmsnorm(wte[tok]) */
	loom__fam_zero(m->dxn, (size_t)N * C);
#pragma omp parallel for schedule(static) if ((long)N * C >= 32768)
	for (int n = 0; n < N; n++) {
		const float *g = m->f.dres + (size_t)n * 2 * C;
		float *o = m->dx2 + (size_t)n * C;
#pragma omp simd
		for (int c = 0; c < C; c++)
			o[c] = g[c] + g[C + c];
	}
	loom__nc_rmsnorm_backward(m->dxn, C, m->dx2, C, ar->in + C, 2 * C, ar->rstd0, N, C);
	loom__fam_ready(&m->f, NC_X0);
	loom__fam_ready(&m->f, NC_RESID);
	loom__rows_scatter_add(m->f.gview[NC_WTE], C, m->dxn, C, inputs, m->f.tp_rank * m->d.vl, m->d.vl, N, C);
	loom__fam_ready(&m->f, NC_WTE);
}

#undef W
#undef G

/* ---- the rest of the family's loom__fam_kind_t ------------------------------------------------------- */

int loom__nc_set_inputs(loom_model_t *mm, int mb, const int *inputs, int B, int T)
{
	nc_t *m = M(mm);
	int rc;
	if (mb < 0 || mb >= m->f.narenas)
		return loom_seterr(LOOM_EINVAL, "nanochat set_inputs: arena %d out of range [0, %d)", mb, m->f.narenas);
	if (B <= 0 || T <= 0 || B > m->f.B || T > m->f.T)
		return loom_seterr(LOOM_EINVAL, "nanochat set_inputs: batch %d x %d tokens does not fit the model's %d x %d",
		                   B, T, m->f.B, m->f.T);
	if ((rc = loom__fam_check_tokens(&m->f, inputs, B * T, T, "inputs")) != LOOM_OK)
		return rc;
	memcpy(m->arenas[mb].tok, inputs, sizeof(int) * (size_t)B * T);
	m->arenas[mb].has_tok = 1;
	return LOOM_OK;
}

int loom__nc_block_check(const loom__fam_t *f, int mb, const char *op)
{
	if (!M(f)->arenas[mb].has_tok)
		return loom_seterr(LOOM_EINVAL, "nanochat %s: arena %d has no token ids (call embed_forward or set_inputs "
		                   "first: the value embeddings read them)", op, mb);
	return LOOM_OK;
}

float *loom__nc_stream(loom__fam_t *f, int mb, int l)
{
	return stream(M(f), &M(f)->arenas[mb], l);
}

