/* llama_passes.c: the Llama family's passes (llama_model.h): the checks of each call, the embedding's,
 * a block's and the head's forward and backward on an arena, the vocab-parallel head, and the
 * whole-model passes composed of them. The invariants are llama.c's: no allocation, kernels reach
 * tensors only through the views after the unit's param-use hook, grad-ready once per tensor per
 * micro-step in decreasing index order, one micro-batch's backward at a time.
 *
 * Tensor parallelism is Megatron's: the column-parallel q, k, v, gate and up take every row of the
 * normed input (the f point: identity forward, the input gradient summed over the group backward),
 * the row-parallel o and down produce partial sums (the g point: summed forward); o's and down's biases
 * are added once, after the sum. With sequence parallelism the residual side (norms, residual adds)
 * holds this rank's rows only: the f point becomes an all-gather and its backward a reduce-scatter,
 * the g point a reduce-scatter; a norm's weight gradient from this rank's rows is summed over the
 * group. With context parallelism (cp > 1) the T rows of a sequence are this rank's chunks of
 * the layout (kernels.h, loom__cp_chunk): the rotary embeddings take their positions and the attention
 * runs over the group (cp_attention.c). */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "core/util.h"
#include "model/fastmath.h"
#include "model/llama/llama_model.h"

typedef loom_llama_t ll_t;

#define M(mm) ((ll_t *)(mm))

/* ---- the units' passes: the family's loom__fam_kind_t entries (family.c checks each call, sets the gemm
 * up and reports the pass's status) ---------------------------------------------------------------------- */

static float *stream(const ll_t *m, const ll_arena_t *ar, int l)
{
	return l == m->f.lo ? ar->in : ar->layers[l - 1 - m->f.lo].out;
}

/* Block l's input stream on this rank's rows, and its output (nanochat_passes.c's rule: with sequence
 * parallelism block lo's input and block hi-1's output are whole-sized). */
static float *block_in(const ll_t *m, const ll_arena_t *ar, int l, int N)
{
	return l == m->f.lo ? ar->in + loom__fam_sp_row0(&m->f, N) * m->d.C : stream(m, ar, l);
}

static float *block_out(const ll_t *m, ll_layer_t *a, int l, int N)
{
	return l == m->f.hi - 1 ? a->out + loom__fam_sp_row0(&m->f, N) * m->d.C : a->out;
}

/* y (N,out) = x (N,in; rows ldx apart) W^T (+ b), W [out, in] */
static void linear(float *y, int ldy, const float *x, int ldx, const float *w, const float *b, int N, int in, int out)
{
	loom__gemm(0, 1, N, out, in, 1.0f, x, ldx, w, in, 0.0f, y, ldy);
	if (b)
		loom__ll_bias_forward(y, ldy, b, N, out);
}

/* dx (N,in) += dy W; dW [out, in] += dy^T x; db (out) += column sums of dy */
static void linear_backward(float *dx, int lddx, float *dw, float *db, const float *dy, int lddy, const float *x,
                            int ldx, const float *w, int N, int in, int out)
{
	if (dx)
		loom__gemm(0, 0, N, in, out, 1.0f, dy, lddy, w, in, 1.0f, dx, lddx);
	loom__gemm(1, 0, out, in, N, 1.0f, dy, lddy, x, ldx, 1.0f, dw, in);
	if (db)
		loom__ll_bias_backward(db, dy, lddy, N, out);
}

/* A norm's weight gradient from this call's rows (m->dnw) added to its view: summed over the tp group
 * first when the rows were this rank's share (sequence parallelism). */
static void norm_grad_add(ll_t *m, float *gw)
{
	int C = m->d.C;
	if (m->f.sp)
		loom__fam_tp_reduce(&m->f, m->dnw, (size_t)C, LOOM_TP_SUM);
	for (int c = 0; c < C; c++)
		gw[c] += m->dnw[c];
}

void loom__ll_embed_forward(loom__fam_t *f, int mb, const int *inputs, int B, int T)
{
	ll_t *m = M(f);
	ll_arena_t *ar = &m->arenas[mb];
	int C = m->d.C, N = B * T;
	loom__fam_param_use(&m->f, -1, 0);
	/* x = embed_tokens[tok] (vocab-parallel: each rank's rows, summed over the group) */
	loom__rows_gather(ar->in, C, m->f.pview[0], C, inputs, m->f.tp_rank * m->d.vl, m->d.vl, N, C);
	loom__fam_tp_reduce(&m->f, ar->in, (size_t)N * C, LOOM_TP_SUM);
}

