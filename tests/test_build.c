/* test_build.c: a program outside the tree builds against loom through loom.pc and the public headers
 * alone, and runs. */
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
		if (strncmp(line, "loom_", 5) != 0 && ++bad < 40)
			snprintf(list + strlen(list), sizeof list - strlen(list), " %s", line);
	}
	CHECK_MSG(total > 100, "nm listed only %d symbols: %s", total, out);
	CHECK_MSG(bad == 0, "%d global symbols without the loom_ prefix:%s", bad, list);
	return 0;
}
