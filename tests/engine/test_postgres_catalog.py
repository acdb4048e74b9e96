"""The PostgreSQL catalog passes the shared catalog conformance suite, keeps its
commits across reopening, refuses a newer schema and a second deployment, and
fails with ServiceUnavailable while its database is down, then recovers."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from gpufeed.engine._membership import NodeClaim
from gpufeed.engine._pgschema import SCHEMA_VERSION
from gpufeed.engine._postgres import PostgresCatalog, redact
from gpufeed.engine.catalog import PartRecord
from gpufeed.engine.types import BucketInfo, ChunkRecord, ObjectInfo, PartInfo, UploadInfo
from gpufeed.errors import CatalogInUse, CatalogTooNew, CatalogUnavailable, InternalError
from gpufeed.testing.catalog import BYTE_ORDER_KEYS, CatalogTests


class TestPostgresCatalog(CatalogTests):
    @pytest.fixture
    def catalog(self, postgres_url):
        c = PostgresCatalog(postgres_url, blob_path=self.blob_path, owner="node:test")
        yield c
        c.close()


def test_commits_survive_reopen_and_owner_is_kept(postgres_url):
    c = PostgresCatalog(postgres_url, owner="cluster:a")
    with c.write() as w:
        w.insert_bucket(BucketInfo("bkt", 1.0))
        for key in BYTE_ORDER_KEYS:
            w.put_object(ObjectInfo("bkt", key, 3, "e", 5.0, blob_id="b-" + key.encode().hex()))
    c.close()
    with pytest.raises(CatalogInUse, match="cluster:a"):
        PostgresCatalog(postgres_url, owner="cluster:b")
    c = PostgresCatalog(postgres_url, owner="cluster:a")
    try:
        keys = [o.key for o in c.scan_objects("bkt", "", inclusive=True, end=None, limit=100)]
        assert keys == BYTE_ORDER_KEYS
        assert c.usage("bkt") == (3 * len(BYTE_ORDER_KEYS), len(BYTE_ORDER_KEYS))
    finally:
        c.close()


def test_scans_page_through_many_rows(postgres_url, monkeypatch):
    monkeypatch.setattr("gpufeed.engine._pgreads.PAGE_ROWS", 7)
    c = PostgresCatalog(postgres_url)
    try:
        with c.write() as w:
            w.insert_bucket(BucketInfo("bkt", 1.0))
            for i in range(30):
                w.put_object(ObjectInfo("bkt", f"k{i:02d}", 1, "e", 5.0, blob_id=f"b{i}"))
                for seq in (1, 2):
                    w.insert_noncurrent(ObjectInfo("bkt", f"k{i:02d}", 1, "e", 5.0, blob_id=f"v{i}.{seq}",
                                                   version_id=f"v{i}.{seq}", seq=seq))
        keys = [o.key for o in c.scan_objects("bkt", "k03", inclusive=False, end="k25", limit=100)]
        assert keys == [f"k{i:02d}" for i in range(4, 25)]
        got = [(o.key, o.seq) for o in c.scan_noncurrent("bkt", "k00", inclusive=True, end=None, limit=17)]
        assert got == [(f"k{i // 2:02d}", 2 - i % 2) for i in range(17)]
    finally:
        c.close()


def test_writers_of_two_catalogs_take_turns(postgres_url):
    """Two catalogs on one database (two processes, say) serialise their writes
    through the writer row's lock, and the second writer sees the first one's commit."""
    a, b = PostgresCatalog(postgres_url), PostgresCatalog(postgres_url)
    events: list[str] = []
    seen: list[object] = []

    def second() -> None:
        with b.write() as w:
            events.append("b inside")
            seen.append(w.object("bkt", "k"))
            w.put_object(ObjectInfo("bkt", "k2", 1, "e", 5.0, blob_id="b2"))

    try:
        with a.write() as w:
            w.insert_bucket(BucketInfo("bkt", 1.0))
        with a.write() as w:
            w.put_object(ObjectInfo("bkt", "k", 1, "e", 5.0, blob_id="b1"))
            t = threading.Thread(target=second)
            t.start()
            time.sleep(0.3)  # room for the second writer to get in, were it not blocked
            events.append("a commits")
        t.join(30)
        assert events == ["a commits", "b inside"]
        assert seen[0] is not None and seen[0].blob_id == "b1"
        assert a.usage("bkt") == (2, 2)
    finally:
        a.close()
        b.close()


def test_catalogs_opened_at_once_on_a_fresh_database_all_open(postgres_server):
    """Nodes started together race to create the tables (PostgreSQL's CREATE
    ... IF NOT EXISTS is not safe against itself): the losers retry, none fails."""
    def open_one(url: str, start: threading.Barrier, opened: list, failed: list) -> None:
        start.wait()
        try:
            opened.append(PostgresCatalog(url))
        except BaseException as exc:  # noqa: BLE001 - reported below
            failed.append(exc)

    for _ in range(3):
        url = postgres_server.create_database("race")
        start = threading.Barrier(6)
        opened: list[PostgresCatalog] = []
        failed: list[BaseException] = []
        threads = [threading.Thread(target=open_one, args=(url, start, opened, failed)) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        for c in opened:
            c.close()
        postgres_server.drop_database(url)
        assert failed == [] and len(opened) == 6


def test_newer_schema_is_refused(postgres_url):
    PostgresCatalog(postgres_url).close()
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("UPDATE gpufeed_meta SET value = %s WHERE name = 'schema_version'", (str(SCHEMA_VERSION + 1),))
    with pytest.raises(CatalogTooNew, match="newer"):
        PostgresCatalog(postgres_url)


def test_version_1_catalog_gains_the_nodes_table(postgres_url):
    c = PostgresCatalog(postgres_url, owner="cluster:c1")
    with c.write() as w:
        w.insert_bucket(BucketInfo("bkt", 1.0))
    c.close()
    with psycopg.connect(postgres_url, autocommit=True) as conn:  # as the first release left it
        conn.execute("DROP TABLE nodes")
        conn.execute("DROP TABLE file_copies")
        conn.execute("DROP INDEX chunks_by_holder")
        conn.execute("ALTER TABLE chunks DROP COLUMN holder")
        conn.execute("UPDATE gpufeed_meta SET value = '1' WHERE name = 'schema_version'")
    c = PostgresCatalog(postgres_url, owner="cluster:c1")
    try:
        assert c.bucket("bkt") is not None and c.membership.nodes("c1") == []
        claim = NodeClaim("c1", "n1", "127.0.0.1", 9000, 9400, "i1")
        assert c.membership.register(claim, expiry_s=10).state == "up"
        assert c.owner() == "cluster:c1"
    finally:
        c.close()
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        row = conn.execute("SELECT value FROM gpufeed_meta WHERE name = 'schema_version'").fetchone()
        copies = conn.execute("SELECT COUNT(*) FROM file_copies").fetchone()
    assert row is not None and row[0] == str(SCHEMA_VERSION) == "7" and copies == (0,)


def test_version_4_catalog_gains_the_members_room_columns(postgres_url):
    c = PostgresCatalog(postgres_url, owner="cluster:c1")
    claim = NodeClaim("c1", "n1", "127.0.0.1", 9000, 9400, "i1")
    c.membership.register(claim, expiry_s=10)
    c.close()
    with psycopg.connect(postgres_url, autocommit=True) as conn:  # as schema version 4 left it
        conn.execute("ALTER TABLE nodes DROP COLUMN capacity_bytes")
        conn.execute("ALTER TABLE nodes DROP COLUMN free_bytes")
        conn.execute("ALTER TABLE nodes DROP COLUMN moving_bytes")
        conn.execute("UPDATE gpufeed_meta SET value = '4' WHERE name = 'schema_version'")
    c = PostgresCatalog(postgres_url, owner="cluster:c1")
    try:
        [old] = c.membership.nodes("c1")
        assert (old.capacity_bytes, old.free_bytes, old.moving_bytes) == (0, -1, 0)  # not reported
        assert c.membership.heartbeat(claim, 123, room=(1000, 877))
        [n] = c.membership.nodes("c1")
        assert (n.bytes_stored, n.capacity_bytes, n.free_bytes, n.moving_bytes) == (123, 1000, 877, 0)
        assert c.membership.heartbeat(claim, 950, room=(1000, 50), moving_bytes=150)  # draining (version 6)
        assert c.membership.nodes("c1")[0].moving_bytes == 150
        again = c.membership.register(claim, expiry_s=10, bytes_stored=700, room=(1000, 300))
        assert again.moving_bytes == 0
    finally:
        c.close()


def _record(cid: str) -> ChunkRecord:
    return ChunkRecord(cid, f"file-{cid}", 0, 10, 10, "", b"d" * 16, b"s" * 4)


def test_version_2_chunks_gain_holders(postgres_url):
    c = PostgresCatalog(postgres_url, owner="cluster:c1")
    with c.write() as w:
        for cid in ("c1", "c2"):
            w.insert_chunk(_record(cid), 1)
    c.close()
    with psycopg.connect(postgres_url, autocommit=True) as conn:  # as schema version 2 left it
        conn.execute("DROP INDEX chunks_by_holder")
        conn.execute("ALTER TABLE chunks DROP COLUMN holder")
        conn.execute("UPDATE gpufeed_meta SET value = '2' WHERE name = 'schema_version'")
    c = PostgresCatalog(postgres_url, owner="cluster:c1", holder="nodeA")
    try:  # a cluster's rows with no holder: each node claims the files it finds
        assert c.data_files() == set() and c.unheld_files() == {"file-c1", "file-c2"}
        assert c.claim_files({"file-c1"}) == 1
        assert c.data_files() == {"file-c1"} and c.unheld_files() == {"file-c2"}
        with c.write() as w:
            w.insert_chunk(_record("c3"), 1)
        assert c.chunk("c3").holder == "nodeA" and c.chunk("c2").holder == ""
    finally:
        c.close()
    other = PostgresCatalog(postgres_url, owner="cluster:c1", holder="nodeB")
    try:  # another node sees none of them as its own
        assert other.data_files() == set() and other.unheld_files() == {"file-c2"}
    finally:
        other.close()


def test_a_catalog_owned_by_one_node_gives_it_every_chunk(postgres_url):
    c = PostgresCatalog(postgres_url, owner="node:n1")
    with c.write() as w:
        w.insert_chunk(_record("c1"), 1)
    c.close()
    c = PostgresCatalog(postgres_url, owner="node:n1", holder="n1")
    try:
        assert c.data_files() == {"file-c1"} and c.unheld_files() == set() and c.chunk("c1").holder == "n1"
    finally:
        c.close()


def test_copies_of_part_files_are_recorded_counted_and_freed(postgres_url):
    c = PostgresCatalog(postgres_url, owner="cluster:c1", holder="A")
    up = "a" * 32

    def part(n: int, file: str) -> PartRecord:
        return PartRecord(PartInfo(n, "e" * 32, 10, 1.0, {}), file)

    try:
        with c.write() as w:
            w.insert_bucket(BucketInfo("bkt", 1.0))
            w.insert_upload(UploadInfo("bkt", "k", up, 1.0, "x/y", {}, {}))
            w.put_part(up, part(1, "00001.p1"))
            w.add_part_copies(up, "00001.p1", ["A", "B"])
            w.put_part(up, part(2, "00002.p2"))
            w.add_part_copies(up, "00002.p2", ["A"])
            w.put_part(up, part(3, "00003.p3"))  # no row: not counted
            w.add_part_copies(up, "00009.none", ["A"])  # no part names it: no row
        assert c.under_replicated_parts(["A", "B"], 2) == 1  # part 2 is on A only
        assert c.under_replicated_parts(["B"], 2) == 2 and c.under_replicated_parts(["A", "B"], 1) == 0
        with c.write() as w:
            w.add_part_copies(up, "00002.p2", ["B", "A"])
        assert c.under_replicated_parts(["A", "B"], 2) == 0
        with c.write() as w:  # part 1 uploaded again: its old file's copies go, the new one has none yet
            w.put_part(up, part(1, "00001.q1"))
            w.add_part_copies(up, "00001.q1", ["B"])
        assert c.under_replicated_parts(["A", "B"], 2) == 1
        with c.write() as w:
            w.delete_upload(up)
        assert c.under_replicated_parts(["A", "B"], 2) == 0
        with c.write() as w:
            assert w._rows("SELECT COUNT(*) FROM part_copies") == [(0,)]
    finally:
        c.close()


def test_copies_of_data_files_are_recorded_counted_and_freed(postgres_url):
    a = PostgresCatalog(postgres_url, owner="cluster:c1", holder="A")
    b = PostgresCatalog(postgres_url, owner="cluster:c1", holder="B")
    try:
        with a.write() as w:
            for cid in ("c1", "c2"):
                w.insert_chunk(_record(cid), 1)
            w.insert_manifest("blob1", 20, ["c1", "c2"])
            w.add_file_copies("file-c1", ["B"])
            w.add_file_copies("no-such-file", ["B"])  # a file no chunk names gets no row
        assert a.file_copies("file-c1") == ["B"] and a.file_copies("no-such-file") == []
        assert b.copy_files() == {"file-c1"} and b.data_files() == set() and a.copy_files() == set()
        assert [r.chunk_id for r in a.file_records("file-c1")] == ["c1"]
        assert a.under_replicated(["A", "B"], 2) == 1  # c2 is on A only
        assert a.under_replicated(["B"], 2) == 2 and a.under_replicated(["A", "B"], 1) == 0
        assert a.under_replicated_files(["A", "B"], 2, "", 10) == ["file-c2"]
        assert a.under_replicated_files(["A", "B"], 2, "file-c2", 10) == []
        assert b.drop_file_copies({"file-c1"}) == 1 and a.file_copies("file-c1") == []
        with a.write() as w:
            w.add_file_copies("file-c1", ["B", "C"])
        with a.write() as w:  # the last reference goes: the copies' rows with it
            files, _ = w.release_manifest("blob1")
        assert sorted(files) == ["file-c1", "file-c2"] and a.file_copies("file-c1") == []
    finally:
        a.close()
        b.close()


def test_unreachable_database_is_named_without_password(postgres_server):
    url = f"postgresql://gpufeed:s3cret@127.0.0.1:{postgres_server.port}/no_such_db"
    with pytest.raises(InternalError) as info:
        PostgresCatalog(url)
    assert "s3cret" not in str(info.value) and "127.0.0.1" in str(info.value)
    assert redact(url) == f"gpufeed@127.0.0.1:{postgres_server.port}/no_such_db"


def test_database_down_then_back(postgres_server, postgres_url):
    """Writes and reads fail with ServiceUnavailable while the server is stopped,
    and work again once it runs (the pool replaces its broken connections)."""
    c = PostgresCatalog(postgres_url, pool_timeout_s=2.0)
    try:
        with c.write() as w:
            w.insert_bucket(BucketInfo("bkt", 1.0))
        postgres_server.stop()
        try:
            with pytest.raises(CatalogUnavailable) as info:
                with c.write() as w:
                    w.put_object(ObjectInfo("bkt", "k", 1, "e", 5.0, blob_id="b1"))
            assert info.value.status == 503 and info.value.code == "ServiceUnavailable"
            with pytest.raises(CatalogUnavailable):
                c.bucket("bkt")
        finally:
            postgres_server.start()
        with c.write() as w:
            w.put_object(ObjectInfo("bkt", "k", 1, "e", 5.0, blob_id="b1"))
        assert c.object("bkt", "k").blob_id == "b1"
        with c.snapshot(), c.snapshot(), c.snapshot():  # three pooled connections, all cut by the restart
            pass
        postgres_server.stop()
        postgres_server.start()
        assert c.bucket("bkt") is not None  # the broken ones are replaced, the read is retried
        with c.write() as w:
            w.delete_object("bkt", "k")
        assert c.object("bkt", "k") is None
    finally:
        c.close()


def test_a_held_writer_lock_is_503_within_the_timeout(postgres_url):
    """A session that holds the writer row (a node cut off mid-write) makes writes
    fail with ServiceUnavailable after the catalog's timeout, not wait for ever;
    reads go on."""
    c = PostgresCatalog(postgres_url, pool_timeout_s=1.0)
    try:
        with c.write() as w:
            w.insert_bucket(BucketInfo("bkt", 1.0))
        with psycopg.connect(postgres_url) as other:  # a transaction left open
            other.execute("SELECT value FROM gpufeed_meta WHERE name = 'writer' FOR UPDATE")
            t0 = time.monotonic()
            with pytest.raises(CatalogUnavailable, match="writer lock") as info:
                with c.write() as w:
                    w.put_object(ObjectInfo("bkt", "k", 1, "e", 5.0, blob_id="b1"))
            assert time.monotonic() - t0 < 10
            assert info.value.status == 503
            assert c.bucket("bkt") is not None
        with c.write() as w:  # released: writes go on
            w.put_object(ObjectInfo("bkt", "k", 1, "e", 5.0, blob_id="b1"))
        assert c.object("bkt", "k").blob_id == "b1"
    finally:
        c.close()


def test_a_session_idle_in_its_transaction_is_ended_by_the_server(postgres_url):
    """The catalog's sessions carry idle_in_transaction_session_timeout: a write
    whose node stops talking mid-transaction loses its session, its lock is
    released for the other writers, and nothing of it is committed."""
    a, b = PostgresCatalog(postgres_url, idle_tx_s=1.0), PostgresCatalog(postgres_url, pool_timeout_s=10.0)
    try:
        with a.write() as w:
            w.insert_bucket(BucketInfo("bkt", 1.0))
        assert a._rows("SHOW idle_in_transaction_session_timeout") == [("1s",)]
        with pytest.raises(CatalogUnavailable):
            with a.write() as w:
                w.put_object(ObjectInfo("bkt", "stuck", 1, "e", 5.0, blob_id="b0"))
                time.sleep(3)  # idle inside the transaction: the server ends the session
        t0 = time.monotonic()
        with b.write() as w:
            w.put_object(ObjectInfo("bkt", "k", 1, "e", 5.0, blob_id="b1"))
        assert time.monotonic() - t0 < 5
        assert b.object("bkt", "stuck") is None and b.object("bkt", "k").blob_id == "b1"
    finally:
        a.close()
        b.close()


def test_key_value_strings_name_a_catalog_and_a_bad_setting_is_not_echoed(postgres_url):
    """libpq's ``key=value`` form opens the same catalog as the URL; a setting
    that is neither form is refused without repeating it (it may hold a password)."""
    from psycopg.conninfo import conninfo_to_dict

    from gpufeed.engine._catalogs import catalog_scheme
    from gpufeed.errors import InvalidArgument

    parts = conninfo_to_dict(postgres_url)
    kv = " ".join(f"{k}={v}" for k, v in parts.items())
    assert catalog_scheme(kv) == "postgresql" and catalog_scheme(postgres_url) == "postgresql"
    c = PostgresCatalog(kv)
    try:
        with c.write() as w:
            w.insert_bucket(BucketInfo("bkt", 1.0))
        assert c.bucket("bkt") is not None
    finally:
        c.close()
    for bad in ("postgresql:/gf:secretpw@127.0.0.1/db", "gf:secretpw@127.0.0.1"):
        with pytest.raises(InvalidArgument) as info:
            catalog_scheme(bad)
        assert "secretpw" not in str(info.value)
    with pytest.raises(InvalidArgument, match="'mysql'"):
        catalog_scheme("mysql://u:secretpw@h/d")


def test_a_database_with_other_tables_of_our_names_is_refused_and_left_as_it_was(postgres_server):
    """Another application's ``objects`` table: refused with a message naming it,
    and nothing of gpufeed's is left behind (neither is a refused owner's)."""
    from gpufeed.errors import InvalidArgument

    url = postgres_server.create_database("foreign")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE objects (id int)")
    with pytest.raises(InvalidArgument, match=r"\(objects\), not made by gpufeed"):
        PostgresCatalog(url)
    with psycopg.connect(url, autocommit=True) as conn:
        tables = [r[0] for r in conn.execute("SELECT table_name FROM information_schema.tables "
                                             "WHERE table_schema = current_schema()")]
    assert tables == ["objects"]
    fresh = postgres_server.create_database("fresh")
    with pytest.raises(InternalError, match="changed nothing"):
        PostgresCatalog(fresh, owner="node:x", data_present=lambda: True)
    with psycopg.connect(fresh, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM information_schema.tables "
                            "WHERE table_schema = current_schema()").fetchone() == (0,)


def test_the_folder_names_the_database_it_last_opened(postgres_server, tmp_path):
    """A data folder without data may move to another database; its
    ``catalog.postgresql`` then names the new one (the refusal to start it
    without --catalog names the right database)."""
    from gpufeed.engine import CatalogSettings, Engine

    first, second = postgres_server.create_database("one"), postgres_server.create_database("two")
    d = tmp_path / "data"
    for url in (first, second):
        with Engine(d, fsync=False, catalog=CatalogSettings(url=url)):
            pass
        assert (d / "catalog.postgresql").read_text().strip() == redact(url)
    assert redact(second).endswith("/" + second.rsplit("/", 1)[1])
