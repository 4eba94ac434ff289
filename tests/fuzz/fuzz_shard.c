/* fuzz_shard.c: libFuzzer harness for llm.c token shards, uint16 and uint32 (loom_shard_open, every token
 * read, the largest; then a loader over the file with a vocabulary of 70000, reading its first windows,
 * so that ids past the vocabulary or past INT32_MAX take the loader's error path). */
#include "fuzz.h"
#include "loom/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n)
{
	char path[512];
	loom_shard_t s;
	size_t n_tokens = 0;
	fuzz_write("shard.bin", d, n, path, sizeof path);
	if (loom_shard_open(&s, path) == LOOM_OK) {
		volatile unsigned sum = 0;
		for (size_t i = 0; i < s.n_tokens; i++)
			sum += loom_shard_token(&s, i);
		sum += loom_shard_max_token(&s);
		n_tokens = s.n_tokens;
		loom_shard_close(&s);
	}
	if (n_tokens >= 2) {
		loom_loader_opts_t o = {.B = 1, .T = n_tokens > 9 ? 4 : 1, .vocab_size = (n & 1) ? 70000 : 0};
		loom_loader_t *ld;
		int in[4], tg[4];
		if (loom_loader_create(&ld, path, &o) == LOOM_OK) {
			for (uint64_t k = 0; k < 64 && k < loom_loader_windows_per_epoch(ld); k++)
				loom_loader_window(ld, k, in, tg);
			loom_loader_destroy(ld);
		}
	}
	return 0;
}
