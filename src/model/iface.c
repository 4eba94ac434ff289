/* iface.c: the model interface (loom/model.h): every call dispatches through the model's (or the
 * configuration's) family table, but the attention FLOP count, computed here from each block's query
 * heads and window so that both families count it one way (MFU, the planner, the pipeline balance). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/model.h"
#include "model/gpt2/model.h"
#include "model/join.h"
#include "model/llama/llama.h"
#include "model/llama/llama_model.h"
#include "model/nanochat/nanochat.h"
#include "model/nanochat/nanochat_model.h"
#include "core/util.h"

const loom_model_family_t *loom_model_family(loom_arch_t arch)
{
	switch (arch) {
	case LOOM_ARCH_GPT2:
		return loom__gpt2_family();
	case LOOM_ARCH_NANOCHAT:
		return loom__nanochat_family();
	case LOOM_ARCH_LLAMA:
		return loom__llama_family();
	}
	return NULL;
}

int loom_arch_parse(const char *name, loom_arch_t *arch)
{
	if (name && strcmp(name, "gpt2") == 0)
		return *arch = LOOM_ARCH_GPT2, LOOM_OK;
	if (name && strcmp(name, "nanochat") == 0)
		return *arch = LOOM_ARCH_NANOCHAT, LOOM_OK;
	if (name && strcmp(name, "llama") == 0)
		return *arch = LOOM_ARCH_LLAMA, LOOM_OK;
	return loom_seterr(LOOM_EINVAL, "model family '%s' is not one of gpt2, nanochat, llama", name ? name : "(null)");
}

const char *loom_arch_name(loom_arch_t arch)
{
	const loom_model_family_t *f = loom_model_family(arch);
	return f ? f->name : "?";
}

/* The family of cfg; NULL (with loom_errmsg) for an arch no family implements. */
static const loom_model_family_t *fam(const loom_model_config_t *cfg)
{
	const loom_model_family_t *f = loom_model_family(cfg->arch);
	if (!f)
		loom_seterr(LOOM_EINVAL, "model configuration: arch %d is not a model family (gpt2, nanochat, llama)", (int)cfg->arch);
	return f;
}

/* cfg with its family's defaults filled in (GPT-2 ignores the other families' fields). */
static loom_model_config_t resolved(const loom_model_config_t *cfg)
{
	loom_model_config_t c = *cfg;
	if (c.arch == LOOM_ARCH_LLAMA) {
		loom__ll_normalize(cfg, &c);
		return c;
	}
	if (c.arch == LOOM_ARCH_GPT2) {
		c.n_kv_head = c.short_window = 0;
		memset(c.window_pattern, 0, sizeof c.window_pattern);
		return c;
	}
	if (c.n_kv_head <= 0)
		c.n_kv_head = c.n_head;
	if (c.short_window <= 0)
		c.short_window = c.seq_len / 2;
	if (!c.window_pattern[0])
		snprintf(c.window_pattern, sizeof c.window_pattern, "SSSL");
	return c;
}

/* The llama fields of two normalized configurations (token ids are metadata: not compared). */
static int llama_equal(const loom_model_config_t *x, const loom_model_config_t *y)
{
	const loom_rope_scaling_t *a = &x->rope_scaling, *b = &y->rope_scaling;
	int rope = a->type == b->type && (a->type == LOOM_ROPE_DEFAULT ||
	                                  (a->factor == b->factor && a->low_freq_factor == b->low_freq_factor &&
	                                   a->high_freq_factor == b->high_freq_factor &&
	                                   a->original_max_position_embeddings == b->original_max_position_embeddings));
	return rope && x->head_dim == y->head_dim && x->intermediate_size == y->intermediate_size &&
	       x->rope_theta == y->rope_theta && x->rms_norm_eps == y->rms_norm_eps &&
	       x->tie_word_embeddings == y->tie_word_embeddings && x->attention_bias == y->attention_bias &&
	       x->qkv_bias == y->qkv_bias && x->mlp_bias == y->mlp_bias && x->qwen2 == y->qwen2;
}

int loom_model_config_equal(const loom_model_config_t *a, const loom_model_config_t *b)
{
	loom_model_config_t x = resolved(a), y = resolved(b);
	return x.arch == y.arch && x.n_layer == y.n_layer && x.n_head == y.n_head && x.n_embd == y.n_embd &&
	       x.seq_len == y.seq_len && x.vocab_size == y.vocab_size && x.n_kv_head == y.n_kv_head &&
	       x.short_window == y.short_window && strcmp(x.window_pattern, y.window_pattern) == 0 &&
	       (x.arch != LOOM_ARCH_LLAMA || llama_equal(&x, &y));
}

int loom_model_config_check(const loom_model_config_t *cfg)
{
	const loom_model_family_t *f = fam(cfg);
	return f ? f->config_check(cfg) : LOOM_EINVAL;
}

int loom_model_num_tensors(const loom_model_config_t *cfg)
{
	const loom_model_family_t *f = fam(cfg);
	return f ? f->num_tensors(cfg) : 0;
}

int loom_model_tensor_info(const loom_model_config_t *cfg, int i, loom_tensor_info_t *info)
{
	const loom_model_family_t *f = fam(cfg);
	return f ? f->tensor_info(cfg, i, info) : LOOM_EINVAL;
}

