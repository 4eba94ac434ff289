/* plan.c: `loom plan`: parse `loom train`'s model, batch, mesh and data flags into the trainer's own
 * config (the others are accepted and ignored, so a train command line with `train` replaced by `plan`
 * plans that run), a cluster and a token budget; print the estimate of loom/plan.h for one
 * configuration (human or --json), or with --search the ranked configurations of a number of ranks.
 * The arithmetic is the library's (src/train/plan.c); the run's plan configuration and this machine's
 * set-up are loom_plan_config_of_run and loom_plan_local, the calls `loom train` makes for its
 * start-up line and summary; the model flags are resolved as `loom train` resolves them. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "loom/ckpt.h"
#include "loom/gpt2.h"
#include "loom/plan.h"
#include "loom/train.h"

static const char *const usage_text =
	"usage: loom plan [loom train's model, batch and mesh flags] [--cluster local|PROFILE|FILE.json] [flags]\n"
	"\n"
	"Predicts, before launching, what a training run costs per rank: memory (parameters, gradients, optimizer,\n"
	"activations, communication buffers, process overhead: the peak resident set), FLOPs, compute and\n"
	"communication time per mesh axis (exposed vs hidden by overlap), the pipeline bubble (loom's schedule\n"
	"simulation), step time, tokens/s, MFU, and for --tokens the wall clock and cost. docs/plan.md has the\n"
	"formulas, their sources and the JSON schema.\n"
	"\n"
	"model and batch (as loom train): --model tiny|small|gpt2 (llama: smollm2-135m|smollm2-360m|tiny),\n"
	"  --arch gpt2|nanochat|llama, --depth D, --n-layer L, the llama flags of loom train --help,\n"
	"  --n-head H, --n-embd C, --vocab-size V, --n-positions P, --n-kv-head K, --window-pattern P,\n"
	"  --short-window W, --init-from PATH (its config), --batch-size B (default 4), --seq-len T,\n"
	"  --grad-accum K | --micro-batches M | --total-batch-size N, --optimizer adamw|muon (MuonAdamW's state)\n"
	"mesh (as loom train): --dp D --tp T --pp P --cp N (dp defaults to --nproc / --ranks / (N x T x P), else 1),\n"
	"  --nproc N,\n"
	"  --zero 0|1|2|3, --pp-schedule gpipe|1f1b|interleaved (or --schedule), --virtual-stages V,\n"
	"  --pp-head-split auto|off|F, --activation-checkpointing none|blocks|selective, --dtype fp32|bf16,\n"
	"  --grad-reduce-dtype fp32|bf16, --bucket-mb X, --threads N (threads per rank; local cluster),\n"
	"  --sequence-parallel (with --tp > 1)\n"
	"what the run holds beside its steps (as loom train): --train-data GLOB, --val-data GLOB (the shards' sizes:\n"
	"  the pages a rank maps), --steps N, --shuffle 0|1, --eval-batches M\n"
	"cluster:\n"
	"  --cluster local        this machine, measured (default): peaks from the cache (measured once if missing),\n"
	"                         memory bandwidth now\n"
	"  --cluster NAME         a shipped profile: cpu-node, a100-8x80g, h100-8x, mi300x-8x (docs/plan.md: sources)\n"
	"  --cluster FILE.json    nodes, ranks_per_node, peak_flops_fp32/bf16, memory_bytes, intra/inter_bw and _lat,\n"
	"                         price_rank_hour, ... (docs/plan.md)\n"
	"  --load auto|X          local: other work's runnable threads competing for the CPUs (default auto:\n"
	"                         measured now, 0.5 s of one core's FMA loop against its cached peak; 0: idle)\n"
	"  --nodes N              nodes of a profile or file (default: its own, or enough for the ranks)\n"
	"  --impl loom|ideal      loom (default): what loom's trainer allocates (a pipeline stage keeps the whole\n"
	"                         model's states); ideal: a stage keeps only its layers' (Megatron)\n"
	"output:\n"
	"  --tokens N             a token budget: wall clock and cost (accepts 1e9, 20B, 300M)\n"
	"  --json                 one JSON object (docs/plan.md, \"JSON\")\n"
	"  --search               rank every mesh, ZeRO stage, recomputation and schedule of --ranks N (or --nodes x\n"
	"                         the cluster's ranks per node) at the same tokens per step; --top K rows (default 12)\n"
	"  --ranks N              ranks for --search\n"
	"  --measure              only measure what the peak cache lacks or does not trust for --threads and --dtype\n"
	"                         (peaks, memory bandwidths, the kernels' rates: docs/plan.md, \"Calibration\") and\n"
	"                         cache it; loom train runs this in a process of its own\n"
	"\n"
	"loom train prints and logs exactly this plan for its own flags (docs/plan.md, \"One prediction\"); the\n"
	"defaults are the trainer's: --threads as the run gets them, --load measured\n";

typedef struct {
	loom_train_config_t tc; /* the run's flags, as `loom train` parses them into its config ... */
	loom_model_opts_t mo;   /* ... and its model's options (tp, checkpointing, dtype, sequence parallel) */
	int pp;
	loom_model_config_t mc; /* the model they resolve to */
	loom_plan_config_t pc;  /* what they give (loom_plan_config_of_run), with the planner's own below */
	double tokens;
	loom_plan_impl_t impl;
	cli_model_flags_t mf; /* the model flags as `loom train` takes them (model_flags.c) */
	const char *cluster;
	double load;
	int grad_accum, nproc, dp_flag, threads, json, search, ranks, nodes, top, measure;
	long long total_batch;
} opts_t;

