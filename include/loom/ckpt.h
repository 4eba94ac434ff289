/* loom/ckpt.h: checkpoints: safetensors files, GPT-2 model files (HF safetensors and llm.c .bin),
 * a small key-value state file, and atomic training-checkpoint directories.
 *
 * Every reader validates what it reads; every error names the file and what is wrong (loom_errmsg).
 * Every writer is atomic: it writes a temporary file beside the target, fsyncs it, renames it over
 * the target and fsyncs the directory, so a crash never leaves a half-written file under the final
 * name. Data are little-endian (the host's order on every machine loom supports).
 * Thread safety: a handle (loom_st_t, loom_kv_t, a writer) is used by one thread at a time; the
 * file-level functions are safe to call concurrently on different paths. */
#ifndef LOOM_CKPT_H
#define LOOM_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "loom/data.h"
#include "loom/error.h"
#include "loom/gpt2.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- safetensors ----------------------------------------------------------------------------- */

typedef enum {
	LOOM_ST_F32, LOOM_ST_F16, LOOM_ST_BF16, LOOM_ST_F64,
	LOOM_ST_I64, LOOM_ST_I32, LOOM_ST_I16, LOOM_ST_I8, LOOM_ST_U8, LOOM_ST_BOOL,
	LOOM_ST_COUNT_
} loom_st_dtype_t;

const char *loom_st_dtype_name(loom_st_dtype_t dt); /* "F32", ...; "?" when out of range */
size_t loom_st_dtype_size(loom_st_dtype_t dt);      /* bytes per element; 0 when out of range */

#define LOOM_ST_MAX_DIMS 8

/* One tensor: for writing, the caller fills it; for reading, name and data point into the open file. */
typedef struct {
	const char *name;
	loom_st_dtype_t dtype;
	int ndim; /* 0 (a scalar) .. LOOM_ST_MAX_DIMS */
	size_t shape[LOOM_ST_MAX_DIMS];
	const void *data; /* nbytes = numel x dtype size */
	size_t nbytes;
} loom_st_tensor_t;

typedef struct loom_st loom_st_t;

/* Map a safetensors file and validate its header: header length within the file, JSON well formed,
 * known dtypes, data_offsets in range, contiguous from 0 to the end of the file and non-overlapping,
 * numel x dtype size == byte length, no duplicate names, __metadata__ a map of strings. LOOM_EFORMAT
 * naming the file and the problem (and the tensor, when one is at fault). */
int loom_st_open(loom_st_t **st, const char *path);
void loom_st_close(loom_st_t *st); /* safe on NULL; invalidates every pointer obtained from st */
const char *loom_st_path(const loom_st_t *st);
int loom_st_count(const loom_st_t *st);                     /* tensors, in file (offset) order */
const loom_st_tensor_t *loom_st_get(const loom_st_t *st, int i); /* NULL when out of range */
int loom_st_find(const loom_st_t *st, const char *name);   /* index or -1 */
/* Copy tensor i into out (numel floats, which must equal the tensor's element count), converting
 * F16/BF16/F64 to f32. LOOM_EFORMAT for other dtypes, LOOM_EINVAL for a size mismatch. */
int loom_st_read_f32(const loom_st_t *st, int i, float *out, size_t numel);
/* Copy bytes [off, off + n) of tensor i's data, as stored, into out: read from the file (pread), so
 * the pages are not mapped into the process (a resume's resident set holds its buffers, not the
 * files' pages too). LOOM_EINVAL for a range outside the tensor, LOOM_EIO when the read fails. */
int loom_st_read_bytes(const loom_st_t *st, int i, size_t off, size_t n, void *out);
int loom_st_meta_count(const loom_st_t *st);
int loom_st_meta_at(const loom_st_t *st, int i, const char **key, const char **value);
const char *loom_st_meta(const loom_st_t *st, const char *key); /* NULL when absent */

/* Write tensors in the given order (offsets follow it) with __metadata__ from meta: n_meta pairs
 * (meta[2i] = key, meta[2i+1] = value; meta may be NULL when n_meta is 0). The header is padded with
 * spaces to a multiple of 8 bytes, as the reference library does. Atomic. LOOM_EINVAL for a tensor
 * whose nbytes does not match its shape or a duplicate name. */
int loom_st_write(const char *path, const loom_st_tensor_t *tensors, int n, const char *const *meta, int n_meta);

/* ---- GPT-2 model files ----------------------------------------------------------------------- */

