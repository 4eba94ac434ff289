/* family_check.h: the model-family contract checked once for every family (tests/family_check.c),
 * through loom/model.h only: external views, the param-use hook gathering units, KV-cache sampling
 * against the full forward, bf16 near fp32, allocation failures, and two tensor-parallel ranks as two
 * threads; plus the small utilities the family tests share (a seeded generator, token batches, the
 * float64 reference's files). Each check returns 0 or 1 as a TEST does (test.h's CHECK* macros). */
#ifndef LOOM_TEST_FAMILY_CHECK_H
#define LOOM_TEST_FAMILY_CHECK_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "loom/model.h"

/* A family test's parameters: init with seed, then made non-degenerate (the family's own rule). */
typedef void (*fc_params_fn)(loom_model_t *m, uint64_t seed);

uint32_t fc_lcg(uint32_t *s);
float fc_urand(uint32_t *s); /* uniform in [-1, 1) */
/* n input and n target ids in [0, V), from seed. */
void fc_make_tokens(int *in, int *tg, int n, int V, uint32_t seed);
/* dir/name written from p (n bytes): 0 or -1; read back as n doubles (malloc'd; NULL on failure). */
int fc_write_file(const char *dir, const char *name, const void *p, size_t n);
double *fc_read_f64(const char *dir, const char *name, size_t n);

/* The hooks recorded: grad-ready's tensor order, param-use's (unit, phase); ctx an fc_hooks_t. */
typedef struct {
	int order[512], n;
	int uses[512][2], nuse;
} fc_hooks_t;
void fc_on_ready(void *ctx, int i);
void fc_on_use(void *ctx, int unit, int phase);

/* Grad-ready fires once per tensor in strictly decreasing order (the model has want_tensors), param-use
 * (unit, phase) as GPT-2's (every unit forward, then backward in reverse); two micro-steps of half the
 * scale equal one. */
int fc_hooks_order(const loom_model_config_t *c, fc_params_fn params, int want_tensors);
/* The unit calls on two interleaved arenas, and the head split in two row ranges, give the whole-model
 * pass's losses and gradients; errors name the family, the call and the token. */
int fc_units_arenas_rows(const loom_model_config_t *c, fc_params_fn params);
/* blocks and selective checkpointing: losses and gradients bit-identical to none (whole passes and units
 * on two arenas), one recompute per block backward, the bytes kept as the layout says. */
int fc_act_ckpt_bit_identical(const loom_model_config_t *c, fc_params_fn params);
/* A model with no buffers of its own, every unit pointed at caller memory, trains exactly as one with
 * its own; zero_grad clears split views. */
int fc_views_external(const loom_model_config_t *c, fc_params_fn params);
/* ZeRO-3's use of the hooks: a model with no parameters of its own; before each block or the head runs,
 * the hook fills one shared buffer with that unit's parameters (NaN first, so a read through a stale
 * view shows) and points the unit's views at it; the embedding unit (which the head or every block may
 * read) stays pointed at the master copy. Losses and gradients equal a plain model's bit for bit. */
int fc_param_use_gathers_units(const loom_model_config_t *c, fc_params_fn params);
/* Greedy sampling from a 3-token prompt to T = 16 (vocab_size <= 128): the KV cache's logits at every
 * generated position within tol (relative: tol x max(1, |logit|)) of a full forward's over the context
 * there, the tokens their argmax; the same seed samples the same tokens, top_k 1 is greedy, a stop token
 * ends early; a bad prompt is refused naming the family. */
int fc_generate_matches_forward(const loom_model_config_t *c, fc_params_fn params, float tol, int relative);
/* bf16 matmuls: the loss within 1% of fp32's (and not equal), the gradients within 5% of their norm. */
int fc_bf16_close_to_fp32(const loom_model_config_t *c, fc_params_fn params);
/* Every allocation of create and of the KV cache failing in turn: a clean LOOM_ENOMEM, nothing leaked
 * (under ASan), then a model that works. */
int fc_alloc_failures_clean(const loom_model_config_t *c);

/* ---- two tensor-parallel ranks as two threads of this process ---------------------------------------- */

enum { FC_TP_SCRATCH = 1 << 20 };

typedef struct {
	pthread_barrier_t bar;
	float *slot[2];
	float *scratch[2];
	long calls[2];
} fc_tp_group_t;

typedef struct {
	fc_tp_group_t *g;
	int rank, rc;
	loom_model_t *m;
	const int *in, *tg;
	int B, T;
	float loss, loss_fwd;
} fc_tp_rank_t;

/* The group's operations (loom/model.h), ctx an fc_tp_rank_t: both ranks publish their buffer, each
 * computes the result from both (the same bits on both) into its scratch, and copies it back once both
 * have read. */
int fc_tp_reduce(void *ctx, float *buf, size_t n, loom_tp_op_t op);
/* A rank's thread: forward, then forward_backward, on its model (rc, loss_fwd, loss). */
void *fc_tp_run(void *arg);
/* Two tp ranks (sp: with sequence parallelism) against one process: a shard's init is the whole model's
 * at its positions; the loss and every gradient (the shards put back together) within 1e-5 of each
 * tensor's largest, the ranks' group operations paired; blocks checkpointing changes no bit. */
int fc_tp2_matches_one_process(const loom_model_config_t *c, fc_params_fn params, int sp);

#endif
