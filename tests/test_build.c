/* test_build.c: the public surface: a program outside the tree builds against loom through loom.pc
 * and the public headers alone, and runs; the archive defines only loom_ globals; the CLI includes
 * only public headers; the helpers made public for it behave as documented. And the build itself:
 * a copy of the tree rebuilt with another configuration (MPI off, then on, then other CFLAGS and
 * LDFLAGS) rebuilds what the change affects and reports what it was built with. */
#include <dirent.h>
#include <libgen.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "loom/comm.h"
#include "loom/util.h"
#include "test.h"

TEST(pkgconfig_example)
{
	char bin[4096], dir[4096], tmp[4096], cmd[16384], out[8192];
	snprintf(bin, sizeof bin, "%s", test_loom_bin());
	snprintf(dir, sizeof dir, "%s", dirname(bin)); /* the build directory holding loom.pc */
	CHECK(test_mkdtemp(tmp, sizeof tmp) == 0);
	snprintf(cmd, sizeof cmd, "cc -std=c11 -Wall -Wextra -Werror examples/allreduce.c $(pkg-config --cflags --libs %s/loom.pc) -o %s/allreduce",
	         dir, tmp);
	int rc = test_run_cmd(cmd, out, sizeof out, 120);
	CHECK_MSG(rc == 0, "build failed (%d): %s", rc, out);
	/* One process, no launcher: a job of one rank. */
	snprintf(cmd, sizeof cmd, "env -u RANK -u WORLD_SIZE -u LOCAL_RANK -u LOCAL_WORLD_SIZE LOOM_JOB_ID=pc%d %s/allreduce", (int)getpid(), tmp);
	rc = test_run_cmd(cmd, out, sizeof out, 30);
	CHECK_MSG(rc == 0, "run failed (%d): %s", rc, out);
	CHECK_STREQ(out, "rank 0 of 1: 0 1 0 -1\n");
	test_rmdir(tmp);
	return 0;
}

/* Every global symbol libloom.a defines starts with loom_ (internal ones with loom__), so a program
 * with its own matmul_forward or read_file links against loom. */
TEST(archive_symbols_prefixed)
{
	char bin[4096], cmd[8400];
	static char out[1 << 16]; /* the list passed 16 KB with the llama family, tokenizer.json and HF directories */
	snprintf(bin, sizeof bin, "%s", test_loom_bin());
	snprintf(cmd, sizeof cmd, "nm -g --defined-only %s/libloom.a | awk 'NF == 3 {print $3}' | sort -u", dirname(bin));
	int rc = test_run_cmd(cmd, out, sizeof out, 60);
	CHECK_MSG(rc == 0, "nm failed (%d): %s", rc, out);
	int total = 0, bad = 0;
	char list[4096] = "";
	for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
		total++;
		/* under ASan, each global variable loom_x also gets an ODR indicator __odr_asan.loom_x */
		const char *name = strncmp(line, "__odr_asan.", 11) == 0 ? line + 11 : line;
		if (strncmp(name, "loom_", 5) != 0 && ++bad < 40)
			snprintf(list + strlen(list), sizeof list - strlen(list), " %s", line);
	}
	CHECK_MSG(total > 100, "nm listed only %d symbols: %s", total, out);
	CHECK_MSG(bad == 0, "%d global symbols without the loom_ prefix:%s", bad, list);
	return 0;
}

/* The CLI is a program like any other: its files include loom's public headers ("loom/...") and the
 * CLI's own (cli.h, run_opts.h, run_output.h), never the library's internals under src/. */
