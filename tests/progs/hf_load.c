/* hf_load.c: load a model (a Hugging Face directory, or any model file loom reads) into fp32
 * parameters and print how long that took and the process's peak resident set, for bench/hf_load.sh:
 *   hf_load DIR  ->  "load_s 1.234 params 1235814400 fp32_bytes 4943257600 maxrss_bytes 4950000000"
 * load_s covers loom_model_config (headers, table matching), the parameters' allocation
 * (loom_alloc_uninit, as loom_model_load_alloc: not zeroed, so their pages are faulted in by the
 * load's writes, on its threads) and loom_model_load; read_convert_s the load alone. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>

#include "loom/ckpt.h"
#include "loom/util.h"

int main(int argc, char **argv)
{
	loom_model_config_t cfg;
	struct timespec a, m, b;
	struct rusage ru;
	float *p;
	if (argc != 2) {
		fprintf(stderr, "usage: hf_load DIR\n");
		return 2;
	}
	clock_gettime(CLOCK_MONOTONIC, &a);
	if (loom_model_config(argv[1], 0, &cfg, NULL) != LOOM_OK ||
	    !(p = loom_alloc_uninit(loom_model_num_params(&cfg) * sizeof *p)) ||
	    clock_gettime(CLOCK_MONOTONIC, &m) != 0 || loom_model_load(argv[1], &cfg, p) != LOOM_OK) {
		fprintf(stderr, "hf_load: %s\n", loom_errmsg());
		return 1;
	}
	clock_gettime(CLOCK_MONOTONIC, &b);
	getrusage(RUSAGE_SELF, &ru);
	double sum = 0;
	for (size_t i = 0; i < loom_model_num_params(&cfg); i += 4096)
		sum += p[i];
	printf("load_s %.3f params %zu fp32_bytes %zu maxrss_bytes %ld read_convert_s %.3f checksum %.6g\n",
	       (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec), loom_model_num_params(&cfg),
	       loom_model_num_params(&cfg) * sizeof *p, ru.ru_maxrss * 1024L,
	       (double)(b.tv_sec - m.tv_sec) + 1e-9 * (double)(b.tv_nsec - m.tv_nsec), sum);
	free(p);
	return 0;
}
