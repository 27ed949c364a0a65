"""docs/design.md §3b has one row per ledger entry, and its column for a job that does not ask says "nothing"."""

import re
from pathlib import Path

from stapo_verl.integration.verl_0_9_1.opt_in_ledger import all_patches

DESIGN = Path(__file__).resolve().parents[3] / "docs" / "design.md"


def _rows() -> dict[str, tuple[str, str]]:
    text = DESIGN.read_text(encoding="utf-8")
    section = text[text.index("## 3b."):text.index("## 4.")]
    rows = {}
    for line in section.splitlines():
        m = re.match(r"\| `([\w.]+)` \| (.+?) \| (.+?) \|$", line)
        if m:
            rows[m.group(1)] = (m.group(2), m.group(3))
    return rows


def test_pass_through_table_has_a_row_per_ledger_entry_saying_nothing():
    rows = _rows()
    assert list(rows) == [p.symbol for p in all_patches()]
    assert all(not_asking.startswith("nothing") for _, not_asking in rows.values())
