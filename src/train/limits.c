/* limits.c: the memory a training rank will need before it allocates anything, the limits it runs
 * under, and the check of one against the other (loom/limits.h).
 *
 * The estimate is a sum of four parts, each from the figures the run will print once it has started:
 * the model states by the ZeRO stage's formula (the table below, the one src/train/memory.c prints
 * beside the measured states), the activations by the model's own layout arithmetic (the caller's
 * act_bytes), per-thread scratch and the strategy's communication buffers. Of those, what the shared
 * heap holds is resident but no new address space (the heap is mapped when the communicator joins).
 *
 * Per-thread scratch, the part no loom buffer shows: OpenBLAS (LOOM_GEMM=openblas) takes one buffer of
 * OPENBLAS_BUFFER bytes of address space for every thread that calls it, at its first call, and its
 * pthreads build starts workers at load that take one each (cli/main.c keeps them from starting under
 * a limit); oneDNN's sgemm packs its operands in about ONEDNN_SCRATCH per thread; every thread but the
 * first has a stack (RLIMIT_STACK, 8 MiB by default) of address space. Two more threads per process:
 * the communicator's liveness keeper and its progress engine.
 *
 * Limits: RLIMIT_AS and RLIMIT_DATA (per process, so against one rank's need), the memory cgroup and
 * MemAvailable (shared by the host's ranks, so against local_ranks times the need). Everything is read
 * from files under a root directory, so tests hand in fake /proc and /sys/fs/cgroup trees; reading
 * them takes well under a millisecond. */
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>

#include "core/util.h"
#include "loom/error.h"
#include "loom/limits.h"

#define MIB ((size_t)1 << 20)
#define OPENBLAS_BUFFER (128 * MIB) /* BUFFER_SIZE of OpenBLAS's x86-64 builds with AVX-512 kernels (32 MiB
                                     * on others): counted whole, as the larger */
#define OPENBLAS_TOUCHED (8 * MIB)  /* what of it a thread's sgemm calls touch (resident) */
#define ONEDNN_SCRATCH (4 * MIB)    /* oneDNN sgemm's packed operands per thread */
#define STACK_BYTES (8 * MIB)       /* a thread's stack: address space, barely resident */
#define EXTRA_THREADS 2             /* the liveness keeper and the progress engine */

/* Model states per parameter by ZeRO stage, with P parameters and N data-parallel ranks, fp32: the
 * rule as data (loom_mem_zero_states; src/train/memory.c prints them beside the measured states). */
static const struct {
	int zero;
	double whole, sharded; /* bytes per parameter kept whole, and split over the N ranks */
	const char *formula;
} states[] = {
	{0, 16, 0, "16P"},
	{1, 8, 8, "8P + 8P/N"},
	{2, 4, 12, "4P + 12P/N"},
	{3, 0, 16, "16P/N"},
};

static size_t add_sat(size_t a, size_t b)
{
	return a > SIZE_MAX - b ? SIZE_MAX : a + b;
}

static size_t mul_sat(size_t a, size_t b)
{
	return b && a > SIZE_MAX / b ? SIZE_MAX : a * b;
}

size_t loom_mem_zero_states(int zero, size_t nparams, int dp, const char **formula)
{
	double P = (double)nparams, N = dp > 1 ? dp : 1;
	for (size_t k = 0; k < LOOM_ARRAY_LEN(states); k++)
		if (states[k].zero == zero) {
			double b = states[k].whole * P + states[k].sharded * P / N;
			if (formula)
				*formula = states[k].formula;
			return b >= (double)SIZE_MAX ? SIZE_MAX : (size_t)b;
		}
	if (formula)
		*formula = "?";
	return 0;
}

