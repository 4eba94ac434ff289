/* test_muon.c: MuonAdamW (src/optim/muon.c, muon_sched.c) against a float64 PyTorch reference
 * (tests/ref/muon_ref.py, run with /usr/bin/python3, torch 1.13), its DistMuon ownership rules, the
 * transposed-storage identity, sharded optimizers against one whole optimizer, and base_train's
 * schedules. Inputs and outputs go through raw files in a temporary directory.
 *
 * Tolerances (loom in fp32, the reference in fp64), after every step, per matrix or tensor: the
 * parameters, Muon's momentum and second moment and AdamW's moments within 1e-5 of their largest
 * magnitude; and, stricter, the step's update (p - p_prev, each side from its own p_prev) within
 * UPDATE_TOL of the largest update. That one is 2e-5, not 1e-5: its floor is fp32 itself, one
 * rounding of p (2^-24 |p| ~ 1e-8 against updates of ~2e-3: 5e-6), and NorMuon divides every column
 * (or row) by its own RMS, which magnifies fp32's absolute error in the small ones (measured: up to
 * 9e-6 on the [2, 32] ve_gate). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h" /* loom__fault_alloc_set */
#include "loom/muon.h"
#include "loom/util.h"
#include "test.h"

#define UPDATE_TOL 2e-5

static uint32_t rng_state;
static float urand(void) /* uniform in [-1, 1) */
{
	rng_state = rng_state * 1664525u + 1013904223u;
	return (float)(rng_state >> 8) / 8388608.0f - 1.0f;
}

/* A gradient-like matrix (stored layout, R x C): noise plus a strong rank-2 part, so that its
 * singular values spread over two orders of magnitude. */
static void fill_grad(float *g, int R, int C, float amp)
{
	float u[2][512], w[2][512];
	for (int k = 0; k < 2; k++) {
		for (int i = 0; i < R; i++)
			u[k][i] = urand();
		for (int j = 0; j < C; j++)
			w[k][j] = urand();
	}
	for (int i = 0; i < R; i++)
		for (int j = 0; j < C; j++)
			g[(size_t)i * C + j] = amp * (0.05f * urand() + u[0][i] * w[0][j] + 0.3f * u[1][i] * w[1][j]);
}

static double *read_f64(const char *path, size_t n)
{
	FILE *f = fopen(path, "rb");
	double *d = malloc(n * sizeof *d);
	size_t got = f && d ? fread(d, sizeof *d, n, f) : 0;
	if (f)
		fclose(f);
	if (got != n) {
		free(d);
		return NULL;
	}
	return d;
}

static int run_ref(const char *mode, const char *dir)
{
	char cmd[1200], out[4096];
	snprintf(cmd, sizeof cmd, "OMP_NUM_THREADS=1 /usr/bin/python3 tests/ref/muon_ref.py %s %s", mode, dir);
	int st = test_run_cmd(cmd, out, sizeof out, 120);
	CHECK_MSG(st == 0, "'%s' exited with %d (run from the source root; needs python3-torch):\n%s", cmd, st, out);
	return 0;
}

/* max |a - b| over n, and max |b| */
static double max_diff(const float *a, const double *b, size_t n, double *scale)
{
	double d = 0.0, s = 0.0;
	for (size_t i = 0; i < n; i++) {
		d = fmax(d, fabs(a[i] - b[i]));
		s = fmax(s, fabs(b[i]));
	}
	*scale = s;
	return d;
}

/* The same for one step's updates: loom's a - a0 against the reference's b - b0. */
static double max_diff_update(const float *a, const float *a0, const double *b, const double *b0, size_t n,
                              double *scale)
{
	double d = 0.0, s = 0.0;
	for (size_t i = 0; i < n; i++) {
		d = fmax(d, fabs(((double)a[i] - a0[i]) - (b[i] - b0[i])));
		s = fmax(s, fabs(b[i] - b0[i]));
	}
	*scale = s;
	return d;
}

static void write_spec_line(FILE *f, const char *fmt, double a, double b, double c, double d, double e)
{
	fprintf(f, fmt, a, b, c, d, e);
}

typedef struct {
	int rows, cols, transposed, steps;
} shape_t;

/* ---- one matrix, several shapes and steps, against torch ---------------------------------------- */

