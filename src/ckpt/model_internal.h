/* model_internal.h: the per-format halves of loom_model_config/load/save (internal). */
#ifndef LOOM_CKPT_MODEL_INTERNAL_H
#define LOOM_CKPT_MODEL_INTERNAL_H

#include "loom/ckpt.h"

int loom__st_model_config(const char *path, int n_head_hint, loom_gpt2_config_t *cfg);
int loom__st_model_load(const char *path, const loom_gpt2_config_t *cfg, float *params);
int loom__llmc_model_config(const char *path, loom_gpt2_config_t *cfg);
int loom__llmc_model_load(const char *path, const loom_gpt2_config_t *cfg, float *params);

#endif
