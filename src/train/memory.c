/* memory.c: memory accounting of a training run: what this rank keeps of the model states
 * (parameters, gradients, AdamW moments) as its parallel strategy reports them, the activations (as
 * the model allocated them, beside the formula of its checkpointing mode), the strategy's
 * communication buffers, the theory of the ZeRO stage beside them (the activations' formula is the
 * model family's, loom_model_act_formula), and the process's peak resident
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
#include "loom/limits.h"
#include "train/trainer_internal.h"


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
	m->act_formula = loom_model_act_formula(model, tr->cfg.B, tr->cfg.T / tr->cp_size, &m->act_formula_text);
	m->zero = N > 1 ? tr->cfg.zero : 0;
	m->nparams = P;
	m->dp = (int)N;
	m->theory = loom_mem_zero_states(m->zero, P, (int)N, &m->formula); /* the memory check's table */
	if (m->zero == 3)
		m->formula = "16P/N + the largest gathered unit"; /* reported apart, as the strategy's buffers are */
	if (m->zero == 3) /* the largest unit: the embedding, a block or the head (a unit's tensors are contiguous) */
		for (int u = -1; u <= tr->mcfg.n_layer; u++) {
			int first, end;
			const loom_tensor_info_t *t = loom_model_tensors(tr->model, NULL);
			loom_model_unit_tensors(&tr->mcfg, u, &first, &end);
			if (end > first)
				m->largest_unit = LOOM_MAX(m->largest_unit,
				                           4 * (t[end - 1].offset + t[end - 1].numel - t[first].offset));
		}
	return LOOM_OK;
}
