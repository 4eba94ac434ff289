/* test_data.c: token shards, the tokenizer, the data loader and `loom data prepare`. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/resource.h>
#include <dirent.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/util.h"
#include "loom/data.h"
#include "test.h"

/* Shard i of `n` tokens holding the values base, base+1, ... (mod 65536). */
static int make_shard(const char *dir, const char *name, size_t n, unsigned base)
{
	char path[512];
	uint16_t *t = malloc((n ? n : 1) * sizeof *t);
	int rc;
	for (size_t i = 0; i < n; i++)
		t[i] = (uint16_t)(base + i);
	snprintf(path, sizeof path, "%s/%s", dir, name);
	rc = loom_shard_write(path, t, n);
	free(t);
	return rc;
}

TEST(shard_round_trip)
{
	char dir[256], path[512];
	uint16_t toks[1000];
	loom_shard_t s;
	CHECK(test_mkdtemp(dir, sizeof dir) == 0);
	for (int i = 0; i < 1000; i++)
		toks[i] = (uint16_t)(i * 65 + 7);
	snprintf(path, sizeof path, "%s/a.bin", dir);
	CHECK_OK(loom_shard_write(path, toks, 1000));
	CHECK_OK(loom_shard_open(&s, path));
	CHECK_EQ(s.n_tokens, 1000);
	CHECK(memcmp(s.tokens, toks, sizeof toks) == 0);
	CHECK_STREQ(s.path, path);
	loom_shard_close(&s);
	CHECK(s.tokens == NULL);
	loom_shard_close(&s); /* idempotent */
	/* the header is llm.c's: magic, version, count */
	{
		FILE *f = fopen(path, "rb");
		int32_t h[256];
		CHECK(f && fread(h, 4, 256, f) == 256);
		fclose(f);
		CHECK_EQ(h[0], 20240520);
		CHECK_EQ(h[1], 1);
		CHECK_EQ(h[2], 1000);
		CHECK_EQ(h[3], 0);
	}
	test_rmdir(dir);
	return 0;
}

TEST(shard_errors)
{
	char dir[256], path[512];
	int32_t h[256] = {20240520, 1, 10};
	uint16_t toks[10] = {0};
	unsigned char buf[1024 + 20];
	loom_shard_t s;
	CHECK(test_mkdtemp(dir, sizeof dir) == 0);
	snprintf(path, sizeof path, "%s/bad.bin", dir);
	/* wrong magic */
	h[0] = 12345;
	memcpy(buf, h, 1024), memcpy(buf + 1024, toks, 20);
	CHECK(test_write_file(path, buf, sizeof buf) == 0);
	CHECK_ERR(loom_shard_open(&s, path), LOOM_EFORMAT);
	CHECK_CONTAINS(loom_errmsg(), path);
	CHECK_CONTAINS(loom_errmsg(), "bad magic 12345 (expected 20240520");
	CHECK(s.tokens == NULL && s.path == NULL);
	/* wrong version */
	h[0] = 20240520, h[1] = 2;
	memcpy(buf, h, 1024);
	CHECK(test_write_file(path, buf, sizeof buf) == 0);
	CHECK_ERR(loom_shard_open(&s, path), LOOM_EFORMAT);
	CHECK_CONTAINS(loom_errmsg(), "version 2 (expected 1");
	/* truncated: header says 10 tokens, file has 9 */
	h[1] = 1;
	memcpy(buf, h, 1024);
	CHECK(test_write_file(path, buf, sizeof buf - 2) == 0);
	CHECK_ERR(loom_shard_open(&s, path), LOOM_EFORMAT);
	CHECK_CONTAINS(loom_errmsg(), path);
	CHECK_CONTAINS(loom_errmsg(), "header says 10 uint16 tokens, so 1044 bytes expected, but the file has 1042 bytes");
	/* shorter than the header */
	CHECK(test_write_file(path, buf, 100) == 0);
	CHECK_ERR(loom_shard_open(&s, path), LOOM_EFORMAT);
	CHECK_CONTAINS(loom_errmsg(), "100 bytes, shorter than the 1024-byte header");
	/* missing */
	snprintf(path, sizeof path, "%s/none.bin", dir);
	CHECK_ERR(loom_shard_open(&s, path), LOOM_ENOENT);
	CHECK_CONTAINS(loom_errmsg(), "none.bin");
	test_rmdir(dir);
	return 0;
}

