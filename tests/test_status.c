/*
 * test_status.c - every status code has a name and a message that says what
 * to change; unknown codes still get text; error detail is recorded and
 * truncated safely, by the core's KVS__FAIL and the backends' KVS_ERROR_SET.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include <kvstage/backend.h>

#include "error.h"

static const int all_codes[] = {
#define X(name, value, msg) KVS_##name,
    KVS_STATUS_LIST(X)
#undef X
};
#define NCODES (sizeof all_codes / sizeof all_codes[0])

static void test_status_every_code_has_message(void **state)
{
    for (size_t i = 0; i < NCODES; i++) {
        const char *msg = kvs_strerror(all_codes[i]);
        assert_non_null(msg);
        assert_true(strlen(msg) > 5);
        assert_string_not_equal(msg, kvs_strerror(12345));
        const char *name = kvs_status_name(all_codes[i]);
        assert_int_equal(strncmp(name, "KVS_", 4), 0);
        assert_string_not_equal(name, "KVS_UNKNOWN");
        if (all_codes[i] != KVS_OK)
            assert_true(all_codes[i] < 0);
    }
}

static void test_status_codes_and_messages_are_distinct(void **state)
{
    for (size_t i = 0; i < NCODES; i++)
        for (size_t j = i + 1; j < NCODES; j++) {
            assert_int_not_equal(all_codes[i], all_codes[j]);
            assert_string_not_equal(kvs_strerror(all_codes[i]), kvs_strerror(all_codes[j]));
        }
}

static void test_status_errors_say_what_to_change(void **state)
{
    /* Each error's text carries a colon: what happened, then what to do. */
    for (size_t i = 0; i < NCODES; i++)
        if (all_codes[i] != KVS_OK)
            assert_non_null(strchr(kvs_strerror(all_codes[i]), ':'));
}

static void test_status_seed_error_text(void **state)
{
    assert_non_null(strstr(kvs_strerror(KVS_ENO_KV_BUFFERS),
                           "staging enabled but kv_buffer_tensors is missing"));
    assert_non_null(strstr(kvs_strerror(KVS_ENO_ALLOCATOR),
                           "staging enabled but the staging allocator is missing"));
}

static void test_status_unknown_code(void **state)
{
    assert_string_equal(kvs_status_name(-999), "KVS_UNKNOWN");
    assert_non_null(strstr(kvs_strerror(-999), "unknown"));
    assert_non_null(strstr(kvs_strerror(7), "unknown"));
}

static void test_status_error_set_records_detail(void **state)
{
    kvs_error_t e;
    memset(&e, 0xab, sizeof e);
    assert_int_equal(KVS__FAIL(&e, KVS_ERANGE, "offset %d too big", 7), KVS_ERANGE);
    assert_int_equal(e.status, KVS_ERANGE);
    assert_string_equal(e.msg, "offset 7 too big");
    assert_non_null(strstr(e.file, "test_status.c"));
    assert_true(e.line > 0);
    assert_int_equal(KVS__FAIL(&e, KVS_EMLA, NULL), KVS_EMLA);
    assert_string_equal(e.msg, kvs_strerror(KVS_EMLA));
    assert_int_equal(KVS__FAIL(NULL, KVS_EINVAL, "x"), KVS_EINVAL);
    kvs__error_clear(&e);
    assert_int_equal(e.status, KVS_OK);
    kvs__error_clear(NULL);
}

/* The backends' setter (create functions): every field, the caller's own
 * file and line, the backend's code. */
static void test_status_backend_error_set_records_caller(void **state)
{
    kvs_error_t e;
    memset(&e, 0xab, sizeof e);
    /* One line: compilers disagree on __LINE__ in a macro call over several. */
    const int rc = KVS_ERROR_SET(&e, KVS_ENOMEM, 12, "pool of %u pages: lower %s", 64u, "it");
    const int line = __LINE__ - 1;
    assert_int_equal(rc, KVS_ENOMEM);
    assert_int_equal(e.status, KVS_ENOMEM);
    assert_int_equal(e.backend_code, 12);
    assert_string_equal(e.file, __FILE__);
    assert_int_equal(e.line, line);
    assert_string_equal(e.msg, "pool of 64 pages: lower it");
    assert_int_equal(kvs_error_set(&e, KVS_EBACKEND, 0, "x.c", 7, NULL), KVS_EBACKEND);
    assert_int_equal(e.backend_code, 0);
    assert_string_equal(e.file, "x.c");
    assert_int_equal(e.line, 7);
    assert_string_equal(e.msg, kvs_strerror(KVS_EBACKEND));
    assert_int_equal(KVS_ERROR_SET(NULL, KVS_EINVAL, 22, "x"), KVS_EINVAL);
    char big[1000];
    memset(big, 'y', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    KVS_ERROR_SET(&e, KVS_EINVAL, 0, "%s", big);
    assert_int_equal(strlen(e.msg), KVS_ERROR_MSG_BYTES - 1);
}

static void test_status_error_msg_truncates(void **state)
{
    char big[1000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    kvs_error_t e;
    KVS__FAIL(&e, KVS_EINVAL, "%s", big);
    assert_int_equal(strlen(e.msg), KVS_ERROR_MSG_BYTES - 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_status_every_code_has_message),
        cmocka_unit_test(test_status_codes_and_messages_are_distinct),
        cmocka_unit_test(test_status_errors_say_what_to_change),
        cmocka_unit_test(test_status_seed_error_text),
        cmocka_unit_test(test_status_unknown_code),
        cmocka_unit_test(test_status_error_set_records_detail),
        cmocka_unit_test(test_status_backend_error_set_records_caller),
        cmocka_unit_test(test_status_error_msg_truncates),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
