/* test_ddp.c: the DDP reducer: buckets partition the gradients, every gradient is averaged exactly
 * once across ranks, and accumulation micro-steps communicate nothing; it points the model's gradient
 * view at its storage without taking over the model's buffer, and every allocation failure along its
 * creation is a clean error. The parallel strategies (src/parallel/strategy.h): the table's choice,
 * and the DDP strategy's invariant (replicas bit-identical and equal to one process's step on the
 * averaged gradients). */
#include <stdint.h>
#include <stdlib.h>

#include "core/util.h"
#include "loom/ddp.h"
#include "parallel/strategy.h"
#include "test.h"

static const loom_gpt2_config_t tiny = {2, 2, 16, 8, 11}; /* L H C T V */

/* Tokens of rank r's micro-batch: different on every rank. */
static void batch(int r, int step, int *inp, int *tgt, int n)
{
	for (int i = 0; i < n; i++) {
		inp[i] = (i * 7 + r * 3 + step) % tiny.vocab_size;
		tgt[i] = (i * 5 + r + 2 * step + 1) % tiny.vocab_size;
	}
}

static int check_partition(loom_ddp_t *d, size_t nparams)
{
	size_t off, cnt, end = nparams;
	int nb = loom_ddp_bucket(d, 0, &off, &cnt);
	for (int b = 0; b < nb; b++) {
		loom_ddp_bucket(d, b, &off, &cnt);
		CHECK_EQ(off + cnt, end); /* bucket b ends where bucket b-1 starts: no gap, no overlap */
		CHECK(cnt > 0);
		end = off;
	}
	CHECK_EQ(end, 0);
	return 0;
}

TEST(ddp_buckets_partition)
{
	loom_comm_t *comm;
	loom_gpt2_t *m;
	loom_ddp_t *d;
	size_t n = loom_gpt2_num_params(&tiny), off, cnt;
	/* first bucket 1 float-ish, then buckets smaller than the largest tensor (wpe/c_fc), then one bucket */
	const double sizes[][2] = {{1e-6, 1e-6}, {0.001, 0.002}, {25, 1}};
	CHECK_OK(loom_comm_init(&comm));
	CHECK_OK(loom_gpt2_create(&m, &tiny, 1, 8));
	for (size_t k = 0; k < 3; k++) {
		CHECK_OK(loom_ddp_create(&d, comm, loom_gpt2_model(m), sizes[k][0], sizes[k][1]));
		if (check_partition(d, n))
			return 1;
		int nb = loom_ddp_bucket(d, 0, &off, &cnt);
		if (k == 0)
			CHECK_EQ(nb, loom_gpt2_num_tensors(&tiny)); /* one tensor per bucket */
		if (k == 2)
			CHECK_EQ(nb, 1); /* the whole tiny model (28 KiB) fits in the 1 MiB first bucket */
		loom_ddp_destroy(d);
	}
	CHECK_ERR(loom_ddp_create(&d, comm, loom_gpt2_model(m), 0, 1), LOOM_EINVAL);
	loom_gpt2_destroy(m);
	loom_comm_destroy(comm);
	return 0;
}

/* Every rank computes its local gradient twice: once alone (no sync), once through DDP; the DDP result
 * must be the average over ranks of the local ones, with the same bits on every rank. */
