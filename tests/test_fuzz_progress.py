"""A long fuzz says how far it is while it runs (pytest_ptn.fuzzing.progress): one line per backend, summed
over its shares, at most every interval, never repeated; a short fuzz says nothing."""

from __future__ import annotations

from pathlib import Path

from pytest_ptn.fuzzing.progress import Board, Progress, write


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_line_per_backend_summed_over_shares_at_most_every_interval() -> None:
    said: list[str] = []
    clock = Clock()
    board = Board(said.append, interval=30.0, clock=clock)
    board.record(Progress("pte", "share1of2", 3, 200))
    clock.now = 10.0
    board.record(Progress("pte", "share2of2", 5, 200))
    assert said == []  # no line before the interval: a short fuzz says nothing
    clock.now = 31.0
    board.record(Progress("pte", "share1of2", 9, 200))
    board.record(Progress("native", "share1of1", 4, 400))
    assert said == ["ptn fuzz: pte: 14 of 400 programs judged, 2 shares"]
    clock.now = 62.0
    board.record(Progress("pte", "share1of2", 9, 200))
    assert said[1:] == ["ptn fuzz: native: 4 of 400 programs judged"]  # pte did not move: not repeated


def test_the_controller_reads_what_workers_write(tmp_path: Path) -> None:
    said: list[str] = []
    clock = Clock()
    board = Board(said.append, tmp_path, interval=30.0, clock=clock)
    write(tmp_path, Progress("ext:portable", "share1of2", 7, 50))
    write(tmp_path, Progress("ext:portable", "share2of2", 6, 50))
    (tmp_path / "torn.fuzz-progress").write_text('{"backend": "ext:portable", "sh')  # being replaced
    board.read()
    board.tell()
    clock.now = 30.0
    board.tell()
    assert said == ["ptn fuzz: ext:portable: 13 of 100 programs judged, 2 shares"]
