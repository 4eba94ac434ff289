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
 * group. With context parallelism (cp > 1) the T rows of a sequence are this rank's chunks of the
 * layout (kernels.h, loom__cp_chunk): the rotary embeddings take their positions and the attention runs over the group
 * (cp_attention.c). */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "core/util.h"
#include "model/fastmath.h"
#include "model/llama/llama_model.h"

typedef loom_llama_t ll_t;

#define M(mm) ((ll_t *)(mm))
#define CM(mm) ((const ll_t *)(mm))

/* ---- checks -------------------------------------------------------------------------------------- */

static int check_tokens(const ll_t *m, const int *ids, int n, int T, const char *what)
{
	int V = m->d.V;
	if (!ids)
		return loom_seterr(LOOM_EINVAL, "llama: %s is NULL", what);
	for (int i = 0; i < n; i++)
		if (ids[i] < 0 || ids[i] >= V)
			return loom_seterr(LOOM_EINVAL, "llama: token id %d at %s[b=%d][t=%d] is outside the vocabulary [0, %d)",
			                   ids[i], what, i / T, i % T, V);
	return LOOM_OK;
}

static int check_unit(const ll_t *m, int mb, int unit, int B, int T, const char *op)
{
	int L = m->d.L;
	if (mb < 0 || mb >= m->narenas)
		return loom_seterr(LOOM_EINVAL, "llama %s: arena %d out of range [0, %d)", op, mb, m->narenas);
	if (unit < 0 && !m->has_embed)
		return loom_seterr(LOOM_EINVAL, "llama %s: the model does not hold the embedding (blocks [%d, %d))", op, m->lo,
		                   m->hi);
	if (unit >= 0 && unit < L && (unit < m->lo || unit >= m->hi))
		return loom_seterr(LOOM_EINVAL, "llama %s: block %d is not held (blocks [%d, %d))", op, unit, m->lo, m->hi);
	if (unit >= L && !m->has_head)
		return loom_seterr(LOOM_EINVAL, "llama %s: the model does not hold the head (blocks [%d, %d) of %d)", op,
		                   m->lo, m->hi, L);
	if (m->tp > 1 && !m->tp_reduce)
		return loom_seterr(LOOM_EINVAL, "llama %s: tensor-parallel rank %d of %d has no reduction", op, m->tp_rank,
		                   m->tp);
	if (B <= 0 || T <= 0 || B > m->B || T > m->T)
		return loom_seterr(LOOM_EINVAL, "llama %s: batch %d x %d tokens does not fit the model's %d x %d", op, B, T,
		                   m->B, m->T);
	if (m->sp && (B * T) % m->tp != 0)
		return loom_seterr(LOOM_EINVAL, "llama %s: sequence parallelism: the %d x %d positions are not divisible by "
		                   "tp = %d", op, B, T, m->tp);
	if (m->cp > 1 && !m->cp_fn)
		return loom_seterr(LOOM_EINVAL, "llama %s: context-parallel rank %d of %d has no gather", op, m->cp_rank,
		                   m->cp);
	if (m->cp > 1 && T % 2 != 0)
		return loom_seterr(LOOM_EINVAL, "llama %s: context parallel: %d rows of each sequence are not two equal "
		                   "chunks (an even number is needed)", op, T);
	return LOOM_OK;
}

/* ---- helpers ---------------------------------------------------------------------------------------- */

static void param_use(ll_t *m, int unit, int phase)
{
	if (m->on_use)
		m->on_use(m->on_use_ctx, unit, phase);
}

static void ready(ll_t *m, int i)
{
	if (i >= 0 && m->on_ready)
		m->on_ready(m->on_ready_ctx, i);
}

static void tp_reduce(ll_t *m, float *buf, size_t n, loom_tp_op_t op)
{
	if (m->tp <= 1 || m->tp_err)
		return;
	int rc = m->tp_reduce(m->tp_ctx, buf, n, op);
	if (rc != LOOM_OK)
		m->tp_err = rc;
}

static void zero(float *p, size_t n)
{
	const size_t block = 16384;
#pragma omp parallel for schedule(static) if (n >= 4 * block)
	for (size_t i = 0; i < n; i += block)
		memset(p + i, 0, sizeof(float) * (n - i < block ? n - i : block));
}

