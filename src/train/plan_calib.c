/* plan_calib.c: this machine's calibration (loom/plan.h): the rates loom's own kernels reach at the
 * shapes a model runs, measured once per machine and build and cached, so that the planner's step
 * time rests on what this CPU does rather than on constants fitted to another one.
 *
 * Why these figures and no others: the planner composes a step from matmul FLOPs, attention FLOPs and
 * the bytes the elementwise kernels and the optimizer move (docs/plan.md, "Compute time"). A single
 * GEMM peak (1024^3) said nothing of the block's own products (K = C is short; the backward's
 * transposed operands), which reached 0.6 of it on one CPU and 0.95 on another, and the attention
 * kernel runs at a fraction of the GEMM's rate that depends on the head size and the sequence. So the
 * calibration times (1) the model's matmul kernels (loom__matmul_forward/backward, in fp32 and in
 * bf16) over one block's four weight shapes (C x 3C, C x C, C x 4C, 4C x C) at 1024 rows, at widths
 * 64 to 768, and (2) the attention kernel (src/model/flash.c, forward then backward) at head sizes 64
 * and 128 and sequences of 128, 512 and 2048 positions, counted as the model counts attention (12 x
 * heads x head size x the keys inside the causal mask). The planner interpolates both (log width,
 * log T), and (3) the optimizer's step (the gradients' sum of squares and AdamW) per parameter. The
 * elementwise kernels keep the copy bandwidth of the peak cache (peak.c).
 *
 * The cache: $XDG_CACHE_HOME/loom/calib (beside the peak cache), one line per measurement,
 * "name threads key value share time", appended. key hashes the CPU (/proc/cpuinfo's model name and
 * flags), the library's build (loom_build_info) and the executable (its size and modification time:
 * a rebuilt loom, e.g. a faster attention kernel, is measured again). share is the CPU time the
 * measuring threads got over the wall time: below LOOM_CALIB_QUIET other work took the CPUs during the
 * measurement, so the figure is suspect. A lookup takes the latest quiet entry for the key (a poisoned
 * one never wins over it), else the best (highest) of the suspect ones (load only ever lowers a rate),
 * and trusts it when one quiet entry younger than LOOM_CALIB_MAX_AGE exists, or LOOM_CALIB_TRIES entries were taken (a
 * machine that is never quiet: the best of them); otherwise it is measured again.
 *
 * Not thread-safe: measurements use every CPU, and the measurement hook (loom_calib_set_measure) is
 * process-wide. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/util.h"
#include "loom/gpt2.h"
#include "loom/optim.h"
#include "loom/plan.h"
#include "loom/train.h"
#include "model/kernels.h"

static const int widths[LOOM_CALIB_WIDTHS] = {64, 128, 256, 512, 768};
static const int head_dims[LOOM_CALIB_HEAD_DIMS] = {64, 128};
static const int seqs[LOOM_CALIB_SEQS] = {128, 512, 2048};
#define MM_ROWS 1024
#define MM_PASSES 64

static int by_value(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

int loom_calib_width(int k)
{
	return k >= 0 && k < LOOM_CALIB_WIDTHS ? widths[k] : 0;
}
int loom_calib_head_dim(int k)
{
	return k >= 0 && k < LOOM_CALIB_HEAD_DIMS ? head_dims[k] : 0;
}
int loom_calib_seq(int k)
{
	return k >= 0 && k < LOOM_CALIB_SEQS ? seqs[k] : 0;
}

static loom_calib_measure_fn hook_fn;
static void *hook_ctx;

void loom_calib_set_measure(loom_calib_measure_fn fn, void *ctx)
{
	hook_fn = fn, hook_ctx = ctx;
}

/* ---- the key and the file ------------------------------------------------------------------------- */

static unsigned long djb2(unsigned long h, const char *s)
{
	for (; s && *s; s++)
		h = h * 33 + (unsigned char)*s;
	return h;
}

unsigned long loom_calib_key(void)
{
	static unsigned long key;
	if (!key)
		key = loom_calib_key_of("/proc/self/exe");
	return key;
}

