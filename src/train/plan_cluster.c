/* plan_cluster.c: the planner's clusters (loom/plan.h): the named profiles shipped with loom (each
 * figure's source in docs/plan.md), cluster files in JSON (every key checked: an unknown key, a wrong
 * type or a value out of range is an error naming the file, the key and what was expected), and this
 * machine measured (loom_cluster_local: the hardware and GEMM peaks and the memory copy bandwidths from
 * the peak cache, each measured once and cached when missing, so every program that plans for this
 * machine reads the same figures: `loom plan` and `loom train` cannot disagree about the machine).
 *
 * The local cluster carries this machine's measured kernel rates (plan_calib.c: the block's matmuls, the
 * attention, the optimizer), which the planner uses instead of the efficiency and width factor below;
 * those, the elementwise kernels' traffic and the process overhead are constants calibrated on the
 * development machine against `loom train` (docs/plan.md, "Calibration"), the fallback when nothing is
 * measured; a cluster file may override each. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/json.h"
#include "core/fileio.h"
#include "core/util.h"
#include "loom/cpu.h"
#include "loom/gpt2.h"
#include "loom/plan.h"
#include "loom/train.h"

#define GIB 1073741824.0
#define MIB 1048576.0

/* Calibrated on the development machine (docs/plan.md, "Calibration"): training's matmuls reach the
 * GEMM's measured peak (LOCAL_GEMM_FRACTION of it) at large widths and C / (C + LOCAL_GEMM_HALF) of
 * it at width C; two ranks at once on the two cores run their matmuls at LOCAL_CORUN of one alone
 * (measured 2026-11-26: two single-thread sgemm 1024^3 processes at once ran at 106-109 GFLOP/s each,
 * alone 104-108; what the ranks share is the memory bus, which the elementwise kernels' and the
 * optimizer's traffic meet at the node's measured copy bandwidth); the non-matmul kernels move
 * LOCAL_ELEMENTWISE bytes per byte of a micro-batch's activations. The first two and the co-running
 * factor were fit (a grid) to bench/plan_vs_measured.sh's step times of 2026-11-25 on a quiet machine
 * (co-running 0.9 then); run again on 2026-11-26, that fit over-predicted every 2-rank configuration
 * (+4% to +17%), which the co-run measurement explains (docs/plan.md, "Calibration"). A process holds
 * LOCAL_OVERHEAD before its model with one thread (binary, libraries, OpenMP, oneDNN; measured
 * 2026-11-28 as the peak RSS of `tiny`, `small` and nanochat d4 runs on a 5 KB shard less every
 * part the plan counts: 19.6-19.8 MiB; the data loader's shard pages and evaluation's are parts of
 * their own now), a rank of a job LOCAL_COMM_OVERHEAD more (the communicator's segments and threads),
 * and every thread beyond the first LOCAL_THREAD_SCRATCH (its stack, malloc arena and the GEMM's
 * packing buffers: 0.4-3.4 MiB per thread, growing with the matrices, from `tiny` at T 64 to nanochat
 * d4 at T 256). */
#define LOCAL_GEMM_FRACTION 1.0
#define LOCAL_GEMM_HALF 16.0
#define LOCAL_CORUN 1.0
#define LOCAL_ELEMENTWISE 6.0
#define LOCAL_OVERHEAD (19.7 * MIB)
#define LOCAL_COMM_OVERHEAD (1.5 * MIB)
#define LOCAL_THREAD_SCRATCH (2.0 * MIB)

