#!/usr/bin/env python3
"""host_chaos.py — one store per host (issue 16) under random SIGKILLs.

    python3 tests/chaos/host_chaos.py [--shape dram|ssd|all] [--mode embedded|daemon|all]
                                      [--seconds 90] [--workers 6] [--seed N] [--keep]

(`make chaos CHAOS_SECONDS=N` runs every shape and mode with the build's
tools; KV_BUILD names the build, default build/.)

What it runs, per shape and mode, in a fresh directory under $TMPDIR:
  shapes  dram: `pipeline: dram`, shared by store.name (Mooncake's
          setup_dummy name, UCM's unique_id); ssd: `pipeline: dram|ssd` with
          ssd.write_through, shared by ssd.path (UCM's storage_backends,
          Mooncake's ssd_offload_path).
  modes   embedded: the first opener serves; daemon: kvnode serves (on the
          ssd shape a kvnode in a one-member cluster, with its kvmaster).
  workers N processes, all opening the one store as their own API configures
          it: C (tests/chaos/chaos_worker.c, the public API), UCM workers
          (kvengine.ucm, device_id >= 0: dump_data / load_data / lookup), a
          UCM scheduler (device_id -1: lookups), Mooncake clients
          (mooncake.store: put / get / is_exist / remove / batches).
  chaos   for --seconds, every 0.3-1.5 s: SIGKILL a random worker (it is
          started again), or, one time in four, the process serving the
          store (whoever holds <store.dir>/<id>.lock: the embedded server, a
          worker that took the store over, or kvnode, which is started again
          after 0-1 s).

What it checks (a run fails on any of them; the report lists them all):
  - bytes: every value any worker reads is the one written under its name
    and version (the value format below), a failed load leaves each
    destination untouched or right, a plain key never reads older than its
    last acknowledged write nor comes back after an acknowledged remove;
  - durability (ssd shape): a block whose dump was acknowledged (a line in
    the journal) always hits and loads byte for byte, across every server
    death, and once more at the end (all of them, by a fresh process);
    dram shape: a block may be missing, never wrong;
  - promptness: no call blocks longer than io.timeout_ms + --slack-ms (the
    workers time each call, and a watchdog thread reports one still blocked);
  - crashes: a worker ends only by the driver's SIGKILL or, at the end, with
    exit status 0; a Python worker raises nothing but the documented errors
    (KvError / RuntimeError from kvengine.ucm; Mooncake's calls return codes);
  - leftovers: with the workers gone (all but the one serving, which idles),
    a fresh observer sees host_pins at 0 and host_clients at 1 (itself)
    within lease_ttl_ms + 3 s; after remove_all, dram_used is exactly the
    stored shards' allocation (no reservation or staging leaked); the
    server's descriptors and memfd mappings are no more than while it
    served everyone; no new /dev/shm entry; every process exits cleanly.

The value format (the same in chaos_worker.c): a value of name N at version
V, L bytes long, is 32-byte lines, line i = le64 fnv1a64(N), le64 V, le64 i,
le64 L, cut at L bytes. A block shard's name is its id + le32 index (V 0); a
plain key's is the key. Block ids are "CHAO" + le16 slot + le16
incarnation + le64 sequence; slot 0xffff is never dumped (phantoms).

Every process it starts is in its own process group, dies with the driver
(PR_SET_PDEATHSIG) and is killed and reaped at the end, pass or fail.
Quiet when a run passes (one line per run); the workers' logs when it fails.
"""

import argparse
import ctypes
import glob
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHARDS = 2
SENTINEL = 0xE7
KEYS = 48

# ---- the value format -----------------------------------------------------------

_FNV_OFF, _FNV_PRIME, _M64 = 0xcbf29ce484222325, 0x100000001b3, (1 << 64) - 1


def fnv64(b):
    h = _FNV_OFF
    for x in b:
        h = ((h ^ x) * _FNV_PRIME) & _M64
    return h


def gen(name, ver, n):
    h = fnv64(name)
    lines = (n + 31) // 32
    flat = []
    for i in range(lines):
        flat += (h, ver, i, n)
    return struct.pack("<%dQ" % (4 * lines), *flat)[:n]


def verify(name, buf):
    """The version buf is a whole value of name at, or None."""
    buf = bytes(buf)
    if len(buf) < 16:
        return None
    h, v = struct.unpack_from("<QQ", buf)
    if h != fnv64(name):
        return None
    return v if gen(name, v, len(buf)) == buf else None


def make_id(slot, inc, seq):
    return b"CHAO" + struct.pack("<HHQ", slot & 0xffff, inc & 0xffff, seq & _M64)


def shard_name(bid, index):
    return bid + struct.pack("<I", index)


# ---- the Python workers ------------------------------------------------------------

