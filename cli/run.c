/* run.c: `loom run`, the launcher: starts N ranks of a program as one job with torchrun's
 * environment contract, prefixes their output, and stops the job when a rank fails.
 *
 * Invariants: every rank is its own process-group leader (so signals reach its children too) and
 * dies with loom run (PR_SET_PDEATHSIG). Signals reach us through a self-pipe, since libraries
 * linked into `loom` may start threads that receive them; the supervisor loop is a poll() over that
 * pipe and the ranks' output pipes. A rank is "done" when waitpid reports it, not when its pipes
 * close (its children may hold them). The first rank that exits non-zero or dies of a signal is the
 * job's failure: the others get SIGTERM, then SIGKILL after LOOM_KILL_GRACE_S (default 5) seconds.
 * SIGINT/SIGTERM/SIGHUP sent to loom run go to every rank the same way (a second one: SIGKILL).
 * Once every rank is gone, /dev/shm/loom-<LOOM_JOB_ID>@* files left behind are removed ('@' cannot
 * occur in a job id, so another job whose id starts with ours keeps its files). loom's own segments
 * never have a name there (comm/transport/shm_rdv.c); this is for programs on an older loom.
 * Exit code: 0 when every rank exited 0; 1 when one failed; 2 for bad usage; 126/127 when the
 * program cannot be executed; killed by the same signal when loom run was interrupted. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "loom/limits.h"
#include "run_opts.h"
#include "run_output.h"

typedef struct {
	pid_t pid;
	int done, status;
	double stopped_at; /* when waitpid reported it stopped (SIGSTOP...), 0 while it runs */
	int hung;          /* the job's failure is this rank not progressing: why says how we know */
	int blames;        /* the rank this one reported as holding it up (loom_xp_report_suspect), or -1 */
	char why[400];
	size_t estimate;   /* the memory the rank estimated it needs (its "estimate R: N bytes" report), or 0 */
	int foreign_kill;  /* it died of a SIGKILL that loom run did not send */
	run_stream_t out, err;
} rank_t;

static const int fwd_signals[] = {SIGINT, SIGTERM, SIGHUP};
static int sig_pipe[2] = {-1, -1};
static int handled[3]; /* we installed a handler (the signal was not ignored at startup) */
/* The memory cgroup's oom_kill count when the attempt started (-1: unreadable), and when a rank
 * was found killed by SIGKILL that loom run did not send; LOOM_MEMCHECK_ROOT reads another tree (tests). */
static long long oom_kills_at_start, oom_kills_now = -1;
static struct rlimit old_nofile;

/* ---- signals and processes ------------------------------------------------------------------ */

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Runs on whichever thread the kernel picks: only writes the signal number to the self-pipe. */
static void on_signal(int sig)
{
	int saved = errno;
	unsigned char b = (unsigned char)sig;
	if (write(sig_pipe[1], &b, 1) < 0) { /* full: the loop wakes up anyway and reaps every time */
	}
	errno = saved;
}

static int setup_signals(void)
{
	struct sigaction sa, old;
	if (pipe2(sig_pipe, O_CLOEXEC | O_NONBLOCK) != 0)
		return -1;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_signal;
	sa.sa_flags = SA_RESTART; /* SIGCHLD for stopped ranks too */
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGCHLD, &sa, NULL) != 0)
		return -1;
	for (int k = 0; k < 3; k++) {
		/* A signal ignored at startup (nohup, a background job of a script) stays ignored, for the
		 * ranks too. */
		sigaction(fwd_signals[k], NULL, &old);
		if (old.sa_handler == SIG_IGN)
			continue;
		if (sigaction(fwd_signals[k], &sa, NULL) != 0)
			return -1;
		handled[k] = 1;
	}
	signal(SIGPIPE, SIG_IGN); /* a closed stdout shows up as EPIPE (run_output.c) */
	return 0;
}

