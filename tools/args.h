/*
 * args.h - small helpers shared by the kvstage subcommands: a strict flag
 * scanner (`--flag value` and `--flag=value`), a strict whole-number parser
 * that rejects junk, signs, negatives and overflow, an overflow-checked
 * multiply, a byte-count formatter, the library's bound of a setting (the
 * one set every flag's limit comes from), and the one-line error report
 * every subcommand uses. A flag that may repeat is taken out of argv first
 * (cli_args_take_all).
 *
 * They never exit and never allocate; they write at most one line to stderr
 * (cli_fail). The scanner only records where each flag's value is; what a
 * value means is up to the subcommand.
 */
#ifndef KVSTAGE_TOOLS_ARGS_H
#define KVSTAGE_TOOLS_ARGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The largest value the library takes for the kvs_sim_config_t field
 * `field` (kvs_sim_config_bound of <kvstage/sim.h>, the one set of bounds:
 * kvs_sim_run checks them), which a flag scales to its own unit. The field
 * must have a bound below 2^63 (asserted). */
int64_t cli_bound_max(const char *field);

/* Exit status for bad input on the command line. */
#define CLI_EXIT_USAGE 2

/* One flag a subcommand accepts. name includes the leading "--". */
typedef struct cli_flag {
    const char *name;
    bool takes_value;
} cli_flag_t;

/*
 * Scans argv[first..argc) against defs[0..n). For each flag given,
 * values[i] points at its value (inside argv) or, for a flag without a
 * value, at the flag itself; flags not given stay NULL. Rejects unknown
 * flags, positional arguments, a flag given twice, a missing value and a
 * value given to a flag that takes none. On error prints one line
 * "kvstage <cmd>: ..." to stderr and returns CLI_EXIT_USAGE; returns 0 on
 * success. values must have room for n entries.
 */
int cli_args_scan(const char *cmd, const cli_flag_t *defs, size_t n, int argc,
                  char **argv, int first, const char **values);

/*
 * For a flag that may be given several times (cli_args_scan refuses a
 * repeat): takes every `flag VALUE` and `flag=VALUE` out of
 * argv[first..*argc), in order, before the scan. values[0..*count) point at
 * the values (inside argv); argv keeps the other arguments in their order
 * and *argc shrinks. A value never starts with "--", as for the scanner.
 * More than max occurrences, or one without a value, prints one line and
 * returns CLI_EXIT_USAGE; 0 on success.
 */
int cli_args_take_all(const char *cmd, const char *flag, int *argc, char **argv, int first,
                      const char **values, size_t max, size_t *count);

/*
 * Parses text as a plain decimal whole number in [min, max]: digits only,
 * no sign, no spaces, no suffix. On error prints one line naming `flag` and
 * the accepted range and returns CLI_EXIT_USAGE; returns 0 and sets *out on
 * success.
 */
int cli_parse_i64(const char *cmd, const char *flag, const char *text,
                  int64_t min, int64_t max, int64_t *out);

/* Like cli_parse_i64 for an unsigned 64-bit value in [min, max] (seeds). */
int cli_parse_u64(const char *cmd, const char *flag, const char *text,
                  uint64_t min, uint64_t max, uint64_t *out);

/* a * b into *out; false (and *out untouched) when it would overflow or a
 * factor is negative. */
bool cli_mul_i64(int64_t a, int64_t b, int64_t *out);

/* Bytes with a binary unit into buf, e.g. "1.25 GiB"; plain "512 B" below
 * 1 KiB. Returns buf. Display only: decide nothing on the rounded value. */
const char *cli_format_bytes(int64_t bytes, char *buf, size_t len);

/* Prints "kvstage <cmd>: <message>\n" to stderr as one line and returns
 * CLI_EXIT_USAGE. Newlines inside the message are turned into spaces so the
 * report stays one line. */
int cli_fail(const char *cmd, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

#endif
