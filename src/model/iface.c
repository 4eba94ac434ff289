/* iface.c: the model interface (loom/model.h): every call dispatches through the model's (or the
 * configuration's) family table. */
#include <stdio.h>
#include <string.h>

#include "loom/model.h"
#include "model/model.h"
#include "model/nanochat.h"
#include "core/util.h"

const loom_model_family_t *loom_model_family(loom_arch_t arch)
{
	switch (arch) {
	case LOOM_ARCH_GPT2:
		return loom__gpt2_family();
	case LOOM_ARCH_NANOCHAT:
		return loom__nanochat_family();
	}
	return NULL;
}

int loom_arch_parse(const char *name, loom_arch_t *arch)
{
	if (name && strcmp(name, "gpt2") == 0)
		return *arch = LOOM_ARCH_GPT2, LOOM_OK;
	if (name && strcmp(name, "nanochat") == 0)
		return *arch = LOOM_ARCH_NANOCHAT, LOOM_OK;
	return loom_seterr(LOOM_EINVAL, "model family '%s' is not one of gpt2, nanochat", name ? name : "(null)");
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
		loom_seterr(LOOM_EINVAL, "model configuration: arch %d is not a model family (gpt2, nanochat)", (int)cfg->arch);
	return f;
}

/* cfg with nanochat's defaults filled in (GPT-2 ignores those fields). */
static loom_model_config_t resolved(const loom_model_config_t *cfg)
{
	loom_model_config_t c = *cfg;
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

int loom_model_config_equal(const loom_model_config_t *a, const loom_model_config_t *b)
{
	loom_model_config_t x = resolved(a), y = resolved(b);
	return x.arch == y.arch && x.n_layer == y.n_layer && x.n_head == y.n_head && x.n_embd == y.n_embd &&
	       x.seq_len == y.seq_len && x.vocab_size == y.vocab_size && x.n_kv_head == y.n_kv_head &&
	       x.short_window == y.short_window && strcmp(x.window_pattern, y.window_pattern) == 0;
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
	return 6.0 * params + (unit >= 0 && unit < cfg->n_layer ? 12.0 * cfg->n_embd * T : 0.0);
}

int loom_model_create(loom_model_t **m, const loom_model_config_t *cfg, const loom_model_opts_t *opts)
{
	const loom_model_family_t *f = fam(cfg);
	*m = NULL;
	return f ? f->create(m, cfg, opts) : LOOM_EINVAL;
}

void loom_model_destroy(loom_model_t *m)
{
	if (m)
		m->family->destroy(m);
}

const loom_model_config_t *loom_model_get_config(const loom_model_t *m)
{
	return m->family->config(m);
}

int loom_model_set_inputs(loom_model_t *m, int mb, const int *inputs, int B, int T)
{
	return m->family->set_inputs ? m->family->set_inputs(m, mb, inputs, B, T) : LOOM_OK;
}

loom_compute_dtype_t loom_model_dtype(const loom_model_t *m)
{
	return m->family->dtype(m);
}

const loom_tensor_info_t *loom_model_tensors(const loom_model_t *m, int *n)
{
	return m->family->tensors(m, n);
}

size_t loom_model_param_count(const loom_model_t *m)
{
	return m->family->param_count(m);
}

float *loom_model_params(loom_model_t *m)
{
	return m->family->params(m);
}

float *loom_model_grads(loom_model_t *m)
{
	return m->family->grads(m);
}

int loom_model_set_grad_buffer(loom_model_t *m, float *grads)
{
	return m->family->set_grad_buffer(m, grads);
}

int loom_model_set_param_buffer(loom_model_t *m, float *params)
{
	return m->family->set_param_buffer(m, params);
}

int loom_model_own_grads(loom_model_t *m)
{
	return m->family->own_grads(m);
}

int loom_model_set_tensor_view(loom_model_t *m, int tensor, float *param, float *grad)
{
	return m->family->set_tensor_view(m, tensor, param, grad);
}

int loom_model_set_unit_view(loom_model_t *m, int unit, float *params, float *grads)
{
	return m->family->set_unit_view(m, unit, params, grads);
}

float *loom_model_tensor_param(loom_model_t *m, int tensor)
{
	return m->family->tensor_param(m, tensor);
}

float *loom_model_tensor_grad(loom_model_t *m, int tensor)
{
	return m->family->tensor_grad(m, tensor);
}

void loom_model_init(loom_model_t *m, uint64_t seed)
{
	m->family->init(m, seed);
}

void loom_model_layers(const loom_model_t *m, int *lo, int *hi, int *arenas)
{
	m->family->layers(m, lo, hi, arenas);
}

loom_act_ckpt_t loom_model_act_ckpt(const loom_model_t *m)
{
	return m->family->act_ckpt(m);
}

long long loom_model_recomputes(const loom_model_t *m)
{
	return m->family->recomputes(m);
}

void loom_model_model_act_bytes(const loom_model_t *m, loom_model_act_bytes_t *out)
{
	m->family->model_act_bytes(m, out);
}

int loom_model_forward(loom_model_t *m, const int *inputs, const int *targets, int B, int T, float *loss)
{
	return m->family->forward(m, inputs, targets, B, T, loss);
}

const float *loom_model_logits(const loom_model_t *m)
{
	return m->family->logits(m);
}

void loom_model_zero_grad(loom_model_t *m)
{
	m->family->zero_grad(m);
}

int loom_model_forward_backward(loom_model_t *m, const int *inputs, const int *targets, int B, int T, float grad_scale, float *loss)
{
	return m->family->forward_backward(m, inputs, targets, B, T, grad_scale, loss);
}

void loom_model_on_grad_ready(loom_model_t *m, loom_grad_ready_fn fn, void *ctx)
{
	m->family->on_grad_ready(m, fn, ctx);
}

void loom_model_on_param_use(loom_model_t *m, loom_param_use_fn fn, void *ctx)
{
	m->family->on_param_use(m, fn, ctx);
}

void loom_model_on_tp_reduce(loom_model_t *m, loom_tp_reduce_fn fn, void *ctx)
{
	m->family->on_tp_reduce(m, fn, ctx);
}

int loom_model_embed_forward(loom_model_t *m, int mb, const int *inputs, int B, int T)
{
	return m->family->embed_forward(m, mb, inputs, B, T);
}

int loom_model_block_forward(loom_model_t *m, int mb, int l, int B, int T)
{
	return m->family->block_forward(m, mb, l, B, T);
}

int loom_model_head_forward(loom_model_t *m, int mb, const int *targets, int B, int T, float *loss)
{
	return m->family->head_forward(m, mb, targets, B, T, loss);
}

int loom_model_head_forward_backward(loom_model_t *m, int mb, const int *targets, int B, int T, float grad_scale, float *loss)
{
	return m->family->head_forward_backward(m, mb, targets, B, T, grad_scale, loss);
}

int loom_model_head_forward_backward_rows(loom_model_t *m, int mb, const int *targets, int B, int T, int row0, int rows, float grad_scale, float *loss)
{
	return m->family->head_forward_backward_rows(m, mb, targets, B, T, row0, rows, grad_scale, loss);
}

int loom_model_block_backward(loom_model_t *m, int mb, int l, int B, int T)
{
	return m->family->block_backward(m, mb, l, B, T);
}

int loom_model_embed_backward(loom_model_t *m, int mb, const int *inputs, int B, int T)
{
	return m->family->embed_backward(m, mb, inputs, B, T);
}

float *loom_model_block_input(loom_model_t *m, int mb, int l)
{
	return m->family->block_input(m, mb, l);
}

float *loom_model_stream_grad(loom_model_t *m)
{
	return m->family->stream_grad(m);
}

int loom_model_tp_size(const loom_model_t *m)
{
	return m->family->tp_size(m);
}

int loom_model_tp_rank(const loom_model_t *m)
{
	return m->family->tp_rank(m);
}

int loom_model_kv_cache_alloc(loom_model_t *m)
{
	return m->family->kv_cache_alloc(m);
}

int loom_model_generate(loom_model_t *m, const int *prompt, int n_prompt, int max_new, float temperature, int top_k, uint64_t seed, int stop_token, int *out, int *n_out, void (*on_token)(void *ctx, int token), void *ctx)
{
	return m->family->generate(m, prompt, n_prompt, max_new, temperature, top_k, seed, stop_token, out, n_out, on_token, ctx);
}

void loom_model_profile(loom_model_t *m, int enable)
{
	m->family->profile(m, enable);
}

void loom_model_profile_report(loom_model_t *m, void *file, int steps)
{
	m->family->profile_report(m, file, steps);
}

size_t loom_model_act_formula(const loom_model_t *m, int B, int T, const char **text)
{
	if (m->family->act_formula)
		return m->family->act_formula(m, B, T, text);
	*text = "(no formula)";
	return 0;
}
