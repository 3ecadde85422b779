"""Chat prompts: the model's own chat template (a Jinja2 template stored in the GGUF file's
``tokenizer.chat_template`` or a tokenizer's config), rendered as Hugging Face renders it, with a
ChatML fallback (``<|im_start|>role\\ncontent<|im_end|>``) when there is no template."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from lmlab.utils.errors import LmlabError

Message = dict[str, str]


def _check(messages: Sequence[Message]) -> None:
    for message in messages:
        if not isinstance(message, dict) or "role" not in message or "content" not in message:
            raise LmlabError(f"chat message {message!r} lacks 'role' or 'content'",
                             "pass messages like {'role': 'user', 'content': 'Hello'}")


def chatml(messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
    """The ChatML rendering (the fallback when the model has no template)."""
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")


def apply_chat_template(tokenizer: Any, messages: Sequence[Message],
                        add_generation_prompt: bool = True, template: str | None = None) -> str:
    """The prompt text for ``messages`` under the tokenizer's (or the given) chat template,
    rendered in Jinja2's sandbox as transformers renders it."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    _check(messages)
    template = template or getattr(tokenizer, "chat_template", None)
    if not template:
        return chatml(messages, add_generation_prompt)

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(template).render(
            messages=list(messages), add_generation_prompt=add_generation_prompt,
            bos_token=getattr(tokenizer, "bos_token", None) or "",
            eos_token=getattr(tokenizer, "eos_token", None) or "")
    except jinja2.exceptions.TemplateError as error:
        raise LmlabError(f"the chat template failed: {error}",
                         "check the messages' roles against what the model's template "
                         "accepts") from None


class ChatSession:
    """A conversation with a model: keeps the messages and generates each reply
    (``ChatSession(model, tokenizer).say("What is a haiku?", max_new_tokens=60)``)."""

    def __init__(self, model: Any, tokenizer: Any, system: str | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.messages: list[Message] = []
        if system:
            self.messages.append({"role": "system", "content": system})

    def say(self, text: str, on_text: Callable[[str], None] | None = None,
            **options: Any) -> str:
        """Add a user message, generate the assistant's reply (streamed to ``on_text``)."""
        from lmlab.generation.generate import generate_text

        self.messages.append({"role": "user", "content": text})
        prompt = apply_chat_template(self.tokenizer, self.messages, add_generation_prompt=True)
        options.setdefault("max_new_tokens", 256)
        reply = generate_text(self.model, self.tokenizer, prompt, on_text=on_text,
                              **options)[0].strip()
        self.messages.append({"role": "assistant", "content": reply})
        return reply
