/* shard_index.c: read and write the index of a token-shard set (see shard_index.h for the format).
 *
 * The index is what makes a set checkable: `loom data prepare` writes it last, into the set's
 * temporary directory, so a set with an index is a set that was completely written; the loader then
 * requires every shard it lists for the set being read, with its size. Invariants of a loaded index:
 * names are non-empty, hold only [A-Za-z0-9._-] and fit their buffers; counts are >= 0; the file is
 * at most 16 MiB (it is a few bytes per shard). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/fileio.h"
#include "core/util.h"
#include "data/shard_index.h"
#include "loom/data.h"

int loom__shard_index_write(const char *dir, const loom__shard_index_t *idx)
{
	atomic_file_t af;
	char path[1200];
	int rc;
	snprintf(path, sizeof path, "%s/%s", dir, LOOM_SHARD_INDEX);
	if ((rc = loom__atomic_open(&af, path)) != LOOM_OK)
		return rc;
	fprintf(af.f, "loom-shards 1\n");
	for (int i = 0; i < idx->n_sets; i++)
		fprintf(af.f, "set %s %lld %llu\n", idx->sets[i].name, (long long)idx->sets[i].shards,
		        (unsigned long long)idx->sets[i].tokens);
	for (int i = 0; i < idx->n_files; i++)
		fprintf(af.f, "file %s %llu\n", idx->files[i].name, (unsigned long long)idx->files[i].bytes);
	return loom__atomic_commit(&af);
}

void loom__shard_index_free(loom__shard_index_t *idx)
{
	free(idx->sets);
	free(idx->files);
	memset(idx, 0, sizeof *idx);
}

static int name_ok(const char *s)
{
	return *s && s[strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")] == 0;
}

int loom__shard_index_load(const char *path, loom__shard_index_t *idx)
{
	struct stat sb;
	char *text = NULL, *line, *save = NULL;
	size_t len;
	int rc, lineno = 0;
	memset(idx, 0, sizeof *idx);
	if (stat(path, &sb) != 0)
		return loom_seterr(errno == ENOENT ? LOOM_ENOENT : LOOM_EIO, "%s: %s", path, strerror(errno));
	if (!S_ISREG(sb.st_mode) || sb.st_size > (16 << 20))
		return loom_seterr(LOOM_EFORMAT, "%s: not a shard index (not a regular file of at most 16 MiB)", path);
	if ((rc = loom__read_file(path, &text, &len)) != LOOM_OK)
		return rc;
	if (strlen(text) != len) {
		rc = loom_seterr(LOOM_EFORMAT, "%s: not a shard index (binary data)", path);
		goto out;
	}
	for (line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		char name[256];
		long long a;
		unsigned long long b;
		int used = 0;
		lineno++;
		if (lineno == 1) {
			if (strcmp(line, "loom-shards 1") != 0) {
				rc = loom_seterr(LOOM_EFORMAT, "%s: not a shard index (first line '%.40s', expected 'loom-shards 1')",
				                 path, line);
				goto out;
			}
			continue;
		}
		if (sscanf(line, "set %63s %lld %llu%n", name, &a, &b, &used) == 3 && !line[used] && a >= 0 && name_ok(name)) {
			loom__index_set_t *ns = loom__realloc(idx->sets, (size_t)(idx->n_sets + 1) * sizeof *ns);
			if (!ns) {
				rc = loom_seterr(LOOM_ENOMEM, "%s: out of memory", path);
				goto out;
			}
			idx->sets = ns;
			memcpy(ns[idx->n_sets].name, name, strlen(name) + 1); /* %63s: fits */
			ns[idx->n_sets].shards = a, ns[idx->n_sets].tokens = b;
			idx->n_sets++;
		} else if (sscanf(line, "file %255s %llu%n", name, &b, &used) == 2 && !line[used] && name_ok(name)) {
			loom__index_file_t *nf = loom__realloc(idx->files, (size_t)(idx->n_files + 1) * sizeof *nf);
			if (!nf) {
				rc = loom_seterr(LOOM_ENOMEM, "%s: out of memory", path);
				goto out;
			}
			idx->files = nf;
			memcpy(nf[idx->n_files].name, name, strlen(name) + 1); /* %255s: fits */
			nf[idx->n_files].bytes = b;
			idx->n_files++;
		} else {
			rc = loom_seterr(LOOM_EFORMAT, "%s: line %d: '%.60s' is not 'set NAME SHARDS TOKENS' or 'file NAME BYTES' "
			                 "(damaged shard index)", path, lineno, line);
			goto out;
		}
	}
	if (lineno == 0)
		rc = loom_seterr(LOOM_EFORMAT, "%s: empty shard index", path);
out:
	free(text);
	if (rc != LOOM_OK)
		loom__shard_index_free(idx);
	return rc;
}

const loom__index_set_t *loom__shard_index_set(const loom__shard_index_t *idx, const char *name, size_t len)
{
	for (int i = 0; i < idx->n_sets; i++)
		if (strlen(idx->sets[i].name) == len && !strncmp(idx->sets[i].name, name, len))
			return &idx->sets[i];
	return NULL;
}

const loom__index_file_t *loom__shard_index_file(const loom__shard_index_t *idx, const char *name)
{
	for (int i = 0; i < idx->n_files; i++)
		if (!strcmp(idx->files[i].name, name))
			return &idx->files[i];
	return NULL;
}
