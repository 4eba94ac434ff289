/* attention_tt.h: the former T x T attention kernels (attention_tt.c), test references of flash.c. */
#ifndef LOOM_TESTS_ATTENTION_TT_H
#define LOOM_TESTS_ATTENTION_TT_H

/* qkv (B,T,3C), out (B,T,C), att (B,NH,T,T); dqkv +=; scratch T*T floats per thread */
void tt_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH);
void tt_attention_probs(float *att, const float *qkv, int B, int T, int C, int NH);
void tt_attention_backward(float *dqkv, float *scratch, int scratch_threads, const float *dout, const float *qkv,
                           const float *att, int B, int T, int C, int NH);
/* q (N,NH D), k, v (N,NKV D), out (N,NH D), att (B,NH,T,T), window W; dq, dk, dv +=; dkh, dvh (N,NH D) */
void tt_nc_attention_forward(float *out, float *att, const float *q, const float *k, const float *v, int B, int T,
                             int NH, int NKV, int D, int W);
void tt_nc_attention_probs(float *att, const float *q, const float *k, int B, int T, int NH, int NKV, int D, int W);
void tt_nc_attention_backward(float *dq, float *dk, float *dv, float *dkh, float *dvh, float *scratch,
                              int scratch_threads, const float *dout, const float *q, const float *k, const float *v,
                              const float *att, int B, int T, int NH, int NKV, int D, int W);

#endif
