/* train.c: `loom train`: parse and validate flags, build or load the model, run the trainer (loom/train.h)
 * printing one line per step, and optionally sample text and print the per-kernel profile.
 *
 * Sequence lengths: --seq-len is the length T trained on. The model's maximum (its n_positions, the
 * rows of wpe) comes from the preset, from --init-from's file, or from --n-positions; with explicit
 * model flags and no preset it defaults to T. T above the model's maximum is an error. */
#include <glob.h>
#include <libgen.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "loom/ckpt.h"
#include "loom/data.h"
#include "loom/gpt2.h"
#include "loom/train.h"

static const char *const usage_text =
	"usage: loom train --train-data GLOB --steps N [flags]\n"
	"\n"
	"data:\n"
	"  --train-data GLOB      token shards (llm.c format), e.g. 'data/train_*.bin' (required)\n"
	"  --val-data GLOB        validation shards; evaluated every --eval-every steps and at the end\n"
	"  --shuffle 0|1          shuffle the order of batches each epoch (default 0)\n"
	"model (default --model tiny):\n"
	"  --model tiny|small|gpt2  a preset; the flags below override its fields\n"
	"  --n-layer L --n-head H --n-embd C --vocab-size V --n-positions P (maximum sequence length)\n"
	"  --init-from FILE       start from a model file (.safetensors or llm.c .bin) instead of random init\n"
	"batch:\n"
	"  --batch-size B         sequences per micro-batch (default 4)\n"
	"  --seq-len T            tokens per sequence (default: the model's maximum)\n"
	"  --grad-accum K         micro-batches per optimizer step (default 1), or\n"
	"  --total-batch-size N   tokens per optimizer step (= B x T x K)\n"
	"optimization:\n"
	"  --steps N              optimizer steps (required)\n"
	"  --lr X                 peak learning rate (default 6e-4)\n"
	"  --warmup W             linear warmup steps (default 0)\n"
	"  --schedule S           cosine|linear|constant decay after warmup (default cosine)\n"
	"  --min-lr-frac F        final learning rate as a fraction of the peak (default 0)\n"
	"  --weight-decay D       AdamW decoupled weight decay on 2-D weights (default 0.1)\n"
	"  --beta1 B1 --beta2 B2 --eps E   AdamW (defaults 0.9, 0.95, 1e-8)\n"
	"  --grad-clip G          clip the global gradient norm to G, 0 disables (default 1.0)\n"
	"  --seed S               initialization, shuffle and sampling seed (default 1337)\n"
	"checkpoints and logs:\n"
	"  --save-dir DIR         write training checkpoints DIR/step_NNNNNNNN (always at the end)\n"
	"  --save-every K         also every K steps\n"
	"  --keep-checkpoints K   keep only the newest K checkpoints (default 0: all)\n"
	"  --resume               continue from the latest complete checkpoint in --save-dir\n"
	"  --eval-every K         evaluation interval in steps (default: only at the end)\n"
	"  --eval-batches M       validation micro-batches per evaluation (default 20)\n"
	"  --sample-every K       print a short generated sample every K steps\n"
	"  --log FILE.jsonl       one JSON object per step\n"
	"performance:\n"
	"  --threads N            threads for the kernels (default: OMP_NUM_THREADS, else one per CPU)\n"
	"  --peak-flops F         FLOP/s used for MFU (default: measured as `loom bench gemm` does, once,\n"
	"                         then cached in ~/.cache/loom/gemm_peak)\n"
	"  --profile              print the time per kernel at the end\n";

typedef struct {
	loom_train_config_t tc;
	loom_gpt2_config_t mc;
	int have_model_flags, n_positions, n_head_flag;
	const char *preset, *init_from;
	long long total_batch;
	int grad_accum, resume, sample_every, threads, profile;
	char tokenizer[1100];
} opts_t;

/* Parse an integer flag that must be in [lo, hi]. */
static long long int_in(const char *flag, const char *v, long long lo, long long hi)
{
	long long x = cli_parse_int("train", flag, v);
	if (x < lo || x > hi)
		cli_die("train", "%s: %lld is out of range [%lld, %lld]", flag, x, lo, hi);
	return x;
}

