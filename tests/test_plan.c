/* test_plan.c: the planner (loom/plan.h): the textbook formulas with exact values (16 bytes per
 * parameter for fp32 AdamW, ZeRO 1/2/3 per-rank bytes, 6ND + attention, the GPipe bubble, ring bytes),
 * the search (meshes that do not divide are skipped; a model that fits nowhere says so), the JSON
 * schema, cluster-file errors, and the invariant of src/train/plan.c: the plan's model states and
 * activations equal what `loom train` reports for the same flags. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "loom/gpt2.h"
#include "loom/plan.h"
#include "loom/train.h"
#include "model/gpt2/model.h"
#include "parallel/pp.h"
#include "test.h"

/* A cluster with round figures (no measurement), big enough for anything. */
static loom_cluster_t test_cluster(void)
{
	loom_cluster_t c;
	memset(&c, 0, sizeof c);
	snprintf(c.name, sizeof c.name, "test");
	c.nodes = 1, c.ranks_per_node = 64, c.threads = 1;
	c.peak_flops_fp32 = 1e12, c.efficiency = 0.5, c.memory_bytes = 1e12, c.memory_bw = 1e10;
	c.intra_bw = 1e10, c.inter_bw = 1e9, c.overhead_bytes = 1000;
	return c;
}

static loom_plan_config_t tiny_config(int dp, int zero)
{
	loom_plan_config_t pc;
	memset(&pc, 0, sizeof pc);
	loom_gpt2_preset("tiny", &pc.model);
	pc.B = 4, pc.T = 64, pc.M = 1, pc.dp = dp, pc.zero = zero;
	return pc;
}

TEST(plan_ddp_fp32_adam_16_bytes_per_param)
{
	loom_cluster_t c = test_cluster();
	loom_plan_t p;
	for (int dp = 1; dp <= 4; dp *= 2) {
		loom_plan_config_t pc = tiny_config(dp, 0);
		CHECK_OK(loom_plan_estimate(&pc, &c, &p));
		double P = (double)loom_model_num_params(&pc.model);
		CHECK_FEQ(p.params, P);
		CHECK_FEQ(p.memory.params, 4 * P);
		CHECK_FEQ(p.memory.grads, 4 * P);
		CHECK_FEQ(p.memory.optimizer, 8 * P);
		CHECK_FEQ(p.memory.params + p.memory.grads + p.memory.optimizer, 16 * P);
		/* the total is every part plus the process overhead */
		CHECK_FEQ(p.memory.total, p.memory.params + p.memory.grads + p.memory.optimizer + p.memory.activations +
		                              p.memory.comm + p.memory.other + p.memory.data + p.memory.eval +
		                              p.memory.scratch + p.memory.overhead);
		CHECK_FEQ(p.memory.data, 8.0 * pc.B * pc.T); /* no shards given: the loader's batch alone */
	}
	return 0;
}

/* MuonAdamW on one rank: AdamW's m and v for every float outside the blocks' matrices, and per matrix
 * its momentum (rows x cols) and second moment (max(rows, cols)); the refusals loom train makes. */
TEST(plan_muon_state_bytes)
{
	loom_cluster_t c = test_cluster();
	loom_plan_t p;
	loom_plan_config_t pc = tiny_config(1, 0);
	pc.optimizer = LOOM_OPTIMIZER_MUON;
	CHECK_OK(loom_plan_estimate(&pc, &c, &p));
	double want = 0.0, P = (double)loom_model_num_params(&pc.model);
	int mats = 0;
	for (int i = 0; i < loom_model_num_tensors(&pc.model); i++) {
		loom_tensor_info_t ti;
		CHECK_OK(loom_model_tensor_info(&pc.model, i, &ti));
		if (ti.opt_group == LOOM_OPT_MATRIX)
			want += 4.0 * ((double)ti.rows * ti.cols + (ti.rows > ti.cols ? ti.rows : ti.cols)), mats++;
		else
			want += 8.0 * (double)ti.numel;
	}
	CHECK_EQ(mats, 4 * pc.model.n_layer); /* GPT-2's c_attn, attn.c_proj, c_fc, mlp.c_proj */
	CHECK_FEQ(p.memory.optimizer, want);
	CHECK(p.memory.optimizer < 8 * P); /* a matrix's state is 1 float and a vector per float, not AdamW's 2 */
	CHECK_FEQ(p.memory.params, 4 * P);
	pc.tp = 2;
	CHECK_ERR(loom_plan_estimate(&pc, &c, &p), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "--optimizer muon with --tp 2");
	pc = tiny_config(2, 1), pc.pp = 2, pc.M = 2, pc.optimizer = LOOM_OPTIMIZER_MUON;
	CHECK_ERR(loom_plan_estimate(&pc, &c, &p), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "--optimizer muon with --zero 1 and --pp 2");
	return 0;
}

TEST(plan_zero_stages_per_rank_bytes)
{
	loom_cluster_t c = test_cluster();
	loom_plan_t p;
	const int N = 4;
	loom_plan_config_t pc = tiny_config(N, 0);
	double P = (double)loom_model_num_params(&pc.model);
	/* loom's shards: rank r owns [r P / N, (r+1) P / N) rounded down to 16 floats; rank 0 and the last */
	double own0 = (double)(((unsigned long long)P / N) & ~15ull);
	double own_last = P - (double)(((unsigned long long)P * (N - 1) / N) & ~15ull);
	for (int zero = 1; zero <= 3; zero++) {
		pc.zero = zero;
		CHECK_OK(loom_plan_estimate(&pc, &c, &p));
		const loom_plan_memory_t *m0 = &p.memory_rank0, *m = &p.memory;
		double states0 = m0->params + m0->grads + m0->optimizer, states = m->params + m->grads + m->optimizer;
		if (zero == 1) { /* 8P + 8P/N: AdamW's m and v sharded */
			CHECK_FEQ(states0, 8 * P + 8 * own0);
			CHECK_FEQ(states, 8 * P + 8 * own_last);
		} else if (zero == 2) { /* 4P + 12P/N: the gradients too */
			CHECK_FEQ(states0, 4 * P + 12 * own0);
			CHECK_FEQ(states, 4 * P + 12 * own_last);
		} else { /* 16P/N: the parameters too (the gathered units are communication buffers) */
			CHECK_FEQ(states0, 16 * own0);
			CHECK_FEQ(states, 16 * own_last);
			CHECK(m->comm > 0);
		}
		/* the textbook formula to within the 16-float rounding of a shard (64 bytes x 16 per byte kind) */
		double theory = zero == 1 ? 8 * P + 8 * P / N : zero == 2 ? 4 * P + 12 * P / N : 16 * P / N;
		CHECK_NEAR(states0, theory, 16.0 * 64);
	}
	return 0;
}