TEST(muon_update_torch)
{
	static const shape_t shapes[] = {{16, 40, 0, 5}, {24, 24, 0, 5}, {48, 20, 0, 5},  {48, 20, 1, 5},
	                                 {20, 48, 1, 5}, {24, 24, 1, 5}, {256, 128, 1, 3}, {7, 130, 0, 4}};
	const int ns = (int)(sizeof shapes / sizeof shapes[0]);
	char dir[512], path[700];
	double worst_p = 0.0, worst_u = 0.0, worst_b = 0.0, worst_s = 0.0;
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	snprintf(path, sizeof path, "%s/spec.txt", dir);
	FILE *spec = fopen(path, "w");
	CHECK(spec != NULL);
	rng_state = 7;
	for (int m = 0; m < ns; m++) {
		const shape_t *sh = &shapes[m];
		size_t n = (size_t)sh->rows * sh->cols;
		int R = sh->transposed ? sh->cols : sh->rows, C = sh->transposed ? sh->rows : sh->cols;
		float *p = malloc(n * sizeof *p), *g = malloc(n * sh->steps * sizeof *g);
		CHECK(p && g);
		for (size_t i = 0; i < n; i++)
			p[i] = 0.1f * urand();
		for (int k = 0; k < sh->steps; k++)
			fill_grad(g + k * n, R, C, k % 2 ? 3.0f : 0.02f);
		snprintf(path, sizeof path, "%s/m%d_p0.bin", dir, m);
		CHECK(test_write_file(path, p, n * sizeof *p) == 0);
		snprintf(path, sizeof path, "%s/m%d_g.bin", dir, m);
		CHECK(test_write_file(path, g, n * sh->steps * sizeof *g) == 0);
		fprintf(spec, "matrix %d %d %d %d %d\n", m, sh->rows, sh->cols, sh->transposed, sh->steps);
		for (int k = 0; k < sh->steps; k++) /* lr, wd, mu, beta2, grad scale */
			write_spec_line(spec, "step %.9g %.9g %.9g %.9g %.9g\n", (float)(0.02 * (1.0 - 0.1 * k)),
			                (float)(0.2 * (1.0 - 0.15 * k)), loom_muon_momentum(70LL * k), 0.95f, k % 3 ? 0.5f : 1.0f);
		free(p);
		free(g);
	}
	CHECK(fclose(spec) == 0);
	if (run_ref("kernel", dir))
		return 1;

	rng_state = 7; /* the same inputs again */
	for (int m = 0; m < ns; m++) {
		const shape_t *sh = &shapes[m];
		size_t n = (size_t)sh->rows * sh->cols, nsv = (size_t)(sh->rows > sh->cols ? sh->rows : sh->cols);
		size_t per = 2 * n + nsv;
		int R = sh->transposed ? sh->cols : sh->rows, C = sh->transposed ? sh->rows : sh->cols;
		float *p = malloc(n * sizeof *p), *g = malloc(n * sh->steps * sizeof *g);
		float *buf = calloc(n, sizeof *buf), *s = calloc(nsv, sizeof *s);
		float *scratch = loom_alloc_aligned(loom_muon_scratch_floats(sh->rows, sh->cols) * sizeof(float));
		double *p0 = malloc(n * sizeof *p0);
		float *pl = malloc(n * sizeof *pl);
		CHECK(p && g && buf && s && scratch && p0 && pl);
		for (size_t i = 0; i < n; i++)
			p[i] = 0.1f * urand(), p0[i] = p[i];
		for (int k = 0; k < sh->steps; k++)
			fill_grad(g + k * n, R, C, k % 2 ? 3.0f : 0.02f);
		snprintf(path, sizeof path, "%s/m%d_out.bin", dir, m);
		double *ref = read_f64(path, per * sh->steps);
		CHECK_MSG(ref != NULL, "%s missing or short", path);
		for (int k = 0; k < sh->steps; k++) {
			const double *rp = ref + k * per, *rb = rp + n, *rs = rb + n, *prev = k ? rp - per : p0;
			double sp, sb, ss, su, dp, db, dsv, du;
			memcpy(pl, p, n * sizeof *pl);
			CHECK_OK(loom_muon_update(p, g + k * n, k % 3 ? 0.5f : 1.0f, buf, s, sh->rows, sh->cols, sh->transposed,
			                          (float)(0.02 * (1.0 - 0.1 * k)), (float)(0.2 * (1.0 - 0.15 * k)),
			                          loom_muon_momentum(70LL * k), 0.95f, scratch));
			dp = max_diff(p, rp, n, &sp);
			du = max_diff_update(p, pl, rp, prev, n, &su);
			db = max_diff(buf, rb, n, &sb);
			dsv = max_diff(s, rs, nsv, &ss);
			CHECK_MSG(dp <= 1e-5 * sp && du <= UPDATE_TOL * su && db <= 1e-5 * sb && dsv <= 1e-5 * ss,
			          "[%d, %d]%s step %d: p off by %.3g (max %.3g), its update by %.3g (max %.3g), buf by %.3g "
			          "(max %.3g), s by %.3g (max %.3g)", sh->rows, sh->cols, sh->transposed ? " transposed" : "", k,
			          dp, sp, du, su, db, sb, dsv, ss);
			worst_p = fmax(worst_p, dp / sp), worst_u = fmax(worst_u, du / su);
			worst_b = fmax(worst_b, db / sb), worst_s = fmax(worst_s, dsv / ss);
		}
		free(ref);
		free(p), free(g), free(buf), free(s), free(p0), free(pl);
		loom_free_aligned(scratch);
	}
	fprintf(stderr, "  vs torch fp64 (relative): worst p %.2g, update %.2g, buf %.2g, s %.2g\n", worst_p, worst_u,
	        worst_b, worst_s);
	if (!getenv("LOOM_TEST_KEEP"))
		test_rmdir(dir);
	return 0;
}

/* A matrix stored transposed gets the transpose of the update its transpose would get, without a
 * copy; bad arguments change nothing. */
