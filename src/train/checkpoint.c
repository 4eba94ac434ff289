/* checkpoint.c: training checkpoints: save the whole training state, and resume from it.
 *
 * A checkpoint of step S is DIR/step_%08lld (loom/ckpt.h writes it atomically) holding
 *   model.safetensors  the parameters (HF GPT-2 names; loadable by `loom sample` and HF tools),
 *   optim.safetensors  AdamW's m and v ("<name>.exp_avg", "<name>.exp_avg_sq"),
 *   state.json         step, AdamW step count, the train loader's state ("loader.train", and with
 *                      several data-parallel ranks "loader.train.rankR" for each data-parallel rank
 *                      R > 0), and the settings a resume must match (model config, B, T, and accum x
 *                      the data-parallel size "batch.world": another world size resumes when the
 *                      tokens per step are the same, each rank taking rank 0's position as its own
 *                      in the new world) plus the others for the record (the mesh that wrote it among
 *                      them: "mesh.dp", "mesh.tp", "mesh.pp", "mesh.cp", "mesh.zero", "mesh.pp_schedule";
 *                      older checkpoints have only batch.world; a checkpoint does not depend on cp:
 *                      the loader states are the data-parallel ranks', which a cp group shares),
 *   config.json        Hugging Face's GPT2Config (bos/eos: the tokenizer's end-of-text token), so
 *                      that the directory loads with GPT2LMHeadModel.from_pretrained,
 *   tokenizer.bin      a copy of the data's tokenizer when one is known (for `loom sample`), and
 *   vocab.json, merges.txt, pattern.txt  the BPE tokenizer's files when the data has them beside
 *                      tokenizer.bin (`loom data prepare --tokenizer`): the checkpoint is a tokenizer
 *                      directory too.
 * That is the whole training state (see trainer.c), so a resumed run continues bit-identically. The
 * model and optimizer files are the parallel strategy's to write and read (its save/load: for DDP
 * the state is the same on every rank, and the writer writes it); the loader states are gathered
 * over the data-parallel axis; global rank 0 writes. On resume every rank reads the checkpoint (its
 * own loader state and its part of the model and optimizer state) and the next step re-syncs the
 * parameters from rank 0 and verifies them. A ZeRO strategy writes its shards too (zero_ckpt.c), and
 * any strategy reads any strategy's checkpoint.
 *
 * Lineage: a run continuing from step S (resumed, or S = 0 from scratch) owns the checkpoints of
 * save_dir up to S and those it writes; before its first save the newer ones, of a branch it abandons,
 * are moved into save_dir/abandoned-at-step_S (loom_trainer_prepare_save_dir). So every checkpoint
 * the run writes is the newest step_ directory of save_dir when it is committed, --keep-checkpoints
 * keeps it and the newest of its lineage, and `--resume` continues this run, not the abandoned one.
 *
 * A replica checkpoint (loom_trainer_save_replica) is the same directory written by one rank alone,
 * without communication, when that rank holds the whole state (pure data parallel): every data-parallel
 * rank's loader position follows from the step, so it is written without gathering them. An elastic
 * job keeps one in RAM per host when a peer is lost (cli/run_elastic.c), and resumes from it like from
 * any checkpoint. */
#include <errno.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fileio.h"
#include "core/util.h"
#include "loom/ckpt.h"
#include "train/trainer_internal.h"

/* state.json's key of rank r's loader state. */
static void loader_key(char *buf, size_t cap, int rank)
{
	if (rank == 0)
		snprintf(buf, cap, "loader.train");
	else
		snprintf(buf, cap, "loader.train.rank%d", rank);
}

/* The loader states of all data-parallel ranks (dp_size of them, in order), on every rank. Collective. */
static int gather_loader_states(loom_trainer_t *tr, loom_loader_state_t *all)
{
	loom_loader_state_t mine;
	int rc;
	_Static_assert(sizeof mine % sizeof(int64_t) == 0, "the loader state is gathered as int64 words");
	loom_loader_get_state(tr->train, &mine);
	if (!tr->dp) {
		all[0] = mine;
		return LOOM_OK;
	}
	if ((rc = loom_allgather(tr->dp, &mine, all, sizeof mine / sizeof(int64_t), LOOM_INT64)) != LOOM_OK)
		return loom_seterr(rc, "rank %d: checkpoint of step %lld: gathering the data-loader states: %s", tr->rank,
		                   tr->step, loom_comm_errmsg(tr->dp));
	return LOOM_OK;
}

