"""What the built-in DNS answers (Nacos 3.3's DNS module; docs/protocol.md §8).

One query in wire format → one answer in wire format, with dnspython as the codec. The names
are ``{service}.{suffix}`` (the default group) and ``{service}.{group}.{suffix}``, in the one
namespace of ``nacos.naming.dns.namespace``; the records come from the service layer's read of
the service's instances, keeping only the healthy, enabled ones with a weight above zero.

Weights: A and AAAA answers list every kept address, in a weighted random order drawn afresh
for each query (Efraimidis-Spirakis: an instance of weight w comes first with probability
w / total), so a client that takes the first address spreads its load as Nacos's weighted
selection does. SRV answers carry priority 10 for all and the weight scaled to 1..65535
(``round(weight * 100)``: Nacos weights are 0.01..10000), in the same order; their target is
``<hex ip>.addr.<suffix>`` (the IP's bytes in hex, as Consul does), answered with an A or AAAA
record in the additional section, and resolvable on its own.
"""

from __future__ import annotations

import collections
import ipaddress
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass

import dns.edns
import dns.exception
import dns.flags
import dns.message
import dns.name
import dns.opcode
import dns.rcode
import dns.rdata
import dns.rdataclass
import dns.rdatatype
import dns.rrset

from shoal.config import Config
from shoal.logutil import RateLimitedLog
from shoal.model.instance import InstanceInfo
from shoal.service_layer import NamingService
from shoal.service_layer.dns import DnsReads

log = logging.getLogger(__name__)

#: A UDP answer without EDNS fits in 512 bytes (RFC 1035); with EDNS, in what the client offers,
#: but never more than this (the size DNS flag day 2020 settled on, safe from fragmentation).
UDP_PLAIN = 512
UDP_EDNS_MAX = 1232
TCP_MAX = 65535
SRV_PRIORITY = 10
#: The smallest record an answer can hold (a compressed A record): caps the records built per answer.
MIN_RECORD_BYTES = 16
#: Services whose records are kept built (least recently asked dropped first).
MAX_CACHED = 4096
_ADDR_LABEL = b"addr"


@dataclass(frozen=True, slots=True)
class _Entry:
    """One answerable instance, its records built once per version of the service."""

    weight: float
    address: dns.rdata.Rdata | None  # its A or AAAA record; None for a host name
    srv: dns.rdata.Rdata | None
    target: dns.name.Name | None  # the SRV target when it is an address of ours


@dataclass(frozen=True, slots=True)
class Prepared:
    """An answer built but not encoded yet: ``records`` says how much encoding it needs."""

    response: dns.message.Message
    limit: int
    records: int

    def render(self) -> bytes:
        """The wire form, cut to ``limit`` with TC set when it does not fit; in our weighted
        order, not dnspython's default shuffle of each rrset. Touches no shared state."""
        return self.response.to_wire(max_size=self.limit, prefer_truncation=True, want_shuffle=False)


