"""The gpufeed fast-path wire protocol (spec: ``docs/wire-protocol.md``).

Written here rather than taken from a library because the framing *is* the
product: the header is fixed-size so a receiver can ``recv_into`` it, object
bytes follow as a raw payload so the server can ``sendfile`` them and the
client can ``recv_into`` the caller's buffer, and on the shared-memory
transport no payload crosses the socket at all. The metadata section uses
msgpack through msgspec (typed structs, validated on decode).

Every frame, in both directions::

    offset size field
    0      2    magic       b"GF"
    2      1    version     1
    3      1    op          request op; reply = op | 0x80; error reply = 0xFF
    4      4    meta_len    u32 LE, bytes of msgpack metadata that follow (<= MAX_META)
    8      8    request_id  u64 LE, chosen by the client, echoed by the reply
    16     8    payload_len u64 LE, raw bytes after the metadata

Metadata structs only ever grow at their end, each added field with a default
that keeps the earlier meaning, and a receiver ignores trailing fields it does
not know (msgspec's array decoding does), so the version byte stays 1. A
request whose added field an older node would ignore (an object version) is
sent only to a node whose HELLO lists the feature (``"versions"``,
``"snapshots"``).

A connection authenticates once, right after HELLO: the HELLO reply carries a
fresh server nonce, the client answers with AUTH (its access key id, its own
nonce and :func:`auth_proof`), and the server answers with its own proof. Every
other op before that is refused (``AccessDenied``) and the connection closed.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
from enum import IntEnum
from typing import Any

import msgspec

from ..errors import GpufeedError, InvalidArgument, ProtocolError, error_from_code
from ._partproto import PART_ACTIONS, PART_HAS_MAX, PartFile, PartFileReply

__all__ = [
    "MAGIC", "VERSION", "HEADER", "HEADER_SIZE", "MAX_META", "Op", "REPLY", "ERROR_OP",
    "Hello", "HelloReply", "Register", "Unregister", "AllocRegion", "AllocRegionReply", "Head",
    "Get", "GetV", "Put", "Delete", "DeleteResult", "FIRST_FORM_FIELDS", "error_from_reply",
    "List", "BucketReq", "Empty", "ObjectMeta", "GetReply", "GetVReply", "ListReply",
    "BucketsReply", "BucketStats", "ErrorReply", "encode", "decoder_for", "pack_header", "unpack_header",
    "close_fds", "ListEntry", "MapReply", "decode", "Auth", "AuthReply", "auth_key", "auth_proof", "ChunkReq",
    "ChunkReply", "CopyChunk", "ChunkPut", "ChunkPutReply", "GetRanges", "GetRangesReply", "MAX_RANGES",
    "MAX_RANGE_BYTES", "Member", "LocateReply", "LeaseReply", "PartFile", "PartFileReply", "PART_ACTIONS",
    "PART_HAS_MAX",
    "AUTH_LABEL", "NONCE_BYTES", "MapExtentsReply", "FDS_PER_MESSAGE",
]

MAGIC = b"GF"
VERSION = 1
HEADER = struct.Struct("<2sBBIQQ")
HEADER_SIZE = HEADER.size  # 24 bytes
MAX_META = 16 << 20  # 16 MiB: a get_many of ~100k items
#: Most items of one GETR, and most bytes of one of its ranges.
MAX_RANGES = 1 << 16
MAX_RANGE_BYTES = 64 << 20
REPLY = 0x80
ERROR_OP = 0xFF
#: Most descriptors one message carries (Linux's ``SCM_MAX_FD``): a MAP_EXTENTS
#: reply with more sends the rest with its payload bytes, this many per byte.
FDS_PER_MESSAGE = 253


class Op(IntEnum):
    """Request opcodes. A reply carries ``op | 0x80``; an error reply ``0xFF``."""

    HELLO = 1
    REGISTER = 2  # shm only: an fd travels with this frame (SCM_RIGHTS)
    UNREGISTER = 3
    ALLOC_REGION = 4  # shm only: an fd travels with the reply frame (SCM_RIGHTS)
    FORKED = 5  # shm: the client process forked; what it was lent so far is never reused
    AUTH = 6  # prove the connection holds an access key's secret (after HELLO)
    HEAD = 10
    GET = 11
    GETV = 12
    PUT = 13
    DELETE = 14
    LIST = 15
    CREATE_BUCKET = 16
    LIST_BUCKETS = 17
    DELETE_BUCKET = 18
    BUCKET_STATS = 19
    MAP = 20  # shm only: the object's read-only data file travels with the reply (SCM_RIGHTS)
    MAP_EXTENTS = 21  # shm only: the object's data files travel with the reply and its payload
    CHUNK = 22  # cluster peers only: a chunk's stored bytes, from the node that holds its data file
    CHUNK_PUT = 23  # cluster peers only: a copy of a data file (the payload follows the frame)
    GETR = 24  # many ranges of one object version, into one region or as one payload
    LOCATE = 25  # which cluster members hold an object version's data (cluster-routing clients)
    LEASE = 26  # shm only: the current version's data file and the node's commit counter (SCM_RIGHTS)
    PART = 27  # cluster peers only: store, send or delete a multipart upload's part files


# --- metadata structs (msgpack arrays, field order is the wire order) -----------
class Hello(msgspec.Struct, array_like=True, frozen=True):
    client: str
    version: int = VERSION


class HelloReply(msgspec.Struct, array_like=True, frozen=True):
    """``features``: optional ops this server supports (``"alloc_region"``,
    ``"auth"``); ``nonce``: the connection's server nonce (:data:`NONCE_BYTES`
    random bytes, the same in every HELLO reply of one connection; empty from
    a node without ``"auth"``)."""

    server: str
    version: int
    transport: str  # "tcp" | "shm"
    features: list[str] = []
    nonce: bytes = b""


class Auth(msgspec.Struct, array_like=True, frozen=True):
    """Authenticate the connection: ``access_key`` (id), the client's own
    ``client_nonce`` (16 to 64 random bytes) and ``proof``, :func:`auth_proof`
    with role ``"client"``."""

    access_key: str
    client_nonce: bytes
    proof: bytes


class AuthReply(msgspec.Struct, array_like=True, frozen=True):
    """AUTH succeeded: the ``tenant`` the key acts for and the server's
    ``proof`` (:func:`auth_proof` with role ``"server"``), which shows the
    client that the node holds the secret too."""

    tenant: str
    proof: bytes


class Register(msgspec.Struct, array_like=True, frozen=True):
    """Map the memfd sent with this frame as region ``region_id`` of ``size`` bytes.
    ``fresh``: memory the client writes once (a batch tensor): the server writes
    reads into it by ``pwrite`` rather than mapping it populated."""

    region_id: int
    size: int
    fresh: bool = False


class Unregister(msgspec.Struct, array_like=True, frozen=True):
    """Forget a region. ``unmapped``: the client has unmapped it and holds no
    descriptor of it, so a server-allocated region may be reused (zeroed) for
    another client once this connection has closed."""

    region_id: int
    unmapped: bool = False


class AllocRegion(msgspec.Struct, array_like=True, frozen=True):
    """Ask the server for a memory region of at least ``size`` bytes, registered
    on this connection as ``region_id``; the reply frame carries its memfd
    (``SCM_RIGHTS``). shm only."""

    region_id: int
    size: int


class AllocRegionReply(msgspec.Struct, array_like=True, frozen=True):
    """``size``: bytes of the memfd (>= the request); ``reused``: it came from the
    server's pool of zeroed, already-populated regions."""

    size: int
    reused: bool = False


