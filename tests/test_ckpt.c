/* test_ckpt.c: JSON, safetensors, GPT-2 model files (HF safetensors, llm.c .bin), optimizer state,
 * the key-value state file and atomic training-checkpoint directories. */
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/json.h"
#include "core/fileio.h"
#include "core/util.h"
#include "core/crc32c.h"
#include "loom/ckpt.h"
#include "test.h"

static long file_size(const char *path)
{
	struct stat sb;
	return stat(path, &sb) == 0 ? (long)sb.st_size : -1;
}

/* Deterministic pseudo-random floats with varied exponents and signs. */
static void fill(float *p, size_t n, uint32_t seed)
{
	uint32_t x = seed * 2654435761u + 1;
	for (size_t i = 0; i < n; i++) {
		x ^= x << 13, x ^= x >> 17, x ^= x << 5;
		p[i] = ((float)(x % 200001) - 100000.0f) * 1e-5f * (float)(1 + (x >> 28));
	}
}

static const loom_gpt2_config_t tiny = {2, 2, 8, 16, 50}; /* L H C T V */

TEST(json_parser)
{
	json_t v;
	char err[200];
	const char *doc = " {\"a\": [1, -2.5e3, true, false, null], \"s\": \"q\\\"\\\\\\/\\n\\u00e9\\ud83d\\ude00\", "
	                  "\"big\": 18446744073709551615, \"o\": {}} ";
	uint64_t u;
	int64_t i;
	CHECK(loom__json_parse(doc, strlen(doc), &v, err, sizeof err) == 0);
	CHECK_EQ(v.type, JSON_OBJECT);
	CHECK_EQ(v.n, 4);
	CHECK_EQ(loom__json_get(&v, "a")->n, 5);
	CHECK_FEQ(loom__json_get(&v, "a")->kids[1].num, -2500.0);
	CHECK_EQ(loom__json_get(&v, "a")->kids[2].boolean, 1);
	CHECK_EQ(loom__json_get(&v, "a")->kids[4].type, JSON_NULL);
	CHECK_STREQ(loom__json_get(&v, "s")->s, "q\"\\/\n\xc3\xa9\xf0\x9f\x98\x80");
	CHECK(loom__json_to_u64(loom__json_get(&v, "big"), &u) == 0);
	CHECK(u == UINT64_MAX);
	CHECK(loom__json_to_i64(loom__json_get(&v, "big"), &i) == -1); /* out of range */
	CHECK(loom__json_to_u64(&loom__json_get(&v, "a")->kids[1], &u) == -1);
	CHECK_EQ(loom__json_get(&v, "o")->type, JSON_OBJECT);
	loom__json_free(&v);
	static const struct {
		const char *text, *msg;
	} bad[] = {
		{"{\"a\":1,}", "expected a member name"}, {"[1 2]", "expected ',' or ']'"},
		{"{\"a\" 1}", "expected ':'"},          {"\"abc", "unterminated string"},
		{"[01]", "expected ',' or ']'"},         {"[1.]", "no digit after '.'"},
		{"\"\\x\"", "bad escape"},               {"\"\\ud800\"", "unpaired surrogate"},
		{"{} x", "trailing characters"},         {"", "unexpected end of input"},
		{"[\"a\tb\"]", "control character 0x09"}, {"nul", "unexpected character 'n'"},
	};
	for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
		CHECK_MSG(loom__json_parse(bad[k].text, strlen(bad[k].text), &v, err, sizeof err) == -1, "%s", bad[k].text);
		CHECK_CONTAINS(err, bad[k].msg);
		loom__json_free(&v);
	}
	/* nesting is bounded */
	{
		char deep[200];
		memset(deep, '[', 100);
		memset(deep + 100, ']', 100);
		CHECK(loom__json_parse(deep, 200, &v, err, sizeof err) == -1);
		CHECK_CONTAINS(err, "nesting deeper than 64");
		loom__json_free(&v);
	}
	return 0;
}

TEST(safetensors_round_trip)
{
	char dir[256], path[512];
	float a[6];
	uint16_t bf[4] = {0x3f80, 0xc000, 0x0000, 0x7f80}; /* 1, -2, 0, inf as bf16 */
	int64_t ids[3] = {-1, 0, INT64_MAX};
	float scalar = 3.5f;
	loom_st_tensor_t t[5] = {
		{"a/weights", LOOM_ST_F32, 2, {2, 3}, a, sizeof a},
		{"half \"quoted\"", LOOM_ST_BF16, 1, {4}, bf, sizeof bf},
		{"ids", LOOM_ST_I64, 1, {3}, ids, sizeof ids},
		{"empty", LOOM_ST_F32, 2, {0, 5}, NULL, 0},
		{"scalar", LOOM_ST_F32, 0, {0}, &scalar, 4},
	};
	const char *meta[4] = {"k", "v\n\"x\"", "n_head", "2"};
	loom_st_t *st;
	float back[6], bfback[4];
	uint64_t hlen;
	FILE *f;
	fill(a, 6, 1);
	CHECK(test_mkdtemp(dir, sizeof dir) == 0);
	snprintf(path, sizeof path, "%s/x.safetensors", dir);
	CHECK_OK(loom_st_write(path, t, 5, meta, 2));
	f = fopen(path, "rb");
	CHECK(f && fread(&hlen, 8, 1, f) == 1);
	fclose(f);
	CHECK_EQ(hlen % 8, 0);
	CHECK_EQ(file_size(path), 8 + (long)hlen + 24 + 8 + 24 + 0 + 4);
	CHECK_OK(loom_st_open(&st, path));
	CHECK_EQ(loom_st_count(st), 5);
	/* file order: offsets ascending, i.e. the order written (the empty tensor sits at offset 56) */
	CHECK_STREQ(loom_st_get(st, 0)->name, "a/weights");
	CHECK_STREQ(loom_st_get(st, 1)->name, "half \"quoted\"");
	CHECK_EQ(loom_st_get(st, 0)->shape[1], 3);
	CHECK_EQ(loom_st_get(st, 1)->dtype, LOOM_ST_BF16);
	CHECK(memcmp(loom_st_get(st, loom_st_find(st, "ids"))->data, ids, sizeof ids) == 0);
	CHECK_EQ(loom_st_get(st, loom_st_find(st, "scalar"))->ndim, 0);
	CHECK_EQ(loom_st_get(st, loom_st_find(st, "empty"))->nbytes, 0);
	CHECK_EQ(loom_st_find(st, "nope"), -1);
	CHECK_OK(loom_st_read_f32(st, 0, back, 6));
	CHECK(memcmp(back, a, sizeof a) == 0); /* bit-exact */
	/* a byte range of a tensor, as stored (elements 2..4 of a; the int64 ids), and ranges outside one */
	memset(back, 0, sizeof back);
	CHECK_OK(loom_st_read_bytes(st, 0, 2 * sizeof(float), 3 * sizeof(float), back));
	CHECK(memcmp(back, a + 2, 3 * sizeof(float)) == 0 && back[3] == 0.0f);
	int64_t idsback[3] = {0};
	CHECK_OK(loom_st_read_bytes(st, loom_st_find(st, "ids"), 8, 16, idsback));
	CHECK(idsback[0] == 0 && idsback[1] == INT64_MAX && idsback[2] == 0);
	CHECK_OK(loom_st_read_bytes(st, loom_st_find(st, "empty"), 0, 0, back));
	CHECK_EQ(loom_st_read_bytes(st, 0, 4 * sizeof(float), 3 * sizeof(float), back), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "bytes [16, 28) of tensor 'a/weights', which has 24");
	CHECK_EQ(loom_st_read_bytes(st, 0, 25, 0, back), LOOM_EINVAL);
	CHECK_EQ(loom_st_read_bytes(st, 5, 0, 0, back), LOOM_EINVAL);
	CHECK_OK(loom_st_read_f32(st, 1, bfback, 4));
	CHECK_FEQ(bfback[0], 1.0);
	CHECK_FEQ(bfback[1], -2.0);
	CHECK_FEQ(bfback[2], 0.0);
	CHECK(isinf(bfback[3]) && bfback[3] > 0);
	CHECK_ERR(loom_st_read_f32(st, 0, back, 5), LOOM_EINVAL);
	CHECK_ERR(loom_st_read_f32(st, loom_st_find(st, "ids"), back, 3), LOOM_EFORMAT);
	CHECK_CONTAINS(loom_errmsg(), "dtype I64");
	CHECK_EQ(loom_st_meta_count(st), 2);
	CHECK_STREQ(loom_st_meta(st, "k"), "v\n\"x\"");
	CHECK_STREQ(loom_st_meta(st, "n_head"), "2");
	CHECK(loom_st_meta(st, "zz") == NULL);
	loom_st_close(st);
	/* writer input errors */
	t[0].nbytes = 20;
	CHECK_ERR(loom_st_write(path, t, 1, NULL, 0), LOOM_EINVAL);
	t[0].nbytes = sizeof a;
	t[1].name = "a/weights";
	CHECK_ERR(loom_st_write(path, t, 2, NULL, 0), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "given twice");
	test_rmdir(dir);
	return 0;
}

TEST(safetensors_f16)
{
	char dir[256], path[512];
	/* 1.0, -0.5, 65504 (max), 2^-24 (smallest subnormal), -0 */
	uint16_t h[5] = {0x3c00, 0xb800, 0x7bff, 0x0001, 0x8000};
	loom_st_tensor_t t = {"h", LOOM_ST_F16, 1, {5}, h, sizeof h};
	loom_st_t *st;
	float out[5];
	CHECK(test_mkdtemp(dir, sizeof dir) == 0);
	snprintf(path, sizeof path, "%s/h.safetensors", dir);
	CHECK_OK(loom_st_write(path, &t, 1, NULL, 0));
	CHECK_OK(loom_st_open(&st, path));
	CHECK_OK(loom_st_read_f32(st, 0, out, 5));
	CHECK_FEQ(out[0], 1.0);
	CHECK_FEQ(out[1], -0.5);
	CHECK_FEQ(out[2], 65504.0);
	CHECK_FEQ(out[3], ldexp(1.0, -24));
	CHECK(out[4] == 0.0f && signbit(out[4]));
	loom_st_close(st);
	test_rmdir(dir);
	return 0;
}

/* Write a safetensors file by hand: header text + data bytes. */
static int write_st(const char *path, const char *header, const void *data, size_t n)
{
	size_t hl = strlen(header);
	uint64_t h = hl;
	unsigned char *buf = malloc(8 + hl + n + 1);
	int rc;
	memcpy(buf, &h, 8);
	memcpy(buf + 8, header, hl);
	if (n)
		memcpy(buf + 8 + hl, data, n);
	rc = test_write_file(path, buf, 8 + hl + n);
	free(buf);
	return rc;
}

