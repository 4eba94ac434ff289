/* fuzz_tokjson.c: libFuzzer harness for Hugging Face tokenizer.json (loom_bpe_load of a file): the input
 * is the file, optionally followed by a NUL byte and text to encode. What loads is encoded (plain, and with
 * special tokens and the template), decoded, saved with loom_bpe_save_json and read back, which must
 * give the same ids. */
#include "fuzz.h"
#include "loom/tokenizer.h"

static int encode(loom_bpe_t *t, const char *text, size_t n, int flags, int **ids, size_t *nids)
{
	if (loom_bpe_encode(t, text, n, flags, ids, nids) != LOOM_OK)
		return -1;
	for (size_t i = 0; i < *nids; i++) {
		size_t len;
		if (!loom_bpe_token(t, (*ids)[i], &len))
			abort(); /* encode gives only ids the tokenizer has */
	}
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n)
{
	char path[512], saved[512];
	const uint8_t *z = memchr(d, 0, n);
	const char *text = z ? (const char *)z + 1 : "Hello world, it's 2024!<|endoftext|> 12345";
	size_t nj = z ? (size_t)(z - d) : n, nt = z ? n - nj - 1 : strlen(text);
	loom_bpe_t *t, *t2;
	fuzz_write("tokenizer.json", d, nj, path, sizeof path);
	if (loom_bpe_load(&t, path) != LOOM_OK)
		return 0;
	int *ids = NULL, *ids2 = NULL;
	size_t nids = 0, nids2 = 0;
	if (encode(t, text, nt, 0, &ids, &nids) == 0) {
		char *dec;
		size_t dlen;
		if (loom_bpe_decode(t, ids, nids, &dec, &dlen) == LOOM_OK)
			free(dec);
	}
	free(ids), ids = NULL;
	snprintf(saved, sizeof saved, "%s/saved.json", fuzz_dir());
	if (encode(t, text, nt, LOOM_BPE_SPECIAL | LOOM_BPE_TEMPLATE, &ids, &nids) == 0 &&
	    loom_bpe_save_json(t, saved) == LOOM_OK) {
		/* a file loom wrote reads back to the same ids (added tokens whose text is not valid UTF-8 aside: the
		 * saved JSON holds their bytes, which the parser takes as they are) */
		if (loom_bpe_load(&t2, saved) != LOOM_OK)
			abort();
		if (encode(t2, text, nt, LOOM_BPE_SPECIAL | LOOM_BPE_TEMPLATE, &ids2, &nids2) != 0 || nids2 != nids ||
		    (nids && memcmp(ids, ids2, nids * sizeof *ids) != 0))
			abort();
		free(ids2);
		loom_bpe_destroy(t2);
	}
	free(ids);
	loom_bpe_destroy(t);
	return 0;
}
