"""TLS material of a node's three ports, read and checked once at startup.

Settings use Nacos's names (``RpcServerTlsConfig``): ``nacos.remote.server.rpc.tls.*`` for the
SDK gRPC port, ``nacos.remote.peer.rpc.tls.*`` for the cluster port and the calls to peers'
cluster ports, and Spring Boot's ``server.ssl.*`` for the HTTP port. Shoal takes PEM files
only. :meth:`NodeTls.load` reads every configured file and proves it usable (the key matches
the certificate, the password opens the key, the CA file holds certificates), so a bad file is
a :class:`~shoal.errors.TlsConfigError` before any port is opened, never a plaintext fallback.

The transports take what they need from a :class:`PortTls`: an :class:`ssl.SSLContext` (the
native gRPC transport, with ALPN ``h2``; aiohttp) or the PEM bytes (grpc.aio's credentials).
"""

from __future__ import annotations

import logging
import ssl
from dataclasses import dataclass
from pathlib import Path

from shoal.config import Config
from shoal.errors import TlsConfigError

log = logging.getLogger(__name__)

SDK_PREFIX = "nacos.remote.server.rpc.tls"
PEER_PREFIX = "nacos.remote.peer.rpc.tls"
HTTP_PREFIX = "server.ssl"
#: gRPC runs over HTTP/2 only: the ALPN protocol both gRPC ports offer.
ALPN_H2 = "h2"


@dataclass(frozen=True)
class TlsSettings:
    """One port's TLS settings, with the property names errors must quote."""

    prefix: str
    cert_chain_file: str
    private_key_file: str
    private_key_password: str
    trust_file: str
    client_auth: str  # none | want | need
    chain_prop: str
    key_prop: str
    password_prop: str
    trust_prop: str

    @property
    def mutual(self) -> bool:
        return self.client_auth == "need"


def sdk_settings(config: Config) -> TlsSettings | None:
    """The SDK gRPC port's settings (None = plaintext)."""
    if not config.rpc_tls_enabled:
        return None
    return _rpc_settings(SDK_PREFIX, config.rpc_tls_cert_chain_file, config.rpc_tls_cert_private_key,
                         config.rpc_tls_cert_private_key_password, config.rpc_tls_trust_collection_cert_file,
                         config.rpc_tls_mutual_auth_enable)


def peer_settings(config: Config) -> TlsSettings | None:
    """The cluster port's settings, also used to call peers (None = plaintext)."""
    if not config.peer_tls_enabled:
        return None
    return _rpc_settings(PEER_PREFIX, config.peer_tls_cert_chain_file, config.peer_tls_cert_private_key,
                         config.peer_tls_cert_private_key_password, config.peer_tls_trust_collection_cert_file,
                         config.peer_tls_mutual_auth_enable)


def http_settings(config: Config) -> TlsSettings | None:
    """The HTTP port's settings (None = plaintext)."""
    if not config.http_tls_on:
        return None
    return TlsSettings(HTTP_PREFIX, config.http_ssl_certificate, config.http_ssl_certificate_private_key,
                       config.http_ssl_key_password, config.http_ssl_trust_certificate,
                       config.http_ssl_client_auth.lower(), "server.ssl.certificate",
                       "server.ssl.certificate-private-key", "server.ssl.key-password",
                       "server.ssl.trust-certificate")


def _rpc_settings(prefix: str, chain: str, key: str, password: str, trust: str, mutual: bool) -> TlsSettings:
    return TlsSettings(prefix, chain, key, password, trust, "need" if mutual else "none",
                       f"{prefix}.certChainFile", f"{prefix}.certPrivateKey", f"{prefix}.certPrivateKeyPassword",
                       f"{prefix}.trustCollectionCertFile")


