"""The node's log set-up: text or JSON lines, stderr or a rotated file, and the HTTP access log.

Called once by ``shoal server`` (``shoal/__main__.py``) after the configuration is loaded.

* ``shoal.log.format=json`` (``--log-format json``) writes one JSON object per line: ``ts``
  (ISO 8601, UTC, milliseconds), ``level``, ``logger``, ``msg``, then the record's extras
  (``extra={...}`` of the call site) and ``exc`` with the traceback, if any.
* ``shoal.log.file`` (``--log-file``) writes to that file instead of standard error, rotated at
  ``shoal.log.file.max-bytes`` with ``shoal.log.file.count`` old files kept.
* The access log (``server.tomcat.accesslog.enabled``, as in Nacos) goes to its own rotated file
  (``shoal.log.access-file``, default ``<data_dir>/logs/access_log.log``; ``-`` = the main log).

Nothing here blocks the event loop: records go through a bounded queue to one writer thread
(:class:`BoundedQueueHandler`); when the writer falls behind, records are dropped and the
next line that gets through says how many. Repeated warnings are collapsed
(:class:`shoal.logutil.CollapsingHandler`).
"""

from __future__ import annotations

import copy
import logging
import logging.handlers
import queue
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from shoal.config import Config
from shoal.logutil import ACCESS_LOGGER, CollapsingHandler

__all__ = ["ACCESS_LOGGER", "BoundedQueueHandler", "JsonFormatter", "access_log_path", "configure_logging"]

TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
#: The text format of a process of a multi-worker node: which one wrote the line (``worker``:
#: ``supervisor`` or the worker's index), a key of its own in the JSON format.
WORKER_TEXT_FORMAT = "%(asctime)s %(levelname)-7s [%(worker)s] %(name)s: %(message)s"
#: Records waiting for the writer thread before new ones are dropped.
QUEUE_CAPACITY = 10_000

_STANDARD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ts, level, logger, msg, the record's extras, and exc."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON (no newline inside: tracebacks are escaped)."""
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD_ATTRS and not key.startswith("_") and key not in out:
                out[key] = value
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            out["exc"] = record.exc_text
        if record.stack_info:
            out["stack"] = record.stack_info
        return orjson.dumps(out, default=str).decode()


class BoundedQueueHandler(logging.handlers.QueueHandler):
    """A QueueHandler that drops (and counts) records when its bounded queue is full, never blocking."""

    def __init__(self, q: queue.Queue[logging.LogRecord | None]) -> None:
        super().__init__(q)
        self.dropped = 0
        self._lock = threading.Lock()

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        """A copy with the message rendered and the traceback as text (the writer formats it)."""
        record = copy.copy(record)
        record.msg = record.getMessage()
        record.args = None
        if record.exc_info:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
            record.exc_info = None
        return record

    def enqueue(self, record: logging.LogRecord) -> None:
        """Put without waiting; a full queue counts the record as dropped."""
        with self._lock:
            dropped, self.dropped = self.dropped, 0
        try:
            if dropped:
                note = logging.LogRecord("shoal.log", logging.WARNING, __file__, 0,
                                         "the log writer fell behind: %d lines dropped", (dropped,), None)
                note.dropped = dropped
                self.queue.put_nowait(note)
            self.queue.put_nowait(record)
        except queue.Full:
            with self._lock:
                self.dropped += dropped + 1


def access_log_path(config: Config) -> Path | None:
    """Where the access log goes: a file, or None for the main log (``-``)."""
    if config.access_log_file == "-":
        return None
    if config.access_log_file:
        return Path(config.access_log_file)
    return Path(config.data_dir) / "logs" / "access_log.log"


def _file_handler(path: Path, config: Config) -> logging.Handler:
    path.parent.mkdir(parents=True, exist_ok=True)
    return logging.handlers.RotatingFileHandler(path, maxBytes=config.log_file_max_bytes,
                                                backupCount=config.log_file_count, encoding="utf-8")


def _formatter(config: Config, worker: str) -> logging.Formatter:
    if config.log_format == "json":
        return JsonFormatter()
    if worker:  # defaults: a record that skipped the label (the writer's own notes) still formats
        return logging.Formatter(WORKER_TEXT_FORMAT, defaults={"worker": worker})
    return logging.Formatter(TEXT_FORMAT)


class _WorkerLabel(logging.Filter):
    """Stamps every record with the process's place in its node (``worker``)."""

    def __init__(self, worker: str) -> None:
        super().__init__()
        self.worker = worker

    def filter(self, record: logging.LogRecord) -> bool:
        record.worker = self.worker
        return True


def configure_logging(config: Config, worker: str = "") -> Callable[[], None]:
    """Install the root and access-log handlers for ``config``; returns the function that stops them.
    ``worker`` names the process in every line (a multi-worker node's ``supervisor`` or worker index).

    Raises OSError when a log file cannot be opened.
    """
    sink: logging.Handler
    sink = _file_handler(Path(config.log_file), config) if config.log_file else logging.StreamHandler(sys.stderr)
    sink.setFormatter(_formatter(config, worker))
    handlers: list[logging.Handler] = [CollapsingHandler(sink)]

    access = logging.getLogger(ACCESS_LOGGER)
    access.handlers.clear()
    access_path = access_log_path(config) if config.access_log_enabled else None
    if config.access_log_enabled and access_path is not None:
        access_sink = _file_handler(access_path, config)
        access_sink.setFormatter(_formatter(config, worker))
        access_sink.addFilter(lambda r: r.name == ACCESS_LOGGER)
        handlers.append(access_sink)
        handlers[0].addFilter(lambda r: r.name != ACCESS_LOGGER)
    access.setLevel(logging.INFO if config.access_log_enabled else logging.WARNING)

    records: queue.Queue[logging.LogRecord | None] = queue.Queue(QUEUE_CAPACITY)
    listener = logging.handlers.QueueListener(records, *handlers, respect_handler_level=True)
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    queue_handler = BoundedQueueHandler(records)
    if worker:
        queue_handler.addFilter(_WorkerLabel(worker))
    root.addHandler(queue_handler)
    root.setLevel(getattr(logging, config.log_level.upper()))
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    listener.start()

    def stop() -> None:
        listener.stop()
        for handler in handlers:
            handler.close()

    return stop