unsigned long loom_calib_key_of(const char *exe)
{
	unsigned long h = 5381;
	char line[4096], buf[64];
	FILE *f = fopen("/proc/cpuinfo", "r");
	int model = 0, flags = 0;
	if (f) {
		while ((!model || !flags) && fgets(line, sizeof line, f)) {
			if (!model && !strncmp(line, "model name", 10))
				h = djb2(h, line), model = 1;
			else if (!flags && !strncmp(line, "flags", 5))
				h = djb2(h, line), flags = 1;
		}
		fclose(f);
	}
	const loom_build_info_t *b = loom_build_info();
	h = djb2(h, b->onednn), h = djb2(h, b->arch), h = djb2(h, b->opt), h = djb2(h, b->cflags);
	h = djb2(h, b->sanitizer), h = djb2(h, b->compiler), h = djb2(h, loom_gemm_backend_name());
	struct stat st;
	if (exe && stat(exe, &st) == 0) { /* the build: a rebuilt binary measures again */
		snprintf(buf, sizeof buf, "%lld %lld", (long long)st.st_size, (long long)st.st_mtime);
		h = djb2(h, buf);
	}
	return h ? h : 1;
}

int loom_calib_cache_path(char *buf, size_t cap)
{
	char peak[1000];
	int rc = loom_peak_cache_path_kind(LOOM_PEAK_HW_FP32, peak, sizeof peak), n;
	char *slash;
	if (rc != LOOM_OK)
		return rc;
	if ((slash = strrchr(peak, '/')))
		*slash = 0;
	n = snprintf(buf, cap, "%s/calib", peak);
	if (n < 0 || (size_t)n >= cap)
		return loom_seterr(LOOM_EINVAL, "calibration cache: %s/calib is longer than %zu bytes", peak, cap);
	return LOOM_OK;
}

int loom_calib_lookup(const char *name, int threads, unsigned long key, loom_calib_entry_t *e)
{
	char path[1000], line[512], nm[128];
	FILE *f;
	int rc, th;
	unsigned long k;
	double v, share, when, now = (double)time(NULL), latest = 0.0, lshare = 0.0, lage = 0.0;
	memset(e, 0, sizeof *e);
	if ((rc = loom_calib_cache_path(path, sizeof path)) != LOOM_OK)
		return rc;
	if (!(f = fopen(path, "r")))
		return LOOM_OK;
	while (fgets(line, sizeof line, f)) {
		if (sscanf(line, "%127s %d %lu %lf %lf %lf", nm, &th, &k, &v, &share, &when) != 6)
			continue; /* a line of another format or a torn append: skipped */
		if (strcmp(nm, name) || th != threads || k != key || !(v > 0))
			continue;
		e->entries++;
		if (share >= LOOM_CALIB_QUIET) /* the latest quiet entry */
			latest = v, lshare = share, lage = now - when, e->quiet += now - when <= LOOM_CALIB_MAX_AGE;
		if (v > e->value)
			e->value = v, e->share = share, e->age_s = now - when;
	}
	fclose(f);
	if (latest > 0)
		e->value = latest, e->share = lshare, e->age_s = lage;
	e->trusted = e->entries > 0 && (e->quiet > 0 || e->entries >= LOOM_CALIB_TRIES);
	return LOOM_OK;
}

int loom_calib_append(const char *name, int threads, unsigned long key, double value, double share)
{
	char path[1000], dir[1000];
	FILE *f;
	int rc;
	if (!(value > 0) || threads < 1)
		return loom_seterr(LOOM_EINVAL, "calibration cache: %s = %g for %d threads: both must be > 0", name, value,
		                   threads);
	if ((rc = loom_calib_cache_path(path, sizeof path)) != LOOM_OK)
		return rc;
	snprintf(dir, sizeof dir, "%s", path);
	for (char *s = strchr(dir + 1, '/'); s; s = strchr(s + 1, '/')) { /* ~/.cache/loom may not exist yet */
		*s = 0;
		mkdir(dir, 0755);
		*s = '/';
	}
	if (!(f = fopen(path, "a")))
		return loom_seterr(LOOM_EIO, "calibration cache: cannot append to %s", path);
	fprintf(f, "%s %d %lu %.6e %.3f %lld\n", name, threads, key, value, share, (long long)time(NULL));
	if (fclose(f) != 0)
		return loom_seterr(LOOM_EIO, "calibration cache: writing %s failed", path);
	return LOOM_OK;
}

