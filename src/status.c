/*
 * status.c - names and messages of the status codes, generated from the one
 * KVS_STATUS_LIST in kvstage.h so a new code cannot lack its text.
 */
#include <kvstage/kvstage.h>

const char *kvs_strerror(int status)
{
    switch (status) {
#define KVS__STATUS_MSG(name, value, msg)                                      \
    case KVS_##name:                                                           \
        return msg;
        KVS_STATUS_LIST(KVS__STATUS_MSG)
#undef KVS__STATUS_MSG
    default:
        return "unknown kvstage status: the code does not come from this "
               "version of kvstage";
    }
}

const char *kvs_status_name(int status)
{
    switch (status) {
#define KVS__STATUS_NAME(name, value, msg)                                     \
    case KVS_##name:                                                           \
        return "KVS_" #name;
        KVS_STATUS_LIST(KVS__STATUS_NAME)
#undef KVS__STATUS_NAME
    default:
        return "KVS_UNKNOWN";
    }
}