TEST(tokenizer_round_trip)
{
	char dir[256], path[512];
	loom_tokenizer_t tok, tok2;
	const char *text = "Hi \xff\x00!";
	int ids[8], len;
	size_t n;
	const unsigned char *b;
	CHECK(test_mkdtemp(dir, sizeof dir) == 0);
	CHECK_OK(loom_tokenizer_init_bytes(&tok));
	CHECK_EQ(tok.vocab_size, 257);
	CHECK_EQ(tok.eot_token, 256);
	CHECK_OK(loom_tokenizer_encode(&tok, text, 6, ids, 8, &n));
	CHECK_EQ(n, 6);
	CHECK_EQ(ids[0], 'H');
	CHECK_EQ(ids[3], 255);
	CHECK_EQ(ids[4], 0);
	CHECK_ERR(loom_tokenizer_encode(&tok, text, 6, ids, 5, &n), LOOM_EINVAL);
	snprintf(path, sizeof path, "%s/tokenizer.bin", dir);
	CHECK_OK(loom_tokenizer_save(&tok, path));
	CHECK_OK(loom_tokenizer_load(&tok2, path));
	CHECK_EQ(tok2.vocab_size, 257);
	CHECK_EQ(tok2.eot_token, 256);
	CHECK_EQ(tok2.byte_level, 1);
	for (int i = 0; i < 6; i++) {
		b = loom_tokenizer_decode(&tok2, ids[i], &len);
		CHECK(b != NULL);
		CHECK_EQ(len, 1);
		CHECK_EQ(b[0], (unsigned char)text[i]);
	}
	b = loom_tokenizer_decode(&tok2, 256, &len);
	CHECK_EQ(len, 13);
	CHECK(memcmp(b, "<|endoftext|>", 13) == 0);
	CHECK(loom_tokenizer_decode(&tok2, 257, &len) == NULL);
	CHECK_EQ(len, 0);
	CHECK(loom_tokenizer_decode(&tok2, -1, &len) == NULL);
	/* file layout: header 256 x u32 then 1+1 bytes per byte token and 1+13 for eot */
	{
		FILE *f = fopen(path, "rb");
		uint32_t h[4];
		CHECK(f && fread(h, 4, 4, f) == 4);
		CHECK(fseek(f, 0, SEEK_END) == 0);
		CHECK_EQ(ftell(f), 1024 + 256 * 2 + 14);
		fclose(f);
		CHECK_EQ(h[0], 20240328);
		CHECK_EQ(h[1], 2);
		CHECK_EQ(h[2], 257);
		CHECK_EQ(h[3], 256);
	}
	loom_tokenizer_free(&tok2);
	loom_tokenizer_free(&tok);
	test_rmdir(dir);
	return 0;
}

TEST(tokenizer_v1_and_errors)
{
	char dir[256], path[512];
	uint32_t h[256] = {20240328, 1, 50257};
	size_t n = 1024 + 50257 * 2;
	unsigned char *buf = calloc(n + 10, 1);
	loom_tokenizer_t tok;
	int len, ids[4];
	size_t nout;
	CHECK(buf != NULL);
	CHECK(test_mkdtemp(dir, sizeof dir) == 0);
	snprintf(path, sizeof path, "%s/gpt2_tok.bin", dir);
	/* a version-1 GPT-2-sized table: token i is the one byte 'a' + i % 26 */
	memcpy(buf, h, 1024);
	for (size_t i = 0; i < 50257; i++)
		buf[1024 + 2 * i] = 1, buf[1024 + 2 * i + 1] = (unsigned char)('a' + i % 26);
	CHECK(test_write_file(path, buf, n) == 0);
	CHECK_OK(loom_tokenizer_load(&tok, path));
	CHECK_EQ(tok.vocab_size, 50257);
	CHECK_EQ(tok.eot_token, 50256);
	CHECK_EQ(tok.byte_level, 0);
	CHECK_EQ(loom_tokenizer_decode(&tok, 27, &len)[0], 'b');
	CHECK_ERR(loom_tokenizer_encode(&tok, "ab", 2, ids, 4, &nout), LOOM_ENOTSUP);
	loom_tokenizer_free(&tok);
	/* truncated: shorter than 2 bytes per token, caught before the tables are allocated */
	CHECK(test_write_file(path, buf, n - 1) == 0);
	CHECK_ERR(loom_tokenizer_load(&tok, path), LOOM_EFORMAT);
	CHECK_CONTAINS(loom_errmsg(), "vocab size 50257 needs at least 101538 bytes, the file has 101537");
	/* truncated inside a token: the first token claims 3 bytes */
	buf[1024] = 3;
	CHECK(test_write_file(path, buf, n) == 0);
	CHECK_ERR(loom_tokenizer_load(&tok, path), LOOM_EFORMAT);
	CHECK_CONTAINS(loom_errmsg(), "truncated");
	buf[1024] = 1;
	CHECK_CONTAINS(loom_errmsg(), path);
	/* trailing bytes */
	CHECK(test_write_file(path, buf, n + 3) == 0);
	CHECK_ERR(loom_tokenizer_load(&tok, path), LOOM_EFORMAT);
	CHECK_CONTAINS(loom_errmsg(), "3 trailing bytes");
	/* bad version */
	h[1] = 7;
	memcpy(buf, h, 1024);
	CHECK(test_write_file(path, buf, n) == 0);
	CHECK_ERR(loom_tokenizer_load(&tok, path), LOOM_EFORMAT);
	CHECK_CONTAINS(loom_errmsg(), "version 7 (expected 1 or 2)");
	/* bad magic */
	h[0] = 1;
	memcpy(buf, h, 1024);
	CHECK(test_write_file(path, buf, n) == 0);
	CHECK_ERR(loom_tokenizer_load(&tok, path), LOOM_EFORMAT);
	CHECK_CONTAINS(loom_errmsg(), "bad magic 1");
	free(buf);
	test_rmdir(dir);
	return 0;
}

/* Hostile inputs (issue 13): a directory or a FIFO as a shard or tokenizer is refused without
 * blocking; a tokenizer header claiming more tokens than its bytes can hold is refused before the
 * tables are allocated (2^24 tokens took 192 MB from a 1 KB file). */
