/* run_elastic.c: `loom run --nnodes MIN:MAX --hostfile FILE --nproc-per-node N PROGRAM`: an elastic
 * job over the hosts of FILE. It runs PROGRAM with mpirun (run_mpi.c) on the largest set of hosts
 * that answer (at most MAX, the first ones of the file; the others are spares), and when the set
 * changes it ends that mpirun and starts another on the new set, without an operator:
 *
 * - shrink: a rank whose step fails (a peer lost: LOOM_TIMEOUT_S, LOOM_EPEERLOST) writes a verdict
 *   file; the launcher acts on the first one at once: it ends mpirun itself (mpirun would wait on a
 *   stopped host's daemon), probes every host of the job (an mpirun of `true` there, as the job's own
 *   command reaches it), drops those that do not answer within LOOM_ELASTIC_PROBE_TIMEOUT_S and
 *   starts again on the rest; the program resumes from its newest complete checkpoint (loom train
 *   --resume reshards it onto any mesh), or from the state the survivors keep in RAM (below). A failure with every host answering is a failure proper:
 *   it counts against --max-restarts, membership changes do not.
 * - grow: while the job runs on fewer than MAX hosts, the hosts not in it are probed every
 *   LOOM_ELASTIC_PROBE_S; when one answers, the launcher asks the ranks to save and stop at their
 *   next checkpoint boundary (the stop-request file below) and starts again on the larger set.
 * - MIN not met: the job ends (exit 1) with a message; the checkpoints stay, resumable.
 *
 * The protocol with the ranks is files in the elastic directory (--elastic-dir, default
 * .loom-elastic-<job id>; it must be visible from every host, like --save-dir), each named after the
 * attempt K (LOOM_ELASTIC_ATTEMPT), so a stale rank of an earlier attempt cannot be taken for a
 * current one:
 *   failed.aK.rR     rank R's verdict: "step S\n<message>" (S: the steps it had completed)
 *   refused.aK.rR    rank R cannot keep the global batch on this world: "<message>"
 *   stop-request.aK  the launcher's request: save and stop at the next checkpoint boundary
 *   stopped.aK       rank 0: "step S": it saved step S and stopped at that request
 *   rescue.aK.rR     rank R, the first of its host (its "keeper"), before its verdict: "step S\ndisk D\n",
 *                    it keeps step S's whole training state in RAM on its host (D: the newest step on
 *                    disk it knows of), or "none\n<why>\n"
 *   started.aK.rR    rank R joined the job (loom_comm_init returned): until every rank has, nothing
 *                    bounds a start that hangs (MPI_Init has no deadline), so an attempt whose ranks
 *                    have not all joined within LOOM_ELASTIC_START_TIMEOUT_S (default 120) is ended
 *                    as failed, and its hosts probed, like one with a verdict
 * and the environment of attempt K: LOOM_ELASTIC_DIR, LOOM_ELASTIC_ATTEMPT, and for the attempt after
 * a change, the change (LOOM_ELASTIC_CAUSE, _TIME, _OLD_WORLD, _LAST_STEP, _RULE), which loom train
 * writes to its JSONL log as an event row once it knows the step it resumed from.
 *
 * The batch rule: a world whose data-parallel size cannot keep --total-batch-size (the trainer
 * refuses it) is shrunk one host at a time until it can; the hosts left out wait as spares.
 *
 * The in-memory path (--elastic-rescue 1, the default; issue 36): the ranks get LOOM_ELASTIC_RESCUE_DIR
 * (/dev/shm/loom-rescue-<job id>) and LOOM_ELASTIC_NPROC; on the first verdict the launcher waits, at
 * most LOOM_ELASTIC_RESCUE_TIMEOUT_S, until each host of the attempt has its keeper's verdict (written
 * after its rescue) or has failed its probe, and only then ends mpirun. The next attempt gets
 * LOOM_ELASTIC_RESCUE_STEP=S (and _DISK_STEP) when every one of its hosts keeps the same step S,
 * newer than the disk's (rescue_choice), else LOOM_ELASTIC_RECOVERY_WHY; the trainer side is
 * cli/train.c's elastic_rescue. At the end of the job the directory is removed on every host that
 * answers. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "loom/train.h"
#include "loom/util.h"
#include "run_opts.h"
#include "run_output.h"

typedef struct {
	char name[RUN_HOST_NAME];
	int alive;     /* answered its last probe */
	pid_t probe;   /* a probe in flight, or 0 */
	double probe_deadline;
	char why[200]; /* why its last probe failed */
	/* the in-memory path: the step whose state this host keeps in RAM (its keeper's rescue file), or
	 * -1, and why not */
	long long rescue_step;
	char rescue_why[300];
} host_t;

