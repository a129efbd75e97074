"""codec.ServiceInfoAnswers: the encoded query answer with each answer's lastRefTime written into a
cached Payload is byte for byte the answer encoded from scratch."""

from __future__ import annotations

from shoal.kernels.payload import decode, encode
from shoal.transport.grpc import codec


def _fresh(parts: tuple[bytes, int, bytes]) -> bytes:
    return encode("QueryServiceResponse", codec.ok_service_info(parts))


def test_answers_match_a_fresh_encoding_across_refs_services_and_digit_counts() -> None:
    answers = codec.ServiceInfoAnswers("QueryServiceResponse")
    small = (b'{"name":"a","hosts":[],"lastRefTime":', b',"checksum":"","valid":true}')
    large = (b'{"name":"b","hosts":[' + b'{"ip":"1.2.3.4"},' * 3000 + b'{}],"lastRefTime":', b',"valid":true}')
    for prefix, suffix in (small, large, small):
        for ref in (1764216000123, 1764216000124, 7, 8, 99, 100, 1764216000125, 10**13):
            parts = (prefix, ref, suffix)
            data = answers.answer(parts).data
            assert data == _fresh(parts)
            type_name, _, _, body = decode(data)
            assert type_name == "QueryServiceResponse" and body.endswith(b"%d%s}" % (ref, suffix))


def test_templates_are_bounded_and_dropped_together() -> None:
    answers = codec.ServiceInfoAnswers("QueryServiceResponse", max_bytes=3000)
    for i in range(50):
        parts = (b'{"name":"s%d","hosts":[%s],"lastRefTime":' % (i, b"0," * 400 + b"0"), 1764216000000 + i, b"}")
        assert answers.answer(parts).data == _fresh(parts)
        assert answers._bytes <= 3000
    too_big = (b'{"hosts":[' + b"1," * 2000 + b'1],"lastRefTime":', 5, b"}")
    assert answers.answer(too_big).data == _fresh(too_big)
    assert answers._bytes <= 3000
