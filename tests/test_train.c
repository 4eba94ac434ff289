/* test_train.c: the training loop on a tiny generated dataset: resume is bit-identical (also from a
 * replica checkpoint, as an elastic job keeps in RAM), gradient accumulation equals a bigger batch,
 * the JSONL log, settings errors, and `loom train` end to end; the batch arithmetic (accumulation
 * from a total batch, LR scaling) and the sgemm-peak cache. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/crc32c.h"
#include "loom/ckpt.h"
#include "loom/data.h"
#include "loom/gpt2.h"
#include "loom/tokenizer.h"
#include "loom/train.h"
#include "test.h"

static const loom_gpt2_config_t tiny = {.n_layer = 2, .n_head = 2, .n_embd = 16, .seq_len = 16, .vocab_size = 37};

/* A shard of n tokens in [0, vocab) with some structure (dir/name). */
static int make_shard(const char *dir, const char *name, int n, int vocab, uint32_t seed)
{
	char path[700];
	uint16_t *t = malloc((size_t)n * sizeof *t);
	uint32_t x = seed;
	int rc;
	if (!t)
		return LOOM_ENOMEM;
	for (int i = 0; i < n; i++) {
		x = x * 1664525u + 1013904223u;
		t[i] = (uint16_t)((x >> 24) % 4 == 0 ? (x >> 8) % (uint32_t)vocab : (uint32_t)(i * 5) % (uint32_t)vocab);
	}
	snprintf(path, sizeof path, "%s/%s", dir, name);
	rc = loom_shard_write(path, t, (size_t)n);
	free(t);
	return rc;
}

typedef struct {
	float loss[64];
	double norm[64];
	long long last;
} losses_t;

static int rec(void *ctx, loom_trainer_t *tr, const loom_step_metrics_t *m)
{
	losses_t *l = ctx;
	(void)tr;
	if (m->step < 64)
		l->loss[m->step] = m->loss, l->norm[m->step] = m->grad_norm;
	l->last = m->step;
	return 0;
}

static loom_train_config_t base_config(const char *data)
{
	loom_train_config_t c = loom_train_defaults();
	c.train_data = data;
	c.B = 2, c.T = 8, c.accum = 2, c.shuffle = 1, c.seed = 5;
	c.lr = (loom_lr_schedule_t){.peak_lr = 1e-2, .warmup = 2, .total_steps = 6, .kind = LOOM_SCHED_COSINE,
	                            .min_lr_frac = 0.1};
	c.grad_clip = 1.0;
	return c;
}

TEST(train_resume_bit_identical)
{
	char dir[512], data[700], ck1[700], ck2[700], log1[700], step3[800];
	loom_gpt2_t *a = NULL, *b = NULL;
	loom_trainer_t *ta = NULL, *tb = NULL;
	losses_t la, lb;
	size_t n = loom_gpt2_num_params(&tiny);
	memset(&la, 0, sizeof la), memset(&lb, 0, sizeof lb);
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(make_shard(dir, "train_000000.bin", 3000, tiny.vocab_size, 1));
	snprintf(data, sizeof data, "%s/train_*.bin", dir);
	snprintf(ck1, sizeof ck1, "%s/ck1", dir);
	snprintf(ck2, sizeof ck2, "%s/ck2", dir);
	snprintf(log1, sizeof log1, "%s/log1.jsonl", dir);

	/* uninterrupted: 6 steps, checkpoints at 3 and 6 */
	loom_train_config_t c = base_config(data);
	c.save_dir = ck1, c.save_every = 3, c.log_path = log1;
	CHECK_OK(loom_gpt2_create(&a, &tiny, c.B, c.T));
	loom_gpt2_init(a, 9);
	CHECK_OK(loom_trainer_create(&ta, &c, loom_gpt2_model(a)));
	CHECK_OK(loom_trainer_run(ta, rec, &la));
	CHECK_EQ(la.last, 6);
	CHECK_MSG(la.loss[6] < la.loss[1], "loss did not fall: %.6f -> %.6f", la.loss[1], la.loss[6]);

	/* a second model with other initial weights resumes from step 3 and writes elsewhere */
	c.save_dir = ck2, c.log_path = NULL;
	CHECK_OK(loom_gpt2_create(&b, &tiny, c.B, c.T));
	loom_gpt2_init(b, 77);
	CHECK_OK(loom_trainer_create(&tb, &c, loom_gpt2_model(b)));
	snprintf(step3, sizeof step3, "%s/step_00000003", ck1);
	CHECK_OK(loom_trainer_resume(tb, step3));
	CHECK_EQ(loom_trainer_steps_done(tb), 3);
	CHECK_OK(loom_trainer_run(tb, rec, &lb));
	CHECK_EQ(lb.last, 6);
	for (int s = 4; s <= 6; s++) {
		CHECK_MSG(la.loss[s] == lb.loss[s], "step %d: loss %.9g uninterrupted, %.9g resumed", s, la.loss[s],
		          lb.loss[s]);
		CHECK_FEQ(la.norm[s], lb.norm[s]);
	}
	CHECK(memcmp(loom_gpt2_params(a), loom_gpt2_params(b), n * sizeof(float)) == 0);
	const loom_adamw_t *oa = loom_trainer_optimizer(ta), *ob = loom_trainer_optimizer(tb);
	CHECK_EQ(oa->step, 6);
	CHECK_EQ(ob->step, 6);
	CHECK(memcmp(oa->m, ob->m, n * sizeof(float)) == 0 && memcmp(oa->v, ob->v, n * sizeof(float)) == 0);
	loom_trainer_destroy(tb), tb = NULL;

	/* resuming from the directory picks the latest complete checkpoint (6); nothing is left to do */
	CHECK_OK(loom_trainer_create(&tb, &c, loom_gpt2_model(b)));
	CHECK_OK(loom_trainer_resume(tb, ck1));
	CHECK_EQ(loom_trainer_steps_done(tb), 6);
	loom_trainer_destroy(tb), tb = NULL;

	/* other batch settings are refused */
	c.accum = 1;
	CHECK_OK(loom_trainer_create(&tb, &c, loom_gpt2_model(b)));
	CHECK_ERR(loom_trainer_resume(tb, ck1), LOOM_EMISMATCH);
	CHECK_CONTAINS(loom_errmsg(), "the checkpoint has 1 data-parallel rank(s) x accumulation 2, this run 1 x 1");
	loom_trainer_destroy(tb), tb = NULL;
	/* and an empty directory has nothing to resume */
	CHECK_OK(loom_trainer_create(&tb, &c, loom_gpt2_model(b)));
	CHECK_ERR(loom_trainer_resume(tb, dir), LOOM_ENOENT);

	loom_trainer_destroy(ta);
	loom_trainer_destroy(tb);
	loom_gpt2_destroy(a);
	loom_gpt2_destroy(b);
	test_rmdir(dir);
	return 0;
}

/* Accumulating 2 micro-batches of B=2 reads the same tokens as one of B=4 and gives the same step. */
TEST(train_accum_equals_big_batch)
{
	char dir[512], data[700];
	loom_gpt2_t *a = NULL, *b = NULL;
	loom_trainer_t *ta = NULL, *tb = NULL;
	losses_t la, lb;
	memset(&la, 0, sizeof la), memset(&lb, 0, sizeof lb);
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(make_shard(dir, "d.bin", 2000, tiny.vocab_size, 3));
	snprintf(data, sizeof data, "%s/d.bin", dir);
	loom_train_config_t c = base_config(data);
	c.shuffle = 0, c.lr.total_steps = 4;
	CHECK_OK(loom_gpt2_create(&a, &tiny, 4, c.T));
	CHECK_OK(loom_gpt2_create(&b, &tiny, 4, c.T));
	loom_gpt2_init(a, 1), loom_gpt2_init(b, 1);
	c.B = 2, c.accum = 2;
	CHECK_OK(loom_trainer_create(&ta, &c, loom_gpt2_model(a)));
	c.B = 4, c.accum = 1;
	CHECK_OK(loom_trainer_create(&tb, &c, loom_gpt2_model(b)));
	CHECK_EQ(loom_trainer_tokens_per_step(ta), loom_trainer_tokens_per_step(tb));
	CHECK_OK(loom_trainer_run(ta, rec, &la));
	CHECK_OK(loom_trainer_run(tb, rec, &lb));
	for (int s = 1; s <= 4; s++) {
		CHECK_MSG(fabs(la.loss[s] - lb.loss[s]) <= 1e-5 * lb.loss[s], "step %d: %.9g vs %.9g", s, la.loss[s],
		          lb.loss[s]);
		CHECK_MSG(fabs(la.norm[s] - lb.norm[s]) <= 1e-4 * lb.norm[s], "step %d norm: %.9g vs %.9g", s, la.norm[s],
		          lb.norm[s]);
	}
	loom_trainer_destroy(ta), loom_trainer_destroy(tb);
	loom_gpt2_destroy(a), loom_gpt2_destroy(b);
	test_rmdir(dir);
	return 0;
}

/* Value of "key": in a JSON line, or NAN when absent. */
static double field(const char *line, const char *key)
{
	char pat[64];
	const char *p;
	snprintf(pat, sizeof pat, "\"%s\":", key);
	p = strstr(line, pat);
	return p ? strtod(p + strlen(pat), NULL) : NAN;
}