/* In a new rank, before exec: the signal dispositions loom run started with. */
static void restore_signals(void)
{
	signal(SIGCHLD, SIG_DFL);
	signal(SIGPIPE, SIG_DFL);
	for (int k = 0; k < 3; k++)
		if (handled[k])
			signal(fwd_signals[k], SIG_DFL);
	setrlimit(RLIMIT_NOFILE, &old_nofile);
}

/* Each rank needs two pipes (and four descriptors while it starts): raise the soft limit on open
 * files towards the hard one if that is too few. The ranks get the original limit back. */
static void raise_fd_limit(int nproc)
{
	struct rlimit rl;
	rlim_t need = (rlim_t)(4 * nproc + 64);
	if (getrlimit(RLIMIT_NOFILE, &old_nofile) != 0)
		return;
	rl = old_nofile;
	if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need) {
		rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > need ? need : rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
}

/* Signal every rank's process group (ranks that exited too: their children may still run). */
static void signal_all(rank_t *r, int n, int sig)
{
	for (int i = 0; i < n; i++)
		if (r[i].pid > 0 && kill(-r[i].pid, sig) != 0 && !r[i].done)
			kill(r[i].pid, sig);
}

static void describe(const rank_t *r, int rank, char *buf, size_t cap)
{
	if (r->hung)
		snprintf(buf, cap, "rank %d (pid %d) %s", rank, (int)r->pid, r->why);
	else if (WIFEXITED(r->status))
		snprintf(buf, cap, "rank %d (pid %d) exited with code %d", rank, (int)r->pid, WEXITSTATUS(r->status));
	else if (WIFSIGNALED(r->status)) {
		int n = snprintf(buf, cap, "rank %d (pid %d) was killed by signal %d (SIG%s)%s", rank, (int)r->pid,
		                 WTERMSIG(r->status), sigabbrev_np(WTERMSIG(r->status)) ? sigabbrev_np(WTERMSIG(r->status)) : "?",
		                 WCOREDUMP(r->status) ? ", core dumped" : "");
		/* SIGKILL that loom run did not send: the kernel's OOM killer, when the cgroup counted a kill */
		if (r->foreign_kill && (oom_kills_now > oom_kills_at_start || oom_kills_now < 0) && n > 0 && (size_t)n < cap) {
			if (oom_kills_now >= 0)
				n += snprintf(buf + n, cap - (size_t)n, ", probably out of memory (the memory cgroup's oom_kill count "
				              "rose from %lld to %lld)", oom_kills_at_start, oom_kills_now);
			else
				n += snprintf(buf + n, cap - (size_t)n, ", perhaps out of memory (the kernel's OOM killer sends SIGKILL; "
				              "no memory cgroup's oom_kill count to tell)");
			if (r->estimate && n > 0 && (size_t)n < cap)
				snprintf(buf + n, cap - (size_t)n, "; the rank estimated it needs %.1f MiB: see `loom train "
				         "--help` for --zero, --activation-checkpointing and --memory-check", r->estimate / 1048576.0);
		}
	} else
		snprintf(buf, cap, "rank %d (pid %d) ended with status 0x%x", rank, (int)r->pid, r->status);
}

static void set_env_int(const char *name, long v)
{
	char s[32];
	snprintf(s, sizeof s, "%ld", v);
	setenv(name, s, 1);
}

/* --log-dir: DIR/attempt_K/RANK/stdout.log and stderr.log for rank `rank` of attempt K (restarts). A
 * file that cannot be created is reported and the output still shown. */
static int attempt;

static void open_logs(const run_opts_t *o, int rank, rank_t *r)
{
	char path[1200];
	int n = snprintf(path, sizeof path, "%s/attempt_%d/%d", o->log_dir, attempt, rank);
	for (char *p = path + 1; n > 0 && n < (int)sizeof path - 16 && *p; p++) /* mkdir -p */
		if (*p == '/') {
			*p = 0;
			mkdir(path, 0777);
			*p = '/';
		}
	if (n <= 0 || n >= (int)sizeof path - 16 || (mkdir(path, 0777) != 0 && errno != EEXIST)) {
		run_note("--log-dir: cannot create %s: %s", path, strerror(errno));
		return;
	}
	strcat(path, "/stdout.log");
	if ((r->out.log_fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666)) < 0)
		run_note("--log-dir: cannot create %s: %s", path, strerror(errno));
	strcpy(path + strlen(path) - 10, "stderr.log");
	if ((r->err.log_fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666)) < 0)
		run_note("--log-dir: cannot create %s: %s", path, strerror(errno));
}

