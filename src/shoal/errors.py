"""Typed errors carrying Nacos error codes: the one error vocabulary of the server.

Domain code raises these; only the transports turn them into wire responses (gRPC
ErrorResponse / typed response, HTTP status + body), and they do it by reading class
attributes, as aiokafka's ``errors.py`` does: every error class carries

* ``code`` — the Nacos code (com.alibaba.nacos.api.exception.NacosException constants),
  sent as the gRPC ``errorCode``;
* ``http_status`` — the HTTP status of every Open API generation;
* ``v2_code`` — the ``code`` of a v2 answer (API/model/v2/ErrorCode.java), whose text is
  :data:`V2_TEXT`;
* ``default_message`` — the message when none is given (where Nacos has a fixed one);
* ``retry_after_s`` — the ``Retry-After`` header of an HTTP answer, when there is one.

Every status and code number of the server lives in this module.
"""

from __future__ import annotations

from enum import IntEnum
from typing import ClassVar


class Code(IntEnum):
    """Nacos error codes (NacosException constants)."""

    CLIENT_DISCONNECT = -401
    CLIENT_ERROR = -500
    SUCCESS = 200
    INVALID_SERVER_STATUS = 300
    UN_REGISTER = 301
    NO_HANDLER = 302
    INVALID_PARAM = 400
    NO_RIGHT = 403
    NOT_FOUND = 404
    CONFLICT = 409
    TOO_MANY_REQUESTS = 429
    SERVER_ERROR = 500
    BAD_GATEWAY = 502
    OVER_THRESHOLD = 503
    SERVER_NOT_IMPLEMENTED = 501
    FUZZY_WATCH_PATTERN_OVER_LIMIT = 50310  # v2 ErrorCode, also the errorCode of NamingFuzzyWatchResponse
    FUZZY_WATCH_PATTERN_MATCH_COUNT_OVER_LIMIT = 50311


class HttpStatus(IntEnum):
    """The HTTP statuses the Open API answers with."""

    OK = 200
    BAD_REQUEST = 400
    FORBIDDEN = 403
    NOT_FOUND = 404
    CONFLICT = 409
    PAYLOAD_TOO_LARGE = 413
    TOO_MANY_REQUESTS = 429
    INTERNAL_SERVER_ERROR = 500
    NOT_IMPLEMENTED = 501
    BAD_GATEWAY = 502
    SERVICE_UNAVAILABLE = 503


class V2Code(IntEnum):
    """Nacos v2 Open API ErrorCode (API/model/v2/ErrorCode.java); 0 is success."""

    SUCCESS = 0
    PARAMETER_MISSING = 10000
    ACCESS_DENIED = 10001
    PARAMETER_VALIDATE_ERROR = 20002
    RESOURCE_NOT_FOUND = 20004
    RESOURCE_CONFLICT = 20005
    WEIGHT_ERROR = 21001
    INSTANCE_NOT_FOUND = 21003
    SERVICE_ALREADY_EXIST = 21007
    SERVICE_NOT_EXIST = 21008
    SERVICE_DELETE_FAILURE = 21009
    ILLEGAL_NAMESPACE = 22000
    NAMESPACE_NOT_EXIST = 22001
    NAMESPACE_ALREADY_EXIST = 22002
    SERVER_ERROR = 30000
    API_FUNCTION_DISABLED = 40001
    FUZZY_WATCH_PATTERN_OVER_LIMIT = 50310
    FUZZY_WATCH_PATTERN_MATCH_COUNT_OVER_LIMIT = 50311


#: The ``message`` of a v2 answer for each ErrorCode (ErrorCode.getMsg()).
V2_TEXT: dict[int, str] = {
    V2Code.SUCCESS: "success",
    V2Code.PARAMETER_MISSING: "parameter missing",
    V2Code.ACCESS_DENIED: "access denied",
    V2Code.PARAMETER_VALIDATE_ERROR: "parameter validate error",
    V2Code.RESOURCE_NOT_FOUND: "resource not found",
    V2Code.RESOURCE_CONFLICT: "resource conflict",
    V2Code.WEIGHT_ERROR: "weight error",
    V2Code.INSTANCE_NOT_FOUND: "instance not found",
    V2Code.SERVICE_ALREADY_EXIST: "service already exist",
    V2Code.SERVICE_NOT_EXIST: "service not exist",
    V2Code.SERVICE_DELETE_FAILURE: "service delete failure",
    V2Code.ILLEGAL_NAMESPACE: "illegal namespace",
    V2Code.NAMESPACE_NOT_EXIST: "namespace not exist",
    V2Code.NAMESPACE_ALREADY_EXIST: "namespace already exist",
    V2Code.SERVER_ERROR: "server error",
    V2Code.API_FUNCTION_DISABLED: "API function disabled.",
    V2Code.FUZZY_WATCH_PATTERN_OVER_LIMIT: "fuzzy watch pattern over limit",
    V2Code.FUZZY_WATCH_PATTERN_MATCH_COUNT_OVER_LIMIT: "fuzzy watch pattern matched count over limit",
}