/* Flags of `loom train` that do not change the plan, with a value, and without one. */
static const char *const ignored_val[] = {
	"--matrix-lr", "--embedding-lr", "--unembedding-lr",
	"--scalar-lr", "--adam-beta1", "--adam-beta2", "--warmdown-frac", "--wd-scale", "--ref-tokens", "--lr",
	"--warmup", "--min-lr-frac", "--weight-decay", "--beta1", "--beta2", "--eps", "--grad-clip", "--seed",
	"--save-dir", "--save-every", "--keep-checkpoints", "--resume-from", "--eval-every",
	"--sample-every", "--log", "--peak-flops", "--print-every", "--check-replicas", "--lr-scale",
	"--ref-batch-size", "--trace", "--memory-check", NULL};
static const char *const ignored_bool[] = {"--resume", "--profile", "--check", NULL};

static long long int_in(const char *flag, const char *v, long long lo, long long hi)
{
	long long x = cli_parse_int("plan", flag, v);
	if (x < lo || x > hi)
		cli_die("plan", "%s: %lld is out of range [%lld, %lld]", flag, x, lo, hi);
	return x;
}

/* 1e9, 20B, 300M, 5T, 4096 */
static double parse_tokens(const char *v)
{
	char *end;
	double x = strtod(v, &end), mult = 1;
	if (*end == 'K' || *end == 'k') mult = 1e3, end++;
	else if (*end == 'M') mult = 1e6, end++;
	else if (*end == 'B' || *end == 'G') mult = 1e9, end++;
	else if (*end == 'T') mult = 1e12, end++;
	if (end == v || *end || !(x > 0) || !isfinite(x))
		cli_die("plan", "--tokens: '%s' is not a token count (e.g. 1e9, 20B, 300M)", v);
	return x * mult;
}

