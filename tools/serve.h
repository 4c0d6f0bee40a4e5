/*
 * serve.h - `kvstage serve`: one process runs every prefill rank, or every
 * decode rank, of a layout over real devices (hw/host) and a real RDMA
 * fabric (hw/verbs), moves a seeded workload through the kvstage protocol
 * and, on the decode side, checks every byte received. Two such processes,
 * one per role, are a disaggregated prefill/decode pair.
 */
#ifndef KVSTAGE_TOOLS_SERVE_H
#define KVSTAGE_TOOLS_SERVE_H

#include <stdio.h>

/* argv[0] is "serve". Exit 0 when every request ended as expected (all ok,
 * or exactly --expect-failed failed) and every received byte matched; 1
 * otherwise; 2 for bad flags. */
int cli_serve_main(int argc, char **argv);
void cli_serve_usage(FILE *out);

#endif
