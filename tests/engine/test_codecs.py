"""The chunk store's pure functions (engine/_codecs.py): codecs, digests, CDC cuts.

Real data: a tokenized text corpus made from the standard library's ``.py``
files and bf16 weights made with numpy (gpufeed.bench.codecs builds both)."""

from __future__ import annotations

import threading
import time

import blake3
import numpy as np
import pytest
import xxhash

from gpufeed.bench.codecs import bf16_weights, token_corpus
from gpufeed.engine import _codecs as codecs
from gpufeed.engine._codecs import (
    cdc_cuts,
    chunk_digest,
    compress_chunk,
    decompress_chunk,
    format_compression,
    parse_compression,
)
from gpufeed.errors import S3_ERRORS, ChunkCorrupt, InvalidArgument

MiB = 1 << 20
KiB = 1 << 10
SETTINGS = [("lz4", 0), ("zstd", 1), ("zstd", 3), ("zstd", 19)]


@pytest.fixture(scope="module")
def corpus() -> memoryview:
    return memoryview(token_corpus(4 * MiB)).cast("B")


@pytest.fixture(scope="module")
def random_bf16() -> np.ndarray:
    return bf16_weights(4 * MiB, "random", seed=7)


# --- settings ---------------------------------------------------------------------------------

@pytest.mark.parametrize("text, want", [
    ("off", ("off", 0)), ("lz4", ("lz4", 0)), ("zstd", ("zstd", 3)), ("zstd:1", ("zstd", 1)),
    ("zstd:19", ("zstd", 19)), (" ZSTD:7 ", ("zstd", 7)), ("LZ4", ("lz4", 0)),
])
def test_parse_compression(text, want):
    assert parse_compression(text) == want
    assert parse_compression(format_compression(*want)) == want


@pytest.mark.parametrize("text", ["", "gzip", "zstd:0", "zstd:20", "zstd:", "zstd:-1", "zstd:+3", "zstd:3.0",
                                  "lz4:1", "off:1", "zstd:٣", "zstd:3:4", None, 3])
def test_parse_compression_refuses(text):
    with pytest.raises(InvalidArgument):
        parse_compression(text)


@pytest.mark.parametrize("codec, level", [("gzip", 0), ("zstd", 0), ("zstd", 20), ("ZSTD", 3)])
def test_bad_codec_arguments(codec, level):
    with pytest.raises(InvalidArgument):
        compress_chunk(memoryview(b"x" * 1000), codec, level)
    with pytest.raises(InvalidArgument):
        format_compression(codec, level)


# --- round trips --------------------------------------------------------------------------------

@pytest.mark.parametrize("codec, level", SETTINGS)
def test_round_trip_corpus(corpus, codec, level):
    stored = compress_chunk(corpus, codec, level)
    assert stored is not None and len(stored) < len(corpus) / (1.5 if codec == "lz4" else 2.5)
    assert decompress_chunk(stored, codec, len(corpus)) == corpus
    out = bytearray(len(corpus))
    assert decompress_chunk(memoryview(stored), codec, len(corpus), memoryview(out)) is None
    assert out == corpus


