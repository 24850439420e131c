/*
 * log.c — leveled logging to stderr.
 *
 * The level is per process, not per engine: stderr is the process's. The
 * engine opened last sets it from log.level, except that KV_LOG_LEVEL in the
 * environment (read once, at first use) overrides every config.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

#include "internal.h"

_Atomic int kv__log_level = KV_LOG_INFO;

static pthread_once_t env_once = PTHREAD_ONCE_INIT;
static int env_level = -1;

static void read_env(void)
{
    const char *s = getenv("KV_LOG_LEVEL");
    if (s && *s) {
        env_level = kv__log_parse_level(s);
        if (env_level >= 0)
            atomic_store(&kv__log_level, env_level);
        else
            fprintf(stderr, "[kvengine][W] KV_LOG_LEVEL=%s is not one of error, warn, info, debug\n", s);
    }
}

int kv__log_parse_level(const char *s)
{
    static const char *const names[] = { "error", "warn", "info", "debug" };
    for (int i = 0; i < (int)KV__ARRAY_LEN(names); i++)
        if (strcasecmp(s, names[i]) == 0)
            return i;
    if (strcasecmp(s, "warning") == 0)
        return KV_LOG_WARN;
    return -1;
}

void kv__log_set_level(int level)
{
    pthread_once(&env_once, read_env);
    if (env_level >= 0)
        return;                      /* the environment has the last word */
    atomic_store(&kv__log_level, level);
}

void kv__log(int level, const char *fmt, ...)
{
    static const char tag[] = "EWID";
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "[kvengine][%c] %s\n", tag[level & 3], line);
}
