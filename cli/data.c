/* data.c: `loom data prepare`: text files -> token shards and tokenizer (loom/data.h), bytes or BPE. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "loom/data.h"
#include "loom/tokenizer.h"

static void usage(FILE *f)
{
	fprintf(f, "usage: loom data prepare --input FILE... --out DIR [--val-fraction 0.05] [--shard-tokens N]\n"
	           "                         [--doc-sep LINE] [--tokenizer PATH]\n\n"
	           "Tokenizes text with the byte-level tokenizer (vocab 257: bytes 0-255, end-of-text 256 before every\n"
	           "document) into DIR/train_NNNNNN.bin and DIR/val_NNNNNN.bin (llm.c token shards) and writes\n"
	           "DIR/tokenizer.bin (llm.c tokenizer, version 2).\n\n"
	           "  --input FILE...     text files, in order (several may follow one --input; --input may repeat)\n"
	           "  --out DIR           output directory (created); the new set is written beside it and replaces the\n"
	           "                      old train_/val_ shards only once complete (any failure leaves them intact);\n"
	           "                      DIR/shards.index lists the set, and `loom train` checks it is all there\n"
	           "  --val-fraction F    in [0, 1): every (1/F)-th document goes to val, evenly spread; with fewer\n"
	           "                      than 1/F documents val is the last F of the tokens instead (default 0.05)\n"
	           "  --shard-tokens N    tokens per shard file (default 100M; e.g. 100M, 1M, 4096)\n"
	           "  --doc-sep LINE      lines equal to LINE separate documents (e.g. %% for fortune files);\n"
	           "                      default: each file is one document\n"
	           "  --tokenizer PATH    a BPE tokenizer instead of bytes: a Hugging Face tokenizer.json, or a\n"
	           "                      directory (tokenizer.json, vocab.json + merges.txt, or encoder.json +\n"
	           "                      vocab.bpe, e.g. GPT-2's, or one from `loom tokenizer train`): its\n"
	           "                      post-processor's BOS (e.g. Llama 3's <|begin_of_text|>), else its\n"
	           "                      <|endoftext|> id, starts every document, and its files are copied into\n"
	           "                      DIR (so --tokenizer DIR works for `loom sample` too); a vocabulary of\n"
	           "                      more than 65536 ids (Llama 3's, Qwen2's) gives uint32 shards (llm.c's\n"
	           "                      llama-3 format, magic 20240801 version 7), else uint16 as llm.c's GPT-2\n");
}

static int access_ok(const char *dir)
{
	char path[4096];
	snprintf(path, sizeof path, "%s/tokenizer.bin", dir);
	return access(path, R_OK) == 0;
}

static int prepare(int argc, char **argv)
{
	const char **inputs = calloc((size_t)argc, sizeof *inputs);
	loom_prepare_opts_t o = {.val_fraction = 0.05};
	loom_prepare_summary_t s;
	const char *v;
	int rc;
	if (!inputs)
		cli_die("data", "out of memory");
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
			usage(stdout);
			free(inputs);
			return 0;
		} else if (cli_flag(argc, argv, &i, "--input", &v)) {
			inputs[o.n_inputs++] = v;
			while (i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0)
				inputs[o.n_inputs++] = argv[++i];
		} else if (cli_flag(argc, argv, &i, "--out", &v)) {
			o.out_dir = v;
		} else if (cli_flag(argc, argv, &i, "--val-fraction", &v)) {
			o.val_fraction = cli_parse_double("data", "--val-fraction", v);
		} else if (cli_flag(argc, argv, &i, "--shard-tokens", &v)) {
			char *end;
			double x = strtod(v, &end);
			if (end != v && (*end == 'M' || *end == 'K' || *end == 'k') && end[1] == 0)
				x *= *end == 'M' ? 1e6 : 1e3;
			else if (end == v || *end)
				cli_die("data", "--shard-tokens: '%s' is not a count (e.g. 100M, 1M, 4096)", v);
			if (x < 1 || x > 2147483647.0)
				cli_die("data", "--shard-tokens: %s is outside [1, 2^31)", v);
			o.shard_tokens = (size_t)x;
		} else if (cli_flag(argc, argv, &i, "--doc-sep", &v)) {
			o.doc_sep = v;
		} else if (cli_flag(argc, argv, &i, "--tokenizer", &v)) {
			o.tokenizer = v;
		} else {
			usage(stderr);
			cli_die("data", "prepare: unknown argument '%s'", argv[i]);
		}
	}
	if (o.n_inputs == 0 || !o.out_dir) {
		usage(stderr);
		cli_die("data", "prepare needs --input FILE... and --out DIR");
	}
	o.inputs = inputs;
	rc = loom_data_prepare(&o, &s);
	free(inputs);
	if (rc != LOOM_OK) {
		fprintf(stderr, "loom data prepare: %s\n", loom_errmsg());
		return 1;
	}
	if (s.removed_shards)
		printf("replaced %d old shard(s) in %s\n", s.removed_shards, o.out_dir);
	printf("%llu documents from %d file(s)%s\n", (unsigned long long)s.documents, o.n_inputs,
	       s.val_tail_split ? " (too few documents for a whole-document val split: val is the tail of the text)" : "");
	printf("train: %llu documents, %llu tokens, %d shard%s -> %s/train_*.bin\n",
	       (unsigned long long)s.train_documents, (unsigned long long)s.train_tokens, s.train_shards,
	       s.train_shards == 1 ? "" : "s", o.out_dir);
	if (s.val_shards && s.val_tail_split)
		printf("val: the tail of the text, %llu tokens (starting with end-of-text), %d shard%s -> %s/val_*.bin\n",
		       (unsigned long long)s.val_tokens, s.val_shards, s.val_shards == 1 ? "" : "s", o.out_dir);
	else if (s.val_shards)
		printf("val: %llu documents, %llu tokens, %d shard%s -> %s/val_*.bin\n", (unsigned long long)s.val_documents,
		       (unsigned long long)s.val_tokens, s.val_shards, s.val_shards == 1 ? "" : "s", o.out_dir);
	if (o.tokenizer) {
		loom_bpe_t *t;
		if (loom_bpe_load(&t, o.out_dir) != LOOM_OK) {
			fprintf(stderr, "loom data prepare: %s\n", loom_errmsg());
			return 1;
		}
		char json[1100];
		snprintf(json, sizeof json, "%s/tokenizer.json", o.out_dir);
		printf("tokenizer: BPE from %s, vocab %d (%s %d) -> %s/%s%s\n", o.tokenizer, loom_bpe_vocab_size(t),
		       loom_bpe_doc_start(t) == loom_bpe_eot(t) ? "end-of-text" : "documents start with", loom_bpe_doc_start(t),
		       o.out_dir,
		       access(json, R_OK) == 0 ? "tokenizer.json" : "vocab.json, merges.txt",
		       access_ok(o.out_dir) ? ", tokenizer.bin" : "");
		loom_bpe_destroy(t);
	} else
		printf("tokenizer: byte-level, vocab %d (end-of-text %d) -> %s/tokenizer.bin\n", LOOM_BYTE_VOCAB, LOOM_BYTE_EOT,
		       o.out_dir);
	if (s.token_bytes == 4)
		printf("shards: uint32 tokens (llm.c's llama-3 format, magic %d version %d: the vocabulary exceeds %d ids)\n",
		       LOOM_SHARD32_MAGIC, LOOM_SHARD32_VERSION, LOOM_SHARD16_MAX_VOCAB);
	else
		printf("shards: uint16 tokens (llm.c's format, magic %d version %d)\n", LOOM_SHARD_MAGIC, LOOM_SHARD_VERSION);
	return 0;
}

int loom_cli_data(int argc, char **argv)
{
	if (argc >= 2 && strcmp(argv[1], "prepare") == 0)
		return prepare(argc - 1, argv + 1);
	if (argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
		usage(stdout);
		return 0;
	}
	usage(stderr);
	return 2;
}
