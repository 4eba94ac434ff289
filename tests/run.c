/* run.c: the test runner. `run` runs every test, each in a forked child under a timeout;
 * `run NAME...` runs the named ones (in-process when a single name is given, for gdb; --fork to
 * keep the child). Each forked test's line gives its wall and CPU time (its processes' user + system).
 * Last line: "N passed, N failed" (then ", N skipped" when a test
 * skipped: TEST_SKIP, for tests that cannot run here, each with a one-line reason). Also the multi-rank harness from test.h. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "loom/data.h"
#include "test.h"

#define X(name) int test_##name(void);
#include "list.h"
#undef X

static const struct {
	const char *name;
	int (*fn)(void);
} tests[] = {
#define X(name) {#name, test_##name},
#include "list.h"
#undef X
};

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static double timeout_scale(void)
{
	const char *s = getenv("LOOM_TEST_TIMEOUT_SCALE");
	double v = s ? atof(s) : 1.0;
	return v > 0 ? v : 1.0;
}

/* How overloaded the machine is: the 1-minute load average per online core, at least 1, at most 8
 * (a shared 2-core machine running several test suites reaches 3-4). Timeouts of multi-process tests
 * stretch by it, so a test that needs 30 s alone does not fail at 60 s when it gets a third of a
 * core; a genuine hang still ends, just later. */
static double load_factor(void)
{
	double l[1];
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	if (getloadavg(l, 1) != 1 || n < 1)
		return 1;
	l[0] /= (double)n;
	return l[0] < 1 ? 1 : l[0] > 8 ? 8 : l[0];
}

/* A timeout that stretches with the load: expired() re-reads the load once a second and keeps the
 * highest factor seen since start. */
typedef struct {
	double start, base_s, factor, next_check;
} test_deadline_t;

static void deadline_init(test_deadline_t *d, double timeout_s)
{
	d->start = now_s();
	d->base_s = timeout_s * timeout_scale();
	d->factor = load_factor();
	d->next_check = d->start + 1;
}

static double deadline_limit(const test_deadline_t *d)
{
	return d->base_s * d->factor;
}

static int deadline_expired(test_deadline_t *d)
{
	double now = now_s();
	if (now >= d->next_check) {
		double f = load_factor();
		if (f > d->factor)
			d->factor = f;
		d->next_check = now + 1;
	}
	return now - d->start > deadline_limit(d);
}

static void describe_status(int st, char *buf, size_t cap)
{
	if (WIFEXITED(st))
		snprintf(buf, cap, "exit code %d", WEXITSTATUS(st));
	else if (WIFSIGNALED(st))
		snprintf(buf, cap, "signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
	else
		snprintf(buf, cap, "status %d", st);
}

/* ---- multi-rank harness ---- */

static char last_job[64];
static unsigned job_counter;

const char *test_last_job_id(void)
{
	return last_job;
}

const char *test_loom_bin(void)
{
	const char *b = getenv("LOOM_BIN");
	return b && *b ? b : "build/loom";
}

const char *test_prog_dir(void)
{
	const char *b = getenv("LOOM_TEST_BIN");
	return b && *b ? b : "build/tests";
}

static int leftover_segments(const char *job)
{
	char prefix[96];
	int n = 0;
	DIR *d = opendir("/dev/shm");
	struct dirent *e;
	snprintf(prefix, sizeof prefix, "loom-%s@", job);
	if (!d)
		return 0;
	while ((e = readdir(d))) {
		if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) {
			fprintf(stderr, "  shared-memory segment left behind: /dev/shm/%s\n", e->d_name);
			n++;
		}
	}
	closedir(d);
	return n;
}