TEST(train_jsonl_log)
{
	char dir[512], data[700], val[700], logp[700], ck[700], line[4096];
	loom_gpt2_t *m = NULL;
	loom_trainer_t *tr = NULL;
	losses_t l;
	FILE *f;
	int k = 0;
	memset(&l, 0, sizeof l);
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(make_shard(dir, "train.bin", 2000, tiny.vocab_size, 1));
	CHECK_OK(make_shard(dir, "val.bin", 500, tiny.vocab_size, 2));
	snprintf(data, sizeof data, "%s/train.bin", dir);
	snprintf(val, sizeof val, "%s/val.bin", dir);
	snprintf(logp, sizeof logp, "%s/run.jsonl", dir);
	snprintf(ck, sizeof ck, "%s/ck", dir);
	loom_train_config_t c = base_config(data);
	c.val_data = val, c.eval_every = 2, c.eval_batches = 3, c.log_path = logp, c.peak_flops = 1e9;
	c.save_dir = ck, c.save_every = 4, c.lr.total_steps = 5;
	CHECK_OK(loom_gpt2_create(&m, &tiny, c.B, c.T));
	loom_gpt2_init(m, 3);
	CHECK_OK(loom_trainer_create(&tr, &c, loom_gpt2_model(m)));
	CHECK_OK(loom_trainer_run(tr, rec, &l));
	loom_trainer_destroy(tr), tr = NULL;

	f = fopen(logp, "r");
	CHECK(f != NULL);
	/* the config record first, the summary last (test_eco.c checks their contents). FLOPs per token of
	 * tiny (L2 C16 V37) at T 8: 6 x (2 x 12 C^2 + V C) = 40416, attention over the causal triangle
	 * 2 x 12 x 16 x 9 / 2 = 1728 (MFU's count), or the whole 8 x 8 (GPT-2's nominal, mfu_gpt2) 3072 */
	CHECK_FEQ(loom_gpt2_flops_per_token(&tiny, c.T), 42144.0);
	CHECK_FEQ(loom_model_flops_per_token_nominal(&tiny, c.T), 43488.0);
	CHECK(fgets(line, sizeof line, f) != NULL);
	CHECK_MSG(strncmp(line, "{\"config\":{", 11) == 0, "first line: %s", line);
	CHECK_MSG(field(line, "flops_per_token") == 42144.0 && field(line, "flops_per_token_gpt2") == 43488.0, "%s", line);
	while (fgets(line, sizeof line, f)) {
		if (strncmp(line, "{\"summary\":", 11) == 0) {
			double mean = field(line, "mean_mfu"), nominal = field(line, "mean_mfu_gpt2");
			CHECK_MSG(mean > 0 && fabs(nominal / mean - 43488.0 / 42144.0) < 2e-3, "%s", line);
			CHECK_EQ(k, 5);
			CHECK(fgets(line, sizeof line, f) == NULL);
			break;
		}
		k++;
		CHECK_EQ(field(line, "step"), k);
		CHECK_MSG((float)field(line, "loss") == l.loss[k], "step %d: logged loss %s", k, line);
		CHECK_FEQ((float)field(line, "lr"), loom_schedule_lr(&c.lr, k));
		CHECK_NEAR(field(line, "grad_norm"), l.norm[k], 1e-8 * l.norm[k]);
		double dt = field(line, "dt_ms"), tps = field(line, "tokens_per_s"), mfu = field(line, "mfu");
		CHECK_MSG(dt > 0 && tps > 0, "%s", line);
		CHECK_NEAR(tps, 32.0 / (dt * 1e-3), 0.01 * tps); /* B*T*accum = 32 tokens per step */
		CHECK_NEAR(mfu, tps * 42144.0 / 1e9, 1e-3 * mfu + 1e-4);
		double nominal = field(line, "mfu_gpt2");
		CHECK_NEAR(nominal, tps * 43488.0 / 1e9, 1e-3 * nominal + 1e-4);
		CHECK_MSG(strstr(line, "mfu_nanochat") == NULL, "%s", line);
		CHECK_EQ(field(line, "tokens"), 32 * k);
		double v = field(line, "val_loss");
		if (k % 2 == 0 || k == 5)
			CHECK_MSG(v > 0 && v < 10, "step %d: val_loss missing or insane: %s", k, line);
		else
			CHECK_MSG(isnan(v), "step %d: unexpected val_loss: %s", k, line);
		CHECK_EQ(strstr(line, "\"checkpoint\":true") != NULL, k == 4 || k == 5);
	}
	fclose(f);
	CHECK_EQ(k, 5);

	/* resuming from step 4 with the same log keeps the config and lines 1-4 and appends 5 and a new
	 * summary: still 5 step lines */
	char step4[800];
	snprintf(step4, sizeof step4, "%s/step_00000004", ck);
	CHECK_OK(loom_trainer_create(&tr, &c, loom_gpt2_model(m)));
	CHECK_OK(loom_trainer_resume(tr, step4));
	CHECK_OK(loom_trainer_run(tr, NULL, NULL));
	loom_trainer_destroy(tr);
	f = fopen(logp, "r");
	CHECK(f != NULL);
	k = 0;
	int other = 0;
	while (fgets(line, sizeof line, f)) {
		if (strncmp(line, "{\"step\":", 8) != 0) {
			CHECK_MSG(other == 0 ? strncmp(line, "{\"config\":", 10) == 0 && k == 0
			                     : strstr(line, "{\"summary\":{\"first_step\":5,") == line && k == 5,
			          "after resume, line %d: %s", k + other + 1, line);
			other++;
			continue;
		}
		k++;
		CHECK_EQ(field(line, "step"), k);
		CHECK_MSG((float)field(line, "loss") == l.loss[k], "after resume, step %d: %s", k, line);
	}
	fclose(f);
	CHECK_EQ(k, 5);
	CHECK_EQ(other, 2);
	loom_gpt2_destroy(m);
	test_rmdir(dir);
	return 0;
}

TEST(train_rejects_bad_settings)
{
	char dir[512], data[700], bad[700];
	loom_gpt2_t *m = NULL;
	loom_trainer_t *tr = NULL;
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(make_shard(dir, "ok.bin", 500, tiny.vocab_size, 1));
	CHECK_OK(make_shard(dir, "big.bin", 500, 300, 1)); /* ids up to 299 */
	snprintf(data, sizeof data, "%s/ok.bin", dir);
	snprintf(bad, sizeof bad, "%s/big.bin", dir);
	CHECK_OK(loom_gpt2_create(&m, &tiny, 2, 16));
	loom_train_config_t c = base_config(data);

	c.T = 32;
	CHECK_ERR(loom_trainer_create(&tr, &c, loom_gpt2_model(m)), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "sequence length 32 exceeds the model's maximum seq_len 16");
	c = base_config(bad);
	CHECK_ERR(loom_trainer_create(&tr, &c, loom_gpt2_model(m)), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "outside the model's vocabulary of 37");
	CHECK_CONTAINS(loom_errmsg(), "big.bin");
	c = base_config(data);
	c.val_data = bad;
	CHECK_ERR(loom_trainer_create(&tr, &c, loom_gpt2_model(m)), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "validation data");
	c = base_config(NULL);
	CHECK_ERR(loom_trainer_create(&tr, &c, loom_gpt2_model(m)), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "--train-data");
	snprintf(bad, sizeof bad, "%s/nothing_*.bin", dir);
	c = base_config(bad);
	CHECK_ERR(loom_trainer_create(&tr, &c, loom_gpt2_model(m)), LOOM_ENOENT);
	c = base_config(data);
	c.accum = 0;
	CHECK_ERR(loom_trainer_create(&tr, &c, loom_gpt2_model(m)), LOOM_EINVAL);
	c = base_config(data);
	c.lr.total_steps = 0;
	CHECK_ERR(loom_trainer_create(&tr, &c, loom_gpt2_model(m)), LOOM_EINVAL);
	/* issue 13, finding 11: eps = 0 gave NaN weights, saved; a negative clip was accepted */
	c = base_config(data);
	c.adamw.eps = 0;
	CHECK_ERR(loom_trainer_create(&tr, &c, loom_gpt2_model(m)), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "AdamW eps 0 must be finite and > 0");
	c = base_config(data);
	c.grad_clip = -1;
	CHECK_ERR(loom_trainer_create(&tr, &c, loom_gpt2_model(m)), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "grad clip -1 must be finite and >= 0");
	c = base_config(data);
	c.adamw.beta2 = 1.0f;
	CHECK_ERR(loom_trainer_create(&tr, &c, loom_gpt2_model(m)), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "betas (0.9, 1) must be in [0, 1)");
	/* issue 13, finding 4: an unusable --save-dir fails at create, not at the first save */
	c = base_config(data);
	c.save_dir = data; /* a regular file */
	CHECK_ERR(loom_trainer_create(&tr, &c, loom_gpt2_model(m)), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "ok.bin is not a directory");
	/* issue 13, finding 11: a directory matched as a shard */
	c = base_config(dir);
	CHECK_ERR(loom_trainer_create(&tr, &c, loom_gpt2_model(m)), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "is a directory, not a token shard file");
	CHECK(tr == NULL);
	loom_gpt2_destroy(m);
	test_rmdir(dir);
	return 0;
}

/* `loom train` as a user runs it: errors for bad flags, then a short run with a checkpoint that
 * `loom sample` reads back. */
