"""shoal.logutil.RateLimitedLog: one line per kind per interval, then the count of the rest."""

from __future__ import annotations

import logging

import pytest

from shoal.logutil import RateLimitedLog
from shoal.testing import wait_until

LOGGER = "shoal.tests.logutil"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER]


def test_first_line_of_a_kind_is_written_and_the_rest_counted(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    limited = RateLimitedLog(logging.getLogger(LOGGER), 10, clock=clock)
    with caplog.at_level(logging.INFO, LOGGER):
        assert limited.warning("bad-frame", "bad frame from %s", "a")
        for _ in range(99):
            assert not limited.warning("bad-frame", "bad frame from %s", "b")
        assert limited.warning("other", "another kind")  # kinds are independent
        assert limited.held_back("bad-frame") == 99
        assert len(_records(caplog)) == 2
        clock.now += 10
        assert limited.warning("bad-frame", "bad frame from %s", "c")  # a new window: the count, then the line
    records = _records(caplog)
    assert len(records) == 4
    summary = records[2]
    assert summary.levelno == logging.WARNING and summary.args is not None and 99 in tuple(summary.args)
    assert records[3].getMessage() == "bad frame from c"
    assert limited.held_back("bad-frame") == 0


def test_flush_reports_ended_windows_only(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    limited = RateLimitedLog(logging.getLogger(LOGGER), 10, clock=clock)
    with caplog.at_level(logging.INFO, LOGGER):
        limited.warning("a", "a")
        limited.warning("a", "a")
        limited.flush()
        assert len(_records(caplog)) == 1  # the window is still open
        clock.now += 11
        limited.flush()
        assert len(_records(caplog)) == 2
        limited.flush()
        assert len(_records(caplog)) == 2  # reported once
    assert limited.held_back("a") == 0


def test_a_traceback_goes_only_with_a_written_line(caplog: pytest.LogCaptureFixture) -> None:
    limited = RateLimitedLog(logging.getLogger(LOGGER), 10, clock=Clock())
    with caplog.at_level(logging.INFO, LOGGER):
        for _ in range(5):
            try:
                raise RuntimeError("boom")
            except RuntimeError:
                limited.log(logging.ERROR, "unexpected RuntimeError", "failed", exc_info=True)
    records = _records(caplog)
    assert len(records) == 1 and records[0].exc_info is not None


def test_kinds_past_the_bound_share_one_window(caplog: pytest.LogCaptureFixture) -> None:
    limited = RateLimitedLog(logging.getLogger(LOGGER), 10, clock=Clock(), max_kinds=3)
    with caplog.at_level(logging.INFO, LOGGER):
        for i in range(50):
            limited.warning(f"kind {i}", "line %d", i)
    assert len(_records(caplog)) == 4  # three kinds, then one line for all the others
    assert limited.held_back(RateLimitedLog.OTHER) == 46


async def test_with_a_loop_the_count_is_reported_when_the_window_ends(caplog: pytest.LogCaptureFixture) -> None:
    limited = RateLimitedLog(logging.getLogger(LOGGER), 0.05)
    with caplog.at_level(logging.INFO, LOGGER):
        limited.warning("k", "line")
        limited.warning("k", "line")
        limited.warning("k", "line")
        await wait_until(lambda: len(_records(caplog)) >= 2, 5, "the count line", interval=0.01)
    records = _records(caplog)
    assert len(records) == 2
    assert records[1].args is not None and 2 in tuple(records[1].args)
