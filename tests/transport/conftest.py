"""The compiled gRPC transport: the server session (``shoal._ext.h2grpc``) in memory, and the peer
client (``shoal._ext.h2client``) against real cluster ports on loopback.

It has no pure-Python twin of its own: with ``SHOAL_NO_EXTENSIONS=1`` the node runs its gRPC ports
(and calls its peers) on grpc.aio instead (``tests/unit/test_transport_selection.py``), and the
real-process suite runs on both transports. So this folder is not part of the pure-Python pass
(``ci/test.sh``), and a run with the variable set does not collect it.
"""

from shoal.kernels import NO_EXTENSIONS

collect_ignore_glob = ["test_*.py"] if NO_EXTENSIONS else []