TEST(train_cli)
{
	char dir[512], cmd[2048], out[16384];
	const char *loom = test_loom_bin();
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(make_shard(dir, "train_000000.bin", 3000, 257, 1));
	loom_tokenizer_t tok;
	char tp[700];
	snprintf(tp, sizeof tp, "%s/tokenizer.bin", dir);
	CHECK_OK(loom_tokenizer_init_bytes(&tok));
	CHECK_OK(loom_tokenizer_save(&tok, tp));
	loom_tokenizer_free(&tok);

	snprintf(cmd, sizeof cmd, "%s train --steps 2 --bogus 1", loom);
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 30), 2);
	CHECK_CONTAINS(out, "unknown flag '--bogus'");
	snprintf(cmd, sizeof cmd, "%s train --steps 2", loom);
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 30), 2);
	CHECK_CONTAINS(out, "--train-data GLOB is required");
	snprintf(cmd, sizeof cmd, "%s train --train-data '%s/train_*.bin' --steps 2 --seq-len 256", loom, dir);
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 30), 2);
	CHECK_CONTAINS(out, "--seq-len 256 exceeds the model's maximum sequence length 128");
	snprintf(cmd, sizeof cmd, "%s train --train-data '%s/train_*.bin' --steps 2 --vocab-size 100 --seq-len 16", loom,
	         dir);
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 30), 1);
	CHECK_CONTAINS(out, "outside the model's vocabulary of 100");
	snprintf(cmd, sizeof cmd, "%s train --train-data '%s/train_*.bin' --steps 2 --batch-size 2 --seq-len 16 "
	         "--total-batch-size 100", loom, dir);
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 30), 2);
	CHECK_CONTAINS(out, "valid values: 32, 64, 96");

	snprintf(cmd, sizeof cmd, "%s train --train-data '%s/train_*.bin' --n-layer 1 --n-embd 32 --n-head 2 "
	         "--batch-size 2 --seq-len 16 --total-batch-size 64 --steps 3 --lr 1e-3 --save-dir %s/ck --save-every 1 "
	         "--keep-checkpoints 2 --threads 1 "
	         "--peak-flops 1e10 --sample-every 3 --log %s/log.jsonl", loom, dir, dir, dir);
	int st = test_run_cmd(cmd, out, sizeof out, 60);
	CHECK_MSG(st == 0, "exit %d: %s", st, out);
	CHECK_CONTAINS(out, "batch: B=2 T=16 accum=2 -> 64 tokens per step");
	CHECK_CONTAINS(out, "step 1/3 | loss ");
	CHECK_CONTAINS(out, "step 3/3 | loss ");
	CHECK_CONTAINS(out, "| MFU ");
	CHECK_CONTAINS(out, "--- sample at step 3 ---");
	struct stat sb;
	snprintf(tp, sizeof tp, "%s/ck/step_00000001", dir);
	CHECK_MSG(stat(tp, &sb) != 0, "%s was not pruned (--keep-checkpoints 2)", tp);
	snprintf(tp, sizeof tp, "%s/ck/step_00000002", dir);
	CHECK_MSG(stat(tp, &sb) == 0, "%s is missing", tp);
	/* the checkpoint holds the model and the tokenizer: loom sample finds both */
	snprintf(cmd, sizeof cmd, "%s sample --model %s/ck/step_00000003/model.safetensors --prompt 'ab' "
	         "--max-tokens 5 --temperature 0", loom, dir);
	st = test_run_cmd(cmd, out, sizeof out, 30);
	CHECK_MSG(st == 0, "exit %d: %s", st, out);
	CHECK_MSG(strncmp(out, "ab", 2) == 0, "sample output does not start with the prompt: '%s'", out);

	/* --resume through the CLI: 4 steps with a checkpoint at 2; drop the later checkpoint and resume
	 * with the same log: steps 3-4 are logged again with bit-identical losses */
	char logs[2][4096];
	snprintf(cmd, sizeof cmd, "%s train --train-data '%s/train_*.bin' --n-layer 1 --n-embd 32 --n-head 2 "
	         "--batch-size 2 --seq-len 16 --steps 4 --save-dir %s/ck2 --save-every 2 --threads 1 --peak-flops 1e10 "
	         "--shuffle 1 --log %s/r.jsonl", loom, dir, dir, dir);
	st = test_run_cmd(cmd, out, sizeof out, 60);
	CHECK_MSG(st == 0, "exit %d: %s", st, out);
	for (int pass = 0; pass < 2; pass++) {
		snprintf(tp, sizeof tp, "%s/r.jsonl", dir);
		FILE *f = fopen(tp, "r");
		size_t n = 0;
		char line[1024];
		CHECK(f != NULL);
		logs[pass][0] = 0;
		while (fgets(line, sizeof line, f)) /* keep step and loss of each step line */
			if (strncmp(line, "{\"step\":", 8) == 0)
				n += (size_t)snprintf(logs[pass] + n, sizeof logs[pass] - n, "%.*s\n",
				                      (int)(strstr(line, ",\"lr\"") - line), line);
		fclose(f);
		if (pass == 0) {
			char rm[800];
			snprintf(rm, sizeof rm, "rm -rf %s/ck2/step_00000004", dir);
			CHECK_EQ(test_run_cmd(rm, out, sizeof out, 10), 0);
			char *resume = cmd + strlen(cmd);
			strcpy(resume, " --resume");
			st = test_run_cmd(cmd, out, sizeof out, 60);
			CHECK_MSG(st == 0, "exit %d: %s", st, out);
			CHECK_CONTAINS(out, "at step 2");
			CHECK_CONTAINS(out, "step 3/4 | loss ");
			CHECK_MSG(!strstr(out, "step 2/4"), "resumed run redid step 2: %s", out);
		}
	}
	CHECK_STREQ(logs[1], logs[0]);
	CHECK_CONTAINS(logs[0], "{\"step\":4,\"loss\":");
	test_rmdir(dir);
	return 0;
}

/* Replace file `name` of checkpoint `ck` with `len` bytes and re-sign MANIFEST (its size and CRC),
 * as if the checkpoint had been written that way: only the checks past MANIFEST can catch it. */
static int resign(const char *ck, const char *name, const void *bytes, size_t len)
{
	char path[1200], key[300];
	loom_kv_t *kv;
	int rc;
	snprintf(path, sizeof path, "%s/%s", ck, name);
	if (test_write_file(path, bytes, len))
		return 1;
	snprintf(path, sizeof path, "%s/MANIFEST", ck);
	if ((rc = loom_kv_load(&kv, path)) != LOOM_OK)
		return rc;
	snprintf(key, sizeof key, "size:%s", name);
	rc = loom_kv_set_u64(kv, key, len);
	snprintf(key, sizeof key, "crc32c:%s", name);
	rc = rc ? rc : loom_kv_set_u64(kv, key, loom__crc32c(0, bytes, len));
	rc = rc ? rc : loom_kv_save(kv, path);
	loom_kv_destroy(kv);
	return rc;
}

static int read_all(const char *path, char **buf, size_t *len)
{
	FILE *f = fopen(path, "rb");
	long n;
	if (!f || fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
		if (f)
			fclose(f);
		return 1;
	}
	*buf = malloc((size_t)n + 1);
	*len = *buf ? fread(*buf, 1, (size_t)n, f) : 0;
	fclose(f);
	return !*buf || *len != (size_t)n;
}

/* Issue 13, findings 1 and 6: a damaged newest checkpoint made `--resume` start from scratch and
 * overwrite the good ones (cli/train.c took any LOOM_ENOENT, a missing key included, for "no
 * checkpoint"); state.json of another step resumed silently. Each is an error naming the file, before
 * anything is written, and --resume-from chooses an older checkpoint. */
