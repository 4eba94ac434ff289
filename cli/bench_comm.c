/* bench_comm.c: `loom bench comm` (being built; see the open issues). */
#include <stdio.h>

#include "cli.h"

int loom_cli_bench_comm(int argc, char **argv)
{
	(void)argc, (void)argv;
	fprintf(stderr, "loom bench comm: not implemented yet\n");
	return 2;
}
