"""Which transport the gRPC ports run on (``shoal.remote.transport``) and which client calls peers
(``shoal.cluster.client.transport``), in both kernel modes: the compiled h2grpc / h2client transport
by default, grpc.aio when ``SHOAL_NO_EXTENSIONS`` is set, and a clear ConfigError for a choice that
cannot run here."""

from __future__ import annotations

import dataclasses
import importlib

import pytest

from shoal.config import Config
from shoal.errors import ConfigError
from shoal.kernels import NO_EXTENSIONS
from shoal.transport.selection import (
    GRPCIO,
    NATIVE,
    make_peer_transport,
    native_available,
    native_client_unavailable_reason,
    peer_client_name,
    transport_name,
)


def test_the_default_follows_the_kernel_mode() -> None:
    assert native_available() is not NO_EXTENSIONS
    assert transport_name(Config()) == (GRPCIO if NO_EXTENSIONS else NATIVE)


def test_grpcio_can_always_be_chosen() -> None:
    assert transport_name(dataclasses.replace(Config(), remote_transport=GRPCIO)) == GRPCIO


def test_native_is_refused_clearly_where_it_cannot_run_and_loads_where_it_can() -> None:
    native = dataclasses.replace(Config(), remote_transport=NATIVE)
    if NO_EXTENSIONS:
        with pytest.raises(ConfigError, match="needs the h2grpc extension"):
            transport_name(native)
    else:
        assert transport_name(native) == NATIVE
        assert hasattr(importlib.import_module("shoal._ext.h2grpc"), "H2Session")


def test_an_unknown_transport_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="must be native or grpcio"):
        transport_name(dataclasses.replace(Config(), remote_transport="quic"))


# --- the peer client (shoal.cluster.client.transport) ----------------------------------------------

def _peer_config(choice: str = "") -> Config:
    return Config.load(env={}, overrides={"shoal.cluster.client.transport": choice} if choice else {})


def test_the_peer_client_default_follows_the_kernel_mode() -> None:
    assert (native_client_unavailable_reason() is None) is not NO_EXTENSIONS
    assert peer_client_name(_peer_config()) == (GRPCIO if NO_EXTENSIONS else NATIVE)


async def test_the_chosen_peer_client_is_built() -> None:
    grpcio = make_peer_transport(_peer_config(GRPCIO), "127.0.0.1:8848", None, None)
    assert type(grpcio).__name__ == "GrpcPeerTransport"
    await grpcio.close()
    if NO_EXTENSIONS:
        with pytest.raises(ConfigError, match="needs the h2client extension"):
            make_peer_transport(_peer_config(NATIVE), "127.0.0.1:8848", None, None)
    else:
        native = make_peer_transport(_peer_config(NATIVE), "127.0.0.1:8848", ("k", "v"), None)
        assert type(native).__name__ == "NativePeerTransport"
        await native.close()


def test_an_unknown_peer_client_is_refused_when_the_configuration_loads() -> None:
    with pytest.raises(ConfigError, match=r"shoal\.cluster\.client\.transport must be one of"):
        _peer_config("quic")
