/* nanochat_passes.c: nanochat's passes (nanochat_model.h): the checks of each call, the embedding's,
 * a block's and the head's forward and backward on an arena, the vocab-parallel head, and the
 * whole-model passes composed of them. The invariants are nanochat.c's: no allocation, kernels
 * reach tensors only through the views after the unit's param-use hook, grad-ready once per tensor
 * per micro-step in decreasing index order, one micro-batch's backward at a time. With context
 * parallelism (cp > 1) the T rows of a sequence are this rank's chunks of the layout (kernels.h,
 * loom__cp_chunk: head-tail pairs, K of them per rank): the rotary embeddings take their positions and the attention runs over the group (cp_attention.c). */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "core/util.h"
#include "model/fastmath.h"
#include "model/nanochat/nanochat_model.h"

typedef loom_nanochat_t nc_t;

#define M(mm) ((nc_t *)(mm))
#define CM(mm) ((const nc_t *)(mm))

/* ---- checks -------------------------------------------------------------------------------------- */

static int check_tokens(const nc_t *m, const int *ids, int n, int T, const char *what)
{
	int V = m->d.V;
	if (!ids)
		return loom_seterr(LOOM_EINVAL, "nanochat: %s is NULL", what);
	for (int i = 0; i < n; i++)
		if (ids[i] < 0 || ids[i] >= V)
			return loom_seterr(LOOM_EINVAL, "nanochat: token id %d at %s[b=%d][t=%d] is outside the vocabulary [0, %d)",
			                   ids[i], what, i / T, i % T, V);
	return LOOM_OK;
}

static int check_unit(const nc_t *m, int mb, int unit, int B, int T, const char *op)
{
	int L = m->d.L;
	if (mb < 0 || mb >= m->narenas)
		return loom_seterr(LOOM_EINVAL, "nanochat %s: arena %d out of range [0, %d)", op, mb, m->narenas);
	if (unit < 0 && !m->has_embed)
		return loom_seterr(LOOM_EINVAL, "nanochat %s: the model does not hold the embedding (blocks [%d, %d))", op,
		                   m->lo, m->hi);
	if (unit >= 0 && unit < L && (unit < m->lo || unit >= m->hi))
		return loom_seterr(LOOM_EINVAL, "nanochat %s: block %d is not held (blocks [%d, %d))", op, unit, m->lo, m->hi);
	if (unit >= L && !m->has_head)
		return loom_seterr(LOOM_EINVAL, "nanochat %s: the model does not hold the head (blocks [%d, %d) of %d)", op,
		                   m->lo, m->hi, L);
	if (m->tp > 1 && !m->tp_reduce)
		return loom_seterr(LOOM_EINVAL, "nanochat %s: tensor-parallel rank %d of %d has no reduction", op, m->tp_rank,
		                   m->tp);
	if (B <= 0 || T <= 0 || B > m->B || T > m->T)
		return loom_seterr(LOOM_EINVAL, "nanochat %s: batch %d x %d tokens does not fit the model's %d x %d", op, B, T,
		                   m->B, m->T);
	if (m->sp && (B * T) % m->tp != 0)
		return loom_seterr(LOOM_EINVAL, "nanochat %s: sequence parallelism: the %d x %d positions are not divisible "
		                   "by tp = %d", op, B, T, m->tp);
	if (m->cp > 1 && !m->cp_fn)
		return loom_seterr(LOOM_EINVAL, "nanochat %s: context-parallel rank %d of %d has no gather", op, m->cp_rank,
		                   m->cp);
	if (m->cp > 1 && T % 2 != 0)
		return loom_seterr(LOOM_EINVAL, "nanochat %s: context parallel: %d rows of each sequence are not two equal "
		                   "chunks (an even number is needed)", op, T);
	return LOOM_OK;
}

/* ---- the units' passes ------------------------------------------------------------------------------ */

void loom__nc_param_use(nc_t *m, int unit, int phase)
{
	if (m->on_use)
		m->on_use(m->on_use_ctx, unit, phase);
}

static void ready(nc_t *m, int i)
{
	if (i >= 0 && m->on_ready)
		m->on_ready(m->on_ready_ctx, i);
}

void loom__nc_tp_reduce(nc_t *m, float *buf, size_t n, loom_tp_op_t op)
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

static float *stream(const nc_t *m, const nc_arena_t *ar, int l)
{
	return l == m->lo ? ar->in : ar->layers[l - 1 - m->lo].out;
}

/* Sequence parallelism: the first of the rows [row0, row0 + N/tp) this rank's residual-side buffers
 * hold (0 without it), and their count. */
