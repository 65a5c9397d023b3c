"""KV memory of paged serving: the block pool and its prefix cache (:mod:`.block_pool`), what a block holds
per group of layers under each KV-cache manager (:mod:`.groups`), and the pool's tensors as ledger rows
(:mod:`.pool_tensors`). Mechanisms only: which request gets which block is the schedulers' (:mod:`..sched`)."""
