/*
 * args.c - strict flag scanning and number parsing for the kvstage CLI (see
 * args.h). Accepts `--flag value` and `--flag=value`; everything else that
 * is not a declared flag is an error, reported on exactly one stderr line.
 * Also the shared number parsers, the byte-count formatter and the
 * library's bounds.
 */
#include "args.h"

#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <kvstage/sim.h>

int64_t cli_bound_max(const char *field)
{
    const kvs_sim_bound_t *b = kvs_sim_config_bound(field);
    assert(b != NULL && b->max <= (uint64_t)INT64_MAX);
    return (int64_t)b->max;
}

int cli_fail(const char *cmd, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    for (char *c = msg; *c != '\0'; c++) {
        if (*c == '\n' || *c == '\r')
            *c = ' ';
    }
    if (cmd != NULL && cmd[0] != '\0')
        fprintf(stderr, "kvstage %s: %s\n", cmd, msg);
    else
        fprintf(stderr, "kvstage: %s\n", msg);
    return CLI_EXIT_USAGE;
}

static const cli_flag_t *cli__flag_find(const cli_flag_t *defs, size_t n,
                                        const char *name, size_t name_len,
                                        size_t *index)
{
    for (size_t i = 0; i < n; i++) {
        if (strlen(defs[i].name) == name_len &&
            strncmp(defs[i].name, name, name_len) == 0) {
            *index = i;
            return &defs[i];
        }
    }
    return NULL;
}

int cli_args_scan(const char *cmd, const cli_flag_t *defs, size_t n, int argc,
                  char **argv, int first, const char **values)
{
    for (size_t i = 0; i < n; i++)
        values[i] = NULL;
    for (int a = first; a < argc; a++) {
        const char *arg = argv[a];
        if (strncmp(arg, "--", 2) != 0 || arg[2] == '\0')
            return cli_fail(cmd, "unexpected argument '%s': every input is a "
                                 "--flag (see kvstage %s --help)", arg, cmd);
        const char *eq = strchr(arg, '=');
        size_t name_len = eq != NULL ? (size_t)(eq - arg) : strlen(arg);
        size_t idx = 0;
        const cli_flag_t *def = cli__flag_find(defs, n, arg, name_len, &idx);
        if (def == NULL)
            return cli_fail(cmd, "unknown flag %.*s (see kvstage %s --help)",
                            (int)name_len, arg, cmd);
        if (values[idx] != NULL)
            return cli_fail(cmd, "%s given twice: give it once", def->name);
        if (!def->takes_value) {
            if (eq != NULL)
                return cli_fail(cmd, "%s takes no value (got '%s')", def->name,
                                eq + 1);
            values[idx] = arg;
            continue;
        }
        if (eq != NULL) {
            values[idx] = eq + 1;
            continue;
        }
        if (a + 1 >= argc || strncmp(argv[a + 1], "--", 2) == 0)
            return cli_fail(cmd, "%s needs a value: %s VALUE or %s=VALUE",
                            def->name, def->name, def->name);
        values[idx] = argv[++a];
    }
    return 0;
}

int cli_args_take_all(const char *cmd, const char *flag, int *argc, char **argv, int first,
                      const char **values, size_t max, size_t *count)
{
    const size_t flag_len = strlen(flag);
    int kept = first;
    *count = 0;
    for (int a = first; a < *argc; a++) {
        const char *arg = argv[a];
        const bool bare = strcmp(arg, flag) == 0;
        if (!bare && !(strncmp(arg, flag, flag_len) == 0 && arg[flag_len] == '=')) {
            argv[kept++] = argv[a];
            continue;
        }
        if (bare && (a + 1 >= *argc || strncmp(argv[a + 1], "--", 2) == 0))
            return cli_fail(cmd, "%s needs a value: %s VALUE or %s=VALUE", flag, flag, flag);
        if (*count == max)
            return cli_fail(cmd, "%s given more than %zu times: give at most %zu", flag, max,
                            max);
        values[(*count)++] = bare ? argv[++a] : arg + flag_len + 1;
    }
    *argc = kept;
    return 0;
}

