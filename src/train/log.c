/* log.c: the training log (JSON Lines, written by rank 0 only) and the run summary.
 *
 * The first line is the config record, {"config":{...}}: every setting, the model, the loom version,
 * git describe, host and thread count. Then one object per optimizer step, each starting with
 * {"step":N, so that a resumed run can keep exactly the lines of the steps its checkpoint contains
 * (a run that died after its last checkpoint leaves lines for steps that will be redone; they are
 * dropped) and append the rest, giving the same step lines as an uninterrupted run. The last line of
 * a run that finished is {"summary":{...}} (loom_train_summary_t); a resume drops it and appends a
 * new one at its end.
 *
 * Segments: a resume whose settings differ from the record in force at its checkpoint (another
 * world size, accumulation, --steps, mesh, ...; not the environment: version, host, measured peaks,
 * the prediction) appends a config record of its own before its first step line, with "first_step"
 * (the first step it runs) and "resumed_from". So every step line is described by the last config
 * record above it, and a resume at step S keeps the records of segments that start at or before S
 * (a record without "first_step", the run's first, starts at 1) and drops those of abandoned ones.
 *
 * Non-finite numbers are written as null (JSON has no NaN). Lines are flushed as written; before a
 * checkpoint is committed the log is fsync'ed too (loom__train_log_sync), so the line of every step a
 * checkpoint holds is on disk. Invariant of every step line: exposed_comm_ms <= comm_ms (the rest of the wait is wait_ms). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/json.h"
#include "core/util.h"
#include "loom/util.h"
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

/* The first step of the segment a config record line describes: its "first_step", else 1 (the run's
 * first record, or one that does not parse). */
static long long config_first_step(const char *line, size_t len)
{
	json_t v;
	char err[160];
	long long first = 1;
	int64_t x;
	if (loom__json_parse(line, len, &v, err, sizeof err) == 0) {
		const json_t *c = loom__json_get(&v, "config"), *f = c ? loom__json_get(c, "first_step") : NULL;
		if (f && loom__json_to_i64(f, &x) == 0)
			first = x;
	}
	loom__json_free(&v);
	return first;
}

/* Rewrite path keeping only the lines of steps <= keep, the event rows at steps <= keep and the config
 * records of segments that start at or before keep (atomically: temp file + rename). *last (NULL when none) gets a copy of the last
 * config record kept, to be freed. */
static int truncate_log(const char *path, long long keep, char **last)
{
	FILE *in = fopen(path, "r"), *out;
	char tmp[1100], *line = NULL;
	size_t cap = 0;
	long len;
	*last = NULL;
	if (!in)
		return LOOM_OK; /* nothing to keep */
	snprintf(tmp, sizeof tmp, "%s.tmp", path);
	if (!(out = fopen(tmp, "w"))) {
		fclose(in);
		return loom_seterr(LOOM_ESYS, "log %s: cannot create %s", path, tmp);
	}
	while ((len = read_line(in, &line, &cap)) > 0) {
		long long step;
		int config = strncmp(line, "{\"config\":", 10) == 0;
		if (config && config_first_step(line, (size_t)len) <= keep) {
			free(*last);
			if (!(*last = loom__strdup(line))) {
				len = -1;
				loom_seterr(LOOM_ENOMEM, "out of memory for a config record of %ld bytes", (long)strlen(line));
				break;
			}
			fwrite(line, 1, (size_t)len, out);
		} else if (!config && sscanf(line, "{\"step\":%lld", &step) == 1 && step <= keep) {
			fwrite(line, 1, (size_t)len, out);
		} else if (sscanf(line, "{\"event\":\"%*[a-z_]\",\"step\":%lld", &step) == 1 && step <= keep) {
			fwrite(line, 1, (size_t)len, out); /* an event row at step S (train.h: log_event) */
		}
	}
	free(line);
	fclose(in);
	if (len < 0) {
		fclose(out);
		remove(tmp);
		free(*last), *last = NULL;
		return loom_seterr(LOOM_ENOMEM, "log %s: %s", path, loom_errmsg());
	}
	if (fclose(out) != 0 || rename(tmp, path) != 0) {
		remove(tmp);
		free(*last), *last = NULL;
		return loom_seterr(LOOM_EIO, "log %s: cannot rewrite it", path);
	}
	return LOOM_OK;
}

/* The keys of a config record that describe where and how fast the run is, not its settings: a resume
 * that differs only in these continues the segment. */
