# kvengine — one plain Makefile.
#
#   make                 library and tools under build/
#   make test            the Check suites (and the multi-process tests)
#   make bench           the embedded benchmark on the default scenario set
#   make SANITIZE=address,undefined test    (or SANITIZE=thread)
#   make install PREFIX=/usr/local
#   make installcheck    install into a temporary prefix, build examples/ with pkg-config
#
# Sources are picked up by folder: engine/, persist/ and net/ make the
# library; tools/NAME*.c make the program NAME (kvctl also tools/bench/*.c);
# tests/check_*.c make the one test runner; tests/softverbs/ makes the
# libibverbs stand-in.

CC       ?= cc
PREFIX   ?= /usr/local
DESTDIR  ?=
SANITIZE ?=
OPT      ?= -O2

SONAME_MAJOR := 0
VERSION      := 0.1.0
# Debian's interpreter, which python3-pytest and python3-numpy install into
# (a python3 earlier in PATH, e.g. pyenv's, may lack them).
PYTHON   ?= $(if $(wildcard /usr/bin/python3),/usr/bin/python3,python3)
PYDIR    := $(PREFIX)/lib/python3/dist-packages

ifeq ($(SANITIZE),)
BUILD    ?= build
else
BUILD    ?= build/san-$(subst $(comma),-,$(SANITIZE))
OPT      := -O1
endif
comma := ,

WARN     := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wmissing-prototypes \
            -Wno-unused-parameter
CPPFLAGS += -Iinclude -I. -D_GNU_SOURCE
CFLAGS   += -std=gnu11 $(OPT) -g -fPIC -fvisibility=hidden -pthread $(WARN) -MMD -MP
# No -lrdmacm: net/rdma.c connects queue pairs over its own TCP handshake,
# and librdmacm needs libibverbs symbol versions the test stand-in lacks.
LDLIBS   := -lrocksdb -lyaml -llz4 -lxxhash -ljemalloc -lmicrohttpd -libverbs -lcurl -ljson-c -lcrypto \
            -lpthread -lm
# Pulls net/rdma.o out of the static library, which only a weak reference
# (transport.h) names; it must come before the archive on the link line.
LDFLAGS  += -Wl,-u,kv__rdma_transport
ifneq ($(SANITIZE),)
CFLAGS_SAN := -fsanitize=$(SANITIZE) -fno-omit-frame-pointer -fno-sanitize-recover=all
CFLAGS   += $(CFLAGS_SAN)
LDFLAGS  += -fsanitize=$(SANITIZE)
endif

