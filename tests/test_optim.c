/* test_optim.c: AdamW against hand-computed values, the fused pass against its reference, AdamW over
 * shards against one over everything, gradient clipping, and the learning-rate schedules at chosen
 * steps. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "loom/optim.h"
#include "loom/train.h"
#include "test.h"

/* Three parameters: [0, 2) with decay, [2, 3) without; lr 0.01, betas (0.9, 0.999), eps 1e-8. The
 * expected values are the AdamW formulas evaluated in double (rounding of float arithmetic differs
 * from them by a few ulp, hence 5e-7); torch.optim.AdamW gives the same to 3e-7. */
static int adamw_hand(float wd, const double expect[3][3])
{
	static const float grads[3][3] = {{0.1f, -0.2f, 0.3f}, {-0.1f, 0.4f, 0.3f}, {0.05f, 0.0f, -0.6f}};
	float p[3] = {1.0f, -2.0f, 0.5f};
	loom_optim_segment_t segs[2] = {{2, 1, 0}, {0, 2, 1}}; /* any order */
	loom_adamw_config_t cfg = {.beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = wd};
	loom_adamw_t o;
	CHECK_OK(loom_adamw_init(&o, &cfg, 3, segs, 2));
	for (int t = 0; t < 3; t++) {
		CHECK_OK(loom_adamw_step(&o, p, grads[t], 0.01f, 1.0f));
		CHECK_EQ(o.step, t + 1);
		for (int i = 0; i < 3; i++)
			CHECK_NEAR(p[i], expect[t][i], 5e-7);
	}
	loom_adamw_free(&o);
	return 0;
}

TEST(adamw_hand_values)
{
	static const double no_decay[3][3] = {{0.990000001, -1.9900000005, 0.490000000333},
	                                      {0.990526316737, -1.99366103565, 0.480000000667},
	                                      {0.988779061597, -1.99649102642, 0.480756493956}};
	/* weight decay 0.1: p *= 1 - 0.01*0.1 first, on the first two only */
	static const double decay[3][3] = {{0.989000001, -1.9880000005, 0.490000000333},
	                                   {0.988537316736, -1.98967303565, 0.480000000667},
	                                   {0.985801524279, -1.99051335338, 0.480756493956}};
	if (adamw_hand(0.0f, no_decay))
		return 1;
	return adamw_hand(0.1f, decay);
}

TEST(adamw_fast_matches_ref)
{
	enum { N = 100003 };
	float *p1 = malloc(N * sizeof *p1), *p2 = malloc(N * sizeof *p2), *g = malloc(N * sizeof *g);
	float *gs = malloc(N * sizeof *gs);
	loom_optim_segment_t segs[4] = {{0, 17, 1}, {17, 50000, 0}, {50017, 3, 1}, {50020, N - 50020, 1}};
	loom_adamw_config_t cfg = loom_adamw_defaults();
	loom_adamw_t a, b;
	CHECK(p1 && p2 && g && gs);
	srand(7);
	for (int i = 0; i < N; i++)
		p1[i] = p2[i] = (float)rand() / RAND_MAX - 0.5f;
	CHECK_OK(loom_adamw_init(&a, &cfg, N, segs, 4));
	CHECK_OK(loom_adamw_init(&b, &cfg, N, segs, 4));
	omp_set_num_threads(2);
	for (int t = 0; t < 4; t++) {
		float scale = t == 2 ? 0.37f : 1.0f;
		for (int i = 0; i < N; i++) {
			g[i] = ((float)rand() / RAND_MAX - 0.5f) * 1e-2f;
			gs[i] = g[i] * scale;
		}
		CHECK_OK(loom_adamw_step(&a, p1, g, 3e-3f, scale));       /* fused scale, threaded */
		CHECK_OK(loom_adamw_step_ref(&b, p2, gs, 3e-3f, 1.0f));   /* pre-scaled gradients */
		for (int i = 0; i < N; i++)
			if (p1[i] != p2[i] || a.m[i] != b.m[i] || a.v[i] != b.v[i])
				TEST_FAIL_("step %d, element %d: fast %.9g (m %.9g v %.9g) vs ref %.9g (m %.9g v %.9g)", t, i,
				           p1[i], a.m[i], a.v[i], p2[i], b.m[i], b.v[i]);
	}
	loom_adamw_free(&a);
	loom_adamw_free(&b);
	free(p1), free(p2), free(g), free(gs);
	return 0;
}

