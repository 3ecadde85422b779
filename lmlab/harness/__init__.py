"""lm-evaluation-harness backend ``lmlab`` (:mod:`lmlab.harness.adapter`) and the import hook
that registers it in a fresh ``lm_eval`` process (:mod:`lmlab.harness.hook`); docs/lm-eval.md.
Light on purpose: the hook imports this package at interpreter start-up."""
