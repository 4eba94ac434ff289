/* bench_gemm.c: `loom bench gemm` (being built; see the open issues). */
#include <stdio.h>

#include "cli.h"

int loom_cli_bench_gemm(int argc, char **argv)
{
	(void)argc, (void)argv;
	fprintf(stderr, "loom bench gemm: not implemented yet\n");
	return 2;
}