TEST(safetensors_corrupt)
{
	char dir[256], path[512];
	float d[4] = {1, 2, 3, 4};
	loom_st_t *st;
	static const struct {
		const char *header;
		size_t data;
		const char *msg;
	} cases[] = {
		{"{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]", 16, "bad JSON header"},
		{"{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,20]}}", 16, "data_offsets [0, 20] out of range"},
		{"{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,16]}}", 16, "is 12 bytes but data_offsets span 16"},
		{"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\",\"shape\":[2],"
		 "\"data_offsets\":[4,12]}}", 16, "tensor 'b' starts at data offset 4, expected 8"},
		{"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 16,
		 "tensors cover 8 bytes of data but the file holds 16"},
		{"{\"a\":{\"dtype\":\"Q4\",\"shape\":[4],\"data_offsets\":[0,16]}}", 16, "unsupported dtype \"Q4\""},
		{"{\"a\":{\"dtype\":\"F32\",\"shape\":[-4],\"data_offsets\":[0,16]}}", 16, "shape[0] is not a non-negative"},
		{"{\"a\":{\"dtype\":\"F32\",\"shape\":[4]}}", 16, "\"data_offsets\" must be two"},
		{"{\"__metadata__\":{\"x\":1}}", 0, "value of 'x' is a number, expected a string"},
		{"[1,2]", 0, "JSON header is a array, expected an object"},
		{"{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},\"a\":{\"dtype\":\"F32\",\"shape\":[0],"
		 "\"data_offsets\":[16,16]}}", 16, "tensor 'a' appears twice"},
	};
	CHECK(test_mkdtemp(dir, sizeof dir) == 0);
	snprintf(path, sizeof path, "%s/bad.safetensors", dir);
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		CHECK(write_st(path, cases[i].header, d, cases[i].data) == 0);
		st = (loom_st_t *)1;
		CHECK_MSG(loom_st_open(&st, path) == LOOM_EFORMAT, "case %zu: %s", i, cases[i].header);
		CHECK(st == NULL);
		CHECK_CONTAINS(loom_errmsg(), path);
		CHECK_CONTAINS(loom_errmsg(), cases[i].msg);
	}
	/* header length beyond the file (a truncated file) */
	CHECK(write_st(path, "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", d, 16) == 0);
	CHECK_OK(loom_st_open(&st, path));
	loom_st_close(st);
	{
		uint64_t big = 1ull << 40;
		FILE *f = fopen(path, "r+b");
		CHECK(f && fwrite(&big, 8, 1, f) == 1);
		fclose(f);
		CHECK_ERR(loom_st_open(&st, path), LOOM_EFORMAT);
		CHECK_CONTAINS(loom_errmsg(), "header length 1099511627776 exceeds the file's");
	}
	CHECK(write_st(path, "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", d, 12) == 0);
	CHECK_ERR(loom_st_open(&st, path), LOOM_EFORMAT);
	CHECK_CONTAINS(loom_errmsg(), "out of range (data section is 12 bytes)");
	CHECK(test_write_file(path, "abc", 3) == 0);
	CHECK_ERR(loom_st_open(&st, path), LOOM_EFORMAT);
	CHECK_CONTAINS(loom_errmsg(), "3 bytes, too short");
	snprintf(path, sizeof path, "%s/missing.safetensors", dir);
	CHECK_ERR(loom_st_open(&st, path), LOOM_ENOENT);
	test_rmdir(dir);
	return 0;
}

TEST(gpt2_safetensors_round_trip)
{
	char dir[256], path[512];
	size_t n = loom_gpt2_num_params(&tiny);
	float *p = malloc(n * sizeof *p), *q = NULL;
	loom_gpt2_config_t cfg;
	loom_model_format_t fmt;
	loom_st_t *st;
	CHECK(test_mkdtemp(dir, sizeof dir) == 0);
	fill(p, n, 7);
	snprintf(path, sizeof path, "%s/model.safetensors", dir);
	CHECK_OK(loom_model_save(path, &tiny, p));
	CHECK_OK(loom_st_open(&st, path));
	CHECK_EQ(loom_st_count(st), loom_gpt2_num_tensors(&tiny));
	CHECK_STREQ(loom_st_meta(st, "n_head"), "2");
	CHECK_STREQ(loom_st_meta(st, "n_positions"), "16");
	CHECK_STREQ(loom_st_meta(st, "format"), "pt");
	{
		const loom_st_tensor_t *t = loom_st_get(st, loom_st_find(st, "h.1.mlp.c_fc.weight"));
		CHECK(t != NULL);
		CHECK_EQ(t->shape[0], 8);
		CHECK_EQ(t->shape[1], 32);
		t = loom_st_get(st, loom_st_find(st, "wte.weight"));
		CHECK_EQ(t->shape[0], 50);
	}
	loom_st_close(st);
	CHECK_OK(loom_model_config(path, 0, &cfg, &fmt));
	CHECK_EQ(fmt, LOOM_MODEL_SAFETENSORS);
	CHECK(memcmp(&cfg, &tiny, sizeof cfg) == 0);
	CHECK_OK(loom_model_load_alloc(path, 0, &cfg, &q));
	CHECK(memcmp(p, q, n * sizeof *p) == 0);
	free(q);
	free(p);
	test_rmdir(dir);
	return 0;
}

/* An HF-style file: "transformer." names, attn.bias buffers, no n_head metadata, lm_head (or none). */
static int write_hf_style(const char *path, const float *p, const float *lm_head, int drop, const char *extra)
{
	loom_st_tensor_t t[64];
	char names[64][96];
	int n = 0, nt = loom_gpt2_num_tensors(&tiny);
	static float mask[16 * 16];
	for (int i = 0; i < nt; i++) {
		loom_tensor_info_t info;
		loom_gpt2_tensor_info(&tiny, i, &info);
		if (i == drop)
			continue;
		snprintf(names[n], sizeof names[n], "transformer.%s", info.name);
		t[n] = (loom_st_tensor_t){names[n], LOOM_ST_F32, info.ndim, {info.shape[0], info.shape[1]},
		                          p + info.offset, info.numel * 4};
		n++;
		if (info.name[0] == 'h' && strstr(info.name, "ln_1.weight")) {
			int l = atoi(info.name + 2);
			snprintf(names[n], sizeof names[n], "transformer.h.%d.attn.bias", l);
			t[n] = (loom_st_tensor_t){names[n], LOOM_ST_F32, 4, {1, 1, 16, 16}, mask, sizeof mask};
			n++;
			snprintf(names[n], sizeof names[n], "h.%d.attn.masked_bias", l);
			t[n] = (loom_st_tensor_t){names[n], LOOM_ST_F32, 0, {0}, mask, 4};
			n++;
		}
	}
	if (lm_head)
		t[n++] = (loom_st_tensor_t){"lm_head.weight", LOOM_ST_F32, 2, {50, 8}, lm_head, 50 * 8 * 4};
	if (extra)
		t[n++] = (loom_st_tensor_t){extra, LOOM_ST_F32, 1, {8}, p, 32};
	return loom_st_write(path, t, n, NULL, 0);
}

TEST(gpt2_hf_style_file)
{
	char dir[256], path[512], cfgpath[512];
	size_t n = loom_gpt2_num_params(&tiny);
	float *p = malloc(n * sizeof *p), *q = malloc(n * sizeof *q);
	loom_gpt2_config_t cfg;
	const char *cj = "{\"activation_function\": \"gelu_new\", \"n_embd\": 8, \"n_head\": 2, \"n_layer\": 2,\n"
	                 " \"n_positions\": 16, \"vocab_size\": 50, \"architectures\": [\"GPT2LMHeadModel\"]}\n";
	CHECK(test_mkdtemp(dir, sizeof dir) == 0);
	fill(p, n, 11);
	snprintf(path, sizeof path, "%s/model.safetensors", dir);
	snprintf(cfgpath, sizeof cfgpath, "%s/config.json", dir);
	CHECK_OK(write_hf_style(path, p, p, -1, NULL));
	/* no metadata, no config.json, no hint: a clear error */
	CHECK_ERR(loom_model_config(path, 0, &cfg, NULL), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "the number of heads is unknown");
	CHECK_CONTAINS(loom_errmsg(), "--n-head");
	/* the hint */
	CHECK_OK(loom_model_config(path, 2, &cfg, NULL));
	CHECK(memcmp(&cfg, &tiny, sizeof cfg) == 0);
	/* config.json beside the file */
	CHECK(test_write_file(cfgpath, cj, strlen(cj)) == 0);
	memset(&cfg, 0, sizeof cfg);
	CHECK_OK(loom_model_config(path, 0, &cfg, NULL));
	CHECK(memcmp(&cfg, &tiny, sizeof cfg) == 0);
	memset(q, 0, n * sizeof *q);
	CHECK_OK(loom_model_load(path, &cfg, q));
	CHECK(memcmp(p, q, n * sizeof *p) == 0);
	/* an lm_head that differs from wte (an untied head) is refused */
	memcpy(q, p, n * sizeof *q);
	q[17] += 1.0f;
	CHECK_OK(write_hf_style(path, p, q, -1, NULL));
	CHECK_ERR(loom_model_load(path, &cfg, q), LOOM_ENOTSUP);
	CHECK_CONTAINS(loom_errmsg(), "lm_head.weight differs from wte.weight");
	/* missing tensor, extra tensor, wrong shape */
	CHECK_OK(write_hf_style(path, p, NULL, 5, NULL)); /* tensor 5 = h.0.attn.c_attn.bias */
	CHECK_ERR(loom_model_load(path, &cfg, q), LOOM_EFORMAT);
	CHECK_CONTAINS(loom_errmsg(), "missing tensor 'h.0.attn.c_attn.bias'");
	CHECK_OK(write_hf_style(path, p, NULL, -1, "transformer.h.0.mystery"));
	CHECK_ERR(loom_model_load(path, &cfg, q), LOOM_EFORMAT);
	CHECK_CONTAINS(loom_errmsg(), "unexpected tensor 'transformer.h.0.mystery'");
	{
		loom_gpt2_config_t wrong = tiny;
		wrong.n_embd = 4; /* every shape now differs */
		wrong.n_head = 2;
		CHECK_OK(write_hf_style(path, p, NULL, -1, NULL));
		CHECK_ERR(loom_model_load(path, &wrong, q), LOOM_EFORMAT);
		CHECK_CONTAINS(loom_errmsg(), "tensor 'transformer.wte.weight' has shape [50,8], expected [50,4]");
	}
	free(p);
	free(q);
	test_rmdir(dir);
	return 0;
}

