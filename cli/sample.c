/* sample.c: `loom sample`: generate text from a model file with the KV cache (loom_model_generate),
 * streaming each token as it is produced.
 *
 * The prompt is encoded after an end-of-text token (every training document starts with one, so
 * this is the distribution the model learned). With the byte-level tokenizer or a BPE tokenizer
 * directory (vocab.json + merges.txt, loom/tokenizer.h) the encoding is exact; with only an llm.c
 * table (gpt2_tokenizer.bin) there are no merge rules, so the prompt is split by greedy longest
 * match over the vocabulary: valid tokens, but not always GPT-2's split. */
#include <dirent.h>
#include <libgen.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "loom/ckpt.h"
#include "loom/data.h"
#include "loom/gpt2.h"
#include "loom/tokenizer.h"
#include "loom/util.h"

static const char *const usage_text =
	"usage: loom sample --model FILE [--prompt TEXT] [flags]\n"
	"  --model FILE         .safetensors or llm.c .bin model, a training checkpoint directory, or a\n"
	"                       --save-dir (its latest checkpoint)\n"
	"  --prompt TEXT        text to continue (default: none, start of a document)\n"
	"  --max-tokens N       tokens to generate (default 256; fewer when the context fills up)\n"
	"  --temperature X      0 = greedy (default 1.0)\n"
	"  --top-k K            sample from the K most likely tokens, 0 = all (default 40)\n"
	"  --seed S             sampling seed (default 1337)\n"
	"  --tokenizer PATH     a BPE tokenizer: a tokenizer.json or a directory (tokenizer.json, vocab.json +\n"
	"                       merges.txt, e.g. the --out DIR of `loom data prepare --tokenizer`), or an llm.c\n"
	"                       tokenizer file (default: either\n"
	"                       beside the model or one directory up; the byte-level tokenizer for a\n"
	"                       257-token vocabulary)\n"
	"  --n-head H           when the model file does not say it\n"
	"  --threads N          threads for the kernels\n";

