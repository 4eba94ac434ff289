/* run_output.c: `loom run`'s per-rank output: splits what a rank writes into lines and writes each
 * one to our stdout or stderr (the same one the rank used) as "[rank r] line".
 *
 * Invariants: bytes reach our output in the order the rank wrote them and nothing is dropped (except
 * for ranks hidden by --ranks, and after our reader went away). A line ends at '\n', "\r\n" or '\r';
 * a '\r' line (a progress bar redrawing itself) is written with its '\r', so a terminal shows it in
 * place. A partial line is written after RUN_PARTIAL_FLUSH_S (or when the line buffer is full) and
 * its continuation is then written without a second prefix. At most one stream has an unfinished
 * line on a given output (the "dangling" one); before anything else is written there, that line is
 * ended with '\n', so lines of different ranks never run together. The lines found in one read are
 * gathered and written with one write() per output before the next read, so output appears as soon
 * as it is read, and a rank printing a lot costs few system calls.
 * When our reader is gone (EPIPE), the ranks' pipes to that output are closed, so the ranks see the
 * same broken pipe they would see writing there directly. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "run_output.h"

#define LINE_CAP 16384 /* longer lines are written in pieces */
#define TAIL_CAP 4096  /* hidden stderr kept for the failure report */
#define OUT_CAP 65536  /* output gathered per sink, written at the end of each read */

static struct {
	int checked, same_file; /* stdout and stderr are the same file (a terminal, usually) */
	run_stream_t *dangling[2];
	int broken[2];
	char buf[2][OUT_CAP];
	size_t len[2];
} sinks;

/* The dangling-line slot of output `out`: shared by stdout and stderr when they are one file. */
static run_stream_t **dangling_slot(int out)
{
	if (!sinks.checked) {
		struct stat a, b;
		sinks.checked = 1;
		sinks.same_file = fstat(1, &a) == 0 && fstat(2, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
	}
	return &sinks.dangling[sinks.same_file ? 0 : out - 1];
}

int run_sink_broken(int out)
{
	return sinks.broken[out - 1];
}

/* Write n bytes fully to `out` (retrying partial writes and EINTR); EPIPE marks the output broken
 * and nothing more is written to it. */
static void write_all(int out, const char *p, size_t n)
{
	while (n > 0 && !sinks.broken[out - 1]) {
		ssize_t w = write(out, p, n);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EPIPE)
				sinks.broken[out - 1] = 1;
			return;
		}
		p += w, n -= (size_t)w;
	}
}

/* Write what was gathered for output `out`. */
static void flush_sink(int out)
{
	write_all(out, sinks.buf[out - 1], sinks.len[out - 1]);
	sinks.len[out - 1] = 0;
}

/* Gather n bytes for output `out`. */
static void put(int out, const char *p, size_t n)
{
	if (sinks.len[out - 1] + n > OUT_CAP)
		flush_sink(out);
	if (n > OUT_CAP) {
		write_all(out, p, n);
		return;
	}
	memcpy(sinks.buf[out - 1] + sinks.len[out - 1], p, n);
	sinks.len[out - 1] += n;
}

/* Gathered output reaches the file in order: before writing to one output, flush the other when
 * both are the same file. */
static void put_ordered(int out, const char *p, size_t n)
{
	dangling_slot(out);
	if (sinks.same_file && sinks.len[2 - out])
		flush_sink(3 - out);
	put(out, p, n);
}

/* End the unfinished line another stream left on `out`, so the next text starts a fresh line. */
static void end_dangling(int out, const run_stream_t *self)
{
	run_stream_t **d = dangling_slot(out);
	if (*d && *d != self) {
		put_ordered((*d)->out, "\n", 1);
		(*d)->midline = 0;
		*d = NULL;
	}
}

static void tail_append(run_stream_t *s, const char *p, size_t n)
{
	if (n >= TAIL_CAP) {
		p += n - TAIL_CAP, n = TAIL_CAP;
		s->tail_len = 0;
	}
	if (s->tail_len + n > TAIL_CAP) {
		size_t drop = s->tail_len + n - TAIL_CAP;
		memmove(s->tail, s->tail + drop, s->tail_len - drop);
		s->tail_len -= drop;
	}
	memcpy(s->tail + s->tail_len, p, n);
	s->tail_len += n;
}

/* Write one piece of a line: the prefix unless the line was started already, the text, and the
 * terminator term ("\n", "\r\n", "\r", or "" for a partial line). */
static void emit(run_stream_t *s, const char *p, size_t n, const char *term)
{
	char prefix[32];
	size_t tn = strlen(term);
	run_stream_t **d;
	if (!s->show) {
		if (s->tail) {
			tail_append(s, p, n);
			tail_append(s, "\n", tn ? 1 : 0);
		}
		return;
	}
	if (n == 0 && !s->midline && term[0] == '\r' && term[1] == '\0')
		return; /* "\r" at the start of a line (progress bars redraw this way): nothing to show */
	end_dangling(s->out, s);
	if (!s->midline)
		put_ordered(s->out, prefix, (size_t)snprintf(prefix, sizeof prefix, "[rank %d] ", s->rank));
	put_ordered(s->out, p, n);
	put_ordered(s->out, term, tn);
	d = dangling_slot(s->out);
	if (strcmp(term, "\n") == 0 || strcmp(term, "\r\n") == 0) {
		s->midline = 0;
		if (*d == s)
			*d = NULL;
	} else {
		/* A partial line, or a '\r' line still on screen: the next stream's text must start with
		 * '\n'. After '\r' this stream's next piece is a new line (prefixed) drawn over it. */
		s->midline = tn == 0;
		*d = s;
	}
}