int loom_mem_estimate(const loom_mem_plan_t *p, loom_mem_estimate_t *e)
{
	int N = p->dp > 1 ? p->dp : 1, zero = N > 1 ? p->zero : 0, T = LOOM_MAX(p->threads, 1);
	size_t heap_eligible = 0, act = 0;
	memset(e, 0, sizeof *e);
	e->model_states = loom_mem_zero_states(zero, p->nparams, N, &e->formula);
	if (zero == 3) /* the whole initial parameters, until the strategy takes its shard */
		e->model_states = add_sat(e->model_states, mul_sat(p->nparams, sizeof(float)));
	if (p->act_bytes && p->act_bytes(p->ctx, p->B, p->act_ckpt, &act) != 0)
		return loom_seterr(LOOM_EINVAL, "memory estimate: no activation layout for --batch-size %d: %s", p->B,
		                   loom_errmsg());
	e->activations = act;
	/* Communication: DDP and ZeRO-1 reduce a whole gradient buffer of their own; ZeRO-2 stages the
	 * embedding and two of the largest other unit; ZeRO-3 also gathers as many parameters. */
	if (N > 1 && zero <= 1)
		heap_eligible = mul_sat(p->nparams, sizeof(float));
	else if (N > 1)
		heap_eligible = mul_sat(add_sat(p->emb_params, mul_sat(p->block_params, 2)), sizeof(float) * (zero == 3 ? 2 : 1));
	e->comm = heap_eligible;
	e->in_heap = N > 1 ? LOOM_MIN(heap_eligible, p->heap_bytes) : 0;
	e->scratch = mul_sat(T, p->openblas ? OPENBLAS_TOUCHED : ONEDNN_SCRATCH);
	e->total = add_sat(add_sat(e->model_states, e->activations), add_sat(e->scratch, e->comm));
	e->address_space = add_sat(e->total - e->in_heap, mul_sat((size_t)(T - 1 + EXTRA_THREADS), STACK_BYTES));
	if (p->openblas)
		e->address_space = add_sat(e->address_space, mul_sat(T, OPENBLAS_BUFFER - OPENBLAS_TOUCHED));
	return LOOM_OK;
}

/* ---- reading the limits ------------------------------------------------------------------------ */

static void path_of(char *out, size_t cap, const char *root, const char *path)
{
	snprintf(out, cap, "%s%s", root && *root ? root : "", path);
}

/* The first line of a file, without its newline; 0 on success. */
static int read_line(const char *path, char *buf, size_t cap)
{
	FILE *f = fopen(path, "r");
	int ok;
	if (!f)
		return -1;
	ok = fgets(buf, (int)cap, f) != NULL;
	fclose(f);
	if (!ok)
		return -1;
	buf[strcspn(buf, "\n")] = '\0';
	return 0;
}

/* A byte count from a file holding one number ("max" and v1's near-2^63 "no limit" are SIZE_MAX). */
static size_t read_bytes(const char *path)
{
	char buf[64];
	unsigned long long v;
	if (read_line(path, buf, sizeof buf) != 0 || sscanf(buf, "%llu", &v) != 1)
		return SIZE_MAX;
	return v >= (1ull << 62) ? SIZE_MAX : (size_t)v;
}

/* "Key:   N kB" from a /proc file, in bytes; SIZE_MAX when absent. */
static size_t read_kb(const char *path, const char *key)
{
	FILE *f = fopen(path, "r");
	char line[256];
	size_t len = strlen(key), v = SIZE_MAX;
	unsigned long long kb;
	if (!f)
		return SIZE_MAX;
	while (fgets(line, sizeof line, f))
		if (strncmp(line, key, len) == 0 && line[len] == ':' && sscanf(line + len + 1, "%llu", &kb) == 1) {
			v = (size_t)kb * 1024;
			break;
		}
	fclose(f);
	return v;
}

/* The soft limit of "Max address space" / "Max data size" in /proc/self/limits; SIZE_MAX: unlimited. */
static size_t read_rlimit(const char *path, const char *name)
{
	FILE *f = fopen(path, "r");
	char line[256], soft[64];
	size_t len = strlen(name), v = SIZE_MAX;
	unsigned long long n;
	if (!f)
		return SIZE_MAX;
	while (fgets(line, sizeof line, f))
		if (strncmp(line, name, len) == 0 && sscanf(line + len, "%63s", soft) == 1) {
			if (sscanf(soft, "%llu", &n) == 1)
				v = (size_t)n;
			break;
		}
	fclose(f);
	return v;
}

/* This process's memory cgroup directory under ROOT/sys/fs/cgroup (v2: "0::/path"; v1: the line naming
 * the memory controller); *v2 says which. -1 when there is none. */
