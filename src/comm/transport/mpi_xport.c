/* mpi_xport.c: the MPI transport (loom__xport_mpi), for communicators whose ranks are on several
 * hosts, and the job's host layout (which ranks share a machine), found with MPI.
 *
 * Messages are MPI non-blocking point-to-point calls on a communicator of the same members (the
 * world: a duplicate of MPI_COMM_WORLD; a sub-group: MPI_Comm_create_group, collective over its
 * members only), polled with MPI_Testall. A wait never blocks in MPI: it polls, yields to the
 * progress engine when loom_xp_should_yield() holds, and otherwise sleeps a few microseconds
 * between polls. One process-wide lock serializes every MPI call, so MPI_THREAD_SERIALIZED is
 * the level asked for; the engine thread and the caller's thread may both be in a wait.
 *
 * The channel and the sequence number (collective) or tag (point to point) travel in the MPI tag,
 * so messages of different operations never match; a receive of a different size than was sent is
 * LOOM_EMISMATCH on the receiver (truncation or a short count), which aborts the communicator.
 * On the collective channel every payload is preceded by a small message with the same tag holding
 * the full sequence number and the call's signature (loom_xp_sig_t); MPI does not let messages of
 * one sender, tag and communicator overtake each other, so the first of the two receives posted
 * gets it. The receiver compares it with its own before accepting the payload: a peer that called
 * another collective of the same byte count (float32 against int32, say) is LOOM_EMISMATCH naming
 * both signatures, and aborts the communicator, instead of combining unrelated data. An
 * abort is sent to every peer as a message with ABORT_TAG, which each wait probes for. A rank
 * that dies is not seen by this transport: mpirun (or srun) ends the whole job, naming the rank
 * and its host. Memory from alloc is ordinary memory here (comm.c routes loom_comm_alloc of a
 * hierarchical communicator to its host-local shared-memory communicator).
 *
 * Exchanges left in flight (loom__mpi_xchg_*, for hier.c's pipelined all-reduce) are the same
 * Irecv/Isend pairs, waited on later; while any is in flight a progress thread enters MPI every few
 * tens of microseconds, because OpenMPI moves data only inside MPI calls and the owner may be
 * waiting on shared memory meanwhile. */
#ifdef LOOM_HAVE_MPI
#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "comm/transport.h"
#include "core/util.h"

#define ABORT_TAG 1
#define TAG_BITS 0x3fffffff

typedef struct {
	uint64_t seq;
	loom_xp_sig_t sig;
} wire_sig_t;

typedef struct {
	MPI_Comm comm;
	int rank, size;
	pthread_mutex_t lock; /* the abort record */
	int abort_code;
	char abort_msg[600];
	/* enter's signature exchange (mpi_enter): on a duplicate of comm, so its tags never meet the
	 * channels'; posted at enter, completed and compared at the next enter or destroy. */
	MPI_Comm scomm;
	wire_sig_t smine, *stheirs; /* this rank's call, every rank's (size entries) */
	MPI_Request *sreq;          /* 2 per rank: receive, send */
	int spending;
} mpi_comm_t;

static pthread_mutex_t mpi_lock = PTHREAD_MUTEX_INITIALIZER; /* every MPI call */
static int mpi_ready;                                           /* MPI_Init_thread done (by us) */
static MPI_Comm world_dup = MPI_COMM_NULL;
static int tag_ub = 32767;
static int lay_size, lay_nhosts, *lay_host, *lay_lrank;
static char (*lay_name)[64]; /* hostname of each host */

#define M(c) ((mpi_comm_t *)loom_xp_state(c))

static void finalize_at_exit(void)
{
	int fin = 0;
	MPI_Finalized(&fin);
	if (!fin)
		MPI_Finalize();
}

/* Before MPI_Init, which has no deadline and waits for every rank of the job: a rendezvous of this
 * host's ranks (mpirun's OMPI_COMM_WORLD_LOCAL_RANK). Each renames itself PRE_NAME (its process
 * name, /proc/<pid>/stat) and waits until it has seen every other so named, watching them with the
 * sibling scan of transport.h. One that exits or dies before it gets there (or has no process for a
 * second) fails loom_comm_init here, naming it, so this rank exits and mpirun ends the job, instead
 * of every rank waiting in MPI_Init forever. The name goes back once MPI_Init returned (by then every
 * rank has passed the rendezvous: MPI_Init waits for all); nothing is left behind however the job
 * ends. Threads MPI_Init starts inherit the name. *old receives the name to restore ("" when there is
 * no rendezvous: one rank on this host, or a scan that cannot be trusted). */
#define PRE_NAME "loom:mpi-init"

