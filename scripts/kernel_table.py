#!/usr/bin/env python3
"""Write docs/convlab-api.md's table of registered kernels from their Impl records
(convlab.ops.dispatch.kernel_table), between its two marker lines. tests/test_dispatch.py checks
that the document holds exactly this table.

    python scripts/kernel_table.py
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from convlab.ops import dispatch  # noqa: E402

DOC = ROOT / "docs" / "convlab-api.md"


def main() -> int:
    text = DOC.read_text()
    begin, end = text.index(dispatch.KERNEL_TABLE_BEGIN), text.index(dispatch.KERNEL_TABLE_END)
    DOC.write_text(text[:begin] + dispatch.KERNEL_TABLE_BEGIN + "\n\n" + dispatch.kernel_table() + "\n\n"
                   + text[end:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
