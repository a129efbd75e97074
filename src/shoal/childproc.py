"""Child processes that die with the process that started them.

The wrapper runs first in the new process and then execs the real command in place (same pid):
it raises the fd limit to the hard limit and asks Linux for SIGKILL when the starting *thread*
dies (PR_SET_PDEATHSIG survives exec). Doing this in the child rather than in a ``preexec_fn``
keeps Python code out of the window between fork and exec, which is unsafe once gRPC threads run
in the parent. Used for the managed etcd member (a node killed with SIGKILL leaves no orphan
holding its ports and data dir) and for the test helpers' server processes.
"""

from __future__ import annotations

import os
import shutil
import sys

_TRAMPOLINE = """
import ctypes, os, resource, signal, sys
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
if hard != resource.RLIM_INFINITY and soft < hard:
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
if sys.platform.startswith("linux"):
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
    except Exception:
        pass
if os.getppid() != int(sys.argv[1]):
    sys.exit(70)
os.execv(sys.argv[2], sys.argv[2:])
"""


def dying_with_parent(command: list[str]) -> list[str]:
    """``command`` wrapped so that it is killed when this process dies (exit code 70 when the
    parent is already gone before the exec).

    The program is looked up here, in the caller (``PATH`` as the shell would): a missing one
    raises :class:`FileNotFoundError` at once, as starting it unwrapped would, instead of a child
    that exits 1 with a traceback in its log."""
    program = shutil.which(command[0])
    if program is None:
        raise FileNotFoundError(f"no executable {command[0]!r} (not found or not executable)")
    return [sys.executable, "-c", _TRAMPOLINE, str(os.getpid()), program, *command[1:]]
