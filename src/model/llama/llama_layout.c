/* llama_layout.c: the Llama / Qwen2 family's configuration (defaults, checks), its parameter table
 * (transformers' names and shapes, offsets, units, weight decay, optimizer groups, tensor-parallel
 * splits), its FLOP counts, the rotary frequencies, and its tensor-parallel shards.
 *
 * The table is computed, not stored: every block has the same tensors (which biases exist is the
 * configuration's), so tensor i is found by arithmetic. Units come in order (-1 the embedding, blocks
 * 0..L-1, L the head: final norm and, untied, lm_head) and a unit's tensors are contiguous, as
 * loom/model.h requires. Names and shapes are transformers' (nn.Linear's [out, in]), so a Hugging Face
 * directory maps onto the table tensor by tensor. A tied head (tie_word_embeddings) has no lm_head:
 * the head reads model.embed_tokens.weight (head_reads), whose gradient is then the embedding's and
 * the head's. Tensor parallelism is Megatron's: q, k, v, gate and up split by output rows (q by query
 * heads, k and v by kv heads, in contiguous groups, so a rank's query heads read its own kv heads),
 * o and down by input columns, the embedding and lm head by vocabulary rows; norms and the biases
 * added after a row-parallel sum (o, down) are whole on every rank. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/util.h"
#include "loom/llama.h"
#include "model/llama/llama_model.h"

int loom__ll_default_intermediate(int C)
{
	long h = (8L * C + 2) / 3;
	return (int)((h + 255) / 256 * 256);
}

void loom__ll_normalize(const loom_model_config_t *cfg, loom_model_config_t *out)
{
	*out = *cfg;
	out->arch = LOOM_ARCH_LLAMA;
	if (out->n_kv_head == 0)
		out->n_kv_head = out->n_head;
	if (out->head_dim == 0 && out->n_head > 0)
		out->head_dim = out->n_embd / out->n_head;
	if (out->intermediate_size == 0)
		out->intermediate_size = loom__ll_default_intermediate(out->n_embd);
	if (out->rope_theta == 0.0)
		out->rope_theta = 10000.0;
	if (out->rms_norm_eps == 0.0)
		out->rms_norm_eps = 1e-6;
	out->tie_word_embeddings = out->tie_word_embeddings != 0;
	out->attention_bias = out->attention_bias != 0;
	out->qkv_bias = out->qkv_bias != 0;
	out->mlp_bias = out->mlp_bias != 0;
	out->qwen2 = out->qwen2 != 0;
}

int loom__ll_config_check(const loom_model_config_t *cfg)
{
	loom_model_config_t c;
	loom__ll_normalize(cfg, &c);
	if (c.n_layer <= 0 || c.n_head <= 0 || c.n_embd <= 0 || c.seq_len <= 0 || c.vocab_size <= 0 || c.n_kv_head <= 0)
		return loom_seterr(LOOM_EINVAL, "llama config: num_hidden_layers %d, num_attention_heads %d, "
		                   "num_key_value_heads %d, hidden_size %d, max_position_embeddings %d, vocab_size %d (each must "
		                   "be positive)", c.n_layer, c.n_head, c.n_kv_head, c.n_embd, c.seq_len, c.vocab_size);
	if (cfg->head_dim == 0 && c.n_embd % c.n_head != 0)
		return loom_seterr(LOOM_EINVAL, "llama config: hidden_size %d is not divisible by num_attention_heads %d "
		                   "(give head_dim)", c.n_embd, c.n_head);
	if (c.head_dim <= 0 || c.head_dim % 2 != 0)
		return loom_seterr(LOOM_EINVAL, "llama config: head_dim %d must be positive and even (rotary embeddings "
		                   "pair channel j with j + head_dim/2)", c.head_dim);
	if (c.n_head % c.n_kv_head != 0)
		return loom_seterr(LOOM_EINVAL, "llama config: num_attention_heads %d is not divisible by num_key_value_heads "
		                   "%d (each kv head serves num_attention_heads / num_key_value_heads query heads)", c.n_head,
		                   c.n_kv_head);
	if (c.intermediate_size <= 0)
		return loom_seterr(LOOM_EINVAL, "llama config: intermediate_size %d must be positive", c.intermediate_size);
	if (!(c.rope_theta > 0.0) || !isfinite(c.rope_theta))
		return loom_seterr(LOOM_EINVAL, "llama config: rope_theta %g must be positive and finite", c.rope_theta);
	if (!(c.rms_norm_eps > 0.0) || !isfinite(c.rms_norm_eps))
		return loom_seterr(LOOM_EINVAL, "llama config: rms_norm_eps %g must be positive and finite", c.rms_norm_eps);
	if (c.short_window != 0 || c.window_pattern[0])
		return loom_seterr(LOOM_EINVAL, "llama config: short_window %d / window_pattern '%.*s' are nanochat's; every "
		                   "Llama layer attends over the whole causal prefix", c.short_window,
		                   LOOM_WINDOW_PATTERN_MAX - 1, c.window_pattern);
	const loom_rope_scaling_t *s = &c.rope_scaling;
	if (s->type != LOOM_ROPE_DEFAULT && s->type != LOOM_ROPE_LLAMA3)
		return loom_seterr(LOOM_EINVAL, "llama config: rope_scaling type %d is not one of default (0), llama3 (1)",
		                   (int)s->type);
	if (s->type == LOOM_ROPE_LLAMA3 &&
	    (!(s->factor > 0.0) || !(s->low_freq_factor > 0.0) || !(s->high_freq_factor > s->low_freq_factor) ||
	     !isfinite(s->factor) || !isfinite(s->high_freq_factor) || s->original_max_position_embeddings <= 0))
		return loom_seterr(LOOM_EINVAL, "llama config: rope_scaling llama3 with factor %g, low_freq_factor %g, "
		                   "high_freq_factor %g, original_max_position_embeddings %d (expected factor > 0, 0 < low < "
		                   "high, original > 0)", s->factor, s->low_freq_factor, s->high_freq_factor,
		                   s->original_max_position_embeddings);
	if ((size_t)c.vocab_size > (size_t)1 << 30 || (size_t)c.n_embd > (size_t)1 << 20 ||
	    (size_t)c.intermediate_size > (size_t)1 << 22 || (size_t)c.n_head * c.head_dim > (size_t)1 << 22)
		return loom_seterr(LOOM_EINVAL, "llama config: vocab_size %d, hidden_size %d, intermediate_size %d or "
		                   "num_attention_heads x head_dim %d is too large", c.vocab_size, c.n_embd,
		                   c.intermediate_size, c.n_head * c.head_dim);
	return LOOM_OK;
}

void loom__ll_dims(const loom_model_config_t *cfg, int tp, ll_dims_t *d)
{
	loom_model_config_t c;
	loom__ll_normalize(cfg, &c);
	memset(d, 0, sizeof *d);
	d->L = c.n_layer, d->NH = c.n_head, d->NKV = c.n_kv_head, d->C = c.n_embd, d->D = c.head_dim;
	d->T = c.seq_len, d->V = c.vocab_size, d->I = c.intermediate_size;
	d->tp = tp > 0 ? tp : 1;
	d->nh = d->NH / d->tp, d->nkv = d->NKV / d->tp, d->il = d->I / d->tp, d->vl = d->V / d->tp;
	d->tied = c.tie_word_embeddings;
	int qkvb = c.attention_bias || c.qkv_bias;
	for (int j = 0; j < LL_LAYER_MAX; j++)
		d->has[j] = 1;
	d->has[LL_QB] = d->has[LL_KB] = d->has[LL_VB] = qkvb;
	d->has[LL_OB] = c.attention_bias;
	d->has[LL_GATEB] = d->has[LL_UPB] = d->has[LL_DOWNB] = c.mlp_bias;
	d->per_layer = 0;
	for (int j = 0; j < LL_LAYER_MAX; j++)
		d->idx[j] = d->has[j] ? d->per_layer++ : -1;
}

int loom__ll_lt(const ll_dims_t *d, int l, int j)
{
	return d->idx[j] < 0 ? -1 : 1 + l * d->per_layer + d->idx[j];
}

int loom__ll_norm_index(const ll_dims_t *d)
{
	return 1 + d->L * d->per_layer;
}

int loom__ll_head_index(const ll_dims_t *d)
{
	return d->tied ? 0 : loom__ll_norm_index(d) + 1;
}

void loom__ll_unit_range(const ll_dims_t *d, int u, int *first, int *end)
{
	if (u < 0) {
		*first = 0, *end = 1;
	} else if (u >= d->L) {
		*first = loom__ll_norm_index(d), *end = *first + (d->tied ? 1 : 2);
	} else {
		*first = 1 + u * d->per_layer, *end = *first + d->per_layer;
	}
}

int loom__ll_num_tensors(const loom_model_config_t *cfg)
{
	ll_dims_t d;
	loom__ll_dims(cfg, 1, &d);
	return 1 + d.L * d.per_layer + (d.tied ? 1 : 2);
}

/* A 2-D [rows, cols] tensor split along tp_dim (-1 whole) into tp parts. */
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
	t->rows = (int)t->shape[0], t->cols = (int)t->shape[1];
}

