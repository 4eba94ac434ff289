/* muon.c: nanochat's MuonAdamW: one Muon update (Nesterov momentum, Polar Express, NorMuon,
 * cautious weight decay) of one matrix, after nanochat's muon_step_fused, in fp32 on loom's sgemm;
 * DistMuon's ownership rules; the optimizer object over a parameter table (AdamW pieces and Muon
 * matrices, each owned by one object).
 *
 * Layering: the sgemm lives in src/model/kernels.h (loom__gemm_f32); this file is its only user
 * outside src/model/ in the library. If another module needs it, it belongs in a layer below both.
 *
 * Why the shape: the update is dominated by the fifteen products of Polar Express per step (three
 * per iteration), so they go to the sgemm (threaded along the larger output dimension by
 * loom__gemm_f32) and always over the smaller Gram matrix, m = min(rows, cols) square; the element-wise passes are one read of g, buf and
 * p each. A matrix stored transposed (GPT-2's Conv1D) is never copied: the iteration on X^T over the
 * other Gram matrix is exactly the transpose of the iteration on X (A = X X^T = (X^T)^T X^T, and
 * B X = (X^T B)^T with B symmetric), NorMuon's per-row statistics of the view are per-column ones of
 * the stored matrix, and the rest is element-wise.
 *
 * Invariants: s has one value per row of the [rows, cols] view when rows >= cols, else per column
 * (nanochat's factored second moment); sums of squares are accumulated in double, per row or column
 * and then in order, so they do not depend on the thread count (the sgemm's split may). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "loom/muon.h"
#include "model/kernels.h" /* loom__gemm_f32: the model's threaded fp32 sgemm */

/* Polar Express coefficients (Amsel, Persson, Musco, Gower 2025, arXiv 2505.16932) for 5 iterations,
 * safety factor 2e-2, cushion 2: the values nanochat uses. */
static const double polar_coeffs[5][3] = {
	{8.156554524902461, -22.48329292557795, 15.878769915207462},
	{4.042929935166739, -2.808917465908714, 0.5000178451051316},
	{3.8916678022926607, -2.772484153217685, 0.5060648178503393},
	{3.285753657755655, -2.3681294933425376, 0.46449024233003106},
	{2.3465413258596377, -1.7097828382687081, 0.42323551169305323},
};

/* Element-wise loops go parallel from this many floats (below it a thread start costs more). */
#define PAR_MIN 32768

size_t loom_muon_scratch_floats(int rows, int cols)
{
	size_t r = rows > 0 ? (size_t)rows : 0, c = cols > 0 ? (size_t)cols : 0;
	size_t m = LOOM_MIN(r, c), x = LOOM_MAX(r, c);
	return 2 * r * c + 2 * m * m + 3 * x;
}

/* Polar Express on X (R, C) stored row-major; the result replaces X (which may end in either of X or
 * Y: returns where). left: A = X X^T (R, R), X = a X + B X; else A = X^T X (C, C), X = a X + X B. */
static float *polar_express(float *X, float *Y, float *A, float *B, int R, int C, int left)
{
	int m = left ? R : C;
	size_t mm = (size_t)m * m, n = (size_t)R * C;
	for (int k = 0; k < 5; k++) {
		float a = (float)polar_coeffs[k][0], b = (float)polar_coeffs[k][1], c = (float)polar_coeffs[k][2];
		if (left)
			loom__gemm_f32(0, 1, R, R, C, 1.0f, X, C, X, C, 0.0f, A, R);
		else
			loom__gemm_f32(1, 0, C, C, R, 1.0f, X, C, X, C, 0.0f, A, C);
		memcpy(B, A, mm * sizeof(float)); /* B = b A + c A A */
		loom__gemm_f32(0, 0, m, m, m, c, A, m, A, m, b, B, m);
		memcpy(Y, X, n * sizeof(float)); /* Y = a X + (B X | X B) */
		if (left)
			loom__gemm_f32(0, 0, R, C, R, 1.0f, B, m, X, C, a, Y, C);
		else
			loom__gemm_f32(0, 0, R, C, C, 1.0f, X, C, B, m, a, Y, C);
		float *t = X;
		X = Y, Y = t;
	}
	return X;
}

