/* bench.c: `loom bench comm|gemm|model`: dispatches to the benchmark subcommands. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

int loom_cli_bench_comm(int argc, char **argv);
int loom_cli_bench_gemm(int argc, char **argv);
int loom_cli_bench_model(int argc, char **argv);

int loom_cli_bench(int argc, char **argv)
{
	if (argc >= 2 && strcmp(argv[1], "comm") == 0)
		return loom_cli_bench_comm(argc - 1, argv + 1);
	if (argc >= 2 && strcmp(argv[1], "gemm") == 0)
		return loom_cli_bench_gemm(argc - 1, argv + 1);
	if (argc >= 2 && strcmp(argv[1], "model") == 0)
		return loom_cli_bench_model(argc - 1, argv + 1);
	fprintf(stderr, "usage: loom bench comm|gemm|model [FLAGS]   (loom bench comm --help)\n");
	return 2;
}
