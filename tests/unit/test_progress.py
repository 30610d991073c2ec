"""Progress bars: silent on quick work and off a terminal, one line on stderr for slow work."""

from __future__ import annotations

import io

from memtrace import progress


def test_quick_task_off_a_terminal_prints_nothing():
    out = io.StringIO()
    assert list(progress.track([1, 2, 3], "Loading", stream=out)) == [1, 2, 3]
    assert out.getvalue() == ""


def test_slow_task_off_a_terminal_prints_one_line(monkeypatch):
    monkeypatch.setattr(progress, "PLAIN_AFTER_S", -1.0)
    out = io.StringIO()
    with progress.task("Writing x.json", total=2, stream=out) as t:
        t.advance()
        t.advance()
    assert t.completed == 2
    assert out.getvalue().startswith("memtrace: Writing x.json: done in ")
    assert len(out.getvalue().splitlines()) == 1


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_terminal_gets_a_rich_bar_unless_disabled(monkeypatch):
    out = _Tty()
    with progress.task("Loading run", total=3, stream=out) as t:
        t.advance(3)
    assert type(t).__name__ == "_RichTask"
    monkeypatch.setenv("MEMTRACE_PROGRESS", "off")
    with progress.task("Loading run", total=3, stream=_Tty()) as t:
        pass
    assert type(t).__name__ == "_Task"