@pytest.mark.parametrize("codec, level", SETTINGS)
@pytest.mark.parametrize("size", [1, 100, 4096, 100_000, 2 * 64 * KiB, 3 * MiB + 7])
def test_round_trip_sizes(codec, level, size):
    data = bytes(range(256)) * (size // 256) + b"\x05" * (size % 256)  # compressible at every size
    stored = compress_chunk(memoryview(data), codec, level)
    if stored is None:
        assert size <= 100  # too small to gain 3 %
        return
    assert decompress_chunk(stored, codec, size) == data
    out = np.zeros(size, np.uint8)
    decompress_chunk(stored, codec, size, memoryview(out))
    assert out.tobytes() == data


def test_off_codec_and_empty_chunks(corpus):
    assert compress_chunk(corpus, "off", 0) is None
    assert compress_chunk(memoryview(b""), "zstd", 3) is None
    assert decompress_chunk(corpus, "off", len(corpus)) == corpus
    out = bytearray(len(corpus))
    decompress_chunk(corpus, "off", len(corpus), memoryview(out))
    assert out == corpus
    assert decompress_chunk(b"", "off", 0) == b""


def test_numpy_arrays_of_any_dtype(corpus):
    tokens = np.frombuffer(corpus, np.uint16)
    stored = compress_chunk(tokens, "zstd", 3)
    assert stored == compress_chunk(corpus, "zstd", 3)
    out = np.empty_like(tokens)
    decompress_chunk(stored, "zstd", tokens.nbytes, memoryview(out))
    assert np.array_equal(out, tokens)


def test_out_of_the_wrong_size_is_a_caller_error(corpus):
    stored = compress_chunk(corpus, "lz4", 0)
    with pytest.raises(ValueError):
        decompress_chunk(stored, "lz4", len(corpus), memoryview(bytearray(len(corpus) - 1)))
    with pytest.raises(InvalidArgument):
        decompress_chunk(stored, "gzip", len(corpus))


# --- skipping what does not shrink ----------------------------------------------------------------

@pytest.mark.parametrize("codec, level", SETTINGS)
def test_random_bf16_is_skipped(random_bf16, codec, level):
    assert compress_chunk(random_bf16, codec, level) is None


def test_normal_bf16_gains_with_zstd_only():
    weights = bf16_weights(4 * MiB, "normal", seed=3)
    assert compress_chunk(weights, "lz4", 0) is None  # no entropy stage: nothing to gain
    stored = compress_chunk(weights, "zstd", 1)  # the probe is zstd too, so it does not skip this
    assert stored is not None and len(stored) < weights.nbytes / 1.2
    assert decompress_chunk(stored, "zstd", weights.nbytes) == weights.tobytes()


def test_skip_is_decided_by_the_middle_sample(random_bf16):
    # zeros everywhere but a random middle: the probe sees the random part and skips the whole chunk
    chunk = np.zeros(4 * MiB, np.uint8)
    mid = len(chunk) // 2
    chunk[mid - 64 * KiB:mid + 64 * KiB] = np.frombuffer(random_bf16, np.uint8)[:128 * KiB]
    assert compress_chunk(chunk, "lz4", 0) is None
    # the other way round: a compressible middle, random elsewhere: compressed, then refused as not paying
    chunk = np.frombuffer(random_bf16, np.uint8).copy()
    chunk[mid - 64 * KiB:mid + 64 * KiB] = 0
    assert compress_chunk(chunk, "lz4", 0) is None


def test_a_gain_under_3_percent_is_not_kept():
    rng = np.random.default_rng(5)
    data = rng.integers(0, 256, 100 * KiB, dtype=np.uint8)  # under the probe's size: compressed whole
    data[:KiB] = 0  # ~1 % compressible
    assert compress_chunk(data, "zstd", 3) is None
    data[:10 * KiB] = 0  # ~10 %
    assert compress_chunk(data, "zstd", 3) is not None


def test_skip_costs_a_small_fraction_of_compressing(random_bf16):
    def median_s(fn) -> float:
        times = []
        for _ in range(15):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return sorted(times)[len(times) // 2]

    import lz4.block

    skip = median_s(lambda: compress_chunk(random_bf16, "lz4", 0))
    whole = median_s(lambda: lz4.block.compress(random_bf16, store_size=False))
    assert skip < whole / 5, (skip, whole)  # ~10 us against ~1 ms here


# --- corruption -----------------------------------------------------------------------------------

@pytest.mark.parametrize("codec, level", SETTINGS[:2])
def test_corrupt_streams_raise_chunk_corrupt(corpus, codec, level):
    data = corpus[:256 * KiB]
    stored = compress_chunk(data, codec, level)
    size = len(data)
    bad = [stored[: len(stored) // 2], stored[:-1], stored[:5], b"", b"\x00" * 64, bytes(range(256)) * 8]
    for stream in bad:
        with pytest.raises(ChunkCorrupt):
            decompress_chunk(stream, codec, size)
        with pytest.raises(ChunkCorrupt):
            decompress_chunk(stream, codec, size, memoryview(bytearray(size)))
    for wrong in (size - 1, size + 1, 0):
        with pytest.raises(ChunkCorrupt):
            decompress_chunk(stored, codec, wrong)


@pytest.mark.parametrize("codec, level", SETTINGS[:2])
def test_bit_flips_never_escape_as_library_errors(corpus, codec, level):
    """A flipped bit either raises ChunkCorrupt or decodes to exactly ``size`` bytes (the
    digest check catches those): no other exception, no other length."""
    data = corpus[:128 * KiB]
    stored = bytearray(compress_chunk(data, codec, level))
    rng = np.random.default_rng(11)
    raised = 0
    for pos in [0, 1, 2, 3, 4, 5, 6, 7, 8, *rng.integers(0, len(stored), 200).tolist(), len(stored) - 1]:
        damaged = bytearray(stored)
        damaged[pos] ^= 1 << int(rng.integers(0, 8))
        for out in (None, memoryview(bytearray(len(data)))):
            try:
                got = decompress_chunk(damaged, codec, len(data), out)
            except ChunkCorrupt:
                raised += 1
                continue
            assert len(got if out is None else out) == len(data)
    assert raised > 0


def test_raw_chunk_of_the_wrong_length():
    with pytest.raises(ChunkCorrupt):
        decompress_chunk(b"abc", "off", 4)


def test_chunk_corrupt_carries_its_context():
    err = ChunkCorrupt("zstd chunk does not decode")
    assert err.status == 500 and err.code == "ChunkCorrupt" and S3_ERRORS["ChunkCorrupt"][0] is ChunkCorrupt
    assert (err.bucket, err.key, err.chunk) == (None, None, None)
    assert err.attach(bucket="b", key="k/1") is err
    err.attach(chunk="ab12")
    assert (err.bucket, err.key, err.chunk) == ("b", "k/1", "ab12")
    assert err.message == "zstd chunk does not decode (bucket 'b', key 'k/1', chunk 'ab12')" == str(err)
    assert ChunkCorrupt("x", bucket="b").message == "x (bucket 'b')"


# --- digests and block sums -------------------------------------------------------------------------

@pytest.mark.parametrize("size", [0, 1, 64 * KiB, MiB - 1, MiB, 4 * MiB + 3])
def test_digests_match_references(corpus, random_bf16, size):
    for src in (corpus, memoryview(random_bf16).cast("B")):
        data = bytes(src[:size]) if size <= len(src) else bytes(src) + b"\x01" * (size - len(src))
        assert chunk_digest(memoryview(data), "blake3") == blake3.blake3(data).digest()
        assert chunk_digest(data, "xxh3") == xxhash.xxh3_128(data).digest()
        assert len(chunk_digest(data, "blake3")) == codecs.digest_size("blake3") == 32
        assert len(chunk_digest(data, "xxh3")) == codecs.digest_size("xxh3") == 16
    assert chunk_digest(random_bf16, "blake3") == blake3.blake3(random_bf16.tobytes()).digest()


def test_unknown_digest():
    with pytest.raises(InvalidArgument):
        chunk_digest(b"x", "sha1")


# --- content-defined cuts ----------------------------------------------------------------------------

def test_the_cython_scan_is_the_one_used():
    import fastcdc.fastcdc_cy

    assert codecs._fastcdc is fastcdc.fastcdc_cy.fastcdc_cy
    assert fastcdc.fastcdc_cy.__file__.endswith(".so")


@pytest.mark.parametrize("avg", [64 * KiB, 256 * KiB, MiB])
def test_cdc_cut_sizes(random_bf16, avg):
    data = memoryview(random_bf16).cast("B")
    cuts = cdc_cuts(data, avg_size=avg)
    assert cuts[-1] == len(data) and cuts == sorted(set(cuts))
    sizes = np.diff([0, *cuts])
    assert sizes[:-1].min() >= avg // 4 and sizes.max() <= avg * 4
    assert avg / 2 < len(data) / len(cuts) < avg * 2
    assert cdc_cuts(data[:100], avg_size=avg) == [100]
    assert cdc_cuts(b"", avg_size=avg) == []


def test_cdc_inserting_bytes_near_the_start_moves_only_the_first_chunks():
    data = bf16_weights(64 * MiB, "random", seed=21).tobytes()
    shifted = data[:1000] + b"inserted" + data[1000:]
    before = cdc_cuts(data, avg_size=256 * KiB)
    after = cdc_cuts(shifted, avg_size=256 * KiB)
    old = {xxhash.xxh3_128_digest(data[a:b]) for a, b in zip([0, *before], before)}
    new = [xxhash.xxh3_128_digest(shifted[a:b]) for a, b in zip([0, *after], after)]
    changed = [i for i, d in enumerate(new) if d not in old]
    assert changed and max(changed) <= 1, changed  # only the first one or two chunks differ
    assert len(before) > 200 and abs(len(after) - len(before)) <= 1
    assert set(before[2:]) <= {c - 8 for c in after}  # every later cut moved by the 8 inserted bytes


@pytest.mark.parametrize("kwargs", [
    {"avg_size": 32 * KiB}, {"avg_size": 2 * MiB}, {"avg_size": 100.5},
    {"avg_size": 256 * KiB, "min_size": 8 * KiB}, {"avg_size": 256 * KiB, "min_size": 512 * KiB},
    {"avg_size": 256 * KiB, "max_size": 128 * KiB}, {"avg_size": MiB, "max_size": 16 * MiB},
    {"avg_size": 64 * KiB, "max_size": 2 * MiB}, {"avg_size": 256 * KiB, "min_size": "1"},
])
def test_cdc_bad_sizes(kwargs):
    with pytest.raises(InvalidArgument):
        cdc_cuts(b"x" * 1000, **kwargs)


def test_cdc_explicit_limits(random_bf16):
    cuts = cdc_cuts(random_bf16, min_size=16 * KiB, avg_size=64 * KiB, max_size=MiB)
    sizes = np.diff([0, *cuts])
    assert sizes[:-1].min() >= 16 * KiB and sizes.max() <= MiB


# --- threads ----------------------------------------------------------------------------------------

def test_many_threads_get_the_same_answers(corpus):
    pieces = [corpus[i * 512 * KiB:(i + 1) * 512 * KiB] for i in range(8)]
    want = {(i, c, lv): compress_chunk(p, c, lv) for i, p in enumerate(pieces) for c, lv in SETTINGS[:3]}
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            order = list(want)
            np.random.default_rng(seed).shuffle(order)
            for i, c, lv in order * 2:
                stored = compress_chunk(pieces[i], c, lv)
                assert stored == want[(i, c, lv)]
                assert decompress_chunk(stored, c, len(pieces[i])) == pieces[i]
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
