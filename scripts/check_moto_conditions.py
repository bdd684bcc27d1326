#!/usr/bin/env python3
"""Check that the moto S3 servers behave the way Chorus's tests rely on.

Run with the venv's python (it has boto3, which comes with moto):
    .ci/state/venv/bin/python scripts/check_moto_conditions.py

Checks, against every endpoint/bucket pair:
  * PutObject If-None-Match: *   -> second create of a key fails with 412
  * PutObject If-Match: <etag>   -> a stale etag fails with 412, current one wins
  * 16 concurrent If-None-Match creates of one key -> exactly one wins (10 rounds)
  * 16 concurrent If-Match updates with one etag   -> exactly one wins
  * HeadObject returns the ETag that PutObject returned
  * ranged GetObject returns 206 and the right bytes
  * ListObjectsV2 lists by prefix and paginates
Objects are written under a unique prefix and deleted afterwards.
Exits non-zero (with a list of failures) if anything does not hold.
"""

import argparse
import os
import sys
import threading
import uuid

import boto3
import botocore
from botocore.config import Config

FAILURES = []


def check(cond, what):
    if cond:
        print(f"  ok   {what}")
    else:
        print(f"  FAIL {what}")
        FAILURES.append(what)


def status_of(exc):
    return exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")


def put_expect_fail(s3, bucket, key, **kw):
    """Return (http_status, error_code) of a PUT that should fail, or (200, None)."""
    try:
        s3.put_object(Bucket=bucket, Key=key, Body=b"should-not-land", **kw)
        return 200, None
    except botocore.exceptions.ClientError as e:
        return status_of(e), e.response.get("Error", {}).get("Code")


