/* train_ckpt.c: atomic training-checkpoint directories: DIR/step_%08lld, built in DIR/.tmp-step_...
 *
 * Commit order: fsync every file of the temp dir and take its CRC-32C, write MANIFEST (the step, and
 * each file's size and CRC-32C, via the atomic kv writer), fsync the temp dir, rename it to its final
 * name, fsync DIR. A directory under a final name is therefore always complete, and MANIFEST ties
 * every file to one step: verify checks that each listed file exists with its size and checksum,
 * that nothing unlisted is there, and that the directory name, when it is step_NNNNNNNN, is
 * MANIFEST's step. Replacing an existing checkpoint of the same step moves the old one aside
 * (.old-step_...) first, so the only crash window leaves the older checkpoints usable; pruning renames
 * a checkpoint to .pruned-step_... before deleting it, so a kill during a prune never leaves a
 * partial directory under a final name. loom_ckpt_recover finishes what a kill interrupted.
 *
 * A run that continues from step S (a resume of an older checkpoint, or a fresh start at 0) first
 * moves the step_ directories newer than S into DIR/abandoned-at-step_S (set_aside): they belong to
 * a branch the run left, and would otherwise outrank its own checkpoints in prune and latest, which
 * only ever look at step_ directories of DIR itself.
 *
 * latest() is the newest step_ directory by name, verified in full: a damaged newest checkpoint is
 * an error (naming the file, the problem and the older checkpoints that verify), never a silent
 * fall-back to an older one. MANIFESTs written before checksums (no "checksum" key) are checked by
 * size only. */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "core/crc32c.h"
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
		uint32_t crc;
		uint64_t size;
		if ((rc = loom__fsync_path(path)) != LOOM_OK || (rc = loom__crc32c_file(path, &crc, &size)) != LOOM_OK)
			break;
		snprintf(key, sizeof key, "size:%s", e->d_name);
		if ((rc = loom_kv_set_u64(kv, key, size)) != LOOM_OK)
			break;
		snprintf(key, sizeof key, "crc32c:%s", e->d_name);
		if ((rc = loom_kv_set_u64(kv, key, crc)) != LOOM_OK)
			break;
		nfiles++;
	}
	closedir(d);
	if (rc != LOOM_OK)
		goto fail;
	if ((rc = loom_kv_set_i64(kv, "step", w->step)) != LOOM_OK || (rc = loom_kv_set_i64(kv, "files", nfiles)) != LOOM_OK ||
	    (rc = loom_kv_set_str(kv, "checksum", "crc32c")) != LOOM_OK)
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

/* Check checkpoint directory `path`: MANIFEST, the step (against the directory's name when it is a
 * step_ name), each listed file's size and, with `sums`, its CRC-32C; no unlisted file. *step gets
 * MANIFEST's step; *incomplete is set when MANIFEST or a listed file is missing (as an interrupted
 * prune of an old version left it), so recover can tell leftovers from damage. */