class Head(msgspec.Struct, array_like=True, frozen=True):
    """HEAD (and MAP) of the current version of ``bucket/key``, or of version
    ``version_id`` (``"null"`` or an id the node gave; ``None``: the current one),
    or of the version bucket snapshot ``snapshot`` recorded (``None``: live)."""

    bucket: str
    key: str
    version_id: str | None = None
    snapshot: str | None = None


class MapReply(msgspec.Struct, array_like=True, frozen=True):
    """MAP's reply: the version whose data file came with the frame (opened
    read-only): ``size`` bytes (the file's first ``size`` bytes are the object),
    ``etag`` (no quotes)."""

    size: int
    etag: str


class LeaseReply(msgspec.Struct, array_like=True, frozen=True):
    """LEASE's reply: the current version (``size`` bytes, ``etag`` without
    quotes, ``version_id``) whose data file came with the frame, read-only,
    followed by the node's commit counter (a 4096-byte memfd whose first 8
    bytes are a native-endian uint64). The lease holds while that counter reads
    ``generation`` and for at most ``ttl_s`` seconds from its arrival;
    ``verify``: reads must be checked against ``sums`` (uint32 per 4 KiB block,
    native-endian: the running CRC32C of the object's bytes up to that block's
    end); false for a bucket that opted out of checks (``sums`` empty)."""

    size: int
    etag: str
    version_id: str | None
    generation: int
    ttl_s: float
    verify: bool
    sums: bytes


