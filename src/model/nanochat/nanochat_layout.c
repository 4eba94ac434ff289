/* nanochat_layout.c: nanochat's configuration (defaults, checks, base_train's --depth sizing), its
 * parameter table (names, shapes, offsets, units, optimizer groups, tensor-parallel splits), its
 * FLOP estimate and its tensor-parallel shards.
 *
 * The table is computed, not stored: tensor i of a configuration is found by walking the units, so a
 * caller may ask for one entry without building the rest. Units come in order (-1, 0, ..., L) and a
 * unit's tensors are contiguous, as loom/model.h requires. Within a block the order is the one in
 * which the backward finalizes gradients, reversed (nanochat_model.h). */
#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "core/util.h"
#include "model/nanochat/nanochat_model.h"

void loom__nc_normalize(const loom_model_config_t *cfg, loom_model_config_t *out)
{
	*out = *cfg;
	out->arch = LOOM_ARCH_NANOCHAT;
	if (out->n_kv_head == 0)
		out->n_kv_head = out->n_head;
	if (out->short_window == 0)
		out->short_window = out->seq_len / 2;
	if (out->window_pattern[0] == '\0')
		snprintf(out->window_pattern, sizeof out->window_pattern, "SSSL");
	for (char *c = out->window_pattern; *c; c++)
		*c = (char)toupper((unsigned char)*c);
}

int loom__nc_config_check(const loom_model_config_t *cfg)
{
	loom_model_config_t c;
	if (!memchr(cfg->window_pattern, '\0', sizeof cfg->window_pattern))
		return loom_seterr(LOOM_EINVAL, "nanochat config: window_pattern is not terminated within %d characters",
		                   LOOM_WINDOW_PATTERN_MAX - 1);
	loom__nc_normalize(cfg, &c);
	if (c.n_layer <= 0 || c.n_head <= 0 || c.n_embd <= 0 || c.seq_len <= 0 || c.vocab_size <= 0 ||
	    c.n_kv_head <= 0)
		return loom_seterr(LOOM_EINVAL, "nanochat config: n_layer %d, n_head %d, n_kv_head %d, n_embd %d, sequence_len "
		                   "%d, vocab_size %d (each must be positive)", c.n_layer, c.n_head, c.n_kv_head, c.n_embd,
		                   c.seq_len, c.vocab_size);
	if (c.n_embd % c.n_head != 0)
		return loom_seterr(LOOM_EINVAL, "nanochat config: n_embd %d is not divisible by n_head %d", c.n_embd, c.n_head);
	if (c.n_head % c.n_kv_head != 0)
		return loom_seterr(LOOM_EINVAL, "nanochat config: n_head %d is not divisible by n_kv_head %d (each kv head "
		                   "serves n_head / n_kv_head query heads)", c.n_head, c.n_kv_head);
	if ((c.n_embd / c.n_head) % 2 != 0)
		return loom_seterr(LOOM_EINVAL, "nanochat config: head_dim %d (n_embd / n_head) is odd; rotary embeddings "
		                   "rotate its two halves", c.n_embd / c.n_head);
	if (c.n_embd < NC_GATE_CH)
		return loom_seterr(LOOM_EINVAL, "nanochat config: n_embd %d is below the %d channels the value-embedding gate "
		                   "reads", c.n_embd, NC_GATE_CH);
	if (c.short_window < 0)
		return loom_seterr(LOOM_EINVAL, "nanochat config: short_window %d is negative", c.short_window);
	for (const char *p = c.window_pattern; *p; p++)
		if (*p != 'S' && *p != 'L')
			return loom_seterr(LOOM_EINVAL, "nanochat config: window_pattern '%s' has '%c' (only S, short, and L, "
			                   "long, are allowed)", cfg->window_pattern, *p);
	if ((size_t)c.vocab_size + NC_VOCAB_PAD > (size_t)1 << 30)
		return loom_seterr(LOOM_EINVAL, "nanochat config: vocab_size %d is too large", c.vocab_size);
	return LOOM_OK;
}

