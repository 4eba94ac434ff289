/* test_comm_root.c: broadcasts and reduces whose ranks disagree on the root (issue 23), small and
 * large (also from loom_comm_alloc: single-copy), 2-5 ranks, with and without LOOM_DEBUG, followed by loom_comm_destroy, the same call again
 * or an all-reduce. Every rank must fail, at the latest at its destroy (at a call that waits for a
 * peer, or at destroy: a rank that waits for nobody, such as an eager broadcast's root, is not
 * slowed down to find out sooner), with LOOM_EMISMATCH and a message naming the mismatched call on
 * both sides; quickly (not at the deadline). With LOOM_DEBUG the call itself fails on every rank and
 * the communicator stays usable. */
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "loom/comm.h"
#include "test.h"

enum { THEN_DESTROY, THEN_AGAIN, THEN_ALLREDUCE, THEN_KINDS };

typedef struct {
	int reduce;    /* 0 broadcast, 1 reduce */
	size_t count;  /* floats */
	int pattern;   /* 0: every rank its own root; 1: rank 0 says 0, the others 1 */
	int then;      /* THEN_* */
	int debug;
	int reg;       /* buffers from loom_comm_alloc (large ones then travel single-copy) */
} root_case_t;

static int call(loom_comm_t *c, const root_case_t *k, float *x, float *y, int root)
{
	if (k->reduce)
		return loom_reduce(c, x, y, k->count, LOOM_FLOAT32, LOOM_SUM, root);
	return loom_broadcast(c, x, k->count, LOOM_FLOAT32, root);
}

static int count_of(const char *s, const char *sub)
{
	int n = 0;
	for (const char *p = s; (p = strstr(p, sub)) != NULL; p += strlen(sub))
		n++;
	return n;
}

/* The failure names the first call on both sides: "<kind> #1 (" twice and "mismatched". */
static int check_msg(const char *msg, const root_case_t *k)
{
	const char *kind = k->reduce ? "reduce #1 (" : "broadcast #1 (";
	CHECK_CONTAINS(msg, "mismatched collective calls");
	CHECK_MSG(count_of(msg, kind) >= 2, "expected both calls (\"%s\" twice) in: %s", kind, msg);
	return 0;
}

static int rank_root(int rank, int n, void *arg)
{
	const root_case_t *k = arg;
	loom_comm_t *c;
	float *x, *y;
	int root = k->pattern == 0 ? rank : rank == 0 ? 0 : 1, rc, rc2 = LOOM_OK;
	double t0;
	(void)n;
	CHECK_OK(loom_comm_init(&c));
	x = k->reg ? loom_comm_alloc(c, k->count * sizeof *x) : malloc(k->count * sizeof *x);
	y = k->reg ? loom_comm_alloc(c, k->count * sizeof *y) : malloc(k->count * sizeof *y);
	CHECK(x && y);
	for (size_t i = 0; i < k->count; i++)
		x[i] = (float)rank;
	t0 = loom_now();
	rc = call(c, k, x, y, root);
	if (k->debug) { /* every rank fails the call itself, nothing moved, the communicator is usable */
		CHECK_ERR(rc, LOOM_EMISMATCH);
		CHECK_CONTAINS(loom_comm_errmsg(c), "(LOOM_DEBUG)");
		CHECK(check_msg(loom_comm_errmsg(c), k) == 0);
		CHECK_OK(loom_allreduce(c, x, x, 1, LOOM_FLOAT32, LOOM_SUM));
		CHECK_OK(loom_comm_destroy(c));
		if (!k->reg)
			free(x), free(y);
		return 0;
	}
	CHECK_MSG(rc == LOOM_OK || rc == LOOM_EMISMATCH, "first call returned %d: %s", rc, loom_comm_errmsg(c));
	if (rc == LOOM_EMISMATCH) {
		CHECK(check_msg(loom_comm_errmsg(c), k) == 0);
		CHECK_OK(loom_comm_destroy(c)); /* already reported */
	} else if (k->then == THEN_DESTROY) {
		rc2 = loom_comm_destroy(c);
		CHECK_MSG(rc2 == LOOM_EMISMATCH, "rank %d: the mismatched call and destroy both returned LOOM_OK (%d)", rank,
		          rc2);
		CHECK(check_msg(loom_errmsg(), k) == 0);
	} else {
		/* A rank that waits for nobody in the next call (an eager broadcast's root) may learn of
		 * the mismatch only at its destroy. */
		rc2 = k->then == THEN_AGAIN ? call(c, k, x, y, root) : loom_allreduce(c, x, x, k->count, LOOM_FLOAT32, LOOM_SUM);
		CHECK_MSG(rc2 == LOOM_OK || rc2 == LOOM_EMISMATCH, "rank %d: the next call returned %d: %s", rank, rc2,
		          loom_comm_errmsg(c));
		if (rc2 == LOOM_EMISMATCH) {
			CHECK(check_msg(loom_comm_errmsg(c), k) == 0);
			CHECK_OK(loom_comm_destroy(c));
		} else {
			rc2 = loom_comm_destroy(c);
			CHECK_MSG(rc2 == LOOM_EMISMATCH, "rank %d: the mismatched call, the next one and destroy all returned "
			          "LOOM_OK (%d)", rank, rc2);
			CHECK(check_msg(loom_errmsg(), k) == 0);
		}
	}
	CHECK_MSG(loom_now() - t0 < 5, "rank %d: detection took %.2f s", rank, loom_now() - t0);
	if (!k->reg) /* loom_comm_alloc memory went with the job's last communicator */
		free(x), free(y);
	return 0;
}

static int run_cases(int debug)
{
	const char *env[] = {"LOOM_TIMEOUT_S=30", debug ? "LOOM_DEBUG=1" : NULL, NULL};
	for (int n = 2; n <= 5; n++)
		for (int red = 0; red < 2; red++)
			for (int big = 0; big < 3; big++) { /* 1000 floats, 3M, 3M from loom_comm_alloc */
				root_case_t k = {red, big ? (size_t)3 << 20 : 1000, (n + red + big / 2) % 2, (n + red + big) % THEN_KINDS,
				                 debug, big == 2};
				int rc = test_spawn(n, rank_root, &k, 60, env);
				CHECK_MSG(rc == 0, "%d ranks, %s of %zu floats%s, roots %s, then %s%s failed", n,
				          red ? "reduce" : "broadcast", k.count, k.reg ? " (loom_comm_alloc)" : "",
				          k.pattern ? "0 vs 1" : "each its own",
				          k.then == THEN_DESTROY ? "destroy" : k.then == THEN_AGAIN ? "the same call" : "allreduce",
				          debug ? " (LOOM_DEBUG)" : "");
			}
	return 0;
}

/* The case: two ranks, 1000 floats, roots 0 and 1, then destroy (and every other follow-up). */
TEST(comm_root_mismatch_pair)
{
	const char *env[] = {"LOOM_TIMEOUT_S=30", NULL};
	for (int red = 0; red < 2; red++)
		for (int then = 0; then < THEN_KINDS; then++) {
			root_case_t k = {red, 1000, 0, then, 0, 0};
			CHECK_MSG(test_spawn(2, rank_root, &k, 60, env) == 0, "%s, then %d failed", red ? "reduce" : "broadcast",
			          then);
		}
	return 0;
}

TEST(comm_root_mismatch)
{
	return run_cases(0);
}

TEST(comm_root_mismatch_debug)
{
	return run_cases(1);
}