/* Fork and exec rank `rank`. Returns 0, or the errno that made exec (or the setup) fail, with
 * *pid set when a child was started (it has then exited with 127). */
static int spawn(const run_opts_t *o, int rank, rank_t *r)
{
	int out[2], err[2], status_pipe[2], e = 0;
	pid_t parent = getpid(), pid;
	sigset_t all, old;
	ssize_t n;
	if (pipe2(out, O_CLOEXEC) != 0)
		return errno;
	if (pipe2(err, O_CLOEXEC) != 0) {
		e = errno;
		close(out[0]), close(out[1]);
		return e;
	}
	if (pipe2(status_pipe, O_CLOEXEC) != 0) {
		e = errno;
		close(out[0]), close(out[1]), close(err[0]), close(err[1]);
		return e;
	}
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old); /* no handler of ours runs in the child */
	pid = fork();
	if (pid == 0) {
		int local = rank % o->nproc;
		restore_signals();
		pthread_sigmask(SIG_SETMASK, &old, NULL);
		setpgid(0, 0);
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(127); /* loom run died before we set the death signal */
		if (dup2(out[1], 1) < 0 || dup2(err[1], 2) < 0)
			goto fail;
		if (isatty(0)) { /* background process groups cannot read the terminal */
			int null = open("/dev/null", O_RDONLY);
			if (null >= 0)
				dup2(null, 0), close(null);
		}
		set_env_int("RANK", rank), set_env_int("LOCAL_RANK", local), set_env_int("ROLE_RANK", rank);
		execvp(o->argv[0], o->argv);
		/* "Text file busy": the program is being written (just rebuilt); that ends quickly. */
		for (int t = 0; t < 20 && errno == ETXTBSY; t++)
			usleep(50000), execvp(o->argv[0], o->argv);
	fail:
		e = errno;
		if (write(status_pipe[1], &e, sizeof e) < 0) {
		}
		_exit(127);
	}
	e = pid < 0 ? errno : 0;
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	close(out[1]), close(err[1]), close(status_pipe[1]);
	if (pid > 0) {
		setpgid(pid, pid); /* also here: no window where signalling -pid misses the rank */
		r->pid = pid;
		do /* EOF when exec succeeded (close-on-exec), else the child's errno */
			n = read(status_pipe[0], &e, sizeof e);
		while (n < 0 && errno == EINTR);
		if (n != (ssize_t)sizeof e)
			e = 0;
	}
	close(status_pipe[0]);
	fcntl(out[0], F_SETFL, O_NONBLOCK), fcntl(err[0], F_SETFL, O_NONBLOCK);
	if (run_stream_init(&r->out, out[0], 1, rank, o->show[rank] && !(o->redirects & 1)) != 0 ||
	    run_stream_init(&r->err, err[0], 2, rank, o->show[rank] && !(o->redirects & 2)) != 0) {
		close(out[0]), close(err[0]);
		r->out.fd = r->err.fd = -1;
		return e ? e : ENOMEM;
	}
	if (o->log_dir)
		open_logs(o, rank, r);
	return e;
}

/* Remove /dev/shm/loom-<job>@* left behind; returns how many were removed. */
static int remove_segments(const char *job)
{
	char prefix[96], path[400];
	int n = 0;
	DIR *d = opendir("/dev/shm");
	struct dirent *e;
	if (!d)
		return 0;
	snprintf(prefix, sizeof prefix, "loom-%s@", job);
	while ((e = readdir(d))) {
		if (strncmp(e->d_name, prefix, strlen(prefix)) != 0)
			continue;
		snprintf(path, sizeof path, "/dev/shm/%s", e->d_name);
		if (unlink(path) == 0)
			n++;
		else
			run_note("could not remove %s: %s", path, strerror(errno));
	}
	closedir(d);
	return n;
}