/* A 1-D tensor (a norm's weight, a bias) of n, split in tp parts when split: no weight decay. */
static void vec(loom_tensor_info_t *t, size_t n, int split, int tp)
{
	t->ndim = 1;
	t->shape[0] = split ? n / (size_t)tp : n;
	t->numel = t->shape[0];
	t->decay = 0;
	t->tp_dim = split ? 0 : -1;
	t->tp_kind = split ? LOOM_TP_SPLIT : LOOM_TP_WHOLE;
	t->opt_group = LOOM_OPT_VECTOR;
}

static const char *const layer_names[LL_LAYER_MAX] = {
	"input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.q_proj.bias", "self_attn.k_proj.weight",
	"self_attn.k_proj.bias", "self_attn.v_proj.weight", "self_attn.v_proj.bias", "self_attn.o_proj.weight",
	"self_attn.o_proj.bias", "post_attention_layernorm.weight", "mlp.gate_proj.weight", "mlp.gate_proj.bias",
	"mlp.up_proj.weight", "mlp.up_proj.bias", "mlp.down_proj.weight", "mlp.down_proj.bias"};

/* Block l's tensor j, whole-model or one shard's shape; offset not set. */
static void layer_tensor(const ll_dims_t *d, int l, int j, loom_tensor_info_t *t)
{
	size_t C = (size_t)d->C, Q = (size_t)d->NH * d->D, KV = (size_t)d->NKV * d->D, I = (size_t)d->I;
	int tp = d->tp;
	memset(t, 0, sizeof *t);
	t->layer = l;
	snprintf(t->name, sizeof t->name, "model.layers.%d.%s", l, layer_names[j]);
	switch (j) {
	case LL_ATTN_NORM:
	case LL_MLP_NORM:
		vec(t, C, 0, tp);
		break;
	case LL_Q:
		mat(t, Q, C, 0, tp, LOOM_OPT_MATRIX);
		break;
	case LL_K:
	case LL_V:
		mat(t, KV, C, 0, tp, LOOM_OPT_MATRIX);
		break;
	case LL_O:
		mat(t, C, Q, 1, tp, LOOM_OPT_MATRIX);
		break;
	case LL_GATE:
	case LL_UP:
		mat(t, I, C, 0, tp, LOOM_OPT_MATRIX);
		break;
	case LL_DOWN:
		mat(t, C, I, 1, tp, LOOM_OPT_MATRIX);
		break;
	case LL_QB:
		vec(t, Q, 1, tp);
		break;
	case LL_KB:
	case LL_VB:
		vec(t, KV, 1, tp);
		break;
	case LL_GATEB:
	case LL_UPB:
		vec(t, I, 1, tp);
		break;
	default: /* LL_OB, LL_DOWNB: added once, after the row-parallel sum */
		vec(t, C, 0, tp);
		break;
	}
}

