/* join.h: one model over several models' tensors (internal to src/; src/model/iface.c). */
#ifndef LOOM_MODEL_JOIN_H
#define LOOM_MODEL_JOIN_H

#include "loom/model.h"

/* A model whose tensors are the union of the chunks' (n models of one family and configuration, each
 * created with opts.keep, e.g. an interleaved pipeline rank's stage models, which differ in layer
 * range and tensors kept), in the family's table order (so in unit order: the embedding's first, the
 * head's last), packed into one parameter and one gradient buffer of the join's, which start with
 * the chunks' current values (the first holder's parameters, zero gradients). Every view set on the
 * join (buffers, tensor and unit views) is set on each chunk holding the tensor, so the chunks keep
 * computing (their forward and backward calls) on the join's memory and a strategy attached to the
 * join sees every chunk's tensors once. Hooks are installed on every chunk; a tensor's grad-ready
 * report is passed on (under the join's index) from the first chunk holding it only, so a caller
 * whose chunks share a tensor runs that chunk's last backward after the others'. The calls that are
 * not about tensors (configuration, dtype, tensor-parallel shard, ...) go to chunk 0; activation
 * bytes (and their formula's) and recomputations are the chunks' sums. On success the join owns the chunks
 * (loom_model_destroy of the join destroys them); on failure they stay the caller's. Returns LOOM_OK,
 * LOOM_EINVAL (no chunk, or one not created with opts.keep or of another family), LOOM_ENOMEM. */
int loom__model_join(loom_model_t **out, loom_model_t **chunks, int n);

#endif