static void parse(int argc, char **argv, opts_t *o)
{
	const char *v;
	memset(o, 0, sizeof *o);
	o->tc = loom_train_defaults(); /* as loom train's parse starts */
	o->tc.B = 4, o->tc.T = -1;
	cli_model_flags_init(&o->mf);
	o->grad_accum = -1, o->top = 12;
	o->mo.tp_size = o->pp = o->mo.cp_size = 1;
	o->cluster = "local";
	o->load = -1;
#define FLAG(name) cli_flag(argc, argv, &i, name, &v)
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		int skip = 0;
		for (int k = 0; ignored_val[k] && !skip; k++)
			skip = FLAG(ignored_val[k]);
		for (int k = 0; ignored_bool[k] && !skip; k++)
			skip = !strcmp(a, ignored_bool[k]);
		if (skip)
			continue;
		if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			fputs(usage_text, stdout);
			exit(0);
		} else if (cli_model_flag("plan", argc, argv, &i, &o->mf)) {
			continue;
		}
		else if (FLAG("--batch-size")) o->tc.B = (int)int_in("--batch-size", v, 1, 1 << 20);
		else if (FLAG("--seq-len")) o->tc.T = (int)int_in("--seq-len", v, 1, 1 << 20);
		else if (FLAG("--train-data")) o->tc.train_data = v; /* its shards' sizes: the pages a rank maps */
		else if (FLAG("--val-data")) o->tc.val_data = v;
		else if (FLAG("--eval-batches")) o->tc.eval_batches = (int)int_in("--eval-batches", v, 1, 1 << 30);
		else if (FLAG("--steps")) o->tc.lr.total_steps = int_in("--steps", v, 1, 1LL << 40);
		else if (FLAG("--shuffle")) o->tc.shuffle = (int)int_in("--shuffle", v, 0, 1);
		else if (FLAG("--grad-accum") || FLAG("--micro-batches")) {
			int m = (int)int_in(a, v, 1, 1 << 20);
			if (o->grad_accum > 0 && o->grad_accum != m)
				cli_die("plan", "--micro-batches and --grad-accum disagree (%d, %d: they are the same setting)", m,
				        o->grad_accum);
			o->grad_accum = m;
		} else if (FLAG("--total-batch-size")) o->total_batch = int_in("--total-batch-size", v, 1, 1LL << 50);
		else if (FLAG("--dp")) o->dp_flag = (int)int_in("--dp", v, 1, 1 << 20);
		else if (FLAG("--tp")) o->mo.tp_size = (int)int_in("--tp", v, 1, 4096);
		else if (FLAG("--pp")) o->pp = (int)int_in("--pp", v, 1, 4096);
		else if (FLAG("--cp")) o->mo.cp_size = (int)int_in("--cp", v, 1, 4096);
		else if (FLAG("--nproc")) o->nproc = (int)int_in("--nproc", v, 1, 1 << 20);
		else if (FLAG("--zero")) o->tc.zero = (int)int_in("--zero", v, 0, 3);
		else if (FLAG("--optimizer")) {
			if (loom_optimizer_parse(v, &o->tc.optimizer) != LOOM_OK)
				cli_die("plan", "--optimizer: %s", loom_errmsg());
		}
		else if (FLAG("--pp-schedule") || FLAG("--schedule")) {
			int pp_flag = a[2] == 'p';
			if (pp_flag || !strcmp(v, "gpipe") || !strcmp(v, "1f1b") || !strcmp(v, "interleaved")) {
				if (o->tc.pp_schedule && strcmp(o->tc.pp_schedule, v))
					cli_die("plan", "two pipeline schedules, %s and %s: give one --pp-schedule", o->tc.pp_schedule, v);
				o->tc.pp_schedule = v;
			}
			/* else the LR schedule's (cosine, ...): not the plan's */
		} else if (FLAG("--virtual-stages")) o->tc.pp_virtual_stages = (int)int_in("--virtual-stages", v, 1, 4096);
		else if (FLAG("--pp-head-split"))
			o->tc.pp_head_split = !strcmp(v, "auto") ? 0.0 : !strcmp(v, "off") ? -1.0
			                      : cli_parse_double("plan", "--pp-head-split", v);
		else if (FLAG("--activation-checkpointing")) {
			if (loom_act_ckpt_parse(v, &o->mo.act_ckpt) != LOOM_OK)
				cli_die("plan", "--activation-checkpointing: %s", loom_errmsg());
		} else if (FLAG("--dtype")) {
			if (loom_compute_dtype_parse(v, &o->mo.dtype) != LOOM_OK)
				cli_die("plan", "--dtype: %s", loom_errmsg());
		} else if (FLAG("--grad-reduce-dtype")) {
			loom_compute_dtype_t g;
			if (loom_compute_dtype_parse(v, &g) != LOOM_OK)
				cli_die("plan", "--grad-reduce-dtype: %s", loom_errmsg());
			o->tc.grad_reduce_dtype = g == LOOM_COMPUTE_BF16 ? LOOM_BFLOAT16 : LOOM_FLOAT32;
		} else if (FLAG("--bucket-mb")) o->tc.bucket_mb = cli_parse_double("plan", "--bucket-mb", v);
		else if (FLAG("--threads")) o->threads = (int)int_in("--threads", v, 1, 1024);
		else if (!strcmp(a, "--sequence-parallel")) o->mo.sequence_parallel = 1;
		else if (FLAG("--cluster")) o->cluster = v;
		else if (FLAG("--load")) {
			o->load = !strcmp(v, "auto") ? -1 : cli_parse_double("plan", "--load", v);
			if (o->load < -1 || !isfinite(o->load))
				cli_die("plan", "--load: '%s' is not auto or a number of threads >= 0", v);
		} else if (FLAG("--nodes")) o->nodes = (int)int_in("--nodes", v, 1, 1 << 20);
		else if (FLAG("--ranks")) o->ranks = (int)int_in("--ranks", v, 1, 1 << 24);
		else if (FLAG("--tokens")) o->tokens = parse_tokens(v);
		else if (FLAG("--top")) o->top = (int)int_in("--top", v, 1, 100000);
		else if (FLAG("--impl")) {
			if (strcmp(v, "loom") && strcmp(v, "ideal"))
				cli_die("plan", "--impl: '%s' is not one of loom, ideal", v);
			o->impl = !strcmp(v, "ideal") ? LOOM_PLAN_IDEAL : LOOM_PLAN_LOOM;
		} else if (!strcmp(a, "--json")) o->json = 1;
		else if (!strcmp(a, "--measure")) o->measure = 1;
		else if (!strcmp(a, "--search")) o->search = 1;
		else
			cli_die("plan", "unknown flag '%s' (see loom plan --help)", a);
	}
#undef FLAG
	if (o->grad_accum > 0 && o->total_batch > 0)
		cli_die("plan", "give --grad-accum (--micro-batches) or --total-batch-size, not both");
	cli_model_flags_check("plan", &o->mf);
}

/* The model config as `loom train` resolves it (model_flags.c). */
static void model_config(opts_t *o)
{
	cli_model_resolve("plan", &o->mf, &o->tc.T, &o->mc);
}

