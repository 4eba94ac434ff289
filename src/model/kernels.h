/* kernels.h: GPT-2's kernels (internal): fast versions (kernels.c, attention.c, classifier.c) and the
 * plain reference versions beside them (kernels_ref.c) that the tests compare against.
 *
 * Conventions (llm.c's): outputs first, sizes last, shapes in comments; `d` marks a gradient and every
 * backward ACCUMULATES (+=) into its gradient outputs, so callers zero them when they need "=". Rows
 * are N = B*T positions. Matmul weights are in HF's Conv1D layout [in, out]: out = inp W + b.
 * Fast kernels run on the OpenMP thread count (loom_set_num_threads) and are deterministic for a
 * given thread count; none of them allocates. */
#ifndef LOOM_MODEL_KERNELS_H
#define LOOM_MODEL_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "loom/gpt2.h" /* loom_compute_dtype_t */

/* ---- BLAS ------------------------------------------------------------------------------------ */

/* Row-major C (M,N) = alpha op(A) op(B) + beta C through the fp32 backend (loom__sgemm1), or through loom__gemm_bf16 when
 * this thread's model runs in bf16 (loom__gemm_setup). Outside a parallel region and
 * with more than one OpenMP thread, the product is split over the threads along its larger output
 * dimension, each part a single-threaded sgemm: one thread pool for BLAS and loops, no
 * oversubscription. ta/tb: 1 to transpose. */
void loom__gemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
          float beta, float *C, int ldc);
/* The same on the calling thread alone, always fp32: oneDNN's sgemm, or OpenBLAS's with
 * LOOM_GEMM=openblas (kernels that run their own small products per thread call it). */
void loom__sgemm1(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
                  float beta, float *C, int ldc);
/* Before any use of oneDNN: caps its ISA as LOOM_CPU_ISA caps loom_cpu() (once; thread-safe). */
void loom__dnnl_setup(void);
/* The fp32 sgemm of loom__gemm whatever this thread's precision (the portable bf16 path runs on it). */
void loom__gemm_f32(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                    int ldb, float beta, float *C, int ldc);
/* Make OpenBLAS single-threaded when it runs its own pthreads (idempotent, cheap), and switch this
 * thread's loom__gemm to fp32 (loom__gemm_setup below chooses a model's precision instead). */
void loom__gemm_setup_threads(void);

/* ---- bf16 GEMM (matmul_bf16.c: oneDNN natively, or the fp32 sgemm on rounded operands) ------------ */

/* A model's GEMM precision, its bf16 path and the operand scratch its GEMMs reuse; zero-initialized
 * is fp32. err keeps the first failure of a pass (loom_errmsg has its detail) until loom__gemm_status.
 * An operand "in the ctx's format" is what the path multiplies: bf16 values (uint16_t) on the native
 * path, bf16-rounded fp32 values (float) on the portable one. */
enum { LOOM_BF16_SLOT_A, LOOM_BF16_SLOT_B, LOOM_BF16_SLOT_HOLD0, LOOM_BF16_SLOT_HOLD1, LOOM_BF16_SLOT_ATTN, LOOM_BF16_SLOTS };
typedef struct {
	int dtype; /* loom_compute_dtype_t */
	int path;  /* loom_bf16_path_t: AUTO (0) is loom_bf16_path()'s choice, fixed at the first bf16 call */
	/* scratch slots in the ctx's format: A and B are the GEMM's own conversions; HOLD0/1 keep an
	 * operand a kernel converted once for several GEMMs (loom__bf16_hold); ATTN is the attention
	 * kernel's (flash.c: its keys and values packed once per call) */
	void *buf[LOOM_BF16_SLOTS];
	size_t cap[LOOM_BF16_SLOTS]; /* bytes at buf[k] */
	int err;
} loom__gemm_ctx_t;

/* What every entry point of a model calls before its kernels: loom__gemm_setup_threads(), and from
 * now on this thread's loom__gemm runs in ctx's precision (NULL or an fp32 ctx: fp32 sgemm). */