static int ddp_average_rank(int rank, int nranks, void *arg)
{
	double bucket_mb = *(double *)arg;
	loom_comm_t *comm;
	loom_gpt2_t *m;
	loom_ddp_t *d;
	loom_comm_stats_t s0, s1;
	loom_ddp_stats_t st;
	int inp[16], tgt[16];
	float loss;
	size_t n = loom_gpt2_num_params(&tiny);
	CHECK_OK(loom_comm_init(&comm));
	CHECK_OK(loom_gpt2_create(&m, &tiny, 2, 8));
	loom_gpt2_init(m, 1234);
	CHECK_OK(loom_ddp_create(&d, comm, loom_gpt2_model(m), bucket_mb, bucket_mb / 4));
	float *local = malloc(n * sizeof(float)), *all = malloc(n * sizeof(float) * (size_t)nranks);
	CHECK(local && all);

	/* local gradient, with DDP in no-sync mode: nothing may be communicated */
	batch(rank, 0, inp, tgt, 16);
	loom_gpt2_zero_grad(m);
	loom_ddp_set_sync(d, 0);
	loom_comm_stats(comm, &s0);
	CHECK_OK(loom_gpt2_forward_backward(m, inp, tgt, 2, 8, 1.0f, &loss));
	CHECK_OK(loom_ddp_wait(d, &st));
	loom_comm_stats(comm, &s1);
	CHECK_EQ(s1.collectives, s0.collectives);
	CHECK_EQ(st.buckets, 0);
	memcpy(local, loom_gpt2_grads(m), n * sizeof(float));

	/* the same micro-step with sync: gradients averaged in buckets */
	loom_gpt2_zero_grad(m);
	CHECK_OK(loom_gpt2_forward_backward(m, inp, tgt, 2, 8, 1.0f, &loss));
	CHECK_OK(loom_ddp_wait(d, &st));
	int nb = loom_ddp_bucket(d, 0, NULL, NULL);
	CHECK_EQ(st.buckets, nb);
	loom_comm_stats(comm, &s0);
	CHECK_EQ(s0.collectives - s1.collectives, nb); /* one all-reduce per bucket, nothing else */
	/* With the buckets a partition (ddp_buckets_partition), the payload of exactly n floats means that
	 * every gradient was reduced exactly once. */
	CHECK_EQ(s0.bytes - s1.bytes, n * sizeof(float));
	CHECK(loom_ddp_zero_copy(d));

	CHECK_OK(loom_allgather(comm, local, all, n, LOOM_FLOAT32));
	const float *g = loom_gpt2_grads(m);
	for (size_t i = 0; i < n; i++) {
		double ref = 0;
		for (int r = 0; r < nranks; r++)
			ref += all[(size_t)r * n + i];
		ref /= nranks;
		CHECK_NEAR(g[i], ref, 1e-6 * (1 + fabs(ref)));
	}
	/* replicas: the averaged gradients are bit-identical everywhere */
	uint64_t mine = loom_checksum_f32(g, n), sums[8];
	CHECK_OK(loom_allgather(comm, &mine, sums, 1, LOOM_INT64));
	for (int r = 0; r < nranks; r++)
		CHECK_EQ(sums[r], sums[0]);
	CHECK_OK(loom_ddp_check_replicas(d));
	/* destroying the DDP gives the model its own buffer back, with the same gradients */
	loom_ddp_destroy(d);
	CHECK(loom_gpt2_grads(m) != g);
	CHECK_EQ(loom_checksum_f32(loom_gpt2_grads(m), n), mine);
	CHECK_OK(loom_gpt2_forward_backward(m, inp, tgt, 2, 8, 1.0f, &loss));
	free(local), free(all);
	loom_gpt2_destroy(m);
	loom_comm_destroy(comm);
	return 0;
}

TEST(ddp_average_2ranks)
{
	double mb = 0.002; /* smaller than the largest tensor: several buckets */
	return test_spawn(2, ddp_average_rank, &mb, 60, NULL);
}

TEST(ddp_average_3ranks_one_bucket)
{
	double mb = 25;
	return test_spawn(3, ddp_average_rank, &mb, 60, NULL);
}

TEST(ddp_average_2ranks_tensor_buckets)
{
	double mb = 1e-6; /* every tensor in a bucket of its own */
	return test_spawn(2, ddp_average_rank, &mb, 60, NULL);
}

/* Gradient accumulation over 3 micro-steps: the first two communicate nothing at all (counted), the
 * last one all-reduces each bucket once, and the result is the average over ranks of each rank's
 * local accumulated gradient. */
