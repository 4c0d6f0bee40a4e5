/*
 * status.c - libfabric's return codes turned into kvstage codes at the
 * boundary, for every file of the ofi fabric (it calls nothing of theirs).
 */
#include "hw_ofi.h"

int hw_ofi_status(int fi_rc)
{
    switch (fi_rc < 0 ? -fi_rc : fi_rc) {
    case 0:
        return KVS_OK;
    case FI_EAGAIN:
        return KVS_EAGAIN;
    case FI_ENOMEM:
        return KVS_ENOMEM;
    case FI_EINVAL:
        return KVS_EINVAL;
    case FI_ENOSYS:
    case FI_EOPNOTSUPP:
        return KVS_ENOTSUP;
    case FI_EACCES:
    case FI_EKEYREJECTED:
    case FI_EREMOTEIO:
    case FI_EIO:
        return KVS_EREMOTE;
    case FI_ECONNREFUSED:
    case FI_ECONNRESET:
    case FI_ECONNABORTED:
    case FI_ENOTCONN:
    case FI_EHOSTUNREACH:
    case FI_ESHUTDOWN:
        return KVS_EPEER;
    case FI_ETIMEDOUT:
        return KVS_ETIMEDOUT;
    case FI_ECANCELED:
        return KVS_ECANCELED;
    default:
        return KVS_EBACKEND;
    }
}
