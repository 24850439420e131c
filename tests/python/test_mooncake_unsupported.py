"""test_mooncake_unsupported.py — every Mooncake call that cannot mean anything
on kvengine (its transfer engine, CXL and mounted segments, NVMe-oF targets,
GPU expert-parallel buffers, collectives, its REST store service) ends in a
NotImplementedError that names the call and why, with the arguments
Mooncake's callers pass, never an AttributeError, TypeError or
ModuleNotFoundError. The README's Mooncake section lists the same calls."""

import importlib
import sys

import pytest

from conftest import mooncake_embedded_store


@pytest.fixture(scope="module")
def store():
    s = mooncake_embedded_store("16MB", "4MB")
    yield s
    s.close()


@pytest.mark.parametrize("name,args", [
    ("mount_segment", ("/dev/shm/x", 1 << 20, 0, "tcp", "")),
    ("unmount_segment", (["00000000-0000-0000-0000-000000000001"],)),
    ("allocate_and_mount_segment", (1 << 20, "tcp", "")),
    ("unmount_and_free_segment", (["s"], 5)),
    ("unmount_local_disk_segment", (5,)),
    ("init_all", ("tcp", "", 1 << 20)),
    ("create_copy_task", ("k", ["seg"])),
    ("create_move_task", ("k", "a", "b")),
    ("query_task", (1,)),
    ("remove_by_regex", ("k.*",)),
    ("get_tensor_into_cuda", ("k", None)),
    ("batch_get_tensor_into_cuda", (["k"], [None])),
])
def test_store_calls_say_why(store, name, args):
    with pytest.raises(NotImplementedError, match=name.replace("batch_", "")):
        getattr(store, name)(*args)


@pytest.mark.parametrize("module,why", [
    ("mooncake.pg", "transfer engine"),
    ("mooncake.mooncake_store_service", "mounts segments"),
])
def test_modules_that_cannot_work_say_why_on_import(module, why):
    sys.modules.pop(module, None)
    with pytest.raises(NotImplementedError, match=why):
        importlib.import_module(module)


def test_classes_that_cannot_work_say_why_when_built():
    from mooncake import http_metadata_server, mooncake_ep_buffer, spdk_tgt_create
    from mooncake.engine import TransferEngine
    for make, what in ((lambda: http_metadata_server.KVBootstrapServer(8080), "KVBootstrapServer"),
                       (lambda: mooncake_ep_buffer.Buffer(None, 0), "Buffer"),
                       (lambda: spdk_tgt_create.SPDKTgtCreator(), "SPDKTgtCreator"),
                       (lambda: TransferEngine().initialize("h", "P2PHANDSHAKE", "tcp", ""),
                        "initialize")):
        with pytest.raises(NotImplementedError, match=what):
            make()
