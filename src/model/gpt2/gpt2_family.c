/* gpt2_family.c: GPT-2 as a model family (loom/model.h): its table of operations, each one the
 * loom_gpt2_* call of the same name (loom/gpt2.h) or, for the shared state and the unit calls, the
 * shared base's (model/family.c) that the loom_gpt2_* call is too, so a model reached through the
 * interface behaves exactly as one reached directly. */
#include "core/util.h"
#include "model/gpt2/model.h"

#define G(m) ((loom_gpt2_t *)(m))
#define CG(m) ((const loom_gpt2_t *)(m))

static void g_init(loom_model_t *m, uint64_t seed)
{
	loom_gpt2_init(G(m), seed);
}

static int g_kv_cache_alloc(loom_model_t *m)
{
	return loom_gpt2_kv_cache_alloc(G(m));
}

static int g_generate(loom_model_t *m, const int *prompt, int n_prompt, int max_new, float temperature, int top_k, uint64_t seed, int stop_token, int *out, int *n_out, void (*on_token)(void *ctx, int token), void *ctx)
{
	return loom_gpt2_generate(G(m), prompt, n_prompt, max_new, temperature, top_k, seed, stop_token, out, n_out, on_token, ctx);
}

static void g_profile(loom_model_t *m, int enable)
{
	loom_gpt2_profile(G(m), enable);
}

static void g_profile_report(loom_model_t *m, void *file, int steps)
{
	loom_gpt2_profile_report(G(m), file, steps);
}

static int g_create(loom_model_t **m, const loom_model_config_t *cfg, const loom_model_opts_t *opts)
{
	loom_gpt2_t *g = NULL;
	int rc = loom_gpt2_create_opts(&g, cfg, opts);
	*m = (loom_model_t *)g;
	return rc;
}

static int g_kv_width(const loom_model_config_t *cfg)
{
	return cfg->n_embd;
}

static int g_stream_width(const loom_model_config_t *cfg)
{
	return cfg->n_embd;
}

/* The activation formula beside the allocation (loom_model_act_formula; src/train/memory.c prints
 * both). Activations, in floats, of a model holding Lh blocks and `arenas` arenas of B x T (tp: local heads
 * NHl and channels Cl). One layer's full set is F = (4C + 12Cl) BT + 4 BT + B NHl T (16 BTC + 4 BT +
 * B NH T without tp: ln1, qkv, atty, res2, ln2, fch, fch_gelu, res3, four LayerNorm statistics, the
 * attention rows' log-sum-exp; no T x T term: the fused attention keeps none). A checkpointing mode drops D of each layer's floats, which then live once,
 * in the recompute scratch: kept = arenas (Lh (F - D) + BTC + head), scratch = D, with head = BTC + 3 BT
 * (ln_f's output and statistics, the losses) on the model holding it. The rule, as data: */
/* FLOPs per token of unit u (loom_model_unit_flops): a block's in closed form, 6 x its matmul weights
 * (qkv 3C^2 + proj C^2 + fc 4C^2 + proj 4C^2) + attention's products over the causal triangle
 * (loom_model_block_attn_flops: 12 C (T + 1) / 2), the same as the parameter table's count without
 * formatting a tensor name per weight (the pipeline partition asks for every block, and the planner's
 * search for thousands of meshes); the others from the table. */
static double g_unit_flops(const loom_model_config_t *cfg, int unit, int T)
{
	double C = cfg->n_embd;
	if (unit >= 0 && unit < cfg->n_layer)
		return 6.0 * 12.0 * C * C + loom_model_block_attn_flops(cfg, unit, T);
	return loom__model_unit_flops_table(cfg, unit, T);
}

