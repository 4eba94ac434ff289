/* test_build.c: the public surface: a program outside the tree builds against loom through loom.pc
 * and the public headers alone, and runs; the archive defines only loom_ globals; the CLI includes
 * only public headers; the helpers made public for it behave as documented. */
#include <dirent.h>
#include <libgen.h>
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
	char bin[4096], cmd[8400], out[16384];
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
