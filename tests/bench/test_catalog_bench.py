"""``gpufeed bench catalog``: both catalogs measured in one run, the JSON shape."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from gpufeed.bench.catalog import run_catalog_bench
from gpufeed.errors import InvalidArgument


def test_catalog_bench_measures_both_catalogs(tmp_path, postgres_url):
    path = tmp_path / "catalog.json"
    out = run_catalog_bench(objects=40, threads=2, list_pages=2, catalog_url=postgres_url, json_path=str(path),
                            console=Console(file=io.StringIO()))
    saved = json.loads(path.read_text())
    assert saved["benchmark"] == "catalog" and saved["command"].startswith("gpufeed bench catalog")
    ops = {(r["catalog"], r["op"], r["threads"]) for r in out["results"]}
    assert ops == {(c, op, n) for c in ("sqlite", "postgresql") for op, n in
                   (("put", 1), ("head", 1), ("head", 2), ("list", 1))}
    assert all(r["ops_per_s"] > 0 for r in out["results"])
    assert set(out["postgres_vs_sqlite"]) == {"put", "head", "head_threads", "list"}
    # a second run on the same database is refused clearly (its rows would mix with the first's)
    with pytest.raises(InvalidArgument, match="needs an empty database"):
        run_catalog_bench(objects=40, threads=2, list_pages=2, catalog_url=postgres_url,
                          console=Console(file=io.StringIO()))
