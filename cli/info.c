/* info.c: `loom info FILE`: what a file holds: a model (safetensors or llm.c .bin: config, every
 * tensor, parameter count; a Hugging Face directory of the llama family, sharded or not), a token shard (token count), a tokenizer, a state file, or a training
 * checkpoint directory (its files, verified against its MANIFEST). */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "loom/ckpt.h"

static int fail(void)
{
	fprintf(stderr, "loom info: %s\n", loom_errmsg());
	return 1;
}

static void print_shape(const size_t *shape, int ndim)
{
	char buf[160];
	int n = 0;
	n += snprintf(buf + n, sizeof buf - (size_t)n, "[");
	for (int d = 0; d < ndim && n < 140; d++)
		n += snprintf(buf + n, sizeof buf - (size_t)n, d ? ", %zu" : "%zu", shape[d]);
	snprintf(buf + n, sizeof buf - (size_t)n, "]");
	printf("%-22s", buf);
}

/* The llama family's configuration in transformers' words. */
static void print_llama(const loom_model_config_t *c)
{
	printf("%s (%s): num_hidden_layers=%d num_attention_heads=%d num_key_value_heads=%d hidden_size=%d head_dim=%d "
	       "intermediate_size=%d max_position_embeddings=%d vocab_size=%d rope_theta=%g rope_scaling=%s "
	       "rms_norm_eps=%g tie_word_embeddings=%s biases: q/k/v %s, o %s, mlp %s", c->qwen2 ? "qwen2" : "llama",
	       c->qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM", c->n_layer, c->n_head, c->n_kv_head ? c->n_kv_head :
	       c->n_head, c->n_embd, c->head_dim ? c->head_dim : c->n_embd / c->n_head, c->intermediate_size, c->seq_len,
	       c->vocab_size, c->rope_theta, c->rope_scaling.type == LOOM_ROPE_LLAMA3 ? "llama3" : "none",
	       c->rms_norm_eps, c->tie_word_embeddings ? "true" : "false",
	       c->attention_bias || c->qkv_bias ? "yes" : "no", c->attention_bias ? "yes" : "no", c->mlp_bias ? "yes" : "no");
	if (c->has_token_ids)
		printf(" bos=%d eos=%d", c->bos_token_id, c->eos_token_id);
	printf(", %zu parameters\n", loom_model_num_params(c));
}

/* A Hugging Face directory of shards: the configuration, the files, then each file's tensors. */
static int info_safetensors(const char *path, int n_head);
static int info_hf_sharded(const char *path)
{
	loom_model_config_t cfg;
	loom_hf_info_t hi;
	printf("%s: a Hugging Face model directory (config.json, model.safetensors.index.json)\n", path);
	if (loom_hf_dir_config(path, &cfg, &hi) != LOOM_OK) {
		printf("not a loadable model: %s\n", loom_errmsg());
		return 1;
	}
	printf("%d shards, tensors in %s%s, config.json torch_dtype %s%s\n", hi.n_files, loom_st_dtype_name(hi.dtype),
	       hi.mixed_dtypes ? " (and others)" : "", hi.torch_dtype[0] ? hi.torch_dtype : "(none)",
	       hi.rope_parameters ? ", rope from rope_parameters (transformers 5)" : "");
	print_llama(&cfg);
	printf("(each shard: loom info %s/model-NNNNN-of-%05d.safetensors)\n", path, hi.n_files);
	return 0;
}

