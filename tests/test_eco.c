/* test_eco.c: interop with the tools users come from: a training checkpoint loads as Hugging Face's
 * GPT-2 (config.json + model.safetensors, read by a PyTorch GPT-2 with HF's module names in
 * tests/ref/hf_gpt2_load.py, run with /usr/bin/python3 and Debian's torch) with logits within 1e-5 of
 * loom's forward, and the tokenizer travels with the checkpoint; the run summary and the JSONL
 * invariants; `loom run` as torchrun (.py, -m, --log-dir/--tee/--redirects, --max-restarts after a
 * killed rank: the restarted job resumes and ends with the parameters of an uninterrupted run). */
#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "loom/ckpt.h"
#include "loom/data.h"
#include "loom/gpt2.h"
#include "loom/train.h"
#include "loom/util.h"
#include "test.h"

static char *slurp(const char *path)
{
	FILE *f = fopen(path, "rb");
	char *buf;
	long n;
	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	rewind(f);
	buf = calloc((size_t)n + 1, 1);
	if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n)
		buf[0] = 0;
	fclose(f);
	return buf;
}

TEST(hf_checkpoint_loads)
{
	loom_gpt2_config_t mc = {.n_layer = 2, .n_head = 2, .n_embd = 32, .seq_len = 16, .vocab_size = 257};
	char dir[512], path[1000], ck[800], cmd[3000], out[4096];
	loom_gpt2_t *model = NULL;
	loom_trainer_t *tr = NULL;
	loom_tokenizer_t tok;
	uint16_t data[3000];
	uint32_t x = 777;
	enum { T = 13 };
	int ids[T];
	float *logits = NULL;

	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	for (int i = 0; i < 3000; i++) {
		x = x * 1664525u + 1013904223u;
		data[i] = (uint16_t)(i % 50 == 0 ? 256 : 'a' + (x >> 24) % 26);
	}
	snprintf(path, sizeof path, "%s/train_000000.bin", dir);
	CHECK_OK(loom_shard_write(path, data, 3000));
	snprintf(path, sizeof path, "%s/tokenizer.bin", dir);
	CHECK_OK(loom_tokenizer_init_bytes(&tok));
	CHECK_OK(loom_tokenizer_save(&tok, path));
	loom_tokenizer_free(&tok);
	/* BPE files beside the data (as `loom data prepare --tokenizer` leaves them) travel as they are */
	snprintf(path, sizeof path, "%s/vocab.json", dir);
	CHECK(test_write_file(path, "{\"a\": 0}\n", 9) == 0);
	snprintf(path, sizeof path, "%s/merges.txt", dir);
	CHECK(test_write_file(path, "#version: 0.2\n", 14) == 0);

	CHECK_OK(loom_gpt2_create(&model, &mc, 2, 12));
	loom_gpt2_init(model, 7);
	/* larger MLP-in, QKV and embedding weights: GELU's form and the attention scale matter, logits are O(1) */
	for (int t = 0; t < loom_gpt2_num_tensors(&mc); t++) {
		loom_tensor_info_t ti;
		loom_gpt2_tensor_info(&mc, t, &ti);
		float k = strstr(ti.name, "mlp.c_fc.weight") ? 20.0f : strstr(ti.name, "attn.c_attn.weight") ? 6.0f
		          : strcmp(ti.name, "wte.weight") == 0   ? 8.0f
		                                                 : 1.0f;
		for (size_t i = 0; i < ti.numel; i++)
			loom_gpt2_params(model)[ti.offset + i] *= k;
	}
	loom_train_config_t tc = loom_train_defaults();
	char train[600], tokpath[600], save[600];
	snprintf(train, sizeof train, "%s/train_000000.bin", dir);
	snprintf(tokpath, sizeof tokpath, "%s/tokenizer.bin", dir);
	snprintf(save, sizeof save, "%s/ckpt", dir);
	tc.train_data = train, tc.tokenizer = tokpath, tc.save_dir = save;
	tc.B = 2, tc.T = 12, tc.accum = 1;
	tc.lr.total_steps = 2, tc.lr.peak_lr = 1e-3, tc.lr.warmup = 0;
	CHECK_OK(loom_trainer_create(&tr, &tc, loom_gpt2_model(model)));
	CHECK_OK(loom_trainer_run(tr, NULL, NULL));
	loom_trainer_destroy(tr);
	loom_gpt2_destroy(model);
	model = NULL;

	snprintf(ck, sizeof ck, "%s/step_00000002", save);
	snprintf(path, sizeof path, "%s/config.json", ck);
	char *cfg = slurp(path);
	CHECK_MSG(cfg != NULL, "no %s", path);
	CHECK_CONTAINS(cfg, "\"architectures\": [\"GPT2LMHeadModel\"]");
	CHECK_CONTAINS(cfg, "\"vocab_size\": 257,");
	CHECK_CONTAINS(cfg, "\"bos_token_id\": 256,");
	CHECK_CONTAINS(cfg, "\"eos_token_id\": 256,");
	CHECK_CONTAINS(cfg, "\"n_positions\": 16,");
	free(cfg);
	const char *copied[2][2] = {{"vocab.json", "{\"a\": 0}\n"}, {"merges.txt", "#version: 0.2\n"}};
	for (int i = 0; i < 2; i++) {
		snprintf(path, sizeof path, "%s/%s", ck, copied[i][0]);
		char *s = slurp(path);
		CHECK_MSG(s != NULL, "the tokenizer's %s did not travel with the checkpoint", copied[i][0]);
		CHECK_STREQ(s, copied[i][1]);
		free(s);
	}
	CHECK_OK(loom_ckpt_verify(ck)); /* the MANIFEST covers them */

	/* loom's forward on the checkpoint's parameters */
	loom_gpt2_config_t lc;
	float *params = NULL, loss;
	snprintf(path, sizeof path, "%s/model.safetensors", ck);
	CHECK_OK(loom_model_load_alloc(path, 0, &lc, &params));
	CHECK_EQ(lc.n_head, 2);
	CHECK_OK(loom_gpt2_create(&model, &lc, 1, T));
	memcpy(loom_gpt2_params(model), params, loom_gpt2_num_params(&lc) * sizeof(float));
	free(params);
	for (int t = 0; t < T; t++)
		ids[t] = t == 0 ? 256 : (t * 37 + 11) % 257;
	snprintf(path, sizeof path, "%s/ids.bin", dir);
	CHECK(test_write_file(path, ids, sizeof ids) == 0);

	snprintf(cmd, sizeof cmd, "OMP_NUM_THREADS=1 /usr/bin/python3 tests/ref/hf_gpt2_load.py %s %s/ids.bin %s/hf.bin",
	         ck, dir, dir);
	int st = test_run_cmd(cmd, out, sizeof out, 120);
	CHECK_MSG(st == 0, "'%s' exited with %d (run from the source root; needs python3-torch):\n%s", cmd, st, out);
	CHECK_CONTAINS(out, "bos 256 eos 256 vocab 257");
	snprintf(path, sizeof path, "%s/hf.bin", dir);
	FILE *f = fopen(path, "rb");
	CHECK(f != NULL);
	logits = malloc((size_t)T * 257 * sizeof *logits);
	CHECK(logits != NULL);
	CHECK_EQ(fread(logits, sizeof *logits, (size_t)T * 257, f), (size_t)T * 257);
	fclose(f);
	double worst = 0.0, mx = 0.0;
	for (int t = 0; t < T; t++) {
		/* without targets loom computes the last position's logits: position t from the prefix 0..t */
		CHECK_OK(loom_gpt2_forward(model, ids, NULL, 1, t + 1, &loss));
		const float *mine = loom_gpt2_logits(model) - (size_t)t * 257;
		for (int v = 0; v < 257; v++) {
			double d = fabs((double)mine[(size_t)t * 257 + v] - logits[(size_t)t * 257 + v]);
			worst = fmax(worst, d), mx = fmax(mx, fabs(logits[(size_t)t * 257 + v]));
			CHECK_MSG(d <= 1e-5, "logit [%d, %d]: loom %.9g, HF layout %.9g", t, v, mine[(size_t)t * 257 + v],
			          logits[(size_t)t * 257 + v]);
		}
	}
	CHECK_MSG(mx > 0.5, "logits up to %g only: the comparison would prove little", mx);
	fprintf(stderr, "  HF layout: worst logit difference %.2g (logits up to %.2g)\n", worst, mx);
	free(logits);
	loom_gpt2_destroy(model);
	test_rmdir(dir);
	return 0;
}

