"""Corpus scores of translations (sacreBLEU) and checkpoint-window statistics (no TensorFlow):
the one place that scores translations (``deep-nmt-evaluate``, dev BLEU during training, the
experiment suite's tables).

Three scores, each with its sacreBLEU signature (the reproducibility string of Post 2018):

* ``bleu``: sacreBLEU BLEU on detokenised text, default 13a tokenisation, case-sensitive;
* ``bleu_lc``: the same BLEU on lowercased text (``lowercase=True``), the figure that papers
  scoring lowercased text report (Multi30k, ``docs/RESULTS.md``);
* ``chrf``: sacreBLEU chrF2 (character 6-grams, beta 2);
* ``tok_bleu``: the papers' "tokenized BLEU" (Vaswani et al. 2017; Chen et al. 2018 report
  ``multi-bleu.perl`` on Moses-tokenised text).  Computed here as sacreBLEU BLEU with
  ``tokenize='intl'``: Unicode-aware splitting of punctuation and symbols from words (except
  inside numbers), the sacreBLEU tokeniser closest to Moses' ``tokenizer.perl`` followed by
  ``multi-bleu.perl``.  It is usually higher than ``bleu`` and is not comparable across
  papers; report ``bleu`` with its signature as the primary number;
* ``bleu_tok_lc`` (:func:`moses_lowercased_bleu`, optional, needs ``sacremoses``): BLEU on
  lowercased, Moses-tokenised text, the way papers score the official tokenised Multi30k
  (fairseq's scorer on ``*.lc.norm.tok`` files, e.g. Wu et al. 2021's 41.02): both sides
  lowercased and tokenised with ``sacremoses.MosesTokenizer(target language)`` with
  aggressive hyphen splitting (``T-Shirt`` -> ``t @-@ shirt``) and no escaping, then BLEU on
  those tokens (sacreBLEU ``tokenize='none'``).

:func:`checkpoint_window` picks the window of checkpoints over which test BLEU is averaged:
the ``size`` consecutive checkpoints centred on the one with the best dev BLEU (shifted inwards
at the ends of the run), as in Chen et al. (2018), who average over 21 checkpoints.
"""

from __future__ import annotations

import math
from typing import Dict, Sequence, Tuple

__all__ = ["TOKENIZED_BLEU_TOKENIZE", "corpus_bleu", "corpus_scores", "table_scores",
           "moses_lowercased_bleu", "MosesMissing", "checkpoint_window", "mean_std"]

TOKENIZED_BLEU_TOKENIZE = "intl"


def _check_pairs(hypotheses: Sequence[str], references: Sequence[str]):
    hypotheses, references = list(hypotheses), list(references)
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    return hypotheses, references


def corpus_bleu(hypotheses: Sequence[str], references: Sequence[str],
                lowercase: bool = False) -> float:
    """sacreBLEU BLEU alone (13a, one reference; case-insensitive with ``lowercase``, for a
    model trained on lowercased text): the dev BLEU of training, cheaper than
    :func:`corpus_scores`."""
    from sacrebleu.metrics import BLEU

    hypotheses, references = _check_pairs(hypotheses, references)
    return float(BLEU(lowercase=lowercase).corpus_score(hypotheses, [references]).score)


def corpus_scores(hypotheses: Sequence[str], references: Sequence[str],
                  tokenized_bleu_tokenize: str = TOKENIZED_BLEU_TOKENIZE,
                  lowercase: bool = False) -> Dict[str, object]:
    """sacreBLEU BLEU, chrF and tokenized BLEU of one system against one reference.

    Args:
      hypotheses: detokenised system output, one per segment.
      references: the reference translations (same length).
      tokenized_bleu_tokenize: sacreBLEU tokeniser of the tokenized BLEU (``intl``; ``13a``
        or ``none`` for text that is already tokenised).
      lowercase: case-insensitive scores (the signatures say ``case:lc``), for a model trained
        on lowercased text (``data.lowercase``).

    Returns:
      dict with floats ``bleu``, ``bleu_lc``, ``chrf``, ``tok_bleu``, their signature strings
      (``bleu_signature`` ...), full score lines (``bleu_line`` ...: ``BLEU = 27.3
      58.1/33.0/... (BP = ...)``) and ``brevity_penalty`` (of ``bleu``).

    Raises:
      ValueError: different numbers of hypotheses and references.
    """
    from sacrebleu.metrics import BLEU, CHRF

    hypotheses, references = _check_pairs(hypotheses, references)
    out: Dict[str, object] = {}
    for key, metric in (("bleu", BLEU(lowercase=lowercase)), ("bleu_lc", BLEU(lowercase=True)),
                        ("chrf", CHRF(lowercase=lowercase)),
                        ("tok_bleu", BLEU(tokenize=tokenized_bleu_tokenize,
                                          lowercase=lowercase))):
        result = metric.corpus_score(hypotheses, [references])
        out[key] = float(result.score)
        out[f"{key}_signature"] = str(metric.get_signature())
        out[f"{key}_line"] = str(result)
        if key == "bleu":
            out["brevity_penalty"] = float(result.bp)
    return out


