"""The SmolLM2 tokenizer that ships with the package (``assets/smollm2_tokenizer``), in a module without torch, so
that a command that only tokenises (``python -m llm_runs data stats``) imports no torch."""

from __future__ import annotations

import functools
import gzip
from pathlib import Path

__all__ = ["TOKENIZER_ASSETS", "smollm2_tokenizer"]

#: The gzip'd ``tokenizer.json`` (extracted from the default model's GGUF) and its chat template.
TOKENIZER_ASSETS = Path(__file__).parent.parent / "assets" / "smollm2_tokenizer"


@functools.cache
def _backend():
    """The parsed ``tokenizer.json``, parsed once per process: ``PreTrainedTokenizerFast(tokenizer_object=...)``
    works on a deep copy of it, so every tokenizer :func:`smollm2_tokenizer` returns is a fresh one (parsing the
    3.5 MB JSON is about 40 % of a call's CPU time)."""
    from tokenizers import Tokenizer

    return Tokenizer.from_str(gzip.decompress((TOKENIZER_ASSETS / "tokenizer.json.gz").read_bytes()).decode("utf-8"))


def smollm2_tokenizer():
    """The SmolLM2 tokenizer (with its chat template) from the files shipped in this package: a new object on every
    call (a caller may change its settings, e.g. the padding side, without touching another's)."""
    backend = _backend()  # first: without the llm extra the error names tokenizers (tests/test_installed.py)
    from transformers import PreTrainedTokenizerFast

    template = (TOKENIZER_ASSETS / "chat_template.jinja").read_text()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
        unk_token="<|endoftext|>",
        chat_template=template,
    )
