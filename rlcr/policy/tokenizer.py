"""Character tokenizer of the tiny policy, built offline with `tokenizers`.

Vocabulary: the special tokens <pad> <bos> <eos> <unk>, then tab, newline and the 95 printable ASCII
characters. Every character is one token, so a stop string is a fixed token sequence and token
counts are character counts.

Covers: any Python string tokenizes without error. A character outside the vocabulary (unicode,
control characters, emoji, a lone surrogate) becomes one <unk>; the literal text "<eos>" typed by an
agent is five characters, never the eos token (`split_special_tokens`), so an agent cannot forge a
turn boundary. Does not cover: round-tripping non-ASCII text (it decodes as nothing / <unk>).
"""

from __future__ import annotations

import re
import string

from tokenizers import Tokenizer, decoders, models, processors
from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIALS = (PAD, BOS, EOS, UNK)
CHARS = "\t\n" + "".join(chr(c) for c in range(32, 127))
_SURROGATES = re.compile("[\ud800-\udfff]")

assert set(string.printable) - set("\r\x0b\x0c") == set(CHARS)


def build_char_tokenizer(model_max_length: int = 1024) -> PreTrainedTokenizerFast:
    """The character tokenizer: ids 0-3 are <pad> <bos> <eos> <unk>, then one id per character.

    `tok(text)` prepends <bos>; `tok(text, add_special_tokens=False)` does not.
    """
    vocab = {t: i for i, t in enumerate(SPECIALS + tuple(CHARS))}
    # BPE with no merges and no pre-tokenizer: splits any text into characters, unknown -> <unk>
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK, fuse_unk=False))
    core.decoder = decoders.Fuse()
    core.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, vocab[BOS])]
    )
    core.add_special_tokens(list(SPECIALS))
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        model_max_length=model_max_length,
        padding_side="left",
        clean_up_tokenization_spaces=False,
        split_special_tokens=True,
    )


def safe_text(text: str) -> str:
    """Text the Rust tokenizers accept: lone surrogates (not encodable as UTF-8) become U+FFFD."""
    return _SURROGATES.sub("\ufffd", text)


def encode(tokenizer, text: str, bos: bool = True) -> list[int]:
    """Token ids of `text` for any tokenizer; never raises on hostile text, never emits special tokens
    for special-token lookalikes in `text` (the <bos> added in front is the only special)."""
    ids = tokenizer(safe_text(text), add_special_tokens=False, split_special_tokens=True)["input_ids"]
    if bos and tokenizer.bos_token_id is not None:
        ids = [tokenizer.bos_token_id, *ids]
    return ids