static int put_state(loom_trainer_t *tr, loom_kv_t *kv, const loom_loader_state_t *loaders)
{
	const loom_train_config_t *c = &tr->cfg;
	char key[64];
	int rc = LOOM_OK;
	rc = rc ? rc : loom_kv_set_str(kv, "format", "loom-train");
	rc = rc ? rc : loom_kv_set_i64(kv, "step", tr->step);
	/* the optimizer's step count ("adamw.step" whichever optimizer: MuonAdamW's is the same count) */
	rc = rc ? rc : loom_kv_set_i64(kv, "adamw.step", tr->strategy->muon ? tr->strategy->muon->step
	                                                                    : tr->strategy->opt.step);
	for (int r = 0; r < tr->dp_size; r++) {
		loader_key(key, sizeof key, r);
		rc = rc ? rc : loom_kv_set_loader(kv, key, &loaders[r]);
	}
	rc = rc ? rc : loom_kv_set_i64(kv, "model.n_layer", tr->mcfg.n_layer);
	rc = rc ? rc : loom_kv_set_i64(kv, "model.n_head", tr->mcfg.n_head);
	rc = rc ? rc : loom_kv_set_i64(kv, "model.n_embd", tr->mcfg.n_embd);
	rc = rc ? rc : loom_kv_set_i64(kv, "model.seq_len", tr->mcfg.seq_len);
	rc = rc ? rc : loom_kv_set_i64(kv, "model.vocab_size", tr->mcfg.vocab_size);
	if (tr->mcfg.arch != LOOM_ARCH_GPT2) { /* GPT-2's state.json stays as it was */
		rc = rc ? rc : loom_kv_set_str(kv, "model.arch", loom_arch_name(tr->mcfg.arch));
		rc = rc ? rc : loom_kv_set_i64(kv, "model.n_kv_head", tr->mcfg.n_kv_head);
		rc = rc ? rc : loom_kv_set_i64(kv, "model.short_window", tr->mcfg.short_window);
		rc = rc ? rc : loom_kv_set_str(kv, "model.window_pattern", tr->mcfg.window_pattern);
	}
	rc = rc ? rc : loom_kv_set_f64(kv, "loss_ema", tr->loss_ema);
	rc = rc ? rc : loom_kv_set_i64(kv, "batch.B", c->B);
	rc = rc ? rc : loom_kv_set_i64(kv, "batch.T", c->T);
	rc = rc ? rc : loom_kv_set_i64(kv, "batch.accum", c->accum);
	rc = rc ? rc : loom_kv_set_i64(kv, "batch.world", tr->dp_size);
	/* the mesh that wrote it, for the record (`loom info`; resuming needs only batch.world) */
	rc = rc ? rc : loom_kv_set_i64(kv, "mesh.dp", tr->dp_size);
	rc = rc ? rc : loom_kv_set_i64(kv, "mesh.tp", tr->tp ? loom_comm_size(tr->tp) : 1);
	rc = rc ? rc : loom_kv_set_i64(kv, "mesh.pp", tr->pp_size);
	rc = rc ? rc : loom_kv_set_i64(kv, "mesh.cp", tr->cp_size);
	rc = rc ? rc : loom_kv_set_i64(kv, "mesh.zero", c->zero);
	rc = rc ? rc : loom_kv_set_str(kv, "mesh.pp_schedule", tr->pp_schedule ? tr->pp_schedule : "1f1b");
	rc = rc ? rc : loom_kv_set_u64(kv, "seed", c->seed);
	rc = rc ? rc : loom_kv_set_i64(kv, "shuffle", c->shuffle);
	rc = rc ? rc : loom_kv_set_str(kv, "train_data", c->train_data);
	rc = rc ? rc : loom_kv_set_i64(kv, "lr.total_steps", c->lr.total_steps);
	rc = rc ? rc : loom_kv_set_f64(kv, "lr.peak", c->lr.peak_lr);
	rc = rc ? rc : loom_kv_set_i64(kv, "lr.warmup", c->lr.warmup);
	rc = rc ? rc : loom_kv_set_str(kv, "lr.schedule", loom_schedule_name(c->lr.kind));
	rc = rc ? rc : loom_kv_set_f64(kv, "lr.min_lr_frac", c->lr.min_lr_frac);
	rc = rc ? rc : loom_kv_set_f64(kv, "adamw.beta1", c->adamw.beta1);
	rc = rc ? rc : loom_kv_set_f64(kv, "adamw.beta2", c->adamw.beta2);
	rc = rc ? rc : loom_kv_set_f64(kv, "adamw.eps", c->adamw.eps);
	rc = rc ? rc : loom_kv_set_f64(kv, "adamw.weight_decay", c->adamw.weight_decay);
	rc = rc ? rc : loom_kv_set_f64(kv, "grad_clip", c->grad_clip);
	return rc;
}