TEST(plan_flops_6nd_plus_attention)
{
	loom_cluster_t c = test_cluster();
	loom_plan_t p;
	loom_plan_config_t pc = tiny_config(2, 0);
	pc.M = 3;
	CHECK_OK(loom_plan_estimate(&pc, &c, &p));
	double C = pc.model.n_embd, L = pc.model.n_layer, V = pc.model.vocab_size, T = pc.T;
	double N = L * 12 * C * C + V * C; /* the matmul weights (the lm head tied to wte) */
	/* attention over the causal triangle only: a query sees (T + 1) / 2 keys on average */
	CHECK_FEQ(p.flops_per_token, 6 * N + 12 * L * C * (T + 1) / 2);
	CHECK_FEQ(p.flops_per_token, 5115648.0); /* 6 x 819328 + 4 x 12 x 128 x 65 / 2 */
	/* the nominal count, the whole T x T: nanoGPT's 6N + 12 L C T */
	CHECK_FEQ(loom_model_flops_per_token_nominal(&pc.model, pc.T), 6 * N + 12 * L * C * T);
	CHECK_FEQ(loom_model_flops_per_token_nominal(&pc.model, pc.T), 5309184.0);
	double D = (double)pc.B * pc.T * pc.M * pc.dp; /* tokens per step */
	CHECK_FEQ(p.tokens_per_step, D);
	CHECK_FEQ(p.flops_per_step, 5115648.0 * D);
	/* MFU is the model's FLOPs (no recomputation) over the ranks' peak time */
	CHECK_NEAR(p.mfu, p.flops_per_step / (p.step_time_s * p.world * c.peak_flops_fp32), 1e-12);
	/* what a rank runs adds the fused attention's backward making the scores again: Q K^T, 2 of
	 * attention's 12 FLOPs per key and channel, 4 x 2 x 128 x 65 / 2 = 33280 per token */
	CHECK_NEAR(p.flops_per_rank_step, (5115648.0 + 33280.0) * D / pc.dp, 1e-12 * p.flops_per_rank_step);
	/* recomputing the blocks adds their forward (a third of their FLOPs) to what a rank runs */
	pc.act_ckpt = LOOM_ACT_CKPT_BLOCKS;
	loom_plan_t q;
	CHECK_OK(loom_plan_estimate(&pc, &c, &q));
	double blocks = 0;
	for (int l = 0; l < pc.model.n_layer; l++)
		blocks += loom_model_unit_flops(&pc.model, l, pc.T);
	CHECK_NEAR(q.flops_per_rank_step, (p.flops_per_token + 33280.0 + blocks / 3) * D / pc.dp,
	           1e-6 * q.flops_per_rank_step);
	CHECK_FEQ(q.flops_per_step, p.flops_per_step);
	CHECK(q.memory.activations < p.memory.activations);
	/* selective recomputation runs the attention's forward again (Q K^T and P V: 4 of its 12 FLOPs per
	 * key and channel, 66560 per token) */
	pc.act_ckpt = LOOM_ACT_CKPT_SELECTIVE;
	CHECK_OK(loom_plan_estimate(&pc, &c, &q));
	CHECK_NEAR(q.flops_per_rank_step, (5115648.0 + 33280.0 + 66560.0) * D / pc.dp, 1e-12 * q.flops_per_rank_step);
	return 0;
}

TEST(plan_gpipe_bubble)
{
	/* the simulator on equal stages: (p-1)/(m+p-1), exactly what the plan reports as the ideal */
	for (int P = 2; P <= 4; P++)
		for (int M = 1; M <= 8; M *= 2) {
			double f[32], b[32], span, bubble;
			for (int k = 0; k < P * M; k++)
				f[k] = 1.0, b[k] = 2.0;
			CHECK_OK(loom__pp_simulate(LOOM_PP_GPIPE, P, M, f, NULL, b, &span, &bubble));
			CHECK_NEAR(bubble, (double)(P - 1) / (M + P - 1), 1e-12);
			CHECK_NEAR(span, 3.0 * (M + P - 1), 1e-12);
			CHECK_OK(loom__pp_simulate(LOOM_PP_1F1B, P, M, f, NULL, b, &span, &bubble));
			CHECK_NEAR(bubble, (double)(P - 1) / (M + P - 1), 1e-12);
		}
	loom_cluster_t c = test_cluster();
	loom_plan_t p;
	loom_plan_config_t pc = tiny_config(1, 0);
	pc.pp = 2, pc.M = 4, pc.schedule_gpipe = 1;
	CHECK_OK(loom_plan_estimate(&pc, &c, &p));
	CHECK_FEQ(p.bubble_theory, 1.0 / 5.0);
	CHECK(p.bubble >= p.bubble_theory - 1e-9); /* unequal stages idle more, never less */
	CHECK(p.pp.bytes > 0 && p.pp.exposed_s > 0);
	/* GPipe keeps M micro-batches' activations on a stage, 1F1B at most P - s */
	loom_plan_t q;
	pc.schedule_gpipe = 0;
	CHECK_OK(loom_plan_estimate(&pc, &c, &q));
	CHECK(q.memory_rank0.activations < p.memory_rank0.activations);
	/* with tp 2 a stage sends the whole stream (each tp rank its copy), with sequence parallelism its
	 * rows: half the transfers' bytes (the tied wte's sum, the rest of pp.bytes, is the same) */
	loom_plan_t t, ts;
	pc.tp = 2;
	CHECK_OK(loom_plan_estimate(&pc, &c, &t));
	pc.sequence_parallel = 1;
	CHECK_OK(loom_plan_estimate(&pc, &c, &ts));
	CHECK_FEQ(t.pp.bytes - ts.pp.bytes, 2.0 * pc.M * 4.0 * pc.B * pc.T * loom_model_stream_width(&pc.model) / 2);
	return 0;
}

/* Interleaved 1F1B in the plan: the ideal (P-1)/(V M+P-1), the bubble simulated over the P V global
 * stages (below 1F1B's), a rank's activations as its chunks' stage models hold them (rank 0 of pp 2,
 * V 2, M 4: up to 4 micro-batches of chunk 0 and 2 of chunk 1), and loom_pp_check's conditions. */
TEST(plan_interleaved)
{
	loom_cluster_t c = test_cluster();
	loom_plan_t p, q;
	loom_plan_config_t pc = tiny_config(1, 0);
	pc.pp = 2, pc.M = 4;
	CHECK_OK(loom_plan_estimate(&pc, &c, &q)); /* 1f1b */
	pc.virtual_stages = 2;
	CHECK_OK(loom_plan_estimate(&pc, &c, &p));
	CHECK_FEQ(p.bubble_theory, 1.0 / 9.0);
	CHECK(p.bubble < q.bubble);
	/* every chunk's boundary: twice the transfers (4 B T width bytes each way per micro-batch) */
	CHECK_FEQ(p.pp.bytes - q.pp.bytes, 2.0 * pc.M * 4.0 * pc.B * pc.T * loom_model_stream_width(&pc.model));
	int lo[5], hrows;
	CHECK_OK(loom_pp_stages(&pc.model, pc.B, pc.T, 4, 0.0, lo, &hrows));
	CHECK(lo[0] == 0 && lo[1] == 1 && lo[2] == 2 && lo[3] == 3 && lo[4] == 4 && hrows == 0);
	double want = 0.0;
	for (int ch = 0; ch < 2; ch++) {
		loom_model_opts_t o = {.B = pc.B, .T = pc.T, .arenas = ch ? 2 : 4, .layer_lo = lo[2 * ch],
		                       .layer_hi = lo[2 * ch + 1]};
		loom_model_act_bytes_t a;
		CHECK_OK(loom_model_act_bytes(&pc.model, &o, &a));
		want += (double)a.total;
	}
	CHECK_FEQ(p.memory_rank0.activations, want);
	pc.M = 3;
	CHECK_ERR(loom_plan_estimate(&pc, &c, &p), LOOM_EINVAL);
	CHECK_STREQ(loom_errmsg(), "plan: pipeline: --pp-schedule interleaved runs the micro-batches in groups of --pp 2, "
	            "so --micro-batches 3 must be a multiple of 2 (e.g. 4)");
	pc.M = 4, pc.schedule_gpipe = 1;
	CHECK_ERR(loom_plan_estimate(&pc, &c, &p), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "--virtual-stages 2 needs --pp-schedule interleaved");
	pc.schedule_gpipe = 0, pc.virtual_stages = 3; /* 6 chunks of 4 layers */
	CHECK_ERR(loom_plan_estimate(&pc, &c, &p), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "every chunk needs at least one layer");
	return 0;
}

TEST(plan_ring_allreduce_bytes)
{
	CHECK_FEQ(loom_plan_ring_allreduce_bytes(1000, 4), 1500);
	CHECK_FEQ(loom_plan_ring_allreduce_bytes(1000, 2), 1000);
	CHECK_FEQ(loom_plan_ring_allreduce_bytes(1000, 1), 0);
	loom_cluster_t c = test_cluster();
	loom_plan_t p;
	loom_plan_config_t pc = tiny_config(4, 0);
	CHECK_OK(loom_plan_estimate(&pc, &c, &p));
	double P = (double)loom_model_num_params(&pc.model);
	/* DDP: every gradient byte once, in buckets: 2 (N-1)/N x 4P per rank */
	CHECK_NEAR(p.dp.bytes, 2.0 * 3 / 4 * 4 * P, 1e-6);
	CHECK(p.dp.exposed_s <= p.dp.time_s + 1e-12);
	pc.grad_reduce_bf16 = 1; /* half the bytes */
	CHECK_OK(loom_plan_estimate(&pc, &c, &p));
	CHECK_NEAR(p.dp.bytes, 2.0 * 3 / 4 * 2 * P, 1e-6);
	/* tp: 4 all-reduces of B T C floats per block and micro-batch, plus the embedding's and the head's */
	pc = tiny_config(1, 0);
	pc.tp = 2;
	CHECK_OK(loom_plan_estimate(&pc, &c, &p));
	double n = 4.0 * pc.B * pc.T * pc.model.n_embd;
	CHECK_NEAR(p.tp.bytes, (4.0 * pc.model.n_layer + 2) * loom_plan_ring_allreduce_bytes(n, 2), 1e-6);
	CHECK_FEQ(p.tp.exposed_s, p.tp.time_s);
	return 0;
}

