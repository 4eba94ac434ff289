/* model.h: the GPT-2 model's internal state, shared by gpt2.c (training passes), generate.c (KV-cache
 * sampling) and profile.c (per-kernel timing). Not part of the public API. */
#ifndef LOOM_MODEL_MODEL_H
#define LOOM_MODEL_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "loom/gpt2.h"

/* Kernels timed by loom_gpt2_profile, in report order. */
#define LOOM_PROF_KERNELS(X)                                                                      \
	X(ENCODER, "encoder_forward")                                                                 \
	X(LAYERNORM, "layernorm_forward")                                                             \
	X(MATMUL, "matmul_forward")                                                                   \
	X(ATTENTION, "attention_forward")                                                             \
	X(GELU, "gelu_forward")                                                                       \
	X(RESIDUAL, "residual_forward")                                                               \
	X(CLASSIFIER, "classifier (lm head + softmax + CE, fwd+bwd)")                                 \
	X(MATMUL_BWD, "matmul_backward")                                                              \
	X(ATTENTION_BWD, "attention_backward")                                                        \
	X(GELU_BWD, "gelu_backward")                                                                  \
	X(LAYERNORM_BWD, "layernorm_backward")                                                        \
	X(ENCODER_BWD, "encoder_backward")                                                            \
	X(ZERO, "zeroing scratch gradients")                                                          \
	X(CALLBACK, "grad-ready callbacks")

enum {
#define PROF_ENUM_(name, text) PROF_##name,
	LOOM_PROF_KERNELS(PROF_ENUM_)
#undef PROF_ENUM_
	PROF_COUNT
};

/* Activations of one layer kept for the backward; rows are the B*T positions of the current call. */
typedef struct {
	float *ln1, *ln1_mean, *ln1_rstd; /* (N,C), (N), (N) */
	float *qkv;                       /* (N,3C); also the KV cache during generation */
	float *att;                       /* (B,NH,T,T) softmax probabilities */
	float *atty;                      /* (N,C) attention output before c_proj */
	float *res2;                      /* (N,C) residual after attention */
	float *ln2, *ln2_mean, *ln2_rstd;
	float *fch, *fch_gelu; /* (N,4C) */
	float *res3;           /* (N,C) residual after the MLP: the layer's output */
} layer_acts_t;

struct loom_gpt2 {
	loom_gpt2_config_t cfg;
	int B, T;        /* capacity given at create */
	size_t nparams;
	float *params;
	float *grads;     /* grads_own, or the caller's buffer */
	float *grads_own;
	size_t *offset; /* offset[i]: tensor i's first float in params and grads */

	/* activations */
	float *encoded;                     /* (N,C) */
	layer_acts_t *layers;               /* L */
	float *lnf, *lnf_mean, *lnf_rstd;   /* (N,C), (N), (N) */
	float *losses;                      /* (N) */
	float *logits;                      /* (chunk,V) scratch of the fused classifier, >= V floats */
	float *last_logits;                 /* (B,V) logits of the last position of each row */
	int chunk;                          /* positions per classifier chunk */

	/* backward scratch */
	float *dres;         /* (N,C) gradient of the residual stream */
	float *dbtc;         /* (N,C) */
	float *dqkv;         /* (N,3C) */
	float *d4a, *d4b;    /* (N,4C) */
	float *att_scratch;  /* T*T per thread */
	int att_threads;     /* threads att_scratch has room for */

	loom_grad_ready_fn on_ready;
	void *on_ready_ctx;

	int prof_on;
	double prof_s[PROF_COUNT];
	double prof_flops[PROF_COUNT];
	long prof_calls[PROF_COUNT];
	void *mem; /* the one allocation holding every activation buffer */
};

/* Pointer to tensor i's parameters / gradients. */
float *loom__gpt2_param(loom_gpt2_t *m, int i);
float *loom__gpt2_grad(loom_gpt2_t *m, int i);
/* Check that every token id of ids (n of them, called `what`) is in [0, V). LOOM_EINVAL otherwise. */
int loom__gpt2_check_tokens(const loom_gpt2_t *m, const int *ids, int B, int T, const char *what);
/* Forward from token ids through the final LayerNorm into m->lnf (no classifier). */
void loom__gpt2_forward_body(loom_gpt2_t *m, const int *inputs, int B, int T);
/* Add the time since t0 and `flops` operations to kernel k's counters. */
void loom__gpt2_prof_add(loom_gpt2_t *m, int k, double t0, double flops);

#endif
