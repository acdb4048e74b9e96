"""The fast data path: :mod:`.protocol` (the frame format, spec ``docs/wire-protocol.md``)
and :mod:`.server` (:class:`~gpufeed.wire.server.WireServer`)."""

__all__: list[str] = []  # the submodules are the public surface