TEST(muon_update_transposed)
{
	const int rows = 40, cols = 24, steps = 3;
	size_t n = (size_t)rows * cols, nsv = rows;
	float *p = malloc(n * 4), *pt = malloc(n * 4), *g = malloc(n * 4), *gt = malloc(n * 4);
	float *b = calloc(n, 4), *bt = calloc(n, 4), *s = calloc(nsv, 4), *st = calloc(nsv, 4);
	float *scratch = loom_alloc_aligned(loom_muon_scratch_floats(rows, cols) * sizeof(float));
	CHECK(p && pt && g && gt && b && bt && s && st && scratch);
	CHECK_EQ(loom_muon_scratch_floats(rows, cols), 2 * n + 2 * 24 * 24 + 3 * 40);
	rng_state = 99;
	for (int i = 0; i < rows; i++)
		for (int j = 0; j < cols; j++)
			p[i * cols + j] = pt[j * rows + i] = 0.1f * urand();
	for (int k = 0; k < steps; k++) {
		fill_grad(g, rows, cols, 1.0f);
		for (int i = 0; i < rows; i++)
			for (int j = 0; j < cols; j++)
				gt[j * rows + i] = g[i * cols + j];
		CHECK_OK(loom_muon_update(p, g, 1.0f, b, s, rows, cols, 0, 0.02f, 0.1f, 0.9f, 0.95f, scratch));
		CHECK_OK(loom_muon_update(pt, gt, 1.0f, bt, st, rows, cols, 1, 0.02f, 0.1f, 0.9f, 0.95f, scratch));
	}
	double d = 0.0, mx = 0.0;
	for (int i = 0; i < rows; i++)
		for (int j = 0; j < cols; j++)
			d = fmax(d, fabs(p[i * cols + j] - pt[j * rows + i])), mx = fmax(mx, fabs(b[i * cols + j]));
	CHECK_MSG(d <= 1e-6, "transposed storage differs by %.3g", d);
	for (size_t i = 0; i < nsv; i++)
		CHECK_NEAR(s[i], st[i], 1e-6 * fabs(s[i]) + 1e-12);
	memcpy(pt, p, n * 4);
	CHECK_ERR(loom_muon_update(p, g, 1.0f, b, s, 0, cols, 0, 0.02f, 0.1f, 0.9f, 0.95f, scratch), LOOM_EINVAL);
	CHECK_ERR(loom_muon_update(p, g, 1.0f, b, s, rows, cols, 0, -1.0f, 0.1f, 0.9f, 0.95f, scratch), LOOM_EINVAL);
	CHECK_ERR(loom_muon_update(p, g, 1.0f, b, s, rows, cols, 0, 0.02f, NAN, 0.9f, 0.95f, scratch), LOOM_EINVAL);
	CHECK_ERR(loom_muon_update(p, g, 1.0f, b, s, rows, cols, 0, 0.02f, 0.1f, 1.5f, 0.95f, scratch), LOOM_EINVAL);
	CHECK(memcmp(p, pt, n * 4) == 0);
	free(p), free(pt), free(g), free(gt), free(b), free(bt), free(s), free(st);
	loom_free_aligned(scratch);
	return 0;
}

/* ---- a nanochat-like parameter table ------------------------------------------------------------- */

enum { V = 64, CE = 32, NKV = 2, MAXT = 24 };

static void add(loom_tensor_info_t *t, int *nt, size_t *off, const char *name, loom_opt_group_t grp, size_t s0,
                size_t s1, int transposed)
{
	loom_tensor_info_t *x = &t[(*nt)++];
	memset(x, 0, sizeof *x);
	snprintf(x->name, sizeof x->name, "%s", name);
	x->ndim = s1 ? 2 : 1;
	x->shape[0] = s0, x->shape[1] = s1;
	x->numel = s1 ? s0 * s1 : s0;
	x->offset = *off;
	*off += x->numel;
	x->opt_group = grp;
	x->transposed = transposed;
	if (s1)
		x->rows = (int)(transposed ? s1 : s0), x->cols = (int)(transposed ? s0 : s1);
}

/* nanochat's tensors for L = 2, C = 32, V = 64, 2 kv heads of 16 (value embedding and ve_gate on
 * layer 1), plus a GPT-2-style transposed c_attn [in, out] and its bias (LOOM_OPT_VECTOR). */
static int nanochat_table(loom_tensor_info_t *t, size_t *n)
{
	int nt = 0;
	size_t off = 0;
	char name[64];
	add(t, &nt, &off, "transformer.wte.weight", LOOM_OPT_EMBED, V, CE, 0);
	add(t, &nt, &off, "value_embeds.1.weight", LOOM_OPT_EMBED, V, NKV * 16, 0);
	add(t, &nt, &off, "resid_lambdas", LOOM_OPT_SCALAR, 2, 0, 0);
	add(t, &nt, &off, "x0_lambdas", LOOM_OPT_X0, 2, 0, 0);
	for (int l = 0; l < 2; l++) {
		static const char *attn[4] = {"c_q", "c_k", "c_v", "c_proj"};
		for (int k = 0; k < 4; k++) {
			snprintf(name, sizeof name, "transformer.h.%d.attn.%s.weight", l, attn[k]);
			add(t, &nt, &off, name, LOOM_OPT_MATRIX, CE, CE, 0);
		}
		if (l == 1) {
			snprintf(name, sizeof name, "transformer.h.%d.attn.ve_gate.weight", l);
			add(t, &nt, &off, name, LOOM_OPT_MATRIX, NKV, 32, 0);
		}
		snprintf(name, sizeof name, "transformer.h.%d.mlp.c_fc.weight", l);
		add(t, &nt, &off, name, LOOM_OPT_MATRIX, 4 * CE, CE, 0);
		snprintf(name, sizeof name, "transformer.h.%d.mlp.c_proj.weight", l);
		add(t, &nt, &off, name, LOOM_OPT_MATRIX, CE, 4 * CE, 0);
	}
	add(t, &nt, &off, "gpt2.attn.c_attn.weight", LOOM_OPT_MATRIX, CE, 3 * CE, 1);
	add(t, &nt, &off, "gpt2.attn.c_attn.bias", LOOM_OPT_VECTOR, 3 * CE, 0, 0);
	add(t, &nt, &off, "lm_head.weight", LOOM_OPT_UNEMBED, V, CE, 0);
	*n = off;
	return nt;
}

static loom_muon_config_t test_config(void)
{
	loom_muon_config_t c = loom_muon_defaults();
	c.n_embd = CE, c.total_steps = 8;
	c.adamw_lr = 0.05f; /* GPT-2's AdamW group (VECTOR): a rate whose updates stand above p's rounding */
	return c;
}

enum { STEPS = 8 };

static float step_lrm(int k)
{
	return (float)loom_muon_lr_multiplier(k, STEPS, 0.25, 0.5, 0.1);
}

static float step_gs(int k)
{
	return k % 3 == 1 ? 0.5f : 1.0f;
}

