/* test_ddp_train.c: data-parallel training end to end, mostly through the CLI (`loom train --nproc N`)
 * on a tiny generated dataset: N ranks equal one rank with N times the accumulation (training and
 * validation losses), replicas stay bit-identical, resume is bit-identical, a killed rank stops the
 * job quickly and leaves a checkpoint that resumes, bad batch or LR-scaling settings are clear errors;
 * and the library path (loom/train.h with a communicator): rank 0's parameters win, a drifting
 * replica is named; on a mesh (loom/mesh.h) with tp = pp = 1 it trains bit-identically to the plain
 * communicator, and pipeline parallel or other strategies are LOOM_ENOTSUP.
 *
 * Every run uses a model of 28,000 parameters and 20 steps, so a whole run (process start,
 * collectives, checkpoints) takes a fraction of a second; each command runs under test_run_cmd's
 * timeout, the in-process ranks under test_spawn's. The 1-rank reference runs use one thread, as
 * every rank of `loom run` does. */
#include <dirent.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "loom/comm.h"
#include "loom/data.h"
#include "loom/gpt2.h"
#include "loom/train.h"
#include "test.h"

enum { VOCAB = 64, STEPS = 20, MAXSTEPS = 64 };

/* The model and data flags every run shares: B=2, T=16 (32 tokens per micro-batch). */
#define MODEL_FLAGS                                                                                  \
	"--n-layer 2 --n-head 2 --n-embd 32 --vocab-size 64 --n-positions 16 --batch-size 2 --seq-len 16 "   \
	"--lr 1e-2 --warmup 2 --min-lr-frac 0.1 --shuffle 1 --seed 7 --peak-flops 1e10"

static int make_data(const char *dir)
{
	return test_make_token_data(dir, VOCAB, 6001);
}

static int read_losses(const char *path, double *loss, char lines[][160], double *val)
{
	return test_read_losses(path, loss, MAXSTEPS, lines, val);
}

/* Run `cmd`, which must exit 0; its output goes to out. */
/* `world` ranks with accumulation 1 (and ranks x accum2) against 1 rank with world x accum2 at the
 * same total batch: per-step losses within 1e-5 relative, and the validation losses (5 windows
 * shared unevenly among the ranks) too; --check-replicas 1 verifies after every step that the
 * parameters of all ranks are bit-identical (the run fails otherwise). */
static int compare_worlds(int world, int accum2)
{
	char dir[512], cmd[4096], out[16384];
	double ref[MAXSTEPS] = {0}, got[MAXSTEPS] = {0}, vref[MAXSTEPS] = {0}, vgot[MAXSTEPS] = {0};
	const char *loom = test_loom_bin();
	int total = 32 * world * accum2;
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(make_data(dir));
	snprintf(cmd, sizeof cmd, "OMP_NUM_THREADS=1 %s train --train-data '%s/train_*.bin' " MODEL_FLAGS
	         " --steps %d --total-batch-size %d --threads 1 --log %s/one.jsonl --val-data '%s/train_*.bin' "
	         "--eval-every 10 --eval-batches 5", loom, dir, STEPS, total, dir, dir);
	RUN_OK(cmd, out, 60);
	char want[128];
	snprintf(want, sizeof want, "batch: B=2 T=16 accum=%d -> %d tokens per step", world * accum2, total);
	CHECK_CONTAINS(out, want);

	snprintf(cmd, sizeof cmd, "%s train --nproc %d --train-data '%s/train_*.bin' " MODEL_FLAGS
	         " --steps %d --total-batch-size %d --check-replicas 1 --bucket-mb 0.004 --log %s/many.jsonl "
	         "--val-data '%s/train_*.bin' --eval-every 10 --eval-batches 5", loom, world, dir, STEPS, total, dir, dir);
	RUN_OK(cmd, out, 60);
	snprintf(want, sizeof want, "[rank 0] batch: B=2 T=16 accum=%d ranks=%d -> %d tokens per step", accum2, world,
	         total);
	CHECK_CONTAINS(out, want);
	snprintf(want, sizeof want, "[rank 0] parameters: broadcast from rank 0 to %d ranks, checksum ", world);
	CHECK_CONTAINS(out, want);
	CHECK_CONTAINS(out, " verified on every rank\n");
	CHECK_CONTAINS(out, "[rank 0] step 20/20 | loss ");
	CHECK_CONTAINS(out, " | comm ");
	CHECK_MSG(!strstr(out, "[rank 1] step"), "rank 1 logged steps:\n%s", out); /* rank 0 logs alone */

	snprintf(cmd, sizeof cmd, "%s/one.jsonl", dir);
	CHECK_EQ(read_losses(cmd, ref, NULL, vref), STEPS);
	snprintf(cmd, sizeof cmd, "%s/many.jsonl", dir);
	CHECK_EQ(read_losses(cmd, got, NULL, vgot), STEPS);
	for (int s = 1; s <= STEPS; s++)
		CHECK_NEAR(got[s], ref[s], 1e-5 * ref[s]);
	for (int s = 10; s <= STEPS; s += 10) {
		CHECK(vref[s] > 0);
		CHECK_NEAR(vgot[s], vref[s], 1e-5 * vref[s]);
	}
	CHECK(ref[STEPS] < ref[1] - 0.1); /* it learned something: the comparison is not of constants */
	FILE *f = fopen(cmd, "r");
	char *line = NULL;
	size_t cap = 0;
	CHECK(f != NULL);
	while (getline(&line, &cap, f) > 0 && strncmp(line, "{\"step\"", 7) != 0) /* the first step record */
		;
	fclose(f);
	CHECK(line != NULL);
	CHECK_CONTAINS(line, ",\"comm_ms\":");
	CHECK_CONTAINS(line, ",\"exposed_comm_ms\":");
	free(line);
	test_rmdir(dir);
	return 0;
}