TEST(llmc_round_trip)
{
	char dir[256], st1[512], bin[512], st2[512];
	size_t n = loom_gpt2_num_params(&tiny);
	float *p = malloc(n * sizeof *p), *q = NULL;
	loom_gpt2_config_t cfg;
	loom_model_format_t fmt;
	FILE *f;
	int32_t h[256];
	float *raw;
	size_t C = 8, L = 2, Vp = 128, T = 16, nraw;
	CHECK(test_mkdtemp(dir, sizeof dir) == 0);
	fill(p, n, 5);
	snprintf(st1, sizeof st1, "%s/a.safetensors", dir);
	snprintf(bin, sizeof bin, "%s/a.bin", dir);
	snprintf(st2, sizeof st2, "%s/b.safetensors", dir);
	CHECK_OK(loom_model_save(st1, &tiny, p));
	/* safetensors -> bin -> safetensors through the CLI */
	{
		char cmd[4096], out[4096];
		/* --force: b.safetensors' config.json is a.safetensors' (the same model), beside both */
		snprintf(cmd, sizeof cmd, "%s convert %s %s && %s convert %s %s --force", test_loom_bin(), st1, bin,
		         test_loom_bin(), bin, st2);
		CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 30), 0);
		CHECK_CONTAINS(out, "(safetensors) -> ");
		CHECK_CONTAINS(out, "(llm.c): L=2 H=2 C=8 T=16 V=50");
		snprintf(cmd, sizeof cmd, "cmp %s %s", st1, st2);
		CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 30), 0); /* bit-exact, byte for byte */
	}
	/* the .bin is llm.c's layout, checked element by element against the HF tensors */
	nraw = Vp * C + T * C + L * (12 * C * C + 13 * C) + 2 * C;
	CHECK_EQ(file_size(bin), 1024 + (long)(nraw * 4));
	raw = malloc(nraw * sizeof *raw);
	f = fopen(bin, "rb");
	CHECK(f && fread(h, 4, 256, f) == 256 && fread(raw, 4, nraw, f) == nraw);
	fclose(f);
	CHECK_EQ(h[0], 20240326);
	CHECK_EQ(h[1], 3);
	CHECK_EQ(h[2], 16);
	CHECK_EQ(h[3], 50);
	CHECK_EQ(h[4], 2);
	CHECK_EQ(h[5], 2);
	CHECK_EQ(h[6], 8);
	CHECK_EQ(h[7], 128);
	CHECK_FEQ(raw[49 * C + 7], p[49 * C + 7]); /* last real wte row */
	CHECK_FEQ(raw[50 * C], 0.0);              /* padding */
	CHECK_FEQ(raw[Vp * C + 3], p[50 * C + 3]); /* wpe */
	{
		loom_tensor_info_t qkv, ln2b, fcproj;
		float *base = raw + Vp * C + T * C;
		/* ln1w (L,C), ln1b (L,C), then qkvw (L,3C,C): file[l][o][i] = HF c_attn.weight[i][o] */
		float *qkvw = base + 2 * L * C;
		loom_gpt2_tensor_info(&tiny, 2 + 12 * 1 + 2, &qkv); /* h.1.attn.c_attn.weight [C,3C] */
		CHECK_FEQ(qkvw[1 * 3 * C * C + 17 * C + 5], p[qkv.offset + 5 * 3 * C + 17]);
		/* ln2b of layer 1: after qkvb (L,3C), attprojw (L,C,C), attprojb (L,C), ln2w (L,C) */
		float *ln2bp = qkvw + L * 3 * C * C + L * 3 * C + L * C * C + L * C + L * C;
		loom_gpt2_tensor_info(&tiny, 2 + 12 * 1 + 7, &ln2b);
		CHECK_FEQ(ln2bp[C + 6], p[ln2b.offset + 6]);
		/* fcprojw (L,C,4C): file[l][o][i] = HF mlp.c_proj.weight [4C,C] [i][o] */
		float *fcprojw = ln2bp + L * C + L * 4 * C * C + L * 4 * C;
		loom_gpt2_tensor_info(&tiny, 2 + 12 * 0 + 10, &fcproj);
		CHECK_FEQ(fcprojw[3 * 4 * C + 30], p[fcproj.offset + 30 * C + 3]);
		/* lnfb is last */
		CHECK_FEQ(raw[nraw - 1], p[n - 1]);
	}
	CHECK_OK(loom_model_config(bin, 0, &cfg, &fmt));
	CHECK_EQ(fmt, LOOM_MODEL_LLMC);
	CHECK_OK(loom_model_load_alloc(bin, 0, &cfg, &q));
	CHECK(memcmp(p, q, n * sizeof *p) == 0);
	free(q);
	/* truncated .bin and a bad version */
	CHECK(test_write_file(bin, h, 1024) == 0);
	CHECK_ERR(loom_model_load_alloc(bin, 0, &cfg, &q), LOOM_EFORMAT);
	CHECK_CONTAINS(loom_errmsg(), "1024 bytes, expected");
	CHECK(q == NULL);
	h[1] = 4;
	CHECK(test_write_file(bin, h, 1024) == 0);
	CHECK_ERR(loom_model_config(bin, 0, &cfg, NULL), LOOM_EFORMAT);
	CHECK_CONTAINS(loom_errmsg(), "llm.c model version 4 (expected 3, fp32, or 5, bf16)");
	free(raw);
	free(p);
	test_rmdir(dir);
	return 0;
}


/* `loom convert` writes config.json beside a .safetensors and meta_NNNNNN.json beside nanochat's
 * model_NNNNNN.pt, files the user did not name: an existing one is never replaced without --force
 * (the refusal names it and writes nothing), and the last line says which it wrote or replaced. */
TEST(convert_keeps_unasked_files)
{
	char dir[256], path[512], cmd[PATH_MAX + 1024], out[4096], text[256], loom[PATH_MAX];
	size_t n = loom_gpt2_num_params(&tiny);
	float *p = malloc(n * sizeof *p);
	loom_model_config_t cfg;
	CHECK(realpath(test_loom_bin(), loom) != NULL); /* the commands cd into the test's directory */
	CHECK(test_mkdtemp(dir, sizeof dir) == 0);
	fill(p, n, 9);
	snprintf(path, sizeof path, "%s/a.bin", dir);
	CHECK_OK(loom_model_save(path, &tiny, p));
	snprintf(cmd, sizeof cmd, "cd %s && mkdir out bare nc && echo mine > out/config.json && echo mine > "
	         "bare/config.json && echo mine > nc/meta_000006.json", dir);
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 30), 0);
	/* into a directory holding a config.json: refused, nothing written */
	snprintf(cmd, sizeof cmd, "cd %s && %s convert a.bin out/model.safetensors", dir, loom);
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 30), 2);
	CHECK_STREQ(out, "loom convert: out/config.json exists and writing out/model.safetensors would replace it (a "
	            ".safetensors gets config.json beside it, Hugging Face's layout); nothing was written: move it away, "
	            "convert into another directory, or give --force to replace it\n");
	snprintf(path, sizeof path, "%s/out/config.json", dir);
	CHECK_STREQ(test_read_text(path, text, sizeof text), "mine\n");
	snprintf(path, sizeof path, "%s/out/model.safetensors", dir);
	CHECK_EQ(file_size(path), -1);
	/* --force replaces it, and says so */
	snprintf(cmd, sizeof cmd, "cd %s && %s convert a.bin out/model.safetensors --force", dir, loom);
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 30), 0);
	CHECK_STREQ(out, "a.bin (llm.c) -> out/model.safetensors (safetensors): L=2 H=2 C=8 T=16 V=50, 2288 parameters; "
	            "replaced out/config.json (--force)\n");
	CHECK_OK(loom_model_config(path, 0, &cfg, NULL));
	CHECK_EQ(cfg.n_layer, 2);
	snprintf(path, sizeof path, "%s/out/config.json", dir);
	CHECK_CONTAINS(test_read_text(path, text, sizeof text), "\"n_layer\": 2,");
	/* a .bin writes nothing beside it: no refusal there */
	snprintf(cmd, sizeof cmd, "cd %s && %s convert out/model.safetensors out/b.bin", dir, loom);
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 30), 0);
	CHECK(!strstr(out, "config.json"));
	/* a bare file name writes ./config.json: refused when there is one, said when there is not */
	snprintf(cmd, sizeof cmd, "cd %s/bare && %s convert ../a.bin m.safetensors", dir, loom);
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 30), 2);
	CHECK_CONTAINS(out, "loom convert: ./config.json exists and writing m.safetensors would replace it");
	snprintf(path, sizeof path, "%s/bare/m.safetensors", dir);
	CHECK_EQ(file_size(path), -1);
	snprintf(cmd, sizeof cmd, "cd %s/bare && rm config.json && %s convert ../a.bin m.safetensors", dir, loom);
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 30), 0);
	CHECK_CONTAINS(out, "2288 parameters; wrote ./config.json\n");
	snprintf(path, sizeof path, "%s/bare/config.json", dir);
	CHECK_CONTAINS(test_read_text(path, text, sizeof text), "\"n_layer\": 2,");
	/* nanochat's meta file beside model_NNNNNN.pt: refused before the converter runs */
	snprintf(cmd, sizeof cmd, "cd %s && %s convert out/model.safetensors nc/model_000006.pt", dir, loom);
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 30), 2);
	CHECK_CONTAINS(out, "loom convert: nc/meta_000006.json exists and writing nc/model_000006.pt would replace it "
	               "(nanochat's meta file goes beside its model_NNNNNN.pt); nothing was written");
	snprintf(path, sizeof path, "%s/nc/meta_000006.json", dir);
	CHECK_STREQ(test_read_text(path, text, sizeof text), "mine\n");
	snprintf(path, sizeof path, "%s/nc/model_000006.pt", dir);
	CHECK_EQ(file_size(path), -1);
	free(p);
	test_rmdir(dir);
	return 0;
}

TEST(llmc_bf16_read)
{
	char dir[256], path[512];
	size_t n = loom_gpt2_num_params(&tiny), nraw = 128 * 8 + 16 * 8 + 2 * (12 * 64 + 13 * 8) + 16;
	int32_t h[256] = {20240326, 5, 16, 50, 2, 2, 8, 128};
	uint16_t *raw = calloc(nraw, 2);
	float *q = malloc(n * sizeof *q);
	unsigned char *buf = malloc(1024 + nraw * 2);
	loom_tensor_info_t fcb;
	CHECK(test_mkdtemp(dir, sizeof dir) == 0);
	for (size_t i = 0; i < nraw; i++)
		raw[i] = 0x3f80; /* 1.0 */
	raw[0] = 0xc040;     /* wte[0][0] = -3 */
	memcpy(buf, h, 1024);
	memcpy(buf + 1024, raw, nraw * 2);
	snprintf(path, sizeof path, "%s/m.bin", dir);
	CHECK(test_write_file(path, buf, 1024 + nraw * 2) == 0);
	CHECK_OK(loom_model_load(path, &tiny, q));
	CHECK_FEQ(q[0], -3.0);
	loom_gpt2_tensor_info(&tiny, 2 + 9, &fcb);
	CHECK_FEQ(q[fcb.offset + 31], 1.0);
	free(raw), free(q), free(buf);
	test_rmdir(dir);
	return 0;
}