static int info_safetensors(const char *path, int n_head)
{
	loom_st_t *st;
	loom_model_config_t cfg;
	size_t total = 0;
	int rc;
	if ((rc = loom_st_open(&st, path)) != LOOM_OK)
		return fail();
	printf("%s: safetensors, %d tensors\n", path, loom_st_count(st));
	for (int i = 0; i < loom_st_meta_count(st); i++) {
		const char *k, *v;
		loom_st_meta_at(st, i, &k, &v);
		printf("  metadata %s = %s\n", k, v);
	}
	if (loom_model_config(path, n_head, &cfg, NULL) != LOOM_OK)
		printf("not a loadable model: %s\n", loom_errmsg());
	else if (cfg.arch == LOOM_ARCH_LLAMA)
		print_llama(&cfg);
	else if (cfg.arch == LOOM_ARCH_GPT2)
		printf("GPT-2: n_layer=%d n_head=%d n_embd=%d n_positions=%d vocab_size=%d, %zu parameters\n", cfg.n_layer,
		       cfg.n_head, cfg.n_embd, cfg.seq_len, cfg.vocab_size, loom_model_num_params(&cfg));
	else
		printf("%s: n_layer=%d n_head=%d n_kv_head=%d n_embd=%d sequence_len=%d vocab_size=%d window_pattern=%s "
		       "short_window=%d, %zu parameters\n", loom_arch_name(cfg.arch), cfg.n_layer, cfg.n_head,
		       cfg.n_kv_head ? cfg.n_kv_head : cfg.n_head, cfg.n_embd, cfg.seq_len, cfg.vocab_size,
		       cfg.window_pattern[0] ? cfg.window_pattern : "SSSL", cfg.short_window ? cfg.short_window : cfg.seq_len / 2,
		       loom_model_num_params(&cfg));
	for (int i = 0; i < loom_st_count(st); i++) {
		const loom_st_tensor_t *t = loom_st_get(st, i);
		size_t numel = t->nbytes / loom_st_dtype_size(t->dtype);
		printf("  %-40s ", t->name);
		print_shape(t->shape, t->ndim);
		printf(" %-4s %12zu\n", loom_st_dtype_name(t->dtype), numel);
		total += numel;
	}
	printf("total elements: %zu\n", total);
	loom_st_close(st);
	return 0;
}

static int info_llmc(const char *path)
{
	loom_model_config_t cfg;
	size_t C, L, V, Vp, T;
	if (loom_model_config(path, 0, &cfg, NULL) != LOOM_OK)
		return fail();
	C = (size_t)cfg.n_embd, L = (size_t)cfg.n_layer, V = (size_t)cfg.vocab_size, T = (size_t)cfg.seq_len;
	Vp = (V + 127) / 128 * 128;
	{
		FILE *f = fopen(path, "rb");
		int32_t h[8];
		if (f && fread(h, 4, 8, f) == 8)
			Vp = (size_t)h[7];
		if (f)
			fclose(f);
	}
	printf("%s: llm.c GPT-2 model\n", path);
	printf("GPT-2: n_layer=%d n_head=%d n_embd=%d n_positions=%d vocab_size=%d (padded %zu), %zu parameters\n",
	       cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.seq_len, cfg.vocab_size, Vp, loom_model_num_params(&cfg));
	{
		const struct {
			const char *name;
			size_t a, b, c;
		} t[] = {
			{"wte", Vp, C, 0},          {"wpe", T, C, 0},         {"ln1w", L, C, 0},       {"ln1b", L, C, 0},
			{"qkvw", L, 3 * C, C},      {"qkvb", L, 3 * C, 0},    {"attprojw", L, C, C},   {"attprojb", L, C, 0},
			{"ln2w", L, C, 0},          {"ln2b", L, C, 0},        {"fcw", L, 4 * C, C},    {"fcb", L, 4 * C, 0},
			{"fcprojw", L, C, 4 * C},   {"fcprojb", L, C, 0},     {"lnfw", C, 0, 0},       {"lnfb", C, 0, 0},
		};
		for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
			size_t shape[3] = {t[i].a, t[i].b, t[i].c};
			int nd = t[i].c ? 3 : t[i].b ? 2 : 1;
			size_t numel = t[i].a * (t[i].b ? t[i].b : 1) * (t[i].c ? t[i].c : 1);
			printf("  %-40s ", t[i].name);
			print_shape(shape, nd);
			printf(" F32  %12zu\n", numel);
		}
	}
	return 0;
}

static int exists(const char *dir, const char *name)
{
	char p[2048];
	struct stat sb;
	snprintf(p, sizeof p, "%s/%s", dir, name);
	return stat(p, &sb) == 0;
}

static int info_dir(const char *path);

/* A directory that is not one checkpoint: a --save-dir (checkpoints in it), a model's directory, a
 * tokenizer or data directory. */