class PortTls:
    """Checked TLS material of one port: PEM bytes and the SSLContexts built from them."""

    def __init__(self, settings: TlsSettings) -> None:
        self.settings = settings
        self.cert_chain = _read(settings.chain_prop, settings.cert_chain_file)
        self.private_key = _read(settings.key_prop, settings.private_key_file)
        self.trust = _read(settings.trust_prop, settings.trust_file) if settings.trust_file else None
        if b"-----BEGIN CERTIFICATE-----" not in self.cert_chain:
            raise TlsConfigError(f"{settings.chain_prop}: {settings.cert_chain_file} holds no PEM certificate "
                                 "(Shoal takes PEM files, not PKCS12/JKS/DER)")
        if b"PRIVATE KEY-----" not in self.private_key:
            raise TlsConfigError(f"{settings.key_prop}: {settings.private_key_file} holds no PEM private key "
                                 "(Shoal takes PEM files, not PKCS12/JKS/DER)")
        if self.trust is not None and b"-----BEGIN CERTIFICATE-----" not in self.trust:
            raise TlsConfigError(f"{settings.trust_prop}: {settings.trust_file} holds no PEM certificate")
        self.server_context()  # proves the pair (and the CA file) usable now, not at the first handshake

    def describe(self) -> str:
        """``TLS``, with how clients are checked, for the startup log line."""
        return {"need": "TLS, client certificate required", "want": "TLS, client certificate verified if sent"
                }.get(self.settings.client_auth, "TLS")

    def server_context(self, alpn: list[str] | None = None) -> ssl.SSLContext:
        """A server-side context: this port's certificate, client verification as configured."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        self._load_identity(ctx)
        if self.settings.client_auth in ("need", "want"):
            self._load_trust(ctx)
            ctx.verify_mode = ssl.CERT_REQUIRED if self.settings.client_auth == "need" else ssl.CERT_OPTIONAL
        if alpn:
            ctx.set_alpn_protocols(alpn)
        return ctx

    def client_context(self) -> ssl.SSLContext:
        """A client-side context to call a peer's port of the same kind: verifies the peer against the
        trust file (or the system's CAs) and shows this port's certificate, for peers that ask."""
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.trust is not None:
            self._load_trust(ctx)
        self._load_identity(ctx)
        return ctx

    def unencrypted_key(self) -> bytes:
        """The private key as unencrypted PEM (grpc's credentials take no password)."""
        if not self.settings.private_key_password:
            return self.private_key
        try:
            from cryptography.hazmat.primitives import serialization
        except ImportError:
            raise TlsConfigError(f"{self.settings.password_prop}: an encrypted key on a grpc.aio port or for peer "
                                 "calls needs the 'cryptography' package; install it or give an unencrypted "
                                 "key") from None
        key = serialization.load_pem_private_key(self.private_key, self.settings.private_key_password.encode())
        return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption())

    def _load_identity(self, ctx: ssl.SSLContext) -> None:
        s = self.settings
        password = s.private_key_password
        try:
            # a callable, never None: OpenSSL would otherwise prompt on the terminal for an encrypted key
            ctx.load_cert_chain(s.cert_chain_file, s.private_key_file, password=lambda: password)
        except ssl.SSLError as exc:
            hint = f"; is {s.password_prop} right?" if b"ENCRYPTED" in self.private_key else ""
            raise TlsConfigError(f"{s.chain_prop} / {s.key_prop}: {s.cert_chain_file} and {s.private_key_file} "
                                 f"are not a usable certificate and key ({exc.reason or exc}{hint})") from None
        except OSError as exc:
            raise TlsConfigError(f"{s.chain_prop} / {s.key_prop}: cannot read {exc.filename}: "
                                 f"{exc.strerror}") from None

    def _load_trust(self, ctx: ssl.SSLContext) -> None:
        s = self.settings
        if self.trust is None:
            return
        try:
            ctx.load_verify_locations(cadata=self.trust.decode("ascii", "replace"))
        except ssl.SSLError as exc:
            raise TlsConfigError(f"{s.trust_prop}: {s.trust_file} holds no usable CA certificate "
                                 f"({exc.reason or exc})") from None


@dataclass(frozen=True)
class NodeTls:
    """The TLS material of a node's ports; None where a port is plaintext."""

    sdk: PortTls | None
    peer: PortTls | None
    http: PortTls | None

    @classmethod
    def load(cls, config: Config) -> NodeTls:
        """Read and check every configured file; TlsConfigError (a ConfigError) names the first bad one."""
        sdk, peer, http = sdk_settings(config), peer_settings(config), http_settings(config)
        return cls(PortTls(sdk) if sdk else None, PortTls(peer) if peer else None,
                   PortTls(http) if http else None)


def describe(port_tls: PortTls | None) -> str:
    """``plaintext`` or the port's TLS mode, for the per-port startup log line."""
    return "plaintext" if port_tls is None else port_tls.describe()


def _read(prop: str, path: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise TlsConfigError(f"{prop}: cannot read {path}: {exc.strerror}") from None
    if not data.strip():
        raise TlsConfigError(f"{prop}: {path} is empty")
    return data