/* acc[j] = sum over the reduced dimension of X^2, per stored row (per_row) or per stored column. */
static void sumsq_lines(double *acc, const float *X, int R, int C, int per_row)
{
	int par = (size_t)R * C >= PAR_MIN;
	if (per_row) {
#pragma omp parallel for schedule(static) if (par)
		for (int i = 0; i < R; i++) {
			const float *x = X + (size_t)i * C;
			double t = 0.0;
			for (int j = 0; j < C; j++)
				t += (double)x[j] * x[j];
			acc[i] = t;
		}
	} else {
		/* blocks of 64 columns, each summed down the rows by one thread */
		int nb = (C + 63) / 64;
#pragma omp parallel for schedule(static) if (par)
		for (int bk = 0; bk < nb; bk++) {
			int j0 = bk * 64, j1 = LOOM_MIN(C, j0 + 64);
			for (int j = j0; j < j1; j++)
				acc[j] = 0.0;
			for (int i = 0; i < R; i++) {
				const float *x = X + (size_t)i * C;
				for (int j = j0; j < j1; j++)
					acc[j] += (double)x[j] * x[j];
			}
		}
	}
}

int loom_muon_update(float *p, const float *g, float grad_scale, float *buf, float *s, int rows, int cols,
                     int transposed, float lr, float wd, float mu, float beta2, float *scratch)
{
	if (rows < 1 || cols < 1)
		return loom_seterr(LOOM_EINVAL, "muon: matrix [%d, %d] has a non-positive dimension", rows, cols);
	if (!(lr >= 0.0f) || !isfinite(lr) || !(wd >= 0.0f) || !isfinite(wd) || !isfinite(grad_scale))
		return loom_seterr(LOOM_EINVAL, "muon: lr %g, weight decay %g and gradient scale %g must be finite, "
		                   "lr and wd >= 0", lr, wd, grad_scale);
	if (!(mu >= 0.0f && mu <= 1.0f) || !(beta2 >= 0.0f && beta2 <= 1.0f))
		return loom_seterr(LOOM_EINVAL, "muon: momentum %g and beta2 %g must be in [0, 1]", mu, beta2);

	/* the stored matrix is R x C; the view [rows, cols] is it or its transpose */
	const int R = transposed ? cols : rows, C = transposed ? rows : cols;
	const size_t n = (size_t)rows * cols, mn = (size_t)LOOM_MIN(rows, cols), mx = (size_t)LOOM_MAX(rows, cols);
	const int par = n >= PAR_MIN;
	double *acc = (double *)(void *)scratch; /* 2 mx floats: mx doubles */
	float *scale = scratch + 2 * mx, *X = scale + mx, *Y = X + n, *A = Y + n, *B = A + mn * mn;

	/* 1. Nesterov momentum, and |G|_F (row sums, then their sum in order: the same bits whatever the
	 * thread count) */
	const float om = 1.0f - mu;
	double ss = 0.0;
#pragma omp parallel for schedule(static) if (par)
	for (int i = 0; i < R; i++) {
		size_t o = (size_t)i * C;
		double t = 0.0;
		for (int j = 0; j < C; j++) {
			float gi = g[o + j] * grad_scale;
			float b = buf[o + j] + om * (gi - buf[o + j]);
			float x = gi + mu * (b - gi);
			buf[o + j] = b;
			X[o + j] = x;
			t += (double)x * x;
		}
		acc[i] = t;
	}
	for (int i = 0; i < R; i++)
		ss += acc[i];
	const float inv = (float)(1.0 / (sqrt(ss) * 1.02 + 1e-6));
#pragma omp parallel for schedule(static) if (par)
	for (size_t i = 0; i < n; i++)
		X[i] *= inv;

	/* 2. Polar Express over the smaller Gram matrix: the view's X X^T when wide or square, X^T X
	 * when tall; in the stored layout a transpose swaps the two. */
	const int left = (rows <= cols) != (transposed != 0);
	X = polar_express(X, Y, A, B, R, C, left);

	/* 3. NorMuon: statistics per view row when rows >= cols (reduced over the cols columns), else per
	 * view column; per stored row or column accordingly. */
	const int per_view_row = rows >= cols, per_row = per_view_row != (transposed != 0);
	const int nl = per_view_row ? rows : cols; /* statistics (= mx) */
	const double red = per_view_row ? cols : rows;
	sumsq_lines(acc, X, R, C, per_row);
	double vsum = 0.0, scaled = 0.0;
	const float ob = 1.0f - beta2;
	for (int j = 0; j < nl; j++) {
		double v = acc[j] / red; /* mean of X^2 over the reduced dimension */
		vsum += v;
		float vf = (float)v;
		s[j] = s[j] + ob * (vf - s[j]);
		double k = 1.0 / sqrt(fmax((double)s[j], 1e-10));
		scaled += red * v * k * k;
		acc[j] = k; /* the step size, scaled below */
	}
	const double norm = sqrt(red * vsum), norm2 = sqrt(scaled), f = norm / fmax(norm2, 1e-10);
	for (int j = 0; j < nl; j++)
		scale[j] = (float)(acc[j] * f);

	/* 4. cautious weight decay and the update, lr' = lr sqrt(max(1, rows / cols)) */
	const float lr2 = (float)((double)lr * sqrt(fmax(1.0, (double)rows / cols))), lwd = lr2 * wd;
#pragma omp parallel for schedule(static) if (par)
	for (int i = 0; i < R; i++) {
		float *pi = p + (size_t)i * C;
		const float *xi = X + (size_t)i * C;
		if (per_row) {
			const float sc = scale[i];
			for (int j = 0; j < C; j++) {
				float x = xi[j] * sc, q = pi[j];
				pi[j] = q - (lr2 * x + (x * q >= 0.0f ? lwd * q : 0.0f));
			}
		} else {
			for (int j = 0; j < C; j++) {
				float x = xi[j] * scale[j], q = pi[j];
				pi[j] = q - (lr2 * x + (x * q >= 0.0f ? lwd * q : 0.0f));
			}
		}
	}
	return LOOM_OK;
}