static int environment_key(const char *key)
{
	static const char *const env[] = {"loom_version", "git", "host", "peak_flops", "peak_source", "gemm_peak_flops",
	                                  "predicted_step_s", "predicted_memory_bytes", "plan", "first_step",
	                                  "resumed_from"};
	for (size_t i = 0; i < sizeof env / sizeof *env; i++)
		if (!strcmp(key, env[i]))
			return 1;
	return 0;
}

/* Two JSON values alike: the same type and, numbers by their text, the same contents in order. */
static int json_same(const json_t *a, const json_t *b)
{
	if (a->type != b->type)
		return 0;
	switch (a->type) {
	case JSON_NULL:
		return 1;
	case JSON_BOOL:
		return a->boolean == b->boolean;
	case JSON_NUMBER:
		return strcmp(a->s, b->s) == 0;
	case JSON_STRING:
		return a->slen == b->slen && memcmp(a->s, b->s, a->slen) == 0;
	default: /* array, object */
		if (a->n != b->n)
			return 0;
		for (int i = 0; i < a->n; i++)
			if ((a->type == JSON_OBJECT && strcmp(a->kids[i].key, b->kids[i].key) != 0) ||
			    !json_same(&a->kids[i], &b->kids[i]))
				return 0;
		return 1;
	}
}

/* 1 when config record lines `a` and `b` hold the same settings (every key but the environment's, in
 * either), 0 when not or when one does not parse. */
static int same_settings(const char *a, const char *b)
{
	json_t va, vb;
	char err[160];
	int same = 0, oka = loom__json_parse(a, strlen(a), &va, err, sizeof err) == 0;
	int okb = loom__json_parse(b, strlen(b), &vb, err, sizeof err) == 0;
	if (oka && okb) {
		const json_t *ca = loom__json_get(&va, "config"), *cb = loom__json_get(&vb, "config");
		same = ca && cb && ca->type == JSON_OBJECT && cb->type == JSON_OBJECT;
		for (int k = 0; same && k < 2; k++) { /* every key of one is in the other, alike */
			const json_t *x = k ? cb : ca, *y = k ? ca : cb;
			for (int i = 0; same && i < x->n; i++) {
				const json_t *other = loom__json_get(y, x->kids[i].key);
				if (!environment_key(x->kids[i].key))
					same = other && json_same(&x->kids[i], other);
			}
		}
	}
	loom__json_free(&va);
	loom__json_free(&vb);
	return same;
}

static void num(FILE *f, const char *key, double v, const char *fmt);

/* A figure at the family's nominal FLOP count (loom_model_flops_per_token_nominal) under
 * "<prefix><family>" (mfu_nanochat, mfu_gpt2): as the family's reference implementation counts,
 * named after it. */
static void nominal(FILE *f, const loom_trainer_t *tr, const char *prefix, double v, const char *fmt)
{
	char key[64];
	snprintf(key, sizeof key, "%s%s", prefix, loom_arch_name(tr->mcfg.arch));
	num(f, key, v, fmt);
}

static void str(FILE *f, const char *key, const char *v)
{
	fprintf(f, ",\"%s\":", key);
	if (v)
		loom__json_write_string(f, v, strlen(v));
	else
		fputs("null", f);
}

