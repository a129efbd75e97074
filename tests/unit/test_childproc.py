"""shoal.childproc: the die-with-parent wrapper resolves its program in the caller."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from shoal.childproc import dying_with_parent


def test_a_missing_program_raises_in_the_caller_not_in_the_child(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no-such-program-here"):
        dying_with_parent([str(tmp_path / "no-such-program-here"), "--flag"])
    with pytest.raises(FileNotFoundError):
        dying_with_parent(["shoal-no-such-program-on-path"])


def test_a_program_on_path_is_run_with_its_arguments() -> None:
    done = subprocess.run(dying_with_parent(["echo", "one", "two"]), capture_output=True, text=True, check=True)
    assert done.stdout == "one two\n"
    assert done.stderr == ""
