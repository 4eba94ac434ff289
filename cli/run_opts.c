/* run_opts.c: `loom run`'s flags (torchrun's, in both spellings), their checks, and the help text.
 *
 * Invariants: after run_parse_opts returns, every field is valid (1 <= nproc <= RUN_MAX_RANKS,
 * nnodes == 1 (elastic: 1 <= nnodes_min <= nnodes_max, with a hostfile), 0 <= node_rank < nnodes, 1 <= port <= 65535, job_id made of [A-Za-z0-9_.-] so it is
 * safe in /dev/shm names) and argv holds at least PROGRAM. Anything else ends the process with
 * exit code 2 and a message naming the flag, the value and what was expected. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "loom/util.h"
#include "run_opts.h"

static void usage(FILE *f)
{
	fprintf(f,
	        "usage: loom run [--nproc-per-node N] [--standalone] [--nnodes 1 --node-rank 0]\n"
	        "                [--master-addr A] [--master-port P] [--ranks LIST] PROGRAM [ARGS...]\n"
	        "\n"
	        "Start N processes (ranks) of PROGRAM as one job, as torchrun does, and supervise them.\n"
	        "\n"
	        "  --nproc-per-node N   ranks to start (default 1; 'auto' or 'cpu': one per CPU)\n"
	        "  --standalone         single-node job on a free local port (MASTER_PORT)\n"
	        "  --nnodes K           nodes in the job: 1, or with --hostfile MIN:MAX (elastic: lose and\n"
	        "                       regain hosts between MIN and MAX without an operator; docs/launcher.md)\n"
	        "  --elastic-dir DIR    with --nnodes MIN:MAX: the launcher's files shared with the ranks (default\n"
	        "                       .loom-elastic-<job id> here; on a filesystem every host sees, as --save-dir)\n"
	        "  --elastic-rescue 0|1 with --nnodes MIN:MAX: after a lost host, restart from the training state\n"
	        "                       the survivors keep in RAM (/dev/shm, one copy per host) when every rank\n"
	        "                       holds a whole replica (default 1); 0: always from the checkpoint on disk\n"
	        "  --node-rank I        this node's rank (GROUP_RANK), 0 <= I < K (default 0)\n"
	        "  --master-addr A      MASTER_ADDR (default 127.0.0.1)\n"
	        "  --master-port P      MASTER_PORT (default 29500)\n"
	        "  --hostfile FILE      run across the hosts of FILE (one per line) with mpirun, N ranks\n"
	        "                       on each; prints the mpirun command (docs/multinode.md)\n"
	        "  --ranks LIST         show only these ranks' output, e.g. 0 or 0,2 or 0-3\n"
	        "                       (also torchrun's --local-ranks-filter)\n"
	        "  -m, --module         PROGRAM is a Python module: run `python3 -u -m PROGRAM ARGS`\n"
	        "  --no-python          exec PROGRAM as it is, even a .py file\n"
	        "  --log-dir DIR        also write each rank's output to DIR/attempt_K/RANK/stdout.log and\n"
	        "                       stderr.log (K: the restart count)\n"
	        "  --tee N              with --log-dir: streams N (1 stdout, 2 stderr, 3 both) go to the files\n"
	        "                       and to the console (the default for both)\n"
	        "  --redirects N        with --log-dir: streams N go to the files only\n"
	        "  --max-restarts K     when a rank fails, stop all and start them again, up to K times\n"
	        "                       (TORCHELASTIC_RESTART_COUNT tells them which attempt; default 0)\n"
	        "  --monitor-interval S the longest the supervisor sleeps between checks (default: it wakes\n"
	        "                       on every exit and output at once)\n"
	        "  --help               this text\n"
	        "torchrun's spellings (--nproc_per_node, --node_rank, --master_addr, --master_port, --no_python,\n"
	        "--log_dir, --max_restarts, --monitor_interval) work too.\n"
	        "\n"
	        "PROGRAM ending in .py runs with the current Python, as torchrun runs it: $PYTHON, else python3\n"
	        "from PATH, as `python3 -u PROGRAM ARGS`. Any other PROGRAM is executed directly (torchrun would\n"
	        "run it with Python too; give python3 explicitly for that).\n"
	        "\n"
	        "Each rank gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE,\n"
	        "ROLE_RANK, ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOOM_JOB_ID (fresh unless you set it;\n"
	        "names the job's communicators, loom-<id>@*) and, with more than one rank, OMP_NUM_THREADS=1\n"
	        "unless it is set (or empty). Each line a rank writes is prefixed \"[rank r] \" on the same\n"
	        "stream (stdout or stderr); '\\r' progress lines are kept as such. Ranks read loom run's stdin,\n"
	        "or /dev/null when that is a terminal.\n"
	        "\n"
	        "When a rank exits non-zero or dies of a signal, the others get SIGTERM and, after\n"
	        "LOOM_KILL_GRACE_S seconds (default 5), SIGKILL; loom run names the rank that failed first.\n"
	        "SIGINT, SIGTERM and SIGHUP are forwarded to the ranks (a second one kills them). Ranks run\n"
	        "in their own process groups, so their children are signalled too, and die with loom run.\n"
	        "Files left in /dev/shm under the job's name (/dev/shm/loom-<id>@*) are removed at the end.\n"
	        "\n"
	        "Elastic (--nnodes MIN:MAX --hostfile FILE): a lost host shrinks the job to the hosts that answer\n"
	        "(at least MIN), a host that answers again grows it back at the next checkpoint (at most MAX);\n"
	        "loom train --resume continues on the new mesh. LOOM_ELASTIC_PROBE_S (default 5) and\n"
	        "LOOM_ELASTIC_PROBE_TIMEOUT_S (default 10) time the probes of hosts; --max-restarts counts\n"
	        "failures only. See docs/launcher.md.\n"
	        "\n"
	        "Exit code: 0 when every rank exited 0; 1 when a rank failed; 2 for a usage error;\n"
	        "126/127 when PROGRAM cannot be executed; when interrupted, loom run dies of that signal.\n");
}

/* ---- options ------------------------------------------------------------------------------- */