static void make_inputs(const loom_tensor_info_t *t, int nt, size_t n, float *params, float *grads)
{
	rng_state = 2024;
	for (size_t i = 0; i < n; i++)
		params[i] = 0.2f * urand();
	for (int k = 0; k < STEPS; k++)
		for (int i = 0; i < nt; i++) {
			float *g = grads + k * n + t[i].offset;
			if (t[i].ndim == 2)
				fill_grad(g, (int)t[i].shape[0], (int)t[i].shape[1], k % 2 ? 0.5f : 0.01f);
			else
				for (size_t j = 0; j < t[i].numel; j++)
					g[j] = 0.1f * urand();
		}
}

TEST(muonadamw_torch)
{
	loom_tensor_info_t t[MAXT];
	size_t n;
	int nt = nanochat_table(t, &n);
	loom_muon_config_t cfg = test_config();
	loom_muonadamw_t o;
	char dir[512], path[700];
	float *params = malloc(n * 4), *grads = malloc(n * STEPS * 4);
	CHECK(params && grads);
	make_inputs(t, nt, n, params, grads);
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	snprintf(path, sizeof path, "%s/params0.bin", dir);
	CHECK(test_write_file(path, params, n * 4) == 0);
	snprintf(path, sizeof path, "%s/grads.bin", dir);
	CHECK(test_write_file(path, grads, n * STEPS * 4) == 0);
	snprintf(path, sizeof path, "%s/spec.txt", dir);
	FILE *f = fopen(path, "w");
	CHECK(f != NULL);
	for (int i = 0; i < nt; i++)
		fprintf(f, "tensor %s %d %zu %zu %zu %zu %d %d %d\n", t[i].name, (int)t[i].opt_group, t[i].offset, t[i].numel,
		        t[i].shape[0], t[i].shape[1], t[i].transposed, t[i].rows, t[i].cols);
	fprintf(f, "config n_embd=%d total_steps=%lld unembedding_lr=%.9g embedding_lr=%.9g matrix_lr=%.9g scalar_lr=%.9g "
	        "adam_beta1=%.9g adam_beta2=%.9g x0_beta1=%.9g adam_eps=%.9g weight_decay=%.9g muon_beta2=%.9g "
	        "adamw_lr=%.9g\n",
	        cfg.n_embd, cfg.total_steps, cfg.unembedding_lr, cfg.embedding_lr, cfg.matrix_lr, cfg.scalar_lr,
	        cfg.adam_beta1, cfg.adam_beta2, cfg.x0_beta1, cfg.adam_eps, cfg.weight_decay, cfg.muon_beta2, cfg.adamw_lr);
	for (int k = 0; k < STEPS; k++)
		fprintf(f, "step %d %.9g %.9g\n", k, step_lrm(k), step_gs(k));
	CHECK(fclose(f) == 0);
	if (run_ref("opt", dir))
		return 1;
	size_t nsv = 0;
	for (int i = 0; i < nt; i++)
		nsv += t[i].opt_group == LOOM_OPT_MATRIX ? (size_t)(t[i].rows > t[i].cols ? t[i].rows : t[i].cols) : 0;
	snprintf(path, sizeof path, "%s/out.bin", dir);
	double *ref = read_f64(path, n * (STEPS + 3) + nsv);
	CHECK_MSG(ref != NULL, "%s missing or short", path);
	double *prev = malloc(n * sizeof *prev), worst = 0.0, worst_u = 0.0;
	float *pl = malloc(n * sizeof *pl);
	CHECK(prev && pl);
	for (size_t i = 0; i < n; i++)
		prev[i] = params[i];

	CHECK_OK(loom_muonadamw_init(&o, t, nt, &cfg, NULL));
	CHECK_EQ(o.nmat, 14);
	CHECK_EQ(o.npieces, 6);
	for (int k = 0; k < STEPS; k++) {
		memcpy(pl, params, n * sizeof *pl);
		CHECK_OK(loom_muonadamw_step(&o, params, grads + k * n, step_lrm(k), step_gs(k)));
		const double *rp = ref + k * n;
		for (int i = 0; i < nt; i++) { /* tensor by tensor */
			size_t a = t[i].offset;
			double sc, su, d = max_diff(params + a, rp + a, t[i].numel, &sc);
			double du = max_diff_update(params + a, pl + a, rp + a, prev + a, t[i].numel, &su);
			CHECK_MSG(d <= 1e-5 * sc && du <= UPDATE_TOL * su, "step %d, %s: off by %.3g (max %.3g), its update by %.3g "
			          "(max %.3g)", k, t[i].name, d, sc, du, su);
			worst = fmax(worst, d / sc), worst_u = fmax(worst_u, du / su);
		}
		memcpy(prev, rp, n * sizeof *prev);
	}
	CHECK_EQ(o.step, STEPS);
	/* the state: AdamW's moments by piece, Muon's buf and s by matrix */
	const double *rm = ref + STEPS * n, *rv = rm + n, *rb = rv + n, *rs = rb + n;
	for (int k = 0; k < o.npieces; k++) {
		const loom_muon_adam_piece_t *pc = &o.pieces[k];
		double sm, sv, dm = max_diff(o.m + pc->state, rm + pc->offset, pc->numel, &sm);
		double dv = max_diff(o.v + pc->state, rv + pc->offset, pc->numel, &sv);
		CHECK_MSG(dm <= 1e-5 * sm && dv <= 1e-5 * sv, "%s: m off by %.3g (max %.3g), v by %.3g (max %.3g)",
		          t[pc->tensor].name, dm, sm, dv, sv);
	}
	for (int i = 0, at = 0; i < nt; i++) { /* the reference's s are in table order */
		if (t[i].opt_group != LOOM_OPT_MATRIX)
			continue;
		const loom_muon_matrix_t *mt = NULL;
		for (int k = 0; k < o.nmat; k++)
			if (o.mats[k].tensor == i)
				mt = &o.mats[k];
		CHECK(mt != NULL);
		size_t ms = (size_t)(t[i].rows > t[i].cols ? t[i].rows : t[i].cols);
		double sb, ss, db = max_diff(mt->buf, rb + t[i].offset, t[i].numel, &sb);
		double ds = max_diff(mt->s, rs + at, ms, &ss);
		CHECK_MSG(db <= 1e-5 * sb && ds <= 1e-5 * ss, "%s: buf off by %.3g (max %.3g), s by %.3g (max %.3g)",
		          t[i].name, db, sb, ds, ss);
		at += (int)ms;
	}
	fprintf(stderr, "  vs torch fp64 (relative, %d steps): worst parameter %.2g, update %.2g\n", STEPS, worst,
	        worst_u);
	loom_muonadamw_free(&o);
	free(ref), free(prev), free(pl), free(params), free(grads);
	if (!getenv("LOOM_TEST_KEEP"))
		test_rmdir(dir);
	return 0;
}

