"""What several methods share: the block proposer, option rules and the tie rule, fit examples and fit
helpers, and the learned pair selector."""
