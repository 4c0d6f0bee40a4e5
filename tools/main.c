/*
 * main.c - entry point of the `kvstage` command: dispatches `kvstage
 * <command> ...` to the subcommand's main and prints the top-level help.
 * Subcommands live in their own files (plan.c, sim.c, serve.c) and are
 * listed once in cli_commands below; serve exists where the verbs fabric
 * was built (KVS_CLI_SERVE). Exit status: the subcommand's, or 2
 * for an unknown or missing command.
 */
#include <stdio.h>
#include <string.h>

#include "args.h"
#include "plan.h"
#include "sim.h"
#ifdef KVS_CLI_SERVE
#include "serve.h"
#endif

typedef struct cli_command {
    const char *name;
    int (*run)(int argc, char **argv); /* argv[0] is the command name */
    void (*usage)(FILE *out);
    const char *summary;
} cli_command_t;

static const cli_command_t cli_commands[] = {
    {"plan", cli_plan_main, cli_plan_usage,
     "show the staging layout of one chunk and size the decode ring"},
    {"sim", cli_sim_main, cli_sim_usage,
     "simulate prefill->decode KV transfers on simulated GPUs and RDMA"},
#ifdef KVS_CLI_SERVE
    {"serve", cli_serve_main, cli_serve_usage,
     "run the prefill or decode ranks over RDMA (verbs) and verify every byte"},
#endif
};

#define CLI_COMMAND_COUNT (sizeof cli_commands / sizeof cli_commands[0])

static const cli_command_t *cli_command_find(const char *name)
{
    for (size_t i = 0; i < CLI_COMMAND_COUNT; i++) {
        if (strcmp(cli_commands[i].name, name) == 0)
            return &cli_commands[i];
    }
    return NULL;
}

static void cli_usage(FILE *out)
{
    fprintf(out,
            "usage: kvstage <command> [flags]\n"
            "\n"
            "kvstage moves an LLM's KV cache from prefill to decode ranks through\n"
            "a staging buffer when the two sides use different tensor parallelism.\n"
            "\n"
            "commands:\n");
    for (size_t i = 0; i < CLI_COMMAND_COUNT; i++)
        fprintf(out, "  %-8s %s\n", cli_commands[i].name, cli_commands[i].summary);
    fprintf(out,
            "  %-8s %s\n"
            "\n"
            "Run `kvstage <command> --help` for the flags of a command.\n",
            "help", "this help, or `kvstage help <command>`");
}

static int cli_unknown(const char *name)
{
    char names[256] = "";
    size_t used = 0;
    for (size_t i = 0; i < CLI_COMMAND_COUNT; i++) {
        int n = snprintf(names + used, sizeof names - used, "%s%s",
                         i == 0 ? "" : ", ", cli_commands[i].name);
        if (n < 0 || (size_t)n >= sizeof names - used)
            break;
        used += (size_t)n;
    }
    return cli_fail(NULL, "unknown command '%s': use one of %s (see kvstage "
                          "--help)", name, names);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        cli_usage(stderr);
        return CLI_EXIT_USAGE;
    }
    const char *name = argv[1];
    if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0) {
        cli_usage(stdout);
        return 0;
    }
    if (strcmp(name, "help") == 0) {
        if (argc < 3) {
            cli_usage(stdout);
            return 0;
        }
        const cli_command_t *cmd = cli_command_find(argv[2]);
        if (cmd == NULL)
            return cli_unknown(argv[2]);
        cmd->usage(stdout);
        return 0;
    }
    const cli_command_t *cmd = cli_command_find(name);
    if (cmd == NULL)
        return cli_unknown(name);
    return cmd->run(argc - 1, argv + 1);
}