static int local_ranks_started(char *old)
{
	loom_shm_peers_t p;
	const char *ls = getenv("OMPI_COMM_WORLD_LOCAL_SIZE"), *lr = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
	const char *t = getenv("LOOM_TIMEOUT_S");
	int n = ls ? atoi(ls) : 0, me = lr ? atoi(lr) : -1, rc = LOOM_OK, all = 0;
	double deadline = loom_now() + (t && atof(t) > 0 ? atof(t) : 300);
	old[0] = '\0';
	if (n < 2 || me < 0 || me >= n)
		return LOOM_OK;
	if (!loom__shm_peers_init_vars(&p, n, "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", PRE_NAME) ||
	    prctl(PR_GET_NAME, old) != 0 || prctl(PR_SET_NAME, PRE_NAME) != 0) {
		old[0] = '\0';
		loom__shm_peers_free(&p);
		return LOOM_OK;
	}
	while (!all && rc == LOOM_OK) {
		char why[256];
		all = 1;
		for (int r = 0; r < n && rc == LOOM_OK; r++) {
			if (r == me)
				continue;
			if (loom__shm_peers_gone(&p, r, why, sizeof why))
				rc = loom_seterr(LOOM_EPEERLOST, "loom_comm_init: before MPI_Init: local %s (OMPI_COMM_WORLD_LOCAL_RANK, "
				                 "on this host)", why);
			all &= p.marked[r];
		}
		if (!all && rc == LOOM_OK) {
			if (loom_now() > deadline)
				rc = loom_seterr(LOOM_ETIMEDOUT, "loom_comm_init: timed out (LOOM_TIMEOUT_S) waiting for this host's "
				                                 "ranks to start");
			else
				usleep(10000);
		}
	}
	loom__shm_peers_free(&p);
	if (rc != LOOM_OK) {
		prctl(PR_SET_NAME, old);
		old[0] = '\0';
	}
	return rc;
}

int loom__mpi_layout(int *rank, int *size, const int **host_of, const int **lrank_of, int *nhosts)
{
	int provided, r, n, lr, rc = LOOM_OK, flag = 0;
	MPI_Comm node;
	void *ub;
	pthread_mutex_lock(&mpi_lock);
	if (!mpi_ready) {
		int inited = 0;
		MPI_Initialized(&inited);
		char name[17] = ""; /* the process name to restore after MPI_Init (PR_GET_NAME: 16 bytes) */
		if (!inited && (rc = local_ranks_started(name)) != LOOM_OK)
			goto done;
		if (!inited && MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
			if (name[0])
				prctl(PR_SET_NAME, name);
			rc = loom_seterr(LOOM_EIO, "loom_comm_init: MPI_Init_thread failed");
			goto done;
		}
		if (name[0]) /* every rank has passed the rendezvous */
			prctl(PR_SET_NAME, name);
		if (!inited)
			atexit(finalize_at_exit);
		MPI_Comm_dup(MPI_COMM_WORLD, &world_dup);
		MPI_Comm_set_errhandler(world_dup, MPI_ERRORS_RETURN);
		MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
		if (flag)
			tag_ub = *(int *)ub;
		MPI_Comm_rank(world_dup, &r);
		MPI_Comm_size(world_dup, &n);
		MPI_Comm_split_type(world_dup, MPI_COMM_TYPE_SHARED, r, MPI_INFO_NULL, &node);
		MPI_Comm_rank(node, &lr);
		lay_host = loom__calloc((size_t)n, sizeof *lay_host);
		lay_lrank = loom__calloc((size_t)n, sizeof *lay_lrank);
		lay_name = loom__calloc((size_t)n, sizeof *lay_name);
		if (!lay_host || !lay_lrank || !lay_name) {
			rc = loom_seterr(LOOM_ENOMEM, "loom_comm_init: out of memory");
			goto done;
		}
		{
			int me[2] = {r, lr}, *all = loom__calloc((size_t)n * 2, sizeof *all), lead = r;
			char host[64] = "";
			if (!all) {
				rc = loom_seterr(LOOM_ENOMEM, "loom_comm_init: out of memory");
				goto done;
			}
			MPI_Bcast(&lead, 1, MPI_INT, 0, node); /* the host's leader: its lowest world rank */
			me[0] = lead;
			MPI_Allgather(me, 2, MPI_INT, all, 2, MPI_INT, world_dup);
			gethostname(host, sizeof host - 1);
			MPI_Allgather(host, 64, MPI_CHAR, lay_name, 64, MPI_CHAR, world_dup);
			/* Hosts numbered by their leaders' order. */
			for (int q = 0; q < n; q++) {
				int h = 0;
				for (int p = 0; p < n; p++)
					h += all[2 * p] == p && p < all[2 * q];
				lay_host[q] = h, lay_lrank[q] = all[2 * q + 1];
				if (all[2 * q] == q)
					lay_nhosts++;
			}
			/* lay_name by host: move each leader's name to its host's slot (leaders are in order). */
			for (int q = 0, h = 0; q < n; q++)
				if (all[2 * q] == q) {
					if (h != q)
						memcpy(lay_name[h], lay_name[q], 64);
					h++;
				}
			free(all);
		}
		MPI_Comm_free(&node);
		lay_size = n;
		mpi_ready = 1;
	}
	MPI_Comm_rank(world_dup, rank);
	*size = lay_size, *host_of = lay_host, *lrank_of = lay_lrank, *nhosts = lay_nhosts;
done:
	pthread_mutex_unlock(&mpi_lock);
	return rc;
}

const char *loom__mpi_hostname(int host)
{
	return lay_name && host >= 0 && host < lay_nhosts ? lay_name[host] : "?";
}

/* ---- waits ------------------------------------------------------------------------------------- */

/* The requests of one exchange: [0] the signature received, [1] the payload received, [2] the
 * signature sent, [3] the payload sent (MPI_REQUEST_NULL when not posted). */
typedef struct {
	MPI_Request req[4];
	MPI_Status st[4];
	int done;
} waiter_t;

#define WAITER_INIT {{MPI_REQUEST_NULL, MPI_REQUEST_NULL, MPI_REQUEST_NULL, MPI_REQUEST_NULL}, {{0}}, 0}

