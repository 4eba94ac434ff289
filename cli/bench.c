/* bench.c: `loom bench` (being built; see the open issues). */
#include <stdio.h>

#include "cli.h"

int loom_cli_bench(int argc, char **argv)
{
	(void)argc, (void)argv;
	fprintf(stderr, "loom bench: not implemented yet\n");
	return 2;
}
