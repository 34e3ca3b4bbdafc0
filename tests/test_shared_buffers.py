"""Value/Array in shared memory on one host (a real buffer), the server-backed form
elsewhere, and gymnasium's AsyncVectorEnv on a fiberrl context against SyncVectorEnv."""
import ctypes
import gc
import os
import pickle

import numpy as np
import pytest

import fiberrl
import fiberrl.sharedctypes
from fiberrl import shm_ctypes
from fiberrl.errors import SharedMemoryHostError

pytestmark = pytest.mark.timeout(300)


def _write_through_numpy(array, counter, index):
    view = np.frombuffer(array.get_obj())
    view[index] = index + 0.5
    for _ in range(50):
        with counter.get_lock():
            counter.value += 1


def test_array_get_obj_is_a_buffer_shared_by_processes():
    ctx = fiberrl.get_context()
    array, counter = ctx.Array("d", 4), ctx.Value("i", 0)
    view = np.frombuffer(array.get_obj())
    assert view.shape == (4,) and not view.any()
    procs = [ctx.Process(target=_write_through_numpy, args=(array, counter, i)) for i in range(2)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
    assert [proc.exitcode for proc in procs] == [0, 0]
    assert list(view) == [0.5, 1.5, 0.0, 0.0]  # this process's view of the same memory
    assert counter.value == 100
    view[3] = 9.0
    assert array[3] == 9.0


def test_raw_forms_and_char_arrays():
    raw = fiberrl.RawArray(ctypes.c_int, [1, 2, 3])
    assert np.frombuffer(raw, dtype=np.intc).tolist() == [1, 2, 3]
    text = fiberrl.Array("c", b"hi\0\0")
    assert text.value == b"hi" and text.raw == b"hi\0\0"
    assert fiberrl.RawValue("h", 7).value == 7
    assert fiberrl.sharedctypes.copy(raw)[:] == [1, 2, 3]
    assert fiberrl.sharedctypes.synchronized(raw).get_obj() is raw


def test_segment_is_unlinked_when_the_creators_object_goes():
    array = fiberrl.RawArray("d", 8)
    path = "/dev/shm" + array._fiberrl_segment.name
    assert os.path.exists(path)
    del array
    gc.collect()
    assert not os.path.exists(path)


def test_attaching_on_another_host_names_both_hosts():
    array = fiberrl.RawArray("d", 2)
    rebuild, (ctype, length, name, host) = array.__reduce__()
    forged = pickle.dumps((rebuild, (ctype, length, name, "elsewhere")))
    function, args = pickle.loads(forged)
    with pytest.raises(SharedMemoryHostError) as info:
        function(*args)
    assert "'elsewhere'" in str(info.value) and repr(host) in str(info.value)


def test_other_hosts_get_the_server_backed_form(monkeypatch):
    """Where jobs may run on other machines (one_host() is False), the value lives in
    the coordination service and has no buffer."""
    monkeypatch.setattr(fiberrl.sharedctypes, "one_host", lambda: False)
    array = fiberrl.Array("d", 3)
    assert isinstance(array.get_obj(), fiberrl.sharedctypes.ArrayCellProxy)
    array[1] = 2.0
    assert array[:] == [0.0, 2.0, 0.0]
    with pytest.raises(TypeError):
        np.frombuffer(array.get_obj())


class Point(ctypes.Structure):
    _fields_ = [("x", ctypes.c_int), ("y", ctypes.c_double)]


def _double_point(point):
    point.x *= 2
    point.y *= 2


@pytest.mark.parametrize("lock", [True, False])
def test_a_structure_value_is_shared_with_a_job(lock):
    point = fiberrl.Value(Point, 3, 1.5, lock=lock)
    proc = fiberrl.Process(target=_double_point, args=(point,))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0 and (point.x, point.y) == (6, 3.0)
    if lock:
        assert hasattr(point.get_lock(), "acquire") and isinstance(point.get_obj(), Point)


def test_copy_of_a_structure_is_a_new_shared_value():
    plain = Point(2, 5.0)
    copied = fiberrl.sharedctypes.copy(plain)
    plain.x, plain.y = 0, 0.0
    assert (copied.x, copied.y) == (2, 5.0) and shm_ctypes.is_shared(copied)


def test_a_structure_value_on_other_hosts_is_refused(monkeypatch):
    monkeypatch.setattr(fiberrl.sharedctypes, "one_host", lambda: False)
    with pytest.raises(TypeError, match="shared memory"):
        fiberrl.Value(Point, 1, 2.0)


# -- gymnasium -----------------------------------------------------------------------------
def _make_env():
    import gymnasium
    return gymnasium.make("CartPole-v1")


@pytest.mark.parametrize("shared_memory", [True, False])
def test_gymnasium_async_vector_env_matches_sync(shared_memory):
    """gymnasium takes a context *name* (it calls ``multiprocessing.get_context``), so
    fiberrl registers its context under one."""
    gymnasium = pytest.importorskip("gymnasium")
    from fiberrl.context import register_with_stdlib
    name = register_with_stdlib()
    steps, n_envs = 60, 2
    sync = gymnasium.vector.SyncVectorEnv([_make_env] * n_envs)
    async_env = gymnasium.vector.AsyncVectorEnv([_make_env] * n_envs, context=name,
                                                shared_memory=shared_memory)
    try:
        assert all(type(p).__module__ == "fiberrl.process" for p in async_env.processes)
        obs_sync, _ = sync.reset(seed=123)
        obs_async, _ = async_env.reset(seed=123)
        np.testing.assert_array_equal(obs_sync, obs_async)
        actions = np.random.default_rng(0).integers(0, 2, size=(steps, n_envs))
        for action in actions:
            expected = sync.step(action)
            got = async_env.step(action)
            for want, have in zip(expected[:4], got[:4]):
                np.testing.assert_array_equal(want, have)
    finally:
        sync.close()
        async_env.close()
