"""Client sync batches (bytes in, bytes out): the compiled kernel, or its pure-Python twin.

See :mod:`shoal.kernels.syncser_py` for the specification and the wire format. Both raise the
same :class:`SyncDecodeError` class, defined in :mod:`shoal.kernels.syncser_layout` with the
record shapes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shoal.kernels import load
from shoal.kernels.syncser_layout import ClientRecord, InstanceRecord, ServiceTuple, SplitRecord, SyncDecodeError

__all__ = ["ClientRecord", "InstanceRecord", "ServiceTuple", "SplitRecord", "SyncDecodeError", "decode_batch",
           "encode_batch", "split_batch"]

if TYPE_CHECKING:
    from shoal.kernels.syncser_py import decode_batch, encode_batch, split_batch
else:
    _impl = load("syncser")
    encode_batch = _impl.encode_batch
    decode_batch = _impl.decode_batch
    split_batch = _impl.split_batch
