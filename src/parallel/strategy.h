/* strategy.h: what the trainer may ask of a parallel strategy, and nothing more (internal to src/).
 *
 * A strategy decides where the training state (parameters, gradients, AdamW moments) lives across
 * the ranks of the data-parallel axis and how gradients and parameters move between them. The
 * trainer (src/train/trainer.c) calls only the operations below, never asks which strategy it has,
 * and drives one step as
 *
 *     set_sync(0) ... forward_backward ... finish_grads    (accumulation micro-steps before the last)
 *     set_sync(1)     forward_backward     finish_grads    (the last micro-step)
 *     grad_norm -> clip scale -> optim_step
 *
 * with sync_params before the first step (and after a resume), check_replicas, save and load when
 * the run loop says so. Every operation marked collective is called on every rank of the
 * data-parallel axis in the same order.
 *
 * Memory: a strategy owns the gradient storage it needs and points the model's gradient view at it
 * once, at attach (loom_model_set_grad_buffer); `grads` below is that storage, valid until destroy.
 * Nothing else may re-point the model's gradient view while a strategy is attached; destroy points
 * it back at the model's own buffer (with the current values). `params` is the model's parameter
 * buffer. Callers take both from here after attach and cache nothing across attach/destroy.
 *
 * Ownership: each rank owns (updates, and keeps AdamW moments for) the floats [own_offset,
 * own_offset + own_count) of the flat parameter buffer; `opt` covers exactly that range (its m and v
 * are own_count floats, loom_adamw_init_model_range). For DDP and local every rank owns everything.
 *
 * Adding a strategy: a file src/parallel/NAME.c that states its invariant at its top and fills a
 * loom_strategy_ops_t, a row in strategy.c's table (the rule that maps the trainer's `strategy` and
 * `zero` settings to it), and a test that checks the invariant. */
#ifndef LOOM_PARALLEL_STRATEGY_H
#define LOOM_PARALLEL_STRATEGY_H

#include <stddef.h>
#include <stdint.h>

#include "loom/ckpt.h"
#include "loom/comm.h"
#include "loom/ddp.h"
#include "loom/model.h"
#include "loom/muon.h"
#include "loom/optim.h"

typedef struct loom_strategy loom_strategy_t;

/* What the trainer attaches a strategy with (everything borrowed; must outlive the strategy). */
typedef struct {
	const char *name;     /* "ddp" (NULL: "ddp") */
	int zero;             /* ZeRO stage: 0 (ddp/local), 1, 2 or 3 (zero.c) */
	loom_model_t *model;
	loom_comm_t *dp;      /* the data-parallel axis, or NULL for one data-parallel rank */
	loom_comm_t *tp;      /* the tensor-parallel axis, or NULL for one tensor-parallel rank */
	int writer;           /* 1 on the rank that writes checkpoints (global rank 0) */
	loom_adamw_config_t adamw;
	double bucket_mb;     /* gradient bucket size (MiB); the first bucket min(1, bucket_mb) */
	loom_dtype_t grad_reduce_dtype; /* what gradient all-reduces send: LOOM_FLOAT32 or LOOM_BFLOAT16 */
	/* NULL, or per tensor of the model: 1 for a copy of a tensor another pipeline stage owns (the tied
	 * wte on the head stages): left out of the gradient norm, so each tensor counts once. */
	const unsigned char *norm_skip;
	/* NULL, or per tensor: 1 when the executor sums its gradient with other stages' before the data-
	 * parallel reduction (the pipeline's tied and shared tensors; it then calls finish_grads): a strategy
	 * that shards gradients over dp reduces the units holding such tensors in finish_grads only, their
	 * gradients accumulated over the step's micro-steps. */
	const unsigned char *deferred;
	/* The optimizer: LOOM_OPTIMIZER_ADAMW (`adamw` above over every tensor) or LOOM_OPTIMIZER_MUON
	 * (MuonAdamW with `muon`; local and ddp only, muon_opt.c; optim_step's lr is then the schedule's
	 * multiplier of every group's rate). */
	int optimizer;
	loom_muon_config_t muon;
} loom_strategy_config_t;

/* Communication of one step's gradients, as loom_ddp_stats_t. */
typedef struct {
	double comm_ms;         /* time the step's gradient collectives ran (on the progress thread) */
	double exposed_comm_ms; /* of which the training thread waited for */
} loom_strategy_stats_t;

