/*
 * fuzz_wire.c - libFuzzer target for the control-message codec (spec §7,
 * src/wire.c) and the registration fingerprint check (spec §7.1,
 * src/channel.c).
 *
 * Every input is decoded twice: as raw bytes (header checks included) and
 * with a valid header built in front of input[1..] (type = input[0] % 17,
 * 0 and 16 being invalid types; link sequence number 1), so most inputs
 * reach the payload decoders.
 * Properties, each an abort() when violated:
 * - decode returns KVS_OK or KVS_EPROTO, and leaves *msg untouched on failure;
 * - a decoded message re-encodes to the very same bytes, has a known type
 *   name, and an encode into a buffer one byte short returns KVS_ERANGE with
 *   the needed length; the re-encoded bytes decode again, a truncated copy
 *   does not;
 * - a decoded REGISTER's fingerprint, checked against a fixed local
 *   fingerprint (kvs__fingerprint of a valid layout), gives KVS_OK exactly
 *   when every compared field matches, KVS_EFINGERPRINT with a non-empty
 *   reason otherwise, never anything else; the check is symmetric and never
 *   writes past a short reason buffer.
 */
#include "channel.h"
#include "wire.h"

#include <kvstage/kvstage.h>

#include "fuzz_support.h"
#include "wire_fixture.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The fields kvs__fingerprint_check compares (spec §7.1): all of them,
 * taken from the wire's own field list, so a field added to the
 * fingerprint is compared here at once; a check that forgets it is caught. */
static bool fingerprint_equal(const kvs_fingerprint_t *a, const kvs_fingerprint_t *b)
{
#define KVS__FUZZ_FP_EQ(kind, name) &&a->name == b->name
    return true KVS_WIRE_FP_FIELDS(KVS__FUZZ_FP_EQ);
#undef KVS__FUZZ_FP_EQ
}

static void check_fingerprint(const kvs_fingerprint_t *theirs, uint32_t short_bytes)
{
    kvs_fingerprint_t mine;
    CHECK(wire_local_fingerprint(&mine));
    const bool equal = fingerprint_equal(&mine, theirs);

    char why[256];
    memset(why, 0, sizeof why);
    int rc = kvs__fingerprint_check(&mine, theirs, why, sizeof why);
    CHECK(rc == KVS_OK || rc == KVS_EFINGERPRINT);
    CHECK((rc == KVS_OK) == equal);
    if (rc == KVS_EFINGERPRINT)
        CHECK(why[0] != '\0' && memchr(why, '\0', sizeof why) != NULL);

    /* Symmetric, and a fingerprint always matches itself. */
    char why2[256];
    CHECK(kvs__fingerprint_check(theirs, &mine, why2, sizeof why2) == rc);
    CHECK(kvs__fingerprint_check(theirs, theirs, why2, sizeof why2) == KVS_OK);

    /* A short reason buffer of exactly short_bytes bytes: ASan catches any
     * write past it; the text stays terminated inside it. */
    char *small = malloc(short_bytes);
    CHECK(small != NULL);
    memset(small, 'x', short_bytes);
    CHECK(kvs__fingerprint_check(&mine, theirs, small, short_bytes) == rc);
    if (rc == KVS_EFINGERPRINT)
        CHECK(memchr(small, '\0', short_bytes) != NULL);
    free(small);
}

static void check_one(const uint8_t *buf, uint32_t len)
{
    kvs_msg_t msg, before;
    memset(&msg, 0xA5, sizeof msg);
    memcpy(&before, &msg, sizeof msg);

    int rc = kvs__wire_decode(buf, len, &msg);
    if (rc != KVS_OK) {
        CHECK(rc == KVS_EPROTO);
        CHECK(memcmp(&msg, &before, sizeof msg) == 0); /* untouched on failure */
        return;
    }
    CHECK(len >= KVS_WIRE_HEADER_BYTES && len <= KVS_CONTROL_MSG_MAX_BYTES);
    CHECK(msg.type >= KVS_MSG_REGISTER && msg.type <= KVS_MSG_TYPE_MAX);
    CHECK((uint32_t)msg.type == ((uint32_t)buf[6] | (uint32_t)buf[7] << 8));
    CHECK(strcmp(kvs__wire_type_name(msg.type), "UNKNOWN") != 0);

    /* Round trip into a buffer of exactly len bytes (ASan-checked). */
    uint8_t *out = malloc(len);
    CHECK(out != NULL);
    uint32_t out_len = 0;
    CHECK(kvs__wire_encode(&msg, out, len, &out_len) == KVS_OK);
    CHECK(out_len == len);
    CHECK(memcmp(out, buf, len) == 0);

    /* One byte short, and the size query with no buffer. */
    uint32_t need = 0;
    CHECK(kvs__wire_encode(&msg, out, len - 1, &need) == KVS_ERANGE && need == len);
    need = 0;
    CHECK(kvs__wire_encode(&msg, NULL, 0, &need) == KVS_ERANGE && need == len);

    /* The re-encoded bytes decode again; any truncation of them does not. */
    kvs_msg_t again;
    CHECK(kvs__wire_decode(out, len, &again) == KVS_OK && again.type == msg.type);
    CHECK(kvs__wire_decode(out, len - 1, &again) == KVS_EPROTO);
    free(out);

    if (msg.type == KVS_MSG_REGISTER)
        check_fingerprint(&msg.u.reg.fp, 1u + (uint32_t)buf[len - 1] % 96u);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 2u * KVS_CONTROL_MSG_MAX_BYTES)
        return 0; /* longer inputs only repeat the length check */

    /* Raw bytes, in an exact-size heap copy so ASan sees any over-read. */
    uint8_t *raw = malloc(size ? size : 1);
    CHECK(raw != NULL);
    if (size)
        memcpy(raw, data, size);
    check_one(raw, (uint32_t)size);
    free(raw);

    /* A valid header in front of data[1..]. */
    if (size >= 1) {
        const uint32_t type = data[0] % (KVS_MSG_TYPE_MAX + 2u);
        const uint32_t payload = (uint32_t)size - 1u;
        const uint32_t len = KVS_WIRE_HEADER_BYTES + payload;
        uint8_t *buf = malloc(len);
        CHECK(buf != NULL);
        const uint32_t magic = KVS_WIRE_MAGIC;
        for (unsigned i = 0; i < 4u; i++)
            buf[i] = (uint8_t)(magic >> (8u * i));
        buf[4] = (uint8_t)KVS_WIRE_VERSION;
        buf[5] = 0;
        buf[6] = (uint8_t)type;
        buf[7] = 0;
        for (unsigned i = 0; i < 4u; i++)
            buf[8 + i] = (uint8_t)(payload >> (8u * i));
        buf[12] = 1; /* link sequence number */
        buf[13] = buf[14] = buf[15] = 0;
        for (unsigned i = 16; i < KVS_WIRE_HEADER_BYTES; i++)
            buf[i] = (uint8_t)(0x40 + i); /* the sender's session */
        memcpy(buf + KVS_WIRE_HEADER_BYTES, data + 1, payload);
        check_one(buf, len);
        free(buf);
    }
    return 0;
}