TEST(plan_search_skips_non_dividing_meshes)
{
	loom_cluster_t c = test_cluster();
	loom_plan_config_t pc = tiny_config(1, 0); /* tiny: 4 heads, 4 layers */
	pc.M = 4;
	loom_plan_t *out = malloc(sizeof *out * 1000);
	int n, total, composed = 0, interleaved = 0, sp = 0, cp = 0;
	CHECK(out);
	CHECK_OK(loom_plan_search(&pc, &c, 6, out, 1000, &n, &total));
	CHECK(n > 0 && n == total);
	for (int k = 0; k < n; k++) {
		const loom_plan_config_t *q = &out[k].cfg;
		if (q->virtual_stages > 1) { /* interleaved: only what it can run */
			CHECK(q->pp > 1 && !q->schedule_gpipe && q->virtual_stages <= 4);
			CHECK_EQ(q->M % q->pp, 0);
			CHECK(q->pp * q->virtual_stages <= pc.model.n_layer);
			interleaved++;
		}
		if (q->sequence_parallel) {
			CHECK(q->tp > 1);
			sp++;
		}
		CHECK_EQ(q->dp * q->cp * q->tp * q->pp, 6);
		CHECK_MSG(q->tp == 1 || q->tp == 2, "tp %d does not divide 4 heads", q->tp);
		CHECK_MSG(q->dp != 3 && q->dp != 6, "dp %d does not divide 4 micro-batches", q->dp);
		CHECK_MSG(q->cp == 1 || q->cp == 2, "cp %d: T = 64 is not 2 cp chunks", q->cp); /* not 3, 6 */
		CHECK_EQ(q->dp * q->M, 4); /* tokens per step kept */
		CHECK(q->zero == 0 || q->dp * q->cp > 1); /* ZeRO over dp x cp, with several ranks there */
		cp += q->cp > 1;
		if (k)
			CHECK(out[k].step_time_s >= out[k - 1].step_time_s);
		composed += q->zero > 0 && (q->tp > 1 || q->pp > 1);
	}
	CHECK(composed > 0); /* ZeRO 1-3 on dp 2 x pp 3 among them */
	CHECK(sp > 0); /* tp 2 with and without sequence parallelism */
	CHECK(cp > 0); /* cp 2 (x tp 1 or 3 or x pp 3) among them */
	CHECK_EQ(interleaved, 0); /* no pp of 6 ranks divides M (pp 3: M 4 or 2) with V pp <= 4 layers */
	/* 4 ranks: pp 2 runs interleaved with V 2 (M 4 on dp 1, M 2 on dp 2), never V 3 or 4 (> 4 layers) */
	CHECK_OK(loom_plan_search(&pc, &c, 4, out, 1000, &n, &total));
	for (int k = 0; k < n; k++)
		if (out[k].cfg.virtual_stages > 1) {
			CHECK(out[k].cfg.pp == 2 && out[k].cfg.virtual_stages == 2 && !out[k].cfg.schedule_gpipe);
			interleaved++;
		}
	CHECK(interleaved > 0);
	/* 5 ranks: no tp divides the heads but 1, no pp but 1 (4 layers), dp 5 does not divide M = 4 */
	CHECK_OK(loom_plan_search(&pc, &c, 5, out, 1000, &n, &total));
	CHECK_EQ(total, 0);
	free(out);
	return 0;
}

TEST(plan_fits_nowhere)
{
	char cmd[1024], out[8192];
	loom_cluster_t c = test_cluster();
	c.memory_bytes = 1e6; /* 1 MB per rank: tiny needs more than that anywhere */
	loom_plan_config_t pc = tiny_config(1, 0);
	loom_plan_t out1[256];
	int n, total;
	CHECK_OK(loom_plan_search(&pc, &c, 4, out1, 256, &n, &total));
	CHECK(total > 0);
	CHECK_EQ(n, 0);
	CHECK(!out1[0].fits);
	snprintf(cmd, sizeof cmd, "%s plan --model gpt2 --cluster a100-8x80g --search --ranks 8 --n-layer 96 "
	         "--n-embd 12288 --n-head 96 --n-positions 2048 --seq-len 2048 --batch-size 8", test_loom_bin());
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 60), 1);
	CHECK_CONTAINS(out, "fits nowhere");
	return 0;
}

TEST(plan_json_schema)
{
	char cmd[1024], out[16384];
	snprintf(cmd, sizeof cmd, "%s plan --model tiny --seq-len 64 --nproc 4 --tp 2 --cluster cpu-node --tokens 1e6 "
	         "--json", test_loom_bin());
	int st = test_run_cmd(cmd, out, sizeof out, 60);
	CHECK_MSG(st == 0, "exit %d: %s", st, out);
	static const char *const keys[] = {
		"\"params\":", "\"memory_bytes\":{\"params\":", "\"grads\":", "\"optimizer\":", "\"activations\":",
		"\"total\":", "\"flops_per_token\":", "\"step_time_s\":", "\"tokens_per_s\":", "\"mfu\":", "\"bubble\":",
		"\"comm_bytes_per_step\":{\"dp\":", "\"tp\":", "\"pp\":", "\"wall_s\":", "\"cost\":", "\"dp\":2", "\"tp\":2"};
	for (size_t k = 0; k < sizeof keys / sizeof *keys; k++)
		CHECK_CONTAINS(out, keys[k]);
	CHECK(out[0] == '{');
	snprintf(cmd, sizeof cmd, "%s plan --model tiny --virtual-stages 2", test_loom_bin());
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 60), 2);
	CHECK_CONTAINS(out, "loom plan: pipeline: --virtual-stages 2 needs --pp-schedule interleaved");
	snprintf(cmd, sizeof cmd, "%s plan --model tiny --sequence-parallel", test_loom_bin());
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 60), 2);
	CHECK_CONTAINS(out, "--sequence-parallel shards the sequence over the tensor-parallel ranks: it needs --tp 2");
	/* a train command line plans as it is (its data, LR and logging flags ignored) */
	snprintf(cmd, sizeof cmd, "%s plan --train-data 'x/*.bin' --steps 10 --lr 1e-3 --log l.jsonl --model tiny "
	         "--batch-size 2 --seq-len 32 --nproc 2 --zero 1 --schedule cosine --cluster cpu-node", test_loom_bin());
	st = test_run_cmd(cmd, out, sizeof out, 60);
	CHECK_MSG(st == 0, "exit %d: %s", st, out);
	CHECK_CONTAINS(out, "mesh: dp 2 x tp 1 x pp 1 = 2 ranks; ZeRO 1");
	return 0;
}

static int write_text(const char *path, const char *text)
{
	return test_write_file(path, text, strlen(text));
}