TEST(train_resume_damaged_checkpoint)
{
	char dir[512], cmd[4096], out[16384], ck6[700], ck4[700], p[800];
	char *state6, *state4, *log0, *log1, *model;
	size_t n6, n4, nl0, nl1, nm;
	const char *loom = test_loom_bin();
	int st;
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(make_shard(dir, "train_000000.bin", 3000, 257, 1));
	snprintf(cmd, sizeof cmd, "%s train --train-data '%s/train_*.bin' --n-layer 1 --n-embd 32 --n-head 2 "
	         "--batch-size 2 --seq-len 16 --steps 6 --save-dir %s/ck --save-every 2 --threads 1 --peak-flops 1e10 "
	         "--log %s/log.jsonl", loom, dir, dir, dir);
	st = test_run_cmd(cmd, out, sizeof out, 60);
	CHECK_MSG(st == 0, "exit %d: %s", st, out);
	snprintf(ck6, sizeof ck6, "%s/ck/step_00000006", dir);
	snprintf(ck4, sizeof ck4, "%s/ck/step_00000004", dir);
	snprintf(p, sizeof p, "%s/state.json", ck6);
	CHECK(read_all(p, &state6, &n6) == 0);
	snprintf(p, sizeof p, "%s/state.json", ck4);
	CHECK(read_all(p, &state4, &n4) == 0);
	snprintf(p, sizeof p, "%s/log.jsonl", dir);
	CHECK(read_all(p, &log0, &nl0) == 0);
	strcat(cmd, " --resume");

	/* 1. one key renamed (same size), MANIFEST re-signed: was "starting from scratch", exit 0 */
	char *bad = malloc(n6 + 1), *k;
	CHECK(bad != NULL);
	memcpy(bad, state6, n6);
	CHECK((k = strstr(bad, "\"adamw.step\"")) != NULL);
	memcpy(k, "\"adamw.stap\"", 12);
	CHECK_OK(resign(ck6, "state.json", bad, n6));
	st = test_run_cmd(cmd, out, sizeof out, 60);
	CHECK_MSG(st == 1, "exit %d: %s", st, out);
	CHECK_CONTAINS(out, "step_00000006: ");
	CHECK_CONTAINS(out, "no key 'adamw.step' (damaged checkpoint)");
	CHECK_CONTAINS(out, "nothing was written or removed; continue from an older checkpoint with --resume-from");
	CHECK_MSG(!strstr(out, "starting from scratch") && !strstr(out, "step 1/6"), "trained: %s", out);
	snprintf(p, sizeof p, "%s/log.jsonl", dir);
	CHECK(read_all(p, &log1, &nl1) == 0);
	CHECK_MSG(nl1 == nl0 && memcmp(log0, log1, nl0) == 0, "the log was rewritten");
	free(log1);
	for (int s = 2; s <= 6; s += 2) {
		snprintf(p, sizeof p, "%s/ck/step_%08d", dir, s);
		CHECK_MSG(s == 6 || loom_ckpt_verify(p) == LOOM_OK, "%s: %s", p, loom_errmsg());
	}

	/* 2. state.json of step 4 inside step 6 (re-signed): the steps disagree */
	CHECK_OK(resign(ck6, "state.json", state4, n4));
	st = test_run_cmd(cmd, out, sizeof out, 60);
	CHECK_MSG(st == 1, "exit %d: %s", st, out);
	CHECK_CONTAINS(out, "step_00000006/state.json: step 4, but the checkpoint's MANIFEST is of step 6");

	/* 3. one flipped bit in the model's data (MANIFEST as written): a checksum error naming the file,
	 * and the older checkpoints that verify */
	CHECK_OK(resign(ck6, "state.json", state6, n6));
	snprintf(p, sizeof p, "%s/model.safetensors", ck6);
	CHECK(read_all(p, &model, &nm) == 0);
	model[nm - 3] ^= 0x10;
	CHECK(test_write_file(p, model, nm) == 0);
	st = test_run_cmd(cmd, out, sizeof out, 60);
	CHECK_MSG(st == 1, "exit %d: %s", st, out);
	CHECK_CONTAINS(out, "the latest checkpoint is damaged: checkpoint ");
	CHECK_CONTAINS(out, "step_00000006: model.safetensors has CRC-32C ");
	CHECK_CONTAINS(out, "older checkpoints that verify: ");
	CHECK_CONTAINS(out, "/ck/step_00000004, ");
	CHECK_CONTAINS(out, "/ck/step_00000002");

	/* 4. --resume-from an older one continues from it */
	snprintf(cmd + strlen(cmd), sizeof cmd - strlen(cmd), "-from %s", ck4);
	st = test_run_cmd(cmd, out, sizeof out, 60);
	CHECK_MSG(st == 0, "exit %d: %s", st, out);
	CHECK_CONTAINS(out, "step_00000004 at step 4");
	CHECK_CONTAINS(out, "step 5/6 | loss ");
	CHECK_MSG(!strstr(out, "step 4/6"), "redid step 4: %s", out);
	CHECK_OK(loom_ckpt_verify(ck6)); /* rewritten by the run */

	/* 5. --save-dir inside a checkpoint is refused before training */
	snprintf(cmd, sizeof cmd, "%s train --train-data '%s/train_*.bin' --n-layer 1 --n-embd 32 --n-head 2 "
	         "--batch-size 2 --seq-len 16 --steps 6 --save-dir %s --threads 1 --peak-flops 1e10 --resume", loom, dir,
	         ck4);
	st = test_run_cmd(cmd, out, sizeof out, 60);
	CHECK_MSG(st == 2, "exit %d: %s", st, out);
	CHECK_CONTAINS(out, "is inside the checkpoint ");
	free(bad), free(state6), free(state4), free(log0), free(model);
	test_rmdir(dir);
	return 0;
}

/* Issue 13, finding 5: the trainer saved (and pruned) before it wrote the step's log line, so a
 * kill in between lost the line. Now the line is written and fsync'ed first: a save that fails
 * (here: the tokenizer it copies vanished) leaves the step's line in the log. */
static int drop_tokenizer(void *ctx, loom_trainer_t *tr, const loom_step_metrics_t *m)
{
	(void)tr;
	if (m->step == 1)
		remove((const char *)ctx);
	return 0;
}

TEST(train_log_before_checkpoint)
{
	char dir[512], data[700], logp[700], ck[700], tokp[700], line[4096];
	loom_gpt2_t *m = NULL;
	loom_trainer_t *tr = NULL;
	loom_tokenizer_t tok;
	int last = 0;
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(make_shard(dir, "train.bin", 2000, tiny.vocab_size, 1));
	snprintf(data, sizeof data, "%s/train.bin", dir);
	snprintf(logp, sizeof logp, "%s/run.jsonl", dir);
	snprintf(ck, sizeof ck, "%s/ck", dir);
	snprintf(tokp, sizeof tokp, "%s/tokenizer.bin", dir);
	CHECK_OK(loom_tokenizer_init_bytes(&tok));
	CHECK_OK(loom_tokenizer_save(&tok, tokp));
	loom_tokenizer_free(&tok);
	loom_train_config_t c = base_config(data);
	c.log_path = logp, c.peak_flops = 1e9, c.save_dir = ck, c.save_every = 1, c.lr.total_steps = 3;
	c.tokenizer = tokp;
	CHECK_OK(loom_gpt2_create(&m, &tiny, c.B, c.T));
	loom_gpt2_init(m, 3);
	CHECK_OK(loom_trainer_create(&tr, &c, loom_gpt2_model(m)));
	CHECK_ERR(loom_trainer_run(tr, drop_tokenizer, tokp), LOOM_ENOENT);
	loom_trainer_destroy(tr);
	FILE *f = fopen(logp, "r");
	CHECK(f != NULL);
	while (fgets(line, sizeof line, f))
		if (sscanf(line, "{\"step\":%d", &last) == 1)
			CHECK_CONTAINS(line, "\"checkpoint\":true");
	fclose(f);
	CHECK_EQ(last, 2); /* the step whose save failed is in the log */
	snprintf(line, sizeof line, "%s/step_00000001", ck);
	CHECK_OK(loom_ckpt_verify(line));
	loom_gpt2_destroy(m);
	test_rmdir(dir);
	return 0;
}

/* Issue 13, finding 11: `loom sample` dropped sampled ids that the tokenizer does not have (a model
 * with a larger vocabulary) silently; it is an error naming the id and both vocabularies. And the
 * optimizer flags are range-checked before anything runs. */
TEST(sample_outside_tokenizer_vocab)
{
	char dir[512], cmd[2048], out[16384], tp[700];
	const char *loom = test_loom_bin();
	loom_tokenizer_t tok;
	int st;
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(make_shard(dir, "train_000000.bin", 3000, 257, 1));
	snprintf(tp, sizeof tp, "%s/bytes.bin", dir); /* not beside the data: the checkpoint gets none */
	CHECK_OK(loom_tokenizer_init_bytes(&tok));
	CHECK_OK(loom_tokenizer_save(&tok, tp));
	loom_tokenizer_free(&tok);
	snprintf(cmd, sizeof cmd, "%s train --train-data '%s/train_*.bin' --n-layer 1 --n-embd 32 --n-head 2 "
	         "--vocab-size 400 --batch-size 2 --seq-len 16 --steps 1 --save-dir %s/ck --threads 1 --peak-flops 1e10",
	         loom, dir, dir);
	st = test_run_cmd(cmd, out, sizeof out, 60);
	CHECK_MSG(st == 0, "exit %d: %s", st, out);
	snprintf(cmd, sizeof cmd, "%s sample --model %s/ck --tokenizer %s --max-tokens 60 --top-k 0 --seed 1 --threads 1",
	         loom, dir, tp);
	st = test_run_cmd(cmd, out, sizeof out, 60);
	CHECK_MSG(st == 1, "exit %d: %s", st, out);
	CHECK_CONTAINS(out, ", outside the tokenizer's vocabulary of 257 (the model's is 400)");
	/* optimizer flags out of range: exit 2 before training */
	static const char *const bad[][2] = {{"--eps 0", "--eps: 0 is out of range (0, 1]"},
	                                     {"--eps 1e-60", "--eps: 1e-60 is 0 as a float32"},
	                                     {"--grad-clip -1", "--grad-clip: -1 is out of range [0, 1e+30]"},
	                                     {"--beta2 1", "--beta2: 1 is out of range [0, 1)"},
	                                     {"--weight-decay nan", "--weight-decay: nan is out of range"},
	                                     {"--min-lr-frac 2", "--min-lr-frac: 2 is out of range [0, 1]"},
	                                     {"--lr -1", "--lr: -1 is out of range [0, 1000]"}};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		snprintf(cmd, sizeof cmd, "%s train --train-data '%s/train_*.bin' --steps 1 %s", loom, dir, bad[i][0]);
		st = test_run_cmd(cmd, out, sizeof out, 30);
		CHECK_MSG(st == 2, "%s: exit %d: %s", bad[i][0], st, out);
		CHECK_CONTAINS(out, bad[i][1]);
	}
	/* an unusable --save-dir: exit 2 before training */
	snprintf(cmd, sizeof cmd, "%s train --train-data '%s/train_*.bin' --steps 1 --save-dir %s/train_000000.bin/ck",
	         loom, dir, dir);
	st = test_run_cmd(cmd, out, sizeof out, 30);
	CHECK_MSG(st == 2, "exit %d: %s", st, out);
	CHECK_CONTAINS(out, "train_000000.bin is not a directory");
	CHECK_MSG(!strstr(out, "step 1/1"), "trained: %s", out);
	test_rmdir(dir);
	return 0;
}

