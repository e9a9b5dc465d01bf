"""The profile database: keys and versions, best record, stats, clear, bad files, several writing processes."""

import multiprocessing
import pickle
import sqlite3
import threading

import pytest

from korch import config
from korch.backends.db import SCHEMA_VERSION, ProfileDB, Record
from korch.errors import KorchError

VERSIONS = {"triton": "3.6.0", "inductor": "2.13"}


def ok(signature, backend, latency, device="h100", version=None, **extra):
    return Record(signature, device, backend, version or VERSIONS.get(backend, "1"), "ok", latency, **extra)


def failed(signature, backend, status="build_failed", message="no", device="h100", version=None):
    return Record(signature, device, backend, version or VERSIONS.get(backend, "1"), status, None, message)


@pytest.fixture
def db(tmp_path):
    with ProfileDB(tmp_path / "p.sqlite") as d:
        yield d


def test_lookup_keeps_current_versions_of_the_asked_backends_on_the_device(db):
    db.put([ok("a", "triton", 2e-6, variant={"BLOCK": 128, "num_warps": 4}, max_rel_error=1e-7, launches=1),
            ok("a", "inductor", 1e-6, launches=2),
            ok("a", "triton", 0.5e-6, version="3.5.0"),     # old compiler: not current
            ok("a", "library", 0.1e-6),                       # backend not asked about
            ok("a", "triton", 0.2e-6, device="cpu"),          # other device
            failed("b", "triton", "check_failed", "max rel error 0.3")])
    found = db.lookup(["a", "b", "c", "a"], "h100", VERSIONS)
    assert list(found) == ["a", "b", "c"]
    assert [(r.backend, r.latency_s) for r in found["a"]] == [("inductor", 1e-6), ("triton", 2e-6)]
    triton = found["a"][1]
    assert triton.variant == {"BLOCK": 128, "num_warps": 4} and triton.max_rel_error == 1e-7
    assert found["a"][0].launches == 2
    assert [(r.status, r.message) for r in found["b"]] == [("check_failed", "max rel error 0.3")]
    assert found["c"] == []


def test_lookup_in_bulk_beyond_one_statement(db):
    signatures = [f"s{i}" for i in range(1200)]
    assert db.put(ok(s, "triton", (i + 1) * 1e-6) for i, s in enumerate(signatures)) == 1200
    found = db.lookup(signatures, "h100", VERSIONS)
    assert all(len(found[s]) == 1 and found[s][0].latency_s == (i + 1) * 1e-6 for i, s in enumerate(signatures))


def test_best_is_the_fastest_ok_record(db):
    db.put([ok("a", "triton", 3e-6), ok("a", "inductor", 2e-6), failed("a", "library", version="1")])
    assert db.best("a", "h100", {**VERSIONS, "library": "1"}).backend == "inductor"
    db.put([failed("b", "triton"), failed("b", "inductor", "timing_failed")])
    assert db.best("b", "h100", VERSIONS) is None
    assert db.best("never", "h100", VERSIONS) is None


def test_put_replaces_a_key(db):
    db.put([failed("a", "triton")])
    db.put([ok("a", "triton", 4e-6)])
    [record] = db.lookup(["a"], "h100", VERSIONS)["a"]
    assert record.ok and record.latency_s == 4e-6 and db.stats()["rows"] == 1


def test_get_without_versions_gives_each_backends_newest(db):
    db.put([ok("a", "triton", 1e-6, version="3.5.0", created=100.0), ok("a", "triton", 2e-6, created=200.0),
            ok("a", "inductor", 5e-6, created=50.0)])
    newest = db.get("a", "h100")
    assert newest["triton"].backend_version == "3.6.0" and newest["inductor"].latency_s == 5e-6
    assert db.get("a", "h100", {"triton": "3.5.0"})["triton"].latency_s == 1e-6


@pytest.mark.parametrize("status, latency", [("fine", 1.0), ("ok", None), ("build_failed", 1.0)])
def test_records_are_consistent(status, latency):
    with pytest.raises(ValueError):
        Record("a", "cpu", "triton", "1", status, latency)


