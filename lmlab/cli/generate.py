"""``lmlab generate``, ``lmlab chat``, ``lmlab perplexity`` and ``lmlab lm-eval``: use a causal
LM (GPT-2, Llama-style, a .gguf file) without fine-tuning it."""

from __future__ import annotations

import argparse
import json
import re
import sys

from lmlab.cli import _common


def _add_model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bf16", action="store_true",
                   help="run in bfloat16 (faster on CPUs with bf16 instructions and on GPUs)")
    _common.add_flags(p, "threads")


_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\"}


def stop_string(text: str) -> str:
    """A ``--stop`` value as typed: ``\\n``, ``\\t`` and ``\\\\`` become a newline, a tab and a
    backslash (a shell passes ``"\\n"`` as two characters); any other backslash stays."""
    return re.sub(r"\\([nt\\])", lambda match: _ESCAPES[match[1]], text)


def _add_generation_options(p: argparse.ArgumentParser, max_new_tokens: int) -> None:
    p.add_argument("--max-new-tokens", type=int, default=max_new_tokens)
    p.add_argument("--sample", action="store_true", dest="do_sample",
                   help="sample instead of greedy decoding")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0, help="0 = off")
    p.add_argument("--top-p", type=float, default=1.0, help="1.0 = off")
    p.add_argument("--repetition-penalty", type=float, default=1.0)
    p.add_argument("--no-repeat-ngram-size", type=int, default=0,
                   help="never repeat an n-gram of this size (0 = off; 3 is BART's default)")
    p.add_argument("--num-beams", type=int, default=1)
    p.add_argument("--length-penalty", type=float, default=1.0)
    p.add_argument("--stop", action="append", default=[], type=stop_string,
                   help="stop string (repeatable); \\n, \\t and \\\\ stand for a newline, a tab "
                        "and a backslash, so --stop '\\n' stops at the end of a line")
    _common.add_flag(p, "seed", help="seed of the sampler")
    p.add_argument("--truncate", choices=("left",),
                   help="a prompt that leaves no room for --max-new-tokens in the model's "
                        "context: keep its last tokens that fit, with a warning (default: "
                        "refuse it)")


def register(commands) -> None:
    p = commands.command(
        "generate", help="continue a prompt with a causal LM, streaming tokens as they come",
        example='lmlab generate smollm2 "Once upon a time" '
                '--max-new-tokens 40 --sample --top-p 0.9',
        handler=_generate)
    p.add_argument("model",
                   help="model folder, lmlab run directory, .gguf file or short name (smollm2)")
    p.add_argument("prompt", nargs="+", help="prompt text(s); several run as one batch")
    _add_generation_options(p, 50)
    _add_model_options(p)
    p.add_argument("--no-stream", action="store_true", help="print only when done")
    _common.add_flag(p, "json", help="print JSON lines")

    p = commands.command(
        "chat", help="chat with an instruction-tuned model using its chat template",
        example="lmlab chat smollm2 --system 'Answer briefly.'",
        handler=_chat)
    p.add_argument("model")
    p.add_argument("--system", help="system message")
    _add_generation_options(p, 256)
    _add_model_options(p)

    p = commands.command(
        "perplexity", help="sliding-window perplexity of a text file",
        example="lmlab perplexity smollm2 book.txt --stride 256",
        handler=_perplexity)
    p.add_argument("model")
    p.add_argument("file", help="UTF-8 text file")
    _common.add_flag(p, "max_length", help="window length (default: model's, <= 1024)")
    p.add_argument("--stride", type=int, help="window step (default: max-length / 2)")
    p.add_argument("--max-tokens", type=int, help="score only the first N tokens")
    _add_model_options(p)

    p = commands.command(
        "lm-eval", help="evaluate a causal LM without fine-tuning: k-shot classification or "
                        "last-word cloze",
        description="Evaluate a causal LM without fine-tuning, on lmlab's own tasks. It mirrors\n"
                    "two lm-evaluation-harness task kinds: k-shot classification is a\n"
                    "multiple_choice task's acc (the label with the highest summed\n"
                    "log-likelihood, as glue's sst2); --task cloze is lambada_openai's acc (is\n"
                    "the last word the greedy continuation; here decoded greedily, compared as\n"
                    "a word). For the harness's own tasks: lm_eval --model lmlab --model_args\n"
                    "pretrained=MODEL (docs/lm-eval.md).",
        example="lmlab lm-eval --task fortunes-topic --model smollm2 "
                "--few-shot 0,1,8 --max-examples 100",
        handler=_lm_eval)
    p.add_argument("--task", required=True,
                   help="a classification task (e.g. fortunes-topic) or 'cloze'")
    p.add_argument("--model", required=True)
    p.add_argument("--few-shot", default="0", help="comma-separated shot counts, e.g. 0,1,8")
    p.add_argument("--split", default="test")
    p.add_argument("--max-examples", type=int, default=100)
    _common.add_flags(p, "calibrate", "seed", "json")
    p.add_argument("--corpus", help="corpus folder for --task cloze (its validation split)")
    _add_model_options(p)