typedef struct {
	const char *name;
	/* Create and attach to cfg->model (point its gradient view at the strategy's storage, register
	 * hooks, allocate the optimizer for the owned range). Not collective. *s NULL on failure. */
	int (*create)(loom_strategy_t **s, const loom_strategy_config_t *cfg);
	/* Detach (the model gets its own gradient buffer back, with the current values) and free.
	 * Waits for anything in flight. Safe on NULL via loom__strategy_destroy. */
	void (*destroy)(loom_strategy_t *s);
	/* 1: the next micro-step's gradients are combined across ranks; 0: accumulate locally (no_sync). */
	void (*set_sync)(loom_strategy_t *s, int sync);
	/* After a micro-step's backward: wait for its in-flight gradient communication; fills *st. */
	int (*finish_grads)(loom_strategy_t *s, loom_strategy_stats_t *st);
	/* The global L2 norm of the gradients: the sum of squares of the owned part, combined across the
	 * ranks that own disjoint parts. Collective when parts are disjoint. */
	int (*grad_norm)(loom_strategy_t *s, double *norm);
	/* AdamW over the owned part with gradient grads * grad_scale; then whatever makes every rank's
	 * parameters current again: done on return, or (ZeRO) started here and finished by the time the
	 * model next uses a unit (its param-use hook waits) or the next sync_params, check_replicas, save
	 * or optim_step; read `params` directly only after one of those. Collective when parts are
	 * disjoint. */
	int (*optim_step)(loom_strategy_t *s, float lr, float grad_scale);
	/* Make every rank's parameters rank 0's and verify (checksums). Collective. */
	int (*sync_params)(loom_strategy_t *s);
	/* LOOM_EMISMATCH naming the ranks whose replicated state differs. Collective. */
	int (*check_replicas)(loom_strategy_t *s);
	/* Write the model and optimizer state into the checkpoint w: on the writer w is begun (w->active);
	 * on the other ranks it names the same checkpoint (w->tmp) without being active, and a strategy
	 * whose state is sharded writes its part there (once a collective tells it the writer has begun);
	 * NULL on a writer that could not begin it. Collective. */
	int (*save)(loom_strategy_t *s, const loom_ckpt_writer_t *w);
	/* Read this rank's part of the model and optimizer state from the committed checkpoint dir,
	 * whichever strategy and world size wrote it; AdamW's step becomes `step`. Not collective. */
	int (*load)(loom_strategy_t *s, const char *dir, long long step);
	/* Optional (NULL: loom__strategy_export / _import alone): the strategy's part around them (ZeRO
	 * settles its parameter gathers first, and at stage 3 marks its shard as loaded). */
	int (*export_state)(loom_strategy_t *s, float *p, float *m, float *v);
	int (*import_state)(loom_strategy_t *s, const float *p, const float *m, const float *v, long long step);
} loom_strategy_ops_t;

/* The part every strategy has; implementations embed it as their first member. */
struct loom_strategy {
	const loom_strategy_ops_t *ops;
	loom_model_t *model;
	loom_model_config_t mcfg;
	loom_comm_t *dp;              /* NULL with one data-parallel rank */
	int dp_rank, dp_size;
	int writer;
	float *params, *grads;        /* the full flat buffers (see Memory above) */
	size_t nparams;
	size_t own_offset, own_count; /* the owned range */
	loom_adamw_t opt;             /* over the owned range (AdamW; empty under MuonAdamW) */
	loom_muonadamw_t *muon;       /* MuonAdamW instead (--optimizer muon), else NULL (muon_opt.c) */
	const size_t *shard_off;      /* ZeRO: rank q owns [shard_off[q], shard_off[q + 1]); NULL: the default
	                                 rule, loom__zero_shard_offset */
	struct loom__muon_plan *muon_plan;
	const unsigned char *norm_skip; /* the config's: tensors left out of the gradient norm, or NULL */
	/* The gradient of the owned range (own_count floats; after the last finish_grads of a step, the
	 * averaged one). grads + own_offset where a full gradient buffer exists; a strategy that keeps
	 * only its shard (ZeRO-2) has grads NULL and this pointing at the shard. */
	float *own_grads;
	/* The parameters of the owned range (own_count floats): params + own_offset, or, when no whole
	 * parameter buffer is kept (ZeRO-3: params NULL), the rank's shard. */
	float *own_params;
	/* 1 when every forward pass communicates (ZeRO-3 gathers parameters): every rank must then run
	 * the same passes, e.g. as many evaluation forwards (the trainer pads with a discarded one). */
	int collective_forward;
	struct {
		size_t params, grads, optim; /* bytes this rank keeps of each (the model states) */
		size_t comm;                 /* staging and communication buffers the strategy allocated */
	} mem;
};

