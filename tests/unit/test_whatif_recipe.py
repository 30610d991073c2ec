"""The leases' H200 start-ups (docs/whatif-checked.md, "What is still to record"): the call still to run and the second
lease's call as it ran parse with tests/gpu/vllm034/startups.sh's own ``grid_runs`` into the start-ups the text
names (the second lease's all shipped, 10 with the first lease's; the next call's none yet, 14 with it), every flag
is one the what-if model reads, the rescue is what ``--suggest`` names, and the table of predictions is what the
model gives today.
"""

from __future__ import annotations

import re
from pathlib import Path

from memtrace.analysis.capacity import whatif as W
from whatif_heldout_cases import (
    CARD_BYTES,
    GRID,
    cli_flags,
    recipe_predictions,
    recipe_runs,
    script_flags,
    sites,
)

DOC = (Path(__file__).resolve().parents[2] / "docs" / "whatif-checked.md").read_text()
SECTION = DOC.split("## What is still to record", 1)[1]
NEXT, RAN = re.findall(r"```\n(.*?)```", SECTION, re.S)
COMMANDS = [RAN, NEXT]  # the second lease's call, then the one still to run
SMALL_FREE = 13_592_821_760


def test_the_commands_parse_with_the_script_into_ten_start_ups_or_more_the_small_card_first():
    assert len(COMMANDS) == 2 and all(len(c) < 2000 for c in COMMANDS)  # one device call each (2,000 characters)
    a, b = recipe_runs(COMMANDS[0]), recipe_runs(COMMANDS[1])
    assert [r[0] for r in a] == [
        "small-rescue-u0835", "small-rescue-p2048", "small-die-p16384", "g8192-s64-eager", "g4096-s8-eager"
    ]  # fmt: skip
    assert [r[0] for r in b] == ["g16384-s256-eager", "g4096-s64", "g16384-s8", "g2048-s256"]
    assert [r[3] for r in a] == [SMALL_FREE] * 3 + [None] * 2 and all(r[3] is None for r in b)
    assert {r[1] for r in a + b} == {"moe"}
    shipped = sorted(p.name for p in GRID.data.iterdir() if p.is_dir())
    first_lease = ["g03", "g07", "g08", "small-d16384", "small-r2048"]
    assert shipped == sorted(first_lease + [r[0] for r in a])  # what the second lease ran is shipped
    assert not {r[0] for r in b} & set(shipped)
    assert len(shipped) == 10 and len(shipped) + len(b) == 14


def test_every_flag_is_one_the_model_reads_and_the_scripts_flags_are_the_recorded_ones():
    base = script_flags()
    assert base == sites("moe-ext").flags == sites("g03").flags  # COMMON: 8192 / 8 / 32768 / fp8, vLLM's defaults
    for _name, _model, argv, _free in recipe_runs("\n".join(COMMANDS)):
        assert cli_flags(base, argv) != base  # each one changes something (an unknown flag raises)


def test_the_rescue_is_what_suggest_names_for_the_refused_start_up():
    """small-r2048 (g08's flags on the small card) was refused; --suggest's first answer is the first run."""
    s = W.suggest(sites("g08"), CARD_BYTES, others_bytes=CARD_BYTES - SMALL_FREE)
    name, _model, argv, free = recipe_runs(COMMANDS[0])[0]
    assert name == "small-rescue-u0835" and free == SMALL_FREE
    assert s.booting[0].flags == cli_flags(script_flags(), argv)
    assert s.booting[0].outcome.kv.available_bytes == 992_498_811 and "992,498,811 B" in SECTION
    assert "992,498,811 B" in DOC and "vLLM's available 992,496,927 B" in DOC  # and what vLLM then sized


def test_the_table_of_predictions_is_the_one_the_model_gives():
    rows = recipe_predictions("\n".join(COMMANDS))
    assert len(rows) == 9
    assert "\n".join(rows) in SECTION
    assert rows[0].startswith("| `small-rescue-u0835` | 13,592,821,760 B free |") and "boots: 1,893 blocks" in rows[0]
    assert "dies in determine_available_memory/profile_run" in rows[2]
