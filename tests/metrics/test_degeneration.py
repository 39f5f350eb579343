import pytest

from lightning_unlearn.metrics.degeneration import DegenerationThresholds, degeneration_report, degraded_rate


def _one(text, **kw):
    return degeneration_report([text], **kw)[0]


def test_healthy_answer_is_not_degraded():
    r = _one("The war was caused by a dispute over the border between the two states.")
    assert not r["degraded"]
    assert not any(r[k] for k in ("empty", "unfinished", "char_loop", "bracket_loop", "ngram_loop"))


@pytest.mark.parametrize(
    ("text", "flag"),
    [
        ("", "empty"),
        ("  .  ", "empty"),
        ("Yes", "empty"),
        ("The answer is aaaaaaaaaaaaaa", "char_loop"),
        ("It is hahahahahahahahahahaha funny", "char_loop"),
        ("The cause ((((((((( is", "bracket_loop"),
        ("[] [] [] [] x", "bracket_loop"),
        ("the war is over the war is over the war is over the war is over", "ngram_loop"),
    ],
)
def test_each_flag_fires(text, flag):
    r = _one(text)
    assert r[flag], r
    assert r["degraded"]


def test_unfinished_only_when_cap_hit_without_sentence_end():
    texts = ["The war was caused by the", "The war was caused by the border dispute."]
    rows = degeneration_report(texts, hit_token_cap=[True, True])
    assert rows[0]["unfinished"] and not rows[1]["unfinished"]
    assert not degeneration_report(texts[:1], hit_token_cap=[False])[0]["unfinished"]


def test_a_coherent_answer_cut_at_the_cap_is_unfinished_but_not_degraded():
    # Semantics changed on purpose: the cap flag alone no longer makes an answer degraded (a verbose answer is not a
    # broken one); it stays reported.
    r = _one("The war was caused by a long dispute over the border, and both states claimed the", hit_token_cap=[True])
    assert r["unfinished"] and not r["degraded"]


def test_a_capped_text_is_judged_by_what_comes_before_the_cut():
    loop = "Banana\n\nBanana\n\nBanana\n\nBanana\n\nBanana\n\nBana"  # 6 word tokens: too short to score unless cut
    assert not _one(loop)["degraded"]
    cut = _one(loop, hit_token_cap=[True])
    # rep4 1/3, max4 2/3, 1 - unique 2/3, dominant 5/6 → 0.625 > 0.5
    assert cut["score"] == pytest.approx((1 / 3 + 2 / 3 + 2 / 3 + 5 / 6) / 4) and cut["degraded"]


@pytest.mark.parametrize(
    ("text", "nonlanguage"),
    [
        ("Compulsivschutzfraumimmwelche Bundesverins der Verhandlungsschutzumgebungsbereich", True),
        ("The policy kePtSaying that NATOexpansIon was xqzvbnmt", True),  # case switches and a consonant run
        ("Украинаsecurity and Russiaвойна are words", True),  # two scripts inside a word
        ("The internationalization of responsibilities strengthens counterproductive bureaucracies.", False),
        ("Regierungsverhandlungen über die Grenze dauerten lange.", False),  # a real 23-letter compound
        ("McDonald sold an iPhone.", False),  # one odd shape among few words is not enough: two are needed
    ],
)
def test_nonlanguage_from_word_shapes(text, nonlanguage):
    r = _one(text, hit_token_cap=[True])
    assert r["nonlanguage"] is nonlanguage, r["odd_words"]
    assert r["degraded"] is nonlanguage


def test_score_components_hand_computed():
    # tokens a b a b a b: 4-grams abab, baba, abab -> 3 grams, 2 distinct.
    th = DegenerationThresholds(min_scored_tokens=1, ngram_loop_count=10, char_loop_repeats=50)
    r = _one("a b a b a b", thresholds=th)
    assert r["rep4_rate"] == pytest.approx(1 / 3)
    assert r["max4_freq"] == pytest.approx(2 / 3)
    assert r["unique_ratio"] == pytest.approx(2 / 6)
    assert r["dominant_rate"] == pytest.approx(3 / 6)
    assert r["score"] == pytest.approx((1 / 3 + 2 / 3 + 2 / 3 + 1 / 2) / 4)
    assert r["degraded"]  # 0.5417 > 0.5
    assert not _one(
        "a b a b a b", thresholds=DegenerationThresholds(min_scored_tokens=1, score_threshold=0.6, ngram_loop_count=10)
    )["degraded"]


def test_short_texts_are_not_scored_and_cjk_is_tokenized_per_character():
    assert _one("a b a b")["score"] == 0.0  # below min_scored_tokens
    r = _one("战争是由北约扩张引起的。")
    assert r["num_tokens"] == 12 and not r["degraded"]


def test_degraded_rate():
    rows = degeneration_report(["", "A normal and complete answer to the question."])
    assert degraded_rate(rows) == 0.5
    with pytest.raises(ValueError, match="one per text"):
        degeneration_report(["a"], hit_token_cap=[True, False])