/* A 2-rank `loom train` run: the JSONL log starts with the config record and ends with the summary;
 * every step line has exposed_comm_ms <= comm_ms and wait_ms >= 0; a printed line's ms is the mean
 * of its interval's steps; step 1 has no ETA; rank 0 prints the summary with the resume command. */
TEST(train_summary_and_jsonl)
{
	enum { STEPS = 9, EVERY = 3 };
	char dir[512], cmd[3000], out[16384], path[700], line[4096];
	const char *loom = test_loom_bin();
	double dt[STEPS + 1] = {0};
	int steps = 0, summary = 0;
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	snprintf(cmd, sizeof cmd, "for i in $(seq 300); do echo \"line $i of a corpus $((i * 7))\"; done > %s/a.txt && "
	         "%s data prepare --input %s/a.txt --out %s/d", dir, loom, dir, dir);
	int st = test_run_cmd(cmd, out, sizeof out, 30);
	CHECK_MSG(st == 0, "%s: %s", cmd, out);
	snprintf(cmd, sizeof cmd, "%s train --nproc 2 --train-data '%s/d/train_*.bin' --val-data '%s/d/val_*.bin' "
	         "--n-layer 1 --n-embd 32 --n-head 2 --batch-size 2 --seq-len 32 --steps %d --print-every %d "
	         "--eval-every 4 --eval-batches 2 --save-dir %s/ck --threads 1 --peak-flops 1e10 --log %s/r.jsonl",
	         loom, dir, dir, STEPS, EVERY, dir, dir);
	st = test_run_cmd(cmd, out, sizeof out, 60);
	CHECK_MSG(st == 0, "%s exited %d: %s", cmd, st, out);

	snprintf(path, sizeof path, "%s/r.jsonl", dir);
	FILE *f = fopen(path, "r");
	CHECK(f != NULL);
	CHECK(fgets(line, sizeof line, f) != NULL);
	CHECK_MSG(strstr(line, "{\"config\":{\"loom_version\":\"") == line, "first line: %s", line);
	CHECK_CONTAINS(line, "\"git\":\"");
	CHECK_CONTAINS(line, "\"host\":\"");
	CHECK_CONTAINS(line, "\"threads\":1,\"world\":2,");
	CHECK_CONTAINS(line, "\"steps\":9,");
	CHECK_CONTAINS(line, "\"n_layer\":1,");
	while (fgets(line, sizeof line, f)) {
		long long step;
		if (sscanf(line, "{\"step\":%lld,", &step) == 1) {
			double comm, exposed, wait;
			const char *c = strstr(line, "\"comm_ms\":"), *e = strstr(line, "\"exposed_comm_ms\":"),
			           *w = strstr(line, "\"wait_ms\":"), *d = strstr(line, "\"dt_ms\":");
			CHECK_MSG(c && e && w && d, "fields missing: %s", line);
			comm = atof(c + 10), exposed = atof(e + 18), wait = atof(w + 10);
			CHECK_MSG(exposed <= comm && exposed >= 0 && wait >= 0, "step %lld: comm %g, exposed %g, wait %g", step,
			          comm, exposed, wait);
			CHECK(step == ++steps);
			dt[step] = atof(d + 8);
		} else {
			CHECK_MSG(strstr(line, "{\"summary\":{\"first_step\":1,\"last_step\":9,\"steps\":9,\"tokens\":1152,") == line,
			          "not a step line nor the summary: %s", line);
			CHECK_CONTAINS(line, "\"best_val_step\":");
			CHECK_CONTAINS(line, "\"exposed_comm_ms\":");
			CHECK_CONTAINS(line, "/ck/step_00000009\"}}");
			summary++;
		}
	}
	fclose(f);
	CHECK_EQ(steps, STEPS);
	CHECK_EQ(summary, 1);

	/* step 1: no ETA yet; step 6 prints the mean time of steps 5-6 (step 4, an evaluation, printed) */
	CHECK_CONTAINS(out, "[rank 0] step 1/9 | ");
	CHECK_CONTAINS(out, " | ETA -\n");
	const char *l6 = strstr(out, "[rank 0] step 6/9 | ");
	CHECK(l6 != NULL);
	const char *ms = strstr(l6, " ms | ");
	CHECK(ms != NULL);
	while (ms > l6 && ms[-1] != '|')
		ms--;
	double printed = atof(ms), mean = (dt[5] + dt[6]) / 2;
	CHECK_MSG(fabs(printed - mean) <= 0.051 + 1e-3 * mean, "step 6 line says %.3f ms, the mean of steps 5-6 is %.3f",
	          printed, mean);
	CHECK_CONTAINS(out, ", exposed ");
	CHECK_CONTAINS(out, ", wait ");
	CHECK_CONTAINS(out, "[rank 0] summary: steps 1-9 (9) in ");
	CHECK_CONTAINS(out, "; best val loss ");
	CHECK_CONTAINS(out, "[rank 0] summary: checkpoint ");
	CHECK_CONTAINS(out, " run --nproc-per-node 2 ");
	CHECK_CONTAINS(out, " --resume\n");
	CHECK_MSG(!strstr(out, "[rank 1] summary"), "rank 1 printed a summary: %s", out);
	test_rmdir(dir);
	return 0;
}

