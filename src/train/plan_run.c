/* plan_run.c: one prediction for a training run (loom/plan.h): the plan configuration of a run from
 * what `loom train` parses, this machine as its cluster (the peak cache's figures, the other work on
 * the machine), the plan's JSON, and the comparison of a plan with what the run measured.
 *
 * Why one file of its own: `loom plan --cluster local` and `loom train` (its start-up line, the config
 * record of its log and its summary) used to build their plans each their own way (a different cluster
 * set-up, load and averaging) and disagreed by 15-56%. Both now fill a loom_train_config_t and
 * loom_model_opts_t from the same flags and call loom_plan_config_of_run and loom_plan_local, so the
 * two cannot differ but by their flags; tests/test_plan.c compares the trainer's logged plan with
 * `loom plan --json` byte for byte.
 *
 * Thread-safe but for loom_cluster_this_machine's measurements (they use the CPUs). */
#include <glob.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "core/util.h"
#include "loom/data.h"
#include "loom/plan.h"

/* Bytes of the files a glob matches (0: none), and in *token_bytes the width of their tokens: 4 when
 * the first is a uint32 shard (magic LOOM_SHARD32_MAGIC), else 2 (the loader refuses a mix). */
static double glob_bytes(const char *pattern, int *token_bytes)
{
	glob_t g;
	double sum = 0.0;
	struct stat st;
	*token_bytes = 2;
	if (!pattern || !*pattern || glob(pattern, 0, NULL, &g) != 0)
		return 0.0;
	for (size_t k = 0; k < g.gl_pathc; k++)
		if (stat(g.gl_pathv[k], &st) == 0 && S_ISREG(st.st_mode)) {
			if (sum == 0.0) {
				FILE *f = fopen(g.gl_pathv[k], "rb");
				int32_t magic = 0;
				if (f && fread(&magic, 4, 1, f) == 1 && magic == LOOM_SHARD32_MAGIC)
					*token_bytes = 4;
				if (f)
					fclose(f);
			}
			sum += (double)st.st_size;
		}
	globfree(&g);
	return sum;
}

void loom_plan_config_of_run(const loom_train_config_t *tc, const loom_model_config_t *mc, const loom_model_opts_t *mo,
                             int dp, int pp, loom_plan_config_t *pc)
{
	memset(pc, 0, sizeof *pc);
	pc->model = *mc;
	pc->B = tc->B, pc->T = tc->T, pc->M = LOOM_MAX(tc->accum, 1);
	pc->dp = LOOM_MAX(dp, 1), pc->tp = LOOM_MAX(mo->tp_size, 1), pc->pp = LOOM_MAX(pp, 1);
	pc->cp = LOOM_MAX(mo->cp_size, 1), pc->cp_gather = loom_cp_attention_ring() == 0; /* --cp, LOOM_CP_ATTENTION */
	pc->zero = pc->dp * pc->cp > 1 ? tc->zero : 0; /* ZeRO over dp x cp */
	pc->act_ckpt = mo->act_ckpt;
	pc->sequence_parallel = pc->tp > 1 && mo->sequence_parallel;
	pc->dtype = mo->dtype;
	pc->grad_reduce_bf16 = tc->grad_reduce_dtype == LOOM_BFLOAT16;
	pc->schedule_gpipe = tc->pp_schedule && !strcmp(tc->pp_schedule, "gpipe");
	pc->virtual_stages = tc->pp_virtual_stages;
	pc->bucket_mb = tc->bucket_mb;
	pc->pp_head_split = tc->pp_head_split;
	pc->impl = LOOM_PLAN_LOOM;
	pc->optimizer = (int)tc->optimizer;
	pc->steps = LOOM_MAX(tc->lr.total_steps, 0);
	pc->shuffle = tc->shuffle;
	pc->train_bytes = glob_bytes(tc->train_data, &pc->token_bytes);
	if (tc->val_data && *tc->val_data && tc->eval_batches > 0) { /* evaluated at least at the last step */
		int val_token_bytes; /* the trainer refuses validation data of another width */
		pc->val_bytes = glob_bytes(tc->val_data, &val_token_bytes);
		pc->eval_batches = tc->eval_batches;
	}
}

int loom_cluster_this_machine(const loom_plan_local_t *how, loom_compute_dtype_t dt, loom_cluster_t *c)
{
	int threads = how->threads > 0 ? how->threads : 1, rc;
	if (how->measure) /* what the caches hold nothing of (what could not be measured shows below); a
	                   * suspect figure is measured again by `loom plan --measure` alone, so that a plan
	                   * made after a run's reads the figures the run's did */
		loom_cluster_local_fill(threads, dt, 0);
	if ((rc = loom_cluster_local(threads, 0, c)) != LOOM_OK)
		return rc;
	c->background_load = how->load >= 0 ? how->load : loom_cluster_measure_load(c->cores, 0.5);
	return LOOM_OK;
}