static int check_dir(const char *path, int sums, int64_t *step, int *incomplete)
{
	char mpath[1400], fpath[1400];
	loom_kv_t *kv;
	int64_t files, counted = 0, s = -1, named;
	int rc, has_sums;
	const char *fmt, *base = strrchr(path, '/');
	struct stat sb;
	DIR *d;
	struct dirent *e;
	*incomplete = 0;
	if (step)
		*step = -1;
	snprintf(mpath, sizeof mpath, "%s/%s", path, MANIFEST);
	if (stat(mpath, &sb) != 0) {
		*incomplete = 1;
		return loom_seterr(LOOM_EFORMAT, "checkpoint %s: no %s (incomplete checkpoint)", path, MANIFEST);
	}
	if (!S_ISREG(sb.st_mode))
		return loom_seterr(LOOM_EFORMAT, "checkpoint %s: %s is not a regular file (damaged checkpoint)", path, MANIFEST);
	if ((rc = loom_kv_load(&kv, mpath)) != LOOM_OK) /* out of memory or I/O: not a verdict on the checkpoint */
		return rc == LOOM_EFORMAT ? loom_seterr(rc, "checkpoint %s: damaged %s: %s", path, MANIFEST, loom_errmsg()) : rc;
	if (loom_kv_get_i64(kv, "files", &files) != LOOM_OK || loom_kv_get_i64(kv, "step", &s) != LOOM_OK || s < 0) {
		rc = loom_seterr(LOOM_EFORMAT, "checkpoint %s: damaged %s: no valid \"files\" and \"step\" (%s)", path,
		                 MANIFEST, loom_errmsg());
		goto out;
	}
	named = parse_step(base ? base + 1 : path);
	if (named >= 0 && named != s) {
		rc = loom_seterr(LOOM_EFORMAT, "checkpoint %s: the directory is named for step %" PRId64 " but its %s is of "
		                 "step %" PRId64 " (files of another checkpoint)", path, named, MANIFEST, s);
		goto out;
	}
	has_sums = loom_kv_get_str(kv, "checksum", &fmt) == LOOM_OK;
	if (has_sums && strcmp(fmt, "crc32c") != 0) {
		rc = loom_seterr(LOOM_EFORMAT, "checkpoint %s: %s names checksum \"%s\", expected \"crc32c\"", path, MANIFEST,
		                 fmt);
		goto out;
	}
	/* Every "size:NAME" key: NAME exists with that size (and checksum). */
	for (int i = 0; i < loom_kv_count(kv); i++) {
		const char *key = loom_kv_key_at(kv, i), *name = key + 5;
		uint64_t want, sum = 0, got_size;
		uint32_t got;
		char skey[320];
		if (strncmp(key, "size:", 5) != 0)
			continue;
		if (!*name || strchr(name, '/') || name[0] == '.' || !strcmp(name, MANIFEST)) {
			rc = loom_seterr(LOOM_EFORMAT, "checkpoint %s: %s lists the file name '%s' (damaged %s)", path, MANIFEST,
			                 name, MANIFEST);
			goto out;
		}
		if ((rc = loom_kv_get_u64(kv, key, &want)) != LOOM_OK) {
			rc = loom_seterr(LOOM_EFORMAT, "checkpoint %s: damaged %s: %s", path, MANIFEST, loom_errmsg());
			goto out;
		}
		snprintf(skey, sizeof skey, "crc32c:%s", name);
		if (has_sums && (loom_kv_get_u64(kv, skey, &sum) != LOOM_OK || sum > UINT32_MAX)) {
			rc = loom_seterr(LOOM_EFORMAT, "checkpoint %s: %s has no valid checksum of %s (damaged %s)", path,
			                 MANIFEST, name, MANIFEST);
			goto out;
		}
		snprintf(fpath, sizeof fpath, "%s/%s", path, name);
		if (stat(fpath, &sb) != 0) {
			*incomplete = 1;
			rc = loom_seterr(LOOM_EFORMAT, "checkpoint %s: %s is missing (incomplete checkpoint)", path, name);
			goto out;
		}
		if (!S_ISREG(sb.st_mode) || (uint64_t)sb.st_size != want) {
			rc = loom_seterr(LOOM_EFORMAT, "checkpoint %s: %s has %lld bytes, MANIFEST says %" PRIu64
			                 " (damaged checkpoint)", path, name, (long long)sb.st_size, want);
			goto out;
		}
		if (sums && has_sums) {
			if ((rc = loom__crc32c_file(fpath, &got, &got_size)) != LOOM_OK)
				goto out;
			if (got_size != want || got != (uint32_t)sum) {
				rc = loom_seterr(LOOM_EFORMAT, "checkpoint %s: %s has CRC-32C %08x, MANIFEST says %08x (damaged "
				                 "checkpoint: its contents changed after it was written)", path, name, got,
				                 (uint32_t)sum);
				goto out;
			}
		}
		counted++;
	}
	if (counted != files) {
		rc = loom_seterr(LOOM_EFORMAT, "checkpoint %s: MANIFEST lists %" PRId64 " files but has %" PRId64
		                 " sizes (damaged MANIFEST)", path, files, counted);
		goto out;
	}
	/* Nothing unlisted: a file of another step (copied in) must not be read as part of this one. */
	if (!(d = opendir(path))) {
		rc = loom_seterr(LOOM_ESYS, "checkpoint %s: opendir: %s", path, strerror(errno));
		goto out;
	}
	while ((e = readdir(d))) {
		char key[320];
		if (e->d_name[0] == '.' || !strcmp(e->d_name, MANIFEST))
			continue;
		snprintf(key, sizeof key, "size:%s", e->d_name);
		if (!loom_kv_has(kv, key)) {
			rc = loom_seterr(LOOM_EFORMAT, "checkpoint %s: %s is not listed in its MANIFEST (a file that does not "
			                 "belong to the checkpoint of step %" PRId64 ")", path, e->d_name, s);
			break;
		}
	}
	closedir(d);
out:
	loom_kv_destroy(kv);
	if (rc == LOOM_OK && step)
		*step = s;
	return rc;
}

