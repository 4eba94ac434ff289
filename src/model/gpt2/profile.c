/* profile.c: per-kernel wall-time accounting of the model (loom_gpt2_profile / _report).
 *
 * When enabled, each kernel call in forward/backward adds its wall time (loom_now() around the call)
 * to its counter; kernels run on all threads, so the times add up to the step time. Matmul-type
 * kernels also count their floating-point operations, so the report shows how far each runs from
 * the sgemm peak (attention counts its full T x T products, as the nominal count does, although the
 * causal blocks skip part of them: MFU counts only the causal triangle, loom_model_flops_per_token).
 * The report divides by the number of steps the caller says it ran, then resets the counters. */
#include <stdio.h>
#include <string.h>

#include "core/util.h"
#include "model/gpt2/model.h"

static const char *const prof_names[PROF_COUNT] = {
#define PROF_NAME_(name, text) text,
	LOOM_PROF_KERNELS(PROF_NAME_)
#undef PROF_NAME_
};

void loom__gpt2_prof_add(loom_gpt2_t *m, int k, double t0, double flops)
{
	m->prof_s[k] += loom_now() - t0;
	m->prof_flops[k] += flops;
	m->prof_calls[k]++;
}

void loom_gpt2_profile(loom_gpt2_t *m, int enable)
{
	m->prof_on = enable != 0;
}

void loom_gpt2_profile_report(loom_gpt2_t *m, void *file, int steps)
{
	FILE *f = file ? (FILE *)file : stderr;
	double total = 0.0;
	if (steps <= 0)
		steps = 1;
	for (int k = 0; k < PROF_COUNT; k++)
		total += m->prof_s[k];
	fprintf(f, "%-46s %10s %8s %10s %6s %9s\n", "kernel", "ms/step", "calls", "ms/call", "share", "GFLOP/s");
	for (int k = 0; k < PROF_COUNT; k++) {
		if (!m->prof_calls[k])
			continue;
		fprintf(f, "%-46s %10.2f %8.1f %10.3f %5.1f%%", prof_names[k], 1e3 * m->prof_s[k] / steps,
		        (double)m->prof_calls[k] / steps, 1e3 * m->prof_s[k] / (double)m->prof_calls[k],
		        total > 0 ? 100.0 * m->prof_s[k] / total : 0.0);
		if (m->prof_flops[k] > 0 && m->prof_s[k] > 0)
			fprintf(f, " %9.1f", m->prof_flops[k] / m->prof_s[k] / 1e9);
		fputc('\n', f);
	}
	fprintf(f, "%-46s %10.2f\n", "total (timed kernels)", 1e3 * total / steps);
	memset(m->prof_s, 0, sizeof m->prof_s);
	memset(m->prof_flops, 0, sizeof m->prof_flops);
	memset(m->prof_calls, 0, sizeof m->prof_calls);
}