static void get_cluster(opts_t *o, loom_cluster_t *c, int ranks)
{
	int rc;
	if (!strcmp(o->cluster, "local")) { /* as loom train sets it up (loom_plan_local) */
		loom_plan_local_t how = {.threads = o->threads, .load = o->load, .measure = 1};
		if (loom_cluster_this_machine(&how, o->mo.dtype, c) != LOOM_OK)
			cli_die("plan", "--cluster local: %s", loom_errmsg());
		return;
	}
	if (strchr(o->cluster, '.') || strchr(o->cluster, '/'))
		rc = loom_cluster_load(o->cluster, c);
	else
		rc = loom_cluster_profile(o->cluster, 1, c);
	if (rc != LOOM_OK)
		cli_die("plan", "--cluster: %s", loom_errmsg());
	if (o->nodes > 0)
		c->nodes = o->nodes;
	else if (c->ranks_per_node > 0 && ranks > c->nodes * c->ranks_per_node) /* as many nodes as the ranks need */
		c->nodes = (ranks + c->ranks_per_node - 1) / c->ranks_per_node;
	if (o->threads > 0)
		c->threads = o->threads;
	if (o->load >= 0)
		c->background_load = o->load;
}

static void fmt_time(double s, char *buf, size_t cap)
{
	if (s >= 86400 * 2)
		snprintf(buf, cap, "%.1f days", s / 86400);
	else if (s >= 3600)
		snprintf(buf, cap, "%.1f h", s / 3600);
	else if (s >= 60)
		snprintf(buf, cap, "%.1f min", s / 60);
	else
		snprintf(buf, cap, "%.2f s", s);
}

static void fmt_bytes(double b, char *buf, size_t cap)
{
	if (b >= 1024.0 * 1073741824.0)
		snprintf(buf, cap, "%.2f TiB", b / (1024.0 * 1073741824.0));
	else if (b >= 1073741824.0)
		snprintf(buf, cap, "%.2f GiB", b / 1073741824.0);
	else
		snprintf(buf, cap, "%.1f MiB", b / 1048576.0);
}

static const char *schedule_name(const loom_plan_config_t *pc)
{
	return pc->pp > 1 ? (pc->schedule_gpipe ? "gpipe" : pc->virtual_stages > 1 ? "interleaved" : "1f1b") : "-";
}