static size_t sp_row0(const nc_t *m, int N)
{
	return m->sp ? (size_t)m->tp_rank * (size_t)(N / m->tp) : 0;
}

static int sp_rows(const nc_t *m, int N)
{
	return m->sp ? N / m->tp : N;
}

/* Block l's input stream on this rank's rows, and its output. With sequence parallelism block lo's
 * input and block hi-1's output are whole-sized: the input whole after the embedding, this rank's rows
 * when a previous pipeline stage sent it; the output gathered whole only for a head on this stage (a
 * next stage takes this rank's rows: the pipeline passes each tp rank's rows to the same tp rank). */
static float *block_in(const nc_t *m, const nc_arena_t *ar, int l, int N)
{
	return l == m->lo ? ar->in + sp_row0(m, N) * 2 * m->d.C : stream(m, ar, l);
}

static float *block_out(const nc_t *m, nc_layer_t *a, int l, int N)
{
	return l == m->hi - 1 ? a->out + sp_row0(m, N) * 2 * m->d.C : a->out;
}

/* x (N/tp,C) this rank's rows, all-gathered into m->ftmp (N,C), which is returned; without sequence
 * parallelism x itself. */
static const float *sp_gather(nc_t *m, const float *x, int N)
{
	int C = m->d.C;
	if (!m->sp)
		return x;
	memcpy(m->ftmp + sp_row0(m, N) * C, x, sizeof(float) * (size_t)(N / m->tp) * C);
	loom__nc_tp_reduce(m, m->ftmp, (size_t)N * C, LOOM_TP_ALLGATHER);
	return m->ftmp;
}