int test_spawn(int nranks, test_rank_fn fn, void *arg, double timeout_s, const char *const *env)
{
	pid_t pids[256];
	int status[256], done[256], failed = 0, remaining = nranks;
	test_deadline_t deadline;
	if (nranks < 1 || nranks > 256)
		return 1;
	snprintf(last_job, sizeof last_job, "t%d-%u", (int)getpid(), ++job_counter);
	fflush(NULL);
	for (int r = 0; r < nranks; r++) {
		pid_t p = fork();
		if (p < 0) {
			perror("fork");
			for (int k = 0; k < r; k++)
				kill(pids[k], SIGKILL);
			return 1;
		}
		if (p == 0) {
			char v[32];
			snprintf(v, sizeof v, "%d", r), setenv("RANK", v, 1), setenv("LOCAL_RANK", v, 1);
			snprintf(v, sizeof v, "%d", nranks), setenv("WORLD_SIZE", v, 1), setenv("LOCAL_WORLD_SIZE", v, 1);
			setenv("LOOM_JOB_ID", last_job, 1);
			setenv("MASTER_ADDR", "127.0.0.1", 1);
			setenv("MASTER_PORT", "29500", 1);
			for (int k = 0; env && env[k]; k++)
				putenv((char *)env[k]);
			int rc = fn(r, nranks, arg);
			fflush(NULL);
			exit(rc == 0 ? 0 : 1);
		}
		pids[r] = p;
		done[r] = 0;
	}
	deadline_init(&deadline, timeout_s);
	while (remaining > 0) {
		int st;
		pid_t p = waitpid(-1, &st, WNOHANG);
		if (p > 0) {
			for (int r = 0; r < nranks; r++) {
				if (pids[r] == p && !done[r]) {
					done[r] = 1, status[r] = st, remaining--;
				}
			}
			continue;
		}
		if (p < 0 && errno != EINTR && errno != ECHILD)
			break;
		if (deadline_expired(&deadline)) {
			fprintf(stderr,
			        "  multi-rank test timed out after %.0f s (%.0f s x LOOM_TEST_TIMEOUT_SCALE %.3g x load %.2f); "
			        "ranks still running:",
			        deadline_limit(&deadline), timeout_s, timeout_scale(), deadline.factor);
			for (int r = 0; r < nranks; r++)
				if (!done[r])
					fprintf(stderr, " %d", r);
			fputc('\n', stderr);
			for (int r = 0; r < nranks; r++)
				if (!done[r])
					kill(pids[r], SIGKILL);
			for (int r = 0; r < nranks; r++)
				if (!done[r])
					waitpid(pids[r], &status[r], 0), done[r] = 1;
			failed = 1;
			remaining = 0;
			break;
		}
		usleep(2000);
	}
	for (int r = 0; r < nranks; r++) {
		if (!(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0)) {
			char d[96];
			describe_status(status[r], d, sizeof d);
			fprintf(stderr, "  rank %d of %d failed: %s\n", r, nranks, d);
			failed = 1;
		}
	}
	if (leftover_segments(last_job))
		failed = 1;
	return failed;
}

int test_run_cmd(const char *cmd, char *out, size_t cap, double timeout_s)
{
	int fds[2], st = 0;
	size_t len = 0;
	pid_t p;
	test_deadline_t deadline;
	if (pipe(fds) != 0)
		return -1;
	fflush(NULL);
	p = fork();
	if (p < 0)
		return -1;
	if (p == 0) {
		setpgid(0, 0);
		dup2(fds[1], 1), dup2(fds[1], 2);
		close(fds[0]), close(fds[1]);
		execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
		_exit(127);
	}
	close(fds[1]);
	fcntl(fds[0], F_SETFL, O_NONBLOCK);
	deadline_init(&deadline, timeout_s);
	for (;;) {
		char tmp[4096];
		ssize_t n = read(fds[0], tmp, sizeof tmp);
		if (n > 0) {
			size_t k = (size_t)n;
			if (out && len + 1 < cap) {
				if (k > cap - 1 - len)
					k = cap - 1 - len;
				memcpy(out + len, tmp, k);
				len += k;
			}
			continue;
		}
		if (n == 0)
			break;
		if (deadline_expired(&deadline)) {
			kill(-p, SIGKILL);
			waitpid(p, &st, 0);
			close(fds[0]);
			if (out && cap)
				out[len] = '\0';
			return -1;
		}
		usleep(2000);
	}
	close(fds[0]);
	waitpid(p, &st, 0);
	if (out && cap)
		out[len] = '\0';
	if (WIFEXITED(st))
		return WEXITSTATUS(st);
	return WIFSIGNALED(st) ? 128 + WTERMSIG(st) : -1;
}