static size_t layer_numel(const ll_dims_t *d)
{
	loom_tensor_info_t t;
	size_t n = 0;
	for (int j = 0; j < LL_LAYER_MAX; j++)
		if (d->has[j]) {
			layer_tensor(d, 0, j, &t);
			n += t.numel;
		}
	return n;
}

/* Tensor i of a tp-way shard (tp 1: the whole model), offset in that shard's buffer. */
static int info_tp(const loom_model_config_t *cfg, int tp, int i, loom_tensor_info_t *t)
{
	ll_dims_t d;
	int n = loom__ll_num_tensors(cfg);
	if (i < 0 || i >= n)
		return loom_seterr(LOOM_EINVAL, "llama tensor_info: tensor %d out of range [0, %d)", i, n);
	loom__ll_dims(cfg, tp, &d);
	size_t emb = (size_t)d.vl * d.C, off;
	memset(t, 0, sizeof *t);
	if (i == 0) {
		snprintf(t->name, sizeof t->name, "model.embed_tokens.weight");
		t->layer = -1;
		mat(t, (size_t)d.V, (size_t)d.C, 0, d.tp, d.tied ? LOOM_OPT_VECTOR : LOOM_OPT_EMBED);
		t->head_reads = d.tied;
		t->offset = 0;
		return LOOM_OK;
	}
	int norm = loom__ll_norm_index(&d);
	if (i < norm) {
		int l = (i - 1) / d.per_layer, k = (i - 1) % d.per_layer, j = 0;
		while (d.idx[j] != k)
			j++;
		off = emb + (size_t)l * layer_numel(&d);
		for (int jj = 0; jj < j; jj++)
			if (d.has[jj]) {
				loom_tensor_info_t u;
				layer_tensor(&d, l, jj, &u);
				off += u.numel;
			}
		layer_tensor(&d, l, j, t);
		t->offset = off;
		return LOOM_OK;
	}
	off = emb + (size_t)d.L * layer_numel(&d);
	t->layer = d.L;
	if (i == norm) {
		snprintf(t->name, sizeof t->name, "model.norm.weight");
		vec(t, (size_t)d.C, 0, d.tp);
		t->offset = off;
		return LOOM_OK;
	}
	snprintf(t->name, sizeof t->name, "lm_head.weight");
	mat(t, (size_t)d.V, (size_t)d.C, 0, d.tp, LOOM_OPT_UNEMBED);
	t->offset = off + (size_t)d.C;
	return LOOM_OK;
}

