"""Pool callbacks: user code that runs off the process's I/O loop (fiberrl.pool.callbacks)."""
import fiberrl


def test_a_callback_that_waits_for_the_pool_stalls_nothing_and_runs_before_ready():
    """Callbacks are user code: one that blocks (here on another of the pool's results)
    must not stall the process's I/O loop, and a result with a callback is ready only
    once its callback ran, as in the stdlib."""
    with fiberrl.Pool(2) as pool:
        seen = []

        def callback(value):
            seen.append((value, pool.apply(abs, (-value,))))

        result = pool.apply_async(abs, (-3,), callback=callback)
        assert result.get(timeout=60) == 3
        assert seen == [(3, 3)]   # ran before get() returned
        errors = []
        failing = pool.apply_async(divmod, (1, 0), error_callback=errors.append)
        failing.wait(60)
        assert failing.ready() and len(errors) == 1 and isinstance(errors[0], ZeroDivisionError)