static void print_human(const loom_plan_t *p, const loom_cluster_t *c)
{
	const loom_plan_config_t *pc = &p->cfg;
	const loom_plan_memory_t *m = &p->memory;
	char b[11][32], t[64];
	printf("plan: %s L%d H%d C%d T%d V%d, %.0f parameters (%.4g M)", loom_arch_name(pc->model.arch), pc->model.n_layer,
	       pc->model.n_head, pc->model.n_embd, pc->model.seq_len, pc->model.vocab_size, p->params, p->params / 1e6);
	if (pc->tp > 1)
		printf(", %.0f per tp shard", p->shard_params);
	char cp[32] = "";
	if (pc->cp > 1)
		snprintf(cp, sizeof cp, " x cp %d", pc->cp);
	printf("\nmesh: dp %d%s x tp %d x pp %d = %d ranks%s; ZeRO %d; checkpointing %s; %s matmuls%s%s%s\n", pc->dp, cp,
	       pc->tp, pc->pp, p->world, pc->sequence_parallel && pc->tp > 1 ? " (sequence parallel)" : "", pc->zero,
	       loom_act_ckpt_name(pc->act_ckpt), loom_compute_dtype_name(pc->dtype),
	       pc->pp > 1 ? "; schedule " : "", pc->pp > 1 ? schedule_name(pc) : "",
	       pc->impl == LOOM_PLAN_IDEAL ? "; impl ideal (stages keep their own layers' states)" : "");
	printf("cluster: %s, %d node%s x %d ranks; %.4g TFLOP/s per rank (%s) at efficiency %.2f%s\n  (%s)\n", c->name,
	       c->nodes, c->nodes == 1 ? "" : "s", c->ranks_per_node, p->peak_flops / 1e12,
	       loom_compute_dtype_name(pc->dtype), c->efficiency,
	       p->oversubscribed ? "; oversubscribed: the ranks' threads share fewer cores" : "", c->source);
	if (c->figures[0])
		printf("figures: %s (docs/plan.md, \"Calibration\")\n", c->figures);
	if (c->background_load > 0)
		printf("load: other work keeps %.1f threads runnable on the %d CPUs: the ranks get %.0f%% of a core per "
		       "thread\n", c->background_load, c->cores, 100.0 * p->cpu_share);
	printf("batch: B=%d T=%d micro-batches=%d dp=%d -> %.0f tokens per step", pc->B, pc->T, pc->M, pc->dp,
	       p->tokens_per_step);
	if (pc->cp > 1)
		printf("; each sequence over cp %d ranks (%d positions each, two chunks of %d)", pc->cp, pc->T / pc->cp,
		       pc->T / pc->cp / 2);
	putchar('\n');
	fmt_bytes(m->params, b[0], 32), fmt_bytes(m->grads, b[1], 32), fmt_bytes(m->optimizer, b[2], 32);
	fmt_bytes(m->activations, b[3], 32), fmt_bytes(m->comm, b[4], 32), fmt_bytes(m->overhead, b[5], 32);
	fmt_bytes(m->total, b[6], 32), fmt_bytes(m->other, b[7], 32), fmt_bytes(m->data, b[8], 32);
	fmt_bytes(m->eval, b[9], 32), fmt_bytes(m->scratch, b[10], 32);
	printf("memory per rank%s: parameters %s, gradients %s, optimizer %s, activations %s, communication buffers %s",
	       pc->pp > 1 ? " (the largest stage)" : "", b[0], b[1], b[2], b[3], b[4]);
	if (m->other > 0)
		printf(", other at start-up %s", b[7]);
	printf(", data %s", b[8]);
	if (m->eval > 0)
		printf(", evaluation %s", b[9]);
	if (m->scratch > 0)
		printf(", threads' scratch %s", b[10]);
	printf(", process %s; total %s", b[5], b[6]);
	if (p->memory_limit > 0) {
		fmt_bytes(p->memory_limit, b[0], 32);
		printf(" of %s (%s, headroom %.0f%%)", b[0], p->fits ? "fits" : "DOES NOT FIT", 100.0 * p->headroom);
	}
	printf("\nflops: %.4g per token (6N + attention inside the causal mask and windows; %s's nominal count %.4g), "
	       "%.4g per step, %.4g per rank and step (with recomputation)\n", p->flops_per_token,
	       loom_arch_name(pc->model.arch), loom_model_flops_per_token_nominal(&pc->model, pc->T), p->flops_per_step,
	       p->flops_per_rank_step);
	printf("compute: %.1f ms per step per rank (of it the optimizer %.1f ms)\n", 1e3 * p->compute_s,
	       1e3 * p->optimizer_s);
	const struct { const char *name; const loom_plan_comm_t *x; int on; } ax[] = {
		{pc->cp > 1 ? "dp x cp" : "dp", &p->dp, pc->dp * pc->cp > 1}, {"tp", &p->tp, pc->tp > 1},
		{"pp", &p->pp, pc->pp > 1}, {"cp", &p->cp, pc->cp > 1}};
	for (int k = 0; k < 4; k++)
		if (ax[k].on) {
			fmt_bytes(ax[k].x->bytes, b[0], 32);
			printf("communication %s: %s per rank and step, %.1f ms, exposed %.1f ms%s", ax[k].name, b[0],
			       1e3 * ax[k].x->time_s, 1e3 * ax[k].x->exposed_s,
			       (k == 0 && p->cross_node_dp) || (k == 1 && p->cross_node_tp) ? " (crosses nodes)" : "");
			if (k == 3) { /* a layer's transfers, as `loom train` prints them */
				double g = loom_plan_cp_bytes(&pc->model, pc->B, pc->T, pc->cp, pc->tp);
				if (g < 1048576.0)
					snprintf(b[0], 32, "%.1f KiB", g / 1024.0);
				else
					fmt_bytes(g, b[0], 32);
				printf(" (keys and values %s: %s per layer forward, twice that backward%s)",
				       pc->cp_gather ? "all-gathered" : "passed around the ring", b[0],
				       pc->act_ckpt != LOOM_ACT_CKPT_NONE ? ", once more recomputed" : "");
			}
			putchar('\n');
		}
	if (pc->pp > 1 && pc->virtual_stages > 1)
		printf("pipeline: %d model chunks per rank; bubble %.1f%% (simulated schedule; ideal (P-1)/(V M+P-1) = "
		       "%.1f%%)\n", pc->virtual_stages, 100.0 * p->bubble, 100.0 * p->bubble_theory);
	else if (pc->pp > 1)
		printf("pipeline: bubble %.1f%% (simulated schedule; ideal (P-1)/(M+P-1) = %.1f%%)\n", 100.0 * p->bubble,
		       100.0 * p->bubble_theory);
	printf("step: %.1f ms; %.0f tokens/s; MFU %.1f%%\n", 1e3 * p->step_time_s, p->tokens_per_s, 100.0 * p->mfu);
	if (pc->tokens > 0) {
		fmt_time(p->wall_s, t, sizeof t);
		printf("budget: %.4g tokens = %.0f steps, %s on %d ranks", pc->tokens, p->steps, t, p->world);
		if (c->price_rank_hour > 0)
			printf(", cost %.2f (%.2f per rank-hour)", p->cost, c->price_rank_hour);
		putchar('\n');
	}
}

static void describe(const loom_plan_t *p, char *buf, size_t cap)
{
	const loom_plan_config_t *pc = &p->cfg;
	char v[16] = "";
	if (pc->pp > 1 && pc->virtual_stages > 1 && !pc->schedule_gpipe)
		snprintf(v, sizeof v, " V %d", pc->virtual_stages);
	char cp[24] = "";
	if (pc->cp > 1)
		snprintf(cp, sizeof cp, " x cp %d", pc->cp);
	snprintf(buf, cap, "dp %d%s x tp %d x pp %d%s, ZeRO %d, ckpt %s%s%s%s", pc->dp, cp, pc->tp, pc->pp,
	         pc->sequence_parallel && pc->tp > 1 ? " sp" : "", pc->zero, loom_act_ckpt_name(pc->act_ckpt),
	         pc->pp > 1 ? ", " : "", pc->pp > 1 ? schedule_name(pc) : "", v);
}

