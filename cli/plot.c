/* plot.c: `loom plot`: training curves from `loom train --log` files, as SVG (written here) or PNG
 * (drawn by gnuplot, Debian's gnuplot-nox, from the script `-o NAME.gp` writes).
 *
 * Two panels side by side, every run in its own color: loss against step (the training loss as a
 * light line, its moving average over ~1/50 of the run as a solid one) and tokens/s against step (the
 * same moving average; the planner's prediction dotted). Validation is drawn over every run's
 * training curves, in a style of its own whatever the run: a black dashed line with a point at every
 * evaluation, filled with the run's color, so that no training curve hides it. A run is named by its
 * file (without .jsonl) and, from its config records, its model and batch: a log whose resumes changed
 * the settings has several records (log.c), each describing the step lines below it, so the run is
 * labelled by segment ("run steps 1-4 (..., ranks 2)", "run steps 5-8 (..., accum 2)"), consecutive
 * segments with the same label as one, and a dotted vertical line marks where a segment begins. Only
 * step lines and config records are read; the summary and unknown lines are skipped, so logs of older
 * versions plot too. The picture is a pure function of the logs and the flags: tests compare it. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"

static const char *const usage_text =
	"usage: loom plot LOG.jsonl [MORE.jsonl ...] -o OUT.svg|OUT.png|OUT.gp [--title TEXT] [--width W] [--height H]\n"
	"\n"
	"Draws the loss and validation loss against step (left) and tokens/s against step (right) of one or\n"
	"several `loom train --log` runs, each in its own color; validation in black dashes over them all,\n"
	"with a point at every evaluation. A run whose resumes changed its settings is labelled segment by\n"
	"segment. OUT's extension picks the format: .svg is written directly; .png is drawn by gnuplot\n"
	"(Debian: gnuplot-nox; scripts/deps.sh installs it); .gp writes the gnuplot script (data inline)\n"
	"that draws OUT.png, to adjust and run with `gnuplot OUT.gp`.\n"
	"  -o, --out FILE   the picture, or the script (required)\n"
	"  --title TEXT     a title above the panels (default: none)\n"
	"  --width W        pixels (default 1200)\n"
	"  --height H       pixels (default 450)\n";

#define MAX_RUNS 8
#define MAX_SEGS 16
static const char *const colors[MAX_RUNS] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                             "#9467bd", "#8c564b", "#e377c2", "#17becf"};
/* Validation's own color, in every run (its points are filled with the run's color). */
static const char *const val_color = "#000000";

/* Consecutive step lines described by config records with the same label. */
typedef struct {
	long lo, hi;      /* indices of its first and last step line */
	char label[200];  /* "L4 C128, 1024 tok/step, lr 0.003, ranks 2" ("" without a config record) */
} seg_t;

typedef struct {
	char base[128];   /* the file's name without .jsonl */
	char name[360];   /* base (label): the run's name when it has one segment */
	long n, cap;
	double *step, *loss, *val, *tps; /* val: NAN on steps without one */
	double *loss_avg, *tps_avg;
	double *pred;     /* tokens per step / the planner's predicted step time (the segment's config), or NAN */
	seg_t seg[MAX_SEGS];
	int nseg;
} run_t;

/* The number after "key": in a JSON line, or NAN (absent or null). */
static double field(const char *line, const char *key)
{
	char pat[64];
	const char *p;
	snprintf(pat, sizeof pat, "\"%s\":", key);
	if (!(p = strstr(line, pat)))
		return NAN;
	p += strlen(pat);
	if (strncmp(p, "null", 4) == 0)
		return NAN;
	return strtod(p, NULL);
}

static void grow(run_t *r)
{
	double **arrays[7] = {&r->step, &r->loss, &r->val, &r->tps, &r->loss_avg, &r->tps_avg, &r->pred};
	r->cap = r->cap ? 2 * r->cap : 1024;
	for (int k = 0; k < 7; k++)
		if (!(*arrays[k] = realloc(*arrays[k], (size_t)r->cap * sizeof(double))))
			cli_die("plot", "out of memory");
}