/* ---- sharded optimizers (DistMuon's ownership) against one whole optimizer ------------------------ */

/* Each rank of N owns loom_muon_owned's matrices and loom_muon_adam_share's floats; updating only
 * those on a private copy of the parameters, the owned parts are bit-identical to one optimizer over
 * everything, and so are their states (the per-piece and per-matrix layout a checkpoint reads). */
static int sharded_equal(const loom_tensor_info_t *t, int nt, size_t n, int N, const float *params0,
                         const float *grads, const loom_muonadamw_t *whole, const float *whole_params)
{
	loom_muon_config_t cfg = test_config();
	float *gathered = malloc(n * 4), *mine = malloc(n * 4);
	int *mats = malloc((size_t)nt * sizeof *mats), *cover = calloc(n, sizeof *cover);
	size_t(*ranges)[2] = malloc((size_t)nt * sizeof *ranges);
	CHECK(gathered && mine && mats && cover && ranges);
	for (int r = 0; r < N; r++) {
		loom_muonadamw_t o;
		loom_muon_owned_t own = {.ranges = (const size_t(*)[2])ranges, .matrices = mats};
		own.nmatrices = loom_muon_owned(t, nt, r, N, mats);
		for (int i = 0; i < nt; i++) {
			size_t lo, hi;
			if (t[i].opt_group == LOOM_OPT_MATRIX)
				continue;
			CHECK(loom_muon_adam_share(&t[i], r, N, &lo, &hi) >= 0);
			ranges[own.nranges][0] = t[i].offset + lo, ranges[own.nranges++][1] = t[i].offset + hi;
		}
		memcpy(mine, params0, n * 4);
		CHECK_OK(loom_muonadamw_init(&o, t, nt, &cfg, &own));
		for (int k = 0; k < STEPS; k++)
			CHECK_OK(loom_muonadamw_step(&o, mine, grads + k * n, step_lrm(k), step_gs(k)));
		for (int k = 0; k < o.npieces; k++) { /* its AdamW floats, and their moments */
			const loom_muon_adam_piece_t *pc = &o.pieces[k];
			memcpy(gathered + pc->offset, mine + pc->offset, pc->numel * 4);
			for (size_t i = pc->offset; i < pc->offset + pc->numel; i++)
				cover[i]++;
			const loom_muon_adam_piece_t *wp = NULL;
			for (int j = 0; j < whole->npieces; j++)
				if (whole->pieces[j].tensor == pc->tensor)
					wp = &whole->pieces[j];
			CHECK(wp != NULL);
			size_t at = wp->state + (pc->offset - wp->offset);
			CHECK(memcmp(o.m + pc->state, whole->m + at, pc->numel * 4) == 0);
			CHECK(memcmp(o.v + pc->state, whole->v + at, pc->numel * 4) == 0);
		}
		for (int k = 0; k < o.nmat; k++) { /* its matrices, and their momentum and second moment */
			const loom_muon_matrix_t *mt = &o.mats[k];
			size_t nn = (size_t)mt->rows * mt->cols, ns = (size_t)(mt->rows > mt->cols ? mt->rows : mt->cols);
			CHECK_EQ(loom_muon_owner(t, nt, mt->tensor, N), r);
			memcpy(gathered + mt->offset, mine + mt->offset, nn * 4);
			for (size_t i = mt->offset; i < mt->offset + nn; i++)
				cover[i]++;
			const loom_muon_matrix_t *wm = NULL;
			for (int j = 0; j < whole->nmat; j++)
				if (whole->mats[j].tensor == mt->tensor)
					wm = &whole->mats[j];
			CHECK(wm != NULL);
			CHECK(memcmp(mt->buf, wm->buf, nn * 4) == 0 && memcmp(mt->s, wm->s, ns * 4) == 0);
		}
		loom_muonadamw_free(&o);
	}
	/* every float updated by exactly one rank, or by all N when replicated (< 1024 elements) */
	for (int i = 0; i < nt; i++)
		for (size_t j = t[i].offset; j < t[i].offset + t[i].numel; j++)
			CHECK_MSG(cover[j] == (t[i].opt_group != LOOM_OPT_MATRIX && t[i].numel < 1024 ? N : 1),
			          "%d ranks: %s[%zu] updated %d times", N, t[i].name, j - t[i].offset, cover[j]);
	CHECK_MSG(memcmp(gathered, whole_params, n * 4) == 0, "%d ranks: gathered parameters differ from one optimizer's",
	          N);
	free(gathered), free(mine), free(mats), free(cover), free(ranges);
	return 0;
}