TEST(plan_cluster_file_errors)
{
	char dir[512], path[700];
	loom_cluster_t c;
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	snprintf(path, sizeof path, "%s/c.json", dir);
	CHECK_ERR(loom_cluster_load(path, &c), LOOM_ENOENT);
	CHECK_CONTAINS(loom_errmsg(), path);

	CHECK_OK(write_text(path, "{\"nodes\": 2, \"ranks_per_node\": 8,"));
	CHECK_ERR(loom_cluster_load(path, &c), LOOM_EFORMAT);
	CHECK_CONTAINS(loom_errmsg(), "not JSON");

	CHECK_OK(write_text(path, "{\"nodes\": \"two\", \"ranks_per_node\": 8}"));
	CHECK_ERR(loom_cluster_load(path, &c), LOOM_EFORMAT);
	CHECK_CONTAINS(loom_errmsg(), path);
	CHECK_CONTAINS(loom_errmsg(), "key 'nodes': expected an integer >= 1, got string");

	CHECK_OK(write_text(path, "{\"nodes\": 2, \"ranks_per_node\": 8, \"peak_flops_fp32\": 1e14, \"memory_bytes\": "
	                          "8e10, \"intra_bw\": 3e11, \"inter_bw\": 2.5e10, \"efficiency\": 1.5}"));
	CHECK_ERR(loom_cluster_load(path, &c), LOOM_EFORMAT);
	CHECK_CONTAINS(loom_errmsg(), "key 'efficiency': expected a fraction in (0, 1], got 1.5");

	CHECK_OK(write_text(path, "{\"nodes\": 2, \"ranks_per_node\": 8, \"peak_flop\": 1e14}"));
	CHECK_ERR(loom_cluster_load(path, &c), LOOM_EFORMAT);
	CHECK_CONTAINS(loom_errmsg(), "unknown key 'peak_flop'");

	CHECK_OK(write_text(path, "{\"nodes\": 2, \"ranks_per_node\": 8}"));
	CHECK_ERR(loom_cluster_load(path, &c), LOOM_EFORMAT);
	CHECK_CONTAINS(loom_errmsg(), "key 'peak_flops_fp32' is missing");

	CHECK_OK(write_text(path, "{\"profile\": \"tpu\"}"));
	CHECK_ERR(loom_cluster_load(path, &c), LOOM_EFORMAT);
	CHECK_CONTAINS(loom_errmsg(), "key 'profile': cluster profile 'tpu' is not one of");

	CHECK_OK(write_text(path, "{\"profile\": \"h100-8x\", \"nodes\": 4, \"price_rank_hour\": 2.0}"));
	CHECK_OK(loom_cluster_load(path, &c));
	CHECK_EQ(c.nodes, 4);
	CHECK_EQ(c.ranks_per_node, 8);
	CHECK_FEQ(c.price_rank_hour, 2.0);
	CHECK_FEQ(c.peak_flops_bf16, 989e12);

	CHECK_OK(write_text(path, "{\"nodes\": 2, \"ranks_per_node\": 4, \"peak_flops_fp32\": 1e12, \"memory_bytes\": "
	                          "1e10, \"intra_bw\": 1e10, \"inter_bw\": 1e9}"));
	CHECK_OK(loom_cluster_load(path, &c));
	CHECK_EQ(c.nodes * c.ranks_per_node, 8);
	CHECK_STREQ(c.name, "c.json");
	/* the CLI names the file too */
	char cmd[1024], out[4096];
	snprintf(path, sizeof path, "%s/bad.json", dir);
	CHECK_OK(write_text(path, "[1, 2]"));
	snprintf(cmd, sizeof cmd, "%s plan --model tiny --cluster %s", test_loom_bin(), path);
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 30), 2);
	CHECK_CONTAINS(out, "bad.json: expected one JSON object, got array");
	test_rmdir(dir);
	return 0;
}

/* The number after "key": in text (0 when absent). */
static double json_num(const char *text, const char *key)
{
	const char *p = strstr(text, key);
	return p ? strtod(p + strlen(key), NULL) : 0.0;
}

TEST(plan_memory_equals_train)
{
	char dir[512], cmd[2048], out[65536], path[700];
	const char *loom = test_loom_bin();
	static const struct {
		const char *flags;
	} runs[] = {
		{"--nproc 2 --zero 2"},
		{"--nproc 2 --pp 2 --micro-batches 2 --schedule gpipe --activation-checkpointing blocks"},
		{"--nproc 2 --tp 2 --activation-checkpointing selective"},
		{"--nproc 2 --tp 2 --sequence-parallel"},
		{"--nproc 1"},
		/* MuonAdamW: its matrices' state instead of AdamW's (replicated: the owned matrices and the
		 * staging of all; ZeRO: the range moved to a tensor boundary), on one rank, dp 2 with ZeRO 0-3
		 * and a pipeline stage's tensors */
		{"--optimizer muon --nproc 1"},
		{"--optimizer muon --nproc 2"},
		{"--optimizer muon --nproc 2 --zero 1"},
		{"--optimizer muon --nproc 2 --zero 2"},
		{"--optimizer muon --nproc 2 --zero 3"},
		{"--optimizer muon --nproc 2 --pp 2 --micro-batches 2"},
		/* context parallel: a rank's T/cp positions and the attention's gather scratch; ZeRO over dp x cp */
		{"--nproc 2 --cp 2"},
		{"--nproc 4 --cp 2 --zero 3 --activation-checkpointing selective"},
	};
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(test_make_token_data(dir, 257, 4000));
	for (size_t k = 0; k < sizeof runs / sizeof *runs; k++) {
		snprintf(path, sizeof path, "%s/log%zu.jsonl", dir, k);
		snprintf(cmd, sizeof cmd, "%s train --train-data '%s/train_*.bin' --model tiny --batch-size 2 --seq-len 32 "
		         "--steps 1 --threads 1 --peak-flops 1e10 --log %s %s", loom, dir, path, runs[k].flags);
		int st = test_run_cmd(cmd, out, sizeof out, 120);
		CHECK_MSG(st == 0, "exit %d: %s", st, out);
		FILE *f = fopen(path, "r");
		CHECK(f);
		size_t n = fread(out, 1, sizeof out - 1, f);
		fclose(f);
		out[n] = 0;
		const char *ab = strstr(out, "\"activation_bytes\":"); /* (the config's plan has totals too) */
		CHECK(ab);
		double act = json_num(ab, "\"total\":"), states = json_num(out, "\"mem_model_states_bytes\":");
		CHECK(act > 0 && states > 0);
		/* the same flags, planned */
		char pcmd[2048], pout[16384];
		snprintf(pcmd, sizeof pcmd, "%s plan --model tiny --batch-size 2 --seq-len 32 --cluster cpu-node --json %s",
		         loom, runs[k].flags);
		st = test_run_cmd(pcmd, pout, sizeof pout, 60);
		CHECK_MSG(st == 0, "exit %d: %s", st, pout);
		const char *r0 = strstr(pout, "\"memory_bytes_rank0\":");
		CHECK(r0);
		double p_states = json_num(r0, "\"params\":") + json_num(r0, "\"grads\":") + json_num(r0, "\"optimizer\":");
		CHECK_MSG(p_states == states, "%s: plan's model states %.0f, train's %.0f", runs[k].flags, p_states, states);
		CHECK_MSG(json_num(r0, "\"activations\":") == act, "%s: plan's activations %.0f, train's %.0f", runs[k].flags,
		          json_num(r0, "\"activations\":"), act);
	}
	test_rmdir(dir);
	return 0;
}

/* The keys a causal attention with window W sees over a sequence of T queries, one query at a time: the
 * reference for loom_model_attn_keys' closed form. */
static double keys_by_query(int T, int W)
{
	double n = 0;
	for (int t = 0; t < T; t++)
		n += (t < W ? t : W) + 1; /* keys max(0, t - W)..t */
	return n;
}

/* Attention FLOPs as the kernel must do them: each query's keys inside the causal mask and its window,
 * 12 per key and channel of the query heads (fwd + bwd), averaged over the T positions; GPT-2's counts
 * (W >= T: the causal triangle) against numbers computed by hand, the nominal 6N + 12 L C T unchanged. */