/* Copy the BPE tokenizer files beside the tokenizer file `tok` (those that exist) into the checkpoint. */
static int copy_bpe_files(const loom_ckpt_writer_t *w, const char *tok)
{
	static const char *const names[] = {"vocab.json", "merges.txt", "pattern.txt", "tokenizer.json"};
	char dir[1100], src[1200], dst[1200];
	snprintf(dir, sizeof dir, "%s", tok);
	dirname(dir);
	for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
		atomic_file_t af;
		char *text;
		size_t len;
		int rc;
		snprintf(src, sizeof src, "%s/%s", dir, names[i]);
		if ((rc = loom__read_file_max(src, (size_t)64 << 20, &text, &len)) == LOOM_ENOENT)
			continue;
		if (rc != LOOM_OK)
			return rc;
		if ((rc = loom_ckpt_file(w, names[i], dst, sizeof dst)) || (rc = loom__atomic_open(&af, dst))) {
			free(text);
			return rc;
		}
		rc = loom__atomic_write(&af, text, len);
		free(text);
		if (rc != LOOM_OK) {
			loom__atomic_abort(&af);
			return rc;
		}
		if ((rc = loom__atomic_commit(&af)) != LOOM_OK)
			return rc;
	}
	return LOOM_OK;
}

/* Write checkpoint w (begun) of the current state with the data-parallel ranks' loader states, and
 * commit it; aborts it on failure. Not collective (the strategy's save on an active writer). */
static int write_checkpoint(loom_trainer_t *tr, loom_ckpt_writer_t *w, const loom_loader_state_t *loaders)
{
	loom_kv_t *kv = NULL;
	char path[1200];
	int rc;
	if ((rc = tr->exec->ops->save(tr->exec, tr->strategy, w)) != LOOM_OK)
		goto fail;
	int eot = -1;
	if (tr->cfg.tokenizer) {
		loom_tokenizer_t tok;
		if ((rc = loom_tokenizer_load(&tok, tr->cfg.tokenizer)) != LOOM_OK)
			goto fail;
		eot = tok.eot_token < tr->mcfg.vocab_size ? tok.eot_token : -1;
		if ((rc = loom_ckpt_file(w, "tokenizer.bin", path, sizeof path)) == LOOM_OK)
			rc = loom_tokenizer_save(&tok, path);
		loom_tokenizer_free(&tok);
		if (rc != LOOM_OK || (rc = copy_bpe_files(w, tr->cfg.tokenizer)) != LOOM_OK)
			goto fail;
	}
	if ((rc = loom_ckpt_file(w, "model.safetensors", path, sizeof path)) ||
	    (rc = loom_model_write_hf_config(path, &tr->mcfg, eot)))
		goto fail;
	if ((rc = loom_kv_create(&kv)) || (rc = put_state(tr, kv, loaders)) ||
	    (rc = loom_ckpt_file(w, "state.json", path, sizeof path)) || (rc = loom_kv_save(kv, path)))
		goto fail;
	loom_kv_destroy(kv);
	return loom_ckpt_commit(w);
fail:
	loom_kv_destroy(kv);
	loom_ckpt_abort(w);
	return rc;
}