/* `loom run` runs a .py with Python, -m a module, and --log-dir keeps each rank's streams in files
 * (--tee: also on the console; --redirects: only in the files). */
TEST(run_python_and_log_dir)
{
	char dir[512], cmd[3000], out[8192], path[800];
	const char *loom = test_loom_bin();
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	snprintf(path, sizeof path, "%s/t.py", dir);
	const char *py = "import os, sys\nprint('py rank', os.environ['RANK'], sys.argv[1:])\n"
	                 "print('err', os.environ['RANK'], file=sys.stderr)\n";
	CHECK(test_write_file(path, py, strlen(py)) == 0);
	snprintf(path, sizeof path, "%s/eco_mod.py", dir);
	const char *mod = "import os, sys\nprint('module rank', os.environ['RANK'], sys.argv[1:])\n";
	CHECK(test_write_file(path, mod, strlen(mod)) == 0);

	snprintf(cmd, sizeof cmd, "PYTHON=/usr/bin/python3 %s run --nproc-per-node 2 %s/t.py a 'b c'", loom, dir);
	int st = test_run_cmd(cmd, out, sizeof out, 30);
	CHECK_MSG(st == 0, "%s: exit %d: %s", cmd, st, out);
	CHECK_CONTAINS(out, "[rank 0] py rank 0 ['a', 'b c']\n");
	CHECK_CONTAINS(out, "[rank 1] py rank 1 ['a', 'b c']\n");
	CHECK_CONTAINS(out, "[rank 1] err 1\n");

	snprintf(cmd, sizeof cmd, "PYTHONPATH=%s %s run --nproc-per-node 2 -m eco_mod x", dir, loom);
	st = test_run_cmd(cmd, out, sizeof out, 30);
	CHECK_MSG(st == 0, "%s: exit %d: %s", cmd, st, out);
	CHECK_CONTAINS(out, "[rank 0] module rank 0 ['x']\n");
	CHECK_CONTAINS(out, "[rank 1] module rank 1 ['x']\n");

	/* --no-python: t.py is executed as it is (it is not executable: 126) */
	snprintf(cmd, sizeof cmd, "%s run --no-python %s/t.py", loom, dir);
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 30), 126);
	CHECK_CONTAINS(out, "cannot execute ");

	snprintf(cmd, sizeof cmd, "%s run --nproc-per-node 2 --log-dir %s/logs --tee 3 %s/t.py q", loom, dir, dir);
	st = test_run_cmd(cmd, out, sizeof out, 30);
	CHECK_MSG(st == 0, "%s: exit %d: %s", cmd, st, out);
	CHECK_CONTAINS(out, "[rank 1] py rank 1 ['q']\n");
	for (int r = 0; r < 2; r++) {
		char want[64], *got;
		snprintf(path, sizeof path, "%s/logs/attempt_0/%d/stdout.log", dir, r);
		got = slurp(path);
		CHECK_MSG(got != NULL, "no %s", path);
		snprintf(want, sizeof want, "py rank %d ['q']\n", r);
		CHECK_STREQ(got, want);
		free(got);
		snprintf(path, sizeof path, "%s/logs/attempt_0/%d/stderr.log", dir, r);
		got = slurp(path);
		CHECK_MSG(got != NULL, "no %s", path);
		snprintf(want, sizeof want, "err %d\n", r);
		CHECK_STREQ(got, want);
		free(got);
	}
	/* --redirects 1: stdout only in the files, stderr on the console too */
	snprintf(cmd, sizeof cmd, "%s run --nproc-per-node 2 --log-dir %s/logs2 --redirects 1 %s/t.py z", loom, dir, dir);
	st = test_run_cmd(cmd, out, sizeof out, 30);
	CHECK_MSG(st == 0, "%s: exit %d: %s", cmd, st, out);
	CHECK_MSG(!strstr(out, "py rank"), "stdout reached the console: %s", out);
	CHECK_CONTAINS(out, "[rank 0] err 0\n");
	snprintf(path, sizeof path, "%s/logs2/attempt_0/1/stdout.log", dir);
	char *got = slurp(path);
	CHECK_MSG(got != NULL, "no %s", path);
	CHECK_STREQ(got, "py rank 1 ['z']\n");
	free(got);
	snprintf(cmd, sizeof cmd, "%s run --tee 3 %s/t.py", loom, dir);
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 30), 2);
	CHECK_CONTAINS(out, "--tee and --redirects need --log-dir");
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
		char *rp = strrchr(buf, ')');
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

