/* convert.c: `loom convert IN OUT`: GPT-2 model files between safetensors (HF names) and llm.c .bin;
 * the llama family between Hugging Face directories (sharded or not, BF16/F16/F32) and loom's files;
 * nanochat's model_NNNNNN.pt (torch.save) to and from loom's nanochat safetensors, through
 * scripts/nanochat_pt.py (a pickled PyTorch file is read by torch, which a nanochat user has).
 *
 * Two outputs write a second file beside OUT: a .safetensors its directory's config.json (Hugging
 * Face's layout), a model_NNNNNN.pt its meta_NNNNNN.json (nanochat's). The user named only OUT, so an
 * existing one of those is never replaced silently: convert refuses before reading IN, naming the
 * file, unless --force; what it writes is said in its last line. */
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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
	fprintf(f, "usage: loom convert IN OUT [--n-head N] [--dtype f32|bf16] [--shard-size BYTES] [--force]\n\n"
	           "Llama / Qwen2 (Hugging Face directories): IN a directory holding config.json and model.safetensors\n"
	           "or the shards of model.safetensors.index.json (BF16, F16 or F32), or a loom .safetensors of the\n"
	           "llama family; OUT a .safetensors (loom's file, fp32, config.json beside it) or a directory (no\n"
	           "extension), written as transformers writes one: config.json, model.safetensors or shards of at\n"
	           "most --shard-size bytes (default 5000000000) with the index, F32 or --dtype bf16. An existing\n"
	           "OUT directory is refused unless --force (it is then replaced whole).\n\n"
	           "Converts a GPT-2 model between safetensors (Hugging Face names and shapes) and llm.c's .bin\n"
	           "(version 3, fp32). IN's format is detected from its content; OUT's from its extension\n"
	           "(.safetensors or .bin). --n-head is needed only for a safetensors file whose metadata and\n"
	           "neighbouring config.json do not give the number of heads.\n\n"
	           "nanochat: IN a model_NNNNNN.pt of nanochat's (meta_NNNNNN.json beside it) and OUT a\n"
	           ".safetensors gives loom's nanochat model (for --init-from); IN a loom nanochat .safetensors\n"
	           "and OUT a model_NNNNNN.pt gives nanochat's files. Both run scripts/nanochat_pt.py with\n"
	           "python3 and torch (LOOM_PYTHON chooses the interpreter).\n\n"
	           "A GPT-2 or loom nanochat OUT.safetensors also writes config.json in OUT's directory (./config.json\n"
	           "for a bare file name), and OUT = model_NNNNNN.pt writes meta_NNNNNN.json beside it. When that file\n"
	           "exists already, convert refuses, naming it, and writes nothing; --force replaces it.\n");
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

/* The file beside OUT that converting to OUT writes (none: ""): a .safetensors written by loom its
 * directory's config.json; a nanochat model_NNNNNN.pt its meta_NNNNNN.json (scripts/nanochat_pt.py,
 * which refuses other names). */
static void side_file(const char *out, int from_pt, char *side, size_t cap)
{
	char dir[PATH_MAX], base[PATH_MAX];
	size_t digits;
	side[0] = 0;
	if (ends_with(out, ".safetensors") && !from_pt) {
		if (loom_model_hf_config_path(out, side, cap) != LOOM_OK)
			cli_die("convert", "%s", loom_errmsg());
		return;
	}
	if (!ends_with(out, ".pt") || snprintf(dir, sizeof dir, "%s", out) >= (int)sizeof dir)
		return;
	snprintf(base, sizeof base, "%s", out);
	const char *b = basename(base);
	digits = strncmp(b, "model_", 6) ? 0 : strspn(b + 6, "0123456789");
	if (digits == 0 || strcmp(b + 6 + digits, ".pt"))
		return; /* the helper says what the name should be */
	if (snprintf(side, cap, "%s/meta_%.*s.json", dirname(dir), (int)digits, b + 6) >= (int)cap)
		cli_die("convert", "%s: path too long", out);
}

/* Refuse to replace `side` (when it exists) unless --force: before anything is read or written.
 * Returns what the last line says of it: "; wrote SIDE", "; replaced SIDE (--force)" or "". */
static const char *check_side_file(const char *out, const char *side, int force)
{
	static char said[PATH_MAX + 64];
	struct stat sb;
	if (!side[0])
		return "";
	int exists = stat(side, &sb) == 0, err = errno;
	snprintf(said, sizeof said, "; %s %s%s", exists ? "replaced" : "wrote", side, exists ? " (--force)" : "");
	if (exists && !force)
		cli_die("convert", "%s exists and writing %s would replace it (%s); nothing was written: move it away, "
		        "convert into another directory, or give --force to replace it", side, out,
		        ends_with(out, ".pt") ? "nanochat's meta file goes beside its model_NNNNNN.pt"
		                              : "a .safetensors gets config.json beside it, Hugging Face's layout");
	if (!exists && err != ENOENT)
		cli_die("convert", "%s: cannot check whether it exists: %s", side, strerror(err));
	return said;
}

