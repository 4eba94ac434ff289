/* select.c: which algorithm runs a collective: the implementation table, the selection rule keyed on
 * (operation, rank count, bytes), LOOM_ALGO parsing, and loom_algo_run.
 *
 * The rule is data (one short list of entries per operation, first match wins) so that the code
 * that chooses and the text `loom bench comm --verbose` prints cannot disagree. "bytes" is the
 * size nccl-tests reports: the whole vector for allreduce/reduce/broadcast, size*count elements for
 * allgather and reduce_scatter. The choice depends only on values every rank shares, so all ranks
 * of a collective pick the same algorithm. Thresholds were measured with `loom bench comm` on a
 * 2-core machine (2 ranks, and 4/8 ranks oversubscribed). */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "comm/algo/algo.h"
#include "comm/transport.h"

static const char *const coll_names[LOOM_COLL_COUNT] = {"allreduce", "reduce", "broadcast", "allgather",
                                                        "reduce_scatter", "barrier", "allgatherv",
                                                        "reduce_scatterv"};
static const char *const algo_names[LOOM_ALGO_COUNT] = {"auto", "ring", "rhd", "rd", "tree"};

/* impl[coll][algo]: NULL where the algorithm does not implement the operation. */
static const loom_algo_fn impl[LOOM_COLL_COUNT][LOOM_ALGO_COUNT] = {
	[LOOM_COLL_ALLREDUCE] = {[LOOM_ALGO_RING] = loom_ring_allreduce, [LOOM_ALGO_RHD] = loom_rhd_allreduce,
	                         [LOOM_ALGO_RD] = loom_rd_allreduce, [LOOM_ALGO_TREE] = loom_tree_allreduce},
	[LOOM_COLL_REDUCE] = {[LOOM_ALGO_TREE] = loom_tree_reduce},
	[LOOM_COLL_BROADCAST] = {[LOOM_ALGO_TREE] = loom_tree_broadcast},
	[LOOM_COLL_ALLGATHER] = {[LOOM_ALGO_RING] = loom_ring_allgather, [LOOM_ALGO_RD] = loom_rd_allgather},
	[LOOM_COLL_REDUCE_SCATTER] = {[LOOM_ALGO_RING] = loom_ring_reduce_scatter,
	                              [LOOM_ALGO_RHD] = loom_rhd_reduce_scatter},
	[LOOM_COLL_BARRIER] = {[LOOM_ALGO_RD] = loom_rd_barrier, [LOOM_ALGO_TREE] = loom_tree_barrier},
	[LOOM_COLL_ALLGATHERV] = {[LOOM_ALGO_RING] = loom_ring_allgatherv},
	[LOOM_COLL_REDUCE_SCATTERV] = {[LOOM_ALGO_RING] = loom_ring_reduce_scatterv},
};

/* One entry of the rule: applies when nranks <= max_ranks and bytes <= max_bytes. */
typedef struct {
	int max_ranks;
	size_t max_bytes;
	loom_algo_t algo;
} rule_t;

#define ANY_RANKS INT32_MAX
#define ANY_BYTES SIZE_MAX
#define RULE_MAX 5

/* Every list ends with an entry that matches everything. Measured (bench comm, best of interleaved
 * runs, 2 cores): at 2 ranks one recursive-doubling exchange beats the ring's two up to ~64 KiB,
 * and the ring (4 MiB segments) wins beyond on ordinary buffers and in place on registered ones;
 * at 4 ranks (oversubscribed) recursive doubling and halving-doubling tie up to ~8 KiB and
 * halving-doubling wins up to ~8 MiB (its log2(n) steps cost fewer context switches than the
 * ring's n-1); at 8 ranks the ring wins from ~2 MiB. */