/* What precedes every payload on the collective channel: wire_sig_t (above). */

static int poll_once(void *arg)
{
	waiter_t *w = arg;
	int flag = 0;
	if (w->done)
		return 1;
	pthread_mutex_lock(&mpi_lock);
	MPI_Testall(4, w->req, &flag, w->st);
	pthread_mutex_unlock(&mpi_lock);
	if (flag)
		w->done = 1;
	return w->done;
}

/* Receive a pending abort from a peer, if any; returns its code (0: none). */
static int poll_abort(loom_comm_t *c)
{
	mpi_comm_t *s = M(c);
	int flag = 0, code;
	MPI_Status st;
	char buf[sizeof s->abort_msg + 8];
	pthread_mutex_lock(&s->lock);
	code = s->abort_code;
	pthread_mutex_unlock(&s->lock);
	if (code)
		return code;
	pthread_mutex_lock(&mpi_lock);
	MPI_Iprobe(MPI_ANY_SOURCE, ABORT_TAG, s->comm, &flag, &st);
	if (flag)
		MPI_Recv(buf, (int)sizeof buf, MPI_CHAR, st.MPI_SOURCE, ABORT_TAG, s->comm, MPI_STATUS_IGNORE);
	pthread_mutex_unlock(&mpi_lock);
	if (!flag)
		return 0;
	buf[sizeof buf - 1] = '\0';
	memcpy(&code, buf, sizeof code);
	pthread_mutex_lock(&s->lock);
	if (!s->abort_code) {
		s->abort_code = code ? code : LOOM_EPEERLOST;
		snprintf(s->abort_msg, sizeof s->abort_msg, "%s", buf + 8);
	}
	code = s->abort_code;
	pthread_mutex_unlock(&s->lock);
	return code;
}

static void mpi_abort(loom_comm_t *c, int code, const char *msg)
{
	mpi_comm_t *s = M(c);
	char buf[sizeof s->abort_msg + 8] = {0};
	if (!s)
		return;
	pthread_mutex_lock(&s->lock);
	if (s->abort_code) {
		pthread_mutex_unlock(&s->lock);
		return;
	}
	s->abort_code = code;
	snprintf(s->abort_msg, sizeof s->abort_msg, "%s", msg);
	pthread_mutex_unlock(&s->lock);
	memcpy(buf, &code, sizeof code);
	snprintf(buf + 8, sizeof buf - 8, "%s", msg);
	pthread_mutex_lock(&mpi_lock);
	for (int r = 0; r < s->size; r++) {
		MPI_Request q;
		if (r == s->rank)
			continue;
		if (MPI_Isend(buf, (int)sizeof buf, MPI_CHAR, r, ABORT_TAG, s->comm, &q) == MPI_SUCCESS)
			MPI_Request_free(&q);
	}
	pthread_mutex_unlock(&mpi_lock);
}

static int mpi_aborted(loom_comm_t *c, char *msg, size_t cap)
{
	mpi_comm_t *s = M(c);
	int code;
	if (!s)
		return LOOM_ESTATE;
	code = poll_abort(c);
	if (code) {
		pthread_mutex_lock(&s->lock);
		snprintf(msg, cap, "%s", s->abort_msg);
		pthread_mutex_unlock(&s->lock);
	}
	return code;
}

/* How long a wait polls before sleeping between polls, and how long it sleeps (us). With more ranks
 * on this host than CPUs, polling steals the time the ranks that compute need (DDP's all-reduce
 * overlaps backward): then a wait sleeps from the start, and longer. */
static atomic_int spin_polls = -1, sleep_us; /* set once (racing threads compute the same values) */

static void poll_policy(void)
{
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	int here = 0, me = 0;
	pthread_mutex_lock(&mpi_lock);
	MPI_Comm_rank(world_dup, &me);
	for (int q = 0; q < lay_size; q++)
		here += lay_host[q] == lay_host[me];
	pthread_mutex_unlock(&mpi_lock);
	sleep_us = ncpu > 0 && here > ncpu ? 50 : 10; /* before spin_polls, which marks the policy set */
	spin_polls = ncpu > 0 && here > ncpu ? 0 : 200;
}

/* Poll w until done; LOOM_OK, or a failure recorded on c (timeout, or an abort from a peer). */
static int wait_all(loom_comm_t *c, const loom_xp_ctx_t *ctx, waiter_t *w, const char *what)
{
	double deadline = ctx->deadline > 0 ? ctx->deadline : loom_now() + loom_xp_timeout(c);
	int code;
	if (spin_polls < 0)
		poll_policy();
	for (long spins = 0; !poll_once(w); spins++) {
		if ((spins & 63) == 63) {
			char msg[600];
			if ((code = poll_abort(c)) != 0) {
				mpi_aborted(c, msg, sizeof msg);
				return loom_comm_fail(c, code, "%s: the communicator was aborted: %s", what, msg);
			}
			if (loom_now() > deadline) {
				code = loom_comm_fail(c, LOOM_ETIMEDOUT, "%s over MPI timed out after %g s", what,
				                      loom_xp_timeout(c));
				mpi_abort(c, code, loom_comm_errmsg(c));
				return code;
			}
		}
		if (loom_xp_should_yield())
			loom_xp_yield(poll_once, w);
		else if (spins >= spin_polls)
			usleep(spins > 20000 ? 200 : (unsigned)sleep_us);
	}
	return LOOM_OK;
}

