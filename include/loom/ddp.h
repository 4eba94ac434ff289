/* loom/ddp.h: data-parallel gradient averaging for a GPT-2 model (PyTorch DDP's reducer).
 *
 * Gradients move into the communicator's shared memory (so the all-reduce is single-copy) and are
 * grouped into buckets of consecutive tensors, filled in reverse tensor order as backward produces
 * them; the first bucket is small (about 1 MiB) so communication starts early. Each bucket's
 * all-reduce (average) starts, non-blocking, as soon as its last gradient is final, and overlaps the
 * rest of backward; loom_ddp_wait() waits for all of them before the optimizer step. On accumulation
 * micro-steps before the last, nothing is communicated (loom_ddp_set_sync(d, 0): PyTorch's no_sync).
 *
 * Memory: the loom_ddp_t owns its gradient storage (shared memory when possible) and, at create,
 * points the model's gradient view at it (loom_model_set_grad_buffer; the current gradient values are
 * kept). It never takes over the model's own buffer. From create to destroy the gradients are at
 * loom_ddp_grads(d) (= loom_model_grads(model)); a gradient pointer taken before create is the model's
 * own buffer, which is not updated meanwhile. Do not re-point the model's gradient view while a
 * loom_ddp_t is attached.
 *
 * Not thread-safe: one training thread drives a loom_ddp_t. Destroy the loom_ddp_t before its model
 * and before the communicator: destroying it points the model's gradient view back at its own buffer
 * (copying the current values there) and removes the grad-ready callback, so the model stays usable
 * on its own. */
#ifndef LOOM_DDP_H
#define LOOM_DDP_H

#include <stddef.h>
#include <stdint.h>

#include "loom/comm.h"
#include "loom/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct loom_ddp loom_ddp_t;

typedef struct {
	double comm_ms;         /* time the step's all-reduces ran (on the progress thread) */
	double exposed_comm_ms; /* time the training thread waited for them (not hidden by backward) */
	int buckets;            /* all-reduces issued this step */
} loom_ddp_stats_t;

/* bucket_mb: bucket size in MiB (PyTorch's default 25); first_bucket_mb: the first (last layers)
 * bucket's size (PyTorch's 1). Registers the model's grad-ready callback and points the model's
 * gradient view at the reducer's storage (see Memory above). Not collective. Returns LOOM_OK,
 * LOOM_EINVAL (bucket sizes not > 0) or LOOM_ENOMEM; on failure *d is NULL and the model is
 * untouched. */
int loom_ddp_create(loom_ddp_t **d, loom_comm_t *comm, loom_model_t *model, double bucket_mb, double first_bucket_mb);
/* Waits for any all-reduce still in flight, detaches from the model (see above), frees everything.
 * Safe on NULL. */
void loom_ddp_destroy(loom_ddp_t *d);

/* 1 (default): the next micro-step's gradients are averaged across ranks as they are produced.
 * 0: accumulate locally, communicate nothing (micro-steps before the last of an accumulation). */
void loom_ddp_set_sync(loom_ddp_t *d, int sync);

/* Wait for every bucket all-reduce of this micro-step; fills *st (may be NULL). An error when a
 * bucket was never started (a gradient was not reported) or an all-reduce failed. */
int loom_ddp_wait(loom_ddp_t *d, loom_ddp_stats_t *st);

/* Broadcast the parameters from rank 0, then verify on every rank that its copy matches rank 0's
 * checksum; LOOM_EMISMATCH naming the ranks that differ. */
int loom_ddp_broadcast_params(loom_ddp_t *d);
/* Compare parameter checksums across ranks; LOOM_EMISMATCH naming the ranks whose copy differs. */
int loom_ddp_check_replicas(loom_ddp_t *d);

/* Checksum of n floats (64-bit, order-sensitive, bit-exact). */
uint64_t loom_checksum_f32(const float *x, size_t n);

/* The buckets: bucket b covers gradient floats [*offset, *offset + *count) (tensors in reverse order:
 * bucket 0 holds the last tensors). Returns the number of buckets; with b out of range, nothing is
 * written (nor with NULL pointers). */
int loom_ddp_bucket(const loom_ddp_t *d, int b, size_t *offset, size_t *count);
/* 1 when the gradients live in shared memory (single-copy all-reduce). */
int loom_ddp_zero_copy(const loom_ddp_t *d);
/* The gradient storage (owned by d; loom_model_param_count floats, the model's layout), valid until
 * loom_ddp_destroy. */
float *loom_ddp_grads(loom_ddp_t *d);
/* What the all-reduces send: LOOM_FLOAT32 (default) or LOOM_BFLOAT16, in which each bucket is
 * rounded to bf16 (nearest even) into a staging buffer of d's as it is launched, reduced in float32
 * by the collective (the sum rounded to bf16 once per step of the algorithm), and widened back into
 * the gradients when loom_ddp_wait sees it done: half the bytes, and every rank still gets the same
 * bits. Set it between steps, on every rank alike. LOOM_EINVAL for another dtype, LOOM_ENOMEM. */
int loom_ddp_set_reduce_dtype(loom_ddp_t *d, loom_dtype_t dt);

#ifdef __cplusplus
}
#endif
#endif
