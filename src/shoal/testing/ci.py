"""What a test does when a tool it needs is missing: skip on a developer's machine, fail in CI.

CI (``CI=true``) runs ``ci/test-deps.sh`` first, which installs every client, browser, iptables and
etcd as root; there a missing tool is a broken setup, never a pass.
"""

from __future__ import annotations

import os
from typing import NoReturn


def in_ci() -> bool:
    """True when the suite runs in CI (``CI`` set to 1/true/yes)."""
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def unavailable(message: str) -> NoReturn:
    """Skip the test with ``message``, or fail it in CI."""
    import pytest  # a test-only dependency: imported when a test needs it

    if in_ci():
        pytest.fail(f"{message} (in CI every test must run)", pytrace=False)
    pytest.skip(message)


def require(ok: bool, message: str) -> None:
    """:func:`unavailable` unless ``ok``."""
    if not ok:
        unavailable(message)