int loom_ckpt_verify_step(const char *path, int64_t *step)
{
	int incomplete;
	return check_dir(path, 1, step, &incomplete);
}

int loom_ckpt_verify(const char *path)
{
	return loom_ckpt_verify_step(path, NULL);
}

/* The steps of the step_NNNNNNNN directories in dir, sorted ascending (malloc'ed; none when dir does
 * not exist). With `check` only those that pass check_dir without checksums (sizes, names, step). */
static int list_steps(const char *dir, int check, int64_t **steps, int *n)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int cap = 0, rc = LOOM_OK;
	*steps = NULL, *n = 0;
	if (!d)
		return errno == ENOENT ? LOOM_OK : loom_seterr(LOOM_ESYS, "checkpoints %s: opendir: %s", dir, strerror(errno));
	while ((e = readdir(d))) {
		int64_t s = parse_step(e->d_name);
		char path[1400];
		int incomplete;
		if (s < 0)
			continue;
		if (check) {
			snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
			rc = check_dir(path, 0, NULL, &incomplete);
			if (rc == LOOM_EFORMAT || rc == LOOM_ENOENT) { /* incomplete or damaged (or removed meanwhile) */
				rc = LOOM_OK;
				continue;
			}
			if (rc != LOOM_OK) /* out of memory or an I/O error: not a verdict on the checkpoint */
				break;
		}
		if (*n == cap) {
			int64_t *ns = loom__realloc(*steps, (size_t)(cap = cap ? 2 * cap : 16) * sizeof *ns);
			if (!ns) {
				rc = loom_seterr(LOOM_ENOMEM, "checkpoints %s: out of memory", dir);
				break;
			}
			*steps = ns;
		}
		(*steps)[(*n)++] = s;
	}
	closedir(d);
	if (rc != LOOM_OK) {
		free(*steps);
		*steps = NULL, *n = 0;
		return rc;
	}
	for (int i = 1; i < *n; i++) /* insertion sort: a handful of entries */
		for (int j = i; j > 0 && (*steps)[j - 1] > (*steps)[j]; j--) {
			int64_t t = (*steps)[j];
			(*steps)[j] = (*steps)[j - 1], (*steps)[j - 1] = t;
		}
	return LOOM_OK;
}

int loom_ckpt_count(const char *dir, int *n)
{
	int64_t *steps;
	int rc = list_steps(dir, 0, &steps, n);
	free(steps);
	return rc;
}

int loom_model_path(const char *arg, char *path, size_t cap)
{
	struct stat sb;
	char ck[1100];
	int64_t step;
	int rc;
	if (stat(arg, &sb) != 0) {
		int err = errno;
		return loom_seterr(err == ENOENT ? LOOM_ENOENT : LOOM_ESYS, "%s: %s", arg,
		                   err == ENOENT ? "no such file or directory" : strerror(err));
	}
	if (!S_ISDIR(sb.st_mode))
		return snprintf(path, cap, "%s", arg) < (int)cap ? LOOM_OK : loom_seterr(LOOM_EINVAL, "%s: path too long", arg);
	if (snprintf(path, cap, "%s/model.safetensors", arg) >= (int)cap)
		return loom_seterr(LOOM_EINVAL, "%s: path too long", arg);
	if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode))
		return LOOM_OK;
	if (loom_hf_dir_is(arg)) /* a Hugging Face directory of shards: the directory itself */
		return snprintf(path, cap, "%s", arg) < (int)cap ? LOOM_OK : loom_seterr(LOOM_EINVAL, "%s: path too long", arg);
	if ((rc = loom_ckpt_latest(arg, ck, sizeof ck, &step)) == LOOM_ENOENT)
		return loom_seterr(rc, "%s: a directory without model.safetensors or checkpoints (step_NNNNNNNN)", arg);
	if (rc != LOOM_OK) /* a damaged newest checkpoint: the message lists the older ones that verify */
		return rc;
	if (snprintf(path, cap, "%s/model.safetensors", ck) >= (int)cap)
		return loom_seterr(LOOM_EINVAL, "%s: path too long", ck);
	return LOOM_OK;
}

