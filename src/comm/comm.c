/* comm.c: the communicator: joining a job from the environment (or loom_comm_init_opts), the
 * settings every rank must share, sub-groups, argument checking and dispatch of collectives,
 * point-to-point calls, the shared heap API and error messages. It talks to its transport only
 * through the table in c->xp (transport.h): shared memory, or MPI for a job spanning hosts (whose
 * communicators also keep hier.c's same-host and cross-host groups).
 *
 * A job is named by LOOM_JOB_ID (or the launcher's job id): its world communicator is "loom-<id>@w"
 * (the name under which the shared-memory transport offers its segment, which has no name in
 * /dev/shm: transport/shm_rdv.c; a second loom_comm_init in the same process,
 * after destroy, uses "loom-<id>@g2" and so on, so names never collide with a segment still being
 * torn down). The id is sanitized to [A-Za-z0-9._-], so '@' delimits it: every name of job <id>, and
 * no other job's, starts with "loom-<id>@" (what `loom run` cleans up). Sub-communicators get
 * "loom-<id>@w-<split#>.<leader>" where split# counts splits on the
 * parent (the same on every rank) and leader is the group's first rank in the parent, unique per
 * group.
 *
 * Every collective entry point validates its arguments, waits until queued non-blocking collectives
 * have run, takes the next sequence number (the same on every rank, since collectives are called
 * in the same order everywhere; a call that fails its argument check takes one too, so ranks stay in
 * step), records the call's signature (kind, dtype, op, root, count: c->coll_sig, stamped by the
 * transport on every message and checked by the receiver), optionally checks that signature across
 * all ranks before any data moves (LOOM_DEBUG), and hands over to loom_algo_run. Invariants: a communicator whose transport recorded a fatal
 * error (abort) refuses every further call with that error; c->coll_ctx is the running collective's
 * context (sequence number, deadline) while one runs and zero otherwise; loom_cur describes the
 * operation the calling thread is running (for error messages), and is restored on return. */
#include <ctype.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "comm/comm_internal.h"
#include "core/util.h"

_Thread_local loom_opctx_t loom_cur;

static atomic_uint world_generation; /* loom_comm_init calls in this process */

/* ---- errors ---------------------------------------------------------------------------------- */

int loom_comm_fail(loom_comm_t *c, int code, const char *fmt, ...)
{
	char detail[800], msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(detail, sizeof detail, fmt, ap);
	va_end(ap);
	if (!c) {
		loom_seterr(code, "%s", detail);
		return code;
	}
	char who[128];
	snprintf(who, sizeof who, "rank %d", c->rank);
#ifdef LOOM_HAVE_MPI
	if (c->host_of) /* spanning hosts: name this rank's host too */
		snprintf(who, sizeof who, "rank %d (world rank %d on host %s)", c->rank, c->world_of[c->rank],
		         loom__mpi_hostname(c->host_of[c->world_of[c->rank]]));
#endif
	if (loom_cur.c == c && loom_cur.op && loom_cur.seq)
		snprintf(msg, sizeof msg, "%s: %s #%llu: %s", who, loom_cur.op, (unsigned long long)loom_cur.seq, detail);
	else if (loom_cur.c == c && loom_cur.op)
		snprintf(msg, sizeof msg, "%s: %s: %s", who, loom_cur.op, detail);
	else
		snprintf(msg, sizeof msg, "%s: %s", who, detail);
	loom_seterr(code, "%s", msg);
	pthread_mutex_lock(&c->err_lock);
	memcpy(c->errmsg, msg, sizeof msg);
	pthread_mutex_unlock(&c->err_lock);
	if (code != LOOM_EINVAL)
		atomic_store_explicit(&c->failed, 1, memory_order_relaxed);
	return code;
}

const char *loom_comm_errmsg(const loom_comm_t *comm)
{
	return comm ? comm->errmsg : "";
}

int loom__comm_check_usable(loom_comm_t *c, const char *op)
{
	char msg[600];
	int code = c->xp.ops->aborted(c, msg, sizeof msg);
	if (code == 0)
		return LOOM_OK;
	if (!loom_xp_state(c))
		return loom_comm_fail(c, LOOM_ESTATE, "%s: the communicator is not initialized", op);
	return loom_comm_fail(c, code, "the communicator is unusable after an earlier failure: %s", msg);
}

/* ---- joining a job ------------------------------------------------------------------------------ */

/* Integer variable: 0 when unset, 1 when set to an integer, -1 when set to something else. */
static int env_int(const char *name, long *v)
{
	int ok;
	const char *s = getenv(name);
	if (!s || !*s)
		return 0;
	*v = loom_env_long(name, 0, &ok);
	return ok ? 1 : -1;
}

typedef struct {
	const char *launcher;
	const char *rank, *size, *local_rank, *local_size;
} env_family_t;

