"""A tokenizer folder's chat template travels: lmlab reads the one transformers writes
(``chat_template.jinja``, or ``tokenizer_config.json``'s entry) and writes it back, so
``lmlab serve``, the harness backend and ``lmlab chat`` use the model's template, not ChatML."""

from __future__ import annotations

import json

import pytest

import lmlab
from lmlab.generation.chat import apply_chat_template

transformers = pytest.importorskip("transformers")

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
            {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Why?"}]
TEMPLATE = ("{% for m in messages %}[{{ m['role'] | upper }}] {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}[ASSISTANT] {% endif %}")


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory, minilm_dir):
    """MiniLM's tokenizer with a chat template, saved by transformers."""
    folder = tmp_path_factory.mktemp("hf") / "tok"
    theirs = transformers.AutoTokenizer.from_pretrained(minilm_dir)
    theirs.chat_template = TEMPLATE
    theirs.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("generation_prompt", [True, False])
def test_a_folder_transformers_wrote_keeps_its_template(hf_folder, generation_prompt):
    ours = lmlab.Tokenizer.from_pretrained(hf_folder)
    theirs = transformers.AutoTokenizer.from_pretrained(hf_folder)
    assert ours.chat_template == TEMPLATE
    assert apply_chat_template(ours, MESSAGES, generation_prompt) == theirs.apply_chat_template(
        MESSAGES, tokenize=False, add_generation_prompt=generation_prompt)


def test_the_template_in_tokenizer_config_and_named_templates(hf_folder, tmp_path):
    for i, entry in enumerate([TEMPLATE, [{"name": "tool_use", "template": "x"},
                                          {"name": "default", "template": TEMPLATE}]]):
        folder = tmp_path / str(i)
        folder.mkdir()
        for path in hf_folder.iterdir():
            if path.name != "chat_template.jinja":
                (folder / path.name).write_bytes(path.read_bytes())
        config = json.loads((folder / "tokenizer_config.json").read_text())
        (folder / "tokenizer_config.json").write_text(json.dumps({**config,
                                                                  "chat_template": entry}))
        assert lmlab.Tokenizer.from_pretrained(folder).chat_template == TEMPLATE


def test_lmlab_writes_the_template_back(hf_folder, tmp_path):
    lmlab.Tokenizer.from_pretrained(hf_folder).save_pretrained(tmp_path / "again")
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "again")
    assert theirs.chat_template == TEMPLATE
    assert lmlab.Tokenizer.from_pretrained(tmp_path / "again").chat_template == TEMPLATE


def test_a_folder_without_a_template_has_none(minilm_dir):
    assert lmlab.Tokenizer.from_pretrained(minilm_dir).chat_template is None
