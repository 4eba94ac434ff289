/* convert.c: `loom convert IN OUT`: GPT-2 model files between safetensors (HF names) and llm.c .bin;
 * nanochat's model_NNNNNN.pt (torch.save) to and from loom's nanochat safetensors, through
 * scripts/nanochat_pt.py (a pickled PyTorch file is read by torch, which a nanochat user has). */
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

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
	           "neighbouring config.json do not give the number of heads.\n\n"
	           "nanochat: IN a model_NNNNNN.pt of nanochat's (meta_NNNNNN.json beside it) and OUT a\n"
	           ".safetensors gives loom's nanochat model (for --init-from); IN a loom nanochat .safetensors\n"
	           "and OUT a model_NNNNNN.pt gives nanochat's files. Both run scripts/nanochat_pt.py with\n"
	           "python3 and torch (LOOM_PYTHON chooses the interpreter).\n");
}

/* 1 when path starts like a zip archive: torch.save's format. */
static int is_zip(const char *path)
{
	unsigned char m[4] = {0};
	FILE *f = fopen(path, "rb");
	size_t n = f ? fread(m, 1, 4, f) : 0;
	if (f)
		fclose(f);
	return n == 4 && m[0] == 'P' && m[1] == 'K' && m[2] == 3 && m[3] == 4;
}

/* scripts/nanochat_pt.py: $LOOM_SCRIPTS, else a scripts/ directory above the binary (build/loom,
 * a sanitizer build's, ...), else PREFIX/share/loom beside an installed bin/loom. */
static int find_pt_helper(char *script, size_t cap)
{
	char exe[PATH_MAX], dir[PATH_MAX];
	const char *env = getenv("LOOM_SCRIPTS");
	if (env && *env) {
		snprintf(script, cap, "%s/nanochat_pt.py", env);
		return access(script, R_OK) == 0;
	}
	ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
	if (n <= 0)
		return 0;
	exe[n] = 0;
	snprintf(dir, sizeof dir, "%s", dirname(exe));
	for (int up = 0; up < 4; up++) {
		snprintf(script, cap, "%s/scripts/nanochat_pt.py", dir);
		if (access(script, R_OK) == 0)
			return 1;
		snprintf(script, cap, "%s/share/loom/nanochat_pt.py", dir);
		if (access(script, R_OK) == 0)
			return 1;
		char *slash = strrchr(dir, '/');
		if (!slash || slash == dir)
			break;
		*slash = 0;
	}
	return 0;
}

/* Run scripts/nanochat_pt.py with mode, in, out. */
static int run_pt_helper(const char *mode, const char *in, const char *out)
{
	char script[PATH_MAX + 64];
	const char *py = getenv("LOOM_PYTHON") ? getenv("LOOM_PYTHON") : "python3";
	if (!find_pt_helper(script, sizeof script))
		cli_die("convert", "scripts/nanochat_pt.py not found above loom's binary nor in PREFIX/share/loom (it converts "
		        "nanochat's .pt files; LOOM_SCRIPTS may name its directory)");
	pid_t pid = fork();
	if (pid < 0)
		cli_die("convert", "fork: cannot start %s", py);
	if (pid == 0) {
		execlp(py, py, script, mode, in, out, (char *)NULL);
		fprintf(stderr, "loom convert: cannot run %s (set LOOM_PYTHON to a python3 with torch)\n", py);
		_exit(127);
	}
	int st = 0;
	while (waitpid(pid, &st, 0) < 0)
		;
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
		return 1;
	printf("%s -> %s (%s)\n", in, out, mode);
	return 0;
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
	if (is_zip(in)) {
		if (!ends_with(out, ".safetensors"))
			cli_die("convert", "%s: a nanochat .pt converts to a .safetensors file", out);
		return run_pt_helper("to-loom", in, out);
	}
	if (ends_with(out, ".pt"))
		return run_pt_helper("to-nanochat", in, out);
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
