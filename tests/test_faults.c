/* test_faults.c: allocation-failure injection (SQLite's approach): along an API's path, fail the n-th
 * allocation for n = 1, 2, ... until a run completes without reaching an injected failure, and check
 * each time that the call returns LOOM_ENOMEM with a message, leaves its output NULL, leaks nothing
 * (LeakSanitizer, when the suite is built with SANITIZER=address) and leaves no shared-memory
 * segment behind (test_spawn). Every allocation of the library goes through loom__malloc & co.
 * (src/core/util.c), so the sweep reaches every allocation on the path.
 *
 * Each sweep prints its number of injection points: a sweep that reaches none tests nothing, so a
 * lower bound is checked too. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

#include "core/util.h"
#include "loom/loom.h"
#include "test.h"

/* 1 when LeakSanitizer finds unreachable memory now (it prints the report); 0 without ASan. */
static int leaked(void)
{
#if defined(__SANITIZE_ADDRESS__)
	return __lsan_do_recoverable_leak_check() != 0;
#else
	return 0;
#endif
}

/* One call of the API under test: its LOOM_* code. On success it checks what it made (exact values)
 * and releases it; on failure its outputs must be NULL, which it checks (returning 1 otherwise).
 * It calls fault_pause() after the calls under test, so that its checks run without injection. */
typedef int (*call_fn)(void *arg, int *rc);

static int paused_hit = -1;

static void fault_pause(void)
{
	if (paused_hit < 0) { /* the first pause of a call counts */
		paused_hit = loom__fault_alloc_hit();
		loom__fault_alloc_set(0);
	}
}

/* Fail allocation n = 1, 2, ... of fn's path; *points gets the number of allocations reached.
 * Returns 0 when every failure was clean and the run without one succeeded. A call may also
 * succeed despite a failed allocation when it has a fallback (DDP's gradients outside shared
 * memory): then its outputs are checked like those of a normal run, and it counts as recovered. */
static int sweep(const char *api, call_fn fn, void *arg, long min_points, long *points)
{
	long recovered = 0;
	for (long n = 1;; n++) {
		int rc = LOOM_OK, hit, bad;
		loom_seterr(LOOM_OK, "%s", "");
		loom__fault_alloc_set(n);
		bad = fn(arg, &rc);
		hit = paused_hit >= 0 ? paused_hit : loom__fault_alloc_hit();
		paused_hit = -1;
		loom__fault_alloc_set(0);
		CHECK_MSG(!bad, "%s: with allocation %ld failing (hit %d, rc %d): the call's outputs are wrong", api, n, hit,
		          rc);
		if (!hit) {
			CHECK_MSG(rc == LOOM_OK, "%s: failed with no injected failure: %d (%s): %s", api, rc, loom_strerror(rc),
			          loom_errmsg());
			*points = n - 1;
			break;
		}
		/* LeakSanitizer's scan costs ~0.1 s; what leaks stays unreachable, so one scan per 32 points
		 * finds it (naming the range) and keeps a 700-point sweep at seconds rather than minutes */
		if (n % 32 == 0)
			CHECK_MSG(!leaked(), "%s: with one of allocations %ld-%ld failing: memory leaked (report above)", api,
			          n - 31, n);
		if (rc == LOOM_OK) {
			recovered++;
			continue;
		}
		CHECK_MSG(rc == LOOM_ENOMEM, "%s: allocation %ld failed, the call returned %d (%s), expected LOOM_ENOMEM: %s",
		          api, n, rc, loom_strerror(rc), loom_errmsg());
		CHECK_MSG(loom_errmsg()[0] != '\0', "%s: allocation %ld failed: LOOM_ENOMEM without a message", api, n);
		CHECK_MSG(n < 100000, "%s: the sweep does not end", api);
	}
	CHECK_MSG(!leaked(), "%s: memory leaked by the run without failure or by a failure of an allocation after %ld "
	                     "(report above)", api, *points / 32 * 32);
	printf("  %s: %ld injection points (%ld recovered)\n", api, *points, recovered);
	CHECK_MSG(*points >= min_points, "%s: only %ld injection points (expected at least %ld)", api, *points,
	          min_points);
	return 0;
}

