"""``gpufeed bench catalog``: metadata operations per second with the catalog in
SQLite and in PostgreSQL, side by side in one run.

Every operation goes through :class:`gpufeed.engine.Engine` (the path the S3
front and the fast path call), so each backend is measured with everything a
request does around its catalog statements; only the catalog differs:

* ``put``: ``objects`` sequential puts of ``size`` bytes (a data file written,
  then one write transaction);
* ``head``: a head of every object once, in a shuffled order, from one thread,
  then from ``threads`` threads at once (the hot lookup of every read);
* ``list``: ListObjectsV2 pages of 1,000 keys over the whole bucket, again
  and again for ``list_pages`` pages (ops = pages; ``keys_per_s`` also shown).

The SQLite catalog is ``catalog.sqlite3`` in the data folder (WAL). The
PostgreSQL one is a throwaway server started for the run on 127.0.0.1
(:class:`~gpufeed.testing.postgres.PostgresServer`), or the database
``catalog_url`` names. Durability is alike on both: off by default (SQLite
``synchronous=NORMAL``, PostgreSQL ``fsync=off``, ``synchronous_commit=off``;
data files not fsynced), on with ``durable`` (SQLite ``synchronous=FULL``,
PostgreSQL's defaults, data fsynced). Client and database share the machine's
cores.

JSON shape::

    {"benchmark": "catalog", "command": "...", "machine": {...}, "params": {...},
     "results": [{"catalog", "op", "threads", "ops", "seconds", "ops_per_s"}],
     "postgres_vs_sqlite": {"put": x, "head": x, "head_threads": x, "list": x}}
"""

from __future__ import annotations

import random
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ..engine import CatalogSettings, Engine
from ..errors import CatalogUnavailable, InvalidArgument
from ._output import BenchProgress, summary_line, write_json
from .io import machine_info

__all__ = ["run_catalog_bench"]

_BUCKET = "bench-catalog"
_PAGE = 1000


def _key(i: int) -> str:
    return f"obj/{i % 97:02d}/{i:08d}"


def _timed(op: str, catalog: str, threads: int, ops: int, fn: Callable[[], None]) -> dict:
    t0 = time.perf_counter()
    fn()
    s = time.perf_counter() - t0
    return {"catalog": catalog, "op": op, "threads": threads, "ops": ops, "seconds": round(s, 4),
            "ops_per_s": round(ops / s, 1)}


