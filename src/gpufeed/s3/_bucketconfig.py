"""Bucket configurations gpufeed never holds: policy, CORS, encryption, website,
replication and tagging.

GetBucketPolicy and its kin answer S3's own "no such configuration" 404 (the
answer of a bucket where none is set), so clients that probe for them go on;
deleting one succeeds (there is nothing to delete). Setting one is not built
and answers 501 (the router's :data:`~gpufeed.s3._router.UNSUPPORTED_BUCKET`).

Sources: "GetBucketPolicy", "GetBucketCors", "GetBucketEncryption",
"GetBucketWebsite", "GetBucketReplication", "GetBucketTagging" and the Delete
operations of the same names, Amazon S3 API Reference; "Error responses"
(the codes), https://docs.aws.amazon.com/AmazonS3/latest/API/ErrorResponses.html
"""

from __future__ import annotations

from aiohttp import web

from ..errors import NoSuchConfiguration
from ._context import HandlerTable, S3Request, Services
from ._router import DeleteBucketConfiguration, GetBucketConfiguration

__all__ = ["HANDLERS", "NOT_SET"]

#: Sub-resource -> (S3 error code, message) of a configuration that is not set.
NOT_SET = {
    "policy": ("NoSuchBucketPolicy", "The bucket policy does not exist"),
    "cors": ("NoSuchCORSConfiguration", "The CORS configuration does not exist"),
    "encryption": ("ServerSideEncryptionConfigurationNotFoundError",
                   "The server side encryption configuration was not found"),
    "website": ("NoSuchWebsiteConfiguration", "The specified bucket does not have a website configuration"),
    "replication": ("ReplicationConfigurationNotFoundError", "The replication configuration was not found"),
    "tagging": ("NoSuchTagSet", "The TagSet does not exist"),
}


async def get_bucket_configuration(s: Services, req: S3Request, ep: GetBucketConfiguration) -> web.Response:
    """GetBucketPolicy (Cors, Encryption, Website, Replication, Tagging): none is set.

    Raises:
        NoSuchBucket: the bucket does not exist.
        NoSuchConfiguration: always otherwise, with S3's code for that configuration.
    """
    await s.call(s.engine.head_bucket, ep.bucket)
    code, message = NOT_SET[ep.config]
    raise NoSuchConfiguration(message, code=code, bucket=ep.bucket)


async def delete_bucket_configuration(s: Services, req: S3Request, ep: DeleteBucketConfiguration) -> web.Response:
    """DeleteBucketPolicy (Cors, Encryption, Website, Replication, Tagging): 204, nothing was set."""
    await s.call(s.engine.head_bucket, ep.bucket)
    return web.Response(status=204)


#: Endpoint -> handler of this family.
HANDLERS: HandlerTable = {
    GetBucketConfiguration: get_bucket_configuration,
    DeleteBucketConfiguration: delete_bucket_configuration,
}