/* ---- DistMuon's ownership rules ---------------------------------------------------------------- */

static int is_muon(const loom_tensor_info_t *t)
{
	return t->opt_group == LOOM_OPT_MATRIX;
}

static int shape_less(int r1, int c1, int r2, int c2)
{
	return r1 < r2 || (r1 == r2 && c1 < c2);
}

/* The smallest Muon shape above (*r, *c) (any, when first): 1 and updated, or 0 when none is left. */
static int next_shape(const loom_tensor_info_t *t, int nt, int first, int *r, int *c)
{
	int found = 0, br = 0, bc = 0;
	for (int i = 0; i < nt; i++) {
		if (!is_muon(&t[i]) || (!first && !shape_less(*r, *c, t[i].rows, t[i].cols)))
			continue;
		if (!found || shape_less(t[i].rows, t[i].cols, br, bc))
			found = 1, br = t[i].rows, bc = t[i].cols;
	}
	if (found)
		*r = br, *c = bc;
	return found;
}

int loom_muon_num_groups(const loom_tensor_info_t *t, int nt)
{
	int n = 0, r = 0, c = 0;
	while (next_shape(t, nt, n == 0, &r, &c))
		n++;
	return n;
}

int loom_muon_group(const loom_tensor_info_t *t, int nt, int g, int *rows, int *cols, int *members, int cap)
{
	int r = 0, c = 0, K = 0;
	if (g < 0)
		return loom_seterr(LOOM_EINVAL, "muon: group %d does not exist", g);
	for (int k = 0; k <= g; k++)
		if (!next_shape(t, nt, k == 0, &r, &c))
			return loom_seterr(LOOM_EINVAL, "muon: group %d does not exist (the table has %d)", g, k);
	for (int i = 0; i < nt; i++)
		if (is_muon(&t[i]) && t[i].rows == r && t[i].cols == c) {
			if (members && K < cap)
				members[K] = i;
			K++;
		}
	if (rows)
		*rows = r;
	if (cols)
		*cols = c;
	return K;
}