static const struct {
	loom_act_ckpt_t mode;
	const char *text, *text_sp; /* without and with sequence parallelism */
} act_rule[] = {
	{LOOM_ACT_CKPT_NONE, "arenas x (L x F + BTC + head), F = 16BTC + 4BT + B NH T",
	 "arenas x (L x F + 2BTC - BTC/tp + head), F = (16BTC + 4BT + B NH T) / tp"},
	{LOOM_ACT_CKPT_BLOCKS, "arenas x (L x BTC + BTC + head) + (F - BTC) for one block",
	 "arenas x ((L-1) x BTC/tp + 2BTC + head) + (F - BTC/tp) for one block, F = (16BTC + 4BT + B NH T) / tp"},
	{LOOM_ACT_CKPT_SELECTIVE, "arenas x (L x (F - A) + BTC + head) + A for one layer, A = BTC + B NH T",
	 "arenas x (L x (F - A) + 2BTC - BTC/tp + head) + A for one layer, A = (BTC + B NH T) / tp, "
	 "F = (16BTC + 4BT + B NH T) / tp"},
};

/* With sequence parallelism (p = tp) every per-layer buffer is 1/p: ln1, res2, ln2, res3 and the four
 * statistics hold N/p rows, the rest was already split by heads or MLP columns, so F = F(tp 1) / p;
 * block hi-1's output is whole (the head's or the next stage's input): + BTC (1 - 1/p) per arena. */
static size_t g_act_formula(const loom_model_t *model, int B, int T, const char **text)
{
	const loom_gpt2_t *g = (const loom_gpt2_t *)model;
	const loom_model_config_t *c = loom_gpt2_config(g);
	int lo, hi, arenas, tp = loom_gpt2_tp_size(g), sp = loom_gpt2_sequence_parallel(g);
	loom_act_ckpt_t mode = loom_gpt2_act_ckpt(g);
	loom_gpt2_layers(g, &lo, &hi, &arenas);
	double p = sp ? tp : 1;
	double BT = (double)B * T, C = c->n_embd, Cl = (double)c->n_embd / tp, A = BT * (c->n_head / tp);
	double F = (4 * C / p + 12 * Cl) * BT + 4 * BT / p + A, D = 0;
	double head = hi == c->n_layer ? BT * C + 3 * BT : 0, out = sp && hi > lo ? BT * C * (1 - 1 / p) : 0;
	if (mode == LOOM_ACT_CKPT_BLOCKS)
		D = F - BT * C / p;
	else if (mode == LOOM_ACT_CKPT_SELECTIVE)
		D = A + BT * Cl; /* the attention's output and lse, recomputed */
	*text = "?";
	for (size_t k = 0; k < LOOM_ARRAY_LEN(act_rule); k++)
		if (act_rule[k].mode == mode)
			*text = sp ? act_rule[k].text_sp : act_rule[k].text;
	double floats = arenas * ((hi - lo) * (F - D) + BT * C + out + head) + D;
	return (size_t)(floats * sizeof(float));
}

const loom_model_family_t loom__gpt2_table = {
	.name = "gpt2",
	.arch = LOOM_ARCH_GPT2,
	.config_check = loom_gpt2_config_check,
	.num_tensors = loom_gpt2_num_tensors,
	.tensor_info = loom_gpt2_tensor_info,
	.num_params = loom_gpt2_num_params,
	.flops_per_token = loom_gpt2_flops_per_token,
	.stream_width = g_stream_width,
	.kv_width = g_kv_width,
	.tp_check = loom_gpt2_tp_check,
	.shard_info = loom_gpt2_shard_info,
	.shard_params = loom_gpt2_shard_params,
	.tp_shard = loom_gpt2_tp_shard,
	.tp_unshard = loom_gpt2_tp_unshard,
	.tp_copy_tensor = loom__gpt2_tp_copy_tensor,
	.act_bytes = loom_gpt2_act_bytes,
	.create = g_create,
	.init = g_init,
	.kv_cache_alloc = g_kv_cache_alloc,
	.generate = g_generate,
	.profile = g_profile,
	.profile_report = g_profile_report,
	.set_inputs = NULL, /* GPT-2's blocks do not read the tokens */
	.act_formula = g_act_formula,
	.unit_flops = g_unit_flops,
	LOOM__FAM_TABLE_OPS,
};

const loom_model_family_t *loom__gpt2_family(void)
{
	return &loom__gpt2_table;
}
