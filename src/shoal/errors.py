"""Typed errors carrying Nacos error codes.

Domain code raises these; only the transports turn them into wire responses (gRPC
ErrorResponse / typed response, HTTP status + body). Codes follow
com.alibaba.nacos.api.exception.NacosException.
"""

from __future__ import annotations

from enum import IntEnum


class Code(IntEnum):
    """Nacos error codes (NacosException constants)."""

    CLIENT_DISCONNECT = -401
    CLIENT_ERROR = -500
    INVALID_SERVER_STATUS = 300
    UN_REGISTER = 301
    NO_HANDLER = 302
    INVALID_PARAM = 400
    NO_RIGHT = 403
    NOT_FOUND = 404
    CONFLICT = 409
    SERVER_ERROR = 500
    BAD_GATEWAY = 502
    OVER_THRESHOLD = 503


class NacosError(Exception):
    """An error with a Nacos code; ``str()`` is the message sent to the client."""

    code: int = Code.SERVER_ERROR

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class InvalidParam(NacosError):
    """A request field is missing, malformed or out of range (400)."""

    code = Code.INVALID_PARAM


class ParamCheckFailed(InvalidParam):
    """Nacos's parameter-checker filter refused the request.

    Answered typed as the handler's own response with resultCode 500 / errorCode 400 and a
    ``Param check invalid:`` prefix, exactly as RemoteParamCheckFilter does.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(f"Param check invalid:{reason}")


class ClientDisconnected(NacosError):
    """The naming client for the connection does not exist (-401)."""

    code = Code.CLIENT_DISCONNECT


class Unregistered(NacosError):
    """The connection has not completed ConnectionSetup, or was already removed (301)."""

    code = Code.UN_REGISTER

    def __init__(self, message: str = "Connection is unregistered.") -> None:
        super().__init__(message)


class NoHandler(NacosError):
    """No handler for the request type (302)."""

    code = Code.NO_HANDLER

    def __init__(self, message: str = "RequestHandler Not Found") -> None:
        super().__init__(message)


class ServerStarting(NacosError):
    """The node is not serving yet (300)."""

    code = Code.INVALID_SERVER_STATUS

    def __init__(self, message: str = "Server is starting,please try later.") -> None:
        super().__init__(message)


class BadRequestBody(NacosError):
    """The payload body is not valid JSON for its declared type (502, as Nacos answers)."""

    code = Code.BAD_GATEWAY


class Forbidden(NacosError):
    """Authentication or permission failure (403)."""

    code = Code.NO_RIGHT


class NotFound(NacosError):
    """A named resource does not exist (404)."""

    code = Code.NOT_FOUND


class OverThreshold(NacosError):
    """A limit was hit (503)."""

    code = Code.OVER_THRESHOLD


class ConfigError(ValueError):
    """Configuration is invalid; raised by Config.validate() and the loaders."""


class PushGone(Exception):
    """A push target's connection no longer exists (raised by the SDK transport, counted as done by push)."""