/* Why `alt` is slower than `top`: the component of its step that grew the most. */
static void why_slower(const loom_plan_t *top, const loom_plan_t *alt, char *buf, size_t cap)
{
	double d_tp = alt->tp.exposed_s - top->tp.exposed_s, d_dp = alt->dp.exposed_s - top->dp.exposed_s;
	double d_cp = alt->cp.exposed_s - top->cp.exposed_s;
	double d_pp = alt->pp.exposed_s - top->pp.exposed_s;
	double d_bub = alt->bubble * (alt->step_time_s) - top->bubble * top->step_time_s;
	double d_cmp = (alt->flops_per_rank_step / (alt->flops_per_step / alt->world) - 1.0) * alt->compute_s -
	               (top->flops_per_rank_step / (top->flops_per_step / top->world) - 1.0) * top->compute_s;
	double d_opt = alt->optimizer_s - top->optimizer_s, best = d_tp;
	int k = 0;
	const double d[] = {d_tp, d_dp, d_pp, d_bub, d_cmp, d_opt, d_cp};
	for (int i = 1; i < 7; i++)
		if (d[i] > best)
			best = d[i], k = i;
	switch (k) {
	case 0:
		snprintf(buf, cap, "tp %d's all-reduces on the training thread: +%.1f ms exposed%s", alt->cfg.tp, 1e3 * d_tp,
		         alt->cross_node_tp ? " (tp crosses nodes: the inter-node link)" : "");
		break;
	case 1:
		snprintf(buf, cap, "dp gradient traffic not hidden by backward: +%.1f ms%s", 1e3 * d_dp,
		         alt->cross_node_dp ? " (dp crosses nodes)" : "");
		break;
	case 2: snprintf(buf, cap, "pipeline transfers: +%.1f ms", 1e3 * d_pp); break;
	case 3: snprintf(buf, cap, "pipeline bubble %.0f%% of the step", 100.0 * alt->bubble); break;
	case 4:
		snprintf(buf, cap, "recomputation adds %.0f%% FLOPs",
		         100.0 * (alt->flops_per_rank_step * alt->world / alt->flops_per_step - 1.0));
		break;
	case 5: snprintf(buf, cap, "optimizer over more parameters per rank: +%.1f ms", 1e3 * d_opt); break;
	default:
		snprintf(buf, cap, "cp %d's key/value transfers on the training thread: +%.1f ms exposed", alt->cfg.cp,
		         1e3 * d_cp);
		break;
	}
	if (best <= 0)
		snprintf(buf, cap, "within the model's noise of the top one (%.1f%% slower)",
		         100.0 * (alt->step_time_s / top->step_time_s - 1.0));
}