/* Moving average of x over a centered window of w points. */
static void smooth(const double *x, double *out, long n, long w)
{
	for (long i = 0; i < n; i++) {
		long lo = i - w / 2 < 0 ? 0 : i - w / 2, hi = i + w / 2 >= n ? n - 1 : i + w / 2, k = 0;
		double s = 0;
		for (long j = lo; j <= hi; j++)
			if (isfinite(x[j]))
				s += x[j], k++;
		out[i] = k ? s / (double)k : NAN;
	}
}

/* A config record's label: the model, the batch and the mesh, "" when it has no model. Absent
 * fields (older logs) count as 1. */
static void config_label(const char *line, char *buf, size_t cap)
{
	double L = field(line, "n_layer"), C = field(line, "n_embd"), tok = field(line, "tokens_per_step");
	double lr = field(line, "lr"), world = field(line, "world"), dp = field(line, "dp"), tp = field(line, "tp");
	double pp = field(line, "pp"), accum = field(line, "grad_accum");
	size_t n;
	buf[0] = 0;
	if (!isfinite(L) || !isfinite(C))
		return;
	n = (size_t)snprintf(buf, cap, "L%.0f C%.0f, %.0f tok/step, lr %g", L, C, tok, lr);
	if (isfinite(world) && world > 1 && n < cap)
		n += (size_t)snprintf(buf + n, cap - n, ", ranks %.0f", world);
	if (((isfinite(tp) && tp > 1) || (isfinite(pp) && pp > 1)) && n < cap)
		n += (size_t)snprintf(buf + n, cap - n, " (dp %.0f x tp %.0f x pp %.0f)", isfinite(dp) ? dp : 1.0,
		                      isfinite(tp) ? tp : 1.0, isfinite(pp) ? pp : 1.0);
	if (isfinite(accum) && accum > 1 && n < cap)
		snprintf(buf + n, cap - n, ", accum %.0f", accum);
	if (strlen(buf) > 150)
		buf[0] = 0; /* not a label any more */
}

static void read_run(const char *path, run_t *r)
{
	FILE *f = fopen(path, "r");
	char *line = NULL, label[200] = "";
	double pred = NAN;
	size_t cap = 0;
	const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
	if (!f)
		cli_die("plot", "%s: %s", path, strerror(errno));
	while (getline(&line, &cap, f) > 0) {
		if (strncmp(line, "{\"config\":", 10) == 0) { /* it describes the step lines below it */
			double tok = field(line, "tokens_per_step"), ps = field(line, "predicted_step_s");
			pred = isfinite(ps) && ps > 0 && isfinite(tok) ? tok / ps : NAN;
			config_label(line, label, sizeof label);
			continue;
		}
		if (strncmp(line, "{\"step\":", 8) != 0)
			continue;
		if (r->n == r->cap)
			grow(r);
		r->step[r->n] = field(line, "step");
		r->loss[r->n] = field(line, "loss");
		r->val[r->n] = field(line, "val_loss");
		r->tps[r->n] = field(line, "tokens_per_s");
		r->pred[r->n] = pred;
		if (r->nseg == 0 || (strcmp(label, r->seg[r->nseg - 1].label) != 0 && r->nseg < MAX_SEGS)) {
			seg_t *g = &r->seg[r->nseg++];
			g->lo = r->n;
			snprintf(g->label, sizeof g->label, "%s", label);
		}
		r->seg[r->nseg - 1].hi = r->n; /* beyond MAX_SEGS the last one takes the rest */
		r->n++;
	}
	free(line);
	fclose(f);
	if (r->n == 0)
		cli_die("plot", "%s: no step lines ({\"step\":N,...}): not a `loom train --log` file?", path);
	size_t blen = strlen(base);
	snprintf(r->base, sizeof r->base, "%.*s", (int)(blen > 6 && !strcmp(base + blen - 6, ".jsonl") ? blen - 6 : blen),
	         base);
	if (r->seg[0].label[0])
		snprintf(r->name, sizeof r->name, "%.127s (%.200s)", r->base, r->seg[0].label);
	else
		snprintf(r->name, sizeof r->name, "%.127s", r->base);
	long w = r->n / 50 > 1 ? r->n / 50 : 1;
	smooth(r->loss, r->loss_avg, r->n, w);
	smooth(r->tps, r->tps_avg, r->n, w);
}