/* A diverging run stops with a clear error at the first non-finite loss, and does not checkpoint it. */
TEST(train_stops_on_divergence)
{
	char dir[512], data[700], ck[700];
	loom_gpt2_t *m = NULL;
	loom_trainer_t *tr = NULL;
	losses_t l;
	int64_t step = -1;
	memset(&l, 0, sizeof l);
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(make_shard(dir, "d.bin", 3000, tiny.vocab_size, 1));
	snprintf(data, sizeof data, "%s/d.bin", dir);
	snprintf(ck, sizeof ck, "%s/ck", dir);
	loom_train_config_t c = base_config(data);
	c.lr = (loom_lr_schedule_t){.peak_lr = 1e30, .total_steps = 20, .kind = LOOM_SCHED_CONSTANT};
	c.grad_clip = 0.0, c.save_dir = ck, c.save_every = 1;
	CHECK_OK(loom_gpt2_create(&m, &tiny, c.B, c.T));
	loom_gpt2_init(m, 1);
	CHECK_OK(loom_trainer_create(&tr, &c, loom_gpt2_model(m)));
	CHECK_ERR(loom_trainer_run(tr, rec, &l), LOOM_ESTATE);
	CHECK_CONTAINS(loom_errmsg(), "training diverged");
	long long bad = loom_trainer_steps_done(tr);
	CHECK_MSG(bad >= 2 && bad < 20, "diverged at step %lld", bad);
	CHECK_EQ(l.last, bad - 1); /* the callback never saw the bad step */
	char path[800];
	CHECK_OK(loom_ckpt_latest(ck, path, sizeof path, &step));
	CHECK_EQ(step, bad - 1);
	loom_trainer_destroy(tr);
	loom_gpt2_destroy(m);
	test_rmdir(dir);
	return 0;
}

/* The accumulation from a total batch (loom_train_accum): exact values, and the errors with the
 * product and the first valid totals. */
TEST(train_accum_from_total_batch)
{
	int accum = -1;
	CHECK_OK(loom_train_accum(128, 2, 16, 2, &accum));
	CHECK_EQ(accum, 2);
	CHECK_OK(loom_train_accum(32, 2, 16, 1, &accum));
	CHECK_EQ(accum, 1);
	CHECK_OK(loom_train_accum(524288, 8, 1024, 4, &accum)); /* GPT-2's 0.5M tokens on 4 ranks */
	CHECK_EQ(accum, 16);
	accum = -1;
	CHECK_ERR(loom_train_accum(96, 2, 16, 2, &accum), LOOM_EINVAL);
	CHECK_EQ(accum, -1);
	CHECK_STREQ(loom_errmsg(), "--total-batch-size 96 is not a multiple of B x T x ranks = 2 x 16 x 2 = 64 tokens "
	                           "per micro-step; valid values: 64, 128, 192, 256, 320, ...");
	CHECK_ERR(loom_train_accum(48, 2, 16, 1, &accum), LOOM_EINVAL);
	CHECK_STREQ(loom_errmsg(), "--total-batch-size 48 is not a multiple of B x T = 2 x 16 = 32 tokens per "
	                           "micro-batch; valid values: 32, 64, 96, 128, 160, ...");
	CHECK_ERR(loom_train_accum(16, 2, 16, 1, &accum), LOOM_EINVAL); /* smaller than one micro-batch */
	CHECK_ERR(loom_train_accum(64, 0, 16, 1, &accum), LOOM_EINVAL);
	CHECK_ERR(loom_train_accum(64, 2, 16, 0, &accum), LOOM_EINVAL);
	CHECK_ERR(loom_train_accum(0, 2, 16, 1, &accum), LOOM_EINVAL);
	CHECK_ERR(loom_train_accum(32LL << 31, 2, 16, 1, &accum), LOOM_EINVAL); /* 2^31 micro-steps */
	CHECK_CONTAINS(loom_errmsg(), "too many");
	return 0;
}

/* LR scaling: lr x (N / R)^p, exact in double for these powers of two; names and errors. */
TEST(train_lr_scaling)
{
	loom_lr_scale_t k;
	double lr = -1;
	CHECK_OK(loom_lr_scaled(0.01, LOOM_LR_SCALE_SQRT, 128, 32, &lr));
	CHECK_FEQ(lr, 0.02);
	CHECK_OK(loom_lr_scaled(0.01, LOOM_LR_SCALE_LINEAR, 128, 32, &lr));
	CHECK_FEQ(lr, 0.04);
	CHECK_OK(loom_lr_scaled(0.01, LOOM_LR_SCALE_LINEAR, 16, 32, &lr));
	CHECK_FEQ(lr, 0.005);
	CHECK_OK(loom_lr_scaled(0.01, LOOM_LR_SCALE_NONE, 128, 0, &lr)); /* none needs no reference */
	CHECK_FEQ(lr, 0.01);
	CHECK_ERR(loom_lr_scaled(0.01, LOOM_LR_SCALE_SQRT, 128, 0, &lr), LOOM_EINVAL);
	CHECK_STREQ(loom_errmsg(), "--lr-scale sqrt needs --ref-batch-size TOKENS (the batch --lr was tuned for)");
	CHECK_ERR(loom_lr_scaled(0.01, (loom_lr_scale_t)3, 128, 32, &lr), LOOM_EINVAL);
	CHECK_OK(loom_lr_scale_parse("linear", &k));
	CHECK_EQ(k, LOOM_LR_SCALE_LINEAR);
	CHECK_STREQ(loom_lr_scale_name(k), "linear");
	CHECK_STREQ(loom_lr_scale_name(LOOM_LR_SCALE_SQRT), "sqrt");
	CHECK_STREQ(loom_lr_scale_name((loom_lr_scale_t)9), "?");
	CHECK_ERR(loom_lr_scale_parse("cubic", &k), LOOM_EINVAL);
	CHECK_STREQ(loom_errmsg(), "'cubic' is not one of none, sqrt, linear");
	return 0;
}

/* The sgemm-peak cache under $XDG_CACHE_HOME: absent, stored, found for its thread count only, a line
 * of another CPU ignored. */
TEST(train_peak_cache)
{
	char dir[512], path[1100], want[1100];
	const char *old = getenv("XDG_CACHE_HOME");
	char *saved = old ? strdup(old) : NULL;
	double v = 0;
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	setenv("XDG_CACHE_HOME", dir, 1);
	CHECK_OK(loom_peak_cache_path(path, sizeof path));
	snprintf(want, sizeof want, "%s/loom/gemm_peak", dir);
	CHECK_STREQ(path, want);
	CHECK_ERR(loom_peak_cache_get(3, &v), LOOM_ENOENT);
	CHECK_OK(loom_peak_cache_put(3, 1.5e11)); /* creates dir/loom */
	CHECK_OK(loom_peak_cache_put(2, 7.25e10));
	CHECK_OK(loom_peak_cache_get(3, &v));
	CHECK_FEQ(v, 1.5e11);
	CHECK_OK(loom_peak_cache_get(2, &v));
	CHECK_FEQ(v, 7.25e10);
	CHECK_ERR(loom_peak_cache_get(4, &v), LOOM_ENOENT);
	CHECK_CONTAINS(loom_errmsg(), "has no peak for 4 threads on this CPU");
	/* a measurement of another CPU (hash 1) for 4 threads is not used */
	FILE *f = fopen(path, "a");
	CHECK(f != NULL);
	fprintf(f, "4 1 9.0e+11\n");
	fclose(f);
	CHECK_ERR(loom_peak_cache_get(4, &v), LOOM_ENOENT);
	CHECK_ERR(loom_peak_cache_put(4, 0.0), LOOM_EINVAL);
	if (saved)
		setenv("XDG_CACHE_HOME", saved, 1), free(saved);
	else
		unsetenv("XDG_CACHE_HOME");
	test_rmdir(dir);
	return 0;
}


/* A model-size flag overrides only its field: `--model tiny --vocab-size 1024 --seq-len 64` trains the
 * preset's 128 positions on 64 (the checkpoint says 128), and so do the tiny defaults under
 * --n-layer without --model; --n-positions alone sets them; --seq-len above them is an error naming
 * where they came from. nanochat (no preset) takes base_train's sequence_len = --seq-len unless
 * --n-positions says otherwise. */