class MapExtentsReply(msgspec.Struct, array_like=True, frozen=True):
    """MAP_EXTENTS's reply: the version is ``size`` bytes laid out as ``extents``,
    ``[file, offset, length]`` each in order: ``length`` bytes at byte ``offset``
    of descriptor number ``file`` (0-based, in the order the ``files``
    descriptors arrive). Offsets and every length but the last are page
    multiples (4 KiB); the lengths add up to ``size``."""

    size: int
    etag: str
    files: int
    extents: list[tuple[int, int, int]]


class Get(msgspec.Struct, array_like=True, frozen=True):
    """Read ``length`` bytes (-1: to the end) from ``offset``.

    ``region`` -1: the bytes come back as the reply payload (TCP). Otherwise the
    server writes them into registered region ``region`` at ``region_offset``.

    ``digest`` > 0 (a GETV item written into a region): the server also returns
    the XXH3-64 (seed 0) of each consecutive ``digest``-byte piece of the bytes it
    delivered (the last piece may be shorter), computed right after each piece
    lands, while it is still in the CPU cache. 0: no digests. Ignored on payload
    (``region`` -1) reads, whose bytes the client hashes as they arrive.

    ``version_id``: read that version (``"null"`` or an id the node gave);
    ``None``: the current one. ``snapshot``: read the version that bucket
    snapshot recorded (``None``: the live bucket).
    """

    bucket: str
    key: str
    offset: int = 0
    length: int = -1
    region: int = -1
    region_offset: int = 0
    digest: int = 0
    version_id: str | None = None
    snapshot: str | None = None


class GetV(msgspec.Struct, array_like=True, frozen=True):
    """A batch of reads served concurrently; payloads (TCP) follow in item order."""

    items: list[Get]


class GetRanges(msgspec.Struct, array_like=True, frozen=True):
    """Many ranges of one object version, described as columns instead of one
    :class:`Get` per item (a batch of samples of one shard, a KV page table).

    ``offsets``: little-endian uint64 per item, the object offset of each range;
    ``lengths``: little-endian uint32 per item, its bytes (at most
    :data:`MAX_RANGE_BYTES`); both the same number of items, at most
    :data:`MAX_RANGES`. A range that runs past the object's end is cut there;
    one that starts at or past the end fails alone (``InvalidRange``).

    ``region`` -1: the delivered bytes of every item follow as the reply's
    payload, in item order (TCP). Otherwise item ``i`` lands in registered
    region ``region`` at ``region_offset + lengths[0] + ... + lengths[i-1]``
    (the items packed in order, each in a slot of its full length).
    """

    bucket: str
    key: str
    offsets: bytes
    lengths: bytes
    region: int = -1
    region_offset: int = 0
    version_id: str | None = None
    snapshot: str | None = None


