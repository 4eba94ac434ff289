/* safetensors.c: reader (mmap + validated JSON header) and atomic writer of the safetensors format.
 *
 * File: u64 little-endian header length H, H bytes of JSON {name: {dtype, shape, data_offsets [b,e]},
 * "__metadata__": {string: string}}, then the data section; offsets are relative to its start. The
 * reader enforces what the reference implementation enforces: known dtypes, non-negative integer
 * shapes whose byte size equals e - b, tensors that tile the data section exactly (sorted by offset:
 * the first begins at 0, each begins where the previous ends, the last ends at the end of the file).
 * Invariant of an open handle: every tensor's data lies inside the mapping, in offset order. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/json.h"
#include "ckpt/model_internal.h"
#include "core/util.h"
#include "core/fileio.h"
#include "loom/ckpt.h"

/* Limits on the header (docs/model.md): 16 MB of JSON (the reference library allows 100 MB; GPT-2
 * XL's header is 60 KB) holding at most 2^19 JSON values (8 per tensor: 64K tensors, twice what the
 * optimizer state of a 1024-layer model needs), so a hostile header costs at most ~100 MB to parse. */
#define MAX_HEADER (16u << 20)
#define MAX_HEADER_VALUES (1L << 19)

struct loom_st {
	char *path;
	void *map;
	size_t map_bytes;
	loom_st_tensor_t *t;
	int *by_name; /* tensor indices sorted by name, for loom_st_find */
	int n;
	int fd;      /* kept open: F32 reads use pread (no page faults on the mapping) */
	char **meta; /* 2 * n_meta strings: key, value */
	int n_meta;
	json_t root;
};

static const struct {
	const char *name;
	size_t size;
} dtypes[LOOM_ST_COUNT_] = {
	[LOOM_ST_F32] = {"F32", 4}, [LOOM_ST_F16] = {"F16", 2}, [LOOM_ST_BF16] = {"BF16", 2},
	[LOOM_ST_F64] = {"F64", 8}, [LOOM_ST_I64] = {"I64", 8}, [LOOM_ST_I32] = {"I32", 4},
	[LOOM_ST_I16] = {"I16", 2}, [LOOM_ST_I8] = {"I8", 1},   [LOOM_ST_U8] = {"U8", 1},
	[LOOM_ST_BOOL] = {"BOOL", 1},
};

const char *loom_st_dtype_name(loom_st_dtype_t dt)
{
	return (unsigned)dt < LOOM_ST_COUNT_ ? dtypes[dt].name : "?";
}

size_t loom_st_dtype_size(loom_st_dtype_t dt)
{
	return (unsigned)dt < LOOM_ST_COUNT_ ? dtypes[dt].size : 0;
}

/* numel x size, or 0 with *ovf = 1 on overflow. */
static size_t tensor_bytes(const loom_st_tensor_t *t, int *ovf)
{
	size_t n = loom_st_dtype_size(t->dtype);
	*ovf = 0;
	for (int d = 0; d < t->ndim; d++) {
		if (t->shape[d] && n > SIZE_MAX / t->shape[d]) {
			*ovf = 1;
			return 0;
		}
		n *= t->shape[d];
	}
	return n;
}

void loom_st_close(loom_st_t *st)
{
	if (!st)
		return;
	if (st->map)
		munmap(st->map, st->map_bytes);
	if (st->fd >= 0)
		close(st->fd);
	loom__json_free(&st->root);
	free(st->t);
	free(st->by_name);
	free(st->meta);
	free(st->path);
	free(st);
}