int loom_muon_chunk(int K, int nranks)
{
	return nranks > 0 ? (K + nranks - 1) / nranks : 0;
}

int loom_muon_owner(const loom_tensor_info_t *t, int nt, int tensor, int nranks)
{
	int idx = 0, K = 0;
	if (tensor < 0 || tensor >= nt || !is_muon(&t[tensor]) || nranks < 1)
		return loom_seterr(LOOM_EINVAL, "muon: tensor %d of %d is not a Muon matrix (or %d ranks)", tensor, nt,
		                   nranks);
	for (int i = 0; i < nt; i++)
		if (is_muon(&t[i]) && t[i].rows == t[tensor].rows && t[i].cols == t[tensor].cols) {
			if (i < tensor)
				idx++;
			K++;
		}
	return idx / loom_muon_chunk(K, nranks);
}

int loom_muon_owned(const loom_tensor_info_t *t, int nt, int rank, int nranks, int *out)
{
	int n = 0, r = 0, c = 0;
	if (nranks < 1 || rank < 0 || rank >= nranks)
		return 0;
	for (int g = 0; next_shape(t, nt, g == 0, &r, &c); g++) {
		int K = 0, ch;
		for (int i = 0; i < nt; i++)
			K += is_muon(&t[i]) && t[i].rows == r && t[i].cols == c;
		ch = loom_muon_chunk(K, nranks);
		for (int i = 0, k = 0; i < nt; i++)
			if (is_muon(&t[i]) && t[i].rows == r && t[i].cols == c) {
				if (k >= rank * ch && k < (rank + 1) * ch)
					out[n++] = i;
				k++;
			}
	}
	return n;
}

size_t loom_muonadamw_state_floats(const loom_tensor_info_t *t, int nt, const size_t *range, const int *mats,
                                   int nmats)
{
	size_t n = 0;
	for (int i = 0; i < nt; i++) {
		if (is_muon(&t[i]))
			continue;
		size_t a = range ? LOOM_MAX(range[0], t[i].offset) : t[i].offset;
		size_t b = range ? LOOM_MIN(range[1], t[i].offset + t[i].numel) : t[i].offset + t[i].numel;
		n += a < b ? 2 * (b - a) : 0;
	}
	for (int k = 0; k < nmats; k++) {
		const loom_tensor_info_t *m = &t[mats[k]];
		n += (size_t)m->rows * m->cols + (size_t)LOOM_MAX(m->rows, m->cols);
	}
	return n;
}

int loom_muon_adam_share(const loom_tensor_info_t *ti, int rank, int nranks, size_t *lo, size_t *hi)
{
	if (is_muon(ti) || nranks < 1 || rank < 0 || rank >= nranks)
		return loom_seterr(LOOM_EINVAL, "muon: no AdamW share of %s for rank %d of %d", ti->name, rank, nranks);
	if (ti->numel < 1024) {
		*lo = 0, *hi = ti->numel;
		return 0;
	}
	size_t s0 = ti->shape[0], per;
	if (s0 == 0 || s0 % (size_t)nranks != 0)
		return loom_seterr(LOOM_EINVAL, "muon: %s has %zu rows, not divisible by %d ranks (DistMuon shards AdamW "
		                   "tensors of >= 1024 elements by rows)", ti->name, s0, nranks);
	per = s0 / (size_t)nranks * (ti->numel / s0);
	*lo = (size_t)rank * per, *hi = *lo + per;
	return 1;
}

