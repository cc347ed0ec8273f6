"""Tokenizers of the tiny policy, built offline with `tokenizers`: characters, or characters + words.

`char`: the special tokens <pad> <bos> <eos> <unk>, then tab, newline and the 95 printable ASCII
characters. Every character is one token, so token counts are character counts.

`words`: the same characters plus one token for each word of the environment's own language
(`WORDS`: the protocol keywords, the roles, the words of the observation templates), with and
without a leading space. Text is split into pieces (` ?[A-Za-z_]+` runs, digit runs, single other
characters); a piece that is in the vocabulary is ONE token, any other piece is its characters.
`HIRE worker: 5+3` costs 7 tokens instead of 16 and an observation about 2.5x fewer: the
organisation's overhead (hiring, posting, addressing) costs what it costs with a real BPE vocabulary,
and observations are short enough for the tiny model to attend over.

`numbers` (the tiny default): `words` plus one token for each integer 10-99 (0-9 are characters),
as BPE vocabularies hold common numbers; longer digit runs stay characters. Measured on 2 cores
(0.8M model, drill of the train families' sums, eval prompts held out): after 400 steps two-term
sums were right 76% of the time and four-term chains 34% (`words`, digits as characters: 61% and 0%);
after 1200 steps 99% and 78%. A one-digit pair or a partial sum is then one token to copy and one to
produce, with no carry to spell out.

`words_length` counts tokens without calling the tokenizer (the organisation fits observations line
by line with it).

Covers: any Python string tokenizes without error. A character outside the vocabulary (unicode,
control characters, emoji, a lone surrogate) becomes one <unk>; the literal text "<eos>" typed by an
agent is five characters, never the eos token (`split_special_tokens`), so an agent cannot forge a
turn boundary. Does not cover: round-tripping non-ASCII text (it decodes as nothing / <unk>).
"""

from __future__ import annotations

import re
import string

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIALS = (PAD, BOS, EOS, UNK)
CHARS = "\t\n" + "".join(chr(c) for c in range(32, 127))
_SURROGATES = re.compile("[\ud800-\udfff]")

assert set(string.printable) - set("\r\x0b\x0c") == set(CHARS)


# the environment's words: protocol keywords and verdicts, roles, and the words of the observation,
# post and error templates (rlcr/org/episode.py, board.py, protocol.py)
WORDS = tuple(dict.fromkeys("""
    POST HIRE WRITE READ RUN SUBMIT WAIT DONE APPROVE REJECT
    ceo worker verifier tester lead
    agent agents role you the company depth hired by actions roles can hire limits tokens per turn
    single org nearest first board last of other posts for round left task brief your it starts next
    check files chars error no action line needs text after is not available to already submitted
    this was overwritten later writer refused file output code execution unknown known full reached
    cut and
""".split()))
PIECE = re.compile(r" ?[A-Za-z_]+|[0-9]+|[^A-Za-z_0-9]", re.DOTALL)
"""How `words` and `numbers` split text before the vocabulary lookup (the same pattern runs in Rust)."""


def build_char_tokenizer(model_max_length: int = 1024) -> PreTrainedTokenizerFast:
    """The character tokenizer: ids 0-3 are <pad> <bos> <eos> <unk>, then one id per character.

    `tok(text)` prepends <bos>; `tok(text, add_special_tokens=False)` does not.
    """
    return _build(SPECIALS + tuple(CHARS), model_max_length, pieces=False)


def build_words_tokenizer(model_max_length: int = 1024, words: tuple[str, ...] = WORDS,
                          numbers: int = 0) -> PreTrainedTokenizerFast:
    """Characters plus one token per word of `words`, each with and without a leading space, and one
    per integer 10..numbers-1 (0-9 are characters already): ids 0-3 are the specials, then the
    characters in `char`'s order, then the words, then the numbers."""
    extra = [w for word in words for w in (word, " " + word)] + [str(i) for i in range(10, numbers)]
    return _build(SPECIALS + tuple(CHARS) + tuple(dict.fromkeys(extra)), model_max_length, pieces=True)


def build_tokenizer(kind: str, model_max_length: int = 1024) -> PreTrainedTokenizerFast:
    """The tiny policy's tokenizer by name (`model.tokenizer`: char | words | numbers)."""
    if kind == "char":
        return build_char_tokenizer(model_max_length)
    if kind == "words":
        return build_words_tokenizer(model_max_length)
    if kind == "numbers":
        return build_words_tokenizer(model_max_length, numbers=100)
    raise ValueError(f"unknown tiny tokenizer {kind!r} (char | words | numbers)")


def tokenizer_words(tokenizer) -> frozenset[str] | None:
    """The word tokens of a `words` tokenizer (also one loaded back from a folder), an empty set for
    `char`, None for any other tokenizer."""
    vocab = tokenizer.get_vocab()
    if len(vocab) < 4 + len(CHARS) or any(vocab.get(c) != 4 + i for i, c in enumerate(CHARS)):
        return None
    chars = set(CHARS)
    rest = [t for t in vocab if t not in SPECIALS and t not in chars]
    if not all(re.fullmatch(r" ?[A-Za-z_]{2,}| [A-Za-z_]|[1-9][0-9]+", t) for t in rest):
        return None
    return frozenset(rest)


def words_length(text: str, words: frozenset[str]) -> int:
    """Tokens of `text` under the `words` tokenizer with that word set (no <bos>), without calling it."""
    return sum(1 if p in words else len(p) for p in PIECE.findall(safe_text(text)))


def _build(tokens: tuple[str, ...], model_max_length: int, pieces: bool) -> PreTrainedTokenizerFast:
    vocab = {t: i for i, t in enumerate(tokens)}
    # BPE with NO merges: a piece found whole in the vocabulary is one token (ignore_merges), any
    # other piece falls apart into its characters; unknown characters -> <unk>. Without a
    # pre-tokenizer the whole text is one piece: characters only.
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK, fuse_unk=False, ignore_merges=pieces))
    if pieces:
        core.pre_tokenizer = pre_tokenizers.Split(Regex(PIECE.pattern), behavior="isolated")
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
