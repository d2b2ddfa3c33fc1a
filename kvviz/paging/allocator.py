"""Paged KV-cache bookkeeping: a block pool with a free list, allocation policies, block tables,
slot mappings (with the padding slot) and context lengths for a batch of sequences.

This is host-side state, like vLLM's block manager. It knows nothing about the cache format: the
same `PagedBatch` drives the int8 seed kernels, the f32 baseline and every quantisation method.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kvviz.errors import InvalidInput

PAD_SLOT = 0xFFFFFFFF

POLICIES = ("contiguous", "scattered", "fragmented")


class OutOfBlocks(InvalidInput):
    hint = "Raise the number of physical blocks, or shorten the sequences."


class BlockAllocator:
    """A pool of `num_blocks` physical blocks with a free list.

    Policies:
      contiguous  - lowest free block first: a fresh pool gives each sequence a run of blocks.
      scattered   - a random free block each time (seeded): blocks of a sequence are spread out.
      fragmented  - the pool is first filled by short-lived sequences and every other of their blocks
                    freed, so new sequences land in the holes, as in a long-running server.
    `window` (blocks) keeps all blocks of one sequence inside one aligned window of the pool, so a
    pool larger than the device's storage-binding limit can be bound one window at a time.
    """

    def __init__(self, num_blocks: int, policy: str = "contiguous", seed: int = 0, window: int | None = None):
        if num_blocks <= 0:
            raise InvalidInput(f"num_blocks must be positive, got {num_blocks}")
        if policy not in POLICIES:
            raise InvalidInput(f"Unknown allocation policy {policy!r}; choose one of {', '.join(POLICIES)}")
        self.num_blocks = int(num_blocks)
        self.policy = policy
        self.window = int(window) if window else self.num_blocks
        self._rng = np.random.default_rng(seed)
        self._free = np.ones(self.num_blocks, dtype=bool)
        if policy == "fragmented":
            # Fill the pool, then free every other block: what churn leaves behind.
            self._free[:] = False
            self._free[::2] = True

    @property
    def free_count(self) -> int:
        return int(self._free.sum())

    def free_blocks(self) -> np.ndarray:
        return np.flatnonzero(self._free)

    def allocate(self, n: int) -> list[int]:
        """Allocate `n` blocks for one sequence (all inside one window)."""
        if n == 0:
            return []
        n_windows = -(-self.num_blocks // self.window)
        order = list(range(n_windows))
        if self.policy == "scattered":
            self._rng.shuffle(order)
        for w in order:
            lo, hi = w * self.window, min(self.num_blocks, (w + 1) * self.window)
            cand = lo + np.flatnonzero(self._free[lo:hi])
            if len(cand) < n:
                continue
            if self.policy == "scattered":
                picked = self._rng.choice(cand, size=n, replace=False)
            else:
                picked = cand[:n]
            self._free[picked] = False
            return [int(b) for b in picked]
        where = "in one binding window" if n_windows > 1 else "in the pool"
        raise OutOfBlocks(
            f"Need {n} free blocks {where}, only {self.free_count} free of {self.num_blocks} "
            f"({self.policy} policy)."
        )

    def free(self, blocks) -> None:
        b = np.asarray(list(blocks), dtype=np.int64)
        if b.size and (b.min() < 0 or b.max() >= self.num_blocks):
            raise InvalidInput("free(): block id out of range")
        if b.size and self._free[b].any():
            raise InvalidInput("free(): double free of a block")
        self._free[b] = True


@dataclass
class PagedBatch:
    """A batch of sequences laid out in a paged cache.

    block_tables: [num_seqs, max_blocks_per_seq] uint32 (unused entries are 0, never read because
    the kernels stop at context_len); context_lens: [num_seqs] uint32; slot_mapping: [num_tokens]
    uint32 for the tokens of every sequence in order, PAD_SLOT for padding tokens;
    token_seq / token_pos: which sequence and position each token row is (-1 for padding).
    """

    block_size: int
    num_blocks: int
    context_lens: np.ndarray
    block_tables: np.ndarray
    slot_mapping: np.ndarray
    token_seq: np.ndarray
    token_pos: np.ndarray
    policy: str = "contiguous"
    window: int = 0
    seq_blocks: list = field(default_factory=list)

    @property
    def num_seqs(self) -> int:
        return len(self.context_lens)

    @property
    def num_tokens(self) -> int:
        return len(self.slot_mapping)

    @property
    def max_blocks_per_seq(self) -> int:
        return self.block_tables.shape[1]

    @property
    def max_context_len(self) -> int:
        return int(self.context_lens.max()) if self.num_seqs else 0

    def block_owner(self) -> np.ndarray:
        """[num_blocks] int: owning sequence of each physical block, -1 when free."""
        owner = np.full(self.num_blocks, -1, dtype=np.int64)
        for s, blocks in enumerate(self.seq_blocks):
            owner[np.asarray(blocks, dtype=np.int64)] = s
        return owner

    def block_fill(self) -> np.ndarray:
        """[num_blocks] int: tokens used in each physical block (0 for free blocks)."""
        fill = np.zeros(self.num_blocks, dtype=np.int64)
        for s, blocks in enumerate(self.seq_blocks):
            n = int(self.context_lens[s])
            for i, b in enumerate(blocks):
                fill[b] = min(self.block_size, n - i * self.block_size)
        return fill

    def token_rows(self, seq: int) -> np.ndarray:
        """Row indices (into the token arrays) of sequence `seq`, in position order."""
        rows = np.flatnonzero(self.token_seq == seq)
        return rows[np.argsort(self.token_pos[rows], kind="stable")]

    def block_positions(self, block: int) -> tuple[int, np.ndarray]:
        """(owning sequence or -1, position in that sequence of each slot of a physical block, -1
        where the slot is unused)."""
        pos = np.full(self.block_size, -1, dtype=np.int64)
        owner = int(self.block_owner()[block])
        if owner < 0:
            return owner, pos
        logical = list(self.seq_blocks[owner]).index(block)
        p = logical * self.block_size + np.arange(self.block_size)
        used = p < int(self.context_lens[owner])
        pos[used] = p[used]
        return owner, pos

    def slot(self, seq: int, pos: int) -> int:
        b = int(self.block_tables[seq, pos // self.block_size])
        return b * self.block_size + pos % self.block_size

    def validate(self) -> None:
        """Host-side check before any dispatch: out-of-range ids read garbage silently on a GPU."""
        if self.block_size <= 0:
            raise InvalidInput(f"block_size must be positive, got {self.block_size}")
        ctx = np.asarray(self.context_lens)
        need = -(-ctx.astype(np.int64) // self.block_size)
        if self.num_seqs and int(need.max(initial=0)) > self.block_tables.shape[1]:
            raise InvalidInput("A context length needs more blocks than the block table has columns.")
        for s in range(self.num_seqs):
            used = self.block_tables[s, : need[s]].astype(np.int64)
            if used.size and (used.max() >= self.num_blocks):
                bad = int(used.max())
                raise InvalidInput(
                    f"Block table of sequence {s} names block {bad}, but the pool has {self.num_blocks} blocks.",
                    "Block ids must be < num_blocks.",
                )
        sm = np.asarray(self.slot_mapping, dtype=np.int64)
        real = sm[sm != PAD_SLOT]
        if real.size and real.max() >= self.num_blocks * self.block_size:
            raise InvalidInput(
                f"Slot {int(real.max())} is outside the pool ({self.num_blocks} blocks x {self.block_size}).",
                "Slots must be < num_blocks * block_size, or 0xFFFFFFFF for padding.",
            )
        if real.size and len(np.unique(real)) != real.size:
            raise InvalidInput("Two tokens map to the same cache slot.")


def make_batch(
    context_lens,
    block_size: int,
    num_blocks: int | None = None,
    policy: str = "contiguous",
    seed: int = 0,
    pad_every: int = 0,
    window: int | None = None,
) -> PagedBatch:
    """Allocate a batch of sequences of the given lengths.

    num_blocks defaults to exactly what the batch needs (x2 for the fragmented policy, whose pool is
    half full before the batch arrives). pad_every > 0 inserts a padding token (PAD_SLOT) after every
    `pad_every` real tokens, as a batched writer sees.
    """
    lens = np.asarray(list(context_lens), dtype=np.int64)
    if lens.ndim != 1 or (lens < 0).any():
        raise InvalidInput("context_lens must be a list of non-negative integers")
    if block_size <= 0:
        raise InvalidInput(f"block_size must be positive, got {block_size}")
    need = -(-lens // block_size)
    if num_blocks is None:
        num_blocks = max(1, int(need.sum()) * (2 if policy == "fragmented" else 1))
    alloc = BlockAllocator(num_blocks, policy, seed, window)
    max_blocks = max(1, int(need.max(initial=0)))
    tables = np.zeros((len(lens), max_blocks), dtype=np.uint32)
    seq_blocks = []
    for s, n in enumerate(need):
        blocks = alloc.allocate(int(n))
        tables[s, : len(blocks)] = blocks
        seq_blocks.append(blocks)
    tseq = np.repeat(np.arange(len(lens)), lens)
    tpos = np.concatenate([np.arange(int(L)) for L in lens]) if lens.size else np.zeros(0, np.int64)
    slots = tables[tseq, tpos // block_size].astype(np.int64) * block_size + tpos % block_size
    if pad_every and slots.size:
        # Insert a padding row after every `pad_every` real tokens.
        at = np.arange(pad_every, slots.size + 1, pad_every)
        slots = np.insert(slots, at, PAD_SLOT)
        tseq = np.insert(tseq, at, -1)
        tpos = np.insert(tpos, at, -1)
    batch = PagedBatch(
        block_size=block_size,
        num_blocks=num_blocks,
        context_lens=lens.astype(np.uint32),
        block_tables=tables,
        slot_mapping=np.asarray(slots, dtype=np.uint32),
        token_seq=np.asarray(tseq, dtype=np.int64),
        token_pos=np.asarray(tpos, dtype=np.int64),
        policy=policy,
        window=alloc.window,
        seq_blocks=seq_blocks,
    )
    batch.validate()
    return batch


def batch_from_blocks(seq_blocks, context_lens, block_size: int, num_blocks: int) -> PagedBatch:
    """A batch from explicit per-sequence block lists (e.g. block tables imported from an engine)."""
    lens = np.asarray(list(context_lens), dtype=np.int64)
    if len(seq_blocks) != len(lens):
        raise InvalidInput("one block list per sequence is needed")
    width = max(1, max((len(b) for b in seq_blocks), default=1))
    tables = np.zeros((len(lens), width), dtype=np.uint32)
    for s, blocks in enumerate(seq_blocks):
        if len(blocks) * block_size < lens[s]:
            raise InvalidInput(f"sequence {s}: {len(blocks)} blocks cannot hold {int(lens[s])} tokens")
        tables[s, : len(blocks)] = blocks
    tseq = np.repeat(np.arange(len(lens)), lens)
    tpos = np.concatenate([np.arange(int(L)) for L in lens]) if lens.size else np.zeros(0, np.int64)
    slots = tables[tseq, tpos // block_size].astype(np.int64) * block_size + tpos % block_size
    batch = PagedBatch(block_size, num_blocks, lens.astype(np.uint32), tables, slots.astype(np.uint32),
                       tseq, tpos, "explicit", 0, [list(map(int, b)) for b in seq_blocks])
    batch.validate()
    return batch
