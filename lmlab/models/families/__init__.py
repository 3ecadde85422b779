"""Model families, each defined once: shape, preset sizes, checkpoint names, task heads.

``lmlab/models/families/<model_type>.py`` defines ``FAMILY = FamilySpec(...)``, imported on first
use by :func:`get_family`; presets, interop and the task heads read these specs (docs/models.md).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from lmlab.models.config import TransformerConfig
from lmlab.utils.errors import LmlabError
from lmlab.utils.lazy import resolve_entry

#: model_type -> "module:attribute" of its :class:`FamilySpec` (the spec once imported).
KNOWN_FAMILIES: dict[str, str | FamilySpec] = {
    name: f"{__name__}.{name}:FAMILY"
    for name in ("bert", "roberta", "albert", "electra", "distilbert", "roformer", "gpt2",
                 "llama", "bart", "marian", "t5")} | {
    "xlm-roberta": f"{__name__}.xlm_roberta:FAMILY", "mt5": f"{__name__}.mt5:FAMILY",
    "vit": f"{__name__}.vit:FAMILY", "canine": f"{__name__}.canine:FAMILY",
    "big_bird": f"{__name__}.big_bird:FAMILY",
    "deberta": f"{__name__}.deberta:FAMILY", "deberta-v2": f"{__name__}.deberta_v2:FAMILY",
    "gpt_neo": f"{__name__}.gpt_neo:FAMILY", "longformer": f"{__name__}.longformer:FAMILY",
    "xlnet": f"{__name__}.xlnet:FAMILY"}


@dataclass(frozen=True)
class Rule:
    """One checkpoint tensor and the lmlab parameter(s) it becomes.

    Names may contain ``{i}`` (a layer; an encoder-decoder's encoder layer) or ``{j}`` (a
    decoder layer). ``transpose``: theirs is stored (in, out) (GPT-2's Conv1D). ``split``: theirs
    is ours' tensors concatenated along that dim (GPT-2's c_attn). ``optional``: the file may
    omit it (a tied decoder). ``gguf``: llama.cpp's name. ``rotary_pairs``: theirs holds
    query/key rows in adjacent-pair order, ours in rotate-half order. ``per_head`` (with
    ``split=0``): theirs holds each head's rows of every ours in turn (DeBERTa's ``in_proj``).
    ``head_axes``: theirs is (H, nh, hd), ours its (H, nh * hd) view (XLNet's einsum weights).
    """

    ours: str | tuple[str, ...]
    theirs: str
    transpose: bool = False
    split: int | None = None
    aliases: tuple[str, ...] = ()
    optional: bool = False
    gguf: str | None = None
    rotary_pairs: bool = False
    per_head: bool = False
    head_axes: bool = False

    @property
    def ours_names(self) -> tuple[str, ...]:
        return (self.ours,) if isinstance(self.ours, str) else self.ours


def paired_rules(ours: str, theirs: str, pairs, params=("weight", "bias"), gguf: str | None = None,
                 **options: Any) -> list[Rule]:
    """A Rule per (our module, their module[, llama.cpp's module]) in ``pairs`` and parameter
    in ``params``, the names under the prefixes ``ours``, ``theirs`` (and ``gguf``)."""
    return [Rule(f"{ours}{a}.{p}", f"{theirs}{b}.{p}",
                 gguf=None if gguf is None else f"{gguf}{more[0]}.{p}", **options)
            for a, b, *more in pairs for p in params]


def stack_size(hidden: int, layers: int, **fields: Any) -> dict[str, Any]:
    """A size in BERT's and GPT-2's proportions: heads of 64 dimensions, a feed-forward 4x as
    wide (``fields``: more values, e.g. an encoder-decoder's ``num_decoder_layers``)."""
    return dict(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=hidden // 64,
                intermediate_size=4 * hidden, **fields)


def expand_rules(rules: list[Rule], num_layers: int, num_decoder_layers: int = 0
                 ) -> Iterator[Rule]:
    """Substitute ``{i}`` by each (encoder) layer index and ``{j}`` by each decoder layer's."""
    for rule in rules:
        placeholder = next((p for p in ("i", "j") if "{" + p + "}" in rule.theirs
                            or any("{" + p + "}" in o for o in rule.ours_names)), None)
        if placeholder is None:
            yield rule
            continue
        for index in range(num_layers if placeholder == "i" else num_decoder_layers):
            at = {placeholder: index}
            ours = tuple(o.format(**at) for o in rule.ours_names)
            yield replace(rule, ours=ours if len(ours) > 1 else ours[0],
                          theirs=rule.theirs.format(**at),
                          aliases=tuple(a.format(**at) for a in rule.aliases),
                          gguf=rule.gguf and rule.gguf.format(**at))


# Task heads (lmlab.models.task_heads builds them): Hugging Face class suffix of each, and each
# layout's modules as lmlab name -> checkpoint name (a weight and a bias each, but in
# BIAS_FREE_LAYOUTS).
TASK_CLASS_SUFFIX = {"sequence-classification": "ForSequenceClassification",
                     "token-classification": "ForTokenClassification",
                     "question-answering": "ForQuestionAnswering",
                     "multiple-choice": "ForMultipleChoice"}
TASK_LAYOUTS: dict[str, dict[str, str]] = {
    "pooler": {"classifier": "classifier"},  # pooled [CLS] (tanh) -> dropout -> classifier
    "dense-tanh": {"dense": "classifier.dense", "out_proj": "classifier.out_proj"},
    "dense-gelu": {"dense": "classifier.dense", "out_proj": "classifier.out_proj"},
    "context-pooler": {"dense": "pooler.dense", "out_proj": "classifier"},  # DeBERTa's
    "summary": {"summary": "sequence_summary.summary", "classifier": "classifier"},
    "summary-last": {"summary": "sequence_summary.summary", "classifier": "logits_proj"},  # XLNet
    "pre-classifier": {"pre_classifier": "pre_classifier", "classifier": "classifier"},
    "tokens": {"classifier": "classifier"},  # per token: dropout -> classifier
    "span": {"qa_outputs": "qa_outputs"},  # per token: start and end logits
    # BigBird's qa_classifier: BERT's feed-forward block with its residual norm, then qa_outputs
    "span-ffn": {"transform.feed_forward.up_proj": "qa_classifier.intermediate.dense",
                 "transform.feed_forward.down_proj": "qa_classifier.output.dense",
                 "transform.norm": "qa_classifier.output.LayerNorm",
                 "qa_outputs": "qa_classifier.qa_outputs"},
    "last-token": {"score": "score"},  # the last real token's state -> score (no bias): GPT's
}
BIAS_FREE_LAYOUTS = ("last-token",)
#: layouts that read every token's state (lmlab's sentence poolings do not apply)
TOKEN_LAYOUTS = ("tokens", "span", "span-ffn")
#: The BERT layouts; a family declares its own as a copy with some entries changed.
BERT_TASK_HEADS = {"sequence-classification": "pooler", "multiple-choice": "pooler",
                   "token-classification": "tokens", "question-answering": "span"}
# config.json label settings carried to and from TransformerConfig.extra (any family)
_LABEL_KEYS = ("problem_type", "pooling", "summary_activation", "classifier_dropout",
               "summary_last_dropout", "word_labels")


def task_head_rules(head: str, layout: str, config: TransformerConfig) -> list[Rule]:
    """Checkpoint rules of task head ``head`` in ``layout``; lmlab's own poolings (``"mean"``,
    ``"concat"``) have a single ``classifier``."""
    if layout not in TOKEN_LAYOUTS and config.extra.get("pooling") in ("mean", "concat"):
        layout = "pooler"
    params = ("weight",) if layout in BIAS_FREE_LAYOUTS else ("weight", "bias")
    return paired_rules(f"heads.{head}.", "", TASK_LAYOUTS[layout].items(), params)


@dataclass
class FamilySpec:
    """Everything lmlab knows about one family, and its mapping to checkpoints.

    Attributes:
        base_prefix: where task classes nest the bare model (``"bert"``; T5: ``""``).
        shape: the config values that make a config this family; reading sets them, writing
            refuses a config that differs. ``defaults``: its other values, sizes aside.
        hf_names / gguf_names: config.json key (GGUF: after ``"<architecture>."``) -> field
            (``"extra.<key>"``: an entry of ``extra``); the first key present wins.
        hf_defaults: what transformers assumes for an absent key, where not ``defaults``.
        required: size fields a checkpoint must give.
        from_hf / to_hf: the family's checks and derived values, on reading / writing.
        base_rules / pooler_rules: names relative to ``base_prefix``; head_rules: absolute.
        architectures: HF class name -> lmlab heads, primary first (``()`` = bare model).
        task_heads: task head -> its :data:`TASK_LAYOUTS` layout; adds their rules and classes.
        fixed_tensors: tensors with no learned values (RoFormer's sinusoids): written, not read.
        saved_as: heads written under another head's class (DeBERTa's ``emd``: its MLM class).
        global_tokens: task head -> the tokens its class makes global when no
            ``global_attention_mask`` is given (Longformer's: ``"first"``, ``"before-sep"``,
            ``"after-sep"``; :func:`lmlab.models.task_heads.default_global_tokens`).
        encoder_class: an encoder-decoder's class of the encoder alone (``T5EncoderModel``),
            which a config that is not an encoder-decoder is saved as.
        keeps_pooler: task heads whose transformers class holds BERT's pooler without reading
            it (BigBird's token classification): lmlab builds one, so the folder loads whole.
    """

    model_type: str
    base_prefix: str
    base_rules: Callable[[TransformerConfig], list[Rule]]
    shape: dict[str, Any] = field(default_factory=dict)
    defaults: dict[str, Any] = field(default_factory=dict)
    sizes: dict[str, dict[str, Any]] = field(default_factory=dict)
    hf_names: dict[str, str] = field(default_factory=dict)
    hf_defaults: dict[str, Any] = field(default_factory=dict)
    hf_constants: dict[str, Any] = field(default_factory=dict)
    gguf_names: dict[str, str] = field(default_factory=dict)
    required: tuple[str, ...] = ()
    from_hf: Callable[[dict[str, Any], dict[str, Any]], None] | None = None
    to_hf: Callable[[TransformerConfig, dict[str, Any]], None] | None = None
    pooler_rules: list[Rule] = field(default_factory=list)
    head_rules: dict[str, Callable[[TransformerConfig], list[Rule]]] = field(default_factory=dict)
    architectures: dict[str, tuple[str, ...]] = field(default_factory=dict)
    task_heads: dict[str, str] = field(default_factory=dict)
    fixed_tensors: Callable[[TransformerConfig], dict[str, Any]] | None = None
    display_name: str = ""
    saved_as: dict[str, str] = field(default_factory=dict)
    global_tokens: dict[str, str] = field(default_factory=dict)
    encoder_class: str = ""
    keeps_pooler: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self.display_name = self.display_name or self.model_type
        prefix = next((n for n, heads in self.architectures.items() if not heads), "")
        self.head_rules = {**self.head_rules, **{
            head: lambda config, head=head, layout=layout: task_head_rules(head, layout, config)
            for head, layout in self.task_heads.items()}}
        named = {prefix.removesuffix("Model") + TASK_CLASS_SUFFIX[head]: (head,)
                 for head in self.task_heads}
        # a class the family names itself wins (XLNet's span QA: ...ForQuestionAnsweringSimple)
        self.architectures = {**self.architectures, **{
            name: heads for name, heads in named.items()
            if name not in self.architectures and heads not in self.architectures.values()}}

    def config(self, **fields: Any) -> TransformerConfig:
        """A config of this family's shape and defaults with ``fields`` (sizes, overrides)."""
        return TransformerConfig(**self._values(fields))

    def _values(self, fields: dict[str, Any]) -> dict[str, Any]:
        return copy.deepcopy({"family": self.model_type, **self.defaults, **self.shape,
                              **fields})

    def read(self, names: dict[str, str], source: dict[str, Any], where: str,
             prefix: str = "", **known: Any) -> dict[str, Any]:
        """Field values for a checkpoint's settings ``source`` (keys ``prefix + name``): the
        family's values, then ``known``, then what ``names`` finds in ``source``."""
        values, found = self._values(known), set()
        for key, name in names.items():
            if prefix + key in source and name not in found:
                found.add(name)
                if name.startswith("extra."):
                    if source[prefix + key] is not None:  # null: the setting is not used
                        values.setdefault("extra", {})[name.removeprefix("extra.")] = \
                            source[prefix + key]
                else:
                    values[name] = source[prefix + key]
        sizes = {prefix + key: name for key, name in names.items() if name in self.required}
        missing = [key for key, name in sizes.items() if name not in found]
        if missing:
            raise LmlabError(f"{where} lacks {', '.join(missing)}",
                             f"a {self.model_type} checkpoint gives its sizes "
                             f"({', '.join(sizes)}); re-convert or re-download it")
        return values

    def config_from_hf(self, hf: dict[str, Any]) -> TransformerConfig:
        """A config.json as a :class:`TransformerConfig` (label settings go to ``extra``)."""
        values = self.read(self.hf_names, hf, f"this {self.model_type} config.json",
                           **self.hf_defaults)
        if self.from_hf is not None:
            self.from_hf(hf, values)
        extra = values.setdefault("extra", {})
        id2label = hf.get("id2label")
        if isinstance(id2label, dict) and id2label:
            extra["id2label"] = {int(k): str(v) for k, v in id2label.items()}
            extra["num_labels"] = len(id2label)
        if hf.get("num_labels") is not None:
            extra["num_labels"] = int(hf["num_labels"])
        extra.update({key: hf[key] for key in _LABEL_KEYS if hf.get(key) is not None})
        if hf.get("lmlab_pooling"):
            extra["pooling"] = hf["lmlab_pooling"]
        if hf.get("lmlab_pruned_heads"):  # heads removed by lmlab.compress.heads
            extra["pruned_heads"] = {str(k): list(v) for k, v in hf["lmlab_pruned_heads"].items()}
        return TransformerConfig(**values)

    def config_to_hf(self, config: TransformerConfig) -> dict[str, Any]:
        """The config.json transformers reads for ``config``; refused when ``config`` is not
        of this family's shape (the checkpoint would load as another model)."""
        wrong = [f"{name}={getattr(config, name)!r} (needs {value!r})"
                 for name, value in self.shape.items() if getattr(config, name) != value]
        if wrong:
            raise LmlabError(f"this config is not {self.model_type} shaped: {', '.join(wrong)}",
                             f"save it under its own family, or build it from a "
                             f"{self.model_type} preset")
        extra, family_extra = config.extra, self.defaults.get("extra", {})
        hf = {"model_type": self.model_type, **self.hf_constants}
        for key, name in self.hf_names.items():
            short = name.removeprefix("extra.")
            hf[key] = extra.get(short, family_extra.get(short)) if short != name \
                else getattr(config, name)
        if self.to_hf is not None:
            self.to_hf(config, hf)
        if config.rope_scaling and (hf.get("rope_parameters") or {}).get("rope_type") is None:
            raise LmlabError(f"{self.model_type}'s config.json has no RoPE scaling",
                             "save it in lmlab's own format (lmlab.save_pretrained does)")
        windowed = any(config.layer_window(i) for i in range(config.num_hidden_layers))
        if windowed and not (hf.get("attention_types") or hf.get("attention_window")):
            raise LmlabError(f"{self.model_type}'s config.json has no attention window",
                             "save it in lmlab's own format (lmlab.save_pretrained does)")
        if config.block_sparse and hf.get("attention_type") != "block_sparse":  # BigBird's
            raise LmlabError(f"{self.model_type}'s config.json has no block-sparse attention",
                             "save it in lmlab's own format (lmlab.save_pretrained does)")
        if "num_labels" in extra:
            count = int(extra["num_labels"])
            id2label = extra.get("id2label") or {i: f"LABEL_{i}" for i in range(count)}
            id2label = {int(k): str(v) for k, v in id2label.items()}
            hf["id2label"] = {str(k): v for k, v in sorted(id2label.items())}
            hf["label2id"] = {v: k for k, v in sorted(id2label.items())}
        for key in ("problem_type", "summary_activation", "classifier_dropout", "word_labels"):
            if extra.get(key) is not None:
                hf[key] = extra[key]
        if extra.get("pooling") not in (None, "family"):
            hf["lmlab_pooling"] = extra["pooling"]
        if extra.get("pruned_heads"):  # the removed heads' original indices: transformers 5
            hf["lmlab_pruned_heads"] = extra["pruned_heads"]  # keeps no record, lmlab reads this
        return hf

    def architecture_for(self, heads: tuple[str, ...], encoder_only: bool = False) -> str:
        """The HF class name whose heads are exactly ``heads`` (bare model when none match;
        :attr:`encoder_class` for an encoder-decoder family's encoder alone)."""
        if encoder_only and self.encoder_class:
            return self.encoder_class
        heads = tuple(self.saved_as.get(head, head) for head in heads)
        for name, arch_heads in self.architectures.items():
            if tuple(arch_heads) == tuple(heads):
                return name
        for name, arch_heads in self.architectures.items():
            if heads and arch_heads and arch_heads[0] == heads[0]:
                return name
        return next(name for name, arch_heads in self.architectures.items() if not arch_heads)


def get_family(model_type: str) -> FamilySpec:
    """The spec of a family (``"bert"``, ``"llama"``, ...), imported on first use."""
    entry = KNOWN_FAMILIES.get(model_type)
    if entry is None:
        raise LmlabError(f"lmlab has no model family {model_type!r}",
                         f"supported model types: {', '.join(KNOWN_FAMILIES)}")
    return resolve_entry(KNOWN_FAMILIES, model_type)

