"""The sync diet (runtime/transfer.py): a decode crosses from the device to the host once per target call for
acceptance, plus once where a method selects on the host.

On this CPU the crossings are counted two ways: calls of `transfer.to_host` (the one door), and every host read
of a tensor made outside it (`.tolist()`, `.item()`, `int()`, `float()`, `bool()`, `.cpu()`, `.numpy()`:
each a synchronisation when the tensor lives on a GPU), through a TorchFunctionMode. tests/runtime/test_gpu.py counts
CUDA's own synchronisations where a GPU is present.
"""

from __future__ import annotations

import pytest

from dflash_core.methods import get_method, speculative_ids
from dflash_core.runtime import transfer
from dflash_core.runtime.decode import speculative

HOST_READS = {"tolist", "item", "__int__", "__float__", "__bool__", "__index__", "numpy", "cpu"}
# Methods whose every read goes through the one door: the acceptance transfer, plus one selection transfer.
DIETED = {"dflash": 1}  # transfers per target call beyond the prefill's
# The rest: host reads outside the door per round, at most (measured on this tiny target, 2026-12-07: a ratchet, so
# no change adds a synchronisation unnoticed; lower a figure when a method's reads move into the door). `__bool__`
# is the top-k tie check (`support.common.topk_tensors`); `.cpu()` / `.tolist()` the selectors' host copies.
RAW_PER_ROUND = {"act": 0, "boltzmann": 1, "minop_v13": 1, "simple_parareal_v14": 1, "gated_mobs_v11": 2,
                 "mobs": 4, "bmobs": 4, "boltzmann_v10": 4, "dflash2": 5, "jump_mobs": 5, "fused_jump": 6,
                 "parareal_v12": 7, "dspark_lite": 12, "suffix_dflash": 0}
PROMPT = [1, 7, 9, 11, 13, 17, 19]


class Crossings:
    """Counts `to_host` calls and the host reads of tensors made outside it, while active."""

    def __init__(self, monkeypatch):
        from torch.overrides import TorchFunctionMode

        self.door, self.raw, self.raw_names, inside = 0, 0, [], [False]
        real = transfer.to_host

        def counted(*tensors):
            self.door += 1
            inside[0] = True
            try:
                return real(*tensors)
            finally:
                inside[0] = False

        monkeypatch.setattr(transfer, "to_host", counted)
        outer = self

        class Mode(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                name = getattr(func, "__name__", "")
                if not inside[0] and name in HOST_READS:
                    outer.raw += 1
                    outer.raw_names.append(name)
                return func(*args, **(kwargs or {}))

        self.mode = Mode()


@pytest.mark.parametrize("method", speculative_ids())
def test_a_round_crosses_to_the_host_once_for_acceptance_and_once_for_a_host_selection(tiny_prepared, method,
                                                                                      monkeypatch):
    rt, prep = tiny_prepared.rt, tiny_prepared.prepared
    proposer = get_method(method).build(rt, prep)
    c = Crossings(monkeypatch)
    with c.mode:
        _, stats = speculative(rt, proposer, list(PROMPT), 24, 3, method=method)
    rounds = stats.target_calls - 1  # after the prefill (one transfer of its own)
    assert rounds > 0
    if method in DIETED:
        assert c.door == 1 + rounds * DIETED[method], (c.door, rounds)
        assert c.raw == 0, c.raw_names[:20]
    else:  # the acceptance transfer and at most one for the selection, through the door
        assert rounds + 1 <= c.door <= 1 + 2 * rounds, (c.door, rounds)
        assert c.raw <= RAW_PER_ROUND[method] * rounds, (c.raw, rounds, c.raw_names[:20])
