"""fiberrl.shared_memory and fiberrl.heap between fiberrl jobs on one host."""
import os
import pickle

import pytest

import fiberrl
from fiberrl.errors import SharedMemoryHostError
from fiberrl.heap import BufferWrapper
from fiberrl.shared_memory import ShareableList, SharedMemory, SharedMemoryManager

pytestmark = pytest.mark.timeout(180)


def _write(block, items, wrapper):
    block.buf[0] = 42
    items[1] = "changed"
    wrapper.create_memoryview()[:2] = b"ok"
    block.close()
    items.shm.close()


def test_blocks_lists_and_heap_are_shared_with_a_job():
    block = SharedMemory(create=True, size=16)
    items = ShareableList([1, "abc", 3.0])
    wrapper = BufferWrapper(8)
    try:
        proc = fiberrl.Process(target=_write, args=(block, items, wrapper))
        proc.start()
        proc.join(60)
        assert proc.exitcode == 0
        assert block.buf[0] == 42 and items[1] == "changed"
        assert bytes(wrapper.create_memoryview()[:2]) == b"ok"
        # the job only attached: its exit must not have unlinked the creator's blocks
        assert os.path.exists("/dev/shm/" + block.name)
        assert os.path.exists("/dev/shm/" + items.shm.name)
    finally:
        for shm in (block, items.shm):
            shm.close()
            shm.unlink()


def test_attaching_on_another_host_names_both_hosts():
    block = SharedMemory(create=True, size=8)
    try:
        function, (name, host) = block.__reduce__()
        with pytest.raises(SharedMemoryHostError) as info:
            pickle.loads(pickle.dumps(function))(name, "elsewhere")
        assert "'elsewhere'" in str(info.value) and repr(host) in str(info.value)
    finally:
        block.close()
        block.unlink()


def test_manager_unlinks_its_blocks_at_shutdown():
    with SharedMemoryManager() as manager:
        assert type(manager._process).__module__ == "fiberrl.process"  # its server is a job
        block = manager.SharedMemory(32)
        items = manager.ShareableList(["a", 2])
        names = [block.name, items.shm.name]
        assert all(os.path.exists("/dev/shm/" + name) for name in names)
        block.close()
        items.shm.close()
    assert not any(os.path.exists("/dev/shm/" + name) for name in names)


def test_a_manager_not_started_refuses_with_valueerror():
    """As the stdlib's (CPython's SharedMemoryManager test); it was an AttributeError."""
    manager = SharedMemoryManager()
    with pytest.raises(ValueError, match="start"):
        manager.SharedMemory(size=9)
    with pytest.raises(ValueError, match="start"):
        manager.ShareableList([1, 2])


def test_block_names_come_from_the_modules_make_filename(monkeypatch):
    """Code written for the stdlib replaces ``_make_filename`` to choose names; a name
    that exists already is skipped, as the stdlib does."""
    import fiberrl.shared_memory as sm
    taken = SharedMemory(create=True, size=8)
    names = iter([taken._name, f"/psm_fiberrl_test_{os.getpid()}"])
    monkeypatch.setattr(sm, "_make_filename", lambda: next(names))
    fresh = SharedMemory(create=True, size=8)
    try:
        assert fresh._name == f"/psm_fiberrl_test_{os.getpid()}"
    finally:
        for block in (taken, fresh):
            block.close()
            block.unlink()
