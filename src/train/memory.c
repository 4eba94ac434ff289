/* memory.c: memory accounting of a training run: what this rank keeps of the model states
 * (parameters, gradients, AdamW moments) as its parallel strategy reports them, an estimate of the
 * activations, the strategy's communication buffers, the theory of the ZeRO stage beside them, and the
 * process's peak resident set (VmHWM).
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

/* The activations of one arena of a model created for B x T (llm.c's buffers: per layer 16 BTC + 4 BT
 * + B NH T^2; the residual input, ln_f and the losses; backward's shared scratch 13 BTC), rounded. */
static size_t activations(const loom_gpt2_config_t *c, int B, int T)
{
	double BT = (double)B * T, C = c->n_embd, L = c->n_layer;
	double per_layer = 16 * BT * C + 4 * BT + (double)B * c->n_head * T * T;
	double floats = L * per_layer + 2 * BT * C + 3 * BT + 13 * BT * C + (double)B * c->vocab_size;
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
	m->activations = activations(&tr->mcfg, tr->cfg.B, tr->cfg.T);
	m->zero = N > 1 ? tr->cfg.zero : 0;
	m->dp = (int)N;
	for (size_t k = 0; k < LOOM_ARRAY_LEN(theory); k++)
		if (theory[k].zero == m->zero) {
			m->theory = (size_t)(theory[k].whole * (double)P + theory[k].sharded * (double)P / (double)N);
			m->formula = theory[k].formula;
		}
	if (m->zero == 3) { /* the largest unit: the embedding or a block (a unit's tensors are contiguous) */
		int n, L = tr->mcfg.n_layer;
		const loom_tensor_info_t *t = loom_gpt2_tensors(tr->model, &n);
		size_t emb = t[1].offset + t[1].numel, block = t[2 + LOOM_GPT2_LAYER_TENSORS].offset - t[2].offset;
		m->largest_unit = 4 * (L > 0 ? LOOM_MAX(emb, block) : emb);
	}
	return LOOM_OK;
}
