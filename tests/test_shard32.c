/* test_shard32.c: uint32 token shards (llm.c's llama-3 format, magic 20240801 version 7) beside the uint16
 * ones: written by `loom data prepare` for a vocabulary above 65536 ids and only then, read by the shard
 * reader, the loader, `loom info` and a training run; and every refusal (a magic with the other format's
 * version, a truncated file, an id past the vocabulary, a glob of both widths). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "data/bpe_internal.h"
#include "loom/data.h"
#include "loom/tokenizer.h"
#include "test.h"

/* A byte-level tokenizer.json: the 256 byte tokens (ids 0-255), "ab" (id ab), "abc" (id abc) and
 * "<|endoftext|>" (id eot, also an added token), merges "a b", "ab c". Its vocabulary has eot + 1 ids
 * (the ids between are unused): above 65536 for the wide one below, exactly 65536 for the narrow one. */
static int write_tokjson(const char *path, int ab, int abc, int eot)
{
	char *buf;
	size_t len;
	FILE *f = open_memstream(&buf, &len);
	int rc;
	if (!f)
		return 1;
	fprintf(f, "{\"model\": {\"type\": \"BPE\", \"vocab\": {");
	for (int b = 0; b < 256; b++) {
		unsigned char c = (unsigned char)b;
		fputc('"', f);
		if (b == '"' || b == '\\')
			fputc('\\', f);
		loom__bpe_write_mapped(f, &c, 1);
		fprintf(f, "\": %d, ", b);
	}
	fprintf(f, "\"ab\": %d, \"abc\": %d, \"<|endoftext|>\": %d}, \"merges\": [\"a b\", \"ab c\"]}, \"normalizer\": "
	           "null, \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": true}, "
	           "\"decoder\": {\"type\": \"ByteLevel\"}, \"added_tokens\": [{\"id\": %d, \"content\": \"<|endoftext|>\", "
	           "\"special\": true, \"normalized\": false}]}", ab, abc, eot, eot);
	fclose(f);
	rc = test_write_file(path, buf, len);
	free(buf);
	return rc;
}

#define WIDE_AB 65536   /* the first id a uint16 cannot hold */
#define WIDE_ABC 65700
#define WIDE_EOT 65790  /* vocabulary of 65791 ids */
#define NARROW_EOT 65535 /* vocabulary of exactly 65536 ids: still uint16 */

static const char corpus[] = "abc ab abcab xyz\n%\nab ab ab\n%\nthe abc of it\n%\nc b a abc\n";
static const char *const docs[] = {"abc ab abcab xyz\n", "ab ab ab\n", "the abc of it\n", "c b a abc\n"};

/* The stream prepare must write for docs with tokenizer t (no validation split): per document its
 * start (the end-of-text id) and its ids. *out is malloc'ed. */
static int expected_stream(loom_bpe_t *t, uint32_t **out, size_t *n)
{
	uint32_t *s = NULL;
	size_t len = 0;
	for (size_t d = 0; d < sizeof docs / sizeof docs[0]; d++) {
		int *ids;
		size_t m;
		CHECK_OK(loom_bpe_encode(t, docs[d], strlen(docs[d]), 0, &ids, &m));
		s = realloc(s, (len + 1 + m) * sizeof *s);
		CHECK(s != NULL);
		s[len++] = (uint32_t)loom_bpe_doc_start(t);
		for (size_t i = 0; i < m; i++)
			s[len++] = (uint32_t)ids[i];
		free(ids);
	}
	*out = s, *n = len;
	return 0;
}

/* The exact bytes of a shard holding tok[0..n) in width w (2 or 4): llm.c's header, then little-endian
 * tokens, built here byte by byte rather than by the writer under test. */