static const struct {
	const char *name;
	loom_cluster_t c;
} profiles[] = {
	/* A cloud CPU node like the development machine: an AMD EPYC (Zen 4) VM, 2 vCPUs, one rank per core. */
	{"cpu-node", {.name = "cpu-node", .nodes = 1, .ranks_per_node = 2, .peak_flops_fp32 = 117.6e9,
	              .peak_flops_bf16 = 234.9e9, .efficiency = LOCAL_GEMM_FRACTION * 110.9 / 117.6,
	              .gemm_half_size = LOCAL_GEMM_HALF, .corun_efficiency = LOCAL_CORUN, .memory_bytes = 23.0 * GIB,
	              .memory_shared = 1,
	              .memory_bw = 10e9, .node_memory_bw = 14e9, .elementwise_bytes_per_act = LOCAL_ELEMENTWISE, .intra_bw = 2.5e9,
	              .intra_lat = 2e-6, .inter_bw = 3.125e9, .inter_lat = 30e-6, .price_rank_hour = 0.05,
	              .overhead_bytes = LOCAL_OVERHEAD, .comm_overhead_bytes = LOCAL_COMM_OVERHEAD,
	              .thread_scratch_bytes = LOCAL_THREAD_SCRATCH, .cores = 2,
	              .threads = 1,
	              .source = "measured on the development machine (loom's FMA loop and GEMM; 25 Gb/s Ethernet "
	                        "between nodes; price: a 2-vCPU AMD cloud instance, about $0.10/h)"}},
	/* NVIDIA DGX A100 80GB: A100 SXM datasheet (TF32 156, BF16 312 TFLOP/s dense), NVLink 3 (600 GB/s
	 * per GPU both ways), 8 x 200 Gb/s HDR InfiniBand per node. */
	{"a100-8x80g", {.name = "a100-8x80g", .nodes = 1, .ranks_per_node = 8, .peak_flops_fp32 = 156e12,
	                .peak_flops_bf16 = 312e12, .efficiency = 0.55, .memory_bytes = 80e9, .memory_bw = 2.039e12,
	                .intra_bw = 300e9, .intra_lat = 5e-6, .inter_bw = 25e9, .inter_lat = 5e-6,
	                .price_rank_hour = 1.80, .overhead_bytes = 1.5 * GIB,
	                .source = "NVIDIA A100 datasheet; DGX A100 user guide (NVLink 3, 8x HDR 200 Gb/s IB); "
	                          "on-demand price about $1.80 per GPU-hour (2024)"}},
	/* NVIDIA DGX H100: H100 SXM datasheet (TF32 494.5, BF16 989 TFLOP/s dense), NVLink 4 (900 GB/s per GPU
	 * both ways), 8 x 400 Gb/s NDR InfiniBand per node. */
	{"h100-8x", {.name = "h100-8x", .nodes = 1, .ranks_per_node = 8, .peak_flops_fp32 = 494.5e12,
	             .peak_flops_bf16 = 989e12, .efficiency = 0.50, .memory_bytes = 80e9, .memory_bw = 3.35e12,
	             .intra_bw = 450e9, .intra_lat = 4e-6, .inter_bw = 50e9, .inter_lat = 5e-6, .price_rank_hour = 3.00,
	             .overhead_bytes = 1.5 * GIB,
	             .source = "NVIDIA H100 SXM datasheet; DGX H100 (NVLink 4, 8x NDR 400 Gb/s IB); on-demand price "
	                       "about $3.00 per GPU-hour (2024)"}},
	/* AMD Instinct MI300X platform: MI300X datasheet (TF32 653.7, BF16 1307.4 TFLOP/s dense, 192 GB HBM3 at
	 * 5.3 TB/s, 896 GB/s Infinity Fabric peer-to-peer both ways), 8 x 400 Gb/s per node. */
	{"mi300x-8x", {.name = "mi300x-8x", .nodes = 1, .ranks_per_node = 8, .peak_flops_fp32 = 653.7e12,
	               .peak_flops_bf16 = 1307.4e12, .efficiency = 0.40, .memory_bytes = 192e9, .memory_bw = 5.3e12,
	               .intra_bw = 448e9, .intra_lat = 5e-6, .inter_bw = 50e9, .inter_lat = 5e-6,
	               .price_rank_hour = 2.50, .overhead_bytes = 1.5 * GIB,
	               .source = "AMD Instinct MI300X datasheet (Infinity Fabric 896 GB/s, 8x 400 Gb/s per node); "
	                         "on-demand price about $2.50 per GPU-hour (2024)"}},
};

static const char *const names[] = {"cpu-node", "a100-8x80g", "h100-8x", "mi300x-8x", NULL};

const char *const *loom_cluster_profiles(void)
{
	return names;
}