void loom__gemm_setup(loom__gemm_ctx_t *ctx);
void loom__gemm_use(loom__gemm_ctx_t *ctx);  /* the switch alone (setup_threads sets NULL) */
loom__gemm_ctx_t *loom__gemm_current(void); /* the bf16 ctx loom__gemm uses now, or NULL */
/* The first error since the last call (LOOM_OK if none), cleared. */
int loom__gemm_status(loom__gemm_ctx_t *ctx);
void loom__gemm_ctx_free(loom__gemm_ctx_t *ctx); /* frees the scratch; the ctx stays usable */
/* As loom__gemm with both operands rounded to bf16 (nearest even) and fp32 accumulation, on ctx's
 * path. LOOM_OK, or ctx->err (LOOM_ENOMEM, LOOM_ENOTSUP, LOOM_EINVAL from choosing the path) with the
 * GEMM not done. */
int loom__gemm_bf16(loom__gemm_ctx_t *ctx, int ta, int tb, int M, int N, int K, float alpha, const float *A,
                    int lda, const float *B, int ldb, float beta, float *C, int ldc);
/* The same with either operand already in the ctx's format (A16/B16 non-NULL, from loom__bf16_hold or
 * loom__bf16_slot: used instead of A/B, in the same layout and leading dimension), for a kernel that
 * reuses one conversion in several products. */
int loom__gemm_bf16x(loom__gemm_ctx_t *ctx, int ta, int tb, int M, int N, int K, float alpha, const float *A,
                     const void *A16, int lda, const float *B, const void *B16, int ldb, float beta, float *C,
                     int ldc);
/* src (n) converted into scratch slot HOLD0 or HOLD1 of ctx, in its format, valid until that slot is
 * held again; NULL (ctx->err set) when out of memory or the path cannot be chosen. */
const void *loom__bf16_hold(loom__gemm_ctx_t *ctx, int slot, const float *src, size_t n);
/* Slot HOLD0/HOLD1 (or ATTN, flash.c's) with room for n values in ctx's format, for a kernel that writes
 * its operand itself (with loom__bf16_row, one thread per row); NULL (ctx->err set) as loom__bf16_hold. */
void *loom__bf16_slot(loom__gemm_ctx_t *ctx, int slot, size_t n);
/* Values [at, at + n) of a slot in ctx's format = src (n) converted; this thread. */
void loom__bf16_row(const loom__gemm_ctx_t *ctx, void *slot, size_t at, const float *src, int n);
/* dst (n) = src (n) rounded to bf16; and one value rounded to bf16 and back (the portable path's
 * operands, and the tests'). */
void loom__bf16_from_f32(uint16_t *dst, const float *src, size_t n);
float loom__bf16_round(float f);
/* f rounded to bf16 (nearest even; a NaN stays a quiet NaN): its 16 bits. Inline, for loops that
 * vectorize (the conversions of matmul_bf16.c and the attention's operands). */
static inline uint16_t loom__bf16_bits(float f)
{
	union {
		float f;
		uint32_t u;
	} x = {f};
	if ((x.u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((x.u >> 16) | 0x40);
	return (uint16_t)((x.u + 0x7fffu + ((x.u >> 16) & 1u)) >> 16);
}

/* ---- fast kernels ---------------------------------------------------------------------------- */

/* out (N,C) = wte[inp] + wpe[t]; inp (B,T) token ids already checked to be in [0,V). */
void loom__encoder_forward(float *out, const int *inp, const float *wte, const float *wpe, int B, int T, int C);
void loom__encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int B, int T, int C);
/* The rows of a table (rows ld apart) holding ids [v0, v0 + nrows) (a vocab-parallel shard; v0 0 for a
 * whole one): out (N, cols; rows ldo apart) = table[ids - v0], zero rows for ids held elsewhere (nanochat,
 * llama); and dtable[ids[n] - v0] += d[n] (rows ldd apart) for the ids held, deterministic (columns split
 * over threads, a repeated id accumulated in row order). */
void loom__rows_gather(float *out, int ldo, const float *table, int ld, const int *ids, int v0, int nrows, int N,
                       int cols);
void loom__rows_scatter_add(float *dtable, int ld, const float *d, int ldd, const int *ids, int v0, int nrows, int N,
                            int cols);

/* out (N,C), mean (N), rstd (N) from inp (N,C), weight (C), bias (C); eps 1e-5, biased variance. */
void loom__layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                       const float *bias, int N, int C);
void loom__layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                        const float *weight, const float *mean, const float *rstd, int N, int C);

