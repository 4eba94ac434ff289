/* model.c: GPT-2 model files as safetensors with Hugging Face's names and shapes, and AdamW state.
 *
 * Writing uses the tensor table of loom/gpt2.h (HF names, Conv1D weights [in, out]) and puts the
 * config in __metadata__ (plus "format": "pt", which HF's loader requires), and config.json beside it
 * (hf_config.c), so that the directory loads with GPT2LMHeadModel.from_pretrained. Reading accepts HF's own
 * gpt2 file: names with or without "transformer.", attn.bias / attn.masked_bias buffers (ignored),
 * lm_head.weight only when bit-equal to wte (tied), n_head from __metadata__, config.json beside the
 * file, or the caller. Dimensions come from the shapes; every tensor is checked against the table.
 * Invariant: loom_model_config succeeds only for a file that holds every tensor of its config's table
 * with the table's shape (so at least 2 bytes per parameter) within the limits of model_internal.h,
 * checked in O(tensors) from the header alone, so a caller may allocate the parameters it reports. */
#include <libgen.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/json.h"
#include "ckpt/model_internal.h"
#include "core/util.h"
#include "core/fileio.h"
#include "loom/ckpt.h"

static const char *strip_prefix(const char *name)
{
	return strncmp(name, "transformer.", 12) == 0 ? name + 12 : name;
}

