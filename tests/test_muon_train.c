/* test_muon_train.c: MuonAdamW in training (`loom train --optimizer muon`, src/parallel/muon_opt.c):
 * DistMuon at 2, 3 and 4 ranks against one process with the same tokens per step, resume
 * bit-identical, a checkpoint of 2 ranks resumed on 3, the schedules' knobs in the log, and the flag
 * combinations that are refused before training. Through the CLI on the `tiny` preset (GPT-2: its
 * blocks' matrices are Muon's) and a small generated dataset. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"

enum { VOCAB = 64, STEPS = 8, MAXSTEPS = 64 };

#define FLAGS                                                                                                    \
	"--model tiny --batch-size 2 --seq-len 16 --optimizer muon --matrix-lr 0.02 --lr 2e-3 --warmup 1 "           \
	"--shuffle 1 --seed 7 --peak-flops 1e10 --total-batch-size 384"

/* One process, then 2, 3 and 4 ranks (accumulation 12, 6, 4, 3: the same 384 tokens per step): the
 * per-step losses within 1e-6 relative; every rank's parameters are compared bit for bit after every
 * step (--check-replicas 1), so the owners' all-gather gives everyone the same matrices. */
TEST(muon_dist_matches_one_process)
{
	char dir[512], cmd[4096], out[16384], path[1024], want[128];
	double ref[MAXSTEPS] = {0}, got[MAXSTEPS] = {0};
	const char *loom = test_loom_bin();
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(test_make_token_data(dir, VOCAB, 6001));
	for (int world = 1; world <= 4; world++) {
		snprintf(cmd, sizeof cmd, "%s train --nproc %d --train-data '%s/train_*.bin' " FLAGS " --steps %d "
		         "--check-replicas 1 --log %s/w%d.jsonl", loom, world, dir, STEPS, dir, world);
		RUN_OK(cmd, out, 180);
		snprintf(want, sizeof want, "optimizer: MuonAdamW: Muon matrices lr 0.02");
		CHECK_CONTAINS(out, want);
		if (world > 1)
			CHECK_CONTAINS(out, "DistMuon: each rank updates its share of the matrices");
		snprintf(path, sizeof path, "%s/w%d.jsonl", dir, world);
		CHECK_EQ(test_read_losses(path, world == 1 ? ref : got, MAXSTEPS, NULL, NULL), STEPS);
		for (int s = 1; world > 1 && s <= STEPS; s++)
			CHECK_MSG(fabs(got[s] - ref[s]) <= 1e-6 * ref[s], "%d ranks, step %d: loss %.9g, one process %.9g", world,
			          s, got[s], ref[s]);
	}
	CHECK(ref[STEPS] < ref[1] - 0.1); /* it learned */
	/* with ZeRO: the shards snap to whole matrices, each rank's MuonAdamW owns its shard's */
	static const struct {
		int world, stage;
	} zero[] = {{2, 1}, {2, 2}, {3, 3}, {4, 2}};
	for (size_t k = 0; k < sizeof zero / sizeof zero[0]; k++) {
		snprintf(cmd, sizeof cmd, "%s train --nproc %d --zero %d --train-data '%s/train_*.bin' " FLAGS " --steps %d "
		         "--log %s/z%zu.jsonl", loom, zero[k].world, zero[k].stage, dir, STEPS, dir, k);
		RUN_OK(cmd, out, 180);
		snprintf(path, sizeof path, "%s/z%zu.jsonl", dir, k);
		CHECK_EQ(test_read_losses(path, got, MAXSTEPS, NULL, NULL), STEPS);
		for (int s = 1; s <= STEPS; s++)
			CHECK_MSG(fabs(got[s] - ref[s]) <= 1e-6 * ref[s], "ZeRO-%d on %d ranks, step %d: loss %.9g, one process "
			          "%.9g", zero[k].stage, zero[k].world, s, got[s], ref[s]);
	}
	test_rmdir(dir);
	return 0;
}

/* Resume at 2 ranks continues bit-identically (log lines and the final checkpoint's files), each rank
 * having written its matrices' state; the same checkpoint resumes on 3 ranks within 1e-6 of the
 * uninterrupted run (each rank finds its matrices in whichever file holds them). */
