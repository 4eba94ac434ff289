/* run_mpi.c: `loom run --hostfile FILE --nproc-per-node N PROGRAM`: a job across hosts, started by
 * mpirun (loom's ranks join it through OpenMPI's environment and its MPI transport).
 *
 * The hostfile has one host per line (anything after the name, e.g. "slots=4", and lines starting
 * with '#' are ignored). The command is `mpirun -np H*N --host h1:N,h2:N,... -x VAR... PROGRAM ARGS`,
 * where the -x list forwards LOOM_*, OMP_NUM_THREADS (set to 1 when unset, as for local jobs) and the
 * sanitizers' ASAN_OPTIONS / UBSAN_OPTIONS.
 * LOOM_MPIRUN replaces "mpirun" (a command and its leading arguments, split at spaces: e.g. a
 * wrapper, or "mpirun --mca btl_tcp_if_include eth1"). The command is printed before it runs. A loom
 * built without MPI refuses before running anything, naming the remedy. The elastic launcher
 * (run_elastic.c) builds its jobs and its probes of a host with the same command (run_mpirun_cmd). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loom/util.h"
#include "run_opts.h"

extern char **environ;

int run_read_hostfile(const char *path, char hosts[][RUN_HOST_NAME], int *n)
{
	FILE *f;
	char line[512];
	*n = 0;
	if (!(f = fopen(path, "r"))) {
		fprintf(stderr, "loom run: --hostfile %s: %s\n", path, strerror(errno));
		return 2;
	}
	while (fgets(line, sizeof line, f)) {
		char name[RUN_HOST_NAME];
		if (sscanf(line, " %63s", name) != 1 || name[0] == '#')
			continue;
		if (*n == RUN_MAX_HOSTS) {
			fprintf(stderr, "loom run: --hostfile %s: more than %d hosts\n", path, RUN_MAX_HOSTS);
			fclose(f);
			return 2;
		}
		snprintf(hosts[(*n)++], RUN_HOST_NAME, "%s", name);
	}
	fclose(f);
	if (*n == 0) {
		fprintf(stderr, "loom run: --hostfile %s: no hosts in it (one host name per line)\n", path);
		return 2;
	}
	return 0;
}

int run_mpirun_cmd(run_cmd_t *c, const char *const *hosts, int nh, int nproc, char *const *prog)
{
	size_t len = 0;
	int a = 0, nx = 0;
	memset(c, 0, sizeof *c);
	for (int h = 0; h < nh; h++)
		len += (size_t)snprintf(c->hosts + len, sizeof c->hosts - len, "%s%s:%d", h ? "," : "", hosts[h], nproc);
	if (!(c->words = strdup(getenv("LOOM_MPIRUN") && *getenv("LOOM_MPIRUN") ? getenv("LOOM_MPIRUN") : "mpirun")))
		return -1;
	for (char *save, *tok = strtok_r(c->words, " ", &save); tok && a < RUN_MAX_ARGS - 64; tok = strtok_r(NULL, " ", &save))
		c->argv[a++] = tok;
	if (geteuid() == 0)
		c->argv[a++] = "--allow-run-as-root";
	snprintf(c->np, sizeof c->np, "%d", nh * nproc);
	c->argv[a++] = "-np", c->argv[a++] = c->np, c->argv[a++] = "--host", c->argv[a++] = c->hosts;
	for (char **e = environ; *e && a < RUN_MAX_ARGS - 40 && nx < RUN_MAX_ARGS; e++) {
		size_t n = strcspn(*e, "=");
		if (n >= sizeof c->xvars[0] || !(strncmp(*e, "LOOM_", 5) == 0 || strncmp(*e, "OMP_NUM_THREADS=", 16) == 0 ||
		                                 strncmp(*e, "ASAN_OPTIONS=", 13) == 0 || strncmp(*e, "UBSAN_OPTIONS=", 14) == 0))
			continue;
		if (strncmp(*e, "LOOM_MPIRUN=", 12) == 0 || strncmp(*e, "LOOM_RUN_JOB_ID=", 16) == 0 ||
		    strncmp(*e, "LOOM_JOB_ID=", 12) == 0)
			continue; /* the job id comes from mpirun's, the same on every host */
		snprintf(c->xvars[nx], sizeof c->xvars[nx], "%.*s", (int)n, *e);
		c->argv[a++] = "-x", c->argv[a++] = c->xvars[nx++];
	}
	for (char *const *p = prog; *p && a < RUN_MAX_ARGS - 1; p++)
		c->argv[a++] = *p;
	c->argv[a] = NULL;
	c->argc = a;
	return 0;
}

void run_mpirun_cmd_free(run_cmd_t *c)
{
	free(c->words);
	c->words = NULL;
}

int run_mpirun(const run_opts_t *o)
{
	static char hosts[RUN_MAX_HOSTS][RUN_HOST_NAME];
	static run_cmd_t cmd;
	const char *names[RUN_MAX_HOSTS];
	int nh, rc;
	if (!loom_build_info()->mpi) { /* its ranks could not join: refuse before mpirun starts any */
		fprintf(stderr, "loom run: --hostfile %s: this loom was built without MPI (`loom --version` says \"mpi: no\"), "
		        "so the ranks of a job across hosts cannot join; " RUN_MPI_REMEDY "\n", o->hostfile);
		return 2;
	}
	if ((rc = run_read_hostfile(o->hostfile, hosts, &nh)) != 0)
		return rc;
	for (int h = 0; h < nh; h++)
		names[h] = hosts[h];
	if (!getenv("OMP_NUM_THREADS") || !*getenv("OMP_NUM_THREADS"))
		setenv("OMP_NUM_THREADS", "1", 1);
	if (run_mpirun_cmd(&cmd, names, nh, o->nproc, o->argv) != 0)
		return 1;
	fprintf(stderr, "loom run: running:");
	for (int i = 0; i < cmd.argc; i++)
		fprintf(stderr, " %s", cmd.argv[i]);
	fprintf(stderr, "\n");
	fflush(NULL);
	execvp(cmd.argv[0], cmd.argv);
	fprintf(stderr, "loom run: cannot execute %s: %s\n", cmd.argv[0], strerror(errno));
	run_mpirun_cmd_free(&cmd);
	return 127;
}