static int info_other_dir(const char *path)
{
	char latest[1200], sp[1300];
	int64_t step;
	DIR *d;
	struct dirent *e;
	int lrc = loom_ckpt_latest(path, latest, sizeof latest, &step);
	if (lrc != LOOM_OK && lrc != LOOM_ENOENT)  /* the newest checkpoint is damaged: say which and why */
		cli_die("info", "%s", loom_errmsg());
	if (lrc == LOOM_OK) {
		int n = 0, branches = 0;
		if ((d = opendir(path))) {
			while ((e = readdir(d))) {
				n += strncmp(e->d_name, "step_", 5) == 0;
				branches += strncmp(e->d_name, "abandoned-at-step_", 18) == 0;
			}
			closedir(d);
		}
		printf("%s: checkpoint directory (--save-dir): %d checkpoint%s, the latest complete one is %s (step %lld)\n",
		       path, n, n == 1 ? "" : "s", latest, (long long)step);
		if (branches) /* what runs starting from an older step moved aside (docs/train.md, Lineage) */
			printf("%s: %d abandoned branch%s moved aside: %s/abandoned-at-step_*\n", path, branches,
			       branches == 1 ? "" : "es", path);
		putchar('\n');
		return info_dir(latest);
	}
	if (!exists(path, "model.safetensors") && exists(path, "model.safetensors.index.json"))
		return info_hf_sharded(path);
	if (exists(path, "model.safetensors")) {
		snprintf(sp, sizeof sp, "%s/model.safetensors", path);
		printf("%s: a model directory%s\n", path, exists(path, "config.json") ? " (with Hugging Face's config.json)" : "");
		return info_safetensors(sp, 0);
	}
	if (exists(path, "vocab.json") || exists(path, "encoder.json"))
		printf("%s: a BPE tokenizer directory (loom tokenizer info --tokenizer %s)%s\n", path, path,
		       exists(path, "train_000000.bin") ? "; also token shards (loom data prepare output)" : "");
	else if (exists(path, "train_000000.bin") || exists(path, "tokenizer.bin"))
		printf("%s: token shards (loom data prepare output); loom info %s/train_000000.bin for one\n", path, path);
	else
		cli_die("info", "%s: a directory without a MANIFEST (not one checkpoint), without step_* checkpoints, a "
		        "model.safetensors or a tokenizer", path);
	return 0;
}

/* The mesh a checkpoint was written with, from state.json: "mesh: dp 2 x tp 2 x pp 2 = 8 ranks, ZeRO 0,
 * pipeline schedule 1f1b". Checkpoints from before the mesh was recorded have only batch.world (the
 * data-parallel size). */
static void print_mesh(const loom_kv_t *kv)
{
	int64_t dp, tp, pp, zero, cp = 1;
	const char *sched;
	char cps[32] = "";
	if (loom_kv_get_i64(kv, "mesh.cp", &cp) != LOOM_OK || cp < 1) /* (recorded since context parallelism) */
		cp = 1;
	if (cp > 1)
		snprintf(cps, sizeof cps, " x cp %lld", (long long)cp);
	if (loom_kv_get_i64(kv, "mesh.dp", &dp) == LOOM_OK && loom_kv_get_i64(kv, "mesh.tp", &tp) == LOOM_OK &&
	    loom_kv_get_i64(kv, "mesh.pp", &pp) == LOOM_OK && loom_kv_get_i64(kv, "mesh.zero", &zero) == LOOM_OK &&
	    loom_kv_get_str(kv, "mesh.pp_schedule", &sched) == LOOM_OK)
		printf("mesh: dp %lld%s x tp %lld x pp %lld = %lld rank%s, ZeRO %lld, pipeline schedule %s\n", (long long)dp,
		       cps, (long long)tp, (long long)pp, (long long)(dp * cp * tp * pp), dp * cp * tp * pp == 1 ? "" : "s",
		       (long long)zero, sched);
	else if (loom_kv_get_i64(kv, "batch.world", &dp) == LOOM_OK)
		printf("mesh: dp %lld (tp, pp and ZeRO were not recorded by the loom that wrote it)\n", (long long)dp);
}