TEST(data_hostile_files)
{
	char dir[256], path[512];
	uint32_t h[256] = {20240328, 2, 1u << 24, 0};
	loom_shard_t s;
	loom_tokenizer_t tok;
	CHECK(test_mkdtemp(dir, sizeof dir) == 0);
	CHECK_ERR(loom_shard_open(&s, dir), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "is a directory, expected a regular file");
	CHECK_ERR(loom_tokenizer_load(&tok, dir), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "is a directory");
	snprintf(path, sizeof path, "%s/fifo", dir);
	CHECK(mkfifo(path, 0600) == 0);
	CHECK_ERR(loom_shard_open(&s, path), LOOM_EINVAL); /* blocked in open() before */
	CHECK_CONTAINS(loom_errmsg(), "shard");
	CHECK_CONTAINS(loom_errmsg(), "is a FIFO");
	CHECK_ERR(loom_tokenizer_load(&tok, path), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "is a FIFO");
	snprintf(path, sizeof path, "%s/tok.bin", dir);
	CHECK(test_write_file(path, h, sizeof h) == 0);
	loom__fault_alloc_set(2); /* the file's buffer is the only allocation before the check */
	CHECK_ERR(loom_tokenizer_load(&tok, path), LOOM_EFORMAT);
	CHECK_EQ(loom__fault_alloc_hit(), 0);
	loom__fault_alloc_set(0);
	CHECK_CONTAINS(loom_errmsg(), "vocab size 16777216 needs at least 33555456 bytes, the file has 1024");
	test_rmdir(dir);
	return 0;
}

/* Three shards of 100, 0 and 57 tokens with values 0..156 in the concatenation. */
static int make_three_shards(const char *dir)
{
	return make_shard(dir, "s_000.bin", 100, 0) || make_shard(dir, "s_001.bin", 0, 0) ||
	       make_shard(dir, "s_002.bin", 57, 100);
}

TEST(loader_order_and_wrap)
{
	char dir[256], glob[512];
	loom_loader_t *ld;
	loom_loader_opts_t o = {.B = 2, .T = 5};
	int in[10], tg[10];
	CHECK(test_mkdtemp(dir, sizeof dir) == 0);
	CHECK(make_three_shards(dir) == 0);
	snprintf(glob, sizeof glob, "%s/s_*.bin", dir);
	CHECK_OK(loom_loader_create(&ld, glob, &o));
	CHECK_EQ(loom_loader_num_tokens(ld), 157);
	CHECK_EQ(loom_loader_num_shards(ld), 3);
	CHECK_EQ(loom_loader_windows_per_epoch(ld), 15); /* (157 - 1) / 10 */
	CHECK_EQ(loom_loader_max_token(ld), 156);
	/* window k starts at token k*B*T; inputs are tokens s..s+9, targets s+1..s+10 */
	for (uint64_t k = 0; k < 40; k++) {
		uint64_t s = (k % 15) * 10;
		CHECK_OK(loom_loader_next(ld, in, tg));
		for (int i = 0; i < 10; i++) {
			CHECK_EQ(in[i], s + (uint64_t)i);
			CHECK_EQ(tg[i], s + (uint64_t)i + 1);
		}
	}
	/* window 9 spans the shard boundary (tokens 90..100) and the empty shard */
	CHECK_OK(loom_loader_window(ld, 9, in, tg));
	CHECK_EQ(in[9], 99);
	CHECK_EQ(tg[9], 100);
	/* window 14 ends at token 150 (the last 6 tokens are never read), window 15 is epoch 1 = window 0 */
	CHECK_OK(loom_loader_window(ld, 14, in, tg));
	CHECK_EQ(tg[9], 150);
	CHECK_OK(loom_loader_window(ld, 15, in, tg));
	CHECK_EQ(in[0], 0);
	{
		loom_loader_state_t st;
		loom_loader_get_state(ld, &st);
		CHECK_EQ(st.next_window, 40);
		CHECK_EQ(st.epoch, 2);
	}
	loom_loader_destroy(ld);
	test_rmdir(dir);
	return 0;
}

TEST(loader_errors)
{
	char dir[256], glob[512];
	loom_loader_t *ld;
	loom_loader_opts_t o = {.B = 4, .T = 40};
	CHECK(test_mkdtemp(dir, sizeof dir) == 0);
	CHECK(make_three_shards(dir) == 0);
	snprintf(glob, sizeof glob, "%s/s_*.bin", dir);
	/* 157 tokens < B*T+1 = 161 */
	CHECK_ERR(loom_loader_create(&ld, glob, &o), LOOM_EINVAL);
	CHECK(ld == NULL);
	CHECK_CONTAINS(loom_errmsg(), glob);
	CHECK_CONTAINS(loom_errmsg(), "157 tokens in 3 shard(s), fewer than one window of B*T+1 = 161 tokens (B=4, T=40)");
	o.T = 39; /* 157 - 1 >= 156: exactly one window */
	CHECK_OK(loom_loader_create(&ld, glob, &o));
	CHECK_EQ(loom_loader_windows_per_epoch(ld), 1);
	loom_loader_destroy(ld);
	snprintf(glob, sizeof glob, "%s/nothing_*.bin", dir);
	CHECK_ERR(loom_loader_create(&ld, glob, &o), LOOM_ENOENT);
	CHECK_CONTAINS(loom_errmsg(), "nothing_");
	/* a bad shard among good ones names that shard */
	CHECK(test_write_file(glob, "garbage", 7) == 0); /* the literal file "nothing_*.bin" matches itself */
	snprintf(glob, sizeof glob, "%s/*.bin", dir);
	CHECK_ERR(loom_loader_create(&ld, glob, &o), LOOM_EFORMAT);
	CHECK_CONTAINS(loom_errmsg(), "nothing_*.bin");
	o.rank = 2, o.world = 2;
	CHECK_ERR(loom_loader_create(&ld, glob, &o), LOOM_EINVAL);
	test_rmdir(dir);
	return 0;
}

