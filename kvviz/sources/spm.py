"""SentencePiece vocabularies as GGUF holds them (tokenizer.ggml.model = "llama": Llama 2, Mistral 7B,
Gemma, Phi-3), tokenised the way llama.cpp's SPM tokenizer does, so that kvviz feeds a model the ids
llama.cpp would:

  1. the text is split around special tokens written in it (control, user-defined and unknown tokens,
     longest first; Phi-3 files strip the whitespace after them);
  2. each piece of plain text gets a leading space when it follows a special token or starts the text
     (unless the file sets tokenizer.ggml.add_space_prefix = false, as Gemma's do), spaces become U+2581;
  3. the piece is split into characters, and adjacent symbols are merged, highest-scoring merged token
     first (leftmost on a tie), while the merge is a token of the vocabulary;
  4. a symbol that is no token is written as its UTF-8 bytes' <0xXX> tokens.
The scores are the file's tokenizer.ggml.scores. `tokenizers` builds BPE models from merge ranks, which
order ties between merges of the same score differently, so the merge loop is written out here.
"""
from __future__ import annotations

import heapq
from typing import Sequence

import numpy as np

from kvviz.errors import InvalidInput

SPACE = "\u2581"
# GGUF token types (llama.cpp's llama_token_type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
_C_SPACE = " \t\n\v\f\r"  # C isspace: what an RSTRIP special token strips after itself
# Token texts llama.cpp takes as end of generation, and so as control tokens whatever the file's type says.
_CONTROL_NAMES = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
                  "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
                  "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
                  "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~["}