int loom_model_tensor_index(const loom_model_config_t *cfg, const char *name)
{
	loom_tensor_info_t info;
	int n = loom_model_num_tensors(cfg);
	if (cfg->arch == LOOM_ARCH_GPT2 && strncmp(name, "transformer.", 12) == 0)
		name += 12;
	for (int i = 0; i < n; i++)
		if (loom_model_tensor_info(cfg, i, &info) == LOOM_OK && strcmp(info.name, name) == 0)
			return i;
	return -1;
}

size_t loom_model_num_params(const loom_model_config_t *cfg)
{
	const loom_model_family_t *f = fam(cfg);
	return f ? f->num_params(cfg) : 0;
}

double loom_model_flops_per_token(const loom_model_config_t *cfg, int T)
{
	const loom_model_family_t *f = fam(cfg);
	return f ? f->flops_per_token(cfg, T) : 0;
}

int loom_model_kv_width(const loom_model_config_t *cfg)
{
	const loom_model_family_t *f = fam(cfg);
	return f ? f->kv_width(cfg) : 0;
}

/* ---- attention FLOPs -------------------------------------------------------------------------------
 *
 * A causal attention does, per query, 12 FLOPs per key it sees and channel of its heads (forward: Q K^T
 * and P V, 2 each; backward: dP = dO V^T, dQ = dS K, dK = dS^T Q, dV = P^T dO, 2 each), and the kernels
 * skip every key outside the causal mask and the window. So the count per token is 12 width times the
 * keys per query averaged over the sequence's positions, not over the whole T x T (or T x W) rectangle
 * the reference implementations estimate: with it, MFU cannot pass 100% on long sequences. */

double loom_model_attn_keys(int T, int W)
{
	if (T <= 0 || W < 0)
		return 0.0;
	long long t = T, w = W;
	if (w >= t - 1) /* every query sees its whole prefix: 1 + 2 + ... + T */
		return (double)(t * (t + 1) / 2);
	/* queries 0..W see t + 1 keys ((W+1)(W+2)/2 in all), the T - W - 1 after them W + 1 each:
	 * (W + 1)(2T - W) / 2, an integer (one of W + 1 and 2T - W is even) */
	return (double)((w + 1) * (2 * t - w) / 2);
}

double loom_model_attn_flops(int width, int T, int W)
{
	return T > 0 ? 12.0 * width * loom_model_attn_keys(T, W) / T : 0.0;
}

/* Block l's window W (a query at t sees keys t - W..t): GPT-2 attends over the whole causal prefix;
 * nanochat's blocks take theirs from its window pattern. (The one place here that knows a family's
 * attention: the family table has no window operation, and nanochat's table, nanochat.c, is not this
 * code's to extend.) */
static int block_window(const loom_model_config_t *cfg, int l)
{
	return cfg->arch == LOOM_ARCH_NANOCHAT ? loom__nc_window(cfg, l) : cfg->seq_len;
}

/* Query heads x head_dim: the channels whose keys a block's attention visits (n_embd for GPT-2 and
 * nanochat; Llama's head_dim may differ from n_embd / n_head; GQA shares kv heads, not the queries'
 * work). */
static int attn_width(const loom_model_config_t *cfg)
{
	if (cfg->n_head <= 0)
		return 0;
	if (cfg->arch == LOOM_ARCH_LLAMA && cfg->head_dim > 0)
		return cfg->n_head * cfg->head_dim;
	return cfg->n_head * (cfg->n_embd / cfg->n_head);
}

double loom_model_block_attn_flops(const loom_model_config_t *cfg, int l, int T)
{
	if (!fam(cfg) || l < 0 || l >= cfg->n_layer)
		return 0.0;
	return loom_model_attn_flops(attn_width(cfg), T, block_window(cfg, l));
}

/* The family's count at T = 0 is its 6N alone (no query sees a key); the nominal count adds to it the
 * whole T x min(W, T) rectangle of every block, as the reference implementations do. */
double loom_model_flops_per_token_nominal(const loom_model_config_t *cfg, int T)
{
	const loom_model_family_t *f = fam(cfg);
	if (!f || f->config_check(cfg) != LOOM_OK)
		return 0.0;
	double att = 0.0;
	for (int l = 0; l < cfg->n_layer && T > 0; l++) {
		int w = block_window(cfg, l);
		att += 12.0 * attn_width(cfg) * (w < T ? w : T);
	}
	return f->flops_per_token(cfg, 0) + att;
}

int loom_model_stream_width(const loom_model_config_t *cfg)
{
	const loom_model_family_t *f = fam(cfg);
	return f ? f->stream_width(cfg) : 0;
}

int loom_model_tp_check(const loom_model_config_t *cfg, int tp)
{
	const loom_model_family_t *f = fam(cfg);
	return f ? f->tp_check(cfg, tp) : LOOM_EINVAL;
}

int loom_model_shard_info(const loom_model_config_t *cfg, int tp, int i, loom_tensor_info_t *info)
{
	const loom_model_family_t *f = fam(cfg);
	return f ? f->shard_info(cfg, tp, i, info) : LOOM_EINVAL;
}

