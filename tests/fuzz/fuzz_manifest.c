/* fuzz_manifest.c: libFuzzer harness for a checkpoint's MANIFEST: the input is the MANIFEST of a
 * checkpoint directory holding one 10-byte file, checked by loom_ckpt_verify. */
#include <sys/stat.h>

#include "fuzz.h"
#include "loom/ckpt.h"

static char ckpt_dir[512];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	char path[600];
	FILE *f;
	(void)argc, (void)argv;
	snprintf(ckpt_dir, sizeof ckpt_dir, "%s/step_00000001", fuzz_dir());
	if (mkdir(ckpt_dir, 0700) != 0)
		abort();
	snprintf(path, sizeof path, "%s/model.safetensors", ckpt_dir);
	if (!(f = fopen(path, "wb")) || fwrite("0123456789", 1, 10, f) != 10 || fclose(f) != 0)
		abort();
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n)
{
	char path[512];
	fuzz_write("step_00000001/MANIFEST", d, n, path, sizeof path);
	loom_ckpt_verify(ckpt_dir);
	return 0;
}
