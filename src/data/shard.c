/* shard.c: llm.c token shards: a 256 x int32 header (magic 20240520, version 1, token count N) and
 * N uint16 tokens, read through mmap (FineWeb shards hold 100M tokens) and written atomically.
 *
 * Invariant: an open shard is a regular file of exactly 1024 + 2N bytes (0 <= N < 2^31, checked before
 * mapping), so tokens[0..N) is always mapped. */
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

int loom_shard_open(loom_shard_t *s, const char *path)
{
	size_t size;
	int32_t hdr[LOOM_SHARD_HEADER_INTS];
	int fd, rc = LOOM_OK;
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
	if (hdr[0] != LOOM_SHARD_MAGIC) {
		rc = loom_seterr(LOOM_EFORMAT, "shard %s: bad magic %d (expected %d, an llm.c token shard)", path, hdr[0],
		                 LOOM_SHARD_MAGIC);
		goto out;
	}
	if (hdr[1] != LOOM_SHARD_VERSION) {
		rc = loom_seterr(LOOM_EFORMAT, "shard %s: version %d (expected %d, uint16 tokens)", path, hdr[1],
		                 LOOM_SHARD_VERSION);
		goto out;
	}
	if (hdr[2] < 0 || size != HEADER_BYTES + 2 * (size_t)(uint32_t)hdr[2]) {
		rc = loom_seterr(LOOM_EFORMAT, "shard %s: header says %d tokens, so %lld bytes expected, but the file has "
		                 "%zu bytes", path, hdr[2], HEADER_BYTES + 2LL * hdr[2], size);
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
	s->tokens = (const uint16_t *)((const char *)s->map + HEADER_BYTES);
	s->n_tokens = (size_t)hdr[2];
out:
	close(fd);
	if (rc != LOOM_OK)
		loom_shard_close(s);
	return rc;
}

int loom_shard_write(const char *path, const uint16_t *tokens, size_t n)
{
	int32_t hdr[LOOM_SHARD_HEADER_INTS] = {LOOM_SHARD_MAGIC, LOOM_SHARD_VERSION, 0};
	atomic_file_t af;
	int rc;
	if (n > INT32_MAX)
		return loom_seterr(LOOM_EINVAL, "shard %s: %zu tokens exceed the format's limit of %d", path, n, INT32_MAX);
	hdr[2] = (int32_t)n;
	if ((rc = loom__atomic_open(&af, path)) != LOOM_OK)
		return rc;
	if ((rc = loom__atomic_write(&af, hdr, sizeof hdr)) != LOOM_OK || (rc = loom__atomic_write(&af, tokens, 2 * n)) != LOOM_OK) {
		loom__atomic_abort(&af);
		return rc;
	}
	return loom__atomic_commit(&af);
}
