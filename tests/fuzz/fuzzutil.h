/*
 * fuzzutil.h — what the libFuzzer harnesses of tests/fuzz share: a check
 * that aborts (so libFuzzer records the input as a crash), a quiet log,
 * scratch directories, and the seed writer every harness offers.
 *
 * Key design choice: each harness writes its own seed corpus from the real
 * encoders (run it with KV_FUZZ_MKCORPUS=DIR; `make fuzz-corpus` does it for
 * all), so the seeds in tests/fuzz/corpus/ are the library's own frames,
 * records and documents, regenerated when their format changes.
 */
#ifndef KV_FUZZUTIL_H
#define KV_FUZZUTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* A broken property: says which and where, then aborts. */
#define FZ_CHECK(cond)                                                          \
    do {                                                                        \
        if (!(cond)) {                                                          \
            fprintf(stderr, "%s:%d: fuzz property failed: %s\n", __FILE__,      \
                    __LINE__, #cond);                                           \
            abort();                                                            \
        }                                                                       \
    } while (0)

/* Only errors reach stderr: a harness feeds the library garbage by design,
 * and a warning per input would drown libFuzzer's own output. */
void fz_quiet(void);

/* A fresh directory under $TMPDIR (else /dev/shm, else /tmp) named for tag; aborts when none
 * can be made. The caller frees the string and removes the tree. */
char *fz_tmpdir(const char *tag);
/* Removes path and everything below it. */
void fz_rmtree(const char *path);

/* When KV_FUZZ_MKCORPUS names a directory, calls write(dir), then exits:
 * the seed-corpus mode every harness's LLVMFuzzerInitialize offers. */
void fz_mkcorpus(void (*write)(const char *dir));
/* Writes one seed file dir/name. */
void fz_seed(const char *dir, const char *name, const void *data, size_t len);

#endif