/* Segment g of run r as the legend names it: "run steps 5-8 (L1 C32, ..., accum 2)". */
static void seg_name(const run_t *r, int g, char *buf, size_t cap)
{
	const seg_t *s = &r->seg[g];
	snprintf(buf, cap, "%.80s steps %.0f-%.0f%s%.200s%s", r->base, r->step[s->lo], r->step[s->hi], s->label[0] ? " (" : "",
	         s->label, s->label[0] ? ")" : "");
}

/* "Nice" axis: [lo, hi] widened to multiples of a 1-2-5 step giving about 5 ticks. */
static double nice_axis(double *lo, double *hi)
{
	double span = *hi - *lo, raw, mag, step;
	if (!(span > 0)) {
		double d = fabs(*lo) > 0 ? fabs(*lo) * 0.1 : 1.0;
		*lo -= d, *hi += d, span = 2 * d;
	}
	raw = span / 5, mag = pow(10, floor(log10(raw)));
	step = raw / mag < 1.5 ? mag : raw / mag < 3.5 ? 2 * mag : raw / mag < 7.5 ? 5 * mag : 10 * mag;
	*lo = floor(*lo / step) * step, *hi = ceil(*hi / step) * step;
	return step;
}

static void fmt_num(char *buf, size_t cap, double v, double step)
{
	if (fabs(v) >= 1e5)
		snprintf(buf, cap, "%.0fk", v / 1e3);
	else if (step >= 1)
		snprintf(buf, cap, "%.0f", v);
	else
		snprintf(buf, cap, "%.*f", step >= 0.1 ? 1 : step >= 0.01 ? 2 : 3, v);
}

static void xml_text(FILE *f, const char *s)
{
	for (; *s; s++)
		if (*s == '<') fputs("&lt;", f);
		else if (*s == '>') fputs("&gt;", f);
		else if (*s == '&') fputs("&amp;", f);
		else if (*s == '"') fputs("&quot;", f);
		else fputc(*s, f);
}

typedef struct {
	double x0, y0, w, h;       /* plot area in pixels */
	double xlo, xhi, ylo, yhi; /* data range */
} panel_t;

static double px(const panel_t *p, double x) { return p->x0 + (x - p->xlo) / (p->xhi - p->xlo) * p->w; }
static double py(const panel_t *p, double y) { return p->y0 + p->h - (y - p->ylo) / (p->yhi - p->ylo) * p->h; }

/* A polyline of the finite points (xs[i], ys[i]); a non-finite y breaks it. */
static void svg_line(FILE *f, const panel_t *p, const double *xs, const double *ys, long n, const char *style)
{
	int open = 0;
	for (long i = 0; i < n; i++) {
		if (!isfinite(ys[i]) || !isfinite(xs[i]))
			continue;
		if (!open)
			fprintf(f, "<polyline fill=\"none\" %s points=\"", style), open = 1;
		fprintf(f, "%.1f,%.1f ", px(p, xs[i]), py(p, ys[i]));
	}
	if (open)
		fputs("\"/>\n", f);
}

static void svg_axes(FILE *f, panel_t *p, const char *xlabel, const char *ylabel)
{
	char buf[32];
	double xs = nice_axis(&p->xlo, &p->xhi), ys = nice_axis(&p->ylo, &p->yhi);
	fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"white\" stroke=\"#444\"/>\n", p->x0,
	        p->y0, p->w, p->h);
	for (double v = p->xlo; v <= p->xhi + xs * 1e-6; v += xs) {
		fmt_num(buf, sizeof buf, v, xs);
		fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", px(p, v), p->y0,
		        px(p, v), p->y0 + p->h);
		fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n", px(p, v), p->y0 + p->h + 16, buf);
	}
	for (double v = p->ylo; v <= p->yhi + ys * 1e-6; v += ys) {
		fmt_num(buf, sizeof buf, v, ys);
		fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", p->x0, py(p, v),
		        p->x0 + p->w, py(p, v));
		fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", p->x0 - 6, py(p, v) + 4, buf);
	}
	fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n", p->x0 + p->w / 2, p->y0 + p->h + 34,
	        xlabel);
	fprintf(f, "<text transform=\"translate(%.1f,%.1f) rotate(-90)\" text-anchor=\"middle\">%s</text>\n", p->x0 - 48,
	        p->y0 + p->h / 2, ylabel);
}

