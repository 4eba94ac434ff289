/* plot.c: `loom plot`: training curves from `loom train --log` files, as SVG (written here) or PNG
 * (drawn by gnuplot, Debian's gnuplot-nox).
 *
 * Two panels side by side, every run in its own color: loss against step (the training loss as a
 * light line, its moving average over ~1/50 of the run as a solid one, the validation loss as a
 * dashed line with points) and tokens/s against step (the same moving average). A run is named by
 * its file (without .jsonl) and, from its config record, its model and batch. Only step lines are
 * read ({"step":N,...}); the config record, summary and unknown lines are skipped, so logs of older
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
	"usage: loom plot LOG.jsonl [MORE.jsonl ...] -o OUT.svg|OUT.png [--title TEXT] [--width W] [--height H]\n"
	"\n"
	"Draws the loss and validation loss against step (left) and tokens/s against step (right) of one or\n"
	"several `loom train --log` runs, each in its own color. OUT's extension picks the format: .svg is\n"
	"written directly; .png is drawn by gnuplot (Debian: gnuplot-nox; scripts/deps.sh installs it).\n"
	"  -o, --out FILE   the picture (required)\n"
	"  --title TEXT     a title above the panels (default: none)\n"
	"  --width W        pixels (default 1200)\n"
	"  --height H       pixels (default 450)\n";

#define MAX_RUNS 8
static const char *const colors[MAX_RUNS] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                             "#9467bd", "#8c564b", "#e377c2", "#17becf"};

typedef struct {
	char name[256];
	long n, cap;
	double *step, *loss, *val, *tps; /* val: NAN on steps without one */
	double *loss_avg, *tps_avg;
	double predicted_tps; /* tokens per step / the planner's predicted step time (the log's config), or 0 */
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
	double **arrays[6] = {&r->step, &r->loss, &r->val, &r->tps, &r->loss_avg, &r->tps_avg};
	r->cap = r->cap ? 2 * r->cap : 1024;
	for (int k = 0; k < 6; k++)
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

static void read_run(const char *path, run_t *r)
{
	FILE *f = fopen(path, "r");
	char *line = NULL, model[160] = "";
	size_t cap = 0;
	const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
	if (!f)
		cli_die("plot", "%s: %s", path, strerror(errno));
	while (getline(&line, &cap, f) > 0) {
		if (strncmp(line, "{\"config\":", 10) == 0) {
			double L = field(line, "n_layer"), C = field(line, "n_embd"), tok = field(line, "tokens_per_step");
			double lr = field(line, "lr"), world = field(line, "world"), pred = field(line, "predicted_step_s");
			if (isfinite(pred) && pred > 0 && isfinite(tok))
				r->predicted_tps = tok / pred;
			if (isfinite(L) && isfinite(C))
				snprintf(model, sizeof model, " (L%.0f C%.0f, %.0f tok/step, lr %g%s%.0f)", L, C, tok, lr,
				         world > 1 ? ", ranks " : "", world > 1 ? world : 0.0);
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
		r->n++;
	}
	free(line);
	fclose(f);
	if (r->n == 0)
		cli_die("plot", "%s: no step lines ({\"step\":N,...}): not a `loom train --log` file?", path);
	size_t blen = strlen(base);
	if (model[0] && strlen(model) > 100)
		model[0] = 0;
	snprintf(r->name, sizeof r->name, "%.*s%s", (int)(blen > 6 && !strcmp(base + blen - 6, ".jsonl") ? blen - 6 : blen),
	         base, model);
	long w = r->n / 50 > 1 ? r->n / 50 : 1;
	smooth(r->loss, r->loss_avg, r->n, w);
	smooth(r->tps, r->tps_avg, r->n, w);
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
			const double *arrays[3] = {runs[r].loss, runs[r].val, runs[r].tps_avg};
			for (int k = which == 0 ? 0 : 2; k <= (which == 0 ? 1 : 2); k++)
				if (isfinite(arrays[k][i]))
					*lo = fmin(*lo, arrays[k][i]), *hi = fmax(*hi, arrays[k][i]);
		}
	for (int r = 0; r < n && which == 1; r++) /* the predicted throughput is drawn too */
		if (runs[r].predicted_tps > 0)
			*lo = fmin(*lo, runs[r].predicted_tps), *hi = fmax(*hi, runs[r].predicted_tps);
	if (!isfinite(*lo))
		*lo = 0, *hi = 1;
}