/* ---- the optimizer --------------------------------------------------------------------------- */

loom_muon_config_t loom_muon_defaults(void)
{
	loom_muon_config_t c = {.n_embd = 768, .total_steps = 1, .unembedding_lr = 0.004f, .embedding_lr = 0.3f,
	                        .matrix_lr = 0.02f, .scalar_lr = 0.5f, .adam_beta1 = 0.8f, .adam_beta2 = 0.95f,
	                        .x0_beta1 = 0.96f, .adam_eps = 1e-10f, .weight_decay = 0.2f, .muon_beta2 = 0.95f,
	                        .adamw_lr = 6e-4f};
	return c;
}

static int config_check(const loom_muon_config_t *c)
{
	const float lrs[4] = {c->unembedding_lr, c->embedding_lr, c->matrix_lr, c->scalar_lr};
	if (c->n_embd < 1 || c->total_steps < 1)
		return loom_seterr(LOOM_EINVAL, "muon: n_embd %d and total_steps %lld must be >= 1", c->n_embd,
		                   c->total_steps);
	for (int i = 0; i < 4; i++)
		if (!(lrs[i] >= 0.0f) || !isfinite(lrs[i]))
			return loom_seterr(LOOM_EINVAL, "muon: learning rate %g must be finite and >= 0", lrs[i]);
	if (!(c->adam_beta1 >= 0.0f && c->adam_beta1 < 1.0f) || !(c->adam_beta2 >= 0.0f && c->adam_beta2 < 1.0f) ||
	    !(c->x0_beta1 >= 0.0f && c->x0_beta1 < 1.0f) || !(c->muon_beta2 >= 0.0f && c->muon_beta2 <= 1.0f))
		return loom_seterr(LOOM_EINVAL, "muon: betas (%g, %g), x0 beta1 %g must be in [0, 1), Muon's beta2 %g in "
		                   "[0, 1]", c->adam_beta1, c->adam_beta2, c->x0_beta1, c->muon_beta2);
	if (!(c->adam_eps >= 0.0f) || !isfinite(c->adam_eps) || !(c->weight_decay >= 0.0f) || !isfinite(c->weight_decay))
		return loom_seterr(LOOM_EINVAL, "muon: eps %g and weight decay %g must be finite and >= 0", c->adam_eps,
		                   c->weight_decay);
	return LOOM_OK;
}

/* The base rate and betas of a non-Muon tensor (setup_optimizer's groups). */
static void adam_group(const loom_muon_config_t *c, loom_opt_group_t g, double *lr, float *b1, float *b2)
{
	double dscale = pow((double)c->n_embd / 768.0, -0.5);
	*b1 = c->adam_beta1, *b2 = c->adam_beta2;
	switch (g) {
	case LOOM_OPT_UNEMBED: *lr = (double)c->unembedding_lr * dscale; break;
	case LOOM_OPT_EMBED: *lr = (double)c->embedding_lr * dscale; break;
	case LOOM_OPT_SCALAR: *lr = (double)c->scalar_lr * 0.01; break;
	case LOOM_OPT_X0: *lr = c->scalar_lr, *b1 = c->x0_beta1, *b2 = 0.95f; break;
	default: *lr = c->adamw_lr; break; /* LOOM_OPT_VECTOR: GPT-2's embeddings, biases and LayerNorms */
	}
}

static int range_cmp(const void *a, const void *b)
{
	const size_t *x = a, *y = b;
	return x[0] < y[0] ? -1 : x[0] > y[0];
}

static int muon_cmp(const void *a, const void *b)
{
	const loom_muon_matrix_t *x = a, *y = b;
	if (x->rows != y->rows || x->cols != y->cols)
		return shape_less(x->rows, x->cols, y->rows, y->cols) ? -1 : 1;
	return x->tensor < y->tensor ? -1 : x->tensor > y->tensor;
}