/* `loom run --max-restarts 2 loom train ... --resume`: rank 1 is killed (SIGKILL) after the step-10
 * checkpoint; loom run restarts both ranks with TORCHELASTIC_RESTART_COUNT=1, they resume from the
 * last checkpoint, and the final parameters and optimizer state are bit-identical to those of the
 * same job never interrupted. */
TEST(run_max_restarts_resumes)
{
	enum { STEPS = 300 };
	char dir[512], cmd[4000], out[16384], ck[800], train[2000];
	const char *loom = test_loom_bin();
	struct stat sb;
	int status = 0;
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	snprintf(cmd, sizeof cmd, "for i in $(seq 400); do echo \"line $i of a corpus $((i * 7))\"; done > %s/a.txt && "
	         "%s data prepare --input %s/a.txt --out %s/d", dir, loom, dir, dir);
	int st = test_run_cmd(cmd, out, sizeof out, 30);
	CHECK_MSG(st == 0, "%s: %s", cmd, out);
	snprintf(train, sizeof train, "%s train --train-data '%s/d/train_*.bin' --n-layer 1 --n-embd 32 --n-head 2 "
	         "--batch-size 2 --seq-len 32 --steps %d --lr 3e-3 --save-every 10 --keep-checkpoints 2 --threads 1 "
	         "--peak-flops 1e10 --print-every 100 --resume", loom, dir, STEPS);

	/* never interrupted */
	snprintf(cmd, sizeof cmd, "%s run --nproc-per-node 2 %s --save-dir %s/full", loom, train, dir);
	st = test_run_cmd(cmd, out, sizeof out, 120);
	CHECK_MSG(st == 0, "%s: exit %d: %s", cmd, st, out);

	/* rank 1 killed in the first attempt */
	snprintf(cmd, sizeof cmd, "exec %s run --nproc-per-node 2 --max-restarts 2 %s --save-dir %s/ck > %s/out.txt 2>&1",
	         loom, train, dir, dir);
	fflush(NULL);
	pid_t job = fork();
	CHECK(job >= 0);
	if (job == 0) {
		execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
		_exit(127);
	}
	snprintf(ck, sizeof ck, "%s/ck/step_00000010", dir);
	double t0 = now_s();
	pid_t victim = -1;
	while (now_s() - t0 < 60 && (stat(ck, &sb) != 0 || (victim = child_with_env(job, "RANK=1")) < 0) &&
	       waitpid(job, &status, WNOHANG) == 0)
		usleep(2000);
	if (victim < 0) {
		kill(job, SIGKILL);
		waitpid(job, &status, 0);
		TEST_FAIL_("no checkpoint of step 10 or no rank 1 within 60 s (status %d)", status);
	}
	CHECK_EQ(kill(victim, SIGKILL), 0);
	double tk = now_s();
	while (waitpid(job, &status, WNOHANG) == 0 && now_s() - tk < 120)
		usleep(5000);
	if (now_s() - tk >= 120) {
		kill(job, SIGKILL);
		waitpid(job, &status, 0);
	}
	snprintf(cmd, sizeof cmd, "cat %s/out.txt", dir);
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 10), 0);
	CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status %d:\n%s", status, out);
	CHECK_CONTAINS(out, ") was killed by signal 9 (SIGKILL)); restarting all 2 ranks (restart 1 of 2)");
	CHECK_CONTAINS(out, "[rank 0] resumed from ");
	char want[64];
	snprintf(want, sizeof want, "[rank 0] step %d/%d | loss ", STEPS, STEPS);
	CHECK_CONTAINS(out, want);
	snprintf(cmd, sizeof cmd, "cmp %s/full/step_%08d/model.safetensors %s/ck/step_%08d/model.safetensors && "
	         "cmp %s/full/step_%08d/optim.safetensors %s/ck/step_%08d/optim.safetensors", dir, STEPS, dir, STEPS, dir,
	         STEPS, dir, STEPS);
	st = test_run_cmd(cmd, out, sizeof out, 10);
	CHECK_MSG(st == 0, "the restarted job ended with other parameters than the uninterrupted one: %s", out);
	test_rmdir(dir);
	return 0;
}

/* `loom plot` draws a sample log: an SVG of the requested size holding each run's curves (one point
 * per step in the loss line, the validation points), and with gnuplot installed a PNG of that size. */