/* out (N,OC) = inp (N,C) weight (C,OC) + bias (OC); bias may be NULL. */
void loom__matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int N, int C, int OC);
/* dinp (N,C) += dout weight^T; dweight (C,OC) += inp^T dout; dbias (OC) += column sums of dout. */
void loom__matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                     const float *weight, int N, int C, int OC);

/* GELU, tanh approximation: out (N) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
void loom__gelu_forward(float *out, const float *inp, size_t N);
void loom__gelu_backward(float *dinp, const float *inp, const float *dout, size_t N);

/* out (N) = inp1 + inp2. (Its backward is dout added to both inputs' gradients.) */
void loom__residual_forward(float *out, const float *inp1, const float *inp2, size_t N);

/* ---- attention (flash.c): the one attention kernel of every family ------------------------------ */

/* One attention call's operands and shape. q: B sequences of Tq query rows, ldq floats apart, query
 * head h at columns [h D, h D + D); k, v: B sequences of Tk key rows, ldk apart, kv head g at columns
 * [g D, g D + D); query head h reads kv head h / (NH / NKV). Query row i is at position qpos + i, key row
 * j at kpos + j; a query at position t sees the keys at positions [t - W, t] (W < 0: no window, causal
 * only). Scores are scale q.k. */
typedef struct {
	const float *q, *k, *v;
	int ldq, ldk;
	int B, Tq, Tk, NH, NKV, D;
	int W;          /* window, or -1 */
	int qpos, kpos; /* positions of query row 0 and key row 0 */
	float scale;
	/* Query rows from one sequence's first to the next one's, in q, out, dout and dq (0: Tq, the
	 * sequences back to back): a context-parallel rank runs each of its two chunks of every sequence
	 * (Tq rows) where they lie in its (B, 2 Tq) rows. lse stays (B,NH,Tq). */
	int qbs;
} loom__flash_t;

/* out (B,Tq) rows ldo apart, head h at columns h D: softmax(scale q k^T, masked) v; lse (B,NH,Tq), may be
 * NULL: each row's log-sum-exp of its scores (-inf for a row that sees no key, whose output is 0).
 * Deterministic whatever the thread count. fp32 allocates nothing (its blocks are on the stack); in a
 * bf16 context the native path packs K and V into the context's ATTN slot (grown once, B Tk NKV D
 * values per form; a failure to grow it is kept in ctx->err and the call runs in fp32). */
void loom__flash_forward(const loom__flash_t *a, float *out, int ldo, float *lse);
/* dq (rows lddq apart) +=, dk, dv (rows lddk apart) += the gradients of the forward's output given dout
 * (rows lddo apart), the forward's out and lse. scratch: loom__flash_scratch_floats(B, Tk, NKV, D,
 * scratch_threads) floats (per-thread dK/dV partials); at most scratch_threads threads run, and the
 * result is bit-identical from run to run for a thread count. */
void loom__flash_backward(const loom__flash_t *a, float *dq, int lddq, float *dk, float *dv, int lddk,
                          const float *dout, int lddo, const float *out, int ldo, const float *lse, float *scratch,
                          int scratch_threads);
size_t loom__flash_scratch_floats(int B, int Tk, int NKV, int D, int nthreads);
/* The attention's products LOOM_ATTN_BF16 asks for in a bf16 context: 3 (unset or "": bf16 on AMX where
 * the CPU has it, else fp32), 1 (bf16 on every path), 0 (fp32), 2 ("avx512": bf16 without AMX); -1 for
 * another value (the message says what was
 * expected). The families' create refuses -1 (loom__cp_opts_check). */