class DnsResolver:
    """Turns a DNS query into its answer from the naming model (Nacos 3.3 ``DnsServer``'s
    resolution; the names follow ``nacos.naming.dns.*``)."""

    def __init__(self, config: Config, naming: NamingService, rng: random.Random | None = None,
                 serving: Callable[[], bool] = lambda: True) -> None:
        self.reads = DnsReads(naming, config.dns_namespace)
        self.serving = serving
        self.suffix = dns.name.from_text(config.dns_domain_suffix.strip(".") + ".")
        self.group = config.dns_default_group
        self.ttl = config.dns_ttl
        self.rng = rng or random.Random()
        self.garbage = RateLimitedLog(log)
        # per service: the instances tuple the entries were built from, and the entries
        self._entries: collections.OrderedDict[tuple[str, str], tuple[tuple[InstanceInfo, ...], tuple[_Entry, ...]]]
        self._entries = collections.OrderedDict()

    def answer(self, wire: bytes, max_size: int | None) -> bytes | None:
        """The answer to ``wire`` (None: nothing to send: no header, or not a query).
        ``max_size`` None: TCP (65535); else the UDP limit, raised by the client's EDNS size."""
        prepared = self.prepare(wire, max_size)
        return prepared.render() if isinstance(prepared, Prepared) else prepared

    def prepare(self, wire: bytes, max_size: int | None) -> Prepared | bytes | None:
        """:meth:`answer` up to the encoding, which the caller may run off the loop when the
        answer is big (:attr:`Prepared.records`); the reads of the model happen here, on the loop."""
        try:
            query = dns.message.from_wire(wire)
        except Exception as exc:  # dnspython raises many kinds on garbage; all mean "malformed"
            return self._formerr(wire, exc)
        if query.flags & dns.flags.QR:
            return None  # an answer sent to us: never answer an answer (no loops, no reflection)
        if max_size is None:
            limit = TCP_MAX
        elif query.edns >= 0:
            limit = max(UDP_PLAIN, min(query.payload, UDP_EDNS_MAX))
        else:
            limit = max_size
        response = dns.message.make_response(query, our_payload=UDP_EDNS_MAX)
        response.flags |= dns.flags.AA
        response.flags &= ~dns.flags.RA
        if query.opcode() != dns.opcode.QUERY:
            response.set_rcode(dns.rcode.NOTIMP)
        elif len(query.question) != 1:
            response.set_rcode(dns.rcode.FORMERR)
        else:
            # no answer of ``limit`` bytes holds more records than this: build no more (a big
            # service's UDP answer costs what 80 records cost, and is truncated either way)
            self._resolve(query.question[0], response, limit // MIN_RECORD_BYTES + 1)
        records = sum(len(rrset) for rrset in response.answer) + len(response.additional)
        return Prepared(response, limit, records)

    # --- resolution -----------------------------------------------------------------------
    def _resolve(self, question: dns.rrset.RRset, response: dns.message.Message, cap: int) -> None:
        name = question.name
        if question.rdclass not in (dns.rdataclass.IN, dns.rdataclass.ANY) or not name.is_subdomain(self.suffix):
            response.set_rcode(dns.rcode.REFUSED)  # not our zone: we are no recursive resolver
            return
        if not self.serving():
            # starting (loading peers' data or the CP store): an NXDOMAIN now would be cached by
            # resolvers for a name that exists; SERVFAIL makes them retry or ask another node
            response.set_rcode(dns.rcode.SERVFAIL)
            return
        labels = name.relativize(self.suffix).labels
        if name == self.suffix:
            return  # the zone's apex: it exists, with no records of these types (NODATA)
        if len(labels) == 2 and labels[1].lower() == _ADDR_LABEL:
            self._address(name, labels[0], question.rdtype, response)
            return
        entries = self._service_entries(labels)
        if entries is None:
            response.set_rcode(dns.rcode.NXDOMAIN)
            return
        if question.rdtype in (dns.rdatatype.A, dns.rdatatype.AAAA):
            wanted = [e for e in entries if e.address is not None and e.address.rdtype == question.rdtype]
            records = [e.address for e in self._weighted_order(wanted)[:cap] if e.address is not None]
            if records:
                response.answer.append(dns.rrset.from_rdata_list(name, self.ttl, records))
        elif question.rdtype == dns.rdatatype.SRV:
            chosen = self._weighted_order([e for e in entries if e.srv is not None])[:cap]
            if chosen:
                response.answer.append(dns.rrset.from_rdata_list(name, self.ttl,
                                                                 [e.srv for e in chosen if e.srv is not None]))
            seen: set[dns.name.Name] = set()
            for e in chosen:  # each target's address once (two ports of one host share it)
                if e.target is not None and e.address is not None and e.target not in seen:
                    seen.add(e.target)
                    response.additional.append(dns.rrset.from_rdata_list(e.target, self.ttl, [e.address]))
        # any other type: the name exists but has no such records (NOERROR, empty)

    def _service_entries(self, labels: tuple[bytes, ...]) -> tuple[_Entry, ...] | None:
        """The service's answerable instances as records, or None when the name is no service."""
        if len(labels) not in (1, 2):
            return None
        try:
            service = labels[0].decode()
            group = labels[1].decode() if len(labels) == 2 else self.group
        except UnicodeDecodeError:
            return None
        instances = self.reads.answerable(group, service)
        if instances is None:
            return None
        key = (group, service)
        cached = self._entries.pop(key, None)
        if cached is None or cached[0] is not instances:
            cached = (instances, tuple(self._entry(inst) for inst in instances))
        self._entries[key] = cached
        if len(self._entries) > MAX_CACHED:
            self._entries.popitem(last=False)
        return cached[1]

    def _entry(self, inst: InstanceInfo) -> _Entry:
        weight = max(1, min(65535, round(inst.weight * 100)))
        try:
            ip = ipaddress.ip_address(inst.ip)
        except ValueError:  # an instance registered with a host name: SRV points at it
            try:
                host = dns.name.from_text(inst.ip.rstrip(".") + ".")
            except dns.exception.DNSException:
                return _Entry(inst.weight, None, None, None)
            return _Entry(inst.weight, None, _srv(weight, inst.port, host), None)
        target = dns.name.Name((ip.packed.hex().encode(), _ADDR_LABEL)).concatenate(self.suffix)
        return _Entry(inst.weight, _address_rdata(ip), _srv(weight, inst.port, target), target)

    def _weighted_order(self, entries: list[_Entry]) -> list[_Entry]:
        """Weighted random order without replacement (Efraimidis-Spirakis keys u^(1/w))."""
        rnd = self.rng.random
        keyed = sorted(((rnd() ** (1.0 / e.weight), i) for i, e in enumerate(entries)), reverse=True)
        return [entries[i] for _, i in keyed]

    def _address(self, name: dns.name.Name, label: bytes, rdtype: dns.rdatatype.RdataType,
                 response: dns.message.Message) -> None:
        """``<hex ip>.addr.<suffix>``: the address an SRV target names."""
        try:
            ip = ipaddress.ip_address(bytes.fromhex(label.decode("ascii")))
        except (ValueError, UnicodeDecodeError):
            response.set_rcode(dns.rcode.NXDOMAIN)
            return
        if rdtype == _rdtype_of(ip):
            response.answer.append(dns.rrset.from_rdata_list(name, self.ttl, [_address_rdata(ip)]))

    def _formerr(self, wire: bytes, exc: Exception) -> bytes | None:
        """FORMERR for a datagram that has a query's header but no parseable body; nothing for
        one too short to carry an id, or that claims to be an answer."""
        self.garbage.warning("dns-garbage", "malformed DNS message (%d bytes): %s", len(wire), type(exc).__name__)
        if len(wire) < 12 or wire[2] & 0x80:
            return None
        response = dns.message.Message(id=int.from_bytes(wire[:2], "big"))
        response.flags = dns.flags.QR
        response.set_rcode(dns.rcode.FORMERR)
        return response.to_wire()


def _srv(weight: int, port: int, target: dns.name.Name) -> dns.rdata.Rdata | None:
    if not 0 <= port < 65536:
        return None
    return dns.rdata.from_text(dns.rdataclass.IN, dns.rdatatype.SRV, f"{SRV_PRIORITY} {weight} {port} {target}")


def _address_rdata(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> dns.rdata.Rdata:
    return dns.rdata.from_text(dns.rdataclass.IN, _rdtype_of(ip), str(ip))


def _rdtype_of(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> dns.rdatatype.RdataType:
    return dns.rdatatype.A if ip.version == 4 else dns.rdatatype.AAAA
