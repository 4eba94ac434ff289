/* fuzz_llmc.c: libFuzzer harness for llm.c's model file (.bin): header limits, size checks, load. */
#include "fuzz.h"
#include "loom/ckpt.h"

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n)
{
	char path[512];
	loom_gpt2_config_t cfg;
	float *p;
	fuzz_write("model.bin", d, n, path, sizeof path);
	if (loom_model_load_alloc(path, 0, &cfg, &p) == LOOM_OK)
		free(p);
	return 0;
}
