"""Split a launcher's combined output back into the lines each rank printed.

horovodrun --gloo tags a rank's output "[rank]<stdout>:", Open MPI's --tag-output
"[1,rank]<stdout>:". Open MPI tags each chunk it reads from a rank, not each line,
so one rank's line can be cut by another rank's tag and end in a later chunk:

    [1,0]<stdout>:A[1,1]<stdout>:B[1,0]<stdout>:
    [1,1]<stdout>:

holds the lines "A" (rank 0) and "B" (rank 1). Reading the raw lines instead
loses or garbles both, which is how a run that trained correctly once failed its
test (rank 0's start line looked absent).

Shared by the worker (its trainers' per-rank summaries, the tests) and the
SDK's `hvjob logs --rank` (which follows a live log: `RankSplitter` takes the
output in pieces).
"""

import re
from typing import Final

RANK_TAG: Final = re.compile(r"\[(?:\d+,)?(?P<rank>\d+)\]<(?P<stream>stdout|stderr)>:")
_TAG_OR_NEWLINE: Final = re.compile(RANK_TAG.pattern + r"|\n")
# "[<world>,<rank>]<stderr>:" with generous room for the numbers.
_LONGEST_TAG: Final = 40

Owner = tuple[int, str] | None


class RankSplitter:
    """split_by_rank for output that arrives in pieces (a followed log): `feed`
    returns the lines completed so far, `flush` the unfinished rest at the end."""

    def __init__(self) -> None:
        self._partial: dict[Owner, str] = {}
        self._owner: Owner = None
        self._pending = ""

    def feed(self, text: str) -> list[tuple[int | None, str]]:
        # A tag cut between two pieces must not be read as text: hold back a tail
        # that could still become one.
        text = self._pending + text
        cut = text.rfind("[")
        if (
            cut >= 0
            and len(text) - cut < _LONGEST_TAG
            and "\n" not in text[cut:]
            and not RANK_TAG.search(text[cut:])
        ):
            text, self._pending = text[:cut], text[cut:]
        else:
            self._pending = ""
        lines: list[tuple[int | None, str]] = []
        at = 0
        for match in _TAG_OR_NEWLINE.finditer(text):
            owner = self._owner
            self._partial[owner] = self._partial.get(owner, "") + text[at : match.start()]
            is_newline = match.group() == "\n"
            if is_newline or owner is None:
                # A newline ends the owner's line; a tag ends untagged text before it.
                line = self._partial.pop(owner, "")
                if is_newline or line:
                    lines.append((owner[0] if owner else None, line))
            self._owner = None if is_newline else (int(match["rank"]), match["stream"])
            at = match.end()
        self._partial[self._owner] = self._partial.get(self._owner, "") + text[at:]
        return lines

    def flush(self) -> list[tuple[int | None, str]]:
        if self._pending:
            self._partial[self._owner] = self._partial.get(self._owner, "") + self._pending
            self._pending = ""
        rest = [(key[0] if key else None, text) for key, text in self._partial.items() if text]
        self._partial.clear()
        return rest


def split_by_rank(output: str) -> list[tuple[int | None, str]]:
    """(rank, line) for every line in the output, in the order the lines ended.

    A rank's lines are rebuilt per rank and stream from its tagged chunks. Text
    that no tag owns (the launcher's own messages, untagged streams) comes back
    with rank None, one line per run of such text.
    """
    splitter = RankSplitter()
    return splitter.feed(output) + splitter.flush()


def rank_lines(output: str, rank: int) -> list[str]:
    return [line for owner, line in split_by_rank(output) if owner == rank]
