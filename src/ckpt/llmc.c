/* llmc.c: llm.c's GPT-2 model file (train_gpt2.c's gpt2_build_from_checkpoint), read and written,
 * plus the format dispatch of loom_model_config/load/save.
 *
 * File: 256 x int32 header [magic 20240326, version 3 (fp32) or 5 (bf16), maxT, V, L, NH, C, Vp],
 * then the parameters as 16 arrays: wte (Vp,C) with rows V..Vp-1 padding, wpe (maxT,C), then for all
 * layers at once ln1w (L,C), ln1b, qkvw (L,3C,C), qkvb (L,3C), attprojw (L,C,C), attprojb, ln2w, ln2b,
 * fcw (L,4C,C), fcb (L,4C), fcprojw (L,C,4C), fcprojb (L,C), then lnfw (C), lnfb (C). llm.c's matrices
 * are (out, in), the transpose of HF's Conv1D (in, out) that loom keeps. The 12 per-layer arrays come
 * in the same order as HF's per-layer tensors, so array j of the file gathers tensor j of each layer.
 * The header is checked against the limits of model_internal.h and the file's exact size before
 * anything is allocated or mapped. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/model_internal.h"
#include "core/util.h"
#include "core/fileio.h"
#include "loom/data.h"
#include "loom/ckpt.h"

static size_t padded_vocab(size_t V)
{
	return (V + 127) / 128 * 128;
}

/* Read and check the header against loom's limits and the file's size, before anything is allocated:
 * *elsize = 4 (v3) or 2 (v5); *vp = padded vocab; *fsize = the file's size, which is exactly the
 * header plus the parameters (padding rows included). */
static int read_header(const char *path, int fd, loom_model_config_t *cfg, size_t *vp, size_t *elsize, size_t *fsize)
{
	int32_t h[256];
	struct stat sb;
	size_t numel, expect;
	memset(cfg, 0, sizeof *cfg); /* GPT-2: every other field 0 */
	if (fstat(fd, &sb) != 0)
		return loom_seterr(LOOM_EIO, "%s: stat: %s", path, strerror(errno));
	*fsize = (size_t)sb.st_size;
	if (sb.st_size < (off_t)sizeof h)
		return loom_seterr(LOOM_EFORMAT, "%s: %lld bytes, shorter than llm.c's 1024-byte header", path,
		                   (long long)sb.st_size);
	if (pread(fd, h, sizeof h, 0) != (ssize_t)sizeof h)
		return loom_seterr(LOOM_EIO, "%s: cannot read the header", path);
	if (h[0] != LOOM_LLMC_MAGIC)
		return loom_seterr(LOOM_EFORMAT, "%s: bad magic %d (expected %d, an llm.c model)", path, h[0],
		                   LOOM_LLMC_MAGIC);
	if (h[1] != 3 && h[1] != 5)
		return loom_seterr(LOOM_EFORMAT, "%s: llm.c model version %d (expected 3, fp32, or 5, bf16)", path, h[1]);
	cfg->seq_len = h[2], cfg->vocab_size = h[3], cfg->n_layer = h[4], cfg->n_head = h[5], cfg->n_embd = h[6];
	if (loom__model_file_check(path, cfg, &numel) != LOOM_OK) /* "PATH: n_layer = ... is outside ..." */
		return LOOM_EFORMAT;
	if (h[7] < h[3] || h[7] > LOOM_MODEL_MAX_VOCAB)
		return loom_seterr(LOOM_EFORMAT, "%s: padded vocab %d is outside [vocab %d, %d]", path, h[7], h[3],
		                   LOOM_MODEL_MAX_VOCAB);
	*vp = (size_t)h[7];
	*elsize = h[1] == 3 ? 4 : 2;
	/* with the limits none of this can overflow; checked anyway */
	if (__builtin_mul_overflow(*vp - (size_t)cfg->vocab_size, (size_t)cfg->n_embd, &expect) ||
	    __builtin_add_overflow(numel, expect, &numel) || __builtin_mul_overflow(numel, *elsize, &expect) ||
	    __builtin_add_overflow(expect, sizeof h, &expect) || *fsize != expect)
		return loom_seterr(LOOM_EFORMAT, "%s: %zu bytes, expected %zu for L=%d C=%d T=%d Vp=%zu in %s", path, *fsize,
		                   expect, cfg->n_layer, cfg->n_embd, cfg->seq_len, *vp, *elsize == 4 ? "fp32" : "bf16");
	return LOOM_OK;
}