static int cgroup_dir(const char *root, char *dir, size_t cap, int *v2)
{
	char path[600], line[512], v1dir[512] = "", v2dir[512] = "";
	int have1 = 0, have2 = 0;
	FILE *f;
	path_of(path, sizeof path, root, "/proc/self/cgroup");
	if (!(f = fopen(path, "r")))
		return -1;
	while (fgets(line, sizeof line, f)) {
		char *a = strchr(line, ':'), *b = a ? strchr(a + 1, ':') : NULL;
		if (!b)
			continue;
		b[strcspn(b, "\n")] = '\0';
		if (strncmp(line, "0::", 3) == 0) {
			snprintf(v2dir, sizeof v2dir, "%s", b + 1);
			have2 = 1;
		} else {
			*b = '\0';
			for (char *c = strtok(a + 1, ","); c; c = strtok(NULL, ","))
				if (strcmp(c, "memory") == 0) {
					snprintf(v1dir, sizeof v1dir, "%s", b + 1);
					have1 = 1;
				}
		}
	}
	fclose(f);
	if (have1) { /* a v1 memory controller is where the limit is, even beside the unified hierarchy */
		char probe[1100];
		snprintf(probe, sizeof probe, "%s/sys/fs/cgroup/memory%s/memory.limit_in_bytes", root && *root ? root : "",
		         strcmp(v1dir, "/") == 0 ? "" : v1dir);
		FILE *t = fopen(probe, "r");
		if (t) {
			fclose(t);
			snprintf(dir, cap, "%s/sys/fs/cgroup/memory%s", root && *root ? root : "", strcmp(v1dir, "/") == 0 ? "" : v1dir);
			*v2 = 0;
			return 0;
		}
	}
	if (have2) {
		snprintf(dir, cap, "%s/sys/fs/cgroup%s", root && *root ? root : "", strcmp(v2dir, "/") == 0 ? "" : v2dir);
		*v2 = 1;
		return 0;
	}
	return -1;
}

