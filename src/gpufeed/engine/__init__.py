"""The storage node with no network: catalog, chunk store, buckets, objects, multipart, lifecycle."""

from ._catalogcheck import CHECK_LEVELS, CatalogCheck, check_catalog
from ._catalogs import CatalogSettings, open_catalog
from ._chunkreads import ChunkDamage, ReadStep, run_step
from ._directories import check_directory_bucket_name, check_directory_listing, is_directory_name
from ._handles import ObjectHandle
from ._keyring import KeyRing
from ._salvage import CatalogRecovery, TableSalvage, check_data_dir, recover_catalog
from ._sqlite import SqliteCatalog
from .catalog import Catalog, CatalogReader, CatalogWriter
from .engine import MAX_KEY_BYTES, MAX_PARTS, MIN_PART_BYTES, Engine, PendingWrite
from .store import EngineStore
from .types import (
    BucketInfo,
    ChunkRecord,
    DataPolicy,
    LifecycleResult,
    LifecycleRule,
    ListResult,
    ObjectInfo,
    PartInfo,
    UploadInfo,
)

__all__ = [
    "Engine",
    "PendingWrite",
    "ObjectHandle",
    "ReadStep",
    "run_step",
    "ChunkDamage",
    "ChunkRecord",
    "DataPolicy",
    "EngineStore",
    "BucketInfo",
    "ObjectInfo",
    "ListResult",
    "UploadInfo",
    "PartInfo",
    "LifecycleRule",
    "LifecycleResult",
    "MAX_KEY_BYTES",
    "MIN_PART_BYTES",
    "MAX_PARTS",
    "Catalog",
    "CatalogReader",
    "CatalogWriter",
    "SqliteCatalog",
    "CatalogSettings",
    "open_catalog",
    "KeyRing",
    "is_directory_name",
    "check_directory_bucket_name",
    "check_directory_listing",
    "CHECK_LEVELS",
    "CatalogCheck",
    "check_catalog",
    "check_data_dir",
    "CatalogRecovery",
    "TableSalvage",
    "recover_catalog",
]
