/* run_mpi.c: `loom run --hostfile FILE --nproc-per-node N PROGRAM`: a job across hosts, started by
 * mpirun (loom's ranks join it through OpenMPI's environment and its MPI transport).
 *
 * The hostfile has one host per line (anything after the name, e.g. "slots=4", and lines starting
 * with '#' are ignored). The command is `mpirun -np H*N --host h1:N,h2:N,... -x VAR... PROGRAM ARGS`,
 * where the -x list forwards LOOM_*, OMP_NUM_THREADS (set to 1 when unset, as for local jobs) and the
 * sanitizers' ASAN_OPTIONS / UBSAN_OPTIONS.
 * LOOM_MPIRUN replaces "mpirun" (a command and its leading arguments, split at spaces: e.g. a
 * wrapper, or "mpirun --mca btl_tcp_if_include eth1"). The command is printed before it runs. A loom
 * built without MPI refuses before running anything, naming the remedy. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loom/util.h"
#include "run_opts.h"

extern char **environ;

#define MAX_HOSTS 256
#define MAX_ARGS 512

int run_mpirun(const run_opts_t *o)
{
	FILE *f;
	char line[512], hosts[8192] = "", np[32], *argv[MAX_ARGS], *words = NULL, *tok, *save;
	static char xvars[MAX_ARGS][128];
	int nh = 0, a = 0, nx = 0;
	size_t len = 0;
	if (!loom_build_info()->mpi) { /* its ranks could not join: refuse before mpirun starts any */
		fprintf(stderr, "loom run: --hostfile %s: this loom was built without MPI (`loom --version` says \"mpi: no\"), "
		        "so the ranks of a job across hosts cannot join; " RUN_MPI_REMEDY "\n", o->hostfile);
		return 2;
	}
	if (!(f = fopen(o->hostfile, "r"))) {
		fprintf(stderr, "loom run: --hostfile %s: %s\n", o->hostfile, strerror(errno));
		return 2;
	}
	while (fgets(line, sizeof line, f)) {
		char name[256];
		if (sscanf(line, " %255s", name) != 1 || name[0] == '#')
			continue;
		if (nh == MAX_HOSTS || len + strlen(name) + 16 >= sizeof hosts) {
			fprintf(stderr, "loom run: --hostfile %s: more than %d hosts\n", o->hostfile, MAX_HOSTS);
			fclose(f);
			return 2;
		}
		len += (size_t)snprintf(hosts + len, sizeof hosts - len, "%s%s:%d", nh ? "," : "", name, o->nproc);
		nh++;
	}
	fclose(f);
	if (nh == 0) {
		fprintf(stderr, "loom run: --hostfile %s: no hosts in it (one host name per line)\n", o->hostfile);
		return 2;
	}
	if (!getenv("OMP_NUM_THREADS") || !*getenv("OMP_NUM_THREADS"))
		setenv("OMP_NUM_THREADS", "1", 1);
	words = strdup(getenv("LOOM_MPIRUN") && *getenv("LOOM_MPIRUN") ? getenv("LOOM_MPIRUN") : "mpirun");
	if (!words)
		return 1;
	for (tok = strtok_r(words, " ", &save); tok && a < MAX_ARGS - 64; tok = strtok_r(NULL, " ", &save))
		argv[a++] = tok;
	if (geteuid() == 0)
		argv[a++] = "--allow-run-as-root";
	snprintf(np, sizeof np, "%d", nh * o->nproc);
	argv[a++] = "-np", argv[a++] = np, argv[a++] = "--host", argv[a++] = hosts;
	for (char **e = environ; *e && a < MAX_ARGS - 40 && nx < MAX_ARGS; e++) {
		size_t n = strcspn(*e, "=");
		if (n >= sizeof xvars[0] || !(strncmp(*e, "LOOM_", 5) == 0 || strncmp(*e, "OMP_NUM_THREADS=", 16) == 0 ||
		                              strncmp(*e, "ASAN_OPTIONS=", 13) == 0 || strncmp(*e, "UBSAN_OPTIONS=", 14) == 0))
			continue;
		if (strncmp(*e, "LOOM_MPIRUN=", 12) == 0 || strncmp(*e, "LOOM_RUN_JOB_ID=", 16) == 0 ||
		    strncmp(*e, "LOOM_JOB_ID=", 12) == 0)
			continue; /* the job id comes from mpirun's, the same on every host */
		snprintf(xvars[nx], sizeof xvars[nx], "%.*s", (int)n, *e);
		argv[a++] = "-x", argv[a++] = xvars[nx++];
	}
	for (char **p = o->argv; *p && a < MAX_ARGS - 1; p++)
		argv[a++] = *p;
	argv[a] = NULL;
	fprintf(stderr, "loom run: running:");
	for (int i = 0; i < a; i++)
		fprintf(stderr, " %s", argv[i]);
	fprintf(stderr, "\n");
	fflush(NULL);
	execvp(argv[0], argv);
	fprintf(stderr, "loom run: cannot execute %s: %s\n", argv[0], strerror(errno));
	free(words);
	return 127;
}
