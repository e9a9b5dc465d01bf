"""A measured search killed outright (SIGKILL, as a scheduler or an impatient user does) leaves no build worker
running and its profile database intact, every measurement it wrote readable by the next search."""

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from korch.backends.db import ProfileDB

ROOT = Path(__file__).resolve().parents[2]


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _alive_after(pids: list[int], deadline: float) -> list[int]:
    """Those of ``pids`` still alive at ``deadline`` (``time.monotonic``), returning as soon as none is."""
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    return [p for p in pids if _alive(p)]


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _measurements(db: Path) -> int:
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(db, timeout=1) as conn:
            return conn.execute("SELECT COUNT(*) FROM measurements").fetchone()[0]
    except sqlite3.Error:
        return 0


def test_killing_a_measured_search_kills_its_workers_and_keeps_the_database(tmp_path):
    db = tmp_path / "profile.sqlite"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "KORCH_COMPILED_UNIT": "0"}
    search = subprocess.Popen([sys.executable, "-m", "korch", "optimize", "zoo:bert_layer", "-o", str(tmp_path / "out"),
                               "--target", "cpu", "--cost", "measured", "--db", str(db), "--jobs", "2", "-q"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers: list[int] = []
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline and search.poll() is None:
            workers = [p for p in _children(search.pid) if _alive(p)]
            if len(workers) >= 2 and _measurements(db) > 0:
                break
            time.sleep(0.5)
        assert search.poll() is None, "the search ended before it could be killed mid-measurement"
        assert workers and _measurements(db) > 0, "no workers or no measurement within 300 s"
        commands = {p: _command(p) for p in workers}
        search.kill()
        search.wait()
        killed_at = time.monotonic()
        # the build workers die with their parent (PR_SET_PDEATHSIG): within 5 s; multiprocessing's resource
        # tracker, the search's other child, exits when its pipe closes: given up to 30 s on a loaded machine
        builders = [p for p in workers if "spawn_main" in commands[p]]
        assert builders, commands
        outlived = _alive_after(builders, killed_at + 5)
        assert not outlived, f"build workers outlived the killed search by 5 s: {[commands[p] for p in outlived]}"
        assert not _alive_after(workers, killed_at + 30), f"children outlived the search by 30 s: {commands}"
    finally:
        if search.poll() is None:
            search.kill()
        for pid in workers:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        rows = conn.execute("SELECT signature, device FROM measurements").fetchall()
    assert rows
    with ProfileDB(str(db)) as profile:  # what the next search reads: every record the killed one wrote
        signature, device = rows[0]
        assert profile.get(signature, device)


def test_a_child_whose_parent_is_gone_exits_at_once():
    child = subprocess.run([sys.executable, "-c", "from korch.workers import die_with_parent; "
                            "die_with_parent(1); print('still here')"],
                           env={**os.environ, "PYTHONPATH": str(ROOT / "src")}, capture_output=True, text=True)
    assert child.returncode == 1 and "still here" not in child.stdout
