"""Processes a test run left behind (a library, not a test file).

``mark_session()`` puts a unique marker into this process's environment; every process the
suite starts inherits it, however deep. ``survivors()`` lists the processes that carry the
marker but are no longer descendants of this process: they were orphaned (reparented to
init) and would outlive the suite. Live descendants (the CDK's node kernel, a fixture's
daemons until their teardown) end with it and are not counted; nor are zombies. Linux
/proc only; reading another process's environment needs the same user or root.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

MARKER = "MOE_CDK_TEST_SESSION"


def mark_session() -> str:
    """This process's marker, made once per process: a pytest-xdist worker inherits its
    controller's environment but needs a marker of its own, or each worker would count the
    other's live children as orphans."""
    owner = f"{os.getpid()}-"
    if not os.environ.get(MARKER, "").startswith(owner):
        os.environ[MARKER] = owner + uuid.uuid4().hex
    return os.environ[MARKER]


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of ``pid``, or None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], int(fields[1])


def _carries(pid: int, token: str) -> bool:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"{MARKER}={token}".encode() in environ.split(b"\0")


def _descends_from(pid: int, ancestor: int) -> bool:
    seen = set()
    while pid > 1 and pid not in seen:
        if pid == ancestor:
            return True
        seen.add(pid)
        stat = _stat(pid)
        if stat is None:
            return False
        pid = stat[1]
    return False


def survivors(token: str) -> list[str]:
    """``pid command`` of every orphaned process that carries ``token``."""
    me = os.getpid()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        pid = int(entry.name)
        stat = _stat(pid)
        if stat is None or stat[0] == "Z" or not _carries(pid, token) or _descends_from(pid, me):
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        found.append(f"{pid} {command[:200]}")
    return found


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` in the process tree, now."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
            children.setdefault(stat[1], []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def alive(pids: set[int]) -> set[int]:
    """The ones of ``pids`` that still run (zombies count as gone)."""
    return {pid for pid in pids if (stat := _stat(pid)) is not None and stat[0] != "Z"}
