"""A deterministic toy language pair that needs real translation (not copying).

The source language ("Sl") and the target language ("Tl") share no words: every content word
goes through a fixed bilingual lexicon, and the target grammar differs from the source grammar
in ways a model has to learn:

* **Lexicon.**  About 300 source words.  Some translate to two target words (a few adverbs; verbs
  with a *separable particle* that moves to the end of a main clause), some target nouns are
  compounds of two target stems (so WordPiece splits them into subwords).
* **Local reordering.**  Adjectives follow the noun in Tl, in mirrored order; prepositions
  become postpositions; the negation moves behind the verb.
* **Long-distance reordering.**  A subordinate clause (``, sa ...``) is verb-final in Tl, where a
  separable particle is prefixed to the verb instead of ending the clause.
* **Agreement.**  Tl determiners and adjective endings agree with the noun's gender (m/f/n, a
  property of the target noun that is not visible in the source) and number; verb endings agree
  with the number of the subject (a coordinated subject is plural) and carry the tense, which
  the source marks with a separate auxiliary.

The language (lexicon and grammar) is fixed; ``seed`` only selects the sentences, so corpora
generated with different seeds are samples of the same language.  Sentences have 3 to 20 source
words, start with a capital letter and carry attached punctuation (``Ta kosa ..., sa ... zabro.``).

Example (plural subject and determiner, verb ``xe`` + plural ending ``en`` with its particle
``thei`` at the end, adjectives after the noun)::

    >>> from deep_nmt_tf.data.synthetic import generate_pairs
    >>> generate_pairs(6, seed=0)[5]
    ('Ta trotus brimado ta kakiza skika gopugo.', \
'Dhyn yaewaeqeae xeen dhae qethedhytheqou yeaes sheyeaes thei.')
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
from typing import Dict, Iterator, List, Optional, Sequence, Set, Tuple

__all__ = [
    "GENERATOR_VERSION",
    "MIN_WORDS",
    "MAX_WORDS",
    "generate_pairs",
    "iter_pairs",
    "write_corpus",
    "copy_baseline_bleu",
]

# Bump whenever the language or the sampling changes: it is part of the corpus manifest, so an
# old corpus on disk is regenerated instead of silently reused.
GENERATOR_VERSION = 1
MIN_WORDS = 3
MAX_WORDS = 20
_LEXICON_SEED = "deep_nmt_tf.synthetic.lexicon.v1"
_MANIFEST = "manifest.json"
_SPLITS = ("train", "dev", "test")

# ---------------------------------------------------------------------------------------------
# Lexicon
# ---------------------------------------------------------------------------------------------

# Disjoint phonotactics: source syllables are onset + one of a/i/o/u; target syllables use other
# onsets and vowels, so no target word can equal a source word.
_SRC_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "gl",
               "sk", "tr")
_SRC_VOWELS = ("a", "i", "o", "u")
_TGT_ONSETS = ("ch", "sh", "th", "w", "y", "h", "j", "x", "q", "dh", "ph", "zh")
_TGT_VOWELS = ("e", "ae", "ei", "y", "ou", "ea")

# Source function words.
_SRC_DEF, _SRC_INDEF = "ta", "mi"
_SRC_PAST, _SRC_NEG, _SRC_THAT, _SRC_AND = "ko", "nu", "sa", "ub"
_SRC_PLURAL = "s"

# Target function words and inflections.
_TGT_DET = {  # (definite, gender, number) -> determiner; indefinite plural has none.
    (True, "m", "sg"): "dhe", (True, "f", "sg"): "dhey", (True, "n", "sg"): "dhae",
    (True, "m", "pl"): "dhyn", (True, "f", "pl"): "dhyn", (True, "n", "pl"): "dhyn",
    (False, "m", "sg"): "wen", (False, "f", "sg"): "wene", (False, "n", "sg"): "wes",
}
_TGT_NOUN_PLURAL = {"m": "yn", "f": "eth", "n": "e"}
_TGT_ADJ_ENDING = {("m", "sg"): "er", ("f", "sg"): "e", ("n", "sg"): "es", ("m", "pl"): "en",
                   ("f", "pl"): "en", ("n", "pl"): "en"}
_TGT_VERB_ENDING = {("present", "sg"): "eth", ("present", "pl"): "en",
                    ("past", "sg"): "ede", ("past", "pl"): "eden"}
_TGT_NEG, _TGT_THAT, _TGT_AND = "nei", "ke", "yth"
_TGT_COMPOUND_HEADS = ("haew", "shyx", "theqou", "jeph")


@dataclasses.dataclass(frozen=True)
class _Noun:
    src: str
    tgt: str
    gender: str


@dataclasses.dataclass(frozen=True)
class _Verb:
    src: str
    tgt: str
    transitive: bool
    particle: str  # "" or a separable particle (main clause: clause-final; sub clause: prefix)


@dataclasses.dataclass(frozen=True)
class _Lexicon:
    nouns: Tuple[_Noun, ...]
    adjectives: Tuple[Tuple[str, str], ...]
    verbs: Tuple[_Verb, ...]
    adverbs: Tuple[Tuple[str, str], ...]  # target may be two words
    prepositions: Tuple[Tuple[str, str], ...]


class _WordMaker:
    """Unique pseudo-words from a syllable inventory."""

    def __init__(self, rng: random.Random, onsets, vowels, taken: Set[str]):
        self._rng, self._onsets, self._vowels, self._taken = rng, onsets, vowels, taken

    def make(self, min_syllables: int, max_syllables: int) -> str:
        while True:
            n = self._rng.randint(min_syllables, max_syllables)
            word = "".join(self._rng.choice(self._onsets) + self._rng.choice(self._vowels)
                           for _ in range(n))
            if word not in self._taken:
                self._taken.add(word)
                return word


def _build_lexicon() -> _Lexicon:
    rng = random.Random(_LEXICON_SEED)
    src_taken = {_SRC_DEF, _SRC_INDEF, _SRC_PAST, _SRC_NEG, _SRC_THAT, _SRC_AND}
    tgt_taken = set(_TGT_DET.values()) | {_TGT_NEG, _TGT_THAT, _TGT_AND} | set(_TGT_COMPOUND_HEADS)
    src = _WordMaker(rng, _SRC_ONSETS, _SRC_VOWELS, src_taken)
    tgt = _WordMaker(rng, _TGT_ONSETS, _TGT_VOWELS, tgt_taken)

    nouns = []
    for _ in range(140):
        stem = tgt.make(2, 3)
        if rng.random() < 0.15:  # Compound: two target stems in one word.
            stem += rng.choice(_TGT_COMPOUND_HEADS)
        nouns.append(_Noun(src.make(2, 3), stem, rng.choice("mfn")))
    adjectives = [(src.make(2, 3), tgt.make(1, 2)) for _ in range(50)]
    verbs = []
    for i in range(75):
        particle = tgt.make(1, 1) if rng.random() < 0.25 else ""
        verbs.append(_Verb(src.make(2, 3), tgt.make(1, 2), transitive=i < 50, particle=particle))
    adverbs = []
    for _ in range(16):
        words = [tgt.make(1, 2) for _ in range(2 if rng.random() < 0.3 else 1)]
        adverbs.append((src.make(2, 3), " ".join(words)))
    prepositions = [(src.make(1, 2), tgt.make(1, 2)) for _ in range(8)]
    lexicon = _Lexicon(tuple(nouns), tuple(adjectives), tuple(verbs), tuple(adverbs),
                       tuple(prepositions))
    assert not (src_taken & tgt_taken), "source and target words must be disjoint"
    return lexicon


_LEXICON = _build_lexicon()


# ---------------------------------------------------------------------------------------------
# Grammar
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Phrase:
    """A constituent in both languages plus the features agreement needs."""
    src: List[str]
    tgt: List[str]
    number: str = "sg"


def _noun_phrase(rng: random.Random, allow_pp: bool, allow_coordination: bool) -> _Phrase:
    if allow_coordination and rng.random() < 0.12:
        left = _noun_phrase(rng, allow_pp=False, allow_coordination=False)
        right = _noun_phrase(rng, allow_pp=False, allow_coordination=False)
        return _Phrase(left.src + [_SRC_AND] + right.src, left.tgt + [_TGT_AND] + right.tgt, "pl")
    noun = rng.choice(_LEXICON.nouns)
    number = "pl" if rng.random() < 0.35 else "sg"
    definite = rng.random() < 0.6
    adjectives = rng.sample(_LEXICON.adjectives, k=rng.choice((0, 0, 1, 1, 2)))

    src = [_SRC_DEF if definite else _SRC_INDEF] if (definite or number == "sg") else []
    src += [a for a, _ in adjectives]
    src.append(noun.src + (_SRC_PLURAL if number == "pl" else ""))

    det = _TGT_DET.get((definite, noun.gender, number))
    tgt = [det] if det else []
    tgt.append(noun.tgt + (_TGT_NOUN_PLURAL[noun.gender] if number == "pl" else ""))
    ending = _TGT_ADJ_ENDING[(noun.gender, number)]
    tgt += [t + ending for _, t in reversed(adjectives)]  # N A2 A1: mirrored, after the noun.

    phrase = _Phrase(src, tgt, number)
    if allow_pp and rng.random() < 0.15:
        pp = _prepositional_phrase(rng)
        phrase.src += pp.src
        phrase.tgt += pp.tgt
    return phrase


def _prepositional_phrase(rng: random.Random) -> _Phrase:
    prep_src, prep_tgt = rng.choice(_LEXICON.prepositions)
    np = _noun_phrase(rng, allow_pp=False, allow_coordination=False)
    return _Phrase([prep_src] + np.src, np.tgt + [prep_tgt])  # Target: postposition.


def _clause(rng: random.Random, subordinate: bool) -> _Phrase:
    """Subject, verb, object, optional PP/adverb; target verb-final when subordinate."""
    subject = _noun_phrase(rng, allow_pp=True, allow_coordination=True)
    verb = rng.choice(_LEXICON.verbs)
    tense = "past" if rng.random() < 0.4 else "present"
    negated = rng.random() < 0.2
    obj = _noun_phrase(rng, allow_pp=not subordinate, allow_coordination=False) \
        if verb.transitive else None
    pp = _prepositional_phrase(rng) if rng.random() < 0.3 else None
    adverb = rng.choice(_LEXICON.adverbs) if rng.random() < 0.3 else None

    src = list(subject.src)
    src += [_SRC_PAST] if tense == "past" else []
    src += [_SRC_NEG] if negated else []
    src.append(verb.src)
    for extra in (obj, pp):
        src += extra.src if extra else []
    src += [adverb[0]] if adverb else []

    verb_form = verb.tgt + _TGT_VERB_ENDING[(tense, subject.number)]
    rest = []
    for extra in (obj, pp):
        rest += extra.tgt if extra else []
    rest += adverb[1].split() if adverb else []
    if subordinate:  # S O PP ADV [NEG] PARTICLE+V
        tgt = subject.tgt + rest + ([_TGT_NEG] if negated else []) + [verb.particle + verb_form]
    else:  # S V [NEG] O PP ADV [PARTICLE]
        tgt = subject.tgt + [verb_form] + ([_TGT_NEG] if negated else []) + rest
        tgt += [verb.particle] if verb.particle else []
    return _Phrase(src, tgt)


def _capitalize(words: List[str]) -> str:
    text = " ".join(words)
    return text[:1].upper() + text[1:]


def _sentence(rng: random.Random) -> Tuple[str, str]:
    main = _clause(rng, subordinate=False)
    src, tgt = main.src, main.tgt
    if rng.random() < 0.3:
        sub = _clause(rng, subordinate=True)
        src = src[:-1] + [src[-1] + ",", _SRC_THAT] + sub.src
        tgt = tgt[:-1] + [tgt[-1] + ",", _TGT_THAT] + sub.tgt
    src[-1] += "."
    tgt[-1] += "."
    return _capitalize(src), _capitalize(tgt)


def iter_pairs(seed: int) -> Iterator[Tuple[str, str]]:
    """Endless stream of (source, target) sentence pairs.

    Args:
      seed: any int; the same seed always gives the same stream (on every platform and Python
        version >= 3.2, since only ``random.Random`` with a string seed is used).

    Yields:
      (source, target) strings with 3 to 20 source words.
    """
    return _stream(f"deep_nmt_tf.synthetic.sentences:{seed}")


def _stream(key: str) -> Iterator[Tuple[str, str]]:
    rng = random.Random(key)
    while True:
        src, tgt = _sentence(rng)
        if MIN_WORDS <= len(src.split()) <= MAX_WORDS:
            yield src, tgt


def generate_pairs(n: int, seed: int) -> List[Tuple[str, str]]:
    """The first ``n`` pairs of :func:`iter_pairs` (deterministic given ``seed``).

    Args:
      n: number of pairs (>= 0).
      seed: stream seed.

    Returns:
      A list of ``n`` (source, target) tuples.
    """
    if n < 0:
        raise ValueError(f"generate_pairs: n must be >= 0, got {n}")
    stream = iter_pairs(seed)
    return [next(stream) for _ in range(n)]


# ---------------------------------------------------------------------------------------------
# Corpus files
# ---------------------------------------------------------------------------------------------


def _split_pairs(train_size: int, dev_size: int, test_size: int,
                 seed: int) -> Dict[str, List[Tuple[str, str]]]:
    """Train from one stream; dev and test from others, without any source seen earlier."""
    splits = {"train": generate_pairs(train_size, seed)}
    seen = {src for src, _ in splits["train"]}
    for offset, (name, size) in enumerate((("dev", dev_size), ("test", test_size)), start=1):
        pairs = []
        for src, tgt in _stream(f"deep_nmt_tf.synthetic.sentences:{seed}:{name}:{offset}"):
            if len(pairs) == size:
                break
            if src not in seen:
                seen.add(src)
                pairs.append((src, tgt))
        splits[name] = pairs
    return splits


def _paths(directory: str) -> Dict[str, str]:
    paths = {}
    for split in _SPLITS:
        paths[f"{split}_source"] = os.path.join(directory, f"{split}.src")
        paths[f"{split}_target"] = os.path.join(directory, f"{split}.tgt")
    return paths


def _read_manifest(directory: str) -> Optional[dict]:
    try:
        with open(os.path.join(directory, _MANIFEST), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _write_atomic(path: str, lines: Sequence[str]):
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        for line in lines:
            f.write(line + "\n")
    os.replace(tmp, path)


def write_corpus(directory: str, train_size: int, dev_size: int, test_size: int,
                 seed: int) -> Dict[str, str]:
    """Writes ``{train,dev,test}.{src,tgt}`` under ``directory`` (idempotent).

    A ``manifest.json`` records the parameters and the generator version.  When it matches and
    all six files exist nothing is rewritten, so several workers (or a restarted job) can call
    this safely; files are written to a temporary name and renamed, the manifest last.  Dev and
    test sentences never repeat a source sentence of train (or of each other).

    Args:
      directory: output directory (created if missing).
      train_size: training pairs.
      dev_size: dev pairs.
      test_size: test pairs.
      seed: sentence seed (the language itself does not depend on it).

    Returns:
      Dict with keys ``train_source``, ``train_target``, ``dev_source``, ``dev_target``,
      ``test_source``, ``test_target`` mapping to file paths.
    """
    for name, size in (("train_size", train_size), ("dev_size", dev_size),
                       ("test_size", test_size)):
        if size < 1:
            raise ValueError(f"write_corpus: {name} must be >= 1, got {size}")
    paths = _paths(directory)
    manifest = {"generator_version": GENERATOR_VERSION, "train_size": train_size,
                "dev_size": dev_size, "test_size": test_size, "seed": seed}
    if _read_manifest(directory) == manifest and all(map(os.path.exists, paths.values())):
        return paths
    os.makedirs(directory, exist_ok=True)
    splits = _split_pairs(train_size, dev_size, test_size, seed)
    for split, pairs in splits.items():
        _write_atomic(paths[f"{split}_source"], [src for src, _ in pairs])
        _write_atomic(paths[f"{split}_target"], [tgt for _, tgt in pairs])
    manifest_path = os.path.join(directory, _MANIFEST)
    tmp = f"{manifest_path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2, sort_keys=True)
    os.replace(tmp, manifest_path)
    return paths


def copy_baseline_bleu(pairs: Sequence[Tuple[str, str]]) -> float:
    """Corpus BLEU (sacrebleu, default 13a tokenisation) of outputting the source unchanged.

    Args:
      pairs: (source, target) pairs.

    Returns:
      BLEU in [0, 100]; low for a pair that needs translation.
    """
    import sacrebleu  # Local import: only needed for this diagnostic.

    sources = [src for src, _ in pairs]
    targets = [tgt for _, tgt in pairs]
    return float(sacrebleu.corpus_bleu(sources, [targets]).score)
