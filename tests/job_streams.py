"""A job's stdout and stderr as the master sees them, for the backends that forward
them (Docker, Slurm): a target that writes to both, and the check that each reached
this process's own stream. Jobs import this module by name (the tests directory is
on their ``sys.path``); keep its imports light."""
import sys
import time

OUT_TEXT = "to the job's stdout"
ERR_TEXT = "to the job's stderr"


def print_to_both_streams(fail):
    """A job's target: a line to each stream, then a traceback if ``fail``."""
    print(OUT_TEXT, flush=True)
    print(ERR_TEXT, file=sys.stderr, flush=True)
    if fail:
        raise ValueError("the job's own error")


def wait_for_streams(capfd, texts, timeout):
    """What was forwarded to this process's stdout and stderr until every one of
    ``texts`` shows in one of them, or ``timeout``."""
    out, err, deadline = "", "", time.monotonic() + timeout
    while not all(t in out or t in err for t in texts) and time.monotonic() < deadline:
        captured = capfd.readouterr()
        out, err = out + captured.out, err + captured.err
        time.sleep(0.05)
    return out, err


def assert_streams_apart(capfd, fail, timeout=10):
    """After a job ran :func:`print_to_both_streams`: its stdout reached this process's
    stdout alone, its stderr (and traceback, if it failed) this process's stderr alone.
    Returns the texts the job wrote."""
    texts = [OUT_TEXT, ERR_TEXT] + (["ValueError"] if fail else [])
    out, err = wait_for_streams(capfd, texts, timeout)
    assert OUT_TEXT in out and OUT_TEXT not in err, (out, err)
    assert ERR_TEXT in err and ERR_TEXT not in out, (out, err)
    if fail:
        assert "ValueError: the job's own error" in err and "ValueError" not in out, (out, err)
    return texts
