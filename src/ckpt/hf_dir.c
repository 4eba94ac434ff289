/* hf_dir.c: Hugging Face model directories of the llama family (LlamaForCausalLM, Qwen2ForCausalLM):
 * config.json (hf_config.c) and the weights, one model.safetensors or the shards listed in
 * model.safetensors.index.json's weight_map.
 *
 * Why streaming: a 1B-parameter model in BF16 is 2.5 GB of files and 5 GB of fp32 parameters; a
 * reader that mapped the files and converted from the mapping would add the files' pages to the
 * resident set (1.5x), and one that converted a whole tensor in a temporary would add the largest
 * tensor (the embedding, 0.5 GB). So every tensor is read with pread into a buffer of at most
 * HF_CHUNK (256 KB) bytes and converted from there into its place in the parameters: the peak memory is
 * the parameters plus one such buffer per thread of the load.
 *
 * Why threads: loading 5 GB of fp32 is mostly faulting in the parameters' pages (the kernel zeroes
 * each on first touch; on a VM whose balloon reports free pages to the host, the host faults it in
 * too), which a buffer left unzeroed (loom_alloc_uninit) lets the load's own writes do, on every core
 * at once. The files are cut into pieces of HF_PIECE (8 MB) in file order, claimed in turn from one
 * counter: the reads stay nearly sequential (a cold file reads at the disk's speed), and each thread
 * faults in whole page tables' worth of its own output instead of contending for the same ones.
 * (Transparent huge pages were measured slower here: every 2 MB page is a block the host dropped.)
 *
 * Invariant: loom_hf_dir_config succeeds only for a directory whose files hold every tensor of the
 * family's table once with the table's shape and a float dtype, and nothing else (a tied
 * lm_head.weight and transformers 4's rotary inv_freq buffers aside), all checked from the headers
 * alone, so a caller may allocate what loom_model_num_params reports and loom_hf_dir_load reads
 * exactly the table's tensors. A directory is written into a temporary directory beside it and
 * renamed into place, so it is never half-written under its name. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#ifdef _OPENMP /* (the fuzz harnesses build the loaders without OpenMP: one thread) */
#include <omp.h>
#define hf_max_threads() omp_get_max_threads()
#define hf_thread_num() omp_get_thread_num()
#else
#define hf_max_threads() 1
#define hf_thread_num() 0
#endif
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/json.h"
#include "ckpt/model_internal.h"
#include "core/fileio.h"
#include "core/util.h"
#include "loom/ckpt.h"

#define HF_CHUNK (256u << 10)         /* bytes of a read buffer: in L2, so converting from it costs no memory traffic */
#define HF_PIECE ((size_t)8 << 20)   /* bytes of a file a thread claims at once (see load_all) */
#define HF_MAX_THREADS 16             /* threads of a load (each with its buffer) */
#define HF_INDEX_MAX (16u << 20)      /* model.safetensors.index.json */
#define HF_INDEX_VALUES (1L << 20)
#define HF_MAX_SHARDS 65536
#define HF_DEFAULT_SHARD ((size_t)5000000000) /* transformers' max_shard_size "5GB" */

/* ---- the parameter table ------------------------------------------------------------------------- */

int loom__hf_family_table(const loom_model_config_t *cfg, loom_tensor_info_t **tab, int *n)
{
	int nt;
	*tab = NULL, *n = 0;
	if (loom_model_config_check(cfg) != LOOM_OK)
		return LOOM_EINVAL;
	nt = loom_model_num_tensors(cfg);
	if (nt <= 0 || !(*tab = loom__calloc((size_t)nt, sizeof **tab)))
		return loom_seterr(nt <= 0 ? LOOM_EINVAL : LOOM_ENOMEM, "the parameter table of %d tensors", nt);
	for (int i = 0; i < nt; i++)
		if (loom_model_tensor_info(cfg, i, &(*tab)[i]) != LOOM_OK) {
			free(*tab), *tab = NULL;
			return LOOM_EINVAL;
		}
	*n = nt;
	return LOOM_OK;
}

typedef struct {
	const char *name;
	int k;
} name_ix_t;

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int cmp_name_ix(const void *a, const void *b)
{
	return strcmp(((const name_ix_t *)a)->name, ((const name_ix_t *)b)->name);
}

/* ---- the index ------------------------------------------------------------------------------------- */

/* A shard's file name: a plain name inside the directory, ending in .safetensors. */
static int plain_name(const char *s)
{
	size_t n = strlen(s);
	return n > 12 && n < 256 && !strchr(s, '/') && strcmp(s + n - 12, ".safetensors") == 0 && s[0] != '.';
}