/* ---- the supervisor -------------------------------------------------------------------------- */

/* The ranks' reports (comm/transport.h, loom_xp_report_suspect): "suspect S by R: why" lines on a
 * pipe whose write end every rank inherits as LOOM_RUN_REPORT_FD. A rank that waited too long in a
 * collective names the rank it waits for; following those names from a failed rank leads to the
 * one that stopped making progress (which reports nothing itself), the job's real first failure. */
static int report_pipe[2] = {-1, -1};
static char report_buf[8192];
static size_t report_len;

static double stop_grace_s(void)
{
	const char *e = getenv("LOOM_STOP_GRACE_S");
	double v = e && *e ? atof(e) : 1.0;
	return v > 0 ? (v < 1e9 ? v : 1e9) : 1.0; /* "inf": about 30 years */
}

typedef struct {
	const run_opts_t *o;
	rank_t *r;
	int n, running;
	int failed;      /* rank that failed first, or -1 */
	int interrupted; /* signal forwarded to the ranks, or 0 */
	int stopping, killed;
	double kill_at;
	double interrupted_at; /* when the forwarded signal came */
} job_t;

static void read_reports(job_t *j)
{
	ssize_t n;
	if (report_pipe[0] < 0)
		return;
	while ((n = read(report_pipe[0], report_buf + report_len, sizeof report_buf - 1 - report_len)) > 0) {
		char *line = report_buf, *nl;
		report_len += (size_t)n;
		report_buf[report_len] = '\0';
		while ((nl = strchr(line, '\n'))) {
			int s, by, off = 0;
			unsigned long long est;
			*nl = '\0';
			if (sscanf(line, "estimate %d: %llu bytes", &s, &est) == 2) {
				int i = s - j->o->node_rank * j->o->nproc;
				if (i >= 0 && i < j->n)
					j->r[i].estimate = (size_t)est;
			} else if (sscanf(line, "suspect %d by %d: %n", &s, &by, &off) == 2 && off > 0) {
				int i = by - j->o->node_rank * j->o->nproc, k = s - j->o->node_rank * j->o->nproc;
				if (i >= 0 && i < j->n && k >= 0 && k < j->n && i != k && j->r[i].blames < 0) {
					j->r[i].blames = k;
					snprintf(j->r[i].why, sizeof j->r[i].why, "%s", line + off);
				}
			}
			line = nl + 1;
		}
		report_len -= (size_t)(line - report_buf);
		memmove(report_buf, line, report_len);
		if (report_len >= sizeof report_buf - 1)
			report_len = 0; /* a line longer than the buffer: not ours */
	}
}

/* The rank whose lack of progress made rank f fail, following the reports from f; f itself when
 * nobody is blamed (or the blamed rank finished cleanly: it was not stuck). */
static int culprit_of(job_t *j, int f)
{
	int k = f, steps = 0;
	while (j->r[k].blames >= 0 && steps++ < j->n)
		k = j->r[k].blames;
	if (k == f || (j->r[k].done && WIFEXITED(j->r[k].status) && WEXITSTATUS(j->r[k].status) == 0))
		return f;
	return k;
}

static void stop_job(job_t *j, int sig)
{
	signal_all(j->r, j->n, sig);
	if (!j->stopping) {
		j->stopping = 1;
		j->kill_at = now_s() + j->o->grace_s;
	}
}

