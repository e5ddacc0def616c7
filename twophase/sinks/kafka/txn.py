"""Finishing a librdkafka producer's open transaction from another client, on the driver.

confluent-kafka cannot commit a transaction it did not open in the same producer object, so
the driver speaks the Kafka protocol itself through kafka-python's protocol layer, as Flink's
KafkaSink does when it resumes a transaction after a restart: ``FindCoordinator`` for the
transactional id, then ``EndTxn(transactional id, producer id, epoch, committed)``.

Request versions are pinned to what librdkafka-started transactions understand. librdkafka
(2.16) opens "transaction version 1" transactions (Produce v10, client-side
AddPartitionsToTxn v0, EndTxn v1: the epoch stays the same when a transaction ends). A Kafka 4
broker formatted with ``transaction.version=2`` (the default) chooses the protocol per request:
EndTxn v0-v4 ends a transaction the TV1 way, EndTxn v5 the TV2 way (KIP-890: the broker bumps
the epoch and answers a later TV1 retry with PRODUCER_FENCED, which would look like a lost
transaction). So EndTxn is pinned to v3 at most (flexible encoding, PRODUCER_FENCED as its own
code), and these answers of the broker were checked against Kafka 4.1.2
(``integration_tests/test_kafka_protocol.py``):

- ``NONE``: committed, also when the transaction was committed before with the same producer
  id and epoch (a TV1 broker answers a repeated EndTxn in ``CompleteCommit`` with success);
- ``CONCURRENT_TRANSACTIONS``, ``COORDINATOR_LOAD_IN_PROGRESS``, ``NOT_COORDINATOR``,
  ``COORDINATOR_NOT_AVAILABLE``, timeouts and lost connections: try again (the coordinator
  moved, or the previous end of this transaction is still writing its markers);
- ``PRODUCER_FENCED`` / ``INVALID_PRODUCER_EPOCH`` (the broker aborted it on
  ``transaction.timeout.ms`` and bumped the epoch, or a new producer fenced the id),
  ``INVALID_PRODUCER_ID_MAPPING`` and ``INVALID_TXN_STATE`` (it was aborted with the same
  epoch): not committed by this call. The participant then looks at the data itself to tell a
  transaction that is committed after all from one that is lost.

kafka-python 3 offers no public call for one raw request, so this module is the one place that
uses its connection manager (``KafkaAdminClient._manager``) directly.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from twophase.clients.kafka import kafkaPythonConfig, protectKafkaPythonLogs
from twophase.protocol import TransientCommitError
from twophase.redaction import getLogger, redact
from twophase.resources import Resources
from twophase.settings import TwoPhaseConfigError

log = getLogger(__name__)

END_TXN_MAX_VERSION = 3
"""Highest EndTxn version sent: v4 and below end a TV1 transaction without an epoch bump."""

RECONNECT_PAUSE_SECONDS = 0.5
"""Pause between attempts to reach a broker that did not answer (within the request timeout)."""

MAX_IN_FLIGHT = 64
"""Requests kafka-python may have in flight per broker connection (it refuses more)."""

TRANSACTION_COORDINATOR = 1
"""``key_type`` of FindCoordinator for transactional ids."""

# Kafka protocol error codes the sink distinguishes.
NONE = 0
COORDINATOR_LOAD_IN_PROGRESS = 14
COORDINATOR_NOT_AVAILABLE = 15
NOT_COORDINATOR = 16
REQUEST_TIMED_OUT = 7
INVALID_PRODUCER_EPOCH = 47
INVALID_TXN_STATE = 48
INVALID_PRODUCER_ID_MAPPING = 49
CONCURRENT_TRANSACTIONS = 51
TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
CLUSTER_AUTHORIZATION_FAILED = 31
UNSUPPORTED_VERSION = 35
PRODUCER_FENCED = 90

RETRIABLE = frozenset(
    {
        COORDINATOR_LOAD_IN_PROGRESS,
        COORDINATOR_NOT_AVAILABLE,
        NOT_COORDINATOR,
        REQUEST_TIMED_OUT,
        CONCURRENT_TRANSACTIONS,
    }
)
"""Errors after which the same EndTxn may succeed later."""

NOT_ENDED = frozenset(
    {PRODUCER_FENCED, INVALID_PRODUCER_EPOCH, INVALID_PRODUCER_ID_MAPPING, INVALID_TXN_STATE}
)
"""Errors that mean this producer id and epoch can no longer end the transaction."""

_COORDINATOR_MOVED = frozenset({NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE})


def errorName(code: int) -> str:
    """The protocol name of an error code (``PRODUCER_FENCED``), for messages."""
    try:
        import kafka.errors as errors

        cls = errors.for_code(code)
        return str(getattr(cls, "message", cls.__name__))
    except Exception:  # names are for humans only
        return f"error {code}"


@dataclass(frozen=True)
class TransactionListing:
    """One transaction the broker lists: its id, producer id and state (``Ongoing``...)."""

    transactionalId: str
    producerId: int
    state: str


class TransactionClient:
    """Driver side: ends, lists and describes transactions on the cluster of one sink.

    One kafka-python admin client, created on first use and shared by the coordinator's commit
    threads (its IO runs on a thread of its own; calls from several threads are safe). Network
    failures raise ``TransientCommitError``; configuration and permission problems raise
    errors that say what to change.
    """

    def __init__(self, config: Mapping[str, str], *, timeoutSeconds: float = 30.0) -> None:
        self._kwargs = kafkaPythonConfig(config)
        self._timeoutMs = int(timeoutSeconds * 1000)
        self._lock = threading.Lock()
        self._inFlight = threading.BoundedSemaphore(MAX_IN_FLIGHT // 2)
        self._admin: Any = None
        self._coordinators: dict[str, int] = {}

    def _client(self) -> Any:
        with self._lock:
            if self._admin is None:
                protectKafkaPythonLogs()
                from kafka import KafkaAdminClient
                from kafka.errors import KafkaError

                try:
                    self._admin = KafkaAdminClient(
                        **self._kwargs,
                        request_timeout_ms=self._timeoutMs,
                        bootstrap_timeout_ms=self._timeoutMs,
                        # The coordinator ends up to 16 transactions at once on one
                        # connection; kafka-python refuses (not queues) requests beyond this.
                        max_in_flight_requests_per_connection=MAX_IN_FLIGHT,
                        # Find a restarted broker within a second, not after kafka-python's
                        # default backoff of up to 30 s.
                        reconnect_backoff_max_ms=1000,
                    )
                except KafkaError as exc:
                    raise TransientCommitError(
                        f"cannot reach the Kafka cluster at "
                        f"{','.join(self._kwargs['bootstrap_servers'])} from the driver "
                        f"({type(exc).__name__}: {redact(str(exc))})"
                    ) from exc
            return self._admin

    def close(self) -> None:
        """Close the admin client (the next call opens a new one)."""
        with self._lock:
            admin, self._admin = self._admin, None
            self._coordinators.clear()
        if admin is not None:
            try:
                admin.close()
            except Exception:  # closing is best effort
                log.debug("kafka: closing the admin client failed", exc_info=True)

    def _run(self, coroutine: Any, *args: Any) -> Any:
        """Run a coroutine on the admin client's IO thread.

        A broker that cannot be reached (restarting, connection refused, reconnect backoff) is
        waited for up to the request timeout, as a client library would; then, and for other
        retriable errors, ``TransientCommitError``. The requests sent this way (FindCoordinator,
        EndTxn, ListTransactions) may all be repeated safely.
        """
        from kafka.errors import KafkaError

        deadline = time.monotonic() + self._timeoutMs / 1000
        while True:
            admin = self._client()
            try:
                with self._inFlight:
                    return admin._manager.run(coroutine, *args)
            except KafkaError as exc:
                if _isConnectionError(exc) and time.monotonic() < deadline:
                    self._coordinators.clear()
                    time.sleep(RECONNECT_PAUSE_SECONDS)
                    continue
                if getattr(exc, "retriable", False) or _isConnectionError(exc):
                    raise TransientCommitError(
                        f"kafka: the cluster at {','.join(self._kwargs['bootstrap_servers'])} "
                        f"did not answer ({type(exc).__name__}: {redact(str(exc))})"
                    ) from exc
                raise

    def _findCoordinator(self, transactionalId: str) -> int:
        cached = self._coordinators.get(transactionalId)
        if cached is not None:
            return cached
        from kafka.protocol.metadata import FindCoordinatorRequest

        admin = self._client()
        manager = admin._manager

        async def find() -> Any:
            if manager.broker_version_data.api_version(FindCoordinatorRequest) >= 4:
                request = FindCoordinatorRequest(
                    key_type=TRANSACTION_COORDINATOR,
                    coordinator_keys=[transactionalId],
                    min_version=4,
                )
                response = await manager.send(request)
                return response.coordinators[0]
            request = FindCoordinatorRequest(
                key=transactionalId, key_type=TRANSACTION_COORDINATOR, max_version=3
            )
            return await manager.send(request)

        row = self._run(find)
        if row.error_code != NONE:
            if row.error_code in RETRIABLE:
                raise TransientCommitError(
                    f"FindCoordinator for transactional id {transactionalId}: "
                    f"{errorName(row.error_code)}"
                )
            raise _permanent("FindCoordinator", transactionalId, row.error_code)
        nodeId = manager.cluster.add_coordinator(
            row, TRANSACTION_COORDINATOR, transactionalId, synthesize_node_id=False
        )
        self._coordinators[transactionalId] = int(nodeId)
        return int(nodeId)

    def endTransaction(
        self, transactionalId: str, producerId: int, producerEpoch: int, *, commit: bool
    ) -> int:
        """Send EndTxn for exactly this producer id and epoch; return the broker's error code.

        Returns ``NONE`` or one of ``NOT_ENDED``; raises ``TransientCommitError`` for retriable
        answers and network failures (after forgetting the coordinator), and a descriptive
        error for anything else (authorization, unsupported broker).
        """
        from kafka.protocol.producer.transaction import EndTxnRequest

        node = self._findCoordinator(transactionalId)
        manager = self._client()._manager
        request = EndTxnRequest(
            transactional_id=transactionalId,
            producer_id=producerId,
            producer_epoch=producerEpoch,
            committed=commit,
            max_version=END_TXN_MAX_VERSION,
        )

        async def send() -> Any:
            return await manager.send(request, node_id=node)

        try:
            response = self._run(send)
        except TransientCommitError:
            self._coordinators.pop(transactionalId, None)
            raise
        code = int(response.error_code)
        if code in _COORDINATOR_MOVED:
            self._coordinators.pop(transactionalId, None)
        if code in RETRIABLE:
            raise TransientCommitError(
                f"EndTxn({'commit' if commit else 'abort'}) of transactional id "
                f"{transactionalId}: {errorName(code)}"
            )
        if code != NONE and code not in NOT_ENDED:
            raise _permanent("EndTxn", transactionalId, code)
        log.debug(
            "kafka: EndTxn v%s %s of %s (producer id %d, epoch %d): %s",
            response.version,
            "commit" if commit else "abort",
            transactionalId,
            producerId,
            producerEpoch,
            errorName(code),
        )
        return code

    def listOngoing(self, prefix: str) -> list[TransactionListing] | None:
        """Ongoing transactions whose transactional id starts with ``prefix``, on every broker.

        Uses ListTransactions (Kafka 3.0+; with a server-side id filter from Kafka 4.1) and
        returns ``None`` when the cluster cannot list transactions (older brokers, or no
        DESCRIBE permission on transactional ids).
        """
        from kafka.errors import IncompatibleBrokerVersion
        from kafka.protocol.admin.transactions import ListTransactionsRequest

        manager = self._client()._manager
        try:
            version = manager.broker_version_data.api_version(ListTransactionsRequest)
        except IncompatibleBrokerVersion:
            return None
        # The broker matches the whole id (Java's Pattern.matches), hence the trailing ".*".
        pattern = "".join("\\" + c if not c.isalnum() else c for c in prefix) + ".*"

        async def listAll() -> list[Any]:
            rows: list[Any] = []
            for broker in manager.cluster.brokers():
                kwargs: dict[str, Any] = {"state_filters": ["Ongoing"], "producer_id_filters": []}
                if version >= 2:
                    kwargs["transactional_id_pattern"] = pattern
                response = await manager.send(
                    ListTransactionsRequest(**kwargs), node_id=broker.node_id
                )
                rows.append(response)
            return rows

        responses = self._run(listAll)
        listings: list[TransactionListing] = []
        for response in responses:
            code = int(response.error_code)
            if code in (UNSUPPORTED_VERSION, CLUSTER_AUTHORIZATION_FAILED):
                return None
            if code in RETRIABLE:
                raise TransientCommitError(f"ListTransactions: {errorName(code)}")
            if code != NONE:
                raise _permanent("ListTransactions", prefix + "*", code)
            for row in response.transaction_states:
                if str(row.transactional_id).startswith(prefix):
                    listings.append(
                        TransactionListing(
                            str(row.transactional_id),
                            int(row.producer_id),
                            str(row.transaction_state),
                        )
                    )
        return listings


def sharedClient(
    config: Mapping[str, str],
    *,
    timeoutSeconds: float = 30.0,
    resources: Resources | None = None,
) -> TransactionClient:
    """The process's client for this cluster and these credentials, created on first use.

    Spark keeps its driver-side Python workers across micro-batches but builds the sink again
    for every batch; one client per process (not per sink object), kept in the process's
    :class:`Resources` and closed with them, keeps one connection and one IO thread instead of
    a new one per batch.
    """
    key = tuple(sorted((str(k), str(v)) for k, v in config.items()))
    key += (("#timeout", str(timeoutSeconds)),)
    return (resources or Resources.ofProcess()).get(
        ("kafka.transactionClient", key),
        lambda: TransactionClient(config, timeoutSeconds=timeoutSeconds),
        TransactionClient.close,
    )


def _isConnectionError(exc: BaseException) -> bool:
    import kafka.errors as errors

    return isinstance(
        exc, errors.KafkaConnectionError | errors.NodeNotReadyError | errors.KafkaTimeoutError
    )


def _permanent(what: str, transactionalId: str, code: int) -> Exception:
    if code in (TRANSACTIONAL_ID_AUTHORIZATION_FAILED, CLUSTER_AUTHORIZATION_FAILED):
        return TwoPhaseConfigError(
            f"kafka: {what} of transactional id {transactionalId} was refused "
            f"({errorName(code)}): the driver's principal needs WRITE and DESCRIBE on "
            "transactional ids starting with the sink's transactionalIdPrefix"
        )
    return RuntimeError(f"kafka: {what} of transactional id {transactionalId}: {errorName(code)}")