TEST(optim_state_round_trip)
{
	char dir[256], path[512];
	size_t n = loom_gpt2_num_params(&tiny);
	float *m = malloc(n * 4), *v = malloc(n * 4), *m2 = malloc(n * 4), *v2 = malloc(n * 4);
	loom_gpt2_config_t other = tiny;
	loom_st_t *st;
	CHECK(test_mkdtemp(dir, sizeof dir) == 0);
	fill(m, n, 1), fill(v, n, 2);
	snprintf(path, sizeof path, "%s/optim.safetensors", dir);
	CHECK_OK(loom_optim_save(path, &tiny, m, v));
	CHECK_OK(loom_st_open(&st, path));
	CHECK(loom_st_find(st, "h.1.mlp.c_proj.weight.exp_avg_sq") >= 0);
	CHECK(loom_st_find(st, "wte.weight.exp_avg") >= 0);
	loom_st_close(st);
	CHECK_OK(loom_optim_load(path, &tiny, m2, v2));
	CHECK(memcmp(m, m2, n * 4) == 0 && memcmp(v, v2, n * 4) == 0);
	other.n_head = 4;
	CHECK_ERR(loom_optim_load(path, &other, m2, v2), LOOM_EMISMATCH);
	CHECK_CONTAINS(loom_errmsg(), "optimizer state has n_head=2, the model has 4");
	CHECK_ERR(loom_optim_save(path, &tiny, m, NULL), LOOM_EINVAL);
	free(m), free(v), free(m2), free(v2);
	test_rmdir(dir);
	return 0;
}

TEST(kv_state_round_trip)
{
	char dir[256], path[512];
	loom_kv_t *kv, *kv2;
	loom_loader_state_t ls = {12345678901234ull, 3, UINT64_MAX, 1000, 4, 64, 1, 1, 2, 0}, ls2;
	int64_t i;
	uint64_t u;
	double d;
	const char *s;
	CHECK(test_mkdtemp(dir, sizeof dir) == 0);
	snprintf(path, sizeof path, "%s/state.json", dir);
	CHECK_OK(loom_kv_create(&kv));
	CHECK_OK(loom_kv_set_str(kv, "format", "loom-train"));
	CHECK_OK(loom_kv_set_i64(kv, "step", INT64_MIN));
	CHECK_OK(loom_kv_set_u64(kv, "rng", UINT64_MAX));
	CHECK_OK(loom_kv_set_f64(kv, "lr", 0.1));
	CHECK_OK(loom_kv_set_f64(kv, "tiny", 4.9e-324));
	CHECK_OK(loom_kv_set_f64(kv, "negzero", -0.0));
	CHECK_OK(loom_kv_set_f64(kv, "nan", NAN));
	CHECK_OK(loom_kv_set_f64(kv, "inf", -INFINITY));
	CHECK_OK(loom_kv_set_str(kv, "note", "a \"quoted\"\nline\\"));
	CHECK_OK(loom_kv_set_loader(kv, "loader.train", &ls));
	CHECK_OK(loom_kv_set_i64(kv, "step", 10)); /* replaces */
	CHECK_OK(loom_kv_save(kv, path));
	loom_kv_destroy(kv);
	CHECK_OK(loom_kv_load(&kv2, path));
	CHECK_OK(loom_kv_get_str(kv2, "format", &s));
	CHECK_STREQ(s, "loom-train");
	CHECK_OK(loom_kv_get_i64(kv2, "step", &i));
	CHECK_EQ(i, 10);
	CHECK_OK(loom_kv_get_u64(kv2, "rng", &u));
	CHECK(u == UINT64_MAX);
	CHECK_OK(loom_kv_get_f64(kv2, "lr", &d));
	CHECK(d == 0.1);
	CHECK_OK(loom_kv_get_f64(kv2, "tiny", &d));
	CHECK(d == 4.9e-324);
	CHECK_OK(loom_kv_get_f64(kv2, "negzero", &d));
	CHECK(d == 0.0 && signbit(d));
	CHECK_OK(loom_kv_get_f64(kv2, "nan", &d));
	CHECK(isnan(d));
	CHECK_OK(loom_kv_get_f64(kv2, "inf", &d));
	CHECK(isinf(d) && d < 0);
	CHECK_OK(loom_kv_get_str(kv2, "note", &s));
	CHECK_STREQ(s, "a \"quoted\"\nline\\");
	CHECK_OK(loom_kv_get_loader(kv2, "loader.train", &ls2));
	CHECK(memcmp(&ls, &ls2, sizeof ls) == 0);
	/* errors name the key and the file */
	CHECK_ERR(loom_kv_get_i64(kv2, "absent", &i), LOOM_ENOENT);
	CHECK_CONTAINS(loom_errmsg(), "no key 'absent'");
	CHECK_CONTAINS(loom_errmsg(), path);
	CHECK_ERR(loom_kv_get_i64(kv2, "note", &i), LOOM_EFORMAT);
	CHECK_ERR(loom_kv_get_i64(kv2, "lr", &i), LOOM_EFORMAT);
	CHECK_CONTAINS(loom_errmsg(), "'lr' is 0.10000000000000001, expected a 64-bit integer");
	CHECK_ERR(loom_kv_get_u64(kv2, "loader.train.B", &u), LOOM_OK);
	CHECK_ERR(loom_kv_get_str(kv2, "step", &s), LOOM_EFORMAT);
	CHECK_EQ(loom_kv_count(kv2), 18);
	loom_kv_destroy(kv2);
	/* a damaged state file */
	{
		const char *bad = "{\"format\": \"loom-state\", \"version\": 1, \"values\": {\"step\": 1";
		CHECK(test_write_file(path, bad, strlen(bad)) == 0);
		CHECK_ERR(loom_kv_load(&kv2, path), LOOM_EFORMAT);
		CHECK_CONTAINS(loom_errmsg(), path);
		CHECK_CONTAINS(loom_errmsg(), "bad JSON");
		bad = "{\"format\": \"loom-state\", \"version\": 2, \"values\": {}}";
		CHECK(test_write_file(path, bad, strlen(bad)) == 0);
		CHECK_ERR(loom_kv_load(&kv2, path), LOOM_EFORMAT);
		CHECK_CONTAINS(loom_errmsg(), "version 2 (expected 1)");
	}
	test_rmdir(dir);
	return 0;
}

static int ckpt_write(const char *dir, int64_t step, const char *content)
{
	loom_ckpt_writer_t w;
	char path[1400];
	int rc = loom_ckpt_begin(&w, dir, step);
	if (rc)
		return rc;
	loom_ckpt_file(&w, "model.safetensors", path, sizeof path);
	if (test_write_file(path, content, strlen(content)))
		return 1;
	loom_ckpt_file(&w, "state.json", path, sizeof path);
	if (test_write_file(path, "{}", 2))
		return 1;
	return loom_ckpt_commit(&w);
}

TEST(ckpt_atomic_latest)
{
	char dir[256], root[512], path[1400], got[1400];
	int64_t step;
	loom_ckpt_writer_t w;
	CHECK(test_mkdtemp(dir, sizeof dir) == 0);
	snprintf(root, sizeof root, "%s/ckpts", dir);
	CHECK_ERR(loom_ckpt_latest(root, got, sizeof got, &step), LOOM_ENOENT);
	CHECK_OK(ckpt_write(root, 10, "ten"));
	CHECK_OK(ckpt_write(root, 20, "twenty"));
	CHECK_OK(loom_ckpt_latest(root, got, sizeof got, &step));
	CHECK_EQ(step, 20);
	snprintf(path, sizeof path, "%s/step_00000020", root);
	CHECK_STREQ(got, path);
	CHECK_OK(loom_ckpt_verify(got));
	/* a half-written checkpoint (begin without commit) stays invisible */
	CHECK_OK(loom_ckpt_begin(&w, root, 30));
	loom_ckpt_file(&w, "model.safetensors", path, sizeof path);
	CHECK(test_write_file(path, "partial", 7) == 0);
	snprintf(path, sizeof path, "%s/.tmp-step_00000030/model.safetensors", root);
	CHECK_EQ(file_size(path), 7);
	CHECK_OK(loom_ckpt_latest(root, got, sizeof got, &step));
	CHECK_EQ(step, 20);
	/* a newest step directory without MANIFEST is an error, never a silent fall-back to step 20 */
	snprintf(path, sizeof path, "%s/step_00000040", root);
	CHECK(mkdir(path, 0777) == 0);
	CHECK_ERR(loom_ckpt_latest(root, got, sizeof got, &step), LOOM_EFORMAT);
	CHECK_CONTAINS(loom_errmsg(), "step_00000040: no MANIFEST (incomplete checkpoint); older checkpoints that verify: ");
	CHECK_CONTAINS(loom_errmsg(), "/ckpts/step_00000020, ");
	CHECK_CONTAINS(loom_errmsg(), "/ckpts/step_00000010");
	CHECK_ERR(loom_ckpt_verify(path), LOOM_EFORMAT);
	CHECK_CONTAINS(loom_errmsg(), "no MANIFEST (incomplete checkpoint)");
	CHECK(rmdir(path) == 0);
	/* a damaged one (a file truncated after commit): latest is an error naming the file */
	CHECK_OK(ckpt_write(root, 50, "fifty"));
	snprintf(path, sizeof path, "%s/step_00000050/model.safetensors", root);
	CHECK(test_write_file(path, "fif", 3) == 0);
	CHECK_ERR(loom_ckpt_latest(root, got, sizeof got, &step), LOOM_EFORMAT);
	CHECK_CONTAINS(loom_errmsg(), "model.safetensors has 3 bytes, MANIFEST says 5");
	CHECK_EQ(step, 50);
	snprintf(path, sizeof path, "%s/step_00000050", root);
	CHECK_ERR(loom_ckpt_verify(path), LOOM_EFORMAT);
	CHECK_CONTAINS(loom_errmsg(), "model.safetensors has 3 bytes, MANIFEST says 5");
	snprintf(path, sizeof path, "%s/step_00000050/state.json", root);
	CHECK(remove(path) == 0);
	snprintf(path, sizeof path, "%s/step_00000050", root);
	CHECK_ERR(loom_ckpt_verify(path), LOOM_EFORMAT);
	CHECK_CONTAINS(loom_errmsg(), "is missing");
	test_rmdir(path);
	/* the same step again replaces it; finishing step 30 after a restart overwrites the leftover */
	CHECK_OK(ckpt_write(root, 20, "twenty-bis"));
	snprintf(path, sizeof path, "%s/step_00000020/model.safetensors", root);
	CHECK_EQ(file_size(path), 10);
	CHECK_OK(ckpt_write(root, 30, "thirty"));
	CHECK_OK(loom_ckpt_latest(root, got, sizeof got, &step));
	CHECK_EQ(step, 30);
	snprintf(path, sizeof path, "%s/step_00000030/model.safetensors", root);
	CHECK_EQ(file_size(path), 6);
	snprintf(path, sizeof path, "%s/.tmp-step_00000030", root);
	CHECK(file_size(path) == -1);
	/* abort removes the temp dir */
	CHECK_OK(loom_ckpt_begin(&w, root, 60));
	loom_ckpt_abort(&w);
	snprintf(path, sizeof path, "%s/.tmp-step_00000060", root);
	CHECK(file_size(path) == -1);
	/* prune keeps the newest complete ones and removes temp dirs */
	CHECK_OK(loom_ckpt_begin(&w, root, 70));
	CHECK_OK(loom_ckpt_prune(root, 2));
	snprintf(path, sizeof path, "%s/step_00000010", root);
	CHECK(file_size(path) == -1);
	snprintf(path, sizeof path, "%s/step_00000020", root);
	CHECK(file_size(path) > 0);
	snprintf(path, sizeof path, "%s/.tmp-step_00000070", root);
	CHECK(file_size(path) == -1);
	CHECK_OK(loom_ckpt_latest(root, got, sizeof got, &step));
	CHECK_EQ(step, 30);
	test_rmdir(dir);
	return 0;
}