int loom__nc_dims(const loom_model_config_t *cfg, int tp, nc_dims_t *d)
{
	loom_model_config_t c;
	loom__nc_normalize(cfg, &c);
	memset(d, 0, sizeof *d);
	d->L = c.n_layer, d->NH = c.n_head, d->NKV = c.n_kv_head, d->C = c.n_embd;
	d->D = c.n_head > 0 ? c.n_embd / c.n_head : 0;
	d->T = c.seq_len, d->V = c.vocab_size;
	d->Vp = (c.vocab_size + NC_VOCAB_PAD - 1) / NC_VOCAB_PAD * NC_VOCAB_PAD;
	d->H = 4 * c.n_embd;
	d->tp = tp > 0 ? tp : 1;
	d->nh = d->NH / d->tp, d->nkv = d->NKV / d->tp, d->hid = d->H / d->tp, d->vl = d->Vp / d->tp;
	return LOOM_OK;
}

int loom__nc_window(const loom_model_config_t *cfg, int l)
{
	loom_model_config_t c;
	loom__nc_normalize(cfg, &c);
	if (l == c.n_layer - 1)
		return c.seq_len;
	char ch = c.window_pattern[l % (int)strlen(c.window_pattern)];
	return ch == 'S' ? c.short_window : c.seq_len;
}

static int layer_ntensors(int l, int L)
{
	return loom__nc_has_ve(l, L) ? NC_LAYER_MAX : NC_LAYER_MAX - 2;
}

int loom__nc_num_tensors(const loom_model_config_t *cfg)
{
	int n = NC_EMBED_TENSORS + 1;
	for (int l = 0; l < cfg->n_layer; l++)
		n += layer_ntensors(l, cfg->n_layer);
	return n;
}

int loom__nc_lt(const loom_model_config_t *cfg, int l, int j)
{
	int L = cfg->n_layer, i = NC_EMBED_TENSORS;
	for (int k = 0; k < l; k++)
		i += layer_ntensors(k, L);
	if (loom__nc_has_ve(l, L))
		return i + j;
	return j <= NC_GATE ? -1 : i + j - 2;
}

void loom__nc_unit_range(const loom_model_config_t *cfg, int u, int *first, int *end)
{
	int L = cfg->n_layer;
	if (u < 0) {
		*first = 0, *end = NC_EMBED_TENSORS;
	} else if (u >= L) {
		*first = loom__nc_num_tensors(cfg) - 1, *end = *first + 1;
	} else {
		*first = loom__nc_lt(cfg, u, loom__nc_has_ve(u, L) ? NC_VE : NC_Q);
		*end = *first + layer_ntensors(u, L);
	}
}

/* Fill info's shape-dependent fields: a 2-D [rows, cols] tensor, split along tp_dim (-1 whole). */
static void mat(loom_tensor_info_t *t, size_t rows, size_t cols, int tp_dim, int tp, loom_opt_group_t g)
{
	t->ndim = 2;
	t->shape[0] = rows, t->shape[1] = cols;
	t->decay = 1;
	t->tp_dim = tp_dim;
	t->tp_kind = tp_dim < 0 ? LOOM_TP_WHOLE : LOOM_TP_SPLIT;
	if (tp_dim >= 0)
		t->shape[tp_dim] /= (size_t)tp;
	t->numel = t->shape[0] * t->shape[1];
	t->opt_group = g;
	t->transposed = 0;
	t->rows = (int)t->shape[0], t->cols = (int)t->shape[1];
}

static void vec(loom_tensor_info_t *t, size_t n, loom_opt_group_t g)
{
	t->ndim = 1;
	t->shape[0] = n, t->shape[1] = 0;
	t->numel = n;
	t->decay = 0;
	t->tp_dim = -1;
	t->tp_kind = LOOM_TP_WHOLE;
	t->opt_group = g;
	t->rows = t->cols = 0;
	t->all_blocks = 1;
}

