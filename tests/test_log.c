/*
 * test_log.c - log levels parse, the default comes from KVS_LOG_LEVEL, and
 * an object's sink filters by level and calls the user callback.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "log.h"

typedef struct captured {
    int calls;
    kvs_log_level_t level;
    char msg[128];
} captured_t;

static void capture(void *user, kvs_log_level_t level, const char *msg)
{
    captured_t *c = user;
    c->calls++;
    c->level = level;
    strncpy(c->msg, msg, sizeof c->msg - 1);
}

static void test_log_parse_names_and_digits(void **state)
{
    kvs_log_level_t l;
    assert_int_equal(kvs_log_level_parse("debug", &l), KVS_OK);
    assert_int_equal(l, KVS_LOG_DEBUG);
    assert_int_equal(kvs_log_level_parse("0", &l), KVS_OK);
    assert_int_equal(l, KVS_LOG_OFF);
    assert_int_equal(kvs_log_level_parse("5", &l), KVS_OK);
    assert_int_equal(l, KVS_LOG_TRACE);
    assert_int_equal(kvs_log_level_parse("6", &l), KVS_EINVAL);
    assert_int_equal(kvs_log_level_parse("loud", &l), KVS_EINVAL);
    assert_int_equal(kvs_log_level_parse("", &l), KVS_EINVAL);
    /* One digit only: "12", "2x" and "/" (just below '0') are not levels. */
    l = KVS_LOG_INFO;
    assert_int_equal(kvs_log_level_parse("12", &l), KVS_EINVAL);
    assert_int_equal(kvs_log_level_parse("2x", &l), KVS_EINVAL);
    assert_int_equal(kvs_log_level_parse("/", &l), KVS_EINVAL);
    assert_int_equal(l, KVS_LOG_INFO);
    assert_int_equal(kvs_log_level_parse(NULL, &l), KVS_EINVAL);
    assert_int_equal(kvs_log_level_parse("info", NULL), KVS_EINVAL);
    assert_string_equal(kvs_log_level_name(KVS_LOG_WARN), "warn");
    assert_string_equal(kvs_log_level_name((kvs_log_level_t)42), "unknown");
    assert_string_equal(kvs_log_level_name((kvs_log_level_t)-1), "unknown");
    assert_string_equal(kvs_log_level_name(KVS_LOG_OFF), "off");
    assert_string_equal(kvs_log_level_name(KVS_LOG_TRACE), "trace");
}

static void test_log_default_from_env(void **state)
{
    setenv(KVS_LOG_ENV, "trace", 1);
    assert_int_equal(kvs_log_level_default(), KVS_LOG_TRACE);
    setenv(KVS_LOG_ENV, "nonsense", 1);
    assert_int_equal(kvs_log_level_default(), KVS_LOG_WARN);
    unsetenv(KVS_LOG_ENV);
    assert_int_equal(kvs_log_level_default(), KVS_LOG_WARN);
    kvs_log_t r = kvs__log_resolve(NULL);
    assert_int_equal(r.level, KVS_LOG_WARN);
}

static void test_log_filters_by_level(void **state)
{
    captured_t c = {0};
    kvs_log_t sink = {.fn = capture, .user = &c, .level = KVS_LOG_INFO};
    kvs_log_t log = kvs__log_resolve(&sink);
    kvs_log_write(&log, KVS_LOG_DEBUG, "dropped %d", 1);
    assert_int_equal(c.calls, 0);
    kvs_log_write(&log, KVS_LOG_INFO, "kept %d", 2);
    assert_int_equal(c.calls, 1);
    assert_int_equal(c.level, KVS_LOG_INFO);
    assert_string_equal(c.msg, "kept 2");
    kvs_log_write(&log, KVS_LOG_OFF, "never");
    kvs_log_write(NULL, KVS_LOG_ERROR, "never");
    assert_int_equal(c.calls, 1);
}

static void test_log_callback_with_level_off_stays_off(void **state)
{
    captured_t c = {0};
    kvs_log_t sink = {.fn = capture, .user = &c, .level = KVS_LOG_OFF};
    kvs_log_t log = kvs__log_resolve(&sink);
    kvs_log_write(&log, KVS_LOG_ERROR, "muted");
    assert_int_equal(c.calls, 0);
}

static void test_log_stderr_sink(void **state)
{
    kvs_log_t log = {.fn = NULL, .level = KVS_LOG_ERROR};
    kvs_log_write(&log, KVS_LOG_ERROR, "test_log: this line on stderr is expected");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_log_parse_names_and_digits),
        cmocka_unit_test(test_log_default_from_env),
        cmocka_unit_test(test_log_filters_by_level),
        cmocka_unit_test(test_log_callback_with_level_off_stays_off),
        cmocka_unit_test(test_log_stderr_sink),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