static void range(const run_t *runs, int n, int which, double *lo, double *hi)
{
	*lo = INFINITY, *hi = -INFINITY;
	for (int r = 0; r < n; r++)
		for (long i = 0; i < runs[r].n; i++) {
			/* loss panel: the loss and validation; tokens/s panel: its average and the prediction */
			const double *arrays[4] = {runs[r].loss, runs[r].val, runs[r].tps_avg, runs[r].pred};
			for (int k = which == 0 ? 0 : 2; k <= (which == 0 ? 1 : 3); k++)
				if (isfinite(arrays[k][i]))
					*lo = fmin(*lo, arrays[k][i]), *hi = fmax(*hi, arrays[k][i]);
		}
	if (!isfinite(*lo))
		*lo = 0, *hi = 1;
}

/* The validation points of run u (malloc'ed; *m of them). */
static void val_points(const run_t *u, double **vx, double **vy, long *m)
{
	*vx = malloc((size_t)u->n * sizeof **vx), *vy = malloc((size_t)u->n * sizeof **vy), *m = 0;
	if (!*vx || !*vy)
		cli_die("plot", "out of memory");
	for (long i = 0; i < u->n; i++)
		if (isfinite(u->val[i]))
			(*vx)[*m] = u->step[i], (*vy)[(*m)++] = u->val[i];
}