/* Accept --a-b and torchrun's --a_b for flag `name` (given with dashes). */
static int flag2(int argc, char **argv, int *i, const char *name, const char **val)
{
	char alt[64];
	size_t k;
	if (cli_flag(argc, argv, i, name, val))
		return 1;
	snprintf(alt, sizeof alt, "%s", name);
	for (k = 2; alt[k]; k++)
		if (alt[k] == '-')
			alt[k] = '_';
	return cli_flag(argc, argv, i, alt, val);
}

static long parse_range(const char *flag, const char *s, long lo, long hi)
{
	long long v = cli_parse_int("run", flag, s);
	if (v < lo || v > hi)
		cli_die("run", "%s: %lld is out of range (expected %ld..%ld)", flag, v, lo, hi);
	return (long)v;
}

/* --ranks "0,2,4-7": mark the ranks whose output is shown. */
static void parse_ranks(const char *s, unsigned char *show, int world)
{
	const char *p = s;
	memset(show, 0, (size_t)world);
	while (*p) {
		char *end;
		long a, b;
		errno = 0;
		a = strtol(p, &end, 10);
		if (end == p || errno || a < 0)
			cli_die("run", "--ranks: '%s' is not a list of ranks (e.g. 0 or 0,2 or 0-3)", s);
		b = a;
		if (*end == '-') {
			p = end + 1;
			b = strtol(p, &end, 10);
			if (end == p || errno || b < a)
				cli_die("run", "--ranks: '%s' is not a list of ranks (e.g. 0 or 0,2 or 0-3)", s);
		}
		if (b >= world)
			cli_die("run", "--ranks: rank %ld does not exist (the job has ranks 0..%d)", b, world - 1);
		for (long r = a; r <= b; r++)
			show[r] = 1;
		if (*end == ',' && end[1])
			end++;
		else if (*end)
			cli_die("run", "--ranks: '%s' is not a list of ranks (e.g. 0 or 0,2 or 0-3)", s);
		p = end;
	}
}

/* A port nobody listens on now (the kernel's choice for port 0), or -1. */
static int free_port(void)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
	socklen_t n = sizeof a;
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), port = -1;
	if (fd < 0)
		return -1;
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &n) == 0)
		port = ntohs(a.sin_port);
	close(fd);
	return port;
}

static int valid_job_id(const char *s)
{
	if (!*s || strlen(s) > 48)
		return 0;
	for (; *s; s++)
		if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '_' ||
		      *s == '-' || *s == '.'))
			return 0;
	return 1;
}

/* PROGRAM through Python, as torchrun runs it: a .py file (unless --no-python) or a module (-m). */
static void python_argv(run_opts_t *o, int n)
{
	const char *py = getenv("PYTHON"), *prog = o->argv[0];
	size_t len = strlen(prog);
	int k = 0;
	if (o->no_python || (!o->module && !(len > 3 && strcmp(prog + len - 3, ".py") == 0)))
		return;
	if (!(o->py_argv = calloc((size_t)n + 4, sizeof *o->py_argv)))
		cli_die("run", "out of memory");
	o->py_argv[k++] = (char *)(py && *py ? py : "python3");
	o->py_argv[k++] = "-u"; /* unbuffered, so lines reach the prefixing pipe as written */
	if (o->module)
		o->py_argv[k++] = "-m";
	for (int a = 0; a < n; a++)
		o->py_argv[k++] = o->argv[a];
	o->py_argv[k] = NULL;
	o->argv = o->py_argv;
}

