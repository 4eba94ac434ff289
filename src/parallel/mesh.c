/* mesh.c: the dp x cp x tp x pp device mesh (loom/mesh.h).
 *
 * The rank order is data: `order` lists the axes fastest-varying first, and everything else (the
 * strides, a rank's coordinates, the color and key of each axis's split, the description) is
 * computed from it, so the ordering, the communicators and the printed layout cannot disagree.
 *
 * Invariants: the product of the sizes is the world size; world rank = sum over axes of
 * coord * stride; the communicator of axis a joins exactly the ranks whose other coordinates equal
 * this rank's, ordered by coord[a] (color = the group's first rank, key = coord[a]), so a rank's
 * rank in it is coord[a]. All ranks split the same axes in the same order (the decision depends only
 * on the sizes, which create checks to agree), which keeps the collective splits matched. The dp x cp
 * group is split the same way, with both coordinates free (key cp + CP dp). An axis of size 1 (cp by
 * default) is left out of the description, so a mesh without context parallelism reads as before. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "loom/mesh.h"

/* Megatron-LM's order: tensor parallel fastest (neighbouring ranks), then context, data, pipeline. */
static const struct {
	loom_mesh_axis_t axis;
	const char *name;
} order[LOOM_MESH_AXES] = {
	{LOOM_MESH_TP, "tp"},
	{LOOM_MESH_CP, "cp"},
	{LOOM_MESH_DP, "dp"},
	{LOOM_MESH_PP, "pp"},
};

struct loom_mesh {
	loom_comm_t *world; /* borrowed */
	int rank, size;
	int sizes[LOOM_MESH_AXES], coords[LOOM_MESH_AXES], strides[LOOM_MESH_AXES];
	loom_comm_t *comms[LOOM_MESH_AXES];
	int owned[LOOM_MESH_AXES]; /* comms[a] came from loom_comm_split */
	loom_comm_t *dpcp;         /* the dp x cp group (NULL: one rank) */
	int dpcp_owned;
};

const char *loom_mesh_axis_name(loom_mesh_axis_t axis)
{
	for (int k = 0; k < LOOM_MESH_AXES; k++)
		if (order[k].axis == axis)
			return order[k].name;
	return "?";
}

/* "cp N x " (list 1: "cp N, ") when the sizes have a cp axis, else "": the messages of a mesh without
 * one read as before. */
static const char *cp_sep(const int s[LOOM_MESH_AXES], int list)
{
	static _Thread_local char buf[32];
	if (s[LOOM_MESH_CP] == 1)
		return "";
	snprintf(buf, sizeof buf, list ? "cp %d, " : "cp %d x ", s[LOOM_MESH_CP]);
	return buf;
}
#define cp_text(s) cp_sep((s), 0)

/* The sizes after deriving a 0, checked against the world size. */
static int resolve(int rank, int world, const int req[LOOM_MESH_AXES], int sizes[LOOM_MESH_AXES])
{
	int zeros = 0, prod = 1;
	for (int a = 0; a < LOOM_MESH_AXES; a++) {
		if (req[a] < 0)
			return loom_seterr(LOOM_EINVAL, "mesh: rank %d: %s size %d must be >= 1 (or 0: derived)", rank,
			                   loom_mesh_axis_name((loom_mesh_axis_t)a), req[a]);
		zeros += req[a] == 0;
		prod *= req[a] > 0 ? req[a] : 1;
	}
	if (zeros > 1)
		return loom_seterr(LOOM_EINVAL, "mesh: rank %d: only one of dp %d, %stp %d, pp %d may be 0 (derived)",
		                   rank, req[LOOM_MESH_DP], cp_sep(req, 1), req[LOOM_MESH_TP], req[LOOM_MESH_PP]);
	for (int a = 0; a < LOOM_MESH_AXES; a++) {
		sizes[a] = req[a];
		if (req[a] == 0) {
			if (world % prod != 0)
				return loom_seterr(LOOM_EINVAL, "mesh: rank %d of %d: the world of %d ranks is not divisible by "
				                   "the other sizes (%d) to derive %s (dp %d, %stp %d, pp %d)", rank, world, world,
				                   prod, loom_mesh_axis_name((loom_mesh_axis_t)a), req[LOOM_MESH_DP], cp_sep(req, 1),
				                   req[LOOM_MESH_TP], req[LOOM_MESH_PP]);
			sizes[a] = world / prod;
			prod = world;
		}
	}
	if (prod != world)
		return loom_seterr(LOOM_EINVAL, "mesh: rank %d of %d: dp %d x %stp %d x pp %d = %d ranks, but the world has %d",
		                   rank, world, sizes[LOOM_MESH_DP], cp_text(sizes), sizes[LOOM_MESH_TP],
		                   sizes[LOOM_MESH_PP], prod, world);
	return LOOM_OK;
}