static void write_svg(const char *out, run_t *runs, int n, const char *title, int W, int H)
{
	FILE *f = fopen(out, "w");
	int rows = 0;
	for (int r = 0; r < n; r++)
		rows += runs[r].nseg > 1 ? 1 + runs[r].nseg : 1;
	double top = title ? 40 : 16, legend = 18.0 * rows + 8;
	panel_t p[2];
	char style[200], text[400];
	if (!f)
		cli_die("plot", "%s: %s", out, strerror(errno));
	fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
	        "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
	        W, H, W, H);
	if (title) {
		fprintf(f, "<text x=\"%d\" y=\"24\" text-anchor=\"middle\" font-size=\"16\">", W / 2);
		xml_text(f, title);
		fputs("</text>\n", f);
	}
	for (int k = 0; k < 2; k++) {
		p[k].x0 = 70 + k * (W / 2.0);
		p[k].y0 = top;
		p[k].w = W / 2.0 - 100;
		p[k].h = H - top - 50 - legend;
		p[k].xlo = INFINITY, p[k].xhi = -INFINITY;
		for (int r = 0; r < n; r++)
			p[k].xlo = fmin(p[k].xlo, runs[r].step[0]), p[k].xhi = fmax(p[k].xhi, runs[r].step[runs[r].n - 1]);
		range(runs, n, k, &p[k].ylo, &p[k].yhi);
	}
	svg_axes(f, &p[0], "step", "loss");
	svg_axes(f, &p[1], "step", "tokens/s");
	/* the training curves of every run first, ... */
	for (int r = 0; r < n; r++) {
		const run_t *u = &runs[r];
		snprintf(style, sizeof style, "stroke=\"%s\" stroke-opacity=\"0.3\" stroke-width=\"1\"", colors[r]);
		svg_line(f, &p[0], u->step, u->loss, u->n, style);
		snprintf(style, sizeof style, "stroke=\"%s\" stroke-width=\"2\"", colors[r]);
		svg_line(f, &p[0], u->step, u->loss_avg, u->n, style);
		svg_line(f, &p[1], u->step, u->tps_avg, u->n, style);
		/* the planner's prediction, per segment: a dotted line across it */
		snprintf(style, sizeof style, "stroke=\"%s\" stroke-width=\"1.5\" stroke-dasharray=\"2,3\"", colors[r]);
		for (int g = 0; g < u->nseg; g++)
			if (isfinite(u->pred[u->seg[g].lo])) {
				const seg_t *s = &u->seg[g];
				double xs[2] = {u->step[s->lo], u->step[s->hi]}, ys[2] = {u->pred[s->lo], u->pred[s->lo]};
				svg_line(f, &p[1], xs, ys, 2, style);
			}
		/* where a segment with other settings begins: a dotted vertical line in both panels */
		for (int g = 1; g < u->nseg; g++)
			for (int k = 0; k < 2; k++) {
				double x = px(&p[k], u->step[u->seg[g].lo] - 0.5);
				fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"1.5\" "
				        "stroke-dasharray=\"1,3\"/>\n", x, p[k].y0, x, p[k].y0 + p[k].h, colors[r]);
			}
	}
	/* ... then validation over them all: its own color, dashed, a point at every evaluation */
	for (int r = 0; r < n; r++) {
		double *vx, *vy;
		long m;
		val_points(&runs[r], &vx, &vy, &m);
		snprintf(style, sizeof style, "stroke=\"%s\" stroke-width=\"1.5\" stroke-dasharray=\"6,4\"", val_color);
		svg_line(f, &p[0], vx, vy, m, style);
		for (long i = 0; i < m; i++)
			fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"%s\" stroke=\"%s\" stroke-width=\"1.5\"/>\n",
			        px(&p[0], vx[i]), py(&p[0], vy[i]), colors[r], val_color);
		free(vx), free(vy);
	}
	/* the legend: a row per run, and under a run of several segments a row per segment */
	int row = 0;
	for (int r = 0; r < n; r++) {
		const run_t *u = &runs[r];
		double ly = H - legend + 18.0 * row++ + 8;
		fprintf(f, "<line x1=\"70\" y1=\"%.1f\" x2=\"100\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2\"/>\n", ly, ly,
		        colors[r]);
		fprintf(f, "<line x1=\"106\" y1=\"%.1f\" x2=\"136\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"1.5\" "
		        "stroke-dasharray=\"6,4\"/>\n<circle cx=\"121\" cy=\"%.1f\" r=\"4\" fill=\"%s\" stroke=\"%s\" "
		        "stroke-width=\"1.5\"/>\n<text x=\"144\" y=\"%.1f\">", ly, ly, val_color, ly, colors[r], val_color, ly + 4);
		xml_text(f, u->nseg > 1 ? u->base : u->name);
		fprintf(f, ": loss (moving average; light: per step), val loss (black dashes, a point per evaluation)%s"
		        "</text>\n", u->nseg > 1 ? "; its segments, split at the dotted lines:" : "");
		for (int g = 0; u->nseg > 1 && g < u->nseg; g++) {
			ly = H - legend + 18.0 * row++ + 8;
			fprintf(f, "<line x1=\"86\" y1=\"%.1f\" x2=\"136\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2\"/>\n"
			        "<text x=\"144\" y=\"%.1f\">", ly, ly, colors[r], ly + 4);
			seg_name(u, g, text, sizeof text);
			xml_text(f, text);
			fputs("</text>\n", f);
		}
	}
	fputs("</svg>\n", f);
	if (fclose(f) != 0)
		cli_die("plot", "%s: write failed: %s", out, strerror(errno));
}

/* s as a gnuplot string: single-quoted, a quote doubled. */
static void gp_str(FILE *f, const char *s)
{
	fputc('\'', f);
	for (; *s; s++)
		*s == '\'' ? fputs("''", f) : fputc(*s, f);
	fputc('\'', f);
}

/* The gnuplot script that draws `png`, with the data inline ($runR: step, loss, its average, val, tokens/s
 * average, predicted tokens/s; $valR, when the run has any: the validation points alone, so that
 * gnuplot joins them). Every
 * run's training curves come first, validation after them all, so that it is drawn over them. */