TEST(plan_attn_flops_causal_and_windowed)
{
	static const int Ts[] = {1, 2, 3, 7, 16, 64, 100, 2048};
	for (size_t i = 0; i < sizeof Ts / sizeof *Ts; i++) {
		int T = Ts[i], Ws[] = {0, 1, 2, T / 2, T - 2, T - 1, T, 2 * T + 5};
		for (size_t j = 0; j < sizeof Ws / sizeof *Ws; j++)
			if (Ws[j] >= 0)
				CHECK_MSG(loom_model_attn_keys(T, Ws[j]) == keys_by_query(T, Ws[j]), "T %d, W %d: %.17g, by query %.17g",
				          T, Ws[j], loom_model_attn_keys(T, Ws[j]), keys_by_query(T, Ws[j]));
	}
	CHECK_FEQ(loom_model_attn_keys(1, 0), 1.0);       /* one query, itself */
	CHECK_FEQ(loom_model_attn_keys(5, 0), 5.0);       /* W = 0: every query sees only itself */
	CHECK_FEQ(loom_model_attn_keys(16, 8), 108.0);    /* 1 + 2 + ... + 9, then 7 x 9 */
	CHECK_FEQ(loom_model_attn_keys(16, 15), 136.0);   /* the triangle 16 x 17 / 2 */
	CHECK_FEQ(loom_model_attn_keys(16, 1000), 136.0); /* a window beyond T changes nothing */
	CHECK_FEQ(loom_model_attn_keys(2048, 1024), 1574400.0); /* 1025 x 3072 / 2 */
	CHECK_FEQ(loom_model_attn_keys(2048, 2048), 2098176.0); /* 2048 x 2049 / 2 */
	CHECK_FEQ(loom_model_attn_keys(65536, 65536), 2147516416.0); /* past 2^31: no int overflow */
	CHECK_FEQ(loom_model_attn_keys(0, 4), 0.0);
	CHECK_FEQ(loom_model_attn_keys(4, -1), 0.0);
	CHECK_FEQ(loom_model_attn_flops(64, 16, 8), 5184.0); /* 12 x 64 x 108 / 16 */
	CHECK_FEQ(loom_model_attn_flops(64, 0, 8), 0.0);

	/* GPT-2 `small` (L6 C384 V50257) at T = 256: 6 x (6 x 12 C^2 + V C) = 179493120, attention
	 * 6 x 12 x 384 x 257 / 2 = 3552768 (nominal 6 x 12 x 384 x 256 = 7077888) */
	loom_model_config_t g;
	CHECK_OK(loom_gpt2_preset("small", &g));
	CHECK_FEQ(loom_model_flops_per_token(&g, 256), 183045888.0);
	CHECK_FEQ(loom_gpt2_flops_per_token(&g, 256), 183045888.0);
	CHECK_FEQ(loom_model_flops_per_token_nominal(&g, 256), 186571008.0);
	CHECK_FEQ(loom_model_block_attn_flops(&g, 0, 256), 592128.0);
	CHECK_FEQ(loom_model_block_attn_flops(&g, 5, 256), 592128.0);
	CHECK_FEQ(loom_model_block_attn_flops(&g, 6, 256), 0.0); /* the head has no attention */
	CHECK_FEQ(loom_model_unit_flops(&g, 0, 256), 72.0 * 384 * 384 + 592128.0);
	/* T = 1: one key a query, the same in both counts: 12 C per layer */
	CHECK_FEQ(loom_model_flops_per_token(&g, 1), 179493120.0 + 6 * 12 * 384);
	CHECK_FEQ(loom_model_flops_per_token_nominal(&g, 1), 179493120.0 + 6 * 12 * 384);
	/* T = 1024 (GPT-2's context) on gpt2 (L12 C768): 12 x 12 x 768 x 1025 / 2 */
	CHECK_OK(loom_gpt2_preset("gpt2", &g));
	CHECK_FEQ(loom_model_flops_per_token(&g, 1024) - loom_model_flops_per_token(&g, 0), 56678400.0);
	CHECK_FEQ(loom_model_flops_per_token_nominal(&g, 1024) - loom_model_flops_per_token(&g, 0), 113246208.0);

	/* the plan: a tp rank runs its heads' share, 1/tp of the count like the rest */
	loom_cluster_t c = test_cluster();
	loom_plan_t p, q;
	loom_plan_config_t pc = tiny_config(1, 0);
	CHECK_OK(loom_plan_estimate(&pc, &c, &p));
	pc.tp = 2;
	CHECK_OK(loom_plan_estimate(&pc, &c, &q));
	CHECK_FEQ(q.flops_per_token, p.flops_per_token);
	CHECK_FEQ(q.flops_per_rank_step, p.flops_per_rank_step / 2);
	return 0;
}

TEST(plan_gpt2_unit_flops_equal_the_table)
{
	/* GPT-2's closed-form block FLOPs (what the pipeline partition and the planner ask for) are the
	 * parameter table's count */
	static const char *const presets[] = {"tiny", "small", "gpt2"};
	for (size_t k = 0; k < 3; k++) {
		loom_model_config_t c;
		CHECK_OK(loom_gpt2_preset(presets[k], &c));
		for (int T = 1; T <= c.seq_len; T *= 4)
			for (int u = -1; u <= c.n_layer; u++)
				CHECK_FEQ(loom_model_unit_flops(&c, u, T), loom__model_unit_flops_table(&c, u, T));
	}
	return 0;
}

TEST(plan_prediction_in_log_and_plot)
{
	char dir[512], path[700], svg[700], cmd[2048], out[8192];
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	snprintf(path, sizeof path, "%s/log.jsonl", dir);
	snprintf(svg, sizeof svg, "%s/p.svg", dir);
	/* a log whose config record carries the plan's prediction (as loom train writes it) */
	CHECK_OK(write_text(path, "{\"config\":{\"model\":{\"n_layer\":2,\"n_embd\":64},\"tokens_per_step\":1000,\"lr\":0.001,"
	                          "\"world\":1,\"predicted_step_s\":0.5,\"predicted_memory_bytes\":1000000}}\n"
	                          "{\"step\":1,\"loss\":5.0,\"tokens_per_s\":1900}\n"
	                          "{\"step\":2,\"loss\":4.5,\"tokens_per_s\":2100,\"val_loss\":4.6}\n"
	                          "{\"step\":3,\"loss\":4.0,\"tokens_per_s\":2000}\n"
	                          "{\"step\":4,\"loss\":3.8,\"tokens_per_s\":2000,\"val_loss\":3.9}\n"));
	snprintf(cmd, sizeof cmd, "%s plot %s -o %s", test_loom_bin(), path, svg);
	int st = test_run_cmd(cmd, out, sizeof out, 30);
	CHECK_MSG(st == 0, "exit %d: %s", st, out);
	FILE *f = fopen(svg, "r");
	CHECK(f);
	size_t n = fread(out, 1, sizeof out - 1, f);
	fclose(f);
	out[n] = 0;
	CHECK_CONTAINS(out, "stroke-dasharray=\"2,3\""); /* 1000 tokens / 0.5 s = 2000 tokens/s, dotted */
	CHECK_CONTAINS(out, "stroke-dasharray=\"6,4\""); /* the validation line through steps 2 and 4 */
	test_rmdir(dir);
	return 0;
}

/* ---- one prediction: loom train's is loom plan's -------------------------------------------------- */

/* A peak cache of round figures in dir (XDG_CACHE_HOME for this process and the commands it runs), for
 * 1 and 2 threads per rank, both dtypes and the copy bandwidths: the plans below measure nothing, and
 * every program that reads this cache sets the machine up alike. */
static int fake_peak_cache(const char *dir)
{
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	if (setenv("XDG_CACHE_HOME", dir, 1) != 0)
		return 1;
	for (int t = 1; t <= 2; t++)
		if (loom_peak_cache_put_kind(LOOM_PEAK_HW_FP32, t, 100e9 * t) || loom_peak_cache_put_kind(LOOM_PEAK_GEMM_FP32, t, 90e9 * t) ||
		    loom_peak_cache_put_kind(LOOM_PEAK_HW_BF16, t, 200e9 * t) || loom_peak_cache_put_kind(LOOM_PEAK_GEMM_BF16, t, 150e9 * t))
			return 1;
	if (loom_peak_cache_put_kind(LOOM_PEAK_MEM_BW, 1, 12e9) ||
	    (cpus > 1 && loom_peak_cache_put_kind(LOOM_PEAK_MEM_BW, (int)cpus, 16e9)))
		return 1;
	/* the kernels' rates, for the loom binary the tests run (its key: loom_calib_key_of) */
	unsigned long key = loom_calib_key_of(test_loom_bin());
	char name[64];
	for (int t = 1; t <= 2; t++) {
		for (int k = 0; k < LOOM_CALIB_WIDTHS; k++) {
			snprintf(name, sizeof name, "mm_fp32_w%d", loom_calib_width(k));
			if (loom_calib_append(name, t, key, 60e9 * t, 1.0))
				return 1;
			snprintf(name, sizeof name, "mm_bf16_w%d", loom_calib_width(k));
			if (loom_calib_append(name, t, key, 120e9 * t, 1.0))
				return 1;
		}
		for (int d = 0; d < LOOM_CALIB_HEAD_DIMS; d++)
			for (int q = 0; q < LOOM_CALIB_SEQS; q++) {
				snprintf(name, sizeof name, "attn_d%d_t%d", loom_calib_head_dim(d), loom_calib_seq(q));
				if (loom_calib_append(name, t, key, 30e9 * t, 1.0))
					return 1;
			}
		if (loom_calib_append("adamw", t, key, 4e8, 1.0))
			return 1;
	}
	return 0;
}