int loom__hf_index_parse(const char *text, size_t len, const char *what, loom__hf_index_t *ix)
{
	const json_t *wm, *meta;
	char err[200];
	int rc;
	memset(ix, 0, sizeof *ix);
	if ((rc = loom__json_parse_max(text, len, HF_INDEX_VALUES, &ix->root, err, sizeof err)) != 0)
		return loom_seterr(rc == LOOM_ENOMEM ? rc : LOOM_EFORMAT, "%s: bad JSON: %s", what, err);
	if (ix->root.type != JSON_OBJECT)
		return loom_seterr(LOOM_EFORMAT, "%s: a %s, expected a JSON object", what,
		                   loom__json_type_name(ix->root.type));
	if ((meta = loom__json_get(&ix->root, "metadata")) && meta->type != JSON_OBJECT && meta->type != JSON_NULL)
		return loom_seterr(LOOM_EFORMAT, "%s: \"metadata\" is a %s, expected an object", what,
		                   loom__json_type_name(meta->type));
	wm = loom__json_get(&ix->root, "weight_map");
	if (!wm || wm->type != JSON_OBJECT)
		return loom_seterr(LOOM_EFORMAT, "%s: no \"weight_map\" object", what);
	if (wm->n == 0)
		return loom_seterr(LOOM_EFORMAT, "%s: \"weight_map\" is empty", what);
	ix->map = wm;
	if (!(ix->files = loom__calloc((size_t)wm->n, sizeof *ix->files)))
		return loom_seterr(LOOM_ENOMEM, "%s: out of memory", what);
	for (int i = 0; i < wm->n; i++) {
		const json_t *v = &wm->kids[i];
		if (v->type != JSON_STRING || strlen(v->s) != v->slen || !plain_name(v->s))
			return loom_seterr(LOOM_EFORMAT, "%s: weight_map[\"%.80s\"] must be the name of a .safetensors file in "
			                   "the directory (no '/', not hidden)", what, v->key);
		if (strlen(v->key) >= LOOM_TENSOR_NAME_MAX + 32)
			return loom_seterr(LOOM_EFORMAT, "%s: weight_map names a tensor of %zu characters", what, strlen(v->key));
		ix->files[ix->nf++] = v->s;
	}
	/* the distinct files, sorted (shard k of n sorts as its number) */
	qsort(ix->files, (size_t)ix->nf, sizeof *ix->files, cmp_str);
	int u = 0;
	for (int i = 0; i < ix->nf; i++)
		if (u == 0 || strcmp(ix->files[u - 1], ix->files[i]) != 0)
			ix->files[u++] = ix->files[i];
	ix->nf = u;
	if (ix->nf > HF_MAX_SHARDS)
		return loom_seterr(LOOM_EFORMAT, "%s: %d shards, more than loom's limit of %d", what, ix->nf, HF_MAX_SHARDS);
	/* tensor names listed once */
	{
		name_ix_t *s = loom__malloc((size_t)wm->n * sizeof *s);
		if (!s)
			return loom_seterr(LOOM_ENOMEM, "%s: out of memory", what);
		for (int i = 0; i < wm->n; i++)
			s[i].name = wm->kids[i].key, s[i].k = i;
		qsort(s, (size_t)wm->n, sizeof *s, cmp_name_ix);
		for (int i = 1; i < wm->n; i++)
			if (strcmp(s[i - 1].name, s[i].name) == 0) {
				rc = loom_seterr(LOOM_EFORMAT, "%s: weight_map lists tensor '%.80s' twice", what, s[i].name);
				free(s);
				return rc;
			}
		free(s);
	}
	return LOOM_OK;
}

void loom__hf_index_free(loom__hf_index_t *ix)
{
	loom__json_free(&ix->root);
	free(ix->files);
	memset(ix, 0, sizeof *ix);
}

/* ---- a set of files holding one model ------------------------------------------------------------- */

typedef struct {
	char dir[1024];
	char cfgpath[1100];
	char idxpath[1100];
	int sharded;
	int nf;
	char (*path)[1400];
	loom_st_t **st;
	loom_model_config_t cfg;
	loom_hf_info_t info;
	loom_tensor_info_t *tab;
	int nt;
	int *file, *idx;  /* table tensor k is tensor idx[k] of st[file[k]] */
	int lm_f, lm_i;   /* a tied lm_head.weight in the files (-1: none) */
	int embed;        /* table index of model.embed_tokens.weight (-1: none) */
} hfset_t;

static void set_free(hfset_t *s)
{
	for (int i = 0; s->st && i < s->nf; i++)
		loom_st_close(s->st[i]);
	free(s->st), free(s->path), free(s->tab), free(s->file), free(s->idx);
	memset(s, 0, sizeof *s);
}

