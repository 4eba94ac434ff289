/* fuzz_safetensors.c: libFuzzer harness for the safetensors reader (loom_st_open, every tensor read as
 * float) and the GPT-2 model reader on top of it (loom_model_load_alloc: table matching, limits). */
#include "fuzz.h"
#include "loom/ckpt.h"

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n)
{
	char path[512];
	loom_st_t *st;
	loom_gpt2_config_t cfg;
	float *p;
	fuzz_write("model.safetensors", d, n, path, sizeof path);
	if (loom_st_open(&st, path) == LOOM_OK) {
		for (int i = 0; i < loom_st_count(st); i++) {
			const loom_st_tensor_t *t = loom_st_get(st, i);
			size_t es = loom_st_dtype_size(t->dtype), numel = es ? t->nbytes / es : 0;
			float *buf = malloc(numel * sizeof *buf + 1);
			if (loom_st_find(st, t->name) < 0)
				abort(); /* every tensor is found by its name */
			loom_st_read_f32(st, i, buf, numel);
			free(buf);
		}
		loom_st_close(st);
	}
	if (loom_model_load_alloc(path, 2, &cfg, &p) == LOOM_OK)
		free(p);
	return 0;
}