static int ends_with(const char *s, const char *suffix)
{
	size_t n = strlen(s), m = strlen(suffix);
	return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* A buffer we ignore: attn.bias / attn.masked_bias (the causal mask HF stores). */
static int is_buffer(const char *name)
{
	name = strip_prefix(name);
	return strncmp(name, "h.", 2) == 0 && (ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias"));
}

static int find_tensor(const loom_st_t *st, const char *name)
{
	char buf[LOOM_TENSOR_NAME_MAX + 16];
	int i = loom_st_find(st, name);
	if (i >= 0)
		return i;
	snprintf(buf, sizeof buf, "transformer.%s", name);
	return loom_st_find(st, buf);
}

static int parse_pos_int(const char *s, int *out)
{
	char *end;
	long v = strtol(s, &end, 10);
	if (end == s || *end || v <= 0 || v > (1 << 30))
		return -1;
	*out = (int)v;
	return 0;
}

/* n_head from config.json in the directory of path: 0 when found, LOOM_ENOENT when there is no file. */
static int n_head_from_config_json(const char *path, int *n_head, char *cfgpath, size_t cap)
{
	char dir[1100], *text;
	size_t len;
	json_t root;
	char err[200];
	const json_t *v;
	int64_t x;
	int rc;
	snprintf(dir, sizeof dir, "%s", path);
	snprintf(cfgpath, cap, "%s/config.json", dirname(dir));
	if ((rc = loom__read_file_max(cfgpath, LOOM_MODEL_CONFIG_JSON_MAX, &text, &len)) != LOOM_OK)
		return rc;
	if ((rc = loom__json_parse(text, len, &root, err, sizeof err)) != 0) {
		free(text);
		loom__json_free(&root);
		return loom_seterr(rc == LOOM_ENOMEM ? rc : LOOM_EFORMAT, "%s: bad JSON: %s", cfgpath, err);
	}
	free(text);
	v = loom__json_get(&root, "n_head");
	if (!v)
		v = loom__json_get(&root, "num_attention_heads");
	rc = !v || loom__json_to_i64(v, &x) || x <= 0 || x > (1 << 30)
	         ? loom_seterr(LOOM_EFORMAT, "%s: no positive integer \"n_head\"", cfgpath)
	         : LOOM_OK;
	if (rc == LOOM_OK)
		*n_head = (int)x;
	loom__json_free(&root);
	return rc;
}

int loom__model_file_check(const char *path, const loom_model_config_t *cfg, size_t *numel)
{
	static const struct {
		const char *name;
		long max;
	} lim[] = {{"n_layer", LOOM_MODEL_MAX_LAYERS}, {"n_head", LOOM_MODEL_MAX_EMBD}, {"n_embd", LOOM_MODEL_MAX_EMBD},
	           {"seq_len", LOOM_MODEL_MAX_SEQ}, {"vocab_size", LOOM_MODEL_MAX_VOCAB}};
	const int val[5] = {cfg->n_layer, cfg->n_head, cfg->n_embd, cfg->seq_len, cfg->vocab_size};
	size_t C = (size_t)cfg->n_embd, layer, emb, n;
	for (int i = 0; i < 5; i++)
		if (val[i] <= 0 || val[i] > lim[i].max)
			return loom_seterr(LOOM_EFORMAT, "%s: %s = %d is outside loom's limits [1, %ld]", path, lim[i].name,
			                   val[i], lim[i].max);
	if (loom_model_config_check(cfg) != LOOM_OK)
		return loom_seterr(LOOM_EFORMAT, "%s: %s", path, loom_errmsg());
	/* 12 C^2 + 13 C per layer, (V + T) C + 2 C outside: the limits keep this below 2^47, and the
	 * checks make that a fact rather than an assumption. */
	if (__builtin_mul_overflow(C, 12 * C + 13, &layer) || __builtin_mul_overflow(layer, (size_t)cfg->n_layer, &n) ||
	    __builtin_mul_overflow((size_t)cfg->vocab_size + (size_t)cfg->seq_len + 2, C, &emb) ||
	    __builtin_add_overflow(n, emb, &n) || n > SIZE_MAX / sizeof(float))
		return loom_seterr(LOOM_EFORMAT, "%s: the parameter count overflows", path);
	*numel = n;
	return LOOM_OK;
}

/* The table index of tensor `name` (with or without "transformer.") in a model of n_layer layers,
 * parsed in O(1): "wte.weight" 0, "wpe.weight" 1, "h.<l>.<suffix>" (l in canonical decimal, < n_layer)
 * 2 + 12 l + j, "ln_f.weight"/"ln_f.bias" last; -1 for any other name. suffix[j] is the text after
 * "h.0." of layer tensor j. */
static int tensor_index(const char *name, int n_layer, char suffix[LOOM_GPT2_LAYER_TENSORS][LOOM_TENSOR_NAME_MAX])
{
	const char *p;
	long l = 0;
	int nt = 2 + LOOM_GPT2_LAYER_TENSORS * n_layer + 2;
	name = strip_prefix(name);
	if (strcmp(name, "wte.weight") == 0)
		return 0;
	if (strcmp(name, "wpe.weight") == 0)
		return 1;
	if (strcmp(name, "ln_f.weight") == 0)
		return nt - 2;
	if (strcmp(name, "ln_f.bias") == 0)
		return nt - 1;
	if (strncmp(name, "h.", 2) != 0 || name[2] < '0' || name[2] > '9' || (name[2] == '0' && name[3] != '.'))
		return -1;
	for (p = name + 2; *p >= '0' && *p <= '9'; p++)
		if ((l = 10 * l + (*p - '0')) >= n_layer)
			return -1;
	if (*p++ != '.')
		return -1;
	for (int j = 0; j < LOOM_GPT2_LAYER_TENSORS; j++)
		if (strcmp(p, suffix[j]) == 0)
			return 2 + (int)l * LOOM_GPT2_LAYER_TENSORS + j;
	return -1;
}

static void layer_suffixes(const loom_model_config_t *cfg, char suffix[LOOM_GPT2_LAYER_TENSORS][LOOM_TENSOR_NAME_MAX])
{
	for (int j = 0; j < LOOM_GPT2_LAYER_TENSORS; j++) {
		loom_tensor_info_t info;
		loom_model_tensor_info(cfg, 2 + j, &info); /* "h.0.<suffix>" */
		memcpy(suffix[j], info.name + 4, sizeof info.name - 4); /* NUL-terminated: info.name is */
	}
}

/* Match the file's tensors to the table of cfg: every tensor is a GPT-2 tensor (or an ignored buffer,
 * or lm_head.weight, whose file index goes to *lm_head) of the table's shape, each at most once, none
 * missing. which[k] = the file index of table tensor k (nt ints, caller-allocated). O(file tensors). */
/* The file's tensor t against the table's info: the same shape, a float dtype. LOOM_EFORMAT naming both. */
static int check_tensor(const char *path, const loom_st_tensor_t *t, const loom_tensor_info_t *info)
{
	if (t->ndim != info->ndim || t->shape[0] != info->shape[0] || (info->ndim == 2 && t->shape[1] != info->shape[1])) {
		char got[128];
		int n = 0;
		for (int d = 0; d < t->ndim && n < 100; d++)
			n += snprintf(got + n, sizeof got - (size_t)n, d ? ",%zu" : "%zu", t->shape[d]);
		got[n] = 0;
		return loom_seterr(LOOM_EFORMAT, "%s: tensor '%s' has shape [%s], expected [%zu%s%.0zu]", path, t->name, got,
		                   info->shape[0], info->ndim == 2 ? "," : "", info->ndim == 2 ? info->shape[1] : 0);
	}
	switch (t->dtype) {
	case LOOM_ST_F32: case LOOM_ST_F16: case LOOM_ST_BF16: case LOOM_ST_F64: return LOOM_OK;
	default:
		return loom_seterr(LOOM_EFORMAT, "%s: tensor '%s' has dtype %s, expected a float type (F32, BF16, F16, F64)",
		                   path, t->name, loom_st_dtype_name(t->dtype));
	}
}

static int match_tensors(const char *path, const loom_st_t *st, const loom_model_config_t *cfg, int *which,
                         int *lm_head)
{
	char suffix[LOOM_GPT2_LAYER_TENSORS][LOOM_TENSOR_NAME_MAX];
	int nt = loom_model_num_tensors(cfg), rc;
	layer_suffixes(cfg, suffix);
	*lm_head = -1;
	for (int k = 0; k < nt; k++)
		which[k] = -1;
	for (int i = 0; i < loom_st_count(st); i++) {
		const loom_st_tensor_t *t = loom_st_get(st, i);
		loom_tensor_info_t info;
		int k;
		if (is_buffer(t->name))
			continue;
		if (strcmp(strip_prefix(t->name), "lm_head.weight") == 0) {
			*lm_head = i;
			continue;
		}
		if ((k = tensor_index(t->name, cfg->n_layer, suffix)) < 0)
			return loom_seterr(LOOM_EFORMAT, "%s: unexpected tensor '%.80s' (not part of GPT-2 with L=%d)", path,
			                   t->name, cfg->n_layer);
		loom_model_tensor_info(cfg, k, &info);
		if (which[k] >= 0)
			return loom_seterr(LOOM_EFORMAT, "%s: tensor '%s' appears twice (with and without the transformer. "
			                   "prefix)", path, info.name);
		if ((rc = check_tensor(path, t, &info)) != LOOM_OK)
			return rc;
		which[k] = i;
	}
	for (int k = 0; k < nt; k++) {
		if (which[k] < 0) {
			loom_tensor_info_t info;
			loom_model_tensor_info(cfg, k, &info);
			return loom_seterr(LOOM_EFORMAT, "%s: missing tensor '%s'", path, info.name);
		}
	}
	if (*lm_head >= 0) {
		const loom_st_tensor_t *t = loom_st_get(st, *lm_head);
		if (t->ndim != 2 || t->shape[0] != (size_t)cfg->vocab_size || t->shape[1] != (size_t)cfg->n_embd)
			return loom_seterr(LOOM_EFORMAT, "%s: lm_head.weight is not [%d, %d] like wte.weight", path,
			                   cfg->vocab_size, cfg->n_embd);
	}
	return LOOM_OK;
}

/* The layer count: one more than the largest l of an "h.<l>." name, looking no further than the
 * number of tensors allows (a file with 12 L tensors has at most L layers). */
static int infer_layers(const loom_st_t *st)
{
	long L = 0, cap = loom_st_count(st) / LOOM_GPT2_LAYER_TENSORS;
	for (int i = 0; i < loom_st_count(st); i++) {
		const char *p = strip_prefix(loom_st_get(st, i)->name);
		long l = 0;
		if (strncmp(p, "h.", 2) != 0 || p[2] < '0' || p[2] > '9')
			continue;
		for (p += 2; *p >= '0' && *p <= '9'; p++)
			if (l <= cap) /* saturates just above cap: no overflow */
				l = 10 * l + (*p - '0');
		if (*p == '.' && l + 1 > L)
			L = l + 1;
	}
	return L > cap ? -1 : (int)L;
}

/* GPT-2 (Hugging Face's files and loom's own): dimensions from wte and wpe, the layer count from the
 * names, n_head from __metadata__, config.json or the caller. */
static int gpt2_config(loom_st_t *st, const char *path, int n_head_hint, loom_model_config_t *cfg)
{
	const loom_st_tensor_t *wte, *wpe;
	const char *meta;
	char cfgpath[1200];
	int rc, iw, ip, L, lm_head, *which = NULL;
	size_t numel;
	iw = find_tensor(st, "wte.weight");
	ip = find_tensor(st, "wpe.weight");
	if (iw < 0 || ip < 0) {
		rc = loom_seterr(LOOM_EFORMAT, "%s: not a GPT-2 model: missing tensor %s", path,
		                 iw < 0 ? "wte.weight" : "wpe.weight");
		goto out;
	}
	wte = loom_st_get(st, iw), wpe = loom_st_get(st, ip);
	if (wte->ndim != 2 || wpe->ndim != 2 || wte->shape[1] != wpe->shape[1] || wte->shape[0] == 0 ||
	    wpe->shape[0] == 0 || wte->shape[1] == 0 || wte->shape[0] > LOOM_MODEL_MAX_VOCAB ||
	    wpe->shape[0] > LOOM_MODEL_MAX_SEQ || wte->shape[1] > LOOM_MODEL_MAX_EMBD) {
		rc = loom_seterr(LOOM_EFORMAT, "%s: wte.weight and wpe.weight must be [V, C] and [T, C] with the same C "
		                 "(V <= %d, T <= %d, C <= %d)", path, LOOM_MODEL_MAX_VOCAB, LOOM_MODEL_MAX_SEQ,
		                 LOOM_MODEL_MAX_EMBD);
		goto out;
	}
	if ((L = infer_layers(st)) < 0) {
		rc = loom_seterr(LOOM_EFORMAT, "%s: a layer index is larger than the file's %d tensors allow (%d per "
		                 "layer)", path, loom_st_count(st), LOOM_GPT2_LAYER_TENSORS);
		goto out;
	}
	cfg->vocab_size = (int)wte->shape[0];
	cfg->n_embd = (int)wte->shape[1];
	cfg->seq_len = (int)wpe->shape[0];
	cfg->n_layer = L;
	if (L == 0) {
		rc = loom_seterr(LOOM_EFORMAT, "%s: no transformer layers (no h.0.* tensors)", path);
		goto out;
	}
	if ((meta = loom_st_meta(st, "n_head"))) {
		if (parse_pos_int(meta, &cfg->n_head)) {
			rc = loom_seterr(LOOM_EFORMAT, "%s: __metadata__ n_head '%.40s' is not a positive integer", path, meta);
			goto out;
		}
	} else {
		rc = n_head_from_config_json(path, &cfg->n_head, cfgpath, sizeof cfgpath);
		if (rc == LOOM_ENOENT && n_head_hint > 0) {
			cfg->n_head = n_head_hint;
			rc = LOOM_OK;
		} else if (rc == LOOM_ENOENT) {
			rc = loom_seterr(LOOM_EINVAL, "%s: the number of heads is unknown: no n_head in __metadata__, no %s; "
			                 "give it explicitly (--n-head)", path, cfgpath);
		}
		if (rc != LOOM_OK)
			goto out;
	}
	if ((rc = loom__model_file_check(path, cfg, &numel)) != LOOM_OK)
		goto out;
	/* Every tensor of the table present with its shape (so the file holds >= 2 bytes per parameter):
	 * the caller may now allocate numel floats without trusting anything else. */
	if (!(which = loom__malloc((size_t)loom_model_num_tensors(cfg) * sizeof *which))) {
		rc = loom_seterr(LOOM_ENOMEM, "%s: out of memory", path);
		goto out;
	}
	rc = match_tensors(path, st, cfg, which, &lm_head);
out:
	free(which);
	return rc;
}

/* ---- families whose files name them (__metadata__ "arch"; every family but GPT-2, whose files are
 * Hugging Face's): the configuration from __metadata__, every tensor of the family's table by its name
 * and shape, nothing else. */

static int meta_int(const loom_st_t *st, const char *path, const char *key, int required, int *out)
{
	const char *v = loom_st_meta(st, key);
	if (!v) {
		if (required)
			return loom_seterr(LOOM_EFORMAT, "%s: __metadata__ has no %s", path, key);
		*out = 0;
		return LOOM_OK;
	}
	if (parse_pos_int(v, out))
		return loom_seterr(LOOM_EFORMAT, "%s: __metadata__ %s '%.40s' is not a positive integer", path, key, v);
	return LOOM_OK;
}

static int family_config(const loom_st_t *st, const char *path, loom_arch_t arch, loom_model_config_t *cfg)
{
	static const struct {
		const char *key;
		size_t field;
		int required;
		long max;
	} keys[] = {
		{"n_layer", offsetof(loom_model_config_t, n_layer), 1, LOOM_MODEL_MAX_LAYERS},
		{"n_head", offsetof(loom_model_config_t, n_head), 1, LOOM_MODEL_MAX_EMBD},
		{"n_embd", offsetof(loom_model_config_t, n_embd), 1, LOOM_MODEL_MAX_EMBD},
		{"n_positions", offsetof(loom_model_config_t, seq_len), 1, LOOM_MODEL_MAX_SEQ},
		{"vocab_size", offsetof(loom_model_config_t, vocab_size), 1, LOOM_MODEL_MAX_VOCAB},
		{"n_kv_head", offsetof(loom_model_config_t, n_kv_head), 0, LOOM_MODEL_MAX_EMBD},
		{"short_window", offsetof(loom_model_config_t, short_window), 0, LOOM_MODEL_MAX_SEQ},
	};
	int rc;
	const char *pat;
	memset(cfg, 0, sizeof *cfg);
	cfg->arch = arch;
	for (size_t k = 0; k < LOOM_ARRAY_LEN(keys); k++) {
		int *f = (int *)(void *)((char *)cfg + keys[k].field);
		if ((rc = meta_int(st, path, keys[k].key, keys[k].required, f)) != LOOM_OK)
			return rc;
		if (*f > keys[k].max)
			return loom_seterr(LOOM_EFORMAT, "%s: %s = %d is outside loom's limits [1, %ld]", path, keys[k].key, *f,
			                   keys[k].max);
	}
	if ((pat = loom_st_meta(st, "window_pattern"))) {
		if (strlen(pat) >= sizeof cfg->window_pattern)
			return loom_seterr(LOOM_EFORMAT, "%s: __metadata__ window_pattern is longer than %zu characters", path,
			                   sizeof cfg->window_pattern - 1);
		snprintf(cfg->window_pattern, sizeof cfg->window_pattern, "%s", pat);
	}
	if (loom_model_config_check(cfg) != LOOM_OK)
		return loom_seterr(LOOM_EFORMAT, "%s: %s", path, loom_errmsg());
	return LOOM_OK;
}

/* which[k]: the file's index of table tensor k, each present once with the table's shape and a float
 * dtype; any other tensor is an error. */
static int family_match(const char *path, const loom_st_t *st, const loom_model_config_t *cfg, int *which)
{
	int nt = loom_model_num_tensors(cfg);
	for (int k = 0; k < nt; k++)
		which[k] = -1;
	for (int i = 0; i < loom_st_count(st); i++) {
		const loom_st_tensor_t *t = loom_st_get(st, i);
		loom_tensor_info_t info;
		int k = loom_model_tensor_index(cfg, t->name);
		if (k < 0)
			return loom_seterr(LOOM_EFORMAT, "%s: unexpected tensor '%.80s' (not part of the %s model with L=%d)",
			                   path, t->name, loom_arch_name(cfg->arch), cfg->n_layer);
		loom_model_tensor_info(cfg, k, &info);
		int rc = check_tensor(path, t, &info);
		if (rc != LOOM_OK)
			return rc;
		which[k] = i;
	}
	for (int k = 0; k < nt; k++)
		if (which[k] < 0) {
			loom_tensor_info_t info;
			loom_model_tensor_info(cfg, k, &info);
			return loom_seterr(LOOM_EFORMAT, "%s: missing tensor '%s'", path, info.name);
		}
	return LOOM_OK;
}

/* The family the file names in __metadata__ "arch" (GPT-2 when it names none: Hugging Face's files). */
static int file_arch(const loom_st_t *st, const char *path, loom_arch_t *arch)
{
	const char *a = loom_st_meta(st, "arch");
	*arch = LOOM_ARCH_GPT2;
	if (a && loom_arch_parse(a, arch) != LOOM_OK)
		return loom_seterr(LOOM_EFORMAT, "%s: __metadata__ arch '%.40s' is not a model family loom has (gpt2, "
		                   "nanochat)", path, a);
	return LOOM_OK;
}

static int family_load(loom_st_t *st, const char *path, const loom_model_config_t *cfg, float *params)
{
	int nt = loom_model_num_tensors(cfg), rc;
	int *which = loom__malloc((size_t)nt * sizeof *which);
	if (!which)
		return loom_seterr(LOOM_ENOMEM, "%s: out of memory", path);
	rc = family_match(path, st, cfg, which);
	for (int k = 0; rc == LOOM_OK && k < nt; k++) {
		loom_tensor_info_t info;
		loom_model_tensor_info(cfg, k, &info);
		rc = loom_st_read_f32(st, which[k], params + info.offset, info.numel);
	}
	free(which);
	return rc;
}

int loom__st_model_config(const char *path, int n_head_hint, loom_model_config_t *cfg)
{
	loom_st_t *st;
	loom_arch_t arch;
	int rc;
	memset(cfg, 0, sizeof *cfg);
	if ((rc = loom_st_open(&st, path)) != LOOM_OK)
		return rc;
	if (loom__hf_is_llama_file(path, st)) { /* the llama family: config.json or its copy in __metadata__ */
		loom_st_close(st);
		return loom_hf_dir_config(path, cfg, NULL);
	}
	if ((rc = file_arch(st, path, &arch)) == LOOM_OK) {
		if (arch == LOOM_ARCH_GPT2) {
			rc = gpt2_config(st, path, n_head_hint, cfg);
		} else if ((rc = family_config(st, path, arch, cfg)) == LOOM_OK) {
			int *which = loom__malloc((size_t)loom_model_num_tensors(cfg) * sizeof *which);
			rc = which ? family_match(path, st, cfg, which) : loom_seterr(LOOM_ENOMEM, "%s: out of memory", path);
			free(which);
		}
	}
	loom_st_close(st);
	return rc;
}

int loom__st_model_load(const char *path, const loom_model_config_t *cfg, float *params)
{
	loom_st_t *st;
	int nt = loom_model_num_tensors(cfg), rc = LOOM_OK, lm_head = -1;
	int *which = loom__malloc((size_t)nt * sizeof *which);
	if (!which)
		return loom_seterr(LOOM_ENOMEM, "%s: out of memory", path);
	if ((rc = loom_st_open(&st, path)) != LOOM_OK) {
		free(which);
		return rc;
	}
	if (cfg->arch == LOOM_ARCH_LLAMA) {
		loom_st_close(st);
		free(which);
		return loom_hf_dir_load(path, cfg, params);
	}
	if (cfg->arch != LOOM_ARCH_GPT2) {
		rc = family_load(st, path, cfg, params);
		goto out;
	}
	if ((rc = match_tensors(path, st, cfg, which, &lm_head)) != LOOM_OK)
		goto out;
	for (int k = 0; k < nt; k++) {
		loom_tensor_info_t info;
		loom_model_tensor_info(cfg, k, &info);
		if ((rc = loom_st_read_f32(st, which[k], params + info.offset, info.numel)) != LOOM_OK)
			goto out;
	}
	if (lm_head >= 0) {
		size_t n = (size_t)cfg->vocab_size * (size_t)cfg->n_embd;
		float *tmp = loom__malloc(n * sizeof *tmp);
		if (!tmp) {
			rc = loom_seterr(LOOM_ENOMEM, "%s: out of memory for lm_head.weight (%zu bytes)", path, n * sizeof *tmp);
			goto out;
		}
		rc = loom_st_read_f32(st, lm_head, tmp, n);
		if (rc == LOOM_OK && memcmp(tmp, params, n * sizeof *tmp) != 0)
			rc = loom_seterr(LOOM_ENOTSUP, "%s: lm_head.weight differs from wte.weight (untied heads are not "
			                 "supported; GPT-2 ties them)", path);
		free(tmp);
	}
out:
	loom_st_close(st);
	free(which);
	return rc;
}

static int model_save(const char *path, const loom_model_config_t *cfg, const float *params, loom__st_fill_fn fill,
                      void *ctx);
static int optim_save(const char *path, const loom_model_config_t *cfg, const float *m, const float *v,
                      loom__st_fill_fn fill, void *ctx);

/* The config as __metadata__ pairs (GPT-2's five numbers; another family's file also names its arch
 * and its own fields); bufs holds the number texts. Returns the number of pairs. */
static int config_meta(const loom_model_config_t *cfg, const char *kind, char bufs[8][16], const char *meta[26])
{
	const char *keys[7] = {"n_layer", "n_head", "n_embd", "n_positions", "vocab_size", "n_kv_head", "short_window"};
	int vals[7] = {cfg->n_layer, cfg->n_head, cfg->n_embd, cfg->seq_len, cfg->vocab_size, cfg->n_kv_head,
	               cfg->short_window};
	int n = 0;
	for (int i = 0; i < 7; i++) {
		if (i >= 5 && (cfg->arch == LOOM_ARCH_GPT2 || vals[i] <= 0))
			continue;
		snprintf(bufs[i], 16, "%d", vals[i]);
		meta[2 * n] = keys[i], meta[2 * n + 1] = bufs[i], n++;
	}
	meta[2 * n] = "format", meta[2 * n + 1] = "pt", n++;
	meta[2 * n] = "loom", meta[2 * n + 1] = kind, n++;
	if (cfg->arch != LOOM_ARCH_GPT2) {
		meta[2 * n] = "arch", meta[2 * n + 1] = loom_arch_name(cfg->arch), n++;
		if (cfg->window_pattern[0])
			meta[2 * n] = "window_pattern", meta[2 * n + 1] = cfg->window_pattern, n++;
	}
	return n;
}

int loom_model_save_safetensors(const char *path, const loom_model_config_t *cfg, const float *params)
{
	return params ? model_save(path, cfg, params, NULL, NULL)
	              : loom_seterr(LOOM_EINVAL, "%s: no parameters to save", path);
}

int loom__model_save_fill(const char *path, const loom_model_config_t *cfg, loom__st_fill_fn fill, void *ctx)
{
	return model_save(path, cfg, NULL, fill, ctx);
}

static int model_save(const char *path, const loom_model_config_t *cfg, const float *params, loom__st_fill_fn fill,
                      void *ctx)
{
	int nt, rc;
	loom_st_tensor_t *t;
	loom_tensor_info_t *info;
	char bufs[8][16];
	const char *meta[26];
	if ((rc = loom_model_config_check(cfg)) != LOOM_OK)
		return rc;
	nt = loom_model_num_tensors(cfg);
	t = loom__calloc((size_t)nt, sizeof *t);
	info = loom__calloc((size_t)nt, sizeof *info);
	if (!t || !info) {
		free(t), free(info);
		return loom_seterr(LOOM_ENOMEM, "%s: out of memory", path);
	}
	for (int i = 0; i < nt; i++) {
		loom_model_tensor_info(cfg, i, &info[i]);
		t[i].name = info[i].name;
		t[i].dtype = LOOM_ST_F32;
		t[i].ndim = info[i].ndim;
		t[i].shape[0] = info[i].shape[0], t[i].shape[1] = info[i].shape[1];
		t[i].data = params ? params + info[i].offset : NULL;
		t[i].nbytes = info[i].numel * sizeof(float);
	}
	int n_meta = config_meta(cfg, loom_arch_name(cfg->arch), bufs, meta);
	char *hf = NULL; /* the llama family's configuration has more than numbers: its config.json, whole */
	if (cfg->arch == LOOM_ARCH_LLAMA && (rc = loom__hf_config_text(cfg, "float32", -1, &hf)) == LOOM_OK)
		meta[2 * n_meta] = "hf_config", meta[2 * n_meta + 1] = hf, n_meta++;
	if (rc == LOOM_OK)
		rc = loom__st_write_fill(path, t, nt, meta, n_meta, fill, ctx);
	free(hf);
	free(t), free(info);
	return rc ? rc : loom_model_write_hf_config(path, cfg, -1);
}

int loom_optim_save(const char *path, const loom_model_config_t *cfg, const float *m, const float *v)
{
	if (!m || !v)
		return loom_seterr(LOOM_EINVAL, "%s: optimizer state needs both m and v", path);
	return optim_save(path, cfg, m, v, NULL, NULL);
}

int loom__optim_save_fill(const char *path, const loom_model_config_t *cfg, loom__st_fill_fn fill, void *ctx)
{
	return optim_save(path, cfg, NULL, NULL, fill, ctx);
}

static int optim_save(const char *path, const loom_model_config_t *cfg, const float *m, const float *v,
                      loom__st_fill_fn fill, void *ctx)
{
	int nt, rc;
	loom_st_tensor_t *t;
	char (*names)[LOOM_TENSOR_NAME_MAX + 16];
	char bufs[8][16];
	const char *meta[26];
	if ((rc = loom_model_config_check(cfg)) != LOOM_OK)
		return rc;
	nt = loom_model_num_tensors(cfg);
	t = loom__calloc(2 * (size_t)nt, sizeof *t);
	names = loom__calloc(2 * (size_t)nt, sizeof *names);
	if (!t || !names) {
		free(t), free(names);
		return loom_seterr(LOOM_ENOMEM, "%s: out of memory", path);
	}
	for (int i = 0; i < 2 * nt; i++) {
		loom_tensor_info_t info;
		loom_model_tensor_info(cfg, i % nt, &info);
		snprintf(names[i], sizeof names[i], "%s.%s", info.name, i < nt ? "exp_avg" : "exp_avg_sq");
		t[i].name = names[i];
		t[i].dtype = LOOM_ST_F32;
		t[i].ndim = info.ndim;
		t[i].shape[0] = info.shape[0], t[i].shape[1] = info.shape[1];
		t[i].data = m ? (i < nt ? m : v) + info.offset : NULL;
		t[i].nbytes = info.numel * sizeof(float);
	}
	rc = loom__st_write_fill(path, t, 2 * nt, meta, config_meta(cfg, "adamw", bufs, meta), fill, ctx);
	free(t), free(names);
	return rc;
}

int loom_optim_load(const char *path, const loom_model_config_t *cfg, float *m, float *v)
{
	loom_st_t *st;
	int nt = loom_model_num_tensors(cfg), rc;
	const char *keys[5] = {"n_layer", "n_head", "n_embd", "n_positions", "vocab_size"};
	int vals[5] = {cfg->n_layer, cfg->n_head, cfg->n_embd, cfg->seq_len, cfg->vocab_size};
	if ((rc = loom_st_open(&st, path)) != LOOM_OK)
		return rc;
	for (int i = 0; i < 5; i++) {
		const char *s = loom_st_meta(st, keys[i]);
		int x;
		if (!s || parse_pos_int(s, &x) || x != vals[i]) {
			rc = loom_seterr(LOOM_EMISMATCH, "%s: optimizer state has %s=%s, the model has %d", path, keys[i],
			                 s ? s : "(missing)", vals[i]);
			goto out;
		}
	}
	if (loom_st_count(st) != 2 * nt) {
		rc = loom_seterr(LOOM_EFORMAT, "%s: %d tensors, expected %d (exp_avg and exp_avg_sq of %d parameters)", path,
		                 loom_st_count(st), 2 * nt, nt);
		goto out;
	}
	for (int i = 0; i < 2 * nt; i++) {
		loom_tensor_info_t info;
		char name[LOOM_TENSOR_NAME_MAX + 16];
		const loom_st_tensor_t *t;
		int k;
		loom_model_tensor_info(cfg, i % nt, &info);
		snprintf(name, sizeof name, "%s.%s", info.name, i < nt ? "exp_avg" : "exp_avg_sq");
		if ((k = loom_st_find(st, name)) < 0) {
			rc = loom_seterr(LOOM_EFORMAT, "%s: missing tensor '%s'", path, name);
			goto out;
		}
		t = loom_st_get(st, k);
		if (t->dtype != LOOM_ST_F32 || t->ndim != info.ndim || t->shape[0] != info.shape[0] ||
		    (info.ndim == 2 && t->shape[1] != info.shape[1])) {
			rc = loom_seterr(LOOM_EFORMAT, "%s: tensor '%s' is not F32 of shape [%zu%s%.0zu]", path, name,
			                 info.shape[0], info.ndim == 2 ? "," : "", info.ndim == 2 ? info.shape[1] : 0);
			goto out;
		}
		if ((rc = loom_st_read_bytes(st, k, 0, t->nbytes, (i < nt ? m : v) + info.offset)) != LOOM_OK)
			goto out;
	}
out:
	loom_st_close(st);
	return rc;
}
