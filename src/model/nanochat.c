/* nanochat.c: nanochat's GPT (karpathy/nanochat bac5a35, nanochat/gpt.py) as a model family. */
#include <stddef.h>

#include "model/nanochat.h"

const loom_model_family_t *loom__nanochat_family(void)
{
	return NULL;
}