int loom_cluster_profile(const char *name, int nodes, loom_cluster_t *c)
{
	for (size_t k = 0; k < LOOM_ARRAY_LEN(profiles); k++)
		if (name && !strcmp(name, profiles[k].name)) {
			*c = profiles[k].c;
			c->nodes = nodes > 0 ? nodes : 1;
			return LOOM_OK;
		}
	return loom_seterr(LOOM_ENOENT, "cluster profile '%s' is not one of cpu-node, a100-8x80g, h100-8x, mi300x-8x "
	                   "(or give a cluster file, FILE.json, or local)", name ? name : "");
}

/* The keys of a cluster file: where each goes and its range. */
typedef enum { K_INT, K_NUM, K_STR } kind_t;
static const struct {
	const char *key;
	kind_t kind;
	size_t off;
	double lo, hi; /* numbers: lo < x <= hi (lo = -1: 0 allowed) */
	const char *what;
} keys[] = {
	{"name", K_STR, offsetof(loom_cluster_t, name), 0, 0, "a string"},
	{"source", K_STR, offsetof(loom_cluster_t, source), 0, 0, "a string"},
	{"nodes", K_INT, offsetof(loom_cluster_t, nodes), 0, 1e6, "an integer >= 1"},
	{"ranks_per_node", K_INT, offsetof(loom_cluster_t, ranks_per_node), 0, 1e6, "an integer >= 1"},
	{"cores", K_INT, offsetof(loom_cluster_t, cores), -1, 1e6, "an integer >= 0 (CPUs a node's ranks share)"},
	{"threads", K_INT, offsetof(loom_cluster_t, threads), 0, 1e6, "an integer >= 1"},
	{"peak_flops_fp32", K_NUM, offsetof(loom_cluster_t, peak_flops_fp32), 0, 1e20, "FLOP/s > 0, e.g. 1.56e14"},
	{"peak_flops_bf16", K_NUM, offsetof(loom_cluster_t, peak_flops_bf16), -1, 1e20, "FLOP/s >= 0"},
	{"efficiency", K_NUM, offsetof(loom_cluster_t, efficiency), 0, 1, "a fraction in (0, 1]"},
	{"gemm_half_size", K_NUM, offsetof(loom_cluster_t, gemm_half_size), -1, 1e9, "a width >= 0"},
	{"corun_efficiency", K_NUM, offsetof(loom_cluster_t, corun_efficiency), -1, 1, "a fraction in [0, 1]"},
	{"memory_bytes", K_NUM, offsetof(loom_cluster_t, memory_bytes), -1, 1e18, "bytes >= 0, e.g. 8e10"},
	{"memory_shared", K_INT, offsetof(loom_cluster_t, memory_shared), -1, 1, "0 or 1"},
	{"background_load", K_NUM, offsetof(loom_cluster_t, background_load), -1, 1e6, "threads >= 0"},
	{"node_memory_bw", K_NUM, offsetof(loom_cluster_t, node_memory_bw), -1, 1e17, "bytes/s >= 0"},
	{"memory_bw", K_NUM, offsetof(loom_cluster_t, memory_bw), -1, 1e16, "bytes/s >= 0"},
	{"elementwise_bytes_per_act", K_NUM, offsetof(loom_cluster_t, elementwise_bytes_per_act), -1, 1e6,
	 "a number >= 0"},
	{"intra_bw", K_NUM, offsetof(loom_cluster_t, intra_bw), 0, 1e16, "bytes/s > 0, e.g. 3e11"},
	{"intra_lat", K_NUM, offsetof(loom_cluster_t, intra_lat), -1, 10, "seconds >= 0, e.g. 5e-6"},
	{"inter_bw", K_NUM, offsetof(loom_cluster_t, inter_bw), 0, 1e16, "bytes/s > 0, e.g. 2.5e10"},
	{"inter_lat", K_NUM, offsetof(loom_cluster_t, inter_lat), -1, 10, "seconds >= 0"},
	{"price_rank_hour", K_NUM, offsetof(loom_cluster_t, price_rank_hour), -1, 1e9, "a price >= 0"},
	{"overhead_bytes", K_NUM, offsetof(loom_cluster_t, overhead_bytes), -1, 1e18, "bytes >= 0"},
	{"comm_overhead_bytes", K_NUM, offsetof(loom_cluster_t, comm_overhead_bytes), -1, 1e18, "bytes >= 0"},
	{"thread_scratch_bytes", K_NUM, offsetof(loom_cluster_t, thread_scratch_bytes), -1, 1e18, "bytes >= 0"},
};

