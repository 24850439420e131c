"""mooncake_structured.py — the structure and codec inference of Mooncake's
structured object store (mooncake.structured_object_store), for the drop-in.

Mooncake's wheel stores a batch of rows (dicts, lists, tensors, strings...)
column by column: it walks the rows once to find their structure (a dict
node per nested mapping, a list node per nested list of containers, a leaf
per column of values) and picks for each leaf the codec that will pack its
column. Mooncake's own tests import that inference (MISSING,
_choose_leaf_codec, _escape_key, infer_structure) next to the store; this
module provides it as they use it and as the wheel's documentation
describes it. The storing half of that module (packing columns into store
objects, handles, DataProto references) is kvengine/mooncake_bundle.py.

The rules, as written here:
- A leaf's column holds one value per row: the row's value, None for a
  row that is null (or whose parent is null), MISSING for a row whose
  dict lacks the key, so "key absent" and "key present, value None" stay
  apart. Nulls and MISSING never decide a codec.
- Codecs: every value a torch tensor -> "ragged_tensor" (accepted only
  when all share one dtype; shapes and ranks may differ); bytes-like ->
  "bytes_ragged"; str -> "utf8_ragged"; bool/int/float scalars ->
  "ndarray"; lists or tuples of numbers -> "typed_ragged"; anything else
  -> "msgpack_ragged", accepted only when every value is made of dicts
  with str keys, lists, str, bytes, numbers, bools and None (all values
  are checked, not a sample). No value at all: not accepted.
- Paths: the root's name, then ".key" per dict level (key escaped by
  _escape_key) and "[0]" for the element column of a list node (every
  row's items flattened, in order; the list node keeps the per-row
  lengths). Nesting deeper than MAX_DEPTH levels raises ValueError.

Key design choice: inference never converts or copies a value; leaves hold
the caller's objects, so a later packing step decides once what to copy.
"""

import numbers

MAX_DEPTH = 32


class _Missing:
    """The value of a column for a row whose dict lacks that key."""

    _one = None

    def __new__(cls):
        if cls._one is None:
            cls._one = super().__new__(cls)
        return cls._one

    def __repr__(self):
        return "MISSING"

    def __bool__(self):
        return False

    def __reduce__(self):
        return (_Missing, ())


MISSING = _Missing()


class CodecDecision:
    """What _choose_leaf_codec decided: codec (its name), accepted (False
    when the values cannot all be packed by it) and reason (why not)."""

    __slots__ = ("codec", "accepted", "reason")

    def __init__(self, codec, accepted, reason=""):
        self.codec = codec
        self.accepted = accepted
        self.reason = reason

    def __repr__(self):
        return "CodecDecision(codec=%r, accepted=%r%s)" % (
            self.codec, self.accepted, ", reason=%r" % self.reason if self.reason else "")


class LeafSpec:
    """One column: its path, one value per row, and its codec decision."""

    __slots__ = ("path", "values", "decision")

    def __init__(self, path, values, decision):
        self.path = path
        self.values = values
        self.decision = decision

    def __repr__(self):
        return "LeafSpec(%r, %d rows, %s)" % (self.path, len(self.values), self.decision.codec)


class NodeSpec:
    """A container level: node_type "dict" (children: its keys, sorted,
    as Mooncake's inference orders them) or "list" (lengths: items per row, 0 for a null row);
    row_mask says which rows hold a container (None when all do)."""

    __slots__ = ("path", "node_type", "children", "lengths", "row_mask")

    def __init__(self, path, node_type, children=None, lengths=None, row_mask=None):
        self.path = path
        self.node_type = node_type
        self.children = children if children is not None else []
        self.lengths = lengths
        self.row_mask = row_mask

    def __repr__(self):
        return "NodeSpec(%r, %s)" % (self.path, self.node_type)


def _escape_key(key):
    """A dict key as a path component: backslash, '.' and '[' escaped with
    a backslash, so "a.b" (one key) and "a" then "b" (two levels) differ."""
    return str(key).replace("\\", "\\\\").replace(".", "\\.").replace("[", "\\[")


def _is_null(v):
    return v is None or v is MISSING