TEST(plot_writes_svg_and_png)
{
	char dir[512], cmd[2000], out[4096], path[700];
	const char *loom = test_loom_bin();
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	snprintf(path, sizeof path, "%s/run.jsonl", dir);
	FILE *f = fopen(path, "w");
	CHECK(f != NULL);
	fprintf(f, "{\"config\":{\"loom_version\":\"0.4.0\",\"model\":{\"n_layer\":4,\"n_embd\":128},\"tokens_per_step\":1024,"
	        "\"lr\":0.003,\"world\":2}}\n");
	for (int s = 1; s <= 40; s++)
		fprintf(f, "{\"step\":%d,\"loss\":%.6f,\"lr\":0.001,\"dt_ms\":10,\"tokens_per_s\":%d,\"tokens\":%d%s}\n", s,
		        5.5 * exp(-s / 20.0) + 1.0, 1000 + s, s * 1024, s % 10 == 0 ? ",\"val_loss\":2.5" : "");
	fprintf(f, "{\"summary\":{\"steps\":40}}\n");
	fclose(f);
	snprintf(cmd, sizeof cmd, "%s plot %s/run.jsonl -o %s/p.svg --width 900 --height 400 --title 'a <b>'", loom, dir,
	         dir);
	int st = test_run_cmd(cmd, out, sizeof out, 30);
	CHECK_MSG(st == 0, "%s: exit %d: %s", cmd, st, out);
	CHECK_CONTAINS(out, "wrote ");
	CHECK_CONTAINS(out, "/p.svg (900 x 400, SVG): 1 run, 40 steps\n");
	snprintf(path, sizeof path, "%s/p.svg", dir);
	char *svg = slurp(path);
	CHECK(svg != NULL);
	CHECK(strncmp(svg, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"900\" height=\"400\"", 63) == 0);
	CHECK_CONTAINS(svg, ">a &lt;b&gt;</text>");
	CHECK_CONTAINS(svg, "run (L4 C128, 1024 tok/step, lr 0.003, ranks 2)");
	CHECK_CONTAINS(svg, "</svg>\n");
	/* the per-step loss line has 40 points; 4 validation circles */
	const char *pl = strstr(svg, "<polyline");
	CHECK(pl != NULL);
	int pts = 0;
	for (const char *c = strstr(pl, "points=\""); *c && *c != '/'; c++)
		pts += *c == ',';
	CHECK_EQ(pts, 40);
	int circles = 0;
	for (const char *c = svg; (c = strstr(c, "<circle")); c++)
		circles++;
	CHECK_EQ(circles, 4 + 1); /* and the legend's validation swatch */
	free(svg);

	snprintf(cmd, sizeof cmd, "%s plot %s/run.jsonl -o %s/p.txt", loom, dir, dir);
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 30), 2);
	CHECK_CONTAINS(out, "must end in .svg, .png or .gp");

	if (test_run_cmd("command -v gnuplot", out, sizeof out, 10) != 0) {
		fprintf(stderr, "  no gnuplot (scripts/deps.sh installs gnuplot-nox): the PNG is not checked\n");
	} else {
		snprintf(cmd, sizeof cmd, "%s plot %s/run.jsonl %s/run.jsonl -o %s/p.png --width 800 --height 300", loom, dir,
		         dir, dir);
		st = test_run_cmd(cmd, out, sizeof out, 60);
		CHECK_MSG(st == 0, "%s: exit %d: %s", cmd, st, out);
		unsigned char h[24];
		snprintf(path, sizeof path, "%s/p.png", dir);
		f = fopen(path, "rb");
		CHECK(f != NULL);
		CHECK_EQ(fread(h, 1, 24, f), (size_t)24);
		fseek(f, 0, SEEK_END);
		long size = ftell(f);
		fclose(f);
		CHECK(memcmp(h, "\x89PNG\r\n\x1a\n", 8) == 0 && memcmp(h + 12, "IHDR", 4) == 0);
		CHECK_EQ((h[16] << 24 | h[17] << 16 | h[18] << 8 | h[19]), 800); /* IHDR width, height */
		CHECK_EQ((h[20] << 24 | h[21] << 16 | h[22] << 8 | h[23]), 300);
		CHECK_MSG(size > 5000, "%s is only %ld bytes", path, size);
	}
	test_rmdir(dir);
	return 0;
}

/* Issue 34: the demo's picture hid 5 of its 6 validation points under the training curve's noise
 * (drawn in the run's color before the next curves). Validation now has a style of its own in both
 * formats: black dashes with a point at every evaluation (filled with the run's color), drawn after
 * every run's training curves; the per-step loss is light. Checked in the gnuplot script that -o .gp
 * writes (the one a PNG is drawn from) and in the SVG. */
