"""S3 over HTTPS with a private CA, and S3's least privilege, against services/s3.sh's HTTPS
gateway (the same data as its HTTP one, a certificate the set's own CA signs).

Through the sink, in one shared Spark session: the files, Delta and Iceberg sinks write a small
stream to ``s3://`` over HTTPS, the CA given as ``fs.ca_bundle`` (s3fs) and ``SSL_CERT_FILE``
(delta-rs and pyiceberg's FileIO, which take no CA option); sink.json keeps the CA's path and
no key. The decision
log's conditional create (``If-None-Match: *``) fences a second writer over HTTPS, its CA from
``AWS_CA_BUNDLE`` as a driver's log has it. A CA that does not sign the server is one error that
names the endpoint and the CA, fatal by its code, before anything is written: for the files
sink, Delta, the log, and a query. A CA file missing on a host names the path and the host.

Least privilege: an account of role ``user`` that owns nothing, allowed on a bucket of its own by
a bucket policy that lists exactly docs/security.md's actions, runs the files sink's whole cycle
(prepare, commit, abort, sweep) and the log's (conditional create, read, list, remove); then
each action is taken away, one at a time, and the cycle fails with S3's AccessDenied, fatal
(``TWOPHASE_CREDENTIALS`` or ``TWOPHASE_LOG_NOT_WRITABLE``), naming the refused call.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pyarrow as pa
import pytest

from integration_tests.conftest import HOW_TO_START, S3Service, service_setting
from integration_tests.spark_processes import sharedSession
from integration_tests.tls_files import expiredCertificate, otherCa, resolvesHere
from twophase.clients.tlsverify import probe
from twophase.coordinator.errors import DecisionLogWriteError
from twophase.coordinator.exclusive import CONDITIONAL_PUT
from twophase.coordinator.storage import LogStorage
from twophase.failures.causes import failureOfText
from twophase.failures.classify import Classifier
from twophase.failures.codes import marked
from twophase.protocol import RecoveryScope, TransactionContext
from twophase.protocol.errors import SinkFailure
from twophase.sinks.delta.settings import DeltaSettings
from twophase.sinks.delta.table import DeltaTableError
from twophase.sinks.delta.table import validateTarget as deltaValidateTarget
from twophase.sinks.files import FilesCommitter, FilesWriter
from twophase.sinks.files.errors import S3_ACTIONS, FilesTrustError
from twophase.sinks.files.settings import FilesSettings
from twophase.sinks.files.writer import validateTarget
from twophase.sinks.iceberg.settings import IcebergSettings
from twophase.sinks.iceberg.table import catalogOf
from twophase.sinks.systems import errorCodeOf

SCHEMA = pa.schema([("id", pa.int64())])


@pytest.fixture(scope="module")
def tls(s3: S3Service) -> tuple[S3Service, str]:
    """The HTTPS endpoint on the S3 server's data, and the CA file that signs it."""
    endpoint = service_setting("TWOPHASE_S3_TLS_ENDPOINT")
    ca = service_setting("TWOPHASE_TLS_CA_FILE")
    if not endpoint or not ca:
        pytest.fail(f"TWOPHASE_S3_TLS_ENDPOINT is not set: {HOW_TO_START}", pytrace=False)
    return S3Service(endpoint, s3.accessKey, s3.secretKey, s3.bucket), ca


