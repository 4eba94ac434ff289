/* train_ckpt.c: atomic training-checkpoint directories: DIR/step_%08lld, built in DIR/.tmp-step_...
 *
 * Commit order: fsync every file of the temp dir, write MANIFEST (each file's size, via the atomic
 * kv writer), fsync the temp dir, rename it to its final name, fsync DIR. A directory under a final
 * name is therefore always complete; MANIFEST also lets latest() reject a directory that was damaged
 * or assembled by hand. Replacing an existing checkpoint of the same step moves the old one aside
 * (.old-step_...) first, so the only crash window leaves the older checkpoints usable. */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/util.h"
#include "core/fileio.h"
#include "loom/ckpt.h"

#define MANIFEST "MANIFEST"

int loom_ckpt_begin(loom_ckpt_writer_t *w, const char *dir, int64_t step)
{
	int rc;
	memset(w, 0, sizeof *w);
	if (step < 0)
		return loom_seterr(LOOM_EINVAL, "checkpoint: negative step %" PRId64, step);
	if (snprintf(w->dir, sizeof w->dir, "%s", dir) >= (int)sizeof w->dir)
		return loom_seterr(LOOM_EINVAL, "checkpoint dir '%s': path too long", dir);
	snprintf(w->tmp, sizeof w->tmp, "%s/.tmp-step_%08" PRId64, dir, step);
	snprintf(w->final_, sizeof w->final_, "%s/step_%08" PRId64, dir, step);
	w->step = step;
	if ((rc = loom__mkdir_p(dir)) != LOOM_OK || (rc = loom__rm_rf(w->tmp)) != LOOM_OK)
		return rc;
	if (mkdir(w->tmp, 0777) != 0)
		return loom_seterr(LOOM_ESYS, "checkpoint %s: mkdir: %s", w->tmp, strerror(errno));
	w->active = 1;
	return LOOM_OK;
}

int loom_ckpt_file(const loom_ckpt_writer_t *w, const char *name, char *buf, size_t cap)
{
	if (snprintf(buf, cap, "%s/%s", w->tmp, name) >= (int)cap)
		return loom_seterr(LOOM_EINVAL, "checkpoint %s/%s: path too long", w->tmp, name);
	return LOOM_OK;
}

void loom_ckpt_abort(loom_ckpt_writer_t *w)
{
	if (w->active)
		loom__rm_rf(w->tmp);
	w->active = 0;
}

int loom_ckpt_commit(loom_ckpt_writer_t *w)
{
	DIR *d;
	struct dirent *e;
	loom_kv_t *kv = NULL;
	char path[1400], old[1400];
	struct stat sb;
	int rc, nfiles = 0;
	if (!w->active)
		return loom_seterr(LOOM_ESTATE, "checkpoint: commit without begin");
	if ((rc = loom_kv_create(&kv)) != LOOM_OK)
		goto fail;
	if (!(d = opendir(w->tmp))) {
		rc = loom_seterr(LOOM_ESYS, "checkpoint %s: opendir: %s", w->tmp, strerror(errno));
		goto fail;
	}
	while ((e = readdir(d))) {
		char key[300];
		if (e->d_name[0] == '.' || strcmp(e->d_name, MANIFEST) == 0)
			continue;
		snprintf(path, sizeof path, "%s/%s", w->tmp, e->d_name);
		if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) {
			rc = loom_seterr(LOOM_EINVAL, "checkpoint %s: '%s' is not a regular file", w->tmp, e->d_name);
			break;
		}
		if ((rc = loom__fsync_path(path)) != LOOM_OK)
			break;
		snprintf(key, sizeof key, "size:%s", e->d_name);
		if ((rc = loom_kv_set_u64(kv, key, (uint64_t)sb.st_size)) != LOOM_OK)
			break;
		nfiles++;
	}
	closedir(d);
	if (rc != LOOM_OK)
		goto fail;
	if ((rc = loom_kv_set_i64(kv, "step", w->step)) != LOOM_OK || (rc = loom_kv_set_i64(kv, "files", nfiles)) != LOOM_OK)
		goto fail;
	snprintf(path, sizeof path, "%s/%s", w->tmp, MANIFEST);
	if ((rc = loom_kv_save(kv, path)) != LOOM_OK || (rc = loom__fsync_path(w->tmp)) != LOOM_OK)
		goto fail;
	snprintf(old, sizeof old, "%s/.old-step_%08" PRId64, w->dir, w->step);
	if (stat(w->final_, &sb) == 0) {
		if ((rc = loom__rm_rf(old)) != LOOM_OK)
			goto fail;
		if (rename(w->final_, old) != 0) {
			rc = loom_seterr(LOOM_ESYS, "checkpoint %s: cannot move the old one aside: %s", w->final_, strerror(errno));
			goto fail;
		}
	}
	if (rename(w->tmp, w->final_) != 0) {
		rc = loom_seterr(LOOM_ESYS, "checkpoint %s: rename from %s: %s", w->final_, w->tmp, strerror(errno));
		goto fail;
	}
	w->active = 0;
	rc = loom__fsync_path(w->dir);
	loom__rm_rf(old);
	loom_kv_destroy(kv);
	return rc;
fail:
	loom_kv_destroy(kv);
	loom_ckpt_abort(w);
	return rc;
}