static float *stream(const ll_t *m, const ll_arena_t *ar, int l)
{
	return l == m->lo ? ar->in : ar->layers[l - 1 - m->lo].out;
}

static size_t sp_row0(const ll_t *m, int N)
{
	return m->sp ? (size_t)m->tp_rank * (size_t)(N / m->tp) : 0;
}

static int sp_rows(const ll_t *m, int N)
{
	return m->sp ? N / m->tp : N;
}

/* Block l's input stream on this rank's rows, and its output (nanochat_passes.c's rule: with sequence
 * parallelism block lo's input and block hi-1's output are whole-sized). */
static float *block_in(const ll_t *m, const ll_arena_t *ar, int l, int N)
{
	return l == m->lo ? ar->in + sp_row0(m, N) * m->d.C : stream(m, ar, l);
}

static float *block_out(const ll_t *m, ll_layer_t *a, int l, int N)
{
	return l == m->hi - 1 ? a->out + sp_row0(m, N) * m->d.C : a->out;
}

/* x (N/tp,C) this rank's rows all-gathered into m->ftmp (N,C), returned; without sequence parallelism x. */
static const float *sp_gather(ll_t *m, const float *x, int N)
{
	int C = m->d.C;
	if (!m->sp)
		return x;
	memcpy(m->ftmp + sp_row0(m, N) * C, x, sizeof(float) * (size_t)(N / m->tp) * C);
	tp_reduce(m, m->ftmp, (size_t)N * C, LOOM_TP_ALLGATHER);
	return m->ftmp;
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
	if (m->sp)
		tp_reduce(m, m->dnw, (size_t)C, LOOM_TP_SUM);
	for (int c = 0; c < C; c++)
		gw[c] += m->dnw[c];
}

static void embed_forward(ll_t *m, ll_arena_t *ar, const int *inputs, int B, int T)
{
	int C = m->d.C, N = B * T;
	param_use(m, -1, 0);
	/* x = embed_tokens[tok] (vocab-parallel: each rank's rows, summed over the group) */
	loom__ll_gather(ar->in, m->pview[0], inputs, m->tp_rank * m->d.vl, m->d.vl, N, C);
	tp_reduce(m, ar->in, (size_t)N * C, LOOM_TP_SUM);
}

/* Rotary embeddings of B x T rows of H heads, in place (backward: the transpose): row t of a sequence at
 * position t, or with context parallelism at its chunk's. */
static void rope(ll_t *m, float *x, int B, int T, int H, int D, int backward)
{
	void (*f)(float *, const float *, const float *, int, int, int, int, int) =
	    backward ? loom__ll_rope_backward : loom__ll_rope_forward;
	if (m->cp <= 1) {
		f(x, m->cos, m->sin, B * T, T, 0, H, D);
		return;
	}
	int K = loom__cp_chunks_memo(&m->cfg, m->cp, T, &m->cp_T, &m->cp_K), c = T / K;
	for (int b = 0; b < B; b++)
		for (int h = 0; h < K; h++)
			f(x + ((size_t)b * T + (size_t)h * c) * H * D, m->cos, m->sin, c, c,
			  loom__cp_pos(h * c, T, m->cp, m->cp_rank, K), H, D);
}

static loom__cp_t cp_of(ll_t *m, int T)
{
	loom__cp_t cp = {.N = m->cp, .r = m->cp_rank, .K = loom__cp_chunks_memo(&m->cfg, m->cp, T, &m->cp_T, &m->cp_K),
	                 .ring = m->cp_ring, .fn = m->cp_fn, .ctx = m->cp_ctx, .mem = m->cp_mem, .scratch = m->att_scratch,
	                 .scratch_threads = m->att_threads};
	return cp;
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
	int Q = m->d.nh * m->d.D;
	loom__flash_t f = attn_shape(m, a, B, T);
	if (m->cp <= 1) {
		loom__flash_forward(&f, a->atty, Q, a->lse);
		return;
	}
	if (m->tp_err)
		return;
	loom__cp_t cp = cp_of(m, T);
	m->tp_err = loom__cp_attention_forward(&cp, &f, a->atty, Q, a->lse);
}

