"""The ip:port handoff (docs/protocol.md §6.3): exactly one node holds each ip:port client
natively — the responsible one once it has it — whatever order members leave, come back and
writes arrive in."""

from __future__ import annotations

from shoal.distro.members import MemberState
from shoal.model.instance import InstanceInfo
from shoal.testing import SVC, SimCluster, SimNode


def _tags_owned_by(cluster: SimCluster, owner: str, count: int) -> list[tuple[str, int]]:
    """``count`` ip:ports whose responsible node is ``owner`` while every member is healthy."""
    found: list[tuple[str, int]] = []
    port = 1
    while len(found) < count:
        if cluster[0].distro.mapper.owner_of(f"10.3.0.1:{port}") == owner:
            found.append(("10.3.0.1", port))
        port += 1
    return found


def _holders(cluster: SimCluster, client_id: str) -> list[str]:
    """The nodes holding ``client_id`` natively."""
    return [n.address for n in cluster.nodes.values()
            if (c := n.clients.get(client_id)) is not None and c.native]


def _register(node: SimNode, ip: str, port: int) -> str:
    return node.naming.ip_port.register(SVC, InstanceInfo(ip, port))


async def test_a_write_handled_by_a_node_not_responsible_is_taken_over_by_the_responsible_one() -> None:
    """What a node handles because the owner did not answer in time reaches the owner, which
    takes it over; the node that handled it keeps a copy of the owner's."""
    cluster = SimCluster(3)
    a, c = cluster[0], cluster[2]
    (ip, port), = _tags_owned_by(cluster, c.address, 1)
    client_id = _register(a, ip, port)
    assert client_id in a.distro.handoff.pending
    await cluster.flush()
    await cluster.flush()
    assert _holders(cluster, client_id) == [c.address]
    for node in (cluster[0], cluster[1]):
        copy = node.clients.get(client_id)
        assert copy is not None and not copy.native and copy.owner == c.address
    assert not a.distro.handoff.pending
    assert all(n.ports() == [port] for n in cluster.nodes.values())


async def test_clients_registered_while_their_owner_was_down_are_handed_to_it_when_it_returns() -> None:
    """Once the owner is back the survivors hand over what they took in meanwhile
    (before, they turned their clients into copies of an owner that never had them)."""
    cluster = SimCluster(3)
    a, b, c = cluster[0], cluster[1], cluster[2]
    tags = _tags_owned_by(cluster, c.address, 6)
    cluster.network.down.add(c.address)
    for node in (a, b):
        node.members.report_failed(c.address, refused=True)
    ids = []
    for ip, port in tags:  # each registered on its owner among the survivors
        owner = a.distro.mapper.owner_of(f"{ip}:{port}")
        ids.append(_register(cluster.nodes[owner], ip, port))
    await cluster.flush()
    assert all(len(_holders(cluster, i)) == 1 and c.address not in _holders(cluster, i) for i in ids)

    cluster.network.down.discard(c.address)
    for node in (a, b):
        node.members.report_succeeded(c.address)  # C is back: the survivors' healthy lists change
    await cluster.flush()
    await cluster.flush()
    for client_id in ids:
        assert _holders(cluster, client_id) == [c.address]
    assert sorted(c.ports()) == sorted(p for _, p in tags)
    assert not a.distro.handoff.pending and not b.distro.handoff.pending


async def test_a_handoff_the_owner_never_received_is_sent_again() -> None:
    cluster = SimCluster(3)
    a, c = cluster[0], cluster[2]
    (ip, port), = _tags_owned_by(cluster, c.address, 1)
    c.distro.sync_receiver.drop_count = 1  # C acknowledges the first batch and loses it
    client_id = _register(a, ip, port)
    await cluster.flush()
    assert c.clients.get(client_id) is None and client_id in a.distro.handoff.pending
    await a.distro.verify_round()  # the periodic round sends pending clients again
    await cluster.flush()
    await cluster.flush()
    assert _holders(cluster, client_id) == [c.address]
    assert not a.distro.handoff.pending


async def test_the_responsible_node_keeps_its_own_client_and_the_other_holder_yields() -> None:
    """Two holders (the owner was slow, then answered): the owner's data wins, and its verify
    turns the other holder's client into a copy."""
    cluster = SimCluster(2)
    a, b = cluster[0], cluster[1]
    (ip, port), = _tags_owned_by(cluster, b.address, 1)
    cluster.network.down.add(b.address)
    client_id = _register(b, ip, port)  # the owner has it; A's sync to it is lost
    _register(a, ip, port)  # A handled a write for it too, meanwhile
    cluster.network.down.discard(b.address)
    await cluster.flush()
    await b.distro.verify_round()
    await cluster.flush()
    assert _holders(cluster, client_id) == [b.address]
    copy = a.clients.get(client_id)
    assert copy is not None and copy.owner == b.address
    assert a.members.peers[b.address].state is MemberState.UP