static const char *const required[] = {"nodes", "ranks_per_node", "peak_flops_fp32", "memory_bytes", "intra_bw",
                                       "inter_bw"};

int loom_cluster_load(const char *path, loom_cluster_t *c)
{
	char *text = NULL, err[256];
	size_t len;
	json_t root;
	int rc;
	memset(&root, 0, sizeof root);
	memset(c, 0, sizeof *c);
	if ((rc = loom__read_file_max(path, 1 << 20, &text, &len)) != LOOM_OK)
		return loom_seterr(rc, "cluster file %s: %s", path, rc == LOOM_ENOENT ? "no such file" : loom_errmsg());
	if (loom__json_parse(text, len, &root, err, sizeof err) != 0) {
		rc = loom_seterr(LOOM_EFORMAT, "cluster file %s: not JSON: %s", path, err);
		goto out;
	}
	if (root.type != JSON_OBJECT) {
		rc = loom_seterr(LOOM_EFORMAT, "cluster file %s: expected one JSON object, got %s", path,
		                 loom__json_type_name(root.type));
		goto out;
	}
	const json_t *prof = loom__json_get(&root, "profile");
	if (prof) {
		if (prof->type != JSON_STRING) {
			rc = loom_seterr(LOOM_EFORMAT, "cluster file %s: key 'profile': expected a string (one of cpu-node, "
			                 "a100-8x80g, h100-8x, mi300x-8x), got %s", path, loom__json_type_name(prof->type));
			goto out;
		}
		if ((rc = loom_cluster_profile(prof->s, 1, c)) != LOOM_OK) {
			rc = loom_seterr(LOOM_EFORMAT, "cluster file %s: key 'profile': %s", path, loom_errmsg());
			goto out;
		}
	} else {
		c->efficiency = 0.5;
		c->threads = 1;
	}
	for (int i = 0; i < root.n; i++) {
		const json_t *v = &root.kids[i];
		size_t k;
		if (!strcmp(v->key, "profile"))
			continue;
		for (k = 0; k < LOOM_ARRAY_LEN(keys) && strcmp(keys[k].key, v->key); k++)
			;
		if (k == LOOM_ARRAY_LEN(keys)) {
			rc = loom_seterr(LOOM_EFORMAT, "cluster file %s: unknown key '%s' (expected profile, nodes, "
			                 "ranks_per_node, peak_flops_fp32, peak_flops_bf16, efficiency, memory_bytes, memory_bw, "
			                 "intra_bw, intra_lat, inter_bw, inter_lat, price_rank_hour, ...; docs/plan.md)", path,
			                 v->key);
			goto out;
		}
		char *dst = (char *)c + keys[k].off;
		if (keys[k].kind == K_STR) {
			if (v->type != JSON_STRING) {
				rc = loom_seterr(LOOM_EFORMAT, "cluster file %s: key '%s': expected a string, got %s", path, v->key,
				                 loom__json_type_name(v->type));
				goto out;
			}
			snprintf(dst, keys[k].kind == K_STR && keys[k].off == offsetof(loom_cluster_t, name) ? sizeof c->name
			                                                                                   : sizeof c->source,
			         "%s", v->s);
			continue;
		}
		double x = v->num;
		int ok = v->type == JSON_NUMBER && (keys[k].lo < 0 ? x >= 0 : x > keys[k].lo) && x <= keys[k].hi &&
		         (keys[k].kind != K_INT || x == (double)(long long)x);
		if (!ok) {
			if (v->type == JSON_NUMBER)
				rc = loom_seterr(LOOM_EFORMAT, "cluster file %s: key '%s': expected %s, got %s", path, v->key,
				                 keys[k].what, v->s);
			else
				rc = loom_seterr(LOOM_EFORMAT, "cluster file %s: key '%s': expected %s, got %s", path, v->key,
				                 keys[k].what, loom__json_type_name(v->type));
			goto out;
		}
		if (keys[k].kind == K_INT)
			*(int *)dst = (int)x;
		else
			*(double *)dst = x;
	}
	for (size_t r = 0; r < LOOM_ARRAY_LEN(required) && !prof; r++)
		if (!loom__json_get(&root, required[r])) {
			rc = loom_seterr(LOOM_EFORMAT, "cluster file %s: key '%s' is missing (required without \"profile\": "
			                 "nodes, ranks_per_node, peak_flops_fp32, memory_bytes, intra_bw, inter_bw)", path,
			                 required[r]);
			goto out;
		}
	if (!c->name[0]) {
		const char *b = strrchr(path, '/');
		snprintf(c->name, sizeof c->name, "%s", b ? b + 1 : path);
	}
	if (!c->source[0])
		snprintf(c->source, sizeof c->source, "cluster file %s", path);
	rc = LOOM_OK;
out:
	loom__json_free(&root);
	free(text);
	return rc;
}

