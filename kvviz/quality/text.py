"""The text of a quality run and its chunks, as llama.cpp's perplexity tool cuts them.

The text is one or more UTF-8 files joined in order by a blank line (default: the GPL-3 text in Debian's
common-licenses folder, a real English text every Debian machine has). It is tokenised whole (a BOS first
when the model's tokenizer adds one), then cut into chunks of `ctx` tokens: chunk i holds tokens
i*ctx .. (i+1)*ctx - 1, its first token replaced by BOS when the tokenizer adds one, and every chunk
starts at position 0 with an empty cache. The logits of positions ctx/2 .. ctx-2 of a chunk are scored
against the next token, so every scored position has at least ctx/2 tokens of context: ctx - 1 - ctx/2
positions per chunk. A text needs at least 2*ctx tokens, as llama.cpp asks.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kvviz.errors import InvalidInput

DEFAULT_TEXT = Path("/usr/share/common-licenses/GPL-3")


def read_texts(paths) -> tuple[str, list[str]]:
    """(the joined text, the files' names as given) of UTF-8 files; InvalidInput naming a file that cannot be
    read or is not UTF-8 or is empty."""
    paths = [Path(p) for p in (paths or [DEFAULT_TEXT])]
    parts = []
    for p in paths:
        try:
            raw = p.read_bytes()
        except FileNotFoundError:
            hint = ("Debian keeps it in the base-files package; give another text with --text FILE."
                    if p == DEFAULT_TEXT else "Give an existing UTF-8 text file.")
            raise InvalidInput(f"--text: {p}: no such file", hint) from None
        except OSError as exc:
            raise InvalidInput(f"--text: {p}: cannot read it: {exc.strerror}") from None
        try:
            t = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidInput(f"--text: {p}: not UTF-8 (byte {exc.start}: {raw[exc.start:exc.start + 1]!r})",
                               "Convert the file to UTF-8 (iconv -t UTF-8).") from None
        if not t.strip():
            raise InvalidInput(f"--text: {p}: the file holds no text")
        parts.append(t)
    return "\n\n".join(parts), [str(p) for p in paths]


@dataclass(frozen=True)
class Chunking:
    """The chunks of a tokenised text. `tokens` are the text's token ids (BOS first when added)."""

    tokens: np.ndarray
    ctx: int
    n_chunks: int
    bos_id: int | None = None  # replaces each chunk's first token (None: the tokenizer adds no BOS)
    names: list = field(default_factory=list)

    @property
    def first(self) -> int:
        """The first scored position of a chunk."""
        return self.ctx // 2

    @property
    def scored_per_chunk(self) -> int:
        return self.ctx - 1 - self.first

    @property
    def scored(self) -> int:
        return self.n_chunks * self.scored_per_chunk

    def chunk(self, i: int) -> np.ndarray:
        """The token ids fed as chunk i (its first replaced by BOS when the tokenizer adds one)."""
        c = np.array(self.tokens[i * self.ctx:(i + 1) * self.ctx], np.int64)
        if self.bos_id is not None:
            c[0] = self.bos_id
        return c

    def targets(self, i: int) -> np.ndarray:
        """The next tokens of chunk i's scored positions (positions first .. ctx-2)."""
        c = np.asarray(self.tokens[i * self.ctx:(i + 1) * self.ctx], np.int64)
        return c[self.first + 1:]

    def positions(self) -> np.ndarray:
        return np.arange(self.first, self.ctx - 1)

    @property
    def tokens_sha256(self) -> str:
        return hashlib.sha256(np.asarray(self.tokens, "<i4").tobytes()).hexdigest()

    def identity(self) -> dict:
        return {"tokens_sha256": self.tokens_sha256, "ctx": self.ctx, "n_chunks": self.n_chunks,
                "bos_replaced": self.bos_id is not None}


def chunk_text(tokens, ctx: int | None, context_length: int, *, chunks: int | None = None,
               bos_id: int | None = None, names=(), max_ctx: int | None = None) -> Chunking:
    """The chunking of `tokens` with `ctx` tokens a chunk (None: the largest that gives two chunks, within
    the model's context and `max_ctx`), at most `chunks` chunks (None: every whole chunk). InvalidInput when
    the text is too short for two chunks or ctx is past the model's context."""
    tokens = np.asarray(tokens, np.int64)
    n = tokens.size
    limit = min(int(context_length), int(max_ctx)) if max_ctx else int(context_length)
    if ctx is None:
        ctx = min(limit, n // 2)
        ctx -= ctx % 2
    if ctx < 4:
        raise InvalidInput(f"the text has {n} tokens: too few for two chunks of at least 4 tokens",
                           "Give a longer --text (or a larger --max-tokens).")
    if ctx > context_length:
        raise InvalidInput(f"--ctx {ctx} is past the model's context of {context_length} tokens",
                           f"Give --ctx {context_length} or less.")
    if max_ctx and ctx > max_ctx:
        raise InvalidInput(f"--ctx {ctx} is past the {max_ctx} tokens this run can attend over",
                           f"Give --ctx {max_ctx} or less.")
    if n < 2 * ctx:
        raise InvalidInput(f"the text has {n} tokens; --ctx {ctx} needs at least {2 * ctx} (two chunks, as "
                           "llama.cpp's perplexity asks)", f"Give --ctx {max(n // 2, 4)} or less, or a longer text.")
    n_chunks = n // ctx
    if chunks is not None:
        n_chunks = min(n_chunks, int(chunks))
    return Chunking(tokens, int(ctx), int(n_chunks), bos_id, list(names))