TEST(ddp_train_2ranks_equals_accum2)
{
	return compare_worlds(2, 1);
}

TEST(ddp_train_3ranks_equals_accum3)
{
	return compare_worlds(3, 1);
}

/* 2 ranks x accumulation 2 (no communication on the first micro-step) against 1 rank x 4. */
TEST(ddp_train_2ranks_accum2_equals_accum4)
{
	return compare_worlds(2, 2);
}

/* 2 ranks: checkpoint at step 10, stop, resume: steps 11-20 bit-identical to an uninterrupted run,
 * and the final parameters too. A different world size is refused. */
TEST(ddp_train_resume_bit_identical)
{
	char dir[512], cmd[4096], out[16384], path[1024], path2[1024];
	static char full[MAXSTEPS][160], resumed[MAXSTEPS][160];
	double loss[MAXSTEPS];
	const char *loom = test_loom_bin();
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(make_data(dir));
	/* uninterrupted, keeping its final model */
	snprintf(cmd, sizeof cmd, "%s train --nproc 2 --train-data '%s/train_*.bin' " MODEL_FLAGS
	         " --steps %d --grad-accum 2 --save-dir %s/ck --save-every 10 --log %s/full.jsonl", loom, dir, STEPS, dir,
	         dir);
	RUN_OK(cmd, out, 60);
	snprintf(cmd, sizeof cmd, "mv %s/ck/step_00000020 %s/full_final && cp %s/full.jsonl %s/r.jsonl", dir, dir, dir,
	         dir);
	RUN_OK(cmd, out, 10);
	snprintf(path, sizeof path, "%s/full.jsonl", dir);
	CHECK_EQ(read_losses(path, loss, full, NULL), STEPS);

	/* the same job resumed from its step-10 checkpoint, logging to a copy of the log */
	snprintf(cmd, sizeof cmd, "%s train --nproc 2 --train-data '%s/train_*.bin' " MODEL_FLAGS
	         " --steps %d --grad-accum 2 --save-dir %s/ck --save-every 10 --log %s/r.jsonl --resume", loom, dir, STEPS,
	         dir, dir);
	RUN_OK(cmd, out, 60);
	CHECK_CONTAINS(out, "[rank 0] resumed from ");
	CHECK_CONTAINS(out, "at step 10");
	CHECK_CONTAINS(out, "[rank 0] step 11/20 | loss ");
	CHECK_MSG(!strstr(out, "step 10/20"), "resumed run redid step 10:\n%s", out);
	snprintf(path, sizeof path, "%s/r.jsonl", dir);
	CHECK_EQ(read_losses(path, loss, resumed, NULL), STEPS);
	for (int s = 1; s <= STEPS; s++)
		CHECK_STREQ(resumed[s], full[s]);
	snprintf(cmd, sizeof cmd, "cmp %s/full_final/model.safetensors %s/ck/step_00000020/model.safetensors && "
	         "cmp %s/full_final/optim.safetensors %s/ck/step_00000020/optim.safetensors", dir, dir, dir, dir);
	RUN_OK(cmd, out, 10);
	/* the checkpoint holds the loader states of both ranks */
	snprintf(path2, sizeof path2, "%s/ck/step_00000010/state.json", dir);
	snprintf(cmd, sizeof cmd, "cat %s", path2);
	RUN_OK(cmd, out, 10);
	CHECK_CONTAINS(out, "\"loader.train.rank1.next_window\":");

	/* another world size at another number of tokens per step: a clear error, before any step (at the
	 * same number it reshards: tests/test_zero.c) */
	snprintf(cmd, sizeof cmd, "%s train --nproc 3 --train-data '%s/train_*.bin' " MODEL_FLAGS
	         " --steps 30 --grad-accum 2 --save-dir %s/ck --resume", loom, dir, dir);
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 60), 1);
	CHECK_CONTAINS(out, " data-parallel rank(s) x accumulation ");
	CHECK_CONTAINS(out, "this run 3 x 2: resume with the same --total-batch-size");
	snprintf(cmd, sizeof cmd, "OMP_NUM_THREADS=1 %s train --train-data '%s/train_*.bin' " MODEL_FLAGS
	         " --steps 30 --grad-accum 2 --save-dir %s/ck --resume", loom, dir, dir);
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 60), 1);
	CHECK_CONTAINS(out, "this run 1 x 2: resume with the same --total-batch-size");
	test_rmdir(dir);
	return 0;
}

