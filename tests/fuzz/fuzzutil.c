/*
 * fuzzutil.c — helpers the harnesses share (fuzzutil.h).
 *
 * Key design choice: scratch directories are removed with nftw rather than
 * a shell, so a harness that runs thousands of inputs a second never forks.
 */
#include <errno.h>
#include <ftw.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/config.h"
#include "engine/internal.h"
#include "fuzzutil.h"

void fz_quiet(void)
{
    kv__log_set_level(KV_LOG_ERROR);
}

char *fz_tmpdir(const char *tag)
{
    /* tmpfs when there is one: the SSD harness opens a store per input. */
    const char *base = getenv("TMPDIR");
    char *path = NULL;
    if (!base || !*base)
        base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    if (asprintf(&path, "%s/kvfuzz-%s.XXXXXX", base, tag) < 0 || !mkdtemp(path)) {
        fprintf(stderr, "fuzz: cannot make a scratch directory under %s: %s\n", base,
                strerror(errno));
        abort();
    }
    return path;
}

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    remove(p);
    return 0;
}

void fz_rmtree(const char *path)
{
    nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

void fz_seed(const char *dir, const char *name, const void *data, size_t len)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, len, f) != len || fclose(f) != 0) {
        fprintf(stderr, "fuzz: cannot write seed %s: %s\n", path, strerror(errno));
        exit(1);
    }
}

void fz_mkcorpus(void (*write)(const char *dir))
{
    const char *dir = getenv("KV_FUZZ_MKCORPUS");
    if (!dir || !*dir)
        return;
    mkdir(dir, 0755);
    write(dir);
    exit(0);
}
