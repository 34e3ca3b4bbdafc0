"""The serialization seam: plain data takes the C pickler, the rest cloudpickle."""
import pickle

import numpy as np
import pytest

from fiberrl import reduction


class _Subclass(np.ndarray):
    """A user's ndarray subclass: its class may live in __main__, so it is not plain."""


def test_numpy_scalars_and_plain_arrays_are_plain_data():
    # gymnasium's AsyncVectorEnv sends ("step", np.int64(action)) every step
    for obj in (("step", np.int64(1)), np.float32(2.5), np.bool_(True), {"a": [np.int8(3)]},
                np.zeros(3), ((None, 1.0, False, False, {}), True)):
        assert reduction._is_plain(obj), obj
    for obj in (np.array([object()]), np.zeros(2).view(_Subclass), [lambda: 1], {1.5j: object()}):
        assert not reduction._is_plain(obj), obj


def test_plain_data_round_trips_through_the_c_pickler():
    message = ("step", np.int64(7), {"obs": np.arange(4.0)})
    frames = reduction.dumps(message)
    assert len(frames) == 1
    assert b"cloudpickle" not in frames[0]
    back = reduction.loads(frames)
    assert back[0] == "step" and back[1] == 7 and type(back[1]) is np.int64
    assert (back[2]["obs"] == np.arange(4.0)).all()
    assert pickle.loads(frames[0])[1] == 7


def test_large_arrays_travel_out_of_band_and_other_objects_by_cloudpickle():
    big = np.ones(100_000)
    frames = reduction.dumps({"big": big, "scalar": np.float64(1.0)})
    assert len(frames) == 2 and memoryview(frames[1]).nbytes == big.nbytes
    assert (reduction.loads(frames)["big"] == big).all()
    square = reduction.loads(reduction.dumps(lambda x: x * x))   # by value
    assert square(3) == 9


def test_plain_data_without_arrays_needs_no_buffer_callback():
    # an env's reply and a step command: nothing in them can be kept out of band
    for obj in (((None, 1.0, False, False, {}), True), ("step", np.int64(1)), {"k": [1, "a"]}):
        assert reduction._plain_kind(obj) == reduction._SCALAR, obj
    assert reduction._plain_kind({"buf": bytearray(4)}) == reduction._SCALAR  # pickled in-band
    for obj in ((np.zeros(3), 1), {"obs": np.ones(2)}, [np.float32(1), np.ones(2)]):
        assert reduction._plain_kind(obj) == reduction._MAY_HOLD_BUFFERS, obj
    assert reduction._plain_kind([lambda: 1]) == reduction._NOT_PLAIN


def test_numpy_objects_that_are_neither_scalars_nor_arrays_still_pickle():
    # a ufunc travels by name, as it did before scalars and arrays were told apart
    for obj in (np.add, ("apply", np.maximum)):
        back = reduction.loads(reduction.dumps(obj))
        assert type(back) is type(obj)
    assert reduction.loads(reduction.dumps(np.add))(1, 2) == 3


def test_a_large_array_in_plain_data_still_travels_out_of_band():
    big = np.arange(50_000, dtype=np.float64)
    frames = reduction.dumps(("obs", (1.0, [big])))
    assert len(frames) == 2 and memoryview(frames[1]).nbytes == big.nbytes
    back = reduction.loads(frames)
    assert back[0] == "obs" and (back[1][1][0] == big).all()


def test_a_step_command_is_seen_as_plain_without_the_scan_once_its_scalar_type_is_known(
        monkeypatch):
    # gymnasium's AsyncVectorEnv sends ("step", np.int64(action)) every step: from the
    # second on, the numpy scalar type is known and the message takes the one-call check
    first = reduction.dumps(("step", np.int64(1)))
    assert first == [pickle.dumps(("step", np.int64(1)), 5)]

    def no_scan(obj, budget=64):
        raise AssertionError(f"scanned {obj!r}")

    monkeypatch.setattr(reduction, "_plain_kind", no_scan)
    for message in (("step", np.int64(2)), [np.int64(3), 1.5, "x"], np.int64(4)):
        frames = reduction.dumps(message)
        assert frames == [pickle.dumps(message, 5)]
        assert reduction.loads(frames) == message
    with pytest.raises(AssertionError, match="scanned"):   # containers still need the scan
        reduction.dumps(("step", (np.int64(1),)))
