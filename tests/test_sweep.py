"""The framework's sweep (``twophase.protocol.sweep``) against a small in-memory system.

The system is real for what the sweep needs: it holds prepared transactions by name, lists
them, aborts one; the committers below speak to it in the narrow form or in today's form.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

import pytest

from twophase.doctor.listing import listedHeld
from twophase.protocol import (
    Committer,
    Handle,
    Prepared,
    RecoveryScope,
    SinkContractError,
    TwoPhaseParticipant,
)


class Ledger:
    """A system that holds prepared transactions ``<sinkId>/<batch>/<partition>``."""

    def __init__(self, *names: str) -> None:
        self.prepared = set(names)
        self.lock = threading.Lock()

    def rollback(self, name: str) -> bool:
        with self.lock:
            if name not in self.prepared:
                return False
            self.prepared.remove(name)
            return True


class LedgerCommitter(Committer):
    """The narrow form: names, a listing, an abort of one; no ``recoverAndAbort``."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    def commit(self, handle: Handle) -> None:
        self.ledger.rollback(handle["name"])

    def abort(self, handle: Handle) -> None:
        self.ledger.rollback(handle["name"])

    def listPrepared(self, scope: RecoveryScope) -> Iterable[Prepared]:
        for name in sorted(self.ledger.prepared):
            sinkId, batch, partition = name.split("/")
            if sinkId != scope.sinkId:
                continue
            if scope.batchId is not None and batch != str(scope.batchId):
                continue
            yield Prepared(
                name,
                {"kind": "ledger", "name": name},
                batchId=int(batch) if batch.isdigit() else None,
                partitionId=int(partition) if partition.isdigit() else None,
                foreign=None if batch.isdigit() else "not a name the sink makes",
            )

    def abortPrepared(self, item: Prepared) -> bool:
        return self.ledger.rollback(item.name)


def test_the_sweep_aborts_what_no_kept_handle_names_and_returns_it() -> None:
    ledger = Ledger("s/0/0", "s/0/1", "s/1/0", "other/0/0")
    committer = LedgerCommitter(ledger)
    aborted = committer.recoverAndAbort(RecoveryScope("s", keep=({"name": "s/0/1"},)))
    assert aborted == [{"kind": "ledger", "name": "s/0/0"}, {"kind": "ledger", "name": "s/1/0"}]
    assert ledger.prepared == {"s/0/1", "other/0/0"}
    assert committer.recoverAndAbort(RecoveryScope("s", keep=({"name": "s/0/1"},))) == []


def test_a_batch_scope_and_foreign_names_bound_the_sweep() -> None:
    ledger = Ledger("s/0/0", "s/1/0", "s/x/0")
    aborted = LedgerCommitter(ledger).recoverAndAbort(RecoveryScope("s", batchId=1))
    assert aborted == [{"kind": "ledger", "name": "s/1/0"}]
    LedgerCommitter(ledger).recoverAndAbort(RecoveryScope("s"))
    assert ledger.prepared == {"s/x/0"}  # foreign: listed, never aborted


def test_an_item_finished_meanwhile_is_not_reported_aborted() -> None:
    ledger = Ledger("s/0/0", "s/0/1")

    class Racing(LedgerCommitter):
        def listPrepared(self, scope: RecoveryScope) -> Iterable[Prepared]:
            listed = list(super().listPrepared(scope))
            self.ledger.rollback("s/0/0")  # another process finishes it after the listing
            return listed

    assert Racing(ledger).recoverAndAbort(RecoveryScope("s")) == [
        {"kind": "ledger", "name": "s/0/1"}
    ]


def test_abort_concurrency_aborts_listed_items_at_once() -> None:
    ledger = Ledger("s/0/0", "s/0/1")
    together = threading.Barrier(2, timeout=10)

    class Parallel(LedgerCommitter):
        abortConcurrency = 4

        def abortPrepared(self, item: Prepared) -> bool:
            together.wait()  # both aborts must be running for either to pass
            return super().abortPrepared(item)

    assert len(Parallel(ledger).recoverAndAbort(RecoveryScope("s")) or ()) == 2
    assert ledger.prepared == set()


def test_the_doctor_lists_what_the_sweep_lists_under_the_same_names() -> None:
    ledger = Ledger("s/0/0", "s/x/1")
    held = listedHeld(LedgerCommitter(ledger), "ledger", "s")
    assert [(h.key, h.batchId, h.foreign) for h in held] == [
        ("s/0/0", 0, None),
        ("s/x/1", None, "not a name the sink makes"),
    ]


def test_a_committer_written_against_todays_api_keeps_its_own_sweep() -> None:
    class Own(Committer):
        def commit(self, handle: Handle) -> None: ...

        def abort(self, handle: Handle) -> None: ...

        def recoverAndAbort(self, scope: RecoveryScope) -> list[Handle]:
            return [{"swept": scope.sinkId}]

    assert Own().recoverAndAbort(RecoveryScope("s")) == [{"swept": "s"}]


def test_a_committer_without_a_sweep_fails_when_built_naming_what_to_write() -> None:
    class Neither(Committer):
        def commit(self, handle: Handle) -> None: ...

        def abort(self, handle: Handle) -> None: ...

    class Half(Neither):
        def listPrepared(self, scope: RecoveryScope) -> Iterable[Prepared]:
            return []

    with pytest.raises(SinkContractError, match=r"Neither has no sweep: implement recoverAnd"):
        Neither()
    with pytest.raises(SinkContractError, match=r"Half has no sweep.*missing: abortPrepared"):
        Half()


def test_a_participant_in_the_narrow_form_needs_no_recover_and_abort() -> None:
    ledger = Ledger("s/0/0")

    class Participant(TwoPhaseParticipant[str]):
        def beginTransaction(self, ctx: object) -> str:
            return "txn"

        def write(self, txn: str, batch: object) -> None: ...

        def preCommit(self, txn: str) -> Handle:
            return {"name": txn}

        def commit(self, handle: Handle) -> None: ...

        def abort(self, handle: Handle) -> None: ...

        listPrepared = LedgerCommitter.listPrepared
        abortPrepared = LedgerCommitter.abortPrepared

    participant = Participant()
    participant.ledger = ledger
    assert participant.recoverAndAbort(RecoveryScope("s")) == [{"kind": "ledger", "name": "s/0/0"}]
