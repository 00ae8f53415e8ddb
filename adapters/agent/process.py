"""Task processes of the fake agent, seen through Linux ``/proc``: liveness that survives pid reuse,
process groups, and the exit-code file a detached task leaves behind."""

from __future__ import annotations

import hashlib
import os
import signal
from pathlib import Path
from urllib.parse import quote

# Wrapper that records the exit code of a detached task (only used with --state-dir); the file is
# created 0600 whatever the umask (the task itself keeps the agent's umask).
EXIT_WRAPPER = '"$@"; code=$?; (umask 077; echo "$code" > "$MUSTER_EXIT_FILE"); exit "$code"'

# Longest file stem kept whole (a file name is at most 255 bytes, and ".exit" / ".log" follow).
_STEM_MAX = 200


def seconds_arg(value: float) -> str:
    """A duration as ``sleep`` takes it (never negative)."""
    return f"{max(value, 0.0):g}"


def file_stem(task_id: str) -> str:
    """A task id as a file name that no other task id maps to: percent-encoded (every byte outside
    ``A-Za-z0-9_.-~`` as ``%XX``; ``urllib.parse.unquote`` gives the id back). A stem longer than
    200 characters is cut and ends in ``%%`` and a hash of the id instead (``%%`` never occurs in
    an encoded id, so a cut stem cannot equal a whole one)."""
    stem = quote(task_id, safe="")
    if len(stem) > _STEM_MAX:
        stem = stem[: _STEM_MAX - 34] + "%%" + hashlib.sha256(task_id.encode()).hexdigest()[:32]
    return stem


def legacy_file_stem(task_id: str) -> str:
    """The file stem of an agent before ``file_stem`` (lossy: ``x/y_z`` and ``x_y/z`` collide);
    only used to find the files of tasks recorded by such an agent."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in task_id)


def start_ticks(pid: int) -> int:
    """The process's start time (``/proc/<pid>/stat`` field 22), 0 when unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return 0


def alive(pid: int, ticks: int) -> bool:
    """Whether ``pid`` still runs and is the same process (same start time; 0: do not check)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] == "Z":  # zombie: it has exited
        return False
    return not ticks or int(fields[19]) == ticks


def group_alive(pgid: int) -> bool:
    """Whether any member of process group ``pgid`` still runs (zombies do not count)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # killpg(0) also succeeds for zombies; look for a live member.
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def environ(pid: int) -> dict[str, str]:
    """The environment ``pid`` was started with (empty when unreadable or gone)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def tagged_groups(variable: str, value: str) -> dict[int, str]:
    """Process groups with a live member whose environment has ``variable=value``: pgid -> the
    member's MUSTER_TASK_ID. Environments are inherited, so this finds a task's children too."""
    return {
        pgid: env.get("MUSTER_TASK_ID", "")
        for pgid, env in tagged_group_envs(variable, value).items()
    }


def tagged_group_envs(variable: str, value: str) -> dict[int, dict[str, str]]:
    """Like :func:`tagged_groups`, with the environment of the first tagged member found."""
    groups: dict[int, dict[str, str]] = {}
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] == "Z":
            continue
        env = environ(int(entry.name))
        if env.get(variable) == value:
            groups.setdefault(int(fields[2]), env)
    return groups


def signal_group(pgid: int, sig: signal.Signals) -> bool:
    """Send ``sig`` to a process group; False when the group is gone."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False


def read_exit_file(path: str) -> int | None:
    """The exit code a detached task's wrapper wrote, or None (no file, still running, unreadable)."""
    if not path:
        return None
    try:
        return int(Path(path).read_text().strip())
    except (OSError, ValueError):
        return None


def mtime(path: Path) -> float:
    """Modification time, 0 when the file cannot be read."""
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