size_t loom_model_shard_params(const loom_model_config_t *cfg, int tp)
{
	const loom_model_family_t *f = fam(cfg);
	return f ? f->shard_params(cfg, tp) : 0;
}

void loom_model_tp_shard(const loom_model_config_t *cfg, int tp, int r, const float *full, float *shard)
{
	const loom_model_family_t *f = fam(cfg);
	if (f)
		f->tp_shard(cfg, tp, r, full, shard);
}

void loom_model_tp_unshard(const loom_model_config_t *cfg, int tp, int r, const float *shard, float *full)
{
	const loom_model_family_t *f = fam(cfg);
	if (f)
		f->tp_unshard(cfg, tp, r, shard, full);
}

void loom_model_tp_shard_tensor(const loom_model_config_t *cfg, int tp, int r, int i, const float *full, float *shard)
{
	const loom_model_family_t *f = fam(cfg);
	if (f)
		f->tp_copy_tensor(cfg, tp, r, i, (float *)full, shard, 1); /* full is only read */
}

void loom_model_tp_unshard_tensor(const loom_model_config_t *cfg, int tp, int r, int i, const float *shard, float *full)
{
	const loom_model_family_t *f = fam(cfg);
	if (f)
		f->tp_copy_tensor(cfg, tp, r, i, full, (float *)shard, 0); /* shard is only read */
}

int loom_model_act_bytes(const loom_model_config_t *cfg, const loom_model_opts_t *opts, loom_model_act_bytes_t *out)
{
	const loom_model_family_t *f = fam(cfg);
	return f ? f->act_bytes(cfg, opts, out) : LOOM_EINVAL;
}

void loom_model_unit_tensors(const loom_model_config_t *cfg, int unit, int *first, int *end)
{
	loom_tensor_info_t info;
	int n = loom_model_num_tensors(cfg), i = 0;
	while (i < n && loom_model_tensor_info(cfg, i, &info) == LOOM_OK && info.layer < unit)
		i++;
	*first = i;
	while (i < n && loom_model_tensor_info(cfg, i, &info) == LOOM_OK && info.layer == unit)
		i++;
	*end = i;
}

double loom_model_unit_flops(const loom_model_config_t *cfg, int unit, int T)
{
	const loom_model_family_t *f = fam(cfg);
	if (!f)
		return 0.0;
	if (f->unit_flops)
		return f->unit_flops(cfg, unit, T);
	return loom__model_unit_flops_table(cfg, unit, T);
}

double loom__model_unit_flops_table(const loom_model_config_t *cfg, int unit, int T)
{
	const loom_model_family_t *f = fam(cfg);
	loom_tensor_info_t info;
	double params = 0.0;
	if (!f)
		return 0.0;
	for (int i = 0, n = f->num_tensors(cfg); i < n; i++) {
		if (f->tensor_info(cfg, i, &info) != LOOM_OK || info.ndim != 2)
			continue;
		if ((info.layer == unit && info.opt_group != LOOM_OPT_EMBED) || (unit == cfg->n_layer && info.head_reads))
			params += (double)info.numel;
	}
	return 6.0 * params + loom_model_block_attn_flops(cfg, unit, T);
}

/* ---- a model holding some tensors only (opts.keep), and a join of such models ---------------------
 *
 * The family's model is created without buffers of its own; this layer keeps the packed table of the
 * held tensors and their buffers, and points each held tensor's views into them (the family's
 * set_tensor_view), so the family runs as it always does on the views it has. Every call that names
 * a tensor index or a whole buffer goes through here; a tensor the family reports ready is passed on
 * under its packed index.
 *
 * A join (loom__model_join, model/join.h) is the same table over the union of several such models'
 * tensors ("chunks": an interleaved pipeline rank's stage models), with one packed buffer each for
 * parameters and gradients: a view set on the join is set on every chunk holding the tensor, so the
 * chunks compute on the join's memory, and the calls that are not about tensors go to chunk 0. */
struct join_hook {
	loom_model_t *join;
	int chunk;
};

struct loom__model_local {
	int n, nfull;
	loom_tensor_info_t *ti; /* n: the held tensors, offsets packed */
	int *idx;               /* n: the family's index of each */
	int *rev;               /* nfull: the packed index of each family tensor, or -1 */
	size_t nparams;
	float *params, *grads;  /* the current buffers (NULL: none, or views set tensor by tensor) */
	float *params_own, *grads_own;
	loom_grad_ready_fn ready;
	void *ready_ctx;
	/* a join: its chunks (owned), the first chunk holding each tensor (n), the grad-ready contexts */
	int nchunks;
	loom_model_t **chunks;
	int *first;
	struct join_hook *hooks;
};

/* The model the family's calls go to: a join's first chunk, else the model itself. */
#define IMPL(m) ((m)->local && (m)->local->nchunks ? (m)->local->chunks[0] : (m))

static void local_free(struct loom__model_local *L)
{
	if (!L)
		return;
	loom_free_aligned(L->params_own), loom_free_aligned(L->grads_own);
	free(L->ti), free(L->idx), free(L->rev), free(L->chunks), free(L->first), free(L->hooks);
	free(L);
}

/* Chunk k's packed index of a join's tensor t, or -1 when it does not hold it. */
static int held(const struct loom__model_local *L, int k, int t)
{
	return L->chunks[k]->local->rev[L->idx[t]];
}