const char *test_read_text(const char *path, char *buf, size_t cap)
{
	FILE *f = fopen(path, "rb");
	size_t n = f ? fread(buf, 1, cap - 1, f) : 0;
	if (f)
		fclose(f);
	buf[n] = 0;
	return buf;
}

int test_write_file(const char *path, const void *p, size_t n)
{
	FILE *f = fopen(path, "wb");
	if (!f)
		return 1;
	if (n && fwrite(p, 1, n, f) != n) {
		fclose(f);
		return 1;
	}
	return fclose(f) != 0;
}

int test_make_token_data(const char *dir, int vocab, int n)
{
	char path[4200];
	uint32_t *t = malloc((size_t)n * sizeof *t), x = 12345;
	int rc;
	if (!t)
		return LOOM_ENOMEM;
	for (int i = 0; i < n; i++) {
		x = x * 1664525u + 1013904223u;
		t[i] = (x >> 24) % 3 == 0 ? (x >> 8) % (uint32_t)vocab : (uint32_t)(i * 7 + i / 5) % (uint32_t)vocab;
	}
	snprintf(path, sizeof path, "%s/train_000000.bin", dir);
	if (vocab > LOOM_SHARD16_MAX_VOCAB) { /* as `loom data prepare` writes them: uint32 only when needed */
		rc = loom_shard_write32(path, t, (size_t)n);
	} else {
		uint16_t *t16 = (uint16_t *)t; /* narrowed in place, front to back */
		for (int i = 0; i < n; i++)
			t16[i] = (uint16_t)t[i];
		rc = loom_shard_write(path, t16, (size_t)n);
	}
	free(t);
	return rc;
}

int test_read_losses(const char *path, double *loss, int max, char lines[][160], double *val)
{
	FILE *f = fopen(path, "r");
	char line[8192];
	int n = 0;
	if (!f)
		return -1;
	while (fgets(line, sizeof line, f)) {
		long long step;
		double l;
		if (sscanf(line, "{\"step\":%lld,\"loss\":%lf", &step, &l) != 2 || step < 1 || step >= max)
			continue;
		loss[step] = l;
		const char *v = strstr(line, "\"val_loss\":"), *lr = strstr(line, ",\"lr\"");
		if (val && v)
			val[step] = atof(v + 11);
		if (lines && lr)
			snprintf(lines[step], 160, "%.*s", (int)(lr - line), line);
		n++;
	}
	fclose(f);
	return n;
}

int test_mkdtemp(char *path, size_t cap)
{
	const char *t = getenv("TMPDIR");
	snprintf(path, cap, "%s/loomtest-XXXXXX", t && *t ? t : "/tmp");
	return mkdtemp(path) ? 0 : 1;
}

void test_rmdir(const char *path)
{
	char cmd[4200];
	if (!path || !*path || strcmp(path, "/") == 0)
		return;
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
	if (system(cmd) != 0)
		fprintf(stderr, "  could not remove %s\n", path);
}

/* ---- runner ---- */

/* CPU seconds (user + system) of the last forked test and the processes it waited for: a test far
 * below its wall time waits (timeouts, sleeps, outages) rather than computes. */
static double last_cpu_s = -1;

