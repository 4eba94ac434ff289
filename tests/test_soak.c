/* test_soak.c: bench/soak.sh's own short mode (issue 23): 2 ranks train a small model under
 * `loom run --max-restarts`, a rank is killed (SIGKILL) twice and the job restarted twice; the last
 * checkpoint equals an uninterrupted run's byte for byte, the JSONL log has every step once, and
 * nothing is left in /dev/shm, the process table or the save directory. */
#include "test.h"

TEST(soak_short)
{
	static char out[65536];
	int rc = test_run_cmd("bench/soak.sh --short 2>&1", out, sizeof out, 300);
	CHECK_MSG(rc == 0, "bench/soak.sh --short: exit %d:\n%s", rc, out);
	CHECK_CONTAINS(out, "restarts 2;");
	CHECK_CONTAINS(out, "identical: yes; log: every step once; stale: none");
	CHECK_CONTAINS(out, "soak: ok");
	return 0;
}
