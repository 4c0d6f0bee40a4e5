/*
 * lib.c - libfabric, opened when an ofi fabric is made instead of linked
 * into libkvstage_hw and the kvstage CLI. Debian's libfabric links the PSM
 * providers' libraries, and libinfinipath's constructor calibrates its
 * clock with ~800 sleeps of 125 us: linked, every process that loads
 * libkvstage_hw (each `kvstage plan`, each Python process) paid about
 * 0.2 s at start whether it used libfabric or not. The fabric calls the
 * five libfabric functions it needs (the rest of libfabric's API is inline
 * calls through the objects' ops tables) through the table this fills.
 * RTLD_NODELETE: libfabric stays loaded once opened (its providers keep
 * threads and global state, and a second open is then cheap).
 */
#include "hw_ofi.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

/* libfabric 1.x keeps one SONAME; the headers compiled against say which
 * major version the calls follow. */
#if FI_MAJOR_VERSION != 1
#error "hw/ofi is written against libfabric 1.x (SONAME libfabric.so.1)"
#endif
#define HW_OFI_SONAME "libfabric.so.1"

int hw_ofi_lib_open(hw_ofi_lib_t *lib, char *why, size_t why_bytes)
{
    *lib = (hw_ofi_lib_t){0};
    void *h = dlopen(HW_OFI_SONAME, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (h == NULL) {
        const char *e = dlerror();
        snprintf(why, why_bytes, "cannot load libfabric (%s): %s; install libfabric1 (or "
                 "point LD_LIBRARY_PATH at the libfabric kvstage was built with)",
                 HW_OFI_SONAME, e != NULL ? e : "unknown error");
        return KVS_EBACKEND;
    }
    static const char *const names[] = {"fi_getinfo", "fi_freeinfo", "fi_dupinfo",
                                        "fi_fabric", "fi_strerror"};
    void *fn[sizeof names / sizeof names[0]];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        fn[i] = dlsym(h, names[i]);
        if (fn[i] == NULL) {
            snprintf(why, why_bytes, "%s has no %s: install a libfabric 1.x whose version is "
                     "at least the one kvstage was built with (%d.%d)", HW_OFI_SONAME,
                     names[i], FI_MAJOR_VERSION, FI_MINOR_VERSION);
            return KVS_EBACKEND; /* RTLD_NODELETE: nothing to close */
        }
    }
    /* dlsym hands out object pointers: copied into the function pointers
     * bit for bit (POSIX requires the two to convert). */
    memcpy(&lib->getinfo, &fn[0], sizeof fn[0]);
    memcpy(&lib->freeinfo, &fn[1], sizeof fn[1]);
    memcpy(&lib->dupinfo, &fn[2], sizeof fn[2]);
    memcpy(&lib->fabric, &fn[3], sizeof fn[3]);
    memcpy(&lib->strerror, &fn[4], sizeof fn[4]);
    return KVS_OK;
}
