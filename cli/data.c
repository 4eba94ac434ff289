/* data.c: `loom data` (being built; see the open issues). */
#include <stdio.h>

#include "cli.h"

int loom_cli_data(int argc, char **argv)
{
	(void)argc, (void)argv;
	fprintf(stderr, "loom data: not implemented yet\n");
	return 2;
}
