"""The ``shoal`` parser registers each subcommand's module only when it runs, and says the same
as when every one is registered: ``shoal --help`` lists each with its one-line help."""

from __future__ import annotations

import argparse

import pytest

from shoal.__main__ import _COMMANDS, build_parser, command_of


def _subcommands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:  # type: ignore[type-arg]
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def test_the_listing_is_the_full_parsers() -> None:
    full = build_parser()
    assert build_parser("").format_help() == full.format_help()
    helps = {a.dest: a.help for a in _subcommands(full)._choices_actions}
    assert {name: helps[name] for name in _COMMANDS} == _COMMANDS


@pytest.mark.parametrize("command", ["server", *_COMMANDS])
def test_a_command_gets_its_full_parser(command: str) -> None:
    full = _subcommands(build_parser()).choices[command]
    lazy_parser = build_parser(command)
    assert _subcommands(lazy_parser).choices[command].format_help() == full.format_help()
    assert lazy_parser.format_help() == build_parser().format_help()


def test_the_command_is_the_first_word() -> None:
    assert command_of(["--version"]) == ""
    assert command_of(["-h", "check", "--addr", "x"]) == "check"
    assert command_of(["server", "--port", "1"]) == "server"