/* Every rank passed the same sizes: LOOM_EMISMATCH naming the ranks that differ from rank 0. */
static int check_agree(loom_comm_t *world, int rank, int size, const int req[LOOM_MESH_AXES])
{
	int *all = loom__calloc((size_t)size * LOOM_MESH_AXES, sizeof *all), rc, bad = 0;
	char list[256] = "";
	size_t len = 0;
	if (!all)
		return loom_seterr(LOOM_ENOMEM, "mesh: out of memory");
	if ((rc = loom_allgather(world, req, all, LOOM_MESH_AXES, LOOM_INT32)) != LOOM_OK) {
		free(all);
		return loom_seterr(rc, "mesh: rank %d: gathering the mesh sizes: %s", rank, loom_comm_errmsg(world));
	}
	for (int r = 1; r < size; r++)
		if (memcmp(all + (size_t)r * LOOM_MESH_AXES, all, LOOM_MESH_AXES * sizeof *all) != 0) {
			bad++;
			if (len + 16 < sizeof list)
				len += (size_t)snprintf(list + len, sizeof list - len, "%s%d", bad > 1 ? ", " : "", r);
		}
	if (bad)
		rc = loom_seterr(LOOM_EMISMATCH, "mesh: rank %d: rank(s) %s asked for other sizes than rank 0's dp %d x "
		                 "%stp %d x pp %d", rank, list, all[LOOM_MESH_DP], cp_text(all), all[LOOM_MESH_TP],
		                 all[LOOM_MESH_PP]);
	free(all);
	return rc;
}

int loom_mesh_create(loom_mesh_t **out, loom_comm_t *world, int dp, int tp, int pp)
{
	return loom_mesh_create4(out, world, dp, 1, tp, pp);
}

/* The dp x cp group: the axis communicators where one of the two is the whole group, else a split with
 * both coordinates free (color: the group's first rank; key: its place cp + CP dp). */
static int make_dpcp(loom_mesh_t *m)
{
	int dp = m->sizes[LOOM_MESH_DP], cp = m->sizes[LOOM_MESH_CP], rc;
	if (dp * cp == 1)
		return LOOM_OK;
	if (cp == 1 || dp == 1) {
		m->dpcp = m->comms[cp == 1 ? LOOM_MESH_DP : LOOM_MESH_CP];
		return LOOM_OK;
	}
	if (dp * cp == m->size) {
		m->dpcp = m->world;
		return LOOM_OK;
	}
	int cd = m->coords[LOOM_MESH_DP], cc = m->coords[LOOM_MESH_CP];
	int color = m->rank - cd * m->strides[LOOM_MESH_DP] - cc * m->strides[LOOM_MESH_CP];
	if ((rc = loom_comm_split(m->world, color, cc + cp * cd, &m->dpcp)) != LOOM_OK)
		return loom_seterr(rc, "mesh: rank %d: creating the dp x cp communicator: %s", m->rank, loom_errmsg());
	m->dpcp_owned = 1;
	return LOOM_OK;
}