class Put(msgspec.Struct, array_like=True, frozen=True):
    """Write an object of ``length`` bytes: from the payload (``region`` -1) or
    from registered region ``region`` at ``region_offset``."""

    bucket: str
    key: str
    length: int
    region: int = -1
    region_offset: int = 0
    content_type: str | None = None
    metadata: dict[str, str] = {}


class Delete(msgspec.Struct, array_like=True, frozen=True):
    """Delete ``bucket/key`` as S3 DeleteObject does: without ``version_id`` the
    object (or, in a versioned bucket, a new delete marker hides it); with it,
    that version for good. ``bypass_governance``: remove a version under
    GOVERNANCE retention (never COMPLIANCE, never a legal hold)."""

    bucket: str
    key: str
    version_id: str | None = None
    bypass_governance: bool = False


class DeleteResult(msgspec.Struct, array_like=True, frozen=True):
    """What a DELETE did: ``version_id`` of the version removed or of the delete
    marker made (``None`` in a bucket that was never versioned, or from a node
    without versions); ``delete_marker``: a marker was made, or the version
    removed was one."""

    version_id: str | None = None
    delete_marker: bool = False


class List(msgspec.Struct, array_like=True, frozen=True):
    """One page of keys; ``snapshot``: of that bucket snapshot (``None``: live)."""

    bucket: str
    prefix: str = ""
    delimiter: str = ""
    token: str | None = None
    max_keys: int = 1000
    start_after: str = ""
    snapshot: str | None = None


class BucketReq(msgspec.Struct, array_like=True, frozen=True):
    """A bucket op. CREATE_BUCKET reads the optional trailing policy fields
    (``kind`` ``"standard"``/``"kv"``, ``capacity_bytes``, ``ttl_s`` seconds);
    a request of just ``[bucket]`` makes a standard bucket."""

    bucket: str
    kind: str = "standard"
    capacity_bytes: int = 0
    ttl_s: float = 0.0


class Empty(msgspec.Struct, array_like=True, frozen=True):
    pass


class ObjectMeta(msgspec.Struct, array_like=True, frozen=True):
    """An object version's metadata: ``size`` bytes, ``etag`` (no quotes),
    ``last_modified`` Unix seconds, ``content_type``, user ``metadata``;
    ``version_id`` (``"null"`` in a bucket that was never versioned; ``None``
    from a node without versions); object lock: ``lock_mode`` (``"GOVERNANCE"``,
    ``"COMPLIANCE"`` or ``""``), ``lock_until`` (retain-until, Unix seconds; 0
    without retention), ``legal_hold``."""

    bucket: str
    key: str
    size: int
    etag: str
    last_modified: float
    content_type: str = "application/octet-stream"
    metadata: dict[str, str] = {}
    version_id: str | None = None
    lock_mode: str = ""
    lock_until: float = 0.0
    legal_hold: bool = False


class GetReply(msgspec.Struct, array_like=True, frozen=True):
    """``size``: the object's full size; ``n``: bytes delivered."""

    size: int
    n: int
    etag: str


class GetVReply(msgspec.Struct, array_like=True, frozen=True):
    """Per item: bytes delivered (>= 0), or -1 with ``errors[i]`` = [code, message].
    ``digests[i]``: the piece digests of item ``i`` when it asked for them (``Get.digest``)
    and the server computed them."""

    n: list[int]
    errors: dict[int, tuple[str, str]] = {}
    digests: dict[int, list[int]] = {}


class GetRangesReply(msgspec.Struct, array_like=True, frozen=True):
    """GETR's reply: the version's ``size`` and ``etag``; ``n``: little-endian
    int64 per item, the bytes delivered (less than asked only at the object's
    end), or -1 with ``errors[i]`` = [code, message] (a range past the end, a
    damaged chunk: the item's bytes are not good and were not counted)."""

    size: int
    etag: str
    n: bytes
    errors: dict[int, tuple[str, str]] = {}


