/* train_memory.c: `loom train`'s memory check (--memory-check): the run's estimate against the limits
 * of the process (loom/limits.h: one memory model, with `loom plan`), before the model, the optimizer or
 * the strategy allocate anything. A run that does not fit stops with one message naming the estimate,
 * the limit and where it came from, and what would fit; --memory-check warn says it and runs.
 * LOOM_MEMCHECK_ROOT reads the limits under another root (tests give a fake /proc and cgroup tree).
 * The estimate also goes to `loom run` (its report pipe), which quotes it when the rank is killed
 * by the kernel's OOM killer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "loom/comm.h"
#include "loom/gpt2.h"
#include "loom/limits.h"
#include "loom/util.h"
#include "train_memory.h"

static int mode; /* 0 refuse, 1 warn */

void cli_memcheck_mode(const char *v)
{
	if (strcmp(v, "refuse") == 0)
		mode = 0;
	else if (strcmp(v, "warn") == 0)
		mode = 1;
	else
		cli_die("train", "--memory-check: '%s': expected refuse (the default) or warn", v);
}

static int act_bytes(void *ctx, int B, int act_ckpt, size_t *bytes)
{
	const cli_memcheck_t *m = ctx;
	int cp = m->cp > 1 ? m->cp : 1, T = m->T / cp;
	loom_model_opts_t o = {.B = B, .T = T, .tp_size = m->tp, .act_ckpt = (loom_act_ckpt_t)act_ckpt,
	                       .dtype = (loom_compute_dtype_t)m->dtype,
	                       .sequence_parallel = m->sp && ((long long)B * T) % m->tp == 0, .cp_size = cp};
	loom_model_act_bytes_t a;
	if (loom_model_act_bytes(m->mc, &o, &a) != LOOM_OK)
		return -1;
	*bytes = a.total / (size_t)(m->pp > 1 ? m->pp : 1) + (m->pp > 1 ? a.head : 0);
	return 0;
}

static long env_int(const char *name, long def)
{
	const char *e = getenv(name);
	return e && *e ? atol(e) : def;
}

/* "estimate R: N bytes" on `loom run`'s report pipe (LOOM_RUN_REPORT_FD = FD:INODE), if there is one. */
static void tell_launcher(int rank, size_t bytes)
{
	const char *e = getenv("LOOM_RUN_REPORT_FD");
	unsigned long long ino;
	int fd;
	struct stat st;
	char line[96];
	if (!e || sscanf(e, "%d:%llu", &fd, &ino) != 2 || fd < 3 || fstat(fd, &st) != 0 || !S_ISFIFO(st.st_mode) ||
	    (unsigned long long)st.st_ino != ino)
		return;
	int n = snprintf(line, sizeof line, "estimate %d: %zu bytes\n", rank, bytes);
	if (write(fd, line, (size_t)n) < 0) { /* the launcher is gone: nothing to tell */
	}
}

/* Floats of unit u's parameters (the model's table: a unit's tensors are contiguous). */
static size_t unit_floats(const loom_model_config_t *c, int u)
{
	loom_tensor_info_t a, b;
	int first, end;
	loom_model_unit_tensors(c, u, &first, &end);
	if (end <= first || loom_model_tensor_info(c, first, &a) != LOOM_OK || loom_model_tensor_info(c, end - 1, &b) != LOOM_OK)
		return 0;
	return b.offset + b.numel - a.offset;
}

/* A refusal's return: local rank 0 prints it for its host, and the launcher stops the job at the first
 * rank that exits, so the others give it a second to speak first. */
static int refused(int local_rank)
{
	if (local_rank != 0)
		sleep(1);
	return 1;
}

int cli_train_memory_check(const cli_memcheck_t *m)
{
	const loom_model_config_t *c = m->mc;
	size_t P = loom_model_num_params(c), emb = unit_floats(c, -1), block = 0;
	for (int l = 0; l < c->n_layer; l++) /* the largest block (ZeRO-3 gathers one at a time) */
		block = block > unit_floats(c, l) ? block : unit_floats(c, l);
	long local = env_int("LOCAL_WORLD_SIZE", env_int("OMPI_COMM_WORLD_LOCAL_SIZE", m->world));
	long local_rank = env_int("LOCAL_RANK", env_int("OMPI_COMM_WORLD_LOCAL_RANK", m->rank));
	long shm_mb = env_int("LOOM_SHM_MB", m->world == 1 ? LOOM_SOLO_SHM_MB : 1024);
	loom_mem_plan_t p = {
		.nparams = m->pp > 1 ? (P - emb) / (size_t)m->pp + emb : P,
		.emb_params = emb / (size_t)m->tp, .block_params = block / (size_t)m->tp,
		.B = m->B, .T = m->T / (m->cp > 1 ? m->cp : 1), .accum = m->accum, .act_ckpt = m->act_ckpt, .zero = m->zero,
		.dp = m->dp * (m->cp > 1 ? m->cp : 1), /* ZeRO shards over dp x cp */
		.threads = m->threads, .local_ranks = (int)(local > 0 ? local : 1),
		.heap_bytes = m->world > 1 || getenv("LOOM_SHM_MB") ? (size_t)shm_mb << 20 : (size_t)LOOM_SOLO_SHM_MB << 20,
		.openblas = m->dtype == LOOM_COMPUTE_FP32 && loom_gemm_backend() == LOOM_GEMM_OPENBLAS,
		.act_bytes = act_bytes, .ctx = (void *)m,
	};
	loom_mem_limits_t lim;
	loom_mem_check_t chk;
	loom_mem_estimate_t est;
	p.nparams /= (size_t)m->tp;
	loom_mem_limits_read(getenv("LOOM_MEMCHECK_ROOT"), &lim);
	if (loom_mem_check(&p, &lim, &chk) != LOOM_OK) { /* no layout for this batch: creating the model would fail */
		if (local_rank == 0)
			fprintf(stderr, "loom train: %s\n", loom_errmsg());
		return refused(local_rank);
	}
	if (loom_mem_estimate(&p, &est) == LOOM_OK)
		tell_launcher(m->rank, est.total);
	if (chk.fits)
		return 0;
	if (mode && p.openblas && chk.address_space) { /* not a risk the user can take: a hang */
		if (local_rank == 0)
			fprintf(stderr, "loom train: %s\nloom train: --memory-check warn does not apply: OpenBLAS retries a "
			        "buffer the address-space limit refuses forever (a hang, not an error)\n", chk.message);
		return refused(local_rank);
	}
	if (local_rank == 0) { /* once per host: the host's ranks see the same limits */
		fprintf(stderr, "loom train: %s%s\n", mode ? "warning: " : "", chk.message);
		fprintf(stderr, "loom train: %s\n", mode ? "--memory-check warn: running anyway"
		                                         : "stopping before anything is allocated; run anyway with "
		                                           "--memory-check warn");
		fflush(stderr);
	}
	return mode ? 0 : refused(local_rank);
}