/* The JSON object after "key": in text, copied into out (its braces matched; strings hold none). */
static int json_object(const char *text, const char *key, char *out, size_t cap)
{
	const char *p = strstr(text, key), *q;
	int depth = 0;
	if (!p)
		return 1;
	p += strlen(key);
	for (q = p; *q; q++) {
		depth += *q == '{' ? 1 : *q == '}' ? -1 : 0;
		if (depth == 0)
			break;
	}
	if (*q != '}' || (size_t)(q - p + 1) >= cap)
		return 1;
	memcpy(out, p, (size_t)(q - p + 1));
	out[q - p + 1] = 0;
	return 0;
}

static int read_text(const char *path, char *buf, size_t cap)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return 1;
	size_t n = fread(buf, 1, cap - 1, f);
	fclose(f);
	buf[n] = 0;
	return 0;
}

/* The trainer's prediction (its start-up line, the "plan" of its log's config record) is `loom plan
 * --json`'s for the same flags, byte for byte: meshes dp 2, tp 2, pp 2 and ZeRO, both families, bf16,
 * MuonAdamW, evaluation on. And the summary's medians are of the steps after warm-up. */
TEST(plan_train_same_prediction)
{
	char dir[512], cache[700], val[700], cmd[4096], log[800], out[65536], pout[16384], a[16384], b[16384];
	const char *loom = test_loom_bin();
	static const char *const runs[] = {
		"--model tiny --nproc 2",
		"--model tiny --nproc 2 --tp 2 --sequence-parallel --activation-checkpointing blocks",
		"--model tiny --nproc 2 --pp 2 --micro-batches 2 --pp-schedule gpipe",
		"--model tiny --nproc 2 --zero 2 --grad-reduce-dtype bf16",
		"--arch nanochat --depth 2 --head-dim 64 --nproc 2 --zero 1 --optimizer muon",
		"--arch nanochat --depth 2 --head-dim 64 --nproc 2 --tp 2",
		"--arch nanochat --depth 2 --head-dim 64 --nproc 2 --pp 2 --micro-batches 2",
		"--arch nanochat --depth 2 --head-dim 64 --dtype bf16 --steps 6",
		"--model tiny --nproc 2 --cp 2", /* context parallel: T/cp positions per rank, the ring's transfers */
		"--arch nanochat --depth 2 --head-dim 64 --nproc 4 --cp 2 --zero 3",
	};
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	snprintf(cache, sizeof cache, "%s/cache", dir);
	snprintf(val, sizeof val, "%s/val", dir);
	CHECK_OK(fake_peak_cache(cache));
	CHECK_OK(test_make_token_data(dir, 257, 40000));
	CHECK(mkdir(val, 0755) == 0);
	CHECK_OK(test_make_token_data(val, 257, 20000));
	for (size_t k = 0; k < sizeof runs / sizeof *runs; k++) {
		const char *flags = runs[k], *steps = strstr(flags, "--steps") ? "" : "--steps 3";
		char common[1500];
		snprintf(common, sizeof common, "--train-data '%s/train_*.bin' --val-data '%s/train_*.bin' --eval-every 2 "
		         "--eval-batches 8 --vocab-size 257 --batch-size 2 --seq-len 32 --threads 1 --load 0 %s %s", dir, val,
		         steps, flags);
		snprintf(log, sizeof log, "%s/log%zu.jsonl", dir, k);
		snprintf(cmd, sizeof cmd, "%s train %s --log %s", loom, common, log);
		int st = test_run_cmd(cmd, out, sizeof out, 180);
		CHECK_MSG(st == 0, "%s: exit %d: %s", flags, st, out);
		snprintf(cmd, sizeof cmd, "%s plan %s --json", loom, common);
		st = test_run_cmd(cmd, pout, sizeof pout, 60);
		CHECK_MSG(st == 0, "%s: plan: exit %d: %s", flags, st, pout);
		CHECK_MSG(!strstr(out, "measuring") && !strstr(pout, "measuring"), "%s: measured: %s", flags, out);
		char text[65536];
		CHECK_OK(read_text(log, text, sizeof text));
		CHECK_MSG(json_object(text, "\"plan\":", a, sizeof a) == 0, "%s: no plan in the log: %.300s", flags, text);
		pout[strcspn(pout, "\n")] = 0;
		CHECK_MSG(strcmp(a, pout) == 0, "%s:\n  train's plan %s\n  loom plan's  %s", flags, a, pout);
		/* the start-up line prints the same step and memory */
		char line[200];
		snprintf(line, sizeof line, "plan: predicted step %.1f ms", 1e3 * json_num(pout, "\"step_time_s\":"));
		CHECK_CONTAINS(out, line);
		CHECK(json_object(pout, "\"memory_bytes_rank0\":", b, sizeof b) == 0);
		snprintf(line, sizeof line, "memory %.1f MiB on this rank", json_num(b, "\"total\":") / 1048576.0);
		CHECK_CONTAINS(out, line);
		CHECK(json_num(b, "\"eval\":") > 0); /* evaluation is on: its buffers are predicted */
		/* the summary's medians: of the steps after the 2 of warm-up, each of them a step of the log */
		CHECK_CONTAINS(out, "(median of steps 3-");
		CHECK(json_object(text, "{\"summary\":", b, sizeof b) == 0);
		int nsteps = strstr(flags, "--steps 6") ? 6 : 3;
		CHECK_EQ((int)json_num(b, "\"warmup\":"), 2);
		CHECK_EQ((int)json_num(b, "\"median_steps\":"), nsteps - 2);
		double dt[8], med = json_num(b, "\"median_step_s\":");
		const char *p = text;
		for (int s = 0; s < nsteps; s++) {
			p = strstr(p, "{\"step\":");
			CHECK(p);
			dt[s] = json_num(p, "\"dt_ms\":");
			p++;
		}
		/* the median of steps 3..n (dt_ms is logged to the microsecond) */
		for (int i = 2; i < nsteps; i++)
			for (int j = i + 1; j < nsteps; j++)
				if (dt[j] < dt[i]) {
					double t = dt[i];
					dt[i] = dt[j], dt[j] = t;
				}
		int n = nsteps - 2;
		double want = n % 2 ? dt[2 + n / 2] : 0.5 * (dt[2 + n / 2 - 1] + dt[2 + n / 2]);
		CHECK_MSG(fabs(1e3 * med - want) < 2e-3, "%s: median %.6f ms, the log's steps give %.6f", flags, 1e3 * med, want);
	}
	unsetenv("XDG_CACHE_HOME");
	test_rmdir(dir);
	return 0;
}

/* The memory prediction covers what a run holds with and without evaluation: the data loader's shard
 * pages, evaluation's losses and the validation shards' pages, a second thread's scratch: the plan's
 * total against rank 0's measured peak resident set, within 10% (not under AddressSanitizer, whose
 * shadow memory and quarantine are in every resident set: there the runs and the parts are checked). */