TEST(loader_shuffle)
{
	char dir[256], glob[512];
	loom_loader_t *ld, *ld2, *ld3;
	loom_loader_opts_t o = {.B = 1, .T = 3, .shuffle = 1, .seed = 42};
	int in[3], tg[3], seen[52];
	uint64_t W, first[52];
	int differs = 0, differs_seed = 0, differs_identity = 0;
	CHECK(test_mkdtemp(dir, sizeof dir) == 0);
	CHECK(make_three_shards(dir) == 0);
	snprintf(glob, sizeof glob, "%s/s_*.bin", dir);
	CHECK_OK(loom_loader_create(&ld, glob, &o));
	CHECK_OK(loom_loader_create(&ld2, glob, &o));
	o.seed = 43;
	CHECK_OK(loom_loader_create(&ld3, glob, &o));
	W = loom_loader_windows_per_epoch(ld);
	CHECK_EQ(W, 52); /* 156 / 3 */
	for (uint64_t e = 0; e < 3; e++) {
		memset(seen, 0, sizeof seen);
		for (uint64_t p = 0; p < W; p++) {
			uint64_t k = e * W + p, s = loom_loader_window_start(ld, k);
			CHECK(s < W);
			seen[s]++;
			/* the window holds the tokens of position s */
			CHECK_OK(loom_loader_next(ld, in, tg));
			CHECK_EQ(in[0], s * 3);
			CHECK_EQ(tg[2], s * 3 + 3);
			/* reproducible from (seed, epoch) alone */
			CHECK_EQ(loom_loader_window_start(ld2, k), s);
			if (e == 0)
				first[p] = s;
			else if (first[p] != s)
				differs++;
			differs_seed += loom_loader_window_start(ld3, k) != s;
			differs_identity += s != p;
		}
		for (uint64_t i = 0; i < W; i++)
			CHECK_MSG(seen[i] == 1, "epoch %llu: window %llu read %d times", (unsigned long long)e,
			          (unsigned long long)i, seen[i]);
	}
	CHECK(differs > 0);          /* epochs are permuted differently */
	CHECK(differs_seed > 0);     /* seeds matter */
	CHECK(differs_identity > 40); /* it is a real shuffle */
	loom_loader_destroy(ld);
	loom_loader_destroy(ld2);
	loom_loader_destroy(ld3);
	test_rmdir(dir);
	return 0;
}

TEST(loader_state_restore)
{
	char dir[256], glob[512];
	loom_loader_t *a, *b;
	loom_loader_opts_t o = {.B = 2, .T = 4, .shuffle = 1, .seed = 7, .rank = 1, .world = 3};
	loom_loader_state_t st, bad;
	int in1[8], tg1[8], in2[8], tg2[8];
	CHECK(test_mkdtemp(dir, sizeof dir) == 0);
	CHECK(make_three_shards(dir) == 0);
	snprintf(glob, sizeof glob, "%s/s_*.bin", dir);
	CHECK_OK(loom_loader_create(&a, glob, &o));
	/* rank 1 of 3 reads windows 1, 4, 7, ... */
	for (int i = 0; i < 25; i++) {
		CHECK_OK(loom_loader_next(a, in1, tg1));
		CHECK_OK(loom_loader_window(a, 1 + 3 * (uint64_t)i, in2, tg2));
		CHECK(memcmp(in1, in2, sizeof in1) == 0 && memcmp(tg1, tg2, sizeof tg1) == 0);
	}
	loom_loader_get_state(a, &st);
	CHECK_EQ(st.next_window, 76);
	CHECK_EQ(st.epoch, 76 / 19);
	CHECK_OK(loom_loader_create(&b, glob, &o));
	CHECK_OK(loom_loader_set_state(b, &st));
	for (int i = 0; i < 30; i++) {
		CHECK_OK(loom_loader_next(a, in1, tg1));
		CHECK_OK(loom_loader_next(b, in2, tg2));
		CHECK(memcmp(in1, in2, sizeof in1) == 0 && memcmp(tg1, tg2, sizeof tg1) == 0);
	}
	/* states of other settings are refused */
	bad = st, bad.world = 2;
	CHECK_ERR(loom_loader_set_state(b, &bad), LOOM_EMISMATCH);
	CHECK_CONTAINS(loom_errmsg(), "saved state has world=2 but this loader has 3");
	bad = st, bad.n_tokens = 1000;
	CHECK_ERR(loom_loader_set_state(b, &bad), LOOM_EMISMATCH);
	CHECK_CONTAINS(loom_errmsg(), "n_tokens=1000");
	bad = st, bad.seed = 8;
	CHECK_ERR(loom_loader_set_state(b, &bad), LOOM_EMISMATCH);
	loom_loader_destroy(a);
	loom_loader_destroy(b);
	test_rmdir(dir);
	return 0;
}