static unsigned char *shard_bytes(const uint32_t *tok, size_t n, int w, size_t *size)
{
	unsigned char *b = calloc(1, 1024 + (size_t)w * n);
	int32_t magic = w == 2 ? 20240520 : 20240801, version = w == 2 ? 1 : 7, count = (int32_t)n;
	if (!b)
		return NULL;
	for (int k = 0; k < 4; k++) {
		b[k] = (unsigned char)((uint32_t)magic >> (8 * k));
		b[4 + k] = (unsigned char)((uint32_t)version >> (8 * k));
		b[8 + k] = (unsigned char)((uint32_t)count >> (8 * k));
	}
	for (size_t i = 0; i < n; i++)
		for (int k = 0; k < w; k++)
			b[1024 + (size_t)w * i + (size_t)k] = (unsigned char)(tok[i] >> (8 * k));
	*size = 1024 + (size_t)w * n;
	return b;
}

static int file_equals(const char *path, const unsigned char *want, size_t size)
{
	char *got = NULL;
	size_t len = 0;
	FILE *f = fopen(path, "rb");
	int same;
	CHECK(f != NULL);
	got = malloc(size + 1);
	CHECK(got != NULL);
	len = fread(got, 1, size + 1, f);
	fclose(f);
	same = len == size && memcmp(got, want, size) == 0;
	free(got);
	CHECK_MSG(same, "%s: %zu bytes, not the %zu expected (or other bytes)", path, len, size);
	return 0;
}

static int prepare(const char *dir, const char *tok, const char *out, loom_prepare_summary_t *sum)
{
	char in[600];
	const char *inputs[1] = {in};
	loom_prepare_opts_t o = {.inputs = inputs, .n_inputs = 1, .out_dir = out, .val_fraction = 0, .doc_sep = "%",
	                         .tokenizer = tok};
	snprintf(in, sizeof in, "%s/corpus.txt", dir);
	CHECK(test_write_file(in, corpus, strlen(corpus)) == 0);
	CHECK_OK(loom_data_prepare(&o, sum));
	return 0;
}

/* uint32 shards: the writer's bytes are llm.c's llama-3 layout, ids up to 2^31-1 read back exactly. */
TEST(shard32_round_trip)
{
	char dir[256], path[512];
	const uint32_t toks[] = {0, 1, 65535, 65536, 65537, 128000, 151645, 1u << 24, 2147483647u, 7};
	const size_t n = sizeof toks / sizeof toks[0];
	unsigned char *want;
	size_t size;
	loom_shard_t s;
	CHECK(test_mkdtemp(dir, sizeof dir) == 0);
	snprintf(path, sizeof path, "%s/a.bin", dir);
	CHECK_OK(loom_shard_write32(path, toks, n));
	CHECK((want = shard_bytes(toks, n, 4, &size)) != NULL);
	CHECK(file_equals(path, want, size) == 0);
	free(want);
	CHECK_OK(loom_shard_open(&s, path));
	CHECK_EQ(s.token_bytes, 4);
	CHECK_EQ(s.n_tokens, n);
	for (size_t i = 0; i < n; i++)
		CHECK_EQ(loom_shard_token(&s, i), toks[i]);
	CHECK_EQ(loom_shard_max_token(&s), 2147483647u);
	loom_shard_close(&s);
	/* the uint16 writer is unchanged: llm.c's gpt-2 layout */
	{
		uint16_t t16[] = {0, 1, 65535, 50256, 7};
		uint32_t w[5];
		for (int i = 0; i < 5; i++)
			w[i] = t16[i];
		CHECK_OK(loom_shard_write(path, t16, 5));
		CHECK((want = shard_bytes(w, 5, 2, &size)) != NULL);
		CHECK(file_equals(path, want, size) == 0);
		free(want);
		CHECK_OK(loom_shard_open(&s, path));
		CHECK_EQ(s.token_bytes, 2);
		CHECK_EQ(loom_shard_token(&s, 2), 65535);
		CHECK_EQ(loom_shard_max_token(&s), 65535);
		loom_shard_close(&s);
	}
	test_rmdir(dir);
	return 0;
}