int loom__flash_bf16_env(void);
/* Rows of a key block for head size D (chosen from the L2 cache size). */
int loom__flash_key_block(int D);

/* ---- context-parallel attention (cp_attention.c) ------------------------------------------------- */

/* The context-parallel layout (loom_cp_position): a sequence of N Tl positions is cut into N K chunks
 * of c = Tl/K (K even: chunks per rank); it is K/2 segments of 2N chunks, and in each segment rank r
 * holds the head-tail pair, the segment's chunks r and 2N-1-r. Rank r's local chunk h (0..K-1) is
 * global chunk loom__cp_chunk(N, r, h); its rows are its chunks in that (increasing) order. K = 2 is
 * Megatron's head-tail layout. */
static inline int loom__cp_chunk(int N, int r, int h)
{
	return (h / 2) * 2 * N + (h % 2 ? 2 * N - 1 - r : r);
}

/* The most chunks per rank loom_cp_chunks chooses. */
#define LOOM_CP_MAX_CHUNKS 8

/* A model's chunks per rank for calls of Tl rows (a sequence of N Tl positions): loom_cp_chunks of its
 * configuration, remembered in *memo_T, *memo_K for the last Tl (every pass asks; the trainer computes
 * the same from the same figures, so its rows and the model's positions agree). */
static inline int loom__cp_chunks_memo(const loom_model_config_t *cfg, int N, int Tl, int *memo_T, int *memo_K)
{
	if (*memo_T != Tl)
		*memo_K = loom_cp_chunks(cfg, N * Tl, N), *memo_T = Tl;
	return *memo_K;
}

/* Absolute position of local row t (0 <= t < Tl) of rank r of N holding K chunks; t itself when N <= 1. */
static inline int loom__cp_pos(int t, int Tl, int N, int r, int K)
{
	if (N <= 1)
		return t;
	int c = Tl / K;
	return loom__cp_chunk(N, r, t / c) * c + t % c;
}

/* Keys that rank r's queries see in all, summed over its K chunks of a sequence of T positions (N
 * ranks), under the causal mask and the window W (a query at t sees keys t - W..t; W < 0: none): the
 * rank's attention work, exact (loom_model_attn_keys per chunk). */
double loom__cp_rank_keys(int T, int N, int K, int r, int W);

/* A context-parallel rank's side of attention: the group (N ranks, this one r, K chunks each), the form
 * (ring 1: the ring, the default; 0: the all-gather, cp_attention.c), the model's hook (its
 * LOOM_TP_ALLGATHER and LOOM_TP_REDUCE_SCATTER, or LOOM_TP_SEND_NEXT, RECV_PREV and WAIT over the
 * group), the scratch mem (loom__cp_scratch_floats(B, Tl, N, NH, NKV, D) floats for calls of up to
 * B x Tl rows) and the kernel's backward partials (loom__flash_scratch_floats(B, N Tl, NKV, D, scratch_threads), enough for both). */
typedef struct {
	int N, r;
	int K; /* chunks per rank (the layout: loom__cp_chunk; loom_cp_chunks chooses it) */
	int ring;
	loom_tp_reduce_fn fn;
	void *ctx;
	float *mem;
	float *scratch;
	int scratch_threads;
} loom__cp_t;
size_t loom__cp_scratch_floats(int B, int Tl, int N, int NH, int NKV, int D);
/* The form LOOM_CP_ATTENTION asks for: 1 (ring, also when unset) or 0 (gather); -1 for another value
 * (the message says what was expected). */
int loom__cp_ring_env(void);
/* A family's create: the cp options of o against cfg (rank in range, an even number of local rows that
 * fit the sequence, LOOM_CP_ATTENTION valid) and the attention's LOOM_ATTN_BF16; LOOM_EINVAL with
 * "<who> create: ..." naming len_name, the family's name of the sequence length. */
int loom__cp_opts_check(const char *who, const char *len_name, const loom_model_config_t *cfg,
                        const loom_model_opts_t *o);