int loom_trainer_save(loom_trainer_t *tr)
{
	loom_ckpt_writer_t w;
	loom_loader_state_t *loaders;
	int rc;
	if (!tr->cfg.save_dir)
		return loom_seterr(LOOM_EINVAL, "trainer: no checkpoint directory (--save-dir)");
	if (!(loaders = loom__calloc((size_t)tr->dp_size, sizeof *loaders)))
		return loom_seterr(LOOM_ENOMEM, "trainer: out of memory");
	if ((rc = gather_loader_states(tr, loaders)) != LOOM_OK) {
		free(loaders);
		return rc;
	}
	if (tr->rank != 0) { /* global rank 0 writes; the others give the strategy their part */
		memset(&w, 0, sizeof w); /* the checkpoint rank 0 writes, not active here */
		snprintf(w.dir, sizeof w.dir, "%s", tr->cfg.save_dir);
		snprintf(w.tmp, sizeof w.tmp, "%s/.tmp-step_%08lld", tr->cfg.save_dir, tr->step);
		snprintf(w.final_, sizeof w.final_, "%s/step_%08lld", tr->cfg.save_dir, tr->step);
		w.step = tr->step;
		free(loaders);
		return tr->exec->ops->save(tr->exec, tr->strategy, &w);
	}
	if (!tr->save_dir_ready && (rc = loom_trainer_prepare_save_dir(tr, NULL)) != LOOM_OK) { /* a save outside run */
		tr->exec->ops->save(tr->exec, tr->strategy, NULL); /* still take part, should it be collective */
		free(loaders);
		return rc;
	}
	if (tr->sum.checkpoint[0] && access(tr->cfg.save_dir, F_OK) != 0 && errno == ENOENT) /* not silently */
		fprintf(stderr, "loom: warning: the checkpoint directory %s was removed during the run: the checkpoints "
		        "written to it are lost (the newest was %s); step %lld is saved into it anew\n", tr->cfg.save_dir,
		        tr->sum.checkpoint, tr->step);
	if ((rc = loom_ckpt_begin(&w, tr->cfg.save_dir, tr->step)) != LOOM_OK) {
		tr->exec->ops->save(tr->exec, tr->strategy, NULL); /* still take part, should it be collective */
		free(loaders);
		return rc;
	}
	rc = write_checkpoint(tr, &w, loaders);
	free(loaders);
	if (rc != LOOM_OK)
		return rc;
	snprintf(tr->sum.checkpoint, sizeof tr->sum.checkpoint, "%s", w.final_);
	return tr->cfg.keep_checkpoints > 0 ? loom_ckpt_prune(tr->cfg.save_dir, tr->cfg.keep_checkpoints) : LOOM_OK;
}

const char *loom_trainer_replica_why(const loom_trainer_t *tr)
{
	const loom_strategy_t *s = tr->strategy;
	if (tr->pp_size > 1)
		return "a pipeline stage holds only its layers (--pp > 1)";
	if (tr->tp)
		return "a tensor-parallel rank holds only its shard of the weights (--tp > 1)";
	if (tr->cp_size > 1)
		return "context parallelism (--cp > 1) is not covered";
	if (s->muon)
		return "MuonAdamW's matrices are updated by their owner ranks and then gathered, so a failure during "
		       "the update leaves the replicas apart";
	if (s->own_count != s->nparams || !s->params)
		return "ZeRO shards the optimizer state (and at stage 3 the parameters): no rank holds a whole replica";
	return NULL;
}

int loom_trainer_save_replica(loom_trainer_t *tr, const char *dir)
{
	loom_ckpt_writer_t w;
	loom_loader_state_t *loaders;
	const char *why = loom_trainer_replica_why(tr);
	uint64_t W = loom_loader_windows_per_epoch(tr->train);
	int rc;
	if (why)
		return loom_seterr(LOOM_ENOTSUP, "rank %d: a replica checkpoint of step %lld: %s", tr->rank, tr->step, why);
	if (!(loaders = loom__calloc((size_t)tr->dp_size, sizeof *loaders)))
		return loom_seterr(LOOM_ENOMEM, "rank %d: a replica checkpoint: out of memory", tr->rank);
	/* every data-parallel rank's position follows from the step (trainer.c's invariant); mid-step the
	 * loader has moved on to the interrupted step's windows, which the state saved here has not used */
	loom_loader_get_state(tr->train, &loaders[0]);
	for (int r = 0; r < tr->dp_size; r++) {
		loaders[r] = loaders[0];
		loaders[r].rank = r, loaders[r].world = tr->dp_size;
		loaders[r].next_window = (uint64_t)tr->step * (uint64_t)tr->cfg.accum * (uint64_t)tr->dp_size + (uint64_t)r;
		loaders[r].epoch = W ? loaders[r].next_window / W : 0;
	}
	if ((rc = loom_ckpt_begin(&w, dir, tr->step)) == LOOM_OK)
		rc = write_checkpoint(tr, &w, loaders);
	free(loaders);
	if (rc != LOOM_OK)
		return loom_seterr(rc, "rank %d: a replica checkpoint of step %lld into %s: %s", tr->rank, tr->step, dir,
		                   loom_errmsg());
	return LOOM_OK;
}