TEST(cli_public_headers_only)
{
	static const char *const own[] = {"cli.h", "run_opts.h", "run_output.h", "train_memory.h"};
	char path[512], line[1024], bad[2048] = "";
	int files = 0, includes = 0;
	DIR *d = opendir("cli");
	struct dirent *e;
	CHECK_MSG(d != NULL, "cannot list cli/ (run the tests from the source tree)");
	while ((e = readdir(d))) {
		size_t len = strlen(e->d_name);
		FILE *f;
		if (len < 3 || (strcmp(e->d_name + len - 2, ".c") != 0 && strcmp(e->d_name + len - 2, ".h") != 0))
			continue;
		snprintf(path, sizeof path, "cli/%s", e->d_name);
		f = fopen(path, "r");
		CHECK_MSG(f != NULL, "cannot read %s", path);
		files++;
		for (int ln = 1; fgets(line, sizeof line, f); ln++) {
			const char *p = line, *q;
			int ok = 0;
			while (*p == ' ' || *p == '\t')
				p++;
			if (*p++ != '#')
				continue;
			while (*p == ' ' || *p == '\t')
				p++;
			if (strncmp(p, "include", 7) != 0)
				continue;
			for (p += 7; *p == ' ' || *p == '\t'; p++)
				;
			if (*p != '"')
				continue; /* <system> headers */
			includes++;
			q = strchr(++p, '"');
			CHECK_MSG(q != NULL, "%s:%d: malformed #include", path, ln);
			if (strncmp(p, "loom/", 5) == 0) { /* a header that include/loom/ has */
				struct stat sb;
				char hdr[1100];
				snprintf(hdr, sizeof hdr, "include/%.*s", (int)(q - p), p);
				ok = stat(hdr, &sb) == 0 && S_ISREG(sb.st_mode) && !strstr(hdr, "..");
			}
			for (size_t k = 0; k < sizeof own / sizeof own[0]; k++)
				ok |= (size_t)(q - p) == strlen(own[k]) && strncmp(p, own[k], strlen(own[k])) == 0;
			if (!ok)
				snprintf(bad + strlen(bad), sizeof bad - strlen(bad), " %s:%d \"%.*s\"", path, ln, (int)(q - p), p);
		}
		fclose(f);
	}
	closedir(d);
	CHECK_MSG(files >= 10 && includes >= 20, "found only %d files with %d includes under cli/", files, includes);
	CHECK_MSG(bad[0] == '\0', "cli/ includes non-public headers:%s", bad);
	return 0;
}

/* What the CLI needed from the internals, now public: the clock, aligned buffers and the collective
 * algorithm selection (loom/util.h, loom/comm.h). */
static int rank_algo_api(int rank, int n, void *arg)
{
	loom_comm_t *c;
	(void)rank, (void)n, (void)arg;
	CHECK_OK(loom_comm_init(&c));
	/* one rank: the rule's first allreduce entry up to 64 KiB, the ring beyond; allgather forced */
	CHECK_STREQ(loom_comm_algo(c, "allreduce", 65536), "rd");
	CHECK_STREQ(loom_comm_algo(c, "allreduce", 65537), "ring");
	CHECK_STREQ(loom_comm_algo(c, "allgather", 8), "ring");
	CHECK_STREQ(loom_comm_algo(c, "reduce_scatter", 8), "rhd");
	CHECK_STREQ(loom_comm_algo(c, "broadcast", 1 << 30), "tree");
	CHECK_STREQ(loom_comm_algo(c, "barrier", 0), "rd");
	CHECK(loom_comm_algo(c, "alltoall", 8) == NULL);
	CHECK(loom_comm_algo(NULL, "allreduce", 8) == NULL);
	CHECK_OK(loom_comm_destroy(c));
	return 0;
}

TEST(public_util_and_algo_api)
{
	static const char *const env[] = {"LOOM_ALGO=allgather:ring", NULL};
	char *text = NULL;
	size_t len = 0;
	FILE *f;
	double t0 = loom_now(), t1;
	unsigned char *p = loom_alloc_aligned(1000);
	CHECK(p != NULL);
	CHECK_EQ((uintptr_t)p % 64, 0);
	for (int i = 0; i < 1000; i++)
		CHECK_EQ(p[i], 0);
	loom_free_aligned(p);
	t1 = loom_now();
	CHECK(t0 > 0 && t1 >= t0 && t1 - t0 < 60);

	CHECK_OK(loom_comm_algo_check(NULL));
	CHECK_OK(loom_comm_algo_check(""));
	CHECK_OK(loom_comm_algo_check("allreduce:ring,allgather:rd"));
	CHECK_ERR(loom_comm_algo_check("allgather:tree"), LOOM_EINVAL);
	CHECK_STREQ(loom_errmsg(), "LOOM_ALGO=\"allgather:tree\": algorithm \"tree\" does not implement allgather (valid "
	                           "for allgather: auto, ring, rd)");
	CHECK_ERR(loom_comm_algo_check("ring"), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "is not OP:ALGO");

	f = open_memstream(&text, &len);
	CHECK(f != NULL);
	loom_comm_algo_rule(f);
	CHECK(fclose(f) == 0);
	CHECK_CONTAINS(text, "# allreduce      rd if ranks <= 2 and bytes <= 64 KiB; ring if ranks <= 2; rd if bytes <= "
	                     "8 KiB; rhd if bytes <= 4 MiB; ring otherwise   (LOOM_ALGO=allreduce:{auto, ring, rhd, rd, "
	                     "tree})\n");
	CHECK_CONTAINS(text, "# barrier        rd always   (LOOM_ALGO=barrier:{auto, rd, tree})\n");
	free(text);

	CHECK_EQ(test_spawn(1, rank_algo_api, NULL, 30, env), 0);
	return 0;
}

