/* run.c: `loom run` (being built; see the open issues). */
#include <stdio.h>

#include "cli.h"

int loom_cli_run(int argc, char **argv)
{
	(void)argc, (void)argv;
	fprintf(stderr, "loom run: not implemented yet\n");
	return 2;
}