/* Reap every rank that ended; the first failure stops the job. */
static void reap(job_t *j)
{
	int st, first = -1;
	pid_t p;
	read_reports(j); /* a rank writes its report before it exits */
	while ((p = waitpid(-1, &st, WNOHANG | WUNTRACED | WCONTINUED)) > 0) {
		for (int i = 0; i < j->n; i++) {
			rank_t *r = &j->r[i];
			if (r->pid != p || r->done)
				continue;
			if (WIFSTOPPED(st) || WIFCONTINUED(st)) {
				r->stopped_at = WIFSTOPPED(st) ? (r->stopped_at > 0 ? r->stopped_at : now_s()) : 0;
				if (WIFSTOPPED(st))
					snprintf(r->why, sizeof r->why, "was stopped by signal %d (SIG%s)", WSTOPSIG(st),
					         sigabbrev_np(WSTOPSIG(st)) ? sigabbrev_np(WSTOPSIG(st)) : "?");
				break;
			}
			r->done = 1, r->status = st, j->running--, r->stopped_at = 0;
			/* Its output is all in the pipes now (unless its children still write). */
			run_stream_drain(&r->out, now_s());
			run_stream_drain(&r->err, now_s());
			if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
				break;
			if (WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL && !j->killed && !r->hung) {
				r->foreign_kill = 1;
				oom_kills_now = loom_mem_oom_kills(getenv("LOOM_MEMCHECK_ROOT"));
			}
			/* Within one batch, a death by signal is likelier the cause than an exit code. */
			if (first < 0 || (WIFSIGNALED(st) && !WIFSIGNALED(j->r[first].status)))
				first = i;
			break;
		}
	}
	if (first >= 0 && j->failed < 0 && !j->interrupted) {
		char d[600];
		int k = culprit_of(j, first);
		if (k != first) { /* first gave up waiting for k: k is the failure */
			rank_t *c = &j->r[k];
			char why[400], theirs[256];
			snprintf(why, sizeof why, "%s", c->blames >= 0 || !c->why[0] ? "" : c->why);
			snprintf(theirs, sizeof theirs, "%.250s", j->r[first].why); /* (another rank's: k != first) */
			snprintf(c->why, sizeof c->why, "stopped making progress%s%.60s (rank %d reported: %s)",
			         why[0] ? ": it " : "", why, first, theirs);
			c->hung = 1;
			if (!c->done)
				kill(-c->pid, SIGKILL), kill(c->pid, SIGKILL); /* a stopped rank ignores SIGTERM */
		}
		j->failed = k;
		describe(&j->r[k], k, d, sizeof d);
		if (j->running > 0) { /* else the final report says it */
			run_note("%s; stopping the other ranks (SIGTERM, SIGKILL after %g s)", d, j->o->grace_s);
			stop_job(j, SIGTERM);
		}
	}
}

/* A rank stopped (SIGSTOP, SIGTSTP...) for longer than LOOM_STOP_GRACE_S (default 1 s) holds every
 * collective up: it is the job's failure, killed (SIGTERM would wait for a SIGCONT). Returns the
 * time of the next check, or 0. */
static double check_stopped(job_t *j, double now)
{
	double grace = stop_grace_s(), next = 0;
	for (int i = 0; i < j->n; i++) {
		rank_t *r = &j->r[i];
		char d[600];
		if (r->done || r->stopped_at <= 0)
			continue;
		if (now < r->stopped_at + grace || j->failed >= 0 || j->interrupted) {
			if (j->failed < 0 && !j->interrupted && (next == 0 || r->stopped_at + grace < next))
				next = r->stopped_at + grace;
			continue;
		}
		{
			char how[400];
			snprintf(how, sizeof how, "%s", r->why);
			snprintf(r->why, sizeof r->why, "%.60s and did not continue within %g s (LOOM_STOP_GRACE_S): it holds "
			         "the other ranks up; killing it", how, grace);
		}
		r->hung = 1;
		j->failed = i;
		describe(r, i, d, sizeof d);
		run_note("%s; stopping the other ranks (SIGTERM, SIGKILL after %g s)", d, j->o->grace_s);
		kill(-r->pid, SIGKILL), kill(r->pid, SIGKILL);
		stop_job(j, SIGTERM);
	}
	return next;
}