static int ddp_accum_rank(int rank, int nranks, void *arg)
{
	enum { ACCUM = 3 };
	loom_comm_t *comm;
	loom_gpt2_t *m;
	loom_ddp_t *d;
	loom_comm_stats_t s0, s1;
	loom_ddp_stats_t st;
	int inp[16], tgt[16];
	float loss;
	size_t n = loom_gpt2_num_params(&tiny);
	(void)arg;
	CHECK_OK(loom_comm_init(&comm));
	CHECK_OK(loom_gpt2_create(&m, &tiny, 2, 8));
	loom_gpt2_init(m, 99);
	CHECK_OK(loom_ddp_create(&d, comm, loom_gpt2_model(m), 0.004, 0.001));
	int nb = loom_ddp_bucket(d, 0, NULL, NULL);
	CHECK(nb > 2);
	float *local = malloc(n * sizeof(float)), *all = malloc(n * sizeof(float) * (size_t)nranks);
	CHECK(local && all);

	/* reference: the local accumulated gradient, every micro-step without sync */
	loom_gpt2_zero_grad(m);
	for (int j = 0; j < ACCUM; j++) {
		batch(rank, j, inp, tgt, 16);
		loom_ddp_set_sync(d, 0);
		CHECK_OK(loom_gpt2_forward_backward(m, inp, tgt, 2, 8, 1.0f / ACCUM, &loss));
		CHECK_OK(loom_ddp_wait(d, &st));
	}
	memcpy(local, loom_gpt2_grads(m), n * sizeof(float));

	/* the same accumulation as a trainer runs it: sync on the last micro-step only */
	loom_gpt2_zero_grad(m);
	for (int j = 0; j < ACCUM; j++) {
		batch(rank, j, inp, tgt, 16);
		loom_ddp_set_sync(d, j == ACCUM - 1);
		loom_comm_stats(comm, &s0);
		CHECK_OK(loom_gpt2_forward_backward(m, inp, tgt, 2, 8, 1.0f / ACCUM, &loss));
		CHECK_OK(loom_ddp_wait(d, &st));
		loom_comm_stats(comm, &s1);
		CHECK_EQ(s1.collectives - s0.collectives, j == ACCUM - 1 ? nb : 0);
		CHECK_EQ(s1.bytes - s0.bytes, j == ACCUM - 1 ? n * sizeof(float) : 0);
		CHECK_EQ(st.buckets, j == ACCUM - 1 ? nb : 0);
	}
	CHECK_OK(loom_allgather(comm, local, all, n, LOOM_FLOAT32));
	const float *g = loom_gpt2_grads(m);
	for (size_t i = 0; i < n; i++) {
		double ref = 0;
		for (int r = 0; r < nranks; r++)
			ref += all[(size_t)r * n + i];
		ref /= nranks;
		CHECK_NEAR(g[i], ref, 1e-6 * (1 + fabs(ref)));
	}
	/* a sync micro-step whose gradients were never produced is reported, not waited on forever */
	loom_ddp_set_sync(d, 1);
	CHECK_ERR(loom_ddp_wait(d, &st), LOOM_ESTATE);
	CHECK_CONTAINS(loom_errmsg(), "never complete");
	free(local), free(all);
	loom_ddp_destroy(d);
	loom_gpt2_destroy(m);
	loom_comm_destroy(comm);
	return 0;
}

TEST(ddp_accum_no_comm_2ranks)
{
	return test_spawn(2, ddp_accum_rank, NULL, 60, NULL);
}