/* CRC-32C: the standard check values (RFC 3720 B.4 and "123456789"), the SSE4.2 and table paths agree
 * on every length and alignment, and a CRC continues over pieces. */
TEST(crc32c_values)
{
	unsigned char buf[600], zeros[32], ones[32], inc[32];
	memset(zeros, 0, 32), memset(ones, 0xff, 32);
	for (int i = 0; i < 32; i++)
		inc[i] = (unsigned char)i;
	CHECK_EQ(loom__crc32c(0, "123456789", 9), 0xe3069283u);
	CHECK_EQ(loom__crc32c(0, zeros, 32), 0x8a9136aau);
	CHECK_EQ(loom__crc32c(0, ones, 32), 0x62a8ab43u);
	CHECK_EQ(loom__crc32c(0, inc, 32), 0x46dd794eu);
	CHECK_EQ(loom__crc32c_portable(0, "123456789", 9), 0xe3069283u);
	CHECK_EQ(loom__crc32c(0, "", 0), 0u);
	uint32_t x = 7;
	for (size_t i = 0; i < sizeof buf; i++)
		x = x * 1664525u + 1013904223u, buf[i] = (unsigned char)(x >> 24);
	for (size_t off = 0; off < 8; off++)
		for (size_t n = 0; n + off <= 520; n += 1 + n / 16) {
			uint32_t a = loom__crc32c(0, buf + off, n), b = loom__crc32c_portable(0, buf + off, n);
			CHECK_MSG(a == b, "offset %zu length %zu: %08x vs %08x", off, n, a, b);
			CHECK_EQ(loom__crc32c(loom__crc32c(0, buf + off, n / 3), buf + off + n / 3, n - n / 3), a);
		}
	return 0;
}

/* Finding 6 of issue 13: a flipped bit in tensor data loaded (MANIFEST held sizes only), the files of
 * one step could sit under another step's name, and a file of another checkpoint could be copied in. */
TEST(ckpt_checksums_and_steps)
{
	char dir[256], root[512], path[1400], p2[1500], got[1400];
	int64_t step;
	loom_kv_t *kv;
	CHECK(test_mkdtemp(dir, sizeof dir) == 0);
	snprintf(root, sizeof root, "%s/ckpts", dir);
	CHECK_OK(ckpt_write(root, 10, "ten"));
	CHECK_OK(ckpt_write(root, 20, "twenty"));
	snprintf(path, sizeof path, "%s/step_00000020", root);
	CHECK_OK(loom_ckpt_verify_step(path, &step));
	CHECK_EQ(step, 20);
	/* MANIFEST: the step, and size and CRC-32C of each file */
	snprintf(p2, sizeof p2, "%s/MANIFEST", path);
	CHECK_OK(loom_kv_load(&kv, p2));
	uint64_t crc, size;
	CHECK_OK(loom_kv_get_u64(kv, "crc32c:model.safetensors", &crc));
	CHECK_OK(loom_kv_get_u64(kv, "size:model.safetensors", &size));
	CHECK_EQ(crc, (uint64_t)loom__crc32c(0, "twenty", 6));
	CHECK_EQ(size, 6);
	CHECK_OK(loom_kv_get_u64(kv, "crc32c:state.json", &crc));
	CHECK_EQ(crc, (uint64_t)loom__crc32c(0, "{}", 2));
	loom_kv_destroy(kv);
	/* one changed byte, same size */
	snprintf(p2, sizeof p2, "%s/model.safetensors", path);
	CHECK(test_write_file(p2, "twentz", 6) == 0);
	CHECK_ERR(loom_ckpt_verify(path), LOOM_EFORMAT);
	CHECK_CONTAINS(loom_errmsg(), "step_00000020: model.safetensors has CRC-32C ");
	CHECK_CONTAINS(loom_errmsg(), "(damaged checkpoint: its contents changed after it was written)");
	CHECK_ERR(loom_ckpt_latest(root, got, sizeof got, &step), LOOM_EFORMAT);
	CHECK_CONTAINS(loom_errmsg(), "the latest checkpoint is damaged: ");
	CHECK_CONTAINS(loom_errmsg(), "older checkpoints that verify: ");
	CHECK_CONTAINS(loom_errmsg(), "/ckpts/step_00000010");
	CHECK(test_write_file(p2, "twenty", 6) == 0);
	CHECK_OK(loom_ckpt_verify(path));
	/* a file that MANIFEST does not list (from another checkpoint) */
	snprintf(p2, sizeof p2, "%s/optim.safetensors", path);
	CHECK(test_write_file(p2, "x", 1) == 0);
	CHECK_ERR(loom_ckpt_verify(path), LOOM_EFORMAT);
	CHECK_CONTAINS(loom_errmsg(), "optim.safetensors is not listed in its MANIFEST (a file that does not belong to "
	                              "the checkpoint of step 20)");
	CHECK(remove(p2) == 0);
	/* the directory's name and MANIFEST's step disagree */
	snprintf(p2, sizeof p2, "%s/step_00000030", root);
	CHECK(rename(path, p2) == 0);
	CHECK_ERR(loom_ckpt_verify(p2), LOOM_EFORMAT);
	CHECK_CONTAINS(loom_errmsg(), "step_00000030: the directory is named for step 30 but its MANIFEST is of step 20");
	CHECK(rename(p2, path) == 0);
	/* a MANIFEST written before checksums (no "checksum" key) is checked by size */
	snprintf(p2, sizeof p2, "%s/MANIFEST", path);
	CHECK_OK(loom_kv_create(&kv));
	CHECK_OK(loom_kv_set_u64(kv, "size:model.safetensors", 6));
	CHECK_OK(loom_kv_set_u64(kv, "size:state.json", 2));
	CHECK_OK(loom_kv_set_i64(kv, "step", 20));
	CHECK_OK(loom_kv_set_i64(kv, "files", 2));
	CHECK_OK(loom_kv_save(kv, p2));
	loom_kv_destroy(kv);
	CHECK_OK(loom_ckpt_verify(path));
	/* ... but one that names checksums needs every file's */
	CHECK_OK(loom_kv_load(&kv, p2));
	CHECK_OK(loom_kv_set_str(kv, "checksum", "crc32c"));
	CHECK_OK(loom_kv_save(kv, p2));
	loom_kv_destroy(kv);
	CHECK_ERR(loom_ckpt_verify(path), LOOM_EFORMAT);
	CHECK_CONTAINS(loom_errmsg(), "has no valid checksum of model.safetensors");
	test_rmdir(dir);
	return 0;
}

static int exists_path(const char *root, const char *name)
{
	char p[1400];
	struct stat sb;
	snprintf(p, sizeof p, "%s/%s", root, name);
	return stat(p, &sb) == 0;
}

/* Finding 5 of issue 13: a kill during a prune left a checkpoint without one of its files under its
 * final name, skipped and never pruned. Prunes now rename first; recover finishes old leftovers. */
TEST(ckpt_prune_recover)
{
	char dir[256], root[512], path[1500], p2[1500];
	CHECK(test_mkdtemp(dir, sizeof dir) == 0);
	snprintf(root, sizeof root, "%s/ckpts", dir);
	CHECK_OK(loom_ckpt_recover(root)); /* no directory yet: nothing to do */
	for (int s = 10; s <= 40; s += 10)
		CHECK_OK(ckpt_write(root, s, "data"));
	/* what an interrupted prune of an older loom left: step 10 without its state.json */
	snprintf(path, sizeof path, "%s/step_00000010/state.json", root);
	CHECK(remove(path) == 0);
	/* leftovers of interrupted saves and of a prune of this version */
	snprintf(path, sizeof path, "%s/.tmp-step_00000050", root);
	CHECK(mkdir(path, 0777) == 0);
	snprintf(path, sizeof path, "%s/.pruned-step_00000005", root);
	CHECK(mkdir(path, 0777) == 0);
	/* a commit that died between moving the old step 40 aside and renaming the new one into place */
	snprintf(path, sizeof path, "%s/step_00000040", root);
	snprintf(p2, sizeof p2, "%s/.old-step_00000040", root);
	CHECK(rename(path, p2) == 0);
	/* a damaged (complete, wrong checksum) old checkpoint is kept: only incomplete ones are leftovers */
	snprintf(path, sizeof path, "%s/step_00000020/model.safetensors", root);
	CHECK(test_write_file(path, "dada", 4) == 0);
	CHECK_OK(loom_ckpt_recover(root));
	CHECK(!exists_path(root, "step_00000010"));
	CHECK(exists_path(root, "step_00000020"));
	CHECK(exists_path(root, "step_00000030"));
	CHECK(!exists_path(root, ".tmp-step_00000050"));
	CHECK(!exists_path(root, ".pruned-step_00000005"));
	CHECK(!exists_path(root, ".old-step_00000040"));
	snprintf(path, sizeof path, "%s/step_00000040", root);
	CHECK_OK(loom_ckpt_verify(path));
	/* prune keeps the newest complete ones and removes every step directory older than them */
	CHECK_OK(loom_ckpt_prune(root, 1));
	CHECK(!exists_path(root, "step_00000020"));
	CHECK(!exists_path(root, "step_00000030"));
	CHECK(exists_path(root, "step_00000040"));
	int n = -1;
	CHECK_OK(loom_ckpt_count(root, &n));
	CHECK_EQ(n, 1);
	test_rmdir(dir);
	return 0;
}

/* Issue 34: the checkpoints newer than the step a run continues from move aside whole, into a
 * directory of their own per resume, and pruning and latest see only the live branch afterwards. */
