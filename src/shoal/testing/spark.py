"""A real standalone Spark cluster on loopback, from PySpark's own distribution.

:class:`SparkStandalone` starts one master and ``workers`` workers with ``spark-class
org.apache.spark.deploy.master.Master`` / ``...worker.Worker`` (the jars and launcher scripts that
``pip install pyspark`` ships), waits until every worker is registered with the master (its JSON
at ``/json/``, polled with a deadline), and stops them however the ``with`` block ends: each daemon
runs in a session of its own, and stopping signals the whole process group, so the executors a
worker launched and their Python workers go with it. Logs stay under ``root`` for failure messages.

What a driver needs to use it (a ``shoal analytics ... --master`` run or a bench) is
:attr:`SparkStandalone.master_url` and :meth:`SparkStandalone.driver_conf` (executors sized to fit
a worker). Which applications ran, and where, is read back from the master
(:meth:`SparkStandalone.applications`) and from the workers' work directories
(:meth:`SparkStandalone.executors_of`), so a test can prove its work ran on the cluster.

Needs the ``analytics`` extra (pyspark) and a Java 17+ runtime, as the jobs themselves.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shoal.childproc import dying_with_parent
from shoal.testing.http import http_get
from shoal.testing.procs import HOST, free_port_block
from shoal.testing.wait import poll_until

__all__ = ["SparkDaemon", "SparkStandalone", "spark_home", "spark_standalone"]

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"

# Daemons log at WARN: the master's and workers' INFO lines (every registration, every executor
# state change) would bury what a failure message needs.
_LOG4J2 = """\
status = error
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss.SSS} %p %c{1}: %m%n
"""


def spark_home() -> Path:
    """The Spark distribution inside the installed pyspark package (``bin/spark-class``, ``jars/``)."""
    try:
        import pyspark
    except ModuleNotFoundError:
        raise RuntimeError("pyspark is not installed: install the analytics extra (ci/setup.sh dev)") from None
    home = Path(pyspark.__file__).parent
    if not (home / "bin" / "spark-class").exists():
        raise RuntimeError(f"{home} has no bin/spark-class: not a pyspark distribution with its launcher")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        raise RuntimeError("no Java runtime: Spark needs Java 17+ (JAVA_HOME or java on PATH)")
    return home


def _get_json(url: str, timeout: float = 2.0) -> Any:
    status, text = http_get(url, timeout)
    if status != 200:
        raise OSError(f"{url} answered {status}")
    return json.loads(text)


@dataclass
class SparkDaemon:
    """One master or worker JVM: its command, its log file and (once started) its process."""

    name: str
    args: list[str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self, env: dict[str, str]) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log_file:
            self.proc = subprocess.Popen(dying_with_parent(self.args), stdout=log_file, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=env, start_new_session=True)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM to the daemon's process group (executors and Python workers included), SIGKILL
        to whatever is left after ``timeout``; always reaps the daemon."""
        if self.proc is None:
            return
        pgid = self.proc.pid  # its own session: the group id is its pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout)
        # the daemon may be gone while an executor it launched still shuts down: kill the group
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)