/* The config record: every setting of the run, and where it ran. */
static void write_config(loom_trainer_t *tr, FILE *f)
{
	const loom_train_config_t *c = &tr->cfg;
	char host[256] = "";
	if (gethostname(host, sizeof host - 1) != 0)
		host[0] = 0;
	fprintf(f, "{\"config\":{\"loom_version\":\"%s\"", loom_version());
	str(f, "git", loom_git_describe());
	str(f, "host", host);
	fprintf(f, ",\"threads\":%d,\"world\":%d,\"dp\":%d,\"tp\":%d,\"pp\":%d,\"cp\":%d", loom_num_threads(),
	        tr->world, tr->dp_size, tr->tp ? loom_comm_size(tr->tp) : 1, tr->pp_size, tr->cp_size);
	fprintf(f, ",\"model\":{\"n_layer\":%d,\"n_head\":%d,\"n_embd\":%d,\"n_positions\":%d,\"vocab_size\":%d,"
	        "\"params\":%zu}", tr->mcfg.n_layer, tr->mcfg.n_head, tr->mcfg.n_embd, tr->mcfg.seq_len,
	        tr->mcfg.vocab_size, loom_model_num_params(&tr->mcfg));
	str(f, "train_data", c->train_data);
	str(f, "val_data", c->val_data);
	fprintf(f, ",\"batch_size\":%d,\"seq_len\":%d,\"grad_accum\":%d,\"tokens_per_step\":%lld,\"shuffle\":%d,"
	        "\"seed\":%llu", c->B, c->T, c->accum, loom_trainer_tokens_per_step(tr), c->shuffle,
	        (unsigned long long)c->seed);
	fprintf(f, ",\"steps\":%lld", c->lr.total_steps);
	num(f, "lr", c->lr.peak_lr, "%.9g");
	fprintf(f, ",\"warmup\":%lld", c->lr.warmup);
	str(f, "schedule", loom_schedule_name(c->lr.kind));
	num(f, "min_lr_frac", c->lr.min_lr_frac, "%.9g");
	num(f, "beta1", c->adamw.beta1, "%.9g");
	num(f, "beta2", c->adamw.beta2, "%.9g");
	num(f, "eps", c->adamw.eps, "%.9g");
	num(f, "weight_decay", c->adamw.weight_decay, "%.9g");
	num(f, "grad_clip", c->grad_clip, "%.9g");
	fprintf(f, ",\"eval_every\":%d,\"eval_batches\":%d", c->eval_every, c->eval_batches);
	str(f, "save_dir", c->save_dir);
	fprintf(f, ",\"save_every\":%d,\"keep_checkpoints\":%d", c->save_every, c->keep_checkpoints);
	str(f, "tokenizer", c->tokenizer);
	str(f, "strategy", c->strategy ? c->strategy : "ddp");
	fprintf(f, ",\"zero\":%d", c->zero);
	num(f, "bucket_mb", c->bucket_mb, "%.9g");
	fprintf(f, ",\"check_replicas\":%d", c->check_replicas);
	str(f, "dtype", loom_compute_dtype_name(loom_model_dtype(tr->model)));
	str(f, "grad_reduce_dtype", c->grad_reduce_dtype == LOOM_BFLOAT16 ? "bf16" : "fp32");
	num(f, "peak_flops", c->peak_flops, "%.6g");
	str(f, "peak_source", c->peak_source);
	num(f, "gemm_peak_flops", c->gemm_flops, "%.6g");
	num(f, "flops_per_token", tr->flops_per_token, "%.6g");
	nominal(f, tr, "flops_per_token_", tr->flops_nominal, "%.6g");
	if (c->predicted_step_s > 0)
		fprintf(f, ",\"predicted_step_s\":%.6g,\"predicted_memory_bytes\":%.0f", c->predicted_step_s,
		        c->predicted_memory_bytes);
	if (tr->plan_json) /* the planner's whole prediction, as `loom plan --json` prints it */
		fprintf(f, ",\"plan\":%s", tr->plan_json);
	loom_train_memory_t mem;
	loom_trainer_memory(tr, &mem);
	str(f, "activation_checkpointing", loom_act_ckpt_name(mem.act_ckpt));
	fprintf(f, ",\"activation_bytes\":{\"kept\":%zu,\"recompute\":%zu,\"head\":%zu,\"backward\":%zu,\"total\":%zu,"
	        "\"formula\":%zu}", mem.act.kept, mem.act.recompute, mem.act.head, mem.act.backward, mem.act.total,
	        mem.act_formula);
	if (tr->resumed) { /* a segment of its own: where it starts and what it continues */
		fprintf(f, ",\"first_step\":%lld", tr->base_step + 1);
		str(f, "resumed_from", tr->resumed_from);
	}
	fputs("}}\n", f);
}