/* Rotary embeddings of B x T rows of H heads, in place (backward: the transpose). */
static void rope(ll_t *m, float *x, int B, int T, int H, int D, int backward)
{
	loom__fam_rope(&m->f, backward ? loom__ll_rope_backward : loom__ll_rope_forward, x, B, T, H, D);
}

/* The causal GQA attention of a's q, k, v on the fused kernel (flash.c), every layer over the whole
 * prefix, scale head_dim^-0.5. */
static loom__flash_t attn_shape(const ll_t *m, const ll_layer_t *a, int B, int T)
{
	const ll_dims_t *d = &m->d;
	loom__flash_t f = {.q = a->q, .k = a->k, .v = a->v, .ldq = d->nh * d->D, .ldk = d->nkv * d->D, .B = B, .Tq = T,
	                   .Tk = T, .NH = d->nh, .NKV = d->nkv, .D = d->D, .W = -1,
	                   .scale = (float)(1.0 / sqrt((double)d->D))};
	return f;
}

static void attention_forward(ll_t *m, ll_layer_t *a, int B, int T)
{
	loom__flash_t f = attn_shape(m, a, B, T);
	loom__fam_attention_forward(&m->f, &f, a->atty, m->d.nh * m->d.D, a->lse);
}

static void attention_backward(ll_t *m, ll_layer_t *a, int B, int T)
{
	loom__flash_t f = attn_shape(m, a, B, T);
	int Q = m->d.nh * m->d.D;
	loom__fam_attention_backward(&m->f, &f, m->dq, Q, m->dk, m->dv, m->d.nkv * m->d.D, m->datty, a->atty, Q, a->lse);
}

#define LT(j) loom__ll_lt(&m->d, l, (j))
#define W(j) (LT(j) >= 0 ? m->f.pview[LT(j)] : NULL)
#define G(j) (LT(j) >= 0 ? m->f.gview[LT(j)] : NULL)

/* Block l's forward from the stream `in` into a; whole 0 stops after the MLP's activation (a
 * recomputation: the output is kept). */
static void block_forward_acts(ll_t *m, int l, ll_layer_t *a, const float *in, float *out, int B, int T, int whole)
{
	const ll_dims_t *d = &m->d;
	int C = d->C, N = B * T, D = d->D, nh = d->nh, nkv = d->nkv, Q = nh * D, KV = nkv * D, I = d->il;
	int Nl = loom__fam_sp_rows(&m->f, N);
	size_t o0 = loom__fam_sp_row0(&m->f, N) * C;
	const float *xn;
	loom__ll_rmsnorm_forward(a->xn1, C, a->rstd1, in, C, W(LL_ATTN_NORM), m->eps, Nl, C);
	xn = loom__fam_sp_gather(&m->f, a->xn1, N, C); /* sequence parallel: every row for the column-parallel projections */
	linear(a->q, Q, xn, C, W(LL_Q), W(LL_QB), N, C, Q);
	linear(a->k, KV, xn, C, W(LL_K), W(LL_KB), N, C, KV);
	linear(a->v, KV, xn, C, W(LL_V), W(LL_VB), N, C, KV);
	rope(m, a->q, B, T, nh, D, 0);
	rope(m, a->k, B, T, nkv, D, 0);
	attention_forward(m, a, B, T);
	/* x2 = in + atty Wo^T (+ bo after the row-parallel sum) */
	linear(m->f.ftmp, C, a->atty, Q, W(LL_O), NULL, N, Q, C);
	loom__fam_tp_reduce(&m->f, m->f.ftmp, (size_t)N * C, m->f.sp ? LOOM_TP_REDUCE_SCATTER : LOOM_TP_SUM);
	{
		const float *p = m->f.ftmp + o0, *bo = W(LL_OB);
#pragma omp parallel for schedule(static) if ((long)Nl * C >= 32768)
		for (int n = 0; n < Nl; n++) {
			const float *pr = p + (size_t)n * C, *xr = in + (size_t)n * C;
			float *o = a->x2 + (size_t)n * C;
#pragma omp simd
			for (int c = 0; c < C; c++)
				o[c] = xr[c] + pr[c] + (bo ? bo[c] : 0.0f);
		}
	}
	loom__ll_rmsnorm_forward(a->xn2, C, a->rstd2, a->x2, C, W(LL_MLP_NORM), m->eps, Nl, C);
	xn = loom__fam_sp_gather(&m->f, a->xn2, N, C);
	linear(a->g, I, xn, C, W(LL_GATE), W(LL_GATEB), N, C, I);
	linear(a->u, I, xn, C, W(LL_UP), W(LL_UPB), N, C, I);
	loom__ll_swiglu_forward(a->act, a->g, a->u, (size_t)N * I);
	if (!whole)
		return;
	linear(m->f.ftmp, C, a->act, I, W(LL_DOWN), NULL, N, I, C);
	loom__fam_tp_reduce(&m->f, m->f.ftmp, (size_t)N * C, m->f.sp ? LOOM_TP_REDUCE_SCATTER : LOOM_TP_SUM);
	{
		const float *p = m->f.ftmp + o0, *bd = W(LL_DOWNB);
#pragma omp parallel for schedule(static) if ((long)Nl * C >= 32768)
		for (int n = 0; n < Nl; n++) {
			const float *pr = p + (size_t)n * C, *xr = a->x2 + (size_t)n * C;
			float *o = out + (size_t)n * C;
#pragma omp simd
			for (int c = 0; c < C; c++)
				o[c] = xr[c] + pr[c] + (bd ? bd[c] : 0.0f);
		}
	}
}

