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
