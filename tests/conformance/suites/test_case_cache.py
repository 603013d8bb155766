"""The disk cache of built case lists (conformance.suites.cache): a hit is exactly the build, a stale, corrupt or
unwritable entry costs only a rebuild, and the entry is keyed by the sources."""

from __future__ import annotations

import json
import os

import pytest

from conformance.suites import cache as case_cache
from conformance.cases.case import AttentionCase


def _cases(n: int = 3) -> list[AttentionCase]:
    return [
        AttentionCase(num_heads=2, num_kv_heads=1, head_dim=16 * (i + 1), requests=((i + 1, i + 2),)) for i in range(n)
    ]


class _Build:
    def __init__(self, cases):
        self.cases, self.calls = cases, 0

    def __call__(self):
        self.calls += 1
        return list(self.cases)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(case_cache.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_hit_is_the_build(cache):
    build = _Build(_cases())
    first = case_cache.cached_cases("t", build)
    second = case_cache.cached_cases("t", build)
    assert build.calls == 1
    assert first == second == tuple(_cases())
    assert [c.id for c in second] == [c.id for c in _cases()]
    assert len(list(cache.glob("cases-t-*.json"))) == 1


def test_another_source_key_is_another_entry(cache, monkeypatch):
    build = _Build(_cases())
    monkeypatch.setattr(case_cache, "source_key", lambda: "a" * 64)
    case_cache.cached_cases("t", build)
    monkeypatch.setattr(case_cache, "source_key", lambda: "b" * 64)
    case_cache.cached_cases("t", build)
    assert build.calls == 2


@pytest.mark.parametrize("edited_name", ["space_axes.py", "default.py", "llama.toml", "options.py"])
def test_source_key_follows_the_sources(tmp_path, monkeypatch, edited_name):
    """An edit to the case space (cases/), a suite table (suites/), a model's data (models/data/, the space's head
    counts) or the reference (attnref/) is another key."""
    case_cache.source_key.cache_clear()
    before = case_cache.source_key()
    real = case_cache.Path.read_bytes

    def edited(self):
        data = real(self)
        return data + b"# edited\n" if self.name == edited_name else data

    monkeypatch.setattr(case_cache.Path, "read_bytes", edited)
    case_cache.source_key.cache_clear()
    try:
        assert case_cache.source_key() != before
    finally:
        monkeypatch.undo()
        case_cache.source_key.cache_clear()
    assert case_cache.source_key() == before


@pytest.mark.parametrize("damage", ["garbage", "ids", "truncated", "empty"])
def test_a_damaged_entry_is_rebuilt(cache, damage):
    build = _Build(_cases())
    case_cache.cached_cases("t", build)
    (entry,) = cache.glob("cases-t-*.json")
    text = entry.read_text()
    if damage == "garbage":
        entry.write_bytes(b"\xff\x00not json")
    elif damage == "ids":
        data = json.loads(text)
        data["ids"][0] = "someone-else"
        entry.write_text(json.dumps(data))
    elif damage == "truncated":
        entry.write_text(text[: len(text) // 2])
    else:
        entry.write_text("")
    assert case_cache.cached_cases("t", build) == tuple(_cases())
    assert build.calls == 2
    assert case_cache.cached_cases("t", build) == tuple(_cases())  # rewritten whole
    assert build.calls == 2


def test_an_unusable_cache_dir_costs_only_the_build(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv(case_cache.CACHE_ENV, str(blocker / "cache"))
    build = _Build(_cases())
    assert case_cache.cached_cases("t", build) == tuple(_cases())
    assert case_cache.cached_cases("t", build) == tuple(_cases())
    assert build.calls == 2
    assert not list(tmp_path.glob(".*.tmp"))


def test_off_builds_every_time(monkeypatch):
    monkeypatch.setenv(case_cache.CACHE_ENV, "off")
    build = _Build(_cases())
    case_cache.cached_cases("t", build)
    case_cache.cached_cases("t", build)
    assert build.calls == 2


def test_default_location(monkeypatch, tmp_path):
    monkeypatch.delenv(case_cache.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert case_cache.cache_dir() == tmp_path / "attnconf"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert case_cache.cache_dir() == type(tmp_path)(os.path.expanduser("~")) / ".cache" / "attnconf"


@pytest.mark.slow
def test_the_cached_covering_cases_are_a_fresh_build(monkeypatch):
    """The suites read the covering arrays through the cache: what they read equals a build with the cache off."""
    from conformance.cases import covering
    from conformance.suites.default import DEFAULT
    from conformance.suites.registry import COVERING_SEED, _union, covering_cases

    cached = covering_cases("default")
    fresh = covering.cover(covering.DEFAULT_STRENGTHS, _union(DEFAULT), seed=COVERING_SEED)
    assert [c.id for c in cached] == [c.id for c in fresh]
    assert cached == tuple(fresh)


def test_a_second_process_waits_for_the_first_ones_build(cache, tmp_path):
    """Two processes missing the same entry build it once: the second waits on the lock and reads the entry."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        f"""
        import sys, time
        from conformance.suites import cache as case_cache
        from conformance.cases.case import AttentionCase
        def build():
            open({str(tmp_path / "builds")!r}, "a").write("x")
            time.sleep(1.5)
            return [AttentionCase(num_heads=2, num_kv_heads=1, head_dim=16, requests=((1, 2),))]
        print(len(case_cache.cached_cases("raced", build)))
        """
    )
    env = {**os.environ, case_cache.CACHE_ENV: str(cache)}
    procs = [
        subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True) for _ in range(2)
    ]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert outs == ["1", "1"]
    assert (tmp_path / "builds").read_text() == "x"