class Worker:
    """What every Python worker shares: reporting, call timing, the journal."""

    def __init__(self, a):
        self.a = a
        self.rng = random.Random(a.seed)
        self.ssd = a.shape == "ssd"
        self.limit = a.timeout_ms + a.slack_ms
        self.counts, self.maxms, self.errs = {}, {}, {}
        self.cur = None
        self.cur_seq = 0
        self.lock = threading.Lock()
        jdir = os.path.join(a.dir, "journal")
        self.jfd = os.open(os.path.join(jdir, "%s%d-%d.j" % (a.worker[0], a.slot, a.inc)),
                           os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self.jdir = jdir
        self.acked = []
        self.scanned = 0.0
        self.next_seq = 1
        threading.Thread(target=self._watchdog, daemon=True).start()

    def say(self, line):
        if line[:2] in ("V ", "L ", "H "):
            line = "%s %.3f %s" % (line[0], time.time(), line[2:])
        with self.lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    def _watchdog(self):
        """A call still blocked is reported every io.timeout_ms + slack (an H
        line, with the stacks), as chaos_worker.c's watchdog does."""
        seq, times = None, 0
        while True:
            time.sleep(0.1)
            cur = self.cur
            if cur is None or cur[0] == "open":
                continue
            if cur[2] != seq:
                seq, times = cur[2], 0
            ms = (time.monotonic() - cur[1]) * 1000
            if ms > (times + 1) * self.limit:
                times = int(ms // self.limit)
                self.say("H %s %d" % (cur[0], ms))
                if times == 1:
                    import faulthandler
                    faulthandler.dump_traceback(file=sys.stdout, all_threads=True)

    def call(self, op, fn, *args):
        """fn(*args), timed: a call past io.timeout_ms is reported (an L
        line), for the driver to judge against the server deaths."""
        self.cur_seq += 1
        t0 = time.monotonic()
        self.cur = (op, t0, self.cur_seq)
        res = "ok"
        try:
            r = fn(*args)
            if isinstance(r, int) and r in (-900, -901):
                res = "RPC_FAIL" if r == -900 else "RPC_TIMEOUT"
            return r
        except BaseException as exc:
            res = {-109: "ENET", -105: "ETIMEDOUT"}.get(getattr(exc, "code", None),
                                                          type(exc).__name__)
            raise
        finally:
            ms = int((time.monotonic() - t0) * 1000)
            self.cur = None
            self.counts[op] = self.counts.get(op, 0) + 1
            self.maxms[op] = max(self.maxms.get(op, 0), ms)
            if op != "open" and ms > self.a.timeout_ms:
                self.say("L %s %d ms %s" % (op, ms, res))

    def err(self, what, code, ok=()):
        self.errs[code] = self.errs.get(code, 0) + 1
        if code not in ok:
            self.say("V error %s returned %s" % (what, code))

    def ack(self, bid):
        os.write(self.jfd, b"B " + bid.hex().encode() + b"\n")

    def pick_acked(self):
        if time.monotonic() - self.scanned > 1.0:
            self.acked = journal_ids(self.jdir)
            self.scanned = time.monotonic()
        if not self.acked:
            return None
        n = len(self.acked)
        if self.rng.random() < 0.5:
            return self.acked[self.rng.randrange(n)]
        return self.acked[n - 1 - self.rng.randrange(min(n, 64))]

    def new_id(self):
        bid = make_id(self.a.slot, self.a.inc, self.next_seq)
        self.next_seq += 1
        return bid

    def phantom(self):
        return make_id(0xffff, self.a.inc, self.rng.getrandbits(64))

    def summary(self, why):
        parts = ["S " + why]
        parts += ["%s=%d/%dms" % (k, self.counts[k], self.maxms[k]) for k in sorted(self.counts)]
        parts += ["%s=%d" % (k, v) for k, v in sorted(self.errs.items(), key=str)]
        self.say(" ".join(parts))

    def quiesced(self):
        now = time.monotonic()
        if now - getattr(self, "told", 0) > 2:
            self.told = now
            self.summary("so-far")
        return os.path.exists(os.path.join(self.a.dir, "quiesce"))

    def idle_if_serving(self, eng):
        """The process serving the store stays (idle) until the driver has
        looked at it; the others close and go."""
        from kvengine import _lib
        st = _lib.kv_stats()
        if _lib.kv_stats_get(eng._h, ctypes.byref(st)) == 0 and st.reserved[2] == 0:
            self.say("R serving pid %d" % os.getpid())
            while not os.path.exists(os.path.join(self.a.dir, "finish")):
                time.sleep(0.02)


def journal_ids(jdir):
    ids = []
    for p in sorted(glob.glob(os.path.join(jdir, "*.j"))):
        try:
            with open(p, "rb") as f:
                data = f.read()
        except OSError:
            continue
        for line in data.split(b"\n")[:-1]:   # the last piece is torn or empty
            if len(line) == 34 and line.startswith(b"B "):
                try:
                    ids.append(bytes.fromhex(line[2:].decode()))
                except ValueError:
                    pass
    return ids


def settings_of(a):
    return json.loads(a.settings)


_OK_ERRS = None


def _kv():
    global _OK_ERRS
    import kvengine
    from kvengine import engine as E
    _OK_ERRS = (E.ENET, E.ETIMEDOUT, E.ENOSPC, E.EBUSY)
    return kvengine, E


def ucm_config(a, dev):
    s = settings_of(a)
    shard = a.shard
    cfg = {"device_id": dev, "tensor_size": shard // 2, "shard_size": shard,
           "block_size": SHARDS * shard, "timeout_ms": a.timeout_ms,
           "kvengine_settings": {k: v for k, v in s.items()
                                 if k in ("store.dir", "dram.capacity", "dram.hugepages",
                                          "log.level", "eviction.lease_ttl_ms", "io.threads",
                                          "ssd.write_through", "ssd.capacity")}}
    if a.shape == "ssd":
        cfg["unique_id"] = "ucm-chaos-%d" % dev   # UCM's scripts give each a different one
        cfg["storage_backends"] = [s["ssd.path"]]
    else:
        cfg["unique_id"] = s["store.name"]
        cfg["store_pipeline"] = "Cache"
    return cfg


def run_ucm(a, dev):
    kvengine, E = _kv()
    from kvengine.ucm import KvEngineStore
    try:
        # A UCM worker runs inside vLLM, which has torch imported long before
        # the first dump (kvengine.ucm asks torch's CUDA runtime whether an
        # address is device memory: the import would be the first call's).
        import torch  # noqa: F401
    except ImportError:
        pass
    w = Worker(a)
    store = w.call("open", KvEngineStore, ucm_config(a, dev))
    w.say("R ready pid %d" % os.getpid())
    half = a.shard // 2
    # A block's shard x is tensors 2x, 2x+1 of its row (UCM: one address per
    # tensor, tensor_size bytes each).
    nbuf = 4
    bufs = [[bytearray(half) for _ in range(2 * SHARDS)] for _ in range(nbuf)]
    addrs = [[ctypes.addressof((ctypes.c_char * half).from_buffer(t)) for t in row]
             for row in bufs]

    def wait(op, t, ok):
        try:
            if w.rng.random() < 0.3:
                # UCM's connector also polls: check() until done, then wait().
                t0 = time.monotonic()
                while not w.call("check", store.check, t):
                    if time.monotonic() - t0 > 3 * w.limit / 1000:
                        w.say("V hang %s: check() still says not done after %d ms"
                              % (op, 3 * w.limit))
                        break
                    time.sleep(0.001)
                else:
                    rc = t.task.result or 0
                    if rc:
                        w.err(op, rc, ok)
                    return rc
            w.call(op, store.wait, t)
            return 0
        except E.KvError as exc:
            w.err(op, exc.code, ok)
            return exc.code
        except RuntimeError as exc:   # a device copy: none here
            w.say("V error %s raised %r" % (op, exc))
            return -1

    def dump():
        n = w.rng.randint(1, nbuf)
        ids = [w.new_id() for _ in range(n)]
        for i, bid in enumerate(ids):
            for x in range(SHARDS):
                v = gen(shard_name(bid, x), 0, a.shard)
                bufs[i][2 * x][:] = v[:half]
                bufs[i][2 * x + 1][:] = v[half:]
        tasks = []
        for x in range(SHARDS):
            rows = [[addrs[i][2 * x], addrs[i][2 * x + 1]] for i in range(n)]
            try:
                tasks.append(w.call("dump", store.dump_data, ids, [x] * n, rows))
            except E.KvError as exc:
                w.err("dump_data", exc.code, _OK_ERRS)
        ok = len(tasks) == SHARDS
        for t in tasks:
            ok = wait("wait_dump", t, _OK_ERRS) == 0 and ok
        if ok:
            for bid in ids:
                w.ack(bid)

    def load():
        ids = []
        for _ in range(w.rng.randint(1, nbuf)):
            bid = w.pick_acked()
            if bid is not None and bid not in ids:
                ids.append(bid)
        if not ids:
            return
        n = len(ids)
        for row in bufs[:n]:
            for t in row:
                t[:] = bytes([SENTINEL]) * half
        results = []
        for x in range(SHARDS):
            rows = [[addrs[i][2 * x], addrs[i][2 * x + 1]] for i in range(n)]
            try:
                t = w.call("load", store.load_data, ids, [x] * n, rows)
            except E.KvError as exc:
                w.err("load_data", exc.code, _OK_ERRS)
                results.append(exc.code)
                continue
            results.append(wait("wait_load", t, _OK_ERRS + (E.ENOTFOUND,)))
        for x, rc in enumerate(results):
            for i, bid in enumerate(ids):
                got = bytes(bufs[i][2 * x]) + bytes(bufs[i][2 * x + 1])
                right = verify(shard_name(bid, x), got) == 0
                untouched = got == bytes([SENTINEL]) * a.shard
                if rc == 0 and not right:
                    w.say("V wrong-bytes load_data of %s shard %d succeeded with other bytes%s"
                          % (bid.hex(), x, " (untouched)" if untouched else ""))
                elif rc in (E.ENET, E.ETIMEDOUT) and not right and not untouched:
                    w.errs["partial_dest"] = w.errs.get("partial_dest", 0) + 1
                elif rc != 0 and not right and not untouched:
                    w.say("V torn-dest load_data of %s shard %d failed (%s) and left a "
                          "destination neither untouched nor right" % (bid.hex(), x, rc))
            if rc == E.ENOTFOUND and w.ssd:
                w.say("V lost load_data of acknowledged blocks %s missed on the ssd shape"
                      % [b.hex() for b in ids])

    def lookup():
        ids = [b for b in (w.pick_acked() for _ in range(5)) if b is not None]
        known = len(ids)
        ids.append(w.phantom())
        prefix = w.rng.random() < 0.3
        try:
            if prefix:
                r = w.call("lookup_prefix", store.lookup_on_prefix, ids)
            else:
                hits = list(w.call("lookup", store.lookup, ids))
        except E.KvError as exc:
            w.err("lookup", exc.code, _OK_ERRS)
            return
        if prefix:
            if r >= known:
                w.say("V phantom lookup_on_prefix ran through an id never dumped")
            elif w.ssd and r < known - 1:
                w.say("V lost lookup_on_prefix %d of %d acknowledged blocks on the ssd shape"
                      % (r + 1, known))
            return
        if hits[known]:
            w.say("V phantom lookup hit an id never dumped")
        for bid, hit in zip(ids[:known], hits):
            if w.ssd and not hit:
                w.say("V lost lookup missed acknowledged block %s on the ssd shape" % bid.hex())

    while not w.quiesced():
        r = w.rng.random()
        try:
            if dev < 0:
                lookup()
                time.sleep(0.005)
            elif r < 0.4:
                dump()
            elif r < 0.8:
                load()
            else:
                lookup()
        except Exception:
            w.say("V exc " + traceback.format_exc().replace("\n", " | "))
    w.summary("quiesced")
    w.idle_if_serving(store.engine)
    store.close()
    w.say("R closed")


def run_mooncake(a):
    kvengine, E = _kv()
    sys.path.insert(0, os.path.join(ROOT, "python", "compat"))
    from mooncake.store import MooncakeDistributedStore
    w = Worker(a)
    s = settings_of(a)
    st = MooncakeDistributedStore()
    keep = ("store.dir", "dram.hugepages", "log.level", "eviction.lease_ttl_ms", "io.timeout_ms",
            "io.threads", "store.block_shards", "ssd.write_through", "ssd.capacity")
    if a.shape == "ssd":
        rc = w.call("open", lambda: st.setup(
            "localhost", "", s["dram.capacity"], "16MB", "tcp", "", "", None, True, s["ssd.path"],
            "default", False, 9300, kvengine_settings={k: v for k, v in s.items() if k in keep}))
    else:
        os.environ["KVENGINE_SETTINGS"] = " ".join(
            "%s=%s" % (k, v) for k, v in s.items() if k in keep)
        rc = w.call("open", st.setup_dummy, s["dram.capacity"], "16MB", a.mooncake_addr)
    if rc != 0:
        w.say("V error mooncake setup returned %d: %s" % (rc, st.last_error))
        sys.exit(1)
    w.say("R ready pid %d" % os.getpid())
    state = {}   # key index -> [acked, attempted, removed_at or None]
    ver = [0]
    # Mooncake's codes: RPC_FAIL -900, RPC_TIMEOUT -901, NO_AVAILABLE_HANDLE
    # -200 (no room), OBJECT_NOT_FOUND -704.
    ok_codes = (-900, -901, -200)
    reg = bytearray(64 * 1024)
    reg_addr = ctypes.addressof((ctypes.c_char * len(reg)).from_buffer(reg))
    if st.register_buffer(reg_addr, len(reg)) != 0:
        w.say("V error register_buffer failed")

    def key(k):
        return "m%di%dk%d" % (a.slot, a.inc, k)

    def check(k, v, how):
        kb = key(k).encode()
        got = verify(kb, v)
        sk = state.setdefault(k, [0, 0, None])
        if got is None:
            w.say("V wrong-bytes %s of %s returned bytes that are no version of it" % (how, key(k)))
        elif got > sk[1]:
            w.say("V wrong-bytes %s of %s returned version %d never written" % (how, key(k), got))
        elif sk[2] is not None and got <= sk[2]:
            w.say("V resurrected %s of %s returned version %d after an acknowledged remove of "
                  "version %d" % (how, key(k), got, sk[2]))
        elif sk[2] is None and got < sk[0]:
            w.say("V stale %s of %s returned version %d after version %d was acknowledged"
                  % (how, key(k), got, sk[0]))

    def value(k):
        ver[0] += 1
        sk = state.setdefault(k, [0, 0, None])
        sk[1] = ver[0]
        # at most a zero-copy slot (16 KiB), so batch_get_into's slots hold any value
        return ver[0], gen(key(k).encode(), ver[0], 32 + w.rng.randrange(16 * 1024 - 32))

    def acked(k, v):
        sk = state[k]
        sk[0], sk[2] = v, None

    while not w.quiesced():
        k = w.rng.randrange(KEYS)
        r = w.rng.random()
        try:
            if r < 0.3:
                v, val = value(k)
                rc = w.call("put", st.put, key(k), val)
                if rc == 0:
                    acked(k, v)
                else:
                    w.err("put", rc, ok_codes)
            elif r < 0.6:
                got = w.call("get", st.get, key(k))
                if got:
                    check(k, got, "get")
            elif r < 0.68:
                rc = w.call("is_exist", st.is_exist, key(k))
                if rc not in (0, 1):
                    w.err("is_exist", rc, (-1,))   # -1: any error, by Mooncake's contract
            elif r < 0.75:
                rc = w.call("remove", st.remove, key(k), True)
                if rc in (0, -704):
                    sk = state.setdefault(k, [0, 0, None])
                    sk[2] = sk[1]
                else:
                    w.err("remove", rc, ok_codes)
            elif r < 0.85:
                ks = list(dict.fromkeys(w.rng.randrange(KEYS) for _ in range(6)))
                vals = [value(x) for x in ks]
                rc = w.call("put_batch", st.put_batch, [key(x) for x in ks],
                            [v for _, v in vals])
                if rc == 0:
                    for x, (v, _) in zip(ks, vals):
                        acked(x, v)
                else:
                    w.err("put_batch", rc, ok_codes)
            elif r < 0.92:
                ks = list(dict.fromkeys(w.rng.randrange(KEYS) for _ in range(6)))
                got = w.call("get_batch", st.get_batch, [key(x) for x in ks])
                for x, g in zip(ks, got):
                    if g:
                        check(x, g, "get_batch")
            elif r < 0.935:
                # Zero-copy batches from / into registered memory: 4 slots of 16 KiB.
                ks = list(dict.fromkeys(w.rng.randrange(KEYS) for _ in range(4)))
                slot = 16 * 1024
                if w.rng.random() < 0.5:
                    vals = []
                    for i, x in enumerate(ks):
                        ver[0] += 1
                        state.setdefault(x, [0, 0, None])[1] = ver[0]
                        val = gen(key(x).encode(), ver[0], 32 + w.rng.randrange(slot - 32))
                        reg[i * slot:i * slot + len(val)] = val
                        vals.append((ver[0], len(val)))
                    rcs = w.call("batch_put_from", st.batch_put_from, [key(x) for x in ks],
                                 [reg_addr + i * slot for i in range(len(ks))],
                                 [n for _, n in vals])
                    for x, (v, _), rc in zip(ks, vals, rcs):
                        if rc == 0:
                            acked(x, v)
                        else:
                            w.err("batch_put_from", rc, ok_codes)
                else:
                    reg[:] = bytes([SENTINEL]) * len(reg)
                    got = w.call("batch_get_into", st.batch_get_into, [key(x) for x in ks],
                                 [reg_addr + i * slot for i in range(len(ks))], [slot] * len(ks))
                    for i, (x, n) in enumerate(zip(ks, got)):
                        if n > 0:
                            check(x, bytes(reg[i * slot:i * slot + n]), "batch_get_into")
                        elif n < 0:
                            w.err("batch_get_into", n, ok_codes + (-704,))
            elif r < 0.96:
                v, val = value(k)
                reg[:len(val)] = val
                rc = w.call("put_from", st.put_from, key(k), reg_addr, len(val))
                if rc == 0:
                    acked(k, v)
                else:
                    w.err("put_from", rc, ok_codes)
            else:
                reg[:] = bytes([SENTINEL]) * len(reg)
                n = w.call("get_into", st.get_into, key(k), reg_addr, len(reg))
                if n > 0:
                    check(k, bytes(reg[:n]), "get_into")
                elif n < 0:
                    w.err("get_into", n, ok_codes + (-704,))
        except Exception:
            w.say("V exc " + traceback.format_exc().replace("\n", " | "))
    w.summary("quiesced")
    w.idle_if_serving(st._eng)
    st.close()
    w.say("R closed")


def run_observer(a):
    """Driven by the driver over stdin/stdout, one JSON line each way."""
    kvengine, E = _kv()
    from kvengine import _lib
    eng = kvengine.Engine(None, settings_of(a))
    print(json.dumps({"ready": os.getpid()}), flush=True)
    for line in sys.stdin:
        c = json.loads(line)
        out = {}
        try:
            if c["op"] == "stats":
                st = _lib.kv_stats()
                rc = _lib.kv_stats_get(eng._h, ctypes.byref(st))
                out = {n: getattr(st, n) for n in _lib.STATS_FIELDS}
                out.update(rc=rc, host_clients=st.reserved[0], host_pins=st.reserved[1],
                           host_attached=st.reserved[2])
            elif c["op"] == "remove_all":
                out["removed"] = eng.remove_all()
            elif c["op"] == "verify":
                out = verify_all(eng, E, a, c["ids"])
        except Exception:
            out["exc"] = traceback.format_exc()
        print(json.dumps(out), flush=True)
    eng.close()


def verify_all(eng, E, a, ids):
    """Loads every block in ids (hex), 16 at a time: how many were right,
    missing, failed otherwise, or wrong (with the first few wrong ones)."""
    ok = miss = other = 0
    wrong = []
    ids = [bytes.fromhex(x) for x in ids]
    for i in range(0, len(ids), 16):
        chunk = ids[i:i + 16]
        for bid in chunk:
            bufs = [bytearray([SENTINEL]) * a.shard for _ in range(SHARDS)]
            try:
                eng.load([(bid, x, [bufs[x]]) for x in range(SHARDS)], wait=True)
                rc = 0
            except E.KvError as exc:
                rc = exc.code
            for x in range(SHARDS):
                right = verify(shard_name(bid, x), bufs[x]) == 0
                untouched = bytes(bufs[x]) == bytes([SENTINEL]) * a.shard
                if (rc == 0 and not right) or (rc != 0 and not right and not untouched):
                    wrong.append("%s/%d rc %d" % (bid.hex(), x, rc))
            if rc == 0:
                ok += 1
            elif rc == E.ENOTFOUND:
                miss += 1
            else:
                other += 1
    return {"ok": ok, "miss": miss, "other": other, "wrong": wrong[:10], "nwrong": len(wrong)}


# ---- the driver ---------------------------------------------------------------------

KINDS = ("c", "ucm", "mooncake", "c", "ucm", "sched")


def _pdeathsig():
    os.setsid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)   # PR_SET_PDEATHSIG


class Proc:
    def __init__(self, kind, slot, inc, popen, log):
        self.kind, self.slot, self.inc, self.p, self.log = kind, slot, inc, popen, log
        self.killed = False
        self.t0 = time.monotonic()

    @property
    def pid(self):
        return self.p.pid


def fd_count(pid):
    try:
        return len(os.listdir("/proc/%d/fd" % pid))
    except OSError:
        return None


def threads(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for ln in f:
                if ln.startswith("Threads:"):
                    return int(ln.split()[1])
    except (OSError, ValueError):
        return None
    return None


def memfd_maps(pid):
    """The memfd mappings of pid, by name (one per distinct file)."""
    try:
        with open("/proc/%d/maps" % pid) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    seen = set()
    for ln in lines:
        parts = ln.split(None, 5)
        if len(parts) == 6 and ("memfd:" in parts[5] or "/dev/shm/" in parts[5]):
            seen.add((parts[3], parts[4], parts[5]))   # dev, inode, name
    return sorted(seen)


class Run:
    def __init__(self, opt, shape, mode, seed, build):
        self.opt, self.shape, self.mode, self.seed = opt, shape, mode, seed
        self.rng = random.Random(seed)
        self.build = build
        self.work = tempfile.mkdtemp(prefix="kvchaos-%s-%s." % (shape, mode),
                                     dir=os.environ.get("TMPDIR", "/tmp"))
        self.sdir = os.path.join(self.work, "rendezvous")
        os.mkdir(self.sdir, 0o700)
        os.mkdir(os.path.join(self.work, "journal"))
        os.mkdir(os.path.join(self.work, "log"))
        base = 20000 + (os.getpid() * 13 + seed * 7) % 9000
        self.ports = (base, base + 1)
        self.mooncake_addr = "127.0.0.1:%d" % (base + 2)   # named, never bound
        s = {"store.dir": self.sdir, "dram.capacity": "32MiB", "dram.hugepages": "off",
             "io.threads": "2", "log.level": "warn", "eviction.lease_ttl_ms": str(opt.lease_ms),
             "io.timeout_ms": str(opt.timeout_ms), "store.block_shards": str(SHARDS)}
        if shape == "ssd":
            s.update({"pipeline": "dram|ssd", "ssd.path": os.path.join(self.work, "ssd"),
                      "ssd.write_through": "true", "ssd.capacity": "4GiB"})
        else:
            s.update({"pipeline": "dram",
                      "store.name": "mooncake-" + self.mooncake_addr.replace(":", "-")})
        self.settings = s
        self.procs = {}         # slot -> Proc
        self.incs = {}
        self.daemons = {}       # "kvnode" / "kvmaster" -> Proc
        self.node_restart_at = None
        self.findings = []
        self.notes = []
        self.kills = {"worker": 0, "server": 0, "kvnode": 0}
        self.exits = 0
        self.server_fds = {}    # server pid -> [first, min, max] fd counts while serving
        self.summaries = []
        self.late = []          # (kind, slot, inc, end, op, ms, result): calls past io.timeout_ms
        self.deaths = []        # when a process holding the store's lock was killed
        self.survivor_fds = []  # (slot, inc, fds once connected, fds at the end) of C workers
        self.server_threads = {}  # server pid -> most threads seen while serving

    # -- processes --

    def log_path(self, name):
        return os.path.join(self.work, "log", name + ".log")

    def spawn(self, slot):
        kind = KINDS[slot % len(KINDS)]
        inc = self.incs.get(slot, 0) + 1
        self.incs[slot] = inc
        seed = self.rng.getrandbits(62)
        common = ["--dir", self.work, "--slot", str(slot), "--inc", str(inc), "--seed", str(seed),
                  "--shape", self.shape, "--shard", str(self.opt.shard),
                  "--timeout-ms", str(self.opt.timeout_ms), "--slack-ms", str(self.opt.slack_ms)]
        if kind == "c":
            argv = [os.path.join(self.build, "tests", "chaos_worker")] + common
            for k, v in self.settings.items():
                argv += ["--set", "%s=%s" % (k, v)]
        else:
            argv = [sys.executable, os.path.abspath(__file__), "--worker", kind] + common + \
                   ["--settings", json.dumps(self.settings), "--mooncake-addr", self.mooncake_addr]
        log = self.log_path("%s%d-%d" % (kind, slot, inc))
        with open(log, "wb") as f:
            p = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 preexec_fn=_pdeathsig, env=self.env())
        self.procs[slot] = Proc(kind, slot, inc, p, log)
        self.event("start %s %d.%d pid %d" % (kind, slot, inc, p.pid))

    def env(self):
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [os.path.join(ROOT, "python"), os.path.join(ROOT, "python", "compat")] +
            ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        env.setdefault("KVENGINE_LIBRARY", os.path.join(self.build, "libkvengine.so.0"))
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        return env

    def start_daemon(self, name):
        s = dict(self.settings)
        if name == "kvmaster":
            argv = [os.path.join(self.build, "kvmaster"), "--set",
                    "cluster.master=127.0.0.1:%d" % self.ports[0], "--set", "log.level=warn"]
        else:
            if self.shape == "ssd":
                s.update({"cluster.master": "127.0.0.1:%d" % self.ports[0],
                          "cluster.listen": "127.0.0.1:%d" % self.ports[1],
                          "cluster.protocol": "tcp"})
            argv = [os.path.join(self.build, "kvnode")]
            for k, v in s.items():
                argv += ["--set", "%s=%s" % (k, v)]
        n = sum(1 for x in os.listdir(os.path.join(self.work, "log")) if x.startswith(name))
        log = self.log_path("%s-%d" % (name, n + 1))
        with open(log, "wb") as f:
            p = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 preexec_fn=_pdeathsig, env=self.env())
        self.daemons[name] = Proc(name, -1, n + 1, p, log)
        self.event("start %s pid %d" % (name, p.pid))

    def event(self, what):
        with open(os.path.join(self.work, "events.log"), "a") as f:
            f.write("%.3f %s\n" % (time.time(), what))

    def kill(self, proc, what):
        holder = self.lock_holder() == proc.pid
        self.event("SIGKILL %s %s %d.%d pid %d%s" % (what, proc.kind, proc.slot, proc.inc,
                                                     proc.pid, " (lock holder)" if holder else ""))
        if holder:
            self.deaths.append(time.time())
        if proc.p.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.killed = True
            self.kills[what] += 1
        proc.p.wait()

    def lock_holder(self):
        for p in glob.glob(os.path.join(self.sdir, "*.lock")):
            try:
                with open(p) as f:
                    pid = int(f.read().strip() or 0)
            except (OSError, ValueError):
                continue
            if pid > 0:
                return pid
        return None

    def proc_of(self, pid):
        for p in list(self.procs.values()) + list(self.daemons.values()):
            if p.pid == pid and p.p.poll() is None:
                return p
        return None

    def finding(self, what, proc=None):
        self.findings.append((what, proc.log if proc else None))

    def reap(self, respawn=True):
        for slot, p in list(self.procs.items()):
            rc = p.p.poll()
            if rc is None:
                continue
            if not p.killed:
                self.finding("%s worker %d.%d (pid %d) exited by itself with %s" % (
                    p.kind, p.slot, p.inc, p.pid, rc if rc >= 0 else signal.Signals(-rc).name), p)
            self.collect(p)
            del self.procs[slot]
            if respawn:
                self.spawn(slot)
        node = self.daemons.get("kvnode")
        if node and node.p.poll() is not None and not node.killed:
            if node.p.returncode == 1 and self.node_refused(node):
                self.notes.append("kvnode found the store served by a worker (took over)")
            else:
                self.finding("kvnode (pid %d) exited by itself with %s" % (node.pid,
                             node.p.returncode), node)
            node.killed = True
            self.node_restart_at = time.monotonic() + 1.0

    def node_refused(self, node):
        """kvnode found a worker serving the store (it took it over) and
        stepped back, as it must."""
        with open(node.log, errors="replace") as f:
            return "already served by another process" in f.read()

    def collect(self, p):
        """The worker's report lines: findings (V) and its last summary (S)."""
        if getattr(p, "collected", False):
            return
        p.collected = True
        try:
            with open(p.log, errors="replace") as f:
                lines = f.read().splitlines()
        except OSError:
            return
        last = None
        for ln in lines:
            if ln.startswith("V "):
                self.finding("%s worker %d.%d: %s" % (p.kind, p.slot, p.inc, ln[2:]), p)
            elif ln.startswith("S "):
                last = ln[2:]
            elif ln.startswith("L "):
                parts = ln.split()
                if len(parts) >= 6:
                    self.late.append((p.kind, p.slot, p.inc, float(parts[1]), parts[2],
                                      int(parts[3]), parts[5]))
            elif ln.startswith("F "):
                a, b = (int(x) for x in ln.split()[1:3])
                if b > a + 6:
                    self.finding("%s worker %d.%d (attached all along) holds %d descriptors at "
                                 "the end, %d more than once it had connected"
                                 % (p.kind, p.slot, p.inc, b, b - a), p)
                self.survivor_fds.append((p.slot, p.inc, a, b))
            elif ln.startswith("H "):
                parts = ln.split()
                if len(parts) >= 4:
                    self.late.append((p.kind, p.slot, p.inc, float(parts[1]), parts[2],
                                      int(parts[3]), "still-blocked"))
        if last:
            self.summaries.append((p.kind, last))

    FAIL_SLACK_MS = 1000

    def judge_late(self):
        """A call may outlast io.timeout_ms only because of a server death:
        one that failed (ENET, ETIMEDOUT, Mooncake's RPC codes) must have
        ended within io.timeout_ms + FAIL_SLACK_MS of its start or of the
        last death during it; one that succeeded (it reconnected, or took
        the store over and opened it, perhaps after several deaths) within
        io.timeout_ms + --slack-ms of the same."""
        for kind, slot, inc, end, op, ms, res in self.late:
            start = end - ms / 1000.0
            during = [t for t in self.deaths if start <= t <= end]
            since = start if not during else max(during)
            failed = res in ("ENET", "ETIMEDOUT", "RPC_FAIL", "RPC_TIMEOUT")
            allowed = self.opt.timeout_ms + (self.FAIL_SLACK_MS if failed else self.opt.slack_ms)
            took = (end - since) * 1000
            if took > allowed + (100 if res == "still-blocked" else 0):   # the watchdog's tick
                self.finding("%s worker %d.%d: %s took %d ms and returned %s; %d ms after %s "
                             "(allowed: io.timeout_ms %d + %d)" % (
                                 kind, slot, inc, op, ms, res, took,
                                 "the last server death during it (%d)" % len(during)
                                 if during else "it started", self.opt.timeout_ms,
                                 allowed - self.opt.timeout_ms),
                             None)

    def sample_workers(self):
        """Each live worker maps one store's segment and directory: the one
        of the server it is attached to, or its own. A second is a dead
        server's that a reconnect or a takeover did not let go of."""
        for p in list(self.procs.values()):
            m = memfd_maps(p.pid) if p.p.poll() is None else None
            if not m:
                continue
            for what in ("kvengine-segment", "kvengine-dir"):
                n = len([x for x in m if what in x[2]])
                if n > 1 and p.p.poll() is None:
                    self.finding("%s worker %d.%d (pid %d) maps %d %s files: %s"
                                 % (p.kind, p.slot, p.inc, p.pid, n, what, m), p)

    def sample_server(self):
        self.sample_workers()
        pid = self.lock_holder()
        if not pid or not self.proc_of(pid):
            return
        n, m = fd_count(pid), memfd_maps(pid)
        if n is None or m is None:
            return
        f = self.server_fds.setdefault(pid, [n, n, n])
        f[1], f[2] = min(f[1], n), max(f[2], n)
        t = threads(pid)
        if t:
            self.server_threads[pid] = max(self.server_threads.get(pid, t), t)

    # -- the run --

    def run(self):
        try:
            self.chaos()
            self.finish()
        finally:
            self.stop_all()
        # Whatever a sanitizer said, in any process (kvnode's and the
        # observer's logs included).
        for log in sorted(glob.glob(os.path.join(self.work, "log", "*.log"))):
            with open(log, errors="replace") as f:
                for ln in f:
                    if "Sanitizer" in ln or "runtime error:" in ln:
                        self.finding("%s: %s" % (os.path.basename(log), ln.strip()), None)
                        self.sanitizer_logs = getattr(self, "sanitizer_logs", []) + [log]
                        break
        return not self.findings

    def chaos(self):
        opt = self.opt
        if self.mode == "daemon":
            if self.shape == "ssd":
                self.start_daemon("kvmaster")
            self.start_daemon("kvnode")
            t0 = time.monotonic()
            while not glob.glob(os.path.join(self.sdir, "*.sock")):
                if time.monotonic() - t0 > 30 or self.daemons["kvnode"].p.poll() is not None:
                    self.finding("kvnode did not serve within 30 s", self.daemons["kvnode"])
                    return
                time.sleep(0.05)
        for slot in range(opt.workers):
            self.spawn(slot)
        end = time.monotonic() + opt.seconds
        while time.monotonic() < end:
            time.sleep(self.rng.uniform(0.3, 1.5))
            self.reap()
            self.sample_server()
            node = self.daemons.get("kvnode")
            if node and node.killed and self.node_restart_at and \
                    time.monotonic() >= self.node_restart_at:
                self.node_restart_at = None
                self.start_daemon("kvnode")
            if self.rng.random() < 0.25:
                pid = self.lock_holder()
                p = self.proc_of(pid) if pid else None
                if p is None:
                    continue
                node = self.daemons.get("kvnode")
                if p.kind == "kvnode" and self.rng.random() < 0.5:
                    self.restart_node_paused(p)
                elif node and node.p.poll() is not None and self.rng.random() < 0.7:
                    self.restart_node_paused(p)   # the daemon gets the store back
                elif p.kind == "kvnode":
                    self.kill(p, "kvnode")
                    self.node_restart_at = time.monotonic() + self.rng.uniform(0, 0.5)
                else:
                    self.kill(p, "server")
                    node = self.daemons.get("kvnode")
                    if node and node.p.poll() is not None:
                        # The daemon races the workers for the store.
                        self.start_daemon("kvnode")
            else:
                # Slot 0 (a C worker) is spared: it lives through every server
                # death it is not itself (its descriptors are checked at the end).
                p = self.procs[self.rng.randrange(1, opt.workers)]
                self.kill(p, "worker")
        self.reap(respawn=False)

    def restart_node_paused(self, holder):
        """The process serving the store (kvnode, or a worker that took it
        over from kvnode) dies and kvnode comes back before any worker can
        take the store over (the others are stopped meanwhile): their calls
        in flight fail and the next ones reconnect to the new kvnode."""
        workers = [p for p in self.procs.values() if p.p.poll() is None and p is not holder]
        for p in workers:
            os.killpg(p.pid, signal.SIGSTOP)
        self.event("SIGSTOP the %d workers" % len(workers))
        t_kill = time.time()
        self.kill(holder, "kvnode" if holder.kind == "kvnode" else "server")
        self.start_daemon("kvnode")
        new = self.daemons["kvnode"]
        t0 = time.monotonic()
        while time.monotonic() - t0 < 30 and new.p.poll() is None:
            sock = glob.glob(os.path.join(self.sdir, "*.sock"))
            if self.lock_holder() == new.pid and sock and os.stat(sock[0]).st_mtime > t_kill:
                break
            time.sleep(0.02)
        else:
            self.finding("a restarted kvnode did not serve within 30 s", new)
        for p in workers:
            os.killpg(p.pid, signal.SIGCONT)
        self.deaths.append(time.time())   # the workers' clocks restart now
        self.event("SIGCONT the workers")
        self.kills["paused_restarts"] = self.kills.get("paused_restarts", 0) + 1

    def finish(self):
        node = self.daemons.get("kvnode")
        if node and node.killed and node.p.poll() is not None:
            self.start_daemon("kvnode")   # a daemon comes back; it may find a worker serving
            time.sleep(1.0)
        open(os.path.join(self.work, "quiesce"), "w").close()
        # The workers stop; all but the one serving close and exit 0.
        t0 = time.monotonic()
        while time.monotonic() - t0 < 30:
            left = [p for p in self.procs.values() if p.p.poll() is None and not self.serving(p)]
            if not left:
                break
            time.sleep(0.1)
        for slot, p in list(self.procs.items()):
            if p.p.poll() is None and not self.serving(p):
                self.finding("%s worker %d.%d (pid %d) did not close within 30 s of quiesce"
                             % (p.kind, p.slot, p.inc, p.pid), p)
                self.kill(p, "worker")
            elif p.p.poll() is not None and p.p.returncode != 0:
                self.finding("%s worker %d.%d exited with %s at quiesce" % (
                    p.kind, p.slot, p.inc, p.p.returncode), p)
        for p in self.procs.values():
            if p.p.poll() is not None:
                self.collect(p)
        self.observe()
        self.judge_late()
        open(os.path.join(self.work, "finish"), "w").close()
        for p in list(self.procs.values()) + [d for d in self.daemons.values()]:
            if p.p.poll() is None and p.kind in ("kvnode", "kvmaster"):
                os.killpg(p.pid, signal.SIGTERM)
            try:
                rc = p.p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.finding("%s (pid %d) did not exit within 30 s of finish" % (p.kind, p.pid), p)
                self.kill(p, "worker")
                continue
            if not p.killed and rc != 0 and not (p.kind == "kvnode" and rc == 1 and
                                                 self.node_refused(p)):
                self.finding("%s (pid %d) exited with %s at finish" % (p.kind, p.pid, rc), p)
            if p.kind not in ("kvnode", "kvmaster") and p.p.poll() is not None and self.serving(p):
                self.collect(p)

    def serving(self, p):
        try:
            with open(p.log, errors="replace") as f:
                return "R serving pid" in f.read()
        except OSError:
            return False

    def observe(self):
        """A fresh process attaches and looks at what the chaos left."""
        opt = self.opt
        srv = self.lock_holder()
        log = self.log_path("observer")
        argv = [sys.executable, os.path.abspath(__file__), "--worker", "observer",
                "--settings", json.dumps(self.settings), "--shard", str(opt.shard), "--dir", self.work]
        with open(log, "wb") as ferr:
            o = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=ferr,
                                 text=True, preexec_fn=_pdeathsig, env=self.env())
        obs = Proc("observer", -1, 1, o, log)
        self.daemons["observer"] = obs

        def ask(op, **kw):
            kw["op"] = op
            o.stdin.write(json.dumps(kw) + "\n")
            o.stdin.flush()
            line = o.stdout.readline()
            if not line:
                raise RuntimeError("the observer died: %s" % open(log).read()[-2000:])
            return json.loads(line)

        try:
            ready = o.stdout.readline()
            if not ready:
                self.finding("the observer could not open the store", obs)
                return
            srv = self.lock_holder()
            st = ask("stats")
            attached = st["host_attached"] == 1
            # Pins and clients: back to the observer alone within the lease TTL.
            deadline = time.monotonic() + opt.lease_ms / 1000 + 3
            while attached and (st["host_pins"] or st["host_clients"] != 1) and \
                    time.monotonic() < deadline:
                time.sleep(0.1)
                st = ask("stats")
            if attached and (st["host_pins"] or st["host_clients"] != 1):
                self.finding("after the chaos, with only the observer attached: host_pins %d, "
                             "host_clients %d (want 0 and 1) after %.1f s"
                             % (st["host_pins"], st["host_clients"], opt.lease_ms / 1000 + 3))
            # Every acknowledged block: byte for byte on the ssd shape.
            ids = [b.hex() for b in journal_ids(os.path.join(self.work, "journal"))]
            v = ask("verify", ids=ids)
            self.verified = (len(ids), v)
            if v.get("exc"):
                self.finding("observer verify raised: %s" % v["exc"])
            elif v["nwrong"]:
                self.finding("observer: %d shards loaded wrong: %s" % (v["nwrong"], v["wrong"]))
            elif self.shape == "ssd" and (v["miss"] or v["other"]):
                self.finding("observer: of %d acknowledged blocks %d missed and %d failed on the "
                             "ssd shape" % (len(ids), v["miss"], v["other"]))
            # DRAM: with no plain keys left, exactly the stored shards' bytes.
            ask("remove_all")
            deadline = time.monotonic() + 5
            while True:
                st = ask("stats")
                want = st["dram_shards"] * self.per_shard
                if st["dram_used"] == want and st["keys"] == 0 or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            if st["dram_capacity"] and (st["dram_used"] != want or st["keys"]):
                self.finding("after remove_all: dram_used %d bytes for %d shards (want %d), "
                             "keys %d" % (st["dram_used"], st["dram_shards"], want, st["keys"]))
            self.final_stats = st
            # The server's descriptors and memfd mappings, with the observer alone.
            p = self.proc_of(srv) if srv else None
            if p and attached:
                n, m = fd_count(srv), memfd_maps(srv)
                f = self.server_fds.get(srv)
                if f and n is not None and n > f[1] + 4:
                    self.finding("server %s (pid %d) holds %d descriptors with one client, "
                                 "more than the %d it held at its least busy while serving "
                                 "everyone" % (p.kind, srv, n, f[1]))
                # Its own segment and directory, its kv_buffer_alloc buffers
                # (a C worker's 4, made while it was attached), and the
                # observer's pin board and staging: nothing of a client gone.
                own = 2 + (4 if p.kind == "c" else 0)
                if m is not None and len(m) > own + 2:
                    self.finding("server %s (pid %d) maps %d memfds with one client (want at "
                                 "most %d): %s" % (p.kind, srv, len(m), own + 2, m))
                self.server_map_names = m
                t, t0 = threads(srv), self.server_threads.get(srv)
                # Threads: for the report only. A connection is a thread, and
                # host_clients (checked above) counts the live ones; the rest
                # are the tiers' (RocksDB starts its own as it goes).
                self.server_end_threads = (t, t0)
                self.server_end = (p.kind, srv, n, f, len(m) if m is not None else None)
        finally:
            try:
                o.stdin.close()
                rc = o.wait(timeout=30)
                if rc != 0:
                    self.finding("the observer exited with %s" % rc, obs)
            except subprocess.TimeoutExpired:
                self.finding("the observer did not close within 30 s", obs)
                self.kill(obs, "worker")
            o.stdout.close()

    def stop_all(self):
        for p in list(self.procs.values()) + list(self.daemons.values()):
            if p.p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.killed = True
            p.p.wait()

    def report(self):
        ops = {}
        for _, s in self.summaries:
            for part in s.split()[1:]:
                k, _, v = part.partition("=")
                if "/" in v:
                    n, ms = v.split("/")
                    o = ops.setdefault(k, [0, 0])
                    o[0] += int(n)
                    o[1] = max(o[1], int(ms[:-2]))
        total = sum(v[0] for k, v in ops.items() if k != "open")
        ver = getattr(self, "verified", None)
        line = ("chaos %s/%s seed %d: %s; kills: %d workers, %d serving workers, %d kvnodes; "
                "%d paused kvnode restarts; %d calls (summaries of %d workers); verified %s" % (
                    self.shape, self.mode, self.seed, "PASS" if not self.findings else
                    "FAIL (%d findings)" % len(self.findings), self.kills["worker"],
                    self.kills["server"], self.kills["kvnode"],
                    self.kills.get("paused_restarts", 0), total, len(self.summaries),
                    "%d blocks: %s" % (ver[0], {k: ver[1].get(k) for k in ("ok", "miss",
                                                                             "other")})
                    if ver else "nothing"))
        print(line, flush=True)
        if self.opt.verbose:
            print("  slowest: " + ", ".join("%s %d ms" % (k, v[1]) for k, v in sorted(ops.items())))
            late = {}
            for kind, slot, inc, end, op, ms, res in self.late:
                x = late.setdefault((op, res), [0, 0])
                x[0] += 1
                x[1] = max(x[1], ms)
            if late:
                print("  calls past io.timeout_ms: " + ", ".join(
                    "%s->%s %dx max %d ms" % (k[0], k[1], v[0], v[1]) for k, v in sorted(late.items())))
            se = getattr(self, "server_end", None)
            if se:
                print("  server at the end: %s pid %d, fds %s (first/min/max while serving %s), "
                      "memfd mappings %s" % (se[0], se[1], se[2], se[3], se[4]))
            if self.survivor_fds:
                print("  attached to the end (slot, incarnation, fds connected -> at the end): "
                      + ", ".join("%d.%d %d->%d" % x for x in self.survivor_fds))
            if getattr(self, "server_end_threads", None):
                print("  server threads at the end %s, most while serving %s"
                      % self.server_end_threads)
            if getattr(self, "server_map_names", None):
                print("  its memfd mappings: " + ", ".join(x[2].split("/")[-1] for x in
                                                           self.server_map_names))
            for n in sorted(set(self.notes)):
                print("  note: %s (%d times)" % (n, self.notes.count(n)))
        if self.findings:
            shown = set()
            for what, log in self.findings[:40]:
                print("  FINDING: " + what)
            for what, log in self.findings + [(None, x) for x in
                                              getattr(self, "sanitizer_logs", [])]:
                if log and log not in shown and len(shown) < 6:
                    shown.add(log)
                    print("  ---- %s (last 40 lines)" % log)
                    try:
                        with open(log, errors="replace") as f:
                            for ln in f.read().splitlines()[-40:]:
                                print("  | " + ln)
                    except OSError:
                        pass
            print("  work directory kept: %s" % self.work)
        elif not self.opt.keep:
            shutil.rmtree(self.work, ignore_errors=True)


