/* fuzz_index.c: libFuzzer harness for a token-shard set's index (shards.index, src/data/shard_index.c):
 * the input is the index file, read by loom__shard_index_load and, when it loads, queried for the
 * sets and a file the loader asks for. */
#include "data/shard_index.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n)
{
	char path[512];
	loom__shard_index_t idx;
	fuzz_write("shards.index", d, n, path, sizeof path);
	if (loom__shard_index_load(path, &idx) == 0) {
		(void)loom__shard_index_set(&idx, "train", 5);
		(void)loom__shard_index_set(&idx, "val", 3);
		(void)loom__shard_index_file(&idx, "train_000000.bin");
		loom__shard_index_free(&idx);
	}
	return 0;
}