/* Rank 1 holds different parameters: the replica check names it on every rank. */
static int ddp_mismatch_rank(int rank, int nranks, void *arg)
{
	loom_comm_t *comm;
	loom_gpt2_t *m;
	loom_ddp_t *d;
	(void)nranks, (void)arg;
	CHECK_OK(loom_comm_init(&comm));
	CHECK_OK(loom_gpt2_create(&m, &tiny, 1, 8));
	loom_gpt2_init(m, 7);
	CHECK_OK(loom_ddp_create(&d, comm, loom_gpt2_model(m), 25, 1));
	CHECK_OK(loom_ddp_broadcast_params(d));
	if (rank == 1)
		loom_gpt2_params(m)[5] += 1.0f;
	CHECK_ERR(loom_ddp_check_replicas(d), LOOM_EMISMATCH);
	CHECK_CONTAINS(loom_errmsg(), "rank(s) 1 differ");
	loom_ddp_destroy(d);
	loom_gpt2_destroy(m);
	loom_comm_destroy(comm);
	return 0;
}

TEST(ddp_replica_mismatch)
{
	return test_spawn(3, ddp_mismatch_rank, NULL, 60, NULL);
}

/* Fail the n-th allocation along loom_ddp_create, for every n until it succeeds without a failure:
 * each failure is LOOM_ENOMEM with a message, *d NULL, and the model untouched (its own gradient
 * buffer, with its values, and usable). Run under ASan too (make SANITIZER=address). */
TEST(ddp_create_alloc_failures)
{
	loom_comm_t *comm;
	loom_gpt2_t *m;
	loom_ddp_t *d;
	int inp[8] = {1, 2, 3, 4, 5, 6, 7, 8}, tgt[8] = {2, 3, 4, 5, 6, 7, 8, 9}, failures = 0;
	float loss;
	size_t n = loom_gpt2_num_params(&tiny);
	CHECK_OK(loom_comm_init(&comm));
	CHECK_OK(loom_gpt2_create(&m, &tiny, 1, 8));
	loom_gpt2_init(m, 3);
	CHECK_OK(loom_gpt2_forward_backward(m, inp, tgt, 1, 8, 1.0f, &loss));
	float *own = loom_gpt2_grads(m);
	uint64_t sum = loom_checksum_f32(own, n);
	for (long k = 1; k < 1000; k++) {
		loom__fault_alloc_set(k);
		d = (loom_ddp_t *)&k; /* must become NULL on failure */
		int rc = loom_ddp_create(&d, comm, loom_gpt2_model(m), 0.001, 0.001);
		int hit = loom__fault_alloc_hit();
		loom__fault_alloc_set(0);
		if (rc == LOOM_OK) {
			CHECK(d != NULL);
			CHECK(loom_gpt2_grads(m) == loom_ddp_grads(d));
			CHECK_EQ(loom_checksum_f32(loom_ddp_grads(d), n), sum); /* the values came along */
			loom_ddp_destroy(d);
			CHECK(loom_gpt2_grads(m) == own);
			if (!hit)
				break; /* the whole path ran without a failure: every n before was covered */
			continue;  /* a failure the reducer recovered from (shared memory -> private memory) */
		}
		CHECK_MSG(hit, "allocation %ld: create failed (%d) without an injected failure: %s", k, rc, loom_errmsg());
		CHECK_ERR(rc, LOOM_ENOMEM);
		CHECK_CONTAINS(loom_errmsg(), "ddp: out of memory");
		CHECK(d == NULL);
		CHECK(loom_gpt2_grads(m) == own);
		CHECK_EQ(loom_checksum_f32(own, n), sum);
		failures++;
	}
	CHECK(failures >= 3); /* the struct, the bucket tables and the gradient storage */
	CHECK_OK(loom_gpt2_forward_backward(m, inp, tgt, 1, 8, 1.0f, &loss));
	loom_gpt2_destroy(m);
	loom_comm_destroy(comm);
	return 0;
}

/* The model's gradient view points at the reducer's storage from create to destroy; the model's own
 * buffer is never replaced or freed, and a pointer to it taken before create is valid after destroy. */
