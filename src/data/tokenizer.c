/* tokenizer.c: token tables in llm.c's tokenizer format, and the byte-level tokenizer.
 *
 * File: a 256 x uint32 header (magic 20240328, version, vocab size, and in version 2 the end-of-text
 * id), then for each token a uint8 length (>= 1) and that many bytes. Version 1 implies GPT-2's
 * eot 50256. Only the byte-level table (tokens 0-255 are the single bytes) can encode; GPT-2's BPE
 * tables decode only. Invariant: bytes[i] holds lengths[i] bytes plus a NUL. Loading checks the size
 * (a regular file, at most TOKENIZER_MAX_BYTES, 2 bytes per token at least) before allocating. */
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "core/fileio.h"
#include "loom/data.h"

/* The largest tokenizer file read (docs/data.md): 2^24 tokens of up to 255 bytes would be 4 GB, real
 * ones are under 1 MB (GPT-2's: 50257 tokens, 330 KB). */
#define TOKENIZER_MAX_BYTES (256u << 20)

static const char eot_text[] = "<|endoftext|>";

void loom_tokenizer_free(loom_tokenizer_t *tok)
{
	if (tok->bytes)
		for (int i = 0; i < tok->vocab_size; i++)
			free(tok->bytes[i]);
	free(tok->bytes);
	free(tok->lengths);
	memset(tok, 0, sizeof *tok);
}

static int alloc_table(loom_tokenizer_t *tok, int vocab)
{
	memset(tok, 0, sizeof *tok);
	tok->bytes = loom__calloc((size_t)vocab, sizeof *tok->bytes);
	tok->lengths = loom__calloc((size_t)vocab, sizeof *tok->lengths);
	if (!tok->bytes || !tok->lengths) {
		free(tok->bytes), free(tok->lengths);
		memset(tok, 0, sizeof *tok);
		return loom_seterr(LOOM_ENOMEM, "tokenizer: out of memory for %d tokens", vocab);
	}
	tok->vocab_size = vocab;
	return LOOM_OK;
}

static int set_token(loom_tokenizer_t *tok, int i, const void *p, int len)
{
	tok->bytes[i] = loom__malloc((size_t)len + 1);
	if (!tok->bytes[i])
		return loom_seterr(LOOM_ENOMEM, "tokenizer: out of memory");
	memcpy(tok->bytes[i], p, (size_t)len);
	tok->bytes[i][len] = 0;
	tok->lengths[i] = len;
	return LOOM_OK;
}

/* Byte-level when every token b < 256 is the single byte b. */
static int is_byte_level(const loom_tokenizer_t *tok)
{
	if (tok->vocab_size < 256)
		return 0;
	for (int b = 0; b < 256; b++)
		if (tok->lengths[b] != 1 || tok->bytes[b][0] != b)
			return 0;
	return 1;
}

int loom_tokenizer_init_bytes(loom_tokenizer_t *tok)
{
	int rc = alloc_table(tok, LOOM_BYTE_VOCAB);
	for (int b = 0; rc == LOOM_OK && b < 256; b++) {
		unsigned char c = (unsigned char)b;
		rc = set_token(tok, b, &c, 1);
	}
	if (rc == LOOM_OK)
		rc = set_token(tok, LOOM_BYTE_EOT, eot_text, (int)strlen(eot_text));
	if (rc != LOOM_OK) {
		loom_tokenizer_free(tok);
		return rc;
	}
	tok->eot_token = LOOM_BYTE_EOT;
	tok->byte_level = 1;
	return LOOM_OK;
}