TEST(muon_resume_and_reshard)
{
	char dir[512], cmd[16384], out[16384], path[1024], loom[1024];
	char real[PATH_MAX];
	static char full[MAXSTEPS][160], resumed[MAXSTEPS][160];
	double ref[MAXSTEPS] = {0}, got[MAXSTEPS] = {0};
	CHECK(realpath(test_loom_bin(), real) != NULL && strlen(real) < sizeof loom);
	snprintf(loom, sizeof loom, "%.1000s", real); /* the commands below cd into the test's directory */
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(test_make_token_data(dir, VOCAB, 6001));
	snprintf(cmd, sizeof cmd, "%s train --nproc 2 --train-data '%s/train_*.bin' " FLAGS " --steps %d --save-dir %s/ck "
	         "--save-every 4 --log %s/full.jsonl", loom, dir, STEPS, dir, dir);
	RUN_OK(cmd, out, 180);
	snprintf(cmd, sizeof cmd, "cd %s && mv ck/step_%08d full_final && cp -r ck/step_00000004 keep4 && cp full.jsonl "
	         "r.jsonl && test -s keep4/muon_r0.safetensors && test -s keep4/muon_r1.safetensors && grep -q "
	         "muon_r1.safetensors keep4/MANIFEST", dir, STEPS);
	RUN_OK(cmd, out, 10);
	snprintf(path, sizeof path, "%s/full.jsonl", dir);
	CHECK_EQ(test_read_losses(path, ref, MAXSTEPS, full, NULL), STEPS);
	snprintf(cmd, sizeof cmd, "%s train --nproc 2 --train-data '%s/train_*.bin' " FLAGS " --steps %d --save-dir %s/ck "
	         "--save-every 4 --log %s/r.jsonl --resume", loom, dir, STEPS, dir, dir);
	RUN_OK(cmd, out, 180);
	CHECK_CONTAINS(out, "at step 4");
	snprintf(path, sizeof path, "%s/r.jsonl", dir);
	CHECK_EQ(test_read_losses(path, got, MAXSTEPS, resumed, NULL), STEPS);
	for (int s = 1; s <= STEPS; s++)
		CHECK_STREQ(resumed[s], full[s]);
	snprintf(cmd, sizeof cmd, "cd %s && for f in full_final/*; do cmp $f ck/step_%08d/${f#full_final/} || exit 1; "
	         "done", dir, STEPS);
	RUN_OK(cmd, out, 10);
	/* 2 ranks -> 3 */
	snprintf(cmd, sizeof cmd, "cd %s && rm -rf t && mkdir t && cp -r keep4 t/step_00000004 && head -5 full.jsonl > "
	         "t.jsonl && %s train --nproc 3 --train-data '%s/train_*.bin' " FLAGS " --steps %d --save-dir t --log "
	         "t.jsonl --resume", dir, loom, dir, STEPS);
	RUN_OK(cmd, out, 180);
	CHECK_CONTAINS(out, "at step 4");
	snprintf(path, sizeof path, "%s/t.jsonl", dir);
	CHECK_EQ(test_read_losses(path, got, MAXSTEPS, NULL, NULL), STEPS);
	for (int s = 5; s <= STEPS; s++)
		CHECK_MSG(fabs(got[s] - ref[s]) <= 1e-6 * ref[s], "3 ranks from 2, step %d: loss %.9g, uninterrupted %.9g", s,
		          got[s], ref[s]);
	/* the DDP checkpoint resumes under ZeRO-3 on 3 ranks, and a ZeRO-2 one (2 ranks) under DDP on 3 */
	snprintf(cmd, sizeof cmd, "cd %s && rm -rf t && mkdir t && cp -r keep4 t/step_00000004 && head -5 full.jsonl > "
	         "t.jsonl && %s train --nproc 3 --zero 3 --train-data '%s/train_*.bin' " FLAGS " --steps %d --save-dir t "
	         "--log t.jsonl --resume", dir, loom, dir, STEPS);
	RUN_OK(cmd, out, 180);
	snprintf(path, sizeof path, "%s/t.jsonl", dir);
	CHECK_EQ(test_read_losses(path, got, MAXSTEPS, NULL, NULL), STEPS);
	for (int s = 5; s <= STEPS; s++)
		CHECK_MSG(fabs(got[s] - ref[s]) <= 1e-6 * ref[s], "ZeRO-3 x 3 from DDP x 2, step %d: loss %.9g, uninterrupted "
		          "%.9g", s, got[s], ref[s]);
	snprintf(cmd, sizeof cmd, "cd %s && rm -rf z && %s train --nproc 2 --zero 2 --train-data '%s/train_*.bin' " FLAGS
	         " --steps %d --save-dir z --save-every 4 >/dev/null && rm -rf t && mkdir t && cp -r z/step_00000004 t/ && "
	         "test -s t/step_00000004/zero.json && head -5 full.jsonl > t.jsonl && %s train --nproc 3 --train-data "
	         "'%s/train_*.bin' " FLAGS " --steps %d --save-dir t --log t.jsonl --resume", dir, loom, dir, STEPS, loom,
	         dir, STEPS);
	RUN_OK(cmd, out, 180);
	CHECK_EQ(test_read_losses(path, got, MAXSTEPS, NULL, NULL), STEPS);
	for (int s = 5; s <= STEPS; s++)
		CHECK_MSG(fabs(got[s] - ref[s]) <= 1e-6 * ref[s], "DDP x 3 from ZeRO-2 x 2, step %d: loss %.9g, uninterrupted "
		          "%.9g", s, got[s], ref[s]);
	/* an AdamW checkpoint does not resume under muon, nor the other way round: both say so */
	snprintf(cmd, sizeof cmd, "cd %s && rm -rf a && %s train --train-data '%s/train_*.bin' --model tiny --batch-size 2 "
	         "--seq-len 16 --steps 2 --save-dir a --peak-flops 1e10 --total-batch-size 384 --shuffle 1 --seed 7 >/dev/null && %s train --train-data "
	         "'%s/train_*.bin' " FLAGS " --steps 4 --save-dir a --resume", dir, loom, dir, loom, dir);
	CHECK(test_run_cmd(cmd, out, sizeof out, 60) != 0);
	CHECK_CONTAINS(out, "it was written with --optimizer adamw; resume with that optimizer");
	snprintf(cmd, sizeof cmd, "cd %s && %s train --train-data '%s/train_*.bin' --model tiny --batch-size 2 --seq-len 16 "
	         "--steps 12 --save-dir t --peak-flops 1e10 --total-batch-size 384 --shuffle 1 --seed 7 --resume", dir, loom, dir);
	CHECK(test_run_cmd(cmd, out, sizeof out, 60) != 0);
	CHECK_CONTAINS(out, "was written with --optimizer muon; resume with it");
	test_rmdir(dir);
	return 0;
}