TEST(train_model_flags_keep_positions)
{
	char dir[512], cmd[2048], out[16384], path[700], text[4096], want[128];
	const char *loom = test_loom_bin();
	loom_model_config_t c;
	static const struct {
		const char *flags, *model;
		int positions;
	} runs[] = {
		{"--model tiny --vocab-size 1024", "model: gpt2 L4 H4 C128 T128 V1024", 128},
		{"--n-layer 1 --n-embd 32 --n-head 2", "model: gpt2 L1 H2 C32 T128 V257", 128},
		{"--n-layer 1 --n-embd 32 --n-head 2 --n-positions 96", "model: gpt2 L1 H2 C32 T96 V257", 96},
	};
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(make_shard(dir, "train_000000.bin", 3000, 257, 3));
	for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) {
		snprintf(cmd, sizeof cmd, "%s train --train-data '%s/train_*.bin' %s --batch-size 1 --seq-len 64 --steps 1 "
		         "--threads 1 --peak-flops 1e10 --save-dir %s/ck%zu", loom, dir, runs[k].flags, dir, k);
		int st = test_run_cmd(cmd, out, sizeof out, 60);
		CHECK_MSG(st == 0, "`%s` exited %d:\n%s", cmd, st, out);
		CHECK_CONTAINS(out, runs[k].model);
		CHECK_CONTAINS(out, "batch: B=1 T=64 accum=1 -> 64 tokens per step");
		snprintf(path, sizeof path, "%s/ck%zu/step_00000001/model.safetensors", dir, k);
		CHECK_OK(loom_model_config(path, 0, &c, NULL));
		CHECK_EQ(c.seq_len, runs[k].positions);
		snprintf(path, sizeof path, "%s/ck%zu/step_00000001/config.json", dir, k);
		snprintf(want, sizeof want, "\"n_positions\": %d,", runs[k].positions);
		CHECK_CONTAINS(test_read_text(path, text, sizeof text), want);
	}
	/* more than the positions: one message, before training */
	snprintf(cmd, sizeof cmd, "%s train --train-data '%s/train_*.bin' --n-layer 1 --seq-len 256 --steps 1", loom, dir);
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 30), 2);
	CHECK_STREQ(out, "loom train: --seq-len 256 exceeds the model's maximum sequence length 128 (the tiny preset's "
	            "n_positions; give --n-positions 256 for a model of 256 positions)\n");
	snprintf(cmd, sizeof cmd, "%s train --train-data '%s/train_*.bin' --model tiny --n-positions 200 --seq-len 256 "
	         "--steps 1", loom, dir);
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 30), 2);
	CHECK_STREQ(out, "loom train: --seq-len 256 exceeds the model's maximum sequence length 200 (--n-positions 200)\n");
	/* nanochat: sequence_len follows --seq-len (base_train), or --n-positions */
	snprintf(cmd, sizeof cmd, "%s train --train-data '%s/train_*.bin' --arch nanochat --depth 1 --vocab-size 257 "
	         "--seq-len 32 --steps 1 --check && %s train --train-data '%s/train_*.bin' --arch nanochat --depth 1 "
	         "--vocab-size 257 --n-positions 64 --seq-len 32 --steps 1 --check", loom, dir, loom, dir);
	int st = test_run_cmd(cmd, out, sizeof out, 60);
	CHECK_MSG(st == 0, "`%s` exited %d:\n%s", cmd, st, out);
	CHECK_CONTAINS(out, "model: nanochat L1 H1 C128 T32 V257");
	CHECK_CONTAINS(out, "window pattern SSSL (S = 16 positions)");
	CHECK_CONTAINS(out, "model: nanochat L1 H1 C128 T64 V257");
	CHECK_CONTAINS(out, "window pattern SSSL (S = 32 positions)");
	test_rmdir(dir);
	return 0;
}

/* --init-from takes what `loom sample --model` takes (loom_model_path): a checkpoint directory
 * starts from its model.safetensors, bit for bit as the file itself does, and a --save-dir from its
 * newest checkpoint; a directory with neither is one message. */
TEST(train_init_from_checkpoint_dir)
{
	char dir[512], cmd[4096], out[16384], path[700], want[800];
	static char lines[2][64][160];
	double loss[2][64];
	const char *loom = test_loom_bin();
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(make_shard(dir, "train_000000.bin", 3000, 257, 4));
	snprintf(cmd, sizeof cmd, "%s train --train-data '%s/train_*.bin' --n-layer 1 --n-embd 32 --n-head 2 --batch-size 2 "
	         "--seq-len 16 --steps 2 --lr 1e-2 --threads 1 --peak-flops 1e10 --save-dir %s/ck --save-every 1", loom, dir,
	         dir);
	int st = test_run_cmd(cmd, out, sizeof out, 60);
	CHECK_MSG(st == 0, "`%s` exited %d:\n%s", cmd, st, out);
	static const char *const from[] = {"ck/step_00000001", "ck/step_00000001/model.safetensors"};
	for (int k = 0; k < 2; k++) {
		snprintf(cmd, sizeof cmd, "%s train --train-data '%s/train_*.bin' --init-from %s/%s --batch-size 2 --seq-len 16 "
		         "--steps 2 --lr 1e-3 --threads 1 --peak-flops 1e10 --log %s/i%d.jsonl", loom, dir, dir, from[k], dir, k);
		st = test_run_cmd(cmd, out, sizeof out, 60);
		CHECK_MSG(st == 0, "`%s` exited %d:\n%s", cmd, st, out);
		snprintf(want, sizeof want, "model: gpt2 L1 H2 C32 T128 V257, 25088 parameters, from %s/ck/step_00000001/"
		         "model.safetensors\n", dir);
		CHECK_CONTAINS(out, want);
		snprintf(path, sizeof path, "%s/i%d.jsonl", dir, k);
		CHECK_EQ(test_read_losses(path, loss[k], 64, lines[k], NULL), 2);
	}
	for (int s = 1; s <= 2; s++)
		CHECK_STREQ(lines[0][s], lines[1][s]); /* the directory is its model file, bit for bit */
	/* a --save-dir: its newest checkpoint */
	snprintf(cmd, sizeof cmd, "%s train --train-data '%s/train_*.bin' --init-from %s/ck --batch-size 2 --seq-len 16 "
	         "--steps 1 --threads 1 --peak-flops 1e10 --check", loom, dir, dir);
	st = test_run_cmd(cmd, out, sizeof out, 60);
	CHECK_MSG(st == 0, "`%s` exited %d:\n%s", cmd, st, out);
	snprintf(want, sizeof want, ", from %s/ck/step_00000002/model.safetensors\n", dir);
	CHECK_CONTAINS(out, want);
	/* neither: one message, as loom sample says it */
	snprintf(cmd, sizeof cmd, "mkdir %s/empty && %s train --train-data '%s/train_*.bin' --init-from %s/empty --steps 1",
	         dir, loom, dir, dir);
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 30), 2);
	snprintf(want, sizeof want, "loom train: --init-from: %s/empty: a directory without model.safetensors or "
	         "checkpoints (step_NNNNNNNN)\n", dir);
	CHECK_STREQ(out, want);
	snprintf(cmd, sizeof cmd, "%s sample --model %s/empty", loom, dir);
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 30), 2);
	snprintf(want, sizeof want, "loom sample: --model: %s/empty: a directory without model.safetensors or "
	         "checkpoints (step_NNNNNNNN)\n", dir);
	CHECK_STREQ(out, want);
	test_rmdir(dir);
	return 0;
}

/* The names in directory `path` but . and .., sorted, space-separated ("" when it does not exist). */
static void list_dir(const char *path, char *buf, size_t cap)
{
	char names[64][256];
	int n = 0;
	size_t len = 0;
	DIR *d = opendir(path);
	struct dirent *e;
	buf[0] = 0;
	if (!d)
		return;
	while ((e = readdir(d)) && n < 64)
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
			snprintf(names[n++], sizeof names[0], "%s", e->d_name);
	closedir(d);
	qsort(names, (size_t)n, sizeof names[0], (int (*)(const void *, const void *))strcmp);
	for (int i = 0; i < n; i++)
		len += (size_t)snprintf(buf + len, len < cap ? cap - len : 0, "%s%s", i ? " " : "", names[i]);
}

/* Issue 34: a resume from an older step pruned its own checkpoints (--keep-checkpoints kept the
 * highest steps, the abandoned branch's) and left the summary naming a deleted one. The newer
 * checkpoints now move aside into ck/abandoned-at-step_S before the run, so pruning keeps the newest
 * of the live branch, the summary's checkpoint exists and --resume continues the live branch:
 * from an older step, from the newest, from the oldest, and twice from the same step. */