int loom_tokenizer_load(loom_tokenizer_t *tok, const char *path)
{
	char *buf;
	size_t len, pos = 1024;
	uint32_t hdr[256];
	int rc;
	memset(tok, 0, sizeof *tok);
	if ((rc = loom__read_file_max(path, TOKENIZER_MAX_BYTES, &buf, &len)) != LOOM_OK)
		return loom_seterr(rc, "tokenizer %s", loom_errmsg());
	if (len < sizeof hdr) {
		rc = loom_seterr(LOOM_EFORMAT, "tokenizer %s: %zu bytes, shorter than the 1024-byte header", path, len);
		goto out;
	}
	memcpy(hdr, buf, sizeof hdr);
	if (hdr[0] != LOOM_TOKENIZER_MAGIC) {
		rc = loom_seterr(LOOM_EFORMAT, "tokenizer %s: bad magic %u (expected %d, an llm.c tokenizer)", path, hdr[0],
		                 LOOM_TOKENIZER_MAGIC);
		goto out;
	}
	if (hdr[1] != 1 && hdr[1] != 2) {
		rc = loom_seterr(LOOM_EFORMAT, "tokenizer %s: version %u (expected 1 or 2)", path, hdr[1]);
		goto out;
	}
	if (hdr[2] == 0 || hdr[2] > (1u << 24) || (hdr[1] == 1 && hdr[2] != 50257)) {
		rc = loom_seterr(LOOM_EFORMAT, "tokenizer %s: vocab size %u (expected 1..16M%s)", path, hdr[2],
		                 hdr[1] == 1 ? ", and 50257 in version 1" : "");
		goto out;
	}
	if (hdr[1] == 2 && hdr[3] >= hdr[2]) {
		rc = loom_seterr(LOOM_EFORMAT, "tokenizer %s: end-of-text id %u outside the vocabulary of %u", path, hdr[3],
		                 hdr[2]);
		goto out;
	}
	if (hdr[2] > (len - sizeof hdr) / 2) { /* every token takes at least 2 bytes: check before allocating */
		rc = loom_seterr(LOOM_EFORMAT, "tokenizer %s: vocab size %u needs at least %llu bytes, the file has %zu", path,
		                 hdr[2], (unsigned long long)sizeof hdr + 2ull * hdr[2], len);
		goto out;
	}
	if ((rc = alloc_table(tok, (int)hdr[2])) != LOOM_OK)
		goto out;
	tok->eot_token = hdr[1] == 1 ? 50256 : (int)hdr[3];
	for (int i = 0; i < tok->vocab_size; i++) {
		int n;
		if (pos >= len) {
			rc = loom_seterr(LOOM_EFORMAT, "tokenizer %s: truncated: ends at token %d of %d", path, i,
			                 tok->vocab_size);
			goto out;
		}
		n = (unsigned char)buf[pos++];
		if (n == 0) {
			rc = loom_seterr(LOOM_EFORMAT, "tokenizer %s: token %d has length 0 (expected >= 1)", path, i);
			goto out;
		}
		if (pos + (size_t)n > len) {
			rc = loom_seterr(LOOM_EFORMAT, "tokenizer %s: truncated inside token %d of %d", path, i,
			                 tok->vocab_size);
			goto out;
		}
		if ((rc = set_token(tok, i, buf + pos, n)) != LOOM_OK)
			goto out;
		pos += (size_t)n;
	}
	if (pos != len) {
		rc = loom_seterr(LOOM_EFORMAT, "tokenizer %s: %zu trailing bytes after the last token", path, len - pos);
		goto out;
	}
	tok->byte_level = is_byte_level(tok);
out:
	free(buf);
	if (rc != LOOM_OK)
		loom_tokenizer_free(tok);
	return rc;
}

int loom_tokenizer_save(const loom_tokenizer_t *tok, const char *path)
{
	uint32_t hdr[256] = {LOOM_TOKENIZER_MAGIC, 2, (uint32_t)tok->vocab_size, (uint32_t)tok->eot_token};
	atomic_file_t af;
	int rc;
	for (int i = 0; i < tok->vocab_size; i++)
		if (tok->lengths[i] < 1 || tok->lengths[i] > 255)
			return loom_seterr(LOOM_EINVAL, "tokenizer %s: token %d has %d bytes (the format holds 1..255)", path, i,
			                   tok->lengths[i]);
	if ((rc = loom__atomic_open(&af, path)) != LOOM_OK)
		return rc;
	rc = loom__atomic_write(&af, hdr, sizeof hdr);
	for (int i = 0; rc == LOOM_OK && i < tok->vocab_size; i++) {
		unsigned char n = (unsigned char)tok->lengths[i];
		rc = loom__atomic_write(&af, &n, 1);
		if (rc == LOOM_OK)
			rc = loom__atomic_write(&af, tok->bytes[i], n);
	}
	if (rc != LOOM_OK) {
		loom__atomic_abort(&af);
		return rc;
	}
	return loom__atomic_commit(&af);
}

const unsigned char *loom_tokenizer_decode(const loom_tokenizer_t *tok, int id, int *len)
{
	if (id < 0 || id >= tok->vocab_size || !tok->bytes) {
		*len = 0;
		return NULL;
	}
	*len = tok->lengths[id];
	return tok->bytes[id];
}

int loom_tokenizer_encode(const loom_tokenizer_t *tok, const char *text, size_t len, int *out, size_t cap,
                          size_t *n_out)
{
	*n_out = 0;
	if (!tok->byte_level)
		return loom_seterr(LOOM_ENOTSUP, "tokenizer: encoding needs the byte-level tokenizer (vocab %d is not "
		                   "byte-level; BPE encoding is not implemented)", tok->vocab_size);
	if (cap < len)
		return loom_seterr(LOOM_EINVAL, "tokenizer: %zu bytes of text need %zu tokens, output holds %zu", len, len,
		                   cap);
	for (size_t i = 0; i < len; i++)
		out[i] = (unsigned char)text[i];
	*n_out = len;
	return LOOM_OK;
}
