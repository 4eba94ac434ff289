/* train.c: `loom train`: parse and validate flags, build or load the model, run the trainer (loom/train.h)
 * printing one line per step, and optionally sample text and print the per-kernel profile.
 *
 * Data parallelism: every rank of a job (`loom run`, mpirun, srun) runs this same command; the
 * communicator joins them (a job of one rank is the single-process trainer, unchanged), and rank 0
 * alone prints, logs, measures the MFU peak and saves. `--nproc N` outside a job re-executes this
 * binary (/proc/self/exe) as `loom run --nproc-per-node N loom train ARGS` without --nproc.
 *
 * Sequence lengths: --seq-len is the length T trained on. The model's maximum (its n_positions, the
 * rows of wpe) comes from --n-positions, from --init-from's file, else from the GPT-2 preset (tiny's
 * when --model is not given: the size flags override only their own fields), or for nanochat from T
 * (base_train's sequence_len). T above the model's maximum is an error (model_flags.c). */
#include <errno.h>
#include <glob.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "loom/cpu.h"
#include "loom/ckpt.h"
#include "loom/comm.h"
#include "loom/data.h"
#include "loom/gpt2.h"
#include "loom/llama.h"
#include "loom/mesh.h"
#include "loom/plan.h"
#include "loom/train.h"
#include "loom/util.h"
#include "train_memory.h"

static const char *const usage_text =
	"usage: loom train --train-data GLOB --steps N [flags]\n"
	"\n"
	"data:\n"
	"  --train-data GLOB      token shards (llm.c format), e.g. 'data/train_*.bin' (required)\n"
	"  --val-data GLOB        validation shards; evaluated every --eval-every steps and at the end\n"
	"  --shuffle 0|1          shuffle the order of batches each epoch (default 0)\n"
	"model (default --model tiny):\n"
	"  --arch gpt2|nanochat|llama  the model family (default gpt2); nanochat is karpathy/nanochat's GPT\n"
	"                         (bac5a35), llama transformers' LlamaForCausalLM / Qwen2ForCausalLM\n"
	"  --model tiny|small|gpt2  a GPT-2 preset (--arch llama: smollm2-135m|smollm2-360m|tiny); each flag\n"
	"                         below overrides only the field it names (the positions stay the preset's\n"
	"                         unless --n-positions gives them)\n"
	"  --depth D              nanochat's sizing (base_train): C = ceil(D x aspect / head-dim) x head-dim,\n"
	"                         heads C / head-dim, L = D; --aspect-ratio A (64) --head-dim H (128)\n"
	"  --n-kv-head K          nanochat, llama: key/value heads (grouped-query attention; default the heads,\n"
	"                         llama the preset's)\n"
	"  --head-dim D           llama: channels per head (default n-embd / n-head)\n"
	"  --intermediate-size I  llama: the SwiGLU MLP's width (default the preset's; with --n-embd C alone,\n"
	"                         8C/3 rounded up to 256)\n"
	"  --rope-theta X --rms-norm-eps E  llama: rotary base and RMSNorm epsilon\n"
	"  --rope-scaling S       llama: default, or llama3:FACTOR:LOW:HIGH:ORIGINAL (Llama 3.1's scaling)\n"
	"  --tie-word-embeddings 0|1  llama: the lm head is the embedding (default the preset's, 1)\n"
	"  --attention-bias 0|1 --mlp-bias 0|1  llama: biases on q, k, v, o / gate, up, down (default 0)\n"
	"  --qkv-bias 0|1         llama: biases on q, k and v only: Qwen2ForCausalLM (default 0)\n"
	"  --window-pattern P     nanochat: S/L per layer, tiled, last layer L (default SSSL)\n"
	"  --short-window W       nanochat: the S window (default half the model's positions)\n"
	"  --n-layer L --n-head H --n-embd C --vocab-size V --n-positions P (the model's positions, its maximum\n"
	"                         sequence length: GPT-2 default the preset's, nanochat's --seq-len as base_train)\n"
	"  --init-from PATH       start from a model instead of random init: a .safetensors or llm.c .bin file, a\n"
	"                         checkpoint directory (DIR/step_N), or a --save-dir (its newest checkpoint)\n"
	"batch:\n"
	"  --batch-size B         sequences per micro-batch (default 4)\n"
	"  --seq-len T            tokens per sequence trained on, at most the model's positions (default: them)\n"
	"  --grad-accum K         micro-batches per optimizer step and rank (default 1), or\n"
	"  --total-batch-size N   tokens per optimizer step (= B x T x ranks x K; K is derived)\n"
	"optimization:\n"
	"  --steps N              optimizer steps (required)\n"
	"  --lr X                 peak learning rate (default 6e-4)\n"
	"  --warmup W             linear warmup steps (default 0)\n"
	"  --schedule S           cosine|linear|constant decay after warmup (default cosine)\n"
	"  --min-lr-frac F        final learning rate as a fraction of the peak (default 0)\n"
	"  --weight-decay D       AdamW decoupled weight decay on 2-D weights (default 0.1); with --optimizer\n"
	"                         muon, Muon's cautious decay, linear to 0 over the run (0.2 with --arch nanochat)\n"
	"  --optimizer O          adamw (default: one AdamW over every tensor at --lr) or muon (nanochat's\n"
	"                         MuonAdamW: Muon on the blocks' matrices at --matrix-lr 0.02, AdamW on the\n"
	"                         rest: --embedding-lr 0.3, --unembedding-lr 0.004 (both x (C/768)^-0.5),\n"
	"                         --scalar-lr 0.5; --adam-beta1 0.8 --adam-beta2 0.95; the schedule is then\n"
	"                         the rates' multiplier; docs/muon.md)\n"
	"  --warmdown-frac F      with --schedule warmdown: the last F of the steps decay linearly to\n"
	"                         --min-lr-frac (default 0.5, nanochat's)\n"
	"  --wd-scale none|epochs with muon: weight decay x sqrt(B/B_ref) x (D_ref/D), D = steps x tokens per\n"
	"                         step, D_ref = --ref-tokens, B_ref = --ref-batch-size (constant effective\n"
	"                         epochs, arXiv 2405.13698)\n"
	"  --beta1 B1 --beta2 B2 --eps E   AdamW (defaults 0.9, 0.95, 1e-8)\n"
	"  --grad-clip G          clip the global gradient norm to G, 0 disables (default 1.0)\n"
	"  --seed S               initialization, shuffle and sampling seed (default 1337)\n"
	"checkpoints and logs:\n"
	"  --save-dir DIR         write training checkpoints DIR/step_NNNNNNNN (always at the end)\n"
	"  --save-every K         also every K steps\n"
	"  --keep-checkpoints K   keep only the newest K checkpoints (default 0: all); checkpoints of --save-dir\n"
	"                         newer than the step a run starts from (the resumed one's, or 0) are another\n"
	"                         branch's: they move aside into DIR/abandoned-at-step_S/ first, never pruned\n"
	"  --resume               continue from the latest checkpoint in --save-dir (verified; a damaged one is\n"
	"                         an error listing the older ones that verify)\n"
	"  --resume-from DIR      continue from this checkpoint directory (e.g. an older one of --save-dir)\n"
	"  --eval-every K         evaluation interval in steps (default: only at the end)\n"
	"  --eval-batches M       validation micro-batches per evaluation (default 20)\n"
	"  --sample-every K       print a short generated sample every K steps\n"
	"  --log FILE.jsonl       one JSON object per step\n"
	"performance:\n"
	"  --threads N            threads for the kernels (default: OMP_NUM_THREADS, else one per CPU)\n"
	"  --dtype fp32|bf16      matmul precision (default fp32); bf16: bf16 operands, fp32 accumulation,\n"
	"                         fp32 master weights, optimizer, LayerNorm, softmax and loss; any CPU: oneDNN\n"
	"                         on AVX512-BF16/AMX, else portable (LOOM_BF16=auto|native|portable chooses)\n"
	"  --peak-flops F         FLOP/s of one rank used for MFU (default: the hardware's peak for the\n"
	"                         --dtype, measured with loom's FMA loop as `loom bench gemm` prints it, once,\n"
	"                         then cached in ~/.cache/loom/hw_peak[_bf16])\n"
	"  --profile              print the time per kernel at the end\n"
	"  --load auto|X          other work's runnable threads on this machine, for the prediction `loom plan`\n"
	"                         makes of this run (default auto: measured at start, 0.5 s, before any rank\n"
	"                         runs: by --nproc's launcher or a single process; 0 inside a job another\n"
	"                         launcher started); the start-up line, the log and the summary give it\n"
	"  --memory-check refuse|warn  before allocating, compare the run's memory estimate with the limits\n"
	"                         (RLIMIT_AS/DATA, memory cgroup, MemAvailable); refuse (default) stops a run\n"
	"                         that does not fit, saying what would; warn only says it\n"
	"  --activation-checkpointing none|blocks|selective  keep every activation (none, default), only\n"
	"                         each block's input and recompute the block in backward (blocks), or all\n"
	"                         but the attention probabilities, recomputed in backward (selective)\n"
	"  --print-every K        print the line of every K-th step (and the first, last, eval and save\n"
	"                         steps; default 1)\n"
	"data parallel (inside `loom run`, mpirun or srun every rank runs the same command):\n"
	"  --nproc N              train with N processes: runs `loom run --nproc-per-node N loom train ...`\n"
	"  --bucket-mb X          gradient all-reduce bucket size in MiB (default 25; the first bucket 1)\n"
	"  --zero 0|1|2|3         ZeRO stage (docs/zero.md): 0 plain data parallel (default), 1 shards the AdamW\n"
	"                         state over the ranks, 2 also the gradients, 3 also the parameters\n"
	"  --check-replicas K     every K steps verify that all ranks hold bit-identical parameters\n"
	"  --grad-reduce-dtype fp32|bf16  what the gradient all-reduces send (default fp32; bf16: half the\n"
	"                         bytes, reduced in fp32; also ZeRO's reduce-scatters)\n"
	"  --lr-scale S           none|sqrt|linear: scale --lr by (tokens per step / --ref-batch-size)^p,\n"
	"                         p = 1/2 (sqrt) or 1 (linear); default none\n"
	"  --ref-batch-size N     B_ref, the tokens per step that --lr was tuned for; both --lr-scale and\n"
	"                         --wd-scale use it (default with --optimizer muon: nanochat's 2^19)\n"
	"pipeline parallel (data parallel takes the rest of the ranks: dp = ranks / pp):\n"
	"  --pp P                 split the layers into P stages balanced by FLOPs (the embedding on the\n"
	"                         first, the head and loss on the last); ranks are ordered dp, then pp\n"
	"  --micro-batches M      micro-batches per step and data-parallel rank (the same as --grad-accum M)\n"
	"  --pp-schedule S        gpipe|1f1b|interleaved, the pipeline schedule (docs/mesh.md): 1f1b (default)\n"
	"                         stores at most P micro-batches' activations per stage, gpipe M; both idle\n"
	"                         (P-1)/(M+P-1) of the step. interleaved (Megatron): V model chunks per rank,\n"
	"                         idling (P-1)/(V M+P-1); needs --virtual-stages V >= 2, M a multiple of P and\n"
	"                         P x V <= layers. (--schedule gpipe|1f1b, the older spelling, still works)\n"
	"  --virtual-stages V     model chunks per rank with --pp-schedule interleaved: chunk c of stage s\n"
	"                         runs the layers of stage c P + s of P V (default 1)\n"
	"  --pp-head-split auto|off|F  when the last stage runs the head alone (a head heavier than the blocks),\n"
	"                         the fraction F of each micro-batch's positions whose head the stage before it\n"
	"                         computes (default auto: the FLOPs balance; off: the last stage computes all)\n"
	"  --trace DIR            write a Chrome trace (DIR/trace.json, one track per rank; open it in\n"
	"                         Perfetto or chrome://tracing) of every step\n"
	"tensor parallel (ranks ordered tp fastest, then dp, then pp; --tp and --pp compose: each stage a tp shard):\n"
	"  --tp T                 tensor parallel (Megatron): each layer split over T neighbouring ranks (T must\n"
	"                         divide the heads; the vocabulary is padded); data parallel takes the rest\n"
	"  --dp D                 data-parallel ranks (default: ranks / (T x P); when given, checked)\n"
	"  --sequence-parallel    with --tp T > 1: Megatron sequence parallelism; the norms and residual\n"
	"                         adds between the tensor-parallel regions run on B x T / T rows per\n"
	"                         rank (all-gather before, reduce-scatter after the split matmuls instead of\n"
	"                         all-reduces), so their activations take 1/T of the memory; B x T must be\n"
	"                         divisible by T\n"
	"context parallel (ranks ordered tp fastest, then cp, then dp, then pp; composes with --tp and --pp):\n"
	"  --cp N                 each sequence split over N ranks: rank r holds 2 chunks of T/(2N) positions\n"
	"                         (r and 2N-1-r: the causal work is even); attention passes each layer's keys\n"
	"                         and values around the N ranks, overlapped with the blocks' work (the ring;\n"
	"                         LOOM_CP_ATTENTION=gather: one all-gather per layer instead); gradients are\n"
	"                         averaged (and ZeRO shards) over dp x cp; --seq-len must divide by 2N; data\n"
	"                         parallel takes the rest\n"
	"checking:\n"
	"  --check                validate the flags (with --nproc once, before any rank starts), then build the\n"
	"                         mesh, model and parallel strategy on every rank and start them from rank 0's\n"
	"                         parameters; exit 0 without taking a step (no peak measured, no checkpoint or\n"
	"                         log written)\n";

