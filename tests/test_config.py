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


def test_wire_limits_defaults_and_env(monkeypatch):
    for name in ("MAX_CONNECTIONS", "HEADER_TIMEOUT_S", "IDLE_TIMEOUT_S", "MAX_META_BYTES",
                 "CLIENT_MEMORY_BYTES"):
        monkeypatch.delenv(f"GPUFEED_WIRE_{name}", raising=False)
    wire = NodeConfig.from_env().wire
    assert (wire.max_connections, wire.header_timeout_s, wire.idle_timeout_s) == (1024, 10.0, 0.0)
    assert wire.max_meta_bytes == 16 << 20 and wire.client_memory_bytes > 0
    monkeypatch.setenv("GPUFEED_WIRE_MAX_CONNECTIONS", "7")
    monkeypatch.setenv("GPUFEED_WIRE_IDLE_TIMEOUT_S", "2.5")
    monkeypatch.setenv("GPUFEED_WIRE_CLIENT_MEMORY_BYTES", "64MiB")
    wire = NodeConfig.from_env().wire
    assert (wire.max_connections, wire.idle_timeout_s, wire.client_memory_bytes) == (7, 2.5, 64 << 20)


@pytest.mark.parametrize("name,raw", [("MAX_CONNECTIONS", "0"), ("HEADER_TIMEOUT_S", "-1"),
                                      ("NODE_MEMORY_BYTES", "lots")])
def test_wire_limits_bad_env_names_the_variable(monkeypatch, name, raw):
    monkeypatch.setenv(f"GPUFEED_WIRE_{name}", raw)
    with pytest.raises(ValueError, match=f"GPUFEED_WIRE_{name}"):
        NodeConfig.from_env()


def test_catalog_settings_from_env_and_hidden_from_repr(monkeypatch):
    for name in ("GPUFEED_CATALOG", "GPUFEED_CATALOG_POOL_SIZE", "GPUFEED_CATALOG_TIMEOUT_S", "GPUFEED_CLUSTER"):
        monkeypatch.delenv(name, raising=False)
    cfg = NodeConfig.from_env()
    assert (cfg.catalog, cfg.catalog_pool_size, cfg.catalog_timeout_s, cfg.cluster) == ("", 8, 5.0, "")
    monkeypatch.setenv("GPUFEED_CATALOG", "postgresql://gf:hunter2@db:5432/gpufeed")
    monkeypatch.setenv("GPUFEED_CATALOG_POOL_SIZE", "3")
    monkeypatch.setenv("GPUFEED_CATALOG_TIMEOUT_S", "1.5")
    monkeypatch.setenv("GPUFEED_CLUSTER", "east")
    cfg = NodeConfig.from_env()
    assert (cfg.catalog_pool_size, cfg.catalog_timeout_s, cfg.cluster) == (3, 1.5, "east")
    assert cfg.catalog.endswith("/gpufeed") and "hunter2" not in repr(cfg)
    assert NodeConfig.from_env(catalog="").catalog == ""
    monkeypatch.setenv("GPUFEED_CATALOG_POOL_SIZE", "1")
    with pytest.raises(ValueError, match="GPUFEED_CATALOG_POOL_SIZE"):
        NodeConfig.from_env()


def test_cluster_settings_from_env(monkeypatch):
    names = ("GPUFEED_CLUSTER_HEARTBEAT_S", "GPUFEED_CLUSTER_EXPIRY_S", "GPUFEED_CLUSTER_ADVERTISE_HOST",
             "GPUFEED_CLUSTER_BYTES_INTERVAL_S")
    for name in names:
        monkeypatch.delenv(name, raising=False)
    cfg = NodeConfig.from_env()
    assert (cfg.cluster_heartbeat_s, cfg.cluster_expiry_s, cfg.cluster_advertise_host,
            cfg.cluster_bytes_interval_s) == (2.0, 10.0, "", 60.0)
    for name, value in zip(names, ("0.5", "4", "node1.example", "30"), strict=True):
        monkeypatch.setenv(name, value)
    cfg = NodeConfig.from_env()
    assert (cfg.cluster_heartbeat_s, cfg.cluster_expiry_s, cfg.cluster_advertise_host,
            cfg.cluster_bytes_interval_s) == (0.5, 4.0, "node1.example", 30.0)
    monkeypatch.setenv("GPUFEED_CLUSTER_EXPIRY_S", "-1")
    with pytest.raises(ValueError, match="GPUFEED_CLUSTER_EXPIRY_S"):
        NodeConfig.from_env()