/* Tensor j (NC_*) of block l, whole-model or one shard's shape; offset not set. */
static void layer_tensor(const nc_dims_t *d, int l, int j, loom_tensor_info_t *t)
{
	size_t C = (size_t)d->C, KV = (size_t)d->NKV * d->D;
	memset(t, 0, sizeof *t);
	t->layer = l;
	switch (j) {
	case NC_VE:
		snprintf(t->name, sizeof t->name, "value_embeds.%d.weight", l);
		mat(t, (size_t)d->Vp, KV, 1, d->tp, LOOM_OPT_EMBED);
		break;
	case NC_GATE:
		snprintf(t->name, sizeof t->name, "transformer.h.%d.attn.ve_gate.weight", l);
		mat(t, (size_t)d->NKV, NC_GATE_CH, 0, d->tp, LOOM_OPT_MATRIX);
		break;
	case NC_Q:
		snprintf(t->name, sizeof t->name, "transformer.h.%d.attn.c_q.weight", l);
		mat(t, (size_t)d->NH * d->D, C, 0, d->tp, LOOM_OPT_MATRIX);
		break;
	case NC_K:
		snprintf(t->name, sizeof t->name, "transformer.h.%d.attn.c_k.weight", l);
		mat(t, KV, C, 0, d->tp, LOOM_OPT_MATRIX);
		break;
	case NC_V:
		snprintf(t->name, sizeof t->name, "transformer.h.%d.attn.c_v.weight", l);
		mat(t, KV, C, 0, d->tp, LOOM_OPT_MATRIX);
		break;
	case NC_O:
		snprintf(t->name, sizeof t->name, "transformer.h.%d.attn.c_proj.weight", l);
		mat(t, C, (size_t)d->NH * d->D, 1, d->tp, LOOM_OPT_MATRIX);
		break;
	case NC_FC:
		snprintf(t->name, sizeof t->name, "transformer.h.%d.mlp.c_fc.weight", l);
		mat(t, (size_t)d->H, C, 0, d->tp, LOOM_OPT_MATRIX);
		break;
	default:
		snprintf(t->name, sizeof t->name, "transformer.h.%d.mlp.c_proj.weight", l);
		mat(t, C, (size_t)d->H, 1, d->tp, LOOM_OPT_MATRIX);
		break;
	}
}

/* Tensor i of a tp-way shard (tp 1: the whole model), offsets in that shard's buffer. */
static int info_tp(const loom_model_config_t *cfg, int tp, int i, loom_tensor_info_t *t)
{
	nc_dims_t d;
	loom_tensor_info_t tmp;
	int n = loom__nc_num_tensors(cfg);
	if (i < 0 || i >= n)
		return loom_seterr(LOOM_EINVAL, "nanochat tensor_info: tensor %d out of range [0, %d)", i, n);
	loom__nc_dims(cfg, tp, &d);
	size_t off = 0;
	int k = 0;
	/* the embedding unit */
	for (int j = 0; j < NC_EMBED_TENSORS; j++, k++) {
		memset(t, 0, sizeof *t);
		t->layer = -1;
		if (j == NC_WTE) {
			snprintf(t->name, sizeof t->name, "transformer.wte.weight");
			mat(t, (size_t)d.Vp, (size_t)d.C, 0, d.tp, LOOM_OPT_EMBED);
		} else {
			snprintf(t->name, sizeof t->name, j == NC_RESID ? "resid_lambdas" : "x0_lambdas");
			vec(t, (size_t)d.L, j == NC_RESID ? LOOM_OPT_SCALAR : LOOM_OPT_X0);
		}
		t->offset = off;
		if (k == i)
			return LOOM_OK;
		off += t->numel;
	}
	for (int l = 0; l < d.L; l++) {
		int j0 = loom__nc_has_ve(l, d.L) ? NC_VE : NC_Q;
		if (i >= k + (NC_LAYER_MAX - j0)) { /* skip the whole layer */
			for (int j = j0; j < NC_LAYER_MAX; j++) {
				layer_tensor(&d, l, j, &tmp);
				off += tmp.numel;
			}
			k += NC_LAYER_MAX - j0;
			continue;
		}
		for (int j = j0; j < NC_LAYER_MAX; j++, k++) {
			layer_tensor(&d, l, j, t);
			t->offset = off;
			if (k == i)
				return LOOM_OK;
			off += t->numel;
		}
	}
	memset(t, 0, sizeof *t);
	snprintf(t->name, sizeof t->name, "lm_head.weight");
	t->layer = d.L;
	mat(t, (size_t)d.Vp, (size_t)d.C, 0, d.tp, LOOM_OPT_UNEMBED);
	t->offset = off;
	return LOOM_OK;
}

