"""Fine-tuning and evaluation on downstream tasks: task heads, recipes (BERT, ULMFiT,
feature-based), several seeds with median and spread, QA decoding.

Example:
    >>> from lmlab.tasks import load_builtin_task
    >>> from lmlab.finetune.runner import finetune_seeds
    >>> task = load_builtin_task("wordnet-wic")
    >>> finetune_seeds(task, "path/to/minilm", "runs/wic", seeds=(0, 1, 2))["dev"]
"""
