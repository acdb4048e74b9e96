"""The cluster membership cases of the catalog conformance suite (inherited by
:class:`gpufeed.testing.catalog.CatalogTests`; kept apart so each module stays one size).

They cover what the heartbeat worker and ``gpufeed admin cluster status``
rest on: a registration read back with every field, heartbeats that move
the time and bytes, a node id that a second live process cannot take (a
copied data folder) but a restart from the same folder, or any process once
the holder has expired, can; a clean leave; and clusters kept apart. No case
waits for time to pass: an expiry of 0 s stands for "long ago".
"""

from __future__ import annotations

import pytest

from ..engine._membership import NodeClaim
from ..engine.catalog import Catalog
from ..errors import NodeIdInUse

__all__ = ["MembershipCatalogTests"]

_HOUR_S = 3600.0


def _claim(node_id: str = "n1", incarnation: str = "i1", *, cluster: str = "c1", machine: str = "m1",
           data_dir: str = "/d1", s3_port: int = 9000) -> NodeClaim:
    return NodeClaim(cluster, node_id, "10.0.0.1", s3_port, 9400, incarnation, machine, data_dir)


class MembershipCatalogTests:
    """Membership behaviour every catalog shares (uses the ``catalog`` fixture)."""

    def test_register_reads_back_every_field(self, catalog: Catalog) -> None:
        info = catalog.membership.register(_claim(), expiry_s=_HOUR_S, bytes_stored=123)
        assert (info.cluster, info.node_id, info.host, info.s3_port, info.wire_port) == (
            "c1", "n1", "10.0.0.1", 9000, 9400)
        assert info.state == "up" and info.bytes_stored == 123 and info.started_at == info.heartbeat_at
        [listed] = catalog.membership.nodes("c1")
        assert listed.node_id == "n1" and listed.started_at == info.started_at and listed.bytes_stored == 123
        assert 0 <= listed.age_s < 60 and listed.live(_HOUR_S) and not listed.live(0)

    def test_heartbeat_moves_time_and_bytes(self, catalog: Catalog) -> None:
        first = catalog.membership.register(_claim(), expiry_s=_HOUR_S)
        assert catalog.membership.heartbeat(_claim(), 4096)
        [after] = catalog.membership.nodes("c1")
        assert after.heartbeat_at >= first.heartbeat_at and after.started_at == first.started_at
        assert after.bytes_stored == 4096

    def test_a_live_id_is_not_taken_by_another_folder(self, catalog: Catalog) -> None:
        m = catalog.membership
        m.register(_claim(), expiry_s=_HOUR_S)
        for copy in (_claim(incarnation="i2", data_dir="/copy"), _claim(incarnation="i2", machine="m2"),
                     _claim(incarnation="i2", machine="", data_dir="")):
            with pytest.raises(NodeIdInUse, match=r"node id n1 of cluster 'c1' is held by a live member at "
                                                  r"10\.0\.0\.1:9000"):
                m.register(copy, expiry_s=_HOUR_S)
        assert m.heartbeat(_claim(), 1)  # the holder is untouched

    def test_a_restart_from_the_same_folder_takes_its_id_over(self, catalog: Catalog) -> None:
        m = catalog.membership
        m.register(_claim(), expiry_s=_HOUR_S)
        again = m.register(_claim(incarnation="i2", s3_port=9100), expiry_s=_HOUR_S)
        assert again.s3_port == 9100 and again.state == "up"
        assert not m.heartbeat(_claim(), 5)  # the earlier process learns it was replaced
        assert not m.leave(_claim())
        assert m.heartbeat(_claim(incarnation="i2", s3_port=9100), 5)
        assert [n.s3_port for n in m.nodes("c1")] == [9100]

    def test_an_expired_id_is_taken_over(self, catalog: Catalog) -> None:
        m = catalog.membership
        m.register(_claim(), expiry_s=_HOUR_S)
        copy = _claim(incarnation="i2", machine="m2")
        taken = m.register(copy, expiry_s=0)  # the holder's last heartbeat is older than 0 s
        assert taken.state == "up" and m.heartbeat(copy, 0) and not m.heartbeat(_claim(), 0)

    def test_leave_then_register_again(self, catalog: Catalog) -> None:
        m = catalog.membership
        m.register(_claim(), expiry_s=_HOUR_S)
        assert m.leave(_claim())
        [left] = m.nodes("c1")
        assert left.state == "left" and not left.live(_HOUR_S)
        assert not m.heartbeat(_claim(), 0) and not m.leave(_claim())
        other = _claim(incarnation="i2", machine="m2")
        assert m.register(other, expiry_s=_HOUR_S).state == "up"  # a left id is free at once
        assert [n.state for n in m.nodes("c1")] == ["up"]

    def test_members_listed_by_id_per_cluster(self, catalog: Catalog) -> None:
        m = catalog.membership
        for node_id in ("n3", "n1", "n2"):
            m.register(_claim(node_id, data_dir=f"/{node_id}"), expiry_s=_HOUR_S)
        m.register(_claim("n1", cluster="c2"), expiry_s=_HOUR_S)  # another cluster's n1 is another member
        assert [n.node_id for n in m.nodes("c1")] == ["n1", "n2", "n3"]
        assert [n.cluster for n in m.nodes("c2")] == ["c2"]
        assert m.nodes("nope") == []
