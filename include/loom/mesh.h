/* loom/mesh.h: a device mesh: the ranks of a job arranged as dp x cp x tp x pp, with one communicator
 * per axis (Megatron-LM's process groups) and one over dp x cp together.
 *
 * Rank order (Megatron's, with context parallel next to tensor parallel): tp varies fastest, then cp,
 * then dp, then pp, so
 *     world rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank))
 * and a tensor-parallel group is tp consecutive ranks, a context-parallel group cp ranks tp apart (the
 * ranks that exchange the most data sit next to each other). The axis communicator of a rank joins the
 * ranks that differ from it in that coordinate only, ordered by that coordinate (so its rank in it is
 * its coordinate).
 *
 * The data-parallel group (loom_mesh_dpcp_comm): the dp x cp ranks that hold the same model shard (the
 * same tp rank and pipeline stage). A context-parallel rank trains 1/cp of the positions of its dp
 * rank's sequences, so the gradient of the whole batch is the average over dp x cp: that group is what
 * the data-parallel strategies reduce and shard over (its rank order: cp_rank + cp * dp_rank).
 *
 * Axis communicators: an axis of size 1 has none (loom_mesh_comm returns NULL: there is nobody to
 * talk to); an axis as large as the world is the world communicator itself (borrowed, not split, so
 * dp x 1 x 1 costs nothing over the plain communicator); every other axis gets its own communicator
 * from loom_comm_split, owned by the mesh. With tp = pp = 1 the mesh is today's data-parallel job.
 *
 * Not thread-safe; use a mesh from the thread that uses its communicators. */
#ifndef LOOM_MESH_H
#define LOOM_MESH_H

#include <stddef.h>

#include "loom/comm.h"
#include "loom/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
	LOOM_MESH_DP = 0, LOOM_MESH_TP = 1, LOOM_MESH_PP = 2, LOOM_MESH_CP = 3, LOOM_MESH_AXES = 4
} loom_mesh_axis_t;

typedef struct loom_mesh loom_mesh_t;

/* Arrange the ranks of `world` (borrowed; must outlive the mesh; NULL: a job of one rank) as
 * dp x tp x pp. One size may be 0: it is derived as world size / (product of the others). Collective
 * over world: every rank must pass the same sizes (checked: LOOM_EMISMATCH naming the ranks that
 * differ). LOOM_EINVAL, naming the rank, when a size is negative, more than one is 0, the world is
 * not divisible by the given sizes, or the product is not the world size; errors of
 * loom_comm_split otherwise. *mesh is NULL on failure. */
int loom_mesh_create(loom_mesh_t **mesh, loom_comm_t *world, int dp, int tp, int pp);
/* The same with a context-parallel axis of cp ranks (1: none; loom_mesh_create is cp = 1). One of dp, cp,
 * tp, pp may be 0 (derived). */
int loom_mesh_create4(loom_mesh_t **mesh, loom_comm_t *world, int dp, int cp, int tp, int pp);
/* Destroy the communicators the mesh split (not the world's); safe on NULL. Not collective. */
void loom_mesh_destroy(loom_mesh_t *mesh);

int loom_mesh_size(const loom_mesh_t *m, loom_mesh_axis_t axis);  /* ranks along the axis */
int loom_mesh_coord(const loom_mesh_t *m, loom_mesh_axis_t axis); /* this rank's coordinate on it */
/* This rank's communicator along the axis (see above: NULL for a size-1 axis); owned by the mesh
 * or the world, valid until loom_mesh_destroy. */
loom_comm_t *loom_mesh_comm(const loom_mesh_t *m, loom_mesh_axis_t axis);
/* The data-parallel group dp x cp (above): NULL when it has one rank; the dp axis's communicator with
 * cp = 1, the cp axis's with dp = 1, the world when it is every rank, else its own (owned by the mesh). */
loom_comm_t *loom_mesh_dpcp_comm(const loom_mesh_t *m);
loom_comm_t *loom_mesh_world(const loom_mesh_t *m); /* as given to create (may be NULL) */
int loom_mesh_world_rank(const loom_mesh_t *m);
int loom_mesh_world_size(const loom_mesh_t *m);
const char *loom_mesh_axis_name(loom_mesh_axis_t axis); /* "dp", "tp", "pp", "cp"; "?" when invalid */

/* The layout as text (from the same table that orders the ranks): the sizes and the rank formula,
 * then per axis its stride and this rank's group, e.g.
 *   "mesh dp 2 x tp 2 x pp 2 = 8 ranks; world rank = tp + 2*dp + 4*pp\n"
 *   "  tp: stride 1, this rank (5) at 1 of {4, 5}\n" ...
 * (with cp > 1: "mesh dp 2 x cp 2 x tp 1 x pp 1 = 4 ranks; world rank = tp + cp + 2*dp + 4*pp\n", its
 * line, and the dp x cp group's last: "  dp x cp: this rank (1) at 1 of {0, 1, 2, 3}\n")
 * Writes at most cap bytes (always terminated when cap > 0); returns the length it needed. */
size_t loom_mesh_describe(const loom_mesh_t *m, char *buf, size_t cap);
/* The hosts this rank's group of `axis` spans (1: within one host; loom_comm_host of its members). */
int loom_mesh_axis_hosts(const loom_mesh_t *m, loom_mesh_axis_t axis);
/* "hosts: 2; tp within a host; pp across hosts" (the axes of more than one rank, as this rank's groups
 * lie), snprintf-style; what `loom train` prints for a job spanning hosts. */
size_t loom_mesh_hosts_describe(const loom_mesh_t *m, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
