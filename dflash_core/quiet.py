"""Third-party noise the command line hides unless asked (-v): transformers' progress bars ("Loading weights",
"Writing model shards") and its known kernel fallback warnings, which every command printed although nothing
is wrong: the optional kernel package only speeds up a path the lab also has in plain PyTorch."""

from __future__ import annotations

import logging

# transformers logs "`causal_conv1d_fn` is falling back to its reference PyTorch implementation because
# `causal_conv1d` is not installed" from this logger, once per function, for every LFM2 model it builds.
KERNEL_LOGGER = "transformers.integrations.hub_kernels"
KNOWN_FALLBACKS = ("causal_conv1d",)


class KnownFallbacks(logging.Filter):
    """Drops transformers' warnings that a known optional kernel package is missing (nothing else)."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        return not ("falling back" in msg and any(k in msg for k in KNOWN_FALLBACKS))


def hide_known_fallbacks() -> None:
    """Cheap (no import): a filter on the logger transformers will use, installed once."""
    lg = logging.getLogger(KERNEL_LOGGER)
    if not any(isinstance(f, KnownFallbacks) for f in lg.filters):
        lg.addFilter(KnownFallbacks())


def quiet_third_party(verbose: bool) -> None:
    """Unless `verbose`: hide the known fallback warnings and transformers' progress bars (imports transformers'
    logging module, which commands that load a model import anyway)."""
    if verbose:
        return
    hide_known_fallbacks()
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
