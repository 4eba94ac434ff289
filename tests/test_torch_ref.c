/* test_torch_ref.c: loom's trainer against PyTorch (tests/ref/gpt2_ref.py, run with /usr/bin/python3,
 * torch 1.13): the same initial weights (a raw float32 dump of loom's parameter buffer) and the same
 * batches (the shard file both read), 10 AdamW steps with weight decay, warmup + cosine schedule and
 * clipping on a tiny config, at T = 12 and T = 512. Per-step losses must agree within 1e-4 relative, and every gradient of
 * step 1 within 1e-4 of the tensor's largest magnitude. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/data.h"
#include "loom/gpt2.h"
#include "loom/train.h"
#include "test.h"

enum { STEPS = 10 };

typedef struct {
	float loss[STEPS + 1];
	double norm[STEPS + 1];
	float lr[STEPS + 1];
	float *grads1;
	size_t n;
} record_t;

static int record(void *ctx, loom_trainer_t *tr, const loom_step_metrics_t *m)
{
	record_t *r = ctx;
	r->loss[m->step] = m->loss, r->norm[m->step] = m->grad_norm, r->lr[m->step] = m->lr;
	if (m->step == 1) /* clipping is fused into AdamW, so the buffer still holds the raw gradients */
		memcpy(r->grads1, loom_model_grads(loom_trainer_model(tr)), r->n * sizeof(float));
	return 0;
}

/* One run at sequence length T (positions seq_len): the default T = 12 and, for the attention kernel's
 * blocks (many 64-row query blocks, several key blocks), T = 512; clip between its steps' gradient norms.
 * The data uses 61 ids: 0-60 in a uint16 shard, or with vocab > 65536 the last 61 ids of the vocabulary
 * in a uint32 shard (llm.c's llama-3 format, which the reference reads too). */
