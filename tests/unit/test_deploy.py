"""The systemd unit shipped with the package starts `shoal server` with flags the CLI accepts."""

from __future__ import annotations

import configparser
import shlex
from importlib.resources import files

from shoal.__main__ import build_parser


def test_the_systemd_unit_runs_a_command_the_cli_accepts() -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read_string(files("shoal").joinpath("deploy/shoal.service").read_text())
    service = unit["Service"]
    argv = shlex.split(service["ExecStart"])
    assert argv[0].endswith("/bin/shoal")
    args = build_parser().parse_args(argv[1:])
    assert args.command == "server" and args.log_format == "json" and args.data_dir == "/var/lib/shoal"
    assert service["KillSignal"] == "SIGTERM" and service["RestartPreventExitStatus"] == "2"
    assert unit["Install"]["WantedBy"] == "multi-user.target"
