/* train.c: `loom train` (being built; see the open issues). */
#include <stdio.h>

#include "cli.h"

int loom_cli_train(int argc, char **argv)
{
	(void)argc, (void)argv;
	fprintf(stderr, "loom train: not implemented yet\n");
	return 2;
}