TEST(plot_validation_style)
{
	char dir[512], cmd[2000], out[4096], path[700];
	const char *loom = test_loom_bin();
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	for (int k = 0; k < 2; k++) {
		snprintf(path, sizeof path, "%s/%s.jsonl", dir, k ? "b" : "a");
		FILE *f = fopen(path, "w");
		CHECK(f != NULL);
		fprintf(f, "{\"config\":{\"model\":{\"n_layer\":2,\"n_embd\":64},\"tokens_per_step\":512,\"lr\":0.001}}\n");
		for (int s = 1; s <= 60; s++) /* noisy training loss; validation every 10 steps */
			fprintf(f, "{\"step\":%d,\"loss\":%.3f,\"tokens_per_s\":%d%s%.2f}\n", s, 3.0 + k + (s % 2 ? 0.5 : -0.5), 1000 + s,
			        s % 10 == 0 ? ",\"val_loss\":" : ",\"x\":", 3.0 + k + s / 100.0);
		fclose(f);
	}
	snprintf(cmd, sizeof cmd, "%s plot %s/a.jsonl %s/b.jsonl -o %s/p.gp", loom, dir, dir, dir);
	int st = test_run_cmd(cmd, out, sizeof out, 30);
	CHECK_MSG(st == 0, "%s: exit %d: %s", cmd, st, out);
	CHECK_CONTAINS(out, "/p.gp (1200 x 450, gnuplot script): 2 runs, 120 steps\n");
	snprintf(path, sizeof path, "%s/p.gp", dir);
	char *gp = slurp(path);
	CHECK(gp != NULL);
	snprintf(path, sizeof path, "set output '%s/p.png'\n", dir);
	CHECK_CONTAINS(gp, path);
	/* every evaluation is a point of its run's validation block, exactly */
	CHECK_CONTAINS(gp, "$val0 << EOD\n10 3.1\n20 3.2\n30 3.3\n40 3.4\n50 3.5\n60 3.6\nEOD\n");
	CHECK_CONTAINS(gp, "$val1 << EOD\n10 4.1\n20 4.2\n30 4.3\n40 4.4\n50 4.5\n60 4.6\nEOD\n");
	/* the loss panel: both runs' training curves (the per-step loss 70% transparent), then validation in
	 * black with a point (pt 7) at every evaluation, filled with the run's color */
	const char *loss = strstr(gp, "set ylabel 'loss'\nplot ");
	CHECK(loss != NULL);
	const char *want[] = {
		"$run0 u 1:2 w l lc rgb '#B31f77b4' lw 1 notitle",
		"$run0 every ::0::59 u 1:3 w l lc rgb '#1f77b4' lw 2 title 'a (L2 C64, 512 tok/step, lr 0.001)'",
		"$run1 u 1:2 w l lc rgb '#B3d62728' lw 1 notitle",
		"$run1 every ::0::59 u 1:3 w l lc rgb '#d62728' lw 2 title 'b (L2 C64, 512 tok/step, lr 0.001)'",
		"$val0 u 1:2 w lp lc rgb '#000000' lw 1.5 dt 2 pt 7 ps 1.3 title 'a val loss'",
		"$val0 u 1:2 w p lc rgb '#1f77b4' pt 7 ps 0.7 notitle",
		"$val1 u 1:2 w lp lc rgb '#000000' lw 1.5 dt 2 pt 7 ps 1.3 title 'b val loss'",
		"$val1 u 1:2 w p lc rgb '#d62728' pt 7 ps 0.7 notitle",
		"\nset ylabel 'tokens/s'",
	};
	const char *at = loss;
	for (size_t k = 0; k < sizeof want / sizeof *want; k++) { /* in this order */
		const char *next = strstr(at, want[k]);
		CHECK_MSG(next != NULL, "not found after the previous element: %s\nscript:\n%s", want[k], loss);
		at = next + strlen(want[k]);
	}
	CHECK_MSG(!strstr(gp, "val0 u 1:2 w lp lc rgb '#1f77b4'"), "validation in the run's color:\n%s", loss);
	free(gp);
	if (test_run_cmd("command -v gnuplot", out, sizeof out, 10) == 0) { /* the script runs as it is */
		snprintf(cmd, sizeof cmd, "cd %s && gnuplot p.gp && test -s p.png", dir);
		st = test_run_cmd(cmd, out, sizeof out, 60);
		CHECK_MSG(st == 0, "%s: exit %d: %s", cmd, st, out);
		CHECK_MSG(!strstr(out, "arning"), "gnuplot warned: %s", out);
	}

	/* the SVG: validation after every training curve, black dashes, circles filled with the run's color */
	snprintf(cmd, sizeof cmd, "%s plot %s/a.jsonl %s/b.jsonl -o %s/p.svg", loom, dir, dir, dir);
	st = test_run_cmd(cmd, out, sizeof out, 30);
	CHECK_MSG(st == 0, "%s: exit %d: %s", cmd, st, out);
	snprintf(path, sizeof path, "%s/p.svg", dir);
	char *svg = slurp(path);
	CHECK(svg != NULL);
	const char *last_train = NULL, *first_val = strstr(svg, "stroke=\"#000000\" stroke-width=\"1.5\" "
	                                                       "stroke-dasharray=\"6,4\"");
	for (const char *c = svg; (c = strstr(c, "<polyline fill=\"none\" stroke=\"#d62728\"")); c++)
		last_train = c;
	CHECK(first_val != NULL && last_train != NULL);
	CHECK_MSG(first_val > last_train, "validation drawn before run b's training curves");
	int a = 0, b = 0;
	const char *fa = "r=\"4\" fill=\"#1f77b4\" stroke=\"#000000\"", *fb = "r=\"4\" fill=\"#d62728\" stroke=\"#000000\"";
	for (const char *c = svg; (c = strstr(c, "<circle ")); c++)
		a += strncmp(strstr(c, "r="), fa, strlen(fa)) == 0, b += strncmp(strstr(c, "r="), fb, strlen(fb)) == 0;
	CHECK_EQ(a, 6 + 1); /* every evaluation, and the legend's swatch */
	CHECK_EQ(b, 6 + 1);
	free(svg);
	test_rmdir(dir);
	return 0;
}

/* `loom bench comm` takes nccl-tests' -b -e -f -n -w and ends with its "Avg bus bandwidth" line: the
 * mean of the busbw column. */
