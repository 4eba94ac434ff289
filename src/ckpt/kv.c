/* kv.c: a flat key-value state file (the trainer's step, RNG, loader states, settings) as JSON:
 *   {"format": "loom-state", "version": 1, "values": {"step": 10, "lr": 0.0003, "name": "x", ...}}
 *
 * Values are kept as their JSON text (numbers) or decoded bytes (strings), so 64-bit integers are
 * exact and doubles, written with 17 significant digits, round-trip bit for bit. Non-finite doubles
 * are written as the strings "nan", "inf", "-inf". The map is small (tens of keys): linear search. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/json.h"
#include "core/util.h"
#include "core/fileio.h"
#include "loom/ckpt.h"

/* Limits on a state file read (docs/model.md): a trainer's state has tens of keys (9 per loader). */
#define KV_FILE_MAX (4u << 20)
#define KV_MAX_KEYS 16384

typedef struct {
	char *key;
	char *text; /* number text, or string bytes */
	int is_str;
} entry_t;

struct loom_kv {
	entry_t *e;
	int n, cap;
	char *src; /* file it was loaded from, for messages */
};

int loom_kv_create(loom_kv_t **kv)
{
	*kv = loom__calloc(1, sizeof **kv);
	return *kv ? LOOM_OK : loom_seterr(LOOM_ENOMEM, "state: out of memory");
}

void loom_kv_destroy(loom_kv_t *kv)
{
	if (!kv)
		return;
	for (int i = 0; i < kv->n; i++)
		free(kv->e[i].key), free(kv->e[i].text);
	free(kv->e);
	free(kv->src);
	free(kv);
}

static const char *src(const loom_kv_t *kv)
{
	return kv->src ? kv->src : "state (in memory)";
}

static entry_t *find(const loom_kv_t *kv, const char *key)
{
	for (int i = 0; i < kv->n; i++)
		if (strcmp(kv->e[i].key, key) == 0)
			return &kv->e[i];
	return NULL;
}

static int set(loom_kv_t *kv, const char *key, const char *text, int is_str)
{
	entry_t *e = find(kv, key);
	char *t = loom__strdup(text);
	if (!t)
		return loom_seterr(LOOM_ENOMEM, "state: out of memory");
	if (!e) {
		if (kv->n == kv->cap) {
			int cap = kv->cap ? 2 * kv->cap : 32;
			entry_t *ne = loom__realloc(kv->e, (size_t)cap * sizeof *ne);
			if (!ne) {
				free(t);
				return loom_seterr(LOOM_ENOMEM, "state: out of memory");
			}
			kv->e = ne, kv->cap = cap;
		}
		e = &kv->e[kv->n];
		if (!(e->key = loom__strdup(key))) {
			free(t);
			return loom_seterr(LOOM_ENOMEM, "state: out of memory");
		}
		kv->n++;
	} else {
		free(e->text);
	}
	e->text = t;
	e->is_str = is_str;
	return LOOM_OK;
}

int loom_kv_set_i64(loom_kv_t *kv, const char *key, int64_t v)
{
	char buf[32];
	snprintf(buf, sizeof buf, "%" PRId64, v);
	return set(kv, key, buf, 0);
}

int loom_kv_set_u64(loom_kv_t *kv, const char *key, uint64_t v)
{
	char buf[32];
	snprintf(buf, sizeof buf, "%" PRIu64, v);
	return set(kv, key, buf, 0);
}

int loom_kv_set_f64(loom_kv_t *kv, const char *key, double v)
{
	char buf[40];
	if (isnan(v))
		return set(kv, key, "nan", 1);
	if (isinf(v))
		return set(kv, key, v > 0 ? "inf" : "-inf", 1);
	snprintf(buf, sizeof buf, "%.17g", v);
	return set(kv, key, buf, 0);
}

int loom_kv_set_str(loom_kv_t *kv, const char *key, const char *v)
{
	return set(kv, key, v, 1);
}

int loom_kv_count(const loom_kv_t *kv)
{
	return kv->n;
}

const char *loom_kv_key_at(const loom_kv_t *kv, int i)
{
	return i >= 0 && i < kv->n ? kv->e[i].key : NULL;
}