static int read_shard_tokens(const char *path, uint16_t *out, size_t cap, size_t *n)
{
	loom_shard_t s;
	int rc = loom_shard_open(&s, path);
	if (rc)
		return rc;
	*n = s.n_tokens;
	if (s.n_tokens <= cap)
		memcpy(out, s.tokens, s.n_tokens * 2);
	loom_shard_close(&s);
	return 0;
}

TEST(data_prepare_documents)
{
	char dir[256], in1[512], in2[512], out[512], path[600];
	/* 10 documents: a file with 9 "%"-separated pieces, then a file of one */
	const char *text1 = "d0\n%\nd1\n%\nd2\n%\nd3\n%\nd4\n%\nd5\n%\nd6\n%\nd7\n%\nd8\n%\n";
	const char *text2 = "last";
	const char *inputs[2];
	loom_prepare_opts_t o = {0};
	loom_prepare_summary_t sum;
	uint16_t toks[256];
	size_t n;
	CHECK(test_mkdtemp(dir, sizeof dir) == 0);
	snprintf(in1, sizeof in1, "%s/a.txt", dir);
	snprintf(in2, sizeof in2, "%s/b.txt", dir);
	snprintf(out, sizeof out, "%s/out", dir);
	CHECK(test_write_file(in1, text1, strlen(text1)) == 0);
	CHECK(test_write_file(in2, text2, strlen(text2)) == 0);
	inputs[0] = in1, inputs[1] = in2;
	o.inputs = inputs, o.n_inputs = 2, o.out_dir = out, o.val_fraction = 0.2, o.doc_sep = "%", o.shard_tokens = 10;
	/* an old shard from a previous run disappears */
	CHECK(make_shard(dir, "out_placeholder", 0, 0) == 0);
	{
		char mk[1400];
		snprintf(mk, sizeof mk, "mkdir -p %s && cp %s/out_placeholder %s/train_000099.bin", out, dir, out);
		CHECK(system(mk) == 0);
	}
	CHECK_OK(loom_data_prepare(&o, &sum));
	CHECK_EQ(sum.documents, 10);
	CHECK_EQ(sum.val_documents, 2); /* documents 4 and 9: floor((i+1)/5) > floor(i/5) */
	CHECK_EQ(sum.train_documents, 8);
	CHECK_EQ(sum.val_tail_split, 0);
	CHECK_EQ(sum.removed_shards, 1);
	/* train: 8 docs "dI\n" = 4 tokens each with EOT -> 32 tokens in shards of 10: 10, 10, 10, 2 */
	CHECK_EQ(sum.train_tokens, 32);
	CHECK_EQ(sum.train_shards, 4);
	/* val: "d4\n" (4 tokens) and "last" (5 tokens) */
	CHECK_EQ(sum.val_tokens, 9);
	CHECK_EQ(sum.val_shards, 1);
	snprintf(path, sizeof path, "%s/train_000000.bin", out);
	CHECK_OK(read_shard_tokens(path, toks, 256, &n));
	CHECK_EQ(n, 10);
	CHECK_EQ(toks[0], 256);
	CHECK_EQ(toks[1], 'd');
	CHECK_EQ(toks[2], '0');
	CHECK_EQ(toks[3], '\n');
	CHECK_EQ(toks[4], 256);
	snprintf(path, sizeof path, "%s/train_000003.bin", out);
	CHECK_OK(read_shard_tokens(path, toks, 256, &n));
	CHECK_EQ(n, 2);
	CHECK_EQ(toks[0], '8');
	CHECK_EQ(toks[1], '\n');
	snprintf(path, sizeof path, "%s/val_000000.bin", out);
	CHECK_OK(read_shard_tokens(path, toks, 256, &n));
	CHECK_EQ(n, 9);
	{
		const uint16_t want[9] = {256, 'd', '4', '\n', 256, 'l', 'a', 's', 't'};
		for (int i = 0; i < 9; i++)
			CHECK_EQ(toks[i], want[i]);
	}
	snprintf(path, sizeof path, "%s/train_000099.bin", out);
	CHECK(fopen(path, "rb") == NULL);
	snprintf(path, sizeof path, "%s/tokenizer.bin", out);
	{
		loom_tokenizer_t tok;
		CHECK_OK(loom_tokenizer_load(&tok, path));
		CHECK_EQ(tok.vocab_size, 257);
		CHECK_EQ(tok.eot_token, 256);
		loom_tokenizer_free(&tok);
	}
	/* the train glob loads as one stream of 32 tokens */
	{
		loom_loader_t *ld;
		loom_loader_opts_t lo = {.B = 1, .T = 31};
		int in[31], tg[31];
		snprintf(path, sizeof path, "%s/train_*.bin", out);
		CHECK_OK(loom_loader_create(&ld, path, &lo));
		CHECK_EQ(loom_loader_num_tokens(ld), 32);
		CHECK_OK(loom_loader_next(ld, in, tg));
		CHECK_EQ(tg[30], '\n');
		loom_loader_destroy(ld);
	}
	test_rmdir(dir);
	return 0;
}