static void parse(int argc, char **argv, opts_t *o)
{
	const char *v;
	memset(o, 0, sizeof *o);
	o->tc = loom_train_defaults();
	o->tc.B = 4;
	o->tc.lr.peak_lr = 6e-4;
	o->tc.lr.total_steps = -1;
	o->mc.n_layer = o->mc.n_head = o->mc.n_embd = o->mc.seq_len = o->mc.vocab_size = -1;
	o->tc.T = -1;
	o->grad_accum = -1;
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
		else if (FLAG("--model")) o->preset = v;
		else if (FLAG("--n-layer")) o->mc.n_layer = (int)int_in("--n-layer", v, 1, 1 << 12), o->have_model_flags = 1;
		else if (FLAG("--n-head"))
			o->mc.n_head = o->n_head_flag = (int)int_in("--n-head", v, 1, 1 << 12), o->have_model_flags = 1;
		else if (FLAG("--n-embd")) o->mc.n_embd = (int)int_in("--n-embd", v, 1, 1 << 16), o->have_model_flags = 1;
		else if (FLAG("--vocab-size"))
			o->mc.vocab_size = (int)int_in("--vocab-size", v, 1, 1 << 24), o->have_model_flags = 1;
		else if (FLAG("--n-positions"))
			o->n_positions = (int)int_in("--n-positions", v, 1, 1 << 20), o->have_model_flags = 1;
		else if (FLAG("--init-from")) o->init_from = v;
		else if (FLAG("--batch-size")) o->tc.B = (int)int_in("--batch-size", v, 1, 1 << 20);
		else if (FLAG("--seq-len")) o->tc.T = (int)int_in("--seq-len", v, 1, 1 << 20);
		else if (FLAG("--grad-accum")) o->grad_accum = (int)int_in("--grad-accum", v, 1, 1 << 20);
		else if (FLAG("--total-batch-size")) o->total_batch = int_in("--total-batch-size", v, 1, 1LL << 40);
		else if (FLAG("--steps")) o->tc.lr.total_steps = int_in("--steps", v, 1, 1LL << 40);
		else if (FLAG("--lr")) o->tc.lr.peak_lr = DBL("--lr");
		else if (FLAG("--warmup")) o->tc.lr.warmup = int_in("--warmup", v, 0, 1LL << 40);
		else if (FLAG("--schedule")) {
			if (loom_schedule_parse(v, &o->tc.lr.kind) != LOOM_OK)
				cli_die("train", "--schedule: %s", loom_errmsg());
		} else if (FLAG("--min-lr-frac")) o->tc.lr.min_lr_frac = DBL("--min-lr-frac");
		else if (FLAG("--weight-decay")) o->tc.adamw.weight_decay = (float)DBL("--weight-decay");
		else if (FLAG("--beta1")) o->tc.adamw.beta1 = (float)DBL("--beta1");
		else if (FLAG("--beta2")) o->tc.adamw.beta2 = (float)DBL("--beta2");
		else if (FLAG("--eps")) o->tc.adamw.eps = (float)DBL("--eps");
		else if (FLAG("--grad-clip")) o->tc.grad_clip = DBL("--grad-clip");
		else if (FLAG("--seed")) o->tc.seed = (uint64_t)int_in("--seed", v, 0, 1LL << 62);
		else if (FLAG("--save-dir")) o->tc.save_dir = v;
		else if (FLAG("--save-every")) o->tc.save_every = (int)int_in("--save-every", v, 0, 1 << 30);
		else if (FLAG("--keep-checkpoints"))
			o->tc.keep_checkpoints = (int)int_in("--keep-checkpoints", v, 0, 1 << 30);
		else if (!strcmp(a, "--resume")) o->resume = 1;
		else if (FLAG("--eval-every")) o->tc.eval_every = (int)int_in("--eval-every", v, 0, 1 << 30);
		else if (FLAG("--eval-batches")) o->tc.eval_batches = (int)int_in("--eval-batches", v, 1, 1 << 30);
		else if (FLAG("--sample-every")) o->sample_every = (int)int_in("--sample-every", v, 0, 1 << 30);
		else if (FLAG("--log")) o->tc.log_path = v;
		else if (FLAG("--threads")) o->threads = (int)int_in("--threads", v, 1, 1024);
		else if (FLAG("--peak-flops")) {
			o->tc.peak_flops = DBL("--peak-flops");
			if (!(o->tc.peak_flops > 0))
				cli_die("train", "--peak-flops: %s must be > 0 (FLOP/s, e.g. 1e11)", v);
		} else if (!strcmp(a, "--profile")) o->profile = 1;
		else
			cli_die("train", "unknown flag '%s' (see loom train --help)", a);
	}
