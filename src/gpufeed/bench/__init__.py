"""Benchmarks, one module each (io, demo, model, checkpoint, kv, gpu, ...); each prints a
table, shows its progress on stderr (:mod:`gpufeed.bench._output`) and can write JSON;
:mod:`gpufeed.bench.report` puts every JSON on one HTML page. Run them with
``gpufeed bench ...`` (see :mod:`gpufeed.cli`)."""

__all__: list[str] = []  # the submodules are the public surface