def test_stats_and_clear(db):
    db.put([ok("a", "triton", 1e-6), ok("b", "triton", 1e-6), failed("c", "triton"),
            ok("a", "inductor", 1e-6), ok("a", "triton", 1e-6, device="cpu")])
    stats = db.stats()
    assert (stats["rows"], stats["ok"], stats["failed"]) == (5, 4, 1)
    assert stats["by_status"] == {"ok": 4, "build_failed": 1}
    groups = {(g["device"], g["backend"]): (g["rows"], g["ok"], g["failed"]) for g in stats["by_device_backend"]}
    assert groups == {("h100", "triton"): (3, 2, 1), ("h100", "inductor"): (1, 1, 0), ("cpu", "triton"): (1, 1, 0)}
    assert stats["file_bytes"] > 0
    assert db.clear(device="cpu") == 1 and db.stats()["rows"] == 4
    assert db.clear() == 4 and db.stats()["rows"] == 0


def test_opens_lazily_at_the_default_path_in_wal_mode(tmp_path):
    with config.patch(cache_dir=tmp_path / "cache"):
        db = ProfileDB()
    assert db.path == tmp_path / "cache" / "profile.sqlite" and not db.path.exists()
    db.put([ok("a", "triton", 1e-6)])
    with sqlite3.connect(db.path) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert raw.execute("SELECT value FROM korch_meta").fetchone()[0] == str(SCHEMA_VERSION)
    db.close()


def _one_line_error(path, *needles):
    with pytest.raises(KorchError) as info:
        ProfileDB(path).stats()
    message = str(info.value)
    assert "\n" not in message and str(path) in message
    for needle in needles:
        assert needle in message


def test_a_file_that_is_not_sqlite_is_a_one_line_error(tmp_path):
    path = tmp_path / "p.sqlite"
    path.write_bytes(b"definitely not a database\n" * 200)
    _one_line_error(path, "not a database")


def test_another_programs_database_is_refused(tmp_path):
    path = tmp_path / "p.sqlite"
    with sqlite3.connect(path) as raw:
        raw.execute("CREATE TABLE users (name TEXT)")
    _one_line_error(path, "users")


def test_another_schema_version_is_refused(tmp_path):
    path = tmp_path / "p.sqlite"
    ProfileDB(path).stats()
    with sqlite3.connect(path) as raw:
        raw.execute("UPDATE korch_meta SET value = '99'")
    _one_line_error(path, "version 99")


def _write_batches(path, worker, batches, per_batch, start=None):
    if start is not None:
        start.wait()  # all open the new file at once: they race to create it and switch it to WAL
    db = ProfileDB(path)
    for b in range(batches):
        db.put(ok(f"w{worker}-b{b}-r{r}", "triton", 1e-6 * (r + 1)) for r in range(per_batch))
        db.lookup([f"w{worker}-b{b}-r0"], "h100", VERSIONS)  # readers interleave with the writers
    db.close()


def test_several_processes_write_at_once(tmp_path):
    path = tmp_path / "p.sqlite"
    workers, batches, per_batch = 4, 20, 25
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(workers)
    procs = [ctx.Process(target=_write_batches, args=(path, w, batches, per_batch, start)) for w in range(workers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0] * workers
    db = ProfileDB(path)
    assert db.stats()["rows"] == workers * batches * per_batch
    expected = [f"w{w}-b{b}-r{r}" for w in range(workers) for b in range(batches) for r in range(per_batch)]
    assert all(db.lookup(expected, "h100", VERSIONS).values())


def test_a_forked_child_opens_its_own_connection(db):
    db.put([ok("parent", "triton", 1e-6)])  # the parent's connection is open before the fork
    child = multiprocessing.get_context("fork").Process(target=db.put, args=([ok("child", "triton", 2e-6)],))
    child.start()
    child.join(timeout=60)
    assert child.exitcode == 0
    assert db.best("child", "h100", VERSIONS).latency_s == 2e-6
    db.put([ok("after", "triton", 3e-6)])
    assert db.stats()["rows"] == 3


def test_a_pickled_database_reopens_and_threads_share_one(db):
    db.put([ok("a", "triton", 1e-6)])
    copy = pickle.loads(pickle.dumps(db))
    assert copy.path == db.path and copy.best("a", "h100", VERSIONS).latency_s == 1e-6
    threads = [threading.Thread(target=copy.put, args=([ok(f"t{i}", "triton", 1e-6)],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert db.stats()["rows"] == 9
    copy.close()