/* What MuonAdamW does not run with stops before training, with one message naming the conflict. */
TEST(muon_refused_combinations)
{
	char dir[512], cmd[4096], out[16384];
	const char *loom = test_loom_bin();
	static const struct {
		const char *flags, *says;
	} bad[] = {
		{"--nproc 2 --tp 2", "loom train: --optimizer muon with --tp 2: a tensor-parallel shard of a matrix cannot "
		                     "be orthogonalized alone; use --optimizer adamw with --tp, or --optimizer muon without "
		                     "--tp (data parallel, ZeRO 1-3 and --pp run it)\n"},
		{"--wd-scale epochs", "--wd-scale epochs scales Muon's weight decay: it needs --optimizer muon and "
		                      "--ref-tokens"},
	};
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(test_make_token_data(dir, VOCAB, 6001));
	for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
		snprintf(cmd, sizeof cmd, "%s train --train-data '%s/train_*.bin' " FLAGS " --steps 2 %s", loom, dir,
		         bad[k].flags);
		CHECK_MSG(test_run_cmd(cmd, out, sizeof out, 60) != 0, "`%s` ran", cmd);
		CHECK_CONTAINS(out, bad[k].says);
		CHECK_MSG(!strstr(out, "step 1/"), "`%s` trained before refusing:\n%s", cmd, out);
	}
	test_rmdir(dir);
	return 0;
}

/* nanochat's recipe knobs, end to end: --schedule warmdown (the printed rates are base_train's
 * multiplier), --lr-scale sqrt against B_ref 2^19 (every group x sqrt(384 / 524288)), --wd-scale
 * epochs, and the loss EMA (debiased) in the line. */