def race(s3, bucket, key, n, **kw):
    """n threads PUT `key` at once with the same condition; return outcomes."""
    barrier = threading.Barrier(n)
    results = [None] * n

    def worker(i):
        barrier.wait()
        try:
            s3.put_object(Bucket=bucket, Key=key, Body=f"writer-{i}".encode(), **kw)
            results[i] = "won"
        except botocore.exceptions.ClientError as e:
            results[i] = status_of(e)
        except Exception as e:  # connection errors etc. are failures too
            results[i] = repr(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def check_zone(endpoint, bucket, threads, rounds):
    print(f"{endpoint} bucket {bucket}")
    s3 = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=os.environ.get("AWS_ACCESS_KEY_ID", "testing"),
        aws_secret_access_key=os.environ.get("AWS_SECRET_ACCESS_KEY", "testing"),
        region_name=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
        # No retries: a retried conditional PUT would blur who won the race.
        config=Config(
            max_pool_connections=threads * 2,
            retries={"max_attempts": 1, "mode": "standard"},
            s3={"addressing_style": "path"},
        ),
    )
    prefix = f"_ci-check/{uuid.uuid4()}/"
    try:
        # -- If-None-Match: * ------------------------------------------------
        key = prefix + "create-once"
        first = s3.put_object(Bucket=bucket, Key=key, Body=b"hello world", IfNoneMatch="*")
        etag1 = first["ETag"]
        check(etag1.startswith('"') and etag1.endswith('"'), f"PutObject ETag is quoted ({etag1})")
        st, code = put_expect_fail(s3, bucket, key, IfNoneMatch="*")
        check(st == 412 and code == "PreconditionFailed",
              f"second If-None-Match:* create fails with 412 PreconditionFailed (got {st} {code})")
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        check(body == b"hello world", "failed create did not overwrite the object")

        # -- If-Match ----------------------------------------------------------
        second = s3.put_object(Bucket=bucket, Key=key, Body=b"v2", IfMatch=etag1)
        etag2 = second["ETag"]
        check(etag2 != etag1, "If-Match with the current etag succeeds and changes the etag")
        st, code = put_expect_fail(s3, bucket, key, IfMatch=etag1)
        check(st == 412 and code == "PreconditionFailed",
              f"If-Match with a stale etag fails with 412 PreconditionFailed (got {st} {code})")
        st, code = put_expect_fail(s3, bucket, prefix + "missing", IfMatch=etag1)
        check(st == 404, f"If-Match on a missing key fails with 404 (got {st} {code})")
        check(s3.get_object(Bucket=bucket, Key=key)["Body"].read() == b"v2",
              "failed If-Match did not overwrite the object")

        # -- HEAD / ranged GET -------------------------------------------------
        head = s3.head_object(Bucket=bucket, Key=key)
        check(head.get("ETag") == etag2, f"HeadObject ETag matches PutObject ETag ({head.get('ETag')})")
        check(head.get("ContentLength") == 2, "HeadObject ContentLength is right")
        rkey = prefix + "ranged"
        s3.put_object(Bucket=bucket, Key=rkey, Body=bytes(range(256)))
        got = s3.get_object(Bucket=bucket, Key=rkey, Range="bytes=10-19")
        check(got["ResponseMetadata"]["HTTPStatusCode"] == 206
              and got["Body"].read() == bytes(range(10, 20))
              and got.get("ContentRange") == "bytes 10-19/256",
              "ranged GET bytes=10-19 returns 206, the right bytes and Content-Range")
        got = s3.get_object(Bucket=bucket, Key=rkey, Range="bytes=-6")
        check(got["Body"].read() == bytes(range(250, 256)), "suffix range bytes=-6 returns the last 6 bytes")

        # -- ListObjectsV2 ------------------------------------------------------
        lkeys = [f"{prefix}list/{i:02d}" for i in range(5)]
        for k in lkeys:
            s3.put_object(Bucket=bucket, Key=k, Body=b"x")
        listed = s3.list_objects_v2(Bucket=bucket, Prefix=prefix + "list/")
        check([o["Key"] for o in listed.get("Contents", [])] == lkeys,
              "ListObjectsV2 with prefix lists exactly the keys, in order")
        paged, token = [], None
        while True:
            kw = {"ContinuationToken": token} if token else {}
            page = s3.list_objects_v2(Bucket=bucket, Prefix=prefix + "list/", MaxKeys=2, **kw)
            paged += [o["Key"] for o in page.get("Contents", [])]
            if not page.get("IsTruncated"):
                break
            token = page["NextContinuationToken"]
        check(paged == lkeys, "ListObjectsV2 paginates with MaxKeys=2 + continuation tokens")
        delim = s3.list_objects_v2(Bucket=bucket, Prefix=prefix, Delimiter="/")
        check(any(p["Prefix"] == prefix + "list/" for p in delim.get("CommonPrefixes", [])),
              "ListObjectsV2 with Delimiter returns CommonPrefixes")

        # -- concurrent conditional PUTs ---------------------------------------
        bad = []
        for r in range(rounds):
            res = race(s3, bucket, f"{prefix}race-create-{r}", threads, IfNoneMatch="*")
            if res.count("won") != 1 or any(x not in ("won", 412) for x in res):
                bad.append(res)
        check(not bad, f"{threads} concurrent If-None-Match:* creates -> exactly one wins, rest 412 "
                       f"({rounds} rounds){' ' + str(bad[:2]) if bad else ''}")
        bad = []
        for r in range(rounds):
            k = f"{prefix}race-update-{r}"
            etag = s3.put_object(Bucket=bucket, Key=k, Body=b"base")["ETag"]
            res = race(s3, bucket, k, threads, IfMatch=etag)
            if res.count("won") != 1 or any(x not in ("won", 412) for x in res):
                bad.append(res)
        check(not bad, f"{threads} concurrent If-Match updates with one etag -> exactly one wins, rest 412 "
                       f"({rounds} rounds){' ' + str(bad[:2]) if bad else ''}")
    except Exception as e:  # e.g. an old boto3 that lacks IfNoneMatch/IfMatch
        check(False, f"unexpected error: {e!r}")
    finally:
        # Leave the bucket as we found it.
        try:
            token = None
            while True:
                kw = {"ContinuationToken": token} if token else {}
                page = s3.list_objects_v2(Bucket=bucket, Prefix=prefix, **kw)
                objs = [{"Key": o["Key"]} for o in page.get("Contents", [])]
                if objs:
                    s3.delete_objects(Bucket=bucket, Delete={"Objects": objs, "Quiet": True})
                if not page.get("IsTruncated"):
                    break
                token = page["NextContinuationToken"]
        except Exception as e:
            print(f"  warn cleanup of {prefix} failed: {e!r}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--endpoints", default=os.environ.get(
        "CHORUS_TEST_S3_ENDPOINTS", "http://127.0.0.1:5101,http://127.0.0.1:5102,http://127.0.0.1:5103"))
    ap.add_argument("--buckets", default=os.environ.get(
        "CHORUS_TEST_S3_BUCKETS", "chorus-zone-a,chorus-zone-b,chorus-zone-c"))
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=10, help="race rounds per condition and zone")
    args = ap.parse_args()

    endpoints = args.endpoints.split(",")
    buckets = args.buckets.split(",")
    if len(endpoints) != len(buckets):
        sys.exit("endpoints and buckets differ in count")
    print(f"boto3 {boto3.__version__}, botocore {botocore.__version__}")
    for endpoint, bucket in zip(endpoints, buckets):
        check_zone(endpoint, bucket, args.threads, args.rounds)
    if FAILURES:
        print(f"\n{len(FAILURES)} check(s) FAILED:")
        for f in FAILURES:
            print(f"  - {f}")
        sys.exit(1)
    print("\nall moto S3 checks passed")


if __name__ == "__main__":
    main()