def table_scores(hypotheses: Sequence[str], references: Sequence[str]) -> Dict[str, object]:
    """``bleu`` (cased), ``bleu_lc`` (lowercased) and ``chrf`` of :func:`corpus_scores`
    rounded to 2 decimals for a results table, the brevity penalty (4 decimals) and the three
    signatures (the experiment suite's ``results.json``)."""
    scores = corpus_scores(hypotheses, references)
    out: Dict[str, object] = {key: round(scores[key], 2) for key in ("bleu", "bleu_lc", "chrf")}
    out["brevity_penalty"] = round(scores["brevity_penalty"], 4)
    out.update({f"{key}_signature": scores[f"{key}_signature"]
                for key in ("bleu", "bleu_lc", "chrf")})
    return out


class MosesMissing(ImportError):
    """``bleu_tok_lc`` was asked for and ``sacremoses`` is not installed."""


def _moses_tokenizer(language: str):
    try:
        from sacremoses import MosesTokenizer
    except ImportError as e:
        raise MosesMissing(
            "the tokenised lowercased BLEU (bleu_tok_lc) needs the sacremoses package: "
            "pip install 'deep_nmt_tf[scoring]' (or sacremoses)") from e
    return MosesTokenizer(lang=language)


def moses_lowercased_bleu(hypotheses: Sequence[str], references: Sequence[str],
                          language: str) -> Dict[str, object]:
    """BLEU on lowercased, Moses-tokenised text (``bleu_tok_lc``, module docstring).

    Args:
      hypotheses: detokenised system output, one per segment.
      references: the reference translations, detokenised (same length).
      language: the target language's code for the Moses tokeniser (``de``).

    Returns:
      ``{"bleu_tok_lc": float rounded to 2 decimals, "bleu_tok_lc_signature": str}``; the
      signature is sacreBLEU's (``tok:none``, the text tokenised before) with the Moses
      tokeniser and its version prepended.

    Raises:
      MosesMissing: ``sacremoses`` is not installed.
      ValueError: different numbers of hypotheses and references.
    """
    from sacrebleu.metrics import BLEU

    hypotheses, references = _check_pairs(hypotheses, references)
    tokenizer = _moses_tokenizer(language)  # MosesMissing without sacremoses
    import sacremoses  # installed: the tokeniser above imported it

    def tokenize(lines):
        return [tokenizer.tokenize(line.lower(), aggressive_dash_splits=True, escape=False,
                                   return_str=True) for line in lines]

    metric = BLEU(tokenize="none", lowercase=True, force=True)  # force: tokenised on purpose
    score = metric.corpus_score(tokenize(hypotheses), [tokenize(references)])
    return {"bleu_tok_lc": round(float(score.score), 2),
            "bleu_tok_lc_signature": f"moses:{language}+lc+aggressive-dash|sacremoses:"
                                     f"{getattr(sacremoses, '__version__', '?')}|"
                                     f"{metric.get_signature()}"}


def checkpoint_window(dev_scores: Sequence[float], size: int) -> Tuple[int, int, int]:
    """The window of ``size`` consecutive checkpoints centred on the best dev score.

    Args:
      dev_scores: one score per checkpoint, in training order (higher is better).
      size: window length (e.g. 21); clipped to ``len(dev_scores)``.

    Returns:
      ``(start, stop, best)``: the window is ``dev_scores[start:stop]``; ``best`` is the index
      of the best dev score (the first one on ties).
    """
    n = len(dev_scores)
    if n == 0:
        raise ValueError("no checkpoints")
    size = max(1, min(int(size), n))
    best = max(range(n), key=lambda i: (dev_scores[i], -i))
    start = best - (size - 1) // 2
    start = max(0, min(start, n - size))
    return start, start + size, best


def mean_std(values: Sequence[float]) -> Tuple[float, float]:
    """Mean and sample standard deviation (``ddof=1``; 0 for a single value)."""
    values = [float(v) for v in values]
    if not values:
        raise ValueError("no values")
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, 0.0
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return mean, math.sqrt(var)
