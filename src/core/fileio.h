/* fileio.h: atomic file replacement and directory helpers shared by src/data and src/ckpt (internal).
 *
 * loom__atomic_open() gives a FILE* on a temporary file beside `path`; loom__atomic_commit() flushes, fsyncs and
 * closes it, renames it over `path` and fsyncs the directory, so readers see the old file or the
 * complete new one, never a partial one. Errors are recorded with loom_seterr naming the path. */
#ifndef LOOM_DATA_FILEIO_H
#define LOOM_DATA_FILEIO_H

#include <stddef.h>
#include <stdio.h>

typedef struct {
	FILE *f;
	char path[1024];
	char tmp[1100];
} atomic_file_t;

int loom__atomic_open(atomic_file_t *af, const char *path);   /* LOOM_ESYS naming the path */
int loom__atomic_commit(atomic_file_t *af);                   /* LOOM_EIO/LOOM_ESYS; removes the temp on failure */
void loom__atomic_abort(atomic_file_t *af);                   /* close and remove the temp file; idempotent */

/* Write n bytes, recording a LOOM_EIO error naming af->path on a short write. */
int loom__atomic_write(atomic_file_t *af, const void *p, size_t n);

int loom__fsync_path(const char *path);          /* open + fsync + close (file or directory) */
int loom__fsync_parent(const char *path);        /* fsync the directory that holds path */
int loom__mkdir_p(const char *path);             /* like mkdir -p; LOOM_ESYS naming the path */
int loom__rm_rf(const char *path);               /* remove a file or a directory tree; LOOM_ESYS */
/* Read a whole file into a malloc'ed, NUL-terminated buffer. LOOM_ENOENT / LOOM_EIO naming it.
 * Accepts pipes and FIFOs (data prepare reads `<(zcat ...)`); for files that may be hostile use
 * loom__read_file_max. */
int loom__read_file(const char *path, char **buf, size_t *len);

/* Read a regular file of at most `max` bytes into a malloc'ed, NUL-terminated buffer: anything else
 * (a directory, /dev/zero, a FIFO, a socket) is LOOM_EINVAL without reading a byte or blocking, a
 * larger file LOOM_EFORMAT before any allocation; LOOM_ENOENT / LOOM_EIO otherwise. */
int loom__read_file_max(const char *path, size_t max, char **buf, size_t *len);

/* Open a regular file read-only (O_NONBLOCK while opening, so a FIFO cannot block) and give its
 * size: LOOM_ENOENT / LOOM_EIO, LOOM_EINVAL naming what the path is when it is not a regular file.
 * `what` prefixes messages ("shard", "tokenizer"; NULL for none). */
int loom__open_regular(const char *what, const char *path, int *fd, size_t *size);

#endif