int loom__ll_tensor_info(const loom_model_config_t *cfg, int i, loom_tensor_info_t *info)
{
	return info_tp(cfg, 1, i, info);
}

int loom__ll_shard_info(const loom_model_config_t *cfg, int tp, int i, loom_tensor_info_t *info)
{
	return info_tp(cfg, tp, i, info);
}

size_t loom__ll_shard_params(const loom_model_config_t *cfg, int tp)
{
	loom_tensor_info_t t;
	if (info_tp(cfg, tp, loom__ll_num_tensors(cfg) - 1, &t) != LOOM_OK)
		return 0;
	return t.offset + t.numel;
}

size_t loom__ll_num_params(const loom_model_config_t *cfg)
{
	return loom__ll_shard_params(cfg, 1);
}

int loom__ll_stream_width(const loom_model_config_t *cfg)
{
	return cfg->n_embd;
}

int loom__ll_kv_width(const loom_model_config_t *cfg)
{
	loom_model_config_t c;
	loom__ll_normalize(cfg, &c);
	return c.n_kv_head * c.head_dim;
}

/* 2-D parameters of a block (what its matmuls multiply by). */
static double block_matrix_params(const ll_dims_t *d)
{
	double C = d->C, Q = (double)d->NH * d->D, KV = (double)d->NKV * d->D, I = d->I;
	return C * Q + 2.0 * C * KV + Q * C + 3.0 * C * I;
}

