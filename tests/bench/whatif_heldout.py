"""Print issue 28's held-out table (docs/whatif-checked.md): each shipped 0.34 start-up predicted from other runs.

.venv/bin/python tests/bench/whatif_heldout.py            # the summary table, a one-line summary
.venv/bin/python tests/bench/whatif_heldout.py --full     # and every figure of every prediction
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from whatif_heldout_cases import CASES, check, markdown_table, summary_table  # noqa: E402


def main() -> int:
    checks = [check(*case) for case in CASES]
    print("\n".join(summary_table(checks)))
    if "--full" in sys.argv[1:]:
        print("\n" + "\n".join(markdown_table(checks)))
    figures = [f for c in checks for f in c.figures]
    missed = [f for f in figures if not f.ok]
    outcomes = sum(c.outcome_ok for c in checks)
    print(f"\n{len(checks)} predictions: {outcomes} outcomes right; {len(figures) - len(missed)} of {len(figures)} "
          f"figures within 2 % / 256 MiB; largest miss {max((abs(f.error) for f in missed), default=0) / (1 << 20):,.0f} MiB")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
