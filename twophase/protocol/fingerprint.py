"""A cheap, order-independent fingerprint of the records one task prepared.

A sink whose participant can abort a decided transaction on its own (Kafka's transaction
timeout) puts one in each handle, so that the coordinator can prove a replay of the batch
gives the same records before it writes a lost partition again (docs/protocol.md, "Decided
transactions the participant aborted"). Order-independent because Spark's replay of a shuffled
partition delivers the same rows in another order. It detects a non-deterministic query, not a
forgery: per record a CRC-32 and an Adler-32 of its fields, summed, with the record count.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any

_NULL = b"\x00twophase-null\x00"
"""What a missing field (a null key or value) counts as, so null and empty differ."""

_MASK = (1 << 64) - 1


def _blob(value: Any) -> bytes:
    if value is None:
        return _NULL
    if isinstance(value, str):
        return value.encode()
    return bytes(value)


def _blobs(values: Sequence[Any]) -> Iterable[bytes]:
    if set(map(type, values)) <= {bytes}:  # the common case, without Python code per value
        return values
    return [v if type(v) is bytes else _blob(v) for v in values]


@dataclass
class Fingerprint:
    """Records counted and their CRC-32 and Adler-32 sums; ``add`` folds in more records.

    ``scheme`` names how a sink turned its records into the bytes summed (empty: the original
    scheme, a record's key and value as produced). Fingerprints of different schemes never
    match, and ``differenceOf`` says so rather than comparing their sums.
    """

    records: int = 0
    crcSum: int = 0
    adlerSum: int = 0
    scheme: str = ""

    def add(
        self, values: Sequence[Any], keys: Sequence[Any] | None = None, *, extra: bytes = b""
    ) -> None:
        """Fold in records given as parallel lists of values and keys (``None`` for no key).

        ``extra`` is mixed into every record (for instance the topic the records go to).
        """
        crc, adler = zlib.crc32, zlib.adler32
        blobs = _blobs(values)
        if keys is None:  # every record starts from the same sums: take them once
            crcs = map(crc, blobs, repeat(crc(_NULL, crc(extra))))
            adlers = map(adler, blobs, repeat(adler(_NULL, adler(extra))))
        else:
            keyBlobs = _blobs(keys)
            crcs = map(crc, blobs, map(crc, keyBlobs, repeat(crc(extra))))
            adlers = map(adler, blobs, map(adler, keyBlobs, repeat(adler(extra))))
        self.crcSum = (self.crcSum + sum(crcs)) & _MASK
        self.adlerSum = (self.adlerSum + sum(adlers)) & _MASK
        self.records += len(values)

    def addRecord(self, value: Any, key: Any = None, *, extra: bytes = b"") -> None:
        """Fold in one record (the slow path of a sink that writes record by record)."""
        self.add([value], [key], extra=extra)

    def toText(self) -> str:
        """``[<scheme>@]<records>:<crc sum hex>:<adler sum hex>``, the form a handle carries."""
        sums = f"{self.records}:{self.crcSum:016x}:{self.adlerSum:016x}"
        return f"{self.scheme}@{sums}" if self.scheme else sums

    @classmethod
    def fromText(cls, text: str) -> Fingerprint:
        scheme, _, sums = text.rpartition("@")
        try:
            records, crcSum, adlerSum = sums.split(":")
            return cls(int(records), int(crcSum, 16), int(adlerSum, 16), scheme)
        except ValueError:
            raise ValueError(f"not a record fingerprint: {text!r}") from None


def combined(parts: dict[str, str]) -> str:
    """One fingerprint for several named parts (the targets of one task): ``name=fp;...``."""
    return ";".join(f"{name}={fp}" for name, fp in sorted(parts.items()))


def _parts(text: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in text.split(";") if "=" in part)


def differenceOf(logged: str, replay: str) -> str | None:
    """``None`` when two fingerprints match, else what differs, in words for an error."""
    if logged == replay:
        return None
    if "=" in logged or "=" in replay:
        before, after = _parts(logged), _parts(replay)
        said = []
        for name in sorted(before.keys() | after.keys()):
            if before.get(name) == after.get(name):
                continue
            both = name in before and name in after
            what = differenceOf(before[name], after[name]) if both else "missing in one"
            said.append(f"{name}: {what}")
        return "; ".join(said)
    try:
        old, new = Fingerprint.fromText(logged), Fingerprint.fromText(replay)
    except ValueError as exc:
        return str(exc)
    if old.scheme != new.scheme:
        return (
            f"the decided records were fingerprinted as {_schemeName(old.scheme)}, the replay's "
            f"as {_schemeName(new.scheme)} (the decided handle is from another twophase "
            "version), so they cannot be compared"
        )
    if old.records != new.records:
        return f"{old.records} records were prepared, the replay gave {new.records}"
    return f"the same {old.records} records in number, but their contents differ"


def _schemeName(scheme: str) -> str:
    return repr(scheme) if scheme else "the original scheme"
