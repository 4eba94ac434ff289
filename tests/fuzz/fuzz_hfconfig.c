/* fuzz_hfconfig.c: libFuzzer harness for the Hugging Face directory readers (src/ckpt/hf_config.c,
 * hf_dir.c): the input is parsed as a config.json (loom_hf_config_parse) and as a
 * model.safetensors.index.json (loom__hf_index_parse); then, as the config.json of a directory whose
 * model.safetensors holds a tiny llama model (written once, F32 zeros), the directory is matched
 * against the table the input configures (loom_hf_dir_config) and, when that accepts it, loaded. */
#include "ckpt/model_internal.h"
#include "fuzz.h"
#include "loom/ckpt.h"

/* The tiny model every directory holds: L=1, C=8, 2 heads, 1 kv head, intermediate 8, vocab 4, tied. */
static void write_model(const char *dir)
{
	loom_model_config_t c = {.n_layer = 1, .n_head = 2, .n_embd = 8, .seq_len = 4, .vocab_size = 4,
	                         .arch = LOOM_ARCH_LLAMA, .n_kv_head = 1, .intermediate_size = 8,
	                         .tie_word_embeddings = 1};
	static float zeros[4096];
	char path[600];
	loom_hf_save_opts_t o = {LOOM_ST_F32, 0, -1, 1};
	snprintf(path, sizeof path, "%s/m", dir);
	if (loom_hf_dir_save(path, &c, zeros, &o) != LOOM_OK)
		abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n)
{
	static int ready;
	char path[512], dir[512];
	loom_model_config_t cfg;
	loom_hf_info_t info;
	loom__hf_index_t ix;
	if (!ready) {
		write_model(fuzz_dir());
		ready = 1;
	}
	(void)loom_hf_config_parse((const char *)d, n, "config.json", &cfg, &info);
	(void)loom__hf_index_parse((const char *)d, n, "index.json", &ix);
	loom__hf_index_free(&ix);
	snprintf(dir, sizeof dir, "%s/m", fuzz_dir());
	fuzz_write("m/config.json", d, n, path, sizeof path);
	if (loom_hf_dir_config(dir, &cfg, &info) == LOOM_OK) {
		size_t np = loom_model_num_params(&cfg);
		float *p = np < (1u << 20) ? malloc(np * sizeof *p + 1) : NULL;
		if (p && loom_hf_dir_load(dir, &cfg, p) != LOOM_OK)
			abort(); /* a directory whose configuration was accepted loads */
		free(p);
	}
	return 0;
}