/* ---- the build tracks its configuration (issue 34: a build that cannot go stale) ---- */

#define BUILD_OUT_CAP (1 << 19)

/* Run `cd DIR && CMD` (printf-style) with make's own variables of an enclosing `make test` removed
 * (its jobserver and command-line variables are not this build's); the output goes to out. */
static int in_copy(const char *dir, char *out, double timeout_s, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static int in_copy(const char *dir, char *out, double timeout_s, const char *fmt, ...)
{
	char cmd[8192];
	/* make puts the variables of its own command line (make test SANITIZER=...) into its recipes'
	 * environment too: the copy's make must see none of them */
	int n = snprintf(cmd, sizeof cmd,
	                 "cd '%s' && env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL -u MAKEOVERRIDES -u MPI -u SANITIZER -u ARCH "
	                 "-u OPT -u CC -u CFLAGS -u CPPFLAGS -u LDFLAGS -u LDLIBS ",
	                 dir);
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(cmd + n, sizeof cmd - (size_t)n, fmt, ap);
	va_end(ap);
	return test_run_cmd(cmd, out, BUILD_OUT_CAP, timeout_s);
}

/* The objects of the copy's build/ that are not newer than `stamp` (relative to the copy), as one
 * line of paths into out; "" when every object is newer. */
static int objects_not_newer(const char *dir, const char *stamp, char *out)
{
	int rc = in_copy(dir, out, 60, "find build -name '*.o' ! -newer %s | sort | tr '\\n' ' '", stamp);
	CHECK_MSG(rc == 0, "find failed (%d): %s", rc, out);
	return 0;
}

/* `loom run --hostfile` of the copy's loom over the two-host cluster of scripts/netns-cluster.sh
 * (2 network namespaces x 2 ranks, mpirun between them, as tests/test_multinode.c runs it): a
 * `loom bench comm` all-reduce of 4 ranks on two hosts joins and is exact. Skipped (1 in *skipped)
 * where the cluster cannot be made. */
static int two_host_job(const char *dir, char *out, const char *why_not)
{
	char script[4096];
	int p = (int)getpid() % 100000, rc;
	if (why_not) {
		printf("  the two-host job skipped: %s\n", why_not);
		return 0;
	}
	CHECK(realpath("scripts/netns-cluster.sh", script) != NULL);
	rc = in_copy(dir, out, 150,
	             "export LOOM_NETNS_PREFIX=lb%d; trap '%s down' EXIT; %s up && LOOM_MPIRUN='%s mpirun' "
	             "timeout 120 build/loom run --hostfile hosts --nproc-per-node 2 %s/build/loom bench comm --op allreduce "
	             "-b 1M -e 1M -n 3 -w 1",
	             p, script, script, script, dir);
	CHECK_MSG(rc == 0, "the two-host job failed (%d):\n%s", rc, out);
	CHECK_CONTAINS(out, " -np 4 --host 10.231.7.1:2,10.231.7.2:2 ");
	CHECK_CONTAINS(out, "# loom bench comm: 4 ranks");
	CHECK_CONTAINS(out, " h-pipe "); /* the all-reduce across two hosts */
	CHECK_CONTAINS(out, "# Out of bounds values : 0 OK");
	rc = test_run_cmd("ip netns list 2>/dev/null | grep '^lb' || true", out, BUILD_OUT_CAP, 10);
	CHECK_EQ(rc, 0);
	{
		char mine[32];
		snprintf(mine, sizeof mine, "lb%d", p);
		CHECK_MSG(strstr(out, mine) == NULL, "namespaces left behind: %s", out);
	}
	return 0;
}

/* The body of build_tracks_its_configuration, in the copy `dir`. */
static int build_configurations(const char *dir, char *out, const char *why_not)
{
	char cmd[4096];
	int rc;
	/* the tree as the working copy has it (uncommitted and new files included), without build/ */
	snprintf(cmd, sizeof cmd,
	         "git ls-files -z --cached --others --exclude-standard | tar --null --ignore-failed-read -T - -cf - "
	         "2>/dev/null | tar -C '%s' -xf - && printf '10.231.7.1\\n10.231.7.2\\n' > '%s/hosts' && "
	         "printf '#!/bin/sh\\ntouch \"%s/mpirun-ran\"\\n' > '%s/fake-mpirun' && chmod +x '%s/fake-mpirun'",
	         dir, dir, dir, dir, dir);
	rc = test_run_cmd(cmd, out, BUILD_OUT_CAP, 120);
	CHECK_MSG(rc == 0, "copying the tree failed (%d): %s", rc, out);

	/* without MPI */
	rc = in_copy(dir, out, 1200, "make -j2 OPT=-O0 MPI=0 all");
	CHECK_MSG(rc == 0, "make MPI=0 failed (%d):\n%s", rc, out);
	CHECK_EQ(in_copy(dir, out, 30, "build/loom --version"), 0);
	CHECK_CONTAINS(out, "\nmpi: no (a job stays on one host; to span hosts, install libopenmpi-dev and run make again");
	CHECK_EQ(in_copy(dir, out, 30, "grep '^MPI = ' build/compile.stamp"), 0);
	CHECK_STREQ(out, "MPI = 0 \n");
	CHECK_EQ(in_copy(dir, out, 60, "nm -g --defined-only build/libloom.a | grep -c ' T loom__mpi_' || true"), 0);
	CHECK_STREQ(out, "0\n");
	rc = in_copy(dir, out, 30, "LOOM_MPIRUN='%s/fake-mpirun' build/loom run --hostfile hosts --nproc-per-node 2 "
	             "build/loom --version", dir);
	CHECK_EQ(rc, 2);
	CHECK_CONTAINS(out, "loom run: --hostfile hosts: this loom was built without MPI (`loom --version` says \"mpi: "
	                    "no\"), so the ranks of a job across hosts cannot join; install libopenmpi-dev (`make deps` "
	                    "installs what is missing) and run make again: it rebuilds loom with MPI by itself");
	CHECK_EQ(in_copy(dir, out, 10, "test ! -e mpirun-ran"), 0); /* nothing started */
	rc = in_copy(dir, out, 30, "build/loom run --nnodes 2 --nproc-per-node 1 build/loom --version");
	CHECK_EQ(rc, 2);
	CHECK_CONTAINS(out, "and this loom was built without MPI, which all three need: install libopenmpi-dev");

	/* MPI installed (it is, here): plain make rebuilds everything, without make clean */
	rc = in_copy(dir, out, 1200, "make -j2 OPT=-O0 all");
	CHECK_MSG(rc == 0, "make failed (%d):\n%s", rc, out);
	CHECK_CONTAINS(out, "build/compile.stamp: changed, rebuilding what depends on it");
	CHECK_EQ(objects_not_newer(dir, "build/compile.stamp", out), 0);
	CHECK_MSG(out[0] == '\0', "objects of the MPI=0 build left in place: %s", out);
	CHECK_EQ(in_copy(dir, out, 30, "grep -c '^MPI = 1 ' build/compile.stamp"), 0);
	CHECK_EQ(in_copy(dir, out, 30, "build/loom --version"), 0);
	CHECK_CONTAINS(out, "\nmpi: yes, Open MPI v");
	CHECK_EQ(in_copy(dir, out, 60, "nm -g --defined-only build/libloom.a | grep -c ' T loom__mpi_layout$' || true"), 0);
	CHECK_STREQ(out, "1\n");
	CHECK_EQ(two_host_job(dir, out, why_not), 0);

	/* CFLAGS on the command line: every object again, and the binary says so */
	rc = in_copy(dir, out, 1200, "make -j2 OPT=-O0 CFLAGS=-DLOOM_STAMP_TEST=1 all");
	CHECK_MSG(rc == 0, "make CFLAGS=-DLOOM_STAMP_TEST=1 failed (%d):\n%s", rc, out);
	CHECK_CONTAINS(out, "build/compile.stamp: changed, rebuilding what depends on it");
	CHECK_CONTAINS(out, " -MMD -MP -DLOOM_STAMP_TEST=1 -c src/core/error.c ");
	CHECK_EQ(objects_not_newer(dir, "build/compile.stamp", out), 0);
	CHECK_MSG(out[0] == '\0', "objects built without the new CFLAGS left in place: %s", out);
	CHECK_EQ(in_copy(dir, out, 30, "build/loom --version"), 0);
	CHECK_CONTAINS(out, "\nmpi: yes, Open MPI v");
	CHECK_CONTAINS(out, "\ncompiler: gcc ");
	CHECK_CONTAINS(out, ", -O0, CFLAGS -DLOOM_STAMP_TEST=1\n");
	CHECK_EQ(two_host_job(dir, out, why_not), 0);

	/* the same make again does nothing */
	rc = in_copy(dir, out, 300, "make -j2 OPT=-O0 CFLAGS=-DLOOM_STAMP_TEST=1 all && find build -newer build/loom -type f");
	CHECK_MSG(rc == 0, "make failed (%d):\n%s", rc, out);
	CHECK_STREQ(out, "");
	/* a link flag relinks and compiles nothing */
	rc = in_copy(dir, out, 300, "make -j2 OPT=-O0 CFLAGS=-DLOOM_STAMP_TEST=1 LDFLAGS=-Wl,-O1 all");
	CHECK_MSG(rc == 0, "make LDFLAGS=-Wl,-O1 failed (%d):\n%s", rc, out);
	CHECK_CONTAINS(out, "build/link.stamp: changed, rebuilding what depends on it");
	CHECK_CONTAINS(out, " -Wl,-O1 -o build/loom ");
	CHECK_MSG(strstr(out, " -c ") == NULL, "a link flag recompiled:\n%s", out);
	CHECK_EQ(in_copy(dir, out, 30, "find build/loom build/loom.pc -newer build/link.stamp | sort | tr '\\n' ' '"), 0);
	CHECK_STREQ(out, "build/loom build/loom.pc ");
	return 0;
}

/* A copy of the source tree (git's files, without build/) is built with `make MPI=0`: `loom
 * --version` says "mpi: no", the archive has no MPI transport, and `loom run --hostfile` and `--nnodes
 * 2` refuse before starting anything, naming the remedy. Then plain `make` (MPI is installed here)
 * rebuilds every object (none is older than the stamp), the binary says "mpi: yes", has the MPI
 * transport and joins a job across two hosts. Then `make CFLAGS=-DLOOM_STAMP_TEST=1`: every object
 * again, the flag in `loom --version`, and the two-host job; the same make once more does nothing;
 * and a new LDFLAGS relinks without compiling anything. Every make of the copy has OPT=-O0 (unchanged
 * between them, so it changes nothing the test looks at): three builds of the tree at -O2 took 55 s of CI. */
TEST(build_tracks_its_configuration)
{
	static char out[BUILD_OUT_CAP];
	char dir[512], why_buf[256];
	const char *why_not = NULL;
	int rc;
	/* the copies build without the sanitizer (in_copy drops make's command-line variables): under it
	 * this test would repeat the plain pass's builds to the byte, at 40-80 s of CI */
	if (TEST_UNDER_ASAN)
		return TEST_SKIP("the copies build as in the plain pass, which runs this test: nothing sanitized to add");
	if (test_run_cmd("git rev-parse --show-toplevel && command -v make && pkg-config --exists ompi-c", out,
	                 BUILD_OUT_CAP, 30) != 0)
		return TEST_SKIP("needs the git checkout, make and OpenMPI's development files (libopenmpi-dev)");
	if (test_run_cmd("scripts/netns-cluster.sh check", out, BUILD_OUT_CAP, 30) != 0) {
		out[strcspn(out, "\n")] = '\0';
		snprintf(why_buf, sizeof why_buf, "two-host cluster unavailable: %.200s", out);
		why_not = why_buf;
	}
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	rc = build_configurations(dir, out, why_not);
	test_rmdir(dir); /* the copy and its build (~150 MB), also after a failure */
	return rc;
}