static const rule_t rules[LOOM_COLL_COUNT][RULE_MAX] = {
	[LOOM_COLL_ALLREDUCE] = {{2, 64 << 10, LOOM_ALGO_RD},
	                         {2, ANY_BYTES, LOOM_ALGO_RING},
	                         {ANY_RANKS, 8 << 10, LOOM_ALGO_RD},
	                         {ANY_RANKS, 4 << 20, LOOM_ALGO_RHD},
	                         {ANY_RANKS, ANY_BYTES, LOOM_ALGO_RING}},
	[LOOM_COLL_REDUCE] = {{ANY_RANKS, ANY_BYTES, LOOM_ALGO_TREE}},
	[LOOM_COLL_BROADCAST] = {{ANY_RANKS, ANY_BYTES, LOOM_ALGO_TREE}},
	[LOOM_COLL_ALLGATHER] = {{ANY_RANKS, 64 << 10, LOOM_ALGO_RD}, {ANY_RANKS, ANY_BYTES, LOOM_ALGO_RING}},
	[LOOM_COLL_REDUCE_SCATTER] = {{ANY_RANKS, 64 << 10, LOOM_ALGO_RHD}, {ANY_RANKS, ANY_BYTES, LOOM_ALGO_RING}},
	[LOOM_COLL_BARRIER] = {{ANY_RANKS, ANY_BYTES, LOOM_ALGO_RD}},
	[LOOM_COLL_ALLGATHERV] = {{ANY_RANKS, ANY_BYTES, LOOM_ALGO_RING}},
	[LOOM_COLL_REDUCE_SCATTERV] = {{ANY_RANKS, ANY_BYTES, LOOM_ALGO_RING}},
};

const char *loom_coll_name(loom_coll_t coll)
{
	return (unsigned)coll < LOOM_COLL_COUNT ? coll_names[coll] : "?";
}

const char *loom_algo_name(loom_algo_t algo)
{
	return (unsigned)algo < LOOM_ALGO_COUNT ? algo_names[algo] : "?";
}

loom_algo_fn loom_algo_impl(loom_coll_t coll, loom_algo_t algo)
{
	if ((unsigned)coll >= LOOM_COLL_COUNT || (unsigned)algo >= LOOM_ALGO_COUNT)
		return NULL;
	return impl[coll][algo];
}

/* "auto, ring, rd" for the algorithms that implement coll. */
static void valid_algos(loom_coll_t coll, char *buf, size_t cap)
{
	size_t len = (size_t)snprintf(buf, cap, "auto");
	for (int a = 1; a < LOOM_ALGO_COUNT && len < cap; a++)
		if (impl[coll][a])
			len += (size_t)snprintf(buf + len, cap - len, ", %s", algo_names[a]);
}