static int is_dir(const char *p)
{
	struct stat sb;
	return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static int is_file(const char *p)
{
	struct stat sb;
	return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

static int ends_with(const char *s, const char *suffix)
{
	size_t n = strlen(s), m = strlen(suffix);
	return n >= m && strcmp(s + n - m, suffix) == 0;
}

int loom_hf_dir_is(const char *dir)
{
	char p[1200];
	if (!is_dir(dir))
		return 0;
	snprintf(p, sizeof p, "%s/config.json", dir);
	if (!is_file(p))
		return 0;
	snprintf(p, sizeof p, "%s/model.safetensors", dir);
	if (is_file(p))
		return 1;
	snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
	return is_file(p);
}

/* 1 when path is a single .safetensors file whose directory's config.json names the llama family
 * (model_type "llama" / "qwen2"), or that names it itself (loom's files: __metadata__ arch "llama"). */
int loom__hf_is_llama_file(const char *path, const loom_st_t *st)
{
	char dir[1100], cfg[1200], *text;
	size_t len;
	json_t root;
	char err[64];
	const json_t *mt;
	int yes = 0;
	const char *a = loom_st_meta(st, "arch");
	if (a)
		return strcmp(a, "llama") == 0;
	snprintf(dir, sizeof dir, "%s", path);
	if (snprintf(cfg, sizeof cfg, "%s/config.json", dirname(dir)) >= (int)sizeof cfg ||
	    loom__read_file_max(cfg, LOOM_MODEL_CONFIG_JSON_MAX, &text, &len) != LOOM_OK)
		return 0;
	if (loom__json_parse(text, len, &root, err, sizeof err) == 0 && root.type == JSON_OBJECT &&
	    (mt = loom__json_get(&root, "model_type")) && mt->type == JSON_STRING)
		yes = strcmp(mt->s, "llama") == 0 || strcmp(mt->s, "qwen2") == 0;
	loom__json_free(&root);
	free(text);
	return yes;
}

/* Where the model of `arg` is: a directory (its model.safetensors, else its index), the path of a
 * .safetensors file, or of an index (*.index.json). */
static int set_locate(hfset_t *s, const char *arg)
{
	char tmp[1024];
	if (snprintf(tmp, sizeof tmp, "%s", arg) >= (int)sizeof tmp)
		return loom_seterr(LOOM_EINVAL, "%s: path too long", arg);
	if (is_dir(arg)) {
		snprintf(s->dir, sizeof s->dir, "%s", arg);
		snprintf(s->idxpath, sizeof s->idxpath, "%s/model.safetensors", arg);
		if (!is_file(s->idxpath)) {
			snprintf(s->idxpath, sizeof s->idxpath, "%s/model.safetensors.index.json", arg);
			if (!is_file(s->idxpath))
				return loom_seterr(LOOM_ENOENT, "%s: a directory with neither model.safetensors nor "
				                   "model.safetensors.index.json", arg);
			s->sharded = 1;
		}
	} else {
		snprintf(s->dir, sizeof s->dir, "%s", dirname(tmp));
		snprintf(s->idxpath, sizeof s->idxpath, "%s", arg);
		s->sharded = ends_with(arg, ".json");
	}
	snprintf(s->cfgpath, sizeof s->cfgpath, "%s/config.json", s->dir);
	return LOOM_OK;
}

/* The files: the one .safetensors, or the index's shards; each opened (headers validated). */
static int set_open(hfset_t *s)
{
	loom__hf_index_t ix;
	char *text = NULL;
	size_t len;
	int rc = LOOM_OK;
	memset(&ix, 0, sizeof ix);
	if (s->sharded) {
		if ((rc = loom__read_file_max(s->idxpath, HF_INDEX_MAX, &text, &len)) != LOOM_OK ||
		    (rc = loom__hf_index_parse(text, len, s->idxpath, &ix)) != LOOM_OK)
			goto out;
		s->nf = ix.nf;
	} else {
		s->nf = 1;
	}
	s->path = loom__calloc((size_t)s->nf, sizeof *s->path);
	s->st = loom__calloc((size_t)s->nf, sizeof *s->st);
	if (!s->path || !s->st) {
		rc = loom_seterr(LOOM_ENOMEM, "%s: out of memory", s->idxpath);
		goto out;
	}
	for (int f = 0; f < s->nf; f++) {
		if (s->sharded)
			snprintf(s->path[f], sizeof s->path[f], "%s/%s", s->dir, ix.files[f]);
		else
			snprintf(s->path[f], sizeof s->path[f], "%s", s->idxpath);
		if ((rc = loom_st_open(&s->st[f], s->path[f])) != LOOM_OK) {
			if (rc == LOOM_ENOENT && s->sharded)
				rc = loom_seterr(rc, "%s: shard %s (listed in %s's weight_map) does not exist", s->path[f],
				                 ix.files[f], s->idxpath);
			goto out;
		}
	}
	/* every tensor the index lists is in the shard it names, and every shard's tensor is listed there */
	if (s->sharded) {
		long total = 0;
		for (int i = 0; i < ix.map->n; i++) {
			const json_t *v = &ix.map->kids[i];
			int f = 0;
			while (strcmp(ix.files[f], v->s) != 0)
				f++;
			if (loom_st_find(s->st[f], v->key) < 0) {
				rc = loom_seterr(LOOM_EFORMAT, "%s: weight_map puts tensor '%.80s' in %s, which does not hold it",
				                 s->idxpath, v->key, v->s);
				goto out;
			}
		}
		for (int f = 0; f < s->nf; f++)
			total += loom_st_count(s->st[f]);
		if (total != ix.map->n) { /* some shard holds a tensor the index does not list */
			for (int f = 0; f < s->nf; f++)
				for (int i = 0; i < loom_st_count(s->st[f]); i++) {
					const char *name = loom_st_get(s->st[f], i)->name;
					const json_t *v = loom__json_get(ix.map, name);
					if (!v || strcmp(v->s, ix.files[f]) != 0) {
						rc = loom_seterr(LOOM_EFORMAT, "%s: tensor '%.80s' is in %s but weight_map %s%s", s->idxpath,
						                 name, ix.files[f], v ? "puts it in " : "does not list it", v ? v->s : "");
						goto out;
					}
				}
		}
	}
out:
	loom__hf_index_free(&ix);
	free(text);
	return rc;
}

/* "model.layers.<l>.self_attn.rotary_emb.inv_freq" (transformers 4's buffer, derived from the config). */
static int is_inv_freq(const char *name)
{
	const char *p = name;
	if (strncmp(p, "model.layers.", 13) != 0)
		return 0;
	p += 13;
	if (*p < '0' || *p > '9')
		return 0;
	while (*p >= '0' && *p <= '9')
		p++;
	return strcmp(p, ".self_attn.rotary_emb.inv_freq") == 0;
}

static void shape_text(char *buf, size_t cap, const size_t *shape, int ndim)
{
	int n = snprintf(buf, cap, "[");
	for (int d = 0; d < ndim && n < (int)cap - 24; d++)
		n += snprintf(buf + n, cap - (size_t)n, d ? ",%zu" : "%zu", shape[d]);
	snprintf(buf + n, cap - (size_t)n, "]");
}

/* Every file tensor matched to the table (O(tensors log tensors)). */
static int set_match(hfset_t *s)
{
	name_ix_t *byname = NULL;
	int rc = LOOM_OK, seen_dtype = 0;
	s->file = loom__malloc((size_t)s->nt * sizeof *s->file);
	s->idx = loom__malloc((size_t)s->nt * sizeof *s->idx);
	byname = loom__malloc((size_t)s->nt * sizeof *byname);
	if (!s->file || !s->idx || !byname) {
		free(byname);
		return loom_seterr(LOOM_ENOMEM, "%s: out of memory", s->dir);
	}
	s->lm_f = s->lm_i = s->embed = -1;
	for (int k = 0; k < s->nt; k++) {
		s->file[k] = -1, byname[k].name = s->tab[k].name, byname[k].k = k;
		if (strcmp(s->tab[k].name, "model.embed_tokens.weight") == 0)
			s->embed = k;
	}
	qsort(byname, (size_t)s->nt, sizeof *byname, cmp_name_ix);
	for (int f = 0; f < s->nf; f++)
		for (int i = 0; i < loom_st_count(s->st[f]); i++) {
			const loom_st_tensor_t *t = loom_st_get(s->st[f], i);
			name_ix_t key = {t->name, 0}, *hit = bsearch(&key, byname, (size_t)s->nt, sizeof *byname, cmp_name_ix);
			const loom_tensor_info_t *info;
			char got[128], want[128];
			if (!hit && is_inv_freq(t->name))
				continue;
			if (!hit && strcmp(t->name, "lm_head.weight") == 0 && s->cfg.tie_word_embeddings && s->embed >= 0) {
				info = &s->tab[s->embed]; /* checked equal to the embedding when loaded */
				s->lm_f = f, s->lm_i = i;
			} else if (!hit) {
				rc = loom_seterr(LOOM_EFORMAT, "%s: unexpected tensor '%.80s' (not part of the %s model of "
				                 "config.json, %d layers%s)", s->path[f], t->name, s->info.model_type, s->cfg.n_layer,
				                 strcmp(t->name, "lm_head.weight") == 0 ? ": lm_head.weight" : "");
				goto out;
			} else {
				info = &s->tab[hit->k];
				if (s->file[hit->k] >= 0) {
					rc = loom_seterr(LOOM_EFORMAT, "%s: tensor '%s' is also in %s", s->path[f], t->name,
					                 s->path[s->file[hit->k]]);
					goto out;
				}
				s->file[hit->k] = f, s->idx[hit->k] = i;
			}
			if (t->ndim != info->ndim || t->shape[0] != info->shape[0] ||
			    (info->ndim == 2 && t->shape[1] != info->shape[1])) {
				shape_text(got, sizeof got, t->shape, t->ndim);
				shape_text(want, sizeof want, info->shape, info->ndim);
				rc = loom_seterr(LOOM_EFORMAT, "%s: tensor '%s' has shape %s, config.json's model has %s", s->path[f],
				                 t->name, got, want);
				goto out;
			}
			if (t->dtype != LOOM_ST_F32 && t->dtype != LOOM_ST_BF16 && t->dtype != LOOM_ST_F16) {
				rc = loom_seterr(LOOM_EFORMAT, "%s: tensor '%s' has dtype %s, expected F32, BF16 or F16", s->path[f],
				                 t->name, loom_st_dtype_name(t->dtype));
				goto out;
			}
			if (!seen_dtype)
				s->info.dtype = t->dtype, seen_dtype = 1;
			else if (t->dtype != s->info.dtype)
				s->info.mixed_dtypes = 1;
		}
	for (int k = 0; k < s->nt; k++)
		if (s->file[k] < 0) {
			rc = loom_seterr(LOOM_EFORMAT, "%s: missing tensor '%s'%s", s->sharded ? s->idxpath : s->path[0],
			                 s->tab[k].name, strcmp(s->tab[k].name, "lm_head.weight") == 0
			                 ? " (config.json's tie_word_embeddings is false: the head is its own)" : "");
			goto out;
		}
	s->info.n_files = s->nf;
out:
	free(byname);
	return rc;
}

/* The configuration: loom's own file carries it in __metadata__ "hf_config" (read when there is no
 * config.json beside it); otherwise config.json. */
static int set_config(hfset_t *s)
{
	const char *text;
	if (!is_file(s->cfgpath) && !s->sharded && (text = loom_st_meta(s->st[0], "hf_config")))
		return loom_hf_config_parse(text, strlen(text), s->path[0], &s->cfg, &s->info);
	if (!is_file(s->cfgpath))
		return loom_seterr(LOOM_ENOENT, "%s: no config.json (a Hugging Face model directory has one)", s->cfgpath);
	return loom_hf_config_read(s->cfgpath, &s->cfg, &s->info);
}

static int set_build(hfset_t *s, const char *arg, loom__hf_table_fn table)
{
	int rc;
	memset(s, 0, sizeof *s);
	if ((rc = set_locate(s, arg)) || (rc = set_open(s)) || (rc = set_config(s)))
		return rc;
	if ((rc = (table ? table : loom__hf_family_table)(&s->cfg, &s->tab, &s->nt)) != LOOM_OK)
		return loom_seterr(rc, "%s: %s", s->cfgpath, loom_errmsg());
	return set_match(s);
}

int loom__hf_config(const char *arg, loom__hf_table_fn table, loom_model_config_t *cfg, loom_hf_info_t *info)
{
	hfset_t s;
	int rc = set_build(&s, arg, table);
	if (rc == LOOM_OK) {
		*cfg = s.cfg;
		if (info)
			*info = s.info;
	}
	set_free(&s);
	return rc;
}

/* bf16 / f16 / f32 bytes to floats */
static void to_f32(loom_st_dtype_t dt, const unsigned char *p, float *out, size_t n)
{
	if (dt == LOOM_ST_F32) {
		memcpy(out, p, n * 4);
	} else if (dt == LOOM_ST_BF16) { /* the upper half of a float: a shift (16-bit loads, so it vectorizes) */
		const uint16_t *h = (const uint16_t *)(const void *)p; /* buf is malloc'ed: aligned */
#pragma omp simd
		for (size_t j = 0; j < n; j++) {
			uint32_t bits = (uint32_t)h[j] << 16;
			memcpy(&out[j], &bits, 4);
		}
	} else {
		for (size_t j = 0; j < n; j++)
			out[j] = loom__half_to_f32((uint16_t)(p[2 * j] | (p[2 * j + 1] << 8)));
	}
}

/* ---- loading: pieces of HF_CHUNK bytes in the files' order, claimed by the threads in turn ----------- */

typedef struct {
	hfset_t *s;
	float *params;
	int *order;          /* table tensors in (file, offset) order: the files are read front to back */
	size_t *first;       /* first[j]: the number of pieces before tensor order[j]; first[nt]: all of them */
	atomic_size_t next;  /* the next piece to claim */
	atomic_int failed;   /* set by the first thread that fails: the others stop claiming */
	int rc;              /* that failure (written by the thread that set failed), with its message: */
	char msg[1024];      /* loom_seterr's message is the failing thread's own */
} load_t;

static int cmp_file_offset(const void *a, const void *b, void *ctx)
{
	const hfset_t *s = ctx;
	int i = *(const int *)a, j = *(const int *)b;
	if (s->file[i] != s->file[j])
		return s->file[i] < s->file[j] ? -1 : 1;
	const char *x = loom_st_get(s->st[s->file[i]], s->idx[i])->data, *y = loom_st_get(s->st[s->file[j]], s->idx[j])->data;
	return x < y ? -1 : x > y;
}

/* Claims pieces until none is left or a thread failed; each is read in HF_CHUNK steps with pread into
 * buf (this thread's) and converted from there into its place, F32 read straight into it. The pieces a
 * thread claims only grow, so its tensor cursor j only moves forward. */
static void load_pieces(load_t *L, unsigned char *buf)
{
	hfset_t *s = L->s;
	size_t total = L->first[s->nt];
	int j = 0, rc = LOOM_OK;
	for (;;) {
		size_t c = atomic_fetch_add(&L->next, 1);
		if (c >= total || atomic_load_explicit(&L->failed, memory_order_relaxed))
			break;
		while (L->first[j + 1] <= c)
			j++;
		int k = L->order[j];
		loom_st_t *st = s->st[s->file[k]];
		const loom_st_tensor_t *t = loom_st_get(st, s->idx[k]);
		size_t es = loom_st_dtype_size(t->dtype), off = (c - L->first[j]) * HF_PIECE;
		size_t end = t->nbytes - off < HF_PIECE ? t->nbytes : off + HF_PIECE;
		for (; off < end && rc == LOOM_OK; off += HF_CHUNK) {
			size_t n = end - off < HF_CHUNK ? end - off : HF_CHUNK;
			float *out = L->params + s->tab[k].offset + off / es;
			if (t->dtype == LOOM_ST_F32)
				rc = loom_st_read_bytes(st, s->idx[k], off, n, out);
			else if ((rc = loom_st_read_bytes(st, s->idx[k], off, n, buf)) == LOOM_OK)
				to_f32(t->dtype, buf, out, n / es);
		}
		if (rc != LOOM_OK) {
			int none = 0; /* the first failure claims rc and msg (read after the threads join) */
			if (atomic_compare_exchange_strong(&L->failed, &none, 1)) {
				L->rc = rc;
				snprintf(L->msg, sizeof L->msg, "%s", loom_errmsg());
			}
			break;
		}
	}
}

/* Every tensor of the table into params, on up to loom_num_threads() threads (OpenMP's), each with a
 * buffer of its own: while one thread waits for its read (a cold file) or faults in the pages it
 * writes (a parameter buffer that nobody has touched yet), the other converts. */
static int load_all(hfset_t *s, float *params)
{
	load_t L;
	unsigned char *bufs[HF_MAX_THREADS] = {0};
	int nth = hf_max_threads(), rc = LOOM_OK;
	memset(&L, 0, sizeof L);
	L.s = s, L.params = params;
	L.order = loom__malloc((size_t)s->nt * sizeof *L.order);
	L.first = loom__malloc(((size_t)s->nt + 1) * sizeof *L.first);
	if (!L.order || !L.first) {
		rc = loom_seterr(LOOM_ENOMEM, "%s: out of memory", s->dir);
		goto out;
	}
	for (int k = 0; k < s->nt; k++)
		L.order[k] = k;
	qsort_r(L.order, (size_t)s->nt, sizeof *L.order, cmp_file_offset, s);
	L.first[0] = 0;
	for (int j = 0; j < s->nt; j++)
		L.first[j + 1] = L.first[j] + (loom_st_get(s->st[s->file[L.order[j]]], s->idx[L.order[j]])->nbytes +
		                               HF_PIECE - 1) / HF_PIECE;
	nth = LOOM_MAX(1, LOOM_MIN(LOOM_MIN(nth, HF_MAX_THREADS), (int)LOOM_MIN(L.first[s->nt], (size_t)HF_MAX_THREADS)));
	for (int i = 0; i < nth; i++)
		if (!(bufs[i] = loom__malloc(HF_CHUNK))) {
			rc = loom_seterr(LOOM_ENOMEM, "%s: out of memory for a %u-byte read buffer", s->dir, HF_CHUNK);
			goto out;
		}
	for (int f = 0; f < s->nf; f++) /* a larger readahead window (a hint: its failure changes nothing) */
		(void)posix_fadvise(loom__st_fd(s->st[f]), 0, 0, POSIX_FADV_SEQUENTIAL);
	atomic_init(&L.next, 0);
	atomic_init(&L.failed, 0);
#pragma omp parallel num_threads(nth) if (nth > 1)
	load_pieces(&L, bufs[hf_thread_num()]);
	if (atomic_load(&L.failed))
		rc = loom_seterr(L.rc, "%s", L.msg);
out:
	for (int i = 0; i < HF_MAX_THREADS; i++)
		free(bufs[i]);
	free(L.order), free(L.first);
	return rc;
}

/* A tied lm_head.weight in the files must equal the embedding loaded: compared chunk by chunk. */
static int check_tied(hfset_t *s, const float *embed, unsigned char *buf)
{
	loom_st_t *st = s->st[s->lm_f];
	const loom_st_tensor_t *t = loom_st_get(st, s->lm_i);
	size_t es = loom_st_dtype_size(t->dtype), per = HF_CHUNK / 2 / 4, n = t->nbytes / es;
	float *tmp = (float *)(void *)(buf + HF_CHUNK / 2);
	for (size_t j = 0; j < n; j += per) {
		size_t m = n - j < per ? n - j : per;
		int rc = loom_st_read_bytes(st, s->lm_i, j * es, m * es, buf);
		if (rc != LOOM_OK)
			return rc;
		to_f32(t->dtype, buf, tmp, m);
		if (memcmp(tmp, embed + j, m * sizeof *tmp) != 0)
			return loom_seterr(LOOM_EFORMAT, "%s: lm_head.weight differs from model.embed_tokens.weight, but "
			                   "config.json's tie_word_embeddings is true (one matrix serves both)", s->path[s->lm_f]);
	}
	return LOOM_OK;
}

/* 1 when a and b give the same parameter table (what the caller allocated for is what is read). */
static int same_layout(const loom_model_config_t *a, const loom_model_config_t *b)
{
	int hda = a->head_dim ? a->head_dim : a->n_head ? a->n_embd / a->n_head : 0;
	int hdb = b->head_dim ? b->head_dim : b->n_head ? b->n_embd / b->n_head : 0;
	return a->arch == b->arch && a->n_layer == b->n_layer && a->n_head == b->n_head && a->n_embd == b->n_embd &&
	       a->vocab_size == b->vocab_size && (a->n_kv_head ? a->n_kv_head : a->n_head) ==
	       (b->n_kv_head ? b->n_kv_head : b->n_head) && hda == hdb && a->intermediate_size == b->intermediate_size &&
	       !a->tie_word_embeddings == !b->tie_word_embeddings && !a->attention_bias == !b->attention_bias &&
	       !a->qkv_bias == !b->qkv_bias && !a->mlp_bias == !b->mlp_bias;
}

int loom__hf_load(const char *arg, loom__hf_table_fn table, const loom_model_config_t *cfg, float *params)
{
	hfset_t s;
	unsigned char *buf = NULL;
	int rc = set_build(&s, arg, table);
	if (rc != LOOM_OK)
		goto out;
	if (!same_layout(cfg, &s.cfg)) {
		rc = loom_seterr(LOOM_EMISMATCH, "%s: the model's sizes differ from those of the configuration given to "
		                 "the load (L=%d C=%d V=%d in the file, L=%d C=%d V=%d given)", s.cfgpath, s.cfg.n_layer,
		                 s.cfg.n_embd, s.cfg.vocab_size, cfg->n_layer, cfg->n_embd, cfg->vocab_size);
		goto out;
	}
	if ((rc = load_all(&s, params)) != LOOM_OK)
		goto out;
	if (s.lm_f >= 0 && !(buf = loom__malloc(HF_CHUNK))) {
		rc = loom_seterr(LOOM_ENOMEM, "%s: out of memory for a %u-byte read buffer", s.dir, HF_CHUNK);
		goto out;
	}
	if (s.lm_f >= 0)
		rc = check_tied(&s, params + s.tab[s.embed].offset, buf);
out:
	free(buf);
	set_free(&s);
	return rc;
}

int loom_hf_dir_config(const char *dir, loom_model_config_t *cfg, loom_hf_info_t *info)
{
	return loom__hf_config(dir, NULL, cfg, info);
}

int loom_hf_dir_load(const char *dir, const loom_model_config_t *cfg, float *params)
{
	return loom__hf_load(dir, NULL, cfg, params);
}

/* ---- writing ----------------------------------------------------------------------------------------- */

static uint16_t f32_to_bf16(float x)
{
	uint32_t u;
	memcpy(&u, &x, 4);
	if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it a (quiet) NaN */
		return (uint16_t)((u >> 16) | 0x40);
	return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16); /* round to nearest even */
}

typedef struct {
	const float *params;
	const loom_tensor_info_t *tab;
	const int *members; /* table indices of this shard's tensors, in order */
	uint16_t *buf;      /* BF16: the largest tensor's conversion */
} fill_ctx_t;

static int fill_bf16(void *ctx, int i, const void **data)
{
	fill_ctx_t *c = ctx;
	const loom_tensor_info_t *t = &c->tab[c->members[i]];
	const float *src = c->params + t->offset;
	for (size_t j = 0; j < t->numel; j++)
		c->buf[j] = f32_to_bf16(src[j]);
	*data = c->buf;
	return LOOM_OK;
}

static int write_index(const char *path, const loom_tensor_info_t *tab, int nt, const int *shard, int ns,
                       size_t total, size_t es)
{
	atomic_file_t af;
	name_ix_t *s = loom__malloc((size_t)nt * sizeof *s);
	int rc;
	if (!s)
		return loom_seterr(LOOM_ENOMEM, "%s: out of memory", path);
	for (int k = 0; k < nt; k++)
		s[k].name = tab[k].name, s[k].k = k;
	qsort(s, (size_t)nt, sizeof *s, cmp_name_ix);
	if ((rc = loom__atomic_open(&af, path)) != LOOM_OK) {
		free(s);
		return rc;
	}
	(void)es;
	fprintf(af.f, "{\n  \"metadata\": {\n    \"total_size\": %zu\n  },\n  \"weight_map\": {\n", total);
	for (int k = 0; k < nt; k++) {
		fputs("    ", af.f);
		loom__json_write_string(af.f, s[k].name, strlen(s[k].name));
		fprintf(af.f, ": \"model-%05d-of-%05d.safetensors\"%s\n", shard[s[k].k] + 1, ns, k + 1 < nt ? "," : "");
	}
	fputs("  }\n}\n", af.f);
	free(s);
	return loom__atomic_commit(&af);
}

int loom__hf_save(const char *dir, loom__hf_table_fn table, const loom_model_config_t *cfg, const float *params,
                  const loom_hf_save_opts_t *opts)
{
	loom_hf_save_opts_t o = {LOOM_ST_F32, 0, -1, 0};
	loom_tensor_info_t *tab = NULL;
	loom_st_tensor_t *t = NULL;
	int nt = 0, ns = 0, *shard = NULL, *members = NULL, rc, made = 0;
	char d[1024], tmp[1100], old[1100], path[1300];
	size_t es, cur = 0, total = 0, largest = 0;
	fill_ctx_t fc = {params, NULL, NULL, NULL};
	const char *meta[2] = {"format", "pt"};
	if (opts)
		o = *opts;
	if (o.shard_bytes == 0)
		o.shard_bytes = HF_DEFAULT_SHARD;
	if (o.dtype != LOOM_ST_F32 && o.dtype != LOOM_ST_BF16)
		return loom_seterr(LOOM_EINVAL, "%s: weights are written as F32 or BF16, not %s", dir,
		                   loom_st_dtype_name(o.dtype));
	es = loom_st_dtype_size(o.dtype);
	size_t dl = strlen(dir);
	while (dl > 1 && dir[dl - 1] == '/')
		dl--;
	if (dl == 0 || dl >= sizeof d)
		return loom_seterr(LOOM_EINVAL, "%s: not a usable directory name", dir);
	memcpy(d, dir, dl), d[dl] = 0;
	if (!o.replace && access(d, F_OK) == 0)
		return loom_seterr(LOOM_EINVAL, "%s exists; a model directory is written whole into a new directory (or "
		                   "replaced when asked)", d);
	if ((rc = (table ? table : loom__hf_family_table)(cfg, &tab, &nt)) != LOOM_OK)
		return loom_seterr(rc, "%s: %s", d, loom_errmsg());
	snprintf(tmp, sizeof tmp, "%s.tmp-%ld", d, (long)getpid());
	snprintf(old, sizeof old, "%s.old-%ld", d, (long)getpid());
	shard = loom__malloc((size_t)nt * sizeof *shard);
	members = loom__malloc((size_t)nt * sizeof *members);
	t = loom__calloc((size_t)nt, sizeof *t);
	if (!shard || !members || !t) {
		rc = loom_seterr(LOOM_ENOMEM, "%s: out of memory", d);
		goto out;
	}
	for (int k = 0; k < nt; k++) { /* greedy: a new shard when this tensor would pass the size */
		size_t b = tab[k].numel * es;
		if (k > 0 && cur + b > o.shard_bytes)
			ns++, cur = 0;
		shard[k] = ns, cur += b, total += b;
		largest = LOOM_MAX(largest, tab[k].numel);
	}
	ns++;
	if (o.dtype == LOOM_ST_BF16 && !(fc.buf = loom__malloc(largest * sizeof *fc.buf))) {
		rc = loom_seterr(LOOM_ENOMEM, "%s: out of memory for a %zu-byte conversion buffer", d,
		                 largest * sizeof *fc.buf);
		goto out;
	}
	loom__rm_rf(tmp);
	if ((rc = loom__mkdir_p(tmp)) != LOOM_OK)
		goto out;
	made = 1;
	fc.tab = tab, fc.members = members;
	for (int sh = 0, k = 0; sh < ns; sh++) {
		int n = 0;
		for (; k < nt && shard[k] == sh; k++, n++) {
			members[n] = k;
			t[n].name = tab[k].name;
			t[n].dtype = o.dtype;
			t[n].ndim = tab[k].ndim;
			t[n].shape[0] = tab[k].shape[0], t[n].shape[1] = tab[k].shape[1];
			t[n].nbytes = tab[k].numel * es;
			t[n].data = o.dtype == LOOM_ST_F32 ? params + tab[k].offset : NULL;
		}
		if (ns == 1)
			snprintf(path, sizeof path, "%s/model.safetensors", tmp);
		else
			snprintf(path, sizeof path, "%s/model-%05d-of-%05d.safetensors", tmp, sh + 1, ns);
		if ((rc = loom__st_write_fill(path, t, n, meta, 1, fill_bf16, &fc)) != LOOM_OK)
			goto out;
	}
	if (ns > 1) {
		snprintf(path, sizeof path, "%s/model.safetensors.index.json", tmp);
		if ((rc = write_index(path, tab, nt, shard, ns, total, es)) != LOOM_OK)
			goto out;
	}
	snprintf(path, sizeof path, "%s/config.json", tmp);
	if ((rc = loom_hf_config_write(path, cfg, o.dtype == LOOM_ST_BF16 ? "bfloat16" : "float32", o.eot)) != LOOM_OK ||
	    (rc = loom__fsync_path(tmp)) != LOOM_OK)
		goto out;
	/* into place: an existing directory (replace) aside first, removed once the new one is there */
	int had = access(d, F_OK) == 0;
	if (had && rename(d, old) != 0) {
		rc = loom_seterr(LOOM_ESYS, "%s: cannot move the old directory aside: %s", d, strerror(errno));
		goto out;
	}
	if (rename(tmp, d) != 0) {
		rc = loom_seterr(LOOM_ESYS, "%s: rename from %s: %s", d, tmp, strerror(errno));
		if (had)
			rename(old, d);
		goto out;
	}
	made = 0;
	if ((rc = loom__fsync_parent(d)) == LOOM_OK && had)
		rc = loom__rm_rf(old);
out:
	if (made)
		loom__rm_rf(tmp);
	free(fc.buf), free(t), free(members), free(shard), free(tab);
	return rc;
}

int loom_hf_dir_save(const char *dir, const loom_model_config_t *cfg, const float *params,
                     const loom_hf_save_opts_t *opts)
{
	return loom__hf_save(dir, NULL, cfg, params, opts);
}
