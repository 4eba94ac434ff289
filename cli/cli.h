/* cli.h: the `loom` command's subcommands and the small flag parser they share. */
#ifndef LOOM_CLI_H
#define LOOM_CLI_H

#include <stddef.h>

#include "loom/model.h"

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

/* The model flags `loom train` and `loom plan` share (model_flags.c): --arch, --model, --depth,
 * --aspect-ratio, --head-dim, --n-kv-head, --window-pattern, --short-window, --n-layer, --n-head,
 * --n-embd, --vocab-size, --n-positions, --init-from, and llama's --intermediate-size, --rope-theta,
 * --rms-norm-eps, --rope-scaling, --tie-word-embeddings, --attention-bias, --qkv-bias, --mlp-bias.
 * mc holds the fields given (-1, 0 or "" when not). */
typedef struct {
	loom_model_config_t mc;
	const char *preset, *init_from; /* init_from: the model file, once cli_model_flags_check resolved it */
	int have_model_flags, n_positions, n_head_flag, depth, aspect, head_dim;
	int llama_flags;                        /* 1 when a llama-only flag was given */
	int tie, attention_bias, qkv_bias, mlp_bias, rope_scaling_given; /* -1: not given */
	char init_file[1200];           /* --init-from resolved (loom_model_path) */
} cli_model_flags_t;
void cli_model_flags_init(cli_model_flags_t *f);
/* 1 when argv[*i] is one of them (taken, with its value; *i advanced as cli_flag does), else 0. */
int cli_model_flag(const char *cmd, int argc, char **argv, int *i, cli_model_flags_t *f);
/* Exit with one message for a combination that cannot be resolved (--init-from with size flags, a
 * nanochat flag without --arch nanochat, a GPT-2 preset with it), and resolve --init-from to its model
 * file as `loom sample --model` does (a file, a checkpoint directory, a --save-dir's newest: f->init_from
 * then points at f->init_file), or exit naming what it is not. */
void cli_model_flags_check(const char *cmd, cli_model_flags_t *f);
/* The configuration: from --init-from's file, nanochat's sizing or a GPT-2 preset, each override
 * replacing only its field; the positions are --n-positions, else the preset's (GPT-2) or *T
 * (nanochat, as base_train). *T (the training sequence length, -1: not given) defaults to the
 * model's maximum and may not exceed it. Exits with a message on any error. */
void cli_model_resolve(const char *cmd, const cli_model_flags_t *f, int *T, loom_model_config_t *out);

#endif