/* Run scripts/nanochat_pt.py with mode, in, out. */
static int run_pt_helper(const char *mode, const char *in, const char *out, const char *said)
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
	printf("%s -> %s (%s)%s\n", in, out, mode, said);
	return 0;
}

/* IN (any model loom reads) to the Hugging Face directory OUT; the llama family only. */
static int convert_to_dir(const char *in, const char *out, int n_head, int bf16, size_t shard, int force)
{
	loom_model_config_t cfg;
	loom_hf_save_opts_t o = {bf16 ? LOOM_ST_BF16 : LOOM_ST_F32, shard, -1, force};
	struct stat sb;
	float *params;
	int rc, existed = stat(out, &sb) == 0;
	if (existed && !force)
		cli_die("convert", "%s exists; nothing was written: a Hugging Face directory is written whole into a new "
		        "directory, or give --force to replace it", out);
	if ((rc = loom_model_load_alloc(in, n_head, &cfg, &params)) != LOOM_OK) {
		fprintf(stderr, "loom convert: %s\n", loom_errmsg());
		return 1;
	}
	if (cfg.arch != LOOM_ARCH_LLAMA) {
		free(params);
		cli_die("convert", "%s: a %s model; Hugging Face directories are written for the llama family (Llama, "
		        "Qwen2): give OUT a .safetensors or .bin name", in, loom_arch_name(cfg.arch));
	}
	rc = loom_hf_dir_save(out, &cfg, params, &o);
	free(params);
	if (rc != LOOM_OK) {
		fprintf(stderr, "loom convert: %s\n", loom_errmsg());
		return 1;
	}
	printf("%s -> %s (Hugging Face directory, %s%s): %s L=%d H=%d KV=%d C=%d V=%d, %zu parameters%s\n", in, out,
	       bf16 ? "BF16" : "F32", shard ? ", sharded" : "", cfg.qwen2 ? "qwen2" : "llama", cfg.n_layer, cfg.n_head,
	       cfg.n_kv_head ? cfg.n_kv_head : cfg.n_head, cfg.n_embd, cfg.vocab_size, loom_model_num_params(&cfg),
	       existed ? " (replaced, --force)" : "");
	return 0;
}

int loom_cli_convert(int argc, char **argv)
{
	const char *in = NULL, *out = NULL, *v;
	char side[PATH_MAX + 32];
	int n_head = 0, rc, force = 0, bf16 = 0;
	long long shard = 0;
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
		} else if (cli_flag(argc, argv, &i, "--dtype", &v)) {
			if (strcmp(v, "bf16") != 0 && strcmp(v, "f32") != 0)
				cli_die("convert", "--dtype: '%s' is not one of f32, bf16", v);
			bf16 = strcmp(v, "bf16") == 0;
		} else if (cli_flag(argc, argv, &i, "--shard-size", &v)) {
			if ((shard = cli_parse_int("convert", "--shard-size", v)) <= 0)
				cli_die("convert", "--shard-size: %lld must be positive", shard);
		} else if (strcmp(argv[i], "--force") == 0) {
			force = 1;
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
	int from_pt = is_zip(in), to_dir = !ends_with(out, ".safetensors") && !ends_with(out, ".bin") &&
	                                   !ends_with(out, ".pt");
	if ((bf16 || shard) && !to_dir)
		cli_die("convert", "--dtype and --shard-size are for a Hugging Face directory OUT (a path without "
		        ".safetensors, .bin or .pt); %s is not one", out);
	if (to_dir)
		return convert_to_dir(in, out, n_head, bf16, (size_t)shard, force);
	side_file(out, from_pt, side, sizeof side);
	const char *said = check_side_file(out, side, force);
	if (from_pt) {
		if (!ends_with(out, ".safetensors"))
			cli_die("convert", "%s: a nanochat .pt converts to a .safetensors file", out);
		return run_pt_helper("to-loom", in, out, said);
	}
	if (ends_with(out, ".pt"))
		return run_pt_helper("to-nanochat", in, out, said);
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
	printf("%s (%s) -> %s (%s): L=%d H=%d C=%d T=%d V=%d, %zu parameters%s\n", in,
	       fmt == LOOM_MODEL_LLMC ? "llm.c" : fmt == LOOM_MODEL_HF_SHARDED ? "Hugging Face shards" : "safetensors", out, ends_with(out, ".bin") ? "llm.c" : "safetensors",
	       cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.seq_len, cfg.vocab_size, loom_model_num_params(&cfg), said);
	return 0;
}