class ListEntry(msgspec.Struct, array_like=True, frozen=True):
    key: str
    size: int
    etag: str
    last_modified: float


class ListReply(msgspec.Struct, array_like=True, frozen=True):
    entries: list[ListEntry]
    prefixes: list[str]
    is_truncated: bool
    next_token: str | None = None


class BucketsReply(msgspec.Struct, array_like=True, frozen=True):
    buckets: list[str]


class BucketStats(msgspec.Struct, array_like=True, frozen=True):
    """A bucket's policy and counters (``Engine.bucket_stats``): live object
    ``bytes`` and ``objects``; objects dropped for room / by TTL since the node
    started; ``data``: how its data is stored (``Engine.data_stats``: logical and
    stored bytes, compression, dedup, verification), absent from older nodes."""

    kind: str
    capacity_bytes: int
    ttl_s: float
    bytes: int
    objects: int
    evictions: int
    expirations: int
    etag_policy: str = "md5"
    data: dict[str, Any] | None = None


class ChunkReq(msgspec.Struct, array_like=True, frozen=True):
    """CHUNK: the stored bytes of chunk ``chunk_id`` (asked by a cluster peer
    authenticated with its node key; see ``docs/cluster.md``): all of them, or
    the ``length`` bytes from ``offset`` (bytes into the chunk's stored bytes;
    ``length`` -1: to the end), which a repair of a few damaged blocks asks for."""

    chunk_id: str
    offset: int = 0
    length: int = -1


class ChunkReply(msgspec.Struct, array_like=True, frozen=True):
    """The chunk's stored bytes asked for follow as the payload: ``stored``
    bytes, exactly as its data file holds them (compressed chunks stay
    compressed), unchecked: the asking node checks them against the block sums
    its catalog holds."""

    stored: int


class CopyChunk(msgspec.Struct, array_like=True, frozen=True):
    """One chunk of a data file pushed with CHUNK_PUT, as the pusher's catalog
    records it (fields of ``ChunkRecord``); its ``sums_len`` bytes of block sums
    are in the payload."""

    chunk_id: str
    file_offset: int
    stored: int
    size: int
    codec: str
    digest: bytes
    domain: str | None
    sum_kind: int
    sums_len: int


class ChunkPut(msgspec.Struct, array_like=True, frozen=True):
    """CHUNK_PUT: store a copy of data file ``file`` (asked by a cluster peer
    authenticated with its node key). The payload is the block sums of each
    chunk of ``chunks``, in order, then the file's first ``length`` bytes; the
    receiver checks every chunk against its sums before it fsyncs the copy and
    replies."""

    file: str
    length: int
    chunks: list[CopyChunk]


class ChunkPutReply(msgspec.Struct, array_like=True, frozen=True):
    """The copy is durable (fsynced) and checked; ``stored``: false when the
    node had the file already."""

    stored: bool


class Member(msgspec.Struct, array_like=True, frozen=True):
    """A cluster member as LOCATE tells it: its fast-path TCP address
    (``wire_port`` 0: none) and whether it is live."""

    node_id: str
    host: str
    wire_port: int
    live: bool


class LocateReply(msgspec.Struct, array_like=True, frozen=True):
    """LOCATE's reply: the answering node's id (``""``: not a cluster member),
    the version's ``size`` and ``etag``, ``holders``: the live members whose
    data folders hold all of its data (holder first, then copies; empty when no
    live member holds it whole, or outside a cluster), and ``members``: the
    cluster's members (empty outside a cluster)."""

    node: str
    size: int
    etag: str
    holders: list[str]
    members: list[Member]


class ErrorReply(msgspec.Struct, array_like=True, frozen=True):
    """An error: S3's ``code`` and a ``message``. ``delete_marker``: the key's
    latest version (NoSuchKey), or the version named (MethodNotAllowed), is a
    delete marker, whose id is ``version_id``."""

    code: str
    message: str
    delete_marker: bool = False
    version_id: str | None = None


