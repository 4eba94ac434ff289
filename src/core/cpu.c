/* cpu.c: CPUID and XGETBV decoded into the features loom's kernels are chosen by (loom/cpu.h), and the
 * FMA throughput loops that measure the hardware's peak.
 *
 * Why measure the peak instead of computing cores x GHz x lanes: the clock a loaded chip sustains is
 * not in CPUID (turbo, AVX-512 frequency licences, a VM's steal), and an MFU against a made-up peak is
 * no better than one against a slow BLAS. The loop is what a perfect kernel could do on this unit:
 * enough independent accumulators to cover the FMA latency on every pipe (16 zmm on AVX-512; 12 ymm on
 * AVX2, whose 16 registers spill at 16 accumulators; 8 xmm mul + add on SSE2), no loads, no spills.
 * Each loop is compiled for its ISA with a target attribute, so the binary can hold all three and runs
 * only what this CPU has. */
#include <cpuid.h>
#include <immintrin.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/util.h"
#include "loom/cpu.h"

/* ---- decoding ---------------------------------------------------------------------------------- */

#define BIT(w, b) (((w) >> (b)) & 1u)

void loom_cpu_decode(const loom_cpuid_words_t *w, const char *brand, loom_cpu_t *c)
{
	memset(c, 0, sizeof *c);
	memcpy(c->vendor, w->vendor, 12);
	c->vendor[12] = 0;
	snprintf(c->brand, sizeof c->brand, "%s", brand ? brand : "");
	unsigned fam = (w->l1_eax >> 8) & 0xf, ext_fam = (w->l1_eax >> 20) & 0xff;
	unsigned mod = (w->l1_eax >> 4) & 0xf, ext_mod = (w->l1_eax >> 16) & 0xf;
	c->family = fam == 0xf ? fam + ext_fam : fam;
	c->model = fam == 0x6 || fam == 0xf ? (ext_mod << 4) | mod : mod;

	/* what the OS saves: XCR0 bits 1-2 (XMM, YMM), 5-7 (opmask, ZMM 0-15 high halves, ZMM 16-31),
	 * 17-18 (tile config and data); XGETBV exists only with OSXSAVE (leaf 1 ecx bit 27) */
	uint64_t x = BIT(w->l1_ecx, 27) ? w->xcr0 : 0;
	c->os_ymm = (x & 0x6) == 0x6;
	c->os_zmm = c->os_ymm && (x & 0xe0) == 0xe0;
	c->os_amx = (x & 0x60000) == 0x60000;

	c->sse42 = (int)BIT(w->l1_ecx, 20);
	c->avx = c->os_ymm && BIT(w->l1_ecx, 28);
	c->fma = c->avx && BIT(w->l1_ecx, 12);
	if (w->max_leaf >= 7) {
		c->avx2 = c->avx && BIT(w->l7_ebx, 5);
		c->avx512f = c->os_zmm && BIT(w->l7_ebx, 16);
		c->avx512dq = c->avx512f && BIT(w->l7_ebx, 17);
		c->avx512bw = c->avx512f && BIT(w->l7_ebx, 30);
		c->avx512vl = c->avx512f && BIT(w->l7_ebx, 31);
		c->avx512_vnni = c->avx512f && BIT(w->l7_ecx, 11);
		c->avx512_bf16 = c->avx512f && BIT(w->l7_1_eax, 5);
		c->amx_bf16 = c->os_amx && BIT(w->l7_edx, 22);
		c->amx_tile = c->os_amx && BIT(w->l7_edx, 24);
	}
	if (c->avx512f && c->avx512bw && c->avx512vl && c->avx512dq && c->fma)
		c->isa = LOOM_ISA_AVX512;
	else if (c->avx2 && c->fma)
		c->isa = LOOM_ISA_AVX2;
	else
		c->isa = LOOM_ISA_SCALAR;
}