TEST(ddp_grad_view_not_taken_over)
{
	loom_comm_t *comm;
	loom_gpt2_t *m;
	loom_ddp_t *d;
	int inp[8] = {1, 2, 3, 4, 5, 6, 7, 8}, tgt[8] = {2, 3, 4, 5, 6, 7, 8, 9};
	float loss;
	size_t n = loom_gpt2_num_params(&tiny);
	CHECK_OK(loom_comm_init(&comm));
	CHECK_OK(loom_gpt2_create(&m, &tiny, 1, 8));
	loom_gpt2_init(m, 5);
	float *own = loom_gpt2_grads(m);
	CHECK_OK(loom_ddp_create(&d, comm, loom_gpt2_model(m), 25, 1));
	CHECK(loom_ddp_grads(d) != own);
	CHECK(loom_gpt2_grads(m) == loom_ddp_grads(d));
	loom_gpt2_zero_grad(m);
	CHECK_OK(loom_gpt2_forward_backward(m, inp, tgt, 1, 8, 1.0f, &loss));
	CHECK_OK(loom_ddp_wait(d, NULL));
	uint64_t sum = loom_checksum_f32(loom_ddp_grads(d), n);
	CHECK(sum != loom_checksum_f32(own, n)); /* backward wrote to the reducer's storage only */
	loom_ddp_destroy(d);
	CHECK(loom_gpt2_grads(m) == own);
	CHECK_EQ(loom_checksum_f32(own, n), sum);
	loom_gpt2_destroy(m);
	loom_comm_destroy(comm);
	return 0;
}

/* The strategy table: "ddp" (or NULL) with ZeRO 0 is the local strategy on one rank; other names and
 * ZeRO stages are LOOM_ENOTSUP naming what exists. */
TEST(strategy_selection)
{
	loom_gpt2_t *m;
	loom_strategy_t *s;
	char text[1024];
	CHECK_OK(loom_gpt2_create(&m, &tiny, 1, 8));
	loom_strategy_config_t c = {.name = NULL, .zero = 0, .model = loom_gpt2_model(m), .dp = NULL, .writer = 1,
	                            .adamw = loom_adamw_defaults(), .bucket_mb = 25};
	float *own = loom_gpt2_grads(m);
	CHECK_OK(loom__strategy_create(&s, &c));
	CHECK_STREQ(s->ops->name, "local");
	CHECK(s->grads == own && s->params == loom_gpt2_params(m)); /* the model's own buffers */
	CHECK_EQ(s->own_offset, 0);
	CHECK_EQ(s->own_count, loom_gpt2_num_params(&tiny));
	CHECK_EQ(s->dp_size, 1);
	loom__strategy_destroy(s);
	c.name = "fsdp";
	CHECK_ERR(loom__strategy_create(&s, &c), LOOM_ENOTSUP);
	CHECK(s == NULL);
	CHECK_CONTAINS(loom_errmsg(), "parallel strategy 'fsdp' does not exist (available: ddp)");
	c.name = "ddp", c.zero = 1;
	CHECK_ERR(loom__strategy_create(&s, &c), LOOM_ENOTSUP);
	CHECK_CONTAINS(loom_errmsg(), "ZeRO stage 1 shards the training state over the data-parallel ranks");
	loom__strategy_describe(text, sizeof text);
	CHECK_CONTAINS(text, "ddp zero=0 ranks=1: local: ");
	CHECK_CONTAINS(text, "ddp zero=0 ranks>1: ddp: ");
	CHECK(loom_gpt2_grads(m) == own);
	loom_gpt2_destroy(m);
	return 0;
}

/* ddp.c's invariant, through the strategy interface as the trainer drives it (accumulation 2, the
 * first micro-step without sync): after every step the parameters and AdamW state of all ranks are
 * bit-identical, and equal to what one process computes with the local strategy from the averaged
 * gradients; the averaged gradients are the mean of the ranks' local ones. */
