"""``python -m lmlab.harness ARGS``: the harness's own command line (``lm_eval ARGS``) with the
``lmlab`` backend registered, for an environment without the start-up hook; ``python -m
lmlab.harness --install-hook`` writes that hook (docs/lm-eval.md)."""

import sys

from lmlab.harness.hook import install, register

if sys.argv[1:] == ["--install-hook"]:
    print(f"wrote {install()}: `lm_eval --model lmlab` now finds lmlab's backend")
    sys.exit(0)
try:
    from lm_eval.__main__ import cli_evaluate
except ImportError:
    sys.exit("lmlab: error: lm-evaluation-harness is not installed\n"
             "  fix: pip install 'lmlab[eval]' (or: pip install lm_eval==0.4.13)")

register()
sys.exit(cli_evaluate())