/* prepare with a tokenizer of 65791 ids writes uint32 shards holding exactly EOT + each document's ids
 * (ids above 65535 among them), and the loader's windows are exactly that stream; with 65536 ids (and
 * with the byte tokenizer) it writes uint16 shards, byte for byte llm.c's gpt-2 layout as before. */
TEST(shard32_prepare_and_load)
{
	char dir[256], tok[512], out[512], path[700];
	loom_prepare_summary_t sum;
	loom_bpe_t *t;
	uint32_t *want;
	size_t n;
	CHECK(test_mkdtemp(dir, sizeof dir) == 0);
	snprintf(tok, sizeof tok, "%s/wide.json", dir);
	CHECK(write_tokjson(tok, WIDE_AB, WIDE_ABC, WIDE_EOT) == 0);
	snprintf(out, sizeof out, "%s/wide", dir);
	CHECK(prepare(dir, tok, out, &sum) == 0);
	CHECK_EQ(sum.token_bytes, 4);
	CHECK_EQ(sum.train_shards, 1);
	CHECK_OK(loom_bpe_load(&t, tok));
	CHECK_EQ(loom_bpe_vocab_size(t), WIDE_EOT + 1);
	CHECK(expected_stream(t, &want, &n) == 0);
	loom_bpe_destroy(t);
	{ /* the ids above 65535 are there: every document starts with 65790; "abc" is 65700, "ab" 65536 */
		int seen_ab = 0, seen_abc = 0;
		for (size_t i = 0; i < n; i++)
			seen_ab += want[i] == WIDE_AB, seen_abc += want[i] == WIDE_ABC;
		CHECK_EQ(want[0], WIDE_EOT);
		CHECK_EQ(want[1], WIDE_ABC);
		CHECK(seen_ab >= 4 && seen_abc >= 4);
	}
	CHECK_EQ(sum.train_tokens, n);
	snprintf(path, sizeof path, "%s/train_000000.bin", out);
	{
		size_t size;
		unsigned char *bytes = shard_bytes(want, n, 4, &size);
		CHECK(bytes != NULL);
		CHECK(file_equals(path, bytes, size) == 0);
		free(bytes);
	}
	{ /* the loader: every window bit-exact against the ids, in order and shuffled */
		loom_loader_t *ld;
		loom_loader_opts_t o = {.B = 2, .T = 3, .vocab_size = 70000};
		int in[6], tg[6];
		snprintf(path, sizeof path, "%s/train_*.bin", out);
		for (int shuffle = 0; shuffle < 2; shuffle++) {
			o.shuffle = shuffle, o.seed = 5;
			CHECK_OK(loom_loader_create(&ld, path, &o));
			CHECK_EQ(loom_loader_token_bytes(ld), 4);
			CHECK_EQ(loom_loader_num_tokens(ld), n);
			CHECK_EQ(loom_loader_max_token(ld), WIDE_EOT);
			CHECK_EQ(loom_loader_windows_per_epoch(ld), (n - 1) / 6);
			for (uint64_t k = 0; k < 2 * loom_loader_windows_per_epoch(ld); k++) {
				uint64_t s = loom_loader_window_start(ld, k) * 6;
				CHECK_OK(loom_loader_next(ld, in, tg));
				for (int i = 0; i < 6; i++) {
					CHECK_EQ(in[i], want[s + (uint64_t)i]);
					CHECK_EQ(tg[i], want[s + (uint64_t)i + 1]);
				}
			}
			loom_loader_destroy(ld);
		}
	}
	free(want);
	/* 65536 ids: uint16, the bytes llm.c's layout gives the same stream */
	snprintf(tok, sizeof tok, "%s/narrow.json", dir);
	CHECK(write_tokjson(tok, 65000, 65001, NARROW_EOT) == 0);
	snprintf(out, sizeof out, "%s/narrow", dir);
	CHECK(prepare(dir, tok, out, &sum) == 0);
	CHECK_EQ(sum.token_bytes, 2);
	CHECK_OK(loom_bpe_load(&t, tok));
	CHECK_EQ(loom_bpe_vocab_size(t), 65536);
	CHECK(expected_stream(t, &want, &n) == 0);
	loom_bpe_destroy(t);
	CHECK_EQ(want[0], NARROW_EOT);
	snprintf(path, sizeof path, "%s/train_000000.bin", out);
	{
		size_t size;
		unsigned char *bytes = shard_bytes(want, n, 2, &size);
		CHECK(bytes != NULL);
		CHECK(file_equals(path, bytes, size) == 0);
		free(bytes);
	}
	free(want);
	/* the byte tokenizer: uint16, EOT 256 then the bytes of each document */
	snprintf(out, sizeof out, "%s/bytes", dir);
	CHECK(prepare(dir, NULL, out, &sum) == 0);
	CHECK_EQ(sum.token_bytes, 2);
	{
		uint32_t s[128];
		size_t m = 0, size;
		unsigned char *bytes;
		for (size_t d = 0; d < sizeof docs / sizeof docs[0]; d++) {
			s[m++] = 256;
			for (const char *p = docs[d]; *p; p++)
				s[m++] = (unsigned char)*p;
		}
		CHECK(m <= sizeof s / sizeof s[0]);
		snprintf(path, sizeof path, "%s/train_000000.bin", out);
		CHECK((bytes = shard_bytes(s, m, 2, &size)) != NULL);
		CHECK(file_equals(path, bytes, size) == 0);
		free(bytes);
	}
	test_rmdir(dir);
	return 0;
}