/* Attention of the rank's local rows: a describes them as one process's call would (q, k, v the local
 * (B, Tl) rows, Tq = Tk = Tl even, qpos/kpos ignored, NH, NKV, D, W, scale); out (B, Tl) rows ldo apart as
 * the kernel's, lse two blocks (B,NH,Tl/2), chunk 0's then chunk 1's. Collective over the group (one
 * all-gather); returns 0 or the hook's error. */
int loom__cp_attention_forward(const loom__cp_t *cp, const loom__flash_t *a, float *out, int ldo, float *lse);
/* dq (rows lddq apart), dk, dv (rows lddk apart) += the gradients of the local rows (dk, dv: the group's
 * sum over every rank's queries). Collective (an all-gather and a reduce-scatter); 0 or the hook's error. */
int loom__cp_attention_backward(const loom__cp_t *cp, const loom__flash_t *a, float *dq, int lddq, float *dk,
                                float *dv, int lddk, const float *dout, int lddo, const float *out, int ldo,
                                const float *lse);

/* GPT-2's causal attention on the kernel above: qkv (B,T,3C) holds q, k, v of each position (head h at
 * columns h*hs of each third, hs = C/NH); out (B,T,C); lse (B,NH,T). Scale 1/sqrt(hs). */
void loom__attention_forward(float *out, float *lse, const float *qkv, int B, int T, int C, int NH);
/* Those operands as the kernel takes them (qkv's three strided views), for a caller that runs it itself. */
loom__flash_t loom__attention_shape(const float *qkv, int B, int T, int C, int NH);
/* dqkv (B,T,3C) += ...; scratch: loom__attention_scratch_floats(B, T, C, scratch_threads). */
void loom__attention_backward(float *dqkv, float *scratch, int scratch_threads, const float *dout, const float *qkv,
                              const float *out, const float *lse, int B, int T, int C, int NH);
size_t loom__attention_scratch_floats(int B, int T, int C, int nthreads);

/* Language-model head fused with softmax and cross-entropy, over chunks of `chunk` positions so
 * that the (N,V) logits never exist whole: for each chunk, logits (chunk,V) = x wte^T into the
 * scratch `logits`, losses (N) = -log softmax(logits)[target]; and when dx != NULL, the gradient of
 * dloss * losses (dloss: d total / d each position's loss) replaces the logits in place and
 * dx (N,C) += dlogits wte, dwte (V,C) += dlogits^T x. Targets must be in [0,V) (the model checks). */
void loom__classifier_forward_backward(float *losses, float *dx, float *dwte, float *logits, int chunk, const float *x,
                                 const float *wte, const int *targets, float dloss, int N, int C, int V);

/* ---- reference kernels (kernels_ref.c): plain loops, libm, double accumulators --------------- */

void loom__encoder_forward_ref(float *out, const int *inp, const float *wte, const float *wpe, int B, int T, int C);
void loom__encoder_backward_ref(float *dwte, float *dwpe, const float *dout, const int *inp, int B, int T, int C);
void loom__layernorm_forward_ref(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                           const float *bias, int N, int C);
void loom__layernorm_backward_ref(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                            const float *weight, const float *mean, const float *rstd, int N, int C);
void loom__matmul_forward_ref(float *out, const float *inp, const float *weight, const float *bias, int N, int C, int OC);
void loom__matmul_backward_ref(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                         const float *weight, int N, int C, int OC);
void loom__gelu_forward_ref(float *out, const float *inp, size_t N);
void loom__gelu_backward_ref(float *dinp, const float *inp, const float *dout, size_t N);
void loom__residual_forward_ref(float *out, const float *inp1, const float *inp2, size_t N);
void loom__attention_forward_ref(float *out, float *att, const float *qkv, int B, int T, int C, int NH);
void loom__attention_backward_ref(float *dqkv, const float *dout, const float *qkv, const float *att, int B, int T, int C,
                            int NH);
/* Whole logits (N,V) kept in `logits`; with dx != NULL they are replaced by their gradient. */
void loom__classifier_forward_backward_ref(float *losses, float *dx, float *dwte, float *logits, const float *x,
                                     const float *wte, const int *targets, float dloss, int N, int C, int V);

#endif