class BeatCode(IntEnum):
    """The ``code`` of a client beat answer (NamingResponseCode); the answer itself is a 200."""

    OK = 10200
    RESOURCE_NOT_FOUND = 20404


class GrpcStatus(IntEnum):
    """The gRPC status codes a transport ends a call or a stream with (grpc/status.h)."""

    OK = 0
    INVALID_ARGUMENT = 3
    RESOURCE_EXHAUSTED = 8
    INTERNAL = 13
    UNAVAILABLE = 14


class NacosError(Exception):
    """An error with a Nacos code; ``str()`` is the message sent to the client.

    Subclasses set the class attributes below; transports read them and nothing else.
    ``code`` may be overridden per instance for the few places that relay a peer's code.
    """

    code: int = Code.SERVER_ERROR
    http_status: ClassVar[int] = HttpStatus.INTERNAL_SERVER_ERROR
    v2_code: ClassVar[int] = V2Code.SERVER_ERROR
    default_message: ClassVar[str] = ""
    retry_after_s: ClassVar[int | None] = None

    def __init__(self, message: str | None = None, code: int | None = None) -> None:
        super().__init__(self.default_message if message is None else message)
        if code is not None:
            self.code = code

    @property
    def message(self) -> str:
        """The detail message sent to the client."""
        return str(self.args[0]) if self.args else ""

    @property
    def v2_text(self) -> str:
        """The v2 answer's ``message``: the text of ``v2_code``."""
        return V2_TEXT.get(self.v2_code, "error")


class InvalidParam(NacosError):
    """A request field is missing, malformed or out of range (400)."""

    code = Code.INVALID_PARAM
    http_status = HttpStatus.BAD_REQUEST
    v2_code = V2Code.PARAMETER_VALIDATE_ERROR


class MissingParam(InvalidParam):
    """A required parameter is absent or blank (v2: 10000 PARAMETER_MISSING)."""

    v2_code = V2Code.PARAMETER_MISSING

    def __init__(self, name: str) -> None:
        super().__init__(f"Param '{name}' is required.")
        self.param = name


class WeightError(InvalidParam):
    """An instance weight outside 0.0–10000.0 (v2: 21001 WEIGHT_ERROR)."""

    v2_code = V2Code.WEIGHT_ERROR
    default_message = "instance format invalid: The weights range from 0.0 to 10000.0"


class ServiceAlreadyExists(InvalidParam):
    """Creating a service that exists (v2: 21007 SERVICE_ALREADY_EXIST)."""

    v2_code = V2Code.SERVICE_ALREADY_EXIST


class UnknownService(InvalidParam):
    """A write names a service that does not exist (400; v2: 21008 SERVICE_NOT_EXIST)."""

    v2_code = V2Code.SERVICE_NOT_EXIST


class ServiceNotEmpty(InvalidParam):
    """Deleting a service that still has instances (v2: 21009 SERVICE_DELETE_FAILURE)."""

    v2_code = V2Code.SERVICE_DELETE_FAILURE


class ParamCheckFailed(InvalidParam):
    """Nacos's parameter-checker filter refused the request.

    Answered typed as the handler's own response with resultCode 500 / errorCode 400 and a
    ``Param check invalid:`` prefix, exactly as RemoteParamCheckFilter does.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(f"Param check invalid:{reason}")


class IllegalNamespace(InvalidParam):
    """A namespace id or name that breaks Nacos's rules (NamespaceControllerV2: 400, ILLEGAL_NAMESPACE)."""

    v2_code = V2Code.ILLEGAL_NAMESPACE


class NamespaceNotExist(NacosError):
    """A namespace id that is not there (NamespaceOperationService.getNamespace: 404, NAMESPACE_NOT_EXIST)."""

    code = Code.NOT_FOUND
    http_status = HttpStatus.NOT_FOUND
    v2_code = V2Code.NAMESPACE_NOT_EXIST


class NamespaceAlreadyExist(NacosError):
    """Creating a namespace id that exists. Nacos answers this one with HTTP 500
    (NamespaceOperationService.createNamespace: INTERNAL_SERVER_ERROR, NAMESPACE_ALREADY_EXIST)."""

    code = Code.CONFLICT
    http_status = HttpStatus.INTERNAL_SERVER_ERROR
    v2_code = V2Code.NAMESPACE_ALREADY_EXIST


class ClientDisconnected(NacosError):
    """The naming client for the connection does not exist (-401)."""

    code = Code.CLIENT_DISCONNECT


class Unregistered(NacosError):
    """The connection has not completed ConnectionSetup, or was already removed (301)."""

    code = Code.UN_REGISTER
    default_message = "Connection is unregistered."


class NoHandler(NacosError):
    """No handler for the request type (302)."""

    code = Code.NO_HANDLER
    default_message = "RequestHandler Not Found"


class ServerStarting(NacosError):
    """The node is not serving yet (300)."""

    code = Code.INVALID_SERVER_STATUS
    default_message = "Server is starting,please try later."


