/* convert.c: `loom convert IN OUT`: GPT-2 model files between safetensors (HF names) and llm.c .bin. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "loom/ckpt.h"

static int ends_with(const char *s, const char *suffix)
{
	size_t n = strlen(s), m = strlen(suffix);
	return n >= m && strcmp(s + n - m, suffix) == 0;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: loom convert IN OUT [--n-head N]\n\n"
	           "Converts a GPT-2 model between safetensors (Hugging Face names and shapes) and llm.c's .bin\n"
	           "(version 3, fp32). IN's format is detected from its content; OUT's from its extension\n"
	           "(.safetensors or .bin). --n-head is needed only for a safetensors file whose metadata and\n"
	           "neighbouring config.json do not give the number of heads.\n");
}

int loom_cli_convert(int argc, char **argv)
{
	const char *in = NULL, *out = NULL, *v;
	int n_head = 0, rc;
	loom_model_config_t cfg;
	loom_model_format_t fmt;
	float *params;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
			usage(stdout);
			return 0;
		} else if (cli_flag(argc, argv, &i, "--n-head", &v)) {
			long long x = cli_parse_int("convert", "--n-head", v);
			if (x <= 0 || x > 1 << 20)
				cli_die("convert", "--n-head: %lld must be positive", x);
			n_head = (int)x;
		} else if (argv[i][0] == '-' && argv[i][1] == '-') {
			usage(stderr);
			cli_die("convert", "unknown flag '%s'", argv[i]);
		} else if (!in) {
			in = argv[i];
		} else if (!out) {
			out = argv[i];
		} else {
			usage(stderr);
			cli_die("convert", "unexpected argument '%s'", argv[i]);
		}
	}
	if (!in || !out) {
		usage(stderr);
		return 2;
	}
	if (!ends_with(out, ".bin") && !ends_with(out, ".safetensors"))
		cli_die("convert", "%s: the output must end in .safetensors or .bin", out);
	if ((rc = loom_model_config(in, n_head, &cfg, &fmt)) != LOOM_OK ||
	    (rc = loom_model_load_alloc(in, n_head, &cfg, &params)) != LOOM_OK) {
		fprintf(stderr, "loom convert: %s\n", loom_errmsg());
		return 1;
	}
	rc = loom_model_save(out, &cfg, params);
	free(params);
	if (rc != LOOM_OK) {
		fprintf(stderr, "loom convert: %s\n", loom_errmsg());
		return 1;
	}
	printf("%s (%s) -> %s (%s): L=%d H=%d C=%d T=%d V=%d, %zu parameters\n", in,
	       fmt == LOOM_MODEL_LLMC ? "llm.c" : "safetensors", out, ends_with(out, ".bin") ? "llm.c" : "safetensors",
	       cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.seq_len, cfg.vocab_size, loom_model_num_params(&cfg));
	return 0;
}