int loom_mem_limits_read(const char *root, loom_mem_limits_t *l)
{
	char path[600], dir[560];
	int v2;
	size_t used;
	struct statvfs vfs;
	memset(l, 0, sizeof *l);
	path_of(path, sizeof path, root, "/proc/self/limits");
	l->as_limit = read_rlimit(path, "Max address space");
	l->data_limit = read_rlimit(path, "Max data size");
	path_of(path, sizeof path, root, "/proc/self/status");
	used = read_kb(path, "VmSize");
	l->as_room = l->as_limit == SIZE_MAX ? SIZE_MAX : used == SIZE_MAX || used > l->as_limit ? 0 : l->as_limit - used;
	used = read_kb(path, "VmData");
	l->data_room = l->data_limit == SIZE_MAX ? SIZE_MAX
	               : used == SIZE_MAX || used > l->data_limit ? 0 : l->data_limit - used;
	l->cg_limit = l->cg_room = SIZE_MAX;
	if (cgroup_dir(root, dir, sizeof dir, &v2) == 0) {
		/* the tightest limit from this cgroup up to the root of the hierarchy */
		size_t base = strlen(root && *root ? root : "") + strlen(v2 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/memory");
		for (;;) {
			size_t lim, use;
			char *slash;
			snprintf(path, sizeof path, "%s/%s", dir, v2 ? "memory.max" : "memory.limit_in_bytes");
			lim = read_bytes(path);
			if (lim != SIZE_MAX) {
				char upath[600];
				snprintf(upath, sizeof upath, "%s/%s", dir, v2 ? "memory.current" : "memory.usage_in_bytes");
				use = read_bytes(upath);
				size_t room = use == SIZE_MAX ? lim : use > lim ? 0 : lim - use;
				if (room < l->cg_room) {
					l->cg_room = room, l->cg_limit = lim;
					snprintf(l->cg_file, sizeof l->cg_file, "%s", path);
				}
			}
			if (strlen(dir) <= base || !(slash = strrchr(dir, '/')) || (size_t)(slash - dir) < base)
				break;
			*slash = '\0';
		}
	}
	path_of(path, sizeof path, root, "/proc/meminfo");
	l->mem_available = read_kb(path, "MemAvailable");
	path_of(path, sizeof path, root, "/dev/shm");
	l->shm_free = statvfs(path, &vfs) == 0 ? (size_t)vfs.f_bavail * vfs.f_frsize : SIZE_MAX;
	return LOOM_OK;
}

long long loom_mem_oom_kills(const char *root)
{
	char dir[560], path[600], line[256];
	int v2;
	long long n = -1, v;
	FILE *f;
	if (cgroup_dir(root, dir, sizeof dir, &v2) != 0)
		return -1;
	snprintf(path, sizeof path, "%s/%s", dir, v2 ? "memory.events" : "memory.oom_control");
	if (!(f = fopen(path, "r")))
		return -1;
	while (fgets(line, sizeof line, f))
		if (sscanf(line, "oom_kill %lld", &v) == 1)
			n = v;
	fclose(f);
	return n;
}

/* ---- the check ----------------------------------------------------------------------------------- */

enum { LIM_AS, LIM_DATA, LIM_CG, LIM_AVAIL, LIM_COUNT };

/* Need and room of limit k for estimate e; 0 when that limit is absent. */
static int limit_of(int k, const loom_mem_plan_t *p, const loom_mem_limits_t *l, const loom_mem_estimate_t *e,
                    size_t *need, size_t *room)
{
	size_t host = mul_sat(e->total, (size_t)LOOM_MAX(p->local_ranks, 1));
	switch (k) {
	case LIM_AS:
		*need = e->address_space, *room = l->as_room;
		return l->as_limit != SIZE_MAX;
	case LIM_DATA:
		*need = e->address_space, *room = l->data_room;
		return l->data_limit != SIZE_MAX;
	case LIM_CG:
		*need = host, *room = l->cg_room;
		return l->cg_limit != SIZE_MAX;
	default:
		*need = host, *room = l->mem_available;
		return l->mem_available != SIZE_MAX;
	}
}

/* The limit that fails worst (the largest need beyond its room), or -1 when everything fits. */
static int worst(const loom_mem_plan_t *p, const loom_mem_limits_t *l, const loom_mem_estimate_t *e)
{
	int w = -1;
	double worst_ratio = 1;
	for (int k = 0; k < LIM_COUNT; k++) {
		size_t need, room;
		if (!limit_of(k, p, l, e, &need, &room) || need <= room)
			continue;
		double r = room ? (double)need / (double)room : 1e300;
		if (w < 0 || r > worst_ratio)
			w = k, worst_ratio = r;
	}
	return w;
}

/* Whether plan q fits l (with the heap's mapping shrunk by `freed` bytes of address space). */
static int fits(const loom_mem_plan_t *q, const loom_mem_limits_t *l0, size_t freed, loom_mem_estimate_t *e)
{
	loom_mem_limits_t l = *l0;
	if (loom_mem_estimate(q, e) != LOOM_OK)
		return 0;
	if (l.as_room != SIZE_MAX)
		l.as_room = add_sat(l.as_room, freed);
	return worst(q, &l, e) < 0;
}

static const char *gib(size_t b, char *buf, size_t cap)
{
	if (b == SIZE_MAX)
		snprintf(buf, cap, "unlimited");
	else if (b >= ((size_t)1 << 30))
		snprintf(buf, cap, "%.1f GiB", (double)b / (double)((size_t)1 << 30));
	else
		snprintf(buf, cap, "%.1f MiB", (double)b / (double)MIB);
	return buf;
}

static const char *const ckpt_name[] = {"none", "blocks", "selective"};

int loom_mem_check(const loom_mem_plan_t *p0, const loom_mem_limits_t *l, loom_mem_check_t *out)
{
	/* The heap holds no more than /dev/shm has room for (shared by the host's ranks): the rest of the
	 * buffers meant for it are private memory, new address space. */
	loom_mem_plan_t bounded = *p0;
	const loom_mem_plan_t *p = &bounded;
	if (l->shm_free != SIZE_MAX)
		bounded.heap_bytes = LOOM_MIN(bounded.heap_bytes, l->shm_free / (size_t)LOOM_MAX(p0->local_ranks, 1));
	loom_mem_estimate_t e, alt;
	size_t need = 0, room = 0;
	char a[32], b[32], c[32], d[32], f[32], g[32], src[1000];
	int w, rc, n = 0, local = LOOM_MAX(p->local_ranks, 1);
	size_t len;
	memset(out, 0, sizeof *out);
	if ((rc = loom_mem_estimate(p, &e)) != LOOM_OK)
		return rc;
	if ((w = worst(p, l, &e)) < 0) {
		out->fits = 1;
		return LOOM_OK;
	}
	limit_of(w, p, l, &e, &need, &room);
	out->need = need, out->room = room, out->address_space = w <= LIM_DATA;
	if (w == LIM_AS)
		snprintf(src, sizeof src, "the address-space limit (RLIMIT_AS: prlimit --as, ulimit -v) of %s, of which %s is "
		         "free", gib(l->as_limit, a, sizeof a), gib(room, b, sizeof b));
	else if (w == LIM_DATA)
		snprintf(src, sizeof src, "the data-size limit (RLIMIT_DATA: prlimit --data, ulimit -d) of %s, of which %s is "
		         "free", gib(l->data_limit, a, sizeof a), gib(room, b, sizeof b));
	else if (w == LIM_CG)
		snprintf(src, sizeof src, "the memory cgroup's limit of %s (%s), of which %s is free",
		         gib(l->cg_limit, a, sizeof a), l->cg_file, gib(room, b, sizeof b));
	else
		snprintf(src, sizeof src, "the memory available on this host (MemAvailable in /proc/meminfo), %s",
		         gib(room, b, sizeof b));
	len = (size_t)snprintf(out->message, sizeof out->message,
	                       "this run needs about %s%s: model states %s (%s), activations %s, BLAS/oneDNN scratch and "
	                       "thread stacks %s, communication buffers %s (%s in the shared heap)%s; that is more "
	                       "than %s.",
	                       gib(need, a, sizeof a), w <= LIM_DATA ? " of new address space" : " more memory",
	                       gib(e.model_states, b, sizeof b), e.formula, gib(e.activations, c, sizeof c),
	                       gib(w <= LIM_DATA ? e.address_space - (e.total - e.in_heap) + e.scratch : e.scratch, d,
	                           sizeof d),
	                       gib(e.comm, f, sizeof f), gib(e.in_heap, g, sizeof g),
	                       w >= LIM_CG && local > 1 ? " per rank, for each of the ranks on this host" : "", src);
	/* What would fit, each estimated the same way. */
	char fit[1024] = "";
	size_t flen = 0;
#define FIT(...)                                                                                         \
	do {                                                                                                 \
		if (flen < sizeof fit)                                                                           \
			flen += (size_t)snprintf(fit + flen, sizeof fit - flen, "%s", n++ ? "; " : "");              \
		if (flen < sizeof fit)                                                                           \
			flen += (size_t)snprintf(fit + flen, sizeof fit - flen, __VA_ARGS__);                        \
	} while (0)
	if (p->dp > 1)
		for (int z = p->zero + 1; z <= 3; z++) {
			loom_mem_plan_t q = *p;
			q.zero = z;
			if (fits(&q, l, 0, &alt)) {
				FIT("--zero %d (model states %s)", z, gib(alt.model_states, a, sizeof a));
				break;
			}
		}
	if (p->act_ckpt == 0)
		for (int m = 2; m >= 1; m--) { /* selective first: it recomputes less */
			loom_mem_plan_t q = *p;
			q.act_ckpt = m;
			if (fits(&q, l, 0, &alt)) {
				FIT("--activation-checkpointing %s (activations %s)", ckpt_name[m], gib(alt.activations, a, sizeof a));
				break;
			}
		}
	for (int k = 2; p->B / k >= 1 && p->B % k == 0; k *= 2) {
		loom_mem_plan_t q = *p;
		q.B = p->B / k, q.accum = p->accum * k;
		if (fits(&q, l, 0, &alt)) {
			FIT("--batch-size %d --grad-accum %d (the same tokens per step; activations %s)", q.B, q.accum,
			    gib(alt.activations, a, sizeof a));
			break;
		}
	}
	if (p->openblas) {
		loom_mem_plan_t q = *p;
		q.openblas = 0;
		if (fits(&q, l, 0, &alt))
			FIT("LOOM_GEMM=onednn (the default: no OpenBLAS buffer of 128 MiB per thread)");
	}
	for (int t = p->threads - 1; t >= 1; t--) {
		loom_mem_plan_t q = *p;
		q.threads = t;
		if (fits(&q, l, 0, &alt)) {
			FIT("--threads %d (scratch and stacks %s)", t, gib(alt.scratch, a, sizeof a));
			break;
		}
	}
	if (w == LIM_AS && p->heap_bytes > 64 * MIB) {
		/* the heap is mapped for every rank of the host in each of them: a smaller one is address space back */
		size_t mb = LOOM_MAX((e.comm + MIB - 1) / MIB + 2, (size_t)16), want = mb * MIB;
		loom_mem_plan_t q = *p;
		if (want < p->heap_bytes) {
			q.heap_bytes = want;
			if (fits(&q, l, mul_sat(p->heap_bytes - want, (size_t)local), &alt))
				FIT("LOOM_SHM_MB=%zu (the shared heap is %zu MiB of address space per rank of the host)", mb,
				    p->heap_bytes / MIB);
		}
	}
#undef FIT
	if (len < sizeof out->message)
		snprintf(out->message + len, sizeof out->message - len, " %s%s%s",
		         n ? "What would fit: " : "No single change of --zero, --activation-checkpointing, --batch-size, "
		                                   "--threads or LOOM_SHM_MB fits; a smaller model or more memory is needed",
		         fit, n ? "." : ".");
	return LOOM_OK;
}