/* Reads text as plain decimal digits into *out. Returns 0, or which error:
 * 1 empty, 2 negative, 3 not digits, 4 above UINT64_MAX. */
static int cli__parse_digits(const char *text, uint64_t *out)
{
    if (text == NULL || text[0] == '\0')
        return 1;
    if (text[0] == '-')
        return 2;
    uint64_t v = 0;
    for (const char *c = text; *c != '\0'; c++) {
        if (*c < '0' || *c > '9')
            return 3;
        unsigned digit = (unsigned)(*c - '0');
        if (v > (UINT64_MAX - digit) / 10)
            return 4;
        v = v * 10 + digit;
    }
    *out = v;
    return 0;
}

int cli_parse_u64(const char *cmd, const char *flag, const char *text,
                  uint64_t min, uint64_t max, uint64_t *out)
{
    uint64_t v = 0;
    unsigned long long lo = min, hi = max;
    switch (cli__parse_digits(text, &v)) {
    case 0:
        break;
    case 1:
        return cli_fail(cmd, "%s is empty: give a whole number in %llu..%llu",
                        flag, lo, hi);
    case 2:
        return cli_fail(cmd, "%s: '%s' is negative: give a whole number in "
                             "%llu..%llu", flag, text, lo, hi);
    case 3:
        return cli_fail(cmd, "%s: '%s' is not a whole number: give plain "
                             "decimal digits in %llu..%llu", flag, text, lo, hi);
    default:
        return cli_fail(cmd, "%s: '%s' is too large: give a whole number in "
                             "%llu..%llu", flag, text, lo, hi);
    }
    if (v < min || v > max)
        return cli_fail(cmd, "%s: %llu is out of range: give a whole number in "
                             "%llu..%llu", flag, (unsigned long long)v, lo, hi);
    *out = v;
    return 0;
}

int cli_parse_i64(const char *cmd, const char *flag, const char *text,
                  int64_t min, int64_t max, int64_t *out)
{
    long long lo = min, hi = max;
    uint64_t v = 0;
    switch (cli__parse_digits(text, &v)) {
    case 0:
        break;
    case 1:
        return cli_fail(cmd, "%s is empty: give a whole number in %lld..%lld",
                        flag, lo, hi);
    case 2:
        return cli_fail(cmd, "%s: '%s' is negative: give a whole number in "
                             "%lld..%lld", flag, text, lo, hi);
    case 3:
        return cli_fail(cmd, "%s: '%s' is not a whole number: give plain "
                             "decimal digits in %lld..%lld", flag, text, lo, hi);
    default:
        v = UINT64_MAX;
        break;
    }
    if (v > (uint64_t)INT64_MAX)
        return cli_fail(cmd, "%s: '%s' is too large: give a whole number in "
                             "%lld..%lld", flag, text, lo, hi);
    if ((int64_t)v < min || (int64_t)v > max)
        return cli_fail(cmd, "%s: %lld is out of range: give a whole number in "
                             "%lld..%lld", flag, (long long)v, lo, hi);
    *out = (int64_t)v;
    return 0;
}

bool cli_mul_i64(int64_t a, int64_t b, int64_t *out)
{
    if (a < 0 || b < 0)
        return false;
    if (a != 0 && b > INT64_MAX / a)
        return false;
    *out = a * b;
    return true;
}

const char *cli_format_bytes(int64_t bytes, char *buf, size_t len)
{
    static const char *const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    if (bytes < 1024) {
        snprintf(buf, len, "%lld B", (long long)bytes);
        return buf;
    }
    double v = (double)bytes / 1024.0;
    size_t u = 0;
    while (v >= 1024.0 && u + 1 < sizeof units / sizeof units[0]) {
        v /= 1024.0;
        u++;
    }
    snprintf(buf, len, "%.2f %s", v, units[u]);
    return buf;
}