int loom_plan_local(const loom_plan_config_t *cfg, const loom_plan_local_t *how, loom_cluster_t *c, loom_plan_t *p)
{
	int rc;
	memset(p, 0, sizeof *p);
	if ((rc = loom_cluster_this_machine(how, cfg->dtype, c)) != LOOM_OK)
		return rc;
	return loom_plan_estimate(cfg, c, p);
}

/* ---- JSON ------------------------------------------------------------------------------------------ */

typedef struct {
	char *buf;
	size_t cap, len;
} out_t;

static void put(out_t *o, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(o->buf && o->len < o->cap ? o->buf + o->len : NULL, o->len < o->cap ? o->cap - o->len : 0, fmt,
	                  ap);
	va_end(ap);
	if (n > 0)
		o->len += (size_t)n;
}

static const char *schedule_name(const loom_plan_config_t *pc)
{
	return pc->pp > 1 ? (pc->schedule_gpipe ? "gpipe" : pc->virtual_stages > 1 ? "interleaved" : "1f1b") : "-";
}

static void json_mem(out_t *o, const char *key, const loom_plan_memory_t *m)
{
	put(o, "\"%s\":{\"params\":%.0f,\"grads\":%.0f,\"optimizer\":%.0f,\"activations\":%.0f,\"comm\":%.0f,"
	    "\"other\":%.0f,\"data\":%.0f,\"eval\":%.0f,\"scratch\":%.0f,\"overhead\":%.0f,\"total\":%.0f}", key, m->params,
	    m->grads, m->optimizer, m->activations, m->comm, m->other, m->data, m->eval, m->scratch, m->overhead, m->total);
}

int loom_plan_json(const loom_plan_t *p, const loom_cluster_t *c, char *buf, size_t cap)
{
	const loom_plan_config_t *pc = &p->cfg;
	out_t o = {buf, cap, 0};
	if (buf && cap)
		buf[0] = 0;
	put(&o, "{\"cluster\":\"%s\",\"model\":{\"arch\":\"%s\",\"n_layer\":%d,\"n_head\":%d,\"n_embd\":%d,\"seq_len\":%d,"
	    "\"vocab_size\":%d},\"params\":%.0f,\"batch_size\":%d,\"seq_len\":%d,\"micro_batches\":%d,"
	    "\"dp\":%d,\"tp\":%d,\"pp\":%d,\"cp\":%d,\"world\":%d,\"zero\":%d,\"activation_checkpointing\":\"%s\","
	    "\"dtype\":\"%s\",\"cp_attention\":\"%s\","
	    "\"sequence_parallel\":%s,\"optimizer\":\"%s\",\"schedule\":\"%s\",\"virtual_stages\":%d,\"impl\":\"%s\","
	    "\"tokens_per_step\":%.0f,\"threads\":%d,\"background_load\":%.3f,\"cpu_share\":%.4f,\"run_steps\":%lld,"
	    "\"figures\":\"%s\",",
	    c->name, loom_arch_name(pc->model.arch), pc->model.n_layer, pc->model.n_head, pc->model.n_embd,
	    pc->model.seq_len, pc->model.vocab_size, p->params, pc->B, pc->T, pc->M, pc->dp, pc->tp, pc->pp,
	    LOOM_MAX(pc->cp, 1), p->world, pc->zero, loom_act_ckpt_name(pc->act_ckpt), loom_compute_dtype_name(pc->dtype),
	    pc->cp > 1 ? (pc->cp_gather ? "gather" : "ring") : "-",
	    pc->sequence_parallel && pc->tp > 1 ? "true" : "false",
	    pc->optimizer == LOOM_OPTIMIZER_MUON ? "muon" : "adamw", schedule_name(pc),
	    pc->virtual_stages > 1 ? pc->virtual_stages : 1, pc->impl == LOOM_PLAN_IDEAL ? "ideal" : "loom",
	    p->tokens_per_step, c->threads > 0 ? c->threads : 1, c->background_load, p->cpu_share, pc->steps,
	    c->figures[0] ? c->figures : "assumed: the cluster's figures");
	json_mem(&o, "memory_bytes", &p->memory);
	put(&o, ",");
	json_mem(&o, "memory_bytes_rank0", &p->memory_rank0);
	put(&o, ",\"memory_limit_bytes\":%.0f,\"fits\":%s,\"headroom\":%.4f,\"flops_per_token\":%.6g,"
	    "\"flops_per_token_nominal\":%.6g,\"flops_per_step\":%.6g,"
	    "\"flops_per_rank_step\":%.6g,\"peak_flops\":%.6g,\"compute_s\":%.6g,\"optimizer_s\":%.6g,"
	    "\"comm_bytes_per_step\":{\"dp\":%.0f,\"tp\":%.0f,\"pp\":%.0f,\"cp\":%.0f},"
	    "\"comm_s\":{\"dp\":%.6g,\"tp\":%.6g,\"pp\":%.6g,\"cp\":%.6g},"
	    "\"comm_exposed_s\":{\"dp\":%.6g,\"tp\":%.6g,\"pp\":%.6g,\"cp\":%.6g},"
	    "\"bubble\":%.6f,\"bubble_theory\":%.6f,\"step_time_s\":%.6g,\"tokens_per_s\":%.6g,\"mfu\":%.6f",
	    p->memory_limit, p->fits ? "true" : "false", p->headroom, p->flops_per_token,
	    loom_model_flops_per_token_nominal(&pc->model, pc->T), p->flops_per_step,
	    p->flops_per_rank_step, p->peak_flops, p->compute_s, p->optimizer_s, p->dp.bytes, p->tp.bytes, p->pp.bytes,
	    p->cp.bytes, p->dp.time_s, p->tp.time_s, p->pp.time_s, p->cp.time_s, p->dp.exposed_s, p->tp.exposed_s,
	    p->pp.exposed_s, p->cp.exposed_s, p->bubble,
	    p->bubble_theory, p->step_time_s, p->tokens_per_s, p->mfu);
	if (pc->tokens > 0)
		put(&o, ",\"tokens\":%.0f,\"steps\":%.0f,\"wall_s\":%.6g,\"cost\":%.6g", pc->tokens, p->steps,
		    p->wall_s, p->cost);
	put(&o, "}");
	return (int)o.len;
}

