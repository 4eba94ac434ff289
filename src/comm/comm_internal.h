/* comm_internal.h: the communicator's private state, shared by comm.c and request.c (the progress
 * engine). Not part of the public API; algorithms and transports must not include it (they see the
 * communicator through src/comm/transport.h). */
#ifndef LOOM_COMM_INTERNAL_H
#define LOOM_COMM_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stddef.h>
#include <stdint.h>

#include "comm/algo/algo.h"
#include "comm/transport.h"

/* A lane is a FIFO of non-blocking requests that must run one after another: a communicator's
 * collectives (one lane: every rank runs them in issue order), its sends to one peer, its receives
 * from one peer (messages of a pair arrive in order). Lanes progress independently of each other.
 * All fields are guarded by the engine's lock (request.c). */
enum { LANE_COLL = 0, LANE_SEND, LANE_RECV };

typedef struct loom_lane {
	loom_comm_t *c;
	int kind, peer;                    /* LANE_*; peer -1 for LANE_COLL */
	struct loom_request *head, *tail;  /* queued, not started */
	struct loom_request *cur;          /* running */
	int in_engine;                     /* has work: queued in the engine or being run by it */
	struct loom_lane *next_in;         /* the engine's list of lanes that got work */
} loom_lane_t;

struct loom_request {
	loom_comm_t *c;
	loom_lane_t *lane;
	loom_coll_args_t args; /* collectives; point to point: send (isend) or recv (irecv), count, dt */
	int peer, tag;         /* point to point */
	uint64_t seq;
	int done, rc;
	char msg[1024];
	struct loom_request *next; /* queue link */
};

struct loom_comm {
	loom_xp_head_t xp; /* first: the transport's table and its state for this communicator */
	char name[200];    /* unique in the job, the same on every member: "loom-<job>@w[-<split#>.<leader>...]" */
	int rank, size, local_rank;
	int *world_of; /* world rank of each member */
	int world_size;
	unsigned world_gen; /* which loom_comm_init of this process the communicator descends from */
	double timeout_s;
	int debug;
	loom_algo_t forced[LOOM_COLL_COUNT];
	char algo_spec[256];        /* LOOM_ALGO or opts.algo, as given (compared across ranks at init) */
	size_t ring_seg;            /* bytes per ring segment (LOOM_RING_SEG) */
	size_t inplace_min;         /* heap sends at least this large travel single-copy (LOOM_SHM_INPLACE_MIN) */
	uint64_t coll_seq, split_count;
	loom_xp_ctx_t coll_ctx; /* the collective running on c (for its algorithm's loom_xp_* calls), else 0 */
	loom_xp_sig_t coll_sig; /* its signature (transport.h), else 0 */
	atomic_ullong st_colls, st_bytes, st_ns; /* loom_comm_stats (updated by whichever thread ran it) */

	pthread_mutex_t err_lock;
	char errmsg[1024];
	atomic_int failed; /* a failure other than LOOM_EINVAL was reported on this communicator */

	void *scratch[2];
	size_t scratch_bytes[2];
	int scratch_xp[2]; /* from the transport's alloc (else loom_alloc_aligned) */

	/* non-blocking requests (request.c) */
	loom_lane_t coll_lane;
	loom_lane_t *p2p_lanes; /* 2*size, allocated at the first isend/irecv: sends to r, then receives from r */
	int engine_user;        /* counted among the progress engine's users */

	/* Communicators spanning hosts (hier.c): NULL / 0 otherwise. host_of and lrank_of (by world rank)
	 * are the MPI transport's layout; hlocal holds this host's members (shared memory), hcross the
	 * members whose index on their host equals ours (MPI), only when every host has hL members. */
	const int *host_of, *lrank_of;
	struct loom_comm *hlocal, *hcross;
	int *hidx;   /* member r's rank in its host's hlocal */
	int *hcrank; /* member r's rank in its hcross */
	int hL, hH;  /* members per host, hosts (hcross != NULL) */
};

/* What the calling thread (or progress-engine worker) is doing: only prefixes error messages
 * (loom_comm_fail). Transports get the sequence number and deadline explicitly (loom_xp_ctx_t). */
typedef struct {
	loom_comm_t *c;
	const char *op;
	uint64_t seq;
	double deadline;
} loom_opctx_t;

extern _Thread_local loom_opctx_t loom_cur;

