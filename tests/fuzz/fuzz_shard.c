/* fuzz_shard.c: libFuzzer harness for llm.c token shards (loom_shard_open, then every token read). */
#include "fuzz.h"
#include "loom/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n)
{
	char path[512];
	loom_shard_t s;
	fuzz_write("shard.bin", d, n, path, sizeof path);
	if (loom_shard_open(&s, path) == LOOM_OK) {
		volatile unsigned sum = 0;
		for (size_t i = 0; i < s.n_tokens; i++)
			sum += s.tokens[i];
		loom_shard_close(&s);
	}
	return 0;
}
