"""ELECTRA's replaced-token detection (Clark et al. 2020): a small MLM generator sharing the
model's embeddings fills the masked positions; the model labels every token original or
replaced. Loss: generator MLM + 50 x discriminator loss. DeBERTa-v3's gradient-disentangled
sharing (He et al. 2023) instead gives the model (the discriminator) ``sg(E_G) + E_Delta``
(docs/objectives.md)."""

from __future__ import annotations

import copy
import dataclasses
import weakref

import torch
from torch import nn

from lmlab.models.model import LanguageModel
from lmlab.objectives.base import SEED_MOD, Objective, ObjectiveResult, require_labels, stack_inputs
from lmlab.objectives.masking import IGNORE_INDEX
from lmlab.objectives.mlm import MaskedLM
from lmlab.objectives.special_tokens import SpecialTokens
from lmlab.utils.checks import check_choice, check_positive
from lmlab.utils.errors import LmlabError

EMBEDDING_SHARING = ("shared", "gdes", "none")
TABLES = ("word_embeddings", "position_embeddings", "token_type_embeddings")


def generator_config(config, size: float = 0.25, layers: float = 1.0):
    """The generator's TransformerConfig: ``size`` x the hidden width (rounded to a multiple of
    the head count), ``layers`` x the depth, embeddings of the discriminator's width E."""
    if not 0.0 < size <= 1.0 or not 0.0 < layers <= 1.0:
        raise LmlabError(f"generator size {size} / layer fraction {layers} not in (0, 1]",
                         "use generator_size=0.25 (ELECTRA-Small) to 0.5")
    hidden = max(1, int(round(config.hidden_size * size)))
    heads = max(1, hidden // 64)
    hidden = max(heads, hidden - hidden % heads)
    return dataclasses.replace(
        config, hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=None,
        head_dim=None, intermediate_size=4 * hidden,
        num_hidden_layers=max(1, int(round(config.num_hidden_layers * layers))),
        embedding_size=config.input_embedding_size, tie_word_embeddings=True,
        extra=dict(config.extra))


class ReplacedTokenDetection(MaskedLM):
    """ELECTRA: generator MLM + discriminator replaced-token detection. Beyond MaskedLM's
    arguments (replacement split (0.85, 0, 0.15) by default): the generator's width and depth
    as fractions of the model's, the loss weights ``generator_weight * L_gen +
    discriminator_weight * L_disc`` (1, 50), the sampling ``temperature`` and
    ``embedding_sharing``: ``"shared"`` (ELECTRA: one set of embeddings), ``"gdes"``
    (DeBERTa-v3: the model's tables are the generator's, stop-gradient, plus a learned delta,
    zero at the start; the model's own tables hold that sum whenever its state is read, so a
    saved model is a plain one) or ``"none"`` (the generator has its own)."""

    name = "rtd"
    head_names = ("rtd",)
    salt = 4
    flops_head = "none"  # the discriminator's head is one logit per token
    reports_perplexity = False  # generator MLM + lambda * detection: not a per-token LM loss
    shares_forward_pass = False

    def __init__(self, special: SpecialTokens, mask_prob: float = 0.15,
                 replacement: tuple[float, float, float] = (0.85, 0.0, 0.15),
                 masking: str = "dynamic", dupe_factor: int = 10, seed: int = 0,
                 max_predictions: int | None = None, weight: float = 1.0,
                 generator_size: float = 0.25, generator_layers: float = 1.0,
                 discriminator_weight: float = 50.0, generator_weight: float = 1.0,
                 temperature: float = 1.0, embedding_sharing: str = "shared"):
        super().__init__(special, mask_prob, replacement, masking, dupe_factor, seed,
                         max_predictions, sparse=True, weight=weight)
        self.generator_size = float(generator_size)
        self.generator_layers = float(generator_layers)
        self.discriminator_weight = float(discriminator_weight)
        self.generator_weight = float(generator_weight)
        check_positive(temperature, "temperature")
        self.temperature = float(temperature)
        self.embedding_sharing = check_choice(embedding_sharing, EMBEDDING_SHARING,
                                              "embedding_sharing", "embedding sharing")
        self.generator: LanguageModel | None = None
        self.embedding_delta = nn.ParameterDict()  # gdes: E_Delta per table the model has

    # -- set-up -----------------------------------------------------------------------------------
    def prepare(self, model: nn.Module) -> None:
        """Add the "rtd" head and build the generator sharing ``model``'s embeddings."""
        model.add_head("rtd")
        if self.generator is not None:
            return
        config = model.config
        if config.vocab_size != self.special.vocab_size:
            raise LmlabError(f"the model's vocabulary ({config.vocab_size}) differs from the "
                             f"tokenizer's ({self.special.vocab_size})",
                             "build the model with vocab_size=len(tokenizer)")
        generator = LanguageModel(generator_config(config, self.generator_size,
                                                   self.generator_layers), heads=("mlm",))
        shared, own = model.transformer.embeddings, generator.transformer.embeddings
        if self.embedding_sharing == "shared":
            for part in (*TABLES, "norm", "sinusoids"):  # the same parts are None on both
                if getattr(shared, part, None) is not None:
                    setattr(own, part, getattr(shared, part))
        elif self.embedding_sharing == "gdes":
            self._disentangle(shared, own)
        generator.tie_weights()
        generator.to(next(model.parameters()).device)
        self.generator = generator

    def _disentangle(self, shared: nn.Module, own: nn.Module) -> None:
        """GDES: the generator starts from copies of the model's tables, each delta from zero;
        the model's tables stop training and are refreshed to ``E_G + E_Delta`` before any
        read of its state (saving, checkpoints)."""
        for part in TABLES:
            table = getattr(shared, part, None)
            if table is None:
                continue
            setattr(own, part, copy.deepcopy(table))
            self.embedding_delta[part] = nn.Parameter(torch.zeros_like(table.weight))
            table.weight.requires_grad_(False)
        this = weakref.ref(self)  # the hook keeps no objective alive; a copied model folds its own
        shared.register_state_dict_pre_hook(
            lambda module, *_: this() is not None and this().fold_embeddings(module))

    def discriminator_tables(self) -> dict[str, torch.Tensor]:
        """GDES: the model's tables ``sg(E_G) + E_Delta`` by the model's parameter names."""
        own = self.generator.transformer.embeddings
        return {f"transformer.embeddings.{part}.weight": getattr(own, part).weight.detach() + delta
                for part, delta in self.embedding_delta.items()}

    @torch.no_grad()
    def fold_embeddings(self, shared: nn.Module) -> None:
        """Write ``E_G + E_Delta`` into the tables of ``shared`` (the model's embeddings):
        done before every loss and every read of the model's state."""
        own = self.generator.transformer.embeddings
        for part, delta in self.embedding_delta.items():
            getattr(shared, part).weight.copy_(getattr(own, part).weight + delta)

    # -- corruption / sampling ------------------------------------------------------------------
    def corrupt(self, batch: dict[str, torch.Tensor],
                rng: torch.Generator) -> dict[str, torch.Tensor]:
        """Masked generator inputs + ``labels``; ``rtd_seed`` (a scalar) seeds the sampling so a
        batch is replaced the same way whenever it is evaluated."""
        out = super().corrupt(batch, rng)
        out["rtd_seed"] = torch.randint(0, SEED_MOD, (), generator=rng, dtype=torch.int64)
        return out

    def replace(self, generator_logits: torch.Tensor, batch: dict[str, torch.Tensor]
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sample tokens at the masked positions from the generator's logits (N, V): returns
        the discriminator's input ids (B, T), the replaced labels (B, T; 0/1 floats, ``ids !=
        original ids``) and the sampled ids (N,)."""
        labels = batch["labels"]
        masked = labels != IGNORE_INDEX  # (B, T)
        original = torch.where(masked, labels, batch["input_ids"])  # (B, T)
        with torch.no_grad():
            logits = generator_logits.detach().float() / self.temperature
            noise_gen = None
            if "rtd_seed" in batch:
                noise_gen = torch.Generator(device=logits.device).manual_seed(int(batch["rtd_seed"]))
            uniform = torch.rand(logits.shape, generator=noise_gen, device=logits.device)
            gumbel = -torch.log(-torch.log(uniform.clamp(1e-9, 1.0 - 1e-9)))
            sampled = (logits + gumbel).argmax(-1)  # (N,): a sample from softmax(logits)
        discriminator_ids = batch["input_ids"].clone()
        discriminator_ids[masked] = sampled
        replaced = (discriminator_ids != original).float()
        return discriminator_ids, replaced, sampled

    # -- loss ------------------------------------------------------------------------------------
    def compute_loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> ObjectiveResult:
        if self.generator is None:
            raise LmlabError("the ELECTRA generator is not built",
                             "call objective.prepare(model) before training")
        labels = require_labels(batch, self.name)
        inputs = stack_inputs(model, batch)
        masked = labels != IGNORE_INDEX  # (B, T)
        count = int(masked.sum())
        gen_hidden = self.generator(**inputs, heads=[]).last_hidden_state
        gen_logits = self.generator.heads["mlm"](gen_hidden, positions=masked)  # (N, V)
        targets = labels[masked]
        gen_loss = (self.generator.heads["mlm"].loss(gen_logits, targets) if count
                    else gen_logits.sum() * 0.0)
        disc_ids, replaced, sampled = self.replace(gen_logits, batch)
        disc_inputs = dict(inputs, input_ids=disc_ids, heads=[])
        if self.embedding_delta:  # gdes: no gradient reaches E_G through this pass
            self.fold_embeddings(model.transformer.embeddings)
            out = torch.func.functional_call(model, self.discriminator_tables(), (), disc_inputs)
        else:
            out = model(**disc_inputs)
        disc_logits = model.run_head("rtd", out.last_hidden_state, out.pooler_output)  # (B, T)
        attention = batch.get("attention_mask")
        disc_loss = model.heads["rtd"].loss(disc_logits, replaced, attention)
        loss = self.generator_weight * gen_loss + self.discriminator_weight * disc_loss
        with torch.no_grad():
            keep = attention.bool() if attention is not None else torch.ones_like(replaced).bool()
            predicted = (disc_logits > 0).float()
            disc_accuracy = float((predicted == replaced)[keep].float().mean())
            gen_accuracy = float((sampled == targets).float().mean()) if count else 0.0
            replaced_share = float(replaced[keep].mean())
        metrics = {"generator_loss": float(gen_loss.detach()),
                   "discriminator_loss": float(disc_loss.detach()),
                   "discriminator_accuracy": disc_accuracy,
                   "generator_sample_accuracy": gen_accuracy,
                   "replaced_fraction": replaced_share}
        return ObjectiveResult(loss * self.weight, metrics, count)

    losses = Objective.losses  # refused: the discriminator reads the generator's samples