TEST(plan_memory_covers_evaluation)
{
	char dir[512], cache[700], val[700], cmd[4096], log[800], out[65536], text[1 << 16], m[4096];
	const char *loom = test_loom_bin();
#define GPT "--n-layer 2 --n-head 2 --n-embd 64 "
	static const char *const runs[] = {
		GPT "--threads 1 --shuffle 1",
		GPT "--threads 1 --shuffle 1 --val-data '%s/train_*.bin' --eval-every 4 --eval-batches 200",
		GPT "--threads 2 --val-data '%s/train_*.bin' --eval-every 4 --eval-batches 200",
		GPT "--nproc 2 --shuffle 1 --val-data '%s/train_*.bin' --eval-every 4 --eval-batches 200",
		"--nproc 2 --arch nanochat --depth 2 --head-dim 64 --val-data '%s/train_*.bin' --eval-every 4 --eval-batches 200",
	};
#undef GPT
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	snprintf(cache, sizeof cache, "%s/cache", dir);
	snprintf(val, sizeof val, "%s/val", dir);
	CHECK_OK(fake_peak_cache(cache));
	CHECK_OK(test_make_token_data(dir, 257, 3000000)); /* 6 MB: the loader maps what it reads */
	CHECK(mkdir(val, 0755) == 0);
	CHECK_OK(test_make_token_data(val, 257, 1500000));
	for (size_t k = 0; k < sizeof runs / sizeof *runs; k++) {
		char flags[1000];
		snprintf(flags, sizeof flags, runs[k], val);
		snprintf(log, sizeof log, "%s/log%zu.jsonl", dir, k);
		snprintf(cmd, sizeof cmd, "%s train --train-data '%s/train_*.bin' --vocab-size 257 --batch-size 4 --seq-len 128 "
		         "--steps 8 --load 0 --log %s %s", loom, dir, log, flags);
		int st = test_run_cmd(cmd, out, sizeof out, 180);
		CHECK_MSG(st == 0, "%s: exit %d: %s", flags, st, out);
		CHECK_OK(read_text(log, text, sizeof text));
		CHECK(json_object(text, "\"memory_bytes_rank0\":", m, sizeof m) == 0);
		double pred = json_num(m, "\"total\":"), rss = 0.0;
		for (const char *p = text; (p = strstr(p, "\"peak_rss_bytes\":")); p++)
			rss = json_num(p, "\"peak_rss_bytes\":") > rss ? json_num(p, "\"peak_rss_bytes\":") : rss;
		CHECK(rss > 0);
		CHECK_MSG(TEST_UNDER_ASAN || fabs(pred / rss - 1.0) <= 0.10, "%s: predicted %.1f MiB, peak RSS %.1f MiB (%+.1f%%): %s", flags,
		          pred / 1048576.0, rss / 1048576.0, 100.0 * (pred / rss - 1.0), m);
		if (strstr(flags, "--eval-every"))
			CHECK(json_num(m, "\"eval\":") > 1e6); /* the validation shard's pages the check and evaluation read */
	}
	unsetenv("XDG_CACHE_HOME");
	test_rmdir(dir);
	return 0;
}

/* loom_plan_compare splits both steps alike and names the part that missed the most, only past 15%
 * (time) and 10% (memory). */
TEST(plan_compare_names_the_part)
{
	loom_plan_t p;
	loom_plan_measured_t m;
	loom_plan_verdict_t v;
	memset(&p, 0, sizeof p), memset(&m, 0, sizeof m);
	p.step_time_s = 1.0, p.optimizer_s = 0.1, p.dp.exposed_s = 0.1, p.bubble = 0.0;
	p.memory_rank0.params = 100, p.memory_rank0.activations = 200, p.memory_rank0.overhead = 700;
	p.memory_rank0.total = 1000;
	m.step_s = 1.1, m.optimizer_s = 0.1, m.comm_s = 0.2, m.peak_rss = 1050, m.states = 100, m.activations = 200;
	loom_plan_compare(&p, &m, &v);
	CHECK_NEAR(v.time_error, 1.0 / 1.1 - 1.0, 1e-12);
	CHECK(v.time_part == NULL && v.memory_part == NULL); /* -9%, -5%: within */
	m.step_s = 2.0, m.comm_s = 1.0; /* communication: 0.1 predicted, 1.0 measured; compute 0.8 both */
	m.peak_rss = 1300, m.activations = 500; /* activations 200 vs 500, the rest 700 vs 700 */
	loom_plan_compare(&p, &m, &v);
	CHECK_STREQ(v.time_part, "communication");
	CHECK_FEQ(v.time_part_pred, 0.1);
	CHECK_FEQ(v.time_part_meas, 1.0);
	CHECK_STREQ(v.memory_part, "activations");
	CHECK_FEQ(v.memory_part_meas, 500.0);
	m.comm_s = 0.2, m.optimizer_s = 0.1, m.bubble = 0.5; /* a pipeline idle half of 1.7 s: the bubble */
	m.peak_rss = 2000, m.activations = 200;                 /* 1700 of buffers and process, 700 predicted */
	loom_plan_compare(&p, &m, &v);
	CHECK_STREQ(v.time_part, "bubble");
	CHECK_FEQ(v.time_part_meas, 0.85);
	CHECK_STREQ(v.memory_part, "buffers and process");
	CHECK_FEQ(v.memory_part_pred, 700.0);
	return 0;
}

/* The calibration's cache (src/train/plan_calib.c) with a fake measurement: a figure is measured once
 * and then read; another thread count or another machine's key is another figure; an entry taken
 * under load (CPU share below LOOM_CALIB_QUIET) or too old is measured again, and the best entry wins,
 * so a poisoned one never replaces a good one; a machine never quiet keeps the best of
 * LOOM_CALIB_TRIES. */
typedef struct {
	int calls;
	double value, share;
	int fail;
} fake_measure_t;

static int fake_measure(const char *name, int threads, void *ctx, double *value, double *share)
{
	fake_measure_t *f = ctx;
	(void)name;
	f->calls++;
	*value = f->value * threads, *share = f->share;
	return f->fail ? LOOM_ENOTSUP : LOOM_OK;
}