static int exists(const char *p)
{
	struct stat sb;
	return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* A BPE tokenizer for loom_bpe_load: a tokenizer.json file, or a directory holding one of its files. */
static int is_bpe_dir(const char *dir)
{
	char buf[1200];
	struct stat sb;
	size_t n = strlen(dir);
	if (n > 5 && strcmp(dir + n - 5, ".json") == 0 && exists(dir))
		return 1;
	snprintf(buf, sizeof buf, "%s/tokenizer.json", dir);
	if (stat(buf, &sb) == 0)
		return 1;
	snprintf(buf, sizeof buf, "%s/vocab.json", dir);
	if (stat(buf, &sb) == 0)
		return 1;
	snprintf(buf, sizeof buf, "%s/encoder.json", dir);
	return stat(buf, &sb) == 0;
}

/* Load the BPE tokenizer in dir into *bpe, and its token table into *tok (for decoding). */
static void load_bpe(const char *dir, loom_bpe_t **bpe, loom_tokenizer_t *tok)
{
	if (loom_bpe_load(bpe, dir) != LOOM_OK)
		cli_die("sample", "%s", loom_errmsg());
	memset(tok, 0, sizeof *tok);
	tok->vocab_size = loom_bpe_vocab_size(*bpe);
	tok->eot_token = loom_bpe_doc_start(*bpe); /* the document start: "<|endoftext|>", or a BOS */
	tok->bytes = calloc((size_t)tok->vocab_size, sizeof *tok->bytes);
	tok->lengths = calloc((size_t)tok->vocab_size, sizeof *tok->lengths);
	if (!tok->bytes || !tok->lengths)
		cli_die("sample", "out of memory");
	for (int i = 0; i < tok->vocab_size; i++) {
		size_t len;
		const unsigned char *b = loom_bpe_token(*bpe, i, &len);
		if (!(tok->bytes[i] = calloc(len + 1, 1)))
			cli_die("sample", "out of memory");
		if (b)
			memcpy(tok->bytes[i], b, len);
		tok->lengths[i] = (int)len;
	}
	if (tok->eot_token < 0)
		cli_die("sample", "tokenizer %s has no <|endoftext|> token nor a post-processor BOS to start the prompt with",
		        dir);
}

static void load_tokenizer(const char *flag, const char *model, int vocab, loom_tokenizer_t *tok, loom_bpe_t **bpe)
{
	char buf[1200], *d1 = strdup(model), *d2 = NULL;
	const char *dirs[2];
	*bpe = NULL;
	if (flag) {
		if (is_bpe_dir(flag))
			load_bpe(flag, bpe, tok);
		else if (loom_tokenizer_load(tok, flag) != LOOM_OK)
			cli_die("sample", "--tokenizer: %s", loom_errmsg());
		free(d1);
		goto check;
	}
	if (!d1)
		cli_die("sample", "out of memory");
	dirs[0] = dirname(d1);
	d2 = strdup(dirs[0]);
	dirs[1] = d2 ? dirname(d2) : dirs[0];
	for (int i = 0; i < 2; i++) {
		if (is_bpe_dir(dirs[i])) {
			load_bpe(dirs[i], bpe, tok);
			free(d1), free(d2);
			goto check;
		}
		snprintf(buf, sizeof buf, "%s/tokenizer.bin", dirs[i]);
		if (exists(buf)) {
			if (loom_tokenizer_load(tok, buf) != LOOM_OK)
				cli_die("sample", "%s", loom_errmsg());
			free(d1), free(d2);
			goto check;
		}
	}
	free(d1), free(d2);
	if (vocab != LOOM_BYTE_VOCAB)
		cli_die("sample", "no tokenizer.bin beside %s; give --tokenizer FILE (e.g. llm.c's gpt2_tokenizer.bin)",
		        model);
	if (loom_tokenizer_init_bytes(tok) != LOOM_OK)
		cli_die("sample", "%s", loom_errmsg());
check:
	if (tok->vocab_size > vocab)
		cli_die("sample", "the tokenizer has %d tokens, the model only %d", tok->vocab_size, vocab);
}

/* Greedy longest-match encoding over the tokenizer's vocabulary (see the file comment). Returns
 * the number of tokens, or -1 when some byte has no token. */
static int encode(const loom_tokenizer_t *tok, loom_bpe_t *bpe, const char *text, int *out, int cap)
{
	size_t len = strlen(text), pos = 0;
	int n = 0;
	if (bpe) { /* exact BPE; the prompt is plain text ("<|endoftext|>" in it is not special) */
		int *ids = NULL;
		size_t k = 0;
		if (loom_bpe_encode(bpe, text, len, 0, &ids, &k) != LOOM_OK || k > (size_t)cap) {
			free(ids);
			return -1;
		}
		if (k > 0) /* an empty prompt has no ids (ids may be NULL) */
			memcpy(out, ids, k * sizeof *ids);
		free(ids);
		return (int)k;
	}
	if (tok->byte_level) {
		size_t k;
		if (loom_tokenizer_encode(tok, text, len, out, (size_t)cap, &k) != LOOM_OK)
			return -1;
		return (int)k;
	}
	while (pos < len && n < cap) {
		int best = -1, best_len = 0;
		for (int id = 0; id < tok->vocab_size; id++) {
			int l;
			const unsigned char *b = loom_tokenizer_decode(tok, id, &l);
			if (id != tok->eot_token && b && l > best_len && (size_t)l <= len - pos &&
			    !memcmp(b, text + pos, (size_t)l))
				best = id, best_len = l;
		}
		if (best < 0)
			return -1;
		out[n++] = best;
		pos += (size_t)best_len;
	}
	return pos == len ? n : -1;
}

typedef struct {
	const loom_tokenizer_t *tok;
	int bad_id; /* the first sampled id the tokenizer cannot decode, or -1 */
} printer_t;

/* Print a sampled token. An id the tokenizer does not have (a model with a larger vocabulary) is
 * never dropped silently: the first one is remembered and reported as an error after generation. */
static void on_token(void *ctx, int id)
{
	printer_t *p = ctx;
	int len;
	const unsigned char *b = loom_tokenizer_decode(p->tok, id, &len);
	if (id == p->tok->eot_token || p->bad_id >= 0)
		return;
	if (!b) {
		p->bad_id = id;
		return;
	}
	fwrite(b, 1, (size_t)len, stdout);
	fflush(stdout);
}

int loom_cli_sample(int argc, char **argv)
{
	const char *model_arg = NULL, *prompt = "", *tok_flag = NULL, *v;
	int max_tokens = 256, top_k = 40, n_head = 0, threads = 0, status = 1;
	double temperature = 1.0;
	uint64_t seed = 1337;
	char path[1200];
	loom_model_config_t cfg;
	loom_model_t *m = NULL;
	float *params = NULL; /* the model's parameters (it points at them) */
	loom_tokenizer_t tok;
	loom_bpe_t *bpe = NULL;
	int *ids = NULL, *out = NULL, n_prompt, n_out = 0;
#define FLAG(name) cli_flag(argc, argv, &i, name, &v)
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			fputs(usage_text, stdout);
			return 0;
		} else if (FLAG("--model")) model_arg = v;
		else if (FLAG("--prompt")) prompt = v;
		else if (FLAG("--max-tokens")) max_tokens = (int)cli_parse_int("sample", "--max-tokens", v);
		else if (FLAG("--temperature")) temperature = cli_parse_double("sample", "--temperature", v);
		else if (FLAG("--top-k")) top_k = (int)cli_parse_int("sample", "--top-k", v);
		else if (FLAG("--seed")) seed = (uint64_t)cli_parse_int("sample", "--seed", v);
		else if (FLAG("--tokenizer")) tok_flag = v;
		else if (FLAG("--n-head")) n_head = (int)cli_parse_int("sample", "--n-head", v);
		else if (FLAG("--threads")) threads = (int)cli_parse_int("sample", "--threads", v);
		else
			cli_die("sample", "unknown flag '%s' (see loom sample --help)", argv[i]);
	}