class SPMTokenizer:
    """A GGUF SentencePiece vocabulary: encode/decode like llama.cpp, the interface of GGUFTokenizer."""

    def __init__(self, tokens: Sequence[str], scores: Sequence[float] | None, token_types: Sequence[int] | None,
                 *, bos_id: int | None = 1, eos_id: int | None = 2, add_bos: bool = True,
                 add_space_prefix: bool = True, rstrip_special: bool = False):
        n = len(tokens)
        self.tokens = list(tokens)
        self._id = {t: i for i, t in enumerate(self.tokens)}
        sc = np.zeros(n, np.float32) if scores is None else np.asarray(scores, np.float32)
        if sc.shape != (n,):
            raise InvalidInput(f"{sc.size} token scores for {n} tokens", "The tokenizer.ggml.scores list is corrupt.")
        self._score = sc.tolist()  # float32 values, compared as llama.cpp compares them
        types = [NORMAL] * n if token_types is None else [int(t) for t in token_types]
        if len(types) != n:
            raise InvalidInput(f"{len(types)} token types for {n} tokens", "The tokenizer.ggml.token_type list is corrupt.")
        for t in _CONTROL_NAMES & self._id.keys():
            types[self._id[t]] = CONTROL
        self.types = types
        special = [i for i, t in enumerate(types) if t in (CONTROL, USER_DEFINED, UNKNOWN)]
        self._special = sorted(special, key=lambda i: -len(self.tokens[i].encode("utf-8")))
        self._rstrip = set()
        if rstrip_special:
            self._rstrip = set(special) | {self._id[t] for t in ("</s>",) if t in self._id}
            self._rstrip -= {self._id[t] for t in ("<unk>", "<s>", "<|endoftext|>") if t in self._id}
        self._byte = []
        for b in range(256):
            tid = self._id.get(f"<0x{b:02X}>")
            if tid is None:
                tid = self._id.get(bytes([b]).decode("latin-1")) if b < 128 else None
            self._byte.append(tid)
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.add_bos = add_bos
        self.add_space_prefix = add_space_prefix
        self.pre = "spm"

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    @classmethod
    def from_meta(cls, meta) -> "SPMTokenizer":
        tokens = meta.get("tokenizer.ggml.tokens")
        if not tokens:
            raise InvalidInput(f"{meta.path.name}: GGUF has no tokenizer.ggml.tokens",
                               "The GGUF must embed its vocabulary.")
        bos = meta.get("tokenizer.ggml.bos_token_id", 1)
        eos = meta.get("tokenizer.ggml.eos_token_id", 2)
        name = str(meta.get("general.name", "")).lower()
        return cls(tokens, meta.get("tokenizer.ggml.scores"), meta.get("tokenizer.ggml.token_type"),
                   bos_id=None if bos is None else int(bos), eos_id=None if eos is None else int(eos),
                   add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", True)),
                   add_space_prefix=bool(meta.get("tokenizer.ggml.add_space_prefix", True)),
                   rstrip_special="phi-3" in name or "phi3" in name)

    # -- encoding --------------------------------------------------------------------------------

    def _partition(self, text: str, parse_special: bool) -> list:
        """The text as [str | int]: plain pieces and the ids of special tokens written in it."""
        frags: list = [text] if text else []
        for sid in self._special:
            if not parse_special and self.types[sid] in (CONTROL, UNKNOWN):
                continue
            word = self.tokens[sid]
            if not word:
                continue
            out: list = []
            for f in frags:
                if not isinstance(f, str):
                    out.append(f)
                    continue
                rest = f
                while True:
                    at = rest.find(word)
                    if at < 0:
                        if rest:
                            out.append(rest)
                        break
                    if at:
                        out.append(rest[:at])
                    out.append(sid)
                    rest = rest[at + len(word):]
                    if sid in self._rstrip:
                        rest = rest.lstrip(_C_SPACE)
            frags = out
        return frags

    def _spm(self, text: str, out: list[int]) -> None:
        """llama.cpp's llm_tokenizer_spm_session over one piece of text (spaces already escaped)."""
        syms = [c.encode("utf-8") for c in text]
        if not syms:
            return
        n = len(syms)
        size = [len(s) for s in syms]
        start = [0] * n
        for i in range(1, n):
            start[i] = start[i - 1] + size[i - 1]
        raw = text.encode("utf-8")
        prev = list(range(-1, n - 1))
        nxt = list(range(1, n)) + [-1]
        heap: list = []
        ids, score = self._id, self._score

        def add(left: int, right: int) -> None:
            if left < 0 or right < 0:
                return
            piece = raw[start[left]:start[left] + size[left] + size[right]]
            tid = ids.get(piece.decode("utf-8"))
            if tid is None:
                return
            # max score first, then the leftmost; the counter keeps the heap from comparing further
            heapq.heappush(heap, (-score[tid], left, len(heap), right, len(piece)))

        for i in range(1, n):
            add(i - 1, i)
        while heap:
            _, left, _, right, sz = heapq.heappop(heap)
            if size[left] == 0 or size[right] == 0 or size[left] + size[right] != sz:
                continue
            size[left] += size[right]
            size[right] = 0
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prev[nxt[right]] = left
            add(prev[left], left)
            add(left, nxt[left])
        i = 0
        while i != -1:
            piece = raw[start[i]:start[i] + size[i]]
            tid = ids.get(piece.decode("utf-8"))
            if tid is not None:
                out.append(tid)
            else:
                for b in piece:
                    bt = self._byte[b]
                    if bt is None:
                        raise InvalidInput(f"the vocabulary has no token for byte 0x{b:02X} (no <0x{b:02X}> token)",
                                           "The GGUF's SentencePiece vocabulary lacks its byte-fallback tokens.")
                    out.append(bt)
            i = nxt[i]

    def encode(self, text: str, add_bos: bool | None = None, parse_special: bool = True) -> list[int]:
        """Token ids of `text` (llama_tokenize with parse_special); BOS first when the file (or add_bos) says."""
        out: list[int] = []
        if (self.add_bos if add_bos is None else add_bos) and self.bos_id is not None:
            out.append(self.bos_id)
        prev_special = True
        for f in self._partition(text, parse_special):
            if isinstance(f, str):
                piece = (" " if self.add_space_prefix and prev_special else "") + f
                self._spm(piece.replace(" ", SPACE), out)
                prev_special = False
            else:
                out.append(f)
                prev_special = True
        return out

    # -- decoding --------------------------------------------------------------------------------

    def _piece(self, tid: int, special: bool) -> bytes:
        t = self.types[tid] if 0 <= tid < len(self.types) else UNUSED
        text = self.tokens[tid]
        if t in (CONTROL, UNKNOWN):
            return text.encode("utf-8") if special else b""
        if t == USER_DEFINED:
            return text.encode("utf-8")
        if t == BYTE:
            return bytes([int(text[3:5], 16)])
        if t == NORMAL:
            return text.replace(SPACE, " ").encode("utf-8")
        return b""

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        """The text of `ids`: the inverse of `encode`, which gives the text at its start and after every
        special token a leading space (add_space_prefix): that space is removed again."""
        ids = [int(i) for i in ids]
        self._check(ids)
        strip = self.add_space_prefix
        out = bytearray()
        for tid in ids:
            t = self.types[tid]
            if t in (CONTROL, UNKNOWN, USER_DEFINED):
                out += self._piece(tid, not skip_special)
                strip = self.add_space_prefix
                continue
            p = self._piece(tid, True)
            if strip and p.startswith(b" "):
                p = p[1:]
            strip = False
            out += p
        return out.decode("utf-8", errors="replace")

    def token_strings(self, ids: Sequence[int]) -> list[str]:
        """One display string per token (a byte token holding part of a UTF-8 character shows U+FFFD)."""
        ids = [int(i) for i in ids]
        self._check(ids)
        return [self._piece(i, True).decode("utf-8", errors="replace") for i in ids]

    def _check(self, ids: list[int]) -> None:
        bad = [i for i in ids if not 0 <= i < len(self.tokens)]
        if bad:
            raise InvalidInput(f"token id {bad[0]} is outside the vocabulary of {len(self.tokens)}")
