"""What each output format says about itself: its name, file endings, the commands offering it, its options.

Every format module (one per format, all in ``memtrace.plots``: the one folder for everything memtrace
writes) declares ``FORMATS = (Format(...), ...)`` beside its ``render(run, out, **options)``;
``plots.render`` lists the modules, and the CLI's ``-f`` choices and default suffixes come from there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Format:
    """``name``: the render protocol's key; ``choice``: what ``-f`` accepts (default: ``name``); ``suffix``:
    the default output name's ending (None: a text stream); ``suffixes``: endings ``-o`` accepts."""

    name: str
    suffix: str | None = None
    suffixes: tuple[str, ...] = ()
    commands: tuple[str, ...] = ()
    options: dict[str, Any] = field(default_factory=dict)
    choice: str | None = None

    @property
    def flag(self) -> str:
        return self.choice or self.name