typedef struct {
	loom_train_config_t tc;
	cli_model_flags_t mf;             /* the model flags as given (model_flags.c) */
	loom_model_config_t mc;           /* the model they resolve to */
	const char *init_from;            /* mf.init_from */
	long long total_batch;
	int grad_accum, resume, sample_every, threads, profile;
	const char *resume_from;
	char tokenizer[1100];
	int nproc, print_every;
	loom_lr_scale_t lr_scale;
	long long ref_batch;              /* B_ref of both scalings (loom_ref_batch), 0: none */
	const char *ref_source;           /* where B_ref came from */
	double wd_ref;                    /* muon: the weight decay before --wd-scale */
	double base_lr;                   /* --lr before scaling */
	int rank, world;
	int pp;                           /* pipeline stages */
	int tp, dp_flag, dp;              /* --tp, --dp (0: derived), the data-parallel size */
	int cp;                           /* --cp: context-parallel ranks per sequence */
	int sp;                           /* --sequence-parallel */
	loom_act_ckpt_t act_ckpt;         /* --activation-checkpointing */
	loom_compute_dtype_t dtype;       /* --dtype */
	int depth, aspect, head_dim;      /* nanochat's sizing (0: not given) */
	int lr_given, wd_given, wd_scale; /* --lr, --weight-decay given; --wd-scale epochs */
	long long ref_tokens;             /* --ref-tokens */
	double lr_factor;                 /* muon: every group's rate scaled by this (--lr-scale) */
	int check;                        /* --check: build everything, take no step */
	double load;                      /* --load (< 0: auto) */
	const char *load_how;             /* where the load came from, for the prediction's lines */
} opts_t;

/* Parse a real flag that must be finite and > lo (lo_open) or >= lo, and < hi (hi_open) or <= hi. */
static double dbl_in(const char *flag, const char *v, double lo, int lo_open, double hi, int hi_open)
{
	double x = cli_parse_double("train", flag, v);
	if (!isfinite(x) || (lo_open ? !(x > lo) : !(x >= lo)) || (hi_open ? !(x < hi) : !(x <= hi)))
		cli_die("train", "%s: %s is out of range %c%g, %g%c", flag, v, lo_open ? '(' : '[', lo, hi, hi_open ? ')' : ']');
	return x;
}

/* Parse an integer flag that must be in [lo, hi]. */
static long long int_in(const char *flag, const char *v, long long lo, long long hi)
{
	long long x = cli_parse_int("train", flag, v);
	if (x < lo || x > hi)
		cli_die("train", "%s: %lld is out of range [%lld, %lld]", flag, x, lo, hi);
	return x;
}

/* The pipeline's stages, as the trainer partitions them: "stages: blocks 0-5 + head of positions
 * 0-49 | head of positions 50-255"; with V chunks per rank, the G = P V global stages and their ranks. */
static void print_stages(const opts_t *o)
{
	int P = o->pp, V = o->tc.pp_virtual_stages > 1 ? o->tc.pp_virtual_stages : 1, G = P * V;
	int *lo = malloc(sizeof(int) * (size_t)(G + 1)), hrows, L = o->mc.n_layer, n = o->tc.B * o->tc.T;
	if (!lo || loom_pp_stages(&o->mc, o->tc.B, o->tc.T, G, o->tc.pp_head_split, lo, &hrows) != LOOM_OK) {
		free(lo);
		return; /* the trainer has reported it */
	}
	printf("stages:");
	for (int s = 0; s < G; s++) {
		printf("%s", s ? " |" : "");
		if (lo[s] + 1 == lo[s + 1])
			printf(" block %d", lo[s]);
		else if (lo[s] < lo[s + 1])
			printf(" blocks %d-%d", lo[s], lo[s + 1] - 1);
		if (s == G - 1 && hrows)
			printf(" head of positions %d-%d", hrows, n - 1);
		else if (s == G - 1)
			printf("%s head", lo[s] < L ? " +" : "");
		else if (s == G - 2 && hrows)
			printf(" + head of positions 0-%d", hrows - 1);
	}
	printf(" (of each micro-batch's %d positions)", n);
	if (V > 1) {
		printf("; global stage g on rank g mod %d:", P);
		for (int s = 0; s < G; s++)
			printf(" %d", s % P);
	}
	printf("\n");
	int M = o->tc.accum, *rows = hrows ? malloc(sizeof(int) * (size_t)M) : NULL;
	if (rows && loom_pp_head_rows(&o->mc, o->tc.pp_schedule, o->tc.B, o->tc.T, P, V, M, o->tc.pp_head_split,
	                              rows) == LOOM_OK && (rows[0] != hrows || rows[M - 1] != hrows))
		printf("stages: the first micro-batch's head of positions 0-%d and the last's 0-%d on %s %d (the pipe "
		       "fills and drains there)\n", rows[0] - 1, rows[M - 1] - 1, V > 1 ? "global stage" : "stage", G - 2);
	free(rows);
	free(lo);
}

static void parse(int argc, char **argv, opts_t *o)
{
	const char *v;
	memset(o, 0, sizeof *o);
	o->tc = loom_train_defaults();
	o->tc.B = 4;
	o->tc.lr.peak_lr = 6e-4;
	o->tc.lr.total_steps = -1;
	cli_model_flags_init(&o->mf);
	o->tc.T = -1;
	o->grad_accum = -1;
	o->print_every = 1;
	o->world = 1;
	o->pp = 1, o->dp = 1;
	o->tp = 1, o->cp = 1;
	o->load = -1;
#define FLAG(name) cli_flag(argc, argv, &i, name, &v)
#define DBL(name) cli_parse_double("train", name, v)
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			fputs(usage_text, stdout);
			exit(0);
		} else if (FLAG("--train-data")) o->tc.train_data = v;
		else if (FLAG("--val-data")) o->tc.val_data = v;
		else if (FLAG("--shuffle")) o->tc.shuffle = (int)int_in("--shuffle", v, 0, 1);
		else if (cli_model_flag("train", argc, argv, &i, &o->mf))
			continue;
		else if (FLAG("--optimizer")) {
			if (loom_optimizer_parse(v, &o->tc.optimizer) != LOOM_OK)
				cli_die("train", "--optimizer: %s", loom_errmsg());
		} else if (FLAG("--matrix-lr")) o->tc.muon.matrix_lr = (float)dbl_in("--matrix-lr", v, 0, 0, 1e3, 0);
		else if (FLAG("--embedding-lr")) o->tc.muon.embedding_lr = (float)dbl_in("--embedding-lr", v, 0, 0, 1e3, 0);
		else if (FLAG("--unembedding-lr"))
			o->tc.muon.unembedding_lr = (float)dbl_in("--unembedding-lr", v, 0, 0, 1e3, 0);
		else if (FLAG("--scalar-lr")) o->tc.muon.scalar_lr = (float)dbl_in("--scalar-lr", v, 0, 0, 1e3, 0);
		else if (FLAG("--adam-beta1")) o->tc.muon.adam_beta1 = (float)dbl_in("--adam-beta1", v, 0, 0, 1, 1);
		else if (FLAG("--adam-beta2")) o->tc.muon.adam_beta2 = (float)dbl_in("--adam-beta2", v, 0, 0, 1, 1);
		else if (FLAG("--warmdown-frac")) o->tc.lr.warmdown_frac = dbl_in("--warmdown-frac", v, 0, 1, 1, 0);
		else if (FLAG("--wd-scale")) {
			if (strcmp(v, "none") && strcmp(v, "epochs"))
				cli_die("train", "--wd-scale: '%s' is not one of none, epochs", v);
			o->wd_scale = !strcmp(v, "epochs");
		} else if (FLAG("--ref-tokens")) o->ref_tokens = int_in("--ref-tokens", v, 1, 1LL << 62);
		else if (FLAG("--batch-size")) o->tc.B = (int)int_in("--batch-size", v, 1, 1 << 20);
		else if (FLAG("--seq-len")) o->tc.T = (int)int_in("--seq-len", v, 1, 1 << 20);
		else if (FLAG("--grad-accum")) o->grad_accum = (int)int_in("--grad-accum", v, 1, 1 << 20);
		else if (FLAG("--total-batch-size")) o->total_batch = int_in("--total-batch-size", v, 1, 1LL << 40);
		else if (FLAG("--steps")) o->tc.lr.total_steps = int_in("--steps", v, 1, 1LL << 40);
		else if (FLAG("--lr")) o->tc.lr.peak_lr = dbl_in("--lr", v, 0, 0, 1e3, 0), o->lr_given = 1;
		else if (FLAG("--warmup")) o->tc.lr.warmup = int_in("--warmup", v, 0, 1LL << 40);
		else if (FLAG("--pp-schedule") ||
		         (FLAG("--schedule") && (!strcmp(v, "gpipe") || !strcmp(v, "1f1b") || !strcmp(v, "interleaved")))) {
			if (o->tc.pp_schedule && strcmp(o->tc.pp_schedule, v))
				cli_die("train", "two pipeline schedules, %s and %s: give one --pp-schedule (the older --schedule "
				        "gpipe|1f1b spelling sets the same)", o->tc.pp_schedule, v);
			o->tc.pp_schedule = v;
		} else if (FLAG("--virtual-stages")) o->tc.pp_virtual_stages = (int)int_in("--virtual-stages", v, 1, 4096);
		else if (FLAG("--pp-head-split"))
			o->tc.pp_head_split = !strcmp(v, "auto") ? 0.0 : !strcmp(v, "off") ? -1.0
			                      : dbl_in("--pp-head-split", v, 0, 1, 1, 1);
		else if (!strcmp(a, "--schedule") || !strncmp(a, "--schedule=", 11)) {
			if (loom_schedule_parse(v, &o->tc.lr.kind) != LOOM_OK)
				cli_die("train", "--schedule: %s", loom_errmsg());
		} else if (FLAG("--min-lr-frac")) o->tc.lr.min_lr_frac = dbl_in("--min-lr-frac", v, 0, 0, 1, 0);
		else if (FLAG("--weight-decay"))
			o->tc.adamw.weight_decay = (float)dbl_in("--weight-decay", v, 0, 0, 1e3, 0), o->wd_given = 1;
		else if (FLAG("--beta1")) o->tc.adamw.beta1 = (float)dbl_in("--beta1", v, 0, 0, 1, 1);
		else if (FLAG("--beta2")) o->tc.adamw.beta2 = (float)dbl_in("--beta2", v, 0, 0, 1, 1);
		else if (FLAG("--eps")) {
			o->tc.adamw.eps = (float)dbl_in("--eps", v, 0, 1, 1, 0);
			if (!(o->tc.adamw.eps > 0)) /* below float's range */
				cli_die("train", "--eps: %s is 0 as a float32; give at least 1e-38", v);
		} else if (FLAG("--grad-clip")) o->tc.grad_clip = dbl_in("--grad-clip", v, 0, 0, 1e30, 0);
		else if (FLAG("--seed")) o->tc.seed = (uint64_t)int_in("--seed", v, 0, 1LL << 62);
		else if (FLAG("--save-dir")) o->tc.save_dir = v;
		else if (FLAG("--save-every")) o->tc.save_every = (int)int_in("--save-every", v, 0, 1 << 30);
		else if (FLAG("--keep-checkpoints"))
			o->tc.keep_checkpoints = (int)int_in("--keep-checkpoints", v, 0, 1 << 30);
		else if (!strcmp(a, "--resume")) o->resume = 1;
		else if (FLAG("--resume-from")) o->resume_from = v, o->resume = 1;
		else if (FLAG("--eval-every")) o->tc.eval_every = (int)int_in("--eval-every", v, 0, 1 << 30);
		else if (FLAG("--eval-batches")) o->tc.eval_batches = (int)int_in("--eval-batches", v, 1, 1 << 30);
		else if (FLAG("--sample-every")) o->sample_every = (int)int_in("--sample-every", v, 0, 1 << 30);
		else if (FLAG("--log")) o->tc.log_path = v;
		else if (FLAG("--threads")) o->threads = (int)int_in("--threads", v, 1, 1024);
		else if (FLAG("--dtype")) {
			if (loom_compute_dtype_parse(v, &o->dtype) != LOOM_OK)
				cli_die("train", "--dtype: %s", loom_errmsg());
		}
		else if (FLAG("--peak-flops")) {
			o->tc.peak_flops = DBL("--peak-flops");
			if (!(o->tc.peak_flops > 0))
				cli_die("train", "--peak-flops: %s must be > 0 (FLOP/s, e.g. 1e11)", v);
		} else if (!strcmp(a, "--profile")) o->profile = 1;
		else if (FLAG("--memory-check")) cli_memcheck_mode(v);
		else if (FLAG("--load")) {
			o->load = !strcmp(v, "auto") ? -1 : cli_parse_double("train", "--load", v);
			if (o->load < -1 || !isfinite(o->load))
				cli_die("train", "--load: '%s' is not auto or a number of threads >= 0", v);
		}
		else if (FLAG("--activation-checkpointing")) {
			if (loom_act_ckpt_parse(v, &o->act_ckpt) != LOOM_OK)
				cli_die("train", "--activation-checkpointing: %s", loom_errmsg());
		}
		else if (FLAG("--print-every")) o->print_every = (int)int_in("--print-every", v, 1, 1 << 30);
		else if (FLAG("--nproc")) o->nproc = (int)int_in("--nproc", v, 1, 4096);
		else if (FLAG("--bucket-mb")) {
			o->tc.bucket_mb = DBL("--bucket-mb");
			if (!(o->tc.bucket_mb > 0 && o->tc.bucket_mb <= 1 << 20))
				cli_die("train", "--bucket-mb: %s must be > 0 (MiB, e.g. 25)", v);
		} else if (FLAG("--zero")) o->tc.zero = (int)int_in("--zero", v, 0, 3);
		else if (FLAG("--grad-reduce-dtype")) {
			loom_compute_dtype_t g;
			if (loom_compute_dtype_parse(v, &g) != LOOM_OK)
				cli_die("train", "--grad-reduce-dtype: %s", loom_errmsg());
			o->tc.grad_reduce_dtype = g == LOOM_COMPUTE_BF16 ? LOOM_BFLOAT16 : LOOM_FLOAT32;
		} else if (FLAG("--check-replicas"))
			o->tc.check_replicas = (int)int_in("--check-replicas", v, 0, 1 << 30);
		else if (FLAG("--lr-scale")) {
			if (loom_lr_scale_parse(v, &o->lr_scale) != LOOM_OK)
				cli_die("train", "--lr-scale: %s", loom_errmsg());
		} else if (FLAG("--ref-batch-size")) o->ref_batch = int_in("--ref-batch-size", v, 1, 1LL << 40);
		else if (FLAG("--pp")) o->pp = (int)int_in("--pp", v, 1, 4096);
		else if (FLAG("--micro-batches")) {
			int mb = (int)int_in("--micro-batches", v, 1, 1 << 20);
			if (o->grad_accum > 0 && o->grad_accum != mb)
				cli_die("train", "--micro-batches %d and --grad-accum %d disagree (they are the same setting)", mb,
				        o->grad_accum);
			o->grad_accum = mb;
		} else if (FLAG("--trace")) o->tc.trace_dir = v;
		else if (FLAG("--tp")) o->tp = (int)int_in("--tp", v, 1, 4096);
		else if (FLAG("--dp")) o->dp_flag = (int)int_in("--dp", v, 1, 4096);
		else if (FLAG("--cp")) o->cp = (int)int_in("--cp", v, 1, 4096);
		else if (!strcmp(a, "--sequence-parallel")) o->sp = 1;
		else if (!strcmp(a, "--check")) o->check = 1;
		else
			cli_die("train", "unknown flag '%s' (see loom train --help)", a);
	}