/* ---- communicator: init and split on one rank ---------------------------------------------- */

static int call_comm_init(void *arg, int *rc)
{
	loom_comm_t *c = (loom_comm_t *)1;
	float x = 3;
	(void)arg;
	*rc = loom_comm_init(&c);
	fault_pause();
	if (*rc != LOOM_OK)
		return c != NULL;
	*rc = loom_allreduce(c, &x, &x, 1, LOOM_FLOAT32, LOOM_SUM);
	loom_comm_destroy(c);
	return *rc == LOOM_OK && x != 3;
}

static int call_comm_split(void *arg, int *rc)
{
	loom_comm_t *c = arg, *sub = (loom_comm_t *)1;
	*rc = loom_comm_split(c, 5, 0, &sub);
	fault_pause();
	if (*rc != LOOM_OK)
		return sub != NULL;
	if (loom_comm_size(sub) != 1 || loom_comm_rank(sub) != 0)
		return 1;
	loom_comm_destroy(sub);
	return 0;
}

static int rank_comm_sweeps(int rank, int nranks, void *arg)
{
	loom_comm_t *c;
	long points;
	(void)rank, (void)nranks, (void)arg;
	if (sweep("loom_comm_init (1 rank)", call_comm_init, NULL, 4, &points))
		return 1;
	CHECK_OK(loom_comm_init(&c));
	if (sweep("loom_comm_split (1 rank)", call_comm_split, c, 3, &points))
		return 1;
	/* the parent is still usable after every failed split */
	{
		double x = 2;
		CHECK_OK(loom_allreduce(c, &x, &x, 1, LOOM_FLOAT64, LOOM_SUM));
		CHECK_FEQ(x, 2);
	}
	CHECK_OK(loom_comm_destroy(c));
	return leaked();
}

TEST(fault_comm_init_split)
{
	CHECK_EQ(test_spawn(1, rank_comm_sweeps, NULL, 120, NULL), 0);
	return 0;
}

/* ---- communicator: init and split on two ranks, one of them failing ------------------------ */

/* Shared between the test and its ranks (an anonymous shared mapping made before the fork). */
typedef struct {
	long n;       /* the victim's allocation that fails */
	int victim;   /* the rank whose allocation fails */
	int split;    /* 0: sweep init then split; 1: the split alone (init runs without failures) */
	int hit;      /* the victim reached allocation n */
	int rc[2];    /* each rank's result */
	char msg[2][256];
} two_rank_t;

static int rank_two(int rank, int nranks, void *arg)
{
	two_rank_t *s = arg;
	loom_comm_t *c = NULL, *sub = NULL;
	int victim = rank == s->victim, rc;
	if (victim && !s->split)
		loom__fault_alloc_set(s->n);
	rc = loom_comm_init(&c);
	if (rc == LOOM_OK && victim && s->split)
		loom__fault_alloc_set(s->n);
	if (rc == LOOM_OK)
		rc = loom_comm_split(c, 0, nranks - rank, &sub); /* reversed: the sub's leader is world rank 1 */
	if (victim) {
		s->hit = loom__fault_alloc_hit();
		loom__fault_alloc_set(0);
	}
	s->rc[rank] = rc;
	snprintf(s->msg[rank], sizeof s->msg[rank], "%s", rc ? loom_errmsg() : "");
	if (rc == LOOM_OK) {
		int x = rank + 1;
		rc = loom_allreduce(sub, &x, &x, 1, LOOM_INT32, LOOM_SUM);
		CHECK_OK(rc);
		CHECK_EQ(x, 3);
		CHECK_EQ(loom_comm_rank(sub), nranks - 1 - rank);
	}
	loom_comm_destroy(sub);
	loom_comm_destroy(c);
	return leaked();
}