static int info_dir(const char *path)
{
	char sp[2048];
	loom_kv_t *kv;
	if (!exists(path, "MANIFEST"))
		return info_other_dir(path);
	if (loom_ckpt_verify(path) != LOOM_OK)
		return fail();
	printf("%s: complete training checkpoint\n", path);
	snprintf(sp, sizeof sp, "%s/MANIFEST", path);
	if (loom_kv_load(&kv, sp) == LOOM_OK) {
		for (int i = 0; i < loom_kv_count(kv); i++) {
			const char *k = loom_kv_key_at(kv, i);
			uint64_t n;
			if (strncmp(k, "size:", 5) == 0 && loom_kv_get_u64(kv, k, &n) == LOOM_OK)
				printf("  %-24s %12llu bytes\n", k + 5, (unsigned long long)n);
		}
		loom_kv_destroy(kv);
	}
	snprintf(sp, sizeof sp, "%s/state.json", path);
	if (loom_kv_load(&kv, sp) == LOOM_OK) {
		print_mesh(kv);
		printf("state.json:\n");
		for (int i = 0; i < loom_kv_count(kv); i++) {
			const char *k = loom_kv_key_at(kv, i), *s;
			if (loom_kv_get_str(kv, k, &s) != LOOM_OK) {
				int64_t x;
				double d;
				if (loom_kv_get_i64(kv, k, &x) == LOOM_OK)
					printf("  %-28s %lld\n", k, (long long)x);
				else if (loom_kv_get_f64(kv, k, &d) == LOOM_OK)
					printf("  %-28s %.9g\n", k, d);
			} else {
				printf("  %-28s %s\n", k, s);
			}
		}
		loom_kv_destroy(kv);
	}
	return 0;
}

int loom_cli_info(int argc, char **argv)
{
	const char *path = NULL, *v;
	int n_head = 0;
	int32_t magic = 0;
	struct stat sb;
	FILE *f;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
			printf("usage: loom info FILE [--n-head N]\n\nPrints what FILE holds: a model (safetensors or llm.c "
			       ".bin: config, every tensor, parameter count), a token shard, a tokenizer, or a training "
			       "checkpoint directory.\n");
			return 0;
		} else if (cli_flag(argc, argv, &i, "--n-head", &v)) {
			n_head = (int)cli_parse_int("info", "--n-head", v);
		} else if (!path) {
			path = argv[i];
		} else {
			cli_die("info", "unexpected argument '%s'", argv[i]);
		}
	}
	if (!path)
		cli_die("info", "usage: loom info FILE [--n-head N]");
	if (stat(path, &sb) != 0)
		cli_die("info", "%s: no such file or directory", path);
	if (S_ISDIR(sb.st_mode))
		return info_dir(path);
	f = fopen(path, "rb");
	if (!f)
		cli_die("info", "%s: cannot open", path);
	if (fread(&magic, 4, 1, f) != 1)
		magic = 0;
	fclose(f);
	if (magic == LOOM_SHARD_MAGIC || magic == LOOM_SHARD32_MAGIC) {
		loom_shard_t s;
		if (loom_shard_open(&s, path) != LOOM_OK)
			return fail();
		printf("%s: token shard (llm.c format, %s): %zu tokens, largest token id %u\n", path,
		       s.token_bytes == 4 ? "magic 20240801 version 7, uint32 tokens" : "magic 20240520 version 1, uint16 tokens",
		       s.n_tokens, (unsigned)loom_shard_max_token(&s));
		loom_shard_close(&s);
		return 0;
	}
	if (magic == LOOM_TOKENIZER_MAGIC) {
		loom_tokenizer_t tok;
		if (loom_tokenizer_load(&tok, path) != LOOM_OK)
			return fail();
		printf("%s: tokenizer (llm.c format): vocab %d, end-of-text %d, %s\n", path, tok.vocab_size, tok.eot_token,
		       tok.byte_level ? "byte-level (can encode)" : "BPE table (decode only)");
		loom_tokenizer_free(&tok);
		return 0;
	}
	if (magic == LOOM_LLMC_MAGIC)
		return info_llmc(path);
	if ((magic & 0xff) == '{') {
		loom_kv_t *kv;
		if (loom_kv_load(&kv, path) != LOOM_OK)
			return fail();
		printf("%s: loom state file, %d keys\n", path, loom_kv_count(kv));
		loom_kv_destroy(kv);
		return 0;
	}
	return info_safetensors(path, n_head);
}