void loom__ll_block_forward(loom__fam_t *f, int mb, int l, int B, int T)
{
	ll_t *m = M(f);
	ll_arena_t *ar = &m->arenas[mb];
	ll_layer_t *a = &ar->layers[l - m->f.lo];
	int N = B * T;
	loom__fam_param_use(&m->f, l, 0);
	block_forward_acts(m, l, a, block_in(m, ar, l, N), block_out(m, a, l, N), B, T, 1);
	if (m->f.sp && l == m->f.hi - 1 && m->f.has_head) /* the head's input is whole; a next stage's is not */
		loom__fam_tp_reduce(&m->f, a->out, (size_t)N * m->d.C, LOOM_TP_ALLGATHER);
}

/* The final norm of rows [r0, r0 + n) of N (a head-only stage under sequence parallelism gathers its
 * input whole first, as nanochat's). */
static void head_norm(ll_t *m, ll_arena_t *ar, int N, int r0, int n)
{
	int C = m->d.C;
	if (m->f.sp && m->f.lo == m->f.hi && !m->f.has_embed)
		loom__fam_tp_reduce(&m->f, ar->in, (size_t)N * C, LOOM_TP_ALLGATHER);
	loom__ll_rmsnorm_forward(ar->xf + (size_t)r0 * C, C, ar->rstdf + r0, stream(m, ar, m->f.hi) + (size_t)r0 * C, C,
	                         m->f.pview[m->norm_i], m->eps, n, C);
}

/* The vocab-parallel head (tp > 1, family.c): this rank's rows of the head's matrix hold ids
 * [v0, v0 + vl). */
static void tp_classifier(ll_t *m, float *losses, float *dx, float *dw, const float *x, const float *w,
                          const int *targets, float dloss, int N)
{
	loom__fam_tp_classifier(&m->f, losses, dx, dw, x, w, targets, dloss, N, m->d.C, m->f.tp_rank * m->d.vl, m->d.vl,
	                        NULL, 0.0f);
}

void loom__ll_head_forward(loom__fam_t *f, int mb, const int *targets, int B, int T, float *loss)
{
	ll_t *m = M(f);
	ll_arena_t *ar = &m->arenas[mb];
	int C = m->d.C, V = m->d.V, N = B * T;
	loom__fam_param_use(&m->f, m->d.L, 0);
	head_norm(m, ar, N, 0, N);
	const float *w = m->f.pview[m->head_i];
	if (targets && m->f.tp > 1) {
		tp_classifier(m, ar->losses, NULL, NULL, ar->xf, w, targets, 0.0f, N);
		if (loss)
			*loss = loom__fam_mean_loss(ar->losses, N, N);
	} else if (targets) {
		loom__classifier_forward_backward(ar->losses, NULL, NULL, m->f.logits, m->f.chunk, ar->xf, w, targets, 0.0f, N, C,
		                                  V);
		if (loss)
			*loss = loom__fam_mean_loss(ar->losses, N, N);
	} else {
		loom__gemm(0, 1, B, V, C, 1.0f, ar->xf + (size_t)(T - 1) * C, T * C, w, C, 0.0f, m->f.last_logits, V);
	}
}

