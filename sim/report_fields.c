/*
 * report_fields.c - kvs_sim_report_field(): kvs_sim_report_t's members as
 * data, made from the one list that also makes the struct
 * (kvstage/sim_report_fields.h), so a binding (the Python package's ctypes
 * mirror and its simulate() dict) reads the report's description from the
 * library instead of keeping its own copy. Static tables only; no state.
 */
#include <kvstage/sim.h>

#include <stddef.h>

#define SIM_FIELDS_MEMBER(name) sizeof(((kvs_sim_report_t *)0)->name)
#define SIM_FIELDS_HEAD(code, name, meaning)                                               \
    {#name, #code, (uint32_t)offsetof(kvs_sim_report_t, name),                             \
     (uint32_t)SIM_FIELDS_MEMBER(name), 1, -1, 1, 0, meaning},
#define SIM_FIELDS_FIELD(code, name, json, meaning)                                        \
    {#name, #code, (uint32_t)offsetof(kvs_sim_report_t, name),                             \
     (uint32_t)SIM_FIELDS_MEMBER(name), 1, json, 0, 0, meaning},
#define SIM_FIELDS_ARRAY(elem, name, count, meaning)                                       \
    {#name, #elem, (uint32_t)offsetof(kvs_sim_report_t, name),                             \
     (uint32_t)SIM_FIELDS_MEMBER(name), (uint32_t)(count), -1, 0, 0, meaning},

static const kvs_sim_report_field_t sim_report_fields[] = {
    KVS_SIM_REPORT_FIELDS(SIM_FIELDS_HEAD, SIM_FIELDS_FIELD, SIM_FIELDS_ARRAY)};

#define SIM_FIELDS_COUNT (sizeof sim_report_fields / sizeof sim_report_fields[0])

const kvs_sim_report_field_t *kvs_sim_report_field(uint32_t i)
{
    return i < SIM_FIELDS_COUNT ? &sim_report_fields[i] : NULL;
}

uint32_t kvs_sim_report_size(void)
{
    return (uint32_t)sizeof(kvs_sim_report_t);
}