int loom_trainer_remove_replica(const char *dir)
{
	return loom__rm_rf(dir);
}

int loom_trainer_prepare_save_dir(loom_trainer_t *tr, loom_ckpt_aside_t *aside)
{
	int rc;
	if (aside)
		memset(aside, 0, sizeof *aside);
	if (tr->save_dir_ready || !tr->cfg.save_dir || tr->rank != 0) {
		tr->save_dir_ready = 1;
		return LOOM_OK;
	}
	if ((rc = loom_ckpt_recover(tr->cfg.save_dir)) != LOOM_OK ||
	    (rc = loom_ckpt_set_aside(tr->cfg.save_dir, tr->base_step, aside)) != LOOM_OK)
		return rc;
	tr->save_dir_ready = 1;
	return LOOM_OK;
}

/* state.json's integer `key` must equal `want`. */
static int expect_i64(const loom_kv_t *kv, const char *file, const char *key, int64_t want, const char *hint)
{
	int64_t v;
	int rc = loom_kv_get_i64(kv, key, &v);
	if (rc != LOOM_OK)
		return rc;
	if (v != want)
		return loom_seterr(LOOM_EMISMATCH, "resume from %s: the checkpoint has %s = %lld, this run has %lld%s", file,
		                   key, (long long)v, (long long)want, hint);
	return LOOM_OK;
}