/* ---- the table ------------------------------------------------------------------------------------ */

static int mpi_open(loom_comm_t *c, loom_comm_t *parent, const char *name, size_t heap_bytes,
                    const loom_xp_ctx_t *ctx)
{
	mpi_comm_t *s = loom__calloc(1, sizeof *s);
	MPI_Group wg = MPI_GROUP_NULL, g = MPI_GROUP_NULL;
	int *ranks = NULL, rc = LOOM_OK, tag = 0;
	(void)heap_bytes, (void)ctx;
	if (!s)
		return loom_comm_fail(c, LOOM_ENOMEM, "out of memory");
	pthread_mutex_init(&s->lock, NULL);
	s->comm = MPI_COMM_NULL;
	s->rank = loom_comm_rank(c), s->size = loom_comm_size(c);
	loom_xp_set_state(c, s);
	if (!mpi_ready)
		return loom_comm_fail(c, LOOM_ESTATE, "the MPI transport needs loom__mpi_layout first");
	(void)parent;
	if (!(ranks = loom__calloc((size_t)s->size, sizeof *ranks)))
		return loom_comm_fail(c, LOOM_ENOMEM, "out of memory");
	for (int r = 0; r < s->size; r++)
		ranks[r] = loom_xp_world_rank(c, r);
	for (const char *p = name; *p; p++)
		tag = (tag * 31 + (unsigned char)*p) & 0x7fff;
	pthread_mutex_lock(&mpi_lock);
	MPI_Comm_group(world_dup, &wg);
	MPI_Group_incl(wg, s->size, ranks, &g);
	s->scomm = MPI_COMM_NULL;
	if (MPI_Comm_create_group(world_dup, g, tag, &s->comm) != MPI_SUCCESS || s->comm == MPI_COMM_NULL)
		rc = LOOM_EIO;
	else if (MPI_Comm_set_errhandler(s->comm, MPI_ERRORS_RETURN), MPI_Comm_dup(s->comm, &s->scomm) != MPI_SUCCESS)
		rc = LOOM_EIO;
	else
		MPI_Comm_set_errhandler(s->scomm, MPI_ERRORS_RETURN);
	MPI_Group_free(&g);
	MPI_Group_free(&wg);
	pthread_mutex_unlock(&mpi_lock);
	free(ranks);
	if (rc != LOOM_OK)
		return loom_comm_fail(c, rc, "MPI_Comm_create_group for %s failed", name);
	s->stheirs = loom__calloc((size_t)s->size, sizeof *s->stheirs);
	s->sreq = loom__calloc((size_t)s->size * 2, sizeof *s->sreq);
	if (!s->stheirs || !s->sreq)
		return loom_comm_fail(c, LOOM_ENOMEM, "out of memory");
	for (int i = 0; i < 2 * s->size; i++)
		s->sreq[i] = MPI_REQUEST_NULL;
	return LOOM_OK;
}

static void mpi_depart(loom_comm_t *c)
{
	(void)c;
}

static void mpi_close(loom_comm_t *c)
{
	mpi_comm_t *s = M(c);
	if (!s)
		return;
	pthread_mutex_lock(&mpi_lock);
	for (int i = 0; s->sreq && s->spending && i < 2 * s->size; i++)
		if (s->sreq[i] != MPI_REQUEST_NULL) { /* only after a failure: nobody will match these */
			MPI_Cancel(&s->sreq[i]);
			MPI_Request_free(&s->sreq[i]);
		}
	if (s->scomm != MPI_COMM_NULL)
		MPI_Comm_free(&s->scomm);
	if (s->comm != MPI_COMM_NULL)
		MPI_Comm_free(&s->comm);
	pthread_mutex_unlock(&mpi_lock);
	free(s->stheirs);
	free(s->sreq);
	pthread_mutex_destroy(&s->lock);
	free(s);
	loom_xp_set_state(c, NULL);
}

static int mpi_tag(int chan, const loom_xp_ctx_t *ctx, int tag)
{
	unsigned v = chan == LOOM_XP_COLL ? (unsigned)(ctx->seq & TAG_BITS) : (unsigned)tag & TAG_BITS;
	v = v * 2 + (unsigned)chan;
	return 2 + (int)(v % (unsigned)(tag_ub - 2));
}

/* LOOM_OK when the receive of st brought exactly rbytes; else LOOM_EMISMATCH, recorded on c and
 * sent to every peer as an abort. */
static int check_size(loom_comm_t *c, const char *what, int src, MPI_Status *st, size_t rbytes)
{
	int got = 0, rc;
	if (st->MPI_ERROR == MPI_ERR_TRUNCATE)
		got = -1;
	else
		MPI_Get_count(st, MPI_BYTE, &got);
	if (got == (int)rbytes)
		return LOOM_OK;
	rc = loom_comm_fail(c, LOOM_EMISMATCH, "%s: rank %d sent a message of %s%d bytes over MPI, this rank expected %zu",
	                    what, src, got < 0 ? "more than " : "", got < 0 ? (int)rbytes : got, rbytes);
	mpi_abort(c, rc, loom_comm_errmsg(c));
	return rc;
}

/* LOOM_OK when the signature message received (st, got) matches this rank's (seq, sig); else
 * LOOM_EMISMATCH naming both calls, recorded on c and sent to every peer as an abort. */