/* Unit u's FLOPs per token: a block's matmuls (6 per parameter, forward and backward) and its causal
 * attention over the whole prefix (loom_model_attn_flops of NH x head_dim channels); the head's lm
 * head (embed_tokens when tied); the embedding's lookup none. */
double loom__ll_unit_flops(const loom_model_config_t *cfg, int unit, int T)
{
	ll_dims_t d;
	loom__ll_dims(cfg, 1, &d);
	if (unit < 0 || unit > d.L)
		return 0.0;
	if (unit == d.L)
		return 6.0 * (double)d.V * d.C;
	return 6.0 * block_matrix_params(&d) + loom_model_attn_flops(d.NH * d.D, T, d.T);
}

double loom__ll_flops_per_token(const loom_model_config_t *cfg, int T)
{
	ll_dims_t d;
	double f = 0.0;
	loom__ll_dims(cfg, 1, &d);
	for (int u = 0; u <= d.L; u++)
		f += loom__ll_unit_flops(cfg, u, T);
	return f;
}

/* transformers' _compute_default_rope_parameters (inv_freq_i = theta^(-2i/D)) and, for rope_type
 * llama3, _compute_llama3_parameters: a frequency whose wavelength 2 pi / f is below
 * original / high_freq_factor is kept, above original / low_freq_factor divided by factor, and in
 * between blended, (1 - s) f / factor + s f with s = (original / wavelength - low) / (high - low). */
void loom__ll_inv_freq(const loom_model_config_t *cfg, double *inv_freq)
{
	loom_model_config_t c;
	loom__ll_normalize(cfg, &c);
	int D = c.head_dim;
	const loom_rope_scaling_t *s = &c.rope_scaling;
	for (int i = 0; i < D / 2; i++) {
		double f = 1.0 / pow(c.rope_theta, (double)(2 * i) / (double)D);
		if (s->type == LOOM_ROPE_LLAMA3) {
			double old = (double)s->original_max_position_embeddings;
			double low_wl = old / s->low_freq_factor, high_wl = old / s->high_freq_factor;
			double wl = 2.0 * M_PI / f;
			if (wl > low_wl) {
				f = f / s->factor;
			} else if (wl >= high_wl) {
				double sm = (old / wl - s->low_freq_factor) / (s->high_freq_factor - s->low_freq_factor);
				f = (1.0 - sm) * f / s->factor + sm * f;
			}
		}
		inv_freq[i] = f;
	}
}

int loom__ll_tp_check(const loom_model_config_t *cfg, int tp)
{
	ll_dims_t d;
	int rc;
	if ((rc = loom__ll_config_check(cfg)) != LOOM_OK)
		return rc;
	if (tp <= 1)
		return LOOM_OK;
	loom__ll_dims(cfg, tp, &d);
	if (d.NKV % tp != 0)
		return loom_seterr(LOOM_EINVAL, "llama tensor parallel: num_key_value_heads %d is not divisible by tp %d "
		                   "(attention is split by kv-head groups: each rank takes num_key_value_heads / tp kv heads "
		                   "and their query heads)", d.NKV, tp);
	if (d.I % tp != 0)
		return loom_seterr(LOOM_EINVAL, "llama tensor parallel: intermediate_size %d is not divisible by tp %d (gate "
		                   "and up are split by rows, down by columns)", d.I, tp);
	if (d.V % tp != 0)
		return loom_seterr(LOOM_EINVAL, "llama tensor parallel: vocab_size %d is not divisible by tp %d (the "
		                   "embedding and the lm head are split by vocabulary rows)", d.V, tp);
	return LOOM_OK;
}

