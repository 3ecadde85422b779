"""``python -m lmlab.harness ARGS``: the harness's own command line (``lm_eval ARGS``) with the
``lmlab`` backend registered, for an environment without the start-up hook (docs/lm-eval.md)."""

import sys

from lmlab.harness.hook import register

try:
    from lm_eval.__main__ import cli_evaluate
except ImportError:
    sys.exit("lmlab: error: lm-evaluation-harness is not installed\n"
             "  fix: pip install 'lmlab[eval]' (or: pip install lm_eval==0.4.13)")

register()
sys.exit(cli_evaluate())
