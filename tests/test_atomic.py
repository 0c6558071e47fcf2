"""Atomic writes (zoo.atomic) and the writers that use them: the target is whole or untouched."""

from __future__ import annotations

import json
import os
import stat

import pytest
import torch

from zoo.atomic import atomic_path, atomic_write, atomic_write_text
from zoo.data.corpus import write_tsv
from zoo.data.translation import Pairs
from zoo.train import MetricsLog, read_metrics, save_checkpoint


class Boom(RuntimeError):
    pass


class Unpicklable:
    def __reduce__(self):
        raise Boom("cannot be pickled")


def _only(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_atomic_write_replaces_the_file(tmp_path):
    path = tmp_path / "a.bin"
    with atomic_write(path) as f:
        f.write(b"one")
    with atomic_write(path) as f:
        f.write(b"two")
    assert path.read_bytes() == b"two" and _only(tmp_path) == ["a.bin"]
    assert atomic_write_text(tmp_path / "t.txt", "grüße\n") == tmp_path / "t.txt"
    assert (tmp_path / "t.txt").read_bytes() == "grüße\n".encode()


@pytest.mark.parametrize("existing", [True, False])
def test_a_failed_write_leaves_the_target_untouched_and_no_temporary_file(tmp_path, existing):
    path = tmp_path / "a.txt"
    if existing:
        path.write_text("old")
    with pytest.raises(Boom), atomic_write(path, "w") as f:
        f.write("half of the new")
        raise Boom
    assert (path.read_text() == "old") if existing else not path.exists()
    assert _only(tmp_path) == (["a.txt"] if existing else [])
    with pytest.raises(Boom), atomic_path(path) as tmp:  # a writer that takes a file name
        tmp.write_text("half")
        raise Boom
    assert _only(tmp_path) == (["a.txt"] if existing else [])


def test_permissions_are_those_of_an_ordinary_or_the_replaced_file(tmp_path):
    mask = os.umask(0o022)
    try:
        path = atomic_write_text(tmp_path / "new.txt", "x")
        assert stat.S_IMODE(path.stat().st_mode) == 0o644
        os.chmod(path, 0o600)
        atomic_write_text(path, "y")
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    finally:
        os.umask(mask)


def test_only_whole_file_modes(tmp_path):
    with pytest.raises(ValueError, match="mode 'wb' or 'w'"), atomic_write(tmp_path / "a", "a"):
        pass
    assert _only(tmp_path) == []


def test_a_checkpoint_that_fails_to_serialise_leaves_the_old_one(tmp_path):
    path = save_checkpoint(tmp_path / "ckpt.pt", model=torch.nn.Linear(2, 2), step=1)
    before = path.read_bytes()
    with pytest.raises(Boom):  # fails half-way through writing
        save_checkpoint(path, model=torch.nn.Linear(2, 2), step=2, state={"bad": Unpicklable()})
    assert path.read_bytes() == before and _only(tmp_path) == ["ckpt.pt"]


def test_metrics_resume_and_tsv_keep_their_formats(tmp_path):
    log = MetricsLog(tmp_path / "metrics.jsonl")
    for step in (1, 2, 3):
        log.write(step=step, loss=1.0 / step)
    MetricsLog(tmp_path / "metrics.jsonl", resume_step=2)
    assert (tmp_path / "metrics.jsonl").read_text() == "".join(
        json.dumps({"step": s, "split": "train", "loss": 1.0 / s}) + "\n" for s in (1, 2))
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2]
    write_tsv(Pairs(["a\tb", "c"], ["x\ny", "z"]), tmp_path / "pairs.tsv")
    assert (tmp_path / "pairs.tsv").read_text(encoding="utf-8") == "a b\tx y\nc\tz\n"
    assert _only(tmp_path) == ["metrics.jsonl", "pairs.tsv"]
