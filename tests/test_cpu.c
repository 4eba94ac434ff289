/* test_cpu.c: CPUID decoding from given feature words (every CPU kind loom has met, whichever this
 * machine is), the kernel choice under each environment (the GEMM backend, OpenBLAS's core type:
 * forced, none, a user's own), and the hardware peak loops within the physical bounds of their unit. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/cpu.h"
#include "loom/gpt2.h"
#include "test.h"

/* Feature words as the CPUs of docs/model.md report them. */
enum {
	L1_SSE42 = 1u << 20, L1_FMA = 1u << 12, L1_OSXSAVE = 1u << 27, L1_AVX = 1u << 28,
	L7_AVX2 = 1u << 5, L7_F = 1u << 16, L7_DQ = 1u << 17, L7_BW = 1u << 30, L7_VL = 1u << 31,
	L7C_VNNI = 1u << 11, L7D_AMX_BF16 = 1u << 22, L7D_AMX_TILE = 1u << 24, L71_BF16 = 1u << 5,
};
#define XCR0_AVX 0x7ull
#define XCR0_AVX512 0xe7ull
#define XCR0_AMX 0x600e7ull

static loom_cpuid_words_t words(const char *vendor, uint32_t eax1, uint32_t ecx1, uint32_t ebx7, uint32_t ecx7,
                                uint32_t edx7, uint32_t eax71, uint64_t xcr0)
{
	loom_cpuid_words_t w = {.max_leaf = 0x20, .l1_eax = eax1, .l1_ecx = ecx1, .l7_ebx = ebx7, .l7_ecx = ecx7,
	                        .l7_edx = edx7, .l7_1_eax = eax71, .xcr0 = xcr0};
	memcpy(w.vendor, vendor, 12);
	return w;
}

#define AVX512_WORDS (L7_AVX2 | L7_F | L7_DQ | L7_BW | L7_VL)
#define L1_ALL (L1_SSE42 | L1_FMA | L1_OSXSAVE | L1_AVX)