/* Cap a decoded CPU at `isa`: the features above it are cleared (LOOM_CPU_ISA). */
static void cap_isa(loom_cpu_t *c, loom_isa_t isa)
{
	if (isa >= c->isa)
		return;
	c->isa = isa;
	c->avx512f = c->avx512bw = c->avx512vl = c->avx512dq = c->avx512_vnni = c->avx512_bf16 = 0;
	c->amx_bf16 = c->amx_tile = 0;
	if (isa < LOOM_ISA_AVX2)
		c->avx2 = c->fma = 0;
}

static loom_cpu_t this_cpu;
static pthread_once_t cpu_once = PTHREAD_ONCE_INIT;

static void detect(void)
{
	loom_cpuid_words_t w = {0};
	unsigned a, b, c, d;
	char brand[49] = "";
	__cpuid(0, a, b, c, d);
	w.max_leaf = a, w.vendor[0] = b, w.vendor[1] = d, w.vendor[2] = c;
	if (w.max_leaf >= 1) {
		__cpuid(1, a, b, c, d);
		w.l1_eax = a, w.l1_ecx = c, w.l1_edx = d;
	}
	if (w.max_leaf >= 7) {
		__cpuid_count(7, 0, a, b, c, d);
		w.l7_ebx = b, w.l7_ecx = c, w.l7_edx = d;
		if (a >= 1) {
			__cpuid_count(7, 1, a, b, c, d);
			w.l7_1_eax = a;
		}
	}
	if (BIT(w.l1_ecx, 27)) {
		unsigned lo, hi;
		__asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
		w.xcr0 = ((uint64_t)hi << 32) | lo;
	}
	if (__get_cpuid_max(0x80000000u, NULL) >= 0x80000004u) {
		unsigned r[12];
		for (unsigned i = 0; i < 3; i++)
			__cpuid(0x80000002u + i, r[4 * i], r[4 * i + 1], r[4 * i + 2], r[4 * i + 3]);
		memcpy(brand, r, 48);
		brand[48] = 0;
	}
	char *s = brand; /* some CPUs pad the brand string with leading blanks */
	while (*s == ' ')
		s++;
	for (char *e = s + strlen(s); e > s && e[-1] == ' ';)
		*--e = 0;
	loom_cpu_decode(&w, s, &this_cpu);
	const char *cap = getenv("LOOM_CPU_ISA");
	if (cap && strcmp(cap, "avx2") == 0)
		cap_isa(&this_cpu, LOOM_ISA_AVX2);
	else if (cap && (strcmp(cap, "scalar") == 0 || strcmp(cap, "sse2") == 0))
		cap_isa(&this_cpu, LOOM_ISA_SCALAR);
}

const loom_cpu_t *loom_cpu(void)
{
	pthread_once(&cpu_once, detect);
	return &this_cpu;
}

const char *loom_isa_name(loom_isa_t isa)
{
	return isa == LOOM_ISA_AVX512 ? "AVX-512" : isa == LOOM_ISA_AVX2 ? "AVX2" : "SSE2";
}

const char *loom_cpu_features_str(const loom_cpu_t *c)
{
	static _Thread_local char buf[160];
	int n = 0;
	if (c->avx512f)
		n += snprintf(buf + n, sizeof buf - (size_t)n, "AVX-512 F%s%s%s", c->avx512bw ? "/BW" : "",
		              c->avx512vl ? "/VL" : "", c->avx512dq ? "/DQ" : "");
	else if (c->avx2)
		n += snprintf(buf + n, sizeof buf - (size_t)n, "AVX2%s", c->fma ? " + FMA" : "");
	else if (c->avx)
		n += snprintf(buf + n, sizeof buf - (size_t)n, "AVX");
	else
		n += snprintf(buf + n, sizeof buf - (size_t)n, "SSE2");
	if (c->avx512_vnni)
		n += snprintf(buf + n, sizeof buf - (size_t)n, ", VNNI");
	if (c->avx512_bf16)
		n += snprintf(buf + n, sizeof buf - (size_t)n, ", AVX512-BF16");
	if (c->amx_tile)
		n += snprintf(buf + n, sizeof buf - (size_t)n, ", AMX-TILE%s", c->amx_bf16 ? "/BF16" : "");
	(void)n;
	return buf;
}