static void write_gnuplot(FILE *f, const run_t *runs, int n, const char *title, int W, int H, const char *png)
{
	char text[400];
	int has_pred[MAX_RUNS] = {0}, has_val[MAX_RUNS] = {0};
	fputs("# loom plot: the training curves of", f);
	for (int r = 0; r < n; r++)
		fprintf(f, " %s", runs[r].base);
	fputs(" (gnuplot >= 5.0; run: gnuplot THIS)\n", f);
	for (int r = 0; r < n; r++) {
		const run_t *u = &runs[r];
		fprintf(f, "$run%d << EOD\n", r);
		for (long i = 0; i < u->n; i++) {
			fprintf(f, "%.17g %.9g %.9g %.9g %.9g %.9g\n", u->step[i], u->loss[i], u->loss_avg[i], u->val[i],
			        u->tps_avg[i], u->pred[i]);
			has_pred[r] |= isfinite(u->pred[i]);
		}
		fputs("EOD\n", f);
		for (long i = 0; i < u->n; i++)
			if (isfinite(u->val[i])) {
				if (!has_val[r])
					fprintf(f, "$val%d << EOD\n", r), has_val[r] = 1;
				fprintf(f, "%.17g %.9g\n", u->step[i], u->val[i]);
			}
		if (has_val[r])
			fputs("EOD\n", f);
	}
	fprintf(f, "set terminal pngcairo size %d,%d font 'sans,10' noenhanced\nset output ", W, H);
	gp_str(f, png);
	fputs("\nset datafile missing 'nan'\nset multiplot layout 1,2", f);
	if (title) {
		fputs(" title ", f);
		gp_str(f, title);
	}
	fputs("\nset grid\nset key top right\nset xlabel 'step'\n", f);
	/* where a segment with other settings begins, in both panels */
	for (int r = 0, k = 1; r < n; r++)
		for (int g = 1; g < runs[r].nseg; g++)
			fprintf(f, "set arrow %d from first %.17g, graph 0 to first %.17g, graph 1 nohead dt 3 lw 1.5 lc rgb '%s'\n",
			        k++, runs[r].step[runs[r].seg[g].lo] - 0.5, runs[r].step[runs[r].seg[g].lo] - 0.5, colors[r]);
	fputs("set ylabel 'loss'\nplot ", f);
	for (int r = 0; r < n; r++) { /* training: per step light (70% transparent), its average solid */
		const run_t *u = &runs[r];
		fprintf(f, "%s$run%d u 1:2 w l lc rgb '#B3%s' lw 1 notitle", r ? ", \\\n     " : "", r, colors[r] + 1);
		for (int g = 0; g < u->nseg; g++) {
			/* a segment's average from the last point of the one before, so the line stays whole */
			fprintf(f, ", \\\n     $run%d every ::%ld::%ld u 1:3 w l lc rgb '%s' lw 2 title ", r,
			        g ? u->seg[g].lo - 1 : 0, u->seg[g].hi, colors[r]);
			if (u->nseg > 1)
				seg_name(u, g, text, sizeof text);
			gp_str(f, u->nseg > 1 ? text : u->name);
		}
	}
	for (int r = 0; r < n; r++) { /* validation, over every training curve: its own color, a point per evaluation */
		if (!has_val[r])
			continue;
		snprintf(text, sizeof text, n > 1 ? "%s val loss" : "val loss", runs[r].base);
		fprintf(f, ", \\\n     $val%d u 1:2 w lp lc rgb '%s' lw 1.5 dt 2 pt 7 ps 1.3 title ", r, val_color);
		gp_str(f, text);
		fprintf(f, ", \\\n     $val%d u 1:2 w p lc rgb '%s' pt 7 ps 0.7 notitle", r, colors[r]);
	}
	fputs("\nset ylabel 'tokens/s'\nplot ", f);
	for (int r = 0; r < n; r++) {
		fprintf(f, "%s$run%d u 1:5 w l lc rgb '%s' lw 2 notitle", r ? ", \\\n     " : "", r, colors[r]);
		if (has_pred[r])
			fprintf(f, ", \\\n     $run%d u 1:6 w l lc rgb '%s' lw 1 dt 3 title 'predicted (loom plan)'", r, colors[r]);
	}
	fputs("\nunset multiplot\n", f);
}

/* `-o NAME.gp`: the script, drawing NAME.png. */
static void write_gp(const char *out, run_t *runs, int n, const char *title, int W, int H)
{
	char png[4096];
	FILE *f = fopen(out, "w");
	if (!f)
		cli_die("plot", "%s: %s", out, strerror(errno));
	snprintf(png, sizeof png, "%.*s.png", (int)(strlen(out) - 3), out);
	write_gnuplot(f, runs, n, title, W, H, png);
	if (fclose(f) != 0)
		cli_die("plot", "%s: write failed: %s", out, strerror(errno));
}