TEST(cpu_decode_feature_words)
{
	loom_cpu_t c;
	/* the Intel VM of issue 19: AVX-512 F/BW/DQ/VL/VNNI, no BF16; family 6 model 0x55 */
	loom_cpuid_words_t w = words("GenuineIntel", 0x00050654, L1_ALL, AVX512_WORDS, L7C_VNNI, 0, 0, XCR0_AVX512);
	loom_cpu_decode(&w, "Intel(R) Xeon(R) Processor", &c);
	CHECK_STREQ(c.vendor, "GenuineIntel");
	CHECK_STREQ(c.brand, "Intel(R) Xeon(R) Processor");
	CHECK_EQ(c.family, 6u);
	CHECK_EQ(c.model, 0x55u);
	CHECK_EQ(c.isa, LOOM_ISA_AVX512);
	CHECK(c.avx512f && c.avx512bw && c.avx512vl && c.avx512dq && c.avx512_vnni && c.avx2 && c.fma);
	CHECK_EQ(c.avx512_bf16, 0);
	CHECK_EQ(c.amx_tile, 0);
	CHECK_STREQ(loom_cpu_features_str(&c), "AVX-512 F/BW/VL/DQ, VNNI");
	/* the same CPU under an OS that does not save ZMM state: AVX2 kernels */
	w.xcr0 = XCR0_AVX;
	loom_cpu_decode(&w, NULL, &c);
	CHECK_EQ(c.isa, LOOM_ISA_AVX2);
	CHECK_EQ(c.avx512f, 0);
	CHECK_EQ(c.os_zmm, 0);
	CHECK_STREQ(c.brand, "");
	/* ... and without OSXSAVE no AVX at all, whatever XCR0 says */
	w.xcr0 = XCR0_AVX512, w.l1_ecx &= ~(uint32_t)L1_OSXSAVE;
	loom_cpu_decode(&w, NULL, &c);
	CHECK_EQ(c.isa, LOOM_ISA_SCALAR);
	CHECK_EQ(c.avx, 0);
	CHECK_EQ(c.sse42, 1);
	CHECK_STREQ(loom_cpu_features_str(&c), "SSE2");

	/* AMD Zen 3 (family 25 model 1): AVX2 + FMA */
	w = words("AuthenticAMD", 0x00A00F11, L1_ALL, L7_AVX2, 0, 0, 0, XCR0_AVX);
	loom_cpu_decode(&w, "AMD EPYC", &c);
	CHECK_EQ(c.family, 25u);
	CHECK_EQ(c.model, 1u);
	CHECK_EQ(c.isa, LOOM_ISA_AVX2);
	CHECK_STREQ(loom_cpu_features_str(&c), "AVX2 + FMA");
	/* AVX2 without FMA (no such CPU, but the rule): no AVX2 tier */
	w.l1_ecx &= ~(uint32_t)L1_FMA;
	loom_cpu_decode(&w, NULL, &c);
	CHECK_EQ(c.isa, LOOM_ISA_SCALAR);

	/* AMD Zen 4 (family 25 model 17): + AVX512-BF16 in leaf 7.1 */
	w = words("AuthenticAMD", 0x00A10F11, L1_ALL, AVX512_WORDS, L7C_VNNI, 0, L71_BF16, XCR0_AVX512);
	loom_cpu_decode(&w, "AMD EPYC", &c);
	CHECK_EQ(c.family, 25u);
	CHECK_EQ(c.model, 17u);
	CHECK_EQ(c.isa, LOOM_ISA_AVX512);
	CHECK_EQ(c.avx512_bf16, 1);
	CHECK_STREQ(loom_cpu_features_str(&c), "AVX-512 F/BW/VL/DQ, VNNI, AVX512-BF16");

	/* Sapphire Rapids (family 6 model 0x8f): AMX only with tile state in XCR0 */
	w = words("GenuineIntel", 0x000806F8, L1_ALL, AVX512_WORDS, L7C_VNNI, L7D_AMX_BF16 | L7D_AMX_TILE, L71_BF16,
	          XCR0_AMX);
	loom_cpu_decode(&w, NULL, &c);
	CHECK_EQ(c.model, 0x8fu);
	CHECK(c.amx_tile && c.amx_bf16 && c.os_amx);
	CHECK_STREQ(loom_cpu_features_str(&c), "AVX-512 F/BW/VL/DQ, VNNI, AVX512-BF16, AMX-TILE/BF16");
	w.xcr0 = XCR0_AVX512;
	loom_cpu_decode(&w, NULL, &c);
	CHECK_EQ(c.amx_tile, 0);
	CHECK_EQ(c.amx_bf16, 0);
	CHECK_EQ(c.isa, LOOM_ISA_AVX512);

	/* an old CPU whose leaf 7 is not there: the leaf-7 words are not read */
	w = words("GenuineIntel", 0x000206A7, L1_SSE42 | L1_OSXSAVE | L1_AVX, AVX512_WORDS, 0, 0, 0, XCR0_AVX);
	w.max_leaf = 0xd;
	w.l7_ebx = AVX512_WORDS; /* garbage a CPU without leaf 7 may return: ignored below max_leaf 7 */
	w.max_leaf = 6;
	loom_cpu_decode(&w, NULL, &c);
	CHECK_EQ(c.avx, 1);
	CHECK_EQ(c.avx2, 0);
	CHECK_EQ(c.isa, LOOM_ISA_SCALAR);
	CHECK_STREQ(loom_cpu_features_str(&c), "AVX");
	return 0;
}

