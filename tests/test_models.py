import json

import pytest
import torch
from safetensors.torch import save_file

from lightning_unlearn.models import LazyWeights, load_weights


def test_lazy_weights_read_each_tensor_of_a_sharded_directory_on_access(tmp_path):
    g = torch.Generator().manual_seed(0)
    tensors = {
        "base_model.model.model.layers.0.mlp.up_proj.weight": torch.randn(6, 4, generator=g),  # peft-wrapped name
        "model.layers.0.mlp.up_proj.bias": torch.randn(6, generator=g),
        "lm_head.weight": torch.randn(3, 4, generator=g).to(torch.bfloat16),
    }
    folder = tmp_path / "model"
    folder.mkdir()
    shards = {
        "model-00001-of-00002.safetensors": list(tensors)[:2],
        "model-00002-of-00002.safetensors": ["lm_head.weight"],
    }
    for file, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(folder / file))
    weight_map = {k: file for file, keys in shards.items() for k in keys}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))

    lazy = load_weights(folder, lazy=True)
    eager = load_weights(folder)
    assert isinstance(lazy, LazyWeights) and set(lazy) == set(eager) == {
        "model.layers.0.mlp.up_proj.weight",
        "model.layers.0.mlp.up_proj.bias",
        "lm_head.weight",
    }
    assert lazy.shapes == {n: tuple(t.shape) for n, t in eager.items()}
    assert all(torch.equal(lazy[n], eager[n]) and lazy[n].dtype == eager[n].dtype for n in eager)
    assert lazy["lm_head.weight"] is not lazy["lm_head.weight"]  # read again, not cached
    with pytest.raises(KeyError):
        lazy["model.embed_tokens.weight"]
    with pytest.raises(FileNotFoundError, match="missing"):
        load_weights(tmp_path / "missing", lazy=True)
