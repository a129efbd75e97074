# Stub of the compiled shoal._ext.syncser (ext/syncser.pyx); the spec is shoal.kernels.syncser_py.
from collections.abc import Sequence

from shoal.kernels.syncser_layout import ClientRecord as ClientRecord
from shoal.kernels.syncser_layout import SplitRecord as SplitRecord
from shoal.kernels.syncser_layout import SyncDecodeError as SyncDecodeError

def encode_batch(records: Sequence[ClientRecord]) -> bytes: ...
def decode_batch(data: bytes | bytearray | memoryview) -> list[ClientRecord]: ...
def split_batch(data: bytes | bytearray | memoryview) -> list[SplitRecord]: ...
