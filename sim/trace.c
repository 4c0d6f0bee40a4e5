/*
 * trace.c - the Chrome trace-event writer of trace.h. Events are streamed to
 * the file as they happen, so memory does not grow with the run.
 */
#include "trace.h"

#include <kvstage/kvstage.h>

#include <stdio.h>
#include <stdlib.h>

struct sim_trace {
    FILE *f;
};

int sim_trace_open(const char *path, sim_trace_t **out)
{
    *out = NULL;
    sim_trace_t *t = calloc(1, sizeof *t);
    if (t == NULL)
        return KVS_ENOMEM;
    t->f = fopen(path, "w");
    if (t->f == NULL) {
        free(t);
        return KVS_EINVAL;
    }
    fputs("{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n"
          "{\"name\":\"trace\",\"ph\":\"M\",\"pid\":0,\"args\":{}}", t->f);
    *out = t;
    return KVS_OK;
}

void sim_trace_process(sim_trace_t *t, int pid, const char *name)
{
    if (t != NULL)
        fprintf(t->f, ",\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,"
                "\"args\":{\"name\":\"%s\"}}", pid, name);
}

void sim_trace_span(sim_trace_t *t, int pid, const char *tid, const char *name,
                    uint64_t start_ns, uint64_t end_ns)
{
    if (t == NULL)
        return;
    fprintf(t->f, ",\n{\"name\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":\"%s\","
            "\"ts\":%llu.%03llu,\"dur\":%llu.%03llu}", name, pid, tid,
            (unsigned long long)(start_ns / 1000), (unsigned long long)(start_ns % 1000),
            (unsigned long long)((end_ns - start_ns) / 1000),
            (unsigned long long)((end_ns - start_ns) % 1000));
}

int sim_trace_close(sim_trace_t *t)
{
    if (t == NULL)
        return KVS_OK;
    fputs("\n]}\n", t->f);
    const int bad = ferror(t->f) | (fclose(t->f) != 0);
    free(t);
    return bad ? KVS_EINVAL : KVS_OK;
}
