/* nanochat.h: nanochat's GPT as a model family (nanochat*.c; loom/model.h, loom/nanochat.h). Internal
 * to src/. */
#ifndef LOOM_MODEL_NANOCHAT_H
#define LOOM_MODEL_NANOCHAT_H

#include "loom/model.h"

/* The family's table (nanochat.c). */
const loom_model_family_t *loom__nanochat_family(void);

#endif