/* Point packed tensor t's views (NULL: leave that one as it is). */
static int local_view(loom_model_t *m, int t, float *param, float *grad)
{
	struct loom__model_local *L = m->local;
	if (!L->nchunks)
		return m->family->set_tensor_view(m, L->idx[t], param, grad);
	for (int k = 0; k < L->nchunks; k++) {
		int c = held(L, k, t), rc;
		if (c >= 0 && (rc = loom_model_set_tensor_view(L->chunks[k], c, param, grad)) != LOOM_OK)
			return rc;
	}
	return LOOM_OK;
}

/* Point the held tensors' parameter (grads 0) or gradient (grads 1) views into buf. */
static void local_point(loom_model_t *m, float *buf, int grads)
{
	struct loom__model_local *L = m->local;
	for (int t = 0; t < L->n && buf; t++)
		local_view(m, t, grads ? NULL : buf + L->ti[t].offset, grads ? buf + L->ti[t].offset : NULL);
	if (grads)
		L->grads = buf;
	else
		L->params = buf;
}

static void local_ready(void *ctx, int tensor)
{
	loom_model_t *m = ctx;
	struct loom__model_local *L = m->local;
	int t = tensor >= 0 && tensor < L->nfull ? L->rev[tensor] : -1;
	if (t >= 0 && L->ready)
		L->ready(L->ready_ctx, t);
}

/* A chunk of a join reports its packed tensor c: passed on under the join's index by the tensor's
 * first holder only (model/join.h: the caller runs that chunk's last backward after the others'). */
static void join_ready(void *ctx, int c)
{
	struct join_hook *h = ctx;
	struct loom__model_local *L = h->join->local, *C = L->chunks[h->chunk]->local;
	int t = c >= 0 && c < C->n ? L->rev[C->idx[c]] : -1;
	if (t >= 0 && L->first[t] == h->chunk && L->ready)
		L->ready(L->ready_ctx, t);
}

static int local_create(loom_model_t **out, const loom_model_family_t *f, const loom_model_config_t *cfg,
                        const loom_model_opts_t *opts)
{
	loom_model_opts_t o = *opts;
	struct loom__model_local *L;
	loom_model_t *m;
	int rc, nfull;
	o.keep = NULL, o.no_own_params = 1, o.no_own_grads = 1;
	if ((rc = f->create(&m, cfg, &o)) != LOOM_OK)
		return rc;
	const loom_tensor_info_t *full = f->tensors(m, &nfull);
	if (!(L = loom__calloc(1, sizeof *L)) || !(L->rev = loom__malloc((size_t)nfull * sizeof *L->rev)) ||
	    !(L->ti = loom__calloc((size_t)LOOM_MAX(nfull, 1), sizeof *L->ti)) ||
	    !(L->idx = loom__calloc((size_t)LOOM_MAX(nfull, 1), sizeof *L->idx))) {
		local_free(L);
		f->destroy(m);
		return loom_seterr(LOOM_ENOMEM, "model create: out of memory for the table of the tensors held");
	}
	L->nfull = nfull;
	for (int i = 0; i < nfull; i++) {
		L->rev[i] = -1;
		if (!opts->keep[i])
			continue;
		L->ti[L->n] = full[i];
		L->ti[L->n].offset = L->nparams;
		L->idx[L->n] = i;
		L->rev[i] = L->n++;
		L->nparams += full[i].numel;
	}
	m->local = L;
	size_t bytes = LOOM_MAX(L->nparams, 1) * sizeof(float);
	if ((!opts->no_own_params && !(L->params_own = loom_alloc_aligned(bytes))) ||
	    (!opts->no_own_grads && !(L->grads_own = loom_alloc_aligned(bytes)))) {
		loom_model_destroy(m);
		return loom_seterr(LOOM_ENOMEM, "model create: out of memory for the %zu parameters held", L->nparams);
	}
	if (L->grads_own)
		memset(L->grads_own, 0, bytes);
	local_point(m, L->params_own, 0);
	local_point(m, L->grads_own, 1);
	*out = m;
	return LOOM_OK;
}

