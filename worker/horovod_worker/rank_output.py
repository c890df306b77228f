"""Split a launcher's combined output back into the lines each rank printed.

horovodrun --gloo tags a rank's output "[rank]<stdout>:", Open MPI's --tag-output
"[1,rank]<stdout>:". Open MPI tags each chunk it reads from a rank, not each line,
so one rank's line can be cut by another rank's tag and end in a later chunk:

    [1,0]<stdout>:A[1,1]<stdout>:B[1,0]<stdout>:
    [1,1]<stdout>:

holds the lines "A" (rank 0) and "B" (rank 1). Reading the raw lines instead
loses or garbles both, which is how a run that trained correctly once failed its
test (rank 0's start line looked absent).
"""

import re
from typing import Final

RANK_TAG: Final = re.compile(r"\[(?:\d+,)?(?P<rank>\d+)\]<(?P<stream>stdout|stderr)>:")
_TAG_OR_NEWLINE: Final = re.compile(RANK_TAG.pattern + r"|\n")

Owner = tuple[int, str] | None


def split_by_rank(output: str) -> list[tuple[int | None, str]]:
    """(rank, line) for every line in the output, in the order the lines ended.

    A rank's lines are rebuilt per rank and stream from its tagged chunks. Text
    that no tag owns (the launcher's own messages, untagged streams) comes back
    with rank None, one line per run of such text.
    """
    lines: list[tuple[int | None, str]] = []
    partial: dict[Owner, str] = {}
    owner: Owner = None
    at = 0
    for match in _TAG_OR_NEWLINE.finditer(output):
        partial[owner] = partial.get(owner, "") + output[at : match.start()]
        is_newline = match.group() == "\n"
        if is_newline or owner is None:
            # A newline ends the owner's line; a tag ends untagged text before it.
            text = partial.pop(owner, "")
            if is_newline or text:
                lines.append((owner[0] if owner else None, text))
        owner = None if is_newline else (int(match["rank"]), match["stream"])
        at = match.end()
    partial[owner] = partial.get(owner, "") + output[at:]
    lines.extend((key[0] if key else None, text) for key, text in partial.items() if text)
    return lines


def rank_lines(output: str, rank: int) -> list[str]:
    return [line for owner, line in split_by_rank(output) if owner == rank]
