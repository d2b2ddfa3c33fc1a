from kvviz.paging.allocator import PAD_SLOT, POLICIES, BlockAllocator, OutOfBlocks, PagedBatch, make_batch

__all__ = ["PAD_SLOT", "POLICIES", "BlockAllocator", "OutOfBlocks", "PagedBatch", "make_batch"]
