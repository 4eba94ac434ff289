/* peak.c: the cache of measured peaks (loom/train.h): the hardware's (the FMA throughput loop of loom/cpu.h, fp32
 * and bf16), which MFU is relative to, and the GEMM's in each matmul precision, which `loom train` prints beside it
 * as the fraction of the hardware the GEMM reaches.
 *
 * Measuring a peak takes 0.5 s (the hardware's) to 2 s (a GEMM's), so a program measures once per kind, thread
 * count and CPU and keeps the result in $XDG_CACHE_HOME/loom/ (or ~/.cache/loom/, /tmp/.cache/loom/ without HOME),
 * a file per kind: hw_peak, hw_peak_bf16, gemm_peak, gemm_peak_bf16, and the planner's memory copy bandwidth,
 * mem_bw (bytes/s, keyed by the copying threads); one line "threads cpu-hash value share time" per measurement,
 * appended (share: the CPU time the measuring threads got over the wall time; time: when, in seconds since the
 * epoch). The CPU hash is of /proc/cpuinfo's first "model name" line, so a home directory shared between machines
 * does not reuse another CPU's figure; a GEMM's peak also hashes the kernels that ran it. Lines that do not parse
 * are skipped.
 *
 * A figure measured while other work ran is too low (a copy bandwidth of 3.8 GB/s against 29 quiet was seen), so a
 * lookup takes the latest line measured quiet (share >= LOOM_CALIB_QUIET: a poisoned line never wins over it), else
 * the best of the lines (load only lowers a peak; not the best of the quiet ones: the luckiest of several runs is
 * no typical figure, and the load loom_cluster_measure_load derives from the FMA peak would see a busy machine in
 * an idle one), and loom_peak_cache_trusted says whether one line was taken on a quiet machine (share >=
 * LOOM_CALIB_QUIET) in the last LOOM_CALIB_MAX_AGE; the planner measures again when not (at most LOOM_CALIB_TRIES
 * times: a machine that is never quiet keeps the best of them). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "core/util.h"
#include "loom/gpt2.h"
#include "loom/plan.h"
#include "loom/train.h"

static unsigned long djb2(unsigned long h, const char *s)
{
	for (; *s; s++)
		h = h * 33 + (unsigned char)*s;
	return h;
}

/* Hash of this machine's CPU model name (djb2 over the whole line), with, for a GEMM's peak, the
 * kernels that ran it mixed in (OpenBLAS's peak is not oneDNN's, the portable bf16 path's not the
 * native one's); 0 without /proc/cpuinfo. */
static unsigned long cpu_hash(loom_peak_kind_t kind)
{
	FILE *f = fopen("/proc/cpuinfo", "r");
	char line[512];
	unsigned long h = 5381;
	loom_bf16_path_t path = LOOM_BF16_AUTO;
	if (!f)
		return 0;
	while (fgets(line, sizeof line, f))
		if (!strncmp(line, "model name", 10)) {
			h = djb2(h, line);
			break;
		}
	fclose(f);
	if (kind == LOOM_PEAK_GEMM_FP32)
		h = djb2(h, loom_gemm_backend_name());
	else if ((kind == LOOM_PEAK_GEMM_BF16 || kind == LOOM_PEAK_HW_BF16) && loom_bf16_path(&path) == LOOM_OK)
		h = djb2(h, loom_bf16_path_name(path));
	return h;
}

loom_peak_kind_t loom_peak_kind(int hw, loom_compute_dtype_t dt)
{
	int bf16 = dt == LOOM_COMPUTE_BF16;
	return hw ? (bf16 ? LOOM_PEAK_HW_BF16 : LOOM_PEAK_HW_FP32) : (bf16 ? LOOM_PEAK_GEMM_BF16 : LOOM_PEAK_GEMM_FP32);
}

static int cache_dir(char *buf, size_t cap)
{
	const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
	int n;
	if (xdg && *xdg)
		n = snprintf(buf, cap, "%s/loom", xdg);
	else
		n = snprintf(buf, cap, "%s/.cache/loom", home && *home ? home : "/tmp");
	if (n < 0 || (size_t)n >= cap)
		return loom_seterr(LOOM_EINVAL, "peak cache: the cache directory's path is longer than %zu bytes", cap);
	return LOOM_OK;
}

int loom_peak_cache_path(char *buf, size_t cap)
{
	return loom_peak_cache_path_dtype(LOOM_COMPUTE_FP32, buf, cap);
}

static const char *kind_file(loom_peak_kind_t kind)
{
	switch (kind) {
	case LOOM_PEAK_GEMM_BF16: return "gemm_peak_bf16";
	case LOOM_PEAK_HW_FP32: return "hw_peak";
	case LOOM_PEAK_HW_BF16: return "hw_peak_bf16";
	case LOOM_PEAK_MEM_BW: return "mem_bw";
	default: return "gemm_peak";
	}
}

int loom_peak_cache_path_dtype(loom_compute_dtype_t dt, char *buf, size_t cap)
{
	return loom_peak_cache_path_kind(loom_peak_kind(0, dt), buf, cap);
}

