/* info.c: `loom info` (being built; see the open issues). */
#include <stdio.h>

#include "cli.h"

int loom_cli_info(int argc, char **argv)
{
	(void)argc, (void)argv;
	fprintf(stderr, "loom info: not implemented yet\n");
	return 2;
}