static int check_sig(loom_comm_t *c, const char *what, int src, MPI_Status *st, const wire_sig_t *got, uint64_t seq,
                     const loom_xp_sig_t *sig)
{
	char mine[160], theirs[160];
	int n = 0, rc;
	if (st->MPI_ERROR != MPI_ERR_TRUNCATE)
		MPI_Get_count(st, MPI_BYTE, &n);
	if (n != (int)sizeof *got) {
		rc = loom_comm_fail(c, LOOM_EMISMATCH,
		                    "%s: rank %d sent a message of %s%d bytes over MPI where this rank expected the %zu-byte "
		                    "signature of its collective call",
		                    what, src, n ? "" : "more than ", n ? n : (int)sizeof *got, sizeof *got);
		mpi_abort(c, rc, loom_comm_errmsg(c));
		return rc;
	}
	if (got->seq == seq && got->sig.count == sig->count && got->sig.shape == sig->shape && got->sig.root == sig->root)
		return LOOM_OK;
	loom_xp_sig_describe(mine, sizeof mine, seq, sig);
	loom_xp_sig_describe(theirs, sizeof theirs, got->seq, &got->sig);
	rc = loom_comm_fail(c, LOOM_EMISMATCH, "mismatched collective calls: this rank called %s, rank %d called %s (over MPI)%s",
	                    mine, src, theirs,
	                    got->seq != seq ? " (ranks called collectives in different orders, or one rank's call failed "
	                                      "before it sent anything)"
	                                    : "");
	mpi_abort(c, rc, loom_comm_errmsg(c));
	return rc;
}

/* "allreduce with rank 1 (world rank 3 on host b)": the peers of a transfer, for its timeout. */
static void peers_desc(loom_comm_t *c, const char *what, int dst, int src, char *out, size_t cap)
{
	int len = snprintf(out, cap, "%s", what);
	for (int i = 0; i < 2; i++) {
		int r = i ? src : dst, w;
		if (r < 0 || (i && src == dst) || len < 0 || (size_t)len >= cap)
			continue;
		w = loom_xp_world_rank(c, r);
		len += snprintf(out + len, cap - (size_t)len, "%s rank %d (world rank %d on host %s)",
		                i && dst >= 0 && src != dst ? " and" : " with", r, w,
		                lay_host && w < lay_size ? loom__mpi_hostname(lay_host[w]) : "?");
	}
}

static int mpi_sendrecv(loom_comm_t *c, const loom_xp_ctx_t *ctx, int chan, int dst, const void *sbuf, size_t sbytes,
                        int stag, int src, void *rbuf, size_t rbytes, int rtag, const void *red_local, loom_dtype_t dt,
                        loom_op_t op)
{
	mpi_comm_t *s = M(c);
	waiter_t w = WAITER_INIT;
	void *tmp = NULL, *into = rbuf;
	int rc = LOOM_OK, e1 = MPI_SUCCESS, e2 = MPI_SUCCESS, coll = chan == LOOM_XP_COLL;
	const char *what = ctx->op ? ctx->op : "message";
	wire_sig_t ssig = {ctx->seq, loom_xp_coll_sig(c, ctx)}, rsig = {0, {0, 0, 0}};
	if (sbytes > (size_t)INT32_MAX || rbytes > (size_t)INT32_MAX)
		return loom_comm_fail(c, LOOM_EINVAL, "%s: a message of more than 2 GiB over MPI", what);
	if (src >= 0 && red_local && rbytes) {
		if (!(tmp = loom__malloc(rbytes)))
			return loom_comm_fail(c, LOOM_ENOMEM, "out of memory");
		into = tmp;
	}
	pthread_mutex_lock(&mpi_lock);
	if (src >= 0 && coll)
		e1 = MPI_Irecv(&rsig, (int)sizeof rsig, MPI_BYTE, src, mpi_tag(chan, ctx, rtag), s->comm, &w.req[0]);
	if (src >= 0 && e1 == MPI_SUCCESS)
		e1 = MPI_Irecv(into, (int)rbytes, MPI_BYTE, src, mpi_tag(chan, ctx, rtag), s->comm, &w.req[1]);
	if (dst >= 0 && coll)
		e2 = MPI_Isend(&ssig, (int)sizeof ssig, MPI_BYTE, dst, mpi_tag(chan, ctx, stag), s->comm, &w.req[2]);
	if (dst >= 0 && e2 == MPI_SUCCESS)
		e2 = MPI_Isend(sbuf, (int)sbytes, MPI_BYTE, dst, mpi_tag(chan, ctx, stag), s->comm, &w.req[3]);
	pthread_mutex_unlock(&mpi_lock);
	if (e1 != MPI_SUCCESS || e2 != MPI_SUCCESS) {
		rc = loom_comm_fail(c, LOOM_EIO, "%s: MPI_Irecv/MPI_Isend failed", what);
		goto done;
	}
	{
		char desc[300];
		peers_desc(c, what, dst, src, desc, sizeof desc);
		if ((rc = wait_all(c, ctx, &w, desc)) != LOOM_OK)
			goto done;
	}
	if (src >= 0) {
		if (coll && (rc = check_sig(c, what, src, &w.st[0], &rsig, ssig.seq, &ssig.sig)) != LOOM_OK)
			goto done;
		if ((rc = check_size(c, what, src, &w.st[1], rbytes)) != LOOM_OK)
			goto done;
		if (tmp)
			loom_reduce_local(rbuf, red_local, tmp, rbytes / loom_dtype_size(dt), dt, op);
	}
done:
	free(tmp);
	return rc;
}

