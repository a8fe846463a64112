"""The one bootstrap of a median the lab compares with: every rule that says "A differs from B" (the ranking's MCB,
`stats.selection`; a case between two runs, `stats.change`, read by the gate and the comparison page) draws each
case's median from its run's pooled residuals, rescaled to the run's robust noise figure, so all of them see the
same spread for the same rounds."""

from __future__ import annotations

import numpy as np

from .summary import MIN_LABELLED_N, consistency_factor, pooled_mad_sd, residuals

MEMORY_BYTES = 50_000_000  # bound on the bootstrap's temporaries, whatever the number of rounds


def boot_medians(pool: np.ndarray, n: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """`size` bootstrap medians of `n` draws with replacement from the sorted `pool`, in O(size) memory.

    Why not resample: a saved run may carry a million rounds in a case. The k-th order statistic of n draws from
    an empirical distribution of N points is pool[ceil(N U_(k)) - 1] with U_(k) ~ Beta(k, n - k + 1), so a median is
    drawn exactly from one beta variate (two for even n: the next uniform order statistic is
    U_(k) + (1 - U_(k)) Beta(1, n - k))."""
    big = pool.size
    m = (n + 1) // 2
    u = rng.beta(m, n - m + 1, size=size)
    lo = pool[np.clip(np.ceil(big * u).astype(np.int64) - 1, 0, big - 1)]
    if n % 2:
        return lo
    u2 = u + (1.0 - u) * rng.beta(1, n - m, size=size)
    return 0.5 * (lo + pool[np.clip(np.ceil(big * u2).astype(np.int64) - 1, 0, big - 1)])


def deviations(cases: list[np.ndarray], sigma: float, factor: float, resamples: int, seed: int,
               heteroscedastic: bool) -> tuple[np.ndarray, np.ndarray]:
    """(bootstrap deviations th* - th, resamples x cases; each case's scale lambda). Case i's median is redrawn from
    n_i draws of the pooled residuals, rescaled so their MAD-SD is the run's sigma, times lambda_i = max(1, own
    MAD-SD / sigma) for cases of >= 6 rounds: a case noisier than the pool keeps its own width, none is made
    narrower (without it, a 3x noisier best was in G1 in 82 % of runs instead of 98 %)."""

    pool = np.sort(np.concatenate(residuals(cases))) * factor
    centre = float(np.median(pool))
    lam = np.ones(len(cases))
    if heteroscedastic:
        for t, a in enumerate(cases):
            if a.size >= MIN_LABELLED_N:
                own = pooled_mad_sd(residuals([a])) * consistency_factor([a.size], seed=seed)
                lam[t] = max(1.0, own / sigma)
    rng = np.random.default_rng(seed)
    dev = np.empty((resamples, len(cases)))
    for t, a in enumerate(cases):
        dev[:, t] = lam[t] * (boot_medians(pool, int(a.size), resamples, rng) - centre)
    return dev, lam