#define LOOM_LLMC_MAGIC 20240326
#define LOOM_LLMC_VERSION 3 /* fp32, padded vocabulary; version 5 (bf16) is read too */

/* Which format a model file is: by magic (llm.c .bin starts with 20240326), else safetensors;
 * LOOM_MODEL_HF_SHARDED a Hugging Face directory of shards (its model.safetensors.index.json). */
typedef enum { LOOM_MODEL_SAFETENSORS, LOOM_MODEL_LLMC, LOOM_MODEL_HF_SHARDED } loom_model_format_t;

/* Read a model file's configuration. A model of the llama family (a .safetensors beside a config.json
 * of model_type "llama" / "qwen2", loom's own file of it, a directory of shards or its index):
 * loom_hf_dir_config's. Other safetensors: the shapes give V, T, C and L, n_head comes from
 * __metadata__ "n_head", else from config.json beside the file (HF layout), else from n_head_hint
 * (> 0; e.g. the CLI's --n-head); LOOM_EINVAL naming the file when none has it. llm.c .bin: the
 * header. Writes the format to *fmt when fmt is not NULL. */
int loom_model_config(const char *path, int n_head_hint, loom_model_config_t *cfg, loom_model_format_t *fmt);
/* Load the parameters (loom_model_num_params(cfg) floats, layout of loom/gpt2.h) into params. cfg
 * must be what loom_model_config returns for this file. safetensors: accepts a "transformer."
 * prefix, ignores attn.bias / attn.masked_bias buffers and an lm_head.weight equal to wte; F16/BF16
 * are converted. Missing, extra or wrong-shaped tensors give LOOM_EFORMAT naming the tensor.
 * llm.c: transposes its (out, in) matrices to HF's Conv1D (in, out) and drops the padded rows.
 * Every one of the floats is written (params need not be zeroed: loom_alloc_uninit); a Hugging Face
 * directory or a llama-family file is read on up to loom_num_threads() threads (OpenMP's). */
int loom_model_load(const char *path, const loom_model_config_t *cfg, float *params);
/* Both in one: *params is allocated by loom_alloc_uninit (free with free()); NULL on failure. */
int loom_model_load_alloc(const char *path, int n_head_hint, loom_model_config_t *cfg, float **params);
/* Save as llm.c .bin (version 3, vocab padded to a multiple of 128 with zero rows) when path ends in
 * ".bin", else as safetensors with HF names and shapes and the config in __metadata__ (n_layer,
 * n_head, n_embd, n_positions, vocab_size, format "loom-gpt2"). Atomic. */
int loom_model_save(const char *path, const loom_model_config_t *cfg, const float *params);
int loom_model_save_safetensors(const char *path, const loom_model_config_t *cfg, const float *params);
int loom_model_save_llmc(const char *path, const loom_model_config_t *cfg, const float *params);
/* Write config.json (Hugging Face's GPT2Config fields) in the directory of model_path, so that the
 * directory loads with GPT2LMHeadModel.from_pretrained; bos_token_id = eos_token_id = eot, the run's
 * end-of-text token (eot < 0: vocab_size - 1, which it is for the byte-level, GPT-2 and loom-trained
 * tokenizers). loom_model_save_safetensors calls it (eot -1). Atomic. LOOM_EINVAL for eot out of the
 * vocabulary; LOOM_ESYS/LOOM_EIO naming the file. */
int loom_model_write_hf_config(const char *model_path, const loom_model_config_t *cfg, int eot);
/* The path of the config.json that loom_model_write_hf_config (so also loom_model_save of a
 * .safetensors path) writes beside model_path, into path: the file's directory's config.json
 * ("./config.json" for a bare file name). For a caller that must not replace a file it was not asked
 * to write (`loom convert` without --force). LOOM_EINVAL when it does not fit in cap bytes. */
int loom_model_hf_config_path(const char *model_path, char *path, size_t cap);

/* ---- Hugging Face directories of the llama family (docs/hf.md) ------------------------------------ */

/* What config.json and the weights say beyond the model's configuration. */
typedef struct {
	char model_type[16];   /* "llama" | "qwen2" */
	char torch_dtype[16];  /* config.json's "torch_dtype" (transformers 5: "dtype"); "" when absent */
	int rope_parameters;   /* 1: the rope came from transformers 5's "rope_parameters" */
	int n_files;           /* safetensors files read: 1, or the shards of the index (directory reads only) */
	loom_st_dtype_t dtype; /* the weights' dtype (directory reads only; the first tensor's) */
	int mixed_dtypes;      /* 1 when the tensors do not all have that dtype */
} loom_hf_info_t;

