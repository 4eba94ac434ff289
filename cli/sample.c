/* sample.c: `loom sample` (being built; see the open issues). */
#include <stdio.h>

#include "cli.h"

int loom_cli_sample(int argc, char **argv)
{
	(void)argc, (void)argv;
	fprintf(stderr, "loom sample: not implemented yet\n");
	return 2;
}
