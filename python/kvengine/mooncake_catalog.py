"""mooncake_catalog.py — Mooncake's DataProtoCatalog (mooncake.dataproto_catalog)
for the drop-in: which rows of which stored DataProto hold each logical
row's fields.

A rollout writes its batches as DataProto stages (mooncake_bundle) and
names each row by a logical key in a partition ("train", ["a", "b"]).
Later writers add fields for the same keys in other stages, in any row
order. The catalog maps (partition, key) to, per field, the fragment (one
single-stage DataProto handle, written by one update) and the row in it
that holds that field, plus free-form tags per key. It never touches the
store: data stays with MooncakeBundleTransfer, object lifetime with the
store; a reader resolves keys and fields into (manifest key, row) lists
and the handles to read them with.

Key design choice: an update or a resolve validates everything first and
changes nothing when any check fails, so a bad call leaves the catalog as
it was (no partition half created, no key half moved). Fragments are
reference-counted by the fields that point at them and dropped with the
last one, so a long run of replacements does not keep stale handles.
Calls on one catalog must be serialized by its owner, as Mooncake asks.
"""

import copy
from collections.abc import Mapping, Sequence

from kvengine import mooncake_bundle as _bundle


def _text(value, what):
    if not isinstance(value, str) or not value:
        raise ValueError("%s must be a non-empty string" % what)
    return value


def _names(values, what):
    """A tuple of non-empty strings from a sequence that is not a string."""
    if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, Mapping)):
        raise ValueError("%s must be a sequence of strings" % what)
    out = tuple(values)
    for v in out:
        _text(v, "each of %s" % what)
    if len(set(out)) != len(out):
        raise ValueError("%s must not repeat a name" % what)
    return out


class DataProtoCatalog:
    """Maps logical rows (partition, key) and their fields to rows of
    immutable single-stage DataProto handles. See the module's top."""

    def __init__(self):
        self._partitions = {}     # partition -> key -> {"tags": {}, "fields": {f: (frag, row)}}
        self._fragments = {}      # fragment id -> {"handle", "manifest_key"}
        self._refs = {}           # fragment id -> how many (key, field) point at it
        self._next = 0

    def update(self, partition, keys, *, tags=None, handle=None):
        """Records keys in partition: tags[i] (a mapping) merged into key
        i's tags; with a handle (a single-stage DataProto ref handle whose
        batch_size is len(keys)), row i of it becomes where key i's fields
        named in the handle are read from, replacing earlier locations of
        those fields. Returns {"partition", "keys", "fields"}: the fields the
        keys now have, in first-seen order."""
        partition = _text(partition, "partition")
        keys = _names(keys, "keys")
        if tags is not None:
            if isinstance(tags, (str, bytes, Mapping)) or not isinstance(tags, Sequence):
                raise ValueError("tags must be a sequence of mappings, one per key")
            tags = list(tags)
            if len(tags) != len(keys):
                raise ValueError("tags and keys must have the same length (%d tags, %d keys)"
                                 % (len(tags), len(keys)))
            for t in tags:
                if not isinstance(t, Mapping):
                    raise ValueError("each tag must be a mapping")
        fields = ()
        if handle is not None:
            if not isinstance(handle, Mapping):
                raise ValueError("handle must be a DataProto ref handle mapping")
            ref = _bundle.import_dataproto_ref(handle)       # ValueError when it does not check out
            if len(ref.stage_refs) != 1:
                raise ValueError("a catalog fragment must have exactly one DataProto stage, got %d"
                                 % len(ref.stage_refs))
            if ref.batch_size != len(keys):
                raise ValueError("handle batch_size %d does not match %d keys"
                                 % (ref.batch_size, len(keys)))
            fields = tuple(ref.field_index)
            (stage_ref,) = ref.stage_refs.values()
        # every check passed: change the catalog
        rows = self._partitions.setdefault(partition, {})
        frag = None
        if handle is not None:
            frag = "fragment-%d" % self._next
            self._next += 1
            self._fragments[frag] = {"handle": copy.deepcopy(dict(handle)),
                                     "manifest_key": stage_ref.manifest_key}
            self._refs[frag] = 0
        for i, k in enumerate(keys):
            entry = rows.setdefault(k, {"tags": {}, "fields": {}})
            if tags is not None:
                entry["tags"].update(copy.deepcopy(dict(tags[i])))
            for f in fields:
                old = entry["fields"].get(f)
                entry["fields"][f] = (frag, i)
                self._refs[frag] += 1
                if old is not None:
                    self._unref(old[0])
        if frag is not None and self._refs[frag] == 0:
            self._unref(frag, 0)
        return {"partition": partition, "keys": list(keys), "fields": self._union(rows, keys)}

    def resolve(self, partition, keys, fields=None):
        """Where to read fields (all the keys' fields when None) of keys, in
        key order: {"fields", "field_groups": [{"fields", "locations":
        [(manifest key, row) per key]}] (fields read from the same rows
        together), "handles": {manifest key: handle}}. ValueError for keys
        not in the catalog, a field some key does not have yet, or keys
        with no field at all."""
        partition = _text(partition, "partition")
        keys = _names(keys, "keys")
        if fields is not None:
            fields = _names(fields, "fields")
        rows = self._partitions.get(partition, {})
        missing = [k for k in keys if k not in rows]
        if missing:
            raise ValueError("keys %s were not found in partition %r" % (missing, partition))
        if fields is None:
            fields = tuple(self._union(rows, keys))
            if not fields:
                raise ValueError("keys %s do not contain any fields" % (list(keys),))
        lacking = {f: [k for k in keys if f not in rows[k]["fields"]] for f in fields}
        lacking = {f: ks for f, ks in lacking.items() if ks}
        if lacking:
            raise ValueError("fields are not ready for every key: %s" % lacking)
        groups, by_rows, handles = [], {}, {}
        for f in fields:
            locs = tuple(rows[k]["fields"][f] for k in keys)
            g = by_rows.get(locs)
            if g is None:
                g = by_rows[locs] = {"fields": [], "locations": [
                    (self._fragments[frag]["manifest_key"], row) for frag, row in locs]}
                groups.append(g)
                for frag, _ in locs:
                    fr = self._fragments[frag]
                    handles[fr["manifest_key"]] = copy.deepcopy(fr["handle"])
            g["fields"].append(f)
        return {"partition": partition, "keys": list(keys), "fields": list(fields),
                "field_groups": groups, "handles": handles}

    def list(self, partition=None):
        """{partition: {key: tags}}, for one partition or all of them."""
        if partition is not None:
            partition = _text(partition, "partition")
            names = [partition] if self._partitions.get(partition) else []
        else:
            names = [p for p, rows in self._partitions.items() if rows]
        return {p: {k: copy.deepcopy(e["tags"]) for k, e in self._partitions[p].items()}
                for p in names}

    def remove(self, partition, keys):
        """Forgets keys (unknown ones are ignored); the catalog only, the
        stored objects stay with their writers and the store."""
        partition = _text(partition, "partition")
        keys = _names(keys, "keys")
        rows = self._partitions.get(partition)
        if rows is None:
            return
        for k in keys:
            entry = rows.pop(k, None)
            if entry is not None:
                for frag, _ in entry["fields"].values():
                    self._unref(frag)
        if not rows:
            del self._partitions[partition]

    def _unref(self, frag, n=1):
        self._refs[frag] -= n
        if self._refs[frag] <= 0:
            del self._refs[frag]
            del self._fragments[frag]

    @staticmethod
    def _union(rows, keys):
        seen = {}
        for k in keys:
            for f in rows[k]["fields"]:
                seen.setdefault(f, None)
        return list(seen)
