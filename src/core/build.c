/* build.c: what this library was built with (loom_build_info): MPI or not, the -march and the vector
 * extensions it let the compiler use, the optimization and extra flags, the sanitizer, and the
 * versions of MPI, oneDNN and PCRE2 as those libraries report them at run time (the library that
 * is loaded, not the header that was compiled against).
 *
 * The Makefile passes LOOM_BUILD_ARCH, LOOM_BUILD_OPT, LOOM_BUILD_SANITIZER and LOOM_BUILD_CFLAGS
 * when it compiles this file; they are part of the configuration its stamp tracks, so this file is
 * rebuilt whenever they change and what it reports is the build's. The struct is filled once
 * (pthread_once), so the calls are thread-safe. None of the version calls initializes its library:
 * MPI_Get_library_version may be called before MPI_Init. */
#include <dnnl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#ifdef LOOM_HAVE_MPI
#include <mpi.h>
#endif

#include "loom/util.h"

#ifndef LOOM_BUILD_ARCH
#define LOOM_BUILD_ARCH "unknown"
#endif
#ifndef LOOM_BUILD_OPT
#define LOOM_BUILD_OPT ""
#endif
#ifndef LOOM_BUILD_SANITIZER
#define LOOM_BUILD_SANITIZER ""
#endif
#ifndef LOOM_BUILD_CFLAGS
#define LOOM_BUILD_CFLAGS ""
#endif

/* What -march allowed everywhere, from the compiler's predefined macros. */
#if defined(__AVX512F__)
#define ISA_BASE "AVX-512 F"
#elif defined(__AVX2__)
#define ISA_BASE "AVX2"
#elif defined(__AVX__)
#define ISA_BASE "AVX"
#else
#define ISA_BASE "SSE2"
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__)
#define ISA_BW "/BW"
#else
#define ISA_BW ""
#endif
#if defined(__AVX512F__) && defined(__AVX512VL__)
#define ISA_VL "/VL"
#else
#define ISA_VL ""
#endif
#if defined(__AVX512F__) && defined(__AVX512DQ__)
#define ISA_DQ "/DQ"
#else
#define ISA_DQ ""
#endif
#if defined(__AVX512F__) && defined(__AVX512VNNI__)
#define ISA_VNNI ", VNNI"
#else
#define ISA_VNNI ""
#endif
#if defined(__AVX512F__) && defined(__AVX512BF16__)
#define ISA_BF16 ", BF16"
#else
#define ISA_BF16 ""
#endif
#if !defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__)
#define ISA_FMA " + FMA"
#else
#define ISA_FMA ""
#endif

static loom_build_info_t info;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static const char *runtime_name(unsigned r)
{
	return r == DNNL_RUNTIME_OMP ? "OpenMP" : r == DNNL_RUNTIME_TBB ? "TBB" : r == DNNL_RUNTIME_SEQ ? "sequential"
	       : r == DNNL_RUNTIME_THREADPOOL ? "threadpool" : "unknown runtime";
}

static void fill(void)
{
	const dnnl_version_t *dv = dnnl_version();
	char pv[64] = "";
	uint32_t jit = 0;
#ifdef LOOM_HAVE_MPI
	char mv[MPI_MAX_LIBRARY_VERSION_STRING] = "";
	int len = 0;
	info.mpi = 1;
	if (MPI_Get_library_version(mv, &len) == MPI_SUCCESS) {
		mv[strcspn(mv, ",\n")] = '\0'; /* "Open MPI v4.1.4, package: ..., ident: ..." */
		snprintf(info.mpi_library, sizeof info.mpi_library, "%.*s", (int)sizeof info.mpi_library - 1, mv);
	} else {
		snprintf(info.mpi_library, sizeof info.mpi_library, "MPI %d.%d (library version unknown)", MPI_VERSION,
		         MPI_SUBVERSION);
	}
#endif
	if (dv)
		snprintf(info.onednn, sizeof info.onednn, "%d.%d.%d, %s", dv->major, dv->minor, dv->patch,
		         runtime_name(dv->cpu_runtime));
	else
		snprintf(info.onednn, sizeof info.onednn, "unknown");
	if (pcre2_config(PCRE2_CONFIG_VERSION, pv) < 0)
		snprintf(pv, sizeof pv, "unknown");
	(void)pcre2_config(PCRE2_CONFIG_JIT, &jit);
	snprintf(info.pcre2, sizeof info.pcre2, "%.40s%s", pv, jit ? " + JIT" : "");
	info.arch = LOOM_BUILD_ARCH;
	info.isa = ISA_BASE ISA_BW ISA_VL ISA_DQ ISA_VNNI ISA_BF16 ISA_FMA;
	info.opt = LOOM_BUILD_OPT;
	info.cflags = LOOM_BUILD_CFLAGS;
	info.sanitizer = LOOM_BUILD_SANITIZER;
#ifdef __clang__
	info.compiler = "clang " __clang_version__;
#else
	info.compiler = "gcc " __VERSION__;
#endif
}

const loom_build_info_t *loom_build_info(void)
{
	pthread_once(&once, fill);
	return &info;
}

void loom_build_info_print(FILE *f, const char *prefix)
{
	const loom_build_info_t *b = loom_build_info();
	const char *p = prefix ? prefix : "";
	if (b->mpi)
		fprintf(f, "%smpi: yes, %s (a job may span hosts)\n", p, b->mpi_library);
	else
		fprintf(f, "%smpi: no (a job stays on one host; to span hosts, install libopenmpi-dev and run make "
		        "again: it rebuilds with MPI)\n", p);
	fprintf(f, "%sonednn: %s\n", p, b->onednn);
	fprintf(f, "%spcre2: %s\n", p, b->pcre2);
	fprintf(f, "%sarch: %s (compiled for %s)\n", p, b->arch, b->isa);
	fprintf(f, "%scompiler: %s, %s%s%s\n", p, b->compiler, b->opt, b->cflags[0] ? ", CFLAGS " : "", b->cflags);
	fprintf(f, "%ssanitizer: %s\n", p, b->sanitizer[0] ? b->sanitizer : "none");
}
