"""Parameter names as masks and fingerprints know them: the same name under any wrapping (peft, FSDP, compile).

Below :mod:`lightning_unlearn.masks` and :mod:`lightning_unlearn.models`, which both match weights by these names.
"""

from __future__ import annotations

import re

# peft wraps names as base_model.model.<name> and moves a wrapped Linear's weight to <module>.base_layer.weight.
_PEFT_PREFIX = re.compile(r"^(base_model\.model\.)")
_FSDP_WRAPPERS = re.compile(r"(_fsdp_wrapped_module\.|_checkpoint_wrapped_module\.|_orig_mod\.|module\.)")


def canonical_name(name: str) -> str:
    """A parameter name with peft / FSDP / compile wrapper prefixes removed, so masks match any wrapping."""
    name = _PEFT_PREFIX.sub("", name)
    name = _FSDP_WRAPPERS.sub("", name)
    return name.replace(".base_layer.", ".")


__all__ = ["canonical_name"]