int loom_ckpt_latest(const char *dir, char *path, size_t cap, int64_t *step)
{
	int64_t *steps, got;
	int n, rc = list_steps(dir, 0, &steps, &n);
	char why[1024], older[700], p[1400];
	size_t len = 0;
	if (rc != LOOM_OK)
		return rc;
	if (n == 0) {
		free(steps);
		return loom_seterr(LOOM_ENOENT, "checkpoints %s: no checkpoint", dir);
	}
	*step = steps[n - 1];
	if (snprintf(path, cap, "%s/step_%08" PRId64, dir, *step) >= (int)cap) {
		free(steps);
		return loom_seterr(LOOM_EINVAL, "checkpoints %s: path does not fit in %zu bytes", dir, cap);
	}
	if ((rc = loom_ckpt_verify_step(path, &got)) == LOOM_OK) {
		free(steps);
		return LOOM_OK;
	}
	/* The newest is damaged: say so, with the older ones that verify, and let the caller choose. */
	snprintf(why, sizeof why, "%s", loom_errmsg());
	older[0] = 0;
	for (int i = n - 2; i >= 0 && len < sizeof older - 1; i--) {
		snprintf(p, sizeof p, "%s/step_%08" PRId64, dir, steps[i]);
		int vrc = loom_ckpt_verify(p);
		if (vrc == LOOM_OK)
			len += (size_t)snprintf(older + len, sizeof older - len, "%s%s", len ? ", " : "", p);
		else if (vrc != LOOM_EFORMAT) { /* an I/O error: report it rather than an incomplete list */
			free(steps);
			return vrc;
		}
	}
	free(steps);
	if (len >= sizeof older - 1)
		memcpy(older + sizeof older - 6, ", ...", 6);
	return loom_seterr(rc == LOOM_EFORMAT ? LOOM_EFORMAT : rc, "the latest checkpoint is damaged: %s; %s%s", why,
	                   len ? "older checkpoints that verify: " : "there is no older checkpoint that verifies",
	                   older);
}

/* Delete checkpoint directory `name` of dir without ever leaving a partial one under a final name:
 * rename it to .pruned-<name> first (recover removes such leftovers). */
static int remove_ckpt(const char *dir, const char *name)
{
	char from[1400], to[1400];
	snprintf(from, sizeof from, "%s/%s", dir, name);
	snprintf(to, sizeof to, "%s/.pruned-%s", dir, name);
	if (rename(from, to) != 0)
		return errno == ENOENT ? LOOM_OK : loom_seterr(LOOM_ESYS, "checkpoint %s: rename to %s: %s", from, to,
		                                                 strerror(errno));
	return loom__rm_rf(to);
}

/* Remove the dot-leftovers of interrupted saves and prunes in dir; restore an .old-step_ whose
 * replacement never arrived. */