int loom_kv_has(const loom_kv_t *kv, const char *key)
{
	return find(kv, key) != NULL;
}

static int get(const loom_kv_t *kv, const char *key, const entry_t **e)
{
	*e = find(kv, key);
	if (!*e)
		return loom_seterr(LOOM_ENOENT, "%s: no key '%s'", src(kv), key);
	return LOOM_OK;
}

/* An integer entry through conv (loom__json_to_i64 or _u64: 0 when it fits); what names the type. */
static int get_int(const loom_kv_t *kv, const char *key, int (*conv)(const json_t *, void *), void *v,
                   const char *what)
{
	const entry_t *e;
	json_t j = {.type = JSON_NUMBER};
	int rc = get(kv, key, &e);
	if (rc)
		return rc;
	j.s = e->text;
	if (e->is_str || conv(&j, v))
		return loom_seterr(LOOM_EFORMAT, "%s: '%s' is %s%s%s, expected %s", src(kv), key,
		                   e->is_str ? "the string \"" : "", e->text, e->is_str ? "\"" : "", what);
	return LOOM_OK;
}

static int to_i64(const json_t *j, void *v)
{
	return loom__json_to_i64(j, v);
}

static int to_u64(const json_t *j, void *v)
{
	return loom__json_to_u64(j, v);
}

int loom_kv_get_i64(const loom_kv_t *kv, const char *key, int64_t *v)
{
	return get_int(kv, key, to_i64, v, "a 64-bit integer");
}

int loom_kv_get_u64(const loom_kv_t *kv, const char *key, uint64_t *v)
{
	return get_int(kv, key, to_u64, v, "an unsigned 64-bit integer");
}

int loom_kv_get_f64(const loom_kv_t *kv, const char *key, double *v)
{
	const entry_t *e;
	int rc = get(kv, key, &e);
	if (rc)
		return rc;
	if (e->is_str) {
		if (strcmp(e->text, "nan") == 0)
			*v = NAN;
		else if (strcmp(e->text, "inf") == 0)
			*v = INFINITY;
		else if (strcmp(e->text, "-inf") == 0)
			*v = -INFINITY;
		else
			return loom_seterr(LOOM_EFORMAT, "%s: '%s' is the string \"%s\", expected a number", src(kv), key,
			                   e->text);
		return LOOM_OK;
	}
	*v = strtod(e->text, NULL);
	return LOOM_OK;
}

int loom_kv_get_str(const loom_kv_t *kv, const char *key, const char **v)
{
	const entry_t *e;
	int rc = get(kv, key, &e);
	if (rc)
		return rc;
	if (!e->is_str)
		return loom_seterr(LOOM_EFORMAT, "%s: '%s' is the number %s, expected a string", src(kv), key, e->text);
	*v = e->text;
	return LOOM_OK;
}

/* The fields of a loader state, by name. */
#define LOADER_FIELDS(X)                                                                  \
	X(next_window, u64) X(epoch, u64) X(seed, u64) X(n_tokens, u64) X(B, i64) X(T, i64) \
	X(shuffle, i64) X(rank, i64) X(world, i64)