static int mpi_allgather_small(loom_comm_t *c, const loom_xp_ctx_t *ctx, const void *mine, size_t len, void *all)
{
	mpi_comm_t *s = M(c);
	waiter_t w = WAITER_INIT;
	int rc;
	pthread_mutex_lock(&mpi_lock);
	rc = MPI_Iallgather(mine, (int)len, MPI_BYTE, all, (int)len, MPI_BYTE, s->comm, &w.req[0]);
	pthread_mutex_unlock(&mpi_lock);
	if (rc != MPI_SUCCESS) {
		rc = loom_comm_fail(c, LOOM_EIO, "MPI_Iallgather failed");
		mpi_abort(c, rc, loom_comm_errmsg(c));
		return rc;
	}
	return wait_all(c, ctx, &w, ctx->op ? ctx->op : "allgather_small");
}

static int mpi_allreduce(loom_comm_t *c, const loom_xp_ctx_t *ctx, const void *send, void *recv, size_t count,
                         loom_dtype_t dt, loom_op_t op)
{
	mpi_comm_t *s = M(c);
	waiter_t w = WAITER_INIT;
	MPI_Datatype t = dt == LOOM_FLOAT32 ? MPI_FLOAT : dt == LOOM_FLOAT64 ? MPI_DOUBLE
	                 : dt == LOOM_INT32 ? MPI_INT32_T : dt == LOOM_INT64 ? MPI_INT64_T : MPI_DATATYPE_NULL;
	MPI_Op o = op == LOOM_MAX ? MPI_MAX : op == LOOM_MIN ? MPI_MIN : MPI_SUM;
	int rc;
	if (t == MPI_DATATYPE_NULL || count > (size_t)INT32_MAX)
		return LOOM_ENOTSUP;
	pthread_mutex_lock(&mpi_lock);
	rc = MPI_Iallreduce(send == recv ? MPI_IN_PLACE : send, recv, (int)count, t, o, s->comm, &w.req[0]);
	pthread_mutex_unlock(&mpi_lock);
	if (rc != MPI_SUCCESS) {
		rc = loom_comm_fail(c, LOOM_EIO, "MPI_Iallreduce failed");
		mpi_abort(c, rc, loom_comm_errmsg(c));
		return rc;
	}
	return wait_all(c, ctx, &w, ctx->op ? ctx->op : "allreduce");
}

/* ---- exchanges left in flight (hier.c's pipelined all-reduce) ------------------------------------- */

struct loom_mpi_xchg {
	waiter_t w;
	int peer;
	size_t bytes;
	wire_sig_t ssig, rsig; /* the signature sent before the payload, and the peer's */
};

/* OpenMPI moves a message only inside MPI calls on both sides (a large one needs the sender to answer
 * the receiver's clear-to-send and then push fragments). An exchange left in flight while this rank
 * waits on shared memory would stall, and with it the peer, who may be what the shared-memory wait
 * waits for (a deadlock seen across two hosts: 0 waits for 1 on shm, 1 for 3 over MPI, 3 for 2 on
 * shm, 2 for 0 over MPI). So while exchanges are in flight, a progress thread enters MPI every
 * PROGRESS_US (an MPI_Iprobe for a tag never sent drives MPI's progress engine without touching the
 * exchanges' requests, which only their owner tests). */
#define PROGRESS_US 30
static pthread_mutex_t prog_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t prog_cond = PTHREAD_COND_INITIALIZER;
static int prog_inflight, prog_started;

static void *progress_main(void *arg)
{
	(void)arg;
	for (;;) {
		int flag = 0;
		pthread_mutex_lock(&prog_lock);
		while (prog_inflight == 0)
			pthread_cond_wait(&prog_cond, &prog_lock);
		pthread_mutex_unlock(&prog_lock);
		pthread_mutex_lock(&mpi_lock);
		MPI_Iprobe(MPI_ANY_SOURCE, 0, world_dup, &flag, MPI_STATUS_IGNORE); /* tag 0: never sent */
		pthread_mutex_unlock(&mpi_lock);
		usleep(PROGRESS_US);
	}
	return NULL;
}

/* One more (+1) or one fewer (-1) exchange in flight; starts the progress thread at the first. */
static void progress_count(int d)
{
	pthread_mutex_lock(&prog_lock);
	if (!prog_started && d > 0) {
		pthread_t t;
		pthread_attr_t at;
		pthread_attr_init(&at);
		pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
		prog_started = pthread_create(&t, &at, progress_main, NULL) == 0;
		pthread_attr_destroy(&at);
	}
	prog_inflight += d;
	if (prog_inflight > 0)
		pthread_cond_signal(&prog_cond);
	pthread_mutex_unlock(&prog_lock);
}