/* Each way a shard or a set of shards is wrong, with its message. */
TEST(shard32_refusals)
{
	char dir[256], path[512], glob[512];
	int32_t h[256] = {0};
	unsigned char buf[1024 + 40];
	loom_shard_t s;
	loom_loader_t *ld = NULL;
	loom_loader_opts_t o = {.B = 1, .T = 2};
	int in[2], tg[2];
	CHECK(test_mkdtemp(dir, sizeof dir) == 0);
	snprintf(path, sizeof path, "%s/bad.bin", dir);
	/* a magic with the other format's version, both ways */
	h[0] = 20240520, h[1] = 7, h[2] = 10;
	memset(buf, 0, sizeof buf);
	memcpy(buf, h, 1024);
	CHECK(test_write_file(path, buf, 1024 + 20) == 0);
	CHECK_ERR(loom_shard_open(&s, path), LOOM_EFORMAT);
	CHECK_CONTAINS(loom_errmsg(), path);
	CHECK_CONTAINS(loom_errmsg(), "version 7 (expected 1 with magic 20240520, uint16 tokens; uint32 shards have "
	                              "magic 20240801, version 7)");
	h[0] = 20240801, h[1] = 1;
	memcpy(buf, h, 1024);
	CHECK(test_write_file(path, buf, 1024 + 40) == 0);
	CHECK_ERR(loom_shard_open(&s, path), LOOM_EFORMAT);
	CHECK_CONTAINS(loom_errmsg(), "version 1 (expected 7 with magic 20240801, uint32 tokens; uint16 shards have "
	                              "magic 20240520, version 1)");
	h[0] = 20240802, h[1] = 7;
	memcpy(buf, h, 1024);
	CHECK(test_write_file(path, buf, 1024 + 40) == 0);
	CHECK_ERR(loom_shard_open(&s, path), LOOM_EFORMAT);
	CHECK_CONTAINS(loom_errmsg(), "bad magic 20240802 (expected 20240520, uint16 tokens, or 20240801, uint32 tokens");
	/* truncated: 10 uint32 tokens need 1064 bytes; one byte short, and the size 10 uint16 tokens would have */
	h[0] = 20240801, h[1] = 7;
	memcpy(buf, h, 1024);
	CHECK(test_write_file(path, buf, 1024 + 39) == 0);
	CHECK_ERR(loom_shard_open(&s, path), LOOM_EFORMAT);
	CHECK_CONTAINS(loom_errmsg(), "header says 10 uint32 tokens, so 1064 bytes expected, but the file has 1063 bytes");
	CHECK(test_write_file(path, buf, 1024 + 20) == 0);
	CHECK_ERR(loom_shard_open(&s, path), LOOM_EFORMAT);
	CHECK_CONTAINS(loom_errmsg(), "so 1064 bytes expected, but the file has 1044 bytes");
	CHECK(s.tokens == NULL && s.path == NULL);
	/* an id at the vocabulary in a uint32 shard: the window that reads it names the file and offset */
	{
		uint32_t t[12];
		for (int i = 0; i < 12; i++)
			t[i] = 65536 + (uint32_t)i;
		t[9] = 70000;
		CHECK_OK(loom_shard_write32(path, t, 12));
	}
	o.vocab_size = 70000;
	CHECK_OK(loom_loader_create(&ld, path, &o)); /* windows of 3 tokens start at 0, 2, 4, ... */
	for (uint64_t k = 0; k < 4; k++) {
		CHECK_OK(loom_loader_window(ld, k, in, tg));
		CHECK_EQ(in[0], 65536 + 2 * (int)k);
	}
	CHECK_ERR(loom_loader_window(ld, 4, in, tg), LOOM_EINVAL); /* tokens 8, 9, 10 */
	CHECK_CONTAINS(loom_errmsg(), path);
	CHECK_CONTAINS(loom_errmsg(), "token id 70000 at token 9 (byte 1060; window 4) is outside the model's "
	                              "vocabulary of 70000");
	loom_loader_destroy(ld);
	/* without a vocabulary only ids no int holds are refused */
	{
		uint32_t t[5] = {1, 2, 3, 4, 2147483648u};
		CHECK_OK(loom_shard_write32(path, t, 5));
	}
	o.vocab_size = 0;
	CHECK_OK(loom_loader_create(&ld, path, &o));
	CHECK_OK(loom_loader_window(ld, 0, in, tg));
	CHECK_ERR(loom_loader_window(ld, 1, in, tg), LOOM_EFORMAT);
	CHECK_CONTAINS(loom_errmsg(), "token id 2147483648 at token 4 (byte 1040; window 1) is above 2147483647");
	CHECK_EQ(loom_loader_max_token(ld), 2147483648u);
	loom_loader_destroy(ld);
	/* a glob matching both widths: two data sets */
	{
		uint16_t t16[4] = {1, 2, 3, 4};
		uint32_t t32[4] = {1, 2, 3, 4};
		snprintf(path, sizeof path, "%s/m_000000.bin", dir);
		CHECK_OK(loom_shard_write(path, t16, 4));
		snprintf(path, sizeof path, "%s/m_000001.bin", dir);
		CHECK_OK(loom_shard_write32(path, t32, 4));
	}
	snprintf(glob, sizeof glob, "%s/m_*.bin", dir);
	CHECK_ERR(loom_loader_create(&ld, glob, &o), LOOM_EFORMAT);
	CHECK(ld == NULL);
	CHECK_CONTAINS(loom_errmsg(), "m_000001.bin holds uint32 tokens but ");
	CHECK_CONTAINS(loom_errmsg(), "m_000000.bin holds uint16: one data set is written in one width");
	o.vocab_size = -1;
	CHECK_ERR(loom_loader_create(&ld, path, &o), LOOM_EINVAL);
	test_rmdir(dir);
	return 0;
}