static int remove_leftovers(const char *dir)
{
	DIR *d;
	struct dirent *e;
	char path[1400], final_[1400];
	struct stat sb;
	int rc = LOOM_OK;
	if (!(d = opendir(dir)))
		return errno == ENOENT ? LOOM_OK : loom_seterr(LOOM_ESYS, "checkpoints %s: opendir: %s", dir, strerror(errno));
	while (rc == LOOM_OK && (e = readdir(d))) {
		int tmp = !strncmp(e->d_name, ".tmp-step_", 10), pruned = !strncmp(e->d_name, ".pruned-step_", 13);
		int old = !strncmp(e->d_name, ".old-step_", 10);
		if (!tmp && !pruned && !old)
			continue;
		snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
		snprintf(final_, sizeof final_, "%s/%s", dir, e->d_name + 5);
		if (old && stat(final_, &sb) != 0 && errno == ENOENT) { /* commit died between its two renames */
			if (rename(path, final_) != 0)
				rc = loom_seterr(LOOM_ESYS, "checkpoint %s: restoring it as %s: %s", path, final_, strerror(errno));
			continue;
		}
		rc = loom__rm_rf(path);
	}
	closedir(d);
	return rc;
}

int loom_ckpt_prune(const char *dir, int keep)
{
	int64_t *good, *all;
	int ngood, nall, rc;
	char name[64];
	if (keep < 1)
		return loom_seterr(LOOM_EINVAL, "checkpoints %s: keep %d (must be >= 1)", dir, keep);
	if ((rc = list_steps(dir, 1, &good, &ngood)) != LOOM_OK)
		return rc;
	if ((rc = list_steps(dir, 0, &all, &nall)) != LOOM_OK) {
		free(good);
		return rc;
	}
	/* Everything older than the oldest kept complete checkpoint goes, complete or not (an incomplete
	 * old one is what a kill during an earlier version's prune left). */
	if (ngood > keep) {
		int64_t oldest_kept = good[ngood - keep];
		for (int i = 0; rc == LOOM_OK && i < nall && all[i] < oldest_kept; i++) {
			snprintf(name, sizeof name, "step_%08" PRId64, all[i]);
			rc = remove_ckpt(dir, name);
		}
	}
	free(good);
	free(all);
	if (rc == LOOM_OK)
		rc = remove_leftovers(dir);
	return rc;
}

int loom_ckpt_recover(const char *dir)
{
	int64_t *good, *all;
	int ngood, nall, rc;
	char name[64], path[1400];
	if ((rc = remove_leftovers(dir)) != LOOM_OK)
		return rc;
	if ((rc = list_steps(dir, 1, &good, &ngood)) != LOOM_OK)
		return rc;
	if ((rc = list_steps(dir, 0, &all, &nall)) != LOOM_OK) {
		free(good);
		return rc;
	}
	/* An incomplete step_ directory (files missing) older than the newest complete checkpoint is the
	 * leftover of an interrupted prune: finish the prune. Damaged but complete ones are left alone. */
	for (int i = 0; rc == LOOM_OK && ngood > 0 && i < nall && all[i] < good[ngood - 1]; i++) {
		int incomplete;
		snprintf(name, sizeof name, "step_%08" PRId64, all[i]);
		snprintf(path, sizeof path, "%s/%s", dir, name);
		int vrc = check_dir(path, 0, NULL, &incomplete);
		if (vrc == LOOM_EFORMAT && incomplete)
			rc = remove_ckpt(dir, name);
		else if (vrc != LOOM_OK && vrc != LOOM_EFORMAT)
			rc = vrc;
	}
	free(good);
	free(all);
	return rc;
}

