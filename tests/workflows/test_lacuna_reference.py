"""The testbed's retain reference: θ_inj on every element but m^F's, θ_pre on m^F's; refused without separability."""

from __future__ import annotations

import json

import pytest
import torch

from lightning_unlearn.masks import canonical_name, group_mask, sample_masks, save_masks
from lightning_unlearn.models import load_causal_lm
from lightning_unlearn.workflows.lacuna.commands import main as lacuna_main
from lightning_unlearn.workflows.lacuna.reference import ensure_reference


@pytest.fixture(params=[6, 2], ids=["six_groups", "two_groups"])
def workdir(request, tiny_dir, tmp_path):
    """A testbed work directory with θ_pre (the tiny model), θ_inj (θ_pre + noise everywhere) and the data's group
    masks: six (forget groups 0-2) or two (forget group 0)."""
    import shutil

    export = tmp_path / "inject" / "export"
    shutil.copytree(tiny_dir, export / "pre")
    shutil.copytree(tiny_dir, export / "inj")  # the tokenizer; the weights are overwritten below
    inj = load_causal_lm(tiny_dir)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in inj.parameters():
            p.add_(torch.randn_like(p))
    inj.save_pretrained(export / "inj")
    save_masks(export / "masks.safetensors", sample_masks(inj, num_groups=request.param, coverage=0.1, seed=1))
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "manifest.json").write_text(json.dumps({"num_groups": request.param}))
    return tmp_path


def test_reference_is_theta_inj_off_the_forget_mask_and_theta_pre_on_it(workdir):
    (workdir / "chain.json").write_text(json.dumps({"separable": True}))
    lacuna_main(["reference", "--workdir", str(workdir)])
    out = workdir / "reference"
    record = json.loads((out / "reference.json").read_text())
    num_groups = json.loads((workdir / "data" / "manifest.json").read_text())["num_groups"]
    forget_groups = [0, 1, 2] if num_groups == 6 else [0]
    assert record["exact"] is True and record["reset_groups"] == forget_groups  # the data's forget groups
    export = workdir / "inject" / "export"
    pre, inj, ref = (dict(load_causal_lm(d).named_parameters()) for d in (export / "pre", export / "inj", out))
    from safetensors.torch import load_file

    packed = load_file(export / "masks.safetensors")
    reset = 0
    for name, value in ref.items():
        forget = group_mask(packed[canonical_name(name)], forget_groups) if canonical_name(name) in packed else None
        if forget is None:
            assert torch.equal(value, inj[name]), name  # outside θ_mask: θ_inj's
            continue
        assert torch.equal(value[forget], pre[name][forget]), name
        assert torch.equal(value[~forget], inj[name][~forget]), name
        assert not torch.equal(pre[name][~forget], inj[name][~forget])  # the retain groups' elements kept θ_inj's
        reset += int(forget.sum())
    assert reset == sum(int(group_mask(m, forget_groups).sum()) for m in packed.values()) > 0  # every m^F element
    assert ensure_reference(workdir) == out  # up to date: reused


def test_a_testbed_without_a_met_verdict_is_refused_unless_allowed(workdir):
    for record, why in (({}, "was never measured"), ({"separable": False}, "is NOT met")):
        (workdir / "chain.json").write_text(json.dumps(record))
        with pytest.raises(ValueError, match=f"separability verdict {why}.*--allow_inseparable true"):
            ensure_reference(workdir)
        assert not (workdir / "reference").exists()
    out = ensure_reference(workdir, allow_inseparable=True)
    assert json.loads((out / "reference.json").read_text())["exact"] is False
