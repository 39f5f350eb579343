"""``lightning-unlearn mask-auc`` scores an unlearned model directory against the forget mask."""

from __future__ import annotations

import json

from callback_fixtures import write_lacuna_weights

from lightning_unlearn.cli import main
from lightning_unlearn.masks import masked_parameter_names
from lightning_unlearn.models import load_causal_lm


def test_mask_auc_command(tiny_dir, tmp_path, capsys):
    w = write_lacuna_weights(tiny_dir, tmp_path)
    out = tmp_path / "auc.json"
    main(
        [
            "mask-auc",
            "--pre",
            w["pre_dir"],
            "--inj",
            w["inj_dir"],
            "--unl",
            w["unl_dir"],
            "--masks",
            w["masks"],
            "--max_samples",
            "3000",
            "--out",
            str(out),
        ]
    )
    result = json.loads(out.read_text())
    assert json.loads(capsys.readouterr().out) == result
    # θ_unl reverses 80% of the injection on m^F only: reversal scores separate it, and AUC(F|R) is lower.
    assert result["F"]["max"] > 0.9 and result["F"]["signrev"] > 0.9
    assert result["F|R"]["signrev"] < result["F"]["signrev"]
    assert "contrast" not in result["F"] and result["num_subsampled"] == 3000
    # θ_mask of the 4-block model: blocks 0-1 and the output head; embeddings, norms and blocks 2-3 are out.
    model = load_causal_lm(w["unl_dir"])
    params = dict(model.named_parameters())
    names = masked_parameter_names(model)
    assert not any("embed" in n or "norm" in n or ".layers.2." in n or ".layers.3." in n for n in names)
    assert result["num_weights"] == sum(params[n].numel() for n in names)