int loom_mesh_create4(loom_mesh_t **out, loom_comm_t *world, int dp, int cp, int tp, int pp)
{
	int req[LOOM_MESH_AXES], rc;
	loom_mesh_t *m;
	*out = NULL;
	req[LOOM_MESH_DP] = dp, req[LOOM_MESH_CP] = cp, req[LOOM_MESH_TP] = tp, req[LOOM_MESH_PP] = pp;
	if (!(m = loom__calloc(1, sizeof *m)))
		return loom_seterr(LOOM_ENOMEM, "mesh: out of memory");
	m->world = world;
	m->rank = world ? loom_comm_rank(world) : 0;
	m->size = world ? loom_comm_size(world) : 1;
	/* The collective check comes first, so that ranks with bad sizes still take part in it. */
	if ((m->size > 1 && (rc = check_agree(world, m->rank, m->size, req)) != LOOM_OK) ||
	    (rc = resolve(m->rank, m->size, req, m->sizes)) != LOOM_OK)
		goto fail;
	for (int k = 0, stride = 1; k < LOOM_MESH_AXES; k++) {
		loom_mesh_axis_t a = order[k].axis;
		m->strides[a] = stride;
		m->coords[a] = m->rank / stride % m->sizes[a];
		stride *= m->sizes[a];
	}
	for (int k = 0; k < LOOM_MESH_AXES; k++) {
		loom_mesh_axis_t a = order[k].axis;
		if (m->sizes[a] == 1)
			continue; /* nobody to talk to: no communicator */
		if (m->sizes[a] == m->size) {
			m->comms[a] = world; /* the whole world along this axis: borrowed */
			continue;
		}
		int color = m->rank - m->coords[a] * m->strides[a]; /* the group's first rank */
		if ((rc = loom_comm_split(world, color, m->coords[a], &m->comms[a])) != LOOM_OK) {
			rc = loom_seterr(rc, "mesh: rank %d: creating the %s communicator: %s", m->rank, order[k].name,
			                 loom_errmsg());
			goto fail;
		}
		m->owned[a] = 1;
	}
	if ((rc = make_dpcp(m)) != LOOM_OK)
		goto fail;
	*out = m;
	return LOOM_OK;
fail:
	loom_mesh_destroy(m);
	return rc;
}

void loom_mesh_destroy(loom_mesh_t *m)
{
	if (!m)
		return;
	for (int a = 0; a < LOOM_MESH_AXES; a++)
		if (m->owned[a])
			loom_comm_destroy(m->comms[a]);
	if (m->dpcp_owned)
		loom_comm_destroy(m->dpcp);
	free(m);
}

static int valid(loom_mesh_axis_t a)
{
	return (int)a >= 0 && a < LOOM_MESH_AXES;
}

int loom_mesh_size(const loom_mesh_t *m, loom_mesh_axis_t axis)
{
	return valid(axis) ? m->sizes[axis] : 0;
}

int loom_mesh_coord(const loom_mesh_t *m, loom_mesh_axis_t axis)
{
	return valid(axis) ? m->coords[axis] : -1;
}

loom_comm_t *loom_mesh_comm(const loom_mesh_t *m, loom_mesh_axis_t axis)
{
	return valid(axis) ? m->comms[axis] : NULL;
}

loom_comm_t *loom_mesh_dpcp_comm(const loom_mesh_t *m)
{
	return m->dpcp;
}

loom_comm_t *loom_mesh_world(const loom_mesh_t *m)
{
	return m->world;
}

int loom_mesh_world_rank(const loom_mesh_t *m)
{
	return m->rank;
}

int loom_mesh_world_size(const loom_mesh_t *m)
{
	return m->size;
}

