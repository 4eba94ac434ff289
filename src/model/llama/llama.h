/* llama.h: the Llama / Qwen2 family (llama*.c; loom/model.h). Internal to src/. */
#ifndef LOOM_MODEL_LLAMA_H
#define LOOM_MODEL_LLAMA_H

#include "loom/model.h"

/* The family's table (llama.c). */
const loom_model_family_t *loom__llama_family(void);

#endif
