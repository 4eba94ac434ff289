/* limits.h: the memory a training rank will need, estimated before anything is allocated, the limits
 * the process runs under, and the check of the one against the other that says what would fit.
 *
 * One memory model: `loom train` checks it before it allocates, and a planner (`loom plan`) asks the
 * same functions about configurations it has not run. The model is model-agnostic: the caller says how
 * many parameters the rank holds, how large the units ZeRO stages or gathers whole are, and how to get
 * the activation bytes of a micro-batch (the model's own layout arithmetic, e.g. loom_model_act_bytes).
 *
 * Not thread-safe only in that loom_mem_limits_read reads files; all functions are reentrant. */
#ifndef LOOM_LIMITS_H
#define LOOM_LIMITS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What a rank will run. */
typedef struct {
	size_t nparams;      /* parameters of the model this rank computes on (a tp shard, a pp stage) */
	size_t emb_params;   /* of the embedding unit, which ZeRO-2/3 stage (and ZeRO-3 gathers) whole */
	size_t block_params; /* of the largest other unit (a block) */
	int B, T, accum;     /* micro-batch (sequences, tokens each) and micro-batches per step */
	int act_ckpt;        /* activation checkpointing (loom_act_ckpt_t) */
	int zero, dp;        /* ZeRO stage and data-parallel ranks */
	int threads;         /* compute threads */
	int local_ranks;     /* ranks of the job on this host: they share MemAvailable, the cgroup, /dev/shm */
	size_t heap_bytes;   /* the shared heap per rank (LOOM_SHM_MB), 0 without one */
	int openblas;        /* the fp32 GEMMs run on OpenBLAS (a buffer per thread) rather than oneDNN */
	/* Activation bytes of the model for micro-batch B x T with checkpointing mode act_ckpt (kept,
	 * recompute, head and backward scratch); 0 on success. */
	int (*act_bytes)(void *ctx, int B, int act_ckpt, size_t *bytes);
	void *ctx;
} loom_mem_plan_t;

/* Bytes a rank will allocate from here on. */
typedef struct {
	size_t model_states;  /* parameters, gradients, AdamW moments as the ZeRO stage keeps them (ZeRO-3: plus
	                       * the whole initial parameters until they are sharded) */
	const char *formula;  /* "16P", "4P + 12P/N", ... (static) */
	size_t activations;   /* the model's activation buffers */
	size_t scratch;       /* BLAS/oneDNN per-thread scratch (OpenBLAS: its buffer per thread) and thread stacks */
	size_t comm;          /* the strategy's communication buffers (DDP/ZeRO-1 gradients, ZeRO-2/3 staging) */
	size_t in_heap;       /* of comm, what the shared heap holds (it is mapped already: no new address space) */
	size_t total;         /* resident memory to come: the sum of the four */
	size_t address_space; /* new address space: total - in_heap, OpenBLAS's buffers counted whole */
} loom_mem_estimate_t;

/* The estimate for plan p; LOOM_OK, or p->act_bytes's failure (LOOM_EINVAL). */
int loom_mem_estimate(const loom_mem_plan_t *p, loom_mem_estimate_t *e);
/* Bytes of model states (fp32 parameters, gradients, AdamW moments) one of dp data-parallel ranks keeps
 * at ZeRO stage zero (0-3) for nparams parameters: 16P, 8P + 8P/N, 4P + 12P/N, 16P/N; *formula (may
 * be NULL) gets that text (static). 0 and "?" for another stage. */
size_t loom_mem_zero_states(int zero, size_t nparams, int dp, const char **formula);

/* Room for new allocations under each limit the process can see; SIZE_MAX where there is none. */
typedef struct {
	size_t as_limit, as_room;     /* RLIMIT_AS, minus VmSize */
	size_t data_limit, data_room; /* RLIMIT_DATA, minus VmData */
	size_t cg_limit, cg_room;     /* the memory cgroup's limit, minus its usage */
	char cg_file[640];            /* the file the cgroup limit came from ("" when none) */
	size_t mem_available;         /* MemAvailable of /proc/meminfo */
	size_t shm_free;              /* free bytes of /dev/shm */
} loom_mem_limits_t;

/* Read the limits under root (NULL or "": the real /): ROOT/proc/self/limits ("Max address space",
 * "Max data size"), ROOT/proc/self/status (VmSize, VmData), ROOT/proc/self/cgroup and the cgroup's
 * memory.max + memory.current (v2) or memory.limit_in_bytes + memory.usage_in_bytes (v1) under
 * ROOT/sys/fs/cgroup (a limit inherited from an ancestor cgroup counts too), ROOT/proc/meminfo and
 * ROOT/dev/shm. A file that cannot be read means no limit. LOOM_OK. */
int loom_mem_limits_read(const char *root, loom_mem_limits_t *l);

/* The verdict of loom_mem_check. */
typedef struct {
	int fits;            /* 1 when the estimate fits every limit */
	size_t need, room;   /* of the tightest limit that does not fit */
	int address_space;   /* 1 when that limit is RLIMIT_AS or RLIMIT_DATA (per process), 0 for memory */
	char message[2048];  /* the estimate, the limit and where it came from, and what would fit */
} loom_mem_check_t;

/* Check plan p against limits l (the heap bounded by /dev/shm's free space shared by the host's
 * ranks); LOOM_OK (out->fits says the verdict) or the estimate's error. When
 * it does not fit, out->message names the estimate, the limit and its source, and the changes that
 * would fit, each estimated the same way: --zero N, --activation-checkpointing, a smaller
 * --batch-size with more accumulation (the same tokens per step), fewer --threads, LOOM_GEMM=onednn
 * instead of OpenBLAS, LOOM_SHM_MB. */
int loom_mem_check(const loom_mem_plan_t *p, const loom_mem_limits_t *l, loom_mem_check_t *out);

/* The memory cgroup's OOM-kill count (v2 memory.events "oom_kill", v1 memory.oom_control "oom_kill")
 * of this process's cgroup under root (as loom_mem_limits_read), or -1 when it cannot be read. */
long long loom_mem_oom_kills(const char *root);

#ifdef __cplusplus
}
#endif
#endif