static int cmp_offset(const void *a, const void *b)
{
	const loom_st_tensor_t *x = a, *y = b;
	const char *px = x->data, *py = y->data;
	if (px != py)
		return px < py ? -1 : 1;
	return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

static int cmp_name(const void *a, const void *b, void *arg)
{
	const loom_st_t *st = arg;
	return strcmp(st->t[*(const int *)a].name, st->t[*(const int *)b].name);
}

static int parse_tensor(loom_st_t *st, const json_t *v, const char *data, size_t data_bytes, loom_st_tensor_t *t)
{
	const char *path = st->path;
	const json_t *dt = loom__json_get(v, "dtype"), *shape = loom__json_get(v, "shape"), *offs = loom__json_get(v, "data_offsets");
	uint64_t b, e;
	size_t want;
	int ovf, k;
	if (v->type != JSON_OBJECT)
		return loom_seterr(LOOM_EFORMAT, "%s: tensor '%s': expected an object, found a %s", path, v->key,
		                   loom__json_type_name(v->type));
	if (!dt || dt->type != JSON_STRING)
		return loom_seterr(LOOM_EFORMAT, "%s: tensor '%s': missing or non-string \"dtype\"", path, v->key);
	for (k = 0; k < LOOM_ST_COUNT_; k++)
		if (strcmp(dt->s, dtypes[k].name) == 0)
			break;
	if (k == LOOM_ST_COUNT_)
		return loom_seterr(LOOM_EFORMAT, "%s: tensor '%s': unsupported dtype \"%s\"", path, v->key, dt->s);
	t->name = v->key;
	t->dtype = (loom_st_dtype_t)k;
	if (!shape || shape->type != JSON_ARRAY)
		return loom_seterr(LOOM_EFORMAT, "%s: tensor '%s': missing or non-array \"shape\"", path, v->key);
	if (shape->n > LOOM_ST_MAX_DIMS)
		return loom_seterr(LOOM_EFORMAT, "%s: tensor '%s': %d dimensions (at most %d supported)", path, v->key,
		                   shape->n, LOOM_ST_MAX_DIMS);
	t->ndim = shape->n;
	for (int d = 0; d < shape->n; d++) {
		uint64_t x;
		if (loom__json_to_u64(&shape->kids[d], &x) || x > SIZE_MAX)
			return loom_seterr(LOOM_EFORMAT, "%s: tensor '%s': shape[%d] is not a non-negative integer", path,
			                   v->key, d);
		t->shape[d] = (size_t)x;
	}
	if (!offs || offs->type != JSON_ARRAY || offs->n != 2 || loom__json_to_u64(&offs->kids[0], &b) ||
	    loom__json_to_u64(&offs->kids[1], &e))
		return loom_seterr(LOOM_EFORMAT, "%s: tensor '%s': \"data_offsets\" must be two non-negative integers", path,
		                   v->key);
	if (b > e || e > data_bytes)
		return loom_seterr(LOOM_EFORMAT, "%s: tensor '%s': data_offsets [%llu, %llu] out of range (data section "
		                   "is %zu bytes)", path, v->key, (unsigned long long)b, (unsigned long long)e, data_bytes);
	want = tensor_bytes(t, &ovf);
	if (ovf || want != e - b)
		return loom_seterr(LOOM_EFORMAT, "%s: tensor '%s': shape x %s size is %zu bytes but data_offsets span %llu",
		                   path, v->key, dtypes[k].name, want, (unsigned long long)(e - b));
	t->data = data + b;
	t->nbytes = (size_t)(e - b);
	return LOOM_OK;
}

int loom_st_open(loom_st_t **out, const char *path)
{
	loom_st_t *st;
	size_t size;
	uint64_t hlen;
	const char *data;
	size_t data_bytes;
	char err[256];
	int fd, rc = LOOM_OK;
	*out = NULL;
	st = loom__calloc(1, sizeof *st);
	if (!st || !(st->path = loom__strdup(path))) {
		free(st);
		return loom_seterr(LOOM_ENOMEM, "%s: out of memory", path);
	}
	rc = loom__open_regular(NULL, path, &fd, &size);
	st->fd = fd; /* -1 on failure */
	if (rc != LOOM_OK)
		goto out;
	if (size < 8) {
		rc = loom_seterr(LOOM_EFORMAT, "%s: %zu bytes, too short for a safetensors file (8-byte header length "
		                 "expected)", path, size);
		goto out;
	}
	st->map_bytes = size;
	st->map = mmap(NULL, st->map_bytes, PROT_READ, MAP_SHARED, fd, 0);
	if (st->map == MAP_FAILED) {
		st->map = NULL;
		rc = loom_seterr(LOOM_ESYS, "%s: mmap: %s", path, strerror(errno));
		goto out;
	}
	memcpy(&hlen, st->map, 8);
	if (hlen > st->map_bytes - 8) {
		rc = loom_seterr(LOOM_EFORMAT, "%s: header length %llu exceeds the file's %zu bytes after the length field "
		                 "(truncated or not a safetensors file)", path, (unsigned long long)hlen, st->map_bytes - 8);
		goto out;
	}
	if (hlen > MAX_HEADER) {
		rc = loom_seterr(LOOM_EFORMAT, "%s: header of %llu bytes, more than loom's limit of %u", path,
		                 (unsigned long long)hlen, MAX_HEADER);
		goto out;
	}
	if (hlen < 2) {
		rc = loom_seterr(LOOM_EFORMAT, "%s: header length %llu is too small for a JSON object", path,
		                 (unsigned long long)hlen);
		goto out;
	}
	if ((rc = loom__json_parse_max((const char *)st->map + 8, (size_t)hlen, MAX_HEADER_VALUES, &st->root, err,
	                               sizeof err)) != 0) {
		rc = loom_seterr(rc == LOOM_ENOMEM ? rc : LOOM_EFORMAT, "%s: bad JSON header: %s", path, err);
		goto out;
	}
	if (st->root.type != JSON_OBJECT) {
		rc = loom_seterr(LOOM_EFORMAT, "%s: JSON header is a %s, expected an object", path,
		                 loom__json_type_name(st->root.type));
		goto out;
	}
	data = (const char *)st->map + 8 + hlen;
	data_bytes = st->map_bytes - 8 - (size_t)hlen;
	st->t = loom__calloc((size_t)st->root.n + 1, sizeof *st->t);
	if (!st->t) {
		rc = loom_seterr(LOOM_ENOMEM, "%s: out of memory", path);
		goto out;
	}
	for (int i = 0; i < st->root.n; i++) {
		const json_t *v = &st->root.kids[i];
		if (strcmp(v->key, "__metadata__") == 0) {
			if (v->type != JSON_OBJECT || st->meta) {
				rc = loom_seterr(LOOM_EFORMAT, "%s: __metadata__ is %s, expected one object", path,
				                 st->meta ? "given twice" : loom__json_type_name(v->type));
				goto out;
			}
			st->meta = loom__calloc(2 * (size_t)v->n + 1, sizeof *st->meta);
			if (!st->meta) {
				rc = loom_seterr(LOOM_ENOMEM, "%s: out of memory", path);
				goto out;
			}
			for (int j = 0; j < v->n; j++) {
				if (v->kids[j].type != JSON_STRING) {
					rc = loom_seterr(LOOM_EFORMAT, "%s: __metadata__ value of '%s' is a %s, expected a string", path,
					                 v->kids[j].key, loom__json_type_name(v->kids[j].type));
					goto out;
				}
				st->meta[2 * j] = v->kids[j].key, st->meta[2 * j + 1] = v->kids[j].s;
			}
			st->n_meta = v->n;
			continue;
		}
		if ((rc = parse_tensor(st, v, data, data_bytes, &st->t[st->n])) != LOOM_OK)
			goto out;
		st->n++;
	}
	qsort(st->t, (size_t)st->n, sizeof *st->t, cmp_offset);
	if (!(st->by_name = loom__malloc(((size_t)st->n + 1) * sizeof *st->by_name))) {
		rc = loom_seterr(LOOM_ENOMEM, "%s: out of memory", path);
		goto out;
	}
	for (int i = 0; i < st->n; i++)
		st->by_name[i] = i;
	qsort_r(st->by_name, (size_t)st->n, sizeof *st->by_name, cmp_name, st);
	for (int i = 1; i < st->n; i++)
		if (strcmp(st->t[st->by_name[i - 1]].name, st->t[st->by_name[i]].name) == 0) {
			rc = loom_seterr(LOOM_EFORMAT, "%s: tensor '%.80s' appears twice in the header", path,
			                 st->t[st->by_name[i]].name);
			goto out;
		}
	{
		const char *pos = data;
		for (int i = 0; i < st->n; i++) {
			if ((const char *)st->t[i].data != pos) {
				rc = loom_seterr(LOOM_EFORMAT, "%s: tensor '%s' starts at data offset %zu, expected %zu (tensors "
				                 "must be contiguous and must not overlap)", path, st->t[i].name,
				                 (size_t)((const char *)st->t[i].data - data), (size_t)(pos - data));
				goto out;
			}
			pos += st->t[i].nbytes;
		}
		if (pos != data + data_bytes) {
			rc = loom_seterr(LOOM_EFORMAT, "%s: tensors cover %zu bytes of data but the file holds %zu after the "
			                 "header", path, (size_t)(pos - data), data_bytes);
			goto out;
		}
	}
out:
	if (rc != LOOM_OK) {
		loom_st_close(st);
		return rc;
	}
	*out = st;
	return LOOM_OK;
}

const char *loom_st_path(const loom_st_t *st)
{
	return st->path;
}

int loom_st_count(const loom_st_t *st)
{
	return st->n;
}

const loom_st_tensor_t *loom_st_get(const loom_st_t *st, int i)
{
	return i >= 0 && i < st->n ? &st->t[i] : NULL;
}

int loom_st_find(const loom_st_t *st, const char *name)
{
	int lo = 0, hi = st->n; /* binary search of by_name */
	while (lo < hi) {
		int mid = lo + (hi - lo) / 2, c = strcmp(st->t[st->by_name[mid]].name, name);
		if (c == 0)
			return st->by_name[mid];
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return -1;
}

int loom_st_meta_count(const loom_st_t *st)
{
	return st->n_meta;
}

int loom_st_meta_at(const loom_st_t *st, int i, const char **key, const char **value)
{
	if (i < 0 || i >= st->n_meta)
		return loom_seterr(LOOM_EINVAL, "%s: metadata index %d out of range [0, %d)", st->path, i, st->n_meta);
	*key = st->meta[2 * i], *value = st->meta[2 * i + 1];
	return LOOM_OK;
}

const char *loom_st_meta(const loom_st_t *st, const char *key)
{
	for (int i = 0; i < st->n_meta; i++)
		if (strcmp(st->meta[2 * i], key) == 0)
			return st->meta[2 * i + 1];
	return NULL;
}

float loom__half_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF, bits;
	float f;
	if (exp == 0) {
		if (man == 0) {
			bits = sign;
		} else { /* subnormal: renormalize */
			exp = 127 - 15 + 1;
			while (!(man & 0x400))
				man <<= 1, exp--;
			bits = sign | (exp << 23) | ((man & 0x3FF) << 13);
		}
	} else if (exp == 0x1F) {
		bits = sign | 0x7F800000u | (man << 13);
	} else {
		bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
	}
	memcpy(&f, &bits, 4);
	return f;
}

int loom_st_read_bytes(const loom_st_t *st, int i, size_t off, size_t n, void *out)
{
	const loom_st_tensor_t *t = loom_st_get(st, i);
	if (!t)
		return loom_seterr(LOOM_EINVAL, "%s: tensor index %d out of range [0, %d)", st->path, i, st->n);
	if (off > t->nbytes || n > t->nbytes - off)
		return loom_seterr(LOOM_EINVAL, "%s: bytes [%zu, %zu) of tensor '%s', which has %zu", st->path, off, off + n,
		                   t->name, t->nbytes);
	/* pread copies from the page cache without faulting the mapping in page by page (4x faster for a
	 * 500 MB model than memcpy from the map), and leaves no file page in the resident set */
	off_t at = (off_t)((const char *)t->data - (const char *)st->map) + (off_t)off;
	size_t done = 0;
	while (done < n) {
		ssize_t got = pread(st->fd, (char *)out + done, n - done, at + (off_t)done);
		if (got < 0 && errno == EINTR)
			continue;
		if (got <= 0)
			return loom_seterr(LOOM_EIO, "%s: reading tensor '%s' failed: %s", st->path, t->name,
			                   got < 0 ? strerror(errno) : "unexpected end of file");
		done += (size_t)got;
	}
	return LOOM_OK;
}

int loom__st_fd(const loom_st_t *st)
{
	return st->fd;
}

int loom_st_read_f32(const loom_st_t *st, int i, float *out, size_t numel)
{
	const loom_st_tensor_t *t = loom_st_get(st, i);
	const unsigned char *p;
	size_t n, es;
	if (!t)
		return loom_seterr(LOOM_EINVAL, "%s: tensor index %d out of range [0, %d)", st->path, i, st->n);
	es = loom_st_dtype_size(t->dtype);
	n = t->nbytes / es;
	if (n != numel)
		return loom_seterr(LOOM_EINVAL, "%s: tensor '%s' has %zu elements, caller expected %zu", st->path, t->name, n,
		                   numel);
	p = t->data;
	switch (t->dtype) {
	case LOOM_ST_F32:
		return loom_st_read_bytes(st, i, 0, t->nbytes, out);
	case LOOM_ST_BF16:
		for (size_t j = 0; j < n; j++) {
			uint32_t bits = (uint32_t)(p[2 * j] | (p[2 * j + 1] << 8)) << 16;
			memcpy(&out[j], &bits, 4);
		}
		return LOOM_OK;
	case LOOM_ST_F16:
		for (size_t j = 0; j < n; j++)
			out[j] = loom__half_to_f32((uint16_t)(p[2 * j] | (p[2 * j + 1] << 8)));
		return LOOM_OK;
	case LOOM_ST_F64:
		for (size_t j = 0; j < n; j++) {
			double d;
			memcpy(&d, p + 8 * j, 8);
			out[j] = (float)d;
		}
		return LOOM_OK;
	default:
		return loom_seterr(LOOM_EFORMAT, "%s: tensor '%s' has dtype %s, expected a float type (F32, BF16, F16, F64)",
		                   st->path, t->name, loom_st_dtype_name(t->dtype));
	}
}

/* The writer builds the header through a stdio stream whose buffer grows with loom__realloc (unlike
 * open_memstream's, so that allocation-failure injection reaches it). */
typedef struct {
	char *p;
	size_t len, cap;
	int nomem;
} membuf_t;

static ssize_t membuf_write(void *cookie, const char *s, size_t n)
{
	membuf_t *b = cookie;
	if (n > b->cap - b->len) {
		size_t cap = LOOM_MAX(LOOM_MAX(2 * b->cap, b->len + n), (size_t)4096);
		char *p = loom__realloc(b->p, cap);
		if (!p) {
			b->nomem = 1;
			return 0; /* stdio's "error" for a cookie writer */
		}
		b->p = p, b->cap = cap;
	}
	memcpy(b->p + b->len, s, n);
	b->len += n;
	return (ssize_t)n;
}

int loom_st_write(const char *path, const loom_st_tensor_t *t, int n, const char *const *meta, int n_meta)
{
	return loom__st_write_fill(path, t, n, meta, n_meta, NULL, NULL);
}

int loom__st_write_fill(const char *path, const loom_st_tensor_t *t, int n, const char *const *meta, int n_meta,
                        loom__st_fill_fn fill, void *ctx)
{
	membuf_t hb = {NULL, 0, 0, 0};
	char *hdr;
	size_t hlen, off = 0, pad;
	uint64_t hlen64;
	FILE *m;
	atomic_file_t af;
	int rc;
	for (int i = 0; i < n; i++) {
		int ovf;
		if ((unsigned)t[i].dtype >= LOOM_ST_COUNT_ || t[i].ndim < 0 || t[i].ndim > LOOM_ST_MAX_DIMS)
			return loom_seterr(LOOM_EINVAL, "%s: tensor '%s': bad dtype or ndim", path, t[i].name);
		if (tensor_bytes(&t[i], &ovf) != t[i].nbytes || ovf)
			return loom_seterr(LOOM_EINVAL, "%s: tensor '%s': %zu bytes given, shape needs %zu", path, t[i].name,
			                   t[i].nbytes, tensor_bytes(&t[i], &ovf));
		if (strcmp(t[i].name, "__metadata__") == 0)
			return loom_seterr(LOOM_EINVAL, "%s: a tensor cannot be called __metadata__", path);
		for (int j = 0; j < i; j++)
			if (strcmp(t[i].name, t[j].name) == 0)
				return loom_seterr(LOOM_EINVAL, "%s: tensor '%s' given twice", path, t[i].name);
	}
	m = fopencookie(&hb, "w", (cookie_io_functions_t){NULL, membuf_write, NULL, NULL});
	if (!m)
		return loom_seterr(LOOM_ENOMEM, "%s: out of memory for the header", path);
	fputc('{', m);
	if (n_meta > 0) {
		fputs("\"__metadata__\":{", m);
		for (int i = 0; i < n_meta; i++) {
			if (i)
				fputc(',', m);
			loom__json_write_string(m, meta[2 * i], strlen(meta[2 * i]));
			fputc(':', m);
			loom__json_write_string(m, meta[2 * i + 1], strlen(meta[2 * i + 1]));
		}
		fputc('}', m);
	}
	for (int i = 0; i < n; i++) {
		if (i || n_meta > 0)
			fputc(',', m);
		loom__json_write_string(m, t[i].name, strlen(t[i].name));
		fprintf(m, ":{\"dtype\":\"%s\",\"shape\":[", loom_st_dtype_name(t[i].dtype));
		for (int d = 0; d < t[i].ndim; d++)
			fprintf(m, d ? ",%zu" : "%zu", t[i].shape[d]);
		fprintf(m, "],\"data_offsets\":[%zu,%zu]}", off, off + t[i].nbytes);
		off += t[i].nbytes;
	}
	fputc('}', m);
	rc = fclose(m) != 0 || hb.nomem ? LOOM_ENOMEM : LOOM_OK;
	pad = (8 - hb.len % 8) % 8; /* 8 + hlen stays 8-aligned, as the reference writer pads (with spaces) */
	if (rc == LOOM_OK && membuf_write(&hb, "        ", pad) != (ssize_t)pad)
		rc = LOOM_ENOMEM;
	if (rc != LOOM_OK) {
		free(hb.p);
		return loom_seterr(LOOM_ENOMEM, "%s: out of memory for the header", path);
	}
	hdr = hb.p, hlen = hb.len;
	hlen64 = hlen;
	if ((rc = loom__atomic_open(&af, path)) != LOOM_OK) {
		free(hdr);
		return rc;
	}
	rc = loom__atomic_write(&af, &hlen64, 8);
	if (rc == LOOM_OK)
		rc = loom__atomic_write(&af, hdr, hlen);
	for (int i = 0; rc == LOOM_OK && i < n; i++) {
		const void *d = t[i].data;
		if (!d && fill && (rc = fill(ctx, i, &d)) != LOOM_OK) /* fill's error, its message */
			break;
		rc = loom__atomic_write(&af, d, t[i].nbytes);
	}
	free(hdr);
	if (rc != LOOM_OK) {
		loom__atomic_abort(&af);
		return rc;
	}
	return loom__atomic_commit(&af);
}