/* The strategies' tables (local.c, ddp.c; static data behind functions, so that the archive exports
 * no data symbols); strategy.c's table picks among them. */
const loom_strategy_ops_t *loom__local_strategy(void);
const loom_strategy_ops_t *loom__ddp_strategy(void);
const loom_strategy_ops_t *loom__tp_strategy(void);

/* d (n) = s (n) rounded to bf16 (nearest even, NaN kept), and d (n) = s (n) widened back: the staging of a
 * bf16 gradient reduction (ddp.c, zero.c); OpenMP-parallel over large n. */
void loom__grad_to_bf16(uint16_t *d, const float *s, size_t n);
void loom__grad_from_bf16(float *d, const uint16_t *s, size_t n);

const loom_strategy_ops_t *loom__zero1_strategy(void);
const loom_strategy_ops_t *loom__zero2_strategy(void);
const loom_strategy_ops_t *loom__zero3_strategy(void);
/* ZeRO-3's count of block units whose parameters were gathered (or in flight) at once, at most, and
 * of gathers issued (*gathers, may be NULL); for tests. */
int loom__zero_gathered_peak(const loom_strategy_t *s, unsigned long long *gathers);
/* ZeRO-3: the shards were just loaded from a checkpoint (the initial parameters are not used). */
void loom__zero_set_loaded(loom_strategy_t *s);

/* ZeRO's owned-range rule (zero.c): where rank `rank` of `size` starts owning floats of a flat buffer of
 * nparams; rank == size gives nparams. */
size_t loom__zero_shard_offset(size_t nparams, int rank, int size);
/* Checkpoints of a strategy whose AdamW state is sharded over the data-parallel axis (zero_ckpt.c):
 * save is collective: every rank writes its shard of the moments into w->tmp, the writer (data-
 * parallel rank 0, w->active) the whole parameters and the index zero.json; load reads this rank's
 * slice of everything from a checkpoint of any world size or stage, DDP's included. */
int loom__sharded_save(loom_strategy_t *s, const loom_ckpt_writer_t *w, int stage);
/* The two collectives around a checkpoint every data-parallel rank writes a part of (zero_ckpt.c): begin
 * tells every rank whether the writer (writer 1 on it) has begun w (*go 1: write your part; 0 with
 * LOOM_OK on the writer, LOOM_EIO elsewhere: nobody writes); end makes a failure of any rank (rc) the
 * failure of all, once every part is complete. `who` prefixes the messages. Collective over dp. */
int loom__ckpt_part_begin(loom_strategy_t *s, int writer, const loom_ckpt_writer_t *w, const char *who, int *go);
int loom__ckpt_part_end(loom_strategy_t *s, int rc, const char *who);
int loom__sharded_load(loom_strategy_t *s, const char *dir, long long step);

/* MuonAdamW in the replica strategies (muon_opt.c): init (DistMuon's ownership over the data-parallel
 * ranks), free (safe twice), step (the owners' updates, then one all-gather of the matrices), and
 * checkpoints that resume on any number of ranks. */
int loom__muon_init(loom_strategy_t *s, const loom_strategy_config_t *cfg);
void loom__muon_free(loom_strategy_t *s);
int loom__muon_step(loom_strategy_t *s, float lr_multiplier, float grad_scale);
int loom__muon_save(loom_strategy_t *s, const loom_ckpt_writer_t *w);
int loom__muon_load(loom_strategy_t *s, const char *dir, long long step);
/* The ZeRO side: this rank's state file (moments of its range, its matrices) into dir; the state of
 * what this rank owns from a checkpoint's muon_r*.safetensors (any world size, with or without ZeRO);
 * whether dir holds MuonAdamW state; the file name of a rank's. */
