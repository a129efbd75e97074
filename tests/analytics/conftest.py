"""One local SparkSession for the whole analytics suite: starting a JVM costs seconds, so it is shared."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def pytest_configure(config: pytest.Config) -> None:
    # pyspark 4.x warns on every pandas-backed UDF when pandas >= 3 is installed; the jobs use Arrow
    config.addinivalue_line("filterwarnings", "ignore:PySpark does not yet fully support pandas:FutureWarning")


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    from shoal.analytics.session import build_session

    session = build_session("local[2]", "shoal-tests", shuffle_partitions=2, driver_memory="2g")
    yield session
    session.stop()