/* Bytes/s of `threads` threads each copying its own 32 MiB at once (read + write counted), the best
 * of 4 rounds: one thread's is a rank's bandwidth alone, all CPUs' the node's. */
static double copy_bandwidth(int threads)
{
	size_t n = 32 << 20;
	double best = 0.0;
	int ok = 1;
#pragma omp parallel num_threads(threads) reduction(min : ok)
	{
		char *a = loom_alloc_aligned(n), *b = loom_alloc_aligned(n);
		if (a && b) {
			memset(a, 1, n), memset(b, 2, n);
		} else {
			ok = 0;
		}
		for (int r = 0; r < 4; r++) {
#pragma omp barrier
			double t = loom_now();
			if (a && b)
				memcpy(b, a, n);
#pragma omp barrier
#pragma omp single
			{
				t = loom_now() - t;
				if (t > 0 && 2.0 * n * threads / t > best)
					best = 2.0 * n * threads / t;
			}
		}
		if (a && b)
			a[0] = b[n - 1]; /* keep the copies */
		loom_free_aligned(a), loom_free_aligned(b);
	}
	return ok ? best : 0.0;
}

double loom_cluster_measure_load(int cores, double seconds)
{
	double peak = 0.0, now;
	if (cores < 1 || loom_peak_cache_get_kind(LOOM_PEAK_HW_FP32, 1, &peak) != LOOM_OK || !(peak > 0))
		return 0.0;
	now = loom_fma_peak_flops(1, seconds);
	if (!(now > 0) || now >= 0.95 * peak)
		return 0.0;
	/* one thread gets C / (R + 1) of a core; to a thousandth of a thread, as the plan's JSON gives it,
	 * so that a plan made with the printed load (--load X) is the same plan */
	return round(1000.0 * LOOM_MAX(0.0, cores / (now / peak) - 1.0)) / 1000.0;
}

/* The kinds of figure this machine's cluster reads from the peak cache for `threads` threads per rank
 * and matmuls in dt, as (kind, threads) pairs: the hardware's and the GEMM's fp32 peaks, bf16's with
 * dt bf16, and the copy bandwidth of one thread and of every CPU. Returns the count (at most 6). */
static int local_figures(int threads, loom_compute_dtype_t dt, loom_peak_kind_t *kind, int *th)
{
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	int n = 0;
	kind[n] = LOOM_PEAK_HW_FP32, th[n++] = threads;
	kind[n] = LOOM_PEAK_GEMM_FP32, th[n++] = threads;
	if (dt == LOOM_COMPUTE_BF16) {
		kind[n] = LOOM_PEAK_HW_BF16, th[n++] = threads;
		kind[n] = LOOM_PEAK_GEMM_BF16, th[n++] = threads;
	}
	kind[n] = LOOM_PEAK_MEM_BW, th[n++] = 1;
	if (cpus > 1)
		kind[n] = LOOM_PEAK_MEM_BW, th[n++] = (int)cpus;
	return n;
}

static const char *figure_name(loom_peak_kind_t kind, int threads)
{
	switch (kind) {
	case LOOM_PEAK_HW_FP32: return "the hardware's fp32 peak";
	case LOOM_PEAK_GEMM_FP32: return "the GEMM's fp32 peak";
	case LOOM_PEAK_HW_BF16: return "the hardware's bf16 peak";
	case LOOM_PEAK_GEMM_BF16: return "the GEMM's bf16 peak";
	default: return threads == 1 ? "one thread's memory bandwidth" : "all CPUs' memory bandwidth";
	}
}

