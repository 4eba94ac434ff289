/* launch_allreduce_die.c: the death test's rank (tests/test_launcher.c, run under `loom run`).
 * usage: launch_allreduce_die [VICTIM [ITERS [COUNT]]]
 * Every rank all-reduces COUNT floats (default 65536) in a loop; rank VICTIM (default 1) raises
 * SIGKILL after ITERS iterations (default 20). A survivor prints
 *   "allreduce <i> failed after <s> s: <code name> (<code>): <detail>"
 * where <s> is the time since that call started (an upper bound on how long the death took to be
 * noticed), and exits 0 when the error is LOOM_EPEERLOST within 2 s, 1 otherwise. The survivors
 * ignore the launcher's SIGTERM (they only note it) so that the collective's own detection is what
 * ends them; the launcher's SIGKILL after its grace period still would. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "loom/comm.h"

static volatile sig_atomic_t got_term;

static void on_term(int sig)
{
	(void)sig;
	got_term = 1;
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv)
{
	int victim = argc > 1 ? atoi(argv[1]) : 1, iters = argc > 2 ? atoi(argv[2]) : 20;
	size_t count = argc > 3 ? (size_t)atol(argv[3]) : 65536;
	loom_comm_t *c = NULL;
	float *buf;
	int rc, rank;
	setvbuf(stdout, NULL, _IOLBF, 0);
	signal(SIGTERM, on_term);
	if ((rc = loom_comm_init(&c)) != LOOM_OK) {
		printf("loom_comm_init failed: %s: %s\n", loom_strerror(rc), loom_errmsg());
		return 1;
	}
	rank = loom_comm_rank(c);
	if (!(buf = malloc(count * sizeof *buf)))
		return 1;
	for (int i = 0;; i++) {
		double t0;
		for (size_t k = 0; k < count; k++)
			buf[k] = (float)(rank + 1);
		if (rank == victim && i == iters) {
			printf("raising SIGKILL in iteration %d\n", i);
			raise(SIGKILL);
		}
		t0 = now_s();
		rc = loom_allreduce(c, buf, buf, count, LOOM_FLOAT32, LOOM_SUM);
		if (rc != LOOM_OK) {
			double dt = now_s() - t0;
			printf("allreduce %d failed after %.3f s: %s (%d): %s%s\n", i, dt,
			       rc == LOOM_EPEERLOST ? "LOOM_EPEERLOST" : "other error", rc, loom_comm_errmsg(c),
			       got_term ? " [SIGTERM from the launcher noted]" : "");
			loom_comm_destroy(c);
			free(buf);
			return rc == LOOM_EPEERLOST && dt < 2.0 ? 0 : 1;
		}
		int n = loom_comm_size(c);
		if (buf[0] != (float)(n * (n + 1) / 2)) {
			printf("allreduce %d: wrong sum %g (expected %d)\n", i, buf[0], n * (n + 1) / 2);
			return 1;
		}
		if (i > iters + 100000) {
			printf("no failure after %d iterations\n", i);
			return 1;
		}
	}
}