static int piece_cmp(const void *a, const void *b)
{
	const loom_muon_adam_piece_t *x = a, *y = b;
	return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static int check_table(const loom_tensor_info_t *t, int nt, size_t *extent)
{
	*extent = 0;
	for (int i = 0; i < nt; i++) {
		*extent = LOOM_MAX(*extent, t[i].offset + t[i].numel);
		if (!is_muon(&t[i]))
			continue;
		size_t r = (size_t)t[i].rows, c = (size_t)t[i].cols;
		size_t s0 = t[i].transposed ? c : r, s1 = t[i].transposed ? r : c;
		if (t[i].rows < 1 || t[i].cols < 1 || t[i].ndim != 2 || t[i].shape[0] != s0 || t[i].shape[1] != s1 ||
		    t[i].numel != r * c)
			return loom_seterr(LOOM_EINVAL, "muon: %s (tensor %d) is not a [%d, %d] matrix%s: shape [%zu, %zu], %zu "
			                   "floats", t[i].name, i, t[i].rows, t[i].cols, t[i].transposed ? " stored transposed" : "",
			                   t[i].shape[0], t[i].shape[1], t[i].numel);
	}
	return LOOM_OK;
}

int loom_muonadamw_init(loom_muonadamw_t *o, const loom_tensor_info_t *tensors, int ntensors,
                        const loom_muon_config_t *cfg, const loom_muon_owned_t *own)
{
	size_t extent, (*ranges)[2] = NULL, whole[1][2], scratch = 0;
	int nr, rc, cap;
	memset(o, 0, sizeof *o);
	if ((rc = config_check(cfg)) != LOOM_OK)
		return rc;
	if (!tensors || ntensors < 1)
		return loom_seterr(LOOM_EINVAL, "muon: no parameter table");
	if ((rc = check_table(tensors, ntensors, &extent)) != LOOM_OK)
		return rc;
	o->cfg = *cfg;

	/* Muon's matrices, in group order */
	o->mats = loom__calloc((size_t)ntensors, sizeof *o->mats);
	if (!o->mats)
		goto nomem;
	if (own && own->matrices) {
		for (int k = 0; k < own->nmatrices; k++) {
			int i = own->matrices[k];
			if (i < 0 || i >= ntensors || !is_muon(&tensors[i])) {
				rc = loom_seterr(LOOM_EINVAL, "muon: owned matrix %d is not a Muon matrix of the table's %d tensors",
				                 i, ntensors);
				goto fail;
			}
			for (int j = 0; j < k; j++)
				if (own->matrices[j] == i) {
					rc = loom_seterr(LOOM_EINVAL, "muon: owned matrix %d listed twice", i);
					goto fail;
				}
			o->mats[o->nmat++].tensor = i;
		}
	} else {
		for (int i = 0; i < ntensors; i++)
			if (is_muon(&tensors[i]))
				o->mats[o->nmat++].tensor = i;
	}
	for (int k = 0; k < o->nmat; k++) {
		const loom_tensor_info_t *t = &tensors[o->mats[k].tensor];
		o->mats[k].offset = t->offset, o->mats[k].rows = t->rows, o->mats[k].cols = t->cols;
		o->mats[k].transposed = t->transposed != 0;
	}
	qsort(o->mats, (size_t)o->nmat, sizeof *o->mats, muon_cmp);
	for (int k = 0; k < o->nmat; k++) {
		loom_muon_matrix_t *mt = &o->mats[k];
		size_t n = (size_t)mt->rows * mt->cols, ns = (size_t)LOOM_MAX(mt->rows, mt->cols);
		mt->buf = loom_alloc_aligned(n * sizeof(float));
		mt->s = loom_alloc_aligned(ns * sizeof(float));
		if (!mt->buf || !mt->s)
			goto nomem;
		memset(mt->buf, 0, n * sizeof(float));
		memset(mt->s, 0, ns * sizeof(float));
		scratch = LOOM_MAX(scratch, loom_muon_scratch_floats(mt->rows, mt->cols));
	}
	if (scratch && !(o->scratch = loom_alloc_aligned(scratch * sizeof(float))))
		goto nomem;

	/* AdamW's pieces: every non-Muon tensor cut by the owned ranges */
	if (own && own->ranges) {
		nr = own->nranges;
		if (nr < 0) {
			rc = loom_seterr(LOOM_EINVAL, "muon: %d owned ranges", nr);
			goto fail;
		}
		ranges = loom__malloc((size_t)LOOM_MAX(nr, 1) * sizeof *ranges);
		if (!ranges)
			goto nomem;
		memcpy(ranges, own->ranges, (size_t)nr * sizeof *ranges);
		qsort(ranges, (size_t)nr, sizeof *ranges, range_cmp);
		for (int k = 0; k < nr; k++)
			if (ranges[k][1] < ranges[k][0] || ranges[k][1] > extent || (k && ranges[k][0] < ranges[k - 1][1])) {
				rc = loom_seterr(LOOM_EINVAL, "muon: owned range [%zu, %zu) is reversed, overlaps another or ends "
				                 "past the parameters (%zu floats)", ranges[k][0], ranges[k][1], extent);
				goto fail;
			}
	} else {
		nr = 1, whole[0][0] = 0, whole[0][1] = extent;
	}
	cap = ntensors * (nr + 1);
	o->pieces = loom__calloc((size_t)cap, sizeof *o->pieces);
	if (!o->pieces)
		goto nomem;
	for (int i = 0; i < ntensors; i++) {
		const loom_tensor_info_t *t = &tensors[i];
		if (is_muon(t))
			continue;
		for (int k = 0; k < nr; k++) {
			const size_t *rg = ranges ? ranges[k] : whole[k];
			size_t a = LOOM_MAX(rg[0], t->offset), b = LOOM_MIN(rg[1], t->offset + t->numel);
			if (a >= b)
				continue;
			loom_muon_adam_piece_t *pc = &o->pieces[o->npieces++];
			pc->tensor = i, pc->offset = a, pc->numel = b - a;
			adam_group(cfg, t->opt_group, &pc->lr, &pc->beta1, &pc->beta2);
		}
	}
	qsort(o->pieces, (size_t)o->npieces, sizeof *o->pieces, piece_cmp);
	for (int k = 0; k < o->npieces; k++) {
		if (k && o->pieces[k].offset < o->pieces[k - 1].offset + o->pieces[k - 1].numel) {
			rc = loom_seterr(LOOM_EINVAL, "muon: tensors %d and %d overlap in the parameter buffer",
			                 o->pieces[k - 1].tensor, o->pieces[k].tensor);
			goto fail;
		}
		o->pieces[k].state = o->adam_n;
		o->adam_n += o->pieces[k].numel;
	}
	o->m = loom_alloc_aligned(LOOM_MAX(o->adam_n, 1) * sizeof(float));
	o->v = loom_alloc_aligned(LOOM_MAX(o->adam_n, 1) * sizeof(float));
	if (!o->m || !o->v)
		goto nomem;
	memset(o->m, 0, o->adam_n * sizeof(float));
	memset(o->v, 0, o->adam_n * sizeof(float));
	free(ranges);
	return LOOM_OK;
nomem:
	rc = loom_seterr(LOOM_ENOMEM, "muon: out of memory for the optimizer state of %d tensors", ntensors);
fail:
	free(ranges);
	loom_muonadamw_free(o);
	return rc;
}

void loom_muonadamw_free(loom_muonadamw_t *o)
{
	for (int k = 0; o->mats && k < o->nmat; k++) {
		loom_free_aligned(o->mats[k].buf);
		loom_free_aligned(o->mats[k].s);
	}
	free(o->mats);
	free(o->pieces);
	loom_free_aligned(o->m);
	loom_free_aligned(o->v);
	loom_free_aligned(o->scratch);
	memset(o, 0, sizeof *o);
}

/* nanochat's AdamW on one piece: m = lerp(m, g, 1 - b1), v = lerp(v, g^2, 1 - b2),
 * p -= (lr / bias1) m / (sqrt(v / bias2) + eps) (its weight decay is 0 in every group). */
static void adam_piece(float *restrict p, const float *restrict g, float *restrict m, float *restrict v, size_t n,
                       float gs, float b1, float b2, float bias2, float eps, float neg_step)
{
	const float a1 = 1.0f - b1, a2 = 1.0f - b2;
#pragma omp parallel for simd schedule(static) if (n >= PAR_MIN)
	for (size_t i = 0; i < n; i++) {
		float gi = g[i] * gs;
		float mi = m[i] + a1 * (gi - m[i]);
		float vi = v[i] + a2 * (gi * gi - v[i]);
		m[i] = mi, v[i] = vi;
		p[i] += neg_step * mi / (sqrtf(vi / bias2) + eps);
	}
}

int loom_muonadamw_step(loom_muonadamw_t *o, float *params, const float *grads, float lr_multiplier,
                        float grad_scale)
{
	return loom_muonadamw_step_at(o, params, grads, 0, lr_multiplier, grad_scale);
}

int loom_muonadamw_step_at(loom_muonadamw_t *o, float *params, const float *grads, size_t base,
                           float lr_multiplier, float grad_scale)
{
	int rc;
	if (!(lr_multiplier >= 0.0f) || !isfinite(lr_multiplier) || !isfinite(grad_scale))
		return loom_seterr(LOOM_EINVAL, "muon: lr multiplier %g and gradient scale %g must be finite, the "
		                   "multiplier >= 0", lr_multiplier, grad_scale);
	if (!o->m)
		return loom_seterr(LOOM_ESTATE, "muon: optimizer not initialized");
	const long long step = o->step;
	const float mu = loom_muon_momentum(step);
	/* past total_steps nanochat's decay would turn negative; loom stops at 0 */
	const float wd = (float)fmax(0.0, loom_muon_weight_decay(o->cfg.weight_decay, step, o->cfg.total_steps));
	const float mlr = (float)((double)o->cfg.matrix_lr * lr_multiplier);
	for (int k = 0; k < o->nmat; k++) {
		loom_muon_matrix_t *mt = &o->mats[k];
		if (mt->offset < base)
			return loom_seterr(LOOM_EINVAL, "muon: matrix at float %zu is below the buffers' first float %zu",
			                   mt->offset, base);
		rc = loom_muon_update(params + (mt->offset - base), grads + (mt->offset - base), grad_scale, mt->buf, mt->s,
		                      mt->rows, mt->cols,
		                      mt->transposed, mlr, wd, mu, o->cfg.muon_beta2, o->scratch);
		if (rc != LOOM_OK) /* cannot happen after the checks above and at init */
			return rc;
	}
	const double t = (double)(step + 1);
	for (int k = 0; k < o->npieces; k++) {
		const loom_muon_adam_piece_t *pc = &o->pieces[k];
		double lr = pc->lr * lr_multiplier;
		float bias1 = (float)(1.0 - pow(pc->beta1, t)), bias2 = (float)(1.0 - pow(pc->beta2, t));
		float neg_step = (float)(-(double)(float)lr / bias1);
		if (pc->offset < base)
			return loom_seterr(LOOM_EINVAL, "muon: AdamW piece at float %zu is below the buffers' first float %zu",
			                   pc->offset, base);
		adam_piece(params + (pc->offset - base), grads + (pc->offset - base), o->m + pc->state, o->v + pc->state, pc->numel, grad_scale,
		           pc->beta1, pc->beta2, bias2, o->cfg.adam_eps, neg_step);
	}
	o->step++;
	return LOOM_OK;
}