def _heads(engine: Engine, keys: list[str], threads: int) -> None:
    def work(part: list[str]) -> None:
        for k in part:
            engine.head_object(_BUCKET, k)

    if threads == 1:
        work(keys)
        return
    pool = [threading.Thread(target=work, args=(keys[i::threads],)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()


def _lists(engine: Engine, pages: int) -> None:
    token: str | None = None
    for _ in range(pages):
        page = engine.list_objects(_BUCKET, continuation_token=token, max_keys=_PAGE)
        token = page.next_token if page.is_truncated else None


def _measure(engine: Engine, name: str, *, objects: int, size: int, threads: int, list_pages: int,
             progress: BenchProgress) -> list[dict]:
    engine.create_bucket(_BUCKET)
    body = bytes(range(256)) * (size // 256) + bytes(size % 256)
    keys = [_key(i) for i in range(objects)]
    def puts() -> None:
        for k in keys:
            engine.put_object(_BUCKET, k, body)

    progress.step(f"{name}: put {objects:,}")
    rows = [_timed("put", name, 1, objects, puts)]
    shuffled = keys[:]
    random.Random(7).shuffle(shuffled)
    progress.step(f"{name}: head {objects:,}")
    rows.append(_timed("head", name, 1, objects, lambda: _heads(engine, shuffled, 1)))
    rows.append(_timed("head", name, threads, objects, lambda: _heads(engine, shuffled, threads)))
    progress.step(f"{name}: list {list_pages} pages")
    _lists(engine, 1)  # warm-up
    rows.append(_timed("list", name, 1, list_pages, lambda: _lists(engine, list_pages)))
    rows[-1]["keys_per_s"] = round(rows[-1]["ops_per_s"] * min(_PAGE, objects), 1)
    return rows


def run_catalog_bench(*, objects: int = 2000, size: int = 1024, threads: int = 4, list_pages: int = 50,
                      catalog_url: str | None = None, durable: bool = False, pool_size: int = 8,
                      json_path: str | None = None, console: Console | None = None) -> dict:
    """Run the catalog benchmark and print its table.

    Args:
        objects: objects put (and each headed once per pass).
        size: bytes of each object.
        threads: threads of the concurrent head pass.
        list_pages: ListObjectsV2 pages of 1,000 keys timed.
        catalog_url: an empty PostgreSQL database to use; ``None`` starts a
            throwaway server (needs PostgreSQL's ``initdb`` and ``pg_ctl``).
        durable: fsync data and commits on both catalogs.
        pool_size: the PostgreSQL catalog's connections.
        json_path: write the JSON here.
        console: where the table goes.

    Returns:
        The JSON document (see the module docstring).

    Raises:
        PostgresMissing: no ``catalog_url`` and PostgreSQL is not installed.
        InvalidArgument: ``catalog_url``'s database already holds a gpufeed catalog
            (the benchmark's rows would mix with it; an earlier run's are left there).
    """
    from ..testing.postgres import PostgresServer

    console = console or Console()
    if catalog_url:
        _require_empty(catalog_url)
    server = None if catalog_url else PostgresServer(durable=durable)
    results: list[dict] = []
    progress = BenchProgress("catalog").start()
    try:
        with tempfile.TemporaryDirectory(prefix="gpufeed-bench-catalog-") as tmp:
            if server is not None:
                progress.step("start PostgreSQL")
                url = server.start().create_database("bench")
            else:
                url = catalog_url or ""
            settings = {"sqlite": CatalogSettings(),
                        "postgresql": CatalogSettings(url=url, pool_size=pool_size, cluster="bench-catalog")}
            for name, catalog in settings.items():
                with Engine(Path(tmp) / name, fsync=durable, catalog=catalog) as engine:
                    results += _measure(engine, name, objects=objects, size=size, threads=threads,
                                        list_pages=list_pages, progress=progress)
    finally:
        progress.close()
        if server is not None:
            server.close()
    out = _report(results, objects=objects, size=size, threads=threads, list_pages=list_pages,
                  durable=durable, pool_size=pool_size, own=catalog_url is not None)
    _print(console, out)
    if json_path:
        write_json(json_path, out)
        console.print(f"wrote {json_path}")
    progress.done(summary_line("catalog", out, json_path))
    return out


def _require_empty(url: str) -> None:
    """Refuse a database that already holds a gpufeed catalog.

    Raises:
        InvalidArgument: it does (named without its password).
        CatalogUnavailable, InternalError: it cannot be reached.
    """
    import psycopg

    from ..engine._postgres import redact

    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
            held = conn.execute("SELECT 1 FROM information_schema.tables WHERE table_schema = current_schema() "
                                "AND table_name = 'gpufeed_meta'").fetchall()
    except psycopg.OperationalError as exc:
        raise CatalogUnavailable(f"the catalog database {redact(url)} is unavailable: "
                                 f"{str(exc).strip().splitlines()[0] if str(exc).strip() else exc}") from exc
    if held:
        raise InvalidArgument(f"bench catalog needs an empty database; {redact(url)} already holds a gpufeed "
                              "catalog (an earlier run's rows stay there): give it a fresh one (createdb)")


def _report(results: list[dict], *, objects: int, size: int, threads: int, list_pages: int, durable: bool,
            pool_size: int, own: bool) -> dict:
    def rate(catalog: str, op: str, n: int) -> float:
        return next(r["ops_per_s"] for r in results if r["catalog"] == catalog and r["op"] == op
                    and r["threads"] == n)

    ratios = {f"{op}{'' if n == 1 else '_threads'}": round(rate("postgresql", op, n) / rate("sqlite", op, n), 3)
              for op, n in (("put", 1), ("head", 1), ("head", threads), ("list", 1))}
    flags = " --durable" if durable else ""
    return {
        "benchmark": "catalog",
        "command": f"gpufeed bench catalog --objects {objects} --size {size} --threads {threads} "
                   f"--list-pages {list_pages}{flags} --json PATH",
        "machine": machine_info(),
        "params": {"objects": objects, "size": size, "threads": threads, "list_pages": list_pages,
                   "durable": durable, "pool_size": pool_size, "through": "Engine (put_object, head_object, "
                   "list_objects)", "postgresql": "the user's database" if own else
                   "a throwaway PostgreSQL server on 127.0.0.1, sharing the cores"},
        "results": results,
        "postgres_vs_sqlite": ratios,
    }


def _print(console: Console, out: dict) -> None:
    p = out["params"]
    table = Table(title=f"catalog operations per second ({p['objects']:,} objects of {p['size']} B, "
                        f"{'durable' if p['durable'] else 'not durable'})")
    for col in ("op", "threads", "SQLite ops/s", "PostgreSQL ops/s", "PostgreSQL / SQLite"):
        table.add_column(col, justify="left" if col == "op" else "right")
    rows = {(r["catalog"], r["op"], r["threads"]): r for r in out["results"]}
    for (catalog, op, n), r in rows.items():
        if catalog != "sqlite":
            continue
        pg = rows[("postgresql", op, n)]
        table.add_row(op, str(n), f"{r['ops_per_s']:,.0f}", f"{pg['ops_per_s']:,.0f}",
                      f"{pg['ops_per_s'] / r['ops_per_s']:.2f}")
    console.print(table)
