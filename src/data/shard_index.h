/* shard_index.h: the index of a token-shard set (LOOM_SHARD_INDEX beside the shards), internal to src/data.
 *
 * Text, one record per line: "loom-shards 1", then "set NAME SHARDS TOKENS" for each set (train,
 * val) and "file NAME BYTES" for each shard. prepare.c writes it last; loader.c checks a set against it. */
#ifndef LOOM_DATA_SHARD_INDEX_H
#define LOOM_DATA_SHARD_INDEX_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
	char name[64];
	int64_t shards;
	uint64_t tokens;
} loom__index_set_t;

typedef struct {
	char name[256];
	uint64_t bytes;
} loom__index_file_t;

typedef struct {
	loom__index_set_t *sets;
	int n_sets;
	loom__index_file_t *files;
	int n_files;
} loom__shard_index_t;

/* Write the index into dir (atomically). */
int loom__shard_index_write(const char *dir, const loom__shard_index_t *idx);
/* Read path; LOOM_EFORMAT naming the file and line for anything unexpected (at most 16 MiB). */
int loom__shard_index_load(const char *path, loom__shard_index_t *idx);
void loom__shard_index_free(loom__shard_index_t *idx);
const loom__index_set_t *loom__shard_index_set(const loom__shard_index_t *idx, const char *name, size_t len);
const loom__index_file_t *loom__shard_index_file(const loom__shard_index_t *idx, const char *name);

#endif
