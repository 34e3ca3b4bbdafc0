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


def test_a_callback_that_is_not_callable_is_refused_when_the_call_is_made():
    """A careless ``callback=1`` is a TypeError at the call, before any task is sent,
    not a traceback logged later when the result arrives."""
    import pytest
    with fiberrl.Pool(1) as pool:
        for call in (lambda: pool.apply_async(abs, (-3,), callback=1),
                     lambda: pool.apply_async(abs, (-3,), error_callback="log"),
                     lambda: pool.map_async(abs, [-1, -2], callback=[print]),
                     lambda: pool.starmap_async(divmod, [(1, 2)], error_callback=3)):
            with pytest.raises(TypeError, match="callback must be callable"):
                call()
        assert pool.apply(abs, (-4,)) == 4   # the pool goes on
        # a false value is no callback, as in the stdlib
        assert pool.apply_async(abs, (-5,), callback=False, error_callback=0).get(60) == 5