TEST(cpu_blas_core_choice)
{
	loom_cpu_t avx512, avx2, old;
	loom_cpuid_words_t w = words("GenuineIntel", 0x00050654, L1_ALL, AVX512_WORDS, 0, 0, 0, XCR0_AVX512);
	loom_cpu_decode(&w, NULL, &avx512);
	w.xcr0 = XCR0_AVX;
	loom_cpu_decode(&w, NULL, &avx2);
	w.l1_ecx &= ~(uint32_t)L1_FMA;
	loom_cpu_decode(&w, NULL, &old);
	loom_blas_plan_t p;

	CHECK_EQ(loom_blas_core_tier("SkylakeX"), 3);
	CHECK_EQ(loom_blas_core_tier("COOPERLAKE"), 3);
	CHECK_EQ(loom_blas_core_tier("Zen"), 2);
	CHECK_EQ(loom_blas_core_tier("haswell"), 2);
	CHECK_EQ(loom_blas_core_tier("Sandybridge"), 1);
	CHECK_EQ(loom_blas_core_tier("Prescott"), 0);
	CHECK_EQ(loom_blas_core_tier(NULL), 0);

	/* the Intel VM: OpenBLAS picked its SSE3 kernels, nobody set a core: force SkylakeX */
	loom_blas_plan(&avx512, "Prescott", NULL, &p);
	CHECK_EQ(p.force, 1);
	CHECK_STREQ(p.coretype, "SkylakeX");
	CHECK_CONTAINS(p.why, "OpenBLAS picked core Prescott for this CPU model, below its AVX-512: "
	                      "OPENBLAS_CORETYPE=SkylakeX");
	/* an empty OPENBLAS_CORETYPE counts as none */
	loom_blas_plan(&avx512, "Prescott", "", &p);
	CHECK_EQ(p.force, 1);
	/* none needed: OpenBLAS knows the CPU */
	loom_blas_plan(&avx512, "Cooperlake", NULL, &p);
	CHECK_EQ(p.force, 0);
	CHECK_CONTAINS(p.why, "the best it has for AVX-512");
	loom_blas_plan(&avx2, "Zen", NULL, &p);
	CHECK_EQ(p.force, 0);
	CHECK_STREQ(p.coretype, "Haswell");
	loom_blas_plan(&avx2, "Core2", NULL, &p);
	CHECK_EQ(p.force, 1);
	CHECK_STREQ(p.coretype, "Haswell");
	/* a user's own OPENBLAS_CORETYPE is respected, even a slower one, and said to be */
	loom_blas_plan(&avx512, "Prescott", "Prescott", &p);
	CHECK_EQ(p.force, 0);
	CHECK_CONTAINS(p.why, "OPENBLAS_CORETYPE=Prescott is yours, left as it is; this CPU can run SkylakeX");
	loom_blas_plan(&avx512, "SkylakeX", "SkylakeX", &p);
	CHECK_EQ(p.force, 0);
	CHECK(strstr(p.why, "this CPU can run") == NULL);
	/* nothing better than SSE for a CPU without AVX2 + FMA */
	loom_blas_plan(&old, "Prescott", NULL, &p);
	CHECK_EQ(p.force, 0);
	CHECK(p.coretype == NULL);
	return 0;
}