static int strategy_invariant_rank(int rank, int nranks, void *arg)
{
	enum { STEPS = 3, ACCUM = 2 };
	loom_comm_t *comm;
	loom_gpt2_t *m, *ref;
	loom_strategy_t *s, *l;
	loom_strategy_stats_t st;
	int inp[16], tgt[16];
	float loss;
	size_t n = loom_gpt2_num_params(&tiny);
	(void)arg;
	CHECK_OK(loom_comm_init(&comm));
	CHECK_OK(loom_gpt2_create(&m, &tiny, 2, 8));
	CHECK_OK(loom_gpt2_create(&ref, &tiny, 2, 8));
	loom_gpt2_init(m, 21 + (uint64_t)rank); /* different on every rank: sync_params makes them rank 0's */
	loom_gpt2_init(ref, 21);
	loom_strategy_config_t c = {.name = "ddp", .model = loom_gpt2_model(m), .dp = comm, .writer = rank == 0,
	                            .adamw = loom_adamw_defaults(), .bucket_mb = 0.002};
	CHECK_OK(loom__strategy_create(&s, &c));
	CHECK_STREQ(s->ops->name, "ddp");
	CHECK(s->grads == loom_gpt2_grads(m));
	CHECK_EQ(s->dp_rank, rank);
	CHECK_EQ(s->dp_size, nranks);
	c.model = loom_gpt2_model(ref), c.dp = NULL;
	CHECK_OK(loom__strategy_create(&l, &c));
	CHECK_STREQ(l->ops->name, "local");
	CHECK_OK(s->ops->sync_params(s));
	CHECK_EQ(memcmp(s->params, l->params, n * sizeof(float)), 0);
	for (int step = 0; step < STEPS; step++) {
		loom_gpt2_zero_grad(m);
		for (int j = 0; j < ACCUM; j++) {
			batch(rank, step * ACCUM + j, inp, tgt, 16);
			s->ops->set_sync(s, j == ACCUM - 1);
			CHECK_OK(loom_gpt2_forward_backward(m, inp, tgt, 2, 8, 1.0f / ACCUM, &loss));
			CHECK_OK(s->ops->finish_grads(s, &st));
		}
		/* the reference process: the averaged gradients, the local strategy's norm and step */
		memcpy(l->grads, s->grads, n * sizeof(float));
		double norm_s, norm_l;
		CHECK_OK(s->ops->grad_norm(s, &norm_s));
		CHECK_OK(l->ops->grad_norm(l, &norm_l));
		CHECK_FEQ(norm_s, norm_l);
		float scale = loom_clip_scale(norm_s, 0.5);
		CHECK_OK(s->ops->optim_step(s, 1e-2f, scale));
		CHECK_OK(l->ops->optim_step(l, 1e-2f, scale));
		CHECK_EQ(memcmp(s->params, l->params, n * sizeof(float)), 0);
		CHECK_EQ(memcmp(s->opt.m, l->opt.m, n * sizeof(float)), 0);
		CHECK_EQ(memcmp(s->opt.v, l->opt.v, n * sizeof(float)), 0);
		CHECK_EQ(s->opt.step, step + 1);
		/* replicas: parameters and moments the same bits on every rank */
		uint64_t mine[3] = {loom_checksum_f32(s->params, n), loom_checksum_f32(s->opt.m, n),
		                    loom_checksum_f32(s->opt.v, n)}, all[3 * 8];
		CHECK_OK(loom_allgather(comm, mine, all, 3, LOOM_INT64));
		for (int r = 0; r < nranks; r++)
			for (int k = 0; k < 3; k++)
				CHECK_EQ(all[3 * r + k], mine[k]);
		CHECK_OK(s->ops->check_replicas(s));
	}
	loom__strategy_destroy(l);
	loom__strategy_destroy(s);
	loom_gpt2_destroy(ref);
	loom_gpt2_destroy(m);
	loom_comm_destroy(comm);
	return 0;
}

TEST(ddp_strategy_invariant_3ranks)
{
	return test_spawn(3, strategy_invariant_rank, NULL, 60, NULL);
}
