/*
 * hostile.h (internal) - the simulator's hostile writers (hostile-write
 * faults, sim_hostile_t of scenario.h): the rank a fault names gets its
 * NIC's fabric wrapped by hw/net's fault fabric (<kvstage/fault_fabric.h>),
 * which spoils the fault's one write; this file tells the wrapper which
 * write that is and marks it on the NIC, so the bytes of it that land are
 * counted (sim_nic_planted_landed_bytes, a violation).
 *
 * Called by faults.c (a fault's state), node.c (a rank's fabric) and
 * scenario.c (freeing); it calls none of them (what it needs of the run it
 * reads from run.h's state).
 */
#ifndef KVS_SIM_HOSTILE_H
#define KVS_SIM_HOSTILE_H

#include <kvstage/fault_fabric.h>

#include <stdbool.h>
#include <stdint.h>

struct sim_scenario;
struct sim_node;

/* A hostile-write fault as it goes. */
typedef struct sim_hostile_state {
    struct sim_scenario *sc;
    uint32_t fault;              /* its index in the run's faults */
    struct sim_node *node;       /* the prefill rank it names; NULL: no such fault */
    kvs_fault_fabric_t *wrap;    /* made at the rank's first creation, kept
                                    across its restarts */
    char peer[64];               /* stale: the decode NIC of the write kept */
    uint32_t *pending;           /* [requests]: those in flight when it was kept */
    uint32_t npending;
} sim_hostile_state_t;

/* Fault `fault` is a hostile write of prefill node n: its state made
 * (KVS_ENOMEM). Before the ranks are created. */
int sim_hostile_add(struct sim_scenario *sc, uint32_t fault, struct sim_node *n);
/* The fabric node n's rank is to be created on (*fab): its NIC's, wrapped
 * by the wrapper of each hostile-write fault naming n (the first fault's
 * outermost, so it sees a write first), the NIC's write hook set to mark
 * their spoiled writes. The NIC's own fabric when no fault names n. */
int sim_hostile_fabric(struct sim_scenario *sc, struct sim_node *n, kvs_fabric_t **fab);
/* Frees every fault's state; the ranks are gone. */
void sim_hostile_free(struct sim_scenario *sc);

#endif
