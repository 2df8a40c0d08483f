"""Corpus scores: sacreBLEU's numbers with their signatures, in both tokenisation modes."""

import math

import pytest
import sacrebleu

from annotated_transformer.scoring import Score, corpus_scores, format_scores, headline_key


def test_identical_text_scores_100():
    lines = ["a man rides a bike .", "two dogs play in the snow ."]
    for mode in ("word", "spm"):
        scores = corpus_scores(lines, lines, mode)
        assert set(scores) == {"bleu", "bleu_lc", "chrf"}
        for s in scores.values():
            assert isinstance(s, Score) and s.score == pytest.approx(100.0)


def test_hand_computed_bleu():
    # Clipped n-gram precisions 5/6, 3/5, 2/4, 1/3 and equal lengths (BP = 1): BLEU = (1/12) ** (1/4).
    hyps, refs = ["the cat sat on the mat"], ["the cat sat on a mat"]
    bleu = corpus_scores(hyps, refs, "word")["bleu"]
    assert bleu.score == pytest.approx(100 * (1 / 12) ** 0.25, abs=1e-6)
    assert bleu.score == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs], tokenize="none").score, abs=1e-9)
    assert bleu.details.startswith("BLEU = 53.73 83.3/60.0/50.0/33.3")
    # Every n-gram matches but the hypothesis is 4 tokens for 6: BLEU = BP = exp(1 - 6/4).
    short = corpus_scores(["the cat sat on"], ["the cat sat on the mat"], "word")["bleu"]
    assert short.score == pytest.approx(100 * math.exp(-0.5), abs=1e-6)


def test_corpus_level_not_sentence_average():
    hyps = ["the cat sat on the mat", "a dog"]
    refs = ["the cat sat on a mat", "a dog runs"]
    got = corpus_scores(hyps, refs, "spm")
    assert got["bleu"].score == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score, abs=1e-9)
    assert got["chrf"].score == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs]).score, abs=1e-9)


def test_lowercased_at_least_cased():
    hyps, refs = ["A Man rides a bike ."], ["a man rides a bike ."]
    for mode in ("word", "spm"):
        scores = corpus_scores(hyps, refs, mode)
        assert scores["bleu"].score < 100
        assert scores["bleu_lc"].score == pytest.approx(100.0)
        assert scores["bleu_lc"].score >= scores["bleu"].score


def test_signatures_name_tokenisation_and_case():
    lines = ["a man rides a bike ."]
    word, spm = corpus_scores(lines, lines, "word"), corpus_scores(lines, lines, "spm")
    assert "tok:none" in word["bleu"].signature and "case:mixed" in word["bleu"].signature
    assert "tok:none" in word["bleu_lc"].signature and "case:lc" in word["bleu_lc"].signature
    assert "tok:13a" in spm["bleu"].signature and "case:mixed" in spm["bleu"].signature
    assert "tok:13a" in spm["bleu_lc"].signature and "case:lc" in spm["bleu_lc"].signature
    for scores in (word, spm):
        assert f"version:{sacrebleu.__version__}" in scores["bleu"].signature
        assert "nc:6" in scores["chrf"].signature  # chrF with character 6-grams


def test_modes_tokenise_differently():
    # spm mode tokenises detokenised text (13a splits the full stop); word mode takes tokens as they are.
    hyps, refs = ["a dog runs."], ["a dog runs ."]
    assert corpus_scores(hyps, refs, "spm")["bleu"].score == pytest.approx(100.0)
    assert corpus_scores(hyps, refs, "word")["bleu"].score < 100


def test_headline_key():
    assert headline_key("word") == "bleu_lc"
    assert headline_key("spm") == "bleu"
    with pytest.raises(ValueError, match="mode"):
        headline_key("bpe")


def test_bad_input_is_a_clear_error():
    with pytest.raises(ValueError, match="no hypotheses"):
        corpus_scores([], [], "word")
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        corpus_scores(["a", "b"], ["a"], "spm")
    with pytest.raises(ValueError, match="mode"):
        corpus_scores(["a"], ["a"], "chars")


def test_format_scores_one_line_each_with_signature():
    scores = corpus_scores(["a man rides a bike ."], ["a man rides a red bike ."], "word")
    lines = format_scores(scores).splitlines()
    assert len(lines) == 3
    for line, (key, s) in zip(lines, scores.items()):
        assert line.startswith(key) and s.signature in line and f"{s.score:.2f}" in line
