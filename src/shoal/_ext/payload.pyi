# Stub of the compiled shoal._ext.payload (ext/payload.pyx); the spec is shoal.kernels.payload_py.
from collections.abc import Mapping

from shoal.kernels.payload_py import PayloadDecodeError as PayloadDecodeError

def decode(data: bytes | bytearray | memoryview) -> tuple[str, dict[str, str], str, bytes]: ...
def encode(
    type: str,
    body: bytes | bytearray | memoryview,
    headers: Mapping[str, str] | None = None,
    client_ip: str = "",
) -> bytes: ...