class BadRequestBody(NacosError):
    """The payload body is not valid JSON for its declared type (502, as Nacos answers)."""

    code = Code.BAD_GATEWAY
    http_status = HttpStatus.BAD_GATEWAY


class BadVerifyMessage(BadRequestBody):
    """A Distro verify message (request or answer) that does not have its wire shape, or speaks
    another verify wire version (docs/protocol.md §6.8): 502 like any body without its shape."""


class PayloadTooLarge(InvalidParam):
    """An HTTP request body over ``nacos.remote.server.grpc.maxinbound.message.size`` (413, as the
    servlet container answers before Nacos sees the request)."""

    http_status = HttpStatus.PAYLOAD_TOO_LARGE


class ForwardFailed(NacosError):
    """The node responsible for an ``ip:port`` could not be reached (HTTP 502)."""

    code = Code.BAD_GATEWAY
    http_status = HttpStatus.BAD_GATEWAY


class Forbidden(NacosError):
    """Authentication or permission failure (403; v2: 10001 ACCESS_DENIED)."""

    code = Code.NO_RIGHT
    http_status = HttpStatus.FORBIDDEN
    v2_code = V2Code.ACCESS_DENIED


class NotFound(NacosError):
    """A named resource does not exist (404; v2: 20004 RESOURCE_NOT_FOUND)."""

    code = Code.NOT_FOUND
    http_status = HttpStatus.NOT_FOUND
    v2_code = V2Code.RESOURCE_NOT_FOUND


class ServiceNotFound(NotFound):
    """A read names a service that does not exist (404; v2: 21008 SERVICE_NOT_EXIST)."""

    v2_code = V2Code.SERVICE_NOT_EXIST


class Conflict(NacosError):
    """The resource exists in a state that forbids the request (409; v2: 20005)."""

    code = Code.CONFLICT
    http_status = HttpStatus.CONFLICT
    v2_code = V2Code.RESOURCE_CONFLICT


class TooManyRequests(NacosError):
    """A caller was refused for a while (429, with ``Retry-After``)."""

    code = Code.TOO_MANY_REQUESTS
    http_status = HttpStatus.TOO_MANY_REQUESTS
    retry_after_s = 60


class OverThreshold(NacosError):
    """A limit was hit (503)."""

    code = Code.OVER_THRESHOLD
    http_status = HttpStatus.SERVICE_UNAVAILABLE


class FuzzyWatchPatternOverLimit(NacosError):
    """A new fuzzy-watch pattern would exceed ``nacos.naming.fuzzy.watch.max.pattern.count``
    (Nacos ErrorCode.FUZZY_WATCH_PATTERN_OVER_LIMIT, NamingFuzzyWatchContextService)."""

    code = Code.FUZZY_WATCH_PATTERN_OVER_LIMIT
    http_status = HttpStatus.SERVICE_UNAVAILABLE
    v2_code = V2Code.FUZZY_WATCH_PATTERN_OVER_LIMIT
    default_message = "fuzzy watch pattern over limit"


class FuzzyWatchMatchOverLimit(NacosError):
    """A fuzzy-watch pattern matches at least ``...max.pattern.match.service.count`` services;
    the watch is kept but further matches are not reported (Nacos
    ErrorCode.FUZZY_WATCH_PATTERN_MATCH_COUNT_OVER_LIMIT, NamingFuzzyWatchRequestHandler)."""

    code = Code.FUZZY_WATCH_PATTERN_MATCH_COUNT_OVER_LIMIT
    http_status = HttpStatus.SERVICE_UNAVAILABLE
    v2_code = V2Code.FUZZY_WATCH_PATTERN_MATCH_COUNT_OVER_LIMIT
    default_message = "fuzzy watch pattern matched count over limit"


class FunctionDisabled(NacosError):
    """A Nacos route whose function this node does not have (Raft operations, runtime member
    list edits, the config module): HTTP 501 with v2 code 40001, as Nacos's noop handlers answer
    a disabled module (ConfigNoopHandler, McpNoopHandler)."""

    code = Code.SERVER_NOT_IMPLEMENTED
    http_status = HttpStatus.NOT_IMPLEMENTED
    v2_code = V2Code.API_FUNCTION_DISABLED


class CpUnavailable(NacosError):
    """The CP store cannot take a write now: no quorum, no reachable endpoint, or it timed out.

    Answered 503 (as Nacos answers when its Raft group has no leader); the message names the
    cause. Reads served from the node's local CP view, and all AP traffic, go on meanwhile.
    """

    code = Code.OVER_THRESHOLD
    http_status = HttpStatus.SERVICE_UNAVAILABLE
    v2_code = V2Code.SERVER_ERROR
    default_message = "CP store unavailable: no quorum"


class ConfigError(ValueError):
    """Configuration is invalid; raised by Config.validate() and the loaders."""


class TlsConfigError(ConfigError):
    """A TLS setting names a file that is missing, unreadable, not PEM, or not a usable
    certificate/key/CA: the node refuses to start (exit 2) rather than serve plaintext."""


class PushGone(Exception):
    """A push target's connection no longer exists (raised by the SDK transport, counted as done by push)."""
