/* run_output.h: `loom run`'s per-rank output streams: read a rank's stdout or stderr pipe and write
 * its lines to ours, each prefixed "[rank r] " (internal to the CLI). */
#ifndef LOOM_CLI_RUN_OUTPUT_H
#define LOOM_CLI_RUN_OUTPUT_H

#include <stddef.h>

/* A partial line (no '\n' or '\r' yet) is written after it has waited this long, so prompts and
 * progress output appear promptly. */
#define RUN_PARTIAL_FLUSH_S 0.1

typedef struct run_stream {
	int fd;        /* read end of the rank's pipe (non-blocking), -1 once closed */
	int out;       /* where lines go: 1 (stdout) or 2 (stderr) */
	int rank;
	int show;      /* 0: hidden by --ranks; stderr is then only kept in `tail` */
	char *buf;     /* pending bytes of the current line, not yet written */
	size_t len, cap;
	double since;  /* when the oldest pending byte arrived */
	int midline;   /* part of the current line was written without its terminator */
	char *tail;    /* hidden stderr: the last bytes, for the failure report (NULL otherwise) */
	size_t tail_len;
	int log_fd;    /* --log-dir: every byte read is also written here as it is; -1: none */
} run_stream_t;

/* Set up a stream reading fd for `rank` (log_fd -1); returns 0, or -1 when out of memory. */
int run_stream_init(run_stream_t *s, int fd, int out, int rank, int show);
/* Close the pipe (if still open) and the log file, and free the buffers. */
void run_stream_free(run_stream_t *s);

/* Read once from the pipe and write the complete lines. Returns 1 when data was read, 0 when none
 * is available now, -1 at end of file (the stream is then flushed and its fd closed). */
int run_stream_read(run_stream_t *s, double now);
/* Read until the pipe is empty or at end of file; returns as run_stream_read's last call. */
int run_stream_drain(run_stream_t *s, double now);
/* Time at which the pending partial line must be written, or 0 when none is pending. */
double run_stream_deadline(const run_stream_t *s);
/* Write the pending partial line now (without a terminator; the line continues later). */
void run_stream_flush_partial(run_stream_t *s);
/* Write everything pending and end a started line with '\n'; used at end of file. */
void run_stream_finish(run_stream_t *s);

/* Print the last lines a hidden rank wrote to stderr (prefixed), after a `loom run:` header line. */
void run_stream_print_tail(const run_stream_t *s);

/* Print a `loom run: ...` message on stderr, first ending any rank's partial line left on it. */
void run_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* 1 once writing to our stdout (1) or stderr (2) failed with EPIPE: the reader is gone. */
int run_sink_broken(int out);

#endif