int loom__nc_tensor_info(const loom_model_config_t *cfg, int i, loom_tensor_info_t *info)
{
	return info_tp(cfg, 1, i, info);
}

int loom__nc_shard_info(const loom_model_config_t *cfg, int tp, int i, loom_tensor_info_t *info)
{
	return info_tp(cfg, tp, i, info);
}

size_t loom__nc_shard_params(const loom_model_config_t *cfg, int tp)
{
	loom_tensor_info_t t;
	if (info_tp(cfg, tp, loom__nc_num_tensors(cfg) - 1, &t) != LOOM_OK)
		return 0;
	return t.offset + t.numel;
}

size_t loom__nc_num_params(const loom_model_config_t *cfg)
{
	return loom__nc_shard_params(cfg, 1);
}

int loom__nc_stream_width(const loom_model_config_t *cfg)
{
	return 2 * cfg->n_embd;
}

/* FLOPs per token as the kernels must do them: 6 x the parameters outside wte, the value embeddings and
 * the scalars (estimate_flops' 6N), plus per layer 12 NH D x the keys a query sees on average inside
 * the causal mask and the layer's window, loom_model_attn_flops (T: the sequence length trained on).
 * estimate_flops' own 12 NH D min(W_l, T), the whole rectangle, is loom_model_flops_per_token_nominal's. */
double loom__nc_flops_per_token(const loom_model_config_t *cfg, int T)
{
	nc_dims_t d;
	loom__nc_dims(cfg, 1, &d);
	double n = (double)loom__nc_num_params(cfg);
	n -= (double)d.Vp * d.C + 2.0 * d.L;
	for (int l = 0; l < d.L; l++)
		if (loom__nc_has_ve(l, d.L))
			n -= (double)d.Vp * d.NKV * d.D;
	double att = 0.0;
	for (int l = 0; l < d.L; l++)
		att += loom_model_attn_flops(d.NH * d.D, T, loom__nc_window(cfg, l));
	return 6.0 * n + att;
}

int loom__nc_tp_check(const loom_model_config_t *cfg, int tp)
{
	nc_dims_t d;
	int rc;
	if ((rc = loom__nc_config_check(cfg)) != LOOM_OK)
		return rc;
	if (tp <= 1)
		return LOOM_OK;
	loom__nc_dims(cfg, tp, &d);
	if (d.NKV % tp != 0)
		return loom_seterr(LOOM_EINVAL, "nanochat tensor parallel: n_kv_head %d is not divisible by tp %d (attention "
		                   "is split by kv-head groups)", d.NKV, tp);
	if (d.Vp % tp != 0)
		return loom_seterr(LOOM_EINVAL, "nanochat tensor parallel: the padded vocabulary %d is not divisible by tp %d",
		                   d.Vp, tp);
	return LOOM_OK;
}

int loom_nanochat_depth_config(int depth, int aspect_ratio, int head_dim, int seq_len, int vocab_size,
                               loom_model_config_t *cfg)
{
	memset(cfg, 0, sizeof *cfg);
	aspect_ratio = aspect_ratio ? aspect_ratio : 64;
	head_dim = head_dim ? head_dim : 128;
	if (depth <= 0 || aspect_ratio <= 0 || head_dim <= 0 || seq_len <= 0 || vocab_size <= 0 || head_dim % 2)
		return loom_seterr(LOOM_EINVAL, "nanochat depth config: depth %d, aspect ratio %d, head_dim %d, sequence_len "
		                   "%d, vocab_size %d (each must be positive, head_dim even)", depth, aspect_ratio, head_dim,
		                   seq_len, vocab_size);
	long base = (long)depth * aspect_ratio, C = (base + head_dim - 1) / head_dim * head_dim;
	if (C > (1L << 20))
		return loom_seterr(LOOM_EINVAL, "nanochat depth config: model dim %ld is too large", C);
	cfg->arch = LOOM_ARCH_NANOCHAT;
	cfg->n_layer = depth;
	cfg->n_embd = (int)C;
	cfg->n_head = cfg->n_kv_head = (int)(C / head_dim);
	cfg->seq_len = seq_len;
	cfg->vocab_size = vocab_size;
	snprintf(cfg->window_pattern, sizeof cfg->window_pattern, "SSSL");
	return LOOM_OK;
}