int loom_llama_preset(const char *name, loom_model_config_t *cfg)
{
	static const struct {
		const char *name;
		int L, NH, NKV, C, I, V, T;
		double theta;
	} presets[] = {
		{"smollm2-135m", 30, 9, 3, 576, 1536, 49152, 8192, 1e5},
		{"smollm2-360m", 32, 15, 5, 960, 2560, 49152, 8192, 1e5},
		{"tiny", 4, 4, 2, 128, 384, 50257, 256, 1e4},
	};
	for (size_t k = 0; name && k < sizeof presets / sizeof *presets; k++) {
		if (strcmp(name, presets[k].name) != 0)
			continue;
		memset(cfg, 0, sizeof *cfg);
		cfg->arch = LOOM_ARCH_LLAMA;
		cfg->n_layer = presets[k].L, cfg->n_head = presets[k].NH, cfg->n_kv_head = presets[k].NKV;
		cfg->n_embd = presets[k].C, cfg->intermediate_size = presets[k].I, cfg->vocab_size = presets[k].V;
		cfg->seq_len = presets[k].T, cfg->rope_theta = presets[k].theta, cfg->rms_norm_eps = 1e-5;
		cfg->tie_word_embeddings = 1;
		return LOOM_OK;
	}
	return loom_seterr(LOOM_EINVAL, "llama preset '%s' is not one of smollm2-135m, smollm2-360m, tiny",
	                   name ? name : "(null)");
}

int loom_llama_rope_scaling_parse(const char *text, loom_rope_scaling_t *s)
{
	loom_rope_scaling_t r = {0};
	int used = 0;
	if (text && strcmp(text, "default") == 0) {
		*s = r;
		return LOOM_OK;
	}
	if (!text || sscanf(text, "llama3:%lf:%lf:%lf:%d%n", &r.factor, &r.low_freq_factor, &r.high_freq_factor,
	                    &r.original_max_position_embeddings, &used) != 4 || text[used] != '\0')
		return loom_seterr(LOOM_EINVAL, "rope scaling '%s': expected default or llama3:FACTOR:LOW:HIGH:ORIGINAL (e.g. "
		                   "llama3:8:1:4:8192)", text ? text : "(null)");
	r.type = LOOM_ROPE_LLAMA3;
	*s = r;
	return LOOM_OK;
}

void loom_llama_describe(const loom_model_config_t *cfg, char *buf, size_t cap)
{
	loom_model_config_t c;
	size_t n = 0;
	if (!cap)
		return;
	loom__ll_normalize(cfg, &c);
#define ADD(...) (n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, __VA_ARGS__), n = n < cap ? n : cap - 1)
	buf[0] = '\0';
	ADD("%d kv heads, head_dim %d, intermediate %d, rope_theta %g", c.n_kv_head, c.head_dim, c.intermediate_size,
	    c.rope_theta);
	if (c.rope_scaling.type == LOOM_ROPE_LLAMA3)
		ADD(" (llama3 scaling: factor %g, low %g, high %g, original %d)", c.rope_scaling.factor,
		    c.rope_scaling.low_freq_factor, c.rope_scaling.high_freq_factor,
		    c.rope_scaling.original_max_position_embeddings);
	ADD(", rms_norm_eps %g, %s embeddings", c.rms_norm_eps, c.tie_word_embeddings ? "tied" : "untied");
	if (c.attention_bias)
		ADD(", biases on q, k, v, o");
	else if (c.qkv_bias)
		ADD(", biases on q, k, v (Qwen2)");
	if (c.mlp_bias)
		ADD(", biases on gate, up, down");
#undef ADD
}