static int search(opts_t *o, const loom_cluster_t *c, int ranks)
{
	int cap = 100000, n, total;
	loom_plan_t *all = malloc(sizeof *all * (size_t)cap);
	char d[128], w[256], mem[32], lim[32];
	if (!all)
		cli_die("plan", "out of memory");
	if (loom_plan_search(&o->pc, c, ranks, all, cap, &n, &total) != LOOM_OK)
		cli_die("plan", "--search: %s", loom_errmsg());
	if (o->json) {
		printf("{\"ranks\":%d,\"estimated\":%d,\"fit\":%d,\"plans\":[", ranks, total, n);
		for (int k = 0; k < n && k < o->top; k++) {
			const loom_plan_t *p = &all[k];
			printf("%s{\"dp\":%d,\"cp\":%d,\"tp\":%d,\"pp\":%d,\"zero\":%d,\"activation_checkpointing\":\"%s\",\"schedule\":\"%s\","
			       "\"virtual_stages\":%d,\"sequence_parallel\":%s,"
			       "\"micro_batches\":%d,\"step_time_s\":%.6g,\"tokens_per_s\":%.6g,\"mfu\":%.6f,\"memory_total_bytes\":%.0f,"
			       "\"headroom\":%.4f,\"cost\":%.6g}", k ? "," : "", p->cfg.dp, p->cfg.cp, p->cfg.tp, p->cfg.pp, p->cfg.zero,
			       loom_act_ckpt_name(p->cfg.act_ckpt), schedule_name(&p->cfg),
			       p->cfg.pp > 1 && p->cfg.virtual_stages > 1 ? p->cfg.virtual_stages : 1,
			       p->cfg.sequence_parallel && p->cfg.tp > 1 ? "true" : "false", p->cfg.M, p->step_time_s,
			       p->tokens_per_s, p->mfu, p->memory.total, p->headroom, p->cost);
		}
		printf("]}\n");
		free(all);
		return n > 0 ? 0 : 1;
	}
	printf("search: %s L%d C%d, %.0f parameters; %d ranks on %s (%d x %d); B=%d T=%d, %.0f tokens per step; %d "
	       "configurations, %d fit in memory\n", loom_arch_name(o->pc.model.arch), o->pc.model.n_layer,
	       o->pc.model.n_embd, (double)loom_model_num_params(&o->pc.model), ranks, c->name, c->nodes,
	       c->ranks_per_node, o->pc.B, o->pc.T, (double)o->pc.B * o->pc.T * o->pc.M, total, n);
	if (total == 0) {
		printf("no configuration of %d ranks is valid for this model (tp must divide the heads and fit a node, pp "
		       "at most the layers, the step's %d micro-batch%s must divide over dp: raise --grad-accum or "
		       "--total-batch-size)\n", ranks, o->pc.M, o->pc.M == 1 ? "" : "es");
		free(all);
		return 1;
	}
	if (n == 0) {
		const loom_plan_t *least = &all[0];
		for (int k = 1; k < total && k < cap; k++)
			if (all[k].memory.total < least->memory.total)
				least = &all[k];
		fmt_bytes(least->memory.total, mem, sizeof mem), fmt_bytes(least->memory_limit, lim, sizeof lim);
		describe(least, d, sizeof d);
		printf("fits nowhere: the smallest configuration (%s) needs %s per rank, the ranks have %s; add ranks or "
		       "nodes, shorten the micro-batch, or recompute activations\n", d, mem, lim);
		free(all);
		return 1;
	}
	printf("%4s %-40s %4s %10s %10s %6s %10s %8s %10s\n", "#", "configuration", "M", "step ms", "tok/s", "MFU",
	       "mem/rank", "headroom", "cost");
	for (int k = 0; k < n && k < o->top; k++) {
		const loom_plan_t *p = &all[k];
		char cost[32] = "-";
		describe(p, d, sizeof d);
		fmt_bytes(p->memory.total, mem, sizeof mem);
		if (p->cfg.tokens > 0 && c->price_rank_hour > 0)
			snprintf(cost, sizeof cost, "%.2f", p->cost);
		printf("%4d %-40s %4d %10.1f %10.0f %5.1f%% %10s %7.0f%% %10s\n", k + 1, d, p->cfg.M, 1e3 * p->step_time_s,
		       p->tokens_per_s, 100.0 * p->mfu, mem, 100.0 * p->headroom, cost);
	}
	/* why the top one wins: against the obvious alternatives, the best of each kind that is not it */
	describe(&all[0], d, sizeof d);
	printf("why %s is first:\n", d);
	const char *kinds[] = {"plain data parallel", "ZeRO", "tensor parallel", "pipeline", "recomputation",
	                       "context parallel"};
	for (int kind = 0; kind < 6; kind++)
		for (int k = 1; k < n; k++) {
			const loom_plan_config_t *q = &all[k].cfg, *t = &all[0].cfg;
			int is = kind == 0 ? (q->tp == 1 && q->pp == 1 && q->cp <= 1 && q->zero == 0 && q->act_ckpt == 0)
			         : kind == 1 ? q->zero > 0 && t->zero == 0
			         : kind == 2 ? q->tp > 1 && t->tp == 1
			         : kind == 3 ? q->pp > 1 && t->pp == 1
			         : kind == 4 ? q->act_ckpt != 0 && t->act_ckpt == 0
			                     : q->cp > 1 && t->cp <= 1;
			if (!is)
				continue;
			describe(&all[k], d, sizeof d);
			why_slower(&all[0], &all[k], w, sizeof w);
			printf("  vs %s (%s, #%d, %.1f%% slower): %s\n", kinds[kind], d, k + 1,
			       100.0 * (all[k].step_time_s / all[0].step_time_s - 1.0), w);
			break;
		}
	if (n > 1) { /* and against the runner-up, whatever it is */
		describe(&all[1], d, sizeof d);
		why_slower(&all[0], &all[1], w, sizeof w);
		printf("  vs the runner-up (%s, %.1f%% slower): %s\n", d,
		       100.0 * (all[1].step_time_s / all[0].step_time_s - 1.0), w);
	}
	if (total > n)
		printf("dropped: %d configuration%s that do not fit in memory\n", total - n, total - n == 1 ? "" : "s");
	free(all);
	return 0;
}

/* Threads per rank when --threads is not given: what `loom train` runs with, OMP_NUM_THREADS or one per
 * CPU, where in a job of several ranks `loom run` (and its mpirun) sets OMP_NUM_THREADS=1 when unset. */
static int default_threads(int world)
{
	const char *e = getenv("OMP_NUM_THREADS");
	return (e && atoi(e) > 0) || world <= 1 ? omp_get_max_threads() : 1;
}

/* --measure: fill the peak cache for --threads and --dtype (what `loom train` runs in a process of its
 * own before its first step, so that the measurements' buffers are not in its resident set). */