#define APPEND(...)                                                                                   \
	do {                                                                                              \
		int n_ = snprintf(len < cap ? buf + len : NULL, len < cap ? cap - len : 0, __VA_ARGS__);      \
		len += n_ > 0 ? (size_t)n_ : 0;                                                               \
	} while (0)

int loom_mesh_axis_hosts(const loom_mesh_t *m, loom_mesh_axis_t axis)
{
	int first, hosts = 0, seen[64];
	if (!valid(axis))
		return 0;
	first = m->rank - m->coords[axis] * m->strides[axis];
	for (int i = 0; i < m->sizes[axis]; i++) {
		int h = loom_comm_host(m->world, first + i * m->strides[axis]), k;
		for (k = 0; k < hosts && k < 64 && seen[k] != h; k++)
			;
		if (k == hosts && hosts < 64)
			seen[hosts++] = h;
	}
	return hosts;
}

size_t loom_mesh_hosts_describe(const loom_mesh_t *m, char *buf, size_t cap)
{
	size_t len = 0;
	int hosts = 1;
	if (cap)
		buf[0] = 0;
	for (int r = 0; r < m->size; r++)
		hosts = LOOM_MAX(hosts, loom_comm_host(m->world, r) + 1);
	APPEND("hosts: %d", hosts);
	for (int k = 0; k < LOOM_MESH_AXES; k++) {
		loom_mesh_axis_t a = order[k].axis;
		if (m->sizes[a] == 1)
			continue;
		int n = loom_mesh_axis_hosts(m, a);
		APPEND("; %s %s", order[k].name, n > 1 ? "across hosts" : "within a host");
	}
	return len;
}

size_t loom_mesh_describe(const loom_mesh_t *m, char *buf, size_t cap)
{
	size_t len = 0;
	if (cap)
		buf[0] = 0;
	int cp = m->sizes[LOOM_MESH_CP];
	APPEND("mesh dp %d x %stp %d x pp %d = %d ranks; world rank =", m->sizes[LOOM_MESH_DP], cp_text(m->sizes),
	       m->sizes[LOOM_MESH_TP], m->sizes[LOOM_MESH_PP], m->size);
	for (int k = 0, n = 0; k < LOOM_MESH_AXES; k++) {
		loom_mesh_axis_t a = order[k].axis;
		if (a == LOOM_MESH_CP && cp == 1)
			continue;
		if (m->strides[a] == 1)
			APPEND("%s %s", n++ ? " +" : "", order[k].name);
		else
			APPEND("%s %d*%s", n++ ? " +" : "", m->strides[a], order[k].name);
	}
	APPEND("\n");
	for (int k = 0; k < LOOM_MESH_AXES; k++) {
		loom_mesh_axis_t a = order[k].axis;
		if (a == LOOM_MESH_CP && cp == 1)
			continue;
		int first = m->rank - m->coords[a] * m->strides[a];
		APPEND("  %s: stride %d, this rank (%d) at %d of {", order[k].name, m->strides[a], m->rank, m->coords[a]);
		for (int i = 0; i < m->sizes[a]; i++)
			APPEND("%s%d", i ? ", " : "", first + i * m->strides[a]);
		APPEND("}\n");
	}
	if (cp > 1) { /* the data-parallel group, in its rank order cp + CP dp */
		int sd = m->strides[LOOM_MESH_DP], sc = m->strides[LOOM_MESH_CP];
		int first = m->rank - m->coords[LOOM_MESH_DP] * sd - m->coords[LOOM_MESH_CP] * sc;
		APPEND("  dp x cp: this rank (%d) at %d of {", m->rank,
		       m->coords[LOOM_MESH_CP] + cp * m->coords[LOOM_MESH_DP]);
		for (int i = 0; i < m->sizes[LOOM_MESH_DP]; i++)
			for (int j = 0; j < cp; j++)
				APPEND("%s%d", i || j ? ", " : "", first + i * sd + j * sc);
		APPEND("}\n");
	}
	return len;
}