static void on_forwarded(job_t *j, int sig)
{
	/* The same signal again within a moment is the same request: coreutils' timeout, a terminal's
	 * Ctrl-C or a scheduler sends it to loom run and to its process group, which loom run is in. */
	if (sig == j->interrupted && now_s() - j->interrupted_at < 0.1)
		return;
	if (j->interrupted || j->killed) {
		if (!j->killed)
			run_note("got SIG%s again: killing the ranks", sigabbrev_np(sig));
		j->killed = 1;
		signal_all(j->r, j->n, SIGKILL);
		return;
	}
	j->interrupted = sig, j->interrupted_at = now_s();
	if (j->running > 0)
		run_note("got SIG%s: forwarding it to the ranks (SIGKILL after %g s)", sigabbrev_np(sig), j->o->grace_s);
	stop_job(j, sig);
}

static void supervise(job_t *j)
{
	struct pollfd *pf = malloc(sizeof *pf * (size_t)(2 * j->n + 2));
	run_stream_t **ps = malloc(sizeof *ps * (size_t)(2 * j->n + 2));
	double quiet_until = 0;
	if (!pf || !ps) {
		run_note("out of memory supervising %d ranks: killing them", j->n);
		signal_all(j->r, j->n, SIGKILL);
	}
	for (;;) {
		int np = 0, timeout_ms = -1, rc;
		double now = now_s(), wake = 0, stopped_wake;
		reap(j);
		stopped_wake = check_stopped(j, now);
		if (j->running == 0 && quiet_until == 0)
			quiet_until = now + 0.2; /* the ranks' children may still be writing */
		if (!pf || !ps) {
			if (j->running == 0)
				break;
			usleep(10000);
			continue;
		}
		pf[np] = (struct pollfd){.fd = sig_pipe[0], .events = POLLIN};
		ps[np++] = NULL;
		pf[np] = (struct pollfd){.fd = report_pipe[0], .events = POLLIN};
		ps[np++] = NULL;
		for (int i = 0; i < j->n; i++) {
			run_stream_t *s2[2] = {&j->r[i].out, &j->r[i].err};
			for (int k = 0; k < 2; k++) {
				double d = run_stream_deadline(s2[k]);
				if (s2[k]->fd < 0)
					continue;
				if (d > 0 && d <= now)
					run_stream_flush_partial(s2[k]), d = 0;
				if (d > 0 && (wake == 0 || d < wake))
					wake = d;
				pf[np] = (struct pollfd){.fd = s2[k]->fd, .events = POLLIN};
				ps[np++] = s2[k];
			}
		}
		if (j->running == 0 && (np == 2 || now >= quiet_until))
			break;
		if (j->stopping && !j->killed && (wake == 0 || j->kill_at < wake))
			wake = j->kill_at;
		if (j->running == 0 && (wake == 0 || quiet_until < wake))
			wake = quiet_until;
		if (stopped_wake > 0 && (wake == 0 || stopped_wake < wake))
			wake = stopped_wake;
		if (wake > 0)
			timeout_ms = wake <= now ? 0 : (wake - now) > 3600 ? 3600000 : (int)((wake - now) * 1000) + 1;
		if (j->o->monitor_s > 0 && (timeout_ms < 0 || timeout_ms > (int)(j->o->monitor_s * 1000)))
			timeout_ms = (int)(j->o->monitor_s * 1000); /* --monitor-interval */
		rc = poll(pf, (nfds_t)np, timeout_ms);
		if (rc < 0 && errno != EINTR) {
			run_note("poll failed: %s", strerror(errno));
			usleep(10000);
		}
		if (rc > 0 && (pf[0].revents & POLLIN)) {
			unsigned char sigs[64];
			ssize_t k = read(sig_pipe[0], sigs, sizeof sigs);
			for (ssize_t t = 0; t < k; t++)
				if (sigs[t] != SIGCHLD)
					on_forwarded(j, sigs[t]);
		}
		if (rc > 0 && (pf[1].revents & POLLIN))
			read_reports(j);
		for (int t = 2; rc > 0 && t < np; t++)
			if (pf[t].revents)
				run_stream_read(ps[t], now_s());
		if (j->stopping && !j->killed && now_s() >= j->kill_at && j->running > 0) {
			char list[256] = "";
			size_t len = 0;
			for (int i = 0; i < j->n && len + 16 < sizeof list; i++)
				if (!j->r[i].done)
					len += (size_t)snprintf(list + len, sizeof list - len, "%s%d", len ? ", " : "", i);
			run_note("rank%s %s still running %g s after SIG%s: sending SIGKILL", j->running > 1 ? "s" : "", list,
			         j->o->grace_s, j->interrupted ? sigabbrev_np(j->interrupted) : "TERM");
			j->killed = 1;
			signal_all(j->r, j->n, SIGKILL);
		}
	}
	free(pf), free(ps);
}

