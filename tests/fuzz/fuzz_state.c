/* fuzz_state.c: libFuzzer harness for the JSON parser and the files loom reads with it: the input as
 * JSON (loom__json_parse), as a state file (loom_kv_load, every value read back), and as the
 * config.json beside a model whose n_head it gives (loom_model_config). */
#include "ckpt/json.h"
#include "fuzz.h"
#include "loom/ckpt.h"

static char model_path[512];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	/* a model without n_head in its metadata: loom_model_config must read config.json */
	static float w[16];
	const char *names[5] = {"wte.weight", "wpe.weight", "h.0.x", "ln_f.weight", "ln_f.bias"};
	loom_st_tensor_t t[2] = {{.name = names[0], .dtype = LOOM_ST_F32, .ndim = 2, .shape = {2, 4}, .data = w,
	                          .nbytes = 32},
	                         {.name = names[1], .dtype = LOOM_ST_F32, .ndim = 2, .shape = {2, 4}, .data = w + 8,
	                          .nbytes = 32}};
	(void)argc, (void)argv;
	snprintf(model_path, sizeof model_path, "%s/model.safetensors", fuzz_dir());
	if (loom_st_write(model_path, t, 2, NULL, 0) != LOOM_OK)
		abort();
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n)
{
	char path[512], err[200];
	json_t root;
	loom_kv_t *kv;
	loom_gpt2_config_t cfg;
	loom__json_parse((const char *)d, n, &root, err, sizeof err);
	loom__json_free(&root);
	fuzz_write("state.json", d, n, path, sizeof path);
	if (loom_kv_load(&kv, path) == LOOM_OK) {
		for (int i = 0; i < loom_kv_count(kv); i++) {
			const char *key = loom_kv_key_at(kv, i), *s;
			int64_t x;
			uint64_t u;
			double f;
			loom_kv_get_i64(kv, key, &x);
			loom_kv_get_u64(kv, key, &u);
			loom_kv_get_f64(kv, key, &f);
			loom_kv_get_str(kv, key, &s);
		}
		loom_kv_destroy(kv);
	}
	fuzz_write("config.json", d, n, path, sizeof path);
	loom_model_config(model_path, 0, &cfg, NULL);
	return 0;
}