int loom_peak_cache_path_kind(loom_peak_kind_t kind, char *buf, size_t cap)
{
	const char *name = kind_file(kind);
	char dir[900];
	int rc = cache_dir(dir, sizeof dir), n;
	if (rc != LOOM_OK)
		return rc;
	n = snprintf(buf, cap, "%s/%s", dir, name);
	if (n < 0 || (size_t)n >= cap)
		return loom_seterr(LOOM_EINVAL, "peak cache: %s/%s is longer than %zu bytes", dir, name, cap);
	return LOOM_OK;
}

int loom_peak_cache_get(int threads, double *flops)
{
	return loom_peak_cache_get_dtype(LOOM_COMPUTE_FP32, threads, flops);
}

int loom_peak_cache_get_dtype(loom_compute_dtype_t dt, int threads, double *flops)
{
	return loom_peak_cache_get_kind(loom_peak_kind(0, dt), threads,
	                                flops);
}

/* The figure of the file's lines for threads on this CPU (the latest line measured quiet, else the best of the
 * others), how many lines there are, and how many of them the cache trusts: measured with a CPU share of at least
 * LOOM_CALIB_QUIET (other work did not take the CPUs meanwhile) less than LOOM_CALIB_MAX_AGE ago. A line of the
 * first format ("threads cpu-hash value", before loom recorded the share) is never trusted, so it is measured again
 * once. LOOM_OK (also when nothing matches: *n 0), or the path's error. */
static int scan(loom_peak_kind_t kind, int threads, double *best, int *n, int *quiet)
{
	char path[1000], line[256];
	unsigned long h = cpu_hash(kind), fh;
	int t, rc, got;
	double v, share, when, now = (double)time(NULL), latest = 0.0;
	FILE *f;
	*best = 0.0, *n = *quiet = 0;
	if ((rc = loom_peak_cache_path_kind(kind, path, sizeof path)) != LOOM_OK)
		return rc;
	if (!(f = fopen(path, "r")))
		return LOOM_OK;
	while (fgets(line, sizeof line, f)) {
		got = sscanf(line, "%d %lu %lf %lf %lf", &t, &fh, &v, &share, &when);
		if (got < 3 || t != threads || fh != h || !(v > 0))
			continue; /* another thread count or CPU, or a torn line */
		(*n)++;
		if (got == 5 && share >= LOOM_CALIB_QUIET) /* the latest quiet line */
			latest = v, *quiet += now - when <= LOOM_CALIB_MAX_AGE;
		*best = v > *best ? v : *best;
	}
	fclose(f);
	if (latest > 0)
		*best = latest;
	return LOOM_OK;
}

int loom_peak_cache_get_kind(loom_peak_kind_t kind, int threads, double *flops)
{
	char path[1000];
	double best;
	int rc, n, quiet;
	if ((rc = scan(kind, threads, &best, &n, &quiet)) != LOOM_OK)
		return rc;
	if (!n) {
		loom_peak_cache_path_kind(kind, path, sizeof path);
		return loom_seterr(LOOM_ENOENT, "peak cache: %s has no peak for %d threads on this CPU", path, threads);
	}
	*flops = best;
	return LOOM_OK;
}

int loom_peak_cache_trusted(loom_peak_kind_t kind, int threads)
{
	double best;
	int n, quiet;
	if (scan(kind, threads, &best, &n, &quiet) != LOOM_OK)
		return 0;
	return n > 0 && (quiet > 0 || n >= LOOM_CALIB_TRIES);
}

int loom_peak_cache_put(int threads, double flops)
{
	return loom_peak_cache_put_dtype(LOOM_COMPUTE_FP32, threads, flops);
}

int loom_peak_cache_put_dtype(loom_compute_dtype_t dt, int threads, double flops)
{
	return loom_peak_cache_put_kind(loom_peak_kind(0, dt), threads,
	                                flops);
}

int loom_peak_cache_put_kind(loom_peak_kind_t kind, int threads, double flops)
{
	return loom_peak_cache_put_share(kind, threads, flops, 1.0);
}

int loom_peak_cache_put_share(loom_peak_kind_t kind, int threads, double flops, double share)
{
	char dir[900], path[1000], parent[900];
	FILE *f;
	int rc;
	if (!(flops > 0) || threads < 1)
		return loom_seterr(LOOM_EINVAL, "peak cache: %g FLOP/s for %d threads: both must be > 0", flops, threads);
	if ((rc = cache_dir(dir, sizeof dir)) != LOOM_OK ||
	    (rc = loom_peak_cache_path_kind(kind, path, sizeof path)) != LOOM_OK)
		return rc;
	snprintf(parent, sizeof parent, "%s", dir);
	char *slash = strrchr(parent, '/');
	if (slash && slash != parent)
		*slash = 0, mkdir(parent, 0755); /* ~/.cache may not exist yet; errors show at fopen */
	mkdir(dir, 0755);
	if (!(f = fopen(path, "a")))
		return loom_seterr(LOOM_EIO, "peak cache: cannot append to %s", path);
	fprintf(f, "%d %lu %.6e %.3f %lld\n", threads, cpu_hash(kind), flops, share, (long long)time(NULL));
	if (fclose(f) != 0)
		return loom_seterr(LOOM_EIO, "peak cache: writing %s failed", path);
	return LOOM_OK;
}