/* The GEMM backend from LOOM_GEMM, and what `loom` does with each environment. */
TEST(cpu_gemm_backend_choice)
{
	char cmd[1024], out[8192];
	CHECK_EQ(loom_gemm_backend_parse(NULL), LOOM_GEMM_ONEDNN);
	CHECK_EQ(loom_gemm_backend_parse(""), LOOM_GEMM_ONEDNN);
	CHECK_EQ(loom_gemm_backend_parse("onednn"), LOOM_GEMM_ONEDNN);
	CHECK_EQ(loom_gemm_backend_parse("auto"), LOOM_GEMM_ONEDNN);
	CHECK_EQ(loom_gemm_backend_parse("openblas"), LOOM_GEMM_OPENBLAS);

	/* the default: oneDNN's sgemm, with the kernels of this CPU's ISA */
	const char *isa = loom_cpu()->isa == LOOM_ISA_AVX512 ? "avx512_core" : loom_cpu()->isa == LOOM_ISA_AVX2 ? "avx2" : "";
	snprintf(cmd, sizeof cmd, "env -u LOOM_GEMM -u LOOM_CPU_ISA %s bench gemm --threads 1 --size 32 --seconds 0.01",
	         test_loom_bin());
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 60), 0);
	CHECK_CONTAINS(out, "fp32 GEMM: oneDNN sgemm (jit ");
	CHECK_CONTAINS(out, isa);
	/* LOOM_CPU_ISA=avx2 makes an AVX-512 machine take an AVX2 machine's kernels (where it has AVX2) */
	if (loom_cpu()->isa >= LOOM_ISA_AVX2) {
		snprintf(cmd, sizeof cmd, "LOOM_CPU_ISA=avx2 %s bench gemm --threads 1 --size 32 --seconds 0.01",
		         test_loom_bin());
		CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 60), 0);
		CHECK_CONTAINS(out, "fp32 GEMM: oneDNN sgemm (jit avx2)");
		CHECK_CONTAINS(out, ": AVX2 + FMA\n");
	}
	/* OpenBLAS: the core it runs is named; a user's OPENBLAS_CORETYPE is kept as given */
	snprintf(cmd, sizeof cmd, "LOOM_GEMM=openblas OPENBLAS_CORETYPE=Haswell %s bench gemm --threads 1 --size 32 "
	         "--seconds 0.01", test_loom_bin());
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 60), 0);
	CHECK_CONTAINS(out, "fp32 GEMM: OpenBLAS sgemm (core Haswell)");
	CHECK_CONTAINS(out, "OPENBLAS_CORETYPE=Haswell is yours, left as it is");
	snprintf(cmd, sizeof cmd, "LOOM_GEMM=openblas OPENBLAS_CORETYPE=Prescott %s bench gemm --threads 1 --size 32 "
	         "--seconds 0.01", test_loom_bin());
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 60), 0);
	CHECK_CONTAINS(out, "fp32 GEMM: OpenBLAS sgemm (core Prescott)");
	/* without one, the core OpenBLAS ends up on is at least what the features allow (forced by a
	 * re-run where its own choice was below) */
	snprintf(cmd, sizeof cmd, "env -u OPENBLAS_CORETYPE LOOM_GEMM=openblas %s bench gemm --threads 1 --size 32 "
	         "--seconds 0.01", test_loom_bin());
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 60), 0);
	char *core = strstr(out, "OpenBLAS sgemm (core ");
	CHECK(core != NULL);
	char name[32] = "";
	sscanf(core + strlen("OpenBLAS sgemm (core "), "%31[^)]", name);
	int want = loom_cpu()->isa == LOOM_ISA_AVX512 ? 3 : loom_cpu()->isa == LOOM_ISA_AVX2 ? 2 : 0;
	CHECK(loom_blas_core_tier(name) >= want);
	/* an unknown backend is an error naming the choices */
	snprintf(cmd, sizeof cmd, "LOOM_GEMM=mkl %s bench gemm --threads 1 --size 32 2>&1", test_loom_bin());
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 60), 2);
	CHECK_CONTAINS(out, "LOOM_GEMM=mkl: expected onednn (the default) or openblas");
	return 0;
}

/* Each loop's FLOP/s within what its unit can physically do on one core: at most 2 FMA pipes of its
 * width at 6 GHz (no x86 core sustains more), at least 0.5 GFLOP/s (a loaded or sanitized run is
 * slower, never by 100x). A loop the CPU cannot run reports 0. */
TEST(cpu_peak_within_bounds)
{
	const loom_cpu_t *cpu = loom_cpu();
	static const double lanes[] = {4, 8, 16};
	for (int isa = LOOM_ISA_SCALAR; isa <= LOOM_ISA_AVX512; isa++) {
		double f = loom_fma_loop_flops((loom_isa_t)isa, 0.1);
		if (isa > (int)cpu->isa) {
			CHECK(f == 0.0);
			continue;
		}
		printf("  %s loop: %.1f GFLOP/s\n", loom_isa_name((loom_isa_t)isa), f / 1e9);
		CHECK(f >= 0.5e9);
		CHECK(f <= lanes[isa] * 2 * 2 * 6e9);
	}
	double bf = loom_bf16_dot_peak_flops(1, 0.1);
	if (cpu->avx512_bf16) {
		CHECK(bf >= 0.5e9);
		CHECK(bf <= 16 * 4 * 2 * 6e9);
	} else {
		CHECK(bf == 0.0);
	}
	/* the hardware peak MFU uses is the widest loop's, with its source named */
	const char *src = NULL;
	double hw = loom_hw_peak_flops(LOOM_COMPUTE_FP32, 1, &src);
	CHECK(hw >= 0.5e9 && hw <= 16 * 2 * 2 * 6e9);
	CHECK_CONTAINS(src, loom_isa_name(cpu->isa));
	CHECK_CONTAINS(src, "measured");
	return 0;
}