int loom__model_join(loom_model_t **out, loom_model_t **chunks, int n)
{
	struct loom__model_local *L = NULL;
	loom_model_t *m = NULL;
	int nfull;
	*out = NULL;
	if (n < 1 || !chunks[0]->local || chunks[0]->local->nchunks)
		return loom_seterr(LOOM_EINVAL, "model join: %d chunk(s); each must be created with opts.keep", n);
	nfull = chunks[0]->local->nfull;
	for (int k = 1; k < n; k++)
		if (!chunks[k]->local || chunks[k]->local->nchunks || chunks[k]->family != chunks[0]->family ||
		    chunks[k]->local->nfull != nfull)
			return loom_seterr(LOOM_EINVAL, "model join: chunk %d is not a model of the same family and table "
			                   "created with opts.keep", k);
	if (!(m = loom__calloc(1, sizeof *m)) || !(L = loom__calloc(1, sizeof *L)) ||
	    !(L->rev = loom__malloc((size_t)nfull * sizeof *L->rev)) ||
	    !(L->ti = loom__calloc((size_t)LOOM_MAX(nfull, 1), sizeof *L->ti)) ||
	    !(L->idx = loom__calloc((size_t)LOOM_MAX(nfull, 1), sizeof *L->idx)) ||
	    !(L->first = loom__calloc((size_t)LOOM_MAX(nfull, 1), sizeof *L->first)) ||
	    !(L->chunks = loom__calloc((size_t)n, sizeof *L->chunks)) ||
	    !(L->hooks = loom__calloc((size_t)n, sizeof *L->hooks)))
		goto oom;
	m->family = chunks[0]->family, m->local = L;
	L->nfull = nfull, L->nchunks = n;
	for (int k = 0; k < n; k++)
		L->chunks[k] = chunks[k], L->hooks[k].join = m, L->hooks[k].chunk = k;
	/* the union of the chunks' tensors in the family's order, which is unit order */
	for (int i = 0; i < nfull; i++) {
		L->rev[i] = -1;
		for (int k = 0; k < n && L->rev[i] < 0; k++) {
			struct loom__model_local *C = chunks[k]->local;
			if (C->rev[i] < 0)
				continue;
			L->ti[L->n] = C->ti[C->rev[i]];
			L->ti[L->n].offset = L->nparams;
			L->idx[L->n] = i, L->first[L->n] = k;
			L->rev[i] = L->n++;
			L->nparams += C->ti[C->rev[i]].numel;
		}
	}
	size_t bytes = LOOM_MAX(L->nparams, 1) * sizeof(float);
	if (!(L->params_own = loom_alloc_aligned(bytes)) || !(L->grads_own = loom_alloc_aligned(bytes)))
		goto oom;
	memset(L->grads_own, 0, bytes);
	for (int t = 0; t < L->n; t++) { /* the values the first holder has, if any */
		const float *p = loom_model_tensor_param(chunks[L->first[t]], held(L, L->first[t], t));
		if (p)
			memcpy(L->params_own + L->ti[t].offset, p, L->ti[t].numel * sizeof(float));
		else
			memset(L->params_own + L->ti[t].offset, 0, L->ti[t].numel * sizeof(float));
	}
	local_point(m, L->params_own, 0);
	local_point(m, L->grads_own, 1);
	*out = m;
	return LOOM_OK;
oom:
	local_free(L);
	free(m);
	return loom_seterr(LOOM_ENOMEM, "model join: out of memory for %d chunks' table and buffers", n);
}

int loom_model_create(loom_model_t **m, const loom_model_config_t *cfg, const loom_model_opts_t *opts)
{
	const loom_model_family_t *f = fam(cfg);
	*m = NULL;
	if (!f)
		return LOOM_EINVAL;
	return opts && opts->keep ? local_create(m, f, cfg, opts) : f->create(m, cfg, opts);
}

void loom_model_destroy(loom_model_t *m)
{
	if (!m)
		return;
	struct loom__model_local *L = m->local;
	if (L && L->nchunks) {
		for (int k = 0; k < L->nchunks; k++)
			loom_model_destroy(L->chunks[k]);
		free(m);
	} else {
		m->family->destroy(m);
	}
	local_free(L);
}

const loom_model_config_t *loom_model_get_config(const loom_model_t *m)
{
	return m->family->config(IMPL(m));
}

int loom_model_set_inputs(loom_model_t *m, int mb, const int *inputs, int B, int T)
{
	return m->family->set_inputs ? m->family->set_inputs(IMPL(m), mb, inputs, B, T) : LOOM_OK;
}

loom_compute_dtype_t loom_model_dtype(const loom_model_t *m)
{
	return m->family->dtype(IMPL(m));
}

const loom_tensor_info_t *loom_model_tensors(const loom_model_t *m, int *n)
{
	if (m->local) {
		if (n)
			*n = m->local->n;
		return m->local->ti;
	}
	return m->family->tensors(m, n);
}

size_t loom_model_param_count(const loom_model_t *m)
{
	return m->local ? m->local->nparams : m->family->param_count(m);
}

float *loom_model_params(loom_model_t *m)
{
	return m->local ? m->local->params : m->family->params(m);
}

float *loom_model_grads(loom_model_t *m)
{
	return m->local ? m->local->grads : m->family->grads(m);
}

int loom_model_set_grad_buffer(loom_model_t *m, float *grads)
{
	if (!m->local)
		return m->family->set_grad_buffer(m, grads);
	if (!grads)
		return loom_seterr(LOOM_EINVAL, "model set_grad_buffer: NULL buffer");
	local_point(m, grads, 1);
	return LOOM_OK;
}

int loom_model_set_param_buffer(loom_model_t *m, float *params)
{
	struct loom__model_local *L = m->local;
	if (!L)
		return m->family->set_param_buffer(m, params);
	if (!params && !L->params_own && !(L->params_own = loom_alloc_aligned(LOOM_MAX(L->nparams, 1) * sizeof(float))))
		return loom_seterr(LOOM_ENOMEM, "model set_param_buffer: out of memory for %zu parameters", L->nparams);
	local_point(m, params ? params : L->params_own, 0);
	return LOOM_OK;
}

void loom_model_drop_params(loom_model_t *m)
{
	struct loom__model_local *L = m ? m->local : NULL;
	if (!L || !L->params_own)
		return;
	if (L->params == L->params_own)
		L->params = NULL;
	loom_free_aligned(L->params_own);
	L->params_own = NULL;
}