def calibrate():
    """The DRAM one stored shard of --shard bytes takes (dram_used per shard)
    in an engine of this process, not shared."""
    import kvengine
    e = kvengine.Engine(None, {"pipeline": "dram", "dram.capacity": "16MiB",
                               "dram.hugepages": "off", "log.level": "warn"})
    try:
        b = bytes(OPT.shard)
        e.dump([(make_id(0xfffe, 0, i), 0, [b]) for i in range(4)], wait=True)
        st = e.stats()
        return st["dram_used"] // st["dram_shards"]
    finally:
        e.close()


OPT = None


def main():
    global OPT
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--dir", help=argparse.SUPPRESS)
    ap.add_argument("--slot", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--inc", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--settings", help=argparse.SUPPRESS)
    ap.add_argument("--mooncake-addr", help=argparse.SUPPRESS)
    ap.add_argument("--shape", default="all", choices=("dram", "ssd", "all"))
    ap.add_argument("--mode", default="all", choices=("embedded", "daemon", "all"))
    ap.add_argument("--seconds", type=float, default=90, help="chaos per run (default 90)")
    ap.add_argument("--workers", type=int, default=6, help="worker processes (default 6)")
    ap.add_argument("--runs", type=int, default=1, help="runs of each shape and mode (default 1)")
    ap.add_argument("--seed", type=int, default=None, help="default: random (printed)")
    ap.add_argument("--shard", type=int, default=16384, help="bytes per block shard")
    ap.add_argument("--timeout-ms", type=int, default=1500, help="io.timeout_ms (default 1500)")
    ap.add_argument("--slack-ms", type=int, default=3000,
                    help="what a call may take beyond io.timeout_ms (default 3000)")
    ap.add_argument("--lease-ms", type=int, default=2000, help="eviction.lease_ttl_ms")
    ap.add_argument("--keep", action="store_true", help="keep the work directory of a pass")
    ap.add_argument("-v", "--verbose", action="store_true")
    OPT = opt = ap.parse_args()
    if opt.worker:
        sys.path.insert(0, os.path.join(ROOT, "python"))
        if opt.worker == "observer":
            return run_observer(opt)
        if opt.worker == "mooncake":
            return run_mooncake(opt)
        return run_ucm(opt, -1 if opt.worker == "sched" else opt.slot % 2)
    build = os.path.abspath(os.environ.get("KV_BUILD") or os.path.join(ROOT, "build"))
    for tool in ("kvnode", "kvmaster", "tests/chaos_worker"):
        if not os.access(os.path.join(build, tool), os.X_OK):
            sys.exit("host_chaos: %s/%s not found (make chaos-build, or set KV_BUILD)"
                     % (build, tool))
    os.environ.setdefault("KVENGINE_LIBRARY", os.path.join(build, "libkvengine.so.0"))
    sys.path.insert(0, os.path.join(ROOT, "python"))
    per_shard = calibrate()
    seed = opt.seed if opt.seed is not None else random.SystemRandom().getrandbits(31)
    shapes = ("dram", "ssd") if opt.shape == "all" else (opt.shape,)
    modes = ("embedded", "daemon") if opt.mode == "all" else (opt.mode,)
    ok = True
    for r in range(opt.runs):
        for shape in shapes:
            for mode in modes:
                run = Run(opt, shape, mode, seed + r, build)
                run.per_shard = per_shard
                ok = run.run() and ok
                run.report()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