/* pid of a child of `parent` whose environment holds the string `var` ("RANK=1"), or -1. */
static pid_t child_with_env(pid_t parent, const char *var)
{
	DIR *d = opendir("/proc");
	struct dirent *e;
	pid_t found = -1;
	if (!d)
		return -1;
	while (found < 0 && (e = readdir(d))) {
		char path[300], buf[8192];
		int ppid = -1;
		pid_t pid = (pid_t)atoi(e->d_name);
		FILE *f;
		size_t n;
		if (pid <= 0)
			continue;
		snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
		if (!(f = fopen(path, "r")))
			continue;
		n = fread(buf, 1, sizeof buf - 1, f);
		fclose(f);
		buf[n] = 0;
		char *rp = strrchr(buf, ')'); /* the command name may hold spaces */
		if (!rp || sscanf(rp + 1, " %*c %d", &ppid) != 1 || ppid != parent)
			continue;
		snprintf(path, sizeof path, "/proc/%d/environ", (int)pid);
		if (!(f = fopen(path, "r")))
			continue;
		n = fread(buf, 1, sizeof buf - 1, f);
		fclose(f);
		for (size_t i = 0; i < n; i += strlen(buf + i) + 1)
			if (!strcmp(buf + i, var))
				found = pid;
	}
	closedir(d);
	return found;
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* kill -9 of rank 1 in the middle of training: `loom run` exits non-zero within 5 s naming rank 1,
 * and the last complete checkpoint loads and training resumes from it. */
TEST(ddp_train_rank_killed)
{
	char dir[512], cmd[4096], out[16384], latest[64] = "";
	const char *loom = test_loom_bin();
	struct stat sb;
	int status = 0;
	pid_t job;
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(make_data(dir));
	snprintf(cmd, sizeof cmd, "exec %s train --nproc 2 --train-data '%s/train_*.bin' " MODEL_FLAGS
	         " --steps 100000 --schedule constant --save-dir %s/ck --save-every 5 > %s/out.txt 2>&1", loom, dir, dir,
	         dir);
	fflush(NULL);
	job = fork();
	CHECK(job >= 0);
	if (job == 0) {
		execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
		_exit(127);
	}
	/* wait for the checkpoint of step 10, then kill rank 1 (a child of loom run, which `exec` made
	 * the shell's own process) */
	char ck[700];
	snprintf(ck, sizeof ck, "%s/ck/step_00000010", dir);
	double t0 = now_s();
	pid_t victim = -1;
	while (now_s() - t0 < 60 && (stat(ck, &sb) != 0 || (victim = child_with_env(job, "RANK=1")) < 0) &&
	       waitpid(job, &status, WNOHANG) == 0)
		usleep(5000);
	if (victim < 0) {
		kill(job, SIGKILL);
		waitpid(job, &status, 0);
		TEST_FAIL_("no checkpoint of step 10 or no rank 1 within 60 s (status %d)", status);
	}
	CHECK_EQ(kill(victim, SIGKILL), 0);
	double tk = now_s();
	while (waitpid(job, &status, WNOHANG) == 0 && now_s() - tk < 30)
		usleep(2000);
	double waited = now_s() - tk;
	if (waited >= 30) {
		kill(job, SIGKILL);
		waitpid(job, &status, 0);
	}
	snprintf(cmd, sizeof cmd, "cat %s/out.txt", dir);
	RUN_OK(cmd, out, 10);
	CHECK_MSG(waited < 5.0, "loom run took %.2f s to exit after rank 1 was killed:\n%s", waited, out);
	CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) != 0, "status %d:\n%s", status, out);
	CHECK_CONTAINS(out, "loom run: rank 1 (pid ");
	CHECK_CONTAINS(out, ") was killed by signal 9 (SIGKILL)");

	/* the latest complete checkpoint loads: resume from it and run 3 more steps */
	snprintf(ck, sizeof ck, "%s/ck", dir);
	DIR *d = opendir(ck);
	struct dirent *e;
	CHECK(d != NULL);
	while ((e = readdir(d)))
		if (!strncmp(e->d_name, "step_", 5) && strlen(e->d_name) == 13 && strcmp(e->d_name, latest) > 0)
			snprintf(latest, sizeof latest, "%.*s", (int)sizeof latest - 1, e->d_name);
	closedir(d);
	long long last = atoll(latest + 5);
	CHECK(last >= 10);
	snprintf(cmd, sizeof cmd, "%s train --nproc 2 --train-data '%s/train_*.bin' " MODEL_FLAGS
	         " --steps %lld --schedule constant --save-dir %s/ck --save-every 5 --resume", loom, dir, last + 3, dir);
	RUN_OK(cmd, out, 60);
	char want[96];
	snprintf(want, sizeof want, "at step %lld", last);
	CHECK_CONTAINS(out, want);
	snprintf(want, sizeof want, "[rank 0] step %lld/%lld | loss ", last + 3, last + 3);
	CHECK_CONTAINS(out, want);
	test_rmdir(dir);
	return 0;
}