int loom_model_own_grads(loom_model_t *m)
{
	struct loom__model_local *L = m->local;
	if (!L)
		return m->family->own_grads(m);
	if (!L->grads_own) {
		if (!(L->grads_own = loom_alloc_aligned(LOOM_MAX(L->nparams, 1) * sizeof(float))))
			return loom_seterr(LOOM_ENOMEM, "model own_grads: out of memory for %zu gradients", L->nparams);
		memset(L->grads_own, 0, LOOM_MAX(L->nparams, 1) * sizeof(float));
	}
	local_point(m, L->grads_own, 1);
	return LOOM_OK;
}

int loom_model_set_tensor_view(loom_model_t *m, int tensor, float *param, float *grad)
{
	struct loom__model_local *L = m->local;
	if (!L)
		return m->family->set_tensor_view(m, tensor, param, grad);
	if (tensor < 0 || tensor >= L->n)
		return loom_seterr(LOOM_EINVAL, "model set_tensor_view: tensor %d out of range [0, %d)", tensor, L->n);
	if (grad)
		L->grads = NULL; /* views tensor by tensor from here on */
	return local_view(m, tensor, param, grad);
}

int loom_model_set_unit_view(loom_model_t *m, int unit, float *params, float *grads)
{
	struct loom__model_local *L = m->local;
	size_t base = SIZE_MAX;
	if (!L)
		return m->family->set_unit_view(m, unit, params, grads);
	/* the unit's held tensors, packed consecutively from its first */
	for (int t = 0; t < L->n; t++) {
		if (L->ti[t].layer != unit)
			continue;
		if (base == SIZE_MAX)
			base = L->ti[t].offset;
		int rc = loom_model_set_tensor_view(m, t, params ? params + (L->ti[t].offset - base) : NULL,
		                                    grads ? grads + (L->ti[t].offset - base) : NULL);
		if (rc != LOOM_OK)
			return rc;
	}
	return LOOM_OK;
}

float *loom_model_tensor_param(loom_model_t *m, int tensor)
{
	struct loom__model_local *L = m->local;
	if (L && L->nchunks)
		return tensor >= 0 && tensor < L->n ? loom_model_tensor_param(L->chunks[L->first[tensor]],
		                                                             held(L, L->first[tensor], tensor))
		                                    : NULL;
	if (L)
		return tensor >= 0 && tensor < L->n ? m->family->tensor_param(m, L->idx[tensor]) : NULL;
	return m->family->tensor_param(m, tensor);
}

float *loom_model_tensor_grad(loom_model_t *m, int tensor)
{
	struct loom__model_local *L = m->local;
	if (L && L->nchunks)
		return tensor >= 0 && tensor < L->n ? loom_model_tensor_grad(L->chunks[L->first[tensor]],
		                                                            held(L, L->first[tensor], tensor))
		                                    : NULL;
	if (L)
		return tensor >= 0 && tensor < L->n ? m->family->tensor_grad(m, L->idx[tensor]) : NULL;
	return m->family->tensor_grad(m, tensor);
}

void loom_model_init(loom_model_t *m, uint64_t seed)
{
	/* Each family draws tensor i from a stream of its own (seed, i) and skips a tensor without memory
	 * behind it: a model holding some tensors (its views point into the packed buffer) gets the whole
	 * model's values of those, and a join its chunks' (a tensor two chunks hold, twice alike). */
	struct loom__model_local *L = m->local;
	if (!L || !L->nchunks)
		m->family->init(IMPL(m), seed);
	else
		for (int k = 0; k < L->nchunks; k++)
			loom_model_init(L->chunks[k], seed);
}

void loom_model_layers(const loom_model_t *m, int *lo, int *hi, int *arenas)
{
	m->family->layers(IMPL(m), lo, hi, arenas);
}

loom_act_ckpt_t loom_model_act_ckpt(const loom_model_t *m)
{
	return m->family->act_ckpt(IMPL(m));
}

int loom_model_sequence_parallel(const loom_model_t *m)
{
	return m->family->sequence_parallel ? m->family->sequence_parallel(IMPL(m)) : 0;
}

long long loom_model_recomputes(const loom_model_t *m)
{
	const struct loom__model_local *L = m->local;
	long long n = 0;
	for (int k = 0; L && k < L->nchunks; k++)
		n += loom_model_recomputes(L->chunks[k]);
	return L && L->nchunks ? n : m->family->recomputes(m);
}

void loom_model_model_act_bytes(const loom_model_t *m, loom_model_act_bytes_t *out)
{
	const struct loom__model_local *L = m->local;
	if (!L || !L->nchunks) {
		m->family->model_act_bytes(m, out);
		return;
	}
	memset(out, 0, sizeof *out); /* a join's: the sum of its chunks' */
	for (int k = 0; k < L->nchunks; k++) {
		loom_model_act_bytes_t c;
		loom_model_model_act_bytes(L->chunks[k], &c);
		out->kept += c.kept, out->recompute += c.recompute, out->per_layer += c.per_layer;
		out->head += c.head, out->backward += c.backward, out->total += c.total;
	}
}

