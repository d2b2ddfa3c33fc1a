from kvviz.paging.allocator import PAD_SLOT, POLICIES, BlockAllocator, OutOfBlocks, PagedBatch, batch_from_blocks, make_batch

__all__ = ["PAD_SLOT", "POLICIES", "BlockAllocator", "OutOfBlocks", "PagedBatch", "batch_from_blocks", "make_batch"]
