"""The rank splitter fed in pieces (a followed log) gives what it gives at once."""

from __future__ import annotations

from horovod_contract.rank_output import RankSplitter, split_by_rank

OUTPUT = (
    "launcher says hi\n"
    "[1,0]<stdout>:A[1,1]<stdout>:B[1,0]<stdout>:\n"
    "[1,1]<stdout>:\n"
    "[0]<stderr>:gloo [tag-like] text\n"
    "[1,1]<stdout>:last without newline"
)


def test_every_two_piece_cut_splits_like_the_whole() -> None:
    whole = split_by_rank(OUTPUT)
    assert (0, "A") in whole and (1, "B") in whole and (0, "gloo [tag-like] text") in whole
    for cut in range(len(OUTPUT) + 1):
        splitter = RankSplitter()
        pieces = splitter.feed(OUTPUT[:cut]) + splitter.feed(OUTPUT[cut:]) + splitter.flush()
        assert pieces == whole, cut


def test_one_character_at_a_time() -> None:
    splitter = RankSplitter()
    lines = []
    for ch in OUTPUT:
        lines += splitter.feed(ch)
    assert lines + splitter.flush() == split_by_rank(OUTPUT)