int loom_cli_run(int argc, char **argv)
{
	run_opts_t o;
	job_t j = {.failed = -1};
	rank_t *r;
	int exec_err = 0, exec_rank = -1, spawn_failed = 0, removed;
	const char *v;
	/* With stdin, stdout or stderr closed, a pipe made below could take its number. */
	for (int fd = 0; fd < 3; fd++)
		if (fcntl(fd, F_GETFD) < 0 && open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY) < 0)
			return 1;
	run_parse_opts(argc, argv, &o);
	if (o.hostfile && !o.elastic)
		return run_mpirun(&o);
	if (o.hostfile) {
		int rc = run_elastic(&o);
		free(o.show), free(o.py_argv);
		return rc;
	}
	r = calloc((size_t)o.nproc, sizeof *r);
	if (!r || setup_signals() != 0) {
		fprintf(stderr, "loom run: cannot set up: %s\n", strerror(errno));
		return 1;
	}
	for (int i = 0; i < o.nproc; i++)
		r[i].out.fd = r[i].err.fd = -1, r[i].blames = -1;
	raise_fd_limit(o.nproc);
	/* The ranks' reports: they inherit the write end (non-blocking: a rank never waits on us). */
	struct stat pst;
	if (pipe2(report_pipe, O_NONBLOCK) == 0 && fstat(report_pipe[1], &pst) == 0) {
		char v[64];
		fcntl(report_pipe[0], F_SETFD, FD_CLOEXEC);
		snprintf(v, sizeof v, "%d:%llu", report_pipe[1], (unsigned long long)pst.st_ino);
		setenv("LOOM_RUN_REPORT_FD", v, 1); /* FD:INODE, so a rank never writes to a reused number */
	} else {
		report_pipe[0] = report_pipe[1] = -1;
		unsetenv("LOOM_RUN_REPORT_FD");
	}
	setenv("LOOM_JOB_ID", o.job_id, 1);
	setenv("LOOM_RUN_JOB_ID", o.job_id, 1); /* marks it as ours (run_opts.c) */
	setenv("TORCHELASTIC_RUN_ID", o.job_id, 1);
	set_env_int("WORLD_SIZE", o.world), set_env_int("LOCAL_WORLD_SIZE", o.nproc);
	set_env_int("GROUP_RANK", o.node_rank), set_env_int("GROUP_WORLD_SIZE", o.nnodes);
	set_env_int("ROLE_WORLD_SIZE", o.world), setenv("ROLE_NAME", "default", 1);
	set_env_int("TORCHELASTIC_MAX_RESTARTS", o.max_restarts);
	setenv("MASTER_ADDR", o.addr, 1), set_env_int("MASTER_PORT", o.port);
	if ((v = getenv("LOOM_OPENBLAS_NUM_THREADS_WAS"))) { /* ours (main.c): the ranks get the user's value */
		if (*v)
			setenv("OPENBLAS_NUM_THREADS", v, 1);
		else
			unsetenv("OPENBLAS_NUM_THREADS");
		unsetenv("LOOM_OPENBLAS_NUM_THREADS_WAS");
	}
	v = getenv("OMP_NUM_THREADS");
	if (o.nproc > 1 && (!v || !*v)) { /* empty means nothing to OpenMP: treated as unset */
		setenv("OMP_NUM_THREADS", "1", 1);
		run_note("setting OMP_NUM_THREADS=1 for each rank so %d ranks do not oversubscribe the CPUs; "
		         "set it yourself to tune", o.nproc);
	}
	char base_id[64];
	snprintf(base_id, sizeof base_id, "%s", o.job_id);