static void write_svg(const char *out, run_t *runs, int n, const char *title, int W, int H)
{
	FILE *f = fopen(out, "w");
	double top = title ? 40 : 16, legend = 18.0 * n + 8;
	panel_t p[2];
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
	for (int r = 0; r < n; r++) {
		char style[200];
		const run_t *u = &runs[r];
		snprintf(style, sizeof style, "stroke=\"%s\" stroke-opacity=\"0.3\" stroke-width=\"1\"", colors[r]);
		svg_line(f, &p[0], u->step, u->loss, u->n, style);
		snprintf(style, sizeof style, "stroke=\"%s\" stroke-width=\"2\"", colors[r]);
		svg_line(f, &p[0], u->step, u->loss_avg, u->n, style);
		svg_line(f, &p[1], u->step, u->tps_avg, u->n, style);
		if (u->predicted_tps > 0) { /* the planner's prediction: a dotted line across the run */
			double xs[2] = {u->step[0], u->step[u->n - 1]}, ys[2] = {u->predicted_tps, u->predicted_tps};
			snprintf(style, sizeof style, "stroke=\"%s\" stroke-width=\"1.5\" stroke-dasharray=\"2,3\"", colors[r]);
			svg_line(f, &p[1], xs, ys, 2, style);
		}
		/* validation: a dashed line through its points */
		double *vx = malloc((size_t)u->n * sizeof *vx), *vy = malloc((size_t)u->n * sizeof *vy);
		long m = 0;
		if (!vx || !vy)
			cli_die("plot", "out of memory");
		for (long i = 0; i < u->n; i++)
			if (isfinite(u->val[i]))
				vx[m] = u->step[i], vy[m++] = u->val[i];
		snprintf(style, sizeof style, "stroke=\"%s\" stroke-width=\"2\" stroke-dasharray=\"6,4\"", colors[r]);
		svg_line(f, &p[0], vx, vy, m, style);
		for (long i = 0; i < m; i++)
			fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"white\" stroke=\"%s\" stroke-width=\"2\"/>\n",
			        px(&p[0], vx[i]), py(&p[0], vy[i]), colors[r]);
		free(vx), free(vy);
		/* legend row */
		double ly = H - legend + 18.0 * r + 8;
		fprintf(f, "<line x1=\"70\" y1=\"%.1f\" x2=\"100\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2\"/>\n", ly, ly,
		        colors[r]);
		fprintf(f, "<line x1=\"106\" y1=\"%.1f\" x2=\"136\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2\" "
		        "stroke-dasharray=\"6,4\"/>\n<text x=\"144\" y=\"%.1f\">", ly, ly, colors[r], ly + 4);
		xml_text(f, u->name);
		fputs(": loss (moving average; light: per step), val loss (dashed)</text>\n", f);
	}
	fputs("</svg>\n", f);
	if (fclose(f) != 0)
		cli_die("plot", "%s: write failed: %s", out, strerror(errno));
}