TEST(adamw_rejects_bad_input)
{
	loom_optim_segment_t gap[2] = {{0, 2, 1}, {3, 2, 0}}, overlap[2] = {{0, 3, 1}, {2, 2, 0}}, ok[1] = {{0, 4, 1}};
	loom_adamw_config_t cfg = loom_adamw_defaults(), bad = cfg;
	loom_adamw_t o;
	float p[4] = {0}, g[4] = {0};
	CHECK_ERR(loom_adamw_init(&o, &cfg, 5, gap, 2), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "expected 2");
	CHECK_ERR(loom_adamw_init(&o, &cfg, 4, overlap, 2), LOOM_EINVAL);
	CHECK_ERR(loom_adamw_init(&o, &cfg, 5, ok, 1), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "cover 4 floats, the buffer has 5");
	bad.beta2 = 1.0f;
	CHECK_ERR(loom_adamw_init(&o, &bad, 4, ok, 1), LOOM_EINVAL);
	CHECK_OK(loom_adamw_init(&o, &cfg, 4, ok, 1));
	CHECK_ERR(loom_adamw_step(&o, p, g, NAN, 1.0f), LOOM_EINVAL);
	CHECK_ERR(loom_adamw_step(&o, p, g, -1.0f, 1.0f), LOOM_EINVAL);
	CHECK_EQ(o.step, 0);
	loom_adamw_free(&o);
	loom_adamw_free(&o); /* idempotent */
	return 0;
}

TEST(adamw_gpt2_decay_segments)
{
	loom_gpt2_config_t cfg = {2, 2, 8, 4, 11};
	loom_adamw_config_t ac = loom_adamw_defaults();
	loom_adamw_t o;
	loom_tensor_info_t ti;
	size_t n = loom_gpt2_num_params(&cfg);
	float *p = malloc(n * sizeof *p), *g = calloc(n, sizeof *g);
	CHECK(p && g);
	for (size_t i = 0; i < n; i++)
		p[i] = 1.0f;
	CHECK_OK(loom_adamw_init_gpt2(&o, &ac, &cfg));
	CHECK_EQ(o.nseg, loom_gpt2_num_tensors(&cfg));
	/* zero gradient: only decay moves a parameter, by exactly the factor 1 - lr*wd */
	CHECK_OK(loom_adamw_step(&o, p, g, 0.5f, 1.0f));
	for (int t = 0; t < loom_gpt2_num_tensors(&cfg); t++) {
		loom_gpt2_tensor_info(&cfg, t, &ti);
		float want = ti.decay ? (float)(1.0 - 0.5 * (double)ac.weight_decay) : 1.0f;
		CHECK_MSG(p[ti.offset] == want && p[ti.offset + ti.numel - 1] == want, "%s: %.9g, expected %.9g", ti.name,
		          p[ti.offset], want);
		CHECK_EQ(ti.decay, ti.ndim == 2);
	}
	loom_adamw_free(&o);
	free(p), free(g);
	return 0;
}

TEST(clip_grad_norm)
{
	float g[2] = {3.0f, 4.0f};
	CHECK_FEQ(loom_grad_norm(g, 2), 5.0);
	CHECK_FEQ(loom_clip_scale(5.0, 1.0), (float)(1.0 / (5.0 + 1e-6)));
	CHECK_FEQ(loom_clip_scale(0.5, 1.0), 1.0f); /* below max: untouched */
	CHECK_FEQ(loom_clip_scale(1.0, 1.0), (float)(1.0 / 1.000001)); /* torch clips at equality too */
	CHECK_FEQ(loom_clip_scale(5.0, 0.0), 1.0f);                      /* disabled */
	CHECK_FEQ(loom_clip_grad_norm(g, 2, 1.0), 5.0);
	CHECK_NEAR(g[0], 0.6, 2e-7);
	CHECK_NEAR(g[1], 0.8, 2e-7);
	CHECK_FEQ(g[0], 3.0f * (float)(1.0 / (5.0 + 1e-6)));
	CHECK_FEQ(loom_grad_norm(g, 0), 0.0);
	return 0;
}