int loom_ckpt_verify(const char *path)
{
	char mpath[1400], fpath[1400];
	loom_kv_t *kv;
	int64_t files, counted = 0;
	int rc;
	struct stat sb;
	snprintf(mpath, sizeof mpath, "%s/%s", path, MANIFEST);
	if (stat(mpath, &sb) != 0)
		return loom_seterr(LOOM_EFORMAT, "checkpoint %s: no %s (incomplete checkpoint)", path, MANIFEST);
	if ((rc = loom_kv_load(&kv, mpath)) != LOOM_OK)
		return rc;
	if ((rc = loom_kv_get_i64(kv, "files", &files)) != LOOM_OK)
		goto out;
	/* Every "size:NAME" key: NAME exists with that size. */
	for (int i = 0; i < loom_kv_count(kv); i++) {
		const char *key = loom_kv_key_at(kv, i);
		uint64_t want;
		if (strncmp(key, "size:", 5) != 0)
			continue;
		if ((rc = loom_kv_get_u64(kv, key, &want)) != LOOM_OK)
			goto out;
		snprintf(fpath, sizeof fpath, "%s/%s", path, key + 5);
		if (stat(fpath, &sb) != 0) {
			rc = loom_seterr(LOOM_EFORMAT, "checkpoint %s: %s is missing (incomplete checkpoint)", path, key + 5);
			goto out;
		}
		if ((uint64_t)sb.st_size != want) {
			rc = loom_seterr(LOOM_EFORMAT, "checkpoint %s: %s has %lld bytes, MANIFEST says %" PRIu64
			                 " (damaged checkpoint)", path, key + 5, (long long)sb.st_size, want);
			goto out;
		}
		counted++;
	}
	if (counted != files)
		rc = loom_seterr(LOOM_EFORMAT, "checkpoint %s: MANIFEST lists %" PRId64 " files but has %" PRId64
		                 " sizes (damaged MANIFEST)", path, files, counted);
out:
	loom_kv_destroy(kv);
	return rc;
}

/* Parse "step_NNNNNNNN" (as loom_ckpt_begin names it); -1 when the name is not one. */
static int64_t parse_step(const char *name)
{
	char *end;
	long long v;
	if (strncmp(name, "step_", 5) != 0 || !(name[5] >= '0' && name[5] <= '9'))
		return -1;
	char canon[64];
	v = strtoll(name + 5, &end, 10);
	if (*end || v < 0)
		return -1;
	snprintf(canon, sizeof canon, "step_%08lld", v);
	return strcmp(canon, name) == 0 ? v : -1; /* only the names loom writes */
}

/* Steps of the complete checkpoints in dir, sorted ascending (malloc'ed). A directory that verify
 * finds incomplete or damaged is skipped; any other failure (out of memory, I/O) is returned, since
 * skipping would silently pick an older checkpoint. */
static int list_complete(const char *dir, int64_t **steps, int *n)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int cap = 0, rc;
	*steps = NULL, *n = 0;
	if (!d)
		return errno == ENOENT ? LOOM_OK : loom_seterr(LOOM_ESYS, "checkpoints %s: opendir: %s", dir, strerror(errno));
	while ((e = readdir(d))) {
		int64_t s = parse_step(e->d_name);
		char path[1400];
		if (s < 0)
			continue;
		snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
		rc = loom_ckpt_verify(path);
		if (rc == LOOM_EFORMAT || rc == LOOM_ENOENT) /* incomplete or damaged (or removed meanwhile) */
			continue;
		if (rc == LOOM_OK && *n == cap) {
			int64_t *ns = loom__realloc(*steps, (size_t)(cap = cap ? 2 * cap : 16) * sizeof *ns);
			if (ns)
				*steps = ns;
			else
				rc = loom_seterr(LOOM_ENOMEM, "checkpoints %s: out of memory", dir);
		}
		if (rc != LOOM_OK) { /* out of memory or an I/O error: not a verdict on the checkpoint */
			closedir(d);
			free(*steps);
			*steps = NULL, *n = 0;
			return rc;
		}
		(*steps)[(*n)++] = s;
	}
	closedir(d);
	for (int i = 1; i < *n; i++) /* insertion sort: a handful of entries */
		for (int j = i; j > 0 && (*steps)[j - 1] > (*steps)[j]; j--) {
			int64_t t = (*steps)[j];
			(*steps)[j] = (*steps)[j - 1], (*steps)[j - 1] = t;
		}
	return LOOM_OK;
}

int loom_ckpt_latest(const char *dir, char *path, size_t cap, int64_t *step)
{
	int64_t *steps;
	int n, rc = list_complete(dir, &steps, &n);
	if (rc != LOOM_OK)
		return rc;
	if (n == 0) {
		free(steps);
		return loom_seterr(LOOM_ENOENT, "checkpoints %s: no complete checkpoint", dir);
	}
	*step = steps[n - 1];
	free(steps);
	if (snprintf(path, cap, "%s/step_%08" PRId64, dir, *step) >= (int)cap)
		return loom_seterr(LOOM_EINVAL, "checkpoints %s: path does not fit in %zu bytes", dir, cap);
	return LOOM_OK;
}

int loom_ckpt_prune(const char *dir, int keep)
{
	int64_t *steps;
	int n, rc;
	DIR *d;
	struct dirent *e;
	char path[1400];
	if (keep < 1)
		return loom_seterr(LOOM_EINVAL, "checkpoints %s: keep %d (must be >= 1)", dir, keep);
	if ((rc = list_complete(dir, &steps, &n)) != LOOM_OK)
		return rc;
	for (int i = 0; rc == LOOM_OK && i < n - keep; i++) {
		snprintf(path, sizeof path, "%s/step_%08" PRId64, dir, steps[i]);
		rc = loom__rm_rf(path);
	}
	free(steps);
	if (rc != LOOM_OK || !(d = opendir(dir)))
		return rc;
	while (rc == LOOM_OK && (e = readdir(d))) {
		if (strncmp(e->d_name, ".tmp-step_", 10) != 0 && strncmp(e->d_name, ".old-step_", 10) != 0)
			continue;
		snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
		rc = loom__rm_rf(path);
	}
	closedir(d);
	return rc;
}