void loom__ll_head_forward_backward(loom__fam_t *f, int mb, const int *targets, int N, int r0, int n,
                                    float grad_scale, float *loss)
{
	ll_t *m = M(f);
	ll_arena_t *ar = &m->arenas[mb];
	int C = m->d.C, V = m->d.V, hw = m->head_i;
	size_t o = (size_t)r0 * C;
	loom__fam_param_use(&m->f, m->d.L, 0);
	loom__fam_param_use(&m->f, m->d.L, 1);
	head_norm(m, ar, N, r0, n);
	loom__fam_zero(m->dxn + o, (size_t)n * C);
	if (m->f.tp > 1)
		tp_classifier(m, ar->losses + r0, m->dxn + o, m->f.gview[hw], ar->xf + o, m->f.pview[hw], targets + r0,
		              grad_scale / (float)N, n);
	else
		loom__classifier_forward_backward(ar->losses + r0, m->dxn + o, m->f.gview[hw], m->f.logits, m->f.chunk, ar->xf + o,
		                                  m->f.pview[hw], targets + r0, grad_scale / (float)N, n, C, V);
	if (loss)
		*loss = loom__fam_mean_loss(ar->losses + r0, n, N);
	loom__fam_zero(m->f.dres + o, (size_t)n * C);
	loom__fam_zero(m->dnw, (size_t)C);
	loom__ll_rmsnorm_backward(m->f.dres + o, C, m->dnw, m->dxn + o, C, stream(m, ar, m->f.hi) + o, C,
	                          m->f.pview[m->norm_i], ar->rstdf + r0, n, C);
	for (int c = 0; c < C; c++) /* every rank holds the whole rows here: no group sum */
		m->f.gview[m->norm_i][c] += m->dnw[c];
	if (!m->d.tied) /* reported once the head is done with its tensors (a strategy may move them then) */
		loom__fam_ready(&m->f, hw);
	loom__fam_ready(&m->f, m->norm_i);
	if (m->d.tied && !m->f.has_embed)
		loom__fam_ready(&m->f, 0); /* this model adds nothing else to embed_tokens */
}

static void recompute(ll_t *m, int l, ll_layer_t *a, const float *in, int B, int T)
{
	if (m->f.act_ckpt == LOOM_ACT_CKPT_BLOCKS)
		block_forward_acts(m, l, a, in, NULL, B, T, 0);
	else if (m->f.act_ckpt == LOOM_ACT_CKPT_SELECTIVE)
		attention_forward(m, a, B, T);
	else
		return;
	m->f.recomputes++;
}