int loom_trainer_resume(loom_trainer_t *tr, const char *path)
{
	char dir[1100], file[1200], manifest[1200];
	struct stat sb;
	loom_kv_t *kv = NULL;
	loom_loader_state_t ls;
	int64_t step, astep, mstep;
	int rc;
	snprintf(manifest, sizeof manifest, "%s/MANIFEST", path);
	if (stat(manifest, &sb) == 0) { /* one checkpoint, chosen explicitly */
		if ((rc = loom_ckpt_verify_step(path, &mstep)) != LOOM_OK)
			return loom_seterr(rc == LOOM_ENOENT ? LOOM_EFORMAT : rc, "resume: %s", loom_errmsg());
		snprintf(dir, sizeof dir, "%s", path);
	} else if ((rc = loom_ckpt_latest(path, dir, sizeof dir, &mstep)) != LOOM_OK) {
		/* LOOM_ENOENT only when there is no step_ directory at all; a damaged newest one is an error */
		return rc == LOOM_ENOENT ? loom_seterr(rc, "resume: no training checkpoint in '%s'", path)
		                         : loom_seterr(rc, "resume from %s: %s", path, loom_errmsg());
	}
	snprintf(file, sizeof file, "%s/state.json", dir);
	if ((rc = loom_kv_load(&kv, file)) != LOOM_OK)
		goto out;
	const char *m = " (the model must be the same)", *b = " (resume with the same batch settings)";
	if ((rc = expect_i64(kv, file, "model.n_layer", tr->mcfg.n_layer, m)) ||
	    (rc = expect_i64(kv, file, "model.n_head", tr->mcfg.n_head, m)) ||
	    (rc = expect_i64(kv, file, "model.n_embd", tr->mcfg.n_embd, m)) ||
	    (rc = expect_i64(kv, file, "model.seq_len", tr->mcfg.seq_len, m)) ||
	    (rc = expect_i64(kv, file, "model.vocab_size", tr->mcfg.vocab_size, m)) ||
	    (rc = expect_i64(kv, file, "batch.B", tr->cfg.B, b)) || (rc = expect_i64(kv, file, "batch.T", tr->cfg.T, b)))
		goto out;
	const char *arch = "gpt2", *pat = "";
	loom_kv_get_str(kv, "model.arch", &arch); /* absent: GPT-2 */
	loom_kv_get_str(kv, "model.window_pattern", &pat);
	if (strcmp(arch, loom_arch_name(tr->mcfg.arch)) != 0 || strcmp(pat, tr->mcfg.window_pattern) != 0) {
		rc = loom_seterr(LOOM_EMISMATCH, "resume from %s: the checkpoint's model is %s (window pattern '%s'), this "
		                 "run's is %s (window pattern '%s')%s", file, arch, pat, loom_arch_name(tr->mcfg.arch),
		                 tr->mcfg.window_pattern, m);
		goto out;
	}
	if (tr->mcfg.arch != LOOM_ARCH_GPT2 &&
	    ((rc = expect_i64(kv, file, "model.n_kv_head", tr->mcfg.n_kv_head, m)) ||
	     (rc = expect_i64(kv, file, "model.short_window", tr->mcfg.short_window, m))))
		goto out;
	/* Another data-parallel size resumes (resharding) when the tokens per step are the same: the run
	 * then continues on the same windows. */
	int64_t sworld, saccum;
	if ((rc = loom_kv_get_i64(kv, "batch.world", &sworld)) || (rc = loom_kv_get_i64(kv, "batch.accum", &saccum)))
		goto out;
	if (sworld * saccum != (int64_t)tr->dp_size * tr->cfg.accum) {
		rc = loom_seterr(LOOM_EMISMATCH, "resume from %s: the checkpoint has %lld data-parallel rank(s) x "
		                 "accumulation %lld, this run %d x %d: resume with the same --total-batch-size", file,
		                 (long long)sworld, (long long)saccum, tr->dp_size, tr->cfg.accum);
		goto out;
	}
	char lkey[64];
	loader_key(lkey, sizeof lkey, sworld == tr->dp_size ? tr->dp_rank : 0);
	if ((rc = loom_kv_get_i64(kv, "step", &step)) || (rc = loom_kv_get_i64(kv, "adamw.step", &astep)) ||
	    (rc = loom_kv_get_loader(kv, lkey, &ls)))
		goto out;
	if (sworld != tr->dp_size) { /* rank 0's position, as this rank's of the new world */
		ls.rank = tr->dp_rank, ls.world = tr->dp_size;
		ls.next_window = (uint64_t)step * (uint64_t)tr->cfg.accum * (uint64_t)tr->dp_size + (uint64_t)tr->dp_rank;
		ls.epoch = ls.next_window / loom_loader_windows_per_epoch(tr->train);
	}
	if (step != mstep) {
		rc = loom_seterr(LOOM_EFORMAT, "%s: step %lld, but the checkpoint's MANIFEST is of step %lld (files of "
		                 "different checkpoints)", file, (long long)step, (long long)mstep);
		goto out;
	}
	if (step < 0 || astep != step) {
		rc = loom_seterr(LOOM_EFORMAT, "%s: step %lld and AdamW step %lld disagree", file, (long long)step,
		                 (long long)astep);
		goto out;
	}
	if ((rc = loom_loader_set_state(tr->train, &ls)) != LOOM_OK) {
		rc = loom_seterr(rc, "resume from %s: %s", file, loom_errmsg());
		goto out;
	}
	uint64_t want = (uint64_t)step * (uint64_t)tr->cfg.accum * (uint64_t)tr->dp_size + (uint64_t)tr->dp_rank;
	if (ls.next_window != want) {
		rc = loom_seterr(LOOM_EFORMAT, "%s: the loader is at window %llu, step %lld implies %llu", file,
		                 (unsigned long long)ls.next_window, (long long)step, (unsigned long long)want);
		goto out;
	}
	if ((rc = tr->exec->ops->load(tr->exec, tr->strategy, dir, astep)) != LOOM_OK)
		goto out;
	tr->step = step;
	double ema = 0.0;
	tr->loss_ema = loom_kv_get_f64(kv, "loss_ema", &ema) == LOOM_OK ? ema : 0.0; /* absent in older ones */
	tr->resumed = 1;
	snprintf(tr->resumed_from, sizeof tr->resumed_from, "%s", dir);
	tr->base_step = step;
	tr->synced = 0; /* the next step broadcasts rank 0's parameters again */
out:
	loom_kv_destroy(kv);
	/* A checkpoint was found: whatever is missing in it (a key, a file) is damage, not "no checkpoint". */
	if (rc == LOOM_ENOENT)
		rc = loom_seterr(LOOM_EFORMAT, "resume from %s: %s (damaged checkpoint)", dir, loom_errmsg());
	return rc;
}
