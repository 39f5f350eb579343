"""``lightning-unlearn mask-auc`` scores an unlearned model directory against the forget mask."""

from __future__ import annotations

import json

from callback_fixtures import write_lacuna_weights

from lightning_unlearn.cli import main
from lightning_unlearn.masks import load_masks, masked_parameter_names, union_mask
from lightning_unlearn.metrics.mask_auc import mask_auc
from lightning_unlearn.models import load_causal_lm, load_weights


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
            "--buffer_mib",
            "null",  # every score held (the default spills beyond 256 MiB): the same numbers either way
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
    # The command reads the files tensor by tensor; the whole models in memory give the same numbers.
    packed, _ = load_masks(w["masks"])
    whole = [load_weights(w[k]) for k in ("pre_dir", "inj_dir", "unl_dir")]
    in_memory = mask_auc(*whole, union_mask(packed, [0, 1, 2]), unified_mask=union_mask(packed, range(6)),
                         names=names, max_samples=3000)  # fmt: skip
    assert json.loads(json.dumps(in_memory)) == result


def _mask_auc(w, masks, pre, out):
    main(["mask-auc", "--pre", pre, "--inj", w["inj_dir"], "--unl", w["unl_dir"], "--masks", masks, "--out", str(out)])


def test_masks_of_another_model_are_refused_in_one_line(tiny_dir, tmp_path):
    import pytest
    import torch

    from lightning_unlearn.masks import load_masks, sample_masks, save_masks
    from lightning_unlearn.models import TinyLlamaConfig, build_tiny_llama, load_tokenizer, weights_fingerprint

    w = write_lacuna_weights(tiny_dir, tmp_path)
    out = tmp_path / "auc.json"
    # The same shapes, recorded against another θ_pre (as an injection export records its own).
    packed, _ = load_masks(w["masks"])
    other_pre = tmp_path / "other_pre"
    torch.manual_seed(1)
    load_causal_lm(w["inj_dir"]).save_pretrained(other_pre)
    save_masks(tmp_path / "recorded.safetensors", packed, pre_fingerprint=weights_fingerprint(other_pre))
    with pytest.raises(SystemExit, match=r"were sampled on another θ_pre than") as err:
        _mask_auc(w, str(tmp_path / "recorded.safetensors"), w["pre_dir"], out)
    assert "\n" not in str(err.value) and not out.exists()
    _mask_auc(w, str(tmp_path / "recorded.safetensors"), str(other_pre), out)  # its own θ_pre: accepted
    assert out.exists()
    out.unlink()
    # Another architecture: a shape differs.
    small = build_tiny_llama(load_tokenizer(tiny_dir), TinyLlamaConfig(hidden_size=16, num_layers=4, num_heads=2,
                                                                        intermediate_size=32))  # fmt: skip
    save_masks(tmp_path / "small.safetensors", sample_masks(small, num_groups=6, coverage=0.05))
    with pytest.raises(SystemExit, match=r"do not match the model: .* has shape") as err:
        _mask_auc(w, str(tmp_path / "small.safetensors"), w["pre_dir"], out)
    assert "\n" not in str(err.value) and not out.exists()


def test_an_unlearned_model_of_another_architecture_is_named(tiny_dir, tmp_path):
    import pytest

    from lightning_unlearn.models import TinyLlamaConfig, build_tiny_llama, load_tokenizer

    w = write_lacuna_weights(tiny_dir, tmp_path)
    other = tmp_path / "other_arch"
    config = TinyLlamaConfig(hidden_size=16, num_layers=4, num_heads=2, intermediate_size=32)
    build_tiny_llama(load_tokenizer(tiny_dir), config).save_pretrained(other)
    argv = ["mask-auc", "--pre", w["pre_dir"], "--inj", w["inj_dir"], "--unl", str(other), "--masks", w["masks"]]
    # The unlearned model, not θ_pre, is named as the one whose shapes differ.
    with pytest.raises(SystemExit, match=rf"mask-auc: error: --unl '{other}': .* is \(\d+, 16\)?.*but θ_pre") as err:
        main(argv)
    assert "\n" not in str(err.value)


def test_mask_auc_callback_reads_the_reference_models_lazily_and_scores_as_in_memory(tiny_dir, tmp_path):
    """The callback keeps θ_pre, θ_inj, the masks and the control as lazy views of their files (rank 0 holds no
    extra model) and scores exactly what ``mask_auc`` gives on the whole models in memory, control included."""
    from types import SimpleNamespace

    from lightning_unlearn.callbacks import MaskAUCEvaluation
    from lightning_unlearn.callbacks.checkpoint_metrics_file import flatten_metrics
    from lightning_unlearn.masks import LazyMasks
    from lightning_unlearn.models import LazyWeights

    w = write_lacuna_weights(tiny_dir, tmp_path)
    control = {"control_inj_path": w["pre_dir"], "control_unl_path": w["unl_dir"]}
    cb = MaskAUCEvaluation(
        w["pre_dir"], w["inj_dir"], w["masks"], max_samples=3000, output_dir=str(tmp_path), **control
    )
    model = load_causal_lm(w["unl_dir"])
    row = cb.compute(None, SimpleNamespace(model=model), step=0)
    reference = cb._load_reference()
    held = [reference["pre"], reference["inj"], *reference["control"]]
    assert all(isinstance(m, LazyWeights) for m in held)  # each tensor read from its file when scored, never cached
    assert all(isinstance(reference[k], LazyMasks) for k in ("forget", "unified"))
    packed, _ = load_masks(w["masks"])
    pre, inj, unl = (load_weights(w[k]) for k in ("pre_dir", "inj_dir", "unl_dir"))
    expected = mask_auc(pre, inj, unl, union_mask(packed, [0, 1, 2]), control=(pre, unl),
                        unified_mask=union_mask(packed, range(6)), names=masked_parameter_names(model),
                        max_samples=3000)  # fmt: skip
    assert row["F"] == expected["F"] and row["F_or_R"] == expected["F|R"]
    assert "contrast" in row["F"]
    tags = {f"{cb.family_name}/{k}" for k in flatten_metrics(row)}  # its TensorBoard scalars (docs/guide/evaluation.md)
    assert {f"mask_auc/{m}/{f}" for m in ("F", "F_or_R") for f in ("raw", "reversal", "contrast")} <= tags, sorted(tags)