int loom_train_log_open(loom_trainer_t *tr)
{
	const char *path = tr->cfg.log_path;
	char *last = NULL, *record = NULL;
	size_t len = 0;
	FILE *m;
	int rc;
	if (tr->log)
		return LOOM_OK;
	if (tr->resumed && (rc = truncate_log(path, tr->step, &last)) != LOOM_OK)
		return rc;
	/* this segment's record; a resume writes it only when its settings differ from the record in force */
	if (!(m = open_memstream(&record, &len))) {
		free(last);
		return loom_seterr(LOOM_ENOMEM, "log %s: out of memory for the config record", path);
	}
	write_config(tr, m);
	if (fclose(m) != 0 || !record) {
		free(last), free(record);
		return loom_seterr(LOOM_ENOMEM, "log %s: out of memory for the config record", path);
	}
	int write = !tr->resumed || !last || !same_settings(last, record);
	free(last);
	tr->log = fopen(path, tr->resumed ? "a" : "w");
	if (!tr->log) {
		free(record);
		return loom_seterr(LOOM_ESYS, "cannot open the log file %s for writing", path);
	}
	if (write)
		fputs(record, tr->log);
	free(record);
	if (fflush(tr->log) != 0 || ferror(tr->log))
		return loom_seterr(LOOM_EIO, "writing the log file %s failed", path);
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
	num(f, "optim_ms", m->optim_ms, "%.3f");
	num(f, "loss_ema", m->loss_ema, "%.9g");
	num(f, "tokens_per_s", m->tokens_per_s, "%.1f");
	num(f, "mfu", m->mfu, "%.4f");
	nominal(f, tr, "mfu_", m->mfu_nominal, "%.4f");
	if (tr->world > 1) {
		num(f, "comm_ms", m->comm_ms, "%.3f");
		num(f, "exposed_comm_ms", m->exposed_comm_ms, "%.3f");
		num(f, "wait_ms", m->wait_ms, "%.3f");
	}
	if (tr->pp) { /* the pipeline's measured bubble beside (P-1)/(M+P-1) */
		num(f, "bubble", m->bubble, "%.4f");
		num(f, "bubble_theory", m->bubble_theory, "%.4f");
		num(f, "bubble_expected", m->bubble_expected, "%.4f");
		fprintf(f, ",\"p2p_bytes\":%llu", m->p2p_bytes);
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

static void sample_step(loom_trainer_t *tr, const loom_step_metrics_t *m);

void loom__train_summary_add(loom_trainer_t *tr, const loom_step_metrics_t *m)
{
	loom_train_summary_t *s = &tr->sum;
	double now = loom_now();
	if (s->steps == 0) {
		tr->t_begin = now - m->dt_ms * 1e-3; /* the start of the step */
		s->first_step = m->step;
	}
	s->last_step = m->step;
	s->steps++;
	s->tokens += loom_trainer_tokens_per_step(tr);
	s->wall_s = now - tr->t_begin;
	s->step_s += m->dt_ms * 1e-3;
	s->mean_tokens_per_s = s->step_s > 0 ? (double)s->tokens / s->step_s : 0.0;
	if (m->tokens_per_s > s->best_tokens_per_s)
		s->best_tokens_per_s = m->tokens_per_s;
	s->mean_mfu += (m->mfu - s->mean_mfu) / (double)s->steps;
	s->mean_mfu_nominal += (m->mfu_nominal - s->mean_mfu_nominal) / (double)s->steps;
	s->comm_ms += m->comm_ms, s->exposed_comm_ms += m->exposed_comm_ms, s->wait_ms += m->wait_ms;
	s->final_loss = m->loss;
	if (s->steps <= LOOM_TRAIN_WARMUP) { /* the warm-up's own figures, for a run that has nothing else */
		float *x = tr->first_steps + 4 * (s->steps - 1);
		x[0] = (float)(m->dt_ms * 1e-3), x[1] = (float)(m->optim_ms * 1e-3);
		x[2] = (float)((m->exposed_comm_ms + m->wait_ms) * 1e-3), x[3] = (float)m->bubble;
	}
	sample_step(tr, m);
	if (m->has_val && (!s->has_val || m->val_loss < s->best_val_loss)) {
		s->has_val = 1;
		s->best_val_loss = m->val_loss;
		s->best_val_step = m->step;
	}
}

/* Keep step m's parts for the medians (after warm-up): every step until the sample is full, then every
 * other one of those kept and every 2nd step after, and so on (an even sample of the run). */
static void sample_step(loom_trainer_t *tr, const loom_step_metrics_t *m)
{
	enum { CAP = 4096 };
	if (tr->sum.steps <= LOOM_TRAIN_WARMUP)
		return;
	if (!tr->samples) {
		if (!(tr->samples = malloc(sizeof(float) * 4 * CAP)))
			return; /* no medians: the summary says so */
		tr->sample_cap = CAP, tr->sample_stride = 1;
	}
	if (tr->sample_seen++ % tr->sample_stride != 0)
		return;
	if (tr->nsamples == tr->sample_cap) {
		for (int k = 0; k < tr->nsamples / 2; k++)
			memcpy(tr->samples + 4 * k, tr->samples + 4 * (2 * k), 4 * sizeof(float));
		tr->nsamples /= 2, tr->sample_stride *= 2;
		if ((tr->sample_seen - 1) % tr->sample_stride != 0)
			return;
	}
	float *x = tr->samples + 4 * tr->nsamples++;
	x[0] = (float)(m->dt_ms * 1e-3), x[1] = (float)(m->optim_ms * 1e-3);
	x[2] = (float)((m->exposed_comm_ms + m->wait_ms) * 1e-3), x[3] = (float)m->bubble;
}

static int cmp_float(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;
	return x < y ? -1 : x > y;
}

/* The median of part j of the first n of the samples (n x 4 floats); scratch holds n floats. */
static double median(const float *samples, int n, int j, float *scratch)
{
	for (int k = 0; k < n; k++)
		scratch[k] = samples[4 * k + j];
	qsort(scratch, (size_t)n, sizeof *scratch, cmp_float);
	return n % 2 ? scratch[n / 2] : 0.5 * ((double)scratch[n / 2 - 1] + scratch[n / 2]);
}

int loom_trainer_summary(const loom_trainer_t *tr, loom_train_summary_t *s)
{
	float first[4 * LOOM_TRAIN_WARMUP], *scratch;
	const float *x = tr->samples;
	int n = tr->nsamples;
	*s = tr->sum;
	s->warmup = LOOM_TRAIN_WARMUP;
	if (n == 0) { /* a run of at most the warm-up: its steps' own figures (the first ones, kept below) */
		s->warmup = 0;
		n = (int)LOOM_MIN(s->steps, (long long)LOOM_TRAIN_WARMUP);
		memcpy(first, tr->first_steps, sizeof first);
		x = first;
	}
	s->median_steps = n;
	if (n == 0 || !(scratch = malloc(sizeof(float) * (size_t)n)))
		return LOOM_OK;
	s->median_step_s = median(x, n, 0, scratch), s->median_optim_s = median(x, n, 1, scratch);
	s->median_comm_s = median(x, n, 2, scratch), s->median_bubble = median(x, n, 3, scratch);
	free(scratch);
	return LOOM_OK;
}

int loom__train_log_summary(loom_trainer_t *tr)
{
	const loom_train_summary_t *s = &tr->sum;
	FILE *f = tr->log;
	if (!f)
		return LOOM_OK;
	fprintf(f, "{\"summary\":{\"first_step\":%lld,\"last_step\":%lld,\"steps\":%lld,\"tokens\":%lld",
	        s->first_step, s->last_step, s->steps, s->tokens);
	num(f, "wall_s", s->wall_s, "%.3f");
	num(f, "step_s", s->step_s, "%.3f");
	num(f, "mean_tokens_per_s", s->mean_tokens_per_s, "%.1f");
	num(f, "best_tokens_per_s", s->best_tokens_per_s, "%.1f");
	num(f, "mean_mfu", s->mean_mfu, "%.4f");
	nominal(f, tr, "mean_mfu_", s->mean_mfu_nominal, "%.4f");
	num(f, "final_loss", s->final_loss, "%.9g");
	if (s->has_val) {
		num(f, "best_val_loss", s->best_val_loss, "%.9g");
		fprintf(f, ",\"best_val_step\":%lld", s->best_val_step);
	}
	if (tr->world > 1) {
		num(f, "comm_ms", s->comm_ms, "%.3f");
		num(f, "exposed_comm_ms", s->exposed_comm_ms, "%.3f");
		num(f, "wait_ms", s->wait_ms, "%.3f");
	}
	loom_train_summary_t med;
	loom_trainer_summary(tr, &med);
	fprintf(f, ",\"warmup\":%d,\"median_steps\":%lld", med.warmup, med.median_steps);
	num(f, "median_step_s", med.median_step_s, "%.6g");
	num(f, "median_optim_s", med.median_optim_s, "%.6g");
	num(f, "median_comm_s", med.median_comm_s, "%.6g");
	num(f, "median_bubble", med.median_bubble, "%.4f");
	str(f, "checkpoint", s->checkpoint[0] ? s->checkpoint : NULL);
	fputs("}}\n", f);
	if (fflush(f) != 0 || ferror(f))
		return loom_seterr(LOOM_EIO, "writing the log file %s failed", tr->cfg.log_path);
	return LOOM_OK;
}

int loom__train_log_sync(loom_trainer_t *tr)
{
	if (!tr->log)
		return LOOM_OK;
	if (fflush(tr->log) != 0 || fsync(fileno(tr->log)) != 0)
		return loom_seterr(LOOM_EIO, "log %s: flushing it to disk before the checkpoint failed", tr->cfg.log_path);
	return LOOM_OK;
}

void loom_train_log_close(loom_trainer_t *tr)
{
	if (tr->log)
		fclose(tr->log);
	tr->log = NULL;
}
