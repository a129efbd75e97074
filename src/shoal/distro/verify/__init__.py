"""Revision verify with digests, both sides (Nacos DistroVerifyTimedTask, redesigned on the wire).

Nacos sends one VERIFY request per client per peer every 5 s. Here the owner sends each peer
one request carrying a 64-bit digest per bucket of its clients (verify kernel: FNV-1a bucket of
the id, order-independent sum of mixed (id, revision)), about 256 clients per bucket. The peer
compares with the digests of the copies it holds from that owner, renews every client in the
agreeing buckets and names the others. A round in which everything agrees is one small request
per peer whatever the client count. Semantics are Nacos's for what agrees or differs: same
revision renews, missing or different is repaired by a re-send. Unlike Nacos, a copy of a client
the owner no longer has at all is removed within the round (docs/protocol.md §6.5), so a peer
that was away while clients went does not list them until they expire.

The detail phase (mismatched buckets only), wire version
:data:`~shoal.kernels.verify_layout.VERSION`:

1. When the mismatched buckets hold many clients, the owner first sends ``k`` 32-bit
   sub-digests per mismatched bucket (sub-bucket ``(fnv // n) % k``; ``k`` from the estimated
   differences per bucket) and the peer names the mismatched sub-buckets;
2. the owner sends, for every named (sub-)bucket, the salted 32-bit values of its clients there
   (none, when it holds none); the peer builds sorted 64-bit keys ``sub-bucket << 32 | value``
   for both sides and diffs them with the verify kernel. It renews the clients that match and
   answers the owner's keys it lacks and the copies it holds that match none (id, revision);
3. the owner re-sends exactly the clients the peer lacks (ADD, no delay), and asks it to remove
   the copies of clients the owner does not hold at all; the peer removes each only if it is
   still that owner's copy at the revision it named.

Sub-digests and values are salted per round, so a 32-bit collision can hide a difference for
one round at most. Heavy steps yield to the event loop every :data:`~.index.CHUNK` clients.

The modules, by concern: :mod:`.wire` (the messages: one encoder and one parser each),
:mod:`.index` (the digests kept on change, lazy renewal), :mod:`.receiver` (the peer's side),
:mod:`.sender` (the owner's side and its counters). The constants the cluster simulator shares
are in :mod:`shoal.kernels.verify_layout`.
"""

from shoal.distro.verify.index import SELF, DigestIndex, digest_term
from shoal.distro.verify.receiver import VerifyReceiver
from shoal.distro.verify.sender import VerifyOutcome, VerifySender, VerifyStats, responsible_revisions
from shoal.distro.verify.wire import (
    DETAIL_REQUEST,
    DIGEST_REQUEST,
    REMOVE_REQUEST,
    REQUESTS,
    SUB_REQUEST,
    digest_request,
    parse_digest_request,
)
from shoal.kernels.verify_layout import CLIENTS_PER_BUCKET, MAX_BUCKETS, VERSION, bucket_count

__all__ = [
    "CLIENTS_PER_BUCKET", "DETAIL_REQUEST", "DIGEST_REQUEST", "MAX_BUCKETS", "REMOVE_REQUEST", "REQUESTS", "SELF",
    "SUB_REQUEST", "VERSION", "DigestIndex", "VerifyOutcome", "VerifyReceiver", "VerifySender", "VerifyStats",
    "bucket_count", "digest_request", "digest_term", "parse_digest_request", "responsible_revisions",
]