TEST(muon_recipe_knobs_in_the_log)
{
	char dir[512], cmd[4096], out[16384], want[200];
	const char *loom = test_loom_bin();
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(test_make_token_data(dir, VOCAB, 6001));
	snprintf(cmd, sizeof cmd, "%s train --train-data '%s/train_*.bin' --model tiny --batch-size 2 --seq-len 16 "
	         "--optimizer muon --warmup 0 --shuffle 1 --seed 7 --peak-flops 1e10 --total-batch-size 384 --steps 4 "
	         "--schedule warmdown --warmdown-frac 0.5 --min-lr-frac 0.1 --lr-scale sqrt --wd-scale epochs "
	         "--ref-tokens 3072 --weight-decay 0.2", loom, dir);
	RUN_OK(cmd, out, 120);
	/* steps 1-2 constant, then (4 - it) / 2 of the way back: it = 2 -> 1.0, it = 3 -> 0.5 + 0.5 x 0.1 */
	CHECK_CONTAINS(out, "step 1/4 | loss ");
	CHECK_CONTAINS(out, "| lr 1.000e+00 |");
	CHECK_CONTAINS(out, "step 4/4 | loss ");
	CHECK_CONTAINS(out, "| lr 5.500e-01 |");
	snprintf(want, sizeof want, "lr: every group's rate x %g (sqrt scaling, 384 tokens per step vs a reference of "
	         "524288)", sqrt(384.0 / 524288.0));
	CHECK_CONTAINS(out, want);
	/* wd: 0.2 x sqrt(384 / 2^19) x (3072 / (4 x 384)) */
	snprintf(want, sizeof want, "weight decay %g -> 0", (double)(float)(0.2 * sqrt(384.0 / 524288.0) * 2.0));
	CHECK_CONTAINS(out, want);
	CHECK_CONTAINS(out, "| ema ");
	test_rmdir(dir);
	return 0;
}

/* One B_ref for both scalings (base_train's B_REF): with --ref-batch-size 256, 128 tokens per step for
 * 8 steps and --ref-tokens 2048, Muon's decay is 0.2 x sqrt(128 / 256) x (2048 / 1024) = 0.283 and
 * every rate x sqrt(128 / 256); without --ref-batch-size both use nanochat's 2^19 (decay 0.00625).
 * The reference batch is printed once, with where it came from. */
TEST(muon_one_ref_batch)
{
	char dir[512], cmd[4096], out[16384], want[256];
	const char *loom = test_loom_bin();
	static const struct {
		const char *flag, *b_ref;
		double B_ref;
	} runs[] = {
		{"--ref-batch-size 256", "B_ref: 256 tokens per step (--ref-batch-size), the reference batch of the learning "
		                         "rate's scaling and Muon's weight-decay scaling\n", 256.0},
		{"", "B_ref: 524288 tokens per step (nanochat's default, 2^19), the reference batch of the learning rate's "
		     "scaling and Muon's weight-decay scaling\n", 524288.0},
	};
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(test_make_token_data(dir, VOCAB, 6001));
	for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) {
		snprintf(cmd, sizeof cmd, "%s train --train-data '%s/train_*.bin' --model tiny --batch-size 2 --seq-len 64 "
		         "--optimizer muon --weight-decay 0.2 --steps 8 --peak-flops 1e10 --lr-scale sqrt --wd-scale epochs "
		         "--ref-tokens 2048 %s", loom, dir, runs[k].flag);
		RUN_OK(cmd, out, 120);
		double f = sqrt(128.0 / runs[k].B_ref), wd = 0.2 * f * (2048.0 / 1024.0);
		CHECK_NEAR(wd, k == 0 ? 0.28284271247461906 : 0.00625, 1e-15); /* the figures */
		snprintf(want, sizeof want, "weight decay %g -> 0", (double)(float)wd);
		CHECK_CONTAINS(out, want);
		snprintf(want, sizeof want, "lr: every group's rate x %g (sqrt scaling, 128 tokens per step vs a reference "
		         "of %.0f)", f, runs[k].B_ref);
		CHECK_CONTAINS(out, want);
		CHECK_CONTAINS(out, runs[k].b_ref);
		const char *b_ref = strstr(out, "B_ref: ");
		CHECK_MSG(b_ref && !strstr(b_ref + 1, "B_ref: "), "B_ref not printed exactly once:\n%s", out);
		snprintf(want, sizeof want, "weight decay: Muon's %g = 0.2 x sqrt(128 / B_ref) x (D_ref / D) = 0.2 x %.4g x "
		         "(2048 / 1024) (epochs scaling: D = 8 steps x 128 tokens, D_ref = --ref-tokens)", (double)(float)wd, f);
		CHECK_CONTAINS(out, want);
		CHECK_CONTAINS(out, "step 8/8 | loss ");
	}
	test_rmdir(dir);
	return 0;
}
