"""load_safetensors against the live session node, over shm and TCP: bit for bit
what safetensors.torch.load_file gives, for every dtype and odd shape, sharded
models, subsets, and typed errors for hostile objects."""

from __future__ import annotations

import json
import struct
import uuid
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from gpufeed.ai import SafetensorsError, load_safetensors, load_safetensors_url
from gpufeed.client import Client
from gpufeed.errors import InvalidArgument, NoSuchKey
from gpufeed.testing.memory import resident_bytes


@pytest.fixture(scope="module", params=["shm", "tcp"])
def client(request, node):
    with Client(node.shm_url if request.param == "shm" else node.tcp_url) as c:
        yield c


@pytest.fixture(scope="module")
def bucket(node):
    name = "ai-" + uuid.uuid4().hex[:12]
    with Client(node.tcp_url) as c:
        c.create_bucket(name)
    return name


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.numel() == 0:
        return True
    return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


def assert_same(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for k in want:
        assert bits_equal(got[k], want[k]), k


def upload(client: Client, bucket: str, key: str, path: Path) -> None:
    client.put(bucket, key, path.read_bytes())


def all_dtypes() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    out = {
        "f32": torch.randn(17, 33, generator=g),
        "bf16": torch.randn(64, 3, generator=g).to(torch.bfloat16),
        "f16": torch.randn(5, 7, 3, generator=g).to(torch.float16),
        "f64": torch.randn(9, generator=g, dtype=torch.float64),
        "i64": torch.randint(-2**40, 2**40, (11,), generator=g),
        "i32": torch.randint(-1000, 1000, (3, 3), generator=g, dtype=torch.int32),
        "i8": torch.randint(-128, 127, (13,), generator=g, dtype=torch.int8),
        "u8": torch.randint(0, 255, (3, 5), generator=g, dtype=torch.uint8),
        "bool": torch.rand(19, generator=g) > 0.5,
        "scalar_f32": torch.tensor(3.25),
        "scalar_i64": torch.tensor(-7),
        "empty": torch.empty(0, 8),
        "empty_bf16": torch.empty(4, 0, dtype=torch.bfloat16),
        "odd_bytes": torch.randint(0, 255, (3,), generator=g, dtype=torch.uint8),  # breaks alignment
        "after_odd": torch.randn(10, generator=g),
    }
    if hasattr(torch, "float8_e4m3fn"):
        out["f8"] = torch.randn(6, generator=g).to(torch.float8_e4m3fn)
    return out


def test_every_dtype_is_bit_identical(client, bucket, tmp_path):
    path = tmp_path / "m.safetensors"
    save_file(all_dtypes(), path, metadata={"format": "pt"})
    upload(client, bucket, f"{client.transport}/dtypes/m.safetensors", path)
    got = load_safetensors(client, bucket, f"{client.transport}/dtypes/m.safetensors")
    assert_same(got, load_file(path))
    assert got["scalar_f32"].shape == () and got["scalar_f32"].item() == 3.25


def test_tensors_are_64_byte_aligned_views(client, bucket, tmp_path):
    path = tmp_path / "m.safetensors"
    save_file(all_dtypes(), path)
    upload(client, bucket, f"{client.transport}/align.safetensors", path)
    got = load_safetensors(client, bucket, f"{client.transport}/align.safetensors")
    for name, t in got.items():
        if t.numel():
            assert t.data_ptr() % 64 == 0, name


def test_big_tensor_crosses_chunks(client, bucket, tmp_path):
    path = tmp_path / "big.safetensors"
    g = torch.Generator().manual_seed(2)
    save_file({"a": torch.randn(300_001, generator=g), "b": torch.randn(7, generator=g)}, path)
    upload(client, bucket, f"{client.transport}/big.safetensors", path)
    got = load_safetensors(client, bucket, f"{client.transport}/big.safetensors",
                           chunk_bytes=64 << 10, batch_bytes=256 << 10, max_inflight_bytes=512 << 10)
    assert_same(got, load_file(path))


def test_only_empty_tensors(client, bucket, tmp_path):
    path = tmp_path / "e.safetensors"
    save_file({"e": torch.empty(0), "f": torch.empty(2, 0, dtype=torch.int64)}, path)
    upload(client, bucket, f"{client.transport}/empty.safetensors", path)
    assert_same(load_safetensors(client, bucket, f"{client.transport}/empty.safetensors"),
                load_file(path))


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> Path:
    """A ~2 MB random Llama saved by transformers in 4+ shards with an index."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=160, num_hidden_layers=2, vocab_size=1000,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    out = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(out, max_shard_size="100KB")
    assert (out / "model.safetensors.index.json").exists()
    return out


def reference(folder: Path) -> dict:
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(f))
    return out


@pytest.fixture(scope="module")
def uploaded_llama(node, bucket, tiny_llama) -> str:
    with Client(node.tcp_url) as c:
        for f in tiny_llama.iterdir():
            c.put(bucket, f"llama/{f.name}", f.read_bytes())
    return "llama"


@pytest.mark.parametrize("key", ["llama", "llama/", "llama/model.safetensors.index.json"])
def test_sharded_model_with_index(client, bucket, tiny_llama, uploaded_llama, key):
    got = load_safetensors(client, bucket, key)
    want = reference(tiny_llama)
    assert len({f for f in tiny_llama.glob("*.safetensors")}) > 1
    assert_same(got, want)


def test_list_of_shards_and_subset(client, bucket, tiny_llama, uploaded_llama):
    shards = sorted(f.name for f in tiny_llama.glob("*.safetensors"))
    want = reference(tiny_llama)
    names = ["lm_head.weight", "model.norm.weight", "model.layers.1.mlp.up_proj.weight"]
    got = load_safetensors(client, bucket, [f"llama/{s}" for s in shards], tensors=names)
    assert_same(got, {k: want[k] for k in names})


def test_dtype_cast_applies_to_floats_only(client, bucket, tmp_path):
    path = tmp_path / "m.safetensors"
    save_file({"w": torch.randn(4).to(torch.bfloat16), "i": torch.arange(3)}, path)
    upload(client, bucket, f"{client.transport}/cast.safetensors", path)
    got = load_safetensors(client, bucket, f"{client.transport}/cast.safetensors", dtype=torch.float32)
    assert got["w"].dtype == torch.float32 and got["i"].dtype == torch.int64
    assert torch.equal(got["w"], load_file(path)["w"].float())


def test_url_helper(node, bucket, tiny_llama, uploaded_llama):
    got = load_safetensors_url(node.shm_url, f"{bucket}/llama")
    assert_same(got, reference(tiny_llama))


def test_cuda_without_cuda_is_a_typed_error(client, bucket, uploaded_llama):
    if torch.cuda.is_available():
        pytest.skip("CUDA is available")
    with pytest.raises(InvalidArgument, match="CUDA"):
        load_safetensors(client, bucket, "llama", device="cuda:0")


@pytest.mark.gpu
def test_cuda_device(client, bucket, tiny_llama, uploaded_llama):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    got = load_safetensors(client, bucket, "llama", device="cuda:0")
    want = reference(tiny_llama)
    for k, v in want.items():
        assert got[k].device.type == "cuda" and bits_equal(got[k].cpu(), v)


def test_missing_things(client, bucket, uploaded_llama):
    with pytest.raises(InvalidArgument, match="nope"):
        load_safetensors(client, bucket, "llama", tensors=["nope"])
    with pytest.raises(NoSuchKey):
        load_safetensors(client, bucket, "no-such-folder")
    with pytest.raises(NoSuchKey):
        load_safetensors(client, bucket, "no-such.safetensors")


# --- hostile objects ---------------------------------------------------------------

def raw(header: dict | bytes, data: bytes = b"", *, length: int | None = None) -> bytes:
    js = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(js) if length is None else length) + js + data


def entry(dtype: str, shape: list, begin: int, end: int) -> dict:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


HOSTILE = {
    "truncated-header": (b"\x10\0\0\0", "truncated", None),
    "header-longer-than-object": (struct.pack("<Q", 4096) + b'{"a": 1}', "runs past the end", None),
    "offsets-beyond-object": (raw({"w": entry("F32", [4], 0, 16)}, b"\0" * 8), "past the data", "w"),
    "overlap": (raw({"a": entry("F32", [2], 0, 8), "b": entry("F32", [2], 4, 12)}, b"\0" * 12),
                "overlap", "b"),
    "hole": (raw({"a": entry("F32", [1], 0, 4), "b": entry("F32", [1], 8, 12)}, b"\0" * 12),
             "hole", "b"),
    "unknown-dtype": (raw({"w": entry("Q3", [1], 0, 1)}, b"\0"), "unknown", "w"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_object_raises_typed_error(client, bucket, case):
    blob, text, tensor = HOSTILE[case]
    key = f"{client.transport}/evil/{case}.safetensors"
    client.put(bucket, key, blob)
    for zero_copy in (False, True) if client.transport == "shm" else (False,):
        with pytest.raises(SafetensorsError) as info:
            load_safetensors(client, bucket, key, zero_copy=zero_copy)
        assert f"{bucket}/{key}" in str(info.value)
        assert text in str(info.value)
        assert info.value.tensor == tensor


def test_big_header_needs_second_read(client, bucket, tmp_path):
    path = tmp_path / "many.safetensors"
    tensors = {f"layer.{i}.a_rather_long_tensor_name_to_grow_the_header": torch.full((2,), float(i))
               for i in range(1500)}  # ~130 KiB of header, past the 64 KiB probe
    save_file(tensors, path)
    upload(client, bucket, f"{client.transport}/many.safetensors", path)
    assert_same(load_safetensors(client, bucket, f"{client.transport}/many.safetensors"),
                load_file(path))


def test_index_naming_a_missing_tensor(client, bucket, tmp_path):
    path = tmp_path / "m.safetensors"
    save_file({"a": torch.zeros(2)}, path)
    folder = f"{client.transport}/badindex"
    upload(client, bucket, f"{folder}/m.safetensors", path)
    client.put(bucket, f"{folder}/model.safetensors.index.json",
               json.dumps({"weight_map": {"a": "m.safetensors", "b": "m.safetensors"}}).encode())
    with pytest.raises(SafetensorsError) as info:
        load_safetensors(client, bucket, folder)
    assert info.value.tensor == "b" and f"{folder}/m.safetensors" in str(info.value)


def test_same_tensor_in_two_shards(client, bucket, tmp_path):
    for name in ("x", "y"):
        save_file({"a": torch.zeros(2)}, tmp_path / f"{name}.safetensors")
        upload(client, bucket, f"{client.transport}/dup/{name}.safetensors",
               tmp_path / f"{name}.safetensors")
    with pytest.raises(SafetensorsError, match="also in") as info:
        load_safetensors(client, bucket, f"{client.transport}/dup")
    assert info.value.tensor == "a"


# --- zero_copy=True: tensors view the node's mapped data files -----------------------

@pytest.fixture(scope="module")
def shm_client(node):
    with Client(node.shm_url) as c:
        yield c


def test_zero_copy_every_dtype_is_bit_identical(shm_client, bucket, tmp_path):
    path = tmp_path / "m.safetensors"
    save_file(all_dtypes(), path, metadata={"format": "pt"})
    key = "zero-copy/dtypes.safetensors"
    upload(shm_client, bucket, key, path)
    got = load_safetensors(shm_client, bucket, key, zero_copy=True)
    assert_same(got, load_file(path))
    for name, t in got.items():  # aligned views, or copies where the file is not aligned
        assert t.data_ptr() % t.element_size() == 0, name


def test_zero_copy_sharded_model_subset_and_cast(shm_client, bucket, tiny_llama, uploaded_llama):
    want = reference(tiny_llama)
    assert_same(load_safetensors(shm_client, bucket, "llama", zero_copy=True), want)
    names = ["lm_head.weight", "model.norm.weight"]
    got = load_safetensors(shm_client, bucket, "llama", keys=names, zero_copy=True)
    assert_same(got, {k: want[k] for k in names})
    cast = load_safetensors(shm_client, bucket, "llama", keys=names, dtype=torch.float32,
                            zero_copy=True)
    assert all(t.dtype == torch.float32 for t in cast.values())
    assert torch.equal(cast["lm_head.weight"], want["lm_head.weight"].float())


def test_zero_copy_tensors_are_mapped_in_and_copy_on_write(shm_client, bucket):
    big = torch.arange(6 << 20, dtype=torch.float32)  # 24 MiB
    key = "zero-copy/big.safetensors"
    from safetensors.torch import save
    shm_client.put(bucket, key, save({"big": big}))
    got = load_safetensors(shm_client, bucket, key, zero_copy=True)["big"]
    assert resident_bytes(got.data_ptr()) >= big.numel() * 4  # every page mapped before return
    got[:10] = -1.0  # private pages: the stored object is untouched
    again = load_safetensors(shm_client, bucket, key, zero_copy=True)["big"]
    assert torch.equal(again, big)
    # a snapshot: overwriting and deleting the object leaves loaded tensors as they were
    shm_client.put(bucket, key, save({"big": torch.zeros(4)}))
    assert torch.equal(again, big)
    shm_client.delete(bucket, key)
    assert torch.equal(again, big) and got[10].item() == 10.0


def test_zero_copy_refusals(node, shm_client, bucket, uploaded_llama):
    for kw in ({"device": "meta"}, {"shard": (0, 2, 0)}, {"staging_bytes": 1 << 20}):
        with pytest.raises(InvalidArgument):
            load_safetensors(shm_client, bucket, "llama", zero_copy=True, **kw)
    with Client(node.tcp_url) as tcp, pytest.raises(InvalidArgument, match="shm"):
        load_safetensors(tcp, bucket, "llama", zero_copy=True)
    with pytest.raises(NoSuchKey):
        load_safetensors(shm_client, bucket, "no-such.safetensors", zero_copy=True)


def test_zero_copy_misaligned_tensor_is_copied_aligned(shm_client, bucket):
    f32 = struct.pack("<2f", 1.5, -2.25)
    blob = raw({"a": entry("U8", [3], 0, 3), "b": entry("F32", [2], 3, 11)}, b"\x01\x02\x03" + f32)
    hlen = struct.unpack_from("<Q", blob)[0]
    assert (8 + hlen + 3) % 4  # "b" starts off its 4-byte alignment in the object
    key = "zero-copy/misaligned.safetensors"
    shm_client.put(bucket, key, blob)
    got = load_safetensors(shm_client, bucket, key, zero_copy=True)
    assert got["a"].tolist() == [1, 2, 3]
    assert got["b"].tolist() == [1.5, -2.25] and got["b"].data_ptr() % 4 == 0


def test_empty_index_and_string_dtype_are_typed_errors(shm_client, bucket, uploaded_llama):
    shm_client.put(bucket, "empty-index/model.safetensors.index.json",
                   json.dumps({"metadata": {}, "weight_map": {}}).encode())
    with pytest.raises(SafetensorsError, match="empty"):
        load_safetensors(shm_client, bucket, "empty-index")
    with pytest.raises(InvalidArgument, match="torch.dtype"):
        load_safetensors(shm_client, bucket, "llama", dtype="float16")