/* Write the complete lines in s->buf and keep the rest. With `all`, also the rest (as a partial
 * line, a lone trailing '\r' included). */
static void process(run_stream_t *s, int all)
{
	size_t i = 0, start = 0;
	while (i < s->len) {
		char c = s->buf[i];
		if (c == '\n') {
			emit(s, s->buf + start, i - start, "\n");
			start = ++i;
		} else if (c == '\r') {
			if (i + 1 == s->len && !all)
				break; /* might be the first half of "\r\n" */
			if (i + 1 < s->len && s->buf[i + 1] == '\n') {
				emit(s, s->buf + start, i - start, "\r\n");
				i += 2;
			} else {
				emit(s, s->buf + start, i - start, "\r");
				i += 1;
			}
			start = i;
		} else {
			i++;
		}
	}
	if (start < s->len && (all || (start == 0 && s->len == s->cap))) {
		emit(s, s->buf + start, s->len - start, "");
		start = s->len;
	}
	memmove(s->buf, s->buf + start, s->len - start);
	s->len -= start;
	flush_sink(1), flush_sink(2);
}

int run_stream_init(run_stream_t *s, int fd, int out, int rank, int show)
{
	memset(s, 0, sizeof *s);
	s->fd = fd, s->out = out, s->rank = rank, s->show = show;
	s->log_fd = -1;
	s->cap = LINE_CAP;
	s->buf = malloc(s->cap);
	if (!show && out == 2)
		s->tail = malloc(TAIL_CAP);
	if (!s->buf || (!show && out == 2 && !s->tail)) {
		free(s->buf), free(s->tail);
		s->buf = s->tail = NULL;
		return -1;
	}
	return 0;
}

void run_stream_free(run_stream_t *s)
{
	run_stream_t **d;
	if (!s->buf)
		return; /* never set up */
	d = dangling_slot(s->out);
	if (s->fd >= 0)
		close(s->fd);
	if (s->log_fd >= 0)
		close(s->log_fd);
	s->log_fd = -1;
	if (*d == s)
		*d = NULL;
	free(s->buf), free(s->tail);
	s->buf = s->tail = NULL;
	s->fd = -1;
}

void run_stream_finish(run_stream_t *s)
{
	if (s->len)
		process(s, 1);
	if (s->midline)
		emit(s, "", 0, "\n");
	else if (*dangling_slot(s->out) == s)
		end_dangling(s->out, NULL);
	flush_sink(1), flush_sink(2);
}

int run_stream_read(run_stream_t *s, double now)
{
	ssize_t n;
	if (s->fd < 0)
		return -1;
	if (sinks.broken[s->out - 1]) {
		close(s->fd); /* the rank now gets EPIPE, as it would writing to our output directly */
		s->fd = -1;
		s->len = 0;
		return -1;
	}
	do
		n = read(s->fd, s->buf + s->len, s->cap - s->len);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : (run_stream_finish(s), close(s->fd), s->fd = -1, -1);
	if (n == 0) {
		run_stream_finish(s);
		close(s->fd);
		s->fd = -1;
		return -1;
	}
	for (ssize_t w = 0, k; s->log_fd >= 0 && w < n; w += k) /* --log-dir: the bytes as the rank wrote them */
		if ((k = write(s->log_fd, s->buf + s->len + w, (size_t)(n - w))) < 0 && errno != EINTR) {
			close(s->log_fd);
			s->log_fd = -1;
		} else if (k < 0) {
			k = 0;
		}
	if (s->len == 0)
		s->since = now;
	s->len += (size_t)n;
	process(s, 0);
	if (s->len && s->len < (size_t)n)
		s->since = now; /* what is left arrived in this read */
	return 1;
}

int run_stream_drain(run_stream_t *s, double now)
{
	int rc;
	while ((rc = run_stream_read(s, now)) == 1)
		;
	return rc;
}

double run_stream_deadline(const run_stream_t *s)
{
	return s->len ? s->since + RUN_PARTIAL_FLUSH_S : 0;
}

void run_stream_flush_partial(run_stream_t *s)
{
	if (s->len)
		process(s, 1);
}

void run_stream_print_tail(const run_stream_t *s)
{
	const char *p = s->tail, *end;
	if (!s->tail || s->tail_len == 0)
		return;
	end = s->tail + s->tail_len;
	if (s->tail_len == TAIL_CAP) { /* the first line was cut: start at the next one */
		const char *nl = memchr(p, '\n', s->tail_len);
		if (nl)
			p = nl + 1;
	}
	run_note("rank %d's last stderr lines (not shown above because of --ranks):", s->rank);
	while (p < end) {
		const char *nl = memchr(p, '\n', (size_t)(end - p));
		size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
		fprintf(stderr, "[rank %d] %.*s\n", s->rank, (int)n, p);
		p += n + 1;
	}
}

void run_note(const char *fmt, ...)
{
	va_list ap;
	end_dangling(2, NULL);
	flush_sink(1), flush_sink(2);
	if (sinks.broken[1])
		return;
	fputs("loom run: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	fflush(stderr);
}