def _is_tensor(v):
    t = type(v)
    return t.__module__.startswith("torch") and t.__name__ in ("Tensor", "Parameter")


def _is_scalar(v):
    return isinstance(v, (bool, numbers.Number)) and not isinstance(v, complex)


def _is_bytes(v):
    return isinstance(v, (bytes, bytearray, memoryview))


def _plain(v, depth=0):
    """True when v is made only of what the msgpack codec packs."""
    if depth > MAX_DEPTH:
        return False
    if v is None or isinstance(v, (str, bool, int, float)) or _is_bytes(v):
        return True
    if isinstance(v, dict):
        return all(isinstance(k, str) and _plain(x, depth + 1) for k, x in v.items())
    if isinstance(v, (list, tuple)):
        return all(_plain(x, depth + 1) for x in v)
    return False


def _choose_leaf_codec(values):
    """The CodecDecision for a column of values (see the module's top)."""
    vals = [v for v in values if not _is_null(v)]
    if not vals:
        return CodecDecision("msgpack_ragged", False, "no non-null value")
    if all(_is_tensor(v) for v in vals):
        dtypes = {v.dtype for v in vals}
        if len(dtypes) > 1:
            return CodecDecision("ragged_tensor", False,
                                 "mixed dtypes: %s" % ", ".join(sorted(map(str, dtypes))))
        return CodecDecision("ragged_tensor", True)
    if all(_is_bytes(v) for v in vals):
        return CodecDecision("bytes_ragged", True)
    if all(isinstance(v, str) for v in vals):
        return CodecDecision("utf8_ragged", True)
    if all(_is_scalar(v) for v in vals):
        return CodecDecision("ndarray", True)
    if all(isinstance(v, (list, tuple)) and all(_is_scalar(x) for x in v) for v in vals):
        return CodecDecision("typed_ragged", True)
    for i, v in enumerate(vals):
        if not _plain(v):
            return CodecDecision("msgpack_ragged", False,
                                 "value %d (%s) is not serializable" % (i, type(v).__name__))
    return CodecDecision("msgpack_ragged", True)


def _is_container_list(v):
    """A list (or tuple) holding at least one dict or list: a list node."""
    return isinstance(v, (list, tuple)) and any(isinstance(x, (dict, list, tuple)) for x in v)


def infer_structure(path, values, leaves, nodes, depth=0):
    """Walks a column of values (one per row) and appends to nodes the
    NodeSpecs and to leaves the LeafSpecs found under path, parents before
    children. ValueError past MAX_DEPTH levels of nesting."""
    if depth > MAX_DEPTH:
        raise ValueError("%s: nested deeper than %d levels" % (path, MAX_DEPTH))
    vals = list(values)
    present = [v for v in vals if not _is_null(v)]
    if present and all(isinstance(v, dict) for v in present):
        keys = []
        seen = set()
        for v in present:
            for k in v:
                if k not in seen:
                    seen.add(k)
                    keys.append(k)
        if all(isinstance(k, str) for k in keys):
            keys.sort()     # Mooncake's order; keys of other types keep first-seen order
        mask = [isinstance(v, dict) for v in vals]
        node = NodeSpec(path, "dict", children=list(keys),
                        row_mask=None if all(mask) else mask)
        nodes.append(node)
        for k in keys:
            col = [(v[k] if k in v else MISSING) if isinstance(v, dict) else v for v in vals]
            infer_structure("%s.%s" % (path, _escape_key(k)), col, leaves, nodes, depth + 1)
        return
    if present and all(isinstance(v, (list, tuple)) for v in present) and \
            any(_is_container_list(v) for v in present):
        mask = [isinstance(v, (list, tuple)) for v in vals]
        lengths = [len(v) if m else 0 for v, m in zip(vals, mask)]
        nodes.append(NodeSpec(path, "list", lengths=lengths,
                              row_mask=None if all(mask) else mask))
        items = [x for v, m in zip(vals, mask) if m for x in v]
        infer_structure("%s[0]" % path, items, leaves, nodes, depth + 1)
        return
    leaves.append(LeafSpec(path, vals, _choose_leaf_codec(vals)))
