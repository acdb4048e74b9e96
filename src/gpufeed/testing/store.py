"""The shared conformance suite every :class:`gpufeed.store.Store` passes.

Modelled on zarr-python's ``zarr/testing/store.py``: subclass
:class:`StoreTests` in a test module, provide a ``store`` fixture that yields a
fresh, empty, writable store, and inherit every behavioural test::

    class TestMyStore(StoreTests):
        @pytest.fixture
        def store(self, tmp_path):
            with open_my_store(tmp_path) as s:
                yield s

The tests are black-box (only the ``Store`` API) and quick: every test does at
most a few hundred operations, so a remote backend at ~100 µs per operation
still runs the suite in seconds. Async twins are driven with ``asyncio.run``
(no pytest plugin needed).
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from ..errors import InvalidRange, InvalidRequestError, KeyTooLong, NoSuchKey
from ..store import OffsetByteRequest, RangeByteRequest, Store, SuffixByteRequest

__all__ = ["StoreTests", "ODD_KEYS"]

#: Keys that break naive backends (URL encoding, path joining, Unicode
#: normalisation, byte-order listing). Each must round-trip unchanged.
ODD_KEYS = [
    "plain",
    "with space",
    "100%",
    "%2F%41",
    "../../etc/passwd",
    "./.",
    "a//b",
    "/leading-slash",
    "trailing/",
    "q?x=1&y=2#frag",
    "tab\tnewline\n",
    "é-composed",
    "e\u0301-decomposed",
    "日本語/キー",
    "emoji-\U0001f680",
    "\U0010ffff-max",
    "+plus+",
    "back\\slash",
    "<xml>&amp;'\"",
]

_LARGE_BYTES = 3 << 20  # 3 MiB: larger than common single-buffer fast paths


def _pattern(n: int, seed: int = 0) -> bytes:
    """``n`` deterministic bytes where every offset differs from its neighbours."""
    base = bytes((i * 131 + seed * 17 + (i >> 8)) & 0xFF for i in range(4096))
    return (base * (n // 4096 + 1))[:n]


def _b(value) -> bytes:
    return bytes(value)


class StoreTests:
    """Behavioural tests for a :class:`~gpufeed.store.Store`.

    Subclasses must provide a ``store`` fixture returning a fresh, empty,
    writable store (give it a small ``page_keys``, e.g. 7, so the listing
    tests cross pages with a few keys). They should also implement
    :meth:`set_raw` / :meth:`get_raw` (write and read the backing storage
    without the store under test) and :meth:`open_read_only`; the tests that
    need those are skipped otherwise. A backend may add its own tests.
    """

    @pytest.fixture
    def store(self) -> Store:
        raise NotImplementedError("subclasses of StoreTests provide a `store` fixture")

    # hooks that bypass the store under test ---------------------------------------
    def set_raw(self, store: Store, key: str, value: bytes) -> None:
        """Write ``value`` under ``key`` of ``store``'s backing storage, not through ``store``."""
        pytest.skip(f"{type(self).__name__} has no set_raw")

    def get_raw(self, store: Store, key: str) -> bytes:
        """Read ``key`` of ``store``'s backing storage, not through ``store``."""
        pytest.skip(f"{type(self).__name__} has no get_raw")

    def open_read_only(self, store: Store) -> Store:
        """A read-only store over the same data as ``store``."""
        pytest.skip(f"{type(self).__name__} has no open_read_only")

    def test_reads_what_was_written_behind_its_back(self, store: Store) -> None:
        value = _pattern(5000, seed=3)
        self.set_raw(store, "raw/k", value)
        assert _b(store.get("raw/k")) == value
        assert store.exists("raw/k")
        assert list(store.list_prefix("raw/")) == ["raw/k"]

    def test_writes_what_a_raw_read_sees(self, store: Store) -> None:
        value = _pattern(5000, seed=4)
        store.set("raw/w", value)
        assert self.get_raw(store, "raw/w") == value
        store.set("raw/w", b"second")
        assert self.get_raw(store, "raw/w") == b"second"

    def test_read_only_refuses_writes_and_reads(self, store: Store) -> None:
        store.set("ro/k", b"kept")
        ro = self.open_read_only(store)
        assert ro.read_only is True
        with pytest.raises(PermissionError):  # AccessDenied is a PermissionError
            ro.set("ro/k", b"changed")
        with pytest.raises(PermissionError):
            ro.set("ro/new", b"x")
        with pytest.raises(PermissionError):
            ro.delete("ro/k")
        assert _b(ro.get("ro/k")) == b"kept" and ro.exists("ro/k") and not ro.exists("ro/new")
        assert list(ro.list_prefix("ro/")) == ["ro/k"]

    # get / set -----------------------------------------------------------
    def test_store_is_a_store(self, store: Store) -> None:
        assert isinstance(store, Store)
        assert store.read_only is False

    def test_get_missing_raises_no_such_key(self, store: Store) -> None:
        with pytest.raises(NoSuchKey):
            store.get("missing")
        with pytest.raises(FileNotFoundError):  # NoSuchKey is a FileNotFoundError
            store.get("missing")

    def test_set_get_round_trip(self, store: Store) -> None:
        store.set("k", b"hello")
        assert _b(store.get("k")) == b"hello"

    def test_get_returns_buffer(self, store: Store) -> None:
        store.set("k", b"abc")
        assert memoryview(store.get("k")).tobytes() == b"abc"

    def test_empty_value(self, store: Store) -> None:
        store.set("empty", b"")
        assert _b(store.get("empty")) == b""
        assert store.exists("empty")

    def test_all_byte_values(self, store: Store) -> None:
        value = bytes(range(256)) * 4
        store.set("bytes", value)
        assert _b(store.get("bytes")) == value

    def test_large_value(self, store: Store) -> None:
        value = _pattern(_LARGE_BYTES, seed=1)
        store.set("large", value)
        assert _b(store.get("large")) == value
        assert _b(store.get("large", RangeByteRequest(_LARGE_BYTES - 10, _LARGE_BYTES + 10))) == value[-10:]

    @pytest.mark.parametrize("kind", ["bytes", "bytearray", "memoryview", "memoryview-slice", "typed"])
    def test_set_accepts_any_buffer(self, store: Store, kind: str) -> None:
        import array

        raw = _pattern(64)
        value = {
            "bytes": raw,
            "bytearray": bytearray(raw),
            "memoryview": memoryview(raw),
            "memoryview-slice": memoryview(b"xx" + raw + b"yy")[2:-2],
            "typed": array.array("d", memoryview(raw).cast("d")),
        }[kind]
        store.set("buf", value)
        assert _b(store.get("buf")) == raw

    def test_overwrite(self, store: Store) -> None:
        store.set("k", b"first value, longer")
        store.set("k", b"second")
        assert _b(store.get("k")) == b"second"
        store.set("k", b"third value, longer still")
        assert _b(store.get("k")) == b"third value, longer still"

    def test_set_does_not_keep_reference_to_buffer(self, store: Store) -> None:
        buf = bytearray(b"original")
        store.set("k", buf)
        buf[:] = b"mutated!"
        assert _b(store.get("k")) == b"original"

    # ranges ------------------------------------------------------------
    def test_range_request(self, store: Store) -> None:
        store.set("r", b"0123456789")
        assert _b(store.get("r", RangeByteRequest(2, 5))) == b"234"
        assert _b(store.get("r", RangeByteRequest(0, 10))) == b"0123456789"
        assert _b(store.get("r", RangeByteRequest(9, 10))) == b"9"

    def test_range_end_past_size_is_clipped(self, store: Store) -> None:
        store.set("r", b"0123456789")
        assert _b(store.get("r", RangeByteRequest(7, 1000))) == b"789"

    def test_range_zero_length(self, store: Store) -> None:
        store.set("r", b"0123456789")
        assert _b(store.get("r", RangeByteRequest(3, 3))) == b""

    def test_offset_request(self, store: Store) -> None:
        store.set("r", b"0123456789")
        assert _b(store.get("r", OffsetByteRequest(0))) == b"0123456789"
        assert _b(store.get("r", OffsetByteRequest(6))) == b"6789"
        assert _b(store.get("r", OffsetByteRequest(9))) == b"9"

    def test_suffix_request(self, store: Store) -> None:
        store.set("r", b"0123456789")
        assert _b(store.get("r", SuffixByteRequest(3))) == b"789"
        assert _b(store.get("r", SuffixByteRequest(10))) == b"0123456789"
        assert _b(store.get("r", SuffixByteRequest(50))) == b"0123456789"

    @pytest.mark.parametrize(
        "request_",
        [
            RangeByteRequest(10, 20),
            RangeByteRequest(11, 12),
            RangeByteRequest(5, 2),
            RangeByteRequest(-1, 2),
            OffsetByteRequest(10),
            OffsetByteRequest(-1),
            SuffixByteRequest(0),
            SuffixByteRequest(-1),
        ],
    )
    def test_unsatisfiable_range(self, store: Store, request_) -> None:
        store.set("r", b"0123456789")
        with pytest.raises(InvalidRange):
            store.get("r", request_)

    def test_ranges_on_empty_value(self, store: Store) -> None:
        store.set("e", b"")
        assert _b(store.get("e", RangeByteRequest(0, 0))) == b""
        assert _b(store.get("e", OffsetByteRequest(0))) == b""
        assert _b(store.get("e", SuffixByteRequest(4))) == b""

    def test_range_on_missing_key(self, store: Store) -> None:
        with pytest.raises(NoSuchKey):
            store.get("missing", RangeByteRequest(0, 1))

    def test_get_ranges(self, store: Store) -> None:
        value = _pattern(10_000, seed=2)
        store.set("g", value)
        got = store.get_ranges(
            "g", [RangeByteRequest(0, 10), OffsetByteRequest(9_990), SuffixByteRequest(5),
                  RangeByteRequest(500, 20_000)]
        )
        assert [_b(x) for x in got] == [value[:10], value[9_990:], value[-5:], value[500:]]

    def test_get_ranges_missing_key(self, store: Store) -> None:
        with pytest.raises(NoSuchKey):
            store.get_ranges("missing", [RangeByteRequest(0, 1)])

    # exists / delete ---------------------------------------------------
    def test_exists(self, store: Store) -> None:
        assert not store.exists("k")
        store.set("k", b"v")
        assert store.exists("k")
        assert not store.exists("k/")

    def test_delete(self, store: Store) -> None:
        store.set("k", b"v")
        store.delete("k")
        assert not store.exists("k")
        with pytest.raises(NoSuchKey):
            store.get("k")

    def test_delete_missing_is_ok(self, store: Store) -> None:
        store.delete("never-written")
        store.set("k", b"v")
        store.delete("k")
        store.delete("k")

    def test_set_after_delete(self, store: Store) -> None:
        store.set("k", b"one")
        store.delete("k")
        store.set("k", b"two")
        assert _b(store.get("k")) == b"two"

    # listing -------------------------------------------------------------
    def test_list_prefix_empty_store(self, store: Store) -> None:
        assert list(store.list_prefix("")) == []
        assert list(store.list_prefix("x")) == []

    def test_list_prefix_order_is_utf8_byte_order(self, store: Store) -> None:
        keys = ["b", "a", "a/b", "a/", "é", "z", "~", "A", "日", "\U0001f680", "a0", "ab"]
        for k in keys:
            store.set(k, b"")
        want = sorted(keys, key=lambda k: k.encode("utf-8"))
        assert list(store.list_prefix("")) == want

    def test_list_prefix_filters(self, store: Store) -> None:
        for k in ["c/0", "cc/0", "c/1/x", "c", "d/0", "c0"]:
            store.set(k, b"x")
        assert list(store.list_prefix("c/")) == ["c/0", "c/1/x"]
        assert list(store.list_prefix("c/0")) == ["c/0"]
        assert list(store.list_prefix("cc/0")) == ["cc/0"]
        assert list(store.list_prefix("c")) == ["c", "c/0", "c/1/x", "c0", "cc/0"]
        assert list(store.list_prefix("e")) == []

    def test_list_prefix_after_delete(self, store: Store) -> None:
        for k in ["p/1", "p/2", "p/3"]:
            store.set(k, b"x")
        store.delete("p/2")
        assert list(store.list_prefix("p/")) == ["p/1", "p/3"]

    def test_list_prefix_many_keys(self, store: Store) -> None:
        page = store.page_keys
        keys = [f"many/{i:05d}" for i in range(page + max(3, min(page, 50)))]  # past a page boundary
        for k in keys:
            store.set(k, b"")
        store.set("many0", b"")  # sorts after the prefix's keys, outside it
        assert list(store.list_prefix("many/")) == keys

    def test_list_dir_across_pages(self, store: Store) -> None:
        page = store.page_keys
        n = page + max(3, min(page, 50))
        files = [f"d/f{i:05d}" for i in range(n)]
        dirs = [f"d/s{i:05d}/" for i in range(n)]
        for k in files + [d + "x" for d in dirs] + [dirs[0] + "y"]:
            store.set(k, b"")
        assert store.list_dir("d/") == (files, dirs)

    def test_list_dir(self, store: Store) -> None:
        for k in ["root.json", "d/a", "d/b/c", "d/b/d", "d/e/f", "dd/x", "d/z"]:
            store.set(k, b"{}")
        assert store.list_dir("d/") == (["d/a", "d/z"], ["d/b/", "d/e/"])
        assert store.list_dir("") == (["root.json"], ["d/", "dd/"])
        assert store.list_dir("nothing/") == ([], [])

    def test_file_and_folder_names_coexist(self, store: Store) -> None:
        # Impossible on a plain file system: "a" as a value and as a folder.
        for k, v in [("a", b"1"), ("a/", b"2"), ("a/b", b"3"), ("a/b/c", b"4")]:
            store.set(k, v)
        assert [_b(store.get(k)) for k in ["a", "a/", "a/b", "a/b/c"]] == [b"1", b"2", b"3", b"4"]
        assert list(store.list_prefix("a")) == ["a", "a/", "a/b", "a/b/c"]

    # keys ----------------------------------------------------------------
    @pytest.mark.parametrize("key", ODD_KEYS)
    def test_odd_keys_round_trip(self, store: Store, key: str) -> None:
        store.set(key, key.encode("utf-8"))
        assert _b(store.get(key)) == key.encode("utf-8")
        assert store.exists(key)
        assert list(store.list_prefix(key)) == [key]
        store.delete(key)
        assert not store.exists(key)

    def test_odd_keys_list_together(self, store: Store) -> None:
        for k in ODD_KEYS:
            store.set(k, b"")
        assert list(store.list_prefix("")) == sorted(ODD_KEYS, key=lambda k: k.encode("utf-8"))

    def test_longest_key(self, store: Store) -> None:
        ascii_key = "k" * 1024
        wide_key = "é" * 512  # 2 bytes each: 1,024 bytes
        for k in (ascii_key, wide_key):
            store.set(k, b"v")
            assert _b(store.get(k)) == b"v"
        assert sorted(store.list_prefix("")) == sorted([ascii_key, wide_key])

    def test_key_too_long(self, store: Store) -> None:
        with pytest.raises(KeyTooLong):
            store.set("k" * 1025, b"v")
        with pytest.raises(KeyTooLong):
            store.set("é" * 512 + "x", b"v")  # 1,025 bytes
        assert list(store.list_prefix("")) == []

    def test_empty_key_is_invalid(self, store: Store) -> None:
        with pytest.raises(InvalidRequestError):
            store.set("", b"v")

    # async -----------------------------------------------------------------
    def test_async_twins(self, store: Store) -> None:
        async def scenario() -> None:
            await store.set_async("a", b"async value")
            assert await store.exists_async("a")
            assert _b(await store.get_async("a")) == b"async value"
            assert _b(await store.get_async("a", RangeByteRequest(0, 5))) == b"async"
            await asyncio.gather(*(store.set_async(f"g/{i}", bytes([i])) for i in range(8)))
            got = await asyncio.gather(*(store.get_async(f"g/{i}") for i in range(8)))
            assert [_b(x) for x in got] == [bytes([i]) for i in range(8)]
            await store.delete_async("a")
            assert not await store.exists_async("a")
            with pytest.raises(NoSuchKey):
                await store.get_async("a")

        asyncio.run(scenario())

    # concurrency -----------------------------------------------------------
    def test_concurrent_sets_of_different_keys(self, store: Store) -> None:
        n_threads, per_thread = 8, 10
        errors: list[BaseException] = []

        def work(t: int) -> None:
            try:
                for i in range(per_thread):
                    store.set(f"t{t}/{i}", _pattern(1000 + i, seed=t))
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(t,)) for t in range(n_threads)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert errors == []
        for t in range(n_threads):
            for i in range(per_thread):
                assert _b(store.get(f"t{t}/{i}")) == _pattern(1000 + i, seed=t)
        assert len(list(store.list_prefix("t"))) == n_threads * per_thread

    def test_overwrite_is_atomic_for_readers(self, store: Store) -> None:
        a, b = _pattern(256 << 10, seed=3), _pattern(256 << 10, seed=4)  # 256 KiB each
        store.set("atomic", a)
        stop = threading.Event()
        bad: list[bytes] = []

        def reader() -> None:
            while not stop.is_set():
                try:
                    got = _b(store.get("atomic"))
                except NoSuchKey:  # pragma: no cover - never deleted here
                    bad.append(b"missing")
                    continue
                if got != a and got != b:
                    bad.append(got[:16])

        th = threading.Thread(target=reader)
        th.start()
        try:
            for i in range(20):
                store.set("atomic", b if i % 2 == 0 else a)
        finally:
            stop.set()
            th.join()
        assert bad == []