int loom_model_forward(loom_model_t *m, const int *inputs, const int *targets, int B, int T, float *loss)
{
	return m->family->forward(IMPL(m), inputs, targets, B, T, loss);
}

const float *loom_model_logits(const loom_model_t *m)
{
	return m->family->logits(IMPL(m));
}

void loom_model_zero_grad(loom_model_t *m)
{
	struct loom__model_local *L = m->local;
	for (int k = 0; L && k < L->nchunks; k++)
		loom_model_zero_grad(L->chunks[k]);
	if (!L || !L->nchunks)
		m->family->zero_grad(m);
}

int loom_model_forward_backward(loom_model_t *m, const int *inputs, const int *targets, int B, int T, float grad_scale, float *loss)
{
	return m->family->forward_backward(IMPL(m), inputs, targets, B, T, grad_scale, loss);
}

void loom_model_on_grad_ready(loom_model_t *m, loom_grad_ready_fn fn, void *ctx)
{
	struct loom__model_local *L = m->local;
	if (!L) {
		m->family->on_grad_ready(IMPL(m), fn, ctx);
		return;
	}
	L->ready = fn, L->ready_ctx = ctx;
	for (int k = 0; k < L->nchunks; k++)
		loom_model_on_grad_ready(L->chunks[k], fn ? join_ready : NULL, fn ? &L->hooks[k] : NULL);
	if (!L->nchunks)
		m->family->on_grad_ready(m, fn ? local_ready : NULL, fn ? m : NULL);
}

void loom_model_on_param_use(loom_model_t *m, loom_param_use_fn fn, void *ctx)
{
	struct loom__model_local *L = m->local;
	for (int k = 0; L && k < L->nchunks; k++)
		loom_model_on_param_use(L->chunks[k], fn, ctx);
	if (!L || !L->nchunks)
		m->family->on_param_use(m, fn, ctx);
}

void loom_model_on_tp_reduce(loom_model_t *m, loom_tp_reduce_fn fn, void *ctx)
{
	struct loom__model_local *L = m->local;
	for (int k = 0; L && k < L->nchunks; k++)
		loom_model_on_tp_reduce(L->chunks[k], fn, ctx);
	if (!L || !L->nchunks)
		m->family->on_tp_reduce(m, fn, ctx);
}

void loom_model_on_cp_reduce(loom_model_t *m, loom_tp_reduce_fn fn, void *ctx)
{
	struct loom__model_local *L = m->local;
	for (int k = 0; L && k < L->nchunks; k++)
		loom_model_on_cp_reduce(L->chunks[k], fn, ctx);
	if (!L || !L->nchunks)
		m->family->on_cp_reduce(m, fn, ctx);
}

int loom_model_cp_size(const loom_model_t *m)
{
	return m->family->cp_size(IMPL(m));
}

int loom_model_cp_rank(const loom_model_t *m)
{
	return m->family->cp_rank(IMPL(m));
}

int loom__cp_opts_check(const char *who, const char *len_name, const loom_model_config_t *cfg,
                        const loom_model_opts_t *o)
{
	int cp = o->cp_size ? o->cp_size : 1;
	if (cp < 1 || o->cp_rank < 0 || o->cp_rank >= cp)
		return loom_seterr(LOOM_EINVAL, "%s create: context-parallel rank %d of %d (expected 0 <= rank < size)", who,
		                   o->cp_rank, cp);
	if (cp > 1 && (o->T % 2 != 0 || (long)o->T * cp > cfg->seq_len))
		return loom_seterr(LOOM_EINVAL, "%s create: context parallel over %d ranks: each holds %d rows of a "
		                   "sequence of %ld positions (expected an even number, and cp x rows <= %s %d)", who, cp,
		                   o->T, (long)o->T * cp, len_name, cfg->seq_len);
	if (cp > 1 && loom__cp_ring_env() < 0)
		return loom_seterr(LOOM_EINVAL, "%s create: %s", who, loom_errmsg());
	if (loom__flash_bf16_env() < 0) /* the attention kernel's precision option, read by every pass */
		return loom_seterr(LOOM_EINVAL, "%s create: %s", who, loom_errmsg());
	return LOOM_OK;
}

int loom_cp_check(int T, int N)
{
	if (N < 1)
		return loom_seterr(LOOM_EINVAL, "context parallel: %d ranks (expected >= 1)", N);
	if (T < 2 * N || T % (2 * N) != 0)
		return loom_seterr(LOOM_EINVAL, "context parallel: the sequence length %d is not divisible by 2 x cp = %d "
		                   "(each of the %d ranks holds 2 chunks of T/(2 cp) positions: the head-tail layout); "
		                   "choose --seq-len a multiple of %d", T, 2 * N, N, 2 * N);
	return LOOM_OK;
}

int loom_cp_attention_ring(void)
{
	return loom__cp_ring_env();
}

int loom_cp_position(int T, int N, int K, int r, int t)
{
	return loom__cp_pos(t, T / N, N, r, K);
}

void loom_cp_take(int *dst, const int *src, int B, int T, int N, int K, int r)
{
	int Tl = T / N;
	for (int b = 0; b < B; b++)
		for (int t = 0; t < Tl; t++)
			dst[(size_t)b * Tl + t] = src[(size_t)b * T + loom__cp_pos(t, Tl, N, r, K)];
}

