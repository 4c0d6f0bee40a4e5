/*
 * status.c - verbs' codes turned into kvstage codes at the boundary: work
 * completion statuses (with advice on what to change) and errno values
 * (verbs returns NULL + errno or a positive errno; both end here).
 */
#include "hw_verbs.h"

#include <errno.h>

int hw_verbs_wc_status(enum ibv_wc_status st)
{
    switch (st) {
    case IBV_WC_SUCCESS:
        return KVS_OK;
    case IBV_WC_REM_ACCESS_ERR:
    case IBV_WC_REM_INV_REQ_ERR:
    case IBV_WC_REM_OP_ERR:
        return KVS_EREMOTE;
    case IBV_WC_WR_FLUSH_ERR:
    case IBV_WC_RETRY_EXC_ERR:
    case IBV_WC_RNR_RETRY_EXC_ERR:
    case IBV_WC_RESP_TIMEOUT_ERR:
    case IBV_WC_REM_ABORT_ERR:
        return KVS_EPEER;
    case IBV_WC_LOC_LEN_ERR:
    case IBV_WC_LOC_PROT_ERR:
    case IBV_WC_LOC_ACCESS_ERR:
    case IBV_WC_MW_BIND_ERR:
        return KVS_EINVAL;
    default:
        return KVS_EBACKEND;
    }
}

const char *hw_verbs_wc_advice(enum ibv_wc_status st)
{
    switch (st) {
    case IBV_WC_REM_ACCESS_ERR:
        return "the remote key or range matches no registration at the peer: use the key and "
               "addresses the peer registered";
    case IBV_WC_REM_INV_REQ_ERR:
        return "the peer refused the request (too long for its receive buffer or range): "
               "check the length and offsets";
    case IBV_WC_REM_OP_ERR:
        return "the peer could not complete the operation: see the peer's log";
    case IBV_WC_WR_FLUSH_ERR:
        return "an earlier operation on this connection failed: disconnect and connect again";
    case IBV_WC_RETRY_EXC_ERR:
        return "the peer did not acknowledge (gone, or the link is down): check the peer and "
               "the network";
    case IBV_WC_RNR_RETRY_EXC_ERR:
        return "the peer posted no receive in time: it stopped polling";
    case IBV_WC_LOC_LEN_ERR:
    case IBV_WC_LOC_PROT_ERR:
    case IBV_WC_LOC_ACCESS_ERR:
        return "the local buffer is not inside its registration: register the source range";
    default:
        return "see the RDMA device's driver log (dmesg)";
    }
}

int hw_verbs_errno_status(int err)
{
    switch (err) {
    case 0:
        return KVS_OK;
    case ENOMEM:
        return KVS_ENOMEM;
    case EINVAL:
    case EFAULT:
        return KVS_EINVAL;
    case EAGAIN:
        return KVS_EAGAIN;
    case ENOSPC:
        return KVS_EFULL;
    case EOPNOTSUPP:
    case ENOSYS:
        return KVS_ENOTSUP;
    case ETIMEDOUT:
        return KVS_ETIMEDOUT;
    case ECONNREFUSED:
    case ECONNRESET:
    case ENOTCONN:
    case EHOSTUNREACH:
    case ENETUNREACH:
        return KVS_EPEER;
    default:
        return KVS_EBACKEND;
    }
}
