"""lab.core.cache, the one helper of the content-keyed caches: a sealed file is reused only under its key and while
its bytes are the ones sealed; a keyed log keeps its records only under its key, and a line cut short is dropped."""

import json

from lab.core import cache
from lab.core.io import atomic_write_json

KEY = {"model": "m", "n": 2, "infer": {"max_tokens": 8}}


def test_digest_ignores_key_order_and_entry_names_the_file(tmp_path):
    assert cache.digest({"a": 1, "b": 2}) == cache.digest({"b": 2, "a": 1}) != cache.digest({"a": 1, "b": 3})
    assert len(cache.digest(KEY, n=20)) == 20
    p = cache.entry(tmp_path, KEY, prefix="tokens_", suffix=".json")
    assert p.parent == tmp_path and p.name == f"tokens_{cache.digest(KEY)}.json"
    assert cache.seal_of(tmp_path / "x.csv") == tmp_path / "x.seal.json"


def test_a_sealed_file_is_reused_only_under_its_key_and_its_bytes(tmp_path, capsys):
    p = cache.entry(tmp_path, KEY)
    assert cache.load(p, KEY, "test") is None and capsys.readouterr().out == ""  # nothing there: no note
    atomic_write_json(p, {"tokens": [1, 2, 3]})
    assert cache.load(p, KEY, "test") is None  # written but never sealed: not trusted
    assert "test cache not reused" in capsys.readouterr().out
    cache.store(p, KEY)
    assert cache.load(p, KEY, "test") == p
    assert cache.load(p, {**KEY, "n": 3}, "test") is None  # another key
    assert "made with other settings" in capsys.readouterr().out
    p.write_text(json.dumps({"tokens": [1, 2]}))  # edited after sealing
    assert cache.load(p, KEY, "test") is None
    assert "changed since" in capsys.readouterr().out


def test_a_keyed_log_keeps_its_records_under_its_key_only(tmp_path, capsys):
    log = tmp_path / "samples.jsonl"
    assert cache.read_log(log, KEY, "drawn afresh") == ([], False)
    cache.write_log(log, KEY, [{"id": "a"}])
    cache.append_log(log, [{"id": "b"}, {"id": "c"}])
    assert cache.read_log(log, KEY, "drawn afresh") == ([{"id": "a"}, {"id": "b"}, {"id": "c"}], True)
    with open(log, "a") as f:
        f.write('{"id": "d", "cut sh')  # a kill mid-line
    assert cache.read_log(log, KEY, "drawn afresh") == ([{"id": "a"}, {"id": "b"}, {"id": "c"}], False)
    assert capsys.readouterr().out == ""
    assert cache.read_log(log, {**KEY, "model": "other"}, "drawn afresh") == ([], False)
    note = capsys.readouterr().out
    assert "made with other settings (model)" in note and "4 line(s) are not reused, drawn afresh" in note