TEST(ckpt_set_aside)
{
	char dir[256], root[512], path[1500], p2[1500];
	loom_ckpt_aside_t a;
	int64_t step;
	CHECK(test_mkdtemp(dir, sizeof dir) == 0);
	snprintf(root, sizeof root, "%s/ckpts", dir);
	CHECK_OK(loom_ckpt_set_aside(root, 0, &a)); /* no directory: nothing to do */
	CHECK_EQ(a.n, 0);
	CHECK_STREQ(a.into, "");
	for (int s = 10; s <= 40; s += 10)
		CHECK_OK(ckpt_write(root, s, "data"));
	/* a damaged newer one moves too (it is the abandoned branch's, not this run's) */
	snprintf(path, sizeof path, "%s/step_00000040/model.safetensors", root);
	CHECK(test_write_file(path, "dada", 4) == 0);
	CHECK_OK(loom_ckpt_set_aside(root, 40, &a)); /* nothing newer than 40 */
	CHECK_EQ(a.n, 0);
	CHECK(!exists_path(root, "abandoned-at-step_00000040"));
	CHECK_OK(loom_ckpt_set_aside(root, 20, &a));
	CHECK_EQ(a.n, 2);
	snprintf(path, sizeof path, "%s/abandoned-at-step_00000020", root);
	CHECK_STREQ(a.into, path);
	CHECK_STREQ(a.names, "step_00000030, step_00000040");
	CHECK(!exists_path(root, "step_00000030") && !exists_path(root, "step_00000040"));
	CHECK(exists_path(root, "step_00000010") && exists_path(root, "step_00000020"));
	snprintf(path, sizeof path, "%s/abandoned-at-step_00000020/step_00000030", root);
	CHECK_OK(loom_ckpt_verify(path));
	CHECK_OK(loom_ckpt_latest(root, path, sizeof path, &step));
	CHECK_EQ(step, 20);
	/* the live branch grows past 20; resuming at 20 again abandons it into a second directory */
	CHECK_OK(ckpt_write(root, 30, "live"));
	CHECK_OK(loom_ckpt_set_aside(root, 20, &a));
	CHECK_EQ(a.n, 1);
	snprintf(path, sizeof path, "%s/abandoned-at-step_00000020.2", root);
	CHECK_STREQ(a.into, path);
	CHECK_STREQ(a.names, "step_00000030");
	snprintf(path, sizeof path, "%s/abandoned-at-step_00000020.2/step_00000030/model.safetensors", root);
	CHECK_EQ(file_size(path), 4);
	snprintf(path, sizeof path, "%s/abandoned-at-step_00000020/step_00000030/model.safetensors", root);
	CHECK_EQ(file_size(path), 4); /* "data", untouched */
	/* pruning counts only the directory's own checkpoints: the moved ones are never pruned */
	CHECK_OK(ckpt_write(root, 30, "new!"));
	CHECK_OK(loom_ckpt_prune(root, 1));
	CHECK(!exists_path(root, "step_00000010") && !exists_path(root, "step_00000020"));
	CHECK(exists_path(root, "step_00000030"));
	CHECK(exists_path(root, "abandoned-at-step_00000020/step_00000040"));
	CHECK(exists_path(root, "abandoned-at-step_00000020.2/step_00000030"));
	int n = -1;
	CHECK_OK(loom_ckpt_count(root, &n));
	CHECK_EQ(n, 1);
	/* names already taken (here by files) are skipped */
	snprintf(path, sizeof path, "%s/abandoned-at-step_00000000", root);
	snprintf(p2, sizeof p2, "%s/abandoned-at-step_00000000.2", root);
	CHECK(test_write_file(path, "x", 1) == 0 && test_write_file(p2, "x", 1) == 0);
	CHECK_OK(loom_ckpt_set_aside(root, 0, &a)); /* the name after them */
	CHECK_EQ(a.n, 1);
	CHECK(exists_path(root, "abandoned-at-step_00000000.3/step_00000030"));
	CHECK_OK(loom_ckpt_set_aside(root, 0, NULL)); /* nothing left; a NULL report */
	test_rmdir(dir);
	return 0;
}

/* Finding 4 and 6 of issue 13: an unusable --save-dir was found only at the first save, and a
 * checkpoint directory could be given as --save-dir (nesting checkpoints inside a checkpoint). */
TEST(ckpt_save_dir_checks)
{
	char dir[256], path[1400], root[512];
	CHECK(test_mkdtemp(dir, sizeof dir) == 0);
	snprintf(path, sizeof path, "%s/a/b/c", dir);
	CHECK_OK(loom_ckpt_check_save_dir(path));
	CHECK(!exists_path(dir, "a")); /* checked, nothing created */
	snprintf(path, sizeof path, "%s/file", dir);
	CHECK(test_write_file(path, "x", 1) == 0);
	CHECK_ERR(loom_ckpt_check_save_dir(path), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "/file is not a directory");
	snprintf(path, sizeof path, "%s/file/sub", dir);
	CHECK_ERR(loom_ckpt_check_save_dir(path), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "/file is not a directory");
	CHECK_ERR(loom_ckpt_check_save_dir("/proc/self/ck"), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "is in /proc, which cannot hold files");
	snprintf(root, sizeof root, "%s/ck", dir);
	CHECK_OK(ckpt_write(root, 4, "four"));
	CHECK_OK(loom_ckpt_check_save_dir(root));
	snprintf(path, sizeof path, "%s/step_00000004", root);
	CHECK_ERR(loom_ckpt_check_save_dir(path), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "is inside the checkpoint ");
	snprintf(path, sizeof path, "%s/step_00000004/more/ck", root);
	CHECK_ERR(loom_ckpt_check_save_dir(path), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "/ck/step_00000004 (it holds a MANIFEST)");
	test_rmdir(dir);
	return 0;
}

/* An independent reader (Python's json + struct) checks what the writer produced. */
TEST(safetensors_python_cross_check)
{
	char dir[256], path[512], cmd[4096], out[4096];
	size_t n = loom_gpt2_num_params(&tiny);
	float *p = malloc(n * sizeof *p);
	double sum = 0;
	CHECK(test_mkdtemp(dir, sizeof dir) == 0);
	fill(p, n, 9);
	for (size_t i = 0; i < n; i++)
		sum += p[i];
	snprintf(path, sizeof path, "%s/model.safetensors", dir);
	CHECK_OK(loom_model_save(path, &tiny, p));
	snprintf(cmd, sizeof cmd,
	         "/usr/bin/python3 -c '\n"
	         "import json, struct, sys\n"
	         "b = open(sys.argv[1], \"rb\").read()\n"
	         "n = struct.unpack(\"<Q\", b[:8])[0]\n"
	         "h = json.loads(b[8:8+n]); data = b[8+n:]\n"
	         "m = h.pop(\"__metadata__\")\n"
	         "end = 0; s = 0.0\n"
	         "for k, v in sorted(h.items(), key=lambda kv: kv[1][\"data_offsets\"][0]):\n"
	         "    a, e = v[\"data_offsets\"]; assert a == end, k; end = e\n"
	         "    cnt = 1\n"
	         "    for d in v[\"shape\"]: cnt *= d\n"
	         "    assert v[\"dtype\"] == \"F32\" and e - a == 4 * cnt, k\n"
	         "    s += sum(struct.unpack(\"<%%df\" %% cnt, data[a:e]))\n"
	         "assert end == len(data)\n"
	         "print(len(h), m[\"n_layer\"], m[\"n_head\"], m[\"n_embd\"], m[\"n_positions\"], m[\"vocab_size\"],\n"
	         "      h[\"h.1.attn.c_attn.weight\"][\"shape\"], \"%%.6f\" %% s, n %% 8)\n"
	         "' %s",
	         path);
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 60), 0);
	{
		char want[200];
		snprintf(want, sizeof want, "28 2 2 8 16 50 [8, 24] %.6f 0", sum);
		CHECK_CONTAINS(out, want);
	}
	free(p);
	test_rmdir(dir);
	return 0;
}

/* Hugging Face's layout written by an independent writer (Python's json + struct): names sorted as
 * the reference library sorts them, "transformer." prefix, attn.bias / masked_bias buffers, a tied
 * lm_head, no metadata, n_head only in config.json. Parameter i of the HF order holds i / 1000. */
TEST(gpt2_hf_file_from_python)
{
	char dir[256], path[512], cmd[4096], out[4096];
	loom_gpt2_config_t cfg;
	float *p = NULL;
	size_t n;
	CHECK(test_mkdtemp(dir, sizeof dir) == 0);
	snprintf(path, sizeof path, "%s/model.safetensors", dir);
	snprintf(cmd, sizeof cmd,
	         "/usr/bin/python3 -c '\n"
	         "import json, struct, sys, os\n"
	         "L, C, T, V = 2, 8, 16, 50\n"
	         "t = [(\"wte.weight\", [V, C]), (\"wpe.weight\", [T, C])]\n"
	         "for l in range(L):\n"
	         "    for nm, sh in [(\"ln_1.weight\", [C]), (\"ln_1.bias\", [C]), (\"attn.c_attn.weight\", [C, 3*C]),\n"
	         "                   (\"attn.c_attn.bias\", [3*C]), (\"attn.c_proj.weight\", [C, C]), (\"attn.c_proj.bias\", [C]),\n"
	         "                   (\"ln_2.weight\", [C]), (\"ln_2.bias\", [C]), (\"mlp.c_fc.weight\", [C, 4*C]),\n"
	         "                   (\"mlp.c_fc.bias\", [4*C]), (\"mlp.c_proj.weight\", [4*C, C]), (\"mlp.c_proj.bias\", [C])]:\n"
	         "        t.append((\"h.%%d.%%s\" %% (l, nm), sh))\n"
	         "t += [(\"ln_f.weight\", [C]), (\"ln_f.bias\", [C])]\n"
	         "vals, i = {}, 0\n"
	         "for nm, sh in t:\n"
	         "    k = 1\n"
	         "    for d in sh: k *= d\n"
	         "    vals[\"transformer.\" + nm] = (sh, [(i + j) / 1000 for j in range(k)]); i += k\n"
	         "for l in range(L):\n"
	         "    vals[\"transformer.h.%%d.attn.bias\" %% l] = ([1, 1, T, T], [1.0] * T * T)\n"
	         "    vals[\"transformer.h.%%d.attn.masked_bias\" %% l] = ([], [-1e4])\n"
	         "vals[\"lm_head.weight\"] = vals[\"transformer.wte.weight\"]\n"
	         "hdr, data = {}, b\"\"\n"
	         "for nm in sorted(vals):\n"
	         "    sh, v = vals[nm]; b = struct.pack(\"<%%df\" %% len(v), *v)\n"
	         "    hdr[nm] = {\"dtype\": \"F32\", \"shape\": sh, \"data_offsets\": [len(data), len(data) + len(b)]}; data += b\n"
	         "h = json.dumps(hdr).encode(); h += b\" \" * (-len(h) %% 8)\n"
	         "open(sys.argv[1], \"wb\").write(struct.pack(\"<Q\", len(h)) + h + data)\n"
	         "json.dump({\"n_head\": 2, \"n_layer\": L, \"n_embd\": C, \"n_positions\": T, \"vocab_size\": V},\n"
	         "          open(os.path.join(os.path.dirname(sys.argv[1]), \"config.json\"), \"w\"))\n"
	         "print(\"wrote\", i)\n"
	         "' %s",
	         path);
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 60), 0);
	CHECK_CONTAINS(out, "wrote 2288");
	CHECK_OK(loom_model_load_alloc(path, 0, &cfg, &p));
	CHECK(memcmp(&cfg, &tiny, sizeof cfg) == 0);
	n = loom_gpt2_num_params(&cfg);
	for (size_t i = 0; i < n; i++)
		CHECK_MSG(p[i] == (float)((double)i / 1000), "param %zu: %.9g", i, p[i]);
	free(p);
	test_rmdir(dir);
	return 0;
}