#undef FLAG
#undef DBL
	if (!o->tc.train_data)
		cli_die("train", "--train-data GLOB is required (token shards, e.g. from `loom data prepare`)");
	if (o->tc.lr.total_steps < 0)
		cli_die("train", "--steps N is required");
	if (o->resume && !o->tc.save_dir && !o->resume_from)
		cli_die("train", "--resume needs --save-dir DIR (where the checkpoints are), or --resume-from CHECKPOINT");
	if (o->tc.save_dir && loom_ckpt_check_save_dir(o->tc.save_dir) != LOOM_OK) /* before any training */
		cli_die("train", "--save-dir: %s", loom_errmsg());
	cli_model_flags_check("train", &o->mf);
	o->init_from = o->mf.init_from;
	if (o->sp && o->tp < 2)
		cli_die("train", "--sequence-parallel shards the sequence over the tensor-parallel ranks: it needs --tp 2 "
		        "or more (e.g. --nproc 2 --tp 2 --sequence-parallel)");
	if (o->tc.eval_every > 0 && !o->tc.val_data)
		cli_die("train", "--eval-every needs --val-data GLOB");
	if (o->tc.save_every > 0 && !o->tc.save_dir)
		cli_die("train", "--save-every needs --save-dir DIR");
	if (o->tc.zero == 3 && o->sample_every > 0)
		cli_die("train", "--sample-every: with --zero 3 the parameters are sharded and sampling on rank 0 alone "
		        "is not possible; sample from a checkpoint with `loom sample`");
	if (o->grad_accum > 0 && o->total_batch > 0)
		cli_die("train", "give --grad-accum (--micro-batches) or --total-batch-size, not both");
	if (o->pp > 1 && o->sample_every > 0)
		cli_die("train", "--sample-every with --pp %d: a pipeline stage holds only its own layers; sample from a "
		        "checkpoint with `loom sample` instead", o->pp);
	if (o->tc.optimizer == LOOM_OPTIMIZER_MUON && o->lr_given && o->mf.mc.arch == LOOM_ARCH_NANOCHAT)
		cli_die("train", "--lr: nanochat under --optimizer muon has one rate per group: --matrix-lr, "
		        "--embedding-lr, --unembedding-lr, --scalar-lr (the schedule multiplies them all)");
	if (o->tc.optimizer == LOOM_OPTIMIZER_MUON && o->pp > 1 && (o->tc.save_dir || o->resume))
		cli_die("train", "--optimizer muon with --pp %d: MuonAdamW trains under pipeline parallel, but its checkpoints "
		        "are not written yet: drop --save-dir / --resume, or --pp", o->pp);
	if (o->wd_scale && (o->tc.optimizer != LOOM_OPTIMIZER_MUON || o->ref_tokens <= 0))
		cli_die("train", "--wd-scale epochs scales Muon's weight decay: it needs --optimizer muon and --ref-tokens "
		        "D_REF (the reference run's tokens)");
	/* one B_ref for the LR and the weight-decay scalings, as base_train has */
	o->ref_batch = loom_ref_batch(o->ref_batch, o->tc.optimizer, &o->ref_source);
	double scaled;
	if (loom_lr_scaled(o->tc.lr.peak_lr, o->lr_scale, 1, o->ref_batch, &scaled) != LOOM_OK)
		cli_die("train", "%s", loom_errmsg()); /* e.g. a scaling without its reference batch */
}

/* 1 when this process is a rank of a job a launcher started (its environment says so). */
static int in_job(void)
{
	static const char *const job_env[] = {"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS"};
	for (size_t k = 0; k < sizeof job_env / sizeof *job_env; k++)
		if (getenv(job_env[k]))
			return 1;
	return 0;
}

/* `--nproc N` outside a job: become `loom run --nproc-per-node N <this loom> train ARGS` (ARGS without
 * --nproc). Inside a job (a launcher's environment), or with N = 1, it returns and the rank count is
 * checked once the communicator is up. */
static void relaunch(int argc, char **argv, const opts_t *o)
{
	char exe[PATH_MAX], n[16];
	ssize_t len;
	if (o->nproc <= 1 || in_job())
		return;
	if (o->load < 0 && !o->check) { /* --load auto: the machine's other work, measured before any rank runs */
		char load[32];
		snprintf(load, sizeof load, "%.3f", loom_cluster_measure_load((int)sysconf(_SC_NPROCESSORS_ONLN), 0.5));
		setenv("LOOM_PLAN_LOAD", load, 1);
	}
	if ((len = readlink("/proc/self/exe", exe, sizeof exe - 1)) <= 0)
		cli_die("train", "--nproc: cannot find this program's path (/proc/self/exe): %s", strerror(errno));
	exe[len] = 0;
	char **args = calloc((size_t)argc + 6, sizeof *args);
	int k = 0;
	if (!args)
		cli_die("train", "out of memory");
	snprintf(n, sizeof n, "%d", o->nproc);
	args[k++] = exe, args[k++] = "run", args[k++] = "--nproc-per-node", args[k++] = n, args[k++] = exe;
	args[k++] = "train";
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--nproc"))
			i++; /* and its value, validated by parse() */
		else if (strncmp(argv[i], "--nproc=", 8) != 0)
			args[k++] = argv[i];
	}
	args[k] = NULL;
	fflush(NULL);
	execv(exe, args);
	cli_die("train", "--nproc: cannot run %s: %s", exe, strerror(errno));
}

/* The model config from the preset/flags or the --init-from file; T defaults here too. */
static void model_config(opts_t *o)
{
	loom_model_config_t c;
	cli_model_resolve("train", &o->mf, &o->tc.T, &c);
	if (o->tc.optimizer == LOOM_OPTIMIZER_MUON) {
		o->tc.muon.n_embd = c.n_embd;
		o->tc.muon.weight_decay = o->wd_given ? o->tc.adamw.weight_decay
		                          : c.arch == LOOM_ARCH_NANOCHAT ? 0.2f : o->tc.adamw.weight_decay;
	}
	o->mc = c;
}

/* Combinations of flags the trainer cannot run yet, refused before training (with --nproc before any
 * rank starts): one row each, with the flags that conflict (`names`: the message starts with them and
 * the values given, "--zero 1 with --tp 2: ") and what would work. Delete a row when its support lands;
 * nothing else reads the table (tests/test_sweep.c checks only that every combination of the flags
 * trains or stops here with one message, so it stays valid as rows go). Rows are tried in order; the
 * first that applies is the message. `loom plan` states the ZeRO rows' rule in src/train/plan.c
 * (loom_plan_estimate and its search, for the loom implementation): delete it there too. */
enum { NAME_ZERO = 1, NAME_TP = 2, NAME_PP = 4, NAME_DP = 8, NAME_OPTIMIZER = 16 };

static int muon_zero_pp(const opts_t *o)
{
	return o->tc.optimizer == LOOM_OPTIMIZER_MUON && o->tc.zero > 0 && o->pp > 1;
}
static int zero_dp1(const opts_t *o) { return o->tc.zero > 0 && o->dp * o->cp == 1; }
static int muon_tp(const opts_t *o) { return o->tc.optimizer == LOOM_OPTIMIZER_MUON && o->tp > 1; }

static const struct {
	int (*applies)(const opts_t *o);
	unsigned names; /* NAME_* */
	const char *why;
} refusals[] = {
	{zero_dp1, NAME_ZERO | NAME_DP, "ZeRO shards the training state over the data-parallel ranks (dp = ranks / "
	                                "(tp x pp)) and needs at least 2; use --zero 0, or more ranks (--nproc)"},
	{muon_tp, NAME_OPTIMIZER | NAME_TP, "a tensor-parallel shard of a matrix cannot be orthogonalized alone; use "
	                                    "--optimizer adamw with --tp, or --optimizer muon without --tp (data "
	                                    "parallel, ZeRO 1-3 and --pp run it)"},
	{muon_zero_pp, NAME_OPTIMIZER | NAME_ZERO | NAME_PP, "MuonAdamW's matrices are not sharded over a pipeline "
	                                                     "stage's data-parallel ranks yet; use --zero 0 with --pp, "
	                                                     "or --optimizer adamw"},
};

/* Exit with the first row of `refusals` that applies to o (its dp known). */
static void refuse_unsupported(const opts_t *o)
{
	for (size_t k = 0; k < sizeof refusals / sizeof *refusals; k++) {
		char names[256];
		size_t n = 0;
		if (!refusals[k].applies(o))
			continue;
		names[0] = 0;
#define NAME(bit, ...)                                                                                        \
	if (refusals[k].names & (bit))                                                                            \
		n += (size_t)snprintf(names + n, sizeof names - n, "%s", n ? " with " : ""),                          \
		n += (size_t)snprintf(names + n, sizeof names - n, __VA_ARGS__)
		NAME(NAME_OPTIMIZER, "--optimizer %s", o->tc.optimizer == LOOM_OPTIMIZER_MUON ? "muon" : "adamw");
		NAME(NAME_ZERO, "--zero %d", o->tc.zero);
		NAME(NAME_TP, "--tp %d", o->tp);
		NAME(NAME_PP, "--pp %d", o->pp);
		NAME(NAME_DP, "dp %d (%d rank%s / (--tp %d x --pp %d))", o->dp, o->dp * o->tp * o->pp,
		     o->dp * o->tp * o->pp == 1 ? "" : "s", o->tp, o->pp);
#undef NAME
		cli_die("train", "%s: %s", names, refusals[k].why);
	}
}

/* ---- elastic jobs (loom run --nnodes MIN:MAX: cli/run_elastic.c states the protocol) ----------- */

/* The launcher's directory of protocol files, or NULL outside an elastic job. */
static const char *elastic_dir(void)
{
	const char *d = getenv("LOOM_ELASTIC_DIR");
	return d && *d ? d : NULL;
}