int loom__llmc_model_config(const char *path, loom_model_config_t *cfg)
{
	size_t vp, es, fsize;
	int fd, rc;
	if ((rc = loom__open_regular(NULL, path, &fd, &fsize)) != LOOM_OK)
		return rc;
	rc = read_header(path, fd, cfg, &vp, &es, &fsize);
	close(fd);
	return rc;
}

static float elem(const unsigned char *p, size_t i, size_t es)
{
	float f;
	if (es == 4) {
		memcpy(&f, p + 4 * i, 4);
	} else {
		uint32_t bits = (uint32_t)(p[2 * i] | (p[2 * i + 1] << 8)) << 16;
		memcpy(&f, &bits, 4);
	}
	return f;
}

/* dst (in, out) <- file (out, in), in 32 x 32 tiles so both sides stay in cache. */
static void transpose_from_file(float *dst, const unsigned char *p, size_t in, size_t out, size_t es)
{
	for (size_t o0 = 0; o0 < out; o0 += 32)
		for (size_t i0 = 0; i0 < in; i0 += 32)
			for (size_t o = o0; o < LOOM_MIN(o0 + 32, out); o++)
				for (size_t i = i0; i < LOOM_MIN(i0 + 32, in); i++)
					dst[i * out + o] = elem(p, o * in + i, es);
}

/* dst (out, in) <- src (in, out), tiled likewise. */
static void transpose_to_file(float *dst, const float *src, size_t in, size_t out)
{
	for (size_t i0 = 0; i0 < in; i0 += 32)
		for (size_t o0 = 0; o0 < out; o0 += 32)
			for (size_t i = i0; i < LOOM_MIN(i0 + 32, in); i++)
				for (size_t o = o0; o < LOOM_MIN(o0 + 32, out); o++)
					dst[o * in + i] = src[i * out + o];
}

int loom__llmc_model_load(const char *path, const loom_model_config_t *want, float *params)
{
	loom_model_config_t cfg;
	size_t vp, es, fsize, C, L;
	const unsigned char *p;
	void *map;
	int fd, rc;
	if ((rc = loom__open_regular(NULL, path, &fd, &fsize)) != LOOM_OK)
		return rc;
	if ((rc = read_header(path, fd, &cfg, &vp, &es, &fsize)) != LOOM_OK) {
		close(fd);
		return rc;
	}
	if (want->arch != LOOM_ARCH_GPT2 || cfg.n_layer != want->n_layer || cfg.n_head != want->n_head ||
	    cfg.n_embd != want->n_embd || cfg.seq_len != want->seq_len || cfg.vocab_size != want->vocab_size) {
		close(fd);
		return loom_seterr(LOOM_EMISMATCH, "%s: file has L=%d NH=%d C=%d T=%d V=%d, caller expected L=%d NH=%d C=%d "
		                   "T=%d V=%d", path, cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.seq_len, cfg.vocab_size,
		                   want->n_layer, want->n_head, want->n_embd, want->seq_len, want->vocab_size);
	}
	map = mmap(NULL, fsize, PROT_READ, MAP_SHARED, fd, 0);
	close(fd);
	if (map == MAP_FAILED)
		return loom_seterr(LOOM_ESYS, "%s: mmap: %s", path, strerror(errno));
	p = (const unsigned char *)map + 1024;
	C = (size_t)cfg.n_embd, L = (size_t)cfg.n_layer;
	/* wte: first V of Vp rows; wpe follows the padding. */
	for (size_t i = 0; i < (size_t)cfg.vocab_size * C; i++)
		params[i] = elem(p, i, es);
	p += vp * C * es;
	{
		loom_tensor_info_t wpe;
		loom_model_tensor_info(&cfg, 1, &wpe);
		for (size_t i = 0; i < wpe.numel; i++)
			params[wpe.offset + i] = elem(p, i, es);
		p += wpe.numel * es;
	}
	for (int j = 0; j < LOOM_GPT2_LAYER_TENSORS; j++) {
		for (size_t l = 0; l < L; l++) {
			loom_tensor_info_t t;
			loom_model_tensor_info(&cfg, 2 + (int)l * LOOM_GPT2_LAYER_TENSORS + j, &t);
			float *dst = params + t.offset;
			if (t.ndim == 2) { /* file (out, in) -> HF (in, out) */
				transpose_from_file(dst, p, t.shape[0], t.shape[1], es);
			} else {
				for (size_t i = 0; i < t.numel; i++)
					dst[i] = elem(p, i, es);
			}
			p += t.numel * es;
		}
	}
	for (int k = 0; k < 2; k++) {
		loom_tensor_info_t t;
		loom_model_tensor_info(&cfg, loom_model_num_tensors(&cfg) - 2 + k, &t);
		for (size_t i = 0; i < C; i++)
			params[t.offset + i] = elem(p, i, es);
		p += C * es;
	}
	munmap(map, fsize);
	return LOOM_OK;
}

