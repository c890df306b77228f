"""What rank 0's log says about the training: pure parsing, no I/O (progress.py reads).

The lines that matter, wherever they sit in a line (horovodrun prefixes rank tags,
the kubelet a timestamp):
- `HVJOB_RANK rank=R size=N ... hostname=H`: each rank's start (the built-in
  trainers; any script may print it): the world's size and where each rank runs;
- `HVJOB_PROGRESS {json}`: rank 0's progress record (horovod_contract.progress);
- `HVJOB_WAITING {json}`: a rank alive but blocked (horovod_contract.progress);
- Horovod's stall inspector: "Missing ranks:" and one `R: [tensor, ...]` line per
  rank that did not submit a tensor the others wait for.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Final

import horovod_contract as contract
from horovod_contract.progress import progress_in_line, waiting_rank_in_line

# What `timestamps=true` puts first on each line: RFC 3339, fraction optional.
_STAMP: Final = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?Z ")
# The host stops where a name's characters do, and is looked for only before the next
# start line: one rank's line can run into another's (read below).
_PREFIX: Final = re.escape(contract.RANK_PREFIX)
_RANK_LINE: Final = re.compile(
    rf"{_PREFIX} rank=(\d+) size=(\d+)(?:\s(?:(?!{_PREFIX}).)*?hostname=([A-Za-z0-9._-]+))?"
)
_MISSING: Final = "Missing ranks:"
_MISSING_RANK: Final = re.compile(r"(?:^|[>:\]\s])(\d+)!?: \[")


def stamp_key(stamp: str) -> str:
    """A key that sorts as the time does: the kubelet trims trailing zeros of the
    fraction, so "…27.1Z" and "…27.12Z" do not compare as strings."""
    match = _STAMP.match(stamp + " ")
    if match is None:
        return stamp
    return f"{match.group(1)}.{(match.group(2) or '').ljust(9, '0')[:9]}"


@dataclass
class Reading:
    """What one chunk of log said (lines after `after` only)."""

    records: list[tuple[str | None, dict[str, Any]]] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)  # every size reported, in order
    hosts: dict[int, str] = field(default_factory=dict)  # rank -> its hostname
    waiting: list[tuple[str | None, int]] = field(default_factory=list)  # (time, rank)
    missing: list[int] | None = None  # the latest stall report's ranks
    missing_stamp: str | None = None
    last_stamp: str | None = None  # the newest timestamp read (RFC 3339, as sent)
    rank0_stamp: str | None = None  # rank 0's start line, when in this chunk
    rank0_seen: bool = False


def read(log: str, after: str | None = None) -> Reading:
    """Parse `log` (timestamps=true). Lines stamped at or before `after` (a previous
    reading's last_stamp: sinceTime has only whole seconds) are skipped."""
    out = Reading()
    floor = stamp_key(after) if after else None
    in_report = False
    for raw in log.splitlines():
        match = _STAMP.match(raw)
        stamp = None
        if match is not None:
            stamp = raw[: match.end() - 1]
            if floor is not None and stamp_key(stamp) <= floor:
                continue
            out.last_stamp = stamp
            line = raw[match.end() :]
        else:
            line = raw
        if in_report:
            ranks = _MISSING_RANK.search(line)
            if ranks is not None and out.missing is not None:
                out.missing.append(int(ranks.group(1)))
                continue
            in_report = False
        if _MISSING in line:
            in_report = True
            out.missing, out.missing_stamp = [], stamp
            continue
        waiting = waiting_rank_in_line(line)
        if waiting is not None:
            out.waiting.append((stamp, waiting))
            continue
        record = progress_in_line(line)
        if record is not None:
            out.records.append((stamp, record))
            if isinstance(record.get("size"), int):
                out.sizes.append(record["size"])
            continue
        # Every start line in it: mpirun's tagged output can put one rank's after
        # another's unended one ("[1,1]<stdout>:HVJOB_RANK rank=1 ... device=cpu[1,0]
        # <stdout>:HVJOB_RANK rank=0 ...", kind CI of 2026-12-06, where rank 0's
        # first step went unseen).
        for rank in _RANK_LINE.finditer(line):
            number, size = int(rank.group(1)), int(rank.group(2))
            out.sizes.append(size)
            if rank.group(3):
                out.hosts[number] = rank.group(3)
            if number == 0 and not out.rank0_seen:
                out.rank0_seen, out.rank0_stamp = True, stamp
    return out
