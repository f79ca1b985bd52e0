"""The SmolLM2 tokenizer that ships with the package (``assets/smollm2_tokenizer``), in a module without torch, so
that a command that only tokenises (``python -m llm_runs data stats``) imports no torch."""

from __future__ import annotations

import gzip
from pathlib import Path

__all__ = ["TOKENIZER_ASSETS", "smollm2_tokenizer"]

#: The gzip'd ``tokenizer.json`` (extracted from the default model's GGUF) and its chat template.
TOKENIZER_ASSETS = Path(__file__).parent / "assets" / "smollm2_tokenizer"


def smollm2_tokenizer():
    """The SmolLM2 tokenizer (with its chat template) from the files shipped in this package."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    raw = gzip.decompress((TOKENIZER_ASSETS / "tokenizer.json.gz").read_bytes()).decode("utf-8")
    template = (TOKENIZER_ASSETS / "chat_template.jinja").read_text()
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(raw),
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
        unk_token="<|endoftext|>",
        chat_template=template,
    )