/* Write DIR/<what>.a<attempt>[.r<rank>] (rank < 0: none) atomically: a temporary file, then rename. */
static void elastic_write(const char *what, int rank, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void elastic_write(const char *what, int rank, const char *fmt, ...)
{
	const char *dir = elastic_dir(), *att = getenv("LOOM_ELASTIC_ATTEMPT");
	char path[PATH_MAX], tmp[PATH_MAX + 16];
	va_list ap;
	FILE *f;
	if (!dir)
		return;
	if (rank >= 0)
		snprintf(path, sizeof path, "%s/%s.a%d.r%d", dir, what, att ? atoi(att) : 0, rank);
	else
		snprintf(path, sizeof path, "%s/%s.a%d", dir, what, att ? atoi(att) : 0);
	snprintf(tmp, sizeof tmp, "%s.tmp%d", path, (int)getpid());
	if (!(f = fopen(tmp, "w"))) {
		fprintf(stderr, "loom train: elastic: cannot write %s: %s\n", tmp, strerror(errno));
		return;
	}
	va_start(ap, fmt);
	vfprintf(f, fmt, ap);
	va_end(ap);
	if (fclose(f) != 0 || rename(tmp, path) != 0) {
		fprintf(stderr, "loom train: elastic: cannot write %s: %s\n", path, strerror(errno));
		remove(tmp);
	}
}

/* ---- the in-memory recovery path (issue 36; cli/run_elastic.c decides which path a restart takes) ---- */

/* This host's rescue directory, LOOM_ELASTIC_RESCUE_DIR/<host name>, into buf (the launcher gives the
 * same directory to every host; the host name keeps hosts that share a /dev/shm apart). Returns 0, or
 * -1 outside an elastic job or with the path off (loom run --elastic-rescue 0). */
static int rescue_dir(char *buf, size_t cap)
{
	const char *d = getenv("LOOM_ELASTIC_RESCUE_DIR");
	char host[256];
	if (!elastic_dir() || !d || !*d)
		return -1;
	if (gethostname(host, sizeof host) != 0)
		snprintf(host, sizeof host, "localhost");
	host[sizeof host - 1] = '\0';
	snprintf(buf, cap, "%s/%s", d, host);
	return 0;
}

/* 1 on the rank that keeps its host's rescue: the host's first (the launcher places LOOM_ELASTIC_NPROC
 * consecutive ranks on each host). */
static int rescue_keeper(int rank)
{
	const char *n = getenv("LOOM_ELASTIC_NPROC");
	int nproc = n && atoi(n) > 0 ? atoi(n) : 1;
	return rank % nproc == 0;
}

/* The launcher chose the in-memory path (LOOM_ELASTIC_RESCUE_STEP): this host's rescue of that step
 * into buf. Returns 0, or -1 when it did not. */
static int rescue_path(char *buf, size_t cap)
{
	const char *s = getenv("LOOM_ELASTIC_RESCUE_STEP");
	char dir[PATH_MAX];
	if (!s || !*s || rescue_dir(dir, sizeof dir) != 0)
		return -1;
	snprintf(buf, cap, "%s/step_%08lld", dir, atoll(s));
	return 0;
}

/* Micro-batches per step and rank: from --total-batch-size = B x T x dp x accum, or --grad-accum. In an
 * elastic job a world that cannot keep the global batch is refused to the launcher too, which then
 * runs on fewer hosts (its batch rule). */
static int micro_batches(const opts_t *o)
{
	int accum = o->grad_accum > 0 ? o->grad_accum : 1;
	if (o->total_batch > 0 && loom_train_accum(o->total_batch, o->tc.B, o->tc.T, o->dp, &accum) != LOOM_OK) {
		elastic_write("refused", o->rank, "dp %d: %s\n", o->dp, loom_errmsg());
		cli_die("train", "%s", loom_errmsg());
	}
	return accum;
}

/* Everything about the flags that can be known before the ranks start, for a job of `world` ranks:
 * the mesh's sizes (as loom_mesh_create checks them), the model (tensor-parallel split, a layer per
 * pipeline stage) and the refusals above. Sets o->dp and o->mc; exits with one message otherwise. Run
 * by the --nproc launcher before it starts the ranks, and by every rank (the same answer). */
static void validate(opts_t *o, int world)
{
	long long tp_pp = (long long)o->tp * o->pp * o->cp;
	char cp[32] = "", lead[32] = "", cpx[16] = "";
	if (o->cp > 1) /* the messages name --cp when it is given */
		snprintf(cp, sizeof cp, " --cp %d", o->cp), snprintf(lead, sizeof lead, "--cp %d ", o->cp),
		snprintf(cpx, sizeof cpx, "cp x ");
	if (o->dp_flag && o->dp_flag * tp_pp != world)
		cli_die("train", "--dp %d%s --tp %d --pp %d on %d rank%s: dp x %stp x pp = %lld is not the number of ranks; "
		        "give --nproc %lld, or leave --dp out (derived: ranks / (%stp x pp))", o->dp_flag, cp, o->tp, o->pp,
		        world, world == 1 ? "" : "s", cpx, o->dp_flag * tp_pp, o->dp_flag * tp_pp, cpx);
	if (world % tp_pp)
		cli_die("train", "%s--tp %d --pp %d on %d rank%s: the world of %d rank%s is not divisible by %stp x pp = %lld "
		        "(dp = ranks / (%stp x pp)); use --nproc a multiple of %lld, or smaller %s--tp / --pp", lead, o->tp,
		        o->pp, world, world == 1 ? "" : "s", world, world == 1 ? "" : "s", cpx, tp_pp, cpx, tp_pp,
		        o->cp > 1 ? "--cp / " : "");
	o->dp = world / (int)tp_pp;
	model_config(o);
	if (o->cp > 1 && loom_cp_check(o->tc.T, o->cp) != LOOM_OK) /* T is known once the model is */
		cli_die("train", "--cp %d with --seq-len %d: %s", o->cp, o->tc.T, loom_errmsg());
	if (o->cp > 1 && loom_cp_attention_ring() < 0)
		cli_die("train", "--cp %d: %s", o->cp, loom_errmsg());
	if (loom_model_tp_check(&o->mc, o->tp) != LOOM_OK)
		cli_die("train", "--tp %d: %s", o->tp, loom_errmsg());
	if (o->pp > o->mc.n_layer)
		cli_die("train", "--pp %d for a model of %d layers: every pipeline stage needs at least one layer; use "
		        "--pp %d or fewer", o->pp, o->mc.n_layer, o->mc.n_layer);
	int accum = micro_batches(o); /* the pipeline's schedule depends on them */
	if (o->sp && ((long long)o->tc.B * (o->tc.T / o->cp)) % o->tp != 0)
		cli_die("train", "--sequence-parallel --tp %d: a micro-batch's --batch-size %d x --seq-len %d%s = %lld "
		        "positions%s are not divisible by %d (each tensor-parallel rank holds an equal share)", o->tp, o->tc.B,
		        o->tc.T, o->cp > 1 ? " / --cp" : "", (long long)o->tc.B * (o->tc.T / o->cp),
		        o->cp > 1 ? " of a context-parallel rank" : "", o->tp);
	if (loom_pp_check(&o->mc, o->tc.pp_schedule, o->pp, o->tc.pp_virtual_stages, accum) != LOOM_OK)
		cli_die("train", "%s", loom_errmsg());
	refuse_unsupported(o);
}

/* accum from --total-batch-size = B x T x ranks x accum (or --grad-accum), then the LR scaling. */
static void batch_config(opts_t *o)
{
	o->tc.accum = micro_batches(o);
	long long tokens = (long long)o->tc.B * o->tc.T * o->dp * o->tc.accum;
	if (o->tc.optimizer == LOOM_OPTIMIZER_MUON) { /* the schedule is the multiplier; every group's rate scales */
		double f = 1.0;
		double adamw_lr = o->tc.lr.peak_lr; /* --lr: GPT-2's AdamW tensors */
		o->tc.lr.peak_lr = 1.0;
		if (loom_lr_scaled(1.0, o->lr_scale, tokens, o->ref_batch, &f) != LOOM_OK)
			cli_die("train", "%s", loom_errmsg());
		o->tc.muon.matrix_lr *= (float)f, o->tc.muon.embedding_lr *= (float)f;
		o->tc.muon.unembedding_lr *= (float)f, o->tc.muon.scalar_lr *= (float)f;
		o->tc.muon.adamw_lr = (float)(adamw_lr * f);
		o->tc.muon.total_steps = o->tc.lr.total_steps;
		o->wd_ref = o->tc.muon.weight_decay;
		if (o->wd_scale)
			o->tc.muon.weight_decay = (float)loom_muon_weight_decay_scaled(
				o->wd_ref, (double)tokens, (double)o->ref_batch, (double)tokens * (double)o->tc.lr.total_steps,
				(double)o->ref_tokens);
		o->base_lr = 1.0, o->lr_factor = f;
		return;
	}
	o->base_lr = o->tc.lr.peak_lr;
	if (loom_lr_scaled(o->base_lr, o->lr_scale, tokens, o->ref_batch, &o->tc.lr.peak_lr) != LOOM_OK)
		cli_die("train", "%s", loom_errmsg());
}

/* The tokenizer beside the first training shard (DIR/tokenizer.bin), if there is one. */
static void find_tokenizer(opts_t *o)
{
	glob_t g;
	struct stat sb;
	o->tokenizer[0] = 0;
	if (glob(o->tc.train_data, 0, NULL, &g) == 0 && g.gl_pathc > 0) {
		char *d = strdup(g.gl_pathv[0]);
		if (d) {
			snprintf(o->tokenizer, sizeof o->tokenizer, "%s/tokenizer.bin", dirname(d));
			free(d);
		}
	}
	globfree(&g);
	if (o->tokenizer[0] && stat(o->tokenizer, &sb) != 0)
		o->tokenizer[0] = 0;
	o->tc.tokenizer = o->tokenizer[0] ? o->tokenizer : NULL;
}

/* A peak of the cache (loom/train.h), or (with `measure`) measured now and cached, else 0: the
 * hardware's (what MFU is against) or the GEMM's in precision dt, for `threads` threads. The source
 * of a cached hardware peak is described again (it depends only on the CPU and the bf16 path, which
 * the cache key fixes). */
static double cached_peak(int hw, loom_compute_dtype_t dt, int threads, int measure, const char **source)
{
	loom_peak_kind_t kind = loom_peak_kind(hw, dt);
	char path[1000];
	double peak;
	const char *src = NULL;
	if (loom_peak_cache_get_kind(kind, threads, &peak) == LOOM_OK) {
		if (hw && source)
			loom_hw_peak_source(dt, source);
		return peak;
	}
	if (!measure)
		return 0.0;
	if (loom_peak_cache_path_kind(kind, path, sizeof path) != LOOM_OK)
		snprintf(path, sizeof path, "(no cache: %s)", loom_errmsg());
	printf("measuring the %s %s peak with %d thread%s (once; cached in %s)...\n", hw ? "hardware's" : "GEMM's",
	       loom_compute_dtype_name(dt), threads, threads == 1 ? "" : "s", path);
	peak = hw ? loom_hw_peak_flops(dt, threads, &src) : loom_gemm_peak_flops_dtype(dt, threads);
	if (hw && source)
		*source = src;
	if (peak > 0)
		loom_peak_cache_put_kind(kind, threads, peak); /* best effort: a read-only home measures every time */
	return peak;
}

static void fmt_eta(double s, char *buf, size_t cap)
{
	long t = (long)(s + 0.5);
	if (t >= 3600)
		snprintf(buf, cap, "%ldh%02ldm", t / 3600, t / 60 % 60);
	else if (t >= 60)
		snprintf(buf, cap, "%ldm%02lds", t / 60, t % 60);
	else
		snprintf(buf, cap, "%lds", t);
}

typedef struct {
	opts_t *o;
	loom_tokenizer_t tok;
	int have_tok;
	int *sample_buf;
	int steps_run, warned_mfu;
	double optim_ms, step_ms;
	/* the steps since the last printed line, which the next line averages over */
	int iv_steps;
	double iv_ms, iv_comm, iv_exposed, iv_wait, iv_mfu;
	/* elastic jobs: the world's communicator (NULL: one process) and whether the run stopped at the
	 * launcher's request */
	loom_comm_t *world;
	int elastic_stop;
	/* the in-memory recovery (elastic_rescue): 1 once the training loop runs; the newest step this run
	 * knows to be in a committed checkpoint on disk (-1: none); 1 when resumed from a rescue */
	int training;
	long long disk_step;
	int rescued;
} run_ctx_t;

/* After a failed attempt, on each host's keeper: when a peer was lost (the comm's LOOM_EPEERLOST or
 * its deadline) during the training loop and this rank holds the whole training state, that state is
 * still the last completed step's (a step's collectives precede its update: trainer.c), so write it as
 * a checkpoint into this host's rescue directory (in RAM) and tell the launcher: rescue.aK.rR holds
 * "step S\ndisk D\n" (D: the newest step on disk this rank knows of, -1 none), or "none\n<why>\n".
 * No communication (the communicator is broken). Bounded: the launcher waits for the keepers'
 * verdicts at most LOOM_ELASTIC_RESCUE_TIMEOUT_S, so a rescue finished later is dropped. */
static void elastic_rescue(run_ctx_t *r, loom_trainer_t *tr, int run_rc, int rank)
{
	char dir[PATH_MAX], why[700] = "";
	const char *t = getenv("LOOM_ELASTIC_RESCUE_TIMEOUT_S"), *no;
	double t0 = loom_now(), limit = t && atof(t) > 0 ? atof(t) : 20.0;
	int rc;
	if (rescue_dir(dir, sizeof dir) != 0 || !rescue_keeper(rank))
		return;
	char given[PATH_MAX + 32], manifest[PATH_MAX + 64];
	struct stat sb;
	if ((!tr || !r->training) && rescue_path(given, sizeof given) == 0 &&
	    snprintf(manifest, sizeof manifest, "%s/MANIFEST", given) > 0 && stat(manifest, &sb) == 0) {
		/* failed before training from the state it was given, which is still in place (a host lost
		 * again during the restart): it is still this host's rescue */
		const char *d = getenv("LOOM_ELASTIC_DISK_STEP");
		elastic_write("rescue", rank, "step %s\ndisk %lld\n", getenv("LOOM_ELASTIC_RESCUE_STEP"),
		              d ? atoll(d) : -1LL);
		return;
	}
	if (!tr || !r->training)
		snprintf(why, sizeof why, "rank %d failed before its training loop", rank);
	else if (run_rc != LOOM_EPEERLOST && run_rc != LOOM_ETIMEDOUT)
		snprintf(why, sizeof why, "rank %d failed with '%s', not a lost peer", rank, loom_strerror(run_rc));
	else if ((no = loom_trainer_replica_why(tr)))
		snprintf(why, sizeof why, "%s", no);
	else if ((rc = loom_trainer_remove_replica(dir)) != LOOM_OK || /* an older rescue of this host */
	         (rc = loom_trainer_save_replica(tr, dir)) != LOOM_OK)
		snprintf(why, sizeof why, "rank %d could not keep its state: %s", rank, loom_errmsg());
	else if (loom_now() - t0 > limit) {
		snprintf(why, sizeof why, "rank %d kept its state in %.1f s, past LOOM_ELASTIC_RESCUE_TIMEOUT_S %g",
		         rank, loom_now() - t0, limit);
		loom_trainer_remove_replica(dir);
	} else {
		elastic_write("rescue", rank, "step %lld\ndisk %lld\n", loom_trainer_steps_done(tr), r->disk_step);
		fprintf(stderr, "loom train: rank %d: elastic: kept step %lld's training state in memory (%s, %.2f s) for "
		        "the restart\n", rank, loom_trainer_steps_done(tr), dir, loom_now() - t0);
		return;
	}
	for (char *c = why; *c; c++) /* one line, safe in the launcher's JSON */
		if (*c == '\n' || *c == '"' || *c == '\\')
			*c = ' ';
	elastic_write("rescue", rank, "none\n%s\n", why);
}

/* At a checkpoint boundary of an elastic job: did the launcher ask the ranks to save and stop (its
 * stop-request file, which rank 0 looks for and broadcasts, so every rank stops at the same step)?
 * The checkpoint of this step is committed already. Returns 1 to stop, 0 to go on, -1 on error. */
static int elastic_stop_requested(run_ctx_t *r, const loom_step_metrics_t *m)
{
	const char *dir = elastic_dir(), *att = getenv("LOOM_ELASTIC_ATTEMPT");
	char path[PATH_MAX];
	struct stat sb;
	int32_t stop = 0;
	if (!dir || !m->saved || m->step >= m->total)
		return 0;
	snprintf(path, sizeof path, "%s/stop-request.a%d", dir, att ? atoi(att) : 0);
	if (r->o->rank == 0)
		stop = stat(path, &sb) == 0;
	if (r->world && loom_broadcast(r->world, &stop, 1, LOOM_INT32, 0) != LOOM_OK) {
		fprintf(stderr, "loom train: rank %d: elastic: the stop decision after step %lld: %s\n", r->o->rank, m->step,
		        loom_comm_errmsg(r->world));
		return -1;
	}
	if (stop) {
		r->elastic_stop = 1;
		if (r->o->rank == 0) {
			elastic_write("stopped", -1, "step %lld\n", m->step);
			printf("elastic: saved step %lld and stopping at the launcher's request (%s): it grows the job\n",
			       m->step, path);
		}
	}
	return stop;
}

/* The last step a JSONL log has a line of (0: none, or no log). */
static long long log_last_step(const char *path)
{
	FILE *f = path ? fopen(path, "r") : NULL;
	char line[512];
	long long last = 0, s;
	if (!f)
		return 0;
	while (fgets(line, sizeof line, f))
		if (sscanf(line, "{\"step\":%lld", &s) == 1 && s > last)
			last = s;
	fclose(f);
	return last;
}

/* The attempt after a membership change: its event row for the log (into buf, set as the trainer's
 * log_event) and a line on rank 0's output. resumed: the step this attempt starts from. */
static void elastic_event(opts_t *o, loom_trainer_t *tr, int rescued, char *buf, size_t cap)
{
	char dir[PATH_MAX];
	const char *why = loom_trainer_replica_why(tr), *said = getenv("LOOM_ELASTIC_RECOVERY_WHY");
	if (rescued)
		why = NULL;
	else if (rescue_dir(dir, sizeof dir) != 0)
		why = "the in-memory path is off (loom run --elastic-rescue 0)";
	else if (!why)
		why = said && *said ? said : "no rescue in memory";
	long long resumed = loom_trainer_steps_done(tr);
	const char *cause = getenv("LOOM_ELASTIC_CAUSE"), *when = getenv("LOOM_ELASTIC_TIME");
	const char *old = getenv("LOOM_ELASTIC_OLD_WORLD"), *last = getenv("LOOM_ELASTIC_LAST_STEP");
	const char *rule = getenv("LOOM_ELASTIC_RULE");
	long long done = last ? atoll(last) : -1, logged = log_last_step(o->tc.log_path), lost;
	int shard = o->tp * o->pp * o->cp, old_world = old ? atoi(old) : 0;
	if (!elastic_dir() || !cause || !*cause)
		return;
	if (logged > done)
		done = logged;
	loom_trainer_set_log_event(tr, buf);
	lost = done > resumed ? done - resumed : 0;
	snprintf(buf, cap, "{\"event\":\"elastic\",\"step\":%lld,\"time\":\"%s\",\"cause\":\"%s\",\"old_mesh\":{\"world\":%d,"
	         "\"dp\":%d,\"cp\":%d,\"tp\":%d,\"pp\":%d},\"new_mesh\":{\"world\":%d,\"dp\":%d,\"cp\":%d,\"tp\":%d,\"pp\":%d},"
	         "\"resumed_from\":%lld,\"steps_lost\":%lld,\"accum\":%d,\"total_batch\":%lld,\"recovery\":\"%s\"%s%s%s%s%s%s}",
	         resumed, when ? when : "", cause, old_world, shard > 0 ? old_world / shard : 0, o->cp, o->tp, o->pp, o->world,
	         o->dp, o->cp, o->tp, o->pp, resumed, lost, o->tc.accum,
	         (long long)o->tc.B * o->tc.T * o->dp * o->tc.accum, rescued ? "memory" : "checkpoint",
	         why ? ",\"recovery_why\":\"" : "", why ? why : "", why ? "\"" : "", rule && *rule ? ",\"rule\":\"" : "",
	         rule && *rule ? rule : "", rule && *rule ? "\"" : "");
	if (o->rank == 0)
		printf("elastic: %s: mesh dp %d -> %d (tp %d, pp %d, cp %d), accumulation %d, resumed from step %lld's "
		       "%s%s%s), %lld step%s lost%s%s\n", cause, shard > 0 ? old_world / shard : 0, o->dp, o->tp, o->pp, o->cp,
		       o->tc.accum, resumed, rescued ? "state kept in memory by the survivors (recovery in memory" :
		       "checkpoint (recovery from the checkpoint on disk", why ? ": " : "", why ? why : "", lost,
		       lost == 1 ? "" : "s", rule && *rule ? "; " : "", rule && *rule ? rule : "");
}

static void print_token(void *ctx, int id)
{
	run_ctx_t *r = ctx;
	int len;
	const unsigned char *b = loom_tokenizer_decode(&r->tok, id, &len);
	if (b && id != r->tok.eot_token)
		fwrite(b, 1, (size_t)len, stdout);
}

static void sample(run_ctx_t *r, loom_model_t *model, long long step)
{
	enum { N = 64 };
	int prompt = r->tok.eot_token, n = 0;
	if (!r->have_tok)
		return;
	printf("--- sample at step %lld ---\n", step);
	if (loom_model_generate(model, &prompt, 1, N, 1.0f, 40, r->o->tc.seed + (uint64_t)step, r->tok.eot_token,
	                       r->sample_buf, &n, print_token, r) != LOOM_OK)
		printf("(sampling failed: %s)", loom_errmsg());
	printf("\n---\n");
}

/* Bytes one context-parallel rank receives in a layer's forward all-gather of keys and values (the
 * planner's figure, loom_plan_cp_bytes). */
static double cp_gather_bytes(const opts_t *o)
{
	return loom_plan_cp_bytes(&o->mc, o->tc.B, o->tc.T, o->cp, o->tp);
}

/* What this run does, printed by rank 0 before the first step. */
static void print_header(const opts_t *o, loom_trainer_t *tr)
{
	printf("model: %s L%d H%d C%d T%d V%d, %zu parameters%s%s\n", loom_arch_name(o->mc.arch), o->mc.n_layer,
	       o->mc.n_head, o->mc.n_embd, o->mc.seq_len, o->mc.vocab_size, loom_model_num_params(&o->mc),
	       o->init_from ? ", from " : "", o->init_from ? o->init_from : "");
	if (o->mc.arch == LOOM_ARCH_NANOCHAT)
		printf("nanochat: %d kv heads, window pattern %s (S = %d positions), vocabulary padded to a multiple of 64\n",
		       o->mc.n_kv_head, o->mc.window_pattern, o->mc.short_window);
	if (o->mc.arch == LOOM_ARCH_LLAMA) {
		char d[400];
		loom_llama_describe(&o->mc, d, sizeof d);
		printf("llama: %s\n", d);
	}
	if (o->tc.optimizer == LOOM_OPTIMIZER_MUON)
		printf("optimizer: MuonAdamW: Muon matrices lr %g (momentum 0.85 -> 0.95 over 300 steps, weight decay %g "
		       "-> 0), AdamW embeddings %g, lm head %g (x (C/768)^-0.5 = %.4f), scalars %g; the schedule multiplies "
		       "them%s\n", o->tc.muon.matrix_lr, o->tc.muon.weight_decay, o->tc.muon.embedding_lr,
		       o->tc.muon.unembedding_lr, pow(o->mc.n_embd / 768.0, -0.5), o->tc.muon.scalar_lr,
		       o->dp > 1 ? "; DistMuon: each rank updates its share of the matrices" : "");
	if (o->pp > 1)
		printf("batch: B=%d T=%d micro-batches=%d dp=%d -> %lld tokens per step", o->tc.B, o->tc.T, o->tc.accum,
		       o->dp, loom_trainer_tokens_per_step(tr));
	else if (o->cp > 1)
		printf("batch: B=%d T=%d accum=%d ranks=%d (each sequence over cp %d) -> %lld tokens per step", o->tc.B,
		       o->tc.T, o->tc.accum, o->dp, o->cp, loom_trainer_tokens_per_step(tr));
	else if (o->world > 1)
		printf("batch: B=%d T=%d accum=%d ranks=%d -> %lld tokens per step", o->tc.B, o->tc.T, o->tc.accum,
		       o->dp, loom_trainer_tokens_per_step(tr));
	else
		printf("batch: B=%d T=%d accum=%d -> %lld tokens per step", o->tc.B, o->tc.T, o->tc.accum,
		       loom_trainer_tokens_per_step(tr));
	printf("; %lld steps; lr %g (%s, warmup %lld, min %g x)\n", o->tc.lr.total_steps, o->tc.lr.peak_lr,
	       loom_schedule_name(o->tc.lr.kind), o->tc.lr.warmup, o->tc.lr.min_lr_frac);
	if (o->lr_scale > 0 || o->wd_scale) /* the one reference batch, said once */
		printf("B_ref: %lld tokens per step (%s), the reference batch of %s%s%s\n", o->ref_batch, o->ref_source,
		       o->lr_scale > 0 ? "the learning rate's scaling" : "", o->lr_scale > 0 && o->wd_scale ? " and " : "",
		       o->wd_scale ? "Muon's weight-decay scaling" : "");
	if (o->lr_scale > 0 && o->tc.optimizer == LOOM_OPTIMIZER_MUON)
		printf("lr: every group's rate x %g (%s scaling, %lld tokens per step vs a reference of %lld)\n",
		       o->lr_factor, loom_lr_scale_name(o->lr_scale), loom_trainer_tokens_per_step(tr),
		       o->ref_batch);
	else if (o->lr_scale > 0)
		printf("lr: peak %g = %g x %g (%s scaling, %lld tokens per step vs a reference of %lld)\n", o->tc.lr.peak_lr,
		       o->base_lr, o->tc.lr.peak_lr / o->base_lr, loom_lr_scale_name(o->lr_scale),
		       loom_trainer_tokens_per_step(tr), o->ref_batch);
	if (o->wd_scale) {
		long long B = loom_trainer_tokens_per_step(tr);
		printf("weight decay: Muon's %g = %g x sqrt(%lld / B_ref) x (D_ref / D) = %g x %.4g x (%lld / %lld) (epochs "
		       "scaling: D = %lld steps x %lld tokens, D_ref = --ref-tokens)\n", o->tc.muon.weight_decay, o->wd_ref, B,
		       o->wd_ref, sqrt((double)B / (double)o->ref_batch), o->ref_tokens, B * o->tc.lr.total_steps,
		       o->tc.lr.total_steps, B);
	}
	if (o->pp > 1 && o->tc.pp_virtual_stages > 1)
		printf("pipeline parallel: %d stages x dp %d, schedule %s, %d model chunks per stage, %d micro-batches per "
		       "step (ideal bubble (P-1)/(V M+P-1) = %.1f%%)%s%s\n", o->pp, o->dp, o->tc.pp_schedule,
		       o->tc.pp_virtual_stages, o->tc.accum,
		       100.0 * loom_pp_bubble_ideal(o->tc.pp_schedule, o->pp, o->tc.pp_virtual_stages, o->tc.accum),
		       o->tc.trace_dir ? "; trace in " : "", o->tc.trace_dir ? o->tc.trace_dir : "");
	else if (o->pp > 1)
		printf("pipeline parallel: %d stages x dp %d, schedule %s, %d micro-batches per step (ideal bubble "
		       "(P-1)/(M+P-1) = %.1f%%)%s%s\n", o->pp, o->dp, o->tc.pp_schedule ? o->tc.pp_schedule : "1f1b",
		       o->tc.accum, 100.0 * loom_pp_bubble_ideal(o->tc.pp_schedule, o->pp, 1, o->tc.accum),
		       o->tc.trace_dir ? "; trace in " : "", o->tc.trace_dir ? o->tc.trace_dir : "");
	if (o->pp > 1)
		print_stages(o);
	if (o->tp > 1 && o->pp > 1)
		printf("tensor parallel: tp %d x dp %d x pp %d = %d ranks (Megatron: heads, MLP columns and vocabulary "
		       "rows split over tp neighbouring ranks; each stage holds its layers' shards)\n", o->tp, o->dp, o->pp,
		       o->world);
	else if (o->tp > 1)
		printf("tensor parallel: tp %d x dp %d = %d ranks (Megatron: heads, MLP columns and vocabulary rows split "
		       "over tp neighbouring ranks; %zu shard parameters per rank)\n", o->tp, o->dp, o->world,
		       loom_model_shard_params(&o->mc, o->tp));
	if (o->cp > 1) {
		int Tl = o->tc.T / o->cp, K = loom_cp_chunks(&o->mc, o->tc.T, o->cp), c = Tl / K, n = 0;
		char who[128], pos[256] = "";
		if (K > 2) /* the layout's segments (loom_cp_chunks: the windows need them to balance) */
			snprintf(who, sizeof who, "chunks r and %d-r of each of %d segments of %d chunks, which balances the "
			         "windows", 2 * o->cp - 1, K / 2, 2 * o->cp);
		else
			snprintf(who, sizeof who, "chunks r and %d-r of %d", 2 * o->cp - 1, 2 * o->cp);
		for (int h = 0; h < K; h++) {
			int p0 = loom_cp_position(o->tc.T, o->cp, K, 0, h * c);
			n += snprintf(pos + n, sizeof pos - (size_t)n, "%s%d-%d", h == 0 ? "" : h == K - 1 ? " and " : ", ", p0,
			              p0 + c - 1);
		}
		printf("context parallel: cp %d x dp %d x tp %d x pp %d = %d ranks; each rank holds %d of a sequence's %d "
		       "positions as %d chunks of %d (rank r: %s; rank 0: positions %s); "
		       "%s (%.2f MiB received per layer forward, twice that backward); gradients averaged over dp x cp = %d "
		       "ranks\n", o->cp, o->dp, o->tp, o->pp, o->world, Tl, o->tc.T, K, c, who, pos,
		       loom_cp_attention_ring() == 1 ? "attention passes the keys and values "
		       "around the ring of the group, overlapped with the blocks' work" : "attention all-gathers the keys "
		       "and values of the sequence per layer (LOOM_CP_ATTENTION=gather)", cp_gather_bytes(o) / 1048576.0,
		       o->dp * o->cp);
	}
	if (o->tc.mesh && loom_comm_host(o->tc.comm, o->world - 1) > 0) { /* a job spanning hosts */
		char hosts[256];
		loom_mesh_hosts_describe(o->tc.mesh, hosts, sizeof hosts);
		printf("mesh: %s\n", hosts);
	}
	if (o->sp)
		printf("sequence parallel: the norms and residual adds run on %d of the %d positions of a micro-batch "
		       "per rank (all-gather / reduce-scatter over tp %d instead of all-reduce)\n", o->tc.B * o->tc.T / o->tp,
		       o->tc.B * o->tc.T, o->tp);
	if (o->dp * o->cp > 1) { /* the strategy's group: dp x cp */
		if (o->tc.zero > 0)
			printf("data parallel: %d ranks x %d thread%s; ZeRO stage %d: %s; gradients reduce-scattered in %s",
			       o->dp * o->cp, loom_num_threads(), loom_num_threads() == 1 ? "" : "s", o->tc.zero, o->tc.zero == 1 ?
			       "AdamW state sharded, gradients reduce-scattered per unit on the last micro-step" : o->tc.zero == 2 ?
			       "AdamW state and gradients sharded, gradients reduce-scattered per unit every micro-step" :
			       "parameters, gradients and AdamW state sharded; each unit gathered before use, the next prefetched",
			       o->tc.grad_reduce_dtype == LOOM_BFLOAT16 ? "bf16" : "fp32");
		else
			printf("data parallel: %d ranks x %d thread%s; gradients averaged in %s in buckets of %g MiB (the first "
			       "%g MiB) on the last of %d micro-step%s", o->dp * o->cp, loom_num_threads(),
			       loom_num_threads() == 1 ? "" : "s", o->tc.grad_reduce_dtype == LOOM_BFLOAT16 ? "bf16" : "fp32",
			       o->tc.bucket_mb, o->tc.bucket_mb < 1 ? o->tc.bucket_mb : 1.0, o->tc.accum,
			       o->tc.accum == 1 ? "" : "s");
		if (o->tc.check_replicas > 0)
			printf("; replicas compared every %d step%s", o->tc.check_replicas, o->tc.check_replicas == 1 ? "" : "s");
		putchar('\n');
	}
	loom_train_memory_t mem;
	loom_trainer_memory(tr, &mem);
	printf("memory per rank: parameters %.1f MiB, gradients %.1f MiB, optimizer %.1f MiB (model states %.1f MiB; "
	       "%s = %.1f MiB with P = %zu, N = %d), activations %.1f MiB, communication buffers %.1f MiB\n",
	       mem.params / 1048576.0, mem.grads / 1048576.0, mem.optim / 1048576.0, mem.model_states / 1048576.0,
	       mem.formula, mem.theory / 1048576.0, mem.nparams, mem.dp, mem.activations / 1048576.0,
	       mem.comm / 1048576.0);
	char formula[256] = "";
	if (mem.act_formula > 0) /* the family's written formula beside the allocation, when it has one */
		snprintf(formula, sizeof formula, " (formula %s: %.2f MiB)", mem.act_formula_text,
		         mem.act_formula / 1048576.0);
	printf("activations per rank (checkpointing %s): kept %.2f MiB + recompute scratch %.2f MiB = %.2f MiB allocated"
	       "%s; plus head scratch %.2f MiB and backward scratch %.2f MiB\n",
	       loom_act_ckpt_name(mem.act_ckpt), mem.act.kept / 1048576.0, mem.act.recompute / 1048576.0,
	       (mem.act.kept + mem.act.recompute) / 1048576.0, formula, mem.act.head / 1048576.0,
	       mem.act.backward / 1048576.0);
	const loom_cpu_t *cpu = loom_cpu();
	loom_bf16_path_t path = LOOM_BF16_AUTO;
	char mm[200];
	if (o->dtype == LOOM_COMPUTE_BF16 && loom_bf16_path(&path) == LOOM_OK) /* (the model was created on it) */
		snprintf(mm, sizeof mm, "bf16 (fp32 accumulation), path %s", loom_bf16_path_name(path));
	else
		snprintf(mm, sizeof mm, "fp32 on %s", loom_gemm_backend_name());
	printf("cpu: %s (%s); threads: %d; matmuls in %s\n", cpu->brand[0] ? cpu->brand : cpu->vendor,
	       loom_cpu_features_str(cpu), loom_num_threads(), mm);
	char gemm[96] = "";
	if (o->tc.gemm_flops > 0 && o->tc.peak_flops > 0)
		snprintf(gemm, sizeof gemm, "; the GEMM reaches %.1f GFLOP/s, %.0f%% of it", o->tc.gemm_flops / 1e9,
		         100.0 * o->tc.gemm_flops / o->tc.peak_flops);
	printf("MFU against the hardware's %s peak of %.1f GFLOP/s%s (%s)%s; %.4g FLOP per token (attention inside the "
	       "causal mask and windows; %s's nominal count %.4g, mfu_%s in the log)\n",
	       loom_compute_dtype_name(o->dtype), o->tc.peak_flops / 1e9, o->world > 1 ? " per rank" : "",
	       o->tc.peak_source ? o->tc.peak_source : "given", gemm, loom_model_flops_per_token(&o->mc, o->tc.T),
	       loom_arch_name(o->mc.arch), loom_model_flops_per_token_nominal(&o->mc, o->tc.T), loom_arch_name(o->mc.arch));
}

static int on_step(void *ctx, loom_trainer_t *tr, const loom_step_metrics_t *m)
{
	run_ctx_t *r = ctx;
	char eta[32], mfu[16] = "-";
	const char *nap = getenv("LOOM_STEP_SLEEP_MS");
	if (nap && atoi(nap) > 0) /* tests of faults and launchers: a tiny model's steps made slow, without the CPU */
		usleep((useconds_t)atoi(nap) * 1000u);
	if (m->saved) /* committed by rank 0 before this callback (the run loop returns when a save fails) */
		r->disk_step = m->step;
	int w = snprintf(NULL, 0, "%lld", m->total), stop = elastic_stop_requested(r, m);
	if (stop != 0) /* collective: before rank 0's printing */
		return 1;
	if (r->o->rank != 0) /* rank 0 prints for the job */
		return 0;
	r->steps_run++;
	r->optim_ms += m->optim_ms, r->step_ms += m->dt_ms;
	r->iv_steps++, r->iv_ms += m->dt_ms, r->iv_mfu += m->mfu;
	r->iv_comm += m->comm_ms, r->iv_exposed += m->exposed_comm_ms, r->iv_wait += m->wait_ms;
	if (m->step % r->o->print_every != 0 && m->step != 1 && m->step != m->total && !m->has_val && !m->saved)
		return 0;
	/* time, throughput and communication are the means over the steps since the last line */
	double n = r->iv_steps, ms = r->iv_ms / n;
	if (m->eta_s >= 0)
		fmt_eta(m->eta_s, eta, sizeof eta);
	else
		snprintf(eta, sizeof eta, "-");
	if (r->o->tc.peak_flops > 0)
		snprintf(mfu, sizeof mfu, "%.1f%%", 100.0 * r->iv_mfu / n);
	printf("step %*lld/%lld | loss %.6f | ema %.6f | lr %.3e | norm %.4f | %.1f ms | %.0f tok/s | MFU %s", w, m->step,
	       m->total, m->loss, m->loss_ema, m->lr, m->grad_norm, ms, (double)loom_trainer_tokens_per_step(tr) / (ms * 1e-3),
	       mfu);
	if (r->o->world > 1)
		printf(" | comm %.1f ms, exposed %.1f ms, wait %.1f ms", r->iv_comm / n, r->iv_exposed / n, r->iv_wait / n);
	if (r->o->pp > 1)
		printf(" | bubble %.1f%% (ideal %.1f%%, for these stages %.1f%%)", 100.0 * m->bubble,
		       100.0 * m->bubble_theory, 100.0 * m->bubble_expected);
	r->iv_steps = 0, r->iv_ms = r->iv_comm = r->iv_exposed = r->iv_wait = r->iv_mfu = 0.0;
	printf(" | ETA %s", eta);
	if (m->has_val)
		printf(" | val %.6f", m->val_loss);
	if (m->saved)
		printf(" | saved");
	putchar('\n');
	if (m->mfu > 1.0 && !r->warned_mfu) {
		r->warned_mfu = 1;
		printf("note: MFU above 100%%: the peak (%.1f GFLOP/s) is too low, probably measured while the machine "
		       "was busy; delete ~/.cache/loom/hw_peak* or give --peak-flops\n", r->o->tc.peak_flops / 1e9);
	}
	if (r->o->sample_every > 0 && m->step % r->o->sample_every == 0) {
		loom_model_profile(loom_trainer_model(tr), 0); /* --profile times training steps, not sampling */
		sample(r, loom_trainer_model(tr), m->step);
		loom_model_profile(loom_trainer_model(tr), r->o->profile);
	}
	return 0;
}

/* Ranks x threads beyond the CPUs (srun without CPU binding, OMP_NUM_THREADS unset under mpirun)
 * makes steps many times slower with nothing else to show for it: say so once, on rank 0. */
static void warn_oversubscription(const opts_t *o)
{
	static const char *const local_env[] = {"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE",
	                                        "MPI_LOCALNRANKS"};
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	int local = o->world, threads = loom_num_threads(), mine = (int)cpus;
	cpu_set_t set;
	for (size_t k = 0; k < sizeof local_env / sizeof *local_env; k++)
		if (getenv(local_env[k]) && atoi(getenv(local_env[k])) > 0) {
			local = atoi(getenv(local_env[k]));
			break;
		}
	if (sched_getaffinity(0, sizeof set, &set) == 0)
		mine = CPU_COUNT(&set);
	if (o->rank != 0 || cpus <= 0)
		return;
	if ((long)local * threads > cpus)
		fprintf(stderr, "loom train: warning: %d rank%s x %d thread%s = %ld on this machine's %ld CPUs: oversubscribed, "
		        "steps can be many times slower; give each rank CPUs/ranks threads (--threads or OMP_NUM_THREADS; "
		        "srun: --cpus-per-task and --cpu-bind=cores)\n", local, local == 1 ? "" : "s", threads,
		        threads == 1 ? "" : "s", (long)local * threads, cpus);
	else if (threads > mine)
		fprintf(stderr, "loom train: warning: %d threads, but this rank may run on %d CPU%s only (its CPU affinity): "
		        "oversubscribed, steps can be many times slower; use --threads %d\n", threads, mine, mine == 1 ? "" : "s",
		        mine);
}

/* The command that resumes this run: this program (its real path), the same flags, plus --resume; in
 * a job of several ranks, through `loom run`. Shell-quoted. */
static void resume_command(int argc, char **argv, const opts_t *o, char *buf, size_t cap)
{
	char exe[PATH_MAX];
	ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
	size_t n = 0;
	int has_resume = 0;
	if (len <= 0)
		snprintf(exe, sizeof exe, "loom");
	else
		exe[len] = 0;
	buf[0] = 0;
#define PUT(...) (n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, __VA_ARGS__), n = n < cap ? n : cap - 1)
	if (o->world > 1)
		PUT("%s run --nproc-per-node %d ", exe, o->world);
	PUT("%s train", exe);
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		has_resume |= !strcmp(a, "--resume");
		if (!strcmp(a, "--resume-from") || !strncmp(a, "--resume-from=", 14)) { /* continue from the newest */
			i += !strcmp(a, "--resume-from");
			continue;
		}
		if (a[strspn(a, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_=.,/:+@%")] == 0 && *a) {
			PUT(" %s", a);
		} else {
			PUT(" '");
			for (; *a; a++)
				*a == '\'' ? PUT("'\\''") : PUT("%c", *a);
			PUT("'");
		}
	}
	if (!has_resume)
		PUT(" --resume");
#undef PUT
}

/* Ctrl-C: nothing new is saved; rank 0 says how to continue from the last checkpoint, then the
 * process dies of SIGINT as it would have. The message is built before training starts. */
static char interrupt_msg[8192];

static void on_sigint(int sig)
{
	if (interrupt_msg[0]) {
		ssize_t r = write(STDERR_FILENO, interrupt_msg, strlen(interrupt_msg));
		(void)r;
	}
	signal(sig, SIG_DFL);
	raise(sig);
}

static void setup_interrupt(int argc, char **argv, const opts_t *o)
{
	char cmd[6000];
	if (o->rank == 0) {
		resume_command(argc, argv, o, cmd, sizeof cmd);
		if (o->tc.save_dir)
			snprintf(interrupt_msg, sizeof interrupt_msg, "\nloom train: interrupted; nothing new was saved. "
			         "Continue from the last checkpoint in %s with:\n  %s\n", o->tc.save_dir, cmd);
		else
			snprintf(interrupt_msg, sizeof interrupt_msg, "\nloom train: interrupted; there are no checkpoints "
			         "(no --save-dir), so nothing can be resumed\n");
	}
	signal(SIGINT, on_sigint);
}

/* The other work on the machine for the prediction (--load): given; measured by --nproc's launcher
 * before the ranks started (LOOM_PLAN_LOAD); measured now by a process that is the whole run (before it
 * allocates or runs anything); else, in a job another launcher started, where the other ranks are
 * already running, 0. */
static void plan_load(opts_t *o)
{
	const char *e = getenv("LOOM_PLAN_LOAD");
	if (o->load >= 0)
		o->load_how = "--load";
	else if (e && *e && atof(e) >= 0)
		o->load = atof(e), o->load_how = "measured at launch";
	else if (!in_job() && o->nproc <= 1)
		o->load = loom_cluster_measure_load((int)sysconf(_SC_NPROCESSORS_ONLN), 0.5), o->load_how = "measured at start";
	else
		o->load = 0.0, o->load_how = "not measured inside a job: --load";
}

/* The peak cache's figures the prediction and MFU need for this run's threads and dtype: what is missing
 * is measured by `loom plan --measure` in a process of its own (its GEMM and copy buffers, hundreds of
 * MiB, would otherwise stay in this rank's peak resident set). */
static void fill_peak_cache(const opts_t *o)
{
	char exe[PATH_MAX], th[16];
	ssize_t len;
	if (loom_cluster_local_missing(loom_num_threads(), o->dtype, NULL, 0) == 0 ||
	    (len = readlink("/proc/self/exe", exe, sizeof exe - 1)) <= 0)
		return;
	exe[len] = 0;
	snprintf(th, sizeof th, "%d", loom_num_threads());
	fflush(NULL);
	pid_t pid = fork();
	if (pid == 0) { /* only exec after fork: this process has threads */
		execl(exe, exe, "plan", "--measure", "--threads", th, "--dtype", loom_compute_dtype_name(o->dtype),
		      (char *)NULL);
		_exit(127);
	}
	int st;
	if (pid > 0)
		while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
		}
}

/* The prediction for this run: `loom plan`'s for the same flags (loom_plan_config_of_run and
 * loom_plan_local, nothing measured here: the cache was filled by fill_peak_cache); 0 when it cannot
 * say (no cached hardware peak). */
static int predict(const opts_t *o, loom_plan_t *p, loom_cluster_t *c)
{
	loom_plan_config_t pc;
	loom_model_opts_t mo = {.B = o->tc.B, .T = o->tc.T, .tp_size = o->tp, .act_ckpt = o->act_ckpt, .dtype = o->dtype,
	                        .sequence_parallel = o->sp, .cp_size = o->cp};
	loom_plan_local_t how = {.threads = loom_num_threads(), .load = o->load, .measure = 0};
	loom_plan_config_of_run(&o->tc, &o->mc, &mo, o->dp, o->pp, &pc);
	return loom_plan_local(&pc, &how, c, p) == LOOM_OK;
}

static void print_summary(loom_trainer_t *tr, const opts_t *o, const loom_plan_t *p, const char *resume)
{
	loom_train_summary_t s;
	char wall[32];
	loom_trainer_summary(tr, &s);
	if (s.steps == 0)
		return;
	fmt_eta(s.wall_s, wall, sizeof wall);
	printf("summary: steps %lld-%lld (%lld) in %s (%.1f s, of which steps %.1f s); %lld tokens; %.0f tok/s mean, "
	       "%.0f best", s.first_step, s.last_step, s.steps, wall, s.wall_s, s.step_s, s.tokens, s.mean_tokens_per_s,
	       s.best_tokens_per_s);
	if (o->tc.peak_flops > 0)
		printf("; MFU %.1f%% mean (%.1f%% at %s's nominal count)", 100.0 * s.mean_mfu, 100.0 * s.mean_mfu_nominal,
		       loom_arch_name(o->mc.arch));
	if (p && p->step_time_s > 0 && s.median_steps > 0) {
		loom_train_memory_t mem;
		loom_trainer_memory(tr, &mem);
		loom_plan_measured_t me = {.step_s = s.median_step_s, .optimizer_s = s.median_optim_s,
		                           .comm_s = s.median_comm_s, .bubble = s.median_bubble,
		                           .peak_rss = (double)loom_peak_rss_bytes(), .states = (double)mem.model_states,
		                           .activations = (double)mem.activations};
		loom_plan_verdict_t v;
		char which[128];
		loom_plan_compare(p, &me, &v);
		if (s.warmup > 0)
			snprintf(which, sizeof which, "median of steps %lld-%lld, after %d of warm-up", s.first_step + s.warmup,
			         s.last_step, s.warmup);
		else
			snprintf(which, sizeof which, "median of all %lld steps: too few for a warm-up", s.steps);
		printf("\nsummary: predicted (loom plan, load %.2f) vs measured (%s): step %.1f ms vs %.1f ms (%+.0f%%); "
		       "memory %.1f MiB vs peak RSS %.1f MiB (%+.0f%%)", o->load, which,
		       1e3 * p->step_time_s, 1e3 * me.step_s, 100.0 * v.time_error, p->memory_rank0.total / 1048576.0,
		       me.peak_rss / 1048576.0, 100.0 * v.memory_error);
		if (v.time_part)
			printf("\nsummary: the step missed by more than 15%%, most in %s: predicted %.1f ms, measured %.1f ms",
			       v.time_part, 1e3 * v.time_part_pred, 1e3 * v.time_part_meas);
		if (v.memory_part)
			printf("\nsummary: memory missed by more than 10%%, most in %s: predicted %.1f MiB, measured %.1f MiB",
			       v.memory_part, v.memory_part_pred / 1048576.0, v.memory_part_meas / 1048576.0);
	}
	printf("\nsummary: final loss %.6f", s.final_loss);
	if (s.has_val)
		printf("; best val loss %.6f at step %lld", s.best_val_loss, s.best_val_step);
	if (o->world > 1)
		printf("; communication %.1f ms per step, of it exposed %.1f ms (%.0f%%), straggler wait %.1f ms",
		       s.comm_ms / s.steps, s.exposed_comm_ms / s.steps,
		       s.comm_ms > 0 ? 100.0 * s.exposed_comm_ms / s.comm_ms : 0.0, s.wait_ms / s.steps);
	putchar('\n');
	if (s.checkpoint[0])
		printf("summary: checkpoint %s\nsummary: resume or extend (raise --steps) with: %s\n", s.checkpoint, resume);
	if (o->tc.log_path)
		printf("summary: log %s (plot it: loom plot %s -o run.png)\n", o->tc.log_path, o->tc.log_path);
}

int loom_cli_train(int argc, char **argv)
{
	opts_t o;
	loom_comm_t *comm = NULL;
	loom_mesh_t *mesh = NULL;
	loom_model_t *model = NULL;
	loom_trainer_t *tr = NULL;
	float *init = NULL;
	run_ctx_t r;
	static char elastic_row[4096];
	loom_plan_t plan;
	loom_cluster_t cluster;
	int rc, run_rc = LOOM_OK, status = 1, have_plan = 0;
	memset(&r, 0, sizeof r);
	r.disk_step = -1;
	parse(argc, argv, &o);
	if (o.nproc > 1 && !in_job())
		validate(&o, o.nproc); /* one message from the launcher, not one per rank */
	relaunch(argc, argv, &o); /* --nproc N: returns only inside a job or with N = 1 */
	if (o.check && o.load < 0)
		o.load = 0.0, o.load_how = "not measured with --check";
	else
		plan_load(&o); /* before this process (or any rank) allocates or runs anything */
	/* Join the job the environment describes; a job of one rank is the single-process trainer. */
	if (loom_comm_init(&comm) != LOOM_OK)
		cli_die("train", "joining the data-parallel job: %s", loom_errmsg());
	o.rank = loom_comm_rank(comm), o.world = loom_comm_size(comm);
	elastic_write("started", o.rank, "joined\n"); /* the launcher's watchdog of the start (run_elastic.c) */
	if (o.nproc > 0 && o.nproc != o.world)
		cli_die("train", "--nproc %d, but this process is already rank %d of a job of %d", o.nproc, o.rank, o.world);
	if (o.world == 1) {
		loom_comm_destroy(comm);
		comm = NULL;
	}
	o.tc.comm = comm;
	validate(&o, o.world); /* every rank alike (under --nproc the launcher has checked) */
	if (o.tp > 1 || o.pp > 1 || o.cp > 1 || o.dp_flag) {
		/* the ranks as dp x cp x tp x pp (tp neighbouring ranks, then cp, dp, pp); every rank checks the
		 * sizes before any work */
		if (loom_mesh_create4(&mesh, comm, o.dp_flag, o.cp, o.tp, o.pp) != LOOM_OK)
			cli_die("train", "--dp %d --cp %d --tp %d --pp %d on %d rank%s: %s", o.dp_flag, o.cp, o.tp, o.pp, o.world,
			        o.world == 1 ? "" : "s", loom_errmsg());
		o.tc.mesh = mesh;
	}
	loom_set_num_threads(o.threads > 0 ? o.threads : omp_get_max_threads()); /* default: OMP_NUM_THREADS or CPUs */
	warn_oversubscription(&o);
	batch_config(&o);
	if (cli_train_memory_check(&(cli_memcheck_t){&o.mc, o.tc.B, o.tc.T, o.tc.accum, o.act_ckpt, o.tc.zero, o.dp, o.tp,
	                                              o.pp, loom_num_threads(), o.dtype, o.rank, o.world, o.sp,
	                                              o.cp}) != 0)
		goto out;
	find_tokenizer(&o);
	r.o = &o;

	/* The strategy says what the model keeps of its own (ZeRO-2/3 keep shards instead); without its
	 * own parameters the initial ones live in a buffer of ours until the strategy has taken its shard
	 * (at the parameter sync below). */
	/* with --cp the model holds this rank's T/cp rows of each sequence (its two head-tail chunks) */
	loom_model_opts_t mo = {.B = o.tc.B, .T = o.tc.T / o.cp, .tp_size = o.tp,
	                       .tp_rank = mesh ? loom_mesh_coord(mesh, LOOM_MESH_TP) : 0,
	                       .act_ckpt = o.act_ckpt,
	                       .dtype = o.dtype, .sequence_parallel = o.sp, .cp_size = o.cp,
	                       .cp_rank = mesh ? loom_mesh_coord(mesh, LOOM_MESH_CP) : 0};
	loom_train_model_opts(&o.tc, o.dp * o.cp, o.tp, &mo); /* the strategy spans dp x cp */
	if ((rc = loom_model_create(&model, &o.mc, &mo)) != LOOM_OK) {
		fprintf(stderr, "loom train: creating the model: %s%s", loom_errmsg(), rc == LOOM_ENOMEM ? "" : "\n");
		if (rc == LOOM_ENOMEM) /* the sizes the user can act on */
			fprintf(stderr, " (parameters and gradients alone: 2 x %zu bytes; AdamW adds 2 x as much; "
			        "activations grow with --batch-size x --seq-len)\n", loom_model_num_params(&o.mc) * sizeof(float));
		goto out;
	}
	/* a pipeline's stages initialize their own tensors from the seed (loom_trainer_create): only a
	 * file's parameters pass through a whole buffer there */
	int whole_init = mo.no_own_params && (o.pp <= 1 || o.init_from);
	if (whole_init && (!(init = malloc(loom_model_num_params(&o.mc) * sizeof(float))) ||
	                   loom_model_set_param_buffer(model, init) != LOOM_OK)) {
		fprintf(stderr, "loom train: out of memory for the initial parameters\n");
		goto out;
	}
	if (o.init_from) { /* the whole model from the file; a tensor-parallel rank keeps its shard */
		float *full = o.tp > 1 ? malloc(loom_model_num_params(&o.mc) * sizeof(float)) : loom_model_params(model);
		if (!full)
			cli_die("train", "--init-from: out of memory for %zu parameters", loom_model_num_params(&o.mc));
		rc = loom_model_load(o.init_from, &o.mc, full);
		if (rc == LOOM_OK && o.tp > 1)
			loom_model_tp_shard(&o.mc, o.tp, mo.tp_rank, full, loom_model_params(model));
		if (o.tp > 1)
			free(full);
		if (rc != LOOM_OK) {
			fprintf(stderr, "loom train: --init-from: %s\n", loom_errmsg());
			goto out;
		}
	} else if (o.pp <= 1) {
		loom_model_init(model, o.tc.seed);
	}
	o.tc.profile = o.profile; /* the trainer profiles its steps, not evaluations (nor sampling: on_step) */
	if ((rc = loom_trainer_create(&tr, &o.tc, model)) != LOOM_OK) {
		fprintf(stderr, "loom train: %s\n", loom_errmsg());
		goto out;
	}
	if (o.rank == 0) { /* measured once the settings are known to be good */
		const char *src = "--peak-flops";
		int given = o.tc.peak_flops > 0;
		if (!given && !o.check)
			fill_peak_cache(&o); /* in a process of its own: what is still missing is measured below */
		if (!given)
			o.tc.peak_flops = cached_peak(1, o.dtype, loom_num_threads(), !o.check, &src);
		o.tc.peak_source = src;
		/* with --peak-flops nothing is measured: the GEMM's figure only when it is known */
		o.tc.gemm_flops = cached_peak(0, o.dtype, loom_num_threads(), !given && !o.check, NULL);
		loom_trainer_set_peak(tr, o.tc.peak_flops, o.tc.peak_source, o.tc.gemm_flops);
	}
	if (o.resume) { /* every rank reads the checkpoint; the first step re-broadcasts rank 0's parameters */
		/* Starting from scratch only when there is no checkpoint at all: anything else that fails
		 * (a damaged newest checkpoint, a missing key) stops here, before anything is written. */
		int n = 0;
		char rescue[PATH_MAX + 32];
		const char *from = o.resume_from ? o.resume_from : o.tc.save_dir;
		if (rescue_path(rescue, sizeof rescue) == 0) { /* the launcher chose the survivors' state in memory */
			const char *d = getenv("LOOM_ELASTIC_DISK_STEP");
			from = rescue, r.rescued = 1, r.disk_step = d ? atoll(d) : -1;
		}
		if (!o.resume_from && !r.rescued && loom_ckpt_count(o.tc.save_dir, &n) != LOOM_OK) {
			fprintf(stderr, "loom train: --resume: %s\n", loom_errmsg());
			goto out;
		}
		if (!o.resume_from && !r.rescued && n == 0) {
			if (o.rank == 0)
				printf("resume: no checkpoint in %s yet, starting from scratch\n", o.tc.save_dir);
		} else if ((rc = loom_trainer_resume(tr, from)) != LOOM_OK) {
			fprintf(stderr, "loom train: %s%s\n", loom_errmsg(), r.rescued ? " (the state kept in memory that the "
			        "launcher chose for this restart: LOOM_ELASTIC_RESCUE_STEP)" : "");
			if (o.rank == 0 && !o.resume_from && rc == LOOM_EFORMAT)
				fprintf(stderr, "loom train: nothing was written or removed; continue from an older checkpoint with "
				        "--resume-from DIR/step_NNNNNNNN, or move the damaged one away\n");
			goto out;
		} else {
			if (!r.rescued)
				r.disk_step = loom_trainer_steps_done(tr);
			if (o.rank == 0)
				printf("resumed from %s at step %lld\n", from, loom_trainer_steps_done(tr));
			if (o.rank == 0 && loom_trainer_steps_done(tr) >= o.tc.lr.total_steps)
				printf("nothing to do: the checkpoint is at step %lld, --steps is %lld\n",
				       loom_trainer_steps_done(tr), o.tc.lr.total_steps);
		}
	}
	elastic_event(&o, tr, r.rescued, elastic_row, sizeof elastic_row);
	if (o.rank == 0) {
		print_header(&o, tr);
		if ((have_plan = predict(&o, &plan, &cluster))) { /* `loom plan`'s prediction for these flags */
			int n = loom_plan_json(&plan, &cluster, NULL, 0);
			char *json = malloc((size_t)n + 1);
			loom_trainer_set_prediction(tr, plan.step_time_s, plan.memory_rank0.total);
			if (json) {
				loom_plan_json(&plan, &cluster, json, (size_t)n + 1);
				loom_trainer_set_plan_json(tr, json); /* logged in the config record, as --json prints it */
				free(json);
			}
			printf("plan: predicted step %.1f ms (%.0f tok/s, MFU %.1f%%), memory %.1f MiB on this rank (loom plan "
			       "with these flags: %d thread%s per rank, load %.2f, %s; docs/plan.md)\n", 1e3 * plan.step_time_s,
			       plan.tokens_per_s, 100.0 * plan.mfu, plan.memory_rank0.total / 1048576.0, cluster.threads,
			       cluster.threads == 1 ? "" : "s", o.load, o.load_how);
		}
	}
	if (o.world > 1) { /* rank 0's parameters to every rank, verified there (collective) */
		uint64_t sum;
		if (loom_trainer_sync_params(tr, &sum) != LOOM_OK) {
			fprintf(stderr, "loom train: %s\n", loom_errmsg());
			goto out;
		}
		if (o.rank == 0 && o.dp * o.cp > 1)
			printf("parameters: broadcast from rank 0 to %d ranks, checksum %016llx verified on every rank\n",
			       o.dp * o.cp, (unsigned long long)sum);
	}
	if (r.rescued) { /* every rank has read its host's rescue: the host's keeper frees the memory */
		char dir[PATH_MAX];
		if (comm && loom_barrier(comm) != LOOM_OK) {
			fprintf(stderr, "loom train: rank %d: elastic: the barrier after loading the state kept in memory: %s\n",
			        o.rank, loom_comm_errmsg(comm));
			goto out;
		}
		if (rescue_keeper(o.rank) && rescue_dir(dir, sizeof dir) == 0 && loom_trainer_remove_replica(dir) != LOOM_OK)
			fprintf(stderr, "loom train: rank %d: elastic: %s (the launcher removes it at the end of the job)\n",
			        o.rank, loom_errmsg());
	}
	if (o.sample_every > 0 && (o.tp > 1 || o.cp > 1)) {
		if (o.rank == 0)
			printf("note: --sample-every is ignored with --%s (sample from a checkpoint with `loom sample`)\n",
			       o.tp > 1 ? "tp" : "cp");
		o.sample_every = 0;
	}
	free(init); /* ZeRO-3: each rank has its shard now; the model's views point at gathered buffers */
	init = NULL;
	if (o.check) {
		if (o.rank == 0)
			printf("check: ok: the flags are valid; the mesh, model and parallel strategy were built on %d rank%s "
			       "and started from rank 0's parameters; no step taken\n", o.world, o.world == 1 ? "" : "s");
		status = 0;
		goto out;
	}
	loom_ckpt_aside_t aside;
	if (loom_trainer_prepare_save_dir(tr, &aside) != LOOM_OK) { /* rank 0; before anything is written */
		fprintf(stderr, "loom train: --save-dir: %s\n", loom_errmsg());
		goto out;
	}
	if (aside.n > 0) { /* said once: what moved, and why */
		char from[64];
		long long s0 = loom_trainer_steps_done(tr);
		snprintf(from, sizeof from, s0 > 0 ? "continues from step %lld" : "starts from scratch", s0);
		printf("checkpoints: this run %s, so the %d %scheckpoint%s in %s (%s) belong%s to %s: moved aside into %s "
		       "(nothing deleted)\n", from, aside.n, s0 > 0 ? "newer " : "", aside.n == 1 ? "" : "s", o.tc.save_dir,
		       aside.names, aside.n == 1 ? "s" : "", s0 > 0 ? "an abandoned branch" : "an earlier run", aside.into);
	}
	if (o.sample_every > 0 && o.rank == 0) {
		if (o.tc.tokenizer && loom_tokenizer_load(&r.tok, o.tc.tokenizer) == LOOM_OK)
			r.have_tok = 1;
		else if (o.mc.vocab_size == LOOM_BYTE_VOCAB && loom_tokenizer_init_bytes(&r.tok) == LOOM_OK)
			r.have_tok = 1;
		else
			printf("note: no tokenizer.bin beside the training data: --sample-every is ignored\n");
		r.sample_buf = malloc(64 * sizeof(int));
		if (!r.sample_buf)
			r.have_tok = 0;
	}
	setup_interrupt(argc, argv, &o);
	r.world = comm;
	r.training = 1;
	if ((rc = run_rc = loom_trainer_run(tr, on_step, &r)) != LOOM_OK) {
		if (r.elastic_stop) { /* saved; the launcher starts the job again on more hosts */
			status = 0;
			goto out;
		}
		fprintf(stderr, "loom train: %s\n", loom_errmsg());
		goto out;
	}
	signal(SIGINT, SIG_DFL);
	if (o.rank == 0) {
		char cmd[6000];
		resume_command(argc, argv, &o, cmd, sizeof cmd);
		print_summary(tr, &o, have_plan ? &plan : NULL, cmd);
	}
	if (o.profile && r.steps_run > 0 && o.rank == 0) {
		loom_model_profile_report(model, stdout, r.steps_run);
		printf("optimizer (grad norm + AdamW): %.2f ms per step, %.1f%% of the step time\n",
		       r.optim_ms / r.steps_run, 100.0 * r.optim_ms / r.step_ms);
	}
	status = 0;
out:
	if (status != 0 && comm && elastic_dir()) { /* the launcher acts on the first verdict: the rescue first */
		char msg[1024];
		snprintf(msg, sizeof msg, "%s", loom_errmsg());
		elastic_rescue(&r, tr, run_rc, o.rank);
		elastic_write("failed", o.rank, "step %lld\n%s\n", tr ? loom_trainer_steps_done(tr) : -1LL, msg);
	}
	loom_trainer_destroy(tr); /* before the model, the mesh and the communicator it uses */
	loom_model_destroy(model);
	loom_mesh_destroy(mesh);
	free(init);
	loom_comm_destroy(comm);
	if (r.have_tok)
		loom_tokenizer_free(&r.tok);
	free(r.sample_buf);
	return status;
}
