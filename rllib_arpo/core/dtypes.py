"""The compute dtypes a config may name (its ``dtype`` field), each declared once: the name, the
torch dtype it stands for, and through it the bytes of one value (``torch.dtype.itemsize``: 4 for
float32, 2 for bfloat16 and float16), which the learner memory estimate counts as b."""

from __future__ import annotations

import torch

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
"""The config's ``dtype`` names, as torch dtypes."""
DTYPE_NAMES = tuple(DTYPES)
"""The names a config's ``dtype`` may take, in the order the error message lists them."""
