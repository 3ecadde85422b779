"""Evaluation without fine-tuning: perplexity, cloze, few-shot classification (see
:mod:`lmlab.evaluation.lm`)."""