void loom__ll_block_backward(loom__fam_t *f, int mb, int l, int B, int T)
{
	ll_t *m = M(f);
	ll_arena_t *ar = &m->arenas[mb];
	const ll_dims_t *d = &m->d;
	int C = d->C, N = B * T, D = d->D, nh = d->nh, nkv = d->nkv, Q = nh * D, KV = nkv * D, I = d->il;
	int Nl = loom__fam_sp_rows(&m->f, N);
	size_t o0 = loom__fam_sp_row0(&m->f, N) * C;
	ll_layer_t *a = &ar->layers[l - m->f.lo];
	const float *in = block_in(m, ar, l, N), *xn;
	float *dres = m->f.dres + o0, *dx2 = m->dx2 + o0, *dxn = m->dxn + o0; /* this rank's rows */
	loom__fam_param_use(&m->f, l, 1);
	recompute(m, l, a, in, B, T);
	/* MLP: out = x2 + (silu(xn2 Wg^T) * (xn2 Wu^T)) Wd^T + bd. Sequence parallel: the stream gradient of
	 * every row for the row-parallel down, the column-parallel input gradient reduce-scattered */
	if (m->f.sp)
		loom__fam_tp_reduce(&m->f, m->f.dres, (size_t)N * C, LOOM_TP_ALLGATHER);
	loom__fam_zero(m->dact, (size_t)N * I);
	linear_backward(m->dact, I, G(LL_DOWN), G(LL_DOWNB), m->f.dres, C, a->act, I, W(LL_DOWN), N, I, C);
	loom__fam_ready(&m->f, LT(LL_DOWNB));
	loom__fam_ready(&m->f, LT(LL_DOWN));
	loom__fam_zero(m->dg, (size_t)N * I);
	loom__fam_zero(m->du, (size_t)N * I);
	loom__ll_swiglu_backward(m->dg, m->du, m->dact, a->g, a->u, (size_t)N * I);
	loom__fam_zero(m->dxn, (size_t)N * C);
	xn = loom__fam_sp_gather(&m->f, a->xn2, N, C);
	linear_backward(m->dxn, C, G(LL_UP), G(LL_UPB), m->du, I, xn, C, W(LL_UP), N, C, I);
	loom__fam_ready(&m->f, LT(LL_UPB));
	loom__fam_ready(&m->f, LT(LL_UP));
	linear_backward(m->dxn, C, G(LL_GATE), G(LL_GATEB), m->dg, I, xn, C, W(LL_GATE), N, C, I);
	loom__fam_ready(&m->f, LT(LL_GATEB));
	loom__fam_ready(&m->f, LT(LL_GATE));
	loom__fam_tp_reduce(&m->f, m->dxn, (size_t)N * C, m->f.sp ? LOOM_TP_REDUCE_SCATTER : LOOM_TP_SUM);
	memcpy(dx2, dres, sizeof(float) * (size_t)Nl * C);
	loom__fam_zero(m->dnw, (size_t)C);
	loom__ll_rmsnorm_backward(dx2, C, m->dnw, dxn, C, a->x2, C, W(LL_MLP_NORM), a->rstd2, Nl, C);
	norm_grad_add(m, G(LL_MLP_NORM));
	loom__fam_ready(&m->f, LT(LL_MLP_NORM));
	/* attention: x2 = in + atty Wo^T + bo (sequence parallel: dx2 of every row for the row-parallel o) */
	if (m->f.sp)
		loom__fam_tp_reduce(&m->f, m->dx2, (size_t)N * C, LOOM_TP_ALLGATHER);
	loom__fam_zero(m->datty, (size_t)N * Q);
	linear_backward(m->datty, Q, G(LL_O), G(LL_OB), m->dx2, C, a->atty, Q, W(LL_O), N, Q, C);
	loom__fam_ready(&m->f, LT(LL_OB));
	loom__fam_ready(&m->f, LT(LL_O));
	loom__fam_zero(m->dq, (size_t)N * Q);
	loom__fam_zero(m->dk, (size_t)N * KV);
	loom__fam_zero(m->dv, (size_t)N * KV);
	attention_backward(m, a, B, T);
	rope(m, m->dq, B, T, nh, D, 1);
	rope(m, m->dk, B, T, nkv, D, 1);
	loom__fam_zero(m->dxn, (size_t)N * C);
	xn = loom__fam_sp_gather(&m->f, a->xn1, N, C);
	linear_backward(m->dxn, C, G(LL_V), G(LL_VB), m->dv, KV, xn, C, W(LL_V), N, C, KV);
	loom__fam_ready(&m->f, LT(LL_VB));
	loom__fam_ready(&m->f, LT(LL_V));
	linear_backward(m->dxn, C, G(LL_K), G(LL_KB), m->dk, KV, xn, C, W(LL_K), N, C, KV);
	loom__fam_ready(&m->f, LT(LL_KB));
	loom__fam_ready(&m->f, LT(LL_K));
	linear_backward(m->dxn, C, G(LL_Q), G(LL_QB), m->dq, Q, xn, C, W(LL_Q), N, C, Q);
	loom__fam_ready(&m->f, LT(LL_QB));
	loom__fam_ready(&m->f, LT(LL_Q));
	loom__fam_tp_reduce(&m->f, m->dxn, (size_t)N * C, m->f.sp ? LOOM_TP_REDUCE_SCATTER : LOOM_TP_SUM);
	/* the stream's gradient: dx2 (the residual) + the norm's backward, into dres */
	memcpy(dres, dx2, sizeof(float) * (size_t)Nl * C);
	loom__fam_zero(m->dnw, (size_t)C);
	loom__ll_rmsnorm_backward(dres, C, m->dnw, dxn, C, in, C, W(LL_ATTN_NORM), a->rstd1, Nl, C);
	norm_grad_add(m, G(LL_ATTN_NORM));
	loom__fam_ready(&m->f, LT(LL_ATTN_NORM));
	if (m->f.sp && l == m->f.lo && m->f.has_embed) /* the embedding's gradient is whole; a previous stage's is not */
		loom__fam_tp_reduce(&m->f, m->f.dres, (size_t)N * C, LOOM_TP_ALLGATHER);
}

void loom__ll_embed_backward(loom__fam_t *f, int mb, const int *inputs, int B, int T)
{
	ll_t *m = M(f);
	(void)mb;
	int C = m->d.C, N = B * T;
	loom__fam_param_use(&m->f, -1, 1);
	loom__rows_scatter_add(m->f.gview[0], C, m->f.dres, C, inputs, m->f.tp_rank * m->d.vl, m->d.vl, N, C);
	loom__fam_ready(&m->f, 0);
}

#undef LT
#undef W
#undef G

/* ---- the rest of the family's loom__fam_kind_t ------------------------------------------------------- */

float *loom__ll_stream(loom__fam_t *f, int mb, int l)
{
	return stream(M(f), &M(f)->arenas[mb], l);
}