class SparkStandalone:
    """A standalone master and ``workers`` workers of ``cores`` cores and ``memory`` each, on
    127.0.0.1 ports from :func:`free_port_block`, with logs and work directories under ``root``.

    Created stopped; :meth:`start` (or the ``with`` block) starts and waits for registration."""

    def __init__(self, root: Path, *, workers: int = 2, cores: int = 1, memory: str = "512m",
                 daemon_memory: str = "256m", start_timeout: float = 90.0) -> None:
        if workers < 1:
            raise ValueError("a standalone cluster needs at least one worker")
        self.root = root
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.daemon_memory = daemon_memory
        self.start_timeout = start_timeout
        # master RPC, master UI, then RPC and UI of each worker
        base = free_port_block(tuple(range(2 + 2 * workers)))
        self.port, self.webui_port = base, base + 1
        self.worker_ports = [(base + 2 + 2 * i, base + 3 + 2 * i) for i in range(workers)]
        spark_class = str(spark_home() / "bin" / "spark-class")
        self.master = SparkDaemon("master", [
            spark_class, MASTER_CLASS, "--host", HOST, "--port", str(self.port),
            "--webui-port", str(self.webui_port),
        ], root / "logs" / "master.log")
        self.worker_daemons = [
            SparkDaemon(f"worker{i}", [
                spark_class, WORKER_CLASS, self.master_url, "--host", HOST, "--port", str(rpc),
                "--webui-port", str(ui), "--cores", str(cores), "--memory", memory,
                "--work-dir", str(self.work_dir(i)),
            ], root / "logs" / f"worker{i}.log")
            for i, (rpc, ui) in enumerate(self.worker_ports)
        ]

    # --- addresses ----------------------------------------------------------------------------
    @property
    def master_url(self) -> str:
        """What ``--master`` takes: ``spark://127.0.0.1:PORT``."""
        return f"spark://{HOST}:{self.port}"

    @property
    def webui_url(self) -> str:
        return f"http://{HOST}:{self.webui_port}"

    def work_dir(self, worker: int) -> Path:
        """Where worker ``worker`` runs its executors: ``<app id>/<executor id>/{stdout,stderr}``."""
        return self.root / f"work{worker}"

    def driver_conf(self) -> dict[str, str]:
        """Spark settings a driver needs on this cluster: executors no larger than a worker
        (Spark's default of 1g would leave the application waiting for resources forever)."""
        return {"spark.executor.memory": self.memory, "spark.executor.cores": str(self.cores)}

    def conf_args(self) -> list[str]:
        """:meth:`driver_conf` as ``shoal analytics`` arguments: ``--conf K=V ...``."""
        return [a for k, v in self.driver_conf().items() for a in ("--conf", f"{k}={v}")]

    # --- lifecycle ----------------------------------------------------------------------------
    def _env(self) -> dict[str, str]:
        conf_dir = self.root / "conf"
        conf_dir.mkdir(parents=True, exist_ok=True)
        (conf_dir / "log4j2.properties").write_text(_LOG4J2)
        env = dict(os.environ)
        env.update({
            "SPARK_HOME": str(spark_home()),
            "SPARK_CONF_DIR": str(conf_dir),  # nothing from a user's or the image's Spark config
            "SPARK_LOCAL_IP": HOST,
            "SPARK_DAEMON_MEMORY": self.daemon_memory,
            "SPARK_LOG_DIR": str(self.root / "logs"),
            "SPARK_PID_DIR": str(self.root),
            # Python workers on this interpreter (the driver names its own; this covers the rest),
            # importing shoal from where this process does (PYTHONPATH is inherited by executors)
            "PYSPARK_PYTHON": sys.executable,
        })
        return env

    def start(self) -> SparkStandalone:
        env = self._env()
        try:
            self.master.start(env)
            poll_until(self._master_alive, self.start_timeout, 0.2, what=f"spark master on {self.port}")
            for worker in self.worker_daemons:
                worker.start(env)
            poll_until(self._all_registered, self.start_timeout, 0.2,
                       what=f"{self.workers} spark workers registered with {self.master_url}")
        except BaseException as exc:
            self.stop()
            if isinstance(exc, (AssertionError, TimeoutError)):
                raise AssertionError(f"{exc}\n{self.logs()}") from exc
            raise
        return self

    def _check_daemons(self) -> None:
        for daemon in (self.master, *self.worker_daemons):
            if daemon.proc is not None and not daemon.alive():
                raise AssertionError(f"spark {daemon.name} exited with {daemon.proc.returncode}")

    def _master_alive(self) -> bool:
        self._check_daemons()
        try:
            return self.state().get("status") == "ALIVE"
        except OSError:
            return False

    def _all_registered(self) -> bool:
        self._check_daemons()
        try:
            alive = [w for w in self.state().get("workers", []) if w.get("state") == "ALIVE"]
        except OSError:
            return False
        return len(alive) >= self.workers

    def stop(self) -> None:
        """Stop workers (and their executors) first, then the master; never raises for a daemon
        that already exited."""
        for daemon in (*self.worker_daemons, self.master):
            daemon.stop()

    def __enter__(self) -> SparkStandalone:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- what it reports ----------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """The master's state (``/json/``): ``workers``, ``activeapps``, ``completedapps``, ..."""
        data: dict[str, Any] = _get_json(f"{self.webui_url}/json/")
        return data

    def applications(self) -> list[dict[str, Any]]:
        """Every application the master has seen, active and completed (``id``, ``name``, ``state``...)."""
        state = self.state()
        return [*state.get("activeapps", []), *state.get("completedapps", [])]

    def executors_of(self, app_id: str) -> dict[int, list[str]]:
        """Per worker index, the ids of the executors it ran for ``app_id`` (their work directories)."""
        found: dict[int, list[str]] = {}
        for i in range(self.workers):
            app_dir = self.work_dir(i) / app_id
            if app_dir.is_dir():
                found[i] = sorted(p.name for p in app_dir.iterdir() if p.is_dir())
        return found

    def logs(self, lines: int = 40) -> str:
        """The tail of every daemon's log, for failure messages."""
        return "\n".join(f"--- spark {d.name} ({d.log_path}) ---\n{d.log_tail(lines)}"
                         for d in (self.master, *self.worker_daemons))

    def executor_logs(self, app_id: str, lines: int = 40) -> str:
        """The tail of the stderr of every executor of ``app_id``, for failure messages."""
        parts = []
        for i, ids in self.executors_of(app_id).items():
            for ex in ids:
                path = self.work_dir(i) / app_id / ex / "stderr"
                with contextlib.suppress(OSError):
                    tail = "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
                    parts.append(f"--- executor {ex} on worker{i} ({path}) ---\n{tail}")
        return "\n".join(parts)


@contextlib.contextmanager
def spark_standalone(root: Path, **kw: Any) -> Iterator[SparkStandalone]:
    """A started :class:`SparkStandalone` for the ``with`` block; ``kw`` go to its constructor."""
    cluster = SparkStandalone(root, **kw)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()

