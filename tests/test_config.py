"""NodeConfig: defaults, environment variables, bad values."""

import socket
import struct

import pytest

from gpufeed.config import NodeConfig
from gpufeed.wire._frames import set_send_timeout


def test_send_timeout_default_and_env(monkeypatch):
    monkeypatch.delenv("GPUFEED_SEND_TIMEOUT_S", raising=False)
    assert NodeConfig.from_env().send_timeout_s == 30
    monkeypatch.setenv("GPUFEED_SEND_TIMEOUT_S", "2.5")
    assert NodeConfig.from_env().send_timeout_s == 2.5
    assert NodeConfig.from_env(send_timeout_s=7).send_timeout_s == 7


@pytest.mark.parametrize("raw", ["-1", "nan", "inf", "soon"])
def test_send_timeout_bad_env_names_the_variable(monkeypatch, raw):
    monkeypatch.setenv("GPUFEED_SEND_TIMEOUT_S", raw)
    with pytest.raises(ValueError, match="GPUFEED_SEND_TIMEOUT_S"):
        NodeConfig.from_env()


def test_send_timeout_reaches_the_socket():
    a, b = socket.socketpair()
    try:
        set_send_timeout(a, 2.5)
        sec, usec = struct.unpack("ll", a.getsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, 16))
        assert (sec, usec) == (2, 500_000)
    finally:
        a.close()
        b.close()
