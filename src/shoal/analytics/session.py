"""Build the SparkSession every analytics job uses, tuned for a small box unless told otherwise.

The jobs run from the ``shoal`` CLI (never inside the server process). Defaults are for the case we
actually run: local mode on a ~2-core developer box or CI runner, where Spark's defaults (200 shuffle
partitions, the web UI, console progress bars, INFO logging) cost more than the work. ``--master URL``
passes straight through for a real cluster, where only the quiet logging and Arrow settings apply
and Shoal must be installed on the executors (the jobs' Python functions import it there).
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["DEFAULT_MASTER", "build_session", "spark_session"]

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


def build_session(
    master: str | None = None,
    app_name: str = "shoal-analytics",
    *,
    shuffle_partitions: int | None = None,
    driver_memory: str = "6g",
) -> SparkSession:
    """A SparkSession (``getOrCreate``: an already running session is reused as is).

    Local masters get: shuffle partitions = 2 x cores (min 4) unless given, driver memory
    ``driver_memory`` (only effective when this call starts the JVM), the warehouse in a temp dir
    (no ``spark-warehouse/`` in the working directory), and workers on this Python interpreter.
    """
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas", category=FutureWarning)
    from pyspark.sql import SparkSession

    master = master or DEFAULT_MASTER
    local = master.startswith("local")
    if local:
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
        cores = os.cpu_count() or 2
        builder = (
            builder.config("spark.driver.memory", driver_memory)
            .config("spark.sql.shuffle.partitions", str(shuffle_partitions or max(4, 2 * cores)))
            .config("spark.local.dir", str(tmp_root / "local"))
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
        )
    elif shuffle_partitions:
        builder = builder.config("spark.sql.shuffle.partitions", str(shuffle_partitions))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    log.debug("spark session on %s (version %s)", spark.sparkContext.master, spark.version)
    return spark


@contextmanager
def spark_session(master: str | None = None, app_name: str = "shoal-analytics") -> Iterator[SparkSession]:
    """``build_session`` for the duration of a CLI command; stops the session only if this call
    started it (a session that was already active — e.g. a test fixture's — is left running)."""
    from pyspark.sql import SparkSession

    existing = SparkSession.getActiveSession()
    spark = build_session(master, app_name)
    try:
        yield spark
    finally:
        if existing is None:
            spark.stop()