TEST(bench_comm_nccl_flags)
{
	char cmd[1000], out[8192];
	snprintf(cmd, sizeof cmd, "%s run --nproc-per-node 2 --ranks 0 %s bench comm -b 8 -e 2K -f 4 -n 3 -w 1",
	         test_loom_bin(), test_loom_bin());
	int st = test_run_cmd(cmd, out, sizeof out, 60);
	CHECK_MSG(st == 0, "%s: exit %d: %s", cmd, st, out);
	double sum = 0;
	int rows = 0;
	const size_t want[] = {8, 32, 128, 512, 2048};
	for (const char *l = out; (l = strstr(l, "[rank 0] ")); l++) {
		size_t bytes, count;
		char type[16], redop[16], algo[16];
		int root;
		double t, alg, bus;
		if (sscanf(l + 9, "%zu %zu %15s %15s %d %15s %lf %lf %lf", &bytes, &count, type, redop, &root, algo, &t, &alg,
		           &bus) == 9) {
			CHECK(rows < 5);
			CHECK_EQ(bytes, want[rows]);
			sum += bus, rows++;
		}
	}
	CHECK_EQ(rows, 5);
	CHECK_CONTAINS(out, "[rank 0] # Out of bounds values : 0 OK\n");
	const char *avg = strstr(out, "# Avg bus bandwidth    : ");
	CHECK(avg != NULL);
	CHECK_NEAR(atof(avg + 25), sum / rows, 0.0006); /* the column is printed with 3 decimals */
	return 0;
}

/* Every flag a command's --help lists appears in its doc page. */
static int flags_documented(const char *help_cmd, const char *doc)
{
	char cmd[1000], out[16384];
	snprintf(cmd, sizeof cmd, "%s %s", test_loom_bin(), help_cmd);
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 30), 0);
	char *text = slurp(doc);
	CHECK_MSG(text != NULL, "no %s (run from the source root)", doc);
	int missing = 0;
	for (const char *p = out; (p = strstr(p, "--")); p += 2) {
		char flag[64];
		size_t n = 2;
		while (n < sizeof flag - 1 && ((p[n] >= 'a' && p[n] <= 'z') || (p[n] >= '0' && p[n] <= '9') || p[n] == '-' || p[n] == '_'))
			n++;
		if (n == 2 || p[n - 1] == '-' || (p > out && p[-1] != ' ' && p[-1] != '[' && p[-1] != '(' && p[-1] != '`'))
			continue;
		snprintf(flag, sizeof flag, "%.*s", (int)n, p);
		int found = 0;
		for (const char *q = text; !found && (q = strstr(q, flag)); q++) {
			char c = q[n];
			found = !((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_');
		}
		if (!found) {
			fprintf(stderr, "  %s: %s is not in %s\n", help_cmd, flag, doc);
			missing++;
		}
	}
	free(text);
	CHECK_MSG(missing == 0, "%d flag(s) of `loom %s` are not documented in %s", missing, help_cmd, doc);
	return 0;
}

/* The papercuts: --version, the full command list, every flag in the docs, and messages that say
 * what a file is and what a glob matched. */
TEST(cli_papercuts)
{
	char dir[512], cmd[4000], out[8192];
	const char *loom = test_loom_bin();
	snprintf(cmd, sizeof cmd, "%s --version", loom);
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 10), 0);
	CHECK_MSG(strstr(out, "loom " LOOM_VERSION " (git ") == out, "%s", out);
	snprintf(cmd, sizeof cmd, "%s --help", loom);
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 10), 0);
	const char *cmds[] = {"run", "train", "sample", "data", "tokenizer", "bench", "convert", "info", "plot"};
	for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++) {
		char want[32];
		snprintf(want, sizeof want, "\n  %s ", cmds[i]);
		CHECK_CONTAINS(out, want);
	}
	CHECK_CONTAINS(out, "model (a training step)");
	if (flags_documented("train --help", "docs/train.md") || flags_documented("sample --help", "docs/train.md") ||
	    flags_documented("plot --help", "docs/train.md") || flags_documented("run --help", "docs/launcher.md") ||
	    flags_documented("data prepare --help", "docs/data.md") ||
	    flags_documented("bench comm --help", "docs/collectives.md"))
		return 1;

	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	snprintf(cmd, sizeof cmd, "printf 'some text\\n' > %s/a.txt && %s data prepare --input %s/a.txt --out %s/d", dir, loom,
	         dir, dir);
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 30), 0);
	snprintf(cmd, sizeof cmd, "%s sample --model %s/d/train_000000.bin", loom, dir);
	CHECK(test_run_cmd(cmd, out, sizeof out, 30) != 0);
	CHECK_CONTAINS(out, "/d/train_000000.bin is a token shard (llm.c data, magic 20240520), not a model");
	snprintf(cmd, sizeof cmd, "%s train --train-data '%s/nodir/*.bin' --steps 1", loom, dir);
	CHECK(test_run_cmd(cmd, out, sizeof out, 30) != 0);
	CHECK_CONTAINS(out, "no files match '");
	CHECK_MSG(!strstr(out, "glob error"), "%s", out);
	snprintf(cmd, sizeof cmd, "%s train --train-data '%s/d/train_*.bin' --n-layer 1 --n-embd 32 --n-head 2 "
	         "--batch-size 1 --seq-len 4 --steps 2 --threads 1 --peak-flops 1e10 --save-dir %s/ck && %s info %s/ck && "
	         "%s info %s/d", loom, dir, dir, loom, dir, loom, dir);
	int st = test_run_cmd(cmd, out, sizeof out, 30);
	CHECK_MSG(st == 0, "exit %d: %s", st, out);
	CHECK_CONTAINS(out, "/ck: checkpoint directory (--save-dir): 1 checkpoint, the latest complete one is ");
	CHECK_CONTAINS(out, "/ck/step_00000002: complete training checkpoint\n");
	CHECK_CONTAINS(out, "config.json");
	CHECK_CONTAINS(out, "/d: token shards (loom data prepare output)");
	test_rmdir(dir);
	return 0;
}

/* Ctrl-C during `loom train`: nothing new is saved, the command that resumes is printed, and the
 * process dies of SIGINT. */