int loom_model_save_llmc(const char *path, const loom_model_config_t *cfg, const float *params)
{
	int32_t h[256] = {0};
	size_t C = (size_t)cfg->n_embd, V = (size_t)cfg->vocab_size, vp = padded_vocab(V), L = (size_t)cfg->n_layer;
	float *buf;
	atomic_file_t af;
	int rc;
	if (cfg->arch != LOOM_ARCH_GPT2)
		return loom_seterr(LOOM_EINVAL, "%s: llm.c's .bin holds GPT-2 only, not a %s model (save it as "
		                   ".safetensors)", path, loom_arch_name(cfg->arch));
	if ((rc = loom_model_config_check(cfg)) != LOOM_OK)
		return rc;
	h[0] = LOOM_LLMC_MAGIC, h[1] = LOOM_LLMC_VERSION, h[2] = cfg->seq_len, h[3] = cfg->vocab_size;
	h[4] = cfg->n_layer, h[5] = cfg->n_head, h[6] = cfg->n_embd, h[7] = (int32_t)vp;
	size_t nbuf = 4 * C * C > (vp - V) * C ? 4 * C * C : (vp - V) * C + 1;
	buf = loom__calloc(nbuf, sizeof *buf); /* zeroed: padding rows */
	if (!buf)
		return loom_seterr(LOOM_ENOMEM, "%s: out of memory for a %zu-byte conversion buffer", path, nbuf * sizeof *buf);
	if ((rc = loom__atomic_open(&af, path)) != LOOM_OK) {
		free(buf);
		return rc;
	}
	rc = loom__atomic_write(&af, h, sizeof h);
	if (rc == LOOM_OK)
		rc = loom__atomic_write(&af, params, V * C * sizeof(float));
	if (rc == LOOM_OK)
		rc = loom__atomic_write(&af, buf, (vp - V) * C * sizeof(float));
	if (rc == LOOM_OK)
		rc = loom__atomic_write(&af, params + V * C, (size_t)cfg->seq_len * C * sizeof(float));
	for (int j = 0; rc == LOOM_OK && j < LOOM_GPT2_LAYER_TENSORS; j++) {
		for (size_t l = 0; rc == LOOM_OK && l < L; l++) {
			loom_tensor_info_t t;
			loom_model_tensor_info(cfg, 2 + (int)l * LOOM_GPT2_LAYER_TENSORS + j, &t);
			const float *src = params + t.offset;
			if (t.ndim == 2) { /* HF (in, out) -> file (out, in) */
				transpose_to_file(buf, src, t.shape[0], t.shape[1]);
				src = buf;
			}
			rc = loom__atomic_write(&af, src, t.numel * sizeof(float));
		}
	}
	if (rc == LOOM_OK) {
		loom_tensor_info_t t;
		loom_model_tensor_info(cfg, loom_model_num_tensors(cfg) - 2, &t);
		rc = loom__atomic_write(&af, params + t.offset, 2 * C * sizeof(float));
	}
	free(buf);
	if (rc != LOOM_OK) {
		loom__atomic_abort(&af);
		return rc;
	}
	return loom__atomic_commit(&af);
}