@pytest.fixture(scope="module")
def wrongCa(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A CA of its own, which signs nothing the server presents."""
    return otherCa(tmp_path_factory.mktemp("wrong-ca"))


@pytest.fixture(scope="module")
def spark(tls: tuple[S3Service, str]) -> Iterator[Any]:
    """One session whose driver and Python workers trust the set's CA for delta-rs."""
    ca = tls[1]
    before = os.environ.get("SSL_CERT_FILE")
    os.environ["SSL_CERT_FILE"] = ca
    try:
        yield from sharedSession("twophase-s3-secured", **{"spark.executorEnv.SSL_CERT_FILE": ca})
    finally:
        if before is None:
            os.environ.pop("SSL_CERT_FILE", None)
        else:
            os.environ["SSL_CERT_FILE"] = before


def sinkOptions(server: S3Service, ca: str, path: str) -> dict[str, str]:
    return {"path": server.url(path), **server.options(), "fs.ca_bundle": ca}


def filesystem(server: S3Service, ca: str) -> Any:
    import s3fs

    return s3fs.S3FileSystem(
        endpoint_url=server.endpoint,
        key=server.accessKey,
        secret=server.secretKey,
        client_kwargs={"verify": ca},
        skip_instance_cache=True,
    )


def verdictOf(exc: BaseException) -> tuple[bool, str]:
    """Restarted or not, and the code, as the error reaches a supervised query (marked)."""
    code = errorCodeOf(exc)
    text = marked(code, str(exc)) if code else str(exc)
    verdict = Classifier().classify(failureOfText(text))
    return verdict.recoverable, verdict.code


def runStream(spark: Any, sink: str, options: dict[str, str], ckpt: Path) -> None:
    stream = (
        spark.readStream.format("twophase.sequence")
        .option("rowsPerBatch", 4)
        .option("totalRows", 8)
        .option("numPartitions", 2)
        .load()
    )
    query = (
        stream.writeStream.format(sink)
        .options(**options)
        .option("checkpointLocation", str(ckpt))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()


def test_files_delta_and_iceberg_write_exactly_once_to_s3_over_https(
    spark: Any, tls: tuple[S3Service, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import deltalake
    import pyarrow.parquet as pq

    server, ca = tls
    prefix = f"it-s3-tls/{uuid.uuid4().hex[:10]}"
    fs = filesystem(server, ca)
    try:
        files = sinkOptions(server, ca, f"{prefix}/files")
        runStream(spark, "twophase.files", files, tmp_path / "files-ckpt")
        table = pq.read_table(f"{server.bucket}/{prefix}/files", filesystem=fs)
        assert sorted(table.column("id").to_pylist()) == list(range(8))
        kept = json.loads(next((tmp_path / "files-ckpt").rglob("sink.json")).read_text())
        text = json.dumps(kept)
        assert ca in text and server.secretKey not in text

        delta = sinkOptions(server, ca, f"{prefix}/delta")
        runStream(spark, "twophase.delta", delta, tmp_path / "delta-ckpt")
        read = deltalake.DeltaTable(
            server.url(f"{prefix}/delta"),
            storage_options={
                "AWS_ENDPOINT_URL": server.endpoint,
                "AWS_ACCESS_KEY_ID": server.accessKey,
                "AWS_SECRET_ACCESS_KEY": server.secretKey,
                "AWS_REGION": "us-east-1",
            },
        )
        assert sorted(read.to_pyarrow_table().column("id").to_pylist()) == list(range(8))
        assert read.version() == 2  # created, then one commit per batch

        # Iceberg: the data files through s3fs (fs.ca_bundle), the table's metadata through
        # pyiceberg's FileIO (SSL_CERT_FILE), a SQL catalog on local disk.
        table = f"ns_{uuid.uuid4().hex[:8]}.events"
        iceberg = {**icebergOptions(server, ca, prefix, tmp_path), "table": table}
        runStream(spark, "twophase.iceberg", iceberg, tmp_path / "iceberg-ckpt")
        # Read back through s3fs (AWS_CA_BUNDLE): in the test's own process pyarrow's S3 client
        # did not take SSL_CERT_FILE up (the query's processes, started after, did).
        monkeypatch.setenv("AWS_CA_BUNDLE", ca)
        reading = {**iceberg, "catalog.py-io-impl": "pyiceberg.io.fsspec.FsspecFileIO"}
        settings = IcebergSettings.fromOptions(reading)
        rows = catalogOf(settings).load_table(table).scan().to_arrow()
        assert sorted(rows.column("id").to_pylist()) == list(range(8))
    finally:
        fs.rm(f"{server.bucket}/{prefix}", recursive=True)


def icebergOptions(server: S3Service, ca: str, prefix: str, tmp: Path) -> dict[str, str]:
    return {
        "catalog.type": "sql",
        "catalog.uri": f"sqlite:///{tmp}/catalog.db",
        "catalog.warehouse": server.url(f"{prefix}/iceberg"),
        "catalog.s3.region": "us-east-1",
        **server.options(),
        "fs.ca_bundle": ca,
    }


def test_the_logs_conditional_create_fences_over_https_with_aws_ca_bundle(
    tls: tuple[S3Service, str], wrongCa: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, ca = tls
    monkeypatch.setenv("AWS_ENDPOINT_URL", server.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", server.accessKey)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", server.secretKey)
    monkeypatch.setenv("AWS_CA_BUNDLE", ca)
    url = server.url(f"it-s3-tls-log/{uuid.uuid4().hex[:10]}")
    first = LogStorage(url, {"skip_instance_cache": True})
    second = LogStorage(url, {"skip_instance_cache": True})
    assert first.exclusiveCreate == CONDITIONAL_PUT
    try:
        first.publish("owner.json", {"run": "a"}, exclusive=True, what="the owner record")
        with pytest.raises(FileExistsError):
            second.publish("owner.json", {"run": "b"}, exclusive=True, what="the owner record")
        assert json.loads(second.fs.cat_file(second.path("owner.json")))["run"] == "a"

        # At once: botocore retries a failed handshake four times, and s3fs each of those
        # again (some twenty seconds); the log's own handshake comes first.
        monkeypatch.setenv("AWS_CA_BUNDLE", wrongCa)
        untrusted = LogStorage(url, {"skip_instance_cache": True})
        started = time.monotonic()
        with pytest.raises(DecisionLogWriteError) as refused:
            untrusted.publish("decided-0.json", {"b": 0}, exclusive=True, what="a decision")
        assert time.monotonic() - started < 5, "the wrong CA was retried"
        assert "AWS_CA_BUNDLE" in str(refused.value)
        assert server.endpoint in str(refused.value) and wrongCa in str(refused.value)
        with pytest.raises(DecisionLogWriteError, match="could not read the listing"):
            LogStorage(url, {"skip_instance_cache": True}).listing()
        assert verdictOf(refused.value) == (False, "TWOPHASE_LOG_NOT_WRITABLE")
        assert not first.fs.exists(first.path("decided-0.json"))
    finally:
        first.fs.rm(first.root, recursive=True)


def test_a_wrong_ca_is_one_fatal_error_naming_endpoint_and_ca_before_any_write(
    spark: Any,
    tls: tuple[S3Service, str],
    wrongCa: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server, ca = tls
    prefix = f"it-s3-tls-wrong/{uuid.uuid4().hex[:10]}"
    options = sinkOptions(server, wrongCa, f"{prefix}/files")
    with pytest.raises(FilesTrustError) as refused:
        validateTarget(FilesSettings.fromOptions(options), SCHEMA, "s")
    message = str(refused.value)
    assert server.endpoint in message and wrongCa in message
    assert verdictOf(refused.value) == (False, "TWOPHASE_CREDENTIALS")

    # The same through a query: it fails at its first batch, fatal, before any write.
    with pytest.raises(Exception, match="TWOPHASE_CREDENTIALS") as failed:
        runStream(spark, "twophase.files", options, tmp_path / "wrong-ckpt")
    assert wrongCa in str(failed.value)

    # Delta's log goes through delta-rs, which trusts SSL_CERT_FILE only: without it, named.
    monkeypatch.setenv("SSL_CERT_FILE", wrongCa)
    delta = DeltaSettings.fromOptions(sinkOptions(server, ca, f"{prefix}/delta"))
    with pytest.raises(FilesTrustError, match="SSL_CERT_FILE"):
        deltaValidateTarget(delta, SCHEMA, "s")
    iceberg = {**icebergOptions(server, ca, prefix, tmp_path), "table": "ns.events"}
    with pytest.raises(FilesTrustError, match="pyiceberg's FileIO.*SSL_CERT_FILE"):
        catalogOf(IcebergSettings.fromOptions(iceberg))

    # A host name the certificate does not hold (it is for localhost and 127.0.0.1).
    elsewhere = resolvesHere()
    if elsewhere is not None:
        renamed = replace(server, endpoint=server.endpoint.replace("127.0.0.1", elsewhere))
        with pytest.raises(FilesTrustError) as refused:
            validateTarget(FilesSettings.fromOptions(sinkOptions(renamed, ca, prefix)), SCHEMA, "s")
        message = str(refused.value)
        assert f"is not for the name '{elsewhere}'" in message and renamed.endpoint in message
        assert "Fix: connect by a name the certificate holds" in message, message

    # A CA file missing on a host: the path and the host.
    missing = str(tmp_path / "no-such-ca.pem")
    with pytest.raises(FilesTrustError, match="same path on the driver and on every executor"):
        FilesWriter.fromOptions(sinkOptions(server, missing, f"{prefix}/files")).storage()

    assert not filesystem(server, ca).exists(f"{server.bucket}/{prefix}")


@contextmanager
def gatewayPresenting(certificate: str, ca: str) -> Iterator[None]:
    """The HTTPS gateway presents ``certificate`` (for its own key) to new connections, then
    its own again: services/s3.sh's copy of its certificate swapped and SIGHUP, on which
    versitygw reloads its TLS; each awaited by a handshake of our own."""
    state = Path(ca).parent.parent / "s3"  # services/s3.sh's state in this set's run directory
    path, pid = state / "tls" / "server.pem", int((state / "tls-pid").read_text())
    own = path.read_bytes()
    host, port = urlsplit(str(service_setting("TWOPHASE_S3_TLS_ENDPOINT"))).netloc.split(":")

    def present(content: bytes, shows: Callable[[str | None], bool]) -> None:
        path.write_bytes(content)
        os.kill(pid, signal.SIGHUP)
        deadline = time.monotonic() + 30
        while not shows(probe(host, int(port), ca, checkHostname=False)):
            assert time.monotonic() < deadline, "the gateway did not reload its certificate"
            time.sleep(0.1)

    present(Path(certificate).read_bytes(), lambda why: bool(why and "expired" in why))
    try:
        yield
    finally:
        present(own, lambda why: why is None)


def test_an_expired_certificate_is_named_for_the_sink_and_the_log(
    tls: tuple[S3Service, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, setCa = tls
    ca = str(tmp_path / "ca.pem")  # the same CA at a path this process has not verified yet
    shutil.copy(setCa, ca)
    cert, _ = expiredCertificate(
        tmp_path, setCa, "localhost", str(Path(setCa).parent / "server.key")
    )
    prefix = f"it-s3-tls-expired/{uuid.uuid4().hex[:10]}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", server.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", server.accessKey)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", server.secretKey)
    monkeypatch.setenv("AWS_CA_BUNDLE", ca)
    with gatewayPresenting(cert, setCa):
        with pytest.raises(FilesTrustError) as refused:
            validateTarget(FilesSettings.fromOptions(sinkOptions(server, ca, prefix)), SCHEMA, "s")
        log = LogStorage(server.url(f"{prefix}/log"), {"skip_instance_cache": True})
        started = time.monotonic()
        with pytest.raises(DecisionLogWriteError) as logRefused:
            log.publish("decided-0.json", {"b": 0}, exclusive=True, what="a decision")
        assert time.monotonic() - started < 5, "the expired certificate was retried"
    expired = f"the server's certificate has expired, though the CA in {ca} signed it"
    for said in (str(refused.value), str(logRefused.value)):
        assert expired in said and server.endpoint in said, said
        assert "Fix: have the server's certificate renewed" in said
    assert "set AWS_CA_BUNDLE" not in str(logRefused.value)  # not the fix for this one
    assert verdictOf(refused.value) == (False, "TWOPHASE_CREDENTIALS")
    assert verdictOf(logRefused.value) == (False, "TWOPHASE_LOG_NOT_WRITABLE")
    assert not filesystem(server, setCa).exists(f"{server.bucket}/{prefix}")


# ---------------------------------------------------------------------------------------------
# Least privilege: a `user` account, a bucket policy listing the actions, each taken away.

FILES_ACTIONS = S3_ACTIONS
"""What the files sink and the decision log need, as docs/security.md lists them."""


def adminCall(server: S3Service, path: str, body: bytes) -> None:
    """A signed request to versitygw's admin API (root's keys) on the HTTP endpoint."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    http = service_setting("TWOPHASE_S3_ENDPOINT") or ""
    request = AWSRequest(
        method="PATCH",
        url=f"{http}{path}",
        data=body,
        headers={"X-Amz-Content-Sha256": hashlib.sha256(body).hexdigest()},
    )
    SigV4Auth(Credentials(server.accessKey, server.secretKey), "s3", "us-east-1").add_auth(request)
    prepared = request.prepare()
    call = urllib.request.Request(
        prepared.url, data=body, headers=dict(prepared.headers), method="PATCH"
    )
    with urllib.request.urlopen(call, timeout=10) as reply:
        assert reply.status < 300


@pytest.fixture(scope="module")
def leastAccount(tls: tuple[S3Service, str]) -> Iterator[tuple[S3Service, Callable[..., None]]]:
    """A `user` account owning nothing, a bucket of root's, and a function that sets the
    bucket's policy to allow that account exactly the actions it is given."""
    import botocore.session

    server, ca = tls
    name = f"tp-least-{uuid.uuid4().hex[:8]}"
    secret = uuid.uuid4().hex
    account = (
        f"<Account><Access>{name}</Access><Secret>{secret}</Secret><Role>user</Role>"
        "<UserID>0</UserID><GroupID>0</GroupID><ProjectID>0</ProjectID></Account>"
    ).encode()
    adminCall(server, "/create-user", account)
    root = botocore.session.get_session().create_client(
        "s3",
        endpoint_url=server.endpoint,
        aws_access_key_id=server.accessKey,
        aws_secret_access_key=server.secretKey,
        region_name="us-east-1",
        verify=ca,
    )
    root.create_bucket(Bucket=name)

    def allow(*actions: str) -> None:
        statements = [
            {
                "Effect": "Allow",
                "Principal": {"AWS": [name]},
                "Action": list(actions),
                "Resource": [f"arn:aws:s3:::{name}", f"arn:aws:s3:::{name}/*"],
            }
        ]
        policy = {"Version": "2012-10-17", "Statement": statements}
        root.put_bucket_policy(Bucket=name, Policy=json.dumps(policy))

    yield S3Service(server.endpoint, name, secret, name), allow
    root.delete_bucket_policy(Bucket=name)
    fs = filesystem(S3Service(server.endpoint, server.accessKey, server.secretKey, name), ca)
    for key in fs.find(name):
        fs.rm_file(key)
    for upload in root.list_multipart_uploads(Bucket=name).get("Uploads", []):
        root.abort_multipart_upload(Bucket=name, Key=upload["Key"], UploadId=upload["UploadId"])
    root.delete_bucket(Bucket=name)


def filesCycle(user: S3Service, ca: str, tag: str) -> None:
    """The files sink's every S3 call, as a batch and its recovery make them."""
    options = sinkOptions(user, ca, f"{tag}/out")
    writer, committer = FilesWriter.fromOptions(options), FilesCommitter.fromOptions(options)
    batch = pa.record_batch({"id": pa.array([1, 2, 3], pa.int64())})

    def prepare(batchId: int) -> Any:
        txn = writer.beginTransaction(TransactionContext("least", "q", batchId, 0, 0, "run"))
        writer.write(txn, batch)
        return writer.preCommit(txn)

    committer.commit(prepare(0))
    committer.abort(prepare(1))
    prepare(2)  # left behind, as a dead task leaves it: the sweep finds and aborts it
    committer.recoverAndAbort(RecoveryScope("least"))


def logCycle(user: S3Service, ca: str, tag: str) -> None:
    """The decision log's every S3 call: a conditional create, a listing, a read, a prune."""
    log = LogStorage(
        user.url(f"{tag}/log"),
        {
            "endpoint_url": user.endpoint,
            "key": user.accessKey,
            "secret": user.secretKey,
            "client_kwargs": {"verify": ca},
            "skip_instance_cache": True,
        },
    )
    log.publish("decided-0.json", {"batch": 0}, exclusive=True, what="the decision of batch 0")
    log.listing()
    log.readRecord(log.path("decided-0.json"))
    log.remove([log.path("decided-0.json")], what="the decision of batch 0")


def test_the_listed_actions_suffice_and_each_one_taken_away_is_a_fatal_error(
    tls: tuple[S3Service, str], leastAccount: tuple[S3Service, Callable[..., None]]
) -> None:
    ca = tls[1]
    user, allow = leastAccount
    allow(*FILES_ACTIONS)
    filesCycle(user, ca, "all")
    logCycle(user, ca, "all")
    fs = filesystem(user, ca)
    assert not fs.exists(f"{user.bucket}/all/log/decided-0.json")
    seen: dict[str, str] = {}
    for action in FILES_ACTIONS:
        tag = f"without-{action.split(':')[1]}"
        allow(*(a for a in FILES_ACTIONS if a != action))
        for name, part in (("files", filesCycle), ("log", logCycle)):
            try:
                part(user, ca, tag)
            except Exception as exc:
                recoverable, code = verdictOf(exc)
                seen[f"{action} {name}"] = (
                    f"{'restarted' if recoverable else 'fatal'} {code}: {exc}"
                )
                assert not recoverable, seen[f"{action} {name}"]
                denied = ("Access Denied", "Forbidden", "DeleteObject is refused")
                assert any(word in str(exc) for word in denied), exc
        if action == "s3:DeleteObject":
            # s3fs's bulk delete reports no per-key error: the log reads its listing back
            assert "could not remove the decision of batch 0" in seen[f"{action} log"]
            assert fs.exists(f"{user.bucket}/{tag}/log/decided-0.json")
        assert any(key.startswith(action) for key in seen), f"nothing needed {action}"
    print(json.dumps(seen, indent=1))


DELTA_ACTIONS = ("s3:ListBucket", "s3:GetObject", "s3:PutObject")
"""What delta-rs needs for a table's log (docs/security.md): its commits are conditional puts."""


def test_delta_rs_needs_list_get_and_put_and_each_one_taken_away_fails(
    tls: tuple[S3Service, str],
    leastAccount: tuple[S3Service, Callable[..., None]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import deltalake

    ca = tls[1]
    user, allow = leastAccount
    monkeypatch.setenv("SSL_CERT_FILE", ca)
    storage = {
        "AWS_ENDPOINT_URL": user.endpoint,
        "AWS_ACCESS_KEY_ID": user.accessKey,
        "AWS_SECRET_ACCESS_KEY": user.secretKey,
        "AWS_REGION": "us-east-1",
        "max_retries": "0",
    }
    rows = pa.table({"id": pa.array([1, 2], pa.int64())})

    def createAndAppend(tag: str) -> None:
        uri = user.url(f"{tag}/table")
        deltalake.write_deltalake(uri, rows, storage_options=storage)
        deltalake.write_deltalake(uri, rows, mode="append", storage_options=storage)

    allow(*DELTA_ACTIONS)
    createAndAppend("delta-all")
    seen: dict[str, str] = {}
    for action in DELTA_ACTIONS:
        allow(*(a for a in DELTA_ACTIONS if a != action))
        with pytest.raises(Exception) as refused:  # delta-rs's OSError or DeltaError
            createAndAppend(f"delta-without-{action.split(':')[1]}")
        seen[action] = f"{type(refused.value).__name__}: {str(refused.value)[:160]}"
        assert "403" in str(refused.value) or "Forbidden" in str(refused.value), refused.value
        assert DeltaTableError.classify(refused.value) is SinkFailure.CREDENTIALS, refused.value
    print(json.dumps(seen, indent=1))