int loom_kv_set_loader(loom_kv_t *kv, const char *prefix, const loom_loader_state_t *st)
{
	char key[256];
	int rc = LOOM_OK;
#define SET_(f, kind)                                                  \
	snprintf(key, sizeof key, "%s.%s", prefix, #f);                    \
	if (rc == LOOM_OK)                                                 \
		rc = loom_kv_set_##kind(kv, key, st->f);
	LOADER_FIELDS(SET_)
#undef SET_
	return rc;
}

int loom_kv_get_loader(const loom_kv_t *kv, const char *prefix, loom_loader_state_t *st)
{
	char key[256];
	int rc = LOOM_OK;
	memset(st, 0, sizeof *st);
#define GET_(f, kind)                                                                   \
	if (rc == LOOM_OK) {                                                                \
		kind##_t_ x_ = 0;                                                               \
		snprintf(key, sizeof key, "%s.%s", prefix, #f);                                 \
		rc = loom_kv_get_##kind(kv, key, &x_);                                          \
		st->f = x_;                                                                     \
		if (rc == LOOM_OK && (kind##_t_)st->f != x_)                                    \
			rc = loom_seterr(LOOM_EFORMAT, "%s: '%s' is out of range", src(kv), key);    \
	}
	typedef uint64_t u64_t_;
	typedef int64_t i64_t_;
	LOADER_FIELDS(GET_)
#undef GET_
	return rc;
}

int loom_kv_save(const loom_kv_t *kv, const char *path)
{
	atomic_file_t af;
	int rc = loom__atomic_open(&af, path);
	if (rc != LOOM_OK)
		return rc;
	fputs("{\"format\": \"loom-state\", \"version\": 1, \"values\": {\n", af.f);
	for (int i = 0; i < kv->n; i++) {
		fputs("  ", af.f);
		loom__json_write_string(af.f, kv->e[i].key, strlen(kv->e[i].key));
		fputs(": ", af.f);
		if (kv->e[i].is_str)
			loom__json_write_string(af.f, kv->e[i].text, strlen(kv->e[i].text));
		else
			fputs(kv->e[i].text, af.f);
		fputs(i + 1 < kv->n ? ",\n" : "\n", af.f);
	}
	fputs("}}\n", af.f);
	return loom__atomic_commit(&af);
}

int loom_kv_load(loom_kv_t **out, const char *path)
{
	char *text, err[200];
	size_t len;
	json_t root;
	const json_t *fmt, *ver, *vals;
	loom_kv_t *kv = NULL;
	int64_t version;
	int rc;
	*out = NULL;
	if ((rc = loom__read_file_max(path, KV_FILE_MAX, &text, &len)) != LOOM_OK)
		return rc;
	if ((rc = loom__json_parse(text, len, &root, err, sizeof err)) != 0) {
		rc = loom_seterr(rc == LOOM_ENOMEM ? rc : LOOM_EFORMAT, "%s: bad JSON: %s", path, err);
		goto out;
	}
	fmt = loom__json_get(&root, "format"), ver = loom__json_get(&root, "version"), vals = loom__json_get(&root, "values");
	if (!fmt || fmt->type != JSON_STRING || strcmp(fmt->s, "loom-state") != 0) {
		rc = loom_seterr(LOOM_EFORMAT, "%s: not a loom state file (\"format\" must be \"loom-state\")", path);
		goto out;
	}
	if (loom__json_to_i64(ver, &version) || version != 1) {
		rc = loom_seterr(LOOM_EFORMAT, "%s: state file version %s (expected 1)", path, ver && ver->s ? ver->s : "?");
		goto out;
	}
	if (!vals || vals->type != JSON_OBJECT) {
		rc = loom_seterr(LOOM_EFORMAT, "%s: \"values\" must be an object", path);
		goto out;
	}
	if (vals->n > KV_MAX_KEYS) { /* set() searches linearly: bound the quadratic cost */
		rc = loom_seterr(LOOM_EFORMAT, "%s: %d values, more than the limit of %d", path, vals->n, KV_MAX_KEYS);
		goto out;
	}
	if ((rc = loom_kv_create(&kv)) != LOOM_OK)
		goto out;
	if (!(kv->src = loom__strdup(path))) {
		rc = loom_seterr(LOOM_ENOMEM, "%s: out of memory", path);
		goto out;
	}
	for (int i = 0; i < vals->n; i++) {
		const json_t *v = &vals->kids[i];
		if (v->type != JSON_NUMBER && v->type != JSON_STRING) {
			rc = loom_seterr(LOOM_EFORMAT, "%s: value of '%s' is a %s (expected a number or a string)", path, v->key,
			                 loom__json_type_name(v->type));
			goto out;
		}
		if (v->type == JSON_STRING && strlen(v->s) != v->slen) {
			rc = loom_seterr(LOOM_EFORMAT, "%s: string value of '%s' contains a NUL byte", path, v->key);
			goto out;
		}
		if ((rc = set(kv, v->key, v->s, v->type == JSON_STRING)) != LOOM_OK)
			goto out;
	}
out:
	free(text);
	loom__json_free(&root);
	if (rc != LOOM_OK) {
		loom_kv_destroy(kv);
		return rc;
	}
	*out = kv;
	return LOOM_OK;
}
