"""The driver half of ``twophase.multi``: every target's part of a handle, committed together.

Each method runs the targets' own committers on the parts of a multi handle; all of them are
idempotent, so a retry after a partial commit commits the rest. A part lost in its system
(Kafka's transaction timeout) does not stop the other parts from committing: the decision holds
for all of them; ``commitReplacement`` then commits the replay's part only for the lost targets
and aborts its other parts, so nothing is written twice.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from twophase.protocol import (
    Committer,
    Handle,
    RecoveryScope,
    TransactionLostError,
    TransientCommitError,
)
from twophase.protocol.fingerprint import combined
from twophase.protocol.outcomes import CommitAnswer, settleCommit
from twophase.sinks.multi.targets import KIND, Target, partOf, refuseLostTargets


class MultiCommitter(Committer):
    """Driver side: the targets' committers, one part of a multi handle each."""

    def __init__(self, parts: Sequence[tuple[Target, Committer]]):
        self.parts = list(parts)

    def commit(self, handle: Handle) -> None:
        refuseLostTargets(handle, [target for target, _ in self.parts])
        self._each(handle, lambda c, h: _settled(c, c.commit(h)))

    def recoverAndCommit(self, handle: Handle) -> None:
        refuseLostTargets(handle, [target for target, _ in self.parts])
        self._each(handle, lambda c, h: _settled(c, c.recoverAndCommit(h)))

    def abort(self, handle: Handle) -> None:
        self._each(handle, lambda c, h: c.abort(h))

    def commitReplacement(self, original: Handle, replacement: Handle) -> None:
        """Per target: the original part committed (again, a no-op) if it can be, and the
        replay's part aborted; the replay's part committed where the original is lost."""
        refuseLostTargets(original, [target for target, _ in self.parts])
        lost: list[TransactionLostError] = []
        for target, committer in self.parts:
            old, new = partOf(original, target.name), partOf(replacement, target.name)
            try:
                if old is not None:
                    _settled(committer, committer.recoverAndCommit(old))
                if new is not None:
                    committer.abort(new)
            except TransactionLostError as exc:
                if old is not None and committer.fingerprint(old) is None:
                    exc.rewritable = False  # the replay's part cannot be checked: stop
                    raise
                if new is not None:
                    try:
                        _settled(committer, committer.commit(new))
                    except TransactionLostError as again:
                        lost.append(again)
        if lost:
            raise lost[0]

    def completeBatch(self, sinkId: str, batchId: int, handles: Sequence[Handle]) -> None:
        """Every target's own batch completion, on that target's parts of the handles."""
        for target, committer in self.parts:
            parts = [p for h in handles for p in (partOf(h, target.name),) if p is not None]
            committer.completeBatch(target.sinkId, batchId, parts)

    def recoverAndAbort(self, scope: RecoveryScope) -> list[Handle]:
        """Every target's own sweep under its own sink id, keeping the parts of the kept
        handles: the framework's sweep for the built-in sinks, with each one's concurrency and
        housekeeping (Kafka's parallel fencing, the postgres and sql commit markers)."""
        aborted: list[Handle] = []
        for target, committer in self.parts:
            keep = tuple(
                part
                for h in scope.keep
                if h.get("kind") == KIND
                for part in (partOf(h, target.name),)
                if part is not None
            )
            sub = RecoveryScope(target.sinkId, keep, scope.batchId, scope.options)
            for handle in committer.recoverAndAbort(sub) or ():
                aborted.append({"kind": KIND, "parts": {target.name: handle}})
        return aborted

    def preparedNames(self, handle: Handle) -> tuple[str, ...]:
        """What a multi handle names in its targets' systems: each part's names, as that
        target's committer gives them."""
        if handle.get("kind") != KIND:
            return ()
        return tuple(
            name
            for target, committer in self.parts
            for part in (partOf(handle, target.name),)
            if part is not None
            for name in committer.preparedNames(part)
        )

    def fingerprint(self, handle: Handle) -> str | None:
        """The fingerprints of the parts that have one (``name=fp;...``), or ``None``."""
        found: dict[str, str] = {}
        for target, committer in self.parts:
            part = partOf(handle, target.name)
            if part is not None:
                value = committer.fingerprint(part)
                if value is not None:
                    found[target.name] = value
        return combined(found) if found else None

    def describe(self, handle: Handle) -> str:
        described = []
        for target, committer in self.parts:
            part = partOf(handle, target.name)
            if part is not None:
                described.append(f"{target.name}: {committer.describe(part)}")
        where = f"batch {handle.get('batchId')} partition {handle.get('partitionId')}"
        return f"multi {where} ({'; '.join(described)})"

    def _each(self, handle: Handle, action: Callable[[Committer, Handle], None]) -> None:
        """Run ``action`` on every part; a transient failure stops (a retry does it all again),
        a lost part does not stop the others and is raised at the end."""
        lost: list[TransactionLostError] = []
        for target, committer in self.parts:
            part = partOf(handle, target.name)
            if part is None:
                continue
            try:
                action(committer, part)
            except TransientCommitError:
                raise
            except TransactionLostError as exc:
                exc.add_note(f"twophase.multi: target {target.name}")
                if committer.fingerprint(part) is None:
                    exc.rewritable = False  # no fingerprint: the replay cannot be checked
                lost.append(exc)
        if lost:
            raise next((e for e in lost if not e.rewritable), lost[0])


def _settled(committer: Committer, answer: CommitAnswer) -> None:
    """A target's commit answer as the coordinator reads it: retry later, lost and unknown
    raised (so a part's outcome is never dropped), committed or already committed passed."""
    settleCommit(committer, answer)