static const env_family_t families[] = {
	{"loom run / torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
	{"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
	 "OMPI_COMM_WORLD_LOCAL_SIZE"},
	{"srun", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", NULL},
};

/* Rank and size from the first launcher family whose rank variable is set; a job of one otherwise.
 * *fam is the family's index (-1 for a job of one). */
static int job_from_env(int *rank, int *size, int *local_rank, int *fam, int *multi)
{
	long r = 0, n = 1, lr, ln;
	*fam = -1, *multi = 0;
	for (int f = 0; f < (int)LOOM_ARRAY_LEN(families); f++) {
		const env_family_t *e = &families[f];
		int has = env_int(e->rank, &r);
		if (has == 0)
			continue;
		*fam = f;
		if (has < 0)
			return loom_seterr(LOOM_EINVAL, "loom_comm_init: %s=\"%s\" is not an integer (set by %s)", e->rank,
			                   getenv(e->rank), e->launcher);
		if (env_int(e->size, &n) <= 0)
			return loom_seterr(LOOM_EINVAL, "loom_comm_init: %s is set but %s is %s (set by %s)", e->rank, e->size,
			                   getenv(e->size) ? "not an integer" : "missing", e->launcher);
		if (n < 1 || n > 4096)
			return loom_seterr(LOOM_EINVAL, "loom_comm_init: %s=%ld must be between 1 and 4096", e->size, n);
		if (r < 0 || r >= n)
			return loom_seterr(LOOM_EINVAL, "loom_comm_init: %s=%ld must be in [0, %s=%ld)", e->rank, r, e->size, n);
		lr = r, ln = n;
		if (env_int(e->local_rank, &lr) < 0)
			return loom_seterr(LOOM_EINVAL, "loom_comm_init: %s=\"%s\" is not an integer", e->local_rank,
			                   getenv(e->local_rank));
		if (e->local_size && env_int(e->local_size, &ln) < 0)
			return loom_seterr(LOOM_EINVAL, "loom_comm_init: %s=\"%s\" is not an integer", e->local_size,
			                   getenv(e->local_size));
		if (!e->local_size) { /* Slurm: more than one node means more than one machine */
			long nodes = 1;
			if (env_int("SLURM_STEP_NUM_NODES", &nodes) <= 0 && env_int("SLURM_NNODES", &nodes) <= 0)
				nodes = 1;
			if (nodes > 1)
				ln = 0;
		}
#ifdef LOOM_HAVE_MPI
		if (ln != n && f == 0)
			return loom_seterr(LOOM_ENOTSUP,
			                   "loom_comm_init: rank %ld: the job spans more than one machine (%s=%ld, local size %ld): "
			                   "start it with mpirun, srun or `loom run --hostfile` (see docs/multinode.md)",
			                   r, e->size, n, ln);
		if (ln != n && f == 2 && !getenv("PMIX_RANK") && !getenv("PMI_RANK"))
			return loom_seterr(LOOM_ENOTSUP,
			                   "loom_comm_init: rank %ld: the job spans more than one machine (%s=%ld over several "
			                   "nodes) but srun gave no PMI: start it with `srun --mpi=pmix` so MPI can join",
			                   r, e->size, n);
		if (ln != n) { /* several hosts: MPI gives the layout (loom__mpi_layout) */
			*multi = 1;
			break;
		}
#endif
		if (ln != n)
			return loom_seterr(LOOM_ENOTSUP,
			                   "loom_comm_init: rank %ld: the job spans more than one machine (%s=%ld, local size %ld): "
			                   "this loom was built without MPI: install libopenmpi-dev and rebuild it (`make` rebuilds "
			                   "with MPI by itself; see docs/multinode.md)",
			                   r, e->size, n, ln);
		if (lr != r)
			return loom_seterr(LOOM_EINVAL,
			                   "loom_comm_init: %s=%ld but %s=%ld on a single-machine job: they must be equal",
			                   e->local_rank, lr, e->rank, r);
		break;
	}
	*rank = (int)r, *size = (int)n, *local_rank = (int)r;
	return LOOM_OK;
}

/* The job's id for segment names: LOOM_JOB_ID, else the launcher's, sanitized to [A-Za-z0-9._-]. */
static int job_id(int fam, int size, char *out, size_t cap)
{
	const char *id = getenv("LOOM_JOB_ID");
	char tmp[160] = "";
	if (!id || !*id) {
		const char *a = getenv("OMPI_MCA_ess_base_jobid"), *b = getenv("PMIX_NAMESPACE");
		const char *sj = getenv("SLURM_JOB_ID"), *ss = getenv("SLURM_STEP_ID");
		const char *ma = getenv("MASTER_ADDR"), *mp = getenv("MASTER_PORT");
		if (fam == 1 && a && *a)
			snprintf(tmp, sizeof tmp, "ompi%s", a);
		else if (fam == 1 && b && *b)
			snprintf(tmp, sizeof tmp, "pmix%s", b);
		else if (fam == 2 && sj && *sj)
			snprintf(tmp, sizeof tmp, "slurm%s.%s", sj, ss && *ss ? ss : "0");
		else if (ma && *ma && mp && *mp)
			snprintf(tmp, sizeof tmp, "m%s_%s", ma, mp);
		else if (size == 1)
			snprintf(tmp, sizeof tmp, "solo%d", (int)getpid());
		else
			return loom_seterr(LOOM_EINVAL, "loom_comm_init: cannot name the job's shared memory: set LOOM_JOB_ID "
			                                "(the same on every rank), or start the job with loom run, mpirun or srun");
		id = tmp;
	}
	snprintf(out, cap, "%.80s", id);
	for (char *p = out; *p; p++)
		if (!isalnum((unsigned char)*p) && *p != '.' && *p != '_' && *p != '-')
			*p = '_';
	return LOOM_OK;
}

/* Knobs from opts (when set) or the environment. */
static int parse_config(loom_comm_t *c, const loom_comm_opts_t *o)
{
	const char *t = getenv("LOOM_TIMEOUT_S"), *d = getenv("LOOM_DEBUG"), *algo = getenv("LOOM_ALGO");
	const char *seg = getenv("LOOM_RING_SEG");
	long v;
	c->timeout_s = 300;
	if (o->timeout_s < 0 || o->timeout_s > 1e9 || o->timeout_s != o->timeout_s)
		return loom_seterr(LOOM_EINVAL, "loom_comm_init: opts.timeout_s = %g must be a positive number of seconds",
		                   o->timeout_s);
	if (o->timeout_s > 0) {
		c->timeout_s = o->timeout_s;
	} else if (t && *t) {
		char *end;
		double x = strtod(t, &end);
		if (*end || !(x > 0) || x > 1e9)
			return loom_seterr(LOOM_EINVAL, "loom_comm_init: LOOM_TIMEOUT_S=\"%s\" must be a positive number of seconds",
			                   t);
		c->timeout_s = x;
	}
	c->debug = o->debug ? o->debug > 0 : d && *d && strcmp(d, "0") != 0;
	if (o->algo)
		algo = o->algo;
	snprintf(c->algo_spec, sizeof c->algo_spec, "%s", algo ? algo : "");
	for (int i = 0; i < LOOM_COLL_COUNT; i++)
		c->forced[i] = LOOM_ALGO_AUTO;
	if (algo && *algo) {
		char err[512] = "";
		if (loom_algo_parse(algo, c->forced, err, sizeof err) != LOOM_OK)
			return loom_seterr(LOOM_EINVAL, "loom_comm_init: %s=\"%s\": %s", o->algo ? "opts.algo" : "LOOM_ALGO", algo,
			                   err);
	}
	/* Ring segments: LOOM_RING_SEG bytes when >= 64 (smaller or unparsable values: the default). */
	c->ring_seg = 4u << 20;
	if (o->ring_seg_bytes) {
		if (o->ring_seg_bytes < 64)
			return loom_seterr(LOOM_EINVAL, "loom_comm_init: opts.ring_seg_bytes = %zu must be at least 64",
			                   o->ring_seg_bytes);
		c->ring_seg = o->ring_seg_bytes;
	} else if (seg && (v = atol(seg)) >= 64) {
		c->ring_seg = (size_t)v;
	}
	c->inplace_min = o->inplace_min_bytes;
	if (!c->inplace_min && (v = loom_env_long("LOOM_SHM_INPLACE_MIN", 0, NULL)) > 0)
		c->inplace_min = (size_t)v;
	if (!c->inplace_min)
		c->inplace_min = 32u << 10; /* smaller heap sends are copied: an ack round trip costs more */
	return LOOM_OK;
}

loom_comm_t *loom__comm_new(int rank, int size)
{
	loom_comm_t *c = loom__calloc(1, sizeof *c);
	if (!c)
		return NULL;
	c->world_of = loom__calloc((size_t)size, sizeof *c->world_of);
	if (!c->world_of) {
		free(c);
		return NULL;
	}
	c->rank = rank, c->size = size;
	c->xp.ops = &loom__xport_shm; /* the only transport so far */
	c->coll_lane = (loom_lane_t){.c = c, .kind = LANE_COLL, .peer = -1};
	pthread_mutex_init(&c->err_lock, NULL);
	return c;
}

/* Memory peers on this host read in place: a communicator spanning hosts takes it from its
 * host-local (shared-memory) communicator. */
static void *xalloc(loom_comm_t *c, size_t bytes)
{
	if (c->hlocal)
		return c->hlocal->xp.ops->alloc(c->hlocal, bytes);
	return c->xp.ops->alloc(c, bytes);
}

static int xfree(loom_comm_t *c, void *p)
{
	if (c->hlocal && c->hlocal->xp.ops->free(c->hlocal, p))
		return 1;
	return c->xp.ops->free(c, p);
}

void loom__comm_free(loom_comm_t *c)
{
	for (int s = 0; s < 2; s++) {
		if (c->scratch_xp[s])
			xfree(c, c->scratch[s]);
		else
			loom_free_aligned(c->scratch[s]);
	}
	loom__hier_free(c);
	c->xp.ops->close(c);
	pthread_mutex_destroy(&c->err_lock);
	free(c->p2p_lanes);
	free(c->world_of);
	free(c);
}

/* The knobs every rank must agree on: they change which messages flow (or how they are staged),
 * so ranks that differ would deadlock or fail later with a confusing message. One record per rank
 * through the board (<= SHM_BOARD_BYTES). */
typedef struct {
	uint64_t algo, ring_seg, inplace_min, heap_bytes;
	int32_t debug, pad;
} knobs_t;

/* "1, 3" for the ranks whose value of field `off` differs from this rank's. */
static void ranks_differing(const knobs_t *all, int n, size_t off, const knobs_t *mine, char *out, size_t cap)
{
	size_t len = 0;
	out[0] = '\0';
	for (int r = 0; r < n && len + 16 < cap; r++)
		if (memcmp((const char *)&all[r] + off, (const char *)mine + off, 8) != 0)
			len += (size_t)snprintf(out + len, cap - len, "%s%d", len ? ", " : "", r);
}

static int check_config(loom_comm_t *c, const loom_xp_ctx_t *ctx, size_t heap_bytes)
{
	static const struct {
		const char *name;
		size_t off;
	} fields[] = {
		{"LOOM_DEBUG", offsetof(knobs_t, debug)},
		{"LOOM_ALGO", offsetof(knobs_t, algo)},
		{"LOOM_RING_SEG", offsetof(knobs_t, ring_seg)},
		{"LOOM_SHM_INPLACE_MIN", offsetof(knobs_t, inplace_min)},
		{"LOOM_SHM_MB", offsetof(knobs_t, heap_bytes)},
	};
	knobs_t mine = {1469598103934665603ull, c->ring_seg, c->inplace_min, heap_bytes, c->debug, 0}, *all;
	int rc = LOOM_OK;
	for (const char *p = c->algo_spec; *p; p++)
		mine.algo = (mine.algo ^ (unsigned char)*p) * 1099511628211ull;
	all = loom__calloc((size_t)c->size, sizeof *all);
	if (!all)
		return loom_comm_fail(c, LOOM_ENOMEM, "out of memory");
	rc = c->xp.ops->allgather_small(c, ctx, &mine, sizeof mine, all);
	for (size_t f = 0; f < LOOM_ARRAY_LEN(fields) && rc == LOOM_OK; f++) {
		char who[256], val[160];
		size_t off = fields[f].off;
		ranks_differing(all, c->size, off, &mine, who, sizeof who);
		if (!who[0])
			continue;
		if (off == offsetof(knobs_t, algo))
			snprintf(val, sizeof val, "\"%.150s\"", c->algo_spec);
		else if (off == offsetof(knobs_t, debug))
			snprintf(val, sizeof val, "%d", c->debug);
		else
			snprintf(val, sizeof val, "%llu", (unsigned long long)*(const uint64_t *)((const char *)&mine + off));
		rc = loom_comm_fail(c, LOOM_EINVAL,
		                    "%s (or its loom_comm_opts_t field) differs between ranks: %s on rank %d (this rank), "
		                    "something else on rank(s) %s; it must be the same on every rank",
		                    fields[f].name, val, c->rank, who);
	}
	free(all);
	return rc;
}

void loom_comm_opts_default(loom_comm_opts_t *opts)
{
	if (opts)
		memset(opts, 0, sizeof *opts);
}

int loom_comm_init(loom_comm_t **comm)
{
	return loom_comm_init_opts(comm, NULL);
}

int loom_comm_init_opts(loom_comm_t **comm, const loom_comm_opts_t *opts)
{
	int rank = 0, size = 1, local_rank = 0, fam = -1, rc, multi = 0;
	const int *host_of = NULL, *lrank_of = NULL;
	char id[96], name[160];
	long shm_mb;
	int ok;
	unsigned gen;
	size_t heap_bytes;
	loom_comm_t *c;
	loom_xp_ctx_t ctx;
	loom_opctx_t saved = loom_cur;
	loom_comm_opts_t none;
	if (!comm)
		return loom_seterr(LOOM_EINVAL, "loom_comm_init: comm is NULL");
	*comm = NULL;
	loom_comm_opts_default(&none);
	if (!opts)
		opts = &none;
	if ((rc = job_from_env(&rank, &size, &local_rank, &fam, &multi)) != LOOM_OK)
		return rc;
#ifdef LOOM_HAVE_MPI
	if (multi) {
		int nhosts, mrank, msize;
		if ((rc = loom__mpi_layout(&mrank, &msize, &host_of, &lrank_of, &nhosts)) != LOOM_OK)
			return rc;
		if (mrank != rank || msize != size)
			return loom_seterr(LOOM_EINVAL, "loom_comm_init: MPI says rank %d of %d, the environment rank %d of %d",
			                   mrank, msize, rank, size);
		local_rank = lrank_of[rank];
	}
#else
	(void)host_of, (void)lrank_of, (void)multi;
#endif
	if ((rc = job_id(fam, size, id, sizeof id)) != LOOM_OK)
		return rc;
	if (opts->heap_bytes) {
		if (opts->heap_bytes > ((size_t)1 << 42))
			return loom_seterr(LOOM_EINVAL, "loom_comm_init: opts.heap_bytes = %zu is more than 4 TiB",
			                   opts->heap_bytes);
		heap_bytes = opts->heap_bytes;
	} else {
		/* A job of one process shares its heap with nobody: a small one, not 1 GiB of address space. */
		shm_mb = loom_env_long("LOOM_SHM_MB", size == 1 ? LOOM_SOLO_SHM_MB : 1024, &ok);
		if (!ok || shm_mb < 1 || shm_mb > (1l << 22))
			return loom_seterr(LOOM_EINVAL,
			                   "loom_comm_init: LOOM_SHM_MB=\"%s\" must be an integer number of MiB in [1, %ld]",
			                   getenv("LOOM_SHM_MB"), 1l << 22);
		heap_bytes = (size_t)shm_mb << 20;
	}
	gen = atomic_fetch_add(&world_generation, 1) + 1;
	/* '@' ends the job id (it never occurs in one): cleanup of job "a" matches "loom-a@*" only,
	 * never job "ab"'s or "a-b"'s segments. */
	if (gen == 1)
		snprintf(name, sizeof name, "loom-%s@w", id);
	else
		snprintf(name, sizeof name, "loom-%s@g%u", id, gen);
	c = loom__comm_new(rank, size);
	if (!c)
		return loom_seterr(LOOM_ENOMEM, "loom_comm_init: out of memory");
	c->world_gen = gen, c->world_size = size;
	c->local_rank = local_rank;
#ifdef LOOM_HAVE_MPI
	if (multi)
		c->xp.ops = &loom__xport_mpi, c->host_of = host_of, c->lrank_of = lrank_of;
#endif
	for (int r = 0; r < size; r++)
		c->world_of[r] = r;
	snprintf(c->name, sizeof c->name, "%s", name);
	if ((rc = parse_config(c, opts)) != LOOM_OK) {
		loom__comm_free(c);
		return rc;
	}
	ctx = (loom_xp_ctx_t){"init", 0, loom_now() + c->timeout_s};
	loom_cur = (loom_opctx_t){c, "init", 0, ctx.deadline};
	rc = c->xp.ops->open(c, NULL, name, heap_bytes, &ctx);
	if (rc == LOOM_OK)
		rc = check_config(c, &ctx, heap_bytes);
	if (rc == LOOM_OK && c->host_of)
		rc = loom__hier_build(c, NULL, heap_bytes, &ctx);
	loom_cur = saved;
	if (rc != LOOM_OK) {
		char msg[1024];
		snprintf(msg, sizeof msg, "%s", loom_errmsg());
		c->xp.ops->depart(c);
		loom__comm_free(c);
		return loom_seterr(rc, "%s", msg);
	}
	*comm = c;
	return LOOM_OK;
}

/* Destroy's last look (the transport's enter with coll -2, on c and on its host-local group): a
 * message of this rank's last calls that a peer went past, or one of a peer's that this rank never
 * received, is a mismatch nothing else would report. Once the communicator is aborted there is
 * nothing to settle: a mismatch is returned only when none of this rank's calls reported a failure
 * (a peer found it after this rank's last call); so is one found here. */
static int settle_final(loom_comm_t *c)
{
	loom_comm_t *parts[2] = {c, c->hlocal};
	loom_opctx_t saved = loom_cur;
	int rc = LOOM_OK, reported = atomic_load_explicit(&c->failed, memory_order_relaxed);
	for (int i = 0; i < 2 && rc == LOOM_OK; i++) {
		loom_comm_t *x = parts[i];
		loom_xp_ctx_t ctx;
		char msg[600];
		int code;
		if (!x || !loom_xp_state(x))
			break;
		ctx = (loom_xp_ctx_t){"destroy", x->coll_seq + 1, loom_now() + x->timeout_s};
		loom_cur = (loom_opctx_t){x, "destroy", 0, ctx.deadline};
		if ((code = x->xp.ops->aborted(x, msg, sizeof msg)) == 0) {
			rc = x->xp.ops->enter(x, &ctx, -2);
			if (reported) /* this rank already failed a call (a peer's abort may not be visible yet) */
				rc = LOOM_OK;
			continue;
		}
		if (i == 0 && code == LOOM_EMISMATCH && !atomic_load_explicit(&c->failed, memory_order_relaxed))
			rc = loom_comm_fail(c, code, "the communicator was aborted after this rank's last call: %s", msg);
		break;
	}
	loom_cur = saved;
	return rc;
}

int loom_comm_destroy(loom_comm_t *comm)
{
	int rc;
	if (!comm)
		return LOOM_OK;
	loom__comm_req_shutdown(comm);
	rc = settle_final(comm);
	comm->xp.ops->depart(comm);
	loom__comm_free(comm);
	return rc;
}

int loom_comm_rank(const loom_comm_t *comm)
{
	return comm ? comm->rank : -1;
}

int loom_comm_size(const loom_comm_t *comm)
{
	return comm ? comm->size : 0;
}

int loom_comm_local_rank(const loom_comm_t *comm)
{
	return comm ? comm->local_rank : -1;
}

int loom_comm_host(const loom_comm_t *comm, int member)
{
	if (!comm || member < 0 || member >= comm->size)
		return -1;
	return comm->host_of ? comm->host_of[comm->world_of[member]] : 0;
}

/* ---- split -------------------------------------------------------------------------------- */

int loom_comm_split(loom_comm_t *c, int color, int key, loom_comm_t **out)
{
	int32_t mine[2] = {color, key}, (*all)[2] = NULL;
	int *members = NULL, m = 0, me = -1, rc;
	loom_comm_t *sub = NULL;
	loom_opctx_t saved = loom_cur;
	loom_xp_ctx_t ctx;
	char name[sizeof c->name];
	uint64_t split_no;
	if (!c || !out)
		return loom_seterr(LOOM_EINVAL, "loom_comm_split: %s is NULL", c ? "out" : "comm");
	*out = NULL;
	if (color < 0 && color != LOOM_UNDEFINED)
		return loom_comm_fail(c, LOOM_EINVAL, "split: color %d must be >= 0 or LOOM_UNDEFINED", color);
	loom__comm_req_drain(c);
	ctx = (loom_xp_ctx_t){"split", ++c->coll_seq, loom_now() + c->timeout_s};
	loom_cur = (loom_opctx_t){c, ctx.op, ctx.seq, ctx.deadline};
	split_no = ++c->split_count;
	if ((rc = c->xp.ops->enter(c, &ctx, -1)) != LOOM_OK || (rc = loom__comm_check_usable(c, "split")) != LOOM_OK)
		goto done;
	all = loom__calloc((size_t)c->size, sizeof *all);
	members = loom__calloc((size_t)c->size, sizeof *members);
	if (!all || !members) {
		rc = loom_comm_fail(c, LOOM_ENOMEM, "out of memory");
		goto done;
	}
	if ((rc = c->xp.ops->allgather_small(c, &ctx, mine, sizeof mine, all)) != LOOM_OK || color == LOOM_UNDEFINED)
		goto done;
	/* Members in (key, parent rank) order: insertion by key, stable in parent rank. */
	for (int r = 0; r < c->size; r++) {
		int i;
		if (all[r][0] != color)
			continue;
		for (i = m; i > 0 && all[members[i - 1]][1] > all[r][1]; i--)
			members[i] = members[i - 1];
		members[i] = r;
		m++;
	}
	for (int i = 0; i < m; i++)
		if (members[i] == c->rank)
			me = i;
	if (strlen(c->name) + 32 >= sizeof name) {
		rc = loom_comm_fail(c, LOOM_ENOTSUP, "sub-communicators nested too deeply (segment name %s)", c->name);
		goto done;
	}
	/* (checked to fit above; the length given as a precision so that gcc's -O0 truncation warning
	 * sees the bound) */
	snprintf(name, sizeof name, "%.*s-%llu.%d", (int)(sizeof name - 32), c->name, (unsigned long long)split_no,
	         members[0]);
	sub = loom__comm_new(me, m);
	if (!sub) {
		rc = loom_comm_fail(c, LOOM_ENOMEM, "out of memory");
		goto done;
	}
	sub->local_rank = me;
	for (int i = 0; i < m; i++)
		sub->world_of[i] = c->world_of[members[i]];
	snprintf(sub->name, sizeof sub->name, "%s", name);
	sub->timeout_s = c->timeout_s, sub->debug = c->debug;
	sub->world_gen = c->world_gen, sub->world_size = c->world_size;
	sub->ring_seg = c->ring_seg, sub->inplace_min = c->inplace_min;
	memcpy(sub->forced, c->forced, sizeof c->forced);
	memcpy(sub->algo_spec, c->algo_spec, sizeof c->algo_spec);
	loom_cur.c = sub;
	if (c->host_of)
		rc = loom__hier_open_sub(c, sub, name, &ctx);
	else
		rc = c->xp.ops->open(sub, c, name, 0, &ctx);
	loom_cur.c = c;
	if (rc != LOOM_OK) {
		pthread_mutex_lock(&c->err_lock);
		snprintf(c->errmsg, sizeof c->errmsg, "%s", loom_errmsg());
		pthread_mutex_unlock(&c->err_lock);
		loom__comm_free(sub);
		sub = NULL;
		goto done;
	}
	*out = sub;
done:
	loom_cur = saved;
	free(all);
	free(members);
	return rc;
}

/* ---- collectives ------------------------------------------------------------------------------ */

static int uses_root(loom_coll_t k)
{
	return k == LOOM_COLL_REDUCE || k == LOOM_COLL_BROADCAST;
}

static int uses_op(loom_coll_t k)
{
	return k == LOOM_COLL_ALLREDUCE || k == LOOM_COLL_REDUCE || k == LOOM_COLL_REDUCE_SCATTER ||
	       k == LOOM_COLL_REDUCE_SCATTERV;
}

/* Send and receive buffers may be the same (in place) or one may sit exactly at this rank's block
 * of the other (`block`, bytes from the larger buffer's start; the layouts of algo.h); any other
 * overlap is LOOM_EINVAL: the algorithms would read data they already overwrote. */
static int check_overlap(loom_comm_t *c, const char *name, const void *send, size_t sbytes, const void *recv,
                         size_t rbytes, size_t block)
{
	uintptr_t s = (uintptr_t)send, r = (uintptr_t)recv;
	if (!sbytes || !rbytes || !send || !recv || s == r)
		return LOOM_OK;
	if ((sbytes < rbytes && s == r + block) || (rbytes < sbytes && r == s + block))
		return LOOM_OK;
	if (s < r + rbytes && r < s + sbytes)
		return loom_comm_fail(c, LOOM_EINVAL,
		                      "%s: send buffer [%p, +%zu bytes) and recv buffer [%p, +%zu bytes) overlap; in place "
		                      "means send == recv (or, where the operation allows it, one at this rank's block "
		                      "of the other, %zu bytes in)",
		                      name, send, sbytes, recv, rbytes, block);
	return LOOM_OK;
}

/* The v-collectives: counts non-NULL, their sum fits, this rank's count agrees; sets a->total. */
static int validate_v(loom_comm_t *c, loom_coll_args_t *a, size_t es)
{
	const char *name = loom_coll_name(a->coll);
	size_t total = 0;
	if (!a->counts)
		return loom_comm_fail(c, LOOM_EINVAL, "%s: recvcounts is NULL", name);
	for (int q = 0; q < c->size; q++) {
		if (a->counts[q] > SIZE_MAX / es - total)
			return loom_comm_fail(c, LOOM_EINVAL, "%s: the sum of recvcounts overflows the address space", name);
		total += a->counts[q];
	}
	a->total = total;
	if (a->coll == LOOM_COLL_ALLGATHERV && a->count != a->counts[c->rank])
		return loom_comm_fail(c, LOOM_EINVAL, "%s: sendcount %zu differs from recvcounts[%d] = %zu", name, a->count,
		                      c->rank, a->counts[c->rank]);
	a->count = a->counts[c->rank];
	if (a->coll == LOOM_COLL_ALLGATHERV ? (a->count && !a->send) || (total && !a->recv)
	                                     : (total && !a->send) || (a->count && !a->recv))
		return loom_comm_fail(c, LOOM_EINVAL, "%s: %s is NULL with %zu elements in all and %zu on this rank", name,
		                      !a->send ? "send" : "recv", total, a->count);
	size_t displ = 0;
	for (int q = 0; q < c->rank; q++)
		displ += a->counts[q];
	if (a->coll == LOOM_COLL_ALLGATHERV)
		return check_overlap(c, name, a->send, a->count * es, a->recv, total * es, displ * es);
	return check_overlap(c, name, a->send, total * es, a->recv, a->count * es, displ * es);
}

int loom__comm_validate(loom_comm_t *c, loom_coll_args_t *a)
{
	const char *name = loom_coll_name(a->coll);
	size_t es = loom_dtype_size(a->dt), mult = 1;
	int is_root = a->root == c->rank;
	if (a->coll == LOOM_COLL_BARRIER)
		return LOOM_OK;
	if (es == 0)
		return loom_comm_fail(c, LOOM_EINVAL, "%s: invalid dtype %d (expected 0..%d)", name, (int)a->dt,
		                      LOOM_DTYPE_COUNT - 1);
	if (uses_op(a->coll)) {
		if ((unsigned)a->op >= LOOM_OP_COUNT)
			return loom_comm_fail(c, LOOM_EINVAL, "%s: invalid op %d (expected 0..%d)", name, (int)a->op,
			                      LOOM_OP_COUNT - 1);
		if (a->op == LOOM_AVG && (a->dt == LOOM_INT32 || a->dt == LOOM_INT64))
			return loom_comm_fail(c, LOOM_EINVAL, "%s: LOOM_AVG is not defined for integer dtype %s", name,
			                      loom_dtype_name(a->dt));
	}
	if (a->coll == LOOM_COLL_ALLGATHERV || a->coll == LOOM_COLL_REDUCE_SCATTERV)
		return validate_v(c, a, es);
	if (uses_root(a->coll) && (a->root < 0 || a->root >= c->size))
		return loom_comm_fail(c, LOOM_EINVAL, "%s: root %d out of range (size %d)", name, a->root, c->size);
	if (a->coll == LOOM_COLL_ALLGATHER || a->coll == LOOM_COLL_REDUCE_SCATTER)
		mult = (size_t)c->size;
	if (a->count > SIZE_MAX / es / mult)
		return loom_comm_fail(c, LOOM_EINVAL, "%s: count %zu of %s overflows the address space", name, a->count,
		                      loom_dtype_name(a->dt));
	if (a->count == 0)
		return LOOM_OK;
	switch (a->coll) {
	case LOOM_COLL_BROADCAST:
		if (!a->recv)
			return loom_comm_fail(c, LOOM_EINVAL, "%s: buf is NULL with count %zu", name, a->count);
		break;
	case LOOM_COLL_REDUCE:
		if (!a->send || (is_root && !a->recv))
			return loom_comm_fail(c, LOOM_EINVAL, "%s: %s is NULL with count %zu", name, a->send ? "recv" : "send",
			                      a->count);
		break;
	default:
		if (!a->send || !a->recv)
			return loom_comm_fail(c, LOOM_EINVAL, "%s: %s is NULL with count %zu", name, a->send ? "recv" : "send",
			                      a->count);
	}
	switch (a->coll) {
	case LOOM_COLL_ALLREDUCE:
		return check_overlap(c, name, a->send, a->count * es, a->recv, a->count * es, 0);
	case LOOM_COLL_REDUCE:
		return is_root ? check_overlap(c, name, a->send, a->count * es, a->recv, a->count * es, 0) : LOOM_OK;
	case LOOM_COLL_ALLGATHER:
		return check_overlap(c, name, a->send, a->count * es, a->recv, a->count * es * mult,
		                     a->count * es * (size_t)c->rank);
	case LOOM_COLL_REDUCE_SCATTER:
		return check_overlap(c, name, a->send, a->count * es * mult, a->recv, a->count * es,
		                     a->count * es * (size_t)c->rank);
	default:
		return LOOM_OK;
	}
}

typedef struct {
	uint64_t seq, count;
	int32_t coll, dt, op, root;
} fingerprint_t;

static void describe(char *out, size_t cap, const fingerprint_t *f)
{
	if (f->coll == LOOM_COLL_ALLGATHERV || f->coll == LOOM_COLL_REDUCE_SCATTERV) {
		snprintf(out, cap, "%s #%llu (recvcounts digest %016llx, %s, op %s)", loom_coll_name((loom_coll_t)f->coll),
		         (unsigned long long)f->seq, (unsigned long long)f->count, loom_dtype_name((loom_dtype_t)f->dt),
		         f->op < 0 ? "-" : loom_op_name((loom_op_t)f->op));
		return;
	}
	snprintf(out, cap, "%s #%llu (count %llu, %s, op %s, root %d)", loom_coll_name((loom_coll_t)f->coll),
	         (unsigned long long)f->seq, (unsigned long long)f->count, loom_dtype_name((loom_dtype_t)f->dt),
	         f->op < 0 ? "-" : loom_op_name((loom_op_t)f->op), f->root);
}

/* LOOM_DEBUG: every rank compares every rank's call with its own. Not fatal for the communicator:
 * no message has moved, and every rank fails this call alike. */
static int check_fingerprint(loom_comm_t *c, const loom_coll_args_t *a, const loom_xp_ctx_t *ctx)
{
	fingerprint_t mine = {ctx->seq, a->count, (int32_t)a->coll, (int32_t)a->dt, (int32_t)a->op, (int32_t)a->root}, *all;
	int rc;
	if (!uses_op(a->coll))
		mine.op = -1;
	if (!uses_root(a->coll))
		mine.root = -1;
	if (a->coll == LOOM_COLL_BARRIER)
		mine.count = 0, mine.dt = 0;
	if (a->counts) { /* ranks' own counts differ; the whole list must not */
		mine.count = 1469598103934665603ull;
		for (int q = 0; q < c->size; q++)
			mine.count = (mine.count ^ a->counts[q]) * 1099511628211ull;
	}
	all = loom__calloc((size_t)c->size, sizeof *all);
	if (!all)
		return loom_comm_fail(c, LOOM_ENOMEM, "out of memory");
	rc = c->xp.ops->allgather_small(c, ctx, &mine, sizeof mine, all);
	for (int r = 0; r < c->size && rc == LOOM_OK; r++) {
		if (memcmp(&all[r], &mine, sizeof mine) != 0) {
			char x[160], y[160];
			describe(x, sizeof x, &mine);
			describe(y, sizeof y, &all[r]);
			rc = loom_comm_fail(c, LOOM_EMISMATCH, "mismatched collective calls (LOOM_DEBUG): this rank called %s, "
			                                       "rank %d called %s",
			                    x, r, y);
		}
	}
	free(all);
	return rc;
}

/* The call's signature (transport.h): what every rank's call must agree on. */
static loom_xp_sig_t sig_of(const loom_comm_t *c, const loom_coll_args_t *a)
{
	loom_xp_sig_t s = {a->count, 0, uses_root(a->coll) ? a->root : -1};
	unsigned dt = (unsigned)a->dt, op = uses_op(a->coll) ? (unsigned)a->op + 1 : 0;
	if (a->coll == LOOM_COLL_BARRIER)
		s.count = 0, dt = 0;
	if (a->counts) { /* ranks' own counts differ; the whole list must not */
		s.count = 1469598103934665603ull;
		for (int q = 0; q < c->size; q++)
			s.count = (s.count ^ a->counts[q]) * 1099511628211ull;
	}
	s.shape = (int32_t)(((unsigned)a->coll + 1) | (dt & 0xff) << 8 | (op & 0xff) << 16);
	return s;
}

void loom_xp_sig_describe(char *out, size_t cap, uint64_t seq, const loom_xp_sig_t *sig)
{
	int kind = (sig->shape & 0xff) - 1, dt = (sig->shape >> 8) & 0xff, op = ((sig->shape >> 16) & 0xff) - 1;
	if (sig->shape == 0 || kind >= LOOM_COLL_COUNT) {
		snprintf(out, cap, "#%llu (no collective signature)", (unsigned long long)seq);
		return;
	}
	if (kind == LOOM_COLL_ALLGATHERV || kind == LOOM_COLL_REDUCE_SCATTERV) {
		snprintf(out, cap, "%s #%llu (recvcounts digest %016llx, %s, op %s)", loom_coll_name((loom_coll_t)kind),
		         (unsigned long long)seq, (unsigned long long)sig->count, loom_dtype_name((loom_dtype_t)dt),
		         op < 0 ? "-" : loom_op_name((loom_op_t)op));
		return;
	}
	snprintf(out, cap, "%s #%llu (count %llu, %s, op %s, root %d)", loom_coll_name((loom_coll_t)kind),
	         (unsigned long long)seq, (unsigned long long)sig->count, loom_dtype_name((loom_dtype_t)dt),
	         op < 0 ? "-" : loom_op_name((loom_op_t)op), (int)sig->root);
}

loom_xp_sig_t loom_xp_coll_sig(const loom_comm_t *c, const loom_xp_ctx_t *ctx)
{
	if (ctx == &c->coll_ctx)
		return c->coll_sig;
	return (loom_xp_sig_t){0, 0, 0};
}

double loom_xp_stall_s(void)
{
	static _Atomic double cached = -1;
	double v = atomic_load_explicit(&cached, memory_order_relaxed);
	if (v < 0) {
		const char *e = getenv("LOOM_STALL_S");
		char *end;
		v = 60;
		if (e && *e) {
			double x = strtod(e, &end);
			if (!*end && x >= 0 && x <= 1e9)
				v = x;
		}
		atomic_store_explicit(&cached, v, memory_order_relaxed);
	}
	return v;
}

void loom_xp_report_suspect(int reporter, int suspect, const char *why)
{
	static atomic_int fd_cached = -2;
	int fd = atomic_load_explicit(&fd_cached, memory_order_relaxed);
	char line[600];
	int n;
	if (fd == -2) { /* "FD:INODE": only the pipe loom run made, never a file that took its number */
		const char *e = getenv("LOOM_RUN_REPORT_FD");
		unsigned long long ino = 0;
		struct stat st;
		fd = -1;
		if (!(e && sscanf(e, "%d:%llu", &fd, &ino) == 2 && fd >= 3 && fstat(fd, &st) == 0 && S_ISFIFO(st.st_mode) &&
		      (unsigned long long)st.st_ino == ino))
			fd = -1;
		atomic_store_explicit(&fd_cached, fd, memory_order_relaxed);
	}
	if (fd < 0)
		return;
	/* One write of less than PIPE_BUF bytes: lines of different ranks never interleave. */
	n = snprintf(line, sizeof line, "suspect %d by %d: %.500s\n", suspect, reporter, why);
	for (char *p = line; p < line + n - 1; p++)
		if (*p == '\n')
			*p = ' ';
	if (write(fd, line, (size_t)LOOM_MIN(n, (int)sizeof line - 1)) < 0) { /* the launcher is gone: nothing to tell */
	}
}

int loom__comm_exec(loom_comm_t *c, const loom_coll_args_t *a, uint64_t seq)
{
	loom_opctx_t saved = loom_cur;
	int rc;
	double t0 = loom_now();
	/* The context travels explicitly to the transport (c->coll_ctx for the algorithm's calls);
	 * loom_cur only prefixes error messages. */
	c->coll_ctx = (loom_xp_ctx_t){loom_coll_name(a->coll), seq, t0 + c->timeout_s};
	c->coll_sig = sig_of(c, a);
	loom_cur = (loom_opctx_t){c, c->coll_ctx.op, seq, c->coll_ctx.deadline};
	rc = loom__comm_check_usable(c, loom_cur.op);
	if (rc == LOOM_OK && c->debug) /* before enter: a call that fails here never happened */
		rc = check_fingerprint(c, a, &c->coll_ctx);
	if (rc == LOOM_OK)
		rc = c->xp.ops->enter(c, &c->coll_ctx, (int)a->coll);
	if (rc == LOOM_OK && loom__hier_handles(c, a->coll))
		rc = loom__hier_run(c, a);
	else if (rc == LOOM_OK)
		rc = loom_algo_run(c, a, c->forced[a->coll]);
	if (rc == LOOM_OK) {
		atomic_fetch_add_explicit(&c->st_colls, 1, memory_order_relaxed);
		atomic_fetch_add_explicit(&c->st_bytes, a->coll == LOOM_COLL_BARRIER ? 0 : a->count * loom_dtype_size(a->dt),
		                          memory_order_relaxed);
	}
	atomic_fetch_add_explicit(&c->st_ns, (unsigned long long)((loom_now() - t0) * 1e9), memory_order_relaxed);
	memset(&c->coll_ctx, 0, sizeof c->coll_ctx);
	memset(&c->coll_sig, 0, sizeof c->coll_sig);
	loom_cur = saved;
	return rc;
}

void loom_comm_stats(const loom_comm_t *c, loom_comm_stats_t *st)
{
	loom_comm_t *m = (loom_comm_t *)c; /* atomics are read-only here; C11 loads take non-const */
	if (!st)
		return;
	memset(st, 0, sizeof *st);
	if (!c)
		return;
	st->collectives = atomic_load_explicit(&m->st_colls, memory_order_relaxed);
	st->bytes = atomic_load_explicit(&m->st_bytes, memory_order_relaxed);
	st->busy_s = 1e-9 * (double)atomic_load_explicit(&m->st_ns, memory_order_relaxed);
}

void loom__comm_skip_seq(loom_comm_t *c)
{
	c->coll_seq++;
}

static int coll(loom_comm_t *c, loom_coll_args_t a)
{
	int rc;
	if (!c)
		return loom_seterr(LOOM_EINVAL, "%s: communicator is NULL", loom_coll_name(a.coll));
	if ((rc = loom__comm_validate(c, &a)) != LOOM_OK) {
		loom__comm_skip_seq(c);
		return rc;
	}
	loom__comm_req_drain(c);
	return loom__comm_exec(c, &a, ++c->coll_seq);
}

int loom_allreduce(loom_comm_t *c, const void *send, void *recv, size_t count, loom_dtype_t dt, loom_op_t op)
{
	return coll(c, (loom_coll_args_t){LOOM_COLL_ALLREDUCE, send, recv, count, dt, op, 0, NULL, 0});
}

int loom_reduce(loom_comm_t *c, const void *send, void *recv, size_t count, loom_dtype_t dt, loom_op_t op, int root)
{
	return coll(c, (loom_coll_args_t){LOOM_COLL_REDUCE, send, recv, count, dt, op, root, NULL, 0});
}

int loom_broadcast(loom_comm_t *c, void *buf, size_t count, loom_dtype_t dt, int root)
{
	return coll(c, (loom_coll_args_t){LOOM_COLL_BROADCAST, buf, buf, count, dt, LOOM_SUM, root, NULL, 0});
}

int loom_allgather(loom_comm_t *c, const void *send, void *recv, size_t count_per_rank, loom_dtype_t dt)
{
	return coll(c, (loom_coll_args_t){LOOM_COLL_ALLGATHER, send, recv, count_per_rank, dt, LOOM_SUM, 0, NULL, 0});
}

int loom_reduce_scatter(loom_comm_t *c, const void *send, void *recv, size_t count_per_rank, loom_dtype_t dt,
                        loom_op_t op)
{
	return coll(c, (loom_coll_args_t){LOOM_COLL_REDUCE_SCATTER, send, recv, count_per_rank, dt, op, 0, NULL, 0});
}

int loom_barrier(loom_comm_t *c)
{
	return coll(c, (loom_coll_args_t){LOOM_COLL_BARRIER, NULL, NULL, 0, LOOM_FLOAT32, LOOM_SUM, 0, NULL, 0});
}

int loom_allgatherv(loom_comm_t *c, const void *send, size_t sendcount, void *recv, const size_t *recvcounts,
                    loom_dtype_t dt)
{
	return coll(c, (loom_coll_args_t){LOOM_COLL_ALLGATHERV, send, recv, sendcount, dt, LOOM_SUM, 0, recvcounts, 0});
}

int loom_reduce_scatterv(loom_comm_t *c, const void *send, void *recv, const size_t *recvcounts, loom_dtype_t dt,
                         loom_op_t op)
{
	return coll(c, (loom_coll_args_t){LOOM_COLL_REDUCE_SCATTERV, send, recv, 0, dt, op, 0, recvcounts, 0});
}

/* ---- point to point ----------------------------------------------------------------------------- */

int loom__comm_p2p_check(loom_comm_t *c, const char *op, const void *buf, size_t count, loom_dtype_t dt, int peer)
{
	size_t es = loom_dtype_size(dt);
	if (es == 0)
		return loom_comm_fail(c, LOOM_EINVAL, "%s: invalid dtype %d", op, (int)dt);
	if (peer < 0 || peer >= c->size || peer == c->rank)
		return loom_comm_fail(c, LOOM_EINVAL, "%s: peer %d must be another rank in [0, %d)", op, peer, c->size);
	if (count > SIZE_MAX / es)
		return loom_comm_fail(c, LOOM_EINVAL, "%s: count %zu overflows the address space", op, count);
	if (count && !buf)
		return loom_comm_fail(c, LOOM_EINVAL, "%s: buffer is NULL with count %zu", op, count);
	return LOOM_OK;
}

int loom__comm_p2p_exec(loom_comm_t *c, const char *op, int dst, const void *sbuf, size_t sbytes, int src,
                        void *rbuf, size_t rbytes, int tag)
{
	loom_opctx_t saved = loom_cur;
	loom_xp_ctx_t ctx = {op, 0, loom_now() + c->timeout_s};
	int rc;
	loom_cur = (loom_opctx_t){c, op, 0, ctx.deadline};
	if ((rc = loom__comm_check_usable(c, op)) == LOOM_OK)
		rc = c->xp.ops->sendrecv(c, &ctx, LOOM_XP_P2P, dst, sbuf, sbytes, tag, src, rbuf, rbytes, tag, NULL,
		                         LOOM_FLOAT32, LOOM_SUM);
	loom_cur = saved;
	return rc;
}

/* Blocking point to point: earlier isend/irecv on the same channel run first. */
static int p2p(loom_comm_t *c, int send, void *buf, size_t count, loom_dtype_t dt, int peer, int tag)
{
	const char *op = send ? "send" : "recv";
	int rc;
	if (!c)
		return loom_seterr(LOOM_EINVAL, "loom_%s: communicator is NULL", op);
	if ((rc = loom__comm_p2p_check(c, op, buf, count, dt, peer)) != LOOM_OK)
		return rc;
	loom__comm_lane_drain(c, loom__comm_p2p_lane(c, send, peer));
	if (send)
		return loom__comm_p2p_exec(c, op, peer, buf, count * loom_dtype_size(dt), -1, NULL, 0, tag);
	return loom__comm_p2p_exec(c, op, -1, NULL, 0, peer, buf, count * loom_dtype_size(dt), tag);
}

int loom_send(loom_comm_t *c, const void *buf, size_t count, loom_dtype_t dt, int peer, int tag)
{
	return p2p(c, 1, (void *)buf, count, dt, peer, tag);
}

int loom_recv(loom_comm_t *c, void *buf, size_t count, loom_dtype_t dt, int peer, int tag)
{
	return p2p(c, 0, buf, count, dt, peer, tag);
}

int loom_sendrecv(loom_comm_t *c, const void *sendbuf, size_t sendcount, int dst, void *recvbuf, size_t recvcount,
                  int src, loom_dtype_t dt, int tag)
{
	size_t es = loom_dtype_size(dt);
	int rc;
	if (!c)
		return loom_seterr(LOOM_EINVAL, "loom_sendrecv: communicator is NULL");
	if (dst == c->rank && src == c->rank && es) { /* with itself: a copy */
		if (sendcount != recvcount)
			return loom_comm_fail(c, LOOM_EMISMATCH, "sendrecv: message to itself has %zu elements, expected %zu",
			                      sendcount, recvcount);
		if (sendcount > SIZE_MAX / es || (sendcount && (!sendbuf || !recvbuf)))
			return loom_comm_fail(c, LOOM_EINVAL, "sendrecv: bad buffer or count %zu", sendcount);
		if (sendcount && sendbuf != recvbuf)
			memmove(recvbuf, sendbuf, sendcount * es);
		return LOOM_OK;
	}
	if ((rc = loom__comm_p2p_check(c, "sendrecv", sendbuf, sendcount, dt, dst)) != LOOM_OK ||
	    (rc = loom__comm_p2p_check(c, "sendrecv", recvbuf, recvcount, dt, src)) != LOOM_OK)
		return rc;
	loom__comm_lane_drain(c, loom__comm_p2p_lane(c, 1, dst));
	loom__comm_lane_drain(c, loom__comm_p2p_lane(c, 0, src));
	return loom__comm_p2p_exec(c, "sendrecv", dst, sendbuf, sendcount * es, src, recvbuf, recvcount * es, tag);
}

/* ---- transport entry points for algorithms ------------------------------------------------------ */

int loom_xp_sendrecv(loom_comm_t *c, int dst, const void *sbuf, size_t sbytes, int src, void *rbuf, size_t rbytes,
                     const void *red_local, loom_dtype_t dt, loom_op_t op)
{
	return c->xp.ops->sendrecv(c, &c->coll_ctx, LOOM_XP_COLL, dst, sbuf, sbytes, 0, src, rbuf, rbytes, 0, red_local, dt,
	                           op);
}

int loom_xp_send(loom_comm_t *c, int dst, const void *buf, size_t bytes)
{
	return c->xp.ops->sendrecv(c, &c->coll_ctx, LOOM_XP_COLL, dst, buf, bytes, 0, -1, NULL, 0, 0, NULL, LOOM_FLOAT32,
	                           LOOM_SUM);
}

int loom_xp_recv(loom_comm_t *c, int src, void *buf, size_t bytes)
{
	return c->xp.ops->sendrecv(c, &c->coll_ctx, LOOM_XP_COLL, -1, NULL, 0, 0, src, buf, bytes, 0, NULL, LOOM_FLOAT32,
	                           LOOM_SUM);
}

size_t loom_comm_ring_seg(const loom_comm_t *c)
{
	return c->ring_seg;
}

int loom_xp_world_rank(const loom_comm_t *c, int r)
{
	return c->world_of[r];
}

double loom_xp_timeout(const loom_comm_t *c)
{
	return c->timeout_s;
}

size_t loom_xp_inplace_min(const loom_comm_t *c)
{
	return c->inplace_min;
}

void *loom_comm_scratch(loom_comm_t *c, int slot, size_t bytes)
{
	size_t want, old;
	if (!c || slot < 0 || slot > 1)
		return NULL;
	if (c->scratch[slot] && c->scratch_bytes[slot] >= bytes)
		return c->scratch[slot];
	old = c->scratch_bytes[slot];
	if (c->scratch_xp[slot])
		xfree(c, c->scratch[slot]);
	else
		loom_free_aligned(c->scratch[slot]);
	c->scratch[slot] = NULL, c->scratch_bytes[slot] = 0;
	want = LOOM_MAX(bytes, (size_t)64 << 10);
	if (old && old < SIZE_MAX / 2 && want < old * 2)
		want = old * 2; /* grow geometrically */
	c->scratch[slot] = xalloc(c, want);
	c->scratch_xp[slot] = c->scratch[slot] != NULL;
	if (!c->scratch[slot])
		c->scratch[slot] = loom_alloc_aligned(want);
	if (c->scratch[slot])
		c->scratch_bytes[slot] = want;
	return c->scratch[slot];
}

/* ---- shared heap ------------------------------------------------------------------------------- */

void *loom_comm_alloc(loom_comm_t *c, size_t bytes)
{
	if (!c) {
		loom_seterr(LOOM_EINVAL, "loom_comm_alloc: communicator is NULL");
		return NULL;
	}
	return c->xp.ops->alloc(c, bytes);
}

void loom_comm_free(loom_comm_t *c, void *p)
{
	if (c && p)
		c->xp.ops->free(c, p); /* a pointer not from loom_comm_alloc is ignored */
}
