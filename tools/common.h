/*
 * common.h — what the programs in tools/ share (tools/common_*.c is linked
 * into every one of them). Public header only, like the programs.
 */
#ifndef KV_TOOLS_COMMON_H
#define KV_TOOLS_COMMON_H

#include <signal.h>
#include <stdio.h>

#include "kvengine.h"

typedef void (*kvtool_usage_fn)(FILE *f, const kv_config *cfg);

/*
 * The --config FILE / --set KEY=VALUE command line of the daemons (kvmaster,
 * kvnode): defaults, then the file wherever it appears, then every --set in
 * order; -h/--help prints usage. Returns -1 with *out the config to run
 * with, or the exit status to leave with (0 after --help, 2 for a bad
 * argument, file or key, with the reason on stderr naming prog); *out is
 * NULL then.
 */
int kvtool_daemon_config(const char *prog, int argc, char **argv, kvtool_usage_fn usage,
                         kv_config **out);

/* SIGTERM and SIGINT set *flag; SIGPIPE is ignored (peers may vanish). */
void kvtool_daemon_signals(volatile sig_atomic_t *flag);

#endif