typedef struct {
	const run_opts_t *o;
	host_t h[RUN_MAX_HOSTS];
	int nh;
	char dir[1024];
	double probe_s, probe_timeout_s, start_timeout_s;
	int attempt;
	/* the in-memory path (--elastic-rescue): the directory every host keeps its rescue under
	 * (/dev/shm/loom-rescue-<job id>), how long a failed attempt's keepers are waited for, and the
	 * newest checkpoint step on disk the keepers know of */
	char shm[600];
	double rescue_timeout_s;
	long long rescue_disk;
} elastic_t;

static volatile sig_atomic_t got_signal;

static void on_signal(int sig)
{
	got_signal = sig;
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double env_seconds(const char *name, double def)
{
	const char *v = getenv(name);
	char *end;
	double d;
	if (!v || !*v)
		return def;
	d = strtod(v, &end);
	if (*end || !(d > 0 && d <= 86400)) {
		run_note("%s='%s' is not a number of seconds in (0, 86400]: using %g", name, v, def);
		return def;
	}
	return d;
}

/* Start cmd in a process group of its own, with stdin from /dev/null and stdout/stderr to the file
 * `out` when it is not NULL. Returns the pid, or -1. */
static pid_t start(char *const *argv, const char *out)
{
	pid_t pid;
	fflush(NULL);
	pid = fork();
	if (pid == 0) {
		setpgid(0, 0);
		signal(SIGINT, SIG_DFL), signal(SIGTERM, SIG_DFL), signal(SIGHUP, SIG_DFL);
		if (out) {
			int null = open("/dev/null", O_RDONLY), fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0666);
			if (null >= 0)
				dup2(null, 0);
			if (fd >= 0)
				dup2(fd, 1), dup2(fd, 2);
			fprintf(stderr, "probe:");
			for (char *const *a = argv; *a; a++)
				fprintf(stderr, " %s", *a);
			fprintf(stderr, "\n");
		}
		execvp(argv[0], argv);
		fprintf(stderr, "loom run: cannot execute %s: %s\n", argv[0], strerror(errno));
		_exit(127);
	}
	if (pid > 0)
		setpgid(pid, pid);
	return pid;
}

/* Start a probe of host i: `mpirun -np 1 --host NAME:1 true`, as the job reaches it (or with prog
 * instead of true: a command run there, collected like a probe). */
static void probe_run(elastic_t *e, int i, char **prog)
{
	static run_cmd_t cmd;
	const char *name = e->h[i].name;
	if (e->h[i].probe > 0 || run_mpirun_cmd(&cmd, &name, 1, 1, prog) != 0)
		return;
	char log[1200];
	snprintf(log, sizeof log, "%s/probe.%d.log", e->dir, i);
	e->h[i].probe = start(cmd.argv, log);
	e->h[i].probe_deadline = now_s() + e->probe_timeout_s;
	run_mpirun_cmd_free(&cmd);
	if (e->h[i].probe < 0)
		e->h[i].probe = 0;
}

static void probe_start(elastic_t *e, int i)
{
	char *prog[] = {"true", NULL};
	probe_run(e, i, prog);
}

/* Collect host i's probe if it ended (or kill it past its deadline: no answer). Returns 1 when the
 * probe finished (e->h[i].alive says how), 0 while it runs or when there was none. */
static int probe_poll(elastic_t *e, int i)
{
	host_t *h = &e->h[i];
	int st;
	pid_t p;
	if (h->probe <= 0)
		return 0;
	p = waitpid(h->probe, &st, WNOHANG);
	if (p == 0 && now_s() < h->probe_deadline)
		return 0;
	if (p == 0) { /* no answer in time */
		kill(-h->probe, SIGKILL), kill(h->probe, SIGKILL);
		waitpid(h->probe, &st, 0);
		st = -1;
	}
	h->probe = 0;
	h->alive = p > 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0;
	if (!h->alive) { /* the probe's last line says why, if anything */
		char log[1200], line[512];
		FILE *f;
		snprintf(log, sizeof log, "%s/probe.%d.log", e->dir, i);
		if (p == 0)
			snprintf(h->why, sizeof h->why, "no answer within %g s", e->probe_timeout_s);
		else
			snprintf(h->why, sizeof h->why, "its probe failed");
		if ((f = fopen(log, "r"))) {
			while (fgets(line, sizeof line, f)) {
				line[strcspn(line, "\n")] = '\0';
				if (line[0] && line[0] != '-' && line[0] != ' ' && strncmp(line, "probe:", 6) != 0 &&
				    strlen(h->why) < 40)
					snprintf(h->why + strlen(h->why), sizeof h->why - strlen(h->why), ": %.150s", line);
			}
			fclose(f);
		}
	}
	return 1;
}