static int measure(const opts_t *o)
{
	char what[512], path[1000];
	int threads = o->threads > 0 ? o->threads : 1;
	if (loom_cluster_local_missing(threads, o->mo.dtype, what, sizeof what) == 0)
		return 0;
	if (loom_peak_cache_path_kind(LOOM_PEAK_HW_FP32, path, sizeof path) != LOOM_OK)
		snprintf(path, sizeof path, "(no cache: %s)", loom_errmsg());
	else if (strrchr(path, '/'))
		*strrchr(path, '/') = 0;
	printf("measuring %s with %d thread%s (once; cached in %s)...\n", what, threads, threads == 1 ? "" : "s", path);
	fflush(stdout);
	if (loom_cluster_local_measure(threads, o->mo.dtype) != LOOM_OK)
		cli_die("plan", "--measure: %s", loom_errmsg());
	return 0;
}

int loom_cli_plan(int argc, char **argv)
{
	opts_t o;
	loom_cluster_t c;
	loom_plan_t p;
	parse(argc, argv, &o);
	if (o.measure)
		return measure(&o);
	model_config(&o);
	int ranks = o.search ? (o.ranks ? o.ranks : o.nproc) : 0, tp = o.mo.tp_size, pp = o.pp, dp = 1;
	int cp = o.mo.cp_size; /* tp x cp x pp: the ranks that are not data parallel */
	if (o.search && !ranks && o.nodes <= 0)
		cli_die("plan", "--search needs --ranks N (or --nodes N with a cluster profile or file)");
	if (!o.search) {
		int world = o.nproc ? o.nproc : o.ranks;
		dp = o.dp_flag ? o.dp_flag : world ? world / (cp * tp * pp) : 1;
		if (dp < 1 || (world && dp * cp * tp * pp != world))
			cli_die("plan", "--dp %d x --cp %d x --tp %d x --pp %d is not the %d ranks", dp, cp, tp, pp, world);
		if (cp > 1 && loom_cp_check(o.tc.T, cp) != LOOM_OK)
			cli_die("plan", "--cp %d with --seq-len %d: %s", cp, o.tc.T, loom_errmsg());
		if (cp > 1 && loom_cp_attention_ring() < 0)
			cli_die("plan", "--cp %d: %s", cp, loom_errmsg());
		if (o.mo.sequence_parallel && tp < 2)
			cli_die("plan", "--sequence-parallel shards the sequence over the tensor-parallel ranks: it needs --tp 2 "
			        "or more");
		if (o.tc.zero > 0 && dp * cp < 2)
			cli_die("plan", "--zero %d with dp %d: ZeRO shards the training state over the data-parallel ranks and "
			        "needs at least 2 (as loom train refuses it)", o.tc.zero, dp);
	}
	if (o.total_batch > 0) {
		long long per = (long long)o.tc.B * o.tc.T * dp;
		if (o.total_batch % per)
			cli_die("plan", "--total-batch-size %lld is not a multiple of B x T x dp = %lld", o.total_batch, per);
		o.tc.accum = (int)(o.total_batch / per);
	} else {
		o.tc.accum = o.grad_accum > 0 ? o.grad_accum : 1;
	}
	/* the schedule's conditions (an interleaved schedule without --virtual-stages too), as loom train's */
	if (!o.search && loom_pp_check(&o.mc, o.tc.pp_schedule, pp, o.tc.pp_virtual_stages, o.tc.accum) != LOOM_OK)
		cli_die("plan", "%s", loom_errmsg());
	if (o.threads <= 0)
		o.threads = default_threads(o.search ? 1 : dp * cp * tp * pp);
	/* the run's plan configuration exactly as loom train derives it from the same flags */
	loom_plan_config_of_run(&o.tc, &o.mc, &o.mo, dp, pp, &o.pc);
	o.pc.tokens = o.tokens, o.pc.impl = o.impl;
	if (o.search) {
		o.pc.zero = o.tc.zero; /* the search varies it */
		get_cluster(&o, &c, ranks);
		if (!ranks)
			ranks = c.nodes * c.ranks_per_node;
		return search(&o, &c, ranks);
	}
	if (!strcmp(o.cluster, "local")) { /* the one prediction loom train prints and logs */
		loom_plan_local_t how = {.threads = o.threads, .load = o.load, .measure = 1};
		if (loom_plan_local(&o.pc, &how, &c, &p) != LOOM_OK)
			cli_die("plan", "%s", loom_errmsg());
	} else {
		get_cluster(&o, &c, dp * cp * tp * pp);
		if (loom_plan_estimate(&o.pc, &c, &p) != LOOM_OK)
			cli_die("plan", "%s", loom_errmsg());
	}
	if (o.json) {
		int n = loom_plan_json(&p, &c, NULL, 0);
		char *buf = malloc((size_t)n + 1);
		if (!buf)
			cli_die("plan", "out of memory");
		loom_plan_json(&p, &c, buf, (size_t)n + 1);
		printf("%s\n", buf);
		free(buf);
	} else {
		print_human(&p, &c);
	}
	return 0;
}
