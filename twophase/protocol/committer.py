"""The driver half of the protocol: finish or discard prepared transactions, from any process.

A ``Committer`` sees only handles (JSON values in the decision log), never an open transaction,
so the Spark driver, a restarted query or ``twophase recover`` on another machine can all use it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

from twophase.protocol.errors import SinkContractError
from twophase.protocol.handles import Handle, RecoveryScope, dumpsHandle
from twophase.protocol.outcomes import CommitAnswer
from twophase.protocol.sweep import Prepared, sweepPrepared


class Committer(ABC):
    """Every method is idempotent: a restart may call it again for the same handle.

    ``commit`` makes a prepared transaction visible, ``abort`` discards one, ``recoverAndCommit``
    commits a handle of a batch decided before a restart, ``recoverAndAbort`` sweeps this sink's
    prepared transactions that no decision keeps. Raise ``TransientCommitError`` when a retry
    may succeed and ``TransactionLostError`` when a decided transaction is gone.

    The sweep comes in two forms: ``recoverAndAbort`` written by the sink, or the narrow form,
    where the sink implements ``listPrepared`` and ``abortPrepared`` (and ``preparedNames``
    when its handles are not named by a ``"name"`` key) and the framework writes the sweep
    (``twophase.protocol.sweep``). A committer with neither fails when it is built, naming its
    class and what to implement.
    """

    abortConcurrency: ClassVar[int] = 1
    """How many listed items the framework's sweep aborts at once (``abortPrepared`` in
    threads when above 1)."""

    _sweepChecked: ClassVar[bool] = False

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if not cls.__dict__.get("_sweepChecked", False):
            _checkSweep(cls)
            cls._sweepChecked = True
        return super().__new__(cls)

    @abstractmethod
    def commit(self, handle: Handle) -> CommitAnswer:
        """Idempotent: make a prepared transaction visible; no-op when already done.

        May say how it ended (``twophase.protocol.outcomes``): ``None`` means committed, a
        ``CommitStatus`` (or a ``CommitResult`` with a reason) already committed, retry
        later, lost or unknown.
        """

    @abstractmethod
    def abort(self, handle: Handle) -> None:
        """Idempotent: discard a prepared transaction; no-op when already gone."""

    def recoverAndCommit(self, handle: Handle) -> CommitAnswer:
        """Idempotent: commit a handle of a decided batch after a restart."""
        return self.commit(handle)

    def recoverAndAbort(self, scope: RecoveryScope) -> list[Handle] | None:
        """Idempotent: abort this sink's prepared transactions that no decision keeps.

        Returns what it aborted, for logs and ``twophase status`` (``None`` means nothing).
        Default: the framework's sweep over ``listPrepared``, ``preparedNames`` and
        ``abortPrepared``; a sink that finds and aborts its leftovers another way overrides it.
        """
        return sweepPrepared(self, scope)

    def preparedNames(self, handle: Handle) -> Iterable[str]:
        """The names on the system of what ``handle`` prepared (a gid, a transactional id...),
        as ``listPrepared`` names them; none for a handle of another sink.

        Default: the handle's ``"name"``, when it has one.
        """
        name = handle.get("name")
        return (name,) if isinstance(name, str) else ()

    def listPrepared(self, scope: RecoveryScope) -> Iterable[Prepared]:
        """Read-only: what the system holds prepared under this sink's names (of
        ``scope.batchId`` only, when set), kept handles included; the sweep drops those.

        Narrow form only; ``twophase doctor`` lists with it too.
        """
        raise NotImplementedError(_missingSweep(type(self)))

    def abortPrepared(self, item: Prepared) -> bool | None:
        """Idempotent: abort one item of ``listPrepared``. ``False`` says it was gone already
        (finished meanwhile by another process): the sweep leaves it out of what it returns.

        Narrow form only.
        """
        raise NotImplementedError(_missingSweep(type(self)))

    def completeBatch(  # noqa: B027 - optional hook
        self, sinkId: str, batchId: int, handles: Sequence[Handle]
    ) -> None:
        """Idempotent: after every handle of decided batch ``batchId`` is committed, publish the
        batch as one unit; a retry after a crash calls it again, so it must recognise its own
        earlier success.

        Default: nothing (each handle's ``commit`` made its part visible). A table format that
        makes a whole batch visible in one log commit (``twophase.delta``) does that commit
        here, once per batch instead of once per task; the coordinator calls it with the
        batch's live handles before it writes ``committed(N)``, batches in order.
        """

    def commitReplacement(self, original: Handle, replacement: Handle) -> CommitAnswer:
        """Idempotent: commit the replay's handle that stands for a decided, lost ``original``.

        Default: ``commit(replacement)``. A sink whose handle spans several transactions (one
        per target of ``twophase.multi``) commits the replacement's part only where the
        original's part is lost, and aborts the rest, so what did commit is not written twice.
        """
        return self.commit(replacement)

    def fingerprint(self, handle: Handle) -> str | None:
        """The fingerprint of the records ``handle`` holds (``twophase.protocol.fingerprint``).

        A sink whose participant can abort a decided transaction on its own (Kafka's transaction
        timeout) returns the one its writer put in the handle: the coordinator then writes a lost
        partition again from Spark's replay of the batch, once the replay's fingerprint matches.
        ``None`` (the default): a lost decided transaction stops the query with
        ``TransactionLostError``.
        """
        return None

    def describe(self, handle: Handle) -> str:
        """A short human description of a handle for logs and errors (never secrets)."""
        return dumpsHandle(handle)


def _overrides(cls: type, name: str) -> bool:
    return getattr(cls, name) is not getattr(Committer, name)


def listsPrepared(committer: object) -> bool:
    """Whether ``committer`` speaks the narrow form: it lists what it prepared
    (``listPrepared``), so the framework's sweep and ``twophase doctor`` can read it."""
    return isinstance(committer, Committer) and _overrides(type(committer), "listPrepared")


def _missingSweep(cls: type) -> str:
    return (
        f"{cls.__module__}.{cls.__qualname__} has no sweep: implement recoverAndAbort(scope), "
        "or the narrow form listPrepared(scope) and abortPrepared(item) (see "
        "docs/writing-a-sink.md)"
    )


def _checkSweep(cls: type) -> None:
    """``SinkContractError`` when ``cls`` neither writes ``recoverAndAbort`` nor gives the
    framework the narrow form to write it from."""
    if _overrides(cls, "recoverAndAbort"):
        return
    missing = [m for m in ("listPrepared", "abortPrepared") if not _overrides(cls, m)]
    if missing:
        raise SinkContractError(
            f"{_missingSweep(cls)}; missing: {', '.join(missing)}"
            if len(missing) == 1
            else _missingSweep(cls)
        )
