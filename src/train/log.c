/* log.c: the training log, one JSON object per optimizer step (JSON Lines), written by rank 0 only.
 *
 * Each line starts with {"step":N, so that a resumed run can keep exactly the lines of the steps
 * its checkpoint contains (a run that died after its last checkpoint leaves lines for steps that
 * will be redone; they are dropped) and append the rest, giving the same file as an uninterrupted
 * run. Non-finite numbers are written as null (JSON has no NaN). Lines are flushed as written. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "train/trainer_internal.h"

/* Read one line (with its newline, if any) into *buf, growing it through loom__realloc. Returns its
 * length, 0 at end of file, or -1 when out of memory (detail set). */
static long read_line(FILE *in, char **buf, size_t *cap)
{
	size_t len = 0;
	for (;;) {
		if (*cap - len < 2) {
			size_t ncap = *cap ? *cap * 2 : 4096;
			char *p = loom__realloc(*buf, ncap);
			if (!p) {
				loom_seterr(LOOM_ENOMEM, "out of memory for a log line of %zu bytes", ncap);
				return -1;
			}
			*buf = p, *cap = ncap;
		}
		if (!fgets(*buf + len, (int)LOOM_MIN(*cap - len, (size_t)1 << 30), in))
			return (long)len;
		len += strlen(*buf + len);
		if (len > 0 && (*buf)[len - 1] == '\n')
			return (long)len;
	}
}

/* Rewrite path keeping only the lines of steps <= keep (atomically: temp file + rename). */
static int truncate_log(const char *path, long long keep)
{
	FILE *in = fopen(path, "r"), *out;
	char tmp[1100], *line = NULL;
	size_t cap = 0;
	long len;
	if (!in)
		return LOOM_OK; /* nothing to keep */
	snprintf(tmp, sizeof tmp, "%s.tmp", path);
	if (!(out = fopen(tmp, "w"))) {
		fclose(in);
		return loom_seterr(LOOM_ESYS, "log %s: cannot create %s", path, tmp);
	}
	while ((len = read_line(in, &line, &cap)) > 0) {
		long long step;
		if (sscanf(line, "{\"step\":%lld", &step) == 1 && step <= keep)
			fwrite(line, 1, (size_t)len, out);
	}
	free(line);
	fclose(in);
	if (len < 0) {
		fclose(out);
		remove(tmp);
		return loom_seterr(LOOM_ENOMEM, "log %s: %s", path, loom_errmsg());
	}
	if (fclose(out) != 0 || rename(tmp, path) != 0) {
		remove(tmp);
		return loom_seterr(LOOM_EIO, "log %s: cannot rewrite it", path);
	}
	return LOOM_OK;
}

int loom_train_log_open(loom_trainer_t *tr)
{
	const char *path = tr->cfg.log_path;
	int rc;
	if (tr->log)
		return LOOM_OK;
	if (tr->resumed && (rc = truncate_log(path, tr->step)) != LOOM_OK)
		return rc;
	tr->log = fopen(path, tr->resumed ? "a" : "w");
	if (!tr->log)
		return loom_seterr(LOOM_ESYS, "cannot open the log file %s for writing", path);
	return LOOM_OK;
}

static void num(FILE *f, const char *key, double v, const char *fmt)
{
	fprintf(f, ",\"%s\":", key);
	if (isfinite(v))
		fprintf(f, fmt, v);
	else
		fputs("null", f);
}

int loom_train_log_write(loom_trainer_t *tr, const loom_step_metrics_t *m)
{
	FILE *f = tr->log;
	fprintf(f, "{\"step\":%lld", m->step);
	num(f, "loss", m->loss, "%.9g");
	num(f, "lr", m->lr, "%.9g");
	num(f, "grad_norm", m->grad_norm, "%.9g");
	num(f, "dt_ms", m->dt_ms, "%.3f");
	num(f, "tokens_per_s", m->tokens_per_s, "%.1f");
	num(f, "mfu", m->mfu, "%.4f");
	if (tr->world > 1) {
		num(f, "comm_ms", m->comm_ms, "%.3f");
		num(f, "exposed_comm_ms", m->exposed_comm_ms, "%.3f");
	}
	if (tr->pp) { /* the pipeline's measured bubble beside (P-1)/(M+P-1) */
		num(f, "bubble", m->bubble, "%.4f");
		num(f, "bubble_theory", m->bubble_theory, "%.4f");
		num(f, "bubble_expected", m->bubble_expected, "%.4f");
	}
	fprintf(f, ",\"tokens\":%lld", m->step * loom_trainer_tokens_per_step(tr));
	loom_train_memory_t mem;
	loom_trainer_memory(tr, &mem);
	fprintf(f, ",\"mem_model_states_bytes\":%zu,\"peak_rss_bytes\":%zu", mem.model_states, loom_peak_rss_bytes());
	if (m->has_val)
		num(f, "val_loss", m->val_loss, "%.9g");
	if (m->saved)
		fputs(",\"checkpoint\":true", f);
	fputs("}\n", f);
	if (fflush(f) != 0 || ferror(f))
		return loom_seterr(LOOM_EIO, "writing the log file %s failed", tr->cfg.log_path);
	return LOOM_OK;
}

void loom_train_log_close(loom_trainer_t *tr)
{
	if (tr->log)
		fclose(tr->log);
	tr->log = NULL;
}
