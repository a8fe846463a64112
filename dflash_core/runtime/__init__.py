"""One round: the target runtime (cached LFM2 with exact rollback), the DFlash drafter, the decode loop
(`decode.greedy`, `decode.speculative` and its round), devices, kernels and the exactness verdict."""