void run_parse_opts(int argc, char **argv, run_opts_t *o)
{
	const char *v, *ranks = NULL, *nnodes = NULL, *node_rank = NULL, *port = NULL;
	int i;
	memset(o, 0, sizeof *o);
	o->nproc = 1, o->nnodes = 1, o->addr = NULL;
	for (i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (strcmp(a, "--") == 0) {
			i++;
			break;
		}
		if (a[0] != '-' || a[1] == '\0')
			break;
		if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
			usage(stdout);
			exit(0);
		} else if (strcmp(a, "--standalone") == 0) {
			o->standalone = 1;
		} else if (flag2(argc, argv, &i, "--nproc-per-node", &v)) {
			if (strcmp(v, "auto") == 0 || strcmp(v, "cpu") == 0) {
				long n = sysconf(_SC_NPROCESSORS_ONLN);
				o->nproc = n > 0 ? (int)(n < RUN_MAX_RANKS ? n : RUN_MAX_RANKS) : 1;
			} else {
				o->nproc = (int)parse_range("--nproc-per-node", v, 1, RUN_MAX_RANKS);
			}
		} else if (flag2(argc, argv, &i, "--nnodes", &v)) {
			nnodes = v;
		} else if (flag2(argc, argv, &i, "--node-rank", &v)) {
			node_rank = v;
		} else if (flag2(argc, argv, &i, "--master-addr", &v)) {
			if (!*v)
				cli_die("run", "--master-addr: empty address");
			o->addr = v;
		} else if (flag2(argc, argv, &i, "--elastic-dir", &v)) {
			if (!*v)
				cli_die("run", "--elastic-dir: empty path");
			o->elastic_dir = v;
		} else if (flag2(argc, argv, &i, "--elastic-rescue", &v)) {
			if (strcmp(v, "0") != 0 && strcmp(v, "1") != 0)
				cli_die("run", "--elastic-rescue %s: expected 0 (recover from the checkpoint on disk) or 1 (from the "
				        "survivors' state in memory when they hold whole replicas)", v);
			o->elastic_rescue = v[0] == '1', o->elastic_rescue_set = 1;
		} else if (flag2(argc, argv, &i, "--hostfile", &v)) {
			o->hostfile = v;
		} else if (flag2(argc, argv, &i, "--master-port", &v)) {
			port = v;
		} else if (cli_flag(argc, argv, &i, "--ranks", &v) || flag2(argc, argv, &i, "--local-ranks-filter", &v)) {
			ranks = v;
		} else if (strcmp(a, "-m") == 0 || strcmp(a, "--module") == 0) {
			o->module = 1;
		} else if (strcmp(a, "--no-python") == 0 || strcmp(a, "--no_python") == 0) {
			o->no_python = 1;
		} else if (flag2(argc, argv, &i, "--log-dir", &v)) {
			if (!*v)
				cli_die("run", "--log-dir: empty path");
			o->log_dir = v;
		} else if (cli_flag(argc, argv, &i, "--tee", &v) || cli_flag(argc, argv, &i, "-t", &v)) {
			o->tee = (int)parse_range("--tee", v, 0, 3);
		} else if (cli_flag(argc, argv, &i, "--redirects", &v) || cli_flag(argc, argv, &i, "-r", &v)) {
			o->redirects = (int)parse_range("--redirects", v, 0, 3);
		} else if (flag2(argc, argv, &i, "--max-restarts", &v)) {
			o->max_restarts = (int)parse_range("--max-restarts", v, 0, 1000000);
		} else if (flag2(argc, argv, &i, "--monitor-interval", &v)) {
			o->monitor_s = cli_parse_double("run", "--monitor-interval", v);
			if (!(o->monitor_s > 0 && o->monitor_s <= 3600))
				cli_die("run", "--monitor-interval: %s is not a number of seconds in (0, 3600]", v);
		} else {
			cli_die("run", "unknown flag '%s' (see loom run --help)", a);
		}
	}
	if (nnodes) { /* torchrun's K or MIN:MAX */
		const char *colon = strchr(nnodes, ':');
		char lo[32];
		long max;
		snprintf(lo, sizeof lo, "%.*s", colon ? (int)(colon - nnodes) : (int)strlen(nnodes), nnodes);
		max = parse_range("--nnodes", colon ? colon + 1 : nnodes, 1, 1L << 20);
		if (colon)
			o->nnodes_min = (int)parse_range("--nnodes", lo, 1, max);
		if (colon && o->hostfile) { /* elastic over the hostfile's hosts (run_elastic.c) */
			o->elastic = 1, o->nnodes_max = (int)(max < RUN_MAX_HOSTS ? max : RUN_MAX_HOSTS);
		} else if (max > 1) {
			fprintf(stderr,
			        "loom run: --nnodes %s: loom does not rendezvous across hosts as torchrun does; start a multi-node "
			        "job with\n  loom run --hostfile FILE --nproc-per-node N PROGRAM ...   (runs mpirun for you)\n"
			        "  mpirun -np K*N --host a:N,b:N PROGRAM ...\n  srun -N K --ntasks-per-node N --mpi=pmix PROGRAM ...\n"
			        "(see docs/multinode.md)\n",
			        nnodes);
			if (colon)
				fprintf(stderr, "elastic MIN:MAX runs over a hostfile: loom run --nnodes %s --hostfile FILE "
				        "--nproc-per-node N PROGRAM ... (docs/launcher.md)\n", nnodes);
			if (!loom_build_info()->mpi)
				fprintf(stderr, "and this loom was built without MPI, which all three need: %s\n", RUN_MPI_REMEDY);
			exit(2);
		}
	}
	if (o->elastic_dir && !o->elastic)
		cli_die("run", "--elastic-dir is for an elastic job (--nnodes MIN:MAX --hostfile FILE)");
	if (o->elastic_rescue_set && !o->elastic)
		cli_die("run", "--elastic-rescue is for an elastic job (--nnodes MIN:MAX --hostfile FILE)");
	if (!o->elastic_rescue_set)
		o->elastic_rescue = 1;
	if (node_rank)
		o->node_rank = (int)parse_range("--node-rank", node_rank, 0, o->nnodes - 1);
	o->port = port ? (int)parse_range("--master-port", port, 1, 65535) : 29500;
	if (o->standalone) {
		if (o->addr || port)
			fprintf(stderr, "loom run: --standalone: ignoring --master-addr/--master-port (it picks a free local port)\n");
		o->addr = NULL;
		if ((o->port = free_port()) < 0) {
			fprintf(stderr, "loom run: --standalone: cannot find a free local port: %s\n", strerror(errno));
			exit(1);
		}
	}
	if (!o->addr)
		o->addr = "127.0.0.1";
	if (i >= argc)
		cli_die("run", "missing PROGRAM to run (see loom run --help)");
	o->argv = argv + i;
	python_argv(o, argc - i);
	if ((o->tee || o->redirects) && !o->log_dir)
		cli_die("run", "--tee and --redirects need --log-dir DIR (where the files go)");
	if (o->module && o->no_python)
		cli_die("run", "-m runs a Python module and --no-python runs none: give one of them");
	o->world = o->nproc * o->nnodes;
	o->show = malloc((size_t)o->world);
	if (!o->show)
		cli_die("run", "out of memory");
	memset(o->show, 1, (size_t)o->world);
	if (ranks)
		parse_ranks(ranks, o->show, o->world);
	{
		const char *g = getenv("LOOM_KILL_GRACE_S");
		char *end;
		o->grace_s = 5.0;
		if (g && *g) {
			o->grace_s = strtod(g, &end);
			if (*end || !(o->grace_s >= 0 && o->grace_s <= 86400))
				cli_die("run", "LOOM_KILL_GRACE_S='%s' is not a number of seconds in [0, 86400]", g);
		}
	}
	/* An id that an enclosing `loom run` made (it also sets LOOM_RUN_JOB_ID) belongs to that job:
	 * a loom run started inside one of its ranks needs its own. */
	v = getenv("LOOM_JOB_ID");
	if (v && *v && getenv("LOOM_RUN_JOB_ID") && strcmp(getenv("LOOM_RUN_JOB_ID"), v) == 0)
		v = NULL;
	if (v && *v) {
		if (!valid_job_id(v))
			cli_die("run", "LOOM_JOB_ID='%s' must be 1 to 48 characters from [A-Za-z0-9_.-]", v);
		snprintf(o->job_id, sizeof o->job_id, "%s", v);
	} else {
		unsigned long long rnd = 0;
		if (getrandom(&rnd, sizeof rnd, GRND_NONBLOCK) != (ssize_t)sizeof rnd)
			rnd = (unsigned long long)time(NULL) * 2654435761u ^ (unsigned long long)clock();
		snprintf(o->job_id, sizeof o->job_id, "%d-%012llx", (int)getpid(), rnd & 0xffffffffffffULL);
	}
}