/* ---- the plan against the run ------------------------------------------------------------------------ */

/* The step's parts in a fixed order: optimizer, communication, bubble, compute (the rest). */
static const char *const time_names[] = {"compute", "communication", "optimizer", "bubble"};

static void time_parts(double step, double optim, double comm, double bubble, double out[4])
{
	double span = LOOM_MAX(0.0, step - optim - comm);
	out[2] = optim, out[1] = comm, out[3] = bubble * span;
	out[0] = step - optim - comm - out[3];
}

void loom_plan_compare(const loom_plan_t *p, const loom_plan_measured_t *m, loom_plan_verdict_t *v)
{
	const loom_plan_memory_t *pm = &p->memory_rank0;
	double tp[4], tm[4], mp[3], mm[3], worst = -1.0;
	static const char *const mem_names[] = {"parameters", "activations", "buffers and process"};
	memset(v, 0, sizeof *v);
	v->time_error = m->step_s > 0 ? p->step_time_s / m->step_s - 1.0 : 0.0;
	v->memory_error = m->peak_rss > 0 ? pm->total / m->peak_rss - 1.0 : 0.0;
	if (fabs(v->time_error) > 0.15 && m->step_s > 0) {
		time_parts(p->step_time_s, p->optimizer_s, p->dp.exposed_s + p->tp.exposed_s + p->pp.exposed_s, p->bubble, tp);
		time_parts(m->step_s, m->optimizer_s, m->comm_s, m->bubble, tm);
		for (int k = 0; k < 4; k++)
			if (fabs(tp[k] - tm[k]) > worst)
				worst = fabs(tp[k] - tm[k]), v->time_part = time_names[k], v->time_part_pred = tp[k],
				v->time_part_meas = tm[k];
	}
	worst = -1.0;
	if (fabs(v->memory_error) > 0.10 && m->peak_rss > 0) {
		mp[0] = pm->params + pm->grads + pm->optimizer, mp[1] = pm->activations, mp[2] = pm->total - mp[0] - mp[1];
		mm[0] = m->states, mm[1] = m->activations, mm[2] = m->peak_rss - mm[0] - mm[1];
		for (int k = 0; k < 3; k++)
			if (fabs(mp[k] - mm[k]) > worst)
				worst = fabs(mp[k] - mm[k]), v->memory_part = mem_names[k], v->memory_part_pred = mp[k],
				v->memory_part_meas = mm[k];
	}
}