TEST(train_ctrl_c_prints_resume)
{
	char dir[512], cmd[3000], out[8192], path[700];
	const char *loom = test_loom_bin();
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	snprintf(cmd, sizeof cmd, "printf 'some text for a corpus\\n' > %s/a.txt && %s data prepare --input %s/a.txt "
	         "--out %s/d", dir, loom, dir, dir);
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 30), 0);
	snprintf(cmd, sizeof cmd, "exec %s train --train-data '%s/d/train_*.bin' --n-layer 1 --n-embd 32 --n-head 2 "
	         "--batch-size 1 --seq-len 4 --steps 100000000 --save-every 1000000 --save-dir %s/ck --threads 1 "
	         "--peak-flops 1e10 --print-every 1000000 > %s/out.txt 2>&1", loom, dir, dir, dir);
	fflush(NULL);
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
		_exit(127);
	}
	snprintf(path, sizeof path, "%s/out.txt", dir);
	double t0 = now_s();
	char *text = NULL;
	while (now_s() - t0 < 30) { /* until the first step line */
		free(text);
		text = slurp(path);
		if (text && strstr(text, " 1/100000000 | "))
			break;
		usleep(10000);
	}
	CHECK_MSG(text && strstr(text, " 1/100000000 | "), "no step line within 30 s: %s", text ? text : "");
	free(text);
	CHECK_EQ(kill(pid, SIGINT), 0);
	int status = 0;
	t0 = now_s();
	while (waitpid(pid, &status, WNOHANG) == 0 && now_s() - t0 < 30)
		usleep(5000);
	if (now_s() - t0 >= 30) {
		kill(pid, SIGKILL);
		waitpid(pid, &status, 0);
	}
	text = slurp(path);
	CHECK(text != NULL);
	CHECK_MSG(WIFSIGNALED(status) && WTERMSIG(status) == SIGINT, "status %d: %s", status, text);
	CHECK_CONTAINS(text, "loom train: interrupted; nothing new was saved. Continue from the last checkpoint in ");
	CHECK_CONTAINS(text, " train --train-data '");
	CHECK_CONTAINS(text, "/d/train_*.bin' --n-layer 1 ");
	CHECK_CONTAINS(text, " --print-every 1000000 --resume\n");
	free(text);
	struct stat sb;
	snprintf(path, sizeof path, "%s/ck", dir);
	CHECK_MSG(stat(path, &sb) != 0, "a checkpoint directory was written on Ctrl-C");
	test_rmdir(dir);
	return 0;
}

/* A BPE tokenizer travels with checkpoints: trained by `loom tokenizer train`, used by `loom data
 * prepare --tokenizer`; the checkpoint holds its vocab.json and merges.txt byte for byte, and
 * `loom sample --model CKPT` encodes the prompt and decodes with it. */
TEST(bpe_tokenizer_travels_with_checkpoints)
{
	char dir[512], cmd[12000], out[8192];
	const char *loom = test_loom_bin();
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	snprintf(cmd, sizeof cmd, "for i in $(seq 200); do echo \"the cat sat on the mat number $i\"; done > %s/a.txt && "
	         "%s tokenizer train --vocab-size 300 --input %s/a.txt --out %s/tok --quiet && "
	         "%s data prepare --tokenizer %s/tok --input %s/a.txt --out %s/d && "
	         "%s train --train-data '%s/d/train_*.bin' --n-layer 1 --n-embd 32 --n-head 2 --vocab-size 300 "
	         "--batch-size 2 --seq-len 16 --steps 3 --threads 1 --peak-flops 1e10 --save-dir %s/ck && "
	         "cmp %s/tok/vocab.json %s/ck/step_00000003/vocab.json && cmp %s/tok/merges.txt %s/ck/step_00000003/merges.txt"
	         " && %s sample --model %s/ck --prompt 'the cat' --max-tokens 4 --temperature 0",
	         dir, loom, dir, dir, loom, dir, dir, dir, loom, dir, dir, dir, dir, dir, dir, loom, dir);
	int st = test_run_cmd(cmd, out, sizeof out, 60);
	CHECK_MSG(st == 0, "exit %d: %s", st, out);
	const char *s = strstr(out, "the cat");
	CHECK_MSG(s != NULL && (s == out || s[-1] == '\n'), "no sample starting with the prompt: %s", out);
	/* a tokenizer.json travels too, and sampling from the checkpoint alone finds it */
	snprintf(cmd, sizeof cmd, "%s tokenizer train --vocab-size 300 --input %s/a.txt --out %s/tj --format json --quiet && "
	         "%s data prepare --tokenizer %s/tj/tokenizer.json --input %s/a.txt --out %s/dj && "
	         "%s train --train-data '%s/dj/train_*.bin' --n-layer 1 --n-embd 32 --n-head 2 --vocab-size 300 "
	         "--batch-size 2 --seq-len 16 --steps 3 --threads 1 --peak-flops 1e10 --save-dir %s/ckj && "
	         "cmp %s/tj/tokenizer.json %s/ckj/step_00000003/tokenizer.json && "
	         "%s sample --model %s/ckj --prompt 'the cat' --max-tokens 4 --temperature 0",
	         loom, dir, dir, loom, dir, dir, dir, loom, dir, dir, dir, dir, loom, dir);
	st = test_run_cmd(cmd, out, sizeof out, 60);
	CHECK_MSG(st == 0, "tokenizer.json: exit %d: %s", st, out);
	s = strstr(out, "the cat");
	CHECK_MSG(s != NULL && (s == out || s[-1] == '\n'), "tokenizer.json: no sample starting with the prompt: %s", out);
	test_rmdir(dir);
	return 0;
}
