"""Log plumbing: JSON lines, collapsed repeats, a queue that never blocks."""

from __future__ import annotations

import json
import logging
import queue

from shoal.logconfig import BoundedQueueHandler, JsonFormatter
from shoal.logutil import CollapsingHandler


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _record(msg: str, *args: object, level: int = logging.WARNING, name: str = "shoal.distro") -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, args, None)


def test_json_formatter_writes_one_object_with_extras_and_traceback() -> None:
    record = _record("sync to %s failed", "10.0.0.2:8848")
    record.peer = "10.0.0.2:8848"
    try:
        raise ValueError("boom\nsecond line")
    except ValueError:
        import sys
        record.exc_info = sys.exc_info()
    line = JsonFormatter().format(record)
    assert "\n" not in line
    obj = json.loads(line)
    assert obj["msg"] == "sync to 10.0.0.2:8848 failed" and obj["level"] == "WARNING"
    assert obj["logger"] == "shoal.distro" and obj["peer"] == "10.0.0.2:8848"
    assert obj["ts"].endswith("Z") and "ValueError: boom" in obj["exc"]


def test_repeated_warnings_collapse_into_one_line_with_a_count() -> None:
    now = [0.0]
    sink = Collect()
    handler = CollapsingHandler(sink, window_s=10, clock=lambda: now[0])
    for _ in range(50):
        handler.handle(_record("verify with %s failed: %s", "10.0.0.2:8848", "refused"))
    handler.handle(_record("member %s is DOWN", "10.0.0.2:8848", level=logging.INFO))
    handler.handle(_record("member %s is DOWN", "10.0.0.2:8848", level=logging.INFO))  # INFO always passes
    assert len(sink.records) == 3 and handler.repeats() == 49
    now[0] = 11.0
    handler.handle(_record("verify with %s failed: %s", "10.0.0.2:8848", "refused"))
    summary, fresh = sink.records[3], sink.records[4]
    assert getattr(summary, "repeated", 0) == 49 and "verify with 10.0.0.2:8848 failed" in summary.getMessage()
    assert fresh.getMessage() == "verify with 10.0.0.2:8848 failed: refused"
    handler.handle(_record("verify with %s failed: %s", "10.0.0.2:8848", "refused"))
    handler.flush()  # what is left is reported at flush/close
    assert getattr(sink.records[-1], "repeated", 0) == 1


def test_a_full_log_queue_drops_and_says_how_many() -> None:
    q: queue.Queue[logging.LogRecord | None] = queue.Queue(2)
    handler = BoundedQueueHandler(q)
    for i in range(5):
        handler.handle(_record("line %d", i, level=logging.INFO))  # never blocks, never raises
    assert q.qsize() == 2 and handler.dropped == 3
    q.get_nowait()
    q.get_nowait()
    handler.handle(_record("after", level=logging.INFO))
    note, after = q.get_nowait(), q.get_nowait()
    assert note is not None and getattr(note, "dropped", 0) == 3
    assert after is not None and after.getMessage() == "after" and after.args is None