#undef FLAG
#undef DBL
	if (!o->tc.train_data)
		cli_die("train", "--train-data GLOB is required (token shards, e.g. from `loom data prepare`)");
	if (o->tc.lr.total_steps < 0)
		cli_die("train", "--steps N is required");
	if (o->resume && !o->tc.save_dir)
		cli_die("train", "--resume needs --save-dir DIR (where the checkpoints are)");
	if (o->init_from && (o->preset || (o->have_model_flags && !(o->n_head_flag && o->mc.n_layer < 0 &&
	                                                               o->mc.n_embd < 0 && o->mc.vocab_size < 0 &&
	                                                               o->n_positions == 0))))
		cli_die("train", "--init-from takes the model from the file: drop --model and the model flags "
		        "(only --n-head, when the file does not say it)");
	if (o->tc.eval_every > 0 && !o->tc.val_data)
		cli_die("train", "--eval-every needs --val-data GLOB");
	if (o->tc.save_every > 0 && !o->tc.save_dir)
		cli_die("train", "--save-every needs --save-dir DIR");
	if (o->grad_accum > 0 && o->total_batch > 0)
		cli_die("train", "give --grad-accum or --total-batch-size, not both");
}

/* The model config from the preset/flags or the --init-from file; T defaults here too. */
static void model_config(opts_t *o)
{
	loom_gpt2_config_t c;
	if (o->init_from) {
		if (loom_model_config(o->init_from, o->n_head_flag, &c, NULL) != LOOM_OK)
			cli_die("train", "--init-from: %s", loom_errmsg());
	} else {
		if (loom_gpt2_preset(o->preset ? o->preset : "tiny", &c) != LOOM_OK)
			cli_die("train", "--model: %s", loom_errmsg());
		if (o->mc.n_layer > 0) c.n_layer = o->mc.n_layer;
		if (o->mc.n_head > 0) c.n_head = o->mc.n_head;
		if (o->mc.n_embd > 0) c.n_embd = o->mc.n_embd;
		if (o->mc.vocab_size > 0) c.vocab_size = o->mc.vocab_size;
		if (o->n_positions > 0) c.seq_len = o->n_positions;
		else if (!o->preset && o->have_model_flags && o->tc.T > 0) c.seq_len = o->tc.T;
	}
	if (loom_gpt2_config_check(&c) != LOOM_OK)
		cli_die("train", "%s", loom_errmsg());
	if (o->tc.T < 0)
		o->tc.T = c.seq_len;
	if (o->tc.T > c.seq_len)
		cli_die("train", "--seq-len %d exceeds the model's maximum sequence length %d%s", o->tc.T, c.seq_len,
		        o->init_from ? "" : " (raise it with --n-positions)");
	o->mc = c;
}

