"""Conformance suites and fixtures that ship with the package.

- :mod:`gpufeed.testing.store`: ``StoreTests``, the behavioural suite every
  :class:`gpufeed.store.Store` backend subclasses.
- :mod:`gpufeed.testing.catalog`: ``CatalogTests``, the behavioural suite every
  engine catalog (:class:`gpufeed.engine.catalog.Catalog`) subclasses.
- :mod:`gpufeed.testing.stateful`: a Hypothesis state machine checking any
  store against a ``dict``.
- :mod:`gpufeed.testing.node`: a real node subprocess for end-to-end tests.
- :mod:`gpufeed.testing.memory`: ``resident_bytes``, what this process has mapped.
- :mod:`gpufeed.testing.s3fuzz`: ``run_fuzz``, a bounded fuzz of a node's S3 port
  with malformed and hostile HTTP requests.

The first three import pytest / Hypothesis, so import them from tests only.
"""

__all__: list[str] = []  # the submodules are the public surface