/* PNG through gnuplot: the data as plain columns in temp files, a script, `gnuplot SCRIPT`. */
static void write_png(const char *out, run_t *runs, int n, const char *title, int W, int H)
{
	char dir[] = "/tmp/loom-plot-XXXXXX", path[600], cmd[800];
	FILE *f;
	if (!mkdtemp(dir))
		cli_die("plot", "cannot create a temporary directory: %s", strerror(errno));
	for (int r = 0; r < n; r++) {
		snprintf(path, sizeof path, "%s/run%d.dat", dir, r);
		if (!(f = fopen(path, "w")))
			cli_die("plot", "%s: %s", path, strerror(errno));
		for (long i = 0; i < runs[r].n; i++)
			fprintf(f, "%.17g %.9g %.9g %.9g %.9g %.9g\n", runs[r].step[i], runs[r].loss[i], runs[r].loss_avg[i],
			        isfinite(runs[r].val[i]) ? runs[r].val[i] : NAN, runs[r].tps_avg[i],
			        runs[r].predicted_tps > 0 ? runs[r].predicted_tps : NAN);
		fclose(f);
		/* the validation points alone, so that gnuplot joins them (in the file above the steps without
		 * one are missing values, which break a line into its single points) */
		snprintf(path, sizeof path, "%s/val%d.dat", dir, r);
		if (!(f = fopen(path, "w")))
			cli_die("plot", "%s: %s", path, strerror(errno));
		int any = 0;
		for (long i = 0; i < runs[r].n; i++)
			if (isfinite(runs[r].val[i]))
				fprintf(f, "%.17g %.9g\n", runs[r].step[i], runs[r].val[i]), any = 1;
		if (!any)
			fprintf(f, "nan nan\n"); /* gnuplot refuses an empty file */
		fclose(f);
	}
	snprintf(path, sizeof path, "%s/plot.gp", dir);
	if (!(f = fopen(path, "w")))
		cli_die("plot", "%s: %s", path, strerror(errno));
	fprintf(f, "set terminal pngcairo size %d,%d font 'sans,10'\nset output '%s'\nset datafile missing 'nan'\n"
	        "set multiplot layout 1,2%s%s%s\nset grid\nset key top right\nset xlabel 'step'\n", W, H, out,
	        title ? " title '" : "", title ? title : "", title ? "'" : "");
	fputs("set ylabel 'loss'\nplot ", f);
	for (int r = 0; r < n; r++)
		fprintf(f, "%s'%s/run%d.dat' u 1:2 w l lc rgb '%s' lw 1 dt 1 notitle, '' u 1:3 w l lc rgb '%s' lw 2 "
		        "title '%s', '%s/val%d.dat' u 1:2 w lp lc rgb '%s' lw 2 dt 2 pt 6 title 'val'", r ? ", " : "", dir, r,
		        colors[r], colors[r], runs[r].name, dir, r, colors[r]);
	fputs("\nset ylabel 'tokens/s'\nplot ", f);
	for (int r = 0; r < n; r++)
		fprintf(f, "%s'%s/run%d.dat' u 1:5 w l lc rgb '%s' lw 2 notitle%s%s%s%s", r ? ", " : "", dir, r, colors[r],
		        runs[r].predicted_tps > 0 ? ", '' u 1:6 w l lc rgb '" : "", runs[r].predicted_tps > 0 ? colors[r] : "",
		        runs[r].predicted_tps > 0 ? "' lw 1 dt 3 title 'predicted (loom plan)'" : "", "");
	fputs("\nunset multiplot\n", f);
	fclose(f);
	snprintf(cmd, sizeof cmd, "gnuplot '%s' 2>&1", path);
	int st = system(cmd);
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	if (system(cmd) != 0) {
	}
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
		cli_die("plot", "usage: loom plot LOG.jsonl [MORE.jsonl ...] -o OUT.svg|OUT.png (see --help)");
	if (W < 400 || W > 10000 || H < 250 || H > 10000)
		cli_die("plot", "--width %d x --height %d: expected 400..10000 x 250..10000 pixels", W, H);
	size_t len = strlen(out);
	int png = len > 4 && !strcasecmp(out + len - 4, ".png"), svg = len > 4 && !strcasecmp(out + len - 4, ".svg");
	if (!png && !svg)
		cli_die("plot", "-o %s: the name must end in .svg or .png (the format)", out);
	if (png && (strchr(out, '\'') || (title && strchr(title, '\''))))
		cli_die("plot", "-o and --title cannot hold a ' for gnuplot");
	memset(runs, 0, sizeof runs);
	for (int r = 0; r < n; r++)
		read_run(logs[r], &runs[r]);
	if (png)
		write_png(out, runs, n, title, W, H);
	else
		write_svg(out, runs, n, title, W, H);
	long steps = 0;
	for (int r = 0; r < n; r++) {
		steps += runs[r].n;
		free(runs[r].step), free(runs[r].loss), free(runs[r].val), free(runs[r].tps);
		free(runs[r].loss_avg), free(runs[r].tps_avg);
	}
	printf("wrote %s (%d x %d, %s): %d run%s, %ld steps\n", out, W, H, png ? "PNG" : "SVG", n, n == 1 ? "" : "s", steps);
	return 0;
}
