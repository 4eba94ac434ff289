/* cli.h: the `loom` command's subcommands and the small flag parser they share. */
#ifndef LOOM_CLI_H
#define LOOM_CLI_H

#include <stddef.h>

/* Each subcommand gets argv with argv[0] = its name; returns the process exit code. */
int loom_cli_run(int argc, char **argv);
int loom_cli_train(int argc, char **argv);
int loom_cli_plan(int argc, char **argv);
int loom_cli_sample(int argc, char **argv);
int loom_cli_data(int argc, char **argv);
int loom_cli_tokenizer(int argc, char **argv);
int loom_cli_bench(int argc, char **argv);
int loom_cli_convert(int argc, char **argv);
int loom_cli_info(int argc, char **argv);
int loom_cli_plot(int argc, char **argv);

/* Flag parsing: `--name value` or `--name=value`. cli_flag() returns 1 when argv[*i] is the flag
 * `name`, storing its value in *val (and advancing *i past a separate value); it exits with a clear
 * message when the value is missing. The cli_parse_* helpers exit(2) with "loom CMD: --flag: ..."
 * on a malformed value. */
int cli_flag(int argc, char **argv, int *i, const char *name, const char **val);
long long cli_parse_int(const char *cmd, const char *flag, const char *s);
double cli_parse_double(const char *cmd, const char *flag, const char *s);
/* Sizes such as 8, 4K, 16M, 1G (powers of 1024). */
size_t cli_parse_size(const char *cmd, const char *flag, const char *s);
void cli_die(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3), noreturn));

#endif
