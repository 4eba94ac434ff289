/* loom/cpu.h: what this x86-64 CPU can do, read with CPUID (and XGETBV for what the operating system
 * saves), and the hardware peaks MFU is measured against.
 *
 * Kernels are chosen from these features, never from the CPU's model name: a cloud VM that calls
 * itself "Intel(R) Xeon(R) Processor" has the same AVX-512 as the part it runs on. A feature counts
 * only when the OS also saves its registers (an AVX-512 CPU under an OS without ZMM state support
 * runs AVX2 code). Thread-safe; the detection runs once. */
#ifndef LOOM_CPU_H
#define LOOM_CPU_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The raw CPUID words the features are decoded from (leaf 0, 1, 7.0, 7.1 and XCR0). */
typedef struct {
	uint32_t max_leaf;                   /* leaf 0 eax */
	uint32_t vendor[3];                  /* leaf 0 ebx, edx, ecx: the vendor string in that order */
	uint32_t l1_eax, l1_ecx, l1_edx;     /* leaf 1 */
	uint32_t l7_ebx, l7_ecx, l7_edx;     /* leaf 7 sub-leaf 0 (0 when max_leaf < 7) */
	uint32_t l7_1_eax;                   /* leaf 7 sub-leaf 1 (0 when leaf 7.0 eax < 1) */
	uint64_t xcr0;                       /* XGETBV(0), 0 without OSXSAVE */
} loom_cpuid_words_t;

/* The widest fp32 FMA unit a kernel can use here. */
typedef enum {
	LOOM_ISA_SCALAR = 0, /* SSE2 only (every x86-64) */
	LOOM_ISA_AVX2 = 1,   /* AVX2 + FMA, YMM state saved by the OS */
	LOOM_ISA_AVX512 = 2, /* AVX-512 F/BW/VL/DQ, ZMM and opmask state saved */
} loom_isa_t;

typedef struct {
	char vendor[13];
	char brand[49];        /* the model name, "" when the CPU has no brand string */
	unsigned family, model;
	/* instruction-set features, each 1 only when the OS saves the registers it needs */
	int sse42, avx, fma, avx2;
	int avx512f, avx512bw, avx512vl, avx512dq, avx512_vnni, avx512_bf16;
	int amx_tile, amx_bf16; /* the CPU has them and XCR0 enables tile state (Linux also wants a
	                         * per-process permission: arch_prctl ARCH_REQ_XCOMP_PERM, oneDNN asks) */
	/* what the OS saves (XCR0) */
	int os_ymm, os_zmm, os_amx;
	loom_isa_t isa;
} loom_cpu_t;

/* Decode CPUID words into features (pure: tests give it words; loom_cpu() gives it this CPU's).
 * brand may be NULL. */
void loom_cpu_decode(const loom_cpuid_words_t *w, const char *brand, loom_cpu_t *cpu);
/* This CPU, detected once (a static struct; never NULL). LOOM_CPU_ISA=avx2|scalar caps `isa` (and
 * the features above it), so a run can be made to take an older machine's kernels. */
const loom_cpu_t *loom_cpu(void);
/* "AVX-512", "AVX2", "SSE2" */
const char *loom_isa_name(loom_isa_t isa);
/* One line of the features that matter to loom, e.g. "AVX-512 F/BW/VL/DQ, VNNI, AVX512-BF16" (static
 * buffer per thread). */
const char *loom_cpu_features_str(const loom_cpu_t *cpu);

/* ---- OpenBLAS's kernels ------------------------------------------------------------------------- */

/* OpenBLAS picks its kernels from a table of CPU models when it loads, reading OPENBLAS_CORETYPE
 * only then, and falls back to its SSE3 "Prescott" kernels on a model it does not know. With
 * LOOM_GEMM=openblas, the plan says whether the core it picked is below what the features allow and
 * which to force: SkylakeX for AVX-512 F/BW/VL/DQ, Haswell for AVX2 + FMA. A user's own
 * OPENBLAS_CORETYPE is always respected. `loom` applies a force by re-executing itself once with the
 * variable set (before OpenBLAS can load again); a program linking libloom gets `why` to print. */
typedef struct {
	int force;            /* 1: re-run with OPENBLAS_CORETYPE=coretype */
	const char *coretype; /* the core to force (or the best for this ISA), NULL when none is better */
	char why[200];        /* one line: what was chosen and why */
} loom_blas_plan_t;
/* current: the core OpenBLAS runs (openblas_get_corename()); user_coretype: OPENBLAS_CORETYPE or NULL. */
void loom_blas_plan(const loom_cpu_t *cpu, const char *current, const char *user_coretype, loom_blas_plan_t *plan);
/* OpenBLAS x86-64 core names by the vector unit their sgemm uses: 3 AVX-512, 2 AVX2, 1 AVX, 0 SSE
 * (and unknown names). Case-insensitive. */
int loom_blas_core_tier(const char *corename);

/* ---- hardware peaks (one core's FMA throughput loop, times the threads) ---------------------- */

/* fp32 FLOP/s of `threads` threads (0 = all) running loom's FMA throughput loop for the widest unit
 * (16 independent zmm accumulators on AVX-512, 12 ymm on AVX2, 8 xmm mul+add on SSE2) for about
 * `seconds`, all threads at once (so the clock is the one a busy chip runs at). */
double loom_fma_peak_flops(int threads, double seconds);
/* bf16 dot-product FLOP/s: AVX512-BF16's vdpbf16ps loop; 0 when the CPU has none. */
double loom_bf16_dot_peak_flops(int threads, double seconds);
/* The loop of one ISA on one thread (the calling one): FLOP/s, 0 when this CPU cannot run it. Tests
 * check each against the physical bounds of its unit; `loom bench gemm` prints them. */
double loom_fma_loop_flops(loom_isa_t isa, double seconds);

#ifdef __cplusplus
}
#endif
#endif
