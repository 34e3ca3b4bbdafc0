"""CPU torch tensors in fiberrl's pickles: the storage travels as an out-of-band buffer
(not ``torch.save`` bytes inside the signed pickle stream) and comes back equal, with
its dtype, shape, strides and storage sharing."""
import pytest

import fiberrl
from fiberrl import reduction

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.timeout(120)


def _roundtrip(obj):
    return reduction.loads(reduction.dumps(obj))


def test_a_large_tensor_leaves_the_pickle_stream():
    tensor = torch.arange(256 * 1024, dtype=torch.float32)   # 1 MiB
    frames = reduction.dumps((3, tensor))
    assert len(frames[0]) < 2048            # the stream: no storage bytes inside
    assert [memoryview(f).nbytes for f in frames[1:]] == [tensor.numel() * 4]
    index, back = reduction.loads(frames)
    assert index == 3 and torch.equal(back, tensor)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16,
                                   torch.int64, torch.uint8, torch.bool, torch.complex64])
@pytest.mark.parametrize("numel", [0, 5, 40_000])
def test_dtypes_and_sizes_come_back_equal(dtype, numel):
    tensor = (torch.arange(numel) % 7).to(dtype)
    back = _roundtrip(tensor)
    assert back.dtype == dtype and back.shape == tensor.shape and torch.equal(back, tensor)


def test_views_keep_their_layout_and_their_shared_storage():
    base = torch.arange(100_000, dtype=torch.float32).reshape(1000, 100)
    column, rows = base[:, 3], base[10:20]
    back_base, back_column, back_rows = _roundtrip((base, column, base[10:20].t()))
    assert torch.equal(back_column, column) and back_column.stride() == column.stride()
    assert torch.equal(back_rows, rows.t()) and not back_rows.is_contiguous()
    back_base[10, 3] = -1.0   # one storage on the other side too, as with torch's pickling
    assert back_column[10] == -1.0 and back_rows[3, 0] == -1.0


def test_a_tensor_got_from_a_queue_is_writable_and_does_not_alias_the_one_put():
    tensor = torch.zeros(100_000)
    queue = fiberrl.Queue()
    queue.put(tensor)
    back = queue.get(timeout=10)
    back += 1
    assert float(back.sum()) == 100_000 and float(tensor.sum()) == 0


def test_tensors_torch_must_pickle_itself_still_travel():
    leaf = torch.ones(3, requires_grad=True)
    param = torch.nn.Parameter(torch.arange(70_000, dtype=torch.float32))
    back_leaf, back_param = _roundtrip((leaf, param))
    assert back_leaf.requires_grad and torch.equal(back_leaf, leaf)
    assert type(back_param) is torch.nn.Parameter and torch.equal(back_param, param)
    conj = torch.tensor([1 + 2j]).conj()
    assert torch.equal(_roundtrip(conj), conj)


def test_forking_pickler_with_an_older_protocol_keeps_torchs_own_reduction():
    import io
    import pickle
    tensor = torch.arange(100_000)
    sink = io.BytesIO()
    reduction.ForkingPickler(sink, 4).dump(tensor)   # no out-of-band buffer below protocol 5
    assert torch.equal(pickle.loads(sink.getvalue()), tensor)


def test_pool_results_carry_tensors_out_of_band():
    tensor = torch.arange(100_000, dtype=torch.float64)
    frames = reduction.dumps_data({"x": tensor})
    assert len(frames[0]) < 2048 and torch.equal(reduction.loads(frames)["x"], tensor)


def _tensor_of(n):
    return torch.full((n,), float(n))


def test_a_pool_returns_tensors():
    with fiberrl.Pool(1) as pool:
        got = pool.map(_tensor_of, [3, 70_000])
    assert [torch.equal(t, _tensor_of(n)) for t, n in zip(got, [3, 70_000])] == [True, True]


def _echo(queue_in, queue_out):
    queue_out.put(queue_in.get(timeout=60))


def test_a_tensor_through_a_queue_to_a_job_and_back():
    tensor = torch.randn(300, 1000)
    ctx = fiberrl.get_context()
    queue_in, queue_out = ctx.Queue(), ctx.Queue()
    job = ctx.Process(target=_echo, args=(queue_in, queue_out))
    job.start()
    try:
        queue_in.put({"x": tensor, "y": tensor[5]})
        back = queue_out.get(timeout=60)
    finally:
        job.join(30)
    assert torch.equal(back["x"], tensor) and torch.equal(back["y"], tensor[5])
    back["x"][5, 0] = 123.0
    assert back["y"][0] == 123.0   # still views of one storage