TEST(train_resume_lineage)
{
	char dir[512], base[2048], cmd[4096], out[32768], ck[700], got[2048], p[4096];
	const char *loom = test_loom_bin();
	struct stat sb;
	int st;
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(make_shard(dir, "train_000000.bin", 3000, 257, 1));
	snprintf(ck, sizeof ck, "%s/ck", dir);
	snprintf(base, sizeof base, "%s train --train-data '%s/train_*.bin' --n-layer 1 --n-embd 32 --n-head 2 "
	         "--batch-size 2 --seq-len 16 --threads 1 --peak-flops 1e10 --print-every 100 --save-dir %s "
	         "--save-every 2", loom, dir, ck);
	snprintf(cmd, sizeof cmd, "%s --steps 12", base);
	st = test_run_cmd(cmd, out, sizeof out, 60);
	CHECK_MSG(st == 0, "exit %d: %s", st, out);
	CHECK_MSG(!strstr(out, "checkpoints: "), "a fresh run into an empty directory moved something: %s", out);
	list_dir(ck, got, sizeof got);
	CHECK_STREQ(got, "step_00000002 step_00000004 step_00000006 step_00000008 step_00000010 step_00000012");

	/* 1. from an older step (the case): 8, 10 and 12 are the abandoned branch's */
	snprintf(cmd, sizeof cmd, "%s --steps 9 --keep-checkpoints 2 --resume-from %s/step_00000006", base, ck);
	st = test_run_cmd(cmd, out, sizeof out, 60);
	CHECK_MSG(st == 0, "exit %d: %s", st, out);
	snprintf(p, sizeof p, "checkpoints: this run continues from step 6, so the 3 newer checkpoints in %s "
	         "(step_00000008, step_00000010, step_00000012) belong to an abandoned branch: moved aside into "
	         "%s/abandoned-at-step_00000006 (nothing deleted)\n", ck, ck);
	CHECK_CONTAINS(out, p);
	CHECK_MSG(strstr(out, "checkpoints: ") == strstr(out, p), "said more than once: %s", out);
	snprintf(p, sizeof p, "summary: checkpoint %s/step_00000009\n", ck);
	CHECK_CONTAINS(out, p);
	list_dir(ck, got, sizeof got);
	CHECK_STREQ(got, "abandoned-at-step_00000006 step_00000008 step_00000009");
	snprintf(p, sizeof p, "%s/abandoned-at-step_00000006", ck);
	list_dir(p, got, sizeof got);
	CHECK_STREQ(got, "step_00000008 step_00000010 step_00000012");
	snprintf(p, sizeof p, "%s/abandoned-at-step_00000006/step_00000012", ck);
	CHECK_OK(loom_ckpt_verify(p)); /* moved whole */
	snprintf(p, sizeof p, "%s/step_00000009", ck);
	CHECK_OK(loom_ckpt_verify(p));

	/* 2. from the newest (--resume): nothing is abandoned, nothing moves */
	snprintf(cmd, sizeof cmd, "%s --steps 11 --keep-checkpoints 2 --resume", base);
	st = test_run_cmd(cmd, out, sizeof out, 60);
	CHECK_MSG(st == 0, "exit %d: %s", st, out);
	snprintf(p, sizeof p, "resumed from %s at step 9\n", ck);
	CHECK_CONTAINS(out, p);
	CHECK_MSG(!strstr(out, "checkpoints: "), "moved checkpoints on a resume from the newest: %s", out);
	snprintf(p, sizeof p, "summary: checkpoint %s/step_00000011\n", ck);
	CHECK_CONTAINS(out, p);
	list_dir(ck, got, sizeof got);
	CHECK_STREQ(got, "abandoned-at-step_00000006 step_00000010 step_00000011");

	/* 3. from the oldest of the directory, and 4. from the same step again: a directory of its own */
	for (int pass = 0; pass < 2; pass++) {
		snprintf(cmd, sizeof cmd, "%s --steps %d --keep-checkpoints 2 --resume-from %s/step_00000010", base,
		         pass == 0 ? 12 : 11, ck);
		st = test_run_cmd(cmd, out, sizeof out, 60);
		CHECK_MSG(st == 0, "exit %d: %s", st, out);
		snprintf(p, sizeof p, "the 1 newer checkpoint in %s (step_%08d) belongs to an abandoned branch: moved aside "
		         "into %s/abandoned-at-step_00000010%s (nothing deleted)\n", ck, pass == 0 ? 11 : 12, ck,
		         pass == 0 ? "" : ".2");
		CHECK_CONTAINS(out, p);
		snprintf(p, sizeof p, "summary: checkpoint %s/step_%08d\n", ck, pass == 0 ? 12 : 11);
		CHECK_CONTAINS(out, p);
		snprintf(p, sizeof p, "%s/step_%08d", ck, pass == 0 ? 12 : 11);
		CHECK_MSG(stat(p, &sb) == 0, "the summary's checkpoint %s does not exist", p);
	}
	list_dir(ck, got, sizeof got);
	CHECK_STREQ(got, "abandoned-at-step_00000006 abandoned-at-step_00000010 abandoned-at-step_00000010.2 "
	                 "step_00000010 step_00000011");
	snprintf(p, sizeof p, "%s/abandoned-at-step_00000010", ck);
	list_dir(p, got, sizeof got);
	CHECK_STREQ(got, "step_00000011");
	snprintf(p, sizeof p, "%s/abandoned-at-step_00000010.2", ck);
	list_dir(p, got, sizeof got);
	CHECK_STREQ(got, "step_00000012");

	/* --resume continues the live branch: step 11 is the newest, nothing to do at --steps 11 */
	snprintf(cmd, sizeof cmd, "%s --steps 11 --keep-checkpoints 2 --resume", base);
	st = test_run_cmd(cmd, out, sizeof out, 60);
	CHECK_MSG(st == 0, "exit %d: %s", st, out);
	snprintf(p, sizeof p, "resumed from %s at step 11\n", ck);
	CHECK_CONTAINS(out, p);

	/* a fresh run (no --resume) into the directory starts at step 0: every checkpoint there is of an
	 * earlier run and moves aside, so --resume later finds this run's */
	snprintf(cmd, sizeof cmd, "%s --steps 2", base);
	st = test_run_cmd(cmd, out, sizeof out, 60);
	CHECK_MSG(st == 0, "exit %d: %s", st, out);
	snprintf(p, sizeof p, "checkpoints: this run starts from scratch, so the 2 checkpoints in %s "
	         "(step_00000010, step_00000011) belong to an earlier run: moved aside into "
	         "%s/abandoned-at-step_00000000 (nothing deleted)\n", ck, ck);
	CHECK_CONTAINS(out, p);
	list_dir(ck, got, sizeof got);
	CHECK_STREQ(got, "abandoned-at-step_00000000 abandoned-at-step_00000006 abandoned-at-step_00000010 "
	                 "abandoned-at-step_00000010.2 step_00000002");
	snprintf(cmd, sizeof cmd, "%s info %s", loom, ck);
	st = test_run_cmd(cmd, out, sizeof out, 30);
	CHECK_MSG(st == 0, "exit %d: %s", st, out);
	snprintf(p, sizeof p, "%s: checkpoint directory (--save-dir): 1 checkpoint, the latest complete one is "
	         "%s/step_00000002 (step 2)\n%s: 4 abandoned branches moved aside: %s/abandoned-at-step_*\n\n", ck, ck, ck, ck);
	CHECK_CONTAINS(out, p);
	test_rmdir(dir);
	return 0;
}

/* The config records of log `path` (up to 4, each cut to 4095 bytes) and its line kinds in order: c
 * (config), s (step), S (summary), e.g. "csssscsssS". Returns the number of config records. */
static int log_records(const char *path, char cfg[4][4096], char *kinds, size_t cap)
{
	FILE *f = fopen(path, "r");
	char line[8192];
	int n = 0;
	size_t k = 0;
	kinds[0] = 0;
	if (!f)
		return -1;
	while (fgets(line, sizeof line, f) && k + 1 < cap) {
		char c = !strncmp(line, "{\"config\":", 10) ? 'c' : !strncmp(line, "{\"step\":", 8) ? 's'
		         : !strncmp(line, "{\"summary\":", 11) ? 'S' : '?';
		if (c == 'c' && n < 4)
			snprintf(cfg[n++], 4096, "%.4095s", line);
		kinds[k++] = c, kinds[k] = 0;
	}
	fclose(f);
	return n;
}

/* Issue 34: after a resume that changed the world size, the log kept only the first run's config
 * record (and `loom plot` labelled the whole run with it). A resume whose settings differ from the
 * record in force appends one for its segment ("first_step", "resumed_from"); one with the same
 * settings does not; a resume from before a segment drops that segment's record with its steps; and
 * the plot labels each segment by its own record (segments with one label as one). */
