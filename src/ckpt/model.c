/* model.c: GPT-2 model files as safetensors with Hugging Face's names and shapes, and AdamW state.
 *
 * Writing uses the tensor table of loom/gpt2.h (HF names, Conv1D weights [in, out]) and puts the
 * config in __metadata__ (plus "format": "pt", which HF's loader requires), and config.json beside it
 * (hf_config.c), so that the directory loads with GPT2LMHeadModel.from_pretrained. Reading accepts HF's own
 * gpt2 file: names with or without "transformer.", attn.bias / attn.masked_bias buffers (ignored),
 * lm_head.weight only when bit-equal to wte (tied), n_head from __metadata__, config.json beside the
 * file, or the caller. Dimensions come from the shapes; every tensor is checked against the table. */
#include <libgen.h>
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
	if ((rc = loom__read_file(cfgpath, &text, &len)) != LOOM_OK)
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

int loom__st_model_config(const char *path, int n_head_hint, loom_gpt2_config_t *cfg)
{
	loom_st_t *st;
	const loom_st_tensor_t *wte, *wpe;
	const char *meta;
	char cfgpath[1200];
	int rc, iw, ip, L = 0;
	memset(cfg, 0, sizeof *cfg);
	if ((rc = loom_st_open(&st, path)) != LOOM_OK)
		return rc;
	iw = find_tensor(st, "wte.weight");
	ip = find_tensor(st, "wpe.weight");
	if (iw < 0 || ip < 0) {
		rc = loom_seterr(LOOM_EFORMAT, "%s: not a GPT-2 model: missing tensor %s", path,
		                 iw < 0 ? "wte.weight" : "wpe.weight");
		goto out;
	}
	wte = loom_st_get(st, iw), wpe = loom_st_get(st, ip);
	if (wte->ndim != 2 || wpe->ndim != 2 || wte->shape[1] != wpe->shape[1] || wte->shape[0] == 0 ||
	    wpe->shape[0] == 0 || wte->shape[1] == 0 || wte->shape[0] > INT32_MAX || wpe->shape[0] > INT32_MAX ||
	    wte->shape[1] > INT32_MAX) {
		rc = loom_seterr(LOOM_EFORMAT, "%s: wte.weight and wpe.weight must be [V, C] and [T, C] with the same C",
		                 path);
		goto out;
	}
	for (int i = 0; i < loom_st_count(st); i++) {
		const char *name = strip_prefix(loom_st_get(st, i)->name);
		int l;
		char rest[64];
		if (sscanf(name, "h.%d.%63s", &l, rest) == 2 && l >= 0 && l < (1 << 20) && l + 1 > L)
			L = l + 1;
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
			rc = loom_seterr(LOOM_EFORMAT, "%s: __metadata__ n_head '%s' is not a positive integer", path, meta);
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
	if ((rc = loom_gpt2_config_check(cfg)) != LOOM_OK)
		rc = loom_seterr(rc, "%s: %s", path, loom_errmsg());
out:
	loom_st_close(st);
	return rc;
}

int loom__st_model_load(const char *path, const loom_gpt2_config_t *cfg, float *params)
{
	loom_st_t *st;
	int nt = loom_gpt2_num_tensors(cfg), rc = LOOM_OK, lm_head = -1;
	unsigned char *seen = loom__calloc((size_t)nt, 1);
	if (!seen)
		return loom_seterr(LOOM_ENOMEM, "%s: out of memory", path);
	if ((rc = loom_st_open(&st, path)) != LOOM_OK) {
		free(seen);
		return rc;
	}
	for (int i = 0; i < loom_st_count(st); i++) {
		const loom_st_tensor_t *t = loom_st_get(st, i);
		loom_tensor_info_t info;
		int k;
		if (is_buffer(t->name))
			continue;
		if (strcmp(strip_prefix(t->name), "lm_head.weight") == 0) {
			lm_head = i;
			continue;
		}
		k = loom_gpt2_tensor_index(cfg, t->name);
		if (k < 0) {
			rc = loom_seterr(LOOM_EFORMAT, "%s: unexpected tensor '%s' (not part of GPT-2 with L=%d)", path, t->name,
			                 cfg->n_layer);
			goto out;
		}
		loom_gpt2_tensor_info(cfg, k, &info);
		if (seen[k]) {
			rc = loom_seterr(LOOM_EFORMAT, "%s: tensor '%s' appears twice (with and without the transformer. "
			                 "prefix)", path, info.name);
			goto out;
		}
		if (t->ndim != info.ndim || t->shape[0] != info.shape[0] || (info.ndim == 2 && t->shape[1] != info.shape[1])) {
			char got[128];
			int n = 0;
			for (int d = 0; d < t->ndim && n < 100; d++)
				n += snprintf(got + n, sizeof got - (size_t)n, d ? ",%zu" : "%zu", t->shape[d]);
			got[n] = 0;
			rc = loom_seterr(LOOM_EFORMAT, "%s: tensor '%s' has shape [%s], expected [%zu%s%.0zu]", path, t->name, got,
			                 info.shape[0], info.ndim == 2 ? "," : "", info.ndim == 2 ? info.shape[1] : 0);
			goto out;
		}
		if ((rc = loom_st_read_f32(st, i, params + info.offset, info.numel)) != LOOM_OK)
			goto out;
		seen[k] = 1;
	}
	for (int k = 0; k < nt; k++) {
		if (!seen[k]) {
			loom_tensor_info_t info;
			loom_gpt2_tensor_info(cfg, k, &info);
			rc = loom_seterr(LOOM_EFORMAT, "%s: missing tensor '%s'", path, info.name);
			goto out;
		}
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
	free(seen);
	return rc;
}

/* The config as __metadata__ pairs; bufs holds the number texts. */
static int config_meta(const loom_gpt2_config_t *cfg, const char *kind, char bufs[5][16], const char *meta[14])
{
	const char *keys[5] = {"n_layer", "n_head", "n_embd", "n_positions", "vocab_size"};
	int vals[5] = {cfg->n_layer, cfg->n_head, cfg->n_embd, cfg->seq_len, cfg->vocab_size};
	for (int i = 0; i < 5; i++) {
		snprintf(bufs[i], 16, "%d", vals[i]);
		meta[2 * i] = keys[i], meta[2 * i + 1] = bufs[i];
	}
	meta[10] = "format", meta[11] = "pt";
	meta[12] = "loom", meta[13] = kind;
	return 7;
}

int loom_model_save_safetensors(const char *path, const loom_gpt2_config_t *cfg, const float *params)
{
	int nt, rc;
	loom_st_tensor_t *t;
	loom_tensor_info_t *info;
	char bufs[5][16];
	const char *meta[14];
	if ((rc = loom_gpt2_config_check(cfg)) != LOOM_OK)
		return rc;
	nt = loom_gpt2_num_tensors(cfg);
	t = loom__calloc((size_t)nt, sizeof *t);
	info = loom__calloc((size_t)nt, sizeof *info);
	if (!t || !info) {
		free(t), free(info);
		return loom_seterr(LOOM_ENOMEM, "%s: out of memory", path);
	}
	for (int i = 0; i < nt; i++) {
		loom_gpt2_tensor_info(cfg, i, &info[i]);
		t[i].name = info[i].name;
		t[i].dtype = LOOM_ST_F32;
		t[i].ndim = info[i].ndim;
		t[i].shape[0] = info[i].shape[0], t[i].shape[1] = info[i].shape[1];
		t[i].data = params + info[i].offset;
		t[i].nbytes = info[i].numel * sizeof(float);
	}
	rc = loom_st_write(path, t, nt, meta, config_meta(cfg, "gpt2", bufs, meta));
	free(t), free(info);
	return rc ? rc : loom_model_write_hf_config(path, cfg, -1);
}

int loom_optim_save(const char *path, const loom_gpt2_config_t *cfg, const float *m, const float *v)
{
	int nt, rc;
	loom_st_tensor_t *t;
	char (*names)[LOOM_TENSOR_NAME_MAX + 16];
	char bufs[5][16];
	const char *meta[14];
	if (!m || !v)
		return loom_seterr(LOOM_EINVAL, "%s: optimizer state needs both m and v", path);
	if ((rc = loom_gpt2_config_check(cfg)) != LOOM_OK)
		return rc;
	nt = loom_gpt2_num_tensors(cfg);
	t = loom__calloc(2 * (size_t)nt, sizeof *t);
	names = loom__calloc(2 * (size_t)nt, sizeof *names);
	if (!t || !names) {
		free(t), free(names);
		return loom_seterr(LOOM_ENOMEM, "%s: out of memory", path);
	}
	for (int i = 0; i < 2 * nt; i++) {
		loom_tensor_info_t info;
		loom_gpt2_tensor_info(cfg, i % nt, &info);
		snprintf(names[i], sizeof names[i], "%s.%s", info.name, i < nt ? "exp_avg" : "exp_avg_sq");
		t[i].name = names[i];
		t[i].dtype = LOOM_ST_F32;
		t[i].ndim = info.ndim;
		t[i].shape[0] = info.shape[0], t[i].shape[1] = info.shape[1];
		t[i].data = (i < nt ? m : v) + info.offset;
		t[i].nbytes = info.numel * sizeof(float);
	}
	rc = loom_st_write(path, t, 2 * nt, meta, config_meta(cfg, "adamw", bufs, meta));
	free(t), free(names);
	return rc;
}

int loom_optim_load(const char *path, const loom_gpt2_config_t *cfg, float *m, float *v)
{
	loom_st_t *st;
	int nt = loom_gpt2_num_tensors(cfg), rc;
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
		loom_gpt2_tensor_info(cfg, i % nt, &info);
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
		memcpy((i < nt ? m : v) + info.offset, t->data, t->nbytes);
	}
out:
	loom_st_close(st);
	return rc;
}