REQUEST_TYPES: dict[int, type] = {
    Op.HELLO: Hello, Op.REGISTER: Register, Op.UNREGISTER: Unregister, Op.HEAD: Head,
    Op.GET: Get, Op.GETV: GetV, Op.PUT: Put, Op.DELETE: Delete, Op.LIST: List,
    Op.CREATE_BUCKET: BucketReq, Op.LIST_BUCKETS: Empty, Op.DELETE_BUCKET: BucketReq,
    Op.BUCKET_STATS: BucketReq, Op.ALLOC_REGION: AllocRegion, Op.FORKED: Empty,
    Op.MAP: Head, Op.MAP_EXTENTS: Head, Op.AUTH: Auth, Op.CHUNK: ChunkReq, Op.CHUNK_PUT: ChunkPut,
    Op.GETR: GetRanges, Op.LOCATE: Head, Op.LEASE: Head, Op.PART: PartFile,
}
REPLY_TYPES: dict[int, type] = {
    Op.HELLO: HelloReply, Op.REGISTER: Empty, Op.UNREGISTER: Empty, Op.HEAD: ObjectMeta,
    Op.GET: GetReply, Op.GETV: GetVReply, Op.PUT: ObjectMeta, Op.DELETE: DeleteResult,
    Op.LIST: ListReply, Op.CREATE_BUCKET: Empty, Op.LIST_BUCKETS: BucketsReply,
    Op.DELETE_BUCKET: Empty, Op.BUCKET_STATS: BucketStats, Op.ALLOC_REGION: AllocRegionReply,
    Op.FORKED: Empty, Op.MAP: MapReply, Op.MAP_EXTENTS: MapExtentsReply, Op.AUTH: AuthReply,
    Op.CHUNK: ChunkReply, Op.CHUNK_PUT: ChunkPutReply, Op.GETR: GetRangesReply, Op.LOCATE: LocateReply,
    Op.LEASE: LeaseReply, Op.PART: PartFileReply,
}

#: Messages that gained trailing fields after their first form: type -> number
#: of fields of that form. :func:`encode` leaves the added fields out while they
#: hold their defaults, so such a frame is the first form byte for byte.
FIRST_FORM_FIELDS: dict[type, int] = {Head: 2, Get: 7, Delete: 2, ErrorReply: 2, List: 6, PartFileReply: 1}

_encoder = msgspec.msgpack.Encoder()
_decoders: dict[type, msgspec.msgpack.Decoder] = {}
_defaults: dict[type, tuple] = {}


def encode(obj: msgspec.Struct) -> bytes:
    """msgpack-encode a metadata struct.

    Fields a message gained after its first form (:data:`FIRST_FORM_FIELDS`)
    are left out from the end while they hold their defaults, so a request
    that names no version is the frame every version-1 node reads, and a plain
    error reply is what every version-1 client reads. Only the top-level
    message is trimmed: the items of a GETV are encoded whole (natively, for
    speed), each with its trailing ``version_id``.
    """
    first = FIRST_FORM_FIELDS.get(type(obj))
    if first is not None:
        values = msgspec.structs.astuple(obj)
        defaults = _defaults.get(type(obj))
        if defaults is None:
            defaults = _defaults[type(obj)] = tuple(f.default for f in msgspec.structs.fields(obj))
        end = len(values)
        while end > first and values[end - 1] == defaults[end - 1]:
            end -= 1
        if end < len(values):
            return _encoder.encode(values[:end])
    return _encoder.encode(obj)


def decoder_for(tp: type) -> msgspec.msgpack.Decoder:
    dec = _decoders.get(tp)
    if dec is None:
        dec = _decoders[tp] = msgspec.msgpack.Decoder(tp)
    return dec


def decode(tp: type, data: bytes | bytearray | memoryview):
    """Decode metadata of type ``tp``. Raises ProtocolError on malformed input."""
    try:
        return decoder_for(tp).decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ProtocolError(f"malformed {tp.__name__} metadata: {exc}") from exc