int loom__mpi_xchg_post(loom_comm_t *c, const loom_xp_ctx_t *ctx, const loom_xp_sig_t *sig, int peer, const void *sbuf,
                        void *rbuf, size_t bytes, loom_mpi_xchg_t **out)
{
	mpi_comm_t *s = M(c);
	loom_mpi_xchg_t *x;
	int e1, e2, flag = 0, tag = mpi_tag(LOOM_XP_COLL, ctx, 0);
	*out = NULL;
	if (bytes > (size_t)INT32_MAX)
		return loom_comm_fail(c, LOOM_EINVAL, "%s: a message of more than 2 GiB over MPI", ctx->op);
	if (!(x = loom__calloc(1, sizeof *x)))
		return loom_comm_fail(c, LOOM_ENOMEM, "out of memory");
	for (int i = 0; i < 4; i++)
		x->w.req[i] = MPI_REQUEST_NULL;
	x->peer = peer, x->bytes = bytes;
	x->ssig.seq = ctx->seq, x->ssig.sig = *sig;
	progress_count(1);
	pthread_mutex_lock(&mpi_lock);
	e1 = MPI_Irecv(&x->rsig, (int)sizeof x->rsig, MPI_BYTE, peer, tag, s->comm, &x->w.req[0]);
	if (e1 == MPI_SUCCESS)
		e1 = MPI_Irecv(rbuf, (int)bytes, MPI_BYTE, peer, tag, s->comm, &x->w.req[1]);
	e2 = MPI_Isend(&x->ssig, (int)sizeof x->ssig, MPI_BYTE, peer, tag, s->comm, &x->w.req[2]);
	if (e2 == MPI_SUCCESS)
		e2 = MPI_Isend(sbuf, (int)bytes, MPI_BYTE, peer, tag, s->comm, &x->w.req[3]);
	if (e1 == MPI_SUCCESS && e2 == MPI_SUCCESS) /* start moving now: MPI progresses only inside its calls */
		x->w.done = MPI_Testall(4, x->w.req, &flag, x->w.st) == MPI_SUCCESS && flag;
	pthread_mutex_unlock(&mpi_lock);
	if (e1 != MPI_SUCCESS || e2 != MPI_SUCCESS) {
		loom__mpi_xchg_drop(x);
		return loom_comm_fail(c, LOOM_EIO, "%s: MPI_Irecv/MPI_Isend to rank %d failed", ctx->op, peer);
	}
	*out = x;
	return LOOM_OK;
}

int loom__mpi_xchg_wait(loom_comm_t *c, const loom_xp_ctx_t *ctx, loom_mpi_xchg_t *x)
{
	char desc[300];
	int rc;
	peers_desc(c, ctx->op ? ctx->op : "exchange", x->peer, x->peer, desc, sizeof desc);
	rc = wait_all(c, ctx, &x->w, desc);
	if (rc == LOOM_OK)
		rc = check_sig(c, ctx->op, x->peer, &x->w.st[0], &x->rsig, x->ssig.seq, &x->ssig.sig);
	if (rc == LOOM_OK)
		rc = check_size(c, ctx->op, x->peer, &x->w.st[1], x->bytes);
	if (rc == LOOM_OK) {
		progress_count(-1);
		free(x);
	} else {
		loom__mpi_xchg_drop(x);
	}
	return rc;
}

void loom__mpi_xchg_drop(loom_mpi_xchg_t *x)
{
	int sig_in_flight = 0;
	if (!x)
		return;
	pthread_mutex_lock(&mpi_lock);
	if (x->w.req[2] != MPI_REQUEST_NULL) /* MPI may still read x->ssig */
		MPI_Test(&x->w.req[2], &sig_in_flight, MPI_STATUS_IGNORE), sig_in_flight = !sig_in_flight;
	for (int i = 0; i < 4; i++)
		if (x->w.req[i] != MPI_REQUEST_NULL) {
			if (i < 2)
				MPI_Cancel(&x->w.req[i]);
			MPI_Request_free(&x->w.req[i]);
		}
	pthread_mutex_unlock(&mpi_lock);
	progress_count(-1);
	if (!sig_in_flight) /* else left allocated (a few bytes, only after a failure): the send may read it */
		free(x);
}

/* enter (transport.h). MPI shows nothing of a peer's state, so the signatures travel: every call
 * sends its (seq, signature) to every peer and posts the receives of theirs, left in flight while the
 * call runs; the next enter (or destroy) completes them and compares. A call a rank's peers went
 * past without exchanging a message with it (every rank a broadcast's root: eager sends both
 * ways) so fails at every rank's next call at the latest, naming both calls. The cost is 2(size-1)
 * small messages per call, off the call's critical path; the wait at the next enter is for peers
 * that have not yet entered the previous call. */
static int settle_ready(void *arg)
{
	mpi_comm_t *s = arg;
	int flag = 0;
	pthread_mutex_lock(&mpi_lock);
	MPI_Testall(2 * s->size, s->sreq, &flag, MPI_STATUSES_IGNORE);
	pthread_mutex_unlock(&mpi_lock);
	return flag;
}