#undef FLAG
	if (!model_arg)
		cli_die("sample", "--model FILE is required");
	if (max_tokens < 1)
		cli_die("sample", "--max-tokens %d must be >= 1", max_tokens);
	if (!(temperature >= 0.0))
		cli_die("sample", "--temperature %g must be >= 0", temperature);
	if (top_k < 0)
		cli_die("sample", "--top-k %d must be >= 0", top_k);
	loom_set_num_threads(threads > 0 ? threads : omp_get_max_threads());
	if (loom_model_path(model_arg, path, sizeof path) != LOOM_OK) /* a file, a checkpoint, a --save-dir */
		cli_die("sample", "--model: %s", loom_errmsg());
	if (loom_model_config(path, n_head, &cfg, NULL) != LOOM_OK)
		cli_die("sample", "%s", loom_errmsg());
	load_tokenizer(tok_flag, path, cfg.vocab_size, &tok, &bpe);

	size_t plen = strlen(prompt);
	ids = malloc((plen + 1) * sizeof *ids);
	out = malloc((size_t)max_tokens * sizeof *out);
	if (!ids || !out) {
		fprintf(stderr, "loom sample: out of memory\n");
		goto done;
	}
	ids[0] = tok.eot_token;
	n_prompt = encode(&tok, bpe, prompt, ids + 1, (int)plen);
	if (n_prompt < 0) {
		fprintf(stderr, "loom sample: the prompt cannot be encoded with this tokenizer\n");
		goto done;
	}
	n_prompt += 1;
	if (n_prompt >= cfg.seq_len) {
		fprintf(stderr, "loom sample: the prompt is %d tokens, the model's context is %d\n", n_prompt, cfg.seq_len);
		goto done;
	}
	/* sampling needs no gradients, and the parameters need no zeroing: the load writes every one (its
	 * writes fault the pages in, on its threads); a 1B model takes 5 GB instead of 10 */
	if (loom_model_create(&m, &cfg, &(loom_model_opts_t){.B = 1, .T = cfg.seq_len, .no_own_params = 1,
	                                                      .no_own_grads = 1}) != LOOM_OK) {
		fprintf(stderr, "loom sample: %s\n", loom_errmsg());
		goto done;
	}
	if (!(params = loom_alloc_uninit(loom_model_num_params(&cfg) * sizeof *params))) {
		fprintf(stderr, "loom sample: %s: out of memory for %zu parameters\n", path, loom_model_num_params(&cfg));
		goto done;
	}
	if (loom_model_set_param_buffer(m, params) != LOOM_OK || loom_model_load(path, &cfg, params) != LOOM_OK) {
		fprintf(stderr, "loom sample: %s\n", loom_errmsg());
		goto done;
	}
	fputs(prompt, stdout);
	fflush(stdout);
	printer_t pr = {&tok, -1};
	if (loom_model_generate(m, ids, n_prompt, max_tokens, (float)temperature, top_k, seed, tok.eot_token, out, &n_out,
	                       on_token, &pr) != LOOM_OK) {
		fprintf(stderr, "\nloom sample: %s\n", loom_errmsg());
		goto done;
	}
	putchar('\n');
	if (pr.bad_id >= 0) {
		fprintf(stderr, "loom sample: the model sampled token id %d, outside the tokenizer's vocabulary of %d (the "
		        "model's is %d): wrong --tokenizer for this model?\n", pr.bad_id, tok.vocab_size, cfg.vocab_size);
		goto done;
	}
	status = 0;
done:
	loom_model_destroy(m);
	free(params);
	loom_tokenizer_free(&tok);
	loom_bpe_destroy(bpe);
	free(ids), free(out);
	return status;
}