/* Probe the hosts with want[i] set, all at once, and wait for every answer (at most the probe timeout).
 * A probe that fails outright (not one that times out: a lost host) is started again, up to twice,
 * 0.2 s later: Open MPI's mpiruns starting together can race on their session directory ("A call to
 * mkdir was unable to create the desired directory"), which says nothing about the host. */
static void probe_all(elastic_t *e, const int *want)
{
	int left = 0, tries[RUN_MAX_HOSTS] = {0};
	for (int i = 0; i < e->nh; i++)
		if (want[i])
			probe_start(e, i), left++;
	while (left > 0) {
		for (int i = 0; i < e->nh; i++) {
			if (!want[i] || !probe_poll(e, i))
				continue;
			if (!e->h[i].alive && strncmp(e->h[i].why, "no answer", 9) != 0 &&
			    tries[i] < 2) {
				tries[i]++;
				usleep(200000);
				probe_start(e, i);
				continue;
			}
			left--;
		}
		if (left > 0)
			usleep(20000);
	}
}

static void path_of(const elastic_t *e, char *buf, size_t cap, const char *what)
{
	snprintf(buf, cap, "%s/%s.a%d", e->dir, what, e->attempt);
}

static int exists(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0;
}

/* The first file of this attempt named <what>.aK.r*: its rank and first 1000 bytes into text;
 * *count gets how many there are. Returns the rank, or -1 when there is none. */
static int read_rank_files(const elastic_t *e, const char *what, char *text, size_t cap, int *count,
                           long long *max_step)
{
	char prefix[64], path[1400];
	DIR *d = opendir(e->dir);
	struct dirent *de;
	int first = -1;
	*count = 0;
	if (!d)
		return -1;
	snprintf(prefix, sizeof prefix, "%s.a%d.r", what, e->attempt);
	while ((de = readdir(d))) {
		FILE *f;
		size_t n;
		long long step;
		if (strncmp(de->d_name, prefix, strlen(prefix)) != 0 || strstr(de->d_name, ".tmp"))
			continue; /* a rank's file being written (it is renamed into place when complete) */
		(*count)++;
		snprintf(path, sizeof path, "%s/%s", e->dir, de->d_name);
		if (!(f = fopen(path, "r")))
			continue;
		if (max_step && fscanf(f, "step %lld\n", &step) == 1 && step > *max_step)
			*max_step = step;
		if (first < 0 || atoi(de->d_name + strlen(prefix)) < first) {
			first = atoi(de->d_name + strlen(prefix));
			rewind(f);
			n = fread(text, 1, cap - 1, f);
			text[n] = '\0';
			if (strncmp(text, "step ", 5) == 0 && strchr(text, '\n')) /* the message is the next line */
				memmove(text, strchr(text, '\n') + 1, strlen(strchr(text, '\n') + 1) + 1);
			text[strcspn(text, "\n")] = '\0';
		}
		fclose(f);
	}
	closedir(d);
	return first;
}

/* Remove the protocol files of every attempt and the probes' logs (the directory is ours). */
static void clear_dir(const elastic_t *e)
{
	char path[1400];
	DIR *d = opendir(e->dir);
	struct dirent *de;
	if (!d)
		return;
	while ((de = readdir(d)))
		if (de->d_name[0] != '.' && (strncmp(de->d_name, "failed.", 7) == 0 || strncmp(de->d_name, "refused.", 8) == 0 ||
		                             strncmp(de->d_name, "stop-request.", 13) == 0 ||
		                             strncmp(de->d_name, "stopped.", 8) == 0 || strncmp(de->d_name, "probe.", 6) == 0 ||
		                             strncmp(de->d_name, "started.", 8) == 0 || strncmp(de->d_name, "rescue.", 7) == 0)) {
			snprintf(path, sizeof path, "%s/%s", e->dir, de->d_name);
			unlink(path);
		}
	closedir(d);
}

/* Text safe inside a JSON string and on one line: quotes, backslashes and control characters become
 * spaces. */
static void json_safe(char *s)
{
	for (; *s; s++)
		if (*s == '"' || *s == '\\' || (unsigned char)*s < 0x20)
			*s = ' ';
}

static void host_list(const elastic_t *e, const int *set, char *buf, size_t cap)
{
	size_t len = 0;
	buf[0] = '\0';
	for (int i = 0; i < e->nh && len + RUN_HOST_NAME + 4 < cap; i++)
		if (set[i])
			len += (size_t)snprintf(buf + len, cap - len, "%s%s", len ? ", " : "", e->h[i].name);
}

