/* fuzz_tokenizer.c: libFuzzer harness for llm.c's tokenizer file (loom_tokenizer_load, every token
 * decoded, a byte-level encode). */
#include "fuzz.h"
#include "loom/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n)
{
	char path[512];
	loom_tokenizer_t tok;
	fuzz_write("tokenizer.bin", d, n, path, sizeof path);
	if (loom_tokenizer_load(&tok, path) == LOOM_OK) {
		int len, ids[8];
		size_t nout;
		for (int i = -1; i <= tok.vocab_size; i++)
			loom_tokenizer_decode(&tok, i, &len);
		loom_tokenizer_encode(&tok, "fuzz", 4, ids, 8, &nout);
		loom_tokenizer_free(&tok);
	}
	return 0;
}