TEST(info_cli)
{
	char dir[256], path[512], cmd[2048], out[16384];
	size_t n = loom_gpt2_num_params(&tiny);
	float *p = calloc(n, sizeof *p);
	CHECK(test_mkdtemp(dir, sizeof dir) == 0);
	snprintf(path, sizeof path, "%s/m.safetensors", dir);
	CHECK_OK(loom_model_save(path, &tiny, p));
	snprintf(cmd, sizeof cmd, "%s info %s", test_loom_bin(), path);
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 30), 0);
	CHECK_CONTAINS(out, "GPT-2: n_layer=2 n_head=2 n_embd=8 n_positions=16 vocab_size=50, 2288 parameters");
	CHECK_CONTAINS(out, "h.1.mlp.c_proj.weight");
	CHECK_CONTAINS(out, "[32, 8]");
	snprintf(path, sizeof path, "%s/m.bin", dir);
	CHECK_OK(loom_model_save(path, &tiny, p));
	snprintf(cmd, sizeof cmd, "%s info %s", test_loom_bin(), path);
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 30), 0);
	CHECK_CONTAINS(out, "llm.c GPT-2 model");
	CHECK_CONTAINS(out, "(padded 128), 2288 parameters");
	CHECK_CONTAINS(out, "qkvw");
	snprintf(path, sizeof path, "%s/junk", dir);
	CHECK(test_write_file(path, "abcdefghijkl", 12) == 0);
	snprintf(cmd, sizeof cmd, "%s info %s", test_loom_bin(), path);
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 30), 1);
	CHECK_CONTAINS(out, "junk: header length");
	free(p);
	test_rmdir(dir);
	return 0;
}

/* ---- hostile files (issue 13, findings 2 and 7): rejected before anything is allocated ---------- */

static int write_llmc_header(const char *path, const int32_t *h8, size_t extra)
{
	int32_t h[256] = {0};
	unsigned char *buf = calloc(1, 1024 + extra);
	int rc;
	memcpy(h, h8, 8 * sizeof *h);
	memcpy(buf, h, sizeof h);
	rc = test_write_file(path, buf, 1024 + extra);
	free(buf);
	return rc;
}

/* loom_model_load_alloc(path) fails with `code` without a single allocation (the fault injector's
 * first allocation would fail: it must not be reached), and the message holds `msg`. */
static int rejects_without_allocating(const char *path, int code, const char *msg)
{
	loom_gpt2_config_t cfg;
	float *p = (float *)1;
	int rc, hit;
	loom__fault_alloc_set(1);
	rc = loom_model_load_alloc(path, 0, &cfg, &p);
	hit = loom__fault_alloc_hit();
	loom__fault_alloc_set(0);
	CHECK_EQ(rc, code);
	CHECK_EQ(hit, 0);
	CHECK(p == NULL);
	CHECK_CONTAINS(loom_errmsg(), path);
	CHECK_CONTAINS(loom_errmsg(), msg);
	return 0;
}

TEST(llmc_hostile_headers)
{
	char dir[256], path[512];
	/* finding 2: the parameter count overflowed size_t, 1 byte was allocated and written past */
	const int32_t wrap[8] = {20240326, 3, INT32_MAX - 13, INT32_MAX, 1, 1, 1 << 30, INT32_MAX};
	/* finding 7: 50 s and 1.9 GB before "out of memory" */
	const int32_t layers[8] = {20240326, 3, 1024, 50257, 20240326, 12, 768, 50304};
	const int32_t ok[8] = {20240326, 3, 16, 50, 2, 2, 8, 128};
	int32_t h[8];
	CHECK(test_mkdtemp(dir, sizeof dir) == 0);
	snprintf(path, sizeof path, "%s/wrap.bin", dir);
	CHECK(write_llmc_header(path, wrap, 0) == 0);
	CHECK(rejects_without_allocating(path, LOOM_EFORMAT, "n_embd = 1073741824 is outside loom's limits") == 0);
	snprintf(path, sizeof path, "%s/layers.bin", dir);
	CHECK(write_llmc_header(path, layers, 4096) == 0);
	CHECK(rejects_without_allocating(path, LOOM_EFORMAT, "n_layer = 20240326 is outside loom's limits [1, 1024]") ==
	      0);
	/* every field at its limit + 1, and a padded vocab beyond the limit */
	for (int f = 2; f <= 7; f++) {
		static const int32_t over[8] = {0, 0, (1 << 20) + 1, (1 << 24) + 1, 1025, 65537, 65537, (1 << 24) + 1};
		memcpy(h, ok, sizeof h);
		h[f] = over[f];
		CHECK(write_llmc_header(path, h, 0) == 0);
		CHECK(rejects_without_allocating(path, LOOM_EFORMAT, f == 7 ? "padded vocab" : "outside loom's limits") == 0);
	}
	/* dimensions within the limits but a file one byte short: known at config time, not after allocating */
	{
		size_t n = 128 * 8 + 16 * 8 + 2 * (12 * 64 + 13 * 8) + 16;
		CHECK(write_llmc_header(path, ok, 4 * n - 1) == 0);
		CHECK(rejects_without_allocating(path, LOOM_EFORMAT, "bytes, expected") == 0);
		CHECK(write_llmc_header(path, ok, 4 * n) == 0);
		loom_gpt2_config_t cfg;
		CHECK_OK(loom_model_config(path, 0, &cfg, NULL));
		CHECK_EQ(cfg.n_layer, 2);
	}
	/* not a regular file */
	CHECK(rejects_without_allocating(dir, LOOM_EINVAL, "is a directory, expected a regular file") == 0);
	snprintf(path, sizeof path, "%s/fifo.bin", dir);
	CHECK(mkfifo(path, 0600) == 0);
	CHECK(rejects_without_allocating(path, LOOM_EINVAL, "is a FIFO") == 0); /* would block without O_NONBLOCK */
	test_rmdir(dir);
	return 0;
}

/* A safetensors file from a JSON header whose tensors all have `data` bytes (one F32 each... as given). */
static int write_st_sized(const char *path, const char *header, size_t data)
{
	void *d = calloc(1, data + 1);
	int rc = write_st(path, header, d, data);
	free(d);
	return rc;
}

/* The tiny model's tensors (zeros, n_head in __metadata__) without `skip` and with an extra [8] tensor
 * named `extra`; n_meta 0 leaves n_head out. */
static int write_tiny_variant(const char *path, const char *skip, const char *extra, int n_meta)
{
	int nt = loom_gpt2_num_tensors(&tiny), k = 0, rc;
	loom_st_tensor_t t[64];
	loom_tensor_info_t info[64];
	const char *meta[2] = {"n_head", "2"};
	float *w = calloc(loom_gpt2_num_params(&tiny), sizeof *w);
	for (int i = 0; i < nt; i++) {
		loom_gpt2_tensor_info(&tiny, i, &info[k]);
		if (skip && strcmp(info[k].name, skip) == 0)
			continue;
		t[k] = (loom_st_tensor_t){.name = info[k].name, .dtype = LOOM_ST_F32, .ndim = info[k].ndim,
		                          .shape = {info[k].shape[0], info[k].shape[1]}, .data = w + info[k].offset,
		                          .nbytes = info[k].numel * sizeof(float)};
		k++;
	}
	if (extra)
		t[k++] = (loom_st_tensor_t){.name = extra, .dtype = LOOM_ST_F32, .ndim = 1, .shape = {8}, .data = w,
		                            .nbytes = 32};
	rc = loom_st_write(path, t, k, meta, n_meta);
	free(w);
	return rc;
}

TEST(safetensors_hostile_model)
{
	char dir[256], path[512], cfgpath[512], hdr[2048];
	loom_gpt2_config_t cfg;
	float *p = (float *)1;
	const char *base = "\"wte.weight\":{\"dtype\":\"F32\",\"shape\":[4,8],\"data_offsets\":[0,128]},"
	                   "\"wpe.weight\":{\"dtype\":\"F32\",\"shape\":[2,8],\"data_offsets\":[128,192]}";
	CHECK(test_mkdtemp(dir, sizeof dir) == 0);
	snprintf(path, sizeof path, "%s/m.safetensors", dir);
	/* finding 7: one tensor named h.1048575.x made the layer count 2^20 (38 s, 13.4 GB) */
	snprintf(hdr, sizeof hdr, "{\"__metadata__\":{\"n_head\":\"2\"},%s,\"h.1048575.x\":{\"dtype\":\"F32\","
	         "\"shape\":[1],\"data_offsets\":[192,196]}}", base);
	CHECK(write_st_sized(path, hdr, 196) == 0);
	CHECK_ERR(loom_model_config(path, 0, &cfg, NULL), LOOM_EFORMAT);
	CHECK_CONTAINS(loom_errmsg(), "a layer index is larger than the file's 3 tensors allow");
	CHECK_ERR(loom_model_load_alloc(path, 0, &cfg, &p), LOOM_EFORMAT);
	CHECK(p == NULL);
	/* a layer index the tensor count allows, but not every tensor of the table: rejected at config
	 * time (before it, config succeeded and the load allocated first) */
	CHECK(write_tiny_variant(path, "h.1.mlp.c_proj.bias", NULL, 1) == 0);
	CHECK_ERR(loom_model_config(path, 0, &cfg, NULL), LOOM_EFORMAT);
	CHECK_CONTAINS(loom_errmsg(), "missing tensor 'h.1.mlp.c_proj.bias'");
	CHECK(write_tiny_variant(path, NULL, "h.0.bogus", 1) == 0);
	CHECK_ERR(loom_model_config(path, 0, &cfg, NULL), LOOM_EFORMAT);
	CHECK_CONTAINS(loom_errmsg(), "unexpected tensor 'h.0.bogus'");
	CHECK(write_tiny_variant(path, NULL, "h.2.ln_1.weight", 1) == 0); /* layer 2 of 2 */
	CHECK_ERR(loom_model_config(path, 0, &cfg, NULL), LOOM_EFORMAT);
	CHECK(write_tiny_variant(path, "h.0.ln_1.weight", "h.00.ln_1.weight", 1) == 0); /* not canonical decimal */
	CHECK_ERR(loom_model_config(path, 0, &cfg, NULL), LOOM_EFORMAT);
	CHECK_CONTAINS(loom_errmsg(), "unexpected tensor 'h.00.ln_1.weight'");
	CHECK(write_tiny_variant(path, NULL, NULL, 1) == 0);
	CHECK_OK(loom_model_config(path, 0, &cfg, NULL));
	CHECK_EQ(cfg.n_layer, 2);
	/* a whole valid model still loads (the tiny round trip covers the values) */
	{
		size_t n = loom_gpt2_num_params(&tiny);
		float *w = calloc(n, sizeof *w);
		CHECK_OK(loom_model_save(path, &tiny, w));
		free(w);
		CHECK_OK(loom_model_load_alloc(path, 0, &cfg, &p));
		CHECK_EQ(cfg.n_layer, 2);
		free(p);
	}
	/* config.json beside a model without n_head: /dev/zero read until out of memory, a FIFO blocked */
	CHECK(write_tiny_variant(path, NULL, NULL, 0) == 0);
	snprintf(cfgpath, sizeof cfgpath, "%s/config.json", dir);
	unlink(cfgpath);
	CHECK(symlink("/dev/zero", cfgpath) == 0);
	CHECK_ERR(loom_model_config(path, 0, &cfg, NULL), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "config.json: is a character device, expected a regular file");
	unlink(cfgpath);
	CHECK(mkfifo(cfgpath, 0600) == 0);
	CHECK_ERR(loom_model_config(path, 0, &cfg, NULL), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "config.json: is a FIFO");
	unlink(cfgpath);
	{ /* a config.json over its 1 MB cap: refused before a byte is read or allocated */
		FILE *f = fopen(cfgpath, "w");
		CHECK(f != NULL);
		fclose(f);
		CHECK(truncate(cfgpath, (1 << 20) + 1) == 0);
		char *text;
		size_t len;
		CHECK_ERR(loom_model_config(path, 0, &cfg, NULL), LOOM_EFORMAT);
		CHECK_CONTAINS(loom_errmsg(), "config.json: 1048577 bytes, more than the 1048576");
		loom__fault_alloc_set(1);
		CHECK_ERR(loom__read_file_max(cfgpath, 1 << 20, &text, &len), LOOM_EFORMAT);
		CHECK_EQ(loom__fault_alloc_hit(), 0);
		loom__fault_alloc_set(0);
		unlink(cfgpath);
	}
	test_rmdir(dir);
	return 0;
}