static int settle_wait(loom_comm_t *c, const loom_xp_ctx_t *ctx)
{
	mpi_comm_t *s = M(c);
	double deadline = ctx->deadline > 0 ? ctx->deadline : loom_now() + loom_xp_timeout(c);
	char mine[160], theirs[160], msg[600];
	int code;
	if (spin_polls < 0)
		poll_policy();
	for (long spins = 0; !settle_ready(s); spins++) {
		if ((spins & 63) == 63) {
			if ((code = poll_abort(c)) != 0) {
				mpi_aborted(c, msg, sizeof msg);
				return loom_comm_fail(c, code, "the communicator was aborted: %s", msg);
			}
			if (loom_now() > deadline) {
				code = loom_comm_fail(c, LOOM_ETIMEDOUT,
				                      "timed out after %g s waiting for every rank to reach call #%llu (over MPI)",
				                      loom_xp_timeout(c), (unsigned long long)s->smine.seq);
				mpi_abort(c, code, loom_comm_errmsg(c));
				return code;
			}
		}
		if (loom_xp_should_yield())
			loom_xp_yield(settle_ready, s);
		else if (spins >= spin_polls)
			usleep(spins > 20000 ? 200 : (unsigned)sleep_us);
	}
	s->spending = 0;
	for (int r = 0; r < s->size; r++) {
		const wire_sig_t *t = &s->stheirs[r];
		if (r == s->rank || (t->seq == s->smine.seq && t->sig.count == s->smine.sig.count &&
		                     t->sig.shape == s->smine.sig.shape && t->sig.root == s->smine.sig.root))
			continue;
		loom_xp_sig_describe(mine, sizeof mine, s->smine.seq, &s->smine.sig);
		loom_xp_sig_describe(theirs, sizeof theirs, t->seq, &t->sig);
		code = loom_comm_fail(c, LOOM_EMISMATCH,
		                      "mismatched collective calls: this rank called %s, rank %d called %s (over MPI, compared "
		                      "at this rank's next call)",
		                      mine, r, theirs);
		mpi_abort(c, code, loom_comm_errmsg(c));
		return code;
	}
	return LOOM_OK;
}

static int mpi_enter(loom_comm_t *c, const loom_xp_ctx_t *ctx, int coll)
{
	mpi_comm_t *s = M(c);
	int rc = LOOM_OK, tag;
	if (!s || s->scomm == MPI_COMM_NULL)
		return LOOM_OK;
	if (s->spending && (rc = settle_wait(c, ctx)) != LOOM_OK)
		return rc;
	if (coll == -2 || s->size < 2)
		return LOOM_OK;
	s->smine = (wire_sig_t){ctx->seq, loom_xp_coll_sig(c, ctx)};
	tag = (int)(ctx->seq % (uint64_t)tag_ub);
	pthread_mutex_lock(&mpi_lock);
	for (int r = 0; r < s->size && rc == LOOM_OK; r++) {
		if (r == s->rank)
			continue;
		if (MPI_Irecv(&s->stheirs[r], (int)sizeof *s->stheirs, MPI_BYTE, r, tag, s->scomm, &s->sreq[2 * r]) !=
		        MPI_SUCCESS ||
		    MPI_Isend(&s->smine, (int)sizeof s->smine, MPI_BYTE, r, tag, s->scomm, &s->sreq[2 * r + 1]) != MPI_SUCCESS)
			rc = LOOM_EIO;
	}
	pthread_mutex_unlock(&mpi_lock);
	s->spending = 1;
	if (rc != LOOM_OK) {
		rc = loom_comm_fail(c, rc, "MPI_Irecv/MPI_Isend of the call's signature failed");
		mpi_abort(c, rc, loom_comm_errmsg(c));
	}
	return rc;
}

/* Ordinary aligned memory, remembered so that free can tell it from other pointers. */
typedef struct block {
	struct block *next;
	void *p;
} block_t;
static block_t *blocks;
static pthread_mutex_t blocks_lock = PTHREAD_MUTEX_INITIALIZER;

static void *mpi_alloc(loom_comm_t *c, size_t bytes)
{
	block_t *b = loom__malloc(sizeof *b);
	(void)c;
	if (!b || !(b->p = loom_alloc_aligned(bytes ? bytes : 1))) {
		free(b);
		loom_seterr(LOOM_ENOMEM, "loom_comm_alloc: out of memory for %zu bytes", bytes);
		return NULL;
	}
	pthread_mutex_lock(&blocks_lock);
	b->next = blocks, blocks = b;
	pthread_mutex_unlock(&blocks_lock);
	return b->p;
}

static int mpi_free(loom_comm_t *c, void *p)
{
	block_t **pp, *b = NULL;
	(void)c;
	pthread_mutex_lock(&blocks_lock);
	for (pp = &blocks; *pp; pp = &(*pp)->next)
		if ((*pp)->p == p) {
			b = *pp, *pp = b->next;
			break;
		}
	pthread_mutex_unlock(&blocks_lock);
	if (!b)
		return 0;
	loom_free_aligned(b->p);
	free(b);
	return 1;
}

static void mpi_idle_wait(loom_comm_t *c, int (*cond)(void *), void *arg, double max_s)
{
	double end = loom_now() + max_s;
	(void)c;
	if (spin_polls < 0)
		poll_policy();
	while (!cond(arg) && loom_now() < end)
		usleep((unsigned)sleep_us * 2);
}

static void mpi_wake_self(loom_comm_t *c)
{
	(void)c;
}

const loom_xport_ops_t loom__xport_mpi = {
	.name = "mpi",
	.open = mpi_open,
	.depart = mpi_depart,
	.close = mpi_close,
	.sendrecv = mpi_sendrecv,
	.allgather_small = mpi_allgather_small,
	.abort = mpi_abort,
	.aborted = mpi_aborted,
	.enter = mpi_enter,
	.alloc = mpi_alloc,
	.free = mpi_free,
	.idle_wait = mpi_idle_wait,
	.wake_self = mpi_wake_self,
	.allreduce = mpi_allreduce,
};

#else
typedef int loom__mpi_xport_unused; /* built without MPI (see docs/multinode.md) */
#endif