/* Settings errors: a total batch that does not divide lists valid values; --lr-scale prints the
 * effective LR and the log uses it; bad flag values are refused. */
TEST(ddp_train_settings)
{
	char dir[512], cmd[4096], out[16384];
	const char *loom = test_loom_bin();
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(make_data(dir));
	/* B x T x world = 64: 96 does not divide */
	snprintf(cmd, sizeof cmd, "%s train --nproc 2 --train-data '%s/train_*.bin' " MODEL_FLAGS
	         " --steps 2 --total-batch-size 96", loom, dir);
	CHECK(test_run_cmd(cmd, out, sizeof out, 60) != 0);
	CHECK_CONTAINS(out, "--total-batch-size 96 is not a multiple of B x T x ranks = 2 x 16 x 2 = 64");
	CHECK_CONTAINS(out, "valid values: 64, 128, 192");

	/* sqrt scaling from a reference batch of 32 tokens to 128: lr x 2 */
	snprintf(cmd, sizeof cmd, "%s train --nproc 2 --train-data '%s/train_*.bin' " MODEL_FLAGS
	         " --steps 3 --total-batch-size 128 --lr-scale sqrt --ref-batch-size 32 --log %s/lr.jsonl", loom, dir,
	         dir);
	RUN_OK(cmd, out, 60);
	CHECK_CONTAINS(out, "[rank 0] lr: peak 0.02 = 0.01 x 2 (sqrt scaling, 128 tokens per step vs a reference of 32)");
	snprintf(cmd, sizeof cmd, "grep '\"step\":2,' %s/lr.jsonl", dir);
	RUN_OK(cmd, out, 10);
	CHECK_CONTAINS(out, "\"lr\":0.0199999996"); /* the end of warmup: the peak, as a float */

	snprintf(cmd, sizeof cmd, "%s train --train-data '%s/train_*.bin' " MODEL_FLAGS " --steps 2 --lr-scale cubic",
	         loom, dir);
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 30), 2);
	CHECK_CONTAINS(out, "--lr-scale: 'cubic' is not one of none, sqrt, linear");
	snprintf(cmd, sizeof cmd, "%s train --train-data '%s/train_*.bin' " MODEL_FLAGS " --steps 2 --lr-scale linear",
	         loom, dir);
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 30), 2);
	CHECK_CONTAINS(out, "--lr-scale linear needs --ref-batch-size TOKENS");
	snprintf(cmd, sizeof cmd, "%s train --train-data '%s/train_*.bin' " MODEL_FLAGS " --steps 2 --bucket-mb 0",
	         loom, dir);
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 30), 2);
	CHECK_CONTAINS(out, "--bucket-mb");
	/* --nproc inside a job of another size */
	snprintf(cmd, sizeof cmd, "%s run --nproc-per-node 2 %s train --nproc 3 --train-data '%s/train_*.bin' "
	         MODEL_FLAGS " --steps 2", loom, loom, dir);
	CHECK(test_run_cmd(cmd, out, sizeof out, 30) != 0);
	/* (each rank says it of itself, and the launcher stops the job at the first exit: either may print) */
	CHECK_CONTAINS(out, "--nproc 3, but this process is already rank ");
	CHECK_CONTAINS(out, " of a job of 2");
	test_rmdir(dir);
	return 0;
}