/* ---- OpenBLAS's kernels ------------------------------------------------------------------------ */

int loom_blas_core_tier(const char *name)
{
	static const struct {
		const char *name;
		int tier;
	} cores[] = {
		{"skylakex", 3}, {"cooperlake", 3}, {"sapphirerapids", 3},
		{"haswell", 2}, {"zen", 2}, {"excavator", 2},
		{"sandybridge", 1}, {"bulldozer", 1}, {"piledriver", 1}, {"steamroller", 1},
	};
	for (size_t i = 0; name && i < LOOM_ARRAY_LEN(cores); i++)
		if (strcasecmp(name, cores[i].name) == 0)
			return cores[i].tier;
	return 0;
}

void loom_blas_plan(const loom_cpu_t *cpu, const char *current, const char *user, loom_blas_plan_t *p)
{
	const char *best = cpu->isa == LOOM_ISA_AVX512 ? "SkylakeX" : cpu->isa == LOOM_ISA_AVX2 ? "Haswell" : NULL;
	int want = cpu->isa == LOOM_ISA_AVX512 ? 3 : cpu->isa == LOOM_ISA_AVX2 ? 2 : 0;
	memset(p, 0, sizeof *p);
	p->coretype = best;
	if (user && *user)
		snprintf(p->why, sizeof p->why, "OpenBLAS core %s: OPENBLAS_CORETYPE=%s is yours, left as it is%s%s",
		         current ? current : "?", user, best && loom_blas_core_tier(user) < want ? "; this CPU can run " : "",
		         best && loom_blas_core_tier(user) < want ? best : "");
	else if (!best || loom_blas_core_tier(current) >= want)
		snprintf(p->why, sizeof p->why, "OpenBLAS core %s: the best it has for %s", current ? current : "?",
		         loom_isa_name(cpu->isa));
	else {
		p->force = 1;
		snprintf(p->why, sizeof p->why,
		         "OpenBLAS picked core %s for this CPU model, below its %s: OPENBLAS_CORETYPE=%s",
		         current ? current : "?", loom_isa_name(cpu->isa), best);
	}
}

/* ---- the throughput loops -------------------------------------------------------------------- */

/* Each runs `iters` rounds of its accumulators and returns a value built from them, so the compiler
 * cannot drop the work. The multiplier is just below 1 and the addend tiny: the values stay normal. */

__attribute__((target("avx512f"))) static float loop_avx512(long iters)
{
	__m512 acc[16], m = _mm512_set1_ps(0.9999999f), b = _mm512_set1_ps(1e-7f);
	for (int i = 0; i < 16; i++)
		acc[i] = _mm512_set1_ps((float)i);
	for (long k = 0; k < iters; k++) {
#pragma GCC unroll 16
		for (int i = 0; i < 16; i++)
			acc[i] = _mm512_fmadd_ps(acc[i], m, b);
	}
	for (int i = 1; i < 16; i++)
		acc[0] = _mm512_add_ps(acc[0], acc[i]);
	return _mm512_reduce_add_ps(acc[0]);
}

__attribute__((target("avx2,fma"))) static float loop_avx2(long iters)
{
	__m256 acc[12], m = _mm256_set1_ps(0.9999999f), b = _mm256_set1_ps(1e-7f);
	float out[8];
	for (int i = 0; i < 12; i++)
		acc[i] = _mm256_set1_ps((float)i);
	for (long k = 0; k < iters; k++) {
#pragma GCC unroll 12
		for (int i = 0; i < 12; i++)
			acc[i] = _mm256_fmadd_ps(acc[i], m, b);
	}
	for (int i = 1; i < 12; i++)
		acc[0] = _mm256_add_ps(acc[0], acc[i]);
	_mm256_storeu_ps(out, acc[0]);
	return out[0] + out[7];
}

