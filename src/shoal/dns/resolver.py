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

import ipaddress
import logging
import random
from typing import Any

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
from shoal.errors import NacosError
from shoal.logutil import RateLimitedLog
from shoal.model.keys import ServiceKey, normalise_namespace
from shoal.service_layer import NamingService

log = logging.getLogger(__name__)

#: A UDP answer without EDNS fits in 512 bytes (RFC 1035); with EDNS, in what the client offers,
#: but never more than this (the size DNS flag day 2020 settled on, safe from fragmentation).
UDP_PLAIN = 512
UDP_EDNS_MAX = 1232
TCP_MAX = 65535
SRV_PRIORITY = 10
_ADDR_LABEL = b"addr"


class DnsResolver:
    """Turns a DNS query into its answer from the naming model (Nacos 3.3 ``DnsServer``'s
    resolution; the names follow ``nacos.naming.dns.*``)."""

    def __init__(self, config: Config, naming: NamingService, rng: random.Random | None = None) -> None:
        self.naming = naming
        self.suffix = dns.name.from_text(config.dns_domain_suffix.strip(".") + ".")
        self.group = config.dns_default_group
        self.namespace = normalise_namespace(config.dns_namespace)
        self.ttl = config.dns_ttl
        self.rng = rng or random.Random()
        self.garbage = RateLimitedLog(log)

    def answer(self, wire: bytes, max_size: int | None) -> bytes | None:
        """The answer to ``wire`` (None: nothing to send: no header, or not a query).
        ``max_size`` None: TCP (65535); else the UDP limit, raised by the client's EDNS size."""
        try:
            query = dns.message.from_wire(wire)
        except Exception as exc:  # dnspython raises many kinds on garbage; all mean "malformed"
            return self._formerr(wire, exc)
        if query.flags & dns.flags.QR:
            return None  # an answer sent to us: never answer an answer (no loops, no reflection)
        response = dns.message.make_response(query, our_payload=UDP_EDNS_MAX)
        response.flags |= dns.flags.AA
        response.flags &= ~dns.flags.RA
        if query.opcode() != dns.opcode.QUERY:
            response.set_rcode(dns.rcode.NOTIMP)
        elif len(query.question) != 1:
            response.set_rcode(dns.rcode.FORMERR)
        else:
            self._resolve(query.question[0], response)
        if max_size is None:
            limit = TCP_MAX
        elif query.edns >= 0:
            limit = max(UDP_PLAIN, min(query.payload, UDP_EDNS_MAX))
        else:
            limit = max_size
        # our weighted order, not dnspython's default shuffle of each rrset
        return response.to_wire(max_size=limit, prefer_truncation=True, want_shuffle=False)

    # --- resolution -----------------------------------------------------------------------
    def _resolve(self, question: dns.rrset.RRset, response: dns.message.Message) -> None:
        name = question.name
        if question.rdclass not in (dns.rdataclass.IN, dns.rdataclass.ANY) or not name.is_subdomain(self.suffix):
            response.set_rcode(dns.rcode.REFUSED)  # not our zone: we are no recursive resolver
            return
        labels = name.relativize(self.suffix).labels
        if name == self.suffix:
            return  # the zone's apex: it exists, with no records of these types (NODATA)
        if len(labels) == 2 and labels[1].lower() == _ADDR_LABEL:
            self._address(name, labels[0], question.rdtype, response)
            return
        instances = self._instances(labels)
        if instances is None:
            response.set_rcode(dns.rcode.NXDOMAIN)
            return
        ordered = self._weighted_order(instances)
        if question.rdtype in (dns.rdatatype.A, dns.rdatatype.AAAA):
            rrset = response.find_rrset(response.answer, name, dns.rdataclass.IN, question.rdtype, create=True)
            for inst in ordered:
                ip = _ip(inst)
                if ip is not None and _rdtype_of(ip) == question.rdtype:
                    rrset.add(dns.rdata.from_text(dns.rdataclass.IN, question.rdtype, str(ip)), self.ttl)
            if not rrset:
                response.answer.remove(rrset)
        elif question.rdtype == dns.rdatatype.SRV:
            self._srv(name, ordered, response)
        # any other type: the name exists but has no such records (NOERROR, empty)

    def _instances(self, labels: tuple[bytes, ...]) -> list[dict[str, Any]] | None:
        """The service's answerable instances, or None when the name is no service."""
        if len(labels) not in (1, 2):
            return None
        try:
            service = labels[0].decode()
            group = labels[1].decode() if len(labels) == 2 else self.group
        except UnicodeDecodeError:
            return None
        key = ServiceKey(self.namespace, group, service)
        try:
            if not self.naming.service_exists(key):
                return None
            found = self.naming.service_instances(key, healthy_only=True)
        except NacosError:  # a name the service layer refuses (bad characters) is no service
            return None
        return [inst for inst in found if inst.get("enabled", True) and float(inst.get("weight", 1.0)) > 0]

    def _weighted_order(self, instances: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Weighted random order without replacement (Efraimidis-Spirakis keys u^(1/w))."""
        keyed = [(self.rng.random() ** (1.0 / float(inst.get("weight", 1.0))), i) for i, inst in enumerate(instances)]
        keyed.sort(reverse=True)
        return [instances[i] for _, i in keyed]

    def _srv(self, name: dns.name.Name, ordered: list[dict[str, Any]], response: dns.message.Message) -> None:
        srv = response.find_rrset(response.answer, name, dns.rdataclass.IN, dns.rdatatype.SRV, create=True)
        for inst in ordered:
            ip = _ip(inst)
            if ip is not None:
                target = dns.name.Name((ip.packed.hex().encode(), _ADDR_LABEL)).concatenate(self.suffix)
                extra = response.find_rrset(response.additional, target, dns.rdataclass.IN, _rdtype_of(ip),
                                            create=True)
                extra.add(dns.rdata.from_text(dns.rdataclass.IN, _rdtype_of(ip), str(ip)), self.ttl)
            else:  # an instance registered with a host name: point at it
                try:
                    target = dns.name.from_text(str(inst.get("ip", "")).rstrip(".") + ".")
                except dns.exception.DNSException:
                    continue
            weight = max(1, min(65535, round(float(inst.get("weight", 1.0)) * 100)))
            srv.add(dns.rdata.from_text(dns.rdataclass.IN, dns.rdatatype.SRV,
                                        f"{SRV_PRIORITY} {weight} {int(inst.get('port', 0))} {target}"), self.ttl)
        if not srv:
            response.answer.remove(srv)

    def _address(self, name: dns.name.Name, label: bytes, rdtype: dns.rdatatype.RdataType,
                 response: dns.message.Message) -> None:
        """``<hex ip>.addr.<suffix>``: the address an SRV target names."""
        try:
            ip = ipaddress.ip_address(bytes.fromhex(label.decode("ascii")))
        except (ValueError, UnicodeDecodeError):
            response.set_rcode(dns.rcode.NXDOMAIN)
            return
        if rdtype == _rdtype_of(ip):
            rrset = response.find_rrset(response.answer, name, dns.rdataclass.IN, rdtype, create=True)
            rrset.add(dns.rdata.from_text(dns.rdataclass.IN, rdtype, str(ip)), self.ttl)

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


def _ip(inst: dict[str, Any]) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(str(inst.get("ip", "")))
    except ValueError:
        return None


def _rdtype_of(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> dns.rdatatype.RdataType:
    return dns.rdatatype.A if ip.version == 4 else dns.rdatatype.AAAA