TEST(muonadamw_sharded)
{
	loom_tensor_info_t t[MAXT];
	size_t n;
	int nt = nanochat_table(t, &n);
	loom_muon_config_t cfg = test_config();
	loom_muonadamw_t whole, o2;
	float *params = malloc(n * 4), *params0 = malloc(n * 4), *grads = malloc(n * STEPS * 4), *p2 = malloc(n * 4);
	CHECK(params && params0 && grads && p2);
	make_inputs(t, nt, n, params, grads);
	memcpy(params0, params, n * 4);
	CHECK_OK(loom_muonadamw_init(&whole, t, nt, &cfg, NULL));
	for (int k = 0; k < STEPS; k++)
		CHECK_OK(loom_muonadamw_step(&whole, params, grads + k * n, step_lrm(k), step_gs(k)));
	for (int N = 1; N <= 4; N *= 2) /* N = 4: groups of 1 matrix (K < N), of 2 and of 8 */
		if (sharded_equal(t, nt, n, N, params0, grads, &whole, params))
			return 1;

	/* resuming from the state (step, m, v, buf, s copied into a fresh optimizer) continues bit for bit */
	memcpy(p2, params0, n * 4);
	CHECK_OK(loom_muonadamw_init(&o2, t, nt, &cfg, NULL));
	for (int k = 0; k < STEPS / 2; k++)
		CHECK_OK(loom_muonadamw_step(&o2, p2, grads + k * n, step_lrm(k), step_gs(k)));
	loom_muonadamw_t o3;
	CHECK_OK(loom_muonadamw_init(&o3, t, nt, &cfg, NULL));
	CHECK_EQ(o3.adam_n, o2.adam_n);
	CHECK_EQ(o3.nmat, o2.nmat);
	o3.step = o2.step;
	memcpy(o3.m, o2.m, o2.adam_n * 4);
	memcpy(o3.v, o2.v, o2.adam_n * 4);
	for (int k = 0; k < o2.nmat; k++) {
		const loom_muon_matrix_t *a = &o2.mats[k];
		CHECK_EQ(o3.mats[k].tensor, a->tensor);
		memcpy(o3.mats[k].buf, a->buf, (size_t)a->rows * a->cols * 4);
		memcpy(o3.mats[k].s, a->s, (size_t)(a->rows > a->cols ? a->rows : a->cols) * 4);
	}
	loom_muonadamw_free(&o2);
	for (int k = STEPS / 2; k < STEPS; k++)
		CHECK_OK(loom_muonadamw_step(&o3, p2, grads + k * n, step_lrm(k), step_gs(k)));
	CHECK(memcmp(p2, params, n * 4) == 0);
	loom_muonadamw_free(&o3);

	/* errors leave nothing behind */
	CHECK_ERR(loom_muonadamw_step(&whole, params, grads, -1.0f, 1.0f), LOOM_EINVAL);
	CHECK_EQ(whole.step, STEPS);
	loom_muon_config_t bad = cfg;
	bad.adam_beta1 = 1.0f;
	CHECK_ERR(loom_muonadamw_init(&o2, t, nt, &bad, NULL), LOOM_EINVAL);
	int notmat = 0; /* wte */
	loom_muon_owned_t own = {.matrices = &notmat, .nmatrices = 1};
	CHECK_ERR(loom_muonadamw_init(&o2, t, nt, &cfg, &own), LOOM_EINVAL);
	size_t overlap[2][2] = {{0, 100}, {50, 200}};
	loom_muon_owned_t own2 = {.ranges = (const size_t(*)[2])overlap, .nranges = 2};
	CHECK_ERR(loom_muonadamw_init(&o2, t, nt, &cfg, &own2), LOOM_EINVAL);
	loom_tensor_info_t badt[MAXT];
	memcpy(badt, t, sizeof badt);
	badt[5].rows = 16; /* no longer its shape */
	CHECK_ERR(loom_muonadamw_init(&o2, badt, nt, &cfg, NULL), LOOM_EINVAL);
	loom_muonadamw_free(&o2); /* safe after a failed init */
	loom_muonadamw_free(&whole);
	free(params), free(params0), free(grads), free(p2);
	return 0;
}

/* ---- DistMuon's partition rules ------------------------------------------------------------------ */