TEST(data_prepare_tail_split)
{
	char dir[256], in1[512], out[512], path[600];
	const char *text = "abcdefghijklmnopqrs"; /* one document: 20 tokens with its EOT */
	const char *inputs[1];
	loom_prepare_opts_t o = {0};
	loom_prepare_summary_t sum;
	uint16_t toks[64];
	size_t n;
	CHECK(test_mkdtemp(dir, sizeof dir) == 0);
	snprintf(in1, sizeof in1, "%s/one.txt", dir);
	snprintf(out, sizeof out, "%s/o", dir);
	CHECK(test_write_file(in1, text, strlen(text)) == 0);
	inputs[0] = in1;
	o.inputs = inputs, o.n_inputs = 1, o.out_dir = out, o.val_fraction = 0.1;
	CHECK_OK(loom_data_prepare(&o, &sum));
	CHECK_EQ(sum.documents, 1);
	CHECK_EQ(sum.val_tail_split, 1);
	CHECK_EQ(sum.train_tokens, 18); /* 20 - ceil(0.1 * 20) */
	CHECK_EQ(sum.val_tokens, 3);    /* EOT + "rs" */
	snprintf(path, sizeof path, "%s/val_000000.bin", out);
	CHECK_OK(read_shard_tokens(path, toks, 64, &n));
	CHECK_EQ(n, 3);
	CHECK_EQ(toks[0], 256);
	CHECK_EQ(toks[1], 'r');
	CHECK_EQ(toks[2], 's');
	/* deterministic: a second run writes identical shards */
	{
		char cmd[1400];
		snprintf(cmd, sizeof cmd, "cp %s/train_000000.bin %s/first.bin", out, dir);
		CHECK(system(cmd) == 0);
		CHECK_OK(loom_data_prepare(&o, &sum));
		snprintf(cmd, sizeof cmd, "cmp -s %s/train_000000.bin %s/first.bin", out, dir);
		CHECK(system(cmd) == 0);
	}
	/* val fraction 0: no val shard */
	o.val_fraction = 0;
	CHECK_OK(loom_data_prepare(&o, &sum));
	CHECK_EQ(sum.val_shards, 0);
	CHECK_EQ(sum.train_tokens, 20);
	snprintf(path, sizeof path, "%s/val_000000.bin", out);
	CHECK(fopen(path, "rb") == NULL);
	o.val_fraction = 1.0;
	CHECK_ERR(loom_data_prepare(&o, &sum), LOOM_EINVAL);
	test_rmdir(dir);
	return 0;
}

TEST(data_prepare_cli)
{
	char dir[256], cmd[2048], out[8192], in[512];
	const char *text = "first\n%\nsecond\n%\nthird\n";
	CHECK(test_mkdtemp(dir, sizeof dir) == 0);
	snprintf(in, sizeof in, "%s/f.txt", dir);
	CHECK(test_write_file(in, text, strlen(text)) == 0);
	snprintf(cmd, sizeof cmd, "%s data prepare --input %s --out %s/d --val-fraction 0.5 --doc-sep %%", test_loom_bin(),
	         in, dir);
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 30), 0);
	CHECK_CONTAINS(out, "3 documents");
	CHECK_CONTAINS(out, "train: 2 documents, 14 tokens, 1 shard");
	CHECK_CONTAINS(out, "val: 1 documents, 8 tokens, 1 shard");
	snprintf(cmd, sizeof cmd, "%s info %s/d/val_000000.bin", test_loom_bin(), dir);
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 30), 0);
	CHECK_CONTAINS(out, "8 tokens");
	snprintf(cmd, sizeof cmd, "%s data prepare --out %s/d", test_loom_bin(), dir);
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 30), 2);
	CHECK_CONTAINS(out, "--input");
	test_rmdir(dir);
	return 0;
}

/* Fault injection: a write that fails half-way (file size limit) leaves nothing under the final
 * name and no temp file; a missing directory is named in the error. Runs in a child process so the
 * limit does not touch the runner. */
TEST(shard_write_failure_is_atomic)
{
	char dir[256], path[512], cmd[700], out[256];
	pid_t pid;
	int status;
	CHECK(test_mkdtemp(dir, sizeof dir) == 0);
	snprintf(path, sizeof path, "%s/big.bin", dir);
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		struct rlimit rl = {4096, 4096};
		size_t n = 100000;
		uint16_t *t = calloc(n, 2);
		signal(SIGXFSZ, SIG_IGN);
		if (setrlimit(RLIMIT_FSIZE, &rl) != 0)
			_exit(10);
		if (loom_shard_write(path, t, n) != LOOM_EIO)
			_exit(11);
		if (!strstr(loom_errmsg(), path))
			_exit(12);
		_exit(0);
	}
	CHECK(waitpid(pid, &status, 0) == pid);
	CHECK_EQ(WIFEXITED(status) ? WEXITSTATUS(status) : -1, 0);
	snprintf(cmd, sizeof cmd, "ls -A %s | wc -l", dir);
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 10), 0);
	CHECK_STREQ(out, "0\n"); /* neither big.bin nor .big.bin.tmp.PID */
	snprintf(path, sizeof path, "%s/no/such/dir/x.bin", dir);
	{
		uint16_t t[1] = {0};
		CHECK_ERR(loom_shard_write(path, t, 1), LOOM_ENOENT);
		CHECK_CONTAINS(loom_errmsg(), "no/such/dir/x.bin");
	}
	test_rmdir(dir);
	return 0;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The files of DIR with their contents' sums, as one string (for comparing a directory before and
 * after); nonzero on failure. */
