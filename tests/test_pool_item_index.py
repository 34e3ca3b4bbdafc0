"""Pool errors name the failing item's index in the input (and its chunk's range), not
the pool's internal task number."""
import functools
import re

import pytest

import fiberrl
import pool_helpers

GET = 120


def _notes(exc):
    return " | ".join(getattr(exc, "__notes__", []))


def test_task_retry_error_names_the_items_of_its_chunk(make_pool, tmp_path):
    p = make_pool(2, max_task_retries=2)
    pairs = [(5, str(tmp_path), x) for x in range(8)]
    with pytest.raises(fiberrl.TaskRetryError) as info:
        p.starmap_async(pool_helpers.dies_on, pairs, 2).get(timeout=GET)
    message = str(info.value)
    assert "starmap of dies_on, items 4-5 of the input" in message, message
    assert not re.search(r"\btask \d+", message), message  # no internal task number


def test_task_retry_error_of_a_one_item_chunk(make_pool, tmp_path):
    p = make_pool(2, max_task_retries=2)
    it = p.imap(functools.partial(pool_helpers.dies_on, 3, str(tmp_path)), range(6), 1)
    got = []
    for _ in range(6):
        try:
            got.append(it.next(timeout=GET))
        except fiberrl.TaskRetryError as exc:
            got.append(str(exc))
    assert got[3].startswith("map of partial(dies_on), item 3 of the input:"), got[3]


def test_an_exception_in_map_names_the_item_and_its_chunk(make_pool):
    p = make_pool(2)
    with pytest.raises(ValueError, match="bad item 13") as info:
        p.map(functools.partial(pool_helpers.fails_on, 13), range(20), chunksize=4)
    assert "map of partial(fails_on), item 13 of the input (its chunk: items 12-15)" in \
        _notes(info.value), _notes(info.value)


def test_an_exception_in_imap_names_the_item(make_pool):
    p = make_pool(2)
    it = p.imap(functools.partial(pool_helpers.fails_on, 7), range(10), chunksize=3)
    with pytest.raises(ValueError) as info:
        list(it)
    assert "item 7 of the input (its chunk: items 6-8)" in _notes(info.value)


def test_apply_exceptions_get_no_item_note(make_pool):
    p = make_pool(1)
    with pytest.raises(ValueError) as info:
        p.apply(pool_helpers.fails_on, (1, 1))
    assert "item" not in _notes(info.value)