/* Parse the text of a config.json of LlamaForCausalLM (model_type "llama") or Qwen2ForCausalLM
 * ("qwen2") into cfg (arch LOOM_ARCH_LLAMA; every field the model needs) and info (may be NULL).
 * Reads the rope either as rope_theta + rope_scaling (type/rope_type "default" or "llama3") or as
 * transformers 5's rope_parameters. bos/eos_token_id may be an integer, a list (the first is taken)
 * or null. `what` names the file in messages. LOOM_EFORMAT for malformed JSON, a missing size, a
 * value of the wrong type or out of range; LOOM_ENOTSUP for what loom does not implement (another
 * model_type or architecture, hidden_act other than "silu", another rope type, Qwen2's sliding
 * window, dropout, quantized weights), naming the field. Thread-safe. */
int loom_hf_config_parse(const char *text, size_t len, const char *what, loom_model_config_t *cfg,
                         loom_hf_info_t *info);
/* The same from the file at path (at most 1 MB). */
int loom_hf_config_read(const char *path, loom_model_config_t *cfg, loom_hf_info_t *info);
/* Write cfg (arch LOOM_ARCH_LLAMA) as transformers writes config.json: its keys sorted, rope_theta
 * and rope_scaling (which transformers 4 and 5 both read), "torch_dtype" torch_dtype ("float32",
 * "bfloat16"). bos/eos_token_id are cfg's when it has them, else eot (eot < 0: vocab_size - 1).
 * Atomic. LOOM_EINVAL for a configuration the class cannot express (Llama with q/k/v biases only,
 * Qwen2 with an o or MLP bias) or an eot outside the vocabulary. */
int loom_hf_config_write(const char *path, const loom_model_config_t *cfg, const char *torch_dtype, int eot);

/* 1 when dir holds config.json and model.safetensors or model.safetensors.index.json, else 0. */
int loom_hf_dir_is(const char *dir);
/* The configuration of the model in dir (a directory as above; also accepted: the path of its
 * model.safetensors or model.safetensors.index.json) from its config.json, and every weight checked
 * against the family's parameter table: each tensor of the table present once (lm_head.weight may be
 * absent only when the embeddings are tied), with the table's shape, in F32, BF16 or F16; no other
 * tensor (transformers 4's rotary_emb.inv_freq buffers aside, derived from the config); a tied
 * lm_head.weight is checked equal to the embedding when loaded. The shards are those of weight_map
 * (plain file names inside dir), each tensor in the shard weight_map names. LOOM_EFORMAT /
 * LOOM_ENOTSUP naming the file and the tensor; LOOM_ENOENT when a file is missing. */
int loom_hf_dir_config(const char *dir, loom_model_config_t *cfg, loom_hf_info_t *info);
/* Load the weights into params (loom_model_num_params(cfg) floats, the table's layout), converted to
 * fp32, tensor by tensor through a buffer of 256 KB: nothing else as large as a tensor is
 * allocated and no file page stays mapped, so the peak memory is params plus that buffer. */
int loom_hf_dir_load(const char *dir, const loom_model_config_t *cfg, float *params);

typedef struct {
	loom_st_dtype_t dtype; /* LOOM_ST_F32 (0, the default) or LOOM_ST_BF16 (rounded to nearest even) */
	size_t shard_bytes;    /* a new shard when the next tensor would take one past this (0: 5 GB,
	                          transformers' default); one shard is model.safetensors, no index */
	int eot;               /* bos/eos for a configuration without token ids (loom_hf_config_write) */
	int replace;           /* 1: an existing dir is replaced; else LOOM_EINVAL naming it */
} loom_hf_save_opts_t;
/* Write the model as a Hugging Face directory dir: config.json, model.safetensors or shards
 * model-0000K-of-0000N.safetensors with model.safetensors.index.json (metadata.total_size, weight_map
 * sorted), every tensor of the family's table under its name (transformers'), with metadata
 * {"format": "pt"}. Atomic as a whole: written into a temporary directory beside dir and renamed
 * into place (an existing dir, when replaced, is renamed aside first and removed after), so dir is
 * never half-written. opts may be NULL (F32, 5 GB shards, eot -1, no replace). */
int loom_hf_dir_save(const char *dir, const loom_model_config_t *cfg, const float *params,
                     const loom_hf_save_opts_t *opts);