TEST(muon_partition)
{
	loom_tensor_info_t t[MAXT];
	size_t n, lo, hi;
	int nt = nanochat_table(t, &n), members[MAXT], owned[MAXT], rows, cols;
	/* groups by shape, ordered by (rows, cols): [2,32] x1, [32,32] x8, [32,128] x2, [96,32] x1 (the
	 * transposed c_attn, by its [out, in] view), [128,32] x2 */
	static const int want[5][3] = {{2, 32, 1}, {32, 32, 8}, {32, 128, 2}, {96, 32, 1}, {128, 32, 2}};
	CHECK_EQ(loom_muon_num_groups(t, nt), 5);
	for (int g = 0; g < 5; g++) {
		int K = loom_muon_group(t, nt, g, &rows, &cols, members, MAXT);
		CHECK_EQ(rows, want[g][0]);
		CHECK_EQ(cols, want[g][1]);
		CHECK_EQ(K, want[g][2]);
		for (int k = 1; k < K; k++)
			CHECK(members[k] > members[k - 1]); /* table order */
	}
	CHECK_ERR(loom_muon_group(t, nt, 5, &rows, &cols, members, MAXT), LOOM_EINVAL);
	CHECK_EQ(loom_muon_group(t, nt, 1, NULL, NULL, members, 3), 8); /* K even when cap is smaller */
	CHECK_EQ(loom_muon_chunk(8, 3), 3);
	CHECK_EQ(loom_muon_chunk(1, 4), 1);
	CHECK_EQ(loom_muon_chunk(2, 4), 1);
	CHECK_EQ(loom_muon_chunk(8, 8), 1);

	/* the [32,32] group, 8 members: ceil(8/3) = 3 per rank: 3, 3, 2; with 5 ranks: 2, 2, 2, 2, 0 */
	loom_muon_group(t, nt, 1, NULL, NULL, members, MAXT);
	for (int k = 0; k < 8; k++) {
		CHECK_EQ(loom_muon_owner(t, nt, members[k], 3), k / 3);
		CHECK_EQ(loom_muon_owner(t, nt, members[k], 5), k / 2);
		CHECK_EQ(loom_muon_owner(t, nt, members[k], 1), 0);
	}
	CHECK_ERR(loom_muon_owner(t, nt, 0, 2), LOOM_EINVAL); /* wte is not Muon's */
	for (int N = 1; N <= 16; N++) { /* the owned lists partition the matrices */
		int seen[MAXT] = {0}, total = 0;
		for (int r = 0; r < N; r++) {
			int c = loom_muon_owned(t, nt, r, N, owned);
			for (int k = 0; k < c; k++) {
				CHECK_EQ(loom_muon_owner(t, nt, owned[k], N), r);
				seen[owned[k]]++;
			}
			total += c;
		}
		CHECK_EQ(total, 14);
		for (int i = 0; i < nt; i++)
			CHECK_EQ(seen[i], t[i].opt_group == LOOM_OPT_MATRIX);
	}
	/* with 4 ranks: rank 0 owns the singletons and the first of each pair, rank 3 two [32,32] only */
	CHECK_EQ(loom_muon_owned(t, nt, 0, 4, owned), 6);
	CHECK_EQ(loom_muon_owned(t, nt, 1, 4, owned), 4);
	CHECK_EQ(loom_muon_owned(t, nt, 3, 4, owned), 2);
	CHECK_EQ(loom_muon_owned(t, nt, 4, 4, owned), 0);

	/* AdamW shares: wte [64, 32] split by rows, the 96-float bias and the 2 scalars replicated */
	CHECK_EQ(loom_muon_adam_share(&t[0], 1, 4, &lo, &hi), 1);
	CHECK_EQ(lo, 16 * 32);
	CHECK_EQ(hi, 32 * 32);
	CHECK_EQ(loom_muon_adam_share(&t[0], 3, 4, &lo, &hi), 1);
	CHECK_EQ(hi, 64 * 32);
	CHECK_EQ(loom_muon_adam_share(&t[2], 1, 4, &lo, &hi), 0);
	CHECK_EQ(lo, 0);
	CHECK_EQ(hi, 2);
	CHECK_ERR(loom_muon_adam_share(&t[0], 0, 3, &lo, &hi), LOOM_EINVAL); /* 64 rows, 3 ranks */
	CHECK_ERR(loom_muon_adam_share(&t[4], 0, 2, &lo, &hi), LOOM_EINVAL); /* a Muon matrix */
	loom_tensor_info_t big = t[2];
	big.shape[0] = big.numel = 1024; /* a 1-D tensor of 1024: split */
	CHECK_EQ(loom_muon_adam_share(&big, 1, 2, &lo, &hi), 1);
	CHECK_EQ(lo, 512);
	CHECK_EQ(hi, 1024);
	big.shape[0] = big.numel = 1023;
	CHECK_EQ(loom_muon_adam_share(&big, 1, 2, &lo, &hi), 0);
	return 0;
}

/* ---- base_train's schedules ------------------------------------------------------------------------ */

TEST(muon_schedules)
{
	/* get_lr_multiplier with num_iterations 100, warmup_ratio 0.1, warmdown_ratio 0.5, final 0.1 */
	CHECK_NEAR(loom_muon_lr_multiplier(0, 100, 0.1, 0.5, 0.1), 0.1, 1e-15);
	CHECK_NEAR(loom_muon_lr_multiplier(9, 100, 0.1, 0.5, 0.1), 1.0, 1e-15);
	CHECK_NEAR(loom_muon_lr_multiplier(10, 100, 0.1, 0.5, 0.1), 1.0, 1e-15);
	CHECK_NEAR(loom_muon_lr_multiplier(50, 100, 0.1, 0.5, 0.1), 1.0, 1e-15);
	CHECK_NEAR(loom_muon_lr_multiplier(51, 100, 0.1, 0.5, 0.1), 0.98 + 0.02 * 0.1, 1e-15);
	CHECK_NEAR(loom_muon_lr_multiplier(99, 100, 0.1, 0.5, 0.1), 0.02 + 0.98 * 0.1, 1e-15);
	CHECK_NEAR(loom_muon_lr_multiplier(100, 100, 0.1, 0.5, 0.1), 0.1, 1e-15); /* the step after the last */
	/* nanochat's defaults: no warmup, warmdown over the second half, to 0 */
	CHECK_FEQ(loom_muon_lr_multiplier(0, 10, 0.0, 0.5, 0.0), 1.0);
	CHECK_FEQ(loom_muon_lr_multiplier(5, 10, 0.0, 0.5, 0.0), 1.0);
	CHECK_NEAR(loom_muon_lr_multiplier(6, 10, 0.0, 0.5, 0.0), 0.8, 1e-15);
	CHECK_NEAR(loom_muon_lr_multiplier(9, 10, 0.0, 0.5, 0.0), 0.2, 1e-15);
	/* Python's round() is half to even: round(2.5) = 2 warmup steps, round(3.5) = 4 */
	CHECK_FEQ(loom_muon_lr_multiplier(0, 10, 0.25, 0.0, 0.0), 0.5);
	CHECK_FEQ(loom_muon_lr_multiplier(0, 10, 0.35, 0.0, 0.0), 0.25);
	CHECK_FEQ(loom_muon_lr_multiplier(9, 10, 0.0, 0.0, 0.0), 1.0); /* no warmdown */

	/* get_muon_momentum: 0.85 -> 0.95 over 300 steps */
	CHECK_NEAR(loom_muon_momentum(0), 0.85, 1e-7);
	CHECK_NEAR(loom_muon_momentum(150), 0.90, 1e-7);
	CHECK_NEAR(loom_muon_momentum(300), 0.95, 1e-7);
	CHECK_NEAR(loom_muon_momentum(100000), 0.95, 1e-7);
	/* get_weight_decay: linear to 0 */
	CHECK_FEQ(loom_muon_weight_decay(0.2, 0, 100), 0.2);
	CHECK_NEAR(loom_muon_weight_decay(0.2, 50, 100), 0.1, 1e-15);
	CHECK_NEAR(loom_muon_weight_decay(0.2, 99, 100), 0.002, 1e-15);
	/* batch scalings, against nanochat's B_ref and against another one */
	const double B_ref = LOOM_MUON_B_REF;
	CHECK_FEQ(loom_muon_batch_lr_scale(524288, B_ref), 1.0);
	CHECK_NEAR(loom_muon_batch_lr_scale(4 * 524288.0, B_ref), 2.0, 1e-15);
	CHECK_NEAR(loom_muon_batch_lr_scale(131072, B_ref), 0.5, 1e-15);
	CHECK_NEAR(loom_muon_batch_lr_scale(128, 256), 0.70710678118654757, 1e-16);
	CHECK_NEAR(loom_muon_weight_decay_scaled(0.2, 4 * 524288.0, B_ref, 2e9, 1e9), 0.2 * 2 * 0.5, 1e-15);
	CHECK_NEAR(loom_muon_weight_decay_scaled(0.2, 524288, B_ref, 1e9, 1e9), 0.2, 1e-15);
	/* 128 tokens per step for 8 steps, D_ref 2048: 0.2 x sqrt(1/2) x 2 with B_ref 256, x sqrt(2^-12) x 2 with 2^19 */
	CHECK_NEAR(loom_muon_weight_decay_scaled(0.2, 128, 256, 1024, 2048), 0.28284271247461906, 1e-16);
	CHECK_NEAR(loom_muon_weight_decay_scaled(0.2, 128, B_ref, 1024, 2048), 0.00625, 1e-17);
	CHECK_FEQ(loom_muon_auto_batch(1e9, 1e9, B_ref), 524288.0);
	CHECK_FEQ(loom_muon_auto_batch(8e9, 1e9, B_ref), 1048576.0); /* 2^19 8^0.383 = 2^20.15 -> 2^20 */
	CHECK_FEQ(loom_muon_auto_batch(1e9 / 8, 1e9, B_ref), 262144.0);
	CHECK_FEQ(loom_muon_auto_batch(8e9, 1e9, 256), 512.0);
	return 0;
}