double loom__cp_rank_keys(int T, int N, int K, int r, int W)
{
	int w = W < 0 ? T : W;
	if (N <= 1)
		return loom_model_attn_keys(T, w);
	int c = T / (N * K);
	double keys = 0.0;
	for (int h = 0; h < K; h++) {
		int j = loom__cp_chunk(N, r, h);
		keys += loom_model_attn_keys((j + 1) * c, w) - loom_model_attn_keys(j * c, w);
	}
	return keys;
}

/* The layout's choice: the causal mask alone is balanced by any K (each segment's head-tail pairs sum
 * to the same keys), but a window is not: with nanochat's short window T/2, head-tail (K = 2) gives
 * rank 0 of 2 the chunks 0 and 3 (keys 0.5 + 2 in units of c^2 on a windowed layer) and rank 1 the
 * chunks 1 and 2 (1.5 + 2), while K = 4 cuts the sequence into two halves of 4 chunks, each balanced
 * on its own (the first half is causal for every query, the second sees W keys per query). So every K
 * the sequence allows (2, 4, 8) is counted over the blocks' windows, and the most loaded rank decides;
 * a larger K must lighten it by more than 1% (its smaller chunks cost more kernel calls and merges). */
int loom_cp_chunks(const loom_model_config_t *cfg, int T, int N)
{
	if (N <= 1)
		return 1;
	int best = 2;
	double least = -1.0;
	for (int K = 2; K <= LOOM_CP_MAX_CHUNKS && T % (N * K) == 0; K *= 2) {
		double most = 0.0;
		for (int r = 0; r < N; r++) {
			double keys = 0.0;
			for (int l = 0; fam(cfg) && l < cfg->n_layer; l++)
				keys += loom__cp_rank_keys(T, N, K, r, block_window(cfg, l));
			most = most > keys ? most : keys;
		}
		if (least < 0.0 || most < 0.99 * least)
			best = K, least = most;
	}
	return best;
}

int loom_model_embed_forward(loom_model_t *m, int mb, const int *inputs, int B, int T)
{
	return m->family->embed_forward(IMPL(m), mb, inputs, B, T);
}

int loom_model_block_forward(loom_model_t *m, int mb, int l, int B, int T)
{
	return m->family->block_forward(IMPL(m), mb, l, B, T);
}

int loom_model_head_forward(loom_model_t *m, int mb, const int *targets, int B, int T, float *loss)
{
	return m->family->head_forward(IMPL(m), mb, targets, B, T, loss);
}

int loom_model_head_forward_backward(loom_model_t *m, int mb, const int *targets, int B, int T, float grad_scale, float *loss)
{
	return m->family->head_forward_backward(IMPL(m), mb, targets, B, T, grad_scale, loss);
}

int loom_model_head_forward_backward_rows(loom_model_t *m, int mb, const int *targets, int B, int T, int row0, int rows, float grad_scale, float *loss)
{
	return m->family->head_forward_backward_rows(IMPL(m), mb, targets, B, T, row0, rows, grad_scale, loss);
}

int loom_model_block_backward(loom_model_t *m, int mb, int l, int B, int T)
{
	return m->family->block_backward(IMPL(m), mb, l, B, T);
}

int loom_model_embed_backward(loom_model_t *m, int mb, const int *inputs, int B, int T)
{
	return m->family->embed_backward(IMPL(m), mb, inputs, B, T);
}

float *loom_model_block_input(loom_model_t *m, int mb, int l)
{
	return m->family->block_input(IMPL(m), mb, l);
}

float *loom_model_stream_grad(loom_model_t *m)
{
	return m->family->stream_grad(IMPL(m));
}

int loom_model_tp_size(const loom_model_t *m)
{
	return m->family->tp_size(IMPL(m));
}

int loom_model_tp_rank(const loom_model_t *m)
{
	return m->family->tp_rank(IMPL(m));
}

int loom_model_kv_cache_alloc(loom_model_t *m)
{
	return m->family->kv_cache_alloc(IMPL(m));
}

int loom_model_generate(loom_model_t *m, const int *prompt, int n_prompt, int max_new, float temperature, int top_k, uint64_t seed, int stop_token, int *out, int *n_out, void (*on_token)(void *ctx, int token), void *ctx)
{
	return m->family->generate(IMPL(m), prompt, n_prompt, max_new, temperature, top_k, seed, stop_token, out, n_out, on_token, ctx);
}

void loom_model_profile(loom_model_t *m, int enable)
{
	m->family->profile(IMPL(m), enable);
}

void loom_model_profile_report(loom_model_t *m, void *file, int steps)
{
	m->family->profile_report(IMPL(m), file, steps);
}

size_t loom_model_act_formula(const loom_model_t *m, int B, int T, const char **text)
{
	const struct loom__model_local *L = m->local;
	size_t n = 0;
	if (!m->family->act_formula) {
		*text = "(no formula)";
		return 0;
	}
	if (!L || !L->nchunks)
		return m->family->act_formula(m, B, T, text);
	for (int k = 0; k < L->nchunks; k++) /* a join's: the sum of its chunks' */
		n += m->family->act_formula(L->chunks[k], B, T, text);
	return n;
}
