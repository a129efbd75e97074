"""The gRPC peer transport's error texts (a down peer is logged briefly)."""

from __future__ import annotations

from shoal.transport.grpc.peer_client import _short


def test_peer_errors_are_logged_with_their_cause_not_grpcs_whole_text() -> None:
    details = ("failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.3:9000: "
               "Failed to connect to remote host: Connection refused")
    assert _short(details) == "Connection refused"
    assert _short("Socket closed") == "Socket closed"
    assert _short("") == "no detail"