static int parse_fail(char *err, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int parse_fail(char *err, size_t cap, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	if (err && cap)
		vsnprintf(err, cap, fmt, ap);
	va_end(ap);
	return LOOM_EINVAL;
}

int loom_algo_parse(const char *spec, loom_algo_t choice[LOOM_COLL_COUNT], char *err, size_t cap)
{
	char entry[64], valid[96];
	for (int i = 0; i < LOOM_COLL_COUNT; i++)
		choice[i] = LOOM_ALGO_AUTO;
	if (err && cap)
		err[0] = '\0';
	if (!spec)
		return LOOM_OK;
	for (const char *p = spec; *p;) {
		const char *end = strchr(p, ',');
		size_t len = end ? (size_t)(end - p) : strlen(p);
		if (len >= sizeof entry)
			return parse_fail(err, cap, "LOOM_ALGO=\"%s\": entry \"%.*s...\" is too long", spec, 24, p);
		memcpy(entry, p, len);
		entry[len] = '\0';
		p = end ? end + 1 : p + strlen(p);
		if (len == 0)
			continue; /* tolerate "a:b," and ",," */
		char *colon = strchr(entry, ':');
		if (!colon)
			return parse_fail(err, cap, "LOOM_ALGO=\"%s\": entry \"%s\" is not OP:ALGO "
			                  "(e.g. allreduce:ring,allgather:rd)", spec, entry);
		*colon = '\0';
		const char *op = entry, *alg = colon + 1;
		int coll = -1, algo = -1;
		for (int i = 0; i < LOOM_COLL_COUNT; i++)
			if (strcmp(op, coll_names[i]) == 0)
				coll = i;
		if (coll < 0)
			return parse_fail(err, cap, "LOOM_ALGO=\"%s\": unknown operation \"%s\" (valid: allreduce, "
			                  "reduce, broadcast, allgather, reduce_scatter, barrier, allgatherv, reduce_scatterv)",
			                  spec, op);
		for (int i = 0; i < LOOM_ALGO_COUNT; i++)
			if (strcmp(alg, algo_names[i]) == 0)
				algo = i;
		valid_algos((loom_coll_t)coll, valid, sizeof valid);
		if (algo < 0)
			return parse_fail(err, cap, "LOOM_ALGO=\"%s\": unknown algorithm \"%s\" for %s (valid for %s: %s)",
			                  spec, alg, op, op, valid);
		if (algo != LOOM_ALGO_AUTO && !impl[coll][algo])
			return parse_fail(err, cap, "LOOM_ALGO=\"%s\": algorithm \"%s\" does not implement %s (valid for %s: %s)",
			                  spec, alg, op, op, valid);
		choice[coll] = (loom_algo_t)algo;
	}
	return LOOM_OK;
}

loom_algo_t loom_algo_select(loom_coll_t coll, int nranks, size_t bytes, loom_algo_t forced)
{
	if ((unsigned)coll >= LOOM_COLL_COUNT)
		return LOOM_ALGO_AUTO;
	if (forced != LOOM_ALGO_AUTO && (unsigned)forced < LOOM_ALGO_COUNT && impl[coll][forced])
		return forced;
	for (int i = 0; i < RULE_MAX; i++) {
		const rule_t *r = &rules[coll][i];
		if (nranks <= r->max_ranks && bytes <= r->max_bytes)
			return r->algo;
	}
	return LOOM_ALGO_AUTO; /* unreachable: every list ends with a catch-all */
}

static void print_bytes(FILE *f, size_t b)
{
	if (b >= (1u << 20) && b % (1u << 20) == 0)
		fprintf(f, "%zu MiB", b >> 20);
	else if (b >= 1024 && b % 1024 == 0)
		fprintf(f, "%zu KiB", b >> 10);
	else
		fprintf(f, "%zu B", b);
}

void loom_algo_print_rule(void *file)
{
	FILE *f = file;
	for (int c = 0; c < LOOM_COLL_COUNT; c++) {
		fprintf(f, "# %-15s", coll_names[c]);
		for (int i = 0; i < RULE_MAX; i++) {
			const rule_t *r = &rules[c][i];
			int last = r->max_ranks == ANY_RANKS && r->max_bytes == ANY_BYTES;
			fprintf(f, "%s%s", i ? "; " : "", algo_names[r->algo]);
			if (last) {
				fprintf(f, i ? " otherwise" : " always");
				break;
			}
			fprintf(f, " if");
			if (r->max_ranks != ANY_RANKS)
				fprintf(f, " ranks <= %d", r->max_ranks);
			if (r->max_ranks != ANY_RANKS && r->max_bytes != ANY_BYTES)
				fprintf(f, " and");
			if (r->max_bytes != ANY_BYTES) {
				fprintf(f, " bytes <= ");
				print_bytes(f, r->max_bytes);
			}
		}
		char valid[96];
		valid_algos((loom_coll_t)c, valid, sizeof valid);
		fprintf(f, "   (LOOM_ALGO=%s:{%s})\n", coll_names[c], valid);
	}
}

/* Bytes the rule is keyed on (see the top of the file). */
static size_t coll_bytes(const loom_coll_args_t *a, int n)
{
	size_t b = a->count * loom_dtype_size(a->dt);
	if (a->counts)
		return a->total * loom_dtype_size(a->dt);
	if (a->coll == LOOM_COLL_ALLGATHER || a->coll == LOOM_COLL_REDUCE_SCATTER)
		b *= (size_t)n;
	return a->coll == LOOM_COLL_BARRIER ? 0 : b;
}

int loom_algo_run(loom_comm_t *c, const loom_coll_args_t *a, loom_algo_t forced)
{
	if ((unsigned)a->coll >= LOOM_COLL_COUNT)
		return loom_comm_fail(c, LOOM_EINVAL, "unknown collective %d", (int)a->coll);
	int n = loom_comm_size(c);
	loom_algo_t algo = loom_algo_select(a->coll, n, coll_bytes(a, n), forced);
	loom_algo_fn fn = loom_algo_impl(a->coll, algo);
	if (!fn)
		return loom_comm_fail(c, LOOM_ENOTSUP, "no algorithm implements %s", coll_names[a->coll]);
	return fn(c, a);
}