restart: /* --max-restarts: attempt K > 0 starts every rank again, as torchrun's agent does */
	set_env_int("TORCHELASTIC_RESTART_COUNT", attempt);
	if (attempt > 0) { /* a job id of its own, so nothing of the failed attempt's is reused */
		snprintf(o.job_id, sizeof o.job_id, "%.40s-a%d", base_id, attempt);
		setenv("LOOM_JOB_ID", o.job_id, 1), setenv("LOOM_RUN_JOB_ID", o.job_id, 1);
		memset(r, 0, sizeof *r * (size_t)o.nproc);
		for (int i = 0; i < o.nproc; i++)
			r[i].out.fd = r[i].err.fd = -1, r[i].blames = -1;
		j = (job_t){.failed = -1};
		report_len = 0;
		exec_err = 0, exec_rank = -1, spawn_failed = 0;
	}
	fflush(NULL);
	j.o = &o, j.r = r;
	oom_kills_at_start = loom_mem_oom_kills(getenv("LOOM_MEMCHECK_ROOT")), oom_kills_now = -1;
	unsetenv("LOOM_RANK0_PID"); /* an outer job's */
	for (int i = 0; i < o.nproc; i++) {
		int e = spawn(&o, o.node_rank * o.nproc + i, &r[i]);
		if (r[i].pid > 0)
			j.n = i + 1, j.running++;
		/* The other ranks learn rank 0's pid, to notice within a second that it died before
		 * creating the job's shared memory (comm/transport/shm_segment.c). */
		if (i == 0 && o.node_rank == 0 && r[0].pid > 0)
			set_env_int("LOOM_RANK0_PID", r[0].pid);
		if (e) {
			exec_err = e, exec_rank = i;
			break;
		}
	}
	if (exec_err) {
		if (r[exec_rank].pid > 0) {
			run_note("cannot execute '%s': %s", o.argv[0], strerror(exec_err));
		} else {
			run_note("cannot start rank %d: %s%s", exec_rank, strerror(exec_err),
			         exec_err == EMFILE ? " (raise the limit with ulimit -n)" : "");
			spawn_failed = 1;
		}
		j.failed = exec_rank, j.killed = 1;
		signal_all(r, j.n, SIGKILL);
	}
	supervise(&j);
	for (int i = 0; i < j.n; i++) {
		run_stream_finish(&r[i].out), run_stream_finish(&r[i].err);
		if (i == j.failed && !exec_err)
			run_stream_print_tail(&r[i].err);
	}
	for (int i = 0; i < o.nproc; i++)
		run_stream_free(&r[i].out), run_stream_free(&r[i].err);
	removed = remove_segments(o.job_id);
	if (removed)
		run_note("removed %d shared-memory segment%s left by the job (/dev/shm/loom-%s@*)", removed,
		         removed > 1 ? "s" : "", o.job_id);
	if (!exec_err && !j.interrupted && j.failed >= 0) {
		char d[700];
		describe(&r[j.failed], j.failed, d, sizeof d);
		if (attempt < o.max_restarts) {
			run_note("attempt %d failed (%s); restarting all %d ranks (restart %d of %d)", attempt, d, o.nproc,
			         attempt + 1, o.max_restarts);
			attempt++;
			goto restart;
		}
		run_note("job failed%s; first failure: %s", attempt > 0 ? " after every restart" : "", d);
	}
	free(r), free(o.show), free(o.py_argv);
	if (exec_err)
		return spawn_failed ? 1 : exec_err == ENOENT ? 127 : 126;
	if (j.interrupted) { /* die of the signal we were sent, as the shell expects */
		signal(j.interrupted, SIG_DFL);
		raise(j.interrupted);
		return 128 + j.interrupted;
	}
	return j.failed >= 0 ? 1 : 0;
}