TEST(grad_norm_thread_independent)
{
	enum { N = 1000001 };
	float *g = malloc(N * sizeof *g);
	double ref = 0.0, a, b;
	CHECK(g);
	for (int i = 0; i < N; i++) {
		g[i] = (float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
		ref += (double)g[i] * g[i];
	}
	omp_set_num_threads(1);
	a = loom_grad_norm(g, N);
	omp_set_num_threads(2);
	b = loom_grad_norm(g, N);
	CHECK_FEQ(a, b);
	CHECK_NEAR(a, sqrt(ref), 1e-9 * sqrt(ref));
	free(g);
	return 0;
}

TEST(lr_schedule_values)
{
	loom_lr_schedule_t s = {.peak_lr = 1e-3, .warmup = 10, .total_steps = 110, .kind = LOOM_SCHED_COSINE,
	                        .min_lr_frac = 0.1};
	loom_schedule_kind_t k;
	CHECK_OK(loom_schedule_check(&s));
	CHECK_FEQ(loom_schedule_lr(&s, 1), (float)1e-4);
	CHECK_FEQ(loom_schedule_lr(&s, 5), (float)5e-4);
	CHECK_FEQ(loom_schedule_lr(&s, 10), (float)1e-3);                          /* end of warmup: peak */
	CHECK_FEQ(loom_schedule_lr(&s, 35), (float)(1e-4 + 9e-4 * 0.85355339059327373)); /* q = 1/4 */
	CHECK_FEQ(loom_schedule_lr(&s, 60), (float)5.5e-4);                        /* q = 1/2 */
	CHECK_FEQ(loom_schedule_lr(&s, 110), (float)1e-4);                         /* last step: floor */
	CHECK_FEQ(loom_schedule_lr(&s, 200), (float)1e-4);                         /* beyond: floor */
	s.kind = LOOM_SCHED_LINEAR;
	CHECK_FEQ(loom_schedule_lr(&s, 5), (float)5e-4);
	CHECK_FEQ(loom_schedule_lr(&s, 35), (float)7.75e-4);
	CHECK_FEQ(loom_schedule_lr(&s, 60), (float)5.5e-4);
	CHECK_FEQ(loom_schedule_lr(&s, 110), (float)1e-4);
	s.kind = LOOM_SCHED_CONSTANT;
	CHECK_FEQ(loom_schedule_lr(&s, 5), (float)5e-4);
	CHECK_FEQ(loom_schedule_lr(&s, 60), (float)1e-3);
	CHECK_FEQ(loom_schedule_lr(&s, 110), (float)1e-3);
	/* no warmup, min 0: cosine from the first step */
	s.kind = LOOM_SCHED_COSINE, s.warmup = 0, s.min_lr_frac = 0.0, s.total_steps = 4;
	CHECK_FEQ(loom_schedule_lr(&s, 1), (float)(1e-3 * 0.5 * (1.0 + cos(M_PI / 4))));
	CHECK_FEQ(loom_schedule_lr(&s, 2), (float)(1e-3 * 0.5));
	CHECK_FEQ(loom_schedule_lr(&s, 4), 0.0f);
	/* warmup longer than the run: warmup, then the peak */
	s.warmup = 8;
	CHECK_FEQ(loom_schedule_lr(&s, 4), (float)5e-4);
	CHECK_OK(loom_schedule_parse("linear", &k));
	CHECK_EQ(k, LOOM_SCHED_LINEAR);
	CHECK_STREQ(loom_schedule_name(LOOM_SCHED_CONSTANT), "constant");
	CHECK_ERR(loom_schedule_parse("step", &k), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "cosine, linear, constant or warmdown");
	/* nanochat's warmdown (base_train's get_lr_multiplier at it = s - 1): W = 2, N = 10, D = round(0.25 x 10)
	 * = 2 (half to even), floor 0.1: 1/2, 1 (it = 1), then the peak up to it = 8, and it = 9: f = 1/2 */
	loom_lr_schedule_t w = {.peak_lr = 1e-3, .warmup = 2, .total_steps = 10, .kind = LOOM_SCHED_WARMDOWN,
	                        .min_lr_frac = 0.1, .warmdown_frac = 0.25};
	CHECK_OK(loom_schedule_check(&w));
	CHECK_FEQ(loom_schedule_lr(&w, 1), (float)5e-4);
	CHECK_FEQ(loom_schedule_lr(&w, 2), (float)1e-3);
	CHECK_FEQ(loom_schedule_lr(&w, 9), (float)1e-3);
	CHECK_FEQ(loom_schedule_lr(&w, 10), (float)(1e-3 * (0.5 + 0.5 * 0.1)));
	w.warmdown_frac = 0.35; /* D = round(3.5) = 4 (to even): it = 7 -> f = 3/4 */
	CHECK_FEQ(loom_schedule_lr(&w, 8), (float)(1e-3 * (0.75 + 0.25 * 0.1)));
	w.warmdown_frac = 0.0; /* nanochat's default, 0.5: D = 5, it = 6 -> f = 4/5 */
	CHECK_FEQ(loom_schedule_lr(&w, 7), (float)(1e-3 * (0.8 + 0.2 * 0.1)));
	CHECK_OK(loom_schedule_parse("warmdown", &k));
	CHECK_EQ(k, LOOM_SCHED_WARMDOWN);
	w.warmdown_frac = 1.5;
	CHECK_ERR(loom_schedule_check(&w), LOOM_EINVAL);
	s.min_lr_frac = 1.5;
	CHECK_ERR(loom_schedule_check(&s), LOOM_EINVAL);
	return 0;
}

/* AdamW over shards: three optimizers over a partition of a GPT-2 buffer whose cuts fall inside
 * tensors (and an empty one) give, step after step, the same bits as one optimizer over everything:
 * parameters, m and v. */
TEST(adamw_range_matches_full)
{
	static const loom_gpt2_config_t mc = {.n_layer = 2, .n_head = 2, .n_embd = 16, .seq_len = 8, .vocab_size = 11};
	size_t n = loom_gpt2_num_params(&mc);
	/* cuts: inside wte, inside h.0's c_attn weight, an empty shard, then to the end */
	const size_t cut[5] = {0, 37, 11 * 16 + 8 * 16 + 16 + 16 + 100, 11 * 16 + 8 * 16 + 16 + 16 + 100, n};
	float *pf = malloc(n * sizeof *pf), *ps = malloc(n * sizeof *ps), *g = malloc(n * sizeof *g);
	loom_adamw_config_t cfg = loom_adamw_defaults();
	loom_adamw_t full, part[4];
	CHECK(pf && ps && g);
	srand(11);
	for (size_t i = 0; i < n; i++)
		pf[i] = ps[i] = (float)rand() / RAND_MAX - 0.5f;
	CHECK_OK(loom_adamw_init_gpt2(&full, &cfg, &mc));
	for (int k = 0; k < 4; k++) {
		CHECK_OK(loom_adamw_init_gpt2_range(&part[k], &cfg, &mc, cut[k], cut[k + 1] - cut[k]));
		CHECK_EQ(part[k].n, cut[k + 1] - cut[k]);
	}
	/* the shard inside wte is one segment, with wte's decay */
	CHECK_EQ(part[0].nseg, 1);
	CHECK_EQ(part[0].segs[0].decay, 1);
	for (int t = 0; t < 4; t++) {
		for (size_t i = 0; i < n; i++)
			g[i] = (float)rand() / RAND_MAX - 0.5f;
		CHECK_OK(loom_adamw_step(&full, pf, g, 1e-2f, 0.7f));
		for (int k = 0; k < 4; k++)
			CHECK_OK(loom_adamw_step(&part[k], ps + cut[k], g + cut[k], 1e-2f, 0.7f));
	}
	CHECK_EQ(memcmp(pf, ps, n * sizeof *pf), 0);
	for (int k = 0; k < 4; k++) {
		CHECK_EQ(part[k].step, 4);
		CHECK_EQ(memcmp(full.m + cut[k], part[k].m, (cut[k + 1] - cut[k]) * sizeof(float)), 0);
		CHECK_EQ(memcmp(full.v + cut[k], part[k].v, (cut[k + 1] - cut[k]) * sizeof(float)), 0);
		loom_adamw_free(&part[k]);
	}
	CHECK_ERR(loom_adamw_init_gpt2_range(&part[0], &cfg, &mc, n - 3, 4), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "is outside the model's");
	loom_adamw_free(&full);
	free(pf), free(ps), free(g);
	return 0;
}

/* The norm is the square root of the sum of squares, bit for bit (so a strategy that adds up the
 * sums of its ranks' parts gets DDP's norm when there is one part). */
TEST(grad_sumsq_is_norm_squared)
{
	enum { N = 10007 };
	float *g = malloc(N * sizeof *g);
	double direct = 0.0;
	CHECK(g);
	for (int i = 0; i < N; i++)
		g[i] = (float)((i * 37) % 101 - 50) / 64.0f, direct += (double)g[i] * g[i];
	CHECK_FEQ(loom_grad_norm(g, N), sqrt(loom_grad_sumsq(g, N)));
	CHECK_NEAR(loom_grad_sumsq(g, N), direct, 1e-9 * direct);
	CHECK_FEQ(loom_grad_sumsq(g, 0), 0.0);
	free(g);
	return 0;
}

/* The sum's order is the one clip.c documents (64 chunks in order, each in 16 interleaved lanes added
 * in lane order, then its tail), whatever the ISA's vector width or the thread count: the expected
 * value is that order written out. The data spans 20 orders of magnitude, so another order (one
 * running sum, the vector width's lanes) gives other bits. */
TEST(grad_sumsq_lane_order)
{
	enum { N = 64 * 16 * 5 + 64 * 9 + 5, NCHUNK = 64, LANES = 16 };
	float *g = malloc(N * sizeof *g);
	double expect = 0.0, seq = 0.0;
	CHECK(g);
	for (int i = 0; i < N; i++)
		g[i] = (float)((i * 2654435761u) % 1000 + 1) * (i % 7 == 0 ? 1e6f : i % 3 == 0 ? 1e-4f : 1.0f);
	size_t chunk = (N + NCHUNK - 1) / NCHUNK;
	for (int c = 0; c < NCHUNK; c++) {
		size_t lo = (size_t)c * chunk < N ? (size_t)c * chunk : N, hi = lo + chunk < N ? lo + chunk : N, i = lo;
		double acc[LANES] = {0.0}, s = 0.0;
		for (; i + LANES <= hi; i += LANES)
			for (int k = 0; k < LANES; k++)
				acc[k] += (double)g[i + k] * g[i + k];
		for (int k = 0; k < LANES; k++)
			s += acc[k];
		for (; i < hi; i++)
			s += (double)g[i] * g[i];
		expect += s;
	}
	for (int i = 0; i < N; i++)
		seq += (double)g[i] * g[i];
	CHECK_MSG(seq != expect, "the data should make the order visible: %.17g both ways", seq);
	for (int nt = 1; nt <= 3; nt++) {
		omp_set_num_threads(nt);
		double got = loom_grad_sumsq(g, N);
		CHECK_MSG(got == expect, "%d threads: %.17g, the documented order gives %.17g", nt, got, expect);
	}
	free(g);
	return 0;
}
