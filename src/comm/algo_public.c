/* algo_public.c: the public face of algorithm selection (loom/comm.h): which algorithm a communicator
 * runs an operation with, LOOM_ALGO checking and the selection rule's text, for tools such as
 * `loom bench comm --verbose`. It only translates names: the rule itself, its table and its printer
 * stay in algo/select.c, so what a tool reports is what loom_algo_run does. On a communicator spanning
 * hosts, the collectives hier.c runs hierarchically are named "h-" and their inter-host algorithm. */
#include <string.h>

#include "comm/comm_internal.h"
#include "core/util.h"

/* The operation called `op`, or -1. */
static int coll_of(const char *op)
{
	for (int k = 0; op && k < LOOM_COLL_COUNT; k++)
		if (strcmp(op, loom_coll_name((loom_coll_t)k)) == 0)
			return k;
	return -1;
}

const char *loom_comm_algo(const loom_comm_t *c, const char *op, size_t bytes)
{
	int k = coll_of(op);
	if (!c || k < 0)
		return NULL;
	if (loom__hier_handles(c, (loom_coll_t)k)) { /* "h-" + the inter-host phase's algorithm (hier.c) */
		static const char *const h[LOOM_ALGO_COUNT] = {"h-auto", "h-ring", "h-rhd", "h-rd", "h-tree"};
		size_t part = k == LOOM_COLL_ALLREDUCE ? bytes / (size_t)c->hL : bytes;
		if (k == LOOM_COLL_ALLREDUCE && c->hcross->xp.ops->allreduce && loom__hier_cross_mpi(c, part))
			return "h-mpi";
		if (k == LOOM_COLL_ALLREDUCE && loom__hier_cross_pipe(c, part))
			return "h-pipe";
		return h[loom_algo_select((loom_coll_t)k, c->hcross->size, part, c->hcross->forced[k])];
	}
	return loom_algo_name(loom_algo_select((loom_coll_t)k, c->size, bytes, c->forced[k]));
}

int loom_comm_algo_check(const char *spec)
{
	loom_algo_t choice[LOOM_COLL_COUNT];
	char err[512];
	if (loom_algo_parse(spec, choice, err, sizeof err) != LOOM_OK)
		return loom_seterr(LOOM_EINVAL, "%s", err);
	return LOOM_OK;
}

void loom_comm_algo_rule(void *file)
{
	loom_algo_print_rule(file);
}