/* PNG: the same script in a temporary file, run by `gnuplot SCRIPT`. */
static void write_png(const char *out, run_t *runs, int n, const char *title, int W, int H)
{
	char path[] = "/tmp/loom-plot-XXXXXX", cmd[200];
	int fd = mkstemp(path);
	FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
	if (!f)
		cli_die("plot", "cannot create a temporary file for the gnuplot script: %s", strerror(errno));
	write_gnuplot(f, runs, n, title, W, H, out);
	if (fclose(f) != 0) {
		unlink(path);
		cli_die("plot", "%s: write failed: %s", path, strerror(errno));
	}
	snprintf(cmd, sizeof cmd, "gnuplot '%s' 2>&1", path);
	int st = system(cmd);
	unlink(path);
	if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) == 127)
		cli_die("plot", "PNG needs gnuplot (Debian: apt-get install gnuplot-nox, or scripts/deps.sh); "
		        "or write SVG: -o %.*s.svg", (int)(strlen(out) - 4), out);
	if (WEXITSTATUS(st) != 0)
		cli_die("plot", "gnuplot failed (exit %d) drawing %s", WEXITSTATUS(st), out);
}

int loom_cli_plot(int argc, char **argv)
{
	const char *out = NULL, *title = NULL, *v, *logs[MAX_RUNS];
	int n = 0, W = 1200, H = 450;
	run_t runs[MAX_RUNS];
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			fputs(usage_text, stdout);
			return 0;
		} else if (cli_flag(argc, argv, &i, "-o", &v) || cli_flag(argc, argv, &i, "--out", &v)) out = v;
		else if (cli_flag(argc, argv, &i, "--title", &v)) title = v;
		else if (cli_flag(argc, argv, &i, "--width", &v)) W = (int)cli_parse_int("plot", "--width", v);
		else if (cli_flag(argc, argv, &i, "--height", &v)) H = (int)cli_parse_int("plot", "--height", v);
		else if (argv[i][0] == '-' && argv[i][1])
			cli_die("plot", "unknown flag '%s' (see loom plot --help)", argv[i]);
		else if (n == MAX_RUNS)
			cli_die("plot", "at most %d logs in one plot", MAX_RUNS);
		else
			logs[n++] = argv[i];
	}
	if (n == 0 || !out)
		cli_die("plot", "usage: loom plot LOG.jsonl [MORE.jsonl ...] -o OUT.svg|OUT.png|OUT.gp (see --help)");
	if (W < 400 || W > 10000 || H < 250 || H > 10000)
		cli_die("plot", "--width %d x --height %d: expected 400..10000 x 250..10000 pixels", W, H);
	size_t len = strlen(out);
	int png = len > 4 && !strcasecmp(out + len - 4, ".png"), svg = len > 4 && !strcasecmp(out + len - 4, ".svg");
	int gp = len > 3 && !strcasecmp(out + len - 3, ".gp");
	if (!png && !svg && !gp)
		cli_die("plot", "-o %s: the name must end in .svg, .png or .gp (the format)", out);
	if (len > 3000)
		cli_die("plot", "-o %.40s...: a name of %zu bytes is too long", out, len);
	memset(runs, 0, sizeof runs);
	for (int r = 0; r < n; r++)
		read_run(logs[r], &runs[r]);
	if (png)
		write_png(out, runs, n, title, W, H);
	else if (gp)
		write_gp(out, runs, n, title, W, H);
	else
		write_svg(out, runs, n, title, W, H);
	long steps = 0;
	int segs = 0;
	for (int r = 0; r < n; r++) {
		steps += runs[r].n;
		segs += runs[r].nseg > 1 ? runs[r].nseg : 0;
		free(runs[r].step), free(runs[r].loss), free(runs[r].val), free(runs[r].tps);
		free(runs[r].loss_avg), free(runs[r].tps_avg), free(runs[r].pred);
	}
	printf("wrote %s (%d x %d, %s): %d run%s, %ld steps", out, W, H, png ? "PNG" : gp ? "gnuplot script" : "SVG", n,
	       n == 1 ? "" : "s", steps);
	if (segs)
		printf(", %d segments with their own settings", segs);
	putchar('\n');
	return 0;
}
