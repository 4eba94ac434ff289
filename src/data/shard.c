/* shard.c: llm.c token shards: a 256 x int32 header (magic, version, token count N) and N tokens,
 * uint16 (magic 20240520, version 1: llm.c's "gpt-2" shards) or uint32 (magic 20240801, version 7:
 * its "llama-3" shards, for vocabularies above 65536 ids), read through mmap (FineWeb shards hold 100M
 * tokens) and written atomically.
 *
 * The width is the file's, per shard: a reader gets the mapping as it is (token_bytes says how to
 * read it), so a uint16 shard is never widened in memory. Invariant: an open shard is a regular file
 * of exactly 1024 + N * token_bytes bytes (0 <= N < 2^31, checked before mapping), so tokens[0..N) is
 * always mapped, and 4-byte-aligned for uint32 (the header is 1024 bytes, the mapping page-aligned). */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/util.h"
#include "core/fileio.h"
#include "loom/data.h"

#define HEADER_BYTES (LOOM_SHARD_HEADER_INTS * 4)

void loom_shard_close(loom_shard_t *s)
{
	if (s->map)
		munmap(s->map, s->map_bytes);
	free(s->path);
	memset(s, 0, sizeof *s);
}

/* The token width a (magic, version) pair means: 2 or 4 bytes, or 0 after setting the error. */
static int header_width(const char *path, int32_t magic, int32_t version)
{
	int32_t want;
	if (magic == LOOM_SHARD_MAGIC)
		want = LOOM_SHARD_VERSION;
	else if (magic == LOOM_SHARD32_MAGIC)
		want = LOOM_SHARD32_VERSION;
	else {
		loom_seterr(LOOM_EFORMAT, "shard %s: bad magic %d (expected %d, uint16 tokens, or %d, uint32 tokens: an "
		            "llm.c token shard)", path, magic, LOOM_SHARD_MAGIC, LOOM_SHARD32_MAGIC);
		return 0;
	}
	if (version != want) {
		loom_seterr(LOOM_EFORMAT, "shard %s: version %d (expected %d with magic %d, %s tokens; %s shards have "
		            "magic %d, version %d)", path, version, want, magic, magic == LOOM_SHARD_MAGIC ? "uint16" : "uint32",
		            magic == LOOM_SHARD_MAGIC ? "uint32" : "uint16",
		            magic == LOOM_SHARD_MAGIC ? LOOM_SHARD32_MAGIC : LOOM_SHARD_MAGIC,
		            magic == LOOM_SHARD_MAGIC ? LOOM_SHARD32_VERSION : LOOM_SHARD_VERSION);
		return 0;
	}
	return magic == LOOM_SHARD_MAGIC ? 2 : 4;
}

int loom_shard_open(loom_shard_t *s, const char *path)
{
	size_t size;
	int32_t hdr[LOOM_SHARD_HEADER_INTS];
	int fd, rc = LOOM_OK, width;
	memset(s, 0, sizeof *s);
	if ((rc = loom__open_regular("shard", path, &fd, &size)) != LOOM_OK)
		return rc;
	if (size < HEADER_BYTES) {
		rc = loom_seterr(LOOM_EFORMAT, "shard %s: %zu bytes, shorter than the %d-byte header", path, size,
		                 HEADER_BYTES);
		goto out;
	}
	if (pread(fd, hdr, sizeof hdr, 0) != (ssize_t)sizeof hdr) {
		rc = loom_seterr(LOOM_EIO, "shard %s: cannot read the header", path);
		goto out;
	}
	if (!(width = header_width(path, hdr[0], hdr[1]))) {
		rc = LOOM_EFORMAT;
		goto out;
	}
	if (hdr[2] < 0 || size != HEADER_BYTES + (size_t)width * (size_t)(uint32_t)hdr[2]) {
		rc = loom_seterr(LOOM_EFORMAT, "shard %s: header says %d %s tokens, so %lld bytes expected, but the file has "
		                 "%zu bytes", path, hdr[2], width == 2 ? "uint16" : "uint32",
		                 HEADER_BYTES + (long long)width * hdr[2], size);
		goto out;
	}
	s->path = loom__strdup(path);
	if (!s->path) {
		rc = loom_seterr(LOOM_ENOMEM, "shard %s: out of memory", path);
		goto out;
	}
	s->map_bytes = size;
	s->map = mmap(NULL, s->map_bytes, PROT_READ, MAP_SHARED, fd, 0);
	if (s->map == MAP_FAILED) {
		s->map = NULL;
		rc = loom_seterr(LOOM_ESYS, "shard %s: mmap: %s", path, strerror(errno));
		goto out;
	}
	s->tokens = (const char *)s->map + HEADER_BYTES;
	s->token_bytes = width;
	s->n_tokens = (size_t)hdr[2];
out:
	close(fd);
	if (rc != LOOM_OK)
		loom_shard_close(s);
	return rc;
}

uint32_t loom_shard_max_token(const loom_shard_t *s)
{
	if (s->token_bytes == 4) {
		const uint32_t *t = s->tokens;
		uint32_t m = 0;
		for (size_t j = 0; j < s->n_tokens; j++) /* vectorizes */
			m = t[j] > m ? t[j] : m;
		return m;
	} else {
		const uint16_t *t = s->tokens;
		uint16_t m = 0;
		for (size_t j = 0; j < s->n_tokens; j++)
			m = t[j] > m ? t[j] : m;
		return m;
	}
}

static int write_shard(const char *path, int32_t magic, int32_t version, const void *tokens, size_t width, size_t n)
{
	int32_t hdr[LOOM_SHARD_HEADER_INTS] = {magic, version, 0};
	atomic_file_t af;
	int rc;
	if (n > INT32_MAX)
		return loom_seterr(LOOM_EINVAL, "shard %s: %zu tokens exceed the format's limit of %d", path, n, INT32_MAX);
	hdr[2] = (int32_t)n;
	if ((rc = loom__atomic_open(&af, path)) != LOOM_OK)
		return rc;
	if ((rc = loom__atomic_write(&af, hdr, sizeof hdr)) != LOOM_OK ||
	    (rc = loom__atomic_write(&af, tokens, width * n)) != LOOM_OK) {
		loom__atomic_abort(&af);
		return rc;
	}
	return loom__atomic_commit(&af);
}

int loom_shard_write(const char *path, const uint16_t *tokens, size_t n)
{
	return write_shard(path, LOOM_SHARD_MAGIC, LOOM_SHARD_VERSION, tokens, 2, n);
}

int loom_shard_write32(const char *path, const uint32_t *tokens, size_t n)
{
	return write_shard(path, LOOM_SHARD32_MAGIC, LOOM_SHARD32_VERSION, tokens, 4, n);
}
