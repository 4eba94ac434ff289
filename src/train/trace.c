/* trace.c: a Chrome trace (JSON, opens in Perfetto and chrome://tracing) of every rank's training
 * steps, one track per rank: forward and backward per unit and micro-batch, waits for pipeline sends
 * and receives, all-reduces, the optimizer step, and the idle gaps between them.
 *
 * Events come from the step executor's callback (src/parallel/pp.h) and the trainer, on the training
 * thread, one after another: they never overlap, so a gap between two events of a step is time the
 * rank did nothing the trace knows of (a pipeline bubble, or waiting in a collective). They are kept
 * in memory (a step allocates only when the array grows) and written at the end: every rank writes
 * DIR/rank_R.jsonl (one event object per line), then after a barrier rank 0 merges them into
 * DIR/trace.json (written to a temporary file and renamed). Timestamps are the monotonic clock in
 * microseconds, shared by the ranks of one machine. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/util.h"
#include "train/trainer_internal.h"

typedef struct {
	int kind, mb, unit;
	double t0, t1;
} ev_t;

struct loom_trace {
	char *dir;
	int rank, written, oom;
	ev_t *ev;
	size_t n, cap;
};

static const char *const kind_name[LOOM_EV_KINDS + 2] = {
	[LOOM_EV_FORWARD] = "forward", [LOOM_EV_BACKWARD] = "backward", [LOOM_EV_SEND] = "send",
	[LOOM_EV_RECV] = "recv", [LOOM_EV_ALLREDUCE] = "allreduce", [LOOM_EV_OPTIM] = "optimizer", [LOOM_EV_CP] = "cp",
	[LOOM_EV_KINDS] = "step", [LOOM_EV_KINDS + 1] = "idle",
};

int loom__trace_open(struct loom_trace **out, const char *dir, int rank)
{
	struct loom_trace *t = loom__calloc(1, sizeof *t);
	*out = NULL;
	if (!t || !(t->dir = loom__strdup(dir))) {
		free(t);
		return loom_seterr(LOOM_ENOMEM, "trace: out of memory");
	}
	if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
		int e = errno;
		free(t->dir), free(t);
		return loom_seterr(LOOM_EIO, "trace: rank %d: cannot create the directory %s: %s", rank, dir, strerror(e));
	}
	t->rank = rank;
	*out = t;
	return LOOM_OK;
}

static void add(struct loom_trace *t, int kind, int mb, int unit, double t0, double t1)
{
	if (t->written || t->oom)
		return;
	if (t->n == t->cap) {
		size_t cap = t->cap ? 2 * t->cap : 4096;
		ev_t *p = loom__realloc(t->ev, cap * sizeof *p);
		if (!p) { /* the trace is incomplete, training goes on; the write reports it */
			t->oom = 1;
			return;
		}
		t->ev = p, t->cap = cap;
	}
	t->ev[t->n++] = (ev_t){kind, mb, unit, t0, t1};
}

void loom__trace_event(void *ctx, loom__event_kind_t kind, int mb, int unit, double t0, double t1)
{
	add(ctx, (int)kind, mb, unit, t0, t1);
}

void loom__trace_step(struct loom_trace *t, long long step, double t0, double t1)
{
	add(t, LOOM_EV_KINDS, (int)step, -2, t0, t1);
}

/* One event as a JSON object: name, category, complete event ("X") with start and duration in us. */
static void put(FILE *f, int rank, int kind, int mb, int unit, double t0, double t1, int first)
{
	char name[64];
	const char *k = kind_name[kind];
	if (kind == LOOM_EV_KINDS)
		snprintf(name, sizeof name, "step %d", mb);
	else if ((kind == LOOM_EV_FORWARD || kind == LOOM_EV_BACKWARD) && unit >= 0)
		snprintf(name, sizeof name, "%c%d h.%d", kind == LOOM_EV_FORWARD ? 'F' : 'B', mb, unit);
	else if (kind == LOOM_EV_FORWARD || kind == LOOM_EV_BACKWARD) /* -1 embedding, -3 head, -2 all */
		snprintf(name, sizeof name, "%c%d %s", kind == LOOM_EV_FORWARD ? 'F' : 'B', mb,
		         unit == -1 ? "embed" : unit == -3 ? "head" : "model");
	else if (kind == LOOM_EV_CP) /* unit: the hook's operation */
		snprintf(name, sizeof name, "cp %s", unit == LOOM_TP_ALLGATHER ? "all-gather"
		         : unit == LOOM_TP_REDUCE_SCATTER ? "reduce-scatter" : "ring wait");
	else if (mb >= 0)
		snprintf(name, sizeof name, "%s mb%d", k, mb);
	else
		snprintf(name, sizeof name, "%s", k);
	fprintf(f, "%s{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.1f,\"dur\":%.1f,"
	        "\"args\":{\"mb\":%d,\"unit\":%d}}", first ? "" : ",\n", name, k, rank, kind == LOOM_EV_KINDS ? 1 : 0,
	        t0 * 1e6, (t1 - t0) * 1e6, mb, unit);
}

