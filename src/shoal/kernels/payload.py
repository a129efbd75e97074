"""Nacos gRPC ``Payload`` codec (bytes ⇄ type, headers, client ip, body): the compiled kernel, or
its pure-Python twin.

See :mod:`shoal.kernels.payload_py` for the specification. Both raise the same
:class:`PayloadDecodeError` class (a ``ValueError``), defined in the twin.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shoal.kernels import load
from shoal.kernels.payload_py import PayloadDecodeError

__all__ = ["PayloadDecodeError", "decode", "encode"]

if TYPE_CHECKING:
    from shoal.kernels.payload_py import decode, encode
else:
    _impl = load("payload")
    decode = _impl.decode
    encode = _impl.encode