TEST(safetensors_header_limits)
{
	char dir[256], path[512];
	loom_st_t *st;
	FILE *f;
	CHECK(test_mkdtemp(dir, sizeof dir) == 0);
	snprintf(path, sizeof path, "%s/big.safetensors", dir);
	/* a 99 MB header took 5 GB to parse: over 16 MB it is refused before any parsing (the fault
	 * injector's third allocation, the first of the parser, is never reached) */
	{
		uint64_t hl = (16u << 20) + 1;
		f = fopen(path, "wb");
		CHECK(f && fwrite(&hl, 8, 1, f) == 1);
		fclose(f);
		CHECK(truncate(path, 8 + (off_t)hl) == 0); /* sparse: costs no disk */
		loom__fault_alloc_set(3);
		CHECK_ERR(loom_st_open(&st, path), LOOM_EFORMAT);
		CHECK_EQ(loom__fault_alloc_hit(), 0);
		loom__fault_alloc_set(0);
		CHECK_CONTAINS(loom_errmsg(), "header of 16777217 bytes, more than loom's limit of 16777216");
	}
	/* [0,0,...] with 2^19 + 1 values: more values than a header may hold */
	{
		size_t nv = (1u << 19), len = 2 * nv + 1;
		char *h = malloc(len + 1);
		h[0] = '[';
		for (size_t i = 0; i < nv; i++)
			h[1 + 2 * i] = '0', h[2 + 2 * i] = i + 1 < nv ? ',' : ']';
		h[len] = 0;
		CHECK(write_st(path, h, NULL, 0) == 0);
		free(h);
		CHECK_ERR(loom_st_open(&st, path), LOOM_EFORMAT);
		CHECK_CONTAINS(loom_errmsg(), "more values than the limit");
	}
	/* __metadata__ twice */
	CHECK(write_st(path, "{\"__metadata__\":{},\"__metadata__\":{}}", NULL, 0) == 0);
	CHECK_ERR(loom_st_open(&st, path), LOOM_EFORMAT);
	CHECK_CONTAINS(loom_errmsg(), "__metadata__ is given twice");
	/* the name index: find every tensor of a header listed out of name order */
	CHECK(write_st(path, "{\"c\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},\"a\":{\"dtype\":\"U8\","
	                     "\"shape\":[1],\"data_offsets\":[1,2]},\"b\":{\"dtype\":\"U8\",\"shape\":[1],"
	                     "\"data_offsets\":[2,3]}}", "xyz", 3) == 0);
	CHECK_OK(loom_st_open(&st, path));
	CHECK_EQ(*(const char *)loom_st_get(st, loom_st_find(st, "c"))->data, 'x');
	CHECK_EQ(*(const char *)loom_st_get(st, loom_st_find(st, "a"))->data, 'y');
	CHECK_EQ(*(const char *)loom_st_get(st, loom_st_find(st, "b"))->data, 'z');
	CHECK_EQ(loom_st_find(st, "d"), -1);
	CHECK_EQ(loom_st_find(st, ""), -1);
	loom_st_close(st);
	CHECK_ERR(loom_st_open(&st, dir), LOOM_EINVAL);
	test_rmdir(dir);
	return 0;
}

TEST(kv_hostile_files)
{
	char dir[256], path[512];
	loom_kv_t *kv;
	FILE *f;
	CHECK(test_mkdtemp(dir, sizeof dir) == 0);
	snprintf(path, sizeof path, "%s/state.json", dir);
	/* more keys than the limit: linear insertion would make this quadratic */
	f = fopen(path, "w");
	CHECK(f != NULL);
	fputs("{\"format\": \"loom-state\", \"version\": 1, \"values\": {", f);
	for (int i = 0; i <= 16384; i++)
		fprintf(f, "%s\"k%d\": %d", i ? "," : "", i, i);
	fputs("}}", f);
	fclose(f);
	CHECK_ERR(loom_kv_load(&kv, path), LOOM_EFORMAT);
	CHECK_CONTAINS(loom_errmsg(), "16385 values, more than the limit of 16384");
	/* over the 4 MB cap: refused before allocating */
	CHECK(truncate(path, (4 << 20) + 1) == 0);
	loom__fault_alloc_set(1);
	CHECK_ERR(loom_kv_load(&kv, path), LOOM_EFORMAT);
	CHECK_EQ(loom__fault_alloc_hit(), 0);
	loom__fault_alloc_set(0);
	unlink(path);
	CHECK(mkfifo(path, 0600) == 0);
	CHECK_ERR(loom_kv_load(&kv, path), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "is a FIFO");
	test_rmdir(dir);
	return 0;
}

/* `loom info` shows the mesh a checkpoint was written with (state.json's mesh.*): a tp 2 x pp 2 run
 * under gpipe and a ZeRO-1 run on dp 2; a checkpoint from before the mesh was recorded (no mesh.*
 * keys) says only its data-parallel size, and still resumes. */
TEST(info_shows_checkpoint_mesh)
{
	char dir[512], cmd[4096], out[16384], path[700];
	const char *loom = test_loom_bin();
	loom_kv_t *kv;
	uint32_t crc;
	uint64_t size;
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(test_make_token_data(dir, 257, 4096));
#define FLAGS "--n-layer 2 --n-head 4 --n-embd 64 --vocab-size 257 --n-positions 32 --batch-size 1 --threads 1 " \
	          "--peak-flops 1e10"
	snprintf(cmd, sizeof cmd, "OMP_NUM_THREADS=1 %s train --nproc 4 --tp 2 --pp 2 --schedule gpipe --grad-accum 2 "
	         "--train-data '%s/train_*.bin' " FLAGS " --steps 1 --save-dir %s/a && %s info %s/a", loom, dir, dir, loom,
	         dir);
	int st = test_run_cmd(cmd, out, sizeof out, 120);
	CHECK_MSG(st == 0, "exit %d: %s", st, out);
	CHECK_CONTAINS(out, "\nmesh: dp 1 x tp 2 x pp 2 = 4 ranks, ZeRO 0, pipeline schedule gpipe\n");
	snprintf(cmd, sizeof cmd, "OMP_NUM_THREADS=1 %s train --nproc 2 --zero 1 --train-data '%s/train_*.bin' " FLAGS
	         " --steps 1 --save-dir %s/b && %s info %s/b/step_00000001", loom, dir, dir, loom, dir);
	st = test_run_cmd(cmd, out, sizeof out, 120);
	CHECK_MSG(st == 0, "exit %d: %s", st, out);
	CHECK_CONTAINS(out, "\nmesh: dp 2 x tp 1 x pp 1 = 2 ranks, ZeRO 1, pipeline schedule 1f1b\n");
	/* as an older loom wrote it: state.json without the mesh (and MANIFEST's size and checksum to match) */
	snprintf(cmd, sizeof cmd, "sed -i '/\"mesh\\./d' %s/a/step_00000001/state.json", dir);
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 30), 0);
	snprintf(path, sizeof path, "%s/a/step_00000001/state.json", dir);
	CHECK_OK(loom__crc32c_file(path, &crc, &size));
	snprintf(path, sizeof path, "%s/a/step_00000001/MANIFEST", dir);
	CHECK_OK(loom_kv_load(&kv, path));
	CHECK_OK(loom_kv_set_u64(kv, "size:state.json", size));
	CHECK_OK(loom_kv_set_u64(kv, "crc32c:state.json", crc));
	CHECK_OK(loom_kv_save(kv, path));
	loom_kv_destroy(kv);
	snprintf(cmd, sizeof cmd, "%s info %s/a/step_00000001", loom, dir);
	st = test_run_cmd(cmd, out, sizeof out, 30);
	CHECK_MSG(st == 0, "exit %d: %s", st, out);
	CHECK_CONTAINS(out, "\nmesh: dp 1 (tp, pp and ZeRO were not recorded by the loom that wrote it)\n");
	CHECK_MSG(!strstr(out, "mesh.tp"), "%s", out);
	snprintf(cmd, sizeof cmd, "OMP_NUM_THREADS=1 %s train --grad-accum 2 --train-data '%s/train_*.bin' " FLAGS
	         " --steps 2 --save-dir %s/a --resume", loom, dir, dir);
	st = test_run_cmd(cmd, out, sizeof out, 120);
	CHECK_MSG(st == 0, "exit %d: %s", st, out);
	CHECK_CONTAINS(out, "resumed from ");
	CHECK_CONTAINS(out, "step 2/2 | loss ");
#undef FLAGS
	test_rmdir(dir);
	return 0;
}
