"""Benchmarks, one module each (io, demo, model, checkpoint, kv, gpu); each prints a table
and can write JSON. Run them with ``gpufeed bench ...`` (see :mod:`gpufeed.cli`)."""

__all__: list[str] = []  # the submodules are the public surface