/* The library path (loom/train.h with a communicator), ranks as forked processes: models initialized
 * differently on each rank become rank 0's at the first step; a replica that drifts is named by the
 * replica check on every rank, and loom_trainer_sync_params repairs it. */
static int trainer_rank(int rank, int nranks, void *arg)
{
	const char *dir = arg;
	const loom_gpt2_config_t mc = {.n_layer = 1, .n_head = 2, .n_embd = 16, .seq_len = 16, .vocab_size = VOCAB};
	char glob[600];
	loom_comm_t *comm;
	loom_gpt2_t *model;
	loom_trainer_t *tr;
	loom_step_metrics_t m;
	uint64_t sum, sums[4];
	snprintf(glob, sizeof glob, "%s/train_*.bin", dir);
	loom_train_config_t c = loom_train_defaults();
	c.train_data = glob;
	c.B = 2, c.T = 16, c.accum = 2;
	c.lr = (loom_lr_schedule_t){.peak_lr = 1e-2, .warmup = 0, .total_steps = 4, .kind = LOOM_SCHED_CONSTANT};
	CHECK_OK(loom_comm_init(&comm));
	CHECK_OK(loom_gpt2_create(&model, &mc, 2, 16));
	loom_gpt2_init(model, 100 + (uint64_t)rank); /* a different model on every rank */
	c.comm = comm;
	CHECK_OK(loom_trainer_create(&tr, &c, loom_gpt2_model(model)));
	CHECK_EQ(loom_trainer_rank(tr), rank);
	CHECK_EQ(loom_trainer_world(tr), nranks);
	CHECK_EQ(loom_trainer_tokens_per_step(tr), 2 * 16 * 2 * nranks);
	CHECK_ERR(loom_trainer_check_replicas(tr), LOOM_EMISMATCH);
	CHECK_OK(loom_trainer_step(tr, &m)); /* broadcasts rank 0's parameters first */
	CHECK_OK(loom_trainer_check_replicas(tr));
	CHECK(m.comm_ms > 0);
	CHECK_OK(loom_trainer_step(tr, &m));
	if (rank == 1)
		loom_gpt2_params(model)[3] *= 1.5f;
	CHECK_ERR(loom_trainer_check_replicas(tr), LOOM_EMISMATCH);
	CHECK_CONTAINS(loom_errmsg(), "after step 2: ddp: replica check: parameters of rank(s) 1 differ from rank 0's");
	CHECK_OK(loom_trainer_sync_params(tr, &sum));
	CHECK_OK(loom_allgather(comm, &sum, sums, 1, LOOM_INT64));
	for (int r = 0; r < nranks; r++)
		CHECK_EQ(sums[r], sums[0]);
	CHECK_OK(loom_trainer_step(tr, &m));
	CHECK_OK(loom_trainer_check_replicas(tr));
	loom_trainer_destroy(tr);
	loom_gpt2_destroy(model);
	loom_comm_destroy(comm);
	return 0;
}

TEST(ddp_trainer_replicas_3ranks)
{
	char dir[512];
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(make_data(dir));
	int rc = test_spawn(3, trainer_rank, dir, 60, NULL);
	test_rmdir(dir);
	return rc;
}

/* The trainer on a mesh (loom/mesh.h) of 2 ranks: dp 2 x tp 1 x pp 1 trains exactly as the plain
 * communicator does (same losses and parameters, bit for bit); tp 2 with a whole (unsharded) model
 * is LOOM_EINVAL; an unknown strategy or a ZeRO stage is LOOM_ENOTSUP. */
