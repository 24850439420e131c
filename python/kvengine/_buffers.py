"""_buffers.py — turning Python buffers into (address, length) pairs.

Key design choice: a dump or load task reads or writes the caller's memory
after the call returns, so every buffer is pinned for the task's life, not
just its address taken: writable objects through a ctypes view made with
from_buffer (a buffer export, so a bytearray cannot be resized under the
task), read-only ones through PyObject_GetBuffer (released when the task
lets go of it), torch tensors by holding the tensor. The pins travel with
the Task and are dropped only once the task is done.

Addresses are found without building a ctypes object where CPython allows
it (a bytes object's bytes sit at a fixed offset from the object, checked
once at import), because per-shard cost is what the 4 KiB case measures.
"""

import ctypes
import platform
import sys

# Py_buffer of the CPython C API (Include/pybuffer.h): only buf and len are
# read here; the rest gives the struct its size.
class _PyBuffer(ctypes.Structure):
    _fields_ = [("buf", ctypes.c_void_p), ("obj", ctypes.c_void_p),
                ("len", ctypes.c_ssize_t), ("itemsize", ctypes.c_ssize_t),
                ("readonly", ctypes.c_int), ("ndim", ctypes.c_int),
                ("format", ctypes.c_char_p), ("shape", ctypes.c_void_p),
                ("strides", ctypes.c_void_p), ("suboffsets", ctypes.c_void_p),
                ("internal", ctypes.c_void_p)]


_PyBUF_SIMPLE = 0
_PyBUF_WRITABLE = 1
_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
_get_buffer.restype = ctypes.c_int
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.argtypes = [ctypes.POINTER(_PyBuffer)]
_release_buffer.restype = None


class Export:
    """A buffer export held until this object is dropped (PyBuffer_Release)."""

    __slots__ = ("view",)

    def __init__(self, obj, writable):
        view = _PyBuffer()
        # PyObject_GetBuffer raises BufferError/TypeError itself for an
        # object without the protocol, a non-contiguous one, or a read-only
        # one asked for writing; ctypes.pythonapi keeps the exception.
        _get_buffer(obj, ctypes.byref(view), _PyBUF_WRITABLE if writable else _PyBUF_SIMPLE)
        self.view = view

    def __del__(self):
        if self.view is not None:
            _release_buffer(ctypes.byref(self.view))
            self.view = None


def _bytes_offset():
    """Offset of a bytes object's data from id(obj), or None when unknown."""
    if platform.python_implementation() != "CPython":
        return None
    probe = b"kvengine-probe"
    ex = Export(probe, False)
    off = ex.view.buf - id(probe)
    del ex
    other = b"another probe of another length"
    ex = Export(other, False)
    ok = ex.view.buf - id(other) == off
    del ex
    return off if ok else None


BYTES_OFFSET = _bytes_offset()

_torch_tensor = None


def _is_torch(obj):
    global _torch_tensor
    if _torch_tensor is None:
        mod = sys.modules.get("torch")
        if mod is None:
            return False
        _torch_tensor = mod.Tensor
    return isinstance(obj, _torch_tensor)


def tensor_span(t, writable):
    """(address, nbytes) of a CPU tensor; ValueError for others. (is_cpu is
    read rather than device.type: a fifth of the cost, per tensor.)"""
    cpu = getattr(t, "is_cpu", None)
    if cpu is None:   # a torch without Tensor.is_cpu
        cpu = t.device.type == "cpu"
    if not cpu:
        raise ValueError("a %s tensor cannot be copied by the engine directly; "
                         "kvengine.ucm.KvEngineStore stages device tensors" % t.device.type)
    if not t.is_contiguous():
        raise ValueError("tensor is not contiguous")
    return t.data_ptr(), t.numel() * t.element_size()


_C = ctypes.c_char
_addressof = ctypes.addressof
U64_MAX = (1 << 64) - 1


def check_u64(what, v):
    """v itself when it is an int that a C size_t / uint64_t holds; ctypes
    would keep only the low 64 bits of a larger one, so that is refused."""
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError("%s is an int, got %s" % (what, type(v).__name__))
    if not 0 <= v <= U64_MAX:
        raise ValueError("%s %d does not fit in 64 bits (0..2^64-1)" % (what, v))
    return v


def span(buf, writable):
    """(address, length, pin) of one buffer: bytes-like, numpy array, CPU
    torch tensor, or an (address, size) pair. pin must be kept alive while
    the engine may touch the memory. TypeError/ValueError say what is wrong."""
    t = type(buf)
    if t is bytes:
        if writable:
            raise TypeError("a load destination must be writable, got bytes")
        if BYTES_OFFSET is not None:
            return id(buf) + BYTES_OFFSET, len(buf), buf
        ex = Export(buf, False)
        return ex.view.buf or 0, ex.view.len, ex
    if t is bytearray:
        n = len(buf)
        if n == 0:
            return 0, 0, None
        # A ctypes view on the first byte holds a buffer export of the
        # whole bytearray: cheaper than PyObject_GetBuffer through ctypes.
        c = _C.from_buffer(buf)
        return _addressof(c), n, c
    if t is tuple or t is list:
        if len(buf) != 2:
            raise TypeError("an address buffer is an (address, size) pair, got %d items" % len(buf))
        addr, size = buf
        if type(addr) is not int or type(size) is not int:
            raise TypeError("an (address, size) pair takes two ints")
        if size < 0:
            raise ValueError("size %d is negative" % size)
        check_u64("size", size)
        if addr > 0:
            check_u64("address", addr)
        if addr <= 0 and size > 0:
            raise ValueError("address %r is not a valid pointer" % (addr,))
        return addr, size, None
    if _is_torch(buf):
        addr, size = tensor_span(buf, writable)
        return addr, size, buf
    if t is memoryview:
        mv = buf
    else:
        try:
            mv = memoryview(buf)
        except TypeError:
            raise TypeError("%s is not a buffer (bytes-like, numpy array, CPU tensor or an "
                            "(address, size) pair)" % t.__name__) from None
    if not mv.c_contiguous:
        raise ValueError("%s is not C-contiguous" % t.__name__)
    n = mv.nbytes
    if n == 0:
        return 0, 0, None
    if not mv.readonly:
        c = _C.from_buffer(mv)
        return _addressof(c), n, c
    if writable:
        raise TypeError("a load destination must be writable, got a read-only %s" % t.__name__)
    ex = Export(mv, False)
    return ex.view.buf, n, ex