static void batch_config(opts_t *o)
{
	long long micro = (long long)o->tc.B * o->tc.T; /* x world, 1 here */
	if (o->total_batch > 0) {
		if (o->total_batch % micro != 0) {
			char valid[256];
			int n = 0;
			for (int k = 1; k <= 5; k++)
				n += snprintf(valid + n, sizeof valid - (size_t)n, "%s%lld", k > 1 ? ", " : "", micro * k);
			cli_die("train", "--total-batch-size %lld is not a multiple of B x T = %d x %d = %lld tokens per "
			        "micro-batch; valid values: %s, ...", o->total_batch, o->tc.B, o->tc.T, micro, valid);
		}
		o->tc.accum = (int)(o->total_batch / micro);
	} else {
		o->tc.accum = o->grad_accum > 0 ? o->grad_accum : 1;
	}
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

/* Hash of this machine's CPU model name, so that a cached peak is only reused on the same CPU. */
static unsigned long cpu_hash(void)
{
	FILE *f = fopen("/proc/cpuinfo", "r");
	char line[512];
	unsigned long h = 5381;
	if (!f)
		return 0;
	while (fgets(line, sizeof line, f))
		if (!strncmp(line, "model name", 10)) {
			for (const char *c = line; *c; c++)
				h = h * 33 + (unsigned char)*c;
			break;
		}
	fclose(f);
	return h;
}

/* The sgemm peak of `loom bench gemm` for `threads` threads (about 2 s to measure), cached in
 * $XDG_CACHE_HOME/loom/gemm_peak (or ~/.cache/loom/gemm_peak), one "threads cpu-hash flops" line
 * per measurement. Delete the file to measure again. */
static double peak_flops(int threads)
{
	char dir[900], path[1000];
	const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
	unsigned long h = cpu_hash(), fh;
	int t;
	double v, peak;
	FILE *f;
	if (xdg && *xdg)
		snprintf(dir, sizeof dir, "%s/loom", xdg);
	else
		snprintf(dir, sizeof dir, "%s/.cache/loom", home ? home : "/tmp");
	snprintf(path, sizeof path, "%s/gemm_peak", dir);
	if ((f = fopen(path, "r"))) {
		while (fscanf(f, "%d %lu %lf", &t, &fh, &v) == 3)
			if (t == threads && fh == h && v > 0) {
				fclose(f);
				return v;
			}
		fclose(f);
	}
	printf("measuring the sgemm peak for MFU with %d thread%s (once; cached in %s)...\n", threads,
	       threads == 1 ? "" : "s", path);
	peak = loom_gemm_peak_flops(threads);
	if (peak > 0) {
		char parent[920];
		snprintf(parent, sizeof parent, "%s", dir);
		char *slash = strrchr(parent, '/');
		if (slash)
			*slash = 0, mkdir(parent, 0755);
		mkdir(dir, 0755);
		if ((f = fopen(path, "a"))) {
			fprintf(f, "%d %lu %.6e\n", threads, h, peak);
			fclose(f);
		}
	}
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
} run_ctx_t;

static void print_token(void *ctx, int id)
{
	run_ctx_t *r = ctx;
	int len;
	const unsigned char *b = loom_tokenizer_decode(&r->tok, id, &len);
	if (b && id != r->tok.eot_token)
		fwrite(b, 1, (size_t)len, stdout);
}

static void sample(run_ctx_t *r, loom_gpt2_t *model, long long step)
{
	enum { N = 64 };
	int prompt = r->tok.eot_token, n = 0;
	if (!r->have_tok)
		return;
	printf("--- sample at step %lld ---\n", step);
	if (loom_gpt2_generate(model, &prompt, 1, N, 1.0f, 40, r->o->tc.seed + (uint64_t)step, r->tok.eot_token,
	                       r->sample_buf, &n, print_token, r) != LOOM_OK)
		printf("(sampling failed: %s)", loom_errmsg());
	printf("\n---\n");
}

static int on_step(void *ctx, loom_trainer_t *tr, const loom_step_metrics_t *m)
{
	run_ctx_t *r = ctx;
	char eta[32], mfu[16] = "-";
	int w = snprintf(NULL, 0, "%lld", m->total);
	fmt_eta(m->eta_s, eta, sizeof eta);
	if (r->o->tc.peak_flops > 0)
		snprintf(mfu, sizeof mfu, "%.1f%%", 100.0 * m->mfu);
	printf("step %*lld/%lld | loss %.6f | lr %.3e | norm %.4f | %.1f ms | %.0f tok/s | MFU %s | ETA %s", w, m->step,
	       m->total, m->loss, m->lr, m->grad_norm, m->dt_ms, m->tokens_per_s, mfu, eta);
	if (m->has_val)
		printf(" | val %.6f", m->val_loss);
	if (m->saved)
		printf(" | saved");
	putchar('\n');
	if (m->mfu > 1.0 && !r->warned_mfu) {
		r->warned_mfu = 1;
		printf("note: MFU above 100%%: the peak (%.1f GFLOP/s) is too low, probably measured while the machine "
		       "was busy; delete ~/.cache/loom/gemm_peak or give --peak-flops\n", r->o->tc.peak_flops / 1e9);
	}
	r->steps_run++;
	r->optim_ms += m->optim_ms, r->step_ms += m->dt_ms;
	if (r->o->sample_every > 0 && m->step % r->o->sample_every == 0)
		sample(r, loom_trainer_model(tr), m->step);
	return 0;
}

int loom_cli_train(int argc, char **argv)
{
	opts_t o;
	loom_gpt2_t *model = NULL;
	loom_trainer_t *tr = NULL;
	run_ctx_t r;
	int rc, status = 1;
	memset(&r, 0, sizeof r);
	parse(argc, argv, &o);
	loom_set_num_threads(o.threads > 0 ? o.threads : omp_get_max_threads()); /* default: OMP_NUM_THREADS or CPUs */
	model_config(&o);
	batch_config(&o);
	find_tokenizer(&o);
	r.o = &o;

	if ((rc = loom_gpt2_create(&model, &o.mc, o.tc.B, o.tc.T)) != LOOM_OK) {
		fprintf(stderr, "loom train: creating the model: %s\n", loom_errmsg());
		goto out;
	}
	if (o.init_from) {
		if ((rc = loom_model_load(o.init_from, &o.mc, loom_gpt2_params(model))) != LOOM_OK) {
			fprintf(stderr, "loom train: --init-from: %s\n", loom_errmsg());
			goto out;
		}
	} else {
		loom_gpt2_init(model, o.tc.seed);
	}
	if ((rc = loom_trainer_create(&tr, &o.tc, model)) != LOOM_OK) {
		fprintf(stderr, "loom train: %s\n", loom_errmsg());
		goto out;
	}
	if (o.tc.peak_flops <= 0) { /* measured once the settings are known to be good */
		o.tc.peak_flops = peak_flops(loom_num_threads());
		loom_trainer_set_peak_flops(tr, o.tc.peak_flops);
	}
	if (o.resume) {
		rc = loom_trainer_resume(tr, o.tc.save_dir);
		if (rc == LOOM_ENOENT) {
			printf("resume: no checkpoint in %s yet, starting from scratch\n", o.tc.save_dir);
		} else if (rc != LOOM_OK) {
			fprintf(stderr, "loom train: %s\n", loom_errmsg());
			goto out;
		} else {
			printf("resumed from %s at step %lld\n", o.tc.save_dir, loom_trainer_steps_done(tr));
			if (loom_trainer_steps_done(tr) >= o.tc.lr.total_steps)
				printf("nothing to do: the checkpoint is at step %lld, --steps is %lld\n",
				       loom_trainer_steps_done(tr), o.tc.lr.total_steps);
		}
	}
	printf("model: L%d H%d C%d T%d V%d, %zu parameters%s%s\n", o.mc.n_layer, o.mc.n_head, o.mc.n_embd,
	       o.mc.seq_len, o.mc.vocab_size, loom_gpt2_num_params(&o.mc), o.init_from ? ", from " : "",
	       o.init_from ? o.init_from : "");
	printf("batch: B=%d T=%d accum=%d -> %lld tokens per step; %lld steps; lr %g (%s, warmup %lld, min %g x)\n",
	       o.tc.B, o.tc.T, o.tc.accum, loom_trainer_tokens_per_step(tr), o.tc.lr.total_steps, o.tc.lr.peak_lr,
	       loom_schedule_name(o.tc.lr.kind), o.tc.lr.warmup, o.tc.lr.min_lr_frac);
	printf("threads: %d; MFU against a peak of %.1f GFLOP/s; %.4g FLOP per token\n", loom_num_threads(),
	       o.tc.peak_flops / 1e9, loom_gpt2_flops_per_token(&o.mc, o.tc.T));
	if (o.sample_every > 0) {
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
	if (o.profile)
		loom_gpt2_profile(model, 1);
	if ((rc = loom_trainer_run(tr, on_step, &r)) != LOOM_OK) {
		fprintf(stderr, "loom train: %s\n", loom_errmsg());
		goto out;
	}
	if (o.profile && r.steps_run > 0) {
		loom_gpt2_profile_report(model, stdout, r.steps_run);
		printf("optimizer (grad norm + AdamW): %.2f ms per step, %.1f%% of the step time\n",
		       r.optim_ms / r.steps_run, 100.0 * r.optim_ms / r.step_ms);
	}
	status = 0;
out:
	loom_trainer_destroy(tr);
	loom_gpt2_destroy(model);
	if (r.have_tok)
		loom_tokenizer_free(&r.tok);
	free(r.sample_buf);
	return status;
}
