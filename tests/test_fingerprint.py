"""Record fingerprints: the same records in any order and any batching give the same one."""

from __future__ import annotations

import pytest

from twophase.protocol.fingerprint import Fingerprint, differenceOf


def fingerprint(*chunks: tuple[list[object], list[object] | None]) -> str:
    f = Fingerprint()
    for values, keys in chunks:
        f.add(values, keys, extra=b"topic")
    return f.toText()


def test_order_and_batching_do_not_matter() -> None:
    values: list[object] = [b"a", b"b", "c", None]
    keys: list[object] = [b"1", None, b"3", b"4"]
    whole = fingerprint((values, keys))
    assert whole == fingerprint((values[2:], keys[2:]), (values[:2], keys[:2]))
    assert whole == fingerprint((values[::-1], keys[::-1]))
    one = Fingerprint()
    for v, k in zip(values, keys, strict=True):
        one.addRecord(v, k, extra=b"topic")
    assert one.toText() == whole


def test_what_differs_is_said() -> None:
    base = fingerprint(([b"a", b"b"], [b"1", b"2"]))
    assert differenceOf(base, base) is None
    assert "2 records were prepared, the replay gave 1" in str(
        differenceOf(base, fingerprint(([b"a"], [b"1"])))
    )
    swapped = fingerprint(([b"a", b"b"], [b"2", b"1"]))  # same values and keys, other pairs
    assert "contents differ" in str(differenceOf(base, swapped))
    nullKey = fingerprint(([b"a", b"b"], [b"1", None]))
    emptyKey = fingerprint(([b"a", b"b"], [b"1", b""]))
    assert nullKey != emptyKey
    other = Fingerprint()
    other.add([b"a", b"b"], [b"1", b"2"], extra=b"another-topic")
    assert other.toText() != base
    with pytest.raises(ValueError, match="not a record fingerprint"):
        Fingerprint.fromText("nonsense")


def test_no_keys_is_every_key_null() -> None:
    values: list[object] = [b"a", "b", None, b""]
    assert fingerprint((values, None)) == fingerprint((values, [None] * len(values)))