static int torch_case(int seq_len, int T, double clip, int vocab)
{
	enum { NTOK = 12000 };
	loom_gpt2_config_t mc = {.n_layer = 2, .n_head = 2, .n_embd = 32, .seq_len = seq_len, .vocab_size = vocab};
	const int B = 2;
	char dir[512], path[700], cmd[1400], out[4096];
	loom_gpt2_t *model = NULL;
	loom_trainer_t *tr = NULL;
	record_t r;
	size_t n = loom_gpt2_num_params(&mc);
	static uint16_t tok[NTOK];
	static uint32_t tok32[NTOK];
	uint32_t x = 12345, base = vocab > LOOM_SHARD16_MAX_VOCAB ? (uint32_t)vocab - 61u : 0u;
	FILE *f;
	int clipped = 0;
	double worst_loss = 0.0, worst_grad = 0.0;

	memset(&r, 0, sizeof r);
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	/* data: a noisy periodic sequence, so that there is something to learn */
	for (int i = 0; i < NTOK; i++) {
		x = x * 1664525u + 1013904223u;
		tok32[i] = base + ((x >> 24) % 8 == 0 ? (x >> 8) % 61u : (uint32_t)(i * 7) % 61u);
		tok[i] = (uint16_t)tok32[i];
	}
	snprintf(path, sizeof path, "%s/data.bin", dir);
	if (base)
		CHECK_OK(loom_shard_write32(path, tok32, NTOK));
	else
		CHECK_OK(loom_shard_write(path, tok, NTOK));
	CHECK_OK(loom_gpt2_create(&model, &mc, B, T));
	loom_gpt2_init(model, 42);
	/* GPT-2's init keeps pre-activations so small (std ~0.1) that GELU's tanh and erf forms, or a
	 * flat attention and a sharp one, are indistinguishable; larger MLP-in and QKV weights make the
	 * comparison sensitive to them. */
	for (int t = 0; t < loom_gpt2_num_tensors(&mc); t++) {
		loom_tensor_info_t ti;
		loom_gpt2_tensor_info(&mc, t, &ti);
		float k = strstr(ti.name, "mlp.c_fc.weight") ? 25.0f : strstr(ti.name, "attn.c_attn.weight") ? 8.0f : 1.0f;
		for (size_t i = 0; i < ti.numel; i++)
			loom_gpt2_params(model)[ti.offset + i] *= k;
	}
	snprintf(path, sizeof path, "%s/params.bin", dir);
	CHECK(test_write_file(path, loom_gpt2_params(model), n * sizeof(float)) == 0);

	loom_train_config_t tc = loom_train_defaults();
	snprintf(path, sizeof path, "%s/data.bin", dir);
	tc.train_data = path;
	tc.B = B, tc.T = T, tc.accum = 1;
	tc.lr = (loom_lr_schedule_t){.peak_lr = 3e-3, .warmup = 2, .total_steps = STEPS, .kind = LOOM_SCHED_COSINE,
	                             .min_lr_frac = 0.1};
	tc.adamw = (loom_adamw_config_t){.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
	tc.grad_clip = clip; /* some steps clip, some do not */
	snprintf(cmd, sizeof cmd, "%s/config.json", dir);
	f = fopen(cmd, "w");
	CHECK(f != NULL);
	fprintf(f, "{\"n_layer\": %d, \"n_head\": %d, \"n_embd\": %d, \"seq_len\": %d, \"vocab_size\": %d, \"B\": %d, "
	        "\"T\": %d, \"steps\": %d, \"lr\": %.17g, \"warmup\": %lld, \"schedule\": \"cosine\", \"min_lr_frac\": "
	        "%.17g, \"beta1\": %.9g, \"beta2\": %.9g, \"eps\": %.9g, \"weight_decay\": %.9g, \"grad_clip\": %.17g}\n",
	        mc.n_layer, mc.n_head, mc.n_embd, mc.seq_len, mc.vocab_size, B, T, STEPS, tc.lr.peak_lr, tc.lr.warmup,
	        tc.lr.min_lr_frac, tc.adamw.beta1, tc.adamw.beta2, tc.adamw.eps, tc.adamw.weight_decay, tc.grad_clip);
	CHECK(fclose(f) == 0);

	r.n = n;
	r.grads1 = malloc(n * sizeof(float));
	CHECK(r.grads1 != NULL);
	CHECK_OK(loom_trainer_create(&tr, &tc, loom_gpt2_model(model)));
	CHECK_OK(loom_trainer_run(tr, record, &r));
	loom_trainer_destroy(tr);

	snprintf(cmd, sizeof cmd, "OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 /usr/bin/python3 tests/ref/gpt2_ref.py %s",
	         dir);
	int st = test_run_cmd(cmd, out, sizeof out, 120);
	CHECK_MSG(st == 0, "'%s' exited with %d (run from the source root; needs python3-torch):\n%s", cmd, st, out);

	/* per-step loss, grad norm and learning rate */
	snprintf(path, sizeof path, "%s/torch_losses.txt", dir);
	f = fopen(path, "r");
	CHECK(f != NULL);
	for (int s = 1; s <= STEPS; s++) {
		double tl, tn, tlr;
		CHECK(fscanf(f, "%lf %lf %lf", &tl, &tn, &tlr) == 3);
		CHECK_MSG(fabs(r.loss[s] - tl) <= 1e-4 * fabs(tl), "step %d: loss %.9g, torch %.9g", s, r.loss[s], tl);
		CHECK_MSG(fabs(r.norm[s] - tn) <= 1e-4 * fabs(tn), "step %d: grad norm %.9g, torch %.9g", s, r.norm[s], tn);
		CHECK_MSG(fabs(r.lr[s] - tlr) <= 1e-7 * tlr, "step %d: lr %.9g, torch %.9g", s, r.lr[s], tlr);
		clipped += tn > tc.grad_clip;
		worst_loss = fmax(worst_loss, fabs(r.loss[s] - tl) / fabs(tl));
	}
	fclose(f);
	CHECK_MSG(clipped > 0 && clipped < STEPS, "%d of %d steps clipped (clip %g): the test should cover both cases",
	          clipped, STEPS, tc.grad_clip);
	/* the steps must move the model, or comparing their losses would prove little */
	CHECK_MSG(r.loss[STEPS] < r.loss[1] - 0.05f, "loss did not fall: %.6f -> %.6f", r.loss[1], r.loss[STEPS]);

	/* step 1's gradients, tensor by tensor */
	snprintf(path, sizeof path, "%s/torch_grads1.bin", dir);
	float *tg = malloc(n * sizeof(float));
	CHECK(tg != NULL);
	f = fopen(path, "rb");
	CHECK(f != NULL);
	CHECK_EQ(fread(tg, sizeof(float), n, f), n);
	fclose(f);
	for (int t = 0; t < loom_gpt2_num_tensors(&mc); t++) {
		loom_tensor_info_t ti;
		double mx = 0.0, worst = 0.0;
		size_t wi = 0;
		loom_gpt2_tensor_info(&mc, t, &ti);
		for (size_t i = ti.offset; i < ti.offset + ti.numel; i++)
			mx = fmax(mx, fabs(tg[i]));
		for (size_t i = ti.offset; i < ti.offset + ti.numel; i++)
			if (fabs(r.grads1[i] - tg[i]) > worst)
				worst = fabs(r.grads1[i] - tg[i]), wi = i;
		CHECK_MSG(mx > 0.0, "%s: torch's gradient is all zero", ti.name);
		worst_grad = fmax(worst_grad, worst / mx);
		CHECK_MSG(worst <= 1e-4 * mx, "%s[%zu]: loom %.9g, torch %.9g (diff %.3g > 1e-4 x max %.3g)", ti.name,
		          wi - ti.offset, r.grads1[wi], tg[wi], worst, mx);
	}
	fprintf(stderr, "  T %d vs torch: worst loss difference %.2g relative, worst step-1 gradient difference %.2g of "
	        "its tensor's max; %d of %d steps clipped\n", T, worst_loss, worst_grad, clipped, STEPS);
	free(tg);
	free(r.grads1);
	loom_gpt2_destroy(model);
	if (!getenv("LOOM_TEST_KEEP"))
		test_rmdir(dir);
	else
		fprintf(stderr, "  kept %s\n", dir);
	return 0;
}

TEST(torch_reference)
{
	return torch_case(16, 12, 2.0, 61);
}

TEST(torch_reference_t512)
{
	return torch_case(512, 512, 1.2, 61); /* its norms: 0.85 to 1.96 */
}

/* A vocabulary of 70000 ids read from uint32 shards. */
TEST(torch_reference_uint32_vocab)
{
	return torch_case(16, 12, 2.0, 70000);
}