static void utc_now(char *buf, size_t cap)
{
	time_t t = time(NULL);
	struct tm tm;
	gmtime_r(&t, &tm);
	strftime(buf, cap, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

/* The keepers' rescue files of the attempt that ended (rescue.aK.rR, R the first rank of each host of
 * `use`): each host's step kept in RAM, or -1 and why not; e->rescue_disk the newest step on disk
 * they know of. Hosts not in the attempt keep nothing of its state. */
static void read_rescues(elastic_t *e, const int *use)
{
	int k = 0;
	e->rescue_disk = -1;
	for (int i = 0; i < e->nh; i++) {
		host_t *h = &e->h[i];
		char path[1400], line[400] = "";
		long long step = -1, disk = -1;
		FILE *f;
		h->rescue_step = -1;
		if (!use[i]) {
			snprintf(h->rescue_why, sizeof h->rescue_why, "it was not in the job");
			continue;
		}
		snprintf(path, sizeof path, "%s/rescue.a%d.r%d", e->dir, e->attempt, k++ * e->o->nproc);
		if (!(f = fopen(path, "r"))) {
			snprintf(h->rescue_why, sizeof h->rescue_why, "no word from its first rank within %g s "
			         "(LOOM_ELASTIC_RESCUE_TIMEOUT_S)", e->rescue_timeout_s);
			continue;
		}
		if (fscanf(f, "step %lld\ndisk %lld", &step, &disk) == 2 && step >= 0) {
			h->rescue_step = step;
			if (disk > e->rescue_disk)
				e->rescue_disk = disk;
		} else {
			rewind(f);
			if (fgets(line, sizeof line, f) && fgets(line, sizeof line, f))
				line[strcspn(line, "\n")] = '\0';
			snprintf(h->rescue_why, sizeof h->rescue_why, "%.250s", line[0] ? line : "an unreadable rescue file");
		}
		fclose(f);
	}
}

/* The recovery of the attempt on `use`: from the state its hosts keep in RAM when every one keeps the
 * same step s, newer than the newest checkpoint on disk (returns s), else -1 with why. */
static long long rescue_choice(const elastic_t *e, const int *use, char *why, size_t cap)
{
	long long s = -2;
	why[0] = '\0';
	if (!e->o->elastic_rescue) {
		snprintf(why, cap, "the in-memory path is off (--elastic-rescue 0)");
		return -1;
	}
	for (int i = 0; i < e->nh; i++) {
		if (!use[i])
			continue;
		if (e->h[i].rescue_step < 0) {
			snprintf(why, cap, "host %s keeps no state in memory: %s", e->h[i].name, e->h[i].rescue_why);
			return -1;
		}
		if (s == -2)
			s = e->h[i].rescue_step;
		else if (s != e->h[i].rescue_step) {
			size_t n = (size_t)snprintf(why, cap, "the hosts keep different steps (a step completed on some ranks "
			                            "only):");
			for (int j = 0; j < e->nh && n < cap; j++)
				if (use[j])
					n += (size_t)snprintf(why + n, cap - n, " %s step %lld", e->h[j].name, e->h[j].rescue_step);
			return -1;
		}
	}
	if (s < 0) {
		snprintf(why, cap, "no host keeps state in memory");
		return -1;
	}
	if (s <= e->rescue_disk) {
		snprintf(why, cap, "the state kept in memory (step %lld) is not newer than the checkpoint on disk (step %lld)",
		         s, e->rescue_disk);
		return -1;
	}
	return s;
}

/* The end of the job: remove the rescue directory on every host that answers (an mpirun of rm there,
 * all at once, each bounded like a probe) and here. */
static void rescue_cleanup(elastic_t *e)
{
	char *prog[] = {"rm", "-rf", e->shm, NULL};
	int left = 0;
	if (!e->o->elastic_rescue)
		return;
	for (int i = 0; i < e->nh; i++)
		if (e->h[i].alive)
			probe_run(e, i, prog), left += e->h[i].probe > 0;
	while (left > 0) {
		for (int i = 0; i < e->nh; i++)
			if (e->h[i].probe > 0 && probe_poll(e, i))
				left--;
		if (left > 0)
			usleep(20000);
	}
	loom_trainer_remove_replica(e->shm);
}

int run_elastic(const run_opts_t *o)
{
	static elastic_t e;
	static char hosts[RUN_MAX_HOSTS][RUN_HOST_NAME];
	static run_cmd_t cmd;
	int use[RUN_MAX_HOSTS], want[RUN_MAX_HOSTS], nuse = 0, prev_world = 0, failures = 0, changes = 0, shrink = 0;
	int rc;
	char cause[1200] = "", rule[300] = "", summary[8192] = "", list[2048];
	long long last_step = -1;
	struct sigaction sa;
	if (!loom_build_info()->mpi) {
		fprintf(stderr, "loom run: --nnodes %d:%d --hostfile %s: this loom was built without MPI; " RUN_MPI_REMEDY "\n",
		        o->nnodes_min, o->nnodes_max, o->hostfile);
		return 2;
	}
	e.o = o;
	if ((rc = run_read_hostfile(o->hostfile, hosts, &e.nh)) != 0)
		return rc;
	for (int i = 0; i < e.nh; i++)
		snprintf(e.h[i].name, sizeof e.h[i].name, "%s", hosts[i]);
	if (o->elastic_dir)
		snprintf(e.dir, sizeof e.dir, "%s", o->elastic_dir);
	else
		snprintf(e.dir, sizeof e.dir, ".loom-elastic-%s", o->job_id);
	if (mkdir(e.dir, 0777) != 0 && errno != EEXIST) {
		fprintf(stderr, "loom run: --elastic-dir %s: %s\n", e.dir, strerror(errno));
		return 2;
	}
	{
		char *abs = realpath(e.dir, NULL); /* the ranks may start elsewhere */
		if (abs)
			snprintf(e.dir, sizeof e.dir, "%s", abs);
		free(abs);
	}
	e.probe_s = env_seconds("LOOM_ELASTIC_PROBE_S", 5);
	e.probe_timeout_s = env_seconds("LOOM_ELASTIC_PROBE_TIMEOUT_S", 10);
	e.start_timeout_s = env_seconds("LOOM_ELASTIC_START_TIMEOUT_S", 120);
	e.rescue_timeout_s = env_seconds("LOOM_ELASTIC_RESCUE_TIMEOUT_S", 20);
	e.rescue_disk = -1;
	for (int i = 0; i < e.nh; i++)
		e.h[i].rescue_step = -1, snprintf(e.h[i].rescue_why, sizeof e.h[i].rescue_why, "nothing failed yet");
	snprintf(e.shm, sizeof e.shm, "/dev/shm/loom-rescue-%s", o->job_id);
	unsetenv("LOOM_ELASTIC_RESCUE_STEP"), unsetenv("LOOM_ELASTIC_DISK_STEP"), unsetenv("LOOM_ELASTIC_RECOVERY_WHY");
	if (o->elastic_rescue) { /* the ranks' side: cli/train.c's elastic_rescue */
		char v[64];
		setenv("LOOM_ELASTIC_RESCUE_DIR", e.shm, 1);
		snprintf(v, sizeof v, "%d", o->nproc), setenv("LOOM_ELASTIC_NPROC", v, 1);
		snprintf(v, sizeof v, "%g", e.rescue_timeout_s), setenv("LOOM_ELASTIC_RESCUE_TIMEOUT_S", v, 1);
	} else {
		unsetenv("LOOM_ELASTIC_RESCUE_DIR");
	}
	clear_dir(&e);
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_signal;
	sigaction(SIGINT, &sa, NULL), sigaction(SIGTERM, &sa, NULL), sigaction(SIGHUP, &sa, NULL);
	if (!getenv("OMP_NUM_THREADS") || !*getenv("OMP_NUM_THREADS"))
		setenv("OMP_NUM_THREADS", "1", 1);
	setenv("LOOM_ELASTIC_DIR", e.dir, 1);
	if (!getenv("LOOM_TIMEOUT_S") || !*getenv("LOOM_TIMEOUT_S"))
		run_note("elastic: LOOM_TIMEOUT_S is not set, so the ranks take the default 300 s to give up on a lost host "
		         "before the launcher can act; set it (e.g. 30, above the longest step and checkpoint save)");
	for (int i = 0; i < e.nh; i++)
		want[i] = 1;
	probe_all(&e, want); /* a host that does not answer now is not used until it does */
	for (;;) {
		pid_t pid;
		int st = 0, verdicts = 0, refusals = 0, stop_asked = 0, joined = 0, collecting = 0, probed[RUN_MAX_HOSTS] = {0};
		double verdict_at = 0, kill_at = 0, collect_until = 0, next_probe = now_s() + e.probe_s, started_at = now_s();
		char verdict[1100] = "", path[1400], text[1100];
		long long vstep = -1;
		/* the hosts of this attempt: the first alive ones of the file, at most MAX, less the batch rule's */
		nuse = 0;
		for (int i = 0; i < e.nh; i++)
			use[i] = 0;
		int alive = 0;
		for (int i = 0; i < e.nh; i++)
			alive += e.h[i].alive;
		int target = (alive < o->nnodes_max ? alive : o->nnodes_max) - shrink;
		for (int i = 0; i < e.nh && nuse < target; i++)
			if (e.h[i].alive)
				use[i] = 1, nuse++;
		if (nuse < o->nnodes_min) {
			int down[RUN_MAX_HOSTS] = {0};
			for (int i = 0; i < e.nh; i++)
				down[i] = !e.h[i].alive;
			host_list(&e, down, list, sizeof list);
			for (int i = 0; i < e.nh; i++)
				if (down[i])
					run_note("elastic: host %s: %s", e.h[i].name, e.h[i].why);
			run_note("elastic: %d host%s can run the job (%s), fewer than --nnodes' MIN %d%s%s: ending it. Its "
			         "checkpoints are kept: run the same command again (with the program's --resume) once enough "
			         "hosts answer", nuse, nuse == 1 ? "" : "s", alive > nuse ? "the batch rule leaves some out" :
			         "the others do not answer", o->nnodes_min, list[0] ? "; not answering: " : "", list);
			if (cause[0])
				run_note("elastic: the last change: %s", cause);
			rescue_cleanup(&e);
			if (summary[0])
				fprintf(stderr, "loom run: elastic summary: %d membership change%s, %d failure%s:\n%s", changes,
				        changes == 1 ? "" : "s", failures, failures == 1 ? "" : "s", summary);
			return 1;
		}
		const char *names[RUN_MAX_HOSTS];
		int k = 0;
		for (int i = 0; i < e.nh; i++)
			if (use[i])
				names[k++] = e.h[i].name;
		char v[64];
		snprintf(v, sizeof v, "%d", e.attempt);
		setenv("LOOM_ELASTIC_ATTEMPT", v, 1);
		snprintf(v, sizeof v, "%d", failures);
		setenv("TORCHELASTIC_RESTART_COUNT", v, 1);
		if (cause[0]) { /* the change this attempt starts with, for the program's log */
			char t[64];
			utc_now(t, sizeof t);
			json_safe(cause), json_safe(rule);
			setenv("LOOM_ELASTIC_CAUSE", cause, 1), setenv("LOOM_ELASTIC_TIME", t, 1);
			snprintf(v, sizeof v, "%d", prev_world), setenv("LOOM_ELASTIC_OLD_WORLD", v, 1);
			snprintf(v, sizeof v, "%lld", last_step), setenv("LOOM_ELASTIC_LAST_STEP", v, 1);
			if (rule[0])
				setenv("LOOM_ELASTIC_RULE", rule, 1);
			else
				unsetenv("LOOM_ELASTIC_RULE");
			char why[900];
			long long s = rescue_choice(&e, use, why, sizeof why);
			if (s >= 0) {
				snprintf(v, sizeof v, "%lld", s), setenv("LOOM_ELASTIC_RESCUE_STEP", v, 1);
				snprintf(v, sizeof v, "%lld", e.rescue_disk), setenv("LOOM_ELASTIC_DISK_STEP", v, 1);
				unsetenv("LOOM_ELASTIC_RECOVERY_WHY");
				run_note("elastic: recovery in memory: every host of the attempt keeps step %lld's training state in RAM "
				         "(%s/<host>; the newest checkpoint on disk is of step %lld)", s, e.shm, e.rescue_disk);
			} else {
				unsetenv("LOOM_ELASTIC_RESCUE_STEP"), unsetenv("LOOM_ELASTIC_DISK_STEP");
				json_safe(why);
				setenv("LOOM_ELASTIC_RECOVERY_WHY", why, 1);
				run_note("elastic: recovery from the checkpoint on disk: %s", why);
			}
		} else {
			unsetenv("LOOM_ELASTIC_CAUSE"), unsetenv("LOOM_ELASTIC_TIME"), unsetenv("LOOM_ELASTIC_OLD_WORLD");
			unsetenv("LOOM_ELASTIC_LAST_STEP"), unsetenv("LOOM_ELASTIC_RULE");
			unsetenv("LOOM_ELASTIC_RESCUE_STEP"), unsetenv("LOOM_ELASTIC_DISK_STEP"), unsetenv("LOOM_ELASTIC_RECOVERY_WHY");
		}
		if (run_mpirun_cmd(&cmd, names, nuse, o->nproc, o->argv) != 0)
			return 1;
		host_list(&e, use, list, sizeof list);
		run_note("elastic: attempt %d on %d host%s (%s), %d ranks%s%.300s", e.attempt, nuse, nuse == 1 ? "" : "s", list,
		         nuse * o->nproc, cause[0] ? "; after " : "", cause);
		fprintf(stderr, "loom run: running:");
		for (int i = 0; i < cmd.argc; i++)
			fprintf(stderr, " %s", cmd.argv[i]);
		fprintf(stderr, "\n");
		pid = start(cmd.argv, NULL);
		run_mpirun_cmd_free(&cmd);
		if (pid < 0) {
			fprintf(stderr, "loom run: cannot start mpirun: %s\n", strerror(errno));
			return 1;
		}
		/* watch mpirun, the ranks' verdicts and (with room to grow) the hosts not in the job */
		for (;;) {
			double now = now_s();
			pid_t p = waitpid(pid, &st, WNOHANG);
			if (p == pid)
				break;
			if (got_signal) { /* forward, and end as the shell expects once mpirun has */
				int sig = got_signal;
				got_signal = 0;
				run_note("elastic: got SIG%s: forwarding it to mpirun", sigabbrev_np(sig));
				kill(pid, sig);
				waitpid(pid, &st, 0);
				signal(sig, SIG_DFL);
				raise(sig);
				return 128 + sig;
			}
			if (verdict_at == 0 && read_rank_files(&e, "failed", text, sizeof text, &verdicts, NULL) >= 0) {
				snprintf(verdict, sizeof verdict, "%s", text);
				verdict_at = now;
				if (o->elastic_rescue) { /* first the keepers' rescues: probe the hosts meanwhile */
					collecting = 1, collect_until = now + e.rescue_timeout_s;
					for (int i = 0; i < e.nh; i++)
						if (use[i])
							probe_start(&e, i);
					run_note("elastic: a rank failed (%.300s): waiting for each host's state in memory (at most %g s, "
					         "LOOM_ELASTIC_RESCUE_TIMEOUT_S) while probing the hosts", verdict, e.rescue_timeout_s);
				} else {
					kill_at = now + o->grace_s;
					run_note("elastic: a rank failed (%.300s): ending this mpirun (SIGTERM, SIGKILL after %g s)", verdict,
					         o->grace_s);
					kill(-pid, SIGTERM), kill(pid, SIGTERM);
				}
			}
			if (collecting) { /* every host of the job: its first rank's verdict (after its rescue), or lost */
				int waiting = 0, k = 0;
				for (int i = 0; i < e.nh; i++) {
					if (!use[i])
						continue;
					if (probe_poll(&e, i))
						probed[i] = 1;
					snprintf(path, sizeof path, "%s/failed.a%d.r%d", e.dir, e.attempt, k++ * o->nproc);
					if (!exists(path) && !(probed[i] && !e.h[i].alive))
						waiting++;
				}
				if (waiting == 0 || now >= collect_until) {
					/* a host known lost: mpirun would wait on its daemon whatever the grace, and every keeper
					 * has written; SIGTERM reaches the ranks at once, so SIGKILL follows after 1 s */
					int gone = 0;
					for (int i = 0; i < e.nh; i++)
						gone += use[i] && probed[i] && !e.h[i].alive;
					double grace = gone && !waiting && o->grace_s > 1 ? 1 : o->grace_s;
					collecting = 0, kill_at = now + grace;
					run_note("elastic: %s%s: ending this mpirun (SIGTERM, SIGKILL after %g s)",
					         waiting ? "not every host answered in time" : "every host has answered",
					         gone ? " or is lost" : "", grace);
					kill(-pid, SIGTERM), kill(pid, SIGTERM);
				}
			}
			if (verdict_at == 0 && joined < nuse * o->nproc) { /* the start's watchdog */
				read_rank_files(&e, "started", text, sizeof text, &joined, NULL);
				if (joined < nuse * o->nproc && now >= started_at + e.start_timeout_s) {
					snprintf(verdict, sizeof verdict, "only %d of %d ranks joined within %g s "
					         "(LOOM_ELASTIC_START_TIMEOUT_S)", joined, nuse * o->nproc, e.start_timeout_s);
					verdict_at = now, kill_at = now + o->grace_s;
					run_note("elastic: %s: ending this mpirun (SIGTERM, SIGKILL after %g s)", verdict, o->grace_s);
					kill(-pid, SIGTERM), kill(pid, SIGTERM);
				}
			}
			if (kill_at > 0 && now >= kill_at) {
				kill(-pid, SIGKILL), kill(pid, SIGKILL);
				kill_at = 0;
			}
			/* growth: probe the hosts that could join, every probe_s */
			if (verdict_at == 0 && !stop_asked && nuse < o->nnodes_max) {
				for (int i = 0; i < e.nh; i++) {
					if (use[i] || (e.h[i].alive && shrink > 0))
						continue;
					if (e.h[i].probe == 0 && now >= next_probe)
						probe_start(&e, i);
					if (probe_poll(&e, i) && e.h[i].alive && !stop_asked) {
						FILE *f;
						path_of(&e, path, sizeof path, "stop-request");
						if ((f = fopen(path, "w")))
							fprintf(f, "host %s answers\n", e.h[i].name), fclose(f);
						stop_asked = 1;
						snprintf(cause, sizeof cause, "grow: host %s answers", e.h[i].name);
						run_note("elastic: host %s answers: asking the ranks to save and stop at their next checkpoint "
						         "(%s)", e.h[i].name, path);
					}
				}
				if (now >= next_probe)
					next_probe = now + e.probe_s;
			}
			usleep(50000);
		}
		for (int i = 0; i < e.nh; i++) /* a probe still in flight: collect it */
			if (e.h[i].probe > 0) {
				kill(-e.h[i].probe, SIGKILL), kill(e.h[i].probe, SIGKILL);
				waitpid(e.h[i].probe, NULL, 0);
				e.h[i].probe = 0;
			}
		/* what ended it */
		prev_world = nuse * o->nproc;
		read_rank_files(&e, "failed", text, sizeof text, &verdicts, &vstep);
		if (verdicts && !verdict[0])
			snprintf(verdict, sizeof verdict, "%s", text);
		path_of(&e, path, sizeof path, "stopped");
		if (exists(path) && !verdicts) { /* saved and stopped at our request: grow */
			FILE *f = fopen(path, "r");
			if (f) {
				if (fscanf(f, "step %lld", &last_step) != 1)
					last_step = -1;
				fclose(f);
			}
			shrink = 0, rule[0] = '\0', changes++;
			size_t len = strlen(summary);
			snprintf(summary + len, sizeof summary - len, "  change %d: %s; stopped after step %lld's checkpoint\n",
			         changes, cause, last_step);
			for (int i = 0; i < e.nh; i++) /* the checkpoint is the newest state: nothing in RAM is */
				e.h[i].rescue_step = -1, snprintf(e.h[i].rescue_why, sizeof e.h[i].rescue_why, "the job grows from "
				                                  "step %lld's checkpoint, saved at the launcher's request", last_step);
			e.attempt++;
			continue;
		}
		if (read_rank_files(&e, "refused", text, sizeof text, &refusals, NULL) >= 0) {
			shrink++;
			snprintf(rule, sizeof rule, "the global batch is kept: %d host%s cannot keep it (%.150s), so %d host%s "
			         "left out as spare%s (the largest count that can)", nuse, nuse == 1 ? "" : "s", text, shrink,
			         shrink == 1 ? " is" : "s are", shrink == 1 ? "" : "s");
			run_note("elastic: %s", rule);
			json_safe(rule);
			if (!cause[0] || strncmp(cause, "batch rule", 10) == 0)
				snprintf(cause, sizeof cause, "batch rule: %d host%s answer", nuse, nuse == 1 ? "" : "s");
			e.attempt++;
			continue;
		}
		if (!verdicts && !verdict[0] && WIFEXITED(st) && WEXITSTATUS(st) == 0) {
			if (summary[0])
				fprintf(stderr, "loom run: elastic summary: %d membership change%s, %d failure%s:\n%s", changes,
				        changes == 1 ? "" : "s", failures, failures == 1 ? "" : "s", summary);
			rescue_cleanup(&e);
			clear_dir(&e);
			if (!o->elastic_dir)
				rmdir(e.dir);
			return 0;
		}
		/* a failure: what each host keeps in RAM, and which hosts of the job still answer (those not
		 * probed yet while the rescues were awaited) */
		read_rescues(&e, use);
		for (int i = 0; i < e.nh; i++)
			want[i] = use[i] && !probed[i];
		probe_all(&e, want);
		int lost[RUN_MAX_HOSTS], nlost = 0;
		for (int i = 0; i < e.nh; i++)
			lost[i] = use[i] && !e.h[i].alive, nlost += lost[i];
		last_step = vstep;
		if (nlost > 0) {
			host_list(&e, lost, list, sizeof list);
			for (int i = 0; i < e.nh; i++)
				if (lost[i]) { /* the first lost host's probe says why */
					snprintf(text, sizeof text, "%s", e.h[i].why);
					break;
				}
			snprintf(cause, sizeof cause, "host lost: %.600s (%.200s; the ranks' verdict: %.300s)", list, text,
			         verdict[0] ? verdict : "mpirun failed");
			shrink = 0, rule[0] = '\0', changes++;
			run_note("elastic: %s", cause);
			size_t len = strlen(summary);
			snprintf(summary + len, sizeof summary - len, "  change %d: %s; last step done %lld\n", changes, cause,
			         last_step);
		} else {
			failures++;
			snprintf(cause, sizeof cause, "failure with every host answering (%.300s)",
			         verdict[0] ? verdict : "mpirun failed");
			if (failures > o->max_restarts) {
				run_note("elastic: job failed: %s; --max-restarts %d reached", cause, o->max_restarts);
				rescue_cleanup(&e);
				if (summary[0])
					fprintf(stderr, "loom run: elastic summary: %d membership change%s, %d failure%s:\n%s", changes,
					        changes == 1 ? "" : "s", failures, failures == 1 ? "" : "s", summary);
				return 1;
			}
			run_note("elastic: %s: restarting on the same hosts (restart %d of %d)", cause, failures, o->max_restarts);
			size_t len = strlen(summary);
			snprintf(summary + len, sizeof summary - len, "  failure %d: %s\n", failures, cause);
		}
		e.attempt++;
	}
}
