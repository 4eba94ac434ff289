/* run_opts.h: `loom run`'s command line and environment settings (internal to the CLI). */
#ifndef LOOM_CLI_RUN_OPTS_H
#define LOOM_CLI_RUN_OPTS_H

#define RUN_MAX_RANKS 1024
#define RUN_MAX_HOSTS 256 /* hosts in a --hostfile */
#define RUN_HOST_NAME 64  /* longest host name + 1 */
#define RUN_MAX_ARGS 512  /* words of an mpirun command */

/* What to do when a launch needs MPI and this loom was built without it (loom_build_info()->mpi). */
#define RUN_MPI_REMEDY                                                                              \
	"install libopenmpi-dev (`make deps` installs what is missing) and run make again: it rebuilds " \
	"loom with MPI by itself (see docs/multinode.md)"

typedef struct {
	int nproc;     /* ranks on this node (--nproc-per-node) */
	int world;     /* ranks in the job: nproc * nnodes */
	int node_rank, nnodes, standalone, port;
	const char *addr;    /* MASTER_ADDR */
	unsigned char *show; /* [world]: 1 when the rank's output is shown (--ranks); owned, free() it */
	char **argv;         /* PROGRAM ARGS, NULL-terminated (points into the caller's argv) */
	double grace_s;      /* LOOM_KILL_GRACE_S: SIGTERM to SIGKILL */
	char job_id[64];     /* LOOM_JOB_ID: the caller's, or a fresh one */
	const char *hostfile; /* --hostfile: run the job across its hosts with mpirun (run_mpi.c) */
	/* torchrun parity (run_opts.c): how PROGRAM runs, per-rank log files, restarts */
	int module;          /* -m: PROGRAM is a Python module (python -u -m PROGRAM ARGS) */
	int no_python;       /* --no-python: exec PROGRAM as it is, even a .py */
	char **py_argv;      /* the argv built for Python (owned), or NULL: argv runs as it is */
	const char *log_dir; /* --log-dir: DIR/attempt_K/RANK/{stdout,stderr}.log, or NULL */
	int tee, redirects;  /* with --log-dir: streams (1 stdout, 2 stderr, 3 both) also shown / only in files */
	int max_restarts;    /* --max-restarts: restart every rank after a failure, up to this many times */
	double monitor_s;    /* --monitor-interval: the longest the supervisor sleeps between checks */
	/* elastic (run_elastic.c): --nnodes MIN:MAX with --hostfile */
	int elastic;             /* 1: MIN:MAX given with --hostfile */
	int nnodes_min, nnodes_max;
	const char *elastic_dir; /* --elastic-dir: the launcher's and the ranks' protocol files, or NULL */
	int elastic_rescue;      /* --elastic-rescue 0|1 (default 1): the in-memory recovery path */
	int elastic_rescue_set;  /* --elastic-rescue given */
} run_opts_t;

/* An mpirun command line (run_mpi.c) and the storage its words point into. */
typedef struct {
	char *argv[RUN_MAX_ARGS];
	int argc;
	char *words; /* LOOM_MPIRUN's words (owned) */
	char hosts[RUN_MAX_HOSTS * (RUN_HOST_NAME + 8)], np[32];
	char xvars[RUN_MAX_ARGS][128];
} run_cmd_t;

/* Parse `loom run`'s flags (argv[0] = "run") and environment into *o. Prints the help and exits 0
 * for --help; prints a clear message and exits 2 for anything invalid (--nnodes > 1 included, with
 * RUN_MPI_REMEDY in a loom built without MPI). */
void run_parse_opts(int argc, char **argv, run_opts_t *o);

/* --hostfile: build the mpirun command for o (every host of the file runs o->nproc ranks), print
 * it and exec it; returns only on failure (exit code: 2 for a bad hostfile, or in a loom built
 * without MPI before anything starts; 127 when mpirun cannot be executed). */
int run_mpirun(const run_opts_t *o);

/* Read a hostfile's host names into hosts[0..*n). Returns 0, or 2 after printing what is wrong with
 * the file (unreadable, empty, more than RUN_MAX_HOSTS hosts). */
int run_read_hostfile(const char *path, char hosts[][RUN_HOST_NAME], int *n);

/* Build into *c the mpirun command running prog (NULL-terminated) with nproc ranks on each of the nh
 * hosts (LOOM_MPIRUN's words first, -x for the forwarded environment). Returns 0, or -1 when out of
 * memory. Free with run_mpirun_cmd_free. */
int run_mpirun_cmd(run_cmd_t *c, const char *const *hosts, int nh, int nproc, char *const *prog);
void run_mpirun_cmd_free(run_cmd_t *c);

/* --nnodes MIN:MAX --hostfile FILE: the elastic launcher (run_elastic.c, docs/launcher.md). Returns
 * loom run's exit code. */
int run_elastic(const run_opts_t *o);

#endif
