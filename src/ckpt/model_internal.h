/* model_internal.h: the per-format halves of loom_model_config/load/save (internal). */
#ifndef LOOM_CKPT_MODEL_INTERNAL_H
#define LOOM_CKPT_MODEL_INTERNAL_H

#include "ckpt/json.h"
#include "loom/ckpt.h"

/* Limits on the dimensions of a model read from a file (docs/model.md). They are far above any GPT-2
 * (GPT-3 175B: 96 layers, n_embd 12288, 2048 positions, 50257 tokens) and keep every size computed
 * from them inside 64 bits, so a hostile header is rejected before anything is allocated. */
#define LOOM_MODEL_MAX_LAYERS 1024
#define LOOM_MODEL_MAX_EMBD 65536
#define LOOM_MODEL_MAX_SEQ (1 << 20)
#define LOOM_MODEL_MAX_VOCAB (1 << 24)
#define LOOM_MODEL_CONFIG_JSON_MAX (1u << 20) /* config.json beside a model */

/* cfg (read from `path`) within the limits above and valid (loom_model_config_check); *numel = its
 * parameter count, computed with overflow checks. LOOM_EFORMAT naming the file and the field. */
int loom__model_file_check(const char *path, const loom_model_config_t *cfg, size_t *numel);

int loom__st_model_config(const char *path, int n_head_hint, loom_model_config_t *cfg);
int loom__st_model_load(const char *path, const loom_model_config_t *cfg, float *params);
int loom__llmc_model_config(const char *path, loom_model_config_t *cfg);
int loom__llmc_model_load(const char *path, const loom_model_config_t *cfg, float *params);

/* Where a writer below takes the data of tensor i (in file order, once each; the pointer is read
 * before the next call): LOOM_OK and *data, or an error with its message, which fails the write. */
typedef int (*loom__st_fill_fn)(void *ctx, int i, const void **data);
/* loom_st_write, the data of each tensor whose data is NULL from fill. */
int loom__st_write_fill(const char *path, const loom_st_tensor_t *t, int n, const char *const *meta, int n_meta,
                        loom__st_fill_fn fill, void *ctx);
/* loom_model_save_safetensors and loom_optim_save with params (m, v) NULL, streaming: tensor i of the
 * model's table from fill(i), for the optimizer m of tensor i (i < n) then v of tensor i - n (n tensors),
 * so a caller can write a state no buffer holds whole (a pipeline's stages). */
int loom__model_save_fill(const char *path, const loom_model_config_t *cfg, loom__st_fill_fn fill, void *ctx);
int loom__optim_save_fill(const char *path, const loom_model_config_t *cfg, loom__st_fill_fn fill, void *ctx);
/* The order those two take their tensors in: tensor i of file `kind` (0 the model's, 1 the optimizer's)
 * of a table of n tensors is tensor *t of state *which (0 the parameters, 1 m, 2 v); a file has
 * loom__ckpt_count(n, kind) of them. A streaming sender walks the same order. */
static inline void loom__ckpt_item(int n, int kind, int i, int *t, int *which)
{
	*t = kind == 0 ? i : i % n;
	*which = kind == 0 ? 0 : i < n ? 1 : 2;
}
static inline int loom__ckpt_count(int n, int kind)
{
	return kind == 0 ? n : 2 * n;
}

/* The llama family's config.json (loom_hf_config_write's text) in a malloc'ed string, which loom's
 * own model files of the family carry in __metadata__ "hf_config". LOOM_EINVAL / LOOM_ENOMEM. */
int loom__hf_config_text(const loom_model_config_t *cfg, const char *torch_dtype, int eot, char **text);

/* ---- Hugging Face directories (hf_dir.c) ---- */

/* The open file descriptor of st (for posix_fadvise; loom_st_read_bytes is the way to read). */
int loom__st_fd(const loom_st_t *st);
/* F16 bits to float (safetensors.c). */
float loom__half_to_f32(uint16_t h);
/* The parameter table of cfg, malloc'ed into *tab (*n tensors): the family's (loom__hf_family_table),
 * or a caller's (tests of the directory code with a table of their own). */
typedef int (*loom__hf_table_fn)(const loom_model_config_t *cfg, loom_tensor_info_t **tab, int *n);
int loom__hf_family_table(const loom_model_config_t *cfg, loom_tensor_info_t **tab, int *n);
/* loom_hf_dir_config / _load / _save with the table from `table` (NULL: the family's). */
int loom__hf_config(const char *arg, loom__hf_table_fn table, loom_model_config_t *cfg, loom_hf_info_t *info);
int loom__hf_load(const char *arg, loom__hf_table_fn table, const loom_model_config_t *cfg, float *params);
int loom__hf_save(const char *dir, loom__hf_table_fn table, const loom_model_config_t *cfg, const float *params,
                  const loom_hf_save_opts_t *opts);
/* A parsed model.safetensors.index.json: weight_map (tensor -> file) and its distinct files, sorted. */
typedef struct {
	json_t root;
	const json_t *map;   /* the weight_map object */
	const char **files;  /* nf distinct shard names (into root) */
	int nf;
} loom__hf_index_t;
/* LOOM_EFORMAT naming `what` for malformed JSON, no weight_map, a file name that is not a plain
 * *.safetensors name inside the directory, a tensor listed twice. Free with loom__hf_index_free
 * either way. */
int loom__hf_index_parse(const char *text, size_t len, const char *what, loom__hf_index_t *ix);
void loom__hf_index_free(loom__hf_index_t *ix);
/* 1 when the open file `st` at path holds a llama-family model: loom's (__metadata__ arch "llama") or
 * Hugging Face's (config.json beside it with model_type "llama" / "qwen2"). */
int loom__hf_is_llama_file(const char *path, const loom_st_t *st);

#endif
