/* fuzz_bpe.c: libFuzzer harness for the BPE tokenizer files: the input is vocab.json, a NUL byte, then
 * merges.txt (and, after a second NUL, text to encode); loom_bpe_load, then encode and decode. */
#include "fuzz.h"
#include "loom/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n)
{
	char path[512];
	const uint8_t *z = memchr(d, 0, n), *m, *text;
	size_t nv, nm, nt;
	loom_bpe_t *t;
	if (!z)
		return 0;
	nv = (size_t)(z - d), m = z + 1;
	z = memchr(m, 0, n - nv - 1);
	nm = z ? (size_t)(z - m) : n - nv - 1;
	text = z ? z + 1 : (const uint8_t *)"Hello world, it's 2024!";
	nt = z ? n - nv - 1 - nm - 1 : strlen((const char *)text);
	fuzz_write("vocab.json", d, nv, path, sizeof path);
	fuzz_write("merges.txt", m, nm, path, sizeof path);
	if (loom_bpe_load(&t, fuzz_dir()) == LOOM_OK) {
		int *ids;
		size_t nids;
		if (loom_bpe_encode(t, (const char *)text, nt, 1, &ids, &nids) == LOOM_OK) {
			for (size_t i = 0; i < nids; i++) {
				size_t len;
				if (!loom_bpe_token(t, ids[i], &len))
					abort(); /* encode gives only ids the vocabulary has */
			}
			free(ids);
		}
		loom_bpe_destroy(t);
	}
	return 0;
}
