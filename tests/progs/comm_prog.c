/* comm_prog.c: a rank program for tests that start jobs with a real launcher (mpirun, loom run):
 * joins the job from the environment, checks an all-reduce, a broadcast and a sub-group split, and
 * prints "rank R of N: ok" (exit 0) or what went wrong (exit 1).
 * COMM_PROG_EXIT="R:before" makes rank R exit 0 before loom_comm_init, "R:after" right after it
 * (without loom_comm_destroy); "R:fail" exit 3 before init, "R:fail-after" exit 3 right after it;
 * "R:kill": every rank all-reduces in a loop (up to 2000 times) and rank R is killed by SIGKILL
 * inside one, 30 ms in, by a thread of its own. The others then report the time their failing call
 * took ("... failed after S s"). COMM_PROG_HOLD=S: every rank sleeps S seconds after joining. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "loom/comm.h"

static double t0;

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* This process's rank from the launcher's environment (before loom_comm_init), -1 if none. */
static int env_rank(void)
{
	const char *v = getenv("RANK");
	if (!v)
		v = getenv("OMPI_COMM_WORLD_RANK");
	if (!v)
		v = getenv("SLURM_PROCID");
	return v ? atoi(v) : -1;
}

static void *kill_me(void *arg)
{
	(void)arg;
	usleep(30000);
	kill(getpid(), SIGKILL);
	return NULL;
}

static int fail(const char *what, int rc, loom_comm_t *c)
{
	fprintf(stderr, "%s failed after %.2f s: %s: %s\n", what, now_s() - t0, loom_strerror(rc),
	        c ? loom_comm_errmsg(c) : loom_errmsg());
	return 1;
}

int main(void)
{
	loom_comm_t *c, *sub;
	int rc, rank, n;
	enum { N = 100003 };
	float *x = malloc(N * sizeof *x);
	double b;
	const char *ex = getenv("COMM_PROG_EXIT"), *how = ex && strchr(ex, ':') ? strchr(ex, ':') + 1 : "";
	int exit_rank = ex ? atoi(ex) : -1, me = env_rank();
	if (!x)
		return 1;
	t0 = now_s();
	if (me == exit_rank && (strcmp(how, "before") == 0 || strcmp(how, "fail") == 0)) {
		free(x); /* (LeakSanitizer would turn the exit into a failure) */
		return strcmp(how, "before") == 0 ? 0 : 3;
	}
	if ((rc = loom_comm_init(&c)) != LOOM_OK)
		return fail("loom_comm_init", rc, NULL);
	if (me == exit_rank && strcmp(how, "after") == 0)
		_Exit(0);
	if (me == exit_rank && strcmp(how, "fail-after") == 0)
		_Exit(3);
	if (getenv("COMM_PROG_HOLD"))
		usleep((useconds_t)(atof(getenv("COMM_PROG_HOLD")) * 1e6));
	t0 = now_s();
	rank = loom_comm_rank(c), n = loom_comm_size(c);
	if (strcmp(how, "kill") == 0) {
		pthread_t t;
		if (rank == exit_rank && pthread_create(&t, NULL, kill_me, NULL) != 0)
			return 1;
		for (int it = 0; it < 2000; it++) {
			t0 = now_s();
			if ((rc = loom_allreduce(c, x, x, N, LOOM_FLOAT32, LOOM_SUM)) != LOOM_OK)
				return fail("allreduce", rc, c);
		}
		fprintf(stderr, "rank %d: 2000 all-reduces and rank %d is still alive\n", rank, exit_rank);
		return 1;
	}
	for (int i = 0; i < N; i++)
		x[i] = (float)(i % 13 + rank);
	if ((rc = loom_allreduce(c, x, x, N, LOOM_FLOAT32, LOOM_SUM)) != LOOM_OK)
		return fail("allreduce", rc, c);
	for (int i = 0; i < N; i++) {
		float want = (float)(n * (i % 13) + n * (n - 1) / 2);
		if (x[i] != want) {
			fprintf(stderr, "rank %d: x[%d] = %g, expected %g\n", rank, i, x[i], want);
			return 1;
		}
	}
	b = rank == n - 1 ? 2.5 : 0;
	if ((rc = loom_broadcast(c, &b, 1, LOOM_FLOAT64, n - 1)) != LOOM_OK)
		return fail("broadcast", rc, c);
	if (b != 2.5) {
		fprintf(stderr, "rank %d: broadcast gave %g\n", rank, b);
		return 1;
	}
	if ((rc = loom_comm_split(c, rank % 2, -rank, &sub)) != LOOM_OK)
		return fail("split", rc, c);
	if ((rc = loom_barrier(sub)) != LOOM_OK)
		return fail("barrier", rc, sub);
	loom_comm_destroy(sub);
	loom_comm_destroy(c);
	free(x);
	printf("rank %d of %d: ok\n", rank, n);
	return 0;
}
