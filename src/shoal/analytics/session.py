"""Build the SparkSession every analytics job uses, tuned for a small box unless told otherwise.

The jobs run from the ``shoal`` CLI (never inside the server process). Defaults are for the case we
actually run: local mode on a ~2-core developer box or CI runner, where Spark's defaults (200 shuffle
partitions, the web UI, console progress bars, INFO logging) cost more than the work. ``--master URL``
passes straight through for a real cluster, where only the quiet logging and Arrow settings apply
and Shoal must be installed on the executors (the jobs' Python functions import it there); settings
a cluster needs (executor memory, the driver's address, the executors' Python) come as ``conf``
(the CLI's ``--conf KEY=VALUE``). A standalone master on a loopback address (``spark://127.0.0.1:
7077``, ``spark://localhost:7077``) is a cluster on this machine: its executors reach the driver
on 127.0.0.1 and run this Python interpreter, as in local mode.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["DEFAULT_MASTER", "build_session", "on_this_machine", "spark_session"]

log = logging.getLogger(__name__)

DEFAULT_MASTER = "local[*]"

_LOG4J2 = """\
status = error
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
# PySpark's gateway counts as a shell: without this Spark prints "Setting default log level" and
# lowers the root logger to this logger's level (WARN by default)
logger.repl.name = org.apache.spark.repl.Main
logger.repl.level = error
logger.gateway.name = org.apache.spark.api.python.PythonGatewayServer
logger.gateway.level = error
"""


def _quiet_log4j_config() -> str:
    path = Path(tempfile.gettempdir()) / f"shoal-spark-log4j2-{os.getuid()}.properties"
    if not path.exists() or path.read_text() != _LOG4J2:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(_LOG4J2)
        tmp.replace(path)
    return str(path)


_LOOPBACK = ("127.", "localhost", "[::1]", "::1")


def on_this_machine(master: str) -> bool:
    """True for local masters and for standalone masters whose every host is a loopback address."""
    if master.startswith("local"):
        return True
    if not master.startswith("spark://"):
        return False
    # spark://host:port[,host:port...] (standby masters); an IPv6 host is bracketed
    hosts = [hp.rsplit(":", 1)[0] for hp in master.removeprefix("spark://").split(",")]
    return all(h.startswith(_LOOPBACK) for h in hosts)


def build_session(
    master: str | None = None,
    app_name: str = "shoal-analytics",
    *,
    shuffle_partitions: int | None = None,
    driver_memory: str = "6g",
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """A SparkSession (``getOrCreate``: an already running session is reused as is, unless
    ``master`` names another master than the running session's: then ``ValueError``, rather than
    running a job silently somewhere else than asked).

    Masters on this machine (local ones and standalone masters on loopback, :func:`on_this_machine`)
    get: shuffle partitions = 2 x cores (min 4) unless given, Spark's scratch space in a temp dir,
    the driver on 127.0.0.1 and Python workers on this interpreter; local masters also get driver
    memory ``driver_memory`` (only effective when this call starts the JVM). Every master gets the
    warehouse in a temp dir (no ``spark-warehouse/`` in the working directory). ``conf`` is
    applied last, so it overrides any of these.
    """
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas", category=FutureWarning)
    from pyspark.sql import SparkSession

    running = SparkSession.getActiveSession()
    if running is not None and master is not None and running.sparkContext.master != master:
        raise ValueError(f"a Spark session on {running.sparkContext.master} already runs in this process; "
                         f"it cannot also run on {master}")
    master = master or DEFAULT_MASTER
    local = master.startswith("local")
    if on_this_machine(master):
        # the Python workers must see the same environment (pyarrow, numpy, shoal) as the driver
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    log4j = f"-Dlog4j2.configurationFile=file:{_quiet_log4j_config()}"
    tmp_root = Path(tempfile.gettempdir()) / f"shoal-spark-{os.getuid()}"
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.adaptive.enabled", "true")
        .config("spark.sql.warehouse.dir", str(tmp_root / "warehouse"))
        .config("spark.driver.extraJavaOptions", log4j)
        .config("spark.executor.extraJavaOptions", log4j)
    )
    if local:
        builder = builder.config("spark.driver.memory", driver_memory)
    if on_this_machine(master):
        # a cluster on this machine has this machine's cores: Spark's 200 shuffle partitions would
        # be 200 tiny tasks per shuffle, each a round trip to an executor
        cores = os.cpu_count() or 2
        builder = (
            builder.config("spark.sql.shuffle.partitions", str(shuffle_partitions or max(4, 2 * cores)))
            .config("spark.local.dir", str(tmp_root / "local"))
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
        )
    elif shuffle_partitions:
        builder = builder.config("spark.sql.shuffle.partitions", str(shuffle_partitions))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    log.debug("spark session on %s (version %s)", spark.sparkContext.master, spark.version)
    return spark


@contextmanager
def spark_session(master: str | None = None, app_name: str = "shoal-analytics",
                  conf: Mapping[str, str] | None = None) -> Iterator[SparkSession]:
    """``build_session`` for the duration of a CLI command; stops the session only if this call
    started it (a session that was already active — e.g. a test fixture's — is left running)."""
    from pyspark.sql import SparkSession

    existing = SparkSession.getActiveSession()
    spark = build_session(master, app_name, conf=conf)
    try:
        yield spark
    finally:
        if existing is None:
            spark.stop()