TEST(plan_calib_cache)
{
	char dir[512], path[1000];
	const char *old = getenv("XDG_CACHE_HOME");
	char saved[1000] = "";
	fake_measure_t f = {0, 100e9, 1.0, 0};
	double v;
	int now, rc = 0;
	unsigned long key = loom_calib_key();
	loom_calib_entry_t e;
	if (old)
		snprintf(saved, sizeof saved, "%s", old);
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK(setenv("XDG_CACHE_HOME", dir, 1) == 0);
	loom_calib_set_measure(fake_measure, &f);

	/* missing: measured once, then read */
	CHECK_EQ(loom_calib_get("mm_fp32_w64", 1, 0, &v, &now), LOOM_ENOENT);
	CHECK_OK(loom_calib_get("mm_fp32_w64", 1, 1, &v, &now));
	CHECK_EQ(f.calls, 1); CHECK_EQ(now, 1); CHECK_FEQ(v, 100e9);
	CHECK_OK(loom_calib_get("mm_fp32_w64", 1, 2, &v, &now));
	CHECK_EQ(f.calls, 1); CHECK_EQ(now, 0); CHECK_FEQ(v, 100e9);
	/* keying: another thread count is another figure; another machine's (or build's) entry is not read */
	CHECK_OK(loom_calib_get("mm_fp32_w64", 2, 2, &v, &now));
	CHECK_EQ(f.calls, 2); CHECK_FEQ(v, 200e9);
	CHECK_OK(loom_calib_append("mm_fp32_w128", 1, key + 1, 999e9, 1.0));
	CHECK_EQ(loom_calib_get("mm_fp32_w128", 1, 0, &v, NULL), LOOM_ENOENT);
	CHECK_OK(loom_calib_append("mm_fp32_w64", 1, key + 1, 999e9, 1.0));
	CHECK_OK(loom_calib_get("mm_fp32_w64", 1, 2, &v, NULL));
	CHECK_FEQ(v, 100e9); CHECK_EQ(f.calls, 2);
	CHECK(loom_calib_key_of("/nonexistent") != loom_calib_key_of(test_loom_bin()));

	/* a poisoned entry (measured under load: 5 GFLOP/s at a share of 0.3) is suspect: read as the best
	 * there is without measuring, measured again when allowed; the quiet figure then wins */
	CHECK_OK(loom_calib_append("attn_d64_t128", 1, key, 5e9, 0.3));
	CHECK_EQ(loom_calib_get("attn_d64_t128", 1, 0, &v, NULL), LOOM_ESTATE);
	CHECK_FEQ(v, 5e9);
	CHECK_EQ(loom_calib_get("attn_d64_t128", 1, 1, &v, NULL), LOOM_ESTATE); /* 1: only what has no entry */
	CHECK_FEQ(v, 5e9); CHECK_EQ(f.calls, 2);
	f.value = 80e9;
	CHECK_OK(loom_calib_get("attn_d64_t128", 1, 2, &v, &now));
	CHECK_EQ(f.calls, 3); CHECK_EQ(now, 1); CHECK_FEQ(v, 80e9);
	CHECK_OK(loom_calib_lookup("attn_d64_t128", 1, key, &e));
	CHECK_EQ(e.entries, 2); CHECK_EQ(e.quiet, 1); CHECK_EQ(e.trusted, 1);
	/* a poisoned entry after a good one changes nothing */
	CHECK_OK(loom_calib_append("mm_fp32_w64", 1, key, 1e9, 0.2));
	CHECK_OK(loom_calib_get("mm_fp32_w64", 1, 2, &v, NULL));
	CHECK_FEQ(v, 100e9); CHECK_EQ(f.calls, 3);

	/* stale: a quiet entry older than LOOM_CALIB_MAX_AGE is measured again */
	CHECK_OK(loom_calib_cache_path(path, sizeof path));
	FILE *fp = fopen(path, "a");
	CHECK(fp != NULL);
	fprintf(fp, "mm_fp32_w256 1 %lu 7.0e+10 1.000 %lld\n", key, (long long)(time(NULL) - 31 * 86400));
	fprintf(fp, "a torn line\n");
	fclose(fp);
	CHECK_EQ(loom_calib_get("mm_fp32_w256", 1, 0, &v, NULL), LOOM_ESTATE);
	CHECK_FEQ(v, 70e9);
	CHECK_OK(loom_calib_get("mm_fp32_w256", 1, 2, &v, &now));
	CHECK_EQ(f.calls, 4); CHECK_EQ(now, 1); CHECK_FEQ(v, 80e9);

	/* a machine never quiet: measured LOOM_CALIB_TRIES times, then the best of them is kept */
	f.share = 0.5;
	for (int k = 0; k < LOOM_CALIB_TRIES; k++) {
		f.value = (k == 1 ? 50e9 : 40e9);
		rc = loom_calib_get("mm_fp32_w512", 1, 2, &v, NULL);
		CHECK_EQ(rc, k + 1 < LOOM_CALIB_TRIES ? LOOM_ESTATE : LOOM_OK);
	}
	CHECK_EQ(f.calls, 4 + LOOM_CALIB_TRIES); CHECK_FEQ(v, 50e9);
	CHECK_OK(loom_calib_get("mm_fp32_w512", 1, 2, &v, NULL));
	CHECK_EQ(f.calls, 4 + LOOM_CALIB_TRIES);
	/* a measurement that fails leaves the figure missing */
	f.fail = 1;
	CHECK_EQ(loom_calib_get("mm_fp32_w768", 1, 2, &v, NULL), LOOM_ENOENT);
	CHECK_EQ(loom_calib_missing(1, LOOM_COMPUTE_FP32, NULL, 0),
	         LOOM_CALIB_WIDTHS + LOOM_CALIB_HEAD_DIMS * LOOM_CALIB_SEQS + 1 - 4); /* w64, w256, w512, attn_d64_t128 trusted */
	f.fail = 0;

	/* the peak cache: a copy bandwidth measured under load is not trusted and loses to a quiet one */
	CHECK_OK(loom_peak_cache_put_share(LOOM_PEAK_MEM_BW, 1, 3.8e9, 0.4));
	CHECK_EQ(loom_peak_cache_trusted(LOOM_PEAK_MEM_BW, 1), 0);
	CHECK_OK(loom_peak_cache_get_kind(LOOM_PEAK_MEM_BW, 1, &v));
	CHECK_FEQ(v, 3.8e9);
	CHECK_OK(loom_peak_cache_put_share(LOOM_PEAK_MEM_BW, 1, 29e9, 1.0));
	CHECK_EQ(loom_peak_cache_trusted(LOOM_PEAK_MEM_BW, 1), 1);
	CHECK_OK(loom_peak_cache_get_kind(LOOM_PEAK_MEM_BW, 1, &v));
	CHECK_FEQ(v, 29e9);
	CHECK_OK(loom_peak_cache_put_share(LOOM_PEAK_MEM_BW, 1, 2e9, 0.3));
	CHECK_OK(loom_peak_cache_get_kind(LOOM_PEAK_MEM_BW, 1, &v));
	CHECK_FEQ(v, 29e9);

	loom_calib_set_measure(NULL, NULL);
	if (old)
		setenv("XDG_CACHE_HOME", saved, 1);
	else
		unsetenv("XDG_CACHE_HOME");
	test_rmdir(dir);
	return 0;
}

/* The planner on measured rates: the block's matmuls at the calibration's rate for the width, the
 * attention at its own, the optimizer at its parameters per second; without them the GEMM peak's
 * efficiency (the documented fallback). */
TEST(plan_uses_measured_rates)
{
	loom_cluster_t c = test_cluster(), c2;
	loom_plan_config_t pc = tiny_config(1, 0);
	loom_plan_t p0, p1, p2;
	double fatt = 0.0, N = (double)pc.B * pc.T;
	CHECK_OK(loom_plan_estimate(&pc, &c, &p0));
	for (int k = 0; k < LOOM_CALIB_WIDTHS; k++)
		c.calib.mm[0][k] = 100e9;
	for (int d = 0; d < LOOM_CALIB_HEAD_DIMS; d++)
		for (int q = 0; q < LOOM_CALIB_SEQS; q++)
			c.calib.attn[d][q] = 25e9;
	c.calib.adamw = 1e9;
	c2 = c;
	for (int k = 0; k < LOOM_CALIB_WIDTHS; k++)
		c2.calib.mm[0][k] = 200e9;
	CHECK_OK(loom_plan_estimate(&pc, &c, &p1));
	CHECK_OK(loom_plan_estimate(&pc, &c2, &p2));
	for (int l = 0; l < pc.model.n_layer; l++)
		fatt += loom_model_block_attn_flops(&pc.model, l, pc.T);
	/* halving the matmuls' time takes exactly half of their seconds off the step */
	CHECK_NEAR(p1.step_time_s - p2.step_time_s, (p1.flops_per_token - fatt) * N / 200e9, 1e-12);
	/* the optimizer: P parameters at 1e9 a second (one rank, its bandwidth its own) */
	CHECK_NEAR(p1.optimizer_s, p1.params / 1e9, 1e-12);
	/* the attention at its rate: doubling it takes half its seconds off */
	c2 = c;
	for (int d = 0; d < LOOM_CALIB_HEAD_DIMS; d++)
		for (int q = 0; q < LOOM_CALIB_SEQS; q++)
			c2.calib.attn[d][q] = 50e9;
	CHECK_OK(loom_plan_estimate(&pc, &c2, &p2));
	CHECK_NEAR(p1.step_time_s - p2.step_time_s, fatt * N / 50e9, 1e-12);
	CHECK(fabs(p0.step_time_s - p1.step_time_s) > 1e-6); /* the fallback differs */
	/* the rates interpolate in log width and log T, clamped at the grid's ends */
	loom_calib_t cal;
	memset(&cal, 0, sizeof cal);
	for (int k = 0; k < LOOM_CALIB_WIDTHS; k++)
		cal.mm[1][k] = 10e9 * (k + 1);
	CHECK_FEQ(loom_calib_mm_rate(&cal, LOOM_COMPUTE_BF16, 32), 10e9);
	CHECK_FEQ(loom_calib_mm_rate(&cal, LOOM_COMPUTE_BF16, 128), 20e9);
	CHECK_NEAR(loom_calib_mm_rate(&cal, LOOM_COMPUTE_BF16, 181.0193359837561), sqrt(20e9 * 30e9), 1e-3);
	CHECK_FEQ(loom_calib_mm_rate(&cal, LOOM_COMPUTE_BF16, 4096), 50e9);
	CHECK_FEQ(loom_calib_mm_rate(&cal, LOOM_COMPUTE_FP32, 128), 0.0); /* fp32 not measured */
	return 0;
}