def error_from_reply(reply: ErrorReply) -> GpufeedError:
    """The typed error an error reply names (:func:`gpufeed.errors.error_from_code`),
    with ``details`` ``delete_marker`` and ``version_id`` when the reply says a
    delete marker was in the way."""
    err = error_from_code(reply.code, reply.message)
    if reply.delete_marker:
        err.details.update(delete_marker=True, version_id=reply.version_id)
    return err


#: Label that starts every AUTH proof and the key derivation (domain separation).
AUTH_LABEL = b"gpufeed-wire-auth/1"
#: Bytes of the server nonce a HELLO reply carries.
NONCE_BYTES = 32
_LEN16 = struct.Struct("<H")


def auth_key(secret: str) -> bytes:
    """The key AUTH proofs are made with: HMAC-SHA256 keyed by the access key's
    ``secret`` (UTF-8) over ``AUTH_LABEL + b" key"``, so no fast-path proof is an
    HMAC keyed by the secret itself (nor by SigV4's ``"AWS4" + secret``).

    Args:
        secret: the secret access key.

    Returns:
        32 bytes.
    """
    return hmac.new(secret.encode(), AUTH_LABEL + b" key", hashlib.sha256).digest()


def auth_proof(key: bytes, role: str, transport: str, access_key: str, server_nonce: bytes,
               client_nonce: bytes) -> bytes:
    """An AUTH proof (spec: ``docs/wire-protocol.md``, "Authentication").

    HMAC-SHA256 keyed by :func:`auth_key` over the fields ``AUTH_LABEL``,
    ``role``, ``transport``, ``access_key``, ``server_nonce``, ``client_nonce``,
    each preceded by its length in bytes as a u16 LE (strings UTF-8).

    Args:
        key: :func:`auth_key` of the secret.
        role: ``"client"`` (the AUTH request) or ``"server"`` (its reply).
        transport: ``"tcp"`` or ``"shm"``: the transport the connection uses.
        access_key: the access key id.
        server_nonce: the nonce of the connection's HELLO reply.
        client_nonce: the nonce of the AUTH request.

    Returns:
        32 bytes.

    Raises:
        InvalidArgument: a field longer than 65535 bytes.
    """
    mac = hmac.new(key, digestmod=hashlib.sha256)
    for field in (AUTH_LABEL, role.encode(), transport.encode(), access_key.encode(),
                  server_nonce, client_nonce):
        if len(field) > 0xFFFF:
            raise InvalidArgument("an AUTH field is longer than 65535 bytes")
        mac.update(_LEN16.pack(len(field)))
        mac.update(field)
    return mac.digest()


def pack_header(op: int, meta_len: int, request_id: int, payload_len: int = 0) -> bytes:
    return HEADER.pack(MAGIC, VERSION, op, meta_len, request_id, payload_len)


def unpack_header(buf, max_meta: int = MAX_META) -> tuple[int, int, int, int]:
    """Parse a 24-byte header -> ``(op, meta_len, request_id, payload_len)``.

    Args:
        buf: the 24 header bytes.
        max_meta: largest metadata accepted, bytes (at most :data:`MAX_META`).

    Raises:
        ProtocolError: bad magic, unknown version, or meta_len over the limit.
    """
    magic, version, op, meta_len, rid, payload_len = HEADER.unpack(buf)
    if magic != MAGIC:
        raise ProtocolError(f"bad magic {magic!r}")
    if version != VERSION:
        raise ProtocolError(f"unsupported protocol version {version}")
    limit = min(max_meta, MAX_META)
    if meta_len > limit:
        raise ProtocolError(f"metadata of {meta_len} bytes exceeds {limit}")
    return op, meta_len, rid, payload_len


def close_fds(fds: list[int]) -> None:
    """Close and forget descriptors that arrived with frames (``SCM_RIGHTS``) and
    will not be used; an already-closed one is skipped."""
    while fds:
        try:
            os.close(fds.pop())
        except OSError:
            pass
