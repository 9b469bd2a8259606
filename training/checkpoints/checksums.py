"""The CRC32C records of a checkpoint's data files, and the checks made against them.

Each data file ``F`` of a checkpoint has ``F.crc32c`` beside it: a JSON record of the file's
size and of the offset, length and CRC32C of each stored item (training/checkpoints/format.py
writes it with the file). The reader checks every item it reads (:class:`ItemCheck`);
``moe-checkpoint verify`` checks whole files (:func:`verify_file`). Standard library and the
``crc32c`` package only, so the writer, the reader and the marker code share it without importing
each other.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import crc32c

CHECKSUM_SUFFIX = ".crc32c"
"""``F`` + this names the checksum record of data file ``F`` (training/checkpoints/format.py writes it)."""


_CRC_CHUNK_BYTES = 4 << 20  # each chunk is checksummed while it is still in the CPU's cache


def read_into(fd: int, into: memoryview, offset: int, crc: int = 0) -> int:
    """Fill ``into`` from the file at ``offset``; returns ``crc`` extended over the bytes read."""
    done = 0
    while done < len(into):
        count = os.preadv(fd, [into[done : done + _CRC_CHUNK_BYTES]], offset + done)
        if not count:
            raise EOFError(f"checkpoint file ends at byte {offset + done}, inside a stored item")
        crc = crc32c.crc32c(into[done : done + count], crc)
        done += count
    return crc


class ChecksumMismatch(Exception):
    """Bytes of a checkpoint file that are not the bytes written."""


def read_checksums(data_file: Path) -> dict | None:
    """The CRC32C record written with ``data_file``; None when there is none (a checkpoint from
    before moe-cdk wrote them). A record that cannot be read is a mismatch."""
    record_file = Path(str(data_file) + CHECKSUM_SUFFIX)
    try:
        record = json.loads(record_file.read_bytes())
        return {"bytes": int(record["bytes"]), "items": [[int(v) for v in item] for item in record["items"]]}
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as error:  # TypeError: an item that is not a list
        raise ChecksumMismatch(f"{record_file.name}: unreadable checksum record ({error})") from error


def crc32c_of_range(fd: int, offset: int, length: int, *, chunk_bytes: int = 64 << 20) -> int:
    """The CRC32C of ``length`` bytes of an open file from ``offset``, read ``chunk_bytes`` at a time."""
    buffer = memoryview(bytearray(max(min(chunk_bytes, length), 1)))
    crc, done = 0, 0
    while done < length:
        part = buffer[: min(len(buffer), length - done)]
        crc = read_into(fd, part, offset + done, crc)
        done += len(part)
    return crc


def crc32c_of_file(path: Path, size: int) -> int:
    """The CRC32C of the first ``size`` bytes of ``path``."""
    with open(path, "rb", buffering=0) as handle:
        return crc32c_of_range(handle.fileno(), 0, size)


class ItemCheck:
    """Checks each item read from one file against the file's checksum record."""

    def __init__(self, relative_path: str, record: dict | None) -> None:
        self.name = relative_path
        self._expected = None if record is None else {offset: (length, crc) for offset, length, crc in record["items"]}

    @property
    def recorded(self) -> bool:
        return self._expected is not None

    def __call__(self, offset: int, length: int, crc: int) -> None:
        if self._expected is None:
            return
        want = self._expected.get(offset)
        if want is None or want[0] != length:
            raise ChecksumMismatch(f"{self.name}: no checksum was recorded for the {length}-byte item at byte {offset}")
        if want[1] != crc:
            raise ChecksumMismatch(
                f"{self.name}: the {length}-byte item at byte {offset} has CRC32C {crc:08x}, {want[1]:08x} was written"
            )


def verify_file(data_file: Path) -> str | None:
    """Why ``data_file`` is not the file that was written, or None when its size and each stored
    item's CRC32C match its record. The items cover the file end to end, so every byte is
    checked; a file without a record cannot be checked, and says so."""
    try:
        record = read_checksums(data_file)
        if record is None:
            return f"{data_file.name} has no checksum record ({data_file.name}{CHECKSUM_SUFFIX})"
        size = data_file.stat().st_size
        if size != record["bytes"]:
            return f"{data_file.name} has {size} bytes, {record['bytes']} were written"
        check, at = ItemCheck(data_file.name, record), 0
        with open(data_file, "rb", buffering=0) as file:
            for offset, length, _ in sorted(record["items"]):
                if offset != at:
                    return f"{data_file.name}: its checksum record does not cover bytes {at}-{offset}"
                check(offset, length, crc32c_of_range(file.fileno(), offset, length))
                at = offset + length
        if at != size:
            return f"{data_file.name}: its checksum record does not cover bytes {at}-{size}"
    except ChecksumMismatch as error:
        return str(error)
    return None
