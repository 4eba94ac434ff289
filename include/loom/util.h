/* loom/util.h: the small helpers a program built on loom (and loom's own CLI) needs besides the
 * modules: a monotonic clock, 64-byte aligned buffers, and what this library is (its version, the
 * tree it was built from and the options it was built with). Thread-safe. */
#ifndef LOOM_UTIL_H
#define LOOM_UTIL_H

#include <stddef.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Monotonic clock in seconds (CLOCK_MONOTONIC; only differences are meaningful). */
double loom_now(void);

/* 64-byte aligned, zero-filled allocation of `bytes` (at least 1); NULL when out of memory. The
 * caller owns it; free it with loom_free_aligned (or free()). */
void *loom_alloc_aligned(size_t bytes);
void loom_free_aligned(void *p);
/* Like loom_alloc_aligned, but not zero-filled: for a buffer the caller overwrites whole before
 * reading it (parameters being loaded), so that its pages are faulted in once, by the writes that
 * fill it and on the threads that write, instead of by a zeroing pass first. Free it with
 * loom_free_aligned (or free()). */
void *loom_alloc_uninit(size_t bytes);

/* The library's version, and `git describe --always --dirty` of the tree it was built from
 * ("unknown" outside a git checkout). Static strings. */
#define LOOM_VERSION "0.4.0"
const char *loom_version(void);
const char *loom_git_describe(void);

/* The options this library was built with (the Makefile's: `make MPI=0`, ARCH, SANITIZER, OPT,
 * CFLAGS on its command line) and the versions of the libraries it runs with, read from their own
 * version calls at run time. */
typedef struct {
	int mpi;                /* 1: built with MPI (LOOM_HAVE_MPI), so a job may span hosts */
	char mpi_library[96];   /* MPI_Get_library_version's first clause ("Open MPI v4.1.4"); "" without MPI */
	char onednn[64];        /* dnnl_version(): "2.6.3" and its CPU threading runtime ("2.6.3, OpenMP") */
	char pcre2[64];         /* pcre2_config(PCRE2_CONFIG_VERSION), "+ JIT" when it has one ("10.42 2022-12-11 + JIT") */
	const char *arch;       /* the -march it was compiled for: "native", "x86-64-v3", ... */
	const char *isa;        /* the vector extensions that -march let the compiler use everywhere:
	                         * "AVX-512 F/BW/VL/DQ, VNNI, BF16", "AVX2 + FMA", "SSE2" (the kernels that
	                         * choose by the CPU at run time, loom/cpu.h, may use more) */
	const char *opt;        /* the optimization flags (OPT): "-O2" */
	const char *cflags;     /* CPPFLAGS and CFLAGS given on make's command line, "" when none */
	const char *sanitizer;  /* "address,undefined", "" when none */
	const char *compiler;   /* the compiler and its version: "gcc 12.2.0" */
} loom_build_info_t;

/* This library's build, filled on the first call (a static struct; never NULL). */
const loom_build_info_t *loom_build_info(void);
/* loom_build_info() as lines "NAME: VALUE" (mpi, onednn, pcre2, arch, compiler, sanitizer), each line
 * starting with `prefix` (may be NULL), into f; `loom --version` and `loom bench gemm` print them. */
void loom_build_info_print(FILE *f, const char *prefix);

#ifdef __cplusplus
}
#endif
#endif
