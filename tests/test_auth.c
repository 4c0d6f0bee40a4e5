/*
 * test_auth.c - unit tests of src/auth.c: SHA-256 against the FIPS 180-2
 * examples (appendix B: "abc", the 448-bit message, a million 'a'),
 * HMAC-SHA-256 against every RFC 4231 test case (case 5 truncated to 128
 * bits, as the RFC gives it), the constant-time comparison, loading the
 * secret (file, environment, every refusal) and the two proofs (each
 * bound to its nonces, sessions and, for the decode's, the whole REGISTER).
 */
#define _DEFAULT_SOURCE /* setenv */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "auth.h"

static void hex(const char *s, uint8_t *out, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned v = 0;
        assert_int_equal(sscanf(s + 2 * i, "%2x", &v), 1);
        out[i] = (uint8_t)v;
    }
}

static void assert_digest(const uint8_t *got, const char *want_hex, size_t n)
{
    uint8_t want[KVS__AUTH_BYTES];
    hex(want_hex, want, n);
    assert_memory_equal(got, want, n);
}

static void test_auth_sha256_fips180(void **state)
{
    (void)state;
    uint8_t d[KVS__AUTH_BYTES];
    kvs__sha256("abc", 3, d);
    assert_digest(d, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", 32);
    const char *m2 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    kvs__sha256(m2, strlen(m2), d);
    assert_digest(d, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1", 32);
    const size_t million = 1000000;
    char *a = malloc(million);
    assert_non_null(a);
    memset(a, 'a', million);
    kvs__sha256(a, million, d);
    free(a);
    assert_digest(d, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0", 32);
    kvs__sha256("", 0, d);
    assert_digest(d, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", 32);
}

/* RFC 4231 section 4: key, data and HMAC-SHA-256, each in hex (the
 * output bytes to compare: 16 for case 5). */
typedef struct rfc4231 {
    const char *key, *data, *mac;
    size_t key_bytes, data_bytes, mac_bytes;
} rfc4231_t;

static void test_auth_hmac_rfc4231(void **state)
{
    (void)state;
    static const char *const k131 = NULL; /* 131 bytes of 0xaa */
    static const char *const d6 = "Test Using Larger Than Block-Size Key - Hash Key First";
    static const char *const d7 =
        "This is a test using a larger than block-size key and a larger than block-size "
        "data. The key needs to be hashed before being used by the HMAC algorithm.";
    char d6hex[2 * 64 + 1] = {0}, d7hex[2 * 160 + 1] = {0};
    for (size_t i = 0; i < strlen(d6); i++)
        snprintf(d6hex + 2 * i, 3, "%02x", (unsigned char)d6[i]);
    for (size_t i = 0; i < strlen(d7); i++)
        snprintf(d7hex + 2 * i, 3, "%02x", (unsigned char)d7[i]);
    const rfc4231_t cases[] = {
        {"0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b", "4869205468657265",
         "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7", 20, 8, 32},
        {"4a656665", "7768617420646f2079612077616e7420666f72206e6f7468696e673f",
         "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843", 4, 28, 32},
        {"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
         "dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd"
         "dddddddddddddddddd",
         "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe", 20, 50, 32},
        {"0102030405060708090a0b0c0d0e0f10111213141516171819",
         "cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd"
         "cdcdcdcdcdcdcdcdcd",
         "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b", 25, 50, 32},
        {"0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c", "546573742057697468205472756e636174696f6e",
         "a3b6167473100ee06e0c796c2955552b", 20, 20, 16},
        {k131, d6hex, "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54", 131,
         54, 32},
        {k131, d7hex, "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2", 131,
         152, 32},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint8_t key[131], data[160], mac[KVS__AUTH_BYTES];
        if (cases[i].key != NULL)
            hex(cases[i].key, key, cases[i].key_bytes);
        else
            memset(key, 0xaa, cases[i].key_bytes);
        hex(cases[i].data, data, cases[i].data_bytes);
        kvs__hmac_sha256(key, cases[i].key_bytes, data, cases[i].data_bytes, mac);
        assert_digest(mac, cases[i].mac, cases[i].mac_bytes);
    }
}

static void test_auth_equal_is_exact(void **state)
{
    (void)state;
    uint8_t a[32], b[32];
    memset(a, 7, sizeof a);
    memcpy(b, a, sizeof b);
    assert_true(kvs__auth_equal(a, b, 32));
    for (size_t i = 0; i < 32; i++) {
        b[i] ^= 1;
        assert_false(kvs__auth_equal(a, b, 32));
        b[i] ^= 1;
    }
}

static void test_auth_secret_load(void **state)
{
    (void)state;
    kvs__secret_t s;
    char why[256];
    assert_int_equal(kvs__secret_load(NULL, NULL, &s, why, sizeof why), KVS_OK);
    assert_int_equal(s.len_bytes, 0);
    /* A file, its trailing newline dropped. */
    char path[] = "/tmp/kvs_test_auth_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    const char secret[] = "0123456789abcdef0123456789abcdef\n";
    assert_int_equal(write(fd, secret, strlen(secret)), (ssize_t)strlen(secret));
    close(fd);
    assert_int_equal(kvs__secret_load(path, NULL, &s, why, sizeof why), KVS_OK);
    assert_int_equal(s.len_bytes, 32);
    assert_memory_equal(s.key, secret, 32);
    kvs__secret_wipe(&s);
    assert_int_equal(s.len_bytes, 0);
    assert_int_equal(kvs__secret_load(path, "X", &s, why, sizeof why), KVS_EINVAL);
    assert_non_null(strstr(why, "both"));
    /* Too short, empty: refused, and the reason never quotes the secret. */
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("short-secret\n", f);
    fclose(f);
    assert_int_equal(kvs__secret_load(path, NULL, &s, why, sizeof why), KVS_EINVAL);
    assert_non_null(strstr(why, "at least 16 bytes"));
    assert_null(strstr(why, "short-secret"));
    f = fopen(path, "w");
    assert_non_null(f);
    fclose(f);
    assert_int_equal(kvs__secret_load(path, NULL, &s, why, sizeof why), KVS_EINVAL);
    assert_non_null(strstr(why, "nothing"));
    /* A Windows line end goes too; only the secret's own bytes count. */
    f = fopen(path, "w");
    assert_non_null(f);
    fputs("0123456789abcdef-crlf\r\n", f);
    fclose(f);
    assert_int_equal(kvs__secret_load(path, NULL, &s, why, sizeof why), KVS_OK);
    assert_int_equal(s.len_bytes, strlen("0123456789abcdef-crlf"));
    kvs__secret_wipe(&s);
    unlink(path);
    assert_int_equal(kvs__secret_load(path, NULL, &s, why, sizeof why), KVS_EINVAL);
    assert_non_null(strstr(why, "cannot be read"));
    /* A directory opens but does not read. */
    assert_int_equal(kvs__secret_load("/tmp", NULL, &s, why, sizeof why), KVS_EINVAL);
    assert_non_null(strstr(why, "/tmp"));
    /* The environment. */
    unsetenv("KVS_TEST_AUTH_SECRET");
    assert_int_equal(kvs__secret_load(NULL, "KVS_TEST_AUTH_SECRET", &s, why, sizeof why),
                     KVS_EINVAL);
    assert_non_null(strstr(why, "not set"));
    setenv("KVS_TEST_AUTH_SECRET", "a-long-enough-cluster-secret", 1);
    assert_int_equal(kvs__secret_load(NULL, "KVS_TEST_AUTH_SECRET", &s, why, sizeof why), KVS_OK);
    assert_int_equal(s.len_bytes, strlen("a-long-enough-cluster-secret"));
    char big[KVS__SECRET_MAX_BYTES + 2];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    setenv("KVS_TEST_AUTH_SECRET", big, 1);
    assert_int_equal(kvs__secret_load(NULL, "KVS_TEST_AUTH_SECRET", &s, why, sizeof why),
                     KVS_EINVAL);
    assert_non_null(strstr(why, "more than"));
    unsetenv("KVS_TEST_AUTH_SECRET");
}

static void test_auth_proofs_bind_their_inputs(void **state)
{
    (void)state;
    kvs__secret_t s = {.len_bytes = 20}, other = {.len_bytes = 20};
    memset(s.key, 1, 20);
    memset(other.key, 2, 20);
    kvs_b32_t nd, np, a, b;
    memset(nd.b, 3, 32);
    memset(np.b, 4, 32);
    kvs__auth_prefill_proof(&s, &nd, &np, 10, 20, &a);
    kvs__auth_prefill_proof(&s, &nd, &np, 10, 20, &b);
    assert_memory_equal(a.b, b.b, 32);
    kvs__auth_prefill_proof(&other, &nd, &np, 10, 20, &b);
    assert_memory_not_equal(a.b, b.b, 32);
    kvs__auth_prefill_proof(&s, &np, &nd, 10, 20, &b);
    assert_memory_not_equal(a.b, b.b, 32);
    kvs__auth_prefill_proof(&s, &nd, &np, 11, 20, &b);
    assert_memory_not_equal(a.b, b.b, 32);
    /* The decode's covers its REGISTER, not its seq or its own proof. */
    kvs_msg_t reg = {.type = KVS_MSG_REGISTER, .seq = 1, .session = 10};
    reg.u.reg.ring_rkey = 99;
    kvs__auth_decode_proof(&s, &nd, &np, 20, &reg, &a);
    reg.seq = 7;
    memset(reg.u.reg.proof.b, 9, 32);
    kvs__auth_decode_proof(&s, &nd, &np, 20, &reg, &b);
    assert_memory_equal(a.b, b.b, 32);
    reg.u.reg.ring_rkey = 98;
    kvs__auth_decode_proof(&s, &nd, &np, 20, &reg, &b);
    assert_memory_not_equal(a.b, b.b, 32);
    reg.u.reg.ring_rkey = 99;
    reg.session = 11;
    kvs__auth_decode_proof(&s, &nd, &np, 20, &reg, &b);
    assert_memory_not_equal(a.b, b.b, 32);
    /* Never the prefill's proof of the same nonces (no reflection). */
    reg.session = 10;
    kvs__auth_prefill_proof(&s, &nd, &np, 10, 20, &b);
    assert_memory_not_equal(a.b, b.b, 32);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_auth_sha256_fips180),
        cmocka_unit_test(test_auth_hmac_rfc4231),
        cmocka_unit_test(test_auth_equal_is_exact),
        cmocka_unit_test(test_auth_secret_load),
        cmocka_unit_test(test_auth_proofs_bind_their_inputs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