static float loop_sse2(long iters)
{
	__m128 acc[8], m = _mm_set1_ps(0.9999999f), b = _mm_set1_ps(1e-7f);
	float out[4];
	for (int i = 0; i < 8; i++)
		acc[i] = _mm_set1_ps((float)i);
	for (long k = 0; k < iters; k++) {
#pragma GCC unroll 8
		for (int i = 0; i < 8; i++)
			acc[i] = _mm_add_ps(_mm_mul_ps(acc[i], m), b);
	}
	for (int i = 1; i < 8; i++)
		acc[0] = _mm_add_ps(acc[0], acc[i]);
	_mm_storeu_ps(out, acc[0]);
	return out[0] + out[3];
}

/* vdpbf16ps: each of 16 fp32 lanes gains the sum of two bf16 products, 4 FLOP a lane. */
__attribute__((target("avx512f,avx512bf16"))) static float loop_bf16(long iters)
{
	__m512 acc[16];
	__m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3380); /* 1, ~6e-8 */
	for (int i = 0; i < 16; i++)
		acc[i] = _mm512_set1_ps((float)i);
	for (long k = 0; k < iters; k++) {
#pragma GCC unroll 16
		for (int i = 0; i < 16; i++)
			acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
	}
	for (int i = 1; i < 16; i++)
		acc[0] = _mm512_add_ps(acc[0], acc[i]);
	return _mm512_reduce_add_ps(acc[0]);
}

/* The loops by kind: the loom_isa_t values, then the bf16 dot product; FLOP of one round each. */
enum { LOOP_BF16 = LOOM_ISA_AVX512 + 1 };
static const struct {
	float (*run)(long iters);
	double flops;
} loops[] = {
	{loop_sse2, 8 * 4 * 2.0},     /* 8 x (4 lanes x mul + add) */
	{loop_avx2, 12 * 8 * 2.0},    /* 12 x 8 lanes x FMA */
	{loop_avx512, 16 * 16 * 2.0}, /* 16 x 16 lanes x FMA */
	{loop_bf16, 16 * 16 * 4.0},   /* 16 x 16 lanes x (2 products + 2 adds) */
};

static volatile float sink;

static void run_loop(int kind, long iters)
{
	sink = loops[kind].run(iters);
}

static int can_run(int kind)
{
	const loom_cpu_t *c = loom_cpu();
	return kind == LOOP_BF16 ? c->avx512_bf16 : (int)c->isa >= kind;
}

/* Best FLOP/s over repeated timed runs of `threads` threads each running the loop at once, for about
 * `seconds` in all. */
static double measure(int kind, int threads, double seconds)
{
	if (!can_run(kind))
		return 0.0;
	if (threads <= 0)
		threads = omp_get_num_procs();
	long iters = 1 << 16;
	double best = 0.0, start = loom_now();
	run_loop(kind, 1 << 12); /* wake the unit (AVX-512 may start at a lower clock) */
	for (int rep = 0; rep < 1000; rep++) {
		double t0 = loom_now();
		if (threads == 1)
			run_loop(kind, iters);
		else {
#pragma omp parallel num_threads(threads)
			run_loop(kind, iters);
		}
		double dt = loom_now() - t0;
		if (dt < 0.005 && iters < (1L << 30)) { /* too short to time well: longer rounds */
			iters *= 4;
			continue;
		}
		double f = loops[kind].flops * (double)iters * threads / dt;
		best = f > best ? f : best;
		if (rep >= 3 && loom_now() - start >= seconds)
			break;
	}
	return best;
}

double loom_fma_peak_flops(int threads, double seconds)
{
	return measure((int)loom_cpu()->isa, threads, seconds);
}

double loom_bf16_dot_peak_flops(int threads, double seconds)
{
	return measure(LOOP_BF16, threads, seconds);
}

double loom_fma_loop_flops(loom_isa_t isa, double seconds)
{
	return measure((int)isa, 1, seconds);
}
