"""Third-party programs written for ``multiprocessing``, run with every
``multiprocessing`` import mapped to fiberrl (the CPython suite's import hook,
``tests/cpython_suite/mp_alias.py``, in the program and in each job it starts).

Each program checks its own results and prints a line; the test also asks for an
empty stderr (no traceback at exit) and that the program saw fiberrl. What does not
run this way is in docs/compatibility.md (joblib's default loky backend, pebble's pool).
"""
import os
import subprocess
import sys
import textwrap

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

PROGRAMS = {
    "joblib": ("joblib", """
        import math
        import multiprocessing
        from joblib import Parallel, delayed

        def square(x):
            return x * x

        if __name__ == "__main__":
            assert multiprocessing.__name__ == "fiberrl"
            out = Parallel(n_jobs=2, backend="multiprocessing")(
                delayed(square)(i) for i in range(40))
            assert out == [i * i for i in range(40)], out
            roots = Parallel(n_jobs=2, backend="multiprocessing", batch_size=4)(
                delayed(math.sqrt)(i) for i in range(9))
            assert roots == [math.sqrt(i) for i in range(9)], roots
            print("joblib ok")
        """),
    "dask": ("dask", """
        import multiprocessing
        import dask.bag as db

        def increment(x):
            return x + 1

        if __name__ == "__main__":
            assert multiprocessing.__name__ == "fiberrl"
            bag = db.from_sequence(range(100), npartitions=4).map(increment)
            assert bag.sum().compute(scheduler="processes", num_workers=2) == 5050
            print("dask ok")
        """),
    "torch": ("torch", """
        import multiprocessing
        import torch
        import torch.multiprocessing as torch_mp
        from torch.utils.data import DataLoader, Dataset

        class Squares(Dataset):
            def __len__(self):
                return 16

            def __getitem__(self, i):
                return torch.full((3,), float(i * i))

        def work(rank, results):
            results.put((rank, torch.ones(3) * rank))

        if __name__ == "__main__":
            assert multiprocessing.__name__ == "fiberrl"
            results = torch_mp.get_context("spawn").SimpleQueue()
            torch_mp.spawn(work, args=(results,), nprocs=2, join=True)
            got = sorted((rank, t.tolist()) for rank, t in [results.get(), results.get()])
            assert got == [(0, [0.0] * 3), (1, [1.0] * 3)], got
            batches = list(DataLoader(Squares(), batch_size=4, num_workers=2))
            assert torch.cat(batches)[:, 0].tolist() == [float(i * i) for i in range(16)]
            print("torch ok")
        """),
    "tqdm": ("tqdm", """
        import multiprocessing
        from tqdm.contrib.concurrent import process_map

        def triple(x):
            return 3 * x

        if __name__ == "__main__":
            assert multiprocessing.__name__ == "fiberrl"
            out = process_map(triple, range(50), max_workers=2, chunksize=5, disable=True)
            assert out == [3 * i for i in range(50)], out
            print("tqdm ok")
        """),
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_a_third_party_program_runs_on_fiberrl(name, tmp_path):
    module, source = PROGRAMS[name]
    pytest.importorskip(module)   # installed by scripts/test.sh (the test extra)
    script = tmp_path / f"{name}_program.py"
    script.write_text(textwrap.dedent(source))
    env = dict(os.environ, CPYTHON_SUITE_ALIAS="1",
               PYTHONPATH=os.pathsep.join([os.path.join(HERE, "cpython_suite"), ROOT]))
    run = subprocess.run([sys.executable, str(script)], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().endswith(f"{name} ok")
    assert run.stderr == ""


def test_names_code_built_on_the_stdlibs_modules_imports():
    """loky (joblib) imports these from the stdlib's modules at import time."""
    import multiprocessing.context
    import queue

    import fiberrl
    from fiberrl import context, queues, synchronize
    assert queues.Full is queue.Full and queues.Empty is queue.Empty
    assert queues._sentinel is not None
    assert isinstance(fiberrl.Lock(), synchronize.SemLock)
    assert isinstance(fiberrl.Semaphore(2), synchronize.SemLock)

    class LibraryContext(multiprocessing.context.BaseContext):
        _name = "library-made"

    made = LibraryContext()
    context._concrete_contexts["library-made"] = made   # as loky does to the stdlib's table
    try:
        assert fiberrl.get_context("library-made") is made
    finally:
        del context._concrete_contexts["library-made"]
    with pytest.raises(ValueError):
        fiberrl.get_context("library-made")
