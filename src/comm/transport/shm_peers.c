/* shm_peers.c: which ranks of a job exist on this host before they join it, found the way a launcher
 * leaves them: `loom run`, mpirun (its orted) and srun (slurmstepd) start a host's ranks as children
 * of one process and exec each with its rank in the environment (RANK, OMPI_COMM_WORLD_RANK,
 * SLURM_PROCID). A rank waiting for the others to join (shm_segment.c) scans its siblings, every
 * 100 ms: a rank whose process was seen and is gone (or a zombie), or that has had no process under
 * the launcher for a second of scans, exited or died before joining. A sibling that names no rank
 * holds that second off only while it is new (a rank between fork and exec); the launcher's other
 * children (mpirun's ssh to the other hosts) do not. The wait then fails naming it
 * within about a second, instead of waiting out LOOM_TIMEOUT_S.
 *
 * Only where it can be trusted: this process must itself carry its rank in the environment it was
 * exec'd with (/proc/self/environ; a test harness that forks ranks and sets the variables does not,
 * and is left to the deadline), and have a parent other than init that does not carry the same rank
 * (a wrapper script between the launcher and the rank: its siblings are not the other ranks). A sibling whose environment does
 * not name a rank yet (between fork and exec) holds off "never seen" verdicts. */
#include <ctype.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/transport.h"
#include "core/util.h"

#define SCAN_EVERY_S 0.1
#define NEVER_SEEN_S 1.0
#define ENV_CAP (1 << 16) /* bytes of a process's environment read */

static const char *const rank_vars[] = {"RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"};
static const char *const size_vars[] = {"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS"};

/* Read /proc/<pid>/<what> (at most cap-1 bytes; NUL-terminated). Returns the length, -1 on error. */
static ssize_t read_proc(long pid, const char *what, char *buf, size_t cap)
{
	char path[64];
	ssize_t n, len = 0;
	int fd;
	if (pid > 0)
		snprintf(path, sizeof path, "/proc/%ld/%s", pid, what);
	else
		snprintf(path, sizeof path, "/proc/self/%s", what);
	if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
		return -1;
	while ((size_t)len < cap - 1 && (n = read(fd, buf + len, cap - 1 - (size_t)len)) > 0)
		len += n;
	close(fd);
	buf[len] = '\0';
	return len;
}

/* The value of `var` in a NUL-separated environment block, or NULL. */
static const char *env_in(const char *env, ssize_t len, const char *var)
{
	size_t vl = strlen(var);
	for (const char *p = env; p < env + len; p += strlen(p) + 1)
		if (strncmp(p, var, vl) == 0 && p[vl] == '=')
			return p + vl + 1;
	return NULL;
}

static int parse_rank(const char *v)
{
	char *end;
	long r;
	if (!v || !*v)
		return -1;
	r = strtol(v, &end, 10);
	return *end || r < 0 || r > 1 << 20 ? -1 : (int)r;
}

static int peers_init(loom_shm_peers_t *p, int n, const char *const *rvars, const char *const *svars, size_t nvars,
                      const char *mark);

int loom__shm_peers_init(loom_shm_peers_t *p, int n)
{
	return peers_init(p, n, rank_vars, size_vars, LOOM_ARRAY_LEN(rank_vars), NULL);
}

int loom__shm_peers_init_vars(loom_shm_peers_t *p, int n, const char *rank_var, const char *size_var,
                              const char *mark)
{
	return peers_init(p, n, &rank_var, &size_var, 1, mark);
}