/* ---- comm.c ---------------------------------------------------------------------------------- */

/* Run one validated collective on the calling thread (sequence number already assigned). */
int loom__comm_exec(loom_comm_t *c, const loom_coll_args_t *a, uint64_t seq);
/* Validate a collective's arguments: LOOM_OK or LOOM_EINVAL recorded on c. For the v-collectives
 * it also sets a->total, and a->count to this rank's count. */
int loom__comm_validate(loom_comm_t *c, loom_coll_args_t *a);
/* A call that failed its argument check on this rank still takes its sequence number, so that the
 * ranks whose call was valid and this rank number later calls alike (a peer's message for the failed
 * call then fails this rank's next call with both signatures, never feeds it). */
void loom__comm_skip_seq(loom_comm_t *c);
/* Fail fast when the communicator is unusable after an earlier fatal error; LOOM_OK otherwise. */
int loom__comm_check_usable(loom_comm_t *c, const char *op);

/* A communicator of rank/size with the shared-memory transport, nothing opened; NULL when out of
 * memory. comm_free releases one (and its transport state, its hierarchy). */
loom_comm_t *loom__comm_new(int rank, int size);
void loom__comm_free(loom_comm_t *c);

/* ---- hier.c: communicators spanning hosts ------------------------------------------------------ */

/* Build c's hierarchy (c is open on the MPI transport, host_of/lrank_of set): hlocal opened with
 * shared memory (a new segment for the world, when plocal is NULL; else a sub-group of plocal, the
 * parent's hlocal), and hcross when every host has the same number of members. Collective over c. */
int loom__hier_build(loom_comm_t *c, loom_comm_t *plocal, size_t heap_bytes, const loom_xp_ctx_t *ctx);
/* Destroy c's hlocal and hcross. */
void loom__hier_free(loom_comm_t *c);
/* Does c run collective k hierarchically? Run it (validated, on the calling thread). */
int loom__hier_handles(const loom_comm_t *c, loom_coll_t k);
int loom__hier_run(loom_comm_t *c, const loom_coll_args_t *a);
/* Does the all-reduce's inter-host phase of `bytes` per cross group run MPI's own all-reduce? */
int loom__hier_cross_mpi(const loom_comm_t *c, size_t bytes);
int loom__hier_cross_pipe(const loom_comm_t *c, size_t bytes); /* two hosts: allreduce_pipe (hier.c) */
/* Open sub (members set in world ranks, rank and size set) as a sub-group of the MPI communicator
 * c: on shared memory when every member is on this host, else on MPI with its own hierarchy. */
int loom__hier_open_sub(loom_comm_t *c, loom_comm_t *sub, const char *name, const loom_xp_ctx_t *ctx);

/* ---- request.c: the progress engine ----------------------------------------------------------- */

/* Wait until the lane has no queued or running request (blocking calls use the lanes they touch
 * only after that). */
void loom__comm_lane_drain(loom_comm_t *c, loom_lane_t *l);
/* Wait until no non-blocking collective is queued or running (called by blocking collectives). */
void loom__comm_req_drain(loom_comm_t *c);
/* Run every queued request of c, then stop counting c among the engine's users (the engine thread
 * ends with its last user). */
void loom__comm_req_shutdown(loom_comm_t *c);
/* Queue a validated collective; *req receives the request. */
int loom__comm_req_submit(loom_comm_t *c, const loom_coll_args_t *a, loom_request_t **req);
/* The lane of point-to-point messages to (send != 0) or from peer, or NULL before the first
 * isend/irecv on c. */
loom_lane_t *loom__comm_p2p_lane(loom_comm_t *c, int send, int peer);

/* ---- comm.c, point to point ------------------------------------------------------------------- */

/* Check a point-to-point call's arguments (peer another rank of c); LOOM_OK or LOOM_EINVAL recorded
 * on c, the message prefixed with op. */
int loom__comm_p2p_check(loom_comm_t *c, const char *op, const void *buf, size_t count, loom_dtype_t dt, int peer);
/* Run one validated point-to-point transfer on the calling thread: sbytes to dst and rbytes from
 * src (-1: that direction is unused), both with `tag`; `op` names it in errors. */
int loom__comm_p2p_exec(loom_comm_t *c, const char *op, int dst, const void *sbuf, size_t sbytes, int src,
                        void *rbuf, size_t rbytes, int tag);

#endif
