"""Reserved vocabulary entries shared by the data pipeline, the models and the search.

The first four lines of every vocabulary file are these tokens, in this order, so their ids are
fixed: ``<pad>`` = 0, ``<s>`` = 1 (begin of sentence), ``</s>`` = 2 (end of sentence),
``[UNK]`` = 3.  They match the peer benchmarks' conventions (``shared/bench/peers``).
"""

PAD_ID = 0
BOS_ID = 1
EOS_ID = 2
UNK_ID = 3

PAD_TOKEN = "<pad>"
BOS_TOKEN = "<s>"
EOS_TOKEN = "</s>"
UNK_TOKEN = "[UNK]"

RESERVED_TOKENS = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN)


def text_ids(ids, vocab_size: int) -> list:
    """The ids of one sentence that detokenisation turns into text, in plain Python (the rule
    of every detokenizer): ``<pad>`` and ``<s>`` dropped, nothing from the first ``</s>`` on,
    ids outside ``[0, vocab_size)`` read as ``[UNK]``."""
    kept = []
    for i in ids:
        i = int(i)
        if i == EOS_ID:
            break
        if i not in (PAD_ID, BOS_ID):
            kept.append(i if 0 <= i < vocab_size else UNK_ID)
    return kept
