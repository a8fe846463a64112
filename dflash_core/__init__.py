"""DFlash Mini Lab: lossless speculative decoding on small hybrid (LFM2) models.

Importing the package does no work: torch and transformers load only when a submodule needs them.
"""

__version__ = "0.1.0"
DEFAULT_HUB_TARGET = "LiquidAI/LFM2.5-350M-Base"