/* The peer of a failing rank fails too (or, when the victim failed after the last exchange, not at
 * all), with a message, and within the timeout. A rank that fails before it has joined a segment
 * (its allocations in loom_comm_init before the world segment, or the sub-communicator's own in
 * loom_comm_split) cannot be told from one that is slow to arrive, so its peer waits for
 * LOOM_TIMEOUT_S (1 s here) by design; once both have joined, the peer sees the victim leave and
 * fails at once with LOOM_EPEERLOST. */
static int sweep_two(two_rank_t *s, const char *api, long min_points)
{
	static const char *const env[] = {"LOOM_TIMEOUT_S=1", NULL};
	long n, timeouts = 0;
	for (n = 1;; n++) {
		int peer = 1 - s->victim;
		s->n = n, s->hit = 0, s->rc[0] = s->rc[1] = 1;
		CHECK_MSG(test_spawn(2, rank_two, s, 60, env) == 0, "%s: victim rank %d, allocation %ld: ranks failed", api,
		          s->victim, n);
		if (!s->hit) {
			CHECK_MSG(s->rc[0] == LOOM_OK && s->rc[1] == LOOM_OK, "%s: failed without injection: %d %s / %d %s", api,
			          s->rc[0], s->msg[0], s->rc[1], s->msg[1]);
			break;
		}
		CHECK_MSG(s->rc[s->victim] == LOOM_ENOMEM, "%s: victim rank %d, allocation %ld: returned %d (%s), expected "
		                                           "LOOM_ENOMEM: %s",
		          api, s->victim, n, s->rc[s->victim], loom_strerror(s->rc[s->victim]), s->msg[s->victim]);
		CHECK_MSG(s->msg[s->victim][0], "%s: allocation %ld: no message", api, n);
		CHECK_MSG(s->rc[peer] == LOOM_OK || s->rc[peer] == LOOM_EPEERLOST || s->rc[peer] == LOOM_ETIMEDOUT,
		          "%s: victim rank %d, allocation %ld: the peer returned %d (%s): %s", api, s->victim, n, s->rc[peer],
		          loom_strerror(s->rc[peer]), s->msg[peer]);
		CHECK_MSG(s->rc[peer] == LOOM_OK || s->msg[peer][0], "%s: allocation %ld: the peer's error has no message",
		          api, n);
		timeouts += s->rc[peer] == LOOM_ETIMEDOUT;
		CHECK_MSG(n < 1000, "%s: the sweep does not end", api);
	}
	printf("  %s, rank %d failing: %ld injection points (the peer waited for LOOM_TIMEOUT_S at %ld)\n", api,
	       s->victim, n - 1, timeouts);
	CHECK_MSG(n - 1 >= min_points, "%s: only %ld injection points", api, n - 1);
	return 0;
}