static int run_forked(int i, double timeout_s)
{
	int st;
	pid_t p;
	struct rusage ru;
	test_deadline_t deadline;
	deadline_init(&deadline, timeout_s);
	fflush(NULL);
	p = fork();
	if (p == 0) {
		setpgid(0, 0);
		int rc = tests[i].fn();
		fflush(NULL);
		exit(rc == 0 || rc == TEST_SKIPPED ? rc : 1);
	}
	if (p < 0) {
		perror("fork");
		return 1;
	}
	last_cpu_s = -1;
	for (;;) {
		pid_t w = wait4(p, &st, WNOHANG, &ru);
		if (w == p) {
			last_cpu_s = (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_sec +
			             1e-6 * (double)ru.ru_stime.tv_usec;
			break;
		}
		if (deadline_expired(&deadline)) {
			fprintf(stderr, "  test %s timed out after %.0f s (load factor %.2f)\n", tests[i].name,
			        deadline_limit(&deadline), deadline.factor);
			kill(-p, SIGKILL);
			kill(p, SIGKILL);
			waitpid(p, &st, 0);
			return 1;
		}
		usleep(5000);
	}
	if (WIFEXITED(st) && (WEXITSTATUS(st) == 0 || WEXITSTATUS(st) == TEST_SKIPPED))
		return WEXITSTATUS(st);
	if (!(WIFEXITED(st) && WEXITSTATUS(st) == 1)) {
		char d[96];
		describe_status(st, d, sizeof d);
		fprintf(stderr, "  test %s died: %s\n", tests[i].name, d);
	}
	return 1;
}

const char *test_cluster_off(void)
{
	const char *e = getenv("LOOM_TEST_CLUSTER");
	return e && strcmp(e, "0") == 0 ? "LOOM_TEST_CLUSTER=0: the cluster tests run in CI's plain pass, not its sanitizer pass"
	                                : NULL;
}

int main(int argc, char **argv)
{
	int n = (int)(sizeof tests / sizeof tests[0]), passed = 0, failed = 0, skipped = 0, fork_mode = 1, nnames = 0;
	int list = 0, nfailed = 0;
	const char *names[512], *failed_names[64];
	double timeout_s = 600; /* scaled by LOOM_TEST_TIMEOUT_SCALE and the load (deadline_init) */
	for (int a = 1; a < argc; a++) {
		if (strcmp(argv[a], "--list") == 0)
			list = 1;
		else if (strcmp(argv[a], "--fork") == 0)
			fork_mode = 2;
		else if (nnames < 512)
			names[nnames++] = argv[a];
	}
	if (list) {
		for (int i = 0; i < n; i++)
			printf("%s\n", tests[i].name);
		return 0;
	}
	if (nnames == 1 && fork_mode != 2)
		fork_mode = 0;
	for (int k = 0; k < nnames; k++) {
		int found = 0;
		for (int i = 0; i < n; i++)
			found |= strcmp(tests[i].name, names[k]) == 0;
		if (!found) {
			fprintf(stderr, "no test named '%s' (run --list)\n", names[k]);
			failed++;
		}
	}
	for (int i = 0; i < n; i++) {
		int sel = nnames == 0, rc;
		double t0;
		for (int k = 0; k < nnames; k++)
			sel |= strcmp(tests[i].name, names[k]) == 0;
		if (!sel)
			continue;
		printf("[ RUN  ] %s\n", tests[i].name);
		fflush(stdout);
		t0 = now_s();
		rc = fork_mode ? run_forked(i, timeout_s) : tests[i].fn();
		if (fork_mode && last_cpu_s >= 0)
			printf("[ %s ] %s (%.2f s, cpu %.2f s)\n", rc == 0 ? " OK " : rc == TEST_SKIPPED ? "SKIP" : "FAIL",
			       tests[i].name, now_s() - t0, last_cpu_s);
		else
			printf("[ %s ] %s (%.2f s)\n", rc == 0 ? " OK " : rc == TEST_SKIPPED ? "SKIP" : "FAIL", tests[i].name,
			       now_s() - t0);
		fflush(stdout);
		if (rc == TEST_SKIPPED)
			skipped++;
		else if (rc == 0)
			passed++;
		else {
			failed++;
			if (nfailed < 64)
				failed_names[nfailed++] = tests[i].name;
		}
	}
	/* the names again just above the summary, so that the tail of a long log says which ones */
	for (int k = 0; k < nfailed; k++)
		printf("[ FAIL ] %s\n", failed_names[k]);
	if (skipped)
		printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
	else
		printf("%d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