static int snapshot(const char *dir, char *out, size_t cap)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	char *names[64], path[1200];
	int n = 0;
	size_t len = 0;
	if (!d)
		return 1;
	while ((e = readdir(d)) && n < 64)
		if (e->d_name[0] != '.' || (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")))
			names[n++] = strdup(e->d_name);
	closedir(d);
	qsort(names, (size_t)n, sizeof *names, cmp_str);
	out[0] = 0;
	for (int i = 0; i < n; i++) {
		FILE *f;
		unsigned long sum = 5381;
		int c;
		snprintf(path, sizeof path, "%s/%s", dir, names[i]);
		if ((f = fopen(path, "rb"))) {
			while ((c = fgetc(f)) != EOF)
				sum = sum * 33 + (unsigned long)c;
			fclose(f);
		}
		len += (size_t)snprintf(out + len, len < cap ? cap - len : 0, "%s %lx\n", names[i], sum);
		free(names[i]);
	}
	return len >= cap;
}

static int leftovers(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int n = 0;
	while (d && (e = readdir(d)))
		n += strstr(e->d_name, ".prepare-") != NULL;
	if (d)
		closedir(d);
	return n;
}

/* Issue 13, finding 3: `loom data prepare` deleted the old shards before writing the new ones, so a
 * failure half-way (a full disk) left part of a new set, which training then used. Now a failure at
 * any allocation leaves the old set exactly as it was, and no temporary directory behind. */
TEST(data_prepare_failure_keeps_old_set)
{
	char dir[256], in1[512], in2[512], out[512], path[700], before[4096], after[4096];
	const char *inputs[1];
	loom_prepare_opts_t o = {0};
	loom_prepare_summary_t sum;
	loom_loader_t *ld;
	loom_loader_opts_t lo = {.B = 1, .T = 2};
	int failures = 0, rc = LOOM_OK;
	CHECK(test_mkdtemp(dir, sizeof dir) == 0);
	snprintf(in1, sizeof in1, "%s/a.txt", dir);
	snprintf(in2, sizeof in2, "%s/b.txt", dir);
	snprintf(out, sizeof out, "%s/out", dir);
	CHECK(test_write_file(in1, "aa\n%\nbb\n%\ncc\n%\ndd\n", 18) == 0);
	CHECK(test_write_file(in2, "one\n%\ntwo\n%\nthree\n%\nfour\n%\nfive\n", 32) == 0);
	inputs[0] = in1;
	o.inputs = inputs, o.n_inputs = 1, o.out_dir = out, o.val_fraction = 0.25, o.doc_sep = "%", o.shard_tokens = 4;
	CHECK_OK(loom_data_prepare(&o, &sum));
	CHECK_EQ(sum.train_shards, 3); /* 3 documents "xx\n" + EOT: 12 tokens */
	CHECK_EQ(sum.val_shards, 1);
	CHECK_EQ(snapshot(out, before, sizeof before), 0);
	CHECK_CONTAINS(before, "shards.index");
	inputs[0] = in2, o.shard_tokens = 3;
	for (long n = 1; n < 2000; n++) {
		loom__fault_alloc_set(n);
		rc = loom_data_prepare(&o, &sum);
		loom__fault_alloc_set(0);
		if (rc == LOOM_OK)
			break;
		CHECK_EQ(rc, LOOM_ENOMEM);
		failures++;
		CHECK_EQ(snapshot(out, after, sizeof after), 0);
		CHECK_MSG(strcmp(before, after) == 0, "allocation %ld failed and the old set changed:\n%s\nvs\n%s", n, before,
		          after);
		CHECK_EQ(leftovers(dir), 0);
	}
	CHECK_OK(rc);
	CHECK(failures >= 5);
	CHECK_EQ(leftovers(dir), 0);
	CHECK_EQ(sum.removed_shards, 4);
	/* the new set, whole: 4 train documents, "one\n" .. "five\n" without "four\n" */
	snprintf(path, sizeof path, "%s/train_*.bin", out);
	CHECK_OK(loom_loader_create(&ld, path, &lo));
	CHECK_EQ(loom_loader_num_tokens(ld), 5 + 5 + 7 + 6);
	loom_loader_destroy(ld);
	/* what a killed prepare left beside the output is removed by the next one */
	snprintf(path, sizeof path, "%s/.out.prepare-999999999", dir);
	CHECK(mkdir(path, 0777) == 0);
	CHECK_EQ(leftovers(dir), 1);
	/* an output directory holding other files: they stay, the set is replaced file by file */
	snprintf(path, sizeof path, "%s/notes.txt", out);
	CHECK(test_write_file(path, "mine", 4) == 0);
	inputs[0] = in1, o.shard_tokens = 4;
	CHECK_OK(loom_data_prepare(&o, &sum));
	CHECK_EQ(sum.removed_shards, 10);
	CHECK_EQ(snapshot(out, after, sizeof after), 0);
	CHECK_CONTAINS(after, "notes.txt ");
	CHECK_EQ(strcmp(strstr(after, "shards.index"), strstr(before, "shards.index")), 0); /* set A again, whole */
	CHECK_EQ(leftovers(dir), 0);
	test_rmdir(dir);
	return 0;
}

/* Issue 13, findings 3 and 11: a set with an index is checked (a missing train or val shard is an
 * error naming it, as is a stray one); shards without an index (llm.c's) still load; a directory
 * matched as a shard and a glob that matches nothing get clear messages. */
TEST(loader_shard_index)
{
	char dir[256], in[512], out[512], pat[700], path[700], cmd[1600], buf[256];
	const char *inputs[1];
	loom_prepare_opts_t o = {0};
	loom_prepare_summary_t sum;
	loom_loader_t *ld;
	loom_loader_opts_t lo = {.B = 1, .T = 2};
	CHECK(test_mkdtemp(dir, sizeof dir) == 0);
	snprintf(in, sizeof in, "%s/a.txt", dir);
	snprintf(out, sizeof out, "%s/out", dir);
	CHECK(test_write_file(in, "aa\n%\nbb\n%\ncc\n%\ndd\n", 18) == 0);
	inputs[0] = in;
	o.inputs = inputs, o.n_inputs = 1, o.out_dir = out, o.val_fraction = 0.25, o.doc_sep = "%", o.shard_tokens = 4;
	CHECK_OK(loom_data_prepare(&o, &sum));
	snprintf(pat, sizeof pat, "%s/train_*.bin", out);
	CHECK_OK(loom_loader_create(&ld, pat, &lo));
	CHECK_EQ(loom_loader_num_shards(ld), 3);
	loom_loader_destroy(ld);
	/* a missing train shard */
	snprintf(path, sizeof path, "%s/train_000001.bin", out);
	snprintf(cmd, sizeof cmd, "mv %s %s/moved.bin", path, dir);
	CHECK_EQ(test_run_cmd(cmd, buf, sizeof buf, 10), 0);
	CHECK_ERR(loom_loader_create(&ld, pat, &lo), LOOM_ENOENT);
	CHECK_CONTAINS(loom_errmsg(), "/out/train_000001.bin is missing: ");
	CHECK_CONTAINS(loom_errmsg(), "/out/shards.index lists 3 train shard(s) (an incomplete data set");
	/* a shard of another size */
	CHECK(test_write_file(path, "short", 5) == 0);
	CHECK_ERR(loom_loader_create(&ld, pat, &lo), LOOM_EFORMAT);
	CHECK_CONTAINS(loom_errmsg(), "/out/train_000001.bin has 5 bytes, ");
	snprintf(cmd, sizeof cmd, "mv %s/moved.bin %s", dir, path);
	CHECK_EQ(test_run_cmd(cmd, buf, sizeof buf, 10), 0);
	/* a stray shard the index does not list */
	snprintf(cmd, sizeof cmd, "cp %s %s/train_000007.bin", path, out);
	CHECK_EQ(test_run_cmd(cmd, buf, sizeof buf, 10), 0);
	CHECK_ERR(loom_loader_create(&ld, pat, &lo), LOOM_EFORMAT);
	CHECK_CONTAINS(loom_errmsg(), "/out/train_000007.bin is not part of the data set that ");
	snprintf(path, sizeof path, "%s/train_000007.bin", out);
	CHECK(remove(path) == 0);
	/* the val shard gone: the glob matches nothing, and the index names what is missing */
	snprintf(path, sizeof path, "%s/val_000000.bin", out);
	CHECK(remove(path) == 0);
	snprintf(pat, sizeof pat, "%s/val_*.bin", out);
	CHECK_ERR(loom_loader_create(&ld, pat, &lo), LOOM_ENOENT);
	CHECK_CONTAINS(loom_errmsg(), "/out/val_000000.bin is missing: ");
	/* without an index (shards made by llm.c's scripts): loaded as they are */
	snprintf(path, sizeof path, "%s/%s", out, LOOM_SHARD_INDEX);
	CHECK(remove(path) == 0);
	snprintf(path, sizeof path, "%s/train_000002.bin", out);
	CHECK(remove(path) == 0);
	snprintf(pat, sizeof pat, "%s/train_*.bin", out);
	CHECK_OK(loom_loader_create(&ld, pat, &lo));
	CHECK_EQ(loom_loader_num_shards(ld), 2);
	loom_loader_destroy(ld);
	snprintf(pat, sizeof pat, "%s/val_*.bin", out);
	CHECK_ERR(loom_loader_create(&ld, pat, &lo), LOOM_ENOENT);
	CHECK_CONTAINS(loom_errmsg(), "loader: no files match '");
	/* a directory matched as a shard */
	snprintf(path, sizeof path, "%s/train_000005.bin", out);
	CHECK(mkdir(path, 0777) == 0);
	snprintf(pat, sizeof pat, "%s/train_*.bin", out);
	CHECK_ERR(loom_loader_create(&ld, pat, &lo), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "/out/train_000005.bin' (matched by '");
	CHECK_CONTAINS(loom_errmsg(), "') is a directory, not a token shard file");
	test_rmdir(dir);
	return 0;
}
