/* memory.c: memory accounting of a training run: what this rank keeps of the model states
 * (parameters, gradients, AdamW moments) as its parallel strategy reports them, the activations (as
 * the model allocated them, beside the formula of its checkpointing mode), the strategy's
 * communication buffers, the theory of the ZeRO stage beside them, and the process's peak resident
 * set (VmHWM).
 *
 * The theory is a table (one row per stage), bytes per rank with P parameters and N data-parallel
 * ranks, fp32: DDP 16P; ZeRO-1 8P + 8P/N (AdamW m, v sharded); ZeRO-2 4P + 12P/N (gradients too);
 * ZeRO-3 16P/N (parameters too) plus the largest unit gathered at once, which is reported apart, as
 * the strategy's buffers are. Shards are rounded to 16 floats (zero.c), so the measured states are
 * within 64 N bytes of the formula. */
#include <stdio.h>
#include <string.h>

#include "core/util.h"
#include "train/trainer_internal.h"

static const struct {
	int zero;
	double whole, sharded; /* bytes per parameter kept whole, and split over the N ranks */
	const char *formula;
} theory[] = {
	{0, 16, 0, "16P"},
	{1, 8, 8, "8P + 8P/N"},
	{2, 4, 12, "4P + 12P/N"},
	{3, 0, 16, "16P/N + the largest gathered unit"},
};

/* Activations, in floats, of a model holding Lh blocks and `arenas` arenas of B x T (tp: local heads
 * NHl and channels Cl). One layer's full set is F = (4C + 12Cl) BT + 4 BT + B NHl T^2 (16 BTC + 4 BT +
 * B NH T^2 without tp: ln1, qkv, atty, res2, ln2, fch, fch_gelu, res3, four LayerNorm statistics, the
 * attention probabilities). A checkpointing mode drops D of each layer's floats, which then live once,
 * in the recompute scratch: kept = arenas (Lh (F - D) + BTC + head), scratch = D, with head = BTC + 3 BT
 * (ln_f's output and statistics, the losses) on the model holding it. The rule, as data: */
static const struct {
	loom_act_ckpt_t mode;
	const char *text;
} act_rule[] = {
	{LOOM_ACT_CKPT_NONE, "arenas x (L x F + BTC + head), F = 16BTC + 4BT + B NH T^2"},
	{LOOM_ACT_CKPT_BLOCKS, "arenas x (L x BTC + BTC + head) + (F - BTC) for one block"},
	{LOOM_ACT_CKPT_SELECTIVE, "arenas x (L x (F - B NH T^2) + BTC + head) + B NH T^2 for one layer"},
};

static size_t act_formula(const loom_model_t *model, int B, int T, const char **text)
{
	const loom_model_config_t *c = loom_model_get_config(model);
	int lo, hi, arenas, tp = loom_model_tp_size(model);
	loom_act_ckpt_t mode = loom_model_act_ckpt(model);
	loom_model_layers(model, &lo, &hi, &arenas);
	double BT = (double)B * T, C = c->n_embd, Cl = (double)c->n_embd / tp, A = BT * (c->n_head / tp) * T;
	double F = (4 * C + 12 * Cl) * BT + 4 * BT + A, D = 0;
	double head = hi == c->n_layer ? BT * C + 3 * BT : 0;
	if (mode == LOOM_ACT_CKPT_BLOCKS)
		D = F - BT * C;
	else if (mode == LOOM_ACT_CKPT_SELECTIVE)
		D = A;
	*text = "?";
	for (size_t k = 0; k < LOOM_ARRAY_LEN(act_rule); k++)
		if (act_rule[k].mode == mode)
			*text = act_rule[k].text;
	double floats = arenas * ((hi - lo) * (F - D) + BT * C + head) + D;
	return (size_t)(floats * sizeof(float));
}

size_t loom_peak_rss_bytes(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	unsigned long long kb = 0;
	if (!f)
		return 0;
	while (fgets(line, sizeof line, f))
		if (sscanf(line, "VmHWM: %llu kB", &kb) == 1)
			break;
	fclose(f);
	return (size_t)kb * 1024;
}

int loom_trainer_memory(const loom_trainer_t *tr, loom_train_memory_t *m)
{
	const loom_strategy_t *s = tr->strategy;
	size_t P = s->nparams, N = (size_t)s->dp_size;
	memset(m, 0, sizeof *m);
	m->params = s->mem.params, m->grads = s->mem.grads, m->optim = s->mem.optim, m->comm = s->mem.comm;
	m->model_states = m->params + m->grads + m->optim;
	const loom_model_t *model = tr->exec->ops->model(tr->exec); /* the model the steps run on */
	loom_model_model_act_bytes(model, &m->act);
	m->activations = m->act.total;
	m->act_ckpt = loom_model_act_ckpt(model);
	m->act_formula = act_formula(model, tr->cfg.B, tr->cfg.T, &m->act_formula_text);
	m->zero = N > 1 ? tr->cfg.zero : 0;
	m->dp = (int)N;
	for (size_t k = 0; k < LOOM_ARRAY_LEN(theory); k++)
		if (theory[k].zero == m->zero) {
			m->theory = (size_t)(theory[k].whole * (double)P + theory[k].sharded * (double)P / (double)N);
			m->formula = theory[k].formula;
		}
	if (m->zero == 3) { /* the largest unit: the embedding or a block (a unit's tensors are contiguous) */
		int n, L = tr->mcfg.n_layer;
		const loom_tensor_info_t *t = loom_model_tensors(tr->model, &n);
		size_t emb = t[1].offset + t[1].numel, block = t[2 + LOOM_GPT2_LAYER_TENSORS].offset - t[2].offset;
		m->largest_unit = 4 * (L > 0 ? LOOM_MAX(emb, block) : emb);
	}
	return LOOM_OK;
}