int loom__muon_write_shard(loom_strategy_t *s, const char *dir);
/* ZeRO's side of the partition: rank q's first float under MuonAdamW for a table t of n tensors (the
 * default rule's, moved up to the next tensor boundary, so no matrix is cut; `loom plan` counts with
 * it too), and MuonAdamW over the rank's range [own_offset, + own_count) (its AdamW floats and the
 * matrices inside it). */
size_t loom__muon_shard_offset(const loom_tensor_info_t *t, int n, size_t nparams, int q, int N);
/* The Muon matrices starting in [range[0], range[1]) of the table (a ZeRO rank's), into out; how many. */
int loom__muon_range_matrices(const loom_tensor_info_t *t, int n, const size_t *range, int *out);
int loom__muon_init_range(loom_strategy_t *s, const loom_strategy_config_t *cfg);
int loom__muon_load_state(loom_strategy_t *s, const char *dir, long long step);
int loom__muon_has_state(const char *dir);
void loom__muon_state_name(char *buf, size_t cap, int rank);

/* A checkpoint's whole state, whichever strategy and mesh wrote it (DDP's optim.safetensors, ZeRO's
 * shards listed in zero.json): the parameters into p and the AdamW moments into m, v, each the whole
 * model's flat layout (loom_model_num_params(c) floats; any of them NULL: not read). LOOM_EMISMATCH for
 * another model or a MuonAdamW checkpoint (with m, v). Not collective. */
int loom__read_whole_state(const char *dir, const loom_model_config_t *c, float *p, float *m, float *v);
/* The range [off, off + n) of that whole state into p, m, v (n floats each; any NULL: not read):
 * every tensor's (or ZeRO shard's) overlap with it, so a pipeline stage reads only what it holds. The
 * parameters must be F32 (as loom writes them). Not collective. */
int loom__read_state_range(const char *dir, const loom_model_config_t *c, size_t off, size_t n, float *p, float *m,
                           float *v);
/* LOOM_EMISMATCH naming both when the checkpoint's model file holds another model than c (its reading
 * errors otherwise); LOOM_OK when it is c's. */
int loom__check_ckpt_model(const char *file, const loom_model_config_t *c);

/* A tensor-parallel group as the strategies use it: the model's reduction over it (loom__tp_group_reduce,
 * the hook of loom_model_on_tp_reduce with the group as its context), the time its all-reduces took
 * since the last take, and the check that the tensors it keeps whole are the same on every rank. The
 * trainer gives a model its context-parallel group's hook the same way (loom_model_on_cp_reduce), with
 * `name` "context parallel" for the messages. */
typedef struct {
	loom_comm_t *comm; /* NULL: one rank */
	int rank, size;
	double ms;
	const char *name; /* the axis in messages (init: "tensor parallel") */
	loom_request_t *ring[4]; /* the ring transfers started and not yet waited for (LOOM_TP_SEND_NEXT...) */
	int nring;
} loom__tp_group_t;
void loom__tp_group_init(loom__tp_group_t *g, loom_comm_t *comm);
int loom__tp_group_reduce(void *ctx, float *buf, size_t n, loom_tp_op_t op);
double loom__tp_group_take_ms(loom__tp_group_t *g);
/* LOOM_EMISMATCH naming the tp ranks whose whole (tp_dim < 0) tensors of params differ from rank 0's.
 * Collective over the group (LOOM_OK at once for one rank). */
int loom__tp_check_whole(const loom__tp_group_t *g, const loom_tensor_info_t *tensors, int ntensors, const float *params);
/* Where loom__tp_write_stream takes this rank's shard of the table's tensor t of state `which` (0 the
 * parameters, 1 m, 2 v): LOOM_OK and *shard (the shard table's numel floats, read before the next
 * call), or an error with its message. It is asked for every tensor, in file order. */
typedef int (*loom__tp_shard_fn)(void *ctx, int which, int t, const float **shard);
/* A checkpoint's model.safetensors and optim.safetensors streamed from the group's shards: tp rank 0
 * writes them tensor by tensor (with its w active; without, it still takes part), a split tensor
 * unsharded from the shards the other ranks send it in file order, so no rank holds more than its
 * shard and one tensor. Collective over the group (after one agreement, so a failed allocation leaves
 * none waiting). */