/* Every allocation of init can fail: LOOM_ENOMEM, nothing leaked (the sanitizer build checks). */
TEST(muonadamw_init_nomem)
{
	loom_tensor_info_t t[MAXT];
	size_t n;
	int nt = nanochat_table(t, &n), n_fail = 0, mats[MAXT];
	loom_muon_config_t cfg = test_config();
	size_t ranges[2][2] = {{0, 100}, {3000, 5000}};
	loom_muon_owned_t own = {.ranges = (const size_t(*)[2])ranges, .nranges = 2, .matrices = mats};
	own.nmatrices = loom_muon_owned(t, nt, 0, 2, mats);
	for (long k = 1; k < 1000; k++) {
		loom_muonadamw_t o;
		loom__fault_alloc_set(k);
		int rc = loom_muonadamw_init(&o, t, nt, &cfg, k % 2 ? &own : NULL);
		int hit = loom__fault_alloc_hit();
		loom__fault_alloc_set(0);
		loom_muonadamw_free(&o);
		if (!hit) {
			CHECK_OK(rc);
			break;
		}
		CHECK_ERR(rc, LOOM_ENOMEM);
		n_fail++;
	}
	CHECK(n_fail > 2 * 8); /* two per owned matrix at least */
	return 0;
}

/* GPT-2's own table (loom/model.h): its Conv1D matrices are Muon's, stored transposed; wte and wpe
 * are EMBED, biases and LayerNorms VECTOR; a step runs and moves every tensor. */
TEST(muonadamw_gpt2_table)
{
	loom_model_config_t mc = {.n_layer = 2, .n_head = 2, .n_embd = 32, .seq_len = 16, .vocab_size = 61};
	loom_tensor_info_t t[64];
	int nt = loom_model_num_tensors(&mc);
	size_t n = loom_model_num_params(&mc);
	CHECK(nt > 0 && nt <= 64);
	for (int i = 0; i < nt; i++)
		CHECK_OK(loom_model_tensor_info(&mc, i, &t[i]));
	loom_muon_config_t cfg = test_config();
	loom_muonadamw_t o;
	CHECK_OK(loom_muonadamw_init(&o, t, nt, &cfg, NULL));
	CHECK_EQ(o.nmat, 4 * mc.n_layer); /* c_attn, attn.c_proj, c_fc, mlp.c_proj */
	CHECK_EQ(o.npieces, nt - 4 * mc.n_layer);
	for (int k = 0; k < o.nmat; k++)
		CHECK(o.mats[k].transposed);
	CHECK_EQ(loom_muon_num_groups(t, nt), 4); /* [32,32], [32,128], [96,32], [128,32]: 2 each */
	float *p = malloc(n * 4), *p0 = malloc(n * 4), *g = malloc(n * 4);
	CHECK(p && p0 && g);
	rng_state = 5;
	for (size_t i = 0; i < n; i++)
		p[i] = p0[i] = 0.1f * urand(), g[i] = 0.01f * urand();
	CHECK_OK(loom_muonadamw_step(&o, p, g, 1.0f, 1.0f));
	for (int i = 0; i < nt; i++) {
		size_t moved = 0;
		for (size_t j = t[i].offset; j < t[i].offset + t[i].numel; j++)
			moved += p[j] != p0[j];
		CHECK_MSG(moved > t[i].numel / 2, "%s: %zu of %zu moved", t[i].name, moved, t[i].numel);
	}
	loom_muonadamw_free(&o);
	free(p), free(p0), free(g);
	return 0;
}