/* AdamW state as safetensors: tensors "<name>.exp_avg" (m) and "<name>.exp_avg_sq" (v) for every
 * model tensor (PyTorch's names), with the model config in __metadata__. load checks the config and
 * every shape. Either buffer may be NULL on save only if both are NULL (then nothing is written and
 * LOOM_EINVAL is returned). */
int loom_optim_save(const char *path, const loom_model_config_t *cfg, const float *m, const float *v);
int loom_optim_load(const char *path, const loom_model_config_t *cfg, float *m, float *v);

/* ---- key-value state file (trainer state) ---------------------------------------------------- */

/* A flat map from keys to integers, doubles and strings, saved as one JSON object with
 * "format": "loom-state", "version": 1. Doubles are written with 17 significant digits, so they
 * round-trip bit-exactly (non-finite ones as the strings "nan", "inf", "-inf"); 64-bit integers
 * are kept exactly (they are parsed from their text, not through a double). */
typedef struct loom_kv loom_kv_t;

int loom_kv_create(loom_kv_t **kv);
void loom_kv_destroy(loom_kv_t *kv); /* safe on NULL */
/* Setting a key that exists replaces it. LOOM_ENOMEM on allocation failure. */
int loom_kv_set_i64(loom_kv_t *kv, const char *key, int64_t v);
int loom_kv_set_u64(loom_kv_t *kv, const char *key, uint64_t v);
int loom_kv_set_f64(loom_kv_t *kv, const char *key, double v);
int loom_kv_set_str(loom_kv_t *kv, const char *key, const char *v);
/* LOOM_ENOENT when the key is absent, LOOM_EFORMAT when its value has another type or does not fit;
 * the message names the key and the file it came from. A string from get_str lives as long as kv. */
int loom_kv_get_i64(const loom_kv_t *kv, const char *key, int64_t *v);
int loom_kv_get_u64(const loom_kv_t *kv, const char *key, uint64_t *v);
int loom_kv_get_f64(const loom_kv_t *kv, const char *key, double *v);
int loom_kv_get_str(const loom_kv_t *kv, const char *key, const char **v);
int loom_kv_has(const loom_kv_t *kv, const char *key);
int loom_kv_count(const loom_kv_t *kv);                /* keys, in insertion (file) order */
const char *loom_kv_key_at(const loom_kv_t *kv, int i); /* NULL when out of range */
/* A loader state under keys "<prefix>.next_window", "<prefix>.seed", ... */
int loom_kv_set_loader(loom_kv_t *kv, const char *prefix, const loom_loader_state_t *st);
int loom_kv_get_loader(const loom_kv_t *kv, const char *prefix, loom_loader_state_t *st);
int loom_kv_save(const loom_kv_t *kv, const char *path); /* atomic */
int loom_kv_load(loom_kv_t **kv, const char *path);      /* LOOM_EFORMAT naming the file */

/* ---- training checkpoint directories ---------------------------------------------------------- */

/* A checkpoint of step S is the directory DIR/step_%08lld holding any files the trainer writes
 * (by convention model.safetensors, optim.safetensors, state.json) and a MANIFEST, written last,
 * giving the step and each file's size and CRC-32C. It is built in DIR/.tmp-step_%08lld and renamed
 * into place only when complete, so a directory under a final name is always complete. */
typedef struct {
	char dir[1024];   /* the checkpoints' parent directory */
	char tmp[1100];   /* DIR/.tmp-step_XXXXXXXX, where files are written */
	char final_[1100];/* DIR/step_XXXXXXXX */
	int64_t step;
	int active;
} loom_ckpt_writer_t;

/* Start the checkpoint of `step`: creates DIR (and parents) if needed and an empty temp directory
 * (removing a leftover one of the same step). LOOM_ESYS naming the path on failure. */
int loom_ckpt_begin(loom_ckpt_writer_t *w, const char *dir, int64_t step);
/* Path of file `name` inside the checkpoint being written (into buf; LOOM_EINVAL if it does not fit). */
int loom_ckpt_file(const loom_ckpt_writer_t *w, const char *name, char *buf, size_t cap);
/* fsync every file and checksum it, write the MANIFEST, fsync the temp dir, rename it to
 * DIR/step_XXXXXXXX (replacing an existing checkpoint of the same step), fsync DIR. */
int loom_ckpt_commit(loom_ckpt_writer_t *w);
void loom_ckpt_abort(loom_ckpt_writer_t *w); /* removes the temp dir; safe after commit */