static int peers_init(loom_shm_peers_t *p, int n, const char *const *rvars, const char *const *svars, size_t nvars,
                      const char *mark)
{
	char *env;
	ssize_t len;
	memset(p, 0, sizeof *p);
	p->n = -1; /* tried: off unless set up below */
	p->ppid = getppid();
	/* Plain malloc until the scan is known to be on: where it is off (or memory is short) nothing
	 * changes, so this allocation is not one of those fault injection must see fail. */
	if (p->ppid <= 1 || n < 2 || !(env = malloc(ENV_CAP)))
		return 0;
	if ((len = read_proc(0, "environ", env, ENV_CAP)) <= 0) {
		free(env);
		return 0;
	}
	for (size_t i = 0; i < nvars && !p->var; i++) {
		const char *mine = env_in(env, len, rvars[i]), *now = getenv(rvars[i]);
		/* The shared-memory world must be the whole job (not one host's ranks of a job spanning
		 * hosts, whose indices are not the launcher's ranks). */
		if (mine && now && strcmp(mine, now) == 0 && parse_rank(mine) >= 0 && parse_rank(getenv(svars[i])) == n)
			p->var = rvars[i];
		else if (now && *now)
			break; /* the launcher's variable was set after exec: not ours to trust */
	}
	/* A parent that carries our rank too is a wrapper (`loom run sh -c '...; prog'`), not the
	 * launcher: the other ranks are not our siblings. */
	if (p->var && (len = read_proc(p->ppid, "environ", env, ENV_CAP)) > 0 && env_in(env, len, p->var) &&
	    strcmp(env_in(env, len, p->var), getenv(p->var)) == 0)
		p->var = NULL;
	if (!p->var || !(p->pid = loom__calloc((size_t)n, sizeof *p->pid)) ||
	    (mark && !(p->marked = loom__calloc((size_t)n, 1)))) {
		p->var = NULL;
		free(env);
		return 0;
	}
	p->mark = mark;
	p->buf = env;
	p->n = n;
	return 1;
}

void loom__shm_peers_free(loom_shm_peers_t *p)
{
	free(p->pid);
	free(p->buf);
	free(p->marked);
	memset(p, 0, sizeof *p);
}

/* One scan of /proc: the live (not zombie) children of our parent that name a rank. */
static void scan(loom_shm_peers_t *p, double now)
{
	char stat[512], *env = p->buf;
	DIR *d = opendir("/proc");
	struct dirent *e;
	int onu = p->nu, oupid[32], nu = 0;
	double ouseen[32];
	if (!d)
		return;
	memcpy(oupid, p->upid, sizeof oupid);
	memcpy(ouseen, p->useen, sizeof ouseen);
	p->unnamed = 0;
	for (int r = 0; r < p->n; r++)
		p->pid[r] = p->pid[r] > 0 ? -p->pid[r] : p->pid[r]; /* seen before, not (yet) this time */
	while ((e = readdir(d)) != NULL) {
		long pid;
		char *q, state;
		long ppid;
		ssize_t len;
		int r;
		if (!isdigit((unsigned char)e->d_name[0]))
			continue;
		pid = atol(e->d_name);
		if (read_proc(pid, "stat", stat, sizeof stat) <= 0 || !(q = strrchr(stat, ')')) ||
		    sscanf(q + 1, " %c %ld", &state, &ppid) != 2 || ppid != (long)p->ppid || state == 'Z' || state == 'X')
			continue;
		if ((len = read_proc(pid, "environ", env, ENV_CAP)) <= 0)
			continue;
		r = parse_rank(env_in(env, len, p->var));
		if (r < 0 || r >= p->n) { /* another child of the launcher (ssh to a host...), or one in exec */
			double since = now;
			for (int i = 0; i < onu; i++)
				if (oupid[i] == (int)pid)
					since = ouseen[i];
			if (nu < (int)LOOM_ARRAY_LEN(p->upid))
				p->upid[nu] = (int)pid, p->useen[nu] = since, nu++;
			p->unnamed += now - since < NEVER_SEEN_S;
			continue;
		}
		p->pid[r] = (int)pid;
		if (p->mark) { /* "pid (comm) S ...": the name between the first '(' and the last ')' */
			char *o = strchr(stat, '(');
			size_t ml = strlen(p->mark);
			if (o && (size_t)(q - o - 1) == ml && strncmp(o + 1, p->mark, ml) == 0)
				p->marked[r] = 1;
		}
	}
	closedir(d);
	p->nu = nu;
	p->scans++;
	if (p->first == 0)
		p->first = now;
}

int loom__shm_peers_gone(loom_shm_peers_t *p, int r, char *why, size_t cap)
{
	double now = loom_now();
	if (!p->var || r < 0 || r >= p->n)
		return 0;
	if (now >= p->next) {
		scan(p, now);
		p->next = now + SCAN_EVERY_S;
	}
	if (p->pid[r] > 0)
		return 0;
	if (p->pid[r] < 0) {
		snprintf(why, cap, "rank %d (pid %d) exited or died", r, -p->pid[r]);
		return 1;
	}
	if (p->unnamed == 0 && p->scans >= 5 && now - p->first >= NEVER_SEEN_S) {
		snprintf(why, cap, "rank %d has no process on this host under the launcher (pid %d, %s=%d): it exited "
		         "or died",
		         r, (int)p->ppid, p->var, r);
		return 1;
	}
	return 0;
}
