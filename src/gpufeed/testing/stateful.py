"""A Hypothesis state machine that checks any :class:`gpufeed.store.Store` against a ``dict``.

Hypothesis runs random sequences of ``set``/``get``/``delete``/``exists``/
``list_prefix``/``list_dir``/range reads against the store and against a
plain ``dict`` model, and shrinks any disagreement to a minimal sequence.
Keys come from a tiny alphabet (with ``/``, a non-ASCII letter and ``%``) so
that sequences collide on keys and prefixes often.

Use::

    from gpufeed.testing.stateful import make_store_state_machine

    TestMyStoreStateful = make_store_state_machine(open_store, close_store).TestCase

``open_store()`` returns a fresh empty store for each run; ``close_store(store)``
(optional) releases it. The defaults (30 runs of up to 20 steps, no deadline)
keep a remote backend at ~100 µs per operation within seconds.
"""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from ..errors import InvalidRange, NoSuchKey
from ..store import (
    ByteRequest,
    OffsetByteRequest,
    RangeByteRequest,
    Store,
    SuffixByteRequest,
    resolve_range,
)

__all__ = ["make_store_state_machine", "keys", "values", "byte_requests"]

#: Keys: 1-4 characters from a small alphabet, so keys and prefixes collide.
keys = st.text(alphabet="ab/é%", min_size=1, max_size=4)
#: Values: up to 300 bytes.
values = st.binary(max_size=300)
#: Any byte request, satisfiable or not.
byte_requests = st.one_of(
    st.builds(RangeByteRequest, st.integers(0, 320), st.integers(0, 320)),
    st.builds(OffsetByteRequest, st.integers(0, 320)),
    st.builds(SuffixByteRequest, st.integers(0, 320)),
)


def _expected_range(value: bytes, request: ByteRequest) -> bytes | None:
    """The model's answer: the bytes, or ``None`` when the range is unsatisfiable."""
    try:
        start, length = resolve_range(request, len(value))
    except InvalidRange:
        return None
    return value[start : start + length]


class _StoreRules(RuleBasedStateMachine):
    """The rules and invariant, comparing ``self.store`` with the ``dict`` ``self.model``;
    subclasses say how a store is opened and closed (:func:`make_store_state_machine`)."""

    def __init__(self) -> None:
        super().__init__()
        self.store = self._open()
        self.model: dict[str, bytes] = {}

    def teardown(self) -> None:
        self._close(self.store)

    def _open(self) -> Store:
        """A fresh, empty, writable store (once per run)."""
        raise NotImplementedError

    def _close(self, store: Store) -> None:
        """Release ``store`` after its run."""

    @rule(key=keys, value=values)
    def set(self, key: str, value: bytes) -> None:
        self.store.set(key, value)
        self.model[key] = value

    @rule(key=keys)
    def get(self, key: str) -> None:
        if key in self.model:
            assert bytes(self.store.get(key)) == self.model[key]
        else:
            try:
                self.store.get(key)
            except NoSuchKey:
                pass
            else:
                raise AssertionError(f"get({key!r}) of a missing key returned a value")

    @rule(key=keys, request=byte_requests)
    def get_range(self, key: str, request: ByteRequest) -> None:
        if key not in self.model:
            return
        want = _expected_range(self.model[key], request)
        if want is None:
            try:
                self.store.get(key, request)
            except InvalidRange:
                return
            raise AssertionError(f"get({key!r}, {request}) should be unsatisfiable")
        assert bytes(self.store.get(key, request)) == want

    @rule(key=keys)
    def delete(self, key: str) -> None:
        self.store.delete(key)
        self.model.pop(key, None)

    @rule(key=keys)
    def exists(self, key: str) -> None:
        assert self.store.exists(key) == (key in self.model)

    @rule(prefix=st.text(alphabet="ab/é%", max_size=3))
    def list_prefix(self, prefix: str) -> None:
        want = sorted((k for k in self.model if k.startswith(prefix)), key=lambda k: k.encode("utf-8"))
        assert list(self.store.list_prefix(prefix)) == want

    @rule(prefix=st.sampled_from(["", "a/", "b/", "a/b/", "é/"]))
    def list_dir(self, prefix: str) -> None:
        got_keys, got_dirs = self.store.list_dir(prefix)
        want_keys, want_dirs = [], set()
        for k in self.model:
            if not k.startswith(prefix):
                continue
            rest = k[len(prefix) :]
            if "/" in rest:
                want_dirs.add(prefix + rest.split("/", 1)[0] + "/")
            else:
                want_keys.append(k)
        order = lambda k: k.encode("utf-8")  # noqa: E731
        assert got_keys == sorted(want_keys, key=order)
        assert got_dirs == sorted(want_dirs, key=order)

    @invariant()
    def count_matches(self) -> None:
        # Cheap global check: the whole listing equals the model's keys.
        assert list(self.store.list_prefix("")) == sorted(self.model, key=lambda k: k.encode("utf-8"))


def make_store_state_machine(
    open_store: Callable[[], Store],
    close_store: Callable[[Store], None] | None = None,
    *,
    max_examples: int = 30,
    stateful_step_count: int = 20,
) -> type[RuleBasedStateMachine]:
    """Build a state machine class for one store backend.

    Args:
        open_store: returns a fresh, empty, writable store (called once per run).
        close_store: releases a store after its run; optional.
        max_examples: runs (sequences) per test.
        stateful_step_count: most steps per run.

    Returns:
        A ``RuleBasedStateMachine`` subclass; assign its ``TestCase`` to a
        module-level ``Test*`` name for pytest to collect it.
    """

    class StoreStateMachine(_StoreRules):
        def _open(self) -> Store:
            return open_store()

        def _close(self, store: Store) -> None:
            if close_store is not None:
                close_store(store)

    StoreStateMachine.TestCase.settings = settings(
        max_examples=max_examples, stateful_step_count=stateful_step_count, deadline=None
    )
    return StoreStateMachine