def _check_options(args: argparse.Namespace) -> None:
    """Check the generation and speed options before the model is loaded: the same
    :meth:`GenerationConfig.validate` that ``generate_text`` runs."""
    from lmlab.utils.checks import check_at_least

    check_at_least(args.threads, 1, "--threads")
    if hasattr(args, "max_new_tokens"):
        from lmlab.generation.generate import GenerationConfig

        GenerationConfig(**_options(args)).validate()


def _load(args: argparse.Namespace):
    import torch

    from lmlab.load import load_model_and_tokenizer

    _check_options(args)
    if getattr(args, "threads", None):
        torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if args.bf16 else None
    if args.bf16:  # the model is loaded on the CPU
        from lmlab.cost.precision import warn_if_slow_bf16

        warn_if_slow_bf16("cpu")
    return load_model_and_tokenizer(args.model, head=None, dtype=dtype)  # see text_generation


def _options(args: argparse.Namespace) -> dict:
    """The flags named as :class:`GenerationConfig` fields, and the --stop strings."""
    from dataclasses import fields

    from lmlab.generation.generate import GenerationConfig

    named = {f.name: getattr(args, f.name) for f in fields(GenerationConfig) if hasattr(args, f.name)}
    return {**named, "stop_strings": list(args.stop)}


def _write(text: str) -> None:
    """Print ``text`` at once (no newline): streamed pieces show as they are generated."""
    sys.stdout.write(text)
    sys.stdout.flush()


def _generate(args: argparse.Namespace) -> int:
    from lmlab.generation.generate import generate_text

    model, tokenizer = _load(args)
    options = _options(args)
    # an encoder-decoder's output is new text (a translation, an answer), not a continuation
    echo = not model.config.is_encoder_decoder
    stream = not args.no_stream and not args.json and len(args.prompt) == 1 \
        and args.num_beams == 1
    if stream:  # the prompt is echoed with the first piece: not before a refusal
        pending = [args.prompt[0] if echo else ""]

        def write(piece: str) -> None:
            _write(pending.pop() + piece if pending else piece)

        generate_text(model, tokenizer, args.prompt[0], seed=args.seed, on_text=write,
                      truncate=args.truncate, **options)
        write("\n")
        return 0
    outputs = generate_text(model, tokenizer, args.prompt, seed=args.seed,
                            truncate=args.truncate, **options)
    for prompt, output in zip(args.prompt, outputs):
        if args.json:
            print(json.dumps({"prompt": prompt, "generated": output}, ensure_ascii=False))
        else:
            print(prompt + output if echo else output)
    return 0


def _chat(args: argparse.Namespace) -> int:
    from lmlab.generation.chat import ChatSession

    model, tokenizer = _load(args)
    session = ChatSession(model, tokenizer, system=args.system)
    options = _options(args)
    print("Chatting; an empty line or /exit ends.", file=sys.stderr)
    while True:
        try:
            line = input("you> ")
        except EOFError:
            break
        if not line.strip() or line.strip() in ("/exit", "/quit"):
            break
        _write("bot> ")
        session.say(line, on_text=_write, truncate=args.truncate, **options)
        sys.stdout.write("\n")
    return 0


def _perplexity(args: argparse.Namespace) -> int:
    from lmlab.utils.checks import check_at_least, check_file
    from lmlab.utils.errors import LmlabError

    path = check_file(args.file, "FILE", "give the path of a UTF-8 text file")
    check_at_least(args.max_length, 2, "--max-length")
    check_at_least(args.stride, 1, "--stride")
    check_at_least(args.max_tokens, 2, "--max-tokens")
    if args.stride and args.max_length and args.stride > args.max_length:
        raise LmlabError(f"--stride {args.stride} is longer than --max-length {args.max_length}",
                         "use a stride of at most the window length, e.g. half of it")
    from lmlab.evaluation.lm import text_perplexity

    model, tokenizer = _load(args)
    result = text_perplexity(model, tokenizer, path.read_text(encoding="utf-8"),
                             args.max_length, args.stride, args.max_tokens, show_progress=True)
    print(json.dumps(result.to_dict()))
    return 0


def _lm_eval(args: argparse.Namespace) -> int:
    from lmlab.evaluation.lm import corpus_passages, lambada_cloze, parse_shot_counts
    from lmlab.utils.checks import check_at_least
    from lmlab.utils.errors import LmlabError

    shots = parse_shot_counts(args.few_shot)
    check_at_least(args.max_examples, 0, "--max-examples")  # 0: every example
    if args.task == "cloze":
        if not args.corpus:
            raise LmlabError("--task cloze needs --corpus DIR",
                             "build one with `lmlab data build --out DIR`")
        _common.check_corpus(args.corpus, holds="validation.jsonl")
        model, tokenizer = _load(args)
        passages = corpus_passages(args.corpus, limit=args.max_examples)
        result = {"task": "cloze", **lambada_cloze(model, tokenizer, passages,
                                                   show_progress=True)}
        print(json.dumps(result))
        return 0
    from lmlab.tasks.builtin import load_builtin_task

    task = load_builtin_task(args.task)
    task.split(args.split)  # an unknown split is refused before the model loads
    model, tokenizer = _load(args)
    _common.print_few_shot(model, tokenizer, task, shots, [args.split], args)
    return 0
