"""Summarize a py-spy collapsed-stack profile (`--format raw`): top functions, self and total.

python -m bench.profile .work/cluster-bench-logs/<namespace>.pyspy.txt [--top 25]
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from collections.abc import Iterable

_LINE = re.compile(r"^(.*) (\d+)$")


def _frame(frame: str) -> str:
    """`func (path/to/file.py:123)` -> `func (file.py)`: one row per function, not per line."""
    name, _, where = frame.partition(" (")
    path = where.rsplit(":", 1)[0].rstrip(")")
    parts = path.split("/")
    short = "/".join(parts[-2:]) if len(parts) > 1 else path
    return f"{name} ({short})"


def summarize(lines: Iterable[str]) -> tuple[int, Counter[str], Counter[str]]:
    """(samples, self samples by function, inclusive samples by function)."""
    total = 0
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    for line in lines:
        m = _LINE.match(line.strip())
        if not m:
            continue
        frames = [_frame(f) for f in m.group(1).split(";") if f]
        count = int(m.group(2))
        total += count
        if frames:
            own[frames[-1]] += count
        for f in set(frames):
            inclusive[f] += count
    return total, own, inclusive


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("profile")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    with open(args.profile) as f:
        total, own, inclusive = summarize(f)
    print(f"{total} samples")
    for title, counter in (("total (inclusive)", inclusive), ("self", own)):
        print(f"\n-- {title}")
        for name, n in counter.most_common(args.top):
            print(f"{100 * n / max(total, 1):5.1f}%  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