TEST(fault_comm_two_ranks)
{
	two_rank_t *s = mmap(NULL, sizeof *s, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	int rc = 0;
	CHECK(s != MAP_FAILED);
	memset(s, 0, sizeof *s);
	for (int split = 0; split < 2 && rc == 0; split++) {
		for (int victim = 0; victim < 2 && rc == 0; victim++) {
			s->split = split, s->victim = victim;
			rc = sweep_two(s, split ? "loom_comm_split (2 ranks)" : "loom_comm_init + loom_comm_split (2 ranks)", split ? 3 : 4);
		}
	}
	munmap(s, sizeof *s);
	return rc;
}

/* ---- model and DDP ----------------------------------------------------------------------------- */

static int call_gpt2_create(void *arg, int *rc)
{
	const loom_gpt2_config_t *cfg = arg;
	loom_gpt2_t *m = (loom_gpt2_t *)1;
	int in[2 * 8], tg[2 * 8];
	float loss = 0;
	*rc = loom_gpt2_create(&m, cfg, 2, 8);
	fault_pause();
	if (*rc != LOOM_OK)
		return m != NULL;
	loom_gpt2_init(m, 7);
	for (int i = 0; i < 16; i++)
		in[i] = i % cfg->vocab_size, tg[i] = (i + 1) % cfg->vocab_size;
	*rc = loom_gpt2_forward_backward(m, in, tg, 2, 8, 1.0f, &loss);
	loom_gpt2_destroy(m);
	return *rc == LOOM_OK && !(loss > 0);
}

TEST(fault_gpt2_create)
{
	loom_gpt2_config_t cfg;
	long points;
	CHECK_OK(loom_gpt2_preset("tiny", &cfg));
	return sweep("loom_gpt2_create (tiny)", call_gpt2_create, &cfg, 1, &points);
}

typedef struct {
	loom_comm_t *comm;
	loom_gpt2_t *model;
} ddp_arg_t;

static int call_ddp_create(void *arg, int *rc)
{
	ddp_arg_t *a = arg;
	loom_ddp_t *d = (loom_ddp_t *)1;
	float *own = loom_gpt2_grads(a->model);
	*rc = loom_ddp_create(&d, a->comm, loom_gpt2_model(a->model), 0.05, 0.01);
	fault_pause();
	if (*rc != LOOM_OK) /* a failed create leaves the model on its own gradients */
		return d != NULL || loom_gpt2_grads(a->model) != own;
	if (loom_ddp_bucket(d, 0, NULL, NULL) < 2)
		return 1;
	loom_ddp_destroy(d);
	return loom_gpt2_grads(a->model) != own || own[0] != 0.5f;
}

static int rank_ddp_sweep(int rank, int nranks, void *arg)
{
	loom_gpt2_config_t cfg;
	ddp_arg_t a;
	long points;
	int rc;
	(void)rank, (void)nranks, (void)arg;
	CHECK_OK(loom_gpt2_preset("tiny", &cfg));
	CHECK_OK(loom_comm_init(&a.comm));
	CHECK_OK(loom_gpt2_create(&a.model, &cfg, 1, 8));
	loom_gpt2_grads(a.model)[0] = 0.5f;
	rc = sweep("loom_ddp_create (1 rank)", call_ddp_create, &a, 3, &points);
	loom_gpt2_destroy(a.model);
	loom_comm_destroy(a.comm);
	return rc || leaked();
}

TEST(fault_ddp_create)
{
	CHECK_EQ(test_spawn(1, rank_ddp_sweep, NULL, 120, NULL), 0);
	return 0;
}

/* ---- checkpoints -------------------------------------------------------------------------------- */

static const loom_gpt2_config_t small_cfg = {2, 2, 8, 16, 50}; /* L H C T V */

typedef struct {
	char dir[256], st[512], bin[512], optim[512], kv[512], ckpts[512], tok[512], hf[512];
	float *params, *m, *v;
	size_t n;
} ckpt_arg_t;

/* loom_model_load_alloc on the file a->st or a->bin (arg selects): config, then parameters. */
static int model_load(ckpt_arg_t *a, const char *path, int *rc)
{
	loom_gpt2_config_t cfg;
	float *p = (float *)1;
	*rc = loom_model_load_alloc(path, 0, &cfg, &p);
	fault_pause();
	if (*rc != LOOM_OK)
		return p != NULL;
	*rc = memcmp(&cfg, &small_cfg, sizeof cfg) != 0 || memcmp(p, a->params, a->n * sizeof *p) != 0;
	free(p);
	return *rc;
}

static int call_model_load_st(void *arg, int *rc)
{
	return model_load(arg, ((ckpt_arg_t *)arg)->st, rc);
}

static int call_model_load_llmc(void *arg, int *rc)
{
	return model_load(arg, ((ckpt_arg_t *)arg)->bin, rc);
}

static int call_model_load_hf(void *arg, int *rc)
{
	return model_load(arg, ((ckpt_arg_t *)arg)->hf, rc);
}

/* A safetensors model as HF publishes it: "transformer."-prefixed names, no n_head in the file's
 * metadata but in config.json beside it. */
static int write_hf_model(const ckpt_arg_t *a)
{
	loom_st_tensor_t t[64];
	loom_tensor_info_t info[64];
	char names[64][80], cfg[600];
	const char *json = "{\"model_type\": \"gpt2\", \"n_head\": 2, \"n_layer\": 2}";
	int n = loom_gpt2_num_tensors(&small_cfg);
	CHECK(n <= 64);
	for (int i = 0; i < n; i++) {
		CHECK_OK(loom_gpt2_tensor_info(&small_cfg, i, &info[i]));
		snprintf(names[i], sizeof names[i], "transformer.%.63s", info[i].name);
		t[i] = (loom_st_tensor_t){names[i], LOOM_ST_F32, info[i].ndim, {info[i].shape[0], info[i].shape[1]},
		                          a->params + info[i].offset, info[i].numel * sizeof(float)};
	}
	CHECK_OK(loom_st_write(a->hf, t, n, NULL, 0));
	snprintf(cfg, sizeof cfg, "%s/hf/config.json", a->dir);
	CHECK(test_write_file(cfg, json, strlen(json)) == 0);
	return 0;
}

static int call_st_open(void *arg, int *rc)
{
	ckpt_arg_t *a = arg;
	loom_st_t *st = (loom_st_t *)1;
	int bad;
	*rc = loom_st_open(&st, a->st);
	fault_pause();
	if (*rc != LOOM_OK)
		return st != NULL;
	bad = loom_st_count(st) != loom_gpt2_num_tensors(&small_cfg) || !loom_st_meta(st, "n_head") ||
	      strcmp(loom_st_meta(st, "n_head"), "2") != 0;
	loom_st_close(st);
	return bad;
}

static int call_optim_load(void *arg, int *rc)
{
	ckpt_arg_t *a = arg;
	float *m = calloc(a->n, sizeof *m), *v = calloc(a->n, sizeof *v);
	int bad = 0;
	*rc = loom_optim_load(a->optim, &small_cfg, m, v);
	fault_pause();
	if (*rc == LOOM_OK)
		bad = memcmp(m, a->m, a->n * sizeof *m) != 0 || memcmp(v, a->v, a->n * sizeof *v) != 0;
	free(m), free(v);
	return bad;
}

static int call_kv_load(void *arg, int *rc)
{
	ckpt_arg_t *a = arg;
	loom_kv_t *kv = (loom_kv_t *)1;
	loom_loader_state_t st;
	const char *s;
	double d;
	int bad;
	*rc = loom_kv_load(&kv, a->kv);
	fault_pause();
	if (*rc != LOOM_OK)
		return kv != NULL;
	bad = loom_kv_get_str(kv, "name", &s) != LOOM_OK || strcmp(s, "fault") != 0 ||
	      loom_kv_get_f64(kv, "lr", &d) != LOOM_OK || d != 0.125 ||
	      loom_kv_get_loader(kv, "train", &st) != LOOM_OK || st.next_window != 42 || loom_kv_count(kv) < 3;
	loom_kv_destroy(kv);
	return bad;
}

static int call_ckpt_latest(void *arg, int *rc)
{
	ckpt_arg_t *a = arg;
	char path[1400], want[1400];
	int64_t step = -1;
	*rc = loom_ckpt_latest(a->ckpts, path, sizeof path, &step);
	if (*rc != LOOM_OK)
		return 0;
	snprintf(want, sizeof want, "%s/step_00000020", a->ckpts);
	if (step != 20 || strcmp(path, want) != 0)
		return 1;
	*rc = loom_ckpt_verify(path);
	return 0;
}

static int call_tokenizer_load(void *arg, int *rc)
{
	ckpt_arg_t *a = arg;
	loom_tokenizer_t tok;
	int len, bad;
	const unsigned char *b;
	memset(&tok, 0, sizeof tok);
	*rc = loom_tokenizer_load(&tok, a->tok);
	fault_pause();
	if (*rc != LOOM_OK)
		return tok.bytes != NULL || tok.lengths != NULL;
	b = loom_tokenizer_decode(&tok, 'q', &len);
	bad = tok.vocab_size != LOOM_BYTE_VOCAB || !b || len != 1 || b[0] != 'q';
	loom_tokenizer_free(&tok);
	return bad;
}

static int write_ckpt(const char *dir, int64_t step)
{
	loom_ckpt_writer_t w;
	char path[1400];
	int rc = loom_ckpt_begin(&w, dir, step);
	if (rc)
		return rc;
	loom_ckpt_file(&w, "state.json", path, sizeof path);
	if (test_write_file(path, "{}", 2))
		return 1;
	loom_ckpt_file(&w, "model.bin", path, sizeof path);
	if (test_write_file(path, "0123456789", 10))
		return 1;
	return loom_ckpt_commit(&w);
}

TEST(fault_ckpt_load)
{
	ckpt_arg_t a;
	char hfdir[600];
	loom_kv_t *kv;
	loom_tokenizer_t tok;
	loom_loader_state_t ls = {42, 0, 1, 1000, 2, 8, 1, 0, 1, 0};
	long points;
	int rc = 0;
	memset(&a, 0, sizeof a);
	CHECK(test_mkdtemp(a.dir, sizeof a.dir) == 0);
	snprintf(a.st, sizeof a.st, "%s/model.safetensors", a.dir);
	snprintf(a.bin, sizeof a.bin, "%s/model.bin", a.dir);
	snprintf(a.optim, sizeof a.optim, "%s/optim.safetensors", a.dir);
	snprintf(a.kv, sizeof a.kv, "%s/state.json", a.dir);
	snprintf(a.ckpts, sizeof a.ckpts, "%s/ckpts", a.dir);
	snprintf(a.tok, sizeof a.tok, "%s/tokenizer.bin", a.dir);
	snprintf(a.hf, sizeof a.hf, "%s/hf/model.safetensors", a.dir);
	a.n = loom_gpt2_num_params(&small_cfg);
	a.params = malloc(a.n * sizeof(float)), a.m = malloc(a.n * sizeof(float)), a.v = malloc(a.n * sizeof(float));
	for (size_t i = 0; i < a.n; i++)
		a.params[i] = (float)i * 0.25f - 3, a.m[i] = (float)i, a.v[i] = 1.0f / (float)(i + 1);
	CHECK_OK(loom_model_save(a.st, &small_cfg, a.params));
	CHECK_OK(loom_model_save(a.bin, &small_cfg, a.params));
	CHECK_OK(loom_optim_save(a.optim, &small_cfg, a.m, a.v));
	CHECK_OK(loom_kv_create(&kv));
	CHECK_OK(loom_kv_set_str(kv, "name", "fault"));
	CHECK_OK(loom_kv_set_f64(kv, "lr", 0.125));
	CHECK_OK(loom_kv_set_i64(kv, "step", 20));
	CHECK_OK(loom_kv_set_loader(kv, "train", &ls));
	CHECK_OK(loom_kv_save(kv, a.kv));
	loom_kv_destroy(kv);
	CHECK_OK(write_ckpt(a.ckpts, 10));
	CHECK_OK(write_ckpt(a.ckpts, 20));
	snprintf(hfdir, sizeof hfdir, "%s/hf", a.dir);
	CHECK(mkdir(hfdir, 0777) == 0);
	CHECK(write_hf_model(&a) == 0);
	CHECK_OK(loom_tokenizer_init_bytes(&tok));
	CHECK_OK(loom_tokenizer_save(&tok, a.tok));
	loom_tokenizer_free(&tok);

	rc = rc || sweep("loom_model_load_alloc (safetensors)", call_model_load_st, &a, 3, &points);
	rc = rc || sweep("loom_model_load_alloc (llm.c)", call_model_load_llmc, &a, 1, &points);
	rc = rc || sweep("loom_model_load_alloc (HF safetensors + config.json)", call_model_load_hf, &a, 3, &points);
	rc = rc || sweep("loom_st_open", call_st_open, &a, 3, &points);
	rc = rc || sweep("loom_optim_load", call_optim_load, &a, 3, &points);
	rc = rc || sweep("loom_kv_load", call_kv_load, &a, 3, &points);
	rc = rc || sweep("loom_ckpt_latest + loom_ckpt_verify", call_ckpt_latest, &a, 1, &points);
	rc = rc || sweep("loom_tokenizer_load", call_tokenizer_load, &a, 3, &points);
	free(a.params), free(a.m), free(a.v);
	if (rc == 0)
		test_rmdir(a.dir);
	return rc;
}

/* ---- checkpoint writers ----------------------------------------------------------------------- */

/* A failed write leaves nothing behind: no file under the final name, no temporary beside it. */
static int dir_entries(const char *dir)
{
	char cmd[700], out[4096];
	snprintf(cmd, sizeof cmd, "ls -A '%s' | wc -l", dir);
	if (test_run_cmd(cmd, out, sizeof out, 30) != 0)
		return -1;
	return atoi(out);
}

static int call_writers(void *arg, int *rc)
{
	ckpt_arg_t *a = arg; /* writes into a->dir/w, which is empty before and after */
	char dir[600], path[1400];
	loom_ckpt_writer_t w;
	loom_kv_t *kv = NULL;
	int64_t step;
	snprintf(dir, sizeof dir, "%s/w", a->dir);
	snprintf(path, sizeof path, "%s/model.safetensors", dir);
	*rc = loom_model_save(path, &small_cfg, a->params);
	if (*rc == LOOM_OK) {
		snprintf(path, sizeof path, "%s/optim.safetensors", dir);
		*rc = loom_optim_save(path, &small_cfg, a->m, a->v);
	}
	if (*rc == LOOM_OK && (*rc = loom_kv_create(&kv)) == LOOM_OK) {
		snprintf(path, sizeof path, "%s/state.json", dir);
		if ((*rc = loom_kv_set_str(kv, "name", "fault")) == LOOM_OK && (*rc = loom_kv_set_i64(kv, "step", 3)) == LOOM_OK)
			*rc = loom_kv_save(kv, path);
		loom_kv_destroy(kv);
	}
	if (*rc == LOOM_OK && (*rc = loom_ckpt_begin(&w, dir, 3)) == LOOM_OK) {
		loom_ckpt_file(&w, "model.safetensors", path, sizeof path);
		if ((*rc = loom_model_save(path, &small_cfg, a->params)) == LOOM_OK)
			*rc = loom_ckpt_commit(&w);
		if (*rc != LOOM_OK)
			loom_ckpt_abort(&w);
	}
	fault_pause();
	if (*rc == LOOM_OK) { /* what was written reads back */
		snprintf(path, sizeof path, "%s/step_00000003", dir);
		if (dir_entries(dir) != 5 /* with config.json */ || loom_ckpt_latest(dir, path, sizeof path, &step) != LOOM_OK || step != 3 ||
		    model_load(a, strcat(path, "/model.safetensors"), rc) != 0 || *rc != LOOM_OK)
			return 1;
	}
	/* Files written before the failure stay (each is complete): remove them; nothing else may exist. */
	snprintf(path, sizeof path, "%s/model.safetensors", dir), remove(path);
	snprintf(path, sizeof path, "%s/optim.safetensors", dir), remove(path);
	snprintf(path, sizeof path, "%s/state.json", dir), remove(path);
	snprintf(path, sizeof path, "%s/config.json", dir), remove(path);
	snprintf(path, sizeof path, "%s/step_00000003", dir);
	test_rmdir(path);
	return dir_entries(dir) != 0;
}

TEST(fault_ckpt_write)
{
	ckpt_arg_t a;
	char dir[600];
	long points;
	int rc;
	memset(&a, 0, sizeof a);
	CHECK(test_mkdtemp(a.dir, sizeof a.dir) == 0);
	snprintf(dir, sizeof dir, "%s/w", a.dir);
	CHECK(mkdir(dir, 0777) == 0);
	a.n = loom_gpt2_num_params(&small_cfg);
	a.params = malloc(a.n * sizeof(float)), a.m = malloc(a.n * sizeof(float)), a.v = malloc(a.n * sizeof(float));
	for (size_t i = 0; i < a.n; i++)
		a.params[i] = (float)i * 0.5f - 1, a.m[i] = (float)i, a.v[i] = 2.0f;
	rc = sweep("model, optimizer, state and checkpoint-directory writers", call_writers, &a, 10, &points);
	free(a.params), free(a.m), free(a.v);
	if (rc == 0)
		test_rmdir(a.dir);
	return rc;
}

/* ---- data loader -------------------------------------------------------------------------------- */

typedef struct {
	char glob[600];
	loom_loader_opts_t o;
} loader_arg_t;

static int call_loader_create(void *arg, int *rc)
{
	loader_arg_t *a = arg;
	loom_loader_t *ld = (loom_loader_t *)1;
	int in[2 * 8], tg[2 * 8], bad;
	*rc = loom_loader_create(&ld, a->glob, &a->o);
	fault_pause();
	if (*rc != LOOM_OK)
		return ld != NULL;
	bad = loom_loader_num_shards(ld) != 3 || loom_loader_num_tokens(ld) != 3 * 500;
	if (!bad)
		bad = loom_loader_window(ld, 0, in, tg) != LOOM_OK || tg[0] != in[1];
	loom_loader_destroy(ld);
	return bad;
}

typedef struct {
	char in[2][600], out[600];
} prepare_arg_t;

static int call_data_prepare(void *arg, int *rc)
{
	prepare_arg_t *a = arg;
	const char *inputs[2] = {a->in[0], a->in[1]};
	loom_prepare_opts_t o = {inputs, 2, a->out, 0.25, 100, "%", NULL};
	loom_prepare_summary_t sum;
	*rc = loom_data_prepare(&o, &sum);
	fault_pause();
	if (*rc != LOOM_OK)
		return 0;
	/* 4 documents, end-of-text + "a\n", "b\n", "cc\n", "dd\n" (split at the "%" lines): the 4th goes to val */
	return sum.documents != 4 || sum.val_documents != 1 || sum.train_tokens != 3 + 3 + 4 || sum.val_tokens != 4;
}

TEST(fault_loader_create)
{
	char dir[256], path[512];
	uint16_t toks[500];
	loader_arg_t a;
	long points;
	int rc = 0;
	CHECK(test_mkdtemp(dir, sizeof dir) == 0);
	for (int s = 0; s < 3; s++) {
		for (int i = 0; i < 500; i++)
			toks[i] = (uint16_t)(s * 500 + i);
		snprintf(path, sizeof path, "%s/train_%06d.bin", dir, s);
		CHECK_OK(loom_shard_write(path, toks, 500));
	}
	snprintf(a.glob, sizeof a.glob, "%s/train_*.bin", dir);
	a.o = (loom_loader_opts_t){2, 8, 1, 1234, 0, 1};
	rc = sweep("loom_loader_create (3 shards, shuffled)", call_loader_create, &a, 4, &points);
	if (rc == 0)
		test_rmdir(dir);
	return rc;
}

TEST(fault_data_prepare)
{
	char dir[256];
	prepare_arg_t a;
	long points;
	int rc;
	CHECK(test_mkdtemp(dir, sizeof dir) == 0);
	snprintf(a.in[0], sizeof a.in[0], "%s/one.txt", dir);
	snprintf(a.in[1], sizeof a.in[1], "%s/two.txt", dir);
	snprintf(a.out, sizeof a.out, "%s/out", dir);
	CHECK(test_write_file(a.in[0], "a\n%\nb\n", 6) == 0);
	CHECK(test_write_file(a.in[1], "cc\n%\ndd\n", 8) == 0);
	rc = sweep("loom_data_prepare", call_data_prepare, &a, 3, &points);
	if (rc == 0)
		test_rmdir(dir);
	return rc;
}