/* ---- the measurements ----------------------------------------------------------------------------- */

static double cpu_seconds(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static void fill(float *x, size_t n, int salt)
{
	for (size_t i = 0; i < n; i++)
		x[i] = (float)((i * 7 + (size_t)salt) % 23) * 0.01f - 0.11f;
}

/* One block's matmuls forward and backward at width w (the model's kernels, this thread's precision): FLOP/s, the
 * median of the passes after the first (which warms the packing buffers and the threads), as many as fit in
 * `seconds` (at least 3). Each shape has operands of its own and a pass first evicts the caches (a write of 16
 * MiB), as in training, where a block's products meet operands the kernels before them evicted: timed on warm
 * caches, the products ran 10-20% faster than inside training. */
static double mm_rate(int w, double seconds)
{
	static const int shape[4][2] = {{1, 3}, {1, 1}, {1, 4}, {4, 1}}; /* (in, out) in units of w */
	size_t N = MM_ROWS, nflush = (size_t)4 << 20;
	float *buf[4][6], *flush = loom_alloc_aligned(sizeof(float) * nflush);
	double best = 0.0, flops = 0.0, start, rate[MM_PASSES];
	int ok = flush != NULL, np = 0;
	memset(buf, 0, sizeof buf);
	for (int s = 0; s < 4; s++) {
		size_t C = (size_t)shape[s][0] * w, OC = (size_t)shape[s][1] * w;
		size_t sz[6] = {N * C, N * OC, C * OC, C * OC, OC, N * C}; /* inp, out, weight, dweight, bias, dinp */
		for (int b = 0; b < 6; b++) {
			buf[s][b] = loom_alloc_aligned(sizeof(float) * sz[b]);
			ok = ok && buf[s][b];
			if (buf[s][b])
				fill(buf[s][b], sz[b], s * 6 + b);
		}
		flops += 6.0 * N * C * OC;
	}
	start = loom_now();
	for (int p = 0; ok && (p < 3 || loom_now() - start < seconds) && p < MM_PASSES; p++, np++) {
		double t = 0.0;
		for (int s = 0; s < 4; s++) {
			int C = shape[s][0] * w, OC = shape[s][1] * w;
			memset(flush, p & 0xff, sizeof(float) * nflush);
			double t0 = loom_now();
			loom__matmul_forward(buf[s][1], buf[s][0], buf[s][2], buf[s][4], (int)N, C, OC);
			loom__matmul_backward(buf[s][5], buf[s][3], buf[s][4], buf[s][1], buf[s][0], buf[s][2], (int)N, C, OC);
			t += loom_now() - t0;
		}
		rate[p] = t > 0 ? flops / t : 0.0;
	}
	if (np > 1) /* the median of the passes after the first (training's products run at their typical speed,
	             * not their luckiest; a loaded machine shows in the CPU share instead) */
		qsort(rate + 1, (size_t)np - 1, sizeof *rate, by_value), best = rate[1 + (np - 1) / 2];
	for (int s = 0; s < 4; s++)
		for (int b = 0; b < 6; b++)
			loom_free_aligned(buf[s][b]);
	loom_free_aligned(flush);
	return best;
}

/* The attention kernel forward and backward, causal, head size D, T positions, 2 heads per thread:
 * counted FLOP/s (12 x heads x D x the keys inside the causal mask), the best of `passes`. */
static double attn_rate(int D, int T, int threads, int passes)
{
	int NH = 2 * threads, ld = NH * D;
	size_t n = (size_t)T * ld, ns = loom__flash_scratch_floats(1, T, NH, D, threads);
	float *q = loom_alloc_aligned(sizeof(float) * n), *k = loom_alloc_aligned(sizeof(float) * n);
	float *v = loom_alloc_aligned(sizeof(float) * n), *o = loom_alloc_aligned(sizeof(float) * n);
	float *dq = loom_alloc_aligned(sizeof(float) * n), *dk = loom_alloc_aligned(sizeof(float) * n);
	float *dv = loom_alloc_aligned(sizeof(float) * n), *dout = loom_alloc_aligned(sizeof(float) * n);
	float *lse = loom_alloc_aligned(sizeof(float) * (size_t)NH * T);
	float *scratch = loom_alloc_aligned(sizeof(float) * (ns ? ns : 1));
	double best = 0.0, flops = 12.0 * NH * D * ((double)T * (T + 1) / 2.0);
	if (!q || !k || !v || !o || !dq || !dk || !dv || !dout || !lse || !scratch)
		goto out;
	fill(q, n, 5), fill(k, n, 6), fill(v, n, 7), fill(dout, n, 8);
	loom__flash_t a = {.q = q, .k = k, .v = v, .ldq = ld, .ldk = ld, .B = 1, .Tq = T, .Tk = T, .NH = NH, .NKV = NH,
	                   .D = D, .W = -1, .scale = 1.0f / sqrtf((float)D)};
	for (int p = 0; p < passes; p++) {
		memset(dq, 0, sizeof(float) * n), memset(dk, 0, sizeof(float) * n), memset(dv, 0, sizeof(float) * n);
		double t = loom_now();
		loom__flash_forward(&a, o, ld, lse);
		loom__flash_backward(&a, dq, ld, dk, dv, ld, dout, ld, o, ld, lse, scratch, threads);
		t = loom_now() - t;
		if (t > 0 && flops / t > best)
			best = flops / t;
	}
out:
	loom_free_aligned(q), loom_free_aligned(k), loom_free_aligned(v), loom_free_aligned(o);
	loom_free_aligned(dq), loom_free_aligned(dk), loom_free_aligned(dv), loom_free_aligned(dout);
	loom_free_aligned(lse), loom_free_aligned(scratch);
	return best;
}

/* The optimizer's step as the trainer runs it on a rank's parameters: the gradients' sum of squares
 * (the norm) and AdamW over ADAMW_FLOATS parameters (128 MiB of parameters, gradients and moments:
 * beyond the caches, as a model's are): parameters per second, the median of 3 after a warm-up. */
#define ADAMW_FLOATS ((size_t)8 << 20)
static double adamw_rate(void)
{
	size_t n = ADAMW_FLOATS;
	float *p = loom_alloc_aligned(sizeof(float) * n), *g = loom_alloc_aligned(sizeof(float) * n);
	loom_optim_segment_t seg = {0, n, 1};
	loom_adamw_t o;
	double rate[4] = {0}, best = 0.0;
	int ok = p && g && loom_adamw_init(&o, &(loom_adamw_config_t){0.9f, 0.95f, 1e-8f, 0.1f}, n, &seg, 1) == LOOM_OK;
	if (ok) {
		fill(p, n, 9), fill(g, n, 10);
		for (int r = 0; r < 4; r++) {
			double t = loom_now(), sq = loom_grad_sumsq(g, n);
			loom_adamw_step(&o, p, g, 1e-4f, sq > 0 ? 1.0f : 0.0f);
			t = loom_now() - t;
			rate[r] = t > 0 ? (double)n / t : 0.0;
		}
		qsort(rate + 1, 3, sizeof *rate, by_value);
		best = rate[2];
		loom_adamw_free(&o);
	}
	loom_free_aligned(p), loom_free_aligned(g);
	return best;
}

/* A figure's name: mm_fp32_w<width>, mm_bf16_w<width>, attn_d<D>_t<T>. */
static void mm_name(char *buf, size_t cap, loom_compute_dtype_t dt, int k)
{
	snprintf(buf, cap, "mm_%s_w%d", dt == LOOM_COMPUTE_BF16 ? "bf16" : "fp32", widths[k]);
}
static void attn_name(char *buf, size_t cap, int d, int t)
{
	snprintf(buf, cap, "attn_d%d_t%d", head_dims[d], seqs[t]);
}

/* The real measurement of a named figure (the hook's default): its value and the CPU share. */
static int measure_real(const char *name, int threads, double *value, double *share)
{
	int w, d, t, saved = omp_get_max_threads();
	char dt[8];
	double c0, t0;
	*value = 0.0, *share = 0.0;
	loom_set_num_threads(threads);
	c0 = cpu_seconds(), t0 = loom_now();
	if (sscanf(name, "mm_%4[a-z0-9]_w%d", dt, &w) == 2) {
		loom__gemm_ctx_t ctx = {.dtype = !strcmp(dt, "bf16") ? LOOM_COMPUTE_BF16 : LOOM_COMPUTE_FP32};
		loom__gemm_setup(&ctx); /* bf16: as the model runs it, operand conversions included */
		*value = mm_rate(w, 0.05);
		if (loom__gemm_status(&ctx) != LOOM_OK)
			*value = 0.0;
		loom__gemm_setup_threads();
		loom__gemm_ctx_free(&ctx);
	} else if (sscanf(name, "attn_d%d_t%d", &d, &t) == 2) {
		*value = attn_rate(d, t, threads, 3);
	} else if (!strcmp(name, "adamw")) {
		*value = adamw_rate();
	}
	double wall = loom_now() - t0;
	/* (idle OpenMP threads spin and count: at most 1) */
	*share = wall > 0 ? LOOM_MIN(1.0, (cpu_seconds() - c0) / (wall * threads)) : 1.0;
	loom_set_num_threads(saved);
	return *value > 0 ? LOOM_OK : loom_seterr(LOOM_ENOTSUP, "calibration: measuring %s with %d thread(s) failed", name,
	                                          threads);
}

int loom_calib_get(const char *name, int threads, int measure, double *value, int *measured_now)
{
	loom_calib_entry_t e;
	unsigned long key = loom_calib_key();
	int rc;
	*value = 0.0;
	if (measured_now)
		*measured_now = 0;
	if ((rc = loom_calib_lookup(name, threads, key, &e)) != LOOM_OK)
		return rc;
	if (measure >= 2 ? !e.trusted : measure == 1 && e.entries == 0) {
		double v = 0.0, share = 0.0;
		rc = hook_fn ? hook_fn(name, threads, hook_ctx, &v, &share) : measure_real(name, threads, &v, &share);
		if (rc == LOOM_OK && v > 0) {
			if (measured_now)
				*measured_now = 1;
			if (loom_calib_append(name, threads, key, v, share) != LOOM_OK) { /* a read-only home: this run's */
				*value = LOOM_MAX(v, e.value);
				return LOOM_OK;
			}
			if ((rc = loom_calib_lookup(name, threads, key, &e)) != LOOM_OK)
				return rc;
		}
	}
	if (!(e.value > 0))
		return loom_seterr(LOOM_ENOENT, "calibration: %s for %d thread(s) is not measured on this machine", name,
		                   threads);
	*value = e.value;
	return e.trusted ? LOOM_OK : LOOM_ESTATE;
}

/* Every figure of a run in dt with `threads` threads: the fp32 matmuls (and bf16's with dt bf16), the
 * attention. Calls fn(name) for each; returns how many. */
static int each_figure(loom_compute_dtype_t dt, void (*fn)(const char *name, void *ctx), void *ctx)
{
	char name[64];
	int n = 0;
	for (int b = 0; b <= (dt == LOOM_COMPUTE_BF16); b++)
		for (int k = 0; k < LOOM_CALIB_WIDTHS; k++, n++)
			mm_name(name, sizeof name, b ? LOOM_COMPUTE_BF16 : LOOM_COMPUTE_FP32, k), fn(name, ctx);
	for (int d = 0; d < LOOM_CALIB_HEAD_DIMS; d++)
		for (int t = 0; t < LOOM_CALIB_SEQS; t++, n++)
			attn_name(name, sizeof name, d, t), fn(name, ctx);
	fn("adamw", ctx);
	return n + 1;
}

typedef struct {
	int threads, measure, missing, failed;
	char *what;
	size_t cap, len;
} walk_t;

static void walk_one(const char *name, void *ctx)
{
	walk_t *w = ctx;
	double v;
	int rc = loom_calib_get(name, w->threads, w->measure, &v, NULL);
	if (rc == LOOM_OK)
		return;
	w->missing++;
	w->failed += rc != LOOM_ESTATE && w->measure;
	if (w->what && w->len < w->cap)
		w->len += (size_t)snprintf(w->what + w->len, w->cap - w->len, "%s%s", w->missing > 1 ? ", " : "", name);
}

int loom_calib_missing(int threads, loom_compute_dtype_t dt, char *what, size_t cap)
{
	walk_t w = {.threads = threads > 0 ? threads : 1, .what = what, .cap = cap};
	if (what && cap)
		what[0] = 0;
	each_figure(dt, walk_one, &w);
	return w.missing;
}

int loom_calib_measure(int threads, loom_compute_dtype_t dt, int suspect)
{
	walk_t w = {.threads = threads > 0 ? threads : 1, .measure = suspect ? 2 : 1};
	each_figure(dt, walk_one, &w);
	return w.failed ? loom_seterr(LOOM_ENOTSUP, "calibration: %d figure(s) could not be measured", w.failed) : LOOM_OK;
}

int loom_calib_read(int threads, loom_calib_t *cal)
{
	char name[64];
	double v;
	int n = 0, rc;
	memset(cal, 0, sizeof *cal);
	threads = threads > 0 ? threads : 1;
	for (int b = 0; b < 2; b++)
		for (int k = 0; k < LOOM_CALIB_WIDTHS; k++) {
			mm_name(name, sizeof name, b ? LOOM_COMPUTE_BF16 : LOOM_COMPUTE_FP32, k);
			rc = loom_calib_get(name, threads, 0, &v, NULL);
			if (rc == LOOM_OK || rc == LOOM_ESTATE) /* a suspect figure is still this machine's best */
				cal->mm[b][k] = v, n++;
		}
	for (int d = 0; d < LOOM_CALIB_HEAD_DIMS; d++)
		for (int t = 0; t < LOOM_CALIB_SEQS; t++) {
			attn_name(name, sizeof name, d, t);
			rc = loom_calib_get(name, threads, 0, &v, NULL);
			if (rc == LOOM_OK || rc == LOOM_ESTATE)
				cal->attn[d][t] = v, n++;
		}
	rc = loom_calib_get("adamw", threads, 0, &v, NULL);
	if (rc == LOOM_OK || rc == LOOM_ESTATE)
		cal->adamw = v, n++;
	return n;
}

/* ---- the planner's reading of the figures --------------------------------------------------------- */

/* Piecewise linear in log x over xs[0..n) (clamped at the ends), of the values that are > 0; 0 when
 * fewer than all are measured. */
static double interp(const int *xs, const double *ys, int n, double x)
{
	for (int k = 0; k < n; k++)
		if (!(ys[k] > 0))
			return 0.0;
	if (x <= xs[0])
		return ys[0];
	for (int k = 1; k < n; k++)
		if (x == xs[k]) {
			return ys[k];
		} else if (x < xs[k]) {
			double f = (log(x) - log(xs[k - 1])) / (log(xs[k]) - log(xs[k - 1]));
			return exp(log(ys[k - 1]) + f * (log(ys[k]) - log(ys[k - 1])));
		}
	return ys[n - 1];
}

double loom_calib_mm_rate(const loom_calib_t *cal, loom_compute_dtype_t dt, double width)
{
	return interp(widths, cal->mm[dt == LOOM_COMPUTE_BF16], LOOM_CALIB_WIDTHS, width);
}

double loom_calib_attn_rate(const loom_calib_t *cal, int head_dim, int T)
{
	double at[LOOM_CALIB_HEAD_DIMS];
	for (int d = 0; d < LOOM_CALIB_HEAD_DIMS; d++)
		at[d] = interp(seqs, cal->attn[d], LOOM_CALIB_SEQS, T);
	return interp(head_dims, at, LOOM_CALIB_HEAD_DIMS, head_dim);
}