TEST(train_log_segments)
{
	char dir[512], base[2048], cmd[4096], out[32768], logp[700], p[4096], kinds[64], cfg[4][4096];
	const char *loom = test_loom_bin();
	int st;
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(make_shard(dir, "train_000000.bin", 3000, 257, 1));
	snprintf(logp, sizeof logp, "%s/r.jsonl", dir);
	snprintf(base, sizeof base, "%s train --train-data '%s/train_*.bin' --n-layer 1 --n-embd 32 --n-head 2 "
	         "--batch-size 2 --seq-len 16 --total-batch-size 64 --threads 1 --peak-flops 1e10 --print-every 100 "
	         "--save-dir %s/ck --save-every 2 --log %s", loom, dir, dir, logp);
	/* 2 ranks for steps 1-8, then one process (accumulation 2) from step 4 */
	snprintf(cmd, sizeof cmd, "%s --steps 8 --nproc 2", base);
	st = test_run_cmd(cmd, out, sizeof out, 120);
	CHECK_MSG(st == 0, "exit %d: %s", st, out);
	snprintf(cmd, sizeof cmd, "%s --steps 8 --resume-from %s/ck/step_00000004", base, dir);
	st = test_run_cmd(cmd, out, sizeof out, 60);
	CHECK_MSG(st == 0, "exit %d: %s", st, out);
	CHECK_CONTAINS(out, "batch: B=2 T=16 accum=2 -> 64 tokens per step");
	CHECK_EQ(log_records(logp, cfg, kinds, sizeof kinds), 2);
	CHECK_STREQ(kinds, "cssssc" "ssssS");
	CHECK_CONTAINS(cfg[0], "\"threads\":1,\"world\":2,\"dp\":2,\"tp\":1,\"pp\":1,");
	CHECK_CONTAINS(cfg[0], "\"grad_accum\":1,\"tokens_per_step\":64,");
	CHECK_MSG(!strstr(cfg[0], "first_step"), "%s", cfg[0]);
	CHECK_CONTAINS(cfg[1], "\"threads\":1,\"world\":1,\"dp\":1,\"tp\":1,\"pp\":1,");
	CHECK_CONTAINS(cfg[1], "\"grad_accum\":2,\"tokens_per_step\":64,");
	snprintf(p, sizeof p, ",\"first_step\":5,\"resumed_from\":\"%s/ck/step_00000004\"}}\n", dir);
	CHECK_CONTAINS(cfg[1], p);
	/* a resume inside that segment with its settings (the environment aside: here another --load, so
	 * another prediction) appends no record */
	snprintf(cmd, sizeof cmd, "%s --steps 8 --resume-from %s/ck/step_00000006 --load 0.37", base, dir);
	st = test_run_cmd(cmd, out, sizeof out, 60);
	CHECK_MSG(st == 0, "exit %d: %s", st, out);
	CHECK_EQ(log_records(logp, cfg, kinds, sizeof kinds), 2);
	CHECK_STREQ(kinds, "cssssc" "ssssS");

	/* the plot names both segments, in the SVG's legend and the gnuplot script's titles */
	const char *seg1 = "r steps 1-4 (L1 C32, 64 tok/step, lr 0.0006, ranks 2)";
	const char *seg2 = "r steps 5-8 (L1 C32, 64 tok/step, lr 0.0006, accum 2)";
	snprintf(cmd, sizeof cmd, "%s plot %s -o %s/p.svg && %s plot %s -o %s/p.gp && cat %s/p.svg %s/p.gp", loom, logp,
	         dir, loom, logp, dir, dir, dir);
	st = test_run_cmd(cmd, out, sizeof out, 30);
	CHECK_MSG(st == 0, "exit %d: %s", st, out);
	CHECK_CONTAINS(out, "/p.svg (1200 x 450, SVG): 1 run, 8 steps, 2 segments with their own settings\n");
	snprintf(p, sizeof p, "<text x=\"144\" y=\"%.1f\">%s</text>", 450 - (18.0 * 3 + 8) + 18.0 + 8 + 4, seg1);
	CHECK_CONTAINS(out, p);
	snprintf(p, sizeof p, "<text x=\"144\" y=\"%.1f\">%s</text>", 450 - (18.0 * 3 + 8) + 36.0 + 8 + 4, seg2);
	CHECK_CONTAINS(out, p);
	snprintf(p, sizeof p, "$run0 every ::0::3 u 1:3 w l lc rgb '#1f77b4' lw 2 title '%s'", seg1);
	CHECK_CONTAINS(out, p);
	snprintf(p, sizeof p, "$run0 every ::3::7 u 1:3 w l lc rgb '#1f77b4' lw 2 title '%s'", seg2);
	CHECK_CONTAINS(out, p);
	CHECK_CONTAINS(out, "set arrow 1 from first 4.5, graph 0 to first 4.5, graph 1 nohead dt 3 lw 1.5 lc rgb '#1f77b4'\n");
	CHECK_MSG(!strstr(out, "set arrow 2 "), "one boundary only: %s", out);

	/* extending the same settings to 10 steps: --steps is a setting, so a third record; the plot
	 * labels steps 5-10 as one segment (the same label) */
	snprintf(cmd, sizeof cmd, "%s --steps 10 --resume", base);
	st = test_run_cmd(cmd, out, sizeof out, 60);
	CHECK_MSG(st == 0, "exit %d: %s", st, out);
	CHECK_EQ(log_records(logp, cfg, kinds, sizeof kinds), 3);
	CHECK_STREQ(kinds, "cssssc" "ssssc" "ssS");
	CHECK_CONTAINS(cfg[2], ",\"first_step\":9,");
	snprintf(cmd, sizeof cmd, "%s plot %s -o %s/p.gp && cat %s/p.gp", loom, logp, dir, dir);
	st = test_run_cmd(cmd, out, sizeof out, 30);
	CHECK_MSG(st == 0, "exit %d: %s", st, out);
	CHECK_CONTAINS(out, "title 'r steps 5-10 (L1 C32, 64 tok/step, lr 0.0006, accum 2)'");

	/* back on 2 ranks from step 4 with the first settings: the later segments' records go with their
	 * steps, and the first record describes the run again, so none is appended */
	snprintf(cmd, sizeof cmd, "%s --steps 8 --nproc 2 --resume-from %s/ck/step_00000004", base, dir);
	st = test_run_cmd(cmd, out, sizeof out, 120);
	CHECK_MSG(st == 0, "exit %d: %s", st, out);
	CHECK_EQ(log_records(logp, cfg, kinds, sizeof kinds), 1);
	CHECK_STREQ(kinds, "cssss" "ssssS");
	snprintf(cmd, sizeof cmd, "%s plot %s -o %s/p.svg && cat %s/p.svg", loom, logp, dir, dir);
	st = test_run_cmd(cmd, out, sizeof out, 30);
	CHECK_MSG(st == 0, "exit %d: %s", st, out);
	CHECK_CONTAINS(out, ">r (L1 C32, 64 tok/step, lr 0.0006, ranks 2): loss (moving average");
	CHECK_MSG(!strstr(out, "steps 1-"), "segments in a run of one: %s", out);
	test_rmdir(dir);
	return 0;
}

/* A replica checkpoint (loom_trainer_save_replica: what an elastic job's survivors keep in RAM) is the
 * checkpoint loom_trainer_save writes, byte for byte, and a run resumed from it ends bit-identical to
 * the uninterrupted one. */
typedef struct {
	const char *dir;
	int rc;
} replica_ctx_t;

static int save_replica_at_3(void *ctx, loom_trainer_t *tr, const loom_step_metrics_t *m)
{
	replica_ctx_t *r = ctx;
	if (m->step == 3)
		r->rc = loom_trainer_save_replica(tr, r->dir);
	return 0;
}

TEST(train_replica_checkpoint)
{
	static const char *const files[] = {"model.safetensors", "optim.safetensors", "state.json"};
	char dir[512], data[700], ck[700], rep[700], path_a[900], path_b[900], bad[1000];
	loom_gpt2_t *a = NULL, *b = NULL;
	loom_trainer_t *ta = NULL, *tb = NULL;
	size_t n = loom_gpt2_num_params(&tiny);
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(make_shard(dir, "train_000000.bin", 3000, tiny.vocab_size, 1));
	snprintf(data, sizeof data, "%s/train_*.bin", dir);
	snprintf(ck, sizeof ck, "%s/ck", dir);
	snprintf(rep, sizeof rep, "%s/rescue/host", dir);
	loom_train_config_t c = base_config(data);
	c.save_dir = ck, c.save_every = 3;
	CHECK_OK(loom_gpt2_create(&a, &tiny, c.B, c.T));
	loom_gpt2_init(a, 9);
	CHECK_OK(loom_trainer_create(&ta, &c, loom_gpt2_model(a)));
	CHECK(loom_trainer_replica_why(ta) == NULL);
	replica_ctx_t r = {rep, -99};
	CHECK_OK(loom_trainer_run(ta, save_replica_at_3, &r));
	CHECK_OK(r.rc);
	for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
		char *x, *y;
		size_t nx, ny;
		snprintf(path_a, sizeof path_a, "%s/step_00000003/%s", ck, files[i]);
		snprintf(path_b, sizeof path_b, "%s/step_00000003/%s", rep, files[i]);
		CHECK_OK(read_all(path_a, &x, &nx));
		CHECK_OK(read_all(path_b, &y, &ny));
		CHECK_MSG(nx == ny && memcmp(x, y, nx) == 0, "%s: the replica's %zu bytes differ from the checkpoint's %zu",
		          files[i], ny, nx);
		free(x), free(y);
	}
	snprintf(path_b, sizeof path_b, "%s/step_00000003", rep);
	CHECK_OK(loom_ckpt_verify(path_b));

	/* resumed from the replica: the same end, bit for bit */
	CHECK_OK(loom_gpt2_create(&b, &tiny, c.B, c.T));
	loom_gpt2_init(b, 77);
	c.save_dir = NULL;
	CHECK_OK(loom_trainer_create(&tb, &c, loom_gpt2_model(b)));
	CHECK_OK(loom_trainer_resume(tb, path_b));
	CHECK_EQ(loom_trainer_steps_done(tb), 3);
	CHECK_OK(loom_trainer_run(tb, NULL, NULL));
	CHECK(memcmp(loom_gpt2_params(a), loom_gpt2_params(b), n * sizeof(float)) == 0);
	const loom_adamw_t *oa = loom_trainer_optimizer(ta), *ob = loom_trainer_optimizer(tb);
	CHECK(memcmp(oa->m, ob->m, n * sizeof(float)) == 0 && memcmp(oa->v, ob->v, n * sizeof(float)) == 0);

	/* a directory that cannot be made: an error naming it, nothing written */
	snprintf(bad, sizeof bad, "%s/model.safetensors/x", path_b);
	CHECK_ERR(loom_trainer_save_replica(tb, bad), LOOM_ESYS);
	CHECK_CONTAINS(loom_errmsg(), "a replica checkpoint of step 6 into ");
	CHECK_CONTAINS(loom_errmsg(), bad);
	CHECK_OK(loom_trainer_remove_replica(rep));
	CHECK(access(rep, F_OK) != 0);
	CHECK_OK(loom_trainer_remove_replica(rep)); /* gone already: fine */
	loom_trainer_destroy(ta);
	loom_trainer_destroy(tb);
	loom_gpt2_destroy(a);
	loom_gpt2_destroy(b);
	test_rmdir(dir);
	return 0;
}