int loom_ckpt_set_aside(const char *dir, int64_t step, loom_ckpt_aside_t *out)
{
	loom_ckpt_aside_t local;
	int64_t *all;
	int nall, rc, first;
	char from[1400], to[1400];
	size_t len = 0;
	if (!out)
		out = &local;
	memset(out, 0, sizeof *out);
	if ((rc = list_steps(dir, 0, &all, &nall)) != LOOM_OK)
		return rc;
	for (first = 0; first < nall && all[first] <= step; first++)
		;
	if (first == nall) {
		free(all);
		return LOOM_OK;
	}
	/* a directory of its own for this branch: the same resume point twice gets ".2", ... */
	for (int k = 1;; k++) {
		if (k == 1)
			snprintf(out->into, sizeof out->into, "%s/abandoned-at-step_%08" PRId64, dir, step);
		else
			snprintf(out->into, sizeof out->into, "%s/abandoned-at-step_%08" PRId64 ".%d", dir, step, k);
		if (mkdir(out->into, 0777) == 0)
			break;
		if (errno != EEXIST || k == 10000) {
			rc = loom_seterr(LOOM_ESYS, "checkpoints %s: cannot create %s to move the abandoned branch's "
			                 "checkpoints into: %s", dir, out->into, strerror(errno));
			goto out;
		}
	}
	for (int i = first; i < nall; i++) {
		char name[64];
		snprintf(name, sizeof name, "step_%08" PRId64, all[i]);
		snprintf(from, sizeof from, "%s/%s", dir, name);
		snprintf(to, sizeof to, "%s/%s", out->into, name);
		if (rename(from, to) != 0) {
			rc = loom_seterr(LOOM_ESYS, "checkpoint %s: moving it aside to %s: %s%s", from, to, strerror(errno),
			                 out->n ? " (the newer ones before it were moved)" : "");
			goto out;
		}
		out->n++;
		if (len < sizeof out->names - 1)
			len += (size_t)snprintf(out->names + len, sizeof out->names - len, "%s%s", len ? ", " : "", name);
	}
	if (len >= sizeof out->names - 1)
		memcpy(out->names + sizeof out->names - 6, ", ...", 6);
	if ((rc = loom__fsync_path(out->into)) == LOOM_OK)
		rc = loom__fsync_path(dir);
out:
	free(all);
	return rc;
}

int loom_ckpt_check_save_dir(const char *dir)
{
	char probe[1100], *real = NULL, mpath[1200];
	struct stat sb;
	struct statfs fs;
	if (!dir || !*dir)
		return loom_seterr(LOOM_EINVAL, "checkpoint directory: empty path");
	if (snprintf(probe, sizeof probe, "%s", dir) >= (int)sizeof probe - 64)
		return loom_seterr(LOOM_EINVAL, "checkpoint directory '%s': path too long", dir);
	/* the deepest existing ancestor (dir itself when it exists) */
	while (stat(probe, &sb) != 0) {
		char *slash;
		if (errno != ENOENT && errno != ENOTDIR) /* ENOTDIR: a file on the way, found by walking up */
			return loom_seterr(LOOM_EINVAL, "checkpoint directory '%s': %s: %s", dir, probe, strerror(errno));
		while ((slash = strrchr(probe, '/')) && slash > probe && slash[1] == 0)
			*slash = 0; /* trailing slashes */
		if (!(slash = strrchr(probe, '/')))
			snprintf(probe, sizeof probe, ".");
		else if (slash == probe)
			probe[1] = 0;
		else
			*slash = 0;
	}
	if (!S_ISDIR(sb.st_mode))
		return loom_seterr(LOOM_EINVAL, "checkpoint directory '%s': %s is not a directory", dir, probe);
	if (statfs(probe, &fs) == 0 && (fs.f_type == 0x9fa0 /* procfs */ || fs.f_type == 0x62656572 /* sysfs */))
		return loom_seterr(LOOM_EINVAL, "checkpoint directory '%s': %s is in %s, which cannot hold files", dir, probe,
		                   fs.f_type == 0x9fa0 ? "/proc" : "/sys");
	if (access(probe, W_OK | X_OK) != 0)
		return loom_seterr(LOOM_EINVAL, "checkpoint directory '%s': %s is not writable: %s", dir, probe,
		                   strerror(errno));
	if (!(real = realpath(probe, NULL)))
		return loom_seterr(LOOM_EINVAL, "checkpoint directory '%s': %s: %s", dir, probe, strerror(errno));
	/* not inside a checkpoint: no directory from here up holds a MANIFEST */
	for (;;) {
		char *slash;
		snprintf(mpath, sizeof mpath, "%s/%s", real, MANIFEST);
		if (stat(mpath, &sb) == 0) {
			int rc = loom_seterr(LOOM_EINVAL, "checkpoint directory '%s' is inside the checkpoint %s (it holds a "
			                     "MANIFEST): give the directory that holds the step_ checkpoints", dir, real);
			free(real);
			return rc;
		}
		if (!(slash = strrchr(real, '/')) || slash == real)
			break;
		*slash = 0;
	}
	free(real);
	return LOOM_OK;
}
