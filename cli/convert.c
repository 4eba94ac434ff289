/* convert.c: `loom convert` (being built; see the open issues). */
#include <stdio.h>

#include "cli.h"

int loom_cli_convert(int argc, char **argv)
{
	(void)argc, (void)argv;
	fprintf(stderr, "loom convert: not implemented yet\n");
	return 2;
}
