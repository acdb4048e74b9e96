"""Where a cluster's copies of data files are: the PostgreSQL catalog's
``file_copies`` table (schema version 4), and of the part files of open
multipart uploads: ``part_copies`` (schema version 7; a row per node holding
the file, the node that received the part among them, deleted with the part
or the upload).

Each chunk's row names its **holder**, the node that wrote its data file; a
row ``(file, node)`` of ``file_copies`` says that ``node``'s data folder holds
a whole, checked copy of data file ``file`` too (the holder is listed there
only after rebalancing made a copy's node the holder, and is then counted
once). Copies are kept per data file, not per chunk: a chunk lives in one
data file, and the chunks of a compressed version share one. The copies of
chunk ``c`` are therefore its holder and the rows of ``file_copies`` for
``c.file``.

A chunk's **live copies** are those on live members; the statements here take
the live node ids as a parameter (membership is judged by the node's expiry
setting, :mod:`._membership`). Only ``= ANY(array)``, correlated subqueries,
``INSERT ... ON CONFLICT`` and plain DML are used (accepted by PostgreSQL,
CockroachDB and YugabyteDB alike).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__all__ = ["PgCopyReads", "UNDER_SQL", "OVER_SQL"]

#: Rows of ``chunks c`` with fewer live copies than the factor; parameters:
#: live node ids (array), live node ids again, the factor.
UNDER_SQL = ("(CASE WHEN c.holder = ANY(%s) THEN 1 ELSE 0 END) + (SELECT COUNT(*) FROM file_copies f"
             " WHERE f.file = c.file AND f.node = ANY(%s) AND f.node <> c.holder) < %s")


#: Rows of ``chunks c`` with more live copies than the factor; parameters as UNDER_SQL.
OVER_SQL = UNDER_SQL.replace(" < %s", " > %s")


class PgCopyReads:
    """Reads of ``file_copies`` over :meth:`_rows` (mixed into the catalog's readers)."""

    _holder: str = ""

    if TYPE_CHECKING:
        def _rows(self, sql: str, args: tuple = ()) -> list[tuple]:
            """Run one statement; its rows."""

    def file_copies(self, file: str) -> list[str]:
        """Node ids that hold a copy of data file ``file`` besides its chunks' holder, sorted."""
        return [r[0] for r in self._rows("SELECT node FROM file_copies WHERE file = %s ORDER BY node", (file,))]

    def copy_files(self) -> set[str]:
        """Ids of the data files this node holds as copies (named by a chunk it is
        not the holder of: a node that became a file's holder by rebalancing
        keeps its row, :meth:`PostgresCatalog.give_up_file`)."""
        if not self._holder:
            return set()
        return {r[0] for r in self._rows(
            "SELECT f.file FROM file_copies f WHERE f.node = %s AND EXISTS"
            " (SELECT 1 FROM chunks c WHERE c.file = f.file AND c.holder <> f.node)", (self._holder,))}

    def under_replicated(self, live: list[str], factor: int) -> int:
        """Chunks with fewer than ``factor`` copies on the nodes ``live``."""
        return int(self._rows(f"SELECT COUNT(*) FROM chunks c WHERE {UNDER_SQL}",
                              (sorted(live), sorted(live), factor))[0][0])

    def under_replicated_parts(self, live: list[str], factor: int) -> int:
        """Parts of open multipart uploads with fewer than ``factor`` copies of their
        file on the nodes ``live`` (``part_copies``; a part with no row there, from
        a catalog of schema version 5, is not counted)."""
        return int(self._rows(
            "SELECT COUNT(*) FROM parts p WHERE EXISTS (SELECT 1 FROM part_copies c WHERE c.upload_id ="
            " p.upload_id AND c.file = p.file) AND (SELECT COUNT(*) FROM part_copies c WHERE c.upload_id ="
            " p.upload_id AND c.file = p.file AND c.node = ANY(%s)) < %s", (sorted(live), factor))[0][0])

    def under_replicated_files(self, live: list[str], factor: int, after: str, limit: int) -> list[str]:
        """Ids of data files after ``after`` (in id order, at most ``limit``) with a
        chunk that has fewer than ``factor`` copies on the nodes ``live``."""
        return [r[0] for r in self._rows(
            f"SELECT DISTINCT c.file FROM chunks c WHERE c.file > %s AND {UNDER_SQL} ORDER BY c.file LIMIT %s",
            (after, sorted(live), sorted(live), factor, limit))]

    def over_replicated_files(self, live: list[str], factor: int, after: str, limit: int) -> list[str]:
        """Ids of data files this node holds (as holder or copy), after ``after`` (in id
        order, at most ``limit``), with a chunk that has more than ``factor`` copies on
        the nodes ``live``."""
        if not self._holder:
            return []
        return [r[0] for r in self._rows(
            f"SELECT DISTINCT c.file FROM chunks c WHERE c.file > %s AND {OVER_SQL} AND (c.holder = %s OR EXISTS"
            " (SELECT 1 FROM file_copies f WHERE f.file = c.file AND f.node = %s)) ORDER BY c.file LIMIT %s",
            (after, sorted(live), sorted(live), factor, self._holder, self._holder, limit))]