LIB_SRC   := $(sort $(wildcard engine/*.c persist/*.c net/*.c))
LIB_OBJ   := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
TOOLS     := kvctl kvmaster kvnode
TOOL_BINS := $(foreach t,$(TOOLS),$(if $(wildcard tools/$(t)*.c),$(BUILD)/$(t)))
TEST_SRC  := $(sort $(wildcard tests/check_*.c tests/testutil*.c))
TEST_OBJ  := $(TEST_SRC:%.c=$(BUILD)/obj/%.o)
SV_SRC    := $(sort $(wildcard tests/softverbs/*.c))
SV_LIB    := $(if $(SV_SRC),$(BUILD)/softverbs/libibverbs.so.1)

STATIC := $(BUILD)/libkvengine.a
SHARED := $(BUILD)/libkvengine.so.$(VERSION)

.PHONY: all lib tools test check bench install installcheck clean deps crashtest rdmatest etcdtest pytest
all: lib tools

# Installs missing Debian packages when run as root (see scripts/deps.sh).
deps: $(BUILD)/.deps
$(BUILD)/.deps: scripts/deps.sh
	@sh scripts/deps.sh
	@mkdir -p $(@D) && touch $@

lib: $(STATIC) $(SHARED)

$(BUILD)/obj/%.o: %.c | $(BUILD)/.deps
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(CFLAGS) -c $< -o $@

$(STATIC): $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

# The shared library does not link jemalloc: nothing in it calls jemalloc's
# API, and a jemalloc pulled in behind libc by a .so splits the process's
# allocator (operator new bound to jemalloc, delete to libc: RocksDB's static
# constructors abort with "free(): invalid pointer" in any program linked
# with plain -lkvengine). A program that wants jemalloc links it itself, as
# the tools do; the static library's users get it from Libs.private.
$(SHARED): $(LIB_OBJ)
	$(CC) -shared -Wl,-soname,libkvengine.so.$(SONAME_MAJOR) $(LDFLAGS) -o $@ $^ $(filter-out -ljemalloc,$(LDLIBS))
	ln -sf libkvengine.so.$(VERSION) $(BUILD)/libkvengine.so.$(SONAME_MAJOR)
	ln -sf libkvengine.so.$(SONAME_MAJOR) $(BUILD)/libkvengine.so

tools: $(TOOL_BINS)

# tools/NAME.c and tools/NAME_*.c make build/NAME, with the sources
# NAME_SRC names (kvctl: its benchmark harness, tools/bench/); tools/common_*.c
# are linked into every program.
kvctl_SRC := $(wildcard tools/bench/*.c)
define tool_rule
$(BUILD)/$(1): $(patsubst %.c,$(BUILD)/obj/%.o,$(wildcard tools/$(1).c tools/$(1)_*.c tools/common_*.c) $($(1)_SRC)) $(STATIC)
	$$(CC) $$(LDFLAGS) -pthread -o $$@ $$^ $$(LDLIBS)
endef
$(foreach t,$(TOOLS),$(eval $(call tool_rule,$(t))))

$(BUILD)/tests/check_kvengine: $(TEST_OBJ) $(STATIC)
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS) -pthread -o $@ $^ $(LDLIBS) -lcheck -lsubunit -lrt -lm

$(BUILD)/softverbs/libibverbs.so.1: $(SV_SRC) $(wildcard tests/softverbs/*.h) tests/softverbs/softverbs.map
	@mkdir -p $(@D)
	$(CC) -std=gnu11 -O1 -g -fPIC -shared -Wall -Wextra -Werror -D_GNU_SOURCE \
	    -Wl,--version-script=tests/softverbs/softverbs.map -Wl,-soname,libibverbs.so.1 \
	    -o $@ $(SV_SRC) -lpthread

# examples/NAME.c (the README's quickstart among them) build against the
# public header and the static library only.
EXAMPLES := $(patsubst examples/%.c,$(BUILD)/examples/%,$(wildcard examples/*.c))
$(BUILD)/examples/%: examples/%.c $(STATIC)
	@mkdir -p $(@D)
	$(CC) -std=gnu11 -Wall -Wextra -Werror -Iinclude $(CFLAGS_SAN) -o $@ $< $(STATIC) $(LDFLAGS) $(LDLIBS)

# Under ThreadSanitizer, races TSan cannot judge inside the uninstrumented
# librocksdb are suppressed (tests/tsan.supp says why).
TSAN_ENV := $(if $(findstring thread,$(SANITIZE)),TSAN_OPTIONS="suppressions=$(abspath tests/tsan.supp) $$TSAN_OPTIONS")

# The Python package's tests (tests/python, pytest) load this build's
# shared library. Under AddressSanitizer the interpreter is not instrumented,
# so the runtimes are preloaded and leak checking is off (CPython keeps its
# objects at exit); under ThreadSanitizer the package is not tested.
PY_SAN_ENV := $(if $(findstring address,$(SANITIZE)),LD_PRELOAD="$(shell $(CC) -print-file-name=libasan.so) $(if $(findstring undefined,$(SANITIZE)),$(shell $(CC) -print-file-name=libubsan.so))" ASAN_OPTIONS="$$ASAN_OPTIONS:detect_leaks=0")
PYTEST_RUN := $(PY_SAN_ENV) PYTHONDONTWRITEBYTECODE=1 KV_BUILD=$(abspath $(BUILD)) \
    KVENGINE_LIBRARY=$(abspath $(BUILD))/libkvengine.so.$(SONAME_MAJOR) \
    $(PYTHON) -m pytest -q -p no:cacheprovider tests/python

# The test runner finds the tools and the stand-in through KV_BUILD.
# scripts/layers.sh: net/ and persist/ never call up into engine/ (nm).
test check: all $(BUILD)/tests/check_kvengine $(SV_LIB) $(EXAMPLES)
	sh scripts/layers.sh $(BUILD)
	$(TSAN_ENV) KV_BUILD=$(abspath $(BUILD)) $(BUILD)/tests/check_kvengine
	@$(BUILD)/examples/quickstart > $(BUILD)/quickstart.out 2>&1 && grep -q 'hit=1 load=success same=1' \
	    $(BUILD)/quickstart.out && echo "quickstart: hit=1 load=success same=1" || { cat $(BUILD)/quickstart.out; exit 1; }
	$(if $(findstring thread,$(SANITIZE)),@echo "pytest: skipped under ThreadSanitizer",$(PYTEST_RUN))

# The Python package's suite alone.
pytest: all
	$(PYTEST_RUN)

ROUNDS ?= 20
crashtest: all $(BUILD)/tests/check_kvengine
	KV_BUILD=$(abspath $(BUILD)) KV_CRASH_ROUNDS=$(ROUNDS) CK_RUN_SUITE=crash \
	    $(BUILD)/tests/check_kvengine

# The RDMA transport through the libibverbs stand-in (tests/softverbs):
# the stand-in is loaded in place of the real library for these suites.
# A registry of its own per run, removed afterwards (killed nodes cannot).
rdmatest: all $(BUILD)/tests/check_kvengine $(SV_LIB)
	reg=/dev/shm/softverbs-rdmatest-$$$$; rc=0; \
	for s in rdma cluster; do \
	    SOFTVERBS_REGISTRY=$$reg LD_LIBRARY_PATH=$(abspath $(BUILD))/softverbs \
	    KV_TEST_PROTOCOL=rdma CK_RUN_SUITE=$$s KV_BUILD=$(abspath $(BUILD)) \
	    $(BUILD)/tests/check_kvengine || { rc=1; break; }; \
	done; rm -f $$reg; exit $$rc

# The cluster suite a third time with membership in etcd (the tests start
# Debian's etcd themselves on loopback), and the etcd suite's failure tests.
etcdtest: all $(BUILD)/tests/check_kvengine
	KV_TEST_METADATA=etcd CK_RUN_SUITE=cluster KV_BUILD=$(abspath $(BUILD)) \
	    $(BUILD)/tests/check_kvengine
	CK_RUN_SUITE=etcd KV_BUILD=$(abspath $(BUILD)) $(BUILD)/tests/check_kvengine

bench: all
	$(BUILD)/kvctl bench

install: all
	install -d $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/include \
	    $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib/pkgconfig
	install -m 644 $(STATIC) $(DESTDIR)$(PREFIX)/lib/
	install -m 755 $(SHARED) $(DESTDIR)$(PREFIX)/lib/
	ln -sf libkvengine.so.$(VERSION) $(DESTDIR)$(PREFIX)/lib/libkvengine.so.$(SONAME_MAJOR)
	ln -sf libkvengine.so.$(SONAME_MAJOR) $(DESTDIR)$(PREFIX)/lib/libkvengine.so
	install -m 644 include/kvengine.h $(DESTDIR)$(PREFIX)/include/
	install -m 755 $(TOOL_BINS) $(DESTDIR)$(PREFIX)/bin/
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|$(VERSION)|g' kvengine.pc.in \
	    > $(DESTDIR)$(PREFIX)/lib/pkgconfig/kvengine.pc
	install -d $(DESTDIR)$(PREFIX)/share/man/man1 $(DESTDIR)$(PREFIX)/share/man/man5
	install -m 644 man/kvctl.1 man/kvmaster.1 man/kvnode.1 $(DESTDIR)$(PREFIX)/share/man/man1/
	install -m 644 man/kvengine.yaml.5 $(DESTDIR)$(PREFIX)/share/man/man5/
	install -d $(DESTDIR)$(PYDIR)/kvengine $(DESTDIR)$(PREFIX)/share/kvengine/python-compat/mooncake
	install -m 644 python/kvengine/*.py $(DESTDIR)$(PYDIR)/kvengine/
	install -m 644 python/compat/mooncake/*.py \
	    $(DESTDIR)$(PREFIX)/share/kvengine/python-compat/mooncake/

# Installs into a fresh temporary prefix, then builds every examples/*.c
# against it the way a user would (cc app.c $$(pkg-config --cflags --libs
# kvengine), the shared library) and runs it; checks the soname link, the
# programs and the man pages landed. What CI runs: make installcheck
installcheck: all
	@set -e; tmp=$$(mktemp -d "$${TMPDIR:-/tmp}/kvengine-installcheck.XXXXXX"); \
	trap 'rm -rf "$$tmp"' EXIT; p=$$tmp/prefix; \
	$(MAKE) --no-print-directory install PREFIX=$$p DESTDIR= >/dev/null; \
	test -L $$p/lib/libkvengine.so && test -L $$p/lib/libkvengine.so.$(SONAME_MAJOR); \
	test -f $$p/lib/libkvengine.so.$(VERSION) && test -f $$p/lib/libkvengine.a; \
	for m in man1/kvctl.1 man1/kvmaster.1 man1/kvnode.1 man5/kvengine.yaml.5; do \
	    test -f $$p/share/man/$$m; done; \
	export PKG_CONFIG_PATH=$$p/lib/pkgconfig; \
	pkg-config --exists --print-errors kvengine; \
	for src in examples/*.c; do \
	    exe=$$tmp/$$(basename $$src .c); \
	    echo "installcheck: $(CC) $$src \$$(pkg-config --cflags --libs kvengine)"; \
	    $(CC) -std=gnu11 -Wall -Wextra -Werror -o $$exe $$src $$(pkg-config --cflags --libs kvengine); \
	    readelf -d $$exe | grep -q 'NEEDED.*libkvengine.so.$(SONAME_MAJOR)'; \
	    LD_LIBRARY_PATH=$$p/lib $$exe; \
	done; \
	for t in $(TOOLS); do $$p/bin/$$t --help >/dev/null; done; \
	echo "installcheck: import kvengine from $$p/lib/python3/dist-packages"; \
	(cd "$$tmp" && env -u KVENGINE_LIBRARY PYTHONDONTWRITEBYTECODE=1 \
	    PYTHONPATH=$$p/lib/python3/dist-packages:$$p/share/kvengine/python-compat $(PYTHON) -c \
	    'import os, sys, kvengine, mooncake.store as ms; p = sys.argv[1]; \
	    assert kvengine.__file__.startswith(p + "/lib/python3/dist-packages/"), kvengine.__file__; \
	    assert os.path.realpath(kvengine.library_path).startswith(p + "/lib/"), kvengine.library_path; \
	    e = kvengine.Engine(settings={"pipeline": "dram", "dram.capacity": "16MiB", "log.level": "warn"}); \
	    e.put("k", b"v"); assert e.get("k") == b"v"; e.close(); \
	    s = ms.MooncakeDistributedStore(); assert s.setup("localhost", "", "16MB", "16MB", "tcp", "", "") == 0; \
	    assert s.put("k", b"v") == 0 and s.get("k") == b"v"; s.close()' "$$p"); \
	echo "installcheck: ok (prefix $$p)"

# libFuzzer harnesses (tests/fuzz/fuzz_*.c), built with clang against the
# library compiled again with coverage and ASan+UBSan into $(FUZZ_BUILD).
# `make fuzz FUZZ_SECONDS=N` replays each harness's corpus
# (tests/fuzz/corpus/NAME) and fuzzes it N seconds; a crash fails the target
# and leaves its reproducer under $(FUZZ_BUILD)/artifacts (tests/fuzz/run.sh).
FUZZ_CC      ?= clang
FUZZ_SECONDS ?= 60
FUZZ_BUILD   ?= $(BUILD)/fuzz
FUZZ_CFLAGS  := -std=gnu11 -O1 -g -fPIC -pthread $(WARN) -MMD -MP -fno-omit-frame-pointer \
                -fsanitize=address,undefined -fno-sanitize-recover=all
FUZZ_SRC     := $(sort $(wildcard tests/fuzz/fuzz_*.c))
FUZZ_BINS    := $(FUZZ_SRC:tests/fuzz/%.c=$(FUZZ_BUILD)/%)
FUZZ_LIB     := $(FUZZ_BUILD)/libkvengine.a
# FUZZ_TOTAL=N shares N seconds among the harnesses instead of FUZZ_SECONDS
# each (CI: the fuzz step keeps its length as harnesses are added).
FUZZ_TOTAL   ?=
FUZZ_EACH     = $(if $(FUZZ_TOTAL),$(shell expr $(FUZZ_TOTAL) / $(words $(FUZZ_BINS))),$(FUZZ_SECONDS))

$(FUZZ_BUILD)/obj/%.o: %.c | $(BUILD)/.deps
	@mkdir -p $(@D)
	$(FUZZ_CC) $(CPPFLAGS) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -c $< -o $@

$(FUZZ_LIB): $(LIB_SRC:%.c=$(FUZZ_BUILD)/obj/%.o)
	@rm -f $@
	ar rcs $@ $^

# ASan replaces the allocator, so jemalloc stays out. The harness objects
# are kept (make would delete them as intermediates and rebuild each time).
.PRECIOUS: $(FUZZ_BUILD)/obj/tests/fuzz/%.o
$(FUZZ_BUILD)/fuzz_%: $(FUZZ_BUILD)/obj/tests/fuzz/fuzz_%.o $(FUZZ_BUILD)/obj/tests/fuzz/fuzzutil.o $(FUZZ_LIB)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer -o $@ $^ $(filter-out -ljemalloc,$(LDLIBS))

# Regenerates the seed corpora from the library's own encoders (each
# harness writes its seeds when KV_FUZZ_MKCORPUS names a directory).
.PHONY: fuzz fuzz-build fuzz-corpus soak
fuzz-build: $(FUZZ_BINS)
fuzz: fuzz-build
	sh tests/fuzz/run.sh $(FUZZ_BUILD) $(FUZZ_EACH) $(FUZZ_BINS)
fuzz-corpus: fuzz-build
	@set -e; for b in $(FUZZ_BINS); do d=tests/fuzz/corpus/$$(basename $$b); \
	    mkdir -p $$d; KV_FUZZ_MKCORPUS=$$d $$b; echo "fuzz-corpus: $$d"; done

# The host store under random SIGKILLs (issue 16): workers in C (the one
# below, the public API only), kvengine.ucm and the Mooncake drop-in share a
# store, embedded and behind kvnode, by store.name and by ssd.path, while
# workers and servers are killed; tests/chaos/host_chaos.py says what it
# checks. CHAOS_SECONDS of chaos per shape and mode; CHAOS_ARGS for more
# (e.g. --shape ssd --mode daemon --runs 3 --seed 7 -v).
CHAOS_SECONDS ?= 90
CHAOS_ARGS    ?=
$(BUILD)/tests/chaos_worker: tests/chaos/chaos_worker.c $(STATIC)
	@mkdir -p $(@D)
	$(CC) -std=gnu11 $(OPT) -g $(WARN) -Iinclude $(CFLAGS_SAN) -pthread -o $@ $< $(STATIC) $(LDFLAGS) $(LDLIBS)
.PHONY: chaos chaos-build
chaos-build: all $(BUILD)/tests/chaos_worker
chaos: chaos-build
	$(PY_SAN_ENV) KV_BUILD=$(abspath $(BUILD)) KVENGINE_LIBRARY=$(abspath $(BUILD))/libkvengine.so.$(SONAME_MAJOR) \
	    $(PYTHON) tests/chaos/host_chaos.py --seconds $(CHAOS_SECONDS) $(CHAOS_ARGS)

# Sustained load (mixed_rw with eviction, spill, GC and log compaction, and
# a two-node cluster with a client) watching every process's RSS and open
# descriptors; fails on growth after the warm-up (scripts/soak.sh says how).
SOAK_SECONDS ?= 600
soak: all
	KV_BUILD=$(BUILD) bash scripts/soak.sh $(SOAK_SECONDS)

# The references generated from the code's tables (scripts/gendoc.c):
# `make doc` rewrites them, `make doccheck` fails while a checked-in one
# differs (make test checks the same in the ops suite; .ci/run calls
# doccheck). After merging a branch that adds config keys or metrics: make doc.
GENDOC_OUT := config-md:doc/config.md config-man:man/kvengine.yaml.5 metrics-md:doc/metrics.md
.PHONY: doc doccheck
$(BUILD)/gendoc: $(BUILD)/obj/scripts/gendoc.o $(STATIC)
	$(CC) $(LDFLAGS) -pthread -o $@ $^ $(LDLIBS)
doc: $(BUILD)/gendoc
	@set -e; for p in $(GENDOC_OUT); do $(BUILD)/gendoc $${p%%:*} > $${p#*:}.tmp; \
	    mv $${p#*:}.tmp $${p#*:}; echo "doc: $${p#*:}"; done
doccheck: $(BUILD)/gendoc
	@set -e; rc=0; for p in $(GENDOC_OUT); do \
	    if ! $(BUILD)/gendoc $${p%%:*} | cmp -s - $${p#*:}; then \
	        echo "doccheck: $${p#*:} differs from the code (make doc)"; rc=1; fi; done; \
	    [ $$rc = 0 ] && echo "doccheck: doc/config.md, man/kvengine.yaml.5, doc/metrics.md match the code"; exit $$rc
test check: $(BUILD)/gendoc

# Debian packages from this tree (debian/, dpkg-buildpackage, no network):
# the tree is copied into $(DEB_DIR)/kvengine-$(VERSION) so the build and
# its results (the .deb files, in $(DEB_DIR)) stay out of the way of this
# checkout. scripts/debcheck.sh installs and smoke-tests them.
DEB_DIR ?= $(BUILD)/deb
.PHONY: deb
deb:
	@command -v dpkg-buildpackage >/dev/null && test -f /usr/share/perl5/Debian/Debhelper/Dh_Lib.pm || \
	    { echo "make deb: needs dpkg-dev and debhelper (sh scripts/deps.sh debhelper)"; exit 1; }
	rm -rf $(DEB_DIR) && mkdir -p $(DEB_DIR)/kvengine-$(VERSION)
	tar -cf - --exclude=./build --exclude=./.git . | tar -xf - -C $(DEB_DIR)/kvengine-$(VERSION)
	cd $(DEB_DIR)/kvengine-$(VERSION) && DEB_BUILD_OPTIONS="parallel=2 $$DEB_BUILD_OPTIONS" \
	    dpkg-buildpackage -us -uc -b
	@ls $(DEB_DIR)/*.deb

clean:
	rm -rf build

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
-include $(shell find $(FUZZ_BUILD)/obj -name '*.d' 2>/dev/null)

# bench/alloc.c: this tree's segment allocator against ALLOC_OLD's (the last
# one with 64 KiB runs, from git), each built alone as a .so in a scratch
# folder, on the same sequences in one run. BENCH_ALLOC_ARGS="--seg 1024".
ALLOC_OLD ?= 0d7d20f
.PHONY: bench-alloc
bench-alloc:
	mkdir -p $(BUILD)/bench-alloc
	git show $(ALLOC_OLD):engine/alloc.c > $(BUILD)/bench-alloc/alloc_old.c
	$(CC) $(CPPFLAGS) -Iengine -std=gnu11 -O2 -fPIC -shared -pthread $(BUILD)/bench-alloc/alloc_old.c -o $(BUILD)/bench-alloc/old.so
	$(CC) $(CPPFLAGS) -std=gnu11 -O2 -fPIC -shared -pthread engine/alloc.c -o $(BUILD)/bench-alloc/new.so
	$(CC) $(CPPFLAGS) -std=gnu11 -O2 $(WARN) bench/alloc.c -o $(BUILD)/bench-alloc/alloc -rdynamic -ldl -lm
	$(BUILD)/bench-alloc/alloc $(BENCH_ALLOC_ARGS) $(BUILD)/bench-alloc/old.so $(BUILD)/bench-alloc/new.so