int loom__tp_write_stream(const loom__tp_group_t *g, const loom_model_config_t *c, loom__tp_shard_fn get, void *ctx,
                          const loom_ckpt_writer_t *w);
/* loom__tp_write_stream from whole shard buffers (p, m, v, each laid out as the model's shard table). */
int loom__tp_write_whole(const loom__tp_group_t *g, const loom_model_config_t *c, const float *p, const float *m,
                         const float *v, const loom_ckpt_writer_t *w);
/* This tp rank's shard (the shard table's layout) of a checkpoint's whole state, into p, m, v (any
 * NULL: not read), reading one full tensor at a time. Not collective. */
int loom__tp_read_shard(const loom__tp_group_t *g, const char *dir, const loom_model_config_t *c, float *p, float *m,
                        float *v);
/* This rank's shard of the table's tensors idx[k], k < n (idx NULL: tensor k), of a checkpoint's whole
 * state into p, m, v (any NULL: not read) at offset at[k].offset (at NULL: the shard table's), reading
 * one full tensor at a time (what a pipeline stage holds, into its packed layout). Not collective. */
int loom__tp_read_tensors(const loom__tp_group_t *g, const char *dir, const loom_model_config_t *c, int n,
                          const int *idx, const loom_tensor_info_t *at, float *p, float *m, float *v);

/* The model's whole state as this rank's strategy holds it, into buffers of the model's table layout
 * (nparams floats each; any NULL: not wanted): the parameters, AdamW's moments; gathered over the
 * data-parallel ranks where each owns a range. Collective over dp (the same calls on every rank).
 * LOOM_ENOTSUP for the moments under MuonAdamW (its state is per matrix). */
int loom__strategy_export(loom_strategy_t *s, float *p, float *m, float *v);
/* The reverse, not collective: this rank keeps its owned range of p, m, v (whole-table layout) and
 * AdamW's step becomes `step`. */
int loom__strategy_import(loom_strategy_t *s, const float *p, const float *m, const float *v, long long step);
/* The whole state where this rank holds all of it as loom__strategy_export would give it (DDP, one
 * rank), without a copy: the strategy's own buffers, to read, or to fill as loom__strategy_import
 * would (then import with NULL buffers sets the step). LOOM_ENOTSUP (no message) when it is sharded or
 * settled by the strategy (ZeRO), or under MuonAdamW. Not collective. */
int loom__strategy_state_views(loom_strategy_t *s, float **p, float **m, float **v);
/* The two without the strategy's own part (what export_state / import_state call around it). */
int loom__strategy_export_owned(loom_strategy_t *s, float *p, float *m, float *v);
int loom__strategy_import_owned(loom_strategy_t *s, const float *p, const float *m, const float *v, long long step);

/* Pick the strategy for cfg by the table in strategy.c (LOOM_ENOTSUP naming what exists for an
 * unknown name or a ZeRO stage not implemented) and create it. */
int loom__strategy_create(loom_strategy_t **s, const loom_strategy_config_t *cfg);
void loom__strategy_destroy(loom_strategy_t *s); /* safe on NULL */
/* What the model needs of its own under the strategy the table picks for (name, zero, dp ranks, tp
 * ranks): *no_own_grads / *no_own_params 1 when the strategy keeps that storage itself (ZeRO-2's
 * gradient shard, ZeRO-3's parameter shard), for loom_model_opts_t. Both 0 for no row. */
void loom__strategy_model_opts(const char *name, int zero, int dp, int tp, int *no_own_grads, int *no_own_params);
/* The table as text, one line per row: "ddp zero=0 ranks=1: local: ..." (for docs and errors). */
void loom__strategy_describe(char *buf, size_t cap);

/* Helpers for strategies whose every rank holds the whole state (local, ddp): fill the common part
 * (params, grads given, own range = everything, the optimizer), and the whole-state operations. */
int loom__replica_init(loom_strategy_t *s, const loom_strategy_config_t *cfg, float *grads);
void loom__replica_free(loom_strategy_t *s);
int loom__replica_grad_norm(loom_strategy_t *s, double *norm);
int loom__replica_optim_step(loom_strategy_t *s, float lr, float grad_scale);
int loom__replica_save(loom_strategy_t *s, const loom_ckpt_writer_t *w);
int loom__replica_load(loom_strategy_t *s, const char *dir, long long step);

#endif
