"""``lmlab ulmfit``: ULMFiT's stages 2 and 3 on a pretrained AWD-LSTM (docs/recurrent.md)."""

from __future__ import annotations

import argparse

from lmlab.cli import _common
from lmlab.cli._task_options import add_task_arguments, task_from_args


def register(commands) -> None:
    p = commands.command(
        "ulmfit", help="ULMFiT on an AWD-LSTM run: fine-tune the LM on the task's text, then "
        "the classifier (concat pooling, discriminative rates, slanted triangular schedule, "
        "gradual unfreezing)",
        example="lmlab ulmfit --general runs/awd --task fortunes-topic --lm-steps 200 "
                "--out runs/ulmfit-fortunes",
        handler=_ulmfit,
        description="Stage 1 is `lmlab pretrain --family awd-lstm --objective clm`; this runs "
                    "stage 2 (OUT/lm: the task's train texts, dev texts for perplexity) and "
                    "stage 3 (OUT/classifier: `lmlab finetune --recipe ulmfit`). Rerunning "
                    "on the same --out resumes.")
    p.add_argument("--general", required=True,
                   help="the general-domain AWD-LSTM: a run directory or its model/ folder")
    add_task_arguments(p)
    _common.add_out(p, "folder for lm/, lm-data/ and classifier/")
    p.add_argument("--lm-steps", type=int, default=200,
                   help="stage 2 steps (0: skip it, the paper's 'without LM fine-tuning')")
    p.add_argument("--lm-lr", type=float, default=1e-3, help="stage 2 peak learning rate")
    p.add_argument("--lm-lr-decay", type=float,
                   help="stage 2 discriminative rates: lr / this per layer group down (paper: "
                        "2.6; default: one rate)")
    p.add_argument("--lm-ar", type=float, default=0.0,
                   help="stage 2 activation regularisation (AWD-LSTM/fastai: 2)")
    p.add_argument("--lm-tar", type=float, default=0.0,
                   help="stage 2 temporal activation regularisation (AWD-LSTM/fastai: 1)")
    p.add_argument("--head-hidden", type=int,
                   help="stage 3: a batch-norm layer of this many units before the classifier "
                        "(paper: 50)")
    p.add_argument("--recipe", default="ulmfit", choices=("ulmfit", "ulmfit-no-unfreeze"),
                   help="stage 3 recipe (ulmfit-no-unfreeze: every layer trains from epoch 0)")
    _common.add_flag(p, "lr", help="stage 3 peak learning rate of the top group")
    _common.add_flags(p, "epochs", "batch_size", "max_train_examples", "seed")
    _common.add_flag(p, "precision", default="fp32", choices=("fp32", "bf16", "auto"))
    _common.add_overwrite(p, "start stage 3's run over instead of resuming it")


def _ulmfit(args: argparse.Namespace) -> int:
    import json

    from lmlab.finetune.ulmfit import general_lm_folder, run_ulmfit

    general_lm_folder(args.general)  # refused before the task loads
    task = task_from_args(args)
    result = run_ulmfit(task, args.general, args.out, lm_steps=args.lm_steps, lm_lr=args.lm_lr,
                        recipe=args.recipe, seed=args.seed, lr=args.lr, epochs=args.epochs,
                        lm_options={"lr_decay": args.lm_lr_decay, "ar": args.lm_ar,
                                    "tar": args.lm_tar}, head_hidden=args.head_hidden,
                        batch_size=args.batch_size,
                        max_train_examples=args.max_train_examples, precision=args.precision,
                        overwrite=args.overwrite)
    print(json.dumps({key: result.get(key) for key in ("task", "dev", "test", "lm_eval",
                                                       "best_epoch", "stop_reason")}, indent=2))
    return 0