static int write_rank(struct loom_trace *t)
{
	char path[1200];
	double prev = -1.0, step_end = -1.0;
	snprintf(path, sizeof path, "%s/rank_%d.jsonl", t->dir, t->rank);
	FILE *f = fopen(path, "w");
	if (!f)
		return loom_seterr(LOOM_EIO, "trace: rank %d: cannot write %s: %s", t->rank, path, strerror(errno));
	fprintf(f, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"name\":\"rank %d\"}}", t->rank,
	        t->rank);
	/* Step markers follow their step's events: walk the events, emitting idle gaps within a step. */
	for (size_t i = 0; i < t->n; i++) {
		const ev_t *e = &t->ev[i];
		if (e->kind == LOOM_EV_KINDS) {
			put(f, t->rank, e->kind, e->mb, e->unit, e->t0, e->t1, 0);
			prev = -1.0, step_end = e->t1;
			continue;
		}
		if (prev < 0)
			prev = step_end > 0 && e->t0 - step_end < 1.0 ? step_end : e->t0;
		if (e->t0 - prev > 20e-6) /* a gap of more than 20 us */
			put(f, t->rank, LOOM_EV_KINDS + 1, -1, -2, prev, e->t0, 0);
		put(f, t->rank, e->kind, e->mb, e->unit, e->t0, e->t1, 0);
		prev = LOOM_MAX(prev, e->t1);
	}
	fputc('\n', f);
	if (fclose(f) != 0)
		return loom_seterr(LOOM_EIO, "trace: rank %d: writing %s failed", t->rank, path);
	if (t->oom)
		return loom_seterr(LOOM_ENOMEM, "trace: rank %d: out of memory: the trace in %s is incomplete", t->rank, path);
	return LOOM_OK;
}

static int merge(const char *dir, int size)
{
	char path[1200], tmp[1200];
	int rc = LOOM_OK;
	snprintf(tmp, sizeof tmp, "%s/trace.json.tmp", dir);
	FILE *out = fopen(tmp, "w");
	if (!out)
		return loom_seterr(LOOM_EIO, "trace: cannot write %s: %s", tmp, strerror(errno));
	fputs("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n", out);
	for (int r = 0; r < size && rc == LOOM_OK; r++) {
		char buf[65536];
		size_t n;
		snprintf(path, sizeof path, "%s/rank_%d.jsonl", dir, r);
		FILE *in = fopen(path, "r");
		if (!in) {
			rc = loom_seterr(LOOM_EIO, "trace: rank %d's events %s are missing: %s", r, path, strerror(errno));
			break;
		}
		if (r > 0)
			fputs(",\n", out);
		while ((n = fread(buf, 1, sizeof buf, in)) > 0)
			fwrite(buf, 1, n, out);
		fclose(in);
	}
	fputs("]}\n", out);
	if (fclose(out) != 0 && rc == LOOM_OK)
		rc = loom_seterr(LOOM_EIO, "trace: writing %s failed", tmp);
	snprintf(path, sizeof path, "%s/trace.json", dir);
	if (rc == LOOM_OK && rename(tmp, path) != 0)
		rc = loom_seterr(LOOM_EIO, "trace: cannot rename %s to %s: %s", tmp, path, strerror(errno));
	if (rc != LOOM_OK)
		remove(tmp);
	return rc;
}

int loom__trace_close(struct loom_trace *t, loom_comm_t *world, int rank, int size)
{
	int rc = LOOM_OK;
	if (!t)
		return LOOM_OK;
	if (!t->written) {
		rc = write_rank(t);
		t->written = 1;
		int r = world && size > 1 ? loom_barrier(world) : LOOM_OK;
		if (r != LOOM_OK && rc == LOOM_OK)
			rc = loom_seterr(r, "trace: rank %d: waiting for the other ranks' events: %s", rank,
			                 loom_comm_errmsg(world));
		if (rc == LOOM_OK && rank == 0 && (world || size == 1))
			rc = merge(t->dir, size);
	}
	return rc;
}

void loom__trace_free(struct loom_trace *t)
{
	if (!t)
		return;
	free(t->ev), free(t->dir), free(t);
}