static int trainer_mesh_rank(int rank, int nranks, void *arg)
{
	const char *dir = arg;
	const loom_gpt2_config_t mc = {.n_layer = 1, .n_head = 2, .n_embd = 16, .seq_len = 16, .vocab_size = VOCAB};
	char glob[600], want[160];
	loom_comm_t *comm;
	loom_mesh_t *mesh, *tp2;
	loom_gpt2_t *ma, *mb;
	loom_trainer_t *ta, *tb;
	loom_step_metrics_t a, b;
	snprintf(glob, sizeof glob, "%s/train_*.bin", dir);
	loom_train_config_t c = loom_train_defaults();
	c.train_data = glob;
	c.B = 2, c.T = 16, c.accum = 2;
	c.lr = (loom_lr_schedule_t){.peak_lr = 1e-2, .warmup = 0, .total_steps = 3, .kind = LOOM_SCHED_CONSTANT};
	CHECK_OK(loom_comm_init(&comm));
	CHECK_OK(loom_mesh_create(&mesh, comm, 0, 1, 1));
	CHECK_OK(loom_mesh_create(&tp2, comm, 1, 2, 1));
	CHECK_OK(loom_gpt2_create(&ma, &mc, 2, 16));
	CHECK_OK(loom_gpt2_create(&mb, &mc, 2, 16));
	loom_gpt2_init(ma, 9), loom_gpt2_init(mb, 9);

	c.mesh = tp2; /* a whole model on a tensor-parallel mesh */
	CHECK_ERR(loom_trainer_create(&tb, &c, loom_gpt2_model(mb)), LOOM_EINVAL);
	snprintf(want, sizeof want, "trainer: rank %d: the mesh puts it at tensor-parallel rank %d of 2, but the model "
	         "was created as shard 0 of 1", rank, rank);
	CHECK_CONTAINS(loom_errmsg(), want);
	c.mesh = NULL, c.comm = comm, c.strategy = "zero3";
	CHECK_ERR(loom_trainer_create(&tb, &c, loom_gpt2_model(mb)), LOOM_ENOTSUP);
	CHECK_CONTAINS(loom_errmsg(), "parallel strategy 'zero3' does not exist (available: ddp)");
	c.strategy = "ddp", c.zero = 7;
	CHECK_ERR(loom_trainer_create(&tb, &c, loom_gpt2_model(mb)), LOOM_ENOTSUP);
	CHECK_CONTAINS(loom_errmsg(), "strategy 'ddp' with ZeRO stage 7 is not implemented");
	c.zero = 0;

	CHECK_OK(loom_trainer_create(&ta, &c, loom_gpt2_model(ma))); /* the plain communicator */
	c.comm = NULL, c.mesh = mesh;
	CHECK_OK(loom_trainer_create(&tb, &c, loom_gpt2_model(mb))); /* the same ranks as a mesh */
	CHECK_EQ(loom_trainer_rank(tb), rank);
	CHECK_EQ(loom_trainer_world(tb), nranks);
	CHECK_EQ(loom_trainer_tokens_per_step(tb), 2 * 16 * 2 * nranks);
	for (int s = 0; s < 3; s++) {
		CHECK_OK(loom_trainer_step(ta, &a));
		CHECK_OK(loom_trainer_step(tb, &b));
		CHECK_FEQ(a.loss, b.loss);
		CHECK_FEQ(a.grad_norm, b.grad_norm);
	}
	size_t n = loom_gpt2_num_params(&mc);
	CHECK_EQ(memcmp(loom_gpt2_params(ma), loom_gpt2_params(mb), n * sizeof(float)), 0);
	CHECK_OK(loom_trainer_check_replicas(tb));
	loom_trainer_destroy(tb);
	loom_trainer_destroy(ta);
	loom_gpt2_destroy(ma), loom_gpt2_destroy(mb);
	loom_mesh_destroy(tp2);
	loom_mesh_destroy(mesh);
	loom_comm_destroy(comm);
	return 0;
}

TEST(ddp_trainer_on_mesh_2ranks)
{
	char dir[512];
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(make_data(dir));
	int rc = test_spawn(2, trainer_mesh_rank, dir, 60, NULL);
	test_rmdir(dir);
	return rc;
}
