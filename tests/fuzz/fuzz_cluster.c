/* fuzz_cluster.c: libFuzzer harness for the cluster description `loom plan --cluster FILE` reads
 * (loom_cluster_load: JSON, every key checked for its type and range, a named profile as the base).
 * plan_cluster.c also measures this machine (loom_cluster_local), which needs the CPU's peak loops,
 * the GEMM, the peak cache and the kernels' calibration: the harness gives those failing stand-ins, never called by the reader
 * (make fuzz links plan_cluster.c into this harness alone). */
#include "fuzz.h"
#include "loom/cpu.h"
#include "loom/gpt2.h"
#include "loom/plan.h"
#include "loom/train.h"

int loom_peak_cache_get_kind(loom_peak_kind_t kind, int threads, double *flops)
{
	(void)kind, (void)threads, (void)flops;
	return LOOM_ENOENT;
}

int loom_peak_cache_put_kind(loom_peak_kind_t kind, int threads, double flops)
{
	(void)kind, (void)threads, (void)flops;
	return LOOM_ENOENT;
}

int loom_peak_cache_trusted(loom_peak_kind_t kind, int threads)
{
	(void)kind, (void)threads;
	return 0;
}

int loom_peak_cache_put_share(loom_peak_kind_t kind, int threads, double value, double share)
{
	(void)kind, (void)threads, (void)value, (void)share;
	return LOOM_ENOENT;
}

int loom_calib_missing(int threads, loom_compute_dtype_t dt, char *what, size_t cap)
{
	(void)threads, (void)dt;
	if (what && cap)
		what[0] = 0;
	return 0;
}

int loom_calib_measure(int threads, loom_compute_dtype_t dt, int suspect)
{
	(void)threads, (void)dt, (void)suspect;
	return LOOM_ENOTSUP;
}

int loom_calib_read(int threads, loom_calib_t *cal)
{
	(void)threads, (void)cal;
	return 0;
}

double loom_calib_mm_rate(const loom_calib_t *cal, loom_compute_dtype_t dt, double width)
{
	(void)cal, (void)dt, (void)width;
	return 0.0;
}

double loom_calib_attn_rate(const loom_calib_t *cal, int head_dim, int T)
{
	(void)cal, (void)head_dim, (void)T;
	return 0.0;
}

double loom_fma_peak_flops(int threads, double seconds)
{
	(void)threads, (void)seconds;
	return 0.0;
}

double loom_hw_peak_flops(loom_compute_dtype_t dt, int threads, const char **source)
{
	(void)dt, (void)threads, (void)source;
	return 0.0;
}

double loom_gemm_peak_flops_dtype(loom_compute_dtype_t dt, int threads)
{
	(void)dt, (void)threads;
	return 0.0;
}

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n)
{
	char path[512];
	loom_cluster_t c;
	fuzz_write("cluster.json", d, n, path, sizeof path);
	if (loom_cluster_load(path, &c) == LOOM_OK && (c.nodes < 1 || c.ranks_per_node < 1 || !(c.peak_flops_fp32 > 0)))
		abort(); /* a description the reader accepts is one the planner can use */
	return 0;
}
