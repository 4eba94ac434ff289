/* test.h: loom's test macros and multi-rank harness.
 *
 * A test is `TEST(name) { ...; return 0; }` in any file under tests/; the Makefile collects every
 * TEST(...) at the start of a line into the runner's list. CHECK* macros print both sides of a failed
 * comparison with file and line and return 1 from the enclosing function, so helpers return int too. */
#ifndef LOOM_TEST_H
#define LOOM_TEST_H

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "loom/error.h"

#define TEST(name) int test_##name(void)

/* A test that cannot run here (not root, no network namespaces, built without MPI) returns
 * TEST_SKIP("one-line reason"): counted as skipped by the runner, never as passed. */
#define TEST_SKIPPED 77
#define TEST_SKIP(...) (printf("  skipped: "), printf(__VA_ARGS__), printf("\n"), fflush(stdout), TEST_SKIPPED)

#define TEST_FAIL_(...)                                                                          \
	do {                                                                                         \
		fprintf(stderr, "  %s:%d: ", __FILE__, __LINE__);                                        \
		fprintf(stderr, __VA_ARGS__);                                                            \
		fputc('\n', stderr);                                                                     \
		return 1;                                                                                \
	} while (0)

#define CHECK(cond)                                                                              \
	do {                                                                                         \
		if (!(cond))                                                                             \
			TEST_FAIL_("CHECK(%s) failed", #cond);                                               \
	} while (0)

#define CHECK_MSG(cond, ...)                                                                     \
	do {                                                                                         \
		if (!(cond)) {                                                                           \
			fprintf(stderr, "  %s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond);           \
			fprintf(stderr, __VA_ARGS__);                                                        \
			fputc('\n', stderr);                                                                 \
			return 1;                                                                            \
		}                                                                                        \
	} while (0)

#define CHECK_EQ(a, b)                                                                           \
	do {                                                                                         \
		long long a_ = (long long)(a), b_ = (long long)(b);                                      \
		if (a_ != b_)                                                                            \
			TEST_FAIL_("CHECK_EQ(%s, %s): %lld != %lld", #a, #b, a_, b_);                        \
	} while (0)

/* Exact floating-point equality (bit patterns of NaN aside). */
#define CHECK_FEQ(a, b)                                                                          \
	do {                                                                                         \
		double a_ = (double)(a), b_ = (double)(b);                                               \
		if (!(a_ == b_))                                                                         \
			TEST_FAIL_("CHECK_FEQ(%s, %s): %.17g != %.17g", #a, #b, a_, b_);                     \
	} while (0)

/* |a - b| <= tol */
#define CHECK_NEAR(a, b, tol)                                                                    \
	do {                                                                                         \
		double a_ = (double)(a), b_ = (double)(b), t_ = (double)(tol);                           \
		if (!(fabs(a_ - b_) <= t_))                                                              \
			TEST_FAIL_("CHECK_NEAR(%s, %s, %s): %.9g vs %.9g (diff %.3g > %.3g)", #a, #b, #tol, a_, \
			           b_, fabs(a_ - b_), t_);                                                   \
	} while (0)

#define CHECK_STREQ(a, b)                                                                        \
	do {                                                                                         \
		const char *a_ = (a), *b_ = (b);                                                         \
		if (strcmp(a_, b_) != 0)                                                                 \
			TEST_FAIL_("CHECK_STREQ(%s, %s): \"%s\" != \"%s\"", #a, #b, a_, b_);                 \
	} while (0)

/* `needle` occurs in `hay`. */
#define CHECK_CONTAINS(hay, needle)                                                              \
	do {                                                                                         \
		const char *h_ = (hay), *n_ = (needle);                                                  \
		if (!strstr(h_, n_))                                                                     \
			TEST_FAIL_("CHECK_CONTAINS(%s, %s): \"%s\" not found in \"%s\"", #hay, #needle, n_, h_); \
	} while (0)

/* A loom call returns LOOM_OK; otherwise print its code and detail. */
#define CHECK_OK(expr)                                                                           \
	do {                                                                                         \
		int rc_ = (expr);                                                                        \
		if (rc_ != LOOM_OK)                                                                      \
			TEST_FAIL_("%s returned %d (%s): %s", #expr, rc_, loom_strerror(rc_), loom_errmsg()); \
	} while (0)

/* A loom call fails with exactly `code`. */
#define CHECK_ERR(expr, code)                                                                    \
	do {                                                                                         \
		int rc_ = (expr);                                                                        \
		if (rc_ != (code))                                                                       \
			TEST_FAIL_("%s returned %d (%s), expected %d (%s)", #expr, rc_, loom_strerror(rc_),   \
			           (int)(code), loom_strerror(code));                                        \
	} while (0)

/* ---- multi-rank harness ------------------------------------------------------------------ */

/* Body of one rank: return 0 on success. */
typedef int (*test_rank_fn)(int rank, int nranks, void *arg);

/* Fork `nranks` processes that form one job (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE and a
 * fresh LOOM_JOB_ID in their environment), run fn in each, and wait at most timeout_s seconds
 * (scaled by LOOM_TEST_TIMEOUT_SCALE, e.g. under sanitizers, and by the machine's load: the 1-minute
 * load average per core when above 1, at most 8, re-read while waiting). On timeout every rank is
 * killed.
 * Returns 0 when every rank exited 0 and no /dev/shm/loom-<job>* segment was left behind; otherwise
 * prints which ranks failed and how, and returns 1. Extra environment for the ranks can be given
 * as "NAME=VALUE" strings in env (NULL-terminated, or NULL). */
int test_spawn(int nranks, test_rank_fn fn, void *arg, double timeout_s, const char *const *env);

/* Job id used by the most recent test_spawn (for tests that look for leftovers themselves). */
const char *test_last_job_id(void);

/* Path of the loom binary under test (LOOM_BIN, default build/loom). */
const char *test_loom_bin(void);

/* Directory of the helper programs built from tests/progs/ (LOOM_TEST_BIN, default build/tests). */
const char *test_prog_dir(void);

/* Run a shell command, capture up to cap-1 bytes of its combined stdout+stderr into out, wait at
 * most timeout_s (scaled like test_spawn's); returns the exit status (128+signal when killed, -1 on timeout). */
int test_run_cmd(const char *cmd, char *out, size_t cap, double timeout_s);
/* Run cmd (test_run_cmd into the array out); fail the test, printing its output, unless it exits 0. */
#define RUN_OK(cmd, out, timeout)                                                                    \
	do {                                                                                             \
		int st_ = test_run_cmd(cmd, out, sizeof out, timeout);                                       \
		CHECK_MSG(st_ == 0, "`%s` exited %d:\n%s", cmd, st_, out);                                   \
	} while (0)

/* 1 in a build under AddressSanitizer, whose shadow memory and quarantine are in every resident set
 * (tests of memory figures check less there). */
#if defined(__SANITIZE_ADDRESS__)
#define TEST_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TEST_UNDER_ASAN 1
#endif
#endif
#ifndef TEST_UNDER_ASAN
#define TEST_UNDER_ASAN 0
#endif

/* NULL, or why the network-namespace cluster tests (multinode_*, elastic_*) are off: LOOM_TEST_CLUSTER=0,
 * which CI's sanitizer pass sets (.ci/run: those tests spend their minutes in outages and timeouts, and
 * run in the plain pass). */
const char *test_cluster_off(void);

/* Write n bytes to path (created or truncated); 0 on success, 1 on any failure. */
int test_write_file(const char *path, const void *p, size_t n);
/* The file's first cap-1 bytes as a string in buf ("" when it cannot be read); returns buf. */
const char *test_read_text(const char *path, char *buf, size_t cap);

/* DIR/train_000000.bin: n text-like tokens below vocab (a fixed mix of noise and structure, so a
 * model's loss moves). LOOM_OK or the shard writer's error. */
int test_make_token_data(const char *dir, int vocab, int n);
/* The step lines of a JSONL training log: loss[step] for 1 <= step < max, with lines (may be NULL)
 * each step line up to its "lr" field (step and loss as written, for bit-exact comparison) and val
 * (may be NULL) the validation losses of the steps that have one. Returns the step lines read, or
 * -1 when the file cannot be opened. */
int test_read_losses(const char *path, double *loss, int max, char lines[][160], double *val);

/* A fresh empty temporary directory (under $TMPDIR or /tmp), removed by test_rmdir. */
int test_mkdtemp(char *path, size_t cap);
void test_rmdir(const char *path);

#endif