static int detect(const char *path, loom_model_format_t *fmt)
{
	int32_t magic = 0;
	size_t size;
	int fd, rc;
	ssize_t n;
	if ((rc = loom__open_regular(NULL, path, &fd, &size)) != LOOM_OK)
		return rc;
	n = pread(fd, &magic, 4, 0);
	close(fd);
	/* other files of loom's that a model path may name by mistake: say what they are */
	if (n == 4 && (magic == LOOM_SHARD_MAGIC || magic == LOOM_SHARD32_MAGIC))
		return loom_seterr(LOOM_EFORMAT, "%s is a token shard (llm.c data, magic %d), not a model: give a model file "
		                   "(.safetensors, llm.c .bin) or a checkpoint directory", path, magic);
	if (n == 4 && magic == LOOM_TOKENIZER_MAGIC)
		return loom_seterr(LOOM_EFORMAT, "%s is a tokenizer (llm.c format, magic %d), not a model: give a model file "
		                   "(.safetensors, llm.c .bin) or a checkpoint directory", path, LOOM_TOKENIZER_MAGIC);
	if (n >= 1 && (magic & 0xff) == '{')
		return loom_seterr(LOOM_EFORMAT, "%s is a JSON file, not a model: give a model file (.safetensors, llm.c "
		                   ".bin) or a checkpoint directory", path);
	*fmt = n == 4 && magic == LOOM_LLMC_MAGIC ? LOOM_MODEL_LLMC : LOOM_MODEL_SAFETENSORS;
	return LOOM_OK;
}

/* A Hugging Face directory of shards, given as the directory or as its model.safetensors.index.json:
 * 1, else 0. A Hugging Face directory holding one model.safetensors gives that file, written into buf
 * (any other directory is left to the reader, which refuses it). */
static int hf_sharded(const char **path, char *buf, size_t cap)
{
	struct stat sb;
	size_t n = strlen(*path);
	if (n >= 11 && strcmp(*path + n - 11, ".index.json") == 0)
		return 1;
	if (!loom_hf_dir_is(*path))
		return 0;
	if (snprintf(buf, cap, "%s/model.safetensors", *path) < (int)cap && stat(buf, &sb) == 0) {
		*path = buf;
		return 0;
	}
	return 1;
}

int loom_model_config(const char *path, int n_head_hint, loom_model_config_t *cfg, loom_model_format_t *fmt)
{
	loom_model_format_t f;
	char buf[1200];
	if (hf_sharded(&path, buf, sizeof buf)) {
		if (fmt)
			*fmt = LOOM_MODEL_HF_SHARDED;
		return loom_hf_dir_config(path, cfg, NULL);
	}
	int rc = detect(path, &f);
	if (rc != LOOM_OK)
		return rc;
	if (fmt)
		*fmt = f;
	return f == LOOM_MODEL_LLMC ? loom__llmc_model_config(path, cfg) : loom__st_model_config(path, n_head_hint, cfg);
}

int loom_model_load(const char *path, const loom_model_config_t *cfg, float *params)
{
	loom_model_format_t f;
	char buf[1200];
	if (hf_sharded(&path, buf, sizeof buf))
		return loom_hf_dir_load(path, cfg, params);
	int rc = detect(path, &f);
	if (rc != LOOM_OK)
		return rc;
	return f == LOOM_MODEL_LLMC ? loom__llmc_model_load(path, cfg, params) : loom__st_model_load(path, cfg, params);
}

int loom_model_load_alloc(const char *path, int n_head_hint, loom_model_config_t *cfg, float **params)
{
	int rc;
	*params = NULL;
	if ((rc = loom_model_config(path, n_head_hint, cfg, NULL)) != LOOM_OK)
		return rc;
	/* not zeroed: every loader writes every parameter (test model_load_writes_every_parameter), so the
	 * pages are faulted in once, by the load's writes */
	*params = loom_alloc_uninit(loom_model_num_params(cfg) * sizeof(float));
	if (!*params)
		return loom_seterr(LOOM_ENOMEM, "%s: out of memory for %zu parameters (%zu bytes)", path,
		                   loom_model_num_params(cfg), loom_model_num_params(cfg) * sizeof(float));
	if ((rc = loom_model_load(path, cfg, *params)) != LOOM_OK) {
		free(*params);
		*params = NULL;
	}
	return rc;
}

int loom_model_save(const char *path, const loom_model_config_t *cfg, const float *params)
{
	size_t n = strlen(path);
	if (n >= 4 && strcmp(path + n - 4, ".bin") == 0)
		return loom_model_save_llmc(path, cfg, params);
	return loom_model_save_safetensors(path, cfg, params);
}