static void attention_backward(ll_t *m, ll_layer_t *a, int B, int T)
{
	int Q = m->d.nh * m->d.D, KV = m->d.nkv * m->d.D;
	loom__flash_t f = attn_shape(m, a, B, T);
	if (m->cp <= 1) {
		loom__flash_backward(&f, m->dq, Q, m->dk, m->dv, KV, m->datty, Q, a->atty, Q, a->lse, m->att_scratch,
		                     m->att_threads);
		return;
	}
	if (m->tp_err)
		return;
	loom__cp_t cp = cp_of(m, T);
	m->tp_err = loom__cp_attention_backward(&cp, &f, m->dq, Q, m->dk, m->dv, KV, m->datty, Q, a->atty, Q, a->lse);
}

#define LT(j) loom__ll_lt(&m->d, l, (j))
#define W(j) (LT(j) >= 0 ? m->pview[LT(j)] : NULL)
#define G(j) (LT(j) >= 0 ? m->gview[LT(j)] : NULL)

/* Block l's forward from the stream `in` into a; whole 0 stops after the MLP's activation (a
 * recomputation: the output is kept). */
static void block_forward_acts(ll_t *m, int l, ll_layer_t *a, const float *in, float *out, int B, int T, int whole)
{
	const ll_dims_t *d = &m->d;
	int C = d->C, N = B * T, D = d->D, nh = d->nh, nkv = d->nkv, Q = nh * D, KV = nkv * D, I = d->il;
	int Nl = sp_rows(m, N);
	size_t o0 = sp_row0(m, N) * C;
	const float *xn;
	loom__ll_rmsnorm_forward(a->xn1, C, a->rstd1, in, C, W(LL_ATTN_NORM), m->eps, Nl, C);
	xn = sp_gather(m, a->xn1, N); /* sequence parallel: every row for the column-parallel projections */
	linear(a->q, Q, xn, C, W(LL_Q), W(LL_QB), N, C, Q);
	linear(a->k, KV, xn, C, W(LL_K), W(LL_KB), N, C, KV);
	linear(a->v, KV, xn, C, W(LL_V), W(LL_VB), N, C, KV);
	rope(m, a->q, B, T, nh, D, 0);
	rope(m, a->k, B, T, nkv, D, 0);
	attention_forward(m, a, B, T);
	/* x2 = in + atty Wo^T (+ bo after the row-parallel sum) */
	linear(m->ftmp, C, a->atty, Q, W(LL_O), NULL, N, Q, C);
	tp_reduce(m, m->ftmp, (size_t)N * C, m->sp ? LOOM_TP_REDUCE_SCATTER : LOOM_TP_SUM);
	{
		const float *p = m->ftmp + o0, *bo = W(LL_OB);
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
	xn = sp_gather(m, a->xn2, N);
	linear(a->g, I, xn, C, W(LL_GATE), W(LL_GATEB), N, C, I);
	linear(a->u, I, xn, C, W(LL_UP), W(LL_UPB), N, C, I);
	loom__ll_swiglu_forward(a->act, a->g, a->u, (size_t)N * I);
	if (!whole)
		return;
	linear(m->ftmp, C, a->act, I, W(LL_DOWN), NULL, N, I, C);
	tp_reduce(m, m->ftmp, (size_t)N * C, m->sp ? LOOM_TP_REDUCE_SCATTER : LOOM_TP_SUM);
	{
		const float *p = m->ftmp + o0, *bd = W(LL_DOWNB);
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

static void block_forward(ll_t *m, ll_arena_t *ar, int l, int B, int T)
{
	ll_layer_t *a = &ar->layers[l - m->lo];
	int N = B * T;
	param_use(m, l, 0);
	block_forward_acts(m, l, a, block_in(m, ar, l, N), block_out(m, a, l, N), B, T, 1);
	if (m->sp && l == m->hi - 1 && m->has_head) /* the head's input is whole; a next stage's is not */
		tp_reduce(m, a->out, (size_t)N * m->d.C, LOOM_TP_ALLGATHER);
}

/* The final norm of rows [r0, r0 + n) of N (a head-only stage under sequence parallelism gathers its
 * input whole first, as nanochat's). */
static void head_norm(ll_t *m, ll_arena_t *ar, int N, int r0, int n)
{
	int C = m->d.C;
	if (m->sp && m->lo == m->hi && !m->has_embed)
		tp_reduce(m, ar->in, (size_t)N * C, LOOM_TP_ALLGATHER);
	loom__ll_rmsnorm_forward(ar->xf + (size_t)r0 * C, C, ar->rstdf + r0, stream(m, ar, m->hi) + (size_t)r0 * C, C,
	                         m->pview[m->norm_i], m->eps, n, C);
}

static float mean_loss(const float *losses, int n, int N)
{
	double s = 0.0;
	for (int i = 0; i < n; i++)
		s += losses[i];
	return (float)(s / N);
}

/* The vocab-parallel head (tp > 1): this rank's rows of the head's matrix hold ids [v0, v0 + vl). Per
 * chunk of positions the local logits, the group's row maxima, then the sums of exponentials and the
 * target logits (one reduction of both); with dx, dx (N,C) += the local dlogits W (partial sums,
 * reduced once at the end) and dw += dlogits^T x. The full logits never exist on one rank. */
static void tp_classifier(ll_t *m, float *losses, float *dx, float *dw, const float *x, const float *w,
                          const int *targets, float dloss, int N)
{
	int C = m->d.C, v0 = m->tp_rank * m->d.vl, Vv = m->d.vl;
	for (int n0 = 0; n0 < N; n0 += m->chunk) {
		int nc = LOOM_MIN(m->chunk, N - n0);
		float *mx = m->tp_stats, *sums = m->tp_stats + nc, *z = m->logits;
		loom__gemm(0, 1, nc, Vv, C, 1.0f, x + (size_t)n0 * C, C, w, C, 0.0f, z, Vv);
		for (int i = 0; i < nc; i++) {
			const float *zi = z + (size_t)i * Vv;
			float v = -INFINITY;
#pragma omp simd reduction(max : v)
			for (int j = 0; j < Vv; j++)
				v = zi[j] > v ? zi[j] : v;
			mx[i] = v;
		}
		tp_reduce(m, mx, (size_t)nc, LOOM_TP_MAX);
#pragma omp parallel for schedule(static) if ((long)nc * Vv >= 32768)
		for (int i = 0; i < nc; i++) {
			const float *zi = z + (size_t)i * Vv;
			float s = 0.0f;
			int t = targets[n0 + i] - v0;
#pragma omp simd reduction(+ : s)
			for (int j = 0; j < Vv; j++)
				s += fast_expf(zi[j] - mx[i]);
			sums[2 * i] = s;
			sums[2 * i + 1] = t >= 0 && t < Vv ? zi[t] : 0.0f;
		}
		tp_reduce(m, sums, 2 * (size_t)nc, LOOM_TP_SUM);
		for (int i = 0; i < nc; i++)
			losses[n0 + i] = logf(sums[2 * i]) + mx[i] - sums[2 * i + 1];
		if (!dx)
			continue;
#pragma omp parallel for schedule(static) if ((long)nc * Vv >= 32768)
		for (int i = 0; i < nc; i++) {
			float *zi = z + (size_t)i * Vv, g = dloss / sums[2 * i];
			int t = targets[n0 + i] - v0;
#pragma omp simd
			for (int j = 0; j < Vv; j++)
				zi[j] = g * fast_expf(zi[j] - mx[i]) - (j == t ? dloss : 0.0f);
		}
		loom__gemm(0, 0, nc, C, Vv, 1.0f, z, Vv, w, C, 1.0f, dx + (size_t)n0 * C, C);
		loom__gemm(1, 0, Vv, C, nc, 1.0f, z, Vv, x + (size_t)n0 * C, C, 1.0f, dw, C);
	}
	if (dx)
		tp_reduce(m, dx, (size_t)N * C, LOOM_TP_SUM);
}

static void head_forward(ll_t *m, ll_arena_t *ar, const int *targets, int B, int T, float *loss)
{
	int C = m->d.C, V = m->d.V, N = B * T;
	param_use(m, m->d.L, 0);
	head_norm(m, ar, N, 0, N);
	const float *w = m->pview[m->head_i];
	if (targets && m->tp > 1) {
		tp_classifier(m, ar->losses, NULL, NULL, ar->xf, w, targets, 0.0f, N);
		if (loss)
			*loss = mean_loss(ar->losses, N, N);
	} else if (targets) {
		loom__classifier_forward_backward(ar->losses, NULL, NULL, m->logits, m->chunk, ar->xf, w, targets, 0.0f, N, C,
		                                  V);
		if (loss)
			*loss = mean_loss(ar->losses, N, N);
	} else {
		loom__gemm(0, 1, B, V, C, 1.0f, ar->xf + (size_t)(T - 1) * C, T * C, w, C, 0.0f, m->last_logits, V);
	}
}

static void head_forward_backward(ll_t *m, ll_arena_t *ar, const int *targets, int N, int r0, int n, float grad_scale,
                                  float *loss)
{
	int C = m->d.C, V = m->d.V, hw = m->head_i;
	size_t o = (size_t)r0 * C;
	param_use(m, m->d.L, 0);
	param_use(m, m->d.L, 1);
	head_norm(m, ar, N, r0, n);
	zero(m->dxn + o, (size_t)n * C);
	if (m->tp > 1)
		tp_classifier(m, ar->losses + r0, m->dxn + o, m->gview[hw], ar->xf + o, m->pview[hw], targets + r0,
		              grad_scale / (float)N, n);
	else
		loom__classifier_forward_backward(ar->losses + r0, m->dxn + o, m->gview[hw], m->logits, m->chunk, ar->xf + o,
		                                  m->pview[hw], targets + r0, grad_scale / (float)N, n, C, V);
	if (loss)
		*loss = mean_loss(ar->losses + r0, n, N);
	zero(m->dres + o, (size_t)n * C);
	zero(m->dnw, (size_t)C);
	loom__ll_rmsnorm_backward(m->dres + o, C, m->dnw, m->dxn + o, C, stream(m, ar, m->hi) + o, C,
	                          m->pview[m->norm_i], ar->rstdf + r0, n, C);
	for (int c = 0; c < C; c++) /* every rank holds the whole rows here: no group sum */
		m->gview[m->norm_i][c] += m->dnw[c];
	if (!m->d.tied) /* reported once the head is done with its tensors (a strategy may move them then) */
		ready(m, hw);
	ready(m, m->norm_i);
	if (m->d.tied && !m->has_embed)
		ready(m, 0); /* this model adds nothing else to embed_tokens */
}

static void recompute(ll_t *m, int l, ll_layer_t *a, const float *in, int B, int T)
{
	if (m->act_ckpt == LOOM_ACT_CKPT_BLOCKS)
		block_forward_acts(m, l, a, in, NULL, B, T, 0);
	else if (m->act_ckpt == LOOM_ACT_CKPT_SELECTIVE)
		attention_forward(m, a, B, T);
	else
		return;
	m->recomputes++;
}

static void block_backward(ll_t *m, ll_arena_t *ar, int l, int B, int T)
{
	const ll_dims_t *d = &m->d;
	int C = d->C, N = B * T, D = d->D, nh = d->nh, nkv = d->nkv, Q = nh * D, KV = nkv * D, I = d->il;
	int Nl = sp_rows(m, N);
	size_t o0 = sp_row0(m, N) * C;
	ll_layer_t *a = &ar->layers[l - m->lo];
	const float *in = block_in(m, ar, l, N), *xn;
	float *dres = m->dres + o0, *dx2 = m->dx2 + o0, *dxn = m->dxn + o0; /* this rank's rows */
	param_use(m, l, 1);
	recompute(m, l, a, in, B, T);
	/* MLP: out = x2 + (silu(xn2 Wg^T) * (xn2 Wu^T)) Wd^T + bd. Sequence parallel: the stream gradient of
	 * every row for the row-parallel down, the column-parallel input gradient reduce-scattered */
	if (m->sp)
		tp_reduce(m, m->dres, (size_t)N * C, LOOM_TP_ALLGATHER);
	zero(m->dact, (size_t)N * I);
	linear_backward(m->dact, I, G(LL_DOWN), G(LL_DOWNB), m->dres, C, a->act, I, W(LL_DOWN), N, I, C);
	ready(m, LT(LL_DOWNB));
	ready(m, LT(LL_DOWN));
	zero(m->dg, (size_t)N * I);
	zero(m->du, (size_t)N * I);
	loom__ll_swiglu_backward(m->dg, m->du, m->dact, a->g, a->u, (size_t)N * I);
	zero(m->dxn, (size_t)N * C);
	xn = sp_gather(m, a->xn2, N);
	linear_backward(m->dxn, C, G(LL_UP), G(LL_UPB), m->du, I, xn, C, W(LL_UP), N, C, I);
	ready(m, LT(LL_UPB));
	ready(m, LT(LL_UP));
	linear_backward(m->dxn, C, G(LL_GATE), G(LL_GATEB), m->dg, I, xn, C, W(LL_GATE), N, C, I);
	ready(m, LT(LL_GATEB));
	ready(m, LT(LL_GATE));
	tp_reduce(m, m->dxn, (size_t)N * C, m->sp ? LOOM_TP_REDUCE_SCATTER : LOOM_TP_SUM);
	memcpy(dx2, dres, sizeof(float) * (size_t)Nl * C);
	zero(m->dnw, (size_t)C);
	loom__ll_rmsnorm_backward(dx2, C, m->dnw, dxn, C, a->x2, C, W(LL_MLP_NORM), a->rstd2, Nl, C);
	norm_grad_add(m, G(LL_MLP_NORM));
	ready(m, LT(LL_MLP_NORM));
	/* attention: x2 = in + atty Wo^T + bo (sequence parallel: dx2 of every row for the row-parallel o) */
	if (m->sp)
		tp_reduce(m, m->dx2, (size_t)N * C, LOOM_TP_ALLGATHER);
	zero(m->datty, (size_t)N * Q);
	linear_backward(m->datty, Q, G(LL_O), G(LL_OB), m->dx2, C, a->atty, Q, W(LL_O), N, Q, C);
	ready(m, LT(LL_OB));
	ready(m, LT(LL_O));
	zero(m->dq, (size_t)N * Q);
	zero(m->dk, (size_t)N * KV);
	zero(m->dv, (size_t)N * KV);
	attention_backward(m, a, B, T);
	rope(m, m->dq, B, T, nh, D, 1);
	rope(m, m->dk, B, T, nkv, D, 1);
	zero(m->dxn, (size_t)N * C);
	xn = sp_gather(m, a->xn1, N);
	linear_backward(m->dxn, C, G(LL_V), G(LL_VB), m->dv, KV, xn, C, W(LL_V), N, C, KV);
	ready(m, LT(LL_VB));
	ready(m, LT(LL_V));
	linear_backward(m->dxn, C, G(LL_K), G(LL_KB), m->dk, KV, xn, C, W(LL_K), N, C, KV);
	ready(m, LT(LL_KB));
	ready(m, LT(LL_K));
	linear_backward(m->dxn, C, G(LL_Q), G(LL_QB), m->dq, Q, xn, C, W(LL_Q), N, C, Q);
	ready(m, LT(LL_QB));
	ready(m, LT(LL_Q));
	tp_reduce(m, m->dxn, (size_t)N * C, m->sp ? LOOM_TP_REDUCE_SCATTER : LOOM_TP_SUM);
	/* the stream's gradient: dx2 (the residual) + the norm's backward, into dres */
	memcpy(dres, dx2, sizeof(float) * (size_t)Nl * C);
	zero(m->dnw, (size_t)C);
	loom__ll_rmsnorm_backward(dres, C, m->dnw, dxn, C, in, C, W(LL_ATTN_NORM), a->rstd1, Nl, C);
	norm_grad_add(m, G(LL_ATTN_NORM));
	ready(m, LT(LL_ATTN_NORM));
	if (m->sp && l == m->lo && m->has_embed) /* the embedding's gradient is whole; a previous stage's is not */
		tp_reduce(m, m->dres, (size_t)N * C, LOOM_TP_ALLGATHER);
}

static void embed_backward(ll_t *m, const int *inputs, int B, int T)
{
	int C = m->d.C, N = B * T;
	param_use(m, -1, 1);
	loom__ll_scatter_add(m->gview[0], m->dres, inputs, m->tp_rank * m->d.vl, m->d.vl, N, C);
	ready(m, 0);
}

#undef LT
#undef W
#undef G

/* ---- public unit calls ---------------------------------------------------------------------------- */

static int status(ll_t *m)
{
	int rc = m->tp_err, grc = loom__gemm_status(&m->gemm);
	m->tp_err = 0;
	return rc ? rc : grc;
}

int loom__ll_embed_forward(loom_model_t *mm, int mb, const int *inputs, int B, int T)
{
	ll_t *m = M(mm);
	int rc;
	if ((rc = check_unit(m, mb, -1, B, T, "embed_forward")) != LOOM_OK ||
	    (rc = check_tokens(m, inputs, B * T, T, "inputs")) != LOOM_OK)
		return rc;
	loom__gemm_setup(&m->gemm);
	embed_forward(m, &m->arenas[mb], inputs, B, T);
	return status(m);
}

static int check_block(const ll_t *m, int mb, int l, int B, int T, const char *op)
{
	if (l < m->lo || l >= m->hi)
		return loom_seterr(LOOM_EINVAL, "llama %s: block %d is not held (blocks [%d, %d))", op, l, m->lo, m->hi);
	return check_unit(m, mb, l, B, T, op);
}

int loom__ll_block_forward(loom_model_t *mm, int mb, int l, int B, int T)
{
	ll_t *m = M(mm);
	int rc;
	if ((rc = check_block(m, mb, l, B, T, "block_forward")) != LOOM_OK)
		return rc;
	loom__gemm_setup(&m->gemm);
	block_forward(m, &m->arenas[mb], l, B, T);
	return status(m);
}

int loom__ll_head_forward(loom_model_t *mm, int mb, const int *targets, int B, int T, float *loss)
{
	ll_t *m = M(mm);
	int rc;
	if ((rc = check_unit(m, mb, m->d.L, B, T, "head_forward")) != LOOM_OK ||
	    (targets && (rc = check_tokens(m, targets, B * T, T, "targets")) != LOOM_OK))
		return rc;
	if ((m->tp > 1 || m->cp > 1) && !targets)
		return loom_seterr(LOOM_EINVAL, "llama head_forward: a %s-parallel model computes losses only",
		                   m->tp > 1 ? "tensor" : "context");
	loom__gemm_setup(&m->gemm);
	head_forward(m, &m->arenas[mb], targets, B, T, loss);
	return status(m);
}

int loom__ll_head_forward_backward_rows(loom_model_t *mm, int mb, const int *targets, int B, int T, int row0,
                                        int rows, float grad_scale, float *loss)
{
	ll_t *m = M(mm);
	int rc;
	if ((rc = check_unit(m, mb, m->d.L, B, T, "head_forward_backward")) != LOOM_OK)
		return rc;
	if (row0 < 0 || rows < 1 || row0 > B * T - rows)
		return loom_seterr(LOOM_EINVAL, "llama head_forward_backward_rows: rows [%d, %d) of a batch of %d x %d "
		                   "positions", row0, row0 + rows, B, T);
	if (!targets)
		return loom_seterr(LOOM_EINVAL, "llama head_forward_backward: targets are NULL");
	if ((rc = check_tokens(m, targets + row0, rows, T, "targets")) != LOOM_OK)
		return rc;
	loom__gemm_setup(&m->gemm);
	head_forward_backward(m, &m->arenas[mb], targets, B * T, row0, rows, grad_scale, loss);
	return status(m);
}

int loom__ll_head_forward_backward(loom_model_t *mm, int mb, const int *targets, int B, int T, float grad_scale,
                                   float *loss)
{
	if (B <= 0 || T <= 0)
		return loom_seterr(LOOM_EINVAL, "llama head_forward_backward: batch %d x %d", B, T);
	return loom__ll_head_forward_backward_rows(mm, mb, targets, B, T, 0, B * T, grad_scale, loss);
}

int loom__ll_block_backward(loom_model_t *mm, int mb, int l, int B, int T)
{
	ll_t *m = M(mm);
	int rc;
	if ((rc = check_block(m, mb, l, B, T, "block_backward")) != LOOM_OK)
		return rc;
	loom__gemm_setup(&m->gemm);
	block_backward(m, &m->arenas[mb], l, B, T);
	return status(m);
}

int loom__ll_embed_backward(loom_model_t *mm, int mb, const int *inputs, int B, int T)
{
	ll_t *m = M(mm);
	int rc;
	if ((rc = check_unit(m, mb, -1, B, T, "embed_backward")) != LOOM_OK ||
	    (rc = check_tokens(m, inputs, B * T, T, "inputs")) != LOOM_OK)
		return rc;
	loom__gemm_setup(&m->gemm);
	embed_backward(m, inputs, B, T);
	return status(m);
}

float *loom__ll_block_input(loom_model_t *mm, int mb, int l)
{
	ll_t *m = M(mm);
	if (mb < 0 || mb >= m->narenas || l < m->lo || l > m->hi)
		return NULL;
	return stream(m, &m->arenas[mb], l);
}

float *loom__ll_stream_grad(loom_model_t *m)
{
	return M(m)->dres;
}

/* ---- the whole model -------------------------------------------------------------------------------- */

static int check_call(const ll_t *m, const int *inputs, const int *targets, int B, int T, const char *op)
{
	int rc;
	if (!m->has_embed || !m->has_head)
		return loom_seterr(LOOM_EINVAL, "llama %s: needs every layer, the model holds blocks [%d, %d) of %d", op,
		                   m->lo, m->hi, m->d.L);
	if ((rc = check_unit(m, 0, -1, B, T, op)) != LOOM_OK)
		return rc;
	if ((m->tp > 1 || m->cp > 1) && !targets)
		return loom_seterr(LOOM_EINVAL, "llama %s: a %s-parallel model computes losses only", op,
		                   m->tp > 1 ? "tensor" : "context");
	if ((rc = check_tokens(m, inputs, B * T, T, "inputs")) != LOOM_OK)
		return rc;
	if (targets && (rc = check_tokens(m, targets, B * T, T, "targets")) != LOOM_OK)
		return rc;
	return LOOM_OK;
}

int loom__ll_forward(loom_model_t *mm, const int *inputs, const int *targets, int B, int T, float *loss)
{
	ll_t *m = M(mm);
	ll_arena_t *ar = &m->arenas[0];
	int rc;
	if ((rc = check_call(m, inputs, targets, B, T, "forward")) != LOOM_OK)
		return rc;
	loom__gemm_setup(&m->gemm);
	embed_forward(m, ar, inputs, B, T);
	for (int l = 0; l < m->d.L; l++)
		block_forward(m, ar, l, B, T);
	head_forward(m, ar, targets, B, T, loss);
	return status(m);
}

const float *loom__ll_last_logits(const loom_model_t *m)
{
	return CM(m)->last_logits;
}

void loom__ll_zero_grad(loom_model_t *mm)
{
	ll_t *m = M(mm);
	if (!m->grad_split) {
		if (m->grads)
			zero(m->grads, m->nparams);
		return;
	}
	for (int i = 0; i < m->ntensors; i++)
		if (m->gview[i])
			zero(m->gview[i], m->tensors[i].numel);
}

int loom__ll_forward_backward(loom_model_t *mm, const int *inputs, const int *targets, int B, int T, float grad_scale,
                              float *loss)
{
	ll_t *m = M(mm);
	ll_arena_t *ar = &m->arenas[0];
	int rc, L = m->d.L;
	if (!targets)
		return loom_seterr(LOOM_EINVAL, "llama forward_backward: targets are NULL");
	if ((rc = check_call(m, inputs, targets, B, T, "forward_backward")) != LOOM_OK)
		return rc;
	loom__gemm_setup(&m->gemm);
	embed_forward(m, ar, inputs, B, T);
	for (int l = 0; l < L; l++)
		block_forward(m, ar, l, B, T);
	head_forward_backward(m, ar, targets, B * T, 0, B * T, grad_scale, loss);
	for (int l = L - 1; l >= 0; l--)
		block_backward(m, ar, l, B, T);
	embed_backward(m, inputs, B, T);
	return status(m);
}
