/* launch_rank.c: a rank for the launcher tests (tests/test_launcher.c); argv[1] picks what it does:
 *   env                 print the launcher's environment contract on one stdout line, "e<rank>" on stderr
 *   lines               print "out <rank>" on stdout and "err <rank>" on stderr
 *   streams             partial lines, '\r' progress lines, "\r\n" and a last line without '\n'
 *   exit R CODE         rank R exits with CODE; the others sleep 30 s
 *   signal R SIG        rank R raises SIG; the others sleep 30 s
 *   stubborn R CODE     like exit, but the others ignore SIGTERM
 *   grandchild DIR      every rank forks a child that writes DIR/gc.<rank> (its pid) and sleeps
 *                       60 s; then rank 1 exits 3 and the others sleep
 *   shm                 rank 0 creates /dev/shm/loom-$LOOM_JOB_ID@leftover and every rank exits 0
 *   interleave          3 times: write 4 letters ('A' + rank) without '\n', wait 0.25 s, 4 more and '\n'
 *   longline N          one stdout line of N 'x' (written in pieces of 1000), then "end"
 *   trap DIR [ignore]   on SIGTERM print "got signal 15" and exit 0 (with ignore: ignore SIGTERM);
 *                       then create DIR/ready.<rank> and sleep 30 s
 *   stop R              every rank all-reduces in a loop; rank R stops itself (SIGSTOP) after 5
 *   wedge R             like stop, but rank R sleeps 60 s outside any collective instead (a wedged
 *                       rank); the others fail at their LOOM_TIMEOUT_S and print the error
 *   norank0             rank 0 exits 0 at once; the others join the job and print
 *                       "init failed after S s: <code> <detail>", exiting 0 if S < 3 and the code is
 *                       LOOM_EPEERLOST
 * Sleeping ranks never finish on their own within a test's time, so a test that ends quickly shows
 * they were stopped. */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/util.h"
#include "loom/comm.h"

static const char *env(const char *name)
{
	const char *v = getenv(name);
	return v ? v : "(unset)";
}

static void nap(double s)
{
	usleep((useconds_t)(s * 1e6));
}

static void on_term(int sig)
{
	char msg[32];
	int n = snprintf(msg, sizeof msg, "got signal %d\n", sig);
	if (write(1, msg, (size_t)n) < 0)
		_exit(2);
	_exit(0);
}

static void write_file(const char *path, long v)
{
	FILE *f = fopen(path, "w");
	if (f)
		fprintf(f, "%ld\n", v), fclose(f);
}

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "";
	int rank = atoi(env("RANK"));
	char path[512];
	setvbuf(stdout, NULL, _IONBF, 0);
	if (strcmp(mode, "env") == 0) {
		printf("RANK=%s LOCAL_RANK=%s WORLD_SIZE=%s LOCAL_WORLD_SIZE=%s GROUP_RANK=%s MASTER_ADDR=%s "
		       "MASTER_PORT=%s OMP_NUM_THREADS=%s LOOM_JOB_ID=%s\n",
		       env("RANK"), env("LOCAL_RANK"), env("WORLD_SIZE"), env("LOCAL_WORLD_SIZE"), env("GROUP_RANK"),
		       env("MASTER_ADDR"), env("MASTER_PORT"), env("OMP_NUM_THREADS"), env("LOOM_JOB_ID"));
		fprintf(stderr, "e%d\n", rank);
		return 0;
	}
	if (strcmp(mode, "lines") == 0) {
		printf("out %d\n", rank);
		fprintf(stderr, "err %d\n", rank);
		return 0;
	}
	if (strcmp(mode, "streams") == 0) {
		printf("out\npart");
		nap(0.4); /* longer than the launcher's partial-line flush */
		printf("ial\n\r10%%\r20%%\rdone\ncrlf\r\nno newline at end");
		return 0;
	}
	if (strcmp(mode, "interleave") == 0) {
		char part[5];
		memset(part, 'A' + rank % 26, 4), part[4] = '\0';
		for (int k = 0; k < 3; k++) {
			printf("%s", part);
			nap(0.25);
			printf("%s\n", part);
		}
		return 0;
	}
	if (strcmp(mode, "longline") == 0 && argc > 2) {
		char piece[1000];
		memset(piece, 'x', sizeof piece);
		for (long left = atol(argv[2]); left > 0; left -= (long)sizeof piece)
			fwrite(piece, 1, left < (long)sizeof piece ? (size_t)left : sizeof piece, stdout);
		printf("\nend\n");
		return 0;
	}
	if ((strcmp(mode, "exit") == 0 || strcmp(mode, "signal") == 0 || strcmp(mode, "stubborn") == 0) && argc > 3) {
		if (rank == atoi(argv[2])) {
			nap(0.3); /* let the others start sleeping */
			fprintf(stderr, "rank %d: failing now\n", rank);
			if (strcmp(mode, "signal") == 0)
				raise(atoi(argv[3]));
			return atoi(argv[3]);
		}
		if (strcmp(mode, "stubborn") == 0)
			signal(SIGTERM, SIG_IGN);
		nap(30);
		return 0;
	}
	if (strcmp(mode, "grandchild") == 0 && argc > 2) {
		pid_t p = fork();
		if (p == 0) {
			snprintf(path, sizeof path, "%s/gc.%d", argv[2], rank);
			write_file(path, (long)getpid());
			nap(60);
			_exit(0);
		}
		nap(0.5);
		if (rank == 1)
			return 3;
		nap(30);
		return 0;
	}
	if (strcmp(mode, "shm") == 0) {
		if (rank == 0) {
			snprintf(path, sizeof path, "/dev/shm/loom-%s@leftover", env("LOOM_JOB_ID"));
			int fd = open(path, O_CREAT | O_WRONLY, 0600);
			if (fd < 0) {
				perror(path);
				return 1;
			}
			close(fd);
		}
		return 0;
	}
	if (strcmp(mode, "trap") == 0 && argc > 2) {
		signal(SIGTERM, argc > 3 && strcmp(argv[3], "ignore") == 0 ? SIG_IGN : on_term);
		snprintf(path, sizeof path, "%s/ready.%d", argv[2], rank);
		write_file(path, (long)getpid());
		nap(30);
		return 0;
	}
	if ((strcmp(mode, "stop") == 0 || strcmp(mode, "wedge") == 0) && argc > 2) {
		loom_comm_t *c;
		float x[1024] = {0};
		int rc;
		if (loom_comm_init(&c) != LOOM_OK) {
			fprintf(stderr, "init: %s\n", loom_errmsg());
			return 1;
		}
		for (int it = 0;; it++) {
			if (it == 5 && rank == atoi(argv[2])) {
				if (mode[0] == 's')
					raise(SIGSTOP);
				else
					nap(60);
			}
			if ((rc = loom_allreduce(c, x, x, 1024, LOOM_FLOAT32, LOOM_SUM)) != LOOM_OK) {
				fprintf(stderr, "allreduce %d failed: %s\n", it, loom_errmsg());
				return 1;
			}
		}
	}
	if (strcmp(mode, "norank0") == 0) {
		loom_comm_t *c;
		double t0;
		int rc;
		if (rank == 0)
			return 0;
		t0 = loom_now();
		rc = loom_comm_init(&c);
		printf("init failed after %.2f s: %d %s\n", loom_now() - t0, rc, loom_errmsg());
		return rc == LOOM_EPEERLOST && loom_now() - t0 < 3 ? 0 : 1;
	}
	fprintf(stderr, "launch_rank: unknown mode '%s'\n", mode);
	return 2;
}
