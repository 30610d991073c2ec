"""What each output format says about itself: its name, file endings, whether it is binary, the commands offering
it, its options, and its renderer module.

Every format is one ``Format`` in ``plots.formats.FORMATS`` (the one tuple the CLI reads): its ``load`` imports its
renderer module by name in code (a reader and a file-based tool see the dependency), only when it renders, and
the module's ``render(run, out, **options)`` writes it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any


@dataclass(frozen=True)
class Format:
    """``name``: the render protocol's key; ``choice``: what ``-f`` accepts (default: ``name``); ``suffix``:
    the default output name's ending (None: a text stream); ``suffixes``: endings ``-o`` accepts; ``binary``:
    written as bytes (an image, a pickle) rather than text; ``load``: imports and returns the renderer module."""

    name: str
    suffix: str | None = None
    suffixes: tuple[str, ...] = ()
    commands: tuple[str, ...] = ()
    options: dict[str, Any] = field(default_factory=dict)
    choice: str | None = None
    binary: bool = False
    load: Callable[[], ModuleType] | None = field(default=None, compare=False, repr=False)

    @property
    def flag(self) -> str:
        return self.choice or self.name