int loom_cluster_local_missing(int threads, loom_compute_dtype_t dt, char *what, size_t cap)
{
	loom_peak_kind_t kind[6];
	int th[6], n = local_figures(threads > 0 ? threads : 1, dt, kind, th), missing = 0;
	size_t len = 0;
	double v;
	if (what && cap)
		what[0] = 0;
	for (int k = 0; k < n; k++) {
		if (loom_peak_cache_trusted(kind[k], th[k]) && loom_peak_cache_get_kind(kind[k], th[k], &v) == LOOM_OK && v > 0)
			continue;
		if (what && len < cap)
			len += (size_t)snprintf(what + len, cap - len, "%s%s", missing ? ", " : "", figure_name(kind[k], th[k]));
		missing++;
	}
	char cal[512];
	int nc = loom_calib_missing(threads > 0 ? threads : 1, dt, cal, sizeof cal);
	if (nc && what && len < cap)
		len += (size_t)snprintf(what + len, cap - len, "%sthe kernels' rates (%s)", missing ? ", " : "", cal);
	return missing + nc;
}

static double cpu_seconds(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

int loom_cluster_local_measure(int threads, loom_compute_dtype_t dt)
{
	return loom_cluster_local_fill(threads, dt, 1);
}

int loom_cluster_local_fill(int threads, loom_compute_dtype_t dt, int suspect)
{
	loom_peak_kind_t kind[6];
	int th[6], n, rc = LOOM_OK;
	const char *src = NULL;
	threads = threads > 0 ? threads : 1;
	n = local_figures(threads, dt, kind, th);
	for (int k = 0; k < n; k++) {
		double v, c0 = cpu_seconds(), t0 = loom_now();
		if (suspect ? loom_peak_cache_trusted(kind[k], th[k])
		            : loom_peak_cache_get_kind(kind[k], th[k], &v) == LOOM_OK && v > 0)
			continue; /* (a line taken under load, or before the share was recorded: measured again) */
		switch (kind[k]) {
		case LOOM_PEAK_HW_FP32: v = loom_hw_peak_flops(LOOM_COMPUTE_FP32, th[k], &src); break;
		case LOOM_PEAK_HW_BF16: v = loom_hw_peak_flops(LOOM_COMPUTE_BF16, th[k], &src); break;
		case LOOM_PEAK_GEMM_FP32: v = loom_gemm_peak_flops_dtype(LOOM_COMPUTE_FP32, th[k]); break;
		case LOOM_PEAK_GEMM_BF16: v = loom_gemm_peak_flops_dtype(LOOM_COMPUTE_BF16, th[k]); break;
		default: v = copy_bandwidth(th[k]); break;
		}
		if (!(v > 0)) {
			rc = loom_seterr(LOOM_ENOENT, "cluster local: measuring %s with %d thread(s) failed",
			                 figure_name(kind[k], th[k]), th[k]);
			continue;
		}
		double wall = loom_now() - t0, share = wall > 0 ? LOOM_MIN(1.0, (cpu_seconds() - c0) / (wall * th[k])) : 1.0;
		int put = loom_peak_cache_put_share(kind[k], th[k], v, share); /* a read-only home: measured every time */
		(void)put;
	}
	if (loom_calib_measure(threads, dt, suspect) != LOOM_OK && rc == LOOM_OK)
		rc = loom_seterr(LOOM_ENOENT, "cluster local: %s", loom_errmsg());
	return rc;
}

int loom_cluster_local(int threads, int measure, loom_cluster_t *c)
{
	double hw32 = 0, hw16 = 0, gemm = 0, bw1 = 0, bwn = 0;
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
	threads = threads > 0 ? threads : 1;
	memset(c, 0, sizeof *c);
	if (measure)
		loom_cluster_local_fill(threads, LOOM_COMPUTE_FP32, 0); /* what is missing; the reads below say */
	if (loom_peak_cache_get_kind(LOOM_PEAK_HW_FP32, threads, &hw32) != LOOM_OK)
		hw32 = 0.0;
	if (loom_peak_cache_get_kind(LOOM_PEAK_GEMM_FP32, threads, &gemm) != LOOM_OK)
		gemm = 0.0;
	if (loom_peak_cache_get_kind(LOOM_PEAK_HW_BF16, threads, &hw16) != LOOM_OK)
		hw16 = 0.0; /* not measured here: bf16 then plans at the fp32 figures */
	if (loom_peak_cache_get_kind(LOOM_PEAK_MEM_BW, 1, &bw1) != LOOM_OK)
		bw1 = 0.0;
	if (cpus > 1 && loom_peak_cache_get_kind(LOOM_PEAK_MEM_BW, (int)cpus, &bwn) != LOOM_OK)
		bwn = 0.0;
	if (!(hw32 > 0))
		return loom_seterr(LOOM_ENOENT, "cluster local: no measured peak for %d thread(s) in the peak cache (run "
		                   "`loom bench gemm` or `loom train` once, or let plan measure it)", threads);
	snprintf(c->name, sizeof c->name, "local");
	c->nodes = 1;
	c->cores = cpus > 0 ? (int)cpus : 1;
	c->threads = threads;
	c->ranks_per_node = LOOM_MAX(64, c->cores); /* ranks may share cores: the share is modelled */
	c->peak_flops_fp32 = hw32;
	c->peak_flops_bf16 = hw16;
	c->efficiency = (gemm > 0 ? LOOM_MIN(gemm / hw32, 1.0) : 0.9) * LOCAL_GEMM_FRACTION;
	c->gemm_half_size = LOCAL_GEMM_HALF;
	c->corun_efficiency = LOCAL_CORUN;
	c->memory_bytes = pages > 0 && page > 0 ? (double)pages * page : 0.0;
	c->memory_shared = 1;
	/* the copy bandwidths from the cache (measured once, as the peaks; without them cpu-node's figures) */
	c->memory_bw = (bw1 > 0 ? bw1 : profiles[0].c.memory_bw) * threads;
	c->node_memory_bw = c->cores > 1 ? (bwn > 0 ? bwn : profiles[0].c.node_memory_bw) : c->memory_bw;
	c->elementwise_bytes_per_act = LOCAL_ELEMENTWISE;
	c->intra_bw = c->memory_bw / 4.0; /* calibrated: `loom bench comm`, 2 ranks, 1-16 MiB: 1.8-2.9 GB/s */
	c->intra_lat = 2e-6;
	c->inter_bw = 3.125e9, c->inter_lat = 30e-6; /* not measured: 25 Gb/s Ethernet */
	c->overhead_bytes = LOCAL_OVERHEAD;
	c->comm_overhead_bytes = LOCAL_COMM_OVERHEAD;
	c->thread_scratch_bytes = LOCAL_THREAD_SCRATCH;
	/* the kernels' measured rates: the matmuls of a block and the attention (plan_calib.c) */
	loom_calib_read(threads, &c->calib);
	int mm32 = loom_calib_mm_rate(&c->calib, LOOM_COMPUTE_FP32, 256) > 0;
	int mm16 = loom_calib_mm_rate(&c->calib, LOOM_COMPUTE_BF16, 256) > 0;
	int att = loom_calib_attn_rate(&c->calib, 64, 512) > 0, opt = c->calib.adamw > 0;
	snprintf(c->figures, sizeof c->figures, "measured: peaks%s%s%s%s%s; assumed: %s%s%selementwise traffic %g B/B, "
	         "links", mm32 ? ", fp32 matmuls" : "", mm16 ? ", bf16 matmuls" : "", att ? ", attention" : "",
	         opt ? ", optimizer" : "", bw1 > 0 ? ", memory bandwidth" : "",
	         mm32 ? "" : "matmuls (GEMM peak x width factor), ", att ? "" : "attention (at the matmuls' rate), ",
	         opt ? "" : "optimizer (32 B per parameter), ", LOCAL_ELEMENTWISE);
	snprintf(c->source, sizeof c->source, "this machine: %d CPUs, hardware peak %.1f GFLOP/s and GEMM %.1f GFLOP/s "
	         "per rank of %d thread(s), memory copy %.1f GB/s per rank, %.1f GB/s all CPUs (peak cache%s), %.1f GiB",
	         c->cores, hw32 / 1e9, gemm / 1e9, threads, c->memory_bw / 1e9, c->node_memory_bw / 1e9,
	         bw1 > 0 ? "" : "; bandwidths not measured yet: cpu-node's", c->memory_bytes / GIB);
	return LOOM_OK;
}