/* The newest checkpoint in DIR (the step_NNNNNNNN directory of the highest step; .tmp- and other
 * dot directories are not checkpoints), verified in full (loom_ckpt_verify). Writes its path to path
 * (cap bytes) and its step to *step. LOOM_ENOENT only when DIR holds no step_ directory at all;
 * LOOM_EFORMAT when the newest one is damaged or incomplete, naming the file and the problem and
 * listing the older checkpoints that verify (path and *step are still set to the newest one). */
int loom_ckpt_latest(const char *dir, char *path, size_t cap, int64_t *step);
/* The model file that `arg` names, as `loom sample --model` and `loom train --init-from` take it:
 * a file is itself; a directory holding model.safetensors (a checkpoint DIR/step_NNNNNNNN, a model
 * directory) gives that; a Hugging Face directory of shards (config.json and
 * model.safetensors.index.json, loom_hf_dir_is) gives the directory itself, which loom_model_config
 * and loom_model_load take; a directory of checkpoints (a --save-dir) gives its newest checkpoint's,
 * verified as loom_ckpt_latest does. Writes the path into path (cap bytes). LOOM_ENOENT naming arg
 * when it does not exist or is a directory with neither; loom_ckpt_latest's LOOM_EFORMAT (the older
 * checkpoints that verify listed) when the newest is damaged; LOOM_EINVAL when the path does not fit. */
int loom_model_path(const char *arg, char *path, size_t cap);
/* How many step_NNNNNNNN directories DIR holds (0 when DIR does not exist), complete or not. */
int loom_ckpt_count(const char *dir, int *n);
/* Verify checkpoint directory `path`: MANIFEST present and intact, each listed file present with its
 * size and CRC-32C (MANIFESTs from before checksums: sizes only), no file that MANIFEST does not list,
 * and MANIFEST's step equal to the step in the directory's name when it is step_NNNNNNNN.
 * LOOM_EFORMAT naming the file and what is wrong. loom_ckpt_verify_step also gives MANIFEST's step. */
int loom_ckpt_verify(const char *path);
int loom_ckpt_verify_step(const char *path, int64_t *step);
/* Delete all but the newest `keep` complete checkpoints in DIR (keep >= 1; any step_ directory older
 * than the oldest kept one goes), and leftovers of interrupted saves and prunes. A checkpoint is
 * renamed to .pruned-step_... before it is deleted, so a kill never leaves part of one under its name.
 * Only DIR's own step_ directories count: what loom_ckpt_set_aside moved is never pruned. */
int loom_ckpt_prune(const char *dir, int keep);
/* Finish what a kill interrupted, before a run writes into DIR: remove .tmp-step_ and .pruned-step_
 * directories, restore an .old-step_ whose replacement was never renamed into place (else remove it),
 * and remove incomplete step_ directories (files missing) older than the newest complete checkpoint,
 * which an interrupted prune of an earlier loom left. Damaged checkpoints are never removed. */
int loom_ckpt_recover(const char *dir);
/* What loom_ckpt_set_aside moved: how many checkpoints, where to, and their names. */
typedef struct {
	int n;              /* checkpoints moved (0: none, and `into` is "") */
	char into[1200];    /* DIR/abandoned-at-step_SSSSSSSS[.K] */
	char names[1024];   /* "step_00000008, step_00000010" (ends ", ..." when they do not fit) */
} loom_ckpt_aside_t;
/* Move every step_ directory of DIR newer than `step` (complete or not, damaged or not) into a new
 * directory DIR/abandoned-at-step_SSSSSSSS, S = step (with ".2", ".3", ... when that name exists):
 * the checkpoints of a branch that a run continuing from step S abandons, which pruning would keep
 * over the run's own and a resume would pick as the newest. Each checkpoint moves by one rename, so a
 * kill leaves every one of them whole under one name or the other; nothing is deleted. Call it after
 * loom_ckpt_recover (which restores .old-step_ leftovers). *out (may be NULL) says what moved.
 * LOOM_OK also when nothing is newer (out->n = 0, no directory made); LOOM_ESYS naming the path. */
int loom_ckpt_set_aside(const char *dir, int64_t step, loom_ckpt_aside_t *out);
/* Whether `dir` can hold checkpoints: an existing directory or one that can be created (the deepest
 * existing ancestor a writable directory, not in /proc or /sys), and not inside a checkpoint (no
 * ancestor, nor dir itself, holds a MANIFEST or is named step_NNNNNNNN). LOOM_EINVAL naming the
 * problem. Writes nothing. */
int loom_ckpt_check_save_dir(const char *dir);

#ifdef __cplusplus
}
#endif
#endif