/* The CLI end to end: prepare with a 65791-id tokenizer.json, `loom info` on a shard, two training steps
 * of a model of 70000 ids on it (the loss of step 1 is the uniform prediction's, ln 70000, as for any
 * untrained model; the data trace gives the windows' offsets), and the refusals of a model too small for
 * the ids and of validation data of the other width. */
TEST(shard32_train_cli)
{
	char dir[256], tok[512], cmd[4096], out[16384], path[700];
	double loss[4] = {0, 0, 0, 0};
	const char *loom = test_loom_bin();
	CHECK(test_mkdtemp(dir, sizeof dir) == 0);
	snprintf(tok, sizeof tok, "%s/wide.json", dir);
	CHECK(write_tokjson(tok, WIDE_AB, WIDE_ABC, WIDE_EOT) == 0);
	snprintf(path, sizeof path, "%s/corpus.txt", dir);
	CHECK(test_write_file(path, corpus, strlen(corpus)) == 0);
	snprintf(cmd, sizeof cmd, "%s data prepare --input %s --out %s/data --doc-sep %% --val-fraction 0 --tokenizer %s",
	         loom, path, dir, tok);
	RUN_OK(cmd, out, 60);
	CHECK_CONTAINS(out, "vocab 65791 (end-of-text 65790)");
	CHECK_CONTAINS(out, "shards: uint32 tokens (llm.c's llama-3 format, magic 20240801 version 7");
	snprintf(cmd, sizeof cmd, "%s info %s/data/train_000000.bin", loom, dir);
	RUN_OK(cmd, out, 60);
	CHECK_CONTAINS(out, "token shard (llm.c format, magic 20240801 version 7, uint32 tokens): 41 tokens, largest "
	                    "token id 65790");
	snprintf(cmd, sizeof cmd, "mkdir -p %s/trace && LOOM_DATA_TRACE=%s/trace %s train --train-data '%s/data/train_*.bin' "
	         "--steps 2 --n-layer 1 --n-head 2 --n-embd 16 --vocab-size 70000 --n-positions 16 --seq-len 8 "
	         "--batch-size 2 --threads 1 --log %s/log.jsonl", dir, dir, loom, dir, dir);
	RUN_OK(cmd, out, 120);
	snprintf(path, sizeof path, "%s/log.jsonl", dir);
	CHECK_EQ(test_read_losses(path, loss, 4, NULL, NULL), 2);
	CHECK_NEAR(loss[1], 11.1563, 0.02); /* ln 70000 = 11.156; ln 65791 = 11.094 */
	CHECK_NEAR(loss[2], 11.1563, 0.1);
	snprintf(cmd, sizeof cmd, "cat %s/trace/data.r0.p*", dir);
	RUN_OK(cmd, out, 30);
	CHECK_STREQ(out, "step 1 window 0 token 0\nstep 2 window 1 token 16\n");
	/* a model of 65700 ids cannot embed 65700 nor the documents' start 65790, the first token */
	snprintf(cmd, sizeof cmd, "%s train --train-data '%s/data/train_*.bin' --steps 2 --n-layer 1 --n-head 2 "
	         "--n-embd 16 --vocab-size 65700 --n-positions 16 --seq-len 8 --batch-size 2 --threads 1", loom, dir);
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 120), 1);
	CHECK_CONTAINS(out, "training data: loader '");
	CHECK_CONTAINS(out, "/data/train_000000.bin: token id 65790 at token 0 (byte 1024; window 0) is outside the "
	                    "model's vocabulary of 65700");
	/* validation data in uint16 beside uint32 training data */
	{
		uint16_t t16[40];
		for (int i = 0; i < 40; i++)
			t16[i] = (uint16_t)i;
		snprintf(path, sizeof path, "%s/val16.bin", dir);
		CHECK_OK(loom_shard_write(path, t16, 40));
	}
	snprintf(cmd, sizeof cmd, "%s train --train-data '%s/data/train_*.bin' --val-data %s --steps 2 --n-layer 1 "
	         "--n-head 2 --n-embd 16 --vocab-size 70000 --n-positions 16 --seq-len 8 --batch-size 2 --threads 1", loom,
	         dir, path);
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 120), 1);
	CHECK_CONTAINS(out, "holds uint32 tokens but the validation data '");
	CHECK_CONTAINS(out, "val16.bin' uint16");
	test_rmdir(dir);
	return 0;
}