static void embed_forward(nc_t *m, nc_arena_t *ar, const int *inputs, int B, int T)
{
	int C = m->d.C, N = B * T;
	loom__nc_param_use(m, -1, 0);
	memcpy(ar->tok, inputs, sizeof(int) * (size_t)N);
	ar->has_tok = 1;
	/* x = wte[tok] (vocab-parallel: each rank's rows, summed over the group), both halves rmsnorm(x) */
	loom__nc_gather(m->ftmp, C, m->pview[NC_WTE], C, inputs, m->tp_rank * m->d.vl, m->d.vl, N, C);
	loom__nc_tp_reduce(m, m->ftmp, (size_t)N * C, LOOM_TP_SUM);
	loom__nc_rmsnorm_forward(ar->in + C, 2 * C, ar->rstd0, m->ftmp, C, N, C);
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

/* Rotary embeddings of B x T rows of H heads, in place (backward: the transpose): row t of a sequence at
 * position t, or with context parallelism at its chunk's (the rows' two chunks, each contiguous). */
static void rope(nc_t *m, float *x, int B, int T, int H, int D, int backward)
{
	void (*f)(float *, const float *, const float *, int, int, int, int, int) =
	    backward ? loom__nc_rope_backward : loom__nc_rope_forward;
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

/* Context parallel: the attention's group, form, hook and scratch. */
static loom__cp_t cp_of(nc_t *m, int T)
{
	loom__cp_t cp = {.N = m->cp, .r = m->cp_rank, .K = loom__cp_chunks_memo(&m->cfg, m->cp, T, &m->cp_T, &m->cp_K),
	                 .ring = m->cp_ring, .fn = m->cp_fn, .ctx = m->cp_ctx, .mem = m->cp_mem, .scratch = m->att_scratch,
	                 .scratch_threads = m->att_threads};
	return cp;
}

/* Block l's attention from a's q, k, v: one process's kernel, or the context-parallel group's (keys and
 * values of the whole sequence gathered; a failure of the hook is the pass's error). */
static void attention_forward(nc_t *m, int l, nc_layer_t *a, int B, int T)
{
	const nc_dims_t *d = &m->d;
	if (m->cp <= 1) {
		loom__nc_attention_forward(a->atty, a->lse, a->q, a->k, a->v, B, T, d->nh, d->nkv, d->D, m->window[l]);
		return;
	}
	if (m->tp_err)
		return;
	loom__cp_t cp = cp_of(m, T);
	loom__flash_t f = loom__nc_attention_shape(a->q, a->k, a->v, B, T, d->nh, d->nkv, d->D, m->window[l]);
	m->tp_err = loom__cp_attention_forward(&cp, &f, a->atty, d->nh * d->D, a->lse);
}

static void attention_backward(nc_t *m, int l, nc_layer_t *a, int B, int T)
{
	const nc_dims_t *d = &m->d;
	int Q = d->nh * d->D, KV = d->nkv * d->D;
	if (m->cp <= 1) {
		loom__nc_attention_backward(m->dq, m->dk, m->dv, m->att_scratch, m->att_threads, m->datty, a->q, a->k, a->v,
		                            a->atty, a->lse, B, T, d->nh, d->nkv, d->D, m->window[l]);
		return;
	}
	if (m->tp_err)
		return;
	loom__cp_t cp = cp_of(m, T);
	loom__flash_t f = loom__nc_attention_shape(a->q, a->k, a->v, B, T, d->nh, d->nkv, d->D, m->window[l]);
	m->tp_err = loom__cp_attention_backward(&cp, &f, m->dq, Q, m->dk, m->dv, KV, m->datty, Q, a->atty, Q, a->lse);
}

#define LT(l, j) loom__nc_lt(&m->cfg, (l), (j))
#define W(j) m->pview[LT(l, j)]
#define G(j) m->gview[LT(l, j)]

/* Block l's forward from the stream `in` (N,2C) with tokens tok, into a; whole 0 stops after the MLP's
 * activation (a recomputation: the output is kept). */
static void block_forward_acts(nc_t *m, int l, nc_layer_t *a, const float *in, float *out, const int *tok, int B,
                               int T, int whole)
{
	const nc_dims_t *d = &m->d;
	int C = d->C, N = B * T, D = d->D, nh = d->nh, nkv = d->nkv, Q = nh * D, KV = nkv * D, Hd = d->hid;
	int ve = loom__nc_has_ve(l, d->L), Nl = sp_rows(m, N);
	size_t o0 = sp_row0(m, N) * C;
	float r = m->pview[NC_RESID][l], z = m->pview[NC_X0][l];
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
	xn = sp_gather(m, a->xn1, N); /* sequence parallel: every row for the column-parallel projections */
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
	if (m->sp) { /* the row-parallel product reduce-scattered onto this rank's rows */
		linear(m->ftmp, C, a->atty, Q, W(NC_O), N, Q, C);
		loom__nc_tp_reduce(m, m->ftmp, (size_t)N * C, LOOM_TP_REDUCE_SCATTER);
		const float *p = m->ftmp + o0;
#pragma omp parallel for simd schedule(static) if ((long)Nl * C >= 32768)
		for (size_t i = 0; i < (size_t)Nl * C; i++)
			a->x2[i] = p[i] + a->xin[i];
	} else {
		linear(a->x2, C, a->atty, Q, W(NC_O), N, Q, C);
		loom__nc_tp_reduce(m, a->x2, (size_t)N * C, LOOM_TP_SUM);
#pragma omp parallel for simd schedule(static) if ((long)N * C >= 32768)
		for (size_t i = 0; i < (size_t)N * C; i++)
			a->x2[i] += a->xin[i];
	}
	loom__nc_rmsnorm_forward(a->xn2, C, a->rstd2, a->x2, C, Nl, C);
	xn = sp_gather(m, a->xn2, N);
	linear(a->fch, Hd, xn, C, W(NC_FC), N, C, Hd);
	loom__nc_relu2_forward(a->act, a->fch, (size_t)N * Hd);
	if (!whole)
		return;
	linear(m->ftmp, C, a->act, Hd, W(NC_P), N, Hd, C);
	loom__nc_tp_reduce(m, m->ftmp, (size_t)N * C, m->sp ? LOOM_TP_REDUCE_SCATTER : LOOM_TP_SUM);
#pragma omp parallel for schedule(static) if ((long)Nl * C >= 32768)
	for (int n = 0; n < Nl; n++) {
		const float *x2 = a->x2 + (size_t)n * C, *p = m->ftmp + o0 + (size_t)n * C, *x0 = in + (size_t)n * 2 * C + C;
		float *o = out + (size_t)n * 2 * C;
#pragma omp simd
		for (int c = 0; c < C; c++) {
			o[c] = x2[c] + p[c];
			o[C + c] = x0[c];
		}
	}
}

static void block_forward(nc_t *m, nc_arena_t *ar, int l, int B, int T)
{
	nc_layer_t *a = &ar->layers[l - m->lo];
	int N = B * T;
	loom__nc_param_use(m, l, 0);
	block_forward_acts(m, l, a, block_in(m, ar, l, N), block_out(m, a, l, N), ar->tok, B, T, 1);
	if (m->sp && l == m->hi - 1 && m->has_head) /* the head's input is whole; a next stage's is not */
		loom__nc_tp_reduce(m, a->out, (size_t)N * 2 * m->d.C, LOOM_TP_ALLGATHER);
}

/* The final rmsnorm of rows [r0, r0 + n) of N. A stage of the head alone (no block) under sequence
 * parallelism receives this rank's rows of its input (see block_in): they are gathered whole first, as
 * the head reads every row (rows a shared head leaves to the stage before may be stale: unread). */
static void head_norm(nc_t *m, nc_arena_t *ar, int N, int r0, int n)
{
	int C = m->d.C;
	if (m->sp && m->lo == m->hi && !m->has_embed)
		loom__nc_tp_reduce(m, ar->in, (size_t)N * 2 * C, LOOM_TP_ALLGATHER);
	loom__nc_rmsnorm_forward(ar->xf + (size_t)r0 * C, C, ar->rstdf + r0, stream(m, ar, m->hi) + (size_t)r0 * 2 * C,
	                         2 * C, n, C);
}

static float mean_loss(const float *losses, int n, int N)
{
	double s = 0.0;
	for (int i = 0; i < n; i++)
		s += losses[i];
	return (float)(s / N);
}

/* The vocab-parallel head (tp > 1): this rank's lm_head rows hold ids [v0, v0 + vl), of which Vv are
 * real. Per chunk of positions the softcapped local logits, the group's row maxima (max), then the
 * sums of exponentials and the target logits (sum, one reduction of both); with dx, dx (N,C) += the
 * local dlogits W (partial sums, reduced once at the end) and dw += dlogits^T x. The full logits
 * never exist on one rank. */
static void tp_classifier(nc_t *m, float *losses, float *dx, float *dw, const float *x, const float *w,
                          const int *targets, float dloss, int N)
{
	int C = m->d.C, v0 = m->tp_rank * m->d.vl, Vv = LOOM_MAX(0, LOOM_MIN(m->d.vl, m->d.V - v0));
	const float inv = 1.0f / NC_SOFTCAP;
	for (int n0 = 0; n0 < N; n0 += m->chunk) {
		int nc = LOOM_MIN(m->chunk, N - n0);
		float *mx = m->tp_stats, *sums = m->tp_stats + nc, *z = m->logits;
		if (Vv > 0)
			loom__nc_logits(z, x + (size_t)n0 * C, C, w, nc, C, Vv);
		for (int i = 0; i < nc; i++) {
			const float *zi = z + (size_t)i * Vv;
			float v = -INFINITY;
#pragma omp simd reduction(max : v)
			for (int j = 0; j < Vv; j++)
				v = zi[j] > v ? zi[j] : v;
			mx[i] = v;
		}
		loom__nc_tp_reduce(m, mx, (size_t)nc, LOOM_TP_MAX);
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
		loom__nc_tp_reduce(m, sums, 2 * (size_t)nc, LOOM_TP_SUM);
		for (int i = 0; i < nc; i++)
			losses[n0 + i] = logf(sums[2 * i]) + mx[i] - sums[2 * i + 1];
		if (!dx || Vv == 0)
			continue;
#pragma omp parallel for schedule(static) if ((long)nc * Vv >= 32768)
		for (int i = 0; i < nc; i++) {
			float *zi = z + (size_t)i * Vv, g = dloss / sums[2 * i];
			int t = targets[n0 + i] - v0;
#pragma omp simd
			for (int j = 0; j < Vv; j++) {
				float c = zi[j], u = c * inv;
				zi[j] = (g * fast_expf(c - mx[i]) - (j == t ? dloss : 0.0f)) * (1.0f - u * u);
			}
		}
		loom__gemm(0, 0, nc, C, Vv, 1.0f, z, Vv, w, C, 1.0f, dx + (size_t)n0 * C, C);
		loom__gemm(1, 0, Vv, C, nc, 1.0f, z, Vv, x + (size_t)n0 * C, C, 1.0f, dw, C);
	}
	if (dx)
		loom__nc_tp_reduce(m, dx, (size_t)N * C, LOOM_TP_SUM);
}

static void head_forward(nc_t *m, nc_arena_t *ar, const int *targets, int B, int T, float *loss)
{
	int C = m->d.C, V = m->d.V, N = B * T;
	loom__nc_param_use(m, m->d.L, 0);
	head_norm(m, ar, N, 0, N);
	const float *w = m->pview[m->ntensors - 1];
	if (targets && m->tp > 1) {
		tp_classifier(m, ar->losses, NULL, NULL, ar->xf, w, targets, 0.0f, N);
		if (loss)
			*loss = mean_loss(ar->losses, N, N);
	} else if (targets) {
		loom__nc_classifier(ar->losses, NULL, NULL, m->logits, m->chunk, ar->xf, w, targets, 0.0f, N, C, V);
		if (loss)
			*loss = mean_loss(ar->losses, N, N);
	} else {
		loom__nc_logits(m->last_logits, ar->xf + (size_t)(T - 1) * C, T * C, w, B, C, V);
	}
}

static void head_forward_backward(nc_t *m, nc_arena_t *ar, const int *targets, int N, int r0, int n, float grad_scale,
                                  float *loss)
{
	int C = m->d.C, V = m->d.V, lm = m->ntensors - 1;
	size_t o = (size_t)r0 * C;
	loom__nc_param_use(m, m->d.L, 0);
	loom__nc_param_use(m, m->d.L, 1);
	head_norm(m, ar, N, r0, n);
	zero(m->dxn + o, (size_t)n * C);
	if (m->tp > 1)
		tp_classifier(m, ar->losses + r0, m->dxn + o, m->gview[lm], ar->xf + o, m->pview[lm], targets + r0,
		              grad_scale / (float)N, n);
	else
		loom__nc_classifier(ar->losses + r0, m->dxn + o, m->gview[lm], m->logits, m->chunk, ar->xf + o,
		                    m->pview[lm], targets + r0, grad_scale / (float)N, n, C, V);
	if (loss)
		*loss = mean_loss(ar->losses + r0, n, N);
	float *dr = m->dres + (size_t)r0 * 2 * C;
#pragma omp parallel for schedule(static) if ((long)n * C >= 32768)
	for (int i = 0; i < n; i++)
		memset(dr + (size_t)i * 2 * C, 0, sizeof(float) * 2 * (size_t)C);
	loom__nc_rmsnorm_backward(dr, 2 * C, m->dxn + o, C, ar->xf + o, C, ar->rstdf + r0, n, C);
	ready(m, lm);
}

static void recompute(nc_t *m, int l, nc_layer_t *a, const float *in, const int *tok, int B, int T)
{
	if (m->act_ckpt == LOOM_ACT_CKPT_BLOCKS)
		block_forward_acts(m, l, a, in, NULL, tok, B, T, 0);
	else if (m->act_ckpt == LOOM_ACT_CKPT_SELECTIVE)
		attention_forward(m, l, a, B, T);
	else
		return;
	m->recomputes++;
}

static void block_backward(nc_t *m, nc_arena_t *ar, int l, int B, int T)
{
	const nc_dims_t *d = &m->d;
	int C = d->C, N = B * T, D = d->D, nh = d->nh, nkv = d->nkv, Q = nh * D, KV = nkv * D, Hd = d->hid;
	int ve = loom__nc_has_ve(l, d->L), Nl = sp_rows(m, N);
	size_t o0 = sp_row0(m, N) * C;
	nc_layer_t *a = &ar->layers[l - m->lo];
	const float *in = block_in(m, ar, l, N), *xn;
	const int *tok = ar->tok;
	float *dres = m->dres + 2 * o0, *dx2 = m->dx2 + o0, *dxn = m->dxn + o0; /* this rank's rows */
	loom__nc_param_use(m, l, 1);
	recompute(m, l, a, in, tok, B, T);
	/* MLP: out = x2 + relu(xn2 Wfc^T)^2 Wp^T. Sequence parallel: the stream gradient of every row for
	 * the row-parallel Wp, the column-parallel Wfc's input gradient reduce-scattered onto this rank's */
	if (m->sp)
		loom__nc_tp_reduce(m, m->dres, (size_t)N * 2 * C, LOOM_TP_ALLGATHER);
	zero(m->dh1, (size_t)N * Hd);
	linear_backward(m->dh1, Hd, G(NC_P), m->dres, 2 * C, a->act, Hd, W(NC_P), N, Hd, C);
	ready(m, LT(l, NC_P));
	zero(m->dh2, (size_t)N * Hd);
	loom__nc_relu2_backward(m->dh2, a->fch, m->dh1, (size_t)N * Hd);
	zero(m->dxn, (size_t)N * C);
	xn = sp_gather(m, a->xn2, N);
	linear_backward(m->dxn, C, G(NC_FC), m->dh2, Hd, xn, C, W(NC_FC), N, C, Hd);
	loom__nc_tp_reduce(m, m->dxn, (size_t)N * C, m->sp ? LOOM_TP_REDUCE_SCATTER : LOOM_TP_SUM);
	ready(m, LT(l, NC_FC));
#pragma omp parallel for schedule(static) if ((long)Nl * C >= 32768)
	for (int n = 0; n < Nl; n++)
		memcpy(dx2 + (size_t)n * C, dres + (size_t)n * 2 * C, sizeof(float) * (size_t)C);
	loom__nc_rmsnorm_backward(dx2, C, dxn, C, a->xn2, C, a->rstd2, Nl, C);
	/* attention: x2 = xin + atty Wo^T (sequence parallel: dx2 of every row for the row-parallel Wo) */
	if (m->sp)
		loom__nc_tp_reduce(m, m->dx2, (size_t)N * C, LOOM_TP_ALLGATHER);
	zero(m->datty, (size_t)N * Q);
	linear_backward(m->datty, Q, G(NC_O), m->dx2, C, a->atty, Q, W(NC_O), N, Q, C);
	ready(m, LT(l, NC_O));
	zero(m->dq, (size_t)N * Q);
	zero(m->dk, (size_t)N * KV);
	zero(m->dv, (size_t)N * KV);
	attention_backward(m, l, a, B, T);
	/* QK-norm and rotary, backward, in place */
	zero(m->dkh, (size_t)N * Q);
	loom__nc_rmsnorm_backward(m->dkh, D, m->dq, D, a->q, D, a->qrstd, N * nh, D);
	memcpy(m->dq, m->dkh, sizeof(float) * (size_t)N * Q);
	zero(m->dkh, (size_t)N * KV);
	loom__nc_rmsnorm_backward(m->dkh, D, m->dk, D, a->k, D, a->krstd, N * nkv, D);
	memcpy(m->dk, m->dkh, sizeof(float) * (size_t)N * KV);
	rope(m, m->dq, B, T, nh, D, 1);
	rope(m, m->dk, B, T, nkv, D, 1);
	/* the projections' weight gradients, the input's gradient summed over q, k, v (and the gate) */
	zero(m->dxn, (size_t)N * C);
	xn = sp_gather(m, a->xn1, N);
	linear_backward(m->dxn, C, G(NC_V), m->dv, KV, xn, C, W(NC_V), N, C, KV);
	ready(m, LT(l, NC_V));
	linear_backward(m->dxn, C, G(NC_K), m->dk, KV, xn, C, W(NC_K), N, C, KV);
	ready(m, LT(l, NC_K));
	linear_backward(m->dxn, C, G(NC_Q), m->dq, Q, xn, C, W(NC_Q), N, C, Q);
	ready(m, LT(l, NC_Q));
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
		ready(m, LT(l, NC_GATE));
		loom__nc_scatter_add(G(NC_VE), KV, m->dv, KV, tok, 0, d->Vp, N, KV);
		ready(m, LT(l, NC_VE));
	}
	loom__nc_tp_reduce(m, m->dxn, (size_t)N * C, m->sp ? LOOM_TP_REDUCE_SCATTER : LOOM_TP_SUM);
	/* dxin = dx2 + rmsnorm backward; then the mix xin = r x + z x0 */
	memcpy(m->dxin, dx2, sizeof(float) * (size_t)Nl * C);
	loom__nc_rmsnorm_backward(m->dxin, C, dxn, C, a->xn1, C, a->rstd1, Nl, C);
	float r = m->pview[NC_RESID][l], z = m->pview[NC_X0][l];
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
	if (m->sp) { /* the scalars' gradients of this rank's rows, summed over the group */
		float s[2] = {(float)s1, (float)s2};
		loom__nc_tp_reduce(m, s, 2, LOOM_TP_SUM);
		m->gview[NC_RESID][l] += s[0];
		m->gview[NC_X0][l] += s[1];
	} else {
		m->gview[NC_RESID][l] += (float)s1;
		m->gview[NC_X0][l] += (float)s2;
	}
	if (m->sp && l == m->lo && m->has_embed) /* the embedding's gradient is whole; a previous stage's is not */
		loom__nc_tp_reduce(m, m->dres, (size_t)N * 2 * C, LOOM_TP_ALLGATHER);
	if (l == m->lo && !m->has_embed) {
		ready(m, NC_X0);
		ready(m, NC_RESID);
	}
}

static void embed_backward(nc_t *m, nc_arena_t *ar, const int *inputs, int B, int T)
{
	int C = m->d.C, N = B * T;
	loom__nc_param_use(m, -1, 1);
	/* both halves of the stream are x0 = rmsnorm(wte[tok]) */
	zero(m->dxn, (size_t)N * C);
#pragma omp parallel for schedule(static) if ((long)N * C >= 32768)
	for (int n = 0; n < N; n++) {
		const float *g = m->dres + (size_t)n * 2 * C;
		float *o = m->dx2 + (size_t)n * C;
#pragma omp simd
		for (int c = 0; c < C; c++)
			o[c] = g[c] + g[C + c];
	}
	loom__nc_rmsnorm_backward(m->dxn, C, m->dx2, C, ar->in + C, 2 * C, ar->rstd0, N, C);
	ready(m, NC_X0);
	ready(m, NC_RESID);
	loom__nc_scatter_add(m->gview[NC_WTE], C, m->dxn, C, inputs, m->tp_rank * m->d.vl, m->d.vl, N, C);
	ready(m, NC_WTE);
}

#undef W
#undef G

/* ---- public unit calls ---------------------------------------------------------------------------- */

static int status(nc_t *m)
{
	int rc = m->tp_err, grc = loom__gemm_status(&m->gemm);
	m->tp_err = 0;
	return rc ? rc : grc;
}

int loom__nc_set_inputs(loom_model_t *mm, int mb, const int *inputs, int B, int T)
{
	nc_t *m = M(mm);
	int rc;
	if (mb < 0 || mb >= m->narenas)
		return loom_seterr(LOOM_EINVAL, "nanochat set_inputs: arena %d out of range [0, %d)", mb, m->narenas);
	if (B <= 0 || T <= 0 || B > m->B || T > m->T)
		return loom_seterr(LOOM_EINVAL, "nanochat set_inputs: batch %d x %d tokens does not fit the model's %d x %d",
		                   B, T, m->B, m->T);
	if ((rc = check_tokens(m, inputs, B * T, T, "inputs")) != LOOM_OK)
		return rc;
	memcpy(m->arenas[mb].tok, inputs, sizeof(int) * (size_t)B * T);
	m->arenas[mb].has_tok = 1;
	return LOOM_OK;
}

int loom__nc_embed_forward(loom_model_t *mm, int mb, const int *inputs, int B, int T)
{
	nc_t *m = M(mm);
	int rc;
	if ((rc = check_unit(m, mb, -1, B, T, "embed_forward")) != LOOM_OK ||
	    (rc = check_tokens(m, inputs, B * T, T, "inputs")) != LOOM_OK)
		return rc;
	loom__gemm_setup(&m->gemm);
	embed_forward(m, &m->arenas[mb], inputs, B, T);
	return status(m);
}

/* Arena, block and size of a block call, and the arena's tokens (the value embeddings read them). */
static int check_block(const nc_t *m, int mb, int l, int B, int T, const char *op)
{
	int rc;
	if (l < m->lo || l >= m->hi)
		return loom_seterr(LOOM_EINVAL, "nanochat %s: block %d is not held (blocks [%d, %d))", op, l, m->lo, m->hi);
	if ((rc = check_unit(m, mb, l, B, T, op)) != LOOM_OK)
		return rc;
	if (!m->arenas[mb].has_tok)
		return loom_seterr(LOOM_EINVAL, "nanochat %s: arena %d has no token ids (call embed_forward or set_inputs "
		                   "first: the value embeddings read them)", op, mb);
	return LOOM_OK;
}

int loom__nc_block_forward(loom_model_t *mm, int mb, int l, int B, int T)
{
	nc_t *m = M(mm);
	int rc;
	if ((rc = check_block(m, mb, l, B, T, "block_forward")) != LOOM_OK)
		return rc;
	loom__gemm_setup(&m->gemm);
	block_forward(m, &m->arenas[mb], l, B, T);
	return status(m);
}

int loom__nc_head_forward(loom_model_t *mm, int mb, const int *targets, int B, int T, float *loss)
{
	nc_t *m = M(mm);
	int rc;
	if ((rc = check_unit(m, mb, m->d.L, B, T, "head_forward")) != LOOM_OK ||
	    (targets && (rc = check_tokens(m, targets, B * T, T, "targets")) != LOOM_OK))
		return rc;
	if ((m->tp > 1 || m->cp > 1) && !targets)
		return loom_seterr(LOOM_EINVAL, "nanochat head_forward: a %s-parallel model computes losses only",
		                   m->tp > 1 ? "tensor" : "context");
	loom__gemm_setup(&m->gemm);
	head_forward(m, &m->arenas[mb], targets, B, T, loss);
	return status(m);
}

int loom__nc_head_forward_backward_rows(loom_model_t *mm, int mb, const int *targets, int B, int T, int row0,
                                         int rows, float grad_scale, float *loss)
{
	nc_t *m = M(mm);
	int rc;
	if ((rc = check_unit(m, mb, m->d.L, B, T, "head_forward_backward")) != LOOM_OK)
		return rc;
	if (row0 < 0 || rows < 1 || row0 > B * T - rows)
		return loom_seterr(LOOM_EINVAL, "nanochat head_forward_backward_rows: rows [%d, %d) of a batch of %d x %d "
		                   "positions", row0, row0 + rows, B, T);
	if (!targets)
		return loom_seterr(LOOM_EINVAL, "nanochat head_forward_backward: targets are NULL");
	if ((rc = check_tokens(m, targets + row0, rows, T, "targets")) != LOOM_OK)
		return rc;
	loom__gemm_setup(&m->gemm);
	head_forward_backward(m, &m->arenas[mb], targets, B * T, row0, rows, grad_scale, loss);
	return status(m);
}

int loom__nc_head_forward_backward(loom_model_t *mm, int mb, const int *targets, int B, int T, float grad_scale,
                                    float *loss)
{
	if (B <= 0 || T <= 0)
		return loom_seterr(LOOM_EINVAL, "nanochat head_forward_backward: batch %d x %d", B, T);
	return loom__nc_head_forward_backward_rows(mm, mb, targets, B, T, 0, B * T, grad_scale, loss);
}

int loom__nc_block_backward(loom_model_t *mm, int mb, int l, int B, int T)
{
	nc_t *m = M(mm);
	int rc;
	if ((rc = check_block(m, mb, l, B, T, "block_backward")) != LOOM_OK)
		return rc;
	loom__gemm_setup(&m->gemm);
	block_backward(m, &m->arenas[mb], l, B, T);
	return status(m);
}

int loom__nc_embed_backward(loom_model_t *mm, int mb, const int *inputs, int B, int T)
{
	nc_t *m = M(mm);
	int rc;
	if ((rc = check_unit(m, mb, -1, B, T, "embed_backward")) != LOOM_OK ||
	    (rc = check_tokens(m, inputs, B * T, T, "inputs")) != LOOM_OK)
		return rc;
	loom__gemm_setup(&m->gemm);
	embed_backward(m, &m->arenas[mb], inputs, B, T);
	return status(m);
}

float *loom__nc_block_input(loom_model_t *mm, int mb, int l)
{
	nc_t *m = M(mm);
	if (mb < 0 || mb >= m->narenas || l < m->lo || l > m->hi)
		return NULL;
	return stream(m, &m->arenas[mb], l);
}

float *loom__nc_stream_grad(loom_model_t *m)
{
	return M(m)->dres;
}

/* ---- the whole model -------------------------------------------------------------------------------- */

static int check_call(const nc_t *m, const int *inputs, const int *targets, int B, int T, const char *op)
{
	int rc;
	if (!m->has_embed || !m->has_head)
		return loom_seterr(LOOM_EINVAL, "nanochat %s: needs every layer, the model holds blocks [%d, %d) of %d", op,
		                   m->lo, m->hi, m->d.L);
	if ((rc = check_unit(m, 0, -1, B, T, op)) != LOOM_OK)
		return rc;
	if ((m->tp > 1 || m->cp > 1) && !targets)
		return loom_seterr(LOOM_EINVAL, "nanochat %s: a %s-parallel model computes losses only", op,
		                   m->tp > 1 ? "tensor" : "context");
	if ((rc = check_tokens(m, inputs, B * T, T, "inputs")) != LOOM_OK)
		return rc;
	if (targets && (rc = check_tokens(m, targets, B * T, T, "targets")) != LOOM_OK)
		return rc;
	return LOOM_OK;
}

int loom__nc_forward(loom_model_t *mm, const int *inputs, const int *targets, int B, int T, float *loss)
{
	nc_t *m = M(mm);
	nc_arena_t *ar = &m->arenas[0];
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

const float *loom__nc_last_logits(const loom_model_t *m)
{
	return CM(m)->last_logits;
}

void loom__nc_zero_grad(loom_model_t *mm)
{
	nc_t *m = M(mm);
	if (!m->grad_split) {
		if (m->grads)
			zero(m->grads, m->nparams);
		return;
	}
	for (int i = 0; i < m->ntensors; i++)
		if (m->gview[i])
			zero(m->gview[i], m->tensors[i].numel);
}

int loom__nc_forward_backward(loom_model_t *mm, const int *inputs, const int *targets, int B, int T,
                               float grad_scale, float *loss)
{
	nc_t *m = M(mm);
	nc_arena_t *ar = &m->arenas[0];
	int rc, L = m->d.L;
	if (!targets)
		return loom_seterr(LOOM_EINVAL, "nanochat forward_backward: targets are NULL");
	if ((rc = check_call(m, inputs, targets, B, T, "forward_backward")) != LOOM_OK)
		return rc;
	loom__gemm_setup(&m->gemm);
	embed_forward(m, ar, inputs, B, T);
	for (int l = 0; l < L; l++)
		block_forward(m, ar, l, B, T);
	head_forward_backward(m, ar, targets, B * T, 0, B * T, grad_scale, loss);
	for (int l = L - 1; l >= 0; l--)
		block_backward(m, ar, l, B, T);
	embed_backward(m, ar, inputs, B, T);
	return status(m);
}
